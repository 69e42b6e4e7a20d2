//! Triton's tutorial 05 (layer normalization, forward) in tilefuse: one program per row
//! of an `f16` matrix; the row is walked in `BLOCK`-wide chunks three times (mean,
//! variance, then normalize with weight and bias), all in `f32`, and the row's mean and
//! `1 / std` are stored for a backward pass. Checked against the host, timed on a GPU
//! (GB/s of reading `x` and writing `y`).
//!
//! `cargo run --release --example tutorial_05_layer_norm`
mod common;
#[path = "common/tutorial.rs"]
mod tutorial;

use tilefuse::prelude::*;

#[kernel(BLOCK = [1024], num_warps = [8])]
#[allow(clippy::too_many_arguments)]
fn layer_norm_fwd<const BLOCK: usize>(
    x: Ptr<f16>,
    y: Ptr<f16>,
    w: Ptr<f16>,
    b: Ptr<f16>,
    mean_out: Ptr<f32>,
    rstd_out: Ptr<f32>,
    n: i32,
    eps: f32,
) {
    let row = program_id(0);
    let cols = arange(0, BLOCK);
    let mut acc = zeros::<f32>([BLOCK]);
    for off in (0..n).step_by(BLOCK) {
        let c = off + cols;
        acc += load(x + row * n + c, c < n, 0.0) as f32;
    }
    let mean = acc.sum(0) / (n as f32);
    let mut var = zeros::<f32>([BLOCK]);
    for off in (0..n).step_by(BLOCK) {
        let c = off + cols;
        let d = select(c < n, load(x + row * n + c, c < n, 0.0) as f32 - mean, 0.0);
        var += d * d;
    }
    let rstd = rsqrt(var.sum(0) / (n as f32) + eps);
    store(mean_out + row, mean);
    store(rstd_out + row, rstd);
    for off in (0..n).step_by(BLOCK) {
        let c = off + cols;
        let m = c < n;
        let v = load(x + row * n + c, m, 0.0) as f32;
        let g = load(w + c, m, 0.0) as f32;
        let h = load(b + c, m, 0.0) as f32;
        store(y + row * n + c, ((v - mean) * rstd * g + h) as f16, m);
    }
}

fn main() -> anyhow::Result<()> {
    let dev = Device::auto();
    let mut rng = common::Rng::new(105);
    let shapes: Vec<(usize, usize)> = if dev.is_cuda() {
        vec![(4096, 1024), (4096, 4096), (4096, 8192), (4096, 16384)]
    } else {
        vec![(3, 100), (2, 2500)]
    };
    let eps = 1e-5f32;
    for (rows, n) in shapes {
        let x: Vec<f16> = rng
            .vec(rows * n)
            .iter()
            .map(|v| f16::from_f32(v * 2.0 + 0.5))
            .collect();
        let w: Vec<f16> = rng
            .vec(n)
            .iter()
            .map(|v| f16::from_f32(1.0 + v / 2.0))
            .collect();
        let b: Vec<f16> = rng.vec(n).iter().map(|&v| f16::from_f32(v)).collect();
        let (bx, bw, bb) = (dev.upload(&x)?, dev.upload(&w)?, dev.upload(&b)?);
        let mut y = dev.alloc_filled(rows * n, f16::NAN)?;
        let mut mean = dev.alloc_filled(rows, f32::NAN)?;
        let mut rstd = dev.alloc_filled(rows, f32::NAN)?;
        let run = |y: &mut Buffer<f16>, mean: &mut Buffer<f32>, rstd: &mut Buffer<f32>| {
            layer_norm_fwd::<1024>::launch(
                &dev,
                rows as u32,
                &bx,
                y,
                &bw,
                &bb,
                mean,
                rstd,
                n as i32,
                eps,
            )
        };
        run(&mut y, &mut mean, &mut rstd)?;
        let got: Vec<f32> = y.to_vec()?.into_iter().map(f32::from).collect();
        let mut want = Vec::with_capacity(rows * n);
        let mut want_stats = Vec::with_capacity(rows);
        for r in x.chunks(n) {
            let mu = r.iter().map(|v| v.to_f64()).sum::<f64>() / n as f64;
            let var = r.iter().map(|v| (v.to_f64() - mu).powi(2)).sum::<f64>() / n as f64;
            let rs = 1.0 / (var + eps as f64).sqrt();
            want_stats.push((mu, rs));
            want.extend(
                r.iter()
                    .zip(w.iter().zip(&b))
                    .map(|(v, (g, h))| (v.to_f64() - mu) * rs * g.to_f64() + h.to_f64()),
            );
        }
        // Absolute error: f16 outputs of magnitude up to ~4 round by up to 2^-9.
        let err = got
            .iter()
            .zip(&want)
            .map(|(&g, &w)| (g as f64 - w).abs())
            .fold(0.0, f64::max);
        anyhow::ensure!(
            err < 5e-3,
            "layer norm disagrees with the host at {rows}x{n}: {err}"
        );
        let (m, s) = (mean.to_vec()?, rstd.to_vec()?);
        for (i, &(mu, rs)) in want_stats.iter().enumerate() {
            anyhow::ensure!(
                (m[i] as f64 - mu).abs() < 1e-5 && ((s[i] as f64 - rs) / rs).abs() < 1e-5,
                "row {i}: mean {} rstd {} want {mu} {rs}",
                m[i],
                s[i]
            );
        }
        let stats = tutorial::time(&dev, || {
            run(&mut y, &mut mean, &mut rstd)?;
            Ok(())
        })?;
        tutorial::report(
            "layer_norm",
            &format!("{rows}x{n}"),
            err,
            stats,
            2 * 2 * (rows * n) as u64,
        );
    }
    Ok(())
}
