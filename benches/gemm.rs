//! Criterion benchmarks of the compute-bound kernels written in the language: the GEMM
//! (`tilefuse::kernels::matmul`) against cuBLAS, and causal flash attention
//! (`tilefuse::kernels::flash_attention`), in FLOP/s.
//!
//! `cargo bench --bench gemm` (a substring filters: `cargo bench --bench gemm -- lm_head`).
//!
//! - GEMM: `C[M, N] = A[M, K] B[K, N]`, bf16 operands, both row-major (B is `[K, N]`,
//!   the layout of Triton's tutorial), f32 accumulation, bf16 output; cuBLAS is
//!   `cublasGemmEx` with `CUBLAS_COMPUTE_32F` on the same buffers. Shapes: 4096³,
//!   8192³ and Qwen3-0.6B's prefill projections at M = 512 and 2048 tokens.
//! - Attention: 16 query heads over 8 KV heads, head_dim 128, bf16, at 1k, 4k and 16k
//!   tokens; FLOPs = 2 × 2 × S² × D × HQ / 2 (causal).
//!
//! Method (docs/perf.md, "GEMM and attention"): seeded random non-zero inputs; each
//! result is checked (tilefuse against cuBLAS, attention rows against the host f64
//! reference) before it is timed; one criterion iteration is one launch, timed with CUDA
//! events around replays of a captured graph whose launches cycle through input sets
//! larger than 4× L2 (plain launches between events if capture fails). After the
//! criterion run a table prints the median TFLOP/s of each and the percentage of cuBLAS.
//! Without a GPU it prints that it was skipped and exits 0.

use std::time::Duration;

use criterion::{BenchmarkId, Criterion, SamplingMode, Throughput};
use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use tilefuse::dsl::runtime::timing::{self as perf_timing, TimingOptions};
use tilefuse::dsl::runtime::{DeviceInfo, Graph};
use tilefuse::engine::bench::workloads::{replicate, rotation_sets, Result};
use tilefuse::engine::bench::{Cublas, PerfError, Rng};
use tilefuse::kernels::flash_attention::{self, AttentionShape, FlashConfig, HEAD_DIM};
use tilefuse::prelude::*;

/// A GEMM launcher: `(dev, a, b, c, m, n, k)` queues `c = a b` for row-major bf16
/// `a: [m, k]`, `b: [k, n]`, `c: [m, n]`.
type MatmulFn = fn(
    &Device,
    &Buffer<bf16>,
    &Buffer<bf16>,
    &mut Buffer<bf16>,
    usize,
    usize,
    usize,
) -> std::result::Result<(), String>;

/// The language's GEMM under test (`None` would time cuBLAS alone): Triton's tutorial
/// matmul with the plan `MatmulPlan::for_device` picks (split-K for small outputs, on a
/// workspace kept per shape).
fn language_matmul() -> Option<MatmulFn> {
    Some(|dev, a, b, c, m, n, k| {
        use std::cell::RefCell;
        use std::collections::HashMap;
        use tilefuse::kernels::matmul::{self, MatmulPlan, SplitWorkspace};
        thread_local! {
            static WORKSPACES: RefCell<HashMap<(usize, usize, usize), SplitWorkspace>> =
                RefCell::new(HashMap::new());
            static INFO: RefCell<Option<tilefuse::dsl::runtime::DeviceInfo>> =
                const { RefCell::new(None) };
        }
        let plan = INFO.with(|s| {
            if s.borrow().is_none() {
                *s.borrow_mut() = Some(dev.info().map_err(|e| e.to_string())?);
            }
            let info = s.borrow();
            let info = info.as_ref().ok_or_else(|| "no device info".to_string())?;
            Ok::<MatmulPlan, String>(MatmulPlan::for_device(info, m, n, k))
        })?;
        if plan.splits <= 1 {
            return matmul::launch_plan(dev, a, b, c, m, n, k, plan, None)
                .map_err(|e| e.to_string());
        }
        WORKSPACES.with(|w| {
            let mut w = w.borrow_mut();
            let ws = match w.entry((m, n, k)) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(SplitWorkspace::new(dev, plan, m, n).map_err(|e| e.to_string())?)
                }
            };
            matmul::launch_plan(dev, a, b, c, m, n, k, plan, Some(ws)).map_err(|e| e.to_string())
        })
    })
}

/// `(name, M, N, K)`, in the order of the table.
fn gemm_shapes() -> Vec<(&'static str, usize, usize, usize)> {
    let mut v = vec![("square", 4096, 4096, 4096), ("square", 8192, 8192, 8192)];
    for m in [512, 2048] {
        for (name, n, k) in [
            ("qkv", 4096, 1024),
            ("o", 1024, 2048),
            ("gate_up", 6144, 1024),
            ("down", 1024, 3072),
            ("lm_head", 151_936, 1024),
        ] {
            v.push((name, m, n, k));
        }
    }
    v
}

/// `c = a b` (row-major) with cuBLAS: column-major, that is `cᵀ = bᵀ aᵀ`, so `b` is
/// the first operand and nothing is transposed.
fn cublas_gemm(
    blas: &CudaBlas,
    a: &Buffer<bf16>,
    b: &Buffer<bf16>,
    c: &mut Buffer<bf16>,
    (m, n, k): (usize, usize, usize),
) -> Result<()> {
    let (Some(a), Some(b)) = (a.cuda_slice(), b.cuda_slice()) else {
        return Err(PerfError("cuBLAS needs CUDA buffers".into()));
    };
    let c = c
        .cuda_slice_mut()
        .ok_or_else(|| PerfError("cuBLAS needs CUDA buffers".into()))?;
    let cfg = GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_N,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: n as i32,
        n: m as i32,
        k: k as i32,
        alpha: bf16::ONE,
        lda: n as i32,
        ldb: k as i32,
        beta: bf16::ZERO,
        ldc: n as i32,
    };
    // SAFETY: the buffers were allocated for these sizes (GemmWorkload::new).
    unsafe { blas.gemm(cfg, b, a, c) }.map_err(|e| PerfError(format!("cuBLAS: {e:?}")))
}

/// A timed sequence of launches: a captured graph, or plain launches between events
/// when capture failed.
enum Timed<'a> {
    Graph(Graph, usize),
    Plain(
        Box<dyn FnMut(usize) -> std::result::Result<(), PerfError> + 'a>,
        usize,
    ),
}

impl<'a> Timed<'a> {
    /// Captures `launches` calls of `f` (run once uncaptured first), or keeps `f` for
    /// plain launches if capture fails.
    fn new(
        dev: &Device,
        launches: usize,
        mut f: impl FnMut(usize) -> std::result::Result<(), PerfError> + 'a,
    ) -> Result<Timed<'a>> {
        f(0)?;
        dev.synchronize()?;
        match dev.capture(|| (0..launches).try_for_each(&mut f)) {
            Ok(g) => Ok(Timed::Graph(g, launches)),
            Err(e) => {
                println!("graph capture failed ({e}); timing plain launches");
                Ok(Timed::Plain(Box::new(f), launches))
            }
        }
    }

    /// Criterion's `iter_custom`: `iters` launches, rounded up to whole replays.
    fn time(&mut self, dev: &Device, iters: u64) -> Duration {
        let r = match self {
            Timed::Graph(g, per) => {
                let per = *per as u64;
                let replays = iters.div_ceil(per).max(1);
                g.time_replays(replays)
                    .map(|t| t.mul_f64(iters as f64 / (replays * per) as f64))
                    .map_err(PerfError::from)
            }
            Timed::Plain(f, launches) => {
                let opts = TimingOptions { warmup: 0, reps: 1 };
                let n = iters as usize;
                perf_timing::time_events(dev, n, opts, |i| f(i % *launches))
                    .map(|s| Duration::from_secs_f64(s.median_us * 1e-6 * iters as f64))
            }
        };
        r.unwrap_or_else(|e| panic!("timing failed: {e}"))
    }

    /// Median microseconds per launch over repeated replays.
    fn median_us(&mut self, dev: &Device) -> Result<f64> {
        let opts = TimingOptions {
            warmup: 2,
            reps: 10,
        };
        match self {
            Timed::Graph(g, per) => Ok(g.time(*per, opts)?.median_us),
            Timed::Plain(f, launches) => {
                let n = *launches;
                Ok(perf_timing::time_events(dev, n, opts, f)?.median_us)
            }
        }
    }
}

/// One GEMM shape: input sets to cycle through past L2, and one output per
/// implementation.
struct GemmWorkload {
    m: usize,
    n: usize,
    k: usize,
    sets: Vec<(Buffer<bf16>, Buffer<bf16>)>,
    c_lang: Buffer<bf16>,
    c_blas: Buffer<bf16>,
    /// The inputs on the host, for the reference.
    a: Vec<bf16>,
    b: Vec<bf16>,
}

impl GemmWorkload {
    fn new(dev: &Device, info: &DeviceInfo, (m, n, k): (usize, usize, usize)) -> Result<Self> {
        let mut rng = Rng::new((m * 31 + n * 7 + k) as u64);
        // Scaled so that C's entries are O(1): |a| < 1/sqrt(k), |b| < 1.
        let a = rng.bf16_vec(m * k, 1.0 / (k as f32).sqrt());
        let b = rng.bf16_vec(k * n, 1.0);
        let set_bytes = 2 * (m * k + k * n);
        let fit = (info.total_mem / 2 / set_bytes).max(1);
        let sets = rotation_sets(set_bytes, info.l2_bytes).min(fit);
        let a_sets = replicate(dev, &a, sets)?;
        let b_sets = replicate(dev, &b, sets)?;
        Ok(GemmWorkload {
            m,
            n,
            k,
            sets: a_sets.into_iter().zip(b_sets).collect(),
            c_lang: dev.alloc_filled(m * n, bf16::NAN)?,
            c_blas: dev.alloc_filled(m * n, bf16::NAN)?,
            a,
            b,
        })
    }

    /// Largest difference between `c` (downloaded) and the host f64 product at 256
    /// sampled entries (corners included), over the largest sampled |entry|; NaN is
    /// infinite.
    fn sampled_error(&self, c: &Buffer<bf16>) -> Result<f64> {
        let c = c.to_vec()?;
        let (m, n, k) = (self.m, self.n, self.k);
        let mut rng = Rng::new(3);
        let mut at = vec![(0, 0), (m - 1, n - 1), (0, n - 1), (m - 1, 0)];
        at.extend((0..252).map(|_| (rng.next_u64() as usize % m, rng.next_u64() as usize % n)));
        let (mut diff, mut scale) = (0.0f64, 0.0f64);
        for (i, j) in at {
            let want: f64 = (0..k)
                .map(|l| self.a[i * k + l].to_f64() * self.b[l * n + j].to_f64())
                .sum();
            let d = (c[i * n + j].to_f64() - want).abs();
            diff = if d.is_nan() {
                f64::INFINITY
            } else {
                diff.max(d)
            };
            scale = scale.max(want.abs());
        }
        Ok(diff / scale.max(1e-30))
    }

    fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64
    }

    /// Launches per captured graph: every set; at least 16 when one launch is short
    /// (under about 100 µs at cuBLAS speed), so replays keep the GPU busy.
    fn launches(&self) -> usize {
        let short = self.flops() < 5e10;
        self.sets.len().max(if short { 16 } else { 2 })
    }
}

/// One row of the summary table.
struct Row {
    what: String,
    flops: f64,
    tilefuse_us: Option<f64>,
    cublas_us: Option<f64>,
    note: String,
}

fn tflops(flops: f64, us: f64) -> f64 {
    flops / (us * 1e-6) / 1e12
}

fn criterion_time(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    id: BenchmarkId,
    dev: &Device,
    timed: &mut Timed<'_>,
) -> bool {
    let mut ran = false;
    group.bench_function(id, |b| {
        ran = true;
        b.iter_custom(|iters| timed.time(dev, iters))
    });
    ran
}

/// Tolerance of [`GemmWorkload::sampled_error`]: bf16 output rounding (2^-9) with room
/// for the f32 accumulation order.
const GEMM_TOLERANCE: f64 = 1e-2;

fn gemm_benches(
    c: &mut Criterion,
    dev: &Device,
    info: &DeviceInfo,
    blas: Option<&CudaBlas>,
    rows: &mut Vec<Row>,
) {
    let lang = language_matmul();
    for (name, m, n, k) in gemm_shapes() {
        let what = format!("{name} {m}x{n}x{k}");
        let mut w =
            GemmWorkload::new(dev, info, (m, n, k)).unwrap_or_else(|e| panic!("gemm {what}: {e}"));
        let launches = w.launches();
        let mut group = c.benchmark_group(format!("gemm/{name}_{m}x{n}x{k}"));
        group.sampling_mode(SamplingMode::Flat);
        group.throughput(Throughput::Elements(w.flops() as u64));
        let mut row = Row {
            what,
            flops: w.flops(),
            tilefuse_us: None,
            cublas_us: None,
            note: String::new(),
        };
        let mut ran = false;
        if let Some(blas) = blas {
            let GemmWorkload { sets, c_blas, .. } = &mut w;
            // `Timed::new` runs set 0 once before capturing: that result is checked.
            let mut timed = Timed::new(dev, launches, |i| {
                let (a, b) = &sets[i % sets.len()];
                cublas_gemm(blas, a, b, c_blas, (m, n, k))
            })
            .unwrap_or_else(|e| panic!("gemm {}: cuBLAS: {e}", row.what));
            ran |= criterion_time(
                &mut group,
                BenchmarkId::new("cublas", "gemm_ex"),
                dev,
                &mut timed,
            );
            if ran {
                row.cublas_us = timed.median_us(dev).ok();
            }
            drop(timed);
            let err = w.sampled_error(&w.c_blas).unwrap_or(f64::INFINITY);
            if err >= GEMM_TOLERANCE {
                row.cublas_us = None;
                row.note = format!("cuBLAS differs from the host reference ({err:.2e}) ");
            }
        }
        match lang {
            None => row.note += "tilefuse::kernels::matmul not wired into this bench",
            Some(matmul) => {
                let err = {
                    let (a, b) = &w.sets[0];
                    match matmul(dev, a, b, &mut w.c_lang, m, n, k) {
                        Ok(()) => w.sampled_error(&w.c_lang).unwrap_or(f64::INFINITY),
                        Err(e) => {
                            row.note += &format!("tilefuse launch failed: {e}");
                            f64::NAN
                        }
                    }
                };
                if err < GEMM_TOLERANCE {
                    let GemmWorkload { sets, c_lang, .. } = &mut w;
                    let mut timed = Timed::new(dev, launches, |i| {
                        let (a, b) = &sets[i % sets.len()];
                        matmul(dev, a, b, c_lang, m, n, k).map_err(PerfError)
                    })
                    .unwrap_or_else(|e| panic!("gemm {}: tilefuse: {e}", row.what));
                    let id = BenchmarkId::new("tilefuse", "matmul");
                    if criterion_time(&mut group, id, dev, &mut timed) {
                        ran = true;
                        row.tilefuse_us = timed.median_us(dev).ok();
                    }
                } else if !err.is_nan() {
                    row.note +=
                        &format!("tilefuse differs from the host reference ({err:.2e}): not timed");
                }
            }
        }
        group.finish();
        // Rows the filter left out stay out of the table.
        if ran {
            rows.push(row);
        }
    }
}

/// Attention inputs at one length: `(q, k, v)` sets cycled through past L2.
struct AttentionWorkload {
    shape: AttentionShape,
    sets: Vec<(Buffer<bf16>, Buffer<bf16>, Buffer<bf16>)>,
    out: Buffer<bf16>,
    host: (Vec<bf16>, Vec<bf16>, Vec<bf16>),
}

impl AttentionWorkload {
    fn new(dev: &Device, info: &DeviceInfo, shape: AttentionShape) -> Result<Self> {
        let mut rng = Rng::new(shape.seq as u64);
        let q = rng.bf16_vec(shape.q_len(), 3.0);
        let k = rng.bf16_vec(shape.kv_len(), 1.0);
        let v = rng.bf16_vec(shape.kv_len(), 1.0);
        let sets = rotation_sets(2 * (q.len() + 2 * k.len()), info.l2_bytes);
        let mut s = Vec::with_capacity(sets);
        for _ in 0..sets {
            s.push((dev.upload(&q)?, dev.upload(&k)?, dev.upload(&v)?));
        }
        Ok(AttentionWorkload {
            shape,
            sets: s,
            out: dev.alloc_filled(shape.q_len(), bf16::NAN)?,
            host: (q, k, v),
        })
    }

    /// Largest difference from the host reference over a sample of rows (first, last,
    /// tile edges, random), every head.
    fn check(&mut self, dev: &Device, cfg: FlashConfig) -> Result<f64> {
        let (q, k, v) = &self.sets[0];
        flash_attention::launch(dev, q, k, v, &mut self.out, self.shape, cfg)?;
        let got = self.out.to_vec()?;
        let s = self.shape.seq;
        let mut rng = Rng::new(99);
        let mut ts = vec![0, 63, 64, s / 2, s - 1];
        ts.extend((0..4).map(|_| rng.next_u64() as usize % s));
        let (hq, d) = (self.shape.num_heads, self.shape.head_dim);
        let mut worst = 0.0f64;
        for t in ts {
            for h in 0..hq {
                let (qh, kh, vh) = &self.host;
                let want = flash_attention::reference_row(qh, kh, vh, self.shape, t, h);
                for (g, w) in got[(t * hq + h) * d..][..d].iter().zip(&want) {
                    let e = (g.to_f64() - w).abs();
                    worst = if e.is_nan() {
                        f64::INFINITY
                    } else {
                        worst.max(e)
                    };
                }
            }
        }
        Ok(worst)
    }
}

fn attention_benches(c: &mut Criterion, dev: &Device, info: &DeviceInfo, rows: &mut Vec<Row>) {
    for seq in [1024usize, 4096, 16384] {
        let shape = AttentionShape {
            seq,
            num_heads: 16,
            num_kv_heads: 8,
            head_dim: HEAD_DIM,
        };
        let mut group = c.benchmark_group(format!("attention/seq{seq}"));
        group.sampling_mode(SamplingMode::Flat);
        group.throughput(Throughput::Elements(shape.causal_flops() as u64));
        let mut w = AttentionWorkload::new(dev, info, shape)
            .unwrap_or_else(|e| panic!("attention {seq}: {e}"));
        // The GPU candidates (the last configuration is for short sequences).
        for &cfg in &FlashConfig::ALL[..FlashConfig::ALL.len() - 1] {
            let tiles = format!("bm{}_bn{}_w{}", cfg.block_m, cfg.block_n, cfg.num_warps);
            let mut row = Row {
                what: format!("attention {seq} (16q/8kv, d128)"),
                flops: shape.causal_flops(),
                tilefuse_us: None,
                cublas_us: None,
                note: tiles.clone(),
            };
            let err = w
                .check(dev, cfg)
                .unwrap_or_else(|e| panic!("{} {tiles}: {e}", row.what));
            if err < 1e-2 {
                let AttentionWorkload { sets, out, .. } = &mut w;
                let launches = sets.len().max(2);
                let mut timed = Timed::new(dev, launches, |i| {
                    let (q, k, v) = &sets[i % sets.len()];
                    Ok(flash_attention::launch(dev, q, k, v, out, shape, cfg)?)
                })
                .unwrap_or_else(|e| panic!("{} {tiles}: {e}", row.what));
                let id = BenchmarkId::new("tilefuse", &tiles);
                if criterion_time(&mut group, id, dev, &mut timed) {
                    row.tilefuse_us = timed.median_us(dev).ok();
                    rows.push(row);
                }
            } else {
                row.note += &format!(": differs from the host reference by {err:.2e}, not timed");
                rows.push(row);
            }
        }
        group.finish();
    }
}

fn print_table(info: &DeviceInfo, rows: &[Row]) {
    println!("\n{} (median of 10 graph replays per column)", info.name);
    println!("| shape | tilefuse TFLOP/s | cuBLAS TFLOP/s | % of cuBLAS | note |");
    println!("|---|---|---|---|---|");
    let fmt = |us: Option<f64>, flops: f64| {
        us.map_or("-".to_string(), |us| format!("{:.1}", tflops(flops, us)))
    };
    for r in rows {
        let pct = match (r.tilefuse_us, r.cublas_us) {
            (Some(t), Some(c)) => format!("{:.1}%", 100.0 * c / t),
            _ => "-".into(),
        };
        println!(
            "| {} | {} | {} | {pct} | {} |",
            r.what,
            fmt(r.tilefuse_us, r.flops),
            fmt(r.cublas_us, r.flops),
            r.note
        );
    }
}

fn main() {
    let dev = Device::auto();
    if !dev.is_cuda() {
        println!("gemm bench: skipped: no CUDA device");
        return;
    }
    let info = dev.info().unwrap_or_else(|e| panic!("device info: {e}"));
    // `Cublas::new` loads the library without panicking; then a handle of our own
    // on the same stream does the GEMMs.
    let blas = match Cublas::new(&dev) {
        Ok(_) => {
            let stream = dev.as_cuda().expect("checked above").stream().clone();
            match CudaBlas::new(stream) {
                Ok(b) => Some(b),
                Err(e) => {
                    println!("cuBLAS handle failed ({e:?}); only tilefuse is measured");
                    None
                }
            }
        }
        Err(e) => {
            println!("cuBLAS unavailable ({e}); only tilefuse is measured");
            None
        }
    };
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(10)
        .configure_from_args();
    let mut rows = Vec::new();
    gemm_benches(&mut c, &dev, &info, blas.as_ref(), &mut rows);
    attention_benches(&mut c, &dev, &info, &mut rows);
    c.final_summary();
    print_table(&info, &rows);
}
