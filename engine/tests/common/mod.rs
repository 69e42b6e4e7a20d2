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
    let json = Json::read(&dir.join("reference.json"));
    Reported {
        prompt_ids: json.u32s("prompt_ids"),
        tokens: json.u32s("tokens"),
        logits: json.f32_rows("logits"),
    }
}

/// A fixture's JSON file, read for its typed fields; a missing or mistyped field panics
/// naming the file and the key.
pub struct Json {
    path: PathBuf,
    v: serde_json::Value,
}

impl Json {
    pub fn read(path: &Path) -> Json {
        let text =
            std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        Json {
            path: path.to_path_buf(),
            v,
        }
    }

    fn array<'a>(&self, v: &'a serde_json::Value, key: &str) -> &'a Vec<serde_json::Value> {
        v.as_array()
            .unwrap_or_else(|| panic!("{}: `{key}` is not an array", self.path.display()))
    }

    fn number(&self, v: &serde_json::Value, key: &str) -> f64 {
        v.as_f64()
            .unwrap_or_else(|| panic!("{}: `{key}` holds a non-number", self.path.display()))
    }

    /// `key` as token ids.
    pub fn u32s(&self, key: &str) -> Vec<u32> {
        self.array(&self.v[key], key)
            .iter()
            .map(|x| self.number(x, key) as u32)
            .collect()
    }

    /// `key` as a list of numbers.
    pub fn f32s(&self, key: &str) -> Vec<f32> {
        self.array(&self.v[key], key)
            .iter()
            .map(|x| self.number(x, key) as f32)
            .collect()
    }

    /// `key` as a list of rows of numbers.
    pub fn f32_rows(&self, key: &str) -> Vec<Vec<f32>> {
        self.array(&self.v[key], key)
            .iter()
            .map(|row| {
                self.array(row, key)
                    .iter()
                    .map(|x| self.number(x, key) as f32)
                    .collect()
            })
            .collect()
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

/// The order every stamped layer's timeline keeps ([`tilefuse_engine::Decoder::timeline`]):
/// each launch has programs, each program's stamps run entry <= past wait <= exit, and
/// no program gets past its wait before the last program of the launch before it has
/// exited (on the GPU too, where launches overlap). `dev` names the device in failures.
pub fn check_timeline_order(run: &tilefuse_engine::decode::Timeline, dev: &str) {
    for pair in run.launches.windows(2) {
        let last_exit = pair[0].programs.iter().map(|p| p.exit).max().unwrap();
        let first_past = pair[1].programs.iter().map(|p| p.past_wait).min().unwrap();
        assert!(
            first_past >= last_exit,
            "{dev}: a {} ({:?}) program got past its wait at {first_past} ns, before the \
             last {} ({:?}) program exited at {last_exit} ns",
            pair[1].kernel,
            pair[1].block,
            pair[0].kernel,
            pair[0].block
        );
    }
    for l in &run.launches {
        assert!(
            !l.programs.is_empty(),
            "{dev}: {} ({:?})",
            l.kernel,
            l.block
        );
        for p in &l.programs {
            assert!(p.entry >= 0 && p.entry <= p.past_wait && p.past_wait <= p.exit);
        }
    }
}
