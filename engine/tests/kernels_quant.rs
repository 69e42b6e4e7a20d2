//! The quantized GEMVs (`kernels_quant`) and their activation quantizer, against host
//! references: the dequantizer (itself checked bit for bit against llama.cpp's `gguf`
//! package in `tests/gguf.rs`) and f64 sums.
//!
//! Random blocks of each type (random quant and scale bytes, random f16 super-block
//! scales with some extreme ones), on the interpreter at small shapes with a few launch
//! configurations, for each variant (plain, residual, RMSNorm, SiLU-and-multiply, LM
//! head), and on the GPU (when there is one; `TILEFUSE_REQUIRE_GPU=1` makes its absence
//! a failure) at those shapes plus Qwen3-0.6B's layer shapes (QKV `4096 x 1024`, down
//! `1024 x 3072`) with the decode step's configurations and the long tiles. Each launch
//! is checked three ways:
//!
//! - the int8 activation it consumed (read back) against the host's: bit for bit where
//!   the host computes the same f32 operations (plain and SiLU-and-multiply inputs), and
//!   within half a quantization step of the exact input elsewhere (the norms, whose
//!   sums of squares run in another order);
//! - the GEMV against `Σ w · x̂` in f64 over that activation `x̂ = q · xd` (the
//!   kernel's integer sums are exact; only f32 scaling and the output's bf16 rounding
//!   differ);
//! - the sums of each 16 values against the values.
//!
//! Outputs are poisoned with NaN before each launch, so unwritten rows fail.

use tilefuse_dsl::half::{bf16, f16};
use tilefuse_dsl::runtime::testing::gpu_or_skip;
use tilefuse_dsl::runtime::{Buffer, Device};
use tilefuse_engine::gguf::device::{
    DeviceQuantMatrix, QuantGemvConfig, QuantOut, QuantSpare, QuantVariant,
};
use tilefuse_engine::gguf::quant::{self, GgmlType, PackedMatrix};

/// xorshift64*: seeded, reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    fn byte(&mut self) -> u8 {
        (self.next() >> 56) as u8
    }
}

/// `rows x cols` random blocks of `ty` in the file's layout. Scales are small random
/// f16 values except in `extreme` rows, where the first block takes f16's largest finite
/// value or a subnormal.
fn random_blocks(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize, extreme: bool) -> Vec<u8> {
    let (block, size) = ty.block().unwrap();
    let (block, size) = (block as usize, size as usize);
    let mut out = Vec::with_capacity(rows * cols / block * size);
    for r in 0..rows {
        for b in 0..cols / block {
            let mut blk: Vec<u8> = (0..size).map(|_| rng.byte()).collect();
            let mut d = f16::from_f32(rng.unit() * 0.02);
            let dmin = f16::from_f32(rng.unit().abs() * 0.02);
            if extreme && b == 0 {
                d = if r % 2 == 0 {
                    f16::MAX
                } else {
                    f16::from_bits(1)
                };
            }
            match ty {
                GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::IQ4_XS => {
                    blk[0..2].copy_from_slice(&d.to_le_bytes())
                }
                GgmlType::Q4_1 | GgmlType::Q5_1 => {
                    // An offset about a block's lowest value, as the quantizer sets it.
                    blk[0..2].copy_from_slice(&d.to_le_bytes());
                    let m = -16.0 * d.to_f32().clamp(-1e3, 1e3) + rng.unit() * 0.01;
                    blk[2..4].copy_from_slice(&f16::from_f32(m).to_le_bytes());
                }
                GgmlType::Q4_K | GgmlType::Q5_K => {
                    blk[0..2].copy_from_slice(&d.to_le_bytes());
                    blk[2..4].copy_from_slice(&dmin.to_le_bytes());
                }
                GgmlType::Q6_K => blk[208..210].copy_from_slice(&d.to_le_bytes()),
                GgmlType::Q3_K => blk[108..110].copy_from_slice(&d.to_le_bytes()),
                _ => unreachable!(),
            }
            out.extend_from_slice(&blk);
        }
    }
    out
}

struct Case {
    packed: PackedMatrix,
    /// Dequantized weights, row-major.
    w: Vec<f32>,
    a: Vec<bf16>,
    bias: Vec<bf16>,
    old: Vec<bf16>,
    norm_w: Vec<bf16>,
    /// `[g; u]` for the SiLU-and-multiply variant, `2 * k` long.
    gate_up: Vec<bf16>,
}

fn case(rng: &mut Rng, ty: GgmlType, n: usize, k: usize) -> Case {
    // A few rows with extreme scales in small cases; none at the large shapes, where
    // one huge row would hide the others' errors in nothing (each row is checked alone).
    let blocks = random_blocks(rng, ty, n, k, n * k <= 1 << 16);
    let packed = PackedMatrix::pack(ty, &blocks, n, k, "w").unwrap();
    let w = quant::dequantize(ty, &blocks, n * k, "w").unwrap();
    let mut vec = |len: usize, scale: f32| -> Vec<bf16> {
        (0..len)
            .map(|_| bf16::from_f32(rng.unit() * scale))
            .collect()
    };
    Case {
        packed,
        w,
        a: vec(k, 2.0),
        bias: vec(n, 1.0),
        old: vec(n, 4.0),
        norm_w: vec(k, 1.5),
        gate_up: vec(2 * k, 4.0),
    }
}

const EPS: f32 = 1e-6;

fn bf(x: f64) -> f64 {
    bf16::from_f64(x).to_f64()
}

/// The host's quantizer, the same f32 operations as `quantize_act`: per 32 values,
/// `xd = max|x| / 127` and `q = floor(x * (127 / max|x|) + 0.5)`; the values packed
/// four to a word.
fn host_quantize(x: &[f32]) -> (Vec<i32>, Vec<f32>) {
    let (mut xq, mut xd) = (Vec::new(), Vec::new());
    for blk in x.chunks(32) {
        let amax = blk.iter().fold(0f32, |m, v| m.max(v.abs()));
        let inv = if amax > 0.0 { 127.0 / amax } else { 0.0 };
        let q: Vec<i32> = blk
            .iter()
            .map(|&v| (v * inv + 0.5).floor() as i32)
            .collect();
        for w in q.chunks(4) {
            let word = w
                .iter()
                .enumerate()
                .fold(0u32, |acc, (b, &v)| acc | ((v as u32 & 255) << (8 * b)));
            xq.push(word as i32);
        }
        xd.push(amax / 127.0);
    }
    (xq, xd)
}

/// The values of an int8 activation (`q`, one per element) and its dequantized form.
fn unpack(xq: &[i32], xd: &[f32], k: usize) -> (Vec<i32>, Vec<f64>) {
    let q: Vec<i32> = (0..k)
        .map(|e| ((xq[e / 4] as u32 >> (8 * (e % 4))) & 255) as u8 as i8 as i32)
        .collect();
    let x = (0..k).map(|e| q[e] as f64 * xd[e / 32] as f64).collect();
    (q, x)
}

/// The input a GEMV variant quantizes, exactly (f64): `a`; RMSNorm of `a`; or
/// `bf16(bf16(silu(g)) * u)` of `[g; u] = gate_up` (the reference decoder's rounding).
fn host_input(c: &Case, k: usize, norm: bool, silu_mul: bool) -> Vec<f64> {
    let mut x: Vec<f64> = c.a.iter().map(|v| v.to_f64()).collect();
    if silu_mul {
        x = (0..k)
            .map(|j| bf16::from_f32(silu_mul_f32(c.gate_up[j], c.gate_up[k + j])).to_f64())
            .collect();
    }
    if norm {
        let ms = x.iter().map(|v| v * v).sum::<f64>() / k as f64;
        let inv_rms = 1.0 / (ms + EPS as f64).sqrt();
        for (xi, g) in x.iter_mut().zip(&c.norm_w) {
            *xi *= inv_rms * g.to_f64();
        }
    }
    x
}

/// `bf16(silu(g)) * u` in f32, as the kernel computes it before rounding.
fn silu_mul_f32(g: bf16, u: bf16) -> f32 {
    let g = g.to_f32();
    bf16::from_f32(g / (1.0 + (-g).exp())).to_f32() * u.to_f32()
}

/// `(W · x + bias, Σ |w·x| + |bias|)` per row, in f64.
fn host_gemv(c: &Case, n: usize, k: usize, x: &[f64], bias: bool) -> Vec<(f64, f64)> {
    (0..n)
        .map(|r| {
            let mut sum = if bias { c.bias[r].to_f64() } else { 0.0 };
            let mut mag = sum.abs();
            for (wj, xj) in c.w[r * k..(r + 1) * k].iter().zip(x) {
                let p = *wj as f64 * xj;
                sum += p;
                mag += p.abs();
            }
            (sum, mag)
        })
        .collect()
}

/// Reads back the activation the last launch consumed and checks it: its sums, and
/// against the host's quantizer (`exact`: bit for bit) or the exact input `want` (within
/// half a step). Returns the dequantized activation.
fn check_activation(
    spare: &QuantSpare,
    k: usize,
    want: &[f64],
    exact: Option<&[f32]>,
    what: &str,
) -> Vec<f64> {
    let (xq, xd) = spare.activation();
    let (xq, xd) = (xq.to_vec().unwrap(), xd.to_vec().unwrap());
    let (q, x) = unpack(&xq, &xd, k);
    if let Some(input) = exact {
        let (hq, hd) = host_quantize(input);
        assert_eq!(&xd[..k / 32], &hd[..], "{what}: block scales");
        assert_eq!(&xq[..k / 4], &hq[..], "{what}: int8 values");
    }
    for e in 0..k {
        let step = xd[e / 32] as f64;
        // Half a step, and the f32 computation of the input (norms: another order).
        let tol = step * 0.5 + want[e].abs() * 1e-5 + 1e-30;
        assert!(
            (x[e] - want[e]).abs() <= tol && q[e].abs() <= 127,
            "{what}: element {e}: {} (q {}, step {step:e}) for {}",
            x[e],
            q[e],
            want[e]
        );
    }
    x
}

fn check_type(ty: GgmlType, seed: u64) {
    let mut rng = Rng(seed);
    let test = format!("{}_gemv_matches_host", ty.name().to_lowercase());
    let mut devices = vec![Device::cpu()];
    devices.extend(gpu_or_skip(&test));
    for dev in devices {
        let min_k = ty.block().unwrap().0 as usize;
        // (16, 2048): whole tiles, so the Q4_K GEMV's unmasked variant (`EVEN`) runs at
        // the 8-row 1024-column configuration; the others are ragged or masked.
        let mut shapes = vec![(5, min_k), (24, 512), (9, 1024 + min_k), (16, 2048)];
        let mut configs = vec![
            QuantGemvConfig {
                block_n: 1,
                block_k: 256,
                num_warps: 4,
            },
            QuantGemvConfig {
                block_n: 4,
                block_k: 512,
                num_warps: 4,
            },
            QuantGemvConfig {
                block_n: 8,
                block_k: 1024,
                num_warps: 8,
            },
            // 16 rows: the residual variants keep a tile in flight (their own loop,
            // left after either half of its two-copy body over these shapes).
            QuantGemvConfig {
                block_n: 16,
                block_k: 256,
                num_warps: 4,
            },
        ];
        if dev.is_cuda() {
            shapes.extend([(4096, 1024), (1024, 3072)]);
            // The decode step's choices and the long tiles (the bandwidth example
            // times every compiled configuration).
            for (block_n, block_k, num_warps) in [
                (8, 1024, 4),
                (2, 2048, 4),
                (4, 2048, 8),
                (16, 512, 4),
                (32, 256, 4),
                (16, 1024, 8),
            ] {
                configs.push(QuantGemvConfig {
                    block_n,
                    block_k,
                    num_warps,
                });
            }
            // The LM head's, and the step's picks for tall (8B gate/up) and square or
            // wide (8B O, down) matrices.
            configs.push(QuantGemvConfig::HEAD);
            configs.push(QuantGemvConfig::for_shape(ty, 24576, 4096));
            configs.push(QuantGemvConfig::for_shape(ty, 4096, 12288));
            configs.dedup();
        }
        // Launches of the unmasked Q4_K variant and of the masked one at the same tiles.
        let (mut unmasked, mut masked) = (0, 0);
        for &(n, k) in &shapes {
            let mut c = case(&mut rng, ty, n, k);
            // A block of zeros and one of a single huge value: their scales' extremes.
            if k >= 64 {
                c.a[..32].fill(bf16::ZERO);
                c.a[32..64].fill(bf16::from_f32(1e-3));
                c.a[40] = bf16::from_f32(-3.0e4);
            }
            let inputs = [
                host_input(&c, k, false, false),
                host_input(&c, k, true, false),
                host_input(&c, k, false, true),
            ];
            let plain_f32: Vec<f32> = c.a.iter().map(|v| v.to_f32()).collect();
            let silu_f32: Vec<f32> = (0..k)
                .map(|j| bf16::from_f32(silu_mul_f32(c.gate_up[j], c.gate_up[k + j])).to_f32())
                .collect();
            let gate_up = dev.upload(&c.gate_up).unwrap();
            let m = DeviceQuantMatrix::upload(&dev, &c.packed).unwrap();
            // The Q4_K kernels read Q4_0 and Q5_0 in rows of a multiple of 256.
            let k_mins = [GgmlType::Q4_K, GgmlType::Q5_K].contains(&ty)
                || ([GgmlType::Q4_0, GgmlType::Q5_0].contains(&ty) && k % 256 == 0);
            assert_eq!(m.ggml_type(), ty.device_type(k), "{ty} {n}x{k}");
            if k_mins && (n, k) == (16, 2048) {
                // Unmasked where compiled: 8 rows, not 16 (docs/perf.md, "Loads without
                // masks").
                let tile = |block_n| QuantGemvConfig {
                    block_n,
                    block_k: 1024,
                    num_warps: 4,
                };
                assert!(m.reads_unmasked(tile(8), false) && m.reads_unmasked(tile(8), true));
                assert!(!m.reads_unmasked(tile(16), false));
            }
            let a = dev.upload(&c.a).unwrap();
            let bias = dev.upload(&c.bias).unwrap();
            let norm_w = dev.upload(&c.norm_w).unwrap();
            let mut spare = QuantSpare::new(&dev, k).unwrap();
            for &cfg in &configs {
                // The variants of Q5_K, Q5_1, Q4_0, Q5_0 and Q3_K cover the step's tiles only.
                if !m.gemv_compiled(cfg, false, false, false) {
                    let partial = [
                        GgmlType::Q5_K,
                        GgmlType::Q5_1,
                        GgmlType::Q4_0,
                        GgmlType::Q5_0,
                        GgmlType::Q3_K,
                        GgmlType::IQ4_XS,
                    ]
                    .contains(&m.ggml_type());
                    let step_tile = (4..=16).contains(&cfg.block_n) && cfg.block_k >= 512;
                    assert!(partial && !step_tile, "{ty} {cfg:?}");
                    continue;
                }
                // The head's variant is compiled for tiles up to 1024 columns.
                if cfg.block_k <= 1024 {
                    check_head(&dev, &m, &c, n, k, cfg, &a, &norm_w, &mut spare);
                }
                for (residual, norm, silu) in [
                    (false, false, false),
                    (true, false, false),
                    (false, true, false),
                    (true, false, true),
                ] {
                    let what = format!(
                        "{ty} {n}x{k} {cfg:?} residual={residual} norm={norm} silu_mul={silu} on {dev}"
                    );
                    let (want_x, exact) = match (norm, silu) {
                        (true, _) => (&inputs[1], None),
                        (_, true) => (&inputs[2], Some(&silu_f32[..])),
                        _ => (&inputs[0], Some(&plain_f32[..])),
                    };
                    if k_mins && !norm && cfg.block_n == 8 && cfg.block_k == 1024 {
                        if m.reads_unmasked(cfg, residual) {
                            unmasked += 1;
                        } else {
                            masked += 1;
                        }
                    }
                    let norm_arg = norm.then_some((&norm_w, EPS));
                    let mut y = if residual {
                        dev.upload(&c.old).unwrap()
                    } else {
                        dev.alloc_filled(n, bf16::NAN).unwrap()
                    };
                    let launched = if silu {
                        m.gemv_silu_mul_residual(&dev, cfg, &gate_up, &bias, &mut y, &mut spare)
                    } else {
                        m.gemv(&dev, cfg, &a, norm_arg, &bias, &mut y, residual, &mut spare)
                    };
                    launched.unwrap_or_else(|e| panic!("{what}: {e}"));
                    let x = check_activation(&spare, k, want_x, exact, &what);
                    let want = host_gemv(&c, n, k, &x, true);
                    let got = y.to_vec().unwrap();
                    for r in 0..n {
                        let (proj, mag) = want[r];
                        // f32 scaling of exact integer sums (in another order than the
                        // host's), then bf16 rounding of the projection and, with a
                        // residual, of the sum. Under a residual the projection's rounding
                        // may land on the other bf16 neighbour than the host's (a whole
                        // step, `|proj| / 128`: seen on an H200 at Q6_K 4096 x 1024).
                        let acc = mag * 4e-6;
                        let (expect, tol) = if residual {
                            let old = c.old[r].to_f64();
                            let e = old + bf(proj);
                            (e, acc + bf(proj).abs() / 128.0 + e.abs() / 256.0)
                        } else {
                            (proj, acc + proj.abs() / 256.0)
                        };
                        let g = got[r].to_f64();
                        assert!(
                            g.is_finite() && (g - expect).abs() <= tol,
                            "{what}: row {r}: got {g}, want {expect} (tol {tol:.3e})"
                        );
                    }
                }
                check_norm_fused(&dev, &m, &c, n, k, cfg, &a, &norm_w, &bias, &inputs[1]);
            }
        }
        let q4_k_kernel = [
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q4_0,
            GgmlType::Q5_0,
        ];
        if q4_k_kernel.contains(&ty) {
            assert!(
                unmasked > 0 && masked > 0,
                "{dev}: unmasked {unmasked}, masked {masked}"
            );
        }
    }
}

/// The GEMV that quantizes its RMSNorm input itself (`gemv_norm_fused`, `ACT = 1`):
/// within the error its own quantization allows of `W · x + bias` for the exact normed
/// input `x` (half a step of each block's `max|x| / 127` an element, plus f32 scaling
/// and the output's bf16 rounding), every row written (outputs poisoned with NaN).
#[allow(clippy::too_many_arguments)]
fn check_norm_fused(
    dev: &Device,
    m: &DeviceQuantMatrix,
    c: &Case,
    n: usize,
    k: usize,
    cfg: QuantGemvConfig,
    a: &Buffer<bf16>,
    norm_w: &Buffer<bf16>,
    bias: &Buffer<bf16>,
    x: &[f64],
) {
    let what = format!("{} {n}x{k} {cfg:?} norm fused on {dev}", m.ggml_type());
    let mut spare = QuantSpare::new(dev, k).unwrap();
    let mut y = dev.alloc_filled(n, bf16::NAN).unwrap();
    let out = QuantOut::Rows {
        y: &mut y,
        row0: 0,
        bias,
    };
    m.gemv_norm_fused(dev, cfg, a, norm_w, EPS, out, &mut spare, false)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let step: Vec<f64> = x
        .chunks(32)
        .map(|b| b.iter().fold(0f64, |s, v| s.max(v.abs())) / 127.0)
        .collect();
    let want = host_gemv(c, n, k, x, true);
    let got = y.to_vec().unwrap();
    // The same GEMV after the quantizer launch: the same quantization but for rare
    // rounding flips (another summation order of `inv_rms`, the scale applied to the
    // row sums instead of the input), so it must agree far more tightly than the bound
    // above, which is what catches a wrong scale.
    let mut unfused = dev.alloc_filled(n, bf16::NAN).unwrap();
    m.gemv(
        dev,
        cfg,
        a,
        Some((norm_w, EPS)),
        bias,
        &mut unfused,
        false,
        &mut spare,
    )
    .unwrap_or_else(|e| panic!("{what}: unfused: {e}"));
    let unfused = unfused.to_vec().unwrap();
    for r in 0..n {
        let (proj, mag) = want[r];
        let w_step = |e: usize| (c.w[r * k + e] as f64).abs() * step[e / 32];
        let quant: f64 = (0..k).map(|e| w_step(e) * 0.5).sum();
        let tol = quant * 1.01 + mag * 4e-6 + proj.abs() / 256.0 + 1e-30;
        let g = got[r].to_f64();
        assert!(
            g.is_finite() && (g - proj).abs() <= tol,
            "{what}: row {r}: got {g}, want {proj} (tol {tol:.3e})"
        );
        // Two flipped elements, both outputs' bf16 rounding, f32 scaling.
        let u = unfused[r].to_f64();
        let flips = 2.0 * (0..k).map(w_step).fold(0f64, f64::max);
        let tol = flips
            + (g.abs() + u.abs()) / 256.0
            + (u - c.bias[r].to_f64()).abs() / 256.0
            + mag * 1e-5
            + 1e-30;
        assert!(
            (g - u).abs() <= tol,
            "{what}: row {r}: {g} fused, {u} after the quantizer (tol {tol:.3e})"
        );
    }
}

/// The LM-head variant (`HEAD = 1`): logits `bf16(W · x)` with the final norm rounded
/// as the reference's (`x = bf16(g * bf16(a * inv_rms))`), stored as f32, and each
/// program's greedy candidate: the largest of its rows' logits, the first on ties.
#[allow(clippy::too_many_arguments)]
fn check_head(
    dev: &Device,
    m: &DeviceQuantMatrix,
    c: &Case,
    n: usize,
    k: usize,
    cfg: QuantGemvConfig,
    a: &Buffer<bf16>,
    norm_w: &Buffer<bf16>,
    spare: &mut QuantSpare,
) {
    let ty = m.ggml_type();
    let what = format!("{ty} head {n}x{k} {cfg:?} on {dev}");
    let ms = c.a.iter().map(|v| v.to_f64().powi(2)).sum::<f64>() / k as f64;
    let inv_rms = (1.0 / (ms as f32 + EPS).sqrt()) as f64;
    let normed: Vec<f64> = (0..k)
        .map(|j| {
            let xn = bf16::from_f64(c.a[j].to_f64() * inv_rms).to_f64();
            bf16::from_f64(c.norm_w[j].to_f64() * xn).to_f64()
        })
        .collect();
    let programs = cfg.grid(n) as usize;
    let mut logits = dev.alloc_filled(n, f32::NAN).unwrap();
    let mut part_val = dev.alloc_filled(programs, f32::NAN).unwrap();
    let mut part_idx = dev.alloc_filled(programs, -1i32).unwrap();
    m.launch(
        dev,
        cfg,
        QuantVariant::Norm { norm_w, eps: EPS },
        a,
        QuantOut::Head {
            logits: &mut logits,
            part_val: &mut part_val,
            part_idx: &mut part_idx,
        },
        spare,
        false,
    )
    .unwrap_or_else(|e| panic!("{what}: {e}"));
    // The norm's bf16 roundings may flip one way or the other (f32 vs f64 inv_rms):
    // within a bf16 step of the host's, then half a quantization step.
    let bound: Vec<f64> = normed.iter().map(|v| v.abs() / 128.0).collect();
    let x = {
        let (xq, xd) = spare.activation();
        let xd = xd.to_vec().unwrap();
        let (_, x) = unpack(&xq.to_vec().unwrap(), &xd, k);
        for e in 0..k {
            let step = xd[e / 32] as f64;
            assert!(
                (x[e] - normed[e]).abs() <= step * 0.5 + bound[e] + 1e-30,
                "{what}: element {e}: {} for {}",
                x[e],
                normed[e]
            );
        }
        x
    };
    let want = host_gemv(c, n, k, &x, false);
    let (got, val, idx) = (
        logits.to_vec().unwrap(),
        part_val.to_vec().unwrap(),
        part_idx.to_vec().unwrap(),
    );
    for (r, &g) in got.iter().enumerate() {
        let (sum, mag) = want[r];
        let tol = mag * 4e-6 + sum.abs() / 256.0;
        let g = g as f64;
        assert!(
            g.is_finite() && (g - sum).abs() <= tol,
            "{what}: row {r}: got {g}, want {sum} (tol {tol:.3e})"
        );
        assert_eq!(g, bf16::from_f64(g).to_f64(), "logits are bf16 values");
    }
    for p in 0..programs {
        let rows = p * cfg.block_n..((p + 1) * cfg.block_n).min(n);
        let best = rows.clone().fold(f32::NEG_INFINITY, |b, r| b.max(got[r]));
        let first = rows.clone().find(|&r| got[r] == best).unwrap();
        assert_eq!(
            (val[p], idx[p]),
            (best, first as i32),
            "{what}: program {p}'s candidate"
        );
    }
}

#[test]
fn q8_0_gemv_matches_host() {
    check_type(GgmlType::Q8_0, 0x0808);
}

#[test]
fn q4_k_gemv_matches_host() {
    check_type(GgmlType::Q4_K, 0x0404);
}

/// Q5_K through the Q4_K kernel's `Q5` variants: the fifth bits moved into place.
#[test]
fn q5_k_gemv_matches_host() {
    check_type(GgmlType::Q5_K, 0x0505);
}

/// Q4_0 through the Q4_K kernel's `LAYOUT = 2` variants (`x = d (q - 8)`, a scale a
/// block) in rows of a multiple of 256, and through the Q8_0 kernel in other rows.
#[test]
fn q4_0_gemv_matches_host() {
    check_type(GgmlType::Q4_0, 0x0400);
}

/// Q5_0 through the Q4_K kernel's `LAYOUT = 3` variants (the fifth bits moved into
/// place, `x = d (q - 16)`), and through the Q8_0 kernel in other rows.
#[test]
fn q5_0_gemv_matches_host() {
    check_type(GgmlType::Q5_0, 0x0500);
}

/// Q4_1's and Q5_1's layout (`x = d * q + m`) through the Q8_0 kernel's `MIN` variants
/// (Q4_1 packs as Q5_1 without fifth bits).
#[test]
fn q5_1_gemv_matches_host() {
    check_type(GgmlType::Q5_1, 0x0501);
}

#[test]
fn q6_k_gemv_matches_host() {
    check_type(GgmlType::Q6_K, 0x0606);
}

/// Q3_K through the Q6_K kernels' `LAYOUT = 1` variants: 2-bit words and a high-bit
/// word a block, `q + 4` in each byte lane, Q6_K's scales.
#[test]
fn q3_k_gemv_matches_host() {
    check_type(GgmlType::Q3_K, 0x0303);
}

/// IQ4_XS through the Q4_K kernels' `LAYOUT = 4` variants: table indices looked up by
/// `byte_perm` as signed bytes, a scale `ls - 32` a block.
#[test]
fn iq4_xs_gemv_matches_host() {
    check_type(GgmlType::IQ4_XS, 0x1404);
}

/// The normed `[gate; up]` GEMV that writes the down projection's int8 input itself
/// (`gemv_norm_silu_quantized`, Q4_K `SILU_Q = 1`: 32 gate rows and the same 32 up rows
/// a program), its normed input quantized inside it or by a launch before it (down's
/// input lands in the spare's other pair of buffers, which then trade places),
/// against the normed GEMV's rows (`gemv_norm_fused`, or the quantizer and the plain
/// GEMV) quantized by the host as `quantize_act` `MODE = 2` would: every block within half a step of
/// `bf16(bf16(silu(g)) * u)` of those rows (and a bf16 step of it where the two
/// GEMVs' row sums, summed in other orders, round to neighbouring bf16 values), and
/// nearly every block bit for bit, on fresh random matrices and inputs.
#[test]
fn the_gate_up_gemv_writes_downs_int8_input() {
    let mut rng = Rng(0x5109);
    let mut devices = vec![Device::cpu()];
    devices.extend(gpu_or_skip("the_gate_up_gemv_writes_downs_int8_input"));
    for dev in devices {
        let tile = |block_k, num_warps| QuantGemvConfig {
            block_n: 64,
            block_k,
            num_warps,
        };
        // Rows are `[gate; up]`: 2, 3 and (on the GPU) Qwen3-0.6B's 96 and Qwen3-8B's
        // 384 programs; 512 columns are two tiles of 256 (masked) at 512.
        let mut shapes = vec![(128, 256), (192, 512)];
        let mut tiles = vec![tile(512, 4), tile(1024, 8)];
        if dev.is_cuda() {
            shapes.extend([(6144, 1024), (24576, 4096)]);
            tiles.push(tile(512, 8));
        }
        // Q4_0 (whole Q4_0 files) through the same variant's `LAYOUT = 2`.
        let cases = shapes
            .iter()
            .flat_map(|&s| [(GgmlType::Q4_K, s), (GgmlType::Q4_0, s)]);
        for (ty, (n, k)) in cases {
            let c = case(&mut rng, ty, n, k);
            let m = DeviceQuantMatrix::upload(&dev, &c.packed).unwrap();
            assert_eq!(m.ggml_type(), ty);
            let (a, norm_w) = (dev.upload(&c.a).unwrap(), dev.upload(&c.norm_w).unwrap());
            let bias = dev.upload(&c.bias).unwrap();
            let mut spare = QuantSpare::new(&dev, k.max(n / 2)).unwrap();
            let rows_cfg = QuantGemvConfig {
                block_n: 8,
                block_k: 512,
                num_warps: 4,
            };
            // The input quantized inside the GEMV (`ACT = 1`) or by a launch before it.
            for fused in [true, false] {
                let mut y = dev.alloc_filled(n, bf16::NAN).unwrap();
                let out = QuantOut::Rows {
                    y: &mut y,
                    row0: 0,
                    bias: &bias,
                };
                if fused {
                    m.gemv_norm_fused(&dev, rows_cfg, &a, &norm_w, EPS, out, &mut spare, false)
                } else {
                    let norm = QuantVariant::Norm {
                        norm_w: &norm_w,
                        eps: EPS,
                    };
                    m.launch(&dev, rows_cfg, norm, &a, out, &mut spare, false)
                }
                .unwrap();
                let y = y.to_vec().unwrap();
                let half = n / 2;
                let x: Vec<f32> = (0..half)
                    .map(|j| bf16::from_f32(silu_mul_f32(y[j], y[half + j])).to_f32())
                    .collect();
                let (hq, hd) = host_quantize(&x);
                // 1024 columns at 4 warps spill (tests/ptxas_all.rs), so none is compiled.
                assert!(!m.silu_quantized_compiled(tile(1024, 4), fused));
                for &cfg in &tiles {
                    let what = format!(
                        "{ty} {n}x{k} {cfg:?} norm inside {fused} gate/up to down's input on {dev}"
                    );
                    assert!(
                        m.silu_quantized_compiled(cfg, fused),
                        "{what}: not compiled"
                    );
                    let mut spare = QuantSpare::new(&dev, k.max(half)).unwrap();
                    m.gemv_norm_silu_quantized(
                        &dev, cfg, fused, &a, &norm_w, EPS, &bias, &mut spare, false,
                    )
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                    let (xq, xd) = spare.activation();
                    let (xq, xd) = (xq.to_vec().unwrap(), xd.to_vec().unwrap());
                    let (q, got) = unpack(&xq, &xd, half);
                    for (e, &want) in x.iter().enumerate() {
                        let step = xd[e / 32] as f64;
                        let want = want as f64;
                        let tol = step * 0.5 + want.abs() / 64.0 + 1e-30;
                        assert!(
                            (got[e] - want).abs() <= tol && q[e].abs() <= 127,
                            "{what}: element {e}: {} (q {}, step {step:e}) for {want}",
                            got[e],
                            q[e]
                        );
                    }
                    let blocks = half / 32;
                    let exact = (0..blocks)
                        .filter(|&b| xd[b] == hd[b] && xq[8 * b..8 * b + 8] == hq[8 * b..8 * b + 8])
                        .count();
                    assert!(
                        exact * 10 >= blocks * 9,
                        "{what}: {exact} of {blocks} blocks bit for bit"
                    );
                }
            }
        }
    }
}

/// `attention_combine_quant` writes the bf16 head output `attention_combine` writes, bit
/// for bit, and that output quantized as `quantize_act` quantizes it (the host's
/// quantizer, the same f32 operations), for random split partials (some splits empty)
/// at each head width and chunk, on every device.
#[test]
fn the_quantizing_combine_matches_combine_then_quantize() {
    use tilefuse_engine::kernels::{AttentionCombineArgs, AttentionCombineConsts};
    use tilefuse_engine::kernels_quant::{AttentionCombineQuantArgs, AttentionCombineQuantConsts};
    let mut devices = vec![Device::cpu()];
    if let Some(gpu) = gpu_or_skip("kernels_quant") {
        devices.push(gpu);
    }
    let mut rng = Rng(0x0c0b_1e9d);
    for dev in &devices {
        for (heads, d, dc, splits, s) in [
            (16, 128, 64, 5, 8),
            (4, 64, 32, 16, 16),
            (3, 128, 128, 1, 8),
        ] {
            // Split `i` of a head holds a running max, a sum and `d` accumulators; splits
            // past `splits - 2` of odd heads are empty (m = -inf, l = 0).
            let mut m = Vec::new();
            let mut l = Vec::new();
            let mut acc = Vec::new();
            for h in 0..heads {
                for i in 0..splits {
                    let empty = h % 2 == 1 && i > 0 && i + 2 > splits;
                    m.push(if empty {
                        f32::NEG_INFINITY
                    } else {
                        4.0 * rng.unit()
                    });
                    l.push(if empty {
                        0.0
                    } else {
                        1.0 + rng.unit().abs() * 30.0
                    });
                    acc.extend((0..d).map(|_| if empty { 0.0 } else { 20.0 * rng.unit() }));
                }
            }
            let (pm, pl, pa) = (
                dev.upload(&m).unwrap(),
                dev.upload(&l).unwrap(),
                dev.upload(&acc).unwrap(),
            );
            let mut stamps = dev.upload(&[0i64; 4]).unwrap();
            let grid = (heads as u32, (d / dc) as u32);
            let mut want = dev.alloc_filled(heads * d, bf16::NAN).unwrap();
            AttentionCombineArgs {
                part_m: &pm,
                part_l: &pl,
                part_acc: &pa,
                out: &mut want,
                splits,
                stamps: &mut stamps,
                stamp_at: -1,
            }
            .launch(dev, grid, AttentionCombineConsts { d, s, dc })
            .unwrap();
            let mut out = dev.alloc_filled(heads * d, bf16::NAN).unwrap();
            let mut xq = dev.alloc_filled(heads * d / 4, 0x5a5a_5a5ai32).unwrap();
            let mut xd = dev.alloc_filled(heads * d / 32, f32::NAN).unwrap();
            AttentionCombineQuantArgs {
                part_m: &pm,
                part_l: &pl,
                part_acc: &pa,
                out: &mut out,
                xq: &mut xq,
                xd: &mut xd,
                splits,
                stamps: &mut stamps,
                stamp_at: -1,
            }
            .launch(
                dev,
                grid,
                AttentionCombineQuantConsts {
                    d,
                    s,
                    dc,
                    stamps: 0,
                },
            )
            .unwrap();
            let want = want.to_vec().unwrap();
            let got = out.to_vec().unwrap();
            assert!(
                want.iter().all(|v| v.is_finite()),
                "{dev:?}: combine left NaN"
            );
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    w.to_bits(),
                    "{dev:?} d {d} dc {dc}: output {i}"
                );
            }
            let as_f32: Vec<f32> = want.iter().map(|v| v.to_f32()).collect();
            let (hq, hd) = host_quantize(&as_f32);
            assert_eq!(
                xq.to_vec().unwrap(),
                hq,
                "{dev:?} d {d} dc {dc}: int8 words"
            );
            let xd = xd.to_vec().unwrap();
            for (b, (g, w)) in xd.iter().zip(&hd).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    w.to_bits(),
                    "{dev:?} d {d} dc {dc}: scale of block {b}"
                );
            }
        }
    }
}

/// Two runs of rows in one launch (`launch_q4_k_q6_k`: a Q4_K or Q5_K run then a Q6_K
/// run, Q4_K_M's and Q5_K_M's QKV where `v` takes more bits; a Q3_K run then a Q4_K or
/// Q5_K run, Q3_K_M's) write bit for bit what the two GEMVs write one after the other
/// at the same configurations (one for both runs, or the Q6_K run in 2 or 4 rows of
/// 2048 columns), with the input quantized before (`ACT = 0`) or inside the kernel
/// (`ACT = 1`), random biases, outputs poisoned; runs of lengths that leave the last
/// program of each partly masked. A pair in another order, or configurations the
/// kernel is not compiled for, is an error that says so.
#[test]
fn two_quantized_runs_in_one_launch_match_two() {
    use tilefuse_engine::gguf::device::launch_q4_k_q6_k;
    let mut rng = Rng(0x4646);
    let mut devices = vec![Device::cpu()];
    devices.extend(gpu_or_skip("two_quantized_runs_in_one_launch_match_two"));
    let pairs = [
        (GgmlType::Q4_K, GgmlType::Q6_K),
        (GgmlType::Q5_K, GgmlType::Q6_K),
        (GgmlType::Q3_K, GgmlType::Q4_K),
        (GgmlType::Q3_K, GgmlType::Q5_K),
    ];
    for dev in devices {
        // (first run's rows, second run's rows, columns): Qwen3-0.6B's QKV on the GPU.
        let shapes: &[(usize, usize, usize)] = if dev.is_cuda() {
            &[(3072, 1024, 1024), (40, 20, 512)]
        } else {
            &[(40, 20, 512), (24, 9, 256)]
        };
        for (t1, t2) in pairs {
            // A Q3_K run first shares its tile with the second run.
            let one_tile = t1 == GgmlType::Q3_K;
            for &(n1, n2, k) in shapes {
                let c1 = case(&mut rng, t1, n1, k);
                let c2 = case(&mut rng, t2, n2, k);
                let m1 = DeviceQuantMatrix::upload(&dev, &c1.packed).unwrap();
                let m2 = DeviceQuantMatrix::upload(&dev, &c2.packed).unwrap();
                let a = dev.upload(&c1.a).unwrap();
                let norm_w = dev.upload(&c1.norm_w).unwrap();
                let bias: Vec<bf16> = c1.bias.iter().chain(&c2.bias).copied().collect();
                let bias = dev.upload(&bias).unwrap();
                // (rows, columns, warps) of the first run, and the Q6_K run's rows and
                // columns where they differ (without the norm inside only).
                let mut configs = vec![((8, 512, 4), None), ((16, 1024, 8), None)];
                configs.extend([
                    ((8, 1024, 4), Some((2, 2048))),
                    ((8, 1024, 8), Some((4, 2048))),
                ]);
                if dev.is_cuda() {
                    configs.extend([(16, 1024, 4), (8, 1024, 4), (16, 512, 8)].map(|c| (c, None)));
                    configs.extend([
                        ((8, 1024, 4), Some((4, 2048))),
                        ((8, 1024, 8), Some((2, 2048))),
                    ]);
                }
                for ((block_n, block_k, num_warps), tile6) in configs {
                    let cfg = QuantGemvConfig {
                        block_n,
                        block_k,
                        num_warps,
                    };
                    let (block_n6, block_k6) = tile6.unwrap_or((block_n, block_k));
                    let cfg2 = QuantGemvConfig {
                        block_n: block_n6,
                        block_k: block_k6,
                        num_warps,
                    };
                    for fused in [false, true] {
                        let what = format!(
                            "{t1} {n1} + {t2} {n2} x {k} {cfg:?} {cfg2:?} fused={fused} on {dev}"
                        );
                        if (fused || one_tile) && tile6.is_some() {
                            // Not compiled: the launch says so and names both tiles.
                            let mut spare = QuantSpare::new(&dev, k).unwrap();
                            let mut y = dev.zeros(n1 + n2).unwrap();
                            let input = fused.then_some((&a, &norm_w, EPS));
                            let e = launch_q4_k_q6_k(
                                &dev, cfg, cfg2, &m1, &m2, input, &bias, &mut y, &mut spare, false,
                            )
                            .unwrap_err()
                            .to_string();
                            let tile = format!("{block_n6},{block_k6},{num_warps}");
                            assert!(e.contains("compiled:"), "{what}: {e}");
                            assert!(e.contains(&tile), "{what}: {e}");
                            continue;
                        }
                        let mut spare = QuantSpare::new(&dev, k).unwrap();
                        let norm = QuantVariant::Norm {
                            norm_w: &norm_w,
                            eps: EPS,
                        };
                        spare
                            .quantize(&dev, norm, &a, k, false, false, None)
                            .unwrap();
                        let input = fused.then_some((&a, &norm_w, EPS));
                        // Two launches, each run's rows into its part of `want`.
                        let mut want = dev.alloc_filled(n1 + n2, bf16::NAN).unwrap();
                        for (m, row0, cfg) in [(&m1, 0, cfg), (&m2, n1, cfg2)] {
                            let out = QuantOut::Rows {
                                y: &mut want,
                                row0,
                                bias: &bias,
                            };
                            if fused {
                                m.gemv_norm_fused(
                                    &dev, cfg, &a, &norm_w, EPS, out, &mut spare, false,
                                )
                            } else {
                                m.launch_quantized(&dev, cfg, false, out, &mut spare, false)
                            }
                            .unwrap_or_else(|e| panic!("{what}: two launches: {e}"));
                        }
                        let mut got = dev.alloc_filled(n1 + n2, bf16::NAN).unwrap();
                        launch_q4_k_q6_k(
                            &dev, cfg, cfg2, &m1, &m2, input, &bias, &mut got, &mut spare, false,
                        )
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                        let (want, got) = (want.to_vec().unwrap(), got.to_vec().unwrap());
                        for r in 0..n1 + n2 {
                            assert!(
                                want[r].is_finite(),
                                "{what}: row {r} unwritten by two launches"
                            );
                            assert_eq!(
                                got[r].to_bits(),
                                want[r].to_bits(),
                                "{what}: row {r}: {} in one launch, {} in two",
                                got[r],
                                want[r]
                            );
                        }
                    }
                }
                let mut y = dev.zeros(n1 + n2).unwrap();
                let mut spare = QuantSpare::new(&dev, k).unwrap();
                let cfg = QuantGemvConfig::default();
                let e = launch_q4_k_q6_k(
                    &dev, cfg, cfg, &m1, &m2, None, &bias, &mut y, &mut spare, false,
                )
                .unwrap_err()
                .to_string();
                assert!(e.contains("4,512,4"), "{e}");
                let cfg = QuantGemvConfig {
                    block_n: 8,
                    block_k: 512,
                    num_warps: 4,
                };
                let e = launch_q4_k_q6_k(
                    &dev, cfg, cfg, &m2, &m1, None, &bias, &mut y, &mut spare, false,
                )
                .unwrap_err()
                .to_string();
                assert!(e.contains(&format!("not {t2} then {t1}")), "{e}");
            }
        }
    }
}

/// The dequantization kernels the batched prefill runs (`dequantize_into`): rows
/// `row0..row0 + n` of a larger NaN-poisoned bf16 matrix, bit for bit the host model of
/// the device layout (`PackedMatrix::dequantize`, tied to the `gguf` package's
/// dequantizer by `dequantizes_blocks_like_the_gguf_package` in `gguf.rs`) rounded to
/// bf16; every other element untouched. Random blocks with extreme scales (f16's largest
/// and a subnormal), shapes whose rows and blocks do not fill the kernels' tiles.
#[test]
fn dequantization_matches_the_host_model() {
    let mut rng = Rng(0xde0);
    let mut devices = vec![Device::cpu()];
    devices.extend(gpu_or_skip("dequantization_matches_the_host_model"));
    for dev in devices {
        for ty in [
            GgmlType::Q8_0,
            GgmlType::Q5_1,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
            GgmlType::Q3_K,
            GgmlType::Q4_0,
            GgmlType::Q5_0,
            GgmlType::IQ4_XS,
        ] {
            let min_k = ty.block().unwrap().0 as usize;
            let mut shapes = vec![(5, min_k), (9, 1024 + min_k), (24, 512)];
            if dev.is_cuda() {
                shapes.extend([(4096, 1024), (1024, 3072)]);
            }
            for (n, k) in shapes {
                let blocks = random_blocks(&mut rng, ty, n, k, true);
                let packed = PackedMatrix::pack(ty, &blocks, n, k, "w").unwrap();
                let m = DeviceQuantMatrix::upload(&dev, &packed).unwrap();
                let (row0, total) = (3, n + 5);
                let want = packed.dequantize();
                // The step's tile, then every compiled one.
                let tiles = [(1, 8), (1, 32), (4, 8), (4, 32)];
                for tile in std::iter::once(None).chain(tiles.into_iter().map(Some)) {
                    let mut out = dev.alloc_filled(total * k, bf16::NAN).unwrap();
                    match tile {
                        None => m.dequantize_into(&dev, &mut out, row0).unwrap(),
                        Some(t) => m.dequantize_tile(&dev, &mut out, row0, t).unwrap(),
                    }
                    let got = out.to_vec().unwrap();
                    for (i, g) in got.iter().enumerate() {
                        let r = i / k;
                        let w = if (row0..row0 + n).contains(&r) {
                            bf16::from_f32(want[i - row0 * k])
                        } else {
                            bf16::NAN
                        };
                        assert_eq!(
                            g.to_bits(),
                            w.to_bits(),
                            "{ty} {n}x{k} tile {tile:?} on {dev}: row {r}, column {}: {g} against {w}",
                            i % k
                        );
                    }
                }
                let mut out = dev.alloc_filled(total * k, bf16::NAN).unwrap();
                assert!(m.dequantize_tile(&dev, &mut out, 0, (16, 32)).is_err());
                // Past the rows' end is an error, not a write out of bounds.
                let mut short = dev.alloc_filled(n * k - 1, bf16::NAN).unwrap();
                assert!(m.dequantize_into(&dev, &mut short, 0).is_err());
            }
        }
    }
}

/// The multi-token GEMVs of the short prefill (`gemv_tokens`, `q4_k_gemv_tokens` and
/// its twins): for every token, rows `row0..` of its output row are the single-token
/// GEMV's over that token's activation at the same tile (plain and residual); the
/// other columns of `y` (`ldy` wider than the rows) are left alone. The int8 rows
/// (`QuantRows`: the flat quantizer over `tokens x k`, and the SiLU product a row) are
/// the host quantizer's, bit for bit.
#[test]
fn multi_token_gemvs_match_the_single_token_gemv() {
    use tilefuse_engine::gguf::device::{QuantRows, TokensTile};
    let mut rng = Rng(0x70ce_5eed);
    let mut devices = vec![Device::cpu()];
    devices.extend(gpu_or_skip("multi_token_gemvs_match_the_single_token_gemv"));
    for dev in devices {
        for ty in [
            GgmlType::Q8_0,
            GgmlType::Q5_1,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
            GgmlType::Q3_K,
            GgmlType::Q4_0,
            GgmlType::Q5_0,
            GgmlType::IQ4_XS,
        ] {
            let min_k = ty.block().unwrap().0 as usize;
            let mut shapes = vec![(24, 512), (9, 1024 + min_k)];
            let mut token_counts = vec![1, 3, 8, 11];
            if dev.is_cuda() {
                shapes.push((1024, 3072));
                token_counts.push(32);
            }
            for (n, k) in shapes {
                let c = case(&mut rng, ty, n, k);
                let m = DeviceQuantMatrix::upload(&dev, &c.packed).unwrap();
                let bias = dev.upload(&c.bias).unwrap();
                let mut spare = QuantSpare::new(&dev, k).unwrap();
                let (row0, ldy) = (3, n + 7);
                for &tokens in &token_counts {
                    // Row t of the input: fresh values, one block of zeros in row 0.
                    let mut a: Vec<bf16> = (0..tokens * k)
                        .map(|_| bf16::from_f32(rng.unit() * 3.0))
                        .collect();
                    a[..32].fill(bf16::ZERO);
                    let gate_up: Vec<bf16> = (0..tokens * 2 * k)
                        .map(|_| bf16::from_f32(rng.unit() * 4.0))
                        .collect();
                    let old: Vec<bf16> = (0..tokens * ldy)
                        .map(|_| bf16::from_f32(rng.unit() * 4.0))
                        .collect();
                    let a_dev = dev.upload(&a).unwrap();
                    let mut rows = QuantRows::new(&dev, tokens, k).unwrap();

                    // The int8 rows against the host's quantizer.
                    rows.quantize(&dev, &a_dev, tokens, k).unwrap();
                    let flat: Vec<f32> = a.iter().map(|v| v.to_f32()).collect();
                    let (hq, hd) = host_quantize(&flat);
                    let (xq, xd) = rows.activation();
                    assert_eq!(
                        &xq.to_vec().unwrap()[..tokens * k / 4],
                        &hq[..],
                        "{ty} rows on {dev}"
                    );
                    assert_eq!(
                        &xd.to_vec().unwrap()[..tokens * k / 32],
                        &hd[..],
                        "{ty} row scales on {dev}"
                    );
                    let gu_dev = dev.upload(&gate_up).unwrap();
                    rows.quantize_silu_mul(&dev, &gu_dev, tokens, k).unwrap();
                    let silu: Vec<f32> = (0..tokens * k)
                        .map(|e| {
                            let (t, j) = (e / k, e % k);
                            let row = &gate_up[t * 2 * k..];
                            bf16::from_f32(silu_mul_f32(row[j], row[k + j])).to_f32()
                        })
                        .collect();
                    let (hq, hd) = host_quantize(&silu);
                    let (xq, xd) = rows.activation();
                    assert_eq!(
                        &xq.to_vec().unwrap()[..tokens * k / 4],
                        &hq[..],
                        "{ty} SiLU rows on {dev}"
                    );
                    assert_eq!(
                        &xd.to_vec().unwrap()[..tokens * k / 32],
                        &hd[..],
                        "{ty} SiLU scales on {dev}"
                    );
                    rows.quantize(&dev, &a_dev, tokens, k).unwrap();

                    let mut bias_rows = vec![bf16::ZERO; row0];
                    bias_rows.extend(&c.bias);
                    let bias_rows = dev.upload(&bias_rows).unwrap();
                    // Every tile `TokensTile::for_shape` picks, and two others.
                    for (block_n, block_k, t) in [
                        (4, 512, 2),
                        (4, 1024, 2),
                        (8, 1024, 2),
                        (8, 1024, 4),
                        (16, 512, 8),
                        (16, 1024, 2),
                        (16, 1024, 4),
                        (16, 1024, 8),
                    ] {
                        let tile = TokensTile {
                            block_n,
                            block_k,
                            tokens: t,
                        };
                        let cfg = QuantGemvConfig {
                            block_n,
                            block_k,
                            num_warps: 4,
                        };
                        for residual in [false, true] {
                            let what = format!("{ty} {n}x{k} {tokens} tokens {tile:?} residual={residual} on {dev}");
                            let start: Vec<bf16> = if residual {
                                old.clone()
                            } else {
                                vec![bf16::NAN; tokens * ldy]
                            };
                            let mut y = dev.upload(&start).unwrap();
                            m.gemv_tokens(
                                &dev, tile, &rows, &bias_rows, &mut y, row0, ldy, residual,
                            )
                            .unwrap_or_else(|e| panic!("{what}: {e}"));
                            let got = y.to_vec().unwrap();
                            for tok in 0..tokens {
                                let a_t = dev.upload(&a[tok * k..(tok + 1) * k]).unwrap();
                                let mut y_t = dev
                                    .upload(&start[tok * ldy + row0..tok * ldy + row0 + n])
                                    .unwrap();
                                m.gemv(
                                    &dev, cfg, &a_t, None, &bias, &mut y_t, residual, &mut spare,
                                )
                                .unwrap();
                                let want = y_t.to_vec().unwrap();
                                let row = &got[tok * ldy..(tok + 1) * ldy];
                                for r in 0..n {
                                    assert_eq!(
                                        row[row0 + r].to_bits(),
                                        want[r].to_bits(),
                                        "{what}: token {tok} row {r}: {} against {}",
                                        row[row0 + r],
                                        want[r]
                                    );
                                }
                                for col in (0..row0).chain(row0 + n..ldy) {
                                    assert_eq!(
                                        row[col].to_bits(),
                                        start[tok * ldy + col].to_bits(),
                                        "{what}: token {tok} column {col} outside the rows was written"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    // A tile the kernels are not compiled for, and an output too short, are errors.
    let dev = Device::cpu();
    let c = case(&mut rng, GgmlType::Q8_0, 8, 64);
    let m = DeviceQuantMatrix::upload(&dev, &c.packed).unwrap();
    let mut rows = QuantRows::new(&dev, 2, 64).unwrap();
    let a = dev.upload(&vec![bf16::ONE; 128]).unwrap();
    rows.quantize(&dev, &a, 2, 64).unwrap();
    let bias = dev.upload(&c.bias).unwrap();
    let mut y = dev.alloc_filled(16, bf16::NAN).unwrap();
    let odd = TokensTile {
        block_n: 8,
        block_k: 1024,
        tokens: 3,
    };
    let err = m
        .gemv_tokens(&dev, odd, &rows, &bias, &mut y, 0, 8, false)
        .unwrap_err();
    assert!(err.to_string().contains("3 tokens a program"), "{err}");
    let mut short = dev.alloc_filled(15, bf16::NAN).unwrap();
    let tile = TokensTile::for_shape(8, 2);
    assert!(m
        .gemv_tokens(&dev, tile, &rows, &bias, &mut short, 0, 8, false)
        .is_err());
    assert!(
        rows.quantize(&dev, &a, 3, 64).is_err(),
        "more rows than the room"
    );
}

/// The register limits of `q4_k_gemv`'s attribute reach the loaded modules, and the
/// driver's programs an SM agree with the offline occupancy model that `tilefuse
/// inspect` prints (`tilefuse_dsl::back::ptx::occupancy`), at the step's 8B tiles.
#[test]
fn register_limits_reach_the_driver_and_its_occupancy_matches_the_model() {
    use tilefuse_dsl::back::ptx::occupancy::{occupancy_on, SmLimits};
    let Some(gpu) = gpu_or_skip("register_limits_reach_the_driver") else {
        return;
    };
    let (major, minor) = gpu.as_cuda().expect("a CUDA device").compute_capability();
    let Some(sm) = SmLimits::of_part(major as u32, minor as u32) else {
        eprintln!("skipped: no SM figures for compute capability {major}.{minor}");
        return;
    };
    let def = &tilefuse_engine::kernels_quant::Q4_K_GEMV;
    // (BLOCK_N, BLOCK_K, RESIDUAL, warps, the attribute's limit)
    for (n, k, residual, warps, limit) in [
        (4, 2048, 1, 4, Some(64)),
        (4, 2048, 0, 4, Some(64)),
        (16, 1024, 0, 4, Some(80)),
        (16, 1024, 1, 8, None),
        (8, 1024, 0, 4, None),
    ] {
        let consts = [n, k, residual, 0, 0, 0, 0, 0];
        let what = format!("q4_k_gemv {n} x {k}, residual {residual}, {warps} warps");
        let regs = def
            .registers_per_thread(&gpu, &consts, Some(warps))
            .unwrap()
            .expect("a GPU answers");
        if let Some(limit) = limit {
            assert!(
                regs <= limit,
                "{what}: {regs} registers over the limit {limit}"
            );
        }
        let variant = def.variant(&consts, Some(warps)).unwrap();
        let per_sm = def
            .programs_per_sm(&gpu, &consts, Some(warps))
            .unwrap()
            .expect("a GPU answers");
        let model = occupancy_on(sm, regs, warps * 32, variant.shared_bytes);
        assert_eq!(per_sm, model.programs, "{what}: {regs} registers, {model}");
    }
}

/// The timeline's compile-time switch: every `STAMPS = 0` variant of the decode step's
/// quantized kernels compiles no clock read and no stamp store (a graph without a
/// timeline pays nothing for them: docs/perf.md, "The quantized layer's timeline"),
/// and every `STAMPS = 1` variant reads the clock. Checked on the PTX each variant
/// embeds, for sm_90 and sm_80.
#[test]
fn stamp_code_is_compiled_only_into_the_stamped_variants() {
    use tilefuse_dsl::back::ptx::Target;
    let mut switched = Vec::new();
    for def in tilefuse_engine::kernels_quant::all() {
        let Some(at) = def.const_names.iter().position(|&n| n == "STAMPS") else {
            continue;
        };
        switched.push(def.name);
        let mut stamped = [0usize; 2];
        for v in def.variants {
            for target in [Target::Sm90, Target::Sm80] {
                let reads_clock = v.ptx(target).contains("%globaltimer");
                assert_eq!(
                    reads_clock,
                    v.consts[at] == 1,
                    "{} {:?} ({} warps, {target:?}): STAMPS = {} but the clock is {}read",
                    def.name,
                    v.consts,
                    v.num_warps,
                    v.consts[at],
                    if reads_clock { "" } else { "not " }
                );
            }
            stamped[v.consts[at] as usize] += 1;
        }
        // Each switched kernel is compiled both ways, for the same tiles.
        assert_eq!(stamped[0], stamped[1], "{}", def.name);
        assert!(stamped[0] > 0, "{}", def.name);
    }
    switched.sort_unstable();
    assert_eq!(
        switched,
        [
            "attention_combine_quant",
            "q4_k_gemv",
            "q4_k_q6_k_gemv",
            "q6_k_gemv",
            "q8_0_gemv",
            "quantize_act",
            "silu_mul_in_place"
        ]
    );
}
