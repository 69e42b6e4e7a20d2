//! Kernels shared by the examples, each with a host reference to check it against.

#![allow(dead_code)]

use tilefuse::prelude::*;

/// `out = x + y`.
#[kernel(BLOCK = [256, 1024], num_warps = [4])]
pub fn vector_add<const BLOCK: usize>(x: Ptr<f32>, y: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let offs = program_id(0) * BLOCK + arange(0, BLOCK);
    let mask = offs < n;
    let a = load(x + offs, mask, 0.0);
    let b = load(y + offs, mask, 0.0);
    store(out + offs, a + b, mask);
}

/// Row-wise softmax of a `[rows, n_cols]` matrix, one program per row.
#[kernel(BLOCK = [128, 1024], num_warps = [4])]
pub fn softmax<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, n_cols: i32) {
    let row = program_id(0);
    let cols = arange(0, BLOCK);
    let mask = cols < n_cols;
    let v = load(x + row * n_cols + cols, mask, f32::NEG_INFINITY);
    let e = exp(v - v.max(0));
    store(out + row * n_cols + cols, e / e.sum(0), mask);
}

/// RMSNorm of each row of a bf16 `[rows, n]` matrix (f32 math, bf16 result).
#[kernel(BLOCK = [1024], num_warps = [4])]
pub fn rmsnorm<const BLOCK: usize>(x: Ptr<bf16>, w: Ptr<bf16>, out: Ptr<bf16>, n: i32, eps: f32) {
    let row = program_id(0);
    let cols = arange(0, BLOCK);
    let mask = cols < n;
    let v = load(x + row * n + cols, mask, 0.0) as f32;
    let r = rsqrt((v * v).sum(0) / (n as f32) + eps);
    let g = load(w + cols, mask, 0.0) as f32;
    store(out + row * n + cols, (v * r * g) as bf16, mask);
}

/// `y = W x` for a bf16 row-major `[n, k]` matrix, accumulating in f32.
#[kernel(BLOCK_N = [4], BLOCK_K = [256], num_warps = [4])]
pub fn gemv<const BLOCK_N: usize, const BLOCK_K: usize>(
    w: Ptr<bf16>,
    x: Ptr<bf16>,
    y: Ptr<f32>,
    n: i32,
    k: i32,
) {
    let rows = program_id(0) * BLOCK_N + arange(0, BLOCK_N);
    let row_ok = rows < n;
    let mut acc = zeros::<f32>([BLOCK_N, BLOCK_K]);
    for k0 in (0..k).step_by(BLOCK_K) {
        let cols = k0 + arange(0, BLOCK_K);
        let col_ok = cols < k;
        let xs = load(x + cols, col_ok, 0.0) as f32;
        let mask = row_ok.expand_dims(1) & col_ok.expand_dims(0);
        let ws = load(w + rows.expand_dims(1) * k + cols.expand_dims(0), mask, 0.0) as f32;
        acc += ws * xs.expand_dims(0);
    }
    store(y + rows, acc.sum(1), row_ok);
}

/// A small seeded generator (xorshift*), so examples draw fresh but reproducible inputs.
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let bits = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40;
        bits as f32 / (1u64 << 23) as f32 - 1.0
    }

    /// `n` uniform values.
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.uniform()).collect()
    }
}

/// Largest |a - b| / max(|b|, floor) over two slices.
pub fn max_rel_err(a: &[f32], b: &[f64], floor: f64) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 - y).abs() / y.abs().max(floor))
        .fold(0.0, f64::max)
}

/// Runs `vector_add` and checks it; returns the max relative error.
pub fn check_vector_add(dev: &Device, n: usize, rng: &mut Rng) -> anyhow::Result<f64> {
    let (x, y) = (rng.vec(n), rng.vec(n));
    let (bx, by) = (dev.upload(&x)?, dev.upload(&y)?);
    let mut out = dev.alloc_filled(n, f32::NAN)?;
    vector_add::<1024>::launch(
        dev,
        (n as u32).div_ceil(1024).max(1),
        &bx,
        &by,
        &mut out,
        n as i32,
    )?;
    let got = out.to_vec()?;
    let want: Vec<f64> = x
        .iter()
        .zip(&y)
        .map(|(a, b)| *a as f64 + *b as f64)
        .collect();
    Ok(max_rel_err(&got, &want, 1e-3))
}

/// Runs `softmax` over `[rows, cols]` and checks it.
pub fn check_softmax(dev: &Device, rows: usize, cols: usize, rng: &mut Rng) -> anyhow::Result<f64> {
    let x: Vec<f32> = rng.vec(rows * cols).iter().map(|v| v * 4.0).collect();
    let bx = dev.upload(&x)?;
    let mut out = dev.alloc_filled(rows * cols, f32::NAN)?;
    softmax::<1024>::launch(dev, rows as u32, &bx, &mut out, cols as i32)?;
    let got = out.to_vec()?;
    let mut want = Vec::with_capacity(rows * cols);
    for r in x.chunks(cols) {
        let m = r.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
        let s: f64 = r.iter().map(|&v| (v as f64 - m).exp()).sum();
        want.extend(r.iter().map(|&v| (v as f64 - m).exp() / s));
    }
    Ok(max_rel_err(&got, &want, 1e-6))
}

/// Runs `rmsnorm` over `[rows, n]` and checks it.
pub fn check_rmsnorm(dev: &Device, rows: usize, n: usize, rng: &mut Rng) -> anyhow::Result<f64> {
    let x: Vec<bf16> = rng.vec(rows * n).into_iter().map(bf16::from_f32).collect();
    let w: Vec<bf16> = rng
        .vec(n)
        .into_iter()
        .map(|v| bf16::from_f32(1.0 + v / 2.0))
        .collect();
    let (bx, bw) = (dev.upload(&x)?, dev.upload(&w)?);
    let mut out = dev.alloc_filled(rows * n, bf16::NAN)?;
    rmsnorm::<1024>::launch(dev, rows as u32, &bx, &bw, &mut out, n as i32, 1e-6)?;
    let got: Vec<f32> = out.to_vec()?.into_iter().map(f32::from).collect();
    let mut want = Vec::with_capacity(rows * n);
    for r in x.chunks(n) {
        let ms: f64 = r.iter().map(|v| (v.to_f64()).powi(2)).sum::<f64>() / n as f64;
        let inv = 1.0 / (ms + 1e-6).sqrt();
        want.extend(r.iter().zip(&w).map(|(v, g)| v.to_f64() * inv * g.to_f64()));
    }
    Ok(max_rel_err(&got, &want, 1e-2))
}

/// Runs the bf16 `gemv` for `[n, k]` and checks it.
pub fn check_gemv(dev: &Device, n: usize, k: usize, rng: &mut Rng) -> anyhow::Result<f64> {
    let w: Vec<bf16> = rng.vec(n * k).into_iter().map(bf16::from_f32).collect();
    let x: Vec<bf16> = rng.vec(k).into_iter().map(bf16::from_f32).collect();
    let (bw, bx) = (dev.upload(&w)?, dev.upload(&x)?);
    let mut y = dev.alloc_filled(n, f32::NAN)?;
    gemv::<4, 256>::launch(
        dev,
        (n as u32).div_ceil(4),
        &bw,
        &bx,
        &mut y,
        n as i32,
        k as i32,
    )?;
    let got = y.to_vec()?;
    let want: Vec<f64> = w
        .chunks(k)
        .map(|row| {
            row.iter()
                .zip(&x)
                .map(|(a, b)| a.to_f64() * b.to_f64())
                .sum()
        })
        .collect();
    // Errors relative to the row's scale (sum of |w||x|), as for any dot product.
    let scale = (k as f64).sqrt() * 0.3;
    Ok(max_rel_err(&got, &want, scale))
}
