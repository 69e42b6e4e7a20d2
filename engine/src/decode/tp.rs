//! Tensor-parallel decoding: one [`Decoder`] a rank, each over its shard of the model
//! ([`crate::tp`]), exchanging partial sums through a [`Communicator`].
//!
//! Rank `r` runs its layers as the one-GPU step does, except that the O and down
//! projections write f32 partial sums ([`super::tp_kernels::gemv_partial`]) which an
//! all-reduce adds across the ranks before every rank applies the same residual update
//! ([`super::tp_kernels::residual_add`]), and that the LM head's candidates are merged across
//! the ranks ([`super::tp_kernels::argmax_pair`], an all-gather, [`super::tp_kernels::merge_pairs`])
//! so every rank's `state` holds the same next token. On two GPUs with peer access the
//! all-reduce and the residual update are one kernel a rank that reads the other
//! rank's partial sums straight from its memory ([`super::tp_kernels::peer_residual_add`],
//! [`AllReduce::Peer`], the default there), and the token merge likewise
//! ([`super::tp_kernels::peer_merge_pairs`]); NCCL stays selectable
//! (`TILEFUSE_ALLREDUCE=nccl`, [`TpDecoder::set_all_reduce`]). One thread issues every rank's
//! launches, part by part between the collectives; on GPUs the whole step of each rank
//! can be captured as one graph ([`TpDecoder::capture`]). On CPU devices the ranks run
//! on the interpreter and the collectives go through host memory, which is how the
//! split is tested without GPUs (the tests below).

use std::ops::Range;

use half::bf16;
use tilefuse_dsl::runtime::{Buffer, Device, Graph, LaunchConfig};

use super::matrix::Matrix;
use super::tp_kernels::{
    ArgmaxPairArgs, ArgmaxPairConsts, GemvPartialArgs, GemvPartialConsts, MergePairsArgs,
    MergePairsConsts, PeerMergePairsArgs, PeerMergePairsConsts, PeerResidualAddArgs,
    PeerResidualAddConsts, ResidualAddArgs, ResidualAddConsts,
};
use super::{Block, Decoder, DeviceWeights, LayerBuffers, QuantWeights};
use crate::comm::{capture_all, launch_all, Communicator};
use crate::config::ModelConfig;
use crate::device_init::random_fill_block;
use crate::error::{EngineError, Result};
use crate::model::ModelWeights;
use crate::preset::RandomTensor;
use crate::tp::{shard_weights, TpPlan};
use crate::tuning::GemvConfig;

/// The most ranks a split has: [`super::tp_kernels::merge_pairs`] reads the ranks'
/// candidates as one tile of this many.
pub const MAX_RANKS: usize = 16;

/// How a split's all-reduces (and its token merge) run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllReduce {
    /// Through the [`Communicator`]: NCCL collectives on GPUs (captured into each
    /// rank's graph), copies through host memory on interpreter ranks.
    Nccl,
    /// Two GPU ranks with peer access: one kernel a rank reads the other's partial
    /// sums over NVLink, adds, and updates the residual
    /// ([`super::tp_kernels::peer_residual_add`]); no NCCL.
    Peer,
}

impl AllReduce {
    /// `"nccl"` or `"peer"`.
    pub fn name(self) -> &'static str {
        match self {
            AllReduce::Nccl => "nccl",
            AllReduce::Peer => "peer",
        }
    }

    /// Parses `"nccl"` or `"peer"`.
    pub fn parse(s: &str) -> Result<AllReduce> {
        match s.trim().to_ascii_lowercase().as_str() {
            "nccl" => Ok(AllReduce::Nccl),
            "peer" => Ok(AllReduce::Peer),
            other => Err(EngineError::Option {
                message: format!("unknown all-reduce `{other}`: expected `nccl` or `peer`"),
            }),
        }
    }

    /// The choice in `TILEFUSE_ALLREDUCE`, if set.
    pub fn from_env() -> Result<Option<AllReduce>> {
        match std::env::var("TILEFUSE_ALLREDUCE") {
            Ok(v) if !v.trim().is_empty() => AllReduce::parse(&v).map(Some),
            _ => Ok(None),
        }
    }
}

/// Elements of `hidden` each program of [`super::tp_kernels::peer_residual_add`]
/// reduces: `TILEFUSE_PEER_BLOCK` (256, 512, 1024 or 2048), else 512.
fn peer_block() -> usize {
    std::env::var("TILEFUSE_PEER_BLOCK")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|b| [256, 512, 1024, 2048].contains(b))
        .unwrap_or(512)
}

/// A rank's flags for the peer exchanges ([`AllReduce::Peer`]): one a program of
/// [`super::tp_kernels::peer_residual_add`] at its smallest block, and the last for
/// the token merge.
struct PeerFlags {
    /// Exchanges each program has started (only this rank writes them).
    count: Buffer<i32>,
    /// Written by the other rank: the exchange its program has started.
    inbox: Buffer<i32>,
}

/// Flags on every rank when the split is two GPUs that can reach each other's memory
/// (peer access enabled both ways), else `None`.
fn peer_flags(devices: &[Device], hidden: usize) -> Result<Option<Vec<PeerFlags>>> {
    if devices.len() != 2 || !devices.iter().all(|d| d.is_cuda()) {
        return Ok(None);
    }
    if !(devices[0].enable_peer_access(&devices[1])?
        && devices[1].enable_peer_access(&devices[0])?)
    {
        return Ok(None);
    }
    let slots = hidden.div_ceil(256) + 1;
    devices
        .iter()
        .map(|d| {
            Ok(PeerFlags {
                count: d.zeros(slots)?,
                inbox: d.zeros(slots)?,
            })
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

/// The peer flags of a split of `size` ranks, or the error of a peer exchange asked of
/// a split without peer access.
fn peer_flags_of(peer: &mut Option<Vec<PeerFlags>>, size: usize) -> Result<&mut [PeerFlags]> {
    peer.as_deref_mut()
        .ok_or_else(|| EngineError::TensorParallel {
            size,
            message: "no peer access between the ranks".into(),
        })
}

/// A rank's buffers beyond its decoder's.
struct RankBuffers {
    /// The split projections' partial sums, `[hidden]` each: the O projection's in the
    /// first, the down projection's in the second, so consecutive all-reduces
    /// alternate (a peer may still read the previous one's while this rank writes).
    partial: [Buffer<f32>; 2],
    /// This rank's greedy candidate `[logit, token]`.
    pair: Buffer<f32>,
    /// Every rank's candidates, gathered.
    pairs: Buffer<f32>,
}

/// Which collectives a step issues (timing a step without them measures what they
/// cost: [`TpDecoder::step_without_collectives`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Collectives {
    On,
    Off,
}

/// A model split over several devices (tensor parallelism), decoding as one.
pub struct TpDecoder {
    /// One graph a rank, when captured (dropped first: see `Drop`).
    graphs: Option<Vec<Graph>>,
    cfg: ModelConfig,
    plan: TpPlan,
    ranks: Vec<Decoder>,
    bufs: Vec<RankBuffers>,
    devices: Vec<Device>,
    /// NCCL or host collectives; `None` when NCCL is missing and the peer exchange
    /// does everything (`comm_error` says why).
    comm: Option<Communicator>,
    comm_error: Option<String>,
    all_reduce: AllReduce,
    peer: Option<Vec<PeerFlags>>,
    peer_block: usize,
}

impl Drop for TpDecoder {
    /// Graphs holding captured collectives go before the communicators: destroying an
    /// NCCL communicator while graphs of it live hung on two H200s (docs/gpu-results.md).
    fn drop(&mut self) {
        let _ = self.synchronize();
        self.graphs = None;
    }
}

impl std::fmt::Debug for TpDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TpDecoder")
            .field("ranks", &self.ranks)
            .field("all_reduce", &self.all_reduce)
            .field("graphs", &self.graphs.is_some())
            .finish()
    }
}

/// The compiled [`tp_kernels::gemv_partial`] variant nearest `c` (the rank's plan for
/// the O or down projection, chosen for `gemv_residual`, whose variants it mirrors
/// but for the pipelined `STAGES = 2`).
fn partial_config(c: GemvConfig) -> GemvConfig {
    use tilefuse_dsl::runtime::KernelConsts;
    let consts = |c: &GemvConfig| GemvPartialConsts {
        block_n: c.block_n,
        block_k: c.block_k,
        reduce_each: c.reduce_each,
    };
    if consts(&c).check(c.num_warps).is_ok() {
        return c;
    }
    GemvConfig::tile(8, 512, 4)
}

impl TpDecoder {
    /// The model `w` (checked against `cfg`) split over `devices` (one rank each, in
    /// order: distinct GPUs, or CPU devices for the interpreter), each with a KV cache
    /// of `max_seq_len` positions for its KV heads.
    pub fn new(
        cfg: &ModelConfig,
        w: &ModelWeights<'_>,
        devices: &[Device],
        max_seq_len: usize,
    ) -> Result<TpDecoder> {
        w.validate(cfg)?;
        let plan = TpPlan::new(cfg, devices.len())?;
        let mut weights = Vec::with_capacity(devices.len());
        for (r, dev) in devices.iter().enumerate() {
            let s = shard_weights(cfg, &plan, w, r);
            weights.push(DeviceWeights::upload(
                dev,
                &s.embed_tokens,
                Some(&s.lm_head),
                &s.norm,
                &s.layers,
                &QuantWeights::default(),
            )?);
        }
        TpDecoder::assemble(cfg, plan, weights, devices, max_seq_len)
    }

    /// A preset's seeded random weights (see [`crate::preset`]) split over `devices`,
    /// each rank's shard drawn on its own device ([`random_fill_block`]), so the whole
    /// model never exists in host memory. Equal to [`TpDecoder::new`] over
    /// [`crate::preset::random_weights`] (the tests).
    pub fn from_preset(
        cfg: &ModelConfig,
        seed: u64,
        devices: &[Device],
        max_seq_len: usize,
    ) -> Result<TpDecoder> {
        let plan = TpPlan::new(cfg, devices.len())?;
        let mut weights = Vec::with_capacity(devices.len());
        for (r, dev) in devices.iter().enumerate() {
            weights.push(random_rank_weights(cfg, &plan, r, dev, seed)?);
        }
        TpDecoder::assemble(cfg, plan, weights, devices, max_seq_len)
    }

    fn assemble(
        cfg: &ModelConfig,
        plan: TpPlan,
        weights: Vec<DeviceWeights>,
        devices: &[Device],
        max_seq_len: usize,
    ) -> Result<TpDecoder> {
        let n = devices.len();
        if n > MAX_RANKS {
            return Err(EngineError::TensorParallel {
                size: n,
                message: format!("at most {MAX_RANKS} ranks are supported (the token merge reads one tile of candidates)"),
            });
        }
        let peer = peer_flags(devices, cfg.hidden_size)?;
        let (comm, comm_error) = match Communicator::new(devices) {
            Ok(c) => (Some(c), None),
            // Two GPUs that reach each other need no NCCL.
            Err(e) if peer.is_some() => (None, Some(e.to_string())),
            Err(e) => return Err(e),
        };
        let all_reduce = match AllReduce::from_env()? {
            Some(AllReduce::Peer) if peer.is_none() => return Err(EngineError::TensorParallel {
                size: n,
                message:
                    "TILEFUSE_ALLREDUCE=peer needs two GPUs with peer access to each other's memory"
                        .into(),
            }),
            Some(mode) => mode,
            None if peer.is_some() => AllReduce::Peer,
            None => AllReduce::Nccl,
        };
        let mut ranks = Vec::with_capacity(n);
        let mut bufs = Vec::with_capacity(n);
        for ((r, dev), w) in devices.iter().enumerate().zip(weights) {
            let rc = plan.rank_config(cfg, r);
            ranks.push(Decoder::from_device(&rc, w, dev, max_seq_len)?);
            bufs.push(RankBuffers {
                partial: [dev.zeros(cfg.hidden_size)?, dev.zeros(cfg.hidden_size)?],
                pair: dev.zeros(2)?,
                pairs: dev.zeros(2 * n)?,
            });
        }
        Ok(TpDecoder {
            cfg: cfg.clone(),
            plan,
            ranks,
            bufs,
            devices: devices.to_vec(),
            comm,
            comm_error,
            all_reduce,
            peer,
            peer_block: peer_block(),
            graphs: None,
        })
    }

    /// How the all-reduces run now.
    pub fn all_reduce(&self) -> AllReduce {
        self.all_reduce
    }

    /// The all-reduces this split can run: NCCL (or host collectives) when the
    /// library loaded, the peer exchange when the ranks reach each other.
    pub fn available_all_reduces(&self) -> Vec<AllReduce> {
        let mut modes = Vec::new();
        if self.comm.is_some() {
            modes.push(AllReduce::Nccl);
        }
        if self.peer.is_some() {
            modes.push(AllReduce::Peer);
        }
        modes
    }

    /// Whether [`AllReduce::Peer`] can be chosen (two GPUs with peer access).
    pub fn peer_available(&self) -> bool {
        self.peer.is_some()
    }

    /// Chooses how the all-reduces run; drops captured graphs (capture again).
    /// Errors: `Peer` without peer access, `Nccl` without the NCCL library.
    pub fn set_all_reduce(&mut self, mode: AllReduce) -> Result<()> {
        match mode {
            AllReduce::Peer if self.peer.is_none() => {
                return Err(EngineError::TensorParallel {
                    size: self.size(),
                    message:
                        "the peer all-reduce needs two GPUs with peer access to each other's memory"
                            .into(),
                })
            }
            AllReduce::Nccl if self.comm.is_none() => {
                return Err(EngineError::Communication {
                    message: self.comm_error.clone().unwrap_or_default(),
                })
            }
            _ => {}
        }
        self.synchronize()?;
        self.graphs = None;
        self.all_reduce = mode;
        Ok(())
    }

    /// The whole model's config.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// The split.
    pub fn plan(&self) -> &TpPlan {
        &self.plan
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.ranks.len()
    }

    /// Rank `r`'s decoder (its shard's config, plan and buffers).
    pub fn rank(&self, r: usize) -> &Decoder {
        &self.ranks[r]
    }

    /// The KV cache's capacity in positions.
    pub fn max_seq_len(&self) -> usize {
        self.ranks[0].max_seq_len()
    }

    /// Bytes of weights each rank reads a step, in rank order.
    pub fn weight_bytes_per_step(&self) -> Vec<usize> {
        self.ranks
            .iter()
            .map(|d| d.weight_bytes_per_step())
            .collect()
    }

    /// Bytes of KV cache each rank reads a step at context `len`, in rank order.
    pub fn kv_bytes_per_step(&self, len: usize) -> Vec<usize> {
        self.ranks
            .iter()
            .map(|d| d.kv_bytes_per_step(len))
            .collect()
    }

    /// Sets every rank's input: `token` at position `pos`.
    pub fn set_input(&mut self, token: u32, pos: usize) -> Result<()> {
        if token as usize >= self.cfg.vocab_size {
            return Err(EngineError::TokenOutOfRange {
                token,
                vocab: self.cfg.vocab_size,
            });
        }
        if pos >= self.max_seq_len() {
            return Err(EngineError::TooLong {
                prompt: pos + 1,
                new: 0,
                max: self.max_seq_len(),
            });
        }
        for d in &mut self.ranks {
            d.s.state.copy_from_host(&[token as i32, pos as i32])?;
        }
        Ok(())
    }

    /// Runs one step on every rank: the captured graphs if any, else launch by launch.
    pub fn step(&mut self) -> Result<()> {
        match &self.graphs {
            Some(graphs) => launch_all(graphs),
            None => self.step_eager(),
        }
    }

    /// Runs one step launch by launch (asynchronous on GPUs).
    pub fn step_eager(&mut self) -> Result<()> {
        self.issue_step(Collectives::On)
    }

    /// A step with the collectives left out (each rank adds only its own partial
    /// sums, so the result is meaningless): what a step costs without communication,
    /// for measuring the all-reduces' share. Leaves the model's state meaningless.
    pub fn step_without_collectives(&mut self) -> Result<()> {
        self.issue_step(Collectives::Off)
    }

    /// Captures one step of every rank, one graph a rank (running a step eagerly first
    /// so kernels are loaded and NCCL has connected; `state` is restored after it).
    /// Afterwards [`TpDecoder::step`] replays them. Fails on CPU devices and when the
    /// capture fails; nothing falls back silently.
    pub fn capture(&mut self) -> Result<()> {
        self.graphs = None;
        let saved = self.ranks[0].s.state.to_vec()?;
        if self.all_reduce == AllReduce::Peer {
            // Loads every kernel but the exchange's first, so neither rank waits on
            // its peer while the other loads modules.
            self.issue_step(Collectives::Off)?;
            self.synchronize()?;
            for d in &mut self.ranks {
                d.s.state.copy_from_host(&saved)?;
            }
        }
        self.issue_step(Collectives::On)?;
        for d in &mut self.ranks {
            d.s.state.copy_from_host(&saved)?;
        }
        self.synchronize()?;
        let devices = self.devices.clone();
        let graphs = capture_all(&devices, || self.issue_step(Collectives::On))?;
        self.graphs = Some(graphs);
        Ok(())
    }

    /// Captures the step without its collectives (see
    /// [`TpDecoder::step_without_collectives`]) as graphs, for timing; they are
    /// returned, not kept.
    pub fn capture_without_collectives(&mut self) -> Result<Vec<Graph>> {
        let devices = self.devices.clone();
        capture_all(&devices, || self.issue_step(Collectives::Off))
    }

    /// Drops captured graphs; steps launch kernels one by one again.
    pub fn release_graph(&mut self) {
        self.graphs = None;
    }

    /// Whether steps replay captured graphs.
    pub fn uses_graph(&self) -> bool {
        self.graphs.is_some()
    }

    /// Waits for every rank's queued work.
    pub fn synchronize(&self) -> Result<()> {
        for d in &self.devices {
            d.synchronize()?;
        }
        Ok(())
    }

    /// Queues a copy of rank 0's `state` (every rank's is the same) without waiting.
    pub fn queue_state_read(&mut self) -> Result<()> {
        self.ranks[0].queue_state_read()
    }

    /// Waits for the copy [`TpDecoder::queue_state_read`] queued: `(token, next
    /// position)`.
    pub fn take_state(&self) -> Result<(u32, usize)> {
        self.ranks[0].take_state()
    }

    /// Waits for the step and reads rank 0's `state`: the greedy next token and the
    /// next position.
    pub fn read_state(&self) -> Result<(u32, usize)> {
        self.synchronize()?;
        self.ranks[0].read_state()
    }

    /// Waits for the step and returns the whole vocabulary's logits (the ranks'
    /// shards in rank order).
    pub fn read_logits(&self) -> Result<Vec<f32>> {
        let mut out = Vec::with_capacity(self.cfg.vocab_size);
        for d in &self.ranks {
            out.extend(d.read_logits()?);
        }
        Ok(out)
    }

    /// Decodes `token` at `pos` and returns the logits for the next token.
    pub fn forward(&mut self, token: u32, pos: usize) -> Result<Vec<f32>> {
        self.set_input(token, pos)?;
        self.step()?;
        self.read_logits()
    }

    /// Every rank's launches of one step, part by part between the collectives.
    fn issue_step(&mut self, collectives: Collectives) -> Result<()> {
        let layers = self.cfg.num_layers;
        for d in &mut self.ranks {
            d.step_part(|b| b == Block::Embed, 0..0, true)?;
        }
        for l in 0..layers {
            let attention = |b| matches!(b, Block::Qkv | Block::Attention | Block::Combine);
            for (d, b) in self.ranks.iter_mut().zip(&mut self.bufs) {
                d.step_part(attention, l..l + 1, false)?;
                partial_gemv(d, b, l, Projection::O)?;
            }
            self.reduce_and_update(collectives, Some(l), Projection::O)?;
            for (d, b) in self.ranks.iter_mut().zip(&mut self.bufs) {
                d.step_part(|b| b == Block::GateUp, l..l + 1, false)?;
                partial_gemv(d, b, l, Projection::Down)?;
            }
            self.reduce_and_update(collectives, None, Projection::Down)?;
        }
        for ((r, d), b) in self.ranks.iter_mut().enumerate().zip(&mut self.bufs) {
            d.step_part(|b| b == Block::LmHead, 0..0, false)?;
            let offset = self.plan.rank(r).vocab.start;
            candidate(d, b, offset)?;
        }
        if collectives == Collectives::On && self.all_reduce == AllReduce::Peer {
            return self.peer_merge();
        }
        if collectives == Collectives::On {
            let (sends, mut recvs): (Vec<&Buffer<f32>>, Vec<&mut Buffer<f32>>) = self
                .bufs
                .iter_mut()
                .map(|b| (&b.pair, &mut b.pairs))
                .unzip();
            let comm = self
                .comm
                .as_ref()
                .ok_or_else(|| EngineError::Communication {
                    message: self.comm_error.clone().unwrap_or_default(),
                })?;
            comm.all_gather(&sends, &mut recvs)?;
        }
        let n = self.size() as i32;
        for (d, b) in self.ranks.iter_mut().zip(&mut self.bufs) {
            let dev = d.dev.clone();
            MergePairsArgs {
                pairs: &b.pairs,
                ranks: n,
                state: &mut d.s.state,
            }
            .launch(
                &dev,
                LaunchConfig::grid([1, 1, 1]).num_warps(1),
                MergePairsConsts { b: MAX_RANKS },
            )?;
        }
        Ok(())
    }

    /// The all-reduce of every rank's partial sums of `p` (skipped when timing
    /// without it), then each rank's residual update with layer `o_bias_of`'s O bias
    /// (`None`: no bias): one peer kernel a rank, or a collective and a kernel a rank.
    fn reduce_and_update(
        &mut self,
        collectives: Collectives,
        o_bias_of: Option<usize>,
        p: Projection,
    ) -> Result<()> {
        let slot = p.slot();
        if collectives == Collectives::On && self.all_reduce == AllReduce::Peer {
            return self.peer_reduce(o_bias_of, slot);
        }
        if collectives == Collectives::On {
            let comm = self
                .comm
                .as_ref()
                .ok_or_else(|| EngineError::Communication {
                    message: self.comm_error.clone().unwrap_or_default(),
                })?;
            let mut parts: Vec<&mut Buffer<f32>> =
                self.bufs.iter_mut().map(|b| &mut b.partial[slot]).collect();
            comm.all_reduce_sum(&mut parts)?;
        }
        for (d, b) in self.ranks.iter_mut().zip(&self.bufs) {
            residual(d, &b.partial[slot], o_bias_of)?;
        }
        Ok(())
    }

    /// Rank `r`'s flags, and the other rank's (whose inbox `r` signals).
    fn flags_of(flags: &mut [PeerFlags], r: usize) -> (&mut PeerFlags, &mut PeerFlags) {
        let (lo, hi) = flags.split_at_mut(1);
        if r == 0 {
            (&mut lo[0], &mut hi[0])
        } else {
            (&mut hi[0], &mut lo[0])
        }
    }

    /// [`super::tp_kernels::peer_residual_add`] on both ranks over partial buffer `slot`.
    fn peer_reduce(&mut self, o_bias_of: Option<usize>, slot: usize) -> Result<()> {
        let n = self.size();
        let flags = peer_flags_of(&mut self.peer, n)?;
        let block = self.peer_block;
        for r in 0..2 {
            let (me, other) = TpDecoder::flags_of(flags, r);
            let d = &mut self.ranks[r];
            let dev = d.dev.clone();
            let h = d.cfg.hidden_size;
            let bias = match o_bias_of {
                Some(l) => &d.layers[l].o_b,
                None => &d.s.zeros,
            };
            PeerResidualAddArgs {
                mine: &self.bufs[r].partial[slot],
                theirs: &self.bufs[1 - r].partial[slot],
                count: &mut me.count,
                outbox: &mut other.inbox,
                inbox: &me.inbox,
                bias,
                x: &mut d.s.x,
                n: h as i32,
            }
            .launch(
                &dev,
                LaunchConfig::grid([h.div_ceil(block) as u32, 1, 1]).num_warps(4),
                PeerResidualAddConsts { b: block },
            )?;
        }
        Ok(())
    }

    /// [`super::tp_kernels::peer_merge_pairs`] on both ranks (the last flag slot).
    fn peer_merge(&mut self) -> Result<()> {
        let n = self.size();
        let flags = peer_flags_of(&mut self.peer, n)?;
        for r in 0..2 {
            let (me, other) = TpDecoder::flags_of(flags, r);
            let slot = me.count.len() - 1;
            let d = &mut self.ranks[r];
            let dev = d.dev.clone();
            PeerMergePairsArgs {
                first: &self.bufs[0].pair,
                second: &self.bufs[1].pair,
                count: &mut me.count,
                outbox: &mut other.inbox,
                inbox: &me.inbox,
                slot: slot as i32,
                state: &mut d.s.state,
            }
            .launch(
                &dev,
                LaunchConfig::grid([1, 1, 1]).num_warps(1),
                PeerMergePairsConsts {},
            )?;
        }
        Ok(())
    }
}

/// The O or down projection.
#[derive(Clone, Copy)]
enum Projection {
    O,
    Down,
}

impl Projection {
    /// The partial-sum buffer its GEMV writes (the two alternate).
    fn slot(self) -> usize {
        match self {
            Projection::O => 0,
            Projection::Down => 1,
        }
    }
}

/// `partial = W_r a_r` for layer `l`'s O or down projection, in f32.
fn partial_gemv(d: &mut Decoder, b: &mut RankBuffers, l: usize, p: Projection) -> Result<()> {
    let c = &d.cfg;
    let layer = &d.layers[l];
    let (w, a, k, chosen) = match p {
        Projection::O => (&layer.o_w, &d.s.attn, c.q_dim(), d.plan.o_proj),
        Projection::Down => (&layer.down_w, &d.s.act, c.intermediate_size, d.plan.down),
    };
    let w = w.dense().ok_or_else(|| EngineError::Option {
        message: format!("layer {l}: a split model's projections must be bf16, not quantized"),
    })?;
    let g = partial_config(chosen);
    let n = c.hidden_size;
    GemvPartialArgs {
        w,
        a,
        out: &mut b.partial[p.slot()],
        n: n as i32,
        k: k as i32,
    }
    .launch(
        &d.dev,
        LaunchConfig::grid([n.div_ceil(g.block_n) as u32, 1, 1]).num_warps(g.num_warps),
        GemvPartialConsts {
            block_n: g.block_n,
            block_k: g.block_k,
            reduce_each: g.reduce_each,
        },
    )?;
    Ok(())
}

/// `x = bf16(x + bf16(sum + bias))` after a reduction: layer `l`'s O bias, or no
/// bias (`None`, after the down projection).
fn residual(d: &mut Decoder, sum: &Buffer<f32>, o_bias_of: Option<usize>) -> Result<()> {
    let h = d.cfg.hidden_size;
    let bias = match o_bias_of {
        Some(l) => &d.layers[l].o_b,
        None => &d.s.zeros,
    };
    ResidualAddArgs {
        sum,
        bias,
        x: &mut d.s.x,
        n: h as i32,
    }
    .launch(
        &d.dev,
        LaunchConfig::grid([h.div_ceil(1024) as u32, 1, 1]).num_warps(4),
        ResidualAddConsts { b: 1024 },
    )?;
    Ok(())
}

/// The rank's greedy candidate from its LM head's per-program candidates, with the
/// token offset into the whole vocabulary.
fn candidate(d: &mut Decoder, b: &mut RankBuffers, offset: usize) -> Result<()> {
    let parts = d.plan.lm_programs(d.cfg.vocab_size);
    let argmax = d.plan.argmax;
    ArgmaxPairArgs {
        part_val: &d.s.part_val,
        part_idx: &d.s.part_idx,
        pair: &mut b.pair,
        parts: parts as i32,
        offset: offset as i32,
    }
    .launch(
        &d.dev,
        LaunchConfig::grid([1, 1, 1]).num_warps(argmax.num_warps),
        ArgmaxPairConsts { b: argmax.consts.b },
    )?;
    Ok(())
}

/// Rank `r`'s shard of a preset's random weights, drawn on `dev` in the kernels'
/// layout (fused `[q; k; v]` and `[gate; up]` rows): the values of
/// [`shard_weights`] over [`crate::preset::random_weights`].
pub(crate) fn random_rank_weights(
    cfg: &ModelConfig,
    plan: &TpPlan,
    r: usize,
    dev: &Device,
    seed: u64,
) -> Result<DeviceWeights> {
    let specs: std::collections::HashMap<String, RandomTensor> = crate::preset::random_tensors(cfg)
        .into_iter()
        .map(|t| (t.name.clone(), t))
        .collect();
    let spec = |name: &str| -> Result<&RandomTensor> {
        specs.get(name).ok_or_else(|| EngineError::Option {
            message: format!("preset has no tensor `{name}`"),
        })
    };
    let s = plan.rank(r);
    let (h, hd, im) = (cfg.hidden_size, cfg.head_dim, cfg.intermediate_size);
    let qd = cfg.q_dim();
    let q_rows = s.heads.start * hd..s.heads.end * hd;
    let kv_rows = s.kv_heads.start * hd..s.kv_heads.end * hd;
    // Blocks `(tensor, row length, rows, columns)` written one after another.
    let fill = |blocks: &[(&str, usize, Range<usize>, Range<usize>)]| -> Result<Buffer<bf16>> {
        let len = blocks.iter().map(|b| b.2.len() * b.3.len()).sum();
        let mut out = dev.zeros::<bf16>(len)?;
        let mut offset = 0;
        for (name, row_len, rows, cols) in blocks {
            let t = spec(name)?;
            random_fill_block(
                dev,
                &mut out,
                offset,
                t,
                seed,
                *row_len,
                rows.clone(),
                cols.clone(),
            )?;
            offset += rows.len() * cols.len();
        }
        Ok(out)
    };
    let whole = |name: &str| -> Result<Buffer<bf16>> {
        let t = spec(name)?;
        fill(&[(name, t.len, 0..1, 0..t.len)])
    };
    let mut layers = Vec::with_capacity(cfg.num_layers);
    for i in 0..cfg.num_layers {
        let n = |t: &str| format!("model.layers.{i}.{t}");
        let (q, k, v) = (
            n("self_attn.q_proj.weight"),
            n("self_attn.k_proj.weight"),
            n("self_attn.v_proj.weight"),
        );
        let qkv_b = if cfg.qkv_bias {
            Some(fill(&[
                (&n("self_attn.q_proj.bias"), 1, q_rows.clone(), 0..1),
                (&n("self_attn.k_proj.bias"), 1, kv_rows.clone(), 0..1),
                (&n("self_attn.v_proj.bias"), 1, kv_rows.clone(), 0..1),
            ])?)
        } else {
            None
        };
        let (gate, up) = (n("mlp.gate_proj.weight"), n("mlp.up_proj.weight"));
        layers.push(LayerBuffers {
            input_norm: whole(&n("input_layernorm.weight"))?,
            qkv_w: Matrix::Dense(fill(&[
                (&q, h, q_rows.clone(), 0..h),
                (&k, h, kv_rows.clone(), 0..h),
                (&v, h, kv_rows.clone(), 0..h),
            ])?),
            qkv_b,
            q_norm: match cfg.qk_norm {
                true => Some(whole(&n("self_attn.q_norm.weight"))?),
                false => None,
            },
            k_norm: match cfg.qk_norm {
                true => Some(whole(&n("self_attn.k_norm.weight"))?),
                false => None,
            },
            o_w: Matrix::Dense(fill(&[(
                &n("self_attn.o_proj.weight"),
                qd,
                0..h,
                q_rows.clone(),
            )])?),
            o_b: match cfg.o_bias {
                true => Some(whole(&n("self_attn.o_proj.bias"))?),
                false => None,
            },
            post_norm: whole(&n("post_attention_layernorm.weight"))?,
            gate_up_w: Matrix::Dense(fill(&[
                (&gate, h, s.intermediate.clone(), 0..h),
                (&up, h, s.intermediate.clone(), 0..h),
            ])?),
            down_w: Matrix::Dense(fill(&[(
                &n("mlp.down_proj.weight"),
                im,
                0..h,
                s.intermediate.clone(),
            )])?),
        });
    }
    let embed_name = "model.embed_tokens.weight";
    let head_name = if cfg.tie_word_embeddings {
        embed_name
    } else {
        "lm_head.weight"
    };
    let v = cfg.vocab_size;
    // One rank of a tied model reads its head from the embedding itself.
    let lm_head = if cfg.tie_word_embeddings && plan.size() == 1 {
        None
    } else {
        Some(fill(&[(head_name, h, s.vocab.clone(), 0..h)])?)
    };
    Ok(DeviceWeights {
        embed: fill(&[(embed_name, h, 0..v, 0..h)])?,
        lm_head,
        quant_head: None,
        final_norm: whole("model.norm.weight")?,
        layers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preset;
    use crate::tp::TpSimulation;

    /// Greedy decoding over `size` interpreter ranks against the one-device decoder
    /// and against [`TpSimulation`], over `steps` tokens after a 4-token prompt: the
    /// same tokens at every step, logits within bf16 tolerance. Returns the largest
    /// logit difference from the one-device decoder, relative to the largest logit.
    fn agrees_with_one_device(cfg: &ModelConfig, seed: u64, size: usize, steps: usize) -> f32 {
        let w = preset::random_weights(cfg, seed);
        let max_seq = 8 + steps;
        let mut one = Decoder::new(cfg, &w, &Device::cpu(), max_seq).unwrap();
        let devs = vec![Device::cpu(); size];
        let mut split = TpDecoder::new(cfg, &w, &devs, max_seq).unwrap();
        let mut sim = TpSimulation::new(cfg, &w, size).unwrap();
        let prompt = [1u32, 17, 42, 7];
        let mut worst = 0.0f32;
        let mut token = prompt[0];
        for pos in 0..prompt.len() + steps {
            if pos < prompt.len() {
                token = prompt[pos];
            }
            let want = one.forward(token, pos).unwrap();
            let got = split.forward(token, pos).unwrap();
            let simulated = sim.forward(token, pos).unwrap();
            assert_eq!(got.len(), cfg.vocab_size);
            let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let diff = |a: &[f32], b: &[f32]| {
                a.iter()
                    .zip(b)
                    .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()))
            };
            // bf16 keeps 8 significant bits: a few ulps of the largest logit.
            let d = diff(&want, &got);
            assert!(
                d <= scale * 2e-2,
                "pos {pos}, tp {size}: logits differ from one device's by {d} (largest {scale})"
            );
            let ds = diff(&simulated.logits, &got);
            assert!(
                ds <= scale * 2e-2,
                "pos {pos}, tp {size}: logits differ from the simulation's by {ds}"
            );
            worst = worst.max(d / scale);
            let (next, next_pos) = split.read_state().unwrap();
            let (one_next, _) = one.read_state().unwrap();
            assert_eq!(next_pos, pos + 1);
            assert_eq!(next, one_next, "pos {pos}, tp {size}: greedy token");
            assert_eq!(
                next, simulated.token,
                "pos {pos}, tp {size}: simulated token"
            );
            // Every rank holds the merged token.
            for r in 0..size {
                assert_eq!(
                    split.rank(r).read_state().unwrap(),
                    (next, pos + 1),
                    "rank {r}"
                );
            }
            token = next;
        }
        worst
    }

    #[test]
    fn two_ranks_agree_with_one_device_over_64_tokens() {
        let cfg = preset::config("tiny-qwen3").unwrap();
        let worst = agrees_with_one_device(&cfg, 3, 2, 64);
        eprintln!("tiny-qwen3, tp 2: largest logit difference {worst:.2e} of the largest");
    }

    #[test]
    fn four_ranks_with_biases_and_an_untied_odd_vocabulary_agree() {
        // Q/K/V and O biases, an untied head of 1001 rows (uneven shards), no QK-norm.
        let cfg = ModelConfig {
            num_heads: 4,
            num_kv_heads: 4,
            intermediate_size: 256,
            vocab_size: 1001,
            tie_word_embeddings: false,
            qkv_bias: true,
            o_bias: true,
            qk_norm: false,
            ..preset::config("tiny-qwen3").unwrap()
        };
        agrees_with_one_device(&cfg, 5, 4, 16);
    }

    /// One peer exchange on interpreter "ranks", in launch order: rank 1's signal is
    /// already in rank 0's inbox (as if it had run first), so rank 0 passes, and its
    /// own signal lets rank 1 pass; both get the host's residual update to the bit.
    #[test]
    fn peer_residual_add_adds_both_partials_and_signals_the_peer() {
        use super::super::tp_kernels::{
            PeerMergePairsArgs, PeerMergePairsConsts, PeerResidualAddArgs, PeerResidualAddConsts,
        };
        use crate::bench::workloads::Rng;
        let dev = Device::cpu();
        let (n, block) = (1000usize, 256usize);
        let programs = n.div_ceil(block);
        let mut rng = Rng::new(21);
        let mut f32s =
            |scale: f32| -> Vec<f32> { (0..n).map(|_| rng.uniform(-scale, scale)).collect() };
        let parts = [f32s(1.0), f32s(1.0)];
        let bias: Vec<bf16> = f32s(1.0).iter().map(|&v| bf16::from_f32(v)).collect();
        let x: Vec<bf16> = f32s(4.0).iter().map(|&v| bf16::from_f32(v)).collect();
        let want: Vec<bf16> = (0..n)
            .map(|i| {
                let proj = bf16::from_f32(parts[0][i] + parts[1][i] + bias[i].to_f32());
                bf16::from_f32(x[i].to_f32() + proj.to_f32())
            })
            .collect();
        let partial: Vec<Buffer<f32>> = parts.iter().map(|p| dev.upload(p).unwrap()).collect();
        let bias = dev.upload(&bias).unwrap();
        let mut xs: Vec<Buffer<bf16>> = (0..2).map(|_| dev.upload(&x).unwrap()).collect();
        let slots = programs + 1;
        let mut flags: Vec<PeerFlags> = (0..2)
            .map(|_| PeerFlags {
                count: dev.zeros(slots).unwrap(),
                inbox: dev.zeros(slots).unwrap(),
            })
            .collect();
        flags[0].inbox.copy_from_host(&vec![1; slots]).unwrap();
        let exchange = |r: usize, flags: &mut [PeerFlags], x: &mut Buffer<bf16>| {
            let (me, other) = TpDecoder::flags_of(flags, r);
            PeerResidualAddArgs {
                mine: &partial[r],
                theirs: &partial[1 - r],
                count: &mut me.count,
                outbox: &mut other.inbox,
                inbox: &me.inbox,
                bias: &bias,
                x,
                n: n as i32,
            }
            .launch(
                &dev,
                LaunchConfig::grid([programs as u32, 1, 1]).num_warps(4),
                PeerResidualAddConsts { b: block },
            )
        };
        exchange(0, &mut flags, &mut xs[0]).unwrap();
        let mut signaled = vec![1; programs];
        signaled.push(0);
        assert_eq!(flags[0].count.to_vec().unwrap(), signaled);
        assert_eq!(flags[1].inbox.to_vec().unwrap(), signaled);
        assert_eq!(xs[0].to_vec().unwrap(), want);
        let (x0, x1) = xs.split_at_mut(1);
        exchange(1, &mut flags, &mut x1[0]).unwrap();
        assert_eq!(
            x1[0].to_vec().unwrap(),
            want,
            "both ranks hold the same sum"
        );
        // Rank 0's next exchange: rank 1 has not signaled it, and in launch order
        // nothing can: an error, not a hang.
        let e = exchange(0, &mut flags, &mut x0[0]).unwrap_err().to_string();
        assert!(e.contains("to reach 2, but it holds 1"), "{e}");

        // The token merge: rank 1's logit is larger, so its token wins on both.
        let pairs = [
            dev.upload(&[2.5f32, 7.0]).unwrap(),
            dev.upload(&[3.0f32, 70.0]).unwrap(),
        ];
        let mut fresh: Vec<PeerFlags> = (0..2)
            .map(|_| PeerFlags {
                count: dev.zeros(slots).unwrap(),
                inbox: dev.zeros(slots).unwrap(),
            })
            .collect();
        fresh[0].inbox.copy_from_host(&vec![1; slots]).unwrap();
        for r in 0..2 {
            let mut state = dev.upload(&[0i32, 9]).unwrap();
            let (me, other) = TpDecoder::flags_of(&mut fresh, r);
            PeerMergePairsArgs {
                first: &pairs[0],
                second: &pairs[1],
                count: &mut me.count,
                outbox: &mut other.inbox,
                inbox: &me.inbox,
                slot: (slots - 1) as i32,
                state: &mut state,
            }
            .launch(
                &dev,
                LaunchConfig::grid([1, 1, 1]).num_warps(1),
                PeerMergePairsConsts {},
            )
            .unwrap();
            assert_eq!(state.to_vec().unwrap(), [70, 10], "rank {r}");
        }
    }

    #[test]
    fn interpreter_ranks_reduce_through_the_host_and_refuse_peer() {
        let cfg = preset::config("tiny-qwen3").unwrap();
        let w = preset::random_weights(&cfg, 2);
        let mut split = TpDecoder::new(&cfg, &w, &[Device::cpu(), Device::cpu()], 8).unwrap();
        assert_eq!(split.all_reduce(), AllReduce::Nccl);
        assert!(!split.peer_available());
        let e = split
            .set_all_reduce(AllReduce::Peer)
            .unwrap_err()
            .to_string();
        assert!(e.contains("peer access"), "{e}");
        assert_eq!(AllReduce::parse(" Peer").unwrap(), AllReduce::Peer);
        let e = AllReduce::parse("mpi").unwrap_err().to_string();
        assert!(e.contains("`mpi`") && e.contains("`nccl` or `peer`"), "{e}");
    }

    #[test]
    fn device_filled_shards_equal_the_host_preset_split() {
        let cfg = ModelConfig {
            qkv_bias: true,
            o_bias: true,
            tie_word_embeddings: false,
            ..preset::config("tiny-qwen3").unwrap()
        };
        let w = preset::random_weights(&cfg, 11);
        let plan = TpPlan::new(&cfg, 2).unwrap();
        let dev = Device::cpu();
        for r in 0..2 {
            let got = random_rank_weights(&cfg, &plan, r, &dev, 11).unwrap();
            let s = shard_weights(&cfg, &plan, &w, r);
            let want = DeviceWeights::upload(
                &dev,
                &s.embed_tokens,
                Some(&s.lm_head),
                &s.norm,
                &s.layers,
                &QuantWeights::default(),
            )
            .unwrap();
            let same = |a: &Buffer<bf16>, b: &Buffer<bf16>, what: &str| {
                assert_eq!(a.to_vec().unwrap(), b.to_vec().unwrap(), "rank {r}: {what}")
            };
            fn dense(m: &Matrix) -> &Buffer<bf16> {
                m.dense().expect("a split model's matrices are dense")
            }
            same(&got.embed, &want.embed, "embedding");
            same(
                got.lm_head.as_ref().unwrap(),
                want.lm_head.as_ref().unwrap(),
                "LM head",
            );
            same(&got.final_norm, &want.final_norm, "final norm");
            for (l, (g, e)) in got.layers.iter().zip(&want.layers).enumerate() {
                same(dense(&g.qkv_w), dense(&e.qkv_w), &format!("layer {l} qkv"));
                same(
                    g.qkv_b.as_ref().unwrap(),
                    e.qkv_b.as_ref().unwrap(),
                    "qkv bias",
                );
                same(dense(&g.o_w), dense(&e.o_w), &format!("layer {l} o"));
                same(g.o_b.as_ref().unwrap(), e.o_b.as_ref().unwrap(), "o bias");
                same(
                    dense(&g.gate_up_w),
                    dense(&e.gate_up_w),
                    &format!("layer {l} gate/up"),
                );
                same(
                    dense(&g.down_w),
                    dense(&e.down_w),
                    &format!("layer {l} down"),
                );
                same(&g.input_norm, &e.input_norm, "input norm");
                same(&g.post_norm, &e.post_norm, "post norm");
                same(
                    g.q_norm.as_ref().unwrap(),
                    e.q_norm.as_ref().unwrap(),
                    "q norm",
                );
            }
        }
    }
}
