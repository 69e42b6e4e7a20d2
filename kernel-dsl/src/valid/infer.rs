//! Type and shape inference: the untyped IR to the typed IR.
//!
//! Walks the kernel in program order and rebuilds it into a fresh arena in which every
//! value has a type, and every implicit conversion of the surface language is explicit:
//! - literals without a suffix are *weak*: they take the dtype of the other operand
//!   (an integer literal may become a float; a float literal never becomes an integer);
//! - scalars splat to the other operand's shape, and tiles broadcast NumPy-style (shapes
//!   aligned on the right, extents of 1 stretched);
//! - `ptr + offset` becomes [`Expr::AddPtr`].
//!
//! Typed operands never convert silently: `f32 + bf16` or `f32 + i32` is an error that
//! asks for an `as` cast.

use std::collections::HashMap;

use crate::error::CompileError;
use crate::ir::{
    AtomicOp, BinaryOp, Block, Carried, DType, Def, Elem, Expr, Kernel, Literal, Loc, Merge,
    ReduceOp, Stmt, Type, UnaryOp, Value, ValueId,
};

type R<T> = Result<T, CompileError>;

mod more_ops;

/// Infers types and shapes of an untyped kernel, producing a typed kernel.
pub fn infer(kernel: &Kernel) -> R<Kernel> {
    let mut cx = Infer {
        src: kernel,
        out: Vec::new(),
        map: vec![None; kernel.values.len()],
        weak: HashMap::new(),
        blocks: vec![Vec::new()],
    };
    cx.block(&kernel.body)?;
    let body = Block {
        stmts: cx.blocks.pop().unwrap_or_default(),
    };
    Ok(Kernel {
        name: kernel.name.clone(),
        params: kernel.params.clone(),
        consts: kernel.consts.clone(),
        num_warps: kernel.num_warps,
        num_stages: kernel.num_stages,
        cluster: kernel.cluster,
        values: cx.out,
        body,
    })
}

struct Infer<'a> {
    src: &'a Kernel,
    out: Vec<Value>,
    map: Vec<Option<ValueId>>,
    /// New values that are literals without a suffix, with their literal.
    weak: HashMap<ValueId, Literal>,
    blocks: Vec<Vec<Stmt>>,
}

fn shape_str(s: &[usize]) -> String {
    let d: Vec<String> = s.iter().map(|x| x.to_string()).collect();
    format!("[{}]", d.join(", "))
}

impl Infer<'_> {
    fn ty(&self, v: ValueId) -> &Type {
        self.out[v.index()]
            .ty
            .as_ref()
            .expect("inference types values as it creates them")
    }

    fn get(&self, old: ValueId) -> R<ValueId> {
        self.map[old.index()].ok_or_else(|| {
            CompileError::new(
                self.src.value(old).loc,
                "internal: value used before its definition",
            )
        })
    }

    fn add(&mut self, def: Def, ty: Type, loc: Loc) -> ValueId {
        self.out.push(Value {
            def,
            ty: Some(ty),
            loc,
        });
        ValueId(self.out.len() as u32 - 1)
    }

    fn emit(&mut self, expr: Expr, ty: Type, loc: Loc) -> ValueId {
        let v = self.add(Def::Expr(expr), ty, loc);
        self.blocks
            .last_mut()
            .expect("inference always has an open block")
            .push(Stmt::Let(v));
        v
    }

    fn block(&mut self, b: &Block) -> R<()> {
        for s in &b.stmts {
            self.stmt(s)?;
        }
        Ok(())
    }

    fn nested(&mut self, b: &Block) -> R<Block> {
        self.blocks.push(Vec::new());
        let r = self.block(b);
        let stmts = self.blocks.pop().unwrap_or_default();
        r?;
        Ok(Block { stmts })
    }

    fn stmt(&mut self, s: &Stmt) -> R<()> {
        match s {
            Stmt::WaitPriorKernels { .. } | Stmt::LaunchDependents { .. } => {
                self.blocks.last_mut().expect("open block").push(s.clone());
                Ok(())
            }
            Stmt::Let(v) => {
                let new = self.expr(*v)?;
                self.map[v.index()] = Some(new);
                Ok(())
            }
            Stmt::PrefetchRange { ptr, count, loc } => {
                let (ptr, count) = self.prefetch_range(*ptr, *count, *loc)?;
                self.blocks
                    .last_mut()
                    .expect("open block")
                    .push(Stmt::PrefetchRange {
                        ptr,
                        count,
                        loc: *loc,
                    });
                Ok(())
            }
            Stmt::Prefetch { ptr, mask, loc } => {
                let (ptr, mask) = self.prefetch(*ptr, *mask, *loc)?;
                self.blocks
                    .last_mut()
                    .expect("open block")
                    .push(Stmt::Prefetch {
                        ptr,
                        mask,
                        loc: *loc,
                    });
                Ok(())
            }
            Stmt::Store {
                ptr,
                value,
                mask,
                loc,
            } => {
                let (ptr, value, mask) = self.access(*ptr, *value, *mask, *loc, "store")?;
                self.blocks
                    .last_mut()
                    .expect("open block")
                    .push(Stmt::Store {
                        ptr,
                        value,
                        mask,
                        loc: *loc,
                    });
                Ok(())
            }
            Stmt::For {
                index,
                start,
                end,
                step,
                carried,
                body,
                loc,
            } => self.for_stmt(*index, *start, *end, *step, carried, body, *loc),
            Stmt::While {
                cond_body,
                cond,
                carried,
                body,
                loc,
            } => self.while_stmt(cond_body, *cond, carried, body, *loc),
            Stmt::If {
                cond,
                then_body,
                else_body,
                merges,
                loc,
            } => self.if_stmt(*cond, then_body, else_body, merges, *loc),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn for_stmt(
        &mut self,
        index: ValueId,
        start: ValueId,
        end: ValueId,
        step: ValueId,
        carried: &[Carried],
        body: &Block,
        loc: Loc,
    ) -> R<()> {
        let mut bounds = [self.get(start)?, self.get(end)?, self.get(step)?];
        let dtype = self.unify_scalar_ints(&mut bounds, loc, "loop bounds and step")?;
        let new_index = self.add(Def::LoopIndex, Type::val(dtype, vec![]), loc);
        self.map[index.index()] = Some(new_index);
        let mut params = Vec::new();
        for c in carried {
            let mut init = self.get(c.init)?;
            if let Some(lit) = self.weak.get(&init).copied() {
                // A weak literal carried by a loop takes its default type.
                init = self.typed_literal(lit, None, self.out[init.index()].loc)?;
            }
            let ty = self.ty(init).clone();
            let p = self.add(Def::Carried { init }, ty, self.src.value(c.param).loc);
            self.map[c.param.index()] = Some(p);
            params.push((init, p));
        }
        self.blocks.push(Vec::new());
        let r = self.block(body);
        if let Err(e) = r {
            self.blocks.pop();
            return Err(e);
        }
        let mut out = Vec::new();
        for (c, (init, p)) in carried.iter().zip(params) {
            let ty = self.ty(p).clone();
            let next = self.get(c.next)?;
            let next = self.conform(
                next,
                &ty,
                self.src.value(c.next).loc,
                "a loop-carried variable",
            )?;
            let result = self.add(Def::LoopResult { init }, ty, loc);
            self.map[c.result.index()] = Some(result);
            out.push(Carried {
                param: p,
                init,
                next,
                result,
            });
        }
        let body = Block {
            stmts: self.blocks.pop().unwrap_or_default(),
        };
        let [start, end, step] = bounds;
        self.blocks.last_mut().expect("open block").push(Stmt::For {
            index: new_index,
            start,
            end,
            step,
            carried: out,
            body,
            loc,
        });
        Ok(())
    }

    /// Types the carried parameters from their initial values (as `for` does), then the
    /// condition (a scalar `bool`) and the body.
    fn while_stmt(
        &mut self,
        cond_body: &Block,
        cond: ValueId,
        carried: &[Carried],
        body: &Block,
        loc: Loc,
    ) -> R<()> {
        let mut params = Vec::new();
        for c in carried {
            let mut init = self.get(c.init)?;
            if let Some(lit) = self.weak.get(&init).copied() {
                init = self.typed_literal(lit, None, self.out[init.index()].loc)?;
            }
            let ty = self.ty(init).clone();
            let p = self.add(Def::Carried { init }, ty, self.src.value(c.param).loc);
            self.map[c.param.index()] = Some(p);
            params.push((init, p));
        }
        self.blocks.push(Vec::new());
        if let Err(e) = self.block(cond_body) {
            self.blocks.pop();
            return Err(e);
        }
        let new_cond = match self.get(cond) {
            Ok(c) => c,
            Err(e) => {
                self.blocks.pop();
                return Err(e);
            }
        };
        let cond_ty = self.ty(new_cond).clone();
        if !(cond_ty.is_scalar() && cond_ty.dtype() == Some(DType::Bool)) {
            self.blocks.pop();
            return Err(CompileError::new(
                self.src.value(cond).loc,
                format!("a `while` condition is a scalar bool, got {cond_ty}"),
            ));
        }
        let cond_block = Block {
            stmts: self.blocks.pop().unwrap_or_default(),
        };
        self.blocks.push(Vec::new());
        if let Err(e) = self.block(body) {
            self.blocks.pop();
            return Err(e);
        }
        let mut out = Vec::new();
        for (c, (init, p)) in carried.iter().zip(params) {
            let ty = self.ty(p).clone();
            let next = self.get(c.next)?;
            let next = self.conform(
                next,
                &ty,
                self.src.value(c.next).loc,
                "a loop-carried variable",
            )?;
            let result = self.add(Def::LoopResult { init }, ty, loc);
            self.map[c.result.index()] = Some(result);
            out.push(Carried {
                param: p,
                init,
                next,
                result,
            });
        }
        let body = Block {
            stmts: self.blocks.pop().unwrap_or_default(),
        };
        self.blocks
            .last_mut()
            .expect("open block")
            .push(Stmt::While {
                cond_body: cond_block,
                cond: new_cond,
                carried: out,
                body,
                loc,
            });
        Ok(())
    }

    fn if_stmt(
        &mut self,
        cond: ValueId,
        then_body: &Block,
        else_body: &Block,
        merges: &[Merge],
        loc: Loc,
    ) -> R<()> {
        let c = self.get(cond)?;
        let cty = self.ty(c).clone();
        if cty != Type::val(DType::Bool, vec![]) {
            return Err(CompileError::new(
                loc,
                format!(
                    "an `if` condition is a scalar bool, found {cty}: tiles need `select` or masks"
                ),
            ));
        }
        let mut then_b = self.nested(then_body)?;
        let mut else_b = self.nested(else_body)?;
        let mut out = Vec::new();
        for m in merges {
            let t = self.get(m.then_value)?;
            let e = self.get(m.else_value)?;
            // The merged type: a typed side wins over a weak literal.
            let (t, e) = match (self.weak.get(&t).copied(), self.weak.get(&e).copied()) {
                (Some(_), None) => {
                    let ty = self.ty(e).clone();
                    self.blocks.push(std::mem::take(&mut then_b.stmts));
                    let t = self.conform(t, &ty, loc, "a variable assigned in an `if`");
                    then_b.stmts = self.blocks.pop().unwrap_or_default();
                    (t?, e)
                }
                (_, Some(_)) => {
                    let ty = self.ty(t).clone();
                    self.blocks.push(std::mem::take(&mut else_b.stmts));
                    let e = self.conform(e, &ty, loc, "a variable assigned in an `if`");
                    else_b.stmts = self.blocks.pop().unwrap_or_default();
                    (t, e?)
                }
                _ => (t, e),
            };
            let (tt, et) = (self.ty(t).clone(), self.ty(e).clone());
            if tt != et {
                return Err(CompileError::new(
                    loc,
                    format!("a variable assigned in an `if` is {tt} in one branch and {et} in the other"),
                ));
            }
            let result = self.add(Def::BranchResult { then_value: t }, tt, loc);
            self.map[m.result.index()] = Some(result);
            out.push(Merge {
                then_value: t,
                else_value: e,
                result,
            });
        }
        self.blocks.last_mut().expect("open block").push(Stmt::If {
            cond: c,
            then_body: then_b,
            else_body: else_b,
            merges: out,
            loc,
        });
        Ok(())
    }

    // ---- conversions ---------------------------------------------------------------

    /// A literal typed as `dtype` (or its default type when `None`).
    fn typed_literal(&mut self, lit: Literal, dtype: Option<DType>, loc: Loc) -> R<ValueId> {
        let (lit, d) = match (lit, dtype) {
            (Literal::Int(v, s), None) => {
                let d = s.unwrap_or(if i32::try_from(v).is_ok() {
                    DType::I32
                } else {
                    DType::I64
                });
                (Literal::Int(v, Some(d)), d)
            }
            (Literal::Float(v, s), None) => {
                let d = s.unwrap_or(DType::F32);
                (Literal::Float(v, Some(d)), d)
            }
            (Literal::Bool(b), None | Some(DType::Bool)) => (Literal::Bool(b), DType::Bool),
            (Literal::Int(v, _), Some(d)) if d.is_int() => (Literal::Int(v, Some(d)), d),
            (Literal::Int(v, _), Some(d)) if d.is_float() => (Literal::Float(v as f64, Some(d)), d),
            (Literal::Float(v, _), Some(d)) if d.is_float() => (Literal::Float(v, Some(d)), d),
            (lit, Some(d)) => {
                let what = match lit {
                    Literal::Int(..) => "an integer literal",
                    Literal::Float(..) => "a float literal",
                    Literal::Bool(..) => "a bool literal",
                };
                return Err(CompileError::new(
                    loc,
                    format!("{what} cannot be used as {d}: convert with `as {d}` or write a literal of that type"),
                ));
            }
        };
        Ok(self.emit(Expr::Literal(lit), Type::val(d, vec![]), loc))
    }

    /// Gives a weak literal the dtype `dtype`; typed values pass through unchanged.
    fn with_dtype(&mut self, v: ValueId, dtype: DType, loc: Loc) -> R<ValueId> {
        match self.weak.get(&v).copied() {
            Some(lit) => self.typed_literal(lit, Some(dtype), loc),
            None => Ok(v),
        }
    }

    /// Broadcasts `v` to `shape` (splat for scalars, right-aligned broadcast for tiles).
    fn broadcast(&mut self, v: ValueId, shape: &[usize], loc: Loc) -> R<ValueId> {
        let ty = self.ty(v).clone();
        if ty.shape == shape {
            return Ok(v);
        }
        if ty.is_scalar() {
            let t = Type::tile(ty.elem, shape.to_vec());
            return Ok(self.emit(
                Expr::Splat {
                    value: v,
                    shape: shape.to_vec(),
                },
                t,
                loc,
            ));
        }
        if ty.shape.len() > shape.len() {
            return Err(self.shape_error(&ty.shape, shape, loc));
        }
        let mut v = v;
        let mut cur = ty.shape.clone();
        while cur.len() < shape.len() {
            cur.insert(0, 1);
            v = self.emit(
                Expr::ExpandDims { value: v, axis: 0 },
                Type::tile(ty.elem, cur.clone()),
                loc,
            );
        }
        for (a, b) in cur.iter().zip(shape) {
            if a != b && *a != 1 {
                return Err(self.shape_error(&ty.shape, shape, loc));
            }
        }
        if cur == shape {
            return Ok(v);
        }
        Ok(self.emit(
            Expr::Broadcast {
                value: v,
                shape: shape.to_vec(),
            },
            Type::tile(ty.elem, shape.to_vec()),
            loc,
        ))
    }

    fn shape_error(&self, a: &[usize], b: &[usize], loc: Loc) -> CompileError {
        CompileError::new(
            loc,
            format!(
                "shape mismatch: {} cannot broadcast to {}",
                shape_str(a),
                shape_str(b)
            ),
        )
    }

    /// The broadcast shape of several operands.
    fn common_shape(&self, vals: &[ValueId], loc: Loc) -> R<Vec<usize>> {
        let mut out: Vec<usize> = Vec::new();
        for &v in vals {
            let s = &self.ty(v).shape;
            if s.is_empty() {
                continue;
            }
            let rank = out.len().max(s.len());
            let mut merged = vec![1; rank];
            for i in 0..rank {
                let a = if i + out.len() >= rank {
                    out[i + out.len() - rank]
                } else {
                    1
                };
                let b = if i + s.len() >= rank {
                    s[i + s.len() - rank]
                } else {
                    1
                };
                merged[i] = match (a, b) {
                    (a, b) if a == b => a,
                    (1, b) => b,
                    (a, 1) => a,
                    _ => {
                        return Err(CompileError::new(
                            loc,
                            format!("shape mismatch: {} and {}", shape_str(&out), shape_str(s)),
                        ))
                    }
                };
            }
            out = merged;
        }
        Ok(out)
    }

    /// Makes `v` exactly of type `ty` (weak literal typing and broadcasting only).
    fn conform(&mut self, v: ValueId, ty: &Type, loc: Loc, what: &str) -> R<ValueId> {
        let v = match ty.elem {
            Elem::Val(d) => self.with_dtype(v, d, loc)?,
            Elem::Ptr(_) => v,
        };
        let have = self.ty(v).clone();
        if have.elem != ty.elem {
            return Err(CompileError::new(
                loc,
                format!(
                    "{what} is {} here but {} elsewhere: convert with `as`",
                    have.elem, ty.elem
                ),
            ));
        }
        self.broadcast(v, &ty.shape, loc)
    }

    /// Unifies the dtypes of value operands (weak literals adopt the typed dtype).
    fn unify_dtypes(&mut self, vals: &mut [ValueId], loc: Loc, op: &str) -> R<DType> {
        let mut dtype: Option<DType> = None;
        for &v in vals.iter() {
            if self.weak.contains_key(&v) {
                continue;
            }
            let ty = self.ty(v).clone();
            let Elem::Val(d) = ty.elem else {
                return Err(CompileError::new(
                    loc,
                    format!("`{op}` does not apply to pointers"),
                ));
            };
            match dtype {
                None => dtype = Some(d),
                Some(prev) if prev != d => {
                    return Err(CompileError::new(
                        loc,
                        format!(
                            "mismatched types for `{op}`: {prev} and {d}; convert one with `as`"
                        ),
                    ))
                }
                _ => {}
            }
        }
        let dtype = match dtype {
            Some(d) => d,
            None => {
                // All weak: a float literal makes the result float.
                let any_float = vals
                    .iter()
                    .any(|v| matches!(self.weak.get(v), Some(Literal::Float(..))));
                let any_bool = vals
                    .iter()
                    .any(|v| matches!(self.weak.get(v), Some(Literal::Bool(..))));
                if any_bool {
                    DType::Bool
                } else if any_float {
                    DType::F32
                } else {
                    DType::I32
                }
            }
        };
        for v in vals.iter_mut() {
            *v = self.with_dtype(*v, dtype, loc)?;
        }
        Ok(dtype)
    }

    fn unify_scalar_ints(&mut self, vals: &mut [ValueId], loc: Loc, what: &str) -> R<DType> {
        let d = self.unify_dtypes(vals, loc, what)?;
        for &v in vals.iter() {
            if !self.ty(v).is_scalar() {
                return Err(CompileError::new(loc, format!("{what} must be scalars")));
            }
        }
        if !d.is_int() {
            return Err(CompileError::new(
                loc,
                format!("{what} must be integers, found {d}"),
            ));
        }
        Ok(d)
    }

    /// Unifies dtypes and broadcasts operands to one shape.
    fn elementwise(&mut self, vals: &mut [ValueId], loc: Loc, op: &str) -> R<(DType, Vec<usize>)> {
        let d = self.unify_dtypes(vals, loc, op)?;
        let shape = self.common_shape(vals, loc)?;
        for v in vals.iter_mut() {
            *v = self.broadcast(*v, &shape, loc)?;
        }
        Ok((d, shape))
    }

    fn bool_operand(&mut self, v: ValueId, loc: Loc, what: &str) -> R<ValueId> {
        let v = self.with_dtype(v, DType::Bool, loc)?;
        let ty = self.ty(v);
        if ty.elem != Elem::Val(DType::Bool) {
            return Err(CompileError::new(
                loc,
                format!("{what} must be bool, found {}", ty.elem),
            ));
        }
        Ok(v)
    }

    // ---- expressions -------------------------------------------------------------

    fn expr(&mut self, old: ValueId) -> R<ValueId> {
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
    fn access(
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
    fn prefetch(
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

    /// The single pointer and the `i32` count of a `prefetch_range`.
    fn prefetch_range(&mut self, ptr: ValueId, count: ValueId, loc: Loc) -> R<(ValueId, ValueId)> {
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

    fn add_ptr(&mut self, ptr: ValueId, offset: ValueId, loc: Loc) -> R<ValueId> {
        let p = self.get(ptr)?;
        let o = self.get(offset)?;
        self.ptr_plus(p, o, loc)
    }

    fn ptr_plus(&mut self, p: ValueId, o: ValueId, loc: Loc) -> R<ValueId> {
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

    fn binary(&mut self, op: BinaryOp, lhs: ValueId, rhs: ValueId, loc: Loc) -> R<ValueId> {
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
