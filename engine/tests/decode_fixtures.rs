//! The kernel decoder against transformers' logits, on the interpreter (always) and on
//! the GPU (when present), and the GPU against the interpreter.
//!
//! Tolerances (per generated step): relative logit error ‖ours − hf‖ / ‖hf‖ below
//! [`REL_TOL`], and the top-1 token equal to transformers' unless the two are within
//! a bf16 near-tie in transformers' own logits. The decoder keeps attention
//! probabilities in f32 where transformers rounds them to bf16 (a split-K pass cannot
//! round normalized probabilities), and sums in another order, so it is looser than
//! the host reference's bound; one bf16 ulp is 3.9e-3 relative.

mod common;

use common::{fixtures_dir, read_reference, rel_err};
use tilefuse_dsl::runtime::testing::{gpu_or_skip, gpu_turn};
use tilefuse_dsl::runtime::Device;
use tilefuse_engine::decode::Decoder;
use tilefuse_engine::reference::argmax;
use tilefuse_engine::Checkpoint;

const REL_TOL: f32 = 3e-2;

/// Teacher-forced decode of a fixture on `dev`; returns the logits of every generated
/// step and checks them against transformers'.
fn run_fixture(name: &str, dev: &Device, graph: bool) -> Vec<Vec<f32>> {
    let dir = fixtures_dir().join(name);
    let ckpt = Checkpoint::open(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
    let weights = ckpt.model_weights().unwrap();
    let r = read_reference(&dir);
    let total = r.prompt_ids.len() + r.tokens.len();
    let mut dec = Decoder::new(&ckpt.config, &weights, dev, total + 1).unwrap();
    if graph {
        dec.capture().unwrap();
    }
    let mut logits = Vec::new();
    for (pos, &t) in r.prompt_ids.iter().enumerate() {
        dec.set_input(t, pos).unwrap();
        dec.step().unwrap();
    }
    let mut worst = 0.0f32;
    let mut out = Vec::new();
    for (step, (&want, hf)) in r.tokens.iter().zip(&r.logits).enumerate() {
        let ours = dec.read_logits().unwrap();
        let (greedy, next_pos) = dec.read_state().unwrap();
        let pos = r.prompt_ids.len() + step;
        assert_eq!(
            next_pos, pos,
            "{name} on {dev}: the step advances the position"
        );
        assert_eq!(
            greedy as usize,
            argmax(&ours),
            "{name} on {dev} step {step}: the device argmax matches the logits"
        );
        let rel = rel_err(&ours, hf);
        worst = worst.max(rel);
        assert!(
            rel < REL_TOL,
            "{name} on {dev} step {step}: relative logit error {rel:.3e}"
        );
        if greedy != want {
            let gap = hf[want as usize] - hf[greedy as usize];
            assert!(
                gap <= 1e-2 * hf[want as usize].abs().max(1.0),
                "{name} on {dev} step {step}: top-1 {greedy}, transformers chose {want}"
            );
        }
        out.push(ours);
        dec.set_input(want, pos).unwrap();
        dec.step().unwrap();
        logits = out.last().unwrap().clone();
    }
    assert!(!logits.is_empty());
    eprintln!("{name} on {dev} (graph {graph}): worst relative logit error {worst:.3e}");
    out
}

fn check(name: &str) {
    let cpu = run_fixture(name, &Device::cpu(), false);
    if let Some(gpu) = gpu_or_skip(name) {
        let _turn = gpu_turn();
        let eager = run_fixture(name, &gpu, false);
        let graph = run_fixture(name, &gpu, true);
        assert_eq!(
            eager, graph,
            "{name}: graph replay and eager launches agree bit for bit"
        );
        for (step, (g, c)) in eager.iter().zip(&cpu).enumerate() {
            let rel = rel_err(g, c);
            assert!(
                rel < 1e-2,
                "{name} step {step}: GPU vs interpreter {rel:.3e}"
            );
        }
    }
}

#[test]
fn qwen3_tied_gqa() {
    check("qwen3_tied_gqa");
}

#[test]
fn qwen3_untied_mqa() {
    check("qwen3_untied_mqa");
}

#[test]
fn qwen2_bias() {
    check("qwen2_bias");
}

#[test]
fn llama3_scaled_long_prompt() {
    check("llama3_scaled_long");
}
