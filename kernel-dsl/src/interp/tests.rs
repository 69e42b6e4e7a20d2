// Index loops mirror the math of the references.
#![allow(clippy::needless_range_loop)]

use super::ops::{self, Data};
use super::{run, Arg, InterpError, Scalar};
use crate::ir::builder::Builder;
use crate::ir::{AtomicOp, BinaryOp, CmpOp, DType, Kernel, Literal, ReduceOp, UnaryOp, ValueId};
use crate::testing::each_backend::{loop_sum, vector_add};
use crate::testing::{bytes_f32, bytes_i32, f32_bytes, i32_bytes, Rng};
use half::{bf16, f16};

/// `out[i] = f(x[i])` over `n` elements, masked, one block per program.
fn map_kernel(
    name: &str,
    din: DType,
    dout: DType,
    block: usize,
    f: impl FnOnce(&mut Builder, ValueId) -> ValueId,
) -> Kernel {
    let mut b = Builder::new(name, 4);
    let x = b.ptr("x", din);
    let out = b.ptr("out", dout);
    let n = b.scalar("n", DType::I32);
    let pid = b.pid(0);
    let bs = b.i32(block as i64);
    let base = b.bin(BinaryOp::Mul, pid, bs);
    let ar = b.arange(0, block as i64);
    let offs = b.bin(BinaryOp::Add, base, ar);
    let mask = b.cmp(CmpOp::Lt, offs, n);
    let xp = b.add_ptr(x, offs);
    let xv = b.load(xp, Some(mask), None);
    let y = f(&mut b, xv);
    let op = b.add_ptr(out, offs);
    b.store(op, y, Some(mask));
    b.finish()
}

fn run_map(k: &Kernel, input: &[u8], out_len: usize, n: usize, block: usize) -> Vec<u8> {
    let mut out = vec![0u8; out_len];
    let grid = n.div_ceil(block) as u32;
    run(
        k,
        [grid, 1, 1],
        &mut [
            Arg::Read(input),
            Arg::Write(&mut out),
            Arg::Scalar(Scalar::I32(n as i32)),
        ],
    )
    .unwrap();
    out
}

#[test]
fn an_empty_grid_runs_no_program() {
    // n = 0 gives a grid of 0 programs (the runtime refuses such a launch on a device; the
    // interpreter runs nothing).
    let k = vector_add();
    let mut out = f32_bytes(&[7.0]);
    run(
        &k,
        [0, 1, 1],
        &mut [
            Arg::Read(&[]),
            Arg::Read(&[]),
            Arg::Write(&mut out),
            Arg::Scalar(Scalar::I32(0)),
        ],
    )
    .unwrap();
    assert_eq!(bytes_f32(&out), [7.0]);
}

#[test]
fn out_of_bounds_load_names_param_index_and_program() {
    // No mask: the second program reads past the end of `x`.
    let mut b = Builder::new("oob", 4);
    let x = b.ptr("x", DType::F32);
    let out = b.ptr("out", DType::F32);
    let pid = b.pid(0);
    let bs = b.i32(4);
    let base = b.bin(BinaryOp::Mul, pid, bs);
    let ar = b.arange(0, 4);
    let offs = b.bin(BinaryOp::Add, base, ar);
    let xp = b.add_ptr(x, offs);
    let v = b.load(xp, None, None);
    let op = b.add_ptr(out, offs);
    b.store(op, v, None);
    let k = b.finish();
    let xb = f32_bytes(&[1.0; 6]);
    let mut ob = f32_bytes(&[0.0; 8]);
    let e = run(&k, [2, 1, 1], &mut [Arg::Read(&xb), Arg::Write(&mut ob)]).unwrap_err();
    let s = e.to_string();
    assert!(s.contains("`oob`"), "{s}");
    assert!(s.contains("`x`"), "{s}");
    assert!(s.contains("element index 6"), "{s}");
    assert!(s.contains("program (1, 0, 0)"), "{s}");
    // The first program completed.
    assert_eq!(bytes_f32(&ob)[..4], [1.0; 4]);
}

#[test]
fn store_through_read_only_buffer_is_an_error() {
    let k = vector_add();
    let (xb, yb, ob) = (
        f32_bytes(&[0.0; 4]),
        f32_bytes(&[0.0; 4]),
        f32_bytes(&[0.0; 4]),
    );
    let e = run(
        &k,
        [1, 1, 1],
        &mut [
            Arg::Read(&xb),
            Arg::Read(&yb),
            Arg::Read(&ob),
            Arg::Scalar(Scalar::I32(4)),
        ],
    )
    .unwrap_err();
    assert!(
        e.message.contains("read-only") && e.message.contains("`out`"),
        "{e}"
    );
}

#[test]
fn argument_checks() {
    let k = vector_add();
    let xb = f32_bytes(&[0.0; 4]);
    let mut ob = f32_bytes(&[0.0; 4]);
    let e = run(&k, [1, 1, 1], &mut [Arg::Read(&xb)]).unwrap_err();
    assert!(e.message.contains("1 arguments for 4 parameters"), "{e}");
    let odd = vec![0u8; 6];
    let e = run(
        &k,
        [1, 1, 1],
        &mut [
            Arg::Read(&xb),
            Arg::Read(&odd),
            Arg::Write(&mut ob),
            Arg::Scalar(Scalar::I32(4)),
        ],
    )
    .unwrap_err();
    assert!(
        e.message.contains("`y`") && e.message.contains("multiple"),
        "{e}"
    );
    let e = run(
        &k,
        [1, 1, 1],
        &mut [
            Arg::Read(&xb),
            Arg::Read(&xb),
            Arg::Write(&mut ob),
            Arg::Scalar(Scalar::F32(4.0)),
        ],
    )
    .unwrap_err();
    assert!(e.message.contains("`n`"), "{e}");
    let e = run(
        &k,
        [1, 1, 1],
        &mut [
            Arg::Scalar(Scalar::I32(0)),
            Arg::Read(&xb),
            Arg::Write(&mut ob),
            Arg::Scalar(Scalar::I32(4)),
        ],
    )
    .unwrap_err();
    assert!(e.message.contains("`x`"), "{e}");
}

#[test]
fn f16_sum_accumulates_in_f32_and_rounds_once() {
    // 1 + 2048 * 2^-11: each partial sum in f16 would stay at 1 (spacing 2^-10 at 1).
    let mut x = vec![f16::from_f32(2f32.powi(-11)); 2048];
    x[0] = f16::ONE;
    let d = Data::F(x.iter().map(|h| h.to_f32()).collect());
    let r = ops::reduce(ReduceOp::Sum, DType::F16, &d, &[2048], 0).unwrap();
    let want = f16::from_f32(1.0 + 2047.0 * 2f32.powi(-11)).to_f32();
    assert_eq!(r, Data::F(vec![want]));
    assert!(want > 1.9);
}

#[test]
fn casts() {
    let f = |v: &[f32]| Data::F(v.to_vec());
    let i = |v: &[i64]| Data::I(v.to_vec());
    // f32 -> bf16 / f16: round to nearest even.
    let xs = [
        1.0 + 2f32.powi(-8),
        1.0 + 3.0 * 2f32.powi(-8),
        3.3,
        -7.77e5,
        1e-40,
        7e4,
    ];
    let Data::F(b) = ops::cast(&f(&xs), DType::F32, DType::BF16).unwrap() else {
        panic!()
    };
    for (x, y) in xs.iter().zip(&b) {
        assert_eq!(*y, bf16::from_f32(*x).to_f32());
    }
    assert_eq!(b[0], 1.0);
    assert_eq!(b[1], 1.0 + 2f32.powi(-6));
    let Data::F(h) = ops::cast(&f(&xs), DType::F32, DType::F16).unwrap() else {
        panic!()
    };
    assert_eq!(h[5], f32::INFINITY);
    // float -> int: truncate, saturate, NaN -> 0.
    let xs = [1e10, -1e10, f32::NAN, -1.9, 2.9, 300.7, -0.5];
    assert_eq!(
        ops::cast(&f(&xs), DType::F32, DType::I32).unwrap(),
        i(&[i32::MAX as i64, i32::MIN as i64, 0, -1, 2, 300, 0])
    );
    assert_eq!(
        ops::cast(&f(&xs), DType::F32, DType::U8).unwrap(),
        i(&[255, 0, 0, 0, 2, 255, 0])
    );
    assert_eq!(
        ops::cast(&f(&xs), DType::F32, DType::U32).unwrap(),
        i(&[u32::MAX as i64, 0, 0, 0, 2, 300, 0])
    );
    // int -> int wraps.
    assert_eq!(
        ops::cast(&i(&[300, -1, 255]), DType::I32, DType::U8).unwrap(),
        i(&[44, 255, 255])
    );
    assert_eq!(
        ops::cast(&i(&[-1]), DType::I32, DType::U32).unwrap(),
        i(&[u32::MAX as i64])
    );
    assert_eq!(
        ops::cast(&i(&[u32::MAX as i64]), DType::U32, DType::I32).unwrap(),
        i(&[-1])
    );
    // int -> float rounds once: through f32 this would double-round to 2^24.
    let x = (1i64 << 24) + (1 << 16) + 1;
    assert_eq!(
        ops::cast(&i(&[x, 257, 65519, 65520]), DType::I64, DType::BF16).unwrap(),
        f(&[(1 << 24) as f32 + (1 << 17) as f32, 256.0, 65536.0, 65536.0])
    );
    assert_eq!(
        ops::cast(
            &i(&[2049, 2051, 65519, 65520, -70000]),
            DType::I32,
            DType::F16
        )
        .unwrap(),
        f(&[2048.0, 2052.0, 65504.0, f32::INFINITY, f32::NEG_INFINITY])
    );
    // to bool: != 0 (NaN is true); bool to numbers: 0/1.
    assert_eq!(
        ops::cast(&f(&[0.0, -0.0, f32::NAN, 0.5]), DType::F32, DType::Bool).unwrap(),
        Data::B(vec![false, false, true, true])
    );
    assert_eq!(
        ops::cast(&Data::B(vec![true, false]), DType::Bool, DType::F16).unwrap(),
        f(&[1.0, 0.0])
    );
    assert_eq!(
        ops::cast(&Data::B(vec![true, false]), DType::Bool, DType::I64).unwrap(),
        i(&[1, 0])
    );
}

#[test]
fn float_literals_round_once() {
    // A value just above a bf16 tie: f64 -> f32 would land on the tie and round down.
    let x = 1.0 + 2f64.powi(-8) + 2f64.powi(-40);
    assert_eq!(ops::f64_to_float(DType::BF16, x), 1.0 + 2f32.powi(-7));
    assert_eq!(
        ops::f64_to_float(DType::F16, 0.1),
        f16::from_f64(0.1).to_f32()
    );
    assert_eq!(ops::f64_to_float(DType::F32, 0.1), 0.1f32);
}

#[test]
fn bf16_kernel_cast_roundtrip() {
    // Load f32, cast to bf16, multiply by 3 (rounded in bf16), store bf16.
    let k = map_kernel("to_bf16", DType::F32, DType::BF16, 64, |b, x| {
        let h = b.cast(x, DType::BF16);
        let three = b.lit(Literal::Float(3.0, None), DType::BF16);
        b.bin(BinaryOp::Mul, h, three)
    });
    let mut rng = Rng(4);
    let n = 100;
    let xs: Vec<f32> = (0..n).map(|_| rng.f32() * 100.0).collect();
    let out = run_map(&k, &f32_bytes(&xs), n * 2, n, 64);
    for (i, c) in out.chunks_exact(2).enumerate() {
        let got = bf16::from_le_bytes([c[0], c[1]]);
        let want = bf16::from_f32(bf16::from_f32(xs[i]).to_f32() * 3.0);
        assert_eq!(got, want, "i={i}");
    }
}

#[test]
fn f16_ops_round_every_result() {
    let mut rng = Rng(5);
    let a: Vec<f32> = (0..64)
        .map(|_| f16::from_f32(rng.f32() * 10.0).to_f32())
        .collect();
    let b: Vec<f32> = (0..64).map(|_| f16::from_f32(rng.f32()).to_f32()).collect();
    let got = ops::binary(
        BinaryOp::Div,
        DType::F16,
        &Data::F(a.clone()),
        &Data::F(b.clone()),
    );
    let want: Vec<f32> = a
        .iter()
        .zip(&b)
        .map(|(x, y)| f16::from_f32(x / y).to_f32())
        .collect();
    assert_eq!(got.unwrap(), Data::F(want));
    let got = ops::unary(UnaryOp::Exp, DType::F16, &Data::F(b.clone())).unwrap();
    let want: Vec<f32> = b.iter().map(|x| f16::from_f32(x.exp()).to_f32()).collect();
    assert_eq!(got, Data::F(want));
}

#[test]
fn integer_ops_wrap_and_shift() {
    let i = |v: &[i64]| Data::I(v.to_vec());
    let bin = |op, d, a: &[i64], b: &[i64]| ops::binary(op, d, &i(a), &i(b)).unwrap();
    let (mn, mx) = (i32::MIN as i64, i32::MAX as i64);
    assert_eq!(bin(BinaryOp::Add, DType::I32, &[mx], &[1]), i(&[mn]));
    assert_eq!(bin(BinaryOp::Mul, DType::U32, &[1 << 31], &[2]), i(&[0]));
    assert_eq!(bin(BinaryOp::Sub, DType::U8, &[0], &[1]), i(&[255]));
    assert_eq!(
        bin(BinaryOp::Div, DType::I32, &[-7, 7, mn], &[2, -2, -1]),
        i(&[-3, -3, mn])
    );
    assert_eq!(
        bin(BinaryOp::Rem, DType::I32, &[-7, 7], &[2, -2]),
        i(&[-1, 1])
    );
    let e = ops::binary(BinaryOp::Div, DType::I32, &i(&[1, 2]), &i(&[1, 0])).unwrap_err();
    assert!(e.contains("division by zero"), "{e}");
    // Shifts: at or over the width give 0, or the sign for signed `>>`; amounts are
    // read as unsigned, so a negative amount is huge.
    assert_eq!(
        bin(
            BinaryOp::Shl,
            DType::I32,
            &[1, 1, 3, 1, 5],
            &[31, 32, 33, -1, 0]
        ),
        i(&[mn, 0, 0, 0, 5])
    );
    assert_eq!(
        bin(
            BinaryOp::Shr,
            DType::I32,
            &[-8, -8, 8, mn, -1],
            &[1, 40, 40, 31, -3]
        ),
        i(&[-4, -1, 0, -1, -1])
    );
    assert_eq!(
        bin(
            BinaryOp::Shr,
            DType::U32,
            &[u32::MAX as i64, 8, 8],
            &[31, 32, 3]
        ),
        i(&[1, 0, 1])
    );
    assert_eq!(
        bin(BinaryOp::Shl, DType::U8, &[255, 1], &[1, 8]),
        i(&[254, 0])
    );
    assert_eq!(
        bin(BinaryOp::Shl, DType::I64, &[1, 1], &[63, 64]),
        i(&[i64::MIN, 0])
    );
    assert_eq!(
        bin(BinaryOp::Max, DType::I32, &[-3, 4], &[2, 1]),
        i(&[2, 4])
    );
    // Unary: wrapping neg/abs, bitwise not.
    assert_eq!(
        ops::unary(UnaryOp::Neg, DType::I32, &i(&[mn, 3])).unwrap(),
        i(&[mn, -3])
    );
    assert_eq!(
        ops::unary(UnaryOp::Not, DType::U8, &i(&[0, 0xF0])).unwrap(),
        i(&[255, 0x0F])
    );
    assert_eq!(
        ops::unary(UnaryOp::Not, DType::I32, &i(&[0])).unwrap(),
        i(&[-1])
    );
    assert_eq!(
        ops::unary(UnaryOp::Not, DType::Bool, &Data::B(vec![true])).unwrap(),
        Data::B(vec![false])
    );
}

#[test]
fn integer_division_by_zero_in_a_kernel() {
    let k = map_kernel("divz", DType::I32, DType::I32, 4, |b, x| {
        let z = b.i32(0);
        b.bin(BinaryOp::Div, x, z)
    });
    let xb = i32_bytes(&[1, 2, 3, 4]);
    let mut ob = vec![0u8; 16];
    let e = run(
        &k,
        [1, 1, 1],
        &mut [
            Arg::Read(&xb),
            Arg::Write(&mut ob),
            Arg::Scalar(Scalar::I32(4)),
        ],
    )
    .unwrap_err();
    assert!(e.message.contains("division by zero"), "{e}");
}

#[test]
fn a_loop_step_of_zero_is_an_error() {
    let k = loop_sum(Some(0));
    let xb = f32_bytes(&[1.0]);
    let mut ob = f32_bytes(&[0.0]);
    let e = run(
        &k,
        [1, 1, 1],
        &mut [
            Arg::Read(&xb),
            Arg::Write(&mut ob),
            Arg::Scalar(Scalar::I32(1)),
        ],
    )
    .unwrap_err();
    assert!(e.message.contains("step 0"), "{e}");
}

#[test]
fn if_with_merges_and_grid_order() {
    // Program (x, y) of a 3x2 grid: order = atomic_add(counter, 1); out[y*3+x] = order,
    // plus 100 if x == 0 (through an if/else merge).
    let mut b = Builder::new("order", 4);
    let counter = b.ptr("counter", DType::I32);
    let out = b.ptr("out", DType::I32);
    let px = b.pid(0);
    let py = b.pid(1);
    let one = b.i32(1);
    let order = b.atomic(AtomicOp::Add, counter, one, None);
    let zero = b.i32(0);
    let c = b.cmp(CmpOp::Eq, px, zero);
    let r = b.if_(
        c,
        |b| {
            let h = b.i32(100);
            vec![b.bin(BinaryOp::Add, order, h)]
        },
        |_| vec![order],
    );
    let three = b.i32(3);
    let row = b.bin(BinaryOp::Mul, py, three);
    let idx = b.bin(BinaryOp::Add, row, px);
    let p = b.add_ptr(out, idx);
    b.store(p, r[0], None);
    let k = b.finish();
    let mut cb = vec![0u8; 4];
    let mut ob = vec![0u8; 24];
    run(
        &k,
        [3, 2, 1],
        &mut [Arg::Write(&mut cb), Arg::Write(&mut ob)],
    )
    .unwrap();
    assert_eq!(bytes_i32(&ob), [100, 1, 2, 103, 4, 5]);
    assert_eq!(bytes_i32(&cb), [6]);
}

#[test]
fn atomics_return_old_values() {
    // Every lane of 4 programs adds x[i] into out[0] and maxes x[i] into out[1]
    // (masked to the first 6 lanes of each program).
    const L: usize = 8;
    let mut b = Builder::new("atomics", 4);
    let x = b.ptr("x", DType::F32);
    let xi = b.ptr("xi", DType::I32);
    let acc = b.ptr("acc", DType::F32);
    let imax = b.ptr("imax", DType::I32);
    let old = b.ptr("old", DType::F32);
    let pid = b.pid(0);
    let l = b.i32(L as i64);
    let base = b.bin(BinaryOp::Mul, pid, l);
    let ar = b.arange(0, L as i64);
    let offs = b.bin(BinaryOp::Add, base, ar);
    let six = b.i32(6);
    let m = b.cmp(CmpOp::Lt, ar, six);
    let xp = b.add_ptr(x, offs);
    let xv = b.load(xp, None, None);
    let xip = b.add_ptr(xi, offs);
    let xiv = b.load(xip, None, None);
    let zero = b.i32(0);
    let accp = b.add_ptr(acc, zero);
    let accp = b.splat(accp, &[L]);
    let o = b.atomic(AtomicOp::Add, accp, xv, Some(m));
    let ip = b.splat(imax, &[L]);
    b.atomic(AtomicOp::Max, ip, xiv, Some(m));
    let op = b.add_ptr(old, offs);
    b.store(op, o, None);
    let k = b.finish();

    let mut rng = Rng(8);
    let xs: Vec<f32> = (0..4 * L).map(|_| (rng.below(100) as f32) / 4.0).collect();
    let xis: Vec<i32> = (0..4 * L).map(|_| rng.below(1000) as i32 - 500).collect();
    let (xb, xib) = (f32_bytes(&xs), i32_bytes(&xis));
    let mut accb = f32_bytes(&[0.5]);
    let mut imb = i32_bytes(&[-1000]);
    let mut oldb = vec![0u8; 4 * L * 4];
    run(
        &k,
        [4, 1, 1],
        &mut [
            Arg::Read(&xb),
            Arg::Read(&xib),
            Arg::Write(&mut accb),
            Arg::Write(&mut imb),
            Arg::Write(&mut oldb),
        ],
    )
    .unwrap();
    // Sequential reference in program, then lane order.
    let mut s = 0.5f32;
    let mut want_old = vec![0.0f32; 4 * L];
    let mut mx = -1000;
    for i in 0..4 * L {
        if i % L < 6 {
            want_old[i] = s;
            s += xs[i];
            mx = mx.max(xis[i]);
        }
    }
    assert_eq!(bytes_f32(&oldb), want_old);
    assert_eq!(bytes_f32(&accb), [s]);
    assert_eq!(bytes_i32(&imb), [mx]);
}

/// `out[idx[i]] = vals[i]` for the 16 lanes where `mask` holds, one program.
fn scatter_kernel(mask_below: i64) -> Kernel {
    let mut b = Builder::new("scatter", 4);
    let idx = b.ptr("idx", DType::I32);
    let vals = b.ptr("vals", DType::I32);
    let out = b.ptr("out", DType::I32);
    let ar = b.arange(0, 16);
    let ip = b.add_ptr(idx, ar);
    let i = b.load(ip, None, None);
    let vp = b.add_ptr(vals, ar);
    let v = b.load(vp, None, None);
    let lim = b.i32(mask_below);
    let m = b.cmp(CmpOp::Lt, ar, lim);
    let op = b.add_ptr(out, i);
    b.store(op, v, Some(m));
    b.finish()
}

fn run_scatter(k: &Kernel, idx: &[i32; 16], vals: &[i32; 16]) -> Result<Vec<i32>, InterpError> {
    let (ib, vb) = (i32_bytes(idx), i32_bytes(vals));
    let mut ob = vec![0u8; 4 * 16];
    run(
        k,
        [1, 1, 1],
        &mut [Arg::Read(&ib), Arg::Read(&vb), Arg::Write(&mut ob)],
    )?;
    Ok(bytes_i32(&ob))
}

#[test]
fn duplicate_store_addresses_with_different_values_are_an_error() {
    let k = scatter_kernel(16);
    let mut idx: [i32; 16] = std::array::from_fn(|i| 15 - i as i32);
    let vals: [i32; 16] = std::array::from_fn(|i| 100 + i as i32);
    // A permutation (decreasing addresses) is fine.
    let out = run_scatter(&k, &idx, &vals).unwrap();
    assert_eq!(out[15], 100);
    // Lanes 3 and 9 both write element 4, with different values.
    idx[3] = 4;
    idx[9] = 4;
    let e = run_scatter(&k, &idx, &vals).unwrap_err();
    assert_eq!(e.kernel, "scatter");
    let s = e.to_string();
    assert!(s.contains("`scatter`") && s.contains("`out`"), "{s}");
    assert!(s.contains("element index 4"), "{s}");
    assert!(s.contains("lanes 3 and 9"), "{s}");
    assert!(s.contains("program (0, 0, 0)"), "{s}");
    // Masking one of the two lanes off removes the conflict.
    let k = scatter_kernel(9);
    let out = run_scatter(&k, &idx, &vals).unwrap();
    assert_eq!(out[4], 103);
}

#[test]
fn duplicate_store_addresses_with_equal_values_are_fine() {
    // Every lane stores the same scalar to one address (a broadcast store).
    let mut b = Builder::new("dup", 4);
    let out = b.ptr("out", DType::I32);
    let p = b.splat(out, &[16]);
    let seven = b.i32(7);
    let v = b.splat(seven, &[16]);
    b.store(p, v, None);
    let k = b.finish();
    let mut ob = vec![0u8; 4];
    run(&k, [1, 1, 1], &mut [Arg::Write(&mut ob)]).unwrap();
    assert_eq!(bytes_i32(&ob), [7]);
    // Equal values through a scatter with repeats, too.
    let k = scatter_kernel(16);
    let idx: [i32; 16] = std::array::from_fn(|i| (i % 4) as i32);
    let vals: [i32; 16] = std::array::from_fn(|i| (i % 4) as i32 * 10);
    let out = run_scatter(&k, &idx, &vals).unwrap();
    assert_eq!(out[..5], [0, 10, 20, 30, 0]);
}

#[test]
fn select_relu() {
    // out[i] = x[i] > 0 ? x[i] : 0 through select (a NaN gives 0).
    let k = map_kernel("relu", DType::F32, DType::F32, 16, |b, x| {
        let z = b.f32(0.0);
        let zs = b.splat(z, &[16]);
        let c = b.cmp(CmpOp::Gt, x, zs);
        b.select(c, x, zs)
    });
    let xs = [1.0, -2.0, 3.0, f32::NAN, -0.0];
    let out = bytes_f32(&run_map(&k, &f32_bytes(&xs), 20, 5, 16));
    assert_eq!(&out[..3], &[1.0, 0.0, 3.0]);
    assert_eq!(out[3], 0.0);
}

#[test]
fn unary_float_ops() {
    let mut rng = Rng(9);
    let xs: Vec<f32> = rng.f32s(64).iter().map(|x| x * 4.0).collect();
    let d = Data::F(xs.clone());
    let check = |op, f: fn(f32) -> f32| {
        let Data::F(got) = ops::unary(op, DType::F32, &d).unwrap() else {
            panic!()
        };
        for (g, x) in got.iter().zip(&xs) {
            let w = f(*x);
            assert!(
                g == &w || (g.is_nan() && w.is_nan()),
                "{op:?}({x}) = {g}, want {w}"
            );
        }
    };
    check(UnaryOp::Sigmoid, |x| 1.0 / (1.0 + (-x).exp()));
    check(UnaryOp::Tanh, f32::tanh);
    check(UnaryOp::Rsqrt, |x| 1.0 / x.sqrt());
    check(UnaryOp::Floor, f32::floor);
    check(UnaryOp::Abs, f32::abs);
    check(UnaryOp::Neg, |x| -x);
}

#[test]
fn f16_sigmoid_kernel() {
    let k = map_kernel("sig", DType::F16, DType::F16, 32, |b, x| {
        b.un(UnaryOp::Sigmoid, x)
    });
    let mut rng = Rng(10);
    let n = 40;
    let xs: Vec<f16> = (0..n).map(|_| f16::from_f32(rng.f32() * 6.0)).collect();
    let xb: Vec<u8> = xs.iter().flat_map(|h| h.to_le_bytes()).collect();
    let out = run_map(&k, &xb, n * 2, n, 32);
    for (i, c) in out.chunks_exact(2).enumerate() {
        let x = xs[i].to_f32();
        let want = f16::from_f32(1.0 / (1.0 + (-x).exp()));
        assert_eq!(f16::from_le_bytes([c[0], c[1]]), want, "x={x}");
    }
}

#[test]
fn untyped_kernels_and_literals() {
    let mut b = Builder::new("lits", 4);
    let out = b.ptr("out", DType::I32);
    let big = b.lit(Literal::Float(3e9, None), DType::I32);
    let neg = b.lit(Literal::Float(-2.7, None), DType::I32);
    let wrap = b.lit(Literal::Int(1 << 32 | 5, None), DType::I32);
    let t = b.lit(Literal::Bool(true), DType::I32);
    for (i, v) in [big, neg, wrap, t].into_iter().enumerate() {
        let o = b.i32(i as i64);
        let p = b.add_ptr(out, o);
        b.store(p, v, None);
    }
    let mut k = b.finish();
    let mut ob = vec![0u8; 16];
    run(&k, [1, 1, 1], &mut [Arg::Write(&mut ob)]).unwrap();
    assert_eq!(bytes_i32(&ob), [i32::MAX, -2, 5, 1]);
    k.values[1].ty = None;
    let e = run(&k, [1, 1, 1], &mut [Arg::Write(&mut ob)]).unwrap_err();
    assert!(e.message.contains("typed kernels only"), "{e}");
}
