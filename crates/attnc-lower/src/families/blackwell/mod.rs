//! The blackwell family: FlashAttention-4's forward pipeline for sm_100a (tcgen05 MMAs
//! with accumulators in tensor memory, TMA loads, mbarriers, warp specialization,
//! setmaxnreg). See docs/blackwell.md for the pipeline, the TMEM column map and what is
//! verified how (no B200 is in reach: the family is verified by ptxas, SASS checks and
//! models, not by running it).
//!
//! - [`forward`]: the forward kernel;
//! - [`backward`]: the backward main kernel (one CTA per key tile, or a CTA pair at head
//!   dim 128), built to [`backward_plan`] and modelled by [`backward_protocol`];
//!   `backward_numerics` (tests) models its arithmetic in its tile order against the f64
//!   reference;
//! - [`config`]: roles, register budgets, shared-memory layout, TMEM column map, mbarriers;
//! - [`schedule`]: persistent tile order (LPT for causal);
//! - [`desc`]: the tcgen05 instruction and shared-memory descriptors;
//! - [`abi`]: launch parameters and the TMA tensor maps the runtime encodes;
//! - [`numerics`]: the exp2 emulation's error table (FA4 Table 2);
//! - [`protocol`]: a model of the roles' barrier protocol, run under random timing;
//! - [`report`]: the cycle model (FA4 Table 1), TMEM column map and warp-role table;
//! - [`verify`]: ptxas/SASS checks against the resource model (no GPU needed).

pub mod abi;
pub mod backward;
#[cfg(test)]
mod backward_numerics;
pub mod backward_plan;
pub mod backward_protocol;
pub mod config;
pub mod desc;
pub mod forward;
pub mod numerics;
pub mod protocol;
pub mod report;
pub mod verify;

use crate::arch::Arch;
use crate::error::LowerError;
use crate::families::common::{abi::kernel_name, backward as common_bwd, block_mask, combine};
use crate::families::{finish_module, finish_module_at, Family};
use crate::llvm::kb::Kb;
use crate::module::{BlockLayout, CompiledModule, Direction, FamilyKind};
use attnc_ir::block_mask::Tiling;
use attnc_ir::{Spec, SplitKv};
use config::{Config, BLOCK_M, BLOCK_N};
use inkwell::context::Context;

/// Whether the dispatcher may pick this family (off while register budgets are tuned:
/// every accepted example must assemble without spills first).
pub const DISPATCH_ENABLED: bool = true;

/// The blackwell family (see the module docs).
pub struct Blackwell;

impl Family for Blackwell {
    fn kind(&self) -> FamilyKind {
        FamilyKind::Blackwell
    }
    fn unsupported_reason(&self, spec: &Spec, arch: Arch, direction: Direction) -> Option<String> {
        match direction {
            Direction::Forward => unsupported_reason(spec, arch),
            Direction::Backward => backward_unsupported_reason(spec, arch),
        }
    }
    fn compile(&self, spec: &Spec, arch: Arch, direction: Direction) -> Result<CompiledModule, LowerError> {
        let unsupported = |reason| LowerError::Unsupported { family: FamilyKind::Blackwell, direction, arch, reason };
        if direction == Direction::Backward {
            if let Some(reason) = backward_unsupported_reason(spec, arch) {
                return Err(unsupported(reason));
            }
            return compile_backward(spec, arch);
        }
        if let Some(reason) = kernel_unsupported_reason(spec, arch) {
            return Err(unsupported(reason));
        }
        let cfg = Config::for_spec(spec).map_err(unsupported)?;
        compile_with_config(spec, arch, &cfg)
    }

    /// The forward's step down: one Q tile per CTA (the working softmax warpgroup gets
    /// the idle one's registers, 232 instead of 192), when the default has two.
    fn step_down(
        &self,
        spec: &Spec,
        arch: Arch,
        direction: Direction,
        step: u32,
    ) -> Option<Result<(CompiledModule, String), LowerError>> {
        match (direction, step) {
            (Direction::Forward, 1) => {
                let cfg = Config::for_spec(spec).ok()?;
                let one = cfg.one_q_tile();
                (one != cfg && one.check().is_ok()).then(|| {
                    compile_with_config(spec, arch, &one)
                        .map(|m| (m, "one Q tile per CTA (232 softmax registers instead of 192)".to_string()))
                })
            }
            // The pair's compute warps hold a few more values (rank, the peer's dS
            // address, the pair's walk); one CTA per key tile is the kernel of before.
            (Direction::Backward, 1) => {
                (backward_plan::cta_mode(spec).ok()? == backward_plan::CtaMode::Two).then(|| {
                    compile_backward_in(spec, arch, backward_plan::CtaMode::One)
                        .map(|m| (m, "one CTA per key tile instead of a CTA pair (cta_group::2)".to_string()))
                })
            }
            _ => None,
        }
    }
}

/// Why the dispatcher may not pick the forward for `spec` on `arch`, or `None`. The
/// dispatcher then falls back to the portable family and records the reason in the
/// receipt.
pub fn unsupported_reason(spec: &Spec, arch: Arch) -> Option<String> {
    if let Some(r) = kernel_unsupported_reason(spec, arch) {
        return Some(r);
    }
    if !DISPATCH_ENABLED {
        return Some("not enabled yet (register budgets being tuned)".into());
    }
    None
}

/// Why the backward cannot compile `spec` for `arch`, or `None`.
pub fn backward_unsupported_reason(spec: &Spec, arch: Arch) -> Option<String> {
    if arch != Arch::Sm100a {
        return Some("needs sm_100a (tcgen05, tensor memory)".into());
    }
    backward::unsupported_reason(spec)
}

/// The backward module: the shared preprocess, dQ convert, sink-gradient and
/// block-classify kernels around this family's main kernel. Built, verified by ptxas and
/// models, never run on a B200 (the runtime's `Auto` passes it over).
fn compile_backward(spec: &Spec, arch: Arch) -> Result<CompiledModule, LowerError> {
    let mode = backward_plan::cta_mode(spec).map_err(LowerError::Llvm)?;
    compile_backward_in(spec, arch, mode)
}

/// [`compile_backward`] with the main kernel in `mode`.
fn compile_backward_in(spec: &Spec, arch: Arch, mode: backward_plan::CtaMode) -> Result<CompiledModule, LowerError> {
    let t0 = std::time::Instant::now();
    let ctx = Context::create();
    let mut kb = Kb::new(&ctx, &format!("attnc_{}_bwd", spec.name));
    let name = kernel_name(spec, "blackwell_bwd");
    let kernels =
        common_bwd::build_kernels(&mut kb, spec, BlockLayout::Dense, common_bwd::DqAccumLayout::RowMajor, |kb| {
            backward::build_in(kb, spec, &name, mode)
        })?;
    // dQ goes out through vector reds.
    finish_module_at(&kb, FamilyKind::Blackwell, Direction::Backward, arch, kernels, t0, arch.vector_red_ptx_feature())
}

/// Why the forward kernel builder cannot compile `spec` for `arch`, or `None`.
pub fn kernel_unsupported_reason(spec: &Spec, arch: Arch) -> Option<String> {
    if arch != Arch::Sm100a {
        return Some("needs sm_100a (tcgen05, tensor memory)".into());
    }
    if let Err(e) = Config::for_spec(spec) {
        return Some(e);
    }
    None
}

/// The spec the kernel is built for, and what was changed: pack_gqa whose group size
/// does not divide 128 runs unpacked (one work tile per query head, K/V read once per
/// head instead of once per group). A packed Q tile is one 5-D TMA box `{64, G, 128/G}`
/// only when G divides 128; packing is a layout choice, so the results are the same.
pub fn effective_spec(spec: &Spec) -> (std::borrow::Cow<'_, Spec>, Option<String>) {
    if spec.pack_gqa && 128 % spec.group_size() != 0 {
        let mut s = spec.clone();
        s.pack_gqa = false;
        let note = format!(
            "pack_gqa off: {} query heads per KV head do not divide a 128-row TMA box, so heads run unpacked (K/V read per query head)",
            spec.group_size()
        );
        return (std::borrow::Cow::Owned(s), Some(note));
    }
    (std::borrow::Cow::Borrowed(spec), None)
}

/// Compiles the forward with an explicit configuration (e.g. `PvOrder::InOrderPipe`).
pub fn compile_with_config(spec: &Spec, arch: Arch, cfg: &Config) -> Result<CompiledModule, LowerError> {
    cfg.check().map_err(|reason| LowerError::Unsupported {
        family: FamilyKind::Blackwell,
        direction: Direction::Forward,
        arch,
        reason,
    })?;
    build_module(spec, arch, cfg)
}

/// Lowers the forward without checking the resource model (experiments with budgets
/// ptxas honors but the register file could not hold).
pub(crate) fn build_module(spec: &Spec, arch: Arch, cfg: &Config) -> Result<CompiledModule, LowerError> {
    let t0 = std::time::Instant::now();
    let (eff, note) = effective_spec(spec);
    let spec = eff.as_ref();
    let ctx = Context::create();
    let mut kb = Kb::new(&ctx, &format!("attnc_{}", spec.name));
    let mut fwd = forward::build(&mut kb, spec, cfg, &kernel_name(spec, "fwd"))?;
    if let Some(n) = note {
        // The receipt shows the forward kernel's note: say what the layout became.
        fwd.note = Some(match fwd.note.take() {
            Some(old) => format!("{old}; {n}"),
            None => n,
        });
    }
    let mut kernels = vec![fwd];
    if spec.split_kv != SplitKv::None {
        // Split partials go through the shared combine kernel (same workspace layout,
        // `variant::layout::partial_row`).
        kernels.push(combine::build(&mut kb, spec, &kernel_name(spec, "combine"))?);
    }
    // The softmax warpgroups' 128-row tiles; the walk's 256-row work tiles read two.
    let tiling = Tiling { block_m: BLOCK_M, block_n: BLOCK_N, pack_gqa: spec.pack_gqa };
    block_mask::push_if_needed(&mut kb, spec, tiling, BlockLayout::Dense, "block_classify", &mut kernels)?;
    finish_module(&kb, FamilyKind::Blackwell, Direction::Forward, arch, kernels, t0)
}

#[cfg(test)]
mod tests;
