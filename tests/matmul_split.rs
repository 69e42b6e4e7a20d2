//! Split-K GEMM (`tilefuse::kernels::matmul::{matmul_split, launch_plan}`): the planner
//! on the CPU (which tile and how many K slices for the shapes, slices covering
//! K), the kernel on the interpreter against a host f64 product on shapes off the tile
//! with K slices of unequal length, and, when there is a GPU, the same against the host
//! and the interpreter, launched twice on one workspace (its counters must come back to
//! zero) with results identical bit for bit across launches.

use tilefuse::dsl::runtime::testing::{gpu_or_skip, gpu_turn};
use tilefuse::engine::bench::Rng;
use tilefuse::kernels::matmul::{
    launch_plan, MatmulConfig, MatmulPlan, SplitWorkspace, MIN_SLICE_ITERS, SPLIT_CONFIGS,
    SPLIT_PARTIALS_MIN_BANDWIDTH, TWO_SLICE_MIN_ITERS,
};
use tilefuse::prelude::*;

/// H100 and H200.
const SMS: usize = 132;

/// On Hopper the 128 x 256 pick takes the 4-stage ring only sm_90's shared memory holds,
/// and on compute capability 9.0 (the copy engine) the 128 x 128 pick a 5-stage one;
/// elsewhere, and for every other pick, the device changes nothing.
#[test]
fn plan_for_device_fits_the_gpu() {
    let info = |major| tilefuse::dsl::runtime::DeviceInfo {
        name: "test".into(),
        sm_count: SMS,
        l2_bytes: 50 << 20,
        total_mem: 80 << 30,
        compute_capability: (major, 0),
        memory_bandwidth: 4_800_000_000_000,
    };
    let large = MatmulConfig::LARGE.stages(4);
    assert!(large.hopper_only() && !MatmulConfig::LARGE.hopper_only());
    assert!(!MatmulConfig::SPLIT.stages(5).hopper_only());
    for (m, n, k) in [
        (4096, 4096, 4096),
        (512, 6144, 1024),
        (512, 1024, 3072),
        (512, 4096, 1024),
    ] {
        let base = MatmulPlan::for_shape(m, n, k, SMS);
        assert_eq!(MatmulPlan::for_device(&info(8), m, n, k), base);
        let hopper = MatmulPlan::for_device(&info(9), m, n, k);
        if base == MatmulPlan::tiles(MatmulConfig::LARGE) {
            assert_eq!(hopper, MatmulPlan::tiles(large));
        } else if base == MatmulPlan::tiles(MatmulConfig::MEDIUM.stages(4)) {
            assert_eq!(hopper, MatmulPlan::tiles(MatmulConfig::MEDIUM.stages(5)));
        } else {
            assert_eq!(hopper, base);
        }
    }
    assert_eq!(
        MatmulPlan::for_device(&info(9), 4096, 4096, 4096),
        MatmulPlan::tiles(large)
    );
    assert_eq!(
        MatmulPlan::for_device(&info(9), 512, 4096, 1024),
        MatmulPlan::tiles(MatmulConfig::MEDIUM.stages(5))
    );
    // Two slices of exactly TWO_SLICE_MIN_ITERS iterations (the down projection at 512
    // tokens) split where memory is fast and run unsplit where it is slower; longer
    // slices split on both.
    let slow = tilefuse::dsl::runtime::DeviceInfo {
        memory_bandwidth: 3_352_000_000_000,
        ..info(9)
    };
    let down = (512, 1024, 64 * 2 * TWO_SLICE_MIN_ITERS);
    assert_eq!(
        MatmulPlan::for_device(&info(9), down.0, down.1, down.2).splits,
        2
    );
    assert_eq!(
        MatmulPlan::for_device(&slow, down.0, down.1, down.2),
        MatmulPlan::tiles(MatmulConfig::SPLIT.stages(5))
    );
    let longer = 64 * 2 * (TWO_SLICE_MIN_ITERS + 4);
    assert_eq!(MatmulPlan::for_device(&slow, 512, 1024, longer).splits, 2);
    assert!((3_352_000_000_001..4_800_000_000_000).contains(&SPLIT_PARTIALS_MIN_BANDWIDTH));
}

#[test]
fn plan_splits_small_outputs_only() {
    // Qwen3-0.6B's down projection at 512 tokens: 64 tiles of 64 x 128, cut into 2
    // slices (128 programs on 132 SMs).
    let (m, n, k) = (512, 1024, 3072);
    let p = MatmulPlan::for_shape(m, n, k, SMS);
    assert_eq!((p.config, p.splits), (MatmulConfig::SPLIT, 2));
    assert_eq!(p.programs(m, n), 128);
    // The O projection: two slices would have 16 iterations each, fewer than
    // TWO_SLICE_MIN_ITERS: the same tile unsplit, 5 stages deep.
    let p = MatmulPlan::for_shape(512, 1024, 2048, SMS);
    assert_eq!(p, MatmulPlan::tiles(MatmulConfig::SPLIT.stages(5)));
    let p = MatmulPlan::for_shape(512, 1024, 64 * (2 * TWO_SLICE_MIN_ITERS - 1), SMS);
    assert_eq!(p, MatmulPlan::tiles(MatmulConfig::SPLIT.stages(5)));
    // The tiles 128 x 128 picks from 96 of them run a 4-stage ring.
    assert_eq!(
        MatmulConfig::for_shape(512, 4096),
        MatmulConfig::MEDIUM.stages(4)
    );
    // Enough tiles: no split, the tile `MatmulConfig::for_shape` picks.
    for (m, n, k) in [
        (4096, 4096, 4096),
        (512, 6144, 1024),
        (512, 4096, 1024),
        (2048, 1024, 3072),
        (2048, 6144, 1024),
    ] {
        let p = MatmulPlan::for_shape(m, n, k, SMS);
        assert_eq!(p, MatmulPlan::tiles(MatmulConfig::for_shape(m, n)));
    }
    // K too short for two slices of MIN_SLICE_ITERS iterations: small tiles, unsplit.
    let p = MatmulPlan::for_shape(512, 1024, 64 * (2 * MIN_SLICE_ITERS - 1), SMS);
    assert_eq!(p, MatmulPlan::tiles(MatmulConfig::SMALL));
    // Two tiles and a long K: as many slices as K allows, within one wave.
    let p = MatmulPlan::for_shape(100, 100, 64 * 40, SMS);
    assert_eq!((p.config, p.splits), (MatmulConfig::SPLIT, 10));
    // More SMs, more slices; fewer than two slices' worth: small tiles, unsplit.
    assert_eq!(MatmulPlan::for_shape(512, 1024, 3072, 264).splits, 4);
    let p = MatmulPlan::for_shape(512, 1024, 3072, 108);
    assert_eq!(p, MatmulPlan::tiles(MatmulConfig::SMALL));
    // Never more programs than SMs.
    for sms in [1, 8, 78, 108, 132] {
        for (m, n, k) in [(64, 64, 8192), (512, 1024, 3072), (300, 700, 5000)] {
            let p = MatmulPlan::for_shape(m, n, k, sms);
            if p.splits > 1 {
                assert!(p.programs(m, n) <= sms, "{m}x{n}x{k} on {sms}: {p:?}");
                let iters = p.k_slice(k) / p.config.block_k;
                assert!(iters >= MIN_SLICE_ITERS, "{m}x{n}x{k} on {sms}: {p:?}");
            }
        }
    }
}

#[test]
fn slices_cover_k_and_none_is_empty() {
    for config in SPLIT_CONFIGS {
        for k in (16..2000).step_by(16) {
            for splits in 1..=9 {
                let p = MatmulPlan { config, splits }.normalized(k);
                let ks = p.k_slice(k);
                assert_eq!(ks % config.block_k, 0);
                assert!(p.splits >= 1 && p.splits <= splits, "{k} {splits}: {p:?}");
                // Every slice but the last is whole; the last is non-empty.
                assert!((p.splits - 1) * ks < k && k <= p.splits * ks, "{k} {p:?}");
                assert_eq!(p.normalized(k), p);
            }
        }
    }
    // 5 iterations of 64 cut 4 ways: slices of 2, 2 and 1 iterations.
    let p = MatmulPlan {
        config: MatmulConfig::SMALL,
        splits: 4,
    }
    .normalized(320);
    assert_eq!((p.splits, p.k_slice(320)), (3, 128));
}

/// Row-major `a [m, k] @ b [k, n]` in f64.
fn host_matmul(a: &[bf16], b: &[bf16], m: usize, n: usize, k: usize) -> Vec<f64> {
    let mut c = vec![0.0f64; m * n];
    for i in 0..m {
        for p in 0..k {
            let x = f64::from(a[i * k + p].to_f32());
            for j in 0..n {
                c[i * n + j] += x * f64::from(b[p * n + j].to_f32());
            }
        }
    }
    c
}

/// The largest `|got - want|` over `max |want|`; NaN (an unwritten element) is infinite.
fn max_rel_err(got: &[f32], want: &[f64]) -> f64 {
    let scale = want.iter().fold(0.0f64, |s, w| s.max(w.abs())).max(1e-30);
    got.iter().zip(want).fold(0.0, |e, (g, w)| {
        if g.is_nan() {
            f64::INFINITY
        } else {
            e.max((f64::from(*g) - w).abs() / scale)
        }
    })
}

/// Runs `plan` on `m x n x k` twice on one workspace, f32 and bf16 out; returns the f32
/// result, and checks both against the host and the two launches against each other.
fn run_plan(dev: &Device, plan: MatmulPlan, (m, n, k): (usize, usize, usize)) -> Vec<f32> {
    let mut rng = Rng::new((m * 31 + n * 7 + k) as u64);
    let ha = rng.bf16_vec(m * k, 1.0);
    let hb = rng.bf16_vec(k * n, 1.0);
    let want = host_matmul(&ha, &hb, m, n, k);
    let (a, b) = (dev.upload(&ha).unwrap(), dev.upload(&hb).unwrap());
    let mut ws = SplitWorkspace::new(dev, plan, m, n).unwrap();
    let what = format!("{dev}: {m}x{n}x{k} {plan:?}");
    let mut c = dev.alloc_filled(m * n, f32::NAN).unwrap();
    launch_plan(dev, &a, &b, &mut c, m, n, k, plan, Some(&mut ws)).expect(&what);
    let first = c.to_vec().unwrap();
    let err = max_rel_err(&first, &want);
    assert!(err < 1e-5, "{what}: f32 out, max rel err {err:.2e}");
    let mut c = dev.alloc_filled(m * n, f32::NAN).unwrap();
    launch_plan(dev, &a, &b, &mut c, m, n, k, plan, Some(&mut ws)).expect(&what);
    let second = c.to_vec().unwrap();
    let same = first
        .iter()
        .zip(&second)
        .all(|(x, y)| x.to_bits() == y.to_bits());
    assert!(same, "{what}: a second launch on the workspace differs");
    let mut c = dev.alloc_filled(m * n, bf16::NAN).unwrap();
    launch_plan(dev, &a, &b, &mut c, m, n, k, plan, Some(&mut ws)).expect(&what);
    let got: Vec<f32> = c.to_vec().unwrap().iter().map(|x| x.to_f32()).collect();
    let err = max_rel_err(&got, &want);
    assert!(err < 8e-3, "{what}: bf16 out, max rel err {err:.2e}");
    first
}

/// Shapes off every tile, with K slices of unequal length: K = 208 cut 3 ways at BK 64
/// is 128 + 64 + 16; 1040 cut 5 ways is 256 x 4 + 16; K = 16 is below one BK.
const SHAPES: [(usize, usize, usize); 3] = [(70, 48, 208), (33, 80, 16), (130, 144, 1040)];

#[test]
fn interpreter_matches_host() {
    let dev = Device::cpu();
    for shape in SHAPES {
        for splits in [2, 3, 5] {
            run_plan(
                &dev,
                MatmulPlan {
                    config: MatmulConfig::SMALL,
                    splits,
                },
                shape,
            );
        }
    }
    // The 64 x 128 tile the planner splits, and 128 x 128, on one shape.
    for config in [MatmulConfig::SPLIT, MatmulConfig::MEDIUM] {
        run_plan(
            &Device::cpu(),
            MatmulPlan { config, splits: 3 },
            (130, 144, 208),
        );
    }
}

#[test]
fn gpu_matches_host_and_interpreter() {
    let Some(gpu) = gpu_or_skip("gpu_matches_host_and_interpreter") else {
        return;
    };
    let _turn = gpu_turn();
    for config in SPLIT_CONFIGS {
        for splits in [2, 3, 5, 8] {
            let plan = MatmulPlan { config, splits };
            for shape in SHAPES {
                let got = run_plan(&gpu, plan, shape);
                if config == MatmulConfig::SMALL && shape != (130, 144, 1040) {
                    let want = run_plan(&Device::cpu(), plan, shape);
                    let max = want.iter().fold(0.0f32, |s, w| s.max(w.abs()));
                    let diff = got
                        .iter()
                        .zip(&want)
                        .fold(0.0f32, |d, (g, w)| d.max((g - w).abs()));
                    assert!(
                        diff <= 1e-5 * max,
                        "{shape:?} {plan:?}: GPU vs interpreter {diff}"
                    );
                }
            }
        }
    }
    // Larger: many tiles, a long K in unequal slices, an M off the tile.
    for plan in [
        MatmulPlan::for_shape(1000, 528, 3000, 132),
        MatmulPlan {
            config: MatmulConfig::new(128, 64, 64, 8),
            splits: 3,
        },
    ] {
        run_plan(&gpu, plan, (1000, 528, 3008));
    }
}

#[test]
fn split_without_a_fitting_workspace_is_an_error() {
    let dev = Device::cpu();
    let (m, n, k) = (64, 64, 512);
    let a = dev.zeros::<bf16>(m * k).unwrap();
    let b = dev.zeros::<bf16>(k * n).unwrap();
    let mut c = dev.zeros::<bf16>(m * n).unwrap();
    let plan = MatmulPlan {
        config: MatmulConfig::SMALL,
        splits: 4,
    };
    let err = launch_plan(&dev, &a, &b, &mut c, m, n, k, plan, None).unwrap_err();
    assert!(err.to_string().contains("SplitWorkspace"), "{err}");
    let small = MatmulPlan { splits: 2, ..plan };
    let mut ws = SplitWorkspace::new(&dev, small, m, n).unwrap();
    let err = launch_plan(&dev, &a, &b, &mut c, m, n, k, plan, Some(&mut ws)).unwrap_err();
    assert!(err.to_string().contains("the workspace has"), "{err}");
    // An unsplit plan needs none.
    launch_plan(
        &dev,
        &a,
        &b,
        &mut c,
        m,
        n,
        k,
        MatmulPlan::tiles(plan.config),
        None,
    )
    .unwrap();
}
