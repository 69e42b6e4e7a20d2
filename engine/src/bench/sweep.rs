//! The variant sweep (`tilefuse bench --sweep`): each launch of the step tries every
//! compiled variant inside the captured step, by editing one field of the best
//! [`LaunchPlan`] found so far.

use tilefuse_dsl::runtime::KernelConsts;

use crate::decode::{median, Decoder, KernelChoice, LaunchPlan};
use crate::error::{EngineError, Result};
use crate::kernels;
use crate::tuning::{self, GemvConfig};

/// One plan timed by [`sweep`].
#[derive(Clone, Debug)]
pub struct SweepRow {
    /// The launch that differs from the best plan so far (`"default"` for the first).
    pub role: &'static str,
    /// The variant tried, e.g. `BLOCK_N=4 BLOCK_K=512 warps=8`.
    pub choice: String,
    /// Median ms per token of graph replays.
    pub ms_per_token: f64,
    /// Median over interleaved pairs of this plan's time over the best plan's, minus
    /// one (negative: faster); 0 for the default.
    pub vs_best: f64,
}

/// What [`sweep`] measured and chose.
#[derive(Clone, Debug)]
pub struct Sweep {
    /// Every plan tried, in order.
    pub rows: Vec<SweepRow>,
    /// The default plan and the best found, timed again one after the other (the
    /// difference between a row and its re-timing is the noise).
    pub default_ms: f64,
    /// See `default_ms`.
    pub best_ms: f64,
    /// The best plan found.
    pub best: LaunchPlan,
}

/// What [`sweep`] varies, in order: each launch, the LM head's grid, then the split
/// count and `min_chunk`.
const SWEEP_ROLES: [&str; 10] = [
    "qkv",
    "o_proj",
    "gate_up",
    "down",
    "attention",
    "combine",
    "lm_head",
    "lm_head_programs",
    "splits",
    "min_chunk",
];

/// Every compiled variant of the kernel `C` belongs to, as [`KernelChoice`]s.
fn compiled<C: KernelConsts>() -> Vec<KernelChoice<C>> {
    C::compiled()
        .into_iter()
        .map(|(consts, num_warps)| KernelChoice { consts, num_warps })
        .collect()
}

/// Every compiled variant of a GEMV-family kernel `C` belongs to, as configurations,
/// each with its description.
fn gemv_variants<C: KernelConsts>() -> Vec<(String, GemvConfig)> {
    tuning::gemv_variants(C::def())
        .into_iter()
        .map(|c| {
            (
                C::def().describe_variant(&c.consts_for(C::def()), c.num_warps),
                c,
            )
        })
        .collect()
}

/// The plans that differ from `base` in one `role` (a launch, the split count or
/// `min_chunk`), each with the choice in words.
fn tries(
    base: &LaunchPlan,
    role: &str,
    vocab: usize,
    head_dim: usize,
) -> Vec<(String, LaunchPlan)> {
    let with = |set: &dyn Fn(&mut LaunchPlan)| {
        let mut p = base.clone();
        set(&mut p);
        p
    };
    let gemvs = |variants: Vec<(String, GemvConfig)>, set: &dyn Fn(&mut LaunchPlan, GemvConfig)| {
        variants
            .into_iter()
            .map(|(what, c)| (what, with(&|p| set(p, c))))
            .collect()
    };
    match role {
        "qkv" => gemvs(gemv_variants::<kernels::RmsNormGemvConsts>(), &|p, c| {
            p.qkv = c
        }),
        "o_proj" => gemvs(gemv_variants::<kernels::GemvResidualConsts>(), &|p, c| {
            p.o_proj = c
        }),
        "gate_up" => gemvs(gemv_variants::<kernels::RmsNormGateUpConsts>(), &|p, c| {
            p.gate_up = c
        }),
        "down" => gemvs(gemv_variants::<kernels::GemvResidualConsts>(), &|p, c| {
            p.down = c
        }),
        // A clustered variant merges one split per program of its cluster.
        "attention" => compiled::<kernels::AttentionSplitConsts>()
            .into_iter()
            .filter(|c| c.consts.d == head_dim)
            .map(|c| {
                let plan = LaunchPlan {
                    attention: c,
                    ..base.clone()
                };
                let plan = if c.consts.cluster > 1 {
                    plan.with_splits(c.consts.cluster)
                } else {
                    plan
                };
                (c.describe(), plan)
            })
            .collect(),
        "combine" => compiled::<kernels::AttentionCombineConsts>()
            .into_iter()
            .filter(|c| c.consts.d == head_dim && c.consts.s == base.combine.consts.s)
            .map(|c| (c.describe(), with(&|p| p.combine = c)))
            .collect(),
        "lm_head" => gemv_variants::<kernels::LmHeadArgmaxConsts>()
            .into_iter()
            .map(|(what, c)| (what, base.clone().with_lm_head(c, vocab)))
            .collect(),
        // 0: a program per row block; otherwise a few programs a SM (H100: 132), each
        // streaming consecutive blocks.
        "lm_head_programs" => [0, 264, 528, 1056, 2112]
            .into_iter()
            .map(|p| (p.to_string(), base.clone().with_lm_head_programs(p, vocab)))
            .collect(),
        // Split counts of the split + combine path (a cluster fixes its own).
        "splits" => (8..=tuning::MAX_SPLITS)
            .step_by(8)
            .map(|n| {
                let bs = base.attention.consts.bs;
                (n.to_string(), base.clone().with_attention_cluster(1, n, bs))
            })
            .collect(),
        "min_chunk" => [1, 32, 64, 96, 128, 192, 256]
            .into_iter()
            .map(|n| (n.to_string(), with(&|p| p.min_chunk = n)))
            .collect(),
        _ => unreachable!("sweep role {role}"),
    }
}

/// Greedy search over the compiled variants, timed in the whole captured step (a
/// kernel alone, with an idle GPU before and after it, ranks variants differently
/// from a kernel between its neighbours in a graph): each launch in turn takes the
/// variant that makes the step fastest, the others keeping the best found so far; then
/// the split count (up to the one the decoder was built with) and the fewest
/// positions per split. Two passes. GPU only.
///
/// Each candidate is timed in [`SWEEP_PAIRS`] interleaved pairs with the best plan so
/// far (`tokens` graph replays each, GPU events): the GPU's speed drifts over a sweep
/// by more than most differences between variants, so a candidate is compared with
/// the plan timed beside it, not with a figure from minutes before. It replaces the
/// best plan when every pair has it faster, by at least [`SWEEP_MARGIN`] at the median.
pub fn sweep(dec: &mut Decoder, token: u32, context: usize, tokens: usize) -> Result<Sweep> {
    if !dec.device().is_cuda() {
        return Err(EngineError::Option {
            message: "the variant sweep needs a GPU".into(),
        });
    }
    let default = dec.plan().clone();
    let (vocab, head_dim) = (dec.config().vocab_size, dec.config().head_dim);
    let time = |dec: &mut Decoder, plan: &LaunchPlan| -> Result<f64> {
        dec.set_plan(plan.clone())?;
        dec.capture()?;
        dec.time_replays(token, context, tokens)
    };
    // The candidate's median time and its time over the best plan's, minus one, per pair.
    let paired = |dec: &mut Decoder, best: &LaunchPlan, cand: &LaunchPlan| -> Result<_> {
        let (mut ms, mut rel) = (Vec::new(), Vec::new());
        for _ in 0..SWEEP_PAIRS {
            let b = time(dec, best)?;
            let c = time(dec, cand)?;
            ms.push(c);
            rel.push(c / b - 1.0);
        }
        Ok((median(ms), rel))
    };
    let mut best = default.clone();
    let mut rows = vec![SweepRow {
        role: "default",
        choice: String::new(),
        ms_per_token: time(dec, &best)?,
        vs_best: 0.0,
    }];
    for _pass in 0..2 {
        for role in SWEEP_ROLES {
            let tries = tries(&best, role, vocab, head_dim);
            for (choice, plan) in tries {
                if plan == best || plan.check().is_err() {
                    continue;
                }
                let (ms, rel) = paired(dec, &best, &plan)?;
                let take = takes_candidate(&rel);
                rows.push(SweepRow {
                    role,
                    choice,
                    ms_per_token: ms,
                    vs_best: median(rel),
                });
                if take {
                    best = plan;
                }
            }
        }
    }
    // Re-time both, interleaved, for a fair last word.
    let (mut d, mut b) = (Vec::new(), Vec::new());
    for _ in 0..SWEEP_PAIRS {
        d.push(time(dec, &default)?);
        b.push(time(dec, &best)?);
    }
    dec.set_plan(default)?;
    Ok(Sweep {
        rows,
        default_ms: median(d),
        best_ms: median(b),
        best,
    })
}

/// Whether [`sweep`] takes a candidate timed in pairs with the best plan so far, given
/// its time over the best plan's, minus one, in each pair: when every pair has it
/// faster and the median by more than [`SWEEP_MARGIN`].
fn takes_candidate(vs_best: &[f64]) -> bool {
    !vs_best.is_empty()
        && vs_best.iter().all(|r| *r < 0.0)
        && median(vs_best.to_vec()) < -SWEEP_MARGIN
}

/// Interleaved pairs per candidate in [`sweep`].
pub const SWEEP_PAIRS: usize = 3;

/// The least median gain (a fraction of the step) for which [`sweep`] takes a
/// candidate: below it, differences are within what two timings of one plan show.
pub const SWEEP_MARGIN: f64 = 0.002;

#[cfg(test)]
mod tests {
    use super::*;
    use tilefuse_dsl::runtime::Device;

    #[test]
    fn the_sweep_takes_a_candidate_only_when_every_pair_has_it_clearly_faster() {
        assert!(takes_candidate(&[-0.010, -0.004, -0.003]));
        // One pair slower: drift or noise, not a better plan.
        assert!(!takes_candidate(&[-0.010, 0.001, -0.020]));
        // Faster in every pair, but by less than the margin.
        assert!(!takes_candidate(&[-0.001, -0.0015, -0.0005]));
        assert!(!takes_candidate(&[0.0, 0.0, 0.0]));
        assert!(!takes_candidate(&[]));
    }

    #[test]
    fn every_sweep_role_has_compiled_alternatives() {
        // Qwen3-0.6B's shapes (head_dim 128: the combine step has column-chunk variants).
        let cfg = crate::preset::config("qwen3-0.6b").unwrap();
        let base = LaunchPlan::new(&cfg, &Device::cpu(), 256).unwrap();
        for role in SWEEP_ROLES {
            let alternatives = tries(&base, role, cfg.vocab_size, cfg.head_dim)
                .into_iter()
                .filter(|(_, p)| *p != base && p.check().is_ok())
                .count();
            assert!(alternatives > 0, "{role}");
        }
    }
}
