//! tilefuse: a Triton-style tile kernel language for Rust, and a decode engine built on it.

pub use tilefuse_dsl as dsl;
pub use tilefuse_engine as engine;
pub use tilefuse_macros::kernel;
