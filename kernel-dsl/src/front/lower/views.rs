//! Tensor descriptors: `make_tensor_descriptor(ptr, [rows, cols], [row_stride, 1],
//! [BR, BC])` names a row-major matrix and a block shape, and `desc.load([r, c])` reads
//! the `[BR, BC]` block at row `r`, column `c`, zero outside the matrix (Triton's
//! `tl.make_tensor_descriptor` and `desc.load`). Strides `[1, col_stride]` name a
//! column-major matrix instead (an `[N, K]` weight seen as `[K, N]`), beyond Triton.
//!
//! A descriptor is not a value: it lives in the front end only, and each `load` lowers
//! to the masked pointer load it means (the interpreter's semantics, and the code on
//! every target without a tensor-memory engine). The load is also listed in
//! [`crate::ir::Kernel::view_loads`] with its matrix and origin, which the sm_90a backend
//! uses to copy it with `cp.async.bulk.tensor` instead (`back::ptx::pipeline`). The sizes
//! must be parameters or constants: the host encodes the copy engine's tensor map from the
//! launch's arguments.

use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::Expr as SynExpr;

use super::{strip_parens, Lower, Var, R};
use crate::ir::{
    BinaryOp, CmpOp, Def, Expr, Literal, MatrixView, ParamKind, ValueId, ViewDim, ViewLoad,
};

/// A descriptor bound by `let`: its matrix and block shape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Descriptor {
    pub view: MatrixView,
    pub block: [usize; 2],
}

impl Lower {
    /// `let name = make_tensor_descriptor(..)`: checks the arguments and binds `name`.
    pub(super) fn bind_descriptor(&mut self, name: &str, c: &syn::ExprCall) -> R<()> {
        let args: Vec<&SynExpr> = c.args.iter().collect();
        let span = c.span();
        if args.len() != 4 {
            return self.err(
                span,
                format!(
                    "`make_tensor_descriptor` takes 4 arguments (base pointer, [rows, cols], [row_stride, 1], [BLOCK_ROWS, BLOCK_COLS]), got {}",
                    args.len()
                ),
            );
        }
        let base = self.expr(args[0])?;
        let (ptr, dtype) = match (&self.values[base.index()].def, self.param_kind_of(base)) {
            (Def::Expr(Expr::Param(i)), Some(ParamKind::Ptr(d))) => (*i as u32, d),
            _ => {
                return self.err(
                    args[0].span(),
                    "the base of a tensor descriptor must be one of the kernel's pointer parameters, as passed (the copy engine reads the matrix from the argument itself)",
                )
            }
        };
        let pair = |cx: &mut Self, e: &SynExpr, what: &str| -> R<[SynExpr; 2]> {
            match strip_parens(e) {
                SynExpr::Array(a) if a.elems.len() == 2 => {
                    Ok([a.elems[0].clone(), a.elems[1].clone()])
                }
                _ => cx.err(
                    e.span(),
                    format!("{what} is written `[a, b]` (descriptors are two-dimensional)"),
                ),
            }
        };
        let [rows, cols] = pair(self, args[1], "the shape")?;
        let [row_stride, col_stride] = pair(self, args[2], "the strides")?;
        let rows = self.view_dim(&rows, "the row count")?;
        let cols = self.view_dim(&cols, "the column count")?;
        let rs = self.view_dim(&row_stride, "the row stride")?;
        let cs = self.view_dim(&col_stride, "the column stride")?;
        // `[s, 1]`: row-major (Triton's only form); `[1, s]`: column-major, the view of
        // an `[N, K]` weight as the `[K, N]` operand of an NT GEMM.
        let (stride, col_major) = match (rs, cs) {
            (s, ViewDim::Const(1)) => (s, false),
            (ViewDim::Const(1), s) => (s, true),
            _ => {
                return self.err(
                    args[2].span(),
                    "one stride of a tensor descriptor must be 1: `[row_stride, 1]` (rows of contiguous columns) or `[1, col_stride]` (columns of contiguous rows)",
                )
            }
        };
        let block = self.shape(args[3])?;
        if block.len() != 2 {
            return self.err(
                args[3].span(),
                "the block shape is `[BLOCK_ROWS, BLOCK_COLS]`",
            );
        }
        let d = Descriptor {
            view: MatrixView {
                ptr,
                dtype,
                rows,
                cols,
                stride,
                col_major,
            },
            block: [block[0], block[1]],
        };
        let index = self.descriptors.len() as u32;
        self.descriptors.push(d);
        // Bound as a variable that is not a value (`Var::descriptor`); the value slot
        // holds the base pointer, which nothing reads through this name.
        self.bind_var(
            name,
            Var {
                value: base,
                mutable: false,
                descriptor: Some(index),
            },
        );
        Ok(())
    }

    /// A descriptor's size: a scalar integer parameter or a constant.
    fn view_dim(&mut self, e: &SynExpr, what: &str) -> R<ViewDim> {
        let v = self.expr(e)?;
        if let Some(Literal::Int(c, _)) = self.literal(v) {
            return Ok(ViewDim::Const(c));
        }
        match (&self.values[v.index()].def, self.param_kind_of(v)) {
            (
                Def::Expr(Expr::Param(i)),
                Some(ParamKind::Scalar(d) | ParamKind::ScalarMultipleOf(d, _)),
            ) if d.is_int() => Ok(ViewDim::Param(*i as u32)),
            _ => self.err(
                e.span(),
                format!("{what} of a tensor descriptor must be an integer parameter of the kernel or a constant (the host builds the descriptor from the launch's arguments)"),
            ),
        }
    }

    /// The kind of the parameter `v` is the value of, if it is one.
    fn param_kind_of(&self, v: ValueId) -> Option<ParamKind> {
        match &self.values[v.index()].def {
            Def::Expr(Expr::Param(i)) => self.param_kinds.get(*i).copied(),
            _ => None,
        }
    }

    /// `desc.load([row, col])`: the masked load of the block at (`row`, `col`).
    pub(super) fn descriptor_load(
        &mut self,
        d: Descriptor,
        args: &[&SynExpr],
        span: Span,
    ) -> R<ValueId> {
        if args.len() != 1 {
            return self.err(
                span,
                "a descriptor's `load` takes the block's origin, `desc.load([row, col])`",
            );
        }
        let origin = match strip_parens(args[0]) {
            SynExpr::Array(a) if a.elems.len() == 2 => [a.elems[0].clone(), a.elems[1].clone()],
            _ => return self.err(args[0].span(), "the origin is written `[row, col]`"),
        };
        let r0 = self.expr(&origin[0])?;
        let c0 = self.expr(&origin[1])?;
        let dim = |cx: &mut Self, x: ViewDim| match x {
            ViewDim::Param(i) => cx.emit_at(Expr::Param(i as usize), span),
            ViewDim::Const(c) => cx.emit_at(Expr::Literal(Literal::Int(c, None)), span),
        };
        let [br, bc] = d.block;
        let ar = self.emit_at(
            Expr::Arange {
                start: 0,
                end: br as i64,
            },
            span,
        );
        let ac = self.emit_at(
            Expr::Arange {
                start: 0,
                end: bc as i64,
            },
            span,
        );
        let rows = self.binary(BinaryOp::Add, r0, ar, span)?;
        let rows = self.emit_at(
            Expr::ExpandDims {
                value: rows,
                axis: 1,
            },
            span,
        );
        let cols = self.binary(BinaryOp::Add, c0, ac, span)?;
        let cols = self.emit_at(
            Expr::ExpandDims {
                value: cols,
                axis: 0,
            },
            span,
        );
        let stride = dim(self, d.view.stride);
        let off = if d.view.col_major {
            let col_off = self.binary(BinaryOp::Mul, cols, stride, span)?;
            self.binary(BinaryOp::Add, rows, col_off, span)?
        } else {
            let row_off = self.binary(BinaryOp::Mul, rows, stride, span)?;
            self.binary(BinaryOp::Add, row_off, cols, span)?
        };
        let base = self.emit_at(Expr::Param(d.view.ptr as usize), span);
        let ptr = self.binary(BinaryOp::Add, base, off, span)?;
        let nrows = dim(self, d.view.rows);
        let ncols = dim(self, d.view.cols);
        let row_ok = self.emit_at(
            Expr::Compare {
                op: CmpOp::Lt,
                lhs: rows,
                rhs: nrows,
            },
            span,
        );
        let col_ok = self.emit_at(
            Expr::Compare {
                op: CmpOp::Lt,
                lhs: cols,
                rhs: ncols,
            },
            span,
        );
        let mask = self.binary(BinaryOp::And, row_ok, col_ok, span)?;
        let load = self.emit_at(
            Expr::Load {
                ptr,
                mask: Some(mask),
                other: None,
            },
            span,
        );
        self.view_loads.push(ViewLoad {
            load,
            view: d.view,
            origin: [r0, c0],
        });
        Ok(load)
    }
}
