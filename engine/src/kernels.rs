//! The decode kernels, written in tilefuse's kernel language.
//!
//! One decode step runs, per layer:
//!
//! 1. [`rms_norm_gemv`]: RMSNorm of the hidden state, then the fused QKV projection
//!    (`[q; k; v]` rows of one weight) plus bias;
//! 2. [`qk_norm_rope_append`]: QK-norm (Qwen3), RoPE, and the K/V append to the cache;
//! 3. [`attention_split`] + [`attention_combine`]: split-K decode attention;
//! 4. [`gemv_residual`]: O projection added into the hidden state;
//! 5. [`rms_norm_gate_up`]: RMSNorm, the fused `[gate; up]` projection and `silu(g) * u`;
//! 6. [`gemv_residual`]: down projection added into the hidden state;
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

use tilefuse_macros::kernel;

/// Every kernel description in this module, for tooling (offline assembly, inspection).
pub fn all() -> [&'static tilefuse_dsl::runtime::KernelDef; 9] {
    [
        &EMBED,
        &RMS_NORM_GEMV,
        &QK_NORM_ROPE_APPEND,
        &ATTENTION_SPLIT,
        &ATTENTION_COMBINE,
        &GEMV_RESIDUAL,
        &RMS_NORM_GATE_UP,
        &LM_HEAD_ARGMAX,
        &ARGMAX_FINISH,
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
/// RMSNorm rounds like the reference: `bf16(norm_w * bf16(x * inv_rms))`. Every program
/// recomputes `inv_rms`; `x` is a few KiB and stays in cache.
#[kernel(crate = tilefuse_dsl, BLOCK_N = [1, 2, 4, 8], BLOCK_K = [256, 512, 1024], num_warps = [4, 8])]
pub fn rms_norm_gemv<const BLOCK_N: usize, const BLOCK_K: usize>(
    x: Ptr<bf16>,
    norm_w: Ptr<bf16>,
    w: Ptr<bf16>,
    bias: Ptr<bf16>,
    y: Ptr<bf16>,
    n: i32,
    #[multiple_of(8)] k: i32,
    eps: f32,
) {
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
    let g = load(norm_w + cols, col_ok, 0.0) as f32;
    let xn = (g * ((xv * inv_rms) as bf16 as f32)) as bf16 as f32;
    let mut acc = (w_first as f32) * xn.expand_dims(0);
    for k0 in (BLOCK_K..k).step_by(BLOCK_K) {
        let cols = k0 + arange(0, BLOCK_K);
        let col_ok = cols < k;
        let xv = load(x + cols, col_ok, 0.0) as f32;
        let g = load(norm_w + cols, col_ok, 0.0) as f32;
        let xn = (g * ((xv * inv_rms) as bf16 as f32)) as bf16 as f32;
        let mask = row_ok.expand_dims(1) & col_ok.expand_dims(0);
        let wt = load(w + row_offs + cols.expand_dims(0), mask, 0.0) as f32;
        acc += wt * xn.expand_dims(0);
    }
    let b = load(bias + rows, row_ok, 0.0) as f32;
    store(y + rows, (acc.sum(1) + b) as bf16, row_ok);
}

/// `x = bf16(x + bf16(W · a + bias))`: a projection added into the residual stream.
#[kernel(crate = tilefuse_dsl, BLOCK_N = [1, 2, 4, 8], BLOCK_K = [256, 512, 1024], num_warps = [4, 8])]
pub fn gemv_residual<const BLOCK_N: usize, const BLOCK_K: usize>(
    w: Ptr<bf16>,
    a: Ptr<bf16>,
    bias: Ptr<bf16>,
    x: Ptr<bf16>,
    n: i32,
    #[multiple_of(8)] k: i32,
) {
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
    wait_for_prior_kernels();
    let av = load(a + cols, col_ok, 0.0) as f32;
    let mut acc = (w_first as f32) * av.expand_dims(0);
    for k0 in (BLOCK_K..k).step_by(BLOCK_K) {
        let cols = k0 + arange(0, BLOCK_K);
        let col_ok = cols < k;
        let av = load(a + cols, col_ok, 0.0) as f32;
        let mask = row_ok.expand_dims(1) & col_ok.expand_dims(0);
        let wt = load(w + row_offs + cols.expand_dims(0), mask, 0.0) as f32;
        acc += wt * av.expand_dims(0);
    }
    let b = load(bias + rows, row_ok, 0.0) as f32;
    let proj = (acc.sum(1) + b) as bf16 as f32;
    let old = load(x + rows, row_ok, 0.0) as f32;
    store(x + rows, (old + proj) as bf16, row_ok);
}

/// `act = bf16(bf16(silu(g)) * u)` with `g = W[r] · rmsnorm(x)` and
/// `u = W[inter + r] · rmsnorm(x)`: the MLP's first half, over one fused `[2 * inter, k]`
/// weight (gate rows, then up rows).
#[kernel(crate = tilefuse_dsl, BLOCK_N = [1, 2, 4, 8], BLOCK_K = [256, 512, 1024], num_warps = [4])]
pub fn rms_norm_gate_up<const BLOCK_N: usize, const BLOCK_K: usize>(
    x: Ptr<bf16>,
    norm_w: Ptr<bf16>,
    w: Ptr<bf16>,
    act: Ptr<bf16>,
    inter: i32,
    #[multiple_of(8)] k: i32,
    eps: f32,
) {
    let rows = program_id(0) * BLOCK_N + arange(0, BLOCK_N);
    let row_ok = rows < inter;
    let row_offs = rows.expand_dims(1) * k;
    // First gate and up tiles requested before the norm's reduction (see rms_norm_gemv).
    let cols = arange(0, BLOCK_K);
    let col_ok = cols < k;
    let mask = row_ok.expand_dims(1) & col_ok.expand_dims(0);
    let g_first = load(w + row_offs + cols.expand_dims(0), mask, 0.0);
    let u_first = load(w + inter * k + row_offs + cols.expand_dims(0), mask, 0.0);
    wait_for_prior_kernels();

    let mut sq = zeros::<f32>([BLOCK_K]);
    for k0 in (0..k).step_by(BLOCK_K) {
        let c = k0 + arange(0, BLOCK_K);
        let v = load(x + c, c < k, 0.0) as f32;
        sq += v * v;
    }
    let inv_rms = 1.0 / sqrt(sq.sum(0) / (k as f32) + eps);

    let xv = load(x + cols, col_ok, 0.0) as f32;
    let gw = load(norm_w + cols, col_ok, 0.0) as f32;
    let xn = ((gw * ((xv * inv_rms) as bf16 as f32)) as bf16 as f32).expand_dims(0);
    let mut acc_g = (g_first as f32) * xn;
    let mut acc_u = (u_first as f32) * xn;
    for k0 in (BLOCK_K..k).step_by(BLOCK_K) {
        let cols = k0 + arange(0, BLOCK_K);
        let col_ok = cols < k;
        let xv = load(x + cols, col_ok, 0.0) as f32;
        let gw = load(norm_w + cols, col_ok, 0.0) as f32;
        let xn = ((gw * ((xv * inv_rms) as bf16 as f32)) as bf16 as f32).expand_dims(0);
        let mask = row_ok.expand_dims(1) & col_ok.expand_dims(0);
        let offs = row_offs + cols.expand_dims(0);
        acc_g += (load(w + offs, mask, 0.0) as f32) * xn;
        acc_u += (load(w + inter * k + offs, mask, 0.0) as f32) * xn;
    }
    let gate = acc_g.sum(1) as bf16 as f32;
    let up = acc_u.sum(1) as bf16 as f32;
    let silu = (gate / (1.0 + exp(-gate))) as bf16 as f32;
    store(act + rows, (silu * up) as bf16, row_ok);
}

/// QK-norm (when `use_norm != 0`), RoPE at the position in `state[1]`, and the KV-cache
/// append, one program per head of the fused `qkv` vector `[q heads | k heads | v heads]`.
///
/// Query heads go to `q_out`; key and value heads to row `pos` of their cache
/// (`[num_kv_heads, max_seq, D]`). `rope_cos` / `rope_sin` hold `[max_seq, D / 2]`
/// bf16-rounded values, computed on the host once, as the reference does.
#[kernel(crate = tilefuse_dsl, D = [32, 64, 128], num_warps = [1])]
pub fn qk_norm_rope_append<const D: usize>(
    qkv: Ptr<bf16>,
    q_norm_w: Ptr<bf16>,
    k_norm_w: Ptr<bf16>,
    rope_cos: Ptr<f32>,
    rope_sin: Ptr<f32>,
    state: Ptr<i32>,
    q_out: Ptr<bf16>,
    k_cache: Ptr<bf16>,
    v_cache: Ptr<bf16>,
    num_heads: i32,
    num_kv_heads: i32,
    max_seq: i32,
    use_norm: i32,
    eps: f32,
) {
    let head = program_id(0);
    // Clamped so that a step past the cache's end stays inside every buffer (its
    // result is meaningless; the engine never runs one).
    let pos = minimum(load(state + 1), max_seq - 1);
    let i = arange(0, D / 2);
    let lo = load(qkv + head * D + i) as f32;
    let hi = load(qkv + head * D + D / 2 + i) as f32;
    if head < num_heads + num_kv_heads {
        let is_q = head < num_heads;
        let mut a = lo;
        let mut b = hi;
        if use_norm != 0 {
            let inv_rms = 1.0 / sqrt(((lo * lo).sum(0) + (hi * hi).sum(0)) / (D as f32) + eps);
            let w_lo = select(is_q, load(q_norm_w + i), load(k_norm_w + i)) as f32;
            let w_hi = select(is_q, load(q_norm_w + D / 2 + i), load(k_norm_w + D / 2 + i)) as f32;
            a = (w_lo * ((lo * inv_rms) as bf16 as f32)) as bf16 as f32;
            b = (w_hi * ((hi * inv_rms) as bf16 as f32)) as bf16 as f32;
        }
        let c = load(rope_cos + pos * (D / 2) + i);
        let s = load(rope_sin + pos * (D / 2) + i);
        let out_lo = (((a * c) as bf16 as f32) + ((-b * s) as bf16 as f32)) as bf16;
        let out_hi = (((b * c) as bf16 as f32) + ((a * s) as bf16 as f32)) as bf16;
        if is_q {
            store(q_out + head * D + i, out_lo);
            store(q_out + head * D + D / 2 + i, out_hi);
        } else {
            let row = ((head - num_heads) * max_seq + pos) * D;
            store(k_cache + row + i, out_lo);
            store(k_cache + row + D / 2 + i, out_hi);
        }
    } else {
        let row = ((head - num_heads - num_kv_heads) * max_seq + pos) * D;
        store(v_cache + row + i, lo as bf16);
        store(v_cache + row + D / 2 + i, hi as bf16);
    }
}

/// Decode attention, first pass: program `(kv_head, split, chunk)` attends `G` of the
/// query heads sharing `kv_head` (the group padded to a multiple of `G`) over its share of positions `0..=pos` (`pos` read
/// from `state[1]`), with an online softmax, and writes the partial max, denominator and
/// weighted value sum per query head and split.
///
/// Scores round like the reference (`bf16(bf16(q·k) * scale)`); the probabilities stay
/// f32 (the reference rounds the normalized probabilities, which a split pass cannot).
#[kernel(crate = tilefuse_dsl, D = [32, 64, 128], G = [1, 2, 4], BS = [32], num_warps = [4])]
pub fn attention_split<const D: usize, const G: usize, const BS: usize>(
    q: Ptr<bf16>,
    k_cache: Ptr<bf16>,
    v_cache: Ptr<bf16>,
    state: Ptr<i32>,
    part_m: Ptr<f32>,
    part_l: Ptr<f32>,
    part_acc: Ptr<f32>,
    group: i32,
    max_seq: i32,
    scale: f32,
) {
    let kv_head = program_id(0);
    let split = program_id(1);
    let splits = num_programs(1);
    // Clamped like `qk_norm_rope_append`'s position: never past the cache.
    let seq = minimum(load(state + 1), max_seq - 1) + 1;
    let per_split = cdiv(cdiv(seq, splits), BS) * BS;
    let start = split * per_split;
    let end = minimum(start + per_split, seq);

    // Groups larger than G are split over grid axis 2.
    let g = program_id(2) * G + arange(0, G);
    let g_ok = g < group;
    let heads = kv_head * group + g;
    let d = arange(0, D);
    let qt = load(
        q + heads.expand_dims(1) * D + d.expand_dims(0),
        g_ok.expand_dims(1),
        0.0,
    ) as f32;
    let base = kv_head * max_seq * D;

    let mut m = full([G], f32::NEG_INFINITY);
    let mut l = zeros::<f32>([G]);
    let mut acc = zeros::<f32>([G, D]);
    for s0 in (start..end).step_by(BS) {
        let s = s0 + arange(0, BS);
        let ok = s < end;
        let offs = base + s.expand_dims(1) * D + d.expand_dims(0);
        // Both tiles are requested up front, so their latencies overlap.
        let kt = load(k_cache + offs, ok.expand_dims(1), 0.0) as f32;
        let vt = load(v_cache + offs, ok.expand_dims(1), 0.0) as f32;
        // The cache tile comes first: the product takes its layout (16-byte loads
        // along D) and `qt` is loaded to match.
        let dots = (kt.expand_dims(0) * qt.expand_dims(1)).sum(2);
        let scores = ((dots as bf16 as f32) * scale) as bf16 as f32;
        let scores = select(ok.expand_dims(0), scores, f32::NEG_INFINITY);
        let m_new = maximum(m, scores.max(1));
        let p = exp(scores - m_new.expand_dims(1));
        let alpha = exp(m - m_new);
        acc = acc * alpha.expand_dims(1) + (vt.expand_dims(0) * p.expand_dims(2)).sum(1);
        l = l * alpha + p.sum(1);
        m = m_new;
    }
    let slot = heads * splits + split;
    store(part_m + slot, m, g_ok);
    store(part_l + slot, l, g_ok);
    store(
        part_acc + slot.expand_dims(1) * D + d.expand_dims(0),
        acc,
        g_ok.expand_dims(1),
    );
}

/// Decode attention, second pass: one program per query head merges the `splits`
/// partials (`S` is a power of two at least `splits`) into the bf16 head output.
#[kernel(crate = tilefuse_dsl, D = [32, 64, 128], S = [8, 16, 32, 64], num_warps = [4])]
pub fn attention_combine<const D: usize, const S: usize>(
    part_m: Ptr<f32>,
    part_l: Ptr<f32>,
    part_acc: Ptr<f32>,
    out: Ptr<bf16>,
    splits: i32,
) {
    let head = program_id(0);
    let s = arange(0, S);
    let ok = s < splits;
    let slot = head * splits + s;
    let m = load(part_m + slot, ok, f32::NEG_INFINITY);
    // Empty splits hold m = -inf and weigh exp(-inf) = 0; split 0 is never empty.
    let weight = exp(m - m.max(0));
    let denom = (weight * load(part_l + slot, ok, 0.0)).sum(0);
    let d = arange(0, D);
    let acc = load(
        part_acc + slot.expand_dims(1) * D + d.expand_dims(0),
        ok.expand_dims(1),
        0.0,
    );
    let o = (acc * weight.expand_dims(1)).sum(0) / denom;
    store(out + head * D + d, o as bf16);
}

/// Final norm and LM head: `logits = bf16(W · rmsnorm(x))` (stored as f32), plus each
/// program's greedy candidate (largest logit, first index on ties) in `part_val` /
/// `part_idx`, indexed by program.
#[kernel(crate = tilefuse_dsl, BLOCK_N = [4, 8, 16], BLOCK_K = [256, 1024], num_warps = [4, 8])]
pub fn lm_head_argmax<const BLOCK_N: usize, const BLOCK_K: usize>(
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
    let g = load(norm_w + cols, col_ok, 0.0) as f32;
    let xn = (g * ((xv * inv_rms) as bf16 as f32)) as bf16 as f32;
    let mut acc = (w_first as f32) * xn.expand_dims(0);
    for k0 in (BLOCK_K..k).step_by(BLOCK_K) {
        let cols = k0 + arange(0, BLOCK_K);
        let col_ok = cols < k;
        let xv = load(x + cols, col_ok, 0.0) as f32;
        let g = load(norm_w + cols, col_ok, 0.0) as f32;
        let xn = (g * ((xv * inv_rms) as bf16 as f32)) as bf16 as f32;
        let mask = row_ok.expand_dims(1) & col_ok.expand_dims(0);
        let wt = load(w + row_offs + cols.expand_dims(0), mask, 0.0) as f32;
        acc += wt * xn.expand_dims(0);
    }
    let out = acc.sum(1) as bf16 as f32;
    store(logits + rows, out, row_ok);
    let cand = select(row_ok, out, f32::NEG_INFINITY);
    store(part_val + program_id(0), cand.max(0));
    store(
        part_idx + program_id(0),
        program_id(0) * BLOCK_N + cand.argmax(0),
    );
}

/// Greedy sampling, last step: the best of the `parts` candidates (first on ties)
/// becomes `state[0]`, and `state[1]` (the position) advances by one.
#[kernel(crate = tilefuse_dsl, B = [256, 1024, 4096], num_warps = [4, 8])]
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
