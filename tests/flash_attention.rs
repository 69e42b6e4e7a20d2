//! `tilefuse::kernels::flash_attention` against the host f64 reference: on the CPU
//! interpreter (small shapes, every compiled tile configuration) and, when there is
//! one, on the GPU (the same shapes plus 16 query heads over 8 KV heads at 1000 tokens,
//! spot-checked), with seeded random bf16 inputs. Bad shapes are errors naming the size
//! or tensor.

use tilefuse::dsl::runtime::testing::{gpu_or_skip, gpu_turn};
use tilefuse::engine::bench::Rng;
use tilefuse::kernels::flash_attention::{
    self, reference_row, AttentionShape, FlashConfig, HEAD_DIM,
};
use tilefuse::prelude::*;

/// The output's bf16 rounding plus the probabilities rounded to bf16 before `P V`.
const TOLERANCE: f64 = 1e-2;

fn shape(seq: usize, num_heads: usize, num_kv_heads: usize) -> AttentionShape {
    AttentionShape {
        seq,
        num_heads,
        num_kv_heads,
        head_dim: HEAD_DIM,
    }
}

/// Runs the kernel on seeded random inputs and returns the largest difference from the
/// reference over `rows` (every row when `None`); NaN counts as infinite.
fn max_error(
    dev: &Device,
    shape: AttentionShape,
    cfg: FlashConfig,
    seed: u64,
    rows: Option<&[(usize, usize)]>,
) -> f64 {
    let mut rng = Rng::new(seed);
    // Queries larger than keys: a peaked softmax, so a wrong scale or mask shows.
    let q = rng.bf16_vec(shape.q_len(), 3.0);
    let k = rng.bf16_vec(shape.kv_len(), 1.0);
    let v = rng.bf16_vec(shape.kv_len(), 1.0);
    let (qd, kd, vd) = (
        dev.upload(&q).unwrap(),
        dev.upload(&k).unwrap(),
        dev.upload(&v).unwrap(),
    );
    let mut out = dev.alloc_filled(shape.q_len(), bf16::NAN).unwrap();
    flash_attention::launch(dev, &qd, &kd, &vd, &mut out, shape, cfg)
        .unwrap_or_else(|e| panic!("{shape:?} {cfg:?}: {e}"));
    let got = out.to_vec().unwrap();
    let all: Vec<(usize, usize)> = (0..shape.seq)
        .flat_map(|t| (0..shape.num_heads).map(move |h| (t, h)))
        .collect();
    flash_attention::max_error(&got, &q, &k, &v, shape, rows.unwrap_or(&all))
}

/// Every configuration on the shapes that exercise the edges: a sequence shorter than
/// one tile, one not a multiple of any tile (so both key loops run and the last tile is
/// masked), and GQA with one and with two KV heads.
fn check_small_shapes(dev: &Device) {
    for (seq, heads, kv_heads) in [(5, 2, 1), (70, 2, 1), (40, 4, 2)] {
        for cfg in FlashConfig::ALL {
            let s = shape(seq, heads, kv_heads);
            let err = max_error(dev, s, cfg, seq as u64, None);
            assert!(
                err < TOLERANCE,
                "{dev}: {s:?} {cfg:?}: max abs err {err:.3e}"
            );
        }
    }
}

#[test]
fn interpreter_matches_reference() {
    check_small_shapes(&Device::cpu());
}

/// The reference itself, on inputs where the answer is known: equal scores average the
/// visible values; a dominant key takes all the weight; the mask hides later keys.
#[test]
fn reference_known_answers() {
    let s = shape(3, 2, 1);
    let q = vec![bf16::from_f32(0.5); s.q_len()];
    let k = vec![bf16::from_f32(0.25); s.kv_len()];
    let v: Vec<bf16> = (0..s.kv_len())
        .map(|i| bf16::from_f32((i / HEAD_DIM + 1) as f32))
        .collect();
    assert!(reference_row(&q, &k, &v, s, 0, 1).iter().all(|&x| x == 1.0));
    assert!(reference_row(&q, &k, &v, s, 2, 0)
        .iter()
        .all(|&x| (x - 2.0).abs() < 1e-12));
    // Key 1 far above key 0 for token 1: its value wins; token 0 still sees only key 0.
    let mut k2 = k.clone();
    k2[HEAD_DIM..2 * HEAD_DIM].fill(bf16::from_f32(8.0));
    assert!(reference_row(&q, &k2, &v, s, 1, 0)
        .iter()
        .all(|&x| (x - 2.0).abs() < 1e-6));
    assert!(reference_row(&q, &k2, &v, s, 0, 0)
        .iter()
        .all(|&x| x == 1.0));
}

#[test]
fn bad_shapes_are_errors_naming_the_problem() {
    let dev = Device::cpu();
    let s = shape(4, 2, 1);
    let q = dev.alloc_filled(s.q_len(), bf16::ONE).unwrap();
    let kv = dev.alloc_filled(s.kv_len(), bf16::ONE).unwrap();
    let mut out = dev.alloc_filled(s.q_len(), bf16::NAN).unwrap();
    let cfg = FlashConfig::SMALL;
    let err = |shape: AttentionShape, k: &Buffer<bf16>, out: &mut Buffer<bf16>| {
        flash_attention::launch(&dev, &q, k, &kv, out, shape, cfg)
            .unwrap_err()
            .to_string()
    };
    let e = err(AttentionShape { head_dim: 64, ..s }, &kv, &mut out);
    assert!(e.contains("head_dim 64"), "{e}");
    let e = err(shape(4, 3, 2), &kv, &mut out);
    assert!(
        e.contains("num_heads 3") && e.contains("num_kv_heads 2"),
        "{e}"
    );
    let e = err(shape(0, 2, 1), &kv, &mut out);
    assert!(e.contains("seq is 0"), "{e}");
    let short = dev.alloc_filled(s.kv_len() - 1, bf16::ONE).unwrap();
    let e = err(s, &short, &mut out);
    assert!(e.contains("`k`") && e.contains("511"), "{e}");
    let e = flash_attention::launch(
        &dev,
        &q,
        &kv,
        &kv,
        &mut out,
        s,
        FlashConfig {
            block_m: 128,
            block_n: 64,
            num_warps: 4,
        },
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("compiled variants"), "{e}");
}

#[test]
fn gpu_matches_reference() {
    let Some(dev) = gpu_or_skip("flash_attention::gpu_matches_reference") else {
        return;
    };
    let _turn = gpu_turn();
    check_small_shapes(&dev);
    // The benchmark's head layout, spot-checked rows (the reference is quadratic).
    let s = shape(1000, 16, 8);
    let mut rng = Rng::new(5);
    let mut ts = vec![0, 1, 63, 64, 500, 998, 999];
    ts.extend((0..8).map(|_| rng.next_u64() as usize % 1000));
    let rows: Vec<(usize, usize)> = ts
        .iter()
        .flat_map(|&t| (0..16).map(move |h| (t, h)))
        .collect();
    for cfg in FlashConfig::ALL {
        let err = max_error(&dev, s, cfg, 17, Some(&rows));
        assert!(err < TOLERANCE, "{dev}: {s:?} {cfg:?}: {err:.3e}");
    }
}
