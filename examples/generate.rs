//! Embedding the engine: load a model, generate with a per-token callback.
//!
//! ```sh
//! cargo run --release --example generate -- path/to/Qwen3-0.6B "The capital of France is"
//! cargo run --release --example generate            # a tiny random-weight preset
//! ```
//!
//! With a model directory that has a `tokenizer.json`, the prompt is text and the output
//! streams as text; with no arguments a tiny preset decodes token ids.

use std::io::Write;
use std::ops::ControlFlow;

use tilefuse::engine::{Engine, EngineOptions, GenerateOptions};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // Device::auto(): the GPU if there is one (one CUDA graph per token), else the
    // interpreter.
    let opts = EngineOptions::default();
    let (mut engine, prompt) = match args.as_slice() {
        [dir, text, ..] => {
            let engine = Engine::load(dir, opts)?;
            let prompt = engine.encode(text)?;
            (engine, prompt)
        }
        [dir] => {
            let engine = Engine::load(dir, opts)?;
            let prompt = engine.encode("Hello")?;
            (engine, prompt)
        }
        [] => (
            Engine::from_preset("tiny-qwen3", 0, opts)?,
            vec![1, 2, 3, 4],
        ),
    };
    let tokenizer = engine.tokenizer().cloned();
    let mut ids = Vec::new();
    let mut shown = 0;
    let out = engine.generate(
        &prompt,
        &GenerateOptions {
            max_new_tokens: 48,
            ..GenerateOptions::default()
        },
        |token| {
            ids.push(token);
            match &tokenizer {
                Some(t) => {
                    if let Ok(text) = t.decode(&ids, true) {
                        print!("{}", text.get(shown..).unwrap_or(""));
                        shown = text.len();
                    }
                }
                None => print!("{token} "),
            }
            let _ = std::io::stdout().flush();
            ControlFlow::Continue(())
        },
    )?;
    println!(
        "\n{} tokens, {:.1} tokens/s ({})",
        out.tokens.len(),
        out.tokens_per_s(),
        if out.used_graph {
            "CUDA graph"
        } else {
            "eager"
        }
    );
    Ok(())
}
