//! Helpers shared by the kernel tests (`kernels.rs`, `prefill.rs`): bf16 rounding, the
//! devices to run on, launches that name the kernel and variant on failure, checks
//! against f64 host references, and the RoPE tables as the decoder builds them.

use tilefuse_dsl::half::bf16;
use tilefuse_dsl::runtime::testing::gpu_or_skip;
use tilefuse_dsl::runtime::{Device, KernelArg, KernelDef, LaunchConfig};

/// The RMSNorm epsilon of the test models.
pub const EPS: f32 = 1e-6;

/// Rounds to bf16 (nearest even) and back.
pub fn bf(x: f32) -> f32 {
    bf16::from_f32(x).to_f32()
}

/// bf16 values widened to f32.
pub fn f32s(v: &[bf16]) -> Vec<f32> {
    v.iter().map(|x| x.to_f32()).collect()
}

/// The interpreter, and the GPU when one is usable.
pub fn devices(test: &str) -> Vec<Device> {
    let mut d = vec![Device::cpu()];
    d.extend(gpu_or_skip(test));
    d
}

/// Launches one variant of `def`; a failure names the kernel, constants and device.
pub fn launch(
    def: &KernelDef,
    dev: &Device,
    cfg: LaunchConfig,
    consts: &[i64],
    args: &mut [KernelArg<'_>],
) {
    def.launch_dyn(dev, cfg, consts, args)
        .unwrap_or_else(|e| panic!("{} {consts:?} on {dev}: {e}", def.name));
}

/// Checks `got[i]` against `want[i]` within `tol[i]`; NaN (unwritten) always fails.
/// Over many elements the relative L2 error must also stay below 1e-2 (over a few, one
/// cancellation dominates it).
pub fn check(what: &str, got: &[f32], want: &[f64], tol: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let (mut err2, mut ref2) = (0.0, 0.0);
    for i in 0..got.len() {
        let g = got[i] as f64;
        assert!(
            g.is_finite() && (g - want[i]).abs() <= tol[i],
            "{what}: element {i}: got {g}, want {} (tol {:.3e})",
            want[i],
            tol[i]
        );
        err2 += (g - want[i]).powi(2);
        ref2 += want[i].powi(2);
    }
    let rel = (err2 / ref2.max(1e-30)).sqrt();
    assert!(
        got.len() < 32 || rel < 1e-2,
        "{what}: relative L2 error {rel:.2e}"
    );
}

/// One bf16 ulp at |v| (relative 2^-7) plus room for f32 accumulation order.
pub fn tol_bf16(v: f64, abs_sum: f64) -> f64 {
    v.abs() / 128.0 + abs_sum * 1e-4 + 1e-30
}

/// RMSNorm of each `k`-long row as the reference rounds it: `bf16(g * bf16(x * inv_rms))`,
/// the mean of squares and `inv_rms` in f32.
pub fn host_norm_rows(x: &[f32], g: &[f32], k: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(k) {
        let mean_sq = row.iter().map(|v| v * v).sum::<f32>() / k as f32;
        let inv = 1.0 / (mean_sq + EPS).sqrt();
        out.extend(row.iter().zip(g).map(|(v, w)| bf(w * bf(v * inv))));
    }
    out
}

/// Host cos/sin tables, `[max_seq, d / 2]`, as the decoder builds them (`rope::inv_freq`
/// without scaling): bf16-rounded cos/sin of `pos * inv_freq`.
pub fn rope_tables(d: usize, max_seq: usize, theta: f32) -> (Vec<f32>, Vec<f32>) {
    let inv: Vec<f32> = (0..d / 2)
        .map(|i| 1.0 / theta.powf((2 * i) as f32 / d as f32))
        .collect();
    let (mut cos, mut sin) = (Vec::new(), Vec::new());
    for pos in 0..max_seq {
        for fr in &inv {
            cos.push(bf((fr * pos as f32).cos()));
            sin.push(bf((fr * pos as f32).sin()));
        }
    }
    (cos, sin)
}
