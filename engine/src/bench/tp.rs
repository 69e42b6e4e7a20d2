//! `tilefuse bench --tp N`: a preset split over `N` devices ([`TpDecoder`]) against the
//! same preset on one (`N = 1`), in one run: tokens/s, the share of the combined
//! bandwidth floor, the time the collectives take, the speed-up, and whether the two
//! decode the same greedy tokens.
//!
//! Both models draw their weights on the devices ([`crate::decode::tp`]), so presets
//! of any size start in seconds and never exist in host memory. The KV cache is not
//! filled before timing: a step at position `context` reads `context + 1` cached
//! positions whatever they hold, so the bytes and the work are those of a filled
//! cache.

use std::fmt;
use std::time::Instant;

use tilefuse_dsl::runtime::timing::{self, TimingOptions};
use tilefuse_dsl::runtime::Device;

use crate::comm::launch_all;
use crate::config::ModelConfig;
use crate::decode::tp::{random_rank_weights, AllReduce, TpDecoder};
use crate::decode::{median, Decoder};
use crate::error::{EngineError, Result};
use crate::tp::TpPlan;

/// What `bench --tp` measures.
#[derive(Clone, Debug)]
pub struct TpBenchOptions {
    /// Preset name or config path.
    pub preset: String,
    /// Ranks of the split run (at least 2).
    pub tp: usize,
    /// The split run's devices: `tp` GPUs `cuda:0..`, or `tp` interpreter ranks.
    pub cpu: bool,
    /// Position of the first timed step (cached positions before it).
    pub context: usize,
    /// Steps timed per mode.
    pub tokens: usize,
    /// Seed of the random weights.
    pub seed: u64,
    /// Replay captured graphs (GPU); eager launches otherwise.
    pub graph: bool,
    /// Also run the model on one device (skipped, with a note, when it does not fit).
    pub baseline: bool,
    /// Greedy tokens compared between the one-device and the split run (0: none).
    pub check_tokens: usize,
    /// The split's all-reduces to time, one split run each, in order; empty: every one
    /// the split supports ([`TpDecoder::available_all_reduces`]).
    pub all_reduce: Vec<AllReduce>,
}

/// One configuration's figures.
#[derive(Clone, Debug)]
pub struct TpRun {
    /// Ranks (1: one device).
    pub size: usize,
    /// `"graph"` or `"eager"`.
    pub mode: &'static str,
    /// Median milliseconds per step, the token read back each step.
    pub ms_per_token: f64,
    /// Steps per second over the timed run.
    pub tokens_per_s: f64,
    /// Weight bytes a step reads, per rank.
    pub weight_bytes: Vec<usize>,
    /// KV bytes a step reads at the middle of the timed run, per rank.
    pub kv_bytes: Vec<usize>,
    /// Each rank's device copy bandwidth (read + write bytes per second), if measured.
    pub copy_bytes_per_s: Vec<f64>,
    /// Milliseconds per step the collectives add: the step's graphs with and without
    /// them, replayed back to back (GPU graphs only).
    pub collectives_ms: Option<f64>,
    /// Why the step is not replayed from graphs, when capture failed.
    pub capture_error: Option<String>,
    /// How the split's all-reduces ran (`None` for one device).
    pub all_reduce: Option<AllReduce>,
    /// Greedy tokens against the one-device run, when checked.
    pub agreement: Option<Agreement>,
}

impl TpRun {
    /// The combined floor: the slowest rank's bytes over its copy bandwidth (ms).
    pub fn floor_ms(&self) -> Option<f64> {
        if self.copy_bytes_per_s.len() != self.weight_bytes.len() {
            return None;
        }
        self.weight_bytes
            .iter()
            .zip(&self.kv_bytes)
            .zip(&self.copy_bytes_per_s)
            .map(|((w, k), bw)| (w + k) as f64 / bw * 1e3)
            .reduce(f64::max)
    }

    /// Percent of the floor reached.
    pub fn pct_of_floor(&self) -> Option<f64> {
        self.floor_ms().map(|f| 100.0 * f / self.ms_per_token)
    }
}

/// Greedy tokens of the one-device and the split run compared.
#[derive(Clone, Debug)]
pub struct Agreement {
    /// Tokens compared.
    pub tokens: usize,
    /// The first step whose token differs, if any.
    pub first_difference: Option<usize>,
    /// The largest logit difference over the steps before it, relative to the largest
    /// logit of its step.
    pub max_rel_logit_diff: f32,
}

/// `bench --tp`'s report.
#[derive(Clone, Debug)]
pub struct TpReport {
    /// Device names, in rank order.
    pub devices: Vec<String>,
    /// Preset.
    pub preset: String,
    /// Position of the first timed step.
    pub context: usize,
    /// One device (when run), then the split.
    pub runs: Vec<TpRun>,
    /// Why the one-device run was skipped.
    pub baseline_note: Option<String>,
    /// Greedy agreement of the first split run, when checked.
    pub agreement: Option<Agreement>,
    /// The last split run's greedy trace against the first's (different
    /// all-reduces), when both were checked.
    pub all_reduces_agree: Option<Agreement>,
}

impl TpReport {
    /// The fastest split run's tokens/s over the one-device run's, when both ran
    /// (with several all-reduces timed, the best of them).
    pub fn speedup(&self) -> Option<f64> {
        let best = self
            .runs
            .iter()
            .filter(|r| r.size > 1)
            .min_by(|a, b| a.ms_per_token.total_cmp(&b.ms_per_token))?;
        self.speedup_of(best)
    }

    /// How `a` is named in the report: `host` for [`AllReduce::Nccl`] on interpreter
    /// ranks, whose communicator copies through host memory rather than NCCL.
    pub fn all_reduce_label(&self, a: AllReduce) -> &'static str {
        let interpreter = self.devices.iter().all(|d| d.starts_with("cpu"));
        if a == AllReduce::Nccl && interpreter {
            "host"
        } else {
            a.name()
        }
    }

    /// `run`'s tokens/s over the one-device run's, when that ran.
    pub fn speedup_of(&self, run: &TpRun) -> Option<f64> {
        let one = self.runs.iter().find(|r| r.size == 1)?;
        Some(one.ms_per_token / run.ms_per_token)
    }
}

impl TpReport {
    /// The report as JSON (`bench --tp --json`).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "devices": self.devices,
            "preset": self.preset,
            "context": self.context,
            "runs": self.runs.iter().map(|r| serde_json::json!({
                "tp": r.size,
                "mode": r.mode,
                "ms_per_token": r.ms_per_token,
                "median_tokens_per_s": 1e3 / r.ms_per_token,
                "tokens_per_s": r.tokens_per_s,
                "weight_bytes": r.weight_bytes,
                "kv_bytes": r.kv_bytes,
                "copy_bytes_per_s": r.copy_bytes_per_s,
                "floor_ms": r.floor_ms(),
                "pct_of_floor": r.pct_of_floor(),
                "collectives_ms": r.collectives_ms,
                "capture_error": r.capture_error,
                "all_reduce": r.all_reduce.map(|a| self.all_reduce_label(a)),
                "speedup": self.speedup_of(r).filter(|_| r.size > 1),
                "agreement": r.agreement.as_ref().map(agreement_json),
            })).collect::<Vec<_>>(),
            "baseline_note": self.baseline_note,
            "speedup": self.speedup(),
            "agreement": self.agreement.as_ref().map(agreement_json),
            "all_reduces_agree": self.all_reduces_agree.as_ref().map(agreement_json),
        })
    }
}

fn agreement_json(a: &Agreement) -> serde_json::Value {
    serde_json::json!({
        "tokens": a.tokens,
        "first_difference": a.first_difference,
        "max_rel_logit_diff": a.max_rel_logit_diff,
    })
}

impl fmt::Display for Agreement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.first_difference {
            None => write!(
                f,
                "{} of {} equal; largest logit difference {:.2e} of the largest",
                self.tokens, self.tokens, self.max_rel_logit_diff
            ),
            Some(s) => write!(
                f,
                "first difference at step {s} of {}; largest logit difference before it {:.2e} of the largest",
                self.tokens, self.max_rel_logit_diff
            ),
        }
    }
}

impl fmt::Display for TpReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{}, tensor parallel, position {} ({})",
            self.preset,
            self.context,
            self.devices.join(", ")
        )?;
        for r in &self.runs {
            let gib = |b: &[usize]| {
                b.iter()
                    .map(|&x| x as f64 / (1u64 << 30) as f64)
                    .fold(0.0, f64::max)
            };
            let via = r
                .all_reduce
                .map(|a| format!(" {}", self.all_reduce_label(a)))
                .unwrap_or_default();
            write!(
                f,
                "  tp {}{via}: {} {:.1} tok/s ({:.3} ms/token, run {:.1} tok/s), largest rank reads {:.2} GiB",
                r.size,
                r.mode,
                1e3 / r.ms_per_token,
                r.ms_per_token,
                r.tokens_per_s,
                gib(&r.weight_bytes) + gib(&r.kv_bytes),
            )?;
            if let (Some(fl), Some(p)) = (r.floor_ms(), r.pct_of_floor()) {
                write!(f, ", floor {fl:.3} ms, {p:.1}% of floor")?;
            }
            if let Some(c) = r.collectives_ms {
                write!(
                    f,
                    ", collectives {:.3} ms/step ({:.1}%)",
                    c,
                    100.0 * c / r.ms_per_token
                )?;
            }
            if let Some(s) = self.speedup_of(r).filter(|_| r.size > 1) {
                write!(f, ", {s:.2}x tp 1")?;
            }
            writeln!(f)?;
            if let Some(a) = &r.agreement {
                writeln!(f, "    greedy tokens against tp 1: {a}")?;
            }
            if let Some(e) = &r.capture_error {
                writeln!(f, "    capture failed, eager launches instead: {e}")?;
            }
        }
        if let Some(n) = &self.baseline_note {
            writeln!(f, "  tp 1: {n}")?;
        }
        if let Some(s) = self.speedup() {
            writeln!(f, "  speed-up over tp 1 (fastest split): {s:.2}x")?;
        }
        if let Some(a) = &self.agreement {
            writeln!(f, "  greedy tokens: {a} (tp 1)")?;
        }
        if let Some(a) = &self.all_reduces_agree {
            writeln!(f, "  greedy tokens, one all-reduce against the other: {a}")?;
        }
        Ok(())
    }
}

/// What timing needs of a decoder (one device or split).
trait Stepper {
    fn set_input(&mut self, token: u32, pos: usize) -> Result<()>;
    fn step(&mut self) -> Result<()>;
    fn queue_state_read(&mut self) -> Result<()>;
    fn take_state(&self) -> Result<(u32, usize)>;
    fn synchronize(&self) -> Result<()>;
    fn forward(&mut self, token: u32, pos: usize) -> Result<Vec<f32>>;
    fn read_state(&self) -> Result<(u32, usize)>;
}

macro_rules! stepper {
    ($t:ty) => {
        impl Stepper for $t {
            fn set_input(&mut self, token: u32, pos: usize) -> Result<()> {
                <$t>::set_input(self, token, pos)
            }
            fn step(&mut self) -> Result<()> {
                <$t>::step(self)
            }
            fn queue_state_read(&mut self) -> Result<()> {
                <$t>::queue_state_read(self)
            }
            fn take_state(&self) -> Result<(u32, usize)> {
                <$t>::take_state(self)
            }
            fn synchronize(&self) -> Result<()> {
                <$t>::synchronize(self)
            }
            fn forward(&mut self, token: u32, pos: usize) -> Result<Vec<f32>> {
                <$t>::forward(self, token, pos)
            }
            fn read_state(&self) -> Result<(u32, usize)> {
                <$t>::read_state(self)
            }
        }
    };
}
stepper!(Decoder);
stepper!(TpDecoder);

/// Median ms per step and steps/s over `tokens` greedy steps from `context`, each
/// token read back while the next step is queued (as generation runs).
fn time_steps(
    dec: &mut dyn Stepper,
    token: u32,
    context: usize,
    tokens: usize,
) -> Result<(f64, f64)> {
    for i in 0..3.min(tokens) {
        dec.set_input(token, context + i)?;
        dec.step()?;
        dec.read_state()?;
    }
    dec.set_input(token, context)?;
    dec.synchronize()?;
    let mut step_ms = Vec::with_capacity(tokens);
    let t0 = Instant::now();
    let mut arrived = t0;
    dec.step()?;
    for i in 0..tokens {
        dec.queue_state_read()?;
        if i + 1 < tokens {
            dec.step()?;
        }
        dec.take_state()?;
        let now = Instant::now();
        step_ms.push((now - arrived).as_secs_f64() * 1e3);
        arrived = now;
    }
    Ok((median(step_ms), tokens as f64 / t0.elapsed().as_secs_f64()))
}

/// The prompt of the agreement check.
const PROMPT: [u32; 4] = [1, 17, 42, 7];

/// Every step's logits and greedy token over the prompt and `tokens` greedy steps.
fn greedy_trace(dec: &mut dyn Stepper, tokens: usize) -> Result<Vec<(Vec<f32>, u32)>> {
    let mut out = Vec::with_capacity(tokens);
    let mut token = PROMPT[0];
    for pos in 0..PROMPT.len() + tokens {
        if let Some(&t) = PROMPT.get(pos) {
            token = t;
        }
        let logits = dec.forward(token, pos)?;
        token = dec.read_state()?.0;
        if pos + 1 >= PROMPT.len() {
            out.push((logits, token));
        }
    }
    Ok(out)
}

fn compare(one: &[(Vec<f32>, u32)], split: &[(Vec<f32>, u32)]) -> Agreement {
    let mut worst = 0.0f32;
    let mut first_difference = None;
    for (s, (a, b)) in one.iter().zip(split).enumerate() {
        let scale =
            a.0.iter()
                .fold(0.0f32, |m, v| m.max(v.abs()))
                .max(f32::MIN_POSITIVE);
        let d =
            a.0.iter()
                .zip(&b.0)
                .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()));
        worst = worst.max(d / scale);
        if a.1 != b.1 {
            first_difference = Some(s);
            break;
        }
    }
    Agreement {
        tokens: one.len(),
        first_difference,
        max_rel_logit_diff: worst,
    }
}

fn copy_bandwidth(dev: &Device) -> Result<Option<f64>> {
    if !dev.is_cuda() {
        return Ok(None);
    }
    let c = timing::copy_ceiling(dev, 1 << 30, TimingOptions::default()).map_err(|e| {
        EngineError::Option {
            message: format!("measuring the copy ceiling of {dev}: {e}"),
        }
    })?;
    Ok(Some(c.bytes_per_s()))
}

/// Runs `bench --tp`.
pub fn run(opts: &TpBenchOptions) -> Result<TpReport> {
    if opts.tokens == 0 || opts.tp < 2 {
        return Err(EngineError::Option {
            message: "bench --tp needs at least 2 ranks and 1 token".into(),
        });
    }
    let cfg = crate::preset::config(&opts.preset)?;
    let devices: Vec<Device> = if opts.cpu {
        vec![Device::cpu(); opts.tp]
    } else {
        (0..opts.tp)
            .map(Device::cuda)
            .collect::<std::result::Result<_, _>>()?
    };
    let max_seq = (opts.context + opts.tokens + 8).max(PROMPT.len() + opts.check_tokens + 1);
    let mut bws = Vec::new();
    for d in &devices {
        if let Some(bw) = copy_bandwidth(d)? {
            bws.push(bw);
        }
    }
    let gpu = !opts.cpu;
    let graph = gpu && opts.graph;
    let token = 3 % cfg.vocab_size as u32;
    let mid = opts.context + opts.tokens / 2;
    let mut runs = Vec::new();
    let mut baseline_note = None;
    let mut one_trace = None;

    if opts.baseline {
        let need = crate::memory::MemoryNeed::for_decoder(&cfg, max_seq);
        match crate::memory::check_fits(&devices[0], &opts.preset, &cfg, &need) {
            Err(e) => baseline_note = Some(format!("skipped: {e}")),
            Ok(()) => {
                let mut dec = one_device(&cfg, &devices[0], opts.seed, max_seq)?;
                if opts.check_tokens > 0 {
                    one_trace = Some(greedy_trace(&mut dec, opts.check_tokens)?);
                }
                dec.set_input(token, opts.context)?;
                if graph {
                    dec.capture()?;
                }
                let (ms, tps) = time_steps(&mut dec, token, opts.context, opts.tokens)?;
                runs.push(TpRun {
                    size: 1,
                    mode: if graph { "graph" } else { "eager" },
                    ms_per_token: ms,
                    tokens_per_s: tps,
                    weight_bytes: vec![dec.weight_bytes_per_step()],
                    kv_bytes: vec![dec.kv_bytes_per_step(mid)],
                    copy_bytes_per_s: bws.iter().take(1).copied().collect(),
                    collectives_ms: None,
                    capture_error: None,
                    all_reduce: None,
                    agreement: None,
                });
            }
        }
    }

    for r in &runs {
        // As soon as known (a later failure keeps it).
        eprintln!(
            "tp 1: {:.3} ms/token, {:.1}% of floor",
            r.ms_per_token,
            r.pct_of_floor().unwrap_or(0.0)
        );
    }
    let mut split = TpDecoder::from_preset(&cfg, opts.seed, &devices, max_seq)?;
    let modes = if opts.all_reduce.is_empty() {
        split.available_all_reduces()
    } else {
        opts.all_reduce.clone()
    };
    let mut traces = Vec::new();
    for all_reduce in modes {
        split.set_all_reduce(all_reduce)?;
        let agreement = match &one_trace {
            Some(one) => {
                let trace = greedy_trace(&mut split, opts.check_tokens)?;
                let a = compare(one, &trace);
                traces.push(trace);
                Some(a)
            }
            None => None,
        };
        split.set_input(token, opts.context)?;
        let mut capture_error = None;
        if graph {
            if let Err(e) = split.capture() {
                capture_error = Some(e.to_string());
            }
        }
        let mode = if split.uses_graph() { "graph" } else { "eager" };
        let (ms, tps) = time_steps(&mut split, token, opts.context, opts.tokens)?;
        eprintln!(
            "tp {} {}: {mode} {ms:.3} ms/token",
            opts.tp,
            all_reduce.name()
        );
        if let Some(a) = &agreement {
            eprintln!("agreement: {a}");
        }
        let collectives_ms = if split.uses_graph() {
            collectives_cost(&mut split, token, mid, opts.tokens)?
        } else {
            None
        };
        split.release_graph();
        runs.push(TpRun {
            size: opts.tp,
            mode,
            ms_per_token: ms,
            tokens_per_s: tps,
            weight_bytes: split.weight_bytes_per_step(),
            kv_bytes: split.kv_bytes_per_step(mid),
            copy_bytes_per_s: bws.clone(),
            collectives_ms,
            capture_error,
            all_reduce: Some(all_reduce),
            agreement,
        });
    }
    let all_reduces_agree = match traces.as_slice() {
        [first, .., last] => Some(compare(first, last)),
        _ => None,
    };
    Ok(TpReport {
        devices: devices.iter().map(|d| d.name()).collect(),
        preset: opts.preset.clone(),
        context: opts.context,
        agreement: runs.iter().find_map(|r| r.agreement.clone()),
        runs,
        baseline_note,
        all_reduces_agree,
    })
}

/// The preset on one device, its weights drawn there.
fn one_device(cfg: &ModelConfig, dev: &Device, seed: u64, max_seq: usize) -> Result<Decoder> {
    let plan = TpPlan::new(cfg, 1)?;
    let w = random_rank_weights(cfg, &plan, 0, dev, seed)?;
    Decoder::from_device(cfg, w, dev, max_seq)
}

/// Milliseconds per step the collectives add: `tokens` replays of the step's graphs
/// with them and of graphs captured without them, in 5 interleaved rounds, medians of
/// the per-step times.
fn collectives_cost(
    split: &mut TpDecoder,
    token: u32,
    pos: usize,
    tokens: usize,
) -> Result<Option<f64>> {
    let without = match split.capture_without_collectives() {
        Ok(g) => g,
        Err(_) => return Ok(None),
    };
    let reps = tokens.clamp(8, 64);
    let mut with_ms = Vec::new();
    let mut without_ms = Vec::new();
    for _ in 0..5 {
        for collectives in [true, false] {
            split.set_input(token, pos)?;
            split.synchronize()?;
            let t = Instant::now();
            for _ in 0..reps {
                if collectives {
                    split.step()?;
                } else {
                    launch_all(&without)?;
                }
            }
            split.synchronize()?;
            let ms = t.elapsed().as_secs_f64() * 1e3 / reps as f64;
            if collectives {
                with_ms.push(ms);
            } else {
                without_ms.push(ms);
            }
        }
    }
    Ok(Some(median(with_ms) - median(without_ms)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_bench_runs_on_interpreter_ranks_and_agrees_with_one_device() {
        let report = run(&TpBenchOptions {
            preset: "tiny-qwen3".into(),
            tp: 2,
            cpu: true,
            context: 3,
            tokens: 2,
            seed: 1,
            graph: false,
            baseline: true,
            check_tokens: 8,
            all_reduce: Vec::new(),
        })
        .unwrap();
        assert_eq!(report.runs.len(), 2);
        assert_eq!(report.runs[1].weight_bytes.len(), 2);
        // Each rank reads less than the whole model (the embedding row and norms are
        // replicated, the rest split).
        assert!(report.runs[1].weight_bytes[0] < report.runs[0].weight_bytes[0]);
        let a = report.agreement.as_ref().unwrap();
        assert_eq!((a.tokens, a.first_difference), (9, None), "{report}");
        assert!(report.speedup().is_some());
        let text = report.to_string();
        assert!(
            text.contains("tp 2 host: eager") && text.contains("9 of 9 equal"),
            "{text}"
        );
    }
}
