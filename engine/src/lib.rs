//! The decode engine: Hugging Face checkpoints (Qwen3, Qwen2/2.5, Llama 3.x),
//! built-in presets with random weights, decode through fused tilefuse kernels with one
//! CUDA graph per token, and a host reference decoder.
//!
//! - [`engine`](mod@engine): [`Engine`], the library entry point (load, generate).
//! - [`decode`]: [`Decoder`], the model on a device: weights, KV cache, one step of
//!   kernel launches (`decode/step.rs`: a layer as `qkv()`, `attention()`, `o_proj()`,
//!   `mlp()`), the launch plan, graph capture, profiling.
//! - [`rope`]: rotary tables, shared by the decoder and the reference.
//! - [`sampling`]: temperature / top-k / top-p, on the host and on the device.
//! - [`bench`](mod@bench): the decode benchmark behind `tilefuse bench`, the variant
//!   sweep, kernel workloads and the cuBLAS baseline.
//! - [`config`]: `config.json` / `generation_config.json` → [`ModelConfig`].
//! - [`weights`]: memory-mapped safetensors, looked up by tensor name.
//! - [`gguf`]: llama.cpp's GGUF files: header, config, tokenizer, quantized block formats.
//! - [`model`]: per-layer weights ([`ModelWeights`]) and [`Checkpoint`].
//! - [`preset`]: real model shapes with seeded random weights; [`device_init`] writes
//!   them on the device.
//! - [`reference`](mod@reference): the plain-Rust decoder the kernel engine is checked against.
//! - [`tokenizer`]: `tokenizer.json` encode/decode ([`Tokenizer`]).
//! - [`memory`]: the device memory a model needs, checked before allocating.
//! - [`comm`]: NCCL collectives between the GPUs of one host, loaded at run time.
//! - [`tp`]: the tensor-parallel split of a model over GPUs, simulated on the host.

//! - [`kernels_quant`]: GEMVs over Q8_0/Q4_K/Q6_K weights.
//! - [`kernels`]: the decode kernels; [`tuning`]: their launch configurations.
//! - [`prefill`]: batched prefill of the prompt in chunks ([`prefill::Prefiller`]).
//! - [`prefill_kernels`]: the batched-prefill kernels (GEMMs and attention over `dot`).
//! - [`error`]: [`EngineError`], which names the file, tensor or value at fault.

#![warn(missing_docs)]

pub mod bench;
pub mod comm;
pub mod config;
pub mod decode;
pub mod device_init;
pub mod engine;
pub mod error;
pub mod gguf;
pub mod kernels;
pub mod memory;

pub mod kernels_quant;
pub mod model;
pub mod prefill;
pub mod prefill_kernels;
pub mod preset;
pub mod reference;
pub mod rope;
pub mod sampling;
pub mod tokenizer;
pub mod tp;
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
