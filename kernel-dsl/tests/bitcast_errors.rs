//! Misuse of `x.bitcast::<T>()` is a compile error at the offending line: widths that
//! differ, `bool`, pointers, a missing target type.

use tilefuse_dsl::{compile_source, Specialization};

fn error_of(body: &str) -> String {
    let src = format!("#[kernel] fn k(x: Ptr<f32>, h: Ptr<bf16>, p: Ptr<i64>) {{\n{body}\n}}");
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
    assert!(e.starts_with("line 2"), "not at the bitcast's line: {e}");
    for w in want {
        assert!(e.contains(w), "`{body}` gave: {e}");
    }
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
    };
    compile_source(src, &spec).unwrap_or_else(|e| panic!("{e}"));
}
