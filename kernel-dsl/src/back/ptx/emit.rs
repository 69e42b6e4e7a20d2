//! The emitter: registers, per-layout thread coordinates, value materialization in a
//! requested layout (rematerialization or a shared-memory conversion), statements and
//! control flow. Elementwise ops live in `elementwise.rs`, memory ops in `memory.rs`,
//! reductions in `reduce.rs`, `dot` in `dot.rs`.

/// Where `wait_for_prior_kernels()` was; `compile` turns it into the target's wait.
pub(super) const WAIT_MARKER: &str = "\t// wait_for_prior_kernels\n";
/// Where `launch_dependents()` stands in the body, until `compile` picks the target.
pub(super) const LAUNCH_MARKER: &str = "\t// launch_dependents\n";

use std::collections::HashMap;
use std::fmt::Write;

use super::axis::AxisInfo;
use super::layout::{Layout, Layouts};
use super::regs::{rk, rk_elem, Rk};
use super::Target;
use crate::error::CompileError;
use crate::ir::{Block, Def, Expr, Kernel, Loc, Stmt, ValueId};

/// Thread-dependent registers of one layout, computed once in the prologue.
#[derive(Clone, Debug)]
pub struct Coords {
    /// Tile index of the thread's first element along each space dim.
    pub base: Vec<String>,
    /// Whether the thread owns its copy (absent when nothing is replicated).
    pub owner: Option<String>,
    /// Row-major linear tile index of the thread's first element.
    pub lin: String,
}

/// Code generation state for one kernel.
pub struct Emitter<'k> {
    /// The kernel.
    pub k: &'k Kernel,
    /// Layout of every value.
    pub lay: Layouts,
    /// Axis info of every value.
    pub axis: Vec<AxisInfo>,
    /// The body text.
    pub code: String,
    /// Code run once at entry (thread coordinates), before the body.
    pub pro: String,
    counts: HashMap<Rk, u32>,
    vals: Vec<Option<Vec<String>>>,
    cache: Vec<HashMap<(ValueId, Layout), Vec<String>>>,
    /// 16-bit registers that are a half of a 32-bit word (loaded or carried packed):
    /// `(word, high half)`. Widening one reads the word, so the halves need not be
    /// kept in registers of their own (ptxas gives each 16-bit register a full one).
    pub halves: HashMap<String, (String, bool)>,
    coords: HashMap<Layout, Coords>,
    /// Static shared memory needed, in bytes.
    pub smem: u32,
    labels: u32,
    /// Per parameter: the cache qualifier of its loads (see [`load_qualifiers`]).
    pub load_qualifier: Vec<&'static str>,
    /// `%tid.x`, lane and warp ids.
    pub tid: String,
    lane: String,
    pub warp: String,
    /// 32-bit shared address of the shared buffer.
    pub smem_base: String,
    /// `tid == 0`: issues scalar stores and atomics.
    pub tid0: String,
    /// Where errors point.
    pub loc: Loc,
    /// Global memory accesses emitted so far.
    pub accesses: Vec<super::Access>,
    /// Why the last vector width computed was narrower than the layout allows (taken
    /// by the access it was computed for).
    pub narrowed: Option<String>,
    /// The target generated for.
    pub target: Target,
    /// Bytes of `tf_cluster`, the slots `cluster_gather` exchanges tiles through.
    pub cluster_smem: u32,
    /// The register holding `tf_cluster`'s address, once used.
    pub cluster_base: Option<String>,
    /// Whether a `cluster_gather` reads other programs' shared memory (the kernel then
    /// ends with a cluster barrier).
    pub gathers_remote: bool,
    /// Bytes of the `cp.async` ring of pipelined loops, at the start of the shared
    /// buffer (the scratch space every other use shares starts after it).
    pub ring_bytes: u32,
    /// Bytes at the ring's start that tiles moved between layouts outside pipelined
    /// loops use ([`Emitter::convert_rows`]); the ring is free there.
    pub ring_scratch: u32,
    /// The register holding the ring's address, once used.
    ring_reg: Option<String>,
    /// The pipelined loops being emitted, innermost last.
    pub rings: Vec<super::pipeline::Ring>,
    /// Whether shared memory holds swizzled tiles (then aligned to 128 bytes).
    pub swizzled: bool,
    /// Whether a `dot` was lowered to `wgmma`: its operand tiles then sit at 1024-byte
    /// aligned shared addresses (the 128-byte swizzle repeats every 1024 bytes).
    pub wgmma_used: bool,
    /// Tensor maps of copy-engine loads, in parameter order after the kernel's own
    /// ([`super::tma_param_name`]).
    pub tma_maps: Vec<crate::ir::TmaMap>,
    /// Products that `reduce` folds into a sum's additions (see `contract.rs`); they
    /// are never computed on their own.
    pub fused: std::collections::HashSet<ValueId>,
}

/// The cache qualifier of each parameter's loads.
///
/// Without programmatic dependent launch (before sm_90) a kernel starts after the
/// previous one has finished and its L1 cache starts clean, so any buffer the kernel
/// never writes may use the non-coherent path (`.nc`). On sm_90 the kernel may start
/// while earlier kernels still run; what they write becomes visible at
/// `griddepcontrol.wait` to ordinary loads, while `.nc` promises that the data does not
/// change during the kernel's lifetime, which already began. So there only buffers
/// loaded before `wait_for_prior_kernels()` (declared unwritten by prior kernels, see
/// [`Kernel::params_loaded_before_wait`]) use `.nc`; every other load is ordinary. (With
/// `.nc` everywhere, decode steps replayed from a graph read stale values on an H100.
/// `.cg`, through L2 only, is also correct but measured slower than ordinary loads.)
///
/// On both targets a buffer the kernel writes is read with `.cg`: a program may read
/// what other programs wrote (after an atomic, which orders them), and L1 is not
/// coherent across SMs.
pub fn load_qualifiers(k: &Kernel, target: Target) -> Vec<&'static str> {
    let written = k.written_params();
    let constant = k.params_loaded_before_wait();
    (0..k.params.len())
        .map(|i| match target {
            // What the program reads back (its own or another program's writes, after
            // an atomic) comes from L2, never from a line cached in L1 before.
            _ if written.contains(&i) => ".cg",
            // After a flag wait a buffer may hold what another GPU wrote while this
            // kernel ran, which `.nc` may not see.
            Target::Sm80 if !k.waits_on_flags() => ".nc",
            Target::Sm80 => "",
            Target::Sm90 | Target::Sm90a if constant.contains(&i) => ".nc",
            Target::Sm90 | Target::Sm90a => "",
        })
        .collect()
}

/// Shorthand for results of this backend.
pub type Res<T> = Result<T, CompileError>;

/// A loop-carried value's registers: their kind, the registers, and the packed words
/// that cross the back edge instead (tiles of 16-bit elements).
type LoopParam = (Rk, Vec<String>, Option<Vec<String>>);

impl<'k> Emitter<'k> {
    /// A fresh emitter.
    pub fn new(k: &'k Kernel, lay: Layouts, axis: Vec<AxisInfo>, target: Target) -> Self {
        let mut e = Emitter {
            k,
            lay,
            axis,
            code: String::new(),
            pro: String::new(),
            counts: HashMap::new(),
            vals: vec![None; k.values.len()],
            cache: vec![HashMap::new()],
            halves: HashMap::new(),
            coords: HashMap::new(),
            smem: 0,
            labels: 0,
            load_qualifier: load_qualifiers(k, target),
            tid: String::new(),
            lane: String::new(),
            warp: String::new(),
            smem_base: String::new(),
            tid0: String::new(),
            loc: Loc::default(),
            accesses: Vec::new(),
            narrowed: None,
            target,
            cluster_smem: 0,
            cluster_base: None,
            gathers_remote: false,
            fused: super::contract::fused_products(k),
            ring_bytes: 0,
            ring_scratch: 0,
            ring_reg: None,
            rings: Vec::new(),
            swizzled: false,
            wgmma_used: false,
            tma_maps: Vec::new(),
        };
        e.tid = e.reg(Rk::R);
        e.lane = e.reg(Rk::R);
        e.warp = e.reg(Rk::R);
        e.smem_base = e.reg(Rk::R);
        e.tid0 = e.reg(Rk::P);
        let (t, l, w, s, z) = (
            e.tid.clone(),
            e.lane.clone(),
            e.warp.clone(),
            e.smem_base.clone(),
            e.tid0.clone(),
        );
        for line in [
            format!("mov.u32 {t}, %tid.x"),
            format!("and.b32 {l}, {t}, 31"),
            format!("shr.u32 {w}, {t}, 5"),
            format!("mov.u32 {s}, tf_smem"),
            format!("setp.eq.u32 {z}, {t}, 0"),
        ] {
            let _ = writeln!(e.pro, "\t{line};");
        }
        e
    }

    /// The warp id register.
    pub fn warp_reg(&self) -> String {
        self.warp.clone()
    }

    /// The register holding the shared address of the `cp.async` ring.
    pub fn ring_base(&mut self) -> String {
        if let Some(r) = &self.ring_reg {
            return r.clone();
        }
        let r = self.reg(Rk::R);
        let _ = writeln!(self.pro, "\tmov.u32 {r}, tf_smem;");
        self.ring_reg = Some(r.clone());
        r
    }

    /// Takes `v`'s registers away (to rebind it for another loop iteration).
    pub fn take_regs(&mut self, v: ValueId) -> Option<Vec<String>> {
        self.vals[v.index()].take()
    }

    /// Binds `v` to registers.
    pub fn set_regs(&mut self, v: ValueId, r: Vec<String>) {
        self.vals[v.index()] = Some(r);
    }

    /// Puts back what [`Self::take_regs`] took.
    pub fn restore_regs(&mut self, v: ValueId, r: Option<Vec<String>>) {
        self.vals[v.index()] = r;
    }

    /// A new scope for values materialized in other layouts.
    pub fn push_scope(&mut self) {
        self.cache.push(HashMap::new());
    }

    /// Ends the scope [`Self::push_scope`] opened.
    pub fn pop_scope(&mut self) {
        self.cache.pop();
    }

    /// Sets the innermost scope's converted tiles aside (an empty scope in its place),
    /// for code that runs for another iteration than the one emitted so far.
    pub fn take_scope(&mut self) -> HashMap<(ValueId, Layout), Vec<String>> {
        std::mem::take(self.cache.last_mut().expect("a scope"))
    }

    /// Puts back what [`Self::take_scope`] set aside.
    pub fn restore_scope(&mut self, cache: HashMap<(ValueId, Layout), Vec<String>>) {
        *self.cache.last_mut().expect("a scope") = cache;
    }

    /// Emits the `let` of `v`.
    pub fn emit_let(&mut self, v: ValueId) -> Res<()> {
        self.let_(v)
    }

    /// A new register of a class.
    pub fn reg(&mut self, k: Rk) -> String {
        let n = self.counts.entry(k).or_insert(0);
        *n += 1;
        format!("{}{}", k.prefix(), *n - 1)
    }

    /// The `.reg` declarations for every register used.
    pub fn decls(&self) -> String {
        let mut s = String::new();
        for k in Rk::ALL {
            if let Some(n) = self.counts.get(&k) {
                let _ = writeln!(s, "\t.reg {} {}<{}>;", k.decl(), k.prefix(), n);
            }
        }
        s
    }

    /// Appends one instruction.
    pub fn ins(&mut self, s: impl AsRef<str>) {
        let _ = writeln!(self.code, "\t{};", s.as_ref());
    }

    /// Appends a label.
    pub fn label(&mut self, l: &str) {
        let _ = writeln!(self.code, "{l}:");
    }

    /// A fresh label name.
    pub fn new_label(&mut self, what: &str) -> String {
        self.labels += 1;
        format!("$L_{what}_{}", self.labels)
    }

    /// An error at the current value.
    pub fn err<T>(&self, msg: impl Into<String>) -> Res<T> {
        Err(CompileError::new(
            self.loc,
            format!("kernel `{}`: {}", self.k.name, msg.into()),
        ))
    }

    /// Reserves `bytes` of the shared buffer (every use starts at offset 0: uses are
    /// separated by barriers).
    pub fn need_smem(&mut self, bytes: u32) -> Res<()> {
        let limit = self.target.max_shared_bytes();
        if bytes > limit {
            return self.err(format!(
                "needs {bytes} bytes of shared memory, more than the {limit} bytes ({} KiB) one program may use on {}; use smaller tiles",
                limit / 1024,
                self.target.name()
            ));
        }
        self.smem = self.smem.max(bytes);
        Ok(())
    }

    /// The thread coordinates of a layout (emitted into the prologue on first use).
    pub fn coords(&mut self, l: &Layout) -> Coords {
        if let Some(c) = self.coords.get(l) {
            return c.clone();
        }
        let mut pro = Vec::new();
        let mut base = Vec::new();
        let mut owner: Option<String> = None;
        for s in 0..l.space_rank() {
            let b = self.reg(Rk::R);
            if l.ext[s] == 1 && l.cover(s) == 1 {
                pro.push(format!("mov.u32 {b}, 0"));
                base.push(b);
                continue;
            }
            let (ls, lw) = l.lane_bits(s);
            let (ws, ww) = l.warp_bits(s);
            let t1 = self.reg(Rk::R);
            let t2 = self.reg(Rk::R);
            pro.push(format!("bfe.u32 {t1}, {}, {ls}, {lw}", self.lane));
            pro.push(format!("bfe.u32 {t2}, {}, {ws}, {ww}", self.warp));
            pro.push(format!("shl.b32 {t2}, {t2}, {lw}"));
            pro.push(format!("or.b32 {t1}, {t1}, {t2}"));
            pro.push(format!("shl.b32 {t1}, {t1}, {}", l.spt[s].trailing_zeros()));
            if l.cover(s) > l.ext[s] {
                let q = self.reg(Rk::P);
                pro.push(format!("setp.lt.u32 {q}, {t1}, {}", l.ext[s]));
                if let Some(o) = &owner {
                    pro.push(format!("and.pred {q}, {q}, {o}"));
                }
                owner = Some(q);
            }
            pro.push(format!("and.b32 {b}, {t1}, {}", l.ext[s] - 1));
            base.push(b);
        }
        let lin = self.reg(Rk::R);
        pro.push(format!("mov.u32 {lin}, 0"));
        let shape = l.shape();
        let mut stride = 1;
        for t in (0..shape.len()).rev() {
            pro.push(format!(
                "mad.lo.u32 {lin}, {}, {stride}, {lin}",
                base[l.keep[t]]
            ));
            stride *= shape[t];
        }
        for p in pro {
            let _ = writeln!(self.pro, "\t{p};");
        }
        let c = Coords { base, owner, lin };
        self.coords.insert(l.clone(), c.clone());
        c
    }

    /// Compile-time linear tile index offset of each register of a layout.
    pub fn lin_offsets(l: &Layout) -> Vec<usize> {
        let shape = l.shape();
        l.reg_offsets()
            .iter()
            .map(|o| {
                let mut lin = 0;
                for (t, &n) in shape.iter().enumerate() {
                    lin = lin * n + o[l.keep[t]];
                }
                lin
            })
            .collect()
    }

    /// The single register of a scalar value.
    pub fn scalar(&self, v: ValueId) -> String {
        self.vals[v.index()]
            .as_ref()
            .expect("scalar defined before use")[0]
            .clone()
    }

    /// The dtype of a value tile or scalar (an error for pointers).
    pub fn val_dt(&self, v: ValueId) -> Res<crate::ir::DType> {
        match self.k.ty(v).dtype() {
            Some(d) => Ok(d),
            None => self.err(format!("{v} is a pointer where a value is needed")),
        }
    }

    /// The pointee dtype of a pointer tile or scalar (an error for values).
    pub fn ptr_dt(&self, v: ValueId) -> Res<crate::ir::DType> {
        match self.k.ty(v).pointee() {
            Some(d) => Ok(d),
            None => self.err(format!("{v} is a value where a pointer is needed")),
        }
    }

    /// The register class of a value's elements.
    pub fn rk_of(&self, v: ValueId) -> Rk {
        rk_elem(self.k.ty(v).elem)
    }

    /// The assigned layout of a tile value.
    pub fn layout_of(&self, v: ValueId) -> Layout {
        self.lay.of[v.index()]
            .clone()
            .unwrap_or_else(|| Layout::default_for(&self.k.ty(v).shape, self.k.num_warps))
    }

    /// The registers of `v` in layout `l` (a scalar is splat to every register).
    pub fn tile(&mut self, v: ValueId, l: &Layout) -> Res<Vec<String>> {
        if self.k.ty(v).is_scalar() {
            return Ok(vec![self.scalar(v); l.nregs()]);
        }
        let key = (v, l.clone());
        for scope in self.cache.iter().rev() {
            if let Some(r) = scope.get(&key) {
                return Ok(r.clone());
            }
        }
        if let Some(r) = &self.vals[v.index()] {
            if self.lay.of[v.index()].as_ref() == Some(l) {
                return Ok(r.clone());
            }
        }
        let cheap = match &self.k.value(v).def {
            Def::Expr(
                Expr::Broadcast { .. }
                | Expr::ExpandDims { .. }
                | Expr::Splat { .. }
                | Expr::Arange { .. },
            ) => true,
            Def::Expr(_) => !self.lay.strong[v.index()],
            _ => false,
        };
        let saved = self.loc;
        self.loc = self.k.value(v).loc;
        let r = if cheap || self.vals[v.index()].is_none() {
            self.compute(v, l)?
        } else {
            let from = self.layout_of(v);
            let src = self.vals[v.index()].clone().unwrap();
            let kind = self.rk_of(v);
            self.convert(&src, kind, &from, l)?
        };
        self.loc = saved;
        self.cache.last_mut().unwrap().insert(key, r.clone());
        Ok(r)
    }

    /// Moves a tile from one layout to another through shared memory.
    pub fn convert(
        &mut self,
        src: &[String],
        kind: Rk,
        from: &Layout,
        to: &Layout,
    ) -> Res<Vec<String>> {
        let es = kind.smem_bytes();
        let numel: usize = to.shape().iter().product();
        self.need_smem(numel as u32 * es)?;
        let a = self.smem_addr(from, es);
        self.ins("bar.sync 0");
        for (r, off) in src.iter().zip(Self::lin_offsets(from)) {
            self.st_shared(kind, &a, off as u32 * es, r);
        }
        self.ins("bar.sync 0");
        let b = self.smem_addr(to, es);
        let mut out = Vec::new();
        for off in Self::lin_offsets(to) {
            out.push(self.ld_shared(kind, &b, off as u32 * es));
        }
        Ok(out)
    }

    /// Whether [`Emitter::convert_rows`] can move a tile of `kind` between `from` and `to`:
    /// 2-D layouts of one shape that tile it exactly (no copies), outside pipelined loops
    /// (their ring holds operands), in the shared memory a program may use.
    pub fn can_convert_rows(&self, kind: Rk, from: &Layout, to: &Layout) -> bool {
        let exact = |l: &Layout| {
            l.space_rank() == 2
                && l.keep == [0, 1]
                && !l.replicated()
                && (0..2).all(|s| l.ext[s] % l.cover(s) == 0)
        };
        let shape = to.shape();
        matches!(kind, Rk::H | Rk::R | Rk::F)
            && self.rings.is_empty()
            && exact(from)
            && exact(to)
            && from.shape() == shape
            && Self::rows_bytes(kind, &shape) <= self.target.max_shared_bytes()
    }

    /// Row pitch (elements) and bytes of a `[rows, cols]` tile of `kind` in shared memory
    /// for [`Emitter::convert_rows`]: rows of a multiple of 128 bytes are padded by 16,
    /// so the 8 rows an accumulator layout's warp writes at once fall in different banks.
    fn rows_pitch(kind: Rk, shape: &[usize]) -> usize {
        let es = kind.smem_bytes() as usize;
        let cols = shape[1];
        if (cols * es) % 128 == 0 {
            cols + 16 / es
        } else {
            cols
        }
    }

    fn rows_bytes(kind: Rk, shape: &[usize]) -> u32 {
        (shape[0] * Self::rows_pitch(kind, shape)) as u32 * kind.smem_bytes()
    }

    /// Moves a 2-D tile between layouts through the start of shared memory, where the
    /// ring of pipelined loops lives (free outside them): each thread writes and reads
    /// its runs along the rows as vectors of up to 16 bytes, in padded rows. Used to
    /// store a `dot` result from its accumulator layout with 16-byte global stores, as
    /// Triton converts the MMA layout to a blocked one before a store (docs/perf.md,
    /// "The accumulator's store"). Check [`Emitter::can_convert_rows`] first.
    pub fn convert_rows(
        &mut self,
        src: &[String],
        kind: Rk,
        from: &Layout,
        to: &Layout,
    ) -> Res<Vec<String>> {
        let es = kind.smem_bytes();
        let shape = to.shape();
        let (cols, pitch) = (shape[1], Self::rows_pitch(kind, &shape));
        self.ring_scratch = self.ring_scratch.max(Self::rows_bytes(kind, &shape));
        let ring = self.ring_base();
        // Elements per vector: a thread's run along the rows, at most 16 bytes.
        let width = |l: &Layout| {
            if l.order[0] == 1 {
                l.run(1).min(16 / es as usize).max(1)
            } else {
                1
            }
        };
        let phys = |off: usize| (off / cols) * pitch + off % cols;
        self.ins("bar.sync 0");
        let a = self.rows_addr(from, es, pitch, &ring);
        let w = width(from);
        let offs = Self::lin_offsets(from);
        for g in (0..src.len()).step_by(w) {
            let at = phys(offs[g]) as u32 * es;
            // 16-bit elements go in pairs, as 32-bit words.
            let (regs, ty) = if kind == Rk::H && w >= 2 {
                (self.pack_halves(&src[g..g + w]), Rk::R.bits())
            } else {
                (src[g..g + w].to_vec(), kind.bits())
            };
            self.ins(format!(
                "st.shared{}.{ty} [{a}+{at}], {}",
                Self::vsuf(regs.len()),
                Self::regs_list(&regs)
            ));
        }
        self.ins("bar.sync 0");
        let b = self.rows_addr(to, es, pitch, &ring);
        let w = width(to);
        let offs = Self::lin_offsets(to);
        let mut out = Vec::with_capacity(offs.len());
        for g in (0..offs.len()).step_by(w) {
            let at = phys(offs[g]) as u32 * es;
            let pairs = kind == Rk::H && w >= 2;
            let (rk, n) = if pairs { (Rk::R, w / 2) } else { (kind, w) };
            let r = self.fresh_like(rk, n);
            self.ins(format!(
                "ld.shared{}.{} {}, [{b}+{at}]",
                Self::vsuf(n),
                rk.bits(),
                Self::regs_list(&r)
            ));
            if pairs {
                let h = self.fresh_like(Rk::H, w);
                self.unpack_halves(&r, &h);
                out.extend(h);
            } else {
                out.extend(r);
            }
        }
        // A pipelined loop after this one fills the ring without a barrier first.
        self.ins("bar.sync 0");
        Ok(out)
    }

    /// Shared address of the thread's first element of a 2-D layout in rows of `pitch`
    /// elements from `base`.
    fn rows_addr(&mut self, l: &Layout, es: u32, pitch: usize, base: &str) -> String {
        let c = self.coords(l);
        let a = self.reg(Rk::R);
        self.ins(format!(
            "mad.lo.u32 {a}, {}, {pitch}, {}",
            c.base[0], c.base[1]
        ));
        self.ins(format!("mad.lo.u32 {a}, {a}, {es}, {base}"));
        a
    }

    /// Shared address of the thread's first element of a layout, for `es`-byte elements.
    pub fn smem_addr(&mut self, l: &Layout, es: u32) -> String {
        let c = self.coords(l);
        let a = self.reg(Rk::R);
        self.ins(format!(
            "mad.lo.u32 {a}, {}, {es}, {}",
            c.lin, self.smem_base
        ));
        a
    }

    /// Stores one register to shared memory.
    pub fn st_shared(&mut self, kind: Rk, addr: &str, off: u32, r: &str) {
        match kind {
            Rk::P => {
                let t = self.reg(Rk::R);
                self.ins(format!("selp.u32 {t}, 1, 0, {r}"));
                self.ins(format!("st.shared.u32 [{addr}+{off}], {t}"));
            }
            _ => self.ins(format!("st.shared.{} [{addr}+{off}], {r}", kind.bits())),
        }
    }

    /// Loads one register from shared memory.
    pub fn ld_shared(&mut self, kind: Rk, addr: &str, off: u32) -> String {
        let d = self.reg(kind);
        match kind {
            Rk::P => {
                let t = self.reg(Rk::R);
                self.ins(format!("ld.shared.u32 {t}, [{addr}+{off}]"));
                self.ins(format!("setp.ne.u32 {d}, {t}, 0"));
            }
            _ => self.ins(format!("ld.shared.{} {d}, [{addr}+{off}]", kind.bits())),
        }
        d
    }

    /// Pairs of 16-bit registers as 32-bit words: the word they came from when they are
    /// its two halves in order, else a new word packing them.
    pub fn pack_halves(&mut self, h: &[String]) -> Vec<String> {
        h.chunks(2)
            .map(|pair| {
                let (lo, hi) = (&pair[0], &pair[1]);
                match (self.halves.get(lo), self.halves.get(hi)) {
                    (Some((a, false)), Some((b, true))) if a == b => a.clone(),
                    _ => {
                        let w = self.reg(Rk::R);
                        self.ins(format!("mov.b32 {w}, {{{lo}, {hi}}}"));
                        w
                    }
                }
            })
            .collect()
    }

    /// Splits 32-bit words into the 16-bit registers `h` (two per word) and records
    /// them as halves.
    pub fn unpack_halves(&mut self, words: &[String], h: &[String]) {
        for (w, pair) in words.iter().zip(h.chunks(2)) {
            self.ins(format!("mov.b32 {{{}, {}}}, {w}", pair[0], pair[1]));
            self.halves.insert(pair[0].clone(), (w.clone(), false));
            self.halves.insert(pair[1].clone(), (w.clone(), true));
        }
    }

    /// Copies registers into fresh ones (loop-carried and merged values).
    pub fn fresh_like(&mut self, kind: Rk, n: usize) -> Vec<String> {
        (0..n).map(|_| self.reg(kind)).collect()
    }

    /// `mov` of every register.
    pub fn moves(&mut self, kind: Rk, dst: &[String], src: &[String]) {
        for (d, s) in dst.iter().zip(src) {
            if d != s {
                self.ins(format!("mov.{} {d}, {s}", kind.bits()));
            }
        }
    }

    /// Computes `v` in layout `l` (or as a scalar) from its definition.
    fn compute(&mut self, v: ValueId, l: &Layout) -> Res<Vec<String>> {
        let Def::Expr(e) = &self.k.value(v).def else {
            return self.err(format!("value {v} has no registers in this scope"));
        };
        let e = e.clone();
        match &e {
            Expr::Broadcast { value, .. } => {
                let src_shape = self.k.ty(*value).shape.clone();
                let sl = l.with_shape(&src_shape);
                let regs = self.tile(*value, &sl)?;
                let index: HashMap<Vec<usize>, usize> = sl
                    .reg_offsets()
                    .into_iter()
                    .enumerate()
                    .map(|(i, o)| (o, i))
                    .collect();
                let mut out = Vec::new();
                for mut o in l.reg_offsets() {
                    for (t, &n) in src_shape.iter().enumerate() {
                        if n == 1 {
                            o[l.keep[t]] = 0;
                        }
                    }
                    out.push(regs[index[&o]].clone());
                }
                Ok(out)
            }
            Expr::ExpandDims { value, axis } => {
                if self.k.ty(*value).is_scalar() {
                    return Ok(vec![self.scalar(*value); l.nregs()]);
                }
                let mut sl = l.clone();
                sl.keep.remove(*axis);
                self.tile(*value, &sl.canon())
            }
            Expr::Splat { value, .. } => Ok(vec![self.scalar(*value); l.nregs()]),
            Expr::Arange { start, .. } => {
                let c = self.coords(l);
                let s = l.keep[0];
                let mut out = Vec::new();
                for o in l.reg_offsets() {
                    let d = self.reg(Rk::R);
                    self.ins(format!(
                        "add.s32 {d}, {}, {}",
                        c.base[s],
                        o[s] as i64 + start
                    ));
                    out.push(d);
                }
                Ok(out)
            }
            Expr::Load { ptr, mask, other } => self.load(v, *ptr, *mask, *other, Some(l)),
            Expr::Atomic {
                op,
                ptr,
                value,
                mask,
            } => self.atomic(v, *op, *ptr, *value, *mask, Some(l)),
            Expr::Reduce { op, value, axis } => self.reduce(v, *op, *value, *axis),
            Expr::Dot { a, b, acc } => self.dot(v, *a, *b, *acc, l),
            Expr::Scan { op, value, axis } => self.scan(*op, *value, *axis),
            Expr::Permute { value, dims } => {
                // The source's layout with the tile dims relabeled back.
                let mut sl = l.clone();
                for (t, &d) in dims.iter().enumerate() {
                    sl.keep[d] = l.keep[t];
                }
                self.tile(*value, &sl)
            }
            Expr::Reshape { value, .. } => self.reshape(*value, l),
            Expr::Histogram { value, bins, mask } => self.histogram(*value, *bins, *mask, l),
            Expr::ClusterGather { .. } => {
                self.err("`cluster_gather` must be at the top level of the kernel body")
            }
            _ => {
                let n = l.nregs();
                let mut ops = Vec::new();
                for o in e.operands() {
                    ops.push(self.tile(o, l)?);
                }
                let mut out = Vec::new();
                for i in 0..n {
                    let args: Vec<String> = ops.iter().map(|r| r[i].clone()).collect();
                    out.push(self.elementwise(v, &e, &args)?);
                }
                Ok(out)
            }
        }
    }

    /// The registers of a loop's carried values, holding their initial values; results
    /// alias them. Tiles of 16-bit elements are carried as packed words (half the
    /// registers across the back edge), unpacked at the loop head.
    fn loop_params(&mut self, carried: &[crate::ir::Carried]) -> Res<Vec<LoopParam>> {
        let mut params = Vec::new();
        for c in carried {
            let kind = self.rk_of(c.param);
            let (init, n) = if self.k.ty(c.param).is_scalar() {
                (vec![self.scalar(c.init)], 1)
            } else {
                let l = self.layout_of(c.param);
                (self.tile(c.init, &l)?, l.nregs())
            };
            let p = self.fresh_like(kind, n);
            let words = (kind == Rk::H && n % 2 == 0 && n > 1).then(|| {
                let w = self.fresh_like(Rk::R, n / 2);
                let packed = self.pack_halves(&init);
                self.moves(Rk::R, &w, &packed);
                w
            });
            if words.is_none() {
                self.moves(kind, &p, &init);
            }
            self.vals[c.param.index()] = Some(p.clone());
            self.vals[c.result.index()] = Some(p.clone());
            params.push((kind, p, words));
        }
        Ok(params)
    }

    /// At a loop's head: the packed carried words back into their halves.
    fn loop_unpack(&mut self, params: &[LoopParam]) {
        for (_, p, words) in params {
            if let Some(w) = words {
                self.unpack_halves(w, p);
            }
        }
    }

    /// The registers of a carried value's `next`, in the parameter's layout.
    fn carried_next(&mut self, c: &crate::ir::Carried) -> Res<Vec<String>> {
        if self.k.ty(c.param).is_scalar() {
            Ok(vec![self.scalar(c.next)])
        } else {
            let l = self.layout_of(c.param);
            self.tile(c.next, &l)
        }
    }

    /// At a loop's back edge: every `next` into its parameter.
    fn loop_back_edge(&mut self, carried: &[crate::ir::Carried], params: &[LoopParam]) -> Res<()> {
        // Parallel copy: read every `next` before overwriting any parameter.
        let mut tmps = Vec::new();
        for (c, (kind, p, words)) in carried.iter().zip(params) {
            let next = self.carried_next(c)?;
            if words.is_none() && next == *p {
                // Updated in place (a `dot` accumulating into the carried registers,
                // possibly still running): nothing to copy, nothing to touch.
                tmps.push(p.clone());
                continue;
            }
            let tmp = match words {
                Some(w) => {
                    let packed = self.pack_halves(&next);
                    let tmp = self.fresh_like(Rk::R, w.len());
                    self.moves(Rk::R, &tmp, &packed);
                    tmp
                }
                None => {
                    let tmp = self.fresh_like(*kind, p.len());
                    self.moves(*kind, &tmp, &next);
                    tmp
                }
            };
            tmps.push(tmp);
        }
        for ((kind, p, words), tmp) in params.iter().zip(&tmps) {
            match words {
                Some(w) => self.moves(Rk::R, w, tmp),
                None => self.moves(*kind, p, tmp),
            }
        }
        Ok(())
    }

    /// A `.unroll(2)` loop: the body twice, the second copy reading the first copy's
    /// `next` registers as its carried values. For a loop that prefetches (`let next =
    /// load(..); use(cur); cur = next`), emitted once, the back edge copies each
    /// prefetched tile into the carried registers, and that copy waits for the load: the
    /// prefetch lands at the end of its own iteration. Here no copy sits between the two
    /// halves, and the one at the back edge moves a tile into registers free since the
    /// first half (ptxas coalesces it away), so each load stays in flight across the
    /// other half's arithmetic. The loop head's bound check (already emitted) starts the
    /// first half; an odd trip count leaves after it.
    fn loop_unrolled(
        &mut self,
        carried: &[crate::ir::Carried],
        body: &Block,
        params: &[LoopParam],
        (idx, end, step, t): (&str, &str, &str, &str),
        (head, exit): (&str, &str),
    ) -> Res<()> {
        self.cache.push(HashMap::new());
        self.block(body)?;
        let mut firsts = Vec::new();
        for (c, (kind, p, words)) in carried.iter().zip(params) {
            let next = self.carried_next(c)?;
            if let Some(w) = words {
                // 16-bit tiles cross into the second half as 32-bit words, as they
                // cross the back edge (`bf16_tiles_stay_packed_across_loop_iterations`).
                let packed = self.pack_halves(&next);
                let wr = self.fresh_like(Rk::R, w.len());
                self.moves(Rk::R, &wr, &packed);
                let halves = self.fresh_like(Rk::H, p.len());
                self.unpack_halves(&wr, &halves);
                firsts.push(halves);
            } else if next.iter().all(|r| r.starts_with('%')) {
                firsts.push(next);
            } else {
                // An immediate: the second half reads it from a register.
                let r = self.fresh_like(*kind, next.len());
                self.moves(*kind, &r, &next);
                firsts.push(r);
            }
        }
        self.cache.pop();
        let odd = self.new_label("odd");
        self.ins(format!("add.{t} {idx}, {idx}, {step}"));
        let p = self.reg(Rk::P);
        self.ins(format!("setp.ge.{t} {p}, {idx}, {end}"));
        self.ins(format!("@{p} bra {odd}"));
        for (c, first) in carried.iter().zip(&firsts) {
            self.vals[c.param.index()] = Some(first.clone());
        }
        self.cache.push(HashMap::new());
        self.block(body)?;
        self.loop_back_edge(carried, params)?;
        self.cache.pop();
        for (c, (_, p, _)) in carried.iter().zip(params) {
            self.vals[c.param.index()] = Some(p.clone());
        }
        self.ins(format!("add.{t} {idx}, {idx}, {step}"));
        self.ins(format!("bra.uni {head}"));
        // Out after the first half: its `next` values are the loop's results (a
        // parallel copy, as a `next` may be another carried value's register).
        self.label(&odd);
        let mut tmps = Vec::new();
        for ((kind, p, words), first) in params.iter().zip(&firsts) {
            if first == p {
                tmps.push(first.clone());
                continue;
            }
            // 16-bit tiles go through their words, as at the loop's head, so that the
            // words recorded for the result's halves hold them.
            let (k, src) = match words {
                Some(_) => (Rk::R, self.pack_halves(first)),
                None => (*kind, first.clone()),
            };
            let tmp = self.fresh_like(k, src.len());
            self.moves(k, &tmp, &src);
            tmps.push(tmp);
        }
        for ((kind, p, words), tmp) in params.iter().zip(&tmps) {
            match words {
                _ if tmp == p => {}
                Some(w) => {
                    self.moves(Rk::R, w, tmp);
                    self.unpack_halves(w, p);
                }
                None => self.moves(*kind, p, tmp),
            }
        }
        self.label(exit);
        Ok(())
    }

    /// Emits the body.
    pub fn block(&mut self, b: &Block) -> Res<()> {
        let mut i = 0;
        while i < b.stmts.len() {
            if self.gather_at(&b.stmts[i]).is_some() {
                i = self.gather_group(&b.stmts, i)?;
                continue;
            }
            self.stmt(&b.stmts[i])?;
            i += 1;
        }
        Ok(())
    }

    /// The operand of a `cluster_gather` statement.
    fn gather_at(&self, s: &Stmt) -> Option<ValueId> {
        match s {
            Stmt::Let(v) => match &self.k.value(*v).def {
                Def::Expr(Expr::ClusterGather { value }) => Some(*value),
                _ => None,
            },
            _ => None,
        }
    }

    /// Emits the gathers that follow `stmts[first]` through one cluster barrier: up to
    /// the next statement that is not a `let`, every gather whose operand does not
    /// depend on an earlier one of the group joins it. Lets the group does not feed are
    /// emitted before it (values are SSA, loads have no order with gathers), the rest
    /// after. Returns the index of the first statement not emitted.
    fn gather_group(&mut self, stmts: &[Stmt], first: usize) -> Res<usize> {
        let mut fed: std::collections::HashSet<ValueId> = Default::default();
        let (mut before, mut group, mut after) = (Vec::new(), Vec::new(), Vec::new());
        let mut end = first;
        for (j, s) in stmts.iter().enumerate().skip(first) {
            let Stmt::Let(v) = s else { break };
            let Def::Expr(e) = &self.k.value(*v).def else {
                break;
            };
            let uses_group = e.operands().iter().any(|o| fed.contains(o));
            match self.gather_at(s) {
                Some(_) if uses_group => break,
                Some(value) => group.push((*v, value)),
                None if uses_group => after.push(s),
                None if e.has_side_effects() => break,
                None => before.push(s),
            }
            if uses_group || self.gather_at(s).is_some() {
                fed.insert(*v);
            }
            end = j + 1;
        }
        for s in before {
            self.stmt(s)?;
        }
        let mut slots = Vec::new();
        for &(v, value) in &group {
            self.loc = self.k.value(v).loc;
            slots.push(self.gather_write(value)?);
        }
        self.gather_barrier();
        for (&(v, value), slot) in group.iter().zip(slots) {
            self.loc = self.k.value(v).loc;
            let l = self.layout_of(v);
            let r = self.gather_read(value, slot, &l)?;
            self.vals[v.index()] = Some(r);
        }
        for s in after {
            self.stmt(s)?;
        }
        Ok(end)
    }

    fn stmt(&mut self, s: &Stmt) -> Res<()> {
        match s {
            Stmt::Let(v) => self.let_(*v),
            Stmt::WaitPriorKernels { .. } => {
                // Becomes `griddepcontrol.wait` for sm_90 (see `compile`).
                self.code.push_str(WAIT_MARKER);
                Ok(())
            }
            Stmt::LaunchDependents { .. } => {
                // Becomes `griddepcontrol.launch_dependents` for sm_90 (see `compile`).
                self.code.push_str(LAUNCH_MARKER);
                Ok(())
            }
            Stmt::Store {
                ptr,
                value,
                mask,
                loc,
            } => {
                self.loc = *loc;
                self.store(*ptr, *value, *mask)
            }
            Stmt::Prefetch { ptr, mask, loc } => {
                self.loc = *loc;
                self.prefetch(*ptr, *mask)
            }
            Stmt::PrefetchRange { ptr, count, loc } => {
                self.loc = *loc;
                self.prefetch_range(*ptr, *count)
            }
            Stmt::Flag {
                op,
                ptr,
                value,
                loc,
            } => {
                self.loc = *loc;
                self.flag(*op, *ptr, *value)
            }
            Stmt::For {
                index,
                start,
                end,
                step,
                carried,
                body,
                unroll,
                stages,
                loc,
            } => {
                self.loc = *loc;
                let ity = self.k.ty(*index).dtype().unwrap_or(crate::ir::DType::I32);
                if !ity.is_int() {
                    return self.err("loop bounds must be integers");
                }
                let t = super::regs::int_ty(ity);
                let idx = self.reg(rk(ity));
                self.vals[index.index()] = Some(vec![idx.clone()]);
                let plan = self.pipeline_plan(*index, carried, body, *stages);
                let params = self.loop_params(carried)?;
                let (head, exit) = (self.new_label("loop"), self.new_label("end"));
                let (s0, e0, st) = (self.scalar(*start), self.scalar(*end), self.scalar(*step));
                let ring = match plan {
                    Some(plan) => {
                        let regs: HashMap<ValueId, Vec<String>> = carried
                            .iter()
                            .zip(&params)
                            .map(|(c, (_, p, _))| (c.param, p.clone()))
                            .collect();
                        Some(self.pipeline_start(plan, *index, &s0, &e0, &st, &regs)?)
                    }
                    None => None,
                };
                self.ins(format!("mov.{} {idx}, {s0}", rk(ity).bits()));
                self.label(&head);
                self.loop_unpack(&params);
                let p = self.reg(Rk::P);
                self.ins(format!("setp.ge.{t} {p}, {idx}, {e0}"));
                self.ins(format!("@{p} bra {exit}"));
                if *unroll && ring.is_none() {
                    return self.loop_unrolled(
                        carried,
                        body,
                        &params,
                        (&idx, &e0, &st, t),
                        (&head, &exit),
                    );
                }
                self.cache.push(HashMap::new());
                if let Some(r) = &ring {
                    self.pipeline_iteration(r)?;
                    self.rings.push(r.clone());
                }
                self.block(body)?;
                if let Some(r) = &ring {
                    self.rings.pop();
                    self.pipeline_advance(r);
                }
                self.loop_back_edge(carried, &params)?;
                self.cache.pop();
                self.ins(format!("add.{t} {idx}, {idx}, {st}"));
                self.ins(format!("bra.uni {head}"));
                self.label(&exit);
                if let Some(r) = &ring {
                    self.pipeline_end(r);
                }
                Ok(())
            }
            Stmt::While {
                cond_body,
                cond,
                carried,
                body,
                loc,
            } => {
                self.loc = *loc;
                let params = self.loop_params(carried)?;
                let (head, exit) = (self.new_label("while"), self.new_label("wend"));
                self.label(&head);
                self.loop_unpack(&params);
                self.cache.push(HashMap::new());
                self.block(cond_body)?;
                let c = self.scalar(*cond);
                self.ins(format!("@!{c} bra {exit}"));
                self.block(body)?;
                self.loop_back_edge(carried, &params)?;
                self.cache.pop();
                self.ins(format!("bra.uni {head}"));
                self.label(&exit);
                Ok(())
            }
            Stmt::If {
                cond,
                then_body,
                else_body,
                merges,
                loc,
            } => {
                self.loc = *loc;
                let c = self.scalar(*cond);
                let (els, end) = (self.new_label("else"), self.new_label("endif"));
                let mut outs = Vec::new();
                for m in merges {
                    let kind = self.rk_of(m.result);
                    let n = if self.k.ty(m.result).is_scalar() {
                        1
                    } else {
                        self.layout_of(m.result).nregs()
                    };
                    let r = self.fresh_like(kind, n);
                    self.vals[m.result.index()] = Some(r.clone());
                    outs.push((kind, r));
                }
                self.ins(format!("@!{c} bra {els}"));
                for (which, body) in [(true, then_body), (false, else_body)] {
                    self.cache.push(HashMap::new());
                    self.block(body)?;
                    for (m, (kind, r)) in merges.iter().zip(&outs) {
                        let src = if which { m.then_value } else { m.else_value };
                        let regs = if self.k.ty(m.result).is_scalar() {
                            vec![self.scalar(src)]
                        } else {
                            let l = self.layout_of(m.result);
                            self.tile(src, &l)?
                        };
                        self.moves(*kind, r, &regs);
                    }
                    self.cache.pop();
                    if which {
                        self.ins(format!("bra.uni {end}"));
                        self.label(&els);
                    }
                }
                self.label(&end);
                Ok(())
            }
        }
    }

    fn let_(&mut self, v: ValueId) -> Res<()> {
        self.loc = self.k.value(v).loc;
        if self.in_ring(v) {
            // A `dot` operand the ring of a pipelined loop already holds.
            return Ok(());
        }
        if let Some(regs) = self.staged_read(v)? {
            // A load of a `.stages(n)` loop: this thread copied it ahead.
            self.vals[v.index()] = Some(regs);
            return Ok(());
        }
        let ty = self.k.ty(v).clone();
        if ty.is_scalar() {
            let Def::Expr(e) = &self.k.value(v).def else {
                return Ok(());
            };
            let e = e.clone();
            let r = match &e {
                Expr::Load { ptr, mask, other } => {
                    self.load(v, *ptr, *mask, *other, None)?[0].clone()
                }
                Expr::Atomic {
                    op,
                    ptr,
                    value,
                    mask,
                } => self.atomic(v, *op, *ptr, *value, *mask, None)?[0].clone(),
                Expr::Reduce { op, value, axis } => self.reduce(v, *op, *value, *axis)?[0].clone(),
                _ => {
                    let args: Vec<String> = e.operands().iter().map(|&o| self.scalar(o)).collect();
                    self.elementwise(v, &e, &args)?
                }
            };
            self.vals[v.index()] = Some(vec![r]);
            return Ok(());
        }
        if self.lay.strong[v.index()] && !self.fused.contains(&v) {
            let l = self.layout_of(v);
            let r = self.compute(v, &l)?;
            self.vals[v.index()] = Some(r);
        }
        Ok(())
    }

    /// The layout of every tile value, in value order.
    pub fn value_layouts(&self) -> Vec<super::ValueLayout> {
        self.lay
            .of
            .iter()
            .enumerate()
            .filter_map(|(i, l)| {
                let v = ValueId(i as u32);
                Some(super::ValueLayout {
                    value: v,
                    ty: self.k.ty(v).clone(),
                    loc: self.k.value(v).loc,
                    layout: l.clone()?,
                    rematerialized: !self.lay.strong[i],
                })
            })
            .collect()
    }

    /// The layouts as text, one value a line.
    pub fn report(&self) -> String {
        let mut s = String::new();
        for (i, l) in self.lay.of.iter().enumerate() {
            if let Some(l) = l {
                let v = ValueId(i as u32);
                let _ = writeln!(
                    s,
                    "{v}: {} {}{}",
                    self.k.ty(v),
                    l.describe(),
                    if self.lay.strong[i] {
                        ""
                    } else {
                        " (rematerialized)"
                    }
                );
            }
        }
        s
    }
}
