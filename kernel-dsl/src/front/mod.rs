//! The front end: syntax to AST ([`parse`]), then IR construction for one
//! specialization ([`lower`]).

pub mod lower;
pub mod parse;

pub use lower::{lower, SpanTable};
pub use parse::{parse_kernel, ConstDecl, KernelAst, ParamDecl};
