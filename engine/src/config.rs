//! Model configuration: `config.json` (and optional `generation_config.json`)
//! as written by transformers 4.x and 5.x, normalized into [`ModelConfig`].
//!
//! transformers 4.x writes `rope_theta` at the top level and scaling under
//! `rope_scaling`; 5.x writes both under `rope_parameters`. Both are accepted.
//! Defaults for absent fields follow the transformers config classes.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::error::{EngineError, Result};

/// The model families the engine implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// `Qwen3ForCausalLM`: RMSNorm on q and k per head, no q/k/v bias.
    Qwen3,
    /// `Qwen2ForCausalLM` (also Qwen2.5): bias on q/k/v projections.
    Qwen2,
    /// `LlamaForCausalLM` (Llama 3.x), optionally with llama3 rope scaling.
    Llama,
}

impl Arch {
    /// The `architectures` string transformers writes for this family.
    pub fn hf_name(self) -> &'static str {
        match self {
            Arch::Qwen3 => "Qwen3ForCausalLM",
            Arch::Qwen2 => "Qwen2ForCausalLM",
            Arch::Llama => "LlamaForCausalLM",
        }
    }
}

/// How rotary frequencies are adjusted for long context.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE: `inv_freq[i] = theta^(-2i/head_dim)`.
    None,
    /// Llama 3.1-style frequency-dependent scaling.
    Llama3 {
        /// Divisor applied to low frequencies.
        factor: f64,
        /// Wavelengths longer than `original / low_freq_factor` are scaled fully.
        low_freq_factor: f64,
        /// Wavelengths shorter than `original / high_freq_factor` are untouched.
        high_freq_factor: f64,
        /// Context length the model was pretrained with.
        original_max_position_embeddings: usize,
    },
}

/// A model's shape and numerics, independent of the checkpoint's format.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// Model family.
    pub arch: Arch,
    /// Residual stream width.
    pub hidden_size: usize,
    /// Number of decoder layers.
    pub num_layers: usize,
    /// Number of query heads.
    pub num_heads: usize,
    /// Number of key/value heads (GQA when fewer than `num_heads`, MQA at 1).
    pub num_kv_heads: usize,
    /// Width of one attention head.
    pub head_dim: usize,
    /// MLP hidden width.
    pub intermediate_size: usize,
    /// Vocabulary size (rows of the embedding and LM head).
    pub vocab_size: usize,
    /// Epsilon inside every RMSNorm.
    pub rms_norm_eps: f64,
    /// RoPE base.
    pub rope_theta: f64,
    /// RoPE frequency scaling.
    pub rope_scaling: RopeScaling,
    /// Whether the LM head reuses the embedding matrix.
    pub tie_word_embeddings: bool,
    /// Whether q/k/v projections carry a bias.
    pub qkv_bias: bool,
    /// Whether the output projection carries a bias (`attention_bias` in
    /// Qwen3 and Llama configs; never in Qwen2).
    pub o_bias: bool,
    /// Whether q and k get a per-head RMSNorm before RoPE (Qwen3).
    pub qk_norm: bool,
    /// Longest context the model was configured for.
    pub max_position_embeddings: usize,
    /// Beginning-of-sequence token, if any.
    pub bos_token_id: Option<u32>,
    /// End-of-sequence tokens (generation stops at any of them).
    pub eos_token_ids: Vec<u32>,
}

impl ModelConfig {
    /// Total query width, `num_heads * head_dim`.
    pub fn q_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }

    /// Total key (and value) width, `num_kv_heads * head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// This config as a transformers 4.x-style `config.json` value (top-level
    /// `rope_theta`, `rope_scaling`), which [`ModelConfig::from_json_str`]
    /// reads back to an equal config.
    pub fn to_hf_json(&self) -> Value {
        let rope_scaling = match self.rope_scaling {
            RopeScaling::None => Value::Null,
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => serde_json::json!({
                "rope_type": "llama3",
                "factor": factor,
                "low_freq_factor": low_freq_factor,
                "high_freq_factor": high_freq_factor,
                "original_max_position_embeddings": original_max_position_embeddings,
            }),
        };
        let eos = match self.eos_token_ids.as_slice() {
            [] => Value::Null,
            [one] => Value::from(*one),
            many => Value::from(many.to_vec()),
        };
        // Qwen2 always has q/k/v bias; for the others it is `attention_bias`.
        let attention_bias = match self.arch {
            Arch::Qwen2 => false,
            _ => self.qkv_bias,
        };
        serde_json::json!({
            "architectures": [self.arch.hf_name()],
            "hidden_act": "silu",
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": rope_scaling,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": attention_bias,
            "max_position_embeddings": self.max_position_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos,
            "torch_dtype": "bfloat16",
        })
    }

    /// Reads `dir/config.json` and, if present, `dir/generation_config.json`
    /// (whose eos/bos ids take precedence, as in transformers' `generate`).
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let path = dir.join("config.json");
        let text = read_text(&path)?;
        let mut cfg = Self::from_json_str(&text, &path)?;
        let gen_path = dir.join("generation_config.json");
        if gen_path.exists() {
            let text = read_text(&gen_path)?;
            cfg.apply_generation_config(&text, &gen_path)?;
        }
        Ok(cfg)
    }

    /// Parses the text of a `config.json`; `path` is only used in errors.
    pub fn from_json_str(text: &str, path: &Path) -> Result<Self> {
        let root = parse_object(text, path)?;
        let f = Fields { map: &root, path };

        let arch_name = match root.get("architectures") {
            Some(Value::Array(a)) if !a.is_empty() => match &a[0] {
                Value::String(s) => s.clone(),
                other => return Err(f.bad("architectures[0]", other, "a string")),
            },
            Some(other) => return Err(f.bad("architectures", other, "a non-empty list")),
            None => return Err(f.missing("architectures")),
        };
        let arch = match arch_name.as_str() {
            "Qwen3ForCausalLM" => Arch::Qwen3,
            "Qwen2ForCausalLM" => Arch::Qwen2,
            "LlamaForCausalLM" => Arch::Llama,
            _ => {
                return Err(EngineError::UnsupportedArchitecture {
                    path: path.to_path_buf(),
                    value: arch_name,
                })
            }
        };

        let act = f.opt_str("hidden_act")?.unwrap_or_else(|| "silu".into());
        if act != "silu" {
            return Err(f.unsupported("hidden_act", &act, "only silu is supported"));
        }
        if f.opt_bool("use_sliding_window")?.unwrap_or(false) {
            return Err(f.unsupported(
                "use_sliding_window",
                "true",
                "sliding-window attention is not implemented",
            ));
        }
        if f.opt_bool("mlp_bias")?.unwrap_or(false) {
            return Err(f.unsupported("mlp_bias", "true", "MLP biases are not implemented"));
        }

        let hidden_size = f.req_usize("hidden_size")?;
        let num_layers = f.req_usize("num_hidden_layers")?;
        let num_heads = f.req_usize("num_attention_heads")?;
        let num_kv_heads = f.opt_usize("num_key_value_heads")?.unwrap_or(num_heads);
        // Qwen3Config defaults head_dim to 128; the others derive it.
        let head_dim = match f.opt_usize("head_dim")? {
            Some(d) => d,
            None if arch == Arch::Qwen3 => 128,
            None => {
                if num_heads == 0 || hidden_size % num_heads != 0 {
                    return Err(f.unsupported(
                        "hidden_size",
                        &hidden_size.to_string(),
                        "head_dim is absent and hidden_size is not a multiple of num_attention_heads",
                    ));
                }
                hidden_size / num_heads
            }
        };
        for (name, v) in [
            ("hidden_size", hidden_size),
            ("num_hidden_layers", num_layers),
            ("num_attention_heads", num_heads),
            ("num_key_value_heads", num_kv_heads),
            ("head_dim", head_dim),
        ] {
            if v == 0 {
                return Err(f.unsupported(name, "0", "must be positive"));
            }
        }
        if num_heads % num_kv_heads != 0 {
            return Err(f.unsupported(
                "num_key_value_heads",
                &num_kv_heads.to_string(),
                &format!("must divide num_attention_heads ({num_heads})"),
            ));
        }
        if head_dim % 2 != 0 {
            return Err(f.unsupported(
                "head_dim",
                &head_dim.to_string(),
                "RoPE needs an even head_dim",
            ));
        }
        let intermediate_size = f.req_usize("intermediate_size")?;
        let vocab_size = f.req_usize("vocab_size")?;
        if vocab_size == 0 {
            return Err(f.unsupported("vocab_size", "0", "must be positive"));
        }
        // All three transformers config classes default to 1e-6.
        let rms_norm_eps = f.opt_f64("rms_norm_eps")?.unwrap_or(1e-6);
        let max_position_embeddings = f
            .opt_usize("max_position_embeddings")?
            .unwrap_or(if arch == Arch::Llama { 2048 } else { 32768 });
        let tie_word_embeddings = f.opt_bool("tie_word_embeddings")?.unwrap_or(false);
        let attention_bias = f.opt_bool("attention_bias")?.unwrap_or(false);
        let (qkv_bias, o_bias) = match arch {
            // Qwen2's q/k/v always carry a bias; o_proj never does.
            Arch::Qwen2 => (true, false),
            // Qwen3 and Llama apply `attention_bias` to all four projections.
            Arch::Qwen3 | Arch::Llama => (attention_bias, attention_bias),
        };
        let (rope_theta, rope_scaling) = parse_rope(&f)?;

        Ok(ModelConfig {
            arch,
            hidden_size,
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            intermediate_size,
            vocab_size,
            rms_norm_eps,
            rope_theta,
            rope_scaling,
            tie_word_embeddings,
            qkv_bias,
            o_bias,
            qk_norm: arch == Arch::Qwen3,
            max_position_embeddings,
            bos_token_id: f.opt_token("bos_token_id")?,
            eos_token_ids: f.token_list("eos_token_id")?,
        })
    }

    /// Overrides bos/eos ids with those of a `generation_config.json` text.
    pub fn apply_generation_config(&mut self, text: &str, path: &Path) -> Result<()> {
        let root = parse_object(text, path)?;
        let f = Fields { map: &root, path };
        if let Some(bos) = f.opt_token("bos_token_id")? {
            self.bos_token_id = Some(bos);
        }
        let eos = f.token_list("eos_token_id")?;
        if !eos.is_empty() {
            self.eos_token_ids = eos;
        }
        Ok(())
    }
}

/// Reads `rope_theta` and the scaling from either the 4.x or 5.x layout.
fn parse_rope(f: &Fields<'_>) -> Result<(f64, RopeScaling)> {
    // 5.x: everything lives in `rope_parameters`; 4.x: `rope_scaling` + `rope_theta`.
    let (params_key, params) = match (f.map.get("rope_parameters"), f.map.get("rope_scaling")) {
        (Some(Value::Object(p)), _) => ("rope_parameters", Some(p)),
        (Some(Value::Null) | None, Some(Value::Object(p))) => ("rope_scaling", Some(p)),
        (Some(Value::Null) | None, Some(Value::Null) | None) => ("rope_scaling", None),
        (Some(other), _) => return Err(f.bad("rope_parameters", other, "an object")),
        (_, Some(other)) => return Err(f.bad("rope_scaling", other, "an object or null")),
    };
    let sub = params.map(|p| Fields {
        map: p,
        path: f.path,
    });
    let theta = match sub
        .as_ref()
        .map(|s| s.opt_f64("rope_theta"))
        .transpose()?
        .flatten()
    {
        Some(t) => t,
        None => f.opt_f64("rope_theta")?.unwrap_or(10000.0),
    };
    if !(theta.is_finite() && theta > 0.0) {
        return Err(f.unsupported("rope_theta", &theta.to_string(), "must be positive"));
    }
    let Some(sub) = sub else {
        return Ok((theta, RopeScaling::None));
    };
    // Older 4.x files spell the key `type`.
    let kind = match sub.opt_str("rope_type")? {
        Some(k) => Some(k),
        None => sub.opt_str("type")?,
    };
    let scaling = match kind.as_deref() {
        None | Some("default") => RopeScaling::None,
        Some("llama3") => {
            let key = |k: &str| format!("{params_key}.{k}");
            let get = |k: &str| -> Result<f64> {
                sub.opt_f64(k)?.ok_or_else(|| EngineError::Config {
                    path: f.path.to_path_buf(),
                    message: format!("missing field `{}` for rope type llama3", key(k)),
                })
            };
            let factor = get("factor")?;
            let low_freq_factor = get("low_freq_factor")?;
            let high_freq_factor = get("high_freq_factor")?;
            let original = sub
                .opt_usize("original_max_position_embeddings")?
                .ok_or_else(|| EngineError::Config {
                    path: f.path.to_path_buf(),
                    message: format!(
                        "missing field `{}` for rope type llama3",
                        key("original_max_position_embeddings")
                    ),
                })?;
            if !(factor > 0.0 && high_freq_factor > low_freq_factor && low_freq_factor > 0.0) {
                return Err(EngineError::Config {
                    path: f.path.to_path_buf(),
                    message: format!(
                        "invalid llama3 rope scaling in `{params_key}`: factor {factor}, low_freq_factor {low_freq_factor}, high_freq_factor {high_freq_factor} (need factor > 0 and high > low > 0)"
                    ),
                });
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings: original,
            }
        }
        Some(other) => {
            return Err(EngineError::UnsupportedRope {
                path: f.path.to_path_buf(),
                value: other.to_string(),
            })
        }
    };
    Ok((theta, scaling))
}

fn read_text(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| EngineError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn parse_object(text: &str, path: &Path) -> Result<Map<String, Value>> {
    let value: Value = serde_json::from_str(text).map_err(|source| EngineError::Json {
        path: path.to_path_buf(),
        source,
    })?;
    match value {
        Value::Object(m) => Ok(m),
        other => Err(EngineError::Config {
            path: path.to_path_buf(),
            message: format!(
                "expected a JSON object at the top level, found {}",
                kind_of(&other)
            ),
        }),
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// Typed access to one JSON object, producing errors that name the file and field.
struct Fields<'a> {
    map: &'a Map<String, Value>,
    path: &'a Path,
}

impl Fields<'_> {
    fn path_buf(&self) -> PathBuf {
        self.path.to_path_buf()
    }

    fn missing(&self, key: &str) -> EngineError {
        EngineError::Config {
            path: self.path_buf(),
            message: format!("missing field `{key}`"),
        }
    }

    fn bad(&self, key: &str, v: &Value, want: &str) -> EngineError {
        EngineError::Config {
            path: self.path_buf(),
            message: format!("field `{key}` is {v}, expected {want}"),
        }
    }

    fn unsupported(&self, key: &str, value: &str, why: &str) -> EngineError {
        EngineError::Config {
            path: self.path_buf(),
            message: format!("unsupported `{key}` = {value}: {why}"),
        }
    }

    /// The value under `key`, treating JSON null like absence.
    fn get(&self, key: &str) -> Option<&Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_u64().and_then(|n| usize::try_from(n).ok()) {
                Some(n) => Ok(Some(n)),
                None => Err(self.bad(key, v, "a non-negative integer")),
            },
        }
    }

    fn req_usize(&self, key: &str) -> Result<usize> {
        self.opt_usize(key)?.ok_or_else(|| self.missing(key))
    }

    fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.bad(key, v, "a number")),
        }
    }

    fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.bad(key, v, "a boolean")),
        }
    }

    fn opt_str(&self, key: &str) -> Result<Option<String>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(v) => Err(self.bad(key, v, "a string")),
        }
    }

    fn token(&self, key: &str, v: &Value) -> Result<u32> {
        v.as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| self.bad(key, v, "a token id (non-negative integer)"))
    }

    fn opt_token(&self, key: &str) -> Result<Option<u32>> {
        self.get(key).map(|v| self.token(key, v)).transpose()
    }

    /// A token id or a list of them (eos may be either).
    fn token_list(&self, key: &str) -> Result<Vec<u32>> {
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items.iter().map(|v| self.token(key, v)).collect(),
            Some(v) => Ok(vec![self.token(key, v)?]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ModelConfig> {
        ModelConfig::from_json_str(text, Path::new("dir/config.json"))
    }

    /// Llama-3.2-1B's config.json as transformers 4.x writes it.
    const LLAMA_4X: &str = r#"{
        "architectures": ["LlamaForCausalLM"], "attention_bias": false, "bos_token_id": 128000,
        "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu", "hidden_size": 2048,
        "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": false,
        "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0,
        "low_freq_factor": 1.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
        "vocab_size": 128256}"#;

    #[test]
    fn llama_4x_layout_with_llama3_scaling() {
        let c = parse(LLAMA_4X).unwrap();
        assert_eq!(c.arch, Arch::Llama);
        assert_eq!(c.head_dim, 64, "absent head_dim is hidden / heads");
        assert_eq!(c.rope_theta, 500000.0);
        assert_eq!(
            c.rope_scaling,
            RopeScaling::Llama3 {
                factor: 32.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192
            }
        );
        assert!(c.tie_word_embeddings && !c.qkv_bias && !c.qk_norm);
        assert_eq!(c.eos_token_ids, vec![128001, 128008, 128009]);
        assert_eq!(c.bos_token_id, Some(128000));
        assert_eq!(c.rms_norm_eps, 1e-5);
    }

    #[test]
    fn llama_5x_layout_matches_4x() {
        let text = LLAMA_4X
            .replace(r#""rope_scaling""#, r#""rope_parameters""#)
            .replace(
                r#""rope_type": "llama3"}"#,
                r#""rope_type": "llama3", "rope_theta": 500000.0}"#,
            )
            .replace(r#""rope_theta": 500000.0, "tie"#, r#""tie"#);
        assert!(text.contains("rope_parameters") && !text.contains("\"rope_scaling\""));
        assert_eq!(parse(&text).unwrap(), parse(LLAMA_4X).unwrap());
    }

    #[test]
    fn qwen3_and_qwen2_flags() {
        let q3 = r#"{"architectures": ["Qwen3ForCausalLM"], "hidden_size": 1024, "head_dim": 128,
            "intermediate_size": 3072, "num_attention_heads": 16, "num_hidden_layers": 28,
            "num_key_value_heads": 8, "rope_theta": 1000000, "rope_scaling": null,
            "tie_word_embeddings": true, "vocab_size": 151936, "eos_token_id": 151645}"#;
        let c = parse(q3).unwrap();
        assert!(c.qk_norm && c.tie_word_embeddings && !c.qkv_bias);
        assert_eq!(
            (c.head_dim, c.rope_theta, c.rope_scaling),
            (128, 1e6, RopeScaling::None)
        );
        assert_eq!(c.eos_token_ids, vec![151645]);
        let q2 = q3
            .replace("Qwen3", "Qwen2")
            .replace(r#""head_dim": 128,"#, "");
        let c = parse(&q2).unwrap();
        assert!(c.qkv_bias && !c.o_bias && !c.qk_norm);
        assert_eq!(c.head_dim, 64);
    }

    #[test]
    fn hf_json_round_trips() {
        let c = parse(LLAMA_4X).unwrap();
        let text = c.to_hf_json().to_string();
        assert_eq!(parse(&text).unwrap(), c);
        for name in crate::preset::PRESETS {
            let c = crate::preset::config(name).unwrap();
            assert_eq!(parse(&c.to_hf_json().to_string()).unwrap(), c, "{name}");
        }
    }

    #[test]
    fn generation_config_overrides_eos() {
        let mut c = parse(LLAMA_4X).unwrap();
        let p = Path::new("dir/generation_config.json");
        c.apply_generation_config(r#"{"eos_token_id": 7, "bos_token_id": 1}"#, p)
            .unwrap();
        assert_eq!(
            (c.eos_token_ids.clone(), c.bos_token_id),
            (vec![7], Some(1))
        );
        let e = c
            .apply_generation_config(r#"{"eos_token_id": "x"}"#, p)
            .unwrap_err();
        assert!(
            e.to_string().contains("generation_config.json")
                && e.to_string().contains("eos_token_id")
        );
    }

    #[test]
    fn errors_name_file_and_value() {
        let msg = |t: &str| parse(t).unwrap_err().to_string();
        let m = msg(&LLAMA_4X.replace("LlamaForCausalLM", "GPT2LMHeadModel"));
        assert!(
            m.contains("dir/config.json") && m.contains("GPT2LMHeadModel"),
            "{m}"
        );
        let m = msg(&LLAMA_4X.replace(r#""rope_type": "llama3""#, r#""rope_type": "yarn""#));
        assert!(m.contains("dir/config.json") && m.contains("yarn"), "{m}");
        let m = msg(&LLAMA_4X.replace(r#""hidden_size": 2048,"#, ""));
        assert!(m.contains("hidden_size") && m.contains("missing"), "{m}");
        let m =
            msg(&LLAMA_4X.replace(r#""num_key_value_heads": 8"#, r#""num_key_value_heads": 5"#));
        assert!(m.contains("num_key_value_heads") && m.contains('5'), "{m}");
        let m = msg(&LLAMA_4X.replace(r#""hidden_size": 2048"#, r#""hidden_size": "big""#));
        assert!(m.contains("hidden_size") && m.contains("big"), "{m}");
        let m = msg("{\"architectures\": [");
        assert!(
            m.contains("dir/config.json") && m.contains("malformed JSON"),
            "{m}"
        );
        let m = msg(&LLAMA_4X.replace(r#""original_max_position_embeddings": 8192, "#, ""));
        assert!(m.contains("original_max_position_embeddings"), "{m}");
        let m = msg(&LLAMA_4X.replace(r#""hidden_act": "silu""#, r#""hidden_act": "gelu""#));
        assert!(m.contains("hidden_act") && m.contains("gelu"), "{m}");
    }
}
