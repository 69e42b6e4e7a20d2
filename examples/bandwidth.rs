//! Decode kernels against the device's copy ceiling and cuBLAS, at Qwen3-0.6B shapes.
//!
//! `cargo run --release --example bandwidth [-- --sweep]`
//!
//! Prints one table: per kernel and shape, the best compiled variant's time, GB/s, share
//! of the measured device-to-device copy ceiling, and cuBLAS's time for the same GEMV
//! (bf16 in/out, f32 compute, n = 1). `--sweep` adds every variant's time, to pick the
//! defaults in `engine/src/tuning.rs` from. Without a GPU it says so and exits 0.
//!
//! Method (docs/perf.md): CUDA events around CUDA-graph replays of ≥ 16 launches that
//! cycle through buffer sets larger than 4× L2 together; median of 30 after 5 warm-ups.

use std::collections::BTreeMap;

use tilefuse::dsl::runtime::timing::{self, CopyCeiling, Method, Stats, TimingOptions};
use tilefuse::dsl::runtime::DeviceInfo;
use tilefuse::engine::bench::{AttentionWorkload, Cublas, GemvKind, GemvWorkload, PerfError};
use tilefuse::engine::tuning::{self, AttentionConfig, GemvConfig};
use tilefuse::prelude::*;

/// Qwen3-0.6B decode GEMVs: (kernel, weight rows, columns, what).
const GEMVS: [(GemvKind, usize, usize, &str); 5] = [
    (GemvKind::RmsNormGemv, 4096, 1024, "QKV"),
    (GemvKind::GemvResidual, 1024, 2048, "O"),
    (GemvKind::RmsNormGateUp, 6144, 1024, "gate+up"),
    (GemvKind::GemvResidual, 1024, 3072, "down"),
    (GemvKind::LmHead, 151_936, 1024, "LM head"),
];

/// Qwen3-0.6B attention: (query heads, KV heads, head size).
const ATTN: (usize, usize, usize) = (16, 8, 128);
const CONTEXTS: [usize; 3] = [512, 4096, 32768];

struct Row {
    kernel: String,
    shape: String,
    config: String,
    stats: Stats,
    bytes: u64,
    method: Method,
    default_us: f64,
    cublas: Option<(Stats, u64)>,
}

fn main() {
    let sweep = std::env::args().any(|a| a == "--sweep");
    let dev = Device::auto();
    if !dev.is_cuda() {
        println!("bandwidth: skipped: no CUDA device");
        return;
    }
    if let Err(e) = run(&dev, sweep) {
        eprintln!("bandwidth: error: {e}");
        std::process::exit(1);
    }
}

fn run(dev: &Device, sweep: bool) -> Result<(), PerfError> {
    let info = dev.info()?;
    let opts = TimingOptions {
        warmup: 5,
        reps: 30,
    };
    let ceiling = timing::copy_ceiling(dev, 1 << 30, opts)?;
    let blas = match Cublas::new(dev) {
        Ok(b) => Some(b),
        Err(e) => {
            println!(
                "cuBLAS unavailable ({e}); put a directory with libcublas.so on LD_LIBRARY_PATH"
            );
            None
        }
    };
    let mut rows = Vec::new();
    let mut sweeps: Vec<String> = Vec::new();

    for (i, &(kind, n, k, what)) in GEMVS.iter().enumerate() {
        let mut w = GemvWorkload::new(dev, kind, n, k, info.l2_bytes, 1000 + i as u64)?;
        let launches = w.launches();
        let default = w.default_config();
        let mut results: BTreeMap<GemvConfig, (Stats, Method)> = BTreeMap::new();
        let mut cfgs = w.variants();
        cfgs.push(default);
        if kind == GemvKind::LmHead {
            // Fixed grids of a few programs a SM, each streaming consecutive row blocks.
            let single: Vec<GemvConfig> = cfgs.iter().copied().filter(|c| c.stages == 1).collect();
            for c in single {
                for per_sm in [2, 4, 8] {
                    cfgs.push(GemvConfig {
                        programs: per_sm * info.sm_count,
                        ..c
                    });
                }
            }
        }
        for cfg in cfgs {
            if results.contains_key(&cfg) {
                continue;
            }
            let r = timing::time_graph(dev, launches, opts, |j| w.launch(dev, j, cfg))?;
            results.insert(cfg, r);
        }
        let (best, (stats, method)) = results
            .iter()
            .min_by(|a, b| a.1 .0.median_us.total_cmp(&b.1 .0.median_us))
            .map(|(c, r)| (*c, *r))
            .expect("at least one variant");
        let cublas = match &blas {
            Some(b) => Some((
                timing::time_graph(dev, launches, opts, |j| w.launch_cublas(b, j))?.0,
                w.cublas_bytes(),
            )),
            None => None,
        };
        let shape = format!("{n}x{k} ({what})");
        if sweep {
            sweeps.push(format!(
                "{} {shape}, {} buffer sets:",
                kind.name(),
                w.sets()
            ));
            for (c, (s, _)) in &results {
                sweeps.push(format!(
                    "  BLOCK_N={:<2} BLOCK_K={:<4} STAGES={} STREAM={} REDUCE_EACH={} programs={:<5} warps={}  {:>9.2} us  {:>7.1} GB/s{}",
                    c.block_n,
                    c.block_k,
                    c.stages,
                    c.stream,
                    c.reduce_each,
                    c.programs,
                    c.num_warps,
                    s.median_us,
                    s.gb_per_s(w.bytes()),
                    if *c == default { "  (default)" } else { "" }
                ));
            }
        }
        rows.push(Row {
            kernel: kind.name().into(),
            shape,
            config: format!(
                "N{} K{} s{}{}{} w{}{}",
                best.block_n,
                best.block_k,
                best.stages,
                if best.stream == 1 { "+" } else { "" },
                if best.reduce_each == 1 { " r" } else { "" },
                best.num_warps,
                if best.programs > 0 {
                    format!(" p{}", best.programs)
                } else {
                    String::new()
                }
            ),
            stats,
            bytes: w.bytes(),
            method,
            default_us: results[&default].0.median_us,
            cublas,
        });
    }

    for (i, &ctx) in CONTEXTS.iter().enumerate() {
        let mut w = AttentionWorkload::new(dev, ctx, ATTN, &info, 2000 + i as u64)?;
        let launches = w.launches();
        let default = tuning::attention_config(ctx);
        let mut cfgs = vec![default];
        for (bs, num_warps) in [(32, 4), (64, 4)] {
            let useful = ctx.div_ceil(bs);
            let fill = tuning::attention_splits(ctx, bs);
            for splits in [fill, 8, 16, 32, 64] {
                for stages in [1, 2] {
                    if splits <= useful.max(1) && splits <= tuning::MAX_SPLITS {
                        cfgs.push(AttentionConfig {
                            splits,
                            bs,
                            s: tuning::combine_s(splits),
                            min_chunk: tuning::ATTENTION_MIN_CHUNK,
                            dc: 128,
                            stages,
                            num_warps,
                            cluster: 1,
                        });
                    }
                }
            }
        }
        // Splits merged inside a thread-block cluster per KV head (sm_90 and newer).
        if info.compute_capability.0 >= 9 {
            for cluster in [8, 16] {
                for stages in [1, 2] {
                    cfgs.push(AttentionConfig {
                        splits: cluster,
                        bs: 64,
                        s: tuning::combine_s(cluster),
                        min_chunk: tuning::ATTENTION_MIN_CHUNK,
                        dc: 128,
                        stages,
                        num_warps: 4,
                        cluster,
                    });
                }
            }
        }
        let mut results: Vec<(AttentionConfig, Stats, Method)> = Vec::new();
        for cfg in cfgs {
            if results.iter().any(|r| r.0 == cfg) {
                continue;
            }
            let (s, m) = timing::time_graph(dev, launches, opts, |j| w.launch(dev, j, cfg))?;
            results.push((cfg, s, m));
        }
        let best_of = |clustered: bool| {
            results
                .iter()
                .filter(|r| (r.0.cluster > 1) == clustered)
                .min_by(|a, b| a.1.median_us.total_cmp(&b.1.median_us))
                .copied()
        };
        let shape = format!("ctx {ctx}, 16/8 heads, D 128");
        if sweep {
            sweeps.push(format!("attention {shape}, {} KV sets:", w.sets()));
            for (c, s, _) in &results {
                sweeps.push(format!(
                    "  BS={:<2} splits={:<2} S={:<2} CLUSTER={:<2} STAGES={} warps={}  {:>9.2} us  {:>7.1} GB/s{}",
                    c.bs,
                    c.splits,
                    c.s,
                    c.cluster,
                    c.stages,
                    c.num_warps,
                    s.median_us,
                    s.gb_per_s(w.bytes()),
                    if *c == default { "  (default)" } else { "" }
                ));
            }
        }
        for (kernel, best) in [
            ("attention split+combine", best_of(false)),
            ("attention clustered", best_of(true)),
        ] {
            let Some(best) = best else { continue };
            rows.push(Row {
                kernel: kernel.into(),
                shape: shape.clone(),
                config: format!(
                    "BS{} splits{} st{} w{}",
                    best.0.bs, best.0.splits, best.0.stages, best.0.num_warps
                ),
                stats: best.1,
                bytes: w.bytes(),
                method: best.2,
                default_us: results[0].1.median_us,
                cublas: None,
            });
        }
    }

    if sweep {
        println!("== sweep (median per launch)");
        for l in &sweeps {
            println!("{l}");
        }
        println!();
    }
    print_table(&info, &ceiling, &rows);
    Ok(())
}

fn print_table(info: &DeviceInfo, ceiling: &CopyCeiling, rows: &[Row]) {
    let cgb = ceiling.gb_per_s();
    println!(
        "device: {} (sm_{}{}, {} SMs, L2 {} MiB, {} GiB)",
        info.name,
        info.compute_capability.0,
        info.compute_capability.1,
        info.sm_count,
        info.l2_bytes >> 20,
        info.total_mem >> 30
    );
    println!(
        "copy ceiling: {:.0} GB/s (dtod of {} MiB, read+write; median {:.1} us, p10 {:.1}, p90 {:.1})",
        cgb,
        ceiling.buffer_bytes >> 20,
        ceiling.stats.median_us,
        ceiling.stats.p10_us,
        ceiling.stats.p90_us
    );
    println!(
        "{:<24} {:<28} {:<16} {:>9} {:>9} {:>7} {:>6} {:>9} {:>9} {:>8} {:>6}",
        "kernel",
        "shape",
        "best config",
        "us",
        "GB/s",
        "%ceil",
        "how",
        "dflt us",
        "cuBLAS us",
        "cuBLAS%",
        "speed"
    );
    for r in rows {
        let gb = r.stats.gb_per_s(r.bytes);
        let (cu_us, cu_pct, speed) = match r.cublas {
            Some((s, b)) => (
                format!("{:.2}", s.median_us),
                format!("{:.1}", 100.0 * s.gb_per_s(b) / cgb),
                format!("{:.2}x", s.median_us / r.stats.median_us),
            ),
            None => ("-".into(), "-".into(), "-".into()),
        };
        println!(
            "{:<24} {:<28} {:<16} {:>9.2} {:>9.1} {:>7.1} {:>6} {:>9.2} {:>9} {:>8} {:>6}",
            r.kernel,
            r.shape,
            r.config,
            r.stats.median_us,
            gb,
            100.0 * gb / cgb,
            r.method.to_string(),
            r.default_us,
            cu_us,
            cu_pct,
            speed
        );
    }
    println!("(us: median per launch; speed: cuBLAS time / tilefuse time, >1 is faster than cuBLAS; dflt: tuning.rs default)");
}
