//! Command-line values the measuring examples share.

/// The value after `flag` on the command line (`--flag VALUE`), if any.
pub fn value(flag: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1).cloned())
}
