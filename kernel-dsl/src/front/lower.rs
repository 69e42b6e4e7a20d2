//! IR construction: a kernel body (`syn` syntax) to the untyped IR, for one
//! specialization.
//!
//! Compile-time constants are substituted and folded here, so every shape, axis and
//! `arange` bound is a number by the time inference runs. Mutable variables become SSA
//! values: a variable assigned inside a `for` body is carried by the loop, and one
//! assigned inside an `if` is merged after it.

use std::collections::{HashMap, HashSet};

use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::visit::Visit;
use syn::{BinOp, Expr as SynExpr, Lit, Pat, Stmt as SynStmt, UnOp};

use super::helpers::{is_tile_op, TileFn, TILE_OPS};
use super::parse::KernelAst;
use crate::error::CompileError;
use crate::ir::{
    AtomicOp, BinaryOp, Block, Carried, CmpOp, DType, Def, Expr, FlagOp, Kernel, Literal, Loc,
    Merge, Param, ReduceOp, Stmt, UnaryOp, Value, ValueId,
};
use crate::Specialization;

mod more_ops;
mod views;

/// The source spans of a lowered kernel, indexed by [`Loc`].
#[derive(Clone, Debug, Default)]
pub struct SpanTable {
    spans: Vec<Span>,
}

impl SpanTable {
    /// The span of `loc` (the call site's span when out of range).
    pub fn span(&self, loc: Loc) -> Span {
        self.spans
            .get(loc.0 as usize)
            .copied()
            .unwrap_or_else(Span::call_site)
    }

    fn add(&mut self, span: Span) -> Loc {
        self.spans.push(span);
        Loc(self.spans.len() as u32 - 1)
    }
}

/// Lowers `ast` for `spec`. Returns the span table in both cases, so errors can be
/// mapped back to the user's source.
pub fn lower(ast: &KernelAst, spec: &Specialization) -> (Result<Kernel, CompileError>, SpanTable) {
    let mut cx = Lower {
        consts: HashMap::new(),
        types: ast.bound_types.iter().cloned().collect(),
        helpers: ast.helpers.clone(),
        inlining: Vec::new(),
        clustered: false,
        values: Vec::new(),
        blocks: vec![Vec::new()],
        scopes: vec![HashMap::new()],
        spans: SpanTable::default(),
        param_kinds: ast.params.iter().map(|p| p.kind).collect(),
        descriptors: Vec::new(),
        view_loads: Vec::new(),
    };
    let result = cx.run(ast, spec);
    (result, cx.spans)
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct Var {
    value: ValueId,
    mutable: bool,
    /// A tensor descriptor (index into `Lower::descriptors`), which is not a value.
    descriptor: Option<u32>,
}

struct Lower {
    consts: HashMap<String, i64>,
    /// Element-type parameters bound to dtypes (a dtype-generic kernel's `T`, a helper's).
    types: HashMap<String, DType>,
    /// The `#[tile_fn]` helpers the body may call.
    helpers: Vec<TileFn>,
    /// The helpers being inlined, outermost first (recursion is an error).
    inlining: Vec<String>,
    /// Whether the attribute declares clusters (`cluster(..)`, even of one program).
    clustered: bool,
    values: Vec<Value>,
    blocks: Vec<Vec<Stmt>>,
    scopes: Vec<HashMap<String, Var>>,
    spans: SpanTable,
    /// The kernel's parameters' kinds, by index.
    param_kinds: Vec<crate::ir::ParamKind>,
    /// Tensor descriptors made so far (`views`).
    descriptors: Vec<views::Descriptor>,
    /// Loads through them.
    view_loads: Vec<crate::ir::ViewLoad>,
}

type R<T> = Result<T, CompileError>;

/// The unknown-op error: the tile ops (from the one table, [`TILE_OPS`]) and the hint
/// that helpers need `#[tile_fn]`.
pub fn unknown_op_message(name: &str) -> String {
    let ops: Vec<&str> = TILE_OPS
        .iter()
        .copied()
        .filter(|n| *n != "where_")
        .collect();
    format!(
        "unknown op `{name}` (tile ops: {}). To call a helper function from a kernel, mark it `#[tile_fn]`",
        ops.join(", ")
    )
}

impl Lower {
    fn run(&mut self, ast: &KernelAst, spec: &Specialization) -> R<Kernel> {
        let root = self.spans.add(ast.name.span());
        for c in &ast.consts {
            let Some((_, v)) = spec.consts.iter().find(|(n, _)| *n == c.name) else {
                return Err(CompileError::new(
                    root,
                    format!("no value given for constant `{}`", c.name),
                ));
            };
            self.consts.insert(c.name.clone(), *v);
        }
        let mut cluster = [1u32; 3];
        for (axis, extent) in ast.cluster.iter().enumerate() {
            let v = extent.resolve(&spec.consts).unwrap_or(0);
            if !(1..=16).contains(&v) {
                let loc = self.spans.add(extent.span());
                return Err(CompileError::new(
                    loc,
                    format!("a cluster extent must be between 1 and 16, got {v}"),
                ));
            }
            cluster[axis] = v as u32;
            self.clustered |= matches!(extent, crate::front::ClusterExtent::Const(..)) || v != 1;
        }
        if cluster.iter().product::<u32>() > 16 {
            let loc = self.spans.add(ast.cluster[1].span());
            return Err(CompileError::new(
                loc,
                format!("a cluster holds at most 16 programs, got {cluster:?}"),
            ));
        }
        let mut params = Vec::new();
        for (i, p) in ast.params.iter().enumerate() {
            let loc = self.spans.add(p.span);
            params.push(Param {
                name: p.name.clone(),
                kind: p.kind,
                loc,
            });
            let v = self.emit(Expr::Param(i), loc);
            self.bind(&p.name, v, false);
        }
        self.block_stmts(&ast.body.stmts)?;
        let body = Block {
            stmts: self.blocks.pop().unwrap_or_default(),
        };
        Ok(Kernel {
            name: ast.name.to_string(),
            params,
            consts: ast
                .consts
                .iter()
                .map(|c| (c.name.clone(), self.consts[&c.name]))
                .collect(),
            num_warps: spec.num_warps,
            num_stages: spec.num_stages.unwrap_or(ast.num_stages[0]),
            cluster,
            max_registers: ast.register_cap(spec),
            values: std::mem::take(&mut self.values),
            body,
            view_loads: std::mem::take(&mut self.view_loads),
        })
    }

    // ---- arena and scopes ----------------------------------------------------------

    fn loc(&mut self, span: Span) -> Loc {
        self.spans.add(span)
    }

    fn err<T>(&mut self, span: Span, msg: impl Into<String>) -> R<T> {
        let loc = self.loc(span);
        Err(CompileError::new(loc, msg))
    }

    fn new_value(&mut self, def: Def, loc: Loc) -> ValueId {
        self.values.push(Value { def, ty: None, loc });
        ValueId(self.values.len() as u32 - 1)
    }

    fn emit(&mut self, expr: Expr, loc: Loc) -> ValueId {
        let v = self.new_value(Def::Expr(expr), loc);
        self.push_stmt(Stmt::Let(v));
        v
    }

    fn emit_at(&mut self, expr: Expr, span: Span) -> ValueId {
        let loc = self.loc(span);
        self.emit(expr, loc)
    }

    fn push_stmt(&mut self, s: Stmt) {
        self.blocks
            .last_mut()
            .expect("lowering always has an open block")
            .push(s);
    }

    fn bind(&mut self, name: &str, value: ValueId, mutable: bool) {
        self.bind_var(
            name,
            Var {
                value,
                mutable,
                descriptor: None,
            },
        );
    }

    fn bind_var(&mut self, name: &str, var: Var) {
        self.scopes
            .last_mut()
            .expect("lowering always has a scope")
            .insert(name.to_string(), var);
    }

    fn lookup(&self, name: &str) -> Option<Var> {
        self.scopes.iter().rev().find_map(|s| s.get(name).copied())
    }

    /// The descriptor `e` names, if it is a variable bound to one.
    fn descriptor_named(&self, e: &SynExpr) -> Option<views::Descriptor> {
        let SynExpr::Path(p) = strip_parens(e) else {
            return None;
        };
        let var = self.lookup(&p.path.get_ident()?.to_string())?;
        Some(self.descriptors[var.descriptor? as usize])
    }

    fn assign(&mut self, name: &str, value: ValueId, span: Span) -> R<()> {
        for scope in self.scopes.iter_mut().rev() {
            if let Some(var) = scope.get_mut(name) {
                if var.descriptor.is_some() {
                    let msg = format!("`{name}` is a tensor descriptor: it cannot be assigned (make another with `let`)");
                    return self.err(span, msg);
                }
                if !var.mutable {
                    let msg = format!("cannot assign twice to immutable variable `{name}` (declare it with `let mut`)");
                    return self.err(span, msg);
                }
                var.value = value;
                return Ok(());
            }
        }
        if self.consts.contains_key(name) {
            return self.err(span, format!("cannot assign to constant `{name}`"));
        }
        self.err(span, format!("unknown variable `{name}`"))
    }

    fn literal(&self, v: ValueId) -> Option<Literal> {
        match &self.values[v.index()].def {
            Def::Expr(Expr::Literal(l)) => Some(*l),
            _ => None,
        }
    }

    // ---- statements ------------------------------------------------------------------

    fn block_stmts(&mut self, stmts: &[SynStmt]) -> R<()> {
        for s in stmts {
            self.stmt(s)?;
        }
        Ok(())
    }

    fn stmt(&mut self, s: &SynStmt) -> R<()> {
        match s {
            SynStmt::Local(local) => {
                if let Pat::Tuple(pt) = &local.pat {
                    return self.let_tuple(pt, local);
                }
                let (name, mutable, span) = match &local.pat {
                    Pat::Ident(pi) => (pi.ident.to_string(), pi.mutability.is_some(), pi.span()),
                    Pat::Type(pt) => {
                        return self.err(
                            pt.ty.span(),
                            "type annotations on `let` are not supported: convert with `expr as T`",
                        )
                    }
                    other => {
                        return self.err(
                            other.span(),
                            "`let` binds a name or a tuple of names (`let (a, b) = ..`)",
                        )
                    }
                };
                let Some(init) = &local.init else {
                    return self.err(span, format!("`{name}` needs an initial value"));
                };
                if let Some((_, diverge)) = &init.diverge {
                    return self.err(diverge.span(), "`let .. else` is not supported");
                }
                if let SynExpr::Call(c) = strip_parens(&init.expr) {
                    if call_name(&c.func).as_deref() == Some("make_tensor_descriptor") {
                        return self.bind_descriptor(&name, c);
                    }
                }
                let v = self.expr(&init.expr)?;
                self.bind(&name, v, mutable);
                Ok(())
            }
            SynStmt::Expr(e, _) => self.expr_stmt(e),
            SynStmt::Item(item) => {
                self.err(item.span(), "items cannot be declared inside a kernel")
            }
            SynStmt::Macro(m) => self.err(m.span(), "macros are not supported inside a kernel"),
        }
    }

    fn expr_stmt(&mut self, e: &SynExpr) -> R<()> {
        match e {
            SynExpr::Assign(a) if matches!(strip_parens(&a.left), SynExpr::Tuple(_)) => {
                self.assign_tuple(a)
            }
            SynExpr::Assign(a) => {
                let name = self.assign_target(&a.left)?;
                let v = self.expr(&a.right)?;
                self.assign(&name, v, a.left.span())
            }
            SynExpr::Binary(b) if compound_op(&b.op).is_some() => {
                let name = self.assign_target(&b.left)?;
                let op = compound_op(&b.op).expect("checked above");
                let lhs = self.expr(&b.left)?;
                let rhs = self.expr(&b.right)?;
                let v = self.binary(op, lhs, rhs, b.span())?;
                self.assign(&name, v, b.left.span())
            }
            SynExpr::ForLoop(f) => self.for_loop(f),
            SynExpr::If(i) => self.if_stmt(i),
            SynExpr::Block(b) => {
                self.scopes.push(HashMap::new());
                let r = self.block_stmts(&b.block.stmts);
                self.scopes.pop();
                r
            }
            SynExpr::Call(c) if call_name(&c.func).as_deref() == Some("store") => self.store(c),
            SynExpr::Call(c) if call_name(&c.func).as_deref() == Some("prefetch") => {
                self.prefetch(c)
            }
            SynExpr::Call(c) if call_name(&c.func).as_deref() == Some("prefetch_range") => {
                self.prefetch_range(c)
            }
            SynExpr::Call(c)
                if matches!(
                    call_name(&c.func).as_deref(),
                    Some("wait_for_prior_kernels" | "launch_dependents")
                ) =>
            {
                let name = call_name(&c.func).unwrap_or_default();
                if !c.args.is_empty() {
                    return self.err(c.span(), format!("`{name}()` takes no arguments"));
                }
                // Every program must reach it: nested in a loop or branch, a program could
                // skip the wait, or the next kernel would wait for this one's end.
                if self.blocks.len() > 1 {
                    return self.err(
                        c.span(),
                        format!("`{name}()` must be at the top level of the kernel body"),
                    );
                }
                let loc = self.loc(c.span());
                self.push_stmt(if name == "wait_for_prior_kernels" {
                    Stmt::WaitPriorKernels { loc }
                } else {
                    Stmt::LaunchDependents { loc }
                });
                Ok(())
            }
            SynExpr::Call(c)
                if matches!(
                    call_name(&c.func).as_deref(),
                    Some("signal_flag" | "wait_flag_at_least")
                ) =>
            {
                self.flag(c)
            }
            SynExpr::Call(c) if call_name(&c.func).is_some_and(|n| self.helper(&n).is_some()) => {
                let name = call_name(&c.func).unwrap_or_default();
                let h = self.helper(&name).expect("checked by the guard");
                self.inline_helper(h, c).map(|_| ())
            }
            SynExpr::Return(r) => self.err(
                r.span(),
                "`return` is not supported: guard the work with masks or an `if`",
            ),
            SynExpr::While(w) => self.while_loop(w),
            SynExpr::Loop(l) => self.err(
                l.span(),
                "`loop` is not supported: use `while cond { .. }` or `for`",
            ),
            other => {
                let v = self.expr(other)?;
                // An expression statement whose value is unused: keep it only for its
                // effects (atomics).
                let _ = v;
                Ok(())
            }
        }
    }

    /// `let (a, mut b, _) = ..`: each name bound to its element of a tuple expression or
    /// of a helper's tuple result (`_` drops one).
    fn let_tuple(&mut self, pt: &syn::PatTuple, local: &syn::Local) -> R<()> {
        let mut names = Vec::new();
        for p in &pt.elems {
            names.push(match p {
                Pat::Ident(pi) if pi.subpat.is_none() && pi.by_ref.is_none() => {
                    Some((pi.ident.to_string(), pi.mutability.is_some()))
                }
                Pat::Wild(_) => None,
                other => {
                    return self.err(
                        other.span(),
                        "a tuple pattern takes names and `_` (`let (a, mut b, _) = ..`)",
                    )
                }
            });
        }
        let Some(init) = &local.init else {
            return self.err(pt.span(), "a tuple `let` needs an initial value");
        };
        if let Some((_, diverge)) = &init.diverge {
            return self.err(diverge.span(), "`let .. else` is not supported");
        }
        let values = self.tuple_values(&init.expr)?;
        if values.len() != names.len() {
            return self.err(
                pt.span(),
                format!(
                    "this pattern takes {} values, the tuple has {}",
                    names.len(),
                    values.len()
                ),
            );
        }
        for (name, v) in names.into_iter().zip(values) {
            if let Some((name, mutable)) = name {
                self.bind(&name, v, mutable);
            }
        }
        Ok(())
    }

    /// `(a, b) = ..`: destructuring assignment to mutable variables (`_` drops one).
    fn assign_tuple(&mut self, a: &syn::ExprAssign) -> R<()> {
        let SynExpr::Tuple(targets) = strip_parens(&a.left) else {
            return self.err(a.left.span(), "expected a tuple of variables");
        };
        let mut names = Vec::new();
        for t in &targets.elems {
            names.push(match t {
                SynExpr::Infer(_) => None,
                other => Some((self.assign_target(other)?, other.span())),
            });
        }
        let values = self.tuple_values(&a.right)?;
        if values.len() != names.len() {
            return self.err(
                a.left.span(),
                format!(
                    "{} variables are assigned, the tuple has {} values",
                    names.len(),
                    values.len()
                ),
            );
        }
        for (name, v) in names.into_iter().zip(values) {
            if let Some((name, span)) = name {
                self.assign(&name, v, span)?;
            }
        }
        Ok(())
    }

    /// The values of a tuple: a tuple expression `(x, y + 1)`, or a call of a helper
    /// whose body ends in one. Tuples are not values of their own: they exist to be
    /// taken apart by a tuple `let` or assignment.
    fn tuple_values(&mut self, e: &SynExpr) -> R<Vec<ValueId>> {
        let e = strip_parens(e);
        if let SynExpr::Tuple(t) = e {
            return t.elems.iter().map(|x| self.expr(x)).collect();
        }
        if let SynExpr::Call(c) = e {
            if let Some(h) = call_name(&c.func).and_then(|n| self.helper(&n)) {
                return self.inline_helper_with(h, c, Self::helper_tuple_body);
            }
        }
        self.err(
            e.span(),
            "expected a tuple `(a, b)` or a call of a helper that returns one",
        )
    }

    fn assign_target(&mut self, e: &SynExpr) -> R<String> {
        match e {
            SynExpr::Path(p) if p.path.get_ident().is_some() => {
                Ok(p.path.get_ident().expect("checked").to_string())
            }
            other => self.err(other.span(), "only plain variables can be assigned"),
        }
    }

    fn for_loop(&mut self, f: &syn::ExprForLoop) -> R<()> {
        let Pat::Ident(pi) = &*f.pat else {
            return self.err(f.pat.span(), "the loop variable is a single name");
        };
        // `.stages(n)` or `.unroll(2)` last: code generation hints (docs/language.md).
        let (expr, stages) = match &*f.expr {
            SynExpr::MethodCall(m) if m.method == "stages" => {
                let Some(arg) = m.args.first().filter(|_| m.args.len() == 1) else {
                    return self.err(m.span(), "`.stages(n)` takes one count");
                };
                let n = self.const_int(arg, "the count of `.stages(n)`")?;
                if !(0..=8).contains(&n) {
                    return self.err(
                        m.span(),
                        format!("`.stages(n)` takes a count from 0 to 8 (0 and 1: no copies ahead), got {n}"),
                    );
                }
                // One stage is the plain loop: a constant can switch staging off.
                (&*m.receiver, if n < 2 { 0 } else { n as u32 })
            }
            other => (other, 0),
        };
        let (iter, unroll) = match expr {
            SynExpr::MethodCall(m) if m.method == "unroll" => {
                let two = matches!(
                    m.args.first(),
                    Some(SynExpr::Lit(syn::ExprLit { lit: syn::Lit::Int(n), .. }))
                        if n.base10_digits() == "2"
                ) && m.args.len() == 1;
                if !two {
                    return self.err(
                        m.span(),
                        "loops unroll by two only: `(start..end).step_by(step).unroll(2)`",
                    );
                }
                (&*m.receiver, true)
            }
            other => (other, false),
        };
        let (range, step) = match iter {
            SynExpr::MethodCall(m) if m.method == "step_by" && m.args.len() == 1 => {
                (strip_parens(&m.receiver), Some(&m.args[0]))
            }
            other => (strip_parens(other), None),
        };
        let SynExpr::Range(range) = range else {
            return self.err(
                iter.span(),
                "loops run over `start..end` or `(start..end).step_by(step)`",
            );
        };
        if matches!(range.limits, syn::RangeLimits::Closed(_)) {
            return self.err(range.span(), "use a half-open range `start..end`");
        }
        let (Some(start), Some(end)) = (&range.start, &range.end) else {
            return self.err(range.span(), "a loop range needs a start and an end");
        };
        let start = self.expr(start)?;
        let end = self.expr(end)?;
        let step = match step {
            Some(s) => self.expr(s)?,
            None => self.emit_at(Expr::Literal(Literal::Int(1, None)), range.span()),
        };
        let loop_loc = self.loc(f.span());

        // Variables from outside that the body assigns are carried by the loop.
        let mut assigned = AssignedNames::default();
        assigned.visit_block(&f.body);
        let mut carried_names: Vec<String> = assigned
            .names
            .into_iter()
            .filter(|n| self.lookup(n).is_some_and(|v| v.mutable))
            .collect();
        carried_names.sort();
        let mut carried = Vec::new();
        for name in &carried_names {
            let init = self.lookup(name).expect("filtered above").value;
            let loc = self.values[init.index()].loc;
            let param = self.new_value(Def::Carried { init }, loc);
            self.assign(name, param, f.span())?;
            carried.push((name.clone(), init, param));
        }

        let index = self.new_value(Def::LoopIndex, loop_loc);
        self.blocks.push(Vec::new());
        self.scopes.push(HashMap::new());
        self.bind(&pi.ident.to_string(), index, false);
        let r = self.block_stmts(&f.body.stmts);
        self.scopes.pop();
        let body = Block {
            stmts: self.blocks.pop().unwrap_or_default(),
        };
        r?;

        let mut out = Vec::new();
        for (name, init, param) in carried {
            let next = self.lookup(&name).expect("still in scope").value;
            let result = self.new_value(Def::LoopResult { init }, loop_loc);
            self.assign(&name, result, f.span())?;
            out.push(Carried {
                param,
                init,
                next,
                result,
            });
        }
        self.push_stmt(Stmt::For {
            index,
            start,
            end,
            step,
            carried: out,
            body,
            unroll,
            stages,
            loc: loop_loc,
        });
        Ok(())
    }

    /// `while cond { .. }`: a run-time scalar condition, evaluated before every
    /// iteration; variables from outside that the body assigns are carried, as in `for`.
    fn while_loop(&mut self, w: &syn::ExprWhile) -> R<()> {
        if let Some(label) = &w.label {
            return self.err(label.span(), "loop labels are not supported");
        }
        let loop_loc = self.loc(w.span());
        let mut assigned = AssignedNames::default();
        assigned.visit_block(&w.body);
        let mut carried_names: Vec<String> = assigned
            .names
            .into_iter()
            .filter(|n| self.lookup(n).is_some_and(|v| v.mutable))
            .collect();
        carried_names.sort();
        let mut carried = Vec::new();
        for name in &carried_names {
            let init = self.lookup(name).expect("filtered above").value;
            let loc = self.values[init.index()].loc;
            let param = self.new_value(Def::Carried { init }, loc);
            self.assign(name, param, w.span())?;
            carried.push((name.clone(), init, param));
        }
        // The condition's statements run at the head of every iteration.
        self.blocks.push(Vec::new());
        let cond = self.expr(&w.cond);
        let cond_body = Block {
            stmts: self.blocks.pop().unwrap_or_default(),
        };
        let cond = cond?;
        if let Some(Literal::Bool(_)) = self.literal(cond) {
            return self.err(
                w.cond.span(),
                "a `while` condition must depend on run-time values (a constant condition never ends or never runs)",
            );
        }
        self.blocks.push(Vec::new());
        self.scopes.push(HashMap::new());
        let r = self.block_stmts(&w.body.stmts);
        self.scopes.pop();
        let body = Block {
            stmts: self.blocks.pop().unwrap_or_default(),
        };
        r?;
        let mut out = Vec::new();
        for (name, init, param) in carried {
            let next = self.lookup(&name).expect("still in scope").value;
            let result = self.new_value(Def::LoopResult { init }, loop_loc);
            self.assign(&name, result, w.span())?;
            out.push(Carried {
                param,
                init,
                next,
                result,
            });
        }
        self.push_stmt(Stmt::While {
            cond_body,
            cond,
            carried: out,
            body,
            loc: loop_loc,
        });
        Ok(())
    }

    fn branch(&mut self, stmts: &[SynStmt]) -> R<(Block, Vec<HashMap<String, Var>>)> {
        self.blocks.push(Vec::new());
        self.scopes.push(HashMap::new());
        let r = self.block_stmts(stmts);
        self.scopes.pop();
        let block = Block {
            stmts: self.blocks.pop().unwrap_or_default(),
        };
        r?;
        Ok((block, self.scopes.clone()))
    }

    fn if_stmt(&mut self, i: &syn::ExprIf) -> R<()> {
        let cond = self.expr(&i.cond)?;
        if let Some(Literal::Bool(taken)) = self.literal(cond) {
            return self.const_if(i, taken);
        }
        let loc = self.loc(i.span());
        let before = self.scopes.clone();
        let (then_body, then_scopes) = self.branch(&i.then_branch.stmts)?;
        self.scopes = before.clone();
        let (else_body, else_scopes) = match &i.else_branch {
            None => (Block::default(), before.clone()),
            Some((_, e)) => match &**e {
                SynExpr::Block(b) => self.branch(&b.block.stmts)?,
                SynExpr::If(nested) => {
                    self.blocks.push(Vec::new());
                    let r = self.if_stmt(nested);
                    let block = Block {
                        stmts: self.blocks.pop().unwrap_or_default(),
                    };
                    r?;
                    (block, self.scopes.clone())
                }
                other => return self.err(other.span(), "expected a block after `else`"),
            },
        };
        self.scopes = before.clone();
        let mut merges = Vec::new();
        for (level, scope) in before.iter().enumerate() {
            let mut names: Vec<&String> = scope.keys().collect();
            names.sort();
            for name in names {
                let orig = scope[name].value;
                let t = then_scopes[level][name].value;
                let e = else_scopes[level][name].value;
                if t == orig && e == orig {
                    continue;
                }
                let result = self.new_value(Def::BranchResult { then_value: t }, loc);
                self.scopes[level].get_mut(name).expect("same scopes").value = result;
                merges.push(Merge {
                    then_value: t,
                    else_value: e,
                    result,
                });
            }
        }
        self.push_stmt(Stmt::If {
            cond,
            then_body,
            else_body,
            merges,
            loc,
        });
        Ok(())
    }

    /// An `if` whose condition folded to a constant (it tests compile-time constants
    /// only): the taken branch is compiled in place and the other is not compiled at
    /// all, so a branch may use shapes or operations that only some specializations
    /// allow.
    fn const_if(&mut self, i: &syn::ExprIf, taken: bool) -> R<()> {
        let stmts = if taken {
            &i.then_branch.stmts
        } else {
            match &i.else_branch {
                None => return Ok(()),
                Some((_, e)) => match &**e {
                    SynExpr::Block(b) => &b.block.stmts,
                    SynExpr::If(nested) => return self.if_stmt(nested),
                    other => return self.err(other.span(), "expected a block after `else`"),
                },
            }
        };
        self.scopes.push(HashMap::new());
        let r = self.block_stmts(stmts);
        self.scopes.pop();
        r
    }

    // ---- expressions -----------------------------------------------------------------

    fn expr(&mut self, e: &SynExpr) -> R<ValueId> {
        match e {
            SynExpr::Lit(l) => self.lit(&l.lit),
            SynExpr::Paren(p) => self.expr(&p.expr),
            SynExpr::Group(g) => self.expr(&g.expr),
            SynExpr::Path(p) => {
                if let Some(lit) = path_constant(&p.path) {
                    return Ok(self.emit_at(Expr::Literal(lit), p.span()));
                }
                let Some(ident) = p.path.get_ident() else {
                    return self.err(
                        p.span(),
                        "expected a variable name or a constant like `f32::INFINITY`",
                    );
                };
                let name = ident.to_string();
                if let Some(var) = self.lookup(&name) {
                    if var.descriptor.is_some() {
                        return self.err(
                            p.span(),
                            format!("`{name}` is a tensor descriptor, not a value: read a block with `{name}.load([row, col])`"),
                        );
                    }
                    return Ok(var.value);
                }
                if let Some(&c) = self.consts.get(&name) {
                    return Ok(self.emit_at(Expr::Literal(Literal::Int(c, None)), p.span()));
                }
                self.err(p.span(), format!("unknown name `{name}`"))
            }
            SynExpr::Binary(b) => {
                if compound_op(&b.op).is_some() {
                    return self.err(b.span(), "compound assignment is a statement");
                }
                let lhs = self.expr(&b.left)?;
                let rhs = self.expr(&b.right)?;
                match bin_op(&b.op) {
                    Some(Op2::Arith(op)) => self.binary(op, lhs, rhs, b.span()),
                    Some(Op2::Cmp(op)) => self.compare(op, lhs, rhs, b.span()),
                    None => self.err(b.op.span(), "unsupported operator"),
                }
            }
            SynExpr::Unary(u) => {
                let arg = self.expr(&u.expr)?;
                let op = match u.op {
                    UnOp::Neg(_) => UnaryOp::Neg,
                    UnOp::Not(_) => UnaryOp::Not,
                    _ => return self.err(u.op.span(), "unsupported unary operator"),
                };
                if let (UnaryOp::Not, Some(Literal::Bool(b))) = (op, self.literal(arg)) {
                    return Ok(self.emit_at(Expr::Literal(Literal::Bool(!b)), u.span()));
                }
                if let (UnaryOp::Neg, Some(l)) = (op, self.literal(arg)) {
                    let folded = match l {
                        Literal::Int(v, d) => Literal::Int(v.wrapping_neg(), d),
                        Literal::Float(v, d) => Literal::Float(-v, d),
                        Literal::Bool(_) => return self.err(u.span(), "cannot negate a bool"),
                    };
                    return Ok(self.emit_at(Expr::Literal(folded), u.span()));
                }
                Ok(self.emit_at(Expr::Unary { op, arg }, u.span()))
            }
            SynExpr::Cast(c) => {
                let to = self.dtype(&c.ty)?;
                let value = self.expr(&c.expr)?;
                if let Some(l) = self.literal(value) {
                    let folded = match (l, to.is_float()) {
                        (Literal::Int(v, _), false) if to != DType::Bool => {
                            Some(Literal::Int(v, Some(to)))
                        }
                        (Literal::Int(v, _), true) => Some(Literal::Float(v as f64, Some(to))),
                        (Literal::Float(v, _), true) => Some(Literal::Float(v, Some(to))),
                        _ => None,
                    };
                    if let Some(l) = folded {
                        return Ok(self.emit_at(Expr::Literal(l), c.span()));
                    }
                }
                Ok(self.emit_at(Expr::Cast { value, to }, c.span()))
            }
            SynExpr::Call(c) => {
                let Some(name) = call_name(&c.func) else {
                    return self.err(c.func.span(), "expected the name of a tile op");
                };
                if let Some(h) = self.helper(&name) {
                    return match self.inline_helper(h, c)? {
                        Some(v) => Ok(v),
                        None => self.err(
                            c.span(),
                            format!("helper `{name}` returns nothing: call it as a statement (`{name}(..);`)"),
                        ),
                    };
                }
                let turbofish = call_turbofish(&c.func);
                let args: Vec<&SynExpr> = c.args.iter().collect();
                self.call(&name, turbofish, &args, c.span())
            }
            SynExpr::MethodCall(m) => {
                let name = m.method.to_string();
                if let Some(d) = self.descriptor_named(&m.receiver) {
                    if name != "load" {
                        return self.err(
                            m.method.span(),
                            format!("a tensor descriptor has one method, `load([row, col])`, not `{name}`"),
                        );
                    }
                    let args: Vec<&SynExpr> = m.args.iter().collect();
                    return self.descriptor_load(d, &args, m.method.span());
                }
                let turbofish = m
                    .turbofish
                    .as_ref()
                    .and_then(|t| t.args.first())
                    .and_then(|a| match a {
                        syn::GenericArgument::Type(t) => Some(t.clone()),
                        _ => None,
                    });
                let mut args: Vec<&SynExpr> = vec![&m.receiver];
                args.extend(m.args.iter());
                // Located at the method's name: the span of the whole call would start at
                // the receiver.
                self.call(&name, turbofish, &args, m.method.span())
            }
            SynExpr::Index(i) => self.err(
                i.span(),
                "indexing is not supported: use `x.expand_dims(axis)` for Triton's `x[:, None]`",
            ),
            SynExpr::If(i) => self.err(
                i.span(),
                "`if` is a statement in kernels: assign a `let mut` variable in each branch, or use `select(cond, a, b)`",
            ),
            other => self.err(other.span(), "unsupported expression in a kernel"),
        }
    }

    fn lit(&mut self, lit: &Lit) -> R<ValueId> {
        let l = match lit {
            Lit::Int(i) => {
                let suffix = match i.suffix() {
                    "" | "usize" => None,
                    s => match DType::from_name(s) {
                        Some(d) if d.is_int() => Some(d),
                        _ => {
                            return self.err(i.span(), format!("unsupported literal suffix `{s}`"))
                        }
                    },
                };
                let v: i64 = match i.base10_parse() {
                    Ok(v) => v,
                    Err(e) => return self.err(i.span(), e.to_string()),
                };
                Literal::Int(v, suffix)
            }
            Lit::Float(f) => {
                let suffix = match f.suffix() {
                    "" => None,
                    "f32" => Some(DType::F32),
                    s => return self.err(f.span(), format!("unsupported literal suffix `{s}`")),
                };
                let v: f64 = match f.base10_parse() {
                    Ok(v) => v,
                    Err(e) => return self.err(f.span(), e.to_string()),
                };
                Literal::Float(v, suffix)
            }
            Lit::Bool(b) => Literal::Bool(b.value),
            other => return self.err(other.span(), "unsupported literal"),
        };
        Ok(self.emit_at(Expr::Literal(l), lit.span()))
    }

    fn binary(&mut self, op: BinaryOp, lhs: ValueId, rhs: ValueId, span: Span) -> R<ValueId> {
        if let (Some(a), Some(b)) = (self.literal(lhs), self.literal(rhs)) {
            if let Some(folded) = fold_binary(op, a, b) {
                return Ok(self.emit_at(Expr::Literal(folded), span));
            }
            if let (Literal::Int(_, _), Literal::Int(0, _), BinaryOp::Div | BinaryOp::Rem) =
                (a, b, op)
            {
                return self.err(span, "division by zero in a constant expression");
            }
        }
        Ok(self.emit_at(Expr::Binary { op, lhs, rhs }, span))
    }

    fn compare(&mut self, op: CmpOp, lhs: ValueId, rhs: ValueId, span: Span) -> R<ValueId> {
        if let (Some(Literal::Int(a, _)), Some(Literal::Int(b, _))) =
            (self.literal(lhs), self.literal(rhs))
        {
            let v = match op {
                CmpOp::Eq => a == b,
                CmpOp::Ne => a != b,
                CmpOp::Lt => a < b,
                CmpOp::Le => a <= b,
                CmpOp::Gt => a > b,
                CmpOp::Ge => a >= b,
            };
            return Ok(self.emit_at(Expr::Literal(Literal::Bool(v)), span));
        }
        Ok(self.emit_at(Expr::Compare { op, lhs, rhs }, span))
    }

    /// A compile-time integer: a literal, a constant, or arithmetic on them.
    fn const_int(&mut self, e: &SynExpr, what: &str) -> R<i64> {
        let v = self.expr(e)?;
        match self.literal(v) {
            Some(Literal::Int(v, _)) => Ok(v),
            _ => self.err(
                e.span(),
                format!("{what} must be a compile-time constant (a literal or a `const` generic), not a run-time value"),
            ),
        }
    }

    fn shape(&mut self, e: &SynExpr) -> R<Vec<usize>> {
        let SynExpr::Array(arr) = strip_parens(e) else {
            return self.err(e.span(), "a shape is written `[D0, D1, ..]`");
        };
        if arr.elems.is_empty() || arr.elems.len() > 4 {
            return self.err(e.span(), "tiles have rank 1 to 4");
        }
        let mut dims = Vec::new();
        for d in &arr.elems {
            let v = self.const_int(d, "a tile dimension")?;
            if v <= 0 || (v as u64).count_ones() != 1 {
                return self.err(
                    d.span(),
                    format!("tile dimensions are powers of two, got {v}"),
                );
            }
            dims.push(v as usize);
        }
        Ok(dims)
    }

    fn dtype(&mut self, ty: &syn::Type) -> R<DType> {
        if let syn::Type::Path(p) = ty {
            if let Some(id) = p.path.get_ident() {
                if let Some(d) = self.named_dtype(&id.to_string()) {
                    return Ok(d);
                }
            }
        }
        self.err(
            ty.span(),
            "expected an element type: bool, u8, i32, u32, i64, f16, bf16 or f32",
        )
    }

    /// A dtype by name: a dtype's own name, or a bound type parameter.
    fn named_dtype(&self, name: &str) -> Option<DType> {
        DType::from_name(name).or_else(|| self.types.get(name).copied())
    }

    fn dtype_expr(&mut self, e: &SynExpr) -> R<DType> {
        if let SynExpr::Path(p) = e {
            if let Some(id) = p.path.get_ident() {
                if let Some(d) = self.named_dtype(&id.to_string()) {
                    return Ok(d);
                }
            }
        }
        self.err(
            e.span(),
            "expected an element type: bool, u8, i32, u32, i64, f16, bf16 or f32",
        )
    }

    fn arity(&mut self, name: &str, args: &[&SynExpr], lo: usize, hi: usize, span: Span) -> R<()> {
        if args.len() < lo || args.len() > hi {
            let want = if lo == hi {
                format!("{lo}")
            } else {
                format!("{lo} to {hi}")
            };
            return self.err(
                span,
                format!("`{name}` takes {want} arguments, got {}", args.len()),
            );
        }
        Ok(())
    }

    fn call(
        &mut self,
        name: &str,
        turbofish: Option<syn::Type>,
        args: &[&SynExpr],
        span: Span,
    ) -> R<ValueId> {
        let unary = |n: &str| -> Option<UnaryOp> {
            Some(match n {
                "exp" => UnaryOp::Exp,
                "exp2" => UnaryOp::Exp2,
                "log" => UnaryOp::Log,
                "log2" => UnaryOp::Log2,
                "sqrt" => UnaryOp::Sqrt,
                "rsqrt" => UnaryOp::Rsqrt,
                "sin" => UnaryOp::Sin,
                "cos" => UnaryOp::Cos,
                "abs" => UnaryOp::Abs,
                "sigmoid" => UnaryOp::Sigmoid,
                "tanh" => UnaryOp::Tanh,
                "floor" => UnaryOp::Floor,
                "ceil" => UnaryOp::Ceil,
                _ => return None,
            })
        };
        if let Some(op) = unary(name) {
            self.arity(name, args, 1, 1, span)?;
            let arg = self.expr(args[0])?;
            return Ok(self.emit_at(Expr::Unary { op, arg }, span));
        }
        match name {
            "program_id" | "num_programs" => {
                self.arity(name, args, 1, 1, span)?;
                let axis = self.const_int(args[0], "the axis")?;
                if !(0..3).contains(&axis) {
                    return self.err(args[0].span(), "the axis is 0, 1 or 2");
                }
                let e = if name == "program_id" {
                    Expr::ProgramId(axis as u32)
                } else {
                    Expr::NumPrograms(axis as u32)
                };
                Ok(self.emit_at(e, span))
            }
            "global_timer" => {
                self.arity(name, args, 0, 0, span)?;
                Ok(self.emit_at(Expr::GlobalTimer, span))
            }
            "sm_id" => {
                self.arity(name, args, 0, 0, span)?;
                Ok(self.emit_at(Expr::SmId, span))
            }
            "cluster_gather" => {
                self.arity(name, args, 1, 1, span)?;
                if !self.clustered {
                    return self.err(
                        span,
                        "`cluster_gather` needs thread-block clusters: add `cluster(y = N)` (or x, z) to `#[kernel(..)]`",
                    );
                }
                // Every program of the cluster must reach it (it is a cluster barrier).
                if self.blocks.len() > 1 {
                    return self.err(
                        span,
                        "`cluster_gather` must be at the top level of the kernel body, where every program reaches it",
                    );
                }
                let value = self.expr(args[0])?;
                Ok(self.emit_at(Expr::ClusterGather { value }, span))
            }
            "arange" => {
                self.arity(name, args, 2, 2, span)?;
                let start = self.const_int(args[0], "the start of `arange`")?;
                let end = self.const_int(args[1], "the end of `arange`")?;
                let n = end - start;
                if n <= 0 || (n as u64).count_ones() != 1 {
                    return self.err(
                        span,
                        format!("`arange(start, end)` needs `end - start` to be a power of two, got {n}"),
                    );
                }
                Ok(self.emit_at(Expr::Arange { start, end }, span))
            }
            "zeros" => {
                let (shape, dtype) = match (&turbofish, args.len()) {
                    (Some(t), 1) => (self.shape(args[0])?, self.dtype(t)?),
                    (None, 2) => (self.shape(args[0])?, self.dtype_expr(args[1])?),
                    _ => {
                        return self
                            .err(span, "write `zeros::<T>([D0, ..])` or `zeros([D0, ..], T)`")
                    }
                };
                let zero = if dtype.is_float() {
                    Literal::Float(0.0, Some(dtype))
                } else if dtype == DType::Bool {
                    Literal::Bool(false)
                } else {
                    Literal::Int(0, Some(dtype))
                };
                let value = self.emit_at(Expr::Literal(zero), span);
                Ok(self.emit_at(Expr::Splat { value, shape }, span))
            }
            "full" => {
                self.arity(name, args, 2, 2, span)?;
                let shape = self.shape(args[0])?;
                let mut value = self.expr(args[1])?;
                if let Some(t) = &turbofish {
                    let to = self.dtype(t)?;
                    value = self.emit_at(Expr::Cast { value, to }, span);
                }
                Ok(self.emit_at(Expr::Splat { value, shape }, span))
            }
            "bitcast" => {
                self.arity(name, args, 1, 1, span)?;
                let Some(t) = &turbofish else {
                    return self.err(span, "write `x.bitcast::<T>()` with the target type");
                };
                let to = self.dtype(t)?;
                let value = self.expr(args[0])?;
                Ok(self.emit_at(Expr::Bitcast { value, to }, span))
            }
            "broadcast_to" => {
                self.arity(name, args, 2, 2, span)?;
                let value = self.expr(args[0])?;
                let shape = self.shape(args[1])?;
                Ok(self.emit_at(Expr::Broadcast { value, shape }, span))
            }
            "expand_dims" => {
                self.arity(name, args, 2, 2, span)?;
                let value = self.expr(args[0])?;
                let axis = self.const_int(args[1], "the axis")?;
                if axis < 0 {
                    return self.err(args[1].span(), "the axis is non-negative");
                }
                Ok(self.emit_at(
                    Expr::ExpandDims {
                        value,
                        axis: axis as usize,
                    },
                    span,
                ))
            }
            "load" => {
                self.arity(name, args, 1, 3, span)?;
                let ptr = self.expr(args[0])?;
                let mask = match args.get(1) {
                    Some(m) => Some(self.expr(m)?),
                    None => None,
                };
                let other = match args.get(2) {
                    Some(o) => Some(self.expr(o)?),
                    None => None,
                };
                Ok(self.emit_at(Expr::Load { ptr, mask, other }, span))
            }
            "make_tensor_descriptor" => self.err(
                span,
                "bind a tensor descriptor with `let`: `let desc = make_tensor_descriptor(ptr, [rows, cols], [row_stride, 1], [BLOCK_ROWS, BLOCK_COLS]);`",
            ),
            "store" | "signal_flag" | "wait_flag_at_least" => {
                self.err(span, format!("`{name}` is a statement and returns nothing"))
            }
            "atomic_add" | "atomic_max" => {
                self.arity(name, args, 2, 3, span)?;
                let ptr = self.expr(args[0])?;
                let value = self.expr(args[1])?;
                let mask = match args.get(2) {
                    Some(m) => Some(self.expr(m)?),
                    None => None,
                };
                let op = if name == "atomic_add" {
                    AtomicOp::Add
                } else {
                    AtomicOp::Max
                };
                Ok(self.emit_at(
                    Expr::Atomic {
                        op,
                        ptr,
                        value,
                        mask,
                    },
                    span,
                ))
            }
            "dot4" => {
                self.arity(name, args, 3, 3, span)?;
                let a = self.expr(args[0])?;
                let b = self.expr(args[1])?;
                let acc = self.expr(args[2])?;
                Ok(self.emit_at(Expr::Dot4 { a, b, acc }, span))
            }
            "byte_perm" => {
                self.arity(name, args, 3, 3, span)?;
                let a = self.expr(args[0])?;
                let b = self.expr(args[1])?;
                let sel = self.expr(args[2])?;
                Ok(self.emit_at(Expr::BytePerm { a, b, sel }, span))
            }
            "select" | "where_" => {
                self.arity(name, args, 3, 3, span)?;
                let cond = self.expr(args[0])?;
                let then = self.expr(args[1])?;
                let other = self.expr(args[2])?;
                Ok(self.emit_at(Expr::Select { cond, then, other }, span))
            }
            "maximum" | "minimum" => {
                self.arity(name, args, 2, 2, span)?;
                let lhs = self.expr(args[0])?;
                let rhs = self.expr(args[1])?;
                let op = if name == "maximum" {
                    BinaryOp::Max
                } else {
                    BinaryOp::Min
                };
                self.binary(op, lhs, rhs, span)
            }
            "cdiv" => {
                self.arity(name, args, 2, 2, span)?;
                let a = self.expr(args[0])?;
                let b = self.expr(args[1])?;
                let one = self.emit_at(Expr::Literal(Literal::Int(1, None)), span);
                let bm1 = self.binary(BinaryOp::Sub, b, one, span)?;
                let num = self.binary(BinaryOp::Add, a, bm1, span)?;
                self.binary(BinaryOp::Div, num, b, span)
            }
            "sum" | "max" | "min" | "argmax" => {
                self.arity(name, args, 1, 2, span)?;
                let value = self.expr(args[0])?;
                let axis = match args.get(1) {
                    Some(a) => self.const_int(a, "the axis")?,
                    None => 0,
                };
                if axis < 0 {
                    return self.err(span, "the axis is non-negative");
                }
                let op = match name {
                    "sum" => ReduceOp::Sum,
                    "max" => ReduceOp::Max,
                    "min" => ReduceOp::Min,
                    _ => ReduceOp::Argmax,
                };
                Ok(self.emit_at(
                    Expr::Reduce {
                        op,
                        value,
                        axis: axis as usize,
                    },
                    span,
                ))
            }
            "dot" => {
                self.arity(name, args, 2, 3, span)?;
                let a = self.expr(args[0])?;
                let b = self.expr(args[1])?;
                let acc = match args.get(2) {
                    Some(c) => Some(self.expr(c)?),
                    None => None,
                };
                Ok(self.emit_at(Expr::Dot { a, b, acc }, span))
            }
            other => match self.more_ops(other, args, span)? {
                Some(v) => Ok(v),
                None => self.err(span, unknown_op_message(other)),
            },
        }
    }

    /// The index of the helper called `name`, if any (tile ops come first).
    fn helper(&self, name: &str) -> Option<usize> {
        if is_tile_op(name) {
            return None;
        }
        self.helpers.iter().position(|h| h.name == name)
    }

    /// Inlines a call of a `#[tile_fn]` helper: its arguments are evaluated here, then
    /// its body is lowered in place with only its parameters and generics in scope.
    /// Returns the value of its tail expression (`None` for a helper without a return
    /// type).
    fn inline_helper(&mut self, index: usize, c: &syn::ExprCall) -> R<Option<ValueId>> {
        self.inline_helper_with(index, c, Self::helper_body)
    }

    /// Inlines a helper call: binds its generic arguments and parameters in a scope of
    /// its own, then lowers its body with `body` (one value, or a tuple's values).
    fn inline_helper_with<T>(
        &mut self,
        index: usize,
        c: &syn::ExprCall,
        body: impl FnOnce(&mut Self, &TileFn) -> R<T>,
    ) -> R<T> {
        let h = self.helpers[index].clone();
        if self.inlining.contains(&h.name) {
            return self.err(
                c.span(),
                format!(
                    "helper `{}` calls itself (through {}): helpers are inlined, so they cannot recurse",
                    h.name,
                    self.inlining.join(" -> ")
                ),
            );
        }
        if c.args.len() != h.params.len() {
            return self.err(
                c.span(),
                format!(
                    "helper `{}` takes {} arguments, got {}",
                    h.name,
                    h.params.len(),
                    c.args.len()
                ),
            );
        }
        // Generic arguments: `f::<B, T>(..)`, in the helper's declaration order.
        let generic_args: Vec<syn::GenericArgument> = match &c.func.as_ref() {
            SynExpr::Path(p) => match p.path.segments.last().map(|s| &s.arguments) {
                Some(syn::PathArguments::AngleBracketed(a)) => a.args.iter().cloned().collect(),
                _ => Vec::new(),
            },
            _ => Vec::new(),
        };
        if !generic_args.is_empty() && generic_args.len() != h.generics.len() {
            return self.err(
                c.func.span(),
                format!(
                    "helper `{}` takes {} generic arguments, got {}",
                    h.name,
                    h.generics.len(),
                    generic_args.len()
                ),
            );
        }
        let mut consts = HashMap::new();
        let mut types = HashMap::new();
        for (i, g) in h.generics.iter().enumerate() {
            let Some(arg) = generic_args.get(i) else {
                if let Ok(name) = g {
                    return self.err(
                        c.func.span(),
                        format!(
                            "helper `{}` takes the constant `{name}`: pass it as `{}::<..>(..)`",
                            h.name, h.name
                        ),
                    );
                }
                // An unbound type parameter: the body may not name it.
                continue;
            };
            match (g, arg) {
                (Ok(name), syn::GenericArgument::Const(e)) => {
                    let v = self.generic_const(e)?;
                    consts.insert(name.clone(), v);
                }
                (Ok(name), syn::GenericArgument::Type(syn::Type::Path(p)))
                    if p.path.get_ident().is_some() =>
                {
                    let e = SynExpr::Path(syn::ExprPath {
                        attrs: Vec::new(),
                        qself: None,
                        path: p.path.clone(),
                    });
                    let v = self.generic_const(&e)?;
                    consts.insert(name.clone(), v);
                }
                (Err(name), syn::GenericArgument::Type(t)) => {
                    let d = self.dtype(t)?;
                    types.insert(name.clone(), d);
                }
                (_, other) => {
                    return self.err(
                        other.span(),
                        format!(
                            "this generic argument does not fit helper `{}`'s declaration",
                            h.name
                        ),
                    )
                }
            }
        }
        let mut args = Vec::new();
        for a in &c.args {
            args.push(self.expr(a)?);
        }
        let saved_scopes = std::mem::replace(&mut self.scopes, vec![HashMap::new()]);
        let saved_consts = std::mem::replace(&mut self.consts, consts);
        let saved_types = std::mem::replace(&mut self.types, types);
        self.inlining.push(h.name.clone());
        for ((name, mutable, _), v) in h.params.iter().zip(args) {
            self.bind(name, v, *mutable);
        }
        let result = body(self, &h);
        self.inlining.pop();
        self.scopes = saved_scopes;
        self.consts = saved_consts;
        self.types = saved_types;
        result
    }

    /// A helper's constant argument, folded without leaving its literal in the body (a
    /// helper compiles to the same PTX as its body written in place).
    fn generic_const(&mut self, e: &SynExpr) -> R<i64> {
        let depth = self.blocks.last().map_or(0, |b| b.len());
        let v = self.const_int(e, "a helper's constant")?;
        if let Some(block) = self.blocks.last_mut() {
            block.truncate(depth);
        }
        Ok(v)
    }

    fn helper_body(&mut self, h: &TileFn) -> R<Option<ValueId>> {
        let stmts = &h.body.stmts;
        if !h.returns {
            self.block_stmts(stmts)?;
            return Ok(None);
        }
        let (tail, rest) = self.helper_tail(h)?;
        if let SynExpr::Tuple(t) = strip_parens(tail) {
            return self.err(
                t.span(),
                format!(
                    "helper `{}` returns a tuple: take it apart with `let (a, b) = {}(..)`",
                    h.name, h.name
                ),
            );
        }
        self.block_stmts(rest)?;
        self.expr(tail).map(Some)
    }

    /// A helper's body whose result is a tuple: the values of its tail.
    fn helper_tuple_body(&mut self, h: &TileFn) -> R<Vec<ValueId>> {
        if !h.returns {
            return self.err(
                h.span,
                format!("helper `{}` returns nothing, not a tuple", h.name),
            );
        }
        let (tail, rest) = self.helper_tail(h)?;
        self.block_stmts(rest)?;
        self.tuple_values(tail)
    }

    /// A returning helper's tail expression and the statements before it.
    fn helper_tail<'h>(&mut self, h: &'h TileFn) -> R<(&'h SynExpr, &'h [SynStmt])> {
        match h.body.stmts.split_last() {
            Some((SynStmt::Expr(tail, None), rest)) => Ok((tail, rest)),
            _ => self.err(
                h.span,
                format!(
                    "helper `{}` declares a return type: end its body with the value (no `;`, no `return`)",
                    h.name
                ),
            ),
        }
    }

    fn prefetch(&mut self, c: &syn::ExprCall) -> R<()> {
        let args: Vec<&SynExpr> = c.args.iter().collect();
        self.arity("prefetch", &args, 1, 2, c.span())?;
        let ptr = self.expr(args[0])?;
        let mask = match args.get(1) {
            Some(m) => Some(self.expr(m)?),
            None => None,
        };
        let loc = self.loc(c.span());
        self.push_stmt(Stmt::Prefetch { ptr, mask, loc });
        Ok(())
    }

    /// `signal_flag(ptr, value)` / `wait_flag_at_least(ptr, value)`.
    fn flag(&mut self, c: &syn::ExprCall) -> R<()> {
        let name = call_name(&c.func).unwrap_or_default();
        let args: Vec<&SynExpr> = c.args.iter().collect();
        self.arity(&name, &args, 2, 2, c.span())?;
        // Every thread of every program takes part (a barrier orders the program's
        // accesses around the flag): inside a branch or loop some could skip it.
        if self.blocks.len() > 1 {
            return self.err(
                c.span(),
                format!("`{name}` must be at the top level of the kernel body"),
            );
        }
        let ptr = self.expr(args[0])?;
        let value = self.expr(args[1])?;
        let loc = self.loc(c.span());
        let op = if name == "signal_flag" {
            FlagOp::Signal
        } else {
            FlagOp::WaitAtLeast
        };
        self.push_stmt(Stmt::Flag {
            op,
            ptr,
            value,
            loc,
        });
        Ok(())
    }

    fn prefetch_range(&mut self, c: &syn::ExprCall) -> R<()> {
        let args: Vec<&SynExpr> = c.args.iter().collect();
        self.arity("prefetch_range", &args, 2, 2, c.span())?;
        let ptr = self.expr(args[0])?;
        let count = self.expr(args[1])?;
        let loc = self.loc(c.span());
        self.push_stmt(Stmt::PrefetchRange { ptr, count, loc });
        Ok(())
    }

    fn store(&mut self, c: &syn::ExprCall) -> R<()> {
        let args: Vec<&SynExpr> = c.args.iter().collect();
        self.arity("store", &args, 2, 3, c.span())?;
        let ptr = self.expr(args[0])?;
        let value = self.expr(args[1])?;
        let mask = match args.get(2) {
            Some(m) => Some(self.expr(m)?),
            None => None,
        };
        let loc = self.loc(c.span());
        self.push_stmt(Stmt::Store {
            ptr,
            value,
            mask,
            loc,
        });
        Ok(())
    }
}

enum Op2 {
    Arith(BinaryOp),
    Cmp(CmpOp),
}

fn bin_op(op: &BinOp) -> Option<Op2> {
    use Op2::*;
    Some(match op {
        BinOp::Add(_) => Arith(BinaryOp::Add),
        BinOp::Sub(_) => Arith(BinaryOp::Sub),
        BinOp::Mul(_) => Arith(BinaryOp::Mul),
        BinOp::Div(_) => Arith(BinaryOp::Div),
        BinOp::Rem(_) => Arith(BinaryOp::Rem),
        BinOp::And(_) | BinOp::BitAnd(_) => Arith(BinaryOp::And),
        BinOp::Or(_) | BinOp::BitOr(_) => Arith(BinaryOp::Or),
        BinOp::BitXor(_) => Arith(BinaryOp::Xor),
        BinOp::Shl(_) => Arith(BinaryOp::Shl),
        BinOp::Shr(_) => Arith(BinaryOp::Shr),
        BinOp::Eq(_) => Cmp(CmpOp::Eq),
        BinOp::Ne(_) => Cmp(CmpOp::Ne),
        BinOp::Lt(_) => Cmp(CmpOp::Lt),
        BinOp::Le(_) => Cmp(CmpOp::Le),
        BinOp::Gt(_) => Cmp(CmpOp::Gt),
        BinOp::Ge(_) => Cmp(CmpOp::Ge),
        _ => return None,
    })
}

fn compound_op(op: &BinOp) -> Option<BinaryOp> {
    Some(match op {
        BinOp::AddAssign(_) => BinaryOp::Add,
        BinOp::SubAssign(_) => BinaryOp::Sub,
        BinOp::MulAssign(_) => BinaryOp::Mul,
        BinOp::DivAssign(_) => BinaryOp::Div,
        BinOp::RemAssign(_) => BinaryOp::Rem,
        BinOp::BitAndAssign(_) => BinaryOp::And,
        BinOp::BitOrAssign(_) => BinaryOp::Or,
        BinOp::BitXorAssign(_) => BinaryOp::Xor,
        BinOp::ShlAssign(_) => BinaryOp::Shl,
        BinOp::ShrAssign(_) => BinaryOp::Shr,
        _ => return None,
    })
}

/// Folds arithmetic on two literals of the same kind (constants like `BLOCK * 2`).
fn fold_binary(op: BinaryOp, a: Literal, b: Literal) -> Option<Literal> {
    use BinaryOp::*;
    match (a, b) {
        (Literal::Int(x, dx), Literal::Int(y, dy)) => {
            let d = dx.or(dy);
            let v = match op {
                Add => x.wrapping_add(y),
                Sub => x.wrapping_sub(y),
                Mul => x.wrapping_mul(y),
                Div if y != 0 => x.wrapping_div(y),
                Rem if y != 0 => x.wrapping_rem(y),
                And => x & y,
                Or => x | y,
                Xor => x ^ y,
                Shl if (0..63).contains(&y) => x << y,
                Shr if (0..63).contains(&y) => x >> y,
                Max => x.max(y),
                Min => x.min(y),
                _ => return None,
            };
            // Typed constants keep the typed semantics to inference (wrapping width).
            if dx.is_some() && dy.is_some() && dx != dy {
                return None;
            }
            if d.is_some() {
                return None;
            }
            Some(Literal::Int(v, d))
        }
        (Literal::Float(x, None), Literal::Float(y, None)) => Some(Literal::Float(
            match op {
                Add => x + y,
                Sub => x - y,
                Mul => x * y,
                Div => x / y,
                _ => return None,
            },
            None,
        )),
        // Conditions on constants (`(RESIDUAL == 1) & (BLOCK_N == 16)`) stay constant, so
        // an `if` on them is decided at compile time.
        (Literal::Bool(x), Literal::Bool(y)) => Some(Literal::Bool(match op {
            And => x & y,
            Or => x | y,
            Xor => x ^ y,
            _ => return None,
        })),
        _ => None,
    }
}

/// `f32::INFINITY`, `f32::NEG_INFINITY`, `f32::MAX`, `f32::MIN`, `i32::MAX`, ...
fn path_constant(path: &syn::Path) -> Option<Literal> {
    if path.segments.len() != 2 {
        return None;
    }
    let ty = DType::from_name(&path.segments[0].ident.to_string())?;
    let name = path.segments[1].ident.to_string();
    Some(match (ty, name.as_str()) {
        (DType::F32, "INFINITY") => Literal::Float(f64::INFINITY, Some(ty)),
        (DType::F32, "NEG_INFINITY") => Literal::Float(f64::NEG_INFINITY, Some(ty)),
        (DType::F32, "NAN") => Literal::Float(f64::NAN, Some(ty)),
        (DType::F32, "MAX") => Literal::Float(f32::MAX as f64, Some(ty)),
        (DType::F32, "MIN") => Literal::Float(f32::MIN as f64, Some(ty)),
        (DType::I32, "MAX") => Literal::Int(i32::MAX as i64, Some(ty)),
        (DType::I32, "MIN") => Literal::Int(i32::MIN as i64, Some(ty)),
        (DType::U32, "MAX") => Literal::Int(u32::MAX as i64, Some(ty)),
        (DType::I64, "MAX") => Literal::Int(i64::MAX, Some(ty)),
        (DType::I64, "MIN") => Literal::Int(i64::MIN, Some(ty)),
        _ => return None,
    })
}

fn strip_parens(e: &SynExpr) -> &SynExpr {
    match e {
        SynExpr::Paren(p) => strip_parens(&p.expr),
        SynExpr::Group(g) => strip_parens(&g.expr),
        other => other,
    }
}

fn call_name(func: &SynExpr) -> Option<String> {
    match func {
        SynExpr::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()),
        _ => None,
    }
}

fn call_turbofish(func: &SynExpr) -> Option<syn::Type> {
    let SynExpr::Path(p) = func else { return None };
    let seg = p.path.segments.last()?;
    let syn::PathArguments::AngleBracketed(args) = &seg.arguments else {
        return None;
    };
    match args.args.first()? {
        syn::GenericArgument::Type(t) => Some(t.clone()),
        _ => None,
    }
}

/// Names assigned (`x = ..`, `(x, y) = ..`, `x += ..`) anywhere in a block.
#[derive(Default)]
struct AssignedNames {
    names: HashSet<String>,
}

impl AssignedNames {
    fn target(&mut self, e: &SynExpr) {
        match strip_parens(e) {
            SynExpr::Path(p) => {
                if let Some(id) = p.path.get_ident() {
                    self.names.insert(id.to_string());
                }
            }
            SynExpr::Tuple(t) => t.elems.iter().for_each(|e| self.target(e)),
            _ => {}
        }
    }
}

impl<'ast> Visit<'ast> for AssignedNames {
    fn visit_expr_assign(&mut self, a: &'ast syn::ExprAssign) {
        self.target(&a.left);
        syn::visit::visit_expr_assign(self, a);
    }

    fn visit_expr_binary(&mut self, b: &'ast syn::ExprBinary) {
        if compound_op(&b.op).is_some() {
            if let SynExpr::Path(p) = &*b.left {
                if let Some(id) = p.path.get_ident() {
                    self.names.insert(id.to_string());
                }
            }
        }
        syn::visit::visit_expr_binary(self, b);
    }
}
