//! Lowering of `argmin`, the scans, the layout changes
//! (`trans`, `permute`, `reshape`), `histogram` and the Philox random numbers. Shapes,
//! dtypes and axes are checked by inference; here only what must be a compile-time
//! constant is folded.

use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::Expr as SynExpr;

use super::{strip_parens, Lower, R};
use crate::ir::{Expr, RandOp, ReduceOp, ScanOp, ValueId};

impl Lower {
    /// Lowers the calls of the scan, argmin, shape and random ops; `None` when `name` is
    /// none of them.
    pub(super) fn more_ops(
        &mut self,
        name: &str,
        args: &[&SynExpr],
        span: Span,
    ) -> R<Option<ValueId>> {
        let e = match name {
            "argmin" => {
                self.arity(name, args, 1, 2, span)?;
                let value = self.expr(args[0])?;
                let axis = self.axis_arg(args.get(1).copied(), span)?;
                Expr::Reduce {
                    op: ReduceOp::Argmin,
                    value,
                    axis,
                }
            }
            "cumsum" | "cumprod" => {
                self.arity(name, args, 1, 2, span)?;
                let value = self.expr(args[0])?;
                let axis = self.axis_arg(args.get(1).copied(), span)?;
                let op = if name == "cumsum" {
                    ScanOp::Sum
                } else {
                    ScanOp::Prod
                };
                Expr::Scan { op, value, axis }
            }
            "trans" | "permute" => {
                let lo = if name == "trans" { 1 } else { 2 };
                self.arity(name, args, lo, 2, span)?;
                let value = self.expr(args[0])?;
                // `trans(x)` swaps the two axes of a 2-D tile (inference checks the rank).
                let dims = match args.get(1) {
                    Some(d) => self.const_list(d)?,
                    None => vec![1, 0],
                };
                Expr::Permute { value, dims }
            }
            "reshape" => {
                self.arity(name, args, 2, 2, span)?;
                let value = self.expr(args[0])?;
                let shape = self.shape(args[1])?;
                Expr::Reshape { value, shape }
            }
            "histogram" => {
                self.arity(name, args, 2, 3, span)?;
                let value = self.expr(args[0])?;
                let bins = self.const_int(args[1], "the number of bins")?;
                if bins <= 0 || (bins as u64).count_ones() != 1 {
                    return self.err(
                        args[1].span(),
                        format!("the number of bins is a power of two, got {bins}"),
                    );
                }
                let mask = match args.get(2) {
                    Some(m) => Some(self.expr(m)?),
                    None => None,
                };
                Expr::Histogram {
                    value,
                    bins: bins as usize,
                    mask,
                }
            }
            "rand" | "randn" | "randint" => {
                self.arity(name, args, 2, 2, span)?;
                let seed = self.expr(args[0])?;
                let offset = self.expr(args[1])?;
                let op = match name {
                    "rand" => RandOp::Uniform,
                    "randn" => RandOp::Normal,
                    _ => RandOp::Int,
                };
                Expr::Rand { op, seed, offset }
            }
            _ => return Ok(None),
        };
        Ok(Some(self.emit_at(e, span)))
    }

    /// An optional compile-time axis argument (0 when absent).
    fn axis_arg(&mut self, arg: Option<&SynExpr>, span: Span) -> R<usize> {
        let axis = match arg {
            Some(a) => self.const_int(a, "the axis")?,
            None => 0,
        };
        if axis < 0 {
            let at = arg.map_or(span, |a| a.span());
            return self.err(at, "the axis is non-negative");
        }
        Ok(axis as usize)
    }

    /// A list of compile-time integers `[a, b, ..]` (a permutation's dims).
    fn const_list(&mut self, e: &SynExpr) -> R<Vec<usize>> {
        let SynExpr::Array(arr) = strip_parens(e) else {
            return self.err(e.span(), "the dims are written `[d0, d1, ..]`");
        };
        let mut out = Vec::new();
        for d in &arr.elems {
            let v = self.const_int(d, "a dim")?;
            if v < 0 {
                return self.err(d.span(), "dims are non-negative");
            }
            out.push(v as usize);
        }
        Ok(out)
    }
}
