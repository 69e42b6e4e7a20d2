use tilefuse::prelude::*;

#[kernel(BLOCK = [48])]
fn odd<const BLOCK: usize>(x: Ptr<f32>) {
    let offs = arange(0, BLOCK);
    store(x + offs, load(x + offs));
}

fn main() {}
