//! The typed launch items `#[kernel]` generates (`<Name>Args`, `<Name>Consts`): a launch
//! with named arguments and run-time constants computes what the const-generic launch
//! computes, and constants no variant was compiled for are a clear error. Runs on the
//! interpreter (and the GPU when there is one).

use tilefuse::dsl::runtime::testing::gpu_or_skip;
use tilefuse::dsl::runtime::KernelConsts;
use tilefuse::prelude::*;

/// `out = x * scale + y` over `n` elements, `BLOCK` a program.
#[kernel(BLOCK = [32, 128], num_warps = [4, 8])]
fn scaled_add<const BLOCK: usize>(x: Ptr<f32>, y: Ptr<f32>, out: Ptr<f32>, scale: f32, n: i32) {
    let offs = program_id(0) * BLOCK + arange(0, BLOCK);
    let mask = offs < n;
    let v = load(x + offs, mask, 0.0) * scale + load(y + offs, mask, 0.0);
    store(out + offs, v, mask);
}

/// Seeded values in `[-1, 1)` (splitmix64), never zero.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            let u = ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32;
            2.0 * u - 1.0 + 1e-3
        })
        .collect()
}

#[test]
fn typed_launches_match_the_host_and_name_missing_variants() {
    let mut devs = vec![Device::cpu()];
    devs.extend(gpu_or_skip("typed_launches_match_the_host"));
    let n = 301;
    let (xs, ys) = (values(n, 1), values(n, 2));
    let want: Vec<f32> = xs.iter().zip(&ys).map(|(x, y)| x * 0.75 + y).collect();
    // Every compiled variant, from the generated list.
    let compiled = ScaledAddConsts::compiled();
    assert_eq!(compiled.len(), 4, "{compiled:?}");
    assert_eq!(
        ScaledAddConsts::from_values(&[128]),
        Some(ScaledAddConsts { block: 128 })
    );
    assert_eq!(ScaledAddConsts::from_values(&[128, 1]), None);
    assert_eq!(ScaledAddConsts { block: 32 }.values(), vec![32]);
    for dev in devs {
        let x = dev.upload(&xs).unwrap();
        let y = dev.upload(&ys).unwrap();
        for (consts, num_warps) in &compiled {
            let mut out = dev.alloc_filled(n, f32::NAN).unwrap();
            let grid = LaunchConfig::from(n.div_ceil(consts.block) as u32).num_warps(*num_warps);
            ScaledAddArgs {
                x: &x,
                y: &y,
                out: &mut out,
                scale: 0.75,
                n: n as i32,
            }
            .launch(&dev, grid, *consts)
            .unwrap();
            let got = out.to_vec().unwrap();
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-6 * w.abs().max(1.0),
                    "{dev} {consts:?} [{i}]: {g} vs {w}"
                );
            }
        }
        // The same launch through the const-generic API.
        let mut out = dev.alloc_filled(n, f32::NAN).unwrap();
        scaled_add::<32>::launch(
            &dev,
            n.div_ceil(32) as u32,
            &x,
            &y,
            &mut out,
            0.75,
            n as i32,
        )
        .unwrap();
        assert_eq!(out.to_vec().unwrap().len(), n);
        // Constants no variant was compiled for: the error lists the compiled ones.
        let err = ScaledAddArgs {
            x: &x,
            y: &y,
            out: &mut out,
            scale: 1.0,
            n: n as i32,
        }
        .launch(&dev, 1, ScaledAddConsts { block: 64 })
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("scaled_add") && err.contains("BLOCK=128"),
            "{err}"
        );
        assert!(ScaledAddConsts { block: 64 }.check(4).is_err());
        assert_eq!(
            ScaledAddConsts { block: 128 }.describe(8),
            "BLOCK=128, num_warps=8"
        );
    }
}
