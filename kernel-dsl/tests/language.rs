//! Language features from source text to PTX: `#[tile_fn]` helpers (inlining, the errors
//! users see, the same PTX as the hand-inlined kernel), dtype-generic kernels, `while`,
//! and the reason a load is narrower than its layout allows.

use tilefuse_dsl::back::ptx::{self, Target};
use tilefuse_dsl::{compile_source, Specialization};

fn spec(consts: &[(&str, i64)]) -> Specialization {
    Specialization {
        consts: consts.iter().map(|(n, v)| (n.to_string(), *v)).collect(),
        num_warps: 4,
        num_stages: None,
    }
}

fn error_of(src: &str, consts: &[(&str, i64)]) -> String {
    compile_source(src, &spec(consts)).unwrap_err().message
}

fn ptx_of(src: &str, consts: &[(&str, i64)], target: Target) -> ptx::PtxKernel {
    let k = compile_source(src, &spec(consts)).unwrap_or_else(|e| panic!("{e}\n{src}"));
    ptx::compile(&k, target).unwrap()
}

const WITH_HELPERS: &str = r#"
#[kernel(B = [256])]
fn act<const B: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let offs = program_id(0) * B + arange(0, B);
    let mask = offs < n;
    let v = load(x + offs, mask, 0.0);
    put(out, offs, mask, silu(v) + scaled_sum::<B>(v));
}
#[tile_fn]
fn silu(x: Tile<f32>) -> Tile<f32> {
    x * sigmoid(x)
}
#[tile_fn]
fn scaled_sum<const N: usize>(x: Tile<f32>) -> f32 {
    x.sum(0) / (N as f32)
}
#[tile_fn]
fn put(p: Ptr<f32>, offs: Tile<i32>, mask: Tile<bool>, v: Tile<f32>) {
    store(p + offs, v, mask);
}
"#;

const INLINED: &str = r#"
#[kernel(B = [256])]
fn act<const B: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let offs = program_id(0) * B + arange(0, B);
    let mask = offs < n;
    let v = load(x + offs, mask, 0.0);
    store(out + offs, v * sigmoid(v) + v.sum(0) / (B as f32), mask);
}
"#;

#[test]
fn a_helper_compiles_to_the_same_ptx_as_its_body_written_inline() {
    for target in [Target::Sm80, Target::Sm90] {
        let a = ptx_of(WITH_HELPERS, &[("B", 256)], target);
        let b = ptx_of(INLINED, &[("B", 256)], target);
        assert_eq!(a.ptx, b.ptx, "{target:?}");
        if let Ok(ptxas) = ptx::ptxas::find() {
            ptx::ptxas::assemble(&ptxas, &a, target).unwrap_or_else(|e| panic!("{e}"));
        }
    }
}

/// A helper that stores the first `T` of four row sums, called with all four: the sums
/// it does not store are computed at the call and used nowhere.
const UNUSED_ARGUMENTS: &str = r#"
#[kernel(B = [64], T = [2])]
fn rows<const B: usize, const T: usize>(x: Ptr<f32>, out: Ptr<f32>) {
    let r = arange(0, B);
    let c = arange(0, 32);
    let at = (r * 32).expand_dims(1) + c.expand_dims(0);
    let a = load(x + at);
    let b = load(x + B * 32 + at);
    put_first::<B, T>(out, r, a.sum(1), b.sum(1), a.max(1), (a * b).sum(1));
}
#[tile_fn]
fn put_first<const B: usize, const T: usize>(
    out: Ptr<f32>,
    r: Tile<i32>,
    s0: Tile<f32>,
    s1: Tile<f32>,
    s2: Tile<f32>,
    s3: Tile<f32>,
) {
    store(out + r, s0);
    if T > 1 {
        store(out + B + r, s1);
    }
    if T > 2 {
        store(out + 2 * B + r, s2);
        store(out + 3 * B + r, s3);
    }
}
"#;

const USED_ARGUMENTS_ONLY: &str = r#"
#[kernel(B = [64], T = [2])]
fn rows<const B: usize, const T: usize>(x: Ptr<f32>, out: Ptr<f32>) {
    let r = arange(0, B);
    let c = arange(0, 32);
    let at = (r * 32).expand_dims(1) + c.expand_dims(0);
    let a = load(x + at);
    let b = load(x + B * 32 + at);
    let (s0, s1) = (a.sum(1), b.sum(1));
    store(out + r, s0);
    store(out + B + r, s1);
}
"#;

/// What a kernel computes and never uses is not compiled (`tilefuse_dsl::compact`):
/// reductions whose `shfl.sync` and `bar.sync` `ptxas` would keep are gone before the
/// backend sees them.
#[test]
fn unused_helper_arguments_leave_no_code() {
    let consts = [("B", 64), ("T", 2)];
    for target in [Target::Sm80, Target::Sm90] {
        let a = ptx_of(UNUSED_ARGUMENTS, &consts, target);
        let b = ptx_of(USED_ARGUMENTS_ONLY, &consts, target);
        assert_eq!(a.ptx, b.ptx, "{target:?}");
        assert!(
            a.ptx.contains("shfl.sync"),
            "the stored sums reduce across threads"
        );
    }
}

#[test]
fn helper_errors_point_at_the_helper_or_the_call() {
    // An unknown function names #[tile_fn], and the op list includes the statements.
    let e = error_of(
        "#[kernel] fn k(x: Ptr<f32>) { let a = gelu(load(x)); }",
        &[],
    );
    assert!(
        e.contains("unknown op `gelu`") && e.contains("#[tile_fn]"),
        "{e}"
    );
    for op in [
        "prefetch",
        "prefetch_range",
        "wait_for_prior_kernels",
        "launch_dependents",
        "signal_flag",
        "wait_flag_at_least",
    ] {
        assert!(e.contains(op), "{op} missing from {e}");
    }
    // Recursion.
    let e = error_of(
        "#[kernel] fn k(x: Ptr<f32>) { store(x, f(load(x))); }\n#[tile_fn] fn f(v: Tile<f32>) -> Tile<f32> { g(v) }\n#[tile_fn] fn g(v: Tile<f32>) -> Tile<f32> { f(v) }",
        &[],
    );
    assert!(e.contains("calls itself") && e.contains("f -> g"), "{e}");
    // Arity, a missing constant, a missing tail value, a unit helper used as a value.
    let src = |call: &str| {
        format!("#[kernel] fn k(x: Ptr<f32>) {{ {call} }}\n#[tile_fn] fn h<const N: usize>(v: Tile<f32>) -> Tile<f32> {{ v * (N as f32) }}\n#[tile_fn] fn bad(v: Tile<f32>) -> Tile<f32> {{ let w = v; }}\n#[tile_fn] fn unit(p: Ptr<f32>) {{ store(p, 1.0); }}")
    };
    let e = error_of(&src("store(x, h::<2>(load(x), 1.0));"), &[]);
    assert!(e.contains("takes 1 arguments, got 2"), "{e}");
    let e = error_of(&src("store(x, h(load(x)));"), &[]);
    assert!(e.contains("takes the constant `N`"), "{e}");
    let e = error_of(&src("store(x, bad(load(x)));"), &[]);
    assert!(
        e.contains("end its body with the value") && e.starts_with("line 3"),
        "{e}"
    );
    let e = error_of(&src("let a = unit(x);"), &[]);
    assert!(e.contains("returns nothing"), "{e}");
    // A type error inside a helper is located in the helper.
    let e = error_of(
        "#[kernel] fn k(x: Ptr<f32>, n: i32) { store(x, twice(load(x), n)); }\n#[tile_fn] fn twice(v: Tile<f32>, n: i32) -> Tile<f32> { v * n }",
        &[],
    );
    assert!(
        e.contains("mismatched types") && e.starts_with("line 2"),
        "{e}"
    );
    // Helpers do not see the kernel's variables or constants.
    let e = error_of(
        "#[kernel(B = [4])] fn k<const B: usize>(x: Ptr<f32>) { store(x, leak()); }\n#[tile_fn] fn leak() -> f32 { B as f32 }",
        &[("B", 4)],
    );
    assert!(e.contains("unknown name `B`"), "{e}");
}

#[test]
fn a_bad_method_call_is_reported_at_the_method() {
    let e = error_of(
        "#[kernel] fn k(x: Ptr<f32>) {\n    let v = load(x);\n    let c = v.frobnicate(0);\n}",
        &[],
    );
    // `v` is at column 13, `frobnicate` at column 15.
    assert!(
        e.starts_with("line 3, column 15") && e.contains("frobnicate"),
        "{e}"
    );
}

#[test]
fn a_dtype_generic_kernel_binds_its_type_in_the_body() {
    let generic = r#"
#[kernel(T = [f32, bf16], B = [128])]
#[bind_types(T = bf16)]
fn scale<T, const B: usize>(x: Ptr<T>, out: Ptr<T>, n: i32) {
    let offs = arange(0, B);
    let v = load(x + offs, offs < n, 0.0 as T) as f32;
    store(out + offs, (v * 3.0) as T, offs < n);
}
"#;
    let concrete = r#"
#[kernel(B = [128])]
fn scale<const B: usize>(x: Ptr<bf16>, out: Ptr<bf16>, n: i32) {
    let offs = arange(0, B);
    let v = load(x + offs, offs < n, 0.0 as bf16) as f32;
    store(out + offs, (v * 3.0) as bf16, offs < n);
}
"#;
    let a = ptx_of(generic, &[("B", 128)], Target::Sm90);
    let b = ptx_of(concrete, &[("B", 128)], Target::Sm90);
    assert_eq!(a.ptx, b.ptx);
    let e = error_of(
        "#[kernel(B = [4])] fn k<T, const B: usize>(x: Ptr<T>) {}",
        &[("B", 4)],
    );
    assert!(e.contains("type parameter `T` has no listed dtypes"), "{e}");
    let e = error_of("#[kernel(T = [f32, f64])] fn k<T>(x: Ptr<T>) {}", &[]);
    assert!(e.contains("expected an element type"), "{e}");
}

#[test]
fn while_assembles_and_reports_bad_conditions() {
    let src = r#"
#[kernel(B = [128])]
fn k<const B: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let offs = arange(0, B);
    let mut acc = zeros::<f32>([B]);
    let mut h = zeros::<f16>([B]);
    let mut i = 0;
    while i * 2 < n {
        acc = acc + load(x + i * B + offs);
        h = h + (1.0 as f16);
        i += 1;
    }
    store(out + offs, acc + (h as f32));
}
"#;
    for target in [Target::Sm80, Target::Sm90] {
        let p = ptx_of(src, &[("B", 128)], target);
        assert!(p.ptx.contains("$L_while"), "{}", p.ptx);
        if let Ok(ptxas) = ptx::ptxas::find() {
            ptx::ptxas::assemble(&ptxas, &p, target).unwrap_or_else(|e| panic!("{e}"));
        }
    }
    let e = error_of(
        "#[kernel] fn k(x: Ptr<f32>) { let mut v = load(x); while v { v = v + 1.0; } }",
        &[],
    );
    assert!(e.contains("`while` condition is a scalar bool"), "{e}");
    let e = error_of(
        "#[kernel] fn k(x: Ptr<f32>) { while 1 < 2 { store(x, 1.0); } }",
        &[],
    );
    assert!(e.contains("run-time values"), "{e}");
}

#[test]
fn a_scalar_load_says_why_and_what_makes_it_wide() {
    // A bf16 GEMV row tile: with `k` of unknown divisibility the row starts are not
    // provably 16-byte aligned, so the loads are one element wide.
    let gemv = |k_decl: &str| {
        format!(
            r#"
#[kernel(N = [4], K = [256])]
fn gemv<const N: usize, const K: usize>(w: Ptr<bf16>, x: Ptr<bf16>, y: Ptr<f32>, n: i32, {k_decl}) {{
    let rows = program_id(0) * N + arange(0, N);
    let cols = arange(0, K);
    let mask = (rows.expand_dims(1) < n) & (cols.expand_dims(0) < k);
    let t = load(w + rows.expand_dims(1) * k + cols.expand_dims(0), mask, 0.0) as f32;
    let xv = load(x + cols, cols < k, 0.0) as f32;
    store(y + rows, (t * xv.expand_dims(0)).sum(1), rows < n);
}}
"#
        )
    };
    let consts = [("N", 4), ("K", 256)];
    let plain = ptx_of(&gemv("k: i32"), &consts, Target::Sm90);
    let w = &plain.accesses[0];
    assert_eq!(w.width, 1);
    let why = w.narrowed.as_deref().unwrap_or_default();
    assert!(
        why.contains("#[multiple_of(16)]") && why.contains("k"),
        "{why}"
    );
    let marked = ptx_of(&gemv("#[multiple_of(16)] k: i32"), &consts, Target::Sm90);
    let w = &marked.accesses[0];
    assert_eq!(w.width, 8, "{w:?}");
    assert_eq!(w.narrowed, None);
}

#[test]
fn every_documented_free_function_op_is_in_the_tile_op_table() {
    // `#[kernel]` treats a call of a name outside `TILE_OPS` as a helper call, so an op
    // missing from the table would not compile as `op(x)`. Every free function the
    // language documents (`src/lang.rs`: `pub fn name`, and the `math!` list) must be
    // in it, and every entry must be an op the lowering knows.
    let lang = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../src/lang.rs"))
        .expect("src/lang.rs");
    let mut names: Vec<String> = lang
        .lines()
        .filter_map(|l| l.strip_prefix("pub fn "))
        .map(|rest| {
            rest.chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect()
        })
        .collect();
    let math = lang.split("math! {").nth(1).expect("the math! list");
    let math = &math[..math.find("\n}").expect("end of math!")];
    names.extend(
        math.lines()
            .filter_map(|l| {
                l.trim()
                    .split_once(": \"")
                    .map(|(n, _)| n.trim().to_string())
            })
            .filter(|n| n.chars().all(|c| c.is_alphanumeric() || c == '_')),
    );
    assert!(names.len() > 30, "{names:?}");
    for n in &names {
        assert!(
            tilefuse_dsl::front::is_tile_op(n),
            "`{n}` is documented but not in TILE_OPS"
        );
    }
    for op in tilefuse_dsl::front::TILE_OPS {
        let src = format!("#[kernel] fn k(x: Ptr<f32>) {{ {op}(); }}");
        if let Err(e) = compile_source(&src, &spec(&[])) {
            let e = e.message;
            assert!(
                !e.contains("unknown op"),
                "`{op}` is in TILE_OPS but not lowered: {e}"
            );
        }
    }
}

/// A helper that returns a tuple (the tail `(a, b)`, or another helper's tuple), taken
/// apart by `let (..)`, with `_` and `mut`, and by a destructuring assignment in a loop.
const WITH_TUPLES: &str = r#"
#[kernel(B = [128])]
fn stats<const B: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32, k: i32) {
    let offs = program_id(0) * B + arange(0, B);
    let mask = offs < n;
    let v = load(x + offs, mask, 0.0);
    let (lo, hi, _) = bounds(v);
    let (mut a, mut b) = (v, v * 0.5);
    for _i in 0..k {
        (a, b) = step(a, b);
    }
    let (s, _) = (lo + hi, 7);
    store(out + offs, a + b + s, mask);
}
#[tile_fn]
fn bounds(v: Tile<f32>) -> (f32, f32, f32) {
    let hi = v.max(0);
    low_high(v, hi)
}
#[tile_fn]
fn low_high(v: Tile<f32>, hi: f32) -> (f32, f32, f32) {
    (v.min(0), hi, hi * 2.0)
}
#[tile_fn]
fn step(a: Tile<f32>, b: Tile<f32>) -> (Tile<f32>, Tile<f32>) {
    (b, a + b)
}
"#;

const TUPLES_INLINED: &str = r#"
#[kernel(B = [128])]
fn stats<const B: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32, k: i32) {
    let offs = program_id(0) * B + arange(0, B);
    let mask = offs < n;
    let v = load(x + offs, mask, 0.0);
    let hi = v.max(0);
    let lo = v.min(0);
    let _third = hi * 2.0;
    let mut a = v;
    let mut b = v * 0.5;
    for _i in 0..k {
        let t = a + b;
        a = b;
        b = t;
    }
    let s = lo + hi;
    let _seven = 7;
    store(out + offs, a + b + s, mask);
}
"#;

#[test]
fn tuple_results_compile_to_the_same_ptx_as_the_values_written_inline() {
    for target in [Target::Sm80, Target::Sm90] {
        let a = ptx_of(WITH_TUPLES, &[("B", 128)], target);
        let b = ptx_of(TUPLES_INLINED, &[("B", 128)], target);
        assert_eq!(a.ptx, b.ptx, "{target:?}");
    }
}

#[test]
fn tuple_mistakes_are_named() {
    let src = |body: &str| {
        format!("#[kernel] fn k(x: Ptr<f32>) {{\n    let v = load(x);\n    {body}\n}}\n#[tile_fn] fn two(v: f32) -> (f32, f32) {{ (v, v + 1.0) }}\n#[tile_fn] fn one(v: f32) -> f32 {{ v }}\n#[tile_fn] fn unit(p: Ptr<f32>) {{ store(p, 1.0); }}")
    };
    // A tuple helper used as one value points at its tuple.
    let e = error_of(&src("store(x, two(v));"), &[]);
    assert!(
        e.contains("returns a tuple")
            && e.contains("let (a, b) = two(..)")
            && e.starts_with("line 5"),
        "{e}"
    );
    // Counts that do not match.
    let e = error_of(&src("let (a, b, c) = two(v);"), &[]);
    assert!(
        e.contains("takes 3 values, the tuple has 2") && e.starts_with("line 3"),
        "{e}"
    );
    let e = error_of(&src("let mut a = v; (a, _, _) = two(v);"), &[]);
    assert!(
        e.contains("3 variables are assigned, the tuple has 2"),
        "{e}"
    );
    // Something that is not a tuple, and a helper that returns one value or nothing.
    let e = error_of(&src("let (a, b) = v;"), &[]);
    assert!(
        e.contains("expected a tuple") && e.starts_with("line 3"),
        "{e}"
    );
    let e = error_of(&src("let (a, b) = one(v);"), &[]);
    assert!(
        e.contains("expected a tuple") && e.starts_with("line 6"),
        "{e}"
    );
    let e = error_of(&src("let (a, b) = unit(x);"), &[]);
    assert!(e.contains("returns nothing, not a tuple"), "{e}");
    // Nested patterns, and assignment to an immutable name.
    let e = error_of(&src("let (a, (b, c)) = (v, (v, v));"), &[]);
    assert!(e.contains("a tuple pattern takes names and `_`"), "{e}");
    let e = error_of(&src("let a = v; (a, _) = two(v);"), &[]);
    assert!(
        e.contains("cannot assign twice to immutable variable `a`"),
        "{e}"
    );
}
