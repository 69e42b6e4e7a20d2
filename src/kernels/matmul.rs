//! `C = A B` for row-major bf16 `A [M, K]` and `B [K, N]`, f32 accumulation, bf16 or f32
//! `C [M, N]`: Triton's matmul tutorial written in the language.
//!
//! Each program computes one `BM x BN` tile of `C`, walking K in steps of `BK` with
//! `acc = dot(a, b, acc)`; programs are ordered in groups of `GROUP_M` tile rows
//! (Triton's "grouped ordering") so that consecutive programs share A and B tiles in L2.
//! Edges are masked: M, N and K need not be multiples of the tile; N and K must be
//! multiples of 16 elements (checked at launch; it gives 16-byte loads and stores).
//! `dot` keeps the accumulator in tensor-core registers across the loop and reads its
//! operands from swizzled shared memory; the operands are read through tensor
//! descriptors (`make_tensor_descriptor`, Triton's form; 64-row tiles keep the
//! tutorial's pointer tiles), pipelined three stages deep
//! (`num_stages`; docs/language.md, "`dot` on tensor cores"), the 128 x 128 tile 4 and 5
//! stages deep too and the 64 x 128 one 5 ([`MatmulConfig::num_stages`] picks the
//! variant): on Hopper the copy engine moves them (`cp.async.bulk.tensor`,
//! docs/language.md, "Tensor descriptors"), elsewhere `cp.async` does. Triton's
//! pointer-arithmetic form of the same kernel is `examples/tutorial_03_matmul.rs`.
//!
//! ```no_run
//! use tilefuse::kernels::matmul::{launch, MatmulConfig};
//! use tilefuse::prelude::*;
//!
//! let dev = Device::auto();
//! let (m, n, k) = (1000, 512, 256);
//! let a = dev.upload(&vec![bf16::from_f32(0.5); m * k]).unwrap();
//! let b = dev.upload(&vec![bf16::from_f32(0.25); k * n]).unwrap();
//! let mut c = dev.alloc_filled(m * n, bf16::ZERO).unwrap();
//! launch(&dev, &a, &b, &mut c, m, n, k, MatmulConfig::default()).unwrap();
//! ```

use crate::dsl::half::bf16;
use crate::dsl::runtime::{
    Buffer, Device, DeviceInfo, KernelArg, KernelDef, LaunchConfig, LaunchError, RuntimeError,
};
use crate::{kernel, tile_fn};

/// The f32 product `A[rows, k_lo..k_hi] B[k_lo..k_hi, cols]` of the `BM x BN` tile at
/// tile row `pid_m`, tile column `pid_n` of `C = A B` (`A [m, k]`, `B [k, n]`, zero past
/// their edges): the K loop of every kernel here.
#[tile_fn(crate = crate::dsl)]
#[allow(clippy::too_many_arguments)]
fn tile_product<const BM: usize, const BN: usize, const BK: usize>(
    a: Ptr<bf16>,
    b: Ptr<bf16>,
    m: i32,
    n: i32,
    k: i32,
    pid_m: i32,
    pid_n: i32,
    k_lo: i32,
    k_hi: i32,
) -> Tile<f32> {
    let mut acc = zeros::<f32>([BM, BN]);
    if BM == 64 {
        // Triton's tutorial form: pointer tiles advanced along K. The 64-row tiles (the
        // small outputs' picks) measured slower with the copy engine (docs/perf.md, "The
        // copy engine for the operands").
        let rm = pid_m * BM + arange(0, BM);
        let rn = pid_n * BN + arange(0, BN);
        let rk = arange(0, BK);
        let row_ok = (rm < m).expand_dims(1);
        let col_ok = (rn < n).expand_dims(0);
        let mut pa = a + rm.expand_dims(1) * k + (k_lo + rk).expand_dims(0);
        let mut pb = b + (k_lo + rk).expand_dims(1) * n + rn.expand_dims(0);
        for k0 in (k_lo..k_hi).step_by(BK) {
            let k_ok = rk < k - k0;
            let x = load(pa, row_ok & k_ok.expand_dims(0), 0.0);
            let y = load(pb, k_ok.expand_dims(1) & col_ok, 0.0);
            acc = dot(x, y, acc);
            pa += BK;
            pb += BK * n;
        }
    } else {
        // The operands as tensor descriptors: each `load` reads a block, zero outside
        // the matrix; on Hopper the copy engine moves it (docs/language.md, "Tensor
        // descriptors").
        let a_blocks = make_tensor_descriptor(a, [m, k], [k, 1], [BM, BK]);
        let b_blocks = make_tensor_descriptor(b, [k, n], [n, 1], [BK, BN]);
        for k0 in (k_lo..k_hi).step_by(BK) {
            let x = a_blocks.load([pid_m * BM, k0]);
            let y = b_blocks.load([k0, pid_n * BN]);
            acc = dot(x, y, acc);
        }
    }
    acc
}

/// The body both kernels share: one `BM x BN` tile of `C = A B` stored as `T`.
#[tile_fn(crate = crate::dsl)]
#[allow(clippy::too_many_arguments)]
fn matmul_tile<const BM: usize, const BN: usize, const BK: usize, const GROUP_M: usize, T>(
    a: Ptr<bf16>,
    b: Ptr<bf16>,
    c: Ptr<T>,
    m: i32,
    n: i32,
    k: i32,
) {
    let pid = program_id(0);
    let num_pid_m = cdiv(m, BM);
    let num_pid_n = cdiv(n, BN);
    let num_pid_in_group = GROUP_M * num_pid_n;
    let first_pid_m = (pid / num_pid_in_group) * GROUP_M;
    let group_size_m = minimum(num_pid_m - first_pid_m, GROUP_M);
    let pid_m = first_pid_m + (pid % num_pid_in_group) % group_size_m;
    let pid_n = (pid % num_pid_in_group) / group_size_m;
    let acc = tile_product::<BM, BN, BK>(a, b, m, n, k, pid_m, pid_n, 0, k);
    let rm = pid_m * BM + arange(0, BM);
    let rn = pid_n * BN + arange(0, BN);
    let row_ok = (rm < m).expand_dims(1);
    let col_ok = (rn < n).expand_dims(0);
    store(
        c + rm.expand_dims(1) * n + rn.expand_dims(0),
        acc as T,
        row_ok & col_ok,
    );
}

/// `C` in `T` (bf16, or f32 stored from the accumulator as is; `MATMUL_BF16` and
/// `MATMUL_F32` describe the two). Compiled tile configurations
/// `(BM, BN, BK, num_warps)`: (128, 256, 64, 8), (128, 128, 64, 8), (128, 128, 32, 4),
/// (128, 64, 64, 8), (64, 128, 64, 4), (64, 128, 32, 4), (64, 64, 64, 4),
/// (64, 64, 32, 4); `GROUP_M = 8`, 3 stages (on Hopper's `wgmma` path the ring holds a
/// buffer more: docs/language.md, "On Hopper: `wgmma`"), and 4 and 5 stages for
/// (128, 128, 64, 8), 5 for (64, 128, 64, 4): the tiles of the prefill shapes whose
/// programs wait on their loads (docs/perf.md, "Deeper rings for the unsplit GEMM";
/// 64 x 128 at 4 stages lost to both 3 and 5 there), and 4 for (128, 256, 64, 8), a
/// Hopper-only variant: its four 48 KiB buffers fit in sm_90's shared memory alone (no
/// sm_80 module; launching it on an older GPU is an error naming the need), and leave
/// no room for the `wgmma` ring's extra buffer, so the copies go after each group's
/// wait instead (docs/language.md, "On Hopper: `wgmma`").
/// (128 x 128 x 64 on 4 warps is left out: ptxas spills on sm_80.)
#[kernel(
    crate = crate::dsl,
    T = [bf16, f32],
    BM = [128, 64],
    BN = [256, 128, 64],
    BK = [64, 32],
    GROUP_M = [8],
    num_warps = [8, 4],
    num_stages = [3, 4, 5],
    skip(BM = 64, BN = 256),
    skip(BM = 64, num_warps = 8),
    skip(BM = 128, BN = 64, BK = 32),
    skip(BM = 128, BN = 64, num_warps = 4),
    skip(BN = 256, BK = 32),
    skip(BN = 256, num_warps = 4),
    skip(BM = 128, BN = 128, BK = 64, num_warps = 4),
    skip(BM = 128, BN = 128, BK = 32, num_warps = 8),
    skip(BN = 64, num_stages = [4, 5]),
    skip(BN = 256, num_stages = 5),
    skip(BK = 32, num_stages = [4, 5]),
    skip(BM = 64, num_stages = 4)
)]
pub fn matmul<T, const BM: usize, const BN: usize, const BK: usize, const GROUP_M: usize>(
    a: Ptr<bf16>,
    b: Ptr<bf16>,
    c: Ptr<T>,
    m: i32,
    #[multiple_of(16)] n: i32,
    #[multiple_of(16)] k: i32,
) {
    matmul_tile::<BM, BN, BK, GROUP_M, T>(a, b, c, m, n, k);
}

/// One K slice of one `BM x BN` tile of `C = A B` (split-K): program `(tile, slice)`
/// accumulates `A[:, k_lo..k_hi] B[k_lo..k_hi, :]` with `k_lo = slice * k_slice`,
/// stores the f32 partial to `partials [splits, m, n]`, and bumps the tile's counter;
/// the last program to arrive sums the `splits` partials in slice order (the same bits
/// whichever program arrives last), stores `C` as `T` and resets the counter for the
/// next launch. Slices may be shorter (the last) or empty; every partial is written.
#[tile_fn(crate = crate::dsl)]
#[allow(clippy::too_many_arguments)]
fn matmul_split_tile<const BM: usize, const BN: usize, const BK: usize, const GROUP_M: usize, T>(
    a: Ptr<bf16>,
    b: Ptr<bf16>,
    c: Ptr<T>,
    partials: Ptr<f32>,
    counters: Ptr<i32>,
    m: i32,
    n: i32,
    k: i32,
    k_slice: i32,
) {
    let pid = program_id(0);
    let slice = program_id(1);
    let splits = num_programs(1);
    let num_pid_m = cdiv(m, BM);
    let num_pid_n = cdiv(n, BN);
    let num_pid_in_group = GROUP_M * num_pid_n;
    let first_pid_m = (pid / num_pid_in_group) * GROUP_M;
    let group_size_m = minimum(num_pid_m - first_pid_m, GROUP_M);
    let pid_m = first_pid_m + (pid % num_pid_in_group) % group_size_m;
    let pid_n = (pid % num_pid_in_group) / group_size_m;
    let k_lo = slice * k_slice;
    // Every slice but the last spans whole BK steps, so K's end is the only bound a
    // step can cross.
    let k_hi = minimum(k, k_lo + k_slice);
    let acc = tile_product::<BM, BN, BK>(a, b, m, n, k, pid_m, pid_n, k_lo, k_hi);
    let rm = pid_m * BM + arange(0, BM);
    let rn = pid_n * BN + arange(0, BN);
    let row_ok = (rm < m).expand_dims(1);
    let col_ok = (rn < n).expand_dims(0);
    let out_ok = row_ok & col_ok;
    let offs = rm.expand_dims(1) * n + rn.expand_dims(0);
    store(partials + slice * m * n + offs, acc, out_ok);
    let arrived = atomic_add(counters + pid, 1);
    if arrived == splits - 1 {
        // Two partials a step: each step waits for its loads (L2 latency), so this
        // halves the waits of a reduction that is latency-bound, not bandwidth-bound.
        let mut sum = zeros::<f32>([BM, BN]);
        for s in (0..splits).step_by(2) {
            let p0 = load(partials + s * m * n + offs, out_ok, 0.0);
            let p1 = load(
                partials + (s + 1) * m * n + offs,
                out_ok & (s + 1 < splits),
                0.0,
            );
            sum = sum + p0 + p1;
        }
        store(c + offs, sum as T, out_ok);
        store(counters + pid, 0);
    }
}

/// Split-K [`matmul`] (`C` in bf16 or f32, as there): a grid of `(tiles, splits)`
/// programs, each one K slice of one tile, the last to finish a tile reducing its f32
/// partials (see [`launch_split`]). For outputs with fewer tiles than the GPU has
/// multiprocessors (the O and down projections at 512 tokens: 32 tiles of 128 x 128).
/// Compiled tile configurations: [`SPLIT_CONFIGS`].
#[kernel(
    crate = crate::dsl,
    T = [bf16, f32],
    BM = [128, 64],
    BN = [128, 64],
    BK = [64],
    GROUP_M = [8],
    num_warps = [8, 4],
    num_stages = [5],
    skip(BM = 64, num_warps = 8),
    skip(BM = 128, num_warps = 4)
)]
#[allow(clippy::too_many_arguments)]
pub fn matmul_split<T, const BM: usize, const BN: usize, const BK: usize, const GROUP_M: usize>(
    a: Ptr<bf16>,
    b: Ptr<bf16>,
    c: Ptr<T>,
    partials: Ptr<f32>,
    counters: Ptr<i32>,
    m: i32,
    #[multiple_of(16)] n: i32,
    #[multiple_of(16)] k: i32,
    #[multiple_of(16)] k_slice: i32,
) {
    matmul_split_tile::<BM, BN, BK, GROUP_M, T>(a, b, c, partials, counters, m, n, k, k_slice);
}

/// A tile configuration of [`matmul`] (either output type).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatmulConfig {
    /// Rows of `C` per program.
    pub block_m: usize,
    /// Columns of `C` per program.
    pub block_n: usize,
    /// K per loop iteration.
    pub block_k: usize,
    /// Warps per program.
    pub num_warps: u32,
    /// Tile rows per group of the program ordering.
    pub group_m: usize,
    /// Pipelining depth of the unsplit kernels' operand loads: 3, or 4 and 5 where
    /// compiled (see [`matmul`]). The split-K kernels have their own
    /// (5, [`SPLIT_CONFIGS`]) and ignore it.
    pub num_stages: u32,
}

impl MatmulConfig {
    /// 128 x 256 x 64, 8 warps.
    pub const LARGE: MatmulConfig = MatmulConfig::new(128, 256, 64, 8);
    /// 128 x 128 x 64, 8 warps (the default).
    pub const MEDIUM: MatmulConfig = MatmulConfig::new(128, 128, 64, 8);
    /// 64 x 64 x 64, 4 warps (small problems: more programs).
    pub const SMALL: MatmulConfig = MatmulConfig::new(64, 64, 64, 4);
    /// 64 x 128 x 64, 4 warps: the tile [`MatmulPlan::for_shape`] splits K over.
    pub const SPLIT: MatmulConfig = MatmulConfig::new(64, 128, 64, 4);

    /// A configuration with `GROUP_M = 8` and 3 stages.
    pub const fn new(block_m: usize, block_n: usize, block_k: usize, num_warps: u32) -> Self {
        MatmulConfig {
            block_m,
            block_n,
            block_k,
            num_warps,
            group_m: 8,
            num_stages: 3,
        }
    }

    /// This configuration with a `num_stages`-deep ring (it must be compiled: see
    /// [`matmul`]).
    pub const fn stages(self, num_stages: u32) -> Self {
        MatmulConfig { num_stages, ..self }
    }

    /// A configuration for an `m x n` output, from the per-shape winners of the sweeps in
    /// docs/perf.md ("GEMM on wgmma", "Deeper rings for the unsplit GEMM"; `cargo run
    /// --release --example matmul -- --sweep`): the 128 x 256 tile from 192 tiles of 128
    /// x 128 up (about 1.5 waves of 132 SMs), 128 x 128 x 64 on 8 warps with a 4-stage
    /// ring from 96 (9-11% over 3 stages at 512 x 4096 x 1024 and 2048 x 1024 x K), and
    /// 64 x 64 x 64 tiles (four times the programs) below that. Measured on Hopper's
    /// `wgmma` path; on `mma.sync` (sm_80, or `TILEFUSE_SM90A=0`) the 3-stage picks were
    /// within 12% of the best there. [`matmul`] is compiled with every pick, for both
    /// output types.
    pub fn for_shape(m: usize, n: usize) -> MatmulConfig {
        match m.div_ceil(128) * n.div_ceil(128) {
            t if t >= 192 => MatmulConfig::LARGE,
            t if t >= 96 => MatmulConfig::MEDIUM.stages(4),
            _ => MatmulConfig::SMALL,
        }
    }

    /// Whether this configuration is compiled for Hopper only: its ring needs more
    /// shared memory than sm_80 gives a program (163 KiB), so [`matmul`]'s variant has
    /// no sm_80 module. `false` for a configuration that is not compiled.
    pub fn hopper_only(&self) -> bool {
        MATMUL_BF16
            .variant_staged(&self.consts(), Some(self.num_warps), Some(self.num_stages))
            .is_ok_and(|v| v.ptx_sm80.is_empty())
    }

    /// Programs for an `m x n` output (one-dimensional grid, grouped ordering inside).
    pub fn grid(&self, m: usize, n: usize) -> [u32; 3] {
        let tiles = m.div_ceil(self.block_m) * n.div_ceil(self.block_n);
        [tiles as u32, 1, 1]
    }

    fn consts(&self) -> [i64; 4] {
        [
            self.block_m as i64,
            self.block_n as i64,
            self.block_k as i64,
            self.group_m as i64,
        ]
    }
}

impl Default for MatmulConfig {
    fn default() -> Self {
        MatmulConfig::MEDIUM
    }
}

/// How one GEMM is launched: a tile configuration and how many slices K is split into
/// ([`matmul_split`] when `splits > 1`, [`matmul`] otherwise).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatmulPlan {
    /// The tile configuration.
    pub config: MatmulConfig,
    /// K slices per output tile (1: no split).
    pub splits: usize,
}

/// The split-K kernels' tile configurations `(BM, BN, 64, num_warps)`: 128 x 128 and 128
/// x 64 on 8 warps, 64 x 128 and 64 x 64 on 4 (all among [`matmul`]'s, so a plan
/// normalized to one slice launches too). The split kernels pipeline 5 stages deep
/// (`num_stages = [5]`: a slice's few iterations are bound by the latency of their
/// loads, not by bandwidth; 128 x 256 tiles would not fit that ring).
pub const SPLIT_CONFIGS: [MatmulConfig; 4] = [
    MatmulConfig::MEDIUM,
    MatmulConfig::new(128, 64, 64, 8),
    MatmulConfig::SPLIT,
    MatmulConfig::SMALL,
];

/// The fewest K iterations a split-K slice is given (fewer leave the pipeline mostly
/// filling and draining).
pub const MIN_SLICE_ITERS: usize = 4;

/// A split into only two slices is worth its reduction from this many iterations a
/// slice: below it, one program a tile of [`MatmulConfig::SPLIT`] with a 5-stage ring
/// is as fast or faster (docs/perf.md, "Deeper rings for the unsplit GEMM": 512 x 1024
/// x 2048 on an H100, 199 TFLOP/s unsplit against 182 in two slices of 16 iterations;
/// 236 both ways at 512 x 1024 x 3072).
pub const TWO_SLICE_MIN_ITERS: usize = 24;

/// Peak memory bandwidth (bytes per second) from which [`MatmulPlan::for_device`] keeps
/// a two-slice split of exactly [`TWO_SLICE_MIN_ITERS`] iterations a slice: between the
/// H100's 3.35 TB/s, where it loses to the unsplit tile, and the H200's 4.8, where it
/// wins.
pub const SPLIT_PARTIALS_MIN_BANDWIDTH: u64 = 4_000_000_000_000;

impl MatmulPlan {
    /// No split: one program per tile of `config`.
    pub const fn tiles(config: MatmulConfig) -> MatmulPlan {
        MatmulPlan { config, splits: 1 }
    }

    /// The plan for an `m x n x k` GEMM on a GPU of `sms` multiprocessors. Outputs with
    /// at least 96 tiles of 128 x 128 take [`MatmulConfig::for_shape`]'s tile unsplit.
    /// Smaller ones (the wave is mostly empty) split K over 64 x 128 tiles on 4 warps
    /// (one program per SM: its 5-stage ring is 144 KiB) into as many slices as fit the
    /// SMs in one wave, each of at least [`MIN_SLICE_ITERS`] iterations; where that is
    /// under two slices, 64 x 64 tiles unsplit, and where it is two slices of fewer than
    /// [`TWO_SLICE_MIN_ITERS`] iterations, the same 64 x 128 tiles unsplit with a
    /// 5-stage ring. From the sweep in docs/perf.md ("GEMM on
    /// `wgmma` (Hopper)", "Split-K for small outputs"): at 512 x 1024 x 3072 on an H200,
    /// 64 x 128 in
    /// 2 slices ran at 258 TFLOP/s against 166 for the best unsplit tile; more slices
    /// (a second wave) and 128 x 128 tiles in 4 slices were slower.
    pub fn for_shape(m: usize, n: usize, k: usize, sms: usize) -> MatmulPlan {
        let base = MatmulConfig::for_shape(m, n);
        if base != MatmulConfig::SMALL {
            return MatmulPlan::tiles(base);
        }
        let cfg = MatmulConfig::SPLIT;
        let tiles = m.div_ceil(cfg.block_m) * n.div_ceil(cfg.block_n);
        let by_sms = sms.max(1) / tiles.max(1);
        let by_k = k.div_ceil(cfg.block_k) / MIN_SLICE_ITERS;
        let splits = by_sms.min(by_k);
        if splits < 2 {
            return MatmulPlan::tiles(MatmulConfig::SMALL);
        }
        if splits == 2 && k.div_ceil(cfg.block_k) < 2 * TWO_SLICE_MIN_ITERS {
            return MatmulPlan::tiles(cfg.stages(5));
        }
        MatmulPlan {
            config: cfg,
            splits,
        }
        .normalized(k)
    }

    /// [`MatmulPlan::for_shape`] on the GPU `info` describes, with what its shared
    /// memory and memory bandwidth allow:
    /// - on Hopper (compute capability 9.0) the 128 x 256 tile takes a 4-stage ring,
    ///   which only its 227 KiB hold (docs/perf.md, "Four stages of 128 x 256 on
    ///   Hopper": 4096^3 at 711-723 TFLOP/s against 701-716 with three, 8192^3 700-742
    ///   against 656-715 on an H200);
    /// - on compute capability 9.0, where the copy engine fills the ring, the 128 x 128
    ///   tile takes 5 stages instead of 4 (docs/perf.md, "The copy engine for the
    ///   operands": 512 x 4096 x 1024 at 466-470 TFLOP/s against 447-458 on an H200 and
    ///   432-437 against 419-423 on an H100; 2048 x 1024 x 2048 610 against 597 and 582
    ///   against 563; 2048 x 1024 x 3072 668 against 655 and 629-635 against 616);
    /// - a two-slice split of only [`TWO_SLICE_MIN_ITERS`] iterations a slice runs
    ///   unsplit (64 x 128, 5 stages) below [`SPLIT_PARTIALS_MIN_BANDWIDTH`]: the f32
    ///   partials' round trip costs that much more there (512 x 1024 x 3072: on an H100,
    ///   3.35 TB/s, 249 TFLOP/s unsplit against 234 split; on an H200, 4.8 TB/s, 246-248
    ///   against 257-258; docs/perf.md, "Four stages of 128 x 256 on Hopper").
    pub fn for_device(info: &DeviceInfo, m: usize, n: usize, k: usize) -> MatmulPlan {
        let plan = MatmulPlan::for_shape(m, n, k, info.sm_count);
        if info.compute_capability.0 >= 9 && plan == MatmulPlan::tiles(MatmulConfig::LARGE) {
            return MatmulPlan::tiles(MatmulConfig::LARGE.stages(4));
        }
        if info.compute_capability == (9, 0)
            && plan == MatmulPlan::tiles(MatmulConfig::MEDIUM.stages(4))
        {
            return MatmulPlan::tiles(MatmulConfig::MEDIUM.stages(5));
        }
        let iters = k.div_ceil(plan.config.block_k);
        if plan.splits == 2
            && iters <= 2 * TWO_SLICE_MIN_ITERS
            && info.memory_bandwidth < SPLIT_PARTIALS_MIN_BANDWIDTH
        {
            return MatmulPlan::tiles(MatmulConfig::SPLIT.stages(5));
        }
        plan
    }

    /// K per slice: `k / splits` rounded up to a multiple of `block_k`.
    pub fn k_slice(&self, k: usize) -> usize {
        let bk = self.config.block_k;
        k.div_ceil(self.splits.max(1)).div_ceil(bk).max(1) * bk
    }

    /// This plan with `splits` lowered to the number of non-empty slices of `k` (a
    /// split of 4 over 5 iterations of `block_k` is 3 slices of 2, 2 and 1).
    pub fn normalized(self, k: usize) -> MatmulPlan {
        let splits = k.div_ceil(self.k_slice(k)).max(1);
        MatmulPlan { splits, ..self }
    }

    /// Programs launched: tiles times slices.
    pub fn programs(&self, m: usize, n: usize) -> usize {
        self.config.grid(m, n)[0] as usize * self.splits
    }
}

/// Scratch for split-K launches: the f32 partials (`splits x m x n`) and one arrival
/// counter per output tile. The counters start at zero and every completed launch
/// leaves them at zero (the last program of each tile resets its counter), so one
/// workspace serves any number of launches on one stream whose plans fit it. A launch
/// interrupted part-way (a device error) leaves it unusable: make a new one.
pub struct SplitWorkspace {
    partials: Buffer<f32>,
    counters: Buffer<i32>,
}

impl SplitWorkspace {
    /// Room for `plan` on an `m x n` output.
    pub fn new(dev: &Device, plan: MatmulPlan, m: usize, n: usize) -> Result<Self, RuntimeError> {
        Ok(SplitWorkspace {
            partials: dev.zeros(plan.splits * m * n)?,
            counters: dev.zeros(plan.config.grid(m, n)[0] as usize)?,
        })
    }

    /// Whether `plan` on an `m x n` output fits this workspace.
    pub fn fits(&self, plan: MatmulPlan, m: usize, n: usize) -> bool {
        self.partials.len() >= plan.splits * m * n
            && self.counters.len() >= plan.config.grid(m, n)[0] as usize
    }
}

/// The `C` element types [`launch`] accepts: bf16 and f32, [`matmul`]'s two.
pub trait MatmulOut: crate::dsl::runtime::Element {
    /// The kernel that stores this type.
    fn def() -> &'static KernelDef;
    /// Its split-K form.
    fn split_def() -> &'static KernelDef;
}

impl MatmulOut for bf16 {
    fn def() -> &'static KernelDef {
        &MATMUL_BF16
    }
    fn split_def() -> &'static KernelDef {
        &MATMUL_SPLIT_BF16
    }
}

impl MatmulOut for f32 {
    fn def() -> &'static KernelDef {
        &MATMUL_F32
    }
    fn split_def() -> &'static KernelDef {
        &MATMUL_SPLIT_F32
    }
}

/// `c = a @ b` for row-major `a [m, k]`, `b [k, n]`, `c [m, n]` on `dev`, with the tile
/// configuration `config` (which must be one the kernel was compiled with; the error
/// lists those). `n` and `k` must be multiples of 16; offsets must fit in `i32`
/// (`m * k`, `k * n`, `m * n` below 2^31).
#[allow(clippy::too_many_arguments)]
pub fn launch<T: MatmulOut>(
    dev: &Device,
    a: &Buffer<bf16>,
    b: &Buffer<bf16>,
    c: &mut Buffer<T>,
    m: usize,
    n: usize,
    k: usize,
    config: MatmulConfig,
) -> Result<(), LaunchError> {
    let def = T::def();
    let too_big = [m * k, k * n, m * n].iter().any(|&x| x > i32::MAX as usize);
    if too_big || a.len() < m * k || b.len() < k * n || c.len() < m * n {
        return Err(LaunchError::Config {
            kernel: def.name.into(),
            message: format!(
                "{m}x{n}x{k}: buffers of {} (a), {} (b), {} (c) elements, or offsets past i32",
                a.len(),
                b.len(),
                c.len()
            ),
        });
    }
    let cfg = LaunchConfig::grid(config.grid(m, n))
        .num_warps(config.num_warps)
        .num_stages(config.num_stages);
    def.launch_dyn(
        dev,
        cfg,
        &config.consts(),
        &mut [
            KernelArg::read(a),
            KernelArg::read(b),
            KernelArg::write(c),
            KernelArg::from(m as i32),
            KernelArg::from(n as i32),
            KernelArg::from(k as i32),
        ],
    )
}

/// `c = a @ b` as [`launch`] does, following `plan`: with `plan.splits > 1` through
/// [`matmul_split`] (K cut into slices of [`MatmulPlan::k_slice`]; the last program of
/// each tile reduces the partials in slice order, so results do not depend on timing),
/// using `workspace`, which must fit the plan ([`SplitWorkspace::new`] with the same
/// plan and output shape, or a larger one); otherwise [`launch`] (no workspace needed).
#[allow(clippy::too_many_arguments)]
pub fn launch_plan<T: MatmulOut>(
    dev: &Device,
    a: &Buffer<bf16>,
    b: &Buffer<bf16>,
    c: &mut Buffer<T>,
    m: usize,
    n: usize,
    k: usize,
    plan: MatmulPlan,
    workspace: Option<&mut SplitWorkspace>,
) -> Result<(), LaunchError> {
    let plan = plan.normalized(k);
    if plan.splits <= 1 {
        return launch(dev, a, b, c, m, n, k, plan.config);
    }
    let def = T::split_def();
    let bad = |message: String| LaunchError::Config {
        kernel: def.name.into(),
        message,
    };
    let Some(ws) = workspace else {
        return Err(bad(format!(
            "{m}x{n}x{k} split {} ways needs a SplitWorkspace",
            plan.splits
        )));
    };
    if !ws.fits(plan, m, n) {
        return Err(bad(format!(
            "{m}x{n}x{k} split {} ways needs {} partials and {} counters; the workspace \
             has {} and {}",
            plan.splits,
            plan.splits * m * n,
            plan.config.grid(m, n)[0],
            ws.partials.len(),
            ws.counters.len()
        )));
    }
    let too_big = [m * k, k * n, plan.splits * m * n]
        .iter()
        .any(|&x| x > i32::MAX as usize);
    if too_big || a.len() < m * k || b.len() < k * n || c.len() < m * n {
        return Err(bad(format!(
            "{m}x{n}x{k}: buffers of {} (a), {} (b), {} (c) elements, or offsets past i32",
            a.len(),
            b.len(),
            c.len()
        )));
    }
    let [tiles, _, _] = plan.config.grid(m, n);
    let cfg = LaunchConfig::grid([tiles, plan.splits as u32, 1]).num_warps(plan.config.num_warps);
    def.launch_dyn(
        dev,
        cfg,
        &plan.config.consts(),
        &mut [
            KernelArg::read(a),
            KernelArg::read(b),
            KernelArg::write(c),
            KernelArg::write(&mut ws.partials),
            KernelArg::write(&mut ws.counters),
            KernelArg::from(m as i32),
            KernelArg::from(n as i32),
            KernelArg::from(k as i32),
            KernelArg::from(plan.k_slice(k) as i32),
        ],
    )
}
