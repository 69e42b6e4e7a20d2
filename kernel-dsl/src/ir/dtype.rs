//! Element types and tile types.

use std::fmt;

/// Element data types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// Predicates and masks; 1 byte in memory.
    Bool,
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 32-bit integer.
    I32,
    /// Unsigned 32-bit integer.
    U32,
    /// Signed 64-bit integer.
    I64,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    BF16,
    /// IEEE single precision.
    F32,
}

impl DType {
    /// Every dtype, for tests and tables.
    pub const ALL: [DType; 8] = [
        DType::Bool,
        DType::U8,
        DType::I32,
        DType::U32,
        DType::I64,
        DType::F16,
        DType::BF16,
        DType::F32,
    ];

    /// Size of one element in memory, in bytes.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::Bool | DType::U8 => 1,
            DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::U32 | DType::F32 => 4,
            DType::I64 => 8,
        }
    }

    /// `f16`, `bf16` or `f32`.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32)
    }

    /// Any integer type (not `bool`).
    pub fn is_int(self) -> bool {
        matches!(self, DType::U8 | DType::I32 | DType::U32 | DType::I64)
    }

    /// Signed integer types.
    pub fn is_signed_int(self) -> bool {
        matches!(self, DType::I32 | DType::I64)
    }

    /// The Rust spelling (`f32`, `bf16`, `bool`, ..).
    pub fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::U8 => "u8",
            DType::I32 => "i32",
            DType::U32 => "u32",
            DType::I64 => "i64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
        }
    }

    /// Parses the Rust spelling.
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The element of a tile: a value, or a pointer to global memory holding values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Elem {
    /// A value of this dtype.
    Val(DType),
    /// A pointer to elements of this dtype.
    Ptr(DType),
}

impl fmt::Display for Elem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Elem::Val(d) => write!(f, "{d}"),
            Elem::Ptr(d) => write!(f, "Ptr<{d}>"),
        }
    }
}

/// A scalar (empty shape) or a tile of compile-time shape; every extent is a power of two.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Type {
    /// The element.
    pub elem: Elem,
    /// The shape; empty for scalars.
    pub shape: Vec<usize>,
}

impl Type {
    /// A scalar.
    pub fn scalar(elem: Elem) -> Type {
        Type {
            elem,
            shape: Vec::new(),
        }
    }

    /// A tile.
    pub fn tile(elem: Elem, shape: Vec<usize>) -> Type {
        Type { elem, shape }
    }

    /// A scalar or tile of values of `dtype`.
    pub fn val(dtype: DType, shape: Vec<usize>) -> Type {
        Type {
            elem: Elem::Val(dtype),
            shape,
        }
    }

    /// Whether the shape is empty.
    pub fn is_scalar(&self) -> bool {
        self.shape.is_empty()
    }

    /// Number of elements (1 for scalars).
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The value dtype, or `None` for pointers.
    pub fn dtype(&self) -> Option<DType> {
        match self.elem {
            Elem::Val(d) => Some(d),
            Elem::Ptr(_) => None,
        }
    }

    /// The pointee dtype, or `None` for values.
    pub fn pointee(&self) -> Option<DType> {
        match self.elem {
            Elem::Ptr(d) => Some(d),
            Elem::Val(_) => None,
        }
    }
}

impl fmt::Display for Type {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.shape.is_empty() {
            write!(f, "{}", self.elem)
        } else {
            let dims: Vec<String> = self.shape.iter().map(|d| d.to_string()).collect();
            write!(f, "{}[{}]", self.elem, dims.join(", "))
        }
    }
}
