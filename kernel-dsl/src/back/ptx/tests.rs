//! Backend tests: hand-built typed kernels, compiled for both targets and assembled with
//! `ptxas` (no spills, no stack frame), plus checks on the instructions chosen.

use super::{compile, PtxKernel, Target};
use crate::ir::builder::Builder;
use crate::ir::{
    AtomicOp, BinaryOp, CmpOp, DType, Kernel, Literal, ParamKind, ReduceOp, UnaryOp, ValueId,
};

/// Compiles for both targets and assembles each; returns the sm_80 kernel.
fn check(k: &Kernel) -> PtxKernel {
    let mut first = None;
    for t in [Target::Sm80, Target::Sm90] {
        let p = compile(k, t).unwrap_or_else(|e| panic!("{}: {e:?}", k.name));
        assert!(p.ptx.contains(&format!(".target {}", t.name())));
        assemble(&p, t);
        first.get_or_insert(p);
    }
    first.unwrap()
}

pub(crate) fn assemble(p: &PtxKernel, t: Target) {
    let bin = match super::ptxas::find() {
        Ok(bin) => bin,
        Err(e) if std::env::var_os("TILEFUSE_REQUIRE_PTXAS").is_some_and(|v| v == "1") => {
            panic!("TILEFUSE_REQUIRE_PTXAS=1: {e}")
        }
        Err(e) => {
            eprintln!("skipped: {e}");
            return;
        }
    };
    let report =
        super::ptxas::assemble(&bin, p, t).unwrap_or_else(|e| panic!("{e}\n{}", numbered(&p.ptx)));
    assert!(
        report.is_clean(),
        "{} ({}): spills or a stack frame:\n{}",
        p.entry,
        t.name(),
        report.log
    );
}

fn numbered(s: &str) -> String {
    s.lines()
        .enumerate()
        .map(|(i, l)| format!("{:4} {l}\n", i + 1))
        .collect()
}

fn mult(d: DType, m: u32) -> ParamKind {
    ParamKind::ScalarMultipleOf(d, m)
}

/// `out[i] = x[i] + y[i]` for `i < n`.
fn vector_add(n_kind: ParamKind, block: i64) -> Kernel {
    let mut b = Builder::new("add", 4);
    let x = b.ptr("x", DType::F32);
    let y = b.ptr("y", DType::F32);
    let out = b.ptr("out", DType::F32);
    let n = b.param("n", n_kind);
    let pid = b.pid(0);
    let bs = b.i32(block);
    let start = b.bin(BinaryOp::Mul, pid, bs);
    let ar = b.arange(0, block);
    let offs = b.bin(BinaryOp::Add, ar, start);
    let mask = b.cmp(CmpOp::Lt, offs, n);
    let px = b.add_ptr(x, offs);
    let py = b.add_ptr(y, offs);
    let xv = b.load(px, Some(mask), None);
    let yv = b.load(py, Some(mask), None);
    let s = b.bin(BinaryOp::Add, xv, yv);
    let po = b.add_ptr(out, offs);
    b.store(po, s, Some(mask));
    b.finish()
}

#[test]
fn vector_add_vectorizes_when_n_is_aligned() {
    let p = check(&vector_add(mult(DType::I32, 16), 1024));
    assert!(p.ptx.contains("ld.global.nc.v4.f32"), "{}", p.ptx);
    assert!(p.ptx.contains("st.global.v4.f32"), "{}", p.ptx);
    assert!(!p.ptx.contains(".local"));
    assert_eq!(p.shared_bytes, 0);
    assert!(!p.ptx.contains(".shared"));
    assert!(p.layouts.contains("blocked"));
}

#[test]
fn vector_add_masked_scalar_fallback() {
    let p = check(&vector_add(ParamKind::Scalar(DType::I32), 1024));
    assert!(!p.ptx.contains(".v4"), "mask is not uniform over vectors");
    assert!(p.ptx.contains("ld.global.nc.f32"));
    // Small tile: replicated threads must not store twice.
    let p = check(&vector_add(ParamKind::Scalar(DType::I32), 32));
    assert!(p.layouts.contains("replicated"), "{}", p.layouts);
}

/// Row softmax over a `[BM, N]` tile.
fn softmax(bm: i64, bn: i64, warps: u32) -> Kernel {
    let mut b = Builder::new("softmax", warps);
    let x = b.ptr("x", DType::F32);
    let out = b.ptr("out", DType::F32);
    let stride = b.param("stride", mult(DType::I32, 16));
    let n = b.param("n", mult(DType::I32, 16));
    let pid = b.pid(0);
    let bmv = b.i32(bm);
    let r0 = b.bin(BinaryOp::Mul, pid, bmv);
    let ar = b.arange(0, bm);
    let rows = b.bin(BinaryOp::Add, ar, r0);
    let cols = b.arange(0, bn);
    let re = b.expand(rows, 1);
    let rs = b.bin(BinaryOp::Mul, re, stride);
    let rb = b.broadcast(rs, &[bm as usize, bn as usize]);
    let ce = b.expand(cols, 0);
    let cb = b.broadcast(ce, &[bm as usize, bn as usize]);
    let offs = b.bin(BinaryOp::Add, rb, cb);
    let cm = b.cmp(CmpOp::Lt, cb, n);
    let px = b.add_ptr(x, offs);
    let ninf = b.f32(f64::NEG_INFINITY);
    let other = b.splat(ninf, &[bm as usize, bn as usize]);
    let xv = b.load(px, Some(cm), Some(other));
    let m = b.reduce(ReduceOp::Max, xv, 1);
    let me = b.expand(m, 1);
    let mb = b.broadcast(me, &[bm as usize, bn as usize]);
    let d = b.bin(BinaryOp::Sub, xv, mb);
    let e = b.un(UnaryOp::Exp, d);
    let s = b.reduce(ReduceOp::Sum, e, 1);
    let se = b.expand(s, 1);
    let sb = b.broadcast(se, &[bm as usize, bn as usize]);
    let y = b.bin(BinaryOp::Div, e, sb);
    let po = b.add_ptr(out, offs);
    b.store(po, y, Some(cm));
    b.finish()
}

#[test]
fn softmax_reduces_with_shuffles() {
    for (bm, bn, w) in [(4, 256, 4), (1, 1024, 4), (2, 64, 1), (8, 32, 8)] {
        let p = check(&softmax(bm, bn, w));
        assert!(p.ptx.contains("shfl.sync.bfly.b32"), "{bm}x{bn}");
        assert!(p.ptx.contains("ex2.approx.ftz.f32"));
        if bm * bn >= 4 * 32 * w as i64 {
            assert!(
                p.ptx.contains("ld.global.nc.v4.f32"),
                "{bm}x{bn}\n{}",
                p.layouts
            );
        }
    }
}

/// RMSNorm of one bf16 row: `y = x * rsqrt(mean(x^2) + eps) * w`.
fn rmsnorm(block: i64) -> Kernel {
    let mut b = Builder::new("rmsnorm", 4);
    let x = b.ptr("x", DType::BF16);
    let w = b.ptr("w", DType::BF16);
    let out = b.ptr("out", DType::BF16);
    let n = b.param("n", mult(DType::I32, 8));
    let eps = b.param("eps", ParamKind::Scalar(DType::F32));
    let pid = b.pid(0);
    let row = b.bin(BinaryOp::Mul, pid, n);
    let cols = b.arange(0, block);
    let mask = b.cmp(CmpOp::Lt, cols, n);
    let xr = b.add_ptr(x, row);
    let px = b.add_ptr(xr, cols);
    let xv = b.load(px, Some(mask), None);
    let xf = b.cast(xv, DType::F32);
    let sq = b.bin(BinaryOp::Mul, xf, xf);
    let ss = b.reduce(ReduceOp::Sum, sq, 0);
    let nf = b.cast(n, DType::F32);
    let mean = b.bin(BinaryOp::Div, ss, nf);
    let me = b.bin(BinaryOp::Add, mean, eps);
    let r = b.un(UnaryOp::Rsqrt, me);
    let pw = b.add_ptr(w, cols);
    let wv = b.load(pw, Some(mask), None);
    let wf = b.cast(wv, DType::F32);
    let y = b.bin(BinaryOp::Mul, xf, r);
    let y = b.bin(BinaryOp::Mul, y, wf);
    let yb = b.cast(y, DType::BF16);
    let or = b.add_ptr(out, row);
    let po = b.add_ptr(or, cols);
    b.store(po, yb, Some(mask));
    b.finish()
}

#[test]
fn rmsnorm_bf16() {
    let p = check(&rmsnorm(2048));
    assert!(p.ptx.contains("rsqrt.approx"));
    assert!(p.ptx.contains("cvt.rn.bf16.f32"));
    assert!(p.ptx.contains("shfl.sync.bfly.b32"));
    assert!(p.ptx.contains("ld.global.nc.v4.b32"), "{}", p.ptx);
    assert!(p.ptx.contains("st.global.v4.b32"));
    check(&rmsnorm(64));
}

/// `sum_k W[rows, k] * x[cols]` for a `[rows, cols]` tile of a row-major `W` whose rows
/// are `row_stride` apart: bf16 loads, f32 products, summed along the row.
fn tile_row_sums(
    b: &mut Builder,
    [w, x]: [ValueId; 2],
    rows: ValueId,
    cols: ValueId,
    row_stride: ValueId,
    shape: [usize; 2],
) -> ValueId {
    let re = b.expand(rows, 1);
    let rk = b.bin(BinaryOp::Mul, re, row_stride);
    let rb = b.broadcast(rk, &shape);
    let ce = b.expand(cols, 0);
    let cb = b.broadcast(ce, &shape);
    let offs = b.bin(BinaryOp::Add, rb, cb);
    let pw = b.add_ptr(w, offs);
    let wv = b.load(pw, None, None);
    let px = b.add_ptr(x, cols);
    let xv = b.load(px, None, None);
    let wf = b.cast(wv, DType::F32);
    let xf = b.cast(xv, DType::F32);
    let xe = b.expand(xf, 0);
    let xb = b.broadcast(xe, &shape);
    let prod = b.bin(BinaryOp::Mul, wf, xb);
    b.reduce(ReduceOp::Sum, prod, 1)
}

/// `y[n] = sum_k W[n, k] * x[k]`, bf16 inputs, f32 accumulation in a loop over K.
fn gemv(bn: i64, bk: i64, warps: u32) -> Kernel {
    let mut b = Builder::new("gemv", warps);
    let w = b.ptr("w", DType::BF16);
    let x = b.ptr("x", DType::BF16);
    let y = b.ptr("y", DType::F32);
    let kdim = b.param("k", mult(DType::I32, 64));
    let pid = b.pid(0);
    let bnv = b.i32(bn);
    let r0 = b.bin(BinaryOp::Mul, pid, bnv);
    let ar = b.arange(0, bn);
    let rows = b.bin(BinaryOp::Add, ar, r0);
    let zero = b.f32(0.0);
    let acc0 = b.splat(zero, &[bn as usize]);
    let start = b.i32(0);
    let step = b.i32(bk);
    let shape = [bn as usize, bk as usize];
    let acc = b.for_(start, kdim, step, &[acc0], |b, k, carried| {
        let ak = b.arange(0, bk);
        let cols = b.bin(BinaryOp::Add, ak, k);
        let s = tile_row_sums(b, [w, x], rows, cols, kdim, shape);
        vec![b.bin(BinaryOp::Add, carried[0], s)]
    });
    let py = b.add_ptr(y, rows);
    b.store(py, acc[0], None);
    b.finish()
}

#[test]
fn gemv_bf16_loop() {
    for (bn, bk, w) in [(16, 256, 4), (64, 128, 4), (8, 64, 2)] {
        let p = check(&gemv(bn, bk, w));
        assert!(p.ptx.contains("ld.global.nc.v4.b32"), "{}", p.layouts);
        assert!(p.ptx.contains("shfl.sync.bfly.b32"));
        assert!(p.ptx.contains("bra.uni"));
        // x is loaded in the slice of W's layout and the accumulator lives in the
        // reduction's layout: no shared-memory traffic in the loop.
        assert!(!p.ptx.contains("bar.sync"), "{}", p.layouts);
        // The products are summed and used nowhere else: each thread's share of a row
        // is one chain of fused multiply-adds (a product a thread's element after its
        // first), and no product is computed or rounded on its own.
        let per_thread = (bn * bk) as usize / (32 * w as usize);
        let (fmas, muls) = (
            p.ptx.matches("fma.rn.f32").count(),
            p.ptx.matches("mul.rn.f32").count(),
        );
        assert_eq!(fmas + muls, per_thread, "{}", p.ptx);
        assert!(fmas >= 3 * muls, "{}", p.ptx);
    }
}

/// `y[n] = sum_k W[n, k]` with the weight tiles double-buffered: the next `[bn, bk]`
/// tile is loaded before the current one (carried from the last iteration) is summed.
fn prefetching_row_sums(bn: i64, bk: i64, warps: u32) -> Kernel {
    prefetching_row_sums_unrolled(bn, bk, warps, false)
}

/// [`prefetching_row_sums`], its loop `.unroll(2)` where `unroll`.
fn prefetching_row_sums_unrolled(bn: i64, bk: i64, warps: u32, unroll: bool) -> Kernel {
    let mut b = Builder::new("prefetching_row_sums", warps);
    let w = b.ptr("w", DType::BF16);
    let y = b.ptr("y", DType::F32);
    let kdim = b.param("k", mult(DType::I32, 64));
    let shape = [bn as usize, bk as usize];
    let pid = b.pid(0);
    let bnv = b.i32(bn);
    let r0 = b.bin(BinaryOp::Mul, pid, bnv);
    let ar = b.arange(0, bn);
    let rows = b.bin(BinaryOp::Add, ar, r0);
    let re = b.expand(rows, 1);
    let rk = b.bin(BinaryOp::Mul, re, kdim);
    let row_at = b.broadcast(rk, &shape);
    let tile_at = |b: &mut Builder, k: ValueId| {
        let ak = b.arange(0, bk);
        let cols = b.bin(BinaryOp::Add, ak, k);
        let ce = b.expand(cols, 0);
        let cb = b.broadcast(ce, &shape);
        let offs = b.bin(BinaryOp::Add, row_at, cb);
        let pw = b.add_ptr(w, offs);
        // Past the last tile: a masked load (k is a multiple of bk here).
        let kb = b.broadcast(ce, &shape);
        let inside = b.cmp(CmpOp::Lt, kb, kdim);
        b.load(pw, Some(inside), None)
    };
    let start = b.i32(0);
    let first = tile_at(&mut b, start);
    let zero = b.f32(0.0);
    let acc0 = b.splat(zero, &[bn as usize]);
    let step = b.i32(bk);
    if unroll {
        b.unroll_next_loop();
    }
    let out = b.for_(start, kdim, step, &[first, acc0], |b, k, carried| {
        let k1 = b.bin(BinaryOp::Add, k, step);
        let next = tile_at(b, k1);
        let wf = b.cast(carried[0], DType::F32);
        let s = b.reduce(ReduceOp::Sum, wf, 1);
        vec![next, b.bin(BinaryOp::Add, carried[1], s)]
    });
    let py = b.add_ptr(y, rows);
    b.store(py, out[1], None);
    b.finish()
}

#[test]
fn bf16_tiles_stay_packed_across_loop_iterations() {
    // ptxas gives every 16-bit register a 32-bit one: a carried bf16 tile moved half
    // by half across the back edge took twice the registers it needs (the decode
    // attention's double-buffered cache tiles spilled). The tile is carried as the
    // loaded 32-bit words and widened from them.
    for (bn, bk, w) in [(8, 512, 4), (4, 256, 4)] {
        let p = check(&prefetching_row_sums(bn, bk, w));
        assert!(p.ptx.contains("bra.uni"));
        assert!(!p.ptx.contains("mov.b16"), "{}", numbered(&p.ptx));
        assert!(!p.ptx.contains("cvt.u32.u16"), "{}", numbered(&p.ptx));
        assert!(p.ptx.contains(", -65536;"), "{}", numbered(&p.ptx));
    }
}

#[test]
fn unrolled_loops_are_emitted_as_two_halves() {
    // Emitted once, a prefetching loop's back edge copies each prefetched tile into the
    // carried registers, and that copy waits for the load. With `.unroll(2)` the
    // second half reads the first half's tile where it was loaded, and the back edge's
    // copy goes to registers free since the first half (ptxas coalesces it).
    let once = check(&prefetching_row_sums(8, 512, 4));
    assert!(!once.ptx.contains("$L_odd_"));
    for (bn, bk, w) in [(8, 512, 4), (4, 256, 4)] {
        let p = check(&prefetching_row_sums_unrolled(bn, bk, w, true));
        let parts: Vec<&str> = p.ptx.split("$L_loop_").collect();
        assert_eq!(parts.len(), 3, "one loop:\n{}", numbered(&p.ptx));
        let (before, halves, after) = (parts[0], parts[1], parts[2]);
        // Two halves, each with its tile's loads, and an exit after the first half.
        let loads = |s: &str| s.matches("ld.global").count();
        assert!(loads(before) > 0);
        assert_eq!(loads(halves), 2 * loads(before), "{}", numbered(&p.ptx));
        assert_eq!(halves.matches("$L_odd_").count(), 1, "{}", numbered(&p.ptx));
        assert!(after.contains("$L_odd_"), "{}", numbered(&p.ptx));
    }
}

/// [`prefetching_row_sums`] with a per-row scale for each tile, prefetched as well and
/// multiplied into the tile's row sums: `acc += sum_k(w) * s`.
fn prefetching_scaled_row_sums(bn: i64, bk: i64, warps: u32) -> Kernel {
    let mut b = Builder::new("prefetching_scaled_row_sums", warps);
    let w = b.ptr("w", DType::BF16);
    let sc = b.ptr("scales", DType::F32);
    let y = b.ptr("y", DType::F32);
    let kdim = b.param("k", mult(DType::I32, 64));
    let shape = [bn as usize, bk as usize];
    let pid = b.pid(0);
    let bnv = b.i32(bn);
    let r0 = b.bin(BinaryOp::Mul, pid, bnv);
    let ar = b.arange(0, bn);
    let rows = b.bin(BinaryOp::Add, ar, r0);
    let re = b.expand(rows, 1);
    let rk = b.bin(BinaryOp::Mul, re, kdim);
    let row_at = b.broadcast(rk, &shape);
    let tiles = b.i32(64);
    let tile_at = |b: &mut Builder, k: ValueId| {
        let ak = b.arange(0, bk);
        let cols = b.bin(BinaryOp::Add, ak, k);
        let ce = b.expand(cols, 0);
        let cb = b.broadcast(ce, &shape);
        let offs = b.bin(BinaryOp::Add, row_at, cb);
        let pw = b.add_ptr(w, offs);
        let inside = b.cmp(CmpOp::Lt, cb, kdim);
        let wt = b.load(pw, Some(inside), None);
        // The tile's scale for each row: scales[row * 64 + k / bk].
        let bkv = b.i32(bk);
        let t = b.bin(BinaryOp::Div, k, bkv);
        let rt = b.bin(BinaryOp::Mul, rows, tiles);
        let at = b.bin(BinaryOp::Add, rt, t);
        let ps = b.add_ptr(sc, at);
        let kin = b.cmp(CmpOp::Lt, k, kdim);
        let kin = b.splat(kin, &[bn as usize]);
        let st = b.load(ps, Some(kin), None);
        (wt, st)
    };
    let start = b.i32(0);
    let (w0, s0) = tile_at(&mut b, start);
    let zero = b.f32(0.0);
    let acc0 = b.splat(zero, &[bn as usize]);
    let step = b.i32(bk);
    let out = b.for_(start, kdim, step, &[w0, s0, acc0], |b, k, carried| {
        let k1 = b.bin(BinaryOp::Add, k, step);
        let (wn, sn) = tile_at(b, k1);
        let wf = b.cast(carried[0], DType::F32);
        let sum = b.reduce(ReduceOp::Sum, wf, 1);
        let scaled = b.bin(BinaryOp::Mul, sum, carried[1]);
        vec![wn, sn, b.bin(BinaryOp::Add, carried[2], scaled)]
    });
    let py = b.add_ptr(y, rows);
    b.store(py, out[2], None);
    b.finish()
}

#[test]
fn prefetched_tiles_are_carried_in_the_layout_they_are_used_in() {
    // The scales meet the row sums (a reduction's result, which cannot move for free):
    // their loads, before the loop and in it, follow the sums' layout, so the carried
    // scale tile needs no conversion through shared memory in the loop.
    for (bn, bk, w) in [(8, 512, 4), (16, 256, 8)] {
        let p = check(&prefetching_scaled_row_sums(bn, bk, w));
        assert!(
            !p.ptx.contains("st.shared"),
            "{}\n{}",
            p.layouts,
            numbered(&p.ptx)
        );
        assert!(!p.ptx.contains("bar.sync"), "{}", p.layouts);
    }
}

/// `y[n] = y[n] + sum_k W[n, k] * x[k]` over one `[bn, bk]` tile, the loaded residual
/// written first in the add (so the op's first layout is the residual's).
fn gemv_residual_add(bn: i64, bk: i64, warps: u32) -> Kernel {
    let mut b = Builder::new("gemv_residual_add", warps);
    let w = b.ptr("w", DType::BF16);
    let x = b.ptr("x", DType::BF16);
    let y = b.ptr("y", DType::F32);
    let pid = b.pid(0);
    let bnv = b.i32(bn);
    let r0 = b.bin(BinaryOp::Mul, pid, bnv);
    let ar = b.arange(0, bn);
    let rows = b.bin(BinaryOp::Add, ar, r0);
    let cols = b.arange(0, bk);
    let kv = b.i32(bk);
    let s = tile_row_sums(&mut b, [w, x], rows, cols, kv, [bn as usize, bk as usize]);
    let py = b.add_ptr(y, rows);
    let old = b.load(py, None, None);
    let sum = b.bin(BinaryOp::Add, old, s);
    b.store(py, sum, None);
    b.finish()
}

#[test]
fn residual_is_loaded_in_the_reductions_layout() {
    // The reduction's result cannot change layout for free, the loaded residual can: it
    // is loaded straight into the sum's layout, and nothing goes through shared memory
    // (with the warps along the rows, the reduction itself needs none either).
    for (bn, bk, w) in [(8, 2048, 8), (4, 512, 4)] {
        let p = check(&gemv_residual_add(bn, bk, w));
        assert!(!p.ptx.contains("bar.sync"), "{}", p.layouts);
        assert!(!p.ptx.contains("st.shared"), "{}", p.layouts);
    }
}

#[test]
fn casts_between_all_dtypes() {
    let mut b = Builder::new("casts", 4);
    let src = [
        DType::F32,
        DType::BF16,
        DType::I32,
        DType::U8,
        DType::Bool,
        DType::I64,
    ];
    let ins: Vec<_> = src.iter().map(|&d| b.ptr("in", d)).collect();
    let outs: Vec<Vec<_>> = src
        .iter()
        .map(|_| DType::ALL.iter().map(|&d| b.ptr("out", d)).collect())
        .collect();
    let offs = b.arange(0, 256);
    for (i, &from) in src.iter().enumerate() {
        let p = b.add_ptr(ins[i], offs);
        let v = b.load(p, None, None);
        for (j, &to) in DType::ALL.iter().enumerate() {
            let c = b.cast(v, to);
            let po = b.add_ptr(outs[i][j], offs);
            b.store(po, c, None);
        }
        let _ = from;
    }
    check(&b.finish());
}

#[test]
fn elementwise_ops_for_all_dtypes() {
    let mut b = Builder::new("ops", 2);
    let n = 64;
    let offs = b.arange(0, n);
    for d in [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::U32,
        DType::I64,
        DType::U8,
    ] {
        let pa = b.ptr("a", d);
        let pb = b.ptr("b", d);
        let po = b.ptr("o", d);
        let pc = b.ptr("c", DType::Bool);
        let a = b.add_ptr(pa, offs);
        let a = b.load(a, None, None);
        let bb = b.add_ptr(pb, offs);
        let bv = b.load(bb, None, None);
        let mut acc = a;
        let bins: &[BinaryOp] = if d.is_float() {
            &[
                BinaryOp::Add,
                BinaryOp::Sub,
                BinaryOp::Mul,
                BinaryOp::Div,
                BinaryOp::Max,
                BinaryOp::Min,
            ]
        } else {
            &[
                BinaryOp::Add,
                BinaryOp::Sub,
                BinaryOp::Mul,
                BinaryOp::Div,
                BinaryOp::Rem,
                BinaryOp::And,
                BinaryOp::Or,
                BinaryOp::Xor,
                BinaryOp::Shl,
                BinaryOp::Shr,
                BinaryOp::Max,
                BinaryOp::Min,
            ]
        };
        for &op in bins {
            acc = b.bin(op, acc, bv);
        }
        let uns: &[UnaryOp] = if d.is_float() {
            &[
                UnaryOp::Neg,
                UnaryOp::Exp,
                UnaryOp::Exp2,
                UnaryOp::Log,
                UnaryOp::Log2,
                UnaryOp::Sqrt,
                UnaryOp::Rsqrt,
                UnaryOp::Sin,
                UnaryOp::Cos,
                UnaryOp::Abs,
                UnaryOp::Sigmoid,
                UnaryOp::Tanh,
                UnaryOp::Floor,
                UnaryOp::Ceil,
            ]
        } else {
            &[UnaryOp::Neg, UnaryOp::Not, UnaryOp::Abs]
        };
        for &op in uns {
            acc = b.un(op, acc);
        }
        let mut m = b.cmp(CmpOp::Eq, acc, bv);
        for op in [CmpOp::Ne, CmpOp::Lt, CmpOp::Le, CmpOp::Gt, CmpOp::Ge] {
            let c = b.cmp(op, acc, a);
            m = b.bin(BinaryOp::Xor, m, c);
        }
        let nm = b.un(UnaryOp::Not, m);
        let r = b.select(nm, acc, bv);
        let o = b.add_ptr(po, offs);
        b.store(o, r, Some(m));
        let c = b.add_ptr(pc, offs);
        b.store(c, m, None);
    }
    check(&b.finish());
}

#[test]
fn argmax_rows_and_scalar() {
    let mut b = Builder::new("argmax", 4);
    let x = b.ptr("x", DType::F32);
    let out = b.ptr("out", DType::I32);
    let one = b.ptr("one", DType::I32);
    let r = b.arange(0, 8);
    let c = b.arange(0, 512);
    let n = b.i32(512);
    let re = b.expand(r, 1);
    let rn = b.bin(BinaryOp::Mul, re, n);
    let rb = b.broadcast(rn, &[8, 512]);
    let ce = b.expand(c, 0);
    let cb = b.broadcast(ce, &[8, 512]);
    let offs = b.bin(BinaryOp::Add, rb, cb);
    let px = b.add_ptr(x, offs);
    let v = b.load(px, None, None);
    let am = b.reduce(ReduceOp::Argmax, v, 1);
    let po = b.add_ptr(out, r);
    b.store(po, am, None);
    let p1 = b.add_ptr(x, c);
    let v1 = b.load(p1, None, None);
    let a1 = b.reduce(ReduceOp::Argmax, v1, 0);
    b.store(one, a1, None);
    let p = check(&b.finish());
    assert!(p.ptx.contains("shfl.sync.bfly.b32"));
    assert!(p.ptx.contains("setp.nan.f32"));
}

#[test]
fn atomics_are_issued_once() {
    let mut b = Builder::new("atomics", 4);
    let acc = b.ptr("acc", DType::F32);
    let cnt = b.ptr("cnt", DType::I32);
    let mx = b.ptr("mx", DType::F32);
    let old = b.ptr("old", DType::F32);
    let x = b.ptr("x", DType::F32);
    let n = b.param("n", ParamKind::Scalar(DType::I32));
    // A 16-element tile on 128 threads: replicated 8 times.
    let offs = b.arange(0, 16);
    let mask = b.cmp(CmpOp::Lt, offs, n);
    let px = b.add_ptr(x, offs);
    let v = b.load(px, Some(mask), None);
    let pa = b.add_ptr(acc, offs);
    let o = b.atomic(AtomicOp::Add, pa, v, Some(mask));
    let pm = b.add_ptr(mx, offs);
    b.atomic(AtomicOp::Max, pm, v, Some(mask));
    let po = b.add_ptr(old, offs);
    b.store(po, o, Some(mask));
    let one = b.i32(1);
    b.atomic(AtomicOp::Add, cnt, one, None);
    let p = check(&b.finish());
    let atoms: Vec<&str> = p.ptx.lines().filter(|l| l.contains("atom.")).collect();
    for line in &atoms {
        assert!(
            line.trim_start().starts_with('@'),
            "unpredicated atomic: {line}"
        );
    }
    assert!(p.ptx.contains("atom.acq_rel.gpu.global.add.f32"));
    assert!(p.ptx.contains("atom.acq_rel.gpu.global.add.s32"));
    // Each of the three atomics is fenced and synchronized on both sides, so it orders
    // the whole program's accesses.
    assert_eq!(p.ptx.matches("fence.acq_rel.gpu").count(), 6, "{}", p.ptx);
}

#[test]
fn if_merges_tiles() {
    let mut b = Builder::new("branch", 4);
    let x = b.ptr("x", DType::F32);
    let out = b.ptr("out", DType::F32);
    let pid = b.pid(0);
    let zero = b.i32(0);
    let c = b.cmp(CmpOp::Eq, pid, zero);
    let offs = b.arange(0, 256);
    let px = b.add_ptr(x, offs);
    let v = b.load(px, None, None);
    let r = b.if_(
        c,
        |b| {
            let two = b.f32(2.0);
            vec![b.bin(BinaryOp::Mul, v, two)]
        },
        |b| {
            let s = b.reduce(ReduceOp::Sum, v, 0);
            vec![b.splat(s, &[256])]
        },
    );
    let po = b.add_ptr(out, offs);
    b.store(po, r[0], None);
    let p = check(&b.finish());
    assert!(p.ptx.contains("$L_else"));
}

#[test]
fn dot_tensor_cores() {
    for (dt, m, k, n, w) in [
        (DType::BF16, 32, 32, 32, 4),
        (DType::F16, 64, 64, 64, 8),
        (DType::BF16, 16, 16, 8, 4),
    ] {
        let p = check(&dot_kernel(dt, m, k, n, w));
        let ty = if dt == DType::BF16 { "bf16" } else { "f16" };
        let want = format!("mma.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32");
        assert!(p.ptx.contains(&want), "{m}x{k}x{n}");
    }
    // Other shapes and dtypes take the FMA path.
    let p = check(&dot_kernel(DType::F32, 16, 8, 32, 4));
    assert!(p.ptx.contains("fma.rn.f32") && !p.ptx.contains("mma.sync"));
    let p = check(&dot_kernel(DType::BF16, 8, 16, 8, 2));
    assert!(p.ptx.contains("fma.rn.f32") && !p.ptx.contains("mma.sync"));
}

fn dot_kernel(dt: DType, m: usize, k: usize, n: usize, warps: u32) -> Kernel {
    let mut b = Builder::new("mm", warps);
    let pa = b.ptr("a", dt);
    let pb = b.ptr("b", dt);
    let pc = b.ptr("c", DType::F32);
    let rm = b.arange(0, m as i64);
    let rk = b.arange(0, k as i64);
    let rn = b.arange(0, n as i64);
    let kk = b.i32(k as i64);
    let nn = b.i32(n as i64);
    let grid = |b: &mut Builder, r, c, stride, shape: [usize; 2]| {
        let re = b.expand(r, 1);
        let rs = b.bin(BinaryOp::Mul, re, stride);
        let rb = b.broadcast(rs, &shape);
        let ce = b.expand(c, 0);
        let cb = b.broadcast(ce, &shape);
        b.bin(BinaryOp::Add, rb, cb)
    };
    let oa = grid(&mut b, rm, rk, kk, [m, k]);
    let ob = grid(&mut b, rk, rn, nn, [k, n]);
    let oc = grid(&mut b, rm, rn, nn, [m, n]);
    let a = b.add_ptr(pa, oa);
    let a = b.load(a, None, None);
    let bv = b.add_ptr(pb, ob);
    let bv = b.load(bv, None, None);
    let z = b.f32(1.0);
    let acc = b.splat(z, &[m, n]);
    let d = b.dot(a, bv, Some(acc));
    let c = b.add_ptr(pc, oc);
    b.store(c, d, None);
    b.finish()
}

#[test]
fn unsupported_ops_are_errors() {
    let mut b = Builder::new("bad", 1);
    let x = b.ptr("x", DType::F32);
    let offs = b.arange(0, 32);
    let px = b.add_ptr(x, offs);
    let v = b.load(px, None, None);
    // Inference rejects float shifts; the backend must too (float `%` is supported).
    let r = b.bin(BinaryOp::Shl, v, v);
    b.store(px, r, None);
    let k = b.finish();
    let err = compile(&k, Target::Sm80).unwrap_err();
    assert!(err.message.contains("Shl"), "{}", err.message);
    assert_eq!(err.loc, k.value(r).loc);
    let _ = Literal::Bool(true);
}

#[test]
fn unaligned_rows_are_not_vectorized() {
    // offs[i, j] = i + j: rows are contiguous but start at unaligned offsets.
    let mut b = Builder::new("skew", 1);
    let x = b.ptr("x", DType::F32);
    let out = b.ptr("out", DType::F32);
    let r = b.arange(0, 4);
    let c = b.arange(0, 64);
    let re = b.expand(r, 1);
    let rb = b.broadcast(re, &[4, 64]);
    let ce = b.expand(c, 0);
    let cb = b.broadcast(ce, &[4, 64]);
    let offs = b.bin(BinaryOp::Add, rb, cb);
    let px = b.add_ptr(x, offs);
    let v = b.load(px, None, None);
    let po = b.add_ptr(out, offs);
    b.store(po, v, None);
    let p = check(&b.finish());
    assert!(
        !p.ptx.contains(".v2") && !p.ptx.contains(".v4"),
        "{}",
        p.ptx
    );
}

#[test]
fn bool_reductions_and_integer_dot() {
    let mut b = Builder::new("anyall", 4);
    let x = b.ptr("x", DType::I32);
    let out = b.ptr("out", DType::Bool);
    let res = b.ptr("res", DType::F32);
    let r = b.arange(0, 16);
    let c = b.arange(0, 16);
    let n = b.i32(16);
    let re = b.expand(r, 1);
    let rn = b.bin(BinaryOp::Mul, re, n);
    let rb = b.broadcast(rn, &[16, 16]);
    let ce = b.expand(c, 0);
    let cb = b.broadcast(ce, &[16, 16]);
    let offs = b.bin(BinaryOp::Add, rb, cb);
    let px = b.add_ptr(x, offs);
    let v = b.load(px, None, None);
    let zero = b.i32(0);
    let pos = b.cmp(CmpOp::Gt, v, zero);
    let any = b.reduce(ReduceOp::Max, pos, 1);
    let all = b.reduce(ReduceOp::Min, any, 0);
    b.store(out, all, None);
    let d = b.dot(v, v, None);
    let pr = b.add_ptr(res, offs);
    b.store(pr, d, None);
    check(&b.finish());
}

#[test]
fn scalars_i64_offsets_and_u32_loops() {
    let mut b = Builder::new("misc", 2);
    let x = b.ptr("x", DType::F32);
    let out = b.ptr("out", DType::F32);
    let flag = b.ptr("flag", DType::Bool);
    let n = b.param("n", ParamKind::Scalar(DType::U32));
    let off = b.param("off", ParamKind::Scalar(DType::I64));
    let t = b.lit(Literal::Bool(true), DType::Bool);
    b.store(flag, t, None);
    let xs = b.add_ptr(x, off);
    let s0 = b.load(xs, None, None);
    let r = b.arange(0, 64);
    let r64 = b.cast(r, DType::I64);
    let o = b.bin(BinaryOp::Add, r64, off);
    let px = b.add_ptr(x, o);
    let v = b.load(px, None, None);
    let start = b.lit(Literal::Int(0, Some(DType::U32)), DType::U32);
    let step = b.lit(Literal::Int(1, Some(DType::U32)), DType::U32);
    let res = b.for_(start, n, step, &[v, s0], |b, i, c| {
        let fi = b.cast(i, DType::F32);
        let nv = b.bin(BinaryOp::Add, c[0], fi);
        let ns = b.bin(BinaryOp::Mul, c[1], fi);
        vec![nv, ns]
    });
    let po = b.add_ptr(out, r);
    let y = b.bin(BinaryOp::Add, res[0], res[1]);
    b.store(po, y, None);
    b.atomic(AtomicOp::Add, out, res[1], Some(t));
    check(&b.finish());
}

#[test]
fn reduce_along_a_register_only_dim() {
    // [2, 256] on one warp: dim 0 lives only in registers, so its slice drops the dim.
    let mut b = Builder::new("colnorm", 1);
    let x = b.ptr("x", DType::F32);
    let out = b.ptr("out", DType::F32);
    let idx = b.ptr("idx", DType::I32);
    let r = b.arange(0, 2);
    let c = b.arange(0, 256);
    let n = b.i32(256);
    let re = b.expand(r, 1);
    let rn = b.bin(BinaryOp::Mul, re, n);
    let rb = b.broadcast(rn, &[2, 256]);
    let ce = b.expand(c, 0);
    let cb = b.broadcast(ce, &[2, 256]);
    let offs = b.bin(BinaryOp::Add, rb, cb);
    let px = b.add_ptr(x, offs);
    let v = b.load(px, None, None);
    let m = b.reduce(ReduceOp::Max, v, 0);
    let me = b.expand(m, 0);
    let mb = b.broadcast(me, &[2, 256]);
    let d = b.bin(BinaryOp::Sub, v, mb);
    let po = b.add_ptr(out, offs);
    b.store(po, d, None);
    let am = b.reduce(ReduceOp::Argmax, v, 0);
    let pi = b.add_ptr(idx, c);
    b.store(pi, am, None);
    check(&b.finish());
}

/// The float `%` lowering's algorithm, step for step in Rust (`f64` division rounds like
/// `div.rn.f64`, `mul_add` is `fma.rn.f64`): it must equal `%` (C's `fmod`) bit for bit,
/// including across the widest exponent gaps f32 has.
fn frem_steps(a: f32, b: f32) -> f32 {
    let (mut x, y) = ((a as f64).abs(), (b as f64).abs());
    let ey = (y.to_bits() >> 52) as i32;
    for _ in 0..11 {
        let k = ((x.to_bits() >> 52) as i32 - ey - 27).clamp(0, 300);
        let ys = y * f64::from_bits(((k + 1023) as u64) << 52);
        let r = (-(x / ys).trunc()).mul_add(ys, x);
        x = if r < 0.0 { r + ys } else { r };
    }
    let mut f = f32::from_bits((x as f32).to_bits() | (a.to_bits() & 0x8000_0000));
    if b.is_infinite() {
        f = a;
    }
    if !a.is_finite() || b.is_nan() || b == 0.0 {
        f = f32::NAN;
    }
    f
}

#[test]
fn frem_algorithm_is_exact() {
    let mut s = 0x1234_5678_9ABC_DEF0u64;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let specials = [
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MAX,
        -f32::MAX,
        f32::MIN_POSITIVE,
        1e-45,
        -1e-45,
        3.0,
        -7.5,
    ];
    let mut pick = |i: u64| {
        let r = next();
        if i % 5 == 0 {
            specials[(r % specials.len() as u64) as usize]
        } else {
            // Any finite bit pattern: every exponent, subnormals included.
            let f = f32::from_bits(r as u32);
            if f.is_finite() {
                f
            } else {
                1.5
            }
        }
    };
    for i in 0..200_000u64 {
        let (a, b) = (pick(i), pick(i / 3));
        let (got, want) = (frem_steps(a, b), a % b);
        assert!(
            got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
            "{a:e} % {b:e}: {got:e}, fmod gives {want:e}"
        );
    }
    assert_eq!(
        frem_steps(f32::MAX, 1e-45).to_bits(),
        (f32::MAX % 1e-45).to_bits()
    );
    assert_eq!(frem_steps(-6.0, 3.0).to_bits(), (-0.0f32).to_bits());
}

/// The body of the first `for` loop of a kernel's PTX.
fn loop_body(ptx: &str) -> &str {
    let start = ptx.find("$L_loop").expect("a loop");
    let head = &ptx[start..];
    let label = &head[..head.find(':').unwrap()];
    let end = head
        .find(&format!("bra.uni {label};"))
        .expect("the back edge");
    &head[..end]
}

#[test]
fn dot_accumulator_stays_in_registers() {
    for (bm, bn, bk, w) in [(128, 128, 32, 8), (64, 64, 32, 4), (128, 64, 64, 8)] {
        let d = crate::testing::def_with(
            super::gpu_tests::MATMUL_LOOP,
            &[("BM", bm), ("BN", bn), ("BK", bk), ("ACC", 0)],
            w,
            false,
        );
        let ptx = d.variants[0].ptx_sm80.as_str();
        if let Some(dir) = std::env::var_os("TILEFUSE_DUMP_DIR") {
            let _ = std::fs::write(
                std::path::Path::new(&dir).join(format!("mml_{bm}x{bn}x{bk}_{w}.ptx")),
                ptx,
            );
        }
        let body = loop_body(ptx);
        assert!(
            body.contains("ldmatrix.sync.aligned.m8n8.x4.shared.b16"),
            "{body}"
        );
        assert!(body.contains("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"));
        assert!(body.contains("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"));
        // Operands go in with 16-byte stores; the accumulator never touches shared memory.
        assert!(body.contains("st.shared.v4.b32"), "{body}");
        assert!(!body.contains("st.shared.f32") && !body.contains("ld.shared.f32"));
        assert!(
            !ptx.contains("st.shared.f32"),
            "no conversion of the accumulator"
        );
        assert_eq!(
            body.matches("bar.sync").count(),
            2,
            "one barrier pair per dot"
        );
        // Each warp issues (BM / WM / 16) * (BN / WN / 8) MMAs per 16 of K.
        let per_warp = bm as usize * bn as usize / (w as usize * 128);
        assert_eq!(
            body.matches("mma.sync").count(),
            per_warp * bk as usize / 16
        );
    }
}

#[test]
fn mma_layouts_split_warps_by_elements() {
    let l = super::Layout::mma(&[128, 128], 4).unwrap();
    assert_eq!(
        (l.spt.clone(), l.tpw.clone(), l.wpc.clone()),
        (vec![1, 2], vec![8, 4], vec![2, 2])
    );
    assert_eq!(l.nregs(), 128 * 128 / 128);
    assert_eq!(super::Layout::mma(&[128, 256], 8).unwrap().wpc, vec![2, 4]);
    assert_eq!(super::Layout::mma(&[16, 64], 4).unwrap().wpc, vec![1, 4]);
    assert!(!super::Layout::mma(&[64, 64], 4).unwrap().replicated());
    // Too few MMA tiles for the warps: no register-accumulator layout.
    assert_eq!(super::Layout::mma(&[16, 8], 4), None);
}

#[test]
fn large_dot_tiles_use_dynamic_shared_memory() {
    let k = |bm: i64, bn: i64, bk: i64| {
        let spec = crate::Specialization {
            consts: [("BM", bm), ("BN", bn), ("BK", bk), ("ACC", 0)]
                .iter()
                .map(|(n, v)| (n.to_string(), *v))
                .collect(),
            num_warps: 8,
            num_stages: None,
        };
        let src = format!(
            "#[kernel(BM = [{bm}], BN = [{bn}], BK = [{bk}], ACC = [0], num_warps = [8])]\n{}",
            super::gpu_tests::MATMUL_LOOP
        );
        crate::compile_source(&src, &spec).unwrap()
    };
    // 64 KiB of operands: above the static limit, below the sm_80 and sm_90 ones.
    for t in [Target::Sm80, Target::Sm90] {
        let p = compile(&k(128, 128, 128), t).unwrap();
        assert_eq!(p.shared_bytes, 65536);
        assert!(p.ptx.contains(".extern .shared .align 128 .b8 tf_smem[];"));
    }
    let p = compile(&k(64, 64, 32), Target::Sm80).unwrap();
    assert!(p.ptx.contains(".shared .align 128 .b8 tf_smem[8192];"));
    // 192 KiB: fits sm_90 only; the error names the kernel, the size and the limit.
    let big = k(256, 512, 128);
    assert!(compile(&big, Target::Sm90).is_ok());
    let err = compile(&big, Target::Sm80).unwrap_err();
    assert!(
        err.message.contains("kernel `mml`")
            && err.message.contains("196608 bytes")
            && err.message.contains("166912 bytes (163 KiB)")
            && err.message.contains("sm_80"),
        "{}",
        err.message
    );
}

#[test]
fn pipelined_dot_loops_copy_with_cp_async() {
    let src = super::gpu_tests::matmul_pipelined();
    for stages in [2, 3] {
        let d = crate::testing::def_attr(
            &src,
            &[("BM", 128), ("BN", 128), ("BK", 32), ("ACC", 0)],
            8,
            false,
            &format!("num_stages = [{stages}]"),
        );
        let ptx = d.variants[0].ptx_sm80.as_str();
        if let Some(dir) = std::env::var_os("TILEFUSE_DUMP_DIR") {
            let _ = std::fs::write(
                std::path::Path::new(&dir).join(format!("mml_pipe{stages}.ptx")),
                ptx,
            );
        }
        // The sm_80 ring holds `stages` buffers; the variant reserves what its largest
        // module needs, the sm_90a ring's one buffer more (a `wgmma` left running).
        assert!(ptx.contains(&format!("tf_smem[{}]", stages * 16384)) || stages * 16384 > 49152);
        assert_eq!(d.variants[0].shared_bytes, (stages + 1) * 16384);
        let body = loop_body(ptx);
        // 16-byte copies straight into shared memory, waited for one stage behind.
        assert!(body.contains("cp.async.cg.shared.global"), "{body}");
        assert!(body.contains(&format!("cp.async.wait_group {}", stages - 2)));
        assert!(body.contains("cp.async.commit_group"));
        assert!(!body.contains("ld.global") && !body.contains("st.shared"));
        assert_eq!(
            body.matches("bar.sync").count(),
            1,
            "one barrier per iteration"
        );
        assert!(body.contains("ldmatrix") && body.contains("mma.sync"));
        // The first stages - 1 iterations are in flight before the loop.
        let before = &ptx[..ptx.find(body).unwrap()];
        assert_eq!(
            before.matches("cp.async.commit_group").count(),
            stages as usize - 1
        );
        super::tests::assemble(
            &compile(
                &crate::compile_source(
                    &format!(
                        "#[kernel(BM = [128], BN = [128], BK = [32], ACC = [0], num_warps = [8], num_stages = [{stages}])]\n{src}"
                    ),
                    &crate::Specialization {
                        consts: [("BM", 128), ("BN", 128), ("BK", 32), ("ACC", 0)]
                            .iter()
                            .map(|(n, v)| (n.to_string(), *v))
                            .collect(),
                        num_warps: 8,
                        num_stages: None,
                    },
                )
                .unwrap(),
                Target::Sm90,
            )
            .unwrap(),
            Target::Sm90,
        );
    }
}

/// A GEMM kernel of the `(a, b, c, m, n, k)` form at 64 x 64 x 32 tiles over 4 warps,
/// `num_stages` stages.
fn gemm_64x64(body: &str, stages: u32) -> crate::ir::Kernel {
    let spec = crate::Specialization {
        consts: [("BM", 64), ("BN", 64), ("BK", 32)]
            .iter()
            .map(|(n, v)| (n.to_string(), *v))
            .collect(),
        num_warps: 4,
        num_stages: None,
    };
    let src = format!(
        "#[kernel(BM = [64], BN = [64], BK = [32], num_warps = [4], num_stages = [{stages}])]\n{body}"
    );
    crate::compile_source(&src, &spec).unwrap()
}

/// The loop body and the global accesses of [`super::gpu_tests::matmul_oriented`]
/// with `num_stages` stages.
fn oriented(a_t: bool, b_t: bool, aligned: bool, stages: u32) -> (String, Vec<super::Access>) {
    let k = gemm_64x64(
        &super::gpu_tests::matmul_oriented(a_t, b_t, aligned),
        stages,
    );
    let p = compile(&k, Target::Sm80).unwrap();
    assemble(&p, Target::Sm80);
    (loop_body(&p.ptx).to_string(), p.accesses)
}

#[test]
fn bf16_accumulator_stores_leave_the_mma_layout_through_padded_rows() {
    // 64 x 64 bf16 output over 4 warps: the MMA layout gives a thread pairs of a row
    // (4-byte stores); moved through shared memory, 16-byte vectors.
    let k = gemm_64x64(&super::gpu_tests::matmul_bf16_out(), 3);
    for target in [Target::Sm80, Target::Sm90a] {
        let p = compile(&k, target).unwrap();
        let store = p
            .accesses
            .iter()
            .find(|a| a.kind == super::AccessKind::Store)
            .unwrap();
        assert_eq!(store.width, 8, "{target:?}");
        let epilogue = &p.ptx[p.ptx.rfind("cp.async.wait_all").unwrap()..];
        // 4096 elements over 128 threads: 16 pairs in, 4 vectors of 8 out.
        assert_eq!(epilogue.matches("st.shared.b32").count(), 16, "{epilogue}");
        assert_eq!(epilogue.matches("ld.shared.v4.b32").count(), 4);
        assert_eq!(epilogue.matches("st.global.v4.b32").count(), 4);
        assert!(!epilogue.contains("st.global.b32"));
        // Rows of 64 bf16 (128 bytes) padded by 8 elements: a pitch of 72, the next row
        // 144 bytes on, so a warp's 8 rows of pairs fall in distinct banks.
        assert!(epilogue.contains(", 72, "), "{epilogue}");
        // The tile sits where the ring was (free after the loop); no scratch beyond it.
        assert!(p.ptx.contains(".b8 tf_smem[") || p.ptx.contains("tf_smem[]"));
        assemble(&p, target);
    }
}

/// The vector widths of the kernel's loads.
fn load_widths(acc: &[super::Access]) -> Vec<usize> {
    acc.iter()
        .filter(|a| a.kind == super::AccessKind::Load)
        .map(|a| a.width)
        .collect()
}

#[test]
fn operand_loads_coalesce_along_their_contiguous_dim() {
    // Per thread and operand: 64 x 32 elements over 128 threads, 8 to a vector.
    let vectors = 2 * 64 * 32 / 128 / 8;
    // NT: B is a [BK, BN] tile of an [N, K] row-major weight, contiguous along dim 0.
    let (body, acc) = oriented(false, true, true, 1);
    assert_eq!(load_widths(&acc), vec![8, 8], "16-byte loads of A and of B");
    assert_eq!(body.matches("ld.global.nc.v4.b32").count(), vectors);
    // Both operands are stored with 16-byte vectors and read without `.trans`.
    assert_eq!(body.matches("st.shared.v4.b32").count(), vectors);
    assert!(!body.contains("st.shared.b16"), "{body}");
    assert!(body.contains("ldmatrix.sync.aligned.m8n8.x4.shared.b16"));
    assert!(!body.contains(".trans"), "{body}");
    // The f32 output tile keeps its 8-byte vectors (rows of the MMA layout).
    let store = acc
        .iter()
        .find(|a| a.kind == super::AccessKind::Store)
        .unwrap();
    assert_eq!(store.width, 2);

    // TN: A stored [K, M] (M fastest) is staged transposed and read with `.trans`, B
    // as before.
    let (body, acc) = oriented(true, false, true, 1);
    assert_eq!(load_widths(&acc), vec![8, 8]);
    assert_eq!(body.matches("st.shared.v4.b32").count(), vectors);
    assert_eq!(
        body.matches("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16")
            .count(),
        // Per 16 of K: 2 A fragments (64 rows over 2 warps) and 2 B pairs (64 columns
        // over 2 warps).
        (2 + 2) * 32 / 16
    );

    // Pipelined (`cp.async` ring): the copies are 16 bytes along the same stored rows,
    // and the fragments are read the same way.
    for (a_t, b_t) in [(false, true), (true, false), (true, true)] {
        let (body, acc) = oriented(a_t, b_t, true, 2);
        assert!(load_widths(&acc).iter().all(|&w| w == 8));
        assert_eq!(body.matches("cp.async.cg.shared.global").count(), vectors);
        assert!(!body.contains("st.shared"), "{body}");
        let trans = body.matches(".trans").count();
        let want = match (a_t, b_t) {
            (false, true) => 0,
            (true, false) => 4 * 2,
            _ => 2 * 2,
        };
        assert_eq!(trans, want, "{a_t} {b_t}");
    }

    // Without 16-byte alignment the loads fall back to scalars (and are not
    // pipelined); the staged operands still get vector shared stores.
    let (body, acc) = oriented(false, true, false, 2);
    assert!(load_widths(&acc).iter().all(|&w| w == 1));
    assert!(body.contains("st.shared.v4.b32"));
}

#[test]
fn transposing_stores_are_coalesced() {
    let d = crate::testing::def_with(
        super::gpu_tests::TRANSPOSE_SRC,
        &[("R", 64), ("C", 32)],
        4,
        true,
    );
    let ptx = d.variants[0].ptx_sm80.as_str();
    assert!(ptx.contains("ld.global.nc.v4.f32"), "{ptx}");
    assert!(ptx.contains("st.global.v4.f32"), "{ptx}");
    assert!(!ptx.contains("st.global.f32"));
}

/// [`super::gpu_tests::matmul_pipelined`] compiled for `target` with `num_stages`.
fn pipelined_for(bm: i64, bn: i64, bk: i64, warps: u32, stages: u32, target: Target) -> PtxKernel {
    let consts = [("BM", bm), ("BN", bn), ("BK", bk), ("ACC", 0)];
    let spec = crate::Specialization {
        consts: consts.iter().map(|(n, v)| (n.to_string(), *v)).collect(),
        num_warps: warps,
        num_stages: None,
    };
    let src = format!(
        "#[kernel(BM = [{bm}], BN = [{bn}], BK = [{bk}], ACC = [0], num_warps = [{warps}], num_stages = [{stages}])]\n{}",
        super::gpu_tests::matmul_pipelined()
    );
    compile(&crate::compile_source(&src, &spec).unwrap(), target).unwrap()
}

#[test]
fn dot_lowers_to_wgmma_on_sm90a() {
    // (BM, BN, BK, warps, stages): one or two warpgroups, one or two m64 instructions
    // per warpgroup, 128- and 64-byte swizzles, B panels (BN > 64), pipelined or not.
    for (bm, bn, bk, w, stages) in [
        (128, 128, 64, 4, 3),
        (128, 256, 64, 8, 3),
        (128, 128, 32, 8, 4),
        (64, 64, 32, 4, 3),
        (64, 64, 64, 4, 1),
    ] {
        let p = pipelined_for(bm, bn, bk, w, stages, Target::Sm90a);
        if let Some(dir) = std::env::var_os("TILEFUSE_DUMP_DIR") {
            let name = format!("wgmma_{bm}x{bn}x{bk}_{w}_{stages}.ptx");
            let _ = std::fs::write(std::path::Path::new(&dir).join(name), &p.ptx);
        }
        assert!(p.uses_wgmma && p.ptx.contains(".target sm_90a"));
        let body = loop_body(&p.ptx);
        // Per warpgroup: BM / (64 * groups) instructions per 16 of K.
        let per_k = bm as usize / (64 * (w as usize / 4));
        assert_eq!(
            body.matches(&format!(
                "wgmma.mma_async.sync.aligned.m64n{bn}k16.f32.bf16.bf16"
            ))
            .count(),
            per_k * bk as usize / 16,
            "{body}"
        );
        assert!(body.contains("wgmma.fence.sync.aligned"));
        if stages > 1 {
            // The group runs on into the next iteration (one buffer more in the ring),
            // accumulating in place: the carried registers are not copied; the loop's
            // exit waits for it.
            assert!(body.contains("wgmma.wait_group.sync.aligned 1"), "{body}");
            assert!(
                !body
                    .lines()
                    .any(|l| l.contains("mov.f32") && l.matches("%f").count() == 2),
                "{body}"
            );
            let after = &p.ptx[p.ptx.find(body).unwrap() + body.len()..];
            assert!(after.contains("wgmma.wait_group.sync.aligned 0"));
            let stage = (bm + bn) as u32 * bk as u32 * 2;
            assert_eq!(p.shared_bytes, (stages + 1) * stage);
            assert!(body.contains(&format!("cp.async.wait_group {}", stages - 2)));
        } else {
            assert!(body.contains("wgmma.wait_group.sync.aligned 0"));
        }
        // Shared memory written by the generic proxy is fenced before the tensor cores
        // read it; nothing goes through `ldmatrix` / `mma.sync`.
        assert!(body.contains("fence.proxy.async.shared::cta"), "{body}");
        assert!(!body.contains("ldmatrix") && !body.contains("mma.sync"));
        assert_eq!(stages > 1, body.contains("cp.async.cg.shared.global"));
        assemble(&p, Target::Sm90a);
        // The portable targets keep `mma.sync`.
        for t in [Target::Sm80, Target::Sm90] {
            let q = pipelined_for(bm, bn, bk, w, stages, t);
            assert!(!q.uses_wgmma && !q.ptx.contains("wgmma"));
        }
    }
    // Tiles no warpgroup layout covers (fewer than 16 rows a warp) keep `mma.sync`.
    let p = pipelined_for(64, 64, 32, 8, 3, Target::Sm90a);
    assert!(!p.uses_wgmma && p.ptx.contains("mma.sync"));
}

/// A ring whose extra buffer does not fit (128 x 256 x 64, four stages: five 48 KiB
/// buffers would be 240 KiB) issues its copies after the running group's wait, behind a
/// second barrier, into the stage the group before read: `num_stages` buffers, copies
/// `num_stages - 1` iterations ahead. Three stages keep the early order.
#[test]
fn wgmma_ring_goes_late_without_room() {
    let stage = (128 + 256) * 64 * 2;
    for (stages, late) in [(4u32, true), (3, false)] {
        let p = pipelined_for(128, 256, 64, 8, stages, Target::Sm90a);
        assert!(p.uses_wgmma);
        let body = loop_body(&p.ptx);
        let copy = body.find("cp.async.cg.shared.global").expect("copies");
        let wait = body
            .find("wgmma.wait_group.sync.aligned 1")
            .expect("a running group");
        assert_eq!(copy > wait, late, "{body}");
        assert_eq!(body.matches("bar.sync 0").count(), if late { 2 } else { 1 });
        let (buffers, ahead) = if late {
            (stages, stages - 1)
        } else {
            (stages + 1, stages - 1)
        };
        assert_eq!(p.shared_bytes, buffers * stage);
        assert!(
            body.contains(&format!("cp.async.wait_group {}", ahead - 1)),
            "{body}"
        );
        // The copies of the first `ahead` iterations are issued before the loop.
        let before = &p.ptx[..p.ptx.find(body).unwrap()];
        assert_eq!(
            before.matches("cp.async.commit_group").count(),
            ahead as usize
        );
        assemble(&p, Target::Sm90a);
    }
    // The portable module of the same variant does not fit on sm_80.
    let spec = crate::Specialization {
        consts: [("BM", 128), ("BN", 256), ("BK", 64), ("ACC", 0)]
            .iter()
            .map(|(n, v)| (n.to_string(), *v))
            .collect(),
        num_warps: 8,
        num_stages: None,
    };
    let src = format!(
        "#[kernel(BM = [128], BN = [256], BK = [64], ACC = [0], num_warps = [8], num_stages = [4])]\n{}",
        super::gpu_tests::matmul_pipelined()
    );
    let k = crate::compile_source(&src, &spec).unwrap();
    let e = compile(&k, Target::Sm80).unwrap_err();
    assert!(e.message.contains("163 KiB"), "{}", e.message);
}

/// The vector width of each global access of a one-kernel source on 4 warps (sm_90).
fn access_widths(src: &str) -> Vec<usize> {
    let spec = crate::Specialization {
        consts: vec![],
        num_warps: 4,
        num_stages: None,
    };
    let k = crate::compile_source(src, &spec).unwrap();
    let p = compile(&k, Target::Sm90).unwrap();
    p.accesses.iter().map(|a| a.width).collect()
}

/// `x % m` with `m` a multiple of 16 keeps 16-element runs of a contiguous `x`
/// contiguous and aligned (Triton's `rn % N` edge wrap), so loads through it stay 16
/// bytes wide; an `m` with no known divisor makes them scalar.
#[test]
fn remainder_by_a_multiple_keeps_runs_contiguous() {
    let src = |m: &str| {
        format!(
            "#[kernel] fn k(x: Ptr<f32>, y: Ptr<f32>, #[multiple_of(16)] n: i32, j: i32) {{
                let offs = program_id(0) * 1024 + arange(0, 1024);
                store(y + offs, load(x + offs % {m}));
            }}"
        )
    };
    let widths = |m: &str| access_widths(&src(m));
    assert_eq!(widths("n"), [4, 4]);
    assert_eq!(widths("64"), [4, 4]);
    assert_eq!(widths("2"), [2, 4]);
    assert_eq!(widths("j"), [1, 4]);
}

/// A mask bounded through `minimum`/`maximum` of multiples of 16 stays uniform over
/// 16-element runs, so the loads it guards keep their 16-byte width (and a bound that is
/// only sometimes a multiple does not).
#[test]
fn masks_bounded_by_minimum_of_multiples_stay_vectorized() {
    let src = |bound: &str| {
        format!(
            "#[kernel] fn k(x: Ptr<f32>, y: Ptr<f32>, #[multiple_of(16)] n: i32, #[multiple_of(16)] k0: i32, j: i32) {{
                let offs = program_id(0) * 1024 + arange(0, 1024);
                let mask = offs < {bound};
                store(y + offs, load(x + offs, mask, 0.0), mask);
            }}"
        )
    };
    let widths = |bound: &str| access_widths(&src(bound));
    assert_eq!(widths("n"), [4, 4]);
    assert_eq!(widths("minimum(n, k0 + 2048) - k0"), [4, 4]);
    assert_eq!(widths("maximum(n, 64)"), [4, 4]);
    assert_eq!(widths("minimum(n, j)"), [1, 1]);
}

/// A load next to a reduction's result in an elementwise op follows the result's layout
/// (`residual_is_loaded_in_the_reductions_layout`) only where it keeps its vector width:
/// a weight tile meeting activation words packed by a reduction (the quantized GEMVs'
/// norm prologue) stays 16 bytes a thread, and the packed words move instead.
#[test]
fn loads_keep_their_width_beside_a_reduced_operand() {
    let src = "#[kernel] fn k(w: Ptr<u32>, a: Ptr<i32>, y: Ptr<i32>) {
        let r = arange(0, 8);
        let b = arange(0, 32);
        let c = arange(0, 4);
        let wt = load(w + (r * 128).expand_dims(1).expand_dims(2) + (b * 4).expand_dims(1) + c);
        let e = (b * 16).expand_dims(1).expand_dims(2) + (c * 4).expand_dims(1) + arange(0, 4);
        let words = load(a + e).sum(2);
        let d = dot4(wt.bitcast::<i32>(), words.expand_dims(0), 0).sum(2).sum(1);
        store(y + r, d);
    }";
    let spec = crate::Specialization {
        consts: vec![],
        num_warps: 4,
        num_stages: None,
    };
    let k = crate::compile_source(src, &spec).unwrap();
    let p = compile(&k, Target::Sm90).unwrap();
    let widths: Vec<usize> = p.accesses.iter().map(|a| a.width).collect();
    // The weight tile (two 16-byte vectors a thread), then the activation (one).
    assert_eq!(widths[..2], [4, 4], "{widths:?}");
    assert_eq!(p.ptx.matches("ld.global.v4.b32").count(), 3, "{}", p.ptx);
}

#[test]
fn staged_loops_copy_their_loads_ahead_without_barriers() {
    // `.stages(n)`: the loads that qualify (bf16 weights, `u32` words through a carried
    // pointer tile, the `f32` row vector) become per-thread `cp.async` copies `n - 1`
    // iterations ahead and reads of the thread's own slots; the `u8` tile and the load
    // with a non-zero `other` stay global loads. No thread reads another's slots, so
    // the loop has no barrier.
    for (stages, bn, bk, warps) in [(3, 4, 256, 4), (2, 16, 128, 8), (4, 8, 64, 4)] {
        let src =
            super::gpu_tests::GEMV_STAGED.replace(".stages(3)", &format!(".stages({stages})"));
        let src =
            format!("#[kernel(BLOCK_N = [{bn}], BLOCK_K = [{bk}], num_warps = [{warps}])]\n{src}");
        let spec = crate::Specialization {
            consts: vec![("BLOCK_N".into(), bn), ("BLOCK_K".into(), bk)],
            num_warps: warps,
            num_stages: None,
        };
        let k = crate::compile_source(&src, &spec).expect("compiles");
        let p = check(&k);
        let parts: Vec<&str> = p.ptx.split("$L_loop_").collect();
        assert_eq!(parts.len(), 3, "one loop:\n{}", numbered(&p.ptx));
        let (before, body) = (parts[0], parts[1]);
        let copies = |s: &str| s.matches("cp.async.c").count();
        // Before the loop: `n - 1` iterations' copies of the three staged loads.
        let per_iteration = copies(body);
        assert!(per_iteration >= 3, "{}", numbered(&p.ptx));
        assert_eq!(
            copies(before),
            (stages as usize - 1) * per_iteration,
            "{}",
            numbered(&p.ptx)
        );
        assert!(
            body.contains(&format!("cp.async.wait_group {}", stages - 2)),
            "{}",
            numbered(&p.ptx)
        );
        assert!(body.contains("ld.shared"), "{}", numbered(&p.ptx));
        assert!(!body.contains("bar.sync"), "{}", numbered(&p.ptx));
        // What stays plain: the bytes and the load with `other = 2.0`.
        let global = |ty: &str| {
            body.lines()
                .any(|l| l.contains("ld.global") && l.contains(ty))
        };
        assert!(global(".u8 "), "{}", numbered(&p.ptx));
        assert!(global(".f32 "), "{}", numbered(&p.ptx));
        assert!(!global(".b32 ") && !global(".b16 "), "{}", numbered(&p.ptx));
        assert!(p.ptx.contains("cp.async.wait_all"));
        assert!(p.shared_bytes > 0);
    }
}

#[test]
fn a_register_limit_caps_maxnreg() {
    let src = "#[kernel(B = [256], num_warps = [4], max_registers(80, B = 256))]
        fn k<const B: usize>(x: Ptr<f32>) { let i = arange(0, B); store(x + i, load(x + i) * 2.0); }";
    let spec = crate::Specialization {
        consts: vec![("B".into(), 256)],
        num_warps: 4,
        num_stages: None,
    };
    let k = crate::compile_source(src, &spec).expect("compiles");
    assert!(check(&k).ptx.contains(".maxnreg 80\n"));
    let plain =
        crate::compile_source(&src.replace(", max_registers(80, B = 256)", ""), &spec).unwrap();
    assert!(check(&plain).ptx.contains(".maxnreg 248\n"));
}
