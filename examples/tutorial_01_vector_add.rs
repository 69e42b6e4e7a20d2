//! Triton's tutorial 01 (vector addition) in tilefuse: `out = x + y` in blocks of 1024,
//! checked against the host, timed on a GPU (GB/s of the three `f32` streams).
//!
//! `cargo run --release --example tutorial_01_vector_add`
//!
//! The kernel is `common::vector_add` (also the `vector_add` example); Triton's version
//! is in `benches/peers/tutorials.py`, and docs/perf.md compares the two.
mod common;
#[path = "common/tutorial.rs"]
mod tutorial;

use tilefuse::prelude::*;

fn main() -> anyhow::Result<()> {
    let dev = Device::auto();
    let mut rng = common::Rng::new(101);
    // Ragged sizes on the interpreter; the tutorial's large sizes on a GPU.
    let sizes: Vec<usize> = if dev.is_cuda() {
        vec![1 << 12, 1 << 16, 1 << 20, 1 << 24, 1 << 26]
    } else {
        vec![1, 1000, 98_432]
    };
    for n in sizes {
        let (x, y) = (rng.vec(n), rng.vec(n));
        let (bx, by) = (dev.upload(&x)?, dev.upload(&y)?);
        let mut out = dev.alloc_filled(n, f32::NAN)?;
        let grid = (n as u32).div_ceil(1024);
        common::vector_add::<1024>::launch(&dev, grid, &bx, &by, &mut out, n as i32)?;
        let want: Vec<f64> = x
            .iter()
            .zip(&y)
            .map(|(a, b)| *a as f64 + *b as f64)
            .collect();
        let err = common::max_rel_err(&out.to_vec()?, &want, 1e-3);
        anyhow::ensure!(err < 1e-6, "vector add disagrees with the host at n = {n}");
        let stats = tutorial::time(&dev, || {
            common::vector_add::<1024>::launch(&dev, grid, &bx, &by, &mut out, n as i32)?;
            Ok(())
        })?;
        tutorial::report(
            "vector_add",
            &format!("n={n}"),
            err,
            stats,
            3 * 4 * n as u64,
        );
    }
    Ok(())
}
