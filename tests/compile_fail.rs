//! Kernel-language mistakes are compile errors at the user's code (expected messages are
//! checked in next to each case).

#[test]
fn kernel_language_errors() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/compile_fail/*.rs");
}
