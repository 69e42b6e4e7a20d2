//! Reference semantics of the scans, the layout changes (`permute`, `reshape`),
//! `histogram` and the Philox random numbers.
//!
//! - `cumsum` / `cumprod` are inclusive, left to right along the axis; floats run in
//!   `f32` (for `f16`/`bf16` too) and each output rounds once to the dtype; integers wrap.
//! - `permute(x, dims)`: result axis `t` is `x`'s axis `dims[t]`; `reshape` keeps the
//!   row-major order of the elements.
//! - `histogram(x, BINS, mask)`: the number of lanes (where `mask` holds) equal to each of
//!   `0..BINS`, as `i32`; values outside that range count nowhere.
//! - `randint(seed, offset)` is the first word of Philox4x32-10 with counter
//!   `(offset, 0, 0, 0)` and key `(seed as u64) & 0xffffffff, (seed as u64) >> 32` (a
//!   signed seed sign-extends), as Triton's `tl.randint`. `rand` maps that word `w` to
//!   `f32`: `i = w as i32`, `i = !i` when negative, `i as f32 * 4.6566127342e-10`, in
//!   `[0, 1)`. `randn` is the Box-Muller transform of the `rand` mappings `u1`, `u2` of
//!   the first two words: `sqrt(-2 ln max(u1, 1e-7)) * cos(2π u2)`, in `f32`.

use super::ops::{round_f, wrap_i, Data, OpResult};
use crate::ir::{DType, RandOp, ScanOp};

/// Inclusive scan of a tile of `shape` along `axis`.
pub(crate) fn scan(op: ScanOp, d: DType, a: &Data, shape: &[usize], axis: usize) -> OpResult<Data> {
    if axis >= shape.len() || a.len() != shape.iter().product::<usize>() {
        return Err(format!(
            "scan along axis {axis} of {} elements as shape {shape:?}",
            a.len()
        ));
    }
    let n = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let outer: usize = shape[..axis].iter().product();
    fn each<T: Copy>(v: &mut [T], (outer, n, inner): (usize, usize, usize), f: impl Fn(T, T) -> T) {
        for o in 0..outer {
            for i in 0..inner {
                let base = o * n * inner + i;
                for j in 1..n {
                    v[base + j * inner] = f(v[base + (j - 1) * inner], v[base + j * inner]);
                }
            }
        }
    }
    let dims = (outer, n, inner);
    Ok(match a {
        Data::F(x) => {
            let mut acc = x.clone();
            match op {
                ScanOp::Sum => each(&mut acc, dims, |s, p| s + p),
                ScanOp::Prod => each(&mut acc, dims, |s, p| s * p),
            }
            // The running value stays in f32; each output rounds once.
            Data::F(acc.into_iter().map(|x| round_f(d, x)).collect())
        }
        Data::I(x) => {
            let mut acc = x.clone();
            match op {
                ScanOp::Sum => each(&mut acc, dims, |s, p| wrap_i(d, s.wrapping_add(p))),
                ScanOp::Prod => each(&mut acc, dims, |s, p| wrap_i(d, s.wrapping_mul(p))),
            }
            Data::I(acc)
        }
        other => return Err(format!("scan of a {} tile", other.kind())),
    })
}

/// The input index of every output element of `permute(x, dims)`, `x` of `shape`.
pub(crate) fn permute_index(shape: &[usize], dims: &[usize]) -> OpResult<Vec<usize>> {
    let rank = shape.len();
    if dims.len() != rank || dims.iter().any(|&d| d >= rank) {
        return Err(format!("permute of a {shape:?} tile by {dims:?}"));
    }
    let mut stride = vec![1usize; rank];
    for t in (0..rank.saturating_sub(1)).rev() {
        stride[t] = stride[t + 1] * shape[t + 1];
    }
    let out_shape: Vec<usize> = dims.iter().map(|&d| shape[d]).collect();
    let total: usize = shape.iter().product();
    let mut idx = vec![0usize; rank];
    let mut out = Vec::with_capacity(total);
    for _ in 0..total {
        out.push((0..rank).map(|t| idx[t] * stride[dims[t]]).sum());
        for t in (0..rank).rev() {
            idx[t] += 1;
            if idx[t] < out_shape[t] {
                break;
            }
            idx[t] = 0;
        }
    }
    Ok(out)
}

/// Counts of each value in `0..bins` among the lanes where `mask` holds.
pub(crate) fn histogram(a: &Data, bins: usize, mask: Option<&[bool]>) -> OpResult<Data> {
    let Data::I(x) = a else {
        return Err(format!("histogram of a {} tile", a.kind()));
    };
    let mut counts = vec![0i64; bins];
    for (j, &v) in x.iter().enumerate() {
        if mask.is_none_or(|m| m[j]) && (0..bins as i64).contains(&v) {
            counts[v as usize] += 1;
        }
    }
    Ok(Data::I(counts))
}

/// Philox4x32 multipliers and key increments (Salmon et al., "Parallel random numbers:
/// as easy as 1, 2, 3", SC 2011).
pub(crate) const PHILOX_M0: u32 = 0xD251_1F53;
pub(crate) const PHILOX_M1: u32 = 0xCD9E_8D57;
pub(crate) const PHILOX_W0: u32 = 0x9E37_79B9;
pub(crate) const PHILOX_W1: u32 = 0xBB67_AE85;

/// Philox4x32 with 10 rounds: the four output words of counter `c` under key `k`.
pub(crate) fn philox4x32_10(mut c: [u32; 4], mut k: [u32; 2]) -> [u32; 4] {
    for _ in 0..10 {
        let p0 = (PHILOX_M0 as u64) * (c[0] as u64);
        let p1 = (PHILOX_M1 as u64) * (c[2] as u64);
        c = [
            ((p1 >> 32) as u32) ^ c[1] ^ k[0],
            p1 as u32,
            ((p0 >> 32) as u32) ^ c[3] ^ k[1],
            p0 as u32,
        ];
        k = [k[0].wrapping_add(PHILOX_W0), k[1].wrapping_add(PHILOX_W1)];
    }
    c
}

/// The scale of [`uniform`]: Triton's `4.6566127342e-10` as an `f32`, just below
/// 2^-31, so that `i32::MAX` maps below 1.
pub(crate) const UNIFORM_SCALE: f32 = f32::from_bits(0x2fff_ffff);

/// A Philox word as a uniform `f32` in `[0, 1)` (Triton's `uint_to_uniform_float`).
pub(crate) fn uniform(w: u32) -> f32 {
    let i = w as i32;
    let i = if i < 0 { !i } else { i };
    i as f32 * UNIFORM_SCALE
}

/// One standard normal from two Philox words (Box-Muller, Triton's `randn`).
pub(crate) fn normal(w0: u32, w1: u32) -> f32 {
    let u1 = uniform(w0).max(1.0e-7);
    let th = std::f32::consts::TAU * uniform(w1);
    (-2.0 * u1.ln()).sqrt() * th.cos()
}

/// `rand`, `randn` or `randint` of every offset under `seed`.
pub(crate) fn rand(op: RandOp, seed: &Data, offset: &Data) -> OpResult<Data> {
    let (Data::I(s), Data::I(o)) = (seed, offset) else {
        return Err("random draws need an integer seed and integer offsets".into());
    };
    let Some(&s) = s.first().filter(|_| s.len() == 1) else {
        return Err(format!("the seed has {} elements", s.len()));
    };
    let s = s as u64;
    let key = [s as u32, (s >> 32) as u32];
    let words = o.iter().map(|&x| philox4x32_10([x as u32, 0, 0, 0], key));
    Ok(match op {
        RandOp::Int => Data::I(words.map(|w| w[0] as i64).collect()),
        RandOp::Uniform => Data::F(words.map(|w| uniform(w[0])).collect()),
        RandOp::Normal => Data::F(words.map(|w| normal(w[0], w[1])).collect()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The known-answer vectors of Philox4x32-10 published with Random123
    /// (`kat_vectors`): zeros, all ones, and the digits of pi.
    #[test]
    fn philox_matches_the_random123_known_answers() {
        let cases: [([u32; 4], [u32; 2], [u32; 4]); 3] = [
            (
                [0; 4],
                [0; 2],
                [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8],
            ),
            (
                [u32::MAX; 4],
                [u32::MAX; 2],
                [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd],
            ),
            (
                [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
                [0xa409_3822, 0x299f_31d0],
                [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1],
            ),
        ];
        for (ctr, key, want) in cases {
            assert_eq!(
                philox4x32_10(ctr, key),
                want,
                "counter {ctr:x?} key {key:x?}"
            );
        }
    }

    #[test]
    fn uniform_stays_in_the_unit_interval() {
        for w in [0u32, 1, 0x7fff_ffff, 0x8000_0000, u32::MAX, 0x1234_5678] {
            let u = uniform(w);
            assert!((0.0..1.0).contains(&u), "{w:#x} -> {u}");
        }
        // Symmetric around the sign bit: w and !w give the same value.
        assert_eq!(uniform(5), uniform(!5));
    }

    #[test]
    fn permute_index_transposes() {
        // [2, 3] -> [3, 2]: out[j][i] = in[i][j].
        assert_eq!(
            permute_index(&[2, 3], &[1, 0]).unwrap(),
            vec![0, 3, 1, 4, 2, 5]
        );
        assert_eq!(
            permute_index(&[2, 3], &[0, 1]).unwrap(),
            (0..6).collect::<Vec<_>>()
        );
    }
}
