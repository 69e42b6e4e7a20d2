//! Vector add: the smallest tilefuse kernel, checked against the host.
//!
//! `cargo run --release --example vector_add`
mod common;

use tilefuse::prelude::*;

fn main() -> anyhow::Result<()> {
    let dev = Device::auto();
    let mut rng = common::Rng::new(1);
    for n in [1, 1000, 1 << 20] {
        let err = common::check_vector_add(&dev, n, &mut rng)?;
        println!("vector_add n={n:>8} on {dev}: max rel err {err:.1e}");
        anyhow::ensure!(err < 1e-6, "vector_add disagrees with the host reference");
    }
    Ok(())
}
