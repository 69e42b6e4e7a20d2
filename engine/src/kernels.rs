//! The decode kernels, written in tilefuse's kernel language.
//!
//! One decode step runs, per layer:
//!
//! 1. [`rms_norm_gemv`]: RMSNorm of the hidden state, then the fused QKV projection
//!    (`[q; k; v]` rows of one weight) plus bias;
//! 2. [`attention_split`] + [`attention_combine`]: QK-norm (Qwen3), RoPE and the K/V
//!    append to the cache, folded into split-K decode attention, then the merge of the
//!    splits;
//! 3. [`gemv_residual`]: O projection added into the hidden state;
//! 4. [`rms_norm_gate_up`]: RMSNorm, the fused `[gate; up]` projection and `silu(g) * u`;
//! 5. [`gemv_residual`]: down projection added into the hidden state;
//!
//! and around the layers [`embed`], then [`lm_head_argmax`] + [`argmax_finish`].
//!
//! Where they round mirrors the host reference decoder ([`crate::reference`]), which
//! mirrors transformers in bf16: hidden states, norm outputs and projections are bf16,
//! arithmetic is f32. The step reads the token and position from a device-resident
//! `state = [token, pos]` and the last kernel writes the next token and `pos + 1` back,
//! so one captured launch sequence serves every position.
//!
//! Row-major weights `[n, k]` need `k` to be a multiple of 8, so that each thread reads
//! 16-byte vectors; real checkpoints all satisfy it, and loading checks it.
//!
//! The layer kernels (steps 1-5) end with two timeline arguments, `stamps` and
//! `stamp_at`: with `stamp_at >= 0`, program `p` (linear index, x fastest) writes its
//! entry time, the time it got past `wait_for_prior_kernels()`, its exit time (all
//! `global_timer()` nanoseconds) and its `sm_id()` to `stamps[(stamp_at + p) * 4..][..4]`
//! ([`crate::decode::Decoder::timeline`]); with `-1` they write nothing.

use tilefuse_macros::{kernel, tile_fn};

/// The clock for the timeline (`global_timer()`), read only when asked for
/// (`stamp_at >= 0`; see the module docs), else 0.
#[tile_fn(crate = tilefuse_dsl)]
pub fn stamp_clock(stamp_at: i32) -> i64 {
    let mut t = 0 as i64;
    if stamp_at >= 0 {
        t = global_timer();
    }
    t
}

/// This program's timeline stamps when asked for (`stamp_at >= 0`): its entry time, the
/// time it got past `wait_for_prior_kernels()`, now, and its SM, at its index in the grid
/// (x fastest; 1-, 2- and 3-D grids alike).
#[tile_fn(crate = tilefuse_dsl)]
pub fn store_stamps(stamps: Ptr<i64>, stamp_at: i32, t_entry: i64, t_wait: i64) {
    if stamp_at >= 0 {
        let program =
            (program_id(2) * num_programs(1) + program_id(1)) * num_programs(0) + program_id(0);
        let at = stamps + (stamp_at + program) * 4;
        store(at, t_entry);
        store(at + 1, t_wait);
        store(at + 2, global_timer());
        store(at + 3, sm_id() as i64);
    }
}

/// Stamp `slot` of this program's timeline record when asked for (`stamp_at >= 0`):
/// 0 entry, 1 past the wait, 2 exit (with its `sm_id()` in slot 3), at the program's
/// index in the grid (x fastest), as [`store_stamps`] lays them out. Each stamp is
/// stored as it is read, so no clock value stays live across the kernel: the quantized
/// GEMVs run at register limits (`max_registers`), where two more live values could
/// change their occupancy. The quantized kernels write their entry stamp just before
/// their wait, once their first loads are issued.
///
/// `STAMPS` is the kernel's compile-time switch: with 0 no stamp code is compiled at
/// all. The branch on `stamp_at` alone, in every launch of a graph without a timeline,
/// cost the Qwen3-0.6B step 1.3% (2.1% with the entry stamp at the kernel's start;
/// docs/perf.md, "The quantized layer's timeline"), so the decode step launches the
/// `STAMPS = 0` variants unless it records a timeline.
#[tile_fn(crate = tilefuse_dsl)]
pub fn stamp_now<const STAMPS: usize>(stamps: Ptr<i64>, stamp_at: i32, slot: i32) {
    if STAMPS == 1 {
        if stamp_at >= 0 {
            let program =
                (program_id(2) * num_programs(1) + program_id(1)) * num_programs(0) + program_id(0);
            let at = stamps + (stamp_at + program) * 4 + slot;
            store(at, global_timer());
            if slot == 2 {
                store(at + 1, sm_id() as i64);
            }
        }
    }
}

use crate::sampling::kernels as sampling;

/// Every decode kernel's description (this module's and device sampling's,
/// [`crate::sampling::kernels`]), for tooling (offline assembly, inspection).
pub fn all() -> [&'static tilefuse_dsl::runtime::KernelDef; 13] {
    [
        &EMBED,
        &RMS_NORM_GEMV,
        &ATTENTION_SPLIT,
        &ATTENTION_COMBINE,
        &GEMV_RESIDUAL,
        &RMS_NORM_GATE_UP,
        &LM_HEAD_ARGMAX,
        &ARGMAX_FINISH,
        &sampling::SAMPLE_DRAW,
        &sampling::SAMPLE_CHECK,
        &sampling::SAMPLE_PICK,
        &sampling::SAMPLE_TOPK_PART,
        &sampling::SAMPLE_TOPK_MASS,
    ]
}

/// `x = table[token]`: the embedding row of the token in `state[0]`.
#[kernel(crate = tilefuse_dsl, B = [1024], num_warps = [4])]
pub fn embed<const B: usize>(table: Ptr<bf16>, state: Ptr<i32>, x: Ptr<bf16>, h: i32) {
    let token = load(state);
    let offs = program_id(0) * B + arange(0, B);
    let ok = offs < h;
    store(x + offs, load(table + token * h + offs, ok, 0.0), ok);
}

/// `y = W · rmsnorm(x) + bias`, bf16 out, for `W` of shape `[n, k]`.
///
/// The norm is folded into the dot products: `y = inv_rms * (W · (norm_w * x)) + bias`
/// in f32, so the sum of squares and the row sums are accumulated in one pass and no
/// reduction stands between the input and the weights. The normalized input is not
/// rounded to bf16 as the reference model rounds it (`bf16(norm_w * bf16(x * inv_rms))`);
/// the two differ by less than the output's own bf16 rounding. Every program recomputes
/// `inv_rms`; `x` is a few KiB and stays in cache.
#[kernel(
    crate = tilefuse_dsl,
    BLOCK_N = [1, 2, 4, 8, 16],
    BLOCK_K = [256, 512, 1024],
    num_warps = [4, 8],
    // 2: each weight tile is requested an iteration ahead (see `lm_head_argmax`). Alone
    // it made the QKV shape faster with 16 x 512 tiles over 4 warps (H100 5.49 -> 5.12
    // us, H200 4.78 -> 4.52; docs/gpu-results.md), not inside the step; the other
    // shapes were slower.
    STAGES = [1, 2],
    // 1: each tile is reduced as it arrives (see `gemv_residual`); compiled for a few
    // 1024-column tiles: 16 rows over 8 warps is the default for rows wider than 1024
    // (Llama-3.2-1B's QKV, `tuning::norm_gemv_config`).
    REDUCE_EACH = [0, 1],
    // A 16 x 1024 tile for 128 threads, with the bias held across it, spills on sm_80.
    skip(BLOCK_N = 16, BLOCK_K = 1024, num_warps = 4),
    skip(STAGES = 2, BLOCK_N = [1, 2, 4]),
    skip(STAGES = 2, BLOCK_K = [256, 1024]),
    skip(REDUCE_EACH = 1, BLOCK_K = [256, 512]),
    skip(REDUCE_EACH = 1, BLOCK_N = [1, 2, 8]),
    skip(REDUCE_EACH = 1, STAGES = 2)
)]
pub fn rms_norm_gemv<
    const BLOCK_N: usize,
    const BLOCK_K: usize,
    const STAGES: usize,
    const REDUCE_EACH: usize,
>(
    x: Ptr<bf16>,
    norm_w: Ptr<bf16>,
    w: Ptr<bf16>,
    bias: Ptr<bf16>,
    y: Ptr<bf16>,
    n: i32,
    #[multiple_of(8)] k: i32,
    eps: f32,
    stamps: Ptr<i64>,
    stamp_at: i32,
) {
    // Timeline stamps (see the module docs): the clock is read only when asked for,
    // and stored at the end.
    let t_entry = stamp_clock(stamp_at);
    let rows = program_id(0) * BLOCK_N + arange(0, BLOCK_N);
    let row_ok = rows < n;
    let row_offs = rows.expand_dims(1) * k;
    // The first weight tile is requested before the norm's reduction, so its DRAM
    // latency overlaps the reduction (and with k <= BLOCK_K it is the only tile).
    let cols = arange(0, BLOCK_K);
    let col_ok = cols < k;
    let w_first = load(
        w + row_offs + cols.expand_dims(0),
        row_ok.expand_dims(1) & col_ok.expand_dims(0),
        0.0,
    );
    let mut w_ahead = w_first;
    if STAGES == 2 {
        w_ahead = load(
            w + row_offs + (cols + BLOCK_K).expand_dims(0),
            row_ok.expand_dims(1) & (cols + BLOCK_K < k).expand_dims(0),
            0.0,
        );
    }
    let g_first = load(norm_w + cols, col_ok, 0.0);
    let b = load(bias + rows, row_ok, 0.0) as f32;
    // Weights are never written during decode: only now wait for the kernels before
    // this one (with programmatic launch on Hopper, the loads above overlap their tail).
    wait_for_prior_kernels();
    let t_wait = stamp_clock(stamp_at);

    // One pass: the squares for the norm and the dot products with `norm_w * x` are
    // summed together, and `inv_rms` scales the row sums at the end (no reduction
    // before the dot products; the normalized input is not rounded to bf16).
    let xv = load(x + cols, col_ok, 0.0) as f32;
    let mut sq = xv * xv;
    let mut sq_sum = 0.0;
    let mut acc = zeros::<f32>([BLOCK_N, BLOCK_K]);
    let mut sums = zeros::<f32>([BLOCK_N]);
    if REDUCE_EACH == 1 {
        sq_sum = sq.sum(0);
        sums = ((w_first as f32) * ((g_first as f32) * xv).expand_dims(0)).sum(1);
    } else {
        acc = (w_first as f32) * ((g_first as f32) * xv).expand_dims(0);
    }
    for k0 in (BLOCK_K..k).step_by(BLOCK_K) {
        let cols = k0 + arange(0, BLOCK_K);
        let col_ok = cols < k;
        let xv = load(x + cols, col_ok, 0.0) as f32;
        let g = load(norm_w + cols, col_ok, 0.0) as f32;
        if REDUCE_EACH == 1 {
            sq_sum += (xv * xv).sum(0);
        } else {
            sq += xv * xv;
        }
        let mut wt = w_ahead;
        if STAGES == 2 {
            let next = cols + BLOCK_K;
            w_ahead = load(
                w + row_offs + next.expand_dims(0),
                row_ok.expand_dims(1) & (next < k).expand_dims(0),
                0.0,
            );
        } else {
            let mask = row_ok.expand_dims(1) & col_ok.expand_dims(0);
            wt = load(w + row_offs + cols.expand_dims(0), mask, 0.0);
        }
        if REDUCE_EACH == 1 {
            sums += ((wt as f32) * (g * xv).expand_dims(0)).sum(1);
        } else {
            acc += (wt as f32) * (g * xv).expand_dims(0);
        }
    }
    if REDUCE_EACH == 0 {
        sq_sum = sq.sum(0);
        sums = acc.sum(1);
    }
    let inv_rms = 1.0 / sqrt(sq_sum / (k as f32) + eps);
    store(y + rows, (sums * inv_rms + b) as bf16, row_ok);
    store_stamps(stamps, stamp_at, t_entry, t_wait);
}

/// `x = bf16(x + bf16(W · a + bias))`: a projection added into the residual stream.
#[kernel(
    crate = tilefuse_dsl,
    BLOCK_N = [1, 2, 4, 8],
    // 4096: a down projection's whole row (k = 3072) requested before the wait.
    BLOCK_K = [256, 512, 1024, 2048, 4096],
    num_warps = [4, 8],
    // 2: each weight tile is requested an iteration ahead (see `lm_head_argmax`);
    // slower for the O and down shapes on an H100 and an H200 (docs/gpu-results.md),
    // so compiled for 2 x 1024 tiles over 8 warps only, for comparisons.
    STAGES = [1, 2],
    // 1: each tile is reduced as it arrives, so no `[BLOCK_N, BLOCK_K]` f32 tile is
    // carried across the loop (fewer registers, one reduction a tile, and the products
    // fuse into it as `fma`); compiled for 4096-column tiles (the down projections'
    // default) and 2048-column ones (the O projection alone: 2 rows over 8 warps is the
    // fastest variant on an H100 since the fusion, docs/perf.md).
    REDUCE_EACH = [0, 1],
    skip(STAGES = 2, BLOCK_N = [1, 4, 8]),
    skip(STAGES = 2, BLOCK_K = [256, 512, 2048, 4096]),
    skip(STAGES = 2, num_warps = 4),
    skip(REDUCE_EACH = 1, BLOCK_K = [256, 512, 1024]),
    skip(REDUCE_EACH = 1, STAGES = 2),
    // 8 x 4096 weights for 128 threads spill.
    skip(BLOCK_N = 8, BLOCK_K = 4096, num_warps = 4)
)]
pub fn gemv_residual<
    const BLOCK_N: usize,
    const BLOCK_K: usize,
    const STAGES: usize,
    const REDUCE_EACH: usize,
>(
    w: Ptr<bf16>,
    a: Ptr<bf16>,
    bias: Ptr<bf16>,
    x: Ptr<bf16>,
    n: i32,
    #[multiple_of(8)] k: i32,
    stamps: Ptr<i64>,
    stamp_at: i32,
) {
    // Timeline stamps (see the module docs): the clock is read only when asked for,
    // and stored at the end.
    let t_entry = stamp_clock(stamp_at);
    let rows = program_id(0) * BLOCK_N + arange(0, BLOCK_N);
    let row_ok = rows < n;
    let row_offs = rows.expand_dims(1) * k;
    // The first weight tile is requested before waiting for the kernels that produce
    // `a` and `x` (see rms_norm_gemv).
    let cols = arange(0, BLOCK_K);
    let col_ok = cols < k;
    let w_first = load(
        w + row_offs + cols.expand_dims(0),
        row_ok.expand_dims(1) & col_ok.expand_dims(0),
        0.0,
    );
    let mut w_ahead = w_first;
    if STAGES == 2 {
        w_ahead = load(
            w + row_offs + (cols + BLOCK_K).expand_dims(0),
            row_ok.expand_dims(1) & (cols + BLOCK_K < k).expand_dims(0),
            0.0,
        );
    }
    let b = load(bias + rows, row_ok, 0.0) as f32;
    wait_for_prior_kernels();
    let t_wait = stamp_clock(stamp_at);
    // Everything the end needs is requested now, not after the reduction (each load
    // issued after a barrier costs its own round trip).
    let old = load(x + rows, row_ok, 0.0) as f32;
    let av = load(a + cols, col_ok, 0.0) as f32;
    let mut acc = zeros::<f32>([BLOCK_N, BLOCK_K]);
    let mut sums = zeros::<f32>([BLOCK_N]);
    if REDUCE_EACH == 1 {
        sums = ((w_first as f32) * av.expand_dims(0)).sum(1);
    } else {
        acc = (w_first as f32) * av.expand_dims(0);
    }
    for k0 in (BLOCK_K..k).step_by(BLOCK_K) {
        let cols = k0 + arange(0, BLOCK_K);
        let col_ok = cols < k;
        let av = load(a + cols, col_ok, 0.0) as f32;
        let mut wt = w_ahead;
        if STAGES == 2 {
            let next = cols + BLOCK_K;
            w_ahead = load(
                w + row_offs + next.expand_dims(0),
                row_ok.expand_dims(1) & (next < k).expand_dims(0),
                0.0,
            );
        } else {
            let mask = row_ok.expand_dims(1) & col_ok.expand_dims(0);
            wt = load(w + row_offs + cols.expand_dims(0), mask, 0.0);
        }
        if REDUCE_EACH == 1 {
            sums += ((wt as f32) * av.expand_dims(0)).sum(1);
        } else {
            acc += (wt as f32) * av.expand_dims(0);
        }
    }
    if REDUCE_EACH == 0 {
        sums = acc.sum(1);
    }
    let proj = (sums + b) as bf16 as f32;
    store(x + rows, (old + proj) as bf16, row_ok);
    store_stamps(stamps, stamp_at, t_entry, t_wait);
}

/// `act = bf16(bf16(silu(g)) * u)` with `g = W[r] · rmsnorm(x)` and
/// `u = W[inter + r] · rmsnorm(x)`: the MLP's first half, over one fused `[2 * inter, k]`
/// weight (gate rows, then up rows).
///
/// `rmsnorm(x)` is folded into the dot products as in [`rms_norm_gemv`] (f32, the
/// normalized input not rounded to bf16).
#[kernel(
    crate = tilefuse_dsl,
    BLOCK_N = [1, 2, 4, 8],
    BLOCK_K = [256, 512, 1024],
    num_warps = [4],
    // 2: each weight tile is requested an iteration ahead (see `lm_head_argmax`);
    // slower for the gate+up shape on an H100 and an H200 (docs/gpu-results.md), so
    // compiled for one tile only, for comparisons.
    STAGES = [1, 2],
    // 1: each tile is reduced as it arrives (see `gemv_residual`); compiled for the
    // 1024-column tiles, a whole row of the 1024-wide models.
    REDUCE_EACH = [0, 1],
    skip(STAGES = 2, BLOCK_N = [1, 2, 4]),
    skip(STAGES = 2, BLOCK_K = [512, 1024]),
    skip(REDUCE_EACH = 1, BLOCK_K = [256, 512]),
    skip(REDUCE_EACH = 1, STAGES = 2),
    // Two 8 x 1024 f32 accumulators for 128 threads, with the squares for the norm, spill.
    skip(BLOCK_N = 8, BLOCK_K = 1024, REDUCE_EACH = 0)
)]
pub fn rms_norm_gate_up<
    const BLOCK_N: usize,
    const BLOCK_K: usize,
    const STAGES: usize,
    const REDUCE_EACH: usize,
>(
    x: Ptr<bf16>,
    norm_w: Ptr<bf16>,
    w: Ptr<bf16>,
    act: Ptr<bf16>,
    inter: i32,
    #[multiple_of(8)] k: i32,
    eps: f32,
    stamps: Ptr<i64>,
    stamp_at: i32,
) {
    // Timeline stamps (see the module docs): the clock is read only when asked for,
    // and stored at the end.
    let t_entry = stamp_clock(stamp_at);
    let rows = program_id(0) * BLOCK_N + arange(0, BLOCK_N);
    let row_ok = rows < inter;
    let row_offs = rows.expand_dims(1) * k;
    // First gate and up tiles requested before the norm's reduction (see rms_norm_gemv).
    let cols = arange(0, BLOCK_K);
    let col_ok = cols < k;
    let mask = row_ok.expand_dims(1) & col_ok.expand_dims(0);
    let g_first = load(w + row_offs + cols.expand_dims(0), mask, 0.0);
    let u_first = load(w + inter * k + row_offs + cols.expand_dims(0), mask, 0.0);
    let mut g_ahead = g_first;
    let mut u_ahead = u_first;
    if STAGES == 2 {
        let ahead = row_offs + (cols + BLOCK_K).expand_dims(0);
        let ahead_ok = row_ok.expand_dims(1) & (cols + BLOCK_K < k).expand_dims(0);
        g_ahead = load(w + ahead, ahead_ok, 0.0);
        u_ahead = load(w + inter * k + ahead, ahead_ok, 0.0);
    }
    let gw_first = load(norm_w + cols, col_ok, 0.0) as f32;
    wait_for_prior_kernels();
    let t_wait = stamp_clock(stamp_at);

    // One pass, as in `rms_norm_gemv`: `inv_rms` scales the row sums at the end.
    let xv = load(x + cols, col_ok, 0.0) as f32;
    let mut sq = xv * xv;
    let mut sq_sum = 0.0;
    let xg = (gw_first * xv).expand_dims(0);
    let mut acc_g = zeros::<f32>([BLOCK_N, BLOCK_K]);
    let mut acc_u = zeros::<f32>([BLOCK_N, BLOCK_K]);
    let mut sum_g = zeros::<f32>([BLOCK_N]);
    let mut sum_u = zeros::<f32>([BLOCK_N]);
    if REDUCE_EACH == 1 {
        sq_sum = sq.sum(0);
        sum_g = ((g_first as f32) * xg).sum(1);
        sum_u = ((u_first as f32) * xg).sum(1);
    } else {
        acc_g = (g_first as f32) * xg;
        acc_u = (u_first as f32) * xg;
    }
    for k0 in (BLOCK_K..k).step_by(BLOCK_K) {
        let cols = k0 + arange(0, BLOCK_K);
        let col_ok = cols < k;
        let xv = load(x + cols, col_ok, 0.0) as f32;
        let gw = load(norm_w + cols, col_ok, 0.0) as f32;
        if REDUCE_EACH == 1 {
            sq_sum += (xv * xv).sum(0);
        } else {
            sq += xv * xv;
        }
        let xg = (gw * xv).expand_dims(0);
        let mut gt = g_ahead;
        let mut ut = u_ahead;
        if STAGES == 2 {
            let next = cols + BLOCK_K;
            let ahead = row_offs + next.expand_dims(0);
            let ahead_ok = row_ok.expand_dims(1) & (next < k).expand_dims(0);
            g_ahead = load(w + ahead, ahead_ok, 0.0);
            u_ahead = load(w + inter * k + ahead, ahead_ok, 0.0);
        } else {
            let mask = row_ok.expand_dims(1) & col_ok.expand_dims(0);
            let offs = row_offs + cols.expand_dims(0);
            gt = load(w + offs, mask, 0.0);
            ut = load(w + inter * k + offs, mask, 0.0);
        }
        if REDUCE_EACH == 1 {
            sum_g += ((gt as f32) * xg).sum(1);
            sum_u += ((ut as f32) * xg).sum(1);
        } else {
            acc_g += (gt as f32) * xg;
            acc_u += (ut as f32) * xg;
        }
    }
    if REDUCE_EACH == 0 {
        sq_sum = sq.sum(0);
        sum_g = acc_g.sum(1);
        sum_u = acc_u.sum(1);
    }
    let inv_rms = 1.0 / sqrt(sq_sum / (k as f32) + eps);
    let gate = (sum_g * inv_rms) as bf16 as f32;
    let up = (sum_u * inv_rms) as bf16 as f32;
    let silu = (gate / (1.0 + exp(-gate))) as bf16 as f32;
    store(act + rows, (silu * up) as bf16, row_ok);
    store_stamps(stamps, stamp_at, t_entry, t_wait);
}

/// Decode attention, first pass, with the step's QK-norm (when `use_norm != 0`), RoPE
/// and KV-cache append folded in.
///
/// Program `(kv_head, split, chunk)` attends `G` of the query heads sharing `kv_head`
/// (the group padded to a multiple of `G`; larger groups take several programs along
/// grid z) over its share of the positions `0..=pos` (`pos` read from `state[1]`): the
/// last split takes the new position `pos` alone (unless there is only one), the others
/// share the cached `0..pos`, at least `min_chunk` positions each, so at short contexts
/// only the first splits have any. Each runs an online softmax, and writes the partial max, denominator and weighted value sum per
/// query head and split for [`attention_combine`]. With `CLUSTER > 1` the `CLUSTER`
/// splits of a KV head are one thread-block cluster (grid y = `CLUSTER`): they exchange
/// their partials with `cluster_gather` and split 0 writes the merged bf16 head outputs
/// to `out` itself, with no second kernel (sm_90, or the interpreter).
///
/// The queries and the new key and value come straight from the fused projection `qkv`
/// (`[q heads | k heads | v heads]`): each program normalizes and rotates its queries
/// (`rope_cos` / `rope_sin` hold `[max_seq, D / 2]` bf16-rounded values, as the reference
/// computes them); the last split's programs compute the new key, take the
/// new position from registers and appends key and value to row `pos` of the caches
/// (`[num_kv_heads, max_seq, D]`), which no program of this launch reads. Split 0 also
/// stores the rotated queries in `q_out`, for inspection.
///
/// When no split holds more than one `BS`-position tile, each program also asks L2 for
/// its share of the first `prefetch_len` elements of `prefetch_w` (`prefetch_range`,
/// none when 0) once past its wait.
///
/// Scores round like the reference (`bf16(bf16(q·k) * scale)`); the probabilities stay
/// f32 (the reference rounds the normalized probabilities, which a split pass cannot).
///
/// `STAGES` picks how the cache is streamed: 1 requests the next `BS`-position tile once
/// this one is used (one tile of registers; the default, see
/// [`crate::tuning::ATTENTION_STAGES`]), 2 requests it before (double buffering).
#[kernel(
    crate = tilefuse_dsl,
    D = [32, 64, 128],
    G = [1, 2, 4],
    BS = [32, 64],
    STAGES = [1, 2],
    // 1: partials for `attention_combine`; more: the splits of a KV head form one
    // thread-block cluster and merge in the kernel (sm_90). Measured slower than split
    // + combine on an H100 (docs/perf.md), so only for tests (2, 32-position tiles)
    // and comparisons (8 and 16, the Qwen3 head shape over 64-position tiles).
    CLUSTER = [1, 2, 8, 16],
    cluster(y = CLUSTER),
    // 8 warps were never faster (`examples/bandwidth.rs`, `tilefuse bench --sweep`;
    // with the chunked layout +3.1% a step in the paired sweep: docs/perf.md, "Decode
    // kernels: results").
    num_warps = [4],
    // Two 64-position tiles for four heads need more than 255 registers a thread.
    skip(D = 128, G = 4, BS = 64, STAGES = 2, num_warps = 4),
    skip(CLUSTER = 2, BS = 64),
    skip(CLUSTER = 2, D = 64),
    skip(CLUSTER = [8, 16], BS = 32),
    skip(CLUSTER = [8, 16], D = [32, 64]),
    skip(CLUSTER = [8, 16], G = [1, 4])
)]
pub fn attention_split<
    const D: usize,
    const G: usize,
    const BS: usize,
    const STAGES: usize,
    const CLUSTER: usize,
>(
    qkv: Ptr<bf16>,
    q_norm_w: Ptr<bf16>,
    k_norm_w: Ptr<bf16>,
    rope_cos: Ptr<f32>,
    rope_sin: Ptr<f32>,
    state: Ptr<i32>,
    k_cache: Ptr<bf16>,
    v_cache: Ptr<bf16>,
    q_out: Ptr<bf16>,
    part_m: Ptr<f32>,
    part_l: Ptr<f32>,
    part_acc: Ptr<f32>,
    out: Ptr<bf16>,
    group: i32,
    max_seq: i32,
    min_chunk: i32,
    use_norm: i32,
    eps: f32,
    scale: f32,
    prefetch_w: Ptr<bf16>,
    prefetch_len: i32,
    prefetch_q: Ptr<u32>,
    prefetch_q_len: i32,
    stamps: Ptr<i64>,
    stamp_at: i32,
) {
    // Timeline stamps (see the module docs): the clock is read only when asked for,
    // and stored at the end.
    let t_entry = stamp_clock(stamp_at);
    let kv_head = program_id(0);
    let split = program_id(1);
    let splits = num_programs(1);
    let num_heads = num_programs(0) * group;
    // Clamped so that a step past the cache's end stays inside every buffer (its
    // result is meaningless; the engine never runs one).
    let pos = minimum(load(state + 1), max_seq - 1);
    // The last split takes the new position alone (with more than one split): the
    // program that owns it normalizes, rotates and appends the new key and scores it,
    // serial work that made a program which also reads a share of the cache the
    // launch's last to finish (`tilefuse bench --timeline`). The others share the
    // cached positions `0..pos`, at least `min_chunk` each: at short contexts the later
    // ones are empty (they write an empty partial and read no cache), so fewer
    // programs wait on memory and the merge weighs fewer partials.
    let cached_splits = maximum(splits - 1, 1);
    let per_split = maximum(cdiv(pos, cached_splits), min_chunk);
    let start = split * per_split;
    // Cached positions only: `pos` itself is not in the cache yet. Empty for the last
    // split: `(splits - 1) * per_split >= pos`.
    let end = minimum(start + per_split, pos);
    let base = kv_head * max_seq * D;
    // A head's D dims as 4 chunks of D / 4 (`dims[c, j] = c * D / 4 + j`), the leading
    // tile dim of every head-sized tile: the compiler gives each warp a chunk, so the
    // softmax and the value sums over positions stay inside a warp and a cache tile
    // needs one cross-warp sum (its dot products), not a shared-memory round trip per
    // reduction. RoPE pairs chunk c with chunk (c + 2) % 4 (element j with j + D / 2),
    // the first half subtracting its partner's rotated term, the second adding it.
    let c = arange(0, 4);
    let j = arange(0, D / 4);
    let dims = (c * (D / 4)).expand_dims(1) + j.expand_dims(0);
    let partner = (((c + 2) % 4) * (D / 4)).expand_dims(1) + j.expand_dims(0);
    let half = ((c % 2) * (D / 4)).expand_dims(1) + j.expand_dims(0);
    let sign = select(c < 2, -1.0, 1.0).expand_dims(1);

    // The first cache tile (`[4, BS, D / 4]`) is requested before the queries are
    // computed, so its latency overlaps theirs; each iteration then requests the next.
    let s = start + arange(0, BS);
    let ok = (s < end).expand_dims(0).expand_dims(2);
    let offs = (base + s * D).expand_dims(0).expand_dims(2) + dims.expand_dims(1);
    let mut kt = load(k_cache + offs, ok, 0.0);
    let mut vt = load(v_cache + offs, ok, 0.0);
    let rot_cos = load(rope_cos + pos * (D / 2) + half);
    let rot_sin = load(rope_sin + pos * (D / 2) + half);
    // Norm weights: with ones when the model has no QK-norm.
    let qw = (load(q_norm_w + dims) as f32).expand_dims(0);
    let qw_partner = (load(q_norm_w + partner) as f32).expand_dims(0);
    let kw = load(k_norm_w + dims) as f32;
    let kw_partner = load(k_norm_w + partner) as f32;
    // Everything above was written before this step began (the position by the last
    // step, cache rows below `pos` by earlier ones): only the projection `qkv` comes
    // from the kernel just before.
    wait_for_prior_kernels();
    let t_wait = stamp_clock(stamp_at);
    // Only now let the next kernels start: triggered at entry, programs of the combine
    // and the O projection started early and their loads competed with this kernel's
    // (H100: 121.3 -> 112.5 us a decode step, 6.71 -> 5.09 us alone at 512 positions).
    launch_dependents();
    // When every split holds at most one tile, this launch is now arithmetic on bytes
    // already requested and HBM idles until the next GEMV's programs start: one bulk
    // request a program asks L2 for its share of the first `prefetch_len` bf16 of
    // `prefetch_w` (the decode step names the layer's gate/up weights, read two
    // launches later), or of the first `prefetch_q_len` packed words of `prefetch_q`
    // when those weights are quantized. Longer shares stream the cache and need HBM
    // themselves.
    let programs = num_programs(0) * num_programs(1) * num_programs(2);
    let me = (program_id(2) * num_programs(1) + split) * num_programs(0) + kv_head;
    if (prefetch_len > 0) & (per_split <= BS) {
        let per = cdiv(cdiv(prefetch_len, programs), 64) * 64;
        let first = minimum(me * per, prefetch_len);
        prefetch_range(prefetch_w + first, minimum(per, prefetch_len - first));
    }
    if (prefetch_q_len > 0) & (per_split <= BS) {
        let per = cdiv(cdiv(prefetch_q_len, programs), 32) * 32;
        let first = minimum(me * per, prefetch_q_len);
        prefetch_range(prefetch_q + first, minimum(per, prefetch_q_len - first));
    }

    // Queries `[G, 4, D / 4]`: QK-norm and RoPE, each element with its RoPE partner.
    let g = program_id(2) * G + arange(0, G);
    let g_ok = g < group;
    let heads = kv_head * group + g;
    let head_at = (heads * D).expand_dims(1).expand_dims(2);
    let q_ok = g_ok.expand_dims(1).expand_dims(2);
    let mut a = load(qkv + head_at + dims.expand_dims(0), q_ok, 0.0) as f32;
    let mut b = load(qkv + head_at + partner.expand_dims(0), q_ok, 0.0) as f32;
    // The new key and value, requested with the queries (one round trip, not a second
    // one at the end); only the program that owns `pos` uses them.
    let k_at = (num_heads + kv_head) * D;
    let mut ka = load(qkv + k_at + dims) as f32;
    let mut kb = load(qkv + k_at + partner) as f32;
    let v_new = load(qkv + (num_heads + num_programs(0) + kv_head) * D + dims);
    if use_norm != 0 {
        let inv_rms = 1.0 / sqrt((a * a).sum(2).sum(1) / (D as f32) + eps);
        let inv = inv_rms.expand_dims(1).expand_dims(2);
        a = (qw * ((a * inv) as bf16 as f32)) as bf16 as f32;
        b = (qw_partner * ((b * inv) as bf16 as f32)) as bf16 as f32;
    }
    let cs = rot_cos.expand_dims(0);
    let sn = rot_sin.expand_dims(0);
    let turn = (sign.expand_dims(0) * b * sn) as bf16 as f32;
    let q = (((a * cs) as bf16 as f32) + turn) as bf16 as f32;
    if split == 0 {
        store(q_out + head_at + dims.expand_dims(0), q as bf16, q_ok);
    }

    // The new position's key, appended by the last split's programs, and its scores
    // against the queries (computed before any cache tile: with a single split, while
    // the first is in flight, not after the loop).
    let owner = (split == splits - 1) | (splits == 1);
    let mut score_new = full([G], f32::NEG_INFINITY);
    if owner {
        if use_norm != 0 {
            let inv_rms = 1.0 / sqrt((ka * ka).sum(1).sum(0) / (D as f32) + eps);
            ka = (kw * ((ka * inv_rms) as bf16 as f32)) as bf16 as f32;
            kb = (kw_partner * ((kb * inv_rms) as bf16 as f32)) as bf16 as f32;
        }
        let turn = (sign * kb * rot_sin) as bf16 as f32;
        let k_new = (((ka * rot_cos) as bf16 as f32) + turn) as bf16;
        if program_id(2) == 0 {
            let at = base + pos * D;
            store(k_cache + at + dims, k_new);
            store(v_cache + at + dims, v_new);
        }
        let dots = (q * (k_new as f32).expand_dims(0)).sum(2).sum(1);
        score_new = ((dots as bf16 as f32) * scale) as bf16 as f32;
    }

    let mut m = full([G], f32::NEG_INFINITY);
    let mut l = zeros::<f32>([G]);
    let mut acc = zeros::<f32>([G, 4, D / 4]);
    for s0 in (start..end).step_by(BS) {
        let s = s0 + arange(0, BS);
        let ok = s < end;
        let next = s + BS;
        let next_ok = (next < end).expand_dims(0).expand_dims(2);
        let next_offs = (base + next * D).expand_dims(0).expand_dims(2) + dims.expand_dims(1);
        let mut next_kt = kt;
        let mut next_vt = vt;
        if STAGES == 2 {
            // Double buffering: the next tile flies while this one is used (twice the
            // tile registers, 230 a thread for pairs of heads; measured slower than a
            // single buffer, see `tuning::ATTENTION_STAGES`).
            next_kt = load(k_cache + next_offs, next_ok, 0.0);
            next_vt = load(v_cache + next_offs, next_ok, 0.0);
        }
        let dots = ((kt as f32).expand_dims(0) * q.expand_dims(2))
            .sum(3)
            .sum(1);
        let scores = ((dots as bf16 as f32) * scale) as bf16 as f32;
        let scores = select(ok.expand_dims(0), scores, f32::NEG_INFINITY);
        let m_new = maximum(m, scores.max(1));
        let p = exp(scores - m_new.expand_dims(1));
        let alpha = exp(m - m_new);
        // The value sums first: the accumulator keeps their layout across iterations
        // (the rescaled old sums follow it, not the other way round).
        let pv = ((vt as f32).expand_dims(0) * p.expand_dims(1).expand_dims(3)).sum(2);
        acc = pv + acc * alpha.expand_dims(1).expand_dims(2);
        l = l * alpha + p.sum(1);
        m = m_new;
        if STAGES == 1 {
            // The next tile, requested once this one is consumed (one tile of registers;
            // programs of a single tile, as at short contexts, are faster this way).
            next_kt = load(k_cache + next_offs, next_ok, 0.0);
            next_vt = load(v_cache + next_offs, next_ok, 0.0);
        }
        kt = next_kt;
        vt = next_vt;
    }

    // The new position, last in the online softmax (its score is ready: see above).
    if owner {
        let m_new = maximum(m, score_new);
        let p = exp(score_new - m_new);
        let alpha = exp(m - m_new);
        let pv = (v_new as f32).expand_dims(0) * p.expand_dims(1).expand_dims(2);
        acc = pv + acc * alpha.expand_dims(1).expand_dims(2);
        l = l * alpha + p;
        m = m_new;
    }

    if CLUSTER == 1 {
        let slot = heads * splits + split;
        store(part_m + slot, m, g_ok);
        store(part_l + slot, l, g_ok);
        let slot_at = (slot * D).expand_dims(1).expand_dims(2);
        store(part_acc + slot_at + dims.expand_dims(0), acc, q_ok);
    } else {
        // The cluster is every split of this KV head (`splits == CLUSTER`): merge the
        // partials through distributed shared memory, as `attention_combine` would.
        // Empty splits hold m = -inf and weigh exp(-inf) = 0; the last split, holding `pos`,
        // is never empty.
        let all_m = cluster_gather(m);
        let all_l = cluster_gather(l);
        let all_acc = cluster_gather(acc);
        let weight = exp(all_m - all_m.max(0).expand_dims(0));
        let denom = (weight * all_l).sum(0);
        let weighted = all_acc * weight.expand_dims(2).expand_dims(3);
        let o = weighted.sum(0) / denom.expand_dims(1).expand_dims(2);
        if split == 0 {
            store(out + head_at + dims.expand_dims(0), o as bf16, q_ok);
        }
    }
    store_stamps(stamps, stamp_at, t_entry, t_wait);
}

/// Columns `d` of query head `head`'s attention output merged from its `splits`
/// partials (`S` a power of two at least `splits`), rounded to bf16:
/// [`attention_combine`]'s body, shared with the combine of quantized O projections
/// ([`crate::kernels_quant::attention_combine_quant`]).
#[tile_fn(crate = tilefuse_dsl)]
pub fn merge_splits<const D: usize, const S: usize>(
    part_m: Ptr<f32>,
    part_l: Ptr<f32>,
    part_acc: Ptr<f32>,
    splits: i32,
    head: i32,
    d: Tile<i32>,
) -> Tile<bf16> {
    let s = arange(0, S);
    let ok = s < splits;
    let slot = head * splits + s;
    // All three loads first: one round trip, not one after each reduction.
    let m = load(part_m + slot, ok, f32::NEG_INFINITY);
    let l = load(part_l + slot, ok, 0.0);
    let acc = load(
        part_acc + slot.expand_dims(1) * D + d.expand_dims(0),
        ok.expand_dims(1),
        0.0,
    );
    // Empty splits hold m = -inf and weigh exp(-inf) = 0; split 0 is never empty.
    let weight = exp(m - m.max(0));
    let denom = (weight * l).sum(0);
    ((acc * weight.expand_dims(1)).sum(0) / denom) as bf16
}

/// Decode attention, second pass: program `(head, chunk)` merges the `splits` partials
/// (`S` is a power of two at least `splits`) of columns `chunk * DC .. (chunk + 1) * DC`
/// of a query head into the bf16 head output (grid `[num_heads, D / DC]`: more, shorter
/// programs than one per head).
#[kernel(crate = tilefuse_dsl, D = [32, 64, 128], S = [8, 16, 32, 64], DC = [32, 64, 128], num_warps = [4])]
pub fn attention_combine<const D: usize, const S: usize, const DC: usize>(
    part_m: Ptr<f32>,
    part_l: Ptr<f32>,
    part_acc: Ptr<f32>,
    out: Ptr<bf16>,
    splits: i32,
    stamps: Ptr<i64>,
    stamp_at: i32,
) {
    // Timeline stamps (see the module docs): the clock is read only when asked for,
    // and stored at the end.
    let t_entry = stamp_clock(stamp_at);
    wait_for_prior_kernels();
    let t_wait = stamp_clock(stamp_at);
    let head = program_id(0);
    let d = program_id(1) * DC + arange(0, DC);
    let o = merge_splits::<D, S>(part_m, part_l, part_acc, splits, head, d);
    store(out + head * D + d, o);
    store_stamps(stamps, stamp_at, t_entry, t_wait);
}

/// Final norm and LM head: `logits = bf16(W · rmsnorm(x))` (stored as f32), plus each
/// program's greedy candidate (largest logit, first index on ties) in `part_val` /
/// `part_idx`, indexed by program.
///
/// Each program takes `ceil(row blocks / programs)` consecutive blocks of `BLOCK_N`
/// rows: with one program per block (the grid `ceil(n / BLOCK_N)`) every program is
/// independent; with a smaller grid each program streams its blocks, computing the
/// norm once. Candidates stay in row order either way, so `argmax_finish`'s first-on-
/// ties gives the first index. `STREAM = 1` requests the next block's first tile
/// before this block is reduced (for small grids; one more tile of registers).
///
/// `STAGES` picks how the weights of a block are streamed: 1 requests each tile when
/// its iteration starts (the first before the wait), 2 one iteration ahead (the first
/// two before the wait; one more tile of registers, twice the bytes in flight).
#[kernel(
    crate = tilefuse_dsl,
    BLOCK_N = [4, 8, 16],
    BLOCK_K = [256, 1024],
    num_warps = [4, 8],
    // 2 was slower on an H100 and an H200 (more registers, fewer programs a SM), so
    // it is compiled for the default tile only, for comparisons.
    STAGES = [1, 2],
    STREAM = [0, 1],
    // 1: each tile is reduced as it arrives (see `gemv_residual`); compiled for blocks
    // of 16 whole 1024-column rows (the default for large vocabularies).
    REDUCE_EACH = [0, 1],
    skip(REDUCE_EACH = 1, BLOCK_K = 256),
    skip(REDUCE_EACH = 1, BLOCK_N = [4, 8]),
    skip(REDUCE_EACH = 1, STAGES = 2),
    skip(STAGES = 2, BLOCK_N = [4, 8]),
    skip(STAGES = 2, BLOCK_K = 1024),
    skip(STAGES = 2, num_warps = 8),
    skip(STREAM = 1, STAGES = 2),
    skip(STREAM = 1, num_warps = 8),
    // 16 x 1024 weights and the next block's for 128 threads spill.
    skip(BLOCK_N = 16, BLOCK_K = 1024, num_warps = 4, REDUCE_EACH = 0)
)]
pub fn lm_head_argmax<
    const BLOCK_N: usize,
    const BLOCK_K: usize,
    const STAGES: usize,
    const STREAM: usize,
    const REDUCE_EACH: usize,
>(
    x: Ptr<bf16>,
    norm_w: Ptr<bf16>,
    w: Ptr<bf16>,
    logits: Ptr<f32>,
    part_val: Ptr<f32>,
    part_idx: Ptr<i32>,
    n: i32,
    #[multiple_of(8)] k: i32,
    eps: f32,
) {
    let blocks = cdiv(n, BLOCK_N);
    let per = cdiv(blocks, num_programs(0));
    let first = program_id(0) * per;
    let last = minimum(first + per, blocks);
    let r = arange(0, BLOCK_N);
    // The first weight tile is requested before the norm's reduction, so its DRAM
    // latency overlaps the reduction (and with k <= BLOCK_K it is the only tile).
    let rows = first * BLOCK_N + r;
    let cols = arange(0, BLOCK_K);
    let col_ok = cols < k;
    let mut w_first = load(
        w + rows.expand_dims(1) * k + cols.expand_dims(0),
        (rows < n).expand_dims(1) & col_ok.expand_dims(0),
        0.0,
    );
    let mut w_ahead = w_first;
    if STAGES == 2 {
        w_ahead = load(
            w + rows.expand_dims(1) * k + (cols + BLOCK_K).expand_dims(0),
            (rows < n).expand_dims(1) & (cols + BLOCK_K < k).expand_dims(0),
            0.0,
        );
    }
    let g_first = load(norm_w + cols, col_ok, 0.0);
    // Weights are never written during decode: only now wait for the kernels before
    // this one (with programmatic launch on Hopper, the loads above overlap their tail).
    wait_for_prior_kernels();

    let mut sq = zeros::<f32>([BLOCK_K]);
    for k0 in (0..k).step_by(BLOCK_K) {
        let c = k0 + arange(0, BLOCK_K);
        let v = load(x + c, c < k, 0.0) as f32;
        sq += v * v;
    }
    let inv_rms = 1.0 / sqrt(sq.sum(0) / (k as f32) + eps);
    let xv = load(x + cols, col_ok, 0.0) as f32;
    let xn = ((g_first as f32) * ((xv * inv_rms) as bf16 as f32)) as bf16 as f32;

    let mut best = f32::NEG_INFINITY;
    let mut best_idx = first * BLOCK_N;
    for blk in (first..last).step_by(1) {
        let rows = blk * BLOCK_N + r;
        let row_ok = rows < n;
        let row_offs = rows.expand_dims(1) * k;
        let mut w_next = w_first;
        if STREAM == 1 {
            // The next block's first tile, requested before this block is reduced.
            let next_rows = rows + BLOCK_N;
            w_next = load(
                w + next_rows.expand_dims(1) * k + cols.expand_dims(0),
                ((next_rows < n) & (blk + 1 < last)).expand_dims(1) & col_ok.expand_dims(0),
                0.0,
            );
        }
        let mut acc = zeros::<f32>([BLOCK_N, BLOCK_K]);
        let mut sums = zeros::<f32>([BLOCK_N]);
        if REDUCE_EACH == 1 {
            sums = ((w_first as f32) * xn.expand_dims(0)).sum(1);
        } else {
            acc = (w_first as f32) * xn.expand_dims(0);
        }
        for k0 in (BLOCK_K..k).step_by(BLOCK_K) {
            let cols = k0 + arange(0, BLOCK_K);
            let col_ok = cols < k;
            let xv = load(x + cols, col_ok, 0.0) as f32;
            let g = load(norm_w + cols, col_ok, 0.0) as f32;
            let xn = (g * ((xv * inv_rms) as bf16 as f32)) as bf16 as f32;
            let mut wt = w_ahead;
            if STAGES == 2 {
                let next = cols + BLOCK_K;
                w_ahead = load(
                    w + row_offs + next.expand_dims(0),
                    row_ok.expand_dims(1) & (next < k).expand_dims(0),
                    0.0,
                );
            } else {
                let mask = row_ok.expand_dims(1) & col_ok.expand_dims(0);
                wt = load(w + row_offs + cols.expand_dims(0), mask, 0.0);
            }
            if REDUCE_EACH == 1 {
                sums += ((wt as f32) * xn.expand_dims(0)).sum(1);
            } else {
                acc += (wt as f32) * xn.expand_dims(0);
            }
        }
        if REDUCE_EACH == 0 {
            sums = acc.sum(1);
        }
        let out = sums as bf16 as f32;
        store(logits + rows, out, row_ok);
        let cand = select(row_ok, out, f32::NEG_INFINITY);
        let top = cand.max(0);
        // Blocks come in row order: a later one wins only when strictly larger.
        if top > best {
            best = top;
            best_idx = blk * BLOCK_N + cand.argmax(0);
        }
        if STREAM == 1 {
            w_first = w_next;
        } else {
            // Without streaming the next block's first tile is requested now.
            let next_rows = rows + BLOCK_N;
            w_first = load(
                w + next_rows.expand_dims(1) * k + cols.expand_dims(0),
                ((next_rows < n) & (blk + 1 < last)).expand_dims(1) & col_ok.expand_dims(0),
                0.0,
            );
        }
        if STAGES == 2 {
            let next_rows = rows + BLOCK_N;
            w_ahead = load(
                w + next_rows.expand_dims(1) * k + (cols + BLOCK_K).expand_dims(0),
                ((next_rows < n) & (blk + 1 < last)).expand_dims(1)
                    & (cols + BLOCK_K < k).expand_dims(0),
                0.0,
            );
        }
    }
    store(part_val + program_id(0), best);
    store(part_idx + program_id(0), best_idx);
}

/// Greedy sampling, last step: the best of the `parts` candidates (first on ties)
/// becomes `state[0]`, and `state[1]` (the position) advances by one.
#[kernel(crate = tilefuse_dsl, B = [256, 1024, 4096, 16384], num_warps = [4, 8, 16])]
pub fn argmax_finish<const B: usize>(
    part_val: Ptr<f32>,
    part_idx: Ptr<i32>,
    state: Ptr<i32>,
    parts: i32,
) {
    let mut best = f32::NEG_INFINITY;
    let mut token = 0;
    for s0 in (0..parts).step_by(B) {
        let offs = s0 + arange(0, B);
        let v = load(part_val + offs, offs < parts, f32::NEG_INFINITY);
        let m = v.max(0);
        if m > best {
            best = m;
            token = load(part_idx + s0 + v.argmax(0));
        }
    }
    store(state, token);
    store(state + 1, load(state + 1) + 1);
}
