//! Sampling on the device: after a step, a few small kernels ([`super::kernels`]) draw
//! the next token from the logits the step left on the device and write it into
//! `state`, so that the next step decodes it; the host reads 8 bytes a token. When every
//! draw falls outside top-k/top-p the host draws instead ([`super::Sampler`]): rejection
//! sampling, exact as a whole (docs/design.md, "Sampling on the device").
//!
//! [`crate::Decoder::queue_device_sample`] drives a `DeviceSampler`; what the engine
//! does when the host must draw (the step to redo) is [`crate::engine`]'s.

use tilefuse_dsl::runtime::{Buffer, Device, Graph, LaunchConfig, Readback};

use super::kernels::{
    SampleCheckArgs, SampleCheckConsts, SampleDrawArgs, SampleDrawConsts, SamplePickArgs,
    SamplePickConsts, SampleTopkMassArgs, SampleTopkMassConsts, SampleTopkPartArgs,
    SampleTopkPartConsts,
};
use super::Sampling;
use crate::error::{EngineError, Result};
use crate::tuning;

/// Draws per step of device-side sampling (`R` of [`super::kernels::sample_draw`]):
/// a step falls back to the host only when all of them land outside top-k/top-p.
const SAMPLE_STREAMS: usize = 4;

/// The buffers of device-side sampling, and its launches recorded as a graph while steps
/// replay one.
pub(crate) struct DeviceSampler {
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
    /// Buffers for a vocabulary of `vocab` tokens; fails past the widest compiled
    /// reduction.
    pub(crate) fn new(dev: &Device, vocab: usize) -> Result<DeviceSampler> {
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

    /// Queues a draw from `logits` by `params` into `state` and the copy of its outcome,
    /// without waiting (see [`crate::Decoder::queue_device_sample`]). `replay`: steps
    /// replay a graph, and so does the draw (recorded on first use of its kernel set).
    pub(crate) fn queue(
        &mut self,
        dev: &Device,
        params: &Sampling,
        logits: &Buffer<f32>,
        state: &mut Buffer<i32>,
        replay: bool,
    ) -> Result<()> {
        params.validate()?;
        let vocab = logits.len();
        if !params.device_can_sample(vocab) {
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
        if self.uploaded.as_ref() != Some(params) {
            self.fparams
                .copy_from_host(&[params.temperature, params.top_p])?;
            let seed = (params.seed ^ (params.seed >> 32)) as u32 as i32;
            self.iparams
                .copy_from_host(&[params.top_k.min(i32::MAX as usize) as i32, seed])?;
            self.uploaded = Some(params.clone());
        }
        let mass = params.top_k > 0 && params.top_p < 1.0;
        if !replay {
            self.draw(dev, logits, state, mass)?;
        } else if let Some((_, graph)) = self.graph.as_ref().filter(|(m, _)| *m == mass) {
            graph.launch()?;
        } else {
            // Steps replay a graph: so does the draw. The first one of this kernel set
            // runs eagerly (loading its kernels), then the same launches are recorded.
            self.graph = None;
            self.draw(dev, logits, state, mass)?;
            let graph = dev.capture(|| self.draw(dev, logits, state, mass))?;
            self.graph = Some((mass, graph));
        }
        self.result_readback.enqueue(&self.result)?;
        Ok(())
    }

    /// Waits for the outcome of the draw [`DeviceSampler::queue`] queued: the token, or
    /// `None` when the host must draw.
    pub(crate) fn take(&self) -> Result<Option<u32>> {
        let out = self.result_readback.wait()?;
        Ok((out[1] == 0).then_some(out[0] as u32))
    }

    /// Queues the draw's launches: Gumbel-max draws, their ranks and masses, the top-k
    /// mass when `mass` (top-k with top-p), and the pick into `state` and `result`.
    fn draw(
        &mut self,
        dev: &Device,
        logits: &Buffer<f32>,
        state: &mut Buffer<i32>,
        mass: bool,
    ) -> Result<()> {
        let vocab = logits.len();
        let (b, r, pb) = (tuning::SAMPLE_BLOCK, SAMPLE_STREAMS, self.reduce);
        let parts = self.parts as i32;
        // Serialized: it reads what the whole step wrote.
        let grid =
            |programs: usize, warps: u32| LaunchConfig::from(programs as u32).num_warps(warps);
        SampleDrawArgs {
            logits,
            fparams: &self.fparams,
            iparams: &self.iparams,
            state,
            part_val: &mut self.part_val,
            part_idx: &mut self.part_idx,
            n: vocab as i32,
        }
        .launch(
            dev,
            grid(self.parts, 4).serialized(),
            SampleDrawConsts { b, r },
        )?;
        SampleCheckArgs {
            logits,
            fparams: &self.fparams,
            state,
            part_val: &self.part_val,
            part_idx: &self.part_idx,
            cnt: &mut self.cnt,
            mass: &mut self.mass,
            z: &mut self.z,
            n: vocab as i32,
            parts,
        }
        .launch(dev, grid(self.parts, 4), SampleCheckConsts { b, r, pb })?;
        if mass {
            let km = tuning::SAMPLE_TOP_K_MAX;
            let lists = vocab.div_ceil(tuning::SAMPLE_TOP_K_BLOCK);
            SampleTopkPartArgs {
                logits,
                iparams: &self.iparams,
                part_top: &mut self.part_top,
                n: vocab as i32,
            }
            .launch(
                dev,
                grid(lists, 8),
                SampleTopkPartConsts {
                    b: tuning::SAMPLE_TOP_K_BLOCK,
                    km,
                },
            )?;
            SampleTopkMassArgs {
                logits,
                fparams: &self.fparams,
                iparams: &self.iparams,
                state,
                part_top: &self.part_top,
                zk: &mut self.zk,
                parts: lists as i32,
            }
            .launch(
                dev,
                grid(1, 8),
                SampleTopkMassConsts {
                    f: tuning::SAMPLE_TOP_K_MERGE,
                    km,
                },
            )?;
        }
        SamplePickArgs {
            fparams: &self.fparams,
            iparams: &self.iparams,
            state,
            part_val: &self.part_val,
            part_idx: &self.part_idx,
            cnt: &self.cnt,
            mass: &self.mass,
            z: &self.z,
            zk: &self.zk,
            result: &mut self.result,
            parts,
        }
        .launch(dev, grid(1, 4), SamplePickConsts { r, pb })?;
        Ok(())
    }
}
