//! Block sparsity derived from the mask at launch: for concrete sequence lengths,
//! params and aux tensors, which (row tile, key tile) pairs of a kernel's tiling the mask
//! leaves empty, allows entirely, or allows in part.
//!
//! The static analysis ([`crate::analysis`]) sees an aux read as TOP, so a mask over aux
//! tensors (documents, segment ids) leaves every tile "partial". The block
//! classification closes that gap in two steps, both exact by construction:
//!
//! 1. **Intervals with aux values.** The analysis runs per tile with rule 4's aux form:
//!    an aux read over an index box gets the tensor's `[min, max]` over that box. The
//!    analysis is sound (module docs of `analysis`), so Full and Empty answers are right.
//! 2. **Elements where intervals cannot decide.** A tile the intervals leave Partial is
//!    evaluated element by element (with `eval`'s semantics) until both an allowed and a
//!    masked element are seen (it is then Partial), or all elements are seen (it is then
//!    Full or Empty).
//!
//! So a tile is Full only if every element is allowed and Empty only if none is; the
//! answer equals [`reference_classes`]'s brute force, which the tests check.
//!
//! A row tile is a kernel's: `block_m` query rows, or with `pack_gqa` `block_m` packed rows
//! (row `r` is position `r / G` of head `hkv·G + r % G`). Only elements inside the batch
//! entry's `seqlen_q` × `seqlen_k` count.

use crate::analysis::{classify_with_aux, mask_facts, HostAux, IntRange, TileClass, TileQuery};
use crate::eval::{eval, AuxTensor, Env, Value};
use crate::spec::Spec;

/// How a kernel tiles its rows and keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tiling {
    pub block_m: u32,
    pub block_n: u32,
    /// Rows are packed (position, head) pairs of one KV group.
    pub pack_gqa: bool,
}

impl Tiling {
    /// u32 words of one tile's mask bits: `block_m` rows of `block_n / 32` words (bit
    /// `k % 32` of word `k / 32` of row `r`: row `r`, key `k` of the tile, allowed).
    pub fn tile_words(&self) -> usize {
        self.block_m as usize * (self.block_n as usize).div_ceil(32)
    }
}

/// Which heads get their own classification.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HeadSlots {
    /// The mask does not read `h` or `hkv`: one classification serves every head.
    Shared,
    /// Packed GQA tiles: one per KV head (its rows span the group's heads).
    PerKvHead,
    /// One per query head.
    PerQHead,
}

impl HeadSlots {
    pub fn for_spec(spec: &Spec, pack_gqa: bool) -> HeadSlots {
        if !mask_facts(spec).uses_head {
            HeadSlots::Shared
        } else if pack_gqa {
            HeadSlots::PerKvHead
        } else {
            HeadSlots::PerQHead
        }
    }

    pub fn count(self, spec: &Spec) -> usize {
        match self {
            HeadSlots::Shared => 1,
            HeadSlots::PerKvHead => spec.kv_heads as usize,
            HeadSlots::PerQHead => spec.q_heads as usize,
        }
    }
}

/// Whether the spec's mask needs the classification at launch: it reads an aux tensor,
/// which the static analysis cannot see into (every tile would stay partial).
pub fn needs_block_mask(spec: &Spec) -> bool {
    let f = mask_facts(spec);
    f.has_mask && f.reads_aux && f.constant.is_none()
}

/// The extents of a classification: tiles per row and per key for the longest sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockDims {
    pub batch: usize,
    pub slots: usize,
    pub m_tiles: usize,
    pub n_tiles: usize,
    /// Partial tiles per row list that get their mask as bits ([`BITS_SLOT_SHIFT`]); 0:
    /// none, the kernels evaluate every partial tile's mask themselves.
    pub bits_per_row: usize,
    /// u32 words of one tile's bits: `block_m` rows of `block_n / 32` words.
    pub tile_words: usize,
}

impl BlockDims {
    pub fn new(spec: &Spec, tiling: Tiling, batch: usize, max_seqlen_q: usize, max_seqlen_k: usize) -> BlockDims {
        let group = if tiling.pack_gqa { spec.group_size().max(1) as usize } else { 1 };
        BlockDims {
            batch,
            slots: HeadSlots::for_spec(spec, tiling.pack_gqa).count(spec),
            m_tiles: (max_seqlen_q * group).div_ceil(tiling.block_m as usize),
            n_tiles: max_seqlen_k.div_ceil(tiling.block_n as usize),
            bits_per_row: 0,
            tile_words: tiling.tile_words(),
        }
    }

    /// These extents with `bits_per_row` bitmask slots per row list (at most
    /// [`MAX_BITS_PER_ROW`], and none when tile indices do not fit [`TILE_INDEX_MASK`]).
    pub fn with_bits(self, bits_per_row: usize) -> BlockDims {
        let fits = self.n_tiles <= TILE_INDEX_MASK as usize + 1;
        BlockDims { bits_per_row: if fits { bits_per_row.min(MAX_BITS_PER_ROW) } else { 0 }, ..self }
    }

    /// Words of the bitmasks of the whole launch: `[batch][slot][m_tiles][bits_per_row]`
    /// tiles of [`Self::tile_words`].
    pub fn bits_words(&self) -> usize {
        self.batch * self.slots * self.m_tiles * self.bits_per_row * self.tile_words
    }

    /// Words per row list: the count, then one entry per key tile.
    pub fn row_words(&self) -> usize {
        1 + self.n_tiles
    }

    /// Words of the row lists of the whole launch.
    pub fn list_words(&self) -> usize {
        self.batch * self.slots * self.m_tiles * self.row_words()
    }

    fn index(&self, b: usize, slot: usize, m: usize) -> usize {
        (b * self.slots + slot) * self.m_tiles + m
    }
}

/// A list entry's flag: the tile is full (no per-element mask work).
pub const FULL_TILE: u32 = 1 << 31;
/// A list entry's bits 0..20: the key tile's index.
pub const TILE_INDEX_MASK: u32 = (1 << 20) - 1;
/// A partial tile's entry holds, from this bit, 1 + its slot among its row's bitmasks
/// (its ordinal among the row's partial tiles, when below `bits_per_row`), or 0: the
/// kernel evaluates that tile's mask itself.
pub const BITS_SLOT_SHIFT: u32 = 20;
/// The slot field's width (11 bits).
pub const BITS_SLOT_MASK: u32 = 0x7ff;
/// The most bitmask slots a row list can name.
pub const MAX_BITS_PER_ROW: usize = BITS_SLOT_MASK as usize - 1;

/// Classes of every (batch, head slot, row tile, key tile); tiles outside a batch entry's
/// extents are Empty.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockClasses {
    pub tiling: Tiling,
    pub dims: BlockDims,
    /// Rows per query position (the GQA group with `pack_gqa`, else 1).
    pub group: usize,
    /// `[batch][slot][m_tiles][n_tiles]`.
    pub classes: Vec<TileClass>,
}

impl BlockClasses {
    pub fn get(&self, b: usize, slot: usize, m: usize, n: usize) -> TileClass {
        self.classes[self.dims.index(b, slot, m) * self.dims.n_tiles + n]
    }

    /// The row lists a forward kernel walks: per (batch, slot, row tile) the number of
    /// non-empty key tiles, then their indices in ascending order, [`FULL_TILE`] set on
    /// full ones and, on the first `bits_per_row` partial ones, 1 + their bitmask slot
    /// from [`BITS_SLOT_SHIFT`]; unused entries are 0.
    pub fn row_lists(&self, bits_per_row: usize) -> Vec<u32> {
        let d = self.dims;
        let mut out = vec![0u32; d.list_words()];
        for row in 0..d.batch * d.slots * d.m_tiles {
            let base = row * d.row_words();
            let (mut count, mut partial) = (0usize, 0usize);
            for n in 0..d.n_tiles {
                let c = self.classes[row * d.n_tiles + n];
                let flags = match c {
                    TileClass::Empty => continue,
                    TileClass::Full => FULL_TILE,
                    TileClass::Partial => {
                        partial += 1;
                        if partial <= bits_per_row {
                            (partial as u32) << BITS_SLOT_SHIFT
                        } else {
                            0
                        }
                    }
                };
                out[base + 1 + count] = n as u32 | flags;
                count += 1;
            }
            out[base] = count as u32;
        }
        out
    }

    /// Fraction of the tiles inside the batch entries' extents that are not empty.
    pub fn live_fraction(&self, seqlens: &[(usize, usize)]) -> f64 {
        let (mut live, mut total) = (0usize, 0usize);
        let group = self.group_rows();
        for (b, &(sq, sk)) in seqlens.iter().enumerate() {
            let mt = (sq * group).div_ceil(self.tiling.block_m as usize);
            let nt = sk.div_ceil(self.tiling.block_n as usize);
            for slot in 0..self.dims.slots {
                for m in 0..mt {
                    for n in 0..nt {
                        total += 1;
                        live += usize::from(self.get(b, slot, m, n) != TileClass::Empty);
                    }
                }
            }
        }
        if total == 0 {
            0.0
        } else {
            live as f64 / total as f64
        }
    }

    fn group_rows(&self) -> usize {
        self.group
    }
}

/// The launch data a classification reads.
#[derive(Clone, Copy, Debug)]
pub struct LaunchData<'a> {
    /// `(seqlen_q, seqlen_k)` per batch entry.
    pub seqlens: &'a [(usize, usize)],
    /// Param values in declaration order.
    pub params: &'a [Value],
    /// Aux tensors in declaration order, dims resolved.
    pub aux: &'a [AuxTensor],
    /// Where each batch entry sits in longer sequences (context parallelism); empty
    /// when every entry is whole. Masks see global positions and lengths.
    pub positions: &'a [crate::ShardPositions],
}

impl LaunchData<'_> {
    /// Batch entry `b`'s query and key offsets and global lengths (given its local ones).
    fn frame(&self, b: usize, sq: usize, sk: usize) -> (usize, usize, usize, usize) {
        self.positions.get(b).map_or((0, 0, sq, sk), |p| (p.q_offset, p.k_offset, p.seqlen_q, p.seqlen_k))
    }
}

/// The elements of one row tile: its (position, head) pairs inside seqlen_q.
fn tile_rows(spec: &Spec, tiling: Tiling, slot: usize, m: usize, seqlen_q: usize) -> Vec<(usize, usize)> {
    let group = spec.group_size().max(1) as usize;
    let slots = HeadSlots::for_spec(spec, tiling.pack_gqa);
    let bm = tiling.block_m as usize;
    (m * bm..(m + 1) * bm)
        .filter_map(|r| {
            let (q, h) = if tiling.pack_gqa { (r / group, slot * group + r % group) } else { (r, slot) };
            // A shared slot stands for every head: the mask reads none, so head 0 speaks for all.
            let h = if slots == HeadSlots::Shared && !tiling.pack_gqa { 0 } else { h };
            (q < seqlen_q).then_some((q, h))
        })
        .collect()
}

/// What the interval step knows about one tile.
fn tile_query(spec: &Spec, b: usize, rows: &[(usize, usize)], k: IntRange, seqlens: (usize, usize)) -> TileQuery {
    let group = spec.group_size().max(1) as i64;
    let mut t = TileQuery::unbounded(spec);
    let (q_lo, q_hi) = rows.iter().fold((i64::MAX, i64::MIN), |(lo, hi), &(q, _)| (lo.min(q as i64), hi.max(q as i64)));
    let (h_lo, h_hi) = rows.iter().fold((i64::MAX, i64::MIN), |(lo, hi), &(_, h)| (lo.min(h as i64), hi.max(h as i64)));
    t.b = IntRange::point(b as i64);
    t.q = IntRange::new(q_lo, q_hi);
    t.h = IntRange::new(h_lo, h_hi);
    t.hkv = IntRange::new(h_lo.div_euclid(group), h_hi.div_euclid(group));
    t.k = k;
    t.seqlen_q = IntRange::point(seqlens.0 as i64);
    t.seqlen_k = IntRange::point(seqlens.1 as i64);
    t
}

fn param_ranges(spec: &Spec, params: &[Value]) -> Vec<Option<IntRange>> {
    spec.params
        .iter()
        .zip(params)
        .map(|(d, v)| match (d.ty, v) {
            (crate::expr::Ty::Int, Value::Int(x)) => Some(IntRange::point(*x as i64)),
            _ => None,
        })
        .collect()
}

/// How one tile was decided (for tests and the docs' accounting).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decided {
    Intervals,
    Elements,
}

/// Classifies one tile the way the run-time classifier does: intervals with aux values,
/// then elements (stopping at the first allowed/masked pair) where intervals are unsure.
pub fn classify_tile(
    spec: &Spec,
    tiling: Tiling,
    data: &LaunchData,
    b: usize,
    slot: usize,
    m: usize,
    n: usize,
) -> (TileClass, Decided) {
    let Some(pred) = spec.mask.to_predicate() else {
        return (TileClass::Full, Decided::Intervals);
    };
    let (sq, sk) = data.seqlens[b];
    let rows = tile_rows(spec, tiling, slot, m, sq);
    let bn = tiling.block_n as usize;
    let keys = n * bn..((n + 1) * bn).min(sk);
    if rows.is_empty() || keys.is_empty() {
        return (TileClass::Empty, Decided::Intervals);
    }
    // The analysis sees the tile in the global frame (as the kernels' expressions do).
    let (qo, ko, gsq, gsk) = data.frame(b, sq, sk);
    let global_rows: Vec<(usize, usize)> = rows.iter().map(|&(q, h)| (qo + q, h)).collect();
    let global_keys = IntRange::new((ko + keys.start) as i64, (ko + keys.end) as i64 - 1);
    let mut query = tile_query(spec, b, &global_rows, global_keys, (gsq, gsk));
    query.params = param_ranges(spec, data.params);
    let c = classify_with_aux(spec, &query, &HostAux(data.aux));
    if c != TileClass::Partial {
        return (c, Decided::Intervals);
    }
    let mut env = env_for(spec, data, b, sq, sk);
    let (mut any, mut all) = (false, true);
    for_each_element(spec, &mut env, (qo, ko), &rows, keys, |env| {
        let ok = eval(spec, &pred, env).as_bool();
        any |= ok;
        all &= ok;
        // Go on until both kinds are seen (Partial).
        !any || all
    });
    let class = match (any, all) {
        (_, true) => TileClass::Full,
        (false, _) => TileClass::Empty,
        _ => TileClass::Partial,
    };
    (class, Decided::Elements)
}

/// Calls `visit` with `env` at every element of the tile (its rows' position and head,
/// each key), row by row, until `visit` returns false.
fn for_each_element(
    spec: &Spec,
    env: &mut Env,
    offsets: (usize, usize),
    rows: &[(usize, usize)],
    keys: std::ops::Range<usize>,
    mut visit: impl FnMut(&Env) -> bool,
) {
    let group = spec.group_size().max(1) as usize;
    for &(q, h) in rows {
        env.q = (offsets.0 + q) as i32;
        env.h = h as i32;
        env.hkv = (h / group) as i32;
        for k in keys.clone() {
            env.k = (offsets.1 + k) as i32;
            if !visit(env) {
                return;
            }
        }
    }
}

fn env_for<'a>(spec: &Spec, data: &LaunchData<'a>, b: usize, sq: usize, sk: usize) -> Env<'a> {
    let (_, _, sq, sk) = data.frame(b, sq, sk);
    Env {
        b: b as i32,
        h: 0,
        hkv: 0,
        q: 0,
        k: 0,
        score: 0.0,
        seqlen_q: sq as i32,
        seqlen_k: sk as i32,
        q_heads: spec.q_heads as i32,
        kv_heads: spec.kv_heads as i32,
        params: data.params,
        aux: data.aux,
    }
}

/// The number of (query, key) pairs the mask allows, summed over batch entries and
/// query heads: exact, counting full tiles whole and evaluating only the elements of
/// partial ones (tiles of `tiling`, classified as the run-time classifier does).
pub fn allowed_pairs(spec: &Spec, tiling: Tiling, data: &LaunchData) -> u64 {
    let tiling = Tiling { pack_gqa: false, ..tiling };
    let Some(pred) = spec.mask.to_predicate() else {
        return data.seqlens.iter().map(|&(q, k)| (q * k) as u64).sum::<u64>() * u64::from(spec.q_heads);
    };
    let slots = HeadSlots::for_spec(spec, false);
    let (heads, per_slot) = match slots {
        HeadSlots::Shared => (1, u64::from(spec.q_heads)),
        _ => (spec.q_heads as usize, 1),
    };
    let (bm, bn) = (tiling.block_m as usize, tiling.block_n as usize);
    let mut total = 0u64;
    for (b, &(sq, sk)) in data.seqlens.iter().enumerate() {
        let mut env = env_for(spec, data, b, sq, sk);
        let (qo, ko, _, _) = data.frame(b, sq, sk);
        let offsets = (qo, ko);
        for slot in 0..heads {
            for m in 0..sq.div_ceil(bm) {
                let rows = tile_rows(spec, tiling, slot, m, sq);
                for n in 0..sk.div_ceil(bn) {
                    let keys = n * bn..((n + 1) * bn).min(sk);
                    match classify_tile(spec, tiling, data, b, slot, m, n).0 {
                        TileClass::Empty => {}
                        TileClass::Full => total += (rows.len() * keys.len()) as u64 * per_slot,
                        TileClass::Partial => for_each_element(spec, &mut env, offsets, &rows, keys, |env| {
                            total += u64::from(eval(spec, &pred, env).as_bool()) * per_slot;
                            true
                        }),
                    }
                }
            }
        }
    }
    total
}

/// The classes by brute force: every element of every tile evaluated.
pub fn reference_classes(spec: &Spec, tiling: Tiling, data: &LaunchData) -> BlockClasses {
    let max_q = data.seqlens.iter().map(|s| s.0).max().unwrap_or(0);
    let max_k = data.seqlens.iter().map(|s| s.1).max().unwrap_or(0);
    let dims = BlockDims::new(spec, tiling, data.seqlens.len(), max_q, max_k);
    let group = if tiling.pack_gqa { spec.group_size().max(1) as usize } else { 1 };
    let pred = spec.mask.to_predicate();
    let mut classes = vec![TileClass::Empty; dims.batch * dims.slots * dims.m_tiles * dims.n_tiles];
    let bn = tiling.block_n as usize;
    for (b, &(sq, sk)) in data.seqlens.iter().enumerate() {
        let mut env = env_for(spec, data, b, sq, sk);
        let (qo, ko, _, _) = data.frame(b, sq, sk);
        for slot in 0..dims.slots {
            for m in 0..dims.m_tiles {
                let rows = tile_rows(spec, tiling, slot, m, sq);
                for n in 0..dims.n_tiles {
                    let keys = n * bn..((n + 1) * bn).min(sk);
                    if rows.is_empty() || keys.is_empty() {
                        continue;
                    }
                    let (mut any, mut all) = (false, true);
                    for_each_element(spec, &mut env, (qo, ko), &rows, keys, |env| {
                        let ok = pred.as_ref().is_none_or(|p| eval(spec, p, env).as_bool());
                        any |= ok;
                        all &= ok;
                        true
                    });
                    classes[dims.index(b, slot, m) * dims.n_tiles + n] = match (any, all) {
                        (_, true) => TileClass::Full,
                        (false, _) => TileClass::Empty,
                        _ => TileClass::Partial,
                    };
                }
            }
        }
    }
    BlockClasses { tiling, dims, group, classes }
}

/// The mask bits of one tile ([`Tiling::tile_words`] words) by brute force: a bit per
/// element inside the batch entry's rows and keys where the mask allows it; elements
/// outside are 0.
pub fn reference_tile_bits(
    spec: &Spec,
    tiling: Tiling,
    data: &LaunchData,
    b: usize,
    slot: usize,
    m: usize,
    n: usize,
) -> Vec<u32> {
    let mut out = vec![0u32; tiling.tile_words()];
    let (sq, sk) = data.seqlens[b];
    let rows = tile_rows(spec, tiling, slot, m, sq);
    let bn = tiling.block_n as usize;
    let keys = n * bn..((n + 1) * bn).min(sk);
    if rows.is_empty() || keys.is_empty() {
        return out;
    }
    let words = bn.div_ceil(32);
    let pred = spec.mask.to_predicate();
    let mut env = env_for(spec, data, b, sq, sk);
    let (qo, ko, _, _) = data.frame(b, sq, sk);
    let mut i = 0usize;
    let per_row = keys.len();
    for_each_element(spec, &mut env, (qo, ko), &rows, keys, |env| {
        let (r, k) = (i / per_row, i % per_row);
        if pred.as_ref().is_none_or(|p| eval(spec, p, env).as_bool()) {
            out[r * words + k / 32] |= 1 << (k % 32);
        }
        i += 1;
        true
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::expr::{BinOp, Expr, Var};
    use crate::generate::random_spec;
    use crate::reference::{random_inputs, Rng};
    use crate::spec::{Align, AuxDecl, AuxDim, AuxElem};

    fn document_mask(q_heads: u32, kv_heads: u32) -> Spec {
        let mut s = Spec::new("document_mask", 64, q_heads);
        s.kv_heads = kv_heads;
        s.aux = vec![AuxDecl {
            name: "doc".into(),
            dims: vec![AuxDim::Batch, AuxDim::MaxSeqlenK],
            elem: AuxElem::Int,
            learnable: false,
        }];
        s.mask.causal = Some(Align::TopLeft);
        let doc = |v| Expr::aux("doc", vec![Expr::var(Var::B), Expr::var(v)]);
        s.mask.predicate = Some(Expr::binary(BinOp::Eq, doc(Var::Q), doc(Var::K)));
        s
    }

    /// Documents of 1..=max_len tokens, ids ascending, per batch entry.
    fn documents(rng: &mut Rng, batch: usize, seqlen: usize, max_len: i64) -> AuxTensor {
        let mut ids = Vec::with_capacity(batch * seqlen);
        for _ in 0..batch {
            let (mut id, mut left) = (0, rng.int_in(1, max_len));
            for _ in 0..seqlen {
                if left == 0 {
                    id += 1;
                    left = rng.int_in(1, max_len);
                }
                ids.push(id);
                left -= 1;
            }
        }
        AuxTensor::int(vec![batch, seqlen], ids)
    }

    fn check_all_tiles(spec: &Spec, tiling: Tiling, data: &LaunchData) -> (usize, usize) {
        let reference = reference_classes(spec, tiling, data);
        let d = reference.dims;
        let mut by_elements = 0;
        for b in 0..d.batch {
            for slot in 0..d.slots {
                for m in 0..d.m_tiles {
                    for n in 0..d.n_tiles {
                        let (c, how) = classify_tile(spec, tiling, data, b, slot, m, n);
                        assert_eq!(
                            c,
                            reference.get(b, slot, m, n),
                            "{}: tile b{b} slot{slot} m{m} n{n} ({how:?}) with {tiling:?}",
                            spec.name
                        );
                        by_elements += usize::from(how == Decided::Elements);
                    }
                }
            }
        }
        (by_elements, d.batch * d.slots * d.m_tiles * d.n_tiles)
    }

    #[test]
    fn document_mask_is_exact_and_mostly_decided_by_intervals() {
        let mut rng = Rng::new(11);
        let spec = document_mask(4, 2);
        let seqlens = [(203, 203), (97, 97)];
        let aux = [documents(&mut rng, 2, 203, 40)];
        let data = LaunchData { seqlens: &seqlens, params: &[], aux: &aux, positions: &[] };
        for tiling in [
            Tiling { block_m: 16, block_n: 16, pack_gqa: false },
            Tiling { block_m: 32, block_n: 16, pack_gqa: true },
            Tiling { block_m: 16, block_n: 48, pack_gqa: false },
        ] {
            let (by_elements, total) = check_all_tiles(&spec, tiling, &data);
            assert!(by_elements * 3 < total, "{tiling:?}: {by_elements} of {total} tiles needed elements");
        }
        let classes = reference_classes(&spec, Tiling { block_m: 16, block_n: 16, pack_gqa: false }, &data);
        let bits_per_row = 2;
        let lists = classes.row_lists(bits_per_row);
        let d = classes.dims;
        assert_eq!(d.slots, 1, "the mask reads no head");
        let mut slotted = 0;
        for row in 0..d.batch * d.m_tiles {
            let words = &lists[row * d.row_words()..][..d.row_words()];
            let entries = &words[1..1 + words[0] as usize];
            let tile = |e: u32| (e & TILE_INDEX_MASK) as usize;
            assert!(entries.windows(2).all(|w| tile(w[0]) < tile(w[1])), "ascending");
            // Partial tiles take bitmask slots 1, 2, ... in list order, up to bits_per_row.
            let mut partial = 0;
            for &e in entries {
                let c = classes.classes[row * d.n_tiles + tile(e)];
                assert_eq!(c == TileClass::Full, e & FULL_TILE != 0);
                assert_ne!(c, TileClass::Empty);
                let slot = ((e >> BITS_SLOT_SHIFT) & BITS_SLOT_MASK) as usize;
                if c == TileClass::Partial {
                    partial += 1;
                    assert_eq!(slot, if partial <= bits_per_row { partial } else { 0 });
                    slotted += usize::from(slot > 0);
                } else {
                    assert_eq!(slot & (BITS_SLOT_MASK as usize >> 1), 0, "no slot on a full tile");
                }
            }
        }
        assert!(slotted > 0);
        let live = classes.live_fraction(&seqlens);
        assert!(live > 0.0 && live < 0.5, "live fraction {live}");
    }

    /// A tile's bits agree with its class: all ones over the tile's elements on a full
    /// tile, none on an empty one, some on a partial one; each bit is the mask at that
    /// element.
    #[test]
    fn tile_bits_match_classes_and_elements() {
        let mut rng = Rng::new(12);
        let spec = document_mask(4, 2);
        let seqlens = [(203, 150), (97, 97)];
        let aux = [documents(&mut rng, 2, 203, 40)];
        let data = LaunchData { seqlens: &seqlens, params: &[], aux: &aux, positions: &[] };
        for tiling in
            [Tiling { block_m: 32, block_n: 64, pack_gqa: false }, Tiling { block_m: 32, block_n: 48, pack_gqa: true }]
        {
            let classes = reference_classes(&spec, tiling, &data);
            let d = classes.dims;
            let wpr = (tiling.block_n as usize).div_ceil(32);
            for (b, &(sq, sk)) in seqlens.iter().enumerate() {
                for slot in 0..d.slots {
                    for m in 0..d.m_tiles {
                        let rows = tile_rows(&spec, tiling, slot, m, sq);
                        for n in 0..d.n_tiles {
                            let bits = reference_tile_bits(&spec, tiling, &data, b, slot, m, n);
                            assert_eq!(bits.len(), tiling.tile_words());
                            let keys = (n * tiling.block_n as usize..((n + 1) * tiling.block_n as usize).min(sk)).len();
                            let set: u32 = bits.iter().map(|w| w.count_ones()).sum();
                            match classes.get(b, slot, m, n) {
                                TileClass::Full => assert_eq!(set as usize, rows.len() * keys),
                                TileClass::Empty => assert_eq!(set, 0),
                                TileClass::Partial => assert!(set > 0 && (set as usize) < rows.len() * keys),
                            }
                            // Element (r, k): causal and the same document.
                            for (r, &(q, _)) in rows.iter().enumerate() {
                                for k in 0..keys {
                                    let key = n * tiling.block_n as usize + k;
                                    let doc = |i: usize| aux[0].get(&[b as i32, i as i32]).as_int();
                                    let ok = key <= q && doc(q) == doc(key);
                                    assert_eq!(
                                        bits[r * wpr + k / 32] >> (k % 32) & 1 == 1,
                                        ok,
                                        "b{b} m{m} n{n} r{r} k{k}"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// The run-time algorithm (intervals with aux values, then elements) equals brute
    /// force on random valid specs and random data, for several tilings: exact, so a
    /// Full tile has every element allowed and an Empty one none.
    #[test]
    fn random_specs_classify_exactly() {
        let mut rng = Rng::new(0xb10c);
        let mut tested = 0;
        for i in 0..400 {
            let spec = random_spec(&mut rng, &format!("r{i}"));
            if spec.mask.to_predicate().is_none() {
                continue;
            }
            let seqlens: Vec<(usize, usize)> =
                (0..2).map(|_| (rng.int_in(1, 45) as usize, rng.int_in(1, 45) as usize)).collect();
            let aux_elems = spec.aux.iter().map(|a| {
                crate::reference::resolve_aux_dims(&spec, &a.dims, &seqlens)
                    .iter()
                    .fold(1usize, |n, &d| n.saturating_mul(d))
            });
            if aux_elems.max().unwrap_or(0) > 1 << 16 {
                continue;
            }
            let inputs = random_inputs(&spec, &seqlens, rng.next_u64());
            let data = LaunchData { seqlens: &seqlens, params: &inputs.params, aux: &inputs.aux, positions: &[] };
            // And a shard of the same sequences (context parallelism): its tiles in the
            // global frame, through both the intervals and the elements.
            let (gq, gk) = (seqlens[0].0.min(seqlens[1].0), seqlens[0].1.min(seqlens[1].1));
            let qa = rng.int_in(0, gq as i64 - 1) as usize;
            let ka = rng.int_in(0, gk as i64 - 1) as usize;
            let shard = inputs.shard(&spec, qa..gq, ka..gk, true);
            let shard_lens: Vec<(usize, usize)> = shard.seqs.iter().map(|s| (s.seqlen_q, s.seqlen_k)).collect();
            let shard_data = LaunchData {
                seqlens: &shard_lens,
                params: &shard.params,
                aux: &shard.aux,
                positions: &shard.positions,
            };
            for tiling in [
                Tiling { block_m: 8, block_n: 8, pack_gqa: false },
                Tiling { block_m: 16, block_n: 8, pack_gqa: spec.kv_heads < spec.q_heads },
            ] {
                check_all_tiles(&spec, tiling, &data);
                check_all_tiles(&spec, tiling, &shard_data);
            }
            tested += 1;
        }
        assert!(tested > 100, "only {tested} specs had a mask");
    }

    #[test]
    fn allowed_pairs_match_a_full_count() {
        let mut rng = Rng::new(5);
        let spec = document_mask(4, 2);
        let seqlens = [(150, 150), (61, 61)];
        let aux = [documents(&mut rng, 2, 150, 30)];
        let data = LaunchData { seqlens: &seqlens, params: &[], aux: &aux, positions: &[] };
        let pred = spec.mask.to_predicate().expect("mask");
        let mut want = 0u64;
        for (b, &(sq, sk)) in seqlens.iter().enumerate() {
            let mut env = env_for(&spec, &data, b, sq, sk);
            for q in 0..sq {
                for k in 0..sk {
                    env.q = q as i32;
                    env.k = k as i32;
                    want += u64::from(eval(&spec, &pred, &env).as_bool());
                }
            }
        }
        let tiling = Tiling { block_m: 32, block_n: 16, pack_gqa: false };
        assert_eq!(allowed_pairs(&spec, tiling, &data), want * 4);
    }

    #[test]
    fn needs_block_mask_only_for_aux_masks() {
        assert!(needs_block_mask(&document_mask(4, 2)));
        let mut causal = Spec::new("c", 64, 4);
        causal.mask.causal = Some(Align::TopLeft);
        assert!(!needs_block_mask(&causal));
        let mut constant = document_mask(4, 2);
        constant.mask.causal = None;
        constant.mask.predicate = Some(Expr::bool(false).and(Expr::binary(
            BinOp::Eq,
            Expr::aux("doc", vec![Expr::int(0), Expr::int(0)]),
            Expr::int(1),
        )));
        assert!(!needs_block_mask(&constant), "decided without data");
    }
}
