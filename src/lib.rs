//! # tilefuse
//!
//! A Triton-style tile kernel language for Rust, and a batch-1 decode engine built on it.
//!
//! `#[kernel]` compiles a Rust-like tile function to PTX at build time; the same kernel
//! runs on an NVIDIA GPU (through the driver, no CUDA toolkit) or on the CPU interpreter,
//! which is the language's reference semantics.
//!
//! ```
//! use tilefuse::prelude::*;
//!
//! #[kernel(BLOCK = [64], num_warps = [1])]
//! fn scale<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32, s: f32) {
//!     let offs = program_id(0) * BLOCK + arange(0, BLOCK);
//!     let mask = offs < n;
//!     store(out + offs, load(x + offs, mask, 0.0) * s, mask);
//! }
//!
//! let dev = Device::cpu();
//! let x = dev.upload(&[1.0f32, 2.0, 3.0]).unwrap();
//! let mut out = dev.alloc_filled(3, f32::NAN).unwrap();
//! scale::<64>::launch(&dev, 1, &x, &mut out, 3, 2.0).unwrap();
//! assert_eq!(out.to_vec().unwrap(), vec![2.0, 4.0, 6.0]);
//! ```
//!
//! Every op of the kernel language has a documented item in [`lang`], with an example.

pub mod lang;

pub mod cli;

pub mod kernels;

pub use tilefuse_dsl as dsl;
pub use tilefuse_engine as engine;
#[doc(hidden)]
pub use tilefuse_macros::__tile_chain;
pub use tilefuse_macros::{kernel, tile_fn};

/// What kernel authors and engine users need in scope.
pub mod prelude {
    pub use crate::dsl::half::{bf16, f16};
    pub use crate::dsl::runtime::{
        Buffer, Device, KernelArg, KernelDef, LaunchConfig, LaunchError,
    };
    pub use crate::{kernel, tile_fn};
}
