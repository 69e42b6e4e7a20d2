//! Quantized weights for the decode benchmark (`tilefuse bench --weights q4_k_m`,
//! `q5_k_m`, `q3_k_m`, `iq4_xs`, `q4_0` or `q8_0`):
//! random blocks in GGUF's formats at a preset's real shapes, mixed per matrix as
//! llama.cpp's quantizer mixes them.

use std::fmt;
use std::str::FromStr;

use half::f16;

use super::Rng;
use crate::config::ModelConfig;
use crate::decode::{QuantLayer, QuantWeights};
use crate::error::{EngineError, Result};
use crate::gguf::quant::{GgmlType, PackedMatrix};

/// The weight format a benchmark decodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WeightFormat {
    /// Every matrix bf16 (the dense kernels).
    #[default]
    Bf16,
    /// Every matrix Q8_0, the LM head too.
    Q8_0,
    /// llama.cpp's Q4_K_M mix (see [`WeightFormat::layer_types`]).
    Q4KM,
    /// llama.cpp's Q5_K_M mix: Q4_K_M's with Q5_K for Q4_K.
    Q5KM,
    /// llama.cpp's Q3_K_M mix: Q3_K beside Q4_K and Q5_K (Q3_K read at 130 bytes a super-block by the Q6_K kernels).
    Q3KM,
    /// llama.cpp's Q4_0: every layer matrix Q4_0, the LM head Q6_K.
    Q4_0,
    /// llama.cpp's IQ4_XS mix (without an importance matrix): IQ4_XS beside Q5_K (read
    /// at 138 bytes a super-block by the Q4_K kernels).
    IQ4XS,
}

impl FromStr for WeightFormat {
    type Err = EngineError;

    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "bf16" => Ok(WeightFormat::Bf16),
            "q8_0" => Ok(WeightFormat::Q8_0),
            "q4_k_m" => Ok(WeightFormat::Q4KM),
            "q5_k_m" => Ok(WeightFormat::Q5KM),
            "q3_k_m" => Ok(WeightFormat::Q3KM),
            "q4_0" => Ok(WeightFormat::Q4_0),
            "iq4_xs" => Ok(WeightFormat::IQ4XS),
            _ => Err(EngineError::Option {
                message: format!(
                    "unknown weight format `{s}` (bf16, q8_0, q4_k_m, q5_k_m, q3_k_m, iq4_xs, q4_0)"
                ),
            }),
        }
    }
}

impl fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WeightFormat::Bf16 => "bf16",
            WeightFormat::Q8_0 => "q8_0",
            WeightFormat::Q4KM => "q4_k_m",
            WeightFormat::Q5KM => "q5_k_m",
            WeightFormat::Q3KM => "q3_k_m",
            WeightFormat::Q4_0 => "q4_0",
            WeightFormat::IQ4XS => "iq4_xs",
        })
    }
}

/// The types of one layer's matrices: `(q, k, v, o, gate, up, down)`.
pub type LayerTypes = [GgmlType; 7];

impl WeightFormat {
    /// The types of layer `layer` of `layers` (`None` for bf16).
    ///
    /// Q4_K_M follows llama.cpp's rule (`llama_tensor_get_type`): Q4_K everywhere
    /// except `attn_v` and `ffn_down` of the layers that get more bits, Q6_K: the first
    /// and last eighth of the layers, and every third layer between them
    /// (`i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2`). The LM head (the embedding
    /// table when tied) is Q6_K. Q5_K_M is the same rule with Q5_K for Q4_K. Q3_K_M
    /// is Q3_K for q, k, gate and up, Q4_K for O, and for `attn_v` Q5_K in the first
    /// two layers and Q4_K after, for `ffn_down` Q5_K in the first sixteenth of the
    /// layers and Q4_K after (llama.cpp's rule for every architecture but Falcon). Q4_0
    /// is Q4_0 everywhere (its rule raises no matrix), with a Q6_K head. IQ4_XS is
    /// IQ4_XS everywhere but `ffn_down` in the first eighth of the layers, Q5_K (the rule
    /// without an importance matrix), and `attn_v` where four or more query heads share
    /// a KV head, Q5_K ([`WeightFormat::random_weights`] applies that one, which needs
    /// the config); a Q6_K head. Matrices whose rows a K-quant does not fit take
    /// [`fallback`]'s type in [`WeightFormat::random_weights`].
    pub fn layer_types(self, layer: usize, layers: usize) -> Option<LayerTypes> {
        let base = match self {
            WeightFormat::Bf16 => return None,
            WeightFormat::Q8_0 => return Some([GgmlType::Q8_0; 7]),
            WeightFormat::Q4_0 => return Some([GgmlType::Q4_0; 7]),
            WeightFormat::IQ4XS => {
                let (iq, q5) = (GgmlType::IQ4_XS, GgmlType::Q5_K);
                let down = if layer < layers / 8 { q5 } else { iq };
                return Some([iq, iq, iq, iq, iq, iq, down]);
            }
            WeightFormat::Q4KM => GgmlType::Q4_K,
            WeightFormat::Q5KM => GgmlType::Q5_K,
            WeightFormat::Q3KM => {
                let (q3, q4, q5) = (GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K);
                let v = if layer < 2 { q5 } else { q4 };
                let down = if layer < layers / 16 { q5 } else { q4 };
                return Some([q3, q3, v, q4, q3, q3, down]);
            }
        };
        let (first, last) = (layers / 8, 7 * layers / 8);
        let more = layer < first || layer >= last || (layer - first) % 3 == 2;
        let vd = if more { GgmlType::Q6_K } else { base };
        Some([base, base, vd, base, base, base, vd])
    }

    /// The LM head's type (`None` for bf16).
    pub fn head_type(self) -> Option<GgmlType> {
        match self {
            WeightFormat::Bf16 => None,
            WeightFormat::Q8_0 => Some(GgmlType::Q8_0),
            WeightFormat::Q4KM
            | WeightFormat::Q5KM
            | WeightFormat::Q3KM
            | WeightFormat::Q4_0
            | WeightFormat::IQ4XS => Some(GgmlType::Q6_K),
        }
    }

    /// Random quantized matrices of `cfg`'s shapes in this format (empty for bf16),
    /// seeded by `seed`.
    pub fn random_weights(self, cfg: &ModelConfig, seed: u64) -> Result<QuantWeights> {
        let mut rng = Rng::new(seed ^ 0x6767_7566);
        let h = cfg.hidden_size;
        let (qd, kvd, im) = (cfg.q_dim(), cfg.kv_dim(), cfg.intermediate_size);
        let mut layers = Vec::new();
        for i in 0..cfg.num_layers {
            let Some(mut t) = self.layer_types(i, cfg.num_layers) else {
                break;
            };
            if self == WeightFormat::IQ4XS && cfg.num_heads >= 4 * cfg.num_kv_heads {
                t[2] = GgmlType::Q5_K;
            }
            let mut m =
                |ty, rows, cols| random_matrix(&mut rng, fallback(ty, cols), rows, cols).map(Some);
            layers.push(QuantLayer {
                q: m(t[0], qd, h)?,
                k: m(t[1], kvd, h)?,
                v: m(t[2], kvd, h)?,
                o: m(t[3], h, qd)?,
                gate: m(t[4], im, h)?,
                up: m(t[5], im, h)?,
                down: m(t[6], h, im)?,
            });
        }
        let lm_head = match self.head_type() {
            Some(ty) if crate::gguf::quant::head_reads_quantized(ty) => {
                Some(random_matrix(&mut rng, fallback(ty, h), cfg.vocab_size, h)?)
            }
            _ => None,
        };
        Ok(QuantWeights { layers, lm_head })
    }
}

/// The type llama.cpp's quantizer writes for a matrix meant to be `ty` whose rows hold
/// `cols` elements: a K-quant's 256-element super-blocks must tile the row, else
/// (`llama_tensor_get_type`'s fallback) Q4_K becomes Q5_0, Q5_K Q5_1, Q6_K Q8_0 and
/// Q3_K and IQ4_XS IQ4_NL, as in Qwen2.5-0.5B's Q4_K_M files (rows of 896). The engine reads Q5_0
/// (in such rows), IQ4_NL and Q8_0 as Q8_0, Q5_1 as Q8_0 with block offsets
/// ([`crate::gguf::quant`]).
pub fn fallback(ty: GgmlType, cols: usize) -> GgmlType {
    match ty {
        GgmlType::Q4_K if cols % 256 != 0 => GgmlType::Q5_0,
        GgmlType::Q5_K if cols % 256 != 0 => GgmlType::Q5_1,
        GgmlType::Q6_K if cols % 256 != 0 => GgmlType::Q8_0,
        GgmlType::Q3_K | GgmlType::IQ4_XS if cols % 256 != 0 => GgmlType::IQ4_NL,
        _ => ty,
    }
}

/// A `[rows, cols]` matrix of random blocks of `ty`: random quant and sub-block scale
/// bytes, super-block scales drawn so that the weights are of the size of a trained
/// model's (a few hundredths).
pub fn random_matrix(
    rng: &mut Rng,
    ty: GgmlType,
    rows: usize,
    cols: usize,
) -> Result<PackedMatrix> {
    let (block, size) = ty.block().ok_or_else(|| EngineError::Unsupported {
        message: format!("no blocks for type {ty}"),
    })?;
    let (block, size) = (block as usize, size as usize);
    let mut bytes = vec![0u8; rows * cols / block * size];
    for chunk in bytes.chunks_mut(8) {
        let r = rng.next_u64().to_le_bytes();
        chunk.copy_from_slice(&r[..chunk.len()]);
    }
    // Largest |q| times scale: Q8_0 128 d, Q5_0 16 d, Q4_0 8 d, Q4_K 15 * 63 d, Q5_K
    // 31 * 63 d, Q6_K 32 * 128 d, Q3_K 4 * 32 d, IQ4_NL 127 d, IQ4_XS 127 * 32 d.
    let d_max = match ty {
        GgmlType::Q8_0 | GgmlType::IQ4_NL | GgmlType::Q3_K => 0.05 / 128.0,
        GgmlType::Q5_0 | GgmlType::Q5_1 => 0.05 / 16.0,
        GgmlType::Q4_0 => 0.05 / 8.0,
        GgmlType::Q4_K => 0.05 / 945.0,
        GgmlType::Q5_K => 0.05 / 1953.0,
        GgmlType::IQ4_XS => 0.05 / 4064.0,
        _ => 0.05 / 4096.0,
    };
    for blk in bytes.chunks_exact_mut(size) {
        let d = f16::from_f32(d_max * (0.5 + (rng.next_u32() % 1024) as f32 / 2048.0));
        match ty {
            GgmlType::Q8_0
            | GgmlType::Q5_0
            | GgmlType::Q4_0
            | GgmlType::IQ4_NL
            | GgmlType::IQ4_XS => blk[0..2].copy_from_slice(&d.to_le_bytes()),
            GgmlType::Q5_1 => {
                // The offset centres the block's 0..32 quants on zero, as trained
                // weights' minima do.
                blk[0..2].copy_from_slice(&d.to_le_bytes());
                blk[2..4].copy_from_slice(&f16::from_f32(-16.0 * d.to_f32()).to_le_bytes());
            }
            GgmlType::Q4_K | GgmlType::Q5_K => {
                blk[0..2].copy_from_slice(&d.to_le_bytes());
                blk[2..4].copy_from_slice(&d.to_le_bytes());
            }
            _ => blk[size - 2..].copy_from_slice(&d.to_le_bytes()),
        }
    }
    PackedMatrix::pack(ty, &bytes, rows, cols, "random")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_k_m_gives_more_bits_to_the_edges_and_every_third_layer() {
        // 28 layers (Qwen3-0.6B): first = 3, last = 24.
        let six: Vec<usize> = (0..28)
            .filter(|&i| WeightFormat::Q4KM.layer_types(i, 28).unwrap()[2] == GgmlType::Q6_K)
            .collect();
        assert_eq!(six, [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27]);
        let t = WeightFormat::Q4KM.layer_types(3, 28).unwrap();
        assert!(t.iter().all(|&t| t == GgmlType::Q4_K));
        assert_eq!(
            "Q4_K_M".parse::<WeightFormat>().unwrap(),
            WeightFormat::Q4KM
        );
        assert!("q5_k".parse::<WeightFormat>().is_err());
        // Q5_K_M: the same layers take more bits, Q5_K elsewhere.
        for i in 0..28 {
            let (t4, t5) = (
                WeightFormat::Q4KM.layer_types(i, 28).unwrap(),
                WeightFormat::Q5KM.layer_types(i, 28).unwrap(),
            );
            for (a, b) in t4.iter().zip(t5) {
                let want = if *a == GgmlType::Q4_K {
                    GgmlType::Q5_K
                } else {
                    *a
                };
                assert_eq!(b, want, "layer {i}");
            }
        }
        assert_eq!(WeightFormat::Q5KM.head_type(), Some(GgmlType::Q6_K));
        // Q3_K_M at 36 layers (Qwen3-8B): v Q5_K in layers 0 and 1, down in layers 0
        // and 1 (36 / 16 = 2), Q4_K after; O always Q4_K; the rest Q3_K.
        let (q3, q4, q5) = (GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K);
        assert_eq!(
            WeightFormat::Q3KM.layer_types(1, 36),
            Some([q3, q3, q5, q4, q3, q3, q5])
        );
        assert_eq!(
            WeightFormat::Q3KM.layer_types(2, 36),
            Some([q3, q3, q4, q4, q3, q3, q4])
        );
        assert_eq!(WeightFormat::Q3KM.head_type(), Some(GgmlType::Q6_K));
        assert_eq!(fallback(q3, 896), GgmlType::IQ4_NL);
        assert_eq!(
            "q5_k_m".parse::<WeightFormat>().unwrap().to_string(),
            "q5_k_m"
        );
        // Q4_0: every layer matrix Q4_0, read in nibble words at the presets' rows.
        let q4_0: WeightFormat = "Q4_0".parse().unwrap();
        assert_eq!(q4_0.layer_types(5, 28), Some([GgmlType::Q4_0; 7]));
        assert_eq!(q4_0.head_type(), Some(GgmlType::Q6_K));
        let mut cfg = crate::preset::config("qwen3-0.6b").unwrap();
        (cfg.num_layers, cfg.intermediate_size, cfg.vocab_size) = (1, 512, 512);
        let w = q4_0.random_weights(&cfg, 2).unwrap();
        let gate = w.layers[0].gate.as_ref().unwrap();
        assert_eq!(gate.ggml_type(), GgmlType::Q4_0);
        assert_eq!(gate.device_bytes(), 512 * 1024 / 32 * 18);
    }

    /// IQ4_XS without an importance matrix: Q5_K down projections in the first eighth of
    /// the layers, a Q5_K `v` where four or more query heads share a KV head (Qwen3-8B's
    /// 32 over 8, not Qwen3-0.6B's 16 over 8), IQ4_XS elsewhere at 138 bytes a
    /// super-block; IQ4_NL in rows no super-block fits.
    #[test]
    fn iq4_xs_keeps_llama_cpps_q5_k_matrices() {
        let (iq, q5) = (GgmlType::IQ4_XS, GgmlType::Q5_K);
        let f: WeightFormat = "IQ4_XS".parse().unwrap();
        assert_eq!(f.to_string(), "iq4_xs");
        assert_eq!(f.layer_types(3, 36), Some([iq, iq, iq, iq, iq, iq, q5]));
        assert_eq!(f.layer_types(4, 36), Some([iq; 7]));
        assert_eq!(f.head_type(), Some(GgmlType::Q6_K));
        assert_eq!(fallback(iq, 896), GgmlType::IQ4_NL);
        for (preset, v) in [("qwen3-0.6b", iq), ("qwen3-8b", q5)] {
            let mut cfg = crate::preset::config(preset).unwrap();
            (cfg.num_layers, cfg.intermediate_size, cfg.vocab_size) = (9, 512, 512);
            cfg.hidden_size = 512;
            let w = f.random_weights(&cfg, 5).unwrap();
            let l = &w.layers[1];
            assert_eq!(l.v.as_ref().unwrap().ggml_type(), v, "{preset}");
            assert_eq!(l.down.as_ref().unwrap().ggml_type(), iq, "{preset}");
            assert_eq!(w.layers[0].down.as_ref().unwrap().ggml_type(), q5);
            let gate = l.gate.as_ref().unwrap();
            assert_eq!(gate.device_bytes(), 512 * 512 / 256 * 138);
            // Values of a trained model's size: within 0.05.
            assert!(gate.dequantize().iter().all(|v| v.abs() <= 0.05));
        }
    }

    /// Qwen2.5-0.5B in Q4_K_M as llama.cpp writes it: the rows of 896 (q, k, v, o,
    /// gate, up and the tied head) fall back to Q5_0 and Q8_0, the down projection's
    /// rows of 4864 keep their K-quants; the bench reads them all as the engine does.
    #[test]
    fn rows_no_k_quant_fits_take_llama_cpps_fallback_types() {
        assert_eq!(fallback(GgmlType::Q4_K, 896), GgmlType::Q5_0);
        assert_eq!(fallback(GgmlType::Q6_K, 896), GgmlType::Q8_0);
        assert_eq!(fallback(GgmlType::Q4_K, 4864), GgmlType::Q4_K);
        assert_eq!(fallback(GgmlType::Q8_0, 896), GgmlType::Q8_0);
        assert_eq!(fallback(GgmlType::Q5_K, 896), GgmlType::Q5_1);
        assert_eq!(fallback(GgmlType::Q5_K, 4864), GgmlType::Q5_K);
        let mut cfg = crate::preset::config("qwen2.5-0.5b").unwrap();
        // Eight layers (Q4_K_M's first eighth is layer 0), short down rows (still a
        // multiple of 256) and a small vocabulary keep the test quick.
        (cfg.num_layers, cfg.intermediate_size, cfg.vocab_size) = (8, 512, 512);
        let w = WeightFormat::Q4KM.random_weights(&cfg, 1).unwrap();
        let l = &w.layers[0];
        for m in [&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up] {
            let m = m.as_ref().unwrap();
            assert_eq!(m.ggml_type(), GgmlType::Q8_0, "{:?}", m.shape());
        }
        // Layer 0 is Q4_K_M's first eighth: its down projection is Q6_K, layer 1's Q4_K.
        assert_eq!(l.down.as_ref().unwrap().ggml_type(), GgmlType::Q6_K);
        assert_eq!(
            w.layers[1].down.as_ref().unwrap().ggml_type(),
            GgmlType::Q4_K
        );
        let head = w.lm_head.as_ref().unwrap();
        assert_eq!(
            (head.ggml_type(), head.shape()),
            (GgmlType::Q8_0, (512, 896))
        );
        // A Q5_0 matrix's values are its integers in -16..16 times its scale.
        let mut rng = Rng::new(3);
        let w = random_matrix(&mut rng, GgmlType::Q5_0, 2, 896).unwrap();
        let (GgmlType::Q8_0, PackedMatrix::Q8_0 { q, .. }) = (w.ggml_type(), &w) else {
            panic!("Q5_0 packs as Q8_0");
        };
        let bytes = q.iter().flat_map(|w| w.to_le_bytes());
        assert!(bytes.map(|b| b as i8).all(|v| (-16..16).contains(&v)));
    }

    #[test]
    fn random_matrices_have_trained_sizes() {
        let mut rng = Rng::new(1);
        for ty in [
            GgmlType::Q8_0,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
            GgmlType::Q4_0,
            GgmlType::Q3_K,
            GgmlType::IQ4_NL,
        ] {
            let w = random_matrix(&mut rng, ty, 4, 512).unwrap().dequantize();
            let max = w.iter().fold(0f32, |m, v| m.max(v.abs()));
            let rms = (w.iter().map(|v| v * v).sum::<f32>() / w.len() as f32).sqrt();
            assert!(w.iter().all(|v| v.is_finite()), "{ty}");
            assert!(max <= 0.06 && rms > 1e-3, "{ty}: max {max}, rms {rms}");
        }
    }
}
