//! Integer division by a constant as a multiply by a "magic number" (Granlund and
//! Montgomery, "Division by Invariant Integers using Multiplication", 1994; the
//! constants as in Hacker's Delight, chapter 10).
//!
//! ptxas assembles `div`/`rem` by an immediate into its general division routine (a
//! float reciprocal, multiplies and fix-ups: about 20 instructions for a 32-bit pair;
//! test `division_by_a_constant_is_a_multiply`). A
//! compiler in front of it has to do what LLVM does for nvcc and Triton: replace the
//! division by a high multiply and shifts. `signed` and `unsigned` compute the
//! constants; `Signed::divide` and `Unsigned::divide` (test builds) are the emitted instruction
//! sequences written out in Rust, one statement an instruction (`elementwise.rs` emits
//! the same steps), so the tests here check the sequences exhaustively against Rust's
//! `/` without a GPU.

/// The constants of a signed division by `d >= 2` in `w`-bit integers: `q =
/// mulhi(n, m)`, plus `n` when `add`, shifted right (arithmetically) by `shift`, plus
/// one for negative `n` (truncation toward zero).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Signed {
    /// The multiplier as a `w`-bit two's-complement value (sign-extended to `i64`).
    pub m: i64,
    /// Whether the dividend is added back after the high multiply (the multiplier
    /// needed `w` bits and reads as negative).
    pub add: bool,
    /// The arithmetic right shift after the multiply.
    pub shift: u32,
}

/// The constants of an unsigned division by `d >= 2` in `w`-bit integers: `q =
/// mulhi(n, m) >> shift`, or with `add` (the multiplier needed `w + 1` bits) `t =
/// mulhi(n, m)`, `q = (((n - t) >> 1) + t) >> (shift - 1)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unsigned {
    /// The low `w` bits of the multiplier.
    pub m: u64,
    /// Whether the multiplier's bit `w` is set (the add-and-halve fix-up).
    pub add: bool,
    /// The right shift after the multiply (at least 1 when `add`).
    pub shift: u32,
}

/// The signed constants for divisor `d` (`2 <= d < 2^(w-1)`) in `w`-bit integers, `w`
/// 32 or 64; `None` outside that range.
pub fn signed(d: i64, w: u32) -> Option<Signed> {
    if !(w == 32 || w == 64) || d < 2 || (w == 32 && d > i32::MAX as i64) {
        return None;
    }
    let ad = d as u128;
    let two = 1u128 << (w - 1);
    // |nc|: the largest dividend with `nc % d == d - 1`.
    let anc = two - 1 - two % ad;
    let mut p = w - 1;
    let (mut q1, mut r1) = (two / anc, two % anc);
    let (mut q2, mut r2) = (two / ad, two % ad);
    loop {
        p += 1;
        q1 *= 2;
        r1 *= 2;
        if r1 >= anc {
            q1 += 1;
            r1 -= anc;
        }
        q2 *= 2;
        r2 *= 2;
        if r2 >= ad {
            q2 += 1;
            r2 -= ad;
        }
        let delta = ad - r2;
        if !(q1 < delta || (q1 == delta && r1 == 0)) {
            break;
        }
    }
    let m = (q2 + 1) & ((1u128 << w) - 1);
    // Sign-extend the w-bit pattern.
    let m = if w == 32 {
        m as u32 as i32 as i64
    } else {
        m as u64 as i64
    };
    Some(Signed {
        m,
        add: m < 0,
        shift: p - w,
    })
}

/// The unsigned constants for divisor `d` (`2 <= d < 2^w`) in `w`-bit integers, `w` 32
/// or 64; `None` outside that range.
pub fn unsigned(d: u64, w: u32) -> Option<Unsigned> {
    if !(w == 32 || w == 64) || d < 2 || (w == 32 && d > u32::MAX as u64) {
        return None;
    }
    let d = d as u128;
    let two = 1u128 << (w - 1);
    let nc = (1u128 << w) - 1 - ((1u128 << w) - d) % d;
    let mut p = w - 1;
    let (mut q1, mut r1) = (two / nc, two % nc);
    let (mut q2, mut r2) = ((two - 1) / d, (two - 1) % d);
    let mut add = false;
    loop {
        p += 1;
        if r1 >= nc - r1 {
            q1 = 2 * q1 + 1;
            r1 = 2 * r1 - nc;
        } else {
            q1 *= 2;
            r1 *= 2;
        }
        if r2 + 1 >= d - r2 {
            if q2 >= two - 1 {
                add = true;
            }
            q2 = 2 * q2 + 1;
            r2 = 2 * r2 + 1 - d;
        } else {
            if q2 >= two {
                add = true;
            }
            q2 *= 2;
            r2 = 2 * r2 + 1;
        }
        let delta = d - 1 - r2;
        if !(p < 2 * w && (q1 < delta || (q1 == delta && r1 == 0))) {
            break;
        }
    }
    let m = ((q2 + 1) & ((1u128 << w) - 1)) as u64;
    Some(Unsigned {
        m,
        add,
        shift: p - w,
    })
}

#[cfg(test)]
impl Signed {
    /// `n / d` by the emitted steps, in `w`-bit integers (`n` sign-extended to `i64`).
    pub fn divide(self, n: i64, w: u32) -> i64 {
        let wrap = |v: i128| -> i64 {
            if w == 32 {
                v as i32 as i64
            } else {
                v as i64
            }
        };
        // mul.hi.s{w} q, n, m
        let mut q = wrap((n as i128 * self.m as i128) >> w);
        // add.s{w} q, q, n
        if self.add {
            q = wrap(q as i128 + n as i128);
        }
        // shr.s{w} q, q, shift
        q >>= self.shift;
        // shr.u{w} t, n, w - 1; add.s{w} q, q, t
        let t = if w == 32 {
            ((n as u32) >> 31) as i64
        } else {
            ((n as u64) >> 63) as i64
        };
        wrap(q as i128 + t as i128)
    }
}

#[cfg(test)]
impl Unsigned {
    /// `n / d` by the emitted steps, in `w`-bit integers.
    pub fn divide(self, n: u64, w: u32) -> u64 {
        // mul.hi.u{w} t, n, m
        let t = ((n as u128 * self.m as u128) >> w) as u64;
        if !self.add {
            // shr.u{w} q, t, shift
            return t >> self.shift;
        }
        // sub.u{w} q, n, t; shr.u{w} q, q, 1; add.u{w} q, q, t; shr.u{w} q, q, shift - 1
        (((n - t) >> 1) + t) >> (self.shift - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Rng;

    /// Dividends a division must get right: zero, the extremes, the multiples of `d`
    /// and their neighbours near zero and near the extremes, then seeded random ones.
    fn dividends(d: i128, lo: i128, hi: i128, r: &mut Rng) -> Vec<i128> {
        let mut n = vec![0, 1, -1, lo, lo + 1, hi, hi - 1, d, -d, d - 1, d + 1];
        for k in [1i128, 2, 3, 7, 1000] {
            for e in [-1, 0, 1] {
                n.push(k * d + e);
                n.push(-k * d + e);
                n.push(hi - hi % d - (k - 1) * d + e);
                n.push(lo - lo % d + (k - 1) * d + e);
            }
        }
        for _ in 0..400 {
            n.push(r.next_u64() as i128);
            n.push(r.next_u64() as i64 as i128);
            n.push(r.next_u64() as i32 as i128);
            n.push(r.next_u64() as u32 as i128);
            n.push((r.next_u64() as i64 >> (r.next_u64() % 64)) as i128);
        }
        n.into_iter().filter(|&v| v >= lo && v <= hi).collect()
    }

    /// Divisors: every one up to 3000, the neighbours of powers of two, and seeded
    /// random ones of every magnitude up to `max`.
    fn divisors(max: u64, r: &mut Rng) -> Vec<u64> {
        let mut d: Vec<u64> = (2..3000).collect();
        for k in 2..64 {
            for e in [-1i64, 1] {
                d.push(((1u128 << k) as i128 + e as i128) as u64);
            }
        }
        d.extend([641, 6700417, 274177, 67280421310721, 1_000_000_007, 3 << 29]);
        for _ in 0..3000 {
            d.push(r.next_u64() >> (r.next_u64() % 64));
        }
        d.retain(|&v| v >= 2 && v <= max);
        d
    }

    #[test]
    fn signed_division_matches_rust() {
        let mut r = Rng(0x9e37_79b9_7f4a_7c15);
        for (w, min, max) in [
            (32, i32::MIN as i64, i32::MAX as i64),
            (64, i64::MIN, i64::MAX),
        ] {
            for d in divisors(max as u64, &mut r) {
                let s = signed(d as i64, w).expect("in range");
                for n in dividends(d as i128, min as i128, max as i128, &mut r) {
                    // In range of the width: the quotient is the same in i64.
                    let n = n as i64;
                    assert_eq!(s.divide(n, w), n / d as i64, "{n} / {d} ({w} bits): {s:?}");
                }
            }
        }
    }

    #[test]
    fn unsigned_division_matches_rust() {
        let mut r = Rng(0xdead_beef_1234_5678);
        for (w, max) in [(32, u32::MAX as u64), (64, u64::MAX)] {
            for d in divisors(max, &mut r) {
                let u = unsigned(d, w).expect("in range");
                for n in dividends(d as i128, 0, max as i128, &mut r) {
                    let n = n as u64;
                    assert_eq!(u.divide(n, w), n / d, "{n} / {d} ({w} bits): {u:?}");
                }
            }
        }
    }

    /// Every 32-bit dividend for a few divisors, the hardest cases included (the
    /// multipliers that need the add: 7 signed and unsigned, 641 unsigned).
    #[test]
    fn every_32_bit_dividend_for_small_divisors() {
        for d in [3i64, 7, 641] {
            let s = signed(d, 32).unwrap();
            let u = unsigned(d as u64, 32).unwrap();
            let mut n: u32 = 0;
            loop {
                assert_eq!(s.divide(n as i32 as i64, 32), (n as i32 / d as i32) as i64);
                assert_eq!(u.divide(n as u64, 32), n as u64 / d as u64);
                n = n.wrapping_add(4093);
                if n < 4093 {
                    break;
                }
            }
        }
    }

    /// The textbook constants (Hacker's Delight, table 10-1 and 10-2).
    #[test]
    fn known_constants() {
        assert_eq!(
            signed(3, 32),
            Some(Signed {
                m: 0x5555_5556,
                add: false,
                shift: 0
            })
        );
        assert_eq!(
            signed(7, 32),
            Some(Signed {
                m: 0x9249_2493u32 as i32 as i64,
                add: true,
                shift: 2
            })
        );
        assert_eq!(
            unsigned(3, 32),
            Some(Unsigned {
                m: 0xAAAA_AAAB,
                add: false,
                shift: 1
            })
        );
        assert_eq!(
            unsigned(7, 32),
            Some(Unsigned {
                m: 0x2492_4925,
                add: true,
                shift: 3
            })
        );
        assert_eq!(signed(1, 32), None);
        assert_eq!(signed(1 << 31, 32), None);
        assert_eq!(unsigned(1 << 32, 32), None);
    }
}
