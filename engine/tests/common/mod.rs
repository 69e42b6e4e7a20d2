//! Fixture helpers shared by the engine's integration tests, and the kernel tests'
//! helpers (`kernel_checks`).

#![allow(dead_code)]

pub mod kernel_checks;

use std::path::{Path, PathBuf};

/// The repository's `tests/fixtures`, found at run time (see
/// [`tilefuse_dsl::runtime::testing::fixture_path`]), so staged test binaries find it too.
pub fn fixtures_dir() -> PathBuf {
    tilefuse_dsl::runtime::testing::fixture_path("tests/fixtures").unwrap_or_else(|e| panic!("{e}"))
}

/// A fixture's `reference.json`: prompt, greedy continuation and the logits each
/// token was chosen from.
pub struct Reported {
    pub prompt_ids: Vec<u32>,
    pub tokens: Vec<u32>,
    pub logits: Vec<Vec<f32>>,
}

pub fn read_reference(dir: &Path) -> Reported {
    let path = dir.join("reference.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let ids = |k: &str| -> Vec<u32> {
        v[k].as_array()
            .unwrap_or_else(|| panic!("{}: no `{k}`", path.display()))
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    let logits = v["logits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            row.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect()
        })
        .collect();
    Reported {
        prompt_ids: ids("prompt_ids"),
        tokens: ids("tokens"),
        logits,
    }
}

pub fn norm(v: impl Iterator<Item = f32>) -> f32 {
    v.map(|x| x * x).sum::<f32>().sqrt()
}

/// `‖a − b‖ / ‖b‖`.
pub fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    norm(a.iter().zip(b).map(|(x, y)| x - y)) / norm(b.iter().copied())
}

/// Encodes and decodes every case of a `tokenizer/expected.json` fixture (made with the
/// tokenizers library's Python build by `scripts/make_fixtures.py`) and compares: the
/// ids for each text, and the text decoded back from them. Returns the ids of every case.
pub fn check_tokenizer_cases(tok: &tilefuse_engine::Tokenizer, expected: &Path) -> Vec<Vec<u32>> {
    let text =
        std::fs::read_to_string(expected).unwrap_or_else(|e| panic!("{}: {e}", expected.display()));
    let expected: serde_json::Value = serde_json::from_str(&text).unwrap();
    let cases = expected["cases"].as_array().unwrap();
    assert!(cases.len() >= 5);
    let mut all = Vec::new();
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
        all.push(ids);
    }
    all
}
