//! The kernels a tensor-parallel rank adds to the decode step ([`super::tp`]): the O
//! and down projections as f32 partial sums for the all-reduce, the residual update
//! after it, and the greedy token merged over the ranks.

use tilefuse_macros::kernel;

/// `out = W · a` in f32, unrounded: one rank's partial sum of a projection whose
/// columns are split over the ranks (the O and down projections), before the
/// all-reduce. [`crate::kernels::gemv_residual`]'s loop, without its bias and
/// residual (those follow the reduction, [`residual_add`]).
#[kernel(
    crate = tilefuse_dsl,
    BLOCK_N = [1, 2, 4, 8],
    BLOCK_K = [256, 512, 1024, 2048, 4096],
    num_warps = [4, 8],
    REDUCE_EACH = [0, 1],
    skip(REDUCE_EACH = 1, BLOCK_K = [256, 512, 1024]),
    // 8 x 4096 weights for 128 threads spill; so do 4- and 8-row 4096-column f32
    // tiles carried to the end (sm_80, tests/ptxas_all.rs).
    skip(BLOCK_N = 8, BLOCK_K = 4096, num_warps = 4),
    skip(REDUCE_EACH = 0, BLOCK_K = 4096, BLOCK_N = [4, 8])
)]
pub fn gemv_partial<const BLOCK_N: usize, const BLOCK_K: usize, const REDUCE_EACH: usize>(
    w: Ptr<bf16>,
    a: Ptr<bf16>,
    out: Ptr<f32>,
    n: i32,
    #[multiple_of(8)] k: i32,
) {
    let rows = program_id(0) * BLOCK_N + arange(0, BLOCK_N);
    let row_ok = rows < n;
    let row_offs = rows.expand_dims(1) * k;
    // The first weight tile is requested before waiting for the kernel that
    // produces `a` (weights are never written by a step).
    let cols = arange(0, BLOCK_K);
    let col_ok = cols < k;
    let w_first = load(
        w + row_offs + cols.expand_dims(0),
        row_ok.expand_dims(1) & col_ok.expand_dims(0),
        0.0,
    );
    wait_for_prior_kernels();
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
        let mask = row_ok.expand_dims(1) & col_ok.expand_dims(0);
        let wt = load(w + row_offs + cols.expand_dims(0), mask, 0.0);
        if REDUCE_EACH == 1 {
            sums += ((wt as f32) * av.expand_dims(0)).sum(1);
        } else {
            acc += (wt as f32) * av.expand_dims(0);
        }
    }
    if REDUCE_EACH == 0 {
        sums = acc.sum(1);
    }
    store(out + rows, sums, row_ok);
}

/// `x = bf16(x + bf16(sum + bias))`: the residual update after the all-reduce of a
/// split projection, rounding where [`crate::kernels::gemv_residual`] rounds.
#[kernel(crate = tilefuse_dsl, B = [1024], num_warps = [4])]
pub fn residual_add<const B: usize>(sum: Ptr<f32>, bias: Ptr<bf16>, x: Ptr<bf16>, n: i32) {
    let offs = program_id(0) * B + arange(0, B);
    let ok = offs < n;
    let s = load(sum + offs, ok, 0.0);
    let b = load(bias + offs, ok, 0.0) as f32;
    let old = load(x + offs, ok, 0.0) as f32;
    let proj = (s + b) as bf16 as f32;
    store(x + offs, (old + proj) as bf16, ok);
}

/// A rank's greedy candidate: the best of its LM head's `parts` candidates (first on
/// ties) as `pair = [logit, offset + token]` (token ids are exact in f32 below 2^24),
/// for the all-gather.
#[kernel(crate = tilefuse_dsl, B = [256, 1024, 4096, 16384], num_warps = [4, 8, 16])]
pub fn argmax_pair<const B: usize>(
    part_val: Ptr<f32>,
    part_idx: Ptr<i32>,
    pair: Ptr<f32>,
    parts: i32,
    offset: i32,
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
    store(pair, best);
    store(pair + 1, (token + offset) as f32);
}

/// The greedy token from the ranks' gathered candidates `pairs = [logit, token] x
/// ranks` (rank order is vocabulary order, so the first maximum is the lowest
/// token, as [`crate::tp::merge_argmax`]): `state[0]` becomes it and `state[1]`
/// (the position) advances by one, as [`crate::kernels::argmax_finish`] does.
#[kernel(crate = tilefuse_dsl, B = [16], num_warps = [1])]
pub fn merge_pairs<const B: usize>(pairs: Ptr<f32>, ranks: i32, state: Ptr<i32>) {
    let r = arange(0, B);
    let v = load(pairs + r * 2, r < ranks, f32::NEG_INFINITY);
    let best = v.argmax(0);
    let token = load(pairs + best * 2 + 1) as i32;
    store(state, token);
    store(state + 1, load(state + 1) + 1);
}

/// One side of the one-shot all-reduce of two ranks over peer memory, with the
/// residual update that follows it: `x = bf16(x + bf16((mine + theirs) + bias))`,
/// which is [`residual_add`] over NCCL's sum (one addition of two values, equal on
/// both ranks and to NCCL's), in one launch and without NCCL.
///
/// `theirs` is the other rank's partial sums, read straight from its memory (peer
/// access, [`tilefuse_dsl::runtime::Device::enable_peer_access`]). Program `p` counts
/// its exchanges in `count[p]` (each rank's counts stay equal: both run the same
/// exchanges), publishes the new count in the other rank's `inbox[p]` (`outbox`),
/// loads its own operands, and waits until its own `inbox[p]` holds the count, that
/// is until the other rank's program `p` has started this exchange, after the kernel
/// before it (which wrote `theirs`) finished. The counts live in device memory, so a
/// captured graph replays the exchange with no input from the host. The partial sums
/// alternate between two buffers a rank from one all-reduce to the next, so a rank
/// that runs ahead never overwrites what its peer still reads (`decode::tp`).
#[kernel(crate = tilefuse_dsl, B = [256, 512, 1024, 2048], num_warps = [4, 8])]
#[allow(clippy::too_many_arguments)]
pub fn peer_residual_add<const B: usize>(
    mine: Ptr<f32>,
    theirs: Ptr<f32>,
    count: Ptr<i32>,
    outbox: Ptr<i32>,
    inbox: Ptr<i32>,
    bias: Ptr<bf16>,
    x: Ptr<bf16>,
    n: i32,
) {
    let p = program_id(0);
    let epoch = load(count + p) + 1;
    store(count + p, epoch);
    signal_flag(outbox + p, epoch);
    let offs = p * B + arange(0, B);
    let ok = offs < n;
    // The rank's own operands load while the peer catches up.
    let a = load(mine + offs, ok, 0.0);
    let b = load(bias + offs, ok, 0.0) as f32;
    let old = load(x + offs, ok, 0.0) as f32;
    wait_flag_at_least(inbox + p, epoch);
    let s = a + load(theirs + offs, ok, 0.0);
    let proj = (s + b) as bf16 as f32;
    store(x + offs, (old + proj) as bf16, ok);
}

/// The greedy token of two ranks from their candidates `[logit, token]` (`first` is
/// rank 0's, `second` rank 1's; one of them lives on the other GPU), after the same
/// handshake as [`peer_residual_add`] on flag `slot`: `state[0]` becomes rank 1's token
/// if its logit is larger, else rank 0's (the first maximum, as [`merge_pairs`]), and
/// `state[1]` advances by one. Replaces the all-gather and [`merge_pairs`].
#[kernel(crate = tilefuse_dsl, num_warps = [1])]
#[allow(clippy::too_many_arguments)]
pub fn peer_merge_pairs(
    first: Ptr<f32>,
    second: Ptr<f32>,
    count: Ptr<i32>,
    outbox: Ptr<i32>,
    inbox: Ptr<i32>,
    slot: i32,
    state: Ptr<i32>,
) {
    let epoch = load(count + slot) + 1;
    store(count + slot, epoch);
    signal_flag(outbox + slot, epoch);
    wait_flag_at_least(inbox + slot, epoch);
    let v0 = load(first);
    let v1 = load(second);
    let t0 = load(first + 1);
    let t1 = load(second + 1);
    store(state, select(v1 > v0, t1, t0) as i32);
    store(state + 1, load(state + 1) + 1);
}
