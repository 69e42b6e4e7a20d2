//! Triton's tutorial 02 (fused softmax) in tilefuse: one program per row reads the row
//! once, takes its max, exponentiates, sums and divides in registers, and writes it once.
//! `BLOCK` is the smallest compiled power of two holding a row. Checked against the host,
//! timed on a GPU (GB/s of one read and one write of the matrix).
//!
//! `cargo run --release --example tutorial_02_fused_softmax`
mod common;
#[path = "common/tutorial.rs"]
mod tutorial;

use tilefuse::prelude::*;

/// Row-wise softmax of a `[rows, n_cols]` matrix whose rows are `stride` apart.
#[kernel(BLOCK = [256, 1024, 4096], num_warps = [8])]
fn softmax<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, stride: i32, n_cols: i32) {
    let row = program_id(0);
    let cols = arange(0, BLOCK);
    let mask = cols < n_cols;
    let v = load(x + row * stride + cols, mask, f32::NEG_INFINITY);
    let e = exp(v - v.max(0));
    store(out + row * stride + cols, e / e.sum(0), mask);
}

fn launch(
    dev: &Device,
    x: &Buffer<f32>,
    out: &mut Buffer<f32>,
    rows: usize,
    cols: usize,
) -> anyhow::Result<()> {
    let (r, c) = (rows as u32, cols as i32);
    match cols {
        0..=256 => softmax::<256>::launch(dev, r, x, out, c, c)?,
        257..=1024 => softmax::<1024>::launch(dev, r, x, out, c, c)?,
        1025..=4096 => softmax::<4096>::launch(dev, r, x, out, c, c)?,
        _ => anyhow::bail!("rows of {cols} columns: the kernel holds at most 4096"),
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let dev = Device::auto();
    let mut rng = common::Rng::new(102);
    let shapes: Vec<(usize, usize)> = if dev.is_cuda() {
        vec![
            (4096, 256),
            (4096, 781),
            (4096, 1024),
            (4096, 2048),
            (4096, 4096),
        ]
    } else {
        vec![(3, 100), (5, 781), (2, 3000)]
    };
    for (rows, cols) in shapes {
        let x: Vec<f32> = rng.vec(rows * cols).iter().map(|v| v * 8.0).collect();
        let bx = dev.upload(&x)?;
        let mut out = dev.alloc_filled(rows * cols, f32::NAN)?;
        launch(&dev, &bx, &mut out, rows, cols)?;
        let mut want = Vec::with_capacity(rows * cols);
        for r in x.chunks(cols) {
            let m = r.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
            let s: f64 = r.iter().map(|&v| (v as f64 - m).exp()).sum();
            want.extend(r.iter().map(|&v| (v as f64 - m).exp() / s));
        }
        let err = common::max_rel_err(&out.to_vec()?, &want, 1e-6);
        anyhow::ensure!(
            err < 1e-4,
            "softmax disagrees with the host at {rows}x{cols}"
        );
        let stats = tutorial::time(&dev, || launch(&dev, &bx, &mut out, rows, cols))?;
        let bytes = 2 * 4 * (rows * cols) as u64;
        tutorial::report("softmax", &format!("{rows}x{cols}"), err, stats, bytes);
    }
    Ok(())
}
