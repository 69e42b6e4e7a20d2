//! Rotary position embeddings: the inverse frequencies (with llama3 scaling) and the
//! cos/sin values at a position, rounded to bf16 as transformers hands them to the bf16
//! math. The host reference ([`crate::reference`]) rotates with them directly; the
//! decoder uploads them once as tables ([`tables`]) that `attention_split` reads by
//! position.

use half::bf16;

use crate::config::{ModelConfig, RopeScaling};

/// Rotary inverse frequencies, `head_dim / 2` of them, including llama3
/// scaling, computed in f32 as transformers does.
pub fn inv_freq(cfg: &ModelConfig) -> Vec<f32> {
    let dim = cfg.head_dim;
    let base = cfg.rope_theta as f32;
    let plain = (0..dim / 2).map(|i| 1.0 / base.powf((2 * i) as f32 / dim as f32));
    match cfg.rope_scaling {
        RopeScaling::None => plain.collect(),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => {
            let (factor, low, high) = (
                factor as f32,
                low_freq_factor as f32,
                high_freq_factor as f32,
            );
            let old_ctx = original_max_position_embeddings as f32;
            let low_freq_wavelen = old_ctx / low;
            let high_freq_wavelen = old_ctx / high;
            plain
                .map(|inv| {
                    // `scalar / tensor` in torch is `reciprocal(tensor) * scalar`;
                    // mirrored because the two differ in the last f32 bit.
                    let wavelen = (1.0 / inv) * (2.0 * std::f32::consts::PI);
                    if wavelen < high_freq_wavelen {
                        // High frequencies: untouched.
                        inv
                    } else if wavelen > low_freq_wavelen {
                        // Low frequencies: fully interpolated.
                        inv / factor
                    } else {
                        // In between: blend the two.
                        let smooth = ((1.0 / wavelen) * old_ctx - low) / (high - low);
                        (1.0 - smooth) * inv / factor + smooth * inv
                    }
                })
                .collect()
        }
    }
}

/// `cos` and `sin` of `pos * inv_freq` for each frequency: the angle in f32, each value
/// rounded to bf16 (held as f32).
pub fn cos_sin(inv_freq: &[f32], pos: usize) -> (Vec<f32>, Vec<f32>) {
    let round = |x: f32| bf16::from_f32(x).to_f32();
    inv_freq
        .iter()
        .map(|fr| {
            let angle = fr * pos as f32;
            (round(angle.cos()), round(angle.sin()))
        })
        .unzip()
}

/// The decoder's RoPE tables for positions `0..max_seq_len`: `[max_seq_len, head_dim / 2]`
/// cos and sin values, row `pos` as [`cos_sin`] gives it.
pub fn tables(cfg: &ModelConfig, max_seq_len: usize) -> (Vec<f32>, Vec<f32>) {
    let inv_freq = inv_freq(cfg);
    let mut cos = Vec::with_capacity(max_seq_len * inv_freq.len());
    let mut sin = Vec::with_capacity(max_seq_len * inv_freq.len());
    for pos in 0..max_seq_len {
        let (c, s) = cos_sin(&inv_freq, pos);
        cos.extend(c);
        sin.extend(s);
    }
    (cos, sin)
}
