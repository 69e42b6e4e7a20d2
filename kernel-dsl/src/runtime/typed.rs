//! Typed launches: the compile-time constants of a kernel as one named value.
//!
//! `#[kernel]` generates, per kernel `foo`, a `FooConsts` struct (one `usize` field per
//! compile-time constant, named in lower case) implementing [`KernelConsts`], and a
//! `FooArgs` struct (one field per run-time parameter, by name) whose `launch` takes the
//! constants as a value chosen at run time. Code that picks variants at run time (a
//! launch plan, a sweep) holds and edits `FooConsts` fields instead of positional
//! `&[i64]` lists; see docs/design.md, "The launch contract".

use super::{KernelDef, LaunchError};

/// A kernel's compile-time constants as a typed value (`#[kernel]` implements it for the
/// generated `<Name>Consts`).
pub trait KernelConsts: Copy + std::fmt::Debug + PartialEq + Eq + std::hash::Hash {
    /// The kernel the constants belong to.
    fn def() -> &'static KernelDef;

    /// The values in the kernel's declaration order, as [`KernelDef::launch_dyn`] and
    /// [`KernelDef::variant`] take them.
    fn values(&self) -> Vec<i64>;

    /// The constants from values in declaration order; `None` when the count differs
    /// from the kernel's or a value is negative.
    fn from_values(values: &[i64]) -> Option<Self>;

    /// Every compiled variant's constants with its warp count, in the order
    /// `#[kernel]` listed them, once each (variants that differ only in `num_stages`
    /// give one entry).
    fn compiled() -> Vec<(Self, u32)> {
        let mut out: Vec<(Self, u32)> = Vec::new();
        for v in Self::def().variants {
            if let Some(c) = Self::from_values(v.consts) {
                if !out.contains(&(c, v.num_warps)) {
                    out.push((c, v.num_warps));
                }
            }
        }
        out
    }

    /// Fails unless a variant was compiled for these constants and `num_warps` (the
    /// error lists every compiled combination).
    fn check(&self, num_warps: u32) -> Result<(), LaunchError> {
        Self::def().variant(&self.values(), Some(num_warps))?;
        Ok(())
    }

    /// The constants and warp count in words (`BLOCK_N=4, BLOCK_K=512, num_warps=8`).
    fn describe(&self, num_warps: u32) -> String {
        Self::def().describe_variant(&self.values(), num_warps)
    }
}
