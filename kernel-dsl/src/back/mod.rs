//! Backends: typed IR in, target code out. `ptx` lowers a typed kernel to PTX for sm_80
//! and sm_90, one named pass per file (layouts, axis analysis, emission).
pub mod ptx;
