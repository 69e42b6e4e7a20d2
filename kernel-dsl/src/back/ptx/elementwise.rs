//! Per-element instructions: parameters, literals, program ids, unary, binary, compare,
//! select, cast and pointer arithmetic. f16/bf16 compute in f32 and round every result.

use super::emit::{Emitter, Res};
use super::magic;
use super::regs::{bit_ty, f32_imm, int_ty, rk, Rk};
use crate::ir::{BinaryOp, CmpOp, DType, Def, Expr, Kernel, Literal, ParamKind, UnaryOp, ValueId};

const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2: f32 = std::f32::consts::LN_2;

/// The literal every element of `v` holds (a literal, or a splat, broadcast or new
/// axis of one), if it is one: what a division by a constant and a constant mask
/// (`memory::always_true`) look for.
pub(super) fn uniform_literal(k: &Kernel, v: ValueId) -> Option<Literal> {
    match &k.value(v).def {
        Def::Expr(
            Expr::Splat { value, .. }
            | Expr::Broadcast { value, .. }
            | Expr::ExpandDims { value, .. },
        ) => uniform_literal(k, *value),
        Def::Expr(Expr::Literal(lit)) => Some(*lit),
        _ => None,
    }
}

/// The integer constant every element of `v` holds, if it is one.
fn int_constant(k: &Kernel, v: ValueId) -> Option<i64> {
    match uniform_literal(k, v)? {
        Literal::Int(c, _) => Some(c),
        _ => None,
    }
}

impl Emitter<'_> {
    /// One element of an elementwise expression (also scalar leaves), from operand registers.
    pub fn elementwise(&mut self, v: ValueId, e: &Expr, a: &[String]) -> Res<String> {
        let ty = self.k.ty(v).clone();
        match e {
            Expr::Param(i) => {
                let d = self.reg(self.rk_of(v));
                match self.k.params[*i].kind {
                    ParamKind::Ptr(_) => {
                        self.ins(format!("ld.param.u64 {d}, [p{i}]"));
                        self.ins(format!("cvta.to.global.u64 {d}, {d}"));
                    }
                    ParamKind::Scalar(t) | ParamKind::ScalarMultipleOf(t, _) => {
                        let pt = param_ty(t).ok_or(()).or_else(|_| {
                            self.err(format!("scalar parameters of type {t} are not supported"))
                        })?;
                        self.ins(format!("ld.param.{pt} {d}, [p{i}]"));
                    }
                }
                Ok(d)
            }
            Expr::Literal(lit) => {
                let dt = ty.dtype().unwrap_or(DType::I32);
                self.literal(*lit, dt)
            }
            Expr::GlobalTimer => {
                let d = self.reg(Rk::D);
                self.ins(format!("mov.u64 {d}, %globaltimer"));
                Ok(d)
            }
            Expr::SmId => {
                let d = self.reg(Rk::R);
                self.ins(format!("mov.u32 {d}, %smid"));
                Ok(d)
            }
            Expr::ProgramId(axis) | Expr::NumPrograms(axis) => {
                let d = self.reg(Rk::R);
                let reg = if matches!(e, Expr::ProgramId(_)) {
                    "ctaid"
                } else {
                    "nctaid"
                };
                let c = ["x", "y", "z"].get(*axis as usize).copied();
                let Some(c) = c else {
                    return self.err(format!("program axis {axis} is out of range (0..3)"));
                };
                self.ins(format!("mov.u32 {d}, %{reg}.{c}"));
                Ok(d)
            }
            Expr::Unary { op, arg } => {
                let dt = self.val_dt(*arg)?;
                self.unary(*op, dt, &a[0])
            }
            Expr::Binary { op, lhs, rhs } => {
                let dt = self.val_dt(*lhs)?;
                if let Some(d) = self.by_constant(*op, dt, &a[0], int_constant(self.k, *rhs)) {
                    return Ok(d);
                }
                self.binary(*op, dt, &a[0], &a[1])
            }
            Expr::Compare { op, lhs, .. } => {
                let dt = self.val_dt(*lhs)?;
                self.compare(*op, dt, &a[0], &a[1])
            }
            Expr::Select { .. } => {
                let kind = self.rk_of(v);
                let d = self.reg(kind);
                if kind == Rk::P {
                    let (t1, t2) = (self.reg(Rk::P), self.reg(Rk::P));
                    self.ins(format!("and.pred {t1}, {}, {}", a[0], a[1]));
                    self.ins(format!("not.pred {t2}, {}", a[0]));
                    self.ins(format!("and.pred {t2}, {t2}, {}", a[2]));
                    self.ins(format!("or.pred {d}, {t1}, {t2}"));
                } else {
                    self.ins(format!(
                        "selp.{} {d}, {}, {}, {}",
                        kind.bits(),
                        a[1],
                        a[2],
                        a[0]
                    ));
                }
                Ok(d)
            }
            Expr::Dot4 { a: x, b: y, .. } => {
                let sign = |d: DType| if d == DType::I32 { "s32" } else { "u32" };
                let (ta, tb) = (sign(self.val_dt(*x)?), sign(self.val_dt(*y)?));
                let d = self.reg(Rk::R);
                self.ins(format!("dp4a.{ta}.{tb} {d}, {}, {}, {}", a[0], a[1], a[2]));
                Ok(d)
            }
            Expr::BytePerm { .. } => {
                // `prmt`'s selector nibbles have a fourth bit (sign replication) that
                // `byte_perm` leaves out.
                let (t, d) = (self.reg(Rk::R), self.reg(Rk::R));
                self.ins(format!("and.b32 {t}, {}, 30583", a[2]));
                self.ins(format!("prmt.b32 {d}, {}, {}, {t}", a[0], a[1]));
                Ok(d)
            }
            Expr::Cast { value, to } => {
                let from = self.val_dt(*value)?;
                self.cast(from, *to, &a[0])
            }
            Expr::Bitcast { value, to } => {
                let from = self.val_dt(*value)?;
                if rk(from) == rk(*to) {
                    // Same register class (i32/u32, f16/bf16): the register is the value.
                    return Ok(a[0].clone());
                }
                let d = self.reg(rk(*to));
                match to.size_bytes() {
                    4 => self.ins(format!("mov.b32 {d}, {}", a[0])),
                    2 => self.ins(format!("mov.b16 {d}, {}", a[0])),
                    _ => return self.err(format!("cannot bitcast {from} to {to}")),
                }
                Ok(d)
            }
            Expr::AddPtr { ptr, offset } => {
                let es = self.ptr_dt(*ptr)?.size_bytes();
                let odt = self.val_dt(*offset)?;
                let t = self.reg(Rk::D);
                match odt {
                    DType::I32 => self.ins(format!("mul.wide.s32 {t}, {}, {es}", a[1])),
                    DType::U32 | DType::U8 => self.ins(format!("mul.wide.u32 {t}, {}, {es}", a[1])),
                    DType::I64 => self.ins(format!("mul.lo.s64 {t}, {}, {es}", a[1])),
                    _ => return self.err(format!("pointer offsets must be integers, not {odt}")),
                }
                let d = self.reg(Rk::D);
                self.ins(format!("add.s64 {d}, {}, {t}", a[0]));
                Ok(d)
            }
            Expr::Rand { op, seed, .. } => self.rand(*op, *seed, a),
            other => self.err(format!("cannot lower {other:?} per element")),
        }
    }

    /// A literal of a dtype.
    pub fn literal(&mut self, lit: Literal, dt: DType) -> Res<String> {
        let (i, f) = match lit {
            Literal::Int(i, _) => (i, i as f64),
            Literal::Float(f, _) => (f as i64, f),
            Literal::Bool(b) => (b as i64, b as i64 as f64),
        };
        let d = self.reg(rk(dt));
        match dt {
            DType::Bool => self.ins(format!("setp.ne.u32 {d}, {}, 0", (i != 0) as u32)),
            DType::U8 => self.ins(format!("mov.u32 {d}, {}", i & 255)),
            DType::I32 | DType::U32 => self.ins(format!("mov.b32 {d}, {}", i as u32)),
            DType::I64 => self.ins(format!("mov.b64 {d}, {i}")),
            DType::F32 => self.ins(format!("mov.f32 {d}, {}", f32_imm(f as f32))),
            DType::F16 => self.ins(format!(
                "mov.b16 {d}, 0x{:04X}",
                half::f16::from_f64(f).to_bits()
            )),
            DType::BF16 => self.ins(format!(
                "mov.b16 {d}, 0x{:04X}",
                half::bf16::from_f64(f).to_bits()
            )),
        }
        Ok(d)
    }

    /// Widens a float register to f32.
    pub fn up(&mut self, dt: DType, a: &str) -> String {
        match dt {
            DType::F16 => {
                let f = self.reg(Rk::F);
                self.ins(format!("cvt.f32.f16 {f}, {a}"));
                f
            }
            DType::BF16 => {
                // bf16 is the high half of an f32; a half of a packed word is widened
                // from the word.
                let (t, f) = (self.reg(Rk::R), self.reg(Rk::F));
                match self.halves.get(a).cloned() {
                    Some((w, false)) => self.ins(format!("shl.b32 {t}, {w}, 16")),
                    Some((w, true)) => self.ins(format!("and.b32 {t}, {w}, -65536")),
                    None => {
                        self.ins(format!("cvt.u32.u16 {t}, {a}"));
                        self.ins(format!("shl.b32 {t}, {t}, 16"));
                    }
                }
                self.ins(format!("mov.b32 {f}, {t}"));
                f
            }
            _ => a.to_string(),
        }
    }

    /// Rounds an f32 register to a float dtype (nearest even).
    pub fn down(&mut self, dt: DType, f: &str) -> String {
        match dt {
            DType::F16 | DType::BF16 => {
                let h = self.reg(Rk::H);
                let n = if dt == DType::F16 { "f16" } else { "bf16" };
                self.ins(format!("cvt.rn.{n}.f32 {h}, {f}"));
                h
            }
            _ => f.to_string(),
        }
    }

    pub(super) fn unary(&mut self, op: UnaryOp, dt: DType, a: &str) -> Res<String> {
        if dt == DType::Bool {
            if op != UnaryOp::Not {
                return self.err(format!("{op:?} is not defined on bool"));
            }
            let d = self.reg(Rk::P);
            self.ins(format!("not.pred {d}, {a}"));
            return Ok(d);
        }
        if dt.is_int() {
            let (t, b) = (int_ty(dt), bit_ty(dt));
            let d = self.reg(rk(dt));
            match op {
                UnaryOp::Neg => self.ins(format!(
                    "neg.{} {d}, {a}",
                    if dt == DType::I64 { "s64" } else { "s32" }
                )),
                UnaryOp::Not => self.ins(format!("not.{b} {d}, {a}")),
                UnaryOp::Abs if dt.is_signed_int() => self.ins(format!("abs.{t} {d}, {a}")),
                UnaryOp::Abs => self.ins(format!("mov.{b} {d}, {a}")),
                _ => return self.err(format!("{op:?} needs a float operand, not {dt}")),
            }
            if dt == DType::U8 {
                self.ins(format!("and.b32 {d}, {d}, 255"));
            }
            return Ok(d);
        }
        let x = self.up(dt, a);
        let d = self.reg(Rk::F);
        match op {
            UnaryOp::Neg => self.ins(format!("neg.f32 {d}, {x}")),
            UnaryOp::Abs => self.ins(format!("abs.f32 {d}, {x}")),
            UnaryOp::Not => return self.err(format!("`!` is not defined on {dt}")),
            UnaryOp::Exp => {
                self.ins(format!("mul.rn.f32 {d}, {x}, {}", f32_imm(LOG2E)));
                self.ins(format!("ex2.approx.ftz.f32 {d}, {d}"));
            }
            UnaryOp::Exp2 => self.ins(format!("ex2.approx.ftz.f32 {d}, {x}")),
            UnaryOp::Log => {
                self.ins(format!("lg2.approx.ftz.f32 {d}, {x}"));
                self.ins(format!("mul.rn.f32 {d}, {d}, {}", f32_imm(LN2)));
            }
            UnaryOp::Log2 => self.ins(format!("lg2.approx.ftz.f32 {d}, {x}")),
            UnaryOp::Sqrt => self.ins(format!("sqrt.rn.f32 {d}, {x}")),
            UnaryOp::Rsqrt => self.ins(format!("rsqrt.approx.ftz.f32 {d}, {x}")),
            UnaryOp::Sin => self.ins(format!("sin.approx.ftz.f32 {d}, {x}")),
            UnaryOp::Cos => self.ins(format!("cos.approx.ftz.f32 {d}, {x}")),
            UnaryOp::Tanh => self.ins(format!("tanh.approx.f32 {d}, {x}")),
            UnaryOp::Sigmoid => {
                self.ins(format!("mul.rn.f32 {d}, {x}, {}", f32_imm(-LOG2E)));
                self.ins(format!("ex2.approx.ftz.f32 {d}, {d}"));
                self.ins(format!("add.rn.f32 {d}, {d}, {}", f32_imm(1.0)));
                self.ins(format!("rcp.rn.f32 {d}, {d}"));
            }
            UnaryOp::Floor => self.ins(format!("cvt.rmi.f32.f32 {d}, {x}")),
            UnaryOp::Ceil => self.ins(format!("cvt.rpi.f32.f32 {d}, {x}")),
        }
        Ok(self.down(dt, &d))
    }

    /// Integer `a / c` or `a % c` for a constant `c > 1`, truncating toward zero as
    /// `div`/`rem` do: shifts and masks for a power of two ([`Self::by_power_of_two`]),
    /// else a high multiply by a magic number ([`Self::by_magic_number`]); `None` for
    /// anything else. ptxas expands `div.s32` by an immediate into its full division
    /// routine (a reciprocal, two multiplies and fix-ups: about 20 instructions; test
    /// `division_by_a_constant_is_a_multiply`), so the compiler strength-reduces it.
    fn by_constant(&mut self, op: BinaryOp, dt: DType, a: &str, c: Option<i64>) -> Option<String> {
        let c = c?;
        if !matches!(op, BinaryOp::Div | BinaryOp::Rem) || !dt.is_int() || c <= 1 {
            return None;
        }
        if c.count_ones() == 1 {
            self.by_power_of_two(op, dt, a, c)
        } else {
            self.by_magic_number(op, dt, a, c)
        }
    }

    /// [`Self::by_constant`] for a power of two `c`: shifts and masks.
    fn by_power_of_two(&mut self, op: BinaryOp, dt: DType, a: &str, c: i64) -> Option<String> {
        let bits = if dt == DType::I64 { 64 } else { 32 };
        let shift = c.trailing_zeros();
        // `c` must be representable in the type (u8 values live in 32-bit registers).
        if dt == DType::U8 && shift >= 8 || dt == DType::I32 && shift >= 31 || shift >= 63 {
            return None;
        }
        let (t, bt) = (int_ty(dt), bit_ty(dt));
        let d = self.reg(rk(dt));
        if !dt.is_signed_int() {
            match op {
                BinaryOp::Div => self.ins(format!("shr.{t} {d}, {a}, {shift}")),
                _ => self.ins(format!("and.{bt} {d}, {a}, {}", c - 1)),
            }
            return Some(d);
        }
        // Round toward zero: add `c - 1` to negative dividends before the arithmetic
        // shift (the sign spread over the low `shift` bits).
        let u = if bits == 64 { "u64" } else { "u32" };
        let bias = self.reg(rk(dt));
        self.ins(format!("shr.{t} {bias}, {a}, {}", bits - 1));
        self.ins(format!("shr.{u} {bias}, {bias}, {}", bits - shift));
        self.ins(format!("add.{t} {bias}, {a}, {bias}"));
        match op {
            BinaryOp::Div => self.ins(format!("shr.{t} {d}, {bias}, {shift}")),
            _ => {
                let mask = if bits == 64 {
                    format!("{:#x}", !(c as u64 - 1))
                } else {
                    format!("{:#x}", !(c as u32 - 1))
                };
                self.ins(format!("and.{bt} {bias}, {bias}, {mask}"));
                self.ins(format!("sub.{t} {d}, {a}, {bias}"));
            }
        }
        Some(d)
    }

    /// [`Self::by_constant`] for a `c` that is not a power of two: a high multiply by a
    /// magic number, shifts and fix-ups (`magic.rs`, whose `Signed::divide` and
    /// `Unsigned::divide` are these steps checked against Rust's `/`).
    fn by_magic_number(&mut self, op: BinaryOp, dt: DType, a: &str, c: i64) -> Option<String> {
        // u8 values live in 32-bit registers below 256: a divisor past the type is left
        // to the division instruction, as is any the constants do not cover.
        if dt == DType::U8 && c > 255 {
            return None;
        }
        let w = if dt == DType::I64 { 64 } else { 32 };
        let t = int_ty(dt);
        let q = self.reg(rk(dt));
        if dt.is_signed_int() {
            let m = magic::signed(c, w)?;
            self.ins(format!("mul.hi.{t} {q}, {a}, {}", m.m));
            if m.add {
                self.ins(format!("add.{t} {q}, {q}, {a}"));
            }
            if m.shift > 0 {
                self.ins(format!("shr.{t} {q}, {q}, {}", m.shift));
            }
            // Plus one for a negative dividend: truncation toward zero.
            let sign = self.reg(rk(dt));
            let u = if w == 64 { "u64" } else { "u32" };
            self.ins(format!("shr.{u} {sign}, {a}, {}", w - 1));
            self.ins(format!("add.{t} {q}, {q}, {sign}"));
        } else {
            let m = magic::unsigned(c as u64, w)?;
            self.ins(format!("mul.hi.{t} {q}, {a}, {}", m.m));
            if m.add {
                let h = self.reg(rk(dt));
                self.ins(format!("sub.{t} {h}, {a}, {q}"));
                self.ins(format!("shr.{t} {h}, {h}, 1"));
                self.ins(format!("add.{t} {h}, {h}, {q}"));
                self.ins(format!("shr.{t} {q}, {h}, {}", m.shift - 1));
            } else if m.shift > 0 {
                self.ins(format!("shr.{t} {q}, {q}, {}", m.shift));
            }
        }
        if op == BinaryOp::Div {
            return Some(q);
        }
        let r = self.reg(rk(dt));
        self.ins(format!("mul.lo.{t} {r}, {q}, {c}"));
        self.ins(format!("sub.{t} {r}, {a}, {r}"));
        Some(r)
    }

    fn binary(&mut self, op: BinaryOp, dt: DType, a: &str, b: &str) -> Res<String> {
        use BinaryOp::*;
        if dt == DType::Bool {
            let d = self.reg(Rk::P);
            let i = match op {
                And | Min | Mul => "and",
                Or | Max => "or",
                Xor => "xor",
                _ => return self.err(format!("{op:?} is not defined on bool")),
            };
            self.ins(format!("{i}.pred {d}, {a}, {b}"));
            return Ok(d);
        }
        if dt.is_int() {
            let (t, bt) = (int_ty(dt), bit_ty(dt));
            let d = self.reg(rk(dt));
            let mut wrap = false;
            match op {
                Add => {
                    self.ins(format!("add.{t} {d}, {a}, {b}"));
                    wrap = true;
                }
                Sub => {
                    self.ins(format!("sub.{t} {d}, {a}, {b}"));
                    wrap = true;
                }
                Mul => {
                    self.ins(format!("mul.lo.{t} {d}, {a}, {b}"));
                    wrap = true;
                }
                Div => self.ins(format!("div.{t} {d}, {a}, {b}")),
                Rem => self.ins(format!("rem.{t} {d}, {a}, {b}")),
                And => self.ins(format!("and.{bt} {d}, {a}, {b}")),
                Or => self.ins(format!("or.{bt} {d}, {a}, {b}")),
                Xor => self.ins(format!("xor.{bt} {d}, {a}, {b}")),
                Max => self.ins(format!("max.{t} {d}, {a}, {b}")),
                Min => self.ins(format!("min.{t} {d}, {a}, {b}")),
                Shl | Shr => {
                    // PTX shifts clamp at the width: the language semantics.
                    let amt = if dt == DType::I64 {
                        let (c, s) = (self.reg(Rk::D), self.reg(Rk::R));
                        self.ins(format!("min.u64 {c}, {b}, 64"));
                        self.ins(format!("cvt.u32.u64 {s}, {c}"));
                        s
                    } else {
                        b.to_string()
                    };
                    if op == Shl {
                        self.ins(format!("shl.{bt} {d}, {a}, {amt}"));
                        wrap = true;
                    } else {
                        self.ins(format!("shr.{t} {d}, {a}, {amt}"));
                    }
                }
            }
            if wrap && dt == DType::U8 {
                self.ins(format!("and.b32 {d}, {d}, 255"));
            }
            return Ok(d);
        }
        let (x, y) = (self.up(dt, a), self.up(dt, b));
        if op == Rem {
            // The remainder of f16/bf16 values is exact in f32 and in the dtype.
            let d = self.frem(&x, &y);
            return Ok(self.down(dt, &d));
        }
        let d = self.reg(Rk::F);
        // Explicit `.rn` keeps ptxas from contracting mul+add into fma (bit-exactness).
        let i = match op {
            Add => "add.rn.f32",
            Sub => "sub.rn.f32",
            Mul => "mul.rn.f32",
            Div => "div.rn.f32",
            Max => "max.f32",
            Min => "min.f32",
            _ => return self.err(format!("{op:?} is not supported on {dt}")),
        };
        self.ins(format!("{i} {d}, {x}, {y}"));
        Ok(self.down(dt, &d))
    }

    /// `a % b` on f32 registers, exactly as C's `fmod` (and the interpreter): the
    /// remainder of the quotient truncated toward zero, with the dividend's sign.
    ///
    /// PTX has no float remainder, and `a - trunc(a / b) * b` is not exact. Instead the
    /// magnitudes are reduced in f64, branch-free, in steps: with `x = |a|`, `y = |b|`,
    /// each step takes `x mod (y * 2^k)`, with `k` chosen so that the quotient is below
    /// 2^28; since `y * 2^k` is a multiple of `y`, this keeps `x mod y`. Every step is
    /// exact: the rounded f64 quotient truncates to the true one or one more (fixed by
    /// adding back `y * 2^k`), and the remainder is a multiple of the quantum of
    /// `y * 2^k` below `y * 2^k`, so 24 bits, which the fused multiply-add gets exactly.
    /// Each step removes 27 bits of exponent difference; f32 spans 276 (2^127 over
    /// 2^-149), so 11 steps reach `x < y` for any pair.
    fn frem(&mut self, a: &str, b: &str) -> String {
        let (x, y) = (self.reg(Rk::D), self.reg(Rk::D));
        self.ins(format!("cvt.f64.f32 {x}, {a}"));
        self.ins(format!("abs.f64 {x}, {x}"));
        self.ins(format!("cvt.f64.f32 {y}, {b}"));
        self.ins(format!("abs.f64 {y}, {y}"));
        let (t, ey) = (self.reg(Rk::D), self.reg(Rk::R));
        self.ins(format!("shr.u64 {t}, {y}, 52"));
        self.ins(format!("cvt.u32.u64 {ey}, {t}"));
        for _ in 0..11 {
            let (k, s, ys, q, r, p) = (
                self.reg(Rk::R),
                self.reg(Rk::D),
                self.reg(Rk::D),
                self.reg(Rk::D),
                self.reg(Rk::D),
                self.reg(Rk::P),
            );
            // k = clamp(exponent(x) - exponent(y) - 27, 0, 300); the upper clamp only
            // matters for y = 0, whose result is replaced by NaN below.
            self.ins(format!("shr.u64 {t}, {x}, 52"));
            self.ins(format!("cvt.u32.u64 {k}, {t}"));
            self.ins(format!("sub.s32 {k}, {k}, {ey}"));
            self.ins(format!("sub.s32 {k}, {k}, 27"));
            self.ins(format!("max.s32 {k}, {k}, 0"));
            self.ins(format!("min.s32 {k}, {k}, 300"));
            // 2^k from its exponent field, then y * 2^k (exact).
            self.ins(format!("add.s32 {k}, {k}, 1023"));
            self.ins(format!("cvt.u64.u32 {s}, {k}"));
            self.ins(format!("shl.b64 {s}, {s}, 52"));
            self.ins(format!("mul.rn.f64 {ys}, {y}, {s}"));
            self.ins(format!("div.rn.f64 {q}, {x}, {ys}"));
            self.ins(format!("cvt.rzi.f64.f64 {q}, {q}"));
            self.ins(format!("neg.f64 {q}, {q}"));
            self.ins(format!("fma.rn.f64 {r}, {q}, {ys}, {x}"));
            // The quotient was one too many: add the divisor back.
            self.ins(format!("setp.lt.f64 {p}, {r}, 0d0000000000000000"));
            self.ins(format!("add.rn.f64 {x}, {r}, {ys}"));
            self.ins(format!("selp.f64 {x}, {x}, {r}, {p}"));
        }
        // The dividend's sign (also on a zero remainder), then the special cases: NaN
        // for a non-finite dividend, a NaN or zero divisor; the dividend for an infinite
        // divisor.
        let (f, bits, sign) = (self.reg(Rk::F), self.reg(Rk::R), self.reg(Rk::R));
        self.ins(format!("cvt.rn.f32.f64 {f}, {x}"));
        self.ins(format!("mov.b32 {bits}, {f}"));
        self.ins(format!("mov.b32 {sign}, {a}"));
        self.ins(format!("and.b32 {sign}, {sign}, -2147483648"));
        self.ins(format!("or.b32 {bits}, {bits}, {sign}"));
        self.ins(format!("mov.b32 {f}, {bits}"));
        let (p, q) = (self.reg(Rk::P), self.reg(Rk::P));
        self.ins(format!("testp.infinite.f32 {p}, {b}"));
        self.ins(format!("selp.f32 {f}, {a}, {f}, {p}"));
        self.ins(format!("testp.finite.f32 {p}, {a}"));
        self.ins(format!("not.pred {p}, {p}"));
        self.ins(format!("setp.nan.f32 {q}, {b}, {b}"));
        self.ins(format!("or.pred {p}, {p}, {q}"));
        self.ins(format!("setp.eq.f32 {q}, {b}, 0f00000000"));
        self.ins(format!("or.pred {p}, {p}, {q}"));
        self.ins(format!("selp.f32 {f}, 0f7FC00000, {f}, {p}"));
        f
    }

    fn compare(&mut self, op: CmpOp, dt: DType, a: &str, b: &str) -> Res<String> {
        let d = self.reg(Rk::P);
        let (a, b, t) = if dt == DType::Bool {
            let (x, y) = (self.reg(Rk::R), self.reg(Rk::R));
            self.ins(format!("selp.u32 {x}, 1, 0, {a}"));
            self.ins(format!("selp.u32 {y}, 1, 0, {b}"));
            (x, y, "u32")
        } else if dt.is_float() {
            (self.up(dt, a), self.up(dt, b), "f32")
        } else {
            (a.to_string(), b.to_string(), int_ty(dt))
        };
        let c = match op {
            CmpOp::Eq => "eq",
            // Float `!=` holds for NaN (unordered).
            CmpOp::Ne if t == "f32" => "neu",
            CmpOp::Ne => "ne",
            CmpOp::Lt => "lt",
            CmpOp::Le => "le",
            CmpOp::Gt => "gt",
            CmpOp::Ge => "ge",
        };
        self.ins(format!("setp.{c}.{t} {d}, {a}, {b}"));
        Ok(d)
    }

    /// Converts one element between dtypes with the language's cast semantics.
    pub fn cast(&mut self, from: DType, to: DType, a: &str) -> Res<String> {
        if from == to {
            return Ok(a.to_string());
        }
        let d = self.reg(rk(to));
        match (from, to) {
            (_, DType::Bool) => {
                if from.is_float() {
                    let x = self.up(from, a);
                    self.ins(format!("setp.neu.f32 {d}, {x}, 0f00000000"));
                } else {
                    self.ins(format!("setp.ne.{} {d}, {a}, 0", int_ty(from)));
                }
            }
            (DType::Bool, _) => match to {
                DType::F32 => self.ins(format!("selp.f32 {d}, 0f3F800000, 0f00000000, {a}")),
                DType::F16 => self.ins(format!("selp.b16 {d}, 0x3C00, 0x0000, {a}")),
                DType::BF16 => self.ins(format!("selp.b16 {d}, 0x3F80, 0x0000, {a}")),
                DType::I64 => self.ins(format!("selp.b64 {d}, 1, 0, {a}")),
                _ => self.ins(format!("selp.b32 {d}, 1, 0, {a}")),
            },
            _ if from.is_float() && to.is_float() => {
                let x = self.up(from, a);
                let r = self.down(to, &x);
                return Ok(r);
            }
            _ if from.is_float() => {
                // cvt saturates and maps NaN to 0.
                let x = self.up(from, a);
                match to {
                    DType::I32 => self.ins(format!("cvt.rzi.s32.f32 {d}, {x}")),
                    DType::U32 => self.ins(format!("cvt.rzi.u32.f32 {d}, {x}")),
                    DType::I64 => {
                        // The 64-bit cvt maps NaN to i64::MIN, not 0: select 0 for NaN.
                        let nan = self.reg(Rk::P);
                        self.ins(format!("cvt.rzi.s64.f32 {d}, {x}"));
                        self.ins(format!("setp.nan.f32 {nan}, {x}, {x}"));
                        self.ins(format!("selp.b64 {d}, 0, {d}, {nan}"));
                    }
                    _ => {
                        self.ins(format!("cvt.rzi.u32.f32 {d}, {x}"));
                        self.ins(format!("min.u32 {d}, {d}, 255"));
                    }
                }
            }
            _ if to == DType::F32 || (to.is_float() && from == DType::U8) => {
                let f = self.reg(Rk::F);
                self.ins(format!("cvt.rn.f32.{} {f}, {a}", int_ty(from)));
                return Ok(self.down(to, &f));
            }
            _ if to.is_float() => {
                // One rounding to f16/bf16: truncate to f32 with a sticky low bit when
                // inexact (round to odd), then round to nearest even.
                let t = int_ty(from);
                let (f, g) = (self.reg(Rk::F), self.reg(Rk::F));
                let (back, p) = (self.reg(rk(from)), self.reg(Rk::P));
                let (bits, odd) = (self.reg(Rk::R), self.reg(Rk::R));
                self.ins(format!("cvt.rz.f32.{t} {f}, {a}"));
                self.ins(format!("cvt.rzi.{t}.f32 {back}, {f}"));
                self.ins(format!("setp.ne.{t} {p}, {back}, {a}"));
                self.ins(format!("mov.b32 {bits}, {f}"));
                self.ins(format!("or.b32 {odd}, {bits}, 1"));
                self.ins(format!("selp.b32 {bits}, {odd}, {bits}, {p}"));
                self.ins(format!("mov.b32 {g}, {bits}"));
                return Ok(self.down(to, &g));
            }
            _ => match (from, to) {
                (DType::I32, DType::I64) => self.ins(format!("cvt.s64.s32 {d}, {a}")),
                (_, DType::I64) => self.ins(format!("cvt.u64.u32 {d}, {a}")),
                (DType::I64, DType::U8) => {
                    self.ins(format!("cvt.u32.u64 {d}, {a}"));
                    self.ins(format!("and.b32 {d}, {d}, 255"));
                }
                (DType::I64, _) => self.ins(format!("cvt.u32.u64 {d}, {a}")),
                (_, DType::U8) => self.ins(format!("and.b32 {d}, {a}, 255")),
                _ => self.ins(format!("mov.b32 {d}, {a}")),
            },
        }
        Ok(d)
    }
}

/// The `.param` type of a scalar parameter.
pub fn param_ty(t: DType) -> Option<&'static str> {
    match t {
        DType::I32 => Some("s32"),
        DType::U32 => Some("u32"),
        DType::I64 => Some("s64"),
        DType::F32 => Some("f32"),
        _ => None,
    }
}
