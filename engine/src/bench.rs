//! The decode benchmark behind `tilefuse bench`: a preset with random weights, a KV
//! cache filled to a given context, then timed greedy decode steps, graph and eager,
//! against the bandwidth floor measured in the same run.

use std::fmt;
use std::time::Instant;

use tilefuse_dsl::runtime::{Device, KernelDef};

use crate::decode::{median, BlockTime, Decoder, KernelChoice, LaunchPlan};
use crate::error::{EngineError, Result};
use crate::kernels::{
    ATTENTION_COMBINE, ATTENTION_SPLIT, GEMV_RESIDUAL, LM_HEAD_ARGMAX, RMS_NORM_GATE_UP,
    RMS_NORM_GEMV,
};
use crate::perf::{self, TimingOptions};
use crate::sampling::{Sampler, Sampling};
use crate::tuning;

/// What to measure.
#[derive(Clone, Debug)]
pub struct DecodeBenchOptions {
    /// Preset name (see [`crate::preset::PRESETS`]).
    pub preset: String,
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
}

/// One launch of a stamped layer, summarized over the stamped steps: each figure is
/// the median over the steps, in microseconds from the layer's first program entry.
#[derive(Clone, Debug, PartialEq)]
pub struct TimelineRow {
    /// The launch's block.
    pub block: crate::decode::Block,
    /// Its programs.
    pub programs: usize,
    /// First and last program entry.
    pub entry: (f64, f64),
    /// First, median and last program past its wait.
    pub past_wait: (f64, f64, f64),
    /// First, median and last program exit.
    pub exit: (f64, f64, f64),
    /// Programs that entered before the previous launch's last program exited (started
    /// beside it: programmatic launch); 0 for the first launch.
    pub early: usize,
}

/// [`TimelineRow`]s of one layer.
#[derive(Clone, Debug, PartialEq)]
pub struct TimelineReport {
    /// The stamped layer.
    pub layer: usize,
    /// Steps summarized.
    pub steps: usize,
    /// The smallest non-zero difference between two stamps of a step, in nanoseconds:
    /// the clock's resolution or finer.
    pub clock_step_ns: i64,
    /// Per launch, in step order.
    pub rows: Vec<TimelineRow>,
    /// One step's stamps as recorded (the last step), for a closer look.
    pub sample: crate::decode::Timeline,
}

impl TimelineReport {
    /// Summarizes stamped steps (all of one layer and one plan).
    pub fn new(runs: &[crate::decode::Timeline]) -> Option<TimelineReport> {
        let first = runs.first()?;
        let us = |ns: i64| ns as f64 / 1e3;
        let mut per_run: Vec<Vec<TimelineRow>> = Vec::new();
        let mut clock_step_ns = i64::MAX;
        for run in runs {
            let mut all: Vec<i64> = run
                .launches
                .iter()
                .flat_map(|l| {
                    l.programs
                        .iter()
                        .flat_map(|p| [p.entry, p.past_wait, p.exit])
                })
                .collect();
            all.sort_unstable();
            all.dedup();
            if let Some(step) = all.windows(2).map(|w| w[1] - w[0]).min() {
                clock_step_ns = clock_step_ns.min(step);
            }
            let mut rows = Vec::new();
            let mut prev_exit = None;
            for l in &run.launches {
                let mut entry: Vec<i64> = l.programs.iter().map(|p| p.entry).collect();
                let mut wait: Vec<i64> = l.programs.iter().map(|p| p.past_wait).collect();
                let mut exit: Vec<i64> = l.programs.iter().map(|p| p.exit).collect();
                let early = prev_exit.map_or(0, |e| entry.iter().filter(|&&t| t < e).count());
                entry.sort_unstable();
                wait.sort_unstable();
                exit.sort_unstable();
                let spread = |v: &[i64]| (us(v[0]), us(v[v.len() / 2]), us(v[v.len() - 1]));
                let (e0, _, e1) = spread(&entry);
                rows.push(TimelineRow {
                    block: l.block,
                    programs: l.programs.len(),
                    entry: (e0, e1),
                    past_wait: spread(&wait),
                    exit: spread(&exit),
                    early,
                });
                prev_exit = exit.last().copied();
            }
            per_run.push(rows);
        }
        let mid = |f: &dyn Fn(&TimelineRow) -> f64, i: usize| {
            median(per_run.iter().map(|rows| f(&rows[i])).collect())
        };
        let rows = (0..first.launches.len())
            .map(|i| {
                let r = &per_run[0][i];
                let mut early: Vec<usize> = per_run.iter().map(|rows| rows[i].early).collect();
                early.sort_unstable();
                TimelineRow {
                    block: r.block,
                    programs: r.programs,
                    entry: (mid(&|r| r.entry.0, i), mid(&|r| r.entry.1, i)),
                    past_wait: (
                        mid(&|r| r.past_wait.0, i),
                        mid(&|r| r.past_wait.1, i),
                        mid(&|r| r.past_wait.2, i),
                    ),
                    exit: (
                        mid(&|r| r.exit.0, i),
                        mid(&|r| r.exit.1, i),
                        mid(&|r| r.exit.2, i),
                    ),
                    early: early[early.len() / 2],
                }
            })
            .collect();
        Some(TimelineReport {
            layer: first.layer,
            steps: runs.len(),
            clock_step_ns: if clock_step_ns == i64::MAX {
                0
            } else {
                clock_step_ns
            },
            rows,
            sample: runs[runs.len() - 1].clone(),
        })
    }
}

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
        (input, fell_back) =
            dec.finish_device_sample(&mut sampler, input, pos, speculate, !last)?;
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

/// A launch choice in words, as the runtime names variants
/// (`BLOCK_N=4, BLOCK_K=512, num_warps=8`).
pub fn describe(def: &KernelDef, choice: &KernelChoice) -> String {
    def.describe_variant(&choice.consts, choice.num_warps)
}

/// Every compiled variant of `def` whose constants `keep` accepts.
fn candidates(def: &KernelDef, keep: &dyn Fn(&[i64]) -> bool) -> Vec<KernelChoice> {
    def.variants
        .iter()
        .filter(|v| keep(v.consts))
        .map(|v| KernelChoice {
            consts: v.consts.to_vec(),
            num_warps: v.num_warps,
        })
        .collect()
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

/// The plans that differ from `base` in one `role` (a launch, the split count or
/// `min_chunk`), each with the choice in words.
fn tries(base: &LaunchPlan, role: &str, vocab: usize, head_dim: i64) -> Vec<(String, LaunchPlan)> {
    let variants = |def: &'static KernelDef,
                    keep: &dyn Fn(&[i64]) -> bool,
                    set: &dyn Fn(LaunchPlan, KernelChoice) -> LaunchPlan| {
        candidates(def, keep)
            .into_iter()
            .map(|c| (describe(def, &c), set(base.clone(), c)))
            .collect()
    };
    let any = |_: &[i64]| true;
    let s = base.combine.consts[1];
    match role {
        "qkv" => variants(&RMS_NORM_GEMV, &any, &|mut p, c| {
            p.qkv = c;
            p
        }),
        "o_proj" => variants(&GEMV_RESIDUAL, &any, &|mut p, c| {
            p.o_proj = c;
            p
        }),
        "gate_up" => variants(&RMS_NORM_GATE_UP, &any, &|mut p, c| {
            p.gate_up = c;
            p
        }),
        "down" => variants(&GEMV_RESIDUAL, &any, &|mut p, c| {
            p.down = c;
            p
        }),
        // A clustered variant merges one split per program of its cluster.
        "attention" => variants(&ATTENTION_SPLIT, &|k| k[0] == head_dim, &|mut p, c| {
            let cluster = c.consts[4] as usize;
            p.attention = c;
            if cluster > 1 {
                p.with_splits(cluster)
            } else {
                p
            }
        }),
        "combine" => variants(
            &ATTENTION_COMBINE,
            &|k| k[0] == head_dim && k[1] == s,
            &|mut p, c| {
                p.combine = c;
                p
            },
        ),
        "lm_head" => variants(&LM_HEAD_ARGMAX, &any, &|p, c| p.with_lm_head(c, vocab)),
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
                let bs = base.attention.consts[2] as usize;
                (n.to_string(), base.clone().with_attention_cluster(1, n, bs))
            })
            .collect(),
        "min_chunk" => [1, 32, 64, 96, 128, 192, 256]
            .into_iter()
            .map(|n| {
                (
                    n.to_string(),
                    LaunchPlan {
                        min_chunk: n,
                        ..base.clone()
                    },
                )
            })
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
    let (vocab, head_dim) = (dec.config().vocab_size, dec.config().head_dim as i64);
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

/// Runs the benchmark.
pub fn run(opts: &DecodeBenchOptions) -> Result<DecodeReport> {
    if opts.tokens == 0 {
        return Err(EngineError::Option {
            message: "tokens must be at least 1".into(),
        });
    }
    let (cfg, weights) = crate::preset::load(&opts.preset, opts.seed)?;
    let max_seq = opts.context + opts.tokens + 8;
    let mut dec = Decoder::new(&cfg, &weights, &opts.device, max_seq)?;
    drop(weights);
    let gpu = opts.device.is_cuda();

    let copy_bytes_per_s = if gpu {
        let c =
            perf::copy_ceiling(&opts.device, 1 << 30, TimingOptions::default()).map_err(|e| {
                EngineError::Option {
                    message: format!("measuring the copy ceiling: {e}"),
                }
            })?;
        Some(c.bytes_per_s())
    } else {
        None
    };

    // Fill the cache: `context` random tokens through the decode path (graph replays
    // when possible: this is the slow part on the interpreter).
    let mut rng = perf::Rng::new(opts.seed ^ 0x5EED);
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
        Some(sweep(&mut dec, token, opts.context, opts.tokens)?)
    } else {
        None
    };
    Ok(DecodeReport {
        sweep,
        timeline,
        device: opts.device.name(),
        preset: opts.preset.clone(),
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

impl fmt::Display for DecodeReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mb = |b: usize| b as f64 / 1e6;
        writeln!(f, "device            {}", self.device)?;
        writeln!(
            f,
            "model             {} (random weights), context {}, {} timed steps",
            self.preset, self.context, self.tokens
        )?;
        writeln!(
            f,
            "bytes per token   {:.1} MB weights + {:.1} MB KV",
            mb(self.weight_bytes),
            mb(self.kv_bytes)
        )?;
        writeln!(f, "kernels per step  {}", self.kernels_per_step)?;
        match (self.copy_bytes_per_s, self.floor_ms()) {
            (Some(bw), Some(floor)) => writeln!(
                f,
                "copy bandwidth    {:.0} GB/s (device-to-device, read + write)\nbandwidth floor   {floor:.3} ms/token",
                bw / 1e9
            )?,
            _ => writeln!(f, "bandwidth floor   not measured (no GPU)")?,
        }
        writeln!(
            f,
            "\n{:<7} {:>10} {:>10} {:>11} {:>14} {:>17}",
            "mode", "tokens/s", "ms/token", "% of floor", "host µs/token", "tokens/s (median)"
        )?;
        for m in &self.modes {
            let pct = self.floor_ms().map_or("-".to_string(), |fl| {
                format!("{:.1}%", 100.0 * fl / m.ms_per_token)
            });
            writeln!(
                f,
                "{:<7} {:>10.1} {:>10.3} {:>11} {:>14.1} {:>17.1}",
                m.mode,
                m.tokens_per_s,
                m.ms_per_token,
                pct,
                m.host_us_per_token,
                m.median_tokens_per_s()
            )?;
        }
        for m in self.modes.iter().filter(|m| m.stalled()) {
            writeln!(
                f,
                "note: the {} run's rate is {:.0}% below its median step's: some steps waited on \
                 the host (a stall); the median is the steady rate",
                m.mode,
                100.0 * (1.0 - m.tokens_per_s / m.median_tokens_per_s())
            )?;
        }
        if let Some(sw) = &self.sweep {
            writeln!(
                f,
                "\nvariant sweep (graph replays; each row changes one launch of the best plan so \
                 far and is timed in pairs with it):"
            )?;
            for r in &sw.rows {
                writeln!(
                    f,
                    "  {:<10} {:<40} {:>8.4} ms/token {:>+6.2}% vs the best so far",
                    r.role,
                    r.choice,
                    r.ms_per_token,
                    100.0 * r.vs_best
                )?;
            }
            writeln!(
                f,
                "re-timed: default {:.4} ms/token, best {:.4} ms/token ({:+.1}%)",
                sw.default_ms,
                sw.best_ms,
                100.0 * (sw.best_ms / sw.default_ms - 1.0)
            )?;
            writeln!(f, "best plan:")?;
            for (def, c) in sw.best.choices() {
                writeln!(f, "  {:<18} {}", def.name, describe(def, c))?;
            }
            writeln!(
                f,
                "  lm_head programs   {}",
                match sw.best.lm_head_programs {
                    0 => "one per row block".to_string(),
                    p => p.to_string(),
                }
            )?;
            writeln!(f, "  splits             {}", sw.best.splits)?;
            writeln!(f, "  min_chunk          {}", sw.best.min_chunk)?;
        }
        if let Some(t) = &self.timeline {
            writeln!(
                f,
                "\ntimeline of layer {} (median of {} steps; µs from the layer's first program \
                 entry; clock step {} ns):",
                t.layer, t.steps, t.clock_step_ns
            )?;
            writeln!(
                f,
                "  {:<10} {:>8}  {:>15}  {:>22}  {:>22}  {:>5}",
                "launch",
                "programs",
                "entry first-last",
                "past wait first/med/last",
                "exit first/med/last",
                "early"
            )?;
            for r in &t.rows {
                writeln!(
                    f,
                    "  {:<10} {:>8}  {:>7.2} {:>7.2}  {:>7.2} {:>7.2} {:>6.2}  {:>7.2} {:>7.2} {:>6.2}  {:>5}",
                    format!("{:?}", r.block),
                    r.programs,
                    r.entry.0,
                    r.entry.1,
                    r.past_wait.0,
                    r.past_wait.1,
                    r.past_wait.2,
                    r.exit.0,
                    r.exit.1,
                    r.exit.2,
                    r.early
                )?;
            }
            writeln!(
                f,
                "  (early: programs that entered before the previous launch's last exit)"
            )?;
        }
        if !self.blocks.is_empty() {
            let total: f64 = self.blocks.iter().map(|b| b.us).sum();
            let in_step: f64 = self.blocks.iter().map(|b| b.in_step_us).sum();
            writeln!(
                f,
                "\nper block: alone = its launches timed as a graph of their own (sum {total:.1} µs);\n\
                 in step = what the step loses with them left out of its graph (sum {in_step:.1} µs)"
            )?;
            for b in &self.blocks {
                writeln!(
                    f,
                    "  {:<10} {:>4} launches  alone {:>7.1} µs {:>5.1}%  in step {:>7.1} µs {:>5.2} µs a launch",
                    format!("{:?}", b.block),
                    b.launches,
                    b.us,
                    100.0 * b.us / total,
                    b.in_step_us,
                    b.in_step_us / b.launches as f64
                )?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            let alternatives = tries(&base, role, cfg.vocab_size, cfg.head_dim as i64)
                .into_iter()
                .filter(|(_, p)| *p != base && p.check().is_ok())
                .count();
            assert!(alternatives > 0, "{role}");
        }
    }

    #[test]
    fn a_timeline_summary_takes_medians_over_steps_and_counts_early_programs() {
        use crate::decode::{Block, LaunchStamps, ProgramStamps, Timeline};
        let p = |entry, past_wait, exit| ProgramStamps {
            entry,
            past_wait,
            exit,
            sm: 0,
        };
        // Step `shift`: a first launch of two programs, then one of three whose first
        // two programs enter while the first launch runs (before 2000 + shift ns).
        let step = |shift: i64| Timeline {
            layer: 3,
            launches: vec![
                LaunchStamps {
                    block: Block::Qkv,
                    programs: vec![p(0, 100, 1500), p(40, 100, 2000 + shift)],
                },
                LaunchStamps {
                    block: Block::Attention,
                    programs: vec![
                        p(500, 2500 + shift, 4000),
                        p(1000, 2600 + shift, 4100),
                        p(2100 + shift, 2700 + shift, 4200 + shift),
                    ],
                },
            ],
        };
        let t = TimelineReport::new(&[step(0), step(300), step(30)]).unwrap();
        assert_eq!((t.layer, t.steps), (3, 3));
        assert_eq!(t.clock_step_ns, 40, "the first two entries");
        let (qkv, attn) = (&t.rows[0], &t.rows[1]);
        assert_eq!((qkv.block, qkv.programs, qkv.early), (Block::Qkv, 2, 0));
        assert_eq!(
            qkv.exit,
            (1.5, 2.03, 2.03),
            "median step: the one shifted 30 ns"
        );
        assert_eq!((attn.programs, attn.early), (3, 2));
        assert_eq!(attn.entry, (0.5, 2.13));
        assert_eq!(attn.past_wait, (2.53, 2.63, 2.73));
        assert!(TimelineReport::new(&[]).is_none());
    }

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
