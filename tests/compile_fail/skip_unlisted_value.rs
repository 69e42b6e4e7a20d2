use tilefuse::prelude::*;

#[kernel(BLOCK = [64, 128], num_warps = [4, 8], skip(BLOCK = 256, num_warps = 8))]
fn pruned<const BLOCK: usize>(x: Ptr<f32>) {
    let offs = arange(0, BLOCK);
    store(x + offs, load(x + offs));
}

fn main() {}
