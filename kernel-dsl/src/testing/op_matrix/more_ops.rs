//! Matrix rows for the scans, `trans`/`permute`, `reshape`, `histogram` and the Philox
//! random numbers, in the style of the parent module: generated kernels, seeded inputs,
//! plain-Rust references, interpreter always and GPU when there is one.
//!
//! Tolerances: integer scans, layout changes, histograms, `randint` and `rand` are exact
//! (`rand` is an exact integer-to-float conversion and one rounded multiply on both
//! sides). Float scans allow what the reductions allow (the GPU associates the running
//! sums differently); `randn` allows 2^-10 absolute (the GPU's `lg2`/`cos` are the
//! approximate instructions, and `sqrt` magnifies the logarithm's absolute error where
//! `u1` is near 1).

use super::*;
use crate::interp::more_ops::{philox4x32_10, UNIFORM_SCALE};

/// Shape-generic inclusive scan reference over one row of lanes.
pub(super) fn scan_ref(op: &str, dt: DType, lanes: &[V]) -> Vec<V> {
    let mut out = Vec::with_capacity(lanes.len());
    if dt.is_float() {
        let mut acc: Option<f64> = None;
        for v in lanes {
            let x = v.f() as f64;
            let a = match acc {
                None => x,
                Some(a) if op == "cumsum" => a + x,
                Some(a) => a * x,
            };
            acc = Some(a);
            out.push(round(dt, a as f32));
        }
    } else {
        let mut acc: Option<i64> = None;
        for v in lanes {
            let a = match acc {
                None => v.i(),
                Some(a) if op == "cumsum" => wrap(dt, a.wrapping_add(v.i())),
                Some(a) => wrap(dt, a.wrapping_mul(v.i())),
            };
            acc = Some(a);
            out.push(V::I(a));
        }
    }
    out
}

fn scan_tol(op: &str, dt: DType, len: usize) -> Tol {
    if !dt.is_float() {
        return EXACT;
    }
    let rel = if op == "cumsum" {
        p2(-20)
    } else {
        // Products of `len` factors near 1, associated differently.
        p2(-22) * len as f32
    };
    approx(rel, 1e-4).for_dtype(dt)
}

fn scan_dist(op: &str, dt: DType) -> Dist {
    match (op, dt.is_float()) {
        ("cumsum", true) => Dist::Range(-1.0, 1.0),
        (_, true) => Dist::Range(0.9, 1.1),
        _ => Dist::Any,
    }
}

/// `cumsum`/`cumprod` along each axis of a masked 2-D tile whose axes are split across
/// registers, lanes and warps, for every dtype.
#[test]
fn matrix_scans_2d() {
    let mut r = Rng(0x5CA7);
    let mut cases = vec![];
    const RM: usize = 8;
    const RN: usize = 32;
    for op in ["cumsum", "cumprod"] {
        for dt in ALL {
            let id = if op == "cumsum" { "0" } else { "1" };
            for axis in [0usize, 1] {
                let kname = format!("{op}{axis}_{}", ty(dt));
                let src = format!(
                    "fn {kname}<const RM: usize, const RN: usize>(x: Ptr<{t}>, out: Ptr<{t}>, m: i32, n: i32) {{
    let rows = arange(0, RM).expand_dims(1);
    let cols = arange(0, RN).expand_dims(0);
    let mask = (rows < m) & (cols < n);
    let v = load(x + rows * n + cols, mask, {id});
    store(out + rows * n + cols, v.{op}({axis}), mask);
}}",
                    t = ty(dt),
                );
                let mut runs = vec![];
                for (m, n) in [(5usize, 19usize), (RM, RN), (3, 0)] {
                    let x = gen(&mut r, dt, (m * n).max(1), scan_dist(op, dt));
                    let idv = if dt.is_float() {
                        V::F(id.parse().unwrap())
                    } else {
                        V::I(id.parse().unwrap())
                    };
                    let lane = |i: usize, j: usize| if i < m && j < n { x[i * n + j] } else { idv };
                    let mut want = vec![poison(dt); (m * n).max(1) + RN];
                    let full: Vec<Vec<V>> = if axis == 1 {
                        (0..RM)
                            .map(|i| {
                                scan_ref(op, dt, &(0..RN).map(|j| lane(i, j)).collect::<Vec<_>>())
                            })
                            .collect()
                    } else {
                        (0..RN)
                            .map(|j| {
                                scan_ref(op, dt, &(0..RM).map(|i| lane(i, j)).collect::<Vec<_>>())
                            })
                            .collect()
                    };
                    for i in 0..m {
                        for j in 0..n {
                            want[i * n + j] = if axis == 1 { full[i][j] } else { full[j][i] };
                        }
                    }
                    runs.push(Run {
                        what: format!("m = {m}, n = {n}"),
                        grid: [1, 1, 1],
                        args: vec![
                            data(dt, &x),
                            data(dt, &vec![poison(dt); want.len()]),
                            Data::S(Scalar::I32(m as i32)),
                            Data::S(Scalar::I32(n as i32)),
                        ],
                        want: vec![None, Some(want), None, None],
                    });
                }
                cases.push(Case {
                    src,
                    consts: vec![("RM", RM as i64), ("RN", RN as i64)],
                    warps: 2,
                    tol: scan_tol(op, dt, RN),
                    assemble: axis == 0,
                    runs,
                });
            }
        }
    }
    check_all("matrix_scans_2d", cases);
}

/// 1-D scans whose length is below one pass of the program (replicated lanes), one
/// pass, and several passes (each folds in the totals of the passes before it).
#[test]
fn matrix_scans_1d() {
    let mut r = Rng(0x5CA8);
    let mut cases = vec![];
    for op in ["cumsum", "cumprod"] {
        for dt in [DType::F32, DType::I32, DType::BF16, DType::I64] {
            for (block, warps) in [(16usize, 2u32), (512, 2), (2048, 2), (4096, 4)] {
                let kname = format!("{op}_{}_{block}", ty(dt));
                let id = if op == "cumsum" { "0" } else { "1" };
                let src = format!(
                    "fn {kname}<const B: usize>(x: Ptr<{t}>, out: Ptr<{t}>, n: i32) {{
    let offs = arange(0, B);
    let v = load(x + offs, offs < n, {id});
    store(out + offs, v.{op}(0), offs < n);
}}",
                    t = ty(dt)
                );
                let mut runs = vec![];
                for n in [block, block / 2 + 3] {
                    let x = gen(&mut r, dt, n, scan_dist(op, dt));
                    let mut want = scan_ref(op, dt, &x);
                    want.resize(block + 8, poison(dt));
                    runs.push(Run {
                        what: format!("n = {n}"),
                        grid: [1, 1, 1],
                        args: vec![
                            data(dt, &x),
                            data(dt, &vec![poison(dt); want.len()]),
                            Data::S(Scalar::I32(n as i32)),
                        ],
                        want: vec![None, Some(want), None],
                    });
                }
                cases.push(Case {
                    src,
                    consts: vec![("B", block as i64)],
                    warps,
                    tol: scan_tol(op, dt, block),
                    assemble: block == 2048,
                    runs,
                });
            }
        }
    }
    check_all("matrix_scans_1d", cases);
}

/// Row-major `[m, n]` data as the `[n, m]` transpose (or any permutation of a 3-D box).
fn permuted(x: &[V], shape: &[usize], dims: &[usize]) -> Vec<V> {
    permuted_pub(x, shape, dims)
}

/// [`permuted`], for the peer tests.
pub(super) fn permuted_pub(x: &[V], shape: &[usize], dims: &[usize]) -> Vec<V> {
    let idx = crate::interp::more_ops::permute_index(shape, dims).unwrap();
    idx.iter().map(|&i| x[i]).collect()
}

/// `trans` for every dtype, `permute` of 3-D tiles, and `reshape` (alone, after a
/// transpose, and feeding arithmetic with a tile of the new shape).
#[test]
fn matrix_layout_changes() {
    let mut r = Rng(0x7A45);
    let mut cases = vec![];
    const M: usize = 16;
    const N: usize = 32;
    for dt in ALL {
        let t = ty(dt);
        // trans, then reshape back to [M, N] (the transpose's row-major order), and a
        // reshape to 1-D added to its own reverse-free copy.
        let src = format!(
            "fn trans_{t}<const M: usize, const N: usize>(x: Ptr<{t}>, tr: Ptr<{t}>, rs: Ptr<{t}>, flat: Ptr<{t}>) {{
    let rows = arange(0, M).expand_dims(1);
    let cols = arange(0, N).expand_dims(0);
    let v = load(x + rows * N + cols);
    let t = v.trans();
    store(tr + arange(0, N).expand_dims(1) * M + arange(0, M).expand_dims(0), t);
    store(rs + rows * N + cols, t.reshape([M, N]));
    store(flat + arange(0, M * N), v.reshape([M * N]));
}}"
        );
        let x = gen(&mut r, dt, M * N, Dist::Any);
        let tr = permuted(&x, &[M, N], &[1, 0]);
        cases.push(Case {
            src,
            consts: vec![("M", M as i64), ("N", N as i64)],
            warps: 4,
            tol: EXACT,
            assemble: true,
            runs: vec![Run {
                what: "16 x 32".into(),
                grid: [1, 1, 1],
                args: vec![
                    data(dt, &x),
                    data(dt, &vec![poison(dt); M * N]),
                    data(dt, &vec![poison(dt); M * N]),
                    data(dt, &vec![poison(dt); M * N]),
                ],
                want: vec![None, Some(tr.clone()), Some(tr), Some(x.clone())],
            }],
        });
    }
    for (dt, dims) in [
        (DType::F32, [2usize, 0, 1]),
        (DType::F16, [1, 2, 0]),
        (DType::I64, [2, 1, 0]),
        (DType::U8, [0, 2, 1]),
    ] {
        let t = ty(dt);
        let shape = [2usize, 4, 8];
        let out_shape: Vec<usize> = dims.iter().map(|&d| shape[d]).collect();
        let kname = format!("permute_{t}_{}{}{}", dims[0], dims[1], dims[2]);
        let idx = |s: &[usize]| {
            format!(
                "arange(0, {}).expand_dims(1).expand_dims(2) * {} + arange(0, {}).expand_dims(0).expand_dims(2) * {} + arange(0, {}).expand_dims(0).expand_dims(0)",
                s[0],
                s[1] * s[2],
                s[1],
                s[2],
                s[2]
            )
        };
        // The permuted tile also meets a freshly loaded one of its shape (`+ 0` in the
        // dtype), so a conversion to the load's layout is exercised where it differs.
        let src = format!(
            "fn {kname}(x: Ptr<{t}>, z: Ptr<{t}>, out: Ptr<{t}>) {{
    let v = load(x + {});
    let p = permute(v, [{}, {}, {}]);
    store(out + {}, p + load(z + {}));
}}",
            idx(&shape),
            dims[0],
            dims[1],
            dims[2],
            idx(&out_shape),
            idx(&out_shape),
        );
        let x = gen(&mut r, dt, 64, Dist::Any);
        let zero = if dt.is_float() { V::F(0.0) } else { V::I(0) };
        let want: Vec<V> = permuted(&x, &shape, &dims)
            .into_iter()
            .map(|v| match v {
                // What the kernel's `+ 0` computes (-0.0 becomes +0.0).
                V::F(f) => V::F(f + 0.0),
                v => v,
            })
            .collect();
        cases.push(Case {
            src,
            consts: vec![],
            warps: 2,
            tol: EXACT,
            assemble: true,
            runs: vec![Run {
                what: format!("{shape:?} by {dims:?}"),
                grid: [1, 1, 1],
                args: vec![
                    data(dt, &x),
                    data(dt, &[zero; 64]),
                    data(dt, &vec![poison(dt); 64]),
                ],
                want: vec![None, None, Some(want)],
            }],
        });
    }
    check_all("matrix_layout_changes", cases);
}

/// `histogram` of masked integer tiles with values inside and outside `[0, BINS)`, with
/// more bins than threads and fewer, and a tile smaller than the program (replicated).
#[test]
fn matrix_histogram() {
    let mut r = Rng(0x4157);
    let mut cases = vec![];
    for dt in INTS {
        for (block, bins, warps) in [(256usize, 16usize, 4u32), (16, 128, 2), (1024, 512, 4)] {
            let t = ty(dt);
            let kname = format!("histogram_{t}_{block}_{bins}");
            let src = format!(
                "fn {kname}<const B: usize, const BINS: usize>(x: Ptr<{t}>, out: Ptr<i32>, n: i32) {{
    let offs = arange(0, B);
    let v = load(x + offs, offs < n);
    store(out + arange(0, BINS), histogram(v, BINS, offs < n));
}}"
            );
            let mut runs = vec![];
            for n in [block, block / 2 + 1, 0] {
                let hi = (bins as f32 + 3.0).min(255.0);
                let lo = if dt.is_signed_int() { -3.0 } else { 0.0 };
                let x = gen(&mut r, dt, n.max(1), Dist::Range(lo, hi));
                let mut want = vec![V::I(0); bins];
                for v in &x[..n] {
                    if (0..bins as i64).contains(&v.i()) {
                        let V::I(c) = want[v.i() as usize] else {
                            unreachable!()
                        };
                        want[v.i() as usize] = V::I(c + 1);
                    }
                }
                runs.push(Run {
                    what: format!("n = {n}"),
                    grid: [1, 1, 1],
                    args: vec![
                        data(dt, &x),
                        data(DType::I32, &vec![poison(DType::I32); bins]),
                        Data::S(Scalar::I32(n as i32)),
                    ],
                    want: vec![None, Some(want), None],
                });
            }
            cases.push(Case {
                src,
                consts: vec![("B", block as i64), ("BINS", bins as i64)],
                warps,
                tol: EXACT,
                assemble: block == 16,
                runs,
            });
        }
    }
    check_all("matrix_histogram", cases);
}

/// Triton's mapping of a Philox word to `[0, 1)`, written from its definition.
fn uniform_ref(w: u32) -> f32 {
    let i = w as i32;
    let i = if i < 0 { -(i as i64) - 1 } else { i as i64 };
    i as f32 * UNIFORM_SCALE
}

/// `randint`, `rand` and `randn` for each seed dtype, tiles and a scalar offset, against
/// Philox4x32-10 (checked against the published known answers in `interp::more_ops`).
#[test]
fn matrix_random() {
    let mut cases = vec![];
    for (op, out) in [
        ("randint", DType::U32),
        ("rand", DType::F32),
        ("randn", DType::F32),
    ] {
        for (sdt, seed) in [
            (DType::I64, Scalar::I64(0x1234_5678_9abc_def0)),
            (DType::I32, Scalar::I32(-42)),
            (DType::U32, Scalar::U32(7)),
        ] {
            let kname = format!("{op}_{}", ty(sdt));
            let src = format!(
                "fn {kname}<const B: usize>(out: Ptr<{o}>, one: Ptr<{o}>, seed: {s}, base: i32, n: i32) {{
    let offs = program_id(0) * B + arange(0, B);
    store(out + offs, {op}(seed, base + offs), offs < n);
    store(one, {op}(seed, base));
}}",
                o = ty(out),
                s = ty(sdt)
            );
            let s64 = match seed {
                Scalar::I64(x) => x as u64,
                Scalar::I32(x) => x as i64 as u64,
                Scalar::U32(x) => x as u64,
                Scalar::F32(_) => unreachable!(),
            };
            let key = [s64 as u32, (s64 >> 32) as u32];
            let draw = |off: i32| {
                let w = philox4x32_10([off as u32, 0, 0, 0], key);
                match op {
                    "randint" => V::I(w[0] as i64),
                    "rand" => V::F(uniform_ref(w[0])),
                    _ => {
                        let u1 = (uniform_ref(w[0]) as f64).max(1e-7);
                        let th = 2.0 * std::f64::consts::PI * uniform_ref(w[1]) as f64;
                        V::F(((-2.0 * u1.ln()).sqrt() * th.cos()) as f32)
                    }
                }
            };
            let (b, n, base) = (128usize, 300usize, -150i32);
            let grid = n.div_ceil(b);
            let mut want: Vec<V> = (0..n).map(|j| draw(base + j as i32)).collect();
            want.resize(grid * b + 4, poison(out));
            cases.push(Case {
                src,
                consts: vec![("B", b as i64)],
                warps: 4,
                tol: if op == "randn" {
                    approx(p2(-16), p2(-10))
                } else {
                    EXACT
                },
                assemble: sdt == DType::I64,
                runs: vec![Run {
                    what: format!("seed {seed:?}"),
                    grid: [grid as u32, 1, 1],
                    args: vec![
                        data(out, &vec![poison(out); want.len()]),
                        data(out, &[poison(out)]),
                        Data::S(seed),
                        Data::S(Scalar::I32(base)),
                        Data::S(Scalar::I32(n as i32)),
                    ],
                    want: vec![Some(want), Some(vec![draw(base)]), None, None, None],
                }],
            });
        }
    }
    check_all("matrix_random", cases);
}

/// Pointer tiles permute and reshape like values: a store through transposed pointers
/// of a transposed tile writes the original layout, and the buffer counts as written
/// (its loads then take the coherent path on the GPU).
#[test]
fn matrix_permuted_pointers() {
    let mut r = Rng(0x7A46);
    let src = "fn ptr_trans<const M: usize, const N: usize>(x: Ptr<f32>, out: Ptr<f32>) {
    let offs = arange(0, M).expand_dims(1) * N + arange(0, N).expand_dims(0);
    let v = load(x + offs);
    store((out + offs).trans(), v.trans());
    store((out + M * N + offs).reshape([M * N]), v.reshape([M * N]) * 2.0);
}"
    .to_string();
    let spec = crate::Specialization {
        consts: vec![("M".into(), 8), ("N".into(), 16)],
        num_warps: 2,
        num_stages: None,
    };
    let k = crate::compile_source(&format!("#[kernel(M = [8], N = [16])]\n{src}"), &spec)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(k.written_params(), vec![1]);
    let x = gen(&mut r, DType::F32, 128, Dist::Range(-4.0, 4.0));
    let mut want = x.clone();
    want.extend(x.iter().map(|v| V::F(v.f() * 2.0)));
    let case = Case {
        src,
        consts: vec![("M", 8), ("N", 16)],
        warps: 2,
        tol: EXACT,
        assemble: true,
        runs: vec![Run {
            what: "8 x 16".into(),
            grid: [1, 1, 1],
            args: vec![
                data(DType::F32, &x),
                data(DType::F32, &[poison(DType::F32); 256]),
            ],
            want: vec![None, Some(want)],
        }],
    };
    check_all("matrix_permuted_pointers", vec![case]);
}
