//! Inference of the scans, layout changes (`trans`, `permute`, `reshape`), `histogram`
//! and the Philox random numbers. (`argmin` is a reduction, typed beside `argmax`.)

use super::{shape_str, Infer, R};
use crate::error::CompileError;
use crate::ir::{DType, Elem, Expr, Literal, Loc, RandOp, Type, ValueId};

impl Infer<'_> {
    /// A typed tile operand of `what` (not a literal, not a scalar).
    fn tile_operand(&mut self, old: ValueId, loc: Loc, what: &str) -> R<(ValueId, Type)> {
        let v = self.get(old)?;
        let ty = self.ty(v).clone();
        if self.weak.contains_key(&v) || ty.is_scalar() {
            return Err(CompileError::new(
                loc,
                format!("`{what}` applies to tiles, not scalars"),
            ));
        }
        Ok((v, ty))
    }

    /// Types one of the ops of this file (`expr` is from the untyped kernel).
    pub(super) fn more_ops(&mut self, expr: &Expr, loc: Loc) -> R<ValueId> {
        match expr {
            Expr::Scan { op, value, axis } => {
                let what = match op {
                    crate::ir::ScanOp::Sum => "cumsum",
                    crate::ir::ScanOp::Prod => "cumprod",
                };
                let (v, ty) = self.tile_operand(*value, loc, what)?;
                match ty.elem {
                    Elem::Val(d) if d != DType::Bool => {}
                    e => {
                        return Err(CompileError::new(
                            loc,
                            format!("`{what}` takes a tile of numbers, found {e} (cast bool tiles to i32 first)"),
                        ))
                    }
                }
                self.check_axis(*axis, &ty, loc)?;
                Ok(self.emit(
                    Expr::Scan {
                        op: *op,
                        value: v,
                        axis: *axis,
                    },
                    ty,
                    loc,
                ))
            }
            Expr::Permute { value, dims } => {
                let (v, ty) = self.tile_operand(*value, loc, "permute")?;
                let rank = ty.shape.len();
                let mut seen = vec![false; rank];
                let is_perm = dims.len() == rank
                    && dims
                        .iter()
                        .all(|&d| d < rank && !std::mem::replace(&mut seen[d], true));
                if !is_perm {
                    let msg = if rank != 2 && *dims == [1, 0] {
                        format!("`trans(x)` transposes a 2-D tile, found {ty}: give the dims, `permute(x, [..])`")
                    } else {
                        format!(
                            "the dims {dims:?} are not a permutation of the {rank} axes of {ty}"
                        )
                    };
                    return Err(CompileError::new(loc, msg));
                }
                let shape = dims.iter().map(|&d| ty.shape[d]).collect();
                Ok(self.emit(
                    Expr::Permute {
                        value: v,
                        dims: dims.clone(),
                    },
                    Type::tile(ty.elem, shape),
                    loc,
                ))
            }
            Expr::Reshape { value, shape } => {
                let (v, ty) = self.tile_operand(*value, loc, "reshape")?;
                if ty.numel() != shape.iter().product::<usize>() {
                    return Err(CompileError::new(
                        loc,
                        format!(
                            "`reshape` keeps the number of elements: {ty} has {}, {} has {}",
                            ty.numel(),
                            shape_str(shape),
                            shape.iter().product::<usize>()
                        ),
                    ));
                }
                Ok(self.emit(
                    Expr::Reshape {
                        value: v,
                        shape: shape.clone(),
                    },
                    Type::tile(ty.elem, shape.clone()),
                    loc,
                ))
            }
            Expr::Histogram { value, bins, mask } => {
                let (v, ty) = self.tile_operand(*value, loc, "histogram")?;
                if ty.shape.len() != 1 || !ty.dtype().is_some_and(|d| d.is_int()) {
                    return Err(CompileError::new(
                        loc,
                        format!("`histogram` takes a 1-D tile of integers, found {ty}"),
                    ));
                }
                let m = match mask {
                    Some(m) => {
                        let m = self.get(*m)?;
                        let m = self.bool_operand(m, loc, "the mask")?;
                        let mt = self.ty(m).clone();
                        if !mt.is_scalar() && mt.shape != ty.shape {
                            return Err(CompileError::new(
                                loc,
                                format!("the mask {mt} does not match the values {ty}"),
                            ));
                        }
                        Some(self.broadcast(m, &ty.shape, loc)?)
                    }
                    None => None,
                };
                Ok(self.emit(
                    Expr::Histogram {
                        value: v,
                        bins: *bins,
                        mask: m,
                    },
                    Type::val(DType::I32, vec![*bins]),
                    loc,
                ))
            }
            Expr::Rand { op, seed, offset } => {
                let s = self.get(*seed)?;
                let s = match self.weak.get(&s).copied() {
                    Some(lit @ Literal::Int(..)) => {
                        self.typed_literal(lit, Some(DType::I64), loc)?
                    }
                    Some(lit) => {
                        let found = match lit {
                            Literal::Float(v, _) => format!("the float literal {v}"),
                            _ => "a bool literal".to_string(),
                        };
                        return Err(CompileError::new(
                            loc,
                            format!("the seed of a random draw is a scalar i32, u32 or i64, found {found}"),
                        ));
                    }
                    None => s,
                };
                let st = self.ty(s).clone();
                if !st.is_scalar() || !st.dtype().is_some_and(|d| d.is_int() && d != DType::U8) {
                    return Err(CompileError::new(
                        loc,
                        format!(
                            "the seed of a random draw is a scalar i32, u32 or i64, found {st}"
                        ),
                    ));
                }
                let o = self.get(*offset)?;
                let o = self.with_dtype(o, DType::I32, loc)?;
                let ot = self.ty(o).clone();
                if !matches!(ot.dtype(), Some(DType::I32 | DType::U32)) {
                    return Err(CompileError::new(
                        loc,
                        format!("the offsets of a random draw are i32 or u32 (Philox4x32 counters), found {ot}"),
                    ));
                }
                let d = match op {
                    RandOp::Int => DType::U32,
                    RandOp::Uniform | RandOp::Normal => DType::F32,
                };
                Ok(self.emit(
                    Expr::Rand {
                        op: *op,
                        seed: s,
                        offset: o,
                    },
                    Type::val(d, ot.shape),
                    loc,
                ))
            }
            _ => Err(CompileError::new(loc, "internal: not one of the more ops")),
        }
    }

    fn check_axis(&self, axis: usize, ty: &Type, loc: Loc) -> R<()> {
        if axis >= ty.shape.len() {
            return Err(CompileError::new(
                loc,
                format!(
                    "axis {axis} is out of range for a tile of rank {}",
                    ty.shape.len()
                ),
            ));
        }
        Ok(())
    }
}
