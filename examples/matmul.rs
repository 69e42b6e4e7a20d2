//! Triton's matmul written in the language (`tilefuse::kernels::matmul`: the tutorial's
//! grouped tiles, its operands read through tensor descriptors, which the copy engine
//! moves on Hopper; the tutorial's pointer form is `examples/tutorial_03_matmul.rs`): bf16
//! in, f32 accumulation, masked edges, bf16 or f32 out. Checked against a host reference
//! on awkward shapes (M, N, K not multiples of the tile, K below one tile) for every
//! compiled tile configuration; on a GPU it then prints TFLOP/s next to cuBLAS.
//!
//! `cargo run --release --example matmul [-- --check-only] [--small] [--sweep]
//! [--shape MxNxK] [--config BMxBNxBK/W/S]` (`--small`: two small shapes only, for
//! compute-sanitizer; `--sweep`: time every configuration on more shapes, the data behind
//! `MatmulConfig::for_shape` and `MatmulPlan::for_device`; `--shape`: time this shape only,
//! checked against cuBLAS only; `--config`: time this unsplit configuration only and no split plans,
//! which with `--shape` gives a profiler one kernel to look at). Split-K plans
//! (`matmul_split`) are checked and timed beside the unsplit tiles.
//!
//! On a GPU, large shapes are checked against cuBLAS (relative Frobenius error) and timed
//! by replaying a captured CUDA graph of one launch per input set between CUDA events
//! (median of 20 after 3 warm-ups; input sets rotated to exceed 4x L2), so the host's
//! launch cost stays out of short kernels' times; `--events` times plain launches
//! between events instead (cuBLAS is timed the same way either way).

#[path = "common/args.rs"]
mod args;

use tilefuse::dsl::runtime::timing::{self as perf, TimingOptions};
use tilefuse::engine::bench::workloads::{replicate, rotation_sets};
use tilefuse::engine::bench::{Cublas, PerfError, Rng};
use tilefuse::kernels::matmul::{
    launch, launch_plan, MatmulConfig, MatmulOut, MatmulPlan, SplitWorkspace, SPLIT_CONFIGS,
};
use tilefuse::prelude::*;

/// Every configuration both kernels (bf16 and f32 out) are compiled with: every tile 3
/// stages deep, 128 x 128 x 64 also 4 and 5 deep, 64 x 128 x 64 also 5.
const CONFIGS: [MatmulConfig; 12] = [
    MatmulConfig::new(128, 256, 64, 8),
    MatmulConfig::new(128, 256, 64, 8).stages(4),
    MatmulConfig::new(128, 128, 64, 8),
    MatmulConfig::new(128, 128, 64, 8).stages(4),
    MatmulConfig::new(128, 128, 64, 8).stages(5),
    MatmulConfig::new(64, 128, 64, 4).stages(5),
    MatmulConfig::new(128, 128, 32, 4),
    MatmulConfig::new(128, 64, 64, 8),
    MatmulConfig::new(64, 128, 64, 4),
    MatmulConfig::new(64, 128, 32, 4),
    MatmulConfig::new(64, 64, 64, 4),
    MatmulConfig::new(64, 64, 32, 4),
];

/// `MxNxK` as three sizes.
fn parse_shape(s: &str) -> anyhow::Result<(usize, usize, usize)> {
    let v: Vec<usize> = s
        .split('x')
        .map(str::parse)
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow::anyhow!("--shape {s:?}: {e} (expected MxNxK)"))?;
    match v[..] {
        [m, n, k] if m > 0 && n > 0 && k > 0 => Ok((m, n, k)),
        _ => anyhow::bail!("--shape {s:?}: expected three positive sizes, MxNxK"),
    }
}

/// A configuration as `--config` spells it: `BMxBNxBK/W/S`.
fn config_name(c: &MatmulConfig) -> String {
    format!(
        "{}x{}x{}/{}/{}",
        c.block_m, c.block_n, c.block_k, c.num_warps, c.num_stages
    )
}

/// `BMxBNxBK/W/S` as one of [`CONFIGS`].
fn parse_config(s: &str) -> anyhow::Result<MatmulConfig> {
    CONFIGS
        .into_iter()
        .find(|c| config_name(c) == s)
        .ok_or_else(|| {
            let known: Vec<String> = CONFIGS.iter().map(config_name).collect();
            anyhow::anyhow!(
                "--config {s:?} is not compiled; compiled: {}",
                known.join(", ")
            )
        })
}

/// `‖got − want‖ / ‖want‖`, or infinity when `got` has a NaN (an unwritten element).
fn rel_err(got: &[f32], want: &[f32]) -> f64 {
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (g, w) in got.iter().zip(want) {
        if g.is_nan() {
            return f64::INFINITY;
        }
        num += (f64::from(*g) - f64::from(*w)).powi(2);
        den += f64::from(*w).powi(2);
    }
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

/// Row-major `a [m, k] @ b [k, n]` in f64, as f32.
fn host_matmul(a: &[bf16], b: &[bf16], m: usize, n: usize, k: usize) -> Vec<f32> {
    let bf: Vec<f64> = b.iter().map(|x| f64::from(x.to_f32())).collect();
    let mut c = vec![0.0f64; m * n];
    for i in 0..m {
        for p in 0..k {
            let x = f64::from(a[i * k + p].to_f32());
            let row = &bf[p * n..(p + 1) * n];
            for (cj, bj) in c[i * n..(i + 1) * n].iter_mut().zip(row) {
                *cj += x * bj;
            }
        }
    }
    c.into_iter().map(|x| x as f32).collect()
}

/// Runs one configuration on `m x n x k` and returns the error against the host.
fn check<T: MatmulOut + Copy>(
    dev: &Device,
    plan: MatmulPlan,
    (m, n, k): (usize, usize, usize),
    rng: &mut Rng,
    poison: T,
    to_f32: impl Fn(T) -> f32,
) -> anyhow::Result<f64> {
    let ha = rng.bf16_vec(m * k, 1.0);
    let hb = rng.bf16_vec(k * n, 1.0);
    let a = dev.upload(&ha)?;
    let b = dev.upload(&hb)?;
    let mut c = dev.alloc_filled(m * n, poison)?;
    let mut ws = SplitWorkspace::new(dev, plan, m, n)?;
    // Twice: the second launch finds the counters the first one reset.
    for _ in 0..2 {
        launch_plan(dev, &a, &b, &mut c, m, n, k, plan, Some(&mut ws))?;
    }
    let got: Vec<f32> = c.to_vec()?.into_iter().map(to_f32).collect();
    Ok(rel_err(&got, &host_matmul(&ha, &hb, m, n, k)))
}

/// Microseconds per call of `f` over `sets` input sets: graph replays, or plain launches
/// between events when `events` is set or capture fails.
fn time<E: From<tilefuse::dsl::runtime::RuntimeError>>(
    dev: &Device,
    sets: usize,
    opts: TimingOptions,
    events: bool,
    f: impl FnMut(usize) -> Result<(), E>,
) -> Result<perf::Stats, E> {
    if events {
        perf::time_events(dev, sets, opts, f)
    } else {
        let (stats, method) = perf::time_graph(dev, sets, opts, f)?;
        if method != perf::Method::Graph {
            println!("(graph capture failed: timed with {method})");
        }
        Ok(stats)
    }
}

fn main() -> anyhow::Result<()> {
    let dev = Device::auto();
    let check_only = std::env::args().any(|a| a == "--check-only");
    let only_shape = args::value("--shape")
        .map(|s| parse_shape(&s))
        .transpose()?;
    let only_config = args::value("--config")
        .map(|s| parse_config(&s))
        .transpose()?;
    let mut rng = Rng::new(24);
    // Awkward shapes: M, N, K off the tile; K = 16 is below every BK.
    let small = std::env::args().any(|a| a == "--small");
    let shapes: &[(usize, usize, usize)] = if small {
        &[(129, 48, 16), (300, 272, 208)]
    } else if dev.is_cuda() {
        &[(300, 272, 208), (129, 48, 16), (1000, 528, 1040)]
    } else {
        &[(70, 48, 48), (33, 80, 16)]
    };
    // Every unsplit tile, and every split-K tile cut 2, 3 and 5 ways (slices of unequal
    // length; a split past K's iterations is normalized to fewer slices).
    // Hopper-only configurations (a ring above sm_80's shared memory) where they run.
    let hopper = dev.as_cuda().is_none_or(|d| d.compute_capability().0 >= 9);
    let usable: Vec<MatmulConfig> = CONFIGS
        .into_iter()
        .filter(|c| hopper || !c.hopper_only())
        .collect();
    let mut plans: Vec<MatmulPlan> = usable.iter().map(|&c| MatmulPlan::tiles(c)).collect();
    for config in SPLIT_CONFIGS {
        plans.extend([2, 3, 5].map(|splits| MatmulPlan { config, splits }));
    }
    // `--shape` times one shape, checked against cuBLAS there: the awkward shapes wait.
    let awkward = if only_shape.is_some() {
        &[][..]
    } else {
        shapes
    };
    for &shape in awkward {
        for &plan in &plans {
            let err = check(&dev, plan, shape, &mut rng, bf16::NAN, |x| x.to_f32())?;
            println!("check {shape:?} {plan:?} bf16 out on {dev}: rel err {err:.2e}");
            anyhow::ensure!(err < 8e-3, "matmul disagrees with the host reference");
        }
        for &plan in &plans {
            let err = check(&dev, plan, shape, &mut rng, f32::NAN, |x| x)?;
            println!("check {shape:?} {plan:?} f32 out on {dev}: rel err {err:.2e}");
            anyhow::ensure!(err < 1e-5, "matmul (f32 C) disagrees with the host");
        }
    }
    if !dev.is_cuda() || check_only || small {
        return Ok(());
    }
    let blas = Cublas::new(&dev)?;
    let info = dev.info()?;
    let events = std::env::args().any(|a| a == "--events");
    let opts = TimingOptions {
        warmup: 3,
        reps: 20,
    };
    let mut table = Vec::new();
    let mut shapes = vec![
        (4096, 4096, 4096),
        (512, 4096, 1024),
        (512, 6144, 1024),
        (512, 1024, 3072),
        (2048, 4096, 1024),
    ];
    if std::env::args().any(|a| a == "--sweep") {
        // The rest of Qwen3-0.6B's prefill GEMMs (issue 24) and 8192^3: the data for
        // `MatmulConfig::for_shape`.
        shapes.extend([
            (8192, 8192, 8192),
            (512, 1024, 2048),
            (2048, 1024, 2048),
            (2048, 6144, 1024),
            (2048, 1024, 3072),
        ]);
    }
    if let Some(shape) = only_shape {
        shapes = vec![shape];
    }
    let configs: Vec<MatmulConfig> = match only_config {
        Some(c) => vec![c],
        None => usable.clone(),
    };
    for (m, n, k) in shapes {
        let set_bytes = 2 * (m * k + k * n + m * n);
        let sets = rotation_sets(set_bytes, info.l2_bytes).min(8);
        let a = replicate(&dev, &rng.bf16_vec(m * k, 1.0), sets)?;
        let b = replicate(&dev, &rng.bf16_vec(k * n, 1.0), sets)?;
        let mut c: Vec<Buffer<bf16>> = (0..sets)
            .map(|_| dev.alloc_filled(m * n, bf16::NAN))
            .collect::<Result<_, _>>()?;
        let mut want = dev.alloc_filled(m * n, bf16::NAN)?;
        blas.gemm_bf16(&a[0], &b[0], &mut want, m, n, k)?;
        let want: Vec<f32> = want.to_vec()?.iter().map(|x| x.to_f32()).collect();
        let flop = 2.0 * (m * n * k) as f64;
        let t_blas = time(&dev, sets, opts, events, |i| {
            blas.gemm_bf16(&a[i], &b[i], &mut c[i], m, n, k)
        })?;
        let tf_blas = flop / (t_blas.median_us * 1e-6) / 1e12;
        let mut best: Option<(MatmulConfig, f64)> = None;
        for &cfg in &configs {
            launch(&dev, &a[0], &b[0], &mut c[0], m, n, k, cfg)?;
            let got: Vec<f32> = c[0].to_vec()?.iter().map(|x| x.to_f32()).collect();
            let err = rel_err(&got, &want);
            anyhow::ensure!(
                err < 1e-2,
                "{m}x{n}x{k} {cfg:?}: rel err {err:.2e} vs cuBLAS"
            );
            let t = time(&dev, sets, opts, events, |i| {
                launch(&dev, &a[i], &b[i], &mut c[i], m, n, k, cfg)?;
                Ok::<(), PerfError>(())
            })?;
            let tf = flop / (t.median_us * 1e-6) / 1e12;
            println!(
                "{m}x{n}x{k} {}x{}x{} w{} s{}: {:.1} us, {tf:.1} TFLOP/s (rel err {err:.1e})",
                cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_warps, cfg.num_stages, t.median_us
            );
            if best.is_none_or(|(_, b)| tf > b) {
                best = Some((cfg, tf));
            }
        }
        let (cfg, tf) = best.expect("configs");
        if only_config.is_some() {
            table.push(format!(
                "| {m} x {n} x {k} | {tf:.0} ({}x{}x{}, {} warps, {} stages) | | | {tf_blas:.0} | {:.0}% |",
                cfg.block_m,
                cfg.block_n,
                cfg.block_k,
                cfg.num_warps,
                cfg.num_stages,
                100.0 * tf / tf_blas
            ));
            continue;
        }
        // Split-K: every split tile cut 2 to 8 ways, where that stays within two waves.
        let mut split_plans = Vec::new();
        for config in SPLIT_CONFIGS {
            for splits in 2..=8 {
                let plan = MatmulPlan { config, splits }.normalized(k);
                let per_sm = if config.num_warps == 4 { 4 } else { 2 };
                if plan.splits == splits && plan.programs(m, n) <= per_sm * info.sm_count {
                    split_plans.push(plan);
                }
            }
        }
        let picked = MatmulPlan::for_device(&info, m, n, k);
        if !split_plans.contains(&picked) {
            split_plans.push(picked);
        }
        let mut best_split: Option<(MatmulPlan, f64)> = None;
        let mut tf_picked = None;
        for plan in split_plans {
            let mut ws = SplitWorkspace::new(&dev, plan, m, n)?;
            launch_plan(&dev, &a[0], &b[0], &mut c[0], m, n, k, plan, Some(&mut ws))?;
            let got: Vec<f32> = c[0].to_vec()?.iter().map(|x| x.to_f32()).collect();
            let err = rel_err(&got, &want);
            anyhow::ensure!(
                err < 1e-2,
                "{m}x{n}x{k} {plan:?}: rel err {err:.2e} vs cuBLAS"
            );
            let t = time(&dev, sets, opts, events, |i| {
                launch_plan(&dev, &a[i], &b[i], &mut c[i], m, n, k, plan, Some(&mut ws))?;
                Ok::<(), PerfError>(())
            })?;
            let tf = flop / (t.median_us * 1e-6) / 1e12;
            let c = plan.config;
            println!(
                "{m}x{n}x{k} {}x{}x{} w{} split {}: {:.1} us, {tf:.1} TFLOP/s (rel err {err:.1e})",
                c.block_m, c.block_n, c.block_k, c.num_warps, plan.splits, t.median_us
            );
            if plan == picked {
                tf_picked = Some(tf);
            }
            if plan.splits > 1 && best_split.is_none_or(|(_, b)| tf > b) {
                best_split = Some((plan, tf));
            }
        }
        let tf_picked = tf_picked.expect("the pick is timed");
        let split_cell = best_split.map_or("-".to_string(), |(p, tf)| {
            format!(
                "{tf:.0} ({}x{}x{} / {} w, {} slices)",
                p.config.block_m, p.config.block_n, p.config.block_k, p.config.num_warps, p.splits
            )
        });
        let pc = picked.config;
        table.push(format!(
            "| {m} x {n} x {k} | {tf:.0} ({}x{}x{}, {} warps, {} stages) | {split_cell} | \
             {tf_picked:.0} ({}x{}x{} / {} w / {} s, {} slices) | {tf_blas:.0} | {:.0}% |",
            cfg.block_m,
            cfg.block_n,
            cfg.block_k,
            cfg.num_warps,
            cfg.num_stages,
            pc.block_m,
            pc.block_n,
            pc.block_k,
            pc.num_warps,
            pc.num_stages,
            picked.splits,
            100.0 * tf_picked / tf_blas
        ));
    }
    println!(
        "\n{} (sm {:?}, peak memory bandwidth {:.2} TB/s)",
        info.name,
        info.compute_capability,
        info.memory_bandwidth as f64 / 1e12
    );
    println!(
        "| GEMM (M x N x K) | best unsplit tile (TFLOP/s) | best split-K | `MatmulPlan::for_device` \
         | cuBLAS | pick / cuBLAS |"
    );
    println!("|---|---|---|---|---|---|");
    for row in table {
        println!("{row}");
    }
    Ok(())
}
