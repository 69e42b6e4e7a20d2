//! The tokenizer of a GGUF file: `tokenizer.ggml.*` metadata turned into the
//! `tokenizer.json` the `tokenizers` library reads, or a `tokenizer.json` beside the file.
//!
//! Two kinds are built from metadata:
//!
//! - Byte-level BPE (`tokenizer.ggml.model = "gpt2"`, which Qwen2/Qwen3 and Llama 3
//!   use). The pre-tokenizer's split pattern follows `tokenizer.ggml.pre`: `qwen2`,
//!   `llama-bpe` (Llama 3), or the GPT-2 pattern for `gpt-2`/`default`/absent; any
//!   other value is an error naming it.
//! - SentencePiece BPE (`"llama"`: Llama 1/2, TinyLlama, Mistral v0.1), as
//!   SentencePiece encodes: spaces become `▁`, one is prepended
//!   (`tokenizer.ggml.add_space_prefix`, default on), adjacent pieces merge highest
//!   score first (`tokenizer.ggml.scores`; the merge list is derived from them), and
//!   characters outside the vocabulary fall back to their UTF-8 bytes' `<0xXX>` tokens.
//!   Checked against SentencePiece itself on `tests/fixtures/gguf/tiny_spm.gguf`.
//!
//! Tokens of type 3 (control) become special added tokens, type 4 (user-defined) plain
//! added tokens, and `tokenizer.ggml.add_bos_token` (default on for SentencePiece) adds
//! a post-processor that prepends the bos token.

use std::path::Path;

use serde_json::{json, Map, Value};

use super::{GgufFile, MetaValue};
use crate::error::Result;
use crate::tokenizer::Tokenizer;

/// Qwen2's split pattern (single digits).
const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Llama 3's split pattern (digits in threes).
const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

impl GgufFile {
    /// The tokenizer: `tokenizer.json` beside the file if there is one, else one built
    /// from the metadata; `None` when the file has no `tokenizer.ggml.tokens`.
    pub fn tokenizer(&self) -> Result<Option<Tokenizer>> {
        if let Some(dir) = self.path().parent() {
            let beside = dir.join("tokenizer.json");
            if beside.is_file() {
                return Tokenizer::from_file(beside).map(Some);
            }
        }
        self.tokenizer_from_metadata()
    }

    /// The tokenizer built from `tokenizer.ggml.*` alone (ignoring any file beside it).
    pub fn tokenizer_from_metadata(&self) -> Result<Option<Tokenizer>> {
        let Some(json) = self.tokenizer_json()? else {
            return Ok(None);
        };
        let text = serde_json::to_vec(&json).expect("a JSON value serializes");
        Tokenizer::from_json_bytes(&text, self.path()).map(Some)
    }

    /// The `tokenizer.json` value the metadata describes (see the module docs).
    pub fn tokenizer_json(&self) -> Result<Option<Value>> {
        let Some(tokens) = self.get("tokenizer.ggml.tokens") else {
            return Ok(None);
        };
        let model = self.opt_str("tokenizer.ggml.model")?.unwrap_or("gpt2");
        let sentencepiece = match model {
            "gpt2" => false,
            "llama" => true,
            _ => {
                return Err(self.error(format!(
                    "tokenizer.ggml.model is `{model}`: only byte-level BPE (`gpt2`) and SentencePiece BPE (`llama`) are built from GGUF metadata; put a tokenizer.json beside the file"
                )))
            }
        };
        let strings = |key: &str, v: &MetaValue| -> Result<Vec<String>> {
            let items = v.as_array().ok_or_else(|| {
                self.error(format!(
                    "metadata `{key}` is {}, expected an array of strings",
                    v.type_name()
                ))
            })?;
            items
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    s.as_str().map(str::to_string).ok_or_else(|| {
                        self.error(format!(
                            "metadata `{key}`[{i}] is {}, expected a string",
                            s.type_name()
                        ))
                    })
                })
                .collect()
        };
        let tokens = strings("tokenizer.ggml.tokens", tokens)?;
        let types = self
            .per_token(
                "tokenizer.ggml.token_type",
                tokens.len(),
                "an integer",
                MetaValue::as_u64,
            )?
            .unwrap_or_else(|| vec![1; tokens.len()]);

        let mut vocab = Map::new();
        let mut added = Vec::new();
        for (id, (tok, &ty)) in tokens.iter().zip(&types).enumerate() {
            vocab.insert(tok.clone(), json!(id));
            // SentencePiece's unknown piece is special too, as in transformers' Llama
            // tokenizers.
            let special = ty == 3 || (sentencepiece && ty == 2);
            if special || ty == 4 {
                added.push(json!({
                    "id": id, "content": tok, "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": special,
                }));
            }
        }
        if sentencepiece {
            return self
                .sentencepiece_json(&tokens, &types, vocab, added)
                .map(Some);
        }
        let merges = match self.get("tokenizer.ggml.merges") {
            Some(v) => strings("tokenizer.ggml.merges", v)?,
            None => Vec::new(),
        };
        let merges: Vec<Value> = merges
            .iter()
            .enumerate()
            .map(|(i, m)| match m.split_once(' ') {
                Some((a, b)) => Ok(json!([a, b])),
                None => Err(self.error(format!(
                    "tokenizer.ggml.merges[{i}] is `{m}`, expected two tokens separated by a space"
                ))),
            })
            .collect::<Result<_>>()?;

        let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": use_regex, "use_regex": use_regex});
        let split = |pattern: &str| {
            json!({"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false},
                byte_level(false),
            ]})
        };
        let pre = self.opt_str("tokenizer.ggml.pre")?;
        let pre_tokenizer = match pre {
            None | Some("default" | "gpt-2" | "gpt2") => byte_level(true),
            Some("qwen2") => split(QWEN2_PATTERN),
            Some("llama-bpe" | "llama3") => split(LLAMA3_PATTERN),
            Some(other) => {
                return Err(self.error(format!(
                    "tokenizer.ggml.pre is `{other}` (supported: qwen2, llama-bpe, gpt-2, default); put a tokenizer.json beside the file"
                )))
            }
        };

        let post_processor = self.bos_post_processor(&tokens, false)?;
        Ok(Some(json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "normalizer": null,
            "pre_tokenizer": pre_tokenizer,
            "post_processor": post_processor,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {
                "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                "ignore_merges": false, "vocab": vocab, "merges": merges,
            },
        })))
    }
}

impl GgufFile {
    /// The post-processor that prepends the bos token when `tokenizer.ggml.add_bos_token`
    /// says so (`default` when absent), or JSON null.
    fn bos_post_processor(&self, tokens: &[String], default: bool) -> Result<Value> {
        let add_bos = self
            .opt_bool("tokenizer.ggml.add_bos_token")?
            .unwrap_or(default);
        let bos = self.opt_u64("tokenizer.ggml.bos_token_id")?;
        let (true, Some(bos)) = (add_bos, bos) else {
            return Ok(Value::Null);
        };
        let Some(bos_tok) = tokens.get(bos as usize) else {
            return Err(self.error(format!(
                "tokenizer.ggml.bos_token_id {bos} is past the {} tokens",
                tokens.len()
            )));
        };
        Ok(json!({
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos_tok, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos_tok, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": bos_tok, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos_tok.clone(): {"id": bos_tok, "ids": [bos], "tokens": [bos_tok]}},
        }))
    }

    /// The array `key` holding one value a token (`tokens` of them), each read by
    /// `read` (`what` names the expected kind in errors); `None` when absent.
    fn per_token<T>(
        &self,
        key: &str,
        tokens: usize,
        what: &str,
        read: impl Fn(&MetaValue) -> Option<T>,
    ) -> Result<Option<Vec<T>>> {
        let items = match self.get(key) {
            None => return Ok(None),
            Some(MetaValue::Array(a)) => a,
            Some(other) => {
                return Err(self.error(format!(
                    "metadata `{key}` is {}, expected an array",
                    other.type_name()
                )))
            }
        };
        if items.len() != tokens {
            return Err(self.error(format!(
                "{key} has {} entries for {tokens} tokens",
                items.len()
            )));
        }
        items
            .iter()
            .enumerate()
            .map(|(i, v)| {
                read(v).ok_or_else(|| {
                    self.error(format!(
                        "metadata `{key}`[{i}] is {}, expected {what}",
                        v.type_name()
                    ))
                })
            })
            .collect::<Result<_>>()
            .map(Some)
    }

    /// The `tokenizer.json` of a SentencePiece BPE vocabulary (`tokenizer.ggml.model =
    /// "llama"`): see the module docs.
    fn sentencepiece_json(
        &self,
        tokens: &[String],
        types: &[u64],
        vocab: Map<String, Value>,
        added: Vec<Value>,
    ) -> Result<Value> {
        let scores = self
            .per_token("tokenizer.ggml.scores", tokens.len(), "a number", MetaValue::as_f64)?
            .ok_or_else(|| {
                self.error(
                    "a SentencePiece tokenizer (`tokenizer.ggml.model = llama`) needs `tokenizer.ggml.scores`",
                )
            })?;
        if self
            .opt_bool("tokenizer.ggml.remove_extra_whitespaces")?
            .unwrap_or(false)
        {
            return Err(self.error(
                "tokenizer.ggml.remove_extra_whitespaces is true, which is not built from GGUF metadata; put a tokenizer.json beside the file",
            ));
        }
        let unk = match self.opt_u64("tokenizer.ggml.unknown_token_id")? {
            Some(id) => match tokens.get(id as usize) {
                Some(t) => Value::String(t.clone()),
                None => {
                    return Err(self.error(format!(
                        "tokenizer.ggml.unknown_token_id {id} is past the {} tokens",
                        tokens.len()
                    )))
                }
            },
            None => Value::Null,
        };
        let add_prefix = self
            .opt_bool("tokenizer.ggml.add_space_prefix")?
            .unwrap_or(true);
        let merges = sentencepiece_merges(tokens, types, &scores);
        let mut normalizers = Vec::new();
        if add_prefix {
            normalizers.push(json!({"type": "Prepend", "prepend": "\u{2581}"}));
        }
        normalizers
            .push(json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"}));
        let mut decoders = vec![
            json!({"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "}),
            json!({"type": "ByteFallback"}),
            json!({"type": "Fuse"}),
        ];
        if add_prefix {
            decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
        }
        Ok(json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "normalizer": {"type": "Sequence", "normalizers": normalizers},
            "pre_tokenizer": null,
            "post_processor": self.bos_post_processor(tokens, true)?,
            "decoder": {"type": "Sequence", "decoders": decoders},
            "model": {
                "type": "BPE", "dropout": null, "unk_token": unk, "continuing_subword_prefix": null,
                "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true,
                "ignore_merges": false, "vocab": vocab, "merges": merges,
            },
        }))
    }
}

/// The merge list that makes BPE encode as SentencePiece's BPE does: SentencePiece
/// merges the adjacent pair whose concatenation is the highest-scoring normal piece
/// (type 1), so every split of a normal piece into two normal pieces is a merge,
/// ranked by the piece's score (highest first; ties by id, as their scores are
/// distinct in trained vocabularies).
fn sentencepiece_merges(tokens: &[String], types: &[u64], scores: &[f64]) -> Vec<Value> {
    let normal = |id: usize| types[id] == 1;
    let index: std::collections::HashMap<&str, usize> = tokens
        .iter()
        .enumerate()
        .filter(|&(id, _)| normal(id))
        .map(|(id, t)| (t.as_str(), id))
        .collect();
    let mut merges = Vec::new();
    for (id, piece) in tokens.iter().enumerate().filter(|&(id, _)| normal(id)) {
        for (at, _) in piece.char_indices().skip(1) {
            let (l, r) = piece.split_at(at);
            if let (Some(&li), Some(&ri)) = (index.get(l), index.get(r)) {
                merges.push((scores[id], id, li, ri));
            }
        }
    }
    merges.sort_by(|a, b| {
        b.0.total_cmp(&a.0)
            .then((a.1, a.2, a.3).cmp(&(b.1, b.2, b.3)))
    });
    merges
        .into_iter()
        .map(|(_, _, l, r)| json!([tokens[l], tokens[r]]))
        .collect()
}

/// Whether `path` names a GGUF file (by its extension).
pub fn is_gguf_path(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}
