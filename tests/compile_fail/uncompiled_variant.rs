use tilefuse::prelude::*;

#[kernel(BLOCK = [64, 128])]
fn copy<const BLOCK: usize>(x: Ptr<f32>, y: Ptr<f32>) {
    let offs = program_id(0) * BLOCK + arange(0, BLOCK);
    store(y + offs, load(x + offs));
}

fn main() {
    let dev = Device::cpu();
    let x = dev.upload(&[0.0f32; 256]).unwrap();
    let mut y = dev.zeros::<f32>(256).unwrap();
    copy::<256>::launch(&dev, 1, &x, &mut y).unwrap();
}
