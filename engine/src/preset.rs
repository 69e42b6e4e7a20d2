//! Built-in model presets: real model shapes with seeded random weights, so
//! the engine can be run and benchmarked without downloading a checkpoint.
//!
//! Random weights are drawn (approximately normal) at a realistic scale —
//! matrices and embeddings N(0, 0.02), norm weights 1 + N(0, 0.02), biases N(0, 0.02) — so the
//! residual stream and logits stay in the range a trained model's do.

use half::bf16;

use crate::config::{Arch, ModelConfig, RopeScaling};
use crate::error::{EngineError, Result};
use crate::model::{LayerWeights, ModelWeights, Tensor};

/// Names of all presets, real-sized first.
pub const PRESETS: &[&str] = &[
    "qwen3-0.6b",
    "llama-3.2-1b",
    "tiny-qwen3",
    "tiny-qwen2",
    "tiny-llama3",
];

/// Standard deviation of random matrices, embeddings and biases.
const WEIGHT_STD: f32 = 0.02;

/// The config of preset `name`.
pub fn config(name: &str) -> Result<ModelConfig> {
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
    let llama3_scaling = |original| RopeScaling::Llama3 {
        factor: 32.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: original,
    };
    let cfg = match name {
        "qwen3-0.6b" => ModelConfig {
            bos_token_id: Some(151643),
            eos_token_ids: vec![151645, 151643],
            ..qwen3(1024, 28, 16, 8, 128, 3072, 151936)
        },
        "llama-3.2-1b" => ModelConfig {
            arch: Arch::Llama,
            rms_norm_eps: 1e-5,
            rope_theta: 500_000.0,
            rope_scaling: llama3_scaling(8192),
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
            rope_scaling: llama3_scaling(64),
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

/// Seeded random weights with the shapes `cfg` calls for.
///
/// Every tensor's values depend only on `seed` and the tensor's Hugging Face
/// name, not on the thread count, so a preset is the same on every machine.
pub fn random_weights(cfg: &ModelConfig, seed: u64) -> ModelWeights<'static> {
    let (h, qd, kvd, hd, im, v) = (
        cfg.hidden_size,
        cfg.q_dim(),
        cfg.kv_dim(),
        cfg.head_dim,
        cfg.intermediate_size,
        cfg.vocab_size,
    );
    let mat = |name: &str, n: usize| -> Tensor<'static> {
        random_tensor(seed, name, n, 0.0, WEIGHT_STD).into()
    };
    let norm = |name: &str, n: usize| -> Tensor<'static> {
        random_tensor(seed, name, n, 1.0, WEIGHT_STD).into()
    };
    let layers = (0..cfg.num_layers)
        .map(|i| {
            let n = |s: &str| format!("model.layers.{i}.{s}");
            let bias = |on: bool, s: &str, len: usize| on.then(|| mat(&n(s), len));
            LayerWeights {
                input_norm: norm(&n("input_layernorm.weight"), h),
                q_proj: mat(&n("self_attn.q_proj.weight"), qd * h),
                k_proj: mat(&n("self_attn.k_proj.weight"), kvd * h),
                v_proj: mat(&n("self_attn.v_proj.weight"), kvd * h),
                o_proj: mat(&n("self_attn.o_proj.weight"), h * qd),
                q_bias: bias(cfg.qkv_bias, "self_attn.q_proj.bias", qd),
                k_bias: bias(cfg.qkv_bias, "self_attn.k_proj.bias", kvd),
                v_bias: bias(cfg.qkv_bias, "self_attn.v_proj.bias", kvd),
                o_bias: bias(cfg.o_bias, "self_attn.o_proj.bias", h),
                q_norm: cfg.qk_norm.then(|| norm(&n("self_attn.q_norm.weight"), hd)),
                k_norm: cfg.qk_norm.then(|| norm(&n("self_attn.k_norm.weight"), hd)),
                post_attention_norm: norm(&n("post_attention_layernorm.weight"), h),
                gate_proj: mat(&n("mlp.gate_proj.weight"), im * h),
                up_proj: mat(&n("mlp.up_proj.weight"), im * h),
                down_proj: mat(&n("mlp.down_proj.weight"), h * im),
            }
        })
        .collect();
    ModelWeights {
        embed_tokens: mat("model.embed_tokens.weight", v * h),
        layers,
        norm: norm("model.norm.weight", h),
        lm_head: (!cfg.tie_word_embeddings).then(|| mat("lm_head.weight", v * h)),
    }
}

/// splitmix64: tiny, fast, and good enough for test weights.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// FNV-1a, to turn a tensor name into a seed.
fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xCBF2_9CE4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

/// Elements per independently seeded chunk; fixed so results do not depend
/// on how chunks are spread over threads.
const CHUNK: usize = 1 << 18;

/// `n` values of `mean + std * N(0, 1)`, rounded to bf16.
fn random_tensor(seed: u64, name: &str, n: usize, mean: f32, std: f32) -> Vec<bf16> {
    let mut out = vec![bf16::ZERO; n];
    let base = seed ^ name_hash(name);
    let fill = |ci: usize, chunk: &mut [bf16]| {
        let mut state = base ^ (ci as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93);
        // Irwin–Hall: the sum of four 16-bit uniforms from one draw, centred
        // and scaled to unit variance, is close to N(0, 1) (bounded at ±3.5σ)
        // and far cheaper than Box–Muller for a billion weights.
        // Each 16-bit uniform has variance 65536²/12, so the sum has 65536²/3.
        let unit = 3f32.sqrt() / 65536.0;
        for o in chunk.iter_mut() {
            let r = splitmix64(&mut state);
            let sum = (r & 0xFFFF) + ((r >> 16) & 0xFFFF) + ((r >> 32) & 0xFFFF) + (r >> 48);
            let z = (sum as f32 - 2.0 * 65535.0) * unit;
            *o = bf16::from_f32(mean + std * z);
        }
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    if n <= CHUNK || threads == 1 {
        for (ci, chunk) in out.chunks_mut(CHUNK).enumerate() {
            fill(ci, chunk);
        }
    } else {
        let chunks: Vec<(usize, &mut [bf16])> = out.chunks_mut(CHUNK).enumerate().collect();
        let per = chunks.len().div_ceil(threads);
        let mut groups: Vec<Vec<(usize, &mut [bf16])>> = Vec::new();
        let mut it = chunks.into_iter().peekable();
        while it.peek().is_some() {
            groups.push(it.by_ref().take(per).collect());
        }
        std::thread::scope(|s| {
            for group in groups {
                s.spawn(move || {
                    for (ci, chunk) in group {
                        fill(ci, chunk);
                    }
                });
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
        // Chunked generation is independent of the thread split.
        let big = random_tensor(3, "x", CHUNK * 3 + 5, 0.0, 1.0);
        assert_eq!(
            &big[..1 << 16],
            &random_tensor(3, "x", 1 << 16, 0.0, 1.0)[..]
        );
    }
}
