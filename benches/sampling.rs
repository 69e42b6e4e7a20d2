//! Criterion benchmark of host-side sampling, one token per iteration, over a
//! Qwen3-sized vocabulary (151 936 logits shaped like a language model's: a few strong
//! candidates over a broad normal tail), for the settings people use.
//!
//! `cargo bench --bench sampling`. Runs on any machine (no GPU involved): sampling needs
//! the logits on the host, and this is the host's share of a sampled token.

use criterion::{black_box, Criterion};
use tilefuse::engine::{Sampler, Sampling};

const VOCAB: usize = 151_936;

/// Seeded logits: normal-ish tail (sum of uniforms), a handful of strong candidates.
fn logits(seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut unit = move || {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        (s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32 / (1u64 << 24) as f32
    };
    let mut v: Vec<f32> = (0..VOCAB)
        .map(|_| 2.5 * ((0..4).map(|_| unit()).sum::<f32>() - 2.0))
        .collect();
    for i in 0..8 {
        let at = (unit() * VOCAB as f32) as usize % VOCAB;
        v[at] = 14.0 - i as f32;
    }
    v
}

/// Logits of a model with random weights: nearly flat, so the top-p nucleus holds most
/// of the vocabulary (the worst case, and what `tilefuse bench --sampled` meets).
fn flat_logits(seed: u64) -> Vec<f32> {
    logits(seed).iter().map(|&l| l * 0.02).collect()
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    let l = logits(7);
    let flat = flat_logits(7);
    let settings = [
        ("temperature 0.8", 0.8, 0, 1.0),
        ("temperature 0.8, top-p 0.9", 0.8, 0, 0.9),
        ("temperature 0.7, top-k 50", 0.7, 50, 1.0),
        ("temperature 1.0, top-k 50, top-p 0.95", 1.0, 50, 0.95),
        ("temperature 1.5, top-p 0.99", 1.5, 0, 0.99),
    ];
    let mut group = c.benchmark_group("sampling (151936 logits)");
    for (name, temperature, top_k, top_p) in settings {
        let mut sampler = Sampler::new(Sampling {
            temperature,
            top_k,
            top_p,
            seed: 1,
        });
        group.bench_function(name, |b| b.iter(|| sampler.sample(black_box(&l))));
    }
    let mut sampler = Sampler::new(Sampling {
        temperature: 0.8,
        top_k: 0,
        top_p: 0.9,
        seed: 1,
    });
    group.bench_function("temperature 0.8, top-p 0.9, flat logits", |b| {
        b.iter(|| sampler.sample(black_box(&flat)))
    });
    group.finish();
    c.final_summary();
}
