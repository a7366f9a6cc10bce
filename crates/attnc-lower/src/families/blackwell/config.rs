//! The blackwell family's shape and resource model: warp roles and their register
//! budgets, the shared-memory layout, the TMEM column map and the mbarrier list. The
//! kernel builder reads every offset from here, and the tests cross-check the model
//! against what ptxas reports and what the PTX allocates.

use crate::arch::Arch;
use attnc_ir::Spec;

/// Rows of one Q tile (one softmax warpgroup, one TMEM lane per row).
pub const BLOCK_M: u32 = 128;
/// Q tiles per CTA (ping-ponged by the two softmax warpgroups); head dim 256 runs one
/// (`Config::q_tiles`), because its O needs 256 TMEM columns per tile.
pub const Q_TILES: u32 = 2;
/// Keys per K/V tile.
pub const BLOCK_N: u32 = 128;
/// Warps per CTA.
pub const WARPS: u32 = 16;
pub const THREADS: u32 = WARPS * 32;
/// Elements per TMA box row: 64 halves = 128 bytes, the width of the 128-byte swizzle.
pub const TMA_BOX_COLS: u32 = 64;
/// Bytes of one TMA box (64 columns × 128 rows of 16-bit elements).
pub const TMA_BOX_BYTES: u32 = TMA_BOX_COLS * 2 * BLOCK_N;
/// TMEM columns per CTA (all of them: one CTA per SM).
pub const TMEM_COLS: u32 = 512;
/// Named barrier ids of the softmax ping-pong (barrier 0 is the CTA barrier).
pub const BAR_EXP: [u32; 2] = [1, 2];
/// Named barrier of the correction warpgroup's O staging (128 threads).
pub const BAR_EPILOGUE: u32 = 3;

/// Whether paged K/V with `page_size` keys per page loads by TMA: a page holds whole
/// 128-key tiles (one box per tile, inside one page) or a tile holds whole pages of at
/// least `MIN_PAGE_ROWS` keys (one box per page, `128 / page_size` per tile).
pub fn tma_pageable(page_size: u32) -> bool {
    crate::families::common::paged::tma_pageable(page_size, BLOCK_N)
}

/// Whether paged K/V with `page_size` keys per page is gathered row by row (cp.async by
/// warps 14 and 15) because TMA boxes cannot follow its pages.
pub fn gathers(spec: &Spec) -> bool {
    matches!(spec.kv_layout, attnc_ir::KvLayout::Paged { page_size } if !tma_pageable(page_size))
}

/// Whether O leaves by TMA stores (`Config::tma_store_o`): not with varlen, whose boxes
/// would run into the next sequence's rows, nor with split-KV (f32 partial rows).
pub fn stores_o_by_tma(spec: &Spec) -> bool {
    spec.kv_layout != attnc_ir::KvLayout::Varlen && spec.split_kv == attnc_ir::SplitKv::None
}

/// What each warp does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Softmax of Q tile 0 or 1 (warps 0-3, 4-7): one thread per row.
    Softmax(u32),
    /// Rescales O in TMEM, final normalization and the epilogue (warps 8-11).
    Correction,
    /// One thread issues every tcgen05.mma and commit (warp 12).
    Mma,
    /// One thread issues the TMA loads (warp 13).
    Load,
    /// Warps 14-15: no work; they complete the last warpgroup for setmaxnreg.
    Idle,
    /// Warps 14 (K) and 15 (V) with paged K/V that TMA cannot load: cp.async row gather.
    Gather,
}

impl Role {
    pub fn name(self) -> String {
        match self {
            Role::Softmax(i) => format!("softmax {i}"),
            Role::Correction => "correction + epilogue".into(),
            Role::Mma => "MMA issue".into(),
            Role::Load => "TMA load".into(),
            Role::Idle => "idle".into(),
            Role::Gather => "K/V row gather".into(),
        }
    }
}

/// Per-thread register budgets of the three warpgroup kinds, set with setmaxnreg. They
/// must add up to at most the 64K-register file: 2·128·softmax + 128·correction +
/// 128·other ≤ 65536.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegBudget {
    pub softmax: u32,
    pub correction: u32,
    pub other: u32,
}

impl RegBudget {
    /// FlashAttention-4's split (192 / 80 / 48).
    pub const FA4: RegBudget = RegBudget { softmax: 192, correction: 80, other: 48 };
    /// What this kernel uses: the MMA warp walks the mask's tile list itself and needs 56.
    pub const DEFAULT: RegBudget = RegBudget { softmax: 192, correction: 72, other: 56 };
    /// One Q tile (d 256): the idle softmax warpgroup drops to 64, so the working one can
    /// rise to 232 (at 192 its window-mask streaming spilled 24-36 bytes at this size).
    pub const ONE_TILE: RegBudget = RegBudget { softmax: 232, correction: 64, other: 64 };
    /// d_qk = 192 or a row gather: the MMA/load/gather warps get 64, the correction
    /// warpgroup 64.
    pub const WIDE_QK: RegBudget = RegBudget { softmax: 192, correction: 64, other: 64 };
    /// The launch budget ptxas assumes: 65536 / 512 threads.
    pub const LAUNCH: u32 = 65536 / THREADS;

    /// Registers the budgets take with `q_tiles` softmax warpgroups working (an idle
    /// softmax warpgroup drops to `other`).
    pub fn total(&self, q_tiles: u32) -> u32 {
        128 * (q_tiles * self.softmax + (2 - q_tiles) * self.other + self.correction + self.other)
    }
}

/// How the MMA warp orders `O_i += P_i·V` before `S_i = Q_i·Kᵀ` of the next tile, when P
/// lives in S's TMEM columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PvOrder {
    /// Commit the PV MMA to an mbarrier and wait for it before issuing the next QK MMA
    /// into the same columns. Correct by the PTX ISA's rules (tcgen05 MMAs are only
    /// guaranteed to execute in order when they share accumulator and shape). Default.
    Fenced,
    /// Issue back to back, relying on the tensor pipe executing one thread's MMAs in
    /// order, as FlashAttention-4 does. Faster; not guaranteed by the ISA text.
    InOrderPipe,
}

/// The blackwell forward kernel's configuration for one spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub d_qk: u32,
    pub d_v: u32,
    /// K/V ring slots (each holds one K or one V tile).
    pub kv_slots: u32,
    /// Q tiles of 128 rows per work tile: 2 (ping-ponged softmax warpgroups), or 1 when
    /// two O accumulators do not fit in TMEM (d_v = 256); warpgroup 1 then idles.
    pub q_tiles: u32,
    pub regs: RegBudget,
    pub pv_order: PvOrder,
    /// Persistent tile order: longest-processing-time first (causal).
    pub lpt: bool,
    /// Paged K/V gathered by warps 14-15 (cp.async), not loaded by TMA.
    pub gather: bool,
    /// O leaves through a shared-memory staging box and TMA stores (clipped at the
    /// tensor's bounds); off for varlen (a box would run into the next sequence's rows)
    /// and split-KV specs (their partials are f32 rows).
    pub tma_store_o: bool,
}

/// The mbarriers, in shared-memory order (8 bytes each); `KvFull(s)`/`KvEmpty(s)` per slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Bar {
    /// TMA of Q tile i landed (1 arrival + transaction bytes).
    QFull(u32),
    /// Every QK MMA of the work tile completed: Q may be overwritten (MMA commit).
    QEmpty,
    /// S_i is in TMEM (MMA commit).
    SFull(u32),
    /// P_i is in TMEM and O_i corrected: softmax (128) + correction (128) arrivals.
    PFull(u32),
    /// The row rescale factors of S_i are in shared memory (softmax, 128 arrivals).
    Stats(u32),
    /// The last PV MMA of Q tile i completed: O_i is final (MMA commit).
    OFull(u32),
    /// The final row sum and max of tile i are in shared memory (softmax, 128).
    FinalFull(u32),
    /// The correction warpgroup has read them (128).
    FinalEmpty(u32),
    /// PV_i completed (MMA commit; only with `PvOrder::Fenced`).
    PvDone(u32),
    KvFull(u32),
    KvEmpty(u32),
}

/// Byte offsets (from the 1024-aligned dynamic shared-memory base) of every buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SmemLayout {
    pub q: [u32; 2],
    pub q_tile_bytes: u32,
    pub kv: u32,
    pub kv_slot_bytes: u32,
    pub bars: u32,
    pub tmem_slot: u32,
    /// Final (row sum, row max) per Q tile: 128 rows × 8 bytes each.
    pub stats: u32,
    /// seqlen_q, seqlen_k (written once, read volatile per work tile).
    pub scalars: u32,
    /// The current tile's rescale factor per row and Q tile (f32; 128 × 4 bytes each).
    /// TMEM has no free column at d = 128, so the statistics live here.
    pub alpha: u32,
    /// With `tma_store_o`: one 64-column × 128-row O box (16 KB, 128-byte swizzle)
    /// the correction warpgroup fills and a TMA store drains.
    pub o_stage: Option<u32>,
    /// Bytes used from the aligned base.
    pub used: u32,
    /// Dynamic shared memory to request: `used` + 1024 bytes of alignment slack.
    pub request: u32,
}

/// TMEM columns (32-bit) of each buffer; lane = row of the Q tile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TmemMap {
    /// S_i = Q_i·Kᵀ, f32, `BLOCK_N` columns.
    pub s: [u32; 2],
    /// P_i as packed 16-bit pairs (`BLOCK_N / 2` columns) over the first half of S_i:
    /// the softmax writes P's 16 columns of S chunk c (32 columns) at `16·c`, over
    /// columns it has already read.
    pub p: [u32; 2],
    /// O_i, f32, `d_v` columns.
    pub o: [u32; 2],
    /// Columns the map uses.
    pub used: u32,
    /// Columns allocated (a power of two ≥ `used`).
    pub alloc: u32,
}

impl Config {
    /// The configuration for `spec`, or why the family cannot run it.
    pub fn for_spec(spec: &Spec) -> Result<Config, String> {
        let (d_qk, d_v) = (spec.head_dim_qk, spec.head_dim_v);
        if d_qk % 16 != 0 || d_v % 16 != 0 || d_qk > 256 || d_v > 256 {
            return Err(format!("head_dim {d_qk}/{d_v}: needs multiples of 16 up to 256 (the MMA's K and N steps)"));
        }
        // Two Q tiles when both O accumulators fit beside both S tiles in TMEM
        // (2·(128 + d_v) ≤ 512, i.e. d_v ≤ 128); otherwise one Q tile per CTA, as FA4's
        // hdim-256 kernel: S 128 + O d_v columns.
        let q_tiles = if Q_TILES * (BLOCK_N + d_v) <= TMEM_COLS { Q_TILES } else { 1 };
        // K/V ring depth: the most 128-key slots (a power of two, at most 8) that fit
        // beside the Q tiles in shared memory. A head dim that is not a multiple of 64
        // (96) takes whole 64-column boxes; TMA fills the columns past d with zeros.
        // 192/128 (DeepSeek's MLA shape) fits two: one K and one V in flight.
        let tma_store_o = stores_o_by_tma(spec);
        let mut kv_slots = 8;
        while kv_slots > 2 {
            let trial = Config {
                d_qk,
                d_v,
                kv_slots,
                q_tiles,
                regs: RegBudget::DEFAULT,
                pv_order: PvOrder::Fenced,
                lpt: false,
                gather: false,
                tma_store_o,
            };
            if trial.smem().request <= Arch::Sm100a.max_smem_per_block() {
                break;
            }
            kv_slots /= 2;
        }
        // At 192/128 the MMA thread's 12 QK steps per tile spill 32 bytes at 56
        // registers; the correction warpgroup (d_v = 128 as usual) gives it 8.
        // The gather warps (row offsets, shuffles, cp.async addresses) share the MMA/load
        // budget and need 64 as well.
        let regs = match (q_tiles, d_qk > 128 || gathers(spec)) {
            (1, _) => RegBudget::ONE_TILE,
            (_, true) => RegBudget::WIDE_QK,
            _ => RegBudget::DEFAULT,
        };
        let gather = gathers(spec);
        let cfg = Config {
            d_qk,
            d_v,
            kv_slots,
            q_tiles,
            regs,
            pv_order: PvOrder::Fenced,
            lpt: spec.mask.causal.is_some(),
            gather,
            tma_store_o,
        };
        cfg.check()?;
        Ok(cfg)
    }

    /// This configuration with one Q tile per CTA and the one-tile register budget: the
    /// step down when the two-tile softmax spills.
    pub fn one_q_tile(&self) -> Config {
        Config { q_tiles: 1, regs: RegBudget::ONE_TILE, ..self.clone() }
    }

    /// The resource limits: shared memory, TMEM columns, the register file.
    pub fn check(&self) -> Result<(), String> {
        let smem = self.smem().request;
        let max = Arch::Sm100a.max_smem_per_block();
        if smem > max {
            return Err(format!("needs {smem} bytes of shared memory, sm_100a allows {max}"));
        }
        let t = self.tmem();
        if t.alloc > TMEM_COLS {
            return Err(format!("needs {} TMEM columns, a CTA has {TMEM_COLS}", t.used));
        }
        let total = self.regs.total(self.q_tiles);
        if total > 65536 {
            return Err(format!("register budgets need {total} registers, the SM has 65536"));
        }
        if !self.kv_slots.is_power_of_two() || self.kv_slots < 2 {
            return Err("kv_slots must be a power of two ≥ 2".into());
        }
        Ok(())
    }

    /// 64-column TMA boxes (128 bytes of each row) that hold `d` columns.
    pub fn boxes(d: u32) -> u32 {
        d.div_ceil(TMA_BOX_COLS)
    }

    /// Query rows per work tile.
    pub fn tile_rows(&self) -> u32 {
        self.q_tiles * BLOCK_M
    }

    pub fn mbarriers(&self) -> Vec<Bar> {
        let mut v: Vec<Bar> = (0..self.q_tiles).map(Bar::QFull).collect();
        v.push(Bar::QEmpty);
        for i in 0..self.q_tiles {
            v.extend([
                Bar::SFull(i),
                Bar::PFull(i),
                Bar::Stats(i),
                Bar::OFull(i),
                Bar::FinalFull(i),
                Bar::FinalEmpty(i),
                Bar::PvDone(i),
            ]);
        }
        v.extend((0..self.kv_slots).map(Bar::KvFull));
        v.extend((0..self.kv_slots).map(Bar::KvEmpty));
        v
    }

    /// Index of `b` in [`Config::mbarriers`].
    pub fn bar_index(&self, b: Bar) -> u32 {
        self.mbarriers().iter().position(|x| *x == b).unwrap_or(0) as u32
    }

    /// Arrival count each mbarrier is initialized with.
    pub fn bar_count(&self, b: Bar) -> u32 {
        match b {
            Bar::PFull(_) => 256,
            // A gathered slot is full when each lane of its gather warp has arrived
            // (`cp.async.mbarrier.arrive.noinc`); a TMA slot after one arrival + bytes.
            Bar::KvFull(_) if self.gather => 32,
            Bar::Stats(_) | Bar::FinalFull(_) | Bar::FinalEmpty(_) => 128,
            _ => 1,
        }
    }

    pub fn smem(&self) -> SmemLayout {
        let q_tile_bytes = Self::boxes(self.d_qk) * TMA_BOX_BYTES;
        let kv_slot_bytes = Self::boxes(self.d_qk.max(self.d_v)) * TMA_BOX_BYTES;
        let kv = self.q_tiles * q_tile_bytes;
        let bars = kv + self.kv_slots * kv_slot_bytes;
        let nbars = self.mbarriers().len() as u32;
        let tmem_slot = bars + 8 * nbars;
        let scalars = tmem_slot + 8;
        let stats = (scalars + 8).next_multiple_of(16);
        let alpha = stats + self.q_tiles * BLOCK_M * 8;
        let mut used = alpha + self.q_tiles * BLOCK_M * 4;
        let o_stage = if self.tma_store_o {
            let at = used.next_multiple_of(1024);
            used = at + TMA_BOX_BYTES;
            Some(at)
        } else {
            None
        };
        SmemLayout {
            q: [0, q_tile_bytes],
            q_tile_bytes,
            kv,
            kv_slot_bytes,
            bars,
            tmem_slot,
            scalars,
            stats,
            alpha,
            o_stage,
            used,
            request: used + 1024,
        }
    }

    pub fn tmem(&self) -> TmemMap {
        // Entry 1 of each pair is tile 1's (unused with one Q tile: O0 follows S0).
        let s = [0, BLOCK_N];
        let n = self.q_tiles;
        let o = [n * BLOCK_N, n * BLOCK_N + self.d_v];
        let used = n * (BLOCK_N + self.d_v);
        TmemMap { s, p: s, o, used, alloc: used.next_power_of_two().max(32) }
    }

    /// The role of warp `w` (0..16).
    pub fn role_of_warp(&self, w: u32) -> Option<Role> {
        self.roles().into_iter().find(|(_, r, _)| r.contains(&w)).map(|(role, _, _)| role)
    }

    /// The warps of each role, with their register budget.
    pub fn roles(&self) -> Vec<(Role, std::ops::Range<u32>, u32)> {
        let second =
            if self.q_tiles == 2 { (Role::Softmax(1), self.regs.softmax) } else { (Role::Idle, self.regs.other) };
        vec![
            (Role::Softmax(0), 0..4, self.regs.softmax),
            (second.0, 4..8, second.1),
            (Role::Correction, 8..12, self.regs.correction),
            (Role::Mma, 12..13, self.regs.other),
            (Role::Load, 13..14, self.regs.other),
            (if self.gather { Role::Gather } else { Role::Idle }, 14..16, self.regs.other),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resources_fit_for_every_supported_head_dim() {
        for &(d_qk, d) in attnc_ir::SUPPORTED_HEAD_DIMS {
            let mut spec = Spec::new("x", d_qk, 8);
            spec.head_dim_v = d;
            let cfg = Config::for_spec(&spec).expect("supported");
            let t = cfg.tmem();
            assert!(t.used <= TMEM_COLS && t.alloc == 512, "{t:?}");
            // P_i inside S_i, O_i disjoint from both S tiles.
            assert_eq!(cfg.q_tiles, if d > 128 { 1 } else { 2 });
            for i in 0..cfg.q_tiles as usize {
                assert!(t.p[i] >= t.s[i] && t.p[i] + BLOCK_N / 2 <= t.s[i] + BLOCK_N);
                // P of S chunk c (32 columns) lands on columns at or below chunk c.
                for c in 0..BLOCK_N / 32 {
                    assert!(t.p[i] + 16 * c + 16 <= t.s[i] + 32 * c + 32);
                }
                assert!(t.o[i] >= cfg.q_tiles * BLOCK_N && t.o[i] + d <= TMEM_COLS);
            }
            let s = cfg.smem();
            assert!(s.request <= Arch::Sm100a.max_smem_per_block(), "{s:?}");
            // Every TMA destination and MMA operand is 1024-byte aligned (SW128 atoms).
            for off in [s.q[0], s.q[1], s.kv, s.kv_slot_bytes] {
                assert_eq!(off % 1024, 0);
            }
            let total = cfg.regs.total(cfg.q_tiles);
            assert!(total <= 65536, "{total}");
            if cfg.q_tiles == 2 {
                assert_eq!(total, 65536);
            }
        }
    }

    #[test]
    fn unsupported_head_dims_say_why() {
        assert!(Config::for_spec(&Spec::new("x", 72, 8)).unwrap_err().contains("72/72"));
        assert!(Config::for_spec(&Spec::new("x", 320, 8)).is_err());
    }

    #[test]
    fn roles_cover_sixteen_warps() {
        let mut gather = Spec::new("g", 64, 8);
        gather.kv_layout = attnc_ir::KvLayout::Paged { page_size: 1 };
        for spec in [Spec::new("x", 128, 8), Spec::new("one_tile", 256, 8), gather] {
            let cfg = Config::for_spec(&spec).expect("supported");
            let warps: u32 = cfg.roles().iter().map(|(_, r, _)| r.len() as u32).sum();
            assert_eq!(warps, WARPS);
            for w in 0..WARPS {
                assert!(cfg.role_of_warp(w).is_some(), "{}: warp {w}", spec.name);
            }
            // The fixed warps: softmax 0 on 0-3, correction on 8-11, MMA 12, load 13.
            assert_eq!(cfg.role_of_warp(0), Some(Role::Softmax(0)));
            assert_eq!(cfg.role_of_warp(8), Some(Role::Correction));
            assert_eq!(cfg.role_of_warp(12), Some(Role::Mma));
            assert_eq!(cfg.role_of_warp(13), Some(Role::Load));
            assert_eq!(cfg.role_of_warp(4) == Some(Role::Softmax(1)), cfg.q_tiles == 2, "{}", spec.name);
            assert_eq!(cfg.role_of_warp(14) == Some(Role::Gather), cfg.gather, "{}", spec.name);
        }
    }
}
