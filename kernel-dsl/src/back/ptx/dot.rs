//! `dot`: both operands go to shared memory as f32; each thread accumulates its output
//! elements with FMAs in a run-time loop over K.

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
