//! Distributed layouts of tile values and the pass that assigns one to every tile.
//!
//! A [`Layout`] is a blocked layout over a *space* of some rank (elements per thread,
//! threads per warp and warps per program along each space dim, plus an order) with an
//! extent per space dim, and a map from the tile's dims to space dims. Space dims that no
//! tile dim maps to have extent 1: that is how a reduction result (a slice layout) keeps
//! the parent's thread mapping, so `reduce` -> `expand_dims` -> `broadcast` moves no data.
//!
//! Thread coordinate along space dim `s`: `tc = warp_s * tpw_s + lane_s`. The thread holds
//! tile indices `(tc * spt_s) mod ext_s + r + rep * cover_s` for `r < min(spt_s, ext_s)` and
//! `rep < max(1, ext_s / cover_s)`. When the layout covers more than the extent, several
//! threads hold the same element; the owner is the one with `tc * spt_s < ext_s`.

use std::collections::HashMap;

use super::axis::AxisInfo;
use crate::error::CompileError;
use crate::ir::{Block, DType, Def, Expr, Kernel, Stmt, ValueId};

/// A blocked layout with extents, see the module docs.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Layout {
    /// Elements per thread along each space dim.
    pub spt: Vec<usize>,
    /// Threads per warp along each space dim (product 32).
    pub tpw: Vec<usize>,
    /// Warps per program along each space dim (product `num_warps`).
    pub wpc: Vec<usize>,
    /// Space dims, fastest varying first.
    pub order: Vec<usize>,
    /// Extent along each space dim (1 for dims no tile dim maps to).
    pub ext: Vec<usize>,
    /// Tile dim `t` lives on space dim `keep[t]`.
    pub keep: Vec<usize>,
}

impl Layout {
    /// Triton-like default layout for a tile shape: up to 8 contiguous elements per
    /// thread along the last dim, lanes fastest-dim first, warps slowest-dim first.
    pub fn default_for(shape: &[usize], num_warps: u32) -> Layout {
        let rank = shape.len();
        assert!(rank > 0, "scalars have no layout");
        Layout::blocked(shape, num_warps, (0..rank).rev().collect())
    }

    /// The default layout with space dims in `order` (fastest first): up to 8
    /// contiguous elements per thread along `order[0]`, lanes fastest-dim first, warps
    /// slowest-dim first. [`Layout::default_for`] is this with the last dim fastest.
    pub fn blocked(shape: &[usize], num_warps: u32, order: Vec<usize>) -> Layout {
        let rank = shape.len();
        let fast = order[0];
        let numel: usize = shape.iter().product();
        let threads = 32 * num_warps as usize;
        let mut spt = vec![1; rank];
        spt[fast] = (numel / threads).clamp(1, 8).min(shape[fast]);
        let mut tpw = vec![1; rank];
        let mut left = 32;
        for &s in &order {
            let t = left.min((shape[s] / spt[s]).max(1));
            tpw[s] = t;
            left /= t;
        }
        tpw[order[rank - 1]] *= left;
        let mut wpc = vec![1; rank];
        let mut left = num_warps as usize;
        for &s in order.iter().rev() {
            let w = left.min((shape[s] / (spt[s] * tpw[s])).max(1));
            wpc[s] = w;
            left /= w;
        }
        wpc[order[rank - 1]] *= left;
        Layout {
            spt,
            tpw,
            wpc,
            order,
            ext: shape.to_vec(),
            keep: (0..rank).collect(),
        }
    }

    /// The layout of a global access through a pointer tile with axis facts `info` to
    /// elements of `elem_bytes` bytes (Triton's coalescing): the dim along which the
    /// pointers are most contiguous goes fastest, so each thread's run is a vector access
    /// and a warp's accesses are adjacent. `None` when that is the last dim (or no dim is
    /// contiguous): the default layout already does it. Small tiles (less than one
    /// 16-byte vector per thread) and runs shorter than 8 elements keep the default too:
    /// their few accesses gain little, and the default keeps reductions along the last
    /// dim inside a warp (the sampling kernels' `[R, PB]` candidate tiles, 4 contiguous
    /// f32 along R, stay as they were).
    pub(crate) fn coalesced(
        shape: &[usize],
        num_warps: u32,
        info: &AxisInfo,
        elem_bytes: usize,
    ) -> Option<Layout> {
        let rank = shape.len();
        if rank < 2 || info.contig.len() != rank {
            return None;
        }
        let numel: usize = shape.iter().product();
        if numel * elem_bytes < 32 * num_warps as usize * 16 {
            return None;
        }
        let last = rank - 1;
        let best = (0..rank)
            .filter(|&t| shape[t] > 1)
            .max_by_key(|&t| (info.contig[t].min(shape[t] as u64), t == last))?;
        if best == last || info.contig[best] <= info.contig[last] || shape[best] < 8 {
            return None;
        }
        // The other dims keep their default (last-fastest) relative order.
        let mut order = vec![best];
        order.extend((0..rank).rev().filter(|&t| t != best));
        Some(Layout::blocked(shape, num_warps, order))
    }

    /// The accumulator layout of `mma.sync.m16n8k16` for an `[M, N]` `dot` result, or
    /// `None` when the tile is too small for `num_warps` warps to each hold whole MMA
    /// tiles.
    ///
    /// Lane `4g + t` of a 16x8 C/D fragment holds rows `g` and `g + 8`, columns `2t` and
    /// `2t + 1`: as a blocked layout, `spt = [1, 2]`, `tpw = [8, 4]`, order `[1, 0]`. With
    /// `wpc = [WM, WN]` warp `(wm, wn)` holds rows `wm * 8 + g + rep * 8 * WM` and columns
    /// `(wn * 4 + t) * 2 + r + rep * 8 * WN`; row repetitions `2i` and `2i + 1` form the
    /// fragment's two 8-row halves (the A fragment is read with `ldmatrix`, which takes
    /// any row addresses), each column repetition one 8-column MMA tile. Warps are split
    /// like Triton's `warpsPerCTA` for MMA: along the dim with more elements per warp.
    pub fn mma(shape: &[usize], num_warps: u32) -> Option<Layout> {
        let [m, n] = *shape else { return None };
        let (mut wm, mut wn) = (1usize, 1usize);
        while wm * wn < num_warps as usize {
            let (can_m, can_n) = (m >= 32 * wm, n >= 16 * wn);
            if can_m && (m / wm >= n / wn || !can_n) {
                wm *= 2;
            } else if can_n {
                wn *= 2;
            } else {
                return None;
            }
        }
        (m >= 16 * wm && n >= 8 * wn).then(|| Layout {
            spt: vec![1, 2],
            tpw: vec![8, 4],
            wpc: vec![wm, wn],
            order: vec![1, 0],
            ext: vec![m, n],
            keep: vec![0, 1],
        })
    }

    /// The accumulator layout of `wgmma.mma_async.m64nNk16` for an `[M, N]` `dot`
    /// result, or `None` when the tile does not fit its shape: `num_warps` a multiple of
    /// 4 (whole warpgroups), M a multiple of `16 * num_warps` (each warpgroup issues
    /// `m64` instructions over its own rows), N a multiple of 8 up to 256 (one `nN`
    /// instruction covers the row).
    ///
    /// It is the blocked layout of [`Layout::mma`] with every warp along M
    /// (`wpc = [num_warps, 1]`): warp `w` holds rows `w * 8 + g + rep * 8 * num_warps`,
    /// lane `4g + t` columns `2t`, `2t + 1` of every 8. A `wgmma` gives warp `wl` of a
    /// warpgroup rows `16 wl + g` and `16 wl + 8 + g` of its 64; `dot` stages A with its
    /// 8-row blocks permuted so that these are the rows the layout names (see
    /// `dot::WgmmaRows`), and no data moves.
    pub fn wgmma(shape: &[usize], num_warps: u32) -> Option<Layout> {
        let [m, n] = *shape else { return None };
        let w = num_warps as usize;
        (w % 4 == 0 && m % (16 * w) == 0 && n % 8 == 0 && (8..=256).contains(&n)).then(|| Layout {
            spt: vec![1, 2],
            tpw: vec![8, 4],
            wpc: vec![w, 1],
            order: vec![1, 0],
            ext: vec![m, n],
            keep: vec![0, 1],
        })
    }

    /// Rank of the space.
    pub fn space_rank(&self) -> usize {
        self.spt.len()
    }

    /// The tile shape.
    pub fn shape(&self) -> Vec<usize> {
        self.keep.iter().map(|&s| self.ext[s]).collect()
    }

    /// Elements covered by one pass of the whole program along space dim `s`.
    pub fn cover(&self, s: usize) -> usize {
        self.spt[s] * self.tpw[s] * self.wpc[s]
    }

    /// Distinct elements per thread along `s` in one contiguous run.
    pub fn run(&self, s: usize) -> usize {
        self.spt[s].min(self.ext[s])
    }

    /// Registers per thread along `s`.
    pub fn count(&self, s: usize) -> usize {
        self.run(s) * (self.ext[s] / self.cover(s)).max(1)
    }

    /// Registers per thread.
    pub fn nregs(&self) -> usize {
        (0..self.space_rank()).map(|s| self.count(s)).product()
    }

    /// The space offset (added to the thread's base) of every register, fastest dim
    /// innermost so that a thread's contiguous run occupies consecutive registers.
    pub fn reg_offsets(&self) -> Vec<Vec<usize>> {
        let rank = self.space_rank();
        let mut out = vec![vec![0; rank]];
        for &s in self.order.iter().rev() {
            let mut next = Vec::with_capacity(out.len() * self.count(s));
            for o in &out {
                for j in 0..self.count(s) {
                    let run = self.run(s);
                    let mut o = o.clone();
                    o[s] = j % run + (j / run) * self.cover(s);
                    next.push(o);
                }
            }
            out = next;
        }
        out
    }

    /// The layout of the result of reducing tile dim `t`.
    pub fn slice(&self, t: usize) -> Layout {
        let mut l = self.clone();
        let s = l.keep.remove(t);
        l.ext[s] = 1;
        l.canon()
    }

    /// Drops space dims that carry nothing (no tile dim, extent 1, one thread, one warp),
    /// so equal thread mappings compare equal.
    pub fn canon(self) -> Layout {
        let rank = self.space_rank();
        let live: Vec<usize> = (0..rank)
            .filter(|&s| {
                self.keep.contains(&s)
                    || self.ext[s] != 1
                    || self.spt[s] != 1
                    || self.tpw[s] != 1
                    || self.wpc[s] != 1
            })
            .collect();
        if live.len() == rank {
            return self;
        }
        let at = |s: usize| live.iter().position(|&x| x == s);
        Layout {
            spt: live.iter().map(|&s| self.spt[s]).collect(),
            tpw: live.iter().map(|&s| self.tpw[s]).collect(),
            wpc: live.iter().map(|&s| self.wpc[s]).collect(),
            ext: live.iter().map(|&s| self.ext[s]).collect(),
            order: self.order.iter().filter_map(|&s| at(s)).collect(),
            keep: self.keep.iter().map(|&s| at(s).unwrap()).collect(),
        }
    }

    /// The layout after inserting a tile dim of length 1 at `axis`.
    pub fn expand(&self, axis: usize) -> Layout {
        let mut l = self.clone();
        if let Some(s) = (0..l.space_rank()).find(|s| !l.keep.contains(s)) {
            l.keep.insert(axis, s);
        } else {
            let s = l.space_rank();
            l.spt.push(1);
            l.tpw.push(1);
            l.wpc.push(1);
            l.ext.push(1);
            l.order.push(s);
            l.keep.insert(axis, s);
        }
        l
    }

    /// The same thread mapping over another shape of the same rank.
    pub fn with_shape(&self, shape: &[usize]) -> Layout {
        let mut l = self.clone();
        for (t, &n) in shape.iter().enumerate() {
            l.ext[l.keep[t]] = n;
        }
        l
    }

    /// Bit position and width of space dim `s` in the lane id.
    pub fn lane_bits(&self, s: usize) -> (u32, u32) {
        bits_of(&self.tpw, &self.order, s)
    }

    /// Bit position and width of space dim `s` in the warp id.
    pub fn warp_bits(&self, s: usize) -> (u32, u32) {
        bits_of(&self.wpc, &self.order, s)
    }

    /// Whether some thread holds a copy of an element that another thread owns.
    pub fn replicated(&self) -> bool {
        (0..self.space_rank()).any(|s| self.spt[s] * self.tpw[s] * self.wpc[s] > self.ext[s])
    }

    /// One-line description for the layout report.
    pub fn describe(&self) -> String {
        format!(
            "blocked{{spt={:?}, tpw={:?}, wpc={:?}, order={:?}}} ext={:?} dims={:?}{}",
            self.spt,
            self.tpw,
            self.wpc,
            self.order,
            self.ext,
            self.keep,
            if self.replicated() {
                " (replicated)"
            } else {
                ""
            }
        )
    }
}

fn bits_of(per_dim: &[usize], order: &[usize], s: usize) -> (u32, u32) {
    let mut shift = 0;
    for &d in order {
        let w = per_dim[d].trailing_zeros();
        if d == s {
            return (shift, w);
        }
        shift += w;
    }
    unreachable!("dim in order")
}

/// The layout of every value: `None` for scalars.
#[derive(Clone, Debug)]
pub struct Layouts {
    /// Per value.
    pub of: Vec<Option<Layout>>,
    /// Whether the value is computed once in its layout (`true`), or is cheap to recompute
    /// in whatever layout a user needs (splats, aranges, broadcasts and their arithmetic).
    pub strong: Vec<bool>,
    /// Layouts chosen for loads from their consumers.
    pub over: HashMap<ValueId, Layout>,
    /// Whether `dot` may take the `wgmma` path (sm_90a).
    pub wgmma: bool,
}

/// Assigns a layout to every tile value.
///
/// A forward pass first; then loads that only feed (through casts, `expand_dims` and
/// broadcasts) an op laid out differently are re-laid out to match their consumer, so
/// e.g. the `x` vector of a GEMV is loaded straight into the slice of the weight tile's
/// layout instead of being moved through shared memory every iteration.
pub fn assign(k: &Kernel, ax: &[AxisInfo], wgmma: bool) -> Result<Layouts, CompileError> {
    let mut over: HashMap<ValueId, Layout> = HashMap::new();
    for _ in 0..4 {
        let mut l = Layouts {
            of: vec![None; k.values.len()],
            strong: vec![false; k.values.len()],
            over: over.clone(),
            wgmma,
        };
        block(k, ax, &k.body, &mut l)?;
        let mut found = false;
        for (i, v) in k.values.iter().enumerate() {
            let Def::Expr(e) = &v.def else { continue };
            let elementwise = matches!(
                e,
                Expr::Binary { .. }
                    | Expr::Compare { .. }
                    | Expr::Select { .. }
                    | Expr::Dot4 { .. }
                    | Expr::BytePerm { .. }
            );
            let Some(want) = l.of[i].clone().filter(|_| elementwise && l.strong[i]) else {
                continue;
            };
            for o in e.operands() {
                let (oi, shape) = (o.index(), &k.ty(o).shape);
                if *shape != want.shape() || !l.strong[oi] || l.of[oi].as_ref() == Some(&want) {
                    continue;
                }
                // Either this operand's loads follow the op's layout, or, when it cannot
                // move (a reduction's result, say), the loads among the other operands
                // follow it: `old + acc.sum(1)` then loads `old` in the sum's layout
                // instead of moving the sum through shared memory. Not where a load
                // would lose its vector width to follow a reduction's result:
                // `dot4(weights, x_words)` with the words packed by a reduction keeps
                // streaming its weights 16 bytes a thread, and the small reduced tile
                // moves instead. (An epilogue's loads still follow a `dot` accumulator,
                // as `prefill_gemm`'s residual does.)
                let loads = prefer(k, &l, o, want.clone(), true).or_else(|| {
                    let theirs = l.of[oi].clone()?;
                    let mut loads = Vec::new();
                    for other in e.operands() {
                        let x = other.index();
                        if other == o
                            || k.ty(other).is_scalar()
                            || !l.strong[x]
                            || l.of[x].as_ref() == Some(&theirs)
                        {
                            continue;
                        }
                        if k.ty(other).shape != *shape {
                            return None;
                        }
                        loads.extend(prefer(k, &l, other, theirs.clone(), false)?);
                    }
                    let narrows = from_reduction(k, o, 8)
                        && loads.iter().any(|(x, lx)| {
                            l.of[x.index()]
                                .as_ref()
                                .is_some_and(|cur| narrower_run(cur, lx))
                        });
                    (!loads.is_empty() && !narrows).then_some(loads)
                });
                for (x, lx) in loads.into_iter().flatten() {
                    if let std::collections::hash_map::Entry::Vacant(e) = over.entry(x) {
                        e.insert(lx);
                        found = true;
                    }
                }
            }
        }
        // A `dot` accumulator that starts from loaded values is loaded straight into
        // the MMA layout rather than converted through shared memory.
        let mut carried = Vec::new();
        k.body.visit(&mut |s| {
            if let Stmt::For { carried: cs, .. } = s {
                carried.extend(cs.iter().cloned());
            }
        });
        for c in carried {
            let dot = matches!(k.value(c.next).def, Def::Expr(Expr::Dot { .. }));
            let (Some(want), true) = (l.of[c.param.index()].clone(), dot) else {
                continue;
            };
            if l.of[c.init.index()].as_ref() == Some(&want) || !l.strong[c.init.index()] {
                continue;
            }
            for (x, lx) in prefer(k, &l, c.init, want, false).into_iter().flatten() {
                if let std::collections::hash_map::Entry::Vacant(e) = over.entry(x) {
                    e.insert(lx);
                    found = true;
                }
            }
        }
        if !found {
            return Ok(l);
        }
    }
    let mut l = Layouts {
        of: vec![None; k.values.len()],
        strong: vec![false; k.values.len()],
        over,
        wgmma,
    };
    block(k, ax, &k.body, &mut l)?;
    Ok(l)
}

/// Whether `v` is computed from a reduction's result by elementwise ops, casts,
/// `expand_dims` and broadcasts (at most `depth` of them).
fn from_reduction(k: &Kernel, v: ValueId, depth: usize) -> bool {
    let Def::Expr(e) = &k.value(v).def else {
        return false;
    };
    match e {
        Expr::Reduce { .. } => true,
        _ if depth == 0 => false,
        Expr::Broadcast { value, .. }
        | Expr::ExpandDims { value, .. }
        | Expr::Cast { value, .. }
        | Expr::Bitcast { value, .. } => from_reduction(k, *value, depth - 1),
        Expr::Unary { arg, .. } => from_reduction(k, *arg, depth - 1),
        Expr::Binary { .. } | Expr::Compare { .. } | Expr::Select { .. } => e
            .operands()
            .into_iter()
            .any(|o| from_reduction(k, o, depth - 1)),
        _ => false,
    }
}

/// Whether `new` gives a thread a shorter contiguous run than `cur` along the tile dim
/// `cur` holds fastest (for a load: a narrower vector access).
fn narrower_run(cur: &Layout, new: &Layout) -> bool {
    let fast = cur.order[0];
    let Some(t) = cur.keep.iter().position(|&s| s == fast) else {
        return false;
    };
    new.keep.get(t).is_some_and(|&s| new.run(s) < cur.run(fast))
}

/// The loads (and their layouts) that would make `v` come out in layout `want` for
/// free: `v` is a load, or is computed elementwise from such loads, scalars and cheap
/// values, through casts, `expand_dims` and broadcasts. E.g. a GEMV's normalized input
/// `bf16(g * bf16(x * r))` is then loaded straight into the weight tile's slice layout.
///
/// With `carried`, a loop-carried tile that a loop prefetches (its entry value and its
/// `next` both loads) is laid out like its loads: both move to `want`, so the tile is
/// carried in the layout its use needs (per-row scales prefetched beside a weight tile
/// meet its row sums without a trip through shared memory:
/// `prefetched_tiles_are_carried_in_the_layout_they_are_used_in`). Only where the op's
/// own layout asks for it: a carried tile does not follow another operand that cannot
/// move (the decode attention's cache tiles keep theirs beside the scores).
fn prefer(
    k: &Kernel,
    l: &Layouts,
    v: ValueId,
    want: Layout,
    carried: bool,
) -> Option<Vec<(ValueId, Layout)>> {
    if let (Def::Carried { .. }, true) = (&k.value(v).def, carried) {
        let c = carried_of(k, v)?;
        let is_load = |x: ValueId| matches!(k.value(x).def, Def::Expr(Expr::Load { .. }));
        return (is_load(c.init) && is_load(c.next))
            .then(|| vec![(c.init, want.clone()), (c.next, want)]);
    }
    let Def::Expr(e) = &k.value(v).def else {
        return None;
    };
    match e {
        Expr::Broadcast { value, .. } if !k.ty(*value).is_scalar() => {
            prefer(k, l, *value, want.with_shape(&k.ty(*value).shape), carried)
        }
        Expr::ExpandDims { value, axis } if !k.ty(*value).is_scalar() => {
            let mut s = want;
            s.keep.remove(*axis);
            prefer(k, l, *value, s.canon(), carried)
        }
        Expr::Cast { value, .. } | Expr::Bitcast { value, .. } => {
            prefer(k, l, *value, want, carried)
        }
        Expr::Unary { arg, .. } => prefer(k, l, *arg, want, carried),
        Expr::Load { .. } => Some(vec![(v, want)]),
        Expr::Binary { .. }
        | Expr::Compare { .. }
        | Expr::Select { .. }
        | Expr::Dot4 { .. }
        | Expr::BytePerm { .. } => {
            let shape = &k.ty(v).shape;
            let mut loads = Vec::new();
            for o in e.operands() {
                // Scalars and cheap values are recomputed in any layout.
                if k.ty(o).is_scalar() || !l.strong[o.index()] {
                    continue;
                }
                if k.ty(o).shape != *shape {
                    return None;
                }
                loads.extend(prefer(k, l, o, want.clone(), carried)?);
            }
            (!loads.is_empty()).then_some(loads)
        }
        _ => None,
    }
}

/// The loop-carried value whose parameter is `param`.
fn carried_of(k: &Kernel, param: ValueId) -> Option<crate::ir::Carried> {
    let mut found = None;
    k.body.visit(&mut |s| {
        if let Stmt::For { carried, .. } | Stmt::While { carried, .. } = s {
            found = found
                .take()
                .or_else(|| carried.iter().find(|c| c.param == param).cloned());
        }
    });
    found
}

/// Whether `dot(a, b)` can run on tensor cores with its accumulator in registers:
/// f16 or bf16 operands of one dtype and K a multiple of 16 (the result must also have an
/// MMA layout, [`Layout::mma`]).
pub fn mma_dot(k: &Kernel, a: ValueId, b: ValueId) -> bool {
    let (ta, tb) = (k.ty(a), k.ty(b));
    let half = matches!(ta.dtype(), Some(DType::F16 | DType::BF16)) && ta.dtype() == tb.dtype();
    half && ta.shape.len() == 2 && tb.shape.len() == 2 && ta.shape[1] % 16 == 0
}

/// The `wgmma` accumulator layout of `dot(a, b)` when it can run as `wgmma` (sm_90a),
/// with A in layout `la`: [`mma_dot`], A staged K-contiguous (an M-fastest A would need
/// the transposed-A form, which this lowering leaves to `mma.sync`), and a result tile
/// [`Layout::wgmma`] covers.
pub fn wgmma_dot(k: &Kernel, la: &Layout, a: ValueId, b: ValueId) -> Option<Layout> {
    if !mma_dot(k, a, b) || super::dot::Staged::of(la).transposed {
        return None;
    }
    Layout::wgmma(&[k.ty(a).shape[0], k.ty(b).shape[1]], k.num_warps)
}

fn default_of(k: &Kernel, v: ValueId) -> Option<Layout> {
    let ty = k.ty(v);
    (!ty.is_scalar()).then(|| Layout::default_for(&ty.shape, k.num_warps))
}

fn block(k: &Kernel, ax: &[AxisInfo], b: &Block, l: &mut Layouts) -> Result<(), CompileError> {
    for stmt in &b.stmts {
        match stmt {
            Stmt::Let(v) => value(k, ax, *v, l),
            Stmt::Store { .. }
            | Stmt::Prefetch { .. }
            | Stmt::PrefetchRange { .. }
            | Stmt::Flag { .. }
            | Stmt::WaitPriorKernels { .. }
            | Stmt::LaunchDependents { .. } => {}
            Stmt::For { carried, body, .. } => {
                // Loop-carried tiles starting from a cheap value (zeros) take the layout
                // their update produces, so the loop moves no data: a first pass treats
                // them as cheap, then they adopt the layout of their `next` value.
                for c in carried {
                    l.of[c.param.index()] = l.of[c.init.index()].clone().or(default_of(k, c.init));
                    l.strong[c.param.index()] = l.strong[c.init.index()];
                }
                block(k, ax, body, l)?;
                for c in carried {
                    let (p, n) = (c.param.index(), c.next.index());
                    // An accumulator updated by `dot` stays in the MMA layout even when it
                    // starts from a loaded tile (converted once, before the loop).
                    let dot = matches!(k.value(c.next).def, Def::Expr(Expr::Dot { .. }));
                    if (!l.strong[c.init.index()] || dot) && l.of[n].is_some() {
                        l.of[p] = l.of[n].clone();
                    }
                    l.strong[p] = true;
                }
                block(k, ax, body, l)?;
                for c in carried {
                    l.of[c.result.index()] = l.of[c.param.index()].clone();
                    l.strong[c.result.index()] = true;
                }
            }
            Stmt::While {
                cond_body,
                carried,
                body,
                ..
            } => {
                // As `for`, with the condition's statements in front of the body.
                for c in carried {
                    l.of[c.param.index()] = l.of[c.init.index()].clone().or(default_of(k, c.init));
                    l.strong[c.param.index()] = l.strong[c.init.index()];
                }
                block(k, ax, cond_body, l)?;
                block(k, ax, body, l)?;
                for c in carried {
                    let (p, n) = (c.param.index(), c.next.index());
                    if !l.strong[c.init.index()] && l.of[n].is_some() {
                        l.of[p] = l.of[n].clone();
                    }
                    l.strong[p] = true;
                }
                block(k, ax, cond_body, l)?;
                block(k, ax, body, l)?;
                for c in carried {
                    l.of[c.result.index()] = l.of[c.param.index()].clone();
                    l.strong[c.result.index()] = true;
                }
            }
            Stmt::If {
                then_body,
                else_body,
                merges,
                ..
            } => {
                block(k, ax, then_body, l)?;
                block(k, ax, else_body, l)?;
                for m in merges {
                    let pick = if l.strong[m.then_value.index()] {
                        m.then_value
                    } else {
                        m.else_value
                    };
                    l.of[m.result.index()] = l.of[pick.index()].clone();
                    l.strong[m.result.index()] = true;
                }
            }
        }
    }
    Ok(())
}

fn value(k: &Kernel, ax: &[AxisInfo], v: ValueId, l: &mut Layouts) {
    let i = v.index();
    if k.ty(v).is_scalar() {
        return;
    }
    let shape = k.ty(v).shape.clone();
    let Def::Expr(e) = &k.value(v).def else {
        l.of[i] = default_of(k, v);
        l.strong[i] = true;
        return;
    };
    let strong_of = |l: &Layouts, x: ValueId| l.strong[x.index()] && l.of[x.index()].is_some();
    let (lay, strong) = match e {
        Expr::Broadcast { value, .. } if strong_of(l, *value) => (
            l.of[value.index()].as_ref().unwrap().with_shape(&shape),
            true,
        ),
        Expr::ExpandDims { value, axis } if strong_of(l, *value) => {
            (l.of[value.index()].as_ref().unwrap().expand(*axis), true)
        }
        Expr::Load { .. } if l.over.contains_key(&v) => (l.over[&v].clone(), true),
        Expr::Reduce { value, axis, .. } => {
            let src = l.of[value.index()]
                .clone()
                .or(default_of(k, *value))
                .unwrap();
            (src.slice(*axis), true)
        }
        // A scan leaves every element where the source has it.
        Expr::Scan { value, .. } => (
            l.of[value.index()]
                .clone()
                .or(default_of(k, *value))
                .unwrap(),
            true,
        ),
        // A permutation relabels the source's tile dims: no data moves.
        Expr::Permute { value, dims } if strong_of(l, *value) => {
            let src = l.of[value.index()].as_ref().unwrap();
            let mut p = src.clone();
            p.keep = dims.iter().map(|&d| src.keep[d]).collect();
            (p, true)
        }
        Expr::Reshape { .. } | Expr::Histogram { .. } => {
            (Layout::default_for(&shape, k.num_warps), true)
        }
        Expr::Unary { .. }
        | Expr::Rand { .. }
        | Expr::Binary { .. }
        | Expr::Compare { .. }
        | Expr::Select { .. }
        | Expr::Dot4 { .. }
        | Expr::BytePerm { .. }
        | Expr::Cast { .. }
        | Expr::Bitcast { .. }
        | Expr::AddPtr { .. }
        | Expr::Load { .. }
        | Expr::Atomic { .. } => {
            let anchor = e
                .operands()
                .into_iter()
                .find(|&o| strong_of(l, o) && k.ty(o).shape == shape);
            let forced = matches!(e, Expr::Load { .. } | Expr::Atomic { .. });
            // A load that no operand lays out is coalesced along its pointers'
            // most contiguous dim.
            let coalesced = match e {
                Expr::Load { ptr, .. } => k.ty(*ptr).pointee().and_then(|d| {
                    Layout::coalesced(&shape, k.num_warps, &ax[ptr.index()], d.size_bytes())
                }),
                _ => None,
            };
            match (anchor, coalesced) {
                (Some(o), _) => (l.of[o.index()].clone().unwrap(), true),
                (None, Some(c)) => (c, true),
                (None, None) => (Layout::default_for(&shape, k.num_warps), forced),
            }
        }
        Expr::Dot { a, b, .. } => {
            let wgmma = match &l.of[a.index()] {
                Some(la) if l.wgmma => wgmma_dot(k, la, *a, *b),
                _ => None,
            };
            let lay = wgmma.or_else(|| {
                mma_dot(k, *a, *b)
                    .then(|| Layout::mma(&shape, k.num_warps))
                    .flatten()
            });
            (
                lay.unwrap_or_else(|| Layout::default_for(&shape, k.num_warps)),
                true,
            )
        }
        Expr::ClusterGather { .. } => (Layout::default_for(&shape, k.num_warps), true),
        _ => (Layout::default_for(&shape, k.num_warps), false),
    };
    l.of[i] = Some(lay);
    l.strong[i] = strong;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_layouts_cover_the_tile() {
        let l = Layout::default_for(&[1024], 4);
        assert_eq!((l.spt[0], l.tpw[0], l.wpc[0]), (8, 32, 4));
        assert_eq!(l.nregs(), 8);
        let l = Layout::default_for(&[4, 256], 4);
        assert_eq!(l.spt, vec![1, 8]);
        assert_eq!(l.tpw, vec![1, 32]);
        assert_eq!(l.wpc, vec![4, 1]);
        let l = Layout::default_for(&[16], 4);
        assert!(l.replicated());
        assert_eq!(l.nregs(), 1);
        let s = Layout::default_for(&[32, 128], 4).slice(1);
        assert_eq!(s.shape(), vec![32]);
        let e = s.expand(1);
        assert_eq!(e, Layout::default_for(&[32, 128], 4).with_shape(&[32, 1]));
    }
}
