//! Language features through the macros: `#[tile_fn]` helpers, dtype-generic kernels,
//! the run-time pick of a constant, `while`, the argmax padding trap and the
//! interpreter's out-of-bounds report; checked against host references on the
//! interpreter and, when one is present, the GPU (the same IR runs on both).

use half::bf16;
use tilefuse_dsl::runtime::{Device, LaunchError};
use tilefuse_macros::{kernel, tile_fn};

/// Helpers in another module: `silu` calls `sig`, which the kernel's module never
/// imports (a helper's own calls resolve where the helper is written).
mod act {
    use tilefuse_macros::tile_fn;

    #[tile_fn(crate = tilefuse_dsl)]
    fn sig(x: Tile<f32>) -> Tile<f32> {
        1.0 / (1.0 + exp(-x))
    }

    /// `x * sigmoid(x)`.
    #[tile_fn(crate = tilefuse_dsl)]
    pub fn silu(x: Tile<f32>) -> Tile<f32> {
        x * sig(x)
    }

    /// The sum of `x`'s first `N` lanes scaled by `s`, as a scalar: a const generic.
    #[tile_fn(crate = tilefuse_dsl)]
    pub fn head_sum<const N: usize>(x: Tile<f32>, s: f32) -> f32 {
        let lanes = arange(0, N);
        select(lanes < 4, x, 0.0).sum(0) * s
    }
}

use act::silu;

/// A helper that returns nothing: it stores (and loops, with a carried variable).
#[tile_fn(crate = tilefuse_dsl)]
fn store_powers(out: Ptr<f32>, offs: Tile<i32>, mask: Tile<bool>, v: Tile<f32>, k: i32) {
    let mut p = v;
    for _i in 0..k {
        p = p * v;
    }
    store(out + offs, p, mask);
}

/// `y = silu(x)`, `z = x^(k+1)`, `head[pid] = 0.5 * sum of the block's first 4 silu values`.
#[kernel(crate = tilefuse_dsl, BLOCK = [32, 128], num_warps = [1, 4])]
fn fused<const BLOCK: usize>(
    x: Ptr<f32>,
    y: Ptr<f32>,
    z: Ptr<f32>,
    head: Ptr<f32>,
    n: i32,
    k: i32,
) {
    let offs = program_id(0) * BLOCK + arange(0, BLOCK);
    let mask = offs < n;
    let v = load(x + offs, mask, 0.0);
    let s = silu(v);
    store(y + offs, s, mask);
    store_powers(z, offs, mask, v, k);
    store(head + program_id(0), act::head_sum::<BLOCK>(s, 0.5));
}

fn devices() -> Vec<Device> {
    let mut devs = vec![Device::cpu()];
    if let Some(gpu) = tilefuse_dsl::runtime::testing::gpu_or_skip("language") {
        devs.push(gpu);
    }
    devs
}

/// A seeded stream of values in [-3, 3).
fn inputs(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 6.0 - 3.0
        })
        .collect()
}

fn close(a: f32, b: f32) -> bool {
    (a - b).abs() <= 1e-5 * (1.0 + b.abs())
}

#[test]
fn helpers_inline_across_modules_on_every_device() {
    for dev in devices() {
        for n in [1usize, 77, 300] {
            let host = inputs(n, n as u64);
            let x = dev.upload(&host).unwrap();
            let k = 2;
            let silu_ref: Vec<f32> = host.iter().map(|v| v / (1.0 + (-v).exp())).collect();
            for (block, warps) in [(32usize, 1u32), (128, 4)] {
                let grid = n.div_ceil(block);
                let mut y = dev.alloc_filled(n, f32::NAN).unwrap();
                let mut z = dev.alloc_filled(n, f32::NAN).unwrap();
                let mut head = dev.alloc_filled(grid, f32::NAN).unwrap();
                let cfg = tilefuse_dsl::runtime::LaunchConfig::from(grid as u32).num_warps(warps);
                let r = if block == 32 {
                    fused::<32>::launch(&dev, cfg, &x, &mut y, &mut z, &mut head, n as i32, k)
                } else {
                    fused::<128>::launch(&dev, cfg, &x, &mut y, &mut z, &mut head, n as i32, k)
                };
                r.unwrap();
                let (y, z, head) = (
                    y.to_vec().unwrap(),
                    z.to_vec().unwrap(),
                    head.to_vec().unwrap(),
                );
                for i in 0..n {
                    assert!(
                        close(y[i], silu_ref[i]),
                        "{dev:?} silu[{i}]: {} vs {}",
                        y[i],
                        silu_ref[i]
                    );
                    let p = host[i].powi(k + 1);
                    assert!(close(z[i], p), "{dev:?} pow[{i}]: {} vs {p}", z[i]);
                }
                for (b, h) in head.iter().enumerate() {
                    let want: f32 = (0..4)
                        .map(|l| b * block + l)
                        .filter(|&i| i < n)
                        .map(|i| silu_ref[i])
                        .sum::<f32>()
                        * 0.5;
                    assert!(close(*h, want), "{dev:?} head[{b}]: {h} vs {want}");
                }
            }
        }
    }
}

#[test]
fn the_embedded_source_carries_the_helpers() {
    // The interpreter recompiles from this text: the kernel, then every helper it
    // reaches, each once.
    let src: String = FUSED.source.split_whitespace().collect();
    for name in [
        "fnfused<",
        "fnsilu(",
        "fnsig(",
        "fnhead_sum<",
        "fnstore_powers(",
    ] {
        assert_eq!(src.matches(name).count(), 1, "{name} in {src}");
    }
}

/// `out = x * 2 + 1` in `T`, computed in f32: one kernel per listed dtype.
#[kernel(crate = tilefuse_dsl, T = [f32, bf16], BLOCK = [64, 256], num_warps = [2])]
fn affine<T, const BLOCK: usize>(x: Ptr<T>, out: Ptr<T>, n: i32) {
    let offs = program_id(0) * BLOCK + arange(0, BLOCK);
    let mask = offs < n;
    let v = load(x + offs, mask, 0.0 as T) as f32;
    store(out + offs, (v * 2.0 + 1.0) as T, mask);
}

#[test]
fn dtype_generic_kernels_compile_one_variant_per_dtype() {
    assert_eq!(AFFINE_F32.variants.len(), 2);
    assert_eq!(AFFINE_BF16.variants.len(), 2);
    for dev in devices() {
        let n = 200;
        let host = inputs(n, 7);
        let x = dev.upload(&host).unwrap();
        let mut out = dev.alloc_filled(n, f32::NAN).unwrap();
        affine::<f32, 64>::launch(&dev, 4u32, &x, &mut out, n as i32).unwrap();
        let got = out.to_vec().unwrap();
        for i in 0..n {
            assert!(close(got[i], host[i] * 2.0 + 1.0), "{dev:?} f32[{i}]");
        }
        let hb: Vec<bf16> = host.iter().map(|v| bf16::from_f32(*v)).collect();
        let xb = dev.upload(&hb).unwrap();
        let mut ob = dev.alloc_filled(n, bf16::NAN).unwrap();
        affine::<bf16, 256>::launch(&dev, 1u32, &xb, &mut ob, n as i32).unwrap();
        let got = ob.to_vec().unwrap();
        for i in 0..n {
            let want = bf16::from_f32(hb[i].to_f32() * 2.0 + 1.0);
            assert_eq!(got[i], want, "{dev:?} bf16[{i}]");
        }
    }
}

/// Sums a row of `n` values in one program (`n` at most `BLOCK`).
#[kernel(crate = tilefuse_dsl, BLOCK = [32, 128, 512], num_warps = [4])]
fn row_sum<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let offs = arange(0, BLOCK);
    store(out, load(x + offs, offs < n, 0.0).sum(0));
}

#[test]
fn pick_chooses_the_smallest_compiled_block_that_fits() {
    assert_eq!(row_sum::pick_block(1).unwrap(), 32);
    assert_eq!(row_sum::pick_block(32).unwrap(), 32);
    assert_eq!(row_sum::pick_block(33).unwrap(), 128);
    assert_eq!(row_sum::pick_block(512).unwrap(), 512);
    let err = row_sum::pick_block(513).unwrap_err();
    assert!(matches!(err, LaunchError::NoFit { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("[32, 128, 512]") && msg.contains("513"),
        "{msg}"
    );
    for dev in devices() {
        for n in [5usize, 100, 400] {
            let host = inputs(n, 3);
            let x = dev.upload(&host).unwrap();
            let mut out = dev.alloc_filled(1, f32::NAN).unwrap();
            let block = row_sum::pick_block(n).unwrap();
            row_sum::launch_at(&dev, 1u32, [block], &x, &mut out, n as i32).unwrap();
            let want: f32 = host.iter().sum();
            let got = out.to_vec().unwrap()[0];
            assert!(
                (got - want).abs() < 1e-4 * (1.0 + want.abs()),
                "{dev:?} n={n}: {got} vs {want}"
            );
        }
        let x = dev.upload(&[1.0f32]).unwrap();
        let mut out = dev.alloc_filled(1, f32::NAN).unwrap();
        let err = row_sum::launch_at(&dev, 1u32, [64], &x, &mut out, 1).unwrap_err();
        assert!(err.to_string().contains("BLOCK=512"), "{err}");
    }
}

/// `while` with a run-time condition: Collatz steps of each program's value (a scalar
/// carried), and a masked column sum over a run-time number of row blocks (an f32 tile
/// and a bf16 tile carried, the latter packed across the back edge on the GPU).
#[kernel(crate = tilefuse_dsl, B = [64], num_warps = [2])]
fn while_loops<const B: usize>(
    x: Ptr<i32>,
    steps: Ptr<i32>,
    m: Ptr<f32>,
    sums: Ptr<f32>,
    counts: Ptr<bf16>,
    rows: i32,
) {
    let pid = program_id(0);
    let mut v = load(x + pid);
    let mut n = 0;
    while v > 1 {
        v = select(v % 2 == 0, v / 2, 3 * v + 1);
        n += 1;
    }
    store(steps + pid, n);
    let cols = arange(0, B);
    let mut acc = zeros::<f32>([B]);
    let mut seen = zeros::<bf16>([B]);
    let mut r = 0;
    while r < rows {
        acc = acc + load(m + r * B + cols);
        seen = seen + (1.0 as bf16);
        r += 1;
    }
    store(sums + pid * B + cols, acc);
    store(counts + pid * B + cols, seen);
}

#[test]
fn while_loops_match_the_host_on_every_device() {
    let xs: Vec<i32> = vec![1, 2, 3, 6, 7, 27, 97, 871];
    let collatz = |mut v: i32| {
        let mut n = 0;
        while v > 1 {
            v = if v % 2 == 0 { v / 2 } else { 3 * v + 1 };
            n += 1;
        }
        n
    };
    for dev in devices() {
        for rows in [0usize, 1, 5] {
            let b = 64;
            let m_host = inputs(rows.max(1) * b, rows as u64 + 11);
            let x = dev.upload(&xs).unwrap();
            let m = dev.upload(&m_host).unwrap();
            let p = xs.len();
            let mut steps = dev.alloc_filled(p, -1i32).unwrap();
            let mut sums = dev.alloc_filled(p * b, f32::NAN).unwrap();
            let mut counts = dev.alloc_filled(p * b, bf16::NAN).unwrap();
            while_loops::<64>::launch(
                &dev,
                p as u32,
                &x,
                &mut steps,
                &m,
                &mut sums,
                &mut counts,
                rows as i32,
            )
            .unwrap();
            let want: Vec<i32> = xs.iter().map(|&v| collatz(v)).collect();
            assert_eq!(steps.to_vec().unwrap(), want, "{dev:?}");
            let sums = sums.to_vec().unwrap();
            let counts = counts.to_vec().unwrap();
            for pid in 0..p {
                for c in 0..b {
                    let mut want = 0.0f32;
                    for r in 0..rows {
                        want += m_host[r * b + c];
                    }
                    assert!(
                        close(sums[pid * b + c], want),
                        "{dev:?} rows={rows} col {c}"
                    );
                    assert_eq!(counts[pid * b + c].to_f32(), rows as f32, "{dev:?}");
                }
            }
        }
    }
}

/// Row argmax of `rows x n` values, padded to `B` lanes with `pad`.
#[kernel(crate = tilefuse_dsl, B = [32], num_warps = [1])]
fn row_argmax<const B: usize>(x: Ptr<f32>, out: Ptr<i32>, n: i32, pad: f32) {
    let row = program_id(0);
    let cols = arange(0, B);
    let v = load(x + row * n + cols, cols < n, pad);
    store(out + row, v.argmax(0));
}

#[test]
fn argmax_of_an_all_nan_row_padded_with_neg_inf_is_a_masked_lane() {
    // docs/language.md, "The argmax padding trap": NaN is never chosen unless every
    // lane is NaN, so -inf padding beats an all-NaN row and the index is `n`, a lane
    // that was masked off. Padding with NaN keeps the row all-NaN: index 0.
    let n = 5usize;
    let mut host = vec![f32::NAN; 2 * n];
    host[n + 3] = 7.0;
    for dev in devices() {
        let x = dev.upload(&host).unwrap();
        let mut out = dev.alloc_filled(2, -1i32).unwrap();
        row_argmax::<32>::launch(&dev, 2u32, &x, &mut out, n as i32, f32::NEG_INFINITY).unwrap();
        assert_eq!(
            out.to_vec().unwrap(),
            vec![n as i32, 3],
            "{dev:?} -inf padding"
        );
        row_argmax::<32>::launch(&dev, 2u32, &x, &mut out, n as i32, f32::NAN).unwrap();
        assert_eq!(out.to_vec().unwrap(), vec![0, 3], "{dev:?} NaN padding");
    }
}

/// Reads `x[offs]` unmasked: out of bounds when `n` exceeds the buffer.
#[kernel(crate = tilefuse_dsl, B = [16], num_warps = [1])]
fn unmasked_copy<const B: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let offs = arange(0, B);
    let in_row = load(x + offs, offs < n);
    store(out + offs, in_row, offs < n);
}

#[test]
fn the_interpreter_names_the_statement_that_went_out_of_bounds() {
    let dev = Device::cpu();
    let x = dev.upload(&[1.0f32; 8]).unwrap();
    let mut out = dev.alloc_filled(16, 0.0f32).unwrap();
    unmasked_copy::<16>::launch(&dev, 1u32, &x, &mut out, 8).unwrap();
    let err = unmasked_copy::<16>::launch(&dev, 1u32, &x, &mut out, 12)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("out of bounds")
            && err.contains("`x`")
            && err.contains("load(x + offs, offs < n)"),
        "{err}"
    );
    assert!(!err.contains('%'), "an IR value name leaked: {err}");
}

#[test]
fn helpers_work_inside_a_function_body() {
    // As in doctests: helper and kernel are items of a block, not of a module.
    #[tile_fn(crate = tilefuse_dsl)]
    fn twice(x: Tile<f32>) -> Tile<f32> {
        x * 2.0
    }
    #[kernel(crate = tilefuse_dsl, num_warps = [1])]
    fn doubled(x: Ptr<f32>) {
        store(x, twice(load(x)));
    }
    for dev in devices() {
        let mut x = dev.upload(&[1.5f32]).unwrap();
        doubled::launch(&dev, 1u32, &mut x).unwrap();
        assert_eq!(x.to_vec().unwrap(), vec![3.0], "{dev:?}");
    }
}

/// Triton's tutorial row copy with its stride `n` undeclared: `#[kernel]` embeds a form
/// that assumes `n` a multiple of 16 (16-byte accesses) beside the one that assumes
/// nothing, and `rows` (a bound on whole rows) is left out of the assumption.
#[kernel(crate = tilefuse_dsl, BLOCK = [256], num_warps = [4])]
fn scaled_rows<const BLOCK: usize>(x: Ptr<bf16>, y: Ptr<bf16>, rows: i32, n: i32, s: f32) {
    let r = program_id(0) * 4 + arange(0, 4);
    let c = arange(0, BLOCK);
    let offs = r.expand_dims(1) * n + c.expand_dims(0);
    let mask = (r < rows).expand_dims(1) & (c < n).expand_dims(0);
    let v = load(x + offs, mask, 0.0) as f32 * s;
    store(y + offs, v as bf16, mask);
}

#[test]
fn the_divisible_form_is_embedded_and_launched_when_the_stride_divides() {
    let plain = &SCALED_ROWS.variants[0];
    let form = plain.divisible_form.expect("a divisible form for `n`");
    assert_eq!(plain.assumes_divisible, 0);
    assert_eq!(
        form.assumes_divisible,
        1 << 3,
        "only `n` (parameter 3) is assumed"
    );
    assert!(form.divisible_form.is_none());
    // What the form is for: 16-byte loads and stores, where the plain form has none.
    let wide = |ptx: &str| ptx.lines().filter(|l| l.contains(".v4.b32")).count();
    assert_eq!(wide(plain.ptx_sm90.as_str()), 0);
    assert!(
        wide(form.ptx_sm90.as_str()) >= 2,
        "{}",
        form.ptx_sm90.as_str()
    );

    // Both forms compute the same rows on every device: strides that divide by 16 (the
    // divisible form) and strides that do not (the plain one), rows off the tile.
    for dev in devices() {
        for (rows, n) in [(7usize, 256usize), (9, 240), (5, 250), (3, 17)] {
            let host: Vec<bf16> = inputs(rows * n, (rows * n) as u64)
                .iter()
                .map(|&v| bf16::from_f32(v))
                .collect();
            let x = dev.upload(&host).unwrap();
            let mut y = dev
                .alloc_filled(rows * n, bf16::from_f32(f32::NAN))
                .unwrap();
            scaled_rows::<256>::launch(
                &dev,
                rows.div_ceil(4) as u32,
                &x,
                &mut y,
                rows as i32,
                n as i32,
                0.5,
            )
            .unwrap();
            let got = y.to_vec().unwrap();
            for (i, (g, h)) in got.iter().zip(&host).enumerate() {
                let want = bf16::from_f32(h.to_f32() * 0.5);
                assert_eq!(
                    g.to_bits(),
                    want.to_bits(),
                    "{dev:?} rows {rows} n {n} at {i}"
                );
            }
        }
    }
}

/// A block's sum and its values scaled by `s`: two results, one tuple.
#[tile_fn(crate = tilefuse_dsl)]
fn sum_and_scaled(v: Tile<f32>, s: f32) -> (f32, Tile<f32>) {
    (v.sum(0), v * s)
}

/// One step of `(a, b) -> (b, a + b)`.
#[tile_fn(crate = tilefuse_dsl)]
fn fib_step(a: Tile<f32>, b: Tile<f32>) -> (Tile<f32>, Tile<f32>) {
    (b, a + b)
}

/// `y = a_k` of the recurrence `a_0 = x`, `b_0 = x / 2`, `(a, b) -> (b, a + b)`, plus
/// the block's sum of `x` scaled by `s`; `sums[pid]` = that sum.
#[kernel(crate = tilefuse_dsl, BLOCK = [64], num_warps = [2])]
fn tuples<const BLOCK: usize>(x: Ptr<f32>, y: Ptr<f32>, sums: Ptr<f32>, n: i32, k: i32, s: f32) {
    let offs = program_id(0) * BLOCK + arange(0, BLOCK);
    let mask = offs < n;
    let v = load(x + offs, mask, 0.0);
    let (total, scaled) = sum_and_scaled(v, s);
    let (mut a, mut b) = (v, v * 0.5);
    for _i in 0..k {
        (a, b) = fib_step(a, b);
    }
    // In a branch and a `while`, the assigned names merge and carry as in `for`.
    if k > 3 {
        (b, a) = fib_step(b, a);
    }
    let mut j = 0;
    while j < 2 {
        (a, _, j) = (a + 1.0, b, j + 1);
    }
    store(y + offs, a + scaled, mask);
    store(sums + program_id(0), total);
}

#[test]
fn tuple_results_of_helpers_match_the_host_on_every_device() {
    for dev in devices() {
        let _turn = dev.is_cuda().then(tilefuse_dsl::runtime::testing::gpu_turn);
        let n = 150usize;
        let host = inputs(n, 9);
        let (k, s) = (5, 0.25f32);
        let grid = n.div_ceil(64);
        let x = dev.upload(&host).unwrap();
        let mut y = dev.alloc_filled(n, f32::NAN).unwrap();
        let mut sums = dev.alloc_filled(grid, f32::NAN).unwrap();
        let cfg = tilefuse_dsl::runtime::LaunchConfig::from(grid as u32).num_warps(2);
        tuples::launch(&dev, cfg, &x, &mut y, &mut sums, n as i32, k, s).unwrap();
        let (y, sums) = (y.to_vec().unwrap(), sums.to_vec().unwrap());
        for (i, &v) in host.iter().enumerate() {
            let (mut a, mut b) = (v, v * 0.5);
            for _ in 0..k {
                (a, b) = (b, a + b);
            }
            if k > 3 {
                a += b; // fib_step(b, a) = (a, b + a), written to (b, a)
            }
            let want = a + 2.0 + v * s;
            assert!(close(y[i], want), "{dev:?} y[{i}]: {} vs {want}", y[i]);
        }
        for (p, got) in sums.iter().enumerate() {
            let want: f32 = host[p * 64..((p + 1) * 64).min(n)].iter().sum();
            assert!(
                (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                "{dev:?} sums[{p}]: {got} vs {want}"
            );
        }
    }
}

/// Two pointers and a value a tuple: pointers, floats and integers mix in one.
#[tile_fn(crate = tilefuse_dsl)]
fn targets(base: Ptr<f32>, v: f32) -> (Ptr<f32>, Ptr<f32>, f32, i32) {
    (base, base + 1, v, 10)
}

/// Triton's `test_tuple.py::test_assign`: values taken apart from a tuple and stored,
/// then a tuple built with a literal in the middle, `(x0, 10, x1)`, stored in order.
#[kernel(crate = tilefuse_dsl, num_warps = [1])]
fn tuple_assign(x: Ptr<f32>, y: Ptr<f32>, x0: f32, x1: f32) {
    let (p0, p1, v0, _) = targets(x, x0);
    store(p0, v0);
    store(p1, x1);
    let (y0, y1, y2) = (y, y + 1, y + 2);
    let (a, b, c) = (x0, 10, x1);
    store(y0, a);
    store(y1, b as f32);
    store(y2, c);
}

#[test]
fn tuple_assignment_follows_tritons_test_assign() {
    for dev in devices() {
        let _turn = dev.is_cuda().then(tilefuse_dsl::runtime::testing::gpu_turn);
        let mut x = dev.alloc_filled(2, f32::NAN).unwrap();
        let mut y = dev.alloc_filled(3, f32::NAN).unwrap();
        tuple_assign::launch(&dev, 1u32, &mut x, &mut y, 2.0, 3.0).unwrap();
        assert_eq!(x.to_vec().unwrap(), vec![2.0, 3.0], "{dev:?}");
        assert_eq!(y.to_vec().unwrap(), vec![2.0, 10.0, 3.0], "{dev:?}");
    }
}
