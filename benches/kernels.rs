//! Criterion benchmarks of the decode kernels at Qwen3-0.6B shapes: each GEMV against
//! cuBLAS (bf16, n = 1) and split-K attention at three contexts.
//!
//! `cargo bench --bench kernels`. One criterion iteration is one launch: the timing is
//! CUDA events around replays of a captured graph of launches that cycle through buffer
//! sets larger than 4× L2 (see `tilefuse_engine::bench::workloads`), so neither the host's launch
//! cost nor the L2 cache shows. Without a GPU it prints that it was skipped and exits 0.

use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput};
use tilefuse::dsl::runtime::{DeviceInfo, Graph};
use tilefuse::engine::bench::{AttentionWorkload, Cublas, GemvKind, GemvWorkload, PerfError};
use tilefuse::engine::tuning;
use tilefuse::prelude::*;

const GEMVS: [(GemvKind, usize, usize, &str); 5] = [
    (GemvKind::RmsNormGemv, 4096, 1024, "qkv"),
    (GemvKind::GemvResidual, 1024, 2048, "o"),
    (GemvKind::RmsNormGateUp, 6144, 1024, "gate_up"),
    (GemvKind::GemvResidual, 1024, 3072, "down"),
    (GemvKind::LmHead, 151_936, 1024, "lm_head"),
];

/// A graph of `launches` calls of `f` (called with `0..launches`), captured after the
/// queued work finished.
fn capture(
    dev: &Device,
    launches: usize,
    mut f: impl FnMut(usize) -> Result<(), PerfError>,
) -> Result<(Graph, usize), PerfError> {
    dev.synchronize()?;
    let graph = dev.capture(|| (0..launches).try_for_each(&mut f))?;
    Ok((graph, launches))
}

/// Criterion iterations in units of one launch: replays of a graph of `per_replay`
/// launches, rounded up.
fn time_launches((graph, per): &(Graph, usize), iters: u64) -> Duration {
    let per = *per as u64;
    let replays = iters.div_ceil(per).max(1);
    let total = graph
        .time_replays(replays)
        .unwrap_or_else(|e| panic!("timing failed: {e}"));
    total.mul_f64(iters as f64 / (replays * per) as f64)
}

fn gemv_benches(c: &mut Criterion, dev: &Device, info: &DeviceInfo, blas: Option<&Cublas>) {
    for (i, &(kind, n, k, what)) in GEMVS.iter().enumerate() {
        let mut w = GemvWorkload::new(dev, kind, n, k, info.l2_bytes, 1000 + i as u64)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let cfg = w.default_config();
        let launches = w.launches();
        let mut group = c.benchmark_group(format!("gemv/{what}_{n}x{k}"));
        group.throughput(Throughput::Bytes(w.bytes()));
        w.launch(dev, 0, cfg).unwrap();
        let graph = capture(dev, launches, |j| w.launch(dev, j, cfg))
            .unwrap_or_else(|e| panic!("{what}: capture: {e}"));
        group.bench_function(BenchmarkId::new("tilefuse", kind.name()), |b| {
            b.iter_custom(|iters| time_launches(&graph, iters))
        });
        drop(graph);
        if let Some(blas) = blas {
            group.throughput(Throughput::Bytes(w.cublas_bytes()));
            w.launch_cublas(blas, 0).unwrap();
            match capture(dev, launches, |j| w.launch_cublas(blas, j)) {
                Ok(graph) => {
                    group.bench_function(BenchmarkId::new("cublas", "gemm_ex_n1"), |b| {
                        b.iter_custom(|iters| time_launches(&graph, iters))
                    });
                }
                Err(e) => println!("gemv/{what}: cuBLAS graph capture failed: {e}"),
            }
        }
        group.finish();
    }
}

fn attention_benches(c: &mut Criterion, dev: &Device, info: &DeviceInfo) {
    for (i, ctx) in [512usize, 4096, 32768].into_iter().enumerate() {
        let mut w = AttentionWorkload::new(dev, ctx, (16, 8, 128), info, 2000 + i as u64)
            .unwrap_or_else(|e| panic!("attention ctx {ctx}: {e}"));
        let cfg = tuning::attention_config(ctx);
        let launches = w.launches();
        let mut group = c.benchmark_group(format!("attention/ctx{ctx}"));
        group.throughput(Throughput::Bytes(w.bytes()));
        w.launch(dev, 0, cfg).unwrap();
        let graph = capture(dev, launches, |j| w.launch(dev, j, cfg))
            .unwrap_or_else(|e| panic!("attention ctx {ctx}: capture: {e}"));
        group.bench_function(
            BenchmarkId::new("tilefuse", format!("bs{}_splits{}", cfg.bs, cfg.splits)),
            |b| b.iter_custom(|iters| time_launches(&graph, iters)),
        );
        group.finish();
    }
}

fn main() {
    let dev = Device::auto();
    if !dev.is_cuda() {
        println!("kernels bench: skipped: no CUDA device");
        return;
    }
    let info = dev.info().unwrap_or_else(|e| panic!("device info: {e}"));
    let blas = match Cublas::new(&dev) {
        Ok(b) => Some(b),
        Err(e) => {
            println!("cuBLAS unavailable ({e}); only tilefuse is measured");
            None
        }
    };
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(20)
        .configure_from_args();
    gemv_benches(&mut c, &dev, &info, blas.as_ref());
    attention_benches(&mut c, &dev, &info);
    c.final_summary();
}
