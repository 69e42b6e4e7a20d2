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

/// The llama3 scaling whose per-frequency divisors are `factors` (`head_dim / 2` of
/// them, as llama.cpp's converter stores them in a GGUF file's `rope_freqs.weight`:
/// `1` for the untouched high frequencies, `factor` for the fully scaled low ones,
/// `1 / ((1 - smooth) / factor + smooth)` between), for plain RoPE of `theta` and
/// `head_dim`: `None` when every divisor is 1.
///
/// The rule depends on `original_max_position_embeddings`, `low_freq_factor` and
/// `high_freq_factor` only through their ratios, so `low_freq_factor` is taken as 1 (as
/// every Llama 3.1 / 3.2 config has it) and the other two come from the line `smooth`
/// draws against the frequency over the blended band, rounded (the original context to
/// a whole number). The result must give back every divisor within f32 rounding
/// (`1e-5` relative); an error says how far the worst one is off otherwise.
pub fn llama3_from_factors(
    theta: f64,
    head_dim: usize,
    factors: &[f32],
) -> std::result::Result<RopeScaling, String> {
    if factors.len() != head_dim / 2 {
        return Err(format!(
            "{} factors for a head_dim of {head_dim} ({} expected)",
            factors.len(),
            head_dim / 2
        ));
    }
    if let Some(bad) = factors.iter().find(|f| !(f.is_finite() && **f >= 1.0)) {
        return Err(format!("factor {bad} is not a finite number of at least 1"));
    }
    let factor = factors.iter().fold(1f32, |m, &f| m.max(f)) as f64;
    if factor <= 1.0 + 1e-6 {
        return Ok(RopeScaling::None);
    }
    // Frequencies as the converter computes them (f32), then `u = 1 / wavelength`.
    let base = theta as f32;
    let u: Vec<f64> = (0..head_dim / 2)
        .map(|i| (1.0 / base.powf((2 * i) as f32 / head_dim as f32)) as f64 / std::f64::consts::TAU)
        .collect();
    let plain = |f: f32| (f as f64) < 1.0 + 1e-6;
    let scaled = |f: f32| (f as f64) > factor * (1.0 - 1e-6);
    // `smooth = (old * u - low) / (high - low)`, recovered from each blended divisor.
    let blended: Vec<(f64, f64)> = factors
        .iter()
        .zip(&u)
        .filter(|(&f, _)| !plain(f) && !scaled(f))
        .map(|(&f, &u)| (u, (1.0 / f as f64 - 1.0 / factor) / (1.0 - 1.0 / factor)))
        .collect();
    let (old, high) = match blended.len() {
        0 => {
            // No blended band: any context between the two bands gives the same
            // divisors; with `high = 4`, plain needs `u > 4 / old`, scaled `u < 1 / old`.
            let lo = factors.iter().zip(&u).filter(|(&f, _)| plain(f));
            let lo = lo.map(|(_, &u)| 4.0 / u).fold(0f64, f64::max);
            let hi = factors.iter().zip(&u).filter(|(&f, _)| scaled(f));
            let hi = hi.map(|(_, &u)| 1.0 / u).fold(f64::INFINITY, f64::min);
            if lo.ceil() > hi.floor() {
                return Err("no original context separates the plain and scaled bands".into());
            }
            (((lo + hi) / 2.0).round().clamp(lo.ceil(), hi.floor()), 4.0)
        }
        1 => ((3.0 * blended[0].1 + 1.0) / blended[0].0, 4.0),
        n => {
            // Least squares `smooth = a u + b`: `high = 1 - 1 / b`, `old = -a / b`.
            let n = n as f64;
            let (su, ss) = blended
                .iter()
                .fold((0.0, 0.0), |(a, b), &(u, s)| (a + u, b + s));
            let (mu, ms) = (su / n, ss / n);
            let cov: f64 = blended.iter().map(|&(u, s)| (u - mu) * (s - ms)).sum();
            let var: f64 = blended.iter().map(|&(u, _)| (u - mu) * (u - mu)).sum();
            let a = cov / var;
            let b = ms - a * mu;
            (-a / b, 1.0 - 1.0 / b)
        }
    };
    if !(old.is_finite() && high.is_finite() && old >= 1.0 && high > 1.0) {
        return Err(format!(
            "the blended band gives an original context of {old} and a high_freq_factor of {high}"
        ));
    }
    // Rounded as a config states them; the divisors below check the rounding.
    let (high, old) = ((high * 1024.0).round() / 1024.0, old.round());
    let mut worst = 0f64;
    for (&f, &u) in factors.iter().zip(&u) {
        let want = if u > high / old {
            1.0
        } else if u < 1.0 / old {
            factor
        } else {
            let smooth = (old * u - 1.0) / (high - 1.0);
            1.0 / ((1.0 - smooth) / factor + smooth)
        };
        worst = worst.max((f as f64 - want).abs() / want);
    }
    if worst > 1e-5 {
        return Err(format!(
            "they do not follow llama3's rule (factor {factor}, original context {old}, high_freq_factor {high}: off by {worst:.2e})"
        ));
    }
    Ok(RopeScaling::Llama3 {
        factor,
        low_freq_factor: 1.0,
        high_freq_factor: high,
        original_max_position_embeddings: old as usize,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama.cpp's converter's divisors (`convert_hf_to_gguf.py`, `LlamaModel`): the
    /// frequencies and the blend in f32, as its torch tensors hold them.
    fn converter_factors(theta: f64, head_dim: usize, scaling: RopeScaling) -> Vec<f32> {
        let RopeScaling::Llama3 {
            factor,
            low_freq_factor: low,
            high_freq_factor: high,
            original_max_position_embeddings: old,
        } = scaling
        else {
            return vec![1.0; head_dim / 2];
        };
        let (factor, low, high, old) = (factor as f32, low as f32, high as f32, old as f32);
        (0..head_dim / 2)
            .map(|i| {
                let freq = 1.0 / (theta as f32).powf((2 * i) as f32 / head_dim as f32);
                let wavelen = std::f32::consts::TAU / freq;
                if wavelen < old / high {
                    1.0
                } else if wavelen > old / low {
                    factor
                } else {
                    let smooth = (old / wavelen - low) / (high - low);
                    1.0 / ((1.0 - smooth) / factor + smooth)
                }
            })
            .collect()
    }

    fn llama3(factor: f64, old: usize) -> RopeScaling {
        RopeScaling::Llama3 {
            factor,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: old,
        }
    }

    /// Llama 3.1 (factor 8, theta 5e5, head_dim 128), Llama 3.2 (factor 32, head_dim
    /// 64), the `llama3_scaled_long` fixture's (original context 32, theta 1e4): each
    /// back exactly from its divisors. With one blended frequency, or none, the
    /// parameters are not all determined; what comes back gives the same divisors.
    #[test]
    fn llama3_scaling_comes_back_from_its_divisors() {
        for (theta, hd, scaling, blended) in [
            (500_000.0, 128, llama3(8.0, 8192), 6),
            (500_000.0, 64, llama3(32.0, 8192), 3),
            (10_000.0, 64, llama3(32.0, 32), 5),
            (10_000.0, 128, llama3(4.0, 1000), 10),
            (1e6, 16, llama3(8.0, 2000), 1),
            (1e6, 16, llama3(8.0, 150), 0),
        ] {
            let factors = converter_factors(theta, hd, scaling);
            let max = factors[hd / 2 - 1];
            let n = factors.iter().filter(|&&f| f > 1.0 && f < max).count();
            assert_eq!(n, blended, "{scaling:?}");
            let got = llama3_from_factors(theta, hd, &factors).unwrap();
            if blended >= 2 {
                assert_eq!(got, scaling);
            }
            let again = converter_factors(theta, hd, got);
            for (a, b) in again.iter().zip(&factors) {
                assert!(
                    (a - b).abs() <= 1e-6 * b,
                    "{scaling:?} as {got:?}: {a} vs {b}"
                );
            }
        }
        assert_eq!(
            llama3_from_factors(10_000.0, 64, &[1.0; 32]),
            Ok(RopeScaling::None)
        );
    }

    /// Divisors no llama3 scaling gives, and malformed ones, are errors that say so.
    #[test]
    fn divisors_that_are_not_llama3s_are_errors() {
        let mut factors = converter_factors(500_000.0, 128, llama3(8.0, 8192));
        let blended = factors.iter().position(|&f| f > 1.0 && f < 8.0).unwrap();
        factors[blended] *= 1.01;
        let e = llama3_from_factors(500_000.0, 128, &factors).unwrap_err();
        assert!(e.contains("do not follow llama3's rule"), "{e}");
        let e = llama3_from_factors(500_000.0, 128, &factors[..10]).unwrap_err();
        assert!(e.contains("10 factors for a head_dim of 128"), "{e}");
        let e = llama3_from_factors(10_000.0, 4, &[f32::NAN, 2.0]).unwrap_err();
        assert!(e.contains("NaN"), "{e}");
        let e = llama3_from_factors(10_000.0, 4, &[0.5, 2.0]).unwrap_err();
        assert!(e.contains("0.5"), "{e}");
    }
}
