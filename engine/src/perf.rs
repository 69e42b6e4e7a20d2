//! Measurement tools for the decode kernels: the device's copy ceiling, event and
//! CUDA-graph timing, buffer rotation past the L2 cache, and a cuBLAS baseline.
//!
//! Used by `examples/bandwidth.rs`, `benches/kernels.rs` and the `tilefuse bench`
//! command. Everything here needs a CUDA [`Device`]; called with the CPU device, the
//! functions return [`PerfError`] instead of panicking, and [`Cublas::new`] also returns
//! an error (never panics) when the cuBLAS library cannot be loaded.
//!
//! The method (see `docs/perf.md`):
//!
//! - the ceiling is a large device-to-device copy, counting bytes read plus written;
//! - a kernel's time is the median of many repetitions after a warm-up, taken with CUDA
//!   events around a CUDA-graph replay of many launches (so the host's launch cost does
//!   not show) or, as a fallback, around the launches themselves;
//! - each launch of a measurement reads a different set of buffers, enough sets to
//!   exceed 4× the L2 cache ([`rotation_sets`]), so the numbers are HBM, not L2.

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use cudarc::driver::sys::{
    CUdevice_attribute, CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode,
};
use cudarc::driver::{CudaGraph, CudaStream};
use tilefuse_dsl::half::bf16;
use tilefuse_dsl::runtime::{
    Buffer, Device, Element, KernelDef, LaunchConfig, LaunchError, RuntimeError,
};

use crate::kernels;
use crate::tuning::{self, AttentionConfig, GemvConfig};

/// Why a measurement could not be taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PerfError(pub String);

impl fmt::Display for PerfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PerfError {}

impl From<LaunchError> for PerfError {
    fn from(e: LaunchError) -> PerfError {
        PerfError(e.to_string())
    }
}

impl From<RuntimeError> for PerfError {
    fn from(e: RuntimeError) -> PerfError {
        PerfError(e.to_string())
    }
}

impl From<cudarc::driver::DriverError> for PerfError {
    fn from(e: cudarc::driver::DriverError) -> PerfError {
        PerfError(format!("CUDA driver: {e}"))
    }
}

impl From<cudarc::cublas::result::CublasError> for PerfError {
    fn from(e: cudarc::cublas::result::CublasError) -> PerfError {
        PerfError(format!("cuBLAS: {e:?}"))
    }
}

/// `Result` with [`PerfError`].
pub type Result<T> = std::result::Result<T, PerfError>;

/// The stream of a CUDA device, or an error for the CPU.
fn stream(dev: &Device) -> Result<&Arc<CudaStream>> {
    dev.as_cuda()
        .map(|d| d.stream())
        .ok_or_else(|| PerfError(format!("timing needs a CUDA device, got {dev}")))
}

/// What the measurements need to know about a GPU.
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
}

/// Queries SM count, L2 size and memory of a CUDA device.
pub fn device_info(dev: &Device) -> Result<DeviceInfo> {
    let cuda = dev
        .as_cuda()
        .ok_or_else(|| PerfError(format!("device_info needs a CUDA device, got {dev}")))?;
    let ctx = cuda.context();
    let attr = |a| ctx.attribute(a).map(|v| v.max(0) as usize);
    Ok(DeviceInfo {
        name: cuda.name().to_string(),
        sm_count: attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        l2_bytes: attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?,
        total_mem: ctx.total_mem()?,
        compute_capability: cuda.compute_capability(),
    })
}

/// How many distinct buffer sets of `set_bytes` each a measurement must cycle through so
/// that together they exceed 4× the L2 cache (at least 2, so no launch reads what the
/// previous one left in L2).
pub fn rotation_sets(set_bytes: usize, l2_bytes: usize) -> usize {
    let need = 4 * l2_bytes.max(1);
    (need / set_bytes.max(1) + 1).max(2)
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

fn timing_event(dev: &Device) -> Result<cudarc::driver::CudaEvent> {
    let s = stream(dev)?;
    Ok(s.context()
        .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?)
}

/// Times `launches` calls of `f` (called with `0..launches`, e.g. to pick a buffer set)
/// between two CUDA events, `opts.reps` times after `opts.warmup` untimed rounds.
///
/// Returns microseconds per call. The host's launch cost is included whenever it
/// exceeds the kernel's run time; prefer [`time_graph`] for short kernels.
pub fn time_events(
    dev: &Device,
    launches: usize,
    opts: TimingOptions,
    mut f: impl FnMut(usize) -> Result<()>,
) -> Result<Stats> {
    let s = stream(dev)?.clone();
    let launches = launches.max(1);
    let (start, end) = (timing_event(dev)?, timing_event(dev)?);
    for _ in 0..opts.warmup {
        for i in 0..launches {
            f(i)?;
        }
    }
    s.synchronize()?;
    let mut samples = Vec::with_capacity(opts.reps);
    for _ in 0..opts.reps.max(1) {
        start.record(&s)?;
        for i in 0..launches {
            f(i)?;
        }
        end.record(&s)?;
        let ms = start.elapsed_ms(&end)?;
        samples.push(f64::from(ms) * 1e3 / launches as f64);
    }
    Ok(Stats::from_samples(&samples))
}

/// A CUDA graph of `launches` calls of `f`, captured once on the device's stream.
///
/// `f` runs once per index during capture; nothing executes until [`Self::replay`].
/// Run `f` once outside capture first, so that lazy initialization (module load, library
/// handles) stays out of the capture.
pub struct CapturedGraph {
    graph: CudaGraph,
    stream: Arc<CudaStream>,
    launches: usize,
}

impl CapturedGraph {
    /// Captures `launches` calls of `f`.
    pub fn capture(
        dev: &Device,
        launches: usize,
        mut f: impl FnMut(usize) -> Result<()>,
    ) -> Result<CapturedGraph> {
        let s = stream(dev)?.clone();
        let launches = launches.max(1);
        s.synchronize()?;
        // The runtime's contexts run with cudarc's event tracking off (see
        // `Device::cuda`); with it on, capture fails with STREAM_CAPTURE_ISOLATION.
        s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        let mut failed = None;
        for i in 0..launches {
            if let Err(e) = f(i) {
                failed = Some(e);
                break;
            }
        }
        // Always end the capture, so the stream is usable whatever happened.
        let graph = s.end_capture(CUgraphInstantiate_flags(0));
        if let Some(e) = failed {
            return Err(e);
        }
        let graph = graph?.ok_or_else(|| PerfError("the captured graph is empty".into()))?;
        Ok(CapturedGraph {
            graph,
            stream: s,
            launches,
        })
    }

    /// Launches captured per replay.
    pub fn launches(&self) -> usize {
        self.launches
    }

    /// Queues one replay on the stream.
    pub fn replay(&self) -> Result<()> {
        self.graph.launch()?;
        Ok(())
    }

    /// Times replays with CUDA events: microseconds per captured launch.
    pub fn time(&self, opts: TimingOptions) -> Result<Stats> {
        let ctx = self.stream.context();
        let start = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        let end = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        for _ in 0..opts.warmup {
            self.replay()?;
        }
        self.stream.synchronize()?;
        let mut samples = Vec::with_capacity(opts.reps);
        for _ in 0..opts.reps.max(1) {
            start.record(&self.stream)?;
            self.replay()?;
            end.record(&self.stream)?;
            let ms = start.elapsed_ms(&end)?;
            samples.push(f64::from(ms) * 1e3 / self.launches as f64);
        }
        Ok(Stats::from_samples(&samples))
    }

    /// Times `iters` back-to-back replays between two events; total seconds. For
    /// criterion's `iter_custom`, where one iteration is one replay.
    pub fn time_replays(&self, iters: u64) -> Result<std::time::Duration> {
        let ctx = self.stream.context();
        let start = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        let end = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        start.record(&self.stream)?;
        for _ in 0..iters {
            self.replay()?;
        }
        end.record(&self.stream)?;
        let ms = start.elapsed_ms(&end)?;
        Ok(std::time::Duration::from_secs_f64(f64::from(ms) * 1e-3))
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

/// Times `f` by graph replay (`launches` calls per graph), falling back to events around
/// plain launches when capture fails. `f` runs once uncaptured first, as a warm-up.
pub fn time_graph(
    dev: &Device,
    launches: usize,
    opts: TimingOptions,
    mut f: impl FnMut(usize) -> Result<()>,
) -> Result<(Stats, Method)> {
    f(0)?;
    stream(dev)?.synchronize()?;
    match CapturedGraph::capture(dev, launches, &mut f) {
        Ok(g) => Ok((g.time(opts)?, Method::Graph)),
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
pub fn copy_ceiling(dev: &Device, bytes: usize, opts: TimingOptions) -> Result<CopyCeiling> {
    let s = stream(dev)?.clone();
    let words = bytes.div_ceil(4).max(1);
    // Random source: one random 64 MiB chunk, replicated on the device.
    let chunk_words = words.min(16 << 20);
    let mut rng = Rng::new(0xC0FF_EE00);
    let chunk: Vec<u32> = (0..chunk_words).map(|_| rng.next_u32() | 1).collect();
    let chunk = s.clone_htod(&chunk)?;
    let mut src = s.alloc_zeros::<u32>(words)?;
    let mut dst = s.alloc_zeros::<u32>(words)?;
    let mut at = 0;
    while at < words {
        let n = chunk_words.min(words - at);
        s.memcpy_dtod(&chunk.slice(..n), &mut src.slice_mut(at..at + n))?;
        at += n;
    }
    let stats = time_events(dev, 1, opts, |_| {
        s.memcpy_dtod(&src, &mut dst)?;
        Ok(())
    })?;
    Ok(CopyCeiling {
        buffer_bytes: words * 4,
        stats,
    })
}

/// A small seeded generator (splitmix64) for test and benchmark data.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator with this seed.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// The next 32 random bits.
    pub fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * self.unit()
    }

    /// A non-zero value of magnitude in `[scale / 16, scale)` and random sign, as bf16.
    pub fn nonzero_bf16(&mut self, scale: f32) -> bf16 {
        let m = scale * (0.0625 + 0.9375 * self.unit());
        let v = bf16::from_f32(if self.next_u64() & 1 == 0 { m } else { -m });
        if v == bf16::ZERO {
            bf16::from_f32(scale)
        } else {
            v
        }
    }

    /// `len` values from [`Self::nonzero_bf16`].
    pub fn bf16_vec(&mut self, len: usize, scale: f32) -> Vec<bf16> {
        (0..len).map(|_| self.nonzero_bf16(scale)).collect()
    }
}

/// `len` random non-zero bf16 values on `dev`, from `seed`.
pub fn random_bf16(dev: &Device, len: usize, scale: f32, seed: u64) -> Result<Buffer<bf16>> {
    Ok(dev.upload(&Rng::new(seed).bf16_vec(len, scale))?)
}

/// Uploads the same host data as `sets` distinct device buffers (for L2 rotation; the
/// addresses differ, so no set is served from another's cache lines).
pub fn replicate<T: Element>(dev: &Device, data: &[T], sets: usize) -> Result<Vec<Buffer<T>>> {
    (0..sets.max(1))
        .map(|_| dev.upload(data).map_err(PerfError::from))
        .collect()
}

/// A cuBLAS handle on the device's stream, for the bf16 GEMV baseline.
pub struct Cublas {
    blas: CudaBlas,
}

/// Runs `f`, turning a panic (cudarc panics when a library or symbol is missing) into an
/// error, without printing the panic message.
fn no_panic<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = catch_unwind(AssertUnwindSafe(f));
    std::panic::set_hook(hook);
    match r {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            Err(PerfError(format!("{what}: {msg}")))
        }
    }
}

impl Cublas {
    /// Loads cuBLAS and creates a handle on `dev`'s stream. Returns an error (never
    /// panics) without a GPU or without a loadable `libcublas.so` (cudarc looks for
    /// `libcublas.so`, `libcublas.so.12`, … on the loader's path).
    pub fn new(dev: &Device) -> Result<Cublas> {
        let s = stream(dev)?.clone();
        no_panic("loading cuBLAS", || {
            // SAFETY: loading the library runs its initializers; nothing else.
            unsafe { cudarc::cublas::sys::culib() };
            Ok(Cublas {
                blas: CudaBlas::new(s)?,
            })
        })
    }

    /// `y = W x` for a row-major bf16 `W` of shape `[n, k]`, bf16 in and out, f32
    /// compute (`cublasGemmEx` with m = n, n = 1).
    pub fn gemv_bf16(
        &self,
        w: &Buffer<bf16>,
        x: &Buffer<bf16>,
        y: &mut Buffer<bf16>,
        n: usize,
        k: usize,
    ) -> Result<()> {
        if w.len() < n * k || x.len() < k || y.len() < n {
            return Err(PerfError(format!(
                "cuBLAS GEMV {n}x{k}: buffers too small (w {}, x {}, y {})",
                w.len(),
                x.len(),
                y.len()
            )));
        }
        let (Some(ws), Some(xs)) = (w.cuda_slice(), x.cuda_slice()) else {
            return Err(PerfError("cuBLAS needs CUDA buffers".into()));
        };
        let ys = y
            .cuda_slice_mut()
            .ok_or_else(|| PerfError("cuBLAS needs CUDA buffers".into()))?;
        // Row-major [n, k] is column-major [k, n]; transposed it is the [n, k] operand.
        let cfg = GemmConfig {
            transa: cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_T,
            transb: cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_N,
            m: n as i32,
            n: 1,
            k: k as i32,
            alpha: bf16::ONE,
            lda: k as i32,
            ldb: k as i32,
            beta: bf16::ZERO,
            ldc: n as i32,
        };
        no_panic("cuBLAS GemmEx", || {
            // SAFETY: the sizes were checked against the buffers above.
            unsafe { self.blas.gemm(cfg, ws, xs, ys) }?;
            Ok(())
        })
    }
}

impl Cublas {
    /// `c = a b` for row-major bf16 `a [m, k]`, `b [k, n]` and `c [m, n]`, f32 compute
    /// (`cublasGemmEx`; row-major `c` is column-major `c^T = b^T a^T`).
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_bf16(
        &self,
        a: &Buffer<bf16>,
        b: &Buffer<bf16>,
        c: &mut Buffer<bf16>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<()> {
        if a.len() < m * k || b.len() < k * n || c.len() < m * n {
            return Err(PerfError(format!(
                "cuBLAS GEMM {m}x{n}x{k}: buffers too small (a {}, b {}, c {})",
                a.len(),
                b.len(),
                c.len()
            )));
        }
        let (Some(asl), Some(bsl)) = (a.cuda_slice(), b.cuda_slice()) else {
            return Err(PerfError("cuBLAS needs CUDA buffers".into()));
        };
        let csl = c
            .cuda_slice_mut()
            .ok_or_else(|| PerfError("cuBLAS needs CUDA buffers".into()))?;
        let op = cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_N;
        let cfg = GemmConfig {
            transa: op,
            transb: op,
            m: n as i32,
            n: m as i32,
            k: k as i32,
            alpha: bf16::ONE,
            lda: n as i32,
            ldb: k as i32,
            beta: bf16::ZERO,
            ldc: n as i32,
        };
        no_panic("cuBLAS GemmEx", || {
            // SAFETY: the sizes were checked against the buffers above.
            unsafe { self.blas.gemm(cfg, bsl, asl, csl) }?;
            Ok(())
        })
    }
}

/// The GEMV-family decode kernels a [`GemvWorkload`] measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GemvKind {
    /// [`kernels::rms_norm_gemv`] (QKV projection).
    RmsNormGemv,
    /// [`kernels::gemv_residual`] (O and down projections).
    GemvResidual,
    /// [`kernels::rms_norm_gate_up`] (fused gate and up; the weight has `2 × inter` rows).
    RmsNormGateUp,
    /// [`kernels::lm_head_argmax`] followed by [`kernels::argmax_finish`].
    LmHead,
}

impl GemvKind {
    /// The kernel's description (for the LM head, the GEMV part).
    pub fn def(self) -> &'static KernelDef {
        match self {
            GemvKind::RmsNormGemv => &kernels::RMS_NORM_GEMV,
            GemvKind::GemvResidual => &kernels::GEMV_RESIDUAL,
            GemvKind::RmsNormGateUp => &kernels::RMS_NORM_GATE_UP,
            GemvKind::LmHead => &kernels::LM_HEAD_ARGMAX,
        }
    }

    /// A short name for tables.
    pub fn name(self) -> &'static str {
        match self {
            GemvKind::RmsNormGemv => "rms_norm_gemv",
            GemvKind::GemvResidual => "gemv_residual",
            GemvKind::RmsNormGateUp => "rms_norm_gate_up",
            GemvKind::LmHead => "lm_head_argmax",
        }
    }
}

/// One set of a GEMV workload's buffers.
struct GemvSet {
    w: Buffer<bf16>,
    x: Buffer<bf16>,
    norm: Buffer<bf16>,
    bias: Buffer<bf16>,
    y: Buffer<bf16>,
}

/// A GEMV-family kernel at one shape, with enough buffer sets to exceed 4× L2, plus the
/// cuBLAS baseline at the same shape.
///
/// `n × k` is the weight's shape (for [`GemvKind::RmsNormGateUp`], `n = 2 × inter`).
pub struct GemvWorkload {
    /// Which kernel.
    pub kind: GemvKind,
    /// Weight rows.
    pub n: usize,
    /// Weight columns.
    pub k: usize,
    sets: Vec<GemvSet>,
    y_blas: Buffer<bf16>,
    logits: Buffer<f32>,
    part_val: Buffer<f32>,
    part_idx: Buffer<i32>,
    state: Buffer<i32>,
    /// The layer kernels' timeline argument (never written: `stamp_at` is -1).
    stamps: Buffer<i64>,
}

const EPS: f32 = 1e-6;

impl GemvWorkload {
    /// Allocates `rotation_sets` sets of random non-zero inputs on `dev`.
    pub fn new(
        dev: &Device,
        kind: GemvKind,
        n: usize,
        k: usize,
        l2_bytes: usize,
        seed: u64,
    ) -> Result<GemvWorkload> {
        let mut rng = Rng::new(seed);
        let sets = rotation_sets(n * k * 2, l2_bytes);
        // One random weight, uploaded to distinct buffers: the addresses are what the
        // cache sees.
        let w = rng.bf16_vec(n * k, 0.05);
        let mut v = Vec::with_capacity(sets);
        for _ in 0..sets {
            v.push(GemvSet {
                w: dev.upload(&w)?,
                x: dev.upload(&rng.bf16_vec(k, 1.0))?,
                norm: dev.upload(&rng.bf16_vec(k, 1.0))?,
                bias: dev.upload(&rng.bf16_vec(n, 0.1))?,
                y: dev.upload(&rng.bf16_vec(n, 1.0))?,
            });
        }
        Ok(GemvWorkload {
            kind,
            n,
            k,
            sets: v,
            y_blas: dev.alloc_filled(n, bf16::NAN)?,
            logits: dev.alloc_filled(if kind == GemvKind::LmHead { n } else { 1 }, f32::NAN)?,
            part_val: dev.alloc_filled(if kind == GemvKind::LmHead { n } else { 1 }, f32::NAN)?,
            part_idx: dev.alloc_filled(if kind == GemvKind::LmHead { n } else { 1 }, 0i32)?,
            state: dev.upload(&[0i32, 0])?,
            stamps: dev.alloc_filled(4, -1i64)?,
        })
    }

    /// Buffer sets cycled through.
    pub fn sets(&self) -> usize {
        self.sets.len()
    }

    /// Launches per captured graph: every set at least once, and at least 16.
    pub fn launches(&self) -> usize {
        self.sets().max(16)
    }

    /// Bytes one tilefuse launch must move: the weight, the vectors read (input, norm
    /// weight, bias, residual) and the output written.
    pub fn bytes(&self) -> u64 {
        let (n, k) = (self.n as u64, self.k as u64);
        let vectors = match self.kind {
            // x, norm weight, bias; y.
            GemvKind::RmsNormGemv => 2 * k + n + n,
            // a, bias; x read and written.
            GemvKind::GemvResidual => k + n + 2 * n,
            // x, norm weight; act (n / 2).
            GemvKind::RmsNormGateUp => 2 * k + n / 2,
            // x, norm weight; f32 logits.
            GemvKind::LmHead => 2 * k + 2 * n,
        };
        2 * (n * k + vectors)
    }

    /// Bytes one cuBLAS GEMV of the same shape must move (weight, x, y).
    pub fn cublas_bytes(&self) -> u64 {
        2 * (self.n as u64 * self.k as u64 + self.k as u64 + self.n as u64)
    }

    /// The default configuration from [`tuning`].
    pub fn default_config(&self) -> GemvConfig {
        match self.kind {
            GemvKind::RmsNormGateUp => tuning::gate_up_config(self.n / 2, self.k),
            GemvKind::LmHead => tuning::lm_head_config(self.n, self.k),
            GemvKind::RmsNormGemv => tuning::norm_gemv_config(self.n, self.k),
            _ => tuning::gemv_config(self.n, self.k),
        }
    }

    /// Every compiled configuration of the kernel.
    pub fn variants(&self) -> Vec<GemvConfig> {
        tuning::gemv_variants(self.kind.def())
    }

    /// Queues the kernel on buffer set `i % sets` with configuration `cfg`.
    pub fn launch(&mut self, dev: &Device, i: usize, cfg: GemvConfig) -> Result<()> {
        let (n, k) = (self.n as i32, self.k as i32);
        let consts = cfg.consts_for(self.kind.def());
        let nsets = self.sets.len();
        let set = &mut self.sets[i % nsets];
        let lc = |rows: usize| LaunchConfig::from(cfg.grid(rows)).num_warps(cfg.num_warps);
        match self.kind {
            GemvKind::RmsNormGemv => kernels::RMS_NORM_GEMV.launch_dyn(
                dev,
                lc(self.n),
                &consts,
                &mut [
                    (&set.x).into(),
                    (&set.norm).into(),
                    (&set.w).into(),
                    (&set.bias).into(),
                    (&mut set.y).into(),
                    n.into(),
                    k.into(),
                    EPS.into(),
                    (&mut self.stamps).into(),
                    (-1i32).into(),
                ],
            )?,
            GemvKind::GemvResidual => kernels::GEMV_RESIDUAL.launch_dyn(
                dev,
                lc(self.n),
                &consts,
                &mut [
                    (&set.w).into(),
                    (&set.x).into(),
                    (&set.bias).into(),
                    (&mut set.y).into(),
                    n.into(),
                    k.into(),
                    (&mut self.stamps).into(),
                    (-1i32).into(),
                ],
            )?,
            GemvKind::RmsNormGateUp => kernels::RMS_NORM_GATE_UP.launch_dyn(
                dev,
                lc(self.n / 2),
                &consts,
                &mut [
                    (&set.x).into(),
                    (&set.norm).into(),
                    (&set.w).into(),
                    (&mut set.y).into(),
                    (n / 2).into(),
                    k.into(),
                    EPS.into(),
                    (&mut self.stamps).into(),
                    (-1i32).into(),
                ],
            )?,
            GemvKind::LmHead => {
                let parts = cfg.grid(self.n);
                kernels::LM_HEAD_ARGMAX.launch_dyn(
                    dev,
                    lc(self.n),
                    &cfg.consts_for(&kernels::LM_HEAD_ARGMAX),
                    &mut [
                        (&set.x).into(),
                        (&set.norm).into(),
                        (&set.w).into(),
                        (&mut self.logits).into(),
                        (&mut self.part_val).into(),
                        (&mut self.part_idx).into(),
                        n.into(),
                        k.into(),
                        EPS.into(),
                    ],
                )?;
                let (b, warps) = tuning::argmax_finish_config(parts as usize);
                kernels::ARGMAX_FINISH.launch_dyn(
                    dev,
                    LaunchConfig::from(1).num_warps(warps),
                    &[b as i64],
                    &mut [
                        (&self.part_val).into(),
                        (&self.part_idx).into(),
                        (&mut self.state).into(),
                        (parts as i32).into(),
                    ],
                )?;
            }
        }
        Ok(())
    }

    /// Queues the cuBLAS GEMV of the same weight shape on buffer set `i % sets`.
    pub fn launch_cublas(&mut self, blas: &Cublas, i: usize) -> Result<()> {
        let nsets = self.sets.len();
        let set = &self.sets[i % nsets];
        blas.gemv_bf16(&set.w, &set.x, &mut self.y_blas, self.n, self.k)
    }
}

/// Decode attention (`attention_split`, with its QK-norm, RoPE and append, +
/// `attention_combine` unless the splits merge in a cluster) at one context length, with enough KV-cache sets to exceed 4× L2
/// (within device memory).
pub struct AttentionWorkload {
    /// Cached positions read (the context length).
    pub seq: usize,
    /// Query heads.
    pub num_heads: usize,
    /// KV heads.
    pub num_kv_heads: usize,
    /// Head size.
    pub head_dim: usize,
    sets: Vec<(Buffer<bf16>, Buffer<bf16>, Buffer<bf16>)>,
    norm_w: Buffer<bf16>,
    rope_cos: Buffer<f32>,
    rope_sin: Buffer<f32>,
    q: Buffer<bf16>,
    state: Buffer<i32>,
    part_m: Buffer<f32>,
    part_l: Buffer<f32>,
    part_acc: Buffer<f32>,
    out: Buffer<bf16>,
    /// The timeline argument (never written: `stamp_at` is -1).
    stamps: Buffer<i64>,
}

impl AttentionWorkload {
    /// Allocates the sets: per set a fused `qkv` projection and `[num_kv_heads, seq,
    /// head_dim]` K and V caches of random non-zero values; the position `seq - 1` lives
    /// in a device `state` buffer, as in decode (so each launch appends its key and value
    /// at the last row and reads the `seq - 1` before it).
    pub fn new(
        dev: &Device,
        seq: usize,
        (num_heads, num_kv_heads, head_dim): (usize, usize, usize),
        info: &DeviceInfo,
        seed: u64,
    ) -> Result<AttentionWorkload> {
        let mut rng = Rng::new(seed);
        let cache = num_kv_heads * seq * head_dim;
        let set_bytes = 2 * cache * 2;
        // Keep the sets within half of device memory.
        let fit = (info.total_mem / 2 / set_bytes.max(1)).max(1);
        let sets = rotation_sets(set_bytes, info.l2_bytes).min(fit);
        let k = rng.bf16_vec(cache, 1.0);
        let v = rng.bf16_vec(cache, 1.0);
        let mut s = Vec::with_capacity(sets);
        for _ in 0..sets {
            s.push((
                dev.upload(&rng.bf16_vec((num_heads + 2 * num_kv_heads) * head_dim, 1.0))?,
                dev.upload(&k)?,
                dev.upload(&v)?,
            ));
        }
        let slots = num_heads * tuning::MAX_SPLITS;
        // Any rotation will do for timing: random angles' cosines and sines.
        let angles: Vec<f32> = rng
            .bf16_vec(seq * head_dim / 2, 3.0)
            .iter()
            .map(|a| a.to_f32())
            .collect();
        Ok(AttentionWorkload {
            seq,
            num_heads,
            num_kv_heads,
            head_dim,
            sets: s,
            norm_w: dev.upload(&rng.bf16_vec(head_dim, 1.5))?,
            rope_cos: dev.upload(&angles.iter().map(|a| a.cos()).collect::<Vec<_>>())?,
            rope_sin: dev.upload(&angles.iter().map(|a| a.sin()).collect::<Vec<_>>())?,
            q: dev.alloc_filled(num_heads * head_dim, bf16::NAN)?,
            state: dev.upload(&[0i32, seq as i32 - 1])?,
            part_m: dev.alloc_filled(slots, f32::NAN)?,
            part_l: dev.alloc_filled(slots, f32::NAN)?,
            part_acc: dev.alloc_filled(slots * head_dim, f32::NAN)?,
            out: dev.alloc_filled(num_heads * head_dim, bf16::NAN)?,
            stamps: dev.alloc_filled(4, -1i64)?,
        })
    }

    /// KV-cache sets cycled through.
    pub fn sets(&self) -> usize {
        self.sets.len()
    }

    /// Launch pairs per captured graph: every set at least once, and at least 16.
    pub fn launches(&self) -> usize {
        self.sets().max(16)
    }

    /// KV bytes read per step: `2 × num_kv_heads × seq × head_dim × 2`.
    pub fn bytes(&self) -> u64 {
        (2 * self.num_kv_heads * self.seq * self.head_dim * 2) as u64
    }

    /// The padded query-group size `G` the split kernel is launched with.
    pub fn padded_group(&self) -> usize {
        (self.num_heads / self.num_kv_heads.max(1))
            .next_power_of_two()
            .clamp(1, 4)
    }

    /// Queues split + combine (or the clustered split alone) on set `i % sets`.
    pub fn launch(&mut self, dev: &Device, i: usize, cfg: AttentionConfig) -> Result<()> {
        let nsets = self.sets.len();
        let padded = self.padded_group();
        let (qkv, k, v) = &mut self.sets[i % nsets];
        let d = self.head_dim as i64;
        let dc = (cfg.dc as i64).min(d);
        let group = (self.num_heads / self.num_kv_heads) as i32;
        let scale = (self.head_dim as f32).powf(-0.5);
        kernels::ATTENTION_SPLIT.launch_dyn(
            dev,
            LaunchConfig::from((
                self.num_kv_heads as u32,
                cfg.splits as u32,
                (group as usize).div_ceil(padded) as u32,
            ))
            .num_warps(cfg.num_warps),
            &[
                d,
                padded as i64,
                cfg.bs as i64,
                cfg.stages as i64,
                cfg.cluster as i64,
            ],
            &mut [
                (&*qkv).into(),
                (&self.norm_w).into(),
                (&self.norm_w).into(),
                (&self.rope_cos).into(),
                (&self.rope_sin).into(),
                (&self.state).into(),
                k.into(),
                v.into(),
                (&mut self.q).into(),
                (&mut self.part_m).into(),
                (&mut self.part_l).into(),
                (&mut self.part_acc).into(),
                (&mut self.out).into(),
                group.into(),
                (self.seq as i32).into(),
                (cfg.min_chunk as i32).into(),
                1i32.into(),
                1e-6f32.into(),
                scale.into(),
                (&self.norm_w).into(),
                0i32.into(),
                (&mut self.stamps).into(),
                (-1i32).into(),
            ],
        )?;
        if cfg.cluster > 1 {
            return Ok(());
        }
        kernels::ATTENTION_COMBINE.launch_dyn(
            dev,
            (self.num_heads as u32, (d / dc) as u32),
            &[d, cfg.s as i64, dc],
            &mut [
                (&self.part_m).into(),
                (&self.part_l).into(),
                (&self.part_acc).into(),
                (&mut self.out).into(),
                (cfg.splits as i32).into(),
                (&mut self.stamps).into(),
                (-1i32).into(),
            ],
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_median_and_percentiles() {
        let s = Stats::from_samples(&[5.0, 1.0, 3.0, 2.0, 4.0]);
        assert_eq!(s.median_us, 3.0);
        assert_eq!(s.min_us, 1.0);
        assert_eq!(s.max_us, 5.0);
        assert!((s.p10_us - 1.4).abs() < 1e-12);
        assert_eq!(s.samples, 5);
        // 1 GB in 1000 µs is 1000 GB/s.
        let t = Stats::from_samples(&[1000.0]);
        assert!((t.gb_per_s(1_000_000_000) - 1000.0).abs() < 1e-9);
        assert!(Stats::from_samples(&[]).median_us.is_nan());
    }

    #[test]
    fn rotation_exceeds_four_l2() {
        let l2 = 50 << 20;
        for set in [1usize << 20, 8 << 20, 311 << 20] {
            let n = rotation_sets(set, l2);
            assert!(n * set > 4 * l2 && n >= 2, "{set}: {n}");
        }
    }

    #[test]
    fn rng_values_are_nonzero_and_seeded() {
        let a = Rng::new(7).bf16_vec(1000, 0.5);
        assert_eq!(a, Rng::new(7).bf16_vec(1000, 0.5));
        assert!(a
            .iter()
            .all(|v| *v != bf16::ZERO && v.to_f32().abs() <= 0.5));
        assert_ne!(a, Rng::new(8).bf16_vec(1000, 0.5));
    }

    #[test]
    fn cpu_device_is_an_error_not_a_panic() {
        let d = Device::cpu();
        assert!(device_info(&d).is_err());
        assert!(copy_ceiling(&d, 1 << 20, TimingOptions::default()).is_err());
        assert!(Cublas::new(&d).is_err());
        assert!(time_events(&d, 1, TimingOptions::default(), |_| Ok(())).is_err());
    }
}
