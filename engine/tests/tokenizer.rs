//! `tokenizer.json` encode/decode against the tokenizer library's Python
//! build (`tests/fixtures/tokenizer/`, made by `scripts/make_fixtures.py`).

mod common;

use std::path::PathBuf;

use tilefuse_engine::{EngineError, Tokenizer};

fn fixture() -> PathBuf {
    common::fixtures_dir().join("tokenizer")
}

#[test]
fn encodes_and_decodes_like_python() {
    let dir = fixture();
    let tok = Tokenizer::from_dir(&dir).unwrap();
    assert_eq!(tok.token_to_id("<|endoftext|>"), Some(0));
    for ids in common::check_tokenizer_cases(&tok, &dir.join("expected.json")) {
        assert!(ids.iter().all(|&i| (i as usize) < tok.vocab_size()));
    }
}

#[test]
fn bad_tokenizer_files_are_named() {
    let dir = std::env::temp_dir().join(format!("tilefuse-engine-{}-tok", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let e = Tokenizer::from_dir(&dir).unwrap_err();
    assert!(
        matches!(e, EngineError::Io { .. }) && e.to_string().contains("tokenizer.json"),
        "{e}"
    );
    std::fs::write(dir.join("tokenizer.json"), "{\"model\": 3}").unwrap();
    let e = Tokenizer::from_dir(&dir).unwrap_err().to_string();
    assert!(
        e.contains("tokenizer.json") && e.contains("tokenizer error"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
