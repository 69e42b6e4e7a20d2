//! Collective communication between the GPUs of one host, for tensor parallelism
//! ([`crate::tp`]): one process drives every GPU, through NCCL.
//!
//! NCCL is loaded at run time (cudarc's `nccl` bindings with `dynamic-loading`):
//! building needs no NCCL, and nothing loads it unless a [`Communicator`] is made, so
//! single-GPU runs do not depend on it. Without the library, [`Communicator::new`]
//! returns an error saying what was looked for.
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
pub trait CommElement: Element + NcclType {}
impl CommElement for f32 {}
impl CommElement for bf16 {}
impl CommElement for i32 {}

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

/// NCCL communicators over a set of GPUs, rank `i` on `devices[i]` and its stream.
pub struct Communicator {
    comms: Vec<Comm>,
    devices: Vec<Device>,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("devices", &self.devices)
            .finish()
    }
}

impl Communicator {
    /// Communicators over `devices` (distinct GPUs; rank `i` is `devices[i]`).
    ///
    /// Errors: a CPU device or the same GPU twice, NCCL missing ([`nccl_available`]),
    /// or NCCL failing to initialize.
    pub fn new(devices: &[Device]) -> Result<Communicator> {
        let mut streams = Vec::with_capacity(devices.len());
        let mut ordinals = Vec::with_capacity(devices.len());
        for d in devices {
            let Some(cuda) = d.as_cuda() else {
                return Err(EngineError::Communication {
                    message: format!("{d} is not a GPU: collectives need CUDA devices"),
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
                message: "a communicator needs at least one GPU".into(),
            });
        }
        if !nccl_available() {
            return Err(missing_nccl());
        }
        let comms = Comm::from_devices(streams).map_err(nccl_error("initializing NCCL"))?;
        Ok(Communicator {
            comms,
            devices: devices.to_vec(),
        })
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.comms.len()
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
        let mut slices: Vec<_> = bufs
            .iter_mut()
            .map(|b| b.cuda_slice_mut().expect("checked: a GPU buffer"))
            .collect();
        self.grouped("all-reduce", |r| {
            self.comms[r]
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
        let mut slices: Vec<_> = recv
            .iter_mut()
            .map(|b| b.cuda_slice_mut().expect("checked: a GPU buffer"))
            .collect();
        self.grouped("all-gather", |r| {
            let src = send[r].cuda_slice().expect("checked: a GPU buffer");
            self.comms[r].all_gather(src, &mut *slices[r]).map(drop)
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
    nest(devices, Box::new(record), &mut graphs)?;
    Ok(graphs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_devices_are_refused_before_nccl_is_looked_for() {
        let e = Communicator::new(&[Device::cpu(), Device::cpu()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("cpu is not a GPU"), "{e}");
        let e = Communicator::new(&[]).unwrap_err().to_string();
        assert!(e.contains("at least one GPU"), "{e}");
    }

    #[test]
    fn missing_nccl_says_what_to_install() {
        let m = missing_nccl().to_string();
        assert!(m.contains("libnccl.so") && m.contains("--tp 1"), "{m}");
        // Asking never panics, with or without the library.
        let _ = nccl_available();
    }
}
