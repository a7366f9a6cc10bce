//! Tile configurations of the portable family and its shared-memory layout.

use crate::arch::Arch;
use crate::families::common::backward::WS_ROW_ALIGN;
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

    /// The next smaller configuration when this one spills (`Family::step_down`): two
    /// m tiles per warp become one with 64-key tiles (the sm_80 default, ~135 registers),
    /// then the key tile halves down to 16 (S, P and each K/V fragment shrink; O does
    /// not). `None` at the bottom.
    pub fn smaller(&self) -> Option<Config> {
        if self.m_tiles > 1 {
            return Some(Config { m_tiles: 1, block_n: self.block_n.max(64), ..self.clone() });
        }
        (self.block_n > 16).then(|| Config { block_n: self.block_n / 2, ..self.clone() })
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

/// The backward main kernel's shape. One CTA owns `block_n` keys of one KV head and walks
/// the non-empty query tiles (`block_m` rows) of every query head of the KV group. The
/// warps form `block_n / 16` key groups of `halves` warps each: in the first phase of a
/// tile each warp computes Sᵀ, P, dPᵀ and dSᵀ for its group's 16 keys and `1 / halves`
/// of the tile's queries (`q_sub` rows at a time) and writes Pᵀ and dSᵀ to shared
/// memory; in the second it accumulates its group's dK and dV for `1 / halves` of the
/// columns over all the tile's queries (A operands from shared memory), then a share of
/// dQ. Splitting both ways keeps each thread at `d / halves` accumulator columns and
/// `q_sub` score columns (with d = 128: 32 + 32 + 16 + 16 f32), well under ptxas's
/// register ceiling for every variant. `col_split` CTAs may share a key tile (each
/// recomputes S and dP and owns a part of the columns).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BwdConfig {
    pub warps: u32,
    /// Warps per key group.
    pub halves: u32,
    pub block_m: u32,
    pub col_split: u32,
    /// Q/dO buffers of the cp.async pipeline (2: the next tile loads during this one).
    pub stages: u32,
    /// dQ's f32 adds per instruction: 4 (`red.global.add.v4.f32`, sm_90+) or 1.
    pub dq_vec: u32,
    /// Query rows of one pass of a warp's first phase (divides `block_m / halves`).
    pub q_sub: u32,
    /// `.maxnreg` for the main kernel (0: none).
    pub max_regs: u32,
}

/// The tuning override from `ATTNC_PORTABLE_BWD_TUNE` (dev sweeps:
/// `warps=8,halves=2,block_m=64,q_sub=32,stages=2,dq_vec=1`). It is part of the runtime's
/// cache key, so tuned and default builds never mix.
pub fn bwd_tune_override() -> Option<String> {
    std::env::var("ATTNC_PORTABLE_BWD_TUNE").ok().filter(|s| !s.trim().is_empty())
}

impl BwdConfig {
    /// The configuration for a spec on an arch, measured on the H100
    /// (docs/results/2026-11-23-h100-portable-bwd-configs.md) and held to 0 spills by ptxas
    /// for every example on sm_80, sm_90a and sm_100a:
    ///
    /// | head dims            | warps (key groups x 2) | keys / CTA | regs cap | q_sub | CTAs / key tile |
    /// |----------------------|------------------------|------------|----------|-------|-----------------|
    /// | d_qk + d_v <= 256    | 16                     | 128        | 128      | 16    | 1               |
    /// | wider, or d = 96     | 8                      | 64         | -        | 32    | 1               |
    /// | d_qk + d_v >= 384    | 8                      | 64         | -        | 32    | 2 (column halves) |
    ///
    /// 128 keys per CTA halve dQ's atomics (each CTA adds its partial dQ once per query
    /// tile); 16 warps need the 128-register cap (512 threads), which 16-row sub-tiles
    /// keep spill-free. Vector dQ atomics where they exist (sm_90+); one Q/dO stage where
    /// two do not fit shared memory.
    pub fn for_spec(spec: &Spec, arch: Arch) -> BwdConfig {
        let dq_vec = if arch.has_vector_red() { 4 } else { 1 };
        let wide =
            BwdConfig { warps: 8, halves: 2, block_m: 64, col_split: 1, stages: 2, dq_vec, q_sub: 32, max_regs: 0 };
        let narrow = BwdConfig { warps: 16, q_sub: 16, max_regs: 128, ..wide.clone() };
        // (d = 96 does not split into 16-warp dQ column groups: the 8-warp shape.)
        let mut cfg =
            if spec.head_dim_qk + spec.head_dim_v <= 256 && narrow.check(spec).is_ok() { narrow } else { wide };
        // d_qk + d_v ≥ 384: two CTAs per key tile, each half the columns. One CTA's 64 + 64
        // accumulator registers per thread sat at ptxas's 255 ceiling and spilled for some
        // variants (random-spec sweep); halving them costs a recomputation of S and dP.
        let split = BwdConfig { col_split: 2, ..cfg.clone() };
        if spec.head_dim_qk + spec.head_dim_v >= 384 && split.check(spec).is_ok() {
            cfg = split;
        }
        if let Some(t) = bwd_tune_override() {
            cfg = cfg.tuned(&t);
        }
        if cfg.smem_bytes(spec) > arch.max_smem_per_block() {
            cfg.stages = 1;
        }
        cfg
    }

    /// The 8-warp shape of this configuration (64 keys per CTA, no register cap): the
    /// step down when the 16-warp shape spills.
    pub fn wide(&self) -> BwdConfig {
        BwdConfig { warps: 8, q_sub: 32, max_regs: 0, ..self.clone() }
    }

    /// The configurations to try, in order, when this one spills (`Family::step_down`):
    /// the 8-warp shape, then it with 16-row passes (half the score registers a thread
    /// holds: d 256 with a score mod and packed GQA sat at 255 registers and spilled 20
    /// bytes on sm_90a, random-spec sweep seed 0x1128). Each valid for `spec` and
    /// different from the one before.
    pub fn step_downs(&self, spec: &Spec) -> Vec<BwdConfig> {
        let wide = self.wide();
        let narrow_passes = BwdConfig { q_sub: 16, ..wide.clone() };
        let mut out: Vec<BwdConfig> = Vec::new();
        for c in [wide, narrow_passes] {
            if c != *self && out.last() != Some(&c) && c.check(spec).is_ok() {
                out.push(c);
            }
        }
        out
    }

    /// This configuration with `key=value,...` overrides applied (unknown keys and bad
    /// values are ignored; `check` rejects what the kernel cannot build).
    pub fn tuned(mut self, text: &str) -> BwdConfig {
        for kv in text.split(',') {
            let Some((k, v)) = kv.split_once('=') else { continue };
            let Ok(n) = v.trim().parse::<u32>() else { continue };
            match k.trim() {
                "warps" => self.warps = n,
                "halves" => self.halves = n,
                "block_m" => self.block_m = n,
                "col_split" => self.col_split = n,
                "stages" => self.stages = n,
                "dq_vec" => self.dq_vec = n,
                "q_sub" => self.q_sub = n,
                "max_regs" => self.max_regs = n,
                _ => {}
            }
        }
        self
    }

    pub fn check(&self, spec: &Spec) -> Result<(), String> {
        let bad = |why: &str| Err(format!("unsupported backward config {self:?}: {why}"));
        if !matches!(self.halves, 1 | 2) || self.warps % self.halves != 0 || !(1..=16).contains(&self.warps) {
            return bad("halves 1 or 2 dividing 1-16 warps");
        }
        // A query tile must end inside its workspace row (rows padded to WS_ROW_ALIGN):
        // the tile's lse/D loads and dQ adds cover all its rows.
        if !matches!(self.block_m, 32 | 64)
            || WS_ROW_ALIGN % self.block_m != 0
            || self.warps % self.dq_row_groups() != 0
        {
            return bad(
                "block_m 32 or 64 (dividing the workspace's row padding), its 16-row groups dividing the warps",
            );
        }
        let rows = self.block_m / self.halves;
        if !matches!(self.q_sub, 16 | 32 | 64) || rows % self.q_sub != 0 {
            return bad("q_sub 16, 32 or 64 dividing block_m / halves");
        }
        if !matches!(self.col_split, 1 | 2) || !matches!(self.stages, 1 | 2) || !matches!(self.dq_vec, 1 | 4) {
            return bad("col_split 1-2, stages 1-2, dq_vec 1 or 4");
        }
        for d in [spec.head_dim_qk, spec.head_dim_v] {
            if d % (16 * self.col_split * self.halves) != 0 {
                return Err(format!(
                    "head dim {d} does not split into {} parts of multiples of 16",
                    self.col_split * self.halves
                ));
            }
        }
        if (spec.head_dim_qk / self.col_split) % (16 * self.dq_col_groups()) != 0 {
            return Err(format!(
                "dQ columns {} do not split into {} warp groups of multiples of 16",
                spec.head_dim_qk / self.col_split,
                self.dq_col_groups()
            ));
        }
        Ok(())
    }

    /// Key groups of 16 keys (one per `halves` warps).
    pub fn key_groups(&self) -> u32 {
        self.warps / self.halves
    }
    pub fn block_n(&self) -> u32 {
        16 * self.key_groups()
    }
    /// dQ = dS·K: warps form `dq_row_groups` groups of 16 query rows, each group's warps
    /// share the columns.
    pub fn dq_row_groups(&self) -> u32 {
        self.block_m / 16
    }
    pub fn dq_col_groups(&self) -> u32 {
        self.warps / self.dq_row_groups()
    }
    /// dK (`d = d_qk`) or dV (`d_v`) columns one warp accumulates.
    pub fn acc_cols(&self, d: u32) -> u32 {
        d / self.col_split / self.halves
    }
    pub fn threads(&self) -> u32 {
        32 * self.warps
    }
    /// Bytes per shared-memory row of `d` halves (16 bytes of padding: conflict-free
    /// ldmatrix, as in the forward).
    pub fn row_bytes(&self, d: u32) -> u32 {
        d * 2 + 16
    }
    pub fn k_offset(&self) -> u32 {
        0
    }
    pub fn v_offset(&self, spec: &Spec) -> u32 {
        self.block_n() * self.row_bytes(spec.head_dim_qk)
    }
    /// Q of stage `s` (a run-time stage adds `s · q_stage_bytes`).
    pub fn q_offset(&self, spec: &Spec) -> u32 {
        self.v_offset(spec) + self.block_n() * self.row_bytes(spec.head_dim_v)
    }
    pub fn q_stage_bytes(&self, spec: &Spec) -> u32 {
        self.block_m * self.row_bytes(spec.head_dim_qk)
    }
    pub fn do_offset(&self, spec: &Spec) -> u32 {
        self.q_offset(spec) + self.stages * self.q_stage_bytes(spec)
    }
    pub fn do_stage_bytes(&self, spec: &Spec) -> u32 {
        self.block_m * self.row_bytes(spec.head_dim_v)
    }
    /// lse_log2 and D of a stage's query rows: `2 · block_m` f32.
    pub fn rowvals_offset(&self, spec: &Spec) -> u32 {
        self.do_offset(spec) + self.stages * self.do_stage_bytes(spec)
    }
    pub fn rowvals_stage_bytes(&self) -> u32 {
        2 * self.block_m * 4
    }
    /// dSᵀ in the element type, `block_n` rows of `block_m` (A of dK += dSᵀ·Q, and through
    /// ldmatrix.trans of dQ = dS·K).
    pub fn ds_offset(&self, spec: &Spec) -> u32 {
        self.rowvals_offset(spec) + self.stages * self.rowvals_stage_bytes()
    }
    pub fn ds_row_bytes(&self) -> u32 {
        self.row_bytes(self.block_m)
    }
    /// Pᵀ in the element type, like dSᵀ (A of dV += Pᵀ·dO).
    pub fn p_offset(&self, spec: &Spec) -> u32 {
        self.ds_offset(spec) + self.block_n() * self.ds_row_bytes()
    }
    pub fn smem_bytes(&self, spec: &Spec) -> u32 {
        self.p_offset(spec) + self.block_n() * self.ds_row_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_forward_steps_down_to_smaller_tiles_and_stops() {
        let mut s = Spec::new("t", 128, 8);
        s.mask.causal = Some(attnc_ir::Align::BottomRight);
        let mut cfg = Config::for_spec(&s, Arch::Sm90a);
        assert_eq!((cfg.m_tiles, cfg.block_n), (2, 32));
        let mut ladder = Vec::new();
        while let Some(next) = cfg.smaller() {
            assert_eq!(next.check(&s), Ok(()), "{next:?}");
            ladder.push((next.block_m(), next.block_n));
            cfg = next;
        }
        assert_eq!(ladder, [(64, 64), (64, 32), (64, 16)]);
    }

    #[test]
    fn backward_configs_keep_query_tiles_inside_workspace_rows() {
        for d in [64, 96, 128, 192, 256] {
            let spec = Spec::new("t", d, 8);
            for arch in Arch::ALL {
                let cfg = BwdConfig::for_spec(&spec, arch);
                assert_eq!(cfg.check(&spec), Ok(()), "d {d} {arch}");
                assert_eq!(WS_ROW_ALIGN % cfg.block_m, 0);
                assert!(cfg.smem_bytes(&spec) <= arch.max_smem_per_block(), "d {d} {arch}");
            }
            // A tile of 128 rows would run past a row padded to 64 (lse/D reads, dQ adds).
            let big = BwdConfig::for_spec(&spec, Arch::Sm90a).tuned("block_m=128");
            assert!(big.check(&spec).is_err());
        }
    }
}
