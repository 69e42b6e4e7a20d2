//! The host reference decoder against transformers' own output.
//!
//! Each fixture in `tests/fixtures/<name>/` is a tiny random-weight model
//! saved by transformers in bf16 plus `reference.json`: a prompt, the greedy
//! continuation transformers produced (bf16, eager attention) and the logits
//! each token was chosen from (see `scripts/make_fixtures.py`). We decode the
//! prompt and the continuation token by token (teacher forcing) and compare
//! the logits at every generated step.

mod common;

use common::{fixtures_dir, norm, read_reference};
use tilefuse_engine::reference::argmax;
use tilefuse_engine::{Arch, Checkpoint, Reference, RopeScaling};

/// Largest allowed ‖ours − ref‖ / ‖ref‖ per step.
///
/// Measured (torch 2.15 / transformers 5.23 fixtures): qwen3_tied_gqa 2.0e-6,
/// qwen2_bias 1.8e-6, qwen3_untied_mqa 1.2e-5 — bit-exact up to the 6-digit
/// rounding of the stored logits — and llama3_scaled_long 1.4e-2, where
/// PyTorch's vectorized softmax `exp` rounds a few attention probabilities to
/// the neighbouring bf16 value (see the `reference` module docs). Both sides
/// are deterministic, so these numbers do not vary between runs.
/// One bf16 ulp is 2^-8 ≈ 3.9e-3 relative.
const REL_TOL: f32 = 2e-2;

/// Runs one fixture; returns the worst relative error seen.
fn check_fixture(name: &str) -> f32 {
    let dir = fixtures_dir().join(name);
    let ckpt = Checkpoint::open(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
    let weights = ckpt
        .model_weights()
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let mut model = Reference::new(ckpt.config.clone(), weights).unwrap();
    let r = read_reference(&dir);
    assert_eq!(r.tokens.len(), r.logits.len());
    assert!(!r.tokens.is_empty());

    // Decode the prompt; its last logits predict tokens[0].
    let mut logits = Vec::new();
    for (pos, &t) in r.prompt_ids.iter().enumerate() {
        logits = model.forward(t, pos).unwrap();
    }
    let mut worst = 0.0f32;
    let mut exact_top1 = 0;
    for (step, (&want, ref_logits)) in r.tokens.iter().zip(&r.logits).enumerate() {
        assert_eq!(
            logits.len(),
            ref_logits.len(),
            "{name} step {step}: vocab size"
        );
        let diff = norm(logits.iter().zip(ref_logits).map(|(a, b)| a - b));
        let rel = diff / norm(ref_logits.iter().copied());
        worst = worst.max(rel);
        assert!(
            rel < REL_TOL,
            "{name} step {step}: relative logit error {rel:.3e} ≥ {REL_TOL:.0e}"
        );

        // Top-1 must agree, unless transformers' own logits put our pick in
        // a near-tie with its pick (bf16 logits tie easily).
        let ours = argmax(&logits) as u32;
        assert_eq!(
            argmax(ref_logits) as u32,
            want,
            "{name} step {step}: fixture is inconsistent"
        );
        if ours == want {
            exact_top1 += 1;
        } else {
            let gap = ref_logits[want as usize] - ref_logits[ours as usize];
            let scale = ref_logits[want as usize].abs().max(1.0);
            assert!(
                gap <= 1e-2 * scale,
                "{name} step {step}: top-1 {ours} but transformers chose {want} (gap {gap})"
            );
        }
        // Teacher forcing: feed the token transformers chose.
        let pos = r.prompt_ids.len() + step;
        logits = model.forward(want, pos).unwrap();
    }
    eprintln!(
        "{name}: prompt {}, {} steps, worst relative logit error {worst:.3e}, exact top-1 {exact_top1}/{}",
        r.prompt_ids.len(),
        r.tokens.len(),
        r.tokens.len()
    );
    worst
}

#[test]
fn qwen3_tied_gqa_matches_transformers() {
    let dir = fixtures_dir().join("qwen3_tied_gqa");
    let cfg = Checkpoint::open(&dir).unwrap().config;
    assert_eq!(cfg.arch, Arch::Qwen3);
    assert!(cfg.tie_word_embeddings && cfg.qk_norm && !cfg.qkv_bias);
    assert_eq!((cfg.num_heads, cfg.num_kv_heads, cfg.head_dim), (4, 2, 32));
    assert_eq!(cfg.eos_token_ids, vec![998, 999]);
    check_fixture("qwen3_tied_gqa");
}

#[test]
fn qwen3_untied_mqa_matches_transformers() {
    let dir = fixtures_dir().join("qwen3_untied_mqa");
    let cfg = Checkpoint::open(&dir).unwrap().config;
    assert!(!cfg.tie_word_embeddings);
    assert_eq!((cfg.num_kv_heads, cfg.vocab_size), (1, 997));
    check_fixture("qwen3_untied_mqa");
}

#[test]
fn qwen2_bias_matches_transformers() {
    let dir = fixtures_dir().join("qwen2_bias");
    let cfg = Checkpoint::open(&dir).unwrap().config;
    assert_eq!(cfg.arch, Arch::Qwen2);
    assert!(cfg.qkv_bias && !cfg.o_bias && !cfg.qk_norm);
    // head_dim is absent from this config.json: hidden / heads.
    assert_eq!(cfg.head_dim, 32);
    check_fixture("qwen2_bias");
}

#[test]
fn llama3_scaled_long_prompt_matches_transformers() {
    let dir = fixtures_dir().join("llama3_scaled_long");
    let cfg = Checkpoint::open(&dir).unwrap().config;
    assert_eq!(cfg.arch, Arch::Llama);
    assert_eq!(cfg.head_dim, 64);
    assert!(matches!(
        cfg.rope_scaling,
        RopeScaling::Llama3 {
            original_max_position_embeddings: 32,
            ..
        }
    ));
    check_fixture("llama3_scaled_long");
}
