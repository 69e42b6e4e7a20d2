//! Scans, layout changes (`permute`, `reshape`), `histogram` and the Philox random
//! numbers.
//!
//! - A scan runs in three levels, like a reduction: each thread scans its contiguous run
//!   in registers; lanes combine their run totals with a Hillis-Steele scan over
//!   `shfl.sync.up` (log2 of the lanes along the axis steps); warps along the axis
//!   exchange their totals through shared memory, and each thread folds in the totals of
//!   the warps before it. When the tile is longer than one pass of the program along the
//!   axis, the passes are scanned together and each folds in the totals of the passes
//!   before it. Work is `O(B)` per row plus `O(log lanes)` shuffles per register.
//! - `permute` relabels which tile dim lives on which space dim of the layout: no data
//!   moves (a consumer that needs another layout converts as for any value).
//! - `reshape` keeps row-major order, so it is a conversion through shared memory from
//!   the source's layout to the result's, both indexed by the row-major linear index.
//! - `histogram` zeroes `BINS` counters in shared memory, has the owner of every element
//!   add 1 to its bin (`red.shared.add`), then reads the counters in the result's layout.
//! - Philox4x32-10 is ten unrolled rounds of `mul.hi`/`mul.lo` and `xor` per element.

use std::collections::HashMap;

use super::emit::{Emitter, Res};
use super::layout::Layout;
use super::regs::{f32_imm, int_ty, rk, Rk};
use crate::interp::more_ops::{PHILOX_M0, PHILOX_M1, PHILOX_W0, PHILOX_W1, UNIFORM_SCALE};
use crate::ir::{DType, RandOp, ScanOp, UnaryOp, ValueId};

impl Emitter<'_> {
    /// `a op b` for a scan in register class `kind` (floats in f32).
    fn scan_combine(&mut self, op: ScanOp, dt: DType, kind: Rk, a: &str, b: &str) -> String {
        let d = self.reg(kind);
        let i = match (op, kind) {
            (ScanOp::Sum, Rk::F) => "add.rn.f32".to_string(),
            (ScanOp::Prod, Rk::F) => "mul.rn.f32".to_string(),
            (ScanOp::Sum, _) => format!("add.{}", int_ty(dt)),
            (ScanOp::Prod, _) => format!("mul.lo.{}", int_ty(dt)),
        };
        self.ins(format!("{i} {d}, {a}, {b}"));
        if dt == DType::U8 {
            self.ins(format!("and.b32 {d}, {d}, 255"));
        }
        d
    }

    /// The identity of a scan: `-0.0` for float sums (so `-0.0` survives), 0, 1.
    fn scan_identity(&mut self, op: ScanOp, kind: Rk) -> String {
        let d = self.reg(kind);
        let imm = match (op, kind) {
            (ScanOp::Sum, Rk::F) => f32_imm(-0.0),
            (ScanOp::Prod, Rk::F) => f32_imm(1.0),
            (ScanOp::Sum, _) => "0".into(),
            (ScanOp::Prod, _) => "1".into(),
        };
        self.ins(format!("mov.{} {d}, {imm}", kind.bits()));
        d
    }

    /// `shfl.sync` of a 32- or 64-bit register (`mode` is `up` or `idx`).
    fn shfl_any(&mut self, kind: Rk, x: &str, mode: &str, b: &str, c: u32) -> String {
        let d = self.reg(kind);
        if kind == Rk::D {
            let (lo, hi) = (self.reg(Rk::R), self.reg(Rk::R));
            self.ins(format!("mov.b64 {{{lo}, {hi}}}, {x}"));
            self.ins(format!("shfl.sync.{mode}.b32 {lo}, {lo}, {b}, {c}, -1"));
            self.ins(format!("shfl.sync.{mode}.b32 {hi}, {hi}, {b}, {c}, -1"));
            self.ins(format!("mov.b64 {d}, {{{lo}, {hi}}}"));
        } else {
            self.ins(format!("shfl.sync.{mode}.b32 {d}, {x}, {b}, {c}, -1"));
        }
        d
    }

    /// Inclusive scan of `value` along `axis`, in `value`'s layout (the result's).
    pub fn scan(&mut self, op: ScanOp, value: ValueId, axis: usize) -> Res<Vec<String>> {
        let dt = self.val_dt(value)?;
        if dt == DType::Bool {
            return self.err("scans of bool tiles: cast to i32 first");
        }
        let l = self.layout_of(value);
        let src = self.tile(value, &l)?;
        let kind = if dt.is_float() { Rk::F } else { rk(dt) };
        let x: Vec<String> = src
            .iter()
            .map(|r| {
                if dt.is_float() {
                    self.up(dt, r)
                } else {
                    r.clone()
                }
            })
            .collect();
        let s = l.keep[axis];
        let (ext, spt, run) = (l.ext[s], l.spt[s], l.run(s));
        let cover = l.cover(s);
        let reps = (ext / cover).max(1);
        // Registers grouped by their position off the axis (the slice layout's order),
        // each group sorted along the axis: `reps` chunks of `run` registers.
        let mut slot: HashMap<Vec<usize>, usize> = HashMap::new();
        let mut groups: Vec<Vec<(usize, usize)>> = Vec::new();
        for (i, mut o) in l.reg_offsets().into_iter().enumerate() {
            let along = o[s];
            o[s] = 0;
            let n = groups.len();
            let at = *slot.entry(o).or_insert(n);
            if at == n {
                groups.push(Vec::new());
            }
            groups[at].push((along, i));
        }
        for g in groups.iter_mut() {
            g.sort();
        }
        // 1. In-thread inclusive scans of each chunk; `tot[g][r]` is the chunk's total.
        let mut y = x.clone();
        let mut tot: Vec<Vec<String>> = Vec::new();
        for g in &groups {
            let mut t = Vec::new();
            for chunk in g.chunks(run) {
                for w in 1..chunk.len() {
                    let (prev, cur) = (chunk[w - 1].1, chunk[w].1);
                    y[cur] = self.scan_combine(op, dt, kind, &y[prev], &y[cur]);
                }
                t.push(y[chunk[chunk.len() - 1].1].clone());
            }
            tot.push(t);
        }
        // 2. Lanes: Hillis-Steele over the distinct lanes along the axis. `q` is the
        // lane's position among them (replicated lanes repeat the positions).
        let (ls, lw) = l.lane_bits(s);
        let lanes = (1usize << lw).min((ext / spt).max(1));
        let c = self.coords(&l);
        let mut excl: Vec<Vec<String>> = Vec::new();
        let mut wtot: Vec<Vec<String>> = tot.clone();
        if lanes > 1 {
            let q = self.reg(Rk::R);
            self.ins(format!(
                "shr.u32 {q}, {}, {}",
                c.base[s],
                spt.trailing_zeros()
            ));
            self.ins(format!("and.b32 {q}, {q}, {}", lanes - 1));
            let mut inc = tot.clone();
            let mut d = 1usize;
            while d < lanes {
                let p = self.reg(Rk::P);
                self.ins(format!("setp.ge.u32 {p}, {q}, {d}"));
                for t in inc.iter_mut().flatten() {
                    let other = self.shfl_any(kind, t, "up", &(d << ls).to_string(), 0);
                    let sum = self.scan_combine(op, dt, kind, &other, t);
                    let n = self.reg(kind);
                    self.ins(format!("selp.{} {n}, {sum}, {t}, {p}", kind.bits()));
                    *t = n;
                }
                d *= 2;
            }
            // Exclusive prefix: the inclusive value of the lane before (identity at 0).
            let p = self.reg(Rk::P);
            self.ins(format!("setp.ge.u32 {p}, {q}, 1"));
            let id = self.scan_identity(op, kind);
            let lane = self.reg(Rk::R);
            self.ins(format!("and.b32 {lane}, {}, 31", self.tid));
            let last = self.reg(Rk::R);
            self.ins(format!("or.b32 {last}, {lane}, {}", (lanes - 1) << ls));
            for (gi, g) in inc.iter().enumerate() {
                let mut e = Vec::new();
                let mut w = Vec::new();
                for t in g {
                    let prev = self.shfl_any(kind, t, "up", &(1usize << ls).to_string(), 0);
                    let n = self.reg(kind);
                    self.ins(format!("selp.{} {n}, {prev}, {id}, {p}", kind.bits()));
                    e.push(n);
                    // The warp's total: the inclusive value of its last lane.
                    w.push(self.shfl_any(kind, t, "idx", &last, 31));
                }
                excl.push(e);
                wtot[gi] = w;
            }
        } else {
            let id = self.scan_identity(op, kind);
            excl = tot.iter().map(|g| vec![id.clone(); g.len()]).collect();
        }
        // 3. Warps along the axis, through shared memory; then the passes.
        let (ws, ww) = l.warp_bits(s);
        let mut nbits = 0;
        while nbits < ww && (1usize << nbits) * spt * l.tpw[s] < ext {
            nbits += 1;
        }
        // Per group and pass: what precedes the warp in the pass, and the pass's total.
        let mut before: Vec<Vec<String>> = Vec::new();
        let mut pass_tot: Vec<Vec<String>> = Vec::new();
        if nbits > 0 {
            let ndw = 1u32 << nbits;
            let out_l = l.slice(axis);
            let numel: u32 = out_l.shape().iter().product::<usize>() as u32;
            let es = kind.smem_bytes();
            self.need_smem(reps as u32 * ndw * numel * es)?;
            let oc = self.coords(&out_l);
            let offs = Self::lin_offsets(&out_l);
            let wq = self.reg(Rk::R);
            self.ins(format!("bfe.u32 {wq}, {}, {ws}, {nbits}", self.warp_reg()));
            let (a, b) = (self.reg(Rk::R), self.reg(Rk::R));
            self.ins(format!("mad.lo.u32 {a}, {wq}, {numel}, {}", oc.lin));
            self.ins(format!("mad.lo.u32 {a}, {a}, {es}, {}", self.smem_base));
            self.ins(format!(
                "mad.lo.u32 {b}, {}, {es}, {}",
                oc.lin, self.smem_base
            ));
            self.ins("bar.sync 0");
            for (g, off) in wtot.iter().zip(&offs) {
                for (r, t) in g.iter().enumerate() {
                    let at = (r as u32 * ndw * numel + *off as u32) * es;
                    self.st_shared(kind, &a, at, t);
                }
            }
            self.ins("bar.sync 0");
            let id = self.scan_identity(op, kind);
            let mut earlier = Vec::new();
            for w in 0..ndw - 1 {
                let p = self.reg(Rk::P);
                self.ins(format!("setp.gt.u32 {p}, {wq}, {w}"));
                earlier.push(p);
            }
            for off in &offs {
                let (mut bf, mut pt) = (Vec::new(), Vec::new());
                for r in 0..reps as u32 {
                    let mut acc = id.clone();
                    let mut all: Option<String> = None;
                    for w in 0..ndw {
                        let at = ((r * ndw + w) * numel + *off as u32) * es;
                        let t = self.ld_shared(kind, &b, at);
                        if w + 1 < ndw {
                            // Warp `w` precedes this thread's warp when `w < wq`.
                            let sum = self.scan_combine(op, dt, kind, &acc, &t);
                            let n = self.reg(kind);
                            let p = &earlier[w as usize];
                            self.ins(format!("selp.{} {n}, {sum}, {acc}, {p}", kind.bits()));
                            acc = n;
                        }
                        all = Some(match all {
                            None => t,
                            Some(s) => self.scan_combine(op, dt, kind, &s, &t),
                        });
                    }
                    bf.push(acc);
                    pt.push(all.expect("at least one warp"));
                }
                before.push(bf);
                pass_tot.push(pt);
            }
        } else {
            let id = self.scan_identity(op, kind);
            before = wtot.iter().map(|g| vec![id.clone(); g.len()]).collect();
            pass_tot = wtot;
        }
        // 4. Each element: (earlier passes) op (earlier warps) op (earlier lanes) op itself.
        let mut out = y;
        for (gi, g) in groups.iter().enumerate() {
            let mut carry: Option<String> = None;
            for (r, chunk) in g.chunks(run).enumerate() {
                let mut pre = self.scan_combine(op, dt, kind, &before[gi][r], &excl[gi][r]);
                if let Some(cy) = &carry {
                    pre = self.scan_combine(op, dt, kind, cy, &pre);
                }
                for &(_, i) in chunk {
                    out[i] = self.scan_combine(op, dt, kind, &pre, &out[i]);
                }
                carry = Some(match carry {
                    None => pass_tot[gi][r].clone(),
                    Some(cy) => self.scan_combine(op, dt, kind, &cy, &pass_tot[gi][r]),
                });
            }
        }
        if dt.is_float() {
            out = out.iter().map(|r| self.down(dt, r)).collect();
        }
        Ok(out)
    }

    /// `reshape`: the source, moved through shared memory into the result's layout.
    pub fn reshape(&mut self, value: ValueId, to: &Layout) -> Res<Vec<String>> {
        let from = self.layout_of(value);
        let src = self.tile(value, &from)?;
        let kind = self.rk_of(value);
        self.convert(&src, kind, &from, to)
    }

    /// The counts of `histogram(value, bins, mask)` in layout `to`.
    pub fn histogram(
        &mut self,
        value: ValueId,
        bins: usize,
        mask: Option<ValueId>,
        to: &Layout,
    ) -> Res<Vec<String>> {
        let dt = self.val_dt(value)?;
        let from = self.layout_of(value);
        let x = self.tile(value, &from)?;
        let m = match mask {
            Some(m) => Some(self.tile(m, &from)?),
            None => None,
        };
        let owner = self.coords(&from).owner;
        self.need_smem(bins as u32 * 4)?;
        self.ins("bar.sync 0");
        let threads = self.k.threads_per_program() as usize;
        for k in 0..bins.div_ceil(threads) {
            let a = self.reg(Rk::R);
            self.ins(format!("add.u32 {a}, {}, {}", self.tid, k * threads));
            let p = self.reg(Rk::P);
            self.ins(format!("setp.lt.u32 {p}, {a}, {bins}"));
            self.ins(format!("mad.lo.u32 {a}, {a}, 4, {}", self.smem_base));
            self.ins(format!("@{p} st.shared.u32 [{a}], 0"));
        }
        self.ins("bar.sync 0");
        for (i, r) in x.iter().enumerate() {
            // Negative values compare as large unsigned ones: out of range.
            let p = self.reg(Rk::P);
            let idx = if dt == DType::I64 {
                self.ins(format!("setp.lt.u64 {p}, {r}, {bins}"));
                let t = self.reg(Rk::R);
                self.ins(format!("cvt.u32.u64 {t}, {r}"));
                t
            } else {
                self.ins(format!("setp.lt.u32 {p}, {r}, {bins}"));
                r.clone()
            };
            if let Some(m) = &m {
                self.ins(format!("and.pred {p}, {p}, {}", m[i]));
            }
            if let Some(o) = &owner {
                self.ins(format!("and.pred {p}, {p}, {o}"));
            }
            let a = self.reg(Rk::R);
            self.ins(format!("mad.lo.u32 {a}, {idx}, 4, {}", self.smem_base));
            self.ins(format!("@{p} red.shared.add.u32 [{a}], 1"));
        }
        self.ins("bar.sync 0");
        let a = self.smem_addr(to, 4);
        let mut out = Vec::new();
        for off in Self::lin_offsets(to) {
            out.push(self.ld_shared(Rk::R, &a, off as u32 * 4));
        }
        Ok(out)
    }

    /// One element of `rand`/`randn`/`randint(seed, offset)`.
    pub fn rand(&mut self, op: RandOp, seed: ValueId, a: &[String]) -> Res<String> {
        let sdt = self.val_dt(seed)?;
        let (s, off) = (&a[0], &a[1]);
        let (mut k0, mut k1) = (self.reg(Rk::R), self.reg(Rk::R));
        match sdt {
            DType::I64 => self.ins(format!("mov.b64 {{{k0}, {k1}}}, {s}")),
            DType::I32 => {
                // The seed sign-extends to 64 bits.
                self.ins(format!("mov.b32 {k0}, {s}"));
                self.ins(format!("shr.s32 {k1}, {s}, 31"));
            }
            _ => {
                self.ins(format!("mov.b32 {k0}, {s}"));
                self.ins(format!("mov.b32 {k1}, 0"));
            }
        }
        let mut c: Vec<String> = (0..4).map(|_| self.reg(Rk::R)).collect();
        self.ins(format!("mov.b32 {}, {off}", c[0]));
        for w in &c[1..] {
            self.ins(format!("mov.b32 {w}, 0"));
        }
        for round in 0..10 {
            let (h0, l0, h1, l1) = (
                self.reg(Rk::R),
                self.reg(Rk::R),
                self.reg(Rk::R),
                self.reg(Rk::R),
            );
            self.ins(format!("mul.hi.u32 {h0}, {}, {PHILOX_M0}", c[0]));
            self.ins(format!("mul.lo.u32 {l0}, {}, {PHILOX_M0}", c[0]));
            self.ins(format!("mul.hi.u32 {h1}, {}, {PHILOX_M1}", c[2]));
            self.ins(format!("mul.lo.u32 {l1}, {}, {PHILOX_M1}", c[2]));
            let (n0, n2) = (self.reg(Rk::R), self.reg(Rk::R));
            self.ins(format!("xor.b32 {n0}, {h1}, {}", c[1]));
            self.ins(format!("xor.b32 {n0}, {n0}, {k0}"));
            self.ins(format!("xor.b32 {n2}, {h0}, {}", c[3]));
            self.ins(format!("xor.b32 {n2}, {n2}, {k1}"));
            c = vec![n0, l1, n2, l0];
            if round < 9 {
                let (m0, m1) = (self.reg(Rk::R), self.reg(Rk::R));
                self.ins(format!("add.u32 {m0}, {k0}, {PHILOX_W0}"));
                self.ins(format!("add.u32 {m1}, {k1}, {PHILOX_W1}"));
                (k0, k1) = (m0, m1);
            }
        }
        match op {
            RandOp::Int => Ok(c[0].clone()),
            RandOp::Uniform => Ok(self.uniform(&c[0])),
            RandOp::Normal => {
                let u1 = self.uniform(&c[0]);
                let u2 = self.uniform(&c[1]);
                self.ins(format!("max.f32 {u1}, {u1}, {}", f32_imm(1.0e-7)));
                let ln = self.unary(UnaryOp::Log, DType::F32, &u1)?;
                let r = self.reg(Rk::F);
                self.ins(format!("mul.rn.f32 {r}, {ln}, {}", f32_imm(-2.0)));
                self.ins(format!("sqrt.rn.f32 {r}, {r}"));
                let th = self.reg(Rk::F);
                self.ins(format!(
                    "mul.rn.f32 {th}, {u2}, {}",
                    f32_imm(std::f32::consts::TAU)
                ));
                let cos = self.unary(UnaryOp::Cos, DType::F32, &th)?;
                let d = self.reg(Rk::F);
                self.ins(format!("mul.rn.f32 {d}, {r}, {cos}"));
                Ok(d)
            }
        }
    }

    /// A Philox word as a uniform `f32` in `[0, 1)`, as the interpreter computes it.
    fn uniform(&mut self, w: &str) -> String {
        let (n, i, p) = (self.reg(Rk::R), self.reg(Rk::R), self.reg(Rk::P));
        self.ins(format!("not.b32 {n}, {w}"));
        self.ins(format!("setp.lt.s32 {p}, {w}, 0"));
        self.ins(format!("selp.b32 {i}, {n}, {w}, {p}"));
        let f = self.reg(Rk::F);
        self.ins(format!("cvt.rn.f32.s32 {f}, {i}"));
        self.ins(format!("mul.rn.f32 {f}, {f}, {}", f32_imm(UNIFORM_SCALE)));
        f
    }
}

#[cfg(test)]
mod tests {
    use crate::back::ptx::{compile, PtxKernel, Target};
    use crate::{compile_source, Specialization};

    fn ptx(src: &str, warps: u32) -> PtxKernel {
        let spec = Specialization {
            consts: vec![],
            num_warps: warps,
            num_stages: None,
        };
        let k = compile_source(src, &spec).unwrap_or_else(|e| panic!("{e}"));
        compile(&k, Target::Sm90).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_transpose_moves_no_data() {
        let p = ptx(
            "#[kernel] fn t(x: Ptr<f32>, y: Ptr<f32>) {
                let r = arange(0, 32).expand_dims(1);
                let c = arange(0, 64).expand_dims(0);
                let v = load(x + r * 64 + c) * 2.0;
                store(y + arange(0, 64).expand_dims(1) * 32 + arange(0, 32).expand_dims(0), v.trans());
            }",
            4,
        );
        assert_eq!(p.shared_bytes, 0, "{}", p.layouts);
        assert!(!p.ptx.contains("bar.sync"), "{}", p.ptx);
    }

    #[test]
    fn a_scan_is_linear_with_log_shuffles() {
        // 4096 elements, 4 warps: 8 registers a thread over 4 passes of 1024. Each pass
        // of each thread shuffles log2(32) times, once for the exclusive prefix and once
        // for the warp's total; warps meet once through shared memory.
        let p = ptx(
            "#[kernel] fn s(x: Ptr<f32>, y: Ptr<f32>) {
                let o = arange(0, 4096);
                store(y + o, load(x + o).cumsum(0));
            }",
            4,
        );
        let count = |pat: &str| p.ptx.matches(pat).count();
        let passes = 4;
        assert_eq!(count("shfl.sync.up"), passes * (5 + 1), "{}", p.ptx);
        assert_eq!(count("shfl.sync.idx"), passes);
        assert_eq!(count("bar.sync"), 2);
        assert_eq!(p.shared_bytes, (passes * 4 * 4) as u32);
        // Linear work: a few instructions per element, not a triangle.
        let adds = count("add.rn.f32");
        assert!(adds < 40 * passes * 4, "{adds} additions");
    }
}
