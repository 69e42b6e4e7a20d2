//! Triton's tutorial 04 (low-memory dropout) in tilefuse: the keep mask is not stored but
//! regenerated from a seed and each element's offset with `rand` (Philox4x32-10, the same
//! stream as Triton's `tl.rand`). Checked against a host Philox written from the
//! algorithm's definition, timed on a GPU (GB/s of one read and one write).
//!
//! `cargo run --release --example tutorial_04_dropout`
mod common;
#[path = "common/tutorial.rs"]
mod tutorial;

use tilefuse::prelude::*;

/// `out = x / (1 - p)` where `rand(seed, offset) > p`, else 0.
#[kernel(BLOCK = [1024], num_warps = [4])]
fn seeded_dropout<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32, p: f32, seed: i64) {
    let offs = program_id(0) * BLOCK + arange(0, BLOCK);
    let mask = offs < n;
    let v = load(x + offs, mask, 0.0);
    let keep = rand(seed, offs) > p;
    store(out + offs, select(keep, v / (1.0 - p), 0.0), mask);
}

/// Philox4x32-10 (Salmon et al., SC 2011): the first output word for counter
/// `(c, 0, 0, 0)` and a 64-bit key, as `tl.randint`.
fn philox_word(c: u32, key: u64) -> u32 {
    let (mut c0, mut c1, mut c2, mut c3) = (c, 0u32, 0u32, 0u32);
    let (mut k0, mut k1) = (key as u32, (key >> 32) as u32);
    for _ in 0..10 {
        let p0 = 0xD251_1F53u64 * c0 as u64;
        let p1 = 0xCD9E_8D57u64 * c2 as u64;
        (c0, c1, c2, c3) = (
            (p1 >> 32) as u32 ^ c1 ^ k0,
            p1 as u32,
            (p0 >> 32) as u32 ^ c3 ^ k1,
            p0 as u32,
        );
        k0 = k0.wrapping_add(0x9E37_79B9);
        k1 = k1.wrapping_add(0xBB67_AE85);
    }
    c0
}

/// `tl.rand`'s mapping of a word to [0, 1).
fn uniform(w: u32) -> f32 {
    let i = w as i32;
    let i = if i < 0 { !i } else { i };
    i as f32 * f32::from_bits(0x2fff_ffff)
}

fn main() -> anyhow::Result<()> {
    let dev = Device::auto();
    let mut rng = common::Rng::new(104);
    let sizes: Vec<usize> = if dev.is_cuda() {
        vec![1 << 16, 1 << 20, 1 << 24, 1 << 26]
    } else {
        vec![10, 5000]
    };
    let p = 0.5f32;
    for n in sizes {
        let x = rng.vec(n);
        let bx = dev.upload(&x)?;
        let mut out = dev.alloc_filled(n, f32::NAN)?;
        let grid = (n as u32).div_ceil(1024);
        let seed = 123_456_789_i64;
        seeded_dropout::<1024>::launch(&dev, grid, &bx, &mut out, n as i32, p, seed)?;
        let got = out.to_vec()?;
        let want: Vec<f64> = (0..n)
            .map(|i| {
                if uniform(philox_word(i as u32, seed as u64)) > p {
                    (x[i] / (1.0 - p)) as f64
                } else {
                    0.0
                }
            })
            .collect();
        let err = common::max_rel_err(&got, &want, 1e-3);
        anyhow::ensure!(
            err < 1e-6,
            "dropout disagrees with the host Philox at n = {n}"
        );
        let kept = want.iter().filter(|&&v| v != 0.0).count() as f64 / n as f64;
        anyhow::ensure!(
            n < 1000 || (kept - 0.5).abs() < 0.05,
            "kept {kept:.3} of the elements"
        );
        // Another seed draws another mask.
        seeded_dropout::<1024>::launch(&dev, grid, &bx, &mut out, n as i32, p, seed + 1)?;
        anyhow::ensure!(
            n < 1000 || out.to_vec()? != got,
            "the seed does not change the mask"
        );
        let stats = tutorial::time(&dev, || {
            seeded_dropout::<1024>::launch(&dev, grid, &bx, &mut out, n as i32, p, seed)?;
            Ok(())
        })?;
        tutorial::report("dropout", &format!("n={n}"), err, stats, 2 * 4 * n as u64);
    }
    Ok(())
}
