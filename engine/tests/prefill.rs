//! Batched prefill, on the interpreter and on the GPU (when there is one;
//! `TILEFUSE_REQUIRE_GPU=1` makes its absence a failure):
//!
//! - its kernels against f64 host references at awkward shapes (rows not a multiple of
//!   the tile, a single row, columns and `k` not multiples of the tile), every compiled
//!   variant on a GPU; inputs are seeded random values, outputs are poisoned (NaN)
//!   before each launch, so unwritten elements fail;
//! - the whole prefill of the fixtures' prompts in chunks (one, several that do not
//!   divide the prompt, one token each) against transformers' logits, against
//!   token-by-token decode steps on the same device, and decoding on from the
//!   prefilled cache; the long-prompt fixtures (made on the GPU machine) against
//!   transformers' float32 logits;
//! - bad prompts rejected before any work.

mod common;

use common::kernel_checks::*;
use common::{fixtures_dir, read_reference, rel_err, Json};
use tilefuse_dsl::half::bf16;
use tilefuse_dsl::runtime::testing::{gpu_or_skip, gpu_turn};
use tilefuse_dsl::runtime::{Device, KernelDef, LaunchConfig};
use tilefuse_engine::bench::Rng;
use tilefuse_engine::decode::Decoder;
use tilefuse_engine::prefill_kernels::*;
use tilefuse_engine::reference::argmax;
use tilefuse_engine::{Checkpoint, EngineError};

/// The GEMM tiles to run (constants, warps, stages): on the interpreter the small one
/// and a 64-row one (the GPU default's shape class, with heavy masking); every compiled
/// variant, each pipelining depth included, on a GPU.
fn gemm_variants(dev: &Device, def: &KernelDef) -> Vec<(Vec<i64>, u32, u32)> {
    if dev.is_cuda() {
        def.variants
            .iter()
            .map(|v| (v.consts.to_vec(), v.num_warps, v.num_stages))
            .collect()
    } else {
        vec![(vec![16, 32, 32], 4, 3), (vec![64, 64, 32], 4, 3)]
    }
}

fn gemm_grid(consts: &[i64], t: usize, n: usize) -> LaunchConfig {
    LaunchConfig::from([
        t.div_ceil(consts[0] as usize) as u32,
        n.div_ceil(consts[1] as usize) as u32,
        1,
    ])
}

/// `(rows t, columns n, k)`: one row, rows past a tile, k not a multiple of 32 or 64.
const GEMM_SHAPES: [(usize, usize, usize); 4] =
    [(1, 40, 72), (17, 40, 72), (70, 136, 96), (5, 8, 8)];

/// `(Σ a·w, Σ |a·w|)` in f64 for every `(row, column)` of `a[t, k] · w[n, k]^T`.
fn host_nt(a: &[f32], w: &[f32], t: usize, n: usize, k: usize) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(t * n);
    for r in 0..t {
        for c in 0..n {
            let (mut s, mut m) = (0.0, 0.0);
            for i in 0..k {
                let p = a[r * k + i] as f64 * w[c * k + i] as f64;
                s += p;
                m += p.abs();
            }
            out.push((s, m));
        }
    }
    out
}

/// `prefill_gemm`'s expected output and tolerance per element: `bf16(dot + bias)`,
/// plus `x0` when it accumulates (the projection rounds to bf16 before the sum, as the
/// reference's).
fn gemm_expected(
    dots: &[(f64, f64)],
    b: &[bf16],
    x0: &[bf16],
    n: usize,
    accumulate: bool,
) -> (Vec<f64>, Vec<f64>) {
    dots.iter()
        .enumerate()
        .map(|(i, &(dot, mag))| {
            let proj = bf((dot + b[i % n].to_f64()) as f32) as f64;
            let sum = if accumulate {
                x0[i].to_f64() + proj
            } else {
                proj
            };
            (sum, tol_bf16(sum, 0.0) + tol_bf16(proj, mag))
        })
        .unzip()
}

#[test]
fn rmsnorm_matches_host() {
    let mut rng = Rng::new(2501);
    for dev in devices("rmsnorm_matches_host") {
        // One column block, a partial one, and several.
        for (t, h) in [(1, 8), (3, 72), (5, 1040), (2, 2048)] {
            let x = rng.bf16_vec(t * h, 2.0);
            let g = rng.bf16_vec(h, 1.5);
            let want: Vec<f64> = host_norm_rows(&f32s(&x), &f32s(&g), h)
                .iter()
                .map(|&v| v as f64)
                .collect();
            // One bf16 ulp of each of the two roundings (the f32 sum of squares may
            // associate differently).
            let tol: Vec<f64> = want.iter().map(|w| w.abs() / 64.0 + 1e-30).collect();
            let (xd, gd) = (dev.upload(&x).unwrap(), dev.upload(&g).unwrap());
            let mut y = dev.alloc_filled(t * h, bf16::NAN).unwrap();
            launch(
                &PREFILL_RMSNORM,
                &dev,
                LaunchConfig::from([t as u32, 1, 1]).num_warps(4),
                &[1024],
                &mut [
                    (&xd).into(),
                    (&gd).into(),
                    (&mut y).into(),
                    (h as i32).into(),
                    EPS.into(),
                ],
            );
            let what = format!("prefill_rmsnorm {t}x{h} on {dev}");
            check(&what, &f32s(&y.to_vec().unwrap()), &want, &tol);
        }
    }
}

#[test]
fn gemm_matches_host() {
    let mut rng = Rng::new(2502);
    for dev in devices("gemm_matches_host") {
        for (t, n, k) in GEMM_SHAPES {
            let a = rng.bf16_vec(t * k, 1.0);
            let w = rng.bf16_vec(n * k, 0.1);
            let b = rng.bf16_vec(n, 0.5);
            let x0 = rng.bf16_vec(t * n, 2.0);
            let dots = host_nt(&f32s(&a), &f32s(&w), t, n, k);
            let (ad, wd, bd) = (
                dev.upload(&a).unwrap(),
                dev.upload(&w).unwrap(),
                dev.upload(&b).unwrap(),
            );
            for accumulate in [0i32, 1] {
                let (want, tol) = gemm_expected(&dots, &b, &x0, n, accumulate != 0);
                for (consts, warps, stages) in gemm_variants(&dev, &PREFILL_GEMM) {
                    // Without accumulation the old values must not matter: NaN.
                    let mut x = if accumulate != 0 {
                        dev.upload(&x0).unwrap()
                    } else {
                        dev.alloc_filled(t * n, bf16::NAN).unwrap()
                    };
                    launch(
                        &PREFILL_GEMM,
                        &dev,
                        gemm_grid(&consts, t, n).num_warps(warps).num_stages(stages),
                        &consts,
                        &mut [
                            (&ad).into(),
                            (&wd).into(),
                            (&bd).into(),
                            (&mut x).into(),
                            (t as i32).into(),
                            (n as i32).into(),
                            (k as i32).into(),
                            accumulate.into(),
                        ],
                    );
                    let what = format!(
                        "prefill_gemm {t}x{n}x{k} accumulate {accumulate} {consts:?} \
                         w{warps} on {dev}"
                    );
                    check(&what, &f32s(&x.to_vec().unwrap()), &want, &tol);
                }
            }
        }
    }
}

/// `prefill_gemm_split` against the same host reference as `prefill_gemm`: K cut into
/// 2 and 3 slices of unequal length (k = 72 at 32 a step: 64 + 8, 32 + 32 + 8), each
/// shape launched twice on one workspace (the second finds the counters reset), both
/// epilogues, every compiled variant.
#[test]
fn gemm_split_matches_host() {
    use tilefuse_engine::prefill::TileChoice;
    let mut rng = Rng::new(2507);
    for dev in devices("gemm_split_matches_host") {
        for (t, n, k) in GEMM_SHAPES {
            let a = rng.bf16_vec(t * k, 1.0);
            let w = rng.bf16_vec(n * k, 0.1);
            let b = rng.bf16_vec(n, 0.5);
            let x0 = rng.bf16_vec(t * n, 2.0);
            let dots = host_nt(&f32s(&a), &f32s(&w), t, n, k);
            let (ad, wd, bd) = (
                dev.upload(&a).unwrap(),
                dev.upload(&w).unwrap(),
                dev.upload(&b).unwrap(),
            );
            for accumulate in [0i32, 1] {
                let (want, tol) = gemm_expected(&dots, &b, &x0, n, accumulate != 0);
                // Every compiled variant, on the interpreter too (there are two).
                let variants = PREFILL_GEMM_SPLIT.variants.iter();
                for (consts, warps) in variants.map(|v| (v.consts.to_vec(), v.num_warps)) {
                    for splits in [2u32, 3] {
                        let c =
                            TileChoice::gemm(consts[0], consts[1], consts[2], warps).split(splits);
                        let (slices, k_slice) = c.slices(t, n, k, usize::MAX);
                        let tiles = t.div_ceil(consts[0] as usize) * n.div_ceil(consts[1] as usize);
                        let mut partials = dev.zeros::<f32>(slices * t * n).unwrap();
                        let mut counters = dev.zeros::<i32>(tiles).unwrap();
                        for round in 0..2 {
                            let mut x = if accumulate != 0 {
                                dev.upload(&x0).unwrap()
                            } else {
                                dev.alloc_filled(t * n, bf16::NAN).unwrap()
                            };
                            let grid = gemm_grid(&consts, t, n);
                            let [gx, gy, _] = grid.grid;
                            launch(
                                &PREFILL_GEMM_SPLIT,
                                &dev,
                                LaunchConfig::from([gx, gy, slices as u32]).num_warps(warps),
                                &consts,
                                &mut [
                                    (&ad).into(),
                                    (&wd).into(),
                                    (&bd).into(),
                                    (&mut x).into(),
                                    (&mut partials).into(),
                                    (&mut counters).into(),
                                    (t as i32).into(),
                                    (n as i32).into(),
                                    (k as i32).into(),
                                    (k_slice as i32).into(),
                                    accumulate.into(),
                                ],
                            );
                            let what = format!(
                                "prefill_gemm_split {t}x{n}x{k} in {slices} slices of \
                                 {k_slice}, accumulate {accumulate} {consts:?} w{warps} on \
                                 {dev}, launch {round}"
                            );
                            check(&what, &f32s(&x.to_vec().unwrap()), &want, &tol);
                        }
                        let zero = counters.to_vec().unwrap().iter().all(|&c| c == 0);
                        assert!(zero, "prefill_gemm_split on {dev}: counters left non-zero");
                    }
                }
            }
        }
    }
}

/// The whole prefill with the O, down and QKV projections split over K matches the
/// unsplit prefill and transformers' logits (on the interpreter the plan splits as
/// far as it asks; on a GPU as far as the SMs allow, which for these small models is
/// also all of it).
#[test]
fn prefill_with_split_k() {
    let name = "qwen3_tied_gqa";
    let dir = fixtures_dir().join(name);
    let ckpt = Checkpoint::open(&dir).unwrap();
    let weights = ckpt.model_weights().unwrap();
    let r = read_reference(&dir);
    let n = r.prompt_ids.len();
    for dev in devices("prefill_with_split_k") {
        let _turn = dev.is_cuda().then(gpu_turn);
        let spec = if dev.is_cuda() {
            "qkv=128x64x64/8:2,o=128x64x64/8:3,down=128x64x64/8:2"
        } else {
            "qkv=16x32x32/4:2,o=16x32x32/4:3,down=16x32x32/4:2"
        };
        let mut logits = Vec::new();
        for split in [false, true] {
            let mut dec = Decoder::new(&ckpt.config, &weights, &dev, n + 1).unwrap();
            if split {
                let p = dec.prefiller().unwrap();
                let plan = p.plan().with_tiles(spec).unwrap();
                p.set_plan(plan).unwrap();
            }
            dec.prefill(&r.prompt_ids).unwrap();
            logits.push(dec.read_logits().unwrap());
        }
        let what = format!("{name} on {dev}, split {spec}");
        let rel = rel_err(&logits[1], &r.logits[0]);
        assert!(rel < REL_TOL, "{what}: vs transformers {rel:.3e}");
        let rel = rel_err(&logits[1], &logits[0]);
        assert!(rel < 1e-2, "{what}: vs unsplit {rel:.3e}");
        assert_eq!(
            argmax(&logits[1]),
            argmax(&logits[0]),
            "{what}: greedy token"
        );
    }
}

#[test]
fn gate_up_gemm_matches_host() {
    let mut rng = Rng::new(2503);
    for dev in devices("gate_up_gemm_matches_host") {
        for (t, inter, k) in GEMM_SHAPES {
            let a = rng.bf16_vec(t * k, 1.0);
            let w = rng.bf16_vec(2 * inter * k, 0.2);
            let dots = host_nt(&f32s(&a), &f32s(&w), t, 2 * inter, k);
            let mut want = Vec::with_capacity(t * inter);
            let mut tol = Vec::with_capacity(t * inter);
            for r in 0..t {
                for c in 0..inter {
                    let (dg, du) = (dots[r * 2 * inter + c], dots[r * 2 * inter + inter + c]);
                    let gate = bf(dg.0 as f32);
                    let up = bf(du.0 as f32);
                    let silu = bf(gate / (1.0 + (-gate).exp()));
                    let act = (silu * up) as f64;
                    want.push(act);
                    // A one-ulp flip of the gate or the up projection (each
                    // rounded), then of silu and of the product.
                    let slope = (silu.abs() + up.abs()) as f64;
                    tol.push(
                        4.0 * act.abs() / 128.0
                            + slope * (dg.1 + du.1) * 1e-4
                            + slope * (gate.abs() + up.abs()) as f64 / 128.0
                            + 1e-30,
                    );
                }
            }
            let (ad, wd) = (dev.upload(&a).unwrap(), dev.upload(&w).unwrap());
            for (consts, warps, stages) in gemm_variants(&dev, &PREFILL_GATE_UP) {
                let mut act = dev.alloc_filled(t * inter, bf16::NAN).unwrap();
                launch(
                    &PREFILL_GATE_UP,
                    &dev,
                    gemm_grid(&consts, t, inter)
                        .num_warps(warps)
                        .num_stages(stages),
                    &consts,
                    &mut [
                        (&ad).into(),
                        (&wd).into(),
                        (&mut act).into(),
                        (t as i32).into(),
                        (inter as i32).into(),
                        (k as i32).into(),
                    ],
                );
                let what = format!("prefill_gate_up {t}x{inter}x{k} {consts:?} w{warps} on {dev}");
                check(&what, &f32s(&act.to_vec().unwrap()), &want, &tol);
            }
        }
    }
}

/// QK-norm (optional) and RoPE of one head slice, as the reference rounds them.
fn host_norm_rope(x: &[f32], w: Option<&[f32]>, cos: &[f32], sin: &[f32]) -> Vec<f32> {
    let d = x.len();
    let x = match w {
        Some(w) => host_norm_rows(x, w, d),
        None => x.to_vec(),
    };
    let half = d / 2;
    let mut out = vec![0.0; d];
    for i in 0..half {
        let (a, b) = (x[i], x[i + half]);
        out[i] = bf(bf(a * cos[i]) + bf(-b * sin[i]));
        out[i + half] = bf(bf(b * cos[i]) + bf(a * sin[i]));
    }
    out
}

#[test]
fn qk_rope_appends_the_chunk() {
    let mut rng = Rng::new(2504);
    for dev in devices("qk_rope_appends_the_chunk") {
        for (d, nh, nkv, t, start, use_norm) in [
            (32, 4, 2, 1, 0, true),
            (64, 4, 1, 19, 5, true),
            (128, 2, 1, 17, 30, false),
        ] {
            let max_seq = 64;
            let row = (nh + 2 * nkv) * d;
            let qkv = rng.bf16_vec(t * row, 2.0);
            let qw = rng.bf16_vec(d, 1.5);
            let kw = rng.bf16_vec(d, 1.5);
            let (cos, sin) = rope_tables(d, max_seq, 10000.0);
            let qkv_f = f32s(&qkv);
            let (qw_f, kw_f) = (f32s(&qw), f32s(&kw));
            let norm = |w: &[f32]| -> Option<Vec<f32>> { use_norm.then(|| w.to_vec()) };
            let nan = f32::NAN;
            let mut want_q = vec![nan; t * nh * d];
            let mut want_k = vec![nan; nkv * max_seq * d];
            let mut want_v = vec![nan; nkv * max_seq * d];
            for r in 0..t {
                let pos = start + r;
                let (c, s) = (
                    &cos[pos * d / 2..(pos + 1) * d / 2],
                    &sin[pos * d / 2..(pos + 1) * d / 2],
                );
                for h in 0..nh {
                    let x = &qkv_f[r * row + h * d..r * row + (h + 1) * d];
                    let o = host_norm_rope(x, norm(&qw_f).as_deref(), c, s);
                    want_q[(r * nh + h) * d..(r * nh + h + 1) * d].copy_from_slice(&o);
                }
                for j in 0..nkv {
                    let kx = &qkv_f[r * row + (nh + j) * d..r * row + (nh + j + 1) * d];
                    let o = host_norm_rope(kx, norm(&kw_f).as_deref(), c, s);
                    let at = (j * max_seq + pos) * d;
                    want_k[at..at + d].copy_from_slice(&o);
                    let vx = &qkv_f[r * row + (nh + nkv + j) * d..r * row + (nh + nkv + j + 1) * d];
                    want_v[at..at + d].copy_from_slice(vx);
                }
            }
            let up = |v: &[f32]| dev.upload(v).unwrap();
            let (cd, sd) = (up(&cos), up(&sin));
            let (qkvd, qwd, kwd) = (
                dev.upload(&qkv).unwrap(),
                dev.upload(&qw).unwrap(),
                dev.upload(&kw).unwrap(),
            );
            let mut q = dev.alloc_filled(t * nh * d, bf16::NAN).unwrap();
            let mut kc = dev.alloc_filled(nkv * max_seq * d, bf16::NAN).unwrap();
            let mut vc = dev.alloc_filled(nkv * max_seq * d, bf16::NAN).unwrap();
            launch(
                &PREFILL_QK_ROPE,
                &dev,
                LaunchConfig::from([t.div_ceil(16) as u32, (nh + nkv) as u32, 1]),
                &[d as i64, 16],
                &mut [
                    (&qkvd).into(),
                    (&qwd).into(),
                    (&kwd).into(),
                    (&cd).into(),
                    (&sd).into(),
                    (&mut q).into(),
                    (&mut kc).into(),
                    (&mut vc).into(),
                    (t as i32).into(),
                    (start as i32).into(),
                    (nh as i32).into(),
                    (nkv as i32).into(),
                    (max_seq as i32).into(),
                    i32::from(use_norm).into(),
                    EPS.into(),
                ],
            );
            let what = format!("prefill_qk_rope D={d} {nh}/{nkv} heads t={t} at {start} on {dev}");
            for (name, got, want) in [
                ("queries", q.to_vec().unwrap(), want_q),
                ("keys", kc.to_vec().unwrap(), want_k),
                ("values", vc.to_vec().unwrap(), want_v),
            ] {
                for (i, (g, w)) in f32s(&got).iter().zip(&want).enumerate() {
                    // Rows outside the chunk stay unwritten (NaN); others match to one
                    // bf16 ulp (the f32 mean of squares may sum in another order).
                    let ok = if w.is_nan() {
                        g.is_nan()
                    } else {
                        (g - w).abs() <= w.abs() / 128.0 + 1e-6
                    };
                    assert!(ok, "{what}: {name}[{i}] = {g}, want {w}");
                }
            }
        }
    }
}

/// Causal attention of rows `0..t` (positions `start + r`) in f64 from bf16 scores
/// `bf16(bf16(q·k) * scale)`: `(out, max |v|)` for `[t, nh * d]`.
#[allow(clippy::too_many_arguments)]
fn host_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    t: usize,
    start: usize,
    nh: usize,
    nkv: usize,
    d: usize,
    max_seq: usize,
) -> Vec<f64> {
    let scale = (d as f32).powf(-0.5);
    let group = nh / nkv;
    let mut out = vec![0.0; t * nh * d];
    for r in 0..t {
        for h in 0..nh {
            let qh = &q[(r * nh + h) * d..(r * nh + h + 1) * d];
            let base = (h / group) * max_seq * d;
            let n = start + r + 1;
            let scores: Vec<f64> = (0..n)
                .map(|s| {
                    let kr = &k[base + s * d..base + (s + 1) * d];
                    let dot: f32 = qh.iter().zip(kr).map(|(a, b)| a * b).sum();
                    bf(bf(dot) * scale) as f64
                })
                .collect();
            let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let p: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
            let l: f64 = p.iter().sum();
            for j in 0..d {
                let acc: f64 = (0..n).map(|s| p[s] * v[base + s * d + j] as f64).sum();
                out[(r * nh + h) * d + j] = acc / l;
            }
        }
    }
    out
}

#[test]
fn attention_matches_host() {
    let mut rng = Rng::new(2505);
    for dev in devices("attention_matches_host") {
        for (d, nh, nkv, t, start) in [
            (32, 4, 2, 1, 0),
            (32, 4, 2, 1, 40),
            (64, 4, 1, 37, 0),
            (64, 2, 2, 21, 19),
            (128, 2, 1, 18, 33),
            // Several 128-row query tiles, a prefix not a multiple of any key tile.
            (128, 2, 1, 150, 70),
        ] {
            let max_seq = 240;
            let q = rng.bf16_vec(t * nh * d, 1.0);
            // Positions past the chunk hold garbage the kernel must not read.
            let mut k = rng.bf16_vec(nkv * max_seq * d, 1.0);
            let mut v = rng.bf16_vec(nkv * max_seq * d, 1.0);
            for j in 0..nkv {
                for s in start + t..max_seq {
                    for i in 0..d {
                        k[(j * max_seq + s) * d + i] = bf16::from_f32(1e4);
                        v[(j * max_seq + s) * d + i] = bf16::NAN;
                    }
                }
            }
            let want = host_attention(
                &f32s(&q),
                &f32s(&k),
                &f32s(&v),
                t,
                start,
                nh,
                nkv,
                d,
                max_seq,
            );
            // The probabilities enter the value product as bf16 (2^-9 relative each)
            // and one-ulp score flips move them by up to ~1%.
            let tol: Vec<f64> = want.iter().map(|w| w.abs() / 64.0 + 2e-2).collect();
            let (qd, kd, vd) = (
                dev.upload(&q).unwrap(),
                dev.upload(&k).unwrap(),
                dev.upload(&v).unwrap(),
            );
            let variants: Vec<(Vec<i64>, u32)> = if dev.is_cuda() {
                PREFILL_ATTENTION
                    .variants
                    .iter()
                    .filter(|v| v.consts[0] == d as i64)
                    .map(|v| (v.consts.to_vec(), v.num_warps))
                    .collect()
            } else {
                vec![
                    (vec![d as i64, 16, 32], 4),
                    (vec![d as i64, 64, 32], 8),
                    (vec![d as i64, 128, 64], 8),
                ]
            };
            for (consts, warps) in variants {
                let mut out = dev.alloc_filled(t * nh * d, bf16::NAN).unwrap();
                launch(
                    &PREFILL_ATTENTION,
                    &dev,
                    LaunchConfig::from([nh as u32, t.div_ceil(consts[1] as usize) as u32, 1])
                        .num_warps(warps),
                    &consts,
                    &mut [
                        (&qd).into(),
                        (&kd).into(),
                        (&vd).into(),
                        (&mut out).into(),
                        (t as i32).into(),
                        (start as i32).into(),
                        ((nh / nkv) as i32).into(),
                        (max_seq as i32).into(),
                        (d as f32).powf(-0.5).into(),
                    ],
                );
                let what = format!(
                    "prefill_attention D={d} {nh}/{nkv} heads t={t} at {start} {consts:?} \
                     w{warps} on {dev}"
                );
                check(&what, &f32s(&out.to_vec().unwrap()), &want, &tol);
            }
        }
    }
}

// The whole prefill against transformers and against token-by-token decoding.

/// The decode fixtures' bound on the relative logit error against transformers
/// (`tests/decode_fixtures.rs`).
const REL_TOL: f32 = 3e-2;

/// Batched prefill against token-by-token steps on one device. The steps' fused GEMVs
/// do not round their normalized inputs to bf16 and their split attention keeps
/// probabilities in f32, where the prefill rounds as transformers does (but for the
/// probabilities, rounded unnormalized): on the small fixtures the steps are 1.4-2.2e-2
/// from transformers and the prefill 0.9-1.2e-2, so the two differ by about as much as
/// each differs from transformers.
const VS_STEPS_TOL: f32 = 3e-2;

/// The same comparison at real shapes with random weights over 1100 positions, where
/// random models amplify rounding: measured on an H200, Qwen3-0.6B 1.6-1.8e-2 and
/// Llama-3.2-1B 3.5e-2 at the first step (docs/gpu-results.md, batched prefill).
/// Each path's own fidelity is held to transformers' float32 logits by the long
/// fixtures (`prefill_qwen3_prompt_800`, `prefill_llama3_prompt_720`); this test
/// catches a broken chunk, cache or position, which moves logits by far more.
const VS_STEPS_REAL_TOL: f32 = 6e-2;

/// Prompt tokens compared against token-by-token decode steps (which are slow on the
/// interpreter: 300 of them take half a minute).
const STEPS_PREFIX: usize = 40;

/// The logits after the first `len` tokens of fixture `name`'s prompt through
/// token-by-token decode steps.
fn step_logits(name: &str, dev: &Device, len: usize) -> Vec<f32> {
    let dir = fixtures_dir().join(name);
    let ckpt = Checkpoint::open(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
    let weights = ckpt.model_weights().unwrap();
    let r = read_reference(&dir);
    let mut steps = Decoder::new(&ckpt.config, &weights, dev, len).unwrap();
    for (pos, &t) in r.prompt_ids[..len].iter().enumerate() {
        steps.set_input(t, pos).unwrap();
        steps.step().unwrap();
    }
    steps.read_logits().unwrap()
}

/// Prefills fixture `name`'s prompt on `dev` in chunks of `chunk`: its first
/// [`STEPS_PREFIX`] tokens, checked against token-by-token steps on the same device
/// (`steps`), then the rest from that position on. Checks the logits against
/// transformers', then decodes on from the prefilled cache, teacher-forced, against
/// transformers' later steps. Returns the logits after the prefill.
fn prefill_fixture(name: &str, dev: &Device, chunk: usize, steps: &[f32]) -> Vec<f32> {
    let dir = fixtures_dir().join(name);
    let ckpt = Checkpoint::open(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
    let weights = ckpt.model_weights().unwrap();
    let r = read_reference(&dir);
    let n = r.prompt_ids.len();
    let total = n + r.tokens.len();
    let what = format!("{name} on {dev}, chunks of {chunk}");

    let mut dec = Decoder::new(&ckpt.config, &weights, dev, total).unwrap();
    dec.set_prefill_chunk(chunk).unwrap();
    let prefix = n.min(STEPS_PREFIX);
    dec.prefill(&r.prompt_ids[..prefix])
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let vs_steps = rel_err(&dec.read_logits().unwrap(), steps);
    assert!(
        vs_steps < VS_STEPS_TOL,
        "{what}: {prefix} tokens vs token-by-token steps {vs_steps:.3e}"
    );
    if prefix < n {
        dec.prefill_at(&r.prompt_ids[prefix..], prefix)
            .unwrap_or_else(|e| panic!("{what}: from {prefix}: {e}"));
    }
    let logits = dec.read_logits().unwrap();
    let (greedy, next_pos) = dec.read_state().unwrap();
    assert_eq!(next_pos, n, "{what}: the prefill leaves the next position");
    assert_eq!(greedy as usize, argmax(&logits), "{what}: greedy token");
    let rel = rel_err(&logits, &r.logits[0]);
    assert!(rel < REL_TOL, "{what}: vs transformers {rel:.3e}");

    // Decoding continues from the prefilled cache (teacher-forced; the device's own
    // greedy token when it is transformers' choice).
    let mut worst = rel;
    for step in 1..r.tokens.len() {
        let pos = n + step - 1;
        let (state_token, state_pos) = dec.read_state().unwrap();
        assert_eq!(state_pos, pos, "{what}: step {step} position");
        if state_token != r.tokens[step - 1] {
            dec.set_input(r.tokens[step - 1], pos).unwrap();
        }
        dec.step().unwrap();
        let ours = dec.read_logits().unwrap();
        let rel = rel_err(&ours, &r.logits[step]);
        worst = worst.max(rel);
        assert!(
            rel < REL_TOL,
            "{what}: decode step {step} after the prefill: {rel:.3e}"
        );
    }
    eprintln!(
        "{what}: vs transformers {rel:.3e} after the prefill, worst {worst:.3e} with the \
         steps after it; {prefix} tokens vs token-by-token steps {vs_steps:.3e}"
    );
    logits
}

/// The fixture in one chunk, in chunks that do not divide the prompt and (for short
/// prompts) one token a chunk, on the interpreter; on a GPU also against the
/// interpreter.
fn check_fixture(name: &str, chunks: &[usize]) {
    let prefix = read_reference(&fixtures_dir().join(name))
        .prompt_ids
        .len()
        .min(STEPS_PREFIX);
    let cpu = Device::cpu();
    let steps = step_logits(name, &cpu, prefix);
    let cpu: Vec<Vec<f32>> = chunks
        .iter()
        .map(|&c| prefill_fixture(name, &cpu, c, &steps))
        .collect();
    if let Some(gpu) = gpu_or_skip(name) {
        let _turn = gpu_turn();
        let steps = step_logits(name, &gpu, prefix);
        for (&c, cpu_logits) in chunks.iter().zip(&cpu) {
            let g = prefill_fixture(name, &gpu, c, &steps);
            let rel = rel_err(&g, cpu_logits);
            assert!(
                rel < 1e-2,
                "{name}, chunks of {c}: GPU vs interpreter {rel:.3e}"
            );
        }
    }
}

#[test]
fn prefill_qwen3_tied_gqa() {
    check_fixture("qwen3_tied_gqa", &[512, 5, 1]);
}

#[test]
fn prefill_qwen3_untied_mqa() {
    check_fixture("qwen3_untied_mqa", &[512, 7]);
}

#[test]
fn prefill_qwen2_bias() {
    check_fixture("qwen2_bias", &[512, 10, 1]);
}

#[test]
fn prefill_llama3_scaled_long() {
    check_fixture("llama3_scaled_long", &[512, 128, 37]);
}

/// A fixture's reference.json with transformers' float32 logits and its own bf16
/// error per step (the long-prompt fixtures of `scripts/make_fixtures.py`).
struct LongReference {
    prompt_ids: Vec<u32>,
    tokens: Vec<u32>,
    logits_f32: Vec<Vec<f32>>,
    hf_bf16_rel_err: Vec<f32>,
}

fn read_long_reference(dir: &std::path::Path) -> LongReference {
    let json = Json::read(&dir.join("reference.json"));
    LongReference {
        prompt_ids: json.u32s("prompt_ids"),
        tokens: json.u32s("tokens"),
        logits_f32: json.f32_rows("logits_f32"),
        hf_bf16_rel_err: json.f32s("hf_bf16_rel_err"),
    }
}

/// A long-prompt fixture (made on the GPU machine, where torch is): the prefill in
/// chunks of `chunk`, then teacher-forced decode steps, each against transformers'
/// float32 logits within max(0.03, 2.5 x transformers' own bf16 error at that step).
/// Skips with a message when the fixture has not been made.
fn check_long_fixture(name: &str, dev: &Device, chunk: usize) {
    let dir = fixtures_dir().join(name);
    if !dir.join("reference.json").is_file() {
        println!(
            "{name}: skipped: fixture not made (python scripts/make_fixtures.py --only {name} \
             --device cuda, on a machine with torch)"
        );
        return;
    }
    let ckpt = Checkpoint::open(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
    let weights = ckpt.model_weights().unwrap();
    let r = read_long_reference(&dir);
    let n = r.prompt_ids.len();
    let what = format!("{name} on {dev}, chunks of {chunk}");
    let mut dec = Decoder::new(&ckpt.config, &weights, dev, n + r.tokens.len() + 1).unwrap();
    dec.set_prefill_chunk(chunk).unwrap();
    dec.prefill(&r.prompt_ids)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    for step in 0..r.tokens.len() {
        if step > 0 {
            dec.set_input(r.tokens[step - 1], n + step - 1).unwrap();
            dec.step().unwrap();
        }
        let ours = dec.read_logits().unwrap();
        let tol = 0.03f32.max(2.5 * r.hf_bf16_rel_err[step]);
        let rel = rel_err(&ours, &r.logits_f32[step]);
        eprintln!(
            "{what} step {step}: {rel:.3e} vs transformers f32 (tol {tol:.3e}, its bf16 {:.3e})",
            r.hf_bf16_rel_err[step]
        );
        assert!(rel <= tol, "{what} step {step}: {rel:.3e} > {tol:.3e}");
    }
}

#[test]
fn prefill_qwen3_prompt_800() {
    check_long_fixture("qwen3_prompt_800", &Device::cpu(), 512);
    if let Some(gpu) = gpu_or_skip("prefill_qwen3_prompt_800") {
        let _turn = gpu_turn();
        for chunk in [512, 128, 300] {
            check_long_fixture("qwen3_prompt_800", &gpu, chunk);
        }
    }
}

#[test]
fn prefill_llama3_prompt_720() {
    check_long_fixture("llama3_prompt_720", &Device::cpu(), 512);
    if let Some(gpu) = gpu_or_skip("prefill_llama3_prompt_720") {
        let _turn = gpu_turn();
        for chunk in [512, 128, 300] {
            check_long_fixture("llama3_prompt_720", &gpu, chunk);
        }
    }
}

/// Bad prompts are errors before any work: the decoder's state is untouched.
#[test]
fn prefill_rejects_bad_prompts_before_any_work() {
    let dir = fixtures_dir().join("qwen3_tied_gqa");
    let ckpt = Checkpoint::open(&dir).unwrap();
    let weights = ckpt.model_weights().unwrap();
    let dev = Device::cpu();
    let mut dec = Decoder::new(&ckpt.config, &weights, &dev, 8).unwrap();
    dec.set_input(3, 2).unwrap();
    let cases: [(&[u32], &str); 3] = [
        (&[1; 9], "exceeds max_seq_len = 8"),
        (&[], "empty"),
        (&[1, 2, 1000], "token id 1000 is out of range"),
    ];
    for (prompt, want) in cases {
        let err = dec.prefill(prompt).unwrap_err();
        assert!(
            err.to_string().contains(want),
            "prompt of {} tokens: {err}",
            prompt.len()
        );
        assert_eq!(
            dec.read_state().unwrap(),
            (3, 2),
            "state untouched after: {err}"
        );
    }
    // Positions: a prompt that fits from 0 does not fit from a later start.
    let err = dec.prefill_at(&[1; 4], 5).unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::TooLong {
                prompt: 9,
                max: 8,
                ..
            }
        ),
        "{err}"
    );
    // The largest that fits runs.
    dec.prefill(&[1; 8]).unwrap();
    assert_eq!(dec.read_state().unwrap().1, 8);
}

/// Real model shapes on a GPU (Qwen3-0.6B: head_dim 128, 16/8 heads, QK-norm;
/// Llama-3.2-1B: 32/8 heads, rope scaling), random weights: a prompt of 1100 tokens
/// (past two chunk boundaries, not a multiple of any tile) prefilled against the same
/// prompt through token-by-token graph replays, then four decode steps from each cache.
#[test]
fn prefill_matches_steps_at_real_shapes() {
    let Some(gpu) = gpu_or_skip("prefill_matches_steps_at_real_shapes") else {
        return;
    };
    let _turn = gpu_turn();
    for preset in ["qwen3-0.6b", "llama-3.2-1b"] {
        let (cfg, weights) = tilefuse_engine::preset::load(preset, 3).unwrap();
        let mut rng = Rng::new(2506);
        let prompt: Vec<u32> = (0..1100)
            .map(|_| rng.next_u32() % cfg.vocab_size as u32)
            .collect();
        let len = prompt.len() + 8;
        let mut batched = Decoder::new(&cfg, &weights, &gpu, len).unwrap();
        batched.capture().unwrap();
        batched.prefill(&prompt).unwrap();
        let mut steps = Decoder::new(&cfg, &weights, &gpu, len).unwrap();
        steps.capture().unwrap();
        for (pos, &t) in prompt.iter().enumerate() {
            steps.set_input(t, pos).unwrap();
            steps.step().unwrap();
        }
        for step in 0..5 {
            let (b, s) = (batched.read_logits().unwrap(), steps.read_logits().unwrap());
            let rel = rel_err(&b, &s);
            eprintln!("{preset} step {step}: batched prefill vs token-by-token {rel:.3e}");
            assert!(rel < VS_STEPS_REAL_TOL, "{preset} step {step}: {rel:.3e}");
            assert_eq!(batched.read_state().unwrap().1, prompt.len() + step);
            // Both continue with the same token.
            let next = steps.read_state().unwrap().0;
            batched.set_input(next, prompt.len() + step).unwrap();
            batched.step().unwrap();
            steps.step().unwrap();
        }
    }
}
