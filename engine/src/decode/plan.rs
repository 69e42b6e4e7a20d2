//! The launch plan: which compiled variant each launch of a step uses, and on how many
//! programs. [`LaunchPlan::new`] derives it from the model's shapes and the device, one
//! rule per launch (the rules and their measurements are in [`crate::tuning`]);
//! `tilefuse bench --sweep` edits its fields to time other variants.

use tilefuse_dsl::runtime::{Device, KernelConsts};

use crate::config::ModelConfig;
use crate::error::{EngineError, Result};
use crate::kernels::{ArgmaxFinishConsts, AttentionCombineConsts, AttentionSplitConsts};
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
    /// Its place in [`Block::ALL`].
    pub fn index(self) -> usize {
        Block::ALL
            .iter()
            .position(|&b| b == self)
            .expect("every block is in Block::ALL")
    }

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

/// A compiled kernel variant: its typed compile-time constants and warp count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KernelChoice<C> {
    /// Compile-time constants, by name.
    pub consts: C,
    /// Warps per program.
    pub num_warps: u32,
}

impl<C: KernelConsts> KernelChoice<C> {
    /// Fails unless this variant was compiled.
    pub fn check(&self) -> Result<()> {
        Ok(self.consts.check(self.num_warps)?)
    }

    /// The choice in words, as the runtime names variants
    /// (`D=128, G=2, BS=64, STAGES=1, CLUSTER=1, num_warps=4`).
    pub fn describe(&self) -> String {
        self.consts.describe(self.num_warps)
    }
}

/// Which compiled variant each kernel of a step uses; derived from the model's shapes
/// and the device by [`LaunchPlan::new`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchPlan {
    /// `rms_norm_gemv` for the QKV projection.
    pub qkv: GemvConfig,
    /// `gemv_residual` for the O projection.
    pub o_proj: GemvConfig,
    /// `rms_norm_gate_up`.
    pub gate_up: GemvConfig,
    /// `gemv_residual` for the down projection.
    pub down: GemvConfig,
    /// `lm_head_argmax`; its `programs` caps the grid (each program takes consecutive
    /// row blocks), 0 for one program per `block_n` rows.
    pub lm_head: GemvConfig,
    /// `argmax_finish`, sized for the LM head's candidates.
    pub argmax: KernelChoice<ArgmaxFinishConsts>,
    /// `attention_split`; groups larger than `g` take several programs. With
    /// `cluster > 1` the splits of a KV head form one thread-block cluster that merges
    /// them itself (`splits == cluster`, sm_90 or the interpreter) and
    /// `attention_combine` is not launched.
    pub attention: KernelChoice<AttentionSplitConsts>,
    /// `attention_combine`; unused when the attention is clustered.
    pub combine: KernelChoice<AttentionCombineConsts>,
    /// Splits of the KV sequence in decode attention.
    pub splits: usize,
    /// Fewest positions per split (`attention_split`'s `min_chunk`): at short contexts
    /// only `ceil((pos + 1) / min_chunk)` splits hold positions.
    pub min_chunk: usize,
    /// Bytes of each layer's gate/up weights that `attention_split` asks L2 for (see
    /// [`tuning::attention_prefetch_bytes`]).
    pub prefetch_bytes: usize,
    /// Bytes of each layer's quantized gate/up words that `attention_split` asks L2
    /// for, whatever the matrix's size; `None`: the default policy
    /// ([`tuning::attention_prefetch_words`]).
    pub prefetch_words: Option<usize>,
    /// Bytes of the next GEMV's quantized words that each quantizer launch asks L2 for,
    /// whatever the matrix's size; `None`: the default policy
    /// ([`tuning::quantizer_prefetch`]).
    pub quantizer_prefetch: Option<usize>,
}

/// The GEMVs' tiles on the interpreter (small tiles: less masked work per program).
const CPU_GEMV: GemvConfig = GemvConfig::tile(8, 256, 4);

/// The LM head's tile on the interpreter.
const CPU_LM_HEAD: GemvConfig = GemvConfig::tile(16, 256, 4);

impl LaunchPlan {
    /// The plan for `cfg` on `dev`; fails when the model needs a shape no kernel variant
    /// was compiled for (the message names the config value).
    pub fn new(cfg: &ModelConfig, dev: &Device, max_seq_len: usize) -> Result<LaunchPlan> {
        check_shapes(cfg)?;
        let (h, im, qd) = (cfg.hidden_size, cfg.intermediate_size, cfg.q_dim());
        let qkv_dim = qd + 2 * cfg.kv_dim();
        let gpu = dev.is_cuda();
        // On the GPU the tuned configuration; on the interpreter, small tiles.
        let gemv = |tuned: GemvConfig| if gpu { tuned } else { CPU_GEMV };
        let sm_count = match dev.as_cuda() {
            Some(cuda) => cuda.info().map_or(tuning::DEFAULT_SM_COUNT, |i| i.sm_count),
            None => tuning::DEFAULT_SM_COUNT,
        };
        let lm_head = if gpu {
            tuning::lm_head_config_for(cfg.vocab_size, h, sm_count)
        } else {
            CPU_LM_HEAD
        };
        let cluster = match dev.as_cuda() {
            Some(cuda) => tuning::attention_cluster(cuda.compute_capability()),
            None => 1,
        };
        let attention = attention_choice(cfg, gpu, cluster);
        let plan = LaunchPlan {
            qkv: gemv(tuning::norm_gemv_config(qkv_dim, h)),
            o_proj: gemv(tuning::gemv_config(h, qd)),
            gate_up: gemv(tuning::gate_up_config(im, h)),
            down: gemv(tuning::gemv_config(h, im)),
            lm_head,
            // Sized for the LM head's candidates below.
            argmax: KernelChoice {
                consts: ArgmaxFinishConsts::default(),
                num_warps: 4,
            },
            attention,
            combine: KernelChoice {
                // One program per head (`--sweep`: 1-2% faster than 32-column pieces).
                consts: AttentionCombineConsts {
                    d: cfg.head_dim,
                    s: 0,
                    dc: cfg.head_dim,
                },
                num_warps: 4,
            },
            splits: 0,
            min_chunk: if gpu { tuning::ATTENTION_MIN_CHUNK } else { 1 },
            prefetch_bytes: tuning::attention_prefetch_bytes(),
            prefetch_words: tuning::attention_prefetch_words_override(),
            quantizer_prefetch: tuning::quantizer_prefetch_override(),
        };
        // The split count is fixed for the graph's sake (the same at every position):
        // on the GPU by the one rule for the cache's capacity; the interpreter gets two,
        // so that the combine runs everywhere. A cluster merges one split a program.
        let splits = if plan.clustered() {
            plan.attention.consts.cluster
        } else if gpu {
            tuning::attention_splits(max_seq_len, plan.attention.consts.bs)
        } else {
            2
        };
        let plan = plan.with_splits(splits).with_sized_argmax(cfg.vocab_size);
        plan.check()?;
        Ok(plan)
    }

    /// Programs of the LM head launch (= greedy candidates written).
    pub fn lm_programs(&self, vocab: usize) -> usize {
        self.lm_head.grid(vocab) as usize
    }

    /// The plan with `splits` attention splits and the smallest combine step that
    /// holds them.
    pub fn with_splits(mut self, splits: usize) -> LaunchPlan {
        self.splits = splits;
        self.combine.consts.s = tuning::combine_s(splits);
        self
    }

    /// Whether the attention's splits merge inside one thread-block cluster per KV head
    /// (no `attention_combine` launch).
    pub fn clustered(&self) -> bool {
        self.attention.consts.cluster > 1
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
        self.attention.consts.bs = bs;
        self.attention.consts.cluster = cluster;
        self.with_splits(splits)
    }

    /// The plan with the LM head's grid capped at `programs` (0: one program per row
    /// block), the final argmax sized for the new candidate count.
    pub fn with_lm_head_programs(mut self, programs: usize, vocab: usize) -> LaunchPlan {
        self.lm_head.programs = programs;
        self.with_sized_argmax(vocab)
    }

    /// The plan with the LM head's variant changed (its grid cap kept), and the final
    /// argmax's block sized for the new candidate count.
    pub fn with_lm_head(mut self, lm_head: GemvConfig, vocab: usize) -> LaunchPlan {
        self.lm_head = GemvConfig {
            programs: self.lm_head.programs,
            ..lm_head
        };
        self.with_sized_argmax(vocab)
    }

    /// The plan with the final argmax's block sized for the LM head's candidates.
    fn with_sized_argmax(mut self, vocab: usize) -> LaunchPlan {
        let (b, num_warps) = tuning::argmax_finish_config(self.lm_programs(vocab));
        self.argmax = KernelChoice {
            consts: ArgmaxFinishConsts { b },
            num_warps,
        };
        self
    }

    /// Every launch of the plan: its kernel's name and the variant in words.
    pub fn described(&self) -> Vec<(&'static str, String)> {
        let gemv = |name, c: &GemvConfig, describe: fn(&GemvConfig) -> String| (name, describe(c));
        vec![
            gemv("rms_norm_gemv", &self.qkv, |c| {
                gemv_choice::<crate::kernels::RmsNormGemvConsts>(c).describe()
            }),
            ("attention_split", self.attention.describe()),
            ("attention_combine", self.combine.describe()),
            gemv("gemv_residual", &self.o_proj, |c| {
                gemv_choice::<crate::kernels::GemvResidualConsts>(c).describe()
            }),
            gemv("rms_norm_gate_up", &self.gate_up, |c| {
                gemv_choice::<crate::kernels::RmsNormGateUpConsts>(c).describe()
            }),
            gemv("gemv_residual", &self.down, |c| {
                gemv_choice::<crate::kernels::GemvResidualConsts>(c).describe()
            }),
            gemv("lm_head_argmax", &self.lm_head, |c| {
                gemv_choice::<crate::kernels::LmHeadArgmaxConsts>(c).describe()
            }),
            ("argmax_finish", self.argmax.describe()),
        ]
    }

    /// Fails unless every launch names a compiled variant and the split count fits the
    /// combine step (`1 <= splits <= S`).
    pub fn check(&self) -> Result<()> {
        use crate::kernels::{
            GemvResidualConsts, LmHeadArgmaxConsts, RmsNormGateUpConsts, RmsNormGemvConsts,
        };
        gemv_choice::<RmsNormGemvConsts>(&self.qkv).check()?;
        self.attention.check()?;
        self.combine.check()?;
        gemv_choice::<GemvResidualConsts>(&self.o_proj).check()?;
        gemv_choice::<RmsNormGateUpConsts>(&self.gate_up).check()?;
        gemv_choice::<GemvResidualConsts>(&self.down).check()?;
        gemv_choice::<LmHeadArgmaxConsts>(&self.lm_head).check()?;
        self.argmax.check()?;
        let AttentionCombineConsts { d, s, dc } = self.combine.consts;
        if dc == 0 || dc > d || d % dc != 0 {
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
            let cluster = self.attention.consts.cluster;
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

    /// The grids of one layer's launches for `cfg`, in step order (no combine when the
    /// splits merge in a cluster).
    pub fn layer_grids(&self, cfg: &ModelConfig) -> Vec<(Block, [u32; 3])> {
        // One program per row block (only the LM head caps its grid).
        let rows = |c: &GemvConfig, n: usize| n.div_ceil(c.block_n) as u32;
        let qkv_dim = cfg.q_dim() + 2 * cfg.kv_dim();
        let (nh, nkv) = (cfg.num_heads, cfg.num_kv_heads);
        let mut grids = vec![
            (Block::Qkv, [rows(&self.qkv, qkv_dim), 1, 1]),
            (
                Block::Attention,
                [
                    nkv as u32,
                    self.splits as u32,
                    (nh / nkv).div_ceil(self.attention.consts.g) as u32,
                ],
            ),
        ];
        if !self.clustered() {
            let chunks = cfg.head_dim / self.combine.consts.dc;
            grids.push((Block::Combine, [nh as u32, chunks as u32, 1]));
        }
        grids.extend([
            (Block::OProj, [rows(&self.o_proj, cfg.hidden_size), 1, 1]),
            (
                Block::GateUp,
                [rows(&self.gate_up, cfg.intermediate_size), 1, 1],
            ),
            (Block::Down, [rows(&self.down, cfg.hidden_size), 1, 1]),
        ]);
        grids
    }
}

/// A GEMV configuration as a typed kernel choice of the kernel `C` belongs to.
fn gemv_choice<C: KernelConsts + From<GemvConfig>>(c: &GemvConfig) -> KernelChoice<C> {
    KernelChoice {
        consts: C::from(*c),
        num_warps: c.num_warps,
    }
}

/// Fails for shapes no kernel variant was compiled for, naming the config value.
fn check_shapes(cfg: &ModelConfig) -> Result<()> {
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
    Ok(())
}

/// The attention launch for a cluster of `cluster` programs (1: split + combine; head
/// shapes without a clustered variant fall back to it). On the GPU, pairs of query heads
/// over 64-position tiles (`--sweep`, H100: G = 2 / BS = 64 beat G = 1 / BS = 32 and
/// G = 4 inside the step); the interpreter runs whole groups over 32-position tiles.
fn attention_choice(
    cfg: &ModelConfig,
    gpu: bool,
    cluster: usize,
) -> KernelChoice<AttentionSplitConsts> {
    let group = cfg.num_heads / cfg.num_kv_heads;
    let consts = if gpu {
        AttentionSplitConsts {
            d: cfg.head_dim,
            g: group.next_power_of_two().min(2),
            bs: tuning::ATTENTION_BS,
            stages: tuning::ATTENTION_STAGES,
            cluster,
        }
    } else {
        AttentionSplitConsts {
            d: cfg.head_dim,
            g: group.next_power_of_two().min(4),
            bs: 32,
            stages: 1,
            cluster,
        }
    };
    let choice = KernelChoice {
        consts,
        num_warps: 4,
    };
    if cluster > 1 && choice.check().is_err() {
        return attention_choice(cfg, gpu, 1);
    }
    choice
}
