//! A model's weights, organized by layer, in the engine's bf16 layout.
//!
//! Matrices keep the PyTorch `nn.Linear` layout: `[out_features, in_features]`,
//! row-major. Tensors loaded from a checkpoint borrow from its memory map
//! where possible; presets own theirs.

use std::borrow::Cow;
use std::path::Path;

use half::bf16;

use crate::config::ModelConfig;
use crate::error::{EngineError, Result};
use crate::weights::Weights;

/// A bf16 tensor, borrowed from a checkpoint or owned.
pub type Tensor<'a> = Cow<'a, [bf16]>;

/// The weights of one decoder layer.
#[derive(Clone, Debug)]
pub struct LayerWeights<'a> {
    /// RMSNorm before attention, `[hidden]`.
    pub input_norm: Tensor<'a>,
    /// Query projection, `[num_heads*head_dim, hidden]`.
    pub q_proj: Tensor<'a>,
    /// Key projection, `[num_kv_heads*head_dim, hidden]`.
    pub k_proj: Tensor<'a>,
    /// Value projection, `[num_kv_heads*head_dim, hidden]`.
    pub v_proj: Tensor<'a>,
    /// Output projection, `[hidden, num_heads*head_dim]`.
    pub o_proj: Tensor<'a>,
    /// Query bias, when `qkv_bias`.
    pub q_bias: Option<Tensor<'a>>,
    /// Key bias, when `qkv_bias`.
    pub k_bias: Option<Tensor<'a>>,
    /// Value bias, when `qkv_bias`.
    pub v_bias: Option<Tensor<'a>>,
    /// Output bias, when `o_bias`.
    pub o_bias: Option<Tensor<'a>>,
    /// Per-head query RMSNorm weight `[head_dim]`, when `qk_norm`.
    pub q_norm: Option<Tensor<'a>>,
    /// Per-head key RMSNorm weight `[head_dim]`, when `qk_norm`.
    pub k_norm: Option<Tensor<'a>>,
    /// RMSNorm before the MLP, `[hidden]`.
    pub post_attention_norm: Tensor<'a>,
    /// MLP gate projection, `[intermediate, hidden]`.
    pub gate_proj: Tensor<'a>,
    /// MLP up projection, `[intermediate, hidden]`.
    pub up_proj: Tensor<'a>,
    /// MLP down projection, `[hidden, intermediate]`.
    pub down_proj: Tensor<'a>,
}

/// All weights of a model.
#[derive(Clone, Debug)]
pub struct ModelWeights<'a> {
    /// Token embedding, `[vocab, hidden]`.
    pub embed_tokens: Tensor<'a>,
    /// Decoder layers, in order.
    pub layers: Vec<LayerWeights<'a>>,
    /// Final RMSNorm, `[hidden]`.
    pub norm: Tensor<'a>,
    /// LM head `[vocab, hidden]`; `None` when tied to `embed_tokens`.
    pub lm_head: Option<Tensor<'a>>,
}

impl<'a> ModelWeights<'a> {
    /// The LM head matrix, resolving tying.
    pub fn lm_head(&self) -> &[bf16] {
        self.lm_head.as_deref().unwrap_or(&self.embed_tokens)
    }

    /// Every tensor with its Hugging Face name and shape, in checkpoint
    /// order (embedding, layers, final norm, untied LM head). Useful for
    /// uploading weights or writing them back out as safetensors.
    pub fn named_tensors(&self, cfg: &ModelConfig) -> Vec<(String, Vec<usize>, &[bf16])> {
        let (h, qd, kvd, hd, im, v) = (
            cfg.hidden_size,
            cfg.q_dim(),
            cfg.kv_dim(),
            cfg.head_dim,
            cfg.intermediate_size,
            cfg.vocab_size,
        );
        let mut out: Vec<(String, Vec<usize>, &[bf16])> = vec![(
            "model.embed_tokens.weight".into(),
            vec![v, h],
            &self.embed_tokens,
        )];
        for (i, l) in self.layers.iter().enumerate() {
            let n = |s: &str| format!("model.layers.{i}.{s}");
            out.push((n("input_layernorm.weight"), vec![h], &l.input_norm));
            out.push((n("self_attn.q_proj.weight"), vec![qd, h], &l.q_proj));
            out.push((n("self_attn.k_proj.weight"), vec![kvd, h], &l.k_proj));
            out.push((n("self_attn.v_proj.weight"), vec![kvd, h], &l.v_proj));
            out.push((n("self_attn.o_proj.weight"), vec![h, qd], &l.o_proj));
            let optional = [
                ("self_attn.q_proj.bias", qd, &l.q_bias),
                ("self_attn.k_proj.bias", kvd, &l.k_bias),
                ("self_attn.v_proj.bias", kvd, &l.v_bias),
                ("self_attn.o_proj.bias", h, &l.o_bias),
                ("self_attn.q_norm.weight", hd, &l.q_norm),
                ("self_attn.k_norm.weight", hd, &l.k_norm),
            ];
            for (name, len, t) in optional {
                if let Some(t) = t {
                    out.push((n(name), vec![len], t));
                }
            }
            out.push((
                n("post_attention_layernorm.weight"),
                vec![h],
                &l.post_attention_norm,
            ));
            out.push((n("mlp.gate_proj.weight"), vec![im, h], &l.gate_proj));
            out.push((n("mlp.up_proj.weight"), vec![im, h], &l.up_proj));
            out.push((n("mlp.down_proj.weight"), vec![h, im], &l.down_proj));
        }
        out.push(("model.norm.weight".into(), vec![h], &self.norm));
        if let Some(head) = &self.lm_head {
            out.push(("lm_head.weight".into(), vec![v, h], head));
        }
        out
    }

    /// Checks that every tensor has the number of elements `cfg` implies
    /// (shapes are checked at load; this guards hand-built weights).
    pub fn validate(&self, cfg: &ModelConfig) -> Result<()> {
        self.validate_with(cfg, &crate::decode::QuantWeights::default())
    }

    /// [`ModelWeights::validate`], where the matrices `quant` covers
    /// ([`crate::decode::QuantWeights::covers`], and the LM head when `quant` has one)
    /// may also be empty: the decoder reads them quantized
    /// ([`crate::gguf::GgufFile::model_weights_for`] leaves them out).
    pub fn validate_with(
        &self,
        cfg: &ModelConfig,
        quant: &crate::decode::QuantWeights,
    ) -> Result<()> {
        let (h, qd, kvd, hd, im, v) = (
            cfg.hidden_size,
            cfg.q_dim(),
            cfg.kv_dim(),
            cfg.head_dim,
            cfg.intermediate_size,
            cfg.vocab_size,
        );
        let check = |name: String, t: Option<&[bf16]>, shape: &[usize]| -> Result<()> {
            let want: usize = shape.iter().product();
            match t {
                Some(t) if t.len() == want => Ok(()),
                Some(t) => Err(EngineError::ShapeMismatch {
                    path: "(in-memory weights)".into(),
                    name,
                    expected: shape.to_vec(),
                    found: vec![t.len()],
                }),
                None => Err(EngineError::MissingTensor {
                    name,
                    location: "(in-memory weights)".into(),
                }),
            }
        };
        // Optional tensors must be present exactly when the config asks.
        let opt = |name: String, on: bool, t: &Option<Tensor<'_>>, shape: &[usize]| -> Result<()> {
            match (on, t) {
                (false, None) => Ok(()),
                (false, Some(_)) => Err(EngineError::Config {
                    path: "(in-memory weights)".into(),
                    message: format!("tensor `{name}` is present but the config does not use it"),
                }),
                (true, t) => check(name, t.as_deref(), shape),
            }
        };
        check(
            "model.embed_tokens.weight".into(),
            Some(&self.embed_tokens),
            &[v, h],
        )?;
        check("model.norm.weight".into(), Some(&self.norm), &[h])?;
        // A matrix read quantized may be left out (empty).
        let left_out = |covered: bool, t: &[bf16]| covered && t.is_empty();
        let head_left_out = self
            .lm_head
            .as_deref()
            .is_some_and(|t| left_out(quant.lm_head.is_some(), t));
        if !head_left_out {
            opt(
                "lm_head.weight".into(),
                !cfg.tie_word_embeddings,
                &self.lm_head,
                &[v, h],
            )?;
        }
        if self.layers.len() != cfg.num_layers {
            return Err(EngineError::Config {
                path: "(in-memory weights)".into(),
                message: format!(
                    "{} layers of weights, but num_hidden_layers = {}",
                    self.layers.len(),
                    cfg.num_layers
                ),
            });
        }
        for (i, l) in self.layers.iter().enumerate() {
            let n = |s: &str| format!("model.layers.{i}.{s}");
            let covers = quant.covers(i);
            let matrix = |part: usize, name: &str, t: &[bf16], shape: &[usize]| -> Result<()> {
                if left_out(covers[part], t) {
                    return Ok(());
                }
                check(n(name), Some(t), shape)
            };
            check(n("input_layernorm.weight"), Some(&l.input_norm), &[h])?;
            matrix(0, "self_attn.q_proj.weight", &l.q_proj, &[qd, h])?;
            matrix(1, "self_attn.k_proj.weight", &l.k_proj, &[kvd, h])?;
            matrix(2, "self_attn.v_proj.weight", &l.v_proj, &[kvd, h])?;
            matrix(3, "self_attn.o_proj.weight", &l.o_proj, &[h, qd])?;
            opt(n("self_attn.q_proj.bias"), cfg.qkv_bias, &l.q_bias, &[qd])?;
            opt(n("self_attn.k_proj.bias"), cfg.qkv_bias, &l.k_bias, &[kvd])?;
            opt(n("self_attn.v_proj.bias"), cfg.qkv_bias, &l.v_bias, &[kvd])?;
            opt(n("self_attn.o_proj.bias"), cfg.o_bias, &l.o_bias, &[h])?;
            opt(n("self_attn.q_norm.weight"), cfg.qk_norm, &l.q_norm, &[hd])?;
            opt(n("self_attn.k_norm.weight"), cfg.qk_norm, &l.k_norm, &[hd])?;
            check(
                n("post_attention_layernorm.weight"),
                Some(&l.post_attention_norm),
                &[h],
            )?;
            matrix(4, "mlp.gate_proj.weight", &l.gate_proj, &[im, h])?;
            matrix(5, "mlp.up_proj.weight", &l.up_proj, &[im, h])?;
            matrix(6, "mlp.down_proj.weight", &l.down_proj, &[h, im])?;
        }
        Ok(())
    }

    /// Gathers every tensor `cfg` calls for from `w` by its Hugging Face
    /// name, checking shapes.
    pub fn from_checkpoint(cfg: &ModelConfig, w: &'a Weights) -> Result<Self> {
        let h = cfg.hidden_size;
        let (qd, kvd, hd, im, v) = (
            cfg.q_dim(),
            cfg.kv_dim(),
            cfg.head_dim,
            cfg.intermediate_size,
            cfg.vocab_size,
        );
        // Not `with_capacity(cfg.num_layers)`: the count is the config's, unchecked until a
        // layer's tensors are missing (`impossible_config_sizes_are_errors`).
        let mut layers = Vec::new();
        for i in 0..cfg.num_layers {
            let p = format!("model.layers.{i}");
            let t = |suffix: &str, shape: &[usize]| w.tensor_bf16(&format!("{p}.{suffix}"), shape);
            let opt = |on: bool, suffix: &str, shape: &[usize]| -> Result<Option<Tensor<'a>>> {
                if on {
                    t(suffix, shape).map(Some)
                } else {
                    Ok(None)
                }
            };
            layers.push(LayerWeights {
                input_norm: t("input_layernorm.weight", &[h])?,
                q_proj: t("self_attn.q_proj.weight", &[qd, h])?,
                k_proj: t("self_attn.k_proj.weight", &[kvd, h])?,
                v_proj: t("self_attn.v_proj.weight", &[kvd, h])?,
                o_proj: t("self_attn.o_proj.weight", &[h, qd])?,
                q_bias: opt(cfg.qkv_bias, "self_attn.q_proj.bias", &[qd])?,
                k_bias: opt(cfg.qkv_bias, "self_attn.k_proj.bias", &[kvd])?,
                v_bias: opt(cfg.qkv_bias, "self_attn.v_proj.bias", &[kvd])?,
                o_bias: opt(cfg.o_bias, "self_attn.o_proj.bias", &[h])?,
                q_norm: opt(cfg.qk_norm, "self_attn.q_norm.weight", &[hd])?,
                k_norm: opt(cfg.qk_norm, "self_attn.k_norm.weight", &[hd])?,
                post_attention_norm: t("post_attention_layernorm.weight", &[h])?,
                gate_proj: t("mlp.gate_proj.weight", &[im, h])?,
                up_proj: t("mlp.up_proj.weight", &[im, h])?,
                down_proj: t("mlp.down_proj.weight", &[h, im])?,
            });
        }
        let lm_head = if cfg.tie_word_embeddings {
            None
        } else {
            Some(w.tensor_bf16("lm_head.weight", &[v, h])?)
        };
        Ok(ModelWeights {
            embed_tokens: w.tensor_bf16("model.embed_tokens.weight", &[v, h])?,
            layers,
            norm: w.tensor_bf16("model.norm.weight", &[h])?,
            lm_head,
        })
    }
}

/// Writes `cfg` and `weights` as a Hugging Face model directory:
/// `config.json` (transformers 4.x layout) and a bf16 `model.safetensors`.
/// Used to turn a preset into a checkpoint that [`Checkpoint::open`] reads.
pub fn write_checkpoint(dir: &Path, cfg: &ModelConfig, weights: &ModelWeights<'_>) -> Result<()> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| EngineError::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let config_path = dir.join("config.json");
    let text = serde_json::to_string_pretty(&cfg.to_hf_json()).expect("a JSON value serializes");
    std::fs::write(&config_path, text + "\n").map_err(io(&config_path))?;

    let tensors = weights.named_tensors(cfg);
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, _, t)| t.iter().flat_map(|x| x.to_le_bytes()).collect())
        .collect();
    let path = dir.join("model.safetensors");
    let bad = |e: safetensors::SafeTensorError| EngineError::Safetensors {
        path: path.clone(),
        message: e.to_string(),
    };
    let mut views = Vec::with_capacity(tensors.len());
    for ((name, shape, _), b) in tensors.iter().zip(&bytes) {
        let view = safetensors::tensor::TensorView::new(safetensors::Dtype::BF16, shape.clone(), b)
            .map_err(bad)?;
        views.push((name.clone(), view));
    }
    safetensors::serialize_to_file(views, None, &path).map_err(bad)
}

/// A Hugging Face model directory opened for use: its config and its
/// memory-mapped tensors. Build [`ModelWeights`] from it with
/// [`Checkpoint::model_weights`].
#[derive(Debug)]
pub struct Checkpoint {
    /// The normalized config.
    pub config: ModelConfig,
    /// The tensors, memory-mapped.
    pub weights: Weights,
}

impl Checkpoint {
    /// Opens `dir`: `config.json`, optional `generation_config.json`, and
    /// the safetensors file(s).
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let config = ModelConfig::from_dir(dir)?;
        let weights = Weights::from_dir(dir)?;
        Ok(Checkpoint { config, weights })
    }

    /// The model's weights, checked against the config.
    pub fn model_weights(&self) -> Result<ModelWeights<'_>> {
        ModelWeights::from_checkpoint(&self.config, &self.weights)
    }
}
