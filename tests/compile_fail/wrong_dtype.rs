use tilefuse::prelude::*;

#[kernel(BLOCK = [64])]
fn mixed<const BLOCK: usize>(x: Ptr<f32>, y: Ptr<bf16>) {
    let offs = arange(0, BLOCK);
    store(x + offs, load(x + offs) + load(y + offs));
}

fn main() {}
