//! The library entry point: load a model onto a device and generate.
//!
//! ```no_run
//! use tilefuse_engine::{Engine, EngineOptions, GenerateOptions};
//!
//! let mut engine = Engine::load("path/to/Qwen3-0.6B", EngineOptions::default())?;
//! let prompt = engine.encode("The capital of France is")?;
//! let out = engine.generate(&prompt, &GenerateOptions::default(), |token| {
//!     println!("{token}");
//!     std::ops::ControlFlow::Continue(())
//! })?;
//! println!("{:.1} tokens/s", out.tokens_per_s());
//! # Ok::<(), tilefuse_engine::EngineError>(())
//! ```

use std::ops::ControlFlow;
use std::path::Path;
use std::time::{Duration, Instant};

use tilefuse_dsl::runtime::Device;

use crate::config::ModelConfig;
use crate::decode::tp::TpDecoder;
use crate::decode::Decoder;
use crate::error::{EngineError, Result};
use crate::model::{Checkpoint, ModelWeights};
use crate::sampling::{Sampler, Sampling};
use crate::tokenizer::Tokenizer;

/// How an [`Engine`] is set up.
#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// Where the model runs: `Device::cuda(n)` or `Device::cpu()` (the interpreter).
    pub device: Device,
    /// KV-cache capacity in positions; default: the model's
    /// `max_position_embeddings`, capped at 4096.
    pub max_seq_len: Option<usize>,
    /// Replay each decode step as one CUDA graph (GPU only). Default: on, unless the
    /// environment sets `TILEFUSE_CUDA_GRAPH=0`.
    pub cuda_graph: bool,
    /// Devices to split the model over (tensor parallelism, [`crate::decode::tp`]);
    /// default 1. With `N > 1`, rank `r` runs on `cuda:(k + r)` for `device` `cuda:k`
    /// (NCCL between them), or on the interpreter for a CPU `device`.
    pub tp: usize,
    /// Report checkpoint loading on stderr (a line rewritten in place) for checkpoints
    /// of 1 GiB or more; default off.
    pub progress: bool,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            device: Device::auto(),
            max_seq_len: None,
            cuda_graph: std::env::var("TILEFUSE_CUDA_GRAPH").map_or(true, |v| v != "0"),
            tp: 1,
            progress: false,
        }
    }
}

/// What [`Engine::generate`] does.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    /// Stop after this many new tokens.
    pub max_new_tokens: usize,
    /// Greedy (the default) or sampled.
    pub sampling: Sampling,
    /// Stop after an end-of-sequence token of the model's config.
    pub stop_at_eos: bool,
    /// Keep the logits each token was chosen from (one `vocab_size` row per token;
    /// costs a device-to-host copy per token).
    pub keep_logits: bool,
    /// Run the prompt through the layers in chunks ([`Decoder::prefill`]; the
    /// default) rather than one decode step per token (kept for bisecting).
    pub batched_prefill: bool,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_new_tokens: 64,
            sampling: Sampling::greedy(),
            stop_at_eos: true,
            keep_logits: false,
            batched_prefill: true,
        }
    }
}

/// The result of [`Engine::generate`].
#[derive(Clone, Debug)]
pub struct Generation {
    /// The prompt's token ids.
    pub prompt_ids: Vec<u32>,
    /// The generated token ids.
    pub tokens: Vec<u32>,
    /// `logits[i]`: the logits `tokens[i]` was chosen from (when kept).
    pub logits: Vec<Vec<f32>>,
    /// Time to run the prompt through the model (in batched chunks, or token by token).
    pub prompt_time: Duration,
    /// Time from the start of the prompt to the first generated token known on the
    /// host (the prompt, its last position's LM head and the token's read; after the
    /// one-time capture of the decode step's CUDA graph, which is not counted).
    pub first_token_time: Duration,
    /// Whether the prompt went through the batched prefill.
    pub batched_prefill: bool,
    /// Time from the first generated token to the last.
    pub decode_time: Duration,
    /// Decode steps run in `decode_time` (one per token after the first).
    pub decode_steps: usize,
    /// Whether steps replayed a CUDA graph.
    pub used_graph: bool,
    /// Whether generation ended on an end-of-sequence token.
    pub hit_eos: bool,
    /// Tokens drawn on the host: every sampled one when the settings are not drawn on
    /// the device, else those whose device draws all fell outside top-k/top-p.
    pub host_draws: usize,
}

impl Generation {
    /// Prompt throughput: prompt tokens per second of [`Generation::prompt_time`].
    pub fn prompt_tokens_per_s(&self) -> f64 {
        if self.prompt_time.is_zero() {
            0.0
        } else {
            self.prompt_ids.len() as f64 / self.prompt_time.as_secs_f64()
        }
    }

    /// Decode throughput: steps per second after the prompt (0 when none ran).
    pub fn tokens_per_s(&self) -> f64 {
        if self.decode_steps == 0 || self.decode_time.is_zero() {
            0.0
        } else {
            self.decode_steps as f64 / self.decode_time.as_secs_f64()
        }
    }

    /// Milliseconds per decode step.
    pub fn ms_per_token(&self) -> f64 {
        if self.decode_steps == 0 {
            0.0
        } else {
            self.decode_time.as_secs_f64() * 1e3 / self.decode_steps as f64
        }
    }
}

/// The KV-cache capacity `opts` gives a model with config `cfg`.
fn kv_positions(cfg: &ModelConfig, opts: &EngineOptions) -> usize {
    opts.max_seq_len
        .unwrap_or(cfg.max_position_embeddings.min(4096))
}

/// Checks, before anything is allocated, that the model fits `opts.device`
/// ([`crate::memory`]) and that `opts.tp` splits it ([`crate::tp`]). `label` names
/// the model in errors.
pub fn check_placement(label: &str, cfg: &ModelConfig, opts: &EngineOptions) -> Result<()> {
    let positions = kv_positions(cfg, opts);
    if opts.tp != 1 {
        let plan = crate::tp::TpPlan::new(cfg, opts.tp)?;
        for (r, dev) in split_devices(&opts.device, opts.tp)?.iter().enumerate() {
            let need = crate::memory::MemoryNeed::for_rank(cfg, &plan, r, positions);
            crate::memory::check_fits(dev, label, cfg, &need)?;
        }
        return Ok(());
    }
    let need = crate::memory::MemoryNeed::for_decoder(cfg, positions);
    crate::memory::check_fits(&opts.device, label, cfg, &need)
}

/// The devices of a split over `tp` ranks starting at `first`: consecutive GPUs, or
/// interpreter ranks.
pub fn split_devices(first: &Device, tp: usize) -> Result<Vec<Device>> {
    match first.as_cuda() {
        Some(cuda) => (0..tp)
            .map(|r| Ok(Device::cuda(cuda.ordinal() + r)?))
            .collect(),
        None => Ok(vec![first.clone(); tp]),
    }
}

/// The decoder of an [`Engine`]: one device, or split over several.
#[derive(Debug)]
// One value an engine: the size difference of the variants costs nothing.
#[allow(clippy::large_enum_variant)]
enum Model {
    One(Decoder),
    Split(TpDecoder),
}

/// A model on a device, with its tokenizer when the checkpoint has one.
#[derive(Debug)]
pub struct Engine {
    model: Model,
    tokenizer: Option<Tokenizer>,
    cuda_graph: bool,
}

impl Engine {
    /// Loads a Hugging Face model directory (`config.json`, safetensors weights,
    /// optional `generation_config.json` and `tokenizer.json`) onto `opts.device`.
    ///
    /// A path to a `.gguf` file loads that file instead ([`Engine::load_gguf`]).
    pub fn load(dir: impl AsRef<Path>, opts: EngineOptions) -> Result<Engine> {
        let dir = dir.as_ref();
        if dir.is_file() && crate::gguf::tokenizer::is_gguf_path(dir) {
            return Engine::load_gguf(dir, opts);
        }
        let ckpt = Checkpoint::open(dir)?;
        let label = dir.display().to_string();
        check_placement(&label, &ckpt.config, &opts)?;
        // Small checkpoints load too fast for a progress line to help.
        if opts.progress && ckpt.weights.total_bytes() >= 1 << 30 {
            ckpt.weights
                .prefetch(crate::weights::stderr_progress("loading weights"));
        }
        let weights = ckpt.model_weights()?;
        let tokenizer = if dir.join("tokenizer.json").is_file() {
            Some(Tokenizer::from_dir(dir)?)
        } else {
            None
        };
        let mut engine = Engine::place(&ckpt.config, &weights, opts)?;
        engine.tokenizer = tokenizer;
        Ok(engine)
    }

    /// Loads a GGUF file (Qwen3, Qwen2 or Llama; F32/F16/BF16/Q8_0/Q4_K/Q6_K tensors,
    /// and Q4_0/Q5_0/IQ4_NL read as Q8_0):
    /// config and tokenizer from its metadata (or a `tokenizer.json` beside it). The
    /// matrices stored quantized are read quantized by the decode step
    /// ([`Decoder::with_quant`]); the rest, and the embedding table, are dequantized
    /// to bf16.
    pub fn load_gguf(path: impl AsRef<Path>, opts: EngineOptions) -> Result<Engine> {
        Engine::load_gguf_as(path, opts, true)
    }

    /// [`Engine::load_gguf`], with `quantized = false` dequantizing every matrix to
    /// bf16 for the dense kernels (the same function, for comparisons).
    pub fn load_gguf_as(
        path: impl AsRef<Path>,
        opts: EngineOptions,
        quantized: bool,
    ) -> Result<Engine> {
        let path = path.as_ref();
        let file = crate::gguf::GgufFile::open(path)?;
        let cfg = file.config()?;
        if opts.tp != 1 && quantized {
            return Err(EngineError::Option {
                message: format!(
                    "{}: a split model (tp {}) reads bf16 weights only; run a quantized \
                     GGUF file on one device",
                    path.display(),
                    opts.tp
                ),
            });
        }
        let quant = if quantized {
            file.quant_weights(&cfg)?
        } else {
            crate::decode::QuantWeights::default()
        };
        if quantized {
            // Counted at the quantized sizes, before anything else is read.
            let need = crate::memory::MemoryNeed::for_quant_decoder(
                &cfg,
                &quant,
                kv_positions(&cfg, &opts),
            );
            crate::memory::check_fits(&opts.device, "the model", &cfg, &need)?;
        } else {
            check_placement("the model", &cfg, &opts)?;
        }
        // The matrices read quantized are not dequantized on the host.
        let weights = file.model_weights_for(&cfg, &quant)?;
        let tokenizer = file.tokenizer()?;
        if opts.tp != 1 {
            let mut engine = Engine::place(&cfg, &weights, opts)?;
            engine.tokenizer = tokenizer;
            return Ok(engine);
        }
        let decoder = Decoder::with_quant(
            &cfg,
            &weights,
            &quant,
            &opts.device,
            kv_positions(&cfg, &opts),
        )?;
        Ok(Engine {
            model: Model::One(decoder),
            tokenizer,
            cuda_graph: opts.cuda_graph && opts.device.is_cuda(),
        })
    }

    /// A built-in preset (see [`crate::preset`]; a name or a `config.json` path) with
    /// seeded random weights. A model that does not fit the device fails before its
    /// weights are generated.
    pub fn from_preset(name: &str, seed: u64, opts: EngineOptions) -> Result<Engine> {
        let cfg = crate::preset::config(name)?;
        check_placement(name, &cfg, &opts)?;
        if opts.tp != 1 {
            // Each rank draws its shard on its own device.
            let devices = split_devices(&opts.device, opts.tp)?;
            let split = TpDecoder::from_preset(&cfg, seed, &devices, kv_positions(&cfg, &opts))?;
            return Ok(Engine {
                model: Model::Split(split),
                tokenizer: None,
                cuda_graph: opts.cuda_graph && opts.device.is_cuda(),
            });
        }
        let weights = crate::preset::random_weights(&cfg, seed);
        Engine::place(&cfg, &weights, opts)
    }

    /// An engine over weights already in host memory.
    pub fn from_weights(
        cfg: &ModelConfig,
        weights: &ModelWeights<'_>,
        opts: EngineOptions,
    ) -> Result<Engine> {
        check_placement("the model", cfg, &opts)?;
        Engine::place(cfg, weights, opts)
    }

    /// Uploads checked weights.
    fn place(cfg: &ModelConfig, weights: &ModelWeights<'_>, opts: EngineOptions) -> Result<Engine> {
        let positions = kv_positions(cfg, &opts);
        let model = if opts.tp != 1 {
            let devices = split_devices(&opts.device, opts.tp)?;
            Model::Split(TpDecoder::new(cfg, weights, &devices, positions)?)
        } else {
            Model::One(Decoder::new(cfg, weights, &opts.device, positions)?)
        };
        Ok(Engine {
            model,
            tokenizer: None,
            cuda_graph: opts.cuda_graph && opts.device.is_cuda(),
        })
    }

    /// The model's config.
    pub fn config(&self) -> &ModelConfig {
        match &self.model {
            Model::One(d) => d.config(),
            Model::Split(s) => s.config(),
        }
    }

    /// The tokenizer, if the model directory had one.
    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.tokenizer.as_ref()
    }

    /// The decoder, for step-level control (benchmarks, tools); `None` when the model
    /// is split over several devices ([`Engine::split_decoder`]).
    pub fn decoder(&mut self) -> Option<&mut Decoder> {
        match &mut self.model {
            Model::One(d) => Some(d),
            Model::Split(_) => None,
        }
    }

    /// The split decoder, when [`EngineOptions::tp`] is more than 1.
    pub fn split_decoder(&mut self) -> Option<&mut TpDecoder> {
        match &mut self.model {
            Model::One(_) => None,
            Model::Split(s) => Some(s),
        }
    }

    /// The device of the model (rank 0's when split), by name.
    pub fn device_name(&self) -> String {
        match &self.model {
            Model::One(d) => d.device().name(),
            Model::Split(s) => (0..s.size())
                .map(|r| s.rank(r).device().name())
                .collect::<Vec<_>>()
                .join(" + "),
        }
    }

    /// Encodes `text` with the model's tokenizer (special tokens added as the tokenizer
    /// specifies); an error when the model has no tokenizer.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        match &self.tokenizer {
            Some(t) => t.encode(text, true),
            None => Err(EngineError::Option {
                message: "this model has no tokenizer.json: give token ids instead of text".into(),
            }),
        }
    }

    /// Runs `prompt` through the model, then generates up to `opts.max_new_tokens`
    /// tokens, calling `on_token` with each as soon as it is known (return
    /// `ControlFlow::Break(())` to stop early). The KV cache starts empty each call.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        opts: &GenerateOptions,
        mut on_token: impl FnMut(u32) -> ControlFlow<()>,
    ) -> Result<Generation> {
        opts.sampling.validate()?;
        let cuda_graph = self.cuda_graph;
        let dec = match &mut self.model {
            Model::One(d) => d,
            Model::Split(s) => return generate_split(s, cuda_graph, prompt, opts, on_token),
        };
        let cfg = dec.config();
        let vocab = cfg.vocab_size;
        let eos = cfg.eos_token_ids.clone();
        if prompt.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= vocab) {
            return Err(EngineError::TokenOutOfRange { token: bad, vocab });
        }
        let max = dec.max_seq_len();
        // The last generated token is never fed back, so it needs no cache slot.
        if prompt.len() + opts.max_new_tokens.saturating_sub(1) > max {
            return Err(EngineError::TooLong {
                prompt: prompt.len(),
                new: opts.max_new_tokens,
                max,
            });
        }
        let mut out = Generation {
            prompt_ids: prompt.to_vec(),
            tokens: Vec::new(),
            logits: Vec::new(),
            prompt_time: Duration::ZERO,
            first_token_time: Duration::ZERO,
            batched_prefill: opts.batched_prefill,
            decode_time: Duration::ZERO,
            decode_steps: 0,
            used_graph: false,
            hit_eos: false,
            host_draws: 0,
        };
        if opts.max_new_tokens == 0 {
            return Ok(out);
        }

        // The graph is captured before the prompt: its warm-up step overwrites the
        // logits and a cache position, both rewritten by the prompt.
        dec.set_input(prompt[0], 0)?;
        if cuda_graph && !dec.uses_graph() {
            dec.capture()?;
        }
        out.used_graph = dec.uses_graph();
        let t0 = Instant::now();
        if opts.batched_prefill {
            dec.prefill(prompt)?;
        } else {
            for (pos, &token) in prompt.iter().enumerate() {
                dec.set_input(token, pos)?;
                dec.step()?;
            }
        }
        dec.synchronize()?;
        out.prompt_time = t0.elapsed();

        let mut sampler = Sampler::new(opts.sampling.clone());
        let greedy = opts.sampling.is_greedy();
        // Greedy decoding without logits needs nothing from the host between steps (the
        // device feeds each token to the next step), so the next step is queued before
        // this one's token is read: the GPU does not idle while the host takes it. A
        // step queued past a stop is wasted, never wrong (it only writes the cache
        // position after the last token).
        //
        // Sampling draws on the device when it can (temperature, then top-k or top-p):
        // the host reads 8 bytes a token and draws itself only when the device's draws
        // all fall outside top-k/top-p (rare; the two together are still exact). The
        // next step is queued behind the draw too; when the host must draw, that step
        // decoded the greedy token instead, so the step that produced the logits and the
        // next one are run again (each rewrites only its own cache position).
        let device_sampling = !greedy && opts.sampling.device_can_sample(vocab);
        let pipelined = (greedy || device_sampling) && !opts.keep_logits;
        let t1 = Instant::now();
        let mut pos = prompt.len();
        // The input of the step whose logits are being drawn from.
        let mut input = prompt[prompt.len() - 1];
        // Whether the last token was drawn on the host: then the next step is not queued
        // ahead of the draw (where draws keep falling outside top-k/top-p, as over flat
        // logits, speculating would run every step three times). After a batched
        // prefill the first draw is not speculated either: a host fallback would then
        // redo the prompt's last position through the decode step, whose rounding
        // differs from the prefill's, and the same seed could draw other tokens.
        let mut fell_back = opts.batched_prefill;
        loop {
            let last = out.tokens.len() + 1 == opts.max_new_tokens;
            let mut host_draw = !greedy;
            let mut token = 0;
            // Whether the next step is already queued, with the right input.
            let mut queued_next = false;
            if pipelined && device_sampling {
                dec.queue_device_sample(&opts.sampling)?;
                let speculate = !last && !fell_back;
                if speculate {
                    dec.step()?;
                }
                let (t, on_host) =
                    finish_device_sample(dec, &mut sampler, input, pos, speculate, !last)?;
                token = t;
                host_draw = false;
                out.host_draws += usize::from(on_host);
                fell_back = on_host;
                queued_next = true;
            } else if pipelined {
                // The device has written the greedy token and the next position.
                dec.queue_state_read()?;
                if !last {
                    dec.step()?;
                }
                let (t, next_pos) = dec.take_state()?;
                debug_assert_eq!(next_pos, pos);
                token = t;
                queued_next = true;
            } else if device_sampling {
                if let Some(t) = dec.sample_on_device(&opts.sampling)? {
                    token = t;
                    host_draw = false;
                }
            } else {
                let (t, next_pos) = dec.read_state()?;
                debug_assert_eq!(next_pos, pos);
                token = t;
            }
            if opts.keep_logits || host_draw {
                let logits = dec.logits()?;
                if host_draw {
                    token = sampler.sample(logits);
                    out.host_draws += 1;
                }
                if opts.keep_logits {
                    out.logits.push(logits.to_vec());
                }
            }
            if out.tokens.is_empty() {
                out.first_token_time = t0.elapsed();
            }
            out.tokens.push(token);
            let stop = on_token(token).is_break();
            if opts.stop_at_eos && eos.contains(&token) {
                out.hit_eos = true;
                break;
            }
            if stop || last {
                break;
            }
            if !queued_next {
                if host_draw {
                    // The state holds the greedy token; overwrite it with the sample
                    // (a draw accepted on the device is already there).
                    dec.set_input(token, pos)?;
                }
                dec.step()?;
            }
            input = token;
            pos += 1;
        }
        out.decode_time = t1.elapsed();
        // Steps whose tokens were taken (a pipelined step queued past a stop is not).
        out.decode_steps = out.tokens.len().saturating_sub(1);
        Ok(out)
    }
}

/// [`Engine::generate`] over a split model: the prompt one step per token (the
/// batched prefill is one-device only), then greedy steps queued ahead of each
/// token's read, or sampling on the host from the gathered logits.
fn generate_split(
    dec: &mut TpDecoder,
    cuda_graph: bool,
    prompt: &[u32],
    opts: &GenerateOptions,
    mut on_token: impl FnMut(u32) -> ControlFlow<()>,
) -> Result<Generation> {
    let vocab = dec.config().vocab_size;
    let eos = dec.config().eos_token_ids.clone();
    if prompt.is_empty() {
        return Err(EngineError::EmptyPrompt);
    }
    if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= vocab) {
        return Err(EngineError::TokenOutOfRange { token: bad, vocab });
    }
    let max = dec.max_seq_len();
    if prompt.len() + opts.max_new_tokens.saturating_sub(1) > max {
        return Err(EngineError::TooLong {
            prompt: prompt.len(),
            new: opts.max_new_tokens,
            max,
        });
    }
    let mut out = Generation {
        prompt_ids: prompt.to_vec(),
        tokens: Vec::new(),
        logits: Vec::new(),
        prompt_time: Duration::ZERO,
        first_token_time: Duration::ZERO,
        batched_prefill: false,
        decode_time: Duration::ZERO,
        decode_steps: 0,
        used_graph: false,
        hit_eos: false,
        host_draws: 0,
    };
    if opts.max_new_tokens == 0 {
        return Ok(out);
    }
    dec.set_input(prompt[0], 0)?;
    if cuda_graph && !dec.uses_graph() {
        dec.capture()?;
    }
    out.used_graph = dec.uses_graph();
    let t0 = Instant::now();
    for (pos, &token) in prompt.iter().enumerate() {
        dec.set_input(token, pos)?;
        dec.step()?;
    }
    dec.synchronize()?;
    out.prompt_time = t0.elapsed();
    let mut sampler = Sampler::new(opts.sampling.clone());
    let greedy = opts.sampling.is_greedy();
    let pipelined = greedy && !opts.keep_logits;
    let t1 = Instant::now();
    let mut pos = prompt.len();
    loop {
        let last = out.tokens.len() + 1 == opts.max_new_tokens;
        let token = if pipelined {
            dec.queue_state_read()?;
            if !last {
                dec.step()?;
            }
            dec.take_state()?.0
        } else {
            let (greedy_token, _) = dec.read_state()?;
            let logits = dec.read_logits()?;
            let token = if greedy {
                greedy_token
            } else {
                out.host_draws += 1;
                sampler.sample(&logits)
            };
            if opts.keep_logits {
                out.logits.push(logits);
            }
            token
        };
        if out.tokens.is_empty() {
            out.first_token_time = t0.elapsed();
        }
        out.tokens.push(token);
        let stop = on_token(token).is_break();
        if opts.stop_at_eos && eos.contains(&token) {
            out.hit_eos = true;
            break;
        }
        if stop || last {
            break;
        }
        if !pipelined {
            dec.set_input(token, pos)?;
            dec.step()?;
        }
        pos += 1;
    }
    out.decode_time = t1.elapsed();
    out.decode_steps = out.tokens.len().saturating_sub(1);
    Ok(out)
}

/// Finishes a draw queued with [`Decoder::queue_device_sample`] behind the step that
/// decoded `input` at `pos - 1`, and leaves the step that decodes the drawn token at
/// `pos` queued when `queue_next`. `speculated`: that next step was already queued
/// behind the draw (it decodes the device's draw, or the greedy token when the host must
/// draw: then both steps run again, each rewriting only its own cache position).
/// Returns the token and whether the host drew it (from `sampler`, when every device
/// draw fell outside top-k/top-p).
pub(crate) fn finish_device_sample(
    dec: &mut Decoder,
    sampler: &mut Sampler,
    input: u32,
    pos: usize,
    speculated: bool,
    queue_next: bool,
) -> Result<(u32, bool)> {
    if let Some(token) = dec.take_device_sample()? {
        // `state` holds the draw already.
        if queue_next && !speculated {
            dec.step()?;
        }
        return Ok((token, false));
    }
    if speculated {
        // The speculative step overwrote the logits: run this one again.
        dec.set_input(input, pos - 1)?;
        dec.step()?;
    }
    let token = sampler.sample(dec.logits()?);
    if queue_next {
        dec.set_input(token, pos)?;
        dec.step()?;
    }
    Ok((token, true))
}
