//! The front end: syntax to AST ([`parse`]), then IR construction for one
//! specialization ([`mod@lower`]), inlining `#[tile_fn]` helpers ([`helpers`]); [`scan`] finds the kernels of a source file for tools.

pub mod helpers;
pub mod lower;
pub mod parse;
pub mod scan;

pub use helpers::{helper_calls, is_tile_op, parse_tile_fn, TileFn, TILE_OPS};
pub use lower::{lower, SpanTable};
pub use parse::{
    parse_kernel, ClusterExtent, ConstDecl, KernelAst, ParamDecl, TypeDecl, DEFAULT_NUM_STAGES,
    DEFAULT_NUM_WARPS,
};
pub use scan::{find_kernels, find_kernels_with, tile_fns, FoundKernel};
