use tilefuse::prelude::*;

#[kernel(num_warps = [4])]
fn unlisted<const BLOCK: usize>(x: Ptr<f32>) {
    let offs = arange(0, BLOCK);
    store(x + offs, load(x + offs));
}

fn main() {}
