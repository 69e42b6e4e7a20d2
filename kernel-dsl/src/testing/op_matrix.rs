//! The op × dtype × broadcast × edge-mask matrix, written in the surface language.
//!
//! Every case is a kernel generated as source text, compiled with `compile_source`, and
//! checked against a plain-Rust reference on fresh seeded inputs: always on the
//! interpreter, and on the GPU when `gpu_or_skip` yields one. Written outputs are
//! poisoned (NaN for floats, all-ones bits for integers) and padded past the last valid
//! element, so a lane that writes outside its mask, or a valid lane left unwritten, is
//! caught. Input buffers are exactly `n` long (one element when `n = 0`), so an unmasked
//! read past the end is an interpreter error.
//!
//! Tolerances (`tol`): integer ops, casts, comparisons, `select`, `+ - * / %`, `sqrt`,
//! `abs`, `floor`, `ceil`, `maximum`/`minimum` and `max`/`min` reductions are exact (a
//! NaN matches any NaN; `maximum`/`minimum` of `±0` may pick either zero). The GPU uses
//! approximate instructions for the others, bounded by the PTX ISA's stated errors:
//!
//! | op | tolerance (f32) | why |
//! |---|---|---|
//! | `exp` | rel 2^-19 | `ex2.approx` (2 ulp) of `x * log2(e)`, whose rounding grows with `|x|` (inputs in [-10, 10]) |
//! | `exp2` | rel 2^-21 | `ex2.approx` |
//! | `log`, `log2` | abs 2^-21 + rel 2^-21 | `lg2.approx`: absolute error near 1 |
//! | `rsqrt` | rel 2^-21 | `rsqrt.approx` |
//! | `sin`, `cos` | abs 2^-20 | `sin/cos.approx` on [-π, π] |
//! | `tanh` | rel 2^-10 + abs 2^-20 | `tanh.approx` (max relative error 2^-10.99) |
//! | `sigmoid` | rel 2^-20 | `ex2.approx` then an exact reciprocal |
//! | `sum`, `dot` | abs 1e-4 + rel 2^-20 | the order of additions is unspecified |
//!
//! f16/bf16 results of inexact ops also allow one ulp of the dtype (2^-10, 2^-7 relative):
//! an approximation inside the f32 bound can still round to the neighbour.

use half::{bf16, f16};

use super::Rng;
use super::{def_with, run_on, Data};
use crate::interp::Scalar;
use crate::ir::DType;
use crate::runtime::testing::gpu_or_skip;
use crate::runtime::{Device, KernelDef};

const ALL: [DType; 7] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::I32,
    DType::U32,
    DType::I64,
    DType::U8,
];
const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];
const INTS: [DType; 4] = [DType::I32, DType::U32, DType::I64, DType::U8];

/// One element of a buffer: floats as `f32` (f16/bf16 values are exact in it), integers
/// as `i64` in their dtype's range.
#[derive(Clone, Copy, Debug, PartialEq)]
enum V {
    F(f32),
    I(i64),
}

impl V {
    fn f(self) -> f32 {
        match self {
            V::F(x) => x,
            V::I(x) => x as f32,
        }
    }
    fn i(self) -> i64 {
        match self {
            V::I(x) => x,
            V::F(x) => x as i64,
        }
    }
}

fn vals(d: &Data) -> Vec<V> {
    match d {
        Data::F32(v) => v.iter().map(|&x| V::F(x)).collect(),
        Data::F16(v) => v.iter().map(|x| V::F(x.to_f32())).collect(),
        Data::Bf16(v) => v.iter().map(|x| V::F(x.to_f32())).collect(),
        Data::I32(v) => v.iter().map(|&x| V::I(x as i64)).collect(),
        Data::U32(v) => v.iter().map(|&x| V::I(x as i64)).collect(),
        Data::I64(v) => v.iter().map(|&x| V::I(x)).collect(),
        Data::U8(v) => v.iter().map(|&x| V::I(x as i64)).collect(),
        Data::S(_) => vec![],
    }
}

/// A buffer of dtype `dt` from values already in its range (floats are rounded).
fn data(dt: DType, v: &[V]) -> Data {
    match dt {
        DType::F32 => Data::F32(v.iter().map(|x| x.f()).collect()),
        DType::F16 => Data::F16(v.iter().map(|x| f16::from_f32(x.f())).collect()),
        DType::BF16 => Data::Bf16(v.iter().map(|x| bf16::from_f32(x.f())).collect()),
        DType::I32 => Data::I32(v.iter().map(|x| x.i() as i32).collect()),
        DType::U32 => Data::U32(v.iter().map(|x| x.i() as u32).collect()),
        DType::I64 => Data::I64(v.iter().map(|x| x.i()).collect()),
        DType::U8 => Data::U8(v.iter().map(|x| x.i() as u8).collect()),
        DType::Bool => unreachable!("no bool buffers"),
    }
}

/// What an unwritten output element holds.
fn poison(dt: DType) -> V {
    if dt.is_float() {
        V::F(f32::NAN)
    } else {
        V::I(wrap(dt, -1))
    }
}

/// Two's-complement wrap of an integer to `dt`'s range.
fn wrap(dt: DType, x: i64) -> i64 {
    match dt {
        DType::I32 => x as i32 as i64,
        DType::U32 => x as u32 as i64,
        DType::U8 => x as u8 as i64,
        _ => x,
    }
}

/// An `f32` result rounded to a float dtype (nearest even).
fn round(dt: DType, x: f32) -> V {
    V::F(match dt {
        DType::F16 => f16::from_f32(x).to_f32(),
        DType::BF16 => bf16::from_f32(x).to_f32(),
        _ => x,
    })
}

fn bits(dt: DType) -> u32 {
    dt.size_bytes() as u32 * 8
}

fn ty(dt: DType) -> &'static str {
    match dt {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::I32 => "i32",
        DType::U32 => "u32",
        DType::I64 => "i64",
        DType::U8 => "u8",
        DType::Bool => "bool",
    }
}

/// How inputs are drawn.
#[derive(Clone, Copy, Debug)]
enum Dist {
    /// Floats: uniform in [-8, 8], wide exponents and specials (±0, ±inf, NaN,
    /// subnormals); integers: small values, extremes and random bits.
    Any,
    /// [`Dist::Any`] without integer zeros (divisors).
    NonZero,
    /// Uniform in `[lo, hi)` (floats), for functions with a domain.
    Range(f32, f32),
    /// Shift amounts: 0 to past the width, and an all-ones amount.
    Shift,
    /// Few distinct values (ties for `argmax`).
    Ties,
}

const SPECIALS: [f32; 12] = [
    0.0,
    -0.0,
    f32::INFINITY,
    f32::NEG_INFINITY,
    f32::NAN,
    1e-40,
    -3e-39,
    1.0,
    -1.0,
    3e38,
    65520.0,
    0.1,
];

fn gen(r: &mut Rng, dt: DType, n: usize, dist: Dist) -> Vec<V> {
    (0..n)
        .map(|_| {
            let u = r.below(8);
            if dt.is_float() {
                let x = match dist {
                    Dist::Range(lo, hi) => lo + (r.f32() + 1.0) * 0.5 * (hi - lo),
                    Dist::Ties => (r.f32() * 3.0).round(),
                    _ if u == 0 => SPECIALS[r.below(SPECIALS.len() as u64) as usize],
                    _ if u < 3 => {
                        // Any exponent: exercises overflow, underflow and `%` across
                        // large exponent gaps.
                        let e = r.below(250) as i32 - 140;
                        r.f32() * (e as f32).exp2()
                    }
                    _ => r.f32() * 8.0,
                };
                round(dt, x)
            } else {
                let w = bits(dt);
                let x = match dist {
                    Dist::Shift if u == 0 => -1,
                    Dist::Shift => r.below(w as u64 + 4) as i64,
                    Dist::Ties => r.below(4) as i64,
                    Dist::Range(lo, hi) => lo as i64 + r.below((hi - lo) as u64) as i64,
                    _ if u == 0 => [i64::MIN, i64::MAX, 0, 1, -1, 2][r.below(6) as usize],
                    _ if u < 4 => r.below(19) as i64 - 9,
                    _ => r.next_u64() as i64,
                };
                let x = wrap(dt, x);
                V::I(if x == 0 && matches!(dist, Dist::NonZero) {
                    1
                } else {
                    x
                })
            }
        })
        .collect()
}

/// Accepted distance between a result and the reference.
#[derive(Clone, Copy, Debug)]
struct Tol {
    rel: f32,
    abs: f32,
    /// Whether `-0` and `+0` are the same answer.
    any_zero: bool,
}

const EXACT: Tol = Tol {
    rel: 0.0,
    abs: 0.0,
    any_zero: false,
};

fn approx(rel: f32, abs: f32) -> Tol {
    Tol {
        rel,
        abs,
        any_zero: true,
    }
}

impl Tol {
    /// The tolerance for results of dtype `dt`: inexact float ops may also be one ulp
    /// of a narrow dtype away.
    fn for_dtype(self, dt: DType) -> Tol {
        if self.rel == 0.0 && self.abs == 0.0 {
            return self;
        }
        let ulp = match dt {
            DType::F16 => 2f32.powi(-10),
            DType::BF16 => 2f32.powi(-7),
            _ => 0.0,
        };
        Tol {
            rel: self.rel.max(ulp),
            ..self
        }
    }

    fn ok(self, got: V, want: V) -> bool {
        match (got, want) {
            (V::I(g), V::I(w)) => g == w,
            (V::F(g), V::F(w)) => {
                (g.is_nan() && w.is_nan())
                    || g.to_bits() == w.to_bits()
                    || (self.any_zero && g == w)
                    || (w.is_finite() && (g - w).abs() <= self.abs + self.rel * w.abs())
            }
            _ => false,
        }
    }
}

/// One launch of a case's kernel and the expected contents of its written buffers.
struct Run {
    what: String,
    grid: [u32; 3],
    args: Vec<Data>,
    /// Per parameter: the expected buffer, for the ones the kernel writes.
    want: Vec<Option<Vec<V>>>,
}

/// A generated kernel and its runs.
struct Case {
    src: String,
    consts: Vec<(&'static str, i64)>,
    warps: u32,
    tol: Tol,
    /// Assemble with ptxas (one representative per op and dtype).
    assemble: bool,
    runs: Vec<Run>,
}

/// Runs every case on the interpreter and, when there is one, on the GPU.
fn check_all(test: &str, cases: Vec<Case>) {
    let gpu = gpu_or_skip(test);
    // Only GPU runs wait for their turn; the interpreter runs in parallel.
    let _turn = gpu.as_ref().map(|_| crate::runtime::testing::gpu_turn());
    for c in &cases {
        let d = def_with(&c.src, &c.consts, c.warps, c.assemble);
        for r in &c.runs {
            check_on(&Device::cpu(), d, c, r);
            if let Some(g) = &gpu {
                check_on(g, d, c, r);
            }
        }
    }
    println!("{test}: {} kernels", cases.len());
}

fn check_on(dev: &Device, d: &KernelDef, c: &Case, r: &Run) {
    let got = run_on(dev, d, r.grid, &r.args);
    for (i, want) in r.want.iter().enumerate() {
        let Some(want) = want else { continue };
        let got = vals(&got[i]);
        assert_eq!(got.len(), want.len());
        let bad: Vec<String> = (0..want.len())
            .filter(|&j| !c.tol.ok(got[j], want[j]))
            .map(|j| format!("[{j}] got {:?} want {:?}", got[j], want[j]))
            .collect();
        assert!(
            bad.is_empty(),
            "kernel `{}` ({}) on {dev}: parameter `{}` differs in {} of {} elements \
             (tolerance {:?}): {:?}\ninputs: {:?}",
            d.name,
            r.what,
            d.params[i].name,
            bad.len(),
            want.len(),
            c.tol,
            &bad[..bad.len().min(6)],
            &r.args[..r.args.len().min(2)],
        );
    }
}

// ---------------------------------------------------------------------------------------
// Elementwise binary ops under four broadcast shapes.

#[derive(Clone, Copy, Debug, PartialEq)]
enum Shape {
    /// `[BLOCK] ⊕ [BLOCK]`
    Flat,
    /// `[BLOCK] ⊕ scalar`
    Scalar,
    /// `[BM, 1] ⊕ [1, BN]`
    Outer,
    /// `[BM, BN] ⊕ [BN]`
    Row,
}

const BLOCK: usize = 64;
const BM: usize = 4;
const BN: usize = 32;
/// Sizes for 1-D kernels: `n = 0`, `n < BLOCK`, `n` not a multiple of `BLOCK`.
const NS: [usize; 3] = [0, 37, 141];
/// `(m, n)` for 2-D kernels: empty, ragged in both, ragged rows over several programs.
const MNS: [(usize, usize); 3] = [(0, 5), (3, 13), (9, 32)];

/// Source of a two-input kernel computing `expr` (over `a`, `b`, and the scalar `n`).
fn binary_src(name: &str, shape: Shape, t: DType, out: DType, expr: &str) -> String {
    let (t, o) = (ty(t), ty(out));
    match shape {
        Shape::Flat | Shape::Scalar => {
            // The divisor's masked-off lanes are 1: masked lanes still compute.
            let b = if shape == Shape::Flat {
                "load(y + offs, mask, 1)"
            } else {
                "load(y)"
            };
            format!(
                "fn {name}<const BLOCK: usize>(x: Ptr<{t}>, y: Ptr<{t}>, out: Ptr<{o}>, n: i32) {{
    let offs = program_id(0) * BLOCK + arange(0, BLOCK);
    let mask = offs < n;
    let a = load(x + offs, mask);
    let b = {b};
    store(out + offs, {expr}, mask);
}}"
            )
        }
        Shape::Outer | Shape::Row => {
            let (a, b) = if shape == Shape::Outer {
                (
                    "load(x + rows, rows < m).expand_dims(1)",
                    "load(y + cols, cols < n, 1).expand_dims(0)",
                )
            } else {
                ("load(x + offs, mask)", "load(y + cols, cols < n, 1)")
            };
            format!(
                "fn {name}<const BM: usize, const BN: usize>(x: Ptr<{t}>, y: Ptr<{t}>, out: Ptr<{o}>, m: i32, n: i32) {{
    let rows = program_id(0) * BM + arange(0, BM);
    let cols = arange(0, BN);
    let mask = (rows.expand_dims(1) < m) & (cols.expand_dims(0) < n);
    let offs = rows.expand_dims(1) * n + cols.expand_dims(0);
    let a = {a};
    let b = {b};
    store(out + offs, {expr}, mask);
}}"
            )
        }
    }
}

/// A binary-op case: the kernel, and runs at every edge size with the reference `f`
/// (which also sees `n`).
#[allow(clippy::too_many_arguments)]
fn binary_case(
    r: &mut Rng,
    name: &str,
    shape: Shape,
    t: DType,
    out: DType,
    expr: &str,
    dists: (Dist, Dist),
    tol: Tol,
    f: &dyn Fn(V, V, i64) -> V,
) -> Case {
    let kname = format!("{name}_{}_{}", ty(t), format!("{shape:?}").to_lowercase());
    let src = binary_src(&kname, shape, t, out, expr);
    let mut runs = vec![];
    match shape {
        Shape::Flat | Shape::Scalar => {
            for n in NS {
                let x = gen(r, t, n.max(1), dists.0);
                let ylen = if shape == Shape::Flat { n.max(1) } else { 1 };
                let y = gen(r, t, ylen, dists.1);
                let grid = n.div_ceil(BLOCK).max(1);
                let want = (0..grid * BLOCK)
                    .map(|j| match (j < n, shape) {
                        (false, _) => poison(out),
                        (true, Shape::Flat) => f(x[j], y[j], n as i64),
                        (true, _) => f(x[j], y[0], n as i64),
                    })
                    .collect::<Vec<_>>();
                runs.push(Run {
                    what: format!("n = {n}"),
                    grid: [grid as u32, 1, 1],
                    args: vec![
                        data(t, &x),
                        data(t, &y),
                        data(out, &vec![poison(out); want.len()]),
                        Data::S(Scalar::I32(n as i32)),
                    ],
                    want: vec![None, None, Some(want), None],
                });
            }
        }
        Shape::Outer | Shape::Row => {
            for (m, n) in MNS {
                let grid = m.div_ceil(BM).max(1);
                let xlen = if shape == Shape::Outer { m } else { m * n };
                let x = gen(r, t, xlen.max(1), dists.0);
                let y = gen(r, t, n.max(1), dists.1);
                // Padding past the last row catches writes of masked-off rows.
                let mut want = vec![poison(out); grid * BM * n.max(1) + BN];
                for i in 0..m {
                    for j in 0..n {
                        let a = if shape == Shape::Outer {
                            x[i]
                        } else {
                            x[i * n + j]
                        };
                        want[i * n + j] = f(a, y[j], n as i64);
                    }
                }
                runs.push(Run {
                    what: format!("m = {m}, n = {n}"),
                    grid: [grid as u32, 1, 1],
                    args: vec![
                        data(t, &x),
                        data(t, &y),
                        data(out, &vec![poison(out); want.len()]),
                        Data::S(Scalar::I32(m as i32)),
                        Data::S(Scalar::I32(n as i32)),
                    ],
                    want: vec![None, None, Some(want), None, None],
                });
            }
        }
    }
    let consts = if matches!(shape, Shape::Flat | Shape::Scalar) {
        vec![("BLOCK", BLOCK as i64)]
    } else {
        vec![("BM", BM as i64), ("BN", BN as i64)]
    };
    Case {
        src,
        consts,
        warps: 2,
        tol: tol.for_dtype(out),
        assemble: shape == Shape::Flat,
        runs,
    }
}

/// The reference of an arithmetic or bitwise op on dtype `dt`.
fn arith(op: &str, dt: DType, a: V, b: V) -> V {
    if dt.is_float() {
        let (x, y) = (a.f(), b.f());
        // f16/bf16 compute in f32 and round the result.
        return round(
            dt,
            match op {
                "+" => x + y,
                "-" => x - y,
                "*" => x * y,
                "/" => x / y,
                "%" => x % y,
                "max" => x.max(y),
                "min" => x.min(y),
                _ => unreachable!("{op} on floats"),
            },
        );
    }
    let (x, y, w) = (a.i(), b.i(), bits(dt));
    // The amount is read as unsigned of the operand's width; past the width shifts
    // give 0 (or all sign bits).
    let amt = (y as u64) & (u64::MAX >> (64 - w));
    let signed = dt.is_signed_int();
    V::I(wrap(
        dt,
        match op {
            "+" => x.wrapping_add(y),
            "-" => x.wrapping_sub(y),
            "*" => x.wrapping_mul(y),
            "/" => x.wrapping_div(y),
            "%" => x.wrapping_rem(y),
            "cdiv" => wrap(dt, x.wrapping_add(y).wrapping_sub(1)).wrapping_div(y),
            "max" => x.max(y),
            "min" => x.min(y),
            "&" => x & y,
            "|" => x | y,
            "^" => x ^ y,
            "<<" if amt >= w as u64 => 0,
            "<<" => ((x as u64) << amt) as i64,
            ">>" if amt >= w as u64 => {
                if signed && x < 0 {
                    -1
                } else {
                    0
                }
            }
            ">>" if signed => x >> amt,
            ">>" => ((x as u64 & (u64::MAX >> (64 - w))) >> amt) as i64,
            _ => unreachable!("{op} on integers"),
        },
    ))
}

fn compare(op: &str, a: V, b: V) -> bool {
    let o = match (a, b) {
        (V::F(x), V::F(y)) => x.partial_cmp(&y),
        _ => Some(a.i().cmp(&b.i())),
    };
    use std::cmp::Ordering::*;
    match op {
        "==" => o == Some(Equal),
        "!=" => o != Some(Equal),
        "<" => o == Some(Less),
        "<=" => matches!(o, Some(Less | Equal)),
        ">" => o == Some(Greater),
        ">=" => matches!(o, Some(Greater | Equal)),
        _ => unreachable!(),
    }
}

const SHAPES: [Shape; 4] = [Shape::Flat, Shape::Scalar, Shape::Outer, Shape::Row];

#[test]
fn matrix_arithmetic() {
    let mut r = Rng(0xA11);
    let mut cases = vec![];
    let ops: [(&str, &str, &str); 7] = [
        ("add", "a + b", "+"),
        ("sub", "a - b", "-"),
        ("mul", "a * b", "*"),
        ("div", "a / b", "/"),
        ("rem", "a % b", "%"),
        ("maximum", "maximum(a, b)", "max"),
        ("minimum", "minimum(a, b)", "min"),
    ];
    for (name, expr, op) in ops {
        for dt in ALL {
            let tol = if op == "max" || op == "min" {
                Tol {
                    any_zero: true,
                    ..EXACT
                }
            } else {
                EXACT
            };
            for shape in SHAPES {
                let f = move |a, b, _| arith(op, dt, a, b);
                let dists = (Dist::Any, Dist::NonZero);
                cases.push(binary_case(
                    &mut r, name, shape, dt, dt, expr, dists, tol, &f,
                ));
            }
        }
    }
    for dt in INTS {
        for shape in [Shape::Flat, Shape::Row] {
            let f = move |a, b, _| arith("cdiv", dt, a, b);
            let dists = (Dist::Any, Dist::NonZero);
            cases.push(binary_case(
                &mut r,
                "cdiv",
                shape,
                dt,
                dt,
                "cdiv(a, b)",
                dists,
                EXACT,
                &f,
            ));
        }
    }
    check_all("matrix_arithmetic", cases);
}

#[test]
fn matrix_bitwise() {
    let mut r = Rng(0xB17);
    let mut cases = vec![];
    let ops = [
        ("and", "a & b", "&"),
        ("or", "a | b", "|"),
        ("xor", "a ^ b", "^"),
        ("shl", "a << b", "<<"),
        ("shr", "a >> b", ">>"),
    ];
    for (name, expr, op) in ops {
        for dt in INTS {
            for shape in SHAPES {
                let f = move |a, b, _| arith(op, dt, a, b);
                let db = if op.len() == 2 {
                    Dist::Shift
                } else {
                    Dist::Any
                };
                cases.push(binary_case(
                    &mut r,
                    name,
                    shape,
                    dt,
                    dt,
                    expr,
                    (Dist::Any, db),
                    EXACT,
                    &f,
                ));
            }
        }
    }
    check_all("matrix_bitwise", cases);
}

#[test]
fn matrix_compare_and_select() {
    let mut r = Rng(0xC3);
    let mut cases = vec![];
    let ops = [
        ("eq", "=="),
        ("ne", "!="),
        ("lt", "<"),
        ("le", "<="),
        ("gt", ">"),
        ("ge", ">="),
    ];
    for dt in ALL {
        // Ties make `==`, `<=` and `>=` meaningful.
        let dists = (Dist::Ties, Dist::Ties);
        for (name, op) in ops {
            for shape in [Shape::Flat, Shape::Row] {
                let f = move |a, b, _| V::I(compare(op, a, b) as i64);
                let expr = format!("(a {op} b) as i32");
                cases.push(binary_case(
                    &mut r,
                    name,
                    shape,
                    dt,
                    DType::I32,
                    &expr,
                    dists,
                    EXACT,
                    &f,
                ));
            }
        }
        let f = move |a, b, _| V::I(!compare("<", a, b) as i64);
        cases.push(binary_case(
            &mut r,
            "not_lt",
            Shape::Flat,
            dt,
            DType::I32,
            "(!(a < b)) as i32",
            (Dist::Any, Dist::Any),
            EXACT,
            &f,
        ));
        for shape in SHAPES {
            let f = move |a, b, _| if compare(">", a, b) { b } else { a };
            cases.push(binary_case(
                &mut r,
                "select",
                shape,
                dt,
                dt,
                "select(a > b, b, a)",
                (Dist::Any, Dist::Any),
                EXACT,
                &f,
            ));
        }
        // A scalar condition broadcast over tiles.
        for shape in [Shape::Flat, Shape::Outer] {
            let f = move |a, b, n| if n > 10 { a } else { b };
            cases.push(binary_case(
                &mut r,
                "select_scalar",
                shape,
                dt,
                dt,
                "select(n > 10, a, b)",
                (Dist::Any, Dist::Any),
                EXACT,
                &f,
            ));
        }
    }
    check_all("matrix_compare_and_select", cases);
}

// ---------------------------------------------------------------------------------------
// Unary ops and casts (1-D, every edge size).

/// A one-input kernel storing `expr` (over `a`); masked-off lanes load 1.
#[allow(clippy::too_many_arguments)]
fn unary_case(
    r: &mut Rng,
    name: &str,
    t: DType,
    out: DType,
    expr: &str,
    dist: Dist,
    tol: Tol,
    f: &dyn Fn(V) -> V,
) -> Case {
    let kname = format!("{name}_{}", ty(t));
    let (ts, os) = (ty(t), ty(out));
    let src = format!(
        "fn {kname}<const BLOCK: usize>(x: Ptr<{ts}>, out: Ptr<{os}>, n: i32) {{
    let offs = program_id(0) * BLOCK + arange(0, BLOCK);
    let mask = offs < n;
    let a = load(x + offs, mask, 1);
    store(out + offs, {expr}, mask);
}}"
    );
    let runs = NS
        .iter()
        .map(|&n| {
            let x = gen(r, t, n.max(1), dist);
            let grid = n.div_ceil(BLOCK).max(1);
            let want: Vec<V> = (0..grid * BLOCK)
                .map(|j| if j < n { f(x[j]) } else { poison(out) })
                .collect();
            Run {
                what: format!("n = {n}"),
                grid: [grid as u32, 1, 1],
                args: vec![
                    data(t, &x),
                    data(out, &vec![poison(out); want.len()]),
                    Data::S(Scalar::I32(n as i32)),
                ],
                want: vec![None, Some(want), None],
            }
        })
        .collect();
    Case {
        src,
        consts: vec![("BLOCK", BLOCK as i64)],
        warps: 2,
        tol: tol.for_dtype(out),
        assemble: true,
        runs,
    }
}

#[test]
fn matrix_unary() {
    let mut r = Rng(0xD0);
    let mut cases = vec![];
    let p = |e: i32| 2f32.powi(e);
    let pi = std::f32::consts::PI;
    type F = fn(f32) -> f32;
    let float_ops: [(&str, &str, Dist, Tol, F); 15] = [
        ("neg", "-a", Dist::Any, EXACT, |x| -x),
        ("abs", "abs(a)", Dist::Any, EXACT, f32::abs),
        ("floor", "a.floor()", Dist::Any, EXACT, f32::floor),
        ("ceil", "ceil(a)", Dist::Any, EXACT, f32::ceil),
        ("sqrt", "sqrt(a)", Dist::Range(0.0, 100.0), EXACT, f32::sqrt),
        (
            "exp",
            "exp(a)",
            Dist::Range(-10.0, 10.0),
            approx(p(-19), 0.0),
            f32::exp,
        ),
        (
            "exp2",
            "a.exp2()",
            Dist::Range(-20.0, 20.0),
            approx(p(-21), 0.0),
            f32::exp2,
        ),
        (
            "log",
            "log(a)",
            Dist::Range(1e-3, 100.0),
            approx(p(-21), p(-21)),
            f32::ln,
        ),
        (
            "log2",
            "a.log2()",
            Dist::Range(1e-3, 100.0),
            approx(p(-21), p(-21)),
            f32::log2,
        ),
        (
            "rsqrt",
            "a.rsqrt()",
            Dist::Range(1e-3, 100.0),
            approx(p(-21), 0.0),
            |x| 1.0 / x.sqrt(),
        ),
        (
            "sin",
            "sin(a)",
            Dist::Range(-pi, pi),
            approx(0.0, p(-20)),
            f32::sin,
        ),
        (
            "cos",
            "a.cos()",
            Dist::Range(-pi, pi),
            approx(0.0, p(-20)),
            f32::cos,
        ),
        (
            "tanh",
            "tanh(a)",
            Dist::Range(-5.0, 5.0),
            approx(p(-10), p(-20)),
            f32::tanh,
        ),
        (
            "sigmoid",
            "a.sigmoid()",
            Dist::Range(-10.0, 10.0),
            approx(p(-20), 0.0),
            |x| 1.0 / (1.0 + (-x).exp()),
        ),
        ("abs_method", "a.abs()", Dist::Any, EXACT, f32::abs),
    ];
    for (name, expr, dist, tol, f) in float_ops {
        for dt in FLOATS {
            let g = move |a: V| round(dt, f(a.f()));
            cases.push(unary_case(&mut r, name, dt, dt, expr, dist, tol, &g));
        }
    }
    for dt in INTS {
        type IntOp = (&'static str, &'static str, fn(i64) -> i64);
        let ops: [IntOp; 3] = [
            ("neg", "-a", i64::wrapping_neg),
            ("not", "!a", |x| !x),
            ("abs", "abs(a)", i64::wrapping_abs),
        ];
        for (name, expr, f) in ops {
            let g = move |a: V| V::I(wrap(dt, f(a.i())));
            cases.push(unary_case(&mut r, name, dt, dt, expr, Dist::Any, EXACT, &g));
        }
    }
    check_all("matrix_unary", cases);
}

/// The reference cast of one element (design.md's rules, in plain Rust).
fn cast(to: DType, a: V) -> V {
    match a {
        V::F(x) => match to {
            DType::F32 | DType::F16 | DType::BF16 => round(to, x),
            // Rust's `as` truncates, saturates and maps NaN to 0.
            DType::I32 => V::I(x as i32 as i64),
            DType::U32 => V::I(x as u32 as i64),
            DType::I64 => V::I(x as i64),
            DType::U8 => V::I(x as u8 as i64),
            DType::Bool => unreachable!(),
        },
        V::I(x) => match to {
            // Rust's integer-to-f32 `as` rounds once to nearest even.
            DType::F32 => V::F(x as f32),
            DType::F16 | DType::BF16 => V::F(int_to_narrow(to, x)),
            _ => V::I(wrap(to, x)),
        },
    }
}

/// An integer rounded once to f16/bf16: the nearest of the candidates around the `f64`
/// route's result, by exact integer distance, ties to an even significand.
fn int_to_narrow(to: DType, x: i64) -> f32 {
    let from_bits = |b: u16| match to {
        DType::F16 => f16::from_bits(b).to_f32(),
        _ => bf16::from_bits(b).to_f32(),
    };
    let near = match to {
        DType::F16 => f16::from_f64(x as f64).to_bits(),
        _ => bf16::from_f64(x as f64).to_bits(),
    };
    let mut best = near;
    for b in [near.wrapping_sub(1), near.wrapping_add(1)] {
        let (c, cur) = (from_bits(b), from_bits(best));
        // Neighbouring bit patterns are neighbouring magnitudes of one sign.
        if !c.is_finite() || !cur.is_finite() {
            continue;
        }
        let d = |v: f32| (x as i128 - v as i128).abs();
        if d(c) < d(cur) || (d(c) == d(cur) && b & 1 == 0) {
            best = b;
        }
    }
    from_bits(best)
}

#[test]
fn matrix_casts() {
    let mut r = Rng(0xCA57);
    let mut cases = vec![];
    for from in ALL {
        for to in ALL {
            let f = move |a: V| cast(to, a);
            let expr = format!("a as {}", ty(to));
            let name = format!("cast_to_{}", ty(to));
            cases.push(unary_case(
                &mut r,
                &name,
                from,
                to,
                &expr,
                Dist::Any,
                EXACT,
                &f,
            ));
        }
        let f = move |a: V| {
            V::I(match a {
                V::F(x) => x != 0.0,
                V::I(x) => x != 0,
            } as i64)
        };
        cases.push(unary_case(
            &mut r,
            "cast_to_bool",
            from,
            DType::U8,
            "(a as bool) as u8",
            Dist::Any,
            EXACT,
            &f,
        ));
    }
    check_all("matrix_casts", cases);
}

#[test]
fn int_to_narrow_rounds_once() {
    // 2^60 + 2^52 + 1 is just above a bf16 tie: one rounding goes up; rounding through
    // f64 first would land on the tie and go to even (down).
    let x = (1i64 << 60) + (1 << 52) + 1;
    assert_eq!(
        int_to_narrow(DType::BF16, x),
        ((1i64 << 60) + (1 << 53)) as f32
    );
    assert_eq!(int_to_narrow(DType::BF16, 1 << 60), (1i64 << 60) as f32);
    assert_eq!(int_to_narrow(DType::F16, 65519), 65504.0);
    assert_eq!(int_to_narrow(DType::F16, 65520), f32::INFINITY);
}

// ---------------------------------------------------------------------------------------
// Reductions along each axis of a masked 2-D tile, and to a scalar.

/// The identity of a reduction in dtype `dt`, as kernel source and as a value.
fn neutral(op: &str, dt: DType) -> (String, V) {
    let t = ty(dt);
    match (op, dt.is_float()) {
        ("sum", true) => ("0.0".into(), V::F(0.0)),
        ("sum", false) => ("0".into(), V::I(0)),
        ("min" | "argmin", true) => (format!("f32::INFINITY as {t}"), V::F(f32::INFINITY)),
        (_, true) => (format!("f32::NEG_INFINITY as {t}"), V::F(f32::NEG_INFINITY)),
        ("min" | "argmin", false) => match dt {
            DType::U8 => ("255".into(), V::I(255)),
            DType::I32 => ("i32::MAX".into(), V::I(i32::MAX as i64)),
            DType::U32 => ("u32::MAX".into(), V::I(u32::MAX as i64)),
            _ => ("i64::MAX".into(), V::I(i64::MAX)),
        },
        (_, false) => match dt {
            DType::I32 => ("i32::MIN".into(), V::I(i32::MIN as i64)),
            DType::I64 => ("i64::MIN".into(), V::I(i64::MIN)),
            _ => ("0".into(), V::I(0)),
        },
    }
}

/// The reference reduction of one row of lanes (masked-off lanes hold the identity).
fn reduce_ref(op: &str, dt: DType, lanes: &[V]) -> V {
    match op {
        "sum" if dt.is_float() => {
            // f32 accumulation, one rounding to the dtype; the order is free (tolerance).
            round(dt, lanes.iter().map(|v| v.f() as f64).sum::<f64>() as f32)
        }
        "sum" => V::I(wrap(
            dt,
            lanes.iter().fold(0i64, |s, v| s.wrapping_add(v.i())),
        )),
        "max" | "min" => {
            let better = |a: V, b: V| {
                let o = compare(if op == "max" { ">" } else { "<" }, a, b);
                // NaN never wins unless every lane is NaN.
                (o || matches!(b, V::F(x) if x.is_nan())) && !matches!(a, V::F(x) if x.is_nan())
            };
            lanes
                .iter()
                .copied()
                .reduce(|b, a| if better(a, b) { a } else { b })
                .unwrap()
        }
        _ => {
            // argmax (argmin): the first index of the maximum (minimum), never a NaN lane.
            let better = if op == "argmin" { "<" } else { ">" };
            let mut best: Option<(usize, V)> = None;
            for (j, &v) in lanes.iter().enumerate() {
                if matches!(v, V::F(x) if x.is_nan()) {
                    continue;
                }
                if best.is_none_or(|(_, b)| compare(better, v, b)) {
                    best = Some((j, v));
                }
            }
            V::I(best.map_or(0, |b| b.0 as i64))
        }
    }
}

#[test]
fn matrix_reductions() {
    let mut r = Rng(0x5E0);
    let mut cases = vec![];
    const RM: usize = 8;
    const RN: usize = 32;
    for op in ["sum", "max", "min", "argmax", "argmin"] {
        for dt in ALL {
            let out = if op.starts_with("arg") {
                DType::I32
            } else {
                dt
            };
            let (other, id) = neutral(op, dt);
            let tol = if op == "sum" && dt.is_float() {
                approx(p2(-20), 1e-4).for_dtype(dt)
            } else {
                EXACT
            };
            // Float inputs in [-1, 1] for sums (bounded error); ties for argmax.
            let dist = match (op, dt.is_float()) {
                ("argmax" | "argmin", _) => Dist::Ties,
                ("sum", true) => Dist::Range(-1.0, 1.0),
                _ => Dist::Any,
            };
            for axis in [0usize, 1] {
                let kname = format!("{op}{axis}_{}", ty(dt));
                let (idx, keep) = if axis == 1 {
                    ("rows", "rows < m")
                } else {
                    ("cols", "cols < n")
                };
                let src = format!(
                    "fn {kname}<const RM: usize, const RN: usize>(x: Ptr<{t}>, out: Ptr<{o}>, m: i32, n: i32) {{
    let rows = arange(0, RM);
    let cols = arange(0, RN);
    let mask = (rows.expand_dims(1) < m) & (cols.expand_dims(0) < n);
    let v = load(x + rows.expand_dims(1) * n + cols.expand_dims(0), mask, {other});
    store(out + {idx}, v.{op}({axis}), {keep});
}}",
                    t = ty(dt),
                    o = ty(out),
                );
                let mut runs = vec![];
                for (m, n) in [(5usize, 19usize), (RM, RN), (3, 0)] {
                    let x = gen(&mut r, dt, (m * n).max(1), dist);
                    let lane = |i: usize, j: usize| if i < m && j < n { x[i * n + j] } else { id };
                    let want: Vec<V> = if axis == 1 {
                        (0..RM)
                            .map(|i| {
                                let row: Vec<V> = (0..RN).map(|j| lane(i, j)).collect();
                                if i < m {
                                    reduce_ref(op, dt, &row)
                                } else {
                                    poison(out)
                                }
                            })
                            .collect()
                    } else {
                        (0..RN)
                            .map(|j| {
                                let col: Vec<V> = (0..RM).map(|i| lane(i, j)).collect();
                                if j < n {
                                    reduce_ref(op, dt, &col)
                                } else {
                                    poison(out)
                                }
                            })
                            .collect()
                    };
                    runs.push(Run {
                        what: format!("m = {m}, n = {n}"),
                        grid: [1, 1, 1],
                        args: vec![
                            data(dt, &x),
                            data(out, &vec![poison(out); want.len()]),
                            Data::S(Scalar::I32(m as i32)),
                            Data::S(Scalar::I32(n as i32)),
                        ],
                        want: vec![None, Some(want), None, None],
                    });
                }
                cases.push(Case {
                    src,
                    consts: vec![("RM", RM as i64), ("RN", RN as i64)],
                    warps: 2,
                    tol,
                    assemble: axis == 0,
                    runs,
                });
            }
        }
    }
    check_all("matrix_reductions", cases);
}

fn p2(e: i32) -> f32 {
    2f32.powi(e)
}

// ---------------------------------------------------------------------------------------
// dot, atomics, cdiv, full/zeros, program_id/num_programs.

#[test]
fn matrix_dot() {
    let mut r = Rng(0xD07);
    let mut cases = vec![];
    const M: usize = 16;
    for dt in FLOATS {
        for with_acc in [false, true] {
            let kname = format!("dot{}_{}", if with_acc { "_acc" } else { "" }, ty(dt));
            let call = if with_acc {
                "dot(x, y, load(d + cofs, cmask, 0.0))"
            } else {
                "dot(x, y)"
            };
            let src = format!(
                "fn {kname}<const M: usize, const N: usize, const K: usize>(a: Ptr<{t}>, b: Ptr<{t}>, d: Ptr<f32>, c: Ptr<f32>, m: i32, n: i32, k: i32) {{
    let rm = arange(0, M);
    let rn = arange(0, N);
    let rk = arange(0, K);
    let x = load(a + rm.expand_dims(1) * k + rk.expand_dims(0), (rm.expand_dims(1) < m) & (rk.expand_dims(0) < k), 0.0);
    let y = load(b + rk.expand_dims(1) * n + rn.expand_dims(0), (rk.expand_dims(1) < k) & (rn.expand_dims(0) < n), 0.0);
    let cmask = (rm.expand_dims(1) < m) & (rn.expand_dims(0) < n);
    let cofs = rm.expand_dims(1) * n + rn.expand_dims(0);
    store(c + cofs, {call}, cmask);
}}",
                t = ty(dt)
            );
            let mut runs = vec![];
            for (m, n, k) in [(M, M, M), (13, 9, 7), (5, 16, 0)] {
                let dist = Dist::Range(-1.0, 1.0);
                let (a, b) = (
                    gen(&mut r, dt, (m * k).max(1), dist),
                    gen(&mut r, dt, (k * n).max(1), dist),
                );
                let d = gen(&mut r, DType::F32, (m * n).max(1), dist);
                let mut want = vec![poison(DType::F32); M * M + M];
                for i in 0..m {
                    for j in 0..n {
                        let acc = if with_acc {
                            d[i * n + j].f() as f64
                        } else {
                            0.0
                        };
                        let s: f64 = (0..k)
                            .map(|q| a[i * k + q].f() as f64 * b[q * n + j].f() as f64)
                            .sum();
                        want[i * n + j] = V::F((acc + s) as f32);
                    }
                }
                runs.push(Run {
                    what: format!("m = {m}, n = {n}, k = {k}"),
                    grid: [1, 1, 1],
                    args: vec![
                        data(dt, &a),
                        data(dt, &b),
                        data(DType::F32, &d),
                        data(DType::F32, &vec![poison(DType::F32); want.len()]),
                        Data::S(Scalar::I32(m as i32)),
                        Data::S(Scalar::I32(n as i32)),
                        Data::S(Scalar::I32(k as i32)),
                    ],
                    want: vec![None, None, None, Some(want), None, None, None],
                });
            }
            let consts = vec![("M", M as i64), ("N", M as i64), ("K", M as i64)];
            cases.push(Case {
                src,
                consts,
                warps: 4,
                tol: approx(p2(-20), 1e-4),
                assemble: true,
                runs,
            });
        }
    }
    check_all("matrix_dot", cases);
}

#[test]
fn matrix_atomics() {
    let mut r = Rng(0xA70);
    let mut cases = vec![];
    for dt in [DType::F32, DType::I32] {
        for op in ["add", "max"] {
            let t = ty(dt);
            let kname = format!("atomic_{op}_{t}");
            // Distinct addresses return exact old values; the tail slots collide.
            let src = format!(
                "fn {kname}<const BLOCK: usize>(x: Ptr<{t}>, acc: Ptr<{t}>, old: Ptr<{t}>, n: i32) {{
    let offs = program_id(0) * BLOCK + arange(0, BLOCK);
    let mask = offs < n;
    let v = load(x + offs, mask);
    store(old + offs, atomic_{op}(acc + offs, v, mask), mask);
    atomic_{op}(acc + BLOCK * num_programs(0) + offs % 3, v, mask);
}}"
            );
            let dist = if dt.is_float() {
                Dist::Range(-4.0, 4.0)
            } else {
                Dist::Range(-1000.0, 1000.0)
            };
            let mut runs = vec![];
            for n in NS {
                let grid = n.div_ceil(BLOCK).max(1);
                let x = gen(&mut r, dt, n.max(1), dist);
                let acc0 = gen(&mut r, dt, grid * BLOCK + 3, dist);
                let mut acc = acc0.clone();
                let mut old = vec![poison(dt); grid * BLOCK];
                let apply = |a: V, v: V| match (op, a, v) {
                    ("add", V::F(p), V::F(q)) => V::F(p + q),
                    ("add", V::I(p), V::I(q)) => V::I(wrap(dt, p + q)),
                    (_, V::F(p), V::F(q)) => V::F(p.max(q)),
                    (_, p, q) => V::I(p.i().max(q.i())),
                };
                for j in 0..n {
                    old[j] = acc[j];
                    acc[j] = apply(acc[j], x[j]);
                }
                for (j, &v) in x.iter().enumerate().take(n) {
                    let s = grid * BLOCK + j % 3;
                    acc[s] = apply(acc[s], v);
                }
                runs.push(Run {
                    what: format!("n = {n}"),
                    grid: [grid as u32, 1, 1],
                    args: vec![
                        data(dt, &x),
                        data(dt, &acc0),
                        data(dt, &vec![poison(dt); old.len()]),
                        Data::S(Scalar::I32(n as i32)),
                    ],
                    want: vec![None, Some(acc), Some(old), None],
                });
            }
            cases.push(Case {
                src,
                consts: vec![("BLOCK", BLOCK as i64)],
                warps: 2,
                // Float sums into one slot run in any order.
                tol: if dt.is_float() && op == "add" {
                    approx(p2(-20), 1e-4)
                } else {
                    EXACT
                },
                assemble: true,
                runs,
            });
        }
    }
    check_all("matrix_atomics", cases);
}

#[test]
fn matrix_full_zeros_and_program_ids() {
    let mut r = Rng(0xF11);
    let mut cases = vec![];
    for dt in ALL {
        let t = ty(dt);
        // Scalar parameters are i32, u32, i64 or f32: convert to the tile's dtype.
        let (st, sv) = if dt.is_float() {
            ("f32", Scalar::F32(r.f32() * 100.0))
        } else {
            ("i64", Scalar::I64(r.next_u64() as i64))
        };
        let v = match sv {
            Scalar::F32(x) => round(dt, x),
            Scalar::I64(x) => V::I(wrap(dt, x)),
            _ => unreachable!(),
        };
        let kname = format!("full_zeros_{t}");
        let src = format!(
            "fn {kname}<const BLOCK: usize>(a: Ptr<{t}>, b: Ptr<{t}>, c: Ptr<{t}>, n: i32, v: {st}) {{
    let offs = program_id(0) * BLOCK + arange(0, BLOCK);
    let mask = offs < n;
    store(a + offs, full([BLOCK], v as {t}), mask);
    store(b + offs, zeros::<{t}>([BLOCK]), mask);
    store(c + offs, full::<{t}>([BLOCK], v), mask);
}}"
        );
        let zero = if dt.is_float() { V::F(0.0) } else { V::I(0) };
        let runs = NS
            .iter()
            .map(|&n| {
                let grid = n.div_ceil(BLOCK).max(1);
                let fill = |x: V| -> Vec<V> {
                    (0..grid * BLOCK)
                        .map(|j| if j < n { x } else { poison(dt) })
                        .collect()
                };
                let p = data(dt, &vec![poison(dt); grid * BLOCK]);
                Run {
                    what: format!("n = {n}"),
                    grid: [grid as u32, 1, 1],
                    args: vec![
                        p.clone(),
                        p.clone(),
                        p,
                        Data::S(Scalar::I32(n as i32)),
                        Data::S(sv),
                    ],
                    want: vec![Some(fill(v)), Some(fill(zero)), Some(fill(v)), None, None],
                }
            })
            .collect();
        cases.push(Case {
            src,
            consts: vec![("BLOCK", BLOCK as i64)],
            warps: 2,
            tol: EXACT,
            assemble: true,
            runs,
        });
    }
    let src = "fn program_ids<const B: usize>(out: Ptr<i32>) {
    let p = (program_id(2) * num_programs(1) + program_id(1)) * num_programs(0) + program_id(0);
    let lane = arange(0, B);
    let v = select(lane == 0, program_id(0), select(lane == 1, program_id(1), select(lane == 2, program_id(2),
        select(lane == 3, num_programs(0), select(lane == 4, num_programs(1), num_programs(2))))));
    store(out + p * 6 + lane, v, lane < 6);
}";
    let runs = [[3u32, 2, 2], [1, 1, 1], [5, 1, 3]]
        .iter()
        .map(|&g| {
            let total = (g[0] * g[1] * g[2]) as usize;
            let mut want = vec![poison(DType::I32); total * 6 + 2];
            for z in 0..g[2] {
                for y in 0..g[1] {
                    for x in 0..g[0] {
                        let p = ((z * g[1] + y) * g[0] + x) as usize;
                        for (l, v) in [x, y, z, g[0], g[1], g[2]].into_iter().enumerate() {
                            want[p * 6 + l] = V::I(v as i64);
                        }
                    }
                }
            }
            Run {
                what: format!("grid {g:?}"),
                grid: g,
                args: vec![data(DType::I32, &vec![poison(DType::I32); want.len()])],
                want: vec![Some(want)],
            }
        })
        .collect();
    cases.push(Case {
        src: src.into(),
        consts: vec![("B", 8)],
        warps: 1,
        tol: EXACT,
        assemble: true,
        runs,
    });
    check_all("matrix_full_zeros_and_program_ids", cases);
}

mod more_ops;
mod peer;
