//! The quick start: the decode engine at its current best, plus the language's kernels.
//!
//! On a GPU: the Qwen3-0.6B preset (random weights at the real shape) decodes greedily,
//! one CUDA graph per token, and prints tokens/s and the share of the bandwidth floor.
//! Without one: a tiny Qwen3 runs on the CPU interpreter (the language's reference
//! semantics). Either way, four example kernels are first checked against host
//! references.
//!
//! `cargo run --release --example quickstart`
mod common;

use std::ops::ControlFlow;
use std::time::Instant;

use tilefuse::engine::{Engine, EngineOptions, GenerateOptions};
use tilefuse::prelude::*;

fn main() -> anyhow::Result<()> {
    let dev = Device::auto();
    println!("tilefuse quickstart on {}", dev.name());
    if !dev.is_cuda() {
        println!("(no CUDA device found: running the CPU interpreter, the language's reference semantics)");
    }

    // 1. Kernels from examples/common, each against a host reference.
    let mut rng = common::Rng::new(7);
    let big = dev.is_cuda();
    let t = Instant::now();
    let checks: Vec<(&str, f64, f64)> = vec![
        (
            "vector_add",
            common::check_vector_add(&dev, if big { 1 << 24 } else { 100_000 }, &mut rng)?,
            1e-6,
        ),
        (
            "softmax",
            common::check_softmax(&dev, 64, 1000, &mut rng)?,
            1e-4,
        ),
        (
            "rmsnorm",
            common::check_rmsnorm(&dev, 16, 1024, &mut rng)?,
            2e-2,
        ),
        (
            "gemv (bf16)",
            common::check_gemv(&dev, if big { 4096 } else { 256 }, 1024, &mut rng)?,
            1e-4,
        ),
    ];
    for (name, err, tol) in &checks {
        let verdict = if err < tol { "ok" } else { "MISMATCH" };
        println!("  {name:<12} max rel err {err:.1e} (tolerance {tol:.0e}) {verdict}");
    }
    println!("kernels ran in {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
    anyhow::ensure!(
        checks.iter().all(|(_, e, t)| e < t),
        "a kernel disagreed with its reference"
    );

    // 2. Decode.
    let (preset, new_tokens) = if big {
        ("qwen3-0.6b", 256)
    } else {
        ("tiny-qwen3", 32)
    };
    println!("\ndecoding {new_tokens} tokens with the {preset} preset (random weights) ...");
    let mut engine = Engine::from_preset(
        preset,
        0,
        EngineOptions {
            device: dev.clone(),
            max_seq_len: Some(512),
            ..EngineOptions::default()
        },
    )?;
    let opts = GenerateOptions {
        max_new_tokens: new_tokens,
        stop_at_eos: false,
        ..GenerateOptions::default()
    };
    let prompt: Vec<u32> = (1..=16).collect();
    let out = engine.generate(&prompt, &opts, |_| ControlFlow::Continue(()))?;
    println!(
        "first tokens: {:?}",
        &out.tokens[..out.tokens.len().min(12)]
    );
    let dec = engine
        .decoder()
        .expect("EngineOptions::default() runs on one device");
    let bytes = dec.weight_bytes_per_step() + dec.kv_bytes_per_step(prompt.len() + new_tokens / 2);
    println!(
        "{:.1} tokens/s, {:.3} ms/token, {} kernels per step, {}, {:.2} MB read per token",
        out.tokens_per_s(),
        out.ms_per_token(),
        dec.kernels_per_step(),
        if out.used_graph {
            "one CUDA graph per token"
        } else {
            "eager launches"
        },
        bytes as f64 / 1e6,
    );
    if big {
        println!("(`tilefuse bench` measures the copy bandwidth and the % of the floor)");
    }
    Ok(())
}
