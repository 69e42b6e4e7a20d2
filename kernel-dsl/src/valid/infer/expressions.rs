//! Expressions: every `Expr` of the untyped IR, typed, with its implicit conversions
//! made explicit (memory accesses, pointer arithmetic, binary and unary ops, reductions,
//! `dot`, and the rest).

use super::{shape_str, Infer, R};
use crate::error::CompileError;
use crate::ir::{
    AtomicOp, BinaryOp, DType, Def, Elem, Expr, FlagOp, Literal, Loc, ReduceOp, Type, UnaryOp,
    ValueId,
};

impl Infer<'_> {
    pub(super) fn expr(&mut self, old: ValueId) -> R<ValueId> {
        let value = self.src.value(old);
        let loc = value.loc;
        let Def::Expr(expr) = &value.def else {
            return Err(CompileError::new(
                loc,
                "internal: `Let` of a non-expression",
            ));
        };
        match expr {
            Expr::Param(i) => {
                let ty = self.src.params[*i].kind.ty();
                Ok(self.emit(Expr::Param(*i), ty, loc))
            }
            Expr::Literal(lit) => {
                let is_weak = match lit {
                    Literal::Int(_, s) | Literal::Float(_, s) => s.is_none(),
                    Literal::Bool(_) => false,
                };
                let v = self.typed_literal(*lit, None, loc)?;
                if is_weak {
                    self.weak.insert(v, *lit);
                }
                Ok(v)
            }
            Expr::ProgramId(a) => {
                Ok(self.emit(Expr::ProgramId(*a), Type::val(DType::I32, vec![]), loc))
            }
            Expr::GlobalTimer => {
                Ok(self.emit(Expr::GlobalTimer, Type::val(DType::I64, vec![]), loc))
            }
            Expr::SmId => Ok(self.emit(Expr::SmId, Type::val(DType::I32, vec![]), loc)),
            Expr::NumPrograms(a) => {
                Ok(self.emit(Expr::NumPrograms(*a), Type::val(DType::I32, vec![]), loc))
            }
            Expr::Arange { start, end } => {
                let n = (end - start) as usize;
                if start < &i64::from(i32::MIN) || end > &i64::from(i32::MAX) {
                    return Err(CompileError::new(loc, "`arange` bounds must fit in i32"));
                }
                Ok(self.emit(
                    Expr::Arange {
                        start: *start,
                        end: *end,
                    },
                    Type::val(DType::I32, vec![n]),
                    loc,
                ))
            }
            Expr::Splat { value, shape } => {
                let v = self.get(*value)?;
                let ty = self.ty(v).clone();
                if !ty.is_scalar() {
                    return Err(CompileError::new(
                        loc,
                        format!("`full` takes a scalar value, found a tile {ty}"),
                    ));
                }
                Ok(self.emit(
                    Expr::Splat {
                        value: v,
                        shape: shape.clone(),
                    },
                    Type::tile(ty.elem, shape.clone()),
                    loc,
                ))
            }
            Expr::Broadcast { value, shape } => {
                let v = self.get(*value)?;
                let v = if self.weak.contains_key(&v) {
                    let lit = self.weak[&v];
                    self.typed_literal(lit, None, loc)?
                } else {
                    v
                };
                let ty = self.ty(v).clone();
                if !ty.is_scalar() && ty.shape.len() != shape.len() {
                    return Err(CompileError::new(
                        loc,
                        format!(
                            "`broadcast_to` keeps the rank: {} to {} (use `expand_dims` first)",
                            shape_str(&ty.shape),
                            shape_str(shape)
                        ),
                    ));
                }
                self.broadcast(v, shape, loc)
            }
            Expr::ExpandDims { value, axis } => {
                let v = self.get(*value)?;
                let ty = self.ty(v).clone();
                if *axis > ty.shape.len() {
                    return Err(CompileError::new(
                        loc,
                        format!(
                            "`expand_dims` axis {axis} is out of range for a tile of rank {}",
                            ty.shape.len()
                        ),
                    ));
                }
                if ty.shape.len() >= 4 {
                    return Err(CompileError::new(loc, "tiles have rank at most 4"));
                }
                let mut shape = ty.shape.clone();
                shape.insert(*axis, 1);
                Ok(self.emit(
                    Expr::ExpandDims {
                        value: v,
                        axis: *axis,
                    },
                    Type::tile(ty.elem, shape),
                    loc,
                ))
            }
            Expr::Unary { op, arg } => {
                let mut a = [self.get(*arg)?];
                let name = format!("{op:?}").to_lowercase();
                let d = self.unify_dtypes(&mut a, loc, &name)?;
                let needs_float = !matches!(op, UnaryOp::Neg | UnaryOp::Not | UnaryOp::Abs);
                let d = if needs_float && self.weak.contains_key(&a[0]) {
                    // `exp(1)`: a weak integer literal becomes f32.
                    a[0] = self.with_dtype(a[0], DType::F32, loc)?;
                    DType::F32
                } else {
                    d
                };
                if needs_float && !d.is_float() {
                    return Err(CompileError::new(
                        loc,
                        format!("`{name}` needs a float operand, found {d}: convert with `as f32`"),
                    ));
                }
                if *op == UnaryOp::Not && d.is_float() {
                    return Err(CompileError::new(loc, "`!` applies to bool and integers"));
                }
                if matches!(op, UnaryOp::Neg | UnaryOp::Abs) && d == DType::Bool {
                    return Err(CompileError::new(
                        loc,
                        format!("`{name}` does not apply to bool"),
                    ));
                }
                let shape = self.ty(a[0]).shape.clone();
                Ok(self.emit(Expr::Unary { op: *op, arg: a[0] }, Type::val(d, shape), loc))
            }
            Expr::Binary { op, lhs, rhs } => self.binary(*op, *lhs, *rhs, loc),
            Expr::Compare { op, lhs, rhs } => {
                let mut v = [self.get(*lhs)?, self.get(*rhs)?];
                let name = format!("{op:?}").to_lowercase();
                let (_, shape) = self.elementwise(&mut v, loc, &name)?;
                Ok(self.emit(
                    Expr::Compare {
                        op: *op,
                        lhs: v[0],
                        rhs: v[1],
                    },
                    Type::val(DType::Bool, shape),
                    loc,
                ))
            }
            Expr::Select { cond, then, other } => {
                let c = self.get(*cond)?;
                let c = self.bool_operand(c, loc, "the condition of `select`")?;
                let mut v = [self.get(*then)?, self.get(*other)?];
                let d = self.unify_dtypes(&mut v, loc, "select")?;
                let shape = self.common_shape(&[c, v[0], v[1]], loc)?;
                let c = self.broadcast(c, &shape, loc)?;
                let t = self.broadcast(v[0], &shape, loc)?;
                let o = self.broadcast(v[1], &shape, loc)?;
                Ok(self.emit(
                    Expr::Select {
                        cond: c,
                        then: t,
                        other: o,
                    },
                    Type::val(d, shape),
                    loc,
                ))
            }
            Expr::Dot4 { a, b, acc } => {
                let mut words = [self.get(*a)?, self.get(*b)?];
                for (w, which) in words.iter_mut().zip(["first", "second"]) {
                    // A bare literal is four bytes of an `i32`.
                    *w = self.with_dtype(*w, DType::I32, loc)?;
                    let ty = self.ty(*w);
                    if !matches!(ty.elem, Elem::Val(DType::I32 | DType::U32)) {
                        return Err(CompileError::new(
                            loc,
                            format!(
                                "the {which} operand of `dot4` is {}: it takes i32 (four signed bytes an element) or u32 (four unsigned bytes); reinterpret other 32-bit words with `.bitcast::<i32>()`",
                                ty.elem
                            ),
                        ));
                    }
                }
                let c = self.with_dtype(self.get(*acc)?, DType::I32, loc)?;
                let cty = self.ty(c);
                if cty.elem != Elem::Val(DType::I32) {
                    return Err(CompileError::new(
                        loc,
                        format!(
                            "the accumulator of `dot4` is {}: it must be i32 (convert with `as i32`)",
                            cty.elem
                        ),
                    ));
                }
                let shape = self.common_shape(&[words[0], words[1], c], loc)?;
                let a = self.broadcast(words[0], &shape, loc)?;
                let b = self.broadcast(words[1], &shape, loc)?;
                let acc = self.broadcast(c, &shape, loc)?;
                Ok(self.emit(Expr::Dot4 { a, b, acc }, Type::val(DType::I32, shape), loc))
            }
            Expr::BytePerm { a, b, sel } => {
                // A bare literal word takes the other word's dtype (`i32` if both are).
                let (mut x, mut y) = (self.get(*a)?, self.get(*b)?);
                let word = |ty: &Type| match ty.elem {
                    Elem::Val(d @ (DType::I32 | DType::U32)) => Some(d),
                    _ => None,
                };
                let dt = word(self.ty(x)).or(word(self.ty(y))).unwrap_or(DType::I32);
                x = self.with_dtype(x, dt, loc)?;
                y = self.with_dtype(y, dt, loc)?;
                for (w, which) in [(x, "first"), (y, "second")] {
                    let ty = self.ty(w);
                    if ty.elem != Elem::Val(dt) {
                        return Err(CompileError::new(
                            loc,
                            format!(
                                "the {which} word of `byte_perm` is {}: both words are i32 or both u32 (the result's dtype); reinterpret with `.bitcast::<{dt}>()`",
                                ty.elem
                            ),
                        ));
                    }
                }
                let s = self.with_dtype(self.get(*sel)?, DType::U32, loc)?;
                let sty = self.ty(s);
                if word(sty).is_none() {
                    return Err(CompileError::new(
                        loc,
                        format!(
                            "the selector of `byte_perm` is {}: it must be i32 or u32 (four 3-bit byte indices, one a nibble)",
                            sty.elem
                        ),
                    ));
                }
                let shape = self.common_shape(&[x, y, s], loc)?;
                let a = self.broadcast(x, &shape, loc)?;
                let b = self.broadcast(y, &shape, loc)?;
                let sel = self.broadcast(s, &shape, loc)?;
                Ok(self.emit(Expr::BytePerm { a, b, sel }, Type::val(dt, shape), loc))
            }
            Expr::Cast { value, to } => {
                let v = self.get(*value)?;
                let v = match self.weak.get(&v).copied() {
                    Some(lit) => self.typed_literal(lit, None, loc)?,
                    None => v,
                };
                let ty = self.ty(v).clone();
                if ty.pointee().is_some() {
                    return Err(CompileError::new(loc, "pointers cannot be cast"));
                }
                if ty.dtype() == Some(*to) {
                    return Ok(v);
                }
                Ok(self.emit(
                    Expr::Cast { value: v, to: *to },
                    Type::val(*to, ty.shape.clone()),
                    loc,
                ))
            }
            Expr::Bitcast { value, to } => {
                let v = self.get(*value)?;
                let v = match self.weak.get(&v).copied() {
                    Some(lit) => self.typed_literal(lit, None, loc)?,
                    None => v,
                };
                let ty = self.ty(v).clone();
                let Some(from) = ty.dtype().filter(|_| ty.pointee().is_none()) else {
                    return Err(CompileError::new(loc, "pointers cannot be bitcast"));
                };
                let same_width = from.size_bytes() == to.size_bytes()
                    && from != DType::Bool
                    && *to != DType::Bool;
                if !same_width {
                    return Err(CompileError::new(
                        loc,
                        format!(
                            "`bitcast` from {from} ({} bits) to {to} ({} bits): a bitcast keeps the bits, so the widths must match (i32/u32/f32 among themselves, f16/bf16); use `as` to convert the value",
                            bits_of(from),
                            bits_of(*to)
                        ),
                    ));
                }
                if from == *to {
                    return Ok(v);
                }
                Ok(self.emit(
                    Expr::Bitcast { value: v, to: *to },
                    Type::val(*to, ty.shape.clone()),
                    loc,
                ))
            }
            Expr::AddPtr { ptr, offset } => self.add_ptr(*ptr, *offset, loc),
            Expr::Load { ptr, mask, other } => {
                let p = self.get(*ptr)?;
                let pty = self.ty(p).clone();
                let Elem::Ptr(d) = pty.elem else {
                    return Err(CompileError::new(
                        loc,
                        format!("`load` needs pointers (`ptr + offsets`), found {pty}"),
                    ));
                };
                let mut ops = vec![p];
                let m = match mask {
                    Some(m) => {
                        let m = self.get(*m)?;
                        let m = self.bool_operand(m, loc, "the mask of `load`")?;
                        ops.push(m);
                        Some(m)
                    }
                    None => None,
                };
                let o = match other {
                    Some(o) => {
                        let o = self.get(*o)?;
                        let o = self.with_dtype(o, d, loc)?;
                        let oty = self.ty(o).clone();
                        if oty.elem != Elem::Val(d) {
                            return Err(CompileError::new(
                                loc,
                                format!(
                                    "`load` from Ptr<{d}> needs `other` of type {d}, found {}",
                                    oty.elem
                                ),
                            ));
                        }
                        ops.push(o);
                        Some(o)
                    }
                    None => None,
                };
                let shape = self.common_shape(&ops, loc)?;
                let p = self.broadcast(p, &shape, loc)?;
                let m = match m {
                    Some(m) => Some(self.broadcast(m, &shape, loc)?),
                    None => None,
                };
                let o = match o {
                    Some(o) => Some(self.broadcast(o, &shape, loc)?),
                    None => None,
                };
                Ok(self.emit(
                    Expr::Load {
                        ptr: p,
                        mask: m,
                        other: o,
                    },
                    Type::val(d, shape),
                    loc,
                ))
            }
            Expr::Reduce { op, value, axis } => {
                let v = self.get(*value)?;
                if self.weak.contains_key(&v) {
                    return Err(CompileError::new(loc, "reductions apply to tiles"));
                }
                let ty = self.ty(v).clone();
                let Elem::Val(d) = ty.elem else {
                    return Err(CompileError::new(
                        loc,
                        "reductions do not apply to pointers",
                    ));
                };
                if ty.is_scalar() {
                    return Err(CompileError::new(
                        loc,
                        "reductions apply to tiles, not scalars",
                    ));
                }
                if *axis >= ty.shape.len() {
                    return Err(CompileError::new(
                        loc,
                        format!(
                            "axis {axis} is out of range for a tile of rank {}",
                            ty.shape.len()
                        ),
                    ));
                }
                if d == DType::Bool {
                    return Err(CompileError::new(
                        loc,
                        "reductions of bool tiles: cast to i32 first",
                    ));
                }
                let mut shape = ty.shape.clone();
                shape.remove(*axis);
                let rd = if matches!(op, ReduceOp::Argmax | ReduceOp::Argmin) {
                    DType::I32
                } else {
                    d
                };
                Ok(self.emit(
                    Expr::Reduce {
                        op: *op,
                        value: v,
                        axis: *axis,
                    },
                    Type::val(rd, shape),
                    loc,
                ))
            }
            Expr::Scan { .. }
            | Expr::Permute { .. }
            | Expr::Reshape { .. }
            | Expr::Histogram { .. }
            | Expr::Rand { .. } => self.more_ops(expr, loc),
            Expr::ClusterGather { value } => {
                let mut v = self.get(*value)?;
                if self.weak.contains_key(&v) {
                    let lit = self.weak[&v];
                    v = self.typed_literal(lit, None, loc)?;
                }
                let ty = self.ty(v).clone();
                let Elem::Val(d) = ty.elem else {
                    return Err(CompileError::new(
                        loc,
                        "`cluster_gather` exchanges values, not pointers",
                    ));
                };
                if ty.shape.len() >= 4 {
                    return Err(CompileError::new(loc, "tiles have rank at most 4"));
                }
                let mut shape = vec![self.src.cluster_size() as usize];
                shape.extend(&ty.shape);
                Ok(self.emit(Expr::ClusterGather { value: v }, Type::val(d, shape), loc))
            }
            Expr::Dot { a, b, acc } => {
                let a = self.get(*a)?;
                let b = self.get(*b)?;
                let (ta, tb) = (self.ty(a).clone(), self.ty(b).clone());
                if ta.shape.len() != 2 || tb.shape.len() != 2 {
                    return Err(CompileError::new(
                        loc,
                        format!("`dot` takes 2-D tiles, found {ta} and {tb}"),
                    ));
                }
                if ta.shape[1] != tb.shape[0] {
                    return Err(CompileError::new(
                        loc,
                        format!("`dot` inner dimensions differ: {ta} x {tb}"),
                    ));
                }
                if ta.elem != tb.elem || !ta.dtype().is_some_and(|d| d.is_float()) {
                    return Err(CompileError::new(
                        loc,
                        format!(
                            "`dot` takes two float tiles of one dtype, found {} and {}",
                            ta.elem, tb.elem
                        ),
                    ));
                }
                let shape = vec![ta.shape[0], tb.shape[1]];
                let out_ty = Type::val(DType::F32, shape);
                let acc = match acc {
                    Some(c) => {
                        let c = self.get(*c)?;
                        Some(self.conform(c, &out_ty, loc, "the accumulator of `dot`")?)
                    }
                    None => None,
                };
                Ok(self.emit(Expr::Dot { a, b, acc }, out_ty, loc))
            }
            Expr::Atomic {
                op,
                ptr,
                value,
                mask,
            } => {
                let (p, v, m) = self.access(*ptr, *value, *mask, loc, "atomic")?;
                let d = self.ty(v).dtype().expect("access checks values");
                if !matches!(d, DType::F32 | DType::I32) {
                    return Err(CompileError::new(
                        loc,
                        format!("atomics support f32 and i32, found {d}"),
                    ));
                }
                let _ = AtomicOp::Add;
                let shape = self.ty(p).shape.clone();
                Ok(self.emit(
                    Expr::Atomic {
                        op: *op,
                        ptr: p,
                        value: v,
                        mask: m,
                    },
                    Type::val(d, shape),
                    loc,
                ))
            }
        }
    }

    /// Checks and conforms the operands of a store or atomic.
    pub(super) fn access(
        &mut self,
        ptr: ValueId,
        value: ValueId,
        mask: Option<ValueId>,
        loc: Loc,
        what: &str,
    ) -> R<(ValueId, ValueId, Option<ValueId>)> {
        let p = self.get(ptr)?;
        let pty = self.ty(p).clone();
        let Elem::Ptr(d) = pty.elem else {
            return Err(CompileError::new(
                loc,
                format!("`{what}` needs pointers (`ptr + offsets`), found {pty}"),
            ));
        };
        let v = self.get(value)?;
        let v = self.with_dtype(v, d, loc)?;
        let vty = self.ty(v).clone();
        if vty.elem != Elem::Val(d) {
            return Err(CompileError::new(
                loc,
                format!(
                    "`{what}` of {} through Ptr<{d}>: convert with `as {d}`",
                    vty.elem
                ),
            ));
        }
        let mut ops = vec![p, v];
        let m = match mask {
            Some(m) => {
                let m = self.get(m)?;
                let m = self.bool_operand(m, loc, "the mask")?;
                ops.push(m);
                Some(m)
            }
            None => None,
        };
        let shape = self.common_shape(&ops, loc)?;
        if shape != pty.shape && pty.is_scalar() {
            return Err(CompileError::new(
                loc,
                format!("`{what}` of a tile {vty} through a single pointer: offset the pointer with a tile"),
            ));
        }
        let p = self.broadcast(p, &shape, loc)?;
        let v = self.broadcast(v, &shape, loc)?;
        let m = match m {
            Some(m) => Some(self.broadcast(m, &shape, loc)?),
            None => None,
        };
        Ok((p, v, m))
    }

    /// The pointers and mask of a `prefetch`, the mask broadcast to the pointers' shape.
    pub(super) fn prefetch(
        &mut self,
        ptr: ValueId,
        mask: Option<ValueId>,
        loc: Loc,
    ) -> R<(ValueId, Option<ValueId>)> {
        let p = self.get(ptr)?;
        let pty = self.ty(p).clone();
        if !matches!(pty.elem, Elem::Ptr(_)) {
            return Err(CompileError::new(
                loc,
                format!("`prefetch` needs pointers (`ptr + offsets`), found {pty}"),
            ));
        }
        let Some(m) = mask else {
            return Ok((p, None));
        };
        let m = self.get(m)?;
        let m = self.bool_operand(m, loc, "the mask of `prefetch`")?;
        let shape = self.common_shape(&[p, m], loc)?;
        let p = self.broadcast(p, &shape, loc)?;
        let m = self.broadcast(m, &shape, loc)?;
        Ok((p, Some(m)))
    }

    /// The single `i32` pointer and the `i32` value of `signal_flag` /
    /// `wait_flag_at_least`.
    pub(super) fn flag(
        &mut self,
        op: FlagOp,
        ptr: ValueId,
        value: ValueId,
        loc: Loc,
    ) -> R<(ValueId, ValueId)> {
        let name = match op {
            FlagOp::Signal => "signal_flag",
            FlagOp::WaitAtLeast => "wait_flag_at_least",
        };
        let p = self.get(ptr)?;
        let pty = self.ty(p).clone();
        if pty.elem != Elem::Ptr(DType::I32) || !pty.is_scalar() {
            return Err(CompileError::new(
                loc,
                format!("`{name}` needs a single pointer to an i32 flag, found {pty}"),
            ));
        }
        let v = self.get(value)?;
        let v = self.with_dtype(v, DType::I32, loc)?;
        let vty = self.ty(v).clone();
        if !vty.is_scalar() || vty.elem != Elem::Val(DType::I32) {
            return Err(CompileError::new(
                loc,
                format!("`{name}` takes an i32 scalar value, found {vty}"),
            ));
        }
        Ok((p, v))
    }

    /// The single pointer and the `i32` count of a `prefetch_range`.
    pub(super) fn prefetch_range(
        &mut self,
        ptr: ValueId,
        count: ValueId,
        loc: Loc,
    ) -> R<(ValueId, ValueId)> {
        let p = self.get(ptr)?;
        let pty = self.ty(p).clone();
        if !matches!(pty.elem, Elem::Ptr(_)) || !pty.is_scalar() {
            return Err(CompileError::new(
                loc,
                format!("`prefetch_range` needs a single pointer, found {pty}"),
            ));
        }
        let n = self.get(count)?;
        let n = self.with_dtype(n, DType::I32, loc)?;
        let nty = self.ty(n).clone();
        if !nty.is_scalar() || nty.elem != Elem::Val(DType::I32) {
            return Err(CompileError::new(
                loc,
                format!("`prefetch_range` counts elements with an i32 scalar, found {nty}"),
            ));
        }
        Ok((p, n))
    }

    pub(super) fn add_ptr(&mut self, ptr: ValueId, offset: ValueId, loc: Loc) -> R<ValueId> {
        let p = self.get(ptr)?;
        let o = self.get(offset)?;
        self.ptr_plus(p, o, loc)
    }

    pub(super) fn ptr_plus(&mut self, p: ValueId, o: ValueId, loc: Loc) -> R<ValueId> {
        let o = if self.weak.contains_key(&o) {
            self.with_dtype(o, DType::I32, loc)?
        } else {
            o
        };
        let oty = self.ty(o).clone();
        if !oty.dtype().is_some_and(|d| d.is_int()) {
            return Err(CompileError::new(
                loc,
                format!("pointer offsets are integers, found {}", oty.elem),
            ));
        }
        let pty = self.ty(p).clone();
        let shape = self.common_shape(&[p, o], loc)?;
        let p = self.broadcast(p, &shape, loc)?;
        let o = self.broadcast(o, &shape, loc)?;
        Ok(self.emit(
            Expr::AddPtr { ptr: p, offset: o },
            Type::tile(pty.elem, shape),
            loc,
        ))
    }

    pub(super) fn binary(
        &mut self,
        op: BinaryOp,
        lhs: ValueId,
        rhs: ValueId,
        loc: Loc,
    ) -> R<ValueId> {
        let l = self.get(lhs)?;
        let r = self.get(rhs)?;
        let (lp, rp) = (
            self.ty(l).pointee().is_some(),
            self.ty(r).pointee().is_some(),
        );
        match (lp, rp, op) {
            (true, false, BinaryOp::Add) => return self.ptr_plus(l, r, loc),
            (false, true, BinaryOp::Add) => return self.ptr_plus(r, l, loc),
            (true, _, _) | (_, true, _) => {
                return Err(CompileError::new(
                    loc,
                    "pointers support only `ptr + offset`",
                ))
            }
            _ => {}
        }
        let name = format!("{op:?}").to_lowercase();
        let mut v = [l, r];
        let (d, shape) = self.elementwise(&mut v, loc, &name)?;
        let ok = match op {
            BinaryOp::Add
            | BinaryOp::Sub
            | BinaryOp::Mul
            | BinaryOp::Div
            | BinaryOp::Rem
            | BinaryOp::Max
            | BinaryOp::Min => d != DType::Bool,
            BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => !d.is_float(),
            BinaryOp::Shl | BinaryOp::Shr => d.is_int(),
        };
        if !ok {
            return Err(CompileError::new(
                loc,
                format!("`{name}` does not apply to {d}"),
            ));
        }
        Ok(self.emit(
            Expr::Binary {
                op,
                lhs: v[0],
                rhs: v[1],
            },
            Type::val(d, shape),
            loc,
        ))
    }
}

/// The width of a dtype in bits, as a bitcast sees it (`bool` as one bit).
fn bits_of(d: DType) -> usize {
    if d == DType::Bool {
        1
    } else {
        d.size_bytes() * 8
    }
}
