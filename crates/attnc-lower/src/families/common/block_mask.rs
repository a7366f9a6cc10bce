//! The block classifier: the run-time form of `attnc_ir::block_mask`, emitted from the
//! spec's mask for one kernel tiling. It writes the row lists a forward walks (per
//! batch entry, head slot and row tile: the count of non-empty key tiles, then their
//! indices ascending with `FULL_TILE` on full ones), so tiles a data-dependent mask
//! leaves empty are never loaded and full ones skip the per-element mask.
//!
//! One CTA of [`THREADS`] (256) threads per (row tile, head slot, batch entry):
//! 1. **intervals**: a group of L lanes per key tile (L the largest power of two ≤ 32
//!    that gives every tile of the row a group) runs the interval classification with
//!    aux values (`classify_tile_scanning_aux`), the group sharing each aux scan: Empty,
//!    Full or undecided, into shared memory;
//! 2. **elements**: each warp takes undecided tiles (warp w: tiles w, w + 8, ...): probe
//!    rounds (a diagonal round reaching every row, then the tile's border), then a lane per
//!    key column classified by intervals over the tile's rows, then every row of the
//!    columns still undecided; it stops as soon as the tile has shown both an allowed and
//!    a masked element (Partial, by warp votes), else every element is accounted for
//!    (Full or Empty);
//! 3. **lists**: warp 0 compacts the classes into the row list with ballots (or the dense
//!    layouts write one class word per tile); with bits, the first `bits_per_row` partial
//!    tiles of the row get slots 1, 2, ... in their entries (class words), and each
//!    slotted tile is appended to the bit-work queue (`bm_queue`: a count, then
//!    `(row, tile | slot << BITS_SLOT_SHIFT)` pairs).
//!
//! The **bits** (`RowListsWithBits`, `DenseWithBits`) are a second kernel
//! ([`KernelRole::BlockBits`]): a partial tile's bits are 128 × 128 mask evaluations, and a
//! row tile across a document boundary has every live tile partial, so one CTA per row
//! left the classification as slow as its worst row (88 serial steps for 22 partial
//! tiles). Its warps stride over (queued tile, step of 32 words): a lane per element of a
//! bit row and a ballot per word (bit rows are query rows, or keys for the dense layout's
//! key-major bits), so the kernels that walk the lists test bits instead of evaluating
//! the mask, and the work spreads evenly over the GPU whatever the rows.
//!
//! Elements outside the entry's seqlen_q × seqlen_k do not count, as in the reference.

use super::abi::{self, Args, ParamTy};
use crate::llvm::kb::{Kb, R};
use crate::module::{BlockLayout, Grid, KernelInfo, KernelRole};
use crate::variant::expr as vexpr;
use crate::variant::interval::{classify_tile_scanning_aux, key_invariant_aux_ranges, LaneGroup, TileRanges};
use crate::variant::layout::{batch_view, packed_row, row_tile_ranges, BatchView};
use attnc_ir::block_mask::{needs_block_mask, HeadSlots, Tiling, BITS_SLOT_SHIFT, FULL_TILE};
use attnc_ir::Spec;
use inkwell::values::IntValue;
use inkwell::IntPredicate;

/// Threads of a classifier CTA: eight warps, so a row's undecided tiles and its aux
/// scans spread over many lanes (the classification is latency-bound, one CTA per row).
pub const THREADS: u32 = 256;
/// Elements each lane evaluates per round of step 2.
const ELEMS_PER_LANE: u32 = 8;
/// Shared memory: 16 bytes kept free, then one u32 class per key tile.
const FLAGS_BYTES: u32 = 16;
const CLASS_EMPTY: i64 = 0;
const CLASS_PARTIAL: i64 = 1;
const CLASS_FULL: i64 = 2;
const CLASS_UNDECIDED: i64 = 3;
/// Words of a partial tile's bits a warp of the bits kernel builds per step: a ballot
/// each, unrolled, so 32 independent reads are in flight instead of one latency a word.
const WORDS_PER_STEP: u32 = 32;
/// Warps per CTA of the bits kernel.
pub const BITS_WARPS: u32 = 4;
/// The bit-work queue's parameter: the count of queued tiles (zeroed before the
/// classifier), then from [`QUEUE_HEADER_WORDS`] one `(row, tile | slot << 20)` pair per
/// slotted tile.
pub const QUEUE_PARAM: &str = "bm_queue";
/// u32 words before the queue's first item (the count, padded to 16 bytes).
pub const QUEUE_HEADER_WORDS: usize = 4;
/// u32 words per queue item.
pub const QUEUE_ITEM_WORDS: usize = 2;

/// Dynamic shared memory for `n_tiles` key tiles (the runtime sets it per launch).
pub fn smem_bytes(n_tiles: u32) -> u32 {
    FLAGS_BYTES + 4 * n_tiles
}

/// The classifier's parameters: the layout and variant arguments every kernel reading
/// the mask takes, then the row lists and their extents, and with bits the bit-work queue.
pub fn params(spec: &Spec, output: BlockLayout) -> Vec<(String, ParamTy)> {
    let mut p = vec![("seqlen_q".to_string(), ParamTy::I32), ("seqlen_k".to_string(), ParamTy::I32)];
    abi::variant_params(spec, &mut p);
    abi::block_list_params(spec, &mut p);
    if output.has_bits() {
        p.push((QUEUE_PARAM.to_string(), ParamTy::Ptr));
    }
    p
}

/// Steps of [`WORDS_PER_STEP`] words (whole bit rows) per tile of `output`'s bits, and the
/// bit rows per step, for `tiling`: what the bits kernel's warps stride over.
pub fn bit_steps(tiling: Tiling, output: BlockLayout) -> (u32, u32) {
    let (bit_rows, bit_cols) = bit_shape(tiling, output);
    let rows_per_step = (WORDS_PER_STEP / bit_cols.div_ceil(32)).max(1);
    (bit_rows.div_ceil(rows_per_step), rows_per_step)
}

/// A slotted tile's bits as (bit rows, bits per row): query rows × keys, or keys × query
/// rows for the dense layout's key-major bits (walks with keys on M).
fn bit_shape(tiling: Tiling, output: BlockLayout) -> (u32, u32) {
    if output == BlockLayout::DenseWithBits {
        (tiling.block_n, tiling.block_m)
    } else {
        (tiling.block_m, tiling.block_n)
    }
}

fn queue_item_addr<'ctx>(kb: &Kb<'ctx>, queue: IntValue<'ctx>, at: IntValue<'ctx>) -> R<IntValue<'ctx>> {
    let words = kb.add(
        kb.i64c(QUEUE_HEADER_WORDS as i64),
        kb.mul(kb.zext64(at, "")?, kb.i64c(QUEUE_ITEM_WORDS as i64), "")?,
        "",
    )?;
    kb.add(queue, kb.mul(words, kb.i64c(4), "")?, "queue_item")
}

/// Dense class codes ([`BlockLayout::Dense`]).
pub const DENSE_EMPTY: i64 = CLASS_EMPTY;
pub const DENSE_FULL: i64 = CLASS_FULL;

/// The classifier a module carries when the spec's mask needs a block mask
/// (`needs_block_mask`), pushed onto `kernels` as `attnc_<variant>_<what>`: one place
/// decides which modules get one, each family only says its tiling and layout.
pub fn push_if_needed<'ctx>(
    kb: &mut Kb<'ctx>,
    spec: &Spec,
    tiling: Tiling,
    layout: BlockLayout,
    what: &str,
    kernels: &mut Vec<KernelInfo>,
) -> R<()> {
    if needs_block_mask(spec) {
        let name = abi::kernel_name(spec, what);
        kernels.push(build(kb, spec, tiling, layout, &name)?);
        if layout.has_bits() {
            let name = abi::kernel_name(spec, &format!("{what}_bits"));
            kernels.push(build_bits(kb, spec, tiling, layout, &name)?);
        }
    }
    Ok(())
}

/// Builds the classifier for `tiling`: rows of `block_m` (packed (position, head) rows
/// with `pack_gqa`) and key tiles of `block_n`.
fn build<'ctx>(kb: &mut Kb<'ctx>, spec: &Spec, tiling: Tiling, output: BlockLayout, name: &str) -> R<KernelInfo> {
    let params = params(spec, output);
    let args = Args::begin(kb, name, &params)?;
    // `.maxntid` only: two CTAs per SM (256 rows in one wave) need ≤ 128 registers, which
    // the masks measured here take (92–123), but a cap would make ptxas spill for heavier
    // ones; those run one CTA per SM instead.
    kb.set_launch_bounds(THREADS)?;
    let Tiling { block_m, block_n, pack_gqa: pack } = tiling;
    kb.section(&format!("attnc block classifier: {} ({block_m}x{block_n} tiles, {output:?})", spec.name))?;
    let group = spec.group_size().max(1) as i64;
    let tid = kb.sreg("tid.x", "tid")?;
    let m_block = kb.sreg("ctaid.x", "m_block")?;
    let slot = kb.sreg("ctaid.y", "head_slot")?;
    let b = kb.sreg("ctaid.z", "b")?;
    let lists = args.block_lists().ok_or_else(|| crate::error::LowerError::Llvm("no block-list params".into()))?;
    let la = args.layout()?;
    let va = args.variant(spec)?;
    let bv = batch_view(kb, spec, &la, b)?;

    // The row list (or row of classes) this CTA writes.
    let row_words = match output {
        BlockLayout::RowLists | BlockLayout::RowListsWithBits => kb.add(lists.n_tiles, kb.i32c(1), "row_words")?,
        BlockLayout::Dense | BlockLayout::DenseWithBits => lists.n_tiles,
    };
    let row = kb.add(kb.mul(kb.add(kb.mul(b, lists.slots, "")?, slot, "")?, lists.m_tiles, "")?, m_block, "row")?;
    let row_addr =
        kb.add(lists.lists, kb.mul(kb.mul(kb.zext64(row, "")?, kb.zext64(row_words, "")?, "")?, kb.i64c(4), "")?, "")?;

    let rows_total = if pack { kb.mul(bv.seqlen_q, kb.i32c(group), "rows_total")? } else { bv.seqlen_q };
    let row0 = kb.mul(m_block, kb.i32c(block_m as i64), "row0")?;
    let n_tiles = kb.ceil_div(bv.seqlen_k, kb.i32c(block_n as i64), "n_tiles")?;
    let nothing = kb.or(
        kb.icmp(IntPredicate::SGE, row0, rows_total, "")?,
        kb.icmp(IntPredicate::SLE, n_tiles, kb.i32c(0), "")?,
        "",
    )?;
    let is_t0 = kb.icmp(IntPredicate::EQ, tid, kb.i32c(0), "")?;
    if output.has_lists() {
        let write_zero = kb.and(nothing, is_t0, "")?;
        kb.if_then(write_zero, "empty_row", |kb| kb.st_global_b32(row_addr, kb.i32c(0)))?;
    }
    // (Dense rows past the sequences are never probed.)
    kb.return_if(nothing, "nothing_to_classify")?;

    // The row tile's position and head ranges (as the forward's CTA computes them).
    let (head_idx, hkv) = slot_heads(kb, spec, pack, slot)?;
    let row_tile = RowTile { bv, head_idx, hkv, row0, pack, group };
    let last_row = kb.sub(kb.smin(kb.add(row0, kb.i32c(block_m as i64), "")?, rows_total, "")?, kb.i32c(1), "")?;
    let (tile_q, tile_h) = row_tile_ranges(kb, pack, group, row0, last_row, head_idx, hkv)?;

    let smem = smem_base(kb)?;
    let class_addr = |kb: &Kb<'ctx>, n: IntValue<'ctx>| -> R<IntValue<'ctx>> {
        kb.add(smem, kb.add(kb.i32c(FLAGS_BYTES as i64), kb.mul(n, kb.i32c(4), "")?, "")?, "class_addr")
    };

    // Aux reads whose index does not involve the key: one box for the whole row tile,
    // scanned once here (each warp's 32 lanes sharing it) instead of per key tile and per
    // key column.
    kb.section("block classifier 0: the row tile's key-invariant aux ranges")?;
    let lane = kb.and(tid, kb.i32c(31), "lane")?;
    let row_ranges = TileRanges {
        b: (b, b),
        h: tile_h,
        hkv: (hkv, hkv),
        q: tile_q,
        k: (kb.i32c(0), kb.i32c(0)),
        seqlen_q: bv.seqlen_q,
        seqlen_k: bv.seqlen_k,
    };
    let warp_lanes = LaneGroup { sub: lane, size: kb.i32c(32) };
    let row_known = key_invariant_aux_ranges(kb, spec, &row_ranges, &va, Some(warp_lanes))?;

    kb.section("block classifier 1: intervals with aux values, a lane group per key tile")?;
    // L = the largest power of two ≤ 32 with n_tiles · L ≤ THREADS lanes per tile (at
    // least 1): the CTA's lanes all scan, whatever the row's length. Rounds are uniform
    // over the CTA (the scans shuffle within warps); lanes past the last tile repeat it.
    let mut lanes_per_tile = kb.i32c(1);
    let mut log_lanes = kb.i32c(0);
    for log in 1..=5i64 {
        let fits = kb.icmp(IntPredicate::ULE, kb.shl(n_tiles, kb.i32c(log), "")?, kb.i32c(THREADS as i64), "")?;
        lanes_per_tile = kb.select_i(fits, kb.i32c(1 << log), lanes_per_tile, "")?;
        log_lanes = kb.select_i(fits, kb.i32c(log), log_lanes, "")?;
    }
    let tile_groups = kb.lshr(kb.i32c(THREADS as i64), log_lanes, "tile_groups")?;
    let my_group = kb.lshr(tid, log_lanes, "tile_group")?;
    let lanes =
        LaneGroup { sub: kb.and(tid, kb.sub(lanes_per_tile, kb.i32c(1), "")?, "group_lane")?, size: lanes_per_tile };
    let rounds = kb.ceil_div(n_tiles, tile_groups, "interval_rounds")?;
    kb.for_range(kb.i32c(0), rounds, "intervals", |kb, round| {
        let t = kb.add(kb.mul(round, tile_groups, "")?, my_group, "")?;
        let valid = kb.icmp(IntPredicate::SLT, t, n_tiles, "")?;
        let t = kb.smin(t, kb.sub(n_tiles, kb.i32c(1), "")?, "tile")?;
        let k0 = kb.mul(t, kb.i32c(block_n as i64), "k0")?;
        let k_hi = kb.sub(kb.smin(kb.add(k0, kb.i32c(block_n as i64), "")?, bv.seqlen_k, "")?, kb.i32c(1), "")?;
        let ranges = TileRanges {
            b: (b, b),
            h: tile_h,
            hkv: (hkv, hkv),
            q: tile_q,
            k: (k0, k_hi),
            seqlen_q: bv.seqlen_q,
            seqlen_k: bv.seqlen_k,
        };
        let cls = classify_tile_scanning_aux(kb, spec, &ranges, &va, Some(lanes), Some(&row_known))?;
        let c = kb.select_i(cls.full, kb.i32c(CLASS_FULL), kb.i32c(CLASS_UNDECIDED), "")?;
        let c = kb.select_i(cls.empty, kb.i32c(CLASS_EMPTY), c, "class")?;
        let writer = kb.and(valid, kb.icmp(IntPredicate::EQ, lanes.sub, kb.i32c(0), "")?, "")?;
        kb.if_then(writer, "store_interval_class", |kb| kb.st_shared_b32(class_addr(kb, t)?, c))
    })?;
    kb.bar_sync()?;

    kb.section("block classifier 2: elements of the undecided tiles (a warp each), until both kinds are seen")?;
    let rows_in_tile = kb.sub(kb.add(last_row, kb.i32c(1), "")?, row0, "rows_in_tile")?;
    let pred = spec.mask.to_predicate();
    let warp = kb.udiv(tid, kb.i32c(32), "warp")?;
    let t_slot = kb.slot_i32("element_tile", warp)?;
    kb.while_loop(
        "element_tiles",
        |kb| {
            let t = kb.get_i(t_slot, "")?;
            kb.icmp(IntPredicate::SLT, t, n_tiles, "")
        },
        |kb| {
            let t = kb.get_i(t_slot, "tile")?;
            let c = kb.ld_volatile_shared_b32(class_addr(kb, t)?, "class")?;
            let undecided = kb.icmp(IntPredicate::EQ, c, kb.i32c(CLASS_UNDECIDED), "")?;
            kb.if_then(undecided, "undecided", |kb| {
                let k0 = kb.mul(t, kb.i32c(block_n as i64), "k0")?;
                let keys = kb.sub(kb.smin(kb.add(k0, kb.i32c(block_n as i64), "")?, bv.seqlen_k, "")?, k0, "keys")?;
                let elems = kb.mul(rows_in_tile, keys, "elems")?;
                let per_round = (32 * ELEMS_PER_LANE) as i64;
                let seen_allowed = kb.slot_i32("seen_allowed", kb.i32c(0))?;
                let seen_masked = kb.slot_i32("seen_masked", kb.i32c(0))?;
                let undecided_yet = |kb: &mut Kb<'ctx>| -> R<IntValue<'ctx>> {
                    let both = kb.and(kb.get_i(seen_allowed, "")?, kb.get_i(seen_masked, "")?, "")?;
                    kb.icmp(IntPredicate::EQ, both, kb.i32c(0), "")
                };
                // Whether the tile's element (r_local, c_local) is allowed.
                let element = |kb: &mut Kb<'ctx>, r_local: IntValue<'ctx>, c_local: IntValue<'ctx>| {
                    let k = kb.add(k0, c_local, "k")?;
                    row_tile.allowed(kb, spec, pred.as_ref(), &va, r_local, k)
                };
                // What a warp saw this round (`any_ok`, `any_masked` per lane).
                let note_seen = |kb: &mut Kb<'ctx>, any_ok: IntValue<'ctx>, any_masked: IntValue<'ctx>| -> R<()> {
                    let a = kb.zext32(kb.vote_any(any_ok, "")?, "")?;
                    let m = kb.zext32(kb.vote_any(any_masked, "")?, "")?;
                    kb.set(seen_allowed, kb.or(kb.get_i(seen_allowed, "")?, a, "")?)?;
                    kb.set(seen_masked, kb.or(kb.get_i(seen_masked, "")?, m, "")?)
                };

                // a) Probe rounds: one round of a diagonal order (row e % rows, column
                // (e / rows + 17 · row) % keys: every row, columns spread over the tile;
                // it decides almost every partial tile), then the tile's border (top and
                // bottom rows, left and right columns): a region bounded by segment
                // boundaries (documents, windows, blocks) reaches the border, so a partial
                // tile whose allowed part is a small corner shows both kinds there.
                let border = kb.mul(kb.add(rows_in_tile, keys, "")?, kb.i32c(2), "border")?;
                let border_rounds = kb.mul(kb.ceil_div(border, kb.i32c(per_round), "")?, kb.i32c(per_round), "")?;
                let probes = kb.add(border_rounds, kb.i32c(per_round), "probes")?;
                let base = kb.slot_i32("probe_round", kb.i32c(0))?;
                kb.while_loop(
                    "probe_rounds",
                    |kb| {
                        let more = kb.icmp(IntPredicate::SLT, kb.get_i(base, "")?, probes, "")?;
                        let open = undecided_yet(kb)?;
                        kb.and(more, open, "")
                    },
                    |kb| {
                        let e0 = kb.get_i(base, "e0")?;
                        let mut any_ok = kb.boolc(false);
                        let mut any_masked = kb.boolc(false);
                        for j in 0..ELEMS_PER_LANE {
                            let s_idx = kb.add(e0, kb.add(lane, kb.i32c((32 * j) as i64), "")?, "probe")?;
                            let first_round = kb.icmp(IntPredicate::SLT, s_idx, kb.i32c(per_round), "")?;
                            // Border element s - per_round: top row, bottom row, left
                            // column, right column.
                            let s_idx_b = kb.sub(s_idx, kb.i32c(per_round), "")?;
                            let b_in =
                                kb.and(kb.not(first_round, "")?, kb.icmp(IntPredicate::SLT, s_idx_b, border, "")?, "")?;
                            let s_b = kb.select_i(b_in, s_idx_b, kb.i32c(0), "")?;
                            let (top, bottom) = (keys, kb.mul(keys, kb.i32c(2), "")?);
                            let left = kb.add(bottom, rows_in_tile, "")?;
                            let is_top = kb.icmp(IntPredicate::SLT, s_b, top, "")?;
                            let is_bottom = kb.icmp(IntPredicate::SLT, s_b, bottom, "")?;
                            let is_left = kb.icmp(IntPredicate::SLT, s_b, left, "")?;
                            let last_r = kb.sub(rows_in_tile, kb.i32c(1), "")?;
                            let last_c = kb.sub(keys, kb.i32c(1), "")?;
                            let br = kb.select_i(is_left, kb.sub(s_b, bottom, "")?, kb.sub(s_b, left, "")?, "")?;
                            let br = kb.select_i(is_bottom, last_r, br, "")?;
                            let br = kb.select_i(is_top, kb.i32c(0), br, "border_row")?;
                            let bc = kb.select_i(is_left, kb.i32c(0), last_c, "")?;
                            let bc = kb.select_i(is_bottom, kb.sub(s_b, top, "")?, bc, "")?;
                            let bc = kb.select_i(is_top, s_b, bc, "border_col")?;
                            let e_in = kb.and(first_round, kb.icmp(IntPredicate::SLT, s_idx, elems, "")?, "")?;
                            let e_safe = kb.select_i(e_in, s_idx, kb.i32c(0), "")?;
                            let dr = kb.urem(e_safe, rows_in_tile, "")?;
                            let dcol = kb.add(kb.udiv(e_safe, rows_in_tile, "")?, kb.mul(dr, kb.i32c(17), "")?, "")?;
                            let dc = kb.urem(dcol, keys, "")?;
                            let inside = kb.or(e_in, b_in, "inside")?;
                            let r_local = kb.select_i(first_round, dr, br, "")?;
                            let c_local = kb.select_i(first_round, dc, bc, "")?;
                            let ok = element(kb, r_local, c_local)?;
                            any_ok = kb.or(any_ok, kb.and(inside, ok, "")?, "")?;
                            any_masked = kb.or(any_masked, kb.and(inside, kb.not(ok, "")?, "")?, "")?;
                        }
                        note_seen(kb, any_ok, any_masked)?;
                        kb.set(base, kb.add(e0, kb.i32c(per_round), "")?)
                    },
                )?;

                // b) Columns: a lane per key, the intervals over the tile's rows and that
                // one key (its aux values exact). A column decided Full or Empty is known
                // without its elements; only undecided columns are evaluated, all their
                // rows. So every element is accounted for (Full and Empty stay exact),
                // and a tile that intervals could not decide because two aux reads
                // correlate (`doc[k]` and `start[k]` across a document boundary) costs its
                // undecided columns instead of every element.
                let chunks = kb.ceil_div(keys, kb.i32c(32), "column_chunks")?;
                let chunk = kb.slot_i32("column_chunk", kb.i32c(0))?;
                kb.while_loop(
                    "column_chunks",
                    |kb| {
                        let more = kb.icmp(IntPredicate::SLT, kb.get_i(chunk, "")?, chunks, "")?;
                        let open = undecided_yet(kb)?;
                        kb.and(more, open, "")
                    },
                    |kb| {
                        let ch = kb.get_i(chunk, "chunk")?;
                        let c_local = kb.add(kb.mul(ch, kb.i32c(32), "")?, lane, "column")?;
                        let valid = kb.icmp(IntPredicate::SLT, c_local, keys, "")?;
                        let k = kb.add(k0, kb.smin(c_local, kb.sub(keys, kb.i32c(1), "")?, "")?, "column_key")?;
                        let ranges = TileRanges {
                            b: (b, b),
                            h: tile_h,
                            hkv: (hkv, hkv),
                            q: tile_q,
                            k: (k, k),
                            seqlen_q: bv.seqlen_q,
                            seqlen_k: bv.seqlen_k,
                        };
                        let cls = classify_tile_scanning_aux(kb, spec, &ranges, &va, None, Some(&row_known))?;
                        let full = kb.and(valid, cls.full, "column_full")?;
                        let empty = kb.and(valid, cls.empty, "column_empty")?;
                        note_seen(kb, full, empty)?;
                        let open = kb.and(valid, kb.not(kb.or(cls.full, cls.empty, "")?, "")?, "")?;
                        let pending = kb.slot_i32("open_columns", kb.ballot(open, "open_columns")?)?;
                        // Each undecided column of the chunk, 32 rows a lane-step, 4 steps a
                        // round, until both kinds are seen.
                        kb.while_loop(
                            "open_columns",
                            |kb| {
                                let more = kb.icmp(IntPredicate::NE, kb.get_i(pending, "")?, kb.i32c(0), "")?;
                                let open = undecided_yet(kb)?;
                                kb.and(more, open, "")
                            },
                            |kb| {
                                let bits = kb.get_i(pending, "pending")?;
                                let lowest = kb.and(bits, kb.sub(kb.i32c(0), bits, "")?, "")?;
                                kb.set(pending, kb.xor(bits, lowest, "")?)?;
                                let col = kb.add(
                                    kb.mul(ch, kb.i32c(32), "")?,
                                    kb.popc(kb.sub(lowest, kb.i32c(1), "")?, "lowest_index")?,
                                    "open_column",
                                )?;
                                let row_rounds = kb.ceil_div(rows_in_tile, kb.i32c(128), "")?;
                                kb.for_range(kb.i32c(0), row_rounds, "column_rows", |kb, rr| {
                                    let mut any_ok = kb.boolc(false);
                                    let mut any_masked = kb.boolc(false);
                                    for j in 0..4 {
                                        let r_local = kb.add(
                                            kb.mul(rr, kb.i32c(128), "")?,
                                            kb.add(lane, kb.i32c(32 * j), "")?,
                                            "column_row",
                                        )?;
                                        let inside = kb.icmp(IntPredicate::SLT, r_local, rows_in_tile, "")?;
                                        let r_safe = kb.select_i(inside, r_local, kb.i32c(0), "")?;
                                        let ok = element(kb, r_safe, col)?;
                                        any_ok = kb.or(any_ok, kb.and(inside, ok, "")?, "")?;
                                        any_masked = kb.or(any_masked, kb.and(inside, kb.not(ok, "")?, "")?, "")?;
                                    }
                                    note_seen(kb, any_ok, any_masked)
                                })
                            },
                        )?;
                        kb.set(chunk, kb.add(ch, kb.i32c(1), "")?)
                    },
                )?;
                let a = kb.icmp(IntPredicate::NE, kb.get_i(seen_allowed, "")?, kb.i32c(0), "")?;
                let m = kb.icmp(IntPredicate::NE, kb.get_i(seen_masked, "")?, kb.i32c(0), "")?;
                let c = kb.select_i(a, kb.i32c(CLASS_FULL), kb.i32c(CLASS_EMPTY), "")?;
                let c = kb.select_i(kb.and(a, m, "")?, kb.i32c(CLASS_PARTIAL), c, "")?;
                let lane0 = kb.icmp(IntPredicate::EQ, lane, kb.i32c(0), "")?;
                kb.if_then(lane0, "store_class", |kb| kb.st_shared_b32(class_addr(kb, t)?, c))
            })?;
            kb.set(t_slot, kb.add(t, kb.i32c((THREADS / 32) as i64), "")?)
        },
    )?;
    kb.bar_sync()?;

    if output.has_bits() {
        // The row's first `bits_per_row` partial tiles, in key order, get slots 1, 2, ...:
        // noted in the class word (bits 8..), which the list entry or dense word carries
        // and step 4 reads.
        kb.section("block classifier 3a: bitmask slots of the partial tiles (warp 0, ballots)")?;
        let warp0 = kb.icmp(IntPredicate::ULT, tid, kb.i32c(32), "")?;
        let queue = args.int(QUEUE_PARAM)?;
        kb.if_then(warp0, "dense_slots", |kb| {
            let partials = kb.slot_i32("partial_count", kb.i32c(0))?;
            let chunks = kb.ceil_div(n_tiles, kb.i32c(32), "")?;
            kb.for_range(kb.i32c(0), chunks, "slot_chunks", |kb, ch| {
                let t = kb.add(kb.mul(ch, kb.i32c(32), "")?, tid, "tile")?;
                let valid = kb.icmp(IntPredicate::SLT, t, n_tiles, "")?;
                let t_safe = kb.select_i(valid, t, kb.i32c(0), "")?;
                let c = kb.ld_volatile_shared_b32(class_addr(kb, t_safe)?, "class")?;
                let partial = kb.and(valid, kb.icmp(IntPredicate::EQ, c, kb.i32c(CLASS_PARTIAL), "")?, "partial")?;
                let pballot = kb.ballot(partial, "partial_ballot")?;
                let lt = kb.sreg("lanemask_lt", "")?;
                let p_base = kb.get_i(partials, "")?;
                let ordinal =
                    kb.add(kb.add(p_base, kb.popc(kb.and(pballot, lt, "")?, "")?, "")?, kb.i32c(1), "partial_ordinal")?;
                let has_bits =
                    kb.and(partial, kb.icmp(IntPredicate::SLE, ordinal, lists.bits_per_row, "")?, "has_bits")?;
                kb.set(partials, kb.add(p_base, kb.popc(pballot, "")?, "")?)?;
                // The chunk's slotted tiles go on the bit-work queue: one reservation by
                // lane 0, each tile's place after it by ballot rank.
                let slotted = kb.ballot(has_bits, "slotted_ballot")?;
                let n_slotted = kb.popc(slotted, "n_slotted")?;
                let reserved = kb.slot_i32("queue_reserved", kb.i32c(0))?;
                let reserve = kb.and(
                    kb.icmp(IntPredicate::EQ, tid, kb.i32c(0), "")?,
                    kb.icmp(IntPredicate::NE, n_slotted, kb.i32c(0), "")?,
                    "",
                )?;
                kb.if_then(reserve, "reserve_queue", |kb| {
                    let old = kb.atom_add_acq_rel_gpu_u32(queue, n_slotted, "queue_old")?;
                    kb.set(reserved, old)
                })?;
                let queue_base = kb.shfl_idx_i32(kb.get_i(reserved, "")?, kb.i32c(0), "queue_base")?;
                kb.if_then(has_bits, "note_slot", |kb| {
                    kb.st_shared_b32(class_addr(kb, t_safe)?, kb.or(c, kb.shl(ordinal, kb.i32c(8), "")?, "")?)?;
                    let at = kb.add(queue_base, kb.popc(kb.and(slotted, lt, "")?, "")?, "queue_at")?;
                    let item = queue_item_addr(kb, queue, at)?;
                    kb.st_global_b32(item, row)?;
                    let tile_slot =
                        kb.or(t_safe, kb.shl(ordinal, kb.i32c(BITS_SLOT_SHIFT as i64), "")?, "tile_slot")?;
                    kb.st_global_b32(kb.add(item, kb.i64c(4), "")?, tile_slot)
                })
            })
        })?;
        kb.bar_sync()?;
    }
    if matches!(output, BlockLayout::Dense | BlockLayout::DenseWithBits) {
        kb.section("block classifier 3: the classes, one word per tile")?;
        let n = kb.slot_i32("dense_tile", tid)?;
        kb.while_loop(
            "dense",
            |kb| kb.icmp(IntPredicate::SLT, kb.get_i(n, "")?, n_tiles, ""),
            |kb| {
                let t = kb.get_i(n, "tile")?;
                let c = kb.ld_volatile_shared_b32(class_addr(kb, t)?, "class")?;
                kb.st_global_b32(kb.add(row_addr, kb.mul(kb.zext64(t, "")?, kb.i64c(4), "")?, "")?, c)?;
                kb.set(n, kb.add(t, kb.i32c(THREADS as i64), "")?)
            },
        )?;
    } else {
        kb.section("block classifier 3: the row list (warp 0, ballots)")?;
        let warp0 = kb.icmp(IntPredicate::ULT, tid, kb.i32c(32), "")?;
        kb.if_then(warp0, "compact", |kb| {
            let lane = tid;
            let count = kb.slot_i32("list_count", kb.i32c(0))?;
            let chunks = kb.ceil_div(n_tiles, kb.i32c(32), "")?;
            kb.for_range(kb.i32c(0), chunks, "compact_chunks", |kb, ch| {
                let t = kb.add(kb.mul(ch, kb.i32c(32), "")?, lane, "tile")?;
                let valid = kb.icmp(IntPredicate::SLT, t, n_tiles, "")?;
                let t_safe = kb.select_i(valid, t, kb.i32c(0), "")?;
                let word = kb.ld_volatile_shared_b32(class_addr(kb, t_safe)?, "class_word")?;
                let c = kb.and(word, kb.i32c(0xff), "class")?;
                let bits_slot = kb.lshr(word, kb.i32c(8), "bits_slot")?;
                let live = kb.and(valid, kb.icmp(IntPredicate::NE, c, kb.i32c(CLASS_EMPTY), "")?, "live")?;
                let ballot = kb.ballot(live, "ballot")?;
                let lt = kb.sreg("lanemask_lt", "")?;
                let before = kb.popc(kb.and(ballot, lt, "")?, "")?;
                let base = kb.get_i(count, "")?;
                kb.if_then(live, "write_entry", |kb| {
                    let full = kb.icmp(IntPredicate::EQ, c, kb.i32c(CLASS_FULL), "")?;
                    let flags = kb.select_i(full, kb.i32c(FULL_TILE as i64), kb.i32c(0), "")?;
                    let flags = kb.or(flags, kb.shl(bits_slot, kb.i32c(BITS_SLOT_SHIFT as i64), "")?, "")?;
                    let entry = kb.or(t, flags, "entry")?;
                    let at = kb.add(kb.add(base, before, "")?, kb.i32c(1), "")?;
                    kb.st_global_b32(kb.add(row_addr, kb.mul(kb.zext64(at, "")?, kb.i64c(4), "")?, "")?, entry)
                })?;
                kb.set(count, kb.add(base, kb.popc(ballot, "")?, "")?)
            })?;
            let lane0 = kb.icmp(IntPredicate::EQ, lane, kb.i32c(0), "")?;
            let total = kb.get_i(count, "count")?;
            kb.if_then(lane0, "write_count", |kb| kb.st_global_b32(row_addr, total))
        })?;
    }
    kb.ret()?;
    Ok(KernelInfo {
        name: name.to_string(),
        role: KernelRole::BlockClassify,
        note: None,
        threads_per_block: THREADS,
        dynamic_smem_bytes: FLAGS_BYTES,
        block_m,
        block_n,
        params: abi::describe(&params),
        tensor_maps: Vec::new(),
        grid: Grid::BlockRows { layout: output },
    })
}

/// The first query head and the KV head of head slot `slot`'s rows.
fn slot_heads<'ctx>(
    kb: &Kb<'ctx>,
    spec: &Spec,
    pack: bool,
    slot: IntValue<'ctx>,
) -> R<(IntValue<'ctx>, IntValue<'ctx>)> {
    let group = spec.group_size().max(1) as i64;
    Ok(match HeadSlots::for_spec(spec, pack) {
        HeadSlots::Shared => (kb.i32c(0), kb.i32c(0)),
        HeadSlots::PerKvHead => (kb.mul(slot, kb.i32c(group), "")?, slot),
        HeadSlots::PerQHead => (slot, kb.udiv(slot, kb.i32c(group), "")?),
    })
}

/// One row tile's coordinates, as both kernels derive them (`slot_heads`,
/// `packed_row`), for evaluating the mask at its elements.
struct RowTile<'ctx> {
    /// The batch entry's lengths.
    bv: BatchView<'ctx>,
    head_idx: IntValue<'ctx>,
    hkv: IntValue<'ctx>,
    /// The tile's first (packed) row.
    row0: IntValue<'ctx>,
    pack: bool,
    group: i64,
}

impl<'ctx> RowTile<'ctx> {
    /// Whether the mask allows (packed row `row0 + r_in_tile`, key `k`): the expression
    /// every kernel reading the mask evaluates.
    fn allowed(
        &self,
        kb: &mut Kb<'ctx>,
        spec: &Spec,
        pred: Option<&attnc_ir::Expr>,
        va: &vexpr::VariantArgs<'ctx>,
        r_in_tile: IntValue<'ctx>,
        k: IntValue<'ctx>,
    ) -> R<IntValue<'ctx>> {
        let r = kb.add(self.row0, r_in_tile, "r")?;
        let (q, h) = packed_row(kb, self.pack, self.group, r, self.head_idx, self.hkv)?;
        let hkv = if self.pack { self.hkv } else { kb.udiv(h, kb.i32c(self.group), "")? };
        vexpr::allowed(kb, spec, pred, &self.bv.elem_vars(hkv, q, h, k), va)
    }
}

/// The bits kernel ([`KernelRole::BlockBits`]): every element of each tile the classifier
/// queued, into its bitmask slot. Warp `w` of the grid's `W` takes work items `w, w + W,
/// ...` of (queued tile, step), a step being [`WORDS_PER_STEP`] words of whole bit rows:
/// each lane evaluates one column of a bit row, the warp's ballot is the word (32
/// consecutive keys or query rows: coalesced reads), and lane j stores word j of the step
/// (one 128-byte store).
fn build_bits<'ctx>(kb: &mut Kb<'ctx>, spec: &Spec, tiling: Tiling, output: BlockLayout, name: &str) -> R<KernelInfo> {
    let params = params(spec, output);
    let args = Args::begin(kb, name, &params)?;
    let Tiling { block_m, block_n, pack_gqa: pack } = tiling;
    kb.section(&format!(
        "attnc block mask bits: {}, the queued partial tiles ({block_m}x{block_n} tiles, {output:?})",
        spec.name
    ))?;
    let group = spec.group_size().max(1) as i64;
    let lists = args.block_lists().ok_or_else(|| crate::error::LowerError::Llvm("no block-list params".into()))?;
    let queue = args.int(QUEUE_PARAM)?;
    let la = args.layout()?;
    let va = args.variant(spec)?;
    let pred = spec.mask.to_predicate();
    let key_rows = output == BlockLayout::DenseWithBits;
    let (bit_rows, bit_cols) = bit_shape(tiling, output);
    let words_per_row = bit_cols.div_ceil(32);
    let tile_words = bit_rows * words_per_row;
    let (steps, rows_per_step) = bit_steps(tiling, output);

    let tid = kb.sreg("tid.x", "tid")?;
    let lane = kb.and(tid, kb.i32c(31), "lane")?;
    let warp = kb.udiv(tid, kb.i32c(32), "warp")?;
    let cta = kb.sreg("ctaid.x", "cta")?;
    let ctas = kb.sreg("nctaid.x", "ctas")?;
    let first = kb.add(kb.mul(cta, kb.i32c(BITS_WARPS as i64), "")?, warp, "first_item")?;
    let stride = kb.mul(ctas, kb.i32c(BITS_WARPS as i64), "item_stride")?;
    let queued = kb.ld_global_i32(queue, "queued_tiles")?;
    let work = kb.mul(queued, kb.i32c(steps as i64), "work_items")?;
    let i_slot = kb.slot_i32("work_item", first)?;
    kb.while_loop(
        "bit_work",
        |kb| kb.icmp(IntPredicate::SLT, kb.get_i(i_slot, "")?, work, ""),
        |kb| {
            let i = kb.get_i(i_slot, "item")?;
            let at = kb.udiv(i, kb.i32c(steps as i64), "queue_at")?;
            let step = kb.urem(i, kb.i32c(steps as i64), "step")?;
            let item = queue_item_addr(kb, queue, at)?;
            let row = kb.ld_global_i32(item, "row")?;
            let tile_slot = kb.ld_global_i32(kb.add(item, kb.i64c(4), "")?, "tile_slot")?;
            let t = kb.and(tile_slot, kb.i32c(attnc_ir::block_mask::TILE_INDEX_MASK as i64), "tile")?;
            let bits_slot = kb.lshr(tile_slot, kb.i32c(BITS_SLOT_SHIFT as i64), "bits_slot")?;
            // The row's (batch entry, head slot, row tile), as the classifier numbered it.
            let m_block = kb.urem(row, lists.m_tiles, "m_block")?;
            let row_head = kb.udiv(row, lists.m_tiles, "")?;
            let slot = kb.urem(row_head, lists.slots, "head_slot")?;
            let b = kb.udiv(row_head, lists.slots, "b")?;
            let bv = batch_view(kb, spec, &la, b)?;
            let rows_total = if pack { kb.mul(bv.seqlen_q, kb.i32c(group), "rows_total")? } else { bv.seqlen_q };
            let (head_idx, hkv) = slot_heads(kb, spec, pack, slot)?;
            let row0 = kb.mul(m_block, kb.i32c(block_m as i64), "row0")?;
            let row_tile = RowTile { bv, head_idx, hkv, row0, pack, group };
            let k0 = kb.mul(t, kb.i32c(block_n as i64), "k0")?;
            let dst = lists.bits_addr(kb, row, bits_slot, tile_words)?;
            let first_row = kb.mul(step, kb.i32c(rows_per_step as i64), "first_bit_row")?;
            let mut words = Vec::new();
            for u in 0..rows_per_step {
                let r_local = kb.add(first_row, kb.i32c(u as i64), "bit_row")?;
                for wc in 0..words_per_row {
                    // This lane's element: (bit row r_local, column 32 wc + lane), a
                    // (query row, key) of the tile.
                    let col = kb.add(kb.i32c(32 * wc as i64), lane, "")?;
                    let (r_in_tile, key_in_tile) = if key_rows { (col, r_local) } else { (r_local, col) };
                    let r = kb.add(row0, r_in_tile, "r")?;
                    let row_in = kb.icmp(IntPredicate::SLT, r, rows_total, "row_in")?;
                    let k = kb.add(k0, key_in_tile, "k")?;
                    let allowed = row_tile.allowed(kb, spec, pred.as_ref(), &va, r_in_tile, k)?;
                    let ok = kb.and(allowed, row_in, "")?;
                    words.push((kb.ballot(ok, "bits")?, r_local));
                }
            }
            // Lane j stores word j of the step: the step's words are consecutive.
            let (mut value, mut inside) = (kb.i32c(0), kb.boolc(false));
            for (j, &(v, r_local)) in words.iter().enumerate() {
                let mine = kb.icmp(IntPredicate::EQ, lane, kb.i32c(j as i64), "")?;
                value = kb.select_i(mine, v, value, "")?;
                let in_tile = kb.icmp(IntPredicate::ULT, r_local, kb.i32c(bit_rows as i64), "")?;
                inside = kb.select_i(mine, in_tile, inside, "")?;
            }
            let w_at = kb.add(kb.mul(first_row, kb.i32c(words_per_row as i64), "")?, lane, "word")?;
            kb.if_then(inside, "store_word", |kb| {
                kb.st_global_b32(kb.add(dst, kb.mul(kb.zext64(w_at, "")?, kb.i64c(4), "")?, "")?, value)
            })?;
            kb.set(i_slot, kb.add(i, stride, "")?)
        },
    )?;
    kb.ret()?;
    Ok(KernelInfo {
        name: name.to_string(),
        role: KernelRole::BlockBits,
        note: None,
        threads_per_block: BITS_WARPS * 32,
        dynamic_smem_bytes: 0,
        block_m,
        block_n,
        params: abi::describe(&params),
        tensor_maps: Vec::new(),
        grid: Grid::QueuedBitWork,
    })
}

fn smem_base<'ctx>(kb: &Kb<'ctx>) -> R<IntValue<'ctx>> {
    let g = match kb.module.get_global("attnc_smem") {
        Some(g) => g,
        None => {
            let g = kb.module.add_global(
                kb.ctx.i8_type().array_type(0),
                Some(inkwell::AddressSpace::from(3u16)),
                "attnc_smem",
            );
            g.set_alignment(16);
            g.set_linkage(inkwell::module::Linkage::External);
            g
        }
    };
    kb.trunc32(kb.b.build_ptr_to_int(g.as_pointer_value(), kb.ctx.i64_type(), "")?, "smem")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::families::{hopper::Hopper, portable::Portable, Family};
    use crate::module::Direction;
    use crate::Arch;

    fn doc_spec() -> Spec {
        attnc_dsl::parse_named(
            "doc.attn",
            "attention doc {\n dtype bf16\n head_dim 128\n heads 16\n aux doc: int[batch, seqlen_k]\n mask causal && doc[b, q] == doc[b, k]\n}\n",
        )
        .expect("parses")
    }

    /// The PTX of entry `name` in `ptx`.
    fn entry<'p>(ptx: &'p str, name: &str) -> &'p str {
        let start = ptx.find(&format!(".entry {name}(")).unwrap_or_else(|| panic!("no entry {name}"));
        let end = ptx[start..].find("\n}\n").map_or(ptx.len(), |e| start + e);
        &ptx[start..end]
    }

    /// The classifier declares its CTA size and shares its aux scans across lane groups; a
    /// layout with bits gets the bits kernel (queue-fed, one 128-byte store a step) and
    /// the classifier queues its slotted tiles; a layout without bits gets neither.
    #[test]
    fn classifier_and_bits_kernels() {
        let spec = doc_spec();
        let hopper = Hopper.compile(&spec, Arch::Sm90a, Direction::Forward).expect("hopper");
        let classify = hopper.kernels.iter().find(|k| k.role == KernelRole::BlockClassify).expect("a classifier");
        assert_eq!(classify.threads_per_block, THREADS);
        let c = entry(&hopper.ptx, &classify.name);
        assert!(c.contains(&format!(".maxntid {THREADS}")));
        assert!(c.contains("shfl.sync.bfly"), "lane groups combine their scans");
        assert!(c.contains("atom.acq_rel.gpu.global.add.u32"), "slotted tiles are queued");
        let bits = hopper.kernels.iter().find(|k| k.role == KernelRole::BlockBits).expect("a bits kernel");
        assert_eq!((bits.threads_per_block, bits.grid), (BITS_WARPS * 32, Grid::QueuedBitWork));
        assert!(bits.params.iter().any(|p| p.starts_with(QUEUE_PARAM)));
        let b = entry(&hopper.ptx, &bits.name);
        assert_eq!(b.matches("vote.sync.ballot").count(), WORDS_PER_STEP as usize, "a ballot per word of a step");

        let portable = Portable.compile(&spec, Arch::Sm90a, Direction::Forward).expect("portable");
        assert!(portable.kernels.iter().all(|k| k.role != KernelRole::BlockBits));
        let classify = portable.kernels.iter().find(|k| k.role == KernelRole::BlockClassify).expect("a classifier");
        assert!(classify.params.iter().all(|p| !p.starts_with(QUEUE_PARAM)));
        assert!(!entry(&portable.ptx, &classify.name).contains("atom."));
    }

    /// A step is whole bit rows of at most 32 words, and the steps cover the tile.
    #[test]
    fn bit_steps_cover_the_tile() {
        for (m, n) in [(128, 128), (64, 128), (128, 96), (128, 176), (192, 64)] {
            let t = Tiling { block_m: m, block_n: n, pack_gqa: false };
            for layout in [BlockLayout::RowListsWithBits, BlockLayout::DenseWithBits] {
                let (rows, cols) = bit_shape(t, layout);
                let (steps, rows_per_step) = bit_steps(t, layout);
                assert!(rows_per_step * cols.div_ceil(32) <= WORDS_PER_STEP, "{m}x{n} {layout:?}");
                assert!(steps * rows_per_step >= rows && (steps - 1) * rows_per_step < rows, "{m}x{n} {layout:?}");
            }
        }
        let t = Tiling { block_m: 64, block_n: 128, pack_gqa: false };
        assert_eq!(bit_steps(t, BlockLayout::DenseWithBits), (8, 16), "keys × 64 query bits: 16 keys a step");
    }
}
