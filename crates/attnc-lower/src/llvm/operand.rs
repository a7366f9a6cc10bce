//! Operand facts the tensor-core instructions share: wgmma (sm_90a) and tcgen05.mma
//! (sm_100a) both read shared-memory matrices whose contiguous dimension is K or M/N.

/// Which dimension of a shared-memory operand is contiguous: for wgmma's bf16/f16 forms
/// this is the `imm-trans-a` / `imm-trans-b` operand, for tcgen05 the instruction
/// descriptor's transpose bits (K-major = 0, MN-major = 1 "transposed").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Major {
    K = 0,
    Mn = 1,
}
