//! Kernel families: one schedule per way of computing attention on a GPU, each with a
//! forward and a backward direction. A family is a thin schedule over the shared layers
//! below it: [`common`] (entry ABI, combine, epilogue, swizzled layouts), the variant
//! code (`crate::variant`) and the instruction wrappers (`crate::llvm`). No family
//! imports another; the compile entry point (`crate::compile`) picks one through the
//! [`Family`] contract.

use crate::arch::Arch;
use crate::error::LowerError;
use crate::llvm::{emit_ptx_with, kb::Kb};
use crate::module::{CompileTimings, CompiledModule, Direction, FamilyKind, KernelInfo};
use attnc_ir::Spec;

pub mod blackwell;
pub mod common;
pub mod hopper;
pub mod portable;

/// What a kernel family provides: whether it can compile a direction of a variant for
/// an arch (and why not), and the compile itself with its default configuration.
pub trait Family: Sync {
    fn kind(&self) -> FamilyKind;
    /// Why this family cannot compile `direction` of `spec` for `arch`, or `None`.
    fn unsupported_reason(&self, spec: &Spec, arch: Arch, direction: Direction) -> Option<String>;
    /// Lowers `direction` of `spec` (fails with the reason when unsupported).
    fn compile(&self, spec: &Spec, arch: Arch, direction: Direction) -> Result<CompiledModule, LowerError>;
    /// The family's `step`-th smaller configuration of `direction` (1, 2, ...), for when
    /// ptxas reports spills in the one before (`crate::compile::compile_without_spills`),
    /// compiled, with a note saying what it gave up; `None` past the last.
    fn step_down(
        &self,
        _spec: &Spec,
        _arch: Arch,
        _direction: Direction,
        _step: u32,
    ) -> Option<Result<(CompiledModule, String), LowerError>> {
        None
    }
}

/// The family of `kind`.
pub fn family(kind: FamilyKind) -> &'static dyn Family {
    match kind {
        FamilyKind::Portable => &portable::Portable,
        FamilyKind::Hopper => &hopper::Hopper,
        FamilyKind::Blackwell => &blackwell::Blackwell,
    }
}

/// Runs LLVM's pipeline and the NVPTX backend over the kernels a family built in `kb`
/// (started at `started`) and packs the module.
pub(crate) fn finish_module(
    kb: &Kb<'_>,
    family: FamilyKind,
    direction: Direction,
    arch: Arch,
    kernels: Vec<KernelInfo>,
    started: std::time::Instant,
) -> Result<CompiledModule, LowerError> {
    finish_module_at(kb, family, direction, arch, kernels, started, arch.ptx_feature())
}

/// [`finish_module`] at a given PTX ISA version (see [`crate::llvm::emit_ptx_with`]).
pub(crate) fn finish_module_at(
    kb: &Kb<'_>,
    family: FamilyKind,
    direction: Direction,
    arch: Arch,
    kernels: Vec<KernelInfo>,
    started: std::time::Instant,
    ptx_feature: &str,
) -> Result<CompiledModule, LowerError> {
    let build_ms = started.elapsed().as_secs_f64() * 1e3;
    let (llvm_ir, ptx, optimize_ms, codegen_ms) = emit_ptx_with(&kb.module, arch, ptx_feature)?;
    let timings = CompileTimings { build_ms, optimize_ms, codegen_ms };
    Ok(CompiledModule {
        family,
        direction,
        arch,
        fallback_reason: None,
        config_note: None,
        kernels,
        llvm_ir,
        ptx,
        timings,
    })
}
