//! Global memory: loads (vectorized when axis analysis proves contiguity, alignment and a
//! uniform mask), stores (one owner thread per element) and atomics.

use super::emit::{Emitter, Res};
use super::layout::Layout;
use super::regs::{mem_ty, rk, Rk};
use super::{Access, AccessKind};
use crate::ir::{AtomicOp, DType, FlagOp, ValueId};

/// How long `wait_flag_at_least` polls on the GPU before the program traps (10 s of
/// `%globaltimer`): far beyond any wait for a peer that is running, so a signal that
/// never comes (a bug, a peer that failed) ends the launch with an error instead of
/// hanging the device.
pub const FLAG_WAIT_LIMIT_NS: u64 = 10_000_000_000;

impl Emitter<'_> {
    /// Elements per vector access for pointers `ptr` in layout `l`.
    ///
    /// Also notes in `self.narrowed` which fact held it below what the layout allows:
    /// contiguity, alignment (divisibility of the offsets) or the mask.
    pub(super) fn vec_width(
        &mut self,
        ptr: ValueId,
        mask: Option<ValueId>,
        l: &Layout,
        dt: DType,
    ) -> usize {
        let es = dt.size_bytes();
        if es == 1 {
            self.narrowed = None;
            return 1;
        }
        self.width_up_to(ptr, mask, l, es, 16 / es)
    }

    /// [`Self::vec_width`] for a load of `u8` elements: up to four a vector (`ld.v4.u8`
    /// into 32-bit registers). Loads only: the staged and coalesced paths keep bytes
    /// one an access.
    fn byte_load_width(&mut self, ptr: ValueId, mask: Option<ValueId>, l: &Layout) -> usize {
        self.width_up_to(ptr, mask, l, 1, 4)
    }

    /// Elements per vector access of `es`-byte elements, at most `cap`.
    fn width_up_to(
        &mut self,
        ptr: ValueId,
        mask: Option<ValueId>,
        l: &Layout,
        es: usize,
        cap: usize,
    ) -> usize {
        self.narrowed = None;
        let s0 = l.order[0];
        let Some(t) = l.keep.iter().position(|&s| s == s0) else {
            return 1;
        };
        let info = &self.axis[ptr.index()];
        let run = (l.run(s0) as u64).min(cap as u64);
        let (contig, aligned) = (info.contig[t], info.div[t] / es as u64);
        let uniform = mask.map_or(u64::MAX, |m| self.axis[m.index()].cons[t]);
        let v = run.min(contig).min(aligned).min(uniform).max(1);
        if v < run {
            self.narrowed = Some(if aligned <= v && aligned < contig.min(uniform) {
                let ints: Vec<&str> = self
                    .k
                    .params
                    .iter()
                    .filter(|p| matches!(p.kind, crate::ir::ParamKind::Scalar(d) if d.is_int()))
                    .map(|p| p.name.as_str())
                    .collect();
                format!(
                    "the offsets are only known to be multiples of {} element(s) (alignment): mark the integer parameters in the address `#[multiple_of(16)]`{} so {run}-wide ({} byte) accesses are provably aligned",
                    aligned.max(1),
                    if ints.is_empty() {
                        String::new()
                    } else {
                        format!(" (candidates: {})", ints.join(", "))
                    },
                    run * es as u64
                )
            } else if contig <= v && contig < uniform {
                format!("the addresses are contiguous in runs of only {contig} element(s)")
            } else {
                format!(
                    "the mask is only known to be uniform over {} element(s): bound the mask by a multiple of {run} (e.g. `#[multiple_of(16)]` on the bound)",
                    uniform.max(1)
                )
            });
        }
        v as usize
    }

    fn record(&mut self, kind: AccessKind, ptr: ValueId, dtype: DType, width: usize, n: usize) {
        let narrowed = self.narrowed.take();
        self.accesses.push(Access {
            kind,
            ptr,
            loc: self.loc,
            dtype,
            width,
            elements: n,
            narrowed,
        });
    }

    fn zero(&mut self, kind: Rk, d: &str) {
        match kind {
            Rk::F => self.ins(format!("mov.f32 {d}, 0f00000000")),
            Rk::P => self.ins(format!("setp.ne.u32 {d}, 0, 0")),
            _ => self.ins(format!("mov.{} {d}, 0", kind.bits())),
        }
    }

    /// `a && b` over optional predicates.
    fn and_pred(&mut self, a: Option<&str>, b: Option<&str>) -> Option<String> {
        match (a, b) {
            (Some(a), Some(b)) => {
                let p = self.reg(Rk::P);
                self.ins(format!("and.pred {p}, {a}, {b}"));
                Some(p)
            }
            (Some(a), None) | (None, Some(a)) => Some(a.to_string()),
            (None, None) => None,
        }
    }

    /// `{a, b, ..}` for a vector access, the register alone otherwise.
    pub(super) fn regs_list(r: &[String]) -> String {
        if r.len() == 1 {
            r[0].clone()
        } else {
            format!("{{{}}}", r.join(", "))
        }
    }

    /// `.vN` for a vector access of `n > 1` registers.
    pub(super) fn vsuf(n: usize) -> String {
        if n == 1 {
            String::new()
        } else {
            format!(".v{n}")
        }
    }

    /// Loads a tile (in layout `l`) or a scalar (`l == None`).
    pub fn load(
        &mut self,
        v: ValueId,
        ptr: ValueId,
        mask: Option<ValueId>,
        other: Option<ValueId>,
        l: Option<&Layout>,
    ) -> Res<Vec<String>> {
        let mask = mask.filter(|&m| !always_true(self.k, m));
        let other = other.filter(|_| mask.is_some());
        let dt = self.val_dt(v)?;
        // A pointer that may come from several parameters takes the most careful of
        // their qualifiers (`.cg` before an ordinary load before `.nc`).
        let nc = match self.k.root_params(ptr) {
            Some(roots) if !roots.is_empty() => roots
                .iter()
                .map(|&p| self.load_qualifier[p])
                .max_by_key(|q| match *q {
                    ".nc" => 0,
                    ".cg" => 2,
                    _ => 1,
                })
                .expect("not empty"),
            _ => ".cg",
        };
        let (ptrs, masks, others, vw) = match l {
            Some(l) => (
                self.tile(ptr, l)?,
                mask.map(|m| self.tile(m, l)).transpose()?,
                other.map(|o| self.tile(o, l)).transpose()?,
                if dt == DType::U8 {
                    self.byte_load_width(ptr, mask, l)
                } else {
                    self.vec_width(ptr, mask, l, dt)
                },
            ),
            None => {
                self.narrowed = None;
                (
                    vec![self.scalar(ptr)],
                    mask.map(|m| vec![self.scalar(m)]),
                    other.map(|o| vec![self.scalar(o)]),
                    1,
                )
            }
        };
        self.record(AccessKind::Load, ptr, dt, vw, ptrs.len());
        let kind = rk(dt);
        let mut out = Vec::new();
        for g in (0..ptrs.len()).step_by(vw) {
            let pred = masks.as_ref().map(|m| m[g].clone());
            let at = pred.as_ref().map_or(String::new(), |p| format!("@{p} "));
            let a = &ptrs[g];
            let oth: Option<Vec<String>> = others.as_ref().map(|o| o[g..g + vw].to_vec());
            if dt == DType::Bool {
                let (t, d) = (self.reg(Rk::R), self.reg(Rk::P));
                self.ins(format!("mov.u32 {t}, 0"));
                self.ins(format!("{at}ld.global{nc}.u8 {t}, [{a}]"));
                self.ins(format!("setp.ne.u32 {d}, {t}, 0"));
                if let (Some(p), Some(o)) = (&pred, &oth) {
                    self.ins(format!("@!{p} mov.pred {d}, {}", o[0]));
                }
                out.push(d);
            } else if kind == Rk::H && vw >= 2 {
                // Halves travel as packed 32-bit words.
                let words: Vec<String> = (0..vw / 2).map(|_| self.reg(Rk::R)).collect();
                if pred.is_some() {
                    for (j, w) in words.iter().enumerate() {
                        match &oth {
                            Some(o) => {
                                self.ins(format!("mov.b32 {w}, {{{}, {}}}", o[2 * j], o[2 * j + 1]))
                            }
                            None => self.ins(format!("mov.b32 {w}, 0")),
                        }
                    }
                }
                self.ins(format!(
                    "{at}ld.global{nc}{}.b32 {}, [{a}]",
                    Self::vsuf(words.len()),
                    Self::regs_list(&words)
                ));
                let halves: Vec<String> = (0..vw).map(|_| self.reg(Rk::H)).collect();
                self.unpack_halves(&words, &halves);
                out.extend(halves);
            } else {
                let ds: Vec<String> = (0..vw).map(|_| self.reg(kind)).collect();
                if pred.is_some() {
                    for (j, d) in ds.iter().enumerate() {
                        match &oth {
                            Some(o) => self.ins(format!("mov.{} {d}, {}", kind.bits(), o[j])),
                            None => self.zero(kind, d),
                        }
                    }
                }
                self.ins(format!(
                    "{at}ld.global{nc}{}.{} {}, [{a}]",
                    Self::vsuf(vw),
                    mem_ty(dt),
                    Self::regs_list(&ds)
                ));
                out.extend(ds);
            }
        }
        Ok(out)
    }

    /// `prefetch.global.L2` of each element's address (one per vector group: the
    /// elements of a group share a line), by its owner thread only.
    pub fn prefetch(&mut self, ptr: ValueId, mask: Option<ValueId>) -> Res<()> {
        let mask = mask.filter(|&m| !always_true(self.k, m));
        let (ptrs, masks, owner, vw) = if self.k.ty(ptr).is_scalar() {
            let tid0 = self.tid0.clone();
            let m = mask.map(|m| vec![self.scalar(m)]);
            (vec![self.scalar(ptr)], m, Some(tid0), 1)
        } else {
            let l = self.layout_of(ptr);
            let dt = self.ptr_dt(ptr)?;
            let owner = self.coords(&l).owner;
            (
                self.tile(ptr, &l)?,
                mask.map(|m| self.tile(m, &l)).transpose()?,
                owner,
                // Groups by the pointers alone: one line a group even when the mask
                // varies inside it (the group's first element decides; a hint lost at
                // a range's first line costs nothing, and no masked-off address is
                // ever touched).
                self.vec_width(ptr, None, &l, dt),
            )
        };
        // A hint records no access.
        self.narrowed = None;
        for g in (0..ptrs.len()).step_by(vw) {
            let m = masks.as_ref().map(|m| m[g].clone());
            let pred = self.and_pred(owner.as_deref(), m.as_deref());
            let at = pred.as_ref().map_or(String::new(), |p| format!("@{p} "));
            self.ins(format!("{at}prefetch.global.L2 [{}]", ptrs[g]));
        }
        Ok(())
    }

    /// `prefetch_range`: on sm_90 one `cp.async.bulk.prefetch.L2` by thread 0 over the
    /// range widened to 16-byte bounds (the copy engine's granule; allocations are
    /// aligned far beyond it, so no other allocation is touched); a no-op elsewhere.
    pub fn prefetch_range(&mut self, ptr: ValueId, count: ValueId) -> Res<()> {
        if !self.target.hopper() {
            return Ok(());
        }
        let size = self.ptr_dt(ptr)?.size_bytes() as u64;
        let (p, n) = (self.scalar(ptr), self.scalar(count));
        let (start, end, bytes) = (self.reg(Rk::D), self.reg(Rk::D), self.reg(Rk::D));
        let go = self.reg(Rk::P);
        self.ins(format!("and.b64 {start}, {p}, -16"));
        self.ins(format!("cvt.s64.s32 {end}, {n}"));
        self.ins(format!("mad.lo.s64 {end}, {end}, {size}, {p}"));
        self.ins(format!("add.s64 {end}, {end}, 15"));
        self.ins(format!("and.b64 {end}, {end}, -16"));
        self.ins(format!("sub.s64 {bytes}, {end}, {start}"));
        self.ins(format!("setp.gt.s32 {go}, {n}, 0"));
        self.ins(format!("and.pred {go}, {go}, {}", self.tid0));
        let b32 = self.reg(Rk::R);
        self.ins(format!("cvt.u32.u64 {b32}, {bytes}"));
        self.ins(format!(
            "@{go} cp.async.bulk.prefetch.L2.global [{start}], {b32}"
        ));
        Ok(())
    }

    /// `signal_flag` / `wait_flag_at_least` on a scalar `i32` flag, by thread 0 of the
    /// program, with a barrier ordering the other threads' accesses around it.
    ///
    /// Signal: `bar.sync` (every thread's earlier accesses precede thread 0's in
    /// causality order), then `st.release.sys`, which is cumulative over them. Wait:
    /// thread 0 polls with `ld.acquire.sys` until `flag - value` (wrapping) is not
    /// negative, then `bar.sync` orders every thread's later accesses after the
    /// acquire. The poll is bounded: after [`FLAG_WAIT_LIMIT_NS`] of `%globaltimer`
    /// the program executes `trap`, so the launch fails with an error instead of
    /// spinning forever on a signal that never comes.
    pub fn flag(&mut self, op: FlagOp, ptr: ValueId, value: ValueId) -> Res<()> {
        let (p, v) = (self.scalar(ptr), self.scalar(value));
        let tid0 = self.tid0.clone();
        match op {
            FlagOp::Signal => {
                self.ins("bar.sync 0");
                self.ins(format!("@{tid0} st.release.sys.global.b32 [{p}], {v}"));
            }
            FlagOp::WaitAtLeast => {
                let (poll, done) = (self.new_label("flag_poll"), self.new_label("flag_done"));
                let (flag, diff) = (self.reg(Rk::R), self.reg(Rk::R));
                let (start, now) = (self.reg(Rk::D), self.reg(Rk::D));
                let (ok, late) = (self.reg(Rk::P), self.reg(Rk::P));
                self.ins(format!("@!{tid0} bra {done}"));
                self.ins(format!("mov.u64 {start}, %globaltimer"));
                self.label(&poll);
                self.ins(format!("ld.acquire.sys.global.b32 {flag}, [{p}]"));
                self.ins(format!("sub.s32 {diff}, {flag}, {v}"));
                self.ins(format!("setp.ge.s32 {ok}, {diff}, 0"));
                self.ins(format!("@{ok} bra {done}"));
                self.ins(format!("mov.u64 {now}, %globaltimer"));
                self.ins(format!("sub.s64 {now}, {now}, {start}"));
                self.ins(format!("setp.gt.s64 {late}, {now}, {FLAG_WAIT_LIMIT_NS}"));
                self.ins(format!("@!{late} bra {poll}"));
                self.ins("trap");
                self.label(&done);
                self.ins("bar.sync 0");
            }
        }
        Ok(())
    }

    /// Stores a tile or scalar; each element is written by its owner thread only.
    pub fn store(&mut self, ptr: ValueId, value: ValueId, mask: Option<ValueId>) -> Res<()> {
        let mask = mask.filter(|&m| !always_true(self.k, m));
        let dt = self.ptr_dt(ptr)?;
        let kind = rk(dt);
        let (ptrs, vals, masks, owner, vw) = if self.k.ty(ptr).is_scalar() {
            let tid0 = self.tid0.clone();
            (
                vec![self.scalar(ptr)],
                vec![self.scalar(value)],
                mask.map(|m| vec![self.scalar(m)]),
                Some(tid0),
                1,
            )
        } else {
            let mut l = if self.lay.strong[value.index()] && !self.k.ty(value).is_scalar() {
                self.layout_of(value)
            } else {
                self.layout_of(ptr)
            };
            // Coalescing: when the pointers run along another dim than the value's
            // layout, the value moves (through shared memory) to a layout whose
            // threads store vectors along that dim.
            let shape = self.k.ty(ptr).shape.clone();
            let info = &self.axis[ptr.index()];
            let coalesced = Layout::coalesced(&shape, self.k.num_warps, info, dt.size_bytes());
            if let Some(c) = coalesced.clone() {
                if c.order[0] != l.order[0]
                    && self.vec_width(ptr, mask, &c, dt) > self.vec_width(ptr, mask, &l, dt)
                {
                    l = c;
                }
            }
            // A `dot` result in its accumulator layout holds two adjacent elements of
            // a row per thread: a 16-bit one moved into the pointers' layout through
            // shared memory (free after the loop) is stored in 16-byte vectors instead
            // of 4-byte ones. (f32 tiles keep their 8-byte stores: split-K partials
            // stored through shared memory were slower; docs/perf.md, "The
            // accumulator's store".)
            let mut moved = None;
            if kind == Rk::H && self.lay.strong[value.index()] && l == self.layout_of(value) {
                let nw = self.k.num_warps;
                let acc = Layout::mma(&shape, nw).as_ref() == Some(&l)
                    || Layout::wgmma(&shape, nw).as_ref() == Some(&l);
                let natural = coalesced
                    .clone()
                    .unwrap_or_else(|| Layout::default_for(&shape, nw));
                if acc && natural != l && self.can_convert_rows(kind, &l, &natural) {
                    let now = self.vec_width(ptr, mask, &l, dt);
                    let then = self.vec_width(ptr, mask, &natural, dt);
                    if then >= 2 * now && then * dt.size_bytes() >= 8 {
                        let src = self.tile(value, &l)?;
                        moved = Some(self.convert_rows(&src, kind, &l, &natural)?);
                        l = natural;
                    }
                }
            }
            let owner = self.coords(&l).owner;
            let vals = match moved {
                Some(v) => v,
                None => self.tile(value, &l)?,
            };
            (
                self.tile(ptr, &l)?,
                vals,
                mask.map(|m| self.tile(m, &l)).transpose()?,
                owner,
                self.vec_width(ptr, mask, &l, dt),
            )
        };
        self.record(AccessKind::Store, ptr, dt, vw, ptrs.len());
        for g in (0..ptrs.len()).step_by(vw) {
            let m = masks.as_ref().map(|m| m[g].clone());
            let pred = self.and_pred(owner.as_deref(), m.as_deref());
            let at = pred.as_ref().map_or(String::new(), |p| format!("@{p} "));
            let a = &ptrs[g];
            if dt == DType::Bool {
                let t = self.reg(Rk::R);
                self.ins(format!("selp.u32 {t}, 1, 0, {}", vals[g]));
                self.ins(format!("{at}st.global.u8 [{a}], {t}"));
            } else if kind == Rk::H && vw >= 2 {
                let words = self.pack_halves(&vals[g..g + vw]);
                self.ins(format!(
                    "{at}st.global{}.b32 [{a}], {}",
                    Self::vsuf(words.len()),
                    Self::regs_list(&words)
                ));
            } else {
                self.ins(format!(
                    "{at}st.global{}.{} [{a}], {}",
                    Self::vsuf(vw),
                    mem_ty(dt),
                    Self::regs_list(&vals[g..g + vw])
                ));
            }
        }
        Ok(())
    }

    /// Atomic read-modify-write; every element is updated once (by its owner) and the old
    /// values are shared with the threads holding copies.
    pub fn atomic(
        &mut self,
        v: ValueId,
        op: AtomicOp,
        ptr: ValueId,
        value: ValueId,
        mask: Option<ValueId>,
        l: Option<&Layout>,
    ) -> Res<Vec<String>> {
        let dt = self.ptr_dt(ptr)?;
        let ty = match (op, dt) {
            (AtomicOp::Add, DType::F32) => "add.f32",
            (AtomicOp::Add, DType::I32) => "add.s32",
            (AtomicOp::Add, DType::U32) => "add.u32",
            (AtomicOp::Max, DType::I32) => "max.s32",
            (AtomicOp::Max, DType::U32) => "max.u32",
            (AtomicOp::Max, DType::F32) => "max.f32",
            _ => return self.err(format!("atomic {op:?} on {dt} is not supported")),
        };
        let _ = v;
        let (ptrs, vals, masks, owner) = match l {
            Some(l) => {
                let owner = self.coords(l).owner;
                (
                    self.tile(ptr, l)?,
                    self.tile(value, l)?,
                    mask.map(|m| self.tile(m, l)).transpose()?,
                    owner,
                )
            }
            None => {
                let tid0 = self.tid0.clone();
                (
                    vec![self.scalar(ptr)],
                    vec![self.scalar(value)],
                    mask.map(|m| vec![self.scalar(m)]),
                    Some(tid0),
                )
            }
        };
        self.record(AccessKind::Atomic, ptr, dt, 1, ptrs.len());
        // An atomic orders the whole program's memory accesses (acquire-release at
        // device scope): every thread's earlier writes are visible before it, and
        // reads after it see what the atomic observed. So a program that finds itself
        // last (a counter reaching the program count) can read the others' results.
        self.ins("fence.acq_rel.gpu");
        self.ins("bar.sync 0");
        let kind = rk(dt);
        let mut out = Vec::new();
        for i in 0..ptrs.len() {
            let m = masks.as_ref().map(|m| m[i].clone());
            let pred = self.and_pred(owner.as_deref(), m.as_deref());
            let at = pred.as_ref().map_or(String::new(), |p| format!("@{p} "));
            let (a, x) = (&ptrs[i], &vals[i]);
            let d = self.reg(kind);
            self.zero(kind, &d);
            if ty == "max.f32" {
                // Non-negative floats order like signed ints; negative ones reverse as unsigned.
                let (bits, old) = (self.reg(Rk::R), self.reg(Rk::R));
                let (pos, neg) = (self.reg(Rk::P), self.reg(Rk::P));
                self.ins(format!("mov.b32 {bits}, {x}"));
                self.ins(format!("mov.b32 {old}, 0"));
                self.ins(format!("setp.ge.s32 {pos}, {bits}, 0"));
                self.ins(format!("not.pred {neg}, {pos}"));
                let p1 = self.and_pred(pred.as_deref(), Some(&pos)).unwrap();
                let p2 = self.and_pred(pred.as_deref(), Some(&neg)).unwrap();
                self.ins(format!(
                    "@{p1} atom.acq_rel.gpu.global.max.s32 {old}, [{a}], {bits}"
                ));
                self.ins(format!(
                    "@{p2} atom.acq_rel.gpu.global.min.u32 {old}, [{a}], {bits}"
                ));
                self.ins(format!("mov.b32 {d}, {old}"));
            } else {
                self.ins(format!("{at}atom.acq_rel.gpu.global.{ty} {d}, [{a}], {x}"));
            }
            out.push(d);
        }
        // Share the owner's old values with the replicas.
        if let Some(own) = owner {
            let es = kind.smem_bytes();
            let (addr, offs, numel) = match l {
                Some(l) => {
                    let n: usize = l.shape().iter().product();
                    (self.smem_addr(l, es), Self::lin_offsets(l), n)
                }
                None => (self.smem_base.clone(), vec![0], 1),
            };
            self.need_smem(numel as u32 * es)?;
            self.ins("bar.sync 0");
            for (r, off) in out.iter().zip(&offs) {
                self.ins(format!(
                    "@{own} st.shared.{} [{addr}+{}], {r}",
                    kind.bits(),
                    *off as u32 * es
                ));
            }
            self.ins("bar.sync 0");
            let mut shared = Vec::new();
            for off in &offs {
                shared.push(self.ld_shared(kind, &addr, *off as u32 * es));
            }
            out = shared;
        } else {
            self.ins("bar.sync 0");
        }
        self.ins("fence.acq_rel.gpu");
        Ok(out)
    }
}

/// Whether the mask `v` holds `true` in every element by construction: a `true`
/// literal, a splat, broadcast or new axis of one, `&` of two such, or `|` with one.
/// Such a load or store takes no predicate and zeroes no destination (a kernel's
/// `full(.., true)` for shapes it knows divisible, as Triton's `EVEN_K`).
pub(super) fn always_true(k: &crate::ir::Kernel, v: ValueId) -> bool {
    use crate::ir::{BinaryOp, Def, Expr, Literal};
    if let Some(lit) = super::elementwise::uniform_literal(k, v) {
        return lit == Literal::Bool(true);
    }
    match &k.value(v).def {
        Def::Expr(Expr::Binary {
            op: BinaryOp::And,
            lhs,
            rhs,
        }) => always_true(k, *lhs) && always_true(k, *rhs),
        Def::Expr(Expr::Binary {
            op: BinaryOp::Or,
            lhs,
            rhs,
        }) => always_true(k, *lhs) || always_true(k, *rhs),
        _ => false,
    }
}
