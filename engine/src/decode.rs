//! The kernel-based decoder: model weights on a device, a preallocated KV cache, and
//! one decode step as a fixed sequence of kernel launches (see [`crate::kernels`]).
//!
//! Everything a step reads that changes from token to token lives in device memory:
//! `state = [token, pos]` is read by the kernels, and the last kernel writes the greedy
//! next token and `pos + 1` back. The launch sequence is therefore the same at every
//! position, which is what lets [`Decoder::capture`] record it once as a CUDA graph and
//! replay it for every token. On the CPU device the same launches run on the interpreter.
//!
//! Prompts go through the layers in chunks ([`Decoder::prefill`], see
//! [`crate::prefill`]), which write the same KV cache and leave the same `state` and
//! logits as token-by-token steps would; [`Decoder::step`] also takes a prompt one
//! token at a time.

use std::collections::HashMap;

use half::bf16;
use tilefuse_dsl::runtime::{Buffer, Device, Graph, KernelArg, KernelDef, Readback};

use crate::config::ModelConfig;
use crate::error::{EngineError, Result};
use crate::kernels::{
    ARGMAX_FINISH, ATTENTION_COMBINE, ATTENTION_SPLIT, EMBED, GEMV_RESIDUAL, LM_HEAD_ARGMAX,
    RMS_NORM_GATE_UP, RMS_NORM_GEMV, SAMPLE_CHECK, SAMPLE_DRAW, SAMPLE_PICK, SAMPLE_TOPK_MASS,
    SAMPLE_TOPK_PART,
};
use crate::model::ModelWeights;
use crate::prefill::{LayerView, ModelView, Prefiller};
use crate::reference::rope_inv_freq;
use crate::sampling::Sampling;
use crate::tuning::{self, GemvConfig};

/// The launches of a step, by block; used to time a step part by part.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Block {
    /// Embedding row of the input token.
    Embed,
    /// RMSNorm + fused QKV projection.
    Qkv,
    /// QK-norm + RoPE + KV-cache append + split-K attention, first pass.
    Attention,
    /// Merge of the attention splits.
    Combine,
    /// O projection + residual.
    OProj,
    /// RMSNorm + gate/up projection + SiLU gate.
    GateUp,
    /// Down projection + residual.
    Down,
    /// Final norm + LM head + per-program greedy candidates.
    LmHead,
    /// The greedy token and the position update.
    Argmax,
}

impl Block {
    /// Every block, in step order.
    pub const ALL: [Block; 9] = [
        Block::Embed,
        Block::Qkv,
        Block::Attention,
        Block::Combine,
        Block::OProj,
        Block::GateUp,
        Block::Down,
        Block::LmHead,
        Block::Argmax,
    ];
}

/// A compiled kernel variant and its grid: one launch of a step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelChoice {
    /// Compile-time constants, in the kernel's declaration order.
    pub consts: Vec<i64>,
    /// Warps per program.
    pub num_warps: u32,
}

/// Which compiled variant each kernel of a step uses; derived from the model's shapes
/// and the device by [`LaunchPlan::new`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchPlan {
    /// `rms_norm_gemv` for the QKV projection: `[BLOCK_N, BLOCK_K]`.
    pub qkv: KernelChoice,
    /// `gemv_residual` for the O projection.
    pub o_proj: KernelChoice,
    /// `rms_norm_gate_up`.
    pub gate_up: KernelChoice,
    /// `gemv_residual` for the down projection.
    pub down: KernelChoice,
    /// `lm_head_argmax`: `[BLOCK_N, BLOCK_K, STAGES, STREAM]`.
    pub lm_head: KernelChoice,
    /// Programs of the LM head (each takes consecutive row blocks), 0 for one program
    /// per `BLOCK_N` rows.
    pub lm_head_programs: usize,
    /// `argmax_finish`: `[B]`.
    pub argmax: KernelChoice,
    /// `attention_split`: `[D, G, BS, STAGES, CLUSTER]`; groups larger than `G` take
    /// several programs. With `CLUSTER > 1` the splits of a KV head form one
    /// thread-block cluster that merges them itself (`splits == CLUSTER`, sm_90 or the
    /// interpreter) and `attention_combine` is not launched.
    pub attention: KernelChoice,
    /// `attention_combine`: `[D, S, DC]`; unused when the attention is clustered.
    pub combine: KernelChoice,
    /// Splits of the KV sequence in decode attention.
    pub splits: usize,
    /// Fewest positions per split (`attention_split`'s `min_chunk`): at short contexts
    /// only `ceil((pos + 1) / min_chunk)` splits hold positions.
    pub min_chunk: usize,
    /// Bytes of each layer's gate/up weights that `attention_split` asks L2 for (see
    /// [`tuning::attention_prefetch_bytes`]).
    pub prefetch_bytes: usize,
}

/// The GEMVs' tiles on the interpreter.
const SMALL: GemvConfig = GemvConfig::tile(8, 256, 4);

/// On the GPU, the tuned configuration; on the interpreter, `on_cpu` (small tiles: less
/// masked work per program).
fn gemv_choice(
    dev: &Device,
    def: &KernelDef,
    tuned: GemvConfig,
    on_cpu: GemvConfig,
) -> KernelChoice {
    let c = if dev.is_cuda() { tuned } else { on_cpu };
    KernelChoice {
        consts: c.consts_for(def),
        num_warps: c.num_warps,
    }
}

impl LaunchPlan {
    /// The plan for `cfg` on `dev`; fails when the model needs a shape no kernel variant
    /// was compiled for (the message names the config value).
    pub fn new(cfg: &ModelConfig, dev: &Device, max_seq_len: usize) -> Result<LaunchPlan> {
        let d = cfg.head_dim;
        if ![32, 64, 128].contains(&d) {
            return Err(EngineError::Unsupported {
                message: format!("head_dim = {d} (supported: 32, 64, 128)"),
            });
        }
        if cfg.num_kv_heads == 0 || cfg.num_heads % cfg.num_kv_heads != 0 {
            return Err(EngineError::Unsupported {
                message: format!(
                    "num_attention_heads = {} is not a multiple of num_key_value_heads = {}",
                    cfg.num_heads, cfg.num_kv_heads
                ),
            });
        }
        let group = cfg.num_heads / cfg.num_kv_heads;
        for (name, k) in [
            ("hidden_size", cfg.hidden_size),
            ("intermediate_size", cfg.intermediate_size),
            ("num_attention_heads * head_dim", cfg.q_dim()),
        ] {
            if k % 8 != 0 {
                return Err(EngineError::Unsupported {
                    message: format!("{name} = {k} is not a multiple of 8"),
                });
            }
        }
        let (h, im, qd, v) = (
            cfg.hidden_size,
            cfg.intermediate_size,
            cfg.q_dim(),
            cfg.vocab_size,
        );
        let qkv_dim = qd + 2 * cfg.kv_dim();
        let gpu = dev.is_cuda();
        // The split count is fixed for the graph's sake (the same at every position).
        // More splits mean fewer serial iterations per program; at short contexts the
        // later splits are empty (`min_chunk`). The splits merge in `attention_combine`
        // unless `TILEFUSE_ATTN_CLUSTER` asks for a thread-block cluster per KV head.
        let cluster = match dev.as_cuda() {
            Some(cuda) => tuning::attention_cluster(cuda.compute_capability()),
            None => 1,
        };
        // Head shapes without a clustered variant merge by combine.
        let (attention, splits) = attention_choice(gpu, d as i64, group, max_seq_len, cluster);
        let (attention, splits) = if cluster > 1
            && ATTENTION_SPLIT
                .variant(&attention.consts, Some(attention.num_warps))
                .is_err()
        {
            attention_choice(gpu, d as i64, group, max_seq_len, 1)
        } else {
            (attention, splits)
        };
        let sm_count = if gpu {
            crate::perf::device_info(dev)
                .map(|i| i.sm_count)
                .unwrap_or(tuning::DEFAULT_SM_COUNT)
        } else {
            tuning::DEFAULT_SM_COUNT
        };
        let lm = tuning::lm_head_config_for(v, h, sm_count);
        let d = d as i64;
        let plan = LaunchPlan {
            qkv: gemv_choice(
                dev,
                &RMS_NORM_GEMV,
                tuning::norm_gemv_config(qkv_dim, h),
                SMALL,
            ),
            o_proj: gemv_choice(dev, &GEMV_RESIDUAL, tuning::gemv_config(h, qd), SMALL),
            gate_up: gemv_choice(dev, &RMS_NORM_GATE_UP, tuning::gate_up_config(im, h), SMALL),
            down: gemv_choice(dev, &GEMV_RESIDUAL, tuning::gemv_config(h, im), SMALL),
            lm_head: gemv_choice(dev, &LM_HEAD_ARGMAX, lm, GemvConfig::tile(16, 256, 4)),
            lm_head_programs: if gpu { lm.programs } else { 0 },
            // Sized for the LM head's candidates below.
            argmax: KernelChoice {
                consts: Vec::new(),
                num_warps: 4,
            },
            attention,
            combine: KernelChoice {
                // One program per head (`--sweep`: 1-2% faster than 32-column pieces).
                consts: [d, tuning::combine_s(splits) as i64, d].to_vec(),
                num_warps: 4,
            },
            splits,
            min_chunk: if gpu { tuning::ATTENTION_MIN_CHUNK } else { 1 },
            prefetch_bytes: tuning::attention_prefetch_bytes(),
        }
        .with_sized_argmax(v);
        plan.check()?;
        Ok(plan)
    }

    /// Programs of the LM head launch (= greedy candidates written).
    fn lm_programs(&self, vocab: usize) -> usize {
        let blocks = vocab.div_ceil(self.lm_head.consts[0] as usize).max(1);
        match self.lm_head_programs {
            0 => blocks,
            p => blocks.min(p),
        }
    }

    /// The plan with `splits` attention splits and the smallest combine step that
    /// holds them.
    pub fn with_splits(mut self, splits: usize) -> LaunchPlan {
        self.splits = splits;
        self.combine.consts[1] = tuning::combine_s(splits) as i64;
        self
    }

    /// Whether the attention's splits merge inside one thread-block cluster per KV head
    /// (no `attention_combine` launch).
    pub fn clustered(&self) -> bool {
        self.attention.consts[4] > 1
    }

    /// The plan with the attention's splits merged by a cluster of `cluster` programs
    /// (then `splits == cluster`, and the attention tile `bs` must have a variant for
    /// it), or with `cluster == 1` by `attention_combine` over `splits` splits.
    pub fn with_attention_cluster(
        mut self,
        cluster: usize,
        splits: usize,
        bs: usize,
    ) -> LaunchPlan {
        let splits = if cluster > 1 { cluster } else { splits };
        self.attention.consts[2] = bs as i64;
        self.attention.consts[4] = cluster as i64;
        self.with_splits(splits)
    }

    /// The plan with the LM head's grid capped at `programs` (0: one program per row
    /// block), the final argmax sized for the new candidate count.
    pub fn with_lm_head_programs(mut self, programs: usize, vocab: usize) -> LaunchPlan {
        self.lm_head_programs = programs;
        self.with_sized_argmax(vocab)
    }

    /// The plan with the LM head's rows per program changed (and the final argmax's
    /// block sized for the new candidate count).
    pub fn with_lm_head(mut self, lm_head: KernelChoice, vocab: usize) -> LaunchPlan {
        self.lm_head = lm_head;
        self.with_sized_argmax(vocab)
    }

    /// The plan with the final argmax's block sized for the LM head's candidates.
    fn with_sized_argmax(mut self, vocab: usize) -> LaunchPlan {
        let (b, num_warps) = tuning::argmax_finish_config(self.lm_programs(vocab));
        self.argmax = KernelChoice {
            consts: [b as i64].to_vec(),
            num_warps,
        };
        self
    }

    /// Every launch of the plan with its kernel, for checks and tools.
    pub fn choices(&self) -> [(&'static KernelDef, &KernelChoice); 8] {
        [
            (&RMS_NORM_GEMV, &self.qkv),
            (&ATTENTION_SPLIT, &self.attention),
            (&ATTENTION_COMBINE, &self.combine),
            (&GEMV_RESIDUAL, &self.o_proj),
            (&RMS_NORM_GATE_UP, &self.gate_up),
            (&GEMV_RESIDUAL, &self.down),
            (&LM_HEAD_ARGMAX, &self.lm_head),
            (&ARGMAX_FINISH, &self.argmax),
        ]
    }

    /// Fails unless every launch names a compiled variant and the split count fits the
    /// combine step (`1 <= splits <= S`).
    pub fn check(&self) -> Result<()> {
        for (def, c) in self.choices() {
            def.variant(&c.consts, Some(c.num_warps))?;
        }
        let s = self.combine.consts[1] as usize;
        let (d, dc) = (self.combine.consts[0], self.combine.consts[2]);
        if dc > d || d % dc != 0 {
            return Err(EngineError::Option {
                message: format!("attention_combine's DC = {dc} does not divide D = {d}"),
            });
        }
        if self.min_chunk == 0 {
            return Err(EngineError::Option {
                message: "min_chunk must be at least 1".into(),
            });
        }
        if self.clustered() {
            let cluster = self.attention.consts[4] as usize;
            if self.splits != cluster {
                return Err(EngineError::Option {
                    message: format!(
                        "clustered attention merges one split per program of its cluster: \
                         {} splits with CLUSTER = {cluster}",
                        self.splits
                    ),
                });
            }
        } else if self.splits == 0 || self.splits > s {
            return Err(EngineError::Option {
                message: format!(
                    "{} attention splits do not fit attention_combine compiled for S = {s}",
                    self.splits
                ),
            });
        }
        Ok(())
    }
}

/// The attention launch and its split count for a cluster of `cluster` programs (1:
/// split + combine over the capacity's splits; the interpreter gets two, so that the
/// combine runs everywhere). On the GPU, pairs of query heads over 64-position tiles
/// (`--sweep`, H100: G = 2 / BS = 64 beat G = 1 / BS = 32 and G = 4 inside the step);
/// the interpreter runs whole groups over 32-position tiles.
fn attention_choice(
    gpu: bool,
    d: i64,
    group: usize,
    max_seq_len: usize,
    cluster: usize,
) -> (KernelChoice, usize) {
    let splits = if cluster > 1 {
        cluster
    } else if gpu {
        tuning::attention_splits_for_capacity(max_seq_len)
    } else {
        2
    };
    let consts = if gpu {
        let bs = tuning::ATTENTION_BS;
        [
            d,
            group.next_power_of_two().min(2) as i64,
            bs as i64,
            tuning::ATTENTION_STAGES as i64,
            cluster as i64,
        ]
    } else {
        [
            d,
            group.next_power_of_two().min(4) as i64,
            32,
            1,
            cluster as i64,
        ]
    };
    (
        KernelChoice {
            consts: consts.to_vec(),
            num_warps: 4,
        },
        splits,
    )
}

/// One layer's weights in the kernels' layout, and its KV cache.
struct Layer {
    input_norm: Buffer<bf16>,
    /// `[q; k; v]` projection rows, `[q_dim + 2 kv_dim, hidden]`.
    qkv_w: Buffer<bf16>,
    /// Their biases (zeros when the model has none).
    qkv_b: Buffer<bf16>,
    /// QK-norm weights, `[head_dim]` (ones, unused, when the model has none).
    q_norm: Buffer<bf16>,
    k_norm: Buffer<bf16>,
    o_w: Buffer<bf16>,
    o_b: Buffer<bf16>,
    post_norm: Buffer<bf16>,
    /// `[gate; up]` projection rows, `[2 * intermediate, hidden]`.
    gate_up_w: Buffer<bf16>,
    down_w: Buffer<bf16>,
    /// `[num_kv_heads, max_seq_len, head_dim]`.
    k_cache: Buffer<bf16>,
    v_cache: Buffer<bf16>,
}

/// Activations and scratch of one step, allocated once.
struct Scratch {
    /// `[token, pos]`: the step's input, and the next step's after the last kernel.
    state: Buffer<i32>,
    /// The residual stream, `[hidden]`.
    x: Buffer<bf16>,
    qkv: Buffer<bf16>,
    /// Queries after QK-norm and RoPE, `[q_dim]`.
    q: Buffer<bf16>,
    /// Attention output, `[q_dim]`.
    attn: Buffer<bf16>,
    /// `silu(gate) * up`, `[intermediate]`.
    act: Buffer<bf16>,
    /// Split-attention partials: max, denominator, `[num_heads, splits]`; weighted sums
    /// `[num_heads, splits, head_dim]`.
    part_m: Buffer<f32>,
    part_l: Buffer<f32>,
    part_acc: Buffer<f32>,
    /// `[vocab]` logits (bf16 values stored as f32).
    logits: Buffer<f32>,
    /// Greedy candidates per LM-head program.
    part_val: Buffer<f32>,
    part_idx: Buffer<i32>,
    /// A zero bias as long as the longest projection, for layers without one.
    zeros: Buffer<bf16>,
    /// The layer kernels' timeline stamps (see [`Decoder::timeline`]); 4 values a
    /// program of the stamped layer, unwritten otherwise.
    stamps: Buffer<i64>,
}

/// Draws per step of device-side sampling (`R` of [`crate::kernels::sample_draw`]):
/// a step falls back to the host only when all of them land outside top-k/top-p.
const SAMPLE_STREAMS: usize = 4;

/// Buffers of device-side sampling ([`Decoder::sample_on_device`]).
struct DeviceSampler {
    /// `[temperature, top_p]` and `[top_k, seed]` as last uploaded.
    fparams: Buffer<f32>,
    iparams: Buffer<i32>,
    uploaded: Option<Sampling>,
    /// Programs of `tuning::SAMPLE_BLOCK` logits, and the reduction width `PB` >= them.
    parts: usize,
    reduce: usize,
    part_val: Buffer<f32>,
    part_idx: Buffer<i32>,
    cnt: Buffer<i32>,
    mass: Buffer<f32>,
    z: Buffer<f32>,
    /// Per-program top-k lists and the top-k mass, for top-k with top-p.
    part_top: Buffer<f32>,
    zk: Buffer<f32>,
    /// `[token, needs_host]`.
    result: Buffer<i32>,
    result_readback: Readback<i32>,
    /// The draw's launches recorded as a CUDA graph (used while steps replay one),
    /// with whether it includes the top-k mass kernels.
    graph: Option<(bool, Graph)>,
}

impl DeviceSampler {
    fn new(dev: &Device, vocab: usize) -> Result<DeviceSampler> {
        let block = tuning::SAMPLE_BLOCK;
        let parts = vocab.div_ceil(block);
        let reduce = tuning::sample_reduce_width(parts).ok_or_else(|| EngineError::Option {
            message: format!(
                "device sampling supports vocabularies up to {} tokens, got {vocab}",
                block * tuning::SAMPLE_REDUCE_WIDTHS[tuning::SAMPLE_REDUCE_WIDTHS.len() - 1]
            ),
        })?;
        let slots = parts * SAMPLE_STREAMS;
        Ok(DeviceSampler {
            fparams: dev.zeros(2)?,
            iparams: dev.zeros(2)?,
            uploaded: None,
            parts,
            reduce,
            part_val: dev.zeros(slots)?,
            part_idx: dev.zeros(slots)?,
            cnt: dev.zeros(slots)?,
            mass: dev.zeros(slots)?,
            z: dev.zeros(parts)?,
            part_top: dev.zeros(tuning::SAMPLE_TOP_K_MERGE)?,
            zk: dev.zeros(1)?,
            result: dev.zeros(2)?,
            result_readback: dev.readback(2)?,
            graph: None,
        })
    }
}

/// A model resident on a device, ready to decode.
pub struct Decoder {
    cfg: ModelConfig,
    dev: Device,
    plan: LaunchPlan,
    max_seq_len: usize,
    embed: Buffer<bf16>,
    /// `None` when the LM head is tied to the embedding.
    lm_head: Option<Buffer<bf16>>,
    final_norm: Buffer<bf16>,
    rope_cos: Buffer<f32>,
    rope_sin: Buffer<f32>,
    layers: Vec<Layer>,
    s: Scratch,
    /// Splits the attention partials have room for.
    split_capacity: usize,
    /// Host copy of `state`, filled in stream order (see `queue_state_read`).
    state_readback: Readback<i32>,
    /// Page-locked host copy of the logits, made on first use (see `logits`).
    logits_readback: Option<Readback<f32>>,
    /// Device-side sampling's buffers, made on first use (see `sample_on_device`).
    sampler: Option<DeviceSampler>,
    graph: Option<Graph>,
    /// The layer whose kernels write timeline stamps ([`Decoder::timeline`]).
    stamp_layer: Option<usize>,
    /// The batched-prefill driver, made on first use ([`Decoder::prefill`]).
    prefiller: Option<Prefiller>,
}

impl std::fmt::Debug for Decoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoder")
            .field("device", &self.dev)
            .field("max_seq_len", &self.max_seq_len)
            .field("plan", &self.plan)
            .field("graph", &self.graph.is_some())
            .finish()
    }
}

fn concat(parts: &[&[bf16]]) -> Vec<bf16> {
    parts.concat()
}

impl Decoder {
    /// Uploads `w` to `dev` in the kernels' layout (fused QKV and gate/up rows) and
    /// allocates a KV cache for `max_seq_len` positions and every step buffer.
    pub fn new(
        cfg: &ModelConfig,
        w: &ModelWeights<'_>,
        dev: &Device,
        max_seq_len: usize,
    ) -> Result<Decoder> {
        w.validate(cfg)?;
        if max_seq_len == 0 {
            return Err(EngineError::Option {
                message: "max_seq_len must be at least 1".into(),
            });
        }
        let plan = LaunchPlan::new(cfg, dev, max_seq_len)?;
        let (h, hd, im, v) = (
            cfg.hidden_size,
            cfg.head_dim,
            cfg.intermediate_size,
            cfg.vocab_size,
        );
        let (qd, kvd) = (cfg.q_dim(), cfg.kv_dim());
        let qkv_dim = qd + 2 * kvd;
        let zeros_len = qkv_dim.max(h);
        let ones = vec![bf16::ONE; hd];

        let mut layers = Vec::with_capacity(cfg.num_layers);
        for lw in &w.layers {
            let qkv_b = match (&lw.q_bias, &lw.k_bias, &lw.v_bias) {
                (Some(q), Some(k), Some(v)) => dev.upload(&concat(&[q, k, v]))?,
                _ => dev.zeros(qkv_dim)?,
            };
            layers.push(Layer {
                input_norm: dev.upload(&lw.input_norm)?,
                qkv_w: dev.upload(&concat(&[&lw.q_proj, &lw.k_proj, &lw.v_proj]))?,
                qkv_b,
                q_norm: dev.upload(lw.q_norm.as_deref().unwrap_or(&ones))?,
                k_norm: dev.upload(lw.k_norm.as_deref().unwrap_or(&ones))?,
                o_w: dev.upload(&lw.o_proj)?,
                o_b: match &lw.o_bias {
                    Some(b) => dev.upload(b)?,
                    None => dev.zeros(h)?,
                },
                post_norm: dev.upload(&lw.post_attention_norm)?,
                gate_up_w: dev.upload(&concat(&[&lw.gate_proj, &lw.up_proj]))?,
                down_w: dev.upload(&lw.down_proj)?,
                k_cache: dev.zeros(cfg.num_kv_heads * max_seq_len * hd)?,
                v_cache: dev.zeros(cfg.num_kv_heads * max_seq_len * hd)?,
            });
        }

        // RoPE tables, computed as the reference computes them.
        let inv_freq = rope_inv_freq(cfg);
        let mut cos = Vec::with_capacity(max_seq_len * hd / 2);
        let mut sin = Vec::with_capacity(max_seq_len * hd / 2);
        for pos in 0..max_seq_len {
            for fr in &inv_freq {
                let angle = fr * pos as f32;
                cos.push(bf16::from_f32(angle.cos()).to_f32());
                sin.push(bf16::from_f32(angle.sin()).to_f32());
            }
        }

        // Room for the most splits any plan may use (`set_plan`); a few hundred KiB.
        let splits = plan
            .splits
            .max(if dev.is_cuda() { tuning::MAX_SPLITS } else { 1 });
        let s = Scratch {
            state: dev.upload(&[0i32, 0])?,
            x: dev.zeros(h)?,
            qkv: dev.zeros(qkv_dim)?,
            q: dev.zeros(qd)?,
            attn: dev.zeros(qd)?,
            act: dev.zeros(im)?,
            part_m: dev.zeros(cfg.num_heads * splits)?,
            part_l: dev.zeros(cfg.num_heads * splits)?,
            part_acc: dev.zeros(cfg.num_heads * splits * hd)?,
            logits: dev.zeros(v)?,
            // Room for one candidate per row: any LM-head variant fits (see `set_plan`).
            part_val: dev.zeros(v)?,
            part_idx: dev.zeros(v)?,
            zeros: dev.zeros(zeros_len)?,
            // Room for any plan's layer (every grid at its most programs).
            stamps: dev.alloc_filled(
                4 * (qkv_dim
                    + cfg.num_heads * splits
                    + cfg.num_heads * hd.div_ceil(32)
                    + 2 * h
                    + im),
                -1i64,
            )?,
        };
        Ok(Decoder {
            cfg: cfg.clone(),
            dev: dev.clone(),
            max_seq_len,
            embed: dev.upload(&w.embed_tokens)?,
            lm_head: match &w.lm_head {
                Some(t) => Some(dev.upload(t)?),
                None => None,
            },
            final_norm: dev.upload(&w.norm)?,
            rope_cos: dev.upload(&cos)?,
            rope_sin: dev.upload(&sin)?,
            layers,
            s,
            split_capacity: splits,
            state_readback: dev.readback(2)?,
            logits_readback: None,
            sampler: None,
            plan,
            graph: None,
            stamp_layer: None,
            prefiller: None,
        })
    }

    /// The model's config.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// The device the model lives on.
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// The KV cache's capacity in positions.
    pub fn max_seq_len(&self) -> usize {
        self.max_seq_len
    }

    /// The kernel variants a step launches.
    pub fn plan(&self) -> &LaunchPlan {
        &self.plan
    }

    /// Replaces the launch plan, e.g. to time other compiled variants (`tilefuse bench
    /// --sweep`). Drops a captured graph. The plan must pass [`LaunchPlan::check`] and
    /// keep the splits within those the attention partials were allocated for (the
    /// plan `Decoder::new` chose). Every plan computes the same function; only the
    /// rounding order of sums may differ.
    pub fn set_plan(&mut self, plan: LaunchPlan) -> Result<()> {
        plan.check()?;
        if !plan.clustered() && plan.splits > self.split_capacity {
            return Err(EngineError::Option {
                message: format!(
                    "{} attention splits exceed the {} this decoder allocated",
                    plan.splits, self.split_capacity
                ),
            });
        }
        self.graph = None;
        self.plan = plan;
        Ok(())
    }

    /// Kernel launches per step.
    pub fn kernels_per_step(&self) -> usize {
        Block::ALL.iter().map(|&b| self.launches(b)).sum()
    }

    /// Launches of `block` per step: once per layer, or once for the step.
    /// The grids of one layer's launches, in step order (no combine when the splits
    /// merge in a cluster).
    fn layer_grids(&self) -> Vec<(Block, [u32; 3])> {
        let (cfg, plan) = (&self.cfg, &self.plan);
        let rows = |choice: &KernelChoice, n: usize| n.div_ceil(choice.consts[0] as usize) as u32;
        let qkv_dim = cfg.q_dim() + 2 * cfg.kv_dim();
        let (nh, nkv) = (cfg.num_heads, cfg.num_kv_heads);
        let mut grids = vec![
            (Block::Qkv, [rows(&plan.qkv, qkv_dim), 1, 1]),
            (
                Block::Attention,
                [
                    nkv as u32,
                    plan.splits as u32,
                    (nh / nkv).div_ceil(plan.attention.consts[1] as usize) as u32,
                ],
            ),
        ];
        if !plan.clustered() {
            let chunks = cfg.head_dim as i64 / plan.combine.consts[2];
            grids.push((Block::Combine, [nh as u32, chunks as u32, 1]));
        }
        grids.extend([
            (Block::OProj, [rows(&plan.o_proj, cfg.hidden_size), 1, 1]),
            (
                Block::GateUp,
                [rows(&plan.gate_up, cfg.intermediate_size), 1, 1],
            ),
            (Block::Down, [rows(&plan.down, cfg.hidden_size), 1, 1]),
        ]);
        grids
    }

    fn launches(&self, block: Block) -> usize {
        match block {
            Block::Embed | Block::LmHead | Block::Argmax => 1,
            Block::Combine if self.plan.clustered() => 0,
            _ => self.cfg.num_layers,
        }
    }

    /// Bytes of weights one step reads (every matrix, norm and bias once; the embedding
    /// table only through its one row unless it is also the LM head).
    pub fn weight_bytes_per_step(&self) -> usize {
        let layer: usize = self
            .layers
            .iter()
            .map(|l| {
                l.input_norm.len()
                    + l.qkv_w.len()
                    + l.qkv_b.len()
                    + l.o_w.len()
                    + l.o_b.len()
                    + l.post_norm.len()
                    + l.gate_up_w.len()
                    + l.down_w.len()
                    + if self.cfg.qk_norm {
                        2 * l.q_norm.len()
                    } else {
                        0
                    }
            })
            .sum();
        let head = self.lm_head.as_ref().unwrap_or(&self.embed).len();
        2 * (layer + head + self.final_norm.len() + self.cfg.hidden_size)
    }

    /// Bytes of KV cache one step reads at context `len` (keys and values of every
    /// layer and KV head).
    pub fn kv_bytes_per_step(&self, len: usize) -> usize {
        2 * 2 * self.cfg.num_layers * self.cfg.num_kv_heads * self.cfg.head_dim * len
    }

    /// Sets the step's input: `token` at position `pos` (a small host-to-device copy).
    pub fn set_input(&mut self, token: u32, pos: usize) -> Result<()> {
        if token as usize >= self.cfg.vocab_size {
            return Err(EngineError::TokenOutOfRange {
                token,
                vocab: self.cfg.vocab_size,
            });
        }
        if pos >= self.max_seq_len {
            return Err(EngineError::TooLong {
                prompt: pos + 1,
                new: 0,
                max: self.max_seq_len,
            });
        }
        self.s.state.copy_from_host(&[token as i32, pos as i32])?;
        Ok(())
    }

    /// Runs one step with individual launches: reads `state`, appends to the KV cache,
    /// leaves the logits in the device buffer and writes the greedy token and `pos + 1`
    /// into `state`. Asynchronous on a GPU.
    pub fn step_eager(&mut self) -> Result<()> {
        self.step_blocks(|_| true)
    }

    /// Launches only the blocks `want` selects, in step order (for timing a step part
    /// by part; a partial step leaves the model's state meaningless).
    pub fn step_blocks(&mut self, mut want: impl FnMut(Block) -> bool) -> Result<()> {
        let grids = self.layer_grids();
        let cfg = &self.cfg;
        let plan = &self.plan;
        let dev = &self.dev;
        let s = &mut self.s;
        let (h, hd) = (cfg.hidden_size as i32, cfg.head_dim);
        let qkv_dim = (cfg.q_dim() + 2 * cfg.kv_dim()) as i32;
        let im = cfg.intermediate_size as i32;
        let eps = cfg.rms_norm_eps as f32;
        let max_seq = self.max_seq_len as i32;
        let scale = (hd as f32).powf(-0.5);
        let prefetch_len =
            (2 * cfg.intermediate_size * cfg.hidden_size).min(plan.prefetch_bytes / 2) as i32;
        let grid = |block: Block| grids.iter().find(|g| g.0 == block).map_or([0; 3], |g| g.1);
        // Where each launch of the stamped layer writes its programs' stamps.
        let mut stamp_base = HashMap::new();
        let mut programs = 0;
        for (block, g) in &grids {
            stamp_base.insert(*block, programs as i32);
            programs += g.iter().product::<u32>();
        }
        let stamp_layer = self.stamp_layer;
        let mut first = true;

        if want(Block::Embed) {
            launch(
                dev,
                &mut first,
                &EMBED,
                cfg.hidden_size.div_ceil(1024) as u32,
                &[1024],
                4,
                &mut [
                    (&self.embed).into(),
                    (&s.state).into(),
                    (&mut s.x).into(),
                    h.into(),
                ],
            )?;
        }
        for (li, l) in self.layers.iter_mut().enumerate() {
            let stamp_at = |block: Block| -> i32 {
                match stamp_layer {
                    Some(sl) if sl == li => stamp_base[&block],
                    _ => -1,
                }
            };
            // (1) RMSNorm + QKV projection (+ bias).
            if want(Block::Qkv) {
                launch(
                    dev,
                    &mut first,
                    &RMS_NORM_GEMV,
                    grid(Block::Qkv),
                    &plan.qkv.consts,
                    plan.qkv.num_warps,
                    &mut [
                        (&s.x).into(),
                        (&l.input_norm).into(),
                        (&l.qkv_w).into(),
                        (&l.qkv_b).into(),
                        (&mut s.qkv).into(),
                        qkv_dim.into(),
                        h.into(),
                        eps.into(),
                        (&mut s.stamps).into(),
                        stamp_at(Block::Qkv).into(),
                    ],
                )?;
            }
            // (2) QK-norm + RoPE + KV append folded into split-K attention over the
            // cache, then the merge of the splits.
            if want(Block::Attention) {
                launch(
                    dev,
                    &mut first,
                    &ATTENTION_SPLIT,
                    grid(Block::Attention),
                    &plan.attention.consts,
                    plan.attention.num_warps,
                    &mut [
                        (&s.qkv).into(),
                        (&l.q_norm).into(),
                        (&l.k_norm).into(),
                        (&self.rope_cos).into(),
                        (&self.rope_sin).into(),
                        (&s.state).into(),
                        (&mut l.k_cache).into(),
                        (&mut l.v_cache).into(),
                        (&mut s.q).into(),
                        (&mut s.part_m).into(),
                        (&mut s.part_l).into(),
                        (&mut s.part_acc).into(),
                        (&mut s.attn).into(),
                        ((cfg.num_heads / cfg.num_kv_heads) as i32).into(),
                        max_seq.into(),
                        (plan.min_chunk as i32).into(),
                        i32::from(cfg.qk_norm).into(),
                        eps.into(),
                        scale.into(),
                        (&l.gate_up_w).into(),
                        prefetch_len.into(),
                        (&mut s.stamps).into(),
                        stamp_at(Block::Attention).into(),
                    ],
                )?;
            }
            if want(Block::Combine) && !plan.clustered() {
                launch(
                    dev,
                    &mut first,
                    &ATTENTION_COMBINE,
                    grid(Block::Combine),
                    &plan.combine.consts,
                    plan.combine.num_warps,
                    &mut [
                        (&s.part_m).into(),
                        (&s.part_l).into(),
                        (&s.part_acc).into(),
                        (&mut s.attn).into(),
                        (plan.splits as i32).into(),
                        (&mut s.stamps).into(),
                        stamp_at(Block::Combine).into(),
                    ],
                )?;
            }
            // (3) O projection + residual.
            if want(Block::OProj) {
                launch(
                    dev,
                    &mut first,
                    &GEMV_RESIDUAL,
                    grid(Block::OProj),
                    &plan.o_proj.consts,
                    plan.o_proj.num_warps,
                    &mut [
                        (&l.o_w).into(),
                        (&s.attn).into(),
                        (&l.o_b).into(),
                        (&mut s.x).into(),
                        h.into(),
                        (cfg.q_dim() as i32).into(),
                        (&mut s.stamps).into(),
                        stamp_at(Block::OProj).into(),
                    ],
                )?;
            }
            // (4) RMSNorm + gate/up projection + SiLU gate.
            if want(Block::GateUp) {
                launch(
                    dev,
                    &mut first,
                    &RMS_NORM_GATE_UP,
                    grid(Block::GateUp),
                    &plan.gate_up.consts,
                    plan.gate_up.num_warps,
                    &mut [
                        (&s.x).into(),
                        (&l.post_norm).into(),
                        (&l.gate_up_w).into(),
                        (&mut s.act).into(),
                        im.into(),
                        h.into(),
                        eps.into(),
                        (&mut s.stamps).into(),
                        stamp_at(Block::GateUp).into(),
                    ],
                )?;
            }
            // (5) Down projection + residual.
            if want(Block::Down) {
                launch(
                    dev,
                    &mut first,
                    &GEMV_RESIDUAL,
                    grid(Block::Down),
                    &plan.down.consts,
                    plan.down.num_warps,
                    &mut [
                        (&l.down_w).into(),
                        (&s.act).into(),
                        (&s.zeros).into(),
                        (&mut s.x).into(),
                        h.into(),
                        im.into(),
                        (&mut s.stamps).into(),
                        stamp_at(Block::Down).into(),
                    ],
                )?;
            }
        }
        // Final norm + LM head + greedy token.
        let parts = plan.lm_programs(cfg.vocab_size);
        if want(Block::LmHead) {
            launch(
                dev,
                &mut first,
                &LM_HEAD_ARGMAX,
                parts as u32,
                &plan.lm_head.consts,
                plan.lm_head.num_warps,
                &mut [
                    (&s.x).into(),
                    (&self.final_norm).into(),
                    self.lm_head.as_ref().unwrap_or(&self.embed).into(),
                    (&mut s.logits).into(),
                    (&mut s.part_val).into(),
                    (&mut s.part_idx).into(),
                    (cfg.vocab_size as i32).into(),
                    h.into(),
                    eps.into(),
                ],
            )?;
        }
        if want(Block::Argmax) {
            launch(
                dev,
                &mut first,
                &ARGMAX_FINISH,
                1,
                &plan.argmax.consts,
                plan.argmax.num_warps,
                &mut [
                    (&s.part_val).into(),
                    (&s.part_idx).into(),
                    (&mut s.state).into(),
                    (parts as i32).into(),
                ],
            )?;
        }
        Ok(())
    }

    /// Records one step as a CUDA graph (running it eagerly once first, so every kernel
    /// is loaded). Afterwards [`Decoder::step`] replays the graph. Fails on the CPU
    /// device and whenever the capture fails; nothing falls back silently.
    ///
    /// The warm-up step writes the KV cache at the position in `state`; it is
    /// overwritten when that position is decoded for real.
    pub fn capture(&mut self) -> Result<()> {
        self.graph = None;
        let saved = self.s.state.to_vec()?;
        self.step_eager()?;
        self.s.state.copy_from_host(&saved)?;
        let dev = self.dev.clone();
        let graph = dev.capture(|| self.step_eager())?;
        self.graph = Some(graph);
        Ok(())
    }

    /// Drops a captured graph; steps launch kernels one by one again.
    pub fn release_graph(&mut self) {
        self.graph = None;
    }

    /// Whether steps replay a captured graph.
    pub fn uses_graph(&self) -> bool {
        self.graph.is_some()
    }

    /// Runs one step: the graph if one was captured, individual launches otherwise.
    pub fn step(&mut self) -> Result<()> {
        match &self.graph {
            Some(g) => Ok(g.launch()?),
            None => self.step_eager(),
        }
    }

    /// Queues a copy of `state` (the greedy next token and the next position) behind the
    /// steps queued so far, without waiting; [`Decoder::take_state`] waits for it alone.
    /// Since each step reads its token and position from the device, the next step can
    /// be queued in between and run while the host takes this one's token.
    pub fn queue_state_read(&mut self) -> Result<()> {
        Ok(self.state_readback.enqueue(&self.s.state)?)
    }

    /// Waits for the copy [`Decoder::queue_state_read`] queued and returns its
    /// `(token, next position)`.
    pub fn take_state(&self) -> Result<(u32, usize)> {
        let st = self.state_readback.wait()?;
        Ok((st[0] as u32, st[1] as usize))
    }

    /// Waits for the step and reads `state`: the greedy next token and the next position.
    pub fn read_state(&self) -> Result<(u32, usize)> {
        let st = self.s.state.to_vec()?;
        Ok((st[0] as u32, st[1] as usize))
    }

    /// Waits for the step and copies its logits to the host.
    pub fn read_logits(&self) -> Result<Vec<f32>> {
        Ok(self.s.logits.to_vec()?)
    }

    /// Waits for the step and returns its logits, copied into page-locked host memory
    /// that is kept for the next call (no allocation per token, a faster copy than
    /// [`Decoder::read_logits`]; what sampling reads every token).
    pub fn logits(&mut self) -> Result<&[f32]> {
        if self.logits_readback.is_none() {
            self.logits_readback = Some(self.dev.readback(self.s.logits.len())?);
        }
        let rb = self.logits_readback.as_mut().expect("made above");
        rb.enqueue(&self.s.logits)?;
        Ok(rb.wait()?)
    }

    /// Draws the next token on the device from the last step's logits, by
    /// `params` (temperature, then top-k or top-p), and waits for it.
    ///
    /// `Some(token)`: a draw was accepted and `state` already holds it, so the next
    /// [`Decoder::step`] decodes it. `None`: all draws fell outside top-k/top-p, and
    /// the host must draw from [`Decoder::logits`] and pass its token to
    /// [`Decoder::set_input`]; together the two paths sample the restricted
    /// distribution exactly (rejection sampling). Draws are a function of
    /// `(seed, position)`. Errors for settings the device does not draw
    /// ([`Sampling::device_can_sample`]).
    pub fn sample_on_device(&mut self, params: &Sampling) -> Result<Option<u32>> {
        self.queue_device_sample(params)?;
        self.take_device_sample()
    }

    /// The first half of [`Decoder::sample_on_device`]: queues the draw behind the
    /// steps queued so far, and the copy of its outcome, without waiting. A step
    /// queued next decodes the drawn token (or, when the host must draw, the greedy
    /// one: that step must then be redone). While steps replay a graph, the draw's
    /// launches are recorded on first use and replay as a second graph.
    pub fn queue_device_sample(&mut self, params: &Sampling) -> Result<()> {
        params.validate()?;
        if !params.device_can_sample(self.cfg.vocab_size) {
            return Err(EngineError::Option {
                message: format!(
                    "device sampling needs a temperature > 0, and top_k <= {} with top_p \
                     (got temperature {}, top_k {}, top_p {})",
                    tuning::SAMPLE_TOP_K_MAX,
                    params.temperature,
                    params.top_k,
                    params.top_p
                ),
            });
        }
        if self.sampler.is_none() {
            self.sampler = Some(DeviceSampler::new(&self.dev, self.cfg.vocab_size)?);
        }
        let ds = self.sampler.as_mut().expect("made above");
        if ds.uploaded.as_ref() != Some(params) {
            ds.fparams
                .copy_from_host(&[params.temperature, params.top_p])?;
            let seed = (params.seed ^ (params.seed >> 32)) as u32 as i32;
            ds.iparams
                .copy_from_host(&[params.top_k.min(i32::MAX as usize) as i32, seed])?;
            ds.uploaded = Some(params.clone());
        }
        let mass = params.top_k > 0 && params.top_p < 1.0;
        let (dev, s, vocab) = (&self.dev, &mut self.s, self.cfg.vocab_size);
        if self.graph.is_none() {
            draw_on_device(dev, s, ds, vocab, mass)?;
        } else if let Some((_, graph)) = ds.graph.as_ref().filter(|(m, _)| *m == mass) {
            graph.launch()?;
        } else {
            // Steps replay a graph: so does the draw. The first one of this kernel set
            // runs eagerly (loading its kernels), then the same launches are recorded.
            ds.graph = None;
            draw_on_device(dev, s, ds, vocab, mass)?;
            let graph = dev.capture(|| draw_on_device(dev, s, ds, vocab, mass))?;
            ds.graph = Some((mass, graph));
        }
        ds.result_readback.enqueue(&ds.result)?;
        Ok(())
    }

    /// The second half of [`Decoder::sample_on_device`]: waits for the outcome of the
    /// draw [`Decoder::queue_device_sample`] queued (not for later work).
    pub fn take_device_sample(&mut self) -> Result<Option<u32>> {
        let ds = self.sampler.as_ref().ok_or_else(|| EngineError::Option {
            message: "take_device_sample before queue_device_sample".into(),
        })?;
        let out = ds.result_readback.wait()?;
        Ok((out[1] == 0).then_some(out[0] as u32))
    }

    /// Finishes a draw queued with [`Decoder::queue_device_sample`] behind the step
    /// that decoded `input` at `pos - 1`, and leaves the step that decodes the drawn
    /// token at `pos` queued when `queue_next`. `speculated`: that next step was already
    /// queued behind the draw (it decodes the device's draw, or the greedy token when
    /// the host must draw: then both steps run again, each rewriting only its own cache
    /// position). Returns the token and whether the host drew it (from `sampler`, when
    /// every device draw fell outside top-k/top-p).
    pub fn finish_device_sample(
        &mut self,
        sampler: &mut crate::sampling::Sampler,
        input: u32,
        pos: usize,
        speculated: bool,
        queue_next: bool,
    ) -> Result<(u32, bool)> {
        if let Some(token) = self.take_device_sample()? {
            // `state` holds the draw already.
            if queue_next && !speculated {
                self.step()?;
            }
            return Ok((token, false));
        }
        if speculated {
            // The speculative step overwrote the logits: run this one again.
            self.set_input(input, pos - 1)?;
            self.step()?;
        }
        let token = sampler.sample(self.logits()?);
        if queue_next {
            self.set_input(token, pos)?;
            self.step()?;
        }
        Ok((token, true))
    }

    /// Waits for the device to finish all queued work.
    pub fn synchronize(&self) -> Result<()> {
        Ok(self.dev.synchronize()?)
    }

    /// The model's device buffers (weights per layer, KV cache, RoPE tables, the step's
    /// hidden state and `state`), lent to the batched prefill.
    pub fn prefill_view(&mut self) -> ModelView<'_> {
        ModelView {
            embed: &self.embed,
            rope_cos: &self.rope_cos,
            rope_sin: &self.rope_sin,
            zeros: &self.s.zeros,
            layers: self
                .layers
                .iter_mut()
                .map(|l| LayerView {
                    input_norm: &l.input_norm,
                    qkv_w: &l.qkv_w,
                    qkv_b: &l.qkv_b,
                    q_norm: &l.q_norm,
                    k_norm: &l.k_norm,
                    o_w: &l.o_w,
                    o_b: &l.o_b,
                    post_norm: &l.post_norm,
                    gate_up_w: &l.gate_up_w,
                    down_w: &l.down_w,
                    k_cache: &mut l.k_cache,
                    v_cache: &mut l.v_cache,
                })
                .collect(),
            x: &mut self.s.x,
            state: &mut self.s.state,
            max_seq_len: self.max_seq_len,
        }
    }

    /// Uses chunks of up to `chunk` tokens in [`Decoder::prefill`] (default
    /// [`crate::prefill::DEFAULT_CHUNK`], at most the cache's capacity); allocates the
    /// chunk's activations now.
    pub fn set_prefill_chunk(&mut self, chunk: usize) -> Result<()> {
        self.prefiller = Some(Prefiller::new(&self.cfg, &self.dev, chunk)?);
        Ok(())
    }

    /// The batched-prefill driver (made with the default chunk size if none was set).
    pub fn prefiller(&mut self) -> Result<&mut Prefiller> {
        if self.prefiller.is_none() {
            let chunk = crate::prefill::DEFAULT_CHUNK.min(self.max_seq_len);
            self.set_prefill_chunk(chunk)?;
        }
        Ok(self.prefiller.as_mut().expect("made above"))
    }

    /// Runs the prompt `tokens` at positions `0..` in batched chunks; see
    /// [`Decoder::prefill_at`].
    pub fn prefill(&mut self, tokens: &[u32]) -> Result<()> {
        self.prefill_at(tokens, 0)
    }

    /// Runs `tokens` at positions `start..` through every layer in chunks (appending
    /// to the KV cache), then the step's final norm, LM head and greedy argmax on the
    /// last position: the logits, the KV cache and `state = [greedy next token,
    /// start + len]` are then those the token-by-token steps leave, and
    /// [`Decoder::step`] (eager or the captured graph) decodes the next position. A
    /// prompt past the cache's capacity, an empty one or an id outside the vocabulary
    /// is an error before any work. Asynchronous on a GPU.
    pub fn prefill_at(&mut self, tokens: &[u32], start: usize) -> Result<()> {
        self.prefiller()?;
        let mut p = self.prefiller.take().expect("made above");
        let ran = p.run(self.prefill_view(), tokens, start);
        self.prefiller = Some(p);
        ran?;
        self.step_blocks(|b| matches!(b, Block::LmHead | Block::Argmax))
    }

    /// Decodes `token` at `pos` and returns the logits for the next token (a
    /// convenience for tests and tools; [`crate::Engine`] drives steps directly).
    pub fn forward(&mut self, token: u32, pos: usize) -> Result<Vec<f32>> {
        self.set_input(token, pos)?;
        self.step()?;
        self.read_logits()
    }
}

/// One block's share of a step, from [`Decoder::profile`].
#[derive(Clone, Debug)]
pub struct BlockTime {
    /// The block.
    pub block: Block,
    /// Its launches per step.
    pub launches: usize,
    /// Median GPU time of all its launches in one step, in microseconds.
    pub us: f64,
    /// What the whole step loses with this block's launches left out of its graph:
    /// the median of the differences between interleaved replays of the full step
    /// and of the step without them, in microseconds. Unlike [`BlockTime::us`] it
    /// counts what the launches cost between their neighbours (the gaps they add, the
    /// overlap they lose) and not what their neighbours hide.
    pub in_step_us: f64,
}

impl Decoder {
    /// GPU time of `steps` replays of the captured graph queued back to back from
    /// `token` at `pos`, between two CUDA events: milliseconds per step. Each replay
    /// decodes the token the previous one chose, as generation does; the caller leaves
    /// room in the cache for `steps` more positions. Needs a captured graph.
    pub fn time_replays(&mut self, token: u32, pos: usize, steps: usize) -> Result<f64> {
        let steps = steps.max(1);
        if pos + steps > self.max_seq_len {
            return Err(EngineError::TooLong {
                prompt: pos + 1,
                new: steps,
                max: self.max_seq_len,
            });
        }
        self.set_input(token, pos)?;
        let (Some(cuda), Some(graph)) = (self.dev.as_cuda().cloned(), self.graph.as_ref()) else {
            return Err(EngineError::Option {
                message: "timing replays needs a GPU and a captured step".into(),
            });
        };
        let ms = gpu_ms(&cuda, || {
            for _ in 0..steps {
                graph.launch()?;
            }
            Ok(())
        })?;
        Ok(ms / steps as f64)
    }

    /// Times each block of a step on its own: a graph of just that block's launches
    /// (every layer's), replayed `reps` times between CUDA events; the median per block.
    /// Summed, they are the step without the gaps between blocks. Then each block's
    /// cost inside the step ([`BlockTime::in_step_us`]): the full step's graph and one
    /// without the block's launches, replayed in turn `reps` times. GPU only; `state`
    /// is restored before every replay and afterwards.
    pub fn profile(&mut self, reps: usize) -> Result<Vec<BlockTime>> {
        let Some(cuda) = self.dev.as_cuda().cloned() else {
            return Err(EngineError::Option {
                message: "profiling needs a GPU".into(),
            });
        };
        let saved = self.s.state.to_vec()?;
        // One replay from the saved state, in microseconds.
        let replay = |s: &mut Scratch, graph: &Graph| -> Result<f64> {
            s.state.copy_from_host(&saved)?;
            Ok(gpu_ms(&cuda, || Ok(graph.launch()?))? * 1e3)
        };
        let dev = self.dev.clone();
        let full = dev.capture(|| self.step_eager())?;
        let mut out = Vec::new();
        for block in Block::ALL {
            if self.launches(block) == 0 {
                continue;
            }
            let alone = dev.capture(|| self.step_blocks(|b| b == block))?;
            let without = dev.capture(|| self.step_blocks(|b| b != block))?;
            let (mut samples, mut losses) = (Vec::new(), Vec::new());
            // The first two rounds warm up.
            for rep in 0..reps.max(1) + 2 {
                let us = replay(&mut self.s, &alone)?;
                let loss = replay(&mut self.s, &full)? - replay(&mut self.s, &without)?;
                if rep >= 2 {
                    samples.push(us);
                    losses.push(loss);
                }
            }
            out.push(BlockTime {
                block,
                launches: self.launches(block),
                us: median(samples),
                in_step_us: median(losses),
            });
        }
        self.s.state.copy_from_host(&saved)?;
        self.synchronize()?;
        Ok(out)
    }
}

/// One program's record in a [`Timeline`]: `global_timer()` nanoseconds (the GPU's
/// `%globaltimer`) from the stamped layer's first program entry, and its SM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProgramStamps {
    /// When the program started.
    pub entry: i64,
    /// When it got past `wait_for_prior_kernels()` (the previous launches' writes
    /// visible).
    pub past_wait: i64,
    /// When it issued its last store.
    pub exit: i64,
    /// The SM it ran on (`sm_id()`; 0 on the interpreter).
    pub sm: i32,
}

/// One launch of the stamped layer: its block and every program's stamps, in linear
/// program order (x fastest).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchStamps {
    /// The block the launch belongs to.
    pub block: Block,
    /// Per program.
    pub programs: Vec<ProgramStamps>,
}

/// One step with one layer's launches stamped ([`Decoder::timeline`]): when each of
/// their programs started, got past its wait and finished.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Timeline {
    /// The stamped layer.
    pub layer: usize,
    /// Its launches, in step order.
    pub launches: Vec<LaunchStamps>,
}

impl Decoder {
    /// Runs the step `reps` times (as a captured graph on a GPU, after two unrecorded
    /// replays; eagerly on the CPU) with the launches of layer `layer` writing
    /// timeline stamps, and returns each run's [`Timeline`]. `state` is restored before
    /// every run and afterwards; the graph [`Decoder::step`] replays is untouched.
    ///
    /// The stamps cost a clock read at entry and after the wait and four stores a
    /// program, in that layer only.
    pub fn timeline(&mut self, layer: usize, reps: usize) -> Result<Vec<Timeline>> {
        if layer >= self.cfg.num_layers {
            return Err(EngineError::Option {
                message: format!(
                    "timeline layer {layer}: the model has {} layers (0..{})",
                    self.cfg.num_layers, self.cfg.num_layers
                ),
            });
        }
        let grids = self.layer_grids();
        let total: usize = grids
            .iter()
            .map(|(_, g)| g.iter().product::<u32>() as usize)
            .sum();
        let poison = vec![-1i64; self.s.stamps.len()];
        if 4 * total > poison.len() {
            return Err(EngineError::Option {
                message: format!(
                    "timeline: the plan's layer has {total} programs, more than the {} stamps \
                     have room for",
                    poison.len() / 4
                ),
            });
        }
        let saved = self.s.state.to_vec()?;
        self.stamp_layer = Some(layer);
        let runs = self.stamped_runs(reps.max(1), &saved, &poison);
        self.stamp_layer = None;
        self.s.state.copy_from_host(&saved)?;
        self.synchronize()?;
        let mut out = Vec::new();
        for raw in runs? {
            let mut launches = Vec::new();
            let mut at = 0;
            for (block, g) in &grids {
                let n = g.iter().product::<u32>() as usize;
                let mut programs = Vec::with_capacity(n);
                for (p, s) in raw[4 * at..4 * (at + n)].chunks(4).enumerate() {
                    if s[..3].iter().any(|&t| t < 0) || !(s[0] <= s[1] && s[1] <= s[2]) {
                        return Err(EngineError::Option {
                            message: format!(
                                "timeline of layer {layer}: program {p} of the {block:?} launch \
                                 wrote stamps {s:?} (want entry <= past wait <= exit)"
                            ),
                        });
                    }
                    programs.push(ProgramStamps {
                        entry: s[0],
                        past_wait: s[1],
                        exit: s[2],
                        sm: s[3] as i32,
                    });
                }
                launches.push(LaunchStamps {
                    block: *block,
                    programs,
                });
                at += n;
            }
            let t0 = launches
                .iter()
                .flat_map(|l| l.programs.iter().map(|p| p.entry))
                .min()
                .unwrap_or(0);
            for p in launches.iter_mut().flat_map(|l| l.programs.iter_mut()) {
                p.entry -= t0;
                p.past_wait -= t0;
                p.exit -= t0;
            }
            out.push(Timeline { layer, launches });
        }
        Ok(out)
    }

    /// The raw stamps of `reps` stamped steps (see [`Decoder::timeline`]).
    fn stamped_runs(
        &mut self,
        reps: usize,
        saved: &[i32],
        poison: &[i64],
    ) -> Result<Vec<Vec<i64>>> {
        let mut runs = Vec::with_capacity(reps);
        if self.dev.is_cuda() {
            let dev = self.dev.clone();
            let graph = dev.capture(|| self.step_eager())?;
            for rep in 0..reps + 2 {
                self.s.state.copy_from_host(saved)?;
                self.s.stamps.copy_from_host(poison)?;
                graph.launch()?;
                let raw = self.s.stamps.to_vec()?;
                if rep >= 2 {
                    runs.push(raw);
                }
            }
        } else {
            for _ in 0..reps {
                self.s.state.copy_from_host(saved)?;
                self.s.stamps.copy_from_host(poison)?;
                self.step_eager()?;
                runs.push(self.s.stamps.to_vec()?);
            }
        }
        Ok(runs)
    }
}

/// Milliseconds between two CUDA events recorded on `cuda`'s stream around `work`
/// (the GPU time of what it queues, not the host's).
fn gpu_ms(
    cuda: &tilefuse_dsl::runtime::CudaDevice,
    work: impl FnOnce() -> Result<()>,
) -> Result<f64> {
    use cudarc::driver::sys::CUevent_flags;
    let driver = |what: &'static str| {
        move |source| tilefuse_dsl::runtime::RuntimeError::Driver {
            what: what.into(),
            source,
        }
    };
    let event = || {
        cuda.context()
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(driver("creating a timing event"))
    };
    let (start, end) = (event()?, event()?);
    let stream = cuda.stream();
    start.record(stream).map_err(driver("timing GPU work"))?;
    work()?;
    end.record(stream).map_err(driver("timing GPU work"))?;
    Ok(f64::from(
        start.elapsed_ms(&end).map_err(driver("timing GPU work"))?,
    ))
}

/// The middle value (the upper one of an even count); `v` must not be empty.
pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Launches `def` with its compiled variant for `consts` / `num_warps`.
///
/// The first launch of a step (`*first`) is serialized: kernels may overlap their
/// predecessors (programmatic launch) and read the position, the KV cache and the RoPE
/// tables before waiting for them, which is safe only once the previous step has
/// finished writing them.
/// Queues the device draw's launches (see [`Decoder::queue_device_sample`]): Gumbel-max
/// draws, their ranks and masses, the top-k mass when `mass` (top-k with top-p), and the
/// pick into `state` and `ds.result`.
fn draw_on_device(
    dev: &Device,
    s: &mut Scratch,
    ds: &mut DeviceSampler,
    vocab: usize,
    mass: bool,
) -> Result<()> {
    let (block, reduce, parts) = (
        tuning::SAMPLE_BLOCK as i64,
        ds.reduce as i64,
        ds.parts as i32,
    );
    let r = SAMPLE_STREAMS as i64;
    // Serialized: it reads what the whole step wrote.
    let mut first = true;
    launch(
        dev,
        &mut first,
        &SAMPLE_DRAW,
        ds.parts as u32,
        &[block, r],
        4,
        &mut [
            (&s.logits).into(),
            (&ds.fparams).into(),
            (&ds.iparams).into(),
            (&s.state).into(),
            (&mut ds.part_val).into(),
            (&mut ds.part_idx).into(),
            (vocab as i32).into(),
        ],
    )?;
    launch(
        dev,
        &mut first,
        &SAMPLE_CHECK,
        ds.parts as u32,
        &[block, r, reduce],
        4,
        &mut [
            (&s.logits).into(),
            (&ds.fparams).into(),
            (&s.state).into(),
            (&ds.part_val).into(),
            (&ds.part_idx).into(),
            (&mut ds.cnt).into(),
            (&mut ds.mass).into(),
            (&mut ds.z).into(),
            (vocab as i32).into(),
            parts.into(),
        ],
    )?;
    if mass {
        let km = tuning::SAMPLE_TOP_K_MAX as i64;
        let lists = vocab.div_ceil(tuning::SAMPLE_TOP_K_BLOCK);
        launch(
            dev,
            &mut first,
            &SAMPLE_TOPK_PART,
            lists as u32,
            &[tuning::SAMPLE_TOP_K_BLOCK as i64, km],
            8,
            &mut [
                (&s.logits).into(),
                (&ds.iparams).into(),
                (&mut ds.part_top).into(),
                (vocab as i32).into(),
            ],
        )?;
        launch(
            dev,
            &mut first,
            &SAMPLE_TOPK_MASS,
            1,
            &[tuning::SAMPLE_TOP_K_MERGE as i64, km],
            8,
            &mut [
                (&s.logits).into(),
                (&ds.fparams).into(),
                (&ds.iparams).into(),
                (&s.state).into(),
                (&ds.part_top).into(),
                (&mut ds.zk).into(),
                (lists as i32).into(),
            ],
        )?;
    }
    launch(
        dev,
        &mut first,
        &SAMPLE_PICK,
        1,
        &[r, reduce],
        4,
        &mut [
            (&ds.fparams).into(),
            (&ds.iparams).into(),
            (&mut s.state).into(),
            (&ds.part_val).into(),
            (&ds.part_idx).into(),
            (&ds.cnt).into(),
            (&ds.mass).into(),
            (&ds.z).into(),
            (&ds.zk).into(),
            (&mut ds.result).into(),
            parts.into(),
        ],
    )?;
    Ok(())
}

fn launch(
    dev: &Device,
    first: &mut bool,
    def: &KernelDef,
    grid: impl Into<tilefuse_dsl::runtime::LaunchConfig>,
    consts: &[i64],
    num_warps: u32,
    args: &mut [KernelArg<'_>],
) -> Result<()> {
    let mut cfg = grid.into().num_warps(num_warps);
    if std::mem::take(first) {
        cfg = cfg.serialized();
    }
    def.launch_dyn(dev, cfg, consts, args)?;
    Ok(())
}
