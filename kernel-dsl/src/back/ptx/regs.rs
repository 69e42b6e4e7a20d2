//! Register classes and PTX spellings of dtypes.

use crate::ir::{DType, Elem};

/// A PTX register class; every value element lives in one scalar register.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Rk {
    /// `.pred`: bool.
    P,
    /// `.b16`: f16 and bf16 bits.
    H,
    /// `.b32`: u8 (zero-extended, kept in 0..=255), i32, u32.
    R,
    /// `.f32`.
    F,
    /// `.b64`: i64 and pointers.
    D,
}

impl Rk {
    /// Every class, in declaration order.
    pub const ALL: [Rk; 5] = [Rk::P, Rk::H, Rk::R, Rk::F, Rk::D];

    /// Register name prefix.
    pub fn prefix(self) -> &'static str {
        match self {
            Rk::P => "%p",
            Rk::H => "%h",
            Rk::R => "%r",
            Rk::F => "%f",
            Rk::D => "%rd",
        }
    }

    /// `.reg` declaration type.
    pub fn decl(self) -> &'static str {
        match self {
            Rk::P => ".pred",
            Rk::H => ".b16",
            Rk::R => ".b32",
            Rk::F => ".f32",
            Rk::D => ".b64",
        }
    }

    /// Untyped move/bit type (`.pred` moves use `mov.pred`).
    pub fn bits(self) -> &'static str {
        match self {
            Rk::P => "pred",
            Rk::H => "b16",
            Rk::R => "b32",
            Rk::F => "f32",
            Rk::D => "b64",
        }
    }

    /// Bytes when spilled to shared memory (bools as 4-byte 0/1).
    pub fn smem_bytes(self) -> u32 {
        match self {
            Rk::H => 2,
            Rk::P | Rk::R | Rk::F => 4,
            Rk::D => 8,
        }
    }
}

/// The register class of a dtype.
pub fn rk(d: DType) -> Rk {
    match d {
        DType::Bool => Rk::P,
        DType::U8 | DType::I32 | DType::U32 => Rk::R,
        DType::I64 => Rk::D,
        DType::F16 | DType::BF16 => Rk::H,
        DType::F32 => Rk::F,
    }
}

/// The register class of a tile element.
pub fn rk_elem(e: Elem) -> Rk {
    match e {
        Elem::Val(d) => rk(d),
        Elem::Ptr(_) => Rk::D,
    }
}

/// Integer instruction type (`s32`, `u32`, `s64`); u8 computes as u32.
pub fn int_ty(d: DType) -> &'static str {
    match d {
        DType::I32 => "s32",
        DType::I64 => "s64",
        _ => "u32",
    }
}

/// Bitwise instruction type for integers.
pub fn bit_ty(d: DType) -> &'static str {
    if d == DType::I64 {
        "b64"
    } else {
        "b32"
    }
}

/// The `ld`/`st` type of one element in memory (bools are bytes).
pub fn mem_ty(d: DType) -> &'static str {
    match d {
        DType::Bool | DType::U8 => "u8",
        DType::I32 | DType::U32 => "b32",
        DType::I64 => "b64",
        DType::F16 | DType::BF16 => "b16",
        DType::F32 => "f32",
    }
}

/// A PTX f32 immediate.
pub fn f32_imm(x: f32) -> String {
    format!("0f{:08X}", x.to_bits())
}
