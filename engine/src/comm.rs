//! Collective communication between the GPUs of one host, for tensor parallelism
//! ([`crate::tp`]): one process drives every GPU, through NCCL. (Two GPUs with peer
//! access exchange partial sums through each other's memory instead, by default:
//! [`crate::decode::tp::AllReduce`].)
//!
//! NCCL is loaded at run time (cudarc's `nccl` bindings with `dynamic-loading`):
//! building needs no NCCL, and nothing loads it unless a [`Communicator`] is made, so
//! single-GPU runs do not depend on it. Without the library, [`Communicator::new`]
//! returns an error saying what was looked for.
//!
//! On the CPU device (the interpreter) a [`Communicator`] over several `Device::cpu()`
//! ranks adds and gathers through host memory instead, with the same results
//! (partial sums added in rank order), so tensor-parallel decoding is tested
//! without GPUs ([`crate::decode::tp`]).
//!
//! One thread issues every GPU's collective between `ncclGroupStart` and
//! `ncclGroupEnd` (NCCL's rule for one thread driving several devices). The calls
//! only queue work on each device's stream, like kernel launches, so they can be
//! recorded into each GPU's CUDA graph: [`capture_all`] captures every device's
//! stream at once, and collectives issued inside it become nodes of the graphs
//! (`tests/multi_gpu.rs`, `captured_all_reduce_replays`).

use cudarc::nccl::{group_end, group_start, Comm, NcclType, ReduceOp};
use half::bf16;
use tilefuse_dsl::runtime::{Buffer, Device, Element, Graph};

use crate::error::{EngineError, Result};

/// Element types the collectives move: `f32` (the partial sums of the split O and
/// down projections), `bf16` and `i32`.
pub trait CommElement: Element + NcclType {
    /// `self + other` as the reduction adds (host collectives).
    fn add(self, other: Self) -> Self;
}
impl CommElement for f32 {
    fn add(self, other: f32) -> f32 {
        self + other
    }
}
impl CommElement for bf16 {
    fn add(self, other: bf16) -> bf16 {
        self + other
    }
}
impl CommElement for i32 {
    fn add(self, other: i32) -> i32 {
        self.wrapping_add(other)
    }
}

/// Whether the NCCL library can be loaded (under the names cudarc looks for:
/// `libnccl.so`, `libnccl.so.12`, ...). Never panics.
pub fn nccl_available() -> bool {
    // SAFETY: only tries to open the library with each candidate name.
    unsafe { cudarc::nccl::sys::is_culib_present() }
}

/// What to do when NCCL is missing.
fn missing_nccl() -> EngineError {
    EngineError::Communication {
        message: "the NCCL library could not be loaded (looked for libnccl.so and libnccl.so.<CUDA major>, as cudarc names it, on the loader's path). Install NCCL (the libnccl2 package, or pip's nvidia-nccl-cu12) and make it findable as libnccl.so: both ship only libnccl.so.2, so link libnccl.so to it in a directory on LD_LIBRARY_PATH. Single-GPU runs (--tp 1) do not need NCCL".into(),
    }
}

fn nccl_error(what: &str) -> impl FnOnce(cudarc::nccl::result::NcclError) -> EngineError + '_ {
    move |e| EngineError::Communication {
        message: format!("{what}: {e:?}"),
    }
}

/// Collectives over a set of devices, rank `i` on `devices[i]`: NCCL communicators
/// on each GPU's stream, or host copies for interpreter ranks.
pub struct Communicator {
    backend: Backend,
    devices: Vec<Device>,
}

/// How a [`Communicator`] moves data.
enum Backend {
    /// One NCCL communicator a GPU.
    Nccl(Vec<Comm>),
    /// Interpreter ranks: copies through host memory (the launches before a
    /// collective have run when it is issued).
    Host,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("devices", &self.devices)
            .finish()
    }
}

impl Communicator {
    /// Communicators over `devices` (rank `i` is `devices[i]`): distinct GPUs, or
    /// CPU devices only (host collectives).
    ///
    /// Errors: CPU and GPU devices mixed, the same GPU twice, NCCL missing
    /// ([`nccl_available`]), or NCCL failing to initialize.
    pub fn new(devices: &[Device]) -> Result<Communicator> {
        if !devices.is_empty() && devices.iter().all(|d| !d.is_cuda()) {
            return Ok(Communicator {
                backend: Backend::Host,
                devices: devices.to_vec(),
            });
        }
        let mut streams = Vec::with_capacity(devices.len());
        let mut ordinals = Vec::with_capacity(devices.len());
        for d in devices {
            let Some(cuda) = d.as_cuda() else {
                return Err(EngineError::Communication {
                    message: format!(
                        "{d} is not a GPU: collectives run over GPUs only, or over CPU devices only"
                    ),
                });
            };
            if ordinals.contains(&cuda.ordinal()) {
                return Err(EngineError::Communication {
                    message: format!("{d} is listed twice: each rank needs its own GPU"),
                });
            }
            ordinals.push(cuda.ordinal());
            streams.push(cuda.stream().clone());
        }
        if devices.is_empty() {
            return Err(EngineError::Communication {
                message: "a communicator needs at least one device".into(),
            });
        }
        if !nccl_available() {
            return Err(missing_nccl());
        }
        let comms = Comm::from_devices(streams).map_err(nccl_error("initializing NCCL"))?;
        Ok(Communicator {
            backend: Backend::Nccl(comms),
            devices: devices.to_vec(),
        })
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.devices.len()
    }

    /// Whether the collectives go through NCCL (GPU ranks) rather than host memory.
    pub fn uses_nccl(&self) -> bool {
        matches!(self.backend, Backend::Nccl(_))
    }

    /// The devices, in rank order.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// Checks one buffer a rank, each on its rank's device, all of `len` elements.
    fn check<T: Element>(&self, what: &str, bufs: &[&Buffer<T>], len: usize) -> Result<()> {
        if bufs.len() != self.size() {
            return Err(EngineError::Communication {
                message: format!("{what}: {} buffers for {} ranks", bufs.len(), self.size()),
            });
        }
        for (r, (b, d)) in bufs.iter().zip(&self.devices).enumerate() {
            if b.device() != d {
                return Err(EngineError::Communication {
                    message: format!("{what}: rank {r}'s buffer is on {}, not {d}", b.device()),
                });
            }
            if b.len() != len {
                return Err(EngineError::Communication {
                    message: format!(
                        "{what}: rank {r}'s buffer has {} elements, expected {len}",
                        b.len()
                    ),
                });
            }
        }
        Ok(())
    }

    /// Runs `issue(rank)` for every rank inside one NCCL group, ending the group even
    /// when a call fails.
    fn grouped(
        &self,
        what: &str,
        mut issue: impl FnMut(usize) -> std::result::Result<(), cudarc::nccl::result::NcclError>,
    ) -> Result<()> {
        group_start().map_err(nccl_error(what))?;
        let mut first_err = None;
        for r in 0..self.size() {
            if let Err(e) = issue(r) {
                first_err.get_or_insert(e);
            }
        }
        let ended = group_end();
        if let Some(e) = first_err {
            return Err(nccl_error(what)(e));
        }
        ended.map(drop).map_err(nccl_error(what))
    }

    /// In place on every rank: `bufs[r] = sum over ranks of bufs[r]` (queued on each
    /// device's stream; capturable).
    pub fn all_reduce_sum<T: CommElement>(&self, bufs: &mut [&mut Buffer<T>]) -> Result<()> {
        let len = bufs.first().map_or(0, |b| b.len());
        let views: Vec<&Buffer<T>> = bufs.iter().map(|b| &**b).collect();
        self.check("all-reduce", &views, len)?;
        let comms = match &self.backend {
            Backend::Nccl(comms) => comms,
            Backend::Host => {
                let mut sum: Vec<T> = views[0].to_vec()?;
                for b in &views[1..] {
                    for (s, v) in sum.iter_mut().zip(b.to_vec()?) {
                        *s = s.add(v);
                    }
                }
                for b in bufs.iter_mut() {
                    b.copy_from_host(&sum)?;
                }
                return Ok(());
            }
        };
        let mut slices: Vec<_> = bufs
            .iter_mut()
            .map(|b| b.cuda_slice_mut().expect("checked: a GPU buffer"))
            .collect();
        self.grouped("all-reduce", |r| {
            comms[r]
                .all_reduce_in_place(&mut *slices[r], &ReduceOp::Sum)
                .map(drop)
        })
    }

    /// Every rank's `send[r]` concatenated in rank order into every `recv[r]`
    /// (`size` times as long; queued on each device's stream; capturable).
    pub fn all_gather<T: CommElement>(
        &self,
        send: &[&Buffer<T>],
        recv: &mut [&mut Buffer<T>],
    ) -> Result<()> {
        let len = send.first().map_or(0, |b| b.len());
        self.check("all-gather (send)", send, len)?;
        let views: Vec<&Buffer<T>> = recv.iter().map(|b| &**b).collect();
        self.check("all-gather (receive)", &views, len * self.size())?;
        let comms = match &self.backend {
            Backend::Nccl(comms) => comms,
            Backend::Host => {
                let mut all = Vec::with_capacity(len * self.size());
                for b in send {
                    all.extend(b.to_vec()?);
                }
                for b in recv.iter_mut() {
                    b.copy_from_host(&all)?;
                }
                return Ok(());
            }
        };
        let mut slices: Vec<_> = recv
            .iter_mut()
            .map(|b| b.cuda_slice_mut().expect("checked: a GPU buffer"))
            .collect();
        self.grouped("all-gather", |r| {
            let src = send[r].cuda_slice().expect("checked: a GPU buffer");
            comms[r].all_gather(src, &mut *slices[r]).map(drop)
        })
    }

    /// Waits for every device's queued work.
    pub fn synchronize(&self) -> Result<()> {
        for d in &self.devices {
            d.synchronize()?;
        }
        Ok(())
    }
}

/// Captures what `record` queues on each of `devices`' streams into one graph per
/// device (in `devices` order), without running it: kernel launches on any of the
/// devices and collectives of a [`Communicator`] over them.
///
/// The captures are nested (each device's stream is captured while `record` runs);
/// a failure ends every capture and discards it. Run `record`'s work once eagerly
/// first, so kernels are loaded and NCCL has set up its connections.
pub fn capture_all(devices: &[Device], record: impl FnOnce() -> Result<()>) -> Result<Vec<Graph>> {
    fn nest(
        devices: &[Device],
        record: Box<dyn FnOnce() -> Result<()> + '_>,
        graphs: &mut Vec<Graph>,
    ) -> Result<()> {
        match devices.split_first() {
            None => record(),
            Some((first, rest)) => {
                let mut inner = Vec::new();
                let graph = first.capture(|| nest(rest, record, &mut inner))?;
                graphs.push(graph);
                graphs.extend(inner);
                Ok(())
            }
        }
    }
    let mut graphs = Vec::with_capacity(devices.len());
    let relaxed = RelaxedCaptureMode::enter(devices);
    let captured = nest(devices, Box::new(record), &mut graphs);
    drop(relaxed);
    captured?;
    Ok(graphs)
}

/// Replays one graph a device (as [`capture_all`] made them). NCCL warns that a graph launch may wait for its peers'
/// (one thread driving several GPUs), so each rank's launch is issued from its own
/// thread and none can hold the others back.
pub fn launch_all(graphs: &[Graph]) -> Result<()> {
    /// A graph handed to the thread that launches it; each is launched by one thread
    /// only, and the call returns once every launch was issued.
    struct Launch<'a>(&'a Graph);
    // SAFETY: the graph is only launched (a driver call on its own stream) from the
    // one thread it is handed to, while the caller waits for that thread.
    unsafe impl Send for Launch<'_> {}
    if graphs.len() == 1 {
        return Ok(graphs[0].launch()?);
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = graphs[1..]
            .iter()
            .map(|g| {
                let launch = Launch(g);
                s.spawn(move || {
                    let launch = launch;
                    launch.0.launch()
                })
            })
            .collect();
        let first = graphs[0].launch();
        let mut result = first.map_err(EngineError::from);
        for h in handles {
            let joined = h.join().map_err(|_| EngineError::Communication {
                message: "a thread launching a rank's graph panicked".into(),
            });
            if let Err(e) = joined.and_then(|r| r.map_err(EngineError::from)) {
                if result.is_ok() {
                    result = Err(e);
                }
            }
        }
        result
    })
}

/// The calling thread's stream-capture interaction mode set to relaxed while it
/// lives (restored on drop).
///
/// Each capture begins thread-local, and in that mode a thread with a capture under
/// way may not make "potentially unsafe" driver calls: ending an inner capture
/// instantiates its graph (`cuGraphInstantiate`), which is one, and failed with
/// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` while the outer devices' captures were
/// still open (docs/gpu-results.md, the first two-GPU run). Relaxed, the thread may
/// make them; no other thread uses these devices during the capture.
struct RelaxedCaptureMode {
    previous: Option<cudarc::driver::sys::CUstreamCaptureMode>,
}

impl RelaxedCaptureMode {
    fn enter(devices: &[Device]) -> RelaxedCaptureMode {
        use cudarc::driver::sys;
        let Some(cuda) = devices.iter().find_map(|d| d.as_cuda()) else {
            return RelaxedCaptureMode { previous: None };
        };
        if cuda.context().bind_to_thread().is_err() {
            return RelaxedCaptureMode { previous: None };
        }
        let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: exchanges the calling thread's mode through a valid pointer.
        let r = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
        RelaxedCaptureMode {
            previous: (r == sys::CUresult::CUDA_SUCCESS).then_some(mode),
        }
    }
}

impl Drop for RelaxedCaptureMode {
    fn drop(&mut self) {
        if let Some(mut mode) = self.previous.take() {
            // SAFETY: as in `enter`; restores the mode it replaced.
            unsafe { cudarc::driver::sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ranks_reduce_and_gather_through_the_host() {
        let devs = [Device::cpu(), Device::cpu(), Device::cpu()];
        let comm = Communicator::new(&devs).unwrap();
        assert!(!comm.uses_nccl());
        assert_eq!(comm.size(), 3);
        // Seeded values; the sum is checked against the host's in rank order.
        let vals: Vec<Vec<f32>> = (0..3)
            .map(|r| {
                (0..5)
                    .map(|i| ((r * 7 + i * 13) % 11) as f32 * 0.37 - 1.5)
                    .collect()
            })
            .collect();
        let mut bufs: Vec<Buffer<f32>> = vals.iter().map(|v| devs[0].upload(v).unwrap()).collect();
        let mut refs: Vec<&mut Buffer<f32>> = bufs.iter_mut().collect();
        comm.all_reduce_sum(&mut refs).unwrap();
        let want: Vec<f32> = (0..5)
            .map(|i| vals[0][i] + vals[1][i] + vals[2][i])
            .collect();
        for b in &bufs {
            assert_eq!(b.to_vec().unwrap(), want);
        }
        let send: Vec<Buffer<i32>> = (0..3)
            .map(|r| devs[0].upload(&[r, 10 * r]).unwrap())
            .collect();
        let mut recv: Vec<Buffer<i32>> = (0..3).map(|_| devs[0].zeros(6).unwrap()).collect();
        let sends: Vec<&Buffer<i32>> = send.iter().collect();
        let mut recvs: Vec<&mut Buffer<i32>> = recv.iter_mut().collect();
        comm.all_gather(&sends, &mut recvs).unwrap();
        for b in &recv {
            assert_eq!(b.to_vec().unwrap(), [0, 0, 1, 10, 2, 20]);
        }
        // Wrong lengths and counts are errors naming the rank.
        let mut short: Vec<Buffer<f32>> = vec![
            devs[0].zeros(5).unwrap(),
            devs[0].zeros(4).unwrap(),
            devs[0].zeros(5).unwrap(),
        ];
        let mut refs: Vec<&mut Buffer<f32>> = short.iter_mut().collect();
        let e = comm.all_reduce_sum(&mut refs).unwrap_err().to_string();
        assert!(e.contains("rank 1's buffer has 4 elements"), "{e}");
        let e = comm.all_reduce_sum(&mut refs[..2]).unwrap_err().to_string();
        assert!(e.contains("2 buffers for 3 ranks"), "{e}");
        let e = Communicator::new(&[]).unwrap_err().to_string();
        assert!(e.contains("at least one device"), "{e}");
    }

    #[test]
    fn missing_nccl_says_what_to_install() {
        let m = missing_nccl().to_string();
        assert!(m.contains("libnccl.so") && m.contains("--tp 1"), "{m}");
        // Asking never panics, with or without the library.
        let _ = nccl_available();
    }
}
