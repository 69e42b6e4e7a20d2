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
use crate::ir::{Block, Def, Expr, Kernel, Literal, Loc, Stmt, Type, Value, ValueId};

type R<T> = Result<T, CompileError>;

mod expressions;
mod more_ops;
mod statements;
mod unify;

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
    // A view load whose values did not survive (never the case for a load the body
    // uses) is dropped: it then takes the ordinary path.
    let view_loads = kernel
        .view_loads
        .iter()
        .filter_map(|l| {
            let at = |v: ValueId| cx.map.get(v.index()).copied().flatten();
            Some(crate::ir::ViewLoad {
                load: at(l.load)?,
                origin: [at(l.origin[0])?, at(l.origin[1])?],
                view: l.view,
            })
        })
        .collect();
    Ok(Kernel {
        name: kernel.name.clone(),
        params: kernel.params.clone(),
        consts: kernel.consts.clone(),
        num_warps: kernel.num_warps,
        num_stages: kernel.num_stages,
        cluster: kernel.cluster,
        max_registers: kernel.max_registers,
        values: cx.out,
        body,
        view_loads,
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
}
