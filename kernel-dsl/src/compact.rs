//! Dead values out of the typed IR, and the arena renumbered (naga's `compact`).
//!
//! A value is needed when a store, an atomic, a prefetch, a flag, a kernel-ordering
//! statement, a loop's or branch's needed result, or the control flow around any of these
//! uses it, directly or through other needed values. Everything else goes: its `let`,
//! the loop-carried values and `if` merges nothing reads, and loops and branches left with
//! no work. Loads count as pure, as in Triton: a load whose value nothing uses is not made.
//!
//! Without this, whatever a kernel computes and drops still reaches the backend. Most of
//! it `ptxas` would remove again, but not reductions, whose `shfl.sync` and `bar.sync` it
//! keeps: a `#[tile_fn]` helper that takes more tiles than one call uses left their
//! reductions in the PTX (kernel-dsl/tests/language.rs,
//! `unused_helper_arguments_leave_no_code`). The interpreter runs the same pruned kernel,
//! so both backends agree on what runs.
//!
//! `while` loops stay even with nothing needed inside, since whether they end is part of
//! the program.

use crate::ir::{Block, Carried, Def, Kernel, Stmt, Value, ValueId, ViewLoad};

/// Removes the values of `kernel` that nothing needs, and renumbers the arena so that no
/// later pass sees them.
pub fn compact(mut kernel: Kernel) -> Kernel {
    let mut live = Live {
        of: vec![false; kernel.values.len()],
        changed: true,
    };
    // Loops carry values around, so a use late in a body can make an earlier value
    // needed: repeat until nothing changes.
    while live.changed {
        live.changed = false;
        mark_block(&kernel, &kernel.body, &mut live);
        for view in &kernel.view_loads {
            if live.is(view.load) {
                live.mark(view.origin[0]);
                live.mark(view.origin[1]);
            }
        }
    }
    let mut body = kernel.body.clone();
    prune_block(&mut body, &live);
    match renumbered(&kernel, body) {
        Some((values, body, view_loads)) => {
            kernel.values = values;
            kernel.body = body;
            kernel.view_loads = view_loads;
        }
        None => debug_assert!(false, "`{}`: a kept value uses a pruned one", kernel.name),
    }
    kernel
}

/// Which values are needed so far.
struct Live {
    of: Vec<bool>,
    changed: bool,
}

impl Live {
    fn is(&self, v: ValueId) -> bool {
        self.of[v.index()]
    }

    fn mark(&mut self, v: ValueId) {
        if !self.of[v.index()] {
            self.of[v.index()] = true;
            self.changed = true;
        }
    }

    fn mark_all(&mut self, vs: impl IntoIterator<Item = ValueId>) {
        for v in vs {
            self.mark(v);
        }
    }
}

/// Marks what the statements of `b` need; returns whether any of them has an effect
/// (then the control flow around them is needed too).
fn mark_block(k: &Kernel, b: &Block, live: &mut Live) -> bool {
    let mut effect = false;
    for stmt in &b.stmts {
        effect |= mark_stmt(k, stmt, live);
    }
    effect
}

fn mark_stmt(k: &Kernel, stmt: &Stmt, live: &mut Live) -> bool {
    match stmt {
        Stmt::Let(v) => {
            let Def::Expr(e) = &k.value(*v).def else {
                return false;
            };
            if e.has_side_effects() {
                live.mark(*v);
            }
            if live.is(*v) {
                live.mark_all(e.operands());
            }
            e.has_side_effects()
        }
        Stmt::Store {
            ptr, value, mask, ..
        } => {
            live.mark_all([*ptr, *value]);
            live.mark_all(*mask);
            true
        }
        Stmt::Prefetch { ptr, mask, .. } => {
            live.mark(*ptr);
            live.mark_all(*mask);
            true
        }
        Stmt::PrefetchRange { ptr, count, .. } => {
            live.mark_all([*ptr, *count]);
            true
        }
        Stmt::Flag { ptr, value, .. } => {
            live.mark_all([*ptr, *value]);
            true
        }
        Stmt::WaitPriorKernels { .. } | Stmt::LaunchDependents { .. } => true,
        Stmt::For {
            start,
            end,
            step,
            carried,
            body,
            ..
        } => {
            let effect = mark_block(k, body, live);
            let mut needed = effect;
            for c in carried {
                if needed_carry(c, live) {
                    needed = true;
                    live.mark_all([c.init, c.next]);
                }
            }
            if needed {
                live.mark_all([*start, *end, *step]);
            }
            effect
        }
        Stmt::While {
            cond_body,
            cond,
            carried,
            body,
            ..
        } => {
            mark_block(k, cond_body, live);
            mark_block(k, body, live);
            live.mark(*cond);
            for c in carried {
                if needed_carry(c, live) {
                    live.mark_all([c.init, c.next]);
                }
            }
            true
        }
        Stmt::If {
            cond,
            then_body,
            else_body,
            merges,
            ..
        } => {
            let effect = mark_block(k, then_body, live) | mark_block(k, else_body, live);
            let mut needed = effect;
            for m in merges {
                if live.is(m.result) {
                    needed = true;
                    live.mark_all([m.then_value, m.else_value]);
                }
            }
            if needed {
                live.mark(*cond);
            }
            effect
        }
    }
}

/// Whether a loop-carried value is read, inside the loop or after it.
fn needed_carry(c: &Carried, live: &Live) -> bool {
    live.is(c.param) || live.is(c.result)
}

/// Removes from `b` what nothing needs (values still numbered as before).
fn prune_block(b: &mut Block, live: &Live) {
    b.stmts.retain_mut(|stmt| match stmt {
        Stmt::Let(v) => live.is(*v),
        Stmt::For { carried, body, .. } => {
            prune_block(body, live);
            carried.retain(|c| needed_carry(c, live));
            !body.stmts.is_empty() || !carried.is_empty()
        }
        Stmt::While {
            cond_body,
            carried,
            body,
            ..
        } => {
            prune_block(cond_body, live);
            prune_block(body, live);
            carried.retain(|c| needed_carry(c, live));
            true
        }
        Stmt::If {
            then_body,
            else_body,
            merges,
            ..
        } => {
            prune_block(then_body, live);
            prune_block(else_body, live);
            merges.retain(|m| live.is(m.result));
            !then_body.stmts.is_empty() || !else_body.stmts.is_empty() || !merges.is_empty()
        }
        _ => true,
    });
}

/// The values `b` defines, in program order.
fn defined(b: &Block, out: &mut Vec<ValueId>) {
    b.visit(&mut |stmt| match stmt {
        Stmt::Let(v) => out.push(*v),
        Stmt::For { index, carried, .. } => {
            out.push(*index);
            out.extend(carried.iter().flat_map(|c| [c.param, c.result]));
        }
        Stmt::While { carried, .. } => {
            out.extend(carried.iter().flat_map(|c| [c.param, c.result]));
        }
        Stmt::If { merges, .. } => out.extend(merges.iter().map(|m| m.result)),
        _ => {}
    });
}

/// The arena of the values `body` defines, in their old order, with `body` and `k`'s
/// view loads renumbered to it; `None` if something refers to a value that is not
/// defined there.
fn renumbered(k: &Kernel, mut body: Block) -> Option<(Vec<Value>, Block, Vec<ViewLoad>)> {
    let mut kept = Vec::new();
    defined(&body, &mut kept);
    let mut new_id: Vec<Option<ValueId>> = vec![None; k.values.len()];
    kept.sort_unstable();
    kept.dedup();
    for (i, v) in kept.iter().enumerate() {
        new_id[v.index()] = Some(ValueId(i as u32));
    }
    let map = |v: &mut ValueId| -> Option<()> {
        *v = new_id[v.index()]?;
        Some(())
    };
    let mut values = Vec::with_capacity(kept.len());
    for v in &kept {
        let mut value = k.value(*v).clone();
        match &mut value.def {
            Def::Expr(e) => {
                for o in e.operands_mut() {
                    map(o)?;
                }
            }
            Def::LoopIndex => {}
            Def::Carried { init } | Def::LoopResult { init } => map(init)?,
            Def::BranchResult { then_value } => map(then_value)?,
        }
        values.push(value);
    }
    let mut all_kept = true;
    body.for_each_value_mut(&mut |v| match new_id[v.index()] {
        Some(new) => *v = new,
        None => all_kept = false,
    });
    if !all_kept {
        return None;
    }
    let view_loads = k
        .view_loads
        .iter()
        .filter(|view| new_id[view.load.index()].is_some())
        .map(|view| {
            let mut view = *view;
            map(&mut view.load)?;
            for o in &mut view.origin {
                map(o)?;
            }
            Some(view)
        })
        .collect::<Option<Vec<ViewLoad>>>()?;
    Some((values, body, view_loads))
}

#[cfg(test)]
mod tests {
    use crate::ir::{Def, Expr, ReduceOp, Specialization, Stmt};

    fn compiled(src: &str, consts: &[(&str, i64)]) -> crate::ir::Kernel {
        let spec = Specialization {
            consts: consts.iter().map(|(n, v)| (n.to_string(), *v)).collect(),
            num_warps: 4,
            num_stages: None,
        };
        crate::compile_source(src, &spec).unwrap_or_else(|e| panic!("{e}"))
    }

    fn reductions(k: &crate::ir::Kernel) -> usize {
        k.values
            .iter()
            .filter(|v| matches!(v.def, Def::Expr(Expr::Reduce { .. })))
            .count()
    }

    fn lets(k: &crate::ir::Kernel) -> usize {
        let mut n = 0;
        k.body
            .visit(&mut |s| n += usize::from(matches!(s, Stmt::Let(_))));
        n
    }

    #[test]
    fn an_unused_reduction_and_its_loads_go() {
        let k = compiled(
            r#"
            #[kernel(B = [64])]
            fn f<const B: usize>(x: Ptr<f32>, y: Ptr<f32>, out: Ptr<f32>) {
                let i = arange(0, B);
                let a = load(x + i);
                let unused = load(y + i).max(0);
                store(out + i, a);
            }
            "#,
            &[("B", 64)],
        );
        assert_eq!(reductions(&k), 0);
        let loads = k
            .values
            .iter()
            .filter(|v| matches!(v.def, Def::Expr(Expr::Load { .. })))
            .count();
        assert_eq!(loads, 1, "the load of `y` feeds nothing");
        // Every value left is defined by a statement of the body, numbered densely.
        assert_eq!(lets(&k), k.values.len());
    }

    #[test]
    fn a_loop_carried_value_that_nothing_reads_goes_with_its_loop() {
        let k = compiled(
            r#"
            #[kernel(B = [64])]
            fn f<const B: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
                let i = arange(0, B);
                let mut kept = zeros::<f32>([B]);
                let mut dropped = zeros::<f32>([B]);
                for k in 0..n {
                    kept = kept + load(x + k * B + i);
                    dropped = dropped + load(x + k * B + i).sum(0);
                }
                let mut never = 0.0f32;
                for k in 0..n {
                    never = never + load(x + k);
                }
                store(out + i, kept);
            }
            "#,
            &[("B", 64)],
        );
        let mut loops = Vec::new();
        k.body.visit(&mut |s| {
            if let Stmt::For { carried, .. } = s {
                loops.push(carried.len());
            }
        });
        assert_eq!(loops, [1], "one loop left, carrying `kept` only");
        assert_eq!(reductions(&k), 0);
    }

    #[test]
    fn what_a_store_a_branch_or_an_atomic_needs_stays() {
        let src = r#"
            #[kernel(B = [64])]
            fn f<const B: usize>(x: Ptr<f32>, out: Ptr<f32>, total: Ptr<f32>, n: i32) {
                let i = arange(0, B);
                let mut acc = 0.0f32;
                for k in 0..n {
                    acc = acc + load(x + k * B + i).sum(0);
                }
                let mut v = acc;
                if n > 4 {
                    v = acc * 2.0;
                } else {
                    v = -acc;
                }
                atomic_add(total, v);
                store(out + i, load(x + i).max(0) + zeros::<f32>([B]));
            }
        "#;
        let k = compiled(src, &[("B", 64)]);
        let kinds: Vec<ReduceOp> = k
            .values
            .iter()
            .filter_map(|v| match v.def {
                Def::Expr(Expr::Reduce { op, .. }) => Some(op),
                _ => None,
            })
            .collect();
        assert_eq!(kinds, [ReduceOp::Sum, ReduceOp::Max]);
        let mut merges = 0;
        k.body.visit(&mut |s| {
            if let Stmt::If { merges: m, .. } = s {
                merges += m.len();
            }
        });
        assert_eq!(merges, 1);
    }

    #[test]
    fn prefetches_flags_and_launch_ordering_keep_what_they_name() {
        let k = compiled(
            r#"
            #[kernel(B = [64])]
            fn f<const B: usize>(x: Ptr<f32>, flag: Ptr<i32>, n: i32) {
                let i = arange(0, B);
                let unused = load(x + i).sum(0);
                prefetch(x + B + i, i < n);
                prefetch_range(x + 2 * B, n);
                wait_for_prior_kernels();
                wait_flag_at_least(flag, n + 1);
                launch_dependents();
                signal_flag(flag + 1, n * 2);
            }
            "#,
            &[("B", 64)],
        );
        let mut kinds = Vec::new();
        k.body.visit(&mut |s| match s {
            Stmt::Let(_) => {}
            other => kinds.push(std::mem::discriminant(other)),
        });
        assert_eq!(kinds.len(), 6, "every effect stays");
        assert_eq!(reductions(&k), 0);
        assert!(
            !k.values
                .iter()
                .any(|v| matches!(v.def, Def::Expr(Expr::Load { .. }))),
            "the only load fed the unused sum"
        );
    }

    #[test]
    fn a_branch_with_only_unused_values_goes_and_a_while_loop_stays() {
        let k = compiled(
            r#"
            #[kernel(B = [64])]
            fn f<const B: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
                let i = arange(0, B);
                let mut unused = 0.0f32;
                if n > 0 {
                    unused = load(x + i).sum(0);
                }
                let mut j = 0;
                while j < n {
                    j = j + 1;
                }
                store(out + i, load(x + i));
            }
            "#,
            &[("B", 64)],
        );
        let (mut ifs, mut whiles) = (0, 0);
        k.body.visit(&mut |s| match s {
            Stmt::If { .. } => ifs += 1,
            Stmt::While { .. } => whiles += 1,
            _ => {}
        });
        assert_eq!((ifs, whiles), (0, 1));
        assert_eq!(reductions(&k), 0);
    }
}
