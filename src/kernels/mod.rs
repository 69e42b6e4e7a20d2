//! Compute kernels written in the language, ready to launch: the dense GEMM of Triton's
//! matmul tutorial ([`matmul`]). Each module holds the `#[kernel]` source, the compiled
//! tile configurations and a `launch` helper that picks the grid.

pub mod matmul;
