//! The hopper family (sm_90a): a warp-specialized forward kernel in FlashAttention-3's
//! shape — TMA loads of K/V through tensor maps into an mbarrier ring, one producer
//! warpgroup, consumer warpgroups with raised register budgets running `wgmma`
//! (`S = Q·Kᵀ` from shared memory, `O += P·V` with P from registers) with the softmax
//! overlapped with both GEMMs. See `docs/hopper.md`.
//!
//! - [`forward`]: the kernel; [`config`]: tiles, roles, shared-memory layout;
//! - [`desc`]: the wgmma shared-memory matrix descriptor.
//!
//! Split-KV reuses the portable family's combine kernel.

pub mod config;
pub mod desc;
pub mod forward;

use crate::arch::Arch;
use crate::families::{portable, CompileTimings, CompiledModule, FamilyKind, LowerError};
use crate::llvm::{emit_ptx, kb::Kb};
use attnc_ir::{Spec, SplitKv};
use config::Config;
use inkwell::context::Context;

/// Why this family cannot compile `spec` for `arch`, or `None`.
pub fn unsupported_reason(spec: &Spec, arch: Arch) -> Option<String> {
    if arch != Arch::Sm90a {
        return Some("needs sm_90a (wgmma, TMA)".into());
    }
    Config::for_spec(spec).check(spec, arch.max_smem_per_block()).err()
}

pub fn compile(spec: &Spec, arch: Arch) -> Result<CompiledModule, LowerError> {
    compile_with_config(spec, arch, &Config::for_spec(spec))
}

/// Compiles with an explicit configuration (tuning; `compile` picks the default).
pub fn compile_with_config(spec: &Spec, arch: Arch, cfg: &Config) -> Result<CompiledModule, LowerError> {
    if let Some(reason) = unsupported_reason(spec, arch) {
        return Err(LowerError::Unsupported { family: FamilyKind::Hopper, arch, reason });
    }
    cfg.check(spec, arch.max_smem_per_block()).map_err(|reason| LowerError::Unsupported {
        family: FamilyKind::Hopper,
        arch,
        reason,
    })?;
    let t0 = std::time::Instant::now();
    let ctx = Context::create();
    let mut kb = Kb::new(&ctx, &format!("attnc_{}", spec.name));
    let mut kernels = vec![forward::build(&mut kb, spec, cfg, &portable::kernel_name(spec, "hopper_fwd"))?];
    if spec.split_kv != SplitKv::None {
        kernels.push(portable::combine::build(&mut kb, spec, &portable::kernel_name(spec, "combine"))?);
    }
    let build_ms = t0.elapsed().as_secs_f64() * 1e3;
    let (llvm_ir, ptx, optimize_ms, codegen_ms) = emit_ptx(&kb.module, arch)?;
    let timings = CompileTimings { build_ms, optimize_ms, codegen_ms };
    Ok(CompiledModule { family: FamilyKind::Hopper, arch, fallback_reason: None, kernels, llvm_ir, ptx, timings })
}

#[cfg(test)]
mod tests {
    use super::*;
    use attnc_ir::Align;

    /// Every supported head dim, masked and not, compiles; with ptxas present it must
    /// assemble for sm_90a without spills and without serialized wgmma, with HGMMA and
    /// UTMALDG in the SASS.
    #[test]
    fn every_head_dim_assembles_cleanly() {
        let ptxas = crate::ptxas::find_ptxas();
        for &(dqk, dv) in attnc_ir::spec::SUPPORTED_HEAD_DIMS {
            for causal in [false, true] {
                let mut s = Spec::new(&format!("d{dqk}_{dv}_{causal}"), dqk, 4);
                s.head_dim_v = dv;
                if causal {
                    s.mask.causal = Some(Align::BottomRight);
                }
                let m = compile(&s, Arch::Sm90a).unwrap_or_else(|e| panic!("d={dqk}/{dv}: {e}"));
                assert!(m.ptx.contains("wgmma.mma_async") && m.ptx.contains("cp.async.bulk.tensor"));
                let Ok(path) = &ptxas else {
                    assert!(std::env::var_os("CI").is_none(), "CI must have ptxas");
                    continue;
                };
                let r = crate::ptxas::assemble_with(path, &m.ptx, Arch::Sm90a).expect("assembles");
                assert!(!r.has_spills(), "d={dqk}/{dv} causal={causal} spills:\n{}", r.log);
                for code in ["C7513", "C7515", "C7517"] {
                    assert!(!r.log.contains(code), "d={dqk}/{dv} causal={causal}: wgmma serialized:\n{}", r.log);
                }
                if let Ok(sass) = r.disassemble() {
                    let ops = crate::ptxas::sass_opcode_counts(&sass);
                    assert!(ops.keys().any(|k| k.starts_with("HGMMA")), "d={dqk}/{dv}: no HGMMA");
                    assert!(ops.keys().any(|k| k.starts_with("UTMALDG")), "d={dqk}/{dv}: no UTMALDG");
                }
            }
        }
    }
}
