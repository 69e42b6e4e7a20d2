//! `tokenizer.json` loading, encode and decode, behind a small wrapper so the
//! rest of the engine does not depend on the tokenizer library's types.
//!
//! The library is built without its default features: the pure-Rust
//! `fancy-regex` backend replaces the onig C library (the GPT-2/Qwen/Llama 3
//! pre-tokenizer patterns need look-ahead, which fancy-regex provides), and
//! nothing is fetched from a hub.

use std::path::{Path, PathBuf};

use crate::error::{EngineError, Result};

/// A Hugging Face tokenizer loaded from `tokenizer.json`.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("path", &self.path)
            .field("vocab_size", &self.vocab_size())
            .finish()
    }
}

impl Tokenizer {
    /// Loads `dir/tokenizer.json`.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self> {
        Self::from_file(dir.as_ref().join("tokenizer.json"))
    }

    /// Loads a `tokenizer.json` file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        // Read it ourselves so a missing file is an I/O error naming the path.
        let bytes = std::fs::read(path).map_err(|source| EngineError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let inner =
            tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| EngineError::Tokenizer {
                path: path.to_path_buf(),
                message: e.to_string(),
            })?;
        Ok(Tokenizer {
            inner,
            path: path.to_path_buf(),
        })
    }

    /// A tokenizer from the text of a `tokenizer.json` held in memory (for example one
    /// built from a GGUF file's metadata); `origin` names its source in errors.
    pub fn from_json_bytes(bytes: &[u8], origin: impl AsRef<Path>) -> Result<Self> {
        let path = origin.as_ref().to_path_buf();
        let inner =
            tokenizers::Tokenizer::from_bytes(bytes).map_err(|e| EngineError::Tokenizer {
                path: path.clone(),
                message: e.to_string(),
            })?;
        Ok(Tokenizer { inner, path })
    }

    fn err(&self, e: impl std::fmt::Display) -> EngineError {
        EngineError::Tokenizer {
            path: self.path.clone(),
            message: e.to_string(),
        }
    }

    /// Token ids for `text`. `add_special_tokens` applies the tokenizer's
    /// post-processor (e.g. a leading bos for Llama 3).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, add_special_tokens)
            .map_err(|e| self.err(e))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text for `ids`, optionally dropping special tokens.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| self.err(e))
    }

    /// Number of tokens, including added (special) tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The id of a token string, such as `<|im_end|>`.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The file this tokenizer was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }
}
