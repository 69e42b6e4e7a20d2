//! Token sampling on the host: temperature, top-k and top-p (nucleus), seeded.
//!
//! Greedy decoding never comes here: the device writes the argmax itself. Sampling
//! needs the logits on the host, one `vocab_size × 4`-byte copy per token (about
//! 0.6 MB for a 152k vocabulary).

use crate::error::{EngineError, Result};

/// How the next token is chosen.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampling {
    /// Softmax temperature; `0` means greedy (argmax on the device).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens (`0`: all).
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p`
    /// (`1.0`: all).
    pub top_p: f32,
    /// Seed of the sampler's random numbers.
    pub seed: u64,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling::greedy()
    }
}

impl Sampling {
    /// Greedy decoding: always the most likely token.
    pub fn greedy() -> Sampling {
        Sampling {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        }
    }

    /// Whether this is greedy decoding.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// Checks the values; the error names the option.
    pub fn validate(&self) -> Result<()> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(EngineError::Option {
                message: format!(
                    "temperature must be finite and >= 0, got {}",
                    self.temperature
                ),
            });
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(EngineError::Option {
                message: format!("top_p must be in (0, 1], got {}", self.top_p),
            });
        }
        Ok(())
    }
}

/// A seeded sampler over logits.
#[derive(Clone, Debug)]
pub struct Sampler {
    params: Sampling,
    state: u64,
}

impl Sampler {
    /// A sampler for `params`.
    pub fn new(params: Sampling) -> Sampler {
        let state = params.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        Sampler { params, state }
    }

    fn next_unit(&mut self) -> f64 {
        // xorshift64*: plenty for sampling, reproducible everywhere.
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        (self.state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Draws a token from `logits` (greedy when the temperature is 0). NaN logits
    /// never win.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let p = &self.params;
        if p.is_greedy() {
            return crate::reference::argmax(logits) as u32;
        }
        let mut idx: Vec<usize> = (0..logits.len()).filter(|&i| !logits[i].is_nan()).collect();
        if idx.is_empty() {
            return 0;
        }
        idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        if p.top_k > 0 {
            idx.truncate(p.top_k);
        }
        let max = logits[idx[0]] as f64;
        let t = p.temperature as f64;
        let mut probs: Vec<f64> = idx
            .iter()
            .map(|&i| ((logits[i] as f64 - max) / t).exp())
            .collect();
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|x| *x /= total);
        if p.top_p < 1.0 {
            let mut acc = 0.0;
            let keep = probs
                .iter()
                .position(|&x| {
                    acc += x;
                    acc >= p.top_p as f64
                })
                .map_or(probs.len(), |i| i + 1);
            probs.truncate(keep);
            idx.truncate(keep);
        }
        let total: f64 = probs.iter().sum();
        let mut r = self.next_unit() * total;
        for (k, &x) in probs.iter().enumerate() {
            if r < x {
                return idx[k] as u32;
            }
            r -= x;
        }
        idx[probs.len() - 1] as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampler(temperature: f32, top_k: usize, top_p: f32, seed: u64) -> Sampler {
        Sampler::new(Sampling {
            temperature,
            top_k,
            top_p,
            seed,
        })
    }

    #[test]
    fn greedy_takes_the_first_maximum() {
        let mut s = Sampler::new(Sampling::greedy());
        assert_eq!(s.sample(&[1.0, 3.0, 3.0, -1.0]), 1);
    }

    #[test]
    fn top_k_one_is_greedy_and_top_k_limits_the_support() {
        let logits: Vec<f32> = (0..50).map(|i| ((i * 37) % 50) as f32 * 0.1).collect();
        let best = crate::reference::argmax(&logits) as u32;
        let mut s = sampler(1.0, 1, 1.0, 3);
        for _ in 0..20 {
            assert_eq!(s.sample(&logits), best);
        }
        let mut order: Vec<usize> = (0..50).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
        let top3: Vec<u32> = order[..3].iter().map(|&i| i as u32).collect();
        let mut s = sampler(5.0, 3, 1.0, 4);
        for _ in 0..200 {
            assert!(top3.contains(&s.sample(&logits)));
        }
    }

    #[test]
    fn frequencies_follow_the_softmax() {
        // p = softmax([0, ln 3]) = [0.25, 0.75].
        let logits = [0.0f32, 3f32.ln()];
        let mut s = sampler(1.0, 0, 1.0, 11);
        let n = 20_000;
        let ones = (0..n).filter(|_| s.sample(&logits) == 1).count();
        let f = ones as f64 / n as f64;
        assert!((f - 0.75).abs() < 0.02, "frequency {f}");
    }

    #[test]
    fn top_p_keeps_the_nucleus_and_seeds_reproduce() {
        // p ≈ [0.665, 0.245, 0.090]: top_p 0.6 keeps only the first.
        let logits = [2.0f32, 1.0, 0.0];
        let mut s = sampler(1.0, 0, 0.6, 5);
        assert!((0..100).all(|_| s.sample(&logits) == 0));
        let draw = |seed| {
            let mut s = sampler(1.0, 0, 1.0, seed);
            (0..32).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        assert_eq!(draw(9), draw(9));
        assert_ne!(draw(9), draw(10));
    }

    #[test]
    fn bad_options_are_named() {
        let e = Sampling {
            top_p: 0.0,
            ..Sampling::greedy()
        }
        .validate()
        .unwrap_err();
        assert!(e.to_string().contains("top_p"));
        let e = Sampling {
            temperature: -1.0,
            ..Sampling::greedy()
        }
        .validate()
        .unwrap_err();
        assert!(e.to_string().contains("temperature"));
    }
}
