//! Triton's tutorial 03 (matrix multiplication) as a new user writes it: bf16 in, f32
//! accumulation, masked edges, grouped program order, and *no* `#[multiple_of(16)]` on
//! the sizes. Triton gets 16-byte loads here because it specializes integer arguments
//! divisible by 16; `#[kernel]` does the same at build time (docs/language.md, "Divisible
//! forms"): beside the plain form it compiles one assuming `n` and `k` multiples of 16,
//! and each launch takes it when they are.
//!
//! `cargo run --release --example tutorial_03_matmul`
//!
//! Checked against a host reference on shapes whose `n` and `k` divide by 16 and shapes
//! whose do not (so both forms run); on a GPU it then times two prefill-sized shapes and
//! 4096^3 next to cuBLAS in the same process (graph replays, median of 20, input sets
//! rotated past L2). `TILEFUSE_SPECIALIZE=0` makes every launch take the plain form: run
//! it both ways to see what the divisible form buys (docs/perf.md, "Divisible forms").
//! The tuned kernel of the library is `tilefuse::kernels::matmul` (the `matmul` example).

use tilefuse::dsl::runtime::timing::{self as perf, TimingOptions};
use tilefuse::engine::bench::workloads::{replicate, rotation_sets};
use tilefuse::engine::bench::{Cublas, PerfError, Rng};
use tilefuse::prelude::*;

/// `c = a @ b`, row-major, one `BM x BN` tile a program, programs grouped `GROUP_M` tile
/// rows at a time so that consecutive programs share tiles in L2. (`BK = 64` would be
/// faster in the divisible form, but the plain form's scalar loads then spill: every form
/// must assemble clean, tests/ptxas_all.rs.)
#[kernel(BM = [128], BN = [128], BK = [32], GROUP_M = [8], num_warps = [8], num_stages = [3])]
fn matmul<const BM: usize, const BN: usize, const BK: usize, const GROUP_M: usize>(
    a: Ptr<bf16>,
    b: Ptr<bf16>,
    c: Ptr<bf16>,
    m: i32,
    n: i32,
    k: i32,
) {
    let pid = program_id(0);
    let num_pid_m = cdiv(m, BM);
    let num_pid_n = cdiv(n, BN);
    let num_pid_in_group = GROUP_M * num_pid_n;
    let first_pid_m = (pid / num_pid_in_group) * GROUP_M;
    let group_size_m = minimum(num_pid_m - first_pid_m, GROUP_M);
    let pid_m = first_pid_m + (pid % num_pid_in_group) % group_size_m;
    let pid_n = (pid % num_pid_in_group) / group_size_m;
    let rm = pid_m * BM + arange(0, BM);
    let rn = pid_n * BN + arange(0, BN);
    let rk = arange(0, BK);
    let mut pa = a + rm.expand_dims(1) * k + rk.expand_dims(0);
    let mut pb = b + rk.expand_dims(1) * n + rn.expand_dims(0);
    let mut acc = zeros::<f32>([BM, BN]);
    for k0 in (0..k).step_by(BK) {
        let k_ok = rk < k - k0;
        let x = load(pa, (rm < m).expand_dims(1) & k_ok.expand_dims(0), 0.0);
        let y = load(pb, k_ok.expand_dims(1) & (rn < n).expand_dims(0), 0.0);
        acc = dot(x, y, acc);
        pa += BK;
        pb += BK * n;
    }
    let mask = (rm < m).expand_dims(1) & (rn < n).expand_dims(0);
    store(
        c + rm.expand_dims(1) * n + rn.expand_dims(0),
        acc as bf16,
        mask,
    );
}

fn launch(
    dev: &Device,
    a: &Buffer<bf16>,
    b: &Buffer<bf16>,
    c: &mut Buffer<bf16>,
    (m, n, k): (usize, usize, usize),
) -> Result<(), LaunchError> {
    let grid = (m.div_ceil(128) * n.div_ceil(128)) as u32;
    matmul::<128, 128, 32, 8>::launch(dev, grid, a, b, c, m as i32, n as i32, k as i32)
}

/// `‖got − want‖ / ‖want‖` over bf16 results, infinite on a NaN (an unwritten element).
fn rel_err(got: &[bf16], want: &[f64]) -> f64 {
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (g, w) in got.iter().zip(want) {
        let g = f64::from(g.to_f32());
        if g.is_nan() {
            return f64::INFINITY;
        }
        num += (g - w).powi(2);
        den += w.powi(2);
    }
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

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

fn main() -> anyhow::Result<()> {
    let dev = Device::auto();
    let mut rng = Rng::new(3);
    let divisible = MATMUL.variants[0]
        .divisible_form
        .map(|f| f.assumes_divisible);
    println!(
        "divisible form compiled: {divisible:?} (bit i: parameter i assumed a multiple of 16)"
    );
    // n and k multiples of 16 (the divisible form), then not (the plain one); M, N and K
    // off the tile, K below one tile.
    let shapes: &[(usize, usize, usize)] = if dev.is_cuda() {
        &[
            (300, 272, 208),
            (129, 48, 16),
            (300, 270, 200),
            (77, 33, 13),
        ]
    } else {
        &[(130, 144, 80), (33, 48, 16), (70, 50, 40), (9, 17, 13)]
    };
    for &shape in shapes {
        let (m, n, k) = shape;
        let (ha, hb) = (rng.bf16_vec(m * k, 1.0), rng.bf16_vec(k * n, 1.0));
        let (a, b) = (dev.upload(&ha)?, dev.upload(&hb)?);
        let mut c = dev.alloc_filled(m * n, bf16::NAN)?;
        launch(&dev, &a, &b, &mut c, shape)?;
        let err = rel_err(&c.to_vec()?, &host_matmul(&ha, &hb, shape));
        let form = if n % 16 == 0 && k % 16 == 0 {
            "divisible"
        } else {
            "plain"
        };
        println!("check {m}x{n}x{k} ({form} form) on {dev}: rel err {err:.2e}");
        anyhow::ensure!(err < 8e-3, "matmul disagrees with the host at {shape:?}");
    }
    if !dev.is_cuda() {
        return Ok(());
    }
    let blas = Cublas::new(&dev)?;
    let info = dev.info()?;
    let opts = TimingOptions {
        warmup: 3,
        reps: 20,
    };
    let specialize = std::env::var("TILEFUSE_SPECIALIZE").map_or(true, |v| v != "0");
    println!(
        "\n{} (TILEFUSE_SPECIALIZE {})",
        info.name,
        if specialize { "on" } else { "0" }
    );
    println!(
        "| GEMM (M x N x K) | tutorial, {} form | cuBLAS | % |",
        if specialize { "divisible" } else { "plain" }
    );
    println!("|---|---|---|---|");
    for (m, n, k) in [(4096, 4096, 4096), (512, 4096, 1024), (512, 1024, 3072)] {
        let sets = rotation_sets(2 * (m * k + k * n + m * n), info.l2_bytes).min(8);
        let a = replicate(&dev, &rng.bf16_vec(m * k, 1.0), sets)?;
        let b = replicate(&dev, &rng.bf16_vec(k * n, 1.0), sets)?;
        let mut c: Vec<Buffer<bf16>> = (0..sets)
            .map(|_| dev.alloc_filled(m * n, bf16::NAN))
            .collect::<Result<_, _>>()?;
        let mut want = dev.alloc_filled(m * n, bf16::NAN)?;
        blas.gemm_bf16(&a[0], &b[0], &mut want, m, n, k)?;
        launch(&dev, &a[0], &b[0], &mut c[0], (m, n, k))?;
        let want: Vec<f64> = want
            .to_vec()?
            .iter()
            .map(|x| f64::from(x.to_f32()))
            .collect();
        let err = rel_err(&c[0].to_vec()?, &want);
        anyhow::ensure!(err < 1e-2, "{m}x{n}x{k}: rel err {err:.2e} against cuBLAS");
        let flop = 2.0 * (m * n * k) as f64;
        let (ours, _) = perf::time_graph(&dev, sets, opts, |i| {
            launch(&dev, &a[i], &b[i], &mut c[i], (m, n, k))?;
            Ok::<(), PerfError>(())
        })?;
        let (theirs, _) = perf::time_graph(&dev, sets, opts, |i| {
            blas.gemm_bf16(&a[i], &b[i], &mut c[i], m, n, k)
        })?;
        let tf = |us: f64| flop / (us * 1e-6) / 1e12;
        println!(
            "| {m} x {n} x {k} | {:.0} TFLOP/s | {:.0} | {:.0}% |",
            tf(ours.median_us),
            tf(theirs.median_us),
            100.0 * theirs.median_us / ours.median_us
        );
    }
    Ok(())
}
