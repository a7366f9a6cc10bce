//! The forward's producer warpgroup: the K/V loads into the ring, by one thread's TMA
//! (contiguous, varlen), by warp 0's TMA boxes over a paged cache, or by four warps'
//! cp.async row gather (pages TMA boxes cannot follow).

use super::super::config::{Config, RingBar, BOX_COLS, ROW_BYTES};
use super::{Cta, Kernel, TileRole};
use crate::families::common::paged::PagedBoxes;
use crate::families::common::sw128::{emit_chunk_addr, zero_row};
use crate::llvm::kb::{Kb, Slot, R};
use crate::variant::tiles::KeyTiles;
use attnc_ir::KvLayout;
use inkwell::values::IntValue;
use inkwell::IntPredicate;

/// Paged K/V loaded by TMA: the page size, the boxes of a tile, and the shared-memory
/// offset of the tail tile's V barrier.
#[derive(Clone, Copy)]
pub(super) struct PagedTma {
    pub page_size: u32,
    pub boxes: PagedBoxes,
    pub tail_v: u32,
}

/// What a gather producer warp copies: V (else K) and which half of each tile's rows,
/// constants for a warp with code of its own, or read from the warp index when the four
/// warps share one copy of the code (`Config::gather_shared`).
#[derive(Clone, Copy)]
pub(super) struct GatherWarp<'ctx> {
    /// i1: V's rows, else K's.
    pub is_v: IntValue<'ctx>,
    /// i32: 0 or 1.
    pub half: IntValue<'ctx>,
}

impl<'ctx> Kernel<'_, 'ctx> {
    pub(super) fn producer(&self, kb: &mut Kb<'ctx>) -> R<()> {
        let tmap_k = kb.param_generic_addr(&format!("{}_param_0", self.name), "tmap_k")?;
        let tmap_v = kb.param_generic_addr(&format!("{}_param_1", self.name), "tmap_v")?;
        kb.tensormap_prefetch(tmap_k)?;
        kb.tensormap_prefetch(tmap_v)?;
        // Ring positions run on from one work tile to the next (persistent CTAs).
        let pos = kb.slot_i32("p_pos", kb.i32c(0))?;
        self.for_each_tile(kb, TileRole::Producer, |kb, at| {
            let cta = self.cta_at(kb, at)?;
            match at {
                None => self.produce_tile(kb, &cta, (tmap_k, tmap_v), pos),
                Some(_) => {
                    let inside = kb.icmp(IntPredicate::SLT, cta.row0, cta.rows_total, "tile_inside")?;
                    kb.if_then(inside, "work_tile", |kb| self.produce_tile(kb, &cta, (tmap_k, tmap_v), pos))
                }
            }
        })
    }

    /// The TMA loads of one work tile's key tiles, from ring position `pos` on.
    fn produce_tile(
        &self,
        kb: &mut Kb<'ctx>,
        cta: &Cta<'ctx>,
        (tmap_k, tmap_v): (IntValue<'ctx>, IntValue<'ctx>),
        pos: Slot<'ctx>,
    ) -> R<()> {
        let spec = self.spec;
        let cfg = self.cfg;
        let tiles = self.tiles(cta);
        let (begin, end) = tiles.split_range(kb, cta.num_splits, cta.split)?;
        let layout = cfg.smem(spec);
        // Row coordinate base and batch coordinate in the tensor maps.
        let (row_base, batch_coord) = match spec.kv_layout {
            KvLayout::Varlen => (cta.bv.k_start.unwrap_or_else(|| kb.i32c(0)), kb.i32c(0)),
            _ => (kb.i32c(0), cta.bv.b),
        };
        self.produce_tiles(kb, &tiles, (begin, end), pos, "produce", |kb, t, slot, free_parity| {
            let row = kb.add(row_base, kb.mul(t, kb.i32c(cfg.block_n as i64), "")?, "key_row")?;
            for (which, tmap, full, empty, d, base, per) in [
                ("K", tmap_k, RingBar::FullK, RingBar::EmptyK, spec.head_dim_qk, layout.k, layout.k_per_stage),
                ("V", tmap_v, RingBar::FullV, RingBar::EmptyV, spec.head_dim_v, layout.v, layout.v_per_stage),
            ] {
                kb.section(&format!("TMA {which} tile -> ring slot"))?;
                let e = self.ring_bar(kb, cta.smem, empty, slot)?;
                kb.mbar_wait(e, free_parity)?;
                let f = self.ring_bar(kb, cta.smem, full, slot)?;
                kb.mbar_arrive_expect_tx(f, per)?;
                let dst0 =
                    kb.add(cta.smem, kb.add(kb.i32c(base as i64), kb.mul(slot, kb.i32c(per as i64), "")?, "")?, "")?;
                for cb in 0..Config::col_blocks(d) {
                    let dst = kb.add(dst0, kb.i32c((cb * cfg.block_n * ROW_BYTES) as i64), "tma_dst")?;
                    kb.tma_load_4d(dst, tmap, [kb.i32c((cb * BOX_COLS) as i64), row, cta.hkv, batch_coord], f)?;
                }
            }
            Ok(())
        })
    }

    /// The producer of paged K/V that TMA boxes can follow (`common::paged`), warp 0:
    /// lane 0 issues one box per page of the tile (or one inside the tile's page); the
    /// 32 lanes hold a window of block-table entries (lane i: page `win + i`, clamped to
    /// the sequence's last page), read together when the walk leaves the window and
    /// handed to lane 0 by shuffles. (Reading the next window ahead measured the same:
    /// `docs/results/2026-11-27-h100-paged-tma/`.) On the tile that ends past seqlen_k,
    /// V lands on the `tail_v` barrier first and the warp zeroes its rows past the end
    /// before lane 0 completes `full_v`: a page's unused rows (and the clamped pages) may
    /// hold anything, P is 0 there, and 0 · NaN is NaN. K's rows there need nothing:
    /// their scores are masked by a select.
    pub(super) fn producer_paged(&self, kb: &mut Kb<'ctx>, paged: PagedTma) -> R<()> {
        let spec = self.spec;
        let cfg = self.cfg;
        let PagedTma { page_size, boxes, tail_v } = paged;
        let cta = self.cta(kb)?;
        let tiles = self.tiles(&cta);
        let tmap_k = kb.param_generic_addr(&format!("{}_param_0", self.name), "tmap_k")?;
        let tmap_v = kb.param_generic_addr(&format!("{}_param_1", self.name), "tmap_v")?;
        let lane = kb.and(kb.opaque_i32(kb.sreg("tid.x", "")?, "")?, kb.i32c(31), "lane")?;
        let lane0 = kb.icmp(IntPredicate::EQ, lane, kb.i32c(0), "lane0")?;
        kb.if_then(lane0, "prefetch_maps", |kb| {
            kb.tensormap_prefetch(tmap_k)?;
            kb.tensormap_prefetch(tmap_v)
        })?;
        let (begin, end) = tiles.split_range(kb, cta.num_splits, cta.split)?;
        let layout = cfg.smem(spec);
        let tail_bar = kb.add(cta.smem, kb.i32c(tail_v as i64), "tail_v_bar")?;
        let bn = cfg.block_n;
        let ps = kb.i32c(page_size as i64);
        let bt = self.args.int("block_table")?;
        let bt_row = kb.mul(kb.sext64(cta.bv.b, "")?, self.args.int("block_table_stride")?, "bt_row")?;
        let last_page = kb.udiv(kb.sub(cta.bv.seqlen_k, kb.i32c(1), "")?, ps, "last_page")?;
        // The window starts far below every page, so the first tile reads it.
        let win = kb.slot_i32("bt_win", kb.i32c(i32::MIN as i64 / 2))?;
        let entry = kb.slot_i32("bt_entry", kb.i32c(0))?;
        let count = boxes.count();
        let box_rows = boxes.box_rows(bn);
        let pos = kb.slot_i32("p_pos", kb.i32c(0))?;
        self.produce_tiles(kb, &tiles, (begin, end), pos, "produce_paged", |kb, t, slot, free_parity| {
            let key0 = kb.mul(t, kb.i32c(bn as i64), "key0")?;
            let first = kb.udiv(key0, ps, "first_page")?;
            kb.section("paged KV: block-table window (a lane per page), read when the tile leaves it")?;
            let w = kb.get_i(win, "")?;
            let below = kb.icmp(IntPredicate::SLT, first, w, "")?;
            let past =
                kb.icmp(IntPredicate::SGT, kb.add(first, kb.i32c(count as i64), "")?, kb.add(w, kb.i32c(32), "")?, "")?;
            let outside = kb.or(below, past, "window_outside")?;
            kb.if_then(outside, "bt_window", |kb| {
                let idx = kb.smin(kb.add(first, lane, "")?, last_page, "page_idx")?;
                let e = kb.add(bt_row, kb.sext64(idx, "")?, "")?;
                let page = kb.ld_global_i32(kb.add(bt, kb.mul(e, kb.i64c(4), "")?, "bt_entry_addr")?, "page")?;
                kb.set(win, first)?;
                kb.set(entry, page)
            })?;
            let w = kb.get_i(win, "win")?;
            let e = kb.get_i(entry, "entry")?;
            let off = kb.sub(first, w, "window_offset")?;
            let row_in_page = match boxes {
                PagedBoxes::InsidePage => kb.urem(key0, ps, "row_in_page")?,
                PagedBoxes::PerPage { .. } => kb.i32c(0),
            };
            let pages = (0..count)
                .map(|p| kb.shfl_idx_i32(e, kb.add(off, kb.i32c(p as i64), "")?, "tile_page"))
                .collect::<R<Vec<_>>>()?;
            let issue = |kb: &mut Kb<'ctx>, tmap, d: u32, base: u32, per: u32, bar| -> R<()> {
                kb.mbar_arrive_expect_tx(bar, per)?;
                let dst0 =
                    kb.add(cta.smem, kb.add(kb.i32c(base as i64), kb.mul(slot, kb.i32c(per as i64), "")?, "")?, "")?;
                for cb in 0..Config::col_blocks(d) {
                    for (i, &page) in pages.iter().enumerate() {
                        let at = cb * bn * ROW_BYTES + i as u32 * box_rows * ROW_BYTES;
                        let dst = kb.add(dst0, kb.i32c(at as i64), "tma_dst")?;
                        kb.tma_load_4d(dst, tmap, [kb.i32c((cb * BOX_COLS) as i64), row_in_page, cta.hkv, page], bar)?;
                    }
                }
                Ok(())
            };
            kb.section("TMA K tile (page boxes) -> ring slot")?;
            kb.mbar_wait(self.ring_bar(kb, cta.smem, RingBar::EmptyK, slot)?, free_parity)?;
            let full_k = self.ring_bar(kb, cta.smem, RingBar::FullK, slot)?;
            kb.if_then(lane0, "tma_k", |kb| issue(kb, tmap_k, spec.head_dim_qk, layout.k, layout.k_per_stage, full_k))?;
            kb.section("TMA V tile (page boxes) -> ring slot")?;
            kb.mbar_wait(self.ring_bar(kb, cta.smem, RingBar::EmptyV, slot)?, free_parity)?;
            let full_v = self.ring_bar(kb, cta.smem, RingBar::FullV, slot)?;
            let valid = kb.sub(cta.bv.seqlen_k, key0, "valid_rows")?;
            let tail = kb.icmp(IntPredicate::SLT, valid, kb.i32c(bn as i64), "tail_tile")?;
            let (v_base, v_per) = (layout.v, layout.v_per_stage);
            kb.if_else(
                tail,
                "v_tail",
                |kb| {
                    kb.section("tail tile: V lands on tail_v, rows past seqlen_k zeroed, then full_v")?;
                    kb.if_then(lane0, "tma_v_tail", |kb| issue(kb, tmap_v, spec.head_dim_v, v_base, v_per, tail_bar))?;
                    // A CTA walks the sequence's last tile at most once: phase 0.
                    kb.mbar_wait(tail_bar, kb.i32c(0))?;
                    let dst0 = kb.add(
                        cta.smem,
                        kb.add(kb.i32c(v_base as i64), kb.mul(slot, kb.i32c(v_per as i64), "")?, "")?,
                        "v_slot",
                    )?;
                    for j in 0..bn.div_ceil(32) {
                        let r = kb.add(kb.add(valid, lane, "")?, kb.i32c(32 * j as i64), "dead_row")?;
                        let dead = kb.icmp(IntPredicate::SLT, r, kb.i32c(bn as i64), "")?;
                        kb.if_then(dead, "zero_v_row", |kb| {
                            let row_addr = kb.add(dst0, kb.mul(r, kb.i32c(ROW_BYTES as i64), "")?, "v_row")?;
                            zero_row(kb, row_addr, spec.head_dim_v, bn * ROW_BYTES)
                        })?;
                    }
                    // The zeros (generic proxy) before the consumers' wgmma reads (async).
                    kb.fence_proxy_async_shared()?;
                    kb.warp_sync()?;
                    kb.if_then(lane0, "full_v_arrive", |kb| kb.mbar_arrive(full_v))
                },
                |kb| kb.if_then(lane0, "tma_v", |kb| issue(kb, tmap_v, spec.head_dim_v, v_base, v_per, full_v)),
            )
        })
    }

    /// The producer's walk: for each non-empty key tile in `[begin, end)` (the
    /// consumers' sequence), `body(tile, ring slot, parity that means the slot is free)`.
    pub(super) fn produce_tiles(
        &self,
        kb: &mut Kb<'ctx>,
        tiles: &KeyTiles<'_, 'ctx>,
        (begin, end): (IntValue<'ctx>, IntValue<'ctx>),
        pos: Slot<'ctx>,
        name: &str,
        body: impl FnOnce(&mut Kb<'ctx>, IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>) -> R<()>,
    ) -> R<()> {
        let tile = kb.slot_i32("p_tile", begin)?;
        kb.while_loop(
            name,
            |kb| {
                let t = kb.get_i(tile, "")?;
                kb.icmp(IntPredicate::SLT, t, end, "")
            },
            |kb| {
                let t = kb.get_i(tile, "t")?;
                let p = kb.get_i(pos, "pos")?;
                let (slot, parity) = self.ring(kb, p)?;
                let free_parity = kb.xor(parity, kb.i32c(1), "free_parity")?;
                body(kb, tiles.tile_at(kb, t)?, slot, free_parity)?;
                let next = tiles.next_nonempty(kb, kb.add(t, kb.i32c(1), "")?, end, "p_next")?;
                kb.set(tile, next)?;
                kb.set(pos, kb.add(p, kb.i32c(1), "")?)
            },
        )
    }

    /// The gather producer (paged KV), four warps: K (warps 0, 2) and V (1, 3), each
    /// warp half of the tile's rows, so each has a quarter of the block-table reads and
    /// copies on its path (the gather is latency- and issue-bound). Each lane holds the
    /// pages of rows `lane + 32 i` of a window of `stages` tiles, read together when the
    /// walk leaves the window (before the slot wait), one read's latency for the window's
    /// tiles (H100: page 1 b1 × 32k −4.6% GPU time, b1 × 4k unchanged;
    /// docs/results/2026-11-28-h100-gather-window/); then, per tile, the warp copies 4 rows × 128 bytes
    /// per cp.async round, the row offsets exchanged by shuffles; rows past seqlen_k are
    /// zero-filled (src-size 0), so no stale page content reaches P·V. Each lane's
    /// `cp.async.mbarrier.arrive.noinc` completes the full barrier (count 64: the two
    /// warps of its tensor) when its copies land. `warp` says what this warp copies:
    /// constants, or (`Config::gather_shared`) values from the warp index, so the four
    /// warps run one copy of this code.
    pub(super) fn producer_gather(&self, kb: &mut Kb<'ctx>, warp: GatherWarp<'ctx>) -> R<()> {
        let spec = self.spec;
        let cfg = self.cfg;
        let cta = self.cta(kb)?;
        let tiles = self.tiles(&cta);
        let (begin, end) = tiles.split_range(kb, cta.num_splits, cta.split)?;
        let layout = cfg.smem(spec);
        let k_st = self.args.strides("k")?;
        let v_st = self.args.strides("v")?;
        let k_base = self.args.int("k")?;
        let v_base = self.args.int("v")?;
        let bn = cfg.block_n as i64;
        // This warp's row groups (rows 32i + lane of a tile, i = half · per_warp + g) and
        // the page window: one page per (window tile, group), the window's first tile far
        // below every tile so the first tile reads it. A window as long as the ring (the
        // tiles the producer can run ahead), but at most three pages per lane: with two
        // groups (128-key tiles) a window of two spills the d64 producer (12 bytes, ptxas
        // 13.5), so those read one tile's pages at a time, before its slot wait.
        let per_warp = cfg.block_n / 32 / 2;
        let first_group = kb.mul(warp.half, kb.i32c(per_warp as i64), "first_group")?;
        let window = cfg.stages.min(3 / per_warp.max(1)).max(1);
        let window_pages = match window {
            1 => None,
            _ => {
                let win = kb.slot_i32("gather_win", kb.i32c(i32::MIN as i64 / 2))?;
                let pages = (0..(window * per_warp) as usize)
                    .map(|_| kb.slot_i32("gather_page", kb.i32c(0)))
                    .collect::<R<Vec<_>>>()?;
                Some((win, pages))
            }
        };
        let d = match warp.is_v.get_zero_extended_constant() {
            Some(0) => spec.head_dim_qk,
            Some(_) => spec.head_dim_v,
            None if spec.head_dim_qk == spec.head_dim_v => spec.head_dim_qk,
            None => return Err(crate::error::LowerError::Llvm("a shared gather warp needs d_qk = d_v".into())),
        };
        let pos = kb.slot_i32("p_pos", kb.i32c(0))?;
        self.produce_tiles(kb, &tiles, (begin, end), pos, "gather", |kb, t, slot, free_parity| {
            let n0 = kb.mul(t, kb.i32c(bn), "n0")?;
            // Per tile, not hoisted: three registers fewer live across the walk.
            let lane = kb.and(kb.opaque_i32(kb.sreg("tid.x", "")?, "")?, kb.i32c(31), "lane")?;
            let sub_row = kb.udiv(lane, kb.i32c(8), "sub_row")?;
            let chunk = kb.and(lane, kb.i32c(7), "chunk")?;
            let pick = |kb: &Kb<'ctx>, k: u32, v: u32| kb.select_i(warp.is_v, kb.i32c(v as i64), kb.i32c(k as i64), "");
            // This warp's tensor's barrier of the slot.
            let bar = |kb: &Kb<'ctx>, k: RingBar, v: RingBar, name: &str| {
                let (bk, bv) = (self.ring_bar(kb, cta.smem, k, slot)?, self.ring_bar(kb, cta.smem, v, slot)?);
                kb.select_i(warp.is_v, bv, bk, name)
            };
            let full = bar(kb, RingBar::FullK, RingBar::FullV, "full_bar")?;
            let empty = bar(kb, RingBar::EmptyK, RingBar::EmptyV, "empty_bar")?;
            let base = pick(kb, layout.k, layout.v)?;
            let per = pick(kb, layout.k_per_stage, layout.v_per_stage)?;
            let tbase = kb.select_i(warp.is_v, v_base, k_base, "kv_base")?;
            kb.section("gather K or V tile -> ring slot (cp.async)")?;
            // Row group g of this warp: its first row in the tile.
            let group_row = |kb: &Kb<'ctx>, g: u32| -> R<IntValue<'ctx>> {
                kb.mul(kb.add(first_group, kb.i32c(g as i64), "")?, kb.i32c(32), "group_row")
            };
            // This lane's rows 32i + lane: their pages, then their offsets.
            let row_key = |kb: &mut Kb<'ctx>, tile_row: IntValue<'ctx>| -> R<IntValue<'ctx>> {
                // Keys past the end (the sequence's last tile, or window tiles past it)
                // read a valid entry; their rows are zero-filled below.
                let key = kb.add(n0, kb.add(lane, tile_row, "")?, "")?;
                let valid = kb.icmp(IntPredicate::SLT, key, cta.bv.seqlen_k, "")?;
                kb.select_i(valid, key, kb.i32c(0), "key_clamped")
            };
            let page_of = |kb: &mut Kb<'ctx>, key| crate::variant::layout::kv_page_of(kb, spec, &cta.la, &cta.bv, key);
            let own_pages = match &window_pages {
                // One tile's pages, read before its slot wait.
                None => (0..per_warp)
                    .map(|g| {
                        let row = group_row(kb, g)?;
                        let key = row_key(kb, row)?;
                        page_of(kb, key)
                    })
                    .collect::<R<Vec<_>>>()?,
                Some((win, pages)) => {
                    kb.section(
                        "paged KV: this lane's pages of a window of tiles, read together when the walk leaves it",
                    )?;
                    let w = kb.get_i(*win, "")?;
                    let below = kb.icmp(IntPredicate::SLT, t, w, "")?;
                    let past = kb.icmp(IntPredicate::SGE, t, kb.add(w, kb.i32c(window as i64), "")?, "")?;
                    let outside = kb.or(below, past, "window_outside")?;
                    kb.if_then(outside, "gather_window", |kb| {
                        for wt in 0..window as usize {
                            for g in 0..per_warp {
                                let row = kb.add(group_row(kb, g)?, kb.i32c(wt as i64 * bn), "")?;
                                let key = row_key(kb, row)?;
                                let page = page_of(kb, key)?;
                                kb.set(pages[wt * per_warp as usize + g as usize], page)?;
                            }
                        }
                        kb.set(*win, t)
                    })?;
                    let at = kb.sub(t, kb.get_i(*win, "")?, "window_tile")?;
                    (0..per_warp as usize)
                        .map(|g| {
                            let mut page = kb.get_i(pages[g], "")?;
                            for wt in 1..window as usize {
                                let here = kb.icmp(IntPredicate::EQ, at, kb.i32c(wt as i64), "")?;
                                let p = kb.get_i(pages[wt * per_warp as usize + g], "")?;
                                page = kb.select_i(here, p, page, "row_page")?;
                            }
                            Ok(page)
                        })
                        .collect::<R<Vec<_>>>()?
                }
            };
            let mut own = Vec::new();
            for (g, &page) in (0..per_warp).zip(&own_pages) {
                let row = group_row(kb, g)?;
                let key = row_key(kb, row)?;
                let (ko, vo) =
                    crate::variant::layout::kv_row_offsets_in_page(kb, spec, &k_st, &v_st, key, page, cta.hkv)?;
                own.push((row, kb.select_i(warp.is_v, vo, ko, "row_off")?));
            }
            kb.mbar_wait(empty, free_parity)?;
            let dst0 = kb.add(cta.smem, kb.add(base, kb.mul(slot, per, "")?, "")?, "")?;
            for &(row0, own_off) in &own {
                // Rows row0 + 4j .. +3, j a run-time loop (an unrolled one keeps every
                // address live and spills the producer): this lane copies chunk
                // lane%8 of row row0 + 4j + lane/8, whose offset lane 4j + lane/8 holds.
                kb.for_range_unroll(kb.i32c(0), kb.i32c(8), "gather_rows", !cfg.gather_rolled, |kb, j| {
                    let src = kb.add(kb.mul(j, kb.i32c(4), "")?, sub_row, "src_lane")?;
                    let r = kb.add(row0, src, "row")?;
                    let off = kb.shfl_idx_i64(own_off, src, "row_off")?;
                    let key = kb.add(n0, r, "")?;
                    let valid = kb.icmp(IntPredicate::SLT, key, cta.bv.seqlen_k, "")?;
                    let bytes = kb.select_i(valid, kb.i32c(16), kb.i32c(0), "")?;
                    let row_gaddr = kb.add(tbase, kb.mul(off, kb.i64c(2), "")?, "")?;
                    let s_row = emit_chunk_addr(kb, dst0, r, chunk)?;
                    // A head dim that is not a multiple of 64 leaves the last block's
                    // tail chunks past d: zeroed too.
                    let stride = cfg.block_n * ROW_BYTES;
                    crate::variant::layout::cp_async_row_chunks(kb, s_row, stride, row_gaddr, tbase, chunk, d, bytes)?;
                    Ok(())
                })?;
            }
            kb.cp_async_mbar_arrive_noinc(full)
        })
    }
}
