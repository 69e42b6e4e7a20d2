//! Axis analysis: contiguity, divisibility and constancy of integer and pointer tiles.
//!
//! Per tile dim: `contig` = length of the aligned runs (in tile index) over which the value
//! increases by one; `div` = the power of two dividing the first value of each run (bytes
//! for pointers); `cons` = length of the aligned runs over which the value is constant.
//! Scalars use one entry (only `div` matters). All numbers are powers of two.

use crate::ir::{BinaryOp, Block, CmpOp, Def, Expr, Kernel, Literal, ParamKind, Stmt, ValueId};

const MAX_DIV: u64 = 1 << 30;

/// What is known about one value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AxisInfo {
    /// Contiguity per dim.
    pub contig: Vec<u64>,
    /// Divisibility per dim.
    pub div: Vec<u64>,
    /// Constancy per dim.
    pub cons: Vec<u64>,
}

impl AxisInfo {
    fn unknown(rank: usize) -> AxisInfo {
        let n = rank.max(1);
        AxisInfo {
            contig: vec![1; n],
            div: vec![1; n],
            cons: vec![1; n],
        }
    }
}

fn pow2_div(x: i64) -> u64 {
    if x == 0 {
        MAX_DIV
    } else {
        (1u64 << x.unsigned_abs().trailing_zeros()).min(MAX_DIV)
    }
}

/// Divisibility of `x` at the starts of runs of length `rc` along `t`: its own run
/// starts are only guaranteed to be among them when its runs are no longer.
/// What holds of a value that is either `a` or `b`.
fn meet(a: &AxisInfo, b: &AxisInfo) -> AxisInfo {
    let min = |x: &[u64], y: &[u64]| x.iter().zip(y).map(|(p, q)| *p.min(q)).collect();
    AxisInfo {
        contig: min(&a.contig, &b.contig),
        div: min(&a.div, &b.div),
        cons: min(&a.cons, &b.cons),
    }
}

/// The value of `v` when it is an integer literal, or a splat or broadcast of one.
fn const_int(k: &Kernel, v: ValueId) -> Option<i64> {
    match &k.value(v).def {
        Def::Expr(Expr::Literal(Literal::Int(c, _))) => Some(*c),
        Def::Expr(Expr::Splat { value, .. } | Expr::Broadcast { value, .. }) => {
            const_int(k, *value)
        }
        _ => None,
    }
}

fn at_runs(x: &AxisInfo, t: usize, rc: u64) -> u64 {
    if x.contig[t] <= rc {
        x.div[t]
    } else {
        1
    }
}

/// Computes the axis info of every value.
pub fn analyze(k: &Kernel) -> Vec<AxisInfo> {
    let mut info: Vec<AxisInfo> = k
        .values
        .iter()
        .map(|v| AxisInfo::unknown(v.ty.as_ref().map_or(0, |t| t.shape.len())))
        .collect();
    block(k, &k.body, &mut info);
    info
}

fn block(k: &Kernel, b: &Block, info: &mut [AxisInfo]) {
    for stmt in &b.stmts {
        match stmt {
            Stmt::Let(v) => {
                if let Def::Expr(e) = &k.value(*v).def {
                    info[v.index()] = expr(k, *v, e, info);
                }
            }
            Stmt::Store { .. }
            | Stmt::Prefetch { .. }
            | Stmt::PrefetchRange { .. }
            | Stmt::Flag { .. }
            | Stmt::WaitPriorKernels { .. }
            | Stmt::LaunchDependents { .. } => {}
            // The index of a loop is a multiple of what divides both its start and step.
            // A loop-carried value has what both its entry value and its end-of-body value
            // have (a fixpoint from the entry value; pointer tiles advanced by a constant
            // stay contiguous and aligned), merged values the pessimistic default.
            Stmt::For {
                index,
                start,
                step,
                body,
                carried,
                ..
            } => {
                let d = info[start.index()].div[0].min(info[step.index()].div[0]);
                info[index.index()].div[0] = d;
                for c in carried {
                    info[c.param.index()] = info[c.init.index()].clone();
                }
                let mut stable = false;
                for _ in 0..4 {
                    block(k, body, info);
                    let mut changed = false;
                    for c in carried {
                        let m = meet(&info[c.init.index()], &info[c.next.index()]);
                        if m != info[c.param.index()] {
                            info[c.param.index()] = m;
                            changed = true;
                        }
                    }
                    if !changed {
                        stable = true;
                        break;
                    }
                }
                if !stable {
                    for c in carried {
                        let rank = info[c.param.index()].div.len();
                        info[c.param.index()] = AxisInfo::unknown(rank);
                    }
                    block(k, body, info);
                }
                for c in carried {
                    info[c.result.index()] = info[c.param.index()].clone();
                }
            }
            Stmt::If {
                then_body,
                else_body,
                ..
            } => {
                block(k, then_body, info);
                block(k, else_body, info);
            }
            Stmt::While {
                cond_body, body, ..
            } => {
                block(k, cond_body, info);
                block(k, body, info);
            }
        }
    }
}

fn expr(k: &Kernel, v: ValueId, e: &Expr, info: &[AxisInfo]) -> AxisInfo {
    let ty = k.ty(v);
    let shape: Vec<u64> = ty.shape.iter().map(|&n| n as u64).collect();
    let rank = shape.len();
    let mut out = AxisInfo::unknown(rank);
    let get = |x: &ValueId| info[x.index()].clone();
    match e {
        Expr::Param(i) => {
            out.div[0] = match k.params[*i].kind {
                ParamKind::Ptr(_) => 16,
                ParamKind::ScalarMultipleOf(_, d) => pow2_div(d as i64),
                ParamKind::Scalar(_) => 1,
            }
        }
        Expr::Literal(Literal::Int(c, _)) => out.div[0] = pow2_div(*c),
        Expr::Arange { start, end } => {
            out.contig[0] = (end - start) as u64;
            out.div[0] = pow2_div(*start);
        }
        Expr::Splat { value, .. } => {
            let d = get(value).div[0];
            out.div = vec![d; rank];
            out.cons = shape.clone();
        }
        Expr::Broadcast { value, .. } => {
            let src = get(value);
            let src_shape = &k.ty(*value).shape;
            for t in 0..rank {
                if src_shape[t] == 1 && shape[t] != 1 {
                    out.cons[t] = shape[t];
                    out.div[t] = src.div[t];
                } else {
                    out.contig[t] = src.contig[t];
                    out.div[t] = src.div[t];
                    out.cons[t] = src.cons[t];
                }
            }
        }
        Expr::ExpandDims { value, axis } => {
            let src = get(value);
            // Along the new dim every element starts a run: only a nowhere-contiguous
            // source keeps its divisibility.
            let d = if src.contig.iter().all(|&c| c == 1) {
                src.div.iter().copied().min().unwrap_or(1)
            } else {
                1
            };
            let mut c = src.contig.clone();
            let mut dv = src.div.clone();
            let mut n = src.cons.clone();
            if k.ty(*value).is_scalar() {
                c.clear();
                dv.clear();
                n.clear();
            }
            c.insert(*axis, 1);
            dv.insert(*axis, d);
            n.insert(*axis, 1);
            out = AxisInfo {
                contig: c,
                div: dv,
                cons: n,
            };
        }
        Expr::Binary { op, lhs, rhs } => {
            let (a, b) = (get(lhs), get(rhs));
            for t in 0..out.div.len() {
                match op {
                    BinaryOp::Add | BinaryOp::Sub => {
                        out.contig[t] = a.contig[t].min(b.cons[t]);
                        if *op == BinaryOp::Add {
                            out.contig[t] = out.contig[t].max(a.cons[t].min(b.contig[t]));
                        }
                        let rc = out.contig[t];
                        out.div[t] = at_runs(&a, t, rc).min(at_runs(&b, t, rc));
                        out.cons[t] = a.cons[t].min(b.cons[t]);
                    }
                    BinaryOp::Mul => {
                        out.div[t] = (at_runs(&a, t, 1) * at_runs(&b, t, 1)).min(MAX_DIV);
                        out.cons[t] = a.cons[t].min(b.cons[t]);
                    }
                    // Each element is one of the operands' elements: it keeps what both
                    // share (`minimum(k, n) - k0` with `k`, `n` multiples of 16 stays one).
                    BinaryOp::Min | BinaryOp::Max => {
                        out.div[t] = at_runs(&a, t, 1).min(at_runs(&b, t, 1));
                        out.cons[t] = a.cons[t].min(b.cons[t]);
                    }
                    // `x % m` with `m` uniform over the runs: an aligned run of `x`
                    // no longer than what divides both its start and `m` holds no
                    // multiple of `m` past its start, so it stays contiguous (Triton's
                    // `rm % M` row wrap keeps 16-byte loads).
                    BinaryOp::Rem => {
                        let (da, db) = (at_runs(&a, t, 1), at_runs(&b, t, 1));
                        out.contig[t] = a.contig[t].min(a.div[t]).min(db).min(b.cons[t]);
                        // A run's start is a multiple of its (power-of-two) length,
                        // which divides `m`: so is its remainder.
                        let rc = out.contig[t];
                        out.div[t] = if rc > 1 { rc } else { da.min(db) };
                        out.cons[t] = a.cons[t].min(b.cons[t]);
                    }
                    // `x / c` by a power of two `c` that divides what divides `x`:
                    // the division is exact, so the quotient keeps the rest
                    // (`(k_words / 4) * 2` with `k_words` a multiple of 32 is even).
                    BinaryOp::Div => {
                        let da = at_runs(&a, t, 1);
                        if let Some(c) = const_int(k, *rhs).filter(|&c| c > 0) {
                            let c = c as u64;
                            if c.is_power_of_two() && da % c == 0 {
                                out.div[t] = da / c;
                            }
                        }
                        out.cons[t] = a.cons[t].min(b.cons[t]);
                    }
                    _ => out.cons[t] = a.cons[t].min(b.cons[t]),
                }
            }
        }
        Expr::AddPtr { ptr, offset } => {
            let (a, b) = (get(ptr), get(offset));
            let es = ty.pointee().map_or(1, |d| d.size_bytes()) as u64;
            for t in 0..out.div.len() {
                // Contiguous offsets from a uniform pointer, or a contiguous pointer tile
                // plus a uniform offset (a pointer tile advanced in a loop).
                out.contig[t] = a.cons[t].min(b.contig[t]).max(a.contig[t].min(b.cons[t]));
                let rc = out.contig[t];
                out.div[t] = at_runs(&a, t, rc).min((at_runs(&b, t, rc) * es).min(MAX_DIV));
                out.cons[t] = a.cons[t].min(b.cons[t]);
            }
        }
        Expr::Compare { op, lhs, rhs } => {
            let (a, b) = (get(lhs), get(rhs));
            for t in 0..out.div.len() {
                let mut c = a.cons[t].min(b.cons[t]);
                // `contiguous < multiple of g` is uniform over aligned runs of g.
                if matches!(op, CmpOp::Lt | CmpOp::Ge) {
                    c = c.max(a.contig[t].min(a.div[t]).min(b.div[t]).min(b.cons[t]));
                }
                out.cons[t] = c;
            }
        }
        Expr::Select { cond, then, other } => {
            let (c, a, b) = (get(cond), get(then), get(other));
            for t in 0..out.div.len() {
                let ct = if c.cons.len() > t { c.cons[t] } else { 1 };
                out.cons[t] = a.cons[t].min(b.cons[t]).min(ct);
                out.div[t] = at_runs(&a, t, 1).min(at_runs(&b, t, 1));
            }
        }
        Expr::Dot4 { a, b, acc: c } | Expr::BytePerm { a, b, sel: c } => {
            let (a, b, c) = (get(a), get(b), get(c));
            for t in 0..out.div.len() {
                out.cons[t] = a.cons[t].min(b.cons[t]).min(c.cons[t]);
            }
        }
        Expr::Cast { value, .. } | Expr::Bitcast { value, .. } => {
            let a = get(value);
            out.cons = a.cons;
        }
        _ => {}
    }
    out
}
