//! The one error type of lowering.

use crate::arch::Arch;
use crate::module::{Direction, FamilyKind};

#[derive(Debug, thiserror::Error)]
pub enum LowerError {
    #[error("invalid spec: {0}")]
    InvalidSpec(String),
    #[error("the {family} family cannot compile the {direction} pass of this variant for {arch}: {reason}")]
    Unsupported { family: FamilyKind, direction: Direction, arch: Arch, reason: String },
    /// No family can run this direction of the variant on the arch (e.g. a backward on
    /// an inference-only KV layout): the reasons of each candidate.
    #[error("no kernel family can compile the {direction} pass of this variant for {arch}: {reason}")]
    NoFamily { direction: Direction, arch: Arch, reason: String },
    /// The variant has no such direction at all, whatever the family: a backward of an
    /// inference-only layout (paged KV, split-KV).
    #[error("no {direction} pass for this variant: {reason}")]
    NoSuchPass { direction: Direction, reason: String },
    #[error("LLVM error: {0}")]
    Llvm(String),
    /// ptxas failed on a module (compiles that assemble to choose a configuration).
    #[error("ptxas: {0}")]
    Ptxas(String),
}
