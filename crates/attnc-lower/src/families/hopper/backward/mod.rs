//! The hopper backward main kernel: warp-specialized, TMA-fed, wgmma on sm_90a
//! (FlashAttention-3's backward shape; the kernels around it are `common::backward`'s).
//!
//! A CTA owns `block_n` = 128 keys of one KV head (64 per consumer warpgroup, the M of
//! every GEMM that has keys on its rows) and walks the non-empty query tiles (`block_m`
//! rows: 128 at d64, 64 otherwise) of each query head of its group, recomputing P from
//! the forward's LSE:
//!
//! ```text
//! warpgroup 0 (producer, one thread)        warpgroups 1, 2 (consumers, 64 keys each)
//!   per key tile: wait kv_empty;              wait kv_full; dK = dV = 0
//!     TMA K, V -> kv_full                     for each pair (head, query tile) at ring slot s:
//!   per pair (same walk as the consumers):      wait full[s]
//!     wait empty[s]; TMA Q, dO -> full[s]         Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ         (wgmma ss, N = block_m)
//!     bulk copy lse_log2, D rows -> full[s]       Pᵀ = 2^(s·log2e − lse), mask on partial tiles
//!                                                 dSᵀ = Pᵀ ∘ (dPᵀ − D) ∘ m′       (+ learnable aux gradients)
//!                                                 dV += Pᵀ·dO, dK += dSᵀ·Q       (wgmma rs: Pᵀ, dSᵀ from registers)
//!                                                 dSᵀ -> shared memory; barrier
//!                                                 dQ = dS·K                        (wgmma ss, dS MN-major)
//!                                                 wait; release empty[s]; dQ -> dq_accum
//!                                                   (staging tile + bulk reduce, or reds)
//!                                               release kv_empty; store dK·scale, dV
//! ```
//! Putting keys on M (Sᵀ rather than S) leaves Pᵀ and dSᵀ in registers in exactly the A
//! layout of the dV and dK GEMMs, so only dSᵀ goes through shared memory (for dQ, whose
//! M is queries). A grid column walks key tiles `ctaid.x, + nctaid.x, …` (several only in
//! deterministic mode, where the column is also the dQ slice), as the portable family's.

mod dq;
mod dq_writer;

use super::config::{BwdConfig, BwdSmem, Config, DqSplit, BOX_COLS, ROWS_PER_CONSUMER, ROW_BYTES};
use super::desc::SmemDesc;
use crate::families::common::abi::{self as cabi, Args};
use crate::families::common::backward::{
    aux_sink, dq_mode_is, dynamic_smem_base, emit_seqlen_pad, fragment_store_offset, red_dq_fragment,
    reversed_key_tiles, tma_boxes, tma_main_params, turn_flag, turn_plan_index, wg_fragment_store_offset, ws_row,
    ws_row_align, DqAccumLayout, DqSlice, FragLane, KeyTileCta, CONSUMER_HALF_FLOATS,
};
use crate::families::common::dq_order::{DqAccumulation, DqTurn};
use crate::families::common::schedule::{emit_lpt_place, emit_section_heads};
use crate::families::common::sw128::{k_major_step_offset, mn_major_step_offset};
use crate::llvm::kb::{Kb, Slot, R};
use crate::llvm::operand::Major;
use crate::llvm::tcgen05::Acc;
use crate::llvm::wgmma::WgmmaType;
use crate::module::{Grid, KernelInfo, KernelRole};
use crate::variant::expr as vexpr;
use crate::variant::grad::ScoreGrad;
use crate::variant::layout::kv_row_offsets;
use crate::variant::row_keys::{pair_word, RowKeys};
use crate::variant::tiles::{walk_key_tiles, walk_key_tiles_from, BlockListArgs, QueryPair, QueryTiles};
use attnc_ir::block_mask::{needs_block_mask, HeadSlots};
use attnc_ir::Spec;
use dq_writer::{DqHandoff, HandoffVals};
use inkwell::values::{FloatValue, IntValue};
use inkwell::{FloatPredicate, IntPredicate};

/// The suspend-time hint of the TMA thread's waits for a free ring slot (10 ms: the
/// phase completes long before; the hint only stops the spinning).
const PRODUCER_WAIT_HINT_NS: u32 = 10_000_000;

const LOG2E: f64 = std::f64::consts::LOG2_E;
/// Named barriers: `DS_BAR` (+ consumer with the key split) orders the dSᵀ stores before
/// dQ's reads; `ORDER_BAR`, `ORDER_BAR + 1` order the two warpgroups' dQ adds in
/// deterministic mode with the key split (0 is the CTA barrier).
const DS_BAR: u32 = 1;
const ORDER_BAR: u32 = 3;
/// `dq_writer`: consumer `c` waits at `DQ_FREE_BAR + c` for the writer to have read its
/// last staged half, and the writer at `DQ_FULL_BAR + c` for the next (two barriers: a
/// warp that arrives and then syncs on one barrier could count twice in one phase).
const DQ_FREE_BAR: u32 = 5;
const DQ_FULL_BAR: u32 = 7;

pub fn build<'ctx>(kb: &mut Kb<'ctx>, spec: &Spec, cfg: &BwdConfig, name: &str) -> R<KernelInfo> {
    let params = tma_main_params(spec);
    let args = Args::begin(kb, name, &params)?;
    for i in 0..4 {
        kb.mark_tensor_map_param(i)?;
    }
    kb.set_launch_bounds(cfg.threads())?;
    kb.section(&format!(
        "attnc hopper backward: {} ({} consumer warpgroups x 64 keys, {} queries per tile, {} stages, dQ split by {:?})",
        spec.name, cfg.consumers, cfg.block_m, cfg.stages, cfg.dq_split
    ))?;
    let k = Bwd { spec, cfg, args, name: name.to_string(), layout: cfg.smem(spec), grad: ScoreGrad::new(spec) };
    k.body(kb)?;
    kb.ret()?;
    Ok(KernelInfo {
        name: name.to_string(),
        role: KernelRole::BackwardMain,
        note: Some(format!("warp-specialized (TMA producer + {} wgmma warpgroups)", cfg.consumers)),
        threads_per_block: cfg.threads(),
        dynamic_smem_bytes: cfg.smem(spec).request,
        block_m: cfg.block_m,
        block_n: cfg.block_n(),
        params: cabi::describe(&params),
        tensor_maps: tma_boxes(cfg.block_m, cfg.block_n()),
        grid: Grid::KeyTiles { parts: 1, ordered_dq: cfg.ordered_dq(), pair: false },
    })
}

struct Bwd<'a, 'ctx> {
    spec: &'a Spec,
    cfg: &'a BwdConfig,
    args: Args<'ctx>,
    name: String,
    layout: BwdSmem,
    grad: ScoreGrad,
}

/// What a role needs about its CTA, derived after its `setmaxnreg`: the shared view
/// (`cta.bv`, `cta.n_tiles`, … through `Deref`) and the shared-memory base.
struct Cta<'ctx> {
    smem: IntValue<'ctx>,
    view: KeyTileCta<'ctx>,
    /// The grid column whose key tiles the CTA walks when it is not `ctaid.x` (its LPT
    /// place); `None`: the walk reads `ctaid.x` where it starts.
    col: Option<IntValue<'ctx>>,
}

impl<'ctx> std::ops::Deref for Cta<'ctx> {
    type Target = KeyTileCta<'ctx>;
    fn deref(&self) -> &KeyTileCta<'ctx> {
        &self.view
    }
}

/// Which mbarrier.
#[derive(Clone, Copy)]
enum Bar {
    KvFull,
    KvEmpty,
    Full,
    Empty,
    /// Ordered mode: the dQ staging tile is written (issuer → dQ writer), and its bulk
    /// reduce has read it (dQ writer → issuer).
    DqStaged,
    DqFree,
}

impl<'a, 'ctx> Bwd<'a, 'ctx> {
    fn cta(&self, kb: &mut Kb<'ctx>) -> R<Cta<'ctx>> {
        // 1024-byte aligned base (the swizzle atom); the request has the slack.
        let raw = dynamic_smem_base(kb)?;
        let smem = kb.and(kb.add(raw, kb.i32c(1023), "")?, kb.i32c(!1023), "smem")?;
        let (col, hkv, b) = self.cta_coords(kb)?;
        let view = KeyTileCta::for_batch(kb, self.spec, &self.args, b, hkv, self.cfg.block_m, self.cfg.block_n())?;
        Ok(Cta { smem, view, col })
    }

    /// The CTA's (grid column, KV head, batch entry): the grid's, or with
    /// `lpt_sections_mib` under a causal mask in the atomic mode the LPT place of its
    /// linear index (sections of heads; within one, key tile 0 of every head first). A
    /// bijection of the grid either way.
    fn cta_coords(&self, kb: &mut Kb<'ctx>) -> R<(Option<IntValue<'ctx>>, IntValue<'ctx>, IntValue<'ctx>)> {
        let hkv = kb.sreg("ctaid.y", "hkv")?;
        let b = kb.opaque_i32(kb.sreg("ctaid.z", "")?, "b")?;
        let spec = self.spec;
        if self.cfg.lpt_sections_mib == 0 || spec.mask.causal.is_none() {
            return Ok((None, hkv, b));
        }
        let x = kb.sreg("ctaid.x", "")?;
        kb.section("backward: the CTA's place in LPT order")?;
        let cols = kb.sreg("nctaid.x", "")?;
        let linear = kb.add(
            kb.mul(kb.add(kb.mul(b, kb.i32c(i64::from(spec.kv_heads)), "")?, hkv, "")?, cols, "")?,
            x,
            "cta_linear",
        )?;
        // Heads whose Q, dO (bf16) and dQ accumulator (f32) rows fit a section; key tile
        // 0 (the longest walk under a causal mask) first within it.
        let per_row = i64::from(spec.group_size() * (6 * spec.head_dim_qk + 2 * spec.head_dim_v));
        let section_bytes = i64::from(self.cfg.lpt_sections_mib) << 20;
        let section = emit_section_heads(kb, self.args.layout()?.seqlen_q, per_row, spec.kv_heads, section_bytes)?;
        let (lcol, lh, lb) = emit_lpt_place(kb, linear, cols, spec.kv_heads, section)?;
        let atomic = dq_mode_is(kb, &self.args, DqAccumulation::Atomic)?;
        Ok((
            Some(kb.select_i(atomic, lcol, x, "cta_col")?),
            kb.select_i(atomic, lh, hkv, "cta_hkv")?,
            kb.select_i(atomic, lb, b, "cta_b")?,
        ))
    }

    /// The mbarrier `which` (slot `slot` of a ring) of the CTA whose aligned shared
    /// memory starts at `smem`: kv_full, kv_empty, full[stages], empty[stages], dq_staged,
    /// dq_free (`BwdSmem::bars`).
    fn bar_at(&self, kb: &Kb<'ctx>, smem: IntValue<'ctx>, which: Bar, slot: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        let (base, stages) = (self.layout.bars as i64, self.cfg.stages as i64);
        let off = match which {
            Bar::KvFull => kb.i32c(base),
            Bar::KvEmpty => kb.i32c(base + 8),
            Bar::Full => kb.add(kb.i32c(base + 16), kb.mul(slot, kb.i32c(8), "")?, "")?,
            Bar::Empty => kb.add(kb.i32c(base + 16 + 8 * stages), kb.mul(slot, kb.i32c(8), "")?, "")?,
            Bar::DqStaged => kb.i32c(base + 16 + 16 * stages),
            Bar::DqFree => kb.i32c(base + 24 + 16 * stages),
        };
        kb.add(smem, off, "mbar")
    }

    fn bar(&self, kb: &Kb<'ctx>, cta: &Cta<'ctx>, which: Bar, slot: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        self.bar_at(kb, cta.smem, which, slot)
    }

    /// (slot, parity) of ring position `pos`.
    fn ring(&self, kb: &Kb<'ctx>, pos: IntValue<'ctx>) -> R<(IntValue<'ctx>, IntValue<'ctx>)> {
        let s = kb.i32c(self.cfg.stages as i64);
        Ok((kb.urem(pos, s, "qdo_slot")?, kb.and(kb.udiv(pos, s, "")?, kb.i32c(1), "qdo_parity")?))
    }

    /// Whether this thread is the dQ issuer (consumer 0's first thread) in the ordered
    /// mode, where it hands the staged tile to the dQ writer instead of adding it.
    /// Evaluated where it is used, from the launch argument and `tid` (opaque, so not
    /// hoisted): a flag live across the tile costs the consumers registers.
    fn ordered_issuer(&self, kb: &Kb<'ctx>) -> R<IntValue<'ctx>> {
        if !self.cfg.ordered_dq() {
            return Ok(kb.boolc(false));
        }
        let ordered = dq_mode_is(kb, &self.args, DqAccumulation::Ordered)?;
        let tid = kb.opaque_i32(kb.sreg("tid.x", "")?, "")?;
        kb.and(ordered, kb.icmp(IntPredicate::EQ, tid, kb.i32c(128), "")?, "ordered_issuer")
    }

    /// The query walk of key tile `n` (keys `n0 ..`).
    fn queries<'b>(&'b self, kb: &Kb<'ctx>, cta: &'b Cta<'ctx>, n: IntValue<'ctx>) -> R<QueryTiles<'b, 'ctx>> {
        // Measured: the rotated walk spreads the dQ atomics (`BwdConfig::rotate_walk`).
        // Four class loads in flight per step of a walk over a launch's block classes
        // (eight spill in the producer).
        Ok(cta.view.queries(kb, self.spec, &self.args, n, self.cfg.rotate_walk)?.with_probes(4))
    }

    fn body(&self, kb: &mut Kb<'ctx>) -> R<()> {
        let cfg = self.cfg;
        let tid = kb.sreg("tid.x", "tid")?;
        {
            let cta = self.cta(kb)?;
            kb.section("setup: mbarriers (thread 0)")?;
            let is_t0 = kb.icmp(IntPredicate::EQ, tid, kb.i32c(0), "")?;
            kb.if_then(is_t0, "init_barriers", |kb| {
                let consumer_warps = 4 * cfg.consumers;
                kb.mbar_init(self.bar(kb, &cta, Bar::KvFull, kb.i32c(0))?, 1)?;
                kb.mbar_init(self.bar(kb, &cta, Bar::KvEmpty, kb.i32c(0))?, consumer_warps)?;
                kb.mbar_init(self.bar(kb, &cta, Bar::DqStaged, kb.i32c(0))?, 1)?;
                kb.mbar_init(self.bar(kb, &cta, Bar::DqFree, kb.i32c(0))?, 1)?;
                for s in 0..cfg.stages {
                    kb.mbar_init(self.bar(kb, &cta, Bar::Full, kb.i32c(s as i64))?, 1)?;
                    kb.mbar_init(self.bar(kb, &cta, Bar::Empty, kb.i32c(s as i64))?, consumer_warps)?;
                }
                kb.fence_mbarrier_init()
            })?;
            kb.cta_barrier()?;
        }
        super::split_roles(
            kb,
            tid,
            (cfg.producer_regs, cfg.consumer_regs),
            "consumer warpgroups: S^T, dP^T, dV, dK, dQ (wgmma)",
            |kb| {
                kb.section("producer warpgroup: one thread issues the TMA loads")?;
                let tid = kb.opaque_i32(kb.sreg("tid.x", "")?, "tid")?;
                let t0 = kb.icmp(IntPredicate::EQ, tid, kb.i32c(0), "")?;
                if cfg.dq_writer {
                    // Warp 1 (every lane: the named barriers count whole warps) adds the
                    // consumers' staged dQ halves.
                    return kb.if_else(
                        t0,
                        "producer",
                        |kb| self.producer(kb),
                        |kb| {
                            let warp1 = kb.icmp(IntPredicate::EQ, kb.udiv(tid, kb.i32c(32), "")?, kb.i32c(1), "")?;
                            kb.if_then(warp1, "dq_half_writer", |kb| self.dq_half_writer(kb))
                        },
                    );
                }
                if !cfg.ordered_dq() {
                    return kb.if_then(t0, "producer", |kb| self.producer(kb));
                }
                // Ordered mode: warp 1's first thread adds the staged dQ tiles in turn (a
                // branch of its own: after the TMA thread's, anything live across the
                // merge cost that thread registers, and masks with heavier walks spilled).
                kb.if_else(
                    t0,
                    "producer",
                    |kb| self.producer(kb),
                    |kb| {
                        let ordered = dq_mode_is(kb, &self.args, DqAccumulation::Ordered)?;
                        let writer = kb.and(ordered, kb.icmp(IntPredicate::EQ, tid, kb.i32c(32), "")?, "")?;
                        kb.if_then(writer, "dq_writer", |kb| self.dq_writer(kb))
                    },
                )?;
                Ok(())
            },
            |kb| self.consumer(kb),
        )
    }

    /// Each role's walk over its key tiles: `body(key tile, walk index)`.
    fn key_tiles(
        &self,
        kb: &mut Kb<'ctx>,
        cta: &Cta<'ctx>,
        body: impl FnMut(&mut Kb<'ctx>, IntValue<'ctx>, IntValue<'ctx>) -> R<()>,
    ) -> R<()> {
        let reverse = reversed_key_tiles(kb, &self.args, self.cfg.ordered_dq())?;
        match cta.col {
            Some(col) => walk_key_tiles_from(kb, col, cta.n_tiles, reverse, body),
            None => walk_key_tiles(kb, cta.n_tiles, reverse, body),
        }
    }

    /// Every role's walk over the pairs of key tile `qt`: `body(pair, ring position)`;
    /// the position carries over key tiles (`pos`).
    fn pairs(
        &self,
        kb: &mut Kb<'ctx>,
        cta: &Cta<'ctx>,
        qt: &QueryTiles<'_, 'ctx>,
        pos: Slot<'ctx>,
        body: impl FnMut(&mut Kb<'ctx>, QueryPair<'ctx>, IntValue<'ctx>) -> R<()>,
    ) -> R<()> {
        qt.walk(kb, cta.m_tiles, pos, body)
    }

    // ------------------------------------------------------------------ producer

    fn producer(&self, kb: &mut Kb<'ctx>) -> R<()> {
        let spec = self.spec;
        let cfg = self.cfg;
        let l = self.layout;
        let cta = self.cta(kb)?;
        // The tensor maps, and the row coordinate bases and batch coordinate in them.
        let src = cta.tma_sources(kb, spec, &self.name)?;
        let (tmap_q, tmap_k, tmap_v, tmap_do) = (src.q, src.k, src.v, src.d_o);
        let (q_row_base, k_row_base, batch_coord) = (src.q_row, src.k_row, src.batch);
        let pos = kb.slot_i32("p_pos", kb.i32c(0))?;
        let (lse_log2, dpsum) = (self.args.int("lse_log2")?, self.args.int("dpsum")?);
        self.key_tiles(kb, &cta, |kb, n, it| {
            kb.section("TMA K, V tile (once per key tile)")?;
            let bn = cfg.block_n();
            let free = kb.xor(kb.and(it, kb.i32c(1), "")?, kb.i32c(1), "kv_free_parity")?;
            kb.mbar_wait(self.bar(kb, &cta, Bar::KvEmpty, kb.i32c(0))?, free)?;
            let full = self.bar(kb, &cta, Bar::KvFull, kb.i32c(0))?;
            let kv_bytes =
                (Config::col_blocks(spec.head_dim_qk) + Config::col_blocks(spec.head_dim_v)) * bn * ROW_BYTES;
            kb.mbar_arrive_expect_tx(full, kv_bytes)?;
            let row = kb.add(k_row_base, kb.mul(n, kb.i32c(bn as i64), "")?, "key_row")?;
            for (tm, base, d) in [(tmap_k, l.k, spec.head_dim_qk), (tmap_v, l.v, spec.head_dim_v)] {
                for cb in 0..Config::col_blocks(d) {
                    let dst = kb.add(cta.smem, kb.i32c((base + cb * bn * ROW_BYTES) as i64), "tma_dst")?;
                    let c = [kb.i32c((cb * BOX_COLS) as i64), row, cta.hkv, batch_coord];
                    kb.tma_load_4d(dst, tm, c, full)?;
                }
            }
            let qt = self.queries(kb, &cta, n)?;
            self.pairs(kb, &cta, &qt, pos, |kb, p, ring_pos| {
                kb.section("TMA Q, dO tile and bulk copy of its lse_log2, D rows -> ring slot")?;
                let (slot, parity) = self.ring(kb, ring_pos)?;
                let free = kb.xor(parity, kb.i32c(1), "free_parity")?;
                // The TMA thread runs ahead of the consumers and waits here most of the
                // time: suspended rather than spinning on its scheduler.
                kb.mbar_wait_suspend(self.bar(kb, &cta, Bar::Empty, slot)?, free, PRODUCER_WAIT_HINT_NS)?;
                let full = self.bar(kb, &cta, Bar::Full, slot)?;
                let bytes = l.q_per_stage + l.do_per_stage + l.rowvals_per_stage;
                kb.mbar_arrive_expect_tx(full, bytes)?;
                let h = qt.head(kb, p.g)?;
                let m0 = kb.mul(qt.tile_of(kb, p.m)?, kb.i32c(cfg.block_m as i64), "m0")?;
                let row = kb.add(q_row_base, m0, "q_row")?;
                for (tm, base, per, d) in
                    [(tmap_q, l.q, l.q_per_stage, spec.head_dim_qk), (tmap_do, l.d_o, l.do_per_stage, spec.head_dim_v)]
                {
                    let dst0 = kb.add(
                        cta.smem,
                        kb.add(kb.i32c(base as i64), kb.mul(slot, kb.i32c(per as i64), "")?, "")?,
                        "",
                    )?;
                    for cb in 0..Config::col_blocks(d) {
                        let dst = kb.add(dst0, kb.i32c((cb * cfg.block_m * ROW_BYTES) as i64), "tma_dst")?;
                        kb.tma_load_4d(dst, tm, [kb.i32c((cb * BOX_COLS) as i64), row, h, batch_coord], full)?;
                    }
                }
                let ws = kb.mul(ws_row(kb, spec.q_heads, cta.seqlen_pad, cta.bv.b, h, m0)?, kb.i64c(4), "ws_off")?;
                let rv = kb.add(
                    cta.smem,
                    kb.add(kb.i32c(l.rowvals as i64), kb.mul(slot, kb.i32c(l.rowvals_per_stage as i64), "")?, "")?,
                    "rowvals",
                )?;
                let row_bytes = cfg.block_m * 4;
                kb.bulk_load(rv, kb.add(lse_log2, ws, "")?, row_bytes, full)?;
                kb.bulk_load(kb.add(rv, kb.i32c(row_bytes as i64), "")?, kb.add(dpsum, ws, "")?, row_bytes, full)
            })
        })
    }

    // ------------------------------------------------------------------ consumers

    fn consumer(&self, kb: &mut Kb<'ctx>) -> R<()> {
        let spec = self.spec;
        let cta = self.cta(kb)?;
        let tid = kb.opaque_i32(kb.sreg("tid.x", "")?, "tid")?;
        // Warp-uniform by a shuffle from lane 0: ptxas then keeps what derives from it (the
        // wgmma descriptors) in uniform registers instead of moving it there per GEMM.
        let consumer = kb.sub(kb.udiv(tid, kb.i32c(128), "")?, kb.i32c(1), "")?;
        let consumer = kb.shfl_idx_i32(consumer, kb.i32c(0), "consumer")?;
        let ltid = kb.and(tid, kb.i32c(127), "ltid")?;
        let det = self.args.int("deterministic")?;
        let deterministic =
            kb.icmp(IntPredicate::NE, det, kb.i32c(DqAccumulation::Atomic.arg() as i64), "deterministic")?;
        let acc = Accs {
            dk: (0..spec.head_dim_qk / 2).map(|i| kb.slot_f32(&format!("dk{i}"), kb.f32c(0.0))).collect::<R<_>>()?,
            dv: (0..spec.head_dim_v / 2).map(|i| kb.slot_f32(&format!("dv{i}"), kb.f32c(0.0))).collect::<R<_>>()?,
        };
        let pos = kb.slot_i32("c_pos", kb.i32c(0))?;
        let env = Env { cta: &cta, consumer, ltid, tid, deterministic };
        self.key_tiles(kb, &cta, |kb, n, it| {
            let n0 = kb.mul(n, kb.i32c(self.cfg.block_n() as i64), "n0")?;
            for s in acc.dk.iter().chain(&acc.dv) {
                kb.set(*s, kb.f32c(0.0))?;
            }
            kb.mbar_wait(self.bar(kb, &cta, Bar::KvFull, kb.i32c(0))?, kb.and(it, kb.i32c(1), "kv_parity")?)?;
            let qt = self.queries(kb, &cta, n)?;
            let k_inside = kb.icmp(
                IntPredicate::SLE,
                kb.add(n0, kb.i32c(self.cfg.block_n() as i64), "")?,
                cta.bv.seqlen_k,
                "keys_inside",
            )?;
            self.pairs(kb, &cta, &qt, pos, |kb, p, ring_pos| {
                self.tile(kb, &env, &qt, &acc, n0, k_inside, p, ring_pos)
            })?;
            // K and V are no longer read (every GEMM of the walk was waited on).
            let lane = kb.and(ltid, kb.i32c(31), "lane")?;
            kb.mbar_arrive_lane0(self.bar(kb, &cta, Bar::KvEmpty, kb.i32c(0))?, lane)?;
            self.store_dk_dv(kb, &env, &acc, n0)
        })?;
        if self.cfg.dq_writer {
            self.dq_writer_end(kb, &env)?;
        } else if self.cfg.dq_bulk {
            // The last bulk reduce reads shared memory the CTA gives back at exit.
            kb.bulk_wait_group(0)?;
        }
        // Ordered mode: once the writer has taken the last tile, tell it the walk ended.
        kb.if_then(self.ordered_issuer(kb)?, "dq_walk_end", |kb| {
            let visits = kb.get_i(pos, "visits")?;
            let parity = kb.xor(kb.and(visits, kb.i32c(1), "")?, kb.i32c(1), "")?;
            kb.mbar_wait(self.bar(kb, &cta, Bar::DqFree, kb.i32c(0))?, parity)?;
            let z = kb.i32c(0);
            let vals = HandoffVals { row: kb.i64c(0), n: z, mine: z, h: kb.i32c(-1), m: z };
            DqHandoff::at(self, &cta, kb)?.write(kb, vals)?;
            kb.mbar_arrive(self.bar(kb, &cta, Bar::DqStaged, kb.i32c(0))?)
        })?;
        Ok(())
    }

    /// Query tile `p` (ring position `ring_pos`) against this warpgroup's 64 keys.
    #[allow(clippy::too_many_arguments)]
    fn tile(
        &self,
        kb: &mut Kb<'ctx>,
        env: &Env<'_, 'ctx>,
        qt: &QueryTiles<'_, 'ctx>,
        acc: &Accs<'ctx>,
        n0: IntValue<'ctx>,
        k_inside: IntValue<'ctx>,
        p: QueryPair<'ctx>,
        ring_pos: IntValue<'ctx>,
    ) -> R<()> {
        let spec = self.spec;
        let cfg = self.cfg;
        let l = self.layout;
        let cta = env.cta;
        let ty = WgmmaType::from(spec.dtype);
        let h = qt.head(kb, p.g)?;
        let m = qt.tile_of(kb, p.m)?;
        let m0 = kb.mul(m, kb.i32c(cfg.block_m as i64), "m0")?;
        let (slot, parity) = self.ring(kb, ring_pos)?;
        let unmasked = kb.and(qt.full_inside(kb, m, h)?, k_inside, "unmasked")?;
        let stage_addr = |kb: &Kb<'ctx>, base: u32, per: u32, name: &str| {
            kb.add(cta.smem, kb.add(kb.i32c(base as i64), kb.mul(slot, kb.i32c(per as i64), "")?, "")?, name)
        };
        let q_smem = stage_addr(kb, l.q, l.q_per_stage, "q_smem")?;
        let do_smem = stage_addr(kb, l.d_o, l.do_per_stage, "do_smem")?;
        let rowvals = stage_addr(kb, l.rowvals, l.rowvals_per_stage, "rowvals")?;
        // This warpgroup's 64 rows of the K and V tiles.
        let wg_rows = kb.mul(env.consumer, kb.i32c((ROWS_PER_CONSUMER * ROW_BYTES) as i64), "wg_row_bytes")?;
        let k_wg = kb.add(kb.add(cta.smem, kb.i32c(l.k as i64), "")?, wg_rows, "k_wg")?;
        let v_wg = kb.add(kb.add(cta.smem, kb.i32c(l.v as i64), "")?, wg_rows, "v_wg")?;
        let bn = cfg.block_n();
        let bm = cfg.block_m;
        let kmaj = SmemDesc::k_major_sw128(0).encode_without_start();

        // ---- Sᵀ = K·Qᵀ (keys on M, the tile's queries on N); dPᵀ = V·dOᵀ with it, or
        // after P (`dp_with_s` off: its 32 accumulators are not live during P's mask and
        // score-mod work, which spills otherwise)
        kb.mbar_wait(self.bar(kb, cta, Bar::Full, slot)?, parity)?;
        let undef = kb.ctx.f32_type().get_undef();
        let half_m = (bm / 2) as usize;
        let gemm_sdp = |kb: &Kb<'ctx>, a_base: IntValue<'ctx>, b_base: IntValue<'ctx>, d: u32, name: &str| {
            let a0 = kb.wgmma_desc(a_base, kmaj, &format!("{name}_a_desc"))?;
            let b0 = kb.wgmma_desc(b_base, kmaj, &format!("{name}_b_desc"))?;
            let mut accum = vec![undef; half_m];
            for kk in 0..d / 16 {
                let a = kb.add(a0, kb.i64c((k_major_step_offset(bn, kk) >> 4) as i64), "")?;
                let b = kb.add(b0, kb.i64c((k_major_step_offset(bm, kk) >> 4) as i64), "")?;
                let scale = if kk == 0 { Acc::Overwrite } else { Acc::Accumulate };
                accum = kb.wgmma_ss(ty, bm, &accum, a, b, scale, Major::K, Major::K, name)?;
            }
            Ok::<_, crate::error::LowerError>(accum)
        };
        kb.section(&if cfg.dp_with_s {
            format!("wgmma S^T = K*Q^T and dP^T = V*dO^T (ss, N = {bm} queries)")
        } else {
            format!("wgmma S^T = K*Q^T (ss, N = {bm} queries)")
        })?;
        kb.wgmma_fence()?;
        let s = gemm_sdp(kb, k_wg, q_smem, spec.head_dim_qk, "s")?;
        kb.wgmma_commit_group()?;
        // dPᵀ in a group of its own: it runs while P is computed (waited on before dS).
        let early_dp = if cfg.dp_with_s {
            let dp = gemm_sdp(kb, v_wg, do_smem, spec.head_dim_v, "dp")?;
            kb.wgmma_commit_group()?;
            Some(dp)
        } else {
            None
        };
        // The mask of a partial tile, one bit per fragment element, while Sᵀ is in flight:
        // only dK, dV and Sᵀ are live then, so the mask's positions and aux reads have
        // the registers they need (computed next to P, they spilled).
        let mask_bits = self.mask_bits(kb, env, unmasked, n0, m0, h)?;
        // The rows' lse_log2 and D: read while the GEMMs they wait for are in flight
        // (`rows_early`), or right before their use.
        let pos = self.frag_pos(kb, env, n0)?;
        let lse_early = if cfg.rows_early { Some(row_vals(kb, rowvals, &pos, half_m, 0, "lse_log2")?) } else { None };
        let s = kb.wgmma_wait_group_acc(u32::from(early_dp.is_some()), &s, "s")?;
        let lse = match lse_early {
            Some(v) => v,
            None => row_vals(kb, rowvals, &pos, half_m, 0, "lse_log2")?,
        };

        // ---- Pᵀ (fragment element e of 8-column tile i: key row r + 8·(e/2), query
        // column 8i + 2·(lane % 4) + e % 2)
        let pt = self.recompute_p(kb, env, &lse, unmasked, &mask_bits, n0, m0, h, &s)?;

        // ---- dV += Pᵀ·dO (A from registers; B the stage's dO read MN-major: queries
        // are the K dimension), and dPᵀ when it was left for now
        kb.section("wgmma dV += P^T*dO (rs, A from registers)")?;
        kb.wgmma_fence()?;
        let mn_tile = SmemDesc::mn_major_sw128(0, bm * ROW_BYTES).encode_without_start();
        let rs_gemm = |kb: &Kb<'ctx>, accum: &[FloatValue<'ctx>], ops: &[IntValue<'ctx>], b_base, d, name: &str| {
            let b0 = kb.wgmma_desc(b_base, mn_tile, "")?;
            let mut accum = accum.to_vec();
            for j in 0..bm / 16 {
                let b = kb.add(b0, kb.i64c((mn_major_step_offset(j) >> 4) as i64), "")?;
                let j = j as usize;
                let a = [ops[4 * j], ops[4 * j + 1], ops[4 * j + 2], ops[4 * j + 3]];
                accum = kb.wgmma_rs(ty, d, &accum, a, b, Acc::Accumulate, Major::Mn, name)?;
            }
            Ok::<_, crate::error::LowerError>(accum)
        };
        let dv_in: Vec<FloatValue<'ctx>> = acc.dv.iter().map(|x| kb.get_f(*x, "dv")).collect::<R<_>>()?;
        let d_early = |kb: &Kb<'ctx>| -> R<Option<Vec<FloatValue<'ctx>>>> {
            if cfg.rows_early {
                Ok(Some(row_vals(kb, rowvals, &pos, half_m, bm * 4, "d_row")?))
            } else {
                Ok(None)
            }
        };
        let (dp, dv, d_rows) = match early_dp {
            Some(dp) => {
                let dv = rs_gemm(kb, &dv_in, &pt.ops, do_smem, spec.head_dim_v, "dv")?;
                kb.wgmma_commit_group()?;
                let d_rows = d_early(kb)?;
                // dPᵀ done; dV may still be in flight.
                (kb.wgmma_wait_group_acc(1, &dp, "dp")?, dv, d_rows)
            }
            None => {
                kb.section(&format!("wgmma dP^T = V*dO^T (ss, N = {bm} queries)"))?;
                let dp = gemm_sdp(kb, v_wg, do_smem, spec.head_dim_v, "dp")?;
                kb.wgmma_commit_group()?;
                let dv = rs_gemm(kb, &dv_in, &pt.ops, do_smem, spec.head_dim_v, "dv")?;
                kb.wgmma_commit_group()?;
                let d_rows = d_early(kb)?;
                // dPᵀ done; dV may still be in flight.
                (kb.wgmma_wait_group_acc(1, &dp, "dp")?, dv, d_rows)
            }
        };
        let d_rows = match d_rows {
            Some(v) => v,
            None => row_vals(kb, rowvals, &pos, half_m, bm * 4, "d_row")?,
        };

        // ---- dSᵀ, dK += dSᵀ·Q (B the stage's Q, MN-major) and dSᵀ → shared memory (dQ's
        // A operand, MN-major: key rows of 64 queries), dQ = dS·K. `dq_under_dk`: dQ
        // first, and dQ goes out (staging stores and reduce, or reds) under the dK GEMM;
        // otherwise dK first and every GEMM waited on before dQ goes out.
        let ds_ops = self.grad_scores(kb, env, &d_rows, n0, m0, h, &pt, &dp)?;
        let dq_n = match cfg.dq_split {
            DqSplit::Columns => spec.head_dim_qk / 2,
            DqSplit::Keys | DqSplit::Rows => spec.head_dim_qk,
            // dQᵀ: N is the tile's queries.
            DqSplit::Transposed => cfg.block_m,
        };
        let dk_in: Vec<FloatValue<'ctx>> = acc.dk.iter().map(|x| kb.get_f(*x, "dk")).collect::<R<_>>()?;
        let issue_dk = |kb: &mut Kb<'ctx>| -> R<Vec<FloatValue<'ctx>>> {
            kb.section(if cfg.dq_under_dk {
                "wgmma dK += dS^T*Q (rs, A from registers), in flight while dQ goes out"
            } else {
                "wgmma dK += dS^T*Q (rs, A from registers)"
            })?;
            kb.wgmma_fence()?;
            let dk = rs_gemm(kb, &dk_in, &ds_ops, q_smem, spec.head_dim_qk, "dk")?;
            kb.wgmma_commit_group()?;
            Ok(dk)
        };
        let issue_dq = |kb: &mut Kb<'ctx>| -> R<Vec<FloatValue<'ctx>>> {
            if cfg.diag.no_dq {
                return Ok(Vec::new());
            }
            self.gemm_dq(kb, env, ring_pos, wg_rows, k_wg, dq_n, &ds_ops)
        };
        // Q, dO and their rows are no longer read once every GEMM of the tile is done.
        let release_slot = |kb: &mut Kb<'ctx>| -> R<()> {
            let lane = kb.and(env.ltid, kb.i32c(31), "lane")?;
            kb.mbar_arrive_lane0(self.bar(kb, cta, Bar::Empty, slot)?, lane)
        };
        let ndv = dv.len();
        let dk = if cfg.dq_under_dk {
            let dq = issue_dq(kb)?;
            let dk = issue_dk(kb)?;
            // dV and dQ done (their groups precede dK's).
            let done = kb.wgmma_wait_group_acc(1, &[dv, dq].concat(), "dv_dq")?;
            for (slot, v) in acc.dv.iter().zip(&done[..ndv]) {
                kb.set(*slot, *v)?;
            }
            self.add_dq(kb, env, n0, p, h, m, m0, dq_n, &done[ndv..])?;
            let dk = kb.wgmma_wait_group_acc(0, &dk, "dk")?;
            release_slot(kb)?;
            dk
        } else {
            let dk = issue_dk(kb)?;
            let dq = issue_dq(kb)?;
            let ndk = dk.len();
            let all = kb.wgmma_wait_group_acc(0, &[dv, dk, dq].concat(), "dkv_dq")?;
            for (slot, v) in acc.dv.iter().zip(&all[..ndv]) {
                kb.set(*slot, *v)?;
            }
            release_slot(kb)?;
            self.add_dq(kb, env, n0, p, h, m, m0, dq_n, &all[ndv + ndk..])?;
            all[ndv..ndv + ndk].to_vec()
        };
        for (slot, v) in acc.dk.iter().zip(&dk) {
            kb.set(*slot, *v)?;
        }
        Ok(())
    }

    /// The interval form of the mask (`BwdConfig::row_keys`), where it applies.
    fn row_keys(&self) -> Option<RowKeys> {
        RowKeys::of(self.spec).filter(|_| self.cfg.row_keys)
    }

    /// Mask words per thread: dense (element `idx` at bit `idx % 32` of word `idx / 32`),
    /// or with `row_keys` each key row's own (`pair_word`: its `block_m / 4` elements in
    /// fragment order, 32 a word).
    fn mask_words(&self) -> usize {
        let elems = (self.cfg.block_m / 2) as usize;
        match self.row_keys() {
            Some(_) => 2 * self.cfg.block_m.div_ceil(64) as usize,
            None => elems.div_ceil(32),
        }
    }

    /// Where element `idx`'s bit is in the mask words ([`Bwd::mask_words`]): with row
    /// keys, key row `idx % 4 / 2`, its element `t = 2 (idx / 4) + idx % 2`.
    fn mask_bit_of(&self, idx: usize) -> (usize, u32) {
        match self.row_keys() {
            Some(_) => {
                let t = 2 * (idx / 4) + idx % 2;
                let per_row = self.cfg.block_m.div_ceil(64) as usize;
                ((idx % 4) / 2 * per_row + t / 32, (t % 32) as u32)
            }
            None => (idx / 32, (idx % 32) as u32),
        }
    }

    /// This thread's place in the Sᵀ fragment of the tile at keys `n0`.
    fn frag_pos(&self, kb: &Kb<'ctx>, env: &Env<'_, 'ctx>, n0: IntValue<'ctx>) -> R<FragPos<'ctx>> {
        let lane = kb.and(env.ltid, kb.i32c(31), "lane")?;
        let warp = kb.udiv(env.ltid, kb.i32c(32), "warp_in_wg")?;
        let key0 = kb.add(
            kb.add(n0, kb.mul(env.consumer, kb.i32c(ROWS_PER_CONSUMER as i64), "")?, "")?,
            kb.add(kb.mul(warp, kb.i32c(16), "")?, kb.udiv(lane, kb.i32c(4), "")?, "")?,
            "key0",
        )?;
        let col0 = kb.mul(kb.and(lane, kb.i32c(3), "")?, kb.i32c(2), "q_col0")?;
        Ok(FragPos { key0, col0 })
    }

    /// The mask of the tile for this thread's `block_m / 2` fragment elements, one 32-bit
    /// word per 32 (bit `idx % 32` of word `idx / 32` set where element `idx` is allowed:
    /// the key inside seqlen_k, the query inside seqlen_q, the mask true); all ones on a
    /// full tile, where nothing reads it.
    fn mask_bits(
        &self,
        kb: &mut Kb<'ctx>,
        env: &Env<'_, 'ctx>,
        unmasked: IntValue<'ctx>,
        n0: IntValue<'ctx>,
        m0: IntValue<'ctx>,
        h: IntValue<'ctx>,
    ) -> R<Vec<IntValue<'ctx>>> {
        let spec = self.spec;
        let cta = env.cta;
        let elems = (self.cfg.block_m / 2) as usize;
        let bits: Vec<Slot<'ctx>> =
            (0..self.mask_words()).map(|_| kb.slot_i32("mask_bits", kb.i32c(-1))).collect::<R<_>>()?;
        let partial = kb.not(unmasked, "partial_tile")?;
        // Element idx's 0/1 bit into bit idx % 32 of word idx / 32, the words into `bits`.
        let store_words = |kb: &mut Kb<'ctx>, bit_of: &mut dyn FnMut(&mut Kb<'ctx>, usize) -> R<IntValue<'ctx>>| {
            let mut acc = vec![kb.i32c(0); bits.len()];
            for idx in 0..elems {
                let bit = bit_of(kb, idx)?;
                acc[idx / 32] = kb.or(acc[idx / 32], kb.shl(bit, kb.i32c((idx % 32) as i64), "")?, "")?;
            }
            bits.iter().zip(acc).try_for_each(|(slot, a)| kb.set(*slot, a))
        };
        let evaluate = |kb: &mut Kb<'ctx>| -> R<()> {
            kb.section("mask (partial tile): one bit per element")?;
            let pos = self.frag_pos(kb, env, n0)?;
            // A causal bound and/or a window (`row_keys`): each key row's queries as
            // bounds relative to the thread's first query column, then its elements' bits
            // as one range per word (`pair_word`).
            if let Some(keys) = self.row_keys() {
                let q_base = kb.add(m0, pos.col0, "q_base")?;
                let mut words = Vec::new();
                for half in 0..2 {
                    let key = kb.add(pos.key0, kb.i32c(8 * half), "key")?;
                    let (lo, hi) = keys.emit_queries(kb, key, cta.bv.seqlen_q, cta.bv.seqlen_k)?;
                    let (lo, hi) = (kb.sub(lo, q_base, "col_lo")?, kb.sub(hi, q_base, "col_hi")?);
                    for w in 0..self.cfg.block_m.div_ceil(64) {
                        words.push(pair_word(kb, w, lo, hi)?);
                    }
                }
                return bits.iter().zip(words).try_for_each(|(slot, w)| kb.set(*slot, w));
            }
            let predicate = spec.mask.to_predicate();
            store_words(kb, &mut |kb, idx| {
                let q = pos.q(kb, m0, idx)?;
                let key = pos.key(kb, idx)?;
                let vars = cta.bv.elem_vars(cta.hkv, q, h, key);
                let q_in = kb.icmp(IntPredicate::SLT, q, cta.bv.seqlen_q, "q_in_bounds")?;
                let allowed = kb.and(vexpr::allowed(kb, spec, predicate.as_ref(), &vars, &cta.va)?, q_in, "")?;
                kb.zext32(allowed, "")
            })
        };
        let lists = self.args.block_lists().filter(|_| self.cfg.mask_bits && needs_block_mask(spec));
        match lists {
            // The classifier wrote this tile's bits (`BlockLayout::DenseWithBits`) where its
            // class word names a slot: key rows of block_m / 32 words.
            Some(lists) => kb.if_then(partial, "mask_bits", |kb| {
                let head_slot = BlockListArgs::head_slot(kb, HeadSlots::for_spec(spec, false), h, h);
                let m = kb.udiv(m0, kb.i32c(self.cfg.block_m as i64), "m_tile")?;
                let n = kb.udiv(n0, kb.i32c(self.cfg.block_n() as i64), "n_tile")?;
                let word = lists.class_word(kb, cta.bv.b, head_slot, m, n)?;
                let slot = kb.lshr(word, kb.i32c(8), "bits_slot")?;
                let has = kb.icmp(IntPredicate::NE, slot, kb.i32c(0), "has_bits")?;
                kb.if_else(
                    has,
                    "tile_bits",
                    |kb| {
                        kb.section("mask (partial tile): the classifier's bits")?;
                        let row = lists.row(kb, cta.bv.b, head_slot, m)?;
                        let words_per_row = self.cfg.block_m.div_ceil(32);
                        let tile_words = self.cfg.block_n() * words_per_row;
                        let base = lists.bits_addr(kb, row, slot, tile_words)?;
                        let pos = self.frag_pos(kb, env, n0)?;
                        let key_local = kb.sub(pos.key0, n0, "key_local")?;
                        let mut rows = Vec::new();
                        for half in 0..2 {
                            let r = kb.add(key_local, kb.i32c(8 * half), "")?;
                            let addr = kb.add(
                                base,
                                kb.mul(kb.zext64(r, "")?, kb.i64c(4 * words_per_row as i64), "")?,
                                "bits_row_addr",
                            )?;
                            let words = kb.ld_global_nc_v_b32(addr, words_per_row, "bits")?;
                            rows.push(
                                words
                                    .into_iter()
                                    .map(|w| kb.lshr(w, pos.col0, "bits_lane"))
                                    .collect::<R<Vec<IntValue<'ctx>>>>()?,
                            );
                        }
                        // Element idx: key row idx % 4 / 2, query column 8 (idx / 4) + idx % 2
                        // past the lane's first.
                        store_words(kb, &mut |kb, idx| {
                            let (i, e) = (idx / 4, idx % 4);
                            let col = 8 * i + e % 2;
                            let w = rows[e / 2][col / 32];
                            kb.and(kb.lshr(w, kb.i32c((col % 32) as i64), "")?, kb.i32c(1), "")
                        })
                    },
                    |kb| evaluate(kb),
                )
            })?,
            None => kb.if_then(partial, "mask_bits", evaluate)?,
        }
        bits.iter().map(|b| kb.get_i(*b, "mask_bits")).collect()
    }

    /// Pᵀ of the tile from the f32 Sᵀ fragment: the score mod (and what its derivative
    /// needs), P = 2^(s − lse_log2), the mask on partial tiles; packed in the element
    /// type (the A fragment of dV += Pᵀ·dO).
    #[allow(clippy::too_many_arguments)]
    fn recompute_p(
        &self,
        kb: &mut Kb<'ctx>,
        env: &Env<'_, 'ctx>,
        lse: &[FloatValue<'ctx>],
        unmasked: IntValue<'ctx>,
        mask_bits: &[IntValue<'ctx>],
        n0: IntValue<'ctx>,
        m0: IntValue<'ctx>,
        h: IntValue<'ctx>,
        s: &[FloatValue<'ctx>],
    ) -> R<PTile<'ctx>> {
        let spec = self.spec;
        let cta = env.cta;
        kb.section("softmax recompute: P^T = 2^(s - lse_log2) (exp2 domain)")?;
        if self.cfg.diag.no_softmax {
            let ops = kb.pack_pairs(spec.dtype, s, "packed")?;
            return Ok(PTile {
                ops,
                p_f32: Vec::new(),
                p_smem: None,
                slope: vec![None; s.len()],
                pre_d: vec![Vec::new(); s.len()],
            });
        }
        let pos = self.frag_pos(kb, env, n0)?;
        let n = s.len();
        let mut p = vec![kb.f32c(0.0); n];
        let mut slope: Vec<Option<FloatValue<'ctx>>> = vec![None; n];
        let mut pre_d: Vec<Vec<Option<FloatValue<'ctx>>>> = vec![Vec::new(); n];
        for idx in 0..n {
            let lse2 = lse[idx];
            let x = if self.grad.has_score_mod() {
                let vars = cta.bv.elem_vars(cta.hkv, pos.q(kb, m0, idx)?, h, pos.key(kb, idx)?);
                let el = self.grad.logit(kb, spec, s[idx], vars, &cta.va)?;
                slope[idx] = el.slope;
                pre_d[idx] = el.aux_d;
                kb.fsub(el.s_log2, lse2, "")?
            } else {
                // s·scale·log2(e) − lse_log2 in one rounding (one FFMA, not FMUL + FADD).
                kb.fma(s[idx], kb.f32c(spec.scale_value() * LOG2E), kb.fneg(lse2, "")?, "s_log2")?
            };
            let every = self.cfg.exp2_emulate_every as usize;
            p[idx] = if every > 0 && idx % every == every - 1 {
                crate::variant::softmax::exp2_emulated(kb, x)?
            } else {
                kb.ex2(x, "p")?
            };
        }
        // Partial tiles: the mask's zeros (keys past seqlen_k, queries past seqlen_q, the
        // mask) into P.
        let slots: Vec<Slot<'ctx>> = p.iter().map(|v| kb.slot_f32("p", *v)).collect::<R<_>>()?;
        let partial = kb.not(unmasked, "partial_tile")?;
        kb.if_then(partial, "mask_tile", |kb| {
            kb.section("mask (partial tile): P = 0 where the bit is clear")?;
            for (idx, slot) in slots.iter().enumerate() {
                let (word, bit) = self.mask_bit_of(idx);
                let bit = kb.and(kb.lshr(mask_bits[word], kb.i32c(bit as i64), "")?, kb.i32c(1), "")?;
                let allowed = kb.icmp(IntPredicate::NE, bit, kb.i32c(0), "allowed")?;
                let v = kb.get_f(*slot, "")?;
                kb.set(*slot, kb.select_f(allowed, v, kb.f32c(0.0), "p_masked")?)?;
            }
            Ok(())
        })?;
        for (v, slot) in p.iter_mut().zip(&slots) {
            *v = kb.get_f(*slot, "p")?;
        }
        let ops = kb.pack_pairs(spec.dtype, &p, "packed")?;
        // dS uses P rounded to the element type (it is rounded for its GEMMs anyway), so
        // only the packed copy stays live; learnable aux gradients keep the f32 P (their
        // sums over keys can cancel, see docs/backward.md).
        let aux = self.grad.has_aux_terms();
        let (p_f32, p_smem) = match (aux || self.cfg.p_f32_for_ds, aux && self.cfg.p_in_smem_used(spec)) {
            (false, _) => (Vec::new(), None),
            (true, false) => (p, None),
            (true, true) => {
                kb.section("f32 P -> shared memory (learnable aux gradients read it with dS)")?;
                let thread = kb.add(kb.mul(env.consumer, kb.i32c(128), "")?, env.ltid, "p_thread")?;
                let base = kb.add(
                    kb.add(cta.smem, kb.i32c(self.layout.p_f32 as i64), "")?,
                    kb.mul(thread, kb.i32c(4), "")?,
                    "p_smem",
                )?;
                for (idx, v) in p.iter().enumerate() {
                    kb.st_shared_f32(kb.add(base, kb.i32c((idx * 256 * 4) as i64), "")?, *v)?;
                }
                (Vec::new(), Some(base))
            }
        };
        Ok(PTile { ops, p_f32, p_smem, slope, pre_d })
    }

    /// dSᵀ = Pᵀ ∘ (dPᵀ − D) ∘ m′ (and the learnable aux gradients), packed: the A
    /// fragment of dK += dSᵀ·Q and what goes to shared memory for dQ.
    #[allow(clippy::too_many_arguments)]
    fn grad_scores(
        &self,
        kb: &mut Kb<'ctx>,
        env: &Env<'_, 'ctx>,
        d_rows: &[FloatValue<'ctx>],
        n0: IntValue<'ctx>,
        m0: IntValue<'ctx>,
        h: IntValue<'ctx>,
        pt: &PTile<'ctx>,
        dp: &[FloatValue<'ctx>],
    ) -> R<Vec<IntValue<'ctx>>> {
        let spec = self.spec;
        let cta = env.cta;
        kb.section("dS^T = P^T * (dP^T - D) (and learnable aux gradients)")?;
        if self.cfg.diag.no_softmax {
            return kb.pack_pairs(spec.dtype, dp, "packed");
        }
        let pos = self.frag_pos(kb, env, n0)?;
        let n = dp.len();
        // The f32 P where it was kept: in registers, or parked in shared memory
        // (`BwdConfig::p_in_smem`) and read back once; else the packed P is unpacked.
        let p_f32: Vec<FloatValue<'ctx>> = match pt.p_smem {
            Some(base) => {
                (0..dp.len()).map(|idx| kb.ld_shared_f32_at(base, (idx * 256 * 4) as i64, "p")).collect::<R<_>>()?
            }
            None => pt.p_f32.clone(),
        };
        let p_at = |kb: &Kb<'ctx>, idx: usize| -> R<FloatValue<'ctx>> {
            if let Some(v) = p_f32.get(idx) {
                return Ok(*v);
            }
            let (lo, hi) = kb.unpack_half2(spec.dtype, pt.ops[idx / 2], "p")?;
            Ok(if idx % 2 == 0 { lo } else { hi })
        };
        let mut ds = vec![kb.f32c(0.0); n];
        for idx in 0..n {
            ds[idx] = kb.fmul(p_at(kb, idx)?, kb.fsub(dp[idx], d_rows[idx], "")?, "ds")?;
        }
        if self.grad.has_aux_terms() {
            let sink = aux_sink(kb, spec, &self.args, env.deterministic, self.cfg.threads() / 32, env.tid)?;
            let mut elems = Vec::new();
            for idx in 0..n {
                let vars = cta.bv.elem_vars(cta.hkv, pos.q(kb, m0, idx)?, h, pos.key(kb, idx)?);
                elems.push((vars, p_at(kb, idx)?, ds[idx], pt.pre_d[idx].clone()));
            }
            self.grad.accumulate_aux(kb, spec, &cta.va, &elems, &sink)?;
        }
        if self.grad.has_score_mod() {
            for idx in 0..n {
                if let Some(sl) = pt.slope[idx] {
                    // Where P is 0 (masked, or a logit of −∞) the gradient is 0, whatever
                    // the slope is there.
                    let p_zero = kb.fcmp(FloatPredicate::OEQ, p_at(kb, idx)?, kb.f32c(0.0), "")?;
                    let g = kb.fmul(ds[idx], sl, "")?;
                    ds[idx] = kb.select_f(p_zero, kb.f32c(0.0), g, "dscore")?;
                }
            }
        }
        kb.pack_pairs(spec.dtype, &ds, "packed")
    }

    /// dK (times the softmax scale) and dV of this warpgroup's keys inside seqlen_k.
    fn store_dk_dv(&self, kb: &mut Kb<'ctx>, env: &Env<'_, 'ctx>, acc: &Accs<'ctx>, n0: IntValue<'ctx>) -> R<()> {
        let spec = self.spec;
        let cta = env.cta;
        kb.section("epilogue: dK *= scale, store dK, dV")?;
        let lane = kb.and(env.ltid, kb.i32c(31), "lane")?;
        let warp = kb.udiv(env.ltid, kb.i32c(32), "warp_in_wg")?;
        let quad_row = kb.udiv(lane, kb.i32c(4), "quad_row")?;
        let quad_col = kb.and(lane, kb.i32c(3), "quad_col")?;
        let (dk_st, dv_st) = (self.args.strides("dk")?, self.args.strides("dv")?);
        let scale = kb.f32c(spec.scale_value());
        for half in 0..2i64 {
            let key = kb.add(
                kb.add(n0, kb.mul(env.consumer, kb.i32c(ROWS_PER_CONSUMER as i64), "")?, "")?,
                kb.add(kb.mul(warp, kb.i32c(16), "")?, kb.add(quad_row, kb.i32c(8 * half), "")?, "")?,
                "key",
            )?;
            let inside = kb.icmp(IntPredicate::SLT, key, cta.bv.seqlen_k, "")?;
            kb.if_then(inside, "store_key", |kb| {
                let (ko, vo) = kv_row_offsets(kb, spec, &cta.la, &cta.bv, &dk_st, &dv_st, key, cta.hkv)?;
                for (slots, off, base, d, mul) in [
                    (&acc.dk, ko, self.args.int("dk")?, spec.head_dim_qk, Some(scale)),
                    (&acc.dv, vo, self.args.int("dv")?, spec.head_dim_v, None),
                ] {
                    let row = kb.add(base, kb.mul(off, kb.i64c(2), "")?, "")?;
                    for i in 0..d / 8 {
                        let e = (4 * i) as usize + 2 * half as usize;
                        let mut x0 = kb.get_f(slots[e], "")?;
                        let mut x1 = kb.get_f(slots[e + 1], "")?;
                        if let Some(sc) = mul {
                            x0 = kb.fmul(x0, sc, "")?;
                            x1 = kb.fmul(x1, sc, "")?;
                        }
                        let packed = kb.pack_half2(spec.dtype, x0, x1, "grad_pair")?;
                        let col = kb.add(kb.mul(quad_col, kb.i32c(2), "")?, kb.i32c(i as i64 * 8), "")?;
                        kb.st_global_b32(kb.add(row, kb.mul(kb.zext64(col, "")?, kb.i64c(2), "")?, "")?, packed)?;
                    }
                }
                Ok(())
            })?;
        }
        Ok(())
    }
}

/// A tile's Pᵀ between its recompute and dS.
struct PTile<'ctx> {
    /// Packed in the element type: the A fragment of dV += Pᵀ·dO (k step j: `ops[4j..4j+4]`).
    ops: Vec<IntValue<'ctx>>,
    /// The f32 P, kept only for learnable aux gradients: in registers, or this thread's
    /// first word of it in shared memory (`BwdConfig::p_in_smem`).
    p_f32: Vec<FloatValue<'ctx>>,
    p_smem: Option<IntValue<'ctx>>,
    /// Per element: the score mod's `∂m/∂score` (None: 1) and its aux derivatives.
    slope: Vec<Option<FloatValue<'ctx>>>,
    pre_d: Vec<Vec<Option<FloatValue<'ctx>>>>,
}

/// A thread's place in an Sᵀ-shaped fragment (keys on rows, the tile's queries on
/// columns): element `idx` sits at key `key0 + 8·(idx % 4 / 2)` and query column
/// `col0 + 8·(idx / 4) + idx % 2`.
struct FragPos<'ctx> {
    key0: IntValue<'ctx>,
    col0: IntValue<'ctx>,
}

impl<'ctx> FragPos<'ctx> {
    fn key(&self, kb: &Kb<'ctx>, idx: usize) -> R<IntValue<'ctx>> {
        kb.add(self.key0, kb.i32c(if idx % 4 >= 2 { 8 } else { 0 }), "key")
    }
    /// The query column within the tile.
    fn col(&self, kb: &Kb<'ctx>, idx: usize) -> R<IntValue<'ctx>> {
        kb.add(self.col0, kb.i32c(col_in_tile(idx)), "")
    }
    /// The query position of a tile starting at `m0`.
    fn q(&self, kb: &Kb<'ctx>, m0: IntValue<'ctx>, idx: usize) -> R<IntValue<'ctx>> {
        kb.add(m0, self.col(kb, idx)?, "q")
    }
}

/// The query column (within the tile, past `2·(lane % 4)`) of accumulator element `idx`:
/// 8-column tile `idx / 4`, column `idx % 2` of its pair.
fn col_in_tile(idx: usize) -> i64 {
    (8 * (idx / 4) + idx % 2) as i64
}

/// lse_log2 (`off` 0) or D (`off` = block_m·4) of the queries of fragment elements
/// `0..n`, from the stage's row values in shared memory. An 8-column group's two columns
/// are adjacent (elements `4g, 4g + 2` and `4g + 1, 4g + 3` share them): one
/// `ld.shared.v2.f32` per group, at an immediate offset from one base register.
fn row_vals<'ctx>(
    kb: &Kb<'ctx>,
    rowvals: IntValue<'ctx>,
    pos: &FragPos<'ctx>,
    n: usize,
    off: u32,
    name: &str,
) -> R<Vec<FloatValue<'ctx>>> {
    let base = kb.add(rowvals, kb.mul(pos.col0, kb.i32c(4), "")?, &format!("{name}_base"))?;
    let mut out = Vec::with_capacity(n);
    for group in 0..n.div_ceil(4) {
        let pair = kb.ld_shared_v2_f32(base, off as i64 + 4 * col_in_tile(4 * group), name)?;
        out.extend((4 * group..(4 * group + 4).min(n)).map(|idx| pair[idx % 2]));
    }
    Ok(out)
}

/// What a consumer's tiles share.
struct Env<'a, 'ctx> {
    cta: &'a Cta<'ctx>,
    /// 0 or 1: which 64 keys of the CTA's tile.
    consumer: IntValue<'ctx>,
    /// Thread index within the warpgroup, and within the CTA.
    ltid: IntValue<'ctx>,
    tid: IntValue<'ctx>,
    /// Any deterministic mode (`DqAccumulation`).
    deterministic: IntValue<'ctx>,
}

/// dK and dV accumulators of a consumer thread (wgmma D fragments, d/2 f32 each).
struct Accs<'ctx> {
    dk: Vec<Slot<'ctx>>,
    dv: Vec<Slot<'ctx>>,
}
