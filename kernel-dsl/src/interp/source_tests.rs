//! Interpreter tests on kernels compiled from source text (front end + inference).

use super::{run, Arg, Scalar};
use crate::ir::Kernel;
use crate::testing::{bytes_f32, f32_bytes, Rng};
use crate::{compile_source, Specialization};
use half::bf16;

fn compile(src: &str, consts: &[(&str, i64)]) -> Kernel {
    let spec = Specialization {
        consts: consts.iter().map(|(n, v)| (n.to_string(), *v)).collect(),
        num_warps: 4,
        num_stages: None,
    };
    compile_source(src, &spec).unwrap_or_else(|e| panic!("{e}"))
}

fn bf16_bytes(v: &[bf16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn vector_add_from_source() {
    let k = compile(
        r#"
#[kernel(BLOCK = [64])]
fn add<const BLOCK: usize>(x: Ptr<f32>, y: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let offs = program_id(0) * BLOCK + arange(0, BLOCK);
    let mask = offs < n;
    let a = load(x + offs, mask, 0.0);
    let b = load(y + offs, mask);
    store(out + offs, a + b, mask);
}
"#,
        &[("BLOCK", 64)],
    );
    let mut rng = Rng(11);
    for n in [0usize, 5, 64, 130] {
        let (x, y) = (rng.f32s(n), rng.f32s(n));
        let (xb, yb) = (f32_bytes(&x), f32_bytes(&y));
        let mut ob = f32_bytes(&vec![f32::NAN; n]);
        run(
            &k,
            [n.div_ceil(64) as u32, 1, 1],
            &mut [
                Arg::Read(&xb),
                Arg::Read(&yb),
                Arg::Write(&mut ob),
                Arg::Scalar(Scalar::I32(n as i32)),
            ],
        )
        .unwrap();
        let want: Vec<f32> = x.iter().zip(&y).map(|(a, b)| a + b).collect();
        assert_eq!(bytes_f32(&ob), want);
    }
}

#[test]
fn prefetch_changes_nothing_but_checks_its_addresses() {
    let k = compile(
        r#"
#[kernel(B = [64])]
fn k<const B: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32, ahead: i32) {
    let offs = arange(0, B);
    prefetch(x + offs + ahead, offs + ahead < n);
    prefetch(x + ahead);
    prefetch_range(x + 8, n - 8 + ahead - 3);
    store(out + offs, load(x + offs, offs < n, 0.0) * 2.0, offs < n);
}
"#,
        &[("B", 64)],
    );
    let mut rng = Rng(5);
    let x = rng.f32s(40);
    let xb = f32_bytes(&x);
    let run_with = |ahead: i32| {
        let mut ob = f32_bytes(&[f32::NAN; 40]);
        let r = run(
            &k,
            [1, 1, 1],
            &mut [
                Arg::Read(&xb),
                Arg::Write(&mut ob),
                Arg::Scalar(Scalar::I32(40)),
                Arg::Scalar(Scalar::I32(ahead)),
            ],
        );
        r.map(|_| bytes_f32(&ob))
    };
    let want: Vec<f32> = x.iter().map(|v| v * 2.0).collect();
    assert_eq!(run_with(3).unwrap(), want);
    // The unmasked scalar prefetch of `x + 40` is past the buffer's end, and so is the
    // range's last element.
    let e = run_with(40).unwrap_err().to_string();
    assert!(e.contains("`x`") && e.contains("out of bounds"), "{e}");
}

#[test]
fn flag_waits_pass_when_signaled_before_and_fail_otherwise() {
    // One side of a two-GPU exchange: count up, signal, wait, add the peer's data.
    let k = compile(
        r#"
#[kernel(B = [64])]
fn exchange<const B: usize>(count: Ptr<i32>, outbox: Ptr<i32>, inbox: Ptr<i32>, mine: Ptr<f32>, theirs: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let epoch = load(count + program_id(0)) + 1;
    store(count + program_id(0), epoch);
    signal_flag(outbox + program_id(0), epoch);
    wait_flag_at_least(inbox + program_id(0), epoch);
    let offs = program_id(0) * B + arange(0, B);
    let ok = offs < n;
    store(out + offs, load(mine + offs, ok, 0.0) + load(theirs + offs, ok, 0.0), ok);
}
"#,
        &[("B", 64)],
    );
    let mut rng = Rng(7);
    let n = 100;
    let (a, b) = (rng.f32s(n), rng.f32s(n));
    let (ab, bb) = (f32_bytes(&a), f32_bytes(&b));
    let i32_bytes = |v: &[i32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let i32s = |b: &[u8]| -> Vec<i32> {
        b.chunks(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };
    // `count` before the launch and `inbox` as the peer left it, per program.
    let exchange = |count: [i32; 2], inbox: [i32; 2]| {
        let (mut cb, mut ob, ib) = (i32_bytes(&count), i32_bytes(&[0, 0]), i32_bytes(&inbox));
        let mut out = f32_bytes(&vec![f32::NAN; n]);
        let r = run(
            &k,
            [2, 1, 1],
            &mut [
                Arg::Write(&mut cb),
                Arg::Write(&mut ob),
                Arg::Read(&ib),
                Arg::Read(&ab),
                Arg::Read(&bb),
                Arg::Write(&mut out),
                Arg::Scalar(Scalar::I32(n as i32)),
            ],
        );
        r.map(|_| (i32s(&cb), i32s(&ob), bytes_f32(&out)))
    };
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    // The peer signaled this epoch (or a later one: "at least").
    let (count, outbox, sum) = exchange([4, 9], [5, 11]).unwrap();
    assert_eq!((count, outbox), (vec![5, 10], vec![5, 10]));
    assert_eq!(sum, want);
    // Across the wrap of i32: i32::MIN is one past i32::MAX.
    let (count, _, sum) = exchange([i32::MAX, 0], [i32::MIN, 1]).unwrap();
    assert_eq!(count, vec![i32::MIN, 1]);
    assert_eq!(sum, want);
    // Program 1's peer has not signaled: in launch order nothing else can, an error.
    let e = exchange([4, 9], [5, 9]).unwrap_err().to_string();
    assert!(
        e.contains("waits for the flag to reach 10, but it holds 9")
            && e.contains("one after another"),
        "{e}"
    );
    assert!(e.contains("program (1, 0, 0)"), "{e}");
}

#[test]
fn softmax_from_source() {
    let k = compile(
        r#"
#[kernel(BLOCK = [128])]
fn softmax<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, n_cols: i32) {
    let row = program_id(0);
    let cols = arange(0, BLOCK);
    let mask = cols < n_cols;
    let v = load(x + row * n_cols + cols, mask, f32::NEG_INFINITY);
    let e = exp(v - v.max(0));
    store(out + row * n_cols + cols, e / e.sum(0), mask);
}
"#,
        &[("BLOCK", 128)],
    );
    let (rows, cols) = (3, 100);
    let mut rng = Rng(12);
    let x: Vec<f32> = rng.f32s(rows * cols).iter().map(|v| v * 4.0).collect();
    let xb = f32_bytes(&x);
    let mut ob = vec![0u8; rows * cols * 4];
    run(
        &k,
        [rows as u32, 1, 1],
        &mut [
            Arg::Read(&xb),
            Arg::Write(&mut ob),
            Arg::Scalar(Scalar::I32(cols as i32)),
        ],
    )
    .unwrap();
    let got = bytes_f32(&ob);
    for (r, row) in x.chunks(cols).enumerate() {
        let m = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
        let s: f64 = row.iter().map(|&v| (v as f64 - m).exp()).sum();
        for (j, &v) in row.iter().enumerate() {
            let want = (v as f64 - m).exp() / s;
            assert!((got[r * cols + j] as f64 - want).abs() < 1e-6 * want.max(1e-3));
        }
    }
}

#[test]
fn gemv_loop_and_branch_from_source() {
    let k = compile(
        r#"
#[kernel(BLOCK_N = [4], BLOCK_K = [32])]
fn gemv<const BLOCK_N: usize, const BLOCK_K: usize>(w: Ptr<bf16>, x: Ptr<bf16>, y: Ptr<f32>, n: i32, k: i32) {
    let rows = program_id(0) * BLOCK_N + arange(0, BLOCK_N);
    let cols = arange(0, BLOCK_K);
    let mut acc = zeros::<f32>([BLOCK_N, BLOCK_K]);
    for k0 in (0..k).step_by(BLOCK_K) {
        let c = k0 + cols;
        let m = (rows.expand_dims(1) < n) & (c.expand_dims(0) < k);
        let wt = load(w + rows.expand_dims(1) * k + c.expand_dims(0), m, 0.0);
        let xt = load(x + c, c < k, 0.0);
        acc += wt as f32 * (xt as f32).expand_dims(0);
    }
    let mut total = acc.sum(1);
    if n > 8 {
        total = total * 2.0;
    }
    store(y + rows, total, rows < n);
}
"#,
        &[("BLOCK_N", 4), ("BLOCK_K", 32)],
    );
    let mut rng = Rng(13);
    for (n, kk) in [(6usize, 70usize), (10, 32), (3, 0)] {
        let w: Vec<bf16> = rng.f32s(n * kk).into_iter().map(bf16::from_f32).collect();
        let x: Vec<bf16> = rng.f32s(kk).into_iter().map(bf16::from_f32).collect();
        let (wb, xb) = (bf16_bytes(&w), bf16_bytes(&x));
        let mut yb = vec![0u8; n * 4];
        run(
            &k,
            [n.div_ceil(4) as u32, 1, 1],
            &mut [
                Arg::Read(&wb),
                Arg::Read(&xb),
                Arg::Write(&mut yb),
                Arg::Scalar(Scalar::I32(n as i32)),
                Arg::Scalar(Scalar::I32(kk as i32)),
            ],
        )
        .unwrap();
        let got = bytes_f32(&yb);
        let scale = if n > 8 { 2.0 } else { 1.0 };
        for r in 0..n {
            let want: f64 = (0..kk)
                .map(|j| w[r * kk + j].to_f64() * x[j].to_f64())
                .sum::<f64>()
                * scale;
            assert!((got[r] as f64 - want).abs() < 1e-4, "n={n} k={kk} row {r}");
        }
    }
}

#[test]
fn constant_if_runs_the_taken_branch_inside_a_loop() {
    // A software-pipelined loop in the shape the decode attention uses: with STAGES = 2
    // the next tile is loaded before this one is used, with 1 after; same sums.
    let src = r#"
#[kernel(B = [8], STAGES = [1, 2])]
fn sums<const B: usize, const STAGES: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let offs = arange(0, B);
    let mut cur = load(x + offs, offs < n, 0.0);
    let mut acc = zeros::<f32>([B]);
    for s0 in (0..n).step_by(B) {
        let next = s0 + B + offs;
        let mut upcoming = cur;
        if STAGES == 2 {
            upcoming = load(x + next, next < n, 0.0);
        }
        acc += cur * cur;
        if STAGES == 1 {
            upcoming = load(x + next, next < n, 0.0);
        }
        cur = upcoming;
    }
    store(out + offs, acc);
}
"#;
    let mut rng = Rng(17);
    for stages in [1, 2] {
        let k = compile(src, &[("B", 8), ("STAGES", stages)]);
        for n in [0usize, 3, 8, 21, 64] {
            let x = rng.f32s(n);
            let xb = f32_bytes(&x);
            let mut ob = f32_bytes(&[f32::NAN; 8]);
            run(
                &k,
                [1, 1, 1],
                &mut [
                    Arg::Read(&xb),
                    Arg::Write(&mut ob),
                    Arg::Scalar(Scalar::I32(n as i32)),
                ],
            )
            .unwrap();
            let got = bytes_f32(&ob);
            for (lane, g) in got.iter().enumerate() {
                let want: f64 = x
                    .iter()
                    .skip(lane)
                    .step_by(8)
                    .map(|&v| (v as f64).powi(2))
                    .sum();
                assert!(
                    (*g as f64 - want).abs() < 1e-5,
                    "STAGES={stages} n={n} lane {lane}: {g} vs {want}"
                );
            }
        }
    }
}

#[test]
fn conditions_combining_constants_are_decided_at_compile_time() {
    // `&`, `|` and `!` of constant comparisons stay constant: only the taken branch is
    // compiled (the other holds a shape no specialization accepts), and no branch is
    // left in the kernel.
    let src = r#"
#[kernel(R = [0, 1], N = [8, 16])]
fn pick<const R: usize, const N: usize>(out: Ptr<f32>) {
    let offs = arange(0, N);
    if (R == 1) & (N == 16) {
        store(out + offs, zeros::<f32>([N]) + 1.0);
    } else {
        if !((R == 1) | (N == 16)) {
            store(out + offs, zeros::<f32>([N]) + 2.0);
        } else {
            store(out + offs, zeros::<f32>([3]) + 3.0);
        }
    }
}
"#;
    for (r, n, want) in [(1, 16, 1.0), (0, 8, 2.0)] {
        let k = compile(src, &[("R", r), ("N", n)]);
        let mut branches = 0;
        k.body
            .visit(&mut |s| branches += matches!(s, crate::ir::Stmt::If { .. }) as usize);
        assert_eq!(branches, 0, "R={r} N={n}");
        let mut ob = f32_bytes(&vec![f32::NAN; n as usize]);
        run(&k, [1, 1, 1], &mut [Arg::Write(&mut ob)]).unwrap();
        assert!(bytes_f32(&ob).iter().all(|&v| v == want), "R={r} N={n}");
    }
}

#[test]
fn dot_and_atomics_from_source() {
    let k = compile(
        r#"
#[kernel(M = [8], K = [16], N = [4])]
fn mm<const M: usize, const K: usize, const N: usize>(a: Ptr<f32>, b: Ptr<f32>, c: Ptr<f32>, total: Ptr<f32>) {
    let rm = arange(0, M);
    let rk = arange(0, K);
    let rn = arange(0, N);
    let at = load(a + rm.expand_dims(1) * K + rk.expand_dims(0));
    let bt = load(b + rk.expand_dims(1) * N + rn.expand_dims(0));
    let ct = dot(at, bt);
    store(c + rm.expand_dims(1) * N + rn.expand_dims(0), ct);
    atomic_add(total + rm * 0, ct.sum(1));
}
"#,
        &[("M", 8), ("K", 16), ("N", 4)],
    );
    let mut rng = Rng(14);
    let (a, b) = (rng.f32s(8 * 16), rng.f32s(16 * 4));
    let (ab, bb) = (f32_bytes(&a), f32_bytes(&b));
    let mut cb = vec![0u8; 8 * 4 * 4];
    let mut tb = f32_bytes(&[0.0]);
    run(
        &k,
        [2, 1, 1],
        &mut [
            Arg::Read(&ab),
            Arg::Read(&bb),
            Arg::Write(&mut cb),
            Arg::Write(&mut tb),
        ],
    )
    .unwrap();
    let c = bytes_f32(&cb);
    let mut total = 0.0f64;
    for i in 0..8 {
        for j in 0..4 {
            let want: f64 = (0..16)
                .map(|q| a[i * 16 + q] as f64 * b[q * 4 + j] as f64)
                .sum();
            assert!((c[i * 4 + j] as f64 - want).abs() < 1e-5);
            total += want;
        }
    }
    // Two programs each add the whole matrix's sum.
    assert!((bytes_f32(&tb)[0] as f64 - 2.0 * total).abs() < 1e-4);
}

/// Runs a kernel storing the `[8, 16]` block at each origin of a `rows x cols` matrix
/// of random values seen through a descriptor with strides `strides` (`[stride, 1]` or
/// `[1, stride]`), and compares it with the block read off the host matrix, zero outside.
fn check_descriptor_blocks(strides: &str, col_major: bool, origins: &[(usize, usize)]) {
    let k = compile(
        &format!(
            r#"
#[kernel]
fn blocks(x: Ptr<f32>, out: Ptr<f32>, rows: i32, cols: i32, stride: i32, r0: i32, c0: i32) {{
    let d = make_tensor_descriptor(x, [rows, cols], {strides}, [8, 16]);
    let t = d.load([r0, c0]);
    store(out + arange(0, 8).expand_dims(1) * 16 + arange(0, 16).expand_dims(0), t);
}}
"#
        ),
        &[],
    );
    let mut rng = Rng(29);
    let (rows, cols, stride) = (13usize, 21usize, 24usize);
    let lines = if col_major { cols } else { rows };
    let x = rng.f32s(lines * stride);
    let xb = f32_bytes(&x);
    for &(r0, c0) in origins {
        let mut ob = f32_bytes(&vec![f32::NAN; 8 * 16]);
        run(
            &k,
            [1, 1, 1],
            &mut [
                Arg::Read(&xb),
                Arg::Write(&mut ob),
                Arg::Scalar(Scalar::I32(rows as i32)),
                Arg::Scalar(Scalar::I32(cols as i32)),
                Arg::Scalar(Scalar::I32(stride as i32)),
                Arg::Scalar(Scalar::I32(r0 as i32)),
                Arg::Scalar(Scalar::I32(c0 as i32)),
            ],
        )
        .unwrap();
        let want: Vec<f32> = (0..8 * 16)
            .map(|i| {
                let (r, c) = (r0 + i / 16, c0 + i % 16);
                match (r < rows && c < cols, col_major) {
                    (false, _) => 0.0,
                    (true, false) => x[r * stride + c],
                    (true, true) => x[c * stride + r],
                }
            })
            .collect();
        assert_eq!(bytes_f32(&ob), want, "{strides}: block at ({r0}, {c0})");
    }
}

/// `desc.load([r, c])` reads the `[BR, BC]` block at row `r`, column `c` of the row-major
/// `rows x cols` matrix with row stride `stride`, zero outside it (Triton's descriptor
/// load): blocks inside, across the right and bottom edges, and past them entirely.
#[test]
fn a_descriptor_load_reads_its_block_zero_outside_the_matrix() {
    let origins = [
        (0, 0),
        (8, 16),
        (5, 3),
        (12, 20),
        (13, 0),
        (0, 21),
        (40, 40),
    ];
    check_descriptor_blocks("[stride, 1]", false, &origins);
}

/// A column-major descriptor (`[1, col_stride]` strides): element `(r, c)` at
/// `c * col_stride + r`, zero outside the matrix.
#[test]
fn a_column_major_descriptor_reads_columns_of_contiguous_rows() {
    check_descriptor_blocks(
        "[1, stride]",
        true,
        &[(0, 0), (8, 16), (3, 5), (12, 20), (13, 0)],
    );
}
