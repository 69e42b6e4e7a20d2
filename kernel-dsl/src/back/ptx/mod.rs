//! PTX backend.
//!
//! (Contract stub; the implementation lands with the backend work.)

use crate::error::CompileError;
use crate::ir::Kernel;

/// The GPU architecture to generate for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// `sm_80`, PTX ISA 7.8: runs on Ampere, Ada and Hopper through the driver's JIT.
    Sm80,
    /// `sm_90`, PTX ISA 7.8.
    Sm90,
}

impl Target {
    /// The `.target` name.
    pub fn name(self) -> &'static str {
        match self {
            Target::Sm80 => "sm_80",
            Target::Sm90 => "sm_90",
        }
    }
}

/// A compiled kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PtxKernel {
    /// The PTX module text.
    pub ptx: String,
    /// The `.entry` name.
    pub entry: String,
    /// Static shared memory the kernel uses, in bytes.
    pub shared_bytes: u32,
    /// A human-readable report of the layout chosen for each tile value.
    pub layouts: String,
}

/// Compiles a typed kernel to PTX.
pub fn compile(kernel: &Kernel, target: Target) -> Result<PtxKernel, CompileError> {
    let _ = target;
    Err(CompileError::new(
        Default::default(),
        format!("kernel `{}`: the PTX backend is not built yet", kernel.name),
    ))
}
