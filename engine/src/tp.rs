//! Tensor parallelism: how a model is split over the `N` GPUs of one host
//! (Megatron-style), and a host simulation showing that the split computes what
//! one GPU computes.
//!
//! Rank `r` of `N` holds, per layer:
//!
//! - the q, k and v rows of its heads: whole query heads `r * H/N ..` and whole
//!   KV heads `r * KV/N ..` (with their biases), so attention, QK-norm, RoPE and
//!   the KV cache stay local (each GPU caches only its KV heads);
//! - the O projection's columns for those heads: each rank computes a partial
//!   `[hidden]` sum, and an **all-reduce** adds them before the bias and residual;
//! - the gate and up rows of its share of the intermediate width, and the down
//!   projection's matching columns, followed by a second **all-reduce**;
//! - norms (and the O bias, applied after the reduction) replicated;
//! - the embedding whole (a lookup reads one row), and the LM head's rows for its
//!   vocabulary range (contiguous rows: for a tied head, a view of the embedding):
//!   each rank finds its best token, and the greedy token is the best of the `N`
//!   candidates, the lowest index on ties ([`merge_argmax`]).
//!
//! Partial sums are reduced in f32 and rounded to bf16 once, after the bias, where
//! one GPU rounds its whole dot product: the split changes only the order of f32
//! additions. [`TpSimulation`] runs the split on the host with the reference
//! decoder's arithmetic ([`crate::reference`]); the tests check it against
//! [`crate::Reference`] over 64 greedy tokens.
//!
//! Heads, KV heads and the intermediate width must divide by `N`; the vocabulary
//! need not (the first `vocab % N` ranks get one more row).

use std::ops::Range;

use half::bf16;

use crate::config::ModelConfig;
use crate::error::{EngineError, Result};
use crate::model::{LayerWeights, ModelWeights, Tensor};
use crate::reference::{argmax, attend, bf, f, linear, rms_norm, rms_norm_heads, rope, swiglu};
use crate::rope::inv_freq as rope_inv_freq;

/// What one rank holds of each split dimension (ranges of whole heads, rows or tokens).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankShard {
    /// This rank's index, `0..size`.
    pub rank: usize,
    /// Its query heads.
    pub heads: Range<usize>,
    /// Its KV heads.
    pub kv_heads: Range<usize>,
    /// Its rows of the gate and up projections (columns of the down projection).
    pub intermediate: Range<usize>,
    /// Its rows of the LM head (token ids).
    pub vocab: Range<usize>,
}

/// How a model is split over `size` GPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TpPlan {
    size: usize,
    ranks: Vec<RankShard>,
}

impl TpPlan {
    /// The split of `cfg` over `size` GPUs; an error naming the config value when
    /// heads, KV heads or the intermediate width do not divide by `size`, or when a
    /// rank's share of the intermediate width is not a multiple of 8 (the decode
    /// kernels read weight rows in 16-byte vectors).
    pub fn new(cfg: &ModelConfig, size: usize) -> Result<TpPlan> {
        let err = |message: String| EngineError::TensorParallel { size, message };
        if size == 0 {
            return Err(err("the number of GPUs must be at least 1".into()));
        }
        let divides = |what: &str, n: usize| -> Result<usize> {
            if n % size == 0 {
                Ok(n / size)
            } else {
                Err(err(format!(
                    "{what} = {n} does not divide into {size} equal parts"
                )))
            }
        };
        let heads = divides("num_attention_heads", cfg.num_heads)?;
        let kv = if cfg.num_kv_heads % size == 0 {
            cfg.num_kv_heads / size
        } else {
            return Err(err(format!(
                "num_key_value_heads = {} does not divide into {size} equal parts (replicating KV heads over GPUs is not implemented)",
                cfg.num_kv_heads
            )));
        };
        let inter = divides("intermediate_size", cfg.intermediate_size)?;
        if inter % 8 != 0 {
            return Err(err(format!(
                "intermediate_size = {} gives each GPU {inter} columns of the down projection, not a multiple of 8 (the kernels read rows in 16-byte vectors)",
                cfg.intermediate_size
            )));
        }
        if cfg.vocab_size < size {
            return Err(err(format!(
                "vocab_size = {} is smaller than the number of GPUs",
                cfg.vocab_size
            )));
        }
        let (vbase, vextra) = (cfg.vocab_size / size, cfg.vocab_size % size);
        let ranks = (0..size)
            .map(|r| {
                let vstart = r * vbase + r.min(vextra);
                let vlen = vbase + usize::from(r < vextra);
                RankShard {
                    rank: r,
                    heads: r * heads..(r + 1) * heads,
                    kv_heads: r * kv..(r + 1) * kv,
                    intermediate: r * inter..(r + 1) * inter,
                    vocab: vstart..vstart + vlen,
                }
            })
            .collect();
        Ok(TpPlan { size, ranks })
    }

    /// The number of GPUs.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Every rank's share, in rank order.
    pub fn ranks(&self) -> &[RankShard] {
        &self.ranks
    }

    /// Rank `r`'s share (`r < size`).
    pub fn rank(&self, r: usize) -> &RankShard {
        &self.ranks[r]
    }

    /// The shapes one rank's decoder sees: its heads, KV heads, intermediate width
    /// and, as `vocab_size`, its LM-head rows (the embedding stays whole).
    pub fn rank_config(&self, cfg: &ModelConfig, r: usize) -> ModelConfig {
        let s = &self.ranks[r];
        ModelConfig {
            num_heads: s.heads.len(),
            num_kv_heads: s.kv_heads.len(),
            intermediate_size: s.intermediate.len(),
            vocab_size: s.vocab.len(),
            ..cfg.clone()
        }
    }

    /// Bytes of weights rank `r` holds (bf16), counting the whole embedding and, for
    /// an untied model, its LM-head rows (a tied head is a view of the embedding).
    pub fn rank_weight_bytes(&self, cfg: &ModelConfig, r: usize) -> u64 {
        let rc = self.rank_config(cfg, r);
        let (h, hd) = (cfg.hidden_size as u64, cfg.head_dim as u64);
        let (qd, kvd, im) = (
            rc.q_dim() as u64,
            rc.kv_dim() as u64,
            rc.intermediate_size as u64,
        );
        let mut layer = 2 * h + (qd + 2 * kvd) * h + h * qd + 3 * im * h;
        if cfg.qkv_bias {
            layer += qd + 2 * kvd;
        }
        if cfg.o_bias {
            layer += h;
        }
        if cfg.qk_norm {
            layer += 2 * hd;
        }
        let embed = cfg.vocab_size as u64 * h;
        let head = if cfg.tie_word_embeddings {
            0
        } else {
            rc.vocab_size as u64 * h
        };
        2 * (cfg.num_layers as u64 * layer + embed + head + h)
    }
}

/// The weights one rank holds, borrowed from the whole model's where they are
/// contiguous (row ranges) and copied where they are not (column ranges).
///
/// Layer tensors have the shapes of [`TpPlan::rank_config`]; the O bias is
/// whole (it is added once, after the reduction).
#[derive(Clone, Debug)]
pub struct ShardWeights<'a> {
    /// The whole embedding, `[vocab, hidden]`.
    pub embed_tokens: Tensor<'a>,
    /// This rank's share of every layer.
    pub layers: Vec<LayerWeights<'a>>,
    /// The final norm, `[hidden]`.
    pub norm: Tensor<'a>,
    /// This rank's LM-head rows, `[vocab range, hidden]`.
    pub lm_head: Tensor<'a>,
}

/// Rows `rows` of a row-major matrix with `cols` columns (a borrowed view).
fn row_range<'a>(t: &'a [bf16], cols: usize, rows: Range<usize>) -> Tensor<'a> {
    Tensor::Borrowed(&t[rows.start * cols..rows.end * cols])
}

/// Columns `range` of a row-major matrix with `cols` columns (a copy).
fn col_range(t: &[bf16], cols: usize, range: Range<usize>) -> Tensor<'static> {
    let mut out = Vec::with_capacity(t.len() / cols * range.len());
    for row in t.chunks_exact(cols) {
        out.extend_from_slice(&row[range.clone()]);
    }
    Tensor::Owned(out)
}

/// Rank `r`'s weights of `w` (a model with config `cfg`) under `plan`.
pub fn shard_weights<'a>(
    cfg: &ModelConfig,
    plan: &TpPlan,
    w: &'a ModelWeights<'_>,
    r: usize,
) -> ShardWeights<'a> {
    let s = plan.rank(r);
    let (h, hd) = (cfg.hidden_size, cfg.head_dim);
    let (qd, im) = (cfg.q_dim(), cfg.intermediate_size);
    let q_rows = s.heads.start * hd..s.heads.end * hd;
    let kv_rows = s.kv_heads.start * hd..s.kv_heads.end * hd;
    let bias = |b: &'a Option<Tensor<'_>>, rows: &Range<usize>| -> Option<Tensor<'a>> {
        b.as_deref().map(|b| Tensor::Borrowed(&b[rows.clone()]))
    };
    let whole = |t: &'a Tensor<'_>| Tensor::Borrowed(&t[..]);
    let layers = w
        .layers
        .iter()
        .map(|l| LayerWeights {
            input_norm: whole(&l.input_norm),
            q_proj: row_range(&l.q_proj, h, q_rows.clone()),
            k_proj: row_range(&l.k_proj, h, kv_rows.clone()),
            v_proj: row_range(&l.v_proj, h, kv_rows.clone()),
            o_proj: col_range(&l.o_proj, qd, q_rows.clone()),
            q_bias: bias(&l.q_bias, &q_rows),
            k_bias: bias(&l.k_bias, &kv_rows),
            v_bias: bias(&l.v_bias, &kv_rows),
            o_bias: l.o_bias.as_ref().map(whole),
            q_norm: l.q_norm.as_ref().map(whole),
            k_norm: l.k_norm.as_ref().map(whole),
            post_attention_norm: whole(&l.post_attention_norm),
            gate_proj: row_range(&l.gate_proj, h, s.intermediate.clone()),
            up_proj: row_range(&l.up_proj, h, s.intermediate.clone()),
            down_proj: col_range(&l.down_proj, im, s.intermediate.clone()),
        })
        .collect();
    ShardWeights {
        embed_tokens: whole(&w.embed_tokens),
        layers,
        norm: whole(&w.norm),
        lm_head: row_range(w.lm_head(), h, s.vocab.clone()),
    }
}

/// The greedy token from each rank's best `(logit, token)`: the largest logit, the
/// lowest token on ties (as `torch.argmax` over the whole vocabulary); NaN never wins
/// over a number.
pub fn merge_argmax(candidates: &[(f32, usize)]) -> usize {
    let mut best: Option<(f32, usize)> = None;
    for &(v, t) in candidates {
        best = match best {
            None => Some((v, t)),
            Some((bv, bt)) if v > bv || (v == bv && t < bt) || (bv.is_nan() && !v.is_nan()) => {
                Some((v, t))
            }
            keep => keep,
        };
    }
    best.map_or(0, |(_, t)| t)
}

/// `out += W x` in f32 without rounding: one rank's partial sum of a row-split
/// product, before the all-reduce.
fn partial_product(w: &[bf16], x: &[f32], out: &mut [f32]) {
    for (o, row) in out.iter_mut().zip(w.chunks_exact(x.len())) {
        let mut acc = 0.0f32;
        for (wi, xi) in row.iter().zip(x) {
            acc += f(*wi) * xi;
        }
        *o = acc;
    }
}

/// The all-reduce: every rank's partial sums added in rank order, in f32.
fn all_reduce(partials: &[Vec<f32>]) -> Vec<f32> {
    let mut out = partials[0].clone();
    for p in &partials[1..] {
        for (o, v) in out.iter_mut().zip(p) {
            *o += v;
        }
    }
    out
}

/// What one simulated step gives: the gathered logits and the merged greedy token.
#[derive(Clone, Debug, PartialEq)]
pub struct TpStep {
    /// Every rank's logits, concatenated in rank (vocabulary) order.
    pub logits: Vec<f32>,
    /// The greedy token from [`merge_argmax`] over the ranks' candidates.
    pub token: u32,
}

/// A tensor-parallel decode run on the host: `N` ranks each compute their shard with
/// the reference decoder's arithmetic, exchanging partial sums through a host
/// all-reduce, exactly where the GPUs would call NCCL.
#[derive(Debug)]
pub struct TpSimulation<'a> {
    cfg: ModelConfig,
    plan: TpPlan,
    shards: Vec<ShardWeights<'a>>,
    inv_freq: Vec<f32>,
    /// `[rank][layer]`: the rank's keys after RoPE, `[pos][local kv head][head_dim]`.
    k_cache: Vec<Vec<Vec<f32>>>,
    v_cache: Vec<Vec<Vec<f32>>>,
    len: usize,
}

impl<'a> TpSimulation<'a> {
    /// The split of `w` (checked against `cfg`) over `size` simulated GPUs.
    pub fn new(cfg: &ModelConfig, w: &'a ModelWeights<'_>, size: usize) -> Result<Self> {
        w.validate(cfg)?;
        let plan = TpPlan::new(cfg, size)?;
        let shards = (0..size).map(|r| shard_weights(cfg, &plan, w, r)).collect();
        let empty = vec![vec![Vec::new(); cfg.num_layers]; size];
        Ok(TpSimulation {
            cfg: cfg.clone(),
            inv_freq: rope_inv_freq(cfg),
            plan,
            shards,
            k_cache: empty.clone(),
            v_cache: empty,
            len: 0,
        })
    }

    /// The split.
    pub fn plan(&self) -> &TpPlan {
        &self.plan
    }

    /// Runs `token` at position `pos` (at most the cached length; a smaller one
    /// re-decodes from there) on every rank.
    pub fn forward(&mut self, token: u32, pos: usize) -> Result<TpStep> {
        let cfg = &self.cfg;
        let vocab = cfg.vocab_size;
        if token as usize >= vocab {
            return Err(EngineError::TokenOutOfRange { token, vocab });
        }
        if pos > self.len {
            return Err(EngineError::PositionGap {
                pos,
                cached: self.len,
            });
        }
        let (h, hd) = (cfg.hidden_size, cfg.head_dim);
        let eps = cfg.rms_norm_eps as f32;
        for (rank, shard) in self.plan.ranks.iter().enumerate() {
            let kvd = shard.kv_heads.len() * hd;
            for c in self.k_cache[rank]
                .iter_mut()
                .chain(self.v_cache[rank].iter_mut())
            {
                c.truncate(pos * kvd);
            }
        }

        let t = token as usize;
        // The residual stream: equal on every rank (each applies the same reduced sums).
        let mut x: Vec<f32> = self.shards[0].embed_tokens[t * h..(t + 1) * h]
            .iter()
            .map(|&v| f(v))
            .collect();
        let mut xn = vec![0.0f32; h];
        let mut scores = vec![0.0f32; pos + 1];
        for l in 0..cfg.num_layers {
            // Attention: column-split QKV, local heads, row-split O, all-reduce.
            rms_norm(&x, &self.shards[0].layers[l].input_norm, eps, &mut xn);
            let mut partials = Vec::with_capacity(self.plan.size);
            for (r, s) in self.plan.ranks.iter().enumerate() {
                let lw = &self.shards[r].layers[l];
                let (qd, kvd) = (s.heads.len() * hd, s.kv_heads.len() * hd);
                let (mut q, mut k, mut v) = (vec![0.0; qd], vec![0.0; kvd], vec![0.0; kvd]);
                linear(&lw.q_proj, lw.q_bias.as_deref(), &xn, &mut q);
                linear(&lw.k_proj, lw.k_bias.as_deref(), &xn, &mut k);
                linear(&lw.v_proj, lw.v_bias.as_deref(), &xn, &mut v);
                if let (Some(qn), Some(kn)) = (&lw.q_norm, &lw.k_norm) {
                    rms_norm_heads(&mut q, qn, eps);
                    rms_norm_heads(&mut k, kn, eps);
                }
                rope(&mut q, &self.inv_freq, pos);
                rope(&mut k, &self.inv_freq, pos);
                self.k_cache[r][l].extend_from_slice(&k);
                self.v_cache[r][l].extend_from_slice(&v);
                let mut attn = vec![0.0f32; qd];
                let (kc, vc) = (&self.k_cache[r][l], &self.v_cache[r][l]);
                attend(&q, kc, vc, s.kv_heads.len(), hd, &mut scores, &mut attn);
                let mut partial = vec![0.0f32; h];
                partial_product(&lw.o_proj, &attn, &mut partial);
                partials.push(partial);
            }
            let reduced = all_reduce(&partials);
            let o_bias = self.shards[0].layers[l].o_bias.as_deref();
            for (i, (xi, p)) in x.iter_mut().zip(&reduced).enumerate() {
                let b = o_bias.map_or(0.0, |b| f(b[i]));
                *xi = bf(*xi + bf(p + b));
            }

            // MLP: column-split gate/up, row-split down, all-reduce.
            rms_norm(
                &x,
                &self.shards[0].layers[l].post_attention_norm,
                eps,
                &mut xn,
            );
            let mut partials = Vec::with_capacity(self.plan.size);
            for (r, s) in self.plan.ranks.iter().enumerate() {
                let lw = &self.shards[r].layers[l];
                let im = s.intermediate.len();
                let (mut gate, mut up) = (vec![0.0f32; im], vec![0.0f32; im]);
                linear(&lw.gate_proj, None, &xn, &mut gate);
                linear(&lw.up_proj, None, &xn, &mut up);
                swiglu(&mut gate, &up);
                let mut partial = vec![0.0f32; h];
                partial_product(&lw.down_proj, &gate, &mut partial);
                partials.push(partial);
            }
            let reduced = all_reduce(&partials);
            for (xi, p) in x.iter_mut().zip(&reduced) {
                *xi = bf(*xi + bf(*p));
            }
        }
        self.len = pos + 1;

        // LM head split by vocabulary: local logits, local argmax, merged.
        rms_norm(&x, &self.shards[0].norm, eps, &mut xn);
        let mut logits = Vec::with_capacity(vocab);
        let mut candidates = Vec::with_capacity(self.plan.size);
        for (r, s) in self.plan.ranks.iter().enumerate() {
            let mut local = vec![0.0f32; s.vocab.len()];
            linear(&self.shards[r].lm_head, None, &xn, &mut local);
            let best = argmax(&local);
            candidates.push((local[best], s.vocab.start + best));
            logits.extend_from_slice(&local);
        }
        Ok(TpStep {
            logits,
            token: merge_argmax(&candidates) as u32,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Arch;
    use crate::preset;
    use crate::reference::Reference;

    /// A Qwen3-shaped model that splits four ways: 8 heads, 4 KV heads, an
    /// intermediate width of 256 and an odd vocabulary (uneven LM-head shards).
    fn four_way() -> ModelConfig {
        ModelConfig {
            num_heads: 8,
            num_kv_heads: 4,
            head_dim: 16,
            intermediate_size: 256,
            vocab_size: 1001,
            tie_word_embeddings: false,
            ..preset::config("tiny-qwen3").unwrap()
        }
    }

    /// Greedy decoding split over `size` ranks against the one-GPU reference over
    /// `steps` tokens: the same tokens, and logits within bf16 tolerance at every
    /// step. Returns the largest logit difference seen.
    fn agrees_with_one_gpu(cfg: &ModelConfig, seed: u64, size: usize, steps: usize) -> f32 {
        let w = preset::random_weights(cfg, seed);
        let mut one = Reference::new(cfg.clone(), w.clone()).unwrap();
        let mut split = TpSimulation::new(cfg, &w, size).unwrap();
        let prompt = [1u32, 17, 42, 7];
        let mut worst = 0.0f32;
        let (mut want, mut got) = (Vec::new(), None);
        for (pos, &t) in prompt.iter().enumerate() {
            want = one.forward(t, pos).unwrap();
            got = Some(split.forward(t, pos).unwrap());
        }
        for step in 0..steps {
            let got_step = got.take().unwrap();
            assert_eq!(got_step.logits.len(), cfg.vocab_size);
            let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let diff = want
                .iter()
                .zip(&got_step.logits)
                .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
            // bf16 keeps 8 significant bits: a few ulps of the largest logit.
            assert!(
                diff <= scale * 2e-2,
                "step {step}, tp {size}: logits differ by {diff} (largest {scale})"
            );
            worst = worst.max(diff / scale);
            let token = argmax(&want) as u32;
            assert_eq!(
                got_step.token, token,
                "step {step}, tp {size}: greedy token"
            );
            let pos = prompt.len() + step;
            want = one.forward(token, pos).unwrap();
            got = Some(split.forward(token, pos).unwrap());
        }
        worst
    }

    #[test]
    fn two_way_split_agrees_with_one_gpu_over_64_tokens() {
        // Tied head, QK-norm (tiny-qwen3); q/k/v biases, untied head, an odd
        // vocabulary of 997 (tiny-qwen2).
        for name in ["tiny-qwen3", "tiny-qwen2"] {
            let cfg = preset::config(name).unwrap();
            let worst = agrees_with_one_gpu(&cfg, 3, 2, 64);
            eprintln!("{name}, tp 2: largest logit difference {worst:.2e} of the largest logit");
        }
    }

    #[test]
    fn four_way_split_and_llama_agree_with_one_gpu() {
        agrees_with_one_gpu(&four_way(), 5, 4, 24);
        let llama = ModelConfig {
            arch: Arch::Llama,
            num_heads: 4,
            num_kv_heads: 2,
            o_bias: true,
            qkv_bias: true,
            ..preset::config("tiny-llama3").unwrap()
        };
        agrees_with_one_gpu(&llama, 6, 2, 24);
        // One rank is the reference itself, to the bit.
        let cfg = preset::config("tiny-qwen2").unwrap();
        let w = preset::random_weights(&cfg, 1);
        let mut one = Reference::new(cfg.clone(), w.clone()).unwrap();
        let mut sim = TpSimulation::new(&cfg, &w, 1).unwrap();
        for (pos, t) in [5u32, 6, 7].into_iter().enumerate() {
            assert_eq!(
                sim.forward(t, pos).unwrap().logits,
                one.forward(t, pos).unwrap()
            );
        }
    }

    #[test]
    fn shards_cover_the_model_once() {
        let cfg = four_way();
        let w = preset::random_weights(&cfg, 2);
        let plan = TpPlan::new(&cfg, 4).unwrap();
        let vocab: Vec<_> = plan.ranks().iter().map(|s| s.vocab.clone()).collect();
        assert_eq!(vocab, vec![0..251, 251..501, 501..751, 751..1001]);
        let shards: Vec<_> = (0..4).map(|r| shard_weights(&cfg, &plan, &w, r)).collect();
        // Row splits concatenate back to the whole; column splits interleave.
        let l = 1;
        let q: Vec<bf16> = shards
            .iter()
            .flat_map(|s| s.layers[l].q_proj.iter().copied())
            .collect();
        assert_eq!(q, *w.layers[l].q_proj);
        let head: Vec<bf16> = shards
            .iter()
            .flat_map(|s| s.lm_head.iter().copied())
            .collect();
        assert_eq!(head, w.lm_head());
        let h = cfg.hidden_size;
        let im = cfg.intermediate_size;
        for row in [0, 5, h - 1] {
            let joined: Vec<bf16> = shards
                .iter()
                .flat_map(|s| {
                    let cols = s.layers[l].down_proj.len() / h;
                    s.layers[l].down_proj[row * cols..(row + 1) * cols].to_vec()
                })
                .collect();
            assert_eq!(joined, w.layers[l].down_proj[row * im..(row + 1) * im]);
        }
        // Bytes per rank: a quarter of the layers, the whole embedding.
        let total: u64 = (0..4).map(|r| plan.rank_weight_bytes(&cfg, r)).sum();
        let whole = 2 * w
            .named_tensors(&cfg)
            .iter()
            .map(|(_, _, t)| t.len() as u64)
            .sum::<u64>();
        let replicated = 3 * 2 * (cfg.vocab_size * h) as u64
            + 3 * 2 * (cfg.num_layers * (2 * h + 2 * cfg.head_dim) + h) as u64;
        assert_eq!(total, whole + replicated);
    }

    #[test]
    fn uneven_splits_are_errors_naming_the_value() {
        let msg = |cfg: &ModelConfig, n| TpPlan::new(cfg, n).unwrap_err().to_string();
        let cfg = preset::config("tiny-llama3").unwrap();
        let m = msg(&cfg, 2);
        assert!(
            m.contains("num_key_value_heads = 1") && m.contains("2 GPUs"),
            "{m}"
        );
        let q = preset::config("qwen3-14b").unwrap();
        let m = msg(&q, 3);
        assert!(m.contains("num_attention_heads = 40"), "{m}");
        let m = msg(
            &ModelConfig {
                intermediate_size: 72,
                ..preset::config("tiny-qwen3").unwrap()
            },
            2,
        );
        assert!(
            m.contains("intermediate_size = 72") && m.contains("multiple of 8"),
            "{m}"
        );
        assert!(msg(&cfg, 0).contains("at least 1"));
        // The real presets split over the GPUs of a 2-, 4- and 8-GPU host.
        for name in ["qwen3-8b", "qwen3-32b", "llama-3.1-8b", "llama-3.1-70b"] {
            for n in [2, 4, 8] {
                TpPlan::new(&preset::config(name).unwrap(), n).unwrap();
            }
        }
    }

    #[test]
    fn merged_argmax_is_the_first_maximum() {
        assert_eq!(merge_argmax(&[(1.0, 3), (2.0, 10), (2.0, 20)]), 10);
        assert_eq!(merge_argmax(&[(f32::NAN, 0), (-5.0, 7)]), 7);
        assert_eq!(merge_argmax(&[(4.0, 9), (4.0, 2)]), 2);
    }
}
