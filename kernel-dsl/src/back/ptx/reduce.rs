//! Reductions along one axis: in-thread, then butterfly shuffles across the lanes that
//! hold the axis, then shared memory across warps. The result is left in the slice
//! layout, replicated on every thread that held the axis.

use std::collections::HashMap;

use super::emit::{Emitter, Res};
use super::regs::{int_ty, rk, Rk};
use crate::ir::{DType, Def, Expr, ReduceOp, ValueId};

/// Whether the reduction tracks the index of its pick.
fn with_index(op: ReduceOp) -> bool {
    matches!(op, ReduceOp::Argmax | ReduceOp::Argmin)
}

/// A partial result: value (and index for argmax/argmin).
#[derive(Clone)]
struct Part {
    v: String,
    i: Option<String>,
}

impl Emitter<'_> {
    /// Reduces `value` along `axis`; returns the registers of the result in its layout
    /// (one register for a scalar result).
    pub fn reduce(
        &mut self,
        _v: ValueId,
        op: ReduceOp,
        value: ValueId,
        axis: usize,
    ) -> Res<Vec<String>> {
        let mut dt = self.val_dt(value)?;
        let src_l = self.layout_of(value);
        // A product only summed (`contract.rs`): its factors, multiplied into the running
        // sum by `fma` instead of rounded products added one by one.
        let factors = match &self.k.value(value).def {
            Def::Expr(Expr::Binary { lhs, rhs, .. })
                if op == ReduceOp::Sum && self.fused.contains(&value) =>
            {
                let (lhs, rhs) = (*lhs, *rhs);
                Some((self.tile(lhs, &src_l)?, self.tile(rhs, &src_l)?))
            }
            _ => None,
        };
        let mut regs = match &factors {
            Some(_) => Vec::new(),
            None => self.tile(value, &src_l)?,
        };
        let is_bool = dt == DType::Bool;
        if is_bool {
            if !matches!(op, ReduceOp::Max | ReduceOp::Min) {
                return self.err(format!(
                    "{op:?} of a bool tile is not defined; cast to an integer first"
                ));
            }
            // any/all as max/min over 0/1.
            for r in regs.iter_mut() {
                let t = self.reg(Rk::R);
                self.ins(format!("selp.u32 {t}, 1, 0, {r}"));
                *r = t;
            }
            dt = DType::U32;
        }
        let s = src_l.keep[axis];
        let out_l = src_l.slice(axis);
        let acc_kind = if dt.is_float() { Rk::F } else { rk(dt) };
        let c = self.coords(&src_l);
        // Group the input registers by their position off the reduced dim; groups in
        // order of first appearance are the output registers in order (also when the
        // slice layout dropped the reduced space dim).
        let mut slot: HashMap<Vec<usize>, usize> = HashMap::new();
        let mut groups: Vec<Vec<(usize, usize)>> = Vec::new();
        for (i, mut o) in src_l.reg_offsets().into_iter().enumerate() {
            let along = o[s];
            o[s] = 0;
            let n = groups.len();
            let at = *slot.entry(o).or_insert(n);
            if at == n {
                groups.push(Vec::new());
            }
            groups[at].push((along, i));
        }
        debug_assert_eq!(groups.len(), out_l.nregs());
        let mut parts = Vec::new();
        for mut g in groups {
            g.sort();
            let mut acc: Option<Part> = None;
            for (along, i) in g {
                if let Some((a, b)) = &factors {
                    let d = self.reg(Rk::F);
                    match &acc {
                        None => self.ins(format!("mul.rn.f32 {d}, {}, {}", a[i], b[i])),
                        Some(s) => self.ins(format!("fma.rn.f32 {d}, {}, {}, {}", a[i], b[i], s.v)),
                    }
                    acc = Some(Part { v: d, i: None });
                    continue;
                }
                let x = if dt.is_float() {
                    self.up(dt, &regs[i])
                } else {
                    regs[i].clone()
                };
                let idx = if with_index(op) {
                    let r = self.reg(Rk::R);
                    self.ins(format!("add.s32 {r}, {}, {along}", c.base[s]));
                    Some(r)
                } else {
                    None
                };
                let p = Part { v: x, i: idx };
                acc = Some(match acc {
                    None => p,
                    Some(a) => self.combine(op, dt, acc_kind, &a, &p),
                });
            }
            parts.push(acc.unwrap());
        }
        // Across lanes: only lane bits that select distinct data (wrapped lanes repeat).
        let (ls, lw) = src_l.lane_bits(s);
        for j in 0..lw {
            if (1usize << j) * src_l.spt[s] >= src_l.ext[s] {
                break;
            }
            let xor = 1u32 << (ls + j);
            for p in parts.iter_mut() {
                let other = Part {
                    v: self.shfl(acc_kind, &p.v, xor),
                    i: p.i.clone().map(|i| self.shfl(Rk::R, &i, xor)),
                };
                *p = self.combine(op, dt, acc_kind, p, &other);
            }
        }
        // Across warps, through shared memory.
        let (ws, ww) = src_l.warp_bits(s);
        let mut nbits = 0;
        while nbits < ww && (1usize << nbits) * src_l.spt[s] * src_l.tpw[s] < src_l.ext[s] {
            nbits += 1;
        }
        if nbits > 0 {
            let ndw = 1u32 << nbits;
            let numel: u32 = out_l.shape().iter().product::<usize>() as u32;
            let es = acc_kind.smem_bytes();
            let idx_at = ndw * numel * es;
            let with_idx = with_index(op);
            self.need_smem(idx_at + if with_idx { ndw * numel * 4 } else { 0 })?;
            let oc = self.coords(&out_l);
            let offs = Self::lin_offsets(&out_l);
            let (w, a) = (self.reg(Rk::R), self.reg(Rk::R));
            self.ins(format!("bfe.u32 {w}, {}, {ws}, {nbits}", self.warp_reg()));
            self.ins(format!("mad.lo.u32 {w}, {w}, {numel}, {}", oc.lin));
            self.ins(format!("mad.lo.u32 {a}, {w}, {es}, {}", self.smem_base));
            self.ins("bar.sync 0");
            for (p, off) in parts.iter().zip(&offs) {
                self.ins(format!(
                    "st.shared.{} [{a}+{}], {}",
                    acc_kind.bits(),
                    *off as u32 * es,
                    p.v
                ));
            }
            if with_idx {
                let ai = self.reg(Rk::R);
                self.ins(format!("mad.lo.u32 {ai}, {w}, 4, {}", self.smem_base));
                for (p, off) in parts.iter().zip(&offs) {
                    let i = p.i.as_ref().unwrap();
                    self.ins(format!(
                        "st.shared.u32 [{ai}+{}], {i}",
                        idx_at + *off as u32 * 4
                    ));
                }
            }
            self.ins("bar.sync 0");
            let (b, bi) = (self.reg(Rk::R), self.reg(Rk::R));
            self.ins(format!(
                "mad.lo.u32 {b}, {}, {es}, {}",
                oc.lin, self.smem_base
            ));
            self.ins(format!(
                "mad.lo.u32 {bi}, {}, 4, {}",
                oc.lin, self.smem_base
            ));
            let mut merged = Vec::new();
            for off in &offs {
                let mut acc: Option<Part> = None;
                for wi in 0..ndw {
                    let at = (wi * numel + *off as u32) * es;
                    let v = self.ld_shared(acc_kind, &b, at);
                    let i = with_idx.then(|| {
                        self.ld_shared(Rk::R, &bi, idx_at + (wi * numel + *off as u32) * 4)
                    });
                    let p = Part { v, i };
                    acc = Some(match acc {
                        None => p,
                        Some(a) => self.combine(op, dt, acc_kind, &a, &p),
                    });
                }
                merged.push(acc.unwrap());
            }
            parts = merged;
        }
        let mut out = Vec::new();
        for p in parts {
            out.push(match op {
                ReduceOp::Argmax | ReduceOp::Argmin => p.i.unwrap(),
                _ if is_bool => {
                    let b = self.reg(Rk::P);
                    self.ins(format!("setp.ne.u32 {b}, {}, 0", p.v));
                    b
                }
                _ if dt.is_float() => self.down(dt, &p.v),
                _ => p.v,
            });
        }
        Ok(out)
    }

    fn shfl(&mut self, kind: Rk, x: &str, xor: u32) -> String {
        let d = self.reg(kind);
        if kind == Rk::D {
            let (lo, hi) = (self.reg(Rk::R), self.reg(Rk::R));
            self.ins(format!("mov.b64 {{{lo}, {hi}}}, {x}"));
            self.ins(format!("shfl.sync.bfly.b32 {lo}, {lo}, {xor}, 31, -1"));
            self.ins(format!("shfl.sync.bfly.b32 {hi}, {hi}, {xor}, 31, -1"));
            self.ins(format!("mov.b64 {d}, {{{lo}, {hi}}}"));
        } else {
            self.ins(format!("shfl.sync.bfly.b32 {d}, {x}, {xor}, 31, -1"));
        }
        d
    }

    fn combine(&mut self, op: ReduceOp, dt: DType, kind: Rk, a: &Part, b: &Part) -> Part {
        let t = if kind == Rk::F { "f32" } else { int_ty(dt) };
        let d = self.reg(kind);
        match op {
            ReduceOp::Sum => {
                let i = if kind == Rk::F {
                    "add.rn.f32"
                } else {
                    &format!("add.{t}")
                };
                self.ins(format!("{i} {d}, {}, {}", a.v, b.v));
                if dt == DType::U8 {
                    self.ins(format!("and.b32 {d}, {d}, 255"));
                }
                Part { v: d, i: None }
            }
            ReduceOp::Max | ReduceOp::Min => {
                let m = if op == ReduceOp::Max { "max" } else { "min" };
                self.ins(format!("{m}.{t} {d}, {}, {}", a.v, b.v));
                Part { v: d, i: None }
            }
            ReduceOp::Argmax | ReduceOp::Argmin => {
                // Take b when it is larger (smaller for argmin), or equal with a lower
                // index; NaN loses unless both are NaN.
                let (ai, bi) = (a.i.as_ref().unwrap(), b.i.as_ref().unwrap());
                let take = self.reg(Rk::P);
                let (eq, lo) = (self.reg(Rk::P), self.reg(Rk::P));
                let better = if op == ReduceOp::Argmax { "gt" } else { "lt" };
                self.ins(format!("setp.{better}.{t} {take}, {}, {}", b.v, a.v));
                self.ins(format!("setp.eq.{t} {eq}, {}, {}", b.v, a.v));
                self.ins(format!("setp.lt.s32 {lo}, {bi}, {ai}"));
                self.ins(format!("and.pred {eq}, {eq}, {lo}"));
                self.ins(format!("or.pred {take}, {take}, {eq}"));
                if kind == Rk::F {
                    let (an, bn) = (self.reg(Rk::P), self.reg(Rk::P));
                    let (x, y) = (self.reg(Rk::P), self.reg(Rk::P));
                    self.ins(format!("setp.nan.f32 {an}, {0}, {0}", a.v));
                    self.ins(format!("setp.nan.f32 {bn}, {0}, {0}", b.v));
                    self.ins(format!("not.pred {x}, {bn}"));
                    self.ins(format!("and.pred {x}, {x}, {an}"));
                    self.ins(format!("and.pred {y}, {an}, {bn}"));
                    self.ins(format!("and.pred {y}, {y}, {lo}"));
                    self.ins(format!("or.pred {take}, {take}, {x}"));
                    self.ins(format!("or.pred {take}, {take}, {y}"));
                }
                let i = self.reg(Rk::R);
                self.ins(format!(
                    "selp.{} {d}, {}, {}, {take}",
                    kind.bits(),
                    b.v,
                    a.v
                ));
                self.ins(format!("selp.b32 {i}, {bi}, {ai}, {take}"));
                Part { v: d, i: Some(i) }
            }
        }
    }
}
