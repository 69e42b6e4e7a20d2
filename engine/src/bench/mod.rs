//! Measurement: the decode benchmark behind `tilefuse bench` and the kernel workloads of
//! `examples/bandwidth.rs` and `benches/kernels.rs`.
//!
//! - this file, the runner ([`run`]): a preset with random weights, a KV cache filled to
//!   a given context, then timed greedy (and sampled) decode steps, graph and eager,
//!   against the bandwidth floor measured in the same run;
//! - [`sweep`](mod@sweep): every compiled variant of each launch timed inside the
//!   captured step;
//! - [`quant_tiles`]: quantized launch configurations and the LM head's format
//!   compared inside the captured step;
//! - [`report`]: the report and its text;
//! - [`workloads`]: single kernels at one shape, with buffers past the L2 cache;
//!   [`cublas`]: the cuBLAS baseline.
//!
//! Device facts and GPU timing are the runtime's ([`tilefuse_dsl::runtime::timing`]).

pub mod cublas;
pub mod quant;
pub mod quant_tiles;
pub mod report;
pub mod sweep;
pub mod tp;
pub mod workloads;

use std::time::Instant;

use tilefuse_dsl::runtime::timing::{self, TimingOptions};
use tilefuse_dsl::runtime::Device;

use crate::decode::{median, BlockTime, Decoder};
use crate::engine::finish_device_sample;
use crate::error::{EngineError, Result};
use crate::sampling::{Sampler, Sampling};

pub use cublas::Cublas;
pub use quant::WeightFormat;
pub use report::{TimelineReport, TimelineRow};
pub use sweep::{Sweep, SweepRow, SWEEP_MARGIN, SWEEP_PAIRS};
pub use workloads::{AttentionWorkload, GemvKind, GemvWorkload, PerfError, Rng};

/// What to measure.
#[derive(Clone, Debug)]
pub struct DecodeBenchOptions {
    /// Preset name (see [`crate::preset::PRESETS`]).
    pub preset: String,
    /// The weights' format: bf16, or random blocks of GGUF's quantized types read by
    /// the quantized GEMVs ([`WeightFormat`]).
    pub weights: WeightFormat,
    /// Tokens already in the KV cache when timing starts.
    pub context: usize,
    /// Decode steps timed per mode.
    pub tokens: usize,
    /// The device.
    pub device: Device,
    /// Seed of the random weights and prompt.
    pub seed: u64,
    /// Also time eager launches (always on when graphs are off).
    pub eager: bool,
    /// Time graph replays (GPU only).
    pub graph: bool,
    /// Time each block on its own (GPU only).
    pub profile: bool,
    /// Try every compiled variant of each launch in the whole graph (GPU only).
    pub sweep: bool,
    /// Also time sampled decoding ([`SAMPLED`], drawn on the device after each step),
    /// in the graph mode when graphs are on.
    pub sampled: bool,
    /// Stamp this layer's launches and report when their programs start, get past
    /// their wait and finish ([`Decoder::timeline`]).
    pub timeline: Option<usize>,
    /// Quantized variants to time inside the captured step against the default
    /// ([`quant_tiles::QuantTileSpec`]; GPU and graphs only).
    pub quant_tiles: Vec<String>,
}

/// The settings of the `sampled` mode: temperature 0.8, top-p 0.9.
pub const SAMPLED: Sampling = Sampling {
    temperature: 0.8,
    top_k: 0,
    top_p: 0.9,
    seed: 1,
};

/// One mode's figures.
#[derive(Clone, Debug)]
pub struct ModeResult {
    /// `"graph"`, `"eager"` or `"sampled"`.
    pub mode: &'static str,
    /// Median milliseconds per step, the token read back each step (as generation does).
    pub ms_per_token: f64,
    /// Steps per second over the whole timed run.
    pub tokens_per_s: f64,
    /// Median host microseconds per step spent issuing work (launch calls, the
    /// device's draw included when sampling), not waiting for the step.
    pub host_us_per_token: f64,
}

impl ModeResult {
    /// Steps per second at the median step time: the steady rate, which one stall in
    /// the run does not move.
    pub fn median_tokens_per_s(&self) -> f64 {
        1e3 / self.ms_per_token
    }

    /// Whether the run's rate is more than 5% below its median step's (a few steps
    /// were much slower, as when the host stalls).
    pub fn stalled(&self) -> bool {
        self.tokens_per_s < 0.95 * self.median_tokens_per_s()
    }
}

/// The benchmark's report.
#[derive(Clone, Debug)]
pub struct DecodeReport {
    /// Device name.
    pub device: String,
    /// Preset.
    pub preset: String,
    /// The weights' format.
    pub weights: WeightFormat,
    /// Context at the first timed step.
    pub context: usize,
    /// Steps timed.
    pub tokens: usize,
    /// Weight bytes read per step.
    pub weight_bytes: usize,
    /// KV bytes read per step, at the middle of the timed run.
    pub kv_bytes: usize,
    /// Device-to-device copy bandwidth (read + write bytes per second), if measured.
    pub copy_bytes_per_s: Option<f64>,
    /// Kernel launches per step.
    pub kernels_per_step: usize,
    /// Per mode.
    pub modes: Vec<ModeResult>,
    /// Per block, when profiled.
    pub blocks: Vec<BlockTime>,
    /// The variant sweep, when asked for.
    pub sweep: Option<Sweep>,
    /// The stamped layer's launches, when asked for ([`DecodeBenchOptions::timeline`]).
    pub timeline: Option<TimelineReport>,
    /// The quantized variants, when asked for ([`DecodeBenchOptions::quant_tiles`]).
    pub quant_tiles: Option<quant_tiles::QuantTileReport>,
}

impl DecodeReport {
    /// Milliseconds per step if it ran at the copy bandwidth.
    pub fn floor_ms(&self) -> Option<f64> {
        self.copy_bytes_per_s
            .map(|bw| (self.weight_bytes + self.kv_bytes) as f64 / bw * 1e3)
    }
}

/// Times `opts.tokens` greedy steps in the current mode of `dec`, starting at position
/// `context` (whose KV is already cached) with `token`.
fn time_mode(
    dec: &mut Decoder,
    mode: &'static str,
    token: u32,
    context: usize,
    tokens: usize,
) -> Result<ModeResult> {
    // Warm up (and leave the cache as it was: the same positions are rewritten).
    for i in 0..3.min(tokens) {
        dec.set_input(token, context + i)?;
        dec.step()?;
        dec.read_state()?;
    }
    dec.set_input(token, context)?;
    dec.synchronize()?;
    let mut step_ms = Vec::with_capacity(tokens);
    let mut host_us = Vec::with_capacity(tokens);
    // As greedy generation runs: each token is read back, the next step queued before
    // the read (see `Engine::generate`); a step's time is the gap between two tokens
    // reaching the host.
    let t0 = Instant::now();
    let mut arrived = t0;
    dec.step()?;
    for i in 0..tokens {
        dec.queue_state_read()?;
        let t = Instant::now();
        if i + 1 < tokens {
            dec.step()?;
        }
        host_us.push(t.elapsed().as_secs_f64() * 1e6);
        dec.take_state()?;
        let now = Instant::now();
        step_ms.push((now - arrived).as_secs_f64() * 1e3);
        arrived = now;
    }
    let total = t0.elapsed().as_secs_f64();
    Ok(ModeResult {
        mode,
        ms_per_token: median(step_ms),
        tokens_per_s: tokens as f64 / total,
        host_us_per_token: median(host_us),
    })
}

/// The device's copy ceiling (bytes a second, [`timing::copy_ceiling`] over 1 GiB),
/// measured at its first use in this process and kept: every report of the process
/// divides by the same ceiling, so a quantized run and its bf16 baseline share their
/// floor's denominator. Measured in each report, the ceiling of a process's second
/// report varied by up to 9% between processes on an H200 (3.84 against 4.21 TB/s
/// after an 8B bf16 run; docs/perf.md, "One copy ceiling a process").
fn process_copy_ceiling(dev: &Device) -> Result<f64> {
    static CEILINGS: std::sync::Mutex<Vec<(String, f64)>> = std::sync::Mutex::new(Vec::new());
    let key = dev.to_string();
    let mut known = CEILINGS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, bw)) = known.iter().find(|(k, _)| *k == key) {
        return Ok(*bw);
    }
    let c = timing::copy_ceiling(dev, 1 << 30, TimingOptions::default()).map_err(|e| {
        EngineError::Option {
            message: format!("measuring the copy ceiling: {e}"),
        }
    })?;
    known.push((key, c.bytes_per_s()));
    Ok(c.bytes_per_s())
}

/// Times `tokens` sampled steps as [`crate::Engine::generate`] runs them: the device
/// draws each token after its step and the next step is queued behind the draw before
/// the host reads it; when the host must draw (all device draws outside top-p), the
/// two steps are run again. A step's time is the gap between two tokens reaching the
/// host.
fn time_sampled(
    dec: &mut Decoder,
    token: u32,
    context: usize,
    tokens: usize,
) -> Result<ModeResult> {
    let mut sampler = Sampler::new(SAMPLED);
    for i in 0..3.min(tokens) {
        dec.set_input(token, context + i)?;
        dec.step()?;
        dec.sample_on_device(&SAMPLED)?;
        std::hint::black_box(sampler.sample(dec.logits()?));
    }
    dec.set_input(token, context)?;
    dec.synchronize()?;
    let mut step_ms = Vec::with_capacity(tokens);
    let mut host_us = Vec::with_capacity(tokens);
    let t0 = Instant::now();
    let mut arrived = t0;
    dec.step()?;
    let mut input = token;
    let mut fell_back = false;
    for i in 0..tokens {
        // The step just queued decodes position `pos - 1`.
        let pos = context + i + 1;
        let last = i + 1 == tokens;
        let speculate = !last && !fell_back;
        let t = Instant::now();
        dec.queue_device_sample(&SAMPLED)?;
        if speculate {
            dec.step()?;
        }
        host_us.push(t.elapsed().as_secs_f64() * 1e6);
        (input, fell_back) = finish_device_sample(dec, &mut sampler, input, pos, speculate, !last)?;
        let now = Instant::now();
        step_ms.push((now - arrived).as_secs_f64() * 1e3);
        arrived = now;
    }
    let total = t0.elapsed().as_secs_f64();
    Ok(ModeResult {
        mode: "sampled",
        ms_per_token: median(step_ms),
        tokens_per_s: tokens as f64 / total,
        host_us_per_token: median(host_us),
    })
}

/// Runs the benchmark.
pub fn run(opts: &DecodeBenchOptions) -> Result<DecodeReport> {
    if opts.tokens == 0 {
        return Err(EngineError::Option {
            message: "tokens must be at least 1".into(),
        });
    }
    let gpu = opts.device.is_cuda();
    let specs = opts
        .quant_tiles
        .iter()
        .map(|s| quant_tiles::QuantTileSpec::parse(s))
        .collect::<Result<Vec<_>>>()?;
    let quant_step = gpu && opts.graph && opts.weights != WeightFormat::Bf16;
    if !specs.is_empty() && !quant_step {
        return Err(EngineError::Option {
            message: "--quant-tiles needs quantized weights, a GPU and graphs".into(),
        });
    }
    let (cfg, weights) = crate::preset::load(&opts.preset, opts.seed)?;
    let max_seq = opts.context + opts.tokens + 8;
    let mut quant = opts.weights.random_weights(&cfg, opts.seed)?;
    let mut dec = Decoder::with_quant(&cfg, &weights, &quant, &opts.device, max_seq)?;
    // A decoder with the LM head in the other format, when a variant asks for it.
    let policy = dec.has_quant_head();
    let mut other = match opts.weights.head_type() {
        Some(ty)
            if specs
                .iter()
                .any(|s| s.quant_head.is_some_and(|q| q != policy)) =>
        {
            quant.lm_head = if policy {
                None
            } else {
                let mut rng = Rng::new(opts.seed ^ 0x4EAD);
                Some(quant::random_matrix(
                    &mut rng,
                    ty,
                    cfg.vocab_size,
                    cfg.hidden_size,
                )?)
            };
            Some(Decoder::with_quant(
                &cfg,
                &weights,
                &quant,
                &opts.device,
                max_seq,
            )?)
        }
        _ => None,
    };
    drop(weights);
    drop(quant);

    let copy_bytes_per_s = if gpu {
        Some(process_copy_ceiling(&opts.device)?)
    } else {
        None
    };

    // Fill the cache: `context` random tokens through the decode path (graph replays
    // when possible: this is the slow part on the interpreter).
    let mut rng = Rng::new(opts.seed ^ 0x5EED);
    let vocab = cfg.vocab_size as u32;
    dec.set_input(rng.next_u32() % vocab, 0)?;
    if gpu && opts.graph {
        dec.capture()?;
    }
    for pos in 0..opts.context {
        dec.set_input(rng.next_u32() % vocab, pos)?;
        dec.step()?;
    }
    dec.synchronize()?;
    let token = rng.next_u32() % vocab;

    let mut modes = Vec::new();
    if gpu && opts.graph {
        modes.push(time_mode(
            &mut dec,
            "graph",
            token,
            opts.context,
            opts.tokens,
        )?);
    }
    if opts.sampled {
        modes.push(time_sampled(&mut dec, token, opts.context, opts.tokens)?);
    }
    let quant_tiles = if specs.is_empty() {
        None
    } else {
        let rows = quant_tiles::compare(
            &mut dec,
            other.as_mut(),
            &specs,
            token,
            opts.context,
            opts.tokens,
        )?;
        drop(other);
        Some(quant_tiles::QuantTileReport {
            rows,
            rounds: quant_tiles::QUANT_TILE_ROUNDS,
            tokens: opts.tokens,
            kv_bytes: dec.kv_bytes_per_step(opts.context + opts.tokens / 2),
            copy_bytes_per_s,
        })
    };
    if opts.eager || !gpu || !opts.graph {
        dec.release_graph();
        modes.push(time_mode(
            &mut dec,
            "eager",
            token,
            opts.context,
            opts.tokens,
        )?);
    }
    let blocks = if gpu && opts.profile {
        dec.release_graph();
        dec.set_input(token, opts.context + opts.tokens / 2)?;
        dec.profile(20)?
    } else {
        Vec::new()
    };
    let timeline = match opts.timeline {
        Some(layer) => {
            dec.release_graph();
            dec.set_input(token, opts.context + opts.tokens / 2)?;
            TimelineReport::new(&dec.timeline(layer, if gpu { 20 } else { 2 })?)
        }
        None => None,
    };
    let sweep = if opts.sweep {
        Some(sweep::sweep(&mut dec, token, opts.context, opts.tokens)?)
    } else {
        None
    };
    Ok(DecodeReport {
        quant_tiles,
        sweep,
        timeline,
        device: opts.device.name(),
        preset: opts.preset.clone(),
        weights: opts.weights,
        context: opts.context,
        tokens: opts.tokens,
        weight_bytes: dec.weight_bytes_per_step(),
        kv_bytes: dec.kv_bytes_per_step(opts.context + opts.tokens / 2),
        copy_bytes_per_s,
        kernels_per_step: dec.kernels_per_step(),
        modes,
        blocks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stalled_run_is_told_apart_from_a_slow_one() {
        // 256 steps at a 0.8 ms median, one of them held up 40 ms by the host.
        let steady = ModeResult {
            mode: "eager",
            ms_per_token: 0.8,
            tokens_per_s: 256.0 / (256.0 * 0.8e-3),
            host_us_per_token: 700.0,
        };
        let stalled = ModeResult {
            tokens_per_s: 256.0 / (256.0 * 0.8e-3 + 0.04),
            ..steady.clone()
        };
        assert!((steady.median_tokens_per_s() - 1250.0).abs() < 1e-9);
        assert!(!steady.stalled());
        assert!(stalled.stalled(), "{}", stalled.tokens_per_s);
    }
}
