//! The batched-prefill kernels: a chunk of `T` prompt tokens at positions
//! `start .. start + T` through one layer at a time, written around `dot` (tensor cores
//! for bf16 tiles) as Triton's tutorial GEMM and FlashAttention-2 are.
//!
//! Per chunk ([`crate::prefill`] drives them):
//!
//! 1. [`prefill_embed`]: the embedding rows of the chunk's token ids, `x[T, hidden]`;
//!
//! and per layer:
//!
//! 2. [`prefill_rmsnorm`]: the input RMSNorm of `x` into a bf16 buffer `xn`;
//! 3. [`prefill_gemm`]: the fused `[q; k; v]` projection of `xn`, plus bias;
//! 4. [`prefill_qk_rope`]: QK-norm (Qwen3), RoPE at every position of the chunk, the
//!    queries to a `[T, num_heads, head_dim]` buffer and the keys and values appended to
//!    the KV cache;
//! 5. [`prefill_attention`]: causal attention of the chunk's queries over the cache
//!    (earlier chunks and this one), FlashAttention-2 style;
//! 6. [`prefill_gemm`]: the O projection (+ bias) added into `x`;
//! 7. [`prefill_rmsnorm`]: the post-attention RMSNorm of `x` into `xn`;
//! 8. [`prefill_gate_up`]: the `[gate; up]` projection of `xn`, with `silu(gate) * up`
//!    in the epilogue;
//! 9. [`prefill_gemm`]: the down projection added into `x`;
//!
//! ([`prefill_gemm_split`] does what [`prefill_gemm`] does with K cut into slices, for
//! chunks whose output has fewer tiles than the GPU has SMs, when the plan asks for it.)
//!
//! and after the last chunk [`prefill_last_row`], which hands the last position's
//! hidden state and token to the decode step's LM head and argmax (so the device state
//! ends as after a decode step at that position).
//!
//! Rounding mirrors the host reference ([`crate::reference`]) wherever a tile kernel
//! can: norm outputs, projections, RoPE terms, scores and the residual stream are
//! rounded to bf16 where transformers rounds them, arithmetic is f32. The one
//! departure is attention's probabilities: the reference rounds the *normalized*
//! probabilities to bf16; an online softmax rounds the unnormalized ones (the `dot`
//! operand with the values) and divides at the end, as the decode kernels' split pass
//! keeps them in f32.
//!
//! GEMMs are "NT": `Y[T, N] = A[T, K] · W[N, K]^T` over row-major bf16 weights `[N, K]`
//! (the layout checkpoints and the decode kernels use); the `B` tile `[BLOCK_K,
//! BLOCK_N]` is read from `W` by pointer arithmetic. Program `(m, n)` of the grid
//! `[cdiv(T, BLOCK_M), cdiv(N, BLOCK_N)]` computes one output tile; programs along `m`
//! are consecutive, so the few programs sharing a weight tile run together and read it
//! from DRAM once.
//!
//! Tile variants: a 16-row tile for the interpreter (little masked work), and on the
//! GPU 64- and 128-row GEMM tiles with 64 or 128 columns and 32- or 64-wide `k` steps
//! (operands through a three-stage `cp.async` ring), 64- and 128-query attention tiles
//! over 32 or 64 keys (dynamic shared memory above 48 KiB). Those that spill registers
//! are skipped (each `skip` says so; `tests/ptxas_all.rs` checks the rest);
//! [`crate::prefill::PrefillPlan`] picks one per launch.

use tilefuse_macros::kernel;

/// Every kernel description in this module, for tooling (offline assembly, inspection).
pub fn all() -> [&'static tilefuse_dsl::runtime::KernelDef; 8] {
    [
        &PREFILL_EMBED,
        &PREFILL_RMSNORM,
        &PREFILL_GEMM,
        &PREFILL_GEMM_SPLIT,
        &PREFILL_QK_ROPE,
        &PREFILL_ATTENTION,
        &PREFILL_GATE_UP,
        &PREFILL_LAST_ROW,
    ]
}

/// `x[r] = table[ids[first + r]]` for the rows `r < t` (grid `[t, cdiv(h, B)]`).
#[kernel(crate = tilefuse_dsl, B = [1024], num_warps = [4])]
pub fn prefill_embed<const B: usize>(
    table: Ptr<bf16>,
    ids: Ptr<i32>,
    x: Ptr<bf16>,
    first: i32,
    #[multiple_of(8)] h: i32,
) {
    let row = program_id(0);
    let token = load(ids + first + row);
    let offs = program_id(1) * B + arange(0, B);
    let ok = offs < h;
    store(
        x + row * h + offs,
        load(table + token * h + offs, ok, 0.0),
        ok,
    );
}

/// `y[r] = bf16(norm_w * bf16(x[r] * inv_rms(x[r])))` for the rows `r < t` (grid
/// `[t]`): RMSNorm of the chunk's residual stream into a bf16 buffer, rounded as the
/// reference rounds it, so the GEMMs after it read plain bf16 tiles (which stream
/// through the `cp.async` ring; a norm in the GEMM's prologue cannot).
#[kernel(crate = tilefuse_dsl, B = [1024], num_warps = [4])]
pub fn prefill_rmsnorm<const B: usize>(
    x: Ptr<bf16>,
    norm_w: Ptr<bf16>,
    y: Ptr<bf16>,
    #[multiple_of(8)] h: i32,
    eps: f32,
) {
    let row = program_id(0) * h;
    let mut sq = zeros::<f32>([B]);
    for c0 in (0..h).step_by(B) {
        let offs = c0 + arange(0, B);
        let xv = load(x + row + offs, offs < h, 0.0) as f32;
        sq += xv * xv;
    }
    let inv_rms = 1.0 / sqrt(sq.sum(0) / (h as f32) + eps);
    for c0 in (0..h).step_by(B) {
        let offs = c0 + arange(0, B);
        let ok = offs < h;
        let xv = load(x + row + offs, ok, 0.0) as f32;
        let g = load(norm_w + offs, ok, 0.0) as f32;
        store(
            y + row + offs,
            (g * ((xv * inv_rms) as bf16 as f32)) as bf16,
            ok,
        );
    }
}

/// `x = bf16(x + bf16(a · W^T + bias))` when `accumulate != 0`, else
/// `x = bf16(a · W^T + bias)`: `a[t, k]`, `W[n, k]`, `x[t, n]`. The QKV projection
/// (of the normalized rows, with its bias, into the `qkv` buffer), the O projection
/// (+ bias) added into the residual stream, and the down projection (zero bias) added
/// into it.
///
/// Both operand tiles are plain loads in the `k` loop, so they stream through a
/// three-stage `cp.async` ring; the GPU plan's tiles are compiled 4 stages deep too
/// (`TileChoice::stages`; docs/perf.md, "Deeper rings for the unsplit GEMM": 5 stages
/// were no faster).
#[kernel(
    crate = tilefuse_dsl,
    BLOCK_M = [16, 64, 128],
    BLOCK_N = [32, 64, 128],
    BLOCK_K = [32, 64],
    num_warps = [4, 8],
    num_stages = [3, 4],
    // 16 x 32 x 32 over 4 warps: the interpreter's tile (little masked work).
    skip(BLOCK_M = 16, BLOCK_N = [64, 128]),
    skip(BLOCK_M = 16, BLOCK_K = 64),
    skip(BLOCK_M = 16, num_warps = 8),
    skip(BLOCK_N = 32, BLOCK_M = [64, 128]),
    // These spill registers (`tests/ptxas_all.rs`; `tilefuse inspect --ptxas`).
    skip(BLOCK_M = 128, BLOCK_N = 128),
    skip(num_warps = 4, BLOCK_M = 128),
    skip(num_warps = 4, BLOCK_N = 128),
    // Deeper rings only for the GPU plan's tiles (64x64x64 / 4, 128x64x64 / 8).
    skip(BLOCK_M = 16, num_stages = 4),
    skip(BLOCK_K = 32, num_stages = 4),
    skip(BLOCK_N = [32, 128], num_stages = 4),
    skip(BLOCK_M = 64, num_warps = 8, num_stages = 4)
)]
pub fn prefill_gemm<const BLOCK_M: usize, const BLOCK_N: usize, const BLOCK_K: usize>(
    a: Ptr<bf16>,
    w: Ptr<bf16>,
    bias: Ptr<bf16>,
    x: Ptr<bf16>,
    t: i32,
    n: i32,
    #[multiple_of(8)] k: i32,
    accumulate: i32,
) {
    let rows = program_id(0) * BLOCK_M + arange(0, BLOCK_M);
    let cols = program_id(1) * BLOCK_N + arange(0, BLOCK_N);
    let row_ok = rows < t;
    let col_ok = cols < n;
    let kk = arange(0, BLOCK_K);
    let mut acc = zeros::<f32>([BLOCK_M, BLOCK_N]);
    let mut a_ptrs = a + rows.expand_dims(1) * k + kk.expand_dims(0);
    for k0 in (0..k).step_by(BLOCK_K) {
        let k_ok = k0 + kk < k;
        let at = load(a_ptrs, row_ok.expand_dims(1) & k_ok.expand_dims(0), 0.0);
        // The weight tile's pointers are made in the loop, not carried, so its load is
        // laid out along `k`, where `w` is contiguous (16-byte copies).
        let b_ptrs = w + cols.expand_dims(0) * k + (k0 + kk).expand_dims(1);
        let bt = load(b_ptrs, k_ok.expand_dims(1) & col_ok.expand_dims(0), 0.0);
        acc = dot(at, bt, acc);
        a_ptrs = a_ptrs + BLOCK_K;
    }
    let b = (load(bias + cols, col_ok, 0.0) as f32).expand_dims(0);
    let mask = row_ok.expand_dims(1) & col_ok.expand_dims(0);
    let at = x + rows.expand_dims(1) * n + cols.expand_dims(0);
    let old = load(at, mask & (accumulate != 0), 0.0) as f32;
    let proj = (acc + b) as bf16 as f32;
    store(at, (old + proj) as bf16, mask);
}

/// [`prefill_gemm`] with K split: program `(m, n, s)` accumulates `a · W^T` over
/// `k_slice` columns of `k` from `s * k_slice` and stores the f32 partial to
/// `partials[s, t, n]`; the last program of a tile to bump its counter sums the
/// partials in slice order (the same bits whichever arrives last), applies the same
/// epilogue (`x = bf16(x + bf16(sum + bias))` when `accumulate != 0`, else
/// `bf16(sum + bias)`) and resets the counter to zero for the next launch. For outputs
/// with fewer tiles than SMs (the O and down projections of short chunks);
/// `tilefuse::kernels::matmul::matmul_split` is the same scheme, measured in
/// docs/perf.md ("Split-K for small outputs"). Slices pipeline five stages deep.
#[kernel(
    crate = tilefuse_dsl,
    BLOCK_M = [16, 128],
    BLOCK_N = [32, 64],
    BLOCK_K = [32, 64],
    num_warps = [4, 8],
    num_stages = [5],
    // 16 x 32 x 32 on 4 warps: the interpreter's tile; 128 x 64 x 64 on 8: the GPU's
    // (64 x 128 on 4 warps spills here, with the epilogue's bias and residual).
    skip(BLOCK_M = 16, BLOCK_N = 64),
    skip(BLOCK_M = 16, BLOCK_K = 64),
    skip(BLOCK_M = 16, num_warps = 8),
    skip(BLOCK_M = 128, BLOCK_N = 32),
    skip(BLOCK_M = 128, BLOCK_K = 32),
    skip(BLOCK_M = 128, num_warps = 4)
)]
#[allow(clippy::too_many_arguments)]
pub fn prefill_gemm_split<const BLOCK_M: usize, const BLOCK_N: usize, const BLOCK_K: usize>(
    a: Ptr<bf16>,
    w: Ptr<bf16>,
    bias: Ptr<bf16>,
    x: Ptr<bf16>,
    partials: Ptr<f32>,
    counters: Ptr<i32>,
    t: i32,
    #[multiple_of(8)] n: i32,
    #[multiple_of(8)] k: i32,
    #[multiple_of(8)] k_slice: i32,
    accumulate: i32,
) {
    let slice = program_id(2);
    let splits = num_programs(2);
    let tile = program_id(0) * num_programs(1) + program_id(1);
    let rows = program_id(0) * BLOCK_M + arange(0, BLOCK_M);
    let cols = program_id(1) * BLOCK_N + arange(0, BLOCK_N);
    let row_ok = rows < t;
    let col_ok = cols < n;
    let kk = arange(0, BLOCK_K);
    let k_lo = slice * k_slice;
    let mut acc = zeros::<f32>([BLOCK_M, BLOCK_N]);
    let mut a_ptrs = a + rows.expand_dims(1) * k + (k_lo + kk).expand_dims(0);
    // Every slice but the last spans whole BLOCK_K steps, so `k` is the only bound a
    // step can cross (and `k - k0` keeps its divisibility: 16-byte copies).
    for k0 in (k_lo..minimum(k, k_lo + k_slice)).step_by(BLOCK_K) {
        let k_ok = kk < k - k0;
        let at = load(a_ptrs, row_ok.expand_dims(1) & k_ok.expand_dims(0), 0.0);
        let b_ptrs = w + cols.expand_dims(0) * k + (k0 + kk).expand_dims(1);
        let bt = load(b_ptrs, k_ok.expand_dims(1) & col_ok.expand_dims(0), 0.0);
        acc = dot(at, bt, acc);
        a_ptrs = a_ptrs + BLOCK_K;
    }
    let mask = row_ok.expand_dims(1) & col_ok.expand_dims(0);
    let offs = rows.expand_dims(1) * n + cols.expand_dims(0);
    store(partials + slice * t * n + offs, acc, mask);
    let arrived = atomic_add(counters + tile, 1);
    if arrived == splits - 1 {
        let mut sum = zeros::<f32>([BLOCK_M, BLOCK_N]);
        for s in (0..splits).step_by(2) {
            let p0 = load(partials + s * t * n + offs, mask, 0.0);
            let p1 = load(
                partials + (s + 1) * t * n + offs,
                mask & (s + 1 < splits),
                0.0,
            );
            sum = sum + p0 + p1;
        }
        let b = (load(bias + cols, col_ok, 0.0) as f32).expand_dims(0);
        let old = load(x + offs, mask & (accumulate != 0), 0.0) as f32;
        let proj = (sum + b) as bf16 as f32;
        store(x + offs, (old + proj) as bf16, mask);
        store(counters + tile, 0);
    }
}

/// `act = bf16(bf16(silu(g)) * u)` with `g = bf16(a · W[j]^T)` and
/// `u = bf16(a · W[inter + j]^T)`: the MLP's first half over the normalized rows
/// `a[t, k]` and the fused `[gate; up]` weight `[2 * inter, k]`, `act[t, inter]`.
///
/// Each program holds two accumulators, for columns `j` of the gate rows and of the up
/// rows. The `A` tile is loaded twice, once for each product: each `dot` then has two
/// plain loads as operands and both stream through the `cp.async` ring (a tile shared
/// by two products would go through registers); the second copy comes from L1/L2.
/// The GPU plan's 64x64x64 / 4 tile is compiled 3 and 4 stages deep.
#[kernel(
    crate = tilefuse_dsl,
    BLOCK_M = [16, 64, 128],
    BLOCK_N = [32, 64, 128],
    BLOCK_K = [32, 64],
    num_warps = [4, 8],
    num_stages = [3, 4],
    // The interpreter's tile as in `prefill_gemm`; the rest spill registers or sit at
    // the register limit (`tests/ptxas_all.rs`; `tilefuse inspect --ptxas`).
    skip(BLOCK_M = 16, BLOCK_N = [64, 128]),
    skip(BLOCK_M = 16, BLOCK_K = 64),
    skip(BLOCK_M = 16, num_warps = 8),
    skip(BLOCK_N = 32, BLOCK_M = [64, 128]),
    skip(BLOCK_M = 128, num_warps = 4),
    skip(BLOCK_M = 64, BLOCK_N = 128, BLOCK_K = 64, num_warps = 4),
    skip(BLOCK_M = 128, BLOCK_N = 128, BLOCK_K = 64),
    // Deeper rings only for the GPU plan's tile (64x64x64 / 4).
    skip(BLOCK_M = [16, 128], num_stages = 4),
    skip(BLOCK_K = 32, num_stages = 4),
    skip(BLOCK_N = [32, 128], num_stages = 4),
    skip(num_warps = 8, num_stages = 4)
)]
pub fn prefill_gate_up<const BLOCK_M: usize, const BLOCK_N: usize, const BLOCK_K: usize>(
    a: Ptr<bf16>,
    w: Ptr<bf16>,
    act: Ptr<bf16>,
    t: i32,
    inter: i32,
    #[multiple_of(8)] k: i32,
) {
    let rows = program_id(0) * BLOCK_M + arange(0, BLOCK_M);
    let cols = program_id(1) * BLOCK_N + arange(0, BLOCK_N);
    let row_ok = rows < t;
    let col_ok = cols < inter;
    let kk = arange(0, BLOCK_K);
    let mut acc_g = zeros::<f32>([BLOCK_M, BLOCK_N]);
    let mut acc_u = zeros::<f32>([BLOCK_M, BLOCK_N]);
    for k0 in (0..k).step_by(BLOCK_K) {
        let k_ok = k0 + kk < k;
        let a_ptrs = a + rows.expand_dims(1) * k + (k0 + kk).expand_dims(0);
        let a_mask = row_ok.expand_dims(1) & k_ok.expand_dims(0);
        let b_mask = k_ok.expand_dims(1) & col_ok.expand_dims(0);
        // Made in the loop, so the loads are laid out along `k` (see `prefill_gemm`).
        let g_ptrs = w + cols.expand_dims(0) * k + (k0 + kk).expand_dims(1);
        let u_ptrs = w + (inter + cols).expand_dims(0) * k + (k0 + kk).expand_dims(1);
        acc_g = dot(load(a_ptrs, a_mask, 0.0), load(g_ptrs, b_mask, 0.0), acc_g);
        acc_u = dot(load(a_ptrs, a_mask, 0.0), load(u_ptrs, b_mask, 0.0), acc_u);
    }
    let gate = acc_g as bf16 as f32;
    let up = acc_u as bf16 as f32;
    let silu = (gate / (1.0 + exp(-gate))) as bf16 as f32;
    let mask = row_ok.expand_dims(1) & col_ok.expand_dims(0);
    store(
        act + rows.expand_dims(1) * inter + cols.expand_dims(0),
        (silu * up) as bf16,
        mask,
    );
}

/// QK-norm (when `use_norm != 0`), RoPE and the KV-cache append for a chunk: program
/// `(b, h)` takes rows `b * BT ..` of the fused projection `qkv[t, (nh + 2 nkv) * D]`
/// (the row's position is `start + row`) and head slot `h`: a query head for
/// `h < num_heads` (normalized, rotated, stored to `q_out[t, num_heads, D]`), else KV
/// head `h - num_heads` (its key normalized, rotated and stored, and its value copied,
/// to row `start + row` of the caches `[num_kv_heads, max_seq, D]`).
///
/// Rounds as [`crate::kernels::attention_split`] and the reference do:
/// `bf16(norm_w * bf16(x * inv_rms))`, then `bf16(bf16(a * cos) + bf16(±b * sin))`
/// with `b` the rotate-half partner and the bf16-rounded tables `rope_cos` /
/// `rope_sin` (`[max_seq, D / 2]`).
#[kernel(crate = tilefuse_dsl, D = [32, 64, 128], BT = [16], num_warps = [4])]
pub fn prefill_qk_rope<const D: usize, const BT: usize>(
    qkv: Ptr<bf16>,
    q_norm_w: Ptr<bf16>,
    k_norm_w: Ptr<bf16>,
    rope_cos: Ptr<f32>,
    rope_sin: Ptr<f32>,
    q_out: Ptr<bf16>,
    k_cache: Ptr<bf16>,
    v_cache: Ptr<bf16>,
    t: i32,
    start: i32,
    num_heads: i32,
    num_kv_heads: i32,
    max_seq: i32,
    use_norm: i32,
    eps: f32,
) {
    let rows = program_id(0) * BT + arange(0, BT);
    let ok = (rows < t).expand_dims(1);
    let head = program_id(1);
    let row_len = (num_heads + 2 * num_kv_heads) * D;
    let d = arange(0, D);
    let partner = (d + D / 2) % D;
    let sign = select(d < D / 2, -1.0, 1.0).expand_dims(0);
    let freq = (d % (D / 2)).expand_dims(0);
    let pos = (start + rows).expand_dims(1);
    let at = rows.expand_dims(1) * row_len + head * D;
    let mut a = load(qkv + at + d.expand_dims(0), ok, 0.0) as f32;
    let mut b = load(qkv + at + partner.expand_dims(0), ok, 0.0) as f32;
    let cs = load(rope_cos + pos * (D / 2) + freq, ok, 0.0);
    let sn = load(rope_sin + pos * (D / 2) + freq, ok, 0.0);
    let is_q = head < num_heads;
    if use_norm != 0 {
        let w = select(is_q, load(q_norm_w + d), load(k_norm_w + d)) as f32;
        let w_partner = select(is_q, load(q_norm_w + partner), load(k_norm_w + partner)) as f32;
        let inv_rms = (1.0 / sqrt((a * a).sum(1) / (D as f32) + eps)).expand_dims(1);
        a = (w.expand_dims(0) * ((a * inv_rms) as bf16 as f32)) as bf16 as f32;
        b = (w_partner.expand_dims(0) * ((b * inv_rms) as bf16 as f32)) as bf16 as f32;
    }
    let turn = (sign * b * sn) as bf16 as f32;
    let rotated = (((a * cs) as bf16 as f32) + turn) as bf16;
    if is_q {
        store(
            q_out + (rows.expand_dims(1) * num_heads + head) * D + d.expand_dims(0),
            rotated,
            ok,
        );
    } else {
        let kv_head = head - num_heads;
        let cache_at = kv_head * max_seq * D + pos * D + d.expand_dims(0);
        store(k_cache + cache_at, rotated, ok);
        let v_at = rows.expand_dims(1) * row_len + (num_heads + num_kv_heads + kv_head) * D;
        store(
            v_cache + cache_at,
            load(qkv + v_at + d.expand_dims(0), ok, 0.0),
            ok,
        );
    }
}

/// Causal attention of a chunk, FlashAttention-2 style: program `(h, m)` keeps the
/// queries of rows `m' * BLOCK_M ..` of head `h` (`q[t, num_heads, D]`, positions
/// `start + row`; `m'` counts the query tiles from the last, so the tiles with the most
/// keys start first and the short ones fill the tail of the grid) and streams keys and
/// values of KV head `h / group` from the cache (`[num_kv_heads, max_seq, D]`,
/// positions `0 ..= start + row`: earlier chunks and this one, already appended) in
/// `BLOCK_N`-position tiles with an online softmax. Output `out[t, num_heads * D]` bf16.
///
/// The query tile is loaded inside the key loops, next to the key tile: both operands
/// of `q · k^T` are then plain loads, so they stream through the `cp.async` ring
/// (`num_stages`) straight into shared memory (from L2 after the first iteration)
/// instead of being held in registers and stored to shared memory before every
/// product; key tiles past the tile's last query position are never visited.
///
/// Scores round as the reference's (`bf16(bf16(q·k) * scale)`); the unnormalized
/// probabilities enter the value product as bf16 (see the module docs).
#[kernel(
    crate = tilefuse_dsl,
    D = [32, 64, 128],
    BLOCK_M = [16, 64, 128],
    BLOCK_N = [32, 64],
    num_warps = [4, 8],
    // 16 x 64 over 4 warps: the interpreter's tile (the GPU's 64-key steps, so its
    // online softmax rounds as the GPU's does); 16 x 32 for tests.
    skip(BLOCK_M = 16, num_warps = 8),
    // These spill registers (`tests/ptxas_all.rs`; `tilefuse inspect --ptxas`).
    skip(num_warps = 4, BLOCK_M = 128),
    skip(num_warps = 4, BLOCK_M = 64, BLOCK_N = 64, D = 128)
)]
pub fn prefill_attention<const D: usize, const BLOCK_M: usize, const BLOCK_N: usize>(
    q: Ptr<bf16>,
    k_cache: Ptr<bf16>,
    v_cache: Ptr<bf16>,
    out: Ptr<bf16>,
    t: i32,
    start: i32,
    group: i32,
    max_seq: i32,
    scale: f32,
) {
    let head = program_id(0);
    let num_heads = num_programs(0);
    let tile = num_programs(1) - 1 - program_id(1);
    let base = (head / group) * max_seq * D;
    let rows = tile * BLOCK_M + arange(0, BLOCK_M);
    let row_ok = rows < t;
    let q_pos = (start + rows).expand_dims(1);
    let d = arange(0, D);
    let q_ptrs = q + (rows * num_heads + head).expand_dims(1) * D + d.expand_dims(0);
    // Keys up to this tile's last query position (padding rows past `t` see the same
    // keys as the last real one; position 0 keeps every row's softmax non-empty, and
    // the first tile processed always holds it).
    let end = start + minimum((tile + 1) * BLOCK_M, t);
    let s = arange(0, BLOCK_N);
    let mut m = full([BLOCK_M], f32::NEG_INFINITY);
    let mut l = zeros::<f32>([BLOCK_M]);
    let mut acc = zeros::<f32>([BLOCK_M, D]);
    let mut v_ptrs = v_cache + base + s.expand_dims(1) * D + d.expand_dims(0);
    // Whole key tiles before the tile's first query position are visible to every row
    // and inside the cache: no causal or bounds masks.
    let unmasked = (start + tile * BLOCK_M) / BLOCK_N * BLOCK_N;
    for s0 in (0..unmasked).step_by(BLOCK_N) {
        let qt = load(q_ptrs, row_ok.expand_dims(1), 0.0);
        // K^T's pointers are made in the loop, not carried, so the load is laid out
        // along `d`, where the cache is contiguous (16-byte copies).
        let kt = load(k_cache + base + (s0 + s).expand_dims(0) * D + d.expand_dims(1));
        let dots = dot(qt, kt);
        let scores = ((dots as bf16 as f32) * scale) as bf16 as f32;
        let m_new = maximum(m, scores.max(1));
        let p = exp(scores - m_new.expand_dims(1));
        let alpha = exp(m - m_new);
        l = l * alpha + p.sum(1);
        let vt = load(v_ptrs);
        acc = dot(p as bf16, vt, acc * alpha.expand_dims(1));
        m = m_new;
        v_ptrs = v_ptrs + BLOCK_N * D;
    }
    // The rest, up to the tile's last query position: masked.
    for s0 in (unmasked..end).step_by(BLOCK_N) {
        let s_ok = s0 + s < end;
        let qt = load(q_ptrs, row_ok.expand_dims(1), 0.0);
        let k_ptrs = k_cache + base + (s0 + s).expand_dims(0) * D + d.expand_dims(1);
        let kt = load(k_ptrs, s_ok.expand_dims(0), 0.0);
        let dots = dot(qt, kt);
        let scores = ((dots as bf16 as f32) * scale) as bf16 as f32;
        let visible = (s0 + s).expand_dims(0) <= q_pos;
        let scores = select(visible & s_ok.expand_dims(0), scores, f32::NEG_INFINITY);
        let m_new = maximum(m, scores.max(1));
        let p = exp(scores - m_new.expand_dims(1));
        let alpha = exp(m - m_new);
        l = l * alpha + p.sum(1);
        let vt = load(v_ptrs, s_ok.expand_dims(1), 0.0);
        acc = dot(p as bf16, vt, acc * alpha.expand_dims(1));
        m = m_new;
        v_ptrs = v_ptrs + BLOCK_N * D;
    }
    let o = acc / l.expand_dims(1);
    store(
        out + rows.expand_dims(1) * (num_heads * D) + head * D + d.expand_dims(0),
        o as bf16,
        row_ok.expand_dims(1),
    );
}

/// Hands row `row` of the chunk to the decode step's LM head: `x_out = x[row]`,
/// `state = [ids[first + row], pos]`. The LM head and `argmax_finish` then write the
/// greedy next token and `pos + 1` to `state`, as after a decode step at `pos`.
#[kernel(crate = tilefuse_dsl, B = [1024], num_warps = [4])]
pub fn prefill_last_row<const B: usize>(
    x: Ptr<bf16>,
    ids: Ptr<i32>,
    x_out: Ptr<bf16>,
    state: Ptr<i32>,
    row: i32,
    first: i32,
    pos: i32,
    #[multiple_of(8)] h: i32,
) {
    for c0 in (0..h).step_by(B) {
        let offs = c0 + arange(0, B);
        let ok = offs < h;
        store(x_out + offs, load(x + row * h + offs, ok, 0.0), ok);
    }
    store(state, load(ids + first + row));
    store(state + 1, pos);
}
