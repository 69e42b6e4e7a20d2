use tilefuse::prelude::*;

#[kernel]
fn runtime_shape(x: Ptr<f32>, n: i32) {
    let acc = zeros::<f32>([n]);
    store(x + arange(0, 32), acc);
}

fn main() {}
