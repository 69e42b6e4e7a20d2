//! Software pipelining of `dot` operand loads (`num_stages`), the way Triton pipelines
//! `tl.dot` loops: in a `for` loop whose body loads both operands of a tensor-core `dot`
//! (and uses the loaded tiles for nothing else), the loads become `cp.async` copies
//! straight into a ring of `num_stages` shared-memory buffers, issued `num_stages - 1`
//! iterations ahead (`cp.async.commit_group` / `wait_group`); masked-off elements are
//! zero-filled (source size 0). The `dot` then reads its operands from the ring with
//! `ldmatrix`, behind one barrier per iteration.
//!
//! The pointers and masks of future iterations are computed by re-emitting the part of
//! the body they depend on (pure expressions of the loop index, of loop-carried values
//! and of values from before the loop) with the index and those carried values bound to
//! registers that run ahead: Triton's tutorial pattern, pointer tiles advanced by
//! `+= BLOCK_K * stride` and masks on `k`, and the index-based form both qualify.
//! Anything else (an operand that is computed, cast or used twice, a load with a
//! non-zero `other`, a loop containing another loop, loads narrower than 4 bytes a
//! thread) keeps the plain path: registers, then swizzled stores before each `dot`.

use std::collections::{HashMap, HashSet};

use super::dot::Operand;
use super::emit::{Emitter, Res};
use super::regs::{int_ty, rk, Rk};
use super::{Access, AccessKind};
use crate::ir::{Carried, DType, Def, Expr, Literal, Stmt, ValueId};

/// One operand load moved into the ring.
#[derive(Clone, Debug)]
pub struct RingLoad {
    /// The load.
    pub value: ValueId,
    ptr: ValueId,
    mask: Option<ValueId>,
    /// Byte offset of the operand inside one stage.
    pub at: u32,
    /// Elements per `cp.async`.
    width: usize,
    /// How the `dot` reads it (and so how it is staged).
    op: Operand,
}

/// How one loop is pipelined.
#[derive(Clone, Debug)]
pub struct Plan {
    loads: Vec<RingLoad>,
    /// Body values the pointers and masks need, in program order.
    slice: Vec<ValueId>,
    /// Carried values the pointers and masks depend on.
    carried: Vec<Carried>,
    stage_bytes: u32,
    /// A `wgmma` reads the ring: the copies are fenced for the async proxy.
    wgmma: bool,
    /// Buffers in the ring.
    buffers: u32,
    /// Iterations whose copies are in flight ahead of the one the body reads.
    lead: u32,
    /// The `dot` whose `wgmma` group is left in flight at the end of an iteration
    /// (`wgmma.wait_group 1`: the next iteration's barrier, copies and address
    /// arithmetic overlap it), if any: an `acc = dot(a, b, acc)` on the `wgmma` path
    /// whose accumulator is a carried value used by nothing else in the loop. It
    /// accumulates in place in the carried registers; the loop's exit waits for it.
    /// The ring then has a buffer more than `num_stages` (where shared memory allows),
    /// since the stage the running group reads is not overwritten until the group after
    /// it has been issued: copies run `buffers - 2` iterations ahead.
    async_dot: Option<ValueId>,
    /// The copies are issued after the running `dot`'s wait, behind a second barrier,
    /// into the stage the group before it read (Triton's order): the ring then needs no
    /// buffer beyond `num_stages` and the copies run `num_stages - 1` iterations ahead.
    /// Chosen where the extra buffer does not fit in shared memory.
    late: bool,
}

/// Registers of a pipelined loop while its body is emitted.
#[derive(Clone, Debug)]
pub struct Ring {
    plan: Plan,
    /// The loop index of the iteration the next copies are for.
    ahead: String,
    /// The carried values of that iteration.
    shadow: Vec<Vec<String>>,
    /// Shared address of the stage the body reads.
    pub read: String,
    /// Shared address of the stage the next copies go to.
    write: String,
    ring: String,
    /// The loop's index, end and step: the copies' iteration, bound and stride.
    index: ValueId,
    end: String,
    step: String,
}

fn is_zero(k: &crate::ir::Kernel, v: ValueId) -> bool {
    match &k.value(v).def {
        Def::Expr(
            Expr::Splat { value, .. } | Expr::Cast { value, .. } | Expr::Bitcast { value, .. },
        ) => is_zero(k, *value),
        Def::Expr(Expr::Literal(Literal::Float(x, _))) => x.to_bits() == 0,
        Def::Expr(Expr::Literal(Literal::Int(0, _))) => true,
        _ => false,
    }
}

impl Emitter<'_> {
    /// Uses of every value anywhere in the kernel.
    fn use_counts(&self) -> Vec<usize> {
        let k = self.k;
        let mut n = vec![0; k.values.len()];
        for v in &k.values {
            if let Def::Expr(e) = &v.def {
                for o in e.operands() {
                    n[o.index()] += 1;
                }
            }
        }
        k.body.visit(&mut |s| {
            let mut add = |v: &ValueId| n[v.index()] += 1;
            match s {
                Stmt::Store {
                    ptr, value, mask, ..
                } => {
                    add(ptr);
                    add(value);
                    mask.iter().for_each(&mut add);
                }
                Stmt::Prefetch { ptr, mask, .. } => {
                    add(ptr);
                    mask.iter().for_each(&mut add);
                }
                Stmt::PrefetchRange { ptr, count, .. } => {
                    add(ptr);
                    add(count);
                }
                Stmt::Flag { ptr, value, .. } => {
                    add(ptr);
                    add(value);
                }
                Stmt::For {
                    start,
                    end,
                    step,
                    carried,
                    ..
                } => {
                    add(start);
                    add(end);
                    add(step);
                    for c in carried {
                        add(&c.init);
                        add(&c.next);
                    }
                }
                Stmt::If { cond, merges, .. } => {
                    add(cond);
                    for m in merges {
                        add(&m.then_value);
                        add(&m.else_value);
                    }
                }
                _ => {}
            }
        });
        n
    }

    /// Whether (and how) a loop's `dot` operand loads are pipelined.
    pub fn pipeline_plan(
        &mut self,
        index: ValueId,
        carried: &[Carried],
        body: &crate::ir::Block,
    ) -> Option<Plan> {
        let k = self.k;
        if k.num_stages < 2 || body.stmts.iter().any(|s| matches!(s, Stmt::For { .. })) {
            return None;
        }
        let top: HashMap<ValueId, usize> = body
            .stmts
            .iter()
            .enumerate()
            .filter_map(|(i, s)| match s {
                Stmt::Let(v) => Some((*v, i)),
                _ => None,
            })
            .collect();
        let uses = self.use_counts();
        let mut loads = Vec::new();
        let mut at = 0u32;
        let mut wgmma = false;
        for s in &body.stmts {
            let Stmt::Let(d) = s else { continue };
            let Def::Expr(Expr::Dot { a, b, .. }) = &k.value(*d).def else {
                continue;
            };
            let Some(how) = self.dot_operands(*d).filter(|_| a != b) else {
                continue;
            };
            let mut ops = Vec::new();
            for (x, op) in [(*a, how[0]), (*b, how[1])] {
                let Def::Expr(Expr::Load { ptr, mask, other }) = &k.value(x).def else {
                    break;
                };
                if !top.contains_key(&x)
                    || uses[x.index()] != 1
                    || other.is_some_and(|o| !is_zero(k, o))
                {
                    break;
                }
                let l = self.layout_of(x);
                let dt = k.ty(x).dtype()?;
                let width = self.vec_width(*ptr, *mask, &l, dt);
                if width < 2 {
                    break;
                }
                let bytes = (k.ty(x).shape.iter().product::<usize>() * 2) as u32;
                ops.push((x, *ptr, *mask, bytes, width, op));
            }
            if ops.len() == 2 {
                for (value, ptr, mask, bytes, width, op) in ops {
                    // `wgmma` reads swizzled tiles from 1024-byte aligned addresses.
                    let align = if op == Operand::Mma { 128 } else { 1024 };
                    wgmma |= op != Operand::Mma;
                    at = at.next_multiple_of(align);
                    loads.push(RingLoad {
                        value,
                        ptr,
                        mask,
                        at,
                        width,
                        op,
                    });
                    at += bytes.next_multiple_of(128);
                }
            }
        }
        if loads.is_empty() {
            return None;
        }
        // The slice: body values, carried values and the index the pointers and masks
        // (and the carried values' next values) depend on.
        let params: HashMap<ValueId, &Carried> = carried.iter().map(|c| (c.param, c)).collect();
        let mut need: HashSet<ValueId> = HashSet::new();
        let mut used_params: Vec<Carried> = Vec::new();
        let mut todo: Vec<ValueId> = loads
            .iter()
            .flat_map(|l| std::iter::once(l.ptr).chain(l.mask))
            .collect();
        while let Some(v) = todo.pop() {
            if v == index || !need.insert(v) {
                continue;
            }
            if let Some(c) = params.get(&v) {
                if self.rk_of(v) == Rk::H {
                    return None;
                }
                used_params.push((*c).clone());
                todo.push(c.next);
                continue;
            }
            if !top.contains_key(&v) {
                // Defined before the loop: available. Inside a branch of the body: refuse.
                if self.defined_in(body, v) {
                    return None;
                }
                continue;
            }
            let Def::Expr(e) = &k.value(v).def else {
                return None;
            };
            if matches!(
                e,
                Expr::Load { .. }
                    | Expr::Atomic { .. }
                    | Expr::Dot { .. }
                    | Expr::ClusterGather { .. }
                    | Expr::GlobalTimer
                    | Expr::SmId
            ) {
                return None;
            }
            todo.extend(e.operands());
        }
        // The `wgmma` dot that may run across iterations.
        let async_dot = loads.first().filter(|_| wgmma).and_then(|ld| {
            let d = k
                .values
                .iter()
                .enumerate()
                .find_map(|(i, v)| match &v.def {
                    Def::Expr(Expr::Dot {
                        a, acc: Some(acc), ..
                    }) if *a == ld.value => Some((ValueId(i as u32), *acc)),
                    _ => None,
                })?;
            let (d, acc) = d;
            carried
                .iter()
                .any(|c| {
                    c.param == acc && c.next == d && uses[d.index()] == 1 && uses[acc.index()] == 1
                })
                .then_some(d)
        });
        let stages = k.num_stages;
        let limit = self.target.max_shared_bytes() - 16 * 1024;
        let stage_bytes = if wgmma { at.next_multiple_of(1024) } else { at };
        let buffers = match async_dot {
            Some(_) if (stages + 1) * stage_bytes <= limit => stages + 1,
            _ => stages,
        };
        let late = async_dot.is_some() && buffers == stages;
        let lead = if async_dot.is_some() && !late {
            buffers - 2
        } else {
            buffers - 1
        };
        let async_dot = async_dot.filter(|_| lead >= 1);
        let lead = lead.max(1);
        let mut slice: Vec<ValueId> = need
            .iter()
            .copied()
            .filter(|v| top.contains_key(v))
            .collect();
        slice.sort_by_key(|v| top[v]);
        used_params.sort_by_key(|c| c.param);
        used_params.dedup_by_key(|c| c.param);
        Some(Plan {
            loads,
            slice,
            carried: used_params,
            stage_bytes,
            wgmma,
            buffers,
            lead,
            async_dot,
            late,
        })
    }

    /// Whether `v` is defined somewhere inside `b` (nested blocks included).
    fn defined_in(&self, b: &crate::ir::Block, v: ValueId) -> bool {
        let mut found = false;
        b.visit(&mut |s| match s {
            Stmt::Let(x) => found |= *x == v,
            Stmt::For { index, carried, .. } => {
                found |= *index == v || carried.iter().any(|c| c.param == v || c.result == v)
            }
            Stmt::If { merges, .. } => found |= merges.iter().any(|m| m.result == v),
            _ => {}
        });
        found
    }

    /// Before the loop: the ring's registers, and the copies for the first
    /// `num_stages - 1` iterations. `params` are the carried values' registers (holding
    /// their entry values).
    pub fn pipeline_start(
        &mut self,
        plan: Plan,
        index: ValueId,
        start: &str,
        end: &str,
        step: &str,
        params: &HashMap<ValueId, Vec<String>>,
    ) -> Res<Ring> {
        let ring = self.ring_base();
        self.ring_bytes = self.ring_bytes.max(plan.buffers * plan.stage_bytes);
        let lead = plan.lead;
        let ity = self.k.ty(index).dtype().unwrap_or(DType::I32);
        let ahead = self.reg(rk(ity));
        self.ins(format!("mov.{} {ahead}, {start}", rk(ity).bits()));
        let mut shadow = Vec::new();
        for c in &plan.carried {
            let kind = self.rk_of(c.param);
            let src = params[&c.param].clone();
            let r = self.fresh_like(kind, src.len());
            self.moves(kind, &r, &src);
            shadow.push(r);
        }
        let (read, write) = (self.reg(Rk::R), self.reg(Rk::R));
        self.ins(format!("mov.u32 {read}, {ring}"));
        self.ins(format!("mov.u32 {write}, {ring}"));
        let r = Ring {
            plan,
            ahead,
            shadow,
            read,
            write,
            ring,
            index,
            end: end.to_string(),
            step: step.to_string(),
        };
        for _ in 0..lead {
            self.pipeline_issue(&r, false)?;
        }
        Ok(r)
    }

    /// At the top of the body: waits for this iteration's copies, then issues the
    /// copies `num_stages - 1` iterations ahead into the stage the previous iteration
    /// read (in the late order, [`Plan::late`], they wait for [`Self::pipeline_late`]).
    pub fn pipeline_iteration(&mut self, r: &Ring) -> Res<()> {
        self.ins(format!("cp.async.wait_group {}", r.plan.lead - 1));
        if r.plan.wgmma {
            // `wgmma` reads shared memory through the async proxy: make this thread's
            // copies visible to it before the barrier.
            self.ins("fence.proxy.async.shared::cta");
        }
        self.ins("bar.sync 0");
        if r.plan.late {
            return Ok(());
        }
        self.pipeline_issue(r, true)
    }

    /// After the running `dot` `d` has waited for the group before it, in a ring whose
    /// copies go late ([`Plan::late`]): once every warpgroup is past that wait, the stage
    /// that group read is free, and this iteration's copies go there.
    pub fn pipeline_late(&mut self, d: ValueId) -> Res<()> {
        let Some(r) = self
            .rings
            .iter()
            .rev()
            .find(|r| r.plan.late && r.plan.async_dot == Some(d))
            .cloned()
        else {
            return Ok(());
        };
        self.ins("bar.sync 0");
        // Tiles the body has converted so far belong to this iteration; the copies are
        // for a later one, so they must not be found.
        let body_cache = self.take_scope();
        let issued = self.pipeline_issue(&r, true);
        self.restore_scope(body_cache);
        issued
    }

    /// At the end of the body: the next stage to read.
    pub fn pipeline_advance(&mut self, r: &Ring) {
        let bytes = r.plan.stage_bytes;
        let end = bytes * r.plan.buffers;
        let (t, p) = (self.reg(Rk::R), self.reg(Rk::P));
        self.ins(format!("add.u32 {}, {}, {bytes}", r.read, r.read));
        self.ins(format!("sub.u32 {t}, {}, {}", r.read, r.ring));
        self.ins(format!("setp.ge.u32 {p}, {t}, {end}"));
        self.ins(format!("@{p} mov.u32 {}, {}", r.read, r.ring));
    }

    /// After the loop: no copy is left in flight and every thread is done with the ring
    /// (a later pipelined loop reuses it).
    pub fn pipeline_end(&mut self, r: &Ring) {
        if r.plan.async_dot.is_some() {
            self.ins("wgmma.wait_group.sync.aligned 0");
        }
        self.ins("cp.async.wait_all");
        self.ins("bar.sync 0");
    }

    /// The operands of `dot` that sit in the ring: `(address register, offset)`.
    pub fn ring_operand(&self, v: ValueId) -> Option<(String, u32)> {
        self.rings.iter().rev().find_map(|r| {
            r.plan
                .loads
                .iter()
                .find(|l| l.value == v)
                .map(|l| (r.read.clone(), l.at))
        })
    }

    /// Whether `d` is the `dot` of an enclosing ring that runs across iterations
    /// (`Plan::async_dot`).
    pub fn async_dot(&self, d: ValueId) -> bool {
        self.rings.iter().any(|r| r.plan.async_dot == Some(d))
    }

    /// Whether `v` is a load the ring replaces (its `let` emits nothing).
    pub fn in_ring(&self, v: ValueId) -> bool {
        self.ring_operand(v).is_some()
    }

    /// Copies for the iteration whose index is in `r.ahead`, into stage `r.write`; then
    /// moves `ahead`, the carried values and `write` on by one iteration. `record`: list
    /// the copies among the kernel's accesses (once per load, from the loop body).
    fn pipeline_issue(&mut self, r: &Ring, record: bool) -> Res<()> {
        let (index, end, step) = (r.index, r.end.as_str(), r.step.as_str());
        let ity = self.k.ty(index).dtype().unwrap_or(DType::I32);
        let t = int_ty(ity);
        let live = self.reg(Rk::P);
        self.ins(format!("setp.lt.{t} {live}, {}, {end}", r.ahead));
        let mut bound: Vec<ValueId> = vec![index];
        bound.extend(r.plan.carried.iter().map(|c| c.param));
        bound.extend(r.plan.slice.iter().copied());
        let saved: Vec<_> = bound.iter().map(|v| self.take_regs(*v)).collect();
        self.push_scope();
        self.set_regs(index, vec![r.ahead.clone()]);
        for (c, s) in r.plan.carried.iter().zip(&r.shadow) {
            self.set_regs(c.param, s.clone());
        }
        for &v in &r.plan.slice.clone() {
            self.emit_let(v)?;
        }
        for ld in r.plan.loads.clone() {
            let l = self.layout_of(ld.value);
            let ptrs = self.tile(ld.ptr, &l)?;
            let masks = match ld.mask {
                Some(m) => Some(self.tile(m, &l)?),
                None => None,
            };
            let dt = self.k.ty(ld.value).dtype().unwrap_or(DType::BF16);
            if record {
                self.accesses.push(Access {
                    kind: AccessKind::Load,
                    ptr: ld.ptr,
                    loc: self.k.value(ld.value).loc,
                    dtype: dt,
                    width: ld.width,
                    elements: ptrs.len(),
                    narrowed: None,
                });
            }
            let c = self.coords(&l);
            let offs = l.reg_offsets();
            let (sr, sc) = (l.keep[0], l.keep[1]);
            // Oriented as `dot` reads it (the thread's run, and so each copy, lies
            // along a stored row).
            let st = super::dot::Staged::for_operand(&l, ld.op);
            let bytes = ld.width * 2;
            let cache = if bytes == 16 { "cg" } else { "ca" };
            for g in (0..ptrs.len()).step_by(ld.width) {
                let row = self.plus(&c.base[sr], offs[g][sr]);
                let col = self.plus(&c.base[sc], offs[g][sc]);
                let addr = self.staged_addr(&r.write, &st, &row, &col);
                let on = match &masks {
                    Some(m) => {
                        let p = self.reg(Rk::P);
                        self.ins(format!("and.pred {p}, {live}, {}", m[g]));
                        p
                    }
                    None => live.clone(),
                };
                let size = self.reg(Rk::R);
                self.ins(format!("selp.u32 {size}, {bytes}, 0, {on}"));
                let owner = c.owner.as_ref().map_or(String::new(), |p| format!("@{p} "));
                self.ins(format!(
                    "{owner}cp.async.{cache}.shared.global [{addr}+{}], [{}], {bytes}, {size}",
                    ld.at, ptrs[g]
                ));
            }
        }
        self.ins("cp.async.commit_group");
        // The carried values one iteration on (all read before any is overwritten).
        let mut next = Vec::new();
        for c in &r.plan.carried {
            let regs = if self.k.ty(c.param).is_scalar() {
                vec![self.scalar(c.next)]
            } else {
                let l = self.layout_of(c.param);
                self.tile(c.next, &l)?
            };
            let kind = self.rk_of(c.param);
            let tmp = self.fresh_like(kind, regs.len());
            self.moves(kind, &tmp, &regs);
            next.push((kind, tmp));
        }
        for ((kind, tmp), s) in next.iter().zip(&r.shadow) {
            self.moves(*kind, s, tmp);
        }
        self.pop_scope();
        for (v, regs) in bound.iter().zip(saved) {
            self.restore_regs(*v, regs);
        }
        self.ins(format!("add.{t} {}, {}, {step}", r.ahead, r.ahead));
        // The stage written next.
        let bytes = r.plan.stage_bytes;
        let end_off = bytes * r.plan.buffers;
        let (tt, p) = (self.reg(Rk::R), self.reg(Rk::P));
        self.ins(format!("add.u32 {}, {}, {bytes}", r.write, r.write));
        self.ins(format!("sub.u32 {tt}, {}, {}", r.write, r.ring));
        self.ins(format!("setp.ge.u32 {p}, {tt}, {end_off}"));
        self.ins(format!("@{p} mov.u32 {}, {}", r.write, r.ring));
        Ok(())
    }
}
