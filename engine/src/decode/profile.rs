//! A step measured part by part: GPU time of replays ([`Decoder::time_replays`]), each
//! block's share of a step ([`Decoder::profile`]), and per-program timelines of one
//! layer's launches ([`Decoder::timeline`]). GPU timing itself is the runtime's
//! ([`tilefuse_dsl::runtime::timing`]).

use tilefuse_dsl::runtime::Graph;

use super::{Block, Decoder, Scratch};
use crate::error::{EngineError, Result};

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
        let (true, Some(graph)) = (self.dev.is_cuda(), self.graph.as_ref()) else {
            return Err(EngineError::Option {
                message: "timing replays needs a GPU and a captured step".into(),
            });
        };
        let ms = self
            .dev
            .time_ms(|| (0..steps).try_for_each(|_| graph.launch()))?;
        Ok(ms / steps as f64)
    }

    /// Times each block of a step on its own: a graph of just that block's launches
    /// (every layer's), replayed `reps` times between CUDA events; the median per block.
    /// Summed, they are the step without the gaps between blocks. Then each block's
    /// cost inside the step ([`BlockTime::in_step_us`]): the full step's graph and one
    /// without the block's launches, replayed in turn `reps` times. GPU only; `state`
    /// is restored before every replay and afterwards.
    pub fn profile(&mut self, reps: usize) -> Result<Vec<BlockTime>> {
        if !self.dev.is_cuda() {
            return Err(EngineError::Option {
                message: "profiling needs a GPU".into(),
            });
        }
        let saved = self.s.state.to_vec()?;
        // One replay from the saved state, in microseconds.
        let dev = self.dev.clone();
        let replay = |s: &mut Scratch, graph: &Graph| -> Result<f64> {
            s.state.copy_from_host(&saved)?;
            Ok(dev.time_ms(|| graph.launch())? * 1e3)
        };
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
    /// When the program started (the quantized kernels: when it reached its wait,
    /// its first loads issued; see `kernels::stamp_now`).
    pub entry: i64,
    /// When it got past `wait_for_prior_kernels()` (the previous launches' writes
    /// visible).
    pub past_wait: i64,
    /// When it issued its last store.
    pub exit: i64,
    /// The SM it ran on (`sm_id()`; 0 on the interpreter).
    pub sm: i32,
}

/// One launch of the stamped layer: its block, kernel and every program's stamps, in
/// linear program order (x fastest).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchStamps {
    /// The block the launch belongs to.
    pub block: Block,
    /// The kernel launched (a quantized block launches several: an activation
    /// quantizer and a GEMV a run of rows).
    pub kernel: &'static str,
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
        let poison = vec![-1i64; self.s.spare.stamps.capacity() * 4];
        let saved = self.s.state.to_vec()?;
        self.stamp_layer = Some(layer);
        let runs = self.stamped_runs(reps.max(1), &saved, &poison);
        self.stamp_layer = None;
        self.s.state.copy_from_host(&saved)?;
        self.synchronize()?;
        let mut out = Vec::new();
        let runs = runs?;
        // What the stamped layer launched, as the (last) captured or eager step logged it.
        let logged = self.s.spare.stamps.log().to_vec();
        for raw in runs {
            let mut launches = Vec::new();
            for launch in &logged {
                let block = Block::ALL[launch.tag];
                let (at, n) = (launch.first, launch.programs);
                let mut programs = Vec::with_capacity(n);
                for (p, s) in raw[4 * at..4 * (at + n)].chunks(4).enumerate() {
                    if s[..3].iter().any(|&t| t < 0) || !(s[0] <= s[1] && s[1] <= s[2]) {
                        return Err(EngineError::Option {
                            message: format!(
                                "timeline of layer {layer}: program {p} of the {block:?} launch \
                                 of `{}` wrote stamps {s:?} (want entry <= past wait <= exit)",
                                launch.kernel
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
                    block,
                    kernel: launch.kernel,
                    programs,
                });
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
                self.s.spare.stamps.buf.copy_from_host(poison)?;
                graph.launch()?;
                let raw = self.s.spare.stamps.buf.to_vec()?;
                if rep >= 2 {
                    runs.push(raw);
                }
            }
        } else {
            for _ in 0..reps {
                self.s.state.copy_from_host(saved)?;
                self.s.spare.stamps.buf.copy_from_host(poison)?;
                self.step_eager()?;
                runs.push(self.s.spare.stamps.buf.to_vec()?);
            }
        }
        Ok(runs)
    }
}

/// The middle value (the upper one of an even count); `v` must not be empty.
pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
