//! The benchmark's report as text, and the summary of per-program timelines.

use std::fmt;

use super::DecodeReport;
use crate::decode::{median, Block, Timeline};

/// One launch of a stamped layer, summarized over the stamped steps: each figure is
/// the median over the steps, in microseconds from the layer's first program entry.
#[derive(Clone, Debug, PartialEq)]
pub struct TimelineRow {
    /// The launch's block.
    pub block: Block,
    /// Its kernel.
    pub kernel: &'static str,
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
    pub sample: Timeline,
}

impl TimelineReport {
    /// Summarizes stamped steps (all of one layer and one plan).
    pub fn new(runs: &[Timeline]) -> Option<TimelineReport> {
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
                    kernel: l.kernel,
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
                    kernel: r.kernel,
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

impl fmt::Display for DecodeReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mb = |b: usize| b as f64 / 1e6;
        writeln!(f, "device            {}", self.device)?;
        writeln!(
            f,
            "model             {} ({} random weights), context {}, {} timed steps",
            self.preset, self.weights, self.context, self.tokens
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
        if let Some(q) = &self.quant_tiles {
            write!(f, "\n{q}")?;
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
            for (kernel, choice) in sw.best.described() {
                writeln!(f, "  {kernel:<18} {choice}")?;
            }
            writeln!(
                f,
                "  lm_head programs   {}",
                match sw.best.lm_head.programs {
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
                "  {:<10} {:<24} {:>8}  {:>15}  {:>22}  {:>22}  {:>5}",
                "block",
                "kernel",
                "programs",
                "entry first-last",
                "past wait first/med/last",
                "exit first/med/last",
                "early"
            )?;
            for r in &t.rows {
                writeln!(
                    f,
                    "  {:<10} {:<24} {:>8}  {:>7.2} {:>7.2}  {:>7.2} {:>7.2} {:>6.2}  {:>7.2} {:>7.2} {:>6.2}  {:>5}",
                    format!("{:?}", r.block),
                    r.kernel,
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

/// Two runs of one preset side by side (a quantized one against its bf16 baseline):
/// per mode both have, tokens/s, the speed-up, bytes per token, floors and the share of
/// each run's own floor.
pub fn compare(base: &DecodeReport, run: &DecodeReport) -> String {
    let mb = |b: usize| b as f64 / 1e6;
    let mut out = format!(
        "{} against {} (same process)\nbytes per token   {:.1} MB vs {:.1} MB ({:.2}x fewer)",
        run.weights,
        base.weights,
        mb(run.weight_bytes + run.kv_bytes),
        mb(base.weight_bytes + base.kv_bytes),
        (base.weight_bytes + base.kv_bytes) as f64 / (run.weight_bytes + run.kv_bytes) as f64
    );
    if let (Some(fr), Some(fb)) = (run.floor_ms(), base.floor_ms()) {
        out += &format!("\nbandwidth floor   {fr:.3} ms vs {fb:.3} ms");
    }
    for m in &run.modes {
        let Some(b) = base.modes.iter().find(|b| b.mode == m.mode) else {
            continue;
        };
        let pct = |r: &DecodeReport, ms: f64| {
            r.floor_ms()
                .map_or("-".to_string(), |f| format!("{:.1}%", 100.0 * f / ms))
        };
        out += &format!(
            "\n{:<7} {:.1} vs {:.1} tokens/s (median step): {:.2}x; {} vs {} of own floor",
            m.mode,
            m.median_tokens_per_s(),
            b.median_tokens_per_s(),
            m.median_tokens_per_s() / b.median_tokens_per_s(),
            pct(run, m.ms_per_token),
            pct(base, b.ms_per_token)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::{LaunchStamps, ProgramStamps};

    #[test]
    fn a_timeline_summary_takes_medians_over_steps_and_counts_early_programs() {
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
                    kernel: "rms_norm_gemv",
                    programs: vec![p(0, 100, 1500), p(40, 100, 2000 + shift)],
                },
                LaunchStamps {
                    block: Block::Attention,
                    kernel: "attention_split",
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
            (qkv.kernel, attn.kernel),
            ("rms_norm_gemv", "attention_split")
        );
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
}
