//! GEMVs over quantized weights (Q8_0, Q4_K, Q6_K), written in tilefuse's kernel
//! language: the weights stream in the device layout of
//! [`PackedMatrix`](crate::gguf::quant::PackedMatrix) and are dequantized in registers,
//! with f32 accumulation.
//!
//! Each type has one kernel with three variants, the projections of the decode step
//! (see [`crate::kernels`]) apart from the gate/up pair and the LM head:
//!
//! - `RESIDUAL = 0, NORM = 0`: `y = bf16(W · a + bias)`;
//! - `NORM = 1`: `y = bf16(inv_rms * (W · (norm_w * a)) + bias)` with
//!   `inv_rms = 1 / sqrt(mean(a²) + eps)`, the RMSNorm folded in as in
//!   [`rms_norm_gemv`](crate::kernels::rms_norm_gemv) (the squares summed from the
//!   activation tiles the dot products load anyway);
//! - `RESIDUAL = 1`: `y = bf16(y + bf16(W · a + bias))`, as
//!   [`gemv_residual`](crate::kernels::gemv_residual).
//!
//! - `SILU_MUL = 1` (with `RESIDUAL = 1`): the activation is `bf16(bf16(silu(g)) * u)`
//!   of `a = [g; u]` (each `k` long), computed as it loads: the MLP's down projection
//!   reading the output of a `NORM = 1` GEMV over the `[gate; up]` rows, so the gate/up
//!   pair needs no kernel of its own and the step no extra launch. The rounding is the
//!   reference's (`engine/src/reference.rs`): projections, `silu(g)` and the product
//!   each to bf16.
//!
//! - `HEAD = 1` (with `NORM = 1`): the LM head. The final norm is computed first and
//!   rounded as the reference's (`bf16(g * bf16(a * inv_rms))`, as
//!   [`lm_head_argmax`](crate::kernels::lm_head_argmax)); the bf16 logits are stored
//!   as f32 in `logits`, and each program's greedy candidate (its largest logit, the
//!   first on ties) in `part_val`/`part_idx[program_id]`, for
//!   [`argmax_finish`](crate::kernels::argmax_finish). `y` and `bias` are not read.
//!
//! `norm_w` and `eps` are read only with `NORM = 1`; `logits`, `part_val` and
//! `part_idx` are written only with `HEAD = 1`. Rows `0..n` of the weights write rows
//! `row0..row0 + n` of `y` (and read those of `bias`): a fused projection whose parts
//! have different types is launched one run of rows at a time.
//!
//! Tiles are rank 4 so that the block structure is a tile axis and no reshape is
//! needed: `[BLOCK_N, groups, fields, words]`, with the group, field and word of the
//! device layout (see [`crate::gguf::quant`]): a group's words load as `[.., 1, W]`, a
//! shift by `[F, 1]` spreads their fields, and the activations load as `[groups, F, W]`
//! in element order. Q8_0 groups are its 32-element blocks (4 bytes x 8 words), Q4_K's
//! its 32-element sub-blocks (8 nibbles x 4 words), Q6_K's 16 elements, one scale each
//! (8 nibbles x 2 words, and one word of high bits). Each group's dot product is summed
//! first and scaled once: `d * Σ q·a` (Q8_0), `d·sc * Σ q·a − dmin·m * Σ a` (Q4_K),
//! `d·sc * Σ q·a` (Q6_K). The columns `k` must be a multiple of 256 (of 32 for Q8_0),
//! as the formats require; `BLOCK_K` may exceed `k`.
//!
//! Each kernel takes the row length in words of its quant array (`k_words`) rather than
//! in elements: the compiler proves alignment through sums and products, not quotients,
//! so offsets are built from `k_words` and the group index by multiplication alone, and
//! the word loads become 8- and 16-byte vectors.
//!
//! As in the bf16 kernels, the first weight tile is requested before
//! `wait_for_prior_kernels()`, so with programmatic launch it overlaps the previous
//! kernel's tail.

use tilefuse_macros::{kernel, tile_fn};

/// `1 / sqrt(mean(a²) + eps)` over `a[0..k]`, in tiles of `B`.
#[tile_fn]
fn inv_rms_of<const B: usize>(a: Ptr<bf16>, k: i32, eps: f32) -> f32 {
    let mut sq = zeros::<f32>([B]);
    for k0 in (0..k).step_by(B) {
        let c = k0 + arange(0, B);
        let v = load(a + c, c < k, 0.0) as f32;
        sq += v * v;
    }
    1.0 / sqrt(sq.sum(0) / (k as f32) + eps)
}

/// The final norm as the LM head's reference rounds it: `bf16(g * bf16(x * inv_rms))`.
#[tile_fn]
fn head_norm(x: Tile<f32>, g: Tile<f32>, inv_rms: f32) -> Tile<f32> {
    (g * ((x * inv_rms) as bf16 as f32)) as bf16 as f32
}

/// The LM head's outputs: the logits of `rows`, and the program's greedy candidate
/// (its largest logit, the first on ties) for `argmax_finish`.
#[tile_fn]
fn store_head(
    logits: Ptr<f32>,
    part_val: Ptr<f32>,
    part_idx: Ptr<i32>,
    rows: Tile<i32>,
    out: Tile<f32>,
    row_ok: Tile<bool>,
) {
    store(logits + rows, out, row_ok);
    let cand = select(row_ok, out, f32::NEG_INFINITY);
    store(part_val + program_id(0), cand.max(0));
    store(part_idx + program_id(0), rows.min(0) + cand.argmax(0));
}

/// Every kernel description in this module, for tooling (offline assembly, inspection).
pub fn all() -> [&'static tilefuse_dsl::runtime::KernelDef; 4] {
    [&Q8_0_GEMV, &Q4_K_GEMV, &Q6_K_GEMV, &SILU_MUL_IN_PLACE]
}

/// `act[i] = bf16(bf16(silu(g[i])) * u[i])` for `i < inter`, over `act = [g; u]` in
/// place (the reference's rounding): between a quantized gate/up GEMV and the down
/// projection, computed once a step rather than by every program of the down
/// projection (its `SILU_MUL = 1` prologue, which every program repeats for the whole
/// activation: measured 19 µs a launch at Qwen3-0.6B's down projection in the step,
/// docs/perf.md "Quantized GEMVs").
#[kernel(crate = tilefuse_dsl, B = [1024], num_warps = [4])]
pub fn silu_mul_in_place<const B: usize>(act: Ptr<bf16>, inter: i32) {
    let offs = program_id(0) * B + arange(0, B);
    let ok = offs < inter;
    wait_for_prior_kernels();
    let g = load(act + offs, ok, 0.0) as f32;
    let u = load(act + inter + offs, ok, 0.0) as f32;
    let silu = (g / (1.0 + exp(-g))) as bf16 as f32;
    store(act + offs, (silu * u) as bf16, ok);
}

/// `y = bf16(W · a + bias)` for a Q8_0 matrix `W` of shape `[n, k]` with
/// `k = 4 * k_words` (`q: u32[n, k_words]`, `d: f16[n, k / 32]`); with `RESIDUAL = 1`,
/// `y = bf16(y + bf16(W · a + bias))`; with `NORM = 1`, RMSNorm of `a` first (see the
/// module docs).
#[kernel(
    crate = tilefuse_dsl,
    BLOCK_N = [1, 2, 4, 8],
    BLOCK_K = [256, 512, 1024, 2048, 4096],
    num_warps = [4, 8],
    RESIDUAL = [0, 1],
    NORM = [0, 1],
    SILU_MUL = [0, 1],
    HEAD = [0, 1],
    skip(NORM = 1, RESIDUAL = 1),
    skip(SILU_MUL = 1, NORM = 1),
    skip(SILU_MUL = 1, RESIDUAL = 0),
    skip(HEAD = 1, NORM = 0),
    // Long tiles are for wide matrices (O, down: few rows); more would spill.
    skip(BLOCK_K = [2048, 4096], BLOCK_N = 8),
    skip(BLOCK_K = 4096, BLOCK_N = 4),
    skip(BLOCK_K = 2048, BLOCK_N = 4, num_warps = 4),
    skip(BLOCK_K = 4096, BLOCK_N = 2, num_warps = 4),
    skip(BLOCK_K = [2048, 4096], HEAD = 1)
)]
pub fn q8_0_gemv<
    const BLOCK_N: usize,
    const BLOCK_K: usize,
    const RESIDUAL: usize,
    const NORM: usize,
    const SILU_MUL: usize,
    const HEAD: usize,
>(
    q: Ptr<u32>,
    d: Ptr<f16>,
    a: Ptr<bf16>,
    norm_w: Ptr<bf16>,
    bias: Ptr<bf16>,
    y: Ptr<bf16>,
    logits: Ptr<f32>,
    part_val: Ptr<f32>,
    part_idx: Ptr<i32>,
    n: i32,
    row0: i32,
    #[multiple_of(8)] k_words: i32,
    eps: f32,
) {
    let groups = k_words / 8;
    let rows = program_id(0) * BLOCK_N + arange(0, BLOCK_N);
    let row_ok = rows < n;
    let grp = arange(0, BLOCK_K / 32);
    let t = arange(0, 4);
    let w = arange(0, 8);
    let shift = (t * 8).expand_dims(1) as u32;
    let q_rows = (rows * k_words)
        .expand_dims(1)
        .expand_dims(2)
        .expand_dims(3);
    let d_rows = (rows * groups).expand_dims(1);
    let ok2 = row_ok.expand_dims(1);
    // Word and element offsets of the tile's groups from its first group.
    let words = (grp * 8).expand_dims(1).expand_dims(2) + w.expand_dims(0).expand_dims(0);
    let elems =
        (grp * 32).expand_dims(1).expand_dims(2) + (t * 8).expand_dims(1) + w.expand_dims(0);

    // The first tile's weights are requested before waiting for the kernels that
    // produce `a` and `y`.
    let g_ok = ok2 & (grp < groups).expand_dims(0);
    let q_first = load(
        q + q_rows + words.expand_dims(0),
        g_ok.expand_dims(2).expand_dims(3),
        0,
    );
    let d_first = load(d + d_rows + grp.expand_dims(0), g_ok, 0.0);
    let mut b = zeros::<f32>([BLOCK_N]);
    if HEAD == 0 {
        b = load(bias + row0 + rows, row_ok, 0.0) as f32;
    }
    wait_for_prior_kernels();
    let mut old = zeros::<f32>([BLOCK_N]);
    if RESIDUAL == 1 {
        old = load(y + row0 + rows, row_ok, 0.0) as f32;
    }
    let mut inv_rms = 1.0;
    if HEAD == 1 {
        inv_rms = inv_rms_of::<BLOCK_K>(a, groups * 32, eps);
    }
    let a_ok = (grp < groups).expand_dims(1).expand_dims(2);
    let mut xv = load(a + elems, a_ok, 0.0) as f32;
    if SILU_MUL == 1 {
        // `a` is `[gate; up]`, each `k` long (a fused gate/up projection's output).
        let up = load(a + groups * 32 + elems, a_ok, 0.0) as f32;
        xv = ((xv / (1.0 + exp(-xv))) as bf16 as f32 * up) as bf16 as f32;
    }
    let mut sq = 0.0;
    let mut av = xv;
    if HEAD == 1 {
        // The final norm rounded as the LM head's reference does.
        av = head_norm(xv, load(norm_w + elems, a_ok, 0.0) as f32, inv_rms);
    } else if NORM == 1 {
        // RMSNorm folded in (as `rms_norm_gemv`): the squares are summed from the
        // activation tiles and `inv_rms` scales the row sums at the end.
        sq = (xv * xv).sum(2).sum(1).sum(0);
        av = xv * (load(norm_w + elems, a_ok, 0.0) as f32);
    }
    let vals = (((q_first >> shift) & 255) as i32 - 128) as f32;
    let dots = (vals * av.expand_dims(0)).sum(3).sum(2);
    let mut sums = (dots * (d_first as f32)).sum(1);
    for g0 in (BLOCK_K / 32..groups).step_by(BLOCK_K / 32) {
        let g_in = (g0 + grp < groups).expand_dims(0);
        let g_ok = ok2 & g_in;
        let qt = load(
            q + q_rows + (g0 * 8 + words).expand_dims(0),
            g_ok.expand_dims(2).expand_dims(3),
            0,
        );
        let dt = load(d + d_rows + (g0 + grp).expand_dims(0), g_ok, 0.0);
        let a_ok = (g0 + grp < groups).expand_dims(1).expand_dims(2);
        let mut xv = load(a + g0 * 32 + elems, a_ok, 0.0) as f32;
        if SILU_MUL == 1 {
            let up = load(a + (groups + g0) * 32 + elems, a_ok, 0.0) as f32;
            xv = ((xv / (1.0 + exp(-xv))) as bf16 as f32 * up) as bf16 as f32;
        }
        let mut av = xv;
        if HEAD == 1 {
            av = head_norm(
                xv,
                load(norm_w + g0 * 32 + elems, a_ok, 0.0) as f32,
                inv_rms,
            );
        } else if NORM == 1 {
            sq += (xv * xv).sum(2).sum(1).sum(0);
            av = xv * (load(norm_w + g0 * 32 + elems, a_ok, 0.0) as f32);
        }
        let vals = (((qt >> shift) & 255) as i32 - 128) as f32;
        let dots = (vals * av.expand_dims(0)).sum(3).sum(2);
        sums += (dots * (dt as f32)).sum(1);
    }
    if NORM == 1 && HEAD == 0 {
        sums = sums * (1.0 / sqrt(sq / ((groups * 32) as f32) + eps));
    }
    let proj = (sums + b) as bf16;
    if HEAD == 1 {
        store_head(logits, part_val, part_idx, row0 + rows, proj as f32, row_ok);
    } else if RESIDUAL == 1 {
        store(y + row0 + rows, (old + proj as f32) as bf16, row_ok);
    } else {
        store(y + row0 + rows, proj, row_ok);
    }
}

/// `y = bf16(W · a + bias)` for a Q4_K matrix `W` of shape `[n, k]` with
/// `k = 8 * k_words` (`q: u32[n, k_words]`, `scales`, `mins: u8[n, k / 32]`, `d`,
/// `dmin: f16[n, k / 256]`); with `RESIDUAL = 1`, `y = bf16(y + bf16(W · a + bias))`;
/// with `NORM = 1`, RMSNorm of `a` first (see the module docs).
#[kernel(
    crate = tilefuse_dsl,
    BLOCK_N = [1, 2, 4, 8],
    BLOCK_K = [256, 512, 1024, 2048, 4096],
    num_warps = [4, 8],
    RESIDUAL = [0, 1],
    NORM = [0, 1],
    SILU_MUL = [0, 1],
    HEAD = [0, 1],
    skip(NORM = 1, RESIDUAL = 1),
    skip(SILU_MUL = 1, NORM = 1),
    skip(SILU_MUL = 1, RESIDUAL = 0),
    skip(HEAD = 1, NORM = 0),
    // Long tiles are for wide matrices (O, down: few rows); more would spill.
    skip(BLOCK_K = [2048, 4096], BLOCK_N = 8),
    skip(BLOCK_K = 4096, BLOCK_N = 4),
    skip(BLOCK_K = 2048, BLOCK_N = 4, num_warps = 4),
    skip(BLOCK_K = 4096, BLOCK_N = 2, num_warps = 4),
    skip(BLOCK_K = [2048, 4096], HEAD = 1)
)]
pub fn q4_k_gemv<
    const BLOCK_N: usize,
    const BLOCK_K: usize,
    const RESIDUAL: usize,
    const NORM: usize,
    const SILU_MUL: usize,
    const HEAD: usize,
>(
    q: Ptr<u32>,
    scales: Ptr<u8>,
    mins: Ptr<u8>,
    d: Ptr<f16>,
    dmin: Ptr<f16>,
    a: Ptr<bf16>,
    norm_w: Ptr<bf16>,
    bias: Ptr<bf16>,
    y: Ptr<bf16>,
    logits: Ptr<f32>,
    part_val: Ptr<f32>,
    part_idx: Ptr<i32>,
    n: i32,
    row0: i32,
    #[multiple_of(32)] k_words: i32,
    eps: f32,
) {
    let groups = k_words / 4;
    let rows = program_id(0) * BLOCK_N + arange(0, BLOCK_N);
    let row_ok = rows < n;
    let grp = arange(0, BLOCK_K / 32);
    let t = arange(0, 8);
    let w = arange(0, 4);
    let shift = (t * 4).expand_dims(1) as u32;
    let q_rows = (rows * k_words)
        .expand_dims(1)
        .expand_dims(2)
        .expand_dims(3);
    let s_rows = (rows * groups).expand_dims(1);
    let d_rows = (rows * (groups / 8)).expand_dims(1);
    let ok2 = row_ok.expand_dims(1);
    let words = (grp * 4).expand_dims(1).expand_dims(2) + w.expand_dims(0).expand_dims(0);
    let elems =
        (grp * 32).expand_dims(1).expand_dims(2) + (t * 4).expand_dims(1) + w.expand_dims(0);

    let g_ok = ok2 & (grp < groups).expand_dims(0);
    let q_first = load(
        q + q_rows + words.expand_dims(0),
        g_ok.expand_dims(2).expand_dims(3),
        0,
    );
    let sc_first = load(scales + s_rows + grp.expand_dims(0), g_ok, 0);
    let m_first = load(mins + s_rows + grp.expand_dims(0), g_ok, 0);
    let d_first = load(d + d_rows + (grp / 8).expand_dims(0), g_ok, 0.0);
    let dmin_first = load(dmin + d_rows + (grp / 8).expand_dims(0), g_ok, 0.0);
    let mut b = zeros::<f32>([BLOCK_N]);
    if HEAD == 0 {
        b = load(bias + row0 + rows, row_ok, 0.0) as f32;
    }
    wait_for_prior_kernels();
    let mut old = zeros::<f32>([BLOCK_N]);
    if RESIDUAL == 1 {
        old = load(y + row0 + rows, row_ok, 0.0) as f32;
    }
    let mut inv_rms = 1.0;
    if HEAD == 1 {
        inv_rms = inv_rms_of::<BLOCK_K>(a, groups * 32, eps);
    }
    let a_ok = (grp < groups).expand_dims(1).expand_dims(2);
    let mut xv = load(a + elems, a_ok, 0.0) as f32;
    if SILU_MUL == 1 {
        // `a` is `[gate; up]`, each `k` long (a fused gate/up projection's output).
        let up = load(a + groups * 32 + elems, a_ok, 0.0) as f32;
        xv = ((xv / (1.0 + exp(-xv))) as bf16 as f32 * up) as bf16 as f32;
    }
    let mut sq = 0.0;
    let mut av = xv;
    if HEAD == 1 {
        // The final norm rounded as the LM head's reference does.
        av = head_norm(xv, load(norm_w + elems, a_ok, 0.0) as f32, inv_rms);
    } else if NORM == 1 {
        // RMSNorm folded in (as `rms_norm_gemv`): the squares are summed from the
        // activation tiles and `inv_rms` scales the row sums at the end.
        sq = (xv * xv).sum(2).sum(1).sum(0);
        av = xv * (load(norm_w + elems, a_ok, 0.0) as f32);
    }
    let dots = (((q_first >> shift) & 15) as f32 * av.expand_dims(0))
        .sum(3)
        .sum(2);
    let a_sums = av.sum(2).sum(1).expand_dims(0);
    let scale = (d_first as f32) * (sc_first as f32);
    let min = (dmin_first as f32) * (m_first as f32);
    let mut sums = (scale * dots - min * a_sums).sum(1);
    for g0 in (BLOCK_K / 32..groups).step_by(BLOCK_K / 32) {
        let g_in = (g0 + grp < groups).expand_dims(0);
        let g_ok = ok2 & g_in;
        let qt = load(
            q + q_rows + (g0 * 4 + words).expand_dims(0),
            g_ok.expand_dims(2).expand_dims(3),
            0,
        );
        let sct = load(scales + s_rows + (g0 + grp).expand_dims(0), g_ok, 0);
        let mt = load(mins + s_rows + (g0 + grp).expand_dims(0), g_ok, 0);
        let sb = ((g0 + grp) / 8).expand_dims(0);
        let dt = load(d + d_rows + sb, g_ok, 0.0);
        let dmint = load(dmin + d_rows + sb, g_ok, 0.0);
        let a_ok = (g0 + grp < groups).expand_dims(1).expand_dims(2);
        let mut xv = load(a + g0 * 32 + elems, a_ok, 0.0) as f32;
        if SILU_MUL == 1 {
            let up = load(a + (groups + g0) * 32 + elems, a_ok, 0.0) as f32;
            xv = ((xv / (1.0 + exp(-xv))) as bf16 as f32 * up) as bf16 as f32;
        }
        let mut av = xv;
        if HEAD == 1 {
            av = head_norm(
                xv,
                load(norm_w + g0 * 32 + elems, a_ok, 0.0) as f32,
                inv_rms,
            );
        } else if NORM == 1 {
            sq += (xv * xv).sum(2).sum(1).sum(0);
            av = xv * (load(norm_w + g0 * 32 + elems, a_ok, 0.0) as f32);
        }
        let dots = (((qt >> shift) & 15) as f32 * av.expand_dims(0))
            .sum(3)
            .sum(2);
        let a_sums = av.sum(2).sum(1).expand_dims(0);
        let scale = (dt as f32) * (sct as f32);
        let min = (dmint as f32) * (mt as f32);
        sums += (scale * dots - min * a_sums).sum(1);
    }
    if NORM == 1 && HEAD == 0 {
        sums = sums * (1.0 / sqrt(sq / ((groups * 32) as f32) + eps));
    }
    let proj = (sums + b) as bf16;
    if HEAD == 1 {
        store_head(logits, part_val, part_idx, row0 + rows, proj as f32, row_ok);
    } else if RESIDUAL == 1 {
        store(y + row0 + rows, (old + proj as f32) as bf16, row_ok);
    } else {
        store(y + row0 + rows, proj, row_ok);
    }
}

/// `y = bf16(W · a + bias)` for a Q6_K matrix `W` of shape `[n, k]` with
/// `k = 16 * k_words` (`ql: u32[n, 2 * k_words]`, `qh: u32[n, k_words]`,
/// `scales: u8[n, k_words]`, `d: f16[n, k / 256]`); with `RESIDUAL = 1`,
/// `y = bf16(y + bf16(W · a + bias))`; with `NORM = 1`, RMSNorm of `a` first (see the
/// module docs).
#[kernel(
    crate = tilefuse_dsl,
    BLOCK_N = [1, 2, 4, 8],
    BLOCK_K = [256, 512, 1024, 2048, 4096],
    num_warps = [4, 8],
    RESIDUAL = [0, 1],
    NORM = [0, 1],
    SILU_MUL = [0, 1],
    HEAD = [0, 1],
    skip(NORM = 1, RESIDUAL = 1),
    skip(SILU_MUL = 1, NORM = 1),
    skip(SILU_MUL = 1, RESIDUAL = 0),
    skip(HEAD = 1, NORM = 0),
    // Long tiles are for wide matrices (O, down: few rows); more would spill.
    skip(BLOCK_K = [2048, 4096], BLOCK_N = 8),
    skip(BLOCK_K = 4096, BLOCK_N = 4),
    skip(BLOCK_K = 2048, BLOCK_N = 4, num_warps = 4),
    skip(BLOCK_K = 4096, BLOCK_N = 2, num_warps = 4),
    skip(BLOCK_K = [2048, 4096], HEAD = 1)
)]
pub fn q6_k_gemv<
    const BLOCK_N: usize,
    const BLOCK_K: usize,
    const RESIDUAL: usize,
    const NORM: usize,
    const SILU_MUL: usize,
    const HEAD: usize,
>(
    ql: Ptr<u32>,
    qh: Ptr<u32>,
    scales: Ptr<u8>,
    d: Ptr<f16>,
    a: Ptr<bf16>,
    norm_w: Ptr<bf16>,
    bias: Ptr<bf16>,
    y: Ptr<bf16>,
    logits: Ptr<f32>,
    part_val: Ptr<f32>,
    part_idx: Ptr<i32>,
    n: i32,
    row0: i32,
    #[multiple_of(16)] k_words: i32,
    eps: f32,
) {
    // One group (16 elements) a high-bits word and a scale; two low-nibble words.
    let groups = k_words;
    let rows = program_id(0) * BLOCK_N + arange(0, BLOCK_N);
    let row_ok = rows < n;
    let grp = arange(0, BLOCK_K / 16);
    let t = arange(0, 8);
    let w = arange(0, 2);
    let lo_shift = (t * 4).expand_dims(1) as u32;
    // Field t * 2 + w of the group's high-bits word.
    let hi_shift = ((t * 2).expand_dims(1) + w.expand_dims(0)) as u32 * 2;
    let l_rows = (rows * (2 * k_words))
        .expand_dims(1)
        .expand_dims(2)
        .expand_dims(3);
    let g_rows = (rows * groups).expand_dims(1);
    let d_rows = (rows * (groups / 16)).expand_dims(1);
    let ok2 = row_ok.expand_dims(1);
    let words = (grp * 2).expand_dims(1).expand_dims(2) + w.expand_dims(0).expand_dims(0);
    let elems =
        (grp * 16).expand_dims(1).expand_dims(2) + (t * 2).expand_dims(1) + w.expand_dims(0);

    let g_ok = ok2 & (grp < groups).expand_dims(0);
    let ql_first = load(
        ql + l_rows + words.expand_dims(0),
        g_ok.expand_dims(2).expand_dims(3),
        0,
    );
    // Each group's high-bits word is loaded once per low-nibble word lane (`w * 0`), so
    // that it lands in the layout of the `ql` words and needs no exchange through shared
    // memory before the shift spreads it.
    let h_offs =
        (grp.expand_dims(1).expand_dims(2) + w.expand_dims(0).expand_dims(0) * 0).expand_dims(0);
    let qh_first = load(
        qh + g_rows.expand_dims(2).expand_dims(3) + h_offs,
        g_ok.expand_dims(2).expand_dims(3),
        0,
    );
    let sc_first = load(scales + g_rows + grp.expand_dims(0), g_ok, 128);
    let d_first = load(d + d_rows + (grp / 16).expand_dims(0), g_ok, 0.0);
    let mut b = zeros::<f32>([BLOCK_N]);
    if HEAD == 0 {
        b = load(bias + row0 + rows, row_ok, 0.0) as f32;
    }
    wait_for_prior_kernels();
    let mut old = zeros::<f32>([BLOCK_N]);
    if RESIDUAL == 1 {
        old = load(y + row0 + rows, row_ok, 0.0) as f32;
    }
    let mut inv_rms = 1.0;
    if HEAD == 1 {
        inv_rms = inv_rms_of::<BLOCK_K>(a, groups * 16, eps);
    }
    let a_ok = (grp < groups).expand_dims(1).expand_dims(2);
    let mut xv = load(a + elems, a_ok, 0.0) as f32;
    if SILU_MUL == 1 {
        // `a` is `[gate; up]`, each `k` long (a fused gate/up projection's output).
        let up = load(a + groups * 16 + elems, a_ok, 0.0) as f32;
        xv = ((xv / (1.0 + exp(-xv))) as bf16 as f32 * up) as bf16 as f32;
    }
    let mut sq = 0.0;
    let mut av = xv;
    if HEAD == 1 {
        // The final norm rounded as the LM head's reference does.
        av = head_norm(xv, load(norm_w + elems, a_ok, 0.0) as f32, inv_rms);
    } else if NORM == 1 {
        // RMSNorm folded in (as `rms_norm_gemv`): the squares are summed from the
        // activation tiles and `inv_rms` scales the row sums at the end.
        sq = (xv * xv).sum(2).sum(1).sum(0);
        av = xv * (load(norm_w + elems, a_ok, 0.0) as f32);
    }
    let hi = (qh_first >> hi_shift) & 3;
    let qv = ((((ql_first >> lo_shift) & 15) | (hi << 4)) as i32 - 32) as f32;
    let dots = (qv * av.expand_dims(0)).sum(3).sum(2);
    let scale = (d_first as f32) * (((sc_first as i32) - 128) as f32);
    let mut sums = (scale * dots).sum(1);
    for g0 in (BLOCK_K / 16..groups).step_by(BLOCK_K / 16) {
        let g_in = (g0 + grp < groups).expand_dims(0);
        let g_ok = ok2 & g_in;
        let lt = load(
            ql + l_rows + (g0 * 2 + words).expand_dims(0),
            g_ok.expand_dims(2).expand_dims(3),
            0,
        );
        let ht = load(
            qh + g_rows.expand_dims(2).expand_dims(3) + g0 + h_offs,
            g_ok.expand_dims(2).expand_dims(3),
            0,
        );
        let sct = load(scales + g_rows + (g0 + grp).expand_dims(0), g_ok, 128);
        let dt = load(d + d_rows + ((g0 + grp) / 16).expand_dims(0), g_ok, 0.0);
        let a_ok = (g0 + grp < groups).expand_dims(1).expand_dims(2);
        let mut xv = load(a + g0 * 16 + elems, a_ok, 0.0) as f32;
        if SILU_MUL == 1 {
            let up = load(a + (groups + g0) * 16 + elems, a_ok, 0.0) as f32;
            xv = ((xv / (1.0 + exp(-xv))) as bf16 as f32 * up) as bf16 as f32;
        }
        let mut av = xv;
        if HEAD == 1 {
            av = head_norm(
                xv,
                load(norm_w + g0 * 16 + elems, a_ok, 0.0) as f32,
                inv_rms,
            );
        } else if NORM == 1 {
            sq += (xv * xv).sum(2).sum(1).sum(0);
            av = xv * (load(norm_w + g0 * 16 + elems, a_ok, 0.0) as f32);
        }
        let hi = (ht >> hi_shift) & 3;
        let qv = ((((lt >> lo_shift) & 15) | (hi << 4)) as i32 - 32) as f32;
        let dots = (qv * av.expand_dims(0)).sum(3).sum(2);
        let scale = (dt as f32) * (((sct as i32) - 128) as f32);
        sums += (scale * dots).sum(1);
    }
    if NORM == 1 && HEAD == 0 {
        sums = sums * (1.0 / sqrt(sq / ((groups * 16) as f32) + eps));
    }
    let proj = (sums + b) as bf16;
    if HEAD == 1 {
        store_head(logits, part_val, part_idx, row0 + rows, proj as f32, row_ok);
    } else if RESIDUAL == 1 {
        store(y + row0 + rows, (old + proj as f32) as bf16, row_ok);
    } else {
        store(y + row0 + rows, proj, row_ok);
    }
}
