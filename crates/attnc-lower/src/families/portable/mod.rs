//! The portable family: FlashAttention-2's algorithm on mma.sync m16n8k16, ldmatrix and
//! cp.async (sm_80+, so it runs on A100, H100 and B200). It supports every variant the
//! IR describes and is the correctness baseline and the fallback of the faster families.
//!
//! - [`forward`]: the attention kernel (also writes split-KV partials; the combine
//!   kernel is `common::combine`);
//! - [`backward`]: the backward main kernel (dK, dV, dQ, learnable aux gradients); the
//!   kernels around it are `common::backward`'s;
//! - [`config`]: tile shapes and the shared-memory layouts of both directions.

pub mod backward;
pub mod config;
pub mod forward;

use crate::arch::Arch;
use crate::error::LowerError;
use crate::families::common::{abi::kernel_name, backward as common_bwd, block_mask, combine};
use crate::families::{finish_module, finish_module_at, Family};
use crate::llvm::kb::Kb;
use crate::module::{BlockLayout, CompiledModule, Direction, FamilyKind};
use attnc_ir::block_mask::Tiling;
use attnc_ir::{Spec, SplitKv};
use config::{BwdConfig, Config};
use inkwell::context::Context;

/// The portable family (see the module docs).
pub struct Portable;

impl Family for Portable {
    fn kind(&self) -> FamilyKind {
        FamilyKind::Portable
    }
    fn unsupported_reason(&self, spec: &Spec, arch: Arch, direction: Direction) -> Option<String> {
        match direction {
            Direction::Forward => forward_unsupported_reason(spec, arch),
            Direction::Backward => backward_unsupported_reason(spec, arch),
        }
    }
    fn compile(&self, spec: &Spec, arch: Arch, direction: Direction) -> Result<CompiledModule, LowerError> {
        if let Some(reason) = self.unsupported_reason(spec, arch, direction) {
            return Err(LowerError::Unsupported { family: FamilyKind::Portable, direction, arch, reason });
        }
        match direction {
            Direction::Forward => compile_with_config(spec, arch, &Config::for_spec(spec, arch)),
            Direction::Backward => compile_backward_with_config(spec, arch, &BwdConfig::for_spec(spec, arch)),
        }
    }

    /// The backward's steps down (`BwdConfig::step_downs`): the 8-warp, 64-key shape
    /// without a register cap when the default is the 16-warp one (at 128 registers, ptxas
    /// spills a few bytes for some variants, e.g. sinks with GQA on sm_80), then 16-row
    /// passes.
    fn step_down(
        &self,
        spec: &Spec,
        arch: Arch,
        direction: Direction,
        step: u32,
    ) -> Option<Result<(CompiledModule, String), LowerError>> {
        match (direction, step) {
            // The forward: smaller tiles, one step at a time (`Config::smaller`).
            (Direction::Forward, _) => {
                let mut cfg = Config::for_spec(spec, arch);
                for _ in 0..step {
                    cfg = cfg.smaller()?;
                }
                Some(
                    compile_with_config(spec, arch, &cfg)
                        .map(|m| (m, format!("the forward runs {}-row x {}-key tiles", cfg.block_m(), cfg.block_n))),
                )
            }
            (Direction::Backward, step) => {
                let next =
                    BwdConfig::for_spec(spec, arch).step_downs(spec).into_iter().nth(step.checked_sub(1)? as usize)?;
                Some(compile_backward_with_config(spec, arch, &next).map(|m| {
                    let what = format!(
                        "the backward runs {} warps over {} keys per CTA, {}-row passes",
                        next.warps,
                        next.block_n(),
                        next.q_sub
                    );
                    (m, what)
                }))
            }
        }
    }
}

/// Why the forward cannot compile `spec`, or `None`. It covers the whole IR; the only
/// limit is shared memory per CTA.
pub fn forward_unsupported_reason(spec: &Spec, arch: Arch) -> Option<String> {
    let cfg = Config::for_spec(spec, arch);
    let smem = cfg.smem_bytes(spec);
    if smem > arch.max_smem_per_block() {
        return Some(format!(
            "needs {smem} bytes of shared memory per CTA, {arch} allows {}",
            arch.max_smem_per_block()
        ));
    }
    None
}

/// Why the backward cannot compile `spec`, or `None`: the tile shape must suit the head
/// dims and fit shared memory.
pub fn backward_unsupported_reason(spec: &Spec, arch: Arch) -> Option<String> {
    let cfg = BwdConfig::for_spec(spec, arch);
    if let Err(e) = cfg.check(spec) {
        return Some(e);
    }
    if cfg.dq_vec > 1 && !arch.has_vector_red() {
        return Some(format!("vector atomics (dq_vec {}) need sm_90 or later", cfg.dq_vec));
    }
    let smem = cfg.smem_bytes(spec);
    if smem > arch.max_smem_per_block() {
        return Some(format!(
            "the backward needs {smem} bytes of shared memory per CTA, {arch} allows {}",
            arch.max_smem_per_block()
        ));
    }
    None
}

/// Compiles the backward with an explicit configuration: the preprocess, main and dQ
/// convert kernels, the sink gradient with sinks and the aux-gradient reduce with
/// learnable aux tensors.
pub fn compile_backward_with_config(spec: &Spec, arch: Arch, cfg: &BwdConfig) -> Result<CompiledModule, LowerError> {
    cfg.check(spec).map_err(|reason| LowerError::Unsupported {
        family: FamilyKind::Portable,
        direction: Direction::Backward,
        arch,
        reason,
    })?;
    let t0 = std::time::Instant::now();
    let ctx = Context::create();
    let mut kb = Kb::new(&ctx, &format!("attnc_{}_bwd", spec.name));
    let kernels =
        common_bwd::build_kernels(&mut kb, spec, BlockLayout::Dense, common_bwd::DqAccumLayout::RowMajor, |kb| {
            backward::build(kb, spec, cfg, &kernel_name(spec, "bwd"))
        })?;
    // Vector atomics for dQ need the PTX ISA that has them.
    let ptx = if cfg.dq_vec > 1 { arch.vector_red_ptx_feature() } else { arch.ptx_feature() };
    finish_module_at(&kb, FamilyKind::Portable, Direction::Backward, arch, kernels, t0, ptx)
}

/// Compiles the forward with an explicit tile configuration (for tuning; the family's
/// `compile` picks the measured default).
pub fn compile_with_config(spec: &Spec, arch: Arch, cfg: &Config) -> Result<CompiledModule, LowerError> {
    cfg.check(spec).map_err(|reason| LowerError::Unsupported {
        family: FamilyKind::Portable,
        direction: Direction::Forward,
        arch,
        reason,
    })?;
    let t0 = std::time::Instant::now();
    let ctx = Context::create();
    let mut kb = Kb::new(&ctx, &format!("attnc_{}", spec.name));
    let mut kernels = vec![forward::build(&mut kb, spec, cfg, &kernel_name(spec, "fwd"))?];
    if spec.split_kv != SplitKv::None {
        kernels.push(combine::build(&mut kb, spec, &kernel_name(spec, "combine"))?);
    }
    let tiling = Tiling { block_m: cfg.block_m(), block_n: cfg.block_n, pack_gqa: spec.pack_gqa };
    block_mask::push_if_needed(&mut kb, spec, tiling, BlockLayout::RowLists, "block_classify", &mut kernels)?;
    finish_module(&kb, FamilyKind::Portable, Direction::Forward, arch, kernels, t0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use attnc_ir::{Align, KvLayout, Spec, SplitKv};

    fn variants() -> Vec<Spec> {
        let mut v = Vec::new();
        let mut s = Spec::new("mha", 128, 4);
        v.push(s.clone());
        s.name = "causal_split".into();
        s.mask.causal = Some(Align::BottomRight);
        s.split_kv = SplitKv::Fixed(4);
        s.lse = true;
        v.push(s.clone());
        let mut p = Spec::new("paged", 64, 8);
        p.kv_heads = 2;
        p.pack_gqa = true;
        p.kv_layout = KvLayout::Paged { page_size: 1 };
        p.sinks = true;
        v.push(p);
        v
    }

    #[test]
    fn ptx_is_ascii_and_has_the_promised_instructions() {
        for spec in variants() {
            for arch in Arch::ALL {
                let m = Portable.compile(&spec, arch, Direction::Forward).expect("compiles");
                assert!(m.ptx.is_ascii(), "{}: the driver's PTX JIT rejects non-ASCII", spec.name);
                for needle in [
                    "mma.sync.aligned.m16n8k16",
                    "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
                    "ldmatrix.sync.aligned.m8n8.x4.trans",
                    "cp.async.cg.shared.global",
                    "ex2.approx",
                ] {
                    assert!(m.ptx.contains(needle), "{} on {arch}: no {needle}", spec.name);
                }
                assert!(m.ptx.contains("// softmax"), "sections are marked");
                let expected = if spec.split_kv == SplitKv::None { 1 } else { 2 };
                assert_eq!(m.kernels.len(), expected);
                for k in &m.kernels {
                    assert!(m.ptx.contains(&format!(".entry {}", k.name)), "{}", k.name);
                }
            }
        }
    }

    #[test]
    fn smem_fits_every_arch_for_every_head_dim() {
        for &(dqk, dv) in attnc_ir::spec::SUPPORTED_HEAD_DIMS {
            let mut s = Spec::new("x", dqk, 4);
            s.head_dim_v = dv;
            for arch in Arch::ALL {
                assert_eq!(forward_unsupported_reason(&s, arch), None, "d={dqk}/{dv} on {arch}");
            }
        }
    }
}
