//! `dot`. f16/bf16 operands with K a multiple of 16 whose result has an MMA layout
//! ([`Layout::mma`], chosen by the layout pass) run on tensor cores with the accumulator
//! in registers: the operands go to shared memory with vector stores in an XOR-swizzled
//! layout, each warp reads its fragments with `ldmatrix` (`.trans` for B) and issues
//! `mma.sync.m16n8k16` into the result's registers; nothing of the accumulator touches
//! shared memory, so `acc = dot(a, b, acc)` in a loop keeps it in registers throughout.
//! Smaller f16/bf16 tiles (fewer MMA tiles than warps) use tensor cores through shared
//! memory, one 16x8 output tile per warp at a time; everything else goes to shared memory
//! as f32 and each thread accumulates its output elements with FMAs in a loop over K.

use std::collections::btree_map::Entry;

use super::emit::{Emitter, Res};
use super::layout::Layout;
use super::regs::{f32_imm, Rk};
use crate::ir::{DType, Def, Expr, ValueId};

impl Emitter<'_> {
    /// `a @ b (+ acc)` in the output layout `l` (f32).
    pub fn dot(
        &mut self,
        _v: ValueId,
        a: ValueId,
        b: ValueId,
        acc: Option<ValueId>,
        l: &Layout,
    ) -> Res<Vec<String>> {
        let (ta, tb) = (self.k.ty(a).clone(), self.k.ty(b).clone());
        let (Some(da), Some(db)) = (ta.dtype(), tb.dtype()) else {
            return self.err("dot operands must be value tiles");
        };
        if ta.shape.len() != 2 || tb.shape.len() != 2 {
            return self.err(format!("dot needs 2-D tiles, not {ta} and {tb}"));
        }
        let (m, kk, n) = (ta.shape[0], ta.shape[1], tb.shape[1]);
        let half = da == db && matches!(da, DType::F16 | DType::BF16);
        match self.dot_operands(_v) {
            Some([Operand::WgmmaA(rows), _]) => {
                return self.dot_wgmma(_v, [a, b], acc, l, rows);
            }
            Some(_) => return self.dot_mma_regs(da, a, b, acc, l),
            None => {}
        }
        if half && m % 16 == 0 && n % 8 == 0 && kk % 16 == 0 {
            let need = ((m * kk + kk * n) * 2).next_multiple_of(16) + m * n * 4;
            if need <= super::STATIC_SHARED_LIMIT as usize {
                return self.dot_mma(da, a, b, acc, l);
            }
        }
        let b_at = (m * kk * 4) as u32;
        self.need_smem(b_at + (kk * n * 4) as u32)?;
        let (la, lb) = (self.layout_of(a), self.layout_of(b));
        let ra = self.tile(a, &la)?;
        let rb = self.tile(b, &lb)?;
        let init = match acc {
            Some(c) => self.tile(c, l)?,
            None => Vec::new(),
        };
        let pa = self.smem_addr(&la, 4);
        let pb = self.smem_addr(&lb, 4);
        self.ins("bar.sync 0");
        for (r, off) in ra.iter().zip(Self::lin_offsets(&la)) {
            let x = self.cast(da, DType::F32, r)?;
            self.ins(format!("st.shared.f32 [{pa}+{}], {x}", off * 4));
        }
        for (r, off) in rb.iter().zip(Self::lin_offsets(&lb)) {
            let x = self.cast(db, DType::F32, r)?;
            self.ins(format!(
                "st.shared.f32 [{pb}+{}], {x}",
                b_at as usize + off * 4
            ));
        }
        self.ins("bar.sync 0");
        let offs = l.reg_offsets();
        let c = self.coords(l);
        let out: Vec<String> = (0..offs.len()).map(|_| self.reg(Rk::F)).collect();
        for (i, d) in out.iter().enumerate() {
            match init.get(i) {
                Some(x) => self.ins(format!("mov.f32 {d}, {x}")),
                None => self.ins(format!("mov.f32 {d}, {}", f32_imm(0.0))),
            }
        }
        // Row pointer into A (advances by one column) and column pointer into B (one row).
        let (ka, kb, kc) = (self.reg(Rk::R), self.reg(Rk::R), self.reg(Rk::R));
        self.ins(format!(
            "mul.lo.u32 {ka}, {}, {}",
            c.base[l.keep[0]],
            kk * 4
        ));
        self.ins(format!("add.u32 {ka}, {ka}, {}", self.smem_base));
        self.ins(format!("shl.b32 {kb}, {}, 2", c.base[l.keep[1]]));
        self.ins(format!("add.u32 {kb}, {kb}, {}", self.smem_base));
        self.ins(format!("mov.u32 {kc}, 0"));
        let head = self.new_label("dot");
        self.label(&head);
        let mut rows = std::collections::BTreeMap::new();
        let mut cols = std::collections::BTreeMap::new();
        for o in &offs {
            let (r, cidx) = (o[l.keep[0]], o[l.keep[1]]);
            if let Entry::Vacant(e) = rows.entry(r) {
                e.insert(self.ld_shared(Rk::F, &ka, (r * kk * 4) as u32));
            }
            if let Entry::Vacant(e) = cols.entry(cidx) {
                e.insert(self.ld_shared(Rk::F, &kb, b_at + (cidx * 4) as u32));
            }
        }
        for (o, d) in offs.iter().zip(&out) {
            let (x, y) = (&rows[&o[l.keep[0]]], &cols[&o[l.keep[1]]]);
            self.ins(format!("fma.rn.f32 {d}, {x}, {y}, {d}"));
        }
        self.ins(format!("add.u32 {ka}, {ka}, 4"));
        self.ins(format!("add.u32 {kb}, {kb}, {}", n * 4));
        self.ins(format!("add.u32 {kc}, {kc}, 1"));
        let p = self.reg(Rk::P);
        self.ins(format!("setp.lt.u32 {p}, {kc}, {kk}"));
        self.ins(format!("@{p} bra.uni {head}"));
        Ok(out)
    }
}

/// The XOR swizzle of a row-major tile of 16-bit elements in shared memory: 16-byte
/// chunk `c` of row `r` is stored at chunk `c ^ ((r / rows_per_line) % chunks)`, so the
/// eight rows an `ldmatrix` reads at one logical chunk fall in eight distinct 16-byte
/// bank groups (rows of up to 128 bytes share a 128-byte line; `rows_per_line * chunks`
/// is 8, so the swizzle of row `r` depends on `r % 8` only).
pub(super) struct Swizzle {
    /// Bytes per row (per panel row when `panel_bytes` is not 0).
    row_bytes: u32,
    /// log2 of the rows sharing one 128-byte line.
    line_shift: u32,
    /// Chunks the XOR spans, minus one (a mask).
    chunk_mask: u32,
    /// For `wgmma`: rows wider than 128 bytes are split into panels of 64 columns
    /// (128 bytes a row), each stored whole before the next, this many bytes apart;
    /// 0 when the rows are stored whole.
    panel_bytes: u32,
}

impl Swizzle {
    pub(super) fn new(cols: usize) -> Swizzle {
        let row_bytes = (cols * 2) as u32;
        let chunks = (row_bytes / 16).clamp(1, 8);
        Swizzle {
            row_bytes,
            line_shift: (128 / row_bytes).max(1).trailing_zeros(),
            chunk_mask: chunks - 1,
            panel_bytes: 0,
        }
    }

    /// The layout `wgmma` reads through a matrix descriptor: rows of up to 128 bytes
    /// (wider ones in 64-column panels of `rows` rows), with the 128-, 64- or 32-byte
    /// swizzle mode whose width is the row's. Those modes XOR 16-byte chunk bits
    /// `[4, 4 + log2(width / 16))` of the shared address with bits `[7, ...)`, which for
    /// such rows is exactly [`Swizzle::new`]'s pattern; the tile must start 1024-byte
    /// aligned.
    pub(super) fn wgmma(cols: usize, rows: usize) -> Swizzle {
        let mut sw = Swizzle::new(cols.min(64));
        if cols > 64 {
            sw.panel_bytes = (rows * 128) as u32;
        }
        sw
    }

    /// Bytes of a stored row (of a panel's row, for panels).
    pub(super) fn row_bytes(&self) -> u32 {
        self.row_bytes
    }

    /// Bytes from one 64-column panel to the next; 0 when rows are stored whole.
    pub(super) fn panel_bytes(&self) -> u32 {
        self.panel_bytes
    }

    /// The descriptor's swizzle-mode field for these rows (1: 128 B, 2: 64 B, 3: 32 B).
    fn wgmma_mode(&self) -> u64 {
        match self.row_bytes {
            128 => 1,
            64 => 2,
            _ => 3,
        }
    }
}

/// Where A's rows go for `wgmma`: warpgroup `gi` issues `m64` instructions
/// `mi = 0 .. 2^per_group_log2` over shared rows `64 * (gi * MI + mi) ..`, and warp `wl`
/// of it gets rows `16 wl + 8 h + g` of each, while the accumulator layout
/// ([`Layout::wgmma`]) names logical row `(4 gi + wl) * 8 + g + (2 mi + h) * 8 * W`
/// for that register. So logical 8-row block `wl | gi << 2 | h << (2 + G) | mi << (3 + G)`
/// is stored as block `h | wl << 1 | mi << 3 | gi << (3 + MI)` (bit fields, log2 sizes
/// `G`, `MI`); rows inside a block keep their order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct WgmmaRows {
    /// log2 of the warpgroups.
    groups_log2: u32,
    /// log2 of the `m64` instructions per warpgroup.
    per_group_log2: u32,
}

impl WgmmaRows {
    pub(super) fn new(m: usize, num_warps: u32) -> WgmmaRows {
        let groups = num_warps as usize / 4;
        WgmmaRows {
            groups_log2: groups.trailing_zeros(),
            per_group_log2: (m / (64 * groups)).trailing_zeros(),
        }
    }

    fn groups(&self) -> usize {
        1 << self.groups_log2
    }

    /// log2 of the warpgroups.
    pub(super) fn groups_log2(&self) -> u32 {
        self.groups_log2
    }

    /// log2 of the `m64` instructions per warpgroup.
    pub(super) fn per_group_log2(&self) -> u32 {
        self.per_group_log2
    }

    /// The stored 8-row block of logical 8-row block `block` (the permutation above).
    pub(super) fn stored_block(&self, block: u32) -> u32 {
        let (g, mi_bits) = (self.groups_log2, self.per_group_log2);
        let wl = block & 3;
        let gi = (block >> 2) & ((1 << g) - 1);
        let h = (block >> (2 + g)) & 1;
        let mi = block >> (3 + g);
        h | (wl << 1) | (mi << 3) | (gi << (3 + mi_bits))
    }

    fn per_group(&self) -> usize {
        1 << self.per_group_log2
    }
}

/// How a tensor-core `dot` reads an operand from shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Operand {
    /// `ldmatrix` fragments for `mma.sync`.
    Mma,
    /// A of `wgmma` (through a descriptor), rows permuted as [`WgmmaRows`] says.
    WgmmaA(WgmmaRows),
    /// B of `wgmma` (through a descriptor).
    WgmmaB,
}

/// How a `dot` operand sits in shared memory: its logical `[rows, cols]` tile stored
/// row-major and swizzled, either as is or transposed (as `[cols, rows]`), whichever makes
/// the fastest dim of the operand's layout the stored row. Each thread's contiguous run
/// then goes in with one vector store (or `cp.async`), and `dot` reads fragments with
/// `ldmatrix`, adding `.trans` where the stored orientation is not the fragment's: for A
/// when it is stored transposed (M fastest), for B when it is not (N fastest; B from an
/// `[N, K]` row-major weight, K fastest, is read without `.trans`).
pub(super) struct Staged {
    /// Stored as `[cols, rows]`.
    pub transposed: bool,
    /// The swizzle of the stored rows.
    pub sw: Swizzle,
    /// For `wgmma`'s A: the row permutation.
    pub rows: Option<WgmmaRows>,
}

impl Staged {
    /// The orientation for an operand in layout `l`.
    pub(super) fn of(l: &Layout) -> Staged {
        let shape = l.shape();
        let transposed = l.order[0] == l.keep[0] && shape[0] > 1;
        let stored_cols = if transposed { shape[0] } else { shape[1] };
        Staged {
            transposed,
            sw: Swizzle::new(stored_cols),
            rows: None,
        }
    }

    /// The staging of an operand in layout `l` that a `dot` reads as `op`.
    pub(super) fn for_operand(l: &Layout, op: Operand) -> Staged {
        let mut st = Staged::of(l);
        if op != Operand::Mma {
            let shape = l.shape();
            let (rows, cols) = if st.transposed {
                (shape[1], shape[0])
            } else {
                (shape[0], shape[1])
            };
            st.sw = Swizzle::wgmma(cols, rows);
        }
        if let Operand::WgmmaA(r) = op {
            st.rows = Some(r);
        }
        st
    }

    /// Elements each vector store writes: the thread's run along the stored row (at
    /// most 16 bytes), or 1 when its run lies across stored rows.
    pub(super) fn width(&self, l: &Layout) -> usize {
        let along = if self.transposed {
            l.keep[0]
        } else {
            l.keep[1]
        };
        if l.order[0] == along {
            l.run(along).min(8)
        } else {
            1
        }
    }
}

impl Emitter<'_> {
    /// The shared address of logical element `(row, col)` of an operand staged as `st`
    /// at shared address `base` (the caller adds the operand's offset).
    pub(super) fn staged_addr(&mut self, base: &str, st: &Staged, row: &str, col: &str) -> String {
        if let (Some(p), false) = (st.rows, st.transposed) {
            let row = self.wgmma_row(p, row);
            return self.swizzled_addr_from(base, &st.sw, &row, col);
        }
        if st.transposed {
            self.swizzled_addr_from(base, &st.sw, col, row)
        } else {
            self.swizzled_addr_from(base, &st.sw, row, col)
        }
    }

    /// The shared address of element `(row, col)` of a swizzled tile at the shared
    /// address in register `base` (the caller adds the tile's offset).
    pub(super) fn swizzled_addr_from(
        &mut self,
        base: &str,
        sw: &Swizzle,
        row: &str,
        col: &str,
    ) -> String {
        self.swizzled = true;
        let (col, panel) = if sw.panel_bytes > 0 {
            let (c, p) = (self.reg(Rk::R), self.reg(Rk::R));
            self.ins(format!("and.b32 {c}, {col}, 63"));
            self.ins(format!("shr.u32 {p}, {col}, 6"));
            (c, Some(p))
        } else {
            (col.to_string(), None)
        };
        let col = col.as_str();
        let (s, ch, wi, a) = (
            self.reg(Rk::R),
            self.reg(Rk::R),
            self.reg(Rk::R),
            self.reg(Rk::R),
        );
        self.ins(format!("shr.u32 {s}, {row}, {}", sw.line_shift));
        self.ins(format!("and.b32 {s}, {s}, {}", sw.chunk_mask));
        self.ins(format!("shr.u32 {ch}, {col}, 3"));
        self.ins(format!("xor.b32 {ch}, {ch}, {s}"));
        self.ins(format!("and.b32 {wi}, {col}, 7"));
        // The lane's offset first, the base last: the offset does not change from one
        // loop iteration to the next (ptxas hoists it) while a ring's base does.
        self.ins(format!("mul.lo.u32 {a}, {row}, {}", sw.row_bytes));
        self.ins(format!("mad.lo.u32 {a}, {ch}, 16, {a}"));
        self.ins(format!("mad.lo.u32 {a}, {wi}, 2, {a}"));
        if let Some(p) = panel {
            self.ins(format!("mad.lo.u32 {a}, {p}, {}, {a}", sw.panel_bytes));
        }
        self.ins(format!("add.u32 {a}, {a}, {base}"));
        a
    }

    /// The shared row of A's logical row `row` for `wgmma` (see [`WgmmaRows`]).
    fn wgmma_row(&mut self, p: WgmmaRows, row: &str) -> String {
        let g = p.groups_log2;
        let field = |e: &mut Self, pos: u32, len: u32| {
            let r = e.reg(Rk::R);
            e.ins(format!("bfe.u32 {r}, {row}, {pos}, {len}"));
            r
        };
        // Bit fields of the logical row: g (3), wl (2), gi (G), h (1), mi (the rest).
        let out = field(self, 0, 3);
        let wl = field(self, 3, 2);
        let h = field(self, 5 + g, 1);
        let mi = self.reg(Rk::R);
        self.ins(format!("shr.u32 {mi}, {row}, {}", 6 + g));
        self.ins(format!("mad.lo.u32 {out}, {h}, 8, {out}"));
        self.ins(format!("mad.lo.u32 {out}, {wl}, 16, {out}"));
        self.ins(format!("mad.lo.u32 {out}, {mi}, 64, {out}"));
        if g > 0 {
            let gi = field(self, 5, g);
            self.ins(format!(
                "mad.lo.u32 {out}, {gi}, {}, {out}",
                64 << p.per_group_log2
            ));
        }
        out
    }

    /// `base + off` in a new register.
    pub(super) fn plus(&mut self, base: &str, off: usize) -> String {
        let r = self.reg(Rk::R);
        self.ins(format!("add.u32 {r}, {base}, {off}"));
        r
    }

    /// Stores the 2-D 16-bit tile `v` (in its own layout) into shared memory at byte
    /// offset `at`, oriented and swizzled as [`Staged::of`] its layout says, with up to
    /// 16-byte vector stores (a thread's contiguous run). Copies of replicated elements
    /// are stored by their owner only.
    fn stage_swizzled(&mut self, v: ValueId, at: u32, op: Operand) -> Res<()> {
        let l = self.layout_of(v);
        let regs = self.tile(v, &l)?;
        let st = Staged::for_operand(&l, op);
        let (sr, sc) = (l.keep[0], l.keep[1]);
        let c = self.coords(&l);
        let at_pred = c.owner.as_ref().map_or(String::new(), |p| format!("@{p} "));
        let w = st.width(&l);
        let offs = l.reg_offsets();
        let base = self.smem_base.clone();
        for g in (0..regs.len()).step_by(w) {
            let row = self.plus(&c.base[sr], offs[g][sr]);
            let col = self.plus(&c.base[sc], offs[g][sc]);
            let addr = self.staged_addr(&base, &st, &row, &col);
            if w >= 2 {
                let words = self.pack_halves(&regs[g..g + w]);
                let (vs, list) = match words.len() {
                    1 => (String::new(), words[0].clone()),
                    n => (format!(".v{n}"), format!("{{{}}}", words.join(", "))),
                };
                self.ins(format!("{at_pred}st.shared{vs}.b32 [{addr}+{at}], {list}"));
            } else {
                self.ins(format!("{at_pred}st.shared.b16 [{addr}+{at}], {}", regs[g]));
            }
        }
        Ok(())
    }

    /// How the tensor-core `dot` `d` reads its operands `[a, b]`, or `None` when it
    /// does not run on tensor cores with the accumulator in registers: `wgmma` where the
    /// target has it and [`super::layout::wgmma_dot`] gave `d` its layout, `mma.sync`
    /// where `d` has the MMA layout.
    pub(super) fn dot_operands(&self, d: ValueId) -> Option<[Operand; 2]> {
        let Def::Expr(Expr::Dot { a, b, .. }) = &self.k.value(d).def else {
            return None;
        };
        let (k, l) = (self.k, self.layout_of(d));
        let shape = &k.ty(d).shape;
        if self.target.wgmma()
            && super::layout::wgmma_dot(k, &self.layout_of(*a), *a, *b).as_ref() == Some(&l)
        {
            let rows = WgmmaRows::new(shape[0], k.num_warps);
            return Some([Operand::WgmmaA(rows), Operand::WgmmaB]);
        }
        (super::layout::mma_dot(k, *a, *b) && Layout::mma(shape, k.num_warps) == Some(l))
            .then_some([Operand::Mma, Operand::Mma])
    }

    /// Tensor-core `dot` on Hopper: `wgmma.mma_async` with both operands read from
    /// shared memory through matrix descriptors, the accumulator in registers in the
    /// layout `l` ([`Layout::wgmma`]). Each warpgroup computes its `64 * MI` rows of the
    /// result, all N columns, one `m64nNk16` instruction per 64 rows and 16 of K; the
    /// group is committed and waited for before the result is used (the next stage's
    /// copies, issued before the `dot`, are in flight meanwhile).
    fn dot_wgmma(
        &mut self,
        d: ValueId,
        [a, b]: [ValueId; 2],
        acc: Option<ValueId>,
        l: &Layout,
        rows: WgmmaRows,
    ) -> Res<Vec<String>> {
        let dt = self.k.ty(a).dtype().unwrap_or(DType::BF16);
        let running = self.async_dot(d);
        let (m, kk) = (self.k.ty(a).shape[0], self.k.ty(a).shape[1]);
        let n = self.k.ty(b).shape[1];
        let init = match acc {
            Some(c) => Some(self.tile(c, l)?),
            None => None,
        };
        let (sa, sb) = (
            Staged::for_operand(&self.layout_of(a), Operand::WgmmaA(rows)),
            Staged::for_operand(&self.layout_of(b), Operand::WgmmaB),
        );
        self.wgmma_used = true;
        let (base, a_at, b_at) = match (self.ring_operand(a), self.ring_operand(b)) {
            (Some((base, a_at)), Some((_, b_at))) => (base, a_at as usize, b_at as usize),
            _ => {
                let b_at = (m * kk * 2).next_multiple_of(1024);
                self.need_smem((b_at + kk * n * 2) as u32)?;
                self.ins("bar.sync 0");
                self.stage_swizzled(a, 0, Operand::WgmmaA(rows))?;
                self.stage_swizzled(b, b_at as u32, Operand::WgmmaB)?;
                // The tensor cores read through the async proxy: order the stores first.
                self.ins("fence.proxy.async.shared::cta");
                self.ins("bar.sync 0");
                (self.smem_base.clone(), 0, b_at)
            }
        };
        let per_group = rows.per_group();
        debug_assert_eq!(m, 64 * per_group * rows.groups());
        // Descriptor fields. A is stored `[m, kk]` (K contiguous); B `[n, kk]` (K-major)
        // when staged transposed, else `[kk, n]` (N-major, `imm-trans-b` 1).
        let a_row = sa.sw.row_bytes as usize;
        let desc_hi = |sw: &Swizzle, sbo: usize| (sbo as u64 >> 4) | (sw.wgmma_mode() << 30);
        let a_hi_bits = desc_hi(&sa.sw, 8 * a_row);
        let a_lbo = 1u64;
        let (b_row, b_hi_bits, b_lbo, trans_b) = if sb.transposed {
            let r = sb.sw.row_bytes as usize;
            (r, desc_hi(&sb.sw, 8 * r), 1u64, 0)
        } else {
            let r = sb.sw.row_bytes as usize;
            let lbo = (sb.sw.panel_bytes as u64).max(16) >> 4;
            (r, desc_hi(&sb.sw, 8 * r), lbo, 1)
        };
        // Byte offset of K step `ks` inside a K-contiguous tile of `row`-byte rows
        // (panels of `panel` bytes when wider than 128 bytes).
        let k_off = |ks: usize, row: usize, panel: usize| {
            let per = row / 2;
            (ks * 16 / per) * panel + (ks * 16 % per) * 2
        };
        // The warpgroup's first A row, and each descriptor's low word (the start address
        // over 16, the leading byte offset over 16 at bit 16).
        let r = |e: &mut Self| e.reg(Rk::R);
        let (gi, a_lo, b_lo) = (r(self), r(self), r(self));
        self.ins(format!("shr.u32 {gi}, {}, 2", self.warp_reg()));
        self.ins(format!("add.u32 {a_lo}, {base}, {a_at}"));
        self.ins(format!(
            "mad.lo.u32 {a_lo}, {gi}, {}, {a_lo}",
            64 * per_group * a_row
        ));
        self.ins(format!("add.u32 {b_lo}, {base}, {b_at}"));
        for (lo, lbo) in [(&a_lo, a_lbo), (&b_lo, b_lbo)] {
            self.ins(format!("shr.u32 {lo}, {lo}, 4"));
            self.ins(format!("and.b32 {lo}, {lo}, 16383"));
            self.ins(format!("or.b32 {lo}, {lo}, {}", lbo << 16));
        }
        let (a_hi, b_hi) = (r(self), r(self));
        self.ins(format!("mov.b32 {a_hi}, {a_hi_bits}"));
        self.ins(format!("mov.b32 {b_hi}, {b_hi_bits}"));
        let desc = |e: &mut Self, lo: &str, off: usize, hi: &str| {
            let (w, d) = (e.reg(Rk::R), e.reg(Rk::D));
            e.ins(format!("add.u32 {w}, {lo}, {}", off >> 4));
            e.ins(format!("mov.b64 {d}, {{{w}, {hi}}}"));
            d
        };
        let out: Vec<String> = match (&init, running) {
            // In place: the carried registers, which the group still running from the
            // previous iteration accumulates into (wgmma orders the two).
            (Some(init), true) => init.clone(),
            _ => (0..l.nregs()).map(|_| self.reg(Rk::F)).collect(),
        };
        match &init {
            Some(init) => self.moves(Rk::F, &out, init),
            None => {
                for d in &out {
                    self.ins(format!("mov.f32 {d}, {}", f32_imm(0.0)));
                }
            }
        }
        let ty = if dt == DType::BF16 { "bf16" } else { "f16" };
        let on = self.reg(Rk::P);
        self.ins(format!("setp.eq.u32 {on}, 0, 0"));
        self.ins("wgmma.fence.sync.aligned");
        let a_panel = m * 128;
        for ks in 0..kk / 16 {
            let b_off = if sb.transposed {
                k_off(ks, b_row, n * 128)
            } else {
                ks * 16 * b_row
            };
            let db = desc(self, &b_lo, b_off, &b_hi);
            for mi in 0..per_group {
                let da = desc(
                    self,
                    &a_lo,
                    k_off(ks, a_row, a_panel) + mi * 64 * a_row,
                    &a_hi,
                );
                // Register `j` of the instruction: row half `(j % 4) / 2`, columns
                // `8 (j / 4) + 2t + j % 2`; in `l`, row repetition `2 mi + half`.
                let regs: Vec<&str> = (0..n / 2)
                    .map(|j| {
                        let rep = 2 * mi + (j % 4) / 2;
                        out[rep * (n / 4) + (j / 4) * 2 + j % 2].as_str()
                    })
                    .collect();
                self.ins(format!(
                    "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ty}.{ty} {{{}}}, {da}, {db}, {on}, 1, 1, 0, {trans_b}",
                    regs.join(", ")
                ));
            }
        }
        self.ins("wgmma.commit_group.sync.aligned");
        // A running dot leaves its group in flight (the loop's exit waits for it); the
        // previous iteration's group is done after this, so its stage may be refilled.
        let pending = if running { 1 } else { 0 };
        self.ins(format!("wgmma.wait_group.sync.aligned {pending}"));
        if running {
            self.pipeline_late(d)?;
        }
        Ok(out)
    }

    /// Tensor-core `dot` with the accumulator in registers, in the MMA layout `l` (see
    /// [`Layout::mma`] for which registers form which fragment).
    fn dot_mma_regs(
        &mut self,
        dt: DType,
        a: ValueId,
        b: ValueId,
        acc: Option<ValueId>,
        l: &Layout,
    ) -> Res<Vec<String>> {
        let (m, kk) = (self.k.ty(a).shape[0], self.k.ty(a).shape[1]);
        let n = self.k.ty(b).shape[1];
        let (wm, wn) = (l.wpc[0], l.wpc[1]);
        let init = match acc {
            Some(c) => Some(self.tile(c, l)?),
            None => None,
        };
        // Both paths lay the operands out as `Staged::of` their layouts says.
        let (sa, sb) = (
            Staged::of(&self.layout_of(a)),
            Staged::of(&self.layout_of(b)),
        );
        let (base, a_at, b_at) = match (self.ring_operand(a), self.ring_operand(b)) {
            // Pipelined: the copies are in the ring, behind the loop's barrier.
            (Some((base, a_at)), Some((_, b_at))) => (base, a_at as usize, b_at as usize),
            _ => {
                let b_at = m * kk * 2;
                self.need_smem((b_at + kk * n * 2) as u32)?;
                // One barrier pair per dot: the previous use of the buffer is over, then
                // the operands are in place.
                self.ins("bar.sync 0");
                self.stage_swizzled(a, 0, Operand::Mma)?;
                self.stage_swizzled(b, b_at as u32, Operand::Mma)?;
                self.ins("bar.sync 0");
                (self.smem_base.clone(), 0, b_at)
            }
        };
        // Per lane: ldmatrix row `i` of matrix `j`; the warp's position (wm_i, wn_i).
        let r = |e: &mut Self| e.reg(Rk::R);
        let (lane, i, j, jl, jh, wmi, wni) = (
            r(self),
            r(self),
            r(self),
            r(self),
            r(self),
            r(self),
            r(self),
        );
        let warp = self.warp_reg();
        self.ins(format!("and.b32 {lane}, {}, 31", self.tid));
        self.ins(format!("and.b32 {i}, {lane}, 7"));
        self.ins(format!("shr.u32 {j}, {lane}, 3"));
        self.ins(format!("and.b32 {jl}, {j}, 1"));
        self.ins(format!("shr.u32 {jh}, {j}, 1"));
        self.ins(format!("and.b32 {wni}, {warp}, {}", wn - 1));
        self.ins(format!("shr.u32 {wmi}, {warp}, {}", wn.trailing_zeros()));
        // Lane `8j + i` addresses row `i` of stored 8x8 matrix `j`: a row of 8 M (or N)
        // elements when the operand is stored transposed, of 8 K elements otherwise.
        // A: matrices (rows half 0, k 0-7), (half 1, k 0-7), (half 0, k 8-15), (half 1,
        // k 8-15); row = wm_i * 8 + half * 8 * WM (+ 16 * WM per MMA row tile).
        let row_a = r(self);
        self.ins(format!("mul.lo.u32 {row_a}, {jl}, {}", 8 * wm));
        self.ins(format!("mad.lo.u32 {row_a}, {wmi}, 8, {row_a}"));
        let col_a = r(self);
        self.ins(format!("shl.b32 {col_a}, {jh}, 3"));
        let lane_a = if sa.transposed { &col_a } else { &row_a };
        self.ins(format!("add.u32 {lane_a}, {lane_a}, {i}"));
        // B: matrices (k 0-7, tile 2p), (k 8-15, 2p), (k 0-7, 2p+1), (k 8-15, 2p+1);
        // column = wn_i * 8 + tile * 8 * WN.
        let (mt, nt) = (m / (16 * wm), n / (8 * wn));
        let row_b = r(self);
        self.ins(format!("shl.b32 {row_b}, {jl}, 3"));
        let col_b = r(self);
        let jh_b = if nt >= 2 { jh.clone() } else { "0".to_string() };
        self.ins(format!("mul.lo.u32 {col_b}, {jh_b}, {}", 8 * wn));
        self.ins(format!("mad.lo.u32 {col_b}, {wni}, 8, {col_b}"));
        let lane_b = if sb.transposed { &col_b } else { &row_b };
        self.ins(format!("add.u32 {lane_b}, {lane_b}, {i}"));
        let trans_a = if sa.transposed { ".trans" } else { "" };
        let trans_b = if sb.transposed { "" } else { ".trans" };
        let ty = if dt == DType::BF16 { "bf16" } else { "f16" };
        let c1 = 2 * nt;
        let out: Vec<String> = (0..l.nregs()).map(|_| self.reg(Rk::F)).collect();
        let zero = self.reg(Rk::F);
        if init.is_none() {
            self.ins(format!("mov.f32 {zero}, {}", f32_imm(0.0)));
        }
        let frag = |regs: &[String], mi: usize, ni: usize| -> Vec<String> {
            [
                (2 * mi, 2 * ni),
                (2 * mi, 2 * ni + 1),
                (2 * mi + 1, 2 * ni),
                (2 * mi + 1, 2 * ni + 1),
            ]
            .iter()
            .map(|&(r0, c)| regs[r0 * c1 + c].clone())
            .collect()
        };
        for ks in 0..kk / 16 {
            let mut af = Vec::new();
            for mi in 0..mt {
                let row = self.plus(&row_a, mi * 16 * wm);
                let col = self.plus(&col_a, ks * 16);
                let addr = self.staged_addr(&base, &sa, &row, &col);
                let f: Vec<String> = (0..4).map(|_| self.reg(Rk::R)).collect();
                self.ins(format!(
                    "ldmatrix.sync.aligned.m8n8.x4{trans_a}.shared.b16 {{{}}}, [{addr}+{a_at}]",
                    f.join(", ")
                ));
                af.push(f);
            }
            let mut bf: Vec<[String; 2]> = Vec::new();
            for p in 0..nt.div_ceil(2) {
                let row = self.plus(&row_b, ks * 16);
                let col = self.plus(&col_b, p * 16 * wn);
                let addr = self.staged_addr(&base, &sb, &row, &col);
                let x = if nt >= 2 { 4 } else { 2 };
                let f: Vec<String> = (0..x).map(|_| self.reg(Rk::R)).collect();
                self.ins(format!(
                    "ldmatrix.sync.aligned.m8n8.x{x}{trans_b}.shared.b16 {{{}}}, [{addr}+{b_at}]",
                    f.join(", ")
                ));
                for pair in f.chunks(2) {
                    bf.push([pair[0].clone(), pair[1].clone()]);
                }
            }
            for (mi, fa) in af.iter().enumerate() {
                for (ni, fb) in bf.iter().enumerate() {
                    let d = frag(&out, mi, ni);
                    let c = match (&init, ks) {
                        (Some(init), 0) => frag(init, mi, ni),
                        (None, 0) => vec![zero.clone(); 4],
                        _ => d.clone(),
                    };
                    self.ins(format!(
                        "mma.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32 {{{}}}, {{{}}}, {{{}}}, {{{}}}",
                        d.join(", "),
                        fa.join(", "),
                        fb.join(", "),
                        c.join(", ")
                    ));
                }
            }
        }
        Ok(out)
    }

    /// Tensor-core `dot` for f16/bf16 operands, through shared memory.
    fn dot_mma(
        &mut self,
        dt: DType,
        a: ValueId,
        b: ValueId,
        acc: Option<ValueId>,
        l: &Layout,
    ) -> Res<Vec<String>> {
        let (m, kk) = (self.k.ty(a).shape[0], self.k.ty(a).shape[1]);
        let n = self.k.ty(b).shape[1];
        let b_at = (m * kk * 2) as u32;
        let d_at = (b_at + (kk * n * 2) as u32).next_multiple_of(16);
        self.need_smem(d_at + (m * n * 4) as u32)?;
        let (la, lb) = (self.layout_of(a), self.layout_of(b));
        let ra = self.tile(a, &la)?;
        let rb = self.tile(b, &lb)?;
        let init = match acc {
            Some(c) => self.tile(c, l)?,
            None => Vec::new(),
        };
        // Both operands row-major in shared memory, as 16-bit elements.
        let pa = self.smem_addr(&la, 2);
        let pb = self.smem_addr(&lb, 2);
        self.ins("bar.sync 0");
        for (r, off) in ra.iter().zip(Self::lin_offsets(&la)) {
            self.ins(format!("st.shared.b16 [{pa}+{}], {r}", off * 2));
        }
        for (r, off) in rb.iter().zip(Self::lin_offsets(&lb)) {
            self.ins(format!(
                "st.shared.b16 [{pb}+{}], {r}",
                b_at as usize + off * 2
            ));
        }
        self.ins("bar.sync 0");
        // Fragment coordinates: group = lane / 4, thread in group = lane % 4.
        let (lane, g, t) = (self.reg(Rk::R), self.reg(Rk::R), self.reg(Rk::R));
        self.ins(format!("and.b32 {lane}, {}, 31", self.tid));
        self.ins(format!("shr.u32 {g}, {lane}, 2"));
        self.ins(format!("and.b32 {t}, {lane}, 3"));
        let warps = self.k.num_warps as usize;
        let (tiles_n, tiles) = (n / 8, (m / 16) * (n / 8));
        let ty = if dt == DType::BF16 { "bf16" } else { "f16" };
        for j in 0..tiles.div_ceil(warps) {
            // Tile `warp + j * warps`; with fewer tiles than warps the extra warps redo the
            // last tiles and skip the store.
            let (tt, tm, tn) = (self.reg(Rk::R), self.reg(Rk::R), self.reg(Rk::R));
            self.ins(format!("shr.u32 {tt}, {}, 5", self.tid));
            let valid = if tiles < warps {
                let p = self.reg(Rk::P);
                self.ins(format!("setp.lt.u32 {p}, {tt}, {tiles}"));
                self.ins(format!("and.b32 {tt}, {tt}, {}", tiles - 1));
                Some(p)
            } else {
                self.ins(format!("add.u32 {tt}, {tt}, {}", j * warps));
                None
            };
            self.ins(format!("shr.u32 {tm}, {tt}, {}", tiles_n.trailing_zeros()));
            self.ins(format!("and.b32 {tn}, {tt}, {}", tiles_n - 1));
            // A fragment base: row tm*16 + g, column 2t.
            let (ra0, rb0, tmp) = (self.reg(Rk::R), self.reg(Rk::R), self.reg(Rk::R));
            self.ins(format!("shl.b32 {ra0}, {tm}, 4"));
            self.ins(format!("add.u32 {ra0}, {ra0}, {g}"));
            self.ins(format!("mul.lo.u32 {ra0}, {ra0}, {kk}"));
            self.ins(format!("shl.b32 {tmp}, {t}, 1"));
            self.ins(format!("add.u32 {ra0}, {ra0}, {tmp}"));
            self.ins(format!("mad.lo.u32 {ra0}, {ra0}, 2, {}", self.smem_base));
            // B fragment base: row 2t, column tn*8 + g.
            self.ins(format!("shl.b32 {rb0}, {tn}, 3"));
            self.ins(format!("add.u32 {rb0}, {rb0}, {g}"));
            self.ins(format!("mul.lo.u32 {tmp}, {t}, {}", 2 * n));
            self.ins(format!("add.u32 {rb0}, {rb0}, {tmp}"));
            self.ins(format!("mad.lo.u32 {rb0}, {rb0}, 2, {}", self.smem_base));
            let c: Vec<String> = (0..4).map(|_| self.reg(Rk::F)).collect();
            for r in &c {
                self.ins(format!("mov.f32 {r}, {}", f32_imm(0.0)));
            }
            for ks in 0..kk / 16 {
                let ao = ks * 32;
                let af: Vec<String> = [0, 8 * kk * 2, 16, 8 * kk * 2 + 16]
                    .iter()
                    .map(|&o| self.ld_shared(Rk::R, &ra0, (ao + o) as u32))
                    .collect();
                let mut bf = Vec::new();
                for half_k in [0, 8] {
                    let row = (ks * 16 + half_k) * n * 2;
                    let lo = self.ld_shared(Rk::H, &rb0, b_at + row as u32);
                    let hi = self.ld_shared(Rk::H, &rb0, b_at + (row + n * 2) as u32);
                    let w = self.reg(Rk::R);
                    self.ins(format!("mov.b32 {w}, {{{lo}, {hi}}}"));
                    bf.push(w);
                }
                let cs = c.join(", ");
                self.ins(format!(
                    "mma.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32 {{{cs}}}, {{{}}}, {{{}}}, {{{cs}}}",
                    af.join(", "),
                    bf.join(", ")
                ));
            }
            // D fragment: rows g and g+8, columns 2t and 2t+1.
            let dd = self.reg(Rk::R);
            self.ins(format!("shl.b32 {dd}, {tm}, 4"));
            self.ins(format!("add.u32 {dd}, {dd}, {g}"));
            self.ins(format!("mul.lo.u32 {dd}, {dd}, {n}"));
            self.ins(format!("shl.b32 {tmp}, {tn}, 3"));
            self.ins(format!("add.u32 {dd}, {dd}, {tmp}"));
            self.ins(format!("shl.b32 {tmp}, {t}, 1"));
            self.ins(format!("add.u32 {dd}, {dd}, {tmp}"));
            self.ins(format!("mad.lo.u32 {dd}, {dd}, 4, {}", self.smem_base));
            let at = valid.as_ref().map_or(String::new(), |p| format!("@{p} "));
            let row8 = 8 * n * 4;
            for (r, o) in c.iter().zip([0, 4, row8, row8 + 4]) {
                self.ins(format!(
                    "{at}st.shared.f32 [{dd}+{}], {r}",
                    d_at as usize + o
                ));
            }
        }
        self.ins("bar.sync 0");
        let pd = self.smem_addr(l, 4);
        let mut out = Vec::new();
        for (i, off) in Self::lin_offsets(l).into_iter().enumerate() {
            let x = self.ld_shared(Rk::F, &pd, d_at + off as u32 * 4);
            match init.get(i) {
                Some(c0) => {
                    let d = self.reg(Rk::F);
                    self.ins(format!("add.rn.f32 {d}, {c0}, {x}"));
                    out.push(d);
                }
                None => out.push(x),
            }
        }
        Ok(out)
    }
}
