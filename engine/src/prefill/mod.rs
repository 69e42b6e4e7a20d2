//! Batched prefill: the prompt goes through the layers in chunks of up to `C` tokens,
//! each layer a handful of GEMM and attention launches over the whole chunk (see
//! [`crate::prefill_kernels`]), instead of one decode step per token.
//!
//! The prefill writes the same KV cache the decode step reads, and ends with the last
//! prompt position's hidden state in the decode step's `x` and `state = [last token,
//! last position]`: the decode step's LM head and greedy argmax then leave the logits
//! and `state = [next token, next position]` exactly as a token-by-token prompt would,
//! and decoding (eager or one CUDA graph for every position) continues from there.
//!
//! [`Prefiller`] owns the chunk's activations (allocated once for `C` rows); the
//! model's device buffers are lent to it per call as a [`ModelView`].

use half::bf16;
use tilefuse_dsl::runtime::{Buffer, Device, KernelArg, KernelDef, LaunchConfig};

use crate::config::ModelConfig;
use crate::decode::QuantMatrix;
use crate::error::{EngineError, Result};
use crate::gguf::device::QuantRows;

mod plan;
use crate::prefill_kernels::{
    PREFILL_ATTENTION, PREFILL_EMBED, PREFILL_GATE_UP, PREFILL_GEMM, PREFILL_GEMM_SPLIT,
    PREFILL_LAST_ROW, PREFILL_QK_ROPE, PREFILL_RMSNORM,
};
pub use plan::{PrefillPlan, TileChoice, LONG_CHUNK};

/// Prompt tokens per chunk unless set otherwise ([`Prefiller::new`]): on an H200 an
/// 8192-token prompt took 86.0 / 81.8 / 79.0 ms in chunks of 2048 / 4096 / 8192
/// (docs/perf.md, "Batched prefill: operands through the ring, tile sweep"); the
/// chunk's activations take about 26 KB a token for Qwen3-0.6B.
pub const DEFAULT_CHUNK: usize = 8192;

/// Chunks of up to this many tokens read a quantized matrix with the multi-token
/// GEMVs ([`crate::kernels_quant::q4_k_gemv_tokens`] and its twins: the weights read
/// once for every 8 tokens) instead of dequantizing it for a GEMM, unless set otherwise
/// ([`Prefiller::set_quant_gemv_tokens`], or the environment's
/// `TILEFUSE_QUANT_PREFILL_TOKENS`). Where the two meet: docs/perf.md, "Short prompts
/// of quantized models".
pub const QUANT_GEMV_TOKENS: usize = 32;

/// Rows per program of [`crate::prefill_kernels::prefill_qk_rope`].
const ROPE_ROWS: i64 = 16;

/// Columns per step of [`crate::prefill_kernels::prefill_rmsnorm`].
const NORM_BLOCK: i64 = 1024;

/// Kernel launches per layer of a chunk: two norms, three GEMMs and the gate/up GEMM,
/// QK-norm/RoPE, attention.
const LAUNCHES_PER_LAYER: usize = 8;

/// A layer's matrix as the prefill reads it: bf16 rows in place, or a quantized matrix
/// of the decode step, dequantized to bf16 into the prefill's scratch
/// ([`crate::kernels_quant::dequantize_q4_k`] and its twins) just before its GEMM. The
/// scratch holds one matrix at a time (the largest, `[2 * intermediate, hidden]`), so
/// a quantized model keeps its small weights and the GEMMs read bf16 as a dense one's
/// do; the dequantization adds one pass over the layer's weights a chunk.
#[derive(Clone, Copy, Debug)]
pub struct PrefillWeight<'a>(Weight<'a>);

#[derive(Clone, Copy, Debug)]
enum Weight<'a> {
    Dense(&'a Buffer<bf16>),
    Quant(&'a QuantMatrix),
}

impl<'a> PrefillWeight<'a> {
    /// bf16 rows, read in place.
    pub fn dense(w: &'a Buffer<bf16>) -> Self {
        PrefillWeight(Weight::Dense(w))
    }

    /// A quantized matrix, dequantized before each GEMM over it.
    pub(crate) fn quant(q: &'a QuantMatrix) -> Self {
        PrefillWeight(Weight::Quant(q))
    }

    /// Elements of the scratch a GEMM over it needs (0 for bf16 rows).
    fn scratch_len(&self) -> usize {
        match self.0 {
            Weight::Dense(_) => 0,
            Weight::Quant(q) => {
                let (rows, cols) = q.shape();
                rows * cols
            }
        }
    }

    /// The quantized matrix, if these are not bf16 rows.
    fn quantized(&self) -> Option<&'a QuantMatrix> {
        match self.0 {
            Weight::Dense(_) => None,
            Weight::Quant(q) => Some(q),
        }
    }

    /// Launches the dequantization takes before each GEMM (0 for bf16 rows).
    pub(crate) fn dequant_launches(&self) -> usize {
        match self.0 {
            Weight::Dense(_) => 0,
            Weight::Quant(q) => q.runs(),
        }
    }

    /// The bf16 rows a GEMM reads: these, or the matrix dequantized into `scratch`.
    fn rows<'b>(self, dev: &Device, scratch: &'b mut Buffer<bf16>) -> Result<&'b Buffer<bf16>>
    where
        'a: 'b,
    {
        match self.0 {
            Weight::Dense(w) => Ok(w),
            Weight::Quant(q) => {
                q.dequantize_into(dev, scratch)?;
                Ok(scratch)
            }
        }
    }
}

/// One layer's device buffers, lent to the prefill (the decode step's layout: fused
/// `[q; k; v]` and `[gate; up]` rows, zero biases where the model has none, ones for
/// absent QK-norm weights).
#[derive(Debug)]
pub struct LayerView<'a> {
    /// Input RMSNorm weight, `[hidden]`.
    pub input_norm: &'a Buffer<bf16>,
    /// `[q_dim + 2 kv_dim, hidden]`.
    pub qkv_w: PrefillWeight<'a>,
    /// `[q_dim + 2 kv_dim]`.
    pub qkv_b: &'a Buffer<bf16>,
    /// `[head_dim]`.
    pub q_norm: &'a Buffer<bf16>,
    /// `[head_dim]`.
    pub k_norm: &'a Buffer<bf16>,
    /// `[hidden, q_dim]`.
    pub o_w: PrefillWeight<'a>,
    /// `[hidden]`.
    pub o_b: &'a Buffer<bf16>,
    /// Post-attention RMSNorm weight, `[hidden]`.
    pub post_norm: &'a Buffer<bf16>,
    /// `[2 * intermediate, hidden]`.
    pub gate_up_w: PrefillWeight<'a>,
    /// `[hidden, intermediate]`.
    pub down_w: PrefillWeight<'a>,
    /// `[num_kv_heads, max_seq_len, head_dim]`.
    pub k_cache: &'a mut Buffer<bf16>,
    /// Same layout as `k_cache`.
    pub v_cache: &'a mut Buffer<bf16>,
}

/// The model's device buffers, lent to [`Prefiller::run`] by the decoder.
#[derive(Debug)]
pub struct ModelView<'a> {
    /// Embedding table, `[vocab, hidden]`.
    pub embed: &'a Buffer<bf16>,
    /// RoPE tables `[max_seq_len, head_dim / 2]` (bf16-rounded values).
    pub rope_cos: &'a Buffer<f32>,
    /// See `rope_cos`.
    pub rope_sin: &'a Buffer<f32>,
    /// Zeros, at least `hidden` of them (the down projection's bias).
    pub zeros: &'a Buffer<bf16>,
    /// Per layer.
    pub layers: Vec<LayerView<'a>>,
    /// The decode step's hidden state `[hidden]`: receives the last prompt row.
    pub x: &'a mut Buffer<bf16>,
    /// The decode step's `[token, pos]`: receives the last prompt token and position.
    pub state: &'a mut Buffer<i32>,
    /// The KV cache's capacity in positions.
    pub max_seq_len: usize,
}

/// The batched-prefill driver: a chunk's activations, allocated once for
/// [`Prefiller::chunk`] rows, and the launch plan.
#[derive(Debug)]
pub struct Prefiller {
    cfg: ModelConfig,
    dev: Device,
    chunk: usize,
    plan: PrefillPlan,
    /// The chunk's token ids, `[chunk]`.
    ids: Buffer<i32>,
    /// The residual stream, `[chunk, hidden]`.
    x: Buffer<bf16>,
    /// The residual stream after an RMSNorm, `[chunk, hidden]`.
    xn: Buffer<bf16>,
    /// Fused projection, `[chunk, q_dim + 2 kv_dim]`.
    qkv: Buffer<bf16>,
    /// Queries after QK-norm and RoPE, `[chunk, num_heads, head_dim]`.
    q: Buffer<bf16>,
    /// Attention output, `[chunk, q_dim]`.
    attn: Buffer<bf16>,
    /// `silu(gate) * up`, `[chunk, intermediate]`.
    act: Buffer<bf16>,
    /// SMs a split-K launch may fill (`usize::MAX` on the interpreter: plans split
    /// as far as they ask).
    sms: usize,
    /// Split-K f32 partials, sized for the plan ([`TileChoice::splits`]).
    partials: Buffer<f32>,
    /// Split-K arrival counters, one a tile; zero between launches.
    counters: Buffer<i32>,
    /// A quantized matrix dequantized to bf16 for its GEMM (see [`PrefillWeight`]);
    /// grown to the largest one the first time a model lends quantized weights.
    dequantized: Buffer<bf16>,
    /// Chunks of at most this many tokens take the multi-token GEMVs over quantized
    /// matrices ([`QUANT_GEMV_TOKENS`]); 0: never.
    quant_gemv_tokens: usize,
    /// Their buffers, allocated the first time a model lends quantized weights.
    short: Option<ShortChunk>,
}

/// What a short chunk over quantized matrices needs besides the chunk's activations:
/// the int8 rows the multi-token GEMVs read, the gate/up output (`[g; u]` a token)
/// that the down projection's quantizer turns into its input, and a zero bias for the
/// gate/up rows.
#[derive(Debug)]
struct ShortChunk {
    rows: QuantRows,
    gate_up: Buffer<bf16>,
    zeros: Buffer<bf16>,
}

impl Prefiller {
    /// A driver for `cfg` on `dev` with chunks of up to `chunk` tokens.
    pub fn new(cfg: &ModelConfig, dev: &Device, chunk: usize) -> Result<Prefiller> {
        if chunk == 0 {
            return Err(EngineError::Option {
                message: "the prefill chunk size must be at least 1".into(),
            });
        }
        if cfg.hidden_size % 8 != 0 || cfg.intermediate_size % 8 != 0 || cfg.q_dim() % 8 != 0 {
            return Err(EngineError::Unsupported {
                message: format!(
                    "prefill needs hidden_size ({}), intermediate_size ({}) and \
                     num_attention_heads * head_dim ({}) to be multiples of 8",
                    cfg.hidden_size,
                    cfg.intermediate_size,
                    cfg.q_dim()
                ),
            });
        }
        let plan = PrefillPlan::new(cfg, dev)?;
        let qkv_dim = cfg.q_dim() + 2 * cfg.kv_dim();
        let sms = if dev.is_cuda() {
            dev.info()?.sm_count
        } else {
            usize::MAX
        };
        let mut prefiller = Prefiller {
            cfg: cfg.clone(),
            dev: dev.clone(),
            chunk,
            plan: plan.clone(),
            ids: dev.zeros(chunk)?,
            x: dev.zeros(chunk * cfg.hidden_size)?,
            xn: dev.zeros(chunk * cfg.hidden_size)?,
            qkv: dev.zeros(chunk * qkv_dim)?,
            q: dev.zeros(chunk * cfg.q_dim())?,
            attn: dev.zeros(chunk * cfg.q_dim())?,
            act: dev.zeros(chunk * cfg.intermediate_size)?,
            sms,
            partials: dev.zeros(1)?,
            counters: dev.zeros(1)?,
            dequantized: dev.zeros(1)?,
            quant_gemv_tokens: quant_gemv_tokens_from_env()?,
            short: None,
        };
        // Sizes the split-K workspace for the default plan's splits.
        prefiller.set_plan(plan)?;
        Ok(prefiller)
    }

    /// Split-K scratch for `plan`: `(f32 partials, counters)` elements.
    fn split_room(&self, plan: &PrefillPlan) -> (usize, usize) {
        let cfg = &self.cfg;
        let qkv_dim = cfg.q_dim() + 2 * cfg.kv_dim();
        [
            (&plan.qkv, qkv_dim),
            (&plan.o_proj, cfg.hidden_size),
            (&plan.down, cfg.hidden_size),
        ]
        .iter()
        .map(|(c, n)| c.split_room(self.chunk, *n, self.sms))
        .fold((1, 1), |(p, c), (q, d)| (p.max(q), c.max(d)))
    }

    /// Reads quantized matrices with the multi-token GEMVs in chunks of at most
    /// `tokens` tokens (0: always dequantize them for the GEMMs); see
    /// [`QUANT_GEMV_TOKENS`].
    pub fn set_quant_gemv_tokens(&mut self, tokens: usize) {
        self.quant_gemv_tokens = tokens;
    }

    /// The longest chunk that reads quantized matrices with the multi-token GEMVs.
    pub fn quant_gemv_tokens(&self) -> usize {
        self.quant_gemv_tokens
    }

    /// Tokens per chunk.
    pub fn chunk(&self) -> usize {
        self.chunk
    }

    /// The kernel variants a chunk launches.
    pub fn plan(&self) -> &PrefillPlan {
        &self.plan
    }

    /// Replaces the launch plan (to time other compiled variants); it must pass
    /// [`PrefillPlan::check`] and keep the model's head dim.
    pub fn set_plan(&mut self, plan: PrefillPlan) -> Result<()> {
        plan.check()?;
        for a in [&plan.attention, &plan.attention_short] {
            if a.consts[0] != self.cfg.head_dim as i64 {
                return Err(EngineError::Option {
                    message: format!(
                        "prefill attention compiled for D = {}, the model's head_dim is {}",
                        a.consts[0], self.cfg.head_dim
                    ),
                });
            }
        }
        let (partials, counters) = self.split_room(&plan);
        if partials > self.partials.len() {
            self.partials = self.dev.zeros(partials)?;
        }
        if counters > self.counters.len() {
            self.counters = self.dev.zeros(counters)?;
        }
        self.plan = plan;
        Ok(())
    }

    /// Kernel launches for a prompt of `len` tokens (chunks of embedding and layers,
    /// and the hand-over of the last row).
    pub fn launches_for(&self, len: usize) -> usize {
        len.div_ceil(self.chunk) * (1 + LAUNCHES_PER_LAYER * self.cfg.num_layers) + 1
    }

    /// Checks a prompt of `tokens` at positions `start..` before any work: non-empty,
    /// every id in the vocabulary, and the last position inside the cache.
    pub fn validate(&self, tokens: &[u32], start: usize, max_seq_len: usize) -> Result<()> {
        if tokens.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        if start + tokens.len() > max_seq_len {
            return Err(EngineError::TooLong {
                prompt: start + tokens.len(),
                new: 0,
                max: max_seq_len,
            });
        }
        if let Some(&token) = tokens.iter().find(|&&t| t as usize >= self.cfg.vocab_size) {
            return Err(EngineError::TokenOutOfRange {
                token,
                vocab: self.cfg.vocab_size,
            });
        }
        Ok(())
    }

    /// Runs `tokens` at positions `start .. start + len` through every layer in chunks,
    /// appending their keys and values to the cache, and leaves the last position's
    /// hidden state in `m.x` and `state = [last token, start + len - 1]` (the decode
    /// step's LM head and argmax run next). Asynchronous on a GPU. Every check happens
    /// before the first launch.
    pub fn run(&mut self, m: ModelView<'_>, tokens: &[u32], start: usize) -> Result<()> {
        self.validate(tokens, start, m.max_seq_len)?;
        let cfg = &self.cfg;
        if m.layers.len() != cfg.num_layers {
            return Err(EngineError::Option {
                message: format!(
                    "prefill: {} layers lent for a model of {}",
                    m.layers.len(),
                    cfg.num_layers
                ),
            });
        }
        let scratch = m
            .layers
            .iter()
            .flat_map(|l| [l.qkv_w, l.o_w, l.gate_up_w, l.down_w])
            .map(|w| w.scratch_len())
            .max()
            .unwrap_or(0);
        if scratch > self.dequantized.len() {
            self.dequantized = self.dev.zeros(scratch)?;
        }
        // Room for the longest short chunk: regrown when the chunk, the limit or the
        // model's widths outgrow what an earlier prefill allocated.
        let short_rows = self.quant_gemv_tokens.min(self.chunk);
        let (h, im) = (cfg.hidden_size, cfg.intermediate_size);
        let cols = h.max(cfg.q_dim()).max(im);
        let outgrown = self.short.as_ref().is_none_or(|s| {
            let (rows, room) = s.rows.room();
            rows < short_rows || room < cols || s.zeros.len() < 2 * im
        });
        if scratch > 0 && short_rows > 0 && outgrown {
            self.short = None;
            self.short = Some(ShortChunk {
                rows: QuantRows::new(&self.dev, short_rows, cols)?,
                gate_up: self.dev.zeros(short_rows * 2 * im)?,
                zeros: self.dev.zeros(2 * im)?,
            });
        }
        let ModelView {
            embed,
            rope_cos,
            rope_sin,
            zeros,
            mut layers,
            x: x_out,
            state,
            max_seq_len,
        } = m;
        let dev = &self.dev;
        let plan = &self.plan;
        let (h, im, qd) = (
            cfg.hidden_size as i32,
            cfg.intermediate_size as i32,
            cfg.q_dim() as i32,
        );
        let qkv_dim = (cfg.q_dim() + 2 * cfg.kv_dim()) as i32;
        let (nh, nkv) = (cfg.num_heads as i32, cfg.num_kv_heads as i32);
        let eps = cfg.rms_norm_eps as f32;
        let scale = (cfg.head_dim as f32).powf(-0.5);
        let max_seq = max_seq_len as i32;
        let gemm_grid = |c: &TileChoice, t: usize, n: i32| -> [u32; 3] {
            [
                t.div_ceil(c.rows() as usize) as u32,
                (n as usize).div_ceil(c.cols() as usize) as u32,
                1,
            ]
        };
        let mut ids = vec![0i32; self.chunk];
        let mut last = (0, 0);
        for (ci, chunk) in tokens.chunks(self.chunk).enumerate() {
            let p0 = (start + ci * self.chunk) as i32;
            let t = chunk.len();
            let ti = t as i32;
            // Quantized matrices of a short chunk take the multi-token GEMVs.
            let mut short = match &mut self.short {
                Some(s) if t <= self.quant_gemv_tokens => Some(s),
                _ => None,
            };
            let attn = if t >= LONG_CHUNK {
                &plan.attention
            } else {
                &plan.attention_short
            };
            for (slot, &tok) in ids.iter_mut().zip(chunk) {
                *slot = tok as i32;
            }
            self.ids.copy_from_host(&ids)?;
            launch(
                dev,
                &PREFILL_EMBED,
                [t as u32, (h as u32).div_ceil(1024), 1],
                &[1024],
                4,
                &mut [
                    embed.into(),
                    (&self.ids).into(),
                    (&mut self.x).into(),
                    0i32.into(),
                    h.into(),
                ],
            )?;
            for l in layers.iter_mut() {
                rms_norm(dev, &self.x, l.input_norm, &mut self.xn, t, h, eps)?;
                if let (Some(q), Some(s)) = (l.qkv_w.quantized(), short.as_deref_mut()) {
                    s.rows.quantize(dev, &self.xn, t, h as usize)?;
                    q.gemv_tokens(
                        dev,
                        &s.rows,
                        l.qkv_b,
                        &mut self.qkv,
                        qkv_dim as usize,
                        false,
                    )?;
                } else {
                    let qkv_w = l.qkv_w.rows(dev, &mut self.dequantized)?;
                    gemm(
                        dev,
                        &plan.qkv,
                        (self.sms, &mut self.partials, &mut self.counters),
                        [
                            (&self.xn).into(),
                            qkv_w.into(),
                            l.qkv_b.into(),
                            (&mut self.qkv).into(),
                        ],
                        (ti, qkv_dim, h),
                        0,
                    )?;
                }
                launch(
                    dev,
                    &PREFILL_QK_ROPE,
                    [t.div_ceil(ROPE_ROWS as usize) as u32, (nh + nkv) as u32, 1],
                    &[cfg.head_dim as i64, ROPE_ROWS],
                    4,
                    &mut [
                        (&self.qkv).into(),
                        l.q_norm.into(),
                        l.k_norm.into(),
                        rope_cos.into(),
                        rope_sin.into(),
                        (&mut self.q).into(),
                        (&mut *l.k_cache).into(),
                        (&mut *l.v_cache).into(),
                        ti.into(),
                        p0.into(),
                        nh.into(),
                        nkv.into(),
                        max_seq.into(),
                        i32::from(cfg.qk_norm).into(),
                        eps.into(),
                    ],
                )?;
                launch(
                    dev,
                    &PREFILL_ATTENTION,
                    [nh as u32, t.div_ceil(attn.consts[1] as usize) as u32, 1],
                    &attn.consts,
                    attn.num_warps,
                    &mut [
                        (&self.q).into(),
                        (&*l.k_cache).into(),
                        (&*l.v_cache).into(),
                        (&mut self.attn).into(),
                        ti.into(),
                        p0.into(),
                        (nh / nkv).into(),
                        max_seq.into(),
                        scale.into(),
                    ],
                )?;
                if let (Some(q), Some(s)) = (l.o_w.quantized(), short.as_deref_mut()) {
                    s.rows.quantize(dev, &self.attn, t, qd as usize)?;
                    q.gemv_tokens(dev, &s.rows, l.o_b, &mut self.x, h as usize, true)?;
                } else {
                    let o_w = l.o_w.rows(dev, &mut self.dequantized)?;
                    gemm(
                        dev,
                        &plan.o_proj,
                        (self.sms, &mut self.partials, &mut self.counters),
                        [
                            (&self.attn).into(),
                            o_w.into(),
                            l.o_b.into(),
                            (&mut self.x).into(),
                        ],
                        (ti, h, qd),
                        1,
                    )?;
                }
                rms_norm(dev, &self.x, l.post_norm, &mut self.xn, t, h, eps)?;
                // The MLP takes the multi-token GEMVs only with both matrices quantized:
                // the down projection's quantizer computes the SiLU product itself.
                let mlp = (l.gate_up_w.quantized(), l.down_w.quantized());
                if let (Some(gu), Some(down), Some(s)) = (mlp.0, mlp.1, short.as_deref_mut()) {
                    let im = im as usize;
                    s.rows.quantize(dev, &self.xn, t, h as usize)?;
                    gu.gemv_tokens(dev, &s.rows, &s.zeros, &mut s.gate_up, 2 * im, false)?;
                    s.rows.quantize_silu_mul(dev, &s.gate_up, t, im)?;
                    down.gemv_tokens(dev, &s.rows, zeros, &mut self.x, h as usize, true)?;
                } else {
                    let gate_up_w = l.gate_up_w.rows(dev, &mut self.dequantized)?;
                    launch_staged(
                        dev,
                        &PREFILL_GATE_UP,
                        gemm_grid(&plan.gate_up, t, im),
                        &plan.gate_up.consts,
                        (plan.gate_up.num_warps, plan.gate_up.num_stages),
                        &mut [
                            (&self.xn).into(),
                            gate_up_w.into(),
                            (&mut self.act).into(),
                            ti.into(),
                            im.into(),
                            h.into(),
                        ],
                    )?;
                    let down_w = l.down_w.rows(dev, &mut self.dequantized)?;
                    gemm(
                        dev,
                        &plan.down,
                        (self.sms, &mut self.partials, &mut self.counters),
                        [
                            (&self.act).into(),
                            down_w.into(),
                            zeros.into(),
                            (&mut self.x).into(),
                        ],
                        (ti, h, im),
                        1,
                    )?;
                }
            }
            last = (ti - 1, p0 + ti - 1);
        }
        launch(
            dev,
            &PREFILL_LAST_ROW,
            1,
            &[1024],
            4,
            &mut [
                (&self.x).into(),
                (&self.ids).into(),
                x_out.into(),
                state.into(),
                last.0.into(),
                0i32.into(),
                last.1.into(),
                h.into(),
            ],
        )?;
        Ok(())
    }
}

/// One `prefill_gemm` launch of choice `c`: `x = [x +] bf16(a · w^T + bias)` with
/// `[a, w, bias, x]` and `(t, n, k)`, through `prefill_gemm_split` when the choice
/// splits K and the chunk's tiles leave SMs for the slices (`split`: the SM count and
/// the workspace, sized by [`Prefiller::set_plan`]).
fn gemm<'a>(
    dev: &Device,
    c: &TileChoice,
    split: (usize, &'a mut Buffer<f32>, &'a mut Buffer<i32>),
    [a, w, bias, x]: [KernelArg<'a>; 4],
    (t, n, k): (i32, i32, i32),
    accumulate: i32,
) -> Result<()> {
    let (sms, partials, counters) = split;
    let grid = [
        (t as usize).div_ceil(c.rows() as usize) as u32,
        (n as usize).div_ceil(c.cols() as usize) as u32,
    ];
    let (slices, k_slice) = c.slices(t as usize, n as usize, k as usize, sms);
    if slices <= 1 {
        let mut args = [
            a,
            w,
            bias,
            x,
            t.into(),
            n.into(),
            k.into(),
            accumulate.into(),
        ];
        return launch_staged(
            dev,
            &PREFILL_GEMM,
            [grid[0], grid[1], 1],
            &c.consts,
            (c.num_warps, c.num_stages),
            &mut args,
        );
    }
    let tiles = (grid[0] * grid[1]) as usize;
    if slices * (t * n) as usize > partials.len() || tiles > counters.len() {
        return Err(EngineError::Option {
            message: format!(
                "prefill split-K {t}x{n}x{k} in {slices} slices: the workspace holds {} \
                 partials and {} counters (set the plan with Prefiller::set_plan)",
                partials.len(),
                counters.len()
            ),
        });
    }
    let mut args = [
        a,
        w,
        bias,
        x,
        partials.into(),
        counters.into(),
        t.into(),
        n.into(),
        k.into(),
        (k_slice as i32).into(),
        accumulate.into(),
    ];
    let grid = [grid[0], grid[1], slices as u32];
    launch(
        dev,
        &PREFILL_GEMM_SPLIT,
        grid,
        &c.consts,
        c.num_warps,
        &mut args,
    )
}

/// Launches `def`'s compiled variant for `consts` / `num_warps` over `grid`.
/// [`PREFILL_RMSNORM`] of the chunk's `t` rows of `h` values into `xn`.
fn rms_norm(
    dev: &Device,
    x: &Buffer<bf16>,
    weight: &Buffer<bf16>,
    xn: &mut Buffer<bf16>,
    t: usize,
    h: i32,
    eps: f32,
) -> Result<()> {
    launch(
        dev,
        &PREFILL_RMSNORM,
        [t as u32, 1, 1],
        &[NORM_BLOCK],
        4,
        &mut [x.into(), weight.into(), xn.into(), h.into(), eps.into()],
    )
}

fn launch(
    dev: &Device,
    def: &KernelDef,
    grid: impl Into<LaunchConfig>,
    consts: &[i64],
    num_warps: u32,
    args: &mut [KernelArg<'_>],
) -> Result<()> {
    launch_staged(dev, def, grid, consts, (num_warps, None), args)
}

/// [`launch`] of the variant compiled `num_stages` deep (`None`: the kernel's first).
fn launch_staged(
    dev: &Device,
    def: &KernelDef,
    grid: impl Into<LaunchConfig>,
    consts: &[i64],
    (num_warps, num_stages): (u32, Option<u32>),
    args: &mut [KernelArg<'_>],
) -> Result<()> {
    let mut cfg = grid.into().num_warps(num_warps);
    cfg.num_stages = num_stages;
    def.launch_dyn(dev, cfg, consts, args)?;
    Ok(())
}

/// A timed batched prefill ([`time_prefill`]).
#[derive(Clone, Debug)]
pub struct PrefillTiming {
    /// Prompt tokens.
    pub prompt: usize,
    /// Tokens per chunk.
    pub chunk: usize,
    /// Kernel launches of one prefill (with the LM head and argmax).
    pub launches: usize,
    /// Wall-clock milliseconds of each timed run, from the first launch to the greedy
    /// next token read on the host: the time to first token.
    pub runs_ms: Vec<f64>,
}

impl PrefillTiming {
    /// The median run in milliseconds.
    pub fn median_ms(&self) -> f64 {
        let mut v = self.runs_ms.clone();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    }

    /// Prompt tokens per second of the median run.
    pub fn tokens_per_s(&self) -> f64 {
        self.prompt as f64 / (self.median_ms() / 1e3)
    }
}

impl std::fmt::Display for PrefillTiming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut sorted = self.runs_ms.clone();
        sorted.sort_by(f64::total_cmp);
        write!(
            f,
            "prefill           {} tokens in chunks of {} ({} launches): time to first token \
             {:.2} ms (median of {}, min {:.2}, max {:.2}), {:.0} tokens/s",
            self.prompt,
            self.chunk,
            self.launches,
            self.median_ms(),
            sorted.len(),
            sorted.first().copied().unwrap_or(0.0),
            sorted.last().copied().unwrap_or(0.0),
            self.tokens_per_s()
        )
    }
}

/// Times `reps` batched prefills of `prompt` on `dec` (after one untimed run, which
/// loads the kernels): each from the first launch until the greedy next token is on
/// the host, so it is the time to first token of a generation whose decode graph is
/// already captured.
pub fn time_prefill(
    dec: &mut crate::decode::Decoder,
    prompt: &[u32],
    reps: usize,
) -> Result<PrefillTiming> {
    dec.prefill(prompt)?;
    dec.synchronize()?;
    let mut runs_ms = Vec::with_capacity(reps.max(1));
    for _ in 0..reps.max(1) {
        let t0 = std::time::Instant::now();
        dec.prefill(prompt)?;
        dec.read_state()?;
        runs_ms.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    let dequant = dec.prefill_dequant_launches();
    let p = dec.prefiller()?;
    Ok(PrefillTiming {
        prompt: prompt.len(),
        chunk: p.chunk(),
        launches: p.launches_for(prompt.len()) + prompt.len().div_ceil(p.chunk()) * dequant + 2,
        runs_ms,
    })
}

/// The longest chunk that takes the multi-token GEMVs: the environment's
/// `TILEFUSE_QUANT_PREFILL_TOKENS` if set (0: never), else [`QUANT_GEMV_TOKENS`].
fn quant_gemv_tokens_from_env() -> Result<usize> {
    match std::env::var("TILEFUSE_QUANT_PREFILL_TOKENS") {
        Err(_) => Ok(QUANT_GEMV_TOKENS),
        Ok(v) => v.trim().parse().map_err(|_| EngineError::Option {
            message: format!("TILEFUSE_QUANT_PREFILL_TOKENS={v:?}: expected a number of tokens"),
        }),
    }
}
