use tilefuse::prelude::*;

// Two stages fit; eight rings of a 128 x 256 x 64 tile do not: the error names the
// limit and the variant to leave out.
#[kernel(BM = [128], BN = [256], BK = [64], num_warps = [8], num_stages = [2, 8])]
fn deep<const BM: usize, const BN: usize, const BK: usize>(
    a: Ptr<bf16>,
    b: Ptr<bf16>,
    c: Ptr<f32>,
    #[multiple_of(16)] n: i32,
    #[multiple_of(16)] k: i32,
) {
    let rm = arange(0, BM);
    let rn = arange(0, BN);
    let rk = arange(0, BK);
    let mut pa = a + rm.expand_dims(1) * k + rk.expand_dims(0);
    let mut pb = b + rk.expand_dims(1) * n + rn.expand_dims(0);
    let mut acc = zeros::<f32>([BM, BN]);
    for _k0 in (0..k).step_by(BK) {
        acc = dot(load(pa), load(pb), acc);
        pa += BK;
        pb += BK * n;
    }
    store(c + rm.expand_dims(1) * n + rn.expand_dims(0), acc);
}

fn main() {}
