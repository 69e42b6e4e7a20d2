//! The workloads the kernel measurements time (`examples/bandwidth.rs`,
//! `benches/kernels.rs`): one decode kernel at one shape, with enough buffer sets to
//! exceed 4× the L2 cache ([`rotation_sets`]) so the numbers are HBM, not L2, and seeded
//! random data ([`Rng`]). Timing itself is the runtime's
//! ([`tilefuse_dsl::runtime::timing`]); the method is in docs/perf.md ("Decode kernels: method").

use std::fmt;

use tilefuse_dsl::half::bf16;
use tilefuse_dsl::runtime::{
    Buffer, Device, DeviceInfo, Element, KernelDef, LaunchConfig, LaunchError, RuntimeError,
};

use super::Cublas;
use crate::kernels;
use crate::tuning::{self, AttentionConfig, GemvConfig};

/// Why a measurement could not be taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PerfError(pub String);

impl fmt::Display for PerfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PerfError {}

impl From<LaunchError> for PerfError {
    fn from(e: LaunchError) -> PerfError {
        PerfError(e.to_string())
    }
}

impl From<RuntimeError> for PerfError {
    fn from(e: RuntimeError) -> PerfError {
        PerfError(e.to_string())
    }
}

impl From<cudarc::driver::DriverError> for PerfError {
    fn from(e: cudarc::driver::DriverError) -> PerfError {
        PerfError(format!("CUDA driver: {e}"))
    }
}

impl From<cudarc::cublas::result::CublasError> for PerfError {
    fn from(e: cudarc::cublas::result::CublasError) -> PerfError {
        PerfError(format!("cuBLAS: {e:?}"))
    }
}

/// `Result` with [`PerfError`].
pub type Result<T> = std::result::Result<T, PerfError>;

/// How many distinct buffer sets of `set_bytes` each a measurement must cycle through so
/// that together they exceed 4× the L2 cache (at least 2, so no launch reads what the
/// previous one left in L2).
pub fn rotation_sets(set_bytes: usize, l2_bytes: usize) -> usize {
    let need = 4 * l2_bytes.max(1);
    (need / set_bytes.max(1) + 1).max(2)
}

/// A small seeded generator (splitmix64) for test and benchmark data.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator with this seed.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// The next 32 random bits.
    pub fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * self.unit()
    }

    /// A non-zero value of magnitude in `[scale / 16, scale)` and random sign, as bf16.
    pub fn nonzero_bf16(&mut self, scale: f32) -> bf16 {
        let m = scale * (0.0625 + 0.9375 * self.unit());
        let v = bf16::from_f32(if self.next_u64() & 1 == 0 { m } else { -m });
        if v == bf16::ZERO {
            bf16::from_f32(scale)
        } else {
            v
        }
    }

    /// `len` values from [`Self::nonzero_bf16`].
    pub fn bf16_vec(&mut self, len: usize, scale: f32) -> Vec<bf16> {
        (0..len).map(|_| self.nonzero_bf16(scale)).collect()
    }
}

/// `len` random non-zero bf16 values on `dev`, from `seed`.
pub fn random_bf16(dev: &Device, len: usize, scale: f32, seed: u64) -> Result<Buffer<bf16>> {
    Ok(dev.upload(&Rng::new(seed).bf16_vec(len, scale))?)
}

/// Uploads the same host data as `sets` distinct device buffers (for L2 rotation; the
/// addresses differ, so no set is served from another's cache lines).
pub fn replicate<T: Element>(dev: &Device, data: &[T], sets: usize) -> Result<Vec<Buffer<T>>> {
    (0..sets.max(1))
        .map(|_| dev.upload(data).map_err(PerfError::from))
        .collect()
}

/// The GEMV-family decode kernels a [`GemvWorkload`] measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GemvKind {
    /// [`kernels::rms_norm_gemv`] (QKV projection).
    RmsNormGemv,
    /// [`kernels::gemv_residual`] (O and down projections).
    GemvResidual,
    /// [`kernels::rms_norm_gate_up`] (fused gate and up; the weight has `2 × inter` rows).
    RmsNormGateUp,
    /// [`kernels::lm_head_argmax`] followed by [`kernels::argmax_finish`].
    LmHead,
}

impl GemvKind {
    /// The kernel's description (for the LM head, the GEMV part).
    pub fn def(self) -> &'static KernelDef {
        match self {
            GemvKind::RmsNormGemv => &kernels::RMS_NORM_GEMV,
            GemvKind::GemvResidual => &kernels::GEMV_RESIDUAL,
            GemvKind::RmsNormGateUp => &kernels::RMS_NORM_GATE_UP,
            GemvKind::LmHead => &kernels::LM_HEAD_ARGMAX,
        }
    }

    /// A short name for tables.
    pub fn name(self) -> &'static str {
        match self {
            GemvKind::RmsNormGemv => "rms_norm_gemv",
            GemvKind::GemvResidual => "gemv_residual",
            GemvKind::RmsNormGateUp => "rms_norm_gate_up",
            GemvKind::LmHead => "lm_head_argmax",
        }
    }
}

/// One set of a GEMV workload's buffers.
struct GemvSet {
    w: Buffer<bf16>,
    x: Buffer<bf16>,
    norm: Buffer<bf16>,
    bias: Buffer<bf16>,
    y: Buffer<bf16>,
}

/// A GEMV-family kernel at one shape, with enough buffer sets to exceed 4× L2, plus the
/// cuBLAS baseline at the same shape.
///
/// `n × k` is the weight's shape (for [`GemvKind::RmsNormGateUp`], `n = 2 × inter`).
pub struct GemvWorkload {
    /// Which kernel.
    pub kind: GemvKind,
    /// Weight rows.
    pub n: usize,
    /// Weight columns.
    pub k: usize,
    sets: Vec<GemvSet>,
    y_blas: Buffer<bf16>,
    logits: Buffer<f32>,
    part_val: Buffer<f32>,
    part_idx: Buffer<i32>,
    state: Buffer<i32>,
    /// The layer kernels' timeline argument (never written: `stamp_at` is -1).
    stamps: Buffer<i64>,
}

const EPS: f32 = 1e-6;

impl GemvWorkload {
    /// Allocates `rotation_sets` sets of random non-zero inputs on `dev`.
    pub fn new(
        dev: &Device,
        kind: GemvKind,
        n: usize,
        k: usize,
        l2_bytes: usize,
        seed: u64,
    ) -> Result<GemvWorkload> {
        let mut rng = Rng::new(seed);
        let sets = rotation_sets(n * k * 2, l2_bytes);
        // One random weight, uploaded to distinct buffers: the addresses are what the
        // cache sees.
        let w = rng.bf16_vec(n * k, 0.05);
        let mut v = Vec::with_capacity(sets);
        for _ in 0..sets {
            v.push(GemvSet {
                w: dev.upload(&w)?,
                x: dev.upload(&rng.bf16_vec(k, 1.0))?,
                norm: dev.upload(&rng.bf16_vec(k, 1.0))?,
                bias: dev.upload(&rng.bf16_vec(n, 0.1))?,
                y: dev.upload(&rng.bf16_vec(n, 1.0))?,
            });
        }
        Ok(GemvWorkload {
            kind,
            n,
            k,
            sets: v,
            y_blas: dev.alloc_filled(n, bf16::NAN)?,
            logits: dev.alloc_filled(if kind == GemvKind::LmHead { n } else { 1 }, f32::NAN)?,
            part_val: dev.alloc_filled(if kind == GemvKind::LmHead { n } else { 1 }, f32::NAN)?,
            part_idx: dev.alloc_filled(if kind == GemvKind::LmHead { n } else { 1 }, 0i32)?,
            state: dev.upload(&[0i32, 0])?,
            stamps: dev.alloc_filled(4, -1i64)?,
        })
    }

    /// Buffer sets cycled through.
    pub fn sets(&self) -> usize {
        self.sets.len()
    }

    /// Launches per captured graph: every set at least once, and at least 16.
    pub fn launches(&self) -> usize {
        self.sets().max(16)
    }

    /// Bytes one tilefuse launch must move: the weight, the vectors read (input, norm
    /// weight, bias, residual) and the output written.
    pub fn bytes(&self) -> u64 {
        let (n, k) = (self.n as u64, self.k as u64);
        let vectors = match self.kind {
            // x, norm weight, bias; y.
            GemvKind::RmsNormGemv => 2 * k + n + n,
            // a, bias; x read and written.
            GemvKind::GemvResidual => k + n + 2 * n,
            // x, norm weight; act (n / 2).
            GemvKind::RmsNormGateUp => 2 * k + n / 2,
            // x, norm weight; f32 logits.
            GemvKind::LmHead => 2 * k + 2 * n,
        };
        2 * (n * k + vectors)
    }

    /// Bytes one cuBLAS GEMV of the same shape must move (weight, x, y).
    pub fn cublas_bytes(&self) -> u64 {
        2 * (self.n as u64 * self.k as u64 + self.k as u64 + self.n as u64)
    }

    /// The default configuration from [`tuning`].
    pub fn default_config(&self) -> GemvConfig {
        match self.kind {
            GemvKind::RmsNormGateUp => tuning::gate_up_config(self.n / 2, self.k),
            GemvKind::LmHead => tuning::lm_head_config(self.n, self.k),
            GemvKind::RmsNormGemv => tuning::norm_gemv_config(self.n, self.k),
            _ => tuning::gemv_config(self.n, self.k),
        }
    }

    /// Every compiled configuration of the kernel.
    pub fn variants(&self) -> Vec<GemvConfig> {
        tuning::gemv_variants(self.kind.def())
    }

    /// Queues the kernel on buffer set `i % sets` with configuration `cfg`.
    pub fn launch(&mut self, dev: &Device, i: usize, cfg: GemvConfig) -> Result<()> {
        let (n, k) = (self.n as i32, self.k as i32);
        let nsets = self.sets.len();
        let set = &mut self.sets[i % nsets];
        let lc = |rows: usize| LaunchConfig::from(cfg.grid(rows)).num_warps(cfg.num_warps);
        let stamps = &mut self.stamps;
        match self.kind {
            GemvKind::RmsNormGemv => kernels::RmsNormGemvArgs {
                x: &set.x,
                norm_w: &set.norm,
                w: &set.w,
                bias: &set.bias,
                y: &mut set.y,
                n,
                k,
                eps: EPS,
                stamps,
                stamp_at: -1,
            }
            .launch(dev, lc(self.n), cfg)?,
            GemvKind::GemvResidual => kernels::GemvResidualArgs {
                w: &set.w,
                a: &set.x,
                bias: &set.bias,
                x: &mut set.y,
                n,
                k,
                stamps,
                stamp_at: -1,
            }
            .launch(dev, lc(self.n), cfg)?,
            GemvKind::RmsNormGateUp => kernels::RmsNormGateUpArgs {
                x: &set.x,
                norm_w: &set.norm,
                w: &set.w,
                act: &mut set.y,
                inter: n / 2,
                k,
                eps: EPS,
                stamps,
                stamp_at: -1,
            }
            .launch(dev, lc(self.n / 2), cfg)?,
            GemvKind::LmHead => {
                let parts = cfg.grid(self.n);
                kernels::LmHeadArgmaxArgs {
                    x: &set.x,
                    norm_w: &set.norm,
                    w: &set.w,
                    logits: &mut self.logits,
                    part_val: &mut self.part_val,
                    part_idx: &mut self.part_idx,
                    n,
                    k,
                    eps: EPS,
                }
                .launch(dev, lc(self.n), cfg)?;
                let (b, warps) = tuning::argmax_finish_config(parts as usize);
                kernels::ArgmaxFinishArgs {
                    part_val: &self.part_val,
                    part_idx: &self.part_idx,
                    state: &mut self.state,
                    parts: parts as i32,
                }
                .launch(
                    dev,
                    LaunchConfig::from(1).num_warps(warps),
                    kernels::ArgmaxFinishConsts { b },
                )?;
            }
        }
        Ok(())
    }

    /// Queues the cuBLAS GEMV of the same weight shape on buffer set `i % sets`.
    pub fn launch_cublas(&mut self, blas: &Cublas, i: usize) -> Result<()> {
        let nsets = self.sets.len();
        let set = &self.sets[i % nsets];
        blas.gemv_bf16(&set.w, &set.x, &mut self.y_blas, self.n, self.k)
    }
}

/// Decode attention (`attention_split`, with its QK-norm, RoPE and append, +
/// `attention_combine` unless the splits merge in a cluster) at one context length, with enough KV-cache sets to exceed 4× L2
/// (within device memory).
pub struct AttentionWorkload {
    /// Cached positions read (the context length).
    pub seq: usize,
    /// Query heads.
    pub num_heads: usize,
    /// KV heads.
    pub num_kv_heads: usize,
    /// Head size.
    pub head_dim: usize,
    sets: Vec<(Buffer<bf16>, Buffer<bf16>, Buffer<bf16>)>,
    norm_w: Buffer<bf16>,
    /// A stand-in for the quantized prefetch range (none is prefetched: its length is 0).
    words: Buffer<u32>,
    rope_cos: Buffer<f32>,
    rope_sin: Buffer<f32>,
    q: Buffer<bf16>,
    state: Buffer<i32>,
    part_m: Buffer<f32>,
    part_l: Buffer<f32>,
    part_acc: Buffer<f32>,
    out: Buffer<bf16>,
    /// The timeline argument (never written: `stamp_at` is -1).
    stamps: Buffer<i64>,
}

impl AttentionWorkload {
    /// Allocates the sets: per set a fused `qkv` projection and `[num_kv_heads, seq,
    /// head_dim]` K and V caches of random non-zero values; the position `seq - 1` lives
    /// in a device `state` buffer, as in decode (so each launch appends its key and value
    /// at the last row and reads the `seq - 1` before it).
    pub fn new(
        dev: &Device,
        seq: usize,
        (num_heads, num_kv_heads, head_dim): (usize, usize, usize),
        info: &DeviceInfo,
        seed: u64,
    ) -> Result<AttentionWorkload> {
        let mut rng = Rng::new(seed);
        let cache = num_kv_heads * seq * head_dim;
        let set_bytes = 2 * cache * 2;
        // Keep the sets within half of device memory.
        let fit = (info.total_mem / 2 / set_bytes.max(1)).max(1);
        let sets = rotation_sets(set_bytes, info.l2_bytes).min(fit);
        let k = rng.bf16_vec(cache, 1.0);
        let v = rng.bf16_vec(cache, 1.0);
        let mut s = Vec::with_capacity(sets);
        for _ in 0..sets {
            s.push((
                dev.upload(&rng.bf16_vec((num_heads + 2 * num_kv_heads) * head_dim, 1.0))?,
                dev.upload(&k)?,
                dev.upload(&v)?,
            ));
        }
        let slots = num_heads * tuning::MAX_SPLITS;
        // Any rotation will do for timing: random angles' cosines and sines.
        let angles: Vec<f32> = rng
            .bf16_vec(seq * head_dim / 2, 3.0)
            .iter()
            .map(|a| a.to_f32())
            .collect();
        Ok(AttentionWorkload {
            seq,
            num_heads,
            num_kv_heads,
            head_dim,
            sets: s,
            norm_w: dev.upload(&rng.bf16_vec(head_dim, 1.5))?,
            words: dev.zeros(1)?,
            rope_cos: dev.upload(&angles.iter().map(|a| a.cos()).collect::<Vec<_>>())?,
            rope_sin: dev.upload(&angles.iter().map(|a| a.sin()).collect::<Vec<_>>())?,
            q: dev.alloc_filled(num_heads * head_dim, bf16::NAN)?,
            state: dev.upload(&[0i32, seq as i32 - 1])?,
            part_m: dev.alloc_filled(slots, f32::NAN)?,
            part_l: dev.alloc_filled(slots, f32::NAN)?,
            part_acc: dev.alloc_filled(slots * head_dim, f32::NAN)?,
            out: dev.alloc_filled(num_heads * head_dim, bf16::NAN)?,
            stamps: dev.alloc_filled(4, -1i64)?,
        })
    }

    /// KV-cache sets cycled through.
    pub fn sets(&self) -> usize {
        self.sets.len()
    }

    /// Launch pairs per captured graph: every set at least once, and at least 16.
    pub fn launches(&self) -> usize {
        self.sets().max(16)
    }

    /// KV bytes read per step: `2 × num_kv_heads × seq × head_dim × 2`.
    pub fn bytes(&self) -> u64 {
        (2 * self.num_kv_heads * self.seq * self.head_dim * 2) as u64
    }

    /// The padded query-group size `G` the split kernel is launched with.
    pub fn padded_group(&self) -> usize {
        (self.num_heads / self.num_kv_heads.max(1))
            .next_power_of_two()
            .clamp(1, 4)
    }

    /// Queues split + combine (or the clustered split alone) on set `i % sets`.
    pub fn launch(&mut self, dev: &Device, i: usize, cfg: AttentionConfig) -> Result<()> {
        let nsets = self.sets.len();
        let padded = self.padded_group();
        let (qkv, k, v) = &mut self.sets[i % nsets];
        let d = self.head_dim;
        let dc = cfg.dc.min(d);
        let group = self.num_heads / self.num_kv_heads;
        kernels::AttentionSplitArgs {
            qkv,
            q_norm_w: &self.norm_w,
            k_norm_w: &self.norm_w,
            rope_cos: &self.rope_cos,
            rope_sin: &self.rope_sin,
            state: &self.state,
            k_cache: k,
            v_cache: v,
            q_out: &mut self.q,
            part_m: &mut self.part_m,
            part_l: &mut self.part_l,
            part_acc: &mut self.part_acc,
            out: &mut self.out,
            group: group as i32,
            max_seq: self.seq as i32,
            min_chunk: cfg.min_chunk as i32,
            use_norm: 1,
            eps: EPS,
            scale: (d as f32).powf(-0.5),
            prefetch_w: &self.norm_w,
            prefetch_len: 0,
            prefetch_q: &self.words,
            prefetch_q_len: 0,
            stamps: &mut self.stamps,
            stamp_at: -1,
        }
        .launch(
            dev,
            LaunchConfig::from((
                self.num_kv_heads as u32,
                cfg.splits as u32,
                group.div_ceil(padded) as u32,
            ))
            .num_warps(cfg.num_warps),
            kernels::AttentionSplitConsts {
                d,
                g: padded,
                bs: cfg.bs,
                stages: cfg.stages,
                cluster: cfg.cluster,
            },
        )?;
        if cfg.cluster > 1 {
            return Ok(());
        }
        kernels::AttentionCombineArgs {
            part_m: &self.part_m,
            part_l: &self.part_l,
            part_acc: &self.part_acc,
            out: &mut self.out,
            splits: cfg.splits as i32,
            stamps: &mut self.stamps,
            stamp_at: -1,
        }
        .launch(
            dev,
            (self.num_heads as u32, (d / dc) as u32),
            kernels::AttentionCombineConsts { d, s: cfg.s, dc },
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::Cublas;

    #[test]
    fn rotation_exceeds_four_l2() {
        let l2 = 50 << 20;
        for set in [1usize << 20, 8 << 20, 311 << 20] {
            let n = rotation_sets(set, l2);
            assert!(n * set > 4 * l2 && n >= 2, "{set}: {n}");
        }
    }

    #[test]
    fn rng_values_are_nonzero_and_seeded() {
        let a = Rng::new(7).bf16_vec(1000, 0.5);
        assert_eq!(a, Rng::new(7).bf16_vec(1000, 0.5));
        assert!(a
            .iter()
            .all(|v| *v != bf16::ZERO && v.to_f32().abs() <= 0.5));
        assert_ne!(a, Rng::new(8).bf16_vec(1000, 0.5));
    }

    #[test]
    fn cpu_device_is_an_error_not_a_panic() {
        let d = Device::cpu();
        assert!(Cublas::new(&d).is_err());
    }
}
