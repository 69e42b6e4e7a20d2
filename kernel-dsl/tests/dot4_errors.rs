//! Misuse of `dot4(a, b, acc)` is a compile error at the offending line: operands that
//! are not 32-bit integer words, an accumulator that is not `i32`, the wrong arity.

use tilefuse_dsl::{compile_source, Specialization};

fn error_of(body: &str) -> String {
    let src =
        format!("#[kernel] fn k(x: Ptr<f32>, i: Ptr<i32>, u: Ptr<u32>, b: Ptr<u8>) {{\n{body}\n}}");
    let spec = Specialization {
        consts: vec![],
        num_warps: 4,
    };
    match compile_source(&src, &spec) {
        Ok(_) => panic!("compiled: {body}"),
        Err(e) => e.message,
    }
}

#[track_caller]
fn check(body: &str, want: &[&str]) {
    let e = error_of(body);
    assert!(e.starts_with("line 2"), "not at the dot4's line: {e}");
    for w in want {
        assert!(e.contains(w), "`{body}` gave: {e}");
    }
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
    let e = error_of("store(i, dot4(load(u), load(i)));");
    assert!(e.starts_with("line 2") && e.contains("dot4"), "{e}");
}
