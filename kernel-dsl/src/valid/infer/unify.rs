//! Conversions and unification: weak literals, broadcasts, common shapes and dtypes,
//! and the errors that ask for an explicit `as`.

use super::{shape_str, Infer, R};
use crate::error::CompileError;
use crate::ir::{DType, Elem, Expr, Literal, Loc, Type, ValueId};

impl Infer<'_> {
    /// A literal typed as `dtype` (or its default type when `None`).
    pub(super) fn typed_literal(
        &mut self,
        lit: Literal,
        dtype: Option<DType>,
        loc: Loc,
    ) -> R<ValueId> {
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
    pub(super) fn with_dtype(&mut self, v: ValueId, dtype: DType, loc: Loc) -> R<ValueId> {
        match self.weak.get(&v).copied() {
            Some(lit) => self.typed_literal(lit, Some(dtype), loc),
            None => Ok(v),
        }
    }

    /// Broadcasts `v` to `shape` (splat for scalars, right-aligned broadcast for tiles).
    pub(super) fn broadcast(&mut self, v: ValueId, shape: &[usize], loc: Loc) -> R<ValueId> {
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

    pub(super) fn shape_error(&self, a: &[usize], b: &[usize], loc: Loc) -> CompileError {
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
    pub(super) fn common_shape(&self, vals: &[ValueId], loc: Loc) -> R<Vec<usize>> {
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
    pub(super) fn conform(&mut self, v: ValueId, ty: &Type, loc: Loc, what: &str) -> R<ValueId> {
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
    pub(super) fn unify_dtypes(&mut self, vals: &mut [ValueId], loc: Loc, op: &str) -> R<DType> {
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

    pub(super) fn unify_scalar_ints(
        &mut self,
        vals: &mut [ValueId],
        loc: Loc,
        what: &str,
    ) -> R<DType> {
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
    pub(super) fn elementwise(
        &mut self,
        vals: &mut [ValueId],
        loc: Loc,
        op: &str,
    ) -> R<(DType, Vec<usize>)> {
        let d = self.unify_dtypes(vals, loc, op)?;
        let shape = self.common_shape(vals, loc)?;
        for v in vals.iter_mut() {
            *v = self.broadcast(*v, &shape, loc)?;
        }
        Ok((d, shape))
    }

    pub(super) fn bool_operand(&mut self, v: ValueId, loc: Loc, what: &str) -> R<ValueId> {
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
}
