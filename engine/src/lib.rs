//! The decode engine: Hugging Face checkpoints (Qwen3, Qwen2/2.5, Llama 3.x),
//! built-in presets with random weights, decode through fused tilefuse kernels with one
//! CUDA graph per token, and a host reference decoder.
//!
//! - [`engine`](mod@engine): [`Engine`], the library entry point (load, generate).
//! - [`decode`]: [`Decoder`], the model on a device: weights, KV cache, one step of
//!   kernel launches, graph capture.
//! - [`sampling`]: greedy / temperature / top-k / top-p.
//! - [`bench`](mod@bench): the decode benchmark behind `tilefuse bench`.
//! - [`config`]: `config.json` / `generation_config.json` → [`ModelConfig`].
//! - [`weights`]: memory-mapped safetensors, looked up by tensor name.
//! - [`gguf`]: llama.cpp's GGUF files: header, config, tokenizer, quantized block formats.
//! - [`model`]: per-layer weights ([`ModelWeights`]) and [`Checkpoint`].
//! - [`preset`]: real model shapes with seeded random weights.
//! - [`reference`](mod@reference): the plain-Rust decoder the kernel engine is checked against.
//! - [`tokenizer`]: `tokenizer.json` encode/decode ([`Tokenizer`]).
//! - [`kernels_quant`]: GEMVs over Q8_0/Q4_K/Q6_K weights.
//! - [`kernels`]: the decode kernels; [`tuning`]: their launch configurations.
//! - [`perf`]: copy ceiling, event and graph timing, cuBLAS baseline.
//! - [`error`]: [`EngineError`], which names the file, tensor or value at fault.

#![warn(missing_docs)]

pub mod bench;
pub mod config;
pub mod decode;
pub mod engine;
pub mod error;
pub mod gguf;
pub mod kernels;
pub mod kernels_quant;
pub mod model;
pub mod perf;
pub mod preset;
pub mod reference;
pub mod sampling;
pub mod tokenizer;
pub mod tuning;
pub mod weights;

pub use config::{Arch, ModelConfig, RopeScaling};
pub use decode::Decoder;
pub use engine::{Engine, EngineOptions, GenerateOptions, Generation};
pub use error::{EngineError, Result};
pub use model::{Checkpoint, LayerWeights, ModelWeights};
pub use reference::Reference;
pub use sampling::{Sampler, Sampling};
pub use tokenizer::Tokenizer;
pub use weights::Weights;
