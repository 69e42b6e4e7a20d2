//! Type and shape inference ([`mod@infer`]), producing the typed IR that the interpreter and
//! the backends consume.

pub mod infer;

pub use infer::infer;
