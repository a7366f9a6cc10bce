//! The blackwell family: FlashAttention-4's forward pipeline for sm_100a (tcgen05 MMAs
//! with accumulators in tensor memory, TMA loads, mbarriers, warp specialization).
//! See docs/blackwell.md for the pipeline, the TMEM column map and what is verified how.
//!
//! - [`desc`]: the tcgen05 instruction and shared-memory descriptors;
//! - [`abi`]: launch parameters and the TMA tensor maps the runtime encodes.

pub mod abi;
pub mod desc;

use crate::arch::Arch;
use attnc_ir::Spec;

/// Why this family cannot compile `spec` for `arch`, or `None`.
pub fn unsupported_reason(_spec: &Spec, arch: Arch) -> Option<String> {
    if arch != Arch::Sm100a {
        return Some("needs sm_100a (tcgen05, tensor memory)".into());
    }
    Some("not implemented yet".into())
}
