//! GPU against interpreter: kernels from source text, compiled by this backend, launched
//! on a CUDA device and on the CPU interpreter with the same inputs; every written buffer
//! must agree. Skips without a GPU (fails with `TILEFUSE_REQUIRE_GPU=1`).

use half::{bf16, f16};

use super::{compile, Target};
use crate::interp::Scalar;
use crate::runtime::testing::gpu_or_skip;
use crate::runtime::{Device, KernelDef};
use crate::testing::{def, run_on, Data};
use crate::Specialization;

/// Runs on the GPU and the interpreter and compares written buffers.
fn diff(name: &str, d: &KernelDef, grid: [u32; 3], data: &[Data], rtol: f32) {
    // The interpreter runs everywhere: the test kernels and inputs are valid without a GPU.
    let want = run_on(&Device::cpu(), d, grid, data);
    let _turn = crate::runtime::testing::gpu_turn();
    let Some(gpu) = gpu_or_skip(name) else {
        return;
    };
    let got = run_on(&gpu, d, grid, data);
    for (i, p) in d.params.iter().enumerate() {
        if !p.written {
            continue;
        }
        let close = |a: f32, b: f32| {
            (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= 1e-5 + rtol * b.abs()
        };
        let bad: Vec<String> = match (&got[i], &want[i]) {
            (Data::F32(g), Data::F32(w)) => (0..g.len())
                .filter(|&j| !close(g[j], w[j]))
                .map(|j| format!("[{j}] gpu {} interp {}", g[j], w[j]))
                .collect(),
            (Data::Bf16(g), Data::Bf16(w)) => (0..g.len())
                .filter(|&j| !close(g[j].to_f32(), w[j].to_f32()))
                .map(|j| format!("[{j}] gpu {} interp {}", g[j], w[j]))
                .collect(),
            (Data::I32(g), Data::I32(w)) => (0..g.len())
                .filter(|&j| g[j] != w[j])
                .map(|j| format!("[{j}] gpu {} interp {}", g[j], w[j]))
                .collect(),
            (Data::U8(g), Data::U8(w)) => (0..g.len())
                .filter(|&j| g[j] != w[j])
                .map(|j| format!("[{j}] gpu {} interp {}", g[j], w[j]))
                .collect(),
            _ => unreachable!(),
        };
        assert!(
            bad.is_empty(),
            "{name}: parameter `{}` differs in {} elements: {:?}",
            p.name,
            bad.len(),
            &bad[..bad.len().min(8)]
        );
    }
    println!("{name}: gpu matches the interpreter");
}

struct Rng(u64);

impl Rng {
    fn f(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f() * scale).collect()
    }
    fn bf(&mut self, n: usize) -> Vec<bf16> {
        (0..n).map(|_| bf16::from_f32(self.f())).collect()
    }
    /// Multiples of `1 / steps` in [-1, 1]: products and sums of a few thousand of them
    /// are exact in f32, whatever the order of the additions.
    fn steps(&mut self, n: usize, steps: f32) -> Vec<f32> {
        (0..n).map(|_| (self.f() * steps).round() / steps).collect()
    }
}

const ADD: &str = r#"
fn vector_add<const BLOCK: usize>(x: Ptr<f32>, y: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let offs = program_id(0) * BLOCK + arange(0, BLOCK);
    let mask = offs < n;
    let a = load(x + offs, mask, 0.0);
    let b = load(y + offs, mask, 0.0);
    store(out + offs, a + b, mask);
}
"#;

const ADD16: &str = r#"
fn vector_add16<const BLOCK: usize>(x: Ptr<f32>, y: Ptr<f32>, out: Ptr<f32>, #[multiple_of(16)] n: i32) {
    let offs = program_id(0) * BLOCK + arange(0, BLOCK);
    let mask = offs < n;
    let a = load(x + offs, mask, 0.0);
    let b = load(y + offs, mask, 0.0);
    store(out + offs, a + b, mask);
}
"#;

// Each program asks L2 for the next program's block before adding its own (lines of
// `y` one by one, `x` as a bulk range on sm_90): hints, so the sums are exactly those
// of `vector_add`.
const ADD_PREFETCH: &str = r#"
fn vector_add_prefetch<const BLOCK: usize>(x: Ptr<f32>, y: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let offs = program_id(0) * BLOCK + arange(0, BLOCK);
    let next = offs + BLOCK;
    prefetch(y + next, next < n);
    let after = minimum(program_id(0) * BLOCK + BLOCK, n);
    prefetch_range(x + after, minimum(BLOCK, n - after));
    let mask = offs < n;
    let a = load(x + offs, mask, 0.0);
    let b = load(y + offs, mask, 0.0);
    store(out + offs, a + b, mask);
}
"#;

#[test]
fn gpu_vector_add() {
    let mut r = Rng(7);
    for (name, src) in [("vector_add", ADD), ("vector_add_prefetch", ADD_PREFETCH)] {
        for (block, warps, n) in [(1024, 4, 3000), (256, 4, 1000), (32, 4, 77)] {
            let d = def(src, &[("BLOCK", block)], warps);
            let grid = (n as u32).div_ceil(block as u32);
            let data = [
                Data::F32(r.vec(n, 1.0)),
                Data::F32(r.vec(n, 1.0)),
                Data::F32(vec![f32::NAN; n]),
                Data::S(Scalar::I32(n as i32)),
            ];
            diff(name, d, [grid, 1, 1], &data, 0.0);
        }
    }
    let d = def(ADD16, &[("BLOCK", 1024)], 4);
    let n = 4096 + 16;
    let data = [
        Data::F32(r.vec(n, 1.0)),
        Data::F32(r.vec(n, 1.0)),
        Data::F32(vec![0.0; n]),
        Data::S(Scalar::I32(n as i32)),
    ];
    diff("vector_add16", d, [5, 1, 1], &data, 0.0);
}

const SOFTMAX: &str = r#"
fn softmax<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, n_cols: i32) {
    let row = program_id(0);
    let cols = arange(0, BLOCK);
    let mask = cols < n_cols;
    let v = load(x + row * n_cols + cols, mask, f32::NEG_INFINITY);
    let e = exp(v - v.max(0));
    store(out + row * n_cols + cols, e / e.sum(0), mask);
}
"#;

const SOFTMAX2D: &str = r#"
fn softmax2d<const BM: usize, const BN: usize>(x: Ptr<f32>, out: Ptr<f32>, n_cols: i32) {
    let rows = program_id(0) * BM + arange(0, BM);
    let cols = arange(0, BN);
    let mask = cols.expand_dims(0) < n_cols;
    let offs = rows.expand_dims(1) * n_cols + cols.expand_dims(0);
    let v = load(x + offs, mask, f32::NEG_INFINITY);
    let e = exp(v - v.max(1).expand_dims(1));
    store(out + offs, e / e.sum(1).expand_dims(1), mask);
}
"#;

#[test]
fn gpu_softmax() {
    let mut r = Rng(3);
    for (block, warps, rows, cols) in [(1024, 4, 4, 1000), (128, 4, 3, 100), (64, 1, 2, 64)] {
        let d = def(SOFTMAX, &[("BLOCK", block)], warps);
        let data = [
            Data::F32(r.vec(rows * cols, 4.0)),
            Data::F32(vec![0.0; rows * cols]),
            Data::S(Scalar::I32(cols as i32)),
        ];
        diff("softmax", d, [rows as u32, 1, 1], &data, 1e-4);
    }
    for (bm, bn, warps) in [(4, 256, 4), (8, 32, 8), (2, 128, 2)] {
        let d = def(SOFTMAX2D, &[("BM", bm), ("BN", bn)], warps);
        let (rows, cols) = (bm as usize * 3, bn as usize);
        let data = [
            Data::F32(r.vec(rows * cols, 4.0)),
            Data::F32(vec![0.0; rows * cols]),
            Data::S(Scalar::I32(cols as i32)),
        ];
        diff("softmax2d", d, [3, 1, 1], &data, 1e-4);
    }
}

const RMSNORM: &str = r#"
fn rmsnorm<const BLOCK: usize>(x: Ptr<bf16>, w: Ptr<bf16>, out: Ptr<bf16>, n: i32, eps: f32) {
    let row = program_id(0);
    let cols = arange(0, BLOCK);
    let mask = cols < n;
    let v = load(x + row * n + cols, mask, 0.0) as f32;
    let r = rsqrt((v * v).sum(0) / (n as f32) + eps);
    let g = load(w + cols, mask, 0.0) as f32;
    store(out + row * n + cols, (v * r * g) as bf16, mask);
}
"#;

#[test]
fn gpu_rmsnorm() {
    let mut r = Rng(5);
    for (block, n) in [(1024, 1000), (256, 256)] {
        let d = def(RMSNORM, &[("BLOCK", block)], 4);
        let rows = 3;
        let data = [
            Data::Bf16(r.bf(rows * n)),
            Data::Bf16(r.bf(n)),
            Data::Bf16(vec![bf16::ZERO; rows * n]),
            Data::S(Scalar::I32(n as i32)),
            Data::S(Scalar::F32(1e-5)),
        ];
        // One bf16 ulp: the sum's order differs.
        diff("rmsnorm", d, [rows as u32, 1, 1], &data, 1.0 / 128.0);
    }
}

const GEMV: &str = r#"
fn gemv<const BLOCK_N: usize, const BLOCK_K: usize>(w: Ptr<bf16>, x: Ptr<bf16>, y: Ptr<f32>, n: i32, k: i32) {
    let rows = program_id(0) * BLOCK_N + arange(0, BLOCK_N);
    let row_ok = rows < n;
    let mut acc = zeros::<f32>([BLOCK_N, BLOCK_K]);
    for k0 in (0..k).step_by(BLOCK_K) {
        let cols = k0 + arange(0, BLOCK_K);
        let col_ok = cols < k;
        let xs = load(x + cols, col_ok, 0.0) as f32;
        let mask = row_ok.expand_dims(1) & col_ok.expand_dims(0);
        let ws = load(w + rows.expand_dims(1) * k + cols.expand_dims(0), mask, 0.0) as f32;
        acc += ws * xs.expand_dims(0);
    }
    store(y + rows, acc.sum(1), row_ok);
}
"#;

const GEMV1: &str = r#"
fn gemv1<const BLOCK_N: usize, const BLOCK_K: usize>(w: Ptr<bf16>, x: Ptr<bf16>, y: Ptr<f32>, n: i32, #[multiple_of(64)] k: i32) {
    let rows = program_id(0) * BLOCK_N + arange(0, BLOCK_N);
    let row_ok = rows < n;
    let mut acc = zeros::<f32>([BLOCK_N]);
    for k0 in (0..k).step_by(BLOCK_K) {
        let cols = k0 + arange(0, BLOCK_K);
        let xs = load(x + cols) as f32;
        let ws = load(w + rows.expand_dims(1) * k + cols.expand_dims(0), row_ok.expand_dims(1), 0.0) as f32;
        acc += (ws * xs.expand_dims(0)).sum(1);
    }
    store(y + rows, acc, row_ok);
}
"#;

#[test]
fn gpu_gemv() {
    let mut r = Rng(11);
    for (bn, bk, n, k) in [(4, 256, 37, 1000), (16, 128, 64, 512)] {
        let d = def(GEMV, &[("BLOCK_N", bn), ("BLOCK_K", bk)], 4);
        let data = [
            Data::Bf16(r.bf(n * k)),
            Data::Bf16(r.bf(k)),
            Data::F32(vec![0.0; n]),
            Data::S(Scalar::I32(n as i32)),
            Data::S(Scalar::I32(k as i32)),
        ];
        diff(
            "gemv",
            d,
            [(n as u32).div_ceil(bn as u32), 1, 1],
            &data,
            1e-4,
        );
    }
    for (bn, bk, n, k) in [(16, 256, 40, 1024), (8, 64, 8, 192)] {
        let d = def(GEMV1, &[("BLOCK_N", bn), ("BLOCK_K", bk)], 4);
        let data = [
            Data::Bf16(r.bf(n * k)),
            Data::Bf16(r.bf(k)),
            Data::F32(vec![0.0; n]),
            Data::S(Scalar::I32(n as i32)),
            Data::S(Scalar::I32(k as i32)),
        ];
        diff(
            "gemv1",
            d,
            [(n as u32).div_ceil(bn as u32), 1, 1],
            &data,
            1e-4,
        );
    }
}

// Double-buffered: bf16 tiles carried across iterations (as packed words), the last
// one stored after the loop, masked tails (their `other` packed into the words).
const GEMV_PREFETCH: &str = r#"
fn gemv_prefetch<const BLOCK_N: usize, const BLOCK_K: usize>(w: Ptr<bf16>, x: Ptr<bf16>, y: Ptr<f32>, last: Ptr<bf16>, n: i32, #[multiple_of(8)] k: i32) {
    let rows = program_id(0) * BLOCK_N + arange(0, BLOCK_N);
    let row_ok = rows < n;
    let cols = arange(0, BLOCK_K);
    let at = rows.expand_dims(1) * k;
    let mut wt = load(w + at + cols.expand_dims(0), row_ok.expand_dims(1) & (cols < k).expand_dims(0), 0.0);
    let mut prev = wt;
    let mut acc = zeros::<f32>([BLOCK_N]);
    for k0 in (0..k).step_by(BLOCK_K) {
        let c = k0 + arange(0, BLOCK_K);
        let nc = c + BLOCK_K;
        let next = load(w + at + nc.expand_dims(0), row_ok.expand_dims(1) & (nc < k).expand_dims(0), 1.5);
        let xs = load(x + c, c < k, 0.0) as f32;
        acc += (wt as f32 * xs.expand_dims(0)).sum(1);
        prev = wt;
        wt = next;
    }
    store(last + rows.expand_dims(1) * BLOCK_K + cols.expand_dims(0), prev, row_ok.expand_dims(1));
    store(y + rows, acc, row_ok);
}
"#;

#[test]
fn gpu_gemv_prefetch() {
    let mut r = Rng(12);
    // The same loop unrolled by two (`unrolled_loops_are_emitted_as_two_halves`): trip
    // counts of 1, 3, 4 and 5 leave it after either half.
    let unrolled = GEMV_PREFETCH
        .replace("fn gemv_prefetch<", "fn gemv_prefetch_unrolled<")
        .replace(".step_by(BLOCK_K) {", ".step_by(BLOCK_K).unroll(2) {");
    assert!(unrolled.contains(".unroll(2)"));
    for (name, src, bn, bk, n, k) in [
        ("gemv_prefetch", GEMV_PREFETCH, 4, 256, 37, 1000),
        ("gemv_prefetch", GEMV_PREFETCH, 16, 128, 64, 512),
        ("gemv_prefetch", GEMV_PREFETCH, 8, 64, 9, 8),
        (
            "gemv_prefetch_unrolled",
            unrolled.as_str(),
            4,
            256,
            37,
            1000,
        ),
        ("gemv_prefetch_unrolled", unrolled.as_str(), 8, 64, 9, 8),
        ("gemv_prefetch_unrolled", unrolled.as_str(), 4, 64, 13, 192),
        ("gemv_prefetch_unrolled", unrolled.as_str(), 8, 128, 21, 520),
    ] {
        let d = def(src, &[("BLOCK_N", bn as i64), ("BLOCK_K", bk as i64)], 4);
        let data = [
            Data::Bf16(r.bf(n * k)),
            Data::Bf16(r.bf(k)),
            Data::F32(vec![f32::NAN; n]),
            Data::Bf16(vec![bf16::NAN; n * bk]),
            Data::S(Scalar::I32(n as i32)),
            Data::S(Scalar::I32(k as i32)),
        ];
        diff(name, d, [(n as u32).div_ceil(bn as u32), 1, 1], &data, 1e-4);
    }
}

/// A GEMV-like loop of `.stages(n)`: bf16 weights (16-bit groups), `u32` words through a
/// carried pointer tile, an `f32` row vector, all masked with no `other` and so copied
/// ahead; a `u8` tile (1-byte groups) and a load with a non-zero `other` stay plain.
pub(crate) const GEMV_STAGED: &str = r#"
fn gemv_staged<const BLOCK_N: usize, const BLOCK_K: usize>(w: Ptr<bf16>, q: Ptr<u32>, s: Ptr<u8>, x: Ptr<f32>, y: Ptr<f32>, n: i32, #[multiple_of(8)] k: i32) {
    let rows = program_id(0) * BLOCK_N + arange(0, BLOCK_N);
    let row_ok = rows < n;
    let at = rows.expand_dims(1) * k;
    let mut qp = q + at + arange(0, BLOCK_K).expand_dims(0);
    let mut acc = zeros::<f32>([BLOCK_N]);
    for k0 in (0..k).step_by(BLOCK_K).stages(3) {
        let c = k0 + arange(0, BLOCK_K);
        let m = row_ok.expand_dims(1) & (c < k).expand_dims(0);
        let wt = load(w + at + c.expand_dims(0), m) as f32;
        let qt = load(qp, m);
        let st = load(s + at + c.expand_dims(0), m, 0) as f32;
        let xs = load(x + c, c < k);
        let xo = load(x + c, c < k, 2.0);
        acc += (wt * xs.expand_dims(0) + ((qt & 255) as f32) * st - xo.expand_dims(0) * 0.5).sum(1);
        qp = qp + BLOCK_K;
    }
    store(y + rows, acc, row_ok);
}
"#;

#[test]
fn gpu_gemv_staged() {
    let mut r = Rng(21);
    // Trip counts of 1 (fewer than the copies ahead), 2, 3 and 9; edges on both axes;
    // two, three and four stages.
    for (stages, bn, bk, n, k, warps) in [
        (3, 4, 256, 37, 1000, 4),
        (3, 8, 64, 9, 8, 4),
        (2, 16, 128, 64, 520, 8),
        (4, 4, 64, 13, 192, 4),
        (4, 2, 128, 5, 1096, 2),
    ] {
        let src = GEMV_STAGED.replace(".stages(3)", &format!(".stages({stages})"));
        let d = def(
            leak(src),
            &[("BLOCK_N", bn as i64), ("BLOCK_K", bk as i64)],
            warps,
        );
        let q: Vec<u32> = r
            .vec(n * k, 1.0)
            .iter()
            .map(|v| (v.abs() * 1e6) as u32)
            .collect();
        let s: Vec<u8> = r
            .vec(n * k, 1.0)
            .iter()
            .map(|v| (v.abs() * 200.0) as u8)
            .collect();
        let data = [
            Data::Bf16(r.bf(n * k)),
            Data::U32(q),
            Data::U8(s),
            Data::F32(r.vec(k, 1.0)),
            Data::F32(vec![f32::NAN; n]),
            Data::S(Scalar::I32(n as i32)),
            Data::S(Scalar::I32(k as i32)),
        ];
        let grid = [(n as u32).div_ceil(bn as u32), 1, 1];
        diff("gemv_staged", d, grid, &data, 1e-4);
    }
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

const ARGMAX: &str = r#"
fn argmax_rows<const R: usize, const C: usize>(x: Ptr<f32>, out: Ptr<i32>, first: Ptr<i32>) {
    let rows = arange(0, R);
    let cols = arange(0, C);
    let v = load(x + rows.expand_dims(1) * C + cols.expand_dims(0));
    store(out + rows, v.argmax(1));
    let mx = v.max(1);
    store(first, load(x + cols).argmax(0));
    store(out + R + rows, (mx * 1000.0) as i32);
}
"#;

#[test]
fn gpu_argmax() {
    let mut r = Rng(13);
    for (rr, c, w) in [(8usize, 512usize, 4), (4, 64, 2), (2, 16, 4)] {
        let d = def(ARGMAX, &[("R", rr as i64), ("C", c as i64)], w);
        // Few distinct values: many ties.
        let x: Vec<f32> = r
            .vec(rr * c, 1.0)
            .iter()
            .map(|v| (v * 4.0).round())
            .collect();
        let data = [
            Data::F32(x),
            Data::I32(vec![0; 2 * rr]),
            Data::I32(vec![0; 1]),
        ];
        diff("argmax", d, [1, 1, 1], &data, 0.0);
    }
}

const ATOMICS: &str = r#"
fn atomics<const B: usize>(x: Ptr<f32>, acc: Ptr<f32>, mx: Ptr<f32>, cnt: Ptr<i32>, old: Ptr<f32>, n: i32) {
    let offs = arange(0, B);
    let mask = offs < n;
    let v = load(x + offs, mask, 0.0);
    let o = atomic_add(acc + offs, v, mask);
    atomic_max(mx + offs, v, mask);
    store(old + offs, o, mask);
    atomic_add(cnt + offs, 1, mask);
}
"#;

#[test]
fn gpu_atomics() {
    let mut r = Rng(17);
    for (b, w, n) in [(16, 4, 13), (256, 4, 256), (1024, 2, 1000)] {
        let d = def(ATOMICS, &[("B", b)], w);
        let data = [
            Data::F32(r.vec(b as usize, 1.0)),
            Data::F32(vec![0.5; b as usize]),
            Data::F32(r.vec(b as usize, 1.0)),
            Data::I32(vec![0; b as usize]),
            Data::F32(vec![0.0; b as usize]),
            Data::S(Scalar::I32(n)),
        ];
        diff("atomics", d, [1, 1, 1], &data, 0.0);
    }
}

const LAST_PROGRAM: &str = r#"
fn last_program<const B: usize>(x: Ptr<f32>, scaled: Ptr<f32>, partial: Ptr<f32>, cnt: Ptr<i32>, total: Ptr<f32>, n: i32) {
    let pid = program_id(0);
    let offs = pid * B + arange(0, B);
    let v = load(x + offs, offs < n, 0.0) * 2.0;
    store(scaled + offs, v, offs < n);
    store(partial + pid, v.sum(0));
    let arrived = atomic_add(cnt, 1);
    if arrived == num_programs(0) - 1 {
        let mut acc = zeros::<f32>([B]);
        for s0 in (0..n).step_by(B) {
            let o = s0 + arange(0, B);
            acc += load(scaled + o, o < n, 0.0);
        }
        let mut pacc = zeros::<f32>([B]);
        for s0 in (0..num_programs(0)).step_by(B) {
            let o = s0 + arange(0, B);
            pacc += load(partial + o, o < num_programs(0), 0.0);
        }
        store(total, acc.sum(0));
        store(total + 1, pacc.sum(0));
        store(cnt, 0);
    }
}
"#;

/// The last program to bump a counter reads every other program's writes (tiles stored
/// by all of their threads, and scalars): atomics order the whole program.
#[test]
fn gpu_last_program_reads_every_program_s_writes() {
    let mut r = Rng(23);
    for (b, w, programs) in [(256i32, 4, 1024i32), (128, 8, 517)] {
        let d = def(LAST_PROGRAM, &[("B", b as i64)], w);
        let n = programs * b - 37;
        // Quarter-integers: every partial and total sum is exact, in any order.
        let x: Vec<f32> = (0..n).map(|_| (r.f() * 32.0).round() * 0.25).collect();
        let data = [
            Data::F32(x),
            Data::F32(vec![f32::NAN; n as usize]),
            Data::F32(vec![f32::NAN; programs as usize]),
            Data::I32(vec![0; 1]),
            Data::F32(vec![f32::NAN; 2]),
            Data::S(Scalar::I32(n)),
        ];
        let want = run_on(&Device::cpu(), d, [programs as u32, 1, 1], &data);
        let (Data::F32(x), Data::F32(t)) = (&data[0], &want[4]) else {
            unreachable!()
        };
        let sum: f32 = x.iter().map(|v| v * 2.0).sum();
        assert_eq!(t, &vec![sum, sum], "interpreter");
        diff("last program", d, [programs as u32, 1, 1], &data, 0.0);
    }
}

const TIMER: &str = r#"
fn timer<const B: usize>(x: Ptr<f32>, out: Ptr<f32>, stamps: Ptr<i64>, steps: i32) {
    let start = global_timer();
    let offs = program_id(0) * B + arange(0, B);
    let mut y = load(x + offs);
    for i in 0..steps {
        y = y * 0.5 + (i as f32);
    }
    store(out + offs, y);
    let end = global_timer();
    store(stamps + 3 * program_id(0), start);
    store(stamps + 3 * program_id(0) + 1, end);
    store(stamps + 3 * program_id(0) + 2, sm_id() as i64);
}
"#;

/// `global_timer()` reads one clock for every program: each program's end stamp is at
/// or after its start, every stamp lies within one short window, and the work between
/// them computes what the interpreter computes. `sm_id()` names a processor: 0 on the
/// interpreter; on the GPU more programs than one processor holds spread over several.
#[test]
fn gpu_global_timer_stamps_each_program_in_order() {
    let mut r = Rng(29);
    let programs = 264;
    let d = def(TIMER, &[("B", 128)], 4);
    let data = [
        Data::F32(r.vec(programs * 128, 1.0)),
        Data::F32(vec![f32::NAN; programs * 128]),
        Data::I64(vec![-1; 3 * programs]),
        Data::S(Scalar::I32(16)),
    ];
    let check = |what: &str, got: &[Data]| {
        let Data::I64(stamps) = &got[2] else {
            unreachable!()
        };
        for (p, s) in stamps.chunks(3).enumerate() {
            assert!(
                s[0] >= 0 && s[1] >= s[0],
                "{what}: program {p} stamps {s:?}"
            );
            assert!(
                (0..1024).contains(&s[2]),
                "{what}: program {p} on SM {}",
                s[2]
            );
        }
        let sms: std::collections::BTreeSet<i64> = stamps.chunks(3).map(|s| s[2]).collect();
        if what == "interpreter" {
            assert_eq!(sms.len(), 1, "{what}: one processor");
        } else {
            assert!(sms.len() > 1, "{what}: {programs} programs on SMs {sms:?}");
        }
        let times = stamps.chunks(3).flat_map(|s| [s[0], s[1]]);
        let (lo, hi) = (times.clone().min().unwrap(), times.max().unwrap());
        assert!(
            hi - lo < 10_000_000_000,
            "{what}: stamps span {} ns",
            hi - lo
        );
    };
    let want = run_on(&Device::cpu(), d, [programs as u32, 1, 1], &data);
    check("interpreter", &want);
    let _turn = crate::runtime::testing::gpu_turn();
    let Some(gpu) = gpu_or_skip("global timer") else {
        return;
    };
    let got = run_on(&gpu, d, [programs as u32, 1, 1], &data);
    check("gpu", &got);
    assert_eq!(got[1], want[1], "the work between the stamps");
}

const BRANCH: &str = r#"
fn branch<const B: usize>(x: Ptr<f32>, out: Ptr<f32>, steps: i32) {
    let offs = program_id(0) * B + arange(0, B);
    let v = load(x + offs);
    let mut y = v;
    if program_id(0) == 1 {
        y = v * 2.0;
    } else {
        y = v - v.sum(0);
    }
    let mut s = 0.0;
    for i in 0..steps {
        y = y + 1.0;
        s = s + (i as f32);
    }
    store(out + offs, y + s);
}
"#;

#[test]
fn gpu_control_flow() {
    let mut r = Rng(19);
    let d = def(BRANCH, &[("B", 256)], 4);
    let data = [
        Data::F32(r.vec(512, 1.0)),
        Data::F32(vec![0.0; 512]),
        Data::S(Scalar::I32(5)),
    ];
    diff("branch", d, [2, 1, 1], &data, 1e-5);
}

const DOT: &str = r#"
fn mm<const M: usize, const N: usize, const K: usize>(a: Ptr<bf16>, b: Ptr<bf16>, c: Ptr<f32>) {
    let rm = arange(0, M);
    let rn = arange(0, N);
    let rk = arange(0, K);
    let x = load(a + rm.expand_dims(1) * K + rk.expand_dims(0));
    let y = load(b + rk.expand_dims(1) * N + rn.expand_dims(0));
    let acc = zeros::<f32>([M, N]) + 1.0;
    store(c + rm.expand_dims(1) * N + rn.expand_dims(0), dot(x, y, acc));
}
"#;

const DOT32: &str = r#"
fn mm32<const M: usize, const N: usize, const K: usize>(a: Ptr<f32>, b: Ptr<f32>, c: Ptr<f32>) {
    let rm = arange(0, M);
    let rn = arange(0, N);
    let rk = arange(0, K);
    let x = load(a + rm.expand_dims(1) * K + rk.expand_dims(0));
    let y = load(b + rk.expand_dims(1) * N + rn.expand_dims(0));
    store(c + rm.expand_dims(1) * N + rn.expand_dims(0), dot(x, y));
}
"#;

#[test]
fn gpu_dot_f32() {
    let mut r = Rng(41);
    for (m, n, k) in [(32, 32, 16), (16, 8, 64)] {
        let d = def(DOT32, &[("M", m), ("N", n), ("K", k)], 4);
        let (m, n, k) = (m as usize, n as usize, k as usize);
        let data = [
            Data::F32(r.vec(m * k, 1.0)),
            Data::F32(r.vec(k * n, 1.0)),
            Data::F32(vec![0.0; m * n]),
        ];
        diff("dot_f32", d, [1, 1, 1], &data, 1e-4);
    }
}

#[test]
fn gpu_dot() {
    let mut r = Rng(23);
    // Tensor cores (mma.sync) for every shape here, including fewer tiles than warps.
    for (m, n, k) in [(32, 32, 32), (16, 64, 16), (64, 64, 32), (16, 8, 16)] {
        let d = def(DOT, &[("M", m), ("N", n), ("K", k)], 4);
        let (m, n, k) = (m as usize, n as usize, k as usize);
        let data = [
            Data::Bf16(r.bf(m * k)),
            Data::Bf16(r.bf(k * n)),
            Data::F32(vec![0.0; m * n]),
        ];
        diff("dot", d, [1, 1, 1], &data, 1e-4);
    }
}

const CASTS: &str = r#"
fn casts<const B: usize>(x: Ptr<f32>, i: Ptr<i32>, u: Ptr<u8>, h: Ptr<bf16>, f: Ptr<f32>) {
    let offs = arange(0, B);
    let v = load(x + offs);
    store(i + offs, v as i32);
    store(u + offs, v as u8);
    store(h + offs, v as bf16);
    store(f + offs, ((v as i32) as f32) + ((v > 0.0) as f32) + sigmoid(v) + tanh(v) * 0.0);
}
"#;

#[test]
fn gpu_casts() {
    let mut r = Rng(29);
    let d = def(CASTS, &[("B", 512)], 4);
    let mut x = r.vec(512, 400.0);
    x[0] = f32::NAN;
    x[1] = 1e20;
    x[2] = -1e20;
    x[3] = -0.5;
    let data = [
        Data::F32(x),
        Data::I32(vec![0; 512]),
        Data::U8(vec![0; 512]),
        Data::Bf16(vec![bf16::ZERO; 512]),
        Data::F32(vec![0.0; 512]),
    ];
    diff("casts", d, [1, 1, 1], &data, 1e-5);
}

#[test]
#[ignore]
fn dump() {
    let src = std::env::var("DUMP").unwrap_or_default();
    let (s, c, w): (&str, Vec<(&str, i64)>, u32) = match src.as_str() {
        "gemv" => (GEMV, vec![("BLOCK_N", 4), ("BLOCK_K", 256)], 4),
        "gemv1" => (GEMV1, vec![("BLOCK_N", 8), ("BLOCK_K", 64)], 4),
        "atomics" => (ATOMICS, vec![("B", 16)], 4),
        "argmax" => (ARGMAX, vec![("R", 2), ("C", 16)], 4),
        "branch" => (BRANCH, vec![("B", 256)], 4),
        "attn" => (DECODE_ATTN, vec![("D", 64), ("BS", 16)], 4),
        "greedy" => (SAMPLE, vec![("B", 1024)], 4),
        "dot" => (DOT, vec![("M", 16), ("N", 8), ("K", 16)], 4),
        _ => (SOFTMAX2D, vec![("BM", 2), ("BN", 128)], 2),
    };
    let d = def(s, &c, w);
    println!("{}", d.variants[0].ptx_sm80.as_str());
}

const COLSUM: &str = r#"
fn colstats<const M: usize, const N: usize>(x: Ptr<f32>, sums: Ptr<f32>, idx: Ptr<i32>, cnt: Ptr<i32>) {
    let r = arange(0, M);
    let c = arange(0, N);
    let v = load(x + r.expand_dims(1) * N + c.expand_dims(0));
    store(sums + c, v.sum(0));
    store(sums + N + c, maximum(v.max(0), 0.0) - minimum(v.min(0), 0.0));
    store(idx + c, v.argmax(0));
    let big = select(v > 0.5, 1, 0);
    atomic_max(cnt + c, big.sum(0));
    atomic_add(cnt + N, num_programs(0));
}
"#;

#[test]
fn gpu_column_reductions() {
    let mut r = Rng(31);
    for (m, n, w) in [(64, 32, 4), (128, 8, 8), (4, 64, 1), (2, 256, 1)] {
        let d = def(COLSUM, &[("M", m), ("N", n)], w);
        let (m, n) = (m as usize, n as usize);
        let data = [
            Data::F32(r.vec(m * n, 1.0)),
            Data::F32(vec![0.0; 2 * n]),
            Data::I32(vec![0; n]),
            Data::I32(vec![0; n + 1]),
        ];
        diff("colstats", d, [1, 1, 1], &data, 1e-5);
    }
}

const TILE3: &str = r#"
fn tile3<const A: usize, const B: usize, const C: usize>(x: Ptr<bf16>, out: Ptr<f32>, o2: Ptr<bf16>) {
    let a = arange(0, A);
    let b = arange(0, B);
    let c = arange(0, C);
    let offs = (a.expand_dims(1).expand_dims(2) * B + b.expand_dims(0).expand_dims(2)) * C + c.expand_dims(0).expand_dims(1);
    let v = load(x + offs) as f32;
    let s = v.sum(2);
    let t = exp(s - s.max(1).expand_dims(1));
    store(out + a.expand_dims(1) * B + b.expand_dims(0), t / t.sum(1).expand_dims(1));
    store(o2 + offs, (v * sigmoid(v)) as bf16);
}
"#;

#[test]
fn gpu_rank3_tiles() {
    let mut r = Rng(37);
    for (a, b, c, w) in [(2, 4, 32, 4), (4, 8, 16, 2)] {
        let d = def(TILE3, &[("A", a), ("B", b), ("C", c)], w);
        let (a, b, c) = (a as usize, b as usize, c as usize);
        let data = [
            Data::Bf16(r.bf(a * b * c)),
            Data::F32(vec![0.0; a * b]),
            Data::Bf16(vec![bf16::ZERO; a * b * c]),
        ];
        diff("tile3", d, [1, 1, 1], &data, 1.0 / 128.0);
    }
}

const ROPE: &str = r#"
fn rope<const D: usize>(x: Ptr<bf16>, out: Ptr<bf16>, pos: i32, theta: f32) {
    let head = program_id(0);
    let i = arange(0, D / 2);
    let freq = exp2(-(i as f32) * (2.0 / (D as f32)) * log2(theta));
    let ang = (pos as f32) * freq;
    let c = cos(ang);
    let s = sin(ang);
    let base = head * D;
    let a = load(x + base + i) as f32;
    let b = load(x + base + D / 2 + i) as f32;
    store(out + base + i, (a * c - b * s) as bf16);
    store(out + base + D / 2 + i, (b * c + a * s) as bf16);
}
"#;

#[test]
fn gpu_rope() {
    let mut r = Rng(43);
    let d = def(ROPE, &[("D", 64)], 1);
    let data = [
        Data::Bf16(r.bf(4 * 64)),
        Data::Bf16(vec![bf16::ZERO; 4 * 64]),
        Data::S(Scalar::I32(7)),
        Data::S(Scalar::F32(10000.0)),
    ];
    // sin/cos/exp2 are approximate on the GPU: allow a bf16 ulp.
    diff("rope", d, [4, 1, 1], &data, 1.0 / 64.0);
}

const DECODE_ATTN: &str = r#"
fn attn<const D: usize, const BS: usize>(q: Ptr<f32>, k: Ptr<bf16>, v: Ptr<bf16>, out: Ptr<f32>, seq: i32, scale: f32) {
    let d = arange(0, D);
    let qv = load(q + d);
    let mut m = f32::NEG_INFINITY;
    let mut l = 0.0;
    let mut acc = zeros::<f32>([D]);
    for s0 in (0..seq).step_by(BS) {
        let s = s0 + arange(0, BS);
        let ok = s < seq;
        let kt = load(k + s.expand_dims(1) * D + d.expand_dims(0), ok.expand_dims(1), 0.0) as f32;
        let sc = select(ok, (kt * qv.expand_dims(0)).sum(1) * scale, f32::NEG_INFINITY);
        let m_new = maximum(m, sc.max(0));
        let p = exp(sc - m_new);
        let alpha = exp(m - m_new);
        let vt = load(v + s.expand_dims(1) * D + d.expand_dims(0), ok.expand_dims(1), 0.0) as f32;
        acc = acc * alpha + (vt * p.expand_dims(1)).sum(0);
        l = l * alpha + p.sum(0);
        m = m_new;
    }
    store(out + d, acc / l);
}
"#;

#[test]
fn gpu_decode_attention() {
    let mut r = Rng(47);
    for (dd, bs, seq, w) in [(64, 16, 37, 4), (128, 32, 100, 4), (32, 8, 8, 1)] {
        let d = def(DECODE_ATTN, &[("D", dd), ("BS", bs)], w);
        let (dd, seq) = (dd as usize, seq as usize);
        let data = [
            Data::F32(r.vec(dd, 1.0)),
            Data::Bf16(r.bf(seq * dd)),
            Data::Bf16(r.bf(seq * dd)),
            Data::F32(vec![0.0; dd]),
            Data::S(Scalar::I32(seq as i32)),
            Data::S(Scalar::F32(0.125)),
        ];
        diff("decode_attention", d, [1, 1, 1], &data, 1e-4);
    }
}

const SAMPLE: &str = r#"
fn greedy<const B: usize>(logits: Ptr<f32>, out: Ptr<i32>, n: i32) {
    let mut best = f32::NEG_INFINITY;
    let mut idx = 0;
    for s0 in (0..n).step_by(B) {
        let offs = s0 + arange(0, B);
        let v = load(logits + offs, offs < n, f32::NEG_INFINITY);
        let m = v.max(0);
        if m > best {
            best = m;
            idx = s0 + v.argmax(0);
        }
    }
    store(out, idx);
}
"#;

#[test]
fn gpu_greedy_sampling() {
    let mut r = Rng(53);
    for (b, n) in [(1024, 5000), (256, 256), (128, 77)] {
        let d = def(SAMPLE, &[("B", b)], 4);
        let mut x: Vec<f32> = r.vec(n, 3.0).iter().map(|v| (v * 8.0).round()).collect();
        x[n / 2] = 100.0;
        x[n - 1] = 100.0;
        let data = [
            Data::F32(x),
            Data::I32(vec![-1]),
            Data::S(Scalar::I32(n as i32)),
        ];
        diff("greedy", d, [1, 1, 1], &data, 0.0);
    }
}

const SILU_MUL: &str = r#"
fn silu_mul<const B: usize>(g: Ptr<bf16>, u: Ptr<bf16>, out: Ptr<bf16>, #[multiple_of(8)] n: i32) {
    let offs = program_id(0) * B + arange(0, B);
    let mask = offs < n;
    let a = load(g + offs, mask, 0.0) as f32;
    let b = load(u + offs, mask, 0.0) as f32;
    store(out + offs, (a * sigmoid(a) * b) as bf16, mask);
}
"#;

#[test]
fn gpu_silu_mul() {
    let mut r = Rng(59);
    let d = def(SILU_MUL, &[("B", 1024)], 4);
    let p = compile(
        &crate::compile_source(
            d.source,
            &Specialization {
                consts: vec![("B".into(), 1024)],
                num_warps: 4,
                num_stages: None,
            },
        )
        .unwrap(),
        Target::Sm80,
    )
    .unwrap();
    assert!(
        p.ptx.contains("ld.global.nc.v4.b32"),
        "bf16 loads are vectorized"
    );
    let n = 3000;
    let data = [
        Data::Bf16(r.bf(n)),
        Data::Bf16(r.bf(n)),
        Data::Bf16(vec![bf16::ZERO; n]),
        Data::S(Scalar::I32(n as i32)),
    ];
    diff("silu_mul", d, [3, 1, 1], &data, 1.0 / 64.0);
}

const CLUSTER_MERGE: &str = r#"
fn cluster_merge<const C: usize, const D: usize>(
    x: Ptr<f32>,
    merged: Ptr<f32>,
    echo: Ptr<bf16>,
    ranks: Ptr<i32>,
    flags: Ptr<i32>,
) {
    let row = program_id(0);
    let part = program_id(1);
    let parts = num_programs(1);
    let d = arange(0, D);
    let v = load(x + (row * parts + part) * D + d);
    let m = v.max(0);
    let all_m = cluster_gather(m);
    let all_v = cluster_gather(v);
    let all_h = cluster_gather(v as bf16);
    let ids = cluster_gather(part);
    let pos = cluster_gather(m > 0.0);
    // A flash-decoding style merge of the cluster's parts, stored by its first program.
    let w = exp(all_m - all_m.max(0));
    let out = (all_v * w.expand_dims(1)).sum(0) / w.sum(0);
    if part % C == 0 {
        store(merged + (row * (parts / C) + part / C) * D + d, out);
    }
    // Every program echoes its right neighbour's row (rank order), in bf16.
    let c = arange(0, C);
    let next = (part + 1) % C;
    let pick = select((c == next).expand_dims(1), all_h, 0.0).sum(0);
    store(echo + (row * parts + part) * D + d, pick);
    store(ranks + (row * parts + part) * C + c, ids);
    store(flags + (row * parts + part) * C + c, pos as i32);
}
"#;

/// `cluster_gather` on the interpreter against a host computation, then on the GPU
/// (sm_90: distributed shared memory) against the interpreter; 16 programs a cluster
/// need the non-portable cluster size.
#[test]
fn gpu_cluster_gather() {
    let mut r = Rng(31);
    let (rows, d) = (3usize, 64usize);
    for c in [2usize, 8, 16] {
        let k = crate::testing::def_attr(
            CLUSTER_MERGE,
            &[("C", c as i64), ("D", d as i64)],
            4,
            true,
            "cluster(y = C)",
        );
        let parts = 2 * c;
        let x = r.vec(rows * parts * d, 2.0);
        let data = [
            Data::F32(x.clone()),
            Data::F32(vec![f32::NAN; rows * 2 * d]),
            Data::Bf16(vec![bf16::from_f32(f32::NAN); rows * parts * d]),
            Data::I32(vec![-1; rows * parts * c]),
            Data::I32(vec![-1; rows * parts * c]),
        ];
        let got = run_on(&Device::cpu(), k, [rows as u32, parts as u32, 1], &data);
        let (Data::F32(merged), Data::Bf16(echo), Data::I32(ranks), Data::I32(flags)) =
            (&got[1], &got[2], &got[3], &got[4])
        else {
            panic!("unexpected buffer kinds")
        };
        for row in 0..rows {
            for part in 0..parts {
                let first = part / c * c;
                let at = |p: usize| &x[(row * parts + p) * d..][..d];
                let maxes: Vec<f32> = (first..first + c)
                    .map(|p| at(p).iter().copied().fold(f32::MIN, f32::max))
                    .collect();
                let o = (row * parts + part) * c;
                let want_ranks: Vec<i32> = (first..first + c).map(|p| p as i32).collect();
                assert_eq!(
                    ranks[o..o + c],
                    want_ranks[..],
                    "C {c} row {row} part {part}"
                );
                let want_flags: Vec<i32> = maxes.iter().map(|&m| (m > 0.0) as i32).collect();
                assert_eq!(flags[o..o + c], want_flags[..]);
                let next = first + (part % c + 1) % c;
                let want_echo: Vec<bf16> = at(next).iter().map(|&v| bf16::from_f32(v)).collect();
                assert_eq!(echo[(row * parts + part) * d..][..d], want_echo[..]);
                if part % c == 0 {
                    let top = maxes.iter().copied().fold(f32::MIN, f32::max);
                    let w: Vec<f64> = maxes.iter().map(|&m| ((m - top) as f64).exp()).collect();
                    let total: f64 = w.iter().sum();
                    for j in 0..d {
                        let want: f64 =
                            (0..c).map(|i| w[i] * at(first + i)[j] as f64).sum::<f64>() / total;
                        let got = merged[(row * 2 + part / c) * d + j] as f64;
                        assert!(
                            (got - want).abs() < 1e-5 * (1.0 + want.abs()),
                            "C {c}: {got} vs {want}"
                        );
                    }
                }
            }
        }
        diff(
            "cluster_merge",
            k,
            [rows as u32, parts as u32, 1],
            &data,
            1e-4,
        );
    }
}

/// Triton's tutorial matmul (masked edges, pointer tiles advanced by the loop), with
/// `ACC` choosing how the product is accumulated: 0 `acc = dot(x, y, acc)` from zeros,
/// 1 `acc = acc + dot(x, y)`, 2 `acc = dot(x, y, acc)` from the loaded output.
pub(crate) const MATMUL_LOOP: &str = r#"
fn mml<const BM: usize, const BN: usize, const BK: usize, const ACC: usize>(
    a: Ptr<bf16>, b: Ptr<bf16>, c: Ptr<f32>, m: i32, n: i32, k: i32,
) {
    let rm = program_id(0) * BM + arange(0, BM);
    let rn = program_id(1) * BN + arange(0, BN);
    let rk = arange(0, BK);
    let cmask = (rm.expand_dims(1) < m) & (rn.expand_dims(0) < n);
    let pc = c + rm.expand_dims(1) * n + rn.expand_dims(0);
    let mut acc = zeros::<f32>([BM, BN]);
    if ACC == 2 {
        acc = load(pc, cmask, 0.0);
    }
    let mut pa = a + rm.expand_dims(1) * k + rk.expand_dims(0);
    let mut pb = b + rk.expand_dims(1) * n + rn.expand_dims(0);
    for k0 in (0..k).step_by(BK) {
        let x = load(pa, (rm.expand_dims(1) < m) & (rk.expand_dims(0) < k - k0), 0.0);
        let y = load(pb, (rk.expand_dims(1) < k - k0) & (rn.expand_dims(0) < n), 0.0);
        if ACC == 1 {
            acc = acc + dot(x, y);
        } else {
            acc = dot(x, y, acc);
        }
        pa = pa + BK;
        pb = pb + BK * n;
    }
    store(pc, acc, cmask);
}
"#;

#[test]
fn gpu_dot_in_a_loop() {
    let mut r = Rng(47);
    // (BM, BN, BK, warps, M, N, K, ACC, f16): M, N, K not multiples of the tile, K
    // smaller than one tile, f16 and bf16, each accumulation form.
    let cases = [
        (64, 64, 32, 4, 100, 72, 40, 0, false),
        (32, 64, 16, 4, 33, 65, 8, 1, false),
        (64, 32, 32, 2, 70, 50, 100, 0, true),
        (128, 64, 32, 8, 130, 72, 40, 2, false),
        (128, 128, 32, 8, 130, 136, 40, 0, false),
        (16, 16, 16, 1, 20, 24, 48, 2, true),
    ];
    for (bm, bn, bk, w, m, n, k, acc, f16) in cases {
        let src = if f16 {
            MATMUL_LOOP.replace("bf16", "f16")
        } else {
            MATMUL_LOOP.to_string()
        };
        let d = def(&src, &[("BM", bm), ("BN", bn), ("BK", bk), ("ACC", acc)], w);
        let half = |r: &mut Rng, len: usize| {
            if f16 {
                Data::F16(
                    r.vec(len, 1.0)
                        .into_iter()
                        .map(half::f16::from_f32)
                        .collect(),
                )
            } else {
                Data::Bf16(r.bf(len))
            }
        };
        let data = gemm_args(
            half(&mut r, m * k),
            half(&mut r, k * n),
            Data::F32(r.vec(m * n, 1.0)),
            (m, n, k),
        );
        let grid = tile_grid(m, n, bm, bn);
        diff("dot_in_a_loop", d, grid, &data, 1e-4);
    }
}

/// [`MATMUL_LOOP`] with `n` and `k` multiples of 16: 16-byte loads, so the operand
/// loads are pipelined through `cp.async` (`num_stages`).
pub(crate) fn matmul_pipelined() -> String {
    MATMUL_LOOP.replace(
        "n: i32, k: i32",
        "#[multiple_of(16)] n: i32, #[multiple_of(16)] k: i32",
    )
}

#[test]
fn gpu_dot_pipelined() {
    let mut r = Rng(53);
    let src = matmul_pipelined();
    // (BM, BN, BK, warps, stages, M, N, K, ACC): edges off the tile, K below one tile,
    // K spanning fewer iterations than stages, each accumulation form.
    let cases = [
        (64, 64, 32, 4, 2, 100, 80, 48, 0),
        (64, 64, 32, 4, 3, 100, 80, 160, 0),
        (128, 128, 32, 8, 4, 130, 144, 16, 2),
        (32, 64, 16, 4, 3, 70, 96, 48, 1),
        (128, 64, 64, 4, 3, 200, 64, 336, 0),
    ];
    for (bm, bn, bk, w, stages, m, n, k, acc) in cases {
        let d = crate::testing::def_attr(
            &src,
            &[("BM", bm), ("BN", bn), ("BK", bk), ("ACC", acc)],
            w,
            true,
            &format!("num_stages = [{stages}]"),
        );
        assert!(
            d.variants[0]
                .ptx_sm80
                .as_str()
                .contains("cp.async.cg.shared.global"),
            "pipelined"
        );
        let data = gemm_args(
            Data::Bf16(r.bf(m * k)),
            Data::Bf16(r.bf(k * n)),
            Data::F32(r.vec(m * n, 1.0)),
            (m, n, k),
        );
        let grid = tile_grid(m, n, bm, bn);
        diff("dot_pipelined", d, grid, &data, 1e-4);
    }
}

/// Triton's descriptor matmul: both operands read through tensor descriptors.
const MATMUL_DESCRIPTORS: &str = r#"
fn mmd<const BM: usize, const BN: usize, const BK: usize>(
    a: Ptr<bf16>, b: Ptr<bf16>, c: Ptr<f32>, m: i32, n: i32, k: i32,
) {
    let a_blocks = make_tensor_descriptor(a, [m, k], [k, 1], [BM, BK]);
    let b_blocks = make_tensor_descriptor(b, [k, n], [n, 1], [BK, BN]);
    let pm = program_id(0) * BM;
    let pn = program_id(1) * BN;
    let mut acc = zeros::<f32>([BM, BN]);
    for k0 in (0..k).step_by(BK) {
        acc = dot(a_blocks.load([pm, k0]), b_blocks.load([k0, pn]), acc);
    }
    let rm = pm + arange(0, BM);
    let rn = pn + arange(0, BN);
    store(c + rm.expand_dims(1) * n + rn.expand_dims(0), acc, (rm.expand_dims(1) < m) & (rn.expand_dims(0) < n));
}
"#;

/// Descriptor loads feeding `wgmma` go through the copy engine on sm_90a (one box of a
/// map of up to five dims for a block inside the matrix, two-dimensional boxes at its
/// edges, zero-filled past them), and must compute what the interpreter's masked loads
/// do: shapes off the tile, K below one tile, each swizzle width (128-byte rows of A and
/// B panels, 64-byte rows at `BK = 32`), A's row permutation for 4 and 8 warps and two
/// `m64` instructions a warpgroup; and a row stride the copy engine cannot take (K = 36:
/// 72-byte rows), where the launch runs the sm_90 PTX instead.
#[test]
fn gpu_dot_tensor_descriptors() {
    let mut r = Rng(67);
    // B as an `[N, K]` weight seen column-major (`[1, k]` strides): one box of N rows of
    // K a stage, staged K-major for `wgmma`.
    let nt = MATMUL_DESCRIPTORS.replace("[k, n], [n, 1], [BK, BN]", "[k, n], [1, k], [BK, BN]");
    // (BM, BN, BK, warps, stages, M, N, K, B column-major)
    let cases = [
        (128, 256, 64, 8, 4, 300, 520, 200, false),
        (128, 128, 64, 8, 3, 256, 256, 128, false),
        (64, 128, 64, 4, 3, 100, 200, 40, false),
        (128, 128, 64, 4, 3, 130, 136, 136, false),
        (64, 64, 32, 4, 3, 72, 80, 96, false),
        (128, 128, 64, 8, 3, 136, 136, 36, false),
        (128, 128, 64, 8, 4, 200, 136, 200, true),
        (128, 256, 64, 8, 3, 136, 264, 72, true),
        (64, 64, 32, 4, 3, 72, 40, 24, true),
    ];
    for (bm, bn, bk, w, stages, m, n, k, b_col_major) in cases {
        let src = if b_col_major {
            nt.as_str()
        } else {
            MATMUL_DESCRIPTORS
        };
        let d = crate::testing::def_attr(
            src,
            &[("BM", bm), ("BN", bn), ("BK", bk)],
            w,
            false,
            &format!("num_stages = [{stages}]"),
        );
        let v = &d.variants[0];
        assert!(
            v.ptx_sm90a.as_str().contains("cp.async.bulk.tensor"),
            "copy engine at {bm}x{bn}x{bk}"
        );
        let col_major = v.tma_maps.iter().filter(|m| m.view.col_major).count();
        assert_eq!(col_major, usize::from(b_col_major));
        assert!(!v.ptx_sm90.as_str().contains("cp.async.bulk.tensor"));
        let data = gemm_args(
            Data::Bf16(r.bf(m * k)),
            Data::Bf16(r.bf(k * n)),
            Data::F32(vec![f32::NAN; m * n]),
            (m, n, k),
        );
        let grid = tile_grid(m, n, bm, bn);
        diff("dot_tensor_descriptors", d, grid, &data, 1e-4);
    }
}

/// The `wgmma` tiles (sm_90a, picked on compute capability 9.0; elsewhere the same
/// variants run `mma.sync`): one and two warpgroups, one and two `m64` instructions per
/// warpgroup, B in 64-column panels, 128- and 64-byte swizzles, pipelined and not, f16
/// and bf16, A `[M, K]` with B `[K, N]` (N-major) or an `[N, K]` weight (K-major), on
/// shapes off the tile with K below one tile.
#[test]
fn gpu_dot_wgmma_tiles() {
    let mut r = Rng(61);
    // (BM, BN, BK, warps, stages, M, N, K, f16, exact): `exact` draws inputs whose
    // products and sums are exact in f32, so a long K compares bit for bit (random ones
    // differ in the last bits with the order of the sums, past the tolerance where
    // they cancel).
    let cases = [
        (128, 256, 64, 8, 3, 200, 272, 208, false, false),
        // Four stages of 128 x 256 only fit without the extra buffer: the copies go
        // after the running group's wait (`wgmma_ring_goes_late_without_room`); K of
        // nine iterations and a tail wraps the ring twice.
        (128, 256, 64, 8, 4, 136, 256, 560, false, true),
        (128, 128, 64, 4, 3, 130, 144, 336, true, false),
        (128, 128, 32, 8, 4, 257, 128, 48, false, false),
        (64, 128, 32, 4, 1, 100, 144, 80, false, false),
        (64, 64, 64, 4, 2, 65, 80, 16, true, false),
    ];
    for (bm, bn, bk, w, stages, m, n, k, f16, exact) in cases {
        let src = if f16 {
            matmul_pipelined().replace("bf16", "f16")
        } else {
            matmul_pipelined()
        };
        let d = crate::testing::def_attr(
            &src,
            &[("BM", bm), ("BN", bn), ("BK", bk), ("ACC", 2)],
            w,
            false,
            &format!("num_stages = [{stages}]"),
        );
        assert!(d.variants[0].ptx_sm90a.as_str().contains("wgmma.mma_async"));
        let half = |r: &mut Rng, len: usize| {
            if exact {
                Data::Bf16(r.steps(len, 4.0).into_iter().map(bf16::from_f32).collect())
            } else if f16 {
                Data::F16(
                    r.vec(len, 1.0)
                        .into_iter()
                        .map(half::f16::from_f32)
                        .collect(),
                )
            } else {
                Data::Bf16(r.bf(len))
            }
        };
        let c = if exact {
            r.steps(m * n, 16.0)
        } else {
            r.vec(m * n, 1.0)
        };
        let data = gemm_args(
            half(&mut r, m * k),
            half(&mut r, k * n),
            Data::F32(c),
            (m, n, k),
        );
        let grid = tile_grid(m, n, bm, bn);
        let rtol = if exact { 0.0 } else { 1e-4 };
        diff("dot_wgmma_tiles", d, grid, &data, rtol);
    }
    // NT (an `[N, K]` weight: B staged K-major) and plain, 16-byte aligned.
    for (bm, bn, bk, w, m, n, k, b_t) in [
        (128, 128, 64, 4, 136, 200, 88, true),
        (128, 256, 64, 8, 136, 264, 72, true),
        (64, 64, 32, 4, 72, 40, 24, true),
        (128, 64, 64, 8, 200, 64, 200, false),
    ] {
        let d = def(
            &matmul_oriented(false, b_t, true),
            &[("BM", bm), ("BN", bn), ("BK", bk)],
            w,
        );
        assert!(d.variants[0].ptx_sm90a.as_str().contains("wgmma.mma_async"));
        let data = gemm_args(
            Data::Bf16(r.bf(m * k)),
            Data::Bf16(r.bf(k * n)),
            Data::F32(vec![f32::NAN; m * n]),
            (m, n, k),
        );
        let grid = tile_grid(m, n, bm, bn);
        diff("dot_wgmma_nt", d, grid, &data, 1e-4);
    }
}

/// The arguments of a GEMM test kernel `(a, b, c, m, n, k)`.
fn gemm_args(a: Data, b: Data, c: Data, (m, n, k): (usize, usize, usize)) -> [Data; 6] {
    [
        a,
        b,
        c,
        Data::S(Scalar::I32(m as i32)),
        Data::S(Scalar::I32(n as i32)),
        Data::S(Scalar::I32(k as i32)),
    ]
}

/// One program per `bm x bn` tile of an `m x n` output.
fn tile_grid(m: usize, n: usize, bm: i64, bn: i64) -> [u32; 3] {
    [
        m.div_ceil(bm as usize) as u32,
        n.div_ceil(bn as usize) as u32,
        1,
    ]
}

/// [`MATMUL_ORIENTED`] (row-major A and B, 16-byte alignment declared) storing `C` as
/// bf16: the accumulator leaves its MMA layout through shared memory for 16-byte stores.
pub(crate) fn matmul_bf16_out() -> String {
    matmul_oriented(false, false, true)
        .replace("c: Ptr<f32>", "c: Ptr<bf16>")
        .replace(", acc, cmask)", ", acc as bf16, cmask)")
}

#[test]
fn gpu_dot_bf16_store_through_shared_memory() {
    let mut r = Rng(71);
    // (BM, BN, BK, warps, M, N, K): `wgmma` tiles (on sm_90a) and `mma.sync` tiles, M
    // and N off the tile (masked rows and columns of the moved tile), K below one tile.
    for (bm, bn, bk, w, m, n, k) in [
        (128, 256, 64, 8, 136, 264, 72),
        (128, 128, 64, 8, 200, 136, 24),
        (64, 128, 64, 4, 72, 120, 136),
        (64, 64, 32, 4, 40, 72, 16),
    ] {
        let d = def(&matmul_bf16_out(), &[("BM", bm), ("BN", bn), ("BK", bk)], w);
        let data = gemm_args(
            Data::Bf16(r.bf(m * k)),
            Data::Bf16(r.bf(k * n)),
            Data::Bf16(vec![bf16::NAN; m * n]),
            (m, n, k),
        );
        let grid = tile_grid(m, n, bm, bn);
        // One bf16 rounding of sums taken in another order: within 2^-7 relative.
        diff("dot_bf16_store", d, grid, &data, 1.0 / 128.0);
    }
}

/// A K-loop GEMM whose operands come in either orientation: `A_OFFSETS` is
/// `rm.expand_dims(1) * k + rk.expand_dims(0)` for A stored `[M, K]` row-major (K
/// fastest) or `rk.expand_dims(0) * m + rm.expand_dims(1)` for A stored as `[K, M]`
/// (M fastest); `B_OFFSETS` is `rk.expand_dims(1) * n + rn.expand_dims(0)` for B stored
/// `[K, N]` or `rn.expand_dims(0) * k + rk.expand_dims(1)` for an `[N, K]` row-major
/// weight (K fastest, the "NT" GEMM). `MULT` becomes `#[multiple_of(8)]` (16-byte
/// vectors provable) or nothing (scalar accesses).
pub(crate) const MATMUL_ORIENTED: &str = r#"
fn mmo<const BM: usize, const BN: usize, const BK: usize>(
    a: Ptr<bf16>, b: Ptr<bf16>, c: Ptr<f32>, MULT m: i32, MULT n: i32, MULT k: i32,
) {
    let rm = program_id(0) * BM + arange(0, BM);
    let rn = program_id(1) * BN + arange(0, BN);
    let mut acc = zeros::<f32>([BM, BN]);
    for k0 in (0..k).step_by(BK) {
        let rk = k0 + arange(0, BK);
        let x = load(a + A_OFFSETS, (rm.expand_dims(1) < m) & (rk.expand_dims(0) < k), 0.0);
        let y = load(b + B_OFFSETS, (rk.expand_dims(1) < k) & (rn.expand_dims(0) < n), 0.0);
        acc = dot(x, y, acc);
    }
    let cmask = (rm.expand_dims(1) < m) & (rn.expand_dims(0) < n);
    store(c + rm.expand_dims(1) * n + rn.expand_dims(0), acc, cmask);
}
"#;

/// [`MATMUL_ORIENTED`] with A stored transposed (`[K, M]`) when `a_t`, B as an `[N, K]`
/// weight when `b_t`, and 16-byte alignment declared when `aligned`.
pub(crate) fn matmul_oriented(a_t: bool, b_t: bool, aligned: bool) -> String {
    let a = if a_t {
        "rk.expand_dims(0) * m + rm.expand_dims(1)"
    } else {
        "rm.expand_dims(1) * k + rk.expand_dims(0)"
    };
    let b = if b_t {
        "rn.expand_dims(0) * k + rk.expand_dims(1)"
    } else {
        "rk.expand_dims(1) * n + rn.expand_dims(0)"
    };
    MATMUL_ORIENTED
        .replace("A_OFFSETS", a)
        .replace("B_OFFSETS", b)
        .replace("MULT ", if aligned { "#[multiple_of(8)] " } else { "" })
}

/// `C = op(A) @ op(B)` on the host, in f32, from bf16 buffers stored as
/// [`matmul_oriented`] reads them.
pub(crate) fn host_matmul(
    a: &[bf16],
    b: &[bf16],
    (m, n, k): (usize, usize, usize),
    a_t: bool,
    b_t: bool,
) -> Vec<f32> {
    let mut c = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut s = 0f32;
            for l in 0..k {
                let x = if a_t { a[l * m + i] } else { a[i * k + l] };
                let y = if b_t { b[j * k + l] } else { b[l * n + j] };
                s += x.to_f32() * y.to_f32();
            }
            c[i * n + j] = s;
        }
    }
    c
}

#[test]
fn gpu_dot_operand_orientations() {
    let mut r = Rng(53);
    // (BM, BN, BK, warps, M, N, K, A transposed, B transposed, aligned): M, N, K not
    // multiples of the tile, K smaller than one tile; NT (the prefill weight case), TN,
    // TT; 16-byte vectors where provable and scalar accesses where not.
    let cases = [
        (64, 64, 32, 4, 72, 40, 24, false, true, true),
        (128, 128, 32, 8, 136, 200, 88, false, true, true),
        (64, 64, 32, 4, 100, 70, 45, false, true, false),
        (64, 32, 32, 4, 72, 48, 56, true, false, true),
        (32, 64, 16, 2, 40, 72, 8, true, true, true),
        (64, 64, 64, 4, 65, 33, 130, true, true, false),
    ];
    for (bm, bn, bk, w, m, n, k, a_t, b_t, aligned) in cases {
        let d = def(
            &matmul_oriented(a_t, b_t, aligned),
            &[("BM", bm), ("BN", bn), ("BK", bk)],
            w,
        );
        let (ha, hb) = (r.bf(m * k), r.bf(k * n));
        let data = gemm_args(
            Data::Bf16(ha.clone()),
            Data::Bf16(hb.clone()),
            Data::F32(vec![f32::NAN; m * n]),
            (m, n, k),
        );
        let grid = tile_grid(m, n, bm, bn);
        // The interpreter computes the oriented product the host does.
        let got = run_on(&crate::runtime::Device::cpu(), d, grid, &data);
        let Data::F32(c) = &got[2] else {
            unreachable!()
        };
        let want = host_matmul(&ha, &hb, (m, n, k), a_t, b_t);
        for (i, (g, h)) in c.iter().zip(&want).enumerate() {
            assert!((g - h).abs() <= 1e-3 + 1e-3 * h.abs(), "[{i}] {g} vs {h}");
        }
        diff("dot_operand_orientations", d, grid, &data, 1e-4);
    }
}

/// Loads a row-major `[R, C]` f32 tile and stores it transposed: the store's pointers
/// run along dim 0.
pub(crate) const TRANSPOSE_SRC: &str = r#"
fn transpose<const R: usize, const C: usize>(x: Ptr<f32>, out: Ptr<f32>) {
    let r = arange(0, R);
    let c = arange(0, C);
    let t = load(x + r.expand_dims(1) * C + c.expand_dims(0));
    store(out + c.expand_dims(0) * R + r.expand_dims(1), t * 2.0);
}
"#;

#[test]
fn gpu_transposing_store() {
    let mut r = Rng(59);
    let d = def(TRANSPOSE_SRC, &[("R", 64), ("C", 32)], 4);
    let data = [
        Data::F32(r.vec(64 * 32, 1.0)),
        Data::F32(vec![0.0; 64 * 32]),
    ];
    let got = run_on(&crate::runtime::Device::cpu(), d, [1, 1, 1], &data);
    let (Data::F32(x), Data::F32(t)) = (&data[0], &got[1]) else {
        unreachable!()
    };
    for i in 0..64 {
        for j in 0..32 {
            assert_eq!(t[j * 64 + i], 2.0 * x[i * 32 + j]);
        }
    }
    diff("transposing_store", d, [1, 1, 1], &data, 0.0);
}

/// Rows of `u32` words summed, the loop plain (`.stages(1)`) or staged two to four
/// deep, with or without a 4-byte side load a tile (a scale word every 64 words, as the
/// Q4_K GEMV's; `SIDE = 1`), or the words' load masked (`SIDE = 2`): GB/s against the copy ceiling, to see what staging costs or gains
/// apart from any kernel around it. `cargo test --release -p tilefuse-dsl --lib --
/// --ignored staged_stream_bandwidth --nocapture` on a GPU (docs/perf.md, "Loads staged
/// ahead").
#[test]
#[ignore = "a measurement: run by hand on a GPU"]
fn staged_stream_bandwidth() {
    use crate::runtime::timing::{copy_ceiling, time_events, TimingOptions};
    use crate::runtime::KernelArg;
    const SRC: &str = r#"
fn rowsum<const BN: usize, const BK: usize, const S: usize, const SIDE: usize>(w: Ptr<u32>, s: Ptr<u32>, y: Ptr<f32>, n: i32, #[multiple_of(1024)] k: i32) {
    let rows = program_id(0) * BN + arange(0, BN);
    let at = rows.expand_dims(1) * k;
    let mut tot = zeros::<f32>([BN]);
    for k0 in (0..k).step_by(BK).stages(S) {
        let c = (k0 + arange(0, BK)).expand_dims(0);
        let mut wt = load(w + at + c);
        if SIDE == 2 {
            wt = load(w + at + c, c < k);
        }
        let mut v = (wt & 255) as f32;
        if SIDE == 1 {
            v = v * (load(s + (at + c) / 64) & 7) as f32;
        }
        tot += v.sum(1);
    }
    store(y + rows, tot);
}
"#;
    struct Fail(String);
    impl From<crate::runtime::RuntimeError> for Fail {
        fn from(e: crate::runtime::RuntimeError) -> Fail {
            Fail(e.to_string())
        }
    }
    let Some(dev) = gpu_or_skip("staged_stream_bandwidth") else {
        return;
    };
    let (n, k) = (8192usize, 8192usize);
    let mut r = Rng(5);
    let w: Vec<u32> = r
        .vec(n * k, 1.0)
        .iter()
        .map(|v| (v.abs() * 1e5) as u32)
        .collect();
    let s: Vec<u32> = w.iter().step_by(64).map(|x| x >> 3).collect();
    let wb = dev.upload(&w).unwrap();
    let sb = dev.upload(&s).unwrap();
    let mut yb = dev.alloc_filled(n, f32::NAN).unwrap();
    let ceiling = copy_ceiling(&dev, 1 << 30, TimingOptions::default())
        .unwrap()
        .bytes_per_s();
    println!("copy ceiling {:.0} GB/s", ceiling / 1e9);
    for (bn, bk, warps) in [(16, 256, 4), (8, 512, 4), (16, 512, 8)] {
        for side in [0, 2, 1] {
            for stages in [1, 2, 3, 4] {
                let consts = [("BN", bn), ("BK", bk), ("S", stages), ("SIDE", side)];
                let d = def(SRC, &consts, warps);
                let grid = [(n / bn as usize) as u32, 1, 1];
                let stats = time_events(&dev, 20, TimingOptions::default(), |_| {
                    let mut args = [
                        KernelArg::read(&wb),
                        KernelArg::read(&sb),
                        KernelArg::write(&mut yb),
                        KernelArg::from(n as i32),
                        KernelArg::from(k as i32),
                    ];
                    d.launch_dyn(&dev, grid, &[bn, bk, stages, side], &mut args)
                        .map_err(|e| Fail(e.to_string()))
                })
                .unwrap_or_else(|e| panic!("{}", e.0));
                let bytes = (n * k * 4 + if side == 1 { n * k / 16 } else { 0 }) as u64;
                println!(
                    "{bn} x {bk}, {warps} warps, side {side}, stages {stages}: {:.2} us, {:.0} GB/s ({:.0}% of copy), {} B shared",
                    stats.median_us,
                    stats.gb_per_s(bytes),
                    100.0 * stats.bytes_per_s(bytes) / ceiling,
                    d.variants[0].shared_bytes
                );
            }
        }
    }
}

/// A loaded 1-D tile broadcast into a 3-D tile laid out by a `dot4` reduction, with one
/// row a program (the Q6_K GEMV's stored half sums, docs/perf.md "Stored block sums (not
/// kept)": that build's LM-head case differed from the interpreter on an H200 at 1 x 256
/// over 4 warps).
const SUMS_BROADCAST: &str = r#"
fn sums_broadcast<const BN: usize, const G: usize>(lt: Ptr<u32>, xs: Ptr<f32>, y: Ptr<i32>, s_out: Ptr<i32>) {
    let r = arange(0, BN);
    let g = arange(0, G);
    let p = arange(0, 2);
    let i = arange(0, 2);
    let rg = (r * (G * 4)).expand_dims(1) + (g * 4).expand_dims(0);
    let offs = rg.expand_dims(2).expand_dims(3) + (p * 2).expand_dims(1) + i;
    let t = load(lt + offs);
    let lo = t & 0x0F0F_0F0F;
    let d = dot4(lo, lo, 0).sum(3);
    let s = (d & 0) + (load(xs + g * 2) as i32).expand_dims(0).expand_dims(2);
    let out = (d - s * 16) * 3;
    let at = (r * (G * 2)).expand_dims(1).expand_dims(2) + (g * 2).expand_dims(0).expand_dims(2) + p.expand_dims(0).expand_dims(1);
    store(y + at, out);
    store(s_out + at, s);
}
"#;

#[test]
fn gpu_sums_broadcast() {
    let mut r = Rng(31);
    for (bn, g, warps) in [
        (1, 8, 4),
        (1, 8, 1),
        (2, 8, 4),
        (1, 32, 4),
        (4, 8, 4),
        (1, 4, 4),
    ] {
        let d = def(SUMS_BROADCAST, &[("BN", bn as i64), ("G", g as i64)], warps);
        let words: Vec<u32> = r
            .vec(bn * g * 4, 1.0)
            .iter()
            .map(|v| (v.abs() * 4e9) as u32)
            .collect();
        let sums: Vec<f32> = r
            .vec(g * 2, 1.0)
            .iter()
            .map(|v| (v * 1000.0).round())
            .collect();
        let data = [
            Data::U32(words),
            Data::F32(sums),
            Data::I32(vec![i32::MIN; bn * g * 2]),
            Data::I32(vec![i32::MIN; bn * g * 2]),
        ];
        diff("sums_broadcast", d, [1, 1, 1], &data, 0.0);
    }
}

const CONST_DIV: &str = r#"
fn const_div<const C: usize>(x: Ptr<i32>, out: Ptr<i32>, n: i32) {
    let i = program_id(0) * 128 + arange(0, 128);
    let ok = i < n;
    let v = load(x + i, ok, 0);
    let o = out + i * 11;
    store(o, v / C, ok);
    store(o + 1, v % C, ok);
    store(o + 2, ((v as u32) / (C as u32)).bitcast::<i32>(), ok);
    store(o + 3, ((v as u32) % (C as u32)).bitcast::<i32>(), ok);
    let w = (v as i64) * 3;
    store(o + 4, (w / (C as i64)) as i32, ok);
    store(o + 5, (w % (C as i64)) as i32, ok);
    store(o + 6, ((v as u8) / 8) as i32, ok);
    store(o + 7, ((v as u8) % 16) as i32, ok);
    store(o + 8, v / 3 + v % 6, ok);
    store(o + 9, ((v as u8) / 7) as i32, ok);
    store(o + 10, ((v as u8) % 10) as i32, ok);
}
"#;

/// Values an integer division by a constant must get right: signs, zero, the extremes,
/// multiples of the divisor and their neighbours, then seeded random ones.
fn division_inputs() -> Vec<i32> {
    let mut x = vec![
        0,
        1,
        -1,
        7,
        -7,
        8,
        -8,
        9,
        -9,
        i32::MAX,
        i32::MIN,
        i32::MIN + 1,
    ];
    for k in [1, 2, 3, 6, 10, 20, 30] {
        for d in [-1, 0, 1] {
            x.push((1i32 << k) + d);
            x.push(-(1i32 << k) + d);
        }
    }
    let mut r = Rng(41);
    while x.len() < 300 {
        x.push((r.f() * 2.0e9) as i32);
    }
    x
}

/// Integer `/` and `%` by a constant (a power of two as shifts and masks,
/// `Emitter::by_power_of_two`; any other as a multiply by a magic number,
/// `Emitter::by_magic_number`) on the GPU against the interpreter, over i32, u32, i64
/// and u8, for divisors 1 to 2^30 + 1.
#[test]
fn gpu_division_by_constants() {
    for (c, d, grid, data) in division_cases() {
        diff(&format!("const_div C={c}"), d, grid, &data, 0.0);
    }
}

/// The divisors of [`division_cases`]: powers of two, and others whose multipliers take
/// each form (7: the signed and the unsigned add; 641: the unsigned add alone).
const DIVISORS: [i64; 11] = [
    1,
    2,
    3,
    7,
    8,
    12,
    64,
    641,
    1_000_003,
    1 << 30,
    (1 << 30) + 1,
];

/// `CONST_DIV` at each divisor tested, its grid and its buffers (outputs poisoned).
fn division_cases() -> Vec<(i64, &'static KernelDef, [u32; 3], [Data; 3])> {
    let x = division_inputs();
    let n = x.len();
    DIVISORS
        .into_iter()
        .map(|c| {
            let data = [
                Data::I32(x.clone()),
                Data::I32(vec![i32::MIN; 11 * n]),
                Data::S(Scalar::I32(n as i32)),
            ];
            (
                c,
                def(CONST_DIV, &[("C", c)], 4),
                [n.div_ceil(128) as u32, 1, 1],
                data,
            )
        })
        .collect()
}

/// The interpreter's `/` and `%` (the reference semantics the shifts and multiplies must
/// reproduce):
/// Rust's, truncating toward zero, for the same kernel and inputs.
#[test]
fn the_interpreter_divides_integers_as_rust_does() {
    let x = division_inputs();
    for (c, d, grid, data) in division_cases() {
        let got = run_on(&Device::cpu(), d, grid, &data);
        let Data::I32(out) = &got[1] else {
            panic!("unexpected buffer kind")
        };
        let c32 = c as i32;
        for (j, &v) in x.iter().enumerate() {
            let w = v as i64 * 3;
            let want = [
                v / c32,
                v % c32,
                ((v as u32) / (c as u32)) as i32,
                ((v as u32) % (c as u32)) as i32,
                (w / c) as i32,
                (w % c) as i32,
                ((v as u8) / 8) as i32,
                ((v as u8) % 16) as i32,
                v / 3 + v % 6,
                ((v as u8) / 7) as i32,
                ((v as u8) % 10) as i32,
            ];
            assert_eq!(out[11 * j..11 * j + 11], want, "x = {v}, C = {c}");
        }
    }
}

/// The code those divisions become: no `div`/`rem` instruction for any divisor but 1
/// (the `/ 3` and `% 6` beside them included), and a high multiply exactly where a
/// divisor is not a power of two (no GPU needed). ptxas turns a `div.s32` by 12 into
/// about 20 instructions around a float reciprocal (`back/ptx/magic.rs`).
#[test]
fn division_by_a_constant_is_a_multiply() {
    for c in DIVISORS.into_iter().filter(|&c| c > 1) {
        let d = def(CONST_DIV, &[("C", c)], 4);
        for ptx in [
            d.variants[0].ptx_sm80.as_str(),
            d.variants[0].ptx_sm90.as_str(),
        ] {
            let divisions = ptx
                .lines()
                .filter(|l| {
                    l.trim_start().starts_with("div.") || l.trim_start().starts_with("rem.")
                })
                .collect::<Vec<_>>();
            assert!(divisions.is_empty(), "C = {c}: {divisions:?}");
            let high = |t: &str| {
                ptx.lines()
                    .any(|l| l.trim_start().starts_with(&format!("mul.hi.{t}")))
            };
            // The fixed `/ 3`, `% 6` (i32) and `/ 7`, `% 10` (u8) always multiply.
            assert!(high("s32") && high("u32"), "C = {c}");
            assert_eq!(high("s64"), c.count_ones() != 1, "C = {c}: i64 `/ C`");
        }
    }
}

const TRUE_MASKS: &str = r#"
fn true_masks<const B: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let i = program_id(0) * B + arange(0, B);
    let always = full([B], true) & (full([B], true) | (i < n));
    let v = load(x + i, always, 1.0);
    store(out + i, v * 2.0, always);
    store(out + B * num_programs(0) + i, v, i < n);
}
"#;

/// A mask that is `true` by construction (`full(.., true)`, `&` of two, `|` with one)
/// takes no predicate: the load and the first store are unpredicated in the PTX, the
/// masked store keeps its predicate; on the GPU the results equal the interpreter's.
#[test]
fn constant_true_masks_take_no_predicate() {
    let d = def(TRUE_MASKS, &[("B", 128)], 4);
    let ptx = d.variants[0].ptx_sm90.as_str();
    let predicated = |op: &str| {
        ptx.lines()
            .filter(|l| l.contains(op))
            .filter(|l| l.trim_start().starts_with('@'))
            .count()
    };
    assert_eq!(predicated("ld.global"), 0, "{ptx}");
    assert!(
        predicated("st.global") > 0,
        "the `i < n` store keeps its mask"
    );
    let mut r = Rng(43);
    let n = 256;
    let data = [
        Data::F32(r.vec(n, 1.0)),
        Data::F32(vec![f32::NAN; 2 * n]),
        Data::S(Scalar::I32(n as i32)),
    ];
    diff("true_masks", d, [2, 1, 1], &data, 0.0);
}

const BYTE_PAIRS: &str = r#"
fn byte_pairs<const B: usize>(s: Ptr<u8>, h: Ptr<f16>, quad_out: Ptr<f32>, pair_out: Ptr<f32>, n: i32, #[multiple_of(32)] k: i32) {
    let rows = program_id(0) * B + arange(0, B);
    let ok = (rows < n).expand_dims(1);
    let two = arange(0, 2).expand_dims(0);
    let four = arange(0, 4).expand_dims(0);
    // Quads and pairs of bytes, masked by row, with a fill value past `n`.
    let quads = load(s + (rows * 4).expand_dims(1) + four, ok, 9);
    store(quad_out + (rows * 4).expand_dims(1) + four, quads as f32);
    let pairs = load(s + 2048 + (rows * 2).expand_dims(1) + two, ok, 7);
    // Halves in pairs at `(k / 4) * 2`-element rows: aligned only because `k / 4` is even.
    let at = (rows * (k / 4)).expand_dims(1) + ((rows % 4) * 2).expand_dims(1) + two;
    let halves = load(h + at, ok, 0.5);
    store(pair_out + (rows * 2).expand_dims(1) + two, (pairs as f32) * 1000.0 + (halves as f32));
}
"#;

/// Loads of `u8` quads and pairs take `.v4.u8` / `.v2.u8` vectors, and f16 pairs whose
/// offsets are aligned through an exact division (`k / 4` with `k` a multiple of 32)
/// one 32-bit word; masked lanes take the fill value; the GPU equals the interpreter.
#[test]
fn byte_pairs_load_as_vectors() {
    let d = def(BYTE_PAIRS, &[("B", 128)], 4);
    let ptx = d.variants[0].ptx_sm90.as_str();
    let loads = |ty: &str| {
        ptx.lines()
            .filter(|l| l.contains("ld.global") && l.contains(ty))
            .count()
    };
    assert!(loads(".v2.u8") > 0 && loads(".v4.u8") > 0, "{ptx}");
    assert_eq!(
        loads(".u8 "),
        loads(".v2.u8 ") + loads(".v4.u8 "),
        "no single-byte loads: {ptx}"
    );
    assert!(
        loads(".b32") > 0 && loads(".b16") == 0,
        "f16 pairs as one word: {ptx}"
    );
    let mut r = Rng(47);
    let (n, k) = (200usize, 64i32);
    let bytes: Vec<u8> = (0..4096).map(|_| ((r.f() + 1.0) * 127.9) as u8).collect();
    let halves: Vec<f16> = r
        .vec(256 * k as usize / 4 + 8, 4.0)
        .into_iter()
        .map(f16::from_f32)
        .collect();
    let data = [
        Data::U8(bytes),
        Data::F16(halves),
        Data::F32(vec![f32::NAN; 4 * 256]),
        Data::F32(vec![f32::NAN; 2 * 256]),
        Data::S(Scalar::I32(n as i32)),
        Data::S(Scalar::I32(k)),
    ];
    diff("byte_pairs", d, [2, 1, 1], &data, 0.0);
}
