//! Tile configurations of the portable family and its shared-memory layout.

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
    /// The configuration for a spec: 64×64 tiles up to head_dim 128, 64×32 above (the
    /// O accumulator grows with d_v; a narrower K/V tile keeps S small and registers
    /// under 255 without spills).
    pub fn for_spec(spec: &Spec) -> Config {
        let wide = spec.head_dim_qk > 128 || spec.head_dim_v > 128;
        Config { warps: 4, m_tiles: 1, block_n: if wide { 32 } else { 64 }, stages: 2 }
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
