//! The hopper forward kernel: warp-specialized, TMA-fed, wgmma on sm_90a
//! (FlashAttention-3's shape).
//!
//! ```text
//! warpgroup 0 (producer, setmaxnreg.dec)     warpgroups 1..=C (consumers, setmaxnreg.inc)
//!   one thread:                                 Q rows (64 per warpgroup) via cp.async
//!   for each non-empty key tile t:              S = Q·K[t0]ᵀ ; softmax → P
//!     wait empty_k[slot]; TMA K[t] → full_k     for each next tile t:
//!     wait empty_v[slot]; TMA V[t] → full_v       issue S' = Q·K[t]ᵀ      (wgmma ss)
//!                                                 issue O += P·V[t-1]     (wgmma rs, P in registers)
//!                                                 wait S'; release K[t]; softmax(S') → P', α
//!                                                 wait O;  release V[t-1]; O *= α
//!                                               O += P·V[last]; O /= l; store O (and LSE)
//! ```
//! The softmax of one tile runs while that warpgroup's next `S` GEMM and its `P·V` GEMM
//! are in flight (intra-warpgroup overlap), and the consumer warpgroups interleave
//! naturally. Producer and consumers walk the same tile sequence ([`KeyTiles`]): empty
//! tiles are skipped by both, so the ring positions agree.

use super::config::{Config, RingBar, BOX_COLS, ROWS_PER_CONSUMER, ROW_BYTES};
use super::desc::SmemDesc;
use crate::families::common::abi::{self as cabi, Args, ParamTy};
use crate::families::common::combine::{fused_tail, FusedCombine};
use crate::families::common::epilogue::{finish_row, FragRow, RowStore};
use crate::families::common::sw128::{k_major_step_offset, mn_major_step_offset};
use crate::llvm::kb::{Kb, Slot, R};
use crate::llvm::operand::Major;
use crate::llvm::tcgen05::Acc;
use crate::llvm::wgmma::WgmmaType;
use crate::module::{Grid, KernelInfo, KernelRole, TmaBox};
use crate::variant::expr::{self as vexpr, VariantArgs};
use crate::variant::layout::{batch_view, packed_row, q_row_offset, row_tile_ranges, BatchView, LayoutArgs};
use crate::variant::softmax::{exp2_emulated, max_update};
use crate::variant::tiles::{KeyTiles, RowList};
use attnc_ir::{KvLayout, Spec};
use inkwell::values::{BasicMetadataValueEnum, FloatValue, IntValue};
use inkwell::{AddressSpace, IntPredicate};

mod consumer_walk;
mod mask;
mod producer;
mod work_tiles;

use producer::{GatherWarp, PagedTma};
use work_tiles::{TileRole, WorkAt};

const LOG2E: f64 = std::f64::consts::LOG2_E;
/// Named barriers: 1 + c guards consumer c's Q load; `PINGPONG_BAR + c` is consumer c's
/// turn to issue GEMMs (0 is the CTA barrier).
const PINGPONG_BAR: u32 = 3;
/// Named barrier of the fused split-KV combine (every consumer thread).
const COMBINE_BAR: u32 = 7;

/// The forward kernel's parameters: the K and V tensor maps (not with the gather
/// producer), then the portable family's list (so the runtime marshals both families
/// alike).
pub fn forward_params(spec: &Spec, cfg: &Config) -> Vec<(String, ParamTy)> {
    let mut p = Vec::new();
    if !cfg.gather {
        p.push(("tmap_k".to_string(), ParamTy::TensorMap));
        p.push(("tmap_v".to_string(), ParamTy::TensorMap));
    }
    p.extend(cabi::forward_params(spec));
    if spec.split_kv != attnc_ir::SplitKv::None {
        // The fused combine's row-block counters (`common::combine::fused_tail`).
        p.push((cabi::SPLIT_COUNTERS_PARAM.to_string(), ParamTy::Ptr));
    }
    if cfg.runs_persistent(spec) {
        // The persistent grid's work-tile count needs the batch (the tiled grid has it as
        // its z extent), and its scheduler a counter.
        p.push(("batch".to_string(), ParamTy::I32));
        p.push((cabi::TILE_COUNTERS_PARAM.to_string(), ParamTy::Ptr));
    }
    p
}

/// How the runtime encodes the two tensor maps: 64-element (128-byte) by `block_n`-row
/// boxes with 128-byte swizzle, the layout the wgmma descriptors expect; over a paged
/// cache, boxes of a page's rows when a tile holds several pages.
pub fn tma_boxes(spec: &Spec, cfg: &Config) -> Vec<TmaBox> {
    if cfg.gather {
        return Vec::new();
    }
    let box_rows = cfg.paged_boxes(spec).map_or(cfg.block_n, |b| b.box_rows(cfg.block_n));
    ["k", "v"]
        .into_iter()
        .map(|t| TmaBox {
            param: format!("tmap_{t}"),
            tensor: t.into(),
            box_cols: BOX_COLS,
            box_rows,
            swizzle_bytes: 128,
            pack_group: 1,
        })
        .collect()
}

pub fn build<'ctx>(kb: &mut Kb<'ctx>, spec: &Spec, cfg: &Config, name: &str) -> R<KernelInfo> {
    let params = forward_params(spec, cfg);
    let args = Args::begin(kb, name, &params)?;
    if !cfg.gather {
        for i in 0..2 {
            kb.mark_tensor_map_param(i)?;
        }
    }
    kb.set_launch_bounds(cfg.threads())?;
    kb.section(&format!(
        "attnc hopper forward: {} ({} consumer warpgroups x 64 rows, {} keys per tile, {} stages)",
        spec.name, cfg.consumers, cfg.block_n, cfg.stages
    ))?;
    let k = Kernel { spec, cfg, args, name: name.to_string() };
    k.body(kb)?;
    kb.ret()?;
    Ok(KernelInfo {
        name: name.to_string(),
        role: KernelRole::Forward,
        note: None,
        threads_per_block: cfg.threads(),
        dynamic_smem_bytes: cfg.smem(spec).request,
        block_m: cfg.block_m(),
        block_n: cfg.block_n,
        params: cabi::describe(&params),
        tensor_maps: tma_boxes(spec, cfg),
        grid: match cfg.runs_persistent(spec) {
            true => Grid::Persistent,
            false => Grid::QueryTiles,
        },
    })
}

struct Kernel<'a, 'ctx> {
    spec: &'a Spec,
    cfg: &'a Config,
    args: Args<'ctx>,
    name: String,
}

/// What a role needs about its CTA, derived after its `setmaxnreg`.
pub(super) struct Cta<'ctx> {
    smem: IntValue<'ctx>,
    la: LayoutArgs<'ctx>,
    bv: BatchView<'ctx>,
    va: VariantArgs<'ctx>,
    head_idx: IntValue<'ctx>,
    hkv: IntValue<'ctx>,
    row0: IntValue<'ctx>,
    rows_total: IntValue<'ctx>,
    tile_q: (IntValue<'ctx>, IntValue<'ctx>),
    tile_h: (IntValue<'ctx>, IntValue<'ctx>),
    num_splits: IntValue<'ctx>,
    split: IntValue<'ctx>,
    /// The row's key-tile list when the launch passes a block mask.
    list: Option<RowList<'ctx>>,
}

impl<'a, 'ctx> Kernel<'a, 'ctx> {
    fn smem_base(&self, kb: &Kb<'ctx>) -> R<IntValue<'ctx>> {
        let g = match kb.module.get_global("attnc_smem") {
            Some(g) => g,
            None => {
                let g =
                    kb.module.add_global(kb.ctx.i8_type().array_type(0), Some(AddressSpace::from(3u16)), "attnc_smem");
                g.set_alignment(1024);
                g.set_linkage(inkwell::module::Linkage::External);
                g
            }
        };
        let raw = kb.trunc32(kb.b.build_ptr_to_int(g.as_pointer_value(), kb.ctx.i64_type(), "")?, "smem_raw")?;
        kb.and(kb.add(raw, kb.i32c(1023), "")?, kb.i32c(!1023), "smem")
    }

    /// The CTA's coordinates: m block (reversed for causal masks, so the longest rows
    /// start first), head, batch entry and split.
    fn cta(&self, kb: &mut Kb<'ctx>) -> R<Cta<'ctx>> {
        self.cta_at(kb, None)
    }

    /// The coordinates of work tile `at` of a persistent CTA, or (`None`) of the CTA's
    /// own tile in the one-CTA-per-tile grid.
    fn cta_at(&self, kb: &mut Kb<'ctx>, at: Option<WorkAt<'ctx>>) -> R<Cta<'ctx>> {
        let spec = self.spec;
        let group = spec.group_size() as i64;
        let (m_block, head_idx, z) = match at {
            Some(w) => (w.m_block, w.head_idx, w.z),
            None => {
                let ctaid = kb.sreg("ctaid.x", "")?;
                let m_block = if spec.mask.causal.is_some() {
                    let n = kb.sreg("nctaid.x", "")?;
                    kb.sub(kb.sub(n, kb.i32c(1), "")?, ctaid, "m_block")?
                } else {
                    ctaid
                };
                let head_idx = kb.sreg("ctaid.y", "head_idx")?;
                // Opaque, so the prologue's copy (the out-of-range exit) and each role's
                // derive their own batch index: a shared one lives across setmaxnreg and
                // spilled.
                let z = kb.opaque_i32(kb.sreg("ctaid.z", "")?, "batch_split")?;
                (m_block, head_idx, z)
            }
        };
        let num_splits = self.args.int("num_splits")?;
        let b = kb.udiv(z, num_splits, "b")?;
        let split = kb.urem(z, num_splits, "split")?;
        let la = self.args.layout()?;
        let bv = batch_view(kb, spec, &la, b)?;
        let g = kb.i32c(group);
        let rows_total = if spec.pack_gqa { kb.mul(bv.seqlen_q, g, "rows_total")? } else { bv.seqlen_q };
        let row0 = kb.mul(m_block, kb.i32c(self.cfg.block_m() as i64), "row0")?;
        let hkv = if spec.pack_gqa { head_idx } else { kb.udiv(head_idx, g, "hkv")? };
        let last_row =
            kb.sub(kb.smin(kb.add(row0, kb.i32c(self.cfg.block_m() as i64), "")?, rows_total, "")?, kb.i32c(1), "")?;
        let (tile_q, tile_h) = row_tile_ranges(kb, spec.pack_gqa, group, row0, last_row, head_idx, hkv)?;
        let list = RowList::for_cta(kb, spec, self.args.block_lists().as_ref(), bv.b, head_idx, hkv, m_block)?;
        Ok(Cta {
            list,
            smem: self.smem_base(kb)?,
            la,
            bv,
            va: self.args.variant(spec)?,
            head_idx,
            hkv,
            row0,
            rows_total,
            tile_q,
            tile_h,
            num_splits,
            split,
        })
    }

    fn tiles<'b>(&'b self, cta: &'b Cta<'ctx>) -> KeyTiles<'b, 'ctx> {
        KeyTiles {
            spec: self.spec,
            block_n: self.cfg.block_n,
            bv: cta.bv,
            hkv: cta.hkv,
            q: cta.tile_q,
            h: cta.tile_h,
            va: &cta.va,
            list: cta.list,
        }
    }

    /// Shared address of ring barrier `which` for a run-time slot.
    fn ring_bar(&self, kb: &Kb<'ctx>, smem: IntValue<'ctx>, which: RingBar, slot: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        let off = kb.add(kb.i32c(self.cfg.ring_bar(self.spec, which) as i64), kb.mul(slot, kb.i32c(8), "")?, "")?;
        kb.add(smem, off, "mbar")
    }

    /// (slot, parity) of ring position `pos`.
    fn ring(&self, kb: &Kb<'ctx>, pos: IntValue<'ctx>) -> R<(IntValue<'ctx>, IntValue<'ctx>)> {
        let s = kb.i32c(self.cfg.stages as i64);
        let slot = kb.urem(pos, s, "kv_slot")?;
        let parity = kb.and(kb.udiv(pos, s, "")?, kb.i32c(1), "kv_parity")?;
        Ok((slot, parity))
    }

    fn body(&self, kb: &mut Kb<'ctx>) -> R<()> {
        let cfg = self.cfg;
        let spec = self.spec;
        let tid = kb.sreg("tid.x", "tid")?;
        {
            // Empty barriers count one arrival per warp of each working consumer.
            let mut working_count = None;
            if !self.persistent() {
                let cta = self.cta(kb)?;
                let nothing = kb.icmp(IntPredicate::SGE, cta.row0, cta.rows_total, "")?;
                kb.return_if(nothing, "cta_out_of_range")?;
                if self.counts_working_consumers() {
                    working_count = Some(kb.mul(self.working_consumers(kb, &cta)?, kb.i32c(4), "empty_count")?);
                }
            }
            kb.section("setup: K/V ring mbarriers (thread 0)")?;
            let is_t0 = kb.icmp(IntPredicate::EQ, tid, kb.i32c(0), "")?;
            let smem = self.smem_base(kb)?;
            kb.if_then(is_t0, "init_barriers", |kb| {
                for which in [RingBar::FullK, RingBar::FullV, RingBar::EmptyK, RingBar::EmptyV] {
                    for s in 0..cfg.stages {
                        let addr = kb.add(smem, kb.i32c((cfg.ring_bar(spec, which) + 8 * s) as i64), "")?;
                        match (which, working_count) {
                            (RingBar::EmptyK | RingBar::EmptyV, Some(count)) => kb.mbar_init_r(addr, count)?,
                            _ => kb.mbar_init(addr, cfg.bar_count(which))?,
                        }
                    }
                }
                if let Some(tail) = cfg.smem(spec).tail_v {
                    kb.mbar_init(kb.add(smem, kb.i32c(tail as i64), "")?, 1)?;
                }
                if let Some(work) = cfg.smem(spec).work {
                    // The tile ring: full (the producer's one arrival), empty (one per
                    // consumer warp).
                    for s in 0..2 {
                        kb.mbar_init(kb.add(smem, kb.i32c((work + 8 + 8 * s) as i64), "")?, 1)?;
                        kb.mbar_init(kb.add(smem, kb.i32c((work + 24 + 8 * s) as i64), "")?, 4 * cfg.consumers)?;
                    }
                }
                kb.fence_mbarrier_init()
            })?;
            kb.cta_barrier()?;
        }
        super::split_roles(
            kb,
            tid,
            (cfg.producer_regs, cfg.consumer_regs),
            "consumer warpgroups: S = Q.K^T, softmax, O += P.V",
            |kb| {
                let tid = kb.opaque_i32(kb.sreg("tid.x", "")?, "tid")?;
                if cfg.gather {
                    kb.section("producer warpgroup: warps 0/2 gather K rows, 1/3 V rows (cp.async), half a tile each")?;
                    let warp = kb.udiv(tid, kb.i32c(32), "producer_warp")?;
                    if cfg.gather_shared && spec.head_dim_qk == spec.head_dim_v {
                        // One copy of the code for the four warps: what each copies from
                        // its index.
                        let in_group = kb.icmp(IntPredicate::ULT, warp, kb.i32c(4), "")?;
                        kb.if_then(in_group, "producer_gather", |kb| {
                            let is_v = kb.icmp(IntPredicate::NE, kb.and(warp, kb.i32c(1), "")?, kb.i32c(0), "is_v")?;
                            let half = kb.udiv(warp, kb.i32c(2), "half")?;
                            self.producer_gather(kb, GatherWarp { is_v, half })
                        })?;
                        return Ok(());
                    }
                    for (w, is_v, half) in [(0, false, 0), (1, true, 0), (2, false, 1), (3, true, 1)] {
                        let mine = kb.icmp(IntPredicate::EQ, warp, kb.i32c(w), "")?;
                        let role = GatherWarp {
                            is_v: kb.ctx.bool_type().const_int(u64::from(is_v), false),
                            half: kb.i32c(half),
                        };
                        kb.if_then(mine, &format!("producer_w{w}"), |kb| self.producer_gather(kb, role))?;
                    }
                    Ok(())
                } else if let (KvLayout::Paged { page_size }, Some(boxes), Some(tail_v)) =
                    (spec.kv_layout, cfg.paged_boxes(spec), cfg.smem(spec).tail_v)
                {
                    kb.section("producer warpgroup: warp 0 reads the block table, lane 0 issues the K/V TMA boxes")?;
                    let w0 = kb.icmp(IntPredicate::ULT, tid, kb.i32c(32), "")?;
                    let paged = PagedTma { page_size, boxes, tail_v };
                    kb.if_then(w0, "producer_paged", |kb| self.producer_paged(kb, paged))
                } else {
                    kb.section("producer warpgroup: one thread issues the K/V TMA loads")?;
                    let t0 = kb.icmp(IntPredicate::EQ, tid, kb.i32c(0), "")?;
                    kb.if_then(t0, "producer", |kb| self.producer(kb))
                }
            },
            |kb| self.consumer(kb),
        )
    }

    /// Waits for a full barrier; after a cp.async gather, orders those (generic-proxy)
    /// writes before the wgmma's (async-proxy) reads.
    fn wait_full(
        &self,
        kb: &Kb<'ctx>,
        cta: &Cta<'ctx>,
        which: RingBar,
        slot: IntValue<'ctx>,
        parity: IntValue<'ctx>,
    ) -> R<()> {
        kb.mbar_wait(self.ring_bar(kb, cta.smem, which, slot)?, parity)?;
        if self.cfg.gather {
            kb.fence_proxy_async_shared()?;
        }
        Ok(())
    }

    // ------------------------------------------------------------------ consumers

    /// The two accumulator rows of this consumer thread (warp w of the warpgroup holds
    /// rows 16w..16w+15; lane l rows l/4 and l/4 + 8).
    fn thread_rows(
        &self,
        kb: &Kb<'ctx>,
        cta: &Cta<'ctx>,
        ltid: IntValue<'ctx>,
        consumer: IntValue<'ctx>,
    ) -> R<[FragRow<'ctx>; 2]> {
        let spec = self.spec;
        let group = spec.group_size() as i64;
        let lane = kb.and(ltid, kb.i32c(31), "lane")?;
        let warp = kb.udiv(ltid, kb.i32c(32), "warp_in_wg")?;
        let base = kb.add(
            kb.add(cta.row0, kb.mul(consumer, kb.i32c(ROWS_PER_CONSUMER as i64), "")?, "")?,
            kb.add(kb.mul(warp, kb.i32c(16), "")?, kb.udiv(lane, kb.i32c(4), "")?, "")?,
            "",
        )?;
        let mut out = Vec::new();
        for half in 0..2 {
            let r = kb.add(base, kb.i32c(8 * half), &format!("row{half}"))?;
            let (q, h) = packed_row(kb, spec.pack_gqa, group, r, cta.head_idx, cta.hkv)?;
            let valid = kb.icmp(IntPredicate::SLT, r, cta.rows_total, "row_valid")?;
            out.push(FragRow { q, h, valid });
        }
        Ok([out[0], out[1]])
    }

    /// The consumer's 64 rows of Q into shared memory (128-byte swizzled, K-major, as
    /// TMA would write them): cp.async, rows past the end zero-filled.
    fn load_q(
        &self,
        kb: &mut Kb<'ctx>,
        cta: &Cta<'ctx>,
        ltid: IntValue<'ctx>,
        q_smem: IntValue<'ctx>,
        consumer: IntValue<'ctx>,
    ) -> R<()> {
        let spec = self.spec;
        let group = spec.group_size() as i64;
        let chunks_per_row = spec.head_dim_qk / 8;
        let total = ROWS_PER_CONSUMER * chunks_per_row;
        let q_st = self.args.strides("q")?;
        let q_base = self.args.int("q")?;
        let row_c0 = kb.add(cta.row0, kb.mul(consumer, kb.i32c(ROWS_PER_CONSUMER as i64), "")?, "")?;
        for it in 0..total / 128 {
            let c = kb.add(ltid, kb.i32c((it * 128) as i64), "q_chunk")?;
            let row = kb.udiv(c, kb.i32c(chunks_per_row as i64), "")?;
            let chunk = kb.urem(c, kb.i32c(chunks_per_row as i64), "")?;
            let r = kb.add(row_c0, row, "")?;
            let valid = kb.icmp(IntPredicate::SLT, r, cta.rows_total, "")?;
            let (q, h) = if spec.pack_gqa {
                let g = kb.i32c(group);
                (kb.udiv(r, g, "")?, kb.add(kb.mul(cta.hkv, g, "")?, kb.urem(r, g, "")?, "")?)
            } else {
                (r, cta.head_idx)
            };
            let q = kb.select_i(valid, q, kb.i32c(0), "")?;
            let off = q_row_offset(kb, &cta.bv, &q_st, q, h)?;
            let off = kb.add(off, kb.mul(kb.zext64(chunk, "")?, kb.i64c(8), "")?, "")?;
            let gaddr = kb.add(q_base, kb.mul(off, kb.i64c(2), "")?, "")?;
            let gaddr = kb.select_i(valid, gaddr, q_base, "")?;
            let bytes = kb.select_i(valid, kb.i32c(16), kb.i32c(0), "")?;
            // Column block chunk/8, 16-byte chunk (chunk % 8) ^ (row % 8) of a 128-byte row.
            let cb = kb.udiv(chunk, kb.i32c(8), "")?;
            let sw = kb.xor(kb.urem(chunk, kb.i32c(8), "")?, kb.and(row, kb.i32c(7), "")?, "")?;
            let s_off = kb.add(
                kb.mul(cb, kb.i32c((ROWS_PER_CONSUMER * ROW_BYTES) as i64), "")?,
                kb.add(kb.mul(row, kb.i32c(ROW_BYTES as i64), "")?, kb.mul(sw, kb.i32c(16), "")?, "")?,
                "",
            )?;
            kb.cp_async_16(kb.add(q_smem, s_off, "")?, gaddr, bytes)?;
        }
        kb.cp_async_commit()?;
        kb.cp_async_wait(0)?;
        // cp.async writes are generic-proxy; wgmma reads through the async proxy.
        kb.fence_proxy_async_shared()?;
        Ok(())
    }

    fn consumer(&self, kb: &mut Kb<'ctx>) -> R<()> {
        let layout = self.cfg.smem(self.spec);
        let tid = kb.opaque_i32(kb.sreg("tid.x", "")?, "tid")?;
        let consumer = kb.sub(kb.udiv(tid, kb.i32c(128), "")?, kb.i32c(1), "consumer")?;
        // `uniform_consumer`: warp-uniform by a shuffle from lane 0, so ptxas keeps what
        // derives from it (Q's wgmma descriptors) in uniform registers.
        let consumer = match self.cfg.uniform_consumer {
            true => kb.shfl_idx_i32(consumer, kb.i32c(0), "consumer")?,
            false => consumer,
        };
        let ltid = kb.and(tid, kb.i32c(127), "ltid")?;
        let q_smem = kb.add(
            self.smem_base(kb)?,
            kb.add(kb.i32c(layout.q as i64), kb.mul(consumer, kb.i32c(layout.q_per_consumer as i64), "")?, "")?,
            "q_smem",
        )?;
        // The ring position of a persistent CTA's next work tile.
        let ring_base = kb.slot_i32("ring_base", kb.i32c(0))?;
        self.for_each_tile(kb, TileRole::Consumer, |kb, at| {
            let cta = self.cta_at(kb, at)?;
            match at {
                None => self.consume_tile(kb, &cta, consumer, ltid, q_smem, ring_base),
                Some(_) => {
                    // Tiles past a (varlen) sequence's end: no keys were produced for them.
                    let inside = kb.icmp(IntPredicate::SLT, cta.row0, cta.rows_total, "tile_inside")?;
                    kb.if_then(inside, "work_tile", |kb| self.consume_tile(kb, &cta, consumer, ltid, q_smem, ring_base))
                }
            }
        })
    }

    /// One work tile of a consumer: Q, the key walk (with its drain), the epilogue. The
    /// ring positions start at `ring_base` (0 but in a persistent CTA), which a
    /// persistent CTA advances past the tile's key tiles.
    fn consume_tile(
        &self,
        kb: &mut Kb<'ctx>,
        cta: &Cta<'ctx>,
        consumer: IntValue<'ctx>,
        ltid: IntValue<'ctx>,
        q_smem: IntValue<'ctx>,
        ring_base: Slot<'ctx>,
    ) -> R<()> {
        let spec = self.spec;
        let cfg = self.cfg;
        let persistent = self.persistent();
        let base = kb.get_i(ring_base, "ring_base")?;
        // A consumer past the sequence's end loads nothing and walks no keys
        // (`idle_consumers`; in a persistent CTA it only drains the tile's slots); its
        // epilogue stores nothing (no valid rows) but still takes part in the fused
        // combine's barrier.
        let working = match self.idle_consumers() {
            true => {
                let first_row = kb.add(cta.row0, kb.mul(consumer, kb.i32c(ROWS_PER_CONSUMER as i64), "")?, "")?;
                let working = kb.icmp(IntPredicate::SLT, first_row, cta.rows_total, "")?;
                // The same in every lane, but ptxas must see it: a branch it thinks
                // divergent around the GEMMs serializes every wgmma (C7519).
                kb.vote_any(working, "consumer_working")?
            }
            false => kb.boolc(true),
        };
        kb.section("load Q (cp.async, 128B swizzle)")?;
        kb.if_then(working, "load_q", |kb| {
            self.load_q(kb, cta, ltid, q_smem, consumer)?;
            // Every warp of this warpgroup has its Q rows in place (barrier 1 + consumer).
            kb.named_bar_sync_r(kb.add(consumer, kb.i32c(1), "")?, 128)
        })?;

        let tiles = self.tiles(cta);
        let (begin, end) = tiles.split_range(kb, cta.num_splits, cta.split)?;
        let own_walk_end = self.own_walk_end(&tiles);
        // Where this consumer's own walk stops: the CTA's tiles after it are drained.
        let walk_end = match own_walk_end {
            true => self.consumer_walk_end(kb, cta, &tiles, consumer, (begin, end))?,
            false => end,
        };
        // A persistent CTA's consumers drain whatever of the tile they did not walk
        // (the empty barriers count every consumer there).
        let drains = own_walk_end || persistent;
        // The drain's first ring position and walk position (after the walk, if any).
        let drain_pos = kb.slot_i32("drain_pos", base)?;
        let drain_tile = kb.slot_i32("drain_tile", begin)?;
        let dv = spec.head_dim_v;
        let mut st = State {
            o: (0..dv / 2).map(|i| kb.slot_f32(&format!("o{i}"), kb.f32c(0.0))).collect::<R<Vec<_>>>()?,
            p: (0..cfg.block_n / 4).map(|i| kb.slot_i32(&format!("p{i}"), kb.i32c(0))).collect::<R<Vec<_>>>()?,
            m: [
                kb.slot_f32("row_max0", kb.f32c(f64::NEG_INFINITY))?,
                kb.slot_f32("row_max1", kb.f32c(f64::NEG_INFINITY))?,
            ],
            l: [kb.slot_f32("row_sum0", kb.f32c(0.0))?, kb.slot_f32("row_sum1", kb.f32c(0.0))?],
        };
        if self.pingpong() {
            // Consumer 0 issues first: consumer 1 hands it the first turn.
            let second = kb.icmp(IntPredicate::EQ, consumer, kb.i32c(1), "")?;
            kb.if_then(second, "first_turn", |kb| kb.named_bar_arrive(PINGPONG_BAR, 256))?;
        }
        // One steady-state step (tile t; P(t-1) carried packed):
        //   issue S(t) | issue O += P(t-1)·V(t-1) | wait S(t) | softmax S(t) → P(t), α
        //   | wait O | O *= α
        // The softmax runs under P·V. `keep_alive` after the last wait keeps P(t-1)'s
        // registers allocated until then (see there).
        let has_any = kb.and(kb.icmp(IntPredicate::SLT, begin, walk_end, "")?, working, "walks_keys")?;
        let env = StepEnv { cta, q_smem, ltid, consumer, base };
        kb.if_then(has_any, "kv", |kb| {
            // Each step exists twice, unmasked and masked, chosen before its GEMMs are
            // issued: a branch between the two wgmma waits makes ptxas hoist the second
            // wait above the softmax.
            // Walk positions (`begin`, `t`) map to key tiles through the block mask's
            // list when there is one.
            let unmasked = tiles.unmasked(kb, begin)?;
            let first = tiles.tile_at(kb, begin)?;
            let first_bits = tiles.bits_slot(kb, begin)?;
            if cfg.split_mask {
                kb.if_else(
                    unmasked,
                    "first_tile",
                    |kb| self.first_step(kb, &env, &st, first, first_bits, Masking::None),
                    |kb| self.first_step(kb, &env, &st, first, first_bits, Masking::Always),
                )?;
            } else {
                self.first_step(kb, &env, &st, first, first_bits, Masking::Unless(unmasked))?;
            }
            let pos = kb.slot_i32("c_pos", base)?;
            let next0 = tiles.next_nonempty(kb, kb.add(begin, kb.i32c(1), "")?, end, "c_next")?;
            let next = kb.slot_i32("c_next_tile", next0)?;
            let more = |kb: &mut Kb<'ctx>| {
                let t = kb.get_i(next, "")?;
                kb.icmp(IntPredicate::SLT, t, walk_end, "")
            };
            let one_step = |kb: &mut Kb<'ctx>| {
                let t = kb.get_i(next, "t")?;
                let p0 = kb.get_i(pos, "pos")?;
                let unmasked = tiles.unmasked(kb, t)?;
                let tile = tiles.tile_at(kb, t)?;
                let bits_slot = tiles.bits_slot(kb, t)?;
                if cfg.split_mask {
                    kb.if_else(
                        unmasked,
                        "tile",
                        |kb| self.step(kb, &env, &st, tile, bits_slot, p0, Masking::None),
                        |kb| self.step(kb, &env, &st, tile, bits_slot, p0, Masking::Always),
                    )?;
                } else {
                    self.step(kb, &env, &st, tile, bits_slot, p0, Masking::Unless(unmasked))?;
                }
                kb.set(pos, kb.add(p0, kb.i32c(1), "")?)?;
                let n = tiles.next_nonempty(kb, kb.add(t, kb.i32c(1), "")?, end, "c_next")?;
                kb.set(next, n)
            };
            match cfg.unroll_steps {
                true => kb.while_loop_twice("consume", more, one_step)?,
                false => kb.while_loop("consume", more, one_step)?,
            }
            kb.section("last tile: O += P.V")?;
            let p0 = kb.get_i(pos, "pos")?;
            let (slot0, par0) = self.ring(kb, p0)?;
            let o_in: Vec<FloatValue<'ctx>> = st.o.iter().map(|s| kb.get_f(*s, "o")).collect::<R<_>>()?;
            let p_in: Vec<IntValue<'ctx>> = st.p.iter().map(|s| kb.get_i(*s, "p")).collect::<R<_>>()?;
            self.wait_full(kb, cta, RingBar::FullV, slot0, par0)?;
            self.turn_wait(kb, consumer)?;
            kb.wgmma_fence()?;
            let o = self.gemm_pv(kb, cta, slot0, &p_in, &o_in)?;
            kb.wgmma_commit_group()?;
            self.turn_pass(kb, consumer)?;
            let o = kb.wgmma_wait_group_acc(0, &o, "o")?;
            self.keep_alive(kb, &p_in, q_smem)?;
            self.release(kb, cta, RingBar::EmptyV, slot0, ltid)?;
            for (slot, v) in st.o.iter().zip(&o) {
                kb.set(*slot, *v)?;
            }
            if drains {
                kb.set(drain_pos, kb.add(p0, kb.i32c(1), "")?)?;
                kb.set(drain_tile, kb.get_i(next, "")?)?;
            }
            Ok(())
        })?;
        if persistent {
            self.drain(kb, &env, &tiles, (drain_pos, drain_tile), end)?;
            kb.set(ring_base, kb.get_i(drain_pos, "")?)?;
        } else if own_walk_end {
            kb.if_then(working, "drain", |kb| self.drain(kb, &env, &tiles, (drain_pos, drain_tile), end))?;
        }
        if self.pingpong() {
            // Consumer 1's first hand-over is one more arrival on consumer 0's barrier
            // than consumer 0 waited for: take it, so no barrier is left half-arrived.
            let first = kb.icmp(IntPredicate::EQ, consumer, kb.i32c(0), "")?;
            kb.if_then(first, "last_turn", |kb| kb.named_bar_sync(PINGPONG_BAR, 256))?;
        }
        self.epilogue(kb, cta, &mut st, ltid, consumer)
    }

    fn pingpong(&self) -> bool {
        self.cfg.pingpong && self.cfg.consumers == 2
    }

    /// Ping-pong: waits until it is this consumer's turn to issue GEMMs (named barrier
    /// `PINGPONG_BAR + consumer`, completed by the other consumer's hand-over).
    fn turn_wait(&self, kb: &Kb<'ctx>, consumer: IntValue<'ctx>) -> R<()> {
        if !self.pingpong() {
            return Ok(());
        }
        kb.named_bar_sync_r(kb.add(consumer, kb.i32c(PINGPONG_BAR as i64), "turn_bar")?, 256)
    }

    /// Ping-pong: hands the turn to the other consumer after issuing.
    fn turn_pass(&self, kb: &Kb<'ctx>, consumer: IntValue<'ctx>) -> R<()> {
        if !self.pingpong() {
            return Ok(());
        }
        let other = kb.sub(kb.i32c(1 + PINGPONG_BAR as i64), consumer, "other_turn_bar")?;
        kb.named_bar_arrive_r(other, 256)
    }

    /// The first tile: S = Q·Kᵀ, its softmax, P packed into the carried slots.
    fn first_step(
        &self,
        kb: &mut Kb<'ctx>,
        env: &StepEnv<'_, 'ctx>,
        st: &State<'ctx>,
        t: IntValue<'ctx>,
        bits_slot: IntValue<'ctx>,
        masked: Masking<'ctx>,
    ) -> R<()> {
        let cta = env.cta;
        let (slot0, par0) = self.ring(kb, env.base)?;
        kb.section("first tile: S = Q.K^T (wgmma ss)")?;
        self.wait_full(kb, cta, RingBar::FullK, slot0, par0)?;
        self.turn_wait(kb, env.consumer)?;
        kb.wgmma_fence()?;
        let s = self.gemm_s(kb, cta, env.q_smem, slot0)?;
        kb.wgmma_commit_group()?;
        self.turn_pass(kb, env.consumer)?;
        let bits = self.mask_bits(kb, cta, masked, t, bits_slot, env.ltid, env.consumer)?;
        let s = kb.wgmma_wait_group_acc(0, &s, "s")?;
        self.release(kb, cta, RingBar::EmptyK, slot0, env.ltid)?;
        let (p, _, _) = self.softmax(kb, cta, masked, bits.as_deref(), s, t, st, env.ltid, env.consumer)?;
        for (slot, v) in st.p.iter().zip(self.pack_p(kb, &p)?) {
            kb.set(*slot, v)?;
        }
        Ok(())
    }

    /// One steady-state step at ring position `pos` (tile `t`; P of the previous tile
    /// carried packed): issue S(t), issue O += P(t-1)·V(t-1), wait S, softmax S(t) → P(t)
    /// under the P·V, wait O, O *= α. `keep_alive` after the last wait keeps P(t-1)'s
    /// registers allocated until then.
    fn step(
        &self,
        kb: &mut Kb<'ctx>,
        env: &StepEnv<'_, 'ctx>,
        st: &State<'ctx>,
        t: IntValue<'ctx>,
        bits_slot: IntValue<'ctx>,
        pos: IntValue<'ctx>,
        masked: Masking<'ctx>,
    ) -> R<()> {
        let cta = env.cta;
        let p1 = kb.add(pos, kb.i32c(1), "")?;
        let (slot0, par0) = self.ring(kb, pos)?;
        let (slot1, par1) = self.ring(kb, p1)?;
        let o_in: Vec<FloatValue<'ctx>> = st.o.iter().map(|s| kb.get_f(*s, "o")).collect::<R<_>>()?;
        let p_in: Vec<IntValue<'ctx>> = st.p.iter().map(|s| kb.get_i(*s, "p")).collect::<R<_>>()?;
        kb.section(if !matches!(masked, Masking::None) {
            "issue S = Q.K^T (this tile, masked) and O += P.V (previous tile)"
        } else {
            "issue S = Q.K^T (this tile) and O += P.V (previous tile)"
        })?;
        self.wait_full(kb, cta, RingBar::FullK, slot1, par1)?;
        self.turn_wait(kb, env.consumer)?;
        kb.wgmma_fence()?;
        let s = self.gemm_s(kb, cta, env.q_smem, slot1)?;
        kb.wgmma_commit_group()?;
        self.wait_full(kb, cta, RingBar::FullV, slot0, par0)?;
        let o = self.gemm_pv(kb, cta, slot0, &p_in, &o_in)?;
        kb.wgmma_commit_group()?;
        self.turn_pass(kb, env.consumer)?;
        let bits = self.mask_bits(kb, cta, masked, t, bits_slot, env.ltid, env.consumer)?;
        let s = kb.wgmma_wait_group_acc(1, &s, "s")?;
        self.release(kb, cta, RingBar::EmptyK, slot1, env.ltid)?;
        let (p, alpha, rescale) = self.softmax(kb, cta, masked, bits.as_deref(), s, t, st, env.ltid, env.consumer)?;
        let packed = self.pack_p(kb, &p)?;
        if self.cfg.pin_pv_wait {
            for a in alpha {
                self.never_store(kb, a, env.q_smem)?;
            }
        }
        let o = kb.wgmma_wait_group_acc(0, &o, "o")?;
        self.keep_alive(kb, &p_in, env.q_smem)?;
        self.release(kb, cta, RingBar::EmptyV, slot0, env.ltid)?;
        for (slot, v) in st.o.iter().zip(&o) {
            kb.set(*slot, *v)?;
        }
        self.rescale_o(kb, st, alpha, rescale)?;
        for (slot, v) in st.p.iter().zip(packed) {
            kb.set(*slot, v)?;
        }
        Ok(())
    }

    /// Keeps the P registers of the last P·V allocated up to here (just after its wait).
    /// ptxas tracks the registers of in-flight wgmma, but an operand with no later use
    /// counts as dead after the issue: ptxas then hands those registers to temporaries
    /// of the softmax and must hoist the wait above them, which serializes the softmax
    /// with P·V. A real use after the wait — stores predicated on a condition that never
    /// holds (seqlen_q = i32::MIN, which validation rejects) and that ptxas cannot fold —
    /// keeps them live: 8 issue slots, never executed.
    fn keep_alive(&self, kb: &Kb<'ctx>, regs: &[IntValue<'ctx>], q_smem: IntValue<'ctx>) -> R<()> {
        if !self.cfg.keep_alive {
            return Ok(());
        }
        let mut body = String::new();
        for (c, chunk) in regs.chunks(4).enumerate() {
            let ops: Vec<String> = (0..chunk.len()).map(|i| format!("${}", 2 + 4 * c + i)).collect();
            match chunk.len() {
                4 => body.push_str(&format!("\t@never st.shared.v4.b32 [$1], {{{}}};\n", ops.join(", "))),
                2 => body.push_str(&format!("\t@never st.shared.v2.b32 [$1], {{{}}};\n", ops.join(", "))),
                _ => {
                    for o in ops {
                        body.push_str(&format!("\t@never st.shared.b32 [$1], {o};\n"));
                    }
                }
            }
        }
        let operands: Vec<BasicMetadataValueEnum<'ctx>> = regs.iter().map(|r| (*r).into()).collect();
        self.never_executed(kb, q_smem, &body, &operands, "r")
    }

    /// A shared-memory store of `value` that never executes. ptxas keeps a
    /// `wgmma.wait_group` below a memory operation but otherwise schedules it as early
    /// as it likes; a store of a value computed late pins the next wait below it.
    fn never_store(&self, kb: &Kb<'ctx>, value: FloatValue<'ctx>, q_smem: IntValue<'ctx>) -> R<()> {
        self.never_executed(kb, q_smem, "\t@never st.shared.f32 [$1], $2;\n", &[value.into()], "f")
    }

    /// Shared-memory stores that never execute: `body`'s lines, predicated on `never`
    /// (seqlen_q = i32::MIN, which validation rejects and ptxas cannot fold), with `$1`
    /// the address (`q_smem`) and `$2..` the operands. What ptxas sees is a real use of
    /// the operands and a memory operation at this point ([`Self::keep_alive`],
    /// [`Self::never_store`]); nothing is ever written.
    fn never_executed(
        &self,
        kb: &Kb<'ctx>,
        q_smem: IntValue<'ctx>,
        body: &str,
        operands: &[BasicMetadataValueEnum<'ctx>],
        operand_constraint: &str,
    ) -> R<()> {
        let seqlen_q = self.args.int("seqlen_q")?;
        let text = format!("{{\n\t.reg .pred never;\n\tsetp.eq.s32 never, $0, -2147483648;\n{body}\t}}");
        let mut args: Vec<BasicMetadataValueEnum<'ctx>> = vec![seqlen_q.into(), q_smem.into()];
        args.extend_from_slice(operands);
        let mut cons = vec!["r", "r"];
        cons.extend(std::iter::repeat_n(operand_constraint, operands.len()));
        let cons = format!("{},~{{memory}}", cons.join(","));
        kb.asm_call(None, &text, &cons, false, &args, "")?;
        Ok(())
    }

    /// One arrival per consumer warp on an empty barrier: this warpgroup is done reading
    /// the slot. Lane 0 arrives through a predicate inside the asm, not a branch: a
    /// divergent branch between two wgmma waits makes ptxas hoist the second wait above
    /// it (and so above the softmax).
    fn release(
        &self,
        kb: &mut Kb<'ctx>,
        cta: &Cta<'ctx>,
        which: RingBar,
        slot: IntValue<'ctx>,
        ltid: IntValue<'ctx>,
    ) -> R<()> {
        let lane = kb.and(ltid, kb.i32c(31), "lane")?;
        let bar = self.ring_bar(kb, cta.smem, which, slot)?;
        kb.mbar_arrive_lane0(bar, lane)
    }

    /// Issues `S = Q·Kᵀ` for ring slot `slot` (uncommitted): d/16 wgmma ss, N = block_n.
    fn gemm_s(
        &self,
        kb: &Kb<'ctx>,
        cta: &Cta<'ctx>,
        q_smem: IntValue<'ctx>,
        slot: IntValue<'ctx>,
    ) -> R<Vec<FloatValue<'ctx>>> {
        let spec = self.spec;
        let cfg = self.cfg;
        let layout = cfg.smem(spec);
        let k_smem = kb.add(
            cta.smem,
            kb.add(kb.i32c(layout.k as i64), kb.mul(slot, kb.i32c(layout.k_per_stage as i64), "")?, "")?,
            "k_smem",
        )?;
        let cst = SmemDesc::k_major_sw128(0).encode_without_start();
        let a0 = kb.wgmma_desc(q_smem, cst, "q_desc")?;
        let b0 = kb.wgmma_desc(k_smem, cst, "k_desc")?;
        let undef = kb.ctx.f32_type().get_undef();
        let mut acc = vec![undef; (cfg.block_n / 2) as usize];
        for kk in 0..spec.head_dim_qk / 16 {
            // Offsets are added to the descriptors' 14-bit address field (16-byte units).
            let a = kb.add(a0, kb.i64c((k_major_step_offset(ROWS_PER_CONSUMER, kk) >> 4) as i64), "")?;
            let b = kb.add(b0, kb.i64c((k_major_step_offset(cfg.block_n, kk) >> 4) as i64), "")?;
            let scale = if kk == 0 { Acc::Overwrite } else { Acc::Accumulate };
            acc = kb.wgmma_ss(WgmmaType::from(spec.dtype), cfg.block_n, &acc, a, b, scale, Major::K, Major::K, "s")?;
        }
        Ok(acc)
    }

    /// Issues `O += P·V` for ring slot `slot` (uncommitted): block_n/16 wgmma rs with P
    /// from registers, V MN-major (N = d_v).
    fn gemm_pv(
        &self,
        kb: &Kb<'ctx>,
        cta: &Cta<'ctx>,
        slot: IntValue<'ctx>,
        p: &[IntValue<'ctx>],
        o: &[FloatValue<'ctx>],
    ) -> R<Vec<FloatValue<'ctx>>> {
        let spec = self.spec;
        let cfg = self.cfg;
        let layout = cfg.smem(spec);
        let v_smem = kb.add(
            cta.smem,
            kb.add(kb.i32c(layout.v as i64), kb.mul(slot, kb.i32c(layout.v_per_stage as i64), "")?, "")?,
            "v_smem",
        )?;
        let cst = SmemDesc::mn_major_sw128(0, cfg.block_n * ROW_BYTES).encode_without_start();
        let b0 = kb.wgmma_desc(v_smem, cst, "v_desc")?;
        let mut acc = o.to_vec();
        for j in 0..cfg.block_n / 16 {
            let b = kb.add(b0, kb.i64c((mn_major_step_offset(j) >> 4) as i64), "")?;
            let a = [p[4 * j as usize], p[4 * j as usize + 1], p[4 * j as usize + 2], p[4 * j as usize + 3]];
            acc =
                kb.wgmma_rs(WgmmaType::from(spec.dtype), spec.head_dim_v, &acc, a, b, Acc::Accumulate, Major::Mn, "o")?;
        }
        Ok(acc)
    }

    /// The online softmax of one S tile (key tile `t`): scores to log2 units with the
    /// score modification, the mask when `masked` (no branch: the caller picks a masked
    /// or an unmasked copy of the whole step), the running max (conditional
    /// rescaling), P = 2^(s − base), the running sum. Returns P (f32, in the S
    /// registers: packing it is the caller's, see [`Kernel::pack_p`]), the per-row rescale
    /// factor of O and the rescale flag (conditional rescaling).
    #[allow(clippy::type_complexity)]
    fn softmax(
        &self,
        kb: &mut Kb<'ctx>,
        cta: &Cta<'ctx>,
        masked: Masking<'ctx>,
        bits: Option<&[IntValue<'ctx>]>,
        mut s: Vec<FloatValue<'ctx>>,
        t: IntValue<'ctx>,
        st: &State<'ctx>,
        ltid: IntValue<'ctx>,
        consumer: IntValue<'ctx>,
    ) -> R<SoftmaxOut<'ctx>> {
        let spec = self.spec;
        let cfg = self.cfg;
        kb.section("softmax (online, exp2 domain)")?;
        if cfg.diag_no_softmax {
            let one = kb.f32c(1.0);
            return Ok((s, [one, one], None));
        }
        let n0 = kb.mul(t, kb.i32c(cfg.block_n as i64), "n0")?;
        let quad_col = kb.and(ltid, kb.i32c(3), "quad_col")?;
        let col_base = kb.add(n0, kb.mul(quad_col, kb.i32c(2), "")?, "col_base")?;
        let scale = spec.scale_value();
        // Without a score modification the scores stay raw: the row max is taken on raw
        // scores and scaled once, and the exponent is one FFMA, s·(scale·log2 e) − base.
        let fused = spec.score_mod.is_none();
        let log2_scale = kb.f32c(scale * LOG2E);
        if let Some(m) = &spec.score_mod {
            let rows = self.thread_rows(kb, cta, ltid, consumer)?;
            // Element e of 8-column group i: row half e/2, column 8i + 2·(lane%4) + e%2.
            for (idx, v) in s.iter_mut().enumerate() {
                let (i, e) = (idx / 4, idx % 4);
                let row = rows[e / 2];
                let imm = (8 * i + e % 2) as i64;
                let col = kb.add(col_base, kb.i32c(imm), "k_pos")?;
                let vars =
                    vexpr::ElemVars { k_split: Some((col_base, imm)), ..cta.bv.elem_vars(cta.hkv, row.q, row.h, col) };
                *v = vexpr::modded_score_log2(kb, spec, m, *v, vars, &cta.va)?;
            }
        }
        let apply_mask = |kb: &mut Kb<'ctx>, s: &mut Vec<FloatValue<'ctx>>| -> R<()> {
            kb.section("mask (partial tile)")?;
            if let Some(words) = bits {
                for (idx, v) in s.iter_mut().enumerate() {
                    let (word, bit) = self.mask_bit_of(idx);
                    let bit = kb.and(words[word], kb.i32c(1 << bit), "")?;
                    let allowed = kb.icmp(IntPredicate::NE, bit, kb.i32c(0), "allowed")?;
                    *v = kb.select_f(allowed, *v, kb.f32c(f64::NEG_INFINITY), "s_masked")?;
                }
                return Ok(());
            }
            let ltid = kb.opaque_i32(ltid, "ltid_mask")?;
            let rows = self.thread_rows(kb, cta, ltid, consumer)?;
            let quad_col = kb.and(ltid, kb.i32c(3), "")?;
            let col_base = kb.add(n0, kb.mul(quad_col, kb.i32c(2), "")?, "")?;
            let predicate = spec.mask.to_predicate();
            for (idx, v) in s.iter_mut().enumerate() {
                let (i, e) = (idx / 4, idx % 4);
                let row = rows[e / 2];
                let col = kb.add(col_base, kb.i32c((8 * i + e % 2) as i64), "k_pos")?;
                let vars = cta.bv.elem_vars(cta.hkv, row.q, row.h, col);
                let allowed = vexpr::allowed(kb, spec, predicate.as_ref(), &vars, &cta.va)?;
                *v = kb.select_f(allowed, *v, kb.f32c(f64::NEG_INFINITY), "s_masked")?;
            }
            Ok(())
        };
        match masked {
            Masking::None => {}
            Masking::Always => apply_mask(kb, &mut s)?,
            Masking::Unless(unmasked) => {
                let slots: Vec<Slot<'ctx>> = s.iter().map(|v| kb.slot_f32("s", *v)).collect::<R<_>>()?;
                let partial = kb.not(unmasked, "partial_tile")?;
                kb.if_then(partial, "mask_tile", |kb| {
                    let mut vals: Vec<FloatValue<'ctx>> =
                        slots.iter().map(|sl| kb.get_f(*sl, "s")).collect::<R<_>>()?;
                    apply_mask(kb, &mut vals)?;
                    for (sl, v) in slots.iter().zip(vals) {
                        kb.set(*sl, v)?;
                    }
                    Ok(())
                })?;
                for (v, sl) in s.iter_mut().zip(&slots) {
                    *v = kb.get_f(*sl, "s")?;
                }
            }
        }

        // Row maxima over the quad (4 lanes share a row), in log2 units.
        let mut new_max = Vec::new();
        for half in 0..2usize {
            let row: Vec<FloatValue<'ctx>> =
                s.iter().enumerate().filter(|(idx, _)| (idx % 4) / 2 == half).map(|(_, v)| *v).collect();
            let mut m = pairwise(kb, row, |kb, a, b| kb.fmax(a, b, ""))?;
            m = kb.fmax(m, kb.shfl_xor_f32(m, 1, "")?, "")?;
            m = kb.fmax(m, kb.shfl_xor_f32(m, 2, "")?, "tile_max")?;
            if fused {
                m = kb.fmul(m, log2_scale, "tile_max_log2")?;
            }
            let old = kb.get_f(st.m[half], "m_old")?;
            new_max.push(kb.fmax(old, m, "m_new")?);
        }
        let opts = spec.softmax;
        let old: Vec<FloatValue<'ctx>> = st.m.iter().map(|m| kb.get_f(*m, "m_old")).collect::<R<_>>()?;
        let upd = max_update(kb, &old, &new_max, opts.rescale_threshold)?;
        for (slot, m) in st.m.iter().zip(&upd.maxes) {
            kb.set(*slot, *m)?;
        }
        let (alphas, bases, rescale) = (upd.alphas, upd.bases, upd.rescale);
        // P = 2^(s - base); a fraction of each row through the FMA-pipe emulation.
        let per_row = (cfg.block_n / 4) as usize;
        let fraction = if opts.exp2_emulation > 0.0 { opts.exp2_emulation } else { cfg.exp2_emulation };
        let emulated = ((fraction * per_row as f64).round() as usize).min(per_row);
        let mut row_p: [Vec<FloatValue<'ctx>>; 2] = [Vec::new(), Vec::new()];
        let mut seen = [0usize; 2];
        for (idx, v) in s.iter_mut().enumerate() {
            let half = (idx % 4) / 2;
            let x = if fused {
                kb.fma(*v, log2_scale, kb.fneg(bases[half], "")?, "")?
            } else {
                kb.fsub(*v, bases[half], "")?
            };
            let p = if seen[half] < emulated { exp2_emulated(kb, x)? } else { kb.ex2(x, "p")? };
            seen[half] += 1;
            row_p[half].push(p);
            *v = p;
        }
        let [p0, p1] = row_p;
        let sums = [pairwise(kb, p0, |kb, a, b| kb.fadd(a, b, ""))?, pairwise(kb, p1, |kb, a, b| kb.fadd(a, b, ""))?];
        let mut late_alpha = Vec::new();
        for half in 0..2 {
            let l = kb.get_f(st.l[half], "")?;
            let l = kb.fma(l, alphas[half], sums[half], "row_sum")?;
            kb.set(st.l[half], l)?;
            // α for O's rescale, made to depend on the finished row sum (l·0 + α: not
            // foldable, l may be inf for all ptxas knows). ptxas otherwise interleaves the
            // 64 FMULs of the rescale with the exponentials, hoisting the wait for P·V
            // above them; this keeps the wait below the softmax.
            late_alpha.push(if self.cfg.late_alpha {
                kb.fma(l, kb.f32c(0.0), alphas[half], "alpha_late")?
            } else {
                alphas[half]
            });
        }
        Ok((s, [late_alpha[0], late_alpha[1]], rescale))
    }

    /// P (f32, the S fragment) → the bf16x2/f16x2 A fragment of the P·V GEMM (pairs
    /// of adjacent columns are exactly the wgmma A-fragment order).
    fn pack_p(&self, kb: &Kb<'ctx>, p: &[FloatValue<'ctx>]) -> R<Vec<IntValue<'ctx>>> {
        kb.pack_pairs(self.spec.dtype, p, "p_packed")
    }

    /// O *= α per row, skipped as a whole when conditional rescaling kept every base.
    fn rescale_o(
        &self,
        kb: &mut Kb<'ctx>,
        st: &State<'ctx>,
        alpha: [FloatValue<'ctx>; 2],
        rescale: Option<IntValue<'ctx>>,
    ) -> R<()> {
        kb.section("rescale O")?;
        let o = st.o.clone();
        let body = |kb: &mut Kb<'ctx>| -> R<()> {
            for (idx, slot) in o.iter().enumerate() {
                let v = kb.get_f(*slot, "")?;
                kb.set(*slot, kb.fmul(v, alpha[(idx % 4) / 2], "")?)?;
            }
            Ok(())
        };
        match rescale {
            Some(c) => kb.if_then(c, "rescale_o", body),
            None => body(kb),
        }
    }

    // ------------------------------------------------------------------ epilogue

    fn epilogue(
        &self,
        kb: &mut Kb<'ctx>,
        cta: &Cta<'ctx>,
        st: &mut State<'ctx>,
        ltid: IntValue<'ctx>,
        consumer: IntValue<'ctx>,
    ) -> R<()> {
        let spec = self.spec;
        kb.section("epilogue: O /= l, store O and LSE (or split partials)")?;
        let is_split = kb.icmp(IntPredicate::SGT, cta.num_splits, kb.i32c(1), "is_split")?;
        let ltid = kb.opaque_i32(ltid, "ltid_epilogue")?;
        let rows = self.thread_rows(kb, cta, ltid, consumer)?;
        let quad_col = kb.and(ltid, kb.i32c(3), "quad_col")?;
        let store = RowStore { spec, args: &self.args, bv: &cta.bv, max_seqlen_q: cta.la.seqlen_q, is_split };
        let split = |kb: &Kb<'ctx>| -> R<(IntValue<'ctx>, IntValue<'ctx>)> {
            let nz = kb.sreg("nctaid.z", "")?;
            Ok((cta.split, kb.udiv(nz, cta.num_splits, "batch")?))
        };
        for (half, &row) in rows.iter().enumerate() {
            let l = kb.get_f(st.l[half], "")?;
            let m = kb.get_f(st.m[half], "m_final")?;
            let (o_scale, lse) = finish_row(kb, spec, &self.args, l, m, row.h, is_split)?;
            // O normalized once, before the branches that store it.
            let o_vals: Vec<(FloatValue<'ctx>, FloatValue<'ctx>)> = (0..spec.head_dim_v / 8)
                .map(|i| {
                    let a = kb.get_f(st.o[(4 * i + 2 * half as u32) as usize], "")?;
                    let b = kb.get_f(st.o[(4 * i + 2 * half as u32 + 1) as usize], "")?;
                    Ok((kb.fmul(a, o_scale, "")?, kb.fmul(b, o_scale, "")?))
                })
                .collect::<R<_>>()?;
            let cols = |_: &Kb<'ctx>, i: u32| -> R<(FloatValue<'ctx>, FloatValue<'ctx>)> { Ok(o_vals[i as usize]) };
            store.store(kb, row, quad_col, lse, &cols, &split)?;
        }
        if spec.split_kv == attnc_ir::SplitKv::None {
            return Ok(());
        }
        kb.if_then(is_split, "split_launch", |kb| {
            let (nx, ny) = (kb.sreg("nctaid.x", "")?, kb.sreg("nctaid.y", "")?);
            let block = kb.add(
                kb.mul(kb.add(kb.mul(cta.bv.b, ny, "")?, cta.head_idx, "")?, nx, "")?,
                kb.sreg("ctaid.x", "")?,
                "row_block",
            )?;
            let f = FusedCombine {
                fences: self.cfg.merge_fences,
                counters: self.args.int(cabi::SPLIT_COUNTERS_PARAM)?,
                counter_index: block,
                num_splits: cta.num_splits,
                thread: kb.add(kb.mul(consumer, kb.i32c(128), "")?, ltid, "")?,
                threads: 128 * self.cfg.consumers,
                bar_id: COMBINE_BAR,
                row0: cta.row0,
                rows_end: kb.smin(
                    kb.add(cta.row0, kb.i32c(self.cfg.block_m() as i64), "")?,
                    cta.rows_total,
                    "rows_end",
                )?,
                pack_gqa: spec.pack_gqa,
                head_idx: cta.head_idx,
                hkv: cta.hkv,
                b: cta.bv.b,
                batch: kb.udiv(kb.sreg("nctaid.z", "")?, cta.num_splits, "batch")?,
                max_seqlen_q: cta.la.seqlen_q,
            };
            fused_tail(kb, spec, &self.args, &cta.bv, &f)
        })
    }
}

/// P (f32, the S fragment layout), the per-row rescale factor of O, and whether O
/// needs it (conditional rescaling; `None`: always).
type SoftmaxOut<'ctx> = (Vec<FloatValue<'ctx>>, [FloatValue<'ctx>; 2], Option<IntValue<'ctx>>);

/// Reduces `vals` with `op` as a balanced tree: log2(n) dependent steps instead of n,
/// which matters with two warps per scheduler to hide latency (the row max and row sum
/// of 32 values each per thread and tile).
fn pairwise<'ctx>(
    kb: &Kb<'ctx>,
    mut vals: Vec<FloatValue<'ctx>>,
    op: impl Fn(&Kb<'ctx>, FloatValue<'ctx>, FloatValue<'ctx>) -> R<FloatValue<'ctx>>,
) -> R<FloatValue<'ctx>> {
    while vals.len() > 1 {
        let mut next = Vec::with_capacity(vals.len().div_ceil(2));
        for pair in vals.chunks(2) {
            next.push(if pair.len() == 2 { op(kb, pair[0], pair[1])? } else { pair[0] });
        }
        vals = next;
    }
    vals.pop().ok_or_else(|| crate::error::LowerError::Llvm("empty reduction".into()))
}

/// How a step masks its scores.
#[derive(Clone, Copy)]
enum Masking<'ctx> {
    /// A full tile inside seqlen_k: no per-element work.
    None,
    /// Mask and seqlen_k bound on every element, branch-free.
    Always,
    /// Under a run-time branch, skipped when the flag (full and inside) is set.
    Unless(IntValue<'ctx>),
}

/// What every step of a consumer needs.
struct StepEnv<'a, 'ctx> {
    cta: &'a Cta<'ctx>,
    q_smem: IntValue<'ctx>,
    ltid: IntValue<'ctx>,
    consumer: IntValue<'ctx>,
    /// The ring position of the work tile's first key tile.
    base: IntValue<'ctx>,
}

/// A consumer thread's loop-carried state.
struct State<'ctx> {
    /// O accumulators (d_v/2 per thread, the wgmma D fragment).
    o: Vec<Slot<'ctx>>,
    /// P of the last softmaxed tile, packed (the A fragment of its P·V).
    p: Vec<Slot<'ctx>>,
    m: [Slot<'ctx>; 2],
    l: [Slot<'ctx>; 2],
}
