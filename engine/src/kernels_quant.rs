//! GEMVs over quantized weights (Q8_0, Q4_K, Q5_K, Q4_0 and Q5_0, Q6_K, Q3_K), written in tilefuse's kernel
//! language: the weights stream in the device layout of
//! [`PackedMatrix`](crate::gguf::quant::PackedMatrix) and meet int8 activations in
//! byte dot products (`dot4`, PTX `dp4a`), llama.cpp's approach (its `q8_1`
//! activations): integer sums a block, scaled once in f32.
//!
//! **Activations.** [`quantize_act`] runs once per GEMV input (except the O
//! projection's, which [`attention_combine_quant`] writes as it merges the attention's
//! splits, the normed inputs that the GEMVs' `ACT = 1` variant quantizes itself, and
//! the down projection's, which a Q4_K gate/up GEMV's `SILU_Q = 1` variant writes)
//! and writes, for each 32-element block `j` of the activation `x`: `xd[j] = max|x| / 127` (f32) and the int8
//! values `q = floor(x * 127 / max|x| + 0.5)` four to a word in element order
//! (`xq[8 j + w]` holds elements `32 j + 4 w .. + 4`, byte `b` element `32 j + 4 w + b`).
//! The K-quant GEMVs take the sums of `q` they need (a block's, or each 16-element
//! half's) by `dot4` with `0x01010101` from the words they already hold: a loaded sum
//! would arrive in another layout and cross shared memory every iteration
//! (docs/perf.md, "Scale loads in the weight tile's layout"). It computes the GEMV's
//! input first, so the step needs no other kernel for it:
//!
//! - `MODE = 0`: `x = a`;
//! - `MODE = 1`: `x = (a * inv_rms) * norm_w` with `inv_rms = 1 / sqrt(mean(a²) + eps)`
//!   (RMSNorm before the QKV and gate/up projections);
//! - `MODE = 2`: `x = bf16(bf16(silu(g)) * u)` of `a = [g; u]` (each `k` long; the
//!   MLP's down projection after a gate/up GEMV), the reference's rounding
//!   (`engine/src/reference.rs`);
//! - `MODE = 3`: the LM head's final norm, `x = bf16(g * bf16(a * inv_rms))` as
//!   [`lm_head_argmax`](crate::kernels::lm_head_argmax) rounds it.
//!
//! **GEMVs.** Each type has one kernel with four variants:
//!
//! - `RESIDUAL = 0, HEAD = 0`: `y = bf16(W · x + bias)`;
//! - `ACT = 1`: the same over `x` = RMSNorm of the bf16 `a` (weights `norm_w`), with no
//!   quantizer launch before it: each program quantizes the blocks of `a * norm_w` its
//!   tiles read, exactly as `quantize_act` would but for the positive factor `inv_rms`
//!   (quantization does not change under it: the program computes `inv_rms` and scales
//!   its row sums by it, as [`rms_norm_gemv`](crate::kernels::rms_norm_gemv) does).
//!   Every program quantizes the whole input again, so the decode step uses it for
//!   short rows only (`gguf::device::fuses_norm`; docs/perf.md, "The norm inside the
//!   quantized GEMV");
//! - `RESIDUAL = 1`: `y = bf16(y + bf16(W · x + bias))`, as
//!   [`gemv_residual`](crate::kernels::gemv_residual);
//! - `SILU_Q = 1` (Q4_K): the `[gate; up]` GEMV (`n` rows, gate the first half) that
//!   writes no `y` but the down projection's int8 input: program `j` takes gate rows
//!   `32 j ..` and the same up rows (64 rows, `BLOCK_N = 64`), rounds both as `y` would
//!   be stored, and writes `x = bf16(bf16(silu(g)) * u)` as activation block `j` in
//!   `out_q` / `out_d`, exactly what [`quantize_act`] `MODE = 2` would write from `y`.
//!   Its normed input is quantized inside (`ACT = 1`) or before it into `xq` / `xd`
//!   (`ACT = 0`). The step then launches no quantizer between gate/up and down
//!   (`gguf::device::DeviceQuantMatrix::gemv_norm_silu_quantized`; docs/perf.md,
//!   "`silu(gate) * up` quantized by the gate/up GEMV");
//! - `HEAD = 1`: the LM head: the bf16 logits `bf16(W · x)` stored as f32 in `logits`,
//!   and each program's greedy candidate (its largest logit, the first on ties) in
//!   `part_val`/`part_idx[program_id]`, for
//!   [`argmax_finish`](crate::kernels::argmax_finish). `y` and `bias` are not read.
//!
//! Rows `0..n` of the weights write rows `row0..row0 + n` of `y` (and read those of
//! `bias`): a fused projection whose parts have different types is launched one run
//! of rows at a time over the same quantized activation, except the QKV projections of
//! two runs that [`q4_k_q6_k_gemv`] takes in one launch: Q4_K_M's `[q; k]` Q4_K with a
//! Q6_K `v` (Q5_K_M's with Q5_K), and Q3_K_M's `[q; k]` Q3_K with a Q4_K or Q5_K `v`
//! (its programs split between the two runs; the same row sums as the two kernels,
//! through the shared `q4_k_row_sums` / `q6_k_row_sums`).
//!
//! Tiles are `[BLOCK_N, blocks, words]`, one 32-element block a tile row, so that each
//! thread's 16-byte vector of weight words meets the activation words of the same
//! elements (the layout in [`crate::gguf::quant`]; Q6_K's high-bits words, one for two
//! low-nibble words, are loaded once per low word, so that they arrive in its layout;
//! docs/perf.md, "Q6_K words four a thread"):
//! - Q8_0: `d · xd · Σ dot4(q, x)`;
//! - Q4_K: `xd · (d·sc · Σ (dot4(q & 0x0F0F0F0F, x_lo) + dot4((q >> 4) & 0x0F0F0F0F,
//!   x_hi)) − dmin·m · Σ q_x)`;
//! - Q4_1 and Q5_1 (the Q8_0 kernels' `MIN = 1` variants): Q8_0's sum plus
//!   `m · xd · Σ q_x` a block;
//! - Q4_0 and Q5_0 (the Q4_K kernels' `LAYOUT` 2 and 3 variants, one scale a block):
//!   `xd · d · (Σ dot4 − 8 Σ q_x)` (Q5_0: the fifth bits as Q5_K's, and 16);
//! - Q5_K (the Q4_K kernels' `LAYOUT = 1` variants): Q4_K's sum with each nibble's fifth bit
//!   at bit 4 of its byte before the `dot4`s;
//! - Q6_K: the 6-bit values are the low nibbles with the high bits at bit 4 of each
//!   byte; `d · xd · Σ_halves sc_h · (dot4(q6, x) − 32 Σ q_x)`;
//! - Q3_K (the Q6_K kernels' `LAYOUT = 1` variants): each byte lane's 2-bit field with
//!   its high bit at bit 2; Q6_K's sum with 4 for 32;
//! - IQ4_XS (the Q4_K kernels' `LAYOUT = 4` variants): each half of a word is four
//!   4-bit indices, looked up in IQ4_NL's 16-byte table by three `byte_perm`s as signed
//!   bytes; `xd · d · (sc − 32) · Σ dot4(K[q], x)`.
//!
//! The integer sums are exact; the f32 scaling is the only rounding before the output's.
//! A program keeps one f32 partial sum per row and block across its tiles and reduces
//! over the blocks once, after the loop; in each tile the block values are computed with
//! the `dots`-derived operand first, so that the compiler loads the scales straight into
//! the weight tile's layout (docs/perf.md, "Scale loads in the weight tile's layout").
//! The columns `k` must be a multiple of 256 (of 32 for Q8_0), as the formats require;
//! `BLOCK_K` may exceed `k`. Each kernel takes the row length in words of its quant
//! array (`k_words`) rather than in elements: the compiler proves alignment through
//! sums and products, not quotients, so the word loads become 16-byte vectors.
//!
//! As in the bf16 kernels, the first weight tile is requested before
//! `wait_for_prior_kernels()`, so with programmatic launch it overlaps the previous
//! kernel's tail (the activation quantizer's).
//!
//! The decode step's kernels here end with the timeline arguments `stamps` and
//! `stamp_at` of [`crate::kernels`]' layer kernels, written by
//! `crate::kernels::stamp_now` (the entry stamp just before the wait) in their
//! `STAMPS = 1` variants only; the host side hands out their slots
//! ([`crate::gguf::device::StampSlots`]) and launches `STAMPS = 0`, with no stamp code,
//! wherever a launch has none.

use tilefuse_macros::{kernel, tile_fn};

use crate::kernels::stamp_now;

/// `1 / sqrt(mean(a²) + eps)` over `a[0..k]`, in tiles of `B`.
#[tile_fn(crate = tilefuse_dsl)]
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
#[tile_fn(crate = tilefuse_dsl)]
fn head_norm(x: Tile<f32>, g: Tile<f32>, inv_rms: f32) -> Tile<f32> {
    (g * ((x * inv_rms) as bf16 as f32)) as bf16 as f32
}

/// The LM head's outputs: the logits of `rows`, and the program's greedy candidate
/// (its largest logit, the first on ties) for `argmax_finish`.
#[tile_fn(crate = tilefuse_dsl)]
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
pub fn all() -> [&'static tilefuse_dsl::runtime::KernelDef; 14] {
    [
        &Q8_0_GEMV_TOKENS,
        &Q4_K_GEMV_TOKENS,
        &Q6_K_GEMV_TOKENS,
        &QUANTIZE_SILU_MUL_ROWS,
        &DEQUANTIZE_Q8_0,
        &DEQUANTIZE_Q4_K,
        &DEQUANTIZE_Q6_K,
        &QUANTIZE_ACT,
        &ATTENTION_COMBINE_QUANT,
        &Q8_0_GEMV,
        &Q4_K_GEMV,
        &Q6_K_GEMV,
        &Q4_K_Q6_K_GEMV,
        &SILU_MUL_IN_PLACE,
    ]
}

/// `act[i] = bf16(bf16(silu(g[i])) * u[i])` for `i < inter`, over `act = [g; u]` in
/// place (the reference's rounding): between a quantized gate/up GEMV and a dense down
/// projection (a quantized one takes the product in its activation quantizer,
/// [`quantize_act`] `MODE = 2`).
#[kernel(crate = tilefuse_dsl, B = [1024], num_warps = [4], STAMPS = [0, 1])]
pub fn silu_mul_in_place<const B: usize, const STAMPS: usize>(
    act: Ptr<bf16>,
    inter: i32,
    stamps: Ptr<i64>,
    stamp_at: i32,
) {
    let offs = program_id(0) * B + arange(0, B);
    let ok = offs < inter;
    stamp_now::<STAMPS>(stamps, stamp_at, 0);
    wait_for_prior_kernels();
    stamp_now::<STAMPS>(stamps, stamp_at, 1);
    let g = load(act + offs, ok, 0.0) as f32;
    let u = load(act + inter + offs, ok, 0.0) as f32;
    let silu = (g / (1.0 + exp(-g))) as bf16 as f32;
    store(act + offs, (silu * u) as bf16, ok);
    stamp_now::<STAMPS>(stamps, stamp_at, 2);
}

/// `x = a * norm_w` at the element indices `e` (masked by `ok`): the RMSNorm input of a
/// GEMV that quantizes its own activation (`ACT = 1`), before its `inv_rms`, which
/// scales the row sums instead (quantization does not change under a positive scale).
#[tile_fn(crate = tilefuse_dsl)]
fn normed_input(a: Ptr<bf16>, norm_w: Ptr<bf16>, e: Tile<i32>, ok: Tile<bool>) -> Tile<f32> {
    (load(a + e, ok, 0.0) as f32) * (load(norm_w + e, ok, 0.0) as f32)
}

/// Values `v` (`[.., 4]`: four to a word along the last axis) quantized with the
/// per-block `inv = 127 / max|x|` (broadcast to `v`'s shape) and packed into words:
/// the one spelling of the quantizer's rounding, which `store_blocks` and the GEMVs'
/// own quantization share.
#[tile_fn(crate = tilefuse_dsl)]
fn pack_words3(v: Tile<f32>, inv: Tile<f32>) -> Tile<i32> {
    let b = arange(0, 4);
    let q = floor(v * inv + 0.5) as i32;
    (((q as u32) & 255) << (b * 8) as u32)
        .sum(2)
        .bitcast::<i32>()
}

/// [`pack_words3`] for rank-4 values (`[.., 4]`).
#[tile_fn(crate = tilefuse_dsl)]
fn pack_words4(v: Tile<f32>, inv: Tile<f32>) -> Tile<i32> {
    let b = arange(0, 4);
    let q = floor(v * inv + 0.5) as i32;
    (((q as u32) & 255) << (b * 8) as u32)
        .sum(3)
        .bitcast::<i32>()
}

/// `127 / amax` where `amax > 0`, else 0: the quantizer's inverse step.
#[tile_fn(crate = tilefuse_dsl)]
fn inv_step(amax: Tile<f32>) -> Tile<f32> {
    select(amax > 0.0, 127.0 / amax, 0.0)
}

/// Stores `x` (`[blocks, 2, 4, 4]`: blocks `blk` of 32 values in element order) as int8
/// blocks, four values a word in `xq` and each block's scale in `xd`, where `blk_ok`:
/// what [`quantize_act`] and [`attention_combine_quant`] write.
#[tile_fn(crate = tilefuse_dsl)]
fn store_blocks(x: Tile<f32>, blk: Tile<i32>, blk_ok: Tile<bool>, xq: Ptr<i32>, xd: Ptr<f32>) {
    let h = arange(0, 2);
    let w = arange(0, 4);
    let amax = abs(x).max(3).max(2).max(1);
    let inv = inv_step(amax).expand_dims(1).expand_dims(2).expand_dims(3);
    let w_offs = (blk * 8).expand_dims(1).expand_dims(2) + (h * 4).expand_dims(1) + w;
    store(
        xq + w_offs,
        pack_words4(x, inv),
        blk_ok.expand_dims(1).expand_dims(2),
    );
    store(xd + blk, amax / 127.0, blk_ok);
}

/// Quantizes a GEMV's input to int8 blocks of 32 (see the module docs): `xq` (four
/// values a word) and `xd` (each block's scale), for `x` of length `k` computed from `a`
/// by `MODE`. One program a `B` elements.
#[kernel(crate = tilefuse_dsl, B = [256], num_warps = [4], MODE = [0, 1, 2, 3], STAMPS = [0, 1])]
pub fn quantize_act<const B: usize, const MODE: usize, const STAMPS: usize>(
    a: Ptr<bf16>,
    norm_w: Ptr<bf16>,
    xq: Ptr<i32>,
    xd: Ptr<f32>,
    #[multiple_of(32)] k: i32,
    eps: f32,
    prefetch_q: Ptr<u32>,
    prefetch_first: i32,
    prefetch_len: i32,
    stamps: Ptr<i64>,
    stamp_at: i32,
) {
    // [blocks, halves, words, bytes] in element order.
    let blk = program_id(0) * (B / 32) + arange(0, B / 32);
    let h = arange(0, 2);
    let w = arange(0, 4);
    let b = arange(0, 4);
    let e = (blk * 32).expand_dims(1).expand_dims(2).expand_dims(3)
        + (h * 16).expand_dims(1).expand_dims(2)
        + (w * 4).expand_dims(1)
        + b;
    let ok = e < k;
    // The norm's weights are no kernel's output: requested before the wait, so that
    // after it only `a` is a memory round trip away.
    let mut g = (e & 0) as f32;
    if (MODE == 1) | (MODE == 3) {
        g = load(norm_w + e, ok, 0.0) as f32;
    }
    stamp_now::<STAMPS>(stamps, stamp_at, 0);
    wait_for_prior_kernels();
    stamp_now::<STAMPS>(stamps, stamp_at, 1);
    // Once the GEMV before has finished streaming, HBM idles through this launch: each
    // program asks L2 for its share of the next GEMV's words
    // `prefetch_first..prefetch_first + prefetch_len` (none when the length is 0).
    if prefetch_len > 0 {
        let per = cdiv(cdiv(prefetch_len, num_programs(0)), 32) * 32;
        let first = minimum(program_id(0) * per, prefetch_len);
        prefetch_range(
            prefetch_q + prefetch_first + first,
            minimum(per, prefetch_len - first),
        );
    }
    let mut x = load(a + e, ok, 0.0) as f32;
    if MODE == 2 {
        let u = load(a + k + e, ok, 0.0) as f32;
        x = ((x / (1.0 + exp(-x))) as bf16 as f32 * u) as bf16 as f32;
    }
    // The sum of squares over all of `a` in one tile up to 4096 elements (8B's hidden
    // size): its loads issue together instead of one 1024-element round trip after
    // another (`tilefuse bench --timeline`, docs/perf.md "The quantized layer's
    // timeline").
    if MODE == 1 {
        let inv_rms = inv_rms_of::<4096>(a, k, eps);
        x = x * inv_rms * g;
    }
    if MODE == 3 {
        let inv_rms = inv_rms_of::<4096>(a, k, eps);
        x = head_norm(x, g, inv_rms);
    }
    store_blocks(x, blk, blk * 32 < k, xq, xd);
    stamp_now::<STAMPS>(stamps, stamp_at, 2);
}

/// Decode attention's second pass for a quantized O projection:
/// [`crate::kernels::attention_combine`] (the bf16 head output in `out`, grid
/// `[num_heads, D / DC]`) that also writes its columns as the O GEMV's int8 activation
/// blocks, exactly what [`quantize_act`] `MODE = 0` would write from `out`, so the O
/// projection launches no quantizer. `DC` is a multiple of 32: a program's columns are
/// whole blocks.
#[kernel(crate = tilefuse_dsl, D = [32, 64, 128], S = [8, 16, 32, 64], DC = [32, 64, 128], num_warps = [4], STAMPS = [0, 1])]
#[allow(clippy::too_many_arguments)]
pub fn attention_combine_quant<
    const D: usize,
    const S: usize,
    const DC: usize,
    const STAMPS: usize,
>(
    part_m: Ptr<f32>,
    part_l: Ptr<f32>,
    part_acc: Ptr<f32>,
    out: Ptr<bf16>,
    xq: Ptr<i32>,
    xd: Ptr<f32>,
    splits: i32,
    stamps: Ptr<i64>,
    stamp_at: i32,
) {
    stamp_now::<STAMPS>(stamps, stamp_at, 0);
    wait_for_prior_kernels();
    stamp_now::<STAMPS>(stamps, stamp_at, 1);
    let head = program_id(0);
    let d = program_id(1) * DC + arange(0, DC);
    let o = crate::kernels::merge_splits::<D, S>(part_m, part_l, part_acc, splits, head, d);
    store(out + head * D + d, o);
    let blk = (head * D + program_id(1) * DC) / 32 + arange(0, DC / 32);
    store_blocks(o.reshape([DC / 32, 2, 4, 4]) as f32, blk, blk >= 0, xq, xd);
    stamp_now::<STAMPS>(stamps, stamp_at, 2);
}

/// The output of a quantized GEMV's row sums `sums` (bias `b` added): the LM head's
/// logits and candidates, `y` plus the projection, or the projection.
#[tile_fn(crate = tilefuse_dsl)]
#[allow(clippy::too_many_arguments)]
fn store_rows<const RESIDUAL: usize, const HEAD: usize>(
    y: Ptr<bf16>,
    logits: Ptr<f32>,
    part_val: Ptr<f32>,
    part_idx: Ptr<i32>,
    rows: Tile<i32>,
    row_ok: Tile<bool>,
    sums: Tile<f32>,
    b: Tile<f32>,
    old: Tile<f32>,
) {
    let proj = (sums + b) as bf16;
    if HEAD == 1 {
        store_head(logits, part_val, part_idx, rows, proj as f32, row_ok);
    } else if RESIDUAL == 1 {
        store(y + rows, (old + proj as f32) as bf16, row_ok);
    } else {
        store(y + rows, proj, row_ok);
    }
}

/// One tile's Q8_0 sums per row and block (`[n, blocks]`): `qt: [n, blocks, 8]` words,
/// `dd: [n, blocks]` scales, against activation blocks `blk` (valid where `blk_ok`).
/// With `MIN = 1` (Q4_1 and Q5_1), `mm: [n, blocks]` are the blocks' offsets, each times
/// the block's sum of `x`; else `mm` is not read.
#[tile_fn(crate = tilefuse_dsl)]
#[allow(clippy::too_many_arguments)]
fn q8_0_tile<const ACT: usize, const MIN: usize>(
    qt: Tile<u32>,
    dd: Tile<f16>,
    mm: Tile<f16>,
    xq: Ptr<i32>,
    xd: Ptr<f32>,
    a: Ptr<bf16>,
    norm_w: Ptr<bf16>,
    blk: Tile<i32>,
    blk_ok: Tile<bool>,
    w: Tile<i32>,
) -> Tile<f32> {
    let x_offs = (blk * 8).expand_dims(1) + w.expand_dims(0);
    let x_ok = blk_ok.expand_dims(1);
    let mut x = x_offs & 0;
    let mut x_d = (blk & 0) as f32;
    if ACT == 0 {
        x = load(xq + x_offs, x_ok, 0);
        x_d = load(xd + blk, blk_ok, 0.0);
    } else {
        // Word `8 blk + w` holds elements `4 (8 blk + w) + b`.
        let e = (x_offs * 4).expand_dims(2) + arange(0, 4);
        let v = normed_input(a, norm_w, e, x_ok.expand_dims(2));
        let amax = abs(v).max(2).max(1);
        x = pack_words3(v, inv_step(amax).expand_dims(1).expand_dims(2));
        x_d = amax / 127.0;
    }
    let x3 = x.expand_dims(0);
    let dots = dot4(qt.bitcast::<i32>(), x3, 0).sum(2);
    let mut v = (dots as f32) * (dd as f32);
    if MIN == 1 {
        // The block's sum of `x` by `dot4` with ones (weight-shaped, as in `q4_k_tile`).
        let ones = (qt.bitcast::<i32>() & 0) | 0x0101_0101;
        v = v + (dot4(ones, x3, 0).sum(2) as f32) * (mm as f32);
    }
    v * x_d.expand_dims(0)
}

/// `y = bf16(W · x + bias)` for a Q8_0 matrix `W` of shape `[n, k]` with
/// `k = 4 * k_words` (`q: u32[n, k_words]`, `d: f16[n, k / 32]`) and `x` quantized by
/// [`quantize_act`]; the residual and LM-head variants as in the module docs. `MIN = 1`
/// reads Q4_1 and Q5_1 (`x = d * q + m`): the same arrays and the offsets `m: f16[n, k
/// / 32]` (not read otherwise).
#[kernel(
    crate = tilefuse_dsl,
    BLOCK_N = [1, 2, 4, 8, 16, 32],
    BLOCK_K = [256, 512, 1024, 2048],
    num_warps = [4, 8],
    RESIDUAL = [0, 1],
    HEAD = [0, 1],
    ACT = [0, 1],
    skip(HEAD = 1, RESIDUAL = 1),
    // The norm prologue is for the QKV and gate/up projections (no residual, no head).
    skip(ACT = 1, HEAD = 1),
    skip(ACT = 1, RESIDUAL = 1),
    // Long tiles are for wide matrices (few rows), many rows for tall ones.
    skip(BLOCK_K = 2048, BLOCK_N = [8, 16, 32]),
    skip(BLOCK_K = 1024, BLOCK_N = 32),
    skip(BLOCK_K = 2048, HEAD = 1),
    // 1: block offsets (Q4_1, Q5_1), at the tiles the step picks.
    MIN = [0, 1],
    skip(MIN = 1, BLOCK_N = [1, 2, 32]),
    skip(MIN = 1, BLOCK_K = 256),
    // 1: the timeline stamps (`crate::kernels::stamp_now`), 0: none compiled.
    STAMPS = [0, 1]
)]
pub fn q8_0_gemv<
    const BLOCK_N: usize,
    const BLOCK_K: usize,
    const RESIDUAL: usize,
    const HEAD: usize,
    const ACT: usize,
    const MIN: usize,
    const STAMPS: usize,
>(
    q: Ptr<u32>,
    d: Ptr<f16>,
    m: Ptr<f16>,
    xq: Ptr<i32>,
    xd: Ptr<f32>,
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
    stamps: Ptr<i64>,
    stamp_at: i32,
) {
    let blocks = k_words / 8;
    let rows = program_id(0) * BLOCK_N + arange(0, BLOCK_N);
    let row_ok = rows < n;
    let grp = arange(0, BLOCK_K / 32);
    let w = arange(0, 8);
    let q_rows = (rows * k_words).expand_dims(1).expand_dims(2);
    let d_rows = (rows * blocks).expand_dims(1);
    let words = (grp * 8).expand_dims(1) + w.expand_dims(0);
    let ok2 = row_ok.expand_dims(1);

    // The first tile's weights are requested before waiting for the kernels that
    // produce `x` and `y`.
    let ok = ok2 & (grp < blocks).expand_dims(0);
    let q_first = load(q + q_rows + words.expand_dims(0), ok.expand_dims(2), 0);
    let d_first = load(d + d_rows + grp.expand_dims(0), ok, 0.0);
    let mut m_first = d_first;
    if MIN == 1 {
        m_first = load(m + d_rows + grp.expand_dims(0), ok, 0.0);
    }
    let mut b = zeros::<f32>([BLOCK_N]);
    if HEAD == 0 {
        b = load(bias + row0 + rows, row_ok, 0.0) as f32;
    }
    stamp_now::<STAMPS>(stamps, stamp_at, 0);
    wait_for_prior_kernels();
    stamp_now::<STAMPS>(stamps, stamp_at, 1);
    // With the norm prologue, `inv_rms` scales the row sums (as in `rms_norm_gemv`).
    let mut inv_rms = 1.0;
    if ACT == 1 {
        inv_rms = inv_rms_of::<1024>(a, k_words * 4, eps);
    }
    let mut old = zeros::<f32>([BLOCK_N]);
    if RESIDUAL == 1 {
        old = load(y + row0 + rows, row_ok, 0.0) as f32;
    }
    let mut acc = q8_0_tile::<ACT, MIN>(
        q_first,
        d_first,
        m_first,
        xq,
        xd,
        a,
        norm_w,
        grp,
        grp < blocks,
        w,
    );
    for g0 in (BLOCK_K / 32..blocks).step_by(BLOCK_K / 32) {
        let blk = g0 + grp;
        let blk_ok = blk < blocks;
        let ok = ok2 & blk_ok.expand_dims(0);
        let qt = load(
            q + q_rows + (g0 * 8 + words).expand_dims(0),
            ok.expand_dims(2),
            0,
        );
        let dt = load(d + d_rows + blk.expand_dims(0), ok, 0.0);
        let mut mt = dt;
        if MIN == 1 {
            mt = load(m + d_rows + blk.expand_dims(0), ok, 0.0);
        }
        acc += q8_0_tile::<ACT, MIN>(qt, dt, mt, xq, xd, a, norm_w, blk, blk_ok, w);
    }
    store_rows::<RESIDUAL, HEAD>(
        y,
        logits,
        part_val,
        part_idx,
        row0 + rows,
        row_ok,
        acc.sum(1) * inv_rms,
        b,
        old,
    );
    stamp_now::<STAMPS>(stamps, stamp_at, 2);
}

/// The activation blocks `blk` (valid where `blk_ok`) as a K-quant tile's `dot4`
/// operands, `w = arange(0, 4)`: each block's low-half words (`[blocks, 4]`, word `w`
/// holding elements `4w..4w + 4`), its high-half words (elements `16 + 4w..`) and its
/// scale (`[blocks]`). Read from the quantized input (`ACT = 0`), or normed and
/// quantized here from `a` (`ACT = 1`, the norm inside the GEMV).
#[tile_fn(crate = tilefuse_dsl)]
#[allow(clippy::too_many_arguments)]
fn activation_blocks<const ACT: usize>(
    xq: Ptr<i32>,
    xd: Ptr<f32>,
    a: Ptr<bf16>,
    norm_w: Ptr<bf16>,
    blk: Tile<i32>,
    blk_ok: Tile<bool>,
    w: Tile<i32>,
) -> (Tile<i32>, Tile<i32>, Tile<f32>) {
    let x_offs = (blk * 8).expand_dims(1) + w.expand_dims(0);
    let x_ok = blk_ok.expand_dims(1);
    let mut x_lo = x_offs & 0;
    let mut x_hi = x_offs & 0;
    let mut x_d = (blk & 0) as f32;
    if ACT == 0 {
        x_lo = load(xq + x_offs, x_ok, 0);
        x_hi = load(xq + x_offs + 4, x_ok, 0);
        x_d = load(xd + blk, blk_ok, 0.0);
    } else {
        let e = (x_offs * 4).expand_dims(2) + arange(0, 4);
        let ok3 = x_ok.expand_dims(2);
        let v_lo = normed_input(a, norm_w, e, ok3);
        let v_hi = normed_input(a, norm_w, e + 16, ok3);
        let amax = maximum(abs(v_lo).max(2).max(1), abs(v_hi).max(2).max(1));
        let inv = inv_step(amax).expand_dims(1).expand_dims(2);
        x_lo = pack_words3(v_lo, inv);
        x_hi = pack_words3(v_hi, inv);
        x_d = amax / 127.0;
    }
    (x_lo, x_hi, x_d)
}

/// IQ4_NL's table (`gguf::quant::IQ4_NL_VALUES`, llama.cpp's `kvalues_iq4nl`) at the
/// four 4-bit indices in bits 0-15 of each `sel`, as four signed bytes: entries 0-7 and
/// 8-15 by one `byte_perm` each from the table's four words, then per byte the one that
/// bit 3 of its index picks.
#[tile_fn(crate = tilefuse_dsl)]
fn iq4_values(sel: Tile<u32>) -> Tile<u32> {
    // Weight-shaped constants, folded by the compiler (as `q4_k_tile`'s `ones`).
    let t0 = (sel & 0) | 0xBFAD_9881;
    let t1 = (sel & 0) | 0xF6EA_DDCF;
    let t2 = (sel & 0) | 0x2619_0D01;
    let t3 = (sel & 0) | 0x7159_4535;
    let low = byte_perm(t0, t1, sel);
    let high = byte_perm(t2, t3, sel);
    byte_perm(low, high, 0x3210 | ((sel & 0x8888) >> 1))
}

/// One tile's Q4_K sums per row and block (`[n, blocks]`): `qt: [n, blocks, 4]` nibble
/// words, `sc`, `m: [n, blocks]` sub-block scales and mins, `dd`, `dm: [n, blocks]`
/// their super-blocks' scales, against activation blocks `blk` (valid where `blk_ok`).
/// With a fifth bit a quant (`LAYOUT` 1, Q5_K, or 3, Q5_0), `ht: [n, blocks]` holds each
/// block's fifth bits (bit `i` is element `i`'s); else it is not read. Q4_0 and Q5_0
/// (`LAYOUT` 2 and 3) take `dd` as each block's own scale and read neither `sc`, `m`
/// nor `dm`: `x = d (q - 8)` and `d (q - 16)` (see [`q4_k_gemv`]). IQ4_XS (`LAYOUT`
/// 4): `qt` holds table indices, `x = d (sc - 32) K[q]`, no `m` nor `dm`.
#[tile_fn(crate = tilefuse_dsl)]
#[allow(clippy::too_many_arguments)]
fn q4_k_tile<const ACT: usize, const LAYOUT: usize>(
    qt: Tile<u32>,
    ht: Tile<u32>,
    sc: Tile<u8>,
    m: Tile<u8>,
    dd: Tile<f16>,
    dm: Tile<f16>,
    xq: Ptr<i32>,
    xd: Ptr<f32>,
    a: Ptr<bf16>,
    norm_w: Ptr<bf16>,
    blk: Tile<i32>,
    blk_ok: Tile<bool>,
    w: Tile<i32>,
) -> Tile<f32> {
    // Low nibbles of word w: elements 4w..4w+4 (activation word w); high: 16 + 4w...
    let (x_lo, x_hi, x_d) = activation_blocks::<ACT>(xq, xd, a, norm_w, blk, blk_ok, w);
    let x_lo3 = x_lo.expand_dims(0);
    let x_hi3 = x_hi.expand_dims(0);
    let lo = qt & 0x0F0F_0F0F;
    // The high nibbles in place: 16 times their values, byte by byte, so one mask
    // replaces a shift and a mask a word, and the sum is exactly 16 times theirs.
    let hi16 = qt & 0xF0F0_F0F0;
    let mut dots = dot4(lo, x_lo3, 0).sum(2) + (dot4(hi16, x_hi3, 0).sum(2) >> 4);
    if (LAYOUT == 1) | (LAYOUT == 3) {
        // Word `w`'s four elements' fifth bits (bits `4w..4w + 4` of the block's word,
        // `16 + 4w..` for the high nibbles) to bit 4 of its bytes: the product puts bit
        // `b` at `8b + 4`, and no two partial products meet there.
        let shift = (w * 4) as u32;
        let h = ht.expand_dims(2);
        let lo5 = lo | (((h >> shift) & 15) * 0x0204_0810 & 0x1010_1010);
        let hi5 =
            ((qt >> 4) & 0x0F0F_0F0F) | (((h >> (shift + 16)) & 15) * 0x0204_0810 & 0x1010_1010);
        dots = dot4(lo5, x_lo3, 0).sum(2) + dot4(hi5, x_hi3, 0).sum(2);
    }
    // The block's sum of `x` by `dot4` with ones (a weight-shaped tile, so that it is
    // laid out as `dots`; the compiler folds it to a constant).
    let ones = (qt & 0) | 0x0101_0101;
    let x_sum = dot4(ones, x_hi3, dot4(ones, x_lo3, 0)).sum(2);
    // `dots`-derived operands first: the scales are then loaded in its layout.
    let mut scaled =
        ((dots * (sc as i32)) as f32) * (dd as f32) - ((x_sum * (m as i32)) as f32) * (dm as f32);
    if LAYOUT == 2 {
        // Q4_0: `Σ (q - 8) x`, exact in integers, then the block's scale: the product
        // Q8_0's kernel forms over the bytes `q - 8`, so the two agree bit for bit.
        scaled = ((dots - x_sum * 8) as f32) * (dd as f32);
    } else if LAYOUT == 3 {
        scaled = ((dots - x_sum * 16) as f32) * (dd as f32);
    } else if LAYOUT == 4 {
        // IQ4_XS: the low half of word `w` selects the table values of activation word
        // `w`'s elements, the high half those of word `4 + w` (`gguf::quant`'s
        // `table_nibble_at`); `Σ K[q] x` exact in integers, then `ls - 32`, then `d`.
        let v_lo = iq4_values(qt).bitcast::<i32>();
        let v_hi = iq4_values(qt >> 16).bitcast::<i32>();
        let dots4 = dot4(v_lo, x_lo3, 0).sum(2) + dot4(v_hi, x_hi3, 0).sum(2);
        scaled = ((dots4 * ((sc as i32) - 32)) as f32) * (dd as f32);
    }
    scaled * x_d.expand_dims(0)
}

/// One Q4_K tile's weights for the activation blocks `blk` (`[blocks]`, the tile's
/// first `g0`), loaded where `ok` (`[n, blocks]`): the nibble words (`[n, blocks, 4]`),
/// with a fifth bit (`LAYOUT` 1 or 3) the fifth-bit words (`[n, blocks]`, else zeros,
/// `qh` not read), the sub-block scales and mins, and the super-blocks' `d` and `dmin`
/// (`[n, blocks]`). Q4_0 and Q5_0 (`LAYOUT` 2 and 3) read a scale a block from `d`
/// (`s_rows`' indexing), and neither `scales`, `mins` nor `dmin` (zeros and `d`'s
/// values in their places); IQ4_XS (`LAYOUT` 4) reads no `mins` nor `dmin`.
#[tile_fn(crate = tilefuse_dsl)]
#[allow(clippy::too_many_arguments)]
fn q4_k_weights<const LAYOUT: usize>(
    q: Ptr<u32>,
    qh: Ptr<u32>,
    scales: Ptr<u8>,
    mins: Ptr<u8>,
    d: Ptr<f16>,
    dmin: Ptr<f16>,
    q_rows: Tile<i32>,
    s_rows: Tile<i32>,
    d_rows: Tile<i32>,
    words: Tile<i32>,
    g0: i32,
    blk: Tile<i32>,
    ok: Tile<bool>,
) -> (
    Tile<u32>,
    Tile<u32>,
    Tile<u8>,
    Tile<u8>,
    Tile<f16>,
    Tile<f16>,
) {
    let qt = load(
        q + q_rows + (g0 * 4 + words).expand_dims(0),
        ok.expand_dims(2),
        0,
    );
    let mut ht = (s_rows + blk.expand_dims(0)).bitcast::<u32>() & 0;
    if (LAYOUT == 1) | (LAYOUT == 3) {
        ht = load(qh + s_rows + blk.expand_dims(0), ok, 0);
    }
    let none = (s_rows + blk.expand_dims(0)) & 0;
    let (mut sct, mut mt) = (none as u8, none as u8);
    let (mut dt, mut dmint) = (none as f16, none as f16);
    if (LAYOUT == 2) | (LAYOUT == 3) {
        dt = load(d + s_rows + blk.expand_dims(0), ok, 0.0);
        dmint = dt;
    } else {
        sct = load(scales + s_rows + blk.expand_dims(0), ok, 0);
        if LAYOUT < 2 {
            mt = load(mins + s_rows + blk.expand_dims(0), ok, 0);
        }
        let sb = (blk / 8).expand_dims(0);
        dt = load(d + d_rows + sb, ok, 0.0);
        dmint = dt;
        if LAYOUT < 2 {
            dmint = load(dmin + d_rows + sb, ok, 0.0);
        }
    }
    (qt, ht, sct, mt, dt, dmint)
}

/// A program's Q4_K row sums (`[n]`, before `inv_rms`): the first tile (loaded by the
/// caller, before its wait) and the rest of the row, tile by tile (see [`q4_k_gemv`]).
#[tile_fn(crate = tilefuse_dsl)]
#[allow(clippy::too_many_arguments)]
fn q4_k_row_sums<const BLOCK_K: usize, const ACT: usize, const EVEN: usize, const LAYOUT: usize>(
    q_first: Tile<u32>,
    h_first: Tile<u32>,
    sc_first: Tile<u8>,
    m_first: Tile<u8>,
    d_first: Tile<f16>,
    dmin_first: Tile<f16>,
    q: Ptr<u32>,
    qh: Ptr<u32>,
    scales: Ptr<u8>,
    mins: Ptr<u8>,
    d: Ptr<f16>,
    dmin: Ptr<f16>,
    xq: Ptr<i32>,
    xd: Ptr<f32>,
    a: Ptr<bf16>,
    norm_w: Ptr<bf16>,
    q_rows: Tile<i32>,
    s_rows: Tile<i32>,
    d_rows: Tile<i32>,
    words: Tile<i32>,
    ok2: Tile<bool>,
    blocks: i32,
    grp: Tile<i32>,
    w: Tile<i32>,
) -> Tile<f32> {
    // `EVEN`: every block exists (`k` a multiple of BLOCK_K), and the caller's `ok2` is
    // constant too, so the loads take no masks.
    let mut first_ok = grp < blocks;
    if EVEN == 1 {
        first_ok = full([BLOCK_K / 32], true);
    }
    let mut acc = q4_k_tile::<ACT, LAYOUT>(
        q_first, h_first, sc_first, m_first, d_first, dmin_first, xq, xd, a, norm_w, grp, first_ok,
        w,
    );
    for g0 in (BLOCK_K / 32..blocks).step_by(BLOCK_K / 32) {
        let blk = g0 + grp;
        let mut blk_ok = blk < blocks;
        if EVEN == 1 {
            blk_ok = full([BLOCK_K / 32], true);
        }
        let ok = ok2 & blk_ok.expand_dims(0);
        let (qt, ht, sct, mt, dt, dmint) = q4_k_weights::<LAYOUT>(
            q, qh, scales, mins, d, dmin, q_rows, s_rows, d_rows, words, g0, blk, ok,
        );
        acc += q4_k_tile::<ACT, LAYOUT>(
            qt, ht, sct, mt, dt, dmint, xq, xd, a, norm_w, blk, blk_ok, w,
        );
    }
    acc.sum(1)
}

/// [`q4_k_row_sums`] with the next tile requested before this one is computed (one tile
/// always in flight; the loop unrolled by two so that no copy of a carried tile waits
/// for its load: docs/perf.md, "Prefetching loops unrolled by two"). Past the last tile
/// the loads are masked off.
#[tile_fn(crate = tilefuse_dsl)]
#[allow(clippy::too_many_arguments)]
fn q4_k_row_sums_prefetch<const BLOCK_K: usize, const ACT: usize, const LAYOUT: usize>(
    q_first: Tile<u32>,
    h_first: Tile<u32>,
    sc_first: Tile<u8>,
    m_first: Tile<u8>,
    d_first: Tile<f16>,
    dmin_first: Tile<f16>,
    q: Ptr<u32>,
    qh: Ptr<u32>,
    scales: Ptr<u8>,
    mins: Ptr<u8>,
    d: Ptr<f16>,
    dmin: Ptr<f16>,
    xq: Ptr<i32>,
    xd: Ptr<f32>,
    a: Ptr<bf16>,
    norm_w: Ptr<bf16>,
    q_rows: Tile<i32>,
    s_rows: Tile<i32>,
    d_rows: Tile<i32>,
    words: Tile<i32>,
    ok2: Tile<bool>,
    blocks: i32,
    grp: Tile<i32>,
    w: Tile<i32>,
) -> Tile<f32> {
    let step = (BLOCK_K / 32) as i32;
    let blk = step + grp;
    let ok = ok2 & (blk < blocks).expand_dims(0);
    let (mut qt, mut ht, mut sct, mut mt, mut dt, mut dmint) = q4_k_weights::<LAYOUT>(
        q, qh, scales, mins, d, dmin, q_rows, s_rows, d_rows, words, step, blk, ok,
    );
    let mut acc = q4_k_tile::<ACT, LAYOUT>(
        q_first,
        h_first,
        sc_first,
        m_first,
        d_first,
        dmin_first,
        xq,
        xd,
        a,
        norm_w,
        grp,
        grp < blocks,
        w,
    );
    for g0 in (2 * step..blocks + step).step_by(BLOCK_K / 32).unroll(2) {
        let next = g0 + grp;
        let ok = ok2 & (next < blocks).expand_dims(0);
        let (nq, nh, nsc, nm, nd, ndmin) = q4_k_weights::<LAYOUT>(
            q, qh, scales, mins, d, dmin, q_rows, s_rows, d_rows, words, g0, next, ok,
        );
        let blk = g0 - step + grp;
        acc += q4_k_tile::<ACT, LAYOUT>(
            qt,
            ht,
            sct,
            mt,
            dt,
            dmint,
            xq,
            xd,
            a,
            norm_w,
            blk,
            blk < blocks,
            w,
        );
        (qt, ht, sct, mt, dt, dmint) = (nq, nh, nsc, nm, nd, ndmin);
    }
    acc.sum(1)
}

/// `y = bf16(W · x + bias)` for a Q4_K matrix `W` of shape `[n, k]` with
/// `k = 8 * k_words` (`q: u32[n, k_words]`, `scales`, `mins: u8[n, k / 32]`, `d`,
/// `dmin: f16[n, k / 256]`) and `x` quantized by [`quantize_act`]; the residual and
/// LM-head variants as in the module docs. `LAYOUT = 1` reads a Q5_K matrix: the same
/// arrays and its fifth bits, `qh: u32[n, k / 32]` (not read otherwise). `LAYOUT` 2 and
/// 3 read Q4_0 and Q5_0 matrices in the same nibble words (and fifth bits), with one
/// scale a 32-element block, `d: f16[n, k / 32]`, and no `scales`, `mins` or `dmin`
/// (not read): the file's 18 and 22 bytes a block (docs/perf.md, "Q4_0 and Q5_0 in
/// nibble words"). `LAYOUT = 4` reads an IQ4_XS matrix: `q` holds table indices
/// (`gguf::quant::table_nibble_at`), `scales` each block's `ls` (`x = d (ls - 32)
/// K[q]`), and `mins` and `dmin` are not read: 138 bytes a super-block (the file's
/// 136).
#[kernel(
    crate = tilefuse_dsl,
    BLOCK_N = [1, 2, 4, 8, 16, 32, 64],
    BLOCK_K = [256, 512, 1024, 2048],
    num_warps = [4, 8],
    RESIDUAL = [0, 1],
    HEAD = [0, 1],
    ACT = [0, 1],
    skip(HEAD = 1, RESIDUAL = 1),
    // The norm prologue is for the QKV and gate/up projections (no residual, no head).
    skip(ACT = 1, HEAD = 1),
    skip(ACT = 1, RESIDUAL = 1),
    // Long tiles are for wide matrices (few rows), many rows for tall ones.
    skip(BLOCK_K = 2048, BLOCK_N = [8, 16, 32, 64]),
    skip(BLOCK_K = 1024, BLOCK_N = 32),
    skip(BLOCK_K = 2048, HEAD = 1),
    // The tall matrices' tile (8B gate+up) at 80 registers instead of 107: six programs
    // an SM instead of four, 80% -> 85% of the copy ceiling on an H200 (docs/perf.md,
    // "A register cap on the Q4_K GEMV"); the tiles that keep a tile in flight lose.
    // Q4_K only: Q5_K's timeline-stamped variant spilled at 80 (tests/ptxas_all.rs).
    max_registers(80, BLOCK_N = 16, BLOCK_K = 1024, RESIDUAL = 0, HEAD = 0, ACT = 0, LAYOUT = 0, num_warps = 4),
    // The wide matrices' tile (8B down) at 64 registers instead of 72: eight programs
    // an SM, so the 1024 programs of 4096 rows run in one wave of 132 SMs, not two
    // (docs/perf.md, "Register limits by tile").
    max_registers(64, BLOCK_N = 4, BLOCK_K = 2048, HEAD = 0, ACT = 0, num_warps = 4),
    // 1: every row exists and `k` is a multiple of BLOCK_K, so no load needs a mask
    // (Triton's EVEN_K): no zeroed destinations, no predicates, about a fifth fewer
    // instructions a loop trip (docs/perf.md, "Loads without masks"). For the step's
    // 4- and 8-row tiles only: the unmasked 16 x 1024 / 4-warp tile (8B gate+up) ran
    // 35% slower on an H200, for a reason not found.
    EVEN = [0, 1],
    skip(EVEN = 1, HEAD = 1),
    skip(EVEN = 1, ACT = 1),
    skip(EVEN = 1, BLOCK_N = [1, 2, 16, 32, 64]),
    skip(EVEN = 1, BLOCK_K = [256, 512]),
    // 1: the normed gate/up GEMV that writes down's int8 input (see the module docs):
    // 32 gate and the same 32 up rows a program, the input quantized inside (`ACT = 1`)
    // or before (`ACT = 0`, into `xq` and `xd` while down's goes to `out_q`, `out_d`).
    SILU_Q = [0, 1],
    skip(SILU_Q = 0, BLOCK_N = 64),
    skip(SILU_Q = 1, BLOCK_N = [1, 2, 4, 8, 16, 32]),
    skip(SILU_Q = 1, BLOCK_K = [256, 2048]),
    skip(SILU_Q = 1, HEAD = 1),
    skip(SILU_Q = 1, RESIDUAL = 1),
    // 248 registers and a spill at 4 warps (tests/ptxas_all.rs): 1024 columns take 8.
    skip(SILU_Q = 1, BLOCK_K = 1024, num_warps = 4),
    // The weights' format: 0 Q4_K, 1 Q5_K (the fifth bits from `qh`), 2 Q4_0, 3 Q5_0
    // (a scale a block in `d`; no scales, mins or `dmin`), 4 IQ4_XS (table indices; no
    // mins or `dmin`). Files of the others are fewer than Q4_K_M ones: the tiles the
    // step picks, and the `[gate; up]` SILU_Q variant for Q4_0 and IQ4_XS (whole files
    // of them) only.
    LAYOUT = [0, 1, 2, 3, 4],
    skip(LAYOUT = [1, 3], SILU_Q = 1),
    skip(LAYOUT = [1, 2, 3, 4], BLOCK_N = [1, 2, 32]),
    skip(LAYOUT = [1, 2, 3, 4], BLOCK_K = 256),
    // 1: the timeline stamps (`crate::kernels::stamp_now`), 0: none compiled.
    STAMPS = [0, 1]
)]
pub fn q4_k_gemv<
    const BLOCK_N: usize,
    const BLOCK_K: usize,
    const RESIDUAL: usize,
    const HEAD: usize,
    const ACT: usize,
    const EVEN: usize,
    const SILU_Q: usize,
    const LAYOUT: usize,
    const STAMPS: usize,
>(
    q: Ptr<u32>,
    qh: Ptr<u32>,
    scales: Ptr<u8>,
    mins: Ptr<u8>,
    d: Ptr<f16>,
    dmin: Ptr<f16>,
    xq: Ptr<i32>,
    xd: Ptr<f32>,
    out_q: Ptr<i32>,
    out_d: Ptr<f32>,
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
    stamps: Ptr<i64>,
    stamp_at: i32,
) {
    let blocks = k_words / 4;
    let r = arange(0, BLOCK_N);
    let mut rows = program_id(0) * BLOCK_N + r;
    let mut row_ok = rows < n;
    if SILU_Q == 1 {
        // `[gate; up]`: gate rows `j` and up rows `n / 2 + j` of one block of 32 `j`.
        let j = program_id(0) * 32 + r % 32;
        rows = j + (r / 32) * (n / 2);
        row_ok = j < n / 2;
    }
    let grp = arange(0, BLOCK_K / 32);
    let w = arange(0, 4);
    let q_rows = (rows * k_words).expand_dims(1).expand_dims(2);
    let s_rows = (rows * blocks).expand_dims(1);
    let d_rows = (rows * (blocks / 8)).expand_dims(1);
    let words = (grp * 4).expand_dims(1) + w.expand_dims(0);
    let mut ok2 = row_ok.expand_dims(1);
    let mut grp_ok = grp < blocks;
    if EVEN == 1 {
        // Constant masks: the compiler emits these loads unmasked.
        ok2 = full([BLOCK_N, 1], true);
        grp_ok = full([BLOCK_K / 32], true);
    }

    let ok = ok2 & grp_ok.expand_dims(0);
    let (q_first, h_first, sc_first, m_first, d_first, dmin_first) = q4_k_weights::<LAYOUT>(
        q, qh, scales, mins, d, dmin, q_rows, s_rows, d_rows, words, 0, grp, ok,
    );
    let mut b = zeros::<f32>([BLOCK_N]);
    if HEAD == 0 {
        b = load(bias + row0 + rows, row_ok, 0.0) as f32;
    }
    stamp_now::<STAMPS>(stamps, stamp_at, 0);
    wait_for_prior_kernels();
    stamp_now::<STAMPS>(stamps, stamp_at, 1);
    // With the norm prologue, `inv_rms` scales the row sums (as in `rms_norm_gemv`).
    let mut inv_rms = 1.0;
    if ACT == 1 {
        inv_rms = inv_rms_of::<1024>(a, k_words * 8, eps);
    }
    let mut old = zeros::<f32>([BLOCK_N]);
    if RESIDUAL == 1 {
        old = load(y + row0 + rows, row_ok, 0.0) as f32;
    }
    // The 16-row residual tiles (the 4096-row O and down matrices of an 8B model)
    // keep a tile in flight (docs/perf.md, "Prefetching loops unrolled by two").
    let mut sums = zeros::<f32>([BLOCK_N]);
    if (RESIDUAL == 1) & (BLOCK_N == 16) {
        sums = q4_k_row_sums_prefetch::<BLOCK_K, ACT, LAYOUT>(
            q_first, h_first, sc_first, m_first, d_first, dmin_first, q, qh, scales, mins, d, dmin,
            xq, xd, a, norm_w, q_rows, s_rows, d_rows, words, ok2, blocks, grp, w,
        );
    } else {
        sums = q4_k_row_sums::<BLOCK_K, ACT, EVEN, LAYOUT>(
            q_first, h_first, sc_first, m_first, d_first, dmin_first, q, qh, scales, mins, d, dmin,
            xq, xd, a, norm_w, q_rows, s_rows, d_rows, words, ok2, blocks, grp, w,
        );
    }
    if SILU_Q == 1 {
        // The projection rounded as `store_rows` stores it, then `silu(gate) * up` of
        // the block rounded and quantized as `quantize_act` `MODE = 2` would.
        let proj = ((sums * inv_rms + b) as bf16 as f32).reshape([2, 32]);
        let part = arange(0, 2).expand_dims(1);
        let g = select(part == 0, proj, 0.0).sum(0);
        let u = select(part == 1, proj, 0.0).sum(0);
        let x = ((g / (1.0 + exp(-g))) as bf16 as f32 * u) as bf16 as f32;
        let blk = program_id(0) + arange(0, 1);
        store_blocks(x.reshape([1, 2, 4, 4]), blk, blk * 32 < n / 2, out_q, out_d);
    } else {
        store_rows::<RESIDUAL, HEAD>(
            y,
            logits,
            part_val,
            part_idx,
            row0 + rows,
            row_ok,
            sums * inv_rms,
            b,
            old,
        );
    }
    stamp_now::<STAMPS>(stamps, stamp_at, 2);
}

/// Each of a block's four low-nibble words' high-bits word (`[n, blocks, 4]`) from the
/// block's two `qh` words read as one 64-bit load (`h: [n, blocks]`): words `0` and `1`
/// share the low half, `2` and `3` the high half (little-endian). One load where a
/// `[n, blocks, 4]` tile of the 32-bit words loads each word twice; carried through a
/// prefetching loop as the 64-bit tile, so that its loads follow the layout of the tile
/// it meets here; `w = arange(0, 4)`.
#[tile_fn(crate = tilefuse_dsl)]
fn q6_k_high(h: Tile<i64>, w: Tile<i32>) -> Tile<u32> {
    (h.expand_dims(2) >> ((w / 2) * 32) as i64) as u32
}

/// One tile's Q6_K sums per row and block (`[n, blocks]`), with each thread holding a
/// block's four low-nibble words of a row (`lt: [n, blocks, 4]`, one 16-byte load)
/// and the block's two high-bits words as one (`h: [n, blocks]`, [`q6_k_high`]: low-nibble
/// words `2p` and `2p + 1` share `qh` word `p`); `sc0`, `sc1: [n, blocks]` the halves' scales (sign bit
/// flipped), `dd: [n, blocks]` their super-blocks' scales, against activation blocks
/// `blk` (valid where `blk_ok`); `w = arange(0, 4)`.
///
/// `LAYOUT = 1` reads Q3_K's words instead (see [`q6_k_gemv`]): `lt` holds the block's
/// two 2-bit words, its high-bit word and its scales (not read here; `h` is not read);
/// each byte lane is then a 3-bit `q + 4`, and the offset is 4 instead of 32.
#[tile_fn(crate = tilefuse_dsl)]
#[allow(clippy::too_many_arguments)]
fn q6_k_tile<const ACT: usize, const LAYOUT: usize>(
    lt: Tile<u32>,
    h: Tile<i64>,
    sc0: Tile<u8>,
    sc1: Tile<u8>,
    dd: Tile<f16>,
    xq: Ptr<i32>,
    xd: Ptr<f32>,
    a: Ptr<bf16>,
    norm_w: Ptr<bf16>,
    blk: Tile<i32>,
    blk_ok: Tile<bool>,
    w: Tile<i32>,
) -> Tile<f32> {
    let (x_lo, x_hi, x_d) = activation_blocks::<ACT>(xq, xd, a, norm_w, blk, blk_ok, w);
    // Word w's high bits: at bit 4 (w % 2) (low nibbles) and 4 (w % 2) + 2 (high) of
    // each byte of its `qh` word, moved to bit 4.
    let t = q6_k_high(h, w) << (4 - (w % 2) * 4) as u32;
    let mut lo = (lt & 0x0F0F_0F0F) | (t & 0x3030_3030);
    let mut hi = ((lt >> 4) & 0x0F0F_0F0F) | ((t >> 2) & 0x3030_3030);
    let mut offset = 32;
    if LAYOUT == 1 {
        // Q3_K: activation word `w`'s 2-bit quants are field `w` of each byte of the
        // block's first word (`w + 4`'s of the second), and its high bits are bit `w`
        // (`w + 4`) of each byte of the third, moved to bit 2. The words are a thread's
        // own (one 16-byte load), so picking one is no exchange.
        let c0 = select(w == 0, lt, 0).sum(2).expand_dims(2);
        let c1 = select(w == 1, lt, 0).sum(2).expand_dims(2);
        let high = select(w == 2, lt, 0).sum(2).expand_dims(2);
        let shift = (w * 2) as u32;
        lo = ((c0 >> shift) & 0x0303_0303) | (((high << 2) >> w as u32) & 0x0404_0404);
        hi = ((c1 >> shift) & 0x0303_0303) | ((high >> (w + 2) as u32) & 0x0404_0404);
        offset = 4;
    }
    let dot_lo = dot4(lo, x_lo.expand_dims(0), 0).sum(2);
    let dot_hi = dot4(hi, x_hi.expand_dims(0), 0).sum(2);
    // The halves' sums of `x` (the -32 offset of the 6-bit values), once per block
    // rather than per row.
    let ones = (x_lo & 0) | 0x0101_0101;
    let s_lo = dot4(ones, x_lo, 0).sum(1).expand_dims(0);
    let s_hi = dot4(ones, x_hi, 0).sum(1).expand_dims(0);
    let isum = (dot_lo - s_lo * offset) * (sc0 as i32 - 128)
        + (dot_hi - s_hi * offset) * (sc1 as i32 - 128);
    (isum as f32) * (dd as f32) * x_d.expand_dims(0)
}

/// One Q6_K tile's weights for the activation blocks `blk` (`[blocks]`, the tile's
/// first `g0`), loaded where `ok` (`[n, blocks]`): the low-nibble words
/// (`[n, blocks, 4]`), each block's two high-bits words as one (`[n, blocks]`), the
/// halves' scales (sign bit flipped; 128, a zero scale, where masked) and the
/// super-blocks' `d` (`[n, blocks]`). `LAYOUT = 1` (Q3_K) loads each block's four
/// words from `ql` as Q6_K's low nibbles, takes the scales from the fourth (zero-filled
/// where masked, a zero scale) and reads neither `qh` (zeros) nor `scales`.
#[tile_fn(crate = tilefuse_dsl)]
#[allow(clippy::too_many_arguments)]
fn q6_k_weights<const LAYOUT: usize>(
    ql: Ptr<u32>,
    qh: Ptr<i64>,
    scales: Ptr<u8>,
    d: Ptr<f16>,
    l_rows: Tile<i32>,
    h_rows: Tile<i32>,
    s_rows: Tile<i32>,
    d_rows: Tile<i32>,
    l_words: Tile<i32>,
    g0: i32,
    blk: Tile<i32>,
    ok: Tile<bool>,
) -> (Tile<u32>, Tile<i64>, Tile<u8>, Tile<u8>, Tile<f16>) {
    let lt = load(
        ql + l_rows + (g0 * 4 + l_words).expand_dims(0),
        ok.expand_dims(2),
        0,
    );
    let mut ht = (h_rows + blk.expand_dims(0)) as i64 & 0;
    let mut sc0 = (ht & 0) as u8;
    let mut sc1 = sc0;
    if LAYOUT == 0 {
        ht = load(qh + h_rows + blk.expand_dims(0), ok, 0);
        sc0 = load(scales + s_rows + (blk * 2).expand_dims(0), ok, 128);
        sc1 = load(scales + s_rows + (blk * 2 + 1).expand_dims(0), ok, 128);
    } else {
        // The `i8` scales in bytes 0 and 1 of word 3, their sign bits flipped here.
        let s = select((l_words & 3).expand_dims(0) == 3, lt, 0).sum(2);
        sc0 = ((s & 255) ^ 128) as u8;
        sc1 = (((s >> 8) & 255) ^ 128) as u8;
    }
    let dt = load(d + d_rows + (blk / 8).expand_dims(0), ok, 0.0);
    (lt, ht, sc0, sc1, dt)
}

/// A program's Q6_K row sums (`[n]`, before `inv_rms`): the first tile (loaded by the
/// caller, before its wait) and the rest of the row, tile by tile (see [`q6_k_gemv`]).
#[tile_fn(crate = tilefuse_dsl)]
#[allow(clippy::too_many_arguments)]
fn q6_k_row_sums<const BLOCK_K: usize, const ACT: usize, const LAYOUT: usize>(
    l_first: Tile<u32>,
    h_first: Tile<i64>,
    sc0_first: Tile<u8>,
    sc1_first: Tile<u8>,
    d_first: Tile<f16>,
    ql: Ptr<u32>,
    qh: Ptr<i64>,
    scales: Ptr<u8>,
    d: Ptr<f16>,
    xq: Ptr<i32>,
    xd: Ptr<f32>,
    a: Ptr<bf16>,
    norm_w: Ptr<bf16>,
    l_rows: Tile<i32>,
    h_rows: Tile<i32>,
    s_rows: Tile<i32>,
    d_rows: Tile<i32>,
    l_words: Tile<i32>,
    ok2: Tile<bool>,
    blocks: i32,
    grp: Tile<i32>,
    w: Tile<i32>,
) -> Tile<f32> {
    let mut acc = q6_k_tile::<ACT, LAYOUT>(
        l_first,
        h_first,
        sc0_first,
        sc1_first,
        d_first,
        xq,
        xd,
        a,
        norm_w,
        grp,
        grp < blocks,
        w,
    );
    for g0 in (BLOCK_K / 32..blocks).step_by(BLOCK_K / 32) {
        let blk = g0 + grp;
        let blk_ok = blk < blocks;
        let ok = ok2 & blk_ok.expand_dims(0);
        let (lt, ht, sc0, sc1, dt) = q6_k_weights::<LAYOUT>(
            ql, qh, scales, d, l_rows, h_rows, s_rows, d_rows, l_words, g0, blk, ok,
        );
        acc += q6_k_tile::<ACT, LAYOUT>(lt, ht, sc0, sc1, dt, xq, xd, a, norm_w, blk, blk_ok, w);
    }
    acc.sum(1)
}

/// [`q6_k_row_sums`] with the next tile in flight, as [`q4_k_row_sums_prefetch`].
#[tile_fn(crate = tilefuse_dsl)]
#[allow(clippy::too_many_arguments)]
fn q6_k_row_sums_prefetch<const BLOCK_K: usize, const ACT: usize, const LAYOUT: usize>(
    l_first: Tile<u32>,
    h_first: Tile<i64>,
    sc0_first: Tile<u8>,
    sc1_first: Tile<u8>,
    d_first: Tile<f16>,
    ql: Ptr<u32>,
    qh: Ptr<i64>,
    scales: Ptr<u8>,
    d: Ptr<f16>,
    xq: Ptr<i32>,
    xd: Ptr<f32>,
    a: Ptr<bf16>,
    norm_w: Ptr<bf16>,
    l_rows: Tile<i32>,
    h_rows: Tile<i32>,
    s_rows: Tile<i32>,
    d_rows: Tile<i32>,
    l_words: Tile<i32>,
    ok2: Tile<bool>,
    blocks: i32,
    grp: Tile<i32>,
    w: Tile<i32>,
) -> Tile<f32> {
    let step = (BLOCK_K / 32) as i32;
    let blk = step + grp;
    let ok = ok2 & (blk < blocks).expand_dims(0);
    let (mut lt, mut ht, mut sc0, mut sc1, mut dt) = q6_k_weights::<LAYOUT>(
        ql, qh, scales, d, l_rows, h_rows, s_rows, d_rows, l_words, step, blk, ok,
    );
    let mut acc = q6_k_tile::<ACT, LAYOUT>(
        l_first,
        h_first,
        sc0_first,
        sc1_first,
        d_first,
        xq,
        xd,
        a,
        norm_w,
        grp,
        grp < blocks,
        w,
    );
    for g0 in (2 * step..blocks + step).step_by(BLOCK_K / 32).unroll(2) {
        let next = g0 + grp;
        let ok = ok2 & (next < blocks).expand_dims(0);
        let (nl, nh, nsc0, nsc1, nd) = q6_k_weights::<LAYOUT>(
            ql, qh, scales, d, l_rows, h_rows, s_rows, d_rows, l_words, g0, next, ok,
        );
        let blk = g0 - step + grp;
        acc += q6_k_tile::<ACT, LAYOUT>(
            lt,
            ht,
            sc0,
            sc1,
            dt,
            xq,
            xd,
            a,
            norm_w,
            blk,
            blk < blocks,
            w,
        );
        (lt, ht, sc0, sc1, dt) = (nl, nh, nsc0, nsc1, nd);
    }
    acc.sum(1)
}

/// `y = bf16(W · x + bias)` for a Q6_K matrix `W` of shape `[n, k]` with
/// `k = 8 * k_words` (`ql: u32[n, k_words]`; `qh: u32[n, k_words / 2]`, read as
/// `i64[n, k_words / 4]`, a block's two words as one,
/// `scales: u8[n, k / 16]`, `d: f16[n, k / 256]`) and `x` quantized by
/// [`quantize_act`]; the residual and LM-head variants as in the module docs.
///
/// `LAYOUT = 1` reads a Q3_K matrix at 130 bytes a 256-element super-block (the file's
/// 110): `ql: u32[n, k_words]`, four words a 32-element block: two of 2-bit fields
/// (word `c` byte `b` field `j`: the low bits of element `16 c + 4 j + b`), one of high
/// bits (byte `b`'s bit `i`: element `4 i + b`'s, set where the quant keeps its 4), one
/// with the halves' `i8` scales in bytes 0 and 1; `d` as Q6_K's; `qh` and `scales` are
/// not read; `x = d · sc · (q - 4)` with `q` in `0..8` (docs/perf.md, "Q3_K at 130
/// bytes a super-block").
#[kernel(
    crate = tilefuse_dsl,
    BLOCK_N = [1, 2, 4, 8, 16, 32],
    BLOCK_K = [256, 512, 1024, 2048],
    num_warps = [4, 8],
    RESIDUAL = [0, 1],
    HEAD = [0, 1],
    ACT = [0, 1],
    skip(HEAD = 1, RESIDUAL = 1),
    // The norm prologue is for the QKV and gate/up projections (no residual, no head).
    skip(ACT = 1, HEAD = 1),
    skip(ACT = 1, RESIDUAL = 1),
    // Long tiles are for wide matrices (few rows), many rows for tall ones.
    skip(BLOCK_K = 2048, BLOCK_N = [8, 16, 32]),
    skip(BLOCK_K = 1024, BLOCK_N = 32),
    skip(BLOCK_K = 2048, HEAD = 1),
    // The weights' format: 0 Q6_K, 1 Q3_K (Q3_K_M's q, k, gate and up): the step's
    // tiles.
    LAYOUT = [0, 1],
    skip(LAYOUT = 1, BLOCK_N = [1, 2, 32]),
    skip(LAYOUT = 1, BLOCK_K = 256),
    // 1: the timeline stamps (`crate::kernels::stamp_now`), 0: none compiled.
    STAMPS = [0, 1]
)]
pub fn q6_k_gemv<
    const BLOCK_N: usize,
    const BLOCK_K: usize,
    const RESIDUAL: usize,
    const HEAD: usize,
    const ACT: usize,
    const LAYOUT: usize,
    const STAMPS: usize,
>(
    ql: Ptr<u32>,
    qh: Ptr<i64>,
    scales: Ptr<u8>,
    d: Ptr<f16>,
    xq: Ptr<i32>,
    xd: Ptr<f32>,
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
    stamps: Ptr<i64>,
    stamp_at: i32,
) {
    let blocks = k_words / 4;
    let rows = program_id(0) * BLOCK_N + arange(0, BLOCK_N);
    let row_ok = rows < n;
    let grp = arange(0, BLOCK_K / 32);
    // A block's four low-nibble words of a row in one thread (`q6_k_tile`).
    let w = arange(0, 4);
    let l_rows = (rows * k_words).expand_dims(1).expand_dims(2);
    let h_rows = (rows * blocks).expand_dims(1);
    let s_rows = (rows * (2 * blocks)).expand_dims(1);
    let d_rows = (rows * (blocks / 8)).expand_dims(1);
    let l_words = (grp * 4).expand_dims(1) + w.expand_dims(0);
    let ok2 = row_ok.expand_dims(1);

    let ok = ok2 & (grp < blocks).expand_dims(0);
    let (l_first, h_first, sc0_first, sc1_first, d_first) = q6_k_weights::<LAYOUT>(
        ql, qh, scales, d, l_rows, h_rows, s_rows, d_rows, l_words, 0, grp, ok,
    );
    let mut b = zeros::<f32>([BLOCK_N]);
    if HEAD == 0 {
        b = load(bias + row0 + rows, row_ok, 0.0) as f32;
    }
    stamp_now::<STAMPS>(stamps, stamp_at, 0);
    wait_for_prior_kernels();
    stamp_now::<STAMPS>(stamps, stamp_at, 1);
    // With the norm prologue, `inv_rms` scales the row sums (as in `rms_norm_gemv`).
    let mut inv_rms = 1.0;
    if ACT == 1 {
        inv_rms = inv_rms_of::<1024>(a, k_words * 8, eps);
    }
    let mut old = zeros::<f32>([BLOCK_N]);
    if RESIDUAL == 1 {
        old = load(y + row0 + rows, row_ok, 0.0) as f32;
    }
    // As in `q4_k_gemv`: the 16-row residual tiles keep a tile in flight.
    let mut sums = zeros::<f32>([BLOCK_N]);
    if (RESIDUAL == 1) & (BLOCK_N == 16) {
        sums = q6_k_row_sums_prefetch::<BLOCK_K, ACT, LAYOUT>(
            l_first, h_first, sc0_first, sc1_first, d_first, ql, qh, scales, d, xq, xd, a, norm_w,
            l_rows, h_rows, s_rows, d_rows, l_words, ok2, blocks, grp, w,
        );
    } else {
        sums = q6_k_row_sums::<BLOCK_K, ACT, LAYOUT>(
            l_first, h_first, sc0_first, sc1_first, d_first, ql, qh, scales, d, xq, xd, a, norm_w,
            l_rows, h_rows, s_rows, d_rows, l_words, ok2, blocks, grp, w,
        );
    }
    store_rows::<RESIDUAL, HEAD>(
        y,
        logits,
        part_val,
        part_idx,
        row0 + rows,
        row_ok,
        sums * inv_rms,
        b,
        old,
    );
    stamp_now::<STAMPS>(stamps, stamp_at, 2);
}

/// Two runs of rows of one matrix in one launch: a run the Q4_K kernel reads (Q4_K,
/// or Q5_K with `LAYOUT = 1`) and one the Q6_K kernel reads (Q6_K, or Q3_K with
/// `LAYOUT6 = 1`). Q4_K_M's QKV on the layers where `v` takes more bits is `[q; k]`
/// Q4_K then a Q6_K `v` (Q5_K_M's the same with Q5_K); Q3_K_M's is `[q; k]` Q3_K then
/// a Q4_K or Q5_K `v`, the Q6_K kernel's run first (`SIX_FIRST = 1`).
///
/// Programs `0..first_programs` take the first run's rows, the rest the second's,
/// each as [`q4_k_gemv`] (`n4` rows in tiles of `BLOCK_N` rows and `BLOCK_K` columns)
/// or [`q6_k_gemv`] (`n6` rows in tiles of `BLOCK_N6` by `BLOCK_K6`) would; the second
/// run's rows are written after the first's in `y` (and read so from `bias`). Both
/// runs have the columns of `k_words` (`k / 8`) and the launch's warps. Each program
/// requests its own run's first tile before `wait_for_prior_kernels()` (the other's
/// loads masked off), then branches; `ACT` as in the module docs (no residual, no LM
/// head: this is the QKV projection). One launch instead of two.
#[kernel(
    crate = tilefuse_dsl,
    BLOCK_N = [8, 16],
    BLOCK_K = [512, 1024],
    num_warps = [4, 8],
    // The Q6_K run's tile: the Q4_K run's, or for a `v` run over an input quantized
    // before the launch (Qwen3-8B's QKV), 2 or 4 rows of 2048 columns beside 8 rows
    // of 1024, the tiles that run fastest alone in the step (docs/perf.md, "The quantized
    // layer's timeline" and "Q4_K and Q6_K runs in one launch").
    BLOCK_N6 = [2, 4, 8, 16],
    BLOCK_K6 = [512, 1024, 2048],
    skip(BLOCK_N = 8, BLOCK_N6 = 16),
    skip(BLOCK_N = 16, BLOCK_N6 = [2, 4, 8]),
    skip(BLOCK_N6 = [8, 16], BLOCK_K6 = 2048),
    skip(BLOCK_N6 = [2, 4], BLOCK_K6 = [512, 1024]),
    skip(BLOCK_K = 512, BLOCK_K6 = [1024, 2048]),
    skip(BLOCK_K = 1024, BLOCK_K6 = 512),
    skip(BLOCK_K6 = 2048, ACT = 1),
    ACT = [0, 1],
    // The first run's layout: 0 Q4_K, 1 Q5_K (`qh5` its fifth bits).
    LAYOUT = [0, 1],
    // The second run's: 0 Q6_K, 1 Q3_K.
    LAYOUT6 = [0, 1],
    // 1: the Q6_K kernel's run first (Q3_K's `[q; k]`), both runs at one tile.
    SIX_FIRST = [0, 1],
    skip(SIX_FIRST = 0, LAYOUT6 = 1),
    skip(SIX_FIRST = 1, LAYOUT6 = 0),
    skip(SIX_FIRST = 1, BLOCK_N6 = [2, 4]),
    // 1: the timeline stamps (`crate::kernels::stamp_now`), 0: none compiled.
    STAMPS = [0, 1]
)]
#[allow(clippy::too_many_arguments)]
pub fn q4_k_q6_k_gemv<
    const BLOCK_N: usize,
    const BLOCK_K: usize,
    const BLOCK_N6: usize,
    const BLOCK_K6: usize,
    const ACT: usize,
    const LAYOUT: usize,
    const LAYOUT6: usize,
    const SIX_FIRST: usize,
    const STAMPS: usize,
>(
    q: Ptr<u32>,
    qh5: Ptr<u32>,
    scales: Ptr<u8>,
    mins: Ptr<u8>,
    d: Ptr<f16>,
    dmin: Ptr<f16>,
    ql: Ptr<u32>,
    qh: Ptr<i64>,
    scales6: Ptr<u8>,
    d6: Ptr<f16>,
    xq: Ptr<i32>,
    xd: Ptr<f32>,
    a: Ptr<bf16>,
    norm_w: Ptr<bf16>,
    bias: Ptr<bf16>,
    y: Ptr<bf16>,
    n4: i32,
    n6: i32,
    first_programs: i32,
    #[multiple_of(32)] k_words: i32,
    eps: f32,
    stamps: Ptr<i64>,
    stamp_at: i32,
) {
    let blocks = k_words / 4;
    let pid = program_id(0);
    // Each run's program index, and where its rows go in `bias` and `y`.
    let mut six = pid >= first_programs;
    let (mut p4, mut p6) = (pid, pid - first_programs);
    let (mut bias4, mut bias6, mut y4, mut y6) = (bias, bias + n4, y, y + n4);
    if SIX_FIRST == 1 {
        six = pid < first_programs;
        p4 = pid - first_programs;
        p6 = pid;
        bias4 = bias + n6;
        bias6 = bias;
        y4 = y + n6;
        y6 = y;
    }
    // Each run's rows, masked off in the other run's programs.
    let rows = p4 * BLOCK_N + arange(0, BLOCK_N);
    let row_ok = (rows < n4) & !six;
    let rows6 = p6 * BLOCK_N6 + arange(0, BLOCK_N6);
    let row6_ok = (rows6 < n6) & six;

    // Q4_K's first tile (as in `q4_k_gemv`), loaded by its own programs only.
    let grp = arange(0, BLOCK_K / 32);
    let ok2 = row_ok.expand_dims(1);
    let ok4 = ok2 & (grp < blocks).expand_dims(0);
    let w = arange(0, 4);
    let q_rows = (rows * k_words).expand_dims(1).expand_dims(2);
    let s_rows = (rows * blocks).expand_dims(1);
    let d_rows = (rows * (blocks / 8)).expand_dims(1);
    let words = (grp * 4).expand_dims(1) + w.expand_dims(0);
    let (q_first, h_first, sc_first, m_first, d_first, dmin_first) = q4_k_weights::<LAYOUT>(
        q, qh5, scales, mins, d, dmin, q_rows, s_rows, d_rows, words, 0, grp, ok4,
    );

    // Q6_K's (as in `q6_k_gemv`).
    let grp6 = arange(0, BLOCK_K6 / 32);
    let ok2_6 = row6_ok.expand_dims(1);
    let ok6 = ok2_6 & (grp6 < blocks).expand_dims(0);
    let l_rows = (rows6 * k_words).expand_dims(1).expand_dims(2);
    let h_rows = (rows6 * blocks).expand_dims(1);
    let s6_rows = (rows6 * (2 * blocks)).expand_dims(1);
    let d6_rows = (rows6 * (blocks / 8)).expand_dims(1);
    let l_words = (grp6 * 4).expand_dims(1) + w.expand_dims(0);
    let (l_first, h6_first, sc0_first, sc1_first, d6_first) = q6_k_weights::<LAYOUT6>(
        ql, qh, scales6, d6, l_rows, h_rows, s6_rows, d6_rows, l_words, 0, grp6, ok6,
    );
    let b = load(bias4 + rows, row_ok, 0.0) as f32;
    let b6 = load(bias6 + rows6, row6_ok, 0.0) as f32;
    stamp_now::<STAMPS>(stamps, stamp_at, 0);
    wait_for_prior_kernels();
    stamp_now::<STAMPS>(stamps, stamp_at, 1);
    let mut inv_rms = 1.0;
    if ACT == 1 {
        inv_rms = inv_rms_of::<1024>(a, k_words * 8, eps);
    }
    if six {
        let sums = q6_k_row_sums::<BLOCK_K6, ACT, LAYOUT6>(
            l_first, h6_first, sc0_first, sc1_first, d6_first, ql, qh, scales6, d6, xq, xd, a,
            norm_w, l_rows, h_rows, s6_rows, d6_rows, l_words, ok2_6, blocks, grp6, w,
        );
        store(y6 + rows6, (sums * inv_rms + b6) as bf16, row6_ok);
    } else {
        let sums = q4_k_row_sums::<BLOCK_K, ACT, 0, LAYOUT>(
            q_first, h_first, sc_first, m_first, d_first, dmin_first, q, qh5, scales, mins, d,
            dmin, xq, xd, a, norm_w, q_rows, s_rows, d_rows, words, ok2, blocks, grp, w,
        );
        store(y4 + rows, (sums * inv_rms + b) as bf16, row_ok);
    }
    stamp_now::<STAMPS>(stamps, stamp_at, 2);
}

// Multi-token GEMVs, for the batched prefill of short prompts (`crate::prefill`): the
// quantized weights meet `T` tokens' int8 activations a program, so a chunk of `t`
// tokens reads the weights `cdiv(t, T)` times instead of dequantizing them to bf16
// for a GEMM (llama.cpp's `mul_mat_vec_q` over a few columns). Token `t`'s activation
// is the `t`-th row of a row-major `[tokens, k]` input quantized by [`quantize_act`]
// over `tokens * k` values (`k` is a multiple of 32, so no block straddles two rows),
// and each token's sums are exactly the single-token GEMV's. Grid `[cdiv(n, BLOCK_N),
// cdiv(tokens, T)]`; `y` is row-major with `ldy` elements a token, rows `row0 + ..`
// written, `RESIDUAL = 1` adding into them.

/// Token `t`'s output of a multi-token GEMV's row sums `sums` (bias `b` added), where
/// `t < tokens`.
#[tile_fn(crate = tilefuse_dsl)]
#[allow(clippy::too_many_arguments)]
fn store_token<const RESIDUAL: usize>(
    y: Ptr<bf16>,
    ldy: i32,
    t: i32,
    tokens: i32,
    rows: Tile<i32>,
    row_ok: Tile<bool>,
    sums: Tile<f32>,
    b: Tile<f32>,
) {
    let at = t * ldy + rows;
    let ok = row_ok & (at >= 0) & (t < tokens);
    let proj = (sums + b) as bf16;
    if RESIDUAL == 1 {
        let old = load(y + at, ok, 0.0) as f32;
        store(y + at, (old + proj as f32) as bf16, ok);
    } else {
        store(y + at, proj, ok);
    }
}

/// The outputs of tokens `t0..t0 + T` of a multi-token GEMV from their accumulators
/// `acc0..` (row sums taken here). The accumulators past `T` are passed and not used:
/// they, and whatever computed them, compile to nothing (`tilefuse_dsl::compact`).
#[tile_fn(crate = tilefuse_dsl)]
#[allow(clippy::too_many_arguments)]
fn store_tokens<const T: usize, const RESIDUAL: usize>(
    y: Ptr<bf16>,
    ldy: i32,
    t0: i32,
    tokens: i32,
    row0: i32,
    rows: Tile<i32>,
    row_ok: Tile<bool>,
    b: Tile<f32>,
    acc0: Tile<f32>,
    acc1: Tile<f32>,
    acc2: Tile<f32>,
    acc3: Tile<f32>,
    acc4: Tile<f32>,
    acc5: Tile<f32>,
    acc6: Tile<f32>,
    acc7: Tile<f32>,
) {
    store_token::<RESIDUAL>(y, ldy, t0, tokens, row0 + rows, row_ok, acc0.sum(1), b);
    if T > 1 {
        store_token::<RESIDUAL>(y, ldy, t0 + 1, tokens, row0 + rows, row_ok, acc1.sum(1), b);
    }
    if T > 2 {
        store_token::<RESIDUAL>(y, ldy, t0 + 2, tokens, row0 + rows, row_ok, acc2.sum(1), b);
        store_token::<RESIDUAL>(y, ldy, t0 + 3, tokens, row0 + rows, row_ok, acc3.sum(1), b);
    }
    if T > 4 {
        store_token::<RESIDUAL>(y, ldy, t0 + 4, tokens, row0 + rows, row_ok, acc4.sum(1), b);
        store_token::<RESIDUAL>(y, ldy, t0 + 5, tokens, row0 + rows, row_ok, acc5.sum(1), b);
        store_token::<RESIDUAL>(y, ldy, t0 + 6, tokens, row0 + rows, row_ok, acc6.sum(1), b);
        store_token::<RESIDUAL>(y, ldy, t0 + 7, tokens, row0 + rows, row_ok, acc7.sum(1), b);
    }
}

/// Token `t0 + I`'s Q8_0 tile sums for [`q8_0_gemv_tokens`] (zero past `tokens`).
#[tile_fn(crate = tilefuse_dsl)]
#[allow(clippy::too_many_arguments)]
fn q8_0_token<const I: usize, const MIN: usize>(
    qt: Tile<u32>,
    dt: Tile<f16>,
    mt: Tile<f16>,
    xq: Ptr<i32>,
    xd: Ptr<f32>,
    unused: Ptr<bf16>,
    blk: Tile<i32>,
    blk_ok: Tile<bool>,
    w: Tile<i32>,
    t0: i32,
    tokens: i32,
    k_words: i32,
) -> Tile<f32> {
    let t = t0 + I as i32;
    let ok = blk_ok & (t < tokens);
    q8_0_tile::<0, MIN>(
        qt,
        dt,
        mt,
        xq + t * k_words,
        xd + t * (k_words / 8),
        unused,
        unused,
        blk,
        ok,
        w,
    )
}

/// `y[t] = bf16(W · x[t] + bias)` (with `RESIDUAL = 1`, added into `y[t]`) for `T`
/// tokens a program over a Q8_0 matrix (the layout of [`q8_0_gemv`]; see the
/// multi-token GEMVs above). `T` is 2, 4 or 8: the accumulators `acc0..` beyond it are
/// never used.
#[kernel(
    crate = tilefuse_dsl,
    BLOCK_N = [4, 8, 16],
    BLOCK_K = [512, 1024],
    T = [2, 4, 8],
    RESIDUAL = [0, 1],
    MIN = [0, 1],
    num_warps = [4]
)]
#[allow(clippy::too_many_arguments)]
pub fn q8_0_gemv_tokens<
    const BLOCK_N: usize,
    const BLOCK_K: usize,
    const T: usize,
    const RESIDUAL: usize,
    const MIN: usize,
>(
    q: Ptr<u32>,
    d: Ptr<f16>,
    m: Ptr<f16>,
    xq: Ptr<i32>,
    xd: Ptr<f32>,
    bias: Ptr<bf16>,
    y: Ptr<bf16>,
    n: i32,
    row0: i32,
    ldy: i32,
    #[multiple_of(8)] k_words: i32,
    tokens: i32,
) {
    let blocks = k_words / 8;
    let rows = program_id(0) * BLOCK_N + arange(0, BLOCK_N);
    let row_ok = rows < n;
    let t0 = program_id(1) * T;
    let grp = arange(0, BLOCK_K / 32);
    let w = arange(0, 8);
    let q_rows = (rows * k_words).expand_dims(1).expand_dims(2);
    let d_rows = (rows * blocks).expand_dims(1);
    let words = (grp * 8).expand_dims(1) + w.expand_dims(0);
    let ok2 = row_ok.expand_dims(1);
    let b = load(bias + row0 + rows, row_ok, 0.0) as f32;
    wait_for_prior_kernels();
    let mut acc0 = zeros::<f32>([BLOCK_N, BLOCK_K / 32]);
    let mut acc1 = zeros::<f32>([BLOCK_N, BLOCK_K / 32]);
    let mut acc2 = zeros::<f32>([BLOCK_N, BLOCK_K / 32]);
    let mut acc3 = zeros::<f32>([BLOCK_N, BLOCK_K / 32]);
    let mut acc4 = zeros::<f32>([BLOCK_N, BLOCK_K / 32]);
    let mut acc5 = zeros::<f32>([BLOCK_N, BLOCK_K / 32]);
    let mut acc6 = zeros::<f32>([BLOCK_N, BLOCK_K / 32]);
    let mut acc7 = zeros::<f32>([BLOCK_N, BLOCK_K / 32]);
    for g0 in (0..blocks).step_by(BLOCK_K / 32) {
        let blk = g0 + grp;
        let blk_ok = blk < blocks;
        let ok = ok2 & blk_ok.expand_dims(0);
        let qt = load(
            q + q_rows + (g0 * 8 + words).expand_dims(0),
            ok.expand_dims(2),
            0,
        );
        let dt = load(d + d_rows + blk.expand_dims(0), ok, 0.0);
        let mut mt = dt;
        if MIN == 1 {
            mt = load(m + d_rows + blk.expand_dims(0), ok, 0.0);
        }
        acc0 += q8_0_token::<0, MIN>(
            qt, dt, mt, xq, xd, bias, blk, blk_ok, w, t0, tokens, k_words,
        );
        if T > 1 {
            acc1 += q8_0_token::<1, MIN>(
                qt, dt, mt, xq, xd, bias, blk, blk_ok, w, t0, tokens, k_words,
            );
        }
        if T > 2 {
            acc2 += q8_0_token::<2, MIN>(
                qt, dt, mt, xq, xd, bias, blk, blk_ok, w, t0, tokens, k_words,
            );
            acc3 += q8_0_token::<3, MIN>(
                qt, dt, mt, xq, xd, bias, blk, blk_ok, w, t0, tokens, k_words,
            );
        }
        if T > 4 {
            acc4 += q8_0_token::<4, MIN>(
                qt, dt, mt, xq, xd, bias, blk, blk_ok, w, t0, tokens, k_words,
            );
            acc5 += q8_0_token::<5, MIN>(
                qt, dt, mt, xq, xd, bias, blk, blk_ok, w, t0, tokens, k_words,
            );
            acc6 += q8_0_token::<6, MIN>(
                qt, dt, mt, xq, xd, bias, blk, blk_ok, w, t0, tokens, k_words,
            );
            acc7 += q8_0_token::<7, MIN>(
                qt, dt, mt, xq, xd, bias, blk, blk_ok, w, t0, tokens, k_words,
            );
        }
    }
    store_tokens::<T, RESIDUAL>(
        y, ldy, t0, tokens, row0, rows, row_ok, b, acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7,
    );
}

/// Token `t0 + I`'s Q4_K tile sums for [`q4_k_gemv_tokens`] (zero past `tokens`).
#[tile_fn(crate = tilefuse_dsl)]
#[allow(clippy::too_many_arguments)]
fn q4_k_token<const I: usize, const LAYOUT: usize>(
    qt: Tile<u32>,
    ht: Tile<u32>,
    sc: Tile<u8>,
    m: Tile<u8>,
    dd: Tile<f16>,
    dm: Tile<f16>,
    xq: Ptr<i32>,
    xd: Ptr<f32>,
    unused: Ptr<bf16>,
    blk: Tile<i32>,
    blk_ok: Tile<bool>,
    w: Tile<i32>,
    t0: i32,
    tokens: i32,
    k_words: i32,
) -> Tile<f32> {
    let t = t0 + I as i32;
    let ok = blk_ok & (t < tokens);
    // A token's activation: `k / 4 = 2 k_words` words and `k / 32 = k_words / 4` blocks.
    let x_words = xq + t * (2 * k_words);
    let x_scales = xd + t * (k_words / 4);
    q4_k_tile::<0, LAYOUT>(
        qt, ht, sc, m, dd, dm, x_words, x_scales, unused, unused, blk, ok, w,
    )
}

/// [`q8_0_gemv_tokens`] over a Q4_K matrix (the layout of [`q4_k_gemv`]), or with
/// `LAYOUT` 1, 2, 3 or 4 a Q5_K, Q4_0, Q5_0 or IQ4_XS one.
#[kernel(
    crate = tilefuse_dsl,
    BLOCK_N = [4, 8, 16],
    BLOCK_K = [512, 1024],
    T = [2, 4, 8],
    RESIDUAL = [0, 1],
    LAYOUT = [0, 1, 2, 3, 4],
    num_warps = [4]
)]
#[allow(clippy::too_many_arguments)]
pub fn q4_k_gemv_tokens<
    const BLOCK_N: usize,
    const BLOCK_K: usize,
    const T: usize,
    const RESIDUAL: usize,
    const LAYOUT: usize,
>(
    q: Ptr<u32>,
    qh: Ptr<u32>,
    scales: Ptr<u8>,
    mins: Ptr<u8>,
    d: Ptr<f16>,
    dmin: Ptr<f16>,
    xq: Ptr<i32>,
    xd: Ptr<f32>,
    bias: Ptr<bf16>,
    y: Ptr<bf16>,
    n: i32,
    row0: i32,
    ldy: i32,
    #[multiple_of(32)] k_words: i32,
    tokens: i32,
) {
    let blocks = k_words / 4;
    let rows = program_id(0) * BLOCK_N + arange(0, BLOCK_N);
    let row_ok = rows < n;
    let t0 = program_id(1) * T;
    let grp = arange(0, BLOCK_K / 32);
    let w = arange(0, 4);
    let q_rows = (rows * k_words).expand_dims(1).expand_dims(2);
    let s_rows = (rows * blocks).expand_dims(1);
    let d_rows = (rows * (blocks / 8)).expand_dims(1);
    let words = (grp * 4).expand_dims(1) + w.expand_dims(0);
    let ok2 = row_ok.expand_dims(1);
    let b = load(bias + row0 + rows, row_ok, 0.0) as f32;
    wait_for_prior_kernels();
    let mut acc0 = zeros::<f32>([BLOCK_N, BLOCK_K / 32]);
    let mut acc1 = zeros::<f32>([BLOCK_N, BLOCK_K / 32]);
    let mut acc2 = zeros::<f32>([BLOCK_N, BLOCK_K / 32]);
    let mut acc3 = zeros::<f32>([BLOCK_N, BLOCK_K / 32]);
    let mut acc4 = zeros::<f32>([BLOCK_N, BLOCK_K / 32]);
    let mut acc5 = zeros::<f32>([BLOCK_N, BLOCK_K / 32]);
    let mut acc6 = zeros::<f32>([BLOCK_N, BLOCK_K / 32]);
    let mut acc7 = zeros::<f32>([BLOCK_N, BLOCK_K / 32]);
    for g0 in (0..blocks).step_by(BLOCK_K / 32) {
        let blk = g0 + grp;
        let blk_ok = blk < blocks;
        let ok = ok2 & blk_ok.expand_dims(0);
        let (qt, ht, sct, mt, dt, dmint) = q4_k_weights::<LAYOUT>(
            q, qh, scales, mins, d, dmin, q_rows, s_rows, d_rows, words, g0, blk, ok,
        );
        acc0 += q4_k_token::<0, LAYOUT>(
            qt, ht, sct, mt, dt, dmint, xq, xd, bias, blk, blk_ok, w, t0, tokens, k_words,
        );
        if T > 1 {
            acc1 += q4_k_token::<1, LAYOUT>(
                qt, ht, sct, mt, dt, dmint, xq, xd, bias, blk, blk_ok, w, t0, tokens, k_words,
            );
        }
        if T > 2 {
            acc2 += q4_k_token::<2, LAYOUT>(
                qt, ht, sct, mt, dt, dmint, xq, xd, bias, blk, blk_ok, w, t0, tokens, k_words,
            );
            acc3 += q4_k_token::<3, LAYOUT>(
                qt, ht, sct, mt, dt, dmint, xq, xd, bias, blk, blk_ok, w, t0, tokens, k_words,
            );
        }
        if T > 4 {
            acc4 += q4_k_token::<4, LAYOUT>(
                qt, ht, sct, mt, dt, dmint, xq, xd, bias, blk, blk_ok, w, t0, tokens, k_words,
            );
            acc5 += q4_k_token::<5, LAYOUT>(
                qt, ht, sct, mt, dt, dmint, xq, xd, bias, blk, blk_ok, w, t0, tokens, k_words,
            );
            acc6 += q4_k_token::<6, LAYOUT>(
                qt, ht, sct, mt, dt, dmint, xq, xd, bias, blk, blk_ok, w, t0, tokens, k_words,
            );
            acc7 += q4_k_token::<7, LAYOUT>(
                qt, ht, sct, mt, dt, dmint, xq, xd, bias, blk, blk_ok, w, t0, tokens, k_words,
            );
        }
    }
    store_tokens::<T, RESIDUAL>(
        y, ldy, t0, tokens, row0, rows, row_ok, b, acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7,
    );
}

/// Token `t0 + I`'s Q6_K tile sums for [`q6_k_gemv_tokens`] (zero past `tokens`).
#[tile_fn(crate = tilefuse_dsl)]
#[allow(clippy::too_many_arguments)]
fn q6_k_token<const I: usize, const LAYOUT: usize>(
    lt: Tile<u32>,
    h: Tile<i64>,
    sc0: Tile<u8>,
    sc1: Tile<u8>,
    dd: Tile<f16>,
    xq: Ptr<i32>,
    xd: Ptr<f32>,
    unused: Ptr<bf16>,
    blk: Tile<i32>,
    blk_ok: Tile<bool>,
    w: Tile<i32>,
    t0: i32,
    tokens: i32,
    k_words: i32,
) -> Tile<f32> {
    let t = t0 + I as i32;
    let ok = blk_ok & (t < tokens);
    let x_words = xq + t * (2 * k_words);
    let x_scales = xd + t * (k_words / 4);
    q6_k_tile::<0, LAYOUT>(
        lt, h, sc0, sc1, dd, x_words, x_scales, unused, unused, blk, ok, w,
    )
}

/// [`q8_0_gemv_tokens`] over a Q6_K matrix (the layout of [`q6_k_gemv`]).
#[kernel(
    crate = tilefuse_dsl,
    BLOCK_N = [4, 8, 16],
    BLOCK_K = [512, 1024],
    T = [2, 4, 8],
    RESIDUAL = [0, 1],
    // 0 Q6_K, 1 Q3_K (as in `q6_k_gemv`).
    LAYOUT = [0, 1],
    num_warps = [4]
)]
#[allow(clippy::too_many_arguments)]
pub fn q6_k_gemv_tokens<
    const BLOCK_N: usize,
    const BLOCK_K: usize,
    const T: usize,
    const RESIDUAL: usize,
    const LAYOUT: usize,
>(
    ql: Ptr<u32>,
    qh: Ptr<i64>,
    scales: Ptr<u8>,
    d: Ptr<f16>,
    xq: Ptr<i32>,
    xd: Ptr<f32>,
    bias: Ptr<bf16>,
    y: Ptr<bf16>,
    n: i32,
    row0: i32,
    ldy: i32,
    #[multiple_of(32)] k_words: i32,
    tokens: i32,
) {
    let blocks = k_words / 4;
    let rows = program_id(0) * BLOCK_N + arange(0, BLOCK_N);
    let row_ok = rows < n;
    let t0 = program_id(1) * T;
    let grp = arange(0, BLOCK_K / 32);
    // A block's four low-nibble words of a row in one thread (`q6_k_tile`).
    let w = arange(0, 4);
    let l_rows = (rows * k_words).expand_dims(1).expand_dims(2);
    let h_rows = (rows * blocks).expand_dims(1);
    let s_rows = (rows * (2 * blocks)).expand_dims(1);
    let d_rows = (rows * (blocks / 8)).expand_dims(1);
    let l_words = (grp * 4).expand_dims(1) + w.expand_dims(0);
    let ok2 = row_ok.expand_dims(1);
    let b = load(bias + row0 + rows, row_ok, 0.0) as f32;
    wait_for_prior_kernels();
    let mut acc0 = zeros::<f32>([BLOCK_N, BLOCK_K / 32]);
    let mut acc1 = zeros::<f32>([BLOCK_N, BLOCK_K / 32]);
    let mut acc2 = zeros::<f32>([BLOCK_N, BLOCK_K / 32]);
    let mut acc3 = zeros::<f32>([BLOCK_N, BLOCK_K / 32]);
    let mut acc4 = zeros::<f32>([BLOCK_N, BLOCK_K / 32]);
    let mut acc5 = zeros::<f32>([BLOCK_N, BLOCK_K / 32]);
    let mut acc6 = zeros::<f32>([BLOCK_N, BLOCK_K / 32]);
    let mut acc7 = zeros::<f32>([BLOCK_N, BLOCK_K / 32]);
    for g0 in (0..blocks).step_by(BLOCK_K / 32) {
        let blk = g0 + grp;
        let blk_ok = blk < blocks;
        let ok = ok2 & blk_ok.expand_dims(0);
        let (lt, ht, sc0, sc1, dt) = q6_k_weights::<LAYOUT>(
            ql, qh, scales, d, l_rows, h_rows, s_rows, d_rows, l_words, g0, blk, ok,
        );
        acc0 += q6_k_token::<0, LAYOUT>(
            lt, ht, sc0, sc1, dt, xq, xd, bias, blk, blk_ok, w, t0, tokens, k_words,
        );
        if T > 1 {
            acc1 += q6_k_token::<1, LAYOUT>(
                lt, ht, sc0, sc1, dt, xq, xd, bias, blk, blk_ok, w, t0, tokens, k_words,
            );
        }
        if T > 2 {
            acc2 += q6_k_token::<2, LAYOUT>(
                lt, ht, sc0, sc1, dt, xq, xd, bias, blk, blk_ok, w, t0, tokens, k_words,
            );
            acc3 += q6_k_token::<3, LAYOUT>(
                lt, ht, sc0, sc1, dt, xq, xd, bias, blk, blk_ok, w, t0, tokens, k_words,
            );
        }
        if T > 4 {
            acc4 += q6_k_token::<4, LAYOUT>(
                lt, ht, sc0, sc1, dt, xq, xd, bias, blk, blk_ok, w, t0, tokens, k_words,
            );
            acc5 += q6_k_token::<5, LAYOUT>(
                lt, ht, sc0, sc1, dt, xq, xd, bias, blk, blk_ok, w, t0, tokens, k_words,
            );
            acc6 += q6_k_token::<6, LAYOUT>(
                lt, ht, sc0, sc1, dt, xq, xd, bias, blk, blk_ok, w, t0, tokens, k_words,
            );
            acc7 += q6_k_token::<7, LAYOUT>(
                lt, ht, sc0, sc1, dt, xq, xd, bias, blk, blk_ok, w, t0, tokens, k_words,
            );
        }
    }
    store_tokens::<T, RESIDUAL>(
        y, ldy, t0, tokens, row0, rows, row_ok, b, acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7,
    );
}

/// The down projection's input for [`q8_0_gemv_tokens`] and its twins: row `r` of
/// `gu` (`[rows, 2 * inter]`, a gate/up GEMV's `[g; u]` a token) becomes
/// `bf16(bf16(silu(g)) * u)` quantized as [`quantize_act`] `MODE = 2` quantizes it,
/// into row `r` of the `[rows, inter]` activation (`xq`, `xd`). Grid `[inter / B,
/// rows]`, rounded up.
#[kernel(crate = tilefuse_dsl, B = [256], num_warps = [4])]
pub fn quantize_silu_mul_rows<const B: usize>(
    gu: Ptr<bf16>,
    xq: Ptr<i32>,
    xd: Ptr<f32>,
    #[multiple_of(32)] inter: i32,
) {
    let r = program_id(1);
    let local = program_id(0) * (B / 32) + arange(0, B / 32);
    let h = arange(0, 2);
    let w = arange(0, 4);
    let b = arange(0, 4);
    let e = (local * 32).expand_dims(1).expand_dims(2).expand_dims(3)
        + (h * 16).expand_dims(1).expand_dims(2)
        + (w * 4).expand_dims(1)
        + b;
    let ok = e < inter;
    wait_for_prior_kernels();
    let row = gu + r * (2 * inter);
    let g = load(row + e, ok, 0.0) as f32;
    let u = load(row + inter + e, ok, 0.0) as f32;
    let x = ((g / (1.0 + exp(-g))) as bf16 as f32 * u) as bf16 as f32;
    let blk = r * (inter / 32) + local;
    store_blocks(x, blk, local * 32 < inter, xq, xd);
}

// Dequantization to bf16, for the batched prefill's GEMMs (`crate::prefill`): each
// program writes a `[R, BLOCKS * 32]` tile of rows `row0 + ..` of a row-major `[.., k]`
// bf16 matrix from the device layout ([`crate::gguf::quant::PackedMatrix`]), with the
// host model's f32 operations (`PackedMatrix::dequantize`: llama.cpp's rounding), then
// bf16 rounding. Element `32 blk + 4 hw + b` of a row is byte `b` of the block's
// `hw`-th group of four, `hw = 4 half + w` (`half`: the block's 16-element half, `w`:
// the word; see the layout's module docs). Grid `[rows / R, blocks / BLOCKS]`, rounded
// up. Each waits for the kernels before it first: the decode step's buffers it writes
// may still be read by them.

/// The element offsets `[R, BLOCKS, 8, 4]` of a dequantized tile of rows `rows` and
/// blocks `blk` in a row-major `[.., k]` matrix: row `r`, element `32 blk + 4 hw + b`.
#[tile_fn(crate = tilefuse_dsl)]
fn dequant_offsets(rows: Tile<i32>, blk: Tile<i32>, k: i32) -> Tile<i32> {
    let hw = arange(0, 8);
    let b = arange(0, 4);
    (rows * k).expand_dims(1).expand_dims(2).expand_dims(3)
        + (blk * 32).expand_dims(0).expand_dims(2).expand_dims(3)
        + (hw * 4).expand_dims(1)
        + b
}

/// A Q8_0 matrix (`q: u32[n, k / 4]`, `d: f16[n, k / 32]`) as bf16 rows `row0..row0 +
/// n` of `out` (`[.., k]`): `q * d`; with `MIN = 1` (Q4_1, Q5_1) `q * d + m`.
#[kernel(crate = tilefuse_dsl, R = [1, 4], BLOCKS = [8, 32], MIN = [0, 1], num_warps = [4])]
#[allow(clippy::too_many_arguments)]
pub fn dequantize_q8_0<const R: usize, const BLOCKS: usize, const MIN: usize>(
    q: Ptr<u32>,
    d: Ptr<f16>,
    m: Ptr<f16>,
    out: Ptr<bf16>,
    n: i32,
    row0: i32,
    #[multiple_of(8)] k_words: i32,
) {
    let blocks = k_words / 8;
    let rows = program_id(0) * R + arange(0, R);
    let blk = program_id(1) * BLOCKS + arange(0, BLOCKS);
    let ok = (rows < n).expand_dims(1) & (blk < blocks).expand_dims(0);
    let b = arange(0, 4);
    let ok3 = ok.expand_dims(2);
    // Each element's word (element `e` of the row's `k` is byte `e % 4` of word
    // `e / 4`), indexed from the element offsets as in `dequantize_q4_k`.
    let e = dequant_offsets(rows, blk, k_words * 4);
    let words = load(q + (e >> 2), ok3.expand_dims(3) & (b >= 0), 0);
    let dd = load(
        d + (rows * blocks).expand_dims(1) + blk.expand_dims(0),
        ok,
        0.0,
    ) as f32;
    let mut mm = dd;
    if MIN == 1 {
        mm = load(
            m + (rows * blocks).expand_dims(1) + blk.expand_dims(0),
            ok,
            0.0,
        ) as f32;
    }
    wait_for_prior_kernels();
    let offs = e + row0 * (k_words * 4);
    // Byte `b` (`offs & 3`), sign-extended.
    let shift = (24 - ((offs & 3) << 3)) as u32;
    let qv = ((words << shift).bitcast::<i32>()) >> 24;
    let mut v = (qv as f32) * dd.expand_dims(2).expand_dims(3);
    if MIN == 1 {
        v = v + mm.expand_dims(2).expand_dims(3);
    }
    store(out + offs, v as bf16, ok3.expand_dims(3));
}

/// A Q4_K matrix (the arrays of [`q4_k_gemv`]) as bf16 rows `row0..row0 + n` of `out`
/// (`[.., k]`): `(d * sc) * q - dmin * m`; with `LAYOUT = 1` a Q5_K one, `q` taking its
/// fifth bit from `qh`; with `LAYOUT` 2 or 3 a Q4_0 or Q5_0 one, `d * (q - 8)` or
/// `d * (q - 16)` with `d` the block's; with `LAYOUT = 4` an IQ4_XS one, `(d * (sc -
/// 32)) * K[q]`.
#[kernel(crate = tilefuse_dsl, R = [1, 4], BLOCKS = [8, 32], LAYOUT = [0, 1, 2, 3, 4], num_warps = [4])]
#[allow(clippy::too_many_arguments)]
pub fn dequantize_q4_k<const R: usize, const BLOCKS: usize, const LAYOUT: usize>(
    q: Ptr<u32>,
    qh: Ptr<u32>,
    scales: Ptr<u8>,
    mins: Ptr<u8>,
    d: Ptr<f16>,
    dmin: Ptr<f16>,
    out: Ptr<bf16>,
    n: i32,
    row0: i32,
    #[multiple_of(32)] k_words: i32,
) {
    let blocks = k_words / 4;
    let rows = program_id(0) * R + arange(0, R);
    let blk = program_id(1) * BLOCKS + arange(0, BLOCKS);
    let ok = (rows < n).expand_dims(1) & (blk < blocks).expand_dims(0);
    let b = arange(0, 4);
    let ok3 = ok.expand_dims(2);
    // Each element's word (`e / 32` the row's block, `(e / 4) % 4` the word in it),
    // indexed from the element offsets so that the load takes the store's layout.
    let e = dequant_offsets(rows, blk, k_words * 8);
    let words = load(
        q + ((e >> 5) << 2) + ((e >> 2) & 3),
        ok3.expand_dims(3) & (b >= 0),
        0,
    );
    let s_at = (rows * blocks).expand_dims(1) + blk.expand_dims(0);
    let mut sc = (s_at & 0) as f32;
    let mut m = sc;
    let mut d_at = s_at;
    if (LAYOUT < 2) | (LAYOUT == 4) {
        sc = load(scales + s_at, ok, 0) as f32;
        if LAYOUT < 2 {
            m = load(mins + s_at, ok, 0) as f32;
        }
        d_at = (rows * (blocks / 8)).expand_dims(1) + (blk / 8).expand_dims(0);
    }
    let dd = load(d + d_at, ok, 0.0) as f32;
    let mut dm = dd;
    if LAYOUT < 2 {
        dm = load(dmin + d_at, ok, 0.0) as f32;
    }
    let mut high = (s_at & 0).bitcast::<u32>();
    if (LAYOUT == 1) | (LAYOUT == 3) {
        high = load(qh + s_at, ok, 0);
    }
    wait_for_prior_kernels();
    let offs = e + row0 * (k_words * 8);
    // Nibble `4 half + 8 b` of the word (`offs & 31 = 4 hw + b`).
    let shift = (((offs & 16) >> 2) + ((offs & 3) << 3)) as u32;
    let mut nib = (words >> shift) & 15;
    if (LAYOUT == 1) | (LAYOUT == 3) {
        // Bit `offs & 31` of the block's fifth-bit word, as bit 4 of `q`.
        let bit = (offs & 31).bitcast::<u32>();
        nib = nib | (((high.expand_dims(2).expand_dims(3) >> bit) & 1) << 4);
    }
    let scale = (dd * sc).expand_dims(2).expand_dims(3);
    let min = (dm * m).expand_dims(2).expand_dims(3);
    let mut v = (nib as f32) * scale - min;
    if LAYOUT == 2 {
        // `d * (q - 8)` as the file's dequantization rounds it: one product.
        v = ((nib.bitcast::<i32>() - 8) as f32) * dd.expand_dims(2).expand_dims(3);
    } else if LAYOUT == 3 {
        v = ((nib.bitcast::<i32>() - 16) as f32) * dd.expand_dims(2).expand_dims(3);
    } else if LAYOUT == 4 {
        // IQ4_XS: element `16 h + 4 w + b` is nibble `4 h + b` of word `w`; its table
        // value as a signed byte, times `d * (ls - 32)` as the file's dequantization
        // rounds it.
        let at = ((offs & 16) + ((offs & 3) << 2)).bitcast::<u32>();
        let k = iq4_values((words >> at) & 15) << 24;
        let dl = dd * (sc - 32.0);
        v = ((k.bitcast::<i32>() >> 24) as f32) * dl.expand_dims(2).expand_dims(3);
    }
    store(out + offs, v as bf16, ok3.expand_dims(3));
}

/// A Q6_K matrix (the arrays of [`q6_k_gemv`]) as bf16 rows `row0..row0 + n` of `out`
/// (`[.., k]`): `(d * sc) * (q - 32)`, `q` the low nibble and two high bits; `LAYOUT =
/// 1`, a Q3_K one: `(d * sc) * (q - 4)`, `q` two low bits and a high one.
#[kernel(crate = tilefuse_dsl, R = [1, 4], BLOCKS = [8, 32], LAYOUT = [0, 1], num_warps = [4])]
#[allow(clippy::too_many_arguments)]
pub fn dequantize_q6_k<const R: usize, const BLOCKS: usize, const LAYOUT: usize>(
    ql: Ptr<u32>,
    qh: Ptr<u32>,
    scales: Ptr<u8>,
    d: Ptr<f16>,
    out: Ptr<bf16>,
    n: i32,
    row0: i32,
    #[multiple_of(32)] k_words: i32,
) {
    let blocks = k_words / 4;
    let rows = program_id(0) * R + arange(0, R);
    let blk = program_id(1) * BLOCKS + arange(0, BLOCKS);
    let ok = (rows < n).expand_dims(1) & (blk < blocks).expand_dims(0);
    let hw = arange(0, 8);
    let b = arange(0, 4);
    let half = hw / 4;
    let ok3 = ok.expand_dims(2);
    // Each element's words, indexed from the element offsets as in `dequantize_q4_k`:
    // the low nibbles' word `w = (e / 4) % 4` of the block `e / 32`, the high bits'
    // `w / 2`.
    let e = dequant_offsets(rows, blk, k_words * 8);
    let ok4 = ok3.expand_dims(3) & (b >= 0);
    let mut lo = load(ql + ((e >> 5) << 2) + ((e >> 2) & 3), ok4, 0);
    let mut hi = load(qh + ((e >> 5) << 1) + ((e >> 3) & 1), ok4, 0);
    if LAYOUT == 1 {
        // Q3_K: the block's high-bit word (its third), and its 2-bit word `(e / 16) % 2`.
        lo = load(ql + ((e >> 5) << 2) + 2, ok4, 0);
        hi = load(ql + ((e >> 5) << 2) + ((e >> 4) & 1), ok4, 0);
    }
    let s_at = (rows * (2 * blocks)).expand_dims(1).expand_dims(2)
        + (blk * 2).expand_dims(0).expand_dims(2)
        + half;
    let mut sc = (load(scales + s_at, ok3, 128) as i32 - 128) as f32;
    if LAYOUT == 1 {
        // Q3_K: byte `half` of the block's fourth word, an `i8`.
        let b_at = (rows * (16 * blocks)).expand_dims(1).expand_dims(2)
            + (blk * 16 + 12).expand_dims(0).expand_dims(2)
            + half;
        sc = (((load(scales + b_at, ok3, 0) as i32) ^ 128) - 128) as f32;
    }
    let d_at = (rows * (blocks / 8)).expand_dims(1) + (blk / 8).expand_dims(0);
    let dd = load(d + d_at, ok, 0.0) as f32;
    wait_for_prior_kernels();
    let offs = e + row0 * (k_words * 8);
    // `offs & 31 = 4 hw + b`: the low nibble at bit `4 half + 8 b` of word `w`, the
    // high bits at `4 (w % 2) + 2 half + 8 b` of word `w / 2`.
    let lo_shift = (((offs & 16) >> 2) + ((offs & 3) << 3)) as u32;
    let hi_shift = (((offs & 4) + ((offs & 16) >> 3)) + ((offs & 3) << 3)) as u32;
    let mut q = (((lo >> lo_shift) & 15) | (((hi >> hi_shift) & 3) << 4)).bitcast::<i32>() - 32;
    if LAYOUT == 1 {
        // Element `4 i + b` of a block (`i = (e / 4) % 8`): its high bit at bit `i + 8
        // b` of the high-bit word, its low bits at `2 (i % 4) + 8 b` of its 2-bit word.
        let i = ((offs >> 2) & 7) as u32;
        let byte = ((offs & 3) << 3) as u32;
        let low = (hi >> (((i & 3) << 1) + byte)) & 3;
        let high = (lo >> (i + byte)) & 1;
        q = (low | (high << 2)).bitcast::<i32>() - 4;
    }
    let scale = (dd.expand_dims(2) * sc).expand_dims(3);
    let v = (q as f32) * scale;
    store(out + offs, v as bf16, ok3.expand_dims(3));
}
