//! One decode step as kernel launches: the embedding row, then per layer [`Step::qkv`],
//! [`Step::attention`], [`Step::o_proj`] and [`Step::mlp`], then the LM head and the
//! greedy token. It computes what [`crate::reference`]'s `forward` computes, in the
//! same order; each launch's variant comes from the [`LaunchPlan`], its arguments are
//! named (the kernels' generated `…Args`).

use half::bf16;
use tilefuse_dsl::runtime::{Buffer, Device, KernelConsts, KernelDef, LaunchConfig};

use super::matrix::{silu_mul_in_place, Matrix, QuantMatrix};
use super::{Block, Decoder, LaunchPlan, Layer, Scratch};
use crate::config::ModelConfig;
use crate::error::Result;
use crate::gguf::device::QuantVariant;
use crate::kernels::{
    ArgmaxFinishArgs, AttentionCombineArgs, AttentionSplitArgs, EmbedArgs, EmbedConsts,
    GemvResidualArgs, LmHeadArgmaxArgs, RmsNormGateUpArgs, RmsNormGemvArgs, ATTENTION_COMBINE,
    ATTENTION_SPLIT, GEMV_RESIDUAL, RMS_NORM_GATE_UP, RMS_NORM_GEMV,
};
use crate::kernels_quant::{
    AttentionCombineQuantArgs, AttentionCombineQuantConsts, ATTENTION_COMBINE_QUANT,
};
use crate::tuning;

impl Decoder {
    /// Runs one step with individual launches: reads `state`, appends to the KV cache,
    /// leaves the logits in the device buffer and writes the greedy token and `pos + 1`
    /// into `state`. Asynchronous on a GPU.
    pub fn step_eager(&mut self) -> Result<()> {
        self.step_blocks(|_| true)
    }

    /// Launches only the blocks `want` selects, in step order (for timing a step part
    /// by part; a partial step leaves the model's state meaningless).
    pub fn step_blocks(&mut self, want: impl FnMut(Block) -> bool) -> Result<()> {
        let layers = 0..self.cfg.num_layers;
        self.step_part(want, layers, true)
    }

    /// Launches the blocks `want` selects of the layers `layer_range` (and the
    /// embedding and LM-head blocks when selected), in step order; `first` says
    /// whether its first launch starts a step (is serialized). A tensor-parallel rank
    /// ([`super::tp`]) runs its step in such parts, between collectives.
    pub(super) fn step_part(
        &mut self,
        want: impl FnMut(Block) -> bool,
        layer_range: std::ops::Range<usize>,
        first: bool,
    ) -> Result<()> {
        let grids = self.layer_grids();
        let Decoder {
            cfg,
            dev,
            plan,
            max_seq_len,
            embed,
            lm_head,
            quant_head,
            final_norm,
            rope_cos,
            rope_sin,
            layers,
            s,
            stamp_layer,
            ..
        } = self;
        let mut step = Step {
            dev,
            cfg,
            plan,
            max_seq: *max_seq_len as i32,
            rope: (rope_cos, rope_sin),
            s,
            want,
            first,
            grids,
            stamp_layer: *stamp_layer,
            o_input_quantized: false,
            down_input_quantized: false,
        };
        step.embed(embed)?;
        for (li, l) in layers
            .iter_mut()
            .enumerate()
            .skip(layer_range.start)
            .take(layer_range.len())
        {
            let stamped = step.stamp_layer == Some(li);
            if stamped {
                step.s.spare.stamps.start();
            }
            let launched = step.layer_launches(l);
            if stamped {
                step.s.spare.stamps.stop();
            }
            launched?;
        }
        step.lm_head(
            final_norm,
            lm_head.as_ref().unwrap_or(embed),
            quant_head.as_ref(),
        )
    }
}

/// What one step's launches share.
struct Step<'a, W> {
    dev: &'a Device,
    cfg: &'a ModelConfig,
    plan: &'a LaunchPlan,
    max_seq: i32,
    /// RoPE cos and sin tables, `[max_seq_len, head_dim / 2]`.
    rope: (&'a Buffer<f32>, &'a Buffer<f32>),
    s: &'a mut Scratch,
    /// Which blocks run.
    want: W,
    /// Whether the next launch is the step's first.
    first: bool,
    /// One layer's grids, in step order.
    grids: Vec<(Block, [u32; 3])>,
    /// The layer whose launches write timeline stamps (in `s.spare.stamps`).
    stamp_layer: Option<usize>,
    /// Whether this layer's attention combine left the O projection's input quantized.
    o_input_quantized: bool,
    /// Whether this layer's gate/up GEMV left the down projection's input quantized.
    down_input_quantized: bool,
}

/// Whether the attention combine before the quantized O projection `o_w` writes O's
/// int8 input itself (`attention_combine_quant`): the splits are merged by a combine
/// launch (not a cluster) whose constants that kernel was compiled for. O then launches
/// only its GEMVs.
pub(super) fn combine_quantizes(plan: &LaunchPlan, o_w: &Matrix) -> bool {
    matches!(o_w, Matrix::Quant(_))
        && !plan.clustered()
        && quant_combine_consts(plan, -1)
            .check(plan.combine.num_warps)
            .is_ok()
}

/// Bytes of `w`'s packed words that the attention launch asks L2 for
/// ([`tuning::attention_prefetch_words`]; none for dense rows).
fn attention_prefetch(plan: &LaunchPlan, w: &Matrix) -> usize {
    let words = w.quant_words().map_or(0, |q| 4 * q.len());
    tuning::attention_prefetch_words(words, plan.prefetch_words, w.is_q8_0())
}

/// The range of `w`'s packed words, `(offset, length)` in bytes from `skip`, that the
/// quantizer launch before its GEMV asks L2 for ([`tuning::quantizer_prefetch`]).
fn quantizer_prefetch(plan: &LaunchPlan, w: &Matrix, skip: usize) -> (usize, usize) {
    let words = w.quant_words().map_or(0, |q| 4 * q.len());
    tuning::quantizer_prefetch(words, skip, plan.quantizer_prefetch, w.is_q8_0())
}

/// The quantizing combine's constants for `plan`, with the stamp code only for a
/// launch that has timeline slots (`stamp_at >= 0`).
fn quant_combine_consts(plan: &LaunchPlan, stamp_at: i32) -> AttentionCombineQuantConsts {
    let c = plan.combine.consts;
    AttentionCombineQuantConsts {
        d: c.d,
        s: c.s,
        dc: c.dc,
        stamps: crate::gguf::device::stamps_const(stamp_at) as usize,
    }
}

impl<W: FnMut(Block) -> bool> Step<'_, W> {
    /// The launch configuration of `block` on `grid`, or `None` when the block is left
    /// out. The first launch of a step is serialized: kernels may overlap their
    /// predecessors (programmatic launch) and read the position, the KV cache and the
    /// RoPE tables before waiting for them, which is safe only once the previous step
    /// has finished writing them.
    fn config(&mut self, block: Block, grid: [u32; 3], num_warps: u32) -> Option<LaunchConfig> {
        if !(self.want)(block) {
            return None;
        }
        let cfg = LaunchConfig::grid(grid).num_warps(num_warps);
        Some(if std::mem::take(&mut self.first) {
            cfg.serialized()
        } else {
            cfg
        })
    }

    /// One layer's launches, in step order.
    fn layer_launches(&mut self, l: &mut Layer) -> Result<()> {
        self.qkv(l)?;
        self.attention(l)?;
        self.o_proj(l)?;
        self.mlp(l)
    }

    /// A layer launch's configuration, on the plan's grid for `block`; the launches
    /// from here on log their timeline stamps under `block`.
    fn layer_config(&mut self, block: Block, num_warps: u32) -> Option<LaunchConfig> {
        let grid = self.plan_grid(block);
        self.s.spare.stamps.set_tag(block.index());
        self.config(block, grid, num_warps)
    }

    /// The plan's grid for the bf16 kernel of `block`.
    fn plan_grid(&self, block: Block) -> [u32; 3] {
        self.grids
            .iter()
            .find(|g| g.0 == block)
            .map_or([0; 3], |g| g.1)
    }

    /// Where the launch of `kernel` on the plan's grid for `block` writes its programs'
    /// timeline stamps: -1 (none) outside the stamped layer, else after the layer's
    /// earlier launches' programs (a quantized launch takes its own slots, see
    /// [`crate::gguf::device::StampSlots`]).
    fn stamp_at(&mut self, block: Block, kernel: &KernelDef) -> Result<i32> {
        let programs = self.plan_grid(block).iter().product::<u32>();
        self.s.spare.stamps.take(kernel.name, programs)
    }

    /// `x = embed[token]`.
    fn embed(&mut self, table: &Buffer<bf16>) -> Result<()> {
        let h = self.cfg.hidden_size;
        let Some(cfg) = self.config(Block::Embed, [h.div_ceil(1024) as u32, 1, 1], 4) else {
            return Ok(());
        };
        let s = &mut *self.s;
        EmbedArgs {
            table,
            state: &s.state,
            x: &mut s.x,
            h: h as i32,
        }
        .launch(self.dev, cfg, EmbedConsts { b: 1024 })?;
        Ok(())
    }

    /// RMSNorm, then the fused `[q; k; v]` projection plus bias.
    fn qkv(&mut self, l: &Layer) -> Result<()> {
        let plan = self.plan.qkv;
        let Some(cfg) = self.layer_config(Block::Qkv, plan.num_warps) else {
            return Ok(());
        };
        let c = self.cfg;
        let eps = c.rms_norm_eps as f32;
        let w = match &l.qkv_w {
            Matrix::Dense(w) => w,
            Matrix::Quant(q) => {
                let norm = QuantVariant::Norm {
                    norm_w: &l.input_norm,
                    eps,
                };
                let s = &mut *self.s;
                return q.gemv(
                    self.dev,
                    cfg,
                    norm,
                    &s.x,
                    &mut s.qkv,
                    &l.qkv_b,
                    &mut s.spare,
                    quantizer_prefetch(self.plan, &l.qkv_w, 0),
                );
            }
        };
        let stamp_at = self.stamp_at(Block::Qkv, &RMS_NORM_GEMV)?;
        let s = &mut *self.s;
        RmsNormGemvArgs {
            x: &s.x,
            norm_w: &l.input_norm,
            w,
            bias: &l.qkv_b,
            y: &mut s.qkv,
            n: (c.q_dim() + 2 * c.kv_dim()) as i32,
            k: c.hidden_size as i32,
            eps,
            stamps: &mut s.spare.stamps.buf,
            stamp_at,
        }
        .launch(self.dev, cfg, plan)?;
        Ok(())
    }

    /// QK-norm, RoPE and the KV-cache append folded into split-K attention over the
    /// cache, then the merge of the splits (inside the launch when it is clustered).
    /// While its arithmetic leaves HBM idle, the launch asks L2 for the start of the
    /// layer's gate/up weights (see [`crate::tuning::attention_prefetch_bytes`]).
    fn attention(&mut self, l: &mut Layer) -> Result<()> {
        self.o_input_quantized = false;
        let plan = self.plan;
        let c = self.cfg;
        if let Some(cfg) = self.layer_config(Block::Attention, plan.attention.num_warps) {
            let stamp_at = self.stamp_at(Block::Attention, &ATTENTION_SPLIT)?;
            let s = &mut *self.s;
            // Dense gate/up weights as bf16; a quantized matrix's packed words (its
            // scales, a sixteenth of the bytes, are not prefetched).
            let (prefetch_w, prefetch_len) = match l.gate_up_w.dense() {
                Some(w) => (w, w.len().min(plan.prefetch_bytes / 2) as i32),
                None => (&s.zeros, 0),
            };
            let (prefetch_q, prefetch_q_len) = match l.gate_up_w.quant_words() {
                Some(q) => (q, (attention_prefetch(plan, &l.gate_up_w) / 4) as i32),
                None => (&s.spare.no_words, 0),
            };
            AttentionSplitArgs {
                qkv: &s.qkv,
                q_norm_w: &l.q_norm,
                k_norm_w: &l.k_norm,
                rope_cos: self.rope.0,
                rope_sin: self.rope.1,
                state: &s.state,
                k_cache: &mut l.k_cache,
                v_cache: &mut l.v_cache,
                q_out: &mut s.q,
                part_m: &mut s.part_m,
                part_l: &mut s.part_l,
                part_acc: &mut s.part_acc,
                out: &mut s.attn,
                group: (c.num_heads / c.num_kv_heads) as i32,
                max_seq: self.max_seq,
                min_chunk: plan.min_chunk as i32,
                use_norm: i32::from(c.qk_norm),
                eps: c.rms_norm_eps as f32,
                scale: (c.head_dim as f32).powf(-0.5),
                prefetch_w,
                prefetch_len,
                prefetch_q,
                prefetch_q_len,
                stamps: &mut s.spare.stamps.buf,
                stamp_at,
            }
            .launch(self.dev, cfg, plan.attention.consts)?;
        }
        if plan.clustered() {
            return Ok(());
        }
        let Some(cfg) = self.layer_config(Block::Combine, plan.combine.num_warps) else {
            return Ok(());
        };
        if combine_quantizes(plan, &l.o_w) {
            let stamp_at = self.stamp_at(Block::Combine, &ATTENTION_COMBINE_QUANT)?;
            let s = &mut *self.s;
            let (xq, xd, stamps) = s.spare.activation_and_stamps_mut();
            AttentionCombineQuantArgs {
                part_m: &s.part_m,
                part_l: &s.part_l,
                part_acc: &s.part_acc,
                out: &mut s.attn,
                xq,
                xd,
                splits: plan.splits as i32,
                stamps: &mut stamps.buf,
                stamp_at,
            }
            .launch(self.dev, cfg, quant_combine_consts(plan, stamp_at))?;
            self.o_input_quantized = true;
            return Ok(());
        }
        let stamp_at = self.stamp_at(Block::Combine, &ATTENTION_COMBINE)?;
        let s = &mut *self.s;
        AttentionCombineArgs {
            part_m: &s.part_m,
            part_l: &s.part_l,
            part_acc: &s.part_acc,
            out: &mut s.attn,
            splits: plan.splits as i32,
            stamps: &mut s.spare.stamps.buf,
            stamp_at,
        }
        .launch(self.dev, cfg, plan.combine.consts)?;
        Ok(())
    }

    /// The O projection, added into the residual stream.
    fn o_proj(&mut self, l: &Layer) -> Result<()> {
        let plan = self.plan.o_proj;
        let Some(cfg) = self.layer_config(Block::OProj, plan.num_warps) else {
            return Ok(());
        };
        let (c, s) = (self.cfg, &mut *self.s);
        let w = match &l.o_w {
            Matrix::Dense(w) => w,
            Matrix::Quant(q) => {
                let res = QuantVariant::Residual;
                if std::mem::take(&mut self.o_input_quantized) {
                    return q.gemv_quantized_input(self.dev, res, &mut s.x, &l.o_b, &mut s.spare);
                }
                let (attn, spare) = (&s.attn, &mut s.spare);
                return q.gemv(self.dev, cfg, res, attn, &mut s.x, &l.o_b, spare, (0, 0));
            }
        };
        let stamp_at = self.stamp_at(Block::OProj, &GEMV_RESIDUAL)?;
        let s = &mut *self.s;
        GemvResidualArgs {
            w,
            a: &s.attn,
            bias: &l.o_b,
            x: &mut s.x,
            n: c.hidden_size as i32,
            k: c.q_dim() as i32,
            stamps: &mut s.spare.stamps.buf,
            stamp_at,
        }
        .launch(self.dev, cfg, plan)?;
        Ok(())
    }

    /// RMSNorm, the fused `[gate; up]` projection and `silu(gate) * up`, then the down
    /// projection added into the residual stream.
    fn mlp(&mut self, l: &Layer) -> Result<()> {
        let (gate_up, down) = (self.plan.gate_up, self.plan.down);
        let c = self.cfg;
        if let Some(cfg) = self.layer_config(Block::GateUp, gate_up.num_warps) {
            let eps = c.rms_norm_eps as f32;
            match &l.gate_up_w {
                // `[gate; up]` into `act`; the down projection's activation quantizer
                // takes `silu(gate) * up`.
                // Before a quantized down projection, down's int8 input itself where it
                // may (`silu(gate) * up` of each program's 32 pairs of rows).
                Matrix::Quant(q) if q.silu_quantizes() && l.down_w.dense().is_none() => {
                    let s = &mut *self.s;
                    let (x, norm_w, spare) = (&s.x, &l.post_norm, &mut s.spare);
                    q.gemv_norm_silu_quantized(self.dev, cfg, x, norm_w, eps, &s.zeros, spare)?;
                    self.down_input_quantized = true;
                }
                Matrix::Quant(q) => {
                    let s = &mut *self.s;
                    let (norm_w, act) = (&l.post_norm, &mut s.act);
                    let norm = QuantVariant::Norm { norm_w, eps };
                    // Past the words the attention asked for.
                    let skip = attention_prefetch(self.plan, &l.gate_up_w);
                    let prefetch = quantizer_prefetch(self.plan, &l.gate_up_w, skip);
                    let spare = &mut s.spare;
                    q.gemv(self.dev, cfg, norm, &s.x, act, &s.zeros, spare, prefetch)?;
                    if l.down_w.dense().is_some() {
                        let stamps = &mut s.spare.stamps;
                        silu_mul_in_place(self.dev, act, c.intermediate_size, stamps)?;
                    }
                }
                Matrix::Dense(w) => {
                    let stamp_at = self.stamp_at(Block::GateUp, &RMS_NORM_GATE_UP)?;
                    let s = &mut *self.s;
                    RmsNormGateUpArgs {
                        x: &s.x,
                        norm_w: &l.post_norm,
                        w,
                        act: &mut s.act,
                        inter: c.intermediate_size as i32,
                        k: c.hidden_size as i32,
                        eps,
                        stamps: &mut s.spare.stamps.buf,
                        stamp_at,
                    }
                    .launch(self.dev, cfg, gate_up)?
                }
            }
        }
        let Some(cfg) = self.layer_config(Block::Down, down.num_warps) else {
            return Ok(());
        };
        let s = &mut *self.s;
        let w = match &l.down_w {
            Matrix::Dense(w) => w,
            Matrix::Quant(q) => {
                if std::mem::take(&mut self.down_input_quantized) {
                    let res = QuantVariant::Residual;
                    return q.gemv_quantized_input(self.dev, res, &mut s.x, &s.zeros, &mut s.spare);
                }
                // After a quantized gate/up, `act` is `[gate; up]`: the quantizer takes
                // `silu(gate) * up`.
                let res = match l.gate_up_w {
                    Matrix::Quant(_) => QuantVariant::SiluMulResidual,
                    Matrix::Dense(_) => QuantVariant::Residual,
                };
                let prefetch = quantizer_prefetch(self.plan, &l.down_w, 0);
                let (act, spare) = (&s.act, &mut s.spare);
                return q.gemv(self.dev, cfg, res, act, &mut s.x, &s.zeros, spare, prefetch);
            }
        };
        let stamp_at = self.stamp_at(Block::Down, &GEMV_RESIDUAL)?;
        let s = &mut *self.s;
        GemvResidualArgs {
            w,
            a: &s.act,
            bias: &s.zeros,
            x: &mut s.x,
            n: c.hidden_size as i32,
            k: c.intermediate_size as i32,
            stamps: &mut s.spare.stamps.buf,
            stamp_at,
        }
        .launch(self.dev, cfg, down)?;
        Ok(())
    }

    /// The final norm and the LM head with per-program greedy candidates, then the
    /// greedy token and `pos + 1` into `state`.
    fn lm_head(
        &mut self,
        final_norm: &Buffer<bf16>,
        head: &Buffer<bf16>,
        quant_head: Option<&QuantMatrix>,
    ) -> Result<()> {
        let plan = self.plan;
        let c = self.cfg;
        let lm = plan.lm_head;
        let mut argmax = plan.argmax;
        let parts = match quant_head {
            Some(q) => {
                let parts = q.head_programs();
                let (b, num_warps) = crate::tuning::argmax_finish_config(parts);
                argmax = crate::decode::KernelChoice {
                    consts: crate::kernels::ArgmaxFinishConsts { b },
                    num_warps,
                };
                parts
            }
            None => plan.lm_programs(c.vocab_size),
        };
        if let Some(cfg) = self.config(Block::LmHead, [parts as u32, 1, 1], lm.num_warps) {
            let s = &mut *self.s;
            let eps = c.rms_norm_eps as f32;
            if let Some(q) = quant_head {
                let (x, sp) = (&s.x, &mut s.spare);
                let (logits, val, idx) = (&mut s.logits, &mut s.part_val, &mut s.part_idx);
                q.lm_head(self.dev, cfg, x, final_norm, eps, logits, val, idx, sp)?;
            } else {
                LmHeadArgmaxArgs {
                    x: &s.x,
                    norm_w: final_norm,
                    w: head,
                    logits: &mut s.logits,
                    part_val: &mut s.part_val,
                    part_idx: &mut s.part_idx,
                    n: c.vocab_size as i32,
                    k: c.hidden_size as i32,
                    eps,
                }
                .launch(self.dev, cfg, lm)?;
            }
        }
        let Some(cfg) = self.config(Block::Argmax, [1, 1, 1], argmax.num_warps) else {
            return Ok(());
        };
        let s = &mut *self.s;
        ArgmaxFinishArgs {
            part_val: &s.part_val,
            part_idx: &s.part_idx,
            state: &mut s.state,
            parts: parts as i32,
        }
        .launch(self.dev, cfg, argmax.consts)?;
        Ok(())
    }
}
