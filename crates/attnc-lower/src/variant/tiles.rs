//! The key tiles one CTA visits: which tiles the mask leaves empty (skipped, never
//! loaded), which are full (no per-element mask), and the range a split-KV split owns.
//! Every family walks key tiles the same way, and in warp-specialized families the
//! producer and the consumers must agree tile for tile, so the walk lives here once.

use super::expr::VariantArgs;
use super::interval::{classify_tile, TileClassVals, TileRanges};
use super::layout::BatchView;
use crate::llvm::kb::{Kb, Slot, R};
use attnc_ir::block_mask::{needs_block_mask, HeadSlots, BITS_SLOT_MASK, BITS_SLOT_SHIFT, FULL_TILE, TILE_INDEX_MASK};
use attnc_ir::Spec;
use inkwell::values::IntValue;
use inkwell::IntPredicate;

/// One row tile's list of non-empty key tiles from the launch's block mask
/// (`attnc_ir::block_mask`): its length and the address of its first entry (u32, the
/// tile index with `FULL_TILE` set on full tiles, ascending).
#[derive(Clone, Copy, Debug)]
pub struct RowList<'ctx> {
    pub count: IntValue<'ctx>,
    pub entries: IntValue<'ctx>,
    /// The list's row in `[batch][slot][m_tiles]` (where its tiles' bits are).
    pub row: IntValue<'ctx>,
    pub args: BlockListArgs<'ctx>,
}

/// The block-mask launch arguments: the row lists (`[batch][slot][m_tiles][1 + n_tiles]`
/// u32) and their extents, and the partial tiles' bits (`[batch][slot][m_tiles]
/// [bits_per_row]` tiles of `block_m` rows × `block_n / 32` words; `bits_per_row` 0 when
/// the layout has none).
#[derive(Clone, Copy, Debug)]
pub struct BlockListArgs<'ctx> {
    pub lists: IntValue<'ctx>,
    pub slots: IntValue<'ctx>,
    pub m_tiles: IntValue<'ctx>,
    pub n_tiles: IntValue<'ctx>,
    pub bits: IntValue<'ctx>,
    pub bits_per_row: IntValue<'ctx>,
}

impl<'ctx> BlockListArgs<'ctx> {
    /// The head slot a tile of query head `head_idx` (KV head `hkv`) reads.
    pub fn head_slot(kb: &Kb<'ctx>, slots: HeadSlots, head_idx: IntValue<'ctx>, hkv: IntValue<'ctx>) -> IntValue<'ctx> {
        match slots {
            HeadSlots::Shared => kb.i32c(0),
            HeadSlots::PerKvHead => hkv,
            HeadSlots::PerQHead => head_idx,
        }
    }

    /// The address of the first word of bitmask slot `slot` (1-based, as list entries
    /// hold it) of list row `row`: a tile of `tile_words` u32.
    pub fn bits_addr(
        &self,
        kb: &Kb<'ctx>,
        row: IntValue<'ctx>,
        slot: IntValue<'ctx>,
        tile_words: u32,
    ) -> R<IntValue<'ctx>> {
        let index = kb.add(
            kb.mul(kb.zext64(row, "")?, kb.zext64(self.bits_per_row, "")?, "")?,
            kb.zext64(kb.sub(slot, kb.i32c(1), "")?, "")?,
            "bm_bits_tile",
        )?;
        kb.add(self.bits, kb.mul(index, kb.i64c(4 * tile_words as i64), "")?, "bm_bits_addr")
    }

    /// Index of row tile `m`'s row in `[batch][slot][m_tiles]`.
    pub fn row(&self, kb: &Kb<'ctx>, b: IntValue<'ctx>, slot: IntValue<'ctx>, m: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        kb.add(kb.mul(kb.add(kb.mul(b, self.slots, "")?, slot, "")?, self.m_tiles, "")?, m, "bm_row")
    }

    /// The class code (`BlockLayout::Dense`) of row tile `m`, key tile `n`. Both are
    /// clamped into the table: walks probe one tile past their end (and ignore the
    /// answer there), which must not read past the allocation.
    pub fn class_code(
        &self,
        kb: &Kb<'ctx>,
        b: IntValue<'ctx>,
        slot: IntValue<'ctx>,
        m: IntValue<'ctx>,
        n: IntValue<'ctx>,
    ) -> R<IntValue<'ctx>> {
        let code = self.class_word(kb, b, slot, m, n)?;
        kb.and(code, kb.i32c(0xff), "bm_class_code")
    }

    /// The word of row tile `m`, key tile `n` as written (`BlockLayout::DenseWithBits`:
    /// the class in bits 0–7, 1 + a bitmask slot from bit 8), both clamped as in
    /// [`Self::class_code`].
    pub fn class_word(
        &self,
        kb: &Kb<'ctx>,
        b: IntValue<'ctx>,
        slot: IntValue<'ctx>,
        m: IntValue<'ctx>,
        n: IntValue<'ctx>,
    ) -> R<IntValue<'ctx>> {
        let m = kb.smin(m, kb.sub(self.m_tiles, kb.i32c(1), "")?, "")?;
        let n = kb.smin(n, kb.sub(self.n_tiles, kb.i32c(1), "")?, "")?;
        let row = self.row(kb, b, slot, m)?;
        let word = kb.add(kb.mul(kb.zext64(row, "")?, kb.zext64(self.n_tiles, "")?, "")?, kb.zext64(n, "")?, "")?;
        kb.ld_global_i32(kb.add(self.lists, kb.mul(word, kb.i64c(4), "")?, "")?, "bm_class")
    }
}

/// The classification of tiles whose class codes are `codes`, taken together: empty when
/// every one is, full when every one is.
pub fn classes_of<'ctx>(kb: &Kb<'ctx>, codes: &[IntValue<'ctx>]) -> R<TileClassVals<'ctx>> {
    let (mut empty, mut full) = (kb.boolc(true), kb.boolc(true));
    for &c in codes {
        empty = kb.and(empty, kb.icmp(IntPredicate::EQ, c, kb.i32c(0), "")?, "tile.empty")?;
        full = kb.and(full, kb.icmp(IntPredicate::EQ, c, kb.i32c(2), "")?, "tile.full")?;
    }
    Ok(TileClassVals { empty, full })
}

/// The kernel parameters of [`BlockListArgs`], in order (the two addresses, 0 and 4, are
/// pointers; the rest i32).
pub const BLOCK_LIST_PARAMS: [&str; 6] =
    ["block_lists", "bm_slots", "bm_m_tiles", "bm_n_tiles", "bm_bits", "bm_bits_per_row"];

/// Whether parameter `i` of [`BLOCK_LIST_PARAMS`] is an address.
pub fn block_list_param_is_ptr(i: usize) -> bool {
    i == 0 || i == 4
}

impl<'ctx> RowList<'ctx> {
    /// The list of row tile `m_block` of batch entry `b` for a CTA of query head
    /// `head_idx` / KV head `hkv`, when the spec's mask takes a block mask.
    pub fn for_cta(
        kb: &Kb<'ctx>,
        spec: &Spec,
        args: Option<&BlockListArgs<'ctx>>,
        b: IntValue<'ctx>,
        head_idx: IntValue<'ctx>,
        hkv: IntValue<'ctx>,
        m_block: IntValue<'ctx>,
    ) -> R<Option<RowList<'ctx>>> {
        let Some(args) = args.filter(|_| needs_block_mask(spec)) else {
            return Ok(None);
        };
        let slot = BlockListArgs::head_slot(kb, HeadSlots::for_spec(spec, spec.pack_gqa), head_idx, hkv);
        let row_words = kb.add(args.n_tiles, kb.i32c(1), "")?;
        let row = args.row(kb, b, slot, m_block)?;
        let word = kb.mul(kb.zext64(row, "")?, kb.zext64(row_words, "")?, "")?;
        let base = kb.add(args.lists, kb.mul(word, kb.i64c(4), "")?, "bm_row_addr")?;
        let count = kb.ld_global_i32(base, "bm_count")?;
        Ok(Some(RowList { count, entries: kb.add(base, kb.i64c(4), "bm_entries")?, row, args: *args }))
    }

    /// The address of this row's bitmask slot `slot` ([`BlockListArgs::bits_addr`]).
    pub fn bits_addr(&self, kb: &Kb<'ctx>, slot: IntValue<'ctx>, tile_words: u32) -> R<IntValue<'ctx>> {
        self.args.bits_addr(kb, self.row, slot, tile_words)
    }

    fn entry(&self, kb: &Kb<'ctx>, pos: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        let off = kb.mul(kb.zext64(pos, "")?, kb.i64c(4), "")?;
        kb.ld_global_i32(kb.add(self.entries, off, "")?, "bm_entry")
    }
}

/// The fixed part of a CTA's tile classification: everything but the key range.
pub struct KeyTiles<'a, 'ctx> {
    pub spec: &'a Spec,
    pub block_n: u32,
    pub bv: BatchView<'ctx>,
    pub hkv: IntValue<'ctx>,
    /// The CTA's query positions and heads (inclusive ranges).
    pub q: (IntValue<'ctx>, IntValue<'ctx>),
    pub h: (IntValue<'ctx>, IntValue<'ctx>),
    pub va: &'a VariantArgs<'ctx>,
    /// With a block mask the walk goes over list positions instead of tile indices:
    /// [`KeyTiles::tile_at`] maps a position to its tile, and no position is empty.
    pub list: Option<RowList<'ctx>>,
}

impl<'a, 'ctx> KeyTiles<'a, 'ctx> {
    /// The key tile at walk position `pos`: the position itself, or the list's entry.
    pub fn tile_at(&self, kb: &Kb<'ctx>, pos: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        match &self.list {
            None => Ok(pos),
            Some(l) => kb.and(l.entry(kb, pos)?, kb.i32c(TILE_INDEX_MASK as i64), "bm_tile"),
        }
    }

    /// 1 + the bitmask slot of the partial tile at walk position `pos`, or 0 (no bits:
    /// no list, a full tile, or a partial one past the row's slots).
    pub fn bits_slot(&self, kb: &Kb<'ctx>, pos: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        match &self.list {
            None => Ok(kb.i32c(0)),
            Some(l) => {
                let e = l.entry(kb, pos)?;
                let slot =
                    kb.and(kb.lshr(e, kb.i32c(BITS_SLOT_SHIFT as i64), "")?, kb.i32c(BITS_SLOT_MASK as i64), "")?;
                // A full tile's flag is the field's top bit: not a slot.
                let full = kb.icmp(IntPredicate::NE, kb.and(e, kb.i32c(FULL_TILE as i64), "")?, kb.i32c(0), "")?;
                kb.select_i(full, kb.i32c(0), slot, "bm_bits_slot")
            }
        }
    }

    /// The classification of the key tile starting at key `n0` for the CTA's rows.
    pub fn classify(&self, kb: &Kb<'ctx>, n0: IntValue<'ctx>) -> R<TileClassVals<'ctx>> {
        let bn = self.block_n as i64;
        let k_hi = kb.sub(kb.smin(kb.add(n0, kb.i32c(bn), "")?, self.bv.seqlen_k, "")?, kb.i32c(1), "")?;
        let tile = TileRanges {
            b: (self.bv.b, self.bv.b),
            h: self.h,
            hkv: (self.hkv, self.hkv),
            q: self.q,
            k: (n0, k_hi),
            seqlen_q: self.bv.seqlen_q,
            seqlen_k: self.bv.seqlen_k,
        };
        classify_tile(kb, self.spec, &tile, self.va)
    }

    /// Whether the tile at walk position `t` needs no per-element work: full and inside
    /// seqlen_k.
    pub fn unmasked(&self, kb: &Kb<'ctx>, t: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        let bn = self.block_n as i64;
        if let Some(l) = &self.list {
            let e = l.entry(kb, t)?;
            let full = kb.icmp(IntPredicate::NE, kb.and(e, kb.i32c(FULL_TILE as i64), "")?, kb.i32c(0), "")?;
            let n0 = kb.mul(kb.and(e, kb.i32c(TILE_INDEX_MASK as i64), "")?, kb.i32c(bn), "n0")?;
            let inside = kb.icmp(IntPredicate::SLE, kb.add(n0, kb.i32c(bn), "")?, self.bv.seqlen_k, "")?;
            return kb.and(full, inside, "unmasked");
        }
        let n0 = kb.mul(t, kb.i32c(bn), "n0")?;
        let cls = self.classify(kb, n0)?;
        let inside = kb.icmp(IntPredicate::SLE, kb.add(n0, kb.i32c(bn), "")?, self.bv.seqlen_k, "")?;
        kb.and(cls.full, inside, "unmasked")
    }

    /// First tile index in [from, end) that is not empty, or `end`.
    pub fn next_nonempty(
        &self,
        kb: &mut Kb<'ctx>,
        from: IntValue<'ctx>,
        end: IntValue<'ctx>,
        name: &str,
    ) -> R<IntValue<'ctx>> {
        if self.spec.mask.is_none() || self.list.is_some() {
            return Ok(from);
        }
        let cur = kb.slot_i32(name, from)?;
        let bn = self.block_n as i64;
        kb.while_loop(
            name,
            |kb| {
                let t = kb.get_i(cur, "")?;
                let in_range = kb.icmp(IntPredicate::SLT, t, end, "")?;
                // An out-of-range probe is harmless; the flag is and-ed with the range.
                let cls = self.classify(kb, kb.mul(t, kb.i32c(bn), "")?)?;
                kb.and(in_range, cls.empty, "")
            },
            |kb| {
                let t = kb.get_i(cur, "")?;
                kb.set(cur, kb.add(t, kb.i32c(1), "")?)
            },
        )?;
        kb.get_i(cur, name)
    }

    /// One past the last non-empty tile in [lo, end), or `lo` when none.
    pub fn prev_nonempty(
        &self,
        kb: &mut Kb<'ctx>,
        lo: IntValue<'ctx>,
        end: IntValue<'ctx>,
        name: &str,
    ) -> R<IntValue<'ctx>> {
        if self.spec.mask.is_none() || self.list.is_some() {
            return Ok(end);
        }
        let cur = kb.slot_i32(name, end)?;
        let bn = self.block_n as i64;
        kb.while_loop(
            name,
            |kb| {
                let t = kb.get_i(cur, "")?;
                let above = kb.icmp(IntPredicate::SGT, t, lo, "")?;
                let prev = kb.sub(t, kb.i32c(1), "")?;
                let cls = self.classify(kb, kb.mul(prev, kb.i32c(bn), "")?)?;
                kb.and(above, cls.empty, "")
            },
            |kb| {
                let t = kb.get_i(cur, "")?;
                kb.set(cur, kb.sub(t, kb.i32c(1), "")?)
            },
        )?;
        kb.get_i(cur, name)
    }

    /// The tiles `[begin, end)` split `split` of `num_splits` owns: the span of non-empty
    /// tiles cut into equal shares, `begin` moved to the share's first non-empty tile.
    pub fn split_range(
        &self,
        kb: &mut Kb<'ctx>,
        num_splits: IntValue<'ctx>,
        split: IntValue<'ctx>,
    ) -> R<(IntValue<'ctx>, IntValue<'ctx>)> {
        // With a block mask the positions [0, count) are the non-empty tiles.
        let n_tiles = match &self.list {
            Some(l) => l.count,
            None => kb.ceil_div(self.bv.seqlen_k, kb.i32c(self.block_n as i64), "n_tiles")?,
        };
        let first = self.next_nonempty(kb, kb.i32c(0), n_tiles, "first_tile")?;
        let stop = self.prev_nonempty(kb, first, n_tiles, "stop_tile")?;
        let span = kb.sub(stop, first, "")?;
        let per_split = kb.ceil_div(span, num_splits, "tiles_per_split")?;
        let begin = kb.smin(kb.add(first, kb.mul(split, per_split, "")?, "")?, stop, "split_begin")?;
        let end = kb.smin(kb.add(begin, per_split, "")?, stop, "split_end")?;
        let begin = self.next_nonempty(kb, begin, end, "begin_tile")?;
        Ok((begin, end))
    }
}

/// The backward's block mask: one class per (query tile, key tile) of the backward's
/// tiling (`BlockLayout::Dense`), read where the interval classification would run. The
/// view of one batch entry and key tile.
#[derive(Clone, Copy, Debug)]
pub struct DenseClasses<'ctx> {
    pub args: BlockListArgs<'ctx>,
    pub b: IntValue<'ctx>,
    /// The key tile.
    pub n: IntValue<'ctx>,
    pub slots: HeadSlots,
}

impl<'ctx> DenseClasses<'ctx> {
    /// The view for batch entry `b` and key tile `n`, when the spec's mask takes a block
    /// mask and the kernel has the list parameters.
    pub fn for_key_tile(
        spec: &Spec,
        args: Option<&BlockListArgs<'ctx>>,
        b: IntValue<'ctx>,
        n: IntValue<'ctx>,
    ) -> Option<DenseClasses<'ctx>> {
        let args = *args.filter(|_| needs_block_mask(spec))?;
        Some(DenseClasses { args, b, n, slots: HeadSlots::for_spec(spec, false) })
    }

    /// The class of query tile `m` of head `h` against the key tile.
    fn classify(&self, kb: &Kb<'ctx>, m: IntValue<'ctx>, h: IntValue<'ctx>) -> R<TileClassVals<'ctx>> {
        let slot = BlockListArgs::head_slot(kb, self.slots, h, h);
        classes_of(kb, &[self.args.class_code(kb, self.b, slot, m, self.n)?])
    }
}

/// A (query head of the group, query tile) pair of a backward CTA's walk.
#[derive(Clone, Copy)]
pub struct QueryPair<'ctx> {
    pub g: IntValue<'ctx>,
    pub m: IntValue<'ctx>,
}

/// A backward CTA's walk over its key tiles: `body(key tile, walk index)` for the key
/// tiles `ctaid.x, ctaid.x + nctaid.x, …` below `n_tiles` (one per CTA, or in the slice
/// mode a grid column's share). Where `reverse` holds (the ordered deterministic mode,
/// `backward::reversed_key_tiles`, whose grid has a column per key tile) the CTA takes
/// key tile `n_tiles − 1 − ctaid.x` alone: counted from the last. The step is a select,
/// not a second counter (the TMA thread walks this in 24 registers).
pub fn walk_key_tiles<'ctx>(
    kb: &mut Kb<'ctx>,
    n_tiles: IntValue<'ctx>,
    reverse: IntValue<'ctx>,
    body: impl FnMut(&mut Kb<'ctx>, IntValue<'ctx>, IntValue<'ctx>) -> R<()>,
) -> R<()> {
    let x = kb.sreg("ctaid.x", "")?;
    walk_key_tiles_from(kb, x, n_tiles, reverse, body)
}

/// [`walk_key_tiles`] for a CTA whose grid column is `x` (a kernel that takes its CTAs'
/// coordinates in another order than the grid's).
pub fn walk_key_tiles_from<'ctx>(
    kb: &mut Kb<'ctx>,
    x: IntValue<'ctx>,
    n_tiles: IntValue<'ctx>,
    reverse: IntValue<'ctx>,
    mut body: impl FnMut(&mut Kb<'ctx>, IntValue<'ctx>, IntValue<'ctx>) -> R<()>,
) -> R<()> {
    let last_first = kb.sub(kb.sub(n_tiles, kb.i32c(1), "")?, x, "")?;
    let n_slot = kb.slot_i32("key_tile", kb.select_i(reverse, last_first, x, "")?)?;
    let iter = kb.slot_i32("key_tile_iter", kb.i32c(0))?;
    kb.while_loop(
        "key_tiles",
        // Unsigned: a negative tile (past the first, reversed) ends the walk too.
        |kb| kb.icmp(IntPredicate::ULT, kb.get_i(n_slot, "")?, n_tiles, ""),
        |kb| {
            let n = kb.get_i(n_slot, "n")?;
            let it = kb.get_i(iter, "it")?;
            body(kb, n, it)?;
            kb.set(iter, kb.add(it, kb.i32c(1), "")?)?;
            let next = kb.add(n, kb.sreg("nctaid.x", "")?, "")?;
            kb.set(n_slot, kb.select_i(reverse, kb.i32c(-1), next, "")?)
        },
    )
}

/// The query tiles one backward CTA visits for its key tile: the transpose of
/// [`KeyTiles`]. The backward walks, for a fixed key range, the query tiles of each
/// query head of its KV group, skipping the tiles the mask leaves empty and dropping the
/// per-element mask on full ones, with the same run-time interval classification.
#[derive(Clone)]
pub struct QueryTiles<'a, 'ctx> {
    pub spec: &'a Spec,
    pub block_m: u32,
    pub bv: BatchView<'ctx>,
    pub hkv: IntValue<'ctx>,
    /// The CTA's key range (inclusive), clipped to seqlen_k.
    pub k: (IntValue<'ctx>, IntValue<'ctx>),
    pub va: &'a VariantArgs<'ctx>,
    /// The launch's classes of this key tile, when the backward takes a block mask.
    pub classes: Option<DenseClasses<'ctx>>,
    /// Walk position `i` visits query tile `(i + rotation) mod m_tiles` instead of `i`:
    /// `(rotation, m_tiles)`. Key tiles that start their walks at different query tiles
    /// add their dQ into different rows at any moment, instead of every CTA of a head
    /// contending for the same rows of `dq_accum`.
    pub rotation: Option<(IntValue<'ctx>, IntValue<'ctx>)>,
    /// Tiles a walk over a launch's block classes probes at once (1: one at a time, a
    /// memory latency per empty tile; more: loads in flight together, at a few registers
    /// per probe — see [`QueryTiles::with_probes`]).
    pub probes: u32,
}

impl<'a, 'ctx> QueryTiles<'a, 'ctx> {
    /// The walk with `probes` class loads in flight per step where it reads a launch's
    /// block classes (a family passes what its walking roles' registers allow).
    pub fn with_probes(self, probes: u32) -> Self {
        QueryTiles { probes: probes.max(1), ..self }
    }

    /// The classification of the query tile starting at `m0` for query head `h`.
    pub fn classify(&self, kb: &Kb<'ctx>, m0: IntValue<'ctx>, h: IntValue<'ctx>) -> R<TileClassVals<'ctx>> {
        let bm = self.block_m as i64;
        if let Some(c) = &self.classes {
            return c.classify(kb, kb.udiv(m0, kb.i32c(bm), "")?, h);
        }
        let q_hi = kb.sub(kb.smin(kb.add(m0, kb.i32c(bm), "")?, self.bv.seqlen_q, "")?, kb.i32c(1), "")?;
        let tile = TileRanges {
            b: (self.bv.b, self.bv.b),
            h: (h, h),
            hkv: (self.hkv, self.hkv),
            q: (m0, q_hi),
            k: self.k,
            seqlen_q: self.bv.seqlen_q,
            seqlen_k: self.bv.seqlen_k,
        };
        classify_tile(kb, self.spec, &tile, self.va)
    }

    /// Whether query tile `t` of head `h` needs no per-element work against the CTA's
    /// keys: full, and inside seqlen_q (rows past it must not contribute) — the caller
    /// adds the key side's bound.
    pub fn full_inside(&self, kb: &Kb<'ctx>, t: IntValue<'ctx>, h: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        let bm = self.block_m as i64;
        let m0 = kb.mul(t, kb.i32c(bm), "m0")?;
        let cls = self.classify(kb, m0, h)?;
        let inside = kb.icmp(IntPredicate::SLE, kb.add(m0, kb.i32c(bm), "")?, self.bv.seqlen_q, "")?;
        kb.and(cls.full, inside, "q_tile_full")
    }

    /// The query tile that walk position `i` visits (see `rotation`).
    pub fn tile_of(&self, kb: &Kb<'ctx>, i: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        match self.rotation {
            Some((rot, m_tiles)) => kb.urem(kb.add(i, rot, "")?, m_tiles, "q_tile"),
            None => Ok(i),
        }
    }

    /// Query head `g` of this CTA's KV group.
    pub fn head(&self, kb: &Kb<'ctx>, g: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        kb.add(kb.mul(self.hkv, kb.i32c(self.spec.group_size() as i64), "")?, g, "h")
    }

    /// The first non-empty (query head of the group, query tile) pair at or after
    /// (`g`, `m_from`): the rest of head `g`'s tiles, then the next heads of the group from
    /// their first tile. `m` is a walk position ([`QueryTiles::tile_of`] gives its tile);
    /// `m == m_tiles` ends the walk. Every role of a backward CTA walks
    /// this same sequence, so ring positions agree without communication.
    pub fn advance(
        &self,
        kb: &mut Kb<'ctx>,
        m_tiles: IntValue<'ctx>,
        g: IntValue<'ctx>,
        m_from: IntValue<'ctx>,
    ) -> R<QueryPair<'ctx>> {
        let group = self.spec.group_size();
        let h = self.head(kb, g)?;
        let m = self.next_nonempty(kb, m_from, m_tiles, h, "next_q_tile")?;
        if group == 1 {
            return Ok(QueryPair { g, m });
        }
        let gs = kb.slot_i32("next_g", g)?;
        let ms = kb.slot_i32("next_m", m)?;
        let last_g = kb.i32c(group as i64 - 1);
        kb.while_loop(
            "next_head",
            |kb| {
                let done_head = kb.icmp(IntPredicate::SGE, kb.get_i(ms, "")?, m_tiles, "")?;
                let more = kb.icmp(IntPredicate::SLT, kb.get_i(gs, "")?, last_g, "")?;
                kb.and(done_head, more, "")
            },
            |kb| {
                let g2 = kb.add(kb.get_i(gs, "")?, kb.i32c(1), "")?;
                kb.set(gs, g2)?;
                let h2 = self.head(kb, g2)?;
                let m2 = self.next_nonempty(kb, kb.i32c(0), m_tiles, h2, "first_q_tile")?;
                kb.set(ms, m2)
            },
        )?;
        Ok(QueryPair { g: kb.get_i(gs, "g")?, m: kb.get_i(ms, "m")? })
    }

    /// Every role's walk over this key tile's pairs: `body(pair, ring position)`, the
    /// position (`pos`) carried over key tiles so the roles' rings stay in step.
    pub fn walk(
        &self,
        kb: &mut Kb<'ctx>,
        m_tiles: IntValue<'ctx>,
        pos: Slot<'ctx>,
        mut body: impl FnMut(&mut Kb<'ctx>, QueryPair<'ctx>, IntValue<'ctx>) -> R<()>,
    ) -> R<()> {
        let first = self.advance(kb, m_tiles, kb.i32c(0), kb.i32c(0))?;
        let g_slot = kb.slot_i32("g", first.g)?;
        let m_slot = kb.slot_i32("m", first.m)?;
        kb.while_loop(
            "q_tiles",
            |kb| kb.icmp(IntPredicate::SLT, kb.get_i(m_slot, "")?, m_tiles, ""),
            |kb| {
                let cur = QueryPair { g: kb.get_i(g_slot, "g")?, m: kb.get_i(m_slot, "m")? };
                let p = kb.get_i(pos, "pos")?;
                body(kb, cur, p)?;
                kb.set(pos, kb.add(p, kb.i32c(1), "")?)?;
                let next = self.advance(kb, m_tiles, cur.g, kb.add(cur.m, kb.i32c(1), "")?)?;
                kb.set(g_slot, next.g)?;
                kb.set(m_slot, next.m)
            },
        )
    }

    /// First walk position in [from, end) of head `h` whose query tile is not empty, or
    /// `end`.
    pub fn next_nonempty(
        &self,
        kb: &mut Kb<'ctx>,
        from: IntValue<'ctx>,
        end: IntValue<'ctx>,
        h: IntValue<'ctx>,
        name: &str,
    ) -> R<IntValue<'ctx>> {
        if self.spec.mask.is_none() {
            return Ok(from);
        }
        if self.classes.is_some() && self.probes > 1 {
            return self.next_classified(kb, from, end, h, name);
        }
        let cur = kb.slot_i32(name, from)?;
        let bm = self.block_m as i64;
        kb.while_loop(
            name,
            |kb| {
                let t = kb.get_i(cur, "")?;
                let in_range = kb.icmp(IntPredicate::SLT, t, end, "")?;
                // An out-of-range probe is harmless; the flag is and-ed with the range.
                let cls = self.classify(kb, kb.mul(self.tile_of(kb, t)?, kb.i32c(bm), "")?, h)?;
                kb.and(in_range, cls.empty, "")
            },
            |kb| {
                let t = kb.get_i(cur, "")?;
                kb.set(cur, kb.add(t, kb.i32c(1), "")?)
            },
        )?;
        kb.get_i(cur, name)
    }

    /// [`QueryTiles::next_nonempty`] over a launch's block classes: each probe is a load,
    /// and a walk probed one tile at a time waits a full memory latency per empty tile —
    /// a document mask's key tile, walked from its own index, probes ~m_tiles empty tiles
    /// after its last live one. Here `probes` loads go out together and the first live
    /// tile among them is taken (the probes past it cost bandwidth, not latency).
    fn next_classified(
        &self,
        kb: &mut Kb<'ctx>,
        from: IntValue<'ctx>,
        end: IntValue<'ctx>,
        h: IntValue<'ctx>,
        name: &str,
    ) -> R<IntValue<'ctx>> {
        let probes = self.probes as i64;
        let bm = self.block_m as i64;
        let cur = kb.slot_i32(name, from)?;
        let found = kb.slot_i32(&format!("{name}_found"), kb.i32c(0))?;
        kb.while_loop(
            name,
            |kb| {
                let more = kb.icmp(IntPredicate::SLT, kb.get_i(cur, "")?, end, "")?;
                let searching = kb.icmp(IntPredicate::EQ, kb.get_i(found, "")?, kb.i32c(0), "")?;
                kb.and(more, searching, "")
            },
            |kb| {
                let t = kb.get_i(cur, "probe_from")?;
                // The first live probe's offset, or `probes`; an out-of-range probe reads a
                // valid (wrapped) tile and is and-ed with the range.
                let mut first = kb.i32c(probes);
                for i in (0..probes).rev() {
                    let ti = kb.add(t, kb.i32c(i), "")?;
                    let in_range = kb.icmp(IntPredicate::SLT, ti, end, "")?;
                    let cls = self.classify(kb, kb.mul(self.tile_of(kb, ti)?, kb.i32c(bm), "")?, h)?;
                    let live = kb.and(in_range, kb.not(cls.empty, "")?, "probe_live")?;
                    first = kb.select_i(live, kb.i32c(i), first, "first_live")?;
                }
                let hit = kb.icmp(IntPredicate::SLT, first, kb.i32c(probes), "probe_hit")?;
                kb.set(found, kb.zext32(hit, "")?)?;
                let next = kb.smin(kb.add(t, first, "")?, end, "")?;
                kb.set(cur, next)
            },
        )?;
        kb.get_i(cur, name)
    }
}
