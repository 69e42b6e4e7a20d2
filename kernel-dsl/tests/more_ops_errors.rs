//! Misuse of the scans, `argmin`, layout changes, `histogram` and the random numbers is
//! a compile error at the offending line, saying what is wrong.

use tilefuse_dsl::{compile_source, Specialization};

fn error_of(body: &str) -> String {
    let src = format!("#[kernel] fn k(x: Ptr<f32>, p: Ptr<i32>, s: i64) {{\n{body}\n}}");
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
    assert!(e.starts_with("line 2"), "not at the op's line: {e}");
    for w in want {
        assert!(e.contains(w), "`{body}` gave: {e}");
    }
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
