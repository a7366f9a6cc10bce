//! attnc-lower: kernel families (schedules) and codegen.
//!
//! A *family* is one way of computing attention on a GPU (portable = FA2-style
//! mma.sync; hopper = wgmma/TMA; blackwell = tcgen05/TMEM), with a forward and a
//! backward direction. Families share the variant code (masks, score modifications and
//! their derivatives, paging, GQA) through [`variant`], the code more than one family
//! launches through [`families::common`], and the LLVM plumbing (inline PTX, target
//! machine, the optimization pipeline) through [`llvm`]. [`compile()`] turns a validated
//! spec and a direction into a [`CompiledModule`]: PTX plus what the runtime needs to
//! launch it (kernel names and roles, launch shapes, the argument ABI).
//!
//! Layers, each importing only those listed before it: [`arch`], [`module`], [`error`];
//! [`llvm`]; [`variant`]; [`families`] (`common`, then each family); [`compile()`].
//! [`ptxas`] (the offline assembler driver) stands apart.

pub mod arch;
pub mod compile;
pub mod error;
pub mod families;
pub mod llvm;
pub mod module;
pub mod ptxas;
pub mod variant;

pub use arch::Arch;
pub use compile::{
    compile, compile_directions, compile_without_spills, compile_without_spills_or_portable, CompileOptions,
    FamilyChoice, SpillFreeCompile,
};
pub use error::LowerError;
pub use module::{
    BlockLayout, CompileTimings, CompiledModule, Direction, FamilyKind, Grid, KernelInfo, KernelRole, TmaBox,
};
