//! bf16 GEMV `y = W x` with f32 accumulation, checked against the host.
//!
//! `cargo run --release --example gemv`
mod common;

use tilefuse::prelude::*;

fn main() -> anyhow::Result<()> {
    let dev = Device::auto();
    let mut rng = common::Rng::new(4);
    for (n, k) in [(1, 1), (37, 1000), (256, 1024)] {
        let err = common::check_gemv(&dev, n, k, &mut rng)?;
        println!("gemv {n}x{k} on {dev}: max rel err {err:.1e}");
        anyhow::ensure!(err < 1e-4, "gemv disagrees with the host reference");
    }
    Ok(())
}
