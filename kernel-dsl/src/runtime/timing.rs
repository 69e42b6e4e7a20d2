//! Device facts and GPU timing: what a GPU is ([`DeviceInfo`]), CUDA events around
//! queued work ([`Device::time_ms`], [`time_events`]), timed replays of a captured
//! [`Graph`] ([`Graph::time`], [`time_graph`]), and the device-to-device copy ceiling
//! ([`copy_ceiling`]).
//!
//! The method (docs/perf.md, "Decode kernels: method"): a kernel's time is the median of many
//! repetitions after a warm-up, taken with CUDA events around a CUDA-graph replay of many
//! launches (so the host's launch cost does not show) or, as a fallback, around the
//! launches themselves. Everything here needs a CUDA device; on the CPU device it returns
//! an error, never panics.

use std::fmt;
use std::time::Duration;

use cudarc::driver::sys::{CUdevice_attribute, CUevent_flags};
use cudarc::driver::CudaEvent;

use super::{CudaDevice, Device, Graph, RuntimeError};

/// What measurements and launch plans need to know about a GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The name the driver reports.
    pub name: String,
    /// Streaming multiprocessors.
    pub sm_count: usize,
    /// L2 cache size in bytes.
    pub l2_bytes: usize,
    /// Device memory in bytes.
    pub total_mem: usize,
    /// `(major, minor)` compute capability.
    pub compute_capability: (i32, i32),
    /// Peak memory bandwidth in bytes per second as the driver's memory clock and bus
    /// width give it (two transfers a clock; 0 where the driver reports neither): 3.35
    /// TB/s on an H100 SXM. A planner's hint, not a measurement (`tilefuse bench`
    /// measures the copy bandwidth).
    pub memory_bandwidth: u64,
}

impl CudaDevice {
    /// Queries the SM count, L2 size and memory of the GPU.
    pub fn info(&self) -> Result<DeviceInfo, RuntimeError> {
        let ctx = self.context();
        let attr = |a| {
            ctx.attribute(a)
                .map(|v| v.max(0) as usize)
                .map_err(RuntimeError::driver("querying a device attribute"))
        };
        Ok(DeviceInfo {
            name: self.name().to_string(),
            sm_count: attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
            l2_bytes: attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?,
            total_mem: ctx
                .total_mem()
                .map_err(RuntimeError::driver("querying device memory"))?,
            compute_capability: self.compute_capability(),
            memory_bandwidth: {
                let khz = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE)?;
                let bits = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH)?;
                2 * khz as u64 * 1000 * (bits / 8) as u64
            },
        })
    }

    /// A CUDA event for timing on this device's stream.
    fn timing_event(&self) -> Result<CudaEvent, RuntimeError> {
        self.context()
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(RuntimeError::driver("creating a timing event"))
    }
}

/// The CUDA device of `dev`, or an error naming `what` needs one.
fn cuda<'a>(dev: &'a Device, what: &str) -> Result<&'a CudaDevice, RuntimeError> {
    dev.as_cuda()
        .map(|c| &**c)
        .ok_or_else(|| RuntimeError::NoDevice {
            ordinal: None,
            detail: format!("{what} needs a CUDA device, got {dev}"),
        })
}

impl Device {
    /// [`CudaDevice::info`] of a GPU; an error on the CPU device.
    pub fn info(&self) -> Result<DeviceInfo, RuntimeError> {
        cuda(self, "device info")?.info()
    }

    /// Milliseconds of GPU time between two CUDA events recorded on the device's stream
    /// around the work `work` queues (the GPU's time, not the host's). Waits for the
    /// second event.
    pub fn time_ms<E: From<RuntimeError>>(
        &self,
        work: impl FnOnce() -> Result<(), E>,
    ) -> Result<f64, E> {
        let cuda = cuda(self, "event timing")?;
        let (start, end) = (cuda.timing_event()?, cuda.timing_event()?);
        let stream = cuda.stream();
        let timing = RuntimeError::driver("timing GPU work");
        start.record(stream).map_err(timing)?;
        work()?;
        let timing = RuntimeError::driver("timing GPU work");
        end.record(stream).map_err(timing)?;
        let ms = start
            .elapsed_ms(&end)
            .map_err(RuntimeError::driver("timing GPU work"))?;
        Ok(f64::from(ms))
    }
}

/// Summary of repeated timings, in microseconds per unit of work.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stats {
    /// Median.
    pub median_us: f64,
    /// 10th percentile.
    pub p10_us: f64,
    /// 90th percentile.
    pub p90_us: f64,
    /// Fastest sample.
    pub min_us: f64,
    /// Slowest sample.
    pub max_us: f64,
    /// Number of samples.
    pub samples: usize,
}

impl Stats {
    /// Summarizes samples (microseconds). Empty input gives NaNs.
    pub fn from_samples(samples: &[f64]) -> Stats {
        let mut s: Vec<f64> = samples.iter().copied().filter(|v| !v.is_nan()).collect();
        s.sort_by(f64::total_cmp);
        let q = |p: f64| -> f64 {
            if s.is_empty() {
                return f64::NAN;
            }
            // Linear interpolation between the closest ranks.
            let x = p * (s.len() - 1) as f64;
            let (lo, hi) = (x.floor() as usize, x.ceil() as usize);
            s[lo] + (s[hi] - s[lo]) * (x - lo as f64)
        };
        Stats {
            median_us: q(0.5),
            p10_us: q(0.1),
            p90_us: q(0.9),
            min_us: q(0.0),
            max_us: q(1.0),
            samples: s.len(),
        }
    }

    /// Bytes per second when each unit of work moves `bytes`, at the median.
    pub fn bytes_per_s(&self, bytes: u64) -> f64 {
        bytes as f64 / (self.median_us * 1e-6)
    }

    /// Gigabytes (1e9 bytes) per second at the median.
    pub fn gb_per_s(&self, bytes: u64) -> f64 {
        self.bytes_per_s(bytes) / 1e9
    }
}

/// Warm-up and repetition counts for one measurement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimingOptions {
    /// Untimed runs first (module load, clocks, caches of the driver).
    pub warmup: usize,
    /// Timed samples.
    pub reps: usize,
}

impl Default for TimingOptions {
    fn default() -> TimingOptions {
        TimingOptions {
            warmup: 5,
            reps: 30,
        }
    }
}

/// Times `launches` calls of `f` (called with `0..launches`, e.g. to pick a buffer set)
/// between two CUDA events, `opts.reps` times after `opts.warmup` untimed rounds.
///
/// Returns microseconds per call. The host's launch cost is included whenever it
/// exceeds the kernel's run time; prefer [`time_graph`] for short kernels.
pub fn time_events<E: From<RuntimeError>>(
    dev: &Device,
    launches: usize,
    opts: TimingOptions,
    mut f: impl FnMut(usize) -> Result<(), E>,
) -> Result<Stats, E> {
    let launches = launches.max(1);
    for _ in 0..opts.warmup {
        for i in 0..launches {
            f(i)?;
        }
    }
    dev.synchronize()?;
    let mut samples = Vec::with_capacity(opts.reps);
    for _ in 0..opts.reps.max(1) {
        let ms = dev.time_ms(|| (0..launches).try_for_each(&mut f))?;
        samples.push(ms * 1e3 / launches as f64);
    }
    Ok(Stats::from_samples(&samples))
}

impl Graph {
    /// Times replays with CUDA events, `opts.reps` samples after `opts.warmup` untimed
    /// replays: microseconds per replay divided by `per_replay` (the units of work, e.g.
    /// launches, one replay holds).
    pub fn time(&self, per_replay: usize, opts: TimingOptions) -> Result<Stats, RuntimeError> {
        for _ in 0..opts.warmup {
            self.launch()?;
        }
        self.device().synchronize()?;
        let mut samples = Vec::with_capacity(opts.reps);
        for _ in 0..opts.reps.max(1) {
            let ms = self.device().time_ms(|| self.launch())?;
            samples.push(ms * 1e3 / per_replay.max(1) as f64);
        }
        Ok(Stats::from_samples(&samples))
    }

    /// The GPU time of `replays` back-to-back replays between two events (for
    /// criterion's `iter_custom`).
    pub fn time_replays(&self, replays: u64) -> Result<Duration, RuntimeError> {
        let ms = self
            .device()
            .time_ms(|| (0..replays).try_for_each(|_| self.launch()))?;
        Ok(Duration::from_secs_f64(ms * 1e-3))
    }
}

/// How a measurement was taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// Events around CUDA-graph replays.
    Graph,
    /// Events around plain launches (graph capture failed).
    Events,
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Method::Graph => "graph",
            Method::Events => "events",
        })
    }
}

/// Times `f` by graph replay (a graph of `launches` calls, `f` called with `0..launches`;
/// microseconds per call), falling back to events around plain launches when capture
/// fails. `f` runs once uncaptured first, as a warm-up.
pub fn time_graph<E: From<RuntimeError>>(
    dev: &Device,
    launches: usize,
    opts: TimingOptions,
    mut f: impl FnMut(usize) -> Result<(), E>,
) -> Result<(Stats, Method), E> {
    let launches = launches.max(1);
    f(0)?;
    dev.synchronize()?;
    match dev.capture(|| (0..launches).try_for_each(&mut f)) {
        Ok(g) => Ok((g.time(launches, opts)?, Method::Graph)),
        Err(_) => Ok((time_events(dev, launches, opts, f)?, Method::Events)),
    }
}

/// The device-to-device copy ceiling.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CopyCeiling {
    /// Bytes of the copied buffer.
    pub buffer_bytes: usize,
    /// Time per copy.
    pub stats: Stats,
}

impl CopyCeiling {
    /// Bytes read plus written per second, at the median: the bandwidth a streaming
    /// kernel can hope for.
    pub fn bytes_per_s(&self) -> f64 {
        self.stats.bytes_per_s(2 * self.buffer_bytes as u64)
    }

    /// [`Self::bytes_per_s`] in GB/s (1e9 bytes).
    pub fn gb_per_s(&self) -> f64 {
        self.bytes_per_s() / 1e9
    }
}

/// Measures the copy ceiling: `cuMemcpyDtoD` of a `bytes`-sized buffer (use ≥ 1 GiB)
/// filled with random bytes, timed with events, median of `opts.reps` after a warm-up.
pub fn copy_ceiling(
    dev: &Device,
    bytes: usize,
    opts: TimingOptions,
) -> Result<CopyCeiling, RuntimeError> {
    let s = cuda(dev, "the copy ceiling")?.stream().clone();
    let driver = |what: &'static str| RuntimeError::driver(what);
    let words = bytes.div_ceil(4).max(1);
    // Random source: one random 64 MiB chunk (odd words, splitmix64), replicated on the
    // device.
    let chunk_words = words.min(16 << 20);
    let mut state = 0xC0FF_EE00u64;
    let chunk: Vec<u32> = (0..chunk_words)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((z ^ (z >> 31)) >> 32) as u32 | 1
        })
        .collect();
    let chunk = s.clone_htod(&chunk).map_err(driver("uploading"))?;
    let mut src = s
        .alloc_zeros::<u32>(words)
        .map_err(driver("allocating the copy source"))?;
    let mut dst = s
        .alloc_zeros::<u32>(words)
        .map_err(driver("allocating the copy destination"))?;
    let mut at = 0;
    while at < words {
        let n = chunk_words.min(words - at);
        s.memcpy_dtod(&chunk.slice(..n), &mut src.slice_mut(at..at + n))
            .map_err(driver("filling the copy source"))?;
        at += n;
    }
    let stats = time_events(dev, 1, opts, |_| {
        s.memcpy_dtod(&src, &mut dst)
            .map_err(driver("copying on the device"))
    })?;
    Ok(CopyCeiling {
        buffer_bytes: words * 4,
        stats,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_median_and_percentiles() {
        let s = Stats::from_samples(&[5.0, 1.0, 3.0, 2.0, 4.0, f64::NAN]);
        assert_eq!(s.samples, 5);
        assert_eq!(s.median_us, 3.0);
        assert_eq!(s.min_us, 1.0);
        assert_eq!(s.max_us, 5.0);
        assert!((s.p10_us - 1.4).abs() < 1e-12);
        assert!((s.gb_per_s(3000) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn cpu_device_is_an_error_not_a_panic() {
        let cpu = Device::cpu();
        assert!(cpu.info().is_err());
        assert!(copy_ceiling(&cpu, 1 << 20, TimingOptions::default()).is_err());
        let r: Result<Stats, RuntimeError> =
            time_events(&cpu, 1, TimingOptions::default(), |_| Ok(()));
        assert!(r.is_err());
        assert!(cpu.time_ms(|| Ok::<(), RuntimeError>(())).is_err());
    }
}
