//! The reference interpreter: executes a typed kernel on the host, program by program.
//!
//! This module **is** the language's reference semantics: the GPU backend must compute
//! what it computes (up to the tolerances design.md allows for transcendental functions
//! and the order of float additions in `sum` and `dot`). In short:
//!
//! - Programs run one after another, `x` fastest, then `y`, then `z`; each walks the
//!   kernel body once. Values are whole tiles (a scalar is a tile of shape `[]`).
//! - Integers wrap (two's complement). Division and remainder truncate toward zero;
//!   dividing by zero is an error. Shift amounts are read as unsigned of the operand's
//!   width; amounts at or over the width give 0 (`<<`, unsigned `>>`) or all sign bits
//!   (signed `>>`).
//! - `f16`/`bf16` arithmetic computes in `f32` and rounds every result to the dtype
//!   (round to nearest even). Float `max`/`min` return the non-NaN operand.
//! - Casts: float to float and int to float round once to nearest even; float to int
//!   truncates toward zero and saturates (NaN gives 0); int to int wraps; anything to
//!   `bool` is `!= 0`; `bool` to a number is 0 or 1. Literals take their inferred dtype
//!   with one rounding from the written value.
//! - `load`: masked-off lanes touch no memory and yield `other` (0 when absent); an
//!   unmasked lane outside its buffer is an error naming the kernel, the program, the
//!   parameter and the element index.
//! - `store`: masked-off lanes write nothing. Two unmasked lanes of one store writing
//!   *different* values (different bytes once converted to the element type) to one
//!   address is an error naming the kernel, the program, the parameter, the element
//!   index and the two lanes: on the GPU which one lands is unspecified. Equal values
//!   are fine (a scalar broadcast to every lane). Writing through a [`Arg::Read`] buffer
//!   is an error.
//! - `sum` accumulates in `f32` (for `f16`/`bf16` too) and rounds once to the input
//!   dtype; `max`/`min` ignore NaN unless every lane is NaN; `argmax` gives the first
//!   index of the maximum, never a NaN lane unless all are NaN (then 0); `argmin` the
//!   same for the minimum.
//! - Scans, `permute`, `reshape`, `histogram` and the random numbers: see `more_ops.rs`.
//! - `dot` multiplies and accumulates in `f32`, starting from the accumulator (or 0),
//!   then rounds to the result dtype.
//! - Atomics apply lane by lane in row-major order and return the old values (0 for
//!   masked-off lanes); `atomic_max` on floats compares as floats.
//! - `cluster_gather(t)` (kernels with `cluster(..)`; the grid must be a multiple of
//!   the cluster): the programs of one cluster run together, top-level statement by
//!   top-level statement, and each receives every program's `t` stacked along a new
//!   leading axis in cluster-rank order (`x` fastest, then `y`, then `z`).
//! - `for` runs `start, start + step, ..` while below `end`; a step at or below zero is
//!   an error. Carried values start at `init` and take `next` after each iteration; the
//!   results are the last carried values (the inits if the loop never ran).

mod exec;
pub(crate) mod more_ops;
mod ops;

#[cfg(test)]
mod source_tests;
#[cfg(test)]
mod tests;

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
    /// The statement that failed (its location in the kernel's span table), for the
    /// caller to name the source it came from.
    pub loc: Option<crate::ir::Loc>,
}

/// Runs every program of `grid` (x fastest, then y, then z) over `args`.
///
/// `args` must match `kernel.params` in number and kind: a buffer ([`Arg::Read`] or
/// [`Arg::Write`]) whose length is a multiple of the element size for each `Ptr<T>`, and
/// a [`Scalar`] of the declared dtype for each scalar. Writes happen in place; on an
/// error, the programs before the failing one have completed their writes.
pub fn run(kernel: &Kernel, grid: [u32; 3], args: &mut [Arg<'_>]) -> Result<(), InterpError> {
    exec::check_args(kernel, args).map_err(|message| InterpError {
        kernel: kernel.name.clone(),
        message,
        loc: None,
    })?;
    let cluster = kernel.cluster;
    if let Some(axis) = (0..3).find(|&a| grid[a] % cluster[a] != 0) {
        return Err(InterpError {
            kernel: kernel.name.clone(),
            message: format!(
                "grid {grid:?} is not a multiple of the cluster {cluster:?} along {}",
                ["x", "y", "z"][axis]
            ),
            loc: None,
        });
    }
    let mut ex = exec::Exec::new(kernel, grid, args);
    if kernel.gathers() {
        for cz in (0..grid[2]).step_by(cluster[2] as usize) {
            for cy in (0..grid[1]).step_by(cluster[1] as usize) {
                for cx in (0..grid[0]).step_by(cluster[0] as usize) {
                    let mut pids = Vec::new();
                    for z in 0..cluster[2] {
                        for y in 0..cluster[1] {
                            for x in 0..cluster[0] {
                                pids.push([cx + x, cy + y, cz + z]);
                            }
                        }
                    }
                    ex.cluster(&pids)?;
                }
            }
        }
        return Ok(());
    }
    for z in 0..grid[2] {
        for y in 0..grid[1] {
            for x in 0..grid[0] {
                ex.program([x, y, z])?;
            }
        }
    }
    Ok(())
}
