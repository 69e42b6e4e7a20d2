//! The quick start: compile-time kernels running on the GPU if there is one, otherwise on
//! the CPU interpreter, each checked against a host reference.
//!
//! `cargo run --release --example quickstart`
mod common;

use std::time::Instant;

use tilefuse::prelude::*;

fn main() -> anyhow::Result<()> {
    let dev = Device::auto();
    println!("tilefuse quickstart on {dev}");
    if !dev.is_cuda() {
        println!("(no CUDA device found: running the CPU interpreter, the language's reference semantics)");
    }
    let mut rng = common::Rng::new(7);
    let big = dev.is_cuda();
    let t = Instant::now();
    let checks: Vec<(&str, f64, f64)> = vec![
        (
            "vector_add",
            common::check_vector_add(&dev, if big { 1 << 24 } else { 100_000 }, &mut rng)?,
            1e-6,
        ),
        (
            "softmax",
            common::check_softmax(&dev, 64, 1000, &mut rng)?,
            1e-4,
        ),
        (
            "rmsnorm",
            common::check_rmsnorm(&dev, 16, 1024, &mut rng)?,
            2e-2,
        ),
        (
            "gemv (bf16)",
            common::check_gemv(&dev, if big { 4096 } else { 256 }, 1024, &mut rng)?,
            1e-4,
        ),
    ];
    for (name, err, tol) in &checks {
        let verdict = if err < tol { "ok" } else { "MISMATCH" };
        println!("  {name:<12} max rel err {err:.1e} (tolerance {tol:.0e}) {verdict}");
    }
    println!(
        "all kernels ran in {:.1} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    anyhow::ensure!(
        checks.iter().all(|(_, e, t)| e < t),
        "a kernel disagreed with its reference"
    );
    Ok(())
}
