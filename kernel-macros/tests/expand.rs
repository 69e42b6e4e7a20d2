//! `#[kernel]` expansion: the generated launch API and kernel description, run on the CPU
//! interpreter (and on the GPU when one is present).

use tilefuse_dsl::ir::{DType, ParamKind};
use tilefuse_dsl::runtime::{Device, LaunchConfig};
use tilefuse_macros::kernel;

/// `out[i] = x[i] * s + i` over `n` elements.
#[kernel(crate = tilefuse_dsl, BLOCK = [32, 128], num_warps = [1, 4])]
fn scale_iota<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32, s: f32) {
    let offs = program_id(0) * BLOCK + arange(0, BLOCK);
    let mask = offs < n;
    store(
        out + offs,
        load(x + offs, mask, 0.0) * s + offs as f32,
        mask,
    );
}

fn devices() -> Vec<Device> {
    let mut devs = vec![Device::cpu()];
    if let Some(gpu) = tilefuse_dsl::runtime::testing::gpu_or_skip("expand") {
        devs.push(gpu);
    }
    devs
}

#[test]
fn description_lists_every_variant_and_the_written_parameter() {
    assert_eq!(SCALE_IOTA.name, "scale_iota");
    assert_eq!(SCALE_IOTA.const_names, &["BLOCK"]);
    assert_eq!(SCALE_IOTA.variants.len(), 4);
    let kinds: Vec<_> = SCALE_IOTA
        .params
        .iter()
        .map(|p| (p.name, p.kind, p.written))
        .collect();
    assert_eq!(
        kinds,
        vec![
            ("x", ParamKind::Ptr(DType::F32), false),
            ("out", ParamKind::Ptr(DType::F32), true),
            ("n", ParamKind::Scalar(DType::I32), false),
            ("s", ParamKind::Scalar(DType::F32), false),
        ]
    );
    for v in SCALE_IOTA.variants {
        assert!(
            v.ptx_sm80.as_str().contains(".entry")
                && format!("{:?}", v.ptx_sm80).contains("deflated"),
            "PTX is embedded at build time, deflated"
        );
    }
}

#[test]
fn typed_launch_matches_the_host_on_every_device_and_variant() {
    for dev in devices() {
        for n in [0usize, 1, 31, 1000] {
            let x: Vec<f32> = (0..n)
                .map(|i| ((i * 37 % 101) as f32) / 7.0 - 5.0)
                .collect();
            let bx = dev.upload(&x).unwrap();
            let want: Vec<f32> = x
                .iter()
                .enumerate()
                .map(|(i, v)| v * 1.5 + i as f32)
                .collect();
            let mut out = dev.alloc_filled(n.max(1), f32::NAN).unwrap();
            let grid = (n as u32).div_ceil(32).max(1);
            scale_iota::<32>::launch(&dev, grid, &bx, &mut out, n as i32, 1.5).unwrap();
            assert_eq!(
                &out.to_vec().unwrap()[..n],
                &want[..],
                "{dev}, BLOCK=32, n={n}"
            );
            let mut out = dev.alloc_filled(n.max(1), f32::NAN).unwrap();
            let cfg = LaunchConfig::from((n as u32).div_ceil(128).max(1)).num_warps(1);
            scale_iota::<128>::launch(&dev, cfg, &bx, &mut out, n as i32, 1.5).unwrap();
            assert_eq!(
                &out.to_vec().unwrap()[..n],
                &want[..],
                "{dev}, BLOCK=128, n={n}"
            );
        }
    }
}

#[test]
fn uncompiled_num_warps_is_a_clear_error() {
    let dev = Device::cpu();
    let x = dev.upload(&[1.0f32; 4]).unwrap();
    let mut out = dev.zeros::<f32>(4).unwrap();
    let err = scale_iota::<32>::launch(
        &dev,
        LaunchConfig::from(1).num_warps(8),
        &x,
        &mut out,
        4,
        1.0,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("scale_iota") && err.contains("num_warps"),
        "{err}"
    );
}

/// `out[i] = x[i]` when `COPY == 1`; the `COPY == 0` variant, listed first, stores
/// nothing.
#[kernel(crate = tilefuse_dsl, COPY = [0, 1], num_warps = [1])]
fn maybe_copy<const COPY: usize>(x: Ptr<f32>, out: Ptr<f32>) {
    let offs = arange(0, 32);
    if COPY == 1 {
        store(out + offs, load(x + offs));
    }
}

#[test]
fn a_parameter_any_variant_writes_is_written() {
    assert!(MAYBE_COPY.params[1].written, "`out` is stored by COPY = 1");
    assert!(!MAYBE_COPY.params[0].written);
    let dev = Device::cpu();
    let x: Vec<f32> = (0..32).map(|i| i as f32 * 0.5 - 3.0).collect();
    let bx = dev.upload(&x).unwrap();
    let mut out = dev.alloc_filled(32, f32::NAN).unwrap();
    maybe_copy::<1>::launch(&dev, 1, &bx, &mut out).unwrap();
    assert_eq!(out.to_vec().unwrap(), x);
    let mut untouched = dev.alloc_filled(32, 7.0f32).unwrap();
    maybe_copy::<0>::launch(&dev, 1, &bx, &mut untouched).unwrap();
    assert_eq!(untouched.to_vec().unwrap(), vec![7.0; 32]);
}
