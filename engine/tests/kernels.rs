//! The decode kernels against an f64 host reference that rounds to bf16 where the
//! kernels (and `engine/src/reference.rs`) do.
//!
//! Every check runs on the interpreter at small, awkward shapes, and on the GPU (when
//! there is one; `TILEFUSE_REQUIRE_GPU=1` makes its absence a failure) at those shapes
//! plus Qwen3-0.6B's decode shapes. Inputs are fresh seeded random non-zero values;
//! outputs are poisoned (NaN) before each launch so unwritten elements fail.

mod common;

use common::kernel_checks::*;
use tilefuse_dsl::half::bf16;
use tilefuse_dsl::runtime::testing::gpu_or_skip;
use tilefuse_dsl::runtime::{Buffer, Device, KernelDef, LaunchConfig};
use tilefuse_engine::bench::Rng;
use tilefuse_engine::kernels::*;
use tilefuse_engine::sampling::kernels::*;
use tilefuse_engine::tuning::{self, GemvConfig};

/// A poisoned timeline buffer for a launch of `programs` programs stamped at slot 1
/// (slot 0 and the slot after the last program must stay unwritten).
fn stamps(dev: &Device, programs: usize) -> Buffer<i64> {
    dev.alloc_filled(4 * (programs + 2), -1i64).unwrap()
}

/// Every program wrote its own slot (entry <= past wait <= exit, an SM index) and
/// nothing else was written: the kernels' linear program index covers the grid once.
fn check_stamps(what: &str, buf: &Buffer<i64>, programs: usize) {
    let v = buf.to_vec().unwrap();
    assert_eq!(&v[..4], &[-1; 4], "{what}: slot 0 written");
    assert_eq!(
        &v[4 * (programs + 1)..],
        &[-1; 4],
        "{what}: slot past the grid written"
    );
    for (p, s) in v[4..4 * (programs + 1)].chunks(4).enumerate() {
        assert!(
            s[0] >= 0 && s[0] <= s[1] && s[1] <= s[2] && (0..1024).contains(&s[3]),
            "{what}: program {p} stamps {s:?}"
        );
    }
}

/// RMSNorm as the fused GEMVs apply it: `norm_w * x * inv_rms` in f32, not rounded to
/// bf16 (they scale the row sums by `inv_rms` at the end).
fn host_rms_norm_unrounded(x: &[f32], g: &[f32]) -> Vec<f32> {
    let mean_sq = x.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / x.len() as f64;
    let inv_rms = 1.0 / (mean_sq + EPS as f64).sqrt();
    x.iter()
        .zip(g)
        .map(|(&v, &w)| (w as f64 * v as f64 * inv_rms) as f32)
        .collect()
}

/// `bf16(g * bf16(x * inv_rms))` over one row, inv_rms in f32 as the kernels compute it.
fn host_rms_norm(x: &[f32], g: &[f32]) -> Vec<f32> {
    host_norm_rows(x, g, x.len())
}

/// Row dot products in f64: `(Σ w·a, Σ |w·a|)` per row.
fn host_matvec(w: &[f32], a: &[f32], n: usize, k: usize) -> Vec<(f64, f64)> {
    (0..n)
        .map(|r| {
            let row = &w[r * k..(r + 1) * k];
            row.iter().zip(a).fold((0.0, 0.0), |(s, m), (&wi, &ai)| {
                let t = wi as f64 * ai as f64;
                (s + t, m + t.abs())
            })
        })
        .collect()
}

struct GemvCase {
    x: Vec<bf16>,
    g: Vec<bf16>,
    w: Vec<bf16>,
    b: Vec<bf16>,
}

fn gemv_case(rng: &mut Rng, rows: usize, k: usize) -> GemvCase {
    GemvCase {
        x: rng.bf16_vec(k, 2.0),
        g: rng.bf16_vec(k, 1.5),
        w: rng.bf16_vec(rows * k, 0.1),
        b: rng.bf16_vec(rows, 0.5),
    }
}

/// A few variants for the interpreter, single- and double-buffered (each kernel's
/// compiled `STAGES = 2` tile; at the small shapes' k = 1032 they request the tile
/// after each one they use, the last one past the end), and reducing each tile as it
/// arrives (at k = 1032, a 1024-column tile and a masked one, or one 4096-column tile).
fn configs_for_cpu() -> Vec<GemvConfig> {
    let c = |block_n, block_k, num_warps, stages, reduce_each| GemvConfig {
        block_n,
        block_k,
        num_warps,
        stages,
        stream: 0,
        programs: 0,
        reduce_each,
    };
    vec![
        c(1, 256, 4, 1, 0),
        c(8, 512, 8, 1, 0),
        c(4, 1024, 4, 1, 0),
        c(8, 512, 4, 2, 0),
        c(2, 1024, 8, 2, 0),
        c(8, 256, 4, 2, 0),
        c(16, 256, 4, 2, 0),
        c(4, 1024, 4, 1, 1),
        c(16, 1024, 4, 1, 1),
        c(2, 2048, 8, 1, 1),
        c(2, 4096, 8, 1, 1),
    ]
}

/// Variants to run at a shape: a few on the interpreter, every compiled one on a GPU.
fn configs(dev: &Device, def: &KernelDef, n: usize, k: usize) -> Vec<GemvConfig> {
    let compiled = |c: &GemvConfig| def.variant(&c.consts_for(def), Some(c.num_warps)).is_ok();
    if dev.is_cuda() {
        let mut c = tuning::gemv_variants(def);
        c.push(tuning::gemv_config(n, k));
        c.retain(compiled);
        c
    } else {
        // The interpreter ignores the warp count: any compiled one of the shape will do.
        configs_for_cpu()
            .into_iter()
            .filter_map(|c| {
                [c, GemvConfig { num_warps: 4, ..c }]
                    .into_iter()
                    .find(compiled)
            })
            .collect()
    }
}

const SMALL_GEMV: [(usize, usize); 5] = [(1, 8), (13, 8), (13, 200), (1, 1032), (13, 1032)];
const QWEN_QKV: (usize, usize) = (4096, 1024);
const QWEN_O: (usize, usize) = (1024, 2048);
const QWEN_DOWN: (usize, usize) = (1024, 3072);

fn gemv_shapes(dev: &Device, big: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let mut s = SMALL_GEMV.to_vec();
    if dev.is_cuda() {
        s.extend_from_slice(big);
    }
    s
}

#[test]
fn rms_norm_gemv_matches_host() {
    let mut rng = Rng::new(101);
    for dev in devices("rms_norm_gemv_matches_host") {
        for (n, k) in gemv_shapes(&dev, &[QWEN_QKV]) {
            let c = gemv_case(&mut rng, n, k);
            let xn = host_rms_norm_unrounded(&f32s(&c.x), &f32s(&c.g));
            let dots = host_matvec(&f32s(&c.w), &xn, n, k);
            let want: Vec<f64> = dots
                .iter()
                .zip(&c.b)
                .map(|(d, b)| d.0 + b.to_f64())
                .collect();
            let tol: Vec<f64> = dots
                .iter()
                .zip(&want)
                .map(|(d, w)| tol_bf16(*w, d.1))
                .collect();
            let (x, g, w, b) = (
                dev.upload(&c.x).unwrap(),
                dev.upload(&c.g).unwrap(),
                dev.upload(&c.w).unwrap(),
                dev.upload(&c.b).unwrap(),
            );
            for cfg in configs(&dev, &RMS_NORM_GEMV, n, k) {
                let mut y = dev.alloc_filled(n, bf16::NAN).unwrap();
                let programs = cfg.grid(n) as usize;
                let mut st = stamps(&dev, programs);
                launch(
                    &RMS_NORM_GEMV,
                    &dev,
                    LaunchConfig::from(cfg.grid(n)).num_warps(cfg.num_warps),
                    &cfg.consts_for(&RMS_NORM_GEMV),
                    &mut [
                        (&x).into(),
                        (&g).into(),
                        (&w).into(),
                        (&b).into(),
                        (&mut y).into(),
                        (n as i32).into(),
                        (k as i32).into(),
                        EPS.into(),
                        (&mut st).into(),
                        1i32.into(),
                    ],
                );
                let what = format!("rms_norm_gemv {n}x{k} {cfg:?} on {dev}");
                check_stamps(&what, &st, programs);
                let got = f32s(&y.to_vec().unwrap());
                check(&what, &got, &want, &tol);
            }
        }
    }
}

#[test]
fn gemv_residual_matches_host() {
    let mut rng = Rng::new(202);
    for dev in devices("gemv_residual_matches_host") {
        for (n, k) in gemv_shapes(&dev, &[QWEN_O, QWEN_DOWN]) {
            let c = gemv_case(&mut rng, n, k);
            let x_old = rng.bf16_vec(n, 4.0);
            let a = f32s(&c.x);
            let dots = host_matvec(&f32s(&c.w), &a, n, k);
            let proj: Vec<f64> = dots
                .iter()
                .zip(&c.b)
                .map(|(d, b)| d.0 + b.to_f64())
                .collect();
            let want: Vec<f64> = proj
                .iter()
                .zip(&x_old)
                .map(|(p, x)| p + x.to_f64())
                .collect();
            // Two roundings: the projection, then the residual sum.
            let tol: Vec<f64> = (0..n)
                .map(|i| tol_bf16(want[i], dots[i].1) + proj[i].abs() / 128.0)
                .collect();
            let (w, av, b) = (
                dev.upload(&c.w).unwrap(),
                dev.upload(&c.x).unwrap(),
                dev.upload(&c.b).unwrap(),
            );
            for cfg in configs(&dev, &GEMV_RESIDUAL, n, k) {
                let mut x = dev.upload(&x_old).unwrap();
                let programs = cfg.grid(n) as usize;
                let mut st = stamps(&dev, programs);
                launch(
                    &GEMV_RESIDUAL,
                    &dev,
                    LaunchConfig::from(cfg.grid(n)).num_warps(cfg.num_warps),
                    &cfg.consts_for(&GEMV_RESIDUAL),
                    &mut [
                        (&w).into(),
                        (&av).into(),
                        (&b).into(),
                        (&mut x).into(),
                        (n as i32).into(),
                        (k as i32).into(),
                        (&mut st).into(),
                        1i32.into(),
                    ],
                );
                let what = format!("gemv_residual {n}x{k} {cfg:?} on {dev}");
                check_stamps(&what, &st, programs);
                let got = f32s(&x.to_vec().unwrap());
                check(&what, &got, &want, &tol);
            }
        }
    }
}

#[test]
fn rms_norm_gate_up_matches_host() {
    let mut rng = Rng::new(303);
    for dev in devices("rms_norm_gate_up_matches_host") {
        let mut shapes = vec![(1, 8), (13, 200), (5, 1032)];
        if dev.is_cuda() {
            shapes.push((3072, 1024));
        }
        for (inter, k) in shapes {
            let c = gemv_case(&mut rng, 2 * inter, k);
            let xn = host_rms_norm_unrounded(&f32s(&c.x), &f32s(&c.g));
            let dots = host_matvec(&f32s(&c.w), &xn, 2 * inter, k);
            let mut want = Vec::new();
            let mut tol = Vec::new();
            for r in 0..inter {
                let (g, u) = (dots[r], dots[inter + r]);
                // silu rounded, times up rounded, as the kernel does, from the exact
                // gate and up rounded once.
                let gate = bf(g.0 as f32);
                let silu = bf(gate / (1.0 + (-gate).exp())) as f64;
                let up = bf(u.0 as f32) as f64;
                let act = silu * up;
                want.push(act);
                // Up to one ulp each for gate, up, silu and the product, plus the
                // accumulation error of both dot products carried through.
                let dsilu = 1.1; // |silu'(x)| < 1.1
                tol.push(
                    act.abs() * 4.0 / 128.0
                        + (g.0.abs() / 128.0 + g.1 * 1e-4) * dsilu * up.abs()
                        + (u.0.abs() / 128.0 + u.1 * 1e-4) * silu.abs()
                        + 1e-30,
                );
            }
            let (x, g, w) = (
                dev.upload(&c.x).unwrap(),
                dev.upload(&c.g).unwrap(),
                dev.upload(&c.w).unwrap(),
            );
            for cfg in configs(&dev, &RMS_NORM_GATE_UP, inter, k) {
                let mut act = dev.alloc_filled(inter, bf16::NAN).unwrap();
                let programs = cfg.grid(inter) as usize;
                let mut st = stamps(&dev, programs);
                launch(
                    &RMS_NORM_GATE_UP,
                    &dev,
                    LaunchConfig::from(cfg.grid(inter)).num_warps(cfg.num_warps),
                    &cfg.consts_for(&RMS_NORM_GATE_UP),
                    &mut [
                        (&x).into(),
                        (&g).into(),
                        (&w).into(),
                        (&mut act).into(),
                        (inter as i32).into(),
                        (k as i32).into(),
                        EPS.into(),
                        (&mut st).into(),
                        1i32.into(),
                    ],
                );
                let what = format!("rms_norm_gate_up inter={inter} k={k} {cfg:?} on {dev}");
                check_stamps(&what, &st, programs);
                let got = f32s(&act.to_vec().unwrap());
                check(&what, &got, &want, &tol);
            }
        }
    }
}

#[test]
fn embed_copies_the_token_row() {
    let mut rng = Rng::new(404);
    for dev in devices("embed_copies_the_token_row") {
        for (vocab, h) in [(3, 13), (7, 1000), (5, 2056)] {
            let table = rng.bf16_vec(vocab * h, 1.0);
            let tb = dev.upload(&table).unwrap();
            for token in [0, vocab - 1] {
                let state = dev.upload(&[token as i32, 17]).unwrap();
                let mut x = dev.alloc_filled(h, bf16::NAN).unwrap();
                launch(
                    &EMBED,
                    &dev,
                    LaunchConfig::from(h.div_ceil(1024) as u32),
                    &[1024],
                    &mut [
                        (&tb).into(),
                        (&state).into(),
                        (&mut x).into(),
                        (h as i32).into(),
                    ],
                );
                let got = x.to_vec().unwrap();
                assert_eq!(
                    got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    table[token * h..(token + 1) * h]
                        .iter()
                        .map(|v| v.to_bits())
                        .collect::<Vec<_>>(),
                    "embed token {token} h={h} on {dev}"
                );
            }
        }
    }
}

/// Runs `lm_head_argmax` + `argmax_finish`; returns (logits, token, new position).
fn run_lm_head(
    dev: &Device,
    cfg: GemvConfig,
    bufs: (&Buffer<bf16>, &Buffer<bf16>, &Buffer<bf16>),
    n: usize,
    k: usize,
    pos: i32,
) -> (Vec<f32>, i32, i32) {
    let parts = cfg.grid(n) as usize;
    let mut logits = dev.alloc_filled(n, f32::NAN).unwrap();
    let mut pv = dev.alloc_filled(parts, f32::NAN).unwrap();
    let mut pi = dev.alloc_filled(parts, -1i32).unwrap();
    let mut state = dev.upload(&[-5i32, pos]).unwrap();
    launch(
        &LM_HEAD_ARGMAX,
        dev,
        LaunchConfig::from(parts as u32).num_warps(cfg.num_warps),
        &cfg.consts_for(&LM_HEAD_ARGMAX),
        &mut [
            bufs.0.into(),
            bufs.1.into(),
            bufs.2.into(),
            (&mut logits).into(),
            (&mut pv).into(),
            (&mut pi).into(),
            (n as i32).into(),
            (k as i32).into(),
            EPS.into(),
        ],
    );
    let (b, warps) = tuning::argmax_finish_config(parts);
    launch(
        &ARGMAX_FINISH,
        dev,
        LaunchConfig::from(1).num_warps(warps),
        &[b as i64],
        &mut [
            (&pv).into(),
            (&pi).into(),
            (&mut state).into(),
            (parts as i32).into(),
        ],
    );
    let s = state.to_vec().unwrap();
    (logits.to_vec().unwrap(), s[0], s[1])
}

/// First index of the largest value.
fn first_argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best
}

#[test]
fn lm_head_argmax_matches_host() {
    let mut rng = Rng::new(505);
    for dev in devices("lm_head_argmax_matches_host") {
        let mut shapes = vec![(1, 8), (13, 200), (37, 1032)];
        if dev.is_cuda() {
            shapes.push((151_936, 1024));
        }
        for (n, k) in shapes {
            let c = gemv_case(&mut rng, n, k);
            let xn = host_rms_norm(&f32s(&c.x), &f32s(&c.g));
            let dots = host_matvec(&f32s(&c.w), &xn, n, k);
            let want: Vec<f64> = dots.iter().map(|d| d.0).collect();
            let tol: Vec<f64> = dots.iter().map(|d| tol_bf16(d.0, d.1)).collect();
            let (x, g, w) = (
                dev.upload(&c.x).unwrap(),
                dev.upload(&c.g).unwrap(),
                dev.upload(&c.w).unwrap(),
            );
            let mut cfgs = if dev.is_cuda() {
                tuning::gemv_variants(&LM_HEAD_ARGMAX)
            } else {
                let mut v = configs_for_cpu();
                v.push(GemvConfig {
                    block_n: 16,
                    block_k: 256,
                    num_warps: 8,
                    stages: 1,
                    stream: 0,
                    programs: 0,
                    reduce_each: 0,
                });
                v
            };
            cfgs.push(tuning::lm_head_config(n, k));
            // Smaller grids, each program taking several row blocks, with and without
            // requesting the next block early (STREAM); on the GPU at the real shape too.
            let grids: &[usize] = if n > 100_000 {
                &[264, 1056]
            } else {
                &[1, 2, 3]
            };
            let streamed: Vec<GemvConfig> = cfgs
                .iter()
                .flat_map(|&c| {
                    grids.iter().flat_map(move |&programs| {
                        [0, 1].map(|stream| GemvConfig {
                            programs,
                            stream,
                            ..c
                        })
                    })
                })
                .collect();
            cfgs.extend(streamed);
            // Only compiled variants; on the interpreter the warp count is irrelevant.
            let cfgs = cfgs.into_iter().filter_map(|c| {
                [
                    c,
                    GemvConfig { num_warps: 4, ..c },
                    GemvConfig { num_warps: 8, ..c },
                ]
                .into_iter()
                .find(|c| {
                    LM_HEAD_ARGMAX
                        .variant(&c.consts_for(&LM_HEAD_ARGMAX), Some(c.num_warps))
                        .is_ok()
                })
            });
            for cfg in cfgs {
                let (logits, token, pos) = run_lm_head(&dev, cfg, (&x, &g, &w), n, k, 41);
                let what = format!("lm_head_argmax {n}x{k} {cfg:?} on {dev}");
                check(&what, &logits, &want, &tol);
                assert!(
                    logits.iter().all(|v| bf(*v) == *v),
                    "{what}: logits not bf16"
                );
                assert_eq!(token as usize, first_argmax(&logits), "{what}: token");
                assert_eq!(pos, 42, "{what}: state[1] must advance");
            }
        }
    }
}

/// Equal largest logits in different row blocks and programs: every grid and
/// streaming mode picks the first row.
#[test]
fn lm_head_takes_first_of_ties_across_programs() {
    let mut rng = Rng::new(515);
    for dev in devices("lm_head_takes_first_of_ties_across_programs") {
        let (n, k) = (37, 200);
        let mut c = gemv_case(&mut rng, n, k);
        // Rows 5, 14 and 30 are the same row, far above the others: the sign of each
        // normalized input, so every product is positive.
        let top: Vec<bf16> =
            c.x.iter()
                .zip(&c.g)
                .map(|(x, g)| bf16::from_f32((x.to_f32() * g.to_f32()).signum()))
                .collect();
        for r in [30, 14, 5] {
            c.w[r * k..(r + 1) * k].copy_from_slice(&top);
        }
        let (x, g, w) = (
            dev.upload(&c.x).unwrap(),
            dev.upload(&c.g).unwrap(),
            dev.upload(&c.w).unwrap(),
        );
        for block_n in [4, 8, 16] {
            for programs in [0, 1, 2, 3] {
                for stream in [0, 1] {
                    let cfg = GemvConfig {
                        block_n,
                        block_k: 256,
                        num_warps: 4,
                        stages: 1,
                        stream,
                        programs,
                        reduce_each: 0,
                    };
                    let (logits, token, _) = run_lm_head(&dev, cfg, (&x, &g, &w), n, k, 0);
                    assert!(logits[5] == logits[14] && logits[5] == logits[30]);
                    assert_eq!(first_argmax(&logits), 5, "the tied rows lead");
                    assert_eq!(token, 5, "{cfg:?} on {dev}");
                }
            }
        }
    }
}

#[test]
fn argmax_finish_takes_first_of_ties_across_blocks() {
    let mut rng = Rng::new(606);
    for dev in devices("argmax_finish_takes_first_of_ties_across_blocks") {
        for (parts, b, warps) in [
            (1usize, 256i64, 4),
            (600, 256, 4),
            (600, 1024, 4),
            (5000, 4096, 8),
            (9496, 16384, 16),
            (20000, 16384, 16),
        ] {
            let vals: Vec<f32> = (0..parts).map(|_| rng.uniform(-3.0, 3.0)).collect();
            let mut vals = vals;
            // A tie for the maximum: the first must win, also across loop blocks.
            if parts > 1 {
                vals[parts / 2] = 10.0;
                vals[parts - 1] = 10.0;
            }
            let idx: Vec<i32> = (0..parts as i32).map(|i| 3 * i + 1).collect();
            let pv = dev.upload(&vals).unwrap();
            let pi = dev.upload(&idx).unwrap();
            let mut state = dev.upload(&[-1i32, 7]).unwrap();
            launch(
                &ARGMAX_FINISH,
                &dev,
                LaunchConfig::from(1).num_warps(warps),
                &[b],
                &mut [
                    (&pv).into(),
                    (&pi).into(),
                    (&mut state).into(),
                    (parts as i32).into(),
                ],
            );
            let s = state.to_vec().unwrap();
            let want = idx[first_argmax(&vals)];
            assert_eq!(
                s,
                vec![want, 8],
                "argmax_finish parts={parts} B={b} warps={warps} on {dev}"
            );
        }
    }
}

/// QK-norm (optional) and RoPE of one head on the host, rounding like the kernel.
/// Returns the rotated head and a tolerance per element: one ulp of the output, and
/// with QK-norm one ulp of an input (inv_rms's summation order can move a rounding).
fn host_norm_rope(
    x: &[f32],
    w: &[f32],
    use_norm: bool,
    c: &[f32],
    s: &[f32],
) -> (Vec<f32>, Vec<f64>) {
    let d = x.len();
    let half = d / 2;
    let xn = if use_norm {
        host_rms_norm(x, w)
    } else {
        x.to_vec()
    };
    let mut out = vec![0.0f32; d];
    let mut tol = vec![0.0f64; d];
    for i in 0..half {
        let (a, b) = (xn[i], xn[i + half]);
        out[i] = bf(bf(a * c[i]) + bf(-b * s[i]));
        out[i + half] = bf(bf(b * c[i]) + bf(a * s[i]));
        let moved = if use_norm {
            ((a * c[i]).abs() + (b * s[i]).abs() + (b * c[i]).abs() + (a * s[i]).abs()) as f64
                / 128.0
        } else {
            0.0
        };
        tol[i] = out[i].abs() as f64 / 128.0 + moved + 1e-6;
        tol[i + half] = out[i + half].abs() as f64 / 128.0 + moved + 1e-6;
    }
    (out, tol)
}

/// Within `tol`, and exact except where inv_rms's f32 summation order moves a rounding
/// (at least 99% of the elements).
fn near(what: &str, got: &[f32], want: &[f32], tol: &[f64]) {
    let w64: Vec<f64> = want.iter().map(|v| *v as f64).collect();
    let tol: Vec<f64> = tol.iter().map(|t| t.max(1e-6)).collect();
    check(what, got, &w64, &tol);
    let exact = got.iter().zip(want).filter(|(a, b)| a == b).count();
    assert!(
        exact * 100 >= got.len() * 99,
        "{what}: only {exact} of {} exact",
        got.len()
    );
}

struct AttnCase {
    d: usize,
    num_kv: usize,
    group: usize,
    g: usize,
    seq: usize,
    max_seq: usize,
}

/// Host attention for one query head: f64 sums, scores rounded as the kernel does.
/// Returns (output, weighted mean |v| per dim) for the tolerance.
/// The tolerance term covers scores whose bf16 rounding the f32 summation order of `q·k`
/// can move (their dot lies next to a rounding midpoint).
fn host_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    seq: usize,
    d: usize,
    scale: f32,
) -> (Vec<f64>, Vec<f64>) {
    let mut ambiguous = vec![false; seq];
    let scores: Vec<f64> = (0..seq)
        .map(|p| {
            let dot: f64 = (0..d).map(|i| q[i] as f64 * k[p * d + i] as f64).sum();
            ambiguous[p] = bf((dot * (1.0 + 1e-5)) as f32) != bf((dot * (1.0 - 1e-5)) as f32);
            bf(bf(dot as f32) * scale) as f64
        })
        .collect();
    let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let p: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
    let l: f64 = p.iter().sum();
    let out = (0..d)
        .map(|i| (0..seq).map(|s| p[s] * v[s * d + i] as f64).sum::<f64>() / l)
        .collect();
    let mag = (0..d)
        .map(|i| {
            let mean = (0..seq)
                .map(|s| p[s] * (v[s * d + i] as f64).abs())
                .sum::<f64>();
            let moved = (0..seq)
                .filter(|&s| ambiguous[s])
                .map(|s| p[s] * (1.0 + (v[s * d + i] as f64).abs()))
                .sum::<f64>();
            (4e-3 * mean + 0.05 * moved) / l
        })
        .collect();
    (out, mag)
}

/// One decode-attention step at position `c.seq - 1`: `attention_split` (QK-norm when
/// `use_norm`, RoPE, the KV append, the split pass) then `attention_combine`, for each
/// split count, with `[BS, STAGES, CLUSTER]`; with `CLUSTER > 1`, the clustered
/// `attention_split` alone (each split count must then equal `CLUSTER`). Checks the
/// rotated queries and the appended cache row against the host, that no other cache row
/// changed, and the output against host attention over the kernel's own queries and
/// cache.
fn check_attention(
    dev: &Device,
    rng: &mut Rng,
    c: &AttnCase,
    use_norm: bool,
    [bs, stages, cluster]: [usize; 3],
    splits_list: &[(usize, usize)],
) {
    let (nh, nkv, d) = (c.num_kv * c.group, c.num_kv, c.d);
    let pos = c.seq - 1;
    let scale = (d as f32).powf(-0.5);
    let qkv = rng.bf16_vec((nh + 2 * nkv) * d, 3.0);
    let (qw, kw) = (rng.bf16_vec(d, 1.5), rng.bf16_vec(d, 1.5));
    let (cos, sin) = rope_tables(d, c.max_seq, 1e6);
    // Rows from `pos` on are poison: the kernel must write row `pos` before any use and
    // never read past it.
    let mut kc0 = rng.bf16_vec(nkv * c.max_seq * d, 1.0);
    let mut vc0 = rng.bf16_vec(nkv * c.max_seq * d, 1.0);
    for h in 0..nkv {
        for p in pos..c.max_seq {
            let row = (h * c.max_seq + p) * d;
            kc0[row..row + d].fill(bf16::NAN);
            vc0[row..row + d].fill(bf16::NAN);
        }
    }

    // Host: rotated queries, and the cache rows the step appends.
    let half = d / 2;
    let (cp, sp) = (
        &cos[pos * half..(pos + 1) * half],
        &sin[pos * half..(pos + 1) * half],
    );
    let head = |h: usize| f32s(&qkv[h * d..(h + 1) * d]);
    let (mut want_q, mut tol_q) = (Vec::new(), Vec::new());
    for h in 0..nh {
        let (o, t) = host_norm_rope(&head(h), &f32s(&qw), use_norm, cp, sp);
        want_q.extend(o);
        tol_q.extend(t);
    }
    let mut want_k = f32s(&kc0);
    let mut want_v = f32s(&vc0);
    let mut tol_k = vec![0.0f64; want_k.len()];
    for h in 0..nkv {
        let row = (h * c.max_seq + pos) * d;
        let (o, t) = host_norm_rope(&head(nh + h), &f32s(&kw), use_norm, cp, sp);
        want_k[row..row + d].copy_from_slice(&o);
        tol_k[row..row + d].copy_from_slice(&t);
        want_v[row..row + d].copy_from_slice(&head(nh + nkv + h));
    }

    let up = |v: &[bf16]| dev.upload(v).unwrap();
    let (qkv_b, qw_b, kw_b) = (up(&qkv), up(&qw), up(&kw));
    let (cos_b, sin_b) = (dev.upload(&cos).unwrap(), dev.upload(&sin).unwrap());
    let state = dev.upload(&[0i32, pos as i32]).unwrap();
    // Words for the quantized prefetch range (an odd count: the shares' ends are
    // checked by the interpreter).
    let words_b = dev.upload(&vec![7u32; 1001]).unwrap();
    for &(splits, min_chunk) in splits_list {
        // The combine's column chunk: whole heads and 32-column pieces in turn.
        let dc = if splits % 2 == 0 { 32.min(d) } else { d };
        let what = format!(
            "attention D={d} kv={nkv} group={} G={} pos={pos} norm={use_norm} BS={bs} \
             STAGES={stages} CLUSTER={cluster} splits={splits} min_chunk={min_chunk} DC={dc} \
             on {dev}",
            c.group, c.g
        );
        assert!(
            cluster == 1 || splits == cluster,
            "{what}: a cluster per KV head"
        );
        let (mut kc, mut vc) = (up(&kc0), up(&vc0));
        let mut q_out = dev.alloc_filled(nh * d, bf16::NAN).unwrap();
        let slots = nh * splits;
        let mut pm = dev.alloc_filled(slots, f32::NAN).unwrap();
        let mut pl = dev.alloc_filled(slots, f32::NAN).unwrap();
        let mut pa = dev.alloc_filled(slots * d, f32::NAN).unwrap();
        let mut out = dev.alloc_filled(nh * d, bf16::NAN).unwrap();
        let split_programs = nkv * splits * c.group.div_ceil(c.g);
        let mut split_stamps = stamps(dev, split_programs);
        let consts = AttentionSplitConsts {
            d,
            g: c.g,
            bs,
            stages,
            cluster,
        };
        AttentionSplitArgs {
            qkv: &qkv_b,
            q_norm_w: &qw_b,
            k_norm_w: &kw_b,
            rope_cos: &cos_b,
            rope_sin: &sin_b,
            state: &state,
            k_cache: &mut kc,
            v_cache: &mut vc,
            q_out: &mut q_out,
            part_m: &mut pm,
            part_l: &mut pl,
            part_acc: &mut pa,
            out: &mut out,
            group: c.group as i32,
            max_seq: c.max_seq as i32,
            min_chunk: min_chunk as i32,
            use_norm: i32::from(use_norm),
            eps: EPS,
            scale,
            // Prefetch the projection: the interpreter checks the ranges.
            prefetch_w: &qkv_b,
            prefetch_len: qkv_b.len() as i32,
            prefetch_q: &words_b,
            prefetch_q_len: words_b.len() as i32,
            stamps: &mut split_stamps,
            stamp_at: 1,
        }
        .launch(
            dev,
            LaunchConfig::from((nkv as u32, splits as u32, c.group.div_ceil(c.g) as u32)),
            consts,
        )
        .unwrap_or_else(|e| panic!("attention_split {consts:?} on {dev}: {e}"));
        check_stamps(&format!("{what}: split"), &split_stamps, split_programs);
        if cluster == 1 {
            let combine_programs = nh * (d / dc);
            let mut combine_stamps = stamps(dev, combine_programs);
            let consts = AttentionCombineConsts {
                d,
                s: tuning::combine_s(splits),
                dc,
            };
            AttentionCombineArgs {
                part_m: &pm,
                part_l: &pl,
                part_acc: &pa,
                out: &mut out,
                splits: splits as i32,
                stamps: &mut combine_stamps,
                stamp_at: 1,
            }
            .launch(
                dev,
                LaunchConfig::from((nh as u32, (d / dc) as u32)),
                consts,
            )
            .unwrap_or_else(|e| panic!("attention_combine {consts:?} on {dev}: {e}"));
            check_stamps(
                &format!("{what}: combine"),
                &combine_stamps,
                combine_programs,
            );
        }

        let got_q = f32s(&q_out.to_vec().unwrap());
        near(&format!("{what}: q"), &got_q, &want_q, &tol_q);
        // The cache: row `pos` appended, every other row untouched (poison included).
        let got_k = f32s(&kc.to_vec().unwrap());
        let got_v = f32s(&vc.to_vec().unwrap());
        let appended = |i: usize| (i / d) % c.max_seq == pos;
        let same = |a: f32, b: f32| a == b || (a.is_nan() && b.is_nan());
        for (name, got, want) in [("k", &got_k, &want_k), ("v", &got_v, &want_v)] {
            let bad = (0..got.len())
                .filter(|&i| !appended(i) && !same(got[i], want[i]))
                .count();
            assert_eq!(bad, 0, "{what}: {name} cache rows other than {pos} changed");
        }
        let rows: Vec<usize> = (0..got_k.len()).filter(|&i| appended(i)).collect();
        let pick = |v: &[f32]| rows.iter().map(|&i| v[i]).collect::<Vec<f32>>();
        let tol_rows: Vec<f64> = rows.iter().map(|&i| tol_k[i]).collect();
        near(
            &format!("{what}: k row"),
            &pick(&got_k),
            &pick(&want_k),
            &tol_rows,
        );
        assert_eq!(pick(&got_v), pick(&want_v), "{what}: v row");

        // The output, against host attention over the kernel's queries and cache.
        let mut want = Vec::new();
        let mut tol = Vec::new();
        for h in 0..nh {
            let base = (h / c.group) * c.max_seq * d;
            let (o, mag) = host_attention(
                &got_q[h * d..(h + 1) * d],
                &got_k[base..base + c.seq * d],
                &got_v[base..base + c.seq * d],
                c.seq,
                d,
                scale,
            );
            for i in 0..d {
                want.push(o[i]);
                // The output rounding, plus a score that rounds the other way.
                tol.push(o[i].abs() / 128.0 + mag[i] + 1e-6);
            }
        }
        check(&what, &f32s(&out.to_vec().unwrap()), &want, &tol);
    }
}

#[test]
fn attention_small_contexts_all_groups() {
    let mut rng = Rng::new(808);
    for dev in devices("attention_small_contexts_all_groups") {
        // (group, G): 1/1, 2/2, 4/4, 3 padded to 4, and groups of 8 and 7 over two
        // programs of G = 4 each.
        for (group, g) in [(1, 1), (2, 2), (4, 4), (3, 4), (8, 4), (7, 4)] {
            for seq in [1, 3, 37, 100] {
                let c = AttnCase {
                    d: 32,
                    num_kv: 2,
                    group,
                    g,
                    seq,
                    max_seq: seq + 5,
                };
                // More splits than blocks leaves some empty (seq 1 and 3 with 8 splits).
                let norm = (seq + group) % 2 == 1;
                // Both compiled position tiles, and single and double buffering (both
                // meet programs of several tiles at 37 and 100 positions).
                let bs = if group % 2 == 0 { 64 } else { 32 };
                let stages = 1 + (seq + group) % 2;
                check_attention(
                    &dev,
                    &mut rng,
                    &c,
                    norm,
                    [bs, stages, 1],
                    &[(1, 1), (3, 1), (8, 1), (8, 64)],
                );
                // Two programs a cluster merging in the kernel: the second takes the
                // new position alone, the first every cached one.
                check_attention(
                    &dev,
                    &mut rng,
                    &c,
                    !norm,
                    [32, stages, 2],
                    &[(2, 1), (2, 64)],
                );
            }
        }
        // The Qwen3-0.6B head size on a short context.
        let c = AttnCase {
            d: 128,
            num_kv: 1,
            group: 2,
            g: 2,
            seq: 37,
            max_seq: 40,
        };
        for norm in [false, true] {
            check_attention(
                &dev,
                &mut rng,
                &c,
                norm,
                [32, if norm { 2 } else { 1 }, 1],
                &[(2, 1), (16, 1), (16, 20), (3, 96)],
            );
            check_attention(&dev, &mut rng, &c, norm, [32, 2, 2], &[(2, 1), (2, 32)]);
        }
        // D = 64 at the first position and at the last row of the cache.
        for seq in [1, 70] {
            let c = AttnCase {
                d: 64,
                num_kv: 3,
                group: 1,
                g: 1,
                seq,
                max_seq: 70,
            };
            check_attention(
                &dev,
                &mut rng,
                &c,
                true,
                [32, 2, 1],
                &[(1, 1), (4, 1), (4, 32)],
            );
        }
    }
}

#[test]
fn attention_qwen3_shape_on_gpu() {
    let Some(dev) = gpu_or_skip("attention_qwen3_shape_on_gpu") else {
        return;
    };
    let mut rng = Rng::new(909);
    let c = AttnCase {
        d: 128,
        num_kv: 8,
        group: 2,
        g: 2,
        seq: 4096,
        max_seq: 4096,
    };
    let default = tuning::attention_config(4096);
    check_attention(
        &dev,
        &mut rng,
        &c,
        true,
        [32, 2, 1],
        &[
            (1, 1),
            (7, 1),
            (default.splits, default.min_chunk),
            (64, 1),
            (64, 256),
        ],
    );
    let c = AttnCase { g: 1, ..c };
    check_attention(&dev, &mut rng, &c, true, [64, 1, 1], &[(32, 1), (64, 1)]);
    let c = AttnCase { g: 2, ..c };
    check_attention(&dev, &mut rng, &c, true, [64, 1, 1], &[(19, 64)]);
    check_attention(
        &dev,
        &mut rng,
        &c,
        true,
        [64, default.stages, 1],
        &[(default.splits, 64)],
    );
    // Clusters of 8 and 16 programs merging in the kernel (distributed shared memory),
    // with both buffering depths, at 4096 positions and at 37 (most splits empty).
    for (cluster, stages) in [(8, 2), (16, 1), (16, 2)] {
        check_attention(
            &dev,
            &mut rng,
            &c,
            true,
            [64, stages, cluster],
            &[(cluster, 64)],
        );
    }
    let short = AttnCase {
        seq: 37,
        max_seq: 40,
        ..c
    };
    for cluster in [8, 16] {
        check_attention(
            &dev,
            &mut rng,
            &short,
            true,
            [64, 1, cluster],
            &[(cluster, 1), (cluster, 64)],
        );
    }
    // Without QK-norm, at a context that is not a multiple of the tile.
    let c = AttnCase {
        seq: 1000,
        max_seq: 1024,
        ..c
    };
    check_attention(&dev, &mut rng, &c, false, [64, 2, 16], &[(16, 64)]);
}

/// One device draw: `sample_draw`, `sample_check`, `sample_pick` over `logits` with
/// `state = [greedy, pos]`; `Some(token)` if a draw was accepted (then `state[0]` must
/// hold it), `None` if the host must draw.
fn device_draw(
    dev: &Device,
    logits: &Buffer<f32>,
    n: usize,
    greedy: usize,
    pos: i32,
    params: &tilefuse_engine::Sampling,
) -> Option<u32> {
    let (b, r, pb) = (1024usize, 4usize, 64usize);
    let parts = n.div_ceil(b);
    let fparams = dev.upload(&[params.temperature, params.top_p]).unwrap();
    let iparams = dev
        .upload(&[params.top_k as i32, params.seed as i32])
        .unwrap();
    let mut state = dev.upload(&[greedy as i32, pos]).unwrap();
    let mut part_val = dev.alloc_filled(parts * r, f32::NAN).unwrap();
    let mut part_idx = dev.alloc_filled(parts * r, -1i32).unwrap();
    let mut cnt = dev.alloc_filled(parts * r, -1i32).unwrap();
    let mut mass = dev.alloc_filled(parts * r, f32::NAN).unwrap();
    let mut z = dev.alloc_filled(parts, f32::NAN).unwrap();
    let mut result = dev.alloc_filled(2, -1i32).unwrap();
    let lists = n.div_ceil(4096);
    let mut part_top = dev.alloc_filled(lists * 64, f32::NAN).unwrap();
    let mut zk = dev.alloc_filled(1, f32::NAN).unwrap();
    launch(
        &SAMPLE_DRAW,
        dev,
        LaunchConfig::from(parts as u32),
        &[b as i64, r as i64],
        &mut [
            logits.into(),
            (&fparams).into(),
            (&iparams).into(),
            (&state).into(),
            (&mut part_val).into(),
            (&mut part_idx).into(),
            (n as i32).into(),
        ],
    );
    launch(
        &SAMPLE_CHECK,
        dev,
        LaunchConfig::from(parts as u32),
        &[b as i64, r as i64, pb as i64],
        &mut [
            logits.into(),
            (&fparams).into(),
            (&state).into(),
            (&part_val).into(),
            (&part_idx).into(),
            (&mut cnt).into(),
            (&mut mass).into(),
            (&mut z).into(),
            (n as i32).into(),
            (parts as i32).into(),
        ],
    );
    if params.top_k > 0 && params.top_p < 1.0 {
        launch(
            &SAMPLE_TOPK_PART,
            dev,
            LaunchConfig::from(lists as u32),
            &[4096, 64],
            &mut [
                logits.into(),
                (&iparams).into(),
                (&mut part_top).into(),
                (n as i32).into(),
            ],
        );
        launch(
            &SAMPLE_TOPK_MASS,
            dev,
            LaunchConfig::from(1),
            &[4096, 64],
            &mut [
                logits.into(),
                (&fparams).into(),
                (&iparams).into(),
                (&state).into(),
                (&part_top).into(),
                (&mut zk).into(),
                (lists as i32).into(),
            ],
        );
        // The top-k mass against the host's.
        let mut by_value: Vec<f32> = logits
            .to_vec()
            .unwrap()
            .into_iter()
            .filter(|l| !l.is_nan())
            .collect();
        by_value.sort_by(|a, b| b.total_cmp(a));
        let max = by_value[0] as f64;
        let want: f64 = by_value[..params.top_k.min(by_value.len())]
            .iter()
            .map(|&l| ((l as f64 - max) / params.temperature as f64).exp())
            .sum();
        let got = zk.to_vec().unwrap()[0] as f64;
        assert!(
            (got - want).abs() <= 1e-5 * want,
            "top-k mass {got} vs {want} on {dev}"
        );
    }
    launch(
        &SAMPLE_PICK,
        dev,
        LaunchConfig::from(1),
        &[r as i64, pb as i64],
        &mut [
            (&fparams).into(),
            (&iparams).into(),
            (&mut state).into(),
            (&part_val).into(),
            (&part_idx).into(),
            (&cnt).into(),
            (&mass).into(),
            (&z).into(),
            (&zk).into(),
            (&mut result).into(),
            (parts as i32).into(),
        ],
    );
    let res = result.to_vec().unwrap();
    let st = state.to_vec().unwrap();
    assert_eq!(st[1], pos, "the position is left alone");
    match res[1] {
        0 => {
            assert_eq!(st[0], res[0], "an accepted draw is the next input");
            Some(res[0] as u32)
        }
        1 => {
            assert_eq!(
                st[0] as usize, greedy,
                "a rejected step keeps the greedy token"
            );
            None
        }
        other => panic!("result flag {other}"),
    }
}

#[test]
fn device_sampling_follows_the_restricted_softmax() {
    use tilefuse_engine::{Sampler, Sampling};
    for dev in devices("device_sampling_follows_the_restricted_softmax") {
        let mut rng = Rng::new(4242);
        // Two programs' worth of logits: a broad tail, a few strong tokens, a tie
        // between two of them across the program boundary, and a NaN.
        let n = 1500;
        let mut logits: Vec<f32> = (0..n).map(|_| 1.5 * (rng.unit() * 2.0 - 1.0)).collect();
        for (i, v) in [(3, 5.0), (700, 4.5), (1100, 5.0), (1499, 4.0), (512, 3.5)] {
            logits[i] = v;
        }
        logits[40] = f32::NAN;
        let greedy = 3; // 5.0 at 3 and 1100: the first wins
        let buf = dev.upload(&logits).unwrap();
        let trials_for = |both: bool| match (dev.is_cuda(), both) {
            (true, _) => 4000,
            // The interpreter runs the top-k merge slowly.
            (false, true) => 500,
            (false, false) => 1200,
        };
        // Temperature alone, top-k, top-p, and top-k with top-p (a tie at the top-k
        // boundary: 5.0 twice, and k = 2 keeps both).
        for (t, k, p) in [
            (1.0f32, 0usize, 1.0f32),
            (0.7, 4, 1.0),
            (1.3, 0, 0.6),
            (2.0, 40, 0.5),
            (1.0, 2, 0.7),
        ] {
            let base = Sampling {
                temperature: t,
                top_k: k,
                top_p: p,
                seed: 0,
            };
            let trials = trials_for(k > 0 && p < 1.0);
            let want = base.distribution(&logits);
            let total: f64 = want.iter().map(|&(_, w)| w).sum();
            let mut counts = vec![0usize; n];
            let mut fallbacks = 0;
            for trial in 0..trials {
                let params = Sampling {
                    seed: 1000 + trial as u64,
                    ..base.clone()
                };
                let token = match device_draw(&dev, &buf, n, greedy, 17, &params) {
                    Some(tok) => {
                        assert!(
                            want.iter().any(|&(i, _)| i == tok),
                            "{dev} T={t} k={k} p={p}: token {tok} outside the kept set"
                        );
                        tok
                    }
                    None => {
                        fallbacks += 1;
                        Sampler::new(params).sample(&logits)
                    }
                };
                counts[token as usize] += 1;
            }
            // Each kept token's frequency within 5 standard deviations (+1 count).
            for &(i, w) in &want {
                let prob = w / total;
                let f = counts[i as usize] as f64 / trials as f64;
                let sd = (prob * (1.0 - prob) / trials as f64).sqrt();
                assert!(
                    (f - prob).abs() <= 5.0 * sd + 1.0 / trials as f64,
                    "{dev} T={t} k={k} p={p}: token {i} frequency {f:.4}, probability {prob:.4}"
                );
            }
            // The host draws when all four draws fall outside the kept set: with
            // probability (1 - kept mass)^4.
            let all: f64 = Sampling {
                top_k: 0,
                top_p: 1.0,
                ..base.clone()
            }
            .distribution(&logits)
            .iter()
            .map(|&(_, w)| w)
            .sum();
            let q4 = (1.0 - total / all).powi(4);
            let expect = q4 * trials as f64;
            let sd = (expect * (1.0 - q4)).sqrt();
            assert!(
                (fallbacks as f64 - expect).abs() <= 5.0 * sd + 2.0,
                "{dev} T={t} k={k} p={p}: {fallbacks} host fallbacks in {trials}, expected {expect:.1}"
            );
        }
        // A draw is a function of (seed, position).
        let params = Sampling {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            seed: 77,
        };
        let a: Vec<_> = (0..8)
            .map(|pos| device_draw(&dev, &buf, n, greedy, pos, &params))
            .collect();
        let b: Vec<_> = (0..8)
            .map(|pos| device_draw(&dev, &buf, n, greedy, pos, &params))
            .collect();
        assert_eq!(a, b, "{dev}");
        assert!(
            a.iter().collect::<std::collections::HashSet<_>>().len() > 1,
            "{dev}: {a:?}"
        );
    }
}

#[test]
fn top_k_mass_merges_the_programs_lists() {
    for dev in devices("top_k_mass_merges_the_programs_lists") {
        let mut rng = Rng::new(31337);
        // Three lists of 4096 (the last partial), values on a coarse grid so that ties
        // straddle the lists and the k-th place, and NaNs that never count.
        let n = 10_000;
        let mut logits: Vec<f32> = (0..n)
            .map(|_| (rng.unit() * 2000.0).floor() / 64.0)
            .collect();
        for i in [5, 4100, 9999] {
            logits[i] = f32::NAN;
        }
        let greedy = (0..n).filter(|&i| !logits[i].is_nan()).fold(0, |b, i| {
            if logits[i] > logits[b] || logits[b].is_nan() {
                i
            } else {
                b
            }
        });
        let buf = dev.upload(&logits).unwrap();
        let state = dev.upload(&[greedy as i32, 0]).unwrap();
        let lists = n.div_ceil(4096);
        let mut sorted: Vec<f32> = logits.iter().copied().filter(|l| !l.is_nan()).collect();
        sorted.sort_by(|a, b| b.total_cmp(a));
        for (k, t) in [(1usize, 1.0f32), (2, 0.5), (7, 1.0), (40, 2.0), (64, 0.7)] {
            let fparams = dev.upload(&[t, 0.9f32]).unwrap();
            let iparams = dev.upload(&[k as i32, 0]).unwrap();
            let mut part_top = dev.alloc_filled(lists * 64, f32::NAN).unwrap();
            let mut zk = dev.alloc_filled(1, f32::NAN).unwrap();
            launch(
                &SAMPLE_TOPK_PART,
                &dev,
                LaunchConfig::from(lists as u32),
                &[4096, 64],
                &mut [
                    (&buf).into(),
                    (&iparams).into(),
                    (&mut part_top).into(),
                    (n as i32).into(),
                ],
            );
            launch(
                &SAMPLE_TOPK_MASS,
                &dev,
                LaunchConfig::from(1),
                &[4096, 64],
                &mut [
                    (&buf).into(),
                    (&fparams).into(),
                    (&iparams).into(),
                    (&state).into(),
                    (&part_top).into(),
                    (&mut zk).into(),
                    (lists as i32).into(),
                ],
            );
            let max = sorted[0] as f64;
            let want: f64 = sorted[..k]
                .iter()
                .map(|&l| ((l as f64 - max) / t as f64).exp())
                .sum();
            let got = zk.to_vec().unwrap()[0] as f64;
            assert!(
                (got - want).abs() <= 1e-5 * want,
                "k={k} T={t} on {dev}: top-k mass {got}, want {want}"
            );
        }
    }
}
