//! Multiply-add contraction: which products `reduce.rs` fuses into a sum's additions.
//!
//! `(a * b).sum(axis)` is the language's dot product (GEMV rows, attention scores and
//! value sums). Emitted as written it is a rounded `mul` per element and a dependent
//! `add` per element; with the product folded into the running sum it is one `fma` per
//! element: half the instructions on a decode kernel's critical path, and one rounding
//! instead of two. The order of a sum's additions is already unspecified (tests compare
//! sums with a tolerance), and fusing the products keeps results within that tolerance,
//! as Triton's default floating-point fusion does. Only `f32` products whose every use is
//! a `sum` are fused: a product that is also stored, carried or used elsewhere keeps its
//! rounded value everywhere, and `f16`/`bf16` products keep their rounding to the dtype.

use std::collections::HashSet;

use crate::ir::{BinaryOp, DType, Def, Expr, Kernel, ReduceOp, Stmt, ValueId};

/// The `f32` tile products whose only uses are `sum` reductions.
pub fn fused_products(k: &Kernel) -> HashSet<ValueId> {
    // Per value: used by a sum (true) and used any other way (false).
    let mut by_sum = vec![false; k.values.len()];
    let mut other = vec![false; k.values.len()];
    let mut lets = Vec::new();
    k.body.visit(&mut |s: &Stmt| match s {
        Stmt::Let(v) => lets.push(*v),
        Stmt::Store {
            ptr, value, mask, ..
        } => {
            for u in [Some(*ptr), Some(*value), *mask].into_iter().flatten() {
                other[u.index()] = true;
            }
        }
        Stmt::PrefetchRange { ptr, count, .. } => {
            other[ptr.index()] = true;
            other[count.index()] = true;
        }
        Stmt::Flag { ptr, value, .. } => {
            other[ptr.index()] = true;
            other[value.index()] = true;
        }
        Stmt::Prefetch { ptr, mask, .. } => {
            for u in [Some(*ptr), *mask].into_iter().flatten() {
                other[u.index()] = true;
            }
        }
        Stmt::For {
            start,
            end,
            step,
            carried,
            ..
        } => {
            for u in [*start, *end, *step] {
                other[u.index()] = true;
            }
            for c in carried {
                other[c.init.index()] = true;
                other[c.next.index()] = true;
            }
        }
        Stmt::While { cond, carried, .. } => {
            other[cond.index()] = true;
            for c in carried {
                other[c.init.index()] = true;
                other[c.next.index()] = true;
            }
        }
        Stmt::If { cond, merges, .. } => {
            other[cond.index()] = true;
            for m in merges {
                other[m.then_value.index()] = true;
                other[m.else_value.index()] = true;
            }
        }
        Stmt::WaitPriorKernels { .. } | Stmt::LaunchDependents { .. } => {}
    });
    for &v in &lets {
        let Def::Expr(e) = &k.value(v).def else {
            continue;
        };
        match e {
            Expr::Reduce {
                op: ReduceOp::Sum,
                value,
                ..
            } => by_sum[value.index()] = true,
            _ => {
                for u in e.operands() {
                    other[u.index()] = true;
                }
            }
        }
    }
    lets.into_iter()
        .filter(|&v| {
            let is_f32_product = matches!(
                k.value(v).def,
                Def::Expr(Expr::Binary {
                    op: BinaryOp::Mul,
                    ..
                })
            ) && k.ty(v).dtype() == Some(DType::F32)
                && !k.ty(v).is_scalar();
            is_f32_product && by_sum[v.index()] && !other[v.index()]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::builder::Builder;

    /// `x[0] = (v * v).sum(0)` over `v = x[0..64]` of dtype `d`: the builder, the
    /// pointers, the loaded tile and the product, for a test to add to.
    fn sum_of_squares(d: DType) -> (Builder, [ValueId; 4]) {
        let mut b = Builder::new("k", 4);
        let x = b.ptr("x", d);
        let offs = b.arange(0, 64);
        let p = b.add_ptr(x, offs);
        let v = b.load(p, None, None);
        let sq = b.bin(BinaryOp::Mul, v, v);
        let s = b.reduce(ReduceOp::Sum, sq, 0);
        b.store(x, s, None);
        (b, [x, p, v, sq])
    }

    #[test]
    fn a_product_used_only_by_sums_is_fused() {
        let (b, [.., sq]) = sum_of_squares(DType::F32);
        assert_eq!(fused_products(&b.finish()), HashSet::from([sq]));
    }

    #[test]
    fn a_product_with_another_use_keeps_its_rounding() {
        let (mut b, [x, p, v, sq]) = sum_of_squares(DType::F32);
        // Stored as well: not fused.
        b.store(p, sq, None);
        // A max of a product: not a sum, so not fused either.
        let m = b.bin(BinaryOp::Mul, v, v);
        let mx = b.reduce(ReduceOp::Max, m, 0);
        b.store(x, mx, None);
        assert!(fused_products(&b.finish()).is_empty());
    }

    #[test]
    fn only_f32_products_are_fused() {
        let (b, [.., sq]) = sum_of_squares(DType::BF16);
        let k = b.finish();
        assert_eq!(k.ty(sq).dtype(), Some(DType::BF16));
        assert!(fused_products(&k).is_empty());
    }
}
