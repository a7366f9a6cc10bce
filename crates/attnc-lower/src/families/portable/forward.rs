//! The portable forward kernel: FlashAttention-2's algorithm on mma.sync.
//!
//! One CTA owns `block_m` rows of Q (query positions, or (position, head) pairs with
//! pack_gqa) of one head (or KV head), for one batch entry and one KV split. Each warp
//! owns `16 · m_tiles` rows. The K/V loop walks the non-empty key tiles (classified at
//! run time by the interval analysis), double-buffered through cp.async:
//!
//! ```text
//! load Q ─┐
//! load K,V[n0]          ─┐
//! for each tile n:        │ prefetch K,V[next non-empty]   (cp.async, other stage)
//!   wait(tile n) ◄────────┘
//!   S = Q·Kᵀ   (ldmatrix + mma.sync m16n8k16, f32)
//!   softmax    (mask/score mod per element when the tile is partial; exp2 domain)
//!   O = O·α + P·V  (P stays in registers as the A operand)
//! O /= l, write O (and LSE, or the split's partials)
//! ```
//! Shared-memory rows are padded by 16 bytes, which makes every ldmatrix phase hit 32
//! distinct banks for any head dim.

use super::config::Config;
use crate::families::common::abi::{self, Args};
use crate::families::common::epilogue::{finish_row, FragRow, RowStore};
use crate::llvm::kb::{Kb, Slot, R};
use crate::module::{Grid, KernelInfo, KernelRole};
use crate::variant::expr::{self as vexpr, VariantArgs};
use crate::variant::layout::{
    batch_view, kv_row_offsets, packed_row, q_row_offset, row_tile_ranges, BatchView, LayoutArgs, Strides,
};
use crate::variant::softmax::{exp2_emulated, max_update};
use crate::variant::tiles::{KeyTiles, RowList};
use attnc_ir::Spec;
use inkwell::values::{FloatValue, IntValue};
use inkwell::{AddressSpace, IntPredicate};

const LOG2E: f64 = std::f64::consts::LOG2_E;

struct Fwd<'a, 'ctx> {
    spec: &'a Spec,
    cfg: &'a Config,
    args: Args<'ctx>,
    va: VariantArgs<'ctx>,
    /// The row's key-tile list when the launch passes a block mask.
    row_list: Option<RowList<'ctx>>,
    la: LayoutArgs<'ctx>,
    bv: BatchView<'ctx>,
    k_st: Strides<'ctx>,
    v_st: Strides<'ctx>,
    hkv: IntValue<'ctx>,
    tid: IntValue<'ctx>,
    head_idx: IntValue<'ctx>,
    row0: IntValue<'ctx>,
    rows_total: IntValue<'ctx>,
    smem: IntValue<'ctx>,
    /// Tile ranges shared by the classification: all but k.
    tile_q: (IntValue<'ctx>, IntValue<'ctx>),
    tile_h: (IntValue<'ctx>, IntValue<'ctx>),
    /// Loop-carried state.
    o_acc: Vec<Slot<'ctx>>,
    row_max: Vec<Slot<'ctx>>,
    row_sum: Vec<Slot<'ctx>>,
}

pub fn build<'ctx>(kb: &mut Kb<'ctx>, spec: &Spec, cfg: &Config, name: &str) -> R<KernelInfo> {
    let params = abi::forward_params(spec);
    let args = Args::begin(kb, name, &params)?;
    kb.section(&format!(
        "attnc portable forward: {} ({}x{} tiles, {} warps)",
        spec.name,
        cfg.block_m(),
        cfg.block_n,
        cfg.warps
    ))?;
    let f = Fwd::setup(kb, spec, cfg, args)?;
    if let Some(mut f) = f {
        f.run(kb)?;
    }
    kb.ret()?;
    Ok(KernelInfo {
        name: name.to_string(),
        role: KernelRole::Forward,
        note: None,
        threads_per_block: cfg.threads(),
        dynamic_smem_bytes: cfg.smem_bytes(spec),
        block_m: cfg.block_m(),
        block_n: cfg.block_n,
        params: abi::describe(&params),
        tensor_maps: Vec::new(),
        grid: Grid::QueryTiles,
    })
}

impl<'a, 'ctx> Fwd<'a, 'ctx> {
    /// Reads the launch coordinates and lengths; returns `None` (after emitting an
    /// early exit) never — the exit is a branch, so this always returns the state.
    fn setup(kb: &mut Kb<'ctx>, spec: &'a Spec, cfg: &'a Config, args: Args<'ctx>) -> R<Option<Fwd<'a, 'ctx>>> {
        let group = spec.group_size() as i64;
        let pack = spec.pack_gqa;
        let tid = kb.sreg("tid.x", "tid")?;
        let m_block = kb.sreg("ctaid.x", "m_block")?;
        let head_idx = kb.sreg("ctaid.y", "head_idx")?;
        let z = kb.sreg("ctaid.z", "batch_split")?;
        let num_splits = args.int("num_splits")?;
        let b = kb.udiv(z, num_splits, "b")?;
        let la = args.layout()?;
        let bv = batch_view(kb, spec, &la, b)?;
        let g = kb.i32c(group);
        let rows_total = if pack { kb.mul(bv.seqlen_q, g, "rows_total")? } else { bv.seqlen_q };
        let row0 = kb.mul(m_block, kb.i32c(cfg.block_m() as i64), "row0")?;
        let nothing = kb.icmp(IntPredicate::SGE, row0, rows_total, "")?;
        kb.return_if(nothing, "cta_out_of_range")?;

        let hkv = if pack { head_idx } else { kb.udiv(head_idx, g, "hkv")? };
        // The tile's q and h ranges for classification.
        let last_row =
            kb.sub(kb.smin(kb.add(row0, kb.i32c(cfg.block_m() as i64), "")?, rows_total, "")?, kb.i32c(1), "")?;
        let (tile_q, tile_h) = row_tile_ranges(kb, pack, group, row0, last_row, head_idx, hkv)?;

        let smem_global =
            kb.module.add_global(kb.ctx.i8_type().array_type(0), Some(AddressSpace::from(3u16)), "attnc_smem");
        smem_global.set_alignment(128);
        smem_global.set_linkage(inkwell::module::Linkage::External);
        let smem64 = kb.b.build_ptr_to_int(smem_global.as_pointer_value(), kb.ctx.i64_type(), "")?;
        let smem = kb.trunc32(smem64, "smem_base")?;

        let va = args.variant(spec)?;
        let row_list = RowList::for_cta(kb, spec, args.block_lists().as_ref(), b, head_idx, hkv, m_block)?;
        let k_st = args.strides("k")?;
        let v_st = args.strides("v")?;

        let mut o_acc = Vec::new();
        for mt in 0..cfg.m_tiles {
            for dt in 0..spec.head_dim_v / 8 {
                for e in 0..4 {
                    o_acc.push(kb.slot_f32(&format!("o{mt}.{dt}.{e}"), kb.f32c(0.0))?);
                }
            }
        }
        let mut row_max = Vec::new();
        let mut row_sum = Vec::new();
        for i in 0..(2 * cfg.m_tiles) as usize {
            row_max.push(kb.slot_f32(&format!("row_max{i}"), kb.f32c(f64::NEG_INFINITY))?);
            row_sum.push(kb.slot_f32(&format!("row_sum{i}"), kb.f32c(0.0))?);
        }
        Ok(Some(Fwd {
            spec,
            cfg,
            args,
            va,
            row_list,
            la,
            bv,
            k_st,
            v_st,
            hkv,
            tid,
            head_idx,
            row0,
            rows_total,
            smem,
            tile_q,
            tile_h,
            o_acc,
            row_max,
            row_sum,
        }))
    }

    fn o_slot(&self, mt: u32, dt: u32, e: u32) -> Slot<'ctx> {
        self.o_acc[((mt * (self.spec.head_dim_v / 8) + dt) * 4 + e) as usize]
    }

    /// The rows this thread holds in accumulators, (m tile, half) → quad row g or
    /// g + 8, derived from `tid` where they are needed (recomputing a few integer ops
    /// beats keeping them live across the K/V loop).
    fn thread_rows(&self, kb: &Kb<'ctx>, tid: IntValue<'ctx>) -> R<Vec<FragRow<'ctx>>> {
        let spec = self.spec;
        let group = spec.group_size() as i64;
        let lane = kb.and(tid, kb.i32c(31), "lane")?;
        let warp = kb.udiv(tid, kb.i32c(32), "warp")?;
        let quad_row = kb.udiv(lane, kb.i32c(4), "quad_row")?;
        let warp_row0 = kb.mul(warp, kb.i32c(16 * self.cfg.m_tiles as i64), "")?;
        let mut rows = Vec::new();
        for mt in 0..self.cfg.m_tiles {
            for half in 0..2 {
                let local = kb.add(warp_row0, kb.add(quad_row, kb.i32c((mt * 16 + half * 8) as i64), "")?, "")?;
                let r = kb.add(self.row0, local, &format!("row{mt}{half}"))?;
                let (q, h) = packed_row(kb, spec.pack_gqa, group, r, self.head_idx, self.hkv)?;
                let valid = kb.icmp(IntPredicate::SLT, r, self.rows_total, "row_valid")?;
                rows.push(FragRow { q, h, valid });
            }
        }
        Ok(rows)
    }

    /// `lane % 4`: the column pair a thread holds in an accumulator fragment.
    fn quad_col(&self, kb: &Kb<'ctx>, tid: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        kb.and(tid, kb.i32c(3), "quad_col")
    }

    fn run(&mut self, kb: &mut Kb<'ctx>) -> R<()> {
        let cfg = self.cfg;
        let bn = cfg.block_n as i64;
        // ---- the range of non-empty key tiles, then this split's share of it
        let num_splits = self.args.int("num_splits")?;
        let z = kb.sreg("ctaid.z", "")?;
        let split = kb.urem(z, num_splits, "split")?;
        let (begin, end) = self.tiles().split_range(kb, num_splits, split)?;

        // ---- Q tile → shared memory
        kb.section("load Q tile (cp.async)")?;
        self.load_q(kb)?;
        kb.cp_async_commit()?;

        let has_any = kb.icmp(IntPredicate::SLT, begin, end, "")?;
        kb.if_then(has_any, "prologue", |kb| {
            let first = self.tiles().tile_at(kb, begin)?;
            self.load_kv(kb, first, 0)?;
            Ok(())
        })?;
        kb.cp_async_commit()?;

        let tile = kb.slot_i32("tile", begin)?;
        let stage = kb.slot_i32("stage", kb.i32c(0))?;
        kb.while_loop(
            "kv_loop",
            |kb| {
                let t = kb.get_i(tile, "")?;
                kb.icmp(IntPredicate::SLT, t, end, "")
            },
            |kb| {
                let t = kb.get_i(tile, "n")?;
                let st = kb.get_i(stage, "st")?;
                let next = self.tiles().next_nonempty(kb, kb.add(t, kb.i32c(1), "")?, end, "next_tile")?;
                let has_next = kb.icmp(IntPredicate::SLT, next, end, "")?;
                kb.section("prefetch next K/V tile (cp.async)")?;
                let other = kb.xor(st, kb.i32c(1), "")?;
                kb.if_then(has_next, "prefetch", |kb| {
                    let next_tile = self.tiles().tile_at(kb, next)?;
                    self.load_kv_dyn(kb, next_tile, other)
                })?;
                kb.cp_async_commit()?;
                kb.cp_async_wait(1)?;
                kb.bar_sync()?;

                // Full tiles inside seqlen_k skip per-element masking. `t` is a walk
                // position: with a block mask, an index into the row's tile list.
                let n0 = kb.mul(self.tiles().tile_at(kb, t)?, kb.i32c(bn), "n0")?;
                let unmasked = self.tiles().unmasked(kb, t)?;
                if spec_has_predicate(self.spec) {
                    self.tile_step(kb, n0, st, TileMask::AtRunTime(unmasked))?;
                } else {
                    // Without a mask predicate only the last tile needs the seqlen_k bound:
                    // two copies of the tile body, each one basic block. Measured ~2-3%
                    // faster than one body with a branch around the masking, at ~35% more
                    // compile time (docs/portable.md).
                    kb.if_else(
                        unmasked,
                        "tile",
                        |kb| self.tile_step(kb, n0, st, TileMask::None),
                        |kb| self.tile_step(kb, n0, st, TileMask::Bounds),
                    )?;
                }
                kb.bar_sync()?;
                kb.set(tile, next)?;
                kb.set(stage, other)?;
                Ok(())
            },
        )?;
        kb.cp_async_wait(0)?;
        self.epilogue(kb)
    }

    /// The CTA's key-tile walk (classification, empty-tile skipping, split ranges).
    fn tiles(&self) -> KeyTiles<'_, 'ctx> {
        KeyTiles {
            spec: self.spec,
            block_n: self.cfg.block_n,
            bv: self.bv,
            hkv: self.hkv,
            q: self.tile_q,
            h: self.tile_h,
            va: &self.va,
            list: self.row_list,
        }
    }

    // ------------------------------------------------------------------ loads

    fn load_q(&self, kb: &mut Kb<'ctx>) -> R<()> {
        let spec = self.spec;
        let cfg = self.cfg;
        let chunks_per_row = spec.head_dim_qk / 8;
        let total = cfg.block_m() * chunks_per_row;
        let q_st = self.args.strides("q")?;
        let q_base = self.args.int("q")?;
        let row0 = kb.mul(kb.sreg("ctaid.x", "")?, kb.i32c(cfg.block_m() as i64), "")?;
        let head_idx = kb.sreg("ctaid.y", "")?;
        let group = spec.group_size() as i64;
        let rows_total = if spec.pack_gqa { kb.mul(self.bv.seqlen_q, kb.i32c(group), "")? } else { self.bv.seqlen_q };
        let rb = cfg.row_bytes(spec.head_dim_qk) as i64;
        for it in 0..total.div_ceil(cfg.threads()) {
            let c = kb.add(self.tid, kb.i32c((it * cfg.threads()) as i64), "q_chunk")?;
            let guard = if (it + 1) * cfg.threads() > total {
                Some(kb.icmp(IntPredicate::SLT, c, kb.i32c(total as i64), "")?)
            } else {
                None
            };
            let body = |kb: &mut Kb<'ctx>| -> R<()> {
                let row = kb.udiv(c, kb.i32c(chunks_per_row as i64), "")?;
                let chunk = kb.urem(c, kb.i32c(chunks_per_row as i64), "")?;
                let r = kb.add(row0, row, "")?;
                let valid = kb.icmp(IntPredicate::SLT, r, rows_total, "")?;
                let (q, h) = packed_row(kb, spec.pack_gqa, group, r, head_idx, self.hkv)?;
                let q = kb.select_i(valid, q, kb.i32c(0), "")?;
                let off = q_row_offset(kb, &self.bv, &q_st, q, h)?;
                let off = kb.add(off, kb.mul(kb.zext64(chunk, "")?, kb.i64c(8), "")?, "")?;
                let gaddr = kb.add(q_base, kb.mul(off, kb.i64c(2), "")?, "")?;
                let gaddr = kb.select_i(valid, gaddr, q_base, "")?;
                let bytes = kb.select_i(valid, kb.i32c(16), kb.i32c(0), "")?;
                let saddr =
                    kb.add(kb.add(self.smem, kb.mul(row, kb.i32c(rb), "")?, "")?, kb.mul(chunk, kb.i32c(16), "")?, "")?;
                kb.cp_async_16(saddr, gaddr, bytes)
            };
            match guard {
                Some(g) => kb.if_then(g, "q_chunk_guard", body)?,
                None => body(kb)?,
            }
        }
        Ok(())
    }

    fn load_kv(&self, kb: &mut Kb<'ctx>, tile: IntValue<'ctx>, stage: u32) -> R<()> {
        self.load_kv_dyn(kb, tile, kb.i32c(stage as i64))
    }

    /// cp.async of K and V tile `tile` into `stage`; rows past seqlen_k are zero-filled.
    fn load_kv_dyn(&self, kb: &mut Kb<'ctx>, tile: IntValue<'ctx>, stage: IntValue<'ctx>) -> R<()> {
        let spec = self.spec;
        let cfg = self.cfg;
        let bn = cfg.block_n as i64;
        let n0 = kb.mul(tile, kb.i32c(bn), "")?;
        let tid = kb.opaque_i32(self.tid, "tid_kv")?;
        for (which, d) in [("k", spec.head_dim_qk), ("v", spec.head_dim_v)] {
            let chunks_per_row = d / 8;
            let total = cfg.block_n * chunks_per_row;
            let base = self.args.int(which)?;
            let rb = cfg.row_bytes(d) as i64;
            let stage_base = kb.add(
                self.smem,
                kb.add(
                    kb.i32c(if which == "k" { cfg.k_offset(spec) } else { cfg.v_offset(spec) } as i64),
                    kb.mul(stage, kb.i32c(bn * rb), "")?,
                    "",
                )?,
                &format!("{which}_stage_base"),
            )?;
            for it in 0..total.div_ceil(cfg.threads()) {
                let c = kb.add(tid, kb.i32c((it * cfg.threads()) as i64), "kv_chunk")?;
                let guard = if (it + 1) * cfg.threads() > total {
                    Some(kb.icmp(IntPredicate::SLT, c, kb.i32c(total as i64), "")?)
                } else {
                    None
                };
                let body = |kb: &mut Kb<'ctx>| -> R<()> {
                    let row = kb.udiv(c, kb.i32c(chunks_per_row as i64), "")?;
                    let chunk = kb.urem(c, kb.i32c(chunks_per_row as i64), "")?;
                    let key = kb.add(n0, row, "key")?;
                    let valid = kb.icmp(IntPredicate::SLT, key, self.bv.seqlen_k, "")?;
                    let key_c = kb.select_i(valid, key, kb.i32c(0), "")?;
                    let (ko, vo) =
                        kv_row_offsets(kb, spec, &self.la, &self.bv, &self.k_st, &self.v_st, key_c, self.hkv)?;
                    let off = if which == "k" { ko } else { vo };
                    let off = kb.add(off, kb.mul(kb.zext64(chunk, "")?, kb.i64c(8), "")?, "")?;
                    let gaddr = kb.add(base, kb.mul(off, kb.i64c(2), "")?, "")?;
                    let gaddr = kb.select_i(valid, gaddr, base, "")?;
                    let bytes = kb.select_i(valid, kb.i32c(16), kb.i32c(0), "")?;
                    let saddr = kb.add(
                        kb.add(stage_base, kb.mul(row, kb.i32c(rb), "")?, "")?,
                        kb.mul(chunk, kb.i32c(16), "")?,
                        "",
                    )?;
                    kb.cp_async_16(saddr, gaddr, bytes)
                };
                match guard {
                    Some(g) => kb.if_then(g, "kv_chunk_guard", body)?,
                    None => body(kb)?,
                }
            }
        }
        // Keys past seqlen_k are clamped to key 0 before addressing, so no block-table
        // read goes past seqused_k.
        Ok(())
    }

    // ------------------------------------------------------------------ one tile

    /// One K/V tile: S = Q·Kᵀ, the online softmax, O += P·V, with the masking `mask`
    /// says.
    fn tile_step(&self, kb: &mut Kb<'ctx>, n0: IntValue<'ctx>, stage: IntValue<'ctx>, mask: TileMask<'ctx>) -> R<()> {
        let spec = self.spec;
        let cfg = self.cfg;
        let mt_n = cfg.m_tiles;
        let n_tiles8 = cfg.block_n / 8;
        let tid = kb.opaque_i32(self.tid, "tid_tile")?;
        let lane = kb.and(tid, kb.i32c(31), "")?;
        let l8 = kb.and(lane, kb.i32c(7), "")?;
        let l8_bit = kb.and(kb.udiv(lane, kb.i32c(8), "")?, kb.i32c(1), "")?;
        let l16 = kb.udiv(lane, kb.i32c(16), "")?;
        let warp = kb.udiv(tid, kb.i32c(32), "")?;

        // ---- S = Q·Kᵀ
        kb.section("tcore S = Q·Kᵀ (mma.sync m16n8k16)")?;
        let rbq = cfg.row_bytes(spec.head_dim_qk) as i64;
        let rbv = cfg.row_bytes(spec.head_dim_v) as i64;
        let bn = cfg.block_n as i64;
        // ldmatrix lane addresses (bytes): A from Q rows, B from K rows.
        let q_row =
            kb.add(kb.mul(warp, kb.i32c(16 * mt_n as i64), "")?, kb.add(l8, kb.mul(l8_bit, kb.i32c(8), "")?, "")?, "")?;
        let q_lane = kb.add(
            self.smem,
            kb.add(kb.mul(q_row, kb.i32c(rbq), "")?, kb.mul(l16, kb.i32c(16), "")?, "")?,
            "q_lane_addr",
        )?;
        let k_stage = kb.add(kb.i32c(cfg.k_offset(spec) as i64), kb.mul(stage, kb.i32c(bn * rbq), "")?, "")?;
        let k_row = kb.add(l8, kb.mul(l16, kb.i32c(8), "")?, "")?;
        let k_lane = kb.add(
            kb.add(self.smem, k_stage, "")?,
            kb.add(kb.mul(k_row, kb.i32c(rbq), "")?, kb.mul(l8_bit, kb.i32c(16), "")?, "")?,
            "k_lane_addr",
        )?;
        let zero = kb.f32c(0.0);
        let mut s = vec![vec![[zero; 4]; n_tiles8 as usize]; mt_n as usize];
        for kk in 0..spec.head_dim_qk / 16 {
            let mut a = Vec::new();
            for mt in 0..mt_n {
                a.push(kb.ldmatrix_x4(q_lane, mt as i64 * 16 * rbq + kk as i64 * 32, false, "q_frag")?);
            }
            for np in 0..n_tiles8 / 2 {
                let bk = kb.ldmatrix_x4(k_lane, np as i64 * 16 * rbq + kk as i64 * 32, false, "k_frag")?;
                for mt in 0..mt_n as usize {
                    let n = 2 * np as usize;
                    s[mt][n] = kb.mma_m16n8k16(spec.dtype, a[mt], [bk[0], bk[1]], s[mt][n], "s")?;
                    s[mt][n + 1] = kb.mma_m16n8k16(spec.dtype, a[mt], [bk[2], bk[3]], s[mt][n + 1], "s")?;
                }
            }
        }

        // ---- softmax
        kb.section("softmax (online, exp2 domain)")?;
        let scale = spec.scale_value();
        let opts = spec.softmax;
        let col_base = kb.add(n0, kb.mul(self.quad_col(kb, tid)?, kb.i32c(2), "")?, "")?;
        let rows = if spec.score_mod.is_some() { self.thread_rows(kb, tid)? } else { Vec::new() };
        // Scores in log2 units (after the score modification).
        for mt in 0..mt_n as usize {
            for half in 0..2usize {
                let ri = mt * 2 + half;
                let row = rows.get(ri).copied();
                for nt in 0..n_tiles8 as usize {
                    for e in 0..2usize {
                        let idx = half * 2 + e;
                        let raw = s[mt][nt][idx];
                        let col = kb.add(col_base, kb.i32c((nt * 8 + e) as i64), "k_pos")?;
                        let v = match (&spec.score_mod, row) {
                            (Some(m), Some(r)) => vexpr::modded_score_log2(
                                kb,
                                spec,
                                m,
                                raw,
                                self.bv.elem_vars(self.hkv, r.q, r.h, col),
                                &self.va,
                            )?,
                            _ => kb.fmul(raw, kb.f32c(scale * LOG2E), "s_log2")?,
                        };
                        s[mt][nt][idx] = v;
                    }
                }
            }
        }
        if let TileMask::Bounds = mask {
            // Only the seqlen_k bound: a compare and select per element.
            let limit = kb.sub(self.bv.seqlen_k, col_base, "k_limit")?;
            for row in s.iter_mut() {
                for (nt, frag) in row.iter_mut().enumerate() {
                    for (e, v) in frag.iter_mut().enumerate() {
                        let inside =
                            kb.icmp(IntPredicate::SLT, kb.i32c((nt * 8 + e % 2) as i64), limit, "k_in_bounds")?;
                        *v = kb.select_f(inside, *v, kb.f32c(f64::NEG_INFINITY), "s_masked")?;
                    }
                }
            }
        } else if let TileMask::AtRunTime(unmasked) = mask {
            // Partial tiles: the mask and the seqlen_k bound per element, to -inf. The
            // only part that differs between full and partial tiles, so the GEMMs are
            // emitted once.
            let mut s_slots = Vec::new();
            for (mt, row) in s.iter().enumerate() {
                for (nt, frag) in row.iter().enumerate() {
                    for (e, v) in frag.iter().enumerate() {
                        s_slots.push(((mt, nt, e), kb.slot_f32("s", *v)?));
                    }
                }
            }
            let partial = kb.not(unmasked, "partial_tile")?;
            kb.if_then(partial, "mask_tile", |kb| {
                kb.section("mask (partial tile)")?;
                let tid = kb.opaque_i32(self.tid, "tid_mask")?;
                let rows = self.thread_rows(kb, tid)?;
                let col_base = kb.add(n0, kb.mul(self.quad_col(kb, tid)?, kb.i32c(2), "")?, "")?;
                let predicate = spec.mask.to_predicate();
                for &((mt, nt, e), slot) in &s_slots {
                    let row = rows[mt * 2 + e / 2];
                    let col = kb.add(col_base, kb.i32c((nt * 8 + e % 2) as i64), "k_pos")?;
                    let vars = self.bv.elem_vars(self.hkv, row.q, row.h, col);
                    let allowed = vexpr::allowed(kb, spec, predicate.as_ref(), &vars, &self.va)?;
                    let v = kb.get_f(slot, "")?;
                    kb.set(slot, kb.select_f(allowed, v, kb.f32c(f64::NEG_INFINITY), "s_masked")?)?;
                }
                Ok(())
            })?;
            for &((mt, nt, e), slot) in &s_slots {
                s[mt][nt][e] = kb.get_f(slot, "s")?;
            }
        }
        // Row maxima (each row is spread over the 4 threads of a quad).
        let mut new_max = Vec::new();
        for mt in 0..mt_n as usize {
            for half in 0..2usize {
                let ri = mt * 2 + half;
                let mut m = kb.get_f(self.row_max[ri], "m_old")?;
                for nt in 0..n_tiles8 as usize {
                    for e in 0..2 {
                        m = kb.fmax(m, s[mt][nt][half * 2 + e], "")?;
                    }
                }
                m = kb.fmax(m, kb.shfl_xor_f32(m, 1, "")?, "")?;
                m = kb.fmax(m, kb.shfl_xor_f32(m, 2, "")?, "m_new")?;
                new_max.push(m);
            }
        }
        // The exponent base per row: the new max, or with conditional rescaling the old
        // one unless some row of the warp grew by more than the threshold.
        let old: Vec<FloatValue<'ctx>> = self.row_max.iter().map(|m| kb.get_f(*m, "m_old")).collect::<R<_>>()?;
        let upd = max_update(kb, &old, &new_max, opts.rescale_threshold)?;
        for (slot, m) in self.row_max.iter().zip(&upd.maxes) {
            kb.set(*slot, *m)?;
        }
        let (alphas, bases, rescale_all) = (upd.alphas, upd.bases, upd.rescale);
        // P = 2^(s − base); a fraction of each row through the FMA-pipe emulation.
        let per_row = (n_tiles8 * 2) as usize;
        let emulated = ((opts.exp2_emulation * per_row as f64).round() as usize).min(per_row);
        for mt in 0..mt_n as usize {
            for half in 0..2usize {
                let ri = mt * 2 + half;
                let mut sum = kb.f32c(0.0);
                let mut j = 0usize;
                for nt in 0..n_tiles8 as usize {
                    for e in 0..2usize {
                        let x = kb.fsub(s[mt][nt][half * 2 + e], bases[ri], "")?;
                        let p = if j < emulated { exp2_emulated(kb, x)? } else { kb.ex2(x, "p")? };
                        j += 1;
                        s[mt][nt][half * 2 + e] = p;
                        sum = kb.fadd(sum, p, "")?;
                    }
                }
                let l = kb.get_f(self.row_sum[ri], "")?;
                let l = kb.fma(l, alphas[ri], sum, "row_sum")?;
                kb.set(self.row_sum[ri], l)?;
            }
        }
        // Rescale O (skipped as a whole when conditional rescaling kept every base).
        let rescale_o = |kb: &mut Kb<'ctx>| -> R<()> {
            for mt in 0..mt_n {
                for dt in 0..spec.head_dim_v / 8 {
                    for e in 0..4u32 {
                        let slot = self.o_slot(mt, dt, e);
                        let ri = (mt * 2 + e / 2) as usize;
                        let o = kb.get_f(slot, "")?;
                        kb.set(slot, kb.fmul(o, alphas[ri], "")?)?;
                    }
                }
            }
            Ok(())
        };
        match rescale_all {
            Some(c) => kb.if_then(c, "rescale_o", rescale_o)?,
            None => rescale_o(kb)?,
        }

        // ---- O += P·V
        kb.section("tcore O += P·V (mma.sync m16n8k16, P from registers)")?;
        let v_stage = kb.add(kb.i32c(cfg.v_offset(spec) as i64), kb.mul(stage, kb.i32c(bn * rbv), "")?, "")?;
        let v_row = kb.add(l8, kb.mul(l8_bit, kb.i32c(8), "")?, "")?;
        let v_lane = kb.add(
            kb.add(self.smem, v_stage, "")?,
            kb.add(kb.mul(v_row, kb.i32c(rbv), "")?, kb.mul(l16, kb.i32c(16), "")?, "")?,
            "v_lane_addr",
        )?;
        let mut o: Vec<Vec<[FloatValue<'ctx>; 4]>> = Vec::new();
        for mt in 0..mt_n {
            let mut row = Vec::new();
            for dt in 0..spec.head_dim_v / 8 {
                let mut f = [zero; 4];
                for (e, x) in f.iter_mut().enumerate() {
                    *x = kb.get_f(self.o_slot(mt, dt, e as u32), "o")?;
                }
                row.push(f);
            }
            o.push(row);
        }
        for j in 0..(cfg.block_n / 16) as usize {
            let mut a = Vec::new();
            for mt in 0..mt_n as usize {
                let (t0, t1) = (s[mt][2 * j], s[mt][2 * j + 1]);
                a.push([
                    kb.pack_half2(spec.dtype, t0[0], t0[1], "p01")?,
                    kb.pack_half2(spec.dtype, t0[2], t0[3], "p23")?,
                    kb.pack_half2(spec.dtype, t1[0], t1[1], "p45")?,
                    kb.pack_half2(spec.dtype, t1[2], t1[3], "p67")?,
                ]);
            }
            for dp in 0..(spec.head_dim_v / 16) as usize {
                let bv = kb.ldmatrix_x4(v_lane, j as i64 * 16 * rbv + dp as i64 * 32, true, "v_frag")?;
                for mt in 0..mt_n as usize {
                    o[mt][2 * dp] = kb.mma_m16n8k16(spec.dtype, a[mt], [bv[0], bv[1]], o[mt][2 * dp], "o")?;
                    o[mt][2 * dp + 1] = kb.mma_m16n8k16(spec.dtype, a[mt], [bv[2], bv[3]], o[mt][2 * dp + 1], "o")?;
                }
            }
        }
        for mt in 0..mt_n {
            for dt in 0..spec.head_dim_v / 8 {
                for e in 0..4u32 {
                    kb.set(self.o_slot(mt, dt, e), o[mt as usize][dt as usize][e as usize])?;
                }
            }
        }
        Ok(())
    }

    // ------------------------------------------------------------------ epilogue

    fn epilogue(&self, kb: &mut Kb<'ctx>) -> R<()> {
        let spec = self.spec;
        let cfg = self.cfg;
        kb.section("epilogue: O /= l, store O and LSE (or split partials)")?;
        let num_splits = self.args.int("num_splits")?;
        let is_split = kb.icmp(IntPredicate::SGT, num_splits, kb.i32c(1), "is_split")?;
        let tid = kb.opaque_i32(self.tid, "tid_epilogue")?;
        let rows = self.thread_rows(kb, tid)?;
        let quad_col = self.quad_col(kb, tid)?;
        let store = RowStore { spec, args: &self.args, bv: &self.bv, max_seqlen_q: self.la.seqlen_q, is_split };
        // The split's index and the batch size, from the grid's z = batch x splits.
        let split = |kb: &Kb<'ctx>| -> R<(IntValue<'ctx>, IntValue<'ctx>)> {
            let z = kb.sreg("ctaid.z", "")?;
            let nz = kb.sreg("nctaid.z", "")?;
            let batch = kb.udiv(nz, num_splits, "batch")?;
            Ok((kb.urem(z, num_splits, "")?, batch))
        };
        for mt in 0..cfg.m_tiles {
            for half in 0..2u32 {
                let ri = (mt * 2 + half) as usize;
                let row = rows[ri];
                let l = kb.get_f(self.row_sum[ri], "")?;
                let m = kb.get_f(self.row_max[ri], "m_final")?;
                let (o_scale, lse) = finish_row(kb, spec, &self.args, l, m, row.h, is_split)?;
                // O normalized where it is stored (in each branch).
                let cols = |kb: &Kb<'ctx>, dt: u32| -> R<(FloatValue<'ctx>, FloatValue<'ctx>)> {
                    let x0 = kb.fmul(kb.get_f(self.o_slot(mt, dt, half * 2), "")?, o_scale, "")?;
                    let x1 = kb.fmul(kb.get_f(self.o_slot(mt, dt, half * 2 + 1), "")?, o_scale, "")?;
                    Ok((x0, x1))
                };
                store.store(kb, row, quad_col, lse, &cols, &split)?;
            }
        }
        Ok(())
    }
}

/// How a tile body masks its scores.
#[derive(Clone, Copy)]
enum TileMask<'ctx> {
    /// A full tile inside seqlen_k: nothing.
    None,
    /// Only the seqlen_k bound (specs without a mask predicate).
    Bounds,
    /// The mask predicate and the bound, skipped at run time when the flag (the tile is
    /// full and inside seqlen_k) is set.
    AtRunTime(IntValue<'ctx>),
}

fn spec_has_predicate(spec: &Spec) -> bool {
    spec.mask.to_predicate().is_some()
}
