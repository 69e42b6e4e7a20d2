//! Token sampling: temperature, top-k and top-p (nucleus), seeded.
//!
//! - this file: the settings ([`Sampling`]) and the host's draw ([`Sampler`]), which
//!   needs the logits on the host, one `vocab_size × 4`-byte copy per token (about
//!   0.6 MB for a 152k vocabulary);
//! - [`device`]: the draw on the device after a step, with the host's draw as its
//!   fallback; [`kernels`]: its kernels.
//!
//! Greedy decoding never comes here: the device writes the argmax itself.

pub mod device;
pub mod kernels;

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

    /// Whether [`crate::Decoder::sample_on_device`] can draw with these settings over
    /// a vocabulary of `vocab` tokens: any temperature above 0 with top-k, top-p or
    /// neither; top-k and top-p together for `top_k <= 64` and vocabularies up to
    /// 262 144 tokens (the device then finds the top-k mass by merging per-program
    /// top-k lists of at most 64).
    pub fn device_can_sample(&self, vocab: usize) -> bool {
        let both = self.top_k > 0 && self.top_p < 1.0;
        self.temperature > 0.0
            && (!both
                || (self.top_k <= crate::tuning::SAMPLE_TOP_K_MAX
                    && vocab.div_ceil(crate::tuning::SAMPLE_TOP_K_BLOCK)
                        * crate::tuning::SAMPLE_TOP_K_MAX
                        <= crate::tuning::SAMPLE_TOP_K_MERGE))
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
    /// Candidates, reused from token to token (a fresh 2.4 MB vector per token cost
    /// as much as the selection, in page faults).
    scratch: Vec<Cand>,
}

impl Sampler {
    /// A sampler for `params`.
    pub fn new(params: Sampling) -> Sampler {
        let state = params.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        Sampler {
            params,
            state,
            scratch: Vec::new(),
        }
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
        if self.params.is_greedy() {
            return crate::reference::argmax(logits) as u32;
        }
        let keep = self.params.fill(logits, &mut self.scratch);
        if keep == 0 {
            return 0;
        }
        let total: f64 = self.scratch[..keep].iter().map(|x| x.2).sum();
        let mut r = self.next_unit() * total;
        for x in &self.scratch[..keep] {
            if r < x.2 {
                return x.1;
            }
            r -= x.2;
        }
        self.scratch[keep - 1].1
    }
}

/// A candidate token: logit, index, weight `exp((logit - max) / temperature)`.
type Cand = (f32, u32, f64);

/// Candidates in order: the larger logit first, the lower index on ties.
fn by_rank(a: &Cand, b: &Cand) -> std::cmp::Ordering {
    b.0.total_cmp(&a.0).then(a.1.cmp(&b.1))
}

/// A candidate ordered so that a max-heap's top is the worst-ranked one.
struct Ranked(Cand);

impl PartialEq for Ranked {
    fn eq(&self, other: &Self) -> bool {
        by_rank(&self.0, &other.0).is_eq()
    }
}

impl Eq for Ranked {}

impl PartialOrd for Ranked {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Ranked {
    /// Greater = ranked lower (a smaller logit, or a larger index on ties).
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        by_rank(&self.0, &other.0)
    }
}

/// The length of the shortest best-first prefix of `c` whose weights reach `target`
/// (all of `c` when rounding leaves it out of reach), reordering `c` so that this
/// prefix comes first. Expected linear time: quickselect, descending only into the
/// part that holds the boundary; nothing is sorted.
fn nucleus(c: &mut [Cand], mut target: f64) -> usize {
    let (mut lo, mut hi) = (0, c.len());
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        // [lo, mid) outranks c[mid], which outranks (mid, hi).
        c[lo..hi].select_nth_unstable_by(mid - lo, by_rank);
        let upper: f64 = c[lo..mid].iter().map(|x| x.2).sum();
        if upper >= target {
            hi = mid;
        } else if upper + c[mid].2 >= target {
            return mid + 1;
        } else {
            target -= upper + c[mid].2;
            lo = mid + 1;
        }
    }
    // Reached only when the target exceeds everything (rounding) or `c` is empty.
    if lo == c.len() {
        c.len()
    } else {
        lo
    }
}

impl Sampling {
    /// The tokens a non-greedy draw can return, with unnormalized weights
    /// `exp((logit - max) / temperature)`: the `top_k` best (all when 0), then the
    /// smallest set of the best of those whose mass reaches `top_p`, in no particular
    /// order.
    ///
    /// Linear in the vocabulary: it selects instead of sorting (a full sort of 152k
    /// logits took 12–21 ms a token; `cargo bench --bench sampling`).
    pub fn distribution(&self, logits: &[f32]) -> Vec<(u32, f64)> {
        let mut c = Vec::new();
        let keep = self.fill(logits, &mut c);
        c[..keep].iter().map(|x| (x.1, x.2)).collect()
    }

    /// [`Sampling::distribution`] into `c` (reused): the kept candidates are `c[..n]`
    /// for the returned `n`.
    fn fill(&self, logits: &[f32], c: &mut Vec<Cand>) -> usize {
        c.clear();
        let k = self.top_k;
        if k > 0 && k <= logits.len() / 16 {
            // A few best of many: one pass that keeps the best `k` seen so far and
            // rejects most logits with one comparison against the worst of them (a
            // later equal logit ranks lower: its index is larger).
            let mut heap = std::collections::BinaryHeap::with_capacity(k + 1);
            for (i, &l) in logits.iter().enumerate() {
                if l.is_nan() {
                    continue;
                }
                if heap.len() == k {
                    let worst: &Ranked = heap.peek().expect("k > 0");
                    if l.total_cmp(&worst.0 .0).is_le() {
                        continue;
                    }
                    heap.pop();
                }
                heap.push(Ranked((l, i as u32, 0.0)));
            }
            c.extend(heap.into_iter().map(|r| r.0));
        } else {
            c.extend(
                logits
                    .iter()
                    .enumerate()
                    .filter(|(_, l)| !l.is_nan())
                    .map(|(i, &l)| (l, i as u32, 0.0)),
            );
            if k > 0 && k < c.len() {
                c.select_nth_unstable_by(k - 1, by_rank);
                c.truncate(k);
            }
        }
        if c.is_empty() {
            return 0;
        }
        let max = c.iter().map(|x| x.0).fold(f32::NEG_INFINITY, f32::max) as f64;
        let inv_t = 1.0 / self.temperature as f64;
        for x in c.iter_mut() {
            x.2 = ((x.0 as f64 - max) * inv_t).exp();
        }
        if self.top_p >= 1.0 {
            c.len()
        } else {
            let total: f64 = c.iter().map(|x| x.2).sum();
            nucleus(c, self.top_p as f64 * total)
        }
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

    /// The definition, by a full sort: the `top_k` best, then the shortest best-first
    /// prefix whose normalized mass reaches `top_p`.
    fn reference_support(p: &Sampling, logits: &[f32]) -> Vec<u32> {
        let mut idx: Vec<usize> = (0..logits.len()).filter(|&i| !logits[i].is_nan()).collect();
        idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        if p.top_k > 0 {
            idx.truncate(p.top_k);
        }
        let max = logits[idx[0]] as f64;
        let w: Vec<f64> = idx
            .iter()
            .map(|&i| ((logits[i] as f64 - max) / p.temperature as f64).exp())
            .collect();
        let total: f64 = w.iter().sum();
        let mut acc = 0.0;
        let keep = w
            .iter()
            .position(|&x| {
                acc += x / total;
                acc >= p.top_p as f64
            })
            .map_or(w.len(), |i| i + 1);
        idx[..keep].iter().map(|&i| i as u32).collect()
    }

    #[test]
    fn the_selected_support_is_the_sorted_definition() {
        let mut seed = 0x1234_5678_9abc_def1u64;
        let mut unit = move || {
            seed ^= seed >> 12;
            seed ^= seed << 25;
            seed ^= seed >> 27;
            (seed.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32 / (1u64 << 24) as f32
        };
        for case in 0..60 {
            let n = [1, 7, 64, 65, 600, 5000][case % 6];
            // Ties (values on a grid), a NaN, and spreads from peaked to flat.
            let spread = [0.5f32, 4.0, 20.0][case % 3];
            let mut logits: Vec<f32> = (0..n)
                .map(|_| (unit() * spread * 8.0).round() / 8.0)
                .collect();
            if n > 3 {
                logits[n / 2] = f32::NAN;
            }
            for (t, k, p) in [
                (1.0, 0, 0.9),
                (0.7, 50, 1.0),
                (1.3, 40, 0.95),
                (0.5, 0, 0.999),
                (2.0, 3, 0.5),
            ] {
                let params = Sampling {
                    temperature: t,
                    top_k: k,
                    top_p: p,
                    seed: 0,
                };
                let got: Vec<u32> = params
                    .distribution(&logits)
                    .iter()
                    .map(|&(i, _)| i)
                    .collect();
                let mut got_sorted = got.clone();
                got_sorted.sort_unstable();
                let mut want = reference_support(&params, &logits);
                want.sort_unstable();
                assert_eq!(got_sorted, want, "n={n} spread={spread} T={t} k={k} p={p}");
                let d = params.distribution(&logits);
                let max_l = d
                    .iter()
                    .map(|&(i, _)| logits[i as usize])
                    .fold(f32::MIN, f32::max);
                for &(i, w) in &d {
                    let expect = ((logits[i as usize] as f64 - max_l as f64) / t as f64).exp();
                    assert!((w - expect).abs() <= 1e-12 * expect, "weight of {i}");
                }
            }
        }
    }

    #[test]
    fn which_settings_draw_on_the_device() {
        let s = |temperature, top_k, top_p| Sampling {
            temperature,
            top_k,
            top_p,
            seed: 0,
        };
        // Qwen3's recommended settings, at Qwen3's vocabulary.
        assert!(s(0.6, 20, 0.95).device_can_sample(151_936));
        assert!(s(0.8, 0, 0.9).device_can_sample(151_936));
        assert!(s(0.8, 500, 1.0).device_can_sample(151_936));
        assert!(s(0.8, 64, 0.9).device_can_sample(262_144));
        // Greedy, too large a top-k with top-p, too many lists to merge.
        assert!(!Sampling::greedy().device_can_sample(151_936));
        assert!(!s(0.8, 65, 0.9).device_can_sample(151_936));
        assert!(!s(0.8, 20, 0.9).device_can_sample(262_145));
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
