//! Compile errors that point at the user's source.

use crate::ir::Loc;

/// A kernel-language error at a source location.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct CompileError {
    /// Where in the kernel's source (index into the front end's span table).
    pub loc: Loc,
    /// What is wrong, in words a user can act on.
    pub message: String,
}

impl CompileError {
    /// A new error at `loc`.
    pub fn new(loc: Loc, message: impl Into<String>) -> CompileError {
        CompileError {
            loc,
            message: message.into(),
        }
    }
}
