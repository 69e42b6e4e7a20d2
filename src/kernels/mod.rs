//! Compute kernels written in the language, ready to launch: the dense GEMM of Triton's
//! matmul tutorial ([`matmul`]) and causal flash attention ([`flash_attention`]). Each
//! module holds the `#[kernel]` source, the compiled tile configurations and a `launch`
//! helper that checks its arguments and picks the grid.

pub mod flash_attention;
pub mod matmul;
