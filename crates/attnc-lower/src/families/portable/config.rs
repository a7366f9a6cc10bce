//! Tile configurations of the portable family and its shared-memory layout.

use crate::arch::Arch;
use attnc_ir::Spec;

/// One CTA's shape. `block_m = warps · 16 · m_tiles` rows of Q; `block_n` keys per
/// K/V tile; `stages` K/V buffers for the cp.async pipeline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub warps: u32,
    pub m_tiles: u32,
    pub block_n: u32,
    pub stages: u32,
}

impl Config {
    /// The configuration for a spec on an arch. Speed was measured on the H100
    /// (docs/results/2026-11-22-h100-portable-tile-sweep.md): 128-row tiles with two
    /// m16 tiles per warp (each K/V fragment feeds two MMAs, as in FlashAttention-2)
    /// run ~50% faster than 64-row tiles, and 64-key tiles beat 32-key ones by ~7%.
    /// The rest is the register budget (255 per thread; the O accumulator alone takes
    /// 128 at d_v = 128), checked with ptxas for every example on every arch:
    ///
    /// | variant (block_m × block_n, 4 warps) | sm_90a   | sm_80, sm_100a |
    /// |--------------------------------------|----------|----------------|
    /// | d > 128                              | 64 × 32  | 64 × 32        |
    /// | mask reads an aux tensor             | 64 × 64  | 64 × 64        |
    /// | other per-element mask / score mod   | 128 × 32 | 64 × 64        |
    /// | no per-element work                  | 128 × 64 | 64 × 64        |
    ///
    /// The 128-row tiles run at 240–255 registers, where ptxas's allocation differs
    /// between arch targets: on sm_80/sm_100a several of them spill a few bytes. Those
    /// archs can't be measured here, so they get the 64-row tiles (~135 registers)
    /// until they can.
    pub fn for_spec(spec: &Spec, arch: Arch) -> Config {
        let c = |m_tiles, block_n| Config { warps: 4, m_tiles, block_n, stages: 2 };
        let wide = spec.head_dim_qk > 128 || spec.head_dim_v > 128;
        let reads_aux = spec.mask.predicate.as_ref().is_some_and(|p| p.uses_aux())
            || spec.score_mod.as_ref().is_some_and(|p| p.uses_aux());
        let elementwise = spec.mask.to_predicate().is_some() || spec.score_mod.is_some();
        if wide {
            c(1, 32)
        } else if reads_aux || arch != Arch::Sm90a {
            c(1, 64)
        } else if elementwise {
            c(2, 32)
        } else {
            c(2, 64)
        }
    }

    /// Whether the tile shape is one the kernel builder supports for `spec`.
    pub fn check(&self, spec: &Spec) -> Result<(), String> {
        if !(1..=8).contains(&self.warps) || !(1..=4).contains(&self.m_tiles) {
            return Err(format!("unsupported tile config {self:?}: 1-8 warps, 1-4 m tiles"));
        }
        if self.block_n % 16 != 0 || self.block_n == 0 || self.block_n > 256 {
            return Err(format!("block_n {} must be a multiple of 16 in 16..=256", self.block_n));
        }
        if self.stages != 2 {
            return Err("the portable pipeline is double-buffered (stages = 2)".into());
        }
        if spec.head_dim_qk % 16 != 0 || spec.head_dim_v % 16 != 0 {
            return Err("head dims must be multiples of 16".into());
        }
        Ok(())
    }

    pub fn block_m(&self) -> u32 {
        self.warps * 16 * self.m_tiles
    }
    pub fn threads(&self) -> u32 {
        self.warps * 32
    }
    /// Bytes per shared-memory row of `d` halves: padded by 16 bytes so the 8 rows an
    /// ldmatrix phase reads start in 8 different 4-bank groups.
    pub fn row_bytes(&self, d: u32) -> u32 {
        d * 2 + 16
    }
    pub fn k_offset(&self, spec: &Spec) -> u32 {
        self.block_m() * self.row_bytes(spec.head_dim_qk)
    }
    pub fn v_offset(&self, spec: &Spec) -> u32 {
        self.k_offset(spec) + self.stages * self.block_n * self.row_bytes(spec.head_dim_qk)
    }
    pub fn smem_bytes(&self, spec: &Spec) -> u32 {
        self.v_offset(spec) + self.stages * self.block_n * self.row_bytes(spec.head_dim_v)
    }
}
