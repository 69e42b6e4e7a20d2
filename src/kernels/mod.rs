//! Kernels written in the kernel language, as library modules with checked launch
//! helpers: compute-bound examples of what the language is for beyond decode.

pub mod flash_attention;
