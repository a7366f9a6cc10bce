//! The blackwell backward's resource plan: FlashAttention-4's sm_100 backward design in
//! this family's terms, sized before code is generated, and what `attnc report --pass bwd`
//! prints. `backward.rs` builds exactly this plan ([`kernel_plan`]): one CTA per key tile
//! at head dims 64 and 96, a CTA pair (`cta_group::2`) at head dim 128.
//!
//! One CTA owns a tile of 128 keys of one KV head and walks the 128-query tiles of its
//! query heads. The scores are computed transposed, Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ, so the keys
//! sit on TMEM lanes and Pᵀ and dSᵀ are already the TMEM A operands of dV += Pᵀ·dO and
//! dK += dSᵀ·Q (tcgen05 takes A from TMEM). Only dQ = dS·K needs dS in shared memory; its
//! accumulator lives in TMEM, and four reduce warps drain it into the f32 `dq_accum` (a
//! convert kernel scales it, as for the other families). dK and dV stay in TMEM for the
//! whole walk.
//!
//! TMEM holds 512 columns of 128 lanes, and the five accumulators only fit by overlays
//! whose safety is an ordering of the single MMA thread's issues (see [`BwdTmem`]). At
//! head dim 128 the map is full, and the pair mode halves each CTA's B-operand reads: the
//! pair's MMAs take M = 256 keys (each CTA's 128 on its own TMEM lanes) and read half of
//! every B operand from each CTA's shared memory; dQ = dS·K takes M = 128 queries, 64 per
//! CTA, over the pair's 256 keys, so each CTA adds half of dQ's rows (half the reds).

use super::config::{BLOCK_N, TMEM_COLS};
use super::report::{MMA_FLOPS_PER_CLK, MUFU_PER_CLK, SMEM_BYTES_PER_CLK};
use crate::arch::Arch;
use attnc_ir::Spec;
use std::fmt;

/// Queries per tile (the columns of Sᵀ).
pub const BWD_BLOCK_M: u32 = 128;
/// Keys per CTA (TMEM lanes); a pair covers twice as many.
pub const BWD_BLOCK_N: u32 = BLOCK_N;

/// One CTA per key tile, or a CTA pair (`cta_group::2`, a cluster of two along the grid's
/// y) over two adjacent key tiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum CtaMode {
    One,
    Two,
}

impl CtaMode {
    /// CTAs sharing one walk (and its MMAs).
    pub fn ctas(self) -> u32 {
        match self {
            CtaMode::One => 1,
            CtaMode::Two => 2,
        }
    }
    /// Keys of one walk: the grid's key tile (`KernelInfo::block_n`).
    pub fn walk_keys(self) -> u32 {
        BWD_BLOCK_N * self.ctas()
    }
}

/// TMEM columns of the backward (f32 columns, 128 lanes = the CTA's keys; dQ's lanes are
/// queries). Overlays and the MMA-issue order that makes each safe:
/// - `p` over `s`: each compute warpgroup reads its 64 query columns of Sᵀ and writes their
///   Pᵀ (16-bit pairs, 32 columns) over the first half of those same columns
///   ([`BwdTmem::packed_col`]), so neither warpgroup writes a column the other still
///   reads; the next Sᵀ is issued only after dV has read Pᵀ.
/// - `ds` over `dp`: the same placement, written after dPᵀ is read; dK reads it.
/// - `dq` over `dp`: dQ is issued after dK has consumed dSᵀ, and the next dPᵀ waits until
///   the reduce warps drained dQ. In pair mode each CTA holds 64 of the tile's query rows
///   over all 128 lanes and d/2 columns ([`dq_pair_place`]), inside `dp`'s columns.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct BwdTmem {
    pub s: (u32, u32),
    pub p: (u32, u32),
    pub dv: (u32, u32),
    pub dp: (u32, u32),
    pub ds: (u32, u32),
    pub dq: (u32, u32),
    pub dk: (u32, u32),
    /// Columns the map reaches.
    pub used: u32,
    /// Columns allocated (a power of two ≥ `used`).
    pub alloc: u32,
}

impl BwdTmem {
    /// The TMEM column (from the start of `s` or `dp`) of K step `kk` of a packed 16-bit
    /// operand (Pᵀ or dSᵀ; 16 queries = 8 columns): queries `64h..64h+63` of warpgroup `h`
    /// sit in the first 32 of its own 64 columns.
    pub fn packed_col(kk: u32) -> u32 {
        let queries = kk * 16;
        (queries / 64) * 64 + (queries % 64) / 2
    }
}

/// Byte offsets and sizes of the backward's shared memory (per CTA).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct BwdSmem {
    /// `(name, bytes)` in layout order: operand tiles 1024-byte aligned (128-byte swizzle
    /// atoms), row vectors and barriers 16-byte aligned.
    pub buffers: Vec<(&'static str, u32)>,
    pub used: u32,
    /// `used` + 1024 bytes of alignment slack.
    pub request: u32,
}

/// The warp roles (16 warps) with their `setmaxnreg` budgets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum BwdRole {
    /// Warps 0-3: drain dQ from TMEM into vector reds of `dq_accum`.
    DqReduce,
    /// Warps 4-11: Pᵀ, dSᵀ (score-mod derivative, mask), the dK/dV epilogue.
    Compute,
    /// Warp 12: the single thread that issues every tcgen05.mma / commit (in pair mode
    /// the first CTA's, for both).
    Mma,
    /// Warp 13: TMA loads of K, V once, Q, dO, LSE and D per query tile.
    Load,
    /// Warps 14-15 (complete the warpgroup; setmaxnreg is per warpgroup).
    Idle,
}

/// Cycles of one (128-key, 128-query) tile on each unit of an SM.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct BwdCycles {
    /// Sᵀ, dPᵀ, dV, dK and dQ: 2·128·128·(3·d_qk + 2·d_v) FLOPs at 8192 per clock.
    pub mma: f64,
    /// The MMAs' shared-memory operand reads and the dS store. dQ goes from registers to
    /// L2 as vector reds (64 KiB per tile at d = 128 with one CTA, half per CTA of a
    /// pair), which the model does not count.
    pub smem: f64,
    /// 128·128 exponentials on MUFU (none emulated).
    pub exp: f64,
    pub bound: String,
    /// 2·128·128·(3·d_qk + 2·d_v) / the bound's cycles.
    pub flops_per_clk: f64,
}

/// The backward's plan for one spec: what `backward.rs` builds.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct BwdPlan {
    pub d_qk: u32,
    pub d_v: u32,
    pub mode: CtaMode,
    pub tmem: BwdTmem,
    pub smem: BwdSmem,
    pub roles: Vec<(BwdRole, (u32, u32), u32)>,
    pub mbarriers: Vec<(&'static str, u32)>,
    pub cycles: BwdCycles,
}

/// 64-column TMA boxes: a head dim's columns as loaded (96 takes two boxes).
fn padded(d: u32) -> u32 {
    d.div_ceil(64) * 64
}

/// The head dims the kernel holds, and its mode for them.
pub fn cta_mode(spec: &Spec) -> Result<CtaMode, String> {
    let (d_qk, d_v) = (spec.head_dim_qk, spec.head_dim_v);
    // 1-CTA: S 128 + dV d_v + dP 128 + dK d_qk columns, dQ (d_qk) over dP.
    match (d_qk, d_v) {
        (64, 64) | (96, 96) => Ok(CtaMode::One),
        (128, 128) => Ok(CtaMode::Two),
        _ => Err(format!(
            "head dims {d_qk}/{d_v}: S, dP, dV and dK need 256 + {} TMEM columns and dQ {d_qk} more; \
             the map holds d_qk = d_v <= 128 (192/128, 192 and 256 need FA4's split dQ / dK-dV kernels, \
             not planned)",
            d_qk + d_v
        )),
    }
}

/// The plan of the kernel `backward.rs` builds for `spec`, or why it cannot hold it.
pub fn kernel_plan(spec: &Spec) -> Result<BwdPlan, String> {
    kernel_plan_in(spec, cta_mode(spec)?)
}

/// The plan in `mode`: the pair's own, or one CTA per key tile at any head dim the map
/// holds (head dim 128 too: the full 1-CTA map, dQ over dPᵀ) — the step down when the
/// pair's kernel spills.
pub fn kernel_plan_in(spec: &Spec, mode: CtaMode) -> Result<BwdPlan, String> {
    if cta_mode(spec)? == CtaMode::One && mode == CtaMode::Two {
        return Err(format!("head dims {}/{}: the CTA pair is built at 128 only", spec.head_dim_qk, spec.head_dim_v));
    }
    let (d_qk, d_v) = (spec.head_dim_qk, spec.head_dim_v);
    let roles = vec![
        (BwdRole::DqReduce, (0, 4), KERNEL_REGS.reduce),
        (BwdRole::Compute, (4, 12), KERNEL_REGS.compute),
        (BwdRole::Mma, (12, 13), KERNEL_REGS.other),
        (BwdRole::Load, (13, 14), KERNEL_REGS.other),
        (BwdRole::Idle, (14, 16), KERNEL_REGS.other),
    ];
    let mbarriers = BwdBar::all(mode).into_iter().map(|b| (b.what(mode), b.count(mode))).collect();
    Ok(BwdPlan {
        d_qk,
        d_v,
        mode,
        tmem: tmem_map(d_qk, d_v, mode),
        smem: smem_layout(&smem_map(d_qk, d_v, mode)),
        roles,
        mbarriers,
        cycles: tile_cycles(d_qk, d_v, mode),
    })
}

/// The `setmaxnreg` budgets of the built kernel's warpgroups: reduce (warps 0-3), compute
/// (4-11, two warpgroups), and the MMA/load/idle warpgroup (12-15).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct BwdRegs {
    pub reduce: u32,
    pub compute: u32,
    pub other: u32,
}

/// 128·(96 + 2·176 + 64) = 65,536: the whole register file. The compute warps hold a
/// tile's 64 packed Pᵀ values, a 32-column chunk of Sᵀ or dPᵀ and (score mods) 64 slopes;
/// the reduce warps a 32-column chunk of dQ.
pub const KERNEL_REGS: BwdRegs = BwdRegs { reduce: 96, compute: 176, other: 64 };

/// The built kernel's mbarriers, in shared-memory order (8 bytes each). In pair mode
/// the "full" barriers of the MMA's operands and the hand-offs to the MMA thread gather
/// both CTAs' arrivals on the first CTA's copy, and every commit is multicast to both
/// CTAs' copies of its barrier.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BwdBar {
    /// K and V of the key tile landed (TMA transactions; pair mode: and the Kᵀ halves).
    KvFull,
    /// The key tile's last MMA read K and V (commit).
    KvEmpty,
    /// Q stage `s` landed (1-CTA: with its lse_log2 and D rows; pair mode: the Q columns
    /// this CTA gives dK's B operand).
    QFull(u32),
    /// Q stage `s` read by dK (and Sᵀ, 1-CTA), its rows by the compute warps (commit
    /// after dK).
    QEmpty(u32),
    /// dO landed (pair mode: the dO columns of dV's B operand).
    DoFull,
    /// dO read by dV (and dPᵀ, 1-CTA) (commit after dV).
    DoEmpty,
    /// Pair mode: this CTA's 64 Q rows of Sᵀ's B operand landed / read by Sᵀ.
    QRowFull,
    QRowEmpty,
    /// Pair mode: this CTA's 64 dO rows of dPᵀ's B operand landed / read by dPᵀ.
    DoRowFull,
    DoRowEmpty,
    /// Pair mode: stage `s`'s lse_log2 and D rows landed (this CTA's own bulk copies).
    RowsFull(u32),
    /// Sᵀ in TMEM (commit).
    SFull,
    /// Pᵀ in TMEM (256 compute threads; pair mode: 8 warps of each CTA).
    PWritten,
    /// dPᵀ in TMEM (commit).
    DpFull,
    /// dSᵀ in TMEM and dS in shared memory (the compute threads, as `PWritten`).
    DsWritten,
    /// dQ in TMEM (commit).
    DqFull,
    /// dQ read out of TMEM (128 reduce threads; pair mode: 4 warps of each CTA).
    DqDrained,
    /// dK and dV of the key tile final (commit).
    DkvFull,
    /// dK and dV read out of TMEM by the epilogue (the compute threads, as `PWritten`).
    DkvEmpty,
    /// Pair mode, ordered dQ: the second CTA's adds of the visit are complete (its reduce
    /// thread 0 arrives on the first CTA's copy, which passes the turn).
    DqHalfAdded,
}

/// Q stages of the built kernel's ring (pair mode: of the Q columns and the rows).
pub const Q_STAGES: u32 = 2;

impl BwdBar {
    const ONE: [BwdBar; 16] = [
        BwdBar::KvFull,
        BwdBar::KvEmpty,
        BwdBar::QFull(0),
        BwdBar::QFull(1),
        BwdBar::QEmpty(0),
        BwdBar::QEmpty(1),
        BwdBar::DoFull,
        BwdBar::DoEmpty,
        BwdBar::SFull,
        BwdBar::PWritten,
        BwdBar::DpFull,
        BwdBar::DsWritten,
        BwdBar::DqFull,
        BwdBar::DqDrained,
        BwdBar::DkvFull,
        BwdBar::DkvEmpty,
    ];
    const PAIR_ONLY: [BwdBar; 7] = [
        BwdBar::QRowFull,
        BwdBar::QRowEmpty,
        BwdBar::DoRowFull,
        BwdBar::DoRowEmpty,
        BwdBar::RowsFull(0),
        BwdBar::RowsFull(1),
        BwdBar::DqHalfAdded,
    ];

    /// The barriers of `mode`'s kernel, in shared-memory order.
    pub fn all(mode: CtaMode) -> Vec<BwdBar> {
        let mut v = BwdBar::ONE.to_vec();
        if mode == CtaMode::Two {
            v.extend(BwdBar::PAIR_ONLY);
        }
        v
    }

    /// Position in shared memory (`bars + 8·index`); the pair-only barriers follow the
    /// common ones, so the 1-CTA indices do not depend on the mode.
    pub fn index(self) -> u32 {
        BwdBar::ONE.iter().chain(BwdBar::PAIR_ONLY.iter()).position(|b| *b == self).unwrap_or(0) as u32
    }

    /// Arrivals per phase: a commit, the TMA thread's expect-tx (pair mode: one of each
    /// CTA's), or the threads (1-CTA) / warps of both CTAs (pair mode) that hand over.
    pub fn count(self, mode: CtaMode) -> u32 {
        use BwdBar::*;
        match (mode, self) {
            (CtaMode::One, PWritten | DsWritten | DkvEmpty) => 256,
            (CtaMode::One, DqDrained) => 128,
            (CtaMode::Two, PWritten | DsWritten | DkvEmpty) => 16,
            (CtaMode::Two, DqDrained) => 8,
            (CtaMode::Two, KvFull | QFull(_) | DoFull | QRowFull | DoRowFull) => 2,
            _ => 1,
        }
    }

    pub fn what(self, mode: CtaMode) -> &'static str {
        let pair = mode == CtaMode::Two;
        match self {
            BwdBar::KvFull if pair => "kv_full (K, V and the K^T halves of both CTAs landed)",
            BwdBar::KvFull => "kv_full (K, V landed)",
            BwdBar::KvEmpty => "kv_empty (the key tile's MMAs done)",
            BwdBar::QFull(_) if pair => "q_full (both CTAs' Q columns for dK landed)",
            BwdBar::QFull(_) => "q_full (Q stage and its lse_log2, D rows landed)",
            BwdBar::QEmpty(_) if pair => "q_empty (Q columns read by dK; rows by the compute warps)",
            BwdBar::QEmpty(_) => "q_empty (Q stage read by S^T and dK)",
            BwdBar::DoFull if pair => "do_full (both CTAs' dO columns for dV landed)",
            BwdBar::DoFull => "do_full",
            BwdBar::DoEmpty if pair => "do_empty (dO columns read by dV)",
            BwdBar::DoEmpty => "do_empty (dO read by dP^T and dV)",
            BwdBar::QRowFull => "q_row_full (both CTAs' 64 Q rows for S^T landed)",
            BwdBar::QRowEmpty => "q_row_empty (Q rows read by S^T)",
            BwdBar::DoRowFull => "do_row_full (both CTAs' 64 dO rows for dP^T landed)",
            BwdBar::DoRowEmpty => "do_row_empty (dO rows read by dP^T)",
            BwdBar::RowsFull(_) => "rows_full (this CTA's lse_log2 and D rows landed)",
            BwdBar::SFull => "s_full (S^T in TMEM)",
            BwdBar::PWritten if pair => "p_written (P^T in TMEM; 8 warps of each CTA)",
            BwdBar::PWritten => "p_written (P^T in TMEM; 256 threads)",
            BwdBar::DpFull => "dp_full (dP^T in TMEM)",
            BwdBar::DsWritten if pair => "ds_written (dS^T in TMEM, dS in both CTAs' shared memory; 8 warps of each)",
            BwdBar::DsWritten => "ds_written (dS^T in TMEM, dS in shared memory; 256 threads)",
            BwdBar::DqFull => "dq_full (dQ in TMEM)",
            BwdBar::DqDrained if pair => "dq_drained (4 reduce warps of each CTA)",
            BwdBar::DqDrained => "dq_drained (128 reduce threads)",
            BwdBar::DkvFull => "dkv_full (dK, dV final)",
            BwdBar::DkvEmpty if pair => "dkv_empty (dK, dV stored; 8 warps of each CTA)",
            BwdBar::DkvEmpty => "dkv_empty (dK, dV stored; 256 threads)",
            BwdBar::DqHalfAdded => "dq_half_added (ordered dQ: the second CTA's adds complete)",
        }
    }
}

/// Byte offsets of the kernel's shared memory from its 1024-byte-aligned base. Operand
/// tiles are 64-column blocks of 128 rows × 128 bytes (16 KiB; pair mode's row halves 64
/// rows, 8 KiB), as TMA writes them with the 128-byte swizzle. Identical in both CTAs of
/// a pair: the MMA thread's descriptors address the same offsets in each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct BwdSmemMap {
    pub mode: CtaMode,
    /// Q stage 0 (1-CTA: the whole Q tile; pair mode: all 128 rows of this CTA's 64 Q
    /// columns, dK's B operand); stage `s` at `q + s·q_stage`.
    pub q: u32,
    pub q_stage: u32,
    /// Pair mode: this CTA's 64 Q rows, every column (Sᵀ's B operand).
    pub q_row: Option<u32>,
    pub k: u32,
    pub v: u32,
    /// Pair mode: this CTA's 64 K columns of both CTAs' keys (dQ's B operand): the first
    /// CTA's 128 key rows, then the second's.
    pub kt: Option<u32>,
    /// 1-CTA: the dO tile; pair mode: all rows of this CTA's 64 dO columns (dV's B).
    pub d_o: u32,
    /// Pair mode: this CTA's 64 dO rows (dPᵀ's B operand).
    pub do_row: Option<u32>,
    /// dS, MN-major for dQ = dS·K: 1-CTA two 64-query blocks of 128 key rows; pair mode
    /// this CTA's 64 queries against the first CTA's keys, then the second's.
    pub ds: u32,
    /// Per Q stage: 128 lse_log2 values, then 128 D values; stage `s` at `rows + s·rows_stage`.
    pub rows: u32,
    pub rows_stage: u32,
    pub bars: u32,
    pub tmem_slot: u32,
    pub used: u32,
}

/// Bytes of one 64-column block of a 128-row operand tile.
pub const BLOCK_BYTES: u32 = 128 * 128;

/// The kernel's shared-memory offsets for head dims `d_qk`, `d_v` in `mode`.
pub fn smem_map(d_qk: u32, d_v: u32, mode: CtaMode) -> BwdSmemMap {
    let (pq, pv) = (padded(d_qk) / 64, padded(d_v) / 64);
    let pair = mode == CtaMode::Two;
    // A pair's CTA holds one 64-column block of all 128 rows, or 64 rows of every block.
    let (q_stage, q_row_bytes, do_bytes, do_row_bytes) = if pair {
        (BLOCK_BYTES, pq * BLOCK_BYTES / 2, BLOCK_BYTES, pv * BLOCK_BYTES / 2)
    } else {
        (pq * BLOCK_BYTES, 0, pv * BLOCK_BYTES, 0)
    };
    let q = 0;
    let q_row = q + Q_STAGES * q_stage;
    let k = q_row + q_row_bytes;
    let v = k + pq * BLOCK_BYTES;
    let kt = v + pv * BLOCK_BYTES;
    let d_o = kt + if pair { 2 * BLOCK_BYTES } else { 0 };
    let do_row = d_o + do_bytes;
    let ds = do_row + do_row_bytes;
    let rows = ds + 2 * BLOCK_BYTES;
    let rows_stage = 2 * BWD_BLOCK_M * 4;
    let bars = rows + Q_STAGES * rows_stage;
    let tmem_slot = bars + 8 * BwdBar::all(mode).len() as u32;
    BwdSmemMap {
        mode,
        q,
        q_stage,
        q_row: pair.then_some(q_row),
        k,
        v,
        kt: pair.then_some(kt),
        d_o,
        do_row: pair.then_some(do_row),
        ds,
        rows,
        rows_stage,
        bars,
        tmem_slot,
        used: tmem_slot + 16,
    }
}

/// Where a pair CTA's share of dQ sits (M = 128 over `cta_group::2`: its 64 query rows,
/// the tcgen05 "2x2" data path): row r's first d/2 columns in lane r, its last d/2 in lane
/// 64 + r, both at the region's columns 0..d/2. Returns, for TMEM lane `lane`, the query
/// row (0..64, from the CTA's first: 64·rank) and the first head-dim column it holds.
pub fn dq_pair_place(lane: u32, d: u32) -> (u32, u32) {
    (lane % 64, (lane / 64) * d / 2)
}

fn tmem_map(d_qk: u32, d_v: u32, mode: CtaMode) -> BwdTmem {
    let s = (0, BWD_BLOCK_M);
    // The packed operands' extent: the two warpgroups' 32-column pieces at 0 and 64
    // ([`BwdTmem::packed_col`]).
    let packed = 64 + 32;
    let p = (s.0, s.0 + packed);
    let dv = (s.1, s.1 + d_v);
    let dp = (dv.1, dv.1 + BWD_BLOCK_M);
    let ds = (dp.0, dp.0 + packed);
    let dk = (dp.1, dp.1 + d_qk);
    // Pair mode: 64 rows folded onto 128 lanes, d/2 columns ([`dq_pair_place`]).
    let dq = (dp.0, dp.0 + d_qk / mode.ctas());
    let used = [s.1, dv.1, dp.1, dk.1, dq.1].into_iter().max().unwrap_or(0);
    BwdTmem { s, p, dv, dp, ds, dq, dk, used, alloc: used.next_power_of_two().max(32) }
}

fn smem_layout(o: &BwdSmemMap) -> BwdSmem {
    let mut buffers = Vec::new();
    match o.mode {
        CtaMode::One => {
            buffers.extend([("Q (2 stages)", o.k - o.q), ("K", o.v - o.k), ("V", o.d_o - o.v), ("dO", o.ds - o.d_o)])
        }
        CtaMode::Two => {
            let (q_row, kt, do_row) = (o.q_row.unwrap_or(0), o.kt.unwrap_or(0), o.do_row.unwrap_or(0));
            buffers.extend([
                ("Q columns of dK's B (2 stages, all 128 rows)", q_row - o.q),
                ("Q rows of S^T's B (64 rows)", o.k - q_row),
                ("K", o.v - o.k),
                ("V", kt - o.v),
                ("K^T columns of dQ's B (both CTAs' keys)", o.d_o - kt),
                ("dO columns of dV's B (all 128 rows)", do_row - o.d_o),
                ("dO rows of dP^T's B (64 rows)", o.ds - do_row),
            ])
        }
    }
    buffers.extend([
        ("dS (MN-major for dQ = dS.K)", o.rows - o.ds),
        ("lse_log2 and D rows (2 stages)", o.bars - o.rows),
        ("mbarriers, TMEM address", o.used - o.bars),
    ]);
    BwdSmem { buffers, used: o.used, request: o.used + 1024 }
}

fn tile_cycles(d_qk: u32, d_v: u32, mode: CtaMode) -> BwdCycles {
    let (m, n) = (BWD_BLOCK_M as f64, BWD_BLOCK_N as f64);
    let (dq, dv) = (d_qk as f64, d_v as f64);
    let flops = 2.0 * m * n * (3.0 * dq + 2.0 * dv);
    let mma = flops / MMA_FLOPS_PER_CLK;
    // Operand bytes read from shared memory per tile: Sᵀ (K, Q), dPᵀ (V, dO), dV (dO; Pᵀ
    // in TMEM), dK (Q; dSᵀ in TMEM), dQ (dS, K). In pair mode each CTA reads its own A
    // operands (K, V, dS) whole and half of each B operand (Q, dO, Kᵀ).
    let (a, b) = (2.0 * (n * dq + n * dv + m * n), 2.0 * (m * dq + m * dv + m * dv + m * dq + n * dq));
    let operands = match mode {
        CtaMode::One => a + b,
        CtaMode::Two => a + b / 2.0,
    };
    let ds_store = 2.0 * m * n;
    let smem = (operands + ds_store) / SMEM_BYTES_PER_CLK;
    let exp = m * n / MUFU_PER_CLK;
    let units = [("MMA", mma), ("shared memory", smem), ("exp MUFU", exp)];
    let top = units.iter().map(|u| u.1).fold(0.0, f64::max);
    let bound = units.iter().filter(|u| u.1 >= 0.99 * top).map(|u| u.0).collect::<Vec<_>>().join(" = ");
    BwdCycles { mma, smem, exp, bound, flops_per_clk: flops / top }
}

impl BwdPlan {
    /// Every budget the kernel must keep: TMEM columns, shared memory, the register file,
    /// and the overlays' prerequisites. Empty when all hold.
    pub fn violations(&self) -> Vec<String> {
        let mut v = Vec::new();
        if self.tmem.alloc > TMEM_COLS {
            v.push(format!("TMEM: {} columns allocated, {} exist", self.tmem.alloc, TMEM_COLS));
        }
        let max = Arch::Sm100a.max_smem_per_block();
        if self.smem.request > max {
            v.push(format!("shared memory: {} bytes requested, {max} allowed", self.smem.request));
        }
        let regs: u32 = self.roles.iter().map(|(_, w, r)| (w.1 - w.0) * 32 * r).sum();
        if regs > 65536 {
            v.push(format!("registers: {regs} of 65536"));
        }
        let t = &self.tmem;
        let inside = |(a, b): (u32, u32), (c, d): (u32, u32)| c <= a && b <= d;
        if !inside(t.p, t.s) || !inside(t.ds, t.dp) {
            v.push("P must lie over S and dS over dP".into());
        }
        let disjoint = |(a, b): (u32, u32), (c, d): (u32, u32)| b <= c || d <= a;
        // The accumulators that live across the walk never overlap anything.
        for (name, r) in [("dV", t.dv), ("dK", t.dk)] {
            for (other, o) in [("S", t.s), ("dP", t.dp), ("dQ", t.dq)] {
                if !disjoint(r, o) {
                    v.push(format!("TMEM: {name} overlaps {other}"));
                }
            }
        }
        if !disjoint(t.dv, t.dk) {
            v.push("TMEM: dV overlaps dK".into());
        }
        // dQ may only share the columns whose contents are dead when it is written.
        if !inside(t.dq, t.dp) {
            v.push("TMEM: dQ must lie over dP".into());
        }
        v
    }
}

impl fmt::Display for BwdPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let form = match self.mode {
            CtaMode::One => "1-CTA",
            CtaMode::Two => "CTA pair, cta_group::2",
        };
        writeln!(f, "blackwell backward plan: head dims {}/{}, {form}", self.d_qk, self.d_v)?;
        match self.mode {
            CtaMode::One => writeln!(
                f,
                "tile: {BWD_BLOCK_N} keys (TMEM lanes) x {BWD_BLOCK_M} queries; S^T = K.Q^T, dP^T = V.dO^T"
            )?,
            CtaMode::Two => writeln!(
                f,
                "tile: {} keys per pair ({BWD_BLOCK_N} per CTA, on its TMEM lanes) x {BWD_BLOCK_M} queries; \
                 S^T, dP^T, dV, dK with M = 256 (each CTA gives half of each B operand); dQ = dS.K with \
                 M = 128 (64 query rows per CTA) over the pair's keys",
                self.mode.walk_keys()
            )?,
        }
        let c = &self.cycles;
        writeln!(
            f,
            "cycles per tile: MMA {:.0}, shared memory {:.0}, exp {:.0} -> bound by {} ({:.0} FLOP/clk/SM)",
            c.mma, c.smem, c.exp, c.bound, c.flops_per_clk
        )?;
        writeln!(f, "TMEM ({} of {} columns allocated):", self.tmem.alloc, TMEM_COLS)?;
        let t = &self.tmem;
        let dq_what = match self.mode {
            CtaMode::One => "dS.K of one query tile, drained by the reduce warps",
            CtaMode::Two => "this CTA's 64 query rows of dS.K (row r: lanes r and 64 + r), drained by the reduce warps",
        };
        for (name, (a, b), what) in [
            ("S^T", t.s, "K.Q^T, f32"),
            ("P^T", t.p, "16-bit pairs over each warpgroup's S^T columns once read (A of dV)"),
            ("dV", t.dv, "accumulates over the walk"),
            ("dP^T", t.dp, "V.dO^T, f32"),
            ("dS^T", t.ds, "16-bit pairs over each warpgroup's dP^T columns (A of dK)"),
            ("dQ", t.dq, dq_what),
            ("dK", t.dk, "accumulates over the walk"),
        ] {
            writeln!(f, "  {name:<5} {a:>3}..{b:<3} {what}")?;
        }
        writeln!(f, "shared memory ({} bytes requested):", self.smem.request)?;
        for (name, bytes) in &self.smem.buffers {
            writeln!(f, "  {bytes:>6}  {name}")?;
        }
        writeln!(f, "warps:")?;
        for (role, (a, b), regs) in &self.roles {
            writeln!(f, "  {a:>2}-{:<2} {role:?} ({regs} registers)", b - 1)?;
        }
        writeln!(f, "mbarriers (arrivals per phase):")?;
        for (name, n) in &self.mbarriers {
            writeln!(f, "  {n:>3} x {name}")?;
        }
        writeln!(
            f,
            "deterministic: ordered dQ turns (common::dq_order: a turn-plan kernel first; per query tile, \
             reduce thread 0 waits for its predecessor's flag, the warps add, thread 0 passes it{}), or \
             dQ slices where a KV head's key tiles exceed the resident CTAs",
            if self.mode == CtaMode::Two { " once the second CTA's adds are complete too" } else { "" }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use attnc_ir::Align;

    #[test]
    fn every_head_dim_keeps_every_budget() {
        for (dqk, dv, mode) in [(64, 64, CtaMode::One), (96, 96, CtaMode::One), (128, 128, CtaMode::Two)] {
            for causal in [false, true] {
                let mut s = Spec::new("bwd", dqk, 8);
                s.head_dim_v = dv;
                if causal {
                    s.mask.causal = Some(Align::BottomRight);
                }
                let p = kernel_plan(&s).unwrap_or_else(|e| panic!("{dqk}/{dv}: {e}"));
                assert_eq!(p.mode, mode);
                assert!(p.violations().is_empty(), "{dqk}/{dv} causal={causal}: {:?}\n{p}", p.violations());
                let regs: u32 = p.roles.iter().map(|(_, w, r)| (w.1 - w.0) * 32 * r).sum();
                assert_eq!(regs, 65536, "{dqk}");
                assert_eq!(p.mbarriers.len(), BwdBar::all(mode).len());
            }
        }
    }

    #[test]
    fn the_head_dim_128_map_fills_tmem_and_the_pair_halves_the_b_operands() {
        let p = kernel_plan(&Spec::new("d128", 128, 8)).expect("plans");
        assert_eq!(p.tmem.used, 512, "S 128 + dV 128 + dP 128 + dK 128");
        assert_eq!(p.tmem.dq, (256, 320), "the pair's dQ share over dP^T: 64 rows folded onto 128 lanes");
        assert_eq!(tmem_map(128, 128, CtaMode::One).dq, (256, 384));
        let pair = smem_map(128, 128, CtaMode::Two);
        let one = smem_map(128, 128, CtaMode::One);
        // Per CTA: half of Q and dO per B operand; Kᵀ whole for both CTAs' keys.
        assert_eq!(pair.q_stage * 2, one.q_stage);
        assert_eq!(pair.kt.map(|kt| pair.d_o - kt), Some(2 * BLOCK_BYTES));
        for o in [pair, one] {
            let tiles = [o.q, o.q_row.unwrap_or(0), o.k, o.v, o.kt.unwrap_or(0), o.d_o, o.do_row.unwrap_or(0), o.ds];
            assert!(tiles.iter().all(|t| t % 1024 == 0), "swizzle atoms: {o:?}");
            assert_eq!(o.rows % 16 + o.bars % 8, 0);
            assert!(smem_layout(&o).request <= Arch::Sm100a.max_smem_per_block(), "{o:?}");
        }
    }

    #[test]
    fn the_pair_barriers_follow_the_common_ones() {
        for (i, b) in BwdBar::all(CtaMode::Two).into_iter().enumerate() {
            assert_eq!(b.index(), i as u32, "{b:?}");
        }
        assert_eq!(BwdBar::PWritten.count(CtaMode::One), 256);
        assert_eq!(BwdBar::PWritten.count(CtaMode::Two), 16, "8 warps of each CTA");
        assert_eq!(BwdBar::KvFull.count(CtaMode::Two), 2, "each CTA's load thread");
        assert_eq!(BwdBar::RowsFull(1).count(CtaMode::Two), 1, "a CTA's own rows");
        // dQ's 64 rows per CTA: every (row, column half) once over the 128 lanes.
        let places: std::collections::BTreeSet<(u32, u32)> = (0..128).map(|l| dq_pair_place(l, 128)).collect();
        assert_eq!(places.len(), 128);
        assert_eq!((dq_pair_place(0, 128), dq_pair_place(63, 128), dq_pair_place(64, 128)), ((0, 0), (63, 0), (0, 64)));
    }

    #[test]
    fn other_head_dims_are_refused_with_the_reason() {
        for (dqk, dv) in [(192, 128), (192, 192), (256, 256)] {
            let mut s = Spec::new("wide", dqk, 8);
            s.head_dim_v = dv;
            let e = kernel_plan(&s).expect_err("not planned");
            assert!(e.contains("TMEM columns"), "{e}");
        }
    }

    #[test]
    fn a_broken_overlay_is_reported() {
        let mut p = kernel_plan(&Spec::new("d64", 64, 8)).expect("plans");
        p.tmem.dq = (p.tmem.dk.0, p.tmem.dk.0 + 64);
        assert!(p.violations().iter().any(|v| v.contains("dK overlaps dQ")), "{:?}", p.violations());
    }

    #[test]
    fn the_cycle_model_predicts_more_than_1_3x_the_hopper_backward_per_sm() {
        // H100, hopper backward, d128 non-causal 16k: 476 TFLOP/s on 132 SMs at 1.98 GHz
        // (docs/results/2026-11-23-h100-hopper-backward-bulk-dq/) = 1821 FLOP/clk/SM.
        let hopper = 476.0e12 / 132.0 / 1.98e9;
        let p = kernel_plan(&Spec::new("d128", 128, 8)).expect("plans");
        assert_eq!(p.mode, CtaMode::Two);
        let ratio = p.cycles.flops_per_clk / hopper;
        assert!(ratio >= 1.3, "{ratio:.2}: {:?}", p.cycles);
        assert_eq!(p.cycles.bound, "MMA", "{:?}", p.cycles);
        // The pair halves the B operands' shared-memory reads: more MMA headroom than one
        // CTA alone at the same head dim.
        let one = tile_cycles(128, 128, CtaMode::One);
        assert!(one.smem > p.cycles.smem, "{one:?} vs {:?}", p.cycles);
    }

    #[test]
    fn the_packed_operands_sit_in_each_warpgroups_columns() {
        // Warpgroup 0's queries in columns 0..32, warpgroup 1's in 64..96.
        assert_eq!((0..8).map(BwdTmem::packed_col).collect::<Vec<_>>(), [0, 8, 16, 24, 64, 72, 80, 88]);
    }
}
