use tilefuse::prelude::*;

mod act {
    use tilefuse::prelude::*;

    /// A helper, found through `use`.
    #[tile_fn]
    pub fn silu(x: Tile<f32>) -> Tile<f32> {
        x * sigmoid(x)
    }
}

use act::silu;

#[kernel]
fn uses_helpers(x: Ptr<f32>) {
    let offs = arange(0, 32);
    // `silu` is a helper; `gelu` is no helper at all.
    store(x + offs, silu(load(x + offs)) + gelu(load(x + offs)));
}

fn main() {}
