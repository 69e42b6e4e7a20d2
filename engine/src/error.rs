//! The engine's error type: every bad input becomes an [`EngineError`] that
//! names the file, tensor or value at fault, never a panic.

use std::path::PathBuf;

/// Result alias used throughout the engine.
pub type Result<T> = std::result::Result<T, EngineError>;

/// Everything that can go wrong while loading or running a model.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A file could not be opened, read or memory-mapped.
    #[error("{path}: {source}", path = path.display())]
    Io {
        /// The file involved.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },

    /// A JSON file is not valid JSON (or not the expected shape of JSON).
    #[error("{path}: malformed JSON: {source}", path = path.display())]
    Json {
        /// The file involved.
        path: PathBuf,
        /// The parser's error, with line and column.
        #[source]
        source: serde_json::Error,
    },

    /// A config file is valid JSON but a field is missing, mistyped or
    /// holds a value the engine does not support.
    #[error("{path}: {message}", path = path.display())]
    Config {
        /// The file involved.
        path: PathBuf,
        /// What is wrong, naming the field and its value.
        message: String,
    },

    /// `architectures` names a model class the engine does not implement.
    #[error(
        "{path}: unsupported architecture `{value}` (supported: Qwen3ForCausalLM, Qwen2ForCausalLM, LlamaForCausalLM)",
        path = path.display()
    )]
    UnsupportedArchitecture {
        /// The config file.
        path: PathBuf,
        /// The architecture string found.
        value: String,
    },

    /// The rope scaling type is not one the engine implements.
    #[error(
        "{path}: unsupported rope type `{value}` (supported: default, llama3)",
        path = path.display()
    )]
    UnsupportedRope {
        /// The config file.
        path: PathBuf,
        /// The rope type string found.
        value: String,
    },

    /// A safetensors file's header could not be parsed.
    #[error("{path}: invalid safetensors file: {message}", path = path.display())]
    Safetensors {
        /// The file involved.
        path: PathBuf,
        /// The parser's complaint.
        message: String,
    },

    /// A GGUF file is malformed or holds something the engine does not support.
    #[error("{path}: {message}", path = path.display())]
    Gguf {
        /// The GGUF file.
        path: PathBuf,
        /// What is wrong, naming the offset, key, tensor or type at fault.
        message: String,
    },

    /// A tensor the model needs is in none of the checkpoint's files.
    #[error("tensor `{name}` not found in {location}", location = location.display())]
    MissingTensor {
        /// The Hugging Face tensor name.
        name: String,
        /// The checkpoint file or directory searched.
        location: PathBuf,
    },

    /// A tensor exists but its shape is not what the config implies.
    #[error(
        "{path}: tensor `{name}` has shape {found:?}, expected {expected:?}",
        path = path.display()
    )]
    ShapeMismatch {
        /// The file holding the tensor.
        path: PathBuf,
        /// The tensor name.
        name: String,
        /// The shape the config implies.
        expected: Vec<usize>,
        /// The shape in the file.
        found: Vec<usize>,
    },

    /// A tensor has a dtype the engine cannot convert to bf16.
    #[error(
        "{path}: tensor `{name}` has unsupported dtype {dtype} (supported: BF16, F16, F32)",
        path = path.display()
    )]
    UnsupportedDtype {
        /// The file holding the tensor.
        path: PathBuf,
        /// The tensor name.
        name: String,
        /// The dtype found, as safetensors spells it.
        dtype: String,
    },

    /// A preset name that does not exist.
    #[error("unknown preset `{name}` (available: {available})")]
    UnknownPreset {
        /// The name asked for.
        name: String,
        /// Comma-separated list of known presets.
        available: String,
    },

    /// A token id outside the vocabulary.
    #[error("token id {token} is out of range for a vocabulary of {vocab}")]
    TokenOutOfRange {
        /// The offending token id.
        token: u32,
        /// The vocabulary size.
        vocab: usize,
    },

    /// A decode position that skips ahead of the KV cache.
    #[error("position {pos} is past the KV cache, which holds {cached} positions (positions must be decoded in order)")]
    PositionGap {
        /// The position asked for.
        pos: usize,
        /// How many positions the cache holds.
        cached: usize,
    },

    /// A tokenizer file could not be loaded, or encoding/decoding failed.
    #[error("{path}: tokenizer error: {message}", path = path.display())]
    Tokenizer {
        /// The tokenizer file.
        path: PathBuf,
        /// The tokenizer library's message.
        message: String,
    },

    /// The model needs something the decode kernels do not implement.
    #[error("unsupported model: {message}")]
    Unsupported {
        /// What is unsupported, naming the config value.
        message: String,
    },

    /// A prompt (plus the tokens to generate) does not fit the KV cache.
    #[error("the prompt has {prompt} tokens; with {new} new tokens that exceeds max_seq_len = {max} (raise max_seq_len or shorten the prompt)")]
    TooLong {
        /// Prompt tokens.
        prompt: usize,
        /// Tokens to generate.
        new: usize,
        /// The KV cache's capacity.
        max: usize,
    },

    /// An empty prompt: decoding needs at least one token to start from.
    #[error("the prompt is empty: give at least one token")]
    EmptyPrompt,

    /// An invalid generation or engine option.
    #[error("invalid option: {message}")]
    Option {
        /// What is wrong, naming the option and its value.
        message: String,
    },

    /// A model cannot be split over the requested number of GPUs.
    #[error("tensor parallelism over {size} GPUs: {message}")]
    TensorParallel {
        /// The number of GPUs asked for.
        size: usize,
        /// What does not divide or is not supported, naming the config value.
        message: String,
    },

    /// The model (weights, KV cache and workspace) does not fit the GPU's free memory.
    #[error("{model} needs {need_gib:.2} GiB on {device} ({detail}), but only {free_gib:.2} GiB of its {total_gib:.2} GiB are free{hint}")]
    OutOfMemory {
        /// The model, as named by the user (preset or directory).
        model: String,
        /// The device.
        device: String,
        /// GiB needed in total.
        need_gib: f64,
        /// What the total is made of.
        detail: String,
        /// GiB free on the device.
        free_gib: f64,
        /// The device's total memory in GiB.
        total_gib: f64,
        /// A suggestion (a shorter KV cache, more GPUs), or empty.
        hint: String,
    },

    /// A collective-communication library call failed or the library is missing.
    #[error("NCCL: {message}")]
    Communication {
        /// What failed, and what to do about it.
        message: String,
    },

    /// Creating a device, allocating, copying or capturing failed.
    #[error(transparent)]
    Runtime(#[from] tilefuse_dsl::runtime::RuntimeError),

    /// A kernel launch failed (the error names the kernel).
    #[error(transparent)]
    Launch(#[from] tilefuse_dsl::runtime::LaunchError),
}
