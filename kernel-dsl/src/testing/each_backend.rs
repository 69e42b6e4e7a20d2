//! Runtime tests written once and run on every backend: hand-built kernels
//! ([`Builder`]) checked against plain-Rust references on the interpreter, and on the GPU
//! through the PTX backend when there is one.
//!
//! Written outputs start poisoned (NaN, or a sentinel past the last valid element), so a
//! lane that writes outside its mask, or a valid lane left unwritten, is caught.

// Index loops mirror the math of the references.
#![allow(clippy::needless_range_loop)]

use half::f16;

use super::{on_each_backend, Backend, Data, Rng};
use crate::interp::Scalar;
use crate::ir::builder::Builder;
use crate::ir::{BinaryOp, CmpOp, DType, Kernel, ReduceOp, ValueId};

/// Elements per program of [`vector_add`].
pub(crate) const ADD_BLOCK: usize = 256;

/// `out[i] = x[i] + y[i]` for `i < n`, [`ADD_BLOCK`] elements per program.
pub(crate) fn vector_add() -> Kernel {
    let mut b = Builder::new("add", 4);
    let x = b.ptr("x", DType::F32);
    let y = b.ptr("y", DType::F32);
    let out = b.ptr("out", DType::F32);
    let n = b.scalar("n", DType::I32);
    let pid = b.pid(0);
    let bs = b.i32(ADD_BLOCK as i64);
    let base = b.bin(BinaryOp::Mul, pid, bs);
    let ar = b.arange(0, ADD_BLOCK as i64);
    let offs = b.bin(BinaryOp::Add, base, ar);
    let mask = b.cmp(CmpOp::Lt, offs, n);
    let xp = b.add_ptr(x, offs);
    let yp = b.add_ptr(y, offs);
    let xv = b.load(xp, Some(mask), None);
    let yv = b.load(yp, Some(mask), None);
    let s = b.bin(BinaryOp::Add, xv, yv);
    let op = b.add_ptr(out, offs);
    b.store(op, s, Some(mask));
    b.finish()
}

/// The offsets `row * cols + col` of a row-major `[rows, cols]` tile, with the row and
/// column index vectors.
fn row_major(b: &mut Builder, rows: usize, cols: usize) -> (ValueId, [ValueId; 2]) {
    let rr = b.arange(0, rows as i64);
    let rc = b.arange(0, cols as i64);
    let r = b.expand(rr, 1);
    let w = b.i32(cols as i64);
    let r = b.bin(BinaryOp::Mul, r, w);
    let r = b.broadcast(r, &[rows, cols]);
    let c = b.expand(rc, 0);
    let c = b.broadcast(c, &[rows, cols]);
    (b.bin(BinaryOp::Add, r, c), [rr, rc])
}

fn f32s(d: &Data) -> &[f32] {
    match d {
        Data::F32(v) => v,
        other => panic!("expected an f32 buffer, got {other:?}"),
    }
}

fn i32s(d: &Data) -> &[i32] {
    match d {
        Data::I32(v) => v,
        other => panic!("expected an i32 buffer, got {other:?}"),
    }
}

#[test]
fn vector_add_masks() {
    let k = vector_add();
    on_each_backend("vector_add_masks", |be: &Backend| {
        let mut rng = Rng(1);
        for n in [1000usize, 100, 1024, 1] {
            let x = rng.f32s(n);
            let y = rng.f32s(n);
            // One sentinel past the end shows masked lanes write nothing.
            let grid = n.div_ceil(ADD_BLOCK) as u32;
            let data = [
                Data::F32(x.clone()),
                Data::F32(y.clone()),
                Data::F32(vec![7.0; n + 1]),
                Data::S(Scalar::I32(n as i32)),
            ];
            let got = be.run(&k, [grid, 1, 1], &data);
            let out = f32s(&got[2]);
            for i in 0..n {
                assert_eq!(out[i], x[i] + y[i], "{be}: n={n} i={i}");
            }
            assert_eq!(out[n], 7.0, "{be}: n={n}");
        }
    });
}

#[test]
fn broadcast_2d_outer_sum() {
    // out[i, j] = x[i] + y[j] for an [M, N] tile.
    const M: usize = 4;
    const N: usize = 8;
    let mut b = Builder::new("outer", 4);
    let x = b.ptr("x", DType::F32);
    let y = b.ptr("y", DType::F32);
    let out = b.ptr("out", DType::F32);
    let rm = b.arange(0, M as i64);
    let rn = b.arange(0, N as i64);
    let xp = b.add_ptr(x, rm);
    let yp = b.add_ptr(y, rn);
    let xv = b.load(xp, None, None);
    let yv = b.load(yp, None, None);
    let xc = b.expand(xv, 1); // [M, 1]
    let yr = b.expand(yv, 0); // [1, N]
    let xb2 = b.broadcast(xc, &[M, N]);
    let yb2 = b.broadcast(yr, &[M, N]);
    let s = b.bin(BinaryOp::Add, xb2, yb2);
    let (offs, _) = row_major(&mut b, M, N);
    let op = b.add_ptr(out, offs);
    b.store(op, s, None);
    let k = b.finish();
    on_each_backend("broadcast_2d_outer_sum", |be| {
        let mut rng = Rng(2);
        let (xs, ys) = (rng.f32s(M), rng.f32s(N));
        let data = [
            Data::F32(xs.clone()),
            Data::F32(ys.clone()),
            Data::F32(vec![f32::NAN; M * N]),
        ];
        let got = be.run(&k, [1, 1, 1], &data);
        let o = f32s(&got[2]);
        for i in 0..M {
            for j in 0..N {
                assert_eq!(o[i * N + j], xs[i] + ys[j], "{be}: ({i}, {j})");
            }
        }
    });
}

/// Loads an `[R, C]` row-major tile from `x`, reduces along `axis` with `op`, stores the
/// result contiguously into `out`.
fn reduce_kernel(op: ReduceOp, r: usize, c: usize, axis: usize, dout: DType) -> Kernel {
    let mut b = Builder::new("reduce", 4);
    let x = b.ptr("x", DType::F32);
    let out = b.ptr("out", dout);
    let (offs, [rr, rc]) = row_major(&mut b, r, c);
    let xp = b.add_ptr(x, offs);
    let v = b.load(xp, None, None);
    let red = b.reduce(op, v, axis);
    let idx = if axis == 1 { rr } else { rc };
    let op = b.add_ptr(out, idx);
    b.store(op, red, None);
    b.finish()
}

#[test]
fn row_reductions_sum_max_argmax() {
    let (r, c) = (8, 32);
    let sum_rows = reduce_kernel(ReduceOp::Sum, r, c, 1, DType::F32);
    let max_rows = reduce_kernel(ReduceOp::Max, r, c, 1, DType::F32);
    let argmax_rows = reduce_kernel(ReduceOp::Argmax, r, c, 1, DType::I32);
    let sum_cols = reduce_kernel(ReduceOp::Sum, r, c, 0, DType::F32);
    on_each_backend("row_reductions_sum_max_argmax", |be| {
        let mut rng = Rng(3);
        let mut xs = rng.f32s(r * c);
        // Ties and NaN: argmax takes the first maximum and skips NaN.
        xs[5] = 2.0;
        xs[9] = 2.0;
        xs[c] = f32::NAN;
        xs[c + 3] = 5.0;
        for j in 0..c {
            xs[2 * c + j] = f32::NAN;
        }
        let row = |i: usize| &xs[i * c..(i + 1) * c];
        let data = [Data::F32(xs.clone()), Data::F32(vec![f32::NAN; r])];

        let got = be.run(&sum_rows, [1, 1, 1], &data);
        let o = f32s(&got[1]);
        for i in 3..r {
            let want: f32 = row(i).iter().sum();
            assert!(
                (o[i] - want).abs() < 1e-5,
                "{be}: row {i}: {} vs {want}",
                o[i]
            );
        }

        let got = be.run(&max_rows, [1, 1, 1], &data);
        let o = f32s(&got[1]);
        assert_eq!(o[0], 2.0, "{be}");
        assert_eq!(o[1], 5.0, "{be}");
        assert!(o[2].is_nan(), "{be}");
        for i in 3..r {
            let want = row(i).iter().copied().fold(f32::MIN, f32::max);
            assert_eq!(o[i], want, "{be}: row {i}");
        }

        let data = [Data::F32(xs.clone()), Data::I32(vec![-1; r])];
        let got = be.run(&argmax_rows, [1, 1, 1], &data);
        let o = i32s(&got[1]);
        assert_eq!(o[..3], [5, 3, 0], "{be}");
        for i in 3..r {
            let m = row(i).iter().copied().fold(f32::MIN, f32::max);
            let want = row(i).iter().position(|&v| v == m).unwrap();
            assert_eq!(o[i] as usize, want, "{be}: row {i}");
        }

        // Column sums (axis 0) of a NaN-free tile.
        let xs = rng.f32s(r * c);
        let data = [Data::F32(xs.clone()), Data::F32(vec![f32::NAN; c])];
        let got = be.run(&sum_cols, [1, 1, 1], &data);
        let o = f32s(&got[1]);
        for j in 0..c {
            let want: f32 = (0..r).map(|i| xs[i * c + j]).sum();
            assert!((o[j] - want).abs() < 1e-5, "{be}: column {j}");
        }
    });
}

/// `out[0] = sum(x[0..n])` with a loop over blocks of 32 and a carried tile accumulator;
/// `step` overrides the loop's step.
pub(crate) fn loop_sum(step: Option<i64>) -> Kernel {
    const B: usize = 32;
    let mut b = Builder::new("loop_sum", 4);
    let x = b.ptr("x", DType::F32);
    let out = b.ptr("out", DType::F32);
    let n = b.scalar("n", DType::I32);
    let z = b.f32(0.0);
    let acc0 = b.splat(z, &[B]);
    let start = b.i32(0);
    let step = b.i32(step.unwrap_or(B as i64));
    let ar = b.arange(0, B as i64);
    let r = b.for_(start, n, step, &[acc0], |b, i, c| {
        let offs = b.bin(BinaryOp::Add, ar, i);
        let m = b.cmp(CmpOp::Lt, offs, n);
        let p = b.add_ptr(x, offs);
        let v = b.load(p, Some(m), None);
        vec![b.bin(BinaryOp::Add, c[0], v)]
    });
    let s = b.reduce(ReduceOp::Sum, r[0], 0);
    b.store(out, s, None);
    b.finish()
}

#[test]
fn for_loop_with_carried_accumulator() {
    let k = loop_sum(None);
    on_each_backend("for_loop_with_carried_accumulator", |be| {
        let mut rng = Rng(6);
        for n in [0usize, 1, 31, 32, 33, 200] {
            let xs = rng.f32s(n);
            // A buffer is never empty on a device; `n = 0` reads none of it.
            let x = if n == 0 { vec![f32::NAN] } else { xs.clone() };
            let data = [
                Data::F32(x),
                Data::F32(vec![9.0]),
                Data::S(Scalar::I32(n as i32)),
            ];
            let got = be.run(&k, [1, 1, 1], &data);
            let want: f32 = xs.iter().sum();
            let got = f32s(&got[1])[0];
            assert!((got - want).abs() < 1e-4, "{be}: n={n}: {got} vs {want}");
        }
    });
}

#[test]
fn loop_carried_values_swap() {
    // (a, b) = (b, a) three times, then store a: b's initial value.
    let mut b = Builder::new("swap", 4);
    let out = b.ptr("out", DType::I32);
    let a0 = b.i32(1);
    let b0 = b.i32(2);
    let (s, e, st) = (b.i32(0), b.i32(3), b.i32(1));
    let r = b.for_(s, e, st, &[a0, b0], |_, _, c| vec![c[1], c[0]]);
    b.store(out, r[0], None);
    let k = b.finish();
    on_each_backend("loop_carried_values_swap", |be| {
        let got = be.run(&k, [1, 1, 1], &[Data::I32(vec![-1])]);
        assert_eq!(i32s(&got[0]), [2], "{be}");
    });
}

#[test]
fn load_other_fills_masked_lanes() {
    // out[i] = i < 3 ? x[i] : -1, through the load's `other`.
    let mut b = Builder::new("other", 4);
    let x = b.ptr("x", DType::F32);
    let out = b.ptr("out", DType::F32);
    let ar = b.arange(0, 8);
    let three = b.i32(3);
    let m = b.cmp(CmpOp::Lt, ar, three);
    let xp = b.add_ptr(x, ar);
    let neg = b.f32(-1.0);
    let negs = b.splat(neg, &[8]);
    let v = b.load(xp, Some(m), Some(negs));
    let op = b.add_ptr(out, ar);
    b.store(op, v, None);
    let k = b.finish();
    on_each_backend("load_other_fills_masked_lanes", |be| {
        let data = [Data::F32(vec![5.0, 6.0, 7.0]), Data::F32(vec![f32::NAN; 8])];
        let got = be.run(&k, [1, 1, 1], &data);
        assert_eq!(
            f32s(&got[1]),
            [5.0, 6.0, 7.0, -1.0, -1.0, -1.0, -1.0, -1.0],
            "{be}"
        );
    });
}

#[test]
fn dot_matches_naive() {
    const M: usize = 16;
    const K: usize = 32;
    const N: usize = 8;
    let mut b = Builder::new("dot", 4);
    let a = b.ptr("a", DType::F16);
    let bp = b.ptr("b", DType::F16);
    let c = b.ptr("c", DType::F32);
    let out = b.ptr("out", DType::F32);
    let tile = |b: &mut Builder, p: ValueId, rows: usize, cols: usize| {
        let (offs, _) = row_major(b, rows, cols);
        b.add_ptr(p, offs)
    };
    let ap = tile(&mut b, a, M, K);
    let bpp = tile(&mut b, bp, K, N);
    let cp = tile(&mut b, c, M, N);
    let op = tile(&mut b, out, M, N);
    let av = b.load(ap, None, None);
    let bv = b.load(bpp, None, None);
    let cv = b.load(cp, None, None);
    let d = b.dot(av, bv, Some(cv));
    b.store(op, d, None);
    let k = b.finish();
    on_each_backend("dot_matches_naive", |be| {
        let mut rng = Rng(7);
        let ah: Vec<f16> = (0..M * K).map(|_| f16::from_f32(rng.f32())).collect();
        let bh: Vec<f16> = (0..K * N).map(|_| f16::from_f32(rng.f32())).collect();
        let cs = rng.f32s(M * N);
        let data = [
            Data::F16(ah.clone()),
            Data::F16(bh.clone()),
            Data::F32(cs.clone()),
            Data::F32(vec![f32::NAN; M * N]),
        ];
        let got = be.run(&k, [1, 1, 1], &data);
        let o = f32s(&got[3]);
        for i in 0..M {
            for j in 0..N {
                let mut want = cs[i * N + j] as f64;
                for kk in 0..K {
                    want += ah[i * K + kk].to_f64() * bh[kk * N + j].to_f64();
                }
                let err = (o[i * N + j] as f64 - want).abs();
                assert!(err < 1e-4, "{be}: ({i}, {j}): {} vs {want}", o[i * N + j]);
            }
        }
    });
}
