//! Misuse of a tile op is a compile error at the offending line, saying what is wrong.
//! One module an op family, each compiling one-statement kernel bodies over its own
//! parameters:
//! - `scans_layouts_histogram_random`: the scans, `argmin`, layout changes, `histogram` and the random numbers.
//! - `bitcast`: `x.bitcast::<T>()`: widths that differ, `bool`, pointers, a missing target type.
//! - `dot4`: `dot4(a, b, acc)`: operands that are not 32-bit integer words, an accumulator that is not `i32`, the wrong arity.
//! - `unroll`: `.unroll(n)` on a loop range: a factor other than two, a body with a `dot` or an inner loop.
//! - `stages`: `.stages(n)` on a loop range: a count outside 0..=8 or not a compile-time constant, a body with a `dot` or an inner loop, together with `.unroll(2)`.
//! - `tensor_descriptors`: `make_tensor_descriptor` and `desc.load`: a base or size that is not a parameter, a last stride other than 1, a descriptor used as a value.

use tilefuse_dsl::{compile_source, Specialization};

/// The compile error of a kernel with `params` whose body is `body` (on line 2).
fn error_of(params: &str, body: &str) -> String {
    let src = format!("#[kernel] fn k({params}) {{\n{body}\n}}");
    let spec = Specialization {
        consts: vec![],
        num_warps: 4,
        num_stages: None,
    };
    match compile_source(&src, &spec) {
        Ok(_) => panic!("compiled: {body}"),
        Err(e) => e.message,
    }
}

/// `body` fails to compile at its own line with a message holding every `want`.
#[track_caller]
fn check_in(params: &str, body: &str, want: &[&str]) {
    let e = error_of(params, body);
    assert!(e.starts_with("line 2"), "not at the op's line: {e}");
    for w in want {
        assert!(e.contains(w), "`{body}` gave: {e}");
    }
}

mod scans_layouts_histogram_random {
    const PARAMS: &str = "x: Ptr<f32>, p: Ptr<i32>, s: i64";

    #[track_caller]
    fn check(body: &str, want: &[&str]) {
        super::check_in(PARAMS, body, want);
    }

    #[test]
    fn scan_misuse() {
        let v = "let v = load(x + arange(0, 8).expand_dims(1) * 8 + arange(0, 8).expand_dims(0));";
        check(
            &format!("{v} store(x, cumsum(v, 2).sum(0).sum(0));"),
            &["axis 2", "rank 2"],
        );
        check(
            "let b = arange(0, 8) < 3; store(p + arange(0, 8), cumsum(b, 0));",
            &["`cumsum` takes a tile of numbers", "bool"],
        );
        check(
            "store(x, cumprod(load(x), 0));",
            &["`cumprod` applies to tiles"],
        );
        check(
            "store(p, argmin(load(p + arange(0, 8)), 1));",
            &["axis 1 is out of range"],
        );
    }

    #[test]
    fn layout_change_misuse() {
        check(
            "store(p + arange(0, 8), trans(arange(0, 8)));",
            &["`trans(x)` transposes a 2-D tile", "permute"],
        );
        let v = "let v = arange(0, 8).expand_dims(1) + arange(0, 4).expand_dims(0);";
        check(
            &format!("{v} let t = permute(v, [0, 0]);"),
            &["not a permutation", "[0, 0]"],
        );
        check(
            &format!("{v} let t = permute(v, [1]);"),
            &["not a permutation"],
        );
        check(
            &format!("{v} let t = reshape(v, [3, 8]);"),
            &["powers of two", "3"],
        );
        check(
            &format!("{v} let t = reshape(v, [8]);"),
            &["keeps the number of elements", "32", "[8]"],
        );
    }

    #[test]
    fn histogram_misuse() {
        check(
            "let h = histogram(load(x + arange(0, 8)), 4);",
            &["`histogram` takes a 1-D tile of integers", "f32"],
        );
        check(
            "let h = histogram(arange(0, 8).expand_dims(0), 4);",
            &["1-D tile of integers"],
        );
        check(
            "let h = histogram(arange(0, 8), 12);",
            &["power of two", "12"],
        );
        check(
            "let h = histogram(arange(0, 8), 4, arange(0, 4) < 2);",
            &["mask", "does not match"],
        );
    }

    #[test]
    fn random_misuse() {
        check(
            "store(x + arange(0, 8), rand(1.5, arange(0, 8)));",
            &["seed", "i32, u32 or i64"],
        );
        check(
            "store(x + arange(0, 8), randn(s, arange(0, 8) as i64));",
            &["offsets", "i32 or u32"],
        );
        check(
            "store(x + arange(0, 8), rand(arange(0, 8), arange(0, 8)));",
            &["seed", "scalar"],
        );
    }
}

mod bitcast {
    use tilefuse_dsl::{compile_source, Specialization};

    const PARAMS: &str = "x: Ptr<f32>, h: Ptr<bf16>, p: Ptr<i64>";

    #[track_caller]
    fn check(body: &str, want: &[&str]) {
        super::check_in(PARAMS, body, want);
    }

    #[test]
    fn bitcast_widths_must_match() {
        check(
            "store(p, load(x).bitcast::<i64>());",
            &["from f32 (32 bits) to i64 (64 bits)", "use `as`"],
        );
        check(
            "store(x, load(h).bitcast::<f32>());",
            &["from bf16 (16 bits) to f32 (32 bits)"],
        );
        check(
            "store(x, (load(x) < 0.0).bitcast::<u8>() as f32);",
            &["from bool (1 bits) to u8 (8 bits)"],
        );
        check(
            "store(x, load(x).bitcast::<u8>() as f32);",
            &["from f32 (32 bits) to u8 (8 bits)"],
        );
    }

    #[test]
    fn bitcast_needs_a_type_and_a_value() {
        check("store(x, load(x).bitcast());", &["`x.bitcast::<T>()`"]);
        check(
            "store(x, x.bitcast::<i64>());",
            &["pointers cannot be bitcast"],
        );
        check(
            "store(x, load(x).bitcast::<f64>());",
            &["expected an element type"],
        );
    }

    #[test]
    fn bitcast_between_equal_widths_compiles() {
        let src = "#[kernel] fn k(x: Ptr<f32>, h: Ptr<bf16>, u: Ptr<u32>) {
            store(u, load(x).bitcast::<u32>());
            store(x, load(u).bitcast::<i32>().bitcast::<f32>());
            store(h, load(h).bitcast::<f16>().bitcast::<bf16>());
            store(x, load(x).bitcast::<f32>());
        }";
        let spec = Specialization {
            consts: vec![],
            num_warps: 4,
            num_stages: None,
        };
        compile_source(src, &spec).unwrap_or_else(|e| panic!("{e}"));
    }
}

mod dot4 {
    const PARAMS: &str = "x: Ptr<f32>, i: Ptr<i32>, u: Ptr<u32>, b: Ptr<u8>";

    #[track_caller]
    fn check(body: &str, want: &[&str]) {
        super::check_in(PARAMS, body, want);
    }

    #[test]
    fn dot4_takes_32_bit_integer_words() {
        check(
            "store(i, dot4(load(x), load(i), 0));",
            &["first operand of `dot4` is f32", "`.bitcast::<i32>()`"],
        );
        check(
            "store(i, dot4(load(u), load(b), 0));",
            &["second operand of `dot4` is u8", "i32", "u32"],
        );
        check(
            "store(i, dot4(load(u), load(i), load(x)));",
            &["accumulator of `dot4` is f32", "must be i32"],
        );
        check(
            "store(i, dot4(load(u), load(i), 0.5));",
            &["a float literal cannot be used as i32"],
        );
        check(
            "store(i, dot4(load(u), load(i), load(u)));",
            &["accumulator of `dot4` is u32"],
        );
    }

    #[test]
    fn dot4_takes_three_arguments() {
        let e = super::error_of(PARAMS, "store(i, dot4(load(u), load(i)));");
        assert!(e.starts_with("line 2") && e.contains("dot4"), "{e}");
    }
}

mod byte_perm {
    const PARAMS: &str = "x: Ptr<f32>, i: Ptr<i32>, u: Ptr<u32>, b: Ptr<u8>";

    #[track_caller]
    fn check(body: &str, want: &[&str]) {
        super::check_in(PARAMS, body, want);
    }

    #[test]
    fn byte_perm_takes_words_of_one_dtype() {
        check(
            "store(i, byte_perm(load(x), load(x), 0x3210));",
            &["first word of `byte_perm` is f32", "`.bitcast::<i32>()`"],
        );
        check(
            "store(u, byte_perm(load(u), load(i), 0x3210));",
            &[
                "second word of `byte_perm` is i32",
                "both u32",
                "`.bitcast::<u32>()`",
            ],
        );
        check(
            "store(u, byte_perm(load(u), load(b), 0x3210));",
            &["second word of `byte_perm` is u8"],
        );
        check(
            "store(u, byte_perm(load(u), 7, load(x)));",
            &["selector of `byte_perm` is f32", "i32 or u32"],
        );
        check(
            "store(u, byte_perm(load(u), 7, 0.5));",
            &["a float literal cannot be used as u32"],
        );
    }

    #[test]
    fn byte_perm_takes_three_arguments() {
        let e = super::error_of(PARAMS, "store(u, byte_perm(load(u), load(u)));");
        assert!(e.starts_with("line 2") && e.contains("byte_perm"), "{e}");
    }

    #[test]
    fn byte_perm_keeps_its_words_dtype() {
        // The result is the words' dtype: storing u32 words into an i32 buffer is an
        // error, a literal word takes the other's dtype.
        check("store(i, byte_perm(load(u), 0, 0x3210));", &["u32"]);
        let spec = tilefuse_dsl::Specialization {
            consts: vec![],
            num_warps: 4,
            num_stages: None,
        };
        let src = format!(
            "#[kernel]\nfn k({PARAMS}) {{ store(i, byte_perm(0x0102_0304, load(i), load(u))); store(u, byte_perm(load(u), 5, load(i))); }}"
        );
        tilefuse_dsl::compile_source(&src, &spec).unwrap_or_else(|e| panic!("{e}"));
    }
}

/// `.unroll(2)` on a `for` range: the only factor is two, and the body may not hold what
/// the code generator cannot emit twice.
mod unroll {
    const PARAMS: &str = "x: Ptr<f32>, a: Ptr<bf16>, n: i32";

    #[test]
    fn only_by_two() {
        for f in ["3", "1", "n"] {
            let body = format!("let mut s = 0.0; for i in (0..n).step_by(4).unroll({f}) {{ s += load(x + i); }} store(x, s);");
            super::check_in(PARAMS, &body, &["unroll by two only", "unroll(2)"]);
        }
    }

    #[test]
    fn not_around_a_dot_or_an_inner_loop() {
        let dot = "let mut acc = zeros::<f32>([16, 16]); for i in (0..n).step_by(16).unroll(2) { let t = load(a + i + arange(0, 16).expand_dims(1) * 16 + arange(0, 16).expand_dims(0)); acc = dot(t, t, acc); } store(x + arange(0, 16), acc.sum(1));";
        super::check_in(
            PARAMS,
            dot,
            &["`.unroll(2)` needs a loop body without a `dot`"],
        );
        let inner = "let mut s = 0.0; for i in (0..n).unroll(2) { for j in 0..n { s += load(x + i + j); } } store(x, s);";
        super::check_in(PARAMS, inner, &["without an inner loop"]);
    }

    #[test]
    fn an_unrolled_loop_compiles() {
        let src = "#[kernel] fn k(x: Ptr<f32>, y: Ptr<f32>, n: i32) {
            let offs = arange(0, 64);
            let mut cur = load(x + offs, offs < n, 0.0);
            let mut s = zeros::<f32>([64]);
            for k0 in (0..n).step_by(64).unroll(2) {
                let next = load(x + k0 + 64 + offs, k0 + 64 + offs < n, 0.0);
                s += cur;
                cur = next;
            }
            store(y + offs, s);
        }";
        let spec = tilefuse_dsl::Specialization {
            consts: vec![],
            num_warps: 2,
            num_stages: None,
        };
        tilefuse_dsl::compile_source(src, &spec).expect("compiles");
    }
}

/// `.stages(n)` on a `for` range (Triton's `tl.range(.., num_stages=n)`): a constant count
/// from 0 to 8 (0 and 1 leave the loop plain), on a loop the code generator can stage.
mod stages {
    const PARAMS: &str = "x: Ptr<f32>, a: Ptr<bf16>, n: i32";

    #[test]
    fn a_constant_from_zero_to_eight() {
        for f in ["9", "-1"] {
            let body = format!("let mut s = 0.0; for i in (0..n).step_by(4).stages({f}) {{ s += load(x + i); }} store(x, s);");
            super::check_in(PARAMS, &body, &["`.stages(n)` takes a count from 0 to 8"]);
        }
        let body = "let mut s = 0.0; for i in (0..n).step_by(4).stages(n) { s += load(x + i); } store(x, s);";
        super::check_in(PARAMS, body, &["must be a compile-time constant"]);
    }

    #[test]
    fn not_around_a_dot_an_inner_loop_or_an_unroll() {
        let dot = "let mut acc = zeros::<f32>([16, 16]); for i in (0..n).step_by(16).stages(3) { let t = load(a + i + arange(0, 16).expand_dims(1) * 16 + arange(0, 16).expand_dims(0)); acc = dot(t, t, acc); } store(x + arange(0, 16), acc.sum(1));";
        super::check_in(
            PARAMS,
            dot,
            &["`.stages(n)` needs a loop without a `dot`", "num_stages"],
        );
        let inner = "let mut s = 0.0; for i in (0..n).stages(2) { for j in 0..n { s += load(x + i + j); } } store(x, s);";
        super::check_in(PARAMS, inner, &["without an inner loop"]);
        let both = "let mut s = 0.0; for i in (0..n).unroll(2).stages(2) { s += load(x + i); } store(x, s);";
        super::check_in(PARAMS, both, &["without `.unroll(2)`"]);
    }

    #[test]
    fn a_staged_loop_compiles() {
        let src = "#[kernel] fn k(x: Ptr<f32>, y: Ptr<f32>, n: i32) {
            let offs = arange(0, 64);
            let mut s = zeros::<f32>([64]);
            for k0 in (0..n).step_by(64).stages(4) {
                s += load(x + k0 + offs, k0 + offs < n);
            }
            store(y + offs, s);
        }";
        let spec = tilefuse_dsl::Specialization {
            consts: vec![],
            num_warps: 2,
            num_stages: None,
        };
        tilefuse_dsl::compile_source(src, &spec).expect("compiles");
    }
}

/// `make_tensor_descriptor(ptr, [rows, cols], [row_stride, 1], [BR, BC])` and
/// `desc.load([r, c])`: the host encodes the copy engine's map from the launch's
/// arguments, so the base and sizes must be parameters (or constants).
mod tensor_descriptors {
    const PARAMS: &str = "a: Ptr<bf16>, x: Ptr<f32>, m: i32, k: i32";

    #[test]
    fn base_and_sizes_are_parameters() {
        super::check_in(
            PARAMS,
            "let d = make_tensor_descriptor(a + 16, [m, k], [k, 1], [16, 16]);",
            &["base of a tensor descriptor must be one of the kernel's pointer parameters"],
        );
        super::check_in(
            PARAMS,
            "let d = make_tensor_descriptor(a, [m - 1, k], [k, 1], [16, 16]);",
            &["the row count of a tensor descriptor must be an integer parameter"],
        );
        super::check_in(
            PARAMS,
            "let d = make_tensor_descriptor(a, [m, k], [k * 2, 1], [16, 16]);",
            &["the row stride of a tensor descriptor must be an integer parameter"],
        );
    }

    #[test]
    fn shapes_strides_and_blocks() {
        super::check_in(
            PARAMS,
            "let d = make_tensor_descriptor(a, [m, k], [k, m], [16, 16]);",
            &["one stride of a tensor descriptor must be 1"],
        );
        super::check_in(
            PARAMS,
            "let d = make_tensor_descriptor(a, [m, k, k], [k, 1], [16, 16]);",
            &["descriptors are two-dimensional"],
        );
        super::check_in(
            PARAMS,
            "let d = make_tensor_descriptor(a, [m, k], [k, 1], [16, 12]);",
            &["powers of two"],
        );
        super::check_in(
            PARAMS,
            "let d = make_tensor_descriptor(a, [m, k], [k, 1]);",
            &["`make_tensor_descriptor` takes 4 arguments"],
        );
    }

    #[test]
    fn a_descriptor_is_not_a_value() {
        super::check_in(
            PARAMS,
            "let d = make_tensor_descriptor(a, [m, k], [k, 1], [16, 16]); let t = d + 1;",
            &[
                "`d` is a tensor descriptor, not a value",
                "d.load([row, col])",
            ],
        );
        super::check_in(
            PARAMS,
            "let d = make_tensor_descriptor(a, [m, k], [k, 1], [16, 16]); let t = d.store([0, 0]);",
            &["one method, `load([row, col])`"],
        );
        super::check_in(
            PARAMS,
            "let t = make_tensor_descriptor(a, [m, k], [k, 1], [16, 16]).load([0, 0]);",
            &["bind a tensor descriptor with `let`"],
        );
        super::check_in(
            PARAMS,
            "let d = make_tensor_descriptor(a, [m, k], [k, 1], [16, 16]); let t = d.load(0, 0);",
            &["`desc.load([row, col])`"],
        );
    }
}

/// `max_registers(N, NAME = v, ..)` in the attribute: a limit from 16 to 255 for the
/// variants the pairs select (checked as `skip`'s), applied to their PTX's `.maxnreg`.
mod max_registers {
    use tilefuse_dsl::{compile_source, Specialization};

    const SRC: &str =
        "fn k<const B: usize>(x: Ptr<f32>) { store(x + arange(0, B), zeros::<f32>([B])); }";

    fn compile(attr: &str, b: i64) -> Result<tilefuse_dsl::ir::Kernel, String> {
        let spec = Specialization {
            consts: vec![("B".into(), b)],
            num_warps: 4,
            num_stages: None,
        };
        compile_source(&format!("#[kernel({attr})] {SRC}"), &spec).map_err(|e| e.message)
    }

    #[test]
    fn the_selected_variants_take_the_limit() {
        let attr = "B = [64, 128], num_warps = [4], max_registers(80, B = 128)";
        assert_eq!(compile(attr, 128).unwrap().max_registers, Some(80));
        assert_eq!(compile(attr, 64).unwrap().max_registers, None);
        let all = "B = [64, 128], max_registers(96)";
        assert_eq!(compile(all, 64).unwrap().max_registers, Some(96));
    }

    #[test]
    fn a_limit_out_of_range_or_an_unknown_name_is_an_error() {
        let e = compile("B = [64], max_registers(8)", 64).unwrap_err();
        assert!(
            e.contains("max_registers must be from 16 to 255, got 8"),
            "{e}"
        );
        let e = compile("B = [64], max_registers(80, C = 1)", 64).unwrap_err();
        assert!(e.contains("`max_registers` names `C`"), "{e}");
        let e = compile("B = [64], max_registers(80, B = 32)", 64).unwrap_err();
        assert!(e.contains("`max_registers` selects B = 32"), "{e}");
    }
}
