//! The portable family: a FlashAttention-2-style forward on mma.sync m16n8k16,
//! ldmatrix and cp.async (sm_80+, so it runs on A100, H100 and B200). It supports every
//! variant the IR describes and is the correctness baseline and the fallback of the
//! faster families.
//!
//! - [`forward`]: the attention kernel (also writes split-KV partials);
//! - [`combine`]: the split-KV combine kernel;
//! - [`config`]: tile shapes and the shared-memory layout;
//! - [`abi`]: the launch parameter lists.

pub mod abi;
pub mod combine;
pub mod config;
pub mod forward;

use crate::arch::Arch;
use crate::families::{CompiledModule, FamilyKind, LowerError};
use crate::llvm::{emit_ptx, kb::Kb};
use attnc_ir::{Spec, SplitKv};
use config::Config;
use inkwell::context::Context;

/// Why this family cannot compile `spec`, or `None`. It covers the whole IR; the only
/// limit is shared memory per CTA.
pub fn unsupported_reason(spec: &Spec, arch: Arch) -> Option<String> {
    let cfg = Config::for_spec(spec);
    let smem = cfg.smem_bytes(spec);
    if smem > arch.max_smem_per_block() {
        return Some(format!(
            "needs {smem} bytes of shared memory per CTA, {arch} allows {}",
            arch.max_smem_per_block()
        ));
    }
    None
}

/// Entry-point names: `attnc_<variant>_<kernel>`.
pub fn kernel_name(spec: &Spec, what: &str) -> String {
    format!("attnc_{}_{what}", spec.name)
}

pub fn compile(spec: &Spec, arch: Arch) -> Result<CompiledModule, LowerError> {
    let ctx = Context::create();
    let mut kb = Kb::new(&ctx, &format!("attnc_{}", spec.name));
    let cfg = Config::for_spec(spec);
    let mut kernels = vec![forward::build(&mut kb, spec, &cfg, &kernel_name(spec, "fwd"))?];
    if spec.split_kv != SplitKv::None {
        kernels.push(combine::build(&mut kb, spec, &kernel_name(spec, "combine"))?);
    }
    let (llvm_ir, ptx) = emit_ptx(&kb.module, arch)?;
    Ok(CompiledModule { family: FamilyKind::Portable, arch, fallback_reason: None, kernels, llvm_ir, ptx })
}
