//! The blackwell backward's resource plan: FlashAttention-4's sm_100 backward design in
//! this family's terms, sized before code is generated, and what `attnc report --pass bwd`
//! prints. The kernel built from it (`backward.rs`) is the 1-CTA form at every planned
//! head dim ([`kernel_plan`]); the 2-CTA form at head dim 128 ([`plan`]) is planned and
//! modelled, not built.
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
//! head dim 128 the map is full; the 2-CTA mode (a CTA pair sharing the B operands,
//! `cta_group::2`) would halve the B-operand shared-memory traffic there.

use super::config::{BLOCK_N, TMEM_COLS};
use super::report::{MMA_FLOPS_PER_CLK, MUFU_PER_CLK, SMEM_BYTES_PER_CLK};
use crate::arch::Arch;
use attnc_ir::Spec;
use std::fmt;

/// Queries per tile (the columns of Sᵀ).
pub const BWD_BLOCK_M: u32 = 128;
/// Keys per tile (TMEM lanes).
pub const BWD_BLOCK_N: u32 = BLOCK_N;
/// f32 columns of dQ one reduce step drains (a 16 KB staging slot at 128 rows).
pub const DQ_REDUCE_COLS: u32 = 32;

/// One CTA per key tile, or a CTA pair (`cta_group::2`) over two adjacent key tiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum CtaMode {
    One,
    Two,
}

/// TMEM columns of the backward (f32 columns, 128 lanes = the tile's keys; dQ's lanes are
/// queries). Overlays and the MMA-issue order that makes each safe:
/// - `p` over `s`: each compute warpgroup reads its 64 query columns of Sᵀ and writes their
///   Pᵀ (16-bit pairs, 32 columns) over the first half of those same columns
///   ([`BwdTmem::packed_col`]), so neither warpgroup writes a column the other still
///   reads; the next Sᵀ is issued only after dV has read Pᵀ.
/// - `ds` over `dp`: the same placement, written after dPᵀ is read; dK reads it.
/// - `dq` over `dp` (1-CTA): dQ is issued after dK has consumed dSᵀ, and the next dPᵀ waits
///   until the reduce warps drained dQ. In 2-CTA mode `dq` takes the upper half of `s`
///   instead, and the next Sᵀ waits for the drain.
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
    /// Warps 0-3: drain dQ from TMEM (planned 2-CTA form: through shared memory into bulk
    /// reduce-adds; the built 1-CTA kernel: vector reds from registers).
    DqReduce,
    /// Warps 4-11: Pᵀ, dSᵀ (score-mod derivative, mask), the dK/dV epilogue.
    Compute,
    /// Warp 12: the single thread that issues every tcgen05.mma / commit.
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
    /// The MMAs' shared-memory operand reads, the dS store and (2-CTA design) the dQ
    /// staging (write by the reduce warps, read by TMA). The built 1-CTA kernel's dQ goes
    /// from registers to L2 as vector reds (64 KiB per tile at d = 128), which the model
    /// does not count.
    pub smem: f64,
    /// 128·128 exponentials on MUFU (none emulated).
    pub exp: f64,
    pub bound: String,
    /// 2·128·128·(3·d_qk + 2·d_v) / the bound's cycles.
    pub flops_per_clk: f64,
}

/// The backward's plan for one spec.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct BwdPlan {
    pub d_qk: u32,
    pub d_v: u32,
    pub mode: CtaMode,
    /// Whether `backward.rs` builds this plan (the 1-CTA form) or it is the design only.
    pub built: bool,
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

/// The head dims the design holds, and its mode for them.
fn design_mode(spec: &Spec) -> Result<CtaMode, String> {
    let (d_qk, d_v) = (spec.head_dim_qk, spec.head_dim_v);
    // 1-CTA: S 128 + dV d_v + dP 128 + dK d_qk columns, dQ (d_qk) over dP.
    match (d_qk, d_v) {
        (64, 64) | (96, 96) => Ok(CtaMode::One),
        (128, 128) => Ok(CtaMode::Two),
        _ => Err(format!(
            "head dims {d_qk}/{d_v}: S, dP, dV and dK need 256 + {} TMEM columns and dQ {d_qk} more; \
             the 1-CTA map holds d_qk + d_v <= 256 with d_qk <= 128 and the 2-CTA map d = 128 \
             (192/128, 192 and 256 need FA4's split dQ / dK-dV kernels, not planned)",
            d_qk + d_v
        )),
    }
}

/// The design's plan of `spec`'s backward (2-CTA at head dim 128), or why the design
/// cannot hold it.
pub fn plan(spec: &Spec) -> Result<BwdPlan, String> {
    let mode = design_mode(spec)?;
    if mode == CtaMode::One {
        return kernel_plan(spec);
    }
    let (d_qk, d_v) = (spec.head_dim_qk, spec.head_dim_v);
    let causal_like = spec.mask.causal.is_some() || spec.mask.window.is_some();
    // 128·reduce + 256·compute + 128·max(load, mma) = 65536: the whole register file.
    let (reduce, compute) = if causal_like { (136, 144) } else { (152, 136) };
    let roles = vec![
        (BwdRole::DqReduce, (0, 4), reduce),
        (BwdRole::Compute, (4, 12), compute),
        (BwdRole::Mma, (12, 13), 88),
        (BwdRole::Load, (13, 14), 88),
        (BwdRole::Idle, (14, 16), 88),
    ];
    let mbarriers = vec![
        ("q_full / q_empty (1 stage; the first also brings K)", 2),
        ("do_full / do_empty (the first also brings V)", 2),
        ("lse_full, dpsum_full (bulk copies of the tile's rows)", 2),
        ("s_full / p_written (S^T ready, P^T in TMEM)", 2),
        ("dp_full", 1),
        ("ds_written (dS^T in TMEM and dS in shared memory)", 1),
        ("dq_full / dq_drained", 2),
        ("dv_done / dk_done (epilogue)", 2),
        ("tmem_dealloc", 1),
        ("qt_full, kt_full (the transposed B operands' halves)", 2),
        ("ds_exchange_full / ds_exchange_empty (dS halves over DSMEM)", 2),
    ];
    Ok(BwdPlan {
        d_qk,
        d_v,
        mode,
        built: false,
        tmem: tmem_map(d_qk, d_v, mode),
        smem: smem_layout(d_qk, d_v, mode),
        roles,
        mbarriers,
        cycles: tile_cycles(d_qk, d_v, mode),
    })
}

/// The plan of the kernel `backward.rs` builds: the 1-CTA form at every head dim the
/// design holds (at head dim 128 too: its TMEM map is full, dQ over dPᵀ).
pub fn kernel_plan(spec: &Spec) -> Result<BwdPlan, String> {
    design_mode(spec)?;
    let (d_qk, d_v) = (spec.head_dim_qk, spec.head_dim_v);
    let mode = CtaMode::One;
    let roles = vec![
        (BwdRole::DqReduce, (0, 4), KERNEL_REGS.reduce),
        (BwdRole::Compute, (4, 12), KERNEL_REGS.compute),
        (BwdRole::Mma, (12, 13), KERNEL_REGS.other),
        (BwdRole::Load, (13, 14), KERNEL_REGS.other),
        (BwdRole::Idle, (14, 16), KERNEL_REGS.other),
    ];
    let mbarriers = BwdBar::ALL.iter().map(|b| (b.what(), 1)).collect();
    Ok(BwdPlan {
        d_qk,
        d_v,
        mode,
        built: true,
        tmem: tmem_map(d_qk, d_v, mode),
        smem: smem_layout(d_qk, d_v, mode),
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

/// The built kernel's mbarriers, in shared-memory order (8 bytes each).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BwdBar {
    /// K and V of the key tile landed (TMA transactions).
    KvFull,
    /// The key tile's last MMA read K and V (commit).
    KvEmpty,
    /// Q stage `s` and its lse_log2 and D rows landed.
    QFull(u32),
    /// Q stage `s` read by Sᵀ and dK, its rows by the compute warps (commit after dK).
    QEmpty(u32),
    DoFull,
    /// dO read by dPᵀ and dV (commit after dV).
    DoEmpty,
    /// Sᵀ in TMEM (commit).
    SFull,
    /// Pᵀ in TMEM (256 compute threads).
    PWritten,
    /// dPᵀ in TMEM (commit).
    DpFull,
    /// dSᵀ in TMEM and dS in shared memory (256 compute threads).
    DsWritten,
    /// dQ in TMEM (commit).
    DqFull,
    /// dQ read out of TMEM (128 reduce threads).
    DqDrained,
    /// dK and dV of the key tile final (commit).
    DkvFull,
    /// dK and dV read out of TMEM by the epilogue (256 compute threads).
    DkvEmpty,
}

/// Q stages of the built kernel's ring.
pub const Q_STAGES: u32 = 2;

impl BwdBar {
    pub const ALL: [BwdBar; 16] = [
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

    /// Position in shared memory (`bars + 8·index`).
    pub fn index(self) -> u32 {
        BwdBar::ALL.iter().position(|b| *b == self).unwrap_or(0) as u32
    }

    /// Arrivals per phase: one (a commit or the TMA thread's expect-tx), or the threads
    /// of the role that arrives.
    pub fn count(self) -> u32 {
        match self {
            BwdBar::PWritten | BwdBar::DsWritten | BwdBar::DkvEmpty => 256,
            BwdBar::DqDrained => 128,
            _ => 1,
        }
    }

    pub fn what(self) -> &'static str {
        match self {
            BwdBar::KvFull => "kv_full (K, V landed)",
            BwdBar::KvEmpty => "kv_empty (the key tile's MMAs done)",
            BwdBar::QFull(_) => "q_full (Q stage and its lse_log2, D rows landed)",
            BwdBar::QEmpty(_) => "q_empty (Q stage read by S^T and dK)",
            BwdBar::DoFull => "do_full",
            BwdBar::DoEmpty => "do_empty (dO read by dP^T and dV)",
            BwdBar::SFull => "s_full (S^T in TMEM)",
            BwdBar::PWritten => "p_written (P^T in TMEM; 256 threads)",
            BwdBar::DpFull => "dp_full (dP^T in TMEM)",
            BwdBar::DsWritten => "ds_written (dS^T in TMEM, dS in shared memory; 256 threads)",
            BwdBar::DqFull => "dq_full (dQ in TMEM)",
            BwdBar::DqDrained => "dq_drained (128 reduce threads)",
            BwdBar::DkvFull => "dkv_full (dK, dV final)",
            BwdBar::DkvEmpty => "dkv_empty (dK, dV stored; 256 threads)",
        }
    }
}

/// Byte offsets of the built (1-CTA) kernel's shared memory from its 1024-byte-aligned
/// base. Operand tiles are 64-column blocks of 128 rows × 128 bytes (16 KiB), as TMA
/// writes them with the 128-byte swizzle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct OneCtaSmem {
    /// Q stage 0; stage `s` at `q + s·q_stage`.
    pub q: u32,
    pub q_stage: u32,
    pub k: u32,
    pub v: u32,
    pub d_o: u32,
    /// dS, MN-major for dQ = dS·K: two 64-query blocks of 128 key rows.
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

/// The built kernel's shared-memory offsets for head dims `d_qk`, `d_v`.
pub fn one_cta_smem(d_qk: u32, d_v: u32) -> OneCtaSmem {
    let (pq, pv) = (padded(d_qk) / 64, padded(d_v) / 64);
    let q_stage = pq * BLOCK_BYTES;
    let q = 0;
    let k = q + Q_STAGES * q_stage;
    let v = k + pq * BLOCK_BYTES;
    let d_o = v + pv * BLOCK_BYTES;
    let ds = d_o + pv * BLOCK_BYTES;
    let rows = ds + 2 * BLOCK_BYTES;
    let rows_stage = 2 * BWD_BLOCK_M * 4;
    let bars = rows + Q_STAGES * rows_stage;
    let tmem_slot = bars + 8 * BwdBar::ALL.len() as u32;
    OneCtaSmem { q, q_stage, k, v, d_o, ds, rows, rows_stage, bars, tmem_slot, used: tmem_slot + 16 }
}

fn tmem_map(d_qk: u32, d_v: u32, mode: CtaMode) -> BwdTmem {
    let s = (0, BWD_BLOCK_M);
    // The packed operands' extent: 1-CTA, the two warpgroups' 32-column pieces at 0 and
    // 64 ([`BwdTmem::packed_col`]); the 2-CTA design keeps them in S's lower half.
    let packed = match mode {
        CtaMode::One => 64 + 32,
        CtaMode::Two => BWD_BLOCK_M / 2,
    };
    let p = (s.0, s.0 + packed);
    let dv = (s.1, s.1 + d_v);
    let dp = (dv.1, dv.1 + BWD_BLOCK_M);
    let ds = (dp.0, dp.0 + packed);
    let dk = (dp.1, dp.1 + d_qk);
    let dq = match mode {
        CtaMode::One => (dp.0, dp.0 + d_qk),
        // Each CTA of the pair accumulates half of dQ's columns in the upper half of S.
        CtaMode::Two => (s.0 + BWD_BLOCK_M / 2, s.0 + BWD_BLOCK_M / 2 + d_qk / 2),
    };
    let used = [s.1, dv.1, dp.1, dk.1, dq.1].into_iter().max().unwrap_or(0);
    BwdTmem { s, p, dv, dp, ds, dq, dk, used, alloc: used.next_power_of_two().max(32) }
}

fn smem_layout(d_qk: u32, d_v: u32, mode: CtaMode) -> BwdSmem {
    let (m, n) = (BWD_BLOCK_M, BWD_BLOCK_N);
    let (pq, pv) = (padded(d_qk), padded(d_v));
    let bf16 = 2;
    if mode == CtaMode::One {
        let o = one_cta_smem(d_qk, d_v);
        let buffers = vec![
            ("Q (2 stages)", o.k - o.q),
            ("K", o.v - o.k),
            ("V", o.d_o - o.v),
            ("dO", o.ds - o.d_o),
            ("dS (MN-major for dQ = dS.K)", o.rows - o.ds),
            ("lse_log2 and D rows (2 stages, with Q)", o.bars - o.rows),
            ("mbarriers, TMEM address", o.used - o.bars),
        ];
        return BwdSmem { buffers, used: o.used, request: o.used + 1024 };
    }
    // 2-CTA: each CTA holds its own K and V and half of every B operand (Q, dO and their
    // transposed views as separate loads), the half of dS its peer needs, and a dQ
    // staging (it drains half of dQ through bulk reduce-adds).
    let mut buffers: Vec<(&'static str, u32)> = vec![
        ("Q half", m / 2 * pq * bf16),
        ("Q^T half", m / 2 * pq * bf16),
        ("K", n * pq * bf16),
        ("K^T", n * pq * bf16),
        ("V", n * pv * bf16),
        ("dO half", m / 2 * pv * bf16),
        ("dO^T half", m / 2 * pv * bf16),
        ("dS", m * n * bf16),
        ("dS exchange half", m / 2 * n * bf16),
        ("dQ staging (4 slots of 128 x 8 f32)", 4 * m * 8 * 4),
        ("LSE", m * 4),
        ("D = rowsum(dO o O)", m * 4),
    ];
    let align = |x: u32, a: u32| x.div_ceil(a) * a;
    let mut used = 0;
    // The operand tiles come first (whole 1024-byte multiples), the row vectors after.
    for b in &buffers {
        used = align(used, if b.1 % 1024 == 0 { 1024 } else { 16 }) + b.1;
    }
    // mbarriers (at most 24 of 8 bytes) and the TMEM base address slot.
    used = align(used, 16) + 24 * 8 + 16;
    buffers.push(("mbarriers, TMEM address", 24 * 8 + 16));
    BwdSmem { buffers, used, request: used + 1024 }
}

fn tile_cycles(d_qk: u32, d_v: u32, mode: CtaMode) -> BwdCycles {
    let (m, n) = (BWD_BLOCK_M as f64, BWD_BLOCK_N as f64);
    let (dq, dv) = (d_qk as f64, d_v as f64);
    let flops = 2.0 * m * n * (3.0 * dq + 2.0 * dv);
    let mma = flops / MMA_FLOPS_PER_CLK;
    // Operand bytes read from shared memory per tile: Sᵀ (K, Q), dPᵀ (V, dO), dV (dO; Pᵀ
    // in TMEM), dK (Q; dSᵀ in TMEM), dQ (dS, K). In 2-CTA mode each CTA reads its own A
    // operands (K, V, dS) whole and half of each B operand (Q, dO, Kᵀ).
    let (a, b) = (2.0 * (n * dq + n * dv + m * n), 2.0 * (m * dq + m * dv + m * dv + m * dq + n * dq));
    let operands = match mode {
        CtaMode::One => a + b,
        CtaMode::Two => a + b / 2.0,
    };
    let ds_store = 2.0 * m * n;
    let dq_staging = match mode {
        CtaMode::One => 0.0,
        CtaMode::Two => 4.0 * m * dq,
    };
    let smem = (operands + ds_store + dq_staging) / SMEM_BYTES_PER_CLK;
    let exp = m * n / MUFU_PER_CLK;
    let units = [("MMA", mma), ("shared memory", smem), ("exp MUFU", exp)];
    let top = units.iter().map(|u| u.1).fold(0.0, f64::max);
    let bound = units.iter().filter(|u| u.1 >= 0.99 * top).map(|u| u.0).collect::<Vec<_>>().join(" = ");
    BwdCycles { mma, smem, exp, bound, flops_per_clk: flops / top }
}

impl BwdPlan {
    /// Every budget the design must keep: TMEM columns, shared memory, the register file,
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
        let dq_ok = match self.mode {
            CtaMode::One => inside(t.dq, t.dp),
            CtaMode::Two => inside(t.dq, t.s) && disjoint(t.dq, t.p),
        };
        if !dq_ok {
            v.push("TMEM: dQ must lie over dP (1-CTA) or over S past P (2-CTA)".into());
        }
        v
    }
}

impl fmt::Display for BwdPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "blackwell backward plan ({}): head dims {}/{}, {:?}-CTA",
            if self.built { "the kernel built" } else { "the design; not built" },
            self.d_qk,
            self.d_v,
            self.mode
        )?;
        writeln!(f, "tile: {BWD_BLOCK_N} keys (TMEM lanes) x {BWD_BLOCK_M} queries; S^T = K.Q^T, dP^T = V.dO^T")?;
        let c = &self.cycles;
        writeln!(
            f,
            "cycles per tile: MMA {:.0}, shared memory {:.0}, exp {:.0} -> bound by {} ({:.0} FLOP/clk/SM)",
            c.mma, c.smem, c.exp, c.bound, c.flops_per_clk
        )?;
        writeln!(f, "TMEM ({} of {} columns allocated):", self.tmem.alloc, TMEM_COLS)?;
        let t = &self.tmem;
        for (name, (a, b), what) in [
            ("S^T", t.s, "K.Q^T, f32"),
            ("P^T", t.p, "16-bit pairs over each warpgroup's S^T columns once read (A of dV)"),
            ("dV", t.dv, "accumulates over the walk"),
            ("dP^T", t.dp, "V.dO^T, f32"),
            ("dS^T", t.ds, "16-bit pairs over each warpgroup's dP^T columns (A of dK)"),
            ("dQ", t.dq, "dS.K of one query tile, drained by the reduce warps"),
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
        writeln!(f, "mbarriers:")?;
        for (name, n) in &self.mbarriers {
            writeln!(f, "  {n} x {name}")?;
        }
        if self.built {
            writeln!(
                f,
                "deterministic: ordered dQ turns (common::dq_order: a turn-plan kernel first; per query tile, \
                 reduce thread 0 waits for its predecessor's flag, the warps add, thread 0 passes it), or \
                 dQ slices where a KV head's key tiles exceed the resident CTAs"
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use attnc_ir::Align;

    #[test]
    fn the_planned_head_dims_keep_every_budget() {
        for (dqk, dv, mode) in [(64, 64, CtaMode::One), (96, 96, CtaMode::One), (128, 128, CtaMode::Two)] {
            for causal in [false, true] {
                let mut s = Spec::new("bwd", dqk, 8);
                s.head_dim_v = dv;
                if causal {
                    s.mask.causal = Some(Align::BottomRight);
                }
                let p = plan(&s).unwrap_or_else(|e| panic!("{dqk}/{dv}: {e}"));
                assert_eq!(p.mode, mode);
                assert!(p.violations().is_empty(), "{dqk}/{dv} causal={causal}: {:?}\n{p}", p.violations());
            }
        }
    }

    #[test]
    fn the_head_dim_128_map_fills_tmem_and_the_1cta_smem_budget() {
        let p = plan(&Spec::new("d128", 128, 8)).expect("plans");
        assert_eq!(p.tmem.used, 512, "S 128 + dV 128 + dP 128 + dK 128");
        assert_eq!(p.tmem.dq, (64, 128), "2-CTA: half of dQ over the upper half of S");
        // The 1-CTA layout at d128 (FA4's: 230,912 bytes of buffers) fits too.
        let one = smem_layout(128, 128, CtaMode::One);
        assert!(one.request <= Arch::Sm100a.max_smem_per_block(), "{one:?}");
        let t = tmem_map(128, 128, CtaMode::One);
        assert_eq!((t.dq, t.used), ((256, 384), 512));
    }

    #[test]
    fn other_head_dims_are_refused_with_the_reason() {
        for (dqk, dv) in [(192, 128), (192, 192), (256, 256)] {
            let mut s = Spec::new("wide", dqk, 8);
            s.head_dim_v = dv;
            let e = plan(&s).expect_err("not planned");
            assert!(e.contains("TMEM columns"), "{e}");
        }
    }

    #[test]
    fn a_broken_overlay_is_reported() {
        let mut p = plan(&Spec::new("d64", 64, 8)).expect("plans");
        p.tmem.dq = (p.tmem.dk.0, p.tmem.dk.0 + 64);
        assert!(p.violations().iter().any(|v| v.contains("dK overlaps dQ")), "{:?}", p.violations());
    }

    #[test]
    fn the_cycle_model_predicts_more_than_1_3x_the_hopper_backward_per_sm() {
        // H100, hopper backward, d128 non-causal 16k: 476 TFLOP/s on 132 SMs at 1.98 GHz
        // (docs/results/2026-11-23-h100-hopper-backward-bulk-dq/) = 1821 FLOP/clk/SM.
        let hopper = 476.0e12 / 132.0 / 1.98e9;
        let p = plan(&Spec::new("d128", 128, 8)).expect("plans");
        let ratio = p.cycles.flops_per_clk / hopper;
        assert!(ratio >= 1.3, "{ratio:.2}: {:?}", p.cycles);
        // The CTA pair halves the B operands' shared-memory reads: MMA-bound, where one
        // CTA alone is bound by shared memory.
        assert_eq!(p.cycles.bound, "MMA", "{:?}", p.cycles);
        // The built 1-CTA kernel (no dQ staging in shared memory; its reds' L2 traffic is not
        // modelled) is MMA-bound too, by a smaller margin.
        let one = tile_cycles(128, 128, CtaMode::One);
        assert_eq!(one.bound, "MMA", "{one:?}");
        assert!(one.smem > p.cycles.smem);
        let built = kernel_plan(&Spec::new("d128", 128, 8)).expect("plans");
        assert!(built.built && built.mode == CtaMode::One);
        assert!(built.cycles.flops_per_clk / hopper >= 1.3, "{:?}", built.cycles);
    }

    #[test]
    fn the_built_kernel_keeps_every_budget_and_uses_the_whole_register_file() {
        for d in [64, 96, 128] {
            let p = kernel_plan(&Spec::new("bwd", d, 8)).unwrap_or_else(|e| panic!("{d}: {e}"));
            assert!(p.violations().is_empty(), "{d}: {:?}\n{p}", p.violations());
            let regs: u32 = p.roles.iter().map(|(_, w, r)| (w.1 - w.0) * 32 * r).sum();
            assert_eq!(regs, 65536, "{d}");
            assert_eq!(p.mbarriers.len(), BwdBar::ALL.len());
            let o = one_cta_smem(d, d);
            assert_eq!(o.q % 1024 + o.k % 1024 + o.v % 1024 + o.d_o % 1024 + o.ds % 1024, 0, "swizzle atoms");
            assert_eq!(o.rows % 16 + o.bars % 8, 0);
        }
        // The packed operands: warpgroup 0's queries in columns 0..32, warpgroup 1's in 64..96.
        assert_eq!((0..8).map(BwdTmem::packed_col).collect::<Vec<_>>(), [0, 8, 16, 24, 64, 72, 80, 88]);
    }
}
