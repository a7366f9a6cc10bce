//! attnc-lower: kernel families (schedules) and codegen.
//!
//! A *family* is one way of computing attention on a GPU (portable = FA2-style
//! mma.sync; hopper = wgmma/TMA; blackwell = tcgen05/TMEM). Families share the variant
//! code (masks, score modifications, paging, GQA) through [`variant`], and the LLVM
//! plumbing (inline PTX, target machine, the optimization pipeline) through [`llvm`].
//! [`compile`] turns a validated spec into a [`CompiledModule`]: PTX plus what the
//! runtime needs to launch it (kernel names, launch shapes, the argument ABI).

pub mod arch;
pub mod families;
pub mod llvm;
pub mod ptxas;
pub mod variant;

pub use arch::Arch;
pub use families::{
    compile, CompileOptions, CompileTimings, CompiledModule, FamilyChoice, FamilyKind, KernelInfo, LowerError,
};
