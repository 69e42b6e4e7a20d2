//! Built-in model presets: real model shapes with seeded random weights, so
//! the engine can be run and benchmarked without downloading a checkpoint.
//!
//! A preset is named (see [`PRESETS`]; the shapes are those of the models'
//! Hugging Face `config.json`) or given as the path of a `config.json`, so any
//! supported configuration can be run with random weights.
//!
//! Random weights are drawn (approximately normal) at a realistic scale —
//! matrices and embeddings N(0, 0.02), norm weights 1 + N(0, 0.02), biases N(0, 0.02) — so the
//! residual stream and logits stay in the range a trained model's do.
//!
//! Each value is a function of the seed, the tensor's Hugging Face name and the
//! element's index alone (a counter-based hash, [`random_value`]), so the host
//! ([`random_weights`]) and the device ([`crate::device_init`]) generate the same
//! bits in any order, on any number of threads or programs.

use std::path::{Path, PathBuf};

use half::bf16;

use crate::config::{Arch, ModelConfig, RopeScaling};
use crate::error::{EngineError, Result};
use crate::model::{LayerWeights, ModelWeights, Tensor};

/// Names of all presets, real-sized first.
pub const PRESETS: &[&str] = &[
    "qwen3-0.6b",
    "qwen3-1.7b",
    "qwen3-4b",
    "qwen3-8b",
    "qwen3-14b",
    "qwen3-32b",
    "qwen2.5-0.5b",
    "llama-3.2-1b",
    "llama-3.1-8b",
    "llama-3.1-70b",
    "tiny-qwen3",
    "tiny-qwen2",
    "tiny-llama3",
];

/// Standard deviation of random matrices, embeddings and biases.
const WEIGHT_STD: f32 = 0.02;

/// The config of preset `name`, or of the `config.json` file `name` is a path
/// to (any path ending in `.json`, or naming an existing file or model
/// directory).
pub fn config(name: &str) -> Result<ModelConfig> {
    if let Some(path) = config_path(name) {
        return if path.is_dir() {
            ModelConfig::from_dir(&path)
        } else {
            let text = std::fs::read_to_string(&path).map_err(|source| EngineError::Io {
                path: path.clone(),
                source,
            })?;
            ModelConfig::from_json_str(&text, &path)
        };
    }
    named_config(name)
}

/// `name` as a path to a config, when it is one rather than a preset name.
fn config_path(name: &str) -> Option<PathBuf> {
    let path = Path::new(name);
    (name.ends_with(".json") || (!PRESETS.contains(&name) && path.exists()))
        .then(|| path.to_path_buf())
}

/// The config of the built-in preset `name`.
fn named_config(name: &str) -> Result<ModelConfig> {
    let qwen3 = |hidden, layers, heads, kv, hd, inter, vocab| ModelConfig {
        arch: Arch::Qwen3,
        hidden_size: hidden,
        num_layers: layers,
        num_heads: heads,
        num_kv_heads: kv,
        head_dim: hd,
        intermediate_size: inter,
        vocab_size: vocab,
        rms_norm_eps: 1e-6,
        rope_theta: 1_000_000.0,
        rope_scaling: RopeScaling::None,
        tie_word_embeddings: true,
        qkv_bias: false,
        o_bias: false,
        qk_norm: true,
        max_position_embeddings: 40960,
        bos_token_id: None,
        eos_token_ids: vec![],
    };
    let llama3_scaling = |factor, original| RopeScaling::Llama3 {
        factor,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: original,
    };
    let qwen3_chat = |c: ModelConfig| ModelConfig {
        bos_token_id: Some(151643),
        eos_token_ids: vec![151645, 151643],
        ..c
    };
    // Llama 3.1: rope scaling factor 8 from 8192 positions, 128k context, untied.
    let llama31 = |c: ModelConfig| ModelConfig {
        arch: Arch::Llama,
        rms_norm_eps: 1e-5,
        rope_theta: 500_000.0,
        rope_scaling: llama3_scaling(8.0, 8192),
        tie_word_embeddings: false,
        qk_norm: false,
        max_position_embeddings: 131072,
        bos_token_id: Some(128000),
        eos_token_ids: vec![128001, 128008, 128009],
        ..c
    };
    let cfg = match name {
        "qwen3-0.6b" => qwen3_chat(qwen3(1024, 28, 16, 8, 128, 3072, 151936)),
        // Qwen3 1.7B-32B: head_dim 128, 8 KV heads; 8B and larger untie the LM head.
        "qwen3-1.7b" => qwen3_chat(qwen3(2048, 28, 16, 8, 128, 6144, 151936)),
        "qwen3-4b" => qwen3_chat(qwen3(2560, 36, 32, 8, 128, 9728, 151936)),
        "qwen3-8b" => ModelConfig {
            tie_word_embeddings: false,
            ..qwen3_chat(qwen3(4096, 36, 32, 8, 128, 12288, 151936))
        },
        "qwen3-14b" => ModelConfig {
            tie_word_embeddings: false,
            ..qwen3_chat(qwen3(5120, 40, 40, 8, 128, 17408, 151936))
        },
        "qwen3-32b" => ModelConfig {
            tie_word_embeddings: false,
            ..qwen3_chat(qwen3(5120, 64, 64, 8, 128, 25600, 151936))
        },
        // Qwen2.5-0.5B: q/k/v biases, no QK-norm, a hidden size of 896 (no multiple of
        // 256, so GGUF's K-quants do not fit its rows: see `bench::quant`).
        "qwen2.5-0.5b" => ModelConfig {
            arch: Arch::Qwen2,
            qkv_bias: true,
            qk_norm: false,
            max_position_embeddings: 32768,
            ..qwen3_chat(qwen3(896, 24, 14, 2, 64, 4864, 151936))
        },
        "llama-3.1-8b" => llama31(qwen3(4096, 32, 32, 8, 128, 14336, 128256)),
        "llama-3.1-70b" => llama31(qwen3(8192, 80, 64, 8, 128, 28672, 128256)),
        "llama-3.2-1b" => ModelConfig {
            arch: Arch::Llama,
            rms_norm_eps: 1e-5,
            rope_theta: 500_000.0,
            rope_scaling: llama3_scaling(32.0, 8192),
            qk_norm: false,
            max_position_embeddings: 131072,
            bos_token_id: Some(128000),
            eos_token_ids: vec![128001, 128008, 128009],
            ..qwen3(2048, 16, 32, 8, 64, 8192, 128256)
        },
        "tiny-qwen3" => ModelConfig {
            eos_token_ids: vec![999],
            ..qwen3(64, 2, 4, 2, 32, 128, 1000)
        },
        "tiny-qwen2" => ModelConfig {
            arch: Arch::Qwen2,
            tie_word_embeddings: false,
            qkv_bias: true,
            qk_norm: false,
            max_position_embeddings: 32768,
            eos_token_ids: vec![996],
            ..qwen3(64, 2, 4, 2, 16, 160, 997)
        },
        "tiny-llama3" => ModelConfig {
            arch: Arch::Llama,
            rms_norm_eps: 1e-5,
            rope_theta: 500_000.0,
            rope_scaling: llama3_scaling(32.0, 64),
            qk_norm: false,
            max_position_embeddings: 4096,
            bos_token_id: Some(0),
            eos_token_ids: vec![998, 999],
            ..qwen3(64, 2, 2, 1, 32, 128, 1000)
        },
        _ => {
            return Err(EngineError::UnknownPreset {
                name: name.to_string(),
                available: PRESETS.join(", "),
            })
        }
    };
    Ok(cfg)
}

/// The config of preset `name` and its random weights drawn from `seed`.
pub fn load(name: &str, seed: u64) -> Result<(ModelConfig, ModelWeights<'static>)> {
    let cfg = config(name)?;
    let w = random_weights(&cfg, seed);
    Ok((cfg, w))
}

/// How one tensor of a preset is drawn: `len` values of `mean + std * N(0, 1)`
/// keyed by its Hugging Face `name` (see [`random_value`]).
#[derive(Clone, Debug, PartialEq)]
pub struct RandomTensor {
    /// The Hugging Face tensor name (part of the hash key).
    pub name: String,
    /// Number of elements.
    pub len: usize,
    /// Mean of the values (1 for norm weights, else 0).
    pub mean: f32,
    /// Standard deviation of the values.
    pub std: f32,
}

/// Every tensor a preset with config `cfg` has, in checkpoint order (as
/// [`ModelWeights::named_tensors`] lists them), with how it is drawn.
pub fn random_tensors(cfg: &ModelConfig) -> Vec<RandomTensor> {
    let (h, qd, kvd, hd, im, v) = (
        cfg.hidden_size,
        cfg.q_dim(),
        cfg.kv_dim(),
        cfg.head_dim,
        cfg.intermediate_size,
        cfg.vocab_size,
    );
    let mut out = Vec::new();
    let mut push = |name: String, len: usize, mean: f32| {
        out.push(RandomTensor {
            name,
            len,
            mean,
            std: WEIGHT_STD,
        })
    };
    push("model.embed_tokens.weight".into(), v * h, 0.0);
    for i in 0..cfg.num_layers {
        let n = |s: &str| format!("model.layers.{i}.{s}");
        push(n("input_layernorm.weight"), h, 1.0);
        push(n("self_attn.q_proj.weight"), qd * h, 0.0);
        push(n("self_attn.k_proj.weight"), kvd * h, 0.0);
        push(n("self_attn.v_proj.weight"), kvd * h, 0.0);
        push(n("self_attn.o_proj.weight"), h * qd, 0.0);
        if cfg.qkv_bias {
            push(n("self_attn.q_proj.bias"), qd, 0.0);
            push(n("self_attn.k_proj.bias"), kvd, 0.0);
            push(n("self_attn.v_proj.bias"), kvd, 0.0);
        }
        if cfg.o_bias {
            push(n("self_attn.o_proj.bias"), h, 0.0);
        }
        if cfg.qk_norm {
            push(n("self_attn.q_norm.weight"), hd, 1.0);
            push(n("self_attn.k_norm.weight"), hd, 1.0);
        }
        push(n("post_attention_layernorm.weight"), h, 1.0);
        push(n("mlp.gate_proj.weight"), im * h, 0.0);
        push(n("mlp.up_proj.weight"), im * h, 0.0);
        push(n("mlp.down_proj.weight"), h * im, 0.0);
    }
    push("model.norm.weight".into(), h, 1.0);
    if !cfg.tie_word_embeddings {
        push("lm_head.weight".into(), v * h, 0.0);
    }
    out
}

/// Seeded random weights with the shapes `cfg` calls for.
///
/// Every tensor's values depend only on `seed`, the tensor's Hugging Face
/// name and the element index, not on the thread count, so a preset is the
/// same on every machine and equal to what [`crate::device_init`] writes on a
/// device.
pub fn random_weights(cfg: &ModelConfig, seed: u64) -> ModelWeights<'static> {
    let mut tensors: std::collections::HashMap<String, Tensor<'static>> = random_tensors(cfg)
        .into_iter()
        .map(|t| {
            let values = random_tensor(seed, &t.name, t.len, t.mean, t.std);
            (t.name, values.into())
        })
        .collect();
    let mut req = |name: &str| -> Tensor<'static> {
        tensors
            .remove(name)
            .expect("random_tensors lists every tensor the config needs")
    };
    let mut layers = Vec::with_capacity(cfg.num_layers);
    for i in 0..cfg.num_layers {
        let n = |s: &str| format!("model.layers.{i}.{s}");
        layers.push(LayerWeights {
            input_norm: req(&n("input_layernorm.weight")),
            q_proj: req(&n("self_attn.q_proj.weight")),
            k_proj: req(&n("self_attn.k_proj.weight")),
            v_proj: req(&n("self_attn.v_proj.weight")),
            o_proj: req(&n("self_attn.o_proj.weight")),
            q_bias: cfg.qkv_bias.then(|| req(&n("self_attn.q_proj.bias"))),
            k_bias: cfg.qkv_bias.then(|| req(&n("self_attn.k_proj.bias"))),
            v_bias: cfg.qkv_bias.then(|| req(&n("self_attn.v_proj.bias"))),
            o_bias: cfg.o_bias.then(|| req(&n("self_attn.o_proj.bias"))),
            q_norm: cfg.qk_norm.then(|| req(&n("self_attn.q_norm.weight"))),
            k_norm: cfg.qk_norm.then(|| req(&n("self_attn.k_norm.weight"))),
            post_attention_norm: req(&n("post_attention_layernorm.weight")),
            gate_proj: req(&n("mlp.gate_proj.weight")),
            up_proj: req(&n("mlp.up_proj.weight")),
            down_proj: req(&n("mlp.down_proj.weight")),
        });
    }
    ModelWeights {
        embed_tokens: req("model.embed_tokens.weight"),
        layers,
        norm: req("model.norm.weight"),
        lm_head: (!cfg.tie_word_embeddings).then(|| req("lm_head.weight")),
    }
}

/// FNV-1a, to turn a tensor name into a seed.
fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xCBF2_9CE4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

/// The two 32-bit hash keys of tensor `name` drawn with `seed`.
pub fn tensor_key(seed: u64, name: &str) -> [u32; 2] {
    let base = seed ^ name_hash(name);
    [base as u32, (base >> 32) as u32]
}

/// murmur3's 32-bit finalizer: a bijection that mixes every input bit into
/// every output bit.
#[inline]
pub(crate) fn fmix32(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x85EB_CA6B);
    x ^= x >> 13;
    x = x.wrapping_mul(0xC2B2_AE35);
    x ^ (x >> 16)
}

/// `1 / 2^16` times the standard deviation of a sum of four 16-bit uniforms'
/// reciprocal: each uniform has variance 65536²/12, the sum 65536²/3.
pub(crate) const IRWIN_HALL_UNIT: f32 = 1.732_050_8 / 65536.0;

/// Element `index` of a tensor keyed `key` ([`tensor_key`]): `mean + std * z`
/// rounded to bf16, `z` approximately N(0, 1).
///
/// Two rounds of murmur3's 32-bit finalizer over the index and the key give 64 random bits; the
/// sum of their four 16-bit halves, centred and scaled to unit variance
/// (Irwin–Hall), is close to normal (bounded at ±3.5σ) and far cheaper than
/// Box–Muller. Every step is exact or one rounded f32 operation, in this order,
/// so the device kernel ([`crate::device_init::random_fill`]) computes the same bits.
#[inline]
pub fn random_value(key: [u32; 2], index: u32, mean: f32, std: f32) -> bf16 {
    let a = fmix32(index.wrapping_mul(0x9E37_79B1) ^ key[0]);
    let b = fmix32(a ^ key[1]);
    let sum = (a & 0xFFFF) + (a >> 16) + (b & 0xFFFF) + (b >> 16);
    let z = (sum as f32 - 131_070.0) * IRWIN_HALL_UNIT;
    bf16::from_f32(mean + std * z)
}

/// Elements per thread's share below which generation stays on one thread.
const PARALLEL_MIN: usize = 1 << 18;

/// `n` values of `mean + std * N(0, 1)`, rounded to bf16: element `i` is
/// [`random_value`]`(tensor_key(seed, name), i, ..)`.
///
/// # Panics
/// When `n` exceeds `u32::MAX + 1` elements (no model tensor is that large).
pub fn random_tensor(seed: u64, name: &str, n: usize, mean: f32, std: f32) -> Vec<bf16> {
    assert!(
        n <= 1 << 32,
        "tensor `{name}` has {n} elements, more than 32-bit indices address"
    );
    let key = tensor_key(seed, name);
    let mut out = vec![bf16::ZERO; n];
    let fill = |first: usize, part: &mut [bf16]| {
        for (i, o) in part.iter_mut().enumerate() {
            *o = random_value(key, (first + i) as u32, mean, std);
        }
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    if n < 2 * PARALLEL_MIN || threads == 1 {
        fill(0, &mut out);
    } else {
        let per = n.div_ceil(threads).max(PARALLEL_MIN);
        std::thread::scope(|s| {
            for (t, part) in out.chunks_mut(per).enumerate() {
                s.spawn(move || fill(t * per, part));
            }
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_tensor_has_requested_mean_and_std() {
        let v = random_tensor(3, "x", 1 << 16, 0.5, 0.02);
        let n = v.len() as f64;
        let mean = v.iter().map(|x| f64::from(x.to_f32())).sum::<f64>() / n;
        let var = v
            .iter()
            .map(|x| (f64::from(x.to_f32()) - mean).powi(2))
            .sum::<f64>()
            / n;
        assert!((mean - 0.5).abs() < 1e-3, "mean {mean}");
        assert!((var.sqrt() - 0.02).abs() < 1e-3, "std {}", var.sqrt());
        // Generation over threads is the per-element function.
        let big = random_tensor(3, "x", PARALLEL_MIN * 5 + 5, 0.0, 1.0);
        let key = tensor_key(3, "x");
        for i in [
            0,
            1,
            PARALLEL_MIN - 1,
            PARALLEL_MIN,
            3 * PARALLEL_MIN + 7,
            big.len() - 1,
        ] {
            assert_eq!(big[i], random_value(key, i as u32, 0.0, 1.0), "element {i}");
        }
        assert_eq!(
            &big[..1 << 16],
            &random_tensor(3, "x", 1 << 16, 0.0, 1.0)[..]
        );
        // Another name or seed gives other values.
        assert_ne!(big[..64], random_tensor(3, "y", 64, 0.0, 1.0)[..]);
        assert_ne!(big[..64], random_tensor(4, "x", 64, 0.0, 1.0)[..]);
    }

    /// The values have the Irwin–Hall shape (n = 4) of the sum they come from:
    /// symmetric, 66.9% within one standard deviation (a normal's 68.3%),
    /// nothing past 3.5, and neighbours uncorrelated.
    #[test]
    fn random_values_are_close_to_normal_and_independent() {
        let v: Vec<f64> = random_tensor(11, "w", 1 << 18, 0.0, 1.0)
            .iter()
            .map(|x| f64::from(x.to_f32()))
            .collect();
        let n = v.len() as f64;
        let within = v.iter().filter(|x| x.abs() < 1.0).count() as f64 / n;
        assert!((within - 0.6693).abs() < 0.004, "within 1 sigma: {within}");
        assert!(v.iter().all(|x| x.abs() <= 3.5));
        let skew = v.iter().map(|x| x.powi(3)).sum::<f64>() / n;
        assert!(skew.abs() < 0.02, "skew {skew}");
        let lag1 = v.windows(2).map(|w| w[0] * w[1]).sum::<f64>() / n;
        assert!(lag1.abs() < 0.01, "lag-1 correlation {lag1}");
    }

    #[test]
    fn random_tensors_match_named_tensors() {
        for name in PRESETS {
            let cfg = config(name).unwrap();
            let specs = random_tensors(&cfg);
            if cfg.hidden_size <= 64 {
                let w = random_weights(&cfg, 1);
                let named = w.named_tensors(&cfg);
                assert_eq!(specs.len(), named.len(), "{name}");
                for (s, (n, shape, t)) in specs.iter().zip(&named) {
                    assert_eq!((&s.name, s.len), (n, shape.iter().product()), "{name}");
                    assert_eq!(t.len(), s.len);
                }
            }
            let params: usize = specs.iter().map(|s| s.len).sum();
            assert!(params > 0, "{name}");
        }
    }

    /// Parameter counts of the real-shaped presets, against the published sizes.
    #[test]
    fn real_presets_have_their_published_sizes() {
        let billions = |name: &str| {
            let cfg = config(name).unwrap();
            random_tensors(&cfg).iter().map(|s| s.len).sum::<usize>() as f64 / 1e9
        };
        for (name, want) in [
            ("qwen3-0.6b", 0.596),
            ("qwen3-1.7b", 1.72),
            ("qwen3-4b", 4.02),
            ("qwen3-8b", 8.19),
            ("qwen3-14b", 14.77),
            ("qwen3-32b", 32.76),
            ("qwen2.5-0.5b", 0.494),
            ("llama-3.2-1b", 1.236),
            ("llama-3.1-8b", 8.03),
            ("llama-3.1-70b", 70.55),
        ] {
            let got = billions(name);
            assert!(
                (got - want).abs() / want < 0.01,
                "{name}: {got:.3}B params, want {want}B"
            );
        }
    }

    #[test]
    fn a_config_json_path_is_a_preset() {
        let dir = std::env::temp_dir().join(format!("tilefuse-preset-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let want = config("qwen3-8b").unwrap();
        let path = dir.join("config.json");
        std::fs::write(&path, want.to_hf_json().to_string()).unwrap();
        assert_eq!(config(path.to_str().unwrap()).unwrap(), want);
        assert_eq!(config(dir.to_str().unwrap()).unwrap(), want);
        let e = config(dir.join("nope.json").to_str().unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("nope.json"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
