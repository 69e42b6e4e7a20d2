//! The cases of Triton's own language tests (`python/test/unit/language/test_core.py`)
//! that map onto this language, written afresh as interpreter and GPU tests. Each test
//! names the Triton test it follows; the cases that do not map are listed, with the
//! reason, in docs/language.md ("Triton's tests that do not map").

use super::*;

/// A case with one launch.
#[allow(clippy::too_many_arguments)]
fn one(
    src: String,
    consts: &[(&'static str, i64)],
    warps: u32,
    tol: Tol,
    grid: [u32; 3],
    args: Vec<Data>,
    want: Vec<Option<Vec<V>>>,
    what: &str,
) -> Case {
    Case {
        src,
        consts: consts.to_vec(),
        warps,
        tol,
        assemble: false,
        runs: vec![Run {
            what: what.to_string(),
            grid,
            args,
            want,
        }],
    }
}

fn ints(v: impl IntoIterator<Item = i64>) -> Vec<V> {
    v.into_iter().map(V::I).collect()
}

/// `test_bin_op` / `test_floordiv` with a constant right operand (Triton's
/// `kernel_scalar_rhs`) and a loaded scalar left operand (`kernel_broadcast_lhs`):
/// integer `/` and `%` truncate toward zero (C semantics, Triton's reference
/// `(x - fmod(x, y)) / y`), float `%` is `fmod`.
#[test]
fn peer_binary_ops_with_scalar_operands() {
    let mut r = Rng(0x7E1);
    let mut cases = vec![];
    const N: usize = 128;
    for dt in ALL {
        let t = ty(dt);
        for (op, c) in [("+", 3), ("-", 5), ("*", 7), ("/", 3), ("%", 3)] {
            let name = format!(
                "peer_scalar_rhs_{}_{t}",
                ["add", "sub", "mul", "div", "rem"][["+", "-", "*", "/", "%"]
                    .iter()
                    .position(|o| *o == op)
                    .unwrap()]
            );
            let lit = if dt.is_float() {
                format!("{c}.0")
            } else {
                format!("{c}")
            };
            let src = format!(
                "fn {name}<const N: usize>(x: Ptr<{t}>, z: Ptr<{t}>, w: Ptr<{t}>) {{
    let o = arange(0, N);
    store(z + o, load(x + o) {op} {lit});
    store(w + o, load(x) {op} load(x + o));
}}"
            );
            let dist = if dt.is_float() {
                Dist::Range(-100.0, 100.0)
            } else {
                Dist::NonZero
            };
            let x = gen(&mut r, dt, N, dist);
            let cv = if dt.is_float() {
                V::F(c as f32)
            } else {
                V::I(c)
            };
            let z: Vec<V> = x.iter().map(|&a| arith(op, dt, a, cv)).collect();
            let w: Vec<V> = x.iter().map(|&b| arith(op, dt, x[0], b)).collect();
            cases.push(one(
                src,
                &[("N", N as i64)],
                4,
                EXACT,
                [1, 1, 1],
                vec![
                    data(dt, &x),
                    data(dt, &vec![poison(dt); N]),
                    data(dt, &vec![poison(dt); N]),
                ],
                vec![None, Some(z), Some(w)],
                "x op constant, x[0] op x",
            ));
        }
    }
    check_all("peer_binary_ops_with_scalar_operands", cases);
}

/// `test_unsigned_name_mangling` and `test_unary_op`: `abs` of a `u32` is the value
/// itself, `abs(-y)` of an `i32` is not; `-x` for every dtype and `!x` (Triton's `~x`)
/// for integers.
#[test]
fn peer_unary_and_abs() {
    let mut r = Rng(0x7E2);
    let mut cases = vec![];
    const N: usize = 128;
    let x = gen(&mut r, DType::U32, N, Dist::Any);
    let y = gen(&mut r, DType::I32, N, Dist::Any);
    let abs_y: Vec<V> = y
        .iter()
        .map(|v| V::I((v.i() as i32).wrapping_neg().wrapping_abs() as i64))
        .collect();
    cases.push(one(
        "fn peer_abs_mangling<const N: usize>(o1: Ptr<u32>, o2: Ptr<i32>, x: Ptr<u32>, y: Ptr<i32>) {
    let o = arange(0, N);
    store(o1 + o, abs(load(x + o)));
    store(o2 + o, abs(-load(y + o)));
}"
        .into(),
        &[("N", N as i64)],
        4,
        EXACT,
        [1, 1, 1],
        vec![
            data(DType::U32, &[poison(DType::U32); N]),
            data(DType::I32, &[poison(DType::I32); N]),
            data(DType::U32, &x),
            data(DType::I32, &y),
        ],
        vec![Some(x.clone()), Some(abs_y), None, None],
        "abs",
    ));
    for dt in ALL {
        let t = ty(dt);
        let x = gen(&mut r, dt, N, Dist::Any);
        let neg: Vec<V> = x
            .iter()
            .map(|&v| match v {
                V::F(f) => V::F(-f),
                V::I(i) => V::I(wrap(dt, i.wrapping_neg())),
            })
            .collect();
        let (expr, want) = if dt.is_float() {
            ("-v".to_string(), neg)
        } else {
            let not: Vec<V> = x.iter().map(|v| V::I(wrap(dt, !v.i()))).collect();
            ("!v".to_string(), not)
        };
        cases.push(one(
            format!(
                "fn peer_unary_{t}<const N: usize>(z: Ptr<{t}>, x: Ptr<{t}>) {{
    let v = load(x + arange(0, N));
    store(z + arange(0, N), {expr});
}}"
            ),
            &[("N", N as i64)],
            4,
            EXACT,
            [1, 1, 1],
            vec![data(dt, &vec![poison(dt); N]), data(dt, &x)],
            vec![Some(want), None],
            &expr,
        ));
    }
    check_all("peer_unary_and_abs", cases);
}

/// `test_compare_op` with NaN operands (`mode_x`/`mode_y` of `'nan'`): every
/// comparison with NaN is false except `!=`.
#[test]
fn peer_compare_with_nan() {
    let mut r = Rng(0x7E3);
    let mut cases = vec![];
    const N: usize = 128;
    for (mode, (xn, yn)) in [
        ("nan_real", (true, false)),
        ("real_nan", (false, true)),
        ("nan_nan", (true, true)),
    ] {
        for (i, op) in ["==", "!=", ">", "<", ">=", "<="].iter().enumerate() {
            let mut x = gen(&mut r, DType::F32, N, Dist::Range(-5.0, 5.0));
            let mut y = gen(&mut r, DType::F32, N, Dist::Range(-5.0, 5.0));
            if xn {
                x = vec![V::F(f32::NAN); N];
            }
            if yn {
                y = vec![V::F(f32::NAN); N];
            }
            let want: Vec<V> = (0..N)
                .map(|j| V::I(compare(op, x[j], y[j]) as i64))
                .collect();
            assert!(want.iter().all(|w| *w == V::I((*op == "!=") as i64)));
            cases.push(one(
                format!(
                    "fn peer_cmp_{mode}_{i}<const N: usize>(z: Ptr<i32>, x: Ptr<f32>, y: Ptr<f32>) {{
    let o = arange(0, N);
    store(z + o, (load(x + o) {op} load(y + o)) as i32);
}}"
                ),
                &[("N", N as i64)],
                4,
                EXACT,
                [1, 1, 1],
                vec![
                    data(DType::I32, &[poison(DType::I32); N]),
                    data(DType::F32, &x),
                    data(DType::F32, &y),
                ],
                vec![Some(want), None, None],
                mode,
            ));
        }
    }
    check_all("peer_compare_with_nan", cases);
}

/// `test_where` over 1000 elements in blocks of 1024 (masked tail) and
/// `test_where_broadcast`: a `[1, N]`
/// condition over an `[N, N]` tile, and a constant `false` condition.
#[test]
fn peer_where() {
    let mut r = Rng(0x7E4);
    let mut cases = vec![];
    const SIZE: usize = 1000;
    for dt in ALL {
        let t = ty(dt);
        let c = gen(&mut r, DType::U8, SIZE, Dist::Range(0.0, 2.0));
        let (x, y) = (
            gen(&mut r, dt, SIZE, Dist::Any),
            gen(&mut r, dt, SIZE, Dist::Any),
        );
        let mut want: Vec<V> = (0..SIZE)
            .map(|j| if c[j].i() != 0 { x[j] } else { y[j] })
            .collect();
        want.resize(1024, poison(dt));
        cases.push(one(
            format!(
                "fn peer_where_{t}<const B: usize>(c: Ptr<u8>, a: Ptr<{t}>, b: Ptr<{t}>, out: Ptr<{t}>, n: i32) {{
    let o = program_id(0) * B + arange(0, B);
    let m = o < n;
    let decide = load(c + o, m) != 0;
    store(out + o, select(decide, load(a + o, m), load(b + o, m)), m);
}}"
            ),
            &[("B", 1024)],
            4,
            EXACT,
            [1, 1, 1],
            vec![
                data(DType::U8, &c),
                data(dt, &x),
                data(dt, &y),
                data(dt, &vec![poison(dt); 1024]),
                Data::S(Scalar::I32(SIZE as i32)),
            ],
            vec![None, None, None, Some(want), None],
            "1000 of 1024",
        ));
    }
    const S: usize = 32;
    let mask = gen(&mut r, DType::U8, S, Dist::Range(0.0, 2.0));
    let x = gen(&mut r, DType::F32, S * S, Dist::Range(-1.0, 1.0));
    let want: Vec<V> = (0..S * S)
        .map(|j| {
            if mask[j % S].i() != 0 {
                x[j]
            } else {
                V::F(0.0)
            }
        })
        .collect();
    cases.push(one(
        "fn peer_where_broadcast<const S: usize>(c: Ptr<u8>, a: Ptr<f32>, out: Ptr<f32>, zeros: Ptr<f32>) {
    let xo = arange(0, S).expand_dims(1);
    let yo = arange(0, S).expand_dims(0);
    let m = load(c + yo) != 0;
    let vals = load(a + yo + S * xo);
    store(out + yo + S * xo, select(m, vals, 0.0));
    store(zeros + yo + S * xo, select(false, vals, 0.0));
}"
        .into(),
        &[("S", S as i64)],
        4,
        EXACT,
        [1, 1, 1],
        vec![
            data(DType::U8, &mask),
            data(DType::F32, &x),
            data(DType::F32, &[poison(DType::F32); S * S]),
            data(DType::F32, &[poison(DType::F32); S * S]),
        ],
        vec![None, None, Some(want), Some(vec![V::F(0.0); S * S])],
        "broadcast condition",
    ));
    check_all("peer_where", cases);
}

/// `test_reduce1d` (`argmin`/`argmax` with `tie_break_left`: the minimum or maximum
/// copied into lanes 3..10, so the first index wins), `test_max_returns_zero`, and
/// `test_reduce` on 3-D tiles along each axis.
#[test]
fn peer_reductions() {
    let mut r = Rng(0x7E5);
    let mut cases = vec![];
    for dt in ALL {
        let t = ty(dt);
        for n in [32usize, 64, 128, 512] {
            for op in ["argmin", "argmax"] {
                let mut x = gen(&mut r, dt, n, Dist::Range(-50.0, 50.0));
                let best = reduce_ref(op, dt, &x).i() as usize;
                let v = x[best];
                for slot in x.iter_mut().take(10).skip(3) {
                    *slot = v;
                }
                let want = reduce_ref(op, dt, &x);
                assert!(want.i() <= 3, "ties break to the left");
                cases.push(one(
                    format!(
                        "fn peer_{op}_tie_{t}_{n}<const B: usize>(x: Ptr<{t}>, z: Ptr<i32>) {{
    store(z, load(x + arange(0, B)).{op}(0));
}}"
                    ),
                    &[("B", n as i64)],
                    4,
                    EXACT,
                    [1, 1, 1],
                    vec![data(dt, &x), data(DType::I32, &[poison(DType::I32)])],
                    vec![None, Some(vec![want])],
                    "ties",
                ));
            }
        }
    }
    cases.push(one(
        "fn peer_max_returns_zero<const B: usize>(x: Ptr<f32>, z: Ptr<f32>) {
    store(z, load(x + arange(0, B)).max(0));
}"
        .into(),
        &[("B", 128)],
        4,
        EXACT,
        [1, 1, 1],
        vec![
            data(DType::F32, &[V::F(0.0); 128]),
            data(DType::F32, &[V::F(1.0)]),
        ],
        vec![None, Some(vec![V::F(0.0)])],
        "zeros",
    ));
    for shape in [[2usize, 32, 16], [32, 2, 16], [32, 16, 2]] {
        for axis in 0..3 {
            for op in ["min", "max", "sum", "argmin", "argmax"] {
                let x = gen(&mut r, DType::F32, 1024, Dist::Range(-1.0, 1.0));
                let [a, b, c] = shape;
                let at = |i: usize, j: usize, k: usize| x[(i * b + j) * c + k];
                let mut want = vec![];
                let (p, q) = match axis {
                    0 => (b, c),
                    1 => (a, c),
                    _ => (a, b),
                };
                for u in 0..p {
                    for w in 0..q {
                        let lanes: Vec<V> = (0..shape[axis])
                            .map(|s| match axis {
                                0 => at(s, u, w),
                                1 => at(u, s, w),
                                _ => at(u, w, s),
                            })
                            .collect();
                        want.push(reduce_ref(op, DType::F32, &lanes));
                    }
                }
                let o = if op.starts_with("arg") {
                    DType::I32
                } else {
                    DType::F32
                };
                let name = format!("peer_reduce3d_{op}_{a}_{b}_{c}_{axis}");
                let src = format!(
                    "fn {name}<const A: usize, const B: usize, const C: usize>(x: Ptr<f32>, z: Ptr<{o}>) {{
    let i = arange(0, A).expand_dims(1).expand_dims(2);
    let j = arange(0, B).expand_dims(0).expand_dims(2);
    let k = arange(0, C).expand_dims(0).expand_dims(0);
    let r = load(x + (i * B + j) * C + k).{op}({axis});
    let u = arange(0, {p}).expand_dims(1);
    let w = arange(0, {q}).expand_dims(0);
    store(z + u * {q} + w, r);
}}",
                    o = ty(o)
                );
                let tol = if op == "sum" {
                    approx(p2(-20), 1e-5)
                } else {
                    EXACT
                };
                cases.push(one(
                    src,
                    &[("A", a as i64), ("B", b as i64), ("C", c as i64)],
                    4,
                    tol,
                    [1, 1, 1],
                    vec![data(DType::F32, &x), data(o, &vec![poison(o); p * q])],
                    vec![None, Some(want)],
                    &format!("{shape:?} axis {axis}"),
                ));
            }
        }
    }
    check_all("peer_reductions", cases);
}

/// `test_scan2d` (`cumsum`/`cumprod`, `reverse = False`) over its shapes, axes, dtypes
/// and 4 or 16 warps, and `test_scan_1d` (a scan, reshaped, broadcast and flattened).
#[test]
fn peer_scans() {
    let mut r = Rng(0x7E6);
    let mut cases = vec![];
    let shapes = [
        (8usize, 32usize),
        (16, 32),
        (32, 16),
        (2, 1024),
        (1024, 2),
        (32, 32),
        (1, 1024),
    ];
    for warps in [4u32, 16] {
        for dt in [DType::I32, DType::F32, DType::BF16] {
            for axis in [1usize, 0] {
                for (m, n) in shapes {
                    for op in ["cumsum", "cumprod"] {
                        let t = ty(dt);
                        let dist = match (op, dt.is_float()) {
                            ("cumprod", true) => Dist::Range(0.95, 1.05),
                            (_, true) => Dist::Range(-1.0, 1.0),
                            ("cumprod", false) => Dist::Range(-2.0, 3.0),
                            _ => Dist::Range(-100.0, 100.0),
                        };
                        let x = gen(&mut r, dt, m * n, dist);
                        let mut want = vec![poison(dt); m * n];
                        if axis == 1 {
                            for i in 0..m {
                                let row = super::more_ops::scan_ref(op, dt, &x[i * n..(i + 1) * n]);
                                want[i * n..(i + 1) * n].copy_from_slice(&row);
                            }
                        } else {
                            for j in 0..n {
                                let col: Vec<V> = (0..m).map(|i| x[i * n + j]).collect();
                                for (i, v) in super::more_ops::scan_ref(op, dt, &col)
                                    .into_iter()
                                    .enumerate()
                                {
                                    want[i * n + j] = v;
                                }
                            }
                        }
                        let tol = if dt.is_float() {
                            approx(p2(-12), 1e-3).for_dtype(dt)
                        } else {
                            EXACT
                        };
                        cases.push(one(
                            format!(
                                "fn peer_{op}_{t}_{m}x{n}_{axis}_w{warps}<const M: usize, const N: usize>(x: Ptr<{t}>, z: Ptr<{t}>) {{
    let o = arange(0, M).expand_dims(1) * N + arange(0, N).expand_dims(0);
    store(z + o, load(x + o).{op}({axis}));
}}"
                            ),
                            &[("M", m as i64), ("N", n as i64)],
                            warps,
                            tol,
                            [1, 1, 1],
                            vec![data(dt, &x), data(dt, &vec![poison(dt); m * n])],
                            vec![None, Some(want)],
                            &format!("{m}x{n} axis {axis}, {warps} warps"),
                        ));
                    }
                }
            }
        }
    }
    for (m, n) in [
        (1usize, 64usize),
        (2, 32),
        (4, 16),
        (8, 8),
        (16, 4),
        (32, 2),
        (64, 1),
    ] {
        let x = gen(&mut r, DType::I32, m, Dist::Range(-100.0, 100.0));
        let s = super::more_ops::scan_ref("cumsum", DType::I32, &x);
        let want: Vec<V> = (0..m * n).map(|j| s[j % m]).collect();
        cases.push(one(
            format!(
                "fn peer_scan_1d_{m}_{n}<const M: usize, const N: usize>(out: Ptr<i32>, x: Ptr<i32>) {{
    let s = load(x + arange(0, M)).cumsum(0).reshape([1, M]);
    let b = broadcast_to(s, [N, M]);
    store(out + arange(0, M * N), b.reshape([M * N]));
}}"
            ),
            &[("M", m as i64), ("N", n as i64)],
            4,
            EXACT,
            [1, 1, 1],
            vec![data(DType::I32, &vec![poison(DType::I32); m * n]), data(DType::I32, &x)],
            vec![Some(want), None],
            "scan, reshape, broadcast",
        ));
    }
    check_all("peer_scans", cases);
}

/// `test_histogram` over its `(M, N)` pairs; the result also meets a `[M, N]` tile in
/// an elementwise op (Triton checks it broadcasts).
#[test]
fn peer_histogram() {
    let mut r = Rng(0x7E7);
    let mut cases = vec![];
    for (m, n) in [
        (2048usize, 2usize),
        (1024, 8),
        (1024, 128),
        (256, 512),
        (32, 512),
        (8, 512),
        (8, 2),
    ] {
        let x = gen(&mut r, DType::I32, m, Dist::Range(0.0, n as f32));
        let mut counts = vec![0i64; n];
        for v in &x {
            counts[v.i() as usize] += 1;
        }
        let biased: Vec<V> = (0..m * n).map(|j| V::I(counts[j % n] + 1)).collect();
        let shared = m * n <= 16384;
        let store_biased = if shared {
            "store(b + arange(0, M).expand_dims(1) * N + arange(0, N).expand_dims(0), h.expand_dims(0) + full([M, N], 1));"
        } else {
            ""
        };
        cases.push(one(
            format!(
                "fn peer_histogram_{m}_{n}<const M: usize, const N: usize>(x: Ptr<i32>, z: Ptr<i32>, b: Ptr<i32>) {{
    let h = histogram(load(x + arange(0, M)), N);
    store(z + arange(0, N), h);
    {store_biased}
}}"
            ),
            &[("M", m as i64), ("N", n as i64)],
            4,
            EXACT,
            [1, 1, 1],
            vec![
                data(DType::I32, &x),
                data(DType::I32, &vec![poison(DType::I32); n]),
                data(DType::I32, &vec![poison(DType::I32); if shared { m * n } else { 1 }]),
            ],
            vec![None, Some(ints(counts)), shared.then_some(biased)],
            "histogram",
        ));
    }
    check_all("peer_histogram", cases);
}

/// `test_trans_2d`, `test_trans_4d` (every permutation of 4 axes), `test_transpose`
/// (`x.T` stored through the transposed offsets) and `test_shapes_as_params`.
#[test]
fn peer_permutes() {
    let mut cases = vec![];
    // The row-major offsets of a tile of shape `s`.
    let idx = |s: &[usize]| -> String {
        let rank = s.len();
        let mut terms = vec![];
        let mut stride = 1;
        for d in (0..rank).rev() {
            terms.push(format!("{} * {stride}", expand_at(s[d], d, rank)));
            stride *= s[d];
        }
        terms.join(" + ")
    };
    for (dt, shape) in [(DType::I32, vec![2usize, 4]), (DType::U8, vec![16, 16])] {
        for perm in [[0usize, 1], [1, 0]] {
            let out: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
            let x: Vec<V> = (0..shape.iter().product::<usize>())
                .map(|i| V::I(i as i64 % 251))
                .collect();
            let want = super::more_ops::permuted_pub(&x, &shape, &perm);
            cases.push(one(
                format!(
                    "fn peer_trans2d_{}_{}x{}_{}{}(x: Ptr<{t}>, z: Ptr<{t}>) {{
    store(z + {}, permute(load(x + {}), [{}, {}]));
}}",
                    ty(dt),
                    shape[0],
                    shape[1],
                    perm[0],
                    perm[1],
                    idx(&out),
                    idx(&shape),
                    perm[0],
                    perm[1],
                    t = ty(dt)
                ),
                &[],
                4,
                EXACT,
                [1, 1, 1],
                vec![data(dt, &x), data(dt, &vec![poison(dt); x.len()])],
                vec![None, Some(want)],
                "trans 2d",
            ));
        }
    }
    let perms = permutations4();
    for shape in [[2usize, 2, 8, 64], [4, 4, 4, 4]] {
        let n: usize = shape.iter().product();
        let x: Vec<V> = (0..n).map(|i| V::I(i as i64)).collect();
        for perm in &perms {
            let out: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
            let want = super::more_ops::permuted_pub(&x, &shape, perm);
            cases.push(one(
                format!(
                    "fn peer_trans4d_{}_{}{}{}{}(x: Ptr<i32>, z: Ptr<i32>) {{
    store(z + {}, load(x + {}).permute([{}, {}, {}, {}]));
}}",
                    shape
                        .iter()
                        .map(|s| s.to_string())
                        .collect::<Vec<_>>()
                        .join("x"),
                    perm[0],
                    perm[1],
                    perm[2],
                    perm[3],
                    idx(&out),
                    idx(&shape),
                    perm[0],
                    perm[1],
                    perm[2],
                    perm[3]
                ),
                &[],
                8,
                EXACT,
                [1, 1, 1],
                vec![
                    data(DType::I32, &x),
                    data(DType::I32, &vec![poison(DType::I32); n]),
                ],
                vec![None, Some(want)],
                "trans 4d",
            ));
        }
    }
    // test_transpose: a [2, SIZE] tile stored through its transposed offsets.
    for dt in ALL {
        let t = ty(dt);
        let x = gen(&mut Rng(0x7E8), dt, 256, Dist::Any);
        let want = super::more_ops::permuted_pub(&x, &[2, 128], &[1, 0]);
        cases.push(one(
            format!(
                "fn peer_transpose_{t}<const SIZE: usize>(z: Ptr<{t}>, x: Ptr<{t}>) {{
    let off = arange(0, SIZE);
    let off2d = off.expand_dims(0) + (arange(0, 2) * SIZE).expand_dims(1);
    let v = load(x + off2d);
    let o = arange(0, SIZE).expand_dims(1) * 2 + arange(0, 2).expand_dims(0);
    store(z + o, v.trans());
}}"
            ),
            &[("SIZE", 128)],
            4,
            EXACT,
            [1, 1, 1],
            vec![data(dt, &vec![poison(dt); 256]), data(dt, &x)],
            vec![Some(want), None],
            "transpose",
        ));
    }
    // test_shapes_as_params: arange(0, 32).reshape([4, 8]).permute([1, 0]) and back.
    let a: Vec<V> = (0..32).map(V::I).collect();
    let p = super::more_ops::permuted_pub(&a, &[4, 8], &[1, 0]);
    cases.push(one(
        "fn peer_shapes(z: Ptr<i32>, w: Ptr<i32>, t: Ptr<i32>) {
    let a = arange(0, 32).reshape([4, 8]);
    store(z + arange(0, 8).expand_dims(1) * 4 + arange(0, 4).expand_dims(0), a.permute([1, 0]));
    store(w + arange(0, 32), a.reshape([32]));
    let c = arange(0, 64).reshape([2, 4, 8]).permute([2, 1, 0]);
    store(t + arange(0, 64), c.reshape([64]));
}"
        .into(),
        &[],
        4,
        EXACT,
        [1, 1, 1],
        vec![
            data(DType::I32, &[poison(DType::I32); 32]),
            data(DType::I32, &[poison(DType::I32); 32]),
            data(DType::I32, &[poison(DType::I32); 64]),
        ],
        vec![
            Some(p),
            Some(a),
            Some(super::more_ops::permuted_pub(
                &(0..64).map(V::I).collect::<Vec<_>>(),
                &[2, 4, 8],
                &[2, 1, 0],
            )),
        ],
        "reshape and permute of arange",
    ));
    check_all("peer_permutes", cases);
}

/// `arange(0, n)` placed on axis `d` of a rank-`rank` index expression.
fn expand_at(n: usize, d: usize, rank: usize) -> String {
    let mut e = format!("arange(0, {n})");
    for a in 0..rank {
        if a != d {
            e = format!("{e}.expand_dims({a})");
        }
    }
    e
}

fn permutations4() -> Vec<[usize; 4]> {
    let mut out = vec![];
    for a in 0..4 {
        for b in 0..4 {
            for c in 0..4 {
                for d in 0..4 {
                    let p = [a, b, c, d];
                    let mut seen = [false; 4];
                    if p.iter().all(|&x| !std::mem::replace(&mut seen[x], true)) {
                        out.push(p);
                    }
                }
            }
        }
    }
    out
}

/// `test_atomic_rmw` (`add`/`max` of `i32`/`f32` from 5 programs, in the modes
/// all negative, all positive, one large negative, one large positive),
/// `test_atomic_rmw_predicate` (an atomic under a run-time `if`, 4096 programs),
/// `test_tensor_atomic_rmw` (a row sum added atomically, the old values returned) and
/// `test_tensor_atomic_add_non_exclusive_offset` (two lanes add to one address).
#[test]
fn peer_atomics() {
    let mut cases = vec![];
    let mut r = Rng(0x7E9);
    for (op, dt) in [
        ("add", DType::I32),
        ("add", DType::F32),
        ("max", DType::I32),
        ("max", DType::F32),
    ] {
        for mode in ["all_neg", "all_pos", "min_neg", "max_pos"] {
            let mut x: Vec<i64> = (0..5).map(|i| 1i64 << i).collect();
            match mode {
                "all_neg" => x.iter_mut().for_each(|v| *v = -*v),
                "min_neg" => x[r.below(5) as usize] = -17,
                "max_pos" => x[r.below(5) as usize] = 17,
                _ => {}
            }
            let neutral = match (op, dt) {
                ("add", _) => 0,
                (_, DType::I32) => i32::MIN as i64,
                _ => -1_000_000,
            };
            let want = if op == "add" {
                x.iter().sum::<i64>()
            } else {
                *x.iter().max().unwrap()
            };
            let t = ty(dt);
            let to = |v: i64| {
                if dt.is_float() {
                    V::F(v as f32)
                } else {
                    V::I(v)
                }
            };
            cases.push(one(
                format!(
                    "fn peer_atomic_{op}_{t}_{mode}(x: Ptr<{t}>, z: Ptr<{t}>) {{
    atomic_{op}(z, load(x + program_id(0)));
}}"
                ),
                &[],
                1,
                EXACT,
                [5, 1, 1],
                vec![
                    data(dt, &x.iter().map(|&v| to(v)).collect::<Vec<_>>()),
                    data(dt, &[to(neutral)]),
                ],
                vec![None, Some(vec![to(want)])],
                mode,
            ));
        }
    }
    cases.push(one(
        "fn peer_atomic_predicate(x: Ptr<i32>) {
    let v = program_id(0);
    if v < 64 {
        atomic_max(x, v);
    }
}"
        .into(),
        &[],
        1,
        EXACT,
        [4096, 1, 1],
        vec![data(DType::I32, &[V::I(0)])],
        vec![Some(vec![V::I(63)])],
        "4096 programs",
    ));
    for (m, n) in [(2usize, 8usize), (8, 2), (32, 32)] {
        for axis in [0usize, 1] {
            let x = gen(&mut r, DType::F32, m * n, Dist::Range(-1.0, 1.0));
            let zl = if axis == 1 { m } else { n };
            let z = gen(&mut r, DType::F32, zl, Dist::Range(-1.0, 1.0));
            let sums: Vec<V> = (0..zl)
                .map(|u| {
                    let s: f64 = (0..if axis == 1 { n } else { m })
                        .map(|v| if axis == 1 { x[u * n + v].f() } else { x[v * n + u].f() } as f64)
                        .sum();
                    V::F((z[u].f() as f64 + s) as f32)
                })
                .collect();
            let (off, o) = if axis == 1 { ("r0", "M") } else { ("r1", "N") };
            let _ = o;
            cases.push(Case {
                tol: approx(p2(-20), 1e-5),
                ..one(
                    format!(
                        "fn peer_tensor_atomic_{m}_{n}_{axis}<const M: usize, const N: usize>(z: Ptr<f32>, x: Ptr<f32>, old: Ptr<f32>) {{
    let r0 = arange(0, M);
    let r1 = arange(0, N);
    let v = load(x + r0.expand_dims(1) * N + r1.expand_dims(0)).sum({axis});
    store(old + {off}, atomic_add(z + {off}, v));
}}"
                    ),
                    &[("M", m as i64), ("N", n as i64)],
                    4,
                    EXACT,
                    [1, 1, 1],
                    vec![
                        data(DType::F32, &z),
                        data(DType::F32, &x),
                        data(DType::F32, &vec![poison(DType::F32); zl]),
                    ],
                    vec![Some(sums), None, Some(z.clone())],
                    "row sums added atomically",
                )
            });
        }
    }
    for size in [2usize, 4, 8, 32, 64] {
        let val = gen(&mut r, DType::F32, size * size, Dist::Range(-1.0, 1.0));
        let want: Vec<V> = (0..size * size / 2)
            .map(|j| V::F(val[2 * j].f() + val[2 * j + 1].f()))
            .collect();
        cases.push(Case {
            tol: approx(0.0, 0.0),
            ..one(
                format!(
                    "fn peer_atomic_shared_{size}<const NUM: usize>(x: Ptr<f32>, val: Ptr<f32>) {{
    let off = arange(0, NUM);
    let offset = off.expand_dims(1) * NUM + off.expand_dims(0);
    atomic_add(x + offset / 2, load(val + offset));
}}"
                ),
                &[("NUM", size as i64)],
                1,
                EXACT,
                [1, 1, 1],
                vec![
                    data(DType::F32, &vec![V::F(0.0); size * size / 2]),
                    data(DType::F32, &val),
                ],
                vec![Some(want), None],
                "two lanes an address",
            )
        });
    }
    check_all("peer_atomics", cases);
}

/// `test_store_constant` (a constant value, and a constant `false` mask that stores
/// nothing), `test_load_store_same_ptr` (in place, one element a program, many
/// programs) and `test_masked_load` (`other` where the mask is off).
#[test]
fn peer_masks_and_stores() {
    let mut cases = vec![];
    let mut r = Rng(0x7EA);
    for dt in ALL {
        let t = ty(dt);
        let one_v = if dt.is_float() { V::F(1.0) } else { V::I(1) };
        let zero_v = if dt.is_float() { V::F(0.0) } else { V::I(0) };
        cases.push(one(
            format!(
                "fn peer_store_constant_{t}<const B: usize>(out: Ptr<{t}>, kept: Ptr<{t}>, n: i32) {{
    let o = program_id(0) * B + arange(0, B);
    store(out + o, full([B], 1) as {t}, o < n);
    store(kept + o, full([B], 1) as {t}, false);
}}"
            ),
            &[("B", 128)],
            4,
            EXACT,
            [1, 1, 1],
            vec![
                data(dt, &[zero_v; 128]),
                data(dt, &[zero_v; 128]),
                Data::S(Scalar::I32(128)),
            ],
            vec![Some(vec![one_v; 128]), Some(vec![zero_v; 128]), None],
            "constant value, constant mask",
        ));
    }
    let n = 65536;
    cases.push(one(
        "fn peer_same_ptr(x: Ptr<f32>) {
    let p = x + program_id(0);
    store(p, load(p) * 2.0);
}"
        .into(),
        &[],
        32,
        EXACT,
        [n as u32, 1, 1],
        vec![data(DType::F32, &vec![V::F(1.0); n])],
        vec![Some(vec![V::F(2.0); n])],
        "65536 programs",
    ));
    for dt in ALL {
        for (size, diff) in [(128usize, 0usize), (128, 37), (32, 5)] {
            let t = ty(dt);
            let have = size - diff;
            let x = gen(&mut r, dt, have.max(1), Dist::Any);
            let other = if dt.is_float() { V::F(2.0) } else { V::I(2) };
            let want: Vec<V> = (0..size)
                .map(|j| if j < have { x[j] } else { other })
                .collect();
            cases.push(one(
                format!(
                    "fn peer_masked_load_{t}_{size}_{diff}<const B: usize>(x: Ptr<{t}>, out: Ptr<{t}>, n: i32) {{
    let o = arange(0, B);
    store(out + o, load(x + o, o < n, 2));
}}"
                ),
                &[("B", size as i64)],
                4,
                EXACT,
                [1, 1, 1],
                vec![data(dt, &x), data(dt, &vec![poison(dt); size]), Data::S(Scalar::I32(have as i32))],
                vec![None, Some(want), None],
                "masked load with other",
            ));
        }
    }
    check_all("peer_masks_and_stores", cases);
}
