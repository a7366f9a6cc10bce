//! The blackwell family's cycle model and layout report: what one tile costs on each
//! unit (FlashAttention-4 paper, Table 1: MMA, shared memory and exponential cycles per
//! 128 × 128 tile), the TMEM column map, the warp roles with their register budgets, the
//! shared-memory layout and the mbarriers. [`report`] returns a printable struct (the
//! CLI prints it; the snapshot tests pin it per example).
//!
//! Per-SM throughputs assumed (B200, per clock): 8192 dense 16-bit MMA FLOPs, 16 MUFU
//! exponentials, 128 FP32/ALU instructions, 128 bytes of shared memory.

use super::config::{Bar, Config, PvOrder, Role, BLOCK_M, BLOCK_N, THREADS};
use super::forward::emulated_per_row;
use attnc_ir::Spec;
use std::fmt;

/// Dense bf16/fp16 tensor-core FLOPs per clock per SM.
pub const MMA_FLOPS_PER_CLK: f64 = 8192.0;
/// MUFU.EX2 per clock per SM.
pub const MUFU_PER_CLK: f64 = 16.0;
/// FP32/ALU instructions per clock per SM.
pub const FMA_PER_CLK: f64 = 128.0;
/// Shared-memory bytes per clock per SM.
pub const SMEM_BYTES_PER_CLK: f64 = 128.0;
/// Instructions of one emulated exp2 on the FMA/ALU pipes (max, add.rm floor, 2 sub,
/// 3 FFMA, shift, add, compare, select; `variant::softmax::exp2_emulated`).
pub const EMULATED_EXP2_INSTRUCTIONS: f64 = 11.0;

/// Cycles one Q tile (128 rows) spends per key tile (128 keys) on each unit.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct TileCycles {
    /// S = Q·Kᵀ and O += P·V on the tensor core: 2 · 2·M·N·d / 8192.
    pub mma: f64,
    /// Shared-memory reads of the MMAs: Q and K for S, V for PV (P comes from TMEM).
    pub smem: f64,
    /// MUFU.EX2 for the (1 − f) of each row not emulated.
    pub exp_mufu: f64,
    /// The emulated fraction f on the FMA pipe.
    pub exp_fma: f64,
    /// The unit(s) that bound the tile (ties joined with ` = `).
    pub bound: String,
}

/// One row of the TMEM column map.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct TmemRow {
    pub name: String,
    pub cols: (u32, u32),
    pub what: String,
}

/// One row of the warp-role table.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct RoleRow {
    pub warps: (u32, u32),
    pub role: String,
    pub regs: u32,
    pub does: String,
}

/// The blackwell schedule of one spec.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Report {
    pub name: String,
    pub d_qk: u32,
    pub d_v: u32,
    pub threads: u32,
    /// Q tiles of 128 rows per work tile (1 at head dim 256).
    pub q_tiles: u32,
    pub tile_order: String,
    /// How K/V tiles arrive (contiguous, varlen or paged boxes).
    pub kv_loads: String,
    /// Split-KV, when the spec has it.
    pub split_kv: Option<String>,
    /// What the family changed about the spec's layout (pack_gqa it cannot pack).
    pub layout_note: Option<String>,
    pub kv_slots: u32,
    pub pv_order: String,
    pub exp2_emulated_per_row: u32,
    pub rescale_threshold: f64,
    pub cycles: TileCycles,
    pub tmem: Vec<TmemRow>,
    pub tmem_alloc: u32,
    pub roles: Vec<RoleRow>,
    pub smem: Vec<(String, u32, u32)>,
    pub smem_request: u32,
    pub mbarriers: Vec<(String, u32)>,
}

/// Cycles per (128-row Q tile, 128-key tile) for head dims `d_qk`/`d_v` with `emulated`
/// of each row's 128 exponentials on the FMA pipe.
pub fn tile_cycles(d_qk: u32, d_v: u32, emulated: u32) -> TileCycles {
    let (m, n) = (BLOCK_M as f64, BLOCK_N as f64);
    let mma = 2.0 * m * n * (d_qk + d_v) as f64 / MMA_FLOPS_PER_CLK;
    let smem_bytes = 2.0 * (m * d_qk as f64 + n * d_qk as f64 + n * d_v as f64);
    let smem = smem_bytes / SMEM_BYTES_PER_CLK;
    let f = emulated as f64 / n;
    let exp_mufu = (1.0 - f) * m * n / MUFU_PER_CLK;
    let exp_fma = f * m * n * EMULATED_EXP2_INSTRUCTIONS / FMA_PER_CLK;
    let units = [("MMA", mma), ("shared memory", smem), ("exp MUFU", exp_mufu), ("exp FMA", exp_fma)];
    let top = units.iter().map(|u| u.1).fold(0.0, f64::max);
    let bound = units.iter().filter(|u| u.1 >= 0.99 * top).map(|u| u.0).collect::<Vec<_>>().join(" = ");
    TileCycles { mma, smem, exp_mufu, exp_fma, bound }
}

/// The report of `spec`, or why the family cannot run it.
pub fn report(spec: &Spec) -> Result<Report, String> {
    if let Some(r) = super::kernel_unsupported_reason(spec, crate::arch::Arch::Sm100a) {
        return Err(r);
    }
    let (eff, layout_note) = super::effective_spec(spec);
    let spec = eff.as_ref();
    let cfg = Config::for_spec(spec)?;
    let t = cfg.tmem();
    let s = cfg.smem();
    let mut tmem = Vec::new();
    let tiles = cfg.q_tiles as usize;
    for i in 0..tiles {
        tmem.push(TmemRow {
            name: format!("S{i} / P{i}"),
            cols: (t.s[i], t.s[i] + BLOCK_N),
            what: format!(
                "S{i} = Q{i}K^T (f32); P{i} (16-bit pairs) over cols {}..{} once S{i} is read",
                t.p[i],
                t.p[i] + BLOCK_N / 2
            ),
        });
    }
    for i in 0..tiles {
        tmem.push(TmemRow {
            name: format!("O{i}"),
            cols: (t.o[i], t.o[i] + cfg.d_v),
            what: format!("O{i} accumulator (f32)"),
        });
    }
    if t.used < t.alloc {
        tmem.push(TmemRow { name: "free".into(), cols: (t.used, t.alloc), what: "unused".into() });
    }
    let does = |r: Role| -> &'static str {
        match r {
            Role::Softmax(_) => "tcgen05.ld S, mask/score mod, row max, exp2 (MUFU + emulation), tcgen05.st P",
            Role::Correction => "O *= alpha in TMEM when a warp moved its base; O /= l, store O, LSE",
            Role::Mma => "one thread: tcgen05.mma (S = QK^T ss, O += PV ts), tcgen05.commit",
            Role::Load => "one thread: TMA Q once per work tile, K/V through the ring",
            Role::Idle => "setmaxnreg only",
            Role::Gather => "warp 14 K, warp 15 V: block-table row offsets, cp.async 16 B per lane into the swizzled slot, rows past seqlen_k zero-filled",
        }
    };
    let roles = cfg
        .roles()
        .into_iter()
        .map(|(r, w, regs)| RoleRow { warps: (w.start, w.end - 1), role: r.name(), regs, does: does(r).into() })
        .collect();
    let mut smem: Vec<(String, u32, u32)> = (0..tiles).map(|i| (format!("Q{i}"), s.q[i], s.q_tile_bytes)).collect();
    smem.extend([
        (format!("K/V ring ({} slots)", cfg.kv_slots), s.kv, cfg.kv_slots * s.kv_slot_bytes),
        ("mbarriers".to_string(), s.bars, s.tmem_slot - s.bars),
        ("TMEM address".to_string(), s.tmem_slot, 4),
        ("seqlens".to_string(), s.scalars, 8),
        ("final (l, m)".to_string(), s.stats, cfg.q_tiles * BLOCK_M * 8),
        ("alpha".to_string(), s.alpha, cfg.q_tiles * BLOCK_M * 4),
    ]);
    if let Some(o) = s.o_stage {
        smem.push(("O staging box (TMA store)".to_string(), o, super::config::TMA_BOX_BYTES));
    }
    let mbarriers = cfg
        .mbarriers()
        .into_iter()
        .filter(|b| !matches!(b, Bar::KvFull(x) | Bar::KvEmpty(x) if *x > 0))
        .map(|b| {
            let name = match b {
                Bar::KvFull(_) => format!("KvFull[0..{}]", cfg.kv_slots),
                Bar::KvEmpty(_) => format!("KvEmpty[0..{}]", cfg.kv_slots),
                other => format!("{other:?}"),
            };
            (name, cfg.bar_count(b))
        })
        .collect();
    let e = emulated_per_row(spec);
    Ok(Report {
        name: spec.name.clone(),
        d_qk: cfg.d_qk,
        d_v: cfg.d_v,
        threads: THREADS,
        q_tiles: cfg.q_tiles,
        tile_order: if cfg.lpt { "persistent, LPT (causal)".into() } else { "persistent, plain".into() },
        kv_loads: match spec.kv_layout {
            attnc_ir::KvLayout::Contiguous => "TMA, one 128-row box per 64 columns; rows past seqlen_k read as zeros".into(),
            attnc_ir::KvLayout::Varlen => {
                "TMA over the packed rows; V rows past the sequence zeroed in shared memory before P.V".into()
            }
            attnc_ir::KvLayout::Paged { page_size } if page_size >= BLOCK_N => format!(
                "paged ({page_size}-key pages): one TMA box per tile inside its page (1 block-table read); V rows past seqlen_k zeroed before P.V"
            ),
            attnc_ir::KvLayout::Paged { page_size } if !super::config::tma_pageable(page_size) => format!(
                "paged ({page_size}-key pages): cp.async row gather by warps 14 (K) and 15 (V), one block-table read per row; rows past seqlen_k zero-filled"
            ),
            attnc_ir::KvLayout::Paged { page_size } => format!(
                "paged ({page_size}-key pages): {} TMA boxes per tile, one per page ({} block-table reads); V rows past seqlen_k zeroed before P.V",
                BLOCK_N / page_size,
                BLOCK_N / page_size
            ),
        },
        layout_note,
        split_kv: match spec.split_kv {
            attnc_ir::SplitKv::None => None,
            attnc_ir::SplitKv::Fixed(n) => Some(format!("{n} splits")),
            attnc_ir::SplitKv::Auto => Some("split count chosen at launch".into()),
        }
        .map(|s| format!("{s}: work tiles x splits, each an equal share of the live key tiles; f32 partials + LSE, then the portable combine kernel")),
        kv_slots: cfg.kv_slots,
        pv_order: match cfg.pv_order {
            PvOrder::Fenced => "fenced (PV completes before the next S overwrites P)".into(),
            PvOrder::InOrderPipe => "in-order tensor pipe (FA4)".into(),
        },
        exp2_emulated_per_row: e,
        rescale_threshold: spec.softmax.rescale_threshold,
        cycles: tile_cycles(cfg.d_qk, cfg.d_v, e),
        tmem,
        tmem_alloc: t.alloc,
        roles,
        smem,
        smem_request: s.request,
        mbarriers,
    })
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "blackwell schedule: {} (d {}/{}, {} threads)", self.name, self.d_qk, self.d_v, self.threads)?;
        writeln!(
            f,
            "  tiles: {} x {BLOCK_M} query rows per CTA, {BLOCK_N} keys per K/V tile, {}",
            self.q_tiles, self.tile_order
        )?;
        writeln!(f, "  K/V ring: {} slots; PV/S order: {}", self.kv_slots, self.pv_order)?;
        writeln!(f, "  K/V loads: {}", self.kv_loads)?;
        if let Some(s) = &self.split_kv {
            writeln!(f, "  split-KV: {s}")?;
        }
        if let Some(n) = &self.layout_note {
            writeln!(f, "  layout: {n}")?;
        }
        writeln!(
            f,
            "  softmax: {} of {BLOCK_N} exp2 per row emulated; rescale threshold {}",
            self.exp2_emulated_per_row, self.rescale_threshold
        )?;
        let c = &self.cycles;
        writeln!(f, "cycles per 128x128 tile (one Q tile, B200 per-SM rates):")?;
        writeln!(
            f,
            "  MMA {:>7.1}   shared memory {:>7.1}   exp MUFU {:>7.1}   exp FMA {:>7.1}   bound: {}",
            c.mma, c.smem, c.exp_mufu, c.exp_fma, c.bound
        )?;
        writeln!(f, "TMEM columns ({} allocated):", self.tmem_alloc)?;
        for r in &self.tmem {
            writeln!(f, "  {:>3}..{:<3} {:<8} {}", r.cols.0, r.cols.1, r.name, r.what)?;
        }
        writeln!(f, "warp roles:")?;
        for r in &self.roles {
            writeln!(f, "  warps {:>2}-{:<2} {:<22} {:>3} regs  {}", r.warps.0, r.warps.1, r.role, r.regs, r.does)?;
        }
        writeln!(f, "shared memory ({} bytes requested, 1024-byte aligned base):", self.smem_request)?;
        for (n, off, bytes) in &self.smem {
            writeln!(f, "  {off:>6} +{bytes:<6} {n}")?;
        }
        writeln!(f, "mbarriers (arrival counts):")?;
        let list: Vec<String> = self.mbarriers.iter().map(|(n, c)| format!("{n}:{c}")).collect();
        writeln!(f, "  {}", list.join(" "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// FA4 Table 1 (head dim 128, 128 × 128 tile): MMA 1024, shared memory 768,
    /// exponential 1024 cycles.
    #[test]
    fn table1_numbers() {
        let c = tile_cycles(128, 128, 0);
        assert_eq!((c.mma, c.smem, c.exp_mufu, c.exp_fma), (1024.0, 768.0, 1024.0, 0.0));
        // Emulating 15% moves ~154 cycles off MUFU for ~211 FMA-pipe cycles.
        let e = tile_cycles(128, 128, 19);
        assert!(e.exp_mufu < 1024.0 && e.exp_fma > 0.0);
        assert_eq!(tile_cycles(64, 64, 0).mma, 512.0);
    }
}
