//! The device-sampling kernels, written in tilefuse's kernel language: Gumbel-max draws
//! over the logits ([`sample_draw`]), their ranks and masses ([`sample_check`]), the
//! top-k mass for top-k with top-p ([`sample_topk_part`], [`sample_topk_mass`]) and the
//! pick ([`sample_pick`]). [`super::device`] launches them; docs/design.md ("Sampling on the device")
//! gives the method.

use tilefuse_macros::kernel;

/// Sampling on the device, first pass: `R` independent Gumbel-max draws from
/// `softmax(logits / temperature)`. Program `p` handles logits `p * B ..`; for each
/// stream `r` it writes its best `logit / T + g` and that token to `part_val` /
/// `part_idx[p * R + r]`. The noise `g = -ln(-ln(u))` comes from a hash of the seed,
/// the position in `state[1]`, the stream and the token, so a draw is a function of
/// `(seed, position)`. NaN logits never win.
///
/// `fparams = [temperature, top_p]`, `iparams = [top_k, seed]`.
#[kernel(crate = tilefuse_dsl, B = [1024], R = [4], num_warps = [4])]
pub fn sample_draw<const B: usize, const R: usize>(
    logits: Ptr<f32>,
    fparams: Ptr<f32>,
    iparams: Ptr<i32>,
    state: Ptr<i32>,
    part_val: Ptr<f32>,
    part_idx: Ptr<i32>,
    n: i32,
) {
    let inv_t = 1.0 / load(fparams);
    let seed = load(iparams + 1) as u32;
    let pos = load(state + 1) as u32;
    let r = arange(0, R);
    // One key per stream (murmur3's finalizer), then one hash per token.
    let mut key = seed ^ (pos * 2246822519) ^ ((r as u32) * 3266489917);
    key = key ^ (key >> 16);
    key = key * 2246822507;
    key = key ^ (key >> 13);
    key = key * 3266489909;
    key = key ^ (key >> 16);
    let i = program_id(0) * B + arange(0, B);
    let ok = i < n;
    let l = load(logits + i, ok, f32::NEG_INFINITY);
    let valid = ok & (l == l);
    let mut h = ((i as u32) * 2654435761).expand_dims(0) + key.expand_dims(1);
    h = h ^ (h >> 16);
    h = h * 2246822507;
    h = h ^ (h >> 13);
    h = h * 3266489909;
    h = h ^ (h >> 16);
    // 24 random bits to a uniform in (0, 1), then Gumbel noise.
    let u = (((h >> 8) as f32) + 0.5) * (1.0 / 16777216.0);
    let g = -log(-log(u));
    let noisy = select(
        valid.expand_dims(0),
        (l * inv_t).expand_dims(0) + g,
        f32::NEG_INFINITY,
    );
    let slot = program_id(0) * R + r;
    store(part_val + slot, noisy.max(1));
    store(part_idx + slot, program_id(0) * B + noisy.argmax(1));
}

/// Sampling, second pass: each stream's draw (the best of the `parts` candidates of
/// [`sample_draw`], `PB` a power of two at least `parts`) is ranked against this
/// program's logits: `cnt[p * R + r]` counts the tokens ranked before it (a larger
/// logit, or an equal one at a lower index), `mass[p * R + r]` sums their weights
/// `exp((logit - max) / T)`, and `z[p]` sums every weight. The maximum is the logit of
/// the greedy token in `state[0]`.
#[kernel(crate = tilefuse_dsl, B = [1024], R = [4], PB = [64, 256, 1024], num_warps = [4])]
pub fn sample_check<const B: usize, const R: usize, const PB: usize>(
    logits: Ptr<f32>,
    fparams: Ptr<f32>,
    state: Ptr<i32>,
    part_val: Ptr<f32>,
    part_idx: Ptr<i32>,
    cnt: Ptr<i32>,
    mass: Ptr<f32>,
    z: Ptr<f32>,
    n: i32,
    parts: i32,
) {
    // Every load that does not wait on a reduction first (each load issued after
    // one is a round trip of its own).
    let i = program_id(0) * B + arange(0, B);
    let ok = i < n;
    let l = load(logits + i, ok, f32::NEG_INFINITY);
    let m = load(logits + load(state));
    let inv_t = 1.0 / load(fparams);
    let r = arange(0, R);
    let p = arange(0, PB);
    let slots = p.expand_dims(0) * R + r.expand_dims(1);
    let pv = load(
        part_val + slots,
        (p < parts).expand_dims(0),
        f32::NEG_INFINITY,
    );
    let cand = load(part_idx + pv.argmax(1) * R + r);
    let lc = load(logits + cand);
    let valid = ok & (l == l);
    let w = select(valid, exp((l - m) * inv_t), 0.0);
    let le = l.expand_dims(0);
    let ce = lc.expand_dims(1);
    let before = valid.expand_dims(0)
        & ((le > ce) | ((le == ce) & (i.expand_dims(0) < cand.expand_dims(1))));
    let slot = program_id(0) * R + r;
    store(cnt + slot, select(before, 1, 0).sum(1));
    store(mass + slot, select(before, w.expand_dims(0), 0.0).sum(1));
    store(z + program_id(0), w.sum(0));
}

/// Sampling, last pass (one program): the first stream whose draw lies inside top-k
/// (`top_k > 0`) or inside the top-p nucleus (`top_p < 1`: the weight ranked before it
/// is below `top_p` of the total) wins: its token goes to `state[0]` (`state[1]` is
/// already the next position) and `result = [token, 0]`. When every draw falls
/// outside, `state` keeps the greedy token and `result = [greedy, 1]`: the host draws
/// from the logits instead. That is rejection sampling, so accepted and host draws
/// together follow the restricted distribution exactly. With top-k and top-p together
/// the nucleus is measured against the top-k mass `zk[0]` ([`sample_topk_mass`], run
/// before), as the host sampler defines it.
#[kernel(crate = tilefuse_dsl, R = [4], PB = [64, 256, 1024], num_warps = [4])]
pub fn sample_pick<const R: usize, const PB: usize>(
    fparams: Ptr<f32>,
    iparams: Ptr<i32>,
    state: Ptr<i32>,
    part_val: Ptr<f32>,
    part_idx: Ptr<i32>,
    cnt: Ptr<i32>,
    mass: Ptr<f32>,
    z: Ptr<f32>,
    zk: Ptr<f32>,
    result: Ptr<i32>,
    parts: i32,
) {
    let top_p = load(fparams + 1);
    let top_k = load(iparams);
    let r = arange(0, R);
    let p = arange(0, PB);
    let pok = p < parts;
    let slots = p.expand_dims(0) * R + r.expand_dims(1);
    // Every load that does not wait on a reduction first (see sample_check); `zk`
    // always exists, and is used only with top-k and top-p together.
    let pv = load(part_val + slots, pok.expand_dims(0), f32::NEG_INFINITY);
    let counts = load(cnt + slots, pok.expand_dims(0), 0);
    let masses = load(mass + slots, pok.expand_dims(0), 0.0);
    let zs = load(z + p, pok, 0.0);
    let top_k_mass = load(zk);
    let old_token = load(state);
    let found = pv.max(1) > f32::NEG_INFINITY;
    let cand = load(part_idx + pv.argmax(1) * R + r);
    let rank = counts.sum(1);
    let before = masses.sum(1);
    let total = zs.sum(0);
    let mut kept = total;
    if (top_k > 0) & (top_p < 1.0) {
        kept = top_k_mass;
    }
    let in_k = (rank < top_k) | (top_k <= 0);
    let in_p = (before < top_p * kept) | (top_p >= 1.0);
    let accept = select(found & in_k & in_p, 1, 0);
    let first = accept.argmax(0);
    let token = select(r == first, cand, 0).sum(0);
    if accept.max(0) > 0 {
        store(state, token);
        store(result, token);
        store(result + 1, 0);
    } else {
        store(result, old_token);
        store(result + 1, 1);
    }
}

/// Sampling with top-k and top-p together, first pass: program `p` writes the `top_k`
/// largest of its `B` logits (with repeats, largest first; `top_k <= KM`) to
/// `part_top[p * KM ..]`, for [`sample_topk_mass`].
#[kernel(crate = tilefuse_dsl, B = [4096], KM = [64], num_warps = [8])]
pub fn sample_topk_part<const B: usize, const KM: usize>(
    logits: Ptr<f32>,
    iparams: Ptr<i32>,
    part_top: Ptr<f32>,
    n: i32,
) {
    let k = minimum(load(iparams), KM as i32);
    let i = program_id(0) * B + arange(0, B);
    let l = load(logits + i, i < n, f32::NEG_INFINITY);
    let mut v = select(l == l, l, f32::NEG_INFINITY);
    for j in (0..k).step_by(1) {
        store(part_top + program_id(0) * KM + j, v.max(0));
        v = select(arange(0, B) == v.argmax(0), f32::NEG_INFINITY, v);
    }
}

/// Sampling with top-k and top-p together, second pass (one program): the `top_k`
/// largest logits overall are the `top_k` largest of the programs' lists; their weight
/// `exp((logit - max) / T)` summed is the top-k mass `zk[0]` that [`sample_pick`]
/// measures the nucleus against. `F` covers `parts` lists of `KM`.
#[kernel(crate = tilefuse_dsl, F = [4096], KM = [64], num_warps = [8])]
pub fn sample_topk_mass<const F: usize, const KM: usize>(
    logits: Ptr<f32>,
    fparams: Ptr<f32>,
    iparams: Ptr<i32>,
    state: Ptr<i32>,
    part_top: Ptr<f32>,
    zk: Ptr<f32>,
    parts: i32,
) {
    let inv_t = 1.0 / load(fparams);
    let k = minimum(load(iparams), KM as i32);
    let m = load(logits + load(state));
    let f = arange(0, F);
    let ok = (f / KM < parts) & (f % KM < k);
    let mut v = load(part_top + f, ok, f32::NEG_INFINITY);
    let mut mass = 0.0;
    for j in (0..k).step_by(1) {
        let top = v.max(0);
        // Fewer than `k` valid logits: the rest weigh nothing.
        if top > f32::NEG_INFINITY {
            mass += exp((top - m) * inv_t);
        }
        v = select(f == v.argmax(0), f32::NEG_INFINITY, v);
    }
    store(zk, mass);
}
