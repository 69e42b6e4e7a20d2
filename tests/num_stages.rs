//! `num_stages` as a variant axis: one kernel compiled with several pipelining depths
//! (`num_stages = [2, 4]`), the launch picking one through `LaunchConfig::num_stages`.
//! The depths differ in their PTX and shared memory, compute the same product as the
//! host (on the interpreter) and, on a GPU, the same bits as each other and what the
//! interpreter computes; an uncompiled depth is an error that lists the compiled ones.

use tilefuse::dsl::back::ptx::Target;
use tilefuse::dsl::runtime::testing::{gpu_or_skip, gpu_turn};
use tilefuse::dsl::runtime::{LaunchConfig, LaunchError};
use tilefuse::engine::bench::Rng;
use tilefuse::prelude::*;

/// `c = a @ b` (bf16 in, f32 out), one `BM x BN` tile a program, K in steps of `BK`
/// through a `dot` whose operand loads are pipelined `num_stages` deep.
#[kernel(BM = [64], BN = [64], BK = [32], num_warps = [4], num_stages = [2, 4])]
fn staged_matmul<const BM: usize, const BN: usize, const BK: usize>(
    a: Ptr<bf16>,
    b: Ptr<bf16>,
    c: Ptr<f32>,
    m: i32,
    #[multiple_of(16)] n: i32,
    #[multiple_of(16)] k: i32,
) {
    let rm = program_id(0) * BM + arange(0, BM);
    let rn = program_id(1) * BN + arange(0, BN);
    let rk = arange(0, BK);
    let row_ok = (rm < m).expand_dims(1);
    let col_ok = (rn < n).expand_dims(0);
    let mut pa = a + rm.expand_dims(1) * k + rk.expand_dims(0);
    let mut pb = b + rk.expand_dims(1) * n + rn.expand_dims(0);
    let mut acc = zeros::<f32>([BM, BN]);
    for k0 in (0..k).step_by(BK) {
        let k_ok = rk < k - k0;
        let x = load(pa, row_ok & k_ok.expand_dims(0), 0.0);
        let y = load(pb, k_ok.expand_dims(1) & col_ok, 0.0);
        acc = dot(x, y, acc);
        pa += BK;
        pb += BK * n;
    }
    store(
        c + rm.expand_dims(1) * n + rn.expand_dims(0),
        acc,
        row_ok & col_ok,
    );
}

/// M, N and K off the tile, K over several iterations (the ring fills, turns and
/// drains).
const SHAPE: (usize, usize, usize) = (100, 80, 208);

fn host_matmul(a: &[bf16], b: &[bf16], (m, n, k): (usize, usize, usize)) -> Vec<f64> {
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

fn inputs() -> (Vec<bf16>, Vec<bf16>) {
    let (m, n, k) = SHAPE;
    let mut rng = Rng::new(7);
    (rng.bf16_vec(m * k, 1.0), rng.bf16_vec(k * n, 1.0))
}

fn run(dev: &Device, a: &[bf16], b: &[bf16], stages: u32) -> Result<Vec<f32>, LaunchError> {
    let (m, n, k) = SHAPE;
    let a = dev.upload(a).unwrap();
    let b = dev.upload(b).unwrap();
    let mut c = dev.alloc_filled(m * n, f32::NAN).unwrap();
    let grid = [m.div_ceil(64) as u32, n.div_ceil(64) as u32, 1];
    staged_matmul::<64, 64, 32>::launch(
        dev,
        LaunchConfig::grid(grid).num_stages(stages),
        &a,
        &b,
        &mut c,
        m as i32,
        n as i32,
        k as i32,
    )?;
    Ok(c.to_vec().unwrap())
}

fn max_rel_err(got: &[f32], want: &[f64]) -> f64 {
    let max = want.iter().fold(0.0f64, |s, w| s.max(w.abs()));
    got.iter()
        .zip(want)
        .fold(0.0f64, |d, (g, w)| d.max((f64::from(*g) - w).abs()))
        / max
}

#[test]
fn each_depth_is_its_own_variant() {
    let def = &STAGED_MATMUL;
    let depths: Vec<u32> = def.variants.iter().map(|v| v.num_stages).collect();
    assert_eq!(
        depths,
        [2, 4],
        "the first listed depth comes first (the default)"
    );
    assert!(def.has_stage_axis());
    let two = def.variant_staged(&[64, 64, 32], None, Some(2)).unwrap();
    let four = def.variant_staged(&[64, 64, 32], None, Some(4)).unwrap();
    assert_eq!((two.num_stages, four.num_stages), (2, 4));
    // No depth asked: the first compiled.
    assert_eq!(def.variant(&[64, 64, 32], None).unwrap().num_stages, 2);
    // A deeper ring holds more stages of the operand tiles.
    assert!(
        four.shared_bytes > two.shared_bytes,
        "{} vs {}",
        four.shared_bytes,
        two.shared_bytes
    );
    for target in [Target::Sm80, Target::Sm90a] {
        assert_ne!(two.ptx(target), four.ptx(target), "{target:?}");
    }
}

#[test]
fn an_uncompiled_depth_names_the_compiled_ones() {
    let (a, b) = inputs();
    let err = run(&Device::cpu(), &a, &b, 3).unwrap_err().to_string();
    assert!(
        err.contains("num_stages=3")
            && err.contains("[BM=64, BN=64, BK=32, num_warps=4, num_stages=2]")
            && err.contains("[BM=64, BN=64, BK=32, num_warps=4, num_stages=4]"),
        "{err}"
    );
}

#[test]
fn interpreter_runs_both_depths() {
    let (a, b) = inputs();
    let want = host_matmul(&a, &b, SHAPE);
    for stages in [2, 4] {
        let got = run(&Device::cpu(), &a, &b, stages).unwrap();
        let err = max_rel_err(&got, &want);
        assert!(err < 1e-5, "{stages} stages: {err:.2e}");
    }
}

#[test]
fn gpu_depths_match_each_other_and_the_interpreter() {
    let Some(gpu) = gpu_or_skip("gpu_depths_match_each_other_and_the_interpreter") else {
        return;
    };
    let _turn = gpu_turn();
    let (a, b) = inputs();
    let want = run(&Device::cpu(), &a, &b, 2).unwrap();
    let two = run(&gpu, &a, &b, 2).unwrap();
    let four = run(&gpu, &a, &b, 4).unwrap();
    // The depth changes when copies are issued, not the order of the sums.
    assert!(
        two.iter()
            .zip(&four)
            .all(|(x, y)| x.to_bits() == y.to_bits()),
        "2 and 4 stages differ"
    );
    let max = want.iter().fold(0.0f32, |s, w| s.max(w.abs()));
    let diff = four
        .iter()
        .zip(&want)
        .fold(0.0f32, |d, (g, w)| d.max((g - w).abs()));
    assert!(diff <= 1e-5 * max, "GPU vs interpreter: {diff}");
}
