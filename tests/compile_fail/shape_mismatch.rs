use tilefuse::prelude::*;

#[kernel]
fn mismatch(x: Ptr<f32>) {
    let a = arange(0, 128) + arange(0, 64);
    store(x + arange(0, 128), a as f32);
}

fn main() {}
