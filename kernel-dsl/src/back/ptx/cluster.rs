//! `cluster_gather`: tiles exchanged between the programs of a thread-block cluster
//! through distributed shared memory (sm_90).
//!
//! Each program writes its tile to its own slot of `tf_cluster` (one slot per gather, so
//! no slot is ever reused; consecutive gathers share one barrier, see
//! `Emitter::gather_group`), the cluster barrier (arrive has release, wait has acquire
//! semantics) orders every program's writes before any read, and each thread then reads
//! the elements it holds of the stacked `[C, ..]` result from the slot of the program
//! that row comes from (`mapa` + `ld.shared::cluster`). A final cluster barrier before
//! the kernel returns keeps each program's shared memory alive while the others may
//! still read it. A cluster of one program needs no remote access: the slot is read
//! back locally after `bar.sync`, which also compiles for sm_80.

use super::emit::{Emitter, Res};
use super::layout::Layout;
use super::regs::Rk;
use crate::ir::ValueId;

impl Emitter<'_> {
    /// Writes this program's `value` to a fresh slot of `tf_cluster`; returns the slot's
    /// offset. (Replicated elements write equal values.)
    pub fn gather_write(&mut self, value: ValueId) -> Res<u32> {
        if self.k.cluster_size() > 1 && !self.target.hopper() {
            return self.err("`cluster_gather` needs thread-block clusters, which need sm_90");
        }
        let kind = self.rk_of(value);
        let es = kind.smem_bytes();
        let src_shape = self.k.ty(value).shape.clone();
        let numel: usize = src_shape.iter().product();
        let slot = self.cluster_smem.next_multiple_of(16);
        self.cluster_smem = slot + numel as u32 * es;
        let base = self.cluster_base();
        if src_shape.is_empty() {
            let r = self.scalar(value);
            self.st_shared(kind, &base, slot, &r);
        } else {
            let src_l = self.layout_of(value);
            let regs = self.tile(value, &src_l)?;
            let c = self.coords(&src_l);
            let a = self.reg(Rk::R);
            self.ins(format!("mad.lo.u32 {a}, {}, {es}, {base}", c.lin));
            for (r, off) in regs.iter().zip(Self::lin_offsets(&src_l)) {
                self.st_shared(kind, &a, slot + off as u32 * es, r);
            }
        }
        Ok(slot)
    }

    /// Orders every program's slot writes before any read of them.
    pub fn gather_barrier(&mut self) {
        if self.k.cluster_size() > 1 {
            self.ins("barrier.cluster.arrive.aligned");
            self.ins("barrier.cluster.wait.aligned");
            self.gathers_remote = true;
        } else {
            self.ins("bar.sync 0");
        }
    }

    /// Reads the stacked `[C, ..]` result of gathering `value` through `slot` in layout
    /// `l`: element `lin` is element `lin % numel` of the slot of rank `lin / numel`.
    pub fn gather_read(&mut self, value: ValueId, slot: u32, l: &Layout) -> Res<Vec<String>> {
        let remote = self.k.cluster_size() > 1;
        let kind = self.rk_of(value);
        let es = kind.smem_bytes();
        let numel: usize = self.k.ty(value).shape.iter().product();
        let base = self.cluster_base();
        let c = self.coords(l);
        let shift = numel.trailing_zeros();
        let mut out = Vec::new();
        for off in Self::lin_offsets(l) {
            let lin = self.reg(Rk::R);
            self.ins(format!("add.u32 {lin}, {}, {off}", c.lin));
            let addr = self.reg(Rk::R);
            self.ins(format!("and.b32 {addr}, {lin}, {}", numel - 1));
            self.ins(format!("mad.lo.u32 {addr}, {addr}, {es}, {base}"));
            let from = if remote {
                let rank = self.reg(Rk::R);
                self.ins(format!("shr.u32 {rank}, {lin}, {shift}"));
                let ra = self.reg(Rk::R);
                self.ins(format!("mapa.shared::cluster.u32 {ra}, {addr}, {rank}"));
                ra
            } else {
                addr
            };
            let space = if remote { "shared::cluster" } else { "shared" };
            let d = self.reg(kind);
            if kind == Rk::P {
                let t = self.reg(Rk::R);
                self.ins(format!("ld.{space}.u32 {t}, [{from}+{slot}]"));
                self.ins(format!("setp.ne.u32 {d}, {t}, 0"));
            } else {
                self.ins(format!("ld.{space}.{} {d}, [{from}+{slot}]", kind.bits()));
            }
            out.push(d);
        }
        Ok(out)
    }

    /// The register holding the shared address of `tf_cluster` (set at entry).
    fn cluster_base(&mut self) -> String {
        if let Some(b) = &self.cluster_base {
            return b.clone();
        }
        let b = self.reg(Rk::R);
        self.pro.push_str(&format!("\tmov.u32 {b}, tf_cluster;\n"));
        self.cluster_base = Some(b.clone());
        b
    }
}
