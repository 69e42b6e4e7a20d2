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
//!
//! A loop marked `.stages(n)` (Triton's `tl.range(.., num_stages=n)`) stages its other
//! loads the same way, without a `dot`: each thread copies its own vector groups of a
//! load (4, 8 or 16 bytes) with `cp.async` into its own slots of a stage, `n - 1`
//! iterations ahead, and the load itself becomes a read of those slots. No thread reads
//! another's slots, so the ring needs no barrier: `cp.async.wait_group` makes a thread's
//! own copies visible to it. The bytes in flight then cost shared memory instead of
//! registers (the quantized GEMVs' case: docs/perf.md, "Loads staged ahead"). Loads that
//! do not qualify (narrower than 4 bytes a group, a non-zero `other`, an address that
//! depends on another load) stay plain loads.

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
    /// Copied by the tensor-memory engine instead of `cp.async` (a descriptor's load on
    /// sm_90a whose staging is a sequence of boxes).
    tma: Option<TmaCopy>,
}

/// A load of a `.stages(n)` loop, copied ahead by the thread that reads it: group `j`
/// of a thread (the `j`-th vector of `width` elements it holds) sits at `at + (j *
/// threads + tid) * bytes` in a stage, so a warp's copies and reads are contiguous.
#[derive(Clone, Debug)]
pub struct StagedLoad {
    value: ValueId,
    ptr: ValueId,
    mask: Option<ValueId>,
    /// Byte offset of the load's slots inside one stage.
    at: u32,
    /// Elements per copy.
    width: usize,
    /// Bytes per copy: 4, 8 or 16.
    bytes: u32,
}

/// A ring load copied with `cp.async.bulk.tensor`: the boxes of one two-dimensional
/// tensor map that make up the staged operand, or, for a block inside the matrix, one
/// box of a map that sees the matrix in more dimensions (`whole`).
#[derive(Clone, Debug)]
struct TmaCopy {
    /// The two-dimensional map (a kernel parameter once the ring is emitted:
    /// `Emitter::tma_map_index`).
    map: crate::ir::TmaMap,
    /// The block's first row and column.
    origin: [ValueId; 2],
    /// Per box: its byte offset inside the staged operand, and its first row and column
    /// relative to the block's.
    boxes: Vec<(u32, u32, u32)>,
    /// Bytes of all boxes.
    bytes: u32,
    /// The one-box form, where the staging takes several two-dimensional boxes.
    whole: Option<Whole>,
}

/// The staged operand as one box of a map of up to five dimensions (A's permuted 8-row
/// blocks, B's 64-column panels). Its dimensions split rows or columns at the block's
/// granularity, so the matrix's edge along that axis is only exact in whole steps: it
/// is used for blocks that end inside the matrix along that axis (a run-time test), the
/// two-dimensional boxes for the others.
#[derive(Clone, Debug)]
struct Whole {
    /// The map.
    map: crate::ir::TmaMap,
    /// The axis whose edge decides (rows: `true`), and the block's extent along it.
    rows: bool,
    extent: u32,
}

/// How one loop is pipelined.
#[derive(Clone, Debug)]
pub struct Plan {
    loads: Vec<RingLoad>,
    /// Loads of a `.stages(n)` loop, each thread copying its own groups.
    staged: Vec<StagedLoad>,
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
    /// Some loads go through the copy engine: each stage has a full mbarrier, these
    /// bytes after the ring's start (8 a stage).
    barriers_at: Option<u32>,
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
    /// With copy-engine loads: the read stage's mbarrier, the write stage's, the phase
    /// parity the readers wait for, and each tensor map's generic address.
    barriers: Option<Barriers>,
    /// Per staged load: `tid * bytes`, the thread's first slot.
    slots: Vec<String>,
}

/// The registers of a ring's mbarriers (`Plan::barriers_at`).
#[derive(Clone, Debug)]
struct Barriers {
    read: String,
    write: String,
    phase: String,
    maps: HashMap<usize, String>,
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

/// The body's top-level `let`s and their positions.
fn top_lets(body: &crate::ir::Block) -> HashMap<ValueId, usize> {
    body.stmts
        .iter()
        .enumerate()
        .filter_map(|(i, s)| match s {
            Stmt::Let(v) => Some((*v, i)),
            _ => None,
        })
        .collect()
}

/// The body values of `need` in program order (the slice re-emitted for a later
/// iteration); `used` sorted and deduplicated by parameter.
fn ordered_slice(
    need: &HashSet<ValueId>,
    top: &HashMap<ValueId, usize>,
    used: &mut Vec<Carried>,
) -> Vec<ValueId> {
    let mut slice: Vec<ValueId> = need
        .iter()
        .copied()
        .filter(|v| top.contains_key(v))
        .collect();
    slice.sort_by_key(|v| top[v]);
    used.sort_by_key(|c| c.param);
    used.dedup_by_key(|c| c.param);
    slice
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
        stages: u32,
    ) -> Option<Plan> {
        let k = self.k;
        if stages >= 2 {
            return self.staged_plan(index, carried, body, stages);
        }
        if k.num_stages < 2 || body.stmts.iter().any(|s| matches!(s, Stmt::For { .. })) {
            return None;
        }
        let top = top_lets(body);
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
                let tma = self.tma_copy(x, &l, op);
                let width = self.vec_width(*ptr, *mask, &l, dt);
                if width < 2 && tma.is_none() {
                    break;
                }
                let bytes = (k.ty(x).shape.iter().product::<usize>() * 2) as u32;
                ops.push((x, *ptr, *mask, bytes, width, op, tma));
            }
            if ops.len() == 2 {
                for (value, ptr, mask, bytes, width, op, tma) in ops {
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
                        tma,
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
        let mut need: HashSet<ValueId> = HashSet::new();
        let mut used_params: Vec<Carried> = Vec::new();
        // (A copy-engine load needs only its block's origin.)
        let roots: Vec<ValueId> = loads
            .iter()
            .flat_map(|l| match &l.tma {
                Some(t) => t.origin.to_vec(),
                None => std::iter::once(l.ptr).chain(l.mask).collect(),
            })
            .collect();
        if !self.ahead_slice(
            roots,
            index,
            carried,
            body,
            &top,
            &mut need,
            &mut used_params,
        ) {
            return None;
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
        let tma = loads.iter().any(|l| l.tma.is_some());
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
        let slice = ordered_slice(&need, &top, &mut used_params);
        Some(Plan {
            loads,
            staged: Vec::new(),
            slice,
            carried: used_params,
            stage_bytes,
            wgmma,
            buffers,
            lead,
            async_dot,
            late,
            barriers_at: tma.then_some(buffers * stage_bytes),
        })
    }

    /// Adds to `need` the values that `roots` depend on inside the loop, and to `used`
    /// the carried values among them, so that they can be computed for a later
    /// iteration. False where they cannot: a dependence on a load, an atomic, a `dot`,
    /// a clock, a value defined inside a branch of the body, or a carried 16-bit tile.
    #[allow(clippy::too_many_arguments)]
    fn ahead_slice(
        &self,
        mut todo: Vec<ValueId>,
        index: ValueId,
        carried: &[Carried],
        body: &crate::ir::Block,
        top: &HashMap<ValueId, usize>,
        need: &mut HashSet<ValueId>,
        used: &mut Vec<Carried>,
    ) -> bool {
        let k = self.k;
        while let Some(v) = todo.pop() {
            if v == index || !need.insert(v) {
                continue;
            }
            if let Some(c) = carried.iter().find(|c| c.param == v) {
                if self.rk_of(v) == Rk::H {
                    return false;
                }
                used.push(c.clone());
                todo.push(c.next);
                continue;
            }
            if !top.contains_key(&v) {
                // Defined before the loop: available. Inside a branch of the body: refuse.
                if self.defined_in(body, v) {
                    return false;
                }
                continue;
            }
            let Def::Expr(e) = &k.value(v).def else {
                return false;
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
                return false;
            }
            todo.extend(e.operands());
        }
        true
    }

    /// The plan of a `.stages(n)` loop: every top-level load of the body whose groups
    /// are 4, 8 or 16 bytes, whose `other` is zero and whose address and mask can be
    /// computed ahead is copied by its own threads `n - 1` iterations ahead. The ring
    /// has a buffer more than `n` where shared memory allows, so a slot is refilled two
    /// iterations after it was last read.
    fn staged_plan(
        &mut self,
        index: ValueId,
        carried: &[Carried],
        body: &crate::ir::Block,
        stages: u32,
    ) -> Option<Plan> {
        let k = self.k;
        let top = top_lets(body);
        let threads = k.threads_per_program();
        let uses = self.use_counts();
        let mut need: HashSet<ValueId> = HashSet::new();
        let mut used_params: Vec<Carried> = Vec::new();
        let mut staged = Vec::new();
        let mut at = 0u32;
        for s in &body.stmts {
            let Stmt::Let(x) = s else { continue };
            let Def::Expr(Expr::Load { ptr, mask, other }) = &k.value(*x).def else {
                continue;
            };
            let ty = k.ty(*x);
            let Some(dt) = ty.dtype() else { continue };
            if ty.is_scalar()
                || dt == DType::Bool
                || uses[x.index()] == 0
                || other.is_some_and(|o| !is_zero(k, o))
            {
                continue;
            }
            let l = self.layout_of(*x);
            let width = self.vec_width(*ptr, *mask, &l, dt);
            self.narrowed = None;
            let bytes = (width * dt.size_bytes()) as u32;
            if !matches!(bytes, 4 | 8 | 16) || l.nregs() % width != 0 {
                continue;
            }
            let (mut n2, mut u2) = (need.clone(), used_params.clone());
            let roots = std::iter::once(*ptr).chain(*mask).collect();
            if !self.ahead_slice(roots, index, carried, body, &top, &mut n2, &mut u2) {
                continue;
            }
            (need, used_params) = (n2, u2);
            at = at.next_multiple_of(16);
            staged.push(StagedLoad {
                value: *x,
                ptr: *ptr,
                mask: *mask,
                at,
                width,
                bytes,
            });
            at += (l.nregs() / width) as u32 * threads * bytes;
        }
        if staged.is_empty() {
            return None;
        }
        let stage_bytes = at.next_multiple_of(128);
        let limit = self.target.max_shared_bytes() - 16 * 1024;
        let mut buffers = stages + 1;
        while buffers > 2 && buffers * stage_bytes > limit {
            buffers -= 1;
        }
        if buffers * stage_bytes > limit {
            return None;
        }
        let lead = (stages - 1).min(buffers - 1);
        let slice = ordered_slice(&need, &top, &mut used_params);
        Some(Plan {
            loads: Vec::new(),
            staged,
            slice,
            carried: used_params,
            stage_bytes,
            wgmma: false,
            buffers,
            lead,
            async_dot: None,
            late: false,
            barriers_at: None,
        })
    }

    /// A staged load's value in the iteration being emitted, read from this thread's
    /// slots of the stage the ring reads (`None`: `v` is not staged).
    pub fn staged_read(&mut self, v: ValueId) -> Res<Option<Vec<String>>> {
        let Some((read, slot, ld)) = self.rings.iter().rev().find_map(|r| {
            let i = r.plan.staged.iter().position(|l| l.value == v)?;
            Some((r.read.clone(), r.slots[i].clone(), r.plan.staged[i].clone()))
        }) else {
            return Ok(None);
        };
        let dt = self.k.ty(v).dtype().unwrap_or(DType::I32);
        let kind = rk(dt);
        let n = self.layout_of(v).nregs();
        let threads = self.k.threads_per_program();
        let base = self.reg(Rk::R);
        self.ins(format!("add.u32 {base}, {read}, {slot}"));
        let mut out = Vec::new();
        for j in 0..n / ld.width {
            let off = ld.at + j as u32 * threads * ld.bytes;
            if kind == Rk::H {
                // Halves travel as packed 32-bit words, as from a global load.
                let words: Vec<String> = (0..ld.width / 2).map(|_| self.reg(Rk::R)).collect();
                self.ins(format!(
                    "ld.shared{}.b32 {}, [{base}+{off}]",
                    Self::vsuf(words.len()),
                    Self::regs_list(&words)
                ));
                let halves: Vec<String> = (0..ld.width).map(|_| self.reg(Rk::H)).collect();
                self.unpack_halves(&words, &halves);
                out.extend(halves);
            } else {
                let ds: Vec<String> = (0..ld.width).map(|_| self.reg(kind)).collect();
                self.ins(format!(
                    "ld.shared{}.{} {}, [{base}+{off}]",
                    Self::vsuf(ld.width),
                    super::regs::mem_ty(dt),
                    Self::regs_list(&ds)
                ));
                out.extend(ds);
            }
        }
        Ok(Some(out))
    }

    /// The copies of the staged loads for the iteration `pipeline_issue` has bound.
    fn staged_issue(&mut self, r: &Ring, live: &str, record: bool) -> Res<()> {
        let threads = self.k.threads_per_program();
        for (ld, slot) in r.plan.staged.clone().iter().zip(r.slots.clone()) {
            let l = self.layout_of(ld.value);
            let ptrs = self.tile(ld.ptr, &l)?;
            let masks = match ld.mask {
                Some(m) => Some(self.tile(m, &l)?),
                None => None,
            };
            if record {
                let dtype = self.k.ty(ld.value).dtype().unwrap_or(DType::I32);
                self.accesses.push(Access {
                    kind: AccessKind::Load,
                    ptr: ld.ptr,
                    loc: self.k.value(ld.value).loc,
                    dtype,
                    width: ld.width,
                    elements: ptrs.len(),
                    narrowed: None,
                });
            }
            let base = self.reg(Rk::R);
            self.ins(format!("add.u32 {base}, {}, {slot}", r.write));
            // `.cg` (L2 only) takes 16-byte copies alone.
            let cache = if ld.bytes == 16 { "cg" } else { "ca" };
            for (j, g) in (0..ptrs.len()).step_by(ld.width).enumerate() {
                let at = ld.at + j as u32 * threads * ld.bytes;
                let Some(m) = &masks else {
                    // Unmasked: a copy past the loop's end is skipped (its stage is never
                    // read), no zero fill needed.
                    self.ins(format!(
                        "@{live} cp.async.{cache}.shared.global [{base}+{at}], [{}], {}",
                        ptrs[g], ld.bytes
                    ));
                    continue;
                };
                let on = self.reg(Rk::P);
                self.ins(format!("and.pred {on}, {live}, {}", m[g]));
                let size = self.reg(Rk::R);
                self.ins(format!("selp.u32 {size}, {}, 0, {on}", ld.bytes));
                self.ins(format!(
                    "cp.async.{cache}.shared.global [{base}+{at}], [{}], {}, {size}",
                    ptrs[g], ld.bytes
                ));
            }
        }
        Ok(())
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
        let barriers = match plan.barriers_at {
            Some(at) => {
                self.ring_bytes = self.ring_bytes.max(at + 8 * plan.buffers);
                Some(self.barriers_start(&plan, &ring, at))
            }
            None => None,
        };
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
        let mut slots = Vec::new();
        for ld in &plan.staged {
            let slot = self.reg(Rk::R);
            self.ins(format!("mul.lo.u32 {slot}, {}, {}", self.tid, ld.bytes));
            slots.push(slot);
        }
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
            barriers,
            slots,
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
        let copies = r.plan.loads.iter().any(|l| l.tma.is_none());
        if copies || !r.plan.staged.is_empty() {
            self.ins(format!("cp.async.wait_group {}", r.plan.lead - 1));
            if r.plan.wgmma {
                // `wgmma` reads shared memory through the async proxy: make this
                // thread's copies visible to it before the barrier.
                self.ins("fence.proxy.async.shared::cta");
            }
        }
        if let Some(b) = &r.barriers {
            // The copy engine's bytes for this stage have landed once its mbarrier
            // completes the phase this round of the ring waits for.
            let (wait, done) = (self.new_label("tma_wait"), self.reg(Rk::P));
            self.label(&wait);
            self.ins(format!(
                "mbarrier.try_wait.parity.shared::cta.b64 {done}, [{}], {}",
                b.read, b.phase
            ));
            self.ins(format!("@!{done} bra {wait}"));
        }
        // Without `cp.async` copies, and with the refill after the running group's
        // barrier (the late order), no thread needs the others here: each waited for
        // its stage on the mbarrier.
        // Staged loads alone need none either: each thread reads its own copies.
        if copies || (!r.plan.late && !r.plan.loads.is_empty()) {
            self.ins("bar.sync 0");
        }
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
        if let (Some(b), Some(at)) = (&r.barriers, r.plan.barriers_at) {
            // The next stage's mbarrier; past the last stage, the first one's, in the
            // next phase.
            self.ins(format!("add.u32 {}, {}, 8", b.read, b.read));
            self.ins(format!("@{p} add.u32 {}, {}, {at}", b.read, r.ring));
            self.ins(format!("@{p} xor.b32 {}, {}, 1", b.phase, b.phase));
        }
    }

    /// After the loop: no copy is left in flight and every thread is done with the ring
    /// (a later pipelined loop reuses it).
    pub fn pipeline_end(&mut self, r: &Ring) {
        if r.plan.async_dot.is_some() {
            self.ins("wgmma.wait_group.sync.aligned 0");
        }
        self.ins("cp.async.wait_all");
        self.ins("bar.sync 0");
        if let Some(at) = r.plan.barriers_at {
            // Every copy has landed and been waited for: the mbarriers go back to
            // being shared memory (a later loop's ring or scratch may overlap them).
            let tid0 = self.tid0.clone();
            for i in 0..r.plan.buffers {
                self.ins(format!(
                    "@{tid0} mbarrier.inval.shared::cta.b64 [{}+{}]",
                    r.ring,
                    at + 8 * i
                ));
            }
            self.ins("bar.sync 0");
        }
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
        if let Some(b) = r.barriers.clone() {
            self.tma_issue(r, &b, &live, record)?;
        }
        for ld in r.plan.loads.clone() {
            if ld.tma.is_some() {
                continue;
            }
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
        self.staged_issue(r, &live, record)?;
        if r.plan.loads.iter().any(|l| l.tma.is_none()) || !r.plan.staged.is_empty() {
            self.ins("cp.async.commit_group");
        }
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
        if let (Some(b), Some(at)) = (&r.barriers, r.plan.barriers_at) {
            self.ins(format!("add.u32 {}, {}, 8", b.write, b.write));
            self.ins(format!("@{p} add.u32 {}, {}, {at}", b.write, r.ring));
        }
        Ok(())
    }

    /// The copy-engine copies of one stage: one elected lane of warp 0 expects the
    /// stage's bytes on its mbarrier and issues every box. The branches around it are
    /// warp-uniform and the lane is `elect.sync`'s, so ptxas issues each copy once,
    /// from uniform registers (a per-thread predicate makes it loop over the active
    /// lanes around every copy).
    fn tma_issue(&mut self, r: &Ring, b: &Barriers, live: &str, record: bool) -> Res<()> {
        let skip = self.new_label("tma_skip");
        let not_first = self.reg(Rk::P);
        self.ins(format!("setp.ne.u32 {not_first}, {}, 0", self.warp));
        self.ins(format!("@{not_first} bra.uni {skip}"));
        self.ins(format!("@!{live} bra.uni {skip}"));
        let (leader, lane) = (self.reg(Rk::P), self.reg(Rk::R));
        self.ins(format!("elect.sync {lane}|{leader}, -1"));
        let bytes: u32 = r
            .plan
            .loads
            .iter()
            .filter_map(|l| l.tma.as_ref())
            .map(|t| t.bytes)
            .sum();
        let state = self.reg(Rk::D);
        self.ins(format!(
            "@{leader} mbarrier.arrive.expect_tx.shared::cta.b64 {state}, [{}], {bytes}",
            b.write
        ));
        // Each run of copies is a block that only an elected lane enters: a copy under a
        // per-thread predicate becomes a loop over the lanes it may hold for (ptxas made
        // a lone predicated copy a branch itself, but not a run of them).
        let elect_or_skip = |e: &mut Self, skip: &str| {
            let (p, lane) = (e.reg(Rk::P), e.reg(Rk::R));
            e.ins(format!("elect.sync {lane}|{p}, -1"));
            e.ins(format!("@!{p} bra {skip}"));
        };
        let copy = |e: &mut Self, rank: u32, at: u32, map: &str, coords: &[String]| {
            e.ins(format!(
                "cp.async.bulk.tensor.{rank}d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [{}+{at}], [{map}, {{{}}}], [{}]",
                r.write,
                coords.join(", "),
                b.write
            ));
        };
        for ld in r
            .plan
            .loads
            .iter()
            .filter(|l| l.tma.is_some())
            .cloned()
            .collect::<Vec<_>>()
        {
            let t = ld.tma.as_ref().expect("filtered");
            let (row, col) = (self.scalar(t.origin[0]), self.scalar(t.origin[1]));
            if record {
                let dtype = self.k.ty(ld.value).dtype().unwrap_or(DType::BF16);
                self.accesses.push(Access {
                    kind: AccessKind::Load,
                    ptr: ld.ptr,
                    loc: self.k.value(ld.value).loc,
                    dtype,
                    // The copy engine moves the block; no thread loads it.
                    width: 8,
                    elements: 0,
                    narrowed: None,
                });
            }
            let done = self.new_label("tma_done");
            if let Some(w) = &t.whole {
                let m = w.map;
                let total = self.view_dim_reg(if w.rows { m.view.rows } else { m.view.cols });
                let start = if w.rows { &row } else { &col };
                let (end, outside) = (self.reg(Rk::R), self.reg(Rk::P));
                let boxes = self.new_label("tma_boxes");
                self.ins(format!("add.s32 {end}, {start}, {}", w.extent));
                self.ins(format!("setp.gt.s32 {outside}, {end}, {total}"));
                self.ins(format!("@{outside} bra.uni {boxes}"));
                let mut coords = Vec::new();
                for i in 0..m.rank as usize {
                    let d = m.dims[i];
                    let c = self.reg(Rk::R);
                    if m.spans(i) {
                        let at = if d.rows { &row } else { &col };
                        self.ins(format!("shr.s32 {c}, {at}, {}", d.step.trailing_zeros()));
                    } else {
                        self.ins(format!("mov.u32 {c}, 0"));
                    }
                    coords.push(c);
                }
                let wmap = b.maps[&self.tma_map_index(w.map)].clone();
                elect_or_skip(self, &done);
                copy(self, m.rank, ld.at, &wmap, &coords);
                self.ins(format!("bra.uni {done}"));
                self.label(&boxes);
            }
            elect_or_skip(self, &done);
            let map = b.maps[&self.tma_map_index(t.map)].clone();
            let first_is_rows = t.map.dims[0].rows;
            for &(off, dr, dc) in &t.boxes {
                let (y, x) = (self.reg(Rk::R), self.reg(Rk::R));
                self.ins(format!("add.s32 {y}, {row}, {dr}"));
                self.ins(format!("add.s32 {x}, {col}, {dc}"));
                // Coordinates go fastest dim first: the contiguous axis.
                let coords = if first_is_rows { [y, x] } else { [x, y] };
                copy(self, 2, ld.at + off, &map, &coords);
            }
            self.label(&done);
        }
        self.label(&skip);
        Ok(())
    }

    /// The parameter index of tensor map `map` (`super::tma_param_name`), added to the
    /// kernel's maps on first use.
    fn tma_map_index(&mut self, map: crate::ir::TmaMap) -> usize {
        match self.tma_maps.iter().position(|m| *m == map) {
            Some(i) => i,
            None => {
                self.tma_maps.push(map);
                self.tma_maps.len() - 1
            }
        }
    }

    /// A register holding a view's size (a 32-bit parameter, or a constant).
    fn view_dim_reg(&mut self, d: crate::ir::ViewDim) -> String {
        let r = self.reg(Rk::R);
        match d {
            crate::ir::ViewDim::Param(i) => {
                self.ins(format!("ld.param.b32 {r}, [p{i}]"));
            }
            crate::ir::ViewDim::Const(c) => {
                self.ins(format!(
                    "mov.u32 {r}, {}",
                    c.clamp(i64::from(i32::MIN), i64::from(i32::MAX))
                ));
            }
        }
        r
    }

    /// Before a ring with copy-engine loads: thread 0 initializes one mbarrier a stage
    /// (one arrival: its own `expect_tx`), every thread sees them before the first copy
    /// is issued, and the tensor maps' generic addresses are taken once.
    fn barriers_start(&mut self, plan: &Plan, ring: &str, at: u32) -> Barriers {
        let tid0 = self.tid0.clone();
        for i in 0..plan.buffers {
            self.ins(format!(
                "@{tid0} mbarrier.init.shared::cta.b64 [{ring}+{}], 1",
                at + 8 * i
            ));
        }
        self.ins(format!("@{tid0} fence.mbarrier_init.release.cluster"));
        self.ins("bar.sync 0");
        let mut maps = HashMap::new();
        for ld in &plan.loads {
            let Some(t) = &ld.tma else { continue };
            for m in std::iter::once(t.map).chain(t.whole.as_ref().map(|w| w.map)) {
                let index = self.tma_map_index(m);
                if let std::collections::hash_map::Entry::Vacant(e) = maps.entry(index) {
                    let a = self.reg(Rk::D);
                    self.ins(format!("mov.u64 {a}, {}", super::tma_param_name(index)));
                    self.ins(format!("cvta.param.u64 {a}, {a}"));
                    e.insert(a);
                }
            }
        }
        // The copy engine reads a map on every copy: have it cached from the start.
        let (skip, not_first) = (self.new_label("tmap_skip"), self.reg(Rk::P));
        self.ins(format!("setp.ne.u32 {not_first}, {}, 0", self.warp));
        self.ins(format!("@{not_first} bra.uni {skip}"));
        let (leader, lane) = (self.reg(Rk::P), self.reg(Rk::R));
        self.ins(format!("elect.sync {lane}|{leader}, -1"));
        let mut ordered: Vec<_> = maps.iter().collect();
        ordered.sort();
        for (_, a) in ordered {
            self.ins(format!("@{leader} prefetch.tensormap [{a}]"));
        }
        self.label(&skip);
        let (read, write, phase) = (self.reg(Rk::R), self.reg(Rk::R), self.reg(Rk::R));
        self.ins(format!("add.u32 {read}, {ring}, {at}"));
        self.ins(format!("mov.u32 {write}, {read}"));
        self.ins(format!("mov.u32 {phase}, 0"));
        Barriers {
            read,
            write,
            phase,
            maps,
        }
    }

    /// The copy-engine form of ring load `x` (a descriptor's load) staged as `op`, if it
    /// has one: on sm_90a, for 16-bit operands of `wgmma` stored as rows of 32, 64 or 128
    /// bytes; 2-D boxes (one a 64-column panel, or one per 8-row block of A's permuted
    /// rows) and, where they take several, the one-box form ([`Whole`]).
    fn tma_copy(&mut self, x: ValueId, l: &super::layout::Layout, op: Operand) -> Option<TmaCopy> {
        if !self.target.wgmma() || op == Operand::Mma {
            return None;
        }
        let vl = *self.k.view_loads.iter().find(|v| v.load == x)?;
        if vl.view.dtype.size_bytes() != 2 {
            return None;
        }
        let st = super::dot::Staged::for_operand(l, op);
        // The stored rows must be the matrix's contiguous lines.
        if st.transposed != vl.view.col_major {
            return None;
        }
        let shape = &self.k.ty(x).shape;
        let (rows, cols) = (shape[0] as u32, shape[1] as u32);
        let row_bytes = st.sw.row_bytes();
        if !matches!(row_bytes, 32 | 64 | 128) {
            return None;
        }
        let dim = |rows: bool, step: u32, size: u32| crate::ir::TmaDim { rows, step, size };
        // Maps become parameters only when a ring that uses them is emitted (the plan
        // may still be refused).
        let make_map = |dims: &[crate::ir::TmaDim]| {
            let mut all = [crate::ir::TmaDim::default(); 5];
            all[..dims.len()].copy_from_slice(dims);
            crate::ir::TmaMap {
                view: vl.view,
                rank: dims.len() as u32,
                dims: all,
                swizzle_bytes: row_bytes,
            }
        };
        if vl.view.col_major {
            // Stored as `[cols, rows]`, each stored row one column of the matrix (B of an
            // NT GEMM from an `[N, K]` weight): one box, no panels, no permutation.
            if st.rows.is_some() || rows * 2 != row_bytes || cols > 256 {
                return None;
            }
            return Some(TmaCopy {
                map: make_map(&[dim(true, 1, rows), dim(false, 1, cols)]),
                origin: vl.origin,
                bytes: rows * cols * 2,
                boxes: vec![(0, 0, 0)],
                whole: None,
            });
        }
        let box_cols = row_bytes / 2;
        let mut boxes = Vec::new();
        // The one-box form's dims after the columns', fastest first, and the axis it
        // splits.
        let (box_rows, whole): (u32, Option<(Vec<crate::ir::TmaDim>, bool, u32)>) = match st.rows {
            Some(p) => {
                if cols != box_cols || rows % 8 != 0 {
                    return None;
                }
                for block in 0..rows / 8 {
                    boxes.push((p.stored_block(block) * 8 * row_bytes, 8 * block, 0));
                }
                // Stored order of the rows (`WgmmaRows`): g (8 rows), h, wl, mi, gi.
                let (g, mi) = (p.groups_log2(), p.per_group_log2());
                let mut dims = vec![dim(true, 1, 8), dim(true, 1 << (5 + g), 2), dim(true, 8, 4)];
                if mi > 0 {
                    dims.push(dim(true, 1 << (6 + g), 1 << mi));
                }
                if g > 0 {
                    dims.push(dim(true, 32, 1 << g));
                }
                (8, Some((dims, true, rows)))
            }
            None => {
                if rows > 256 || cols % box_cols != 0 {
                    return None;
                }
                let panels = cols / box_cols;
                let panel = if panels > 1 { st.sw.panel_bytes() } else { 0 };
                if panels > 1 && panel != rows * row_bytes {
                    return None;
                }
                for p in 0..panels {
                    boxes.push((p * panel, 0, p * box_cols));
                }
                let whole = (panels > 1).then(|| {
                    (
                        vec![dim(true, 1, rows), dim(false, box_cols, panels)],
                        false,
                        cols,
                    )
                });
                (rows, whole)
            }
        };
        let columns = dim(false, 1, box_cols);
        let map = make_map(&[columns, dim(true, 1, box_rows)]);
        // The one-box form needs the block's origin along the split axis to be a
        // multiple of the split (the box starts at a whole step), at most five dims.
        let whole = whole.and_then(|(dims, split_rows, extent)| {
            let step = dims.iter().filter(|d| d.rows == split_rows).map(|d| d.step).max()?;
            let origin = vl.origin[usize::from(!split_rows)];
            let div = self.axis[origin.index()].div.first().copied().unwrap_or(1);
            let total_ok = match if split_rows { vl.view.rows } else { vl.view.cols } {
                crate::ir::ViewDim::Const(_) => true,
                crate::ir::ViewDim::Param(i) => matches!(
                    self.k.params.get(i as usize).map(|p| p.kind),
                    Some(crate::ir::ParamKind::Scalar(t) | crate::ir::ParamKind::ScalarMultipleOf(t, _))
                        if t.size_bytes() == 4
                ),
            };
            (dims.len() < 5 && div >= u64::from(step) && total_ok).then(|| Whole {
                map: make_map(&[&[columns][..], &dims].concat()),
                rows: split_rows,
                extent,
            })
        });
        Some(TmaCopy {
            map,
            origin: vl.origin,
            bytes: rows * cols * 2,
            boxes,
            whole,
        })
    }
}
