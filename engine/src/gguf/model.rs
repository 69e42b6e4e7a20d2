//! A GGUF model as the engine sees it: [`ModelConfig`] from the metadata, GGUF tensor
//! names mapped to Hugging Face ones, and tensors as bf16 (dequantized) or in the
//! quantized device layout ([`PackedMatrix`]).
//!
//! Metadata read (`{arch}` is `general.architecture`: `qwen3`, `qwen2` or `llama`):
//!
//! | GGUF key | config field |
//! |---|---|
//! | `{arch}.embedding_length` | `hidden_size` |
//! | `{arch}.block_count` | `num_layers` |
//! | `{arch}.feed_forward_length` | `intermediate_size` |
//! | `{arch}.attention.head_count` | `num_heads` |
//! | `{arch}.attention.head_count_kv` (default: `head_count`) | `num_kv_heads` |
//! | `{arch}.attention.key_length` (default: `embedding_length / head_count`) | `head_dim` |
//! | `{arch}.attention.layer_norm_rms_epsilon` (default 1e-6) | `rms_norm_eps` |
//! | `{arch}.rope.freq_base` (default 10000) | `rope_theta` |
//! | `{arch}.rope.dimension_count` (if present, must be `head_dim`) | |
//! | `{arch}.context_length` | `max_position_embeddings` |
//! | `{arch}.vocab_size`, else `token_embd.weight`'s rows | `vocab_size` |
//! | `tokenizer.ggml.bos_token_id`, `eos_token_id`, `eot_token_id` | `bos_token_id`, `eos_token_ids` |
//! | tensor `rope_freqs.weight` (Llama 3.1 / 3.2) | `rope_scaling` (llama3, from its divisors: [`crate::rope::llama3_from_factors`]) |
//!
//! `output.weight` absent means a tied LM head; biases are present when the file has
//! `blk.0.attn_q.bias` / `blk.0.attn_output.bias`. llama.cpp's converter permutes the
//! rows of Llama's q and k projections for its interleaved RoPE; they are permuted back
//! here, so every tensor reaches the engine in Hugging Face's layout.

use std::borrow::Cow;

use half::bf16;

use super::quant::{self, GgmlType, PackedMatrix};
use super::{GgufFile, TensorInfo};
use crate::config::{Arch, ModelConfig, RopeScaling};
use crate::decode::{QuantLayer, QuantWeights};
use crate::error::{EngineError, Result};
use crate::model::{LayerWeights, ModelWeights, Tensor};

/// The GGUF name of a Hugging Face tensor name (`model.layers.3.mlp.up_proj.weight`
/// → `blk.3.ffn_up.weight`), or `None` for a name the engine does not use.
pub fn gguf_name(hf: &str) -> Option<String> {
    match hf {
        "model.embed_tokens.weight" => return Some("token_embd.weight".into()),
        "model.norm.weight" => return Some("output_norm.weight".into()),
        "lm_head.weight" => return Some("output.weight".into()),
        _ => {}
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, suffix) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (module, kind) = suffix.rsplit_once('.')?;
    let g = match module {
        "input_layernorm" => "attn_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "self_attn.q_norm" => "attn_q_norm",
        "self_attn.k_norm" => "attn_k_norm",
        "post_attention_layernorm" => "ffn_norm",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        _ => return None,
    };
    Some(format!("blk.{layer}.{g}.{kind}"))
}

/// The Hugging Face name of a GGUF tensor name; the inverse of [`gguf_name`].
pub fn hf_name(gguf: &str) -> Option<String> {
    match gguf {
        "token_embd.weight" => return Some("model.embed_tokens.weight".into()),
        "output_norm.weight" => return Some("model.norm.weight".into()),
        "output.weight" => return Some("lm_head.weight".into()),
        _ => {}
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, suffix) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (module, kind) = suffix.rsplit_once('.')?;
    let h = match module {
        "attn_norm" => "input_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "attn_q_norm" => "self_attn.q_norm",
        "attn_k_norm" => "self_attn.k_norm",
        "ffn_norm" => "post_attention_layernorm",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{h}.{kind}"))
}

impl GgufFile {
    /// The model's config from the metadata (see the module docs for the keys).
    pub fn config(&self) -> Result<ModelConfig> {
        let arch_name = self
            .opt_str("general.architecture")?
            .ok_or_else(|| self.error("metadata `general.architecture` is missing"))?
            .to_string();
        let arch = match arch_name.as_str() {
            "qwen3" => Arch::Qwen3,
            "qwen2" => Arch::Qwen2,
            "llama" => Arch::Llama,
            other => {
                return Err(self.error(format!(
                    "unsupported architecture `{other}` in general.architecture (supported: qwen3, qwen2, llama)"
                )))
            }
        };
        let key = |k: &str| format!("{arch_name}.{k}");
        let positive = |k: &str, v: u64| -> Result<usize> {
            if v == 0 {
                Err(self.error(format!("metadata `{k}` is 0, must be positive")))
            } else {
                usize::try_from(v)
                    .map_err(|_| self.error(format!("metadata `{k}` = {v} is too large")))
            }
        };
        let req = |k: &str| -> Result<usize> { positive(&key(k), self.req_u64(&key(k))?) };

        let hidden_size = req("embedding_length")?;
        let num_layers = req("block_count")?;
        let intermediate_size = req("feed_forward_length")?;
        let num_heads = req("attention.head_count")?;
        let num_kv_heads = match self.opt_u64(&key("attention.head_count_kv"))? {
            Some(v) => positive(&key("attention.head_count_kv"), v)?,
            None => num_heads,
        };
        let head_dim = match self.opt_u64(&key("attention.key_length"))? {
            Some(v) => positive(&key("attention.key_length"), v)?,
            None if hidden_size % num_heads == 0 => hidden_size / num_heads,
            None => {
                return Err(self.error(format!(
                    "metadata `{}` is absent and embedding_length {hidden_size} is not a multiple of head_count {num_heads}",
                    key("attention.key_length")
                )))
            }
        };
        if let Some(v) = self.opt_u64(&key("attention.value_length"))? {
            if v as usize != head_dim {
                return Err(self.error(format!(
                    "metadata `{}` = {v} differs from key_length {head_dim}; the engine needs them equal",
                    key("attention.value_length")
                )));
            }
        }
        if num_heads % num_kv_heads != 0 {
            return Err(self.error(format!(
                "metadata `{}` = {num_kv_heads} must divide head_count ({num_heads})",
                key("attention.head_count_kv")
            )));
        }
        if head_dim % 2 != 0 {
            return Err(self.error(format!("head_dim {head_dim} is odd; RoPE needs it even")));
        }
        // The engine rotates whole heads: a file that rotates fewer dimensions (partial
        // rotary) would decode wrongly, so it is refused.
        if let Some(rotated) = self.opt_u64(&key("rope.dimension_count"))? {
            if rotated != head_dim as u64 {
                return Err(self.error(format!(
                    "metadata `{}` = {rotated} rotates part of a head of {head_dim}; only whole heads are rotated",
                    key("rope.dimension_count")
                )));
            }
        }
        let rms_norm_eps = self
            .opt_f64(&key("attention.layer_norm_rms_epsilon"))?
            .unwrap_or(1e-6);
        let rope_theta = self.opt_f64(&key("rope.freq_base"))?.unwrap_or(10000.0);
        match self.opt_str(&key("rope.scaling.type"))? {
            None | Some("none") => {}
            Some(other) => {
                return Err(self.error(format!(
                    "metadata `{}` is `{other}`: only plain RoPE and llama3's (`rope_freqs.weight`) are read from GGUF files",
                    key("rope.scaling.type")
                )))
            }
        }
        // llama3 scaling (Llama 3.1 / 3.2): llama.cpp's converter stores it as each
        // frequency's divisor, from which its parameters come back.
        let rope_scaling = match self.tensor("rope_freqs.weight") {
            None => RopeScaling::None,
            Some(info) => {
                let name = "rope_freqs.weight";
                let numel = info.numel() as usize;
                let factors =
                    quant::dequantize(info.ggml_type, self.tensor_bytes(info), numel, name)
                        .map_err(|e| self.error(e.to_string()))?;
                crate::rope::llama3_from_factors(rope_theta, head_dim, &factors).map_err(|e| {
                    self.error(format!(
                        "tensor `{name}` (llama3 RoPE divisors, {numel} values): {e}"
                    ))
                })?
            }
        };
        let max_position_embeddings = match self.opt_u64(&key("context_length"))? {
            Some(v) => positive(&key("context_length"), v)?,
            None => {
                if arch == Arch::Llama {
                    2048
                } else {
                    32768
                }
            }
        };
        let vocab_size = match self.opt_u64(&key("vocab_size"))? {
            Some(v) => positive(&key("vocab_size"), v)?,
            None => match self.tensor("token_embd.weight") {
                Some(t) if t.ne.len() == 2 => positive("token_embd.weight rows", t.ne[1])?,
                Some(t) => {
                    return Err(self.error(format!(
                        "tensor `token_embd.weight` has dims {:?}, expected 2",
                        t.ne
                    )))
                }
                None => return Err(self.error("tensor `token_embd.weight` is missing")),
            },
        };
        // Every dimension must match a tensor of the file, and every layer holds tensors:
        // a corrupt value past those bounds is an error here, not an allocation of its
        // size later (`corrupted_headers_never_panic` in tests/gguf.rs).
        let largest = self.tensors.iter().flat_map(|t| t.ne.iter().copied()).max();
        let largest = largest.unwrap_or(0);
        for (k, v) in [
            ("embedding_length", hidden_size),
            ("feed_forward_length", intermediate_size),
            ("attention.head_count", num_heads),
            ("attention.head_count_kv", num_kv_heads),
            ("attention.key_length", head_dim),
            ("vocab_size", vocab_size),
        ] {
            if v as u64 > largest {
                return Err(self.error(format!(
                    "metadata `{}` = {v} is larger than any tensor dimension in the file ({largest})",
                    key(k)
                )));
            }
        }
        if num_layers > self.tensors.len() {
            return Err(self.error(format!(
                "metadata `{}` = {num_layers} is more layers than the file has tensors ({})",
                key("block_count"),
                self.tensors.len()
            )));
        }
        let tie_word_embeddings = self.tensor("output.weight").is_none();
        let has_q_bias = self.tensor("blk.0.attn_q.bias").is_some();
        let has_o_bias = self.tensor("blk.0.attn_output.bias").is_some();
        let (qkv_bias, o_bias) = match arch {
            Arch::Qwen2 => (true, false),
            Arch::Qwen3 | Arch::Llama => (has_q_bias, has_o_bias),
        };
        let token = |k: &str| -> Result<Option<u32>> {
            match self.opt_u64(k)? {
                None => Ok(None),
                Some(v) => u32::try_from(v)
                    .map(Some)
                    .map_err(|_| self.error(format!("metadata `{k}` = {v} is not a token id"))),
            }
        };
        let mut eos_token_ids = Vec::new();
        for k in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"] {
            if let Some(t) = token(k)? {
                if !eos_token_ids.contains(&t) {
                    eos_token_ids.push(t);
                }
            }
        }
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
            bos_token_id: token("tokenizer.ggml.bos_token_id")?,
            eos_token_ids,
        })
    }

    /// The entry for Hugging Face tensor `hf`, checked against `shape` (PyTorch order).
    pub fn tensor_for(&self, hf: &str, shape: &[usize]) -> Result<&TensorInfo> {
        let g = gguf_name(hf).ok_or_else(|| self.error(format!("no GGUF name for `{hf}`")))?;
        let info = self.tensor(&g).ok_or_else(|| EngineError::MissingTensor {
            name: format!("{g} ({hf})"),
            location: self.path().to_path_buf(),
        })?;
        if info.shape() != shape {
            return Err(EngineError::ShapeMismatch {
                path: self.path().to_path_buf(),
                name: g,
                expected: shape.to_vec(),
                found: info.shape(),
            });
        }
        if !info.ggml_type.is_supported() {
            return Err(self.error(format!(
                "tensor `{g}` has ggml type {} (supported: {})",
                info.ggml_type,
                quant::SUPPORTED
            )));
        }
        Ok(info)
    }

    /// The raw bytes of `info` with Llama's q/k row permutation undone (borrowed when
    /// nothing moves).
    fn hf_rows<'a>(&'a self, info: &TensorInfo, cfg: &ModelConfig) -> Cow<'a, [u8]> {
        let bytes = self.tensor_bytes(info);
        let heads = if cfg.arch != Arch::Llama {
            None
        } else if info.name.ends_with(".attn_q.weight") || info.name.ends_with(".attn_q.bias") {
            Some(cfg.num_heads)
        } else if info.name.ends_with(".attn_k.weight") || info.name.ends_with(".attn_k.bias") {
            Some(cfg.num_kv_heads)
        } else {
            None
        };
        let Some(heads) = heads else {
            return Cow::Borrowed(bytes);
        };
        let rows = if info.ne.len() == 2 {
            info.ne[1] as usize
        } else {
            info.ne[0] as usize
        };
        let row_bytes = bytes.len() / rows;
        let hd = rows / heads;
        let mut out = vec![0u8; bytes.len()];
        // The converter's row `h*hd + 2i + j` is Hugging Face's row `h*hd + j*hd/2 + i`.
        for h in 0..heads {
            for i in 0..hd / 2 {
                for j in 0..2 {
                    let src = h * hd + 2 * i + j;
                    let dst = h * hd + j * (hd / 2) + i;
                    out[dst * row_bytes..(dst + 1) * row_bytes]
                        .copy_from_slice(&bytes[src * row_bytes..(src + 1) * row_bytes]);
                }
            }
        }
        Cow::Owned(out)
    }

    /// Hugging Face tensor `hf` as f32 (dequantized), checked against `shape`.
    pub fn tensor_f32(&self, hf: &str, shape: &[usize], cfg: &ModelConfig) -> Result<Vec<f32>> {
        let info = self.tensor_for(hf, shape)?;
        let bytes = self.hf_rows(info, cfg);
        quant::dequantize(info.ggml_type, &bytes, info.numel() as usize, &info.name)
            .map_err(|e| self.error(e.to_string()))
    }

    /// Hugging Face tensor `hf` as bf16 (dequantized and rounded), checked against `shape`.
    pub fn tensor_bf16(
        &self,
        hf: &str,
        shape: &[usize],
        cfg: &ModelConfig,
    ) -> Result<Tensor<'static>> {
        let v = self.tensor_f32(hf, shape, cfg)?;
        Ok(Cow::Owned(v.into_iter().map(bf16::from_f32).collect()))
    }

    /// The `[rows, cols]` matrix `hf` in the quantized device layout, or `None` when the
    /// file stores it as F32/F16/BF16 (the dense kernels read those).
    pub fn packed_matrix(
        &self,
        hf: &str,
        rows: usize,
        cols: usize,
        cfg: &ModelConfig,
    ) -> Result<Option<PackedMatrix>> {
        let info = self.tensor_for(hf, &[rows, cols])?;
        if !info.ggml_type.is_quantized() {
            return Ok(None);
        }
        let bytes = self.hf_rows(info, cfg);
        PackedMatrix::pack(info.ggml_type, &bytes, rows, cols, &info.name).map(Some)
    }

    /// The ggml type of every weight matrix, by GGUF name, for reports
    /// (`token_embd.weight: Q8_0`, ...).
    pub fn matrix_types(&self) -> Vec<(String, GgmlType)> {
        self.tensors
            .iter()
            .filter(|t| t.ne.len() == 2)
            .map(|t| (t.name.clone(), t.ggml_type))
            .collect()
    }

    /// The matrices the file stores quantized (Q8_0, Q4_K, Q5_K, Q6_K, Q4_0 and Q5_0
    /// (as Q8_0 in rows that are no multiple of 256), IQ4_NL as Q8_0, Q4_1 and Q5_1 as
    /// Q8_0 with offsets, Q3_K by the Q6_K kernels, IQ4_XS by the Q4_K kernels), in the
    /// device layout,
    /// for [`crate::Decoder::with_quant`]; F32/F16/BF16 ones are left out (`None`).
    /// A tied LM head is the embedding table's
    /// matrix; a head is left out where [`quant::head_reads_quantized`] says so.
    pub fn quant_weights(&self, cfg: &ModelConfig) -> Result<QuantWeights> {
        let h = cfg.hidden_size;
        let (qd, kvd, im, v) = (
            cfg.q_dim(),
            cfg.kv_dim(),
            cfg.intermediate_size,
            cfg.vocab_size,
        );
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for i in 0..cfg.num_layers {
            let m = |suffix: &str, rows: usize, cols: usize| {
                self.packed_matrix(&format!("model.layers.{i}.{suffix}"), rows, cols, cfg)
            };
            layers.push(QuantLayer {
                q: m("self_attn.q_proj.weight", qd, h)?,
                k: m("self_attn.k_proj.weight", kvd, h)?,
                v: m("self_attn.v_proj.weight", kvd, h)?,
                o: m("self_attn.o_proj.weight", h, qd)?,
                gate: m("mlp.gate_proj.weight", im, h)?,
                up: m("mlp.up_proj.weight", im, h)?,
                down: m("mlp.down_proj.weight", h, im)?,
            });
        }
        let head = if cfg.tie_word_embeddings {
            "model.embed_tokens.weight"
        } else {
            "lm_head.weight"
        };
        let lm_head = self
            .packed_matrix(head, v, h, cfg)?
            .filter(|m| quant::head_reads_quantized(m.ggml_type()));
        Ok(QuantWeights { layers, lm_head })
    }

    /// Every weight of the model as bf16 (quantized tensors dequantized), checked
    /// against `cfg`: what the dense decoder and the host reference read.
    pub fn model_weights(&self, cfg: &ModelConfig) -> Result<ModelWeights<'static>> {
        self.model_weights_for(cfg, &QuantWeights::default())
    }

    /// [`GgufFile::model_weights`] for a decoder that reads `quant`'s matrices
    /// quantized: those it covers ([`QuantWeights::covers`], and an untied LM head
    /// `quant` has) are left empty instead of dequantized, so loading a quantized model
    /// costs host memory and time for its bf16 tensors only (the norms, biases, the
    /// embedding). [`crate::Decoder::with_quant`] accepts them
    /// ([`ModelWeights::validate_with`]).
    pub fn model_weights_for(
        &self,
        cfg: &ModelConfig,
        quant: &QuantWeights,
    ) -> Result<ModelWeights<'static>> {
        let h = cfg.hidden_size;
        let (qd, kvd, hd, im, v) = (
            cfg.q_dim(),
            cfg.kv_dim(),
            cfg.head_dim,
            cfg.intermediate_size,
            cfg.vocab_size,
        );
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for i in 0..cfg.num_layers {
            let p = format!("model.layers.{i}");
            let t = |suffix: &str, shape: &[usize]| {
                self.tensor_bf16(&format!("{p}.{suffix}"), shape, cfg)
            };
            let opt =
                |on: bool, suffix: &str, shape: &[usize]| -> Result<Option<Tensor<'static>>> {
                    if on {
                        t(suffix, shape).map(Some)
                    } else {
                        Ok(None)
                    }
                };
            let covers = quant.covers(i);
            // A matrix read quantized is left empty.
            let m = |part: usize, suffix: &str, shape: &[usize]| -> Result<Tensor<'static>> {
                if covers[part] {
                    Ok(Tensor::Owned(Vec::new()))
                } else {
                    t(suffix, shape)
                }
            };
            layers.push(LayerWeights {
                input_norm: t("input_layernorm.weight", &[h])?,
                q_proj: m(0, "self_attn.q_proj.weight", &[qd, h])?,
                k_proj: m(1, "self_attn.k_proj.weight", &[kvd, h])?,
                v_proj: m(2, "self_attn.v_proj.weight", &[kvd, h])?,
                o_proj: m(3, "self_attn.o_proj.weight", &[h, qd])?,
                q_bias: opt(cfg.qkv_bias, "self_attn.q_proj.bias", &[qd])?,
                k_bias: opt(cfg.qkv_bias, "self_attn.k_proj.bias", &[kvd])?,
                v_bias: opt(cfg.qkv_bias, "self_attn.v_proj.bias", &[kvd])?,
                o_bias: opt(cfg.o_bias, "self_attn.o_proj.bias", &[h])?,
                q_norm: opt(cfg.qk_norm, "self_attn.q_norm.weight", &[hd])?,
                k_norm: opt(cfg.qk_norm, "self_attn.k_norm.weight", &[hd])?,
                post_attention_norm: t("post_attention_layernorm.weight", &[h])?,
                gate_proj: m(4, "mlp.gate_proj.weight", &[im, h])?,
                up_proj: m(5, "mlp.up_proj.weight", &[im, h])?,
                down_proj: m(6, "mlp.down_proj.weight", &[h, im])?,
            });
        }
        let lm_head = if cfg.tie_word_embeddings {
            None
        } else if quant.lm_head.is_some() {
            Some(Tensor::Owned(Vec::new()))
        } else {
            Some(self.tensor_bf16("lm_head.weight", &[v, h], cfg)?)
        };
        Ok(ModelWeights {
            embed_tokens: self.tensor_bf16("model.embed_tokens.weight", &[v, h], cfg)?,
            layers,
            norm: self.tensor_bf16("model.norm.weight", &[h], cfg)?,
            lm_head,
        })
    }
}
