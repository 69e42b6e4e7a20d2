//! `tokenizer.json` encode/decode against the tokenizer library's Python
//! build (`tests/fixtures/tokenizer/`, made by `scripts/make_fixtures.py`).

use std::path::{Path, PathBuf};

use tilefuse_engine::{EngineError, Tokenizer};

fn fixture() -> PathBuf {
    let from_manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tokenizer");
    if from_manifest.is_dir() {
        return from_manifest;
    }
    let cwd = std::env::current_dir().unwrap();
    cwd.ancestors()
        .map(|d| d.join("tests/fixtures/tokenizer"))
        .find(|d| d.is_dir())
        .unwrap_or_else(|| panic!("tests/fixtures/tokenizer not found above {}", cwd.display()))
}

#[test]
fn encodes_and_decodes_like_python() {
    let dir = fixture();
    let tok = Tokenizer::from_dir(&dir).unwrap();
    assert_eq!(tok.token_to_id("<|endoftext|>"), Some(0));
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let cases = expected["cases"].as_array().unwrap();
    assert!(cases.len() >= 5);
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let ids: Vec<u32> = case["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(tok.encode(text, true).unwrap(), ids, "encoding {text:?}");
        assert_eq!(
            tok.decode(&ids, false).unwrap(),
            case["decoded"].as_str().unwrap()
        );
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
