//! `dot`. f16/bf16 operands with M, N, K multiples of 16, 8, 16 use tensor cores
//! (`mma.sync.m16n8k16`, fragments read from shared memory, one 16x8 output tile per warp
//! at a time); everything else goes to shared memory as f32 and each thread accumulates
//! its output elements with FMAs in a run-time loop over K.

use std::collections::btree_map::Entry;

use super::emit::{Emitter, Res};
use super::layout::Layout;
use super::regs::{f32_imm, Rk};
use crate::ir::{DType, ValueId};

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
        if half && m % 16 == 0 && n % 8 == 0 && kk % 16 == 0 {
            let need = ((m * kk + kk * n) * 2).next_multiple_of(16) + m * n * 4;
            if need <= 48 * 1024 {
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

impl Emitter<'_> {
    /// Tensor-core `dot` for f16/bf16 operands.
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
