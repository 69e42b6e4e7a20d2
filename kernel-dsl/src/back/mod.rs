//! (stage under construction)
pub mod ptx;
