//! Causal attention forward, the FlashAttention-2 algorithm written in the kernel
//! language (`tilefuse::kernels::flash_attention`), checked against a host f64
//! reference; on a GPU it also prints TFLOP/s at prefill sizes.
//!
//! `cargo run --release --example flash_attention`
//!
//! Everywhere: 2 query heads over 1 KV head and 4 over 2, head_dim 128, 70 tokens (not
//! a multiple of any tile), every compiled tile configuration, seeded random bf16
//! inputs. On a GPU, also 16 query heads over 8 KV heads at 1k, 4k and 16k tokens
//! (spot-checked rows, then timed: CUDA events around graph replays, median; causal
//! FLOPs = 2 × 2 × S² × D × HQ / 2).

use tilefuse::dsl::runtime::timing::{self as perf, TimingOptions};
use tilefuse::engine::bench::{PerfError, Rng};
use tilefuse::kernels::flash_attention::{self, AttentionShape, FlashConfig, HEAD_DIM};
use tilefuse::prelude::*;

/// Largest difference from the reference the bf16 output may show: the output's own
/// rounding (2^-9 relative) plus the probabilities rounded to bf16 before `P V`.
const TOLERANCE: f64 = 1e-2;

/// Random inputs for `shape`: queries larger than keys so the softmax is peaked enough
/// that a wrong scale or mask shows.
fn inputs(shape: AttentionShape, seed: u64) -> (Vec<bf16>, Vec<bf16>, Vec<bf16>) {
    let mut rng = Rng::new(seed);
    (
        rng.bf16_vec(shape.q_len(), 3.0),
        rng.bf16_vec(shape.kv_len(), 1.0),
        rng.bf16_vec(shape.kv_len(), 1.0),
    )
}

/// Runs the kernel once and returns the largest difference from the reference over the
/// rows `(t, h)` listed.
fn max_error(
    dev: &Device,
    shape: AttentionShape,
    cfg: FlashConfig,
    seed: u64,
    rows: &[(usize, usize)],
) -> anyhow::Result<f64> {
    let (q, k, v) = inputs(shape, seed);
    let (qd, kd, vd) = (dev.upload(&q)?, dev.upload(&k)?, dev.upload(&v)?);
    let mut out = dev.alloc_filled(shape.q_len(), bf16::NAN)?;
    flash_attention::launch(dev, &qd, &kd, &vd, &mut out, shape, cfg)?;
    let got = out.to_vec()?;
    // NaN fails the check too.
    Ok(flash_attention::max_error(&got, &q, &k, &v, shape, rows))
}

fn all_rows(shape: AttentionShape) -> Vec<(usize, usize)> {
    (0..shape.seq)
        .flat_map(|t| (0..shape.num_heads).map(move |h| (t, h)))
        .collect()
}

/// First and last tokens, both sides of tile edges, and random ones, over all heads.
fn sample_rows(shape: AttentionShape, rng: &mut Rng) -> Vec<(usize, usize)> {
    let s = shape.seq;
    let mut ts = vec![0, 1, 63, 64, s / 2, s - 2, s - 1];
    ts.extend((0..8).map(|_| rng.next_u64() as usize % s));
    ts.iter()
        .flat_map(|&t| (0..shape.num_heads).map(move |h| (t, h)))
        .collect()
}

fn main() -> anyhow::Result<()> {
    let dev = Device::auto();
    for (heads, kv_heads) in [(2, 1), (4, 2)] {
        let shape = AttentionShape {
            seq: 70,
            num_heads: heads,
            num_kv_heads: kv_heads,
            head_dim: HEAD_DIM,
        };
        for cfg in FlashConfig::ALL {
            let err = max_error(&dev, shape, cfg, 7, &all_rows(shape))?;
            println!(
                "flash attention on {dev}: seq 70, {heads} q heads / {kv_heads} kv heads, \
                 tiles {}x{} w{}: max abs err {err:.1e}",
                cfg.block_m, cfg.block_n, cfg.num_warps
            );
            anyhow::ensure!(
                err < TOLERANCE,
                "flash attention disagrees with the host reference ({err:.3e})"
            );
        }
    }
    if !dev.is_cuda() {
        println!("no CUDA device: prefill sizes (16 q heads / 8 kv heads at 1k-16k) skipped");
        return Ok(());
    }
    let mut rng = Rng::new(11);
    for seq in [1024usize, 4096, 16384] {
        let shape = AttentionShape {
            seq,
            num_heads: 16,
            num_kv_heads: 8,
            head_dim: HEAD_DIM,
        };
        let rows = sample_rows(shape, &mut rng);
        // Every configuration but the small-tile one (meant for short sequences).
        for cfg in &FlashConfig::ALL[..FlashConfig::ALL.len() - 1] {
            let cfg = *cfg;
            let err = max_error(&dev, shape, cfg, seq as u64, &rows)?;
            anyhow::ensure!(
                err < TOLERANCE,
                "seq {seq}, tiles {}x{}: {err:.3e} from the reference",
                cfg.block_m,
                cfg.block_n
            );
            let (q, k, v) = inputs(shape, seq as u64);
            let (q, k, v) = (dev.upload(&q)?, dev.upload(&k)?, dev.upload(&v)?);
            let mut out = dev.alloc_filled(shape.q_len(), bf16::NAN)?;
            let opts = TimingOptions {
                warmup: 2,
                reps: 10,
            };
            let (stats, method) = perf::time_graph(&dev, 3, opts, |_| {
                flash_attention::launch(&dev, &q, &k, &v, &mut out, shape, cfg)?;
                Ok::<(), PerfError>(())
            })?;
            let tflops = shape.causal_flops() / (stats.median_us * 1e-6) / 1e12;
            println!(
                "seq {seq:>5}, 16 q / 8 kv heads, d 128, tiles {}x{} w{}: {:>9.1} us, \
                 {tflops:6.1} TFLOP/s ({method}; spot-checked err {err:.1e})",
                cfg.block_m, cfg.block_n, cfg.num_warps, stats.median_us
            );
        }
    }
    Ok(())
}
