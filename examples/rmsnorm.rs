//! RMSNorm over bf16 rows with f32 math, checked against the host.
//!
//! `cargo run --release --example rmsnorm`
mod common;

use tilefuse::prelude::*;

fn main() -> anyhow::Result<()> {
    let dev = Device::auto();
    let mut rng = common::Rng::new(3);
    for (rows, n) in [(3, 1024), (16, 1000)] {
        let err = common::check_rmsnorm(&dev, rows, n, &mut rng)?;
        println!("rmsnorm {rows}x{n} on {dev}: max rel err {err:.1e}");
        anyhow::ensure!(err < 2e-2, "rmsnorm disagrees with the host reference");
    }
    Ok(())
}
