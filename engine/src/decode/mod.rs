//! The kernel-based decoder: model weights on a device, a preallocated KV cache, and
//! one decode step as a fixed sequence of kernel launches (see [`crate::kernels`]).
//!
//! - `step.rs`: one step, a layer as `qkv()`, `attention()`, `o_proj()`,
//!   `mlp()` (what [`crate::reference`] computes, as kernel launches);
//! - `matrix.rs`: a projection's weights, dense bf16 or quantized (GGUF), and the
//!   quantized launches ([`QuantWeights`] gives a decoder its quantized matrices);
//! - [`plan`]: which compiled variant each launch uses ([`LaunchPlan`]);
//! - [`profile`]: a step timed block by block, and per-program timelines;
//! - [`tp`]: the model split over several devices (tensor parallelism), one decoder a
//!   rank, with the kernels of [`tp_kernels`];
//! - `weights.rs`: the weights on the device in the kernels' layout, uploaded or
//!   filled by a rank;
//! - this file: the decoder's buffers, capture and readback.
//!
//! Everything a step reads that changes from token to token lives in device memory:
//! `state = [token, pos]` is read by the kernels, and the last kernel writes the greedy
//! next token and `pos + 1` back. The launch sequence is therefore the same at every
//! position, which is what lets [`Decoder::capture`] record it once as a CUDA graph and
//! replay it for every token. On the CPU device the same launches run on the interpreter.
//!
//! Prompts go through the layers in chunks ([`Decoder::prefill`], see
//! [`crate::prefill`]), which write the same KV cache and leave the same `state` and
//! logits as token-by-token steps would; [`Decoder::step`] also takes a prompt one token
//! at a time. What to do between steps (sampling, speculation) is
//! [`crate::Engine::generate`]'s.

mod matrix;
pub mod plan;
pub mod profile;
mod step;
pub mod tp;
pub mod tp_kernels;
mod weights;

use half::bf16;
use tilefuse_dsl::runtime::{Buffer, Device, Graph, Readback};

use crate::config::ModelConfig;
use crate::error::{EngineError, Result};
use crate::model::ModelWeights;
use crate::prefill::{LayerView, ModelView, Prefiller};
use crate::rope;
use crate::sampling::device::DeviceSampler;
use crate::sampling::Sampling;
use crate::tuning;

use matrix::Matrix;
pub(crate) use matrix::QuantMatrix;
pub use matrix::{QuantLayer, QuantWeights};
pub use plan::{Block, KernelChoice, LaunchPlan};
pub(crate) use profile::median;
pub use profile::{BlockTime, LaunchStamps, ProgramStamps, Timeline};
pub(crate) use weights::{check_quant, DeviceWeights, LayerBuffers};

/// One layer's weights in the kernels' layout, and its KV cache.
struct Layer {
    input_norm: Buffer<bf16>,
    /// `[q; k; v]` projection rows, `[q_dim + 2 kv_dim, hidden]`.
    qkv_w: Matrix,
    /// Their biases (zeros when the model has none).
    qkv_b: Buffer<bf16>,
    /// QK-norm weights, `[head_dim]` (ones, unused, when the model has none).
    q_norm: Buffer<bf16>,
    k_norm: Buffer<bf16>,
    o_w: Matrix,
    o_b: Buffer<bf16>,
    post_norm: Buffer<bf16>,
    /// `[gate; up]` projection rows, `[2 * intermediate, hidden]`.
    gate_up_w: Matrix,
    down_w: Matrix,
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
    /// `silu(gate) * up`, `[intermediate]`; a quantized gate/up writes `[gate; up]`
    /// (`2 * intermediate`), whose product a quantized down projection's activation
    /// quantizer computes (else `silu_mul_in_place` makes the first half the product).
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
    /// Stand-ins for the outputs a quantized launch does not write, and every layer
    /// kernel's timeline stamps (see [`Decoder::timeline`]).
    spare: crate::gguf::device::QuantSpare,
}

/// A model resident on a device, ready to decode.
pub struct Decoder {
    cfg: ModelConfig,
    dev: Device,
    plan: LaunchPlan,
    max_seq_len: usize,
    embed: Buffer<bf16>,
    /// `None` when the LM head is tied to the embedding (or quantized).
    lm_head: Option<Buffer<bf16>>,
    /// The LM head when the weights give it quantized (tied or not).
    quant_head: Option<QuantMatrix>,
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
    /// Device-side sampling's buffers and launches, made on first use (see
    /// `sample_on_device`).
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

impl Decoder {
    /// Uploads `w` to `dev` in the kernels' layout (fused QKV and gate/up rows) and
    /// allocates a KV cache for `max_seq_len` positions and every step buffer.
    pub fn new(
        cfg: &ModelConfig,
        w: &ModelWeights<'_>,
        dev: &Device,
        max_seq_len: usize,
    ) -> Result<Decoder> {
        Decoder::with_quant(cfg, w, &QuantWeights::default(), dev, max_seq_len)
    }

    /// As [`Decoder::new`], with the matrices `quant` gives read quantized (in place of
    /// `w`'s dense ones, which are then not uploaded): the step launches the quantized
    /// GEMVs for them ([`crate::kernels_quant`]). Quantized matrices must match the
    /// config's shapes; a fused projection is quantized only when all its parts are.
    pub fn with_quant(
        cfg: &ModelConfig,
        w: &ModelWeights<'_>,
        quant: &QuantWeights,
        dev: &Device,
        max_seq_len: usize,
    ) -> Result<Decoder> {
        w.validate_with(cfg, quant)?;
        check_quant(cfg, quant)?;
        let weights = DeviceWeights::upload(
            dev,
            &w.embed_tokens,
            w.lm_head.as_deref(),
            &w.norm,
            &w.layers,
            quant,
        )?;
        Decoder::from_device(cfg, weights, dev, max_seq_len)
    }

    /// A decoder over weights already on `dev` (shaped as `cfg` says; the embedding
    /// may have more rows than `cfg.vocab_size` when `cfg` is a tensor-parallel
    /// rank's, whose LM head is its vocabulary rows).
    pub(crate) fn from_device(
        cfg: &ModelConfig,
        weights: DeviceWeights,
        dev: &Device,
        max_seq_len: usize,
    ) -> Result<Decoder> {
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
        // Long enough for any projection's rows (a quantized gate/up writes `2 * im`).
        let zeros_len = qkv_dim.max(h).max(2 * im);
        let ones = vec![bf16::ONE; hd];

        let mut layers = Vec::with_capacity(cfg.num_layers);
        for lw in weights.layers {
            let ones_or = |b: Option<Buffer<bf16>>| -> Result<Buffer<bf16>> {
                Ok(match b {
                    Some(b) => b,
                    None => dev.upload(&ones)?,
                })
            };
            layers.push(Layer {
                input_norm: lw.input_norm,
                qkv_w: lw.qkv_w,
                qkv_b: match lw.qkv_b {
                    Some(b) => b,
                    None => dev.zeros(qkv_dim)?,
                },
                q_norm: ones_or(lw.q_norm)?,
                k_norm: ones_or(lw.k_norm)?,
                o_w: lw.o_w,
                o_b: match lw.o_b {
                    Some(b) => b,
                    None => dev.zeros(h)?,
                },
                post_norm: lw.post_norm,
                gate_up_w: lw.gate_up_w,
                down_w: lw.down_w,
                k_cache: dev.zeros(cfg.num_kv_heads * max_seq_len * hd)?,
                v_cache: dev.zeros(cfg.num_kv_heads * max_seq_len * hd)?,
            });
        }

        // RoPE tables, row `pos` as the reference rotates with.
        let (cos, sin) = rope::tables(cfg, max_seq_len);

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
            act: dev.zeros(2 * im)?,
            part_m: dev.zeros(cfg.num_heads * splits)?,
            part_l: dev.zeros(cfg.num_heads * splits)?,
            part_acc: dev.zeros(cfg.num_heads * splits * hd)?,
            logits: dev.zeros(v)?,
            // Room for one candidate per row: any LM-head variant fits (see `set_plan`).
            part_val: dev.zeros(v)?,
            part_idx: dev.zeros(v)?,
            zeros: dev.zeros(zeros_len)?,
            // A quantized GEMV's input: up to the widest of `h`, `q_dim`, `im`. Stamps
            // for any plan's layer: every grid at its most programs (a row a program;
            // a quantized `[gate; up]` has `2 im` rows), and the activation quantizers'.
            spare: crate::gguf::device::QuantSpare::with_stamp_room(
                dev,
                h.max(qd).max(im),
                qkv_dim
                    + cfg.num_heads * splits
                    + cfg.num_heads * hd.div_ceil(32)
                    + 2 * h
                    + 2 * im
                    + (2 * h + qd + im).div_ceil(256),
            )?,
        };
        Ok(Decoder {
            cfg: cfg.clone(),
            dev: dev.clone(),
            max_seq_len,
            embed: weights.embed,
            lm_head: weights.lm_head,
            quant_head: weights.quant_head,
            final_norm: weights.final_norm,
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

    /// Re-chooses the launch configuration of every quantized matrix: the one `tiles`
    /// names for its shape, else [`crate::gguf::device::QuantGemvConfig::for_step`]'s
    /// (for measuring configurations inside the step: `tilefuse bench --quant-tiles`).
    /// Drops a captured graph. Every configuration computes the same function; only
    /// the rounding order of sums may differ.
    pub fn set_quant_tiles(&mut self, tiles: &crate::gguf::device::QuantTiles) -> Result<()> {
        self.graph = None;
        for l in &mut self.layers {
            for m in [&mut l.qkv_w, &mut l.o_w, &mut l.gate_up_w, &mut l.down_w] {
                if let Matrix::Quant(q) = m {
                    q.set_tiles(tiles)?;
                }
            }
        }
        if let Some(q) = &mut self.quant_head {
            q.set_tiles(tiles)?;
        }
        Ok(())
    }

    /// Kernel launches per step.
    pub fn kernels_per_step(&self) -> usize {
        Block::ALL.iter().map(|&b| self.launches(b)).sum()
    }

    /// The grids of one layer's launches, in step order.
    fn layer_grids(&self) -> Vec<(Block, [u32; 3])> {
        self.plan.layer_grids(&self.cfg)
    }

    /// Launches of `block` per step: once per layer, or once for the step.
    fn launches(&self, block: Block) -> usize {
        match block {
            Block::Embed | Block::LmHead | Block::Argmax => 1,
            Block::Combine if self.plan.clustered() => 0,
            Block::Qkv => self.layers.iter().map(|l| l.qkv_w.launches(true)).sum(),
            // A combine that quantizes O's input leaves O its GEMVs only.
            Block::OProj => self
                .layers
                .iter()
                .map(|l| {
                    l.o_w.launches(false) - usize::from(step::combine_quantizes(&self.plan, &l.o_w))
                })
                .sum(),
            // A quantized gate/up before a dense down is followed by `silu_mul_in_place`
            // (before a quantized down, the SiLU product is down's quantizer's, or
            // gate/up's own epilogue: `Block::Down` counts it).
            Block::GateUp => self
                .layers
                .iter()
                .map(|l| {
                    let silu = l.gate_up_w.dense().is_none() && l.down_w.dense().is_some();
                    l.gate_up_w.launches(true) + usize::from(silu)
                })
                .sum(),
            // Without its quantizer when gate/up wrote its input.
            Block::Down => self
                .layers
                .iter()
                .map(|l| {
                    let written = l.gate_up_w.silu_quantizes() && l.down_w.dense().is_none();
                    l.down_w.launches(false) - usize::from(written)
                })
                .sum(),
            _ => self.cfg.num_layers,
        }
    }

    /// Whether the LM head is read quantized.
    pub fn has_quant_head(&self) -> bool {
        self.quant_head.is_some()
    }

    /// Whether any projection or the LM head is read quantized.
    pub fn is_quantized(&self) -> bool {
        self.quant_head.is_some()
            || self.layers.iter().any(|l| {
                [&l.qkv_w, &l.o_w, &l.gate_up_w, &l.down_w]
                    .iter()
                    .any(|m| m.dense().is_none())
            })
    }

    /// Bytes of weights one step reads (every matrix, norm and bias once; the embedding
    /// table only through its one row unless it is also the LM head).
    pub fn weight_bytes_per_step(&self) -> usize {
        let layer: usize = self
            .layers
            .iter()
            .map(|l| {
                l.qkv_w.bytes()
                    + l.o_w.bytes()
                    + l.gate_up_w.bytes()
                    + l.down_w.bytes()
                    + 2 * (l.input_norm.len()
                        + l.qkv_b.len()
                        + l.o_b.len()
                        + l.post_norm.len()
                        + if self.cfg.qk_norm {
                            2 * l.q_norm.len()
                        } else {
                            0
                        })
            })
            .sum();
        let head = match &self.quant_head {
            Some(q) => q.bytes(),
            None => 2 * self.lm_head.as_ref().unwrap_or(&self.embed).len(),
        };
        layer + head + 2 * (self.final_norm.len() + self.cfg.hidden_size)
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
    /// distribution exactly (rejection sampling, see [`crate::sampling::device`]).
    /// Draws are a function of `(seed, position)`. Errors for settings the device does
    /// not draw ([`Sampling::device_can_sample`]).
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
        if self.sampler.is_none() {
            self.sampler = Some(DeviceSampler::new(&self.dev, self.cfg.vocab_size)?);
        }
        let ds = self.sampler.as_mut().expect("made above");
        ds.queue(
            &self.dev,
            params,
            &self.s.logits,
            &mut self.s.state,
            self.graph.is_some(),
        )
    }

    /// The second half of [`Decoder::sample_on_device`]: waits for the outcome of the
    /// draw [`Decoder::queue_device_sample`] queued (not for later work).
    pub fn take_device_sample(&mut self) -> Result<Option<u32>> {
        match &self.sampler {
            Some(ds) => ds.take(),
            None => Err(EngineError::Option {
                message: "take_device_sample before queue_device_sample".into(),
            }),
        }
    }

    /// Waits for the device to finish all queued work.
    pub fn synchronize(&self) -> Result<()> {
        Ok(self.dev.synchronize()?)
    }

    /// The model's device buffers (weights per layer, KV cache, RoPE tables, the step's
    /// hidden state and `state`), lent to the batched prefill; quantized matrices are
    /// lent as they are and dequantized one at a time before their GEMMs
    /// ([`crate::prefill::PrefillWeight`]).
    pub fn prefill_view(&mut self) -> Result<ModelView<'_>> {
        Ok(ModelView {
            embed: &self.embed,
            rope_cos: &self.rope_cos,
            rope_sin: &self.rope_sin,
            zeros: &self.s.zeros,
            layers: self
                .layers
                .iter_mut()
                .map(|l| LayerView {
                    input_norm: &l.input_norm,
                    qkv_w: l.qkv_w.prefill_weight(),
                    qkv_b: &l.qkv_b,
                    q_norm: &l.q_norm,
                    k_norm: &l.k_norm,
                    o_w: l.o_w.prefill_weight(),
                    o_b: &l.o_b,
                    post_norm: &l.post_norm,
                    gate_up_w: l.gate_up_w.prefill_weight(),
                    down_w: l.down_w.prefill_weight(),
                    k_cache: &mut l.k_cache,
                    v_cache: &mut l.v_cache,
                })
                .collect(),
            x: &mut self.s.x,
            state: &mut self.s.state,
            max_seq_len: self.max_seq_len,
        })
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
        let ran = match self.prefill_view() {
            Ok(view) => p.run(view, tokens, start),
            Err(e) => Err(e),
        };
        self.prefiller = Some(p);
        ran?;
        self.step_blocks(|b| matches!(b, Block::LmHead | Block::Argmax))
    }

    /// Launches a prefill chunk adds to the prefill's own
    /// ([`crate::prefill::Prefiller::launches_for`]) for its quantized matrices: one a
    /// run of rows of one type of each, every layer (its dequantization before a GEMM;
    /// or, in a short chunk, where a quantizer and one multi-token GEMV a run replace
    /// the GEMM, the same count).
    pub fn prefill_dequant_launches(&self) -> usize {
        self.layers
            .iter()
            .flat_map(|l| [&l.qkv_w, &l.o_w, &l.gate_up_w, &l.down_w])
            .map(|m| m.prefill_weight().dequant_launches())
            .sum()
    }

    /// Decodes `token` at `pos` and returns the logits for the next token (a
    /// convenience for tests and tools; [`crate::Engine`] drives steps directly).
    pub fn forward(&mut self, token: u32, pos: usize) -> Result<Vec<f32>> {
        self.set_input(token, pos)?;
        self.step()?;
        self.read_logits()
    }
}
