//! The reference interpreter: executes a typed kernel on the host, program by program.
//!
//! (Contract stub; the implementation lands with the interpreter work.)

use crate::ir::Kernel;

/// A scalar argument value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scalar {
    /// `i32`
    I32(i32),
    /// `u32`
    U32(u32),
    /// `i64`
    I64(i64),
    /// `f32`
    F32(f32),
}

/// One launch argument, in parameter order: buffers as the raw little-endian bytes of the
/// parameter's element type.
#[derive(Debug)]
pub enum Arg<'a> {
    /// A buffer the kernel only reads.
    Read(&'a [u8]),
    /// A buffer the kernel may write.
    Write(&'a mut [u8]),
    /// A scalar.
    Scalar(Scalar),
}

/// A run-time error of the interpreter.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("kernel `{kernel}`: {message}")]
pub struct InterpError {
    /// The kernel's name.
    pub kernel: String,
    /// What went wrong (parameter, index, program id).
    pub message: String,
}

/// Runs every program of `grid` (x fastest) over `args`.
pub fn run(kernel: &Kernel, grid: [u32; 3], args: &mut [Arg<'_>]) -> Result<(), InterpError> {
    let _ = (grid, args);
    Err(InterpError {
        kernel: kernel.name.clone(),
        message: "the interpreter is not built yet".into(),
    })
}
