//! The block classifier: the run-time form of `attnc_ir::block_mask`, emitted from the
//! spec's mask for one kernel tiling. It writes the row lists a forward walks (per
//! batch entry, head slot and row tile: the count of non-empty key tiles, then their
//! indices ascending with `FULL_TILE` on full ones), so tiles a data-dependent mask
//! leaves empty are never loaded and full ones skip the per-element mask.
//!
//! One CTA of 128 threads per (row tile, head slot, batch entry):
//! 1. **intervals**: each thread takes key tiles `tid, tid + 128, ...` and runs the
//!    interval classification with aux values (`classify_tile_scanning_aux`): Empty,
//!    Full or undecided, into shared memory;
//! 2. **elements**: each warp takes undecided tiles (warp w: tiles w, w + 4, ...) and
//!    evaluates the mask on 8 elements per lane per round, in a diagonal order that
//!    reaches every row and spread columns in the first round; it stops as soon as the
//!    tile has shown both an allowed and a masked element (Partial, by warp votes) or has
//!    no elements left (Full or Empty);
//! 3. **lists**: warp 0 compacts the classes into the row list with ballots (or the dense
//!    layouts write one class word per tile); with bits, the first `bits_per_row` partial
//!    tiles of the row get slots 1, 2, ... in their entries (class words);
//! 4. **bits** (`RowListsWithBits`, `DenseWithBits`): the four warps evaluate every
//!    element of each slotted tile, a lane per element of a bit row and a ballot per word
//!    (bit rows are query rows, or keys for the dense layout's key-major bits), so the
//!    kernels that walk the lists test bits instead of evaluating the mask.
//!
//! Elements outside the entry's seqlen_q × seqlen_k do not count, as in the reference.

use super::abi::{self, Args, ParamTy};
use crate::llvm::kb::{Kb, R};
use crate::module::{BlockLayout, Grid, KernelInfo, KernelRole};
use crate::variant::expr::{self as vexpr, ElemVars};
use crate::variant::interval::{classify_tile_scanning_aux, TileRanges};
use crate::variant::layout::{batch_view, packed_row, row_tile_ranges};
use attnc_ir::block_mask::{needs_block_mask, HeadSlots, Tiling, BITS_SLOT_SHIFT, FULL_TILE};
use attnc_ir::Spec;
use inkwell::values::IntValue;
use inkwell::IntPredicate;

pub const THREADS: u32 = 128;
/// Elements each lane evaluates per round of step 2.
const ELEMS_PER_LANE: u32 = 8;
/// Shared memory: 16 bytes kept free, then one u32 class per key tile.
const FLAGS_BYTES: u32 = 16;
const CLASS_EMPTY: i64 = 0;
const CLASS_PARTIAL: i64 = 1;
const CLASS_FULL: i64 = 2;
const CLASS_UNDECIDED: i64 = 3;
/// Words of a partial tile's bits a warp builds per step of classifier step 4.
const WORDS_PER_STEP: u32 = 32;

/// Dynamic shared memory for `n_tiles` key tiles (the runtime sets it per launch).
pub fn smem_bytes(n_tiles: u32) -> u32 {
    FLAGS_BYTES + 4 * n_tiles
}

/// The classifier's parameters: the layout and variant arguments every kernel reading
/// the mask takes, then the row lists and their extents.
pub fn params(spec: &Spec) -> Vec<(String, ParamTy)> {
    let mut p = vec![("seqlen_q".to_string(), ParamTy::I32), ("seqlen_k".to_string(), ParamTy::I32)];
    abi::variant_params(spec, &mut p);
    abi::block_list_params(spec, &mut p);
    p
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
    }
    Ok(())
}

/// Builds the classifier for `tiling`: rows of `block_m` (packed (position, head) rows
/// with `pack_gqa`) and key tiles of `block_n`.
fn build<'ctx>(kb: &mut Kb<'ctx>, spec: &Spec, tiling: Tiling, output: BlockLayout, name: &str) -> R<KernelInfo> {
    let params = params(spec);
    let args = Args::begin(kb, name, &params)?;
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
    let (head_idx, hkv) = match HeadSlots::for_spec(spec, pack) {
        HeadSlots::Shared => (kb.i32c(0), kb.i32c(0)),
        HeadSlots::PerKvHead => (kb.mul(slot, kb.i32c(group), "")?, slot),
        HeadSlots::PerQHead => (slot, kb.udiv(slot, kb.i32c(group), "")?),
    };
    let last_row = kb.sub(kb.smin(kb.add(row0, kb.i32c(block_m as i64), "")?, rows_total, "")?, kb.i32c(1), "")?;
    let (tile_q, tile_h) = row_tile_ranges(kb, pack, group, row0, last_row, head_idx, hkv)?;

    let smem = smem_base(kb)?;
    let class_addr = |kb: &Kb<'ctx>, n: IntValue<'ctx>| -> R<IntValue<'ctx>> {
        kb.add(smem, kb.add(kb.i32c(FLAGS_BYTES as i64), kb.mul(n, kb.i32c(4), "")?, "")?, "class_addr")
    };

    kb.section("block classifier 1: intervals with aux values, one key tile per thread")?;
    let n = kb.slot_i32("interval_tile", tid)?;
    kb.while_loop(
        "intervals",
        |kb| {
            let t = kb.get_i(n, "")?;
            kb.icmp(IntPredicate::SLT, t, n_tiles, "")
        },
        |kb| {
            let t = kb.get_i(n, "tile")?;
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
            let cls = classify_tile_scanning_aux(kb, spec, &ranges, &va)?;
            let c = kb.select_i(cls.full, kb.i32c(CLASS_FULL), kb.i32c(CLASS_UNDECIDED), "")?;
            let c = kb.select_i(cls.empty, kb.i32c(CLASS_EMPTY), c, "class")?;
            kb.st_shared_b32(class_addr(kb, t)?, c)?;
            kb.set(n, kb.add(t, kb.i32c(THREADS as i64), "")?)
        },
    )?;
    kb.bar_sync()?;

    kb.section("block classifier 2: elements of the undecided tiles (a warp each), until both kinds are seen")?;
    let rows_in_tile = kb.sub(kb.add(last_row, kb.i32c(1), "")?, row0, "rows_in_tile")?;
    let pred = spec.mask.to_predicate();
    let lane = kb.and(tid, kb.i32c(31), "lane")?;
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
                let base = kb.slot_i32("element_round", kb.i32c(0))?;
                let seen_allowed = kb.slot_i32("seen_allowed", kb.i32c(0))?;
                let seen_masked = kb.slot_i32("seen_masked", kb.i32c(0))?;
                kb.while_loop(
                    "element_rounds",
                    |kb| {
                        let e0 = kb.get_i(base, "")?;
                        let more = kb.icmp(IntPredicate::SLT, e0, elems, "")?;
                        let both = kb.and(kb.get_i(seen_allowed, "")?, kb.get_i(seen_masked, "")?, "")?;
                        kb.and(more, kb.icmp(IntPredicate::EQ, both, kb.i32c(0), "")?, "")
                    },
                    |kb| {
                        let e0 = kb.get_i(base, "e0")?;
                        let mut any_ok = kb.boolc(false);
                        let mut any_masked = kb.boolc(false);
                        for j in 0..ELEMS_PER_LANE {
                            let e = kb.add(e0, kb.add(lane, kb.i32c((32 * j) as i64), "")?, "elem")?;
                            let inside = kb.icmp(IntPredicate::SLT, e, elems, "")?;
                            // Element e of the tile, diagonal order: row e % rows, column
                            // (e / rows + 17 · row) % keys. A bijection, and the first round
                            // already touches every row and columns spread over the tile, so
                            // a tile cut by a boundary in either direction shows it early.
                            let e_safe = kb.select_i(inside, e, kb.i32c(0), "")?;
                            let r_local = kb.urem(e_safe, rows_in_tile, "")?;
                            let col =
                                kb.add(kb.udiv(e_safe, rows_in_tile, "")?, kb.mul(r_local, kb.i32c(17), "")?, "")?;
                            let r = kb.add(row0, r_local, "r")?;
                            let k = kb.add(k0, kb.urem(col, keys, "")?, "k")?;
                            let (q, h) = packed_row(kb, pack, group, r, head_idx, hkv)?;
                            let hkv_e = if pack { hkv } else { kb.udiv(h, kb.i32c(group), "")? };
                            let vars = ElemVars {
                                b,
                                h,
                                hkv: hkv_e,
                                q,
                                k,
                                seqlen_q: bv.seqlen_q,
                                seqlen_k: bv.seqlen_k,
                                score: None,
                                k_split: None,
                            };
                            let ok = vexpr::allowed(kb, spec, pred.as_ref(), &vars, &va)?;
                            any_ok = kb.or(any_ok, kb.and(inside, ok, "")?, "")?;
                            any_masked = kb.or(any_masked, kb.and(inside, kb.not(ok, "")?, "")?, "")?;
                        }
                        let a = kb.zext32(kb.vote_any(any_ok, "")?, "")?;
                        let m = kb.zext32(kb.vote_any(any_masked, "")?, "")?;
                        kb.set(seen_allowed, kb.or(kb.get_i(seen_allowed, "")?, a, "")?)?;
                        kb.set(seen_masked, kb.or(kb.get_i(seen_masked, "")?, m, "")?)?;
                        kb.set(base, kb.add(e0, kb.i32c(per_round), "")?)
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
                kb.if_then(has_bits, "note_slot", |kb| {
                    kb.st_shared_b32(class_addr(kb, t_safe)?, kb.or(c, kb.shl(ordinal, kb.i32c(8), "")?, "")?)
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
    if output.has_bits() {
        // Bit rows are query rows (`RowListsWithBits`) or keys (`DenseWithBits`, for
        // walks with keys on M); each lane evaluates one element of the other axis.
        let key_rows = output == BlockLayout::DenseWithBits;
        kb.bar_sync()?;
        kb.section("block classifier 4: the bits of the partial tiles with a slot (all warps, a ballot per word)")?;
        let (bit_rows, bit_cols) = if key_rows { (block_n, block_m) } else { (block_m, block_n) };
        let words_per_row = bit_cols.div_ceil(32);
        let tile_words = bit_rows * words_per_row;
        kb.for_range(kb.i32c(0), n_tiles, "bits_tiles", |kb, t| {
            let c = kb.ld_volatile_shared_b32(class_addr(kb, t)?, "class")?;
            let slot = kb.lshr(c, kb.i32c(8), "bits_slot")?;
            let has = kb.icmp(IntPredicate::NE, slot, kb.i32c(0), "")?;
            kb.if_then(has, "tile_bits", |kb| {
                let dst = lists.bits_addr(kb, row, slot, tile_words)?;
                let k0 = kb.mul(t, kb.i32c(block_n as i64), "k0")?;
                // Each lane evaluates one key of a row, the warp's ballot is the word (32
                // consecutive keys: coalesced reads). Warp w takes rows w, w + 4, ...,
                // `rows_per_step` rows a step and all their words, unrolled: independent
                // reads in flight instead of one latency per word.
                let rows_per_step = (WORDS_PER_STEP / words_per_row).max(1);
                let steps = bit_rows.div_ceil(4 * rows_per_step);
                kb.for_range(kb.i32c(0), kb.i32c(steps as i64), "bit_steps", |kb, step| {
                    let mut words = Vec::new();
                    for u in 0..rows_per_step {
                        let r_local = kb.add(
                            warp,
                            kb.mul(
                                kb.add(kb.mul(step, kb.i32c(rows_per_step as i64), "")?, kb.i32c(u as i64), "")?,
                                kb.i32c(4),
                                "",
                            )?,
                            "r_local",
                        )?;
                        for wc in 0..words_per_row {
                            // This lane's element: (row r_local, column 32 wc + lane) of
                            // the bit rows, a (query row, key) of the tile.
                            let col = kb.add(kb.i32c(32 * wc as i64), lane, "")?;
                            let (r_in_tile, key_in_tile) = if key_rows { (col, r_local) } else { (r_local, col) };
                            let r = kb.add(row0, r_in_tile, "r")?;
                            let row_in = kb.icmp(IntPredicate::SLT, r, rows_total, "row_in")?;
                            let (q, h) = packed_row(kb, pack, group, r, head_idx, hkv)?;
                            let hkv_e = if pack { hkv } else { kb.udiv(h, kb.i32c(group), "")? };
                            let k = kb.add(k0, key_in_tile, "k")?;
                            let vars = ElemVars {
                                b,
                                h,
                                hkv: hkv_e,
                                q,
                                k,
                                seqlen_q: bv.seqlen_q,
                                seqlen_k: bv.seqlen_k,
                                score: None,
                                k_split: None,
                            };
                            let ok = kb.and(vexpr::allowed(kb, spec, pred.as_ref(), &vars, &va)?, row_in, "")?;
                            let w =
                                kb.add(kb.mul(r_local, kb.i32c(words_per_row as i64), "")?, kb.i32c(wc as i64), "w")?;
                            words.push((w, kb.ballot(ok, "bits")?, r_local));
                        }
                    }
                    // Lane j stores word j of the step.
                    let (mut w_at, mut value, mut inside) = (kb.i32c(0), kb.i32c(0), kb.boolc(false));
                    for (j, &(w, v, r_local)) in words.iter().enumerate() {
                        let mine = kb.icmp(IntPredicate::EQ, lane, kb.i32c(j as i64), "")?;
                        w_at = kb.select_i(mine, w, w_at, "")?;
                        value = kb.select_i(mine, v, value, "")?;
                        let in_tile = kb.icmp(IntPredicate::ULT, r_local, kb.i32c(bit_rows as i64), "")?;
                        inside = kb.select_i(mine, in_tile, inside, "")?;
                    }
                    kb.if_then(inside, "store_word", |kb| {
                        kb.st_global_b32(kb.add(dst, kb.mul(kb.zext64(w_at, "")?, kb.i64c(4), "")?, "")?, value)
                    })
                })
            })
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
