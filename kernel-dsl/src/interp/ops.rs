//! Whole-tile operations on interpreter values: one dtype dispatch per operation, then a
//! tight loop over the elements. Errors are plain messages; the executor adds the kernel
//! name and program id.

use crate::ir::{BinaryOp, CmpOp, DType, ReduceOp, UnaryOp};
use half::{bf16, f16};

/// The elements of one tile (or scalar), in row-major order.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Data {
    /// `f32`, and `f16`/`bf16` values already rounded to their dtype.
    F(Vec<f32>),
    /// Integers, normalized to their dtype's range (`u8`/`u32` non-negative, `i32`
    /// sign-extended).
    I(Vec<i64>),
    /// `bool`.
    B(Vec<bool>),
    /// Pointers: (parameter index, element offset) per lane.
    P(Vec<(usize, i64)>),
}

pub(crate) type OpResult<T> = Result<T, String>;

/// Tiles of one kind laid end to end (row-major stacking along a new leading axis).
pub(crate) fn concat(parts: Vec<Data>) -> OpResult<Data> {
    let mut it = parts.into_iter();
    let Some(mut out) = it.next() else {
        return Err("nothing to stack".into());
    };
    for p in it {
        match (&mut out, p) {
            (Data::F(a), Data::F(b)) => a.extend(b),
            (Data::I(a), Data::I(b)) => a.extend(b),
            (Data::B(a), Data::B(b)) => a.extend(b),
            (Data::P(a), Data::P(b)) => a.extend(b),
            (a, b) => {
                return Err(format!(
                    "cannot stack {} values with {} values",
                    a.kind(),
                    b.kind()
                ))
            }
        }
    }
    Ok(out)
}

impl Data {
    /// Number of elements.
    pub(crate) fn len(&self) -> usize {
        match self {
            Data::F(v) => v.len(),
            Data::I(v) => v.len(),
            Data::B(v) => v.len(),
            Data::P(v) => v.len(),
        }
    }

    /// The elements at `idx`, in order (broadcasts, splats, transposed views).
    pub(crate) fn gather(&self, idx: &[usize]) -> Data {
        fn g<T: Copy>(v: &[T], idx: &[usize]) -> Vec<T> {
            idx.iter().map(|&i| v[i]).collect()
        }
        match self {
            Data::F(v) => Data::F(g(v, idx)),
            Data::I(v) => Data::I(g(v, idx)),
            Data::B(v) => Data::B(g(v, idx)),
            Data::P(v) => Data::P(g(v, idx)),
        }
    }

    /// A tile of `n` copies of a one-element value.
    pub(crate) fn splat(&self, n: usize) -> OpResult<Data> {
        if self.len() != 1 {
            return Err(format!("splat of a value with {} elements", self.len()));
        }
        Ok(match self {
            Data::F(v) => Data::F(vec![v[0]; n]),
            Data::I(v) => Data::I(vec![v[0]; n]),
            Data::B(v) => Data::B(vec![v[0]; n]),
            Data::P(v) => Data::P(vec![v[0]; n]),
        })
    }

    /// Zeros of a dtype.
    pub(crate) fn zeros(d: DType, n: usize) -> Data {
        match d {
            DType::Bool => Data::B(vec![false; n]),
            d if d.is_float() => Data::F(vec![0.0; n]),
            _ => Data::I(vec![0; n]),
        }
    }

    /// What kind of data this is, for messages.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Data::F(_) => "float",
            Data::I(_) => "integer",
            Data::B(_) => "bool",
            Data::P(_) => "pointer",
        }
    }
}

/// Rounds an `f32` to `d` (identity for `f32`); `d` is a float dtype.
pub(crate) fn round_f(d: DType, x: f32) -> f32 {
    match d {
        DType::F16 => f16::from_f32(x).to_f32(),
        DType::BF16 => bf16::from_f32(x).to_f32(),
        _ => x,
    }
}

/// Rounds every element to `d` in place.
pub(crate) fn round_vec(d: DType, v: &mut [f32]) {
    match d {
        DType::F16 => v.iter_mut().for_each(|x| *x = f16::from_f32(*x).to_f32()),
        DType::BF16 => v.iter_mut().for_each(|x| *x = bf16::from_f32(*x).to_f32()),
        _ => {}
    }
}

/// Wraps an integer to `d`'s range (two's complement).
pub(crate) fn wrap_i(d: DType, x: i64) -> i64 {
    match d {
        DType::U8 => x as u8 as i64,
        DType::I32 => x as i32 as i64,
        DType::U32 => x as u32 as i64,
        _ => x,
    }
}

fn wrap_vec(d: DType, v: &mut [i64]) {
    match d {
        DType::U8 => v.iter_mut().for_each(|x| *x = *x as u8 as i64),
        DType::I32 => v.iter_mut().for_each(|x| *x = *x as i32 as i64),
        DType::U32 => v.iter_mut().for_each(|x| *x = *x as u32 as i64),
        _ => {}
    }
}

fn bits(d: DType) -> u64 {
    (d.size_bytes() * 8) as u64
}

/// An `f64` rounded once (to nearest even) to a float dtype, as an `f32`.
///
/// Going through `f32` with round-to-odd keeps the final rounding exact: `f32` has more
/// than two extra bits over `f16`/`bf16`, so the intermediate never creates a false tie.
pub(crate) fn f64_to_float(d: DType, x: f64) -> f32 {
    let r = x as f32;
    if d == DType::F32 || x.is_nan() || r as f64 == x || r.is_infinite() {
        return round_f(d, r);
    }
    let bits = r.to_bits();
    let odd = if bits & 1 == 1 {
        r
    } else if x.abs() > (r as f64).abs() {
        f32::from_bits(bits + 1)
    } else {
        f32::from_bits(bits - 1)
    };
    round_f(d, odd)
}

/// An integer rounded once (to nearest even) to a float dtype, as an `f32`.
pub(crate) fn int_to_float(d: DType, x: i64) -> f32 {
    let keep = match d {
        DType::F16 => 11,
        DType::BF16 => 8,
        _ => return x as f32,
    };
    let mut m = x.unsigned_abs();
    let width = 64 - m.leading_zeros();
    let mut shift = 0;
    if width > keep {
        // Round the magnitude to `keep` significant bits in integer arithmetic; the
        // result is exact in f32, so the final conversion only handles overflow.
        shift = width - keep;
        let low = m & ((1u64 << shift) - 1);
        let half = 1u64 << (shift - 1);
        m >>= shift;
        if low > half || (low == half && m & 1 == 1) {
            m += 1;
        }
    }
    let mag = m as f32 * (shift as f32).exp2();
    round_f(d, if x < 0 { -mag } else { mag })
}

/// `f32` to an integer dtype: truncate toward zero, saturate, NaN to 0.
fn float_to_int(d: DType, x: f32) -> i64 {
    match d {
        DType::U8 => x as u8 as i64,
        DType::I32 => x as i32 as i64,
        DType::U32 => x as u32 as i64,
        _ => x as i64,
    }
}

fn zip<T: Copy, U>(a: &[T], b: &[T], f: impl Fn(T, T) -> U) -> Vec<U> {
    a.iter().zip(b).map(|(&x, &y)| f(x, y)).collect()
}

fn same_len(a: &Data, b: &Data) -> OpResult<()> {
    if a.len() != b.len() {
        return Err(format!(
            "operands have {} and {} elements",
            a.len(),
            b.len()
        ));
    }
    Ok(())
}

/// Elementwise binary operation on two tiles of dtype `d`.
pub(crate) fn binary(op: BinaryOp, d: DType, a: &Data, b: &Data) -> OpResult<Data> {
    use BinaryOp::*;
    same_len(a, b)?;
    match (a, b) {
        (Data::F(x), Data::F(y)) => {
            let mut out = match op {
                Add => zip(x, y, |p, q| p + q),
                Sub => zip(x, y, |p, q| p - q),
                Mul => zip(x, y, |p, q| p * q),
                Div => zip(x, y, |p, q| p / q),
                Rem => zip(x, y, |p, q| p % q),
                Max => zip(x, y, f32::max),
                Min => zip(x, y, f32::min),
                And | Or | Xor | Shl | Shr => {
                    return Err(format!("`{op:?}` needs integer operands, not {d}"))
                }
            };
            round_vec(d, &mut out);
            Ok(Data::F(out))
        }
        (Data::I(x), Data::I(y)) => {
            let mut out = match op {
                Add => zip(x, y, i64::wrapping_add),
                Sub => zip(x, y, i64::wrapping_sub),
                Mul => zip(x, y, i64::wrapping_mul),
                Div | Rem => {
                    if y.contains(&0) {
                        return Err(format!(
                            "integer {} by zero",
                            if op == Div { "division" } else { "remainder" }
                        ));
                    }
                    if op == Div {
                        zip(x, y, i64::wrapping_div)
                    } else {
                        zip(x, y, i64::wrapping_rem)
                    }
                }
                And => zip(x, y, |p, q| p & q),
                Or => zip(x, y, |p, q| p | q),
                Xor => zip(x, y, |p, q| p ^ q),
                Max => zip(x, y, i64::max),
                Min => zip(x, y, i64::min),
                Shl | Shr => {
                    let w = bits(d);
                    // The amount is read as unsigned of the operand's width (as PTX does).
                    let mask = if w == 64 { u64::MAX } else { (1u64 << w) - 1 };
                    let amt = |q: i64| (q as u64) & mask;
                    if op == Shl {
                        zip(x, y, |p, q| {
                            let s = amt(q);
                            if s >= w {
                                0
                            } else {
                                ((p as u64) << s) as i64
                            }
                        })
                    } else if d.is_signed_int() {
                        zip(x, y, |p, q| {
                            let s = amt(q);
                            if s >= w {
                                if p < 0 {
                                    -1
                                } else {
                                    0
                                }
                            } else {
                                p >> s
                            }
                        })
                    } else {
                        zip(x, y, |p, q| {
                            let s = amt(q);
                            if s >= w {
                                0
                            } else {
                                ((p as u64) >> s) as i64
                            }
                        })
                    }
                }
            };
            wrap_vec(d, &mut out);
            Ok(Data::I(out))
        }
        (Data::B(x), Data::B(y)) => Ok(Data::B(match op {
            And | Min => zip(x, y, |p, q| p & q),
            Or | Max => zip(x, y, |p, q| p | q),
            Xor => zip(x, y, |p, q| p ^ q),
            _ => return Err(format!("`{op:?}` is not defined on bool")),
        })),
        _ => Err(format!(
            "`{op:?}` on {} and {} operands",
            a.kind(),
            b.kind()
        )),
    }
}

/// Elementwise comparison.
pub(crate) fn compare(op: CmpOp, a: &Data, b: &Data) -> OpResult<Data> {
    fn cmp<T: Copy + PartialOrd>(op: CmpOp, x: &[T], y: &[T]) -> Vec<bool> {
        match op {
            CmpOp::Eq => zip(x, y, |p, q| p == q),
            CmpOp::Ne => zip(x, y, |p, q| p != q),
            CmpOp::Lt => zip(x, y, |p, q| p < q),
            CmpOp::Le => zip(x, y, |p, q| p <= q),
            CmpOp::Gt => zip(x, y, |p, q| p > q),
            CmpOp::Ge => zip(x, y, |p, q| p >= q),
        }
    }
    same_len(a, b)?;
    Ok(Data::B(match (a, b) {
        (Data::F(x), Data::F(y)) => cmp(op, x, y),
        (Data::I(x), Data::I(y)) => cmp(op, x, y),
        (Data::B(x), Data::B(y)) => cmp(op, x, y),
        (Data::P(x), Data::P(y)) => cmp(op, x, y),
        _ => {
            return Err(format!(
                "comparison of {} and {} operands",
                a.kind(),
                b.kind()
            ))
        }
    }))
}

/// Elementwise unary operation on a tile of dtype `d`.
pub(crate) fn unary(op: UnaryOp, d: DType, a: &Data) -> OpResult<Data> {
    use UnaryOp::*;
    fn map<T: Copy, U>(v: &[T], f: impl Fn(T) -> U) -> Vec<U> {
        v.iter().map(|&x| f(x)).collect()
    }
    match a {
        Data::F(x) => {
            let mut out = match op {
                Neg => map(x, |p| -p),
                Exp => map(x, f32::exp),
                Exp2 => map(x, f32::exp2),
                Log => map(x, f32::ln),
                Log2 => map(x, f32::log2),
                Sqrt => map(x, f32::sqrt),
                Rsqrt => map(x, |p| 1.0 / p.sqrt()),
                Sin => map(x, f32::sin),
                Cos => map(x, f32::cos),
                Abs => map(x, f32::abs),
                Sigmoid => map(x, |p| 1.0 / (1.0 + (-p).exp())),
                Tanh => map(x, f32::tanh),
                Floor => map(x, f32::floor),
                Ceil => map(x, f32::ceil),
                Not => return Err(format!("`Not` is not defined on {d}")),
            };
            round_vec(d, &mut out);
            Ok(Data::F(out))
        }
        Data::I(x) => {
            let mut out = match op {
                Neg => map(x, i64::wrapping_neg),
                Not => map(x, |p| !p),
                Abs => map(x, i64::wrapping_abs),
                _ => return Err(format!("`{op:?}` needs a float operand, not {d}")),
            };
            wrap_vec(d, &mut out);
            Ok(Data::I(out))
        }
        Data::B(x) if op == Not => Ok(Data::B(map(x, |p| !p))),
        _ => Err(format!("`{op:?}` on a {} operand", a.kind())),
    }
}

/// Converts a tile of dtype `from` to dtype `to` (the rules of design.md).
pub(crate) fn cast(a: &Data, from: DType, to: DType) -> OpResult<Data> {
    Ok(match a {
        Data::F(x) => match to {
            DType::Bool => Data::B(x.iter().map(|&p| p != 0.0).collect()),
            t if t.is_float() => {
                let mut out = x.clone();
                round_vec(t, &mut out);
                Data::F(out)
            }
            t => Data::I(x.iter().map(|&p| float_to_int(t, p)).collect()),
        },
        Data::I(x) => match to {
            DType::Bool => Data::B(x.iter().map(|&p| p != 0).collect()),
            t if t.is_float() => Data::F(x.iter().map(|&p| int_to_float(t, p)).collect()),
            t => Data::I(x.iter().map(|&p| wrap_i(t, p)).collect()),
        },
        Data::B(x) => match to {
            DType::Bool => Data::B(x.clone()),
            t if t.is_float() => Data::F(x.iter().map(|&p| p as u8 as f32).collect()),
            _ => Data::I(x.iter().map(|&p| p as i64).collect()),
        },
        Data::P(_) => return Err(format!("cast of a pointer (to {to}) from {from}")),
    })
}

/// `dot4(a, b, acc)`: per element, `acc` plus the products of the four byte pairs of
/// `a` and `b` (each signed when its flag is set, else unsigned), wrapping in `i32`.
pub(crate) fn dot4(a: (&Data, bool), b: (&Data, bool), acc: &Data) -> OpResult<Data> {
    let (Data::I(x), Data::I(y), Data::I(c)) = (a.0, b.0, acc) else {
        return Err("dot4 of non-integer values".into());
    };
    if x.len() != y.len() || x.len() != c.len() {
        return Err(format!(
            "dot4 of {}, {} and {} elements",
            x.len(),
            y.len(),
            c.len()
        ));
    }
    let byte = |w: i64, j: u32, signed: bool| -> i64 {
        let v = ((w as u32) >> (8 * j)) & 0xFF;
        if signed {
            v as u8 as i8 as i64
        } else {
            v as i64
        }
    };
    Ok(Data::I(
        x.iter()
            .zip(y)
            .zip(c)
            .map(|((&p, &q), &s)| {
                let d: i64 = (0..4).map(|j| byte(p, j, a.1) * byte(q, j, b.1)).sum();
                (s as i32).wrapping_add(d as i32) as i64
            })
            .collect(),
    ))
}

/// `byte_perm(a, b, sel)`: per element, byte `n` of the result is byte `(sel >> 4n) & 7`
/// of `b:a` (CUDA's `__byte_perm`), read back as `i32` when `signed`, else `u32`.
pub(crate) fn byte_perm(a: &Data, b: &Data, sel: &Data, signed: bool) -> OpResult<Data> {
    let (Data::I(x), Data::I(y), Data::I(s)) = (a, b, sel) else {
        return Err("byte_perm of non-integer values".into());
    };
    if x.len() != y.len() || x.len() != s.len() {
        return Err(format!(
            "byte_perm of {}, {} and {} elements",
            x.len(),
            y.len(),
            s.len()
        ));
    }
    Ok(Data::I(
        x.iter()
            .zip(y)
            .zip(s)
            .map(|((&p, &q), &s)| {
                let bytes = ((q as u32 as u64) << 32) | p as u32 as u64;
                let r = (0..4).fold(0u32, |r, n| {
                    let i = (s as u32 >> (4 * n)) & 7;
                    r | (((bytes >> (8 * i)) & 0xFF) as u32) << (8 * n)
                });
                if signed {
                    r as i32 as i64
                } else {
                    r as i64
                }
            })
            .collect(),
    ))
}

/// The `f32` holding the `f16` or `bf16` (`d`) with bits `b`, exactly: NaNs keep their
/// payload and stay signaling (the `half` conversions quiet them; a GPU register does
/// not), so a bitcast, load or store moves every bit as the GPU does.
pub(crate) fn half_to_f32(d: DType, b: u16) -> f32 {
    let sign = ((b & 0x8000) as u32) << 16;
    match d {
        DType::F16 if b & 0x7C00 == 0x7C00 && b & 0x03FF != 0 => {
            f32::from_bits(sign | 0x7F80_0000 | (((b & 0x03FF) as u32) << 13))
        }
        DType::F16 => f16::from_bits(b).to_f32(),
        _ => f32::from_bits((b as u32) << 16),
    }
}

/// The bits of `x` rounded to `f16` or `bf16` (`d`); a NaN keeps the top of its payload
/// and its quiet bit, the inverse of [`half_to_f32`].
pub(crate) fn f32_to_half(d: DType, x: f32) -> u16 {
    if !x.is_nan() {
        return match d {
            DType::F16 => f16::from_f32(x).to_bits(),
            _ => bf16::from_f32(x).to_bits(),
        };
    }
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let (exp, man) = match d {
        DType::F16 => (0x7C00, ((b >> 13) & 0x03FF) as u16),
        _ => (0x7F80, ((b >> 16) & 0x007F) as u16),
    };
    // A payload only in the dropped bits would read as an infinity.
    sign | exp | man.max(1)
}

/// The bits of one element of dtype `d` (`f16`/`bf16` as their 16-bit patterns).
fn bits_of_f(d: DType, x: f32) -> u32 {
    match d {
        DType::F16 | DType::BF16 => f32_to_half(d, x) as u32,
        _ => x.to_bits(),
    }
}

/// The float of dtype `d` with the bits `b`.
fn f_of_bits(d: DType, b: u32) -> f32 {
    match d {
        DType::F16 | DType::BF16 => half_to_f32(d, b as u16),
        _ => f32::from_bits(b),
    }
}

/// Reinterprets a tile of dtype `from` as dtype `to` of the same width (`i32`, `u32`
/// and `f32` among themselves; `f16` and `bf16`): the bits are kept, NaN payloads
/// included.
pub(crate) fn bitcast(a: &Data, from: DType, to: DType) -> OpResult<Data> {
    if from.size_bytes() != to.size_bytes() || from == DType::Bool || to == DType::Bool {
        return Err(format!("bitcast from {from} to {to}"));
    }
    let bits: Vec<u32> = match a {
        Data::F(x) => x.iter().map(|&p| bits_of_f(from, p)).collect(),
        Data::I(x) if from.size_bytes() == 4 => x.iter().map(|&p| p as u32).collect(),
        Data::I(x) if from == to => return Ok(Data::I(x.clone())),
        _ => {
            return Err(format!(
                "bitcast of {} values from {from} to {to}",
                a.kind()
            ))
        }
    };
    Ok(match to {
        t if t.is_float() => Data::F(bits.into_iter().map(|b| f_of_bits(t, b)).collect()),
        DType::I32 => Data::I(bits.into_iter().map(|b| b as i32 as i64).collect()),
        DType::U32 => Data::I(bits.into_iter().map(|b| b as i64).collect()),
        _ => return Err(format!("bitcast from {from} to {to}")),
    })
}

/// Reduces a tile of `shape` and dtype `d` along `axis`; the result drops the axis.
pub(crate) fn reduce(
    op: ReduceOp,
    d: DType,
    a: &Data,
    shape: &[usize],
    axis: usize,
) -> OpResult<Data> {
    if axis >= shape.len() {
        return Err(format!(
            "reduce along axis {axis} of a rank-{} tile",
            shape.len()
        ));
    }
    let outer: usize = shape[..axis].iter().product();
    let n = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    if outer * n * inner != a.len() {
        return Err(format!("reduce of {} elements as shape {shape:?}", a.len()));
    }
    if n == 0 {
        return Err("reduce along an empty axis".into());
    }
    // Calls `f` with the lanes of each output element, in output order.
    fn each<T: Copy, U>(
        v: &[T],
        (outer, n, inner): (usize, usize, usize),
        mut f: impl FnMut(&mut dyn Iterator<Item = T>) -> U,
    ) -> Vec<U> {
        let mut out = Vec::with_capacity(outer * inner);
        for o in 0..outer {
            for i in 0..inner {
                let base = o * n * inner + i;
                let mut it = (0..n).map(|j| v[base + j * inner]);
                out.push(f(&mut it));
            }
        }
        out
    }
    let dims = (outer, n, inner);
    fn argmax_by<T: Copy>(
        it: &mut dyn Iterator<Item = T>,
        gt: impl Fn(T, T) -> bool,
        skip: impl Fn(T) -> bool,
    ) -> i64 {
        let mut best: Option<(usize, T)> = None;
        for (j, x) in it.enumerate() {
            if skip(x) {
                continue;
            }
            match best {
                Some((_, b)) if !gt(x, b) => {}
                _ => best = Some((j, x)),
            }
        }
        best.map_or(0, |(j, _)| j as i64)
    }
    Ok(match (op, a) {
        (ReduceOp::Argmax, Data::F(x)) => {
            Data::I(each(x, dims, |it| argmax_by(it, |p, q| p > q, f32::is_nan)))
        }
        (ReduceOp::Argmax, Data::I(x)) => {
            Data::I(each(x, dims, |it| argmax_by(it, |p, q| p > q, |_| false)))
        }
        (ReduceOp::Argmin, Data::F(x)) => {
            Data::I(each(x, dims, |it| argmax_by(it, |p, q| p < q, f32::is_nan)))
        }
        (ReduceOp::Argmin, Data::I(x)) => {
            Data::I(each(x, dims, |it| argmax_by(it, |p, q| p < q, |_| false)))
        }
        (ReduceOp::Sum, Data::F(x)) => {
            // f32 accumulation for every float dtype; one rounding at the end.
            let mut out = each(x, dims, |it| it.fold(0.0f32, |s, p| s + p));
            round_vec(d, &mut out);
            Data::F(out)
        }
        (ReduceOp::Max, Data::F(x)) => {
            Data::F(each(x, dims, |it| it.reduce(f32::max).unwrap_or(f32::NAN)))
        }
        (ReduceOp::Min, Data::F(x)) => {
            Data::F(each(x, dims, |it| it.reduce(f32::min).unwrap_or(f32::NAN)))
        }
        (ReduceOp::Sum, Data::I(x)) => Data::I(each(x, dims, |it| {
            wrap_i(d, it.fold(0i64, i64::wrapping_add))
        })),
        (ReduceOp::Max, Data::I(x)) => Data::I(each(x, dims, |it| it.max().unwrap_or(0))),
        (ReduceOp::Min, Data::I(x)) => Data::I(each(x, dims, |it| it.min().unwrap_or(0))),
        (ReduceOp::Max, Data::B(x)) => Data::B(each(x, dims, |it| it.fold(false, |s, p| s | p))),
        (ReduceOp::Min, Data::B(x)) => Data::B(each(x, dims, |it| it.fold(true, |s, p| s & p))),
        _ => return Err(format!("`{op:?}` reduction of a {} tile", a.kind())),
    })
}

/// The elements as `f32` (for `dot`).
pub(crate) fn to_f32(a: &Data) -> OpResult<std::borrow::Cow<'_, [f32]>> {
    use std::borrow::Cow;
    Ok(match a {
        Data::F(x) => Cow::Borrowed(x.as_slice()),
        Data::I(x) => Cow::Owned(x.iter().map(|&p| p as f32).collect()),
        Data::B(x) => Cow::Owned(x.iter().map(|&p| p as u8 as f32).collect()),
        Data::P(_) => return Err("dot of a pointer tile".into()),
    })
}

/// Row-major `[m, k] x [k, n]` product added to `acc` (`[m, n]`), in f32.
pub(crate) fn matmul(a: &[f32], b: &[f32], acc: &mut [f32], m: usize, k: usize, n: usize) {
    for i in 0..m {
        let row = &mut acc[i * n..(i + 1) * n];
        for kk in 0..k {
            let av = a[i * k + kk];
            let brow = &b[kk * n..(kk + 1) * n];
            for (o, &bv) in row.iter_mut().zip(brow) {
                *o += av * bv;
            }
        }
    }
}

/// The linear input index of every output element of a broadcast from `from` to `to`
/// (same rank; each input extent equals the output's or is 1).
pub(crate) fn broadcast_index(from: &[usize], to: &[usize]) -> OpResult<Vec<usize>> {
    if from.len() != to.len() {
        return Err(format!(
            "broadcast from {from:?} to {to:?} changes the rank"
        ));
    }
    let rank = to.len();
    let mut strides = vec![0usize; rank];
    let mut s = 1;
    for ax in (0..rank).rev() {
        if from[ax] == to[ax] {
            strides[ax] = s;
        } else if from[ax] != 1 {
            return Err(format!("broadcast from {from:?} to {to:?}"));
        }
        s *= from[ax];
    }
    let total: usize = to.iter().product();
    let mut out = Vec::with_capacity(total);
    let mut idx = vec![0usize; rank];
    for _ in 0..total {
        out.push(idx.iter().zip(&strides).map(|(i, s)| i * s).sum());
        // Advance the row-major multi-index.
        for ax in (0..rank).rev() {
            idx[ax] += 1;
            if idx[ax] < to[ax] {
                break;
            }
            idx[ax] = 0;
        }
    }
    Ok(out)
}
