//! Fused row-wise softmax (max, exp, sum and divide in one pass), checked against the host.
//!
//! `cargo run --release --example softmax`
mod common;

use tilefuse::prelude::*;

fn main() -> anyhow::Result<()> {
    let dev = Device::auto();
    let mut rng = common::Rng::new(2);
    for (rows, cols) in [(4, 1000), (64, 781)] {
        let err = common::check_softmax(&dev, rows, cols, &mut rng)?;
        println!("softmax {rows}x{cols} on {dev}: max rel err {err:.1e}");
        anyhow::ensure!(err < 1e-4, "softmax disagrees with the host reference");
    }
    Ok(())
}
