//! The front end: syntax to AST ([`parse`]), then IR construction for one
//! specialization ([`mod@lower`]); [`scan`] finds the kernels of a source file for tools.

pub mod lower;
pub mod parse;
pub mod scan;

pub use lower::{lower, SpanTable};
pub use parse::{parse_kernel, ClusterExtent, ConstDecl, KernelAst, ParamDecl};
pub use scan::{find_kernels, FoundKernel};
