//! The kernel language's ops, one documented item each.
//!
//! Tile ops are not Rust functions: `#[kernel]` compiles the kernel body itself (see
//! `docs/language.md`). This module exists so that every op has a rustdoc page with its
//! meaning and an example. **Its items are only meaningful inside `#[kernel]`**: [`Tile`]
//! and [`Ptr`] have no values, so the methods and operators here cannot be called from
//! ordinary Rust, and the few free functions that take no tile ([`program_id`],
//! [`num_programs`], [`global_timer`], [`sm_id`], [`arange`], [`zeros`], [`full`]) panic with
//! "only meaningful inside #\[kernel\]". Kernels never import this module: inside
//! `#[kernel]` the names are the language's own.
//!
//! In the signatures, `Tile<T>` stands for a tile *or a scalar* of element type `T` (a
//! scalar is a rank-0 tile, and scalars broadcast), and `Ptr<T>` for a pointer parameter
//! or a tile of pointers. Elementwise ops broadcast NumPy-style; operand dtypes must match
//! (convert with `as`), and literals adapt to the other operand.
//!
//! | Triton | tilefuse | item |
//! |---|---|---|
//! | `tl.program_id`, `tl.num_programs` | `program_id(0)`, `num_programs(0)` | [`program_id`], [`num_programs`] |
//! | `tl.arange` | `arange(0, BLOCK)` | [`arange`] |
//! | `tl.zeros`, `tl.full` | `zeros::<f32>([M, N])`, `full([M, N], v)` | [`zeros`], [`full`] |
//! | `tl.broadcast_to`, `x[:, None]` | `broadcast_to(x, [M, N])`, `x.expand_dims(1)` | [`broadcast_to`], [`Tile::expand_dims`] |
//! | `x_ptr + offs` | `x + offs` | [`Ptr`] (`Add`) |
//! | `tl.load`, `tl.store` | `load(p, mask, other)`, `store(p, v, mask)` | [`load`], [`store`] |
//! | `+ - * / %`, `& \| ^ << >>`, unary `-`, `~` | the same, `!` for `~` | [`Tile`]'s operator impls |
//! | `== != < <= > >=` | the same | [`Tile`] ("Comparisons") |
//! | `tl.where` | `select(c, a, b)` | [`select`] |
//! | `tl.exp` .. `tl.math.tanh` | `exp(x)` or `x.exp()`, .. | [`exp`], [`exp2`], [`log`], [`log2`], [`sqrt`], [`rsqrt`], [`sin`], [`cos`], [`abs`], [`sigmoid`], [`tanh`], [`floor`], [`ceil`] |
//! | `tl.maximum`, `tl.minimum` | `maximum(a, b)`, `minimum(a, b)` | [`maximum`], [`minimum`] |
//! | `x.to(tl.float32)` | `x as f32` | [`Tile`] ("Casts") |
//! | `x.to(tl.float32, bitcast=True)` | `x.bitcast::<f32>()` | [`Tile::bitcast`] |
//! | `tl.sum`, `tl.max`, `tl.min`, `tl.argmax` | `x.sum(1)`, `x.max(1)`, `x.min(1)`, `x.argmax(1)` | [`Tile::sum`], [`Tile::max`], [`Tile::min`], [`Tile::argmax`] |
//! | `tl.dot` | `dot(a, b)`, `dot(a, b, acc)` | [`dot`] |
//! | (CUDA's `__dp4a`) | `dot4(a, b, acc)` | [`dot4`] |
//! | `tl.atomic_add`, `tl.atomic_max` | `atomic_add(p, v, mask)`, `atomic_max(p, v, mask)` | [`atomic_add`], [`atomic_max`] |
//! | `tl.cdiv` | `cdiv(a, b)` | [`cdiv`] |
//! | `tl.argmin` | `x.argmin(1)` | [`Tile::argmin`] |
//! | `tl.cumsum`, `tl.cumprod` | `x.cumsum(1)`, `x.cumprod(1)` | [`Tile::cumsum`], [`Tile::cumprod`] |
//! | `tl.trans`, `tl.permute`, `tl.reshape` | `x.trans()`, `x.permute([2, 0, 1])`, `x.reshape([M * N])` | [`Tile::trans`], [`Tile::permute`], [`Tile::reshape`] |
//! | `tl.histogram` | `histogram(x, BINS, mask)` | [`histogram`] |
//! | `tl.rand`, `tl.randn`, `tl.randint` | `rand(seed, offs)`, `randn(seed, offs)`, `randint(seed, offs)` | [`rand`], [`randn`], [`randint`] |
//! | `tl.extra.cuda.globaltimer` | `global_timer()` | [`global_timer`] |
//! | `tl.extra.cuda.smid` | `sm_id()` | [`sm_id`] |
//! | `gdc_wait`, `gdc_launch_dependents` | `wait_for_prior_kernels()`, `launch_dependents()` | [`wait_for_prior_kernels`], [`launch_dependents`] |
//! | `tl.atomic_xchg(p, v, sem="release", scope="sys")`, a spin on `tl.atomic_*(.., sem="acquire", scope="sys")` | `signal_flag(p, v)`, `wait_flag_at_least(p, v)` | [`signal_flag`], [`wait_flag_at_least`] |
//! | Gluon's distributed shared memory | `cluster_gather(t)` | [`cluster_gather`] |
//! | a `@triton.jit` helper | a `#[tile_fn]` function | [`tile_fn`](crate::tile_fn) (example below) |
//! | a helper's `return a, b`, then `a, b = f(a, b)` | `-> (A, B)` ending in `(a, b)`, then `let (a, b) = f(..)` or `(a, b) = f(a, b)` | example below |
//! | `while cond:` | `while cond { .. }` (run-time scalar `bool`, carried variables as in `for`) | example below |
//! | `x_ptr.dtype.element_ty` generics | `fn k<T>(x: Ptr<T>)` with `T = [f32, bf16]` in the attribute | example below |
//! | `BLOCK = triton.next_power_of_2(n)` | `k::pick_block(n)`, then `k::launch_at(.., [block], ..)` | example below |
//!
//! The exact rules (integer wrapping, shifts past the width, rounding, casts, NaN in
//! reductions) are in `docs/design.md`, "Semantics". Every op is checked against a
//! plain-Rust reference for every dtype it supports, on the interpreter and the GPU, by
//! the op matrix in `tilefuse-dsl`'s tests.
//!
//! # Examples
//!
//! Elementwise ops, casts, `select` and `%` on the CPU interpreter:
//!
//! ```
//! use tilefuse::prelude::*;
//!
//! #[kernel(BLOCK = [64], num_warps = [1])]
//! fn ops<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, idx: Ptr<i32>, n: i32) {
//!     let offs = program_id(0) * BLOCK + arange(0, BLOCK);
//!     let mask = offs < n;
//!     let v = load(x + offs, mask, 0.0);
//!     let r = select(v < 0.0, -(v % 2.0), maximum(sqrt(v), 1.5));
//!     store(out + offs, r, mask);
//!     store(idx + offs, (v * 10.0) as i32 >> 1, mask);
//! }
//!
//! let dev = Device::cpu();
//! let x = dev.upload(&[-5.0f32, 4.0, 0.25]).unwrap();
//! let mut out = dev.alloc_filled(3, f32::NAN).unwrap();
//! let mut idx = dev.zeros::<i32>(3).unwrap();
//! ops::<64>::launch(&dev, 1, &x, &mut out, &mut idx, 3).unwrap();
//! assert_eq!(out.to_vec().unwrap(), vec![1.0, 2.0, 1.5]);
//! assert_eq!(idx.to_vec().unwrap(), vec![-25, 20, 1]);
//! ```
//!
//! Reductions along each axis of a masked 2-D tile:
//!
//! ```
//! use tilefuse::prelude::*;
//!
//! #[kernel(M = [4], N = [8], num_warps = [1])]
//! fn stats<const M: usize, const N: usize>(x: Ptr<f32>, sums: Ptr<f32>, best: Ptr<i32>, m: i32, n: i32) {
//!     let rows = arange(0, M);
//!     let cols = arange(0, N);
//!     let mask = (rows.expand_dims(1) < m) & (cols.expand_dims(0) < n);
//!     let v = load(x + rows.expand_dims(1) * n + cols.expand_dims(0), mask, f32::NEG_INFINITY);
//!     store(sums + rows, select(mask, v, 0.0).sum(1), rows < m);
//!     store(best + cols, v.argmax(0), cols < n);
//! }
//!
//! let dev = Device::cpu();
//! // 2 rows of 3 columns.
//! let x = dev.upload(&[1.0f32, 5.0, 2.0, 4.0, 0.0, 3.0]).unwrap();
//! let mut sums = dev.zeros::<f32>(2).unwrap();
//! let mut best = dev.zeros::<i32>(3).unwrap();
//! stats::<4, 8>::launch(&dev, 1, &x, &mut sums, &mut best, 2, 3).unwrap();
//! assert_eq!(sums.to_vec().unwrap(), vec![8.0, 7.0]);
//! assert_eq!(best.to_vec().unwrap(), vec![1, 0, 1]);
//! ```
//!
//! `dot` and `atomic_add` (every program adds its partial sums):
//!
//! ```
//! use tilefuse::prelude::*;
//!
//! #[kernel(M = [16], num_warps = [1])]
//! fn mm<const M: usize>(a: Ptr<f32>, b: Ptr<f32>, c: Ptr<f32>, total: Ptr<f32>) {
//!     let r = arange(0, M);
//!     let x = load(a + r.expand_dims(1) * M + r.expand_dims(0));
//!     let y = load(b + r.expand_dims(1) * M + r.expand_dims(0));
//!     let acc = full([M, M], 1.0);
//!     let z = dot(x, y, acc);
//!     store(c + r.expand_dims(1) * M + r.expand_dims(0), z);
//!     atomic_add(total + r * 0, z.sum(1));
//! }
//!
//! let dev = Device::cpu();
//! let eye: Vec<f32> = (0..256).map(|i| if i % 17 == 0 { 1.0 } else { 0.0 }).collect();
//! let twos = vec![2.0f32; 256];
//! let (a, b) = (dev.upload(&eye).unwrap(), dev.upload(&twos).unwrap());
//! let mut c = dev.zeros::<f32>(256).unwrap();
//! let mut total = dev.zeros::<f32>(1).unwrap();
//! mm::<16>::launch(&dev, 2, &a, &b, &mut c, &mut total).unwrap();
//! assert!(c.to_vec().unwrap().iter().all(|&v| v == 3.0));
//! assert_eq!(total.to_vec().unwrap(), vec![2.0 * 256.0 * 3.0]);
//! ```
//!
//! A `#[tile_fn]` helper (inlined where it is called), a `while` loop, a kernel generic
//! over its element type, and the run-time pick of a compiled constant:
//!
//! ```
//! use tilefuse::prelude::*;
//!
//! #[tile_fn]
//! fn silu(x: Tile<f32>) -> Tile<f32> {
//!     x * sigmoid(x)
//! }
//!
//! // `out[i] = silu(x[i])` in T; `steps[0]` = halvings of `n` down to 1.
//! #[kernel(T = [f32, bf16], B = [64, 256], num_warps = [1])]
//! fn act<T, const B: usize>(x: Ptr<T>, out: Ptr<T>, steps: Ptr<i32>, n: i32) {
//!     let offs = program_id(0) * B + arange(0, B);
//!     let v = load(x + offs, offs < n, 0.0 as T) as f32;
//!     store(out + offs, silu(v) as T, offs < n);
//!     let mut m = n;
//!     let mut count = 0;
//!     while m > 1 {
//!         m = m / 2;
//!         count += 1;
//!     }
//!     store(steps, count);
//! }
//!
//! let dev = Device::cpu();
//! let host = [-1.0f32, 0.0, 2.0];
//! let x = dev.upload(&host).unwrap();
//! let mut out = dev.zeros::<f32>(3).unwrap();
//! let mut steps = dev.zeros::<i32>(1).unwrap();
//! act::<f32, 64>::launch(&dev, 1, &x, &mut out, &mut steps, 3).unwrap();
//! let want: Vec<f32> = host.iter().map(|v| v / (1.0 + (-v).exp())).collect();
//! assert!(out.to_vec().unwrap().iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-6));
//! assert_eq!(steps.to_vec().unwrap(), vec![1]);
//!
//! // The same kernel in bf16, its block picked at run time.
//! let xb = dev.upload(&host.map(bf16::from_f32)).unwrap();
//! let mut ob = dev.zeros::<bf16>(3).unwrap();
//! assert_eq!(ACT_BF16.pick_at_least("B", 100).unwrap(), 256);
//! act::<bf16, 256>::launch(&dev, 1, &xb, &mut ob, &mut steps, 3).unwrap();
//! assert_eq!(ob.to_vec().unwrap()[2], bf16::from_f32(want[2]));
//! ```
//!
//! A helper that returns several values as a tuple, taken apart by `let (..)` and by a
//! destructuring assignment that carries two tiles through a loop:
//!
//! ```
//! use tilefuse::prelude::*;
//!
//! /// `(a, b) -> (b, a + b)`.
//! #[tile_fn]
//! fn step(a: Tile<f32>, b: Tile<f32>) -> (Tile<f32>, Tile<f32>) {
//!     (b, a + b)
//! }
//!
//! /// The block's sum and largest value.
//! #[tile_fn]
//! fn sum_max(v: Tile<f32>) -> (f32, f32) {
//!     (v.sum(0), v.max(0))
//! }
//!
//! #[kernel(B = [4], num_warps = [1])]
//! fn recur<const B: usize>(x: Ptr<f32>, out: Ptr<f32>, stats: Ptr<f32>, k: i32) {
//!     let offs = arange(0, B);
//!     let v = load(x + offs);
//!     let (mut a, mut b) = (v, v);
//!     for _i in 0..k {
//!         (a, b) = step(a, b);
//!     }
//!     store(out + offs, a);
//!     let (total, largest) = sum_max(v);
//!     store(stats, total);
//!     store(stats + 1, largest);
//! }
//!
//! let dev = Device::cpu();
//! let x = dev.upload(&[1.0f32, 2.0, 3.0, -1.0]).unwrap();
//! let mut out = dev.zeros::<f32>(4).unwrap();
//! let mut stats = dev.zeros::<f32>(2).unwrap();
//! recur::<4>::launch(&dev, 1, &x, &mut out, &mut stats, 4).unwrap();
//! // (1, 1) -> (1, 2) -> (2, 3) -> (3, 5) -> (5, 8): a is 5 times x.
//! assert_eq!(out.to_vec().unwrap(), vec![5.0, 10.0, 15.0, -5.0]);
//! assert_eq!(stats.to_vec().unwrap(), vec![5.0, 3.0]);
//! ```
//!
//! For a kernel without type parameters, `pick_<const>` and `launch_at` are generated:
//!
//! ```
//! use tilefuse::prelude::*;
//!
//! #[kernel(BLOCK = [32, 128], num_warps = [1])]
//! fn row_sum<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
//!     let offs = arange(0, BLOCK);
//!     store(out, load(x + offs, offs < n, 0.0).sum(0));
//! }
//!
//! let dev = Device::cpu();
//! let x = dev.upload(&[1.0f32; 100]).unwrap();
//! let mut out = dev.zeros::<f32>(1).unwrap();
//! let block = row_sum::pick_block(100).unwrap(); // 128: the smallest compiled >= 100
//! row_sum::launch_at(&dev, 1, [block], &x, &mut out, 100).unwrap();
//! assert_eq!(out.to_vec().unwrap(), vec![100.0]);
//! // None fits: the error lists the compiled values.
//! let err = row_sum::pick_block(1000).unwrap_err().to_string();
//! assert!(err.contains("[32, 128]"), "{err}");
//! ```

use std::marker::PhantomData;

/// No values: the types below cannot be constructed.
#[derive(Clone, Copy, Debug)]
enum Never {}

/// A tile (or a scalar: a rank-0 tile) of elements of type `T`, as seen inside
/// `#[kernel]`. Shapes are compile-time powers of two, rank 0 to 4.
///
/// # Operators
///
/// `+ - * / %` on numbers, `& | ^ << >>` on integers (and `& | ^` on `bool`), unary `-`
/// and `!` (bitwise not on integers, logical on `bool`), elementwise. Integers wrap;
/// `/` truncates and `%` takes the dividend's sign (also on floats: C's `fmod`);
/// shifts at or past the width give 0 (or all sign bits for `>>` on signed).
/// `f16`/`bf16` compute in `f32` and round every result. Compound assignment
/// (`acc += x`) works on `let mut` variables.
///
/// ```rust,ignore
/// let y = (a * 2.0 + b) % 3.0;        // f32 tiles and literals
/// let h = (i >> 4) & 0xF;             // i32 tile
/// ```
///
/// # Comparisons
///
/// `== != < <= > >=` compare elementwise and give a `bool` tile (a mask). Float `!=`
/// holds for NaN. Mind Rust's precedence: `&` and `|` bind tighter than `<`, so write
/// `(a < n) & (b < m)`.
///
/// ```rust,ignore
/// let mask = (rows.expand_dims(1) < m) & (cols.expand_dims(0) < n);
/// ```
///
/// # Casts
///
/// `x as T` converts between all dtypes (`f32 f16 bf16 i32 u32 i64 u8 bool`): floats
/// round to nearest even, float to int truncates and saturates (NaN to 0), int to int
/// wraps, to `bool` tests `!= 0`, `bool` gives 0 or 1.
///
/// ```rust,ignore
/// let w = load(w_ptr + offs, mask, 0.0) as f32;   // bf16 -> f32
/// store(out + offs, (acc * scale) as bf16, mask);
/// ```
pub struct Tile<T> {
    never: Never,
    _elem: PhantomData<T>,
}

/// A pointer parameter (`x: Ptr<f32>`), or a tile of pointers (`x + offs`).
///
/// `ptr + offsets` adds integer offsets, in elements, and broadcasts like any
/// elementwise op. Element types: `f32 f16 bf16 i32 u32 i64 u8`.
///
/// ```rust,ignore
/// let ptrs = x + rows.expand_dims(1) * stride + cols.expand_dims(0); // [M, N] pointers
/// ```
pub struct Ptr<T> {
    never: Never,
    _elem: PhantomData<T>,
}

fn outside_kernel(op: &str) -> ! {
    panic!("`{op}` is only meaningful inside #[kernel]")
}

macro_rules! binary_ops {
    ($($tr:ident $f:ident),*) => {$(
        /// Elementwise (see "Operators" on [`Tile`]).
        impl<T> std::ops::$tr for Tile<T> {
            type Output = Tile<T>;
            fn $f(self, _rhs: Tile<T>) -> Tile<T> {
                match self.never {}
            }
        }
    )*};
}

binary_ops!(Add add, Sub sub, Mul mul, Div div, Rem rem, BitAnd bitand, BitOr bitor, BitXor bitxor, Shl shl, Shr shr);

/// Elementwise negation (see "Operators" on [`Tile`]).
impl<T> std::ops::Neg for Tile<T> {
    type Output = Tile<T>;
    fn neg(self) -> Tile<T> {
        match self.never {}
    }
}

/// Bitwise not on integers, logical not on `bool` (see "Operators" on [`Tile`]).
impl<T> std::ops::Not for Tile<T> {
    type Output = Tile<T>;
    fn not(self) -> Tile<T> {
        match self.never {}
    }
}

/// `ptr + offsets`: a tile of pointers (see [`Ptr`]).
impl<T> std::ops::Add<Tile<i32>> for Ptr<T> {
    type Output = Ptr<T>;
    fn add(self, _offsets: Tile<i32>) -> Ptr<T> {
        match self.never {}
    }
}

impl<T> Tile<T> {
    /// Inserts an axis of extent 1 at `axis`: Triton's `x[:, None]` is
    /// `x.expand_dims(1)`, `x[None, :]` is `x.expand_dims(0)`.
    ///
    /// ```rust,ignore
    /// let offs = rows.expand_dims(1) * n + cols.expand_dims(0); // [M, 1] and [1, N] -> [M, N]
    /// ```
    pub fn expand_dims(self, axis: usize) -> Tile<T> {
        let _ = axis;
        match self.never {}
    }

    /// Sum along `axis` (dropped; rank 1 gives a scalar). Floats accumulate in `f32`
    /// (also for `f16`/`bf16`, rounded once to the dtype); the order of additions is
    /// unspecified. An `f32` product used only by sums is fused into them on the GPU
    /// (one `fma` a product, unrounded; the interpreter rounds it: both are within a
    /// sum's tolerance). Integers wrap.
    ///
    /// ```rust,ignore
    /// let row_sums = v.sum(1); // [M, N] -> [M]
    /// let dots = ((w as f32) * x.expand_dims(0)).sum(1); // one fma a product on the GPU
    /// ```
    pub fn sum(self, axis: usize) -> Tile<T> {
        let _ = axis;
        match self.never {}
    }

    /// Maximum along `axis`; NaN is ignored unless every lane is NaN. Mask with
    /// `other = f32::NEG_INFINITY` (or the integer minimum).
    ///
    /// ```rust,ignore
    /// let m = load(x + cols, cols < n, f32::NEG_INFINITY).max(0);
    /// ```
    pub fn max(self, axis: usize) -> Tile<T> {
        let _ = axis;
        match self.never {}
    }

    /// Minimum along `axis`; NaN is ignored unless every lane is NaN.
    ///
    /// ```rust,ignore
    /// let lo = v.min(1);
    /// ```
    pub fn min(self, axis: usize) -> Tile<T> {
        let _ = axis;
        match self.never {}
    }

    /// Index (`i32`) of the maximum along `axis`: the first (lowest) one on ties, never a
    /// NaN lane unless all are NaN.
    ///
    /// ```rust,ignore
    /// let token = s0 + logits.argmax(0);
    /// ```
    pub fn argmax(self, axis: usize) -> Tile<i32> {
        let _ = axis;
        match self.never {}
    }
}

/// This program's index along grid axis `axis` (0, 1 or 2), as an `i32` scalar.
///
/// ```rust,ignore
/// let offs = program_id(0) * BLOCK + arange(0, BLOCK);
/// ```
pub fn program_id(axis: i32) -> Tile<i32> {
    let _ = axis;
    outside_kernel("program_id")
}

/// Nanoseconds of a clock that every program of every launch shares, as an `i64`
/// scalar: `%globaltimer` on the GPU (whose resolution is about a microsecond on some
/// drivers), a monotonic clock on the interpreter. Each call reads the clock again.
/// Stored at entry, after [`wait_for_prior_kernels`] and at the end, it shows when a
/// kernel's programs start, get past their wait and finish.
///
/// ```rust,ignore
/// let start = global_timer();
/// wait_for_prior_kernels();
/// let past_wait = global_timer();
/// // ...
/// store(stamps + 3 * program_id(0), start);
/// store(stamps + 3 * program_id(0) + 1, past_wait);
/// store(stamps + 3 * program_id(0) + 2, global_timer());
/// ```
pub fn global_timer() -> Tile<i64> {
    outside_kernel("global_timer")
}

/// The index of the streaming multiprocessor running this program, as an `i32` scalar:
/// `%smid` on the GPU, 0 on the interpreter (which runs every program on one
/// processor). Stored beside [`global_timer`] stamps, it shows which programs shared an
/// SM, e.g. whether a kernel's programs started beside the previous kernel's.
///
/// ```rust,ignore
/// store(sms + program_id(0), sm_id());
/// ```
pub fn sm_id() -> Tile<i32> {
    outside_kernel("sm_id")
}

/// The grid's size along `axis` (0, 1 or 2), as an `i32` scalar.
///
/// ```rust,ignore
/// for start in (program_id(0) * BLOCK..n).step_by(BLOCK * num_programs(0)) { /* .. */ }
/// ```
pub fn num_programs(axis: i32) -> Tile<i32> {
    let _ = axis;
    outside_kernel("num_programs")
}

/// The `i32` tile `[start, start + 1, .., end - 1]`; `end - start` is a compile-time
/// power of two.
///
/// ```rust,ignore
/// let cols = arange(0, BLOCK);
/// ```
pub fn arange(start: i32, end: i32) -> Tile<i32> {
    let _ = (start, end);
    outside_kernel("arange")
}

/// A tile of zeros of dtype `T`: `zeros::<f32>([M, N])`.
///
/// ```rust,ignore
/// let mut acc = zeros::<f32>([BLOCK_N, BLOCK_K]);
/// ```
pub fn zeros<T>(shape: &[usize]) -> Tile<T> {
    let _ = shape;
    outside_kernel("zeros")
}

/// A tile of `shape` filled with `value` (a scalar, or a literal that takes the dtype
/// of its use); `full::<T>(shape, v)` converts `v` to `T` first.
///
/// ```rust,ignore
/// let m = full([BLOCK], f32::NEG_INFINITY);
/// ```
pub fn full<T>(shape: &[usize], value: T) -> Tile<T> {
    let _ = (shape, value);
    outside_kernel("full")
}

/// Broadcasts `x` to `shape` explicitly (extents of 1 stretch; shapes align on the
/// right).
///
/// ```rust,ignore
/// let b = broadcast_to(bias.expand_dims(0), [M, N]);
/// ```
pub fn broadcast_to<T>(x: Tile<T>, shape: &[usize]) -> Tile<T> {
    let _ = shape;
    match x.never {}
}

/// Loads one element per pointer lane: `load(ptrs)`, `load(ptrs, mask)`,
/// `load(ptrs, mask, other)`. Masked-off lanes touch no memory and give `other` (0 when
/// absent). The interpreter reports an unmasked lane outside its buffer as an error
/// naming the kernel, the parameter and the index.
///
/// ```rust,ignore
/// let x = load(x_ptr + offs, offs < n, 0.0);
/// ```
pub fn load<T>(ptrs: Ptr<T>, mask: Tile<bool>, other: Tile<T>) -> Tile<T> {
    let _ = (mask, other);
    match ptrs.never {}
}

/// Stores `values` through `ptrs`: `store(ptrs, values)` or `store(ptrs, values, mask)`.
/// Masked-off lanes write nothing. Two unmasked lanes writing different values to one
/// address is an error on the interpreter (on a GPU the winner is unspecified); equal
/// values are fine. A statement: it returns nothing.
///
/// ```rust,ignore
/// store(out + offs, a + b, offs < n);
/// ```
pub fn store<T>(ptrs: Ptr<T>, values: Tile<T>, mask: Tile<bool>) {
    let _ = (values, mask);
    match ptrs.never {}
}

/// Asks the GPU's L2 cache to fetch the lines holding these addresses:
/// `prefetch(ptrs)` or `prefetch(ptrs, mask)`. A hint with no value and no effect on any
/// result: a kernel whose memory is idle (attention's arithmetic, say) can pull in bytes
/// a later kernel will read. One pointer per 128-byte line is enough (the compiler issues
/// one prefetch per contiguous group a thread holds). Each is a request on the program's
/// load path, like a load: thousands of them delay the program's own loads (for large
/// contiguous ranges on Hopper, [`prefetch_range`] is one request). Masked-off lanes
/// touch nothing; the interpreter checks that every unmasked address lies inside its
/// buffer, as for a load. A statement: it returns nothing.
///
/// ```rust,ignore
/// // Every 64th bf16 of the next block: one pointer a line.
/// let lines = next_block + arange(0, 256) * 64;
/// prefetch(w + lines, lines < n);
/// ```
pub fn prefetch<T>(ptrs: Ptr<T>, mask: Tile<bool>) {
    let _ = mask;
    match ptrs.never {}
}

/// Asks the GPU's L2 cache to fetch `count` consecutive elements from the single
/// pointer `ptr` (nothing when `count` is not positive): on Hopper (`sm_90`) one bulk
/// request by one thread, which the copy engine serves without occupying the program's
/// load path (the range is widened to 16-byte bounds); elsewhere a no-op. A hint like
/// [`prefetch`]; the interpreter checks the range's first and last elements. Measured in
/// the decode step: a third of the next gate/up weights asked for while attention
/// computes is +1.5% a token on an H100 at context 1024; asking for more, or while the
/// memory is busy, is slower (docs/perf.md). A statement: it returns nothing.
///
/// ```rust,ignore
/// prefetch_range(w + program_id(0) * chunk, chunk);
/// ```
pub fn prefetch_range<T>(ptr: Ptr<T>, count: i32) {
    let _ = count;
    match ptr.never {}
}

/// Waits until the kernels launched before this one on the stream have finished and
/// their writes are visible. A statement, only at the top level of the kernel body.
///
/// On Hopper with programmatic dependent launch (on by default; `TILEFUSE_PDL=0` turns it off), a
/// kernel may start while its predecessor is still running, and by default waits at entry.
/// Placing the wait yourself lets the loads above it (of data no kernel of the stream
/// writes, such as weights) overlap the predecessor's tail. Everything read before the
/// wait must be immutable; nothing may be written before it. Elsewhere it is a no-op.
///
/// The placement also picks cache paths on sm_90: a buffer loaded above the wait is
/// declared immutable, so all its loads use the non-coherent path (`ld.global.nc`);
/// every other load is an ordinary one, which the wait makes coherent with the
/// previous kernels' writes.
///
/// ```rust,ignore
/// let w_tile = load(w + rows.expand_dims(1) * k + cols.expand_dims(0)); // weights
/// wait_for_prior_kernels();
/// let x_tile = load(x + cols); // written by the previous kernel
/// ```
pub fn wait_for_prior_kernels() {}

/// Lets the next kernel of the stream be scheduled once every program of this one has
/// passed this point. A statement, only at the top level of the kernel body.
///
/// On Hopper with programmatic dependent launch the compiler places this trigger at
/// entry unless the kernel places it: the next kernel's programs then start as soon as
/// SMs have room, and can request their own immutable data (weights) while this one
/// runs. Placed after [`wait_for_prior_kernels`], programs start at most one launch
/// ahead (a later kernel's early loads no longer compete with this one's). Which is
/// faster depends on the kernel: the engine's attention kernel triggers after its wait
/// (H100: its launches 121.3 -> 112.5 us a decode step, 6.71 -> 5.09 us alone at 512
/// positions), its GEMVs at entry (triggering them late made each 6-11% slower alone
/// and the step 1% slower). Elsewhere it is a no-op.
///
/// ```rust,ignore
/// let w_tile = load(w + offs); // immutable
/// wait_for_prior_kernels();
/// launch_dependents();
/// ```
pub fn launch_dependents() {}

/// Publishes `value` in the `i32` flag at `flag` for programs of other launches, on
/// this GPU or another one (a peer GPU's memory, or this GPU's memory that a peer
/// polls): once every thread of the program has made its earlier memory accesses, one
/// thread stores `value` with release semantics at system scope (`st.release.sys`).
/// What the program and the kernels before it on the stream wrote is visible to a
/// program that sees the value through [`wait_flag_at_least`]. A statement, only at the
/// top level of the kernel body; the interpreter stores the value.
///
/// Typical use is a handshake between GPUs that exchange data through peer memory
/// without a second launch: each side signals, then waits for the other's signal, then
/// reads what the other wrote (the engine's tensor-parallel all-reduce,
/// `peer_residual_add`). Counting up (a new value each exchange) means flags never
/// need resetting, so the exchange replays from a CUDA graph as is.
///
/// ```rust,ignore
/// let epoch = load(count + program_id(0)) + 1;
/// store(count + program_id(0), epoch);
/// signal_flag(peer_flags + program_id(0), epoch);
/// wait_flag_at_least(my_flags + program_id(0), epoch);
/// let theirs = load(peer_data + offs, ok, 0.0);
/// ```
pub fn signal_flag(flag: Ptr<i32>, value: i32) {
    let _ = value;
    match flag.never {}
}

/// Waits until the `i32` flag at `flag` is at least `value` (modulo 2^32: `flag -
/// value`, wrapping, is not negative), as set by [`signal_flag`] in another launch,
/// possibly on another GPU. Afterwards every thread of the program sees what the
/// signaler wrote before signaling (one thread polls with `ld.acquire.sys`, then the
/// program synchronizes). A statement, only at the top level of the kernel body.
///
/// Bounded: a GPU program still waiting after 10 s executes `trap`, so the launch (and
/// the stream's later work) fails with an error instead of hanging the device. The
/// interpreter runs programs and launches one after another, so nothing can raise the
/// flag while a program waits: a flag below `value` there is an error, and a flag
/// already at it passes.
///
/// ```rust,ignore
/// wait_flag_at_least(my_flags + program_id(0), epoch);
/// ```
pub fn wait_flag_at_least(flag: Ptr<i32>, value: i32) {
    let _ = value;
    match flag.never {}
}

/// Triton's `tl.where` (`where` is a Rust keyword): `cond ? a : b` elementwise, with
/// broadcasting of all three.
///
/// ```rust,ignore
/// let s = select(ok, scores * scale, f32::NEG_INFINITY);
/// ```
pub fn select<T>(cond: Tile<bool>, a: Tile<T>, b: Tile<T>) -> Tile<T> {
    let _ = (a, b);
    match cond.never {}
}

macro_rules! math {
    ($($name:ident: $what:literal, $ex:literal;)*) => {$(
        #[doc = concat!($what, " Float dtypes; also written `x.", stringify!($name), "()`.")]
        ///
        /// ```rust,ignore
        #[doc = $ex]
        /// ```
        pub fn $name<T>(x: Tile<T>) -> Tile<T> {
            match x.never {}
        }
    )*};
}

math! {
    exp: "`e^x`. On the GPU: `ex2.approx` of `x * log2(e)` (a few ulp).", "let e = exp(v - v.max(0));";
    exp2: "`2^x`. On the GPU: `ex2.approx` (2 ulp).", "let freq = exp2(-(i as f32) * (2.0 / (D as f32)) * log2(theta));";
    log: "Natural logarithm. On the GPU: `lg2.approx` times ln 2.", "let lse = m + log(s);";
    log2: "Base-2 logarithm. On the GPU: `lg2.approx`.", "let bits = log2(x);";
    sqrt: "Square root, correctly rounded on every device.", "let norm = sqrt((v * v).sum(0));";
    rsqrt: "`1 / sqrt(x)`. On the GPU: `rsqrt.approx`.", "let r = rsqrt((v * v).sum(0) / (n as f32) + eps);";
    sin: "Sine. On the GPU: `sin.approx` (absolute error about 2^-21 on [-π, π]).", "let s = sin(ang);";
    cos: "Cosine. On the GPU: `cos.approx` (absolute error about 2^-21 on [-π, π]).", "let c = cos(ang);";
    sigmoid: "`1 / (1 + e^-x)`.", "let silu = g * sigmoid(g);";
    tanh: "Hyperbolic tangent. On the GPU: `tanh.approx` (relative error about 2^-11).", "let gelu = 0.5 * x * (1.0 + tanh(0.7978846 * (x + 0.044715 * x * x * x)));";
    floor: "Rounds toward negative infinity (exact).", "let cell = floor(x / h) as i32;";
    ceil: "Rounds toward positive infinity (exact).", "let pages = ceil(len / 16.0);";
}

/// Absolute value: floats, and integers (wrapping: `abs(i32::MIN)` is `i32::MIN`).
/// Also written `x.abs()`.
///
/// ```rust,ignore
/// let err = abs(got - want).max(0);
/// ```
pub fn abs<T>(x: Tile<T>) -> Tile<T> {
    match x.never {}
}

/// Elementwise maximum; for floats, the non-NaN operand when one is NaN.
///
/// ```rust,ignore
/// let m_new = maximum(m, scores.max(0));
/// ```
pub fn maximum<T>(a: Tile<T>, b: Tile<T>) -> Tile<T> {
    let _ = b;
    match a.never {}
}

/// Elementwise minimum; for floats, the non-NaN operand when one is NaN.
///
/// ```rust,ignore
/// let clipped = minimum(maximum(x, -1.0), 1.0);
/// ```
pub fn minimum<T>(a: Tile<T>, b: Tile<T>) -> Tile<T> {
    let _ = b;
    match a.never {}
}

/// `[M, K] x [K, N]` matrix product with `f32` accumulation, plus `acc` when given:
/// `dot(a, b)` or `dot(a, b, acc)`. Operands `f32`, `f16` or `bf16` (tensor cores for
/// the 16-bit ones); the result is `f32`.
///
/// ```rust,ignore
/// acc = dot(a_tile, b_tile, acc);
/// ```
pub fn dot<T>(a: Tile<T>, b: Tile<T>, acc: Tile<f32>) -> Tile<f32> {
    let _ = (b, acc);
    match a.never {}
}

/// The byte dot product of each pair of 32-bit elements, plus `acc` (PTX `dp4a`):
/// `acc + a[0] * b[0] + a[1] * b[1] + a[2] * b[2] + a[3] * b[3]` over the four bytes
/// of each element, read as signed for `i32` operands and unsigned for `u32` ones (any
/// pairing); `acc` and the result are `i32` (wrapping). Elementwise, with broadcasting.
///
/// ```rust,ignore
/// // Four int8 activations against four 4-bit weights (the low nibbles of `w`).
/// acc = dot4((w & 0x0F0F_0F0F).bitcast::<i32>(), a_i8x4, acc);
/// ```
pub fn dot4<A, B>(a: Tile<A>, b: Tile<B>, acc: Tile<i32>) -> Tile<i32> {
    let _ = (b, acc);
    match a.never {}
}

/// Picks four bytes out of eight, per element (CUDA's `__byte_perm`, PTX `prmt`): byte
/// `n` of the result is byte `(sel >> 4 n) & 7` of `b:a`, where bytes 0 to 3 are `a`'s
/// and 4 to 7 are `b`'s (the selector's other bits are ignored). `a`, `b` and the
/// result share one dtype, `i32` or `u32`; `sel` is `i32` or `u32`. Elementwise, with
/// broadcasting.
///
/// Two of them look up a table of 16 bytes held in four words, four indices at a time,
/// as the non-linear 4-bit quants (IQ4_NL, IQ4_XS) are decoded:
///
/// ```rust,ignore
/// // `idx`: four 4-bit indices in the low nibbles of bits 0..16.
/// let low = byte_perm(t0, t1, idx); // entries 0..8
/// let high = byte_perm(t2, t3, idx); // entries 8..16
/// // Per byte, the high entry where the index has bit 3 set.
/// let pick = 0x3210 | ((idx & 0x8888) >> 1);
/// let values = byte_perm(low, high, pick);
/// ```
pub fn byte_perm<T>(a: Tile<T>, b: Tile<T>, sel: Tile<u32>) -> Tile<T> {
    let _ = (b, sel);
    match a.never {}
}

/// Atomically adds `values` at `ptrs` (`f32` or `i32`), lane by lane for unmasked
/// lanes, and returns the old values (0 for masked-off lanes). Float sums into one
/// address happen in an unspecified order.
///
/// Like every atomic, it orders the whole program's memory accesses (acquire-release at
/// device scope): the program's earlier writes are visible to any program that sees
/// this atomic's effect, and its later reads see what that program wrote before its
/// own atomic. That makes "the last program to arrive finishes the job" safe:
///
/// ```rust,ignore
/// store(partials + program_id(0), my_part);
/// let arrived = atomic_add(counter, 1);
/// if arrived == num_programs(0) - 1 {
///     // every program's partial is visible here
///     let all = load(partials + arange(0, P), arange(0, P) < num_programs(0), 0.0);
///     store(result, all.sum(0));
///     store(counter, 0); // ready for the next launch
/// }
/// ```
pub fn atomic_add<T>(ptrs: Ptr<T>, values: Tile<T>, mask: Tile<bool>) -> Tile<T> {
    let _ = (values, mask);
    match ptrs.never {}
}

/// Atomically takes the maximum of `values` and the memory at `ptrs` (`f32`, compared
/// as floats, or `i32`), and returns the old values.
///
/// ```rust,ignore
/// atomic_max(global_max, local.max(0));
/// ```
pub fn atomic_max<T>(ptrs: Ptr<T>, values: Tile<T>, mask: Tile<bool>) -> Tile<T> {
    let _ = (values, mask);
    match ptrs.never {}
}

/// In a kernel with thread-block clusters (`cluster(y = C)` in `#[kernel(..)]`), at the
/// top level: every program of the cluster contributes `t` (a tile or a scalar) and each
/// receives all of them stacked along a new leading axis, `[C, ..]`, row `r` from the
/// program of cluster rank `r`. On sm_90 the tiles travel through distributed shared
/// memory (no global memory, no second kernel).
///
/// ```rust,ignore
/// // Merge flash-decoding splits inside the kernel: one row of partial results a split.
/// let all_m = cluster_gather(m);          // [C, G]
/// let weight = exp(all_m - all_m.max(0).expand_dims(0));
/// ```
pub fn cluster_gather<T>(t: Tile<T>) -> Tile<T> {
    match t.never {}
}

/// Integer division rounding up: `(a + b - 1) / b`.
///
/// ```rust,ignore
/// let blocks = cdiv(n, BLOCK);
/// ```
pub fn cdiv<T>(a: Tile<T>, b: Tile<T>) -> Tile<T> {
    let _ = b;
    match a.never {}
}

/// Scans, `argmin` and layout changes.
impl<T> Tile<T> {
    /// Index (`i32`) of the minimum along `axis`: the first (lowest) one on ties, never a
    /// NaN lane unless all are NaN (then 0), as [`Tile::argmax`]. The same trap as
    /// `argmax`'s: masked-off lanes padded with `other = f32::INFINITY` are candidates,
    /// so a row of NaN padded that way gives the index of the first masked-off lane.
    ///
    /// ```rust,ignore
    /// let nearest = dist.argmin(1); // [M, N] -> [M]
    /// ```
    pub fn argmin(self, axis: usize) -> Tile<i32> {
        let _ = axis;
        match self.never {}
    }

    /// Inclusive running sum along `axis` (Triton's `tl.cumsum`): element `i` is the sum
    /// of elements `0..=i`. Same shape and dtype; floats accumulate in `f32` and each
    /// element rounds once to the dtype (the GPU associates the additions differently,
    /// within a sum's tolerance); integers wrap. On the GPU each thread scans its
    /// registers, lanes combine with `shfl.sync.up` and warps through shared memory:
    /// `O(B)` work, not a masked `O(B²)` triangle. Masked-off lanes take part: load them
    /// as 0.
    ///
    /// ```
    /// use tilefuse::prelude::*;
    ///
    /// #[kernel(B = [8], BINS = [4], num_warps = [1])]
    /// fn more<const B: usize, const BINS: usize>(
    ///     x: Ptr<i32>, sums: Ptr<i32>, first_min: Ptr<i32>, counts: Ptr<i32>,
    ///     tr: Ptr<i32>, n: i32,
    /// ) {
    ///     let offs = arange(0, B);
    ///     let v = load(x + offs, offs < n, 0);
    ///     store(sums + offs, v.cumsum(0), offs < n);
    ///     store(first_min, load(x + offs, offs < n, i32::MAX).argmin(0));
    ///     store(counts + arange(0, BINS), histogram(v, BINS, offs < n));
    ///     // [2, 4] -> its [4, 2] transpose, stored row-major.
    ///     let m = v.reshape([2, 4]).trans();
    ///     store(tr + arange(0, 4).expand_dims(1) * 2 + arange(0, 2).expand_dims(0), m);
    /// }
    ///
    /// let dev = Device::cpu();
    /// let x = dev.upload(&[3i32, 1, 2, 1, 0, 3, 2, 2]).unwrap();
    /// let mut sums = dev.zeros::<i32>(8).unwrap();
    /// let mut first_min = dev.zeros::<i32>(1).unwrap();
    /// let mut counts = dev.zeros::<i32>(4).unwrap();
    /// let mut tr = dev.zeros::<i32>(8).unwrap();
    /// more::<8, 4>::launch(&dev, 1, &x, &mut sums, &mut first_min, &mut counts, &mut tr, 6)
    ///     .unwrap();
    /// assert_eq!(sums.to_vec().unwrap(), vec![3, 4, 6, 7, 7, 10, 0, 0]);
    /// assert_eq!(first_min.to_vec().unwrap(), vec![4]);
    /// // The two lanes past n = 6 are masked off.
    /// assert_eq!(counts.to_vec().unwrap(), vec![1, 2, 1, 2]);
    /// assert_eq!(tr.to_vec().unwrap(), vec![3, 0, 1, 3, 2, 0, 1, 0]);
    /// ```
    pub fn cumsum(self, axis: usize) -> Tile<T> {
        let _ = axis;
        match self.never {}
    }

    /// Inclusive running product along `axis` (Triton's `tl.cumprod`), computed like
    /// [`Tile::cumsum`]. Masked-off lanes take part: load them as 1.
    ///
    /// ```rust,ignore
    /// let decay = load(g + offs, offs < n, 1.0).cumprod(0);
    /// ```
    pub fn cumprod(self, axis: usize) -> Tile<T> {
        let _ = axis;
        match self.never {}
    }

    /// The transpose of a 2-D tile (Triton's `tl.trans`); `trans(x)` also works. On the
    /// GPU it moves no data: the result's layout is the source's with the dims swapped
    /// (a consumer that needs another layout converts through shared memory, as for any
    /// value).
    ///
    /// ```rust,ignore
    /// let bt = load(b + offs_kn).trans(); // [K, N] -> [N, K]
    /// ```
    pub fn trans(self) -> Tile<T> {
        match self.never {}
    }

    /// Permutes the axes: result axis `t` is axis `dims[t]` of the source (Triton's
    /// `tl.permute`); `permute(x, dims)` also works. Moves no data on the GPU, like
    /// [`Tile::trans`].
    ///
    /// ```rust,ignore
    /// let y = x.permute([2, 0, 1]); // [A, B, C] -> [C, A, B]
    /// ```
    pub fn permute(self, dims: &[usize]) -> Tile<T> {
        let _ = dims;
        match self.never {}
    }

    /// The same elements, in row-major order, in another shape of equal size (Triton's
    /// `tl.reshape` without `can_reorder`); dims are powers of two. On the GPU the tile
    /// goes through shared memory into the new shape's layout.
    ///
    /// ```rust,ignore
    /// let flat = x.reshape([M * N]); // [M, N] -> [M * N]
    /// ```
    pub fn reshape(self, shape: &[usize]) -> Tile<T> {
        let _ = shape;
        match self.never {}
    }

    /// The same bits read as another element type of the same width (Triton's
    /// `x.to(U, bitcast=True)`, Rust's `f32::from_bits`/`to_bits`): `i32`, `u32` and
    /// `f32` among themselves, `f16` and `bf16` between each other. Other widths are a
    /// compile error. On the GPU it costs at most a `mov`.
    ///
    /// ```rust,ignore
    /// // An integer 0 <= q < 2^23 as f32 with one `or` and one add, no conversion:
    /// let qf = (q | 0x4B00_0000).bitcast::<f32>() - 8388608.0;
    /// ```
    pub fn bitcast<U>(self) -> Tile<U> {
        match self.never {}
    }
}

/// Counts of each value in `0..BINS` among the elements of a 1-D integer tile where
/// `mask` holds (Triton's `tl.histogram`): an `i32` tile of shape `[BINS]` (a power of
/// two). Values outside `0..BINS` are not counted. The mask may be left out. On the GPU
/// the counters live in shared memory (`red.shared.add`).
///
/// ```rust,ignore
/// let counts = histogram(load(tokens + offs, offs < n), VOCAB, offs < n);
/// ```
pub fn histogram<T>(x: Tile<T>, bins: usize, mask: Tile<bool>) -> Tile<i32> {
    let _ = (bins, mask);
    match x.never {}
}

/// Uniform `f32` random numbers in `[0, 1)`, one per element of `offsets` (Triton's
/// `tl.rand`, the same values for the same seed and offsets). `seed` is a scalar `i32`,
/// `u32` or `i64` (a signed seed sign-extends to the 64-bit Philox key); `offsets` an
/// `i32` or `u32` tile or scalar (the Philox counter). The word of [`randint`] `w` maps to
/// `(w as i32, or !w when negative) as f32 * 4.6566126e-10`; the interpreter and the GPU
/// give identical values.
///
/// ```
/// use tilefuse::prelude::*;
///
/// #[kernel(B = [64], num_warps = [1])]
/// fn dropout<const B: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32, p: f32, seed: i64) {
///     let offs = program_id(0) * B + arange(0, B);
///     let keep = rand(seed, offs) > p;
///     let v = load(x + offs, offs < n, 0.0);
///     store(out + offs, select(keep, v / (1.0 - p), 0.0), offs < n);
/// }
///
/// let dev = Device::cpu();
/// let x = dev.upload(&vec![1.0f32; 100]).unwrap();
/// let mut out = dev.zeros::<f32>(100).unwrap();
/// dropout::<64>::launch(&dev, 2, &x, &mut out, 100, 0.5, 1234).unwrap();
/// let kept = out.to_vec().unwrap().iter().filter(|&&v| v == 2.0).count();
/// assert!((30..70).contains(&kept), "{kept} of 100 kept");
/// ```
pub fn rand<S, O>(seed: Tile<S>, offsets: Tile<O>) -> Tile<f32> {
    let _ = offsets;
    match seed.never {}
}

/// Standard normal `f32` random numbers (Triton's `tl.randn`): the Box-Muller transform
/// of the uniform mappings `u1`, `u2` of the first two Philox words,
/// `sqrt(-2 ln max(u1, 1e-7)) * cos(2π u2)`. The GPU's logarithm and cosine are
/// approximate: values agree with the interpreter's to about 1e-3.
///
/// ```rust,ignore
/// let noise = randn(seed, offs) * sigma;
/// ```
pub fn randn<S, O>(seed: Tile<S>, offsets: Tile<O>) -> Tile<f32> {
    let _ = offsets;
    match seed.never {}
}

/// Random `u32` words (Triton's `tl.randint`): the first output word of Philox4x32-10
/// with counter `(offset, 0, 0, 0)` and key `(seed & 0xffffffff, seed >> 32)`. The
/// interpreter's Philox is checked against the known-answer vectors published with
/// Random123; the GPU's against the interpreter's, bit for bit.
///
/// ```rust,ignore
/// let bucket = randint(seed, offs) % 16u32;
/// ```
pub fn randint<S, O>(seed: Tile<S>, offsets: Tile<O>) -> Tile<u32> {
    let _ = offsets;
    match seed.never {}
}
