//! Block masks: the row lists of non-empty key tiles that a forward walks when its spec's
//! mask reads aux tensors (`attnc_ir::block_mask`). The compiler emits the classifier
//! from the mask; [`Kernel::block_mask`] runs it once for a launch's shapes, params and
//! aux tensors, and every layer that shares them passes the object in
//! ([`crate::Params::block_mask`]) instead of classifying again. Without one, the forward
//! classifies per call (correct, slower; the receipt says so).

use crate::cuda::ArgValue;
use crate::error::RuntimeError;
use crate::receipt::{BlockMaskSource, BlockMaskUse};
use crate::tensor::{IndexTensor, Tensor};
use crate::validate::LaunchPlan;
use attnc_ir::block_mask::{BlockDims, Tiling, FULL_TILE};
use attnc_lower::variant::tiles::BLOCK_LIST_PARAMS;
use attnc_lower::BlockLayout;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// What a launch's block mask was built for; a mask is only valid for the same.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct BuiltFor {
    /// The forward module's cache key (spec, arch, family, compiler).
    pub(crate) module_key: String,
    pub(crate) tiling: Tiling,
    /// Row lists (the portable and hopper forwards) or one class per tile (blackwell).
    pub(crate) layout: BlockLayout,
    pub(crate) dims: BlockDims,
    /// Per batch entry (q, k) lengths the lists cover.
    pub(crate) seqlens: Vec<(usize, usize)>,
    /// Device addresses of the aux tensors and the param values (by name).
    pub(crate) aux: Vec<(String, u64)>,
    pub(crate) params: Vec<(String, String)>,
}

/// A block mask's backward classes, locked while a backward reads or builds them.
pub(crate) type BackwardPart<'m> = std::sync::MutexGuard<'m, Option<Box<BlockMask>>>;

/// The classified row lists of one launch configuration, on the device.
pub struct BlockMask {
    pub(crate) built_for: BuiltFor,
    pub(crate) lists: Tensor,
    /// GPU time of the classification, when it was timed.
    pub(crate) classify_ms: Option<f64>,
    /// The backward's classes (its own tiling and layout: one class per 64-row query tile
    /// and key tile), added by the first backward that receives this mask and reused by
    /// every later one, so a training step classifies once for all layers and both
    /// directions. Behind a lock: a mask is shared by reference.
    pub(crate) backward: Mutex<Option<Box<BlockMask>>>,
    /// Distinct for every mask built in this process. A mask's lists are fixed once
    /// built, so a forward's launch memo may key a passed-in mask by it: the same mask in
    /// the same launch passed its check before.
    pub(crate) id: u64,
}

static NEXT_MASK_ID: AtomicU64 = AtomicU64::new(1);

impl std::fmt::Debug for BlockMask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BlockMask({:?}, {:?})", self.built_for.tiling, self.built_for.dims)
    }
}

/// u32 words a classifier writes for `dims` in `layout`: the lists (or classes), then,
/// 16-byte aligned, the partial tiles' bits and the bit-work queue.
pub(crate) fn layout_words(d: BlockDims, layout: BlockLayout) -> usize {
    match layout {
        BlockLayout::RowLists => d.list_words(),
        BlockLayout::Dense => dense_words(d),
        BlockLayout::RowListsWithBits | BlockLayout::DenseWithBits => queue_offset_words(d, layout) + queue_words(d),
    }
}

/// Where the bit-work queue starts (16-byte aligned, after the bits).
fn queue_offset_words(d: BlockDims, layout: BlockLayout) -> usize {
    (bits_offset_words(d, layout) + d.bits_words()).div_ceil(4) * 4
}

/// The queue's words: its count, then an item per bitmask slot.
fn queue_words(d: BlockDims) -> usize {
    use attnc_lower::families::common::block_mask::{QUEUE_HEADER_WORDS, QUEUE_ITEM_WORDS};
    QUEUE_HEADER_WORDS + QUEUE_ITEM_WORDS * d.batch * d.slots * d.m_tiles * d.bits_per_row
}

fn dense_words(d: BlockDims) -> usize {
    d.batch * d.slots * d.m_tiles * d.n_tiles
}

/// Where the bits start, in u32 words from the lists' (or classes') start (16-byte
/// aligned, so a row of a tile's bits is one vector load).
fn bits_offset_words(d: BlockDims, layout: BlockLayout) -> usize {
    let before = if layout.has_lists() { d.list_words() } else { dense_words(d) };
    before.div_ceil(4) * 4
}

/// Words of bits a launch's mask may hold (32 MB): a row's partial tiles past what fits
/// are evaluated by the kernels themselves. A row tile across a document boundary has
/// every live tile partial (a 2816-token document: 22 at 128 keys), so a small fixed
/// number of slots per row does not do (16 cost the document mask 3%).
const BITS_BUDGET_WORDS: usize = 8 << 20;

/// `d` with the bitmask slots `layout` gets: in `RowListsWithBits`, one per key tile of a
/// row as far as [`BITS_BUDGET_WORDS`] allows.
pub(crate) fn with_bit_slots(d: BlockDims, layout: BlockLayout) -> BlockDims {
    if !layout.has_bits() {
        return d.with_bits(0);
    }
    let rows = (d.batch * d.slots * d.m_tiles).max(1);
    let fit = BITS_BUDGET_WORDS / (rows * d.tile_words.max(1));
    d.with_bits(d.n_tiles.min(fit))
}

/// The kernel arguments of a block mask at `ptr` with extents `d`
/// (`attnc_lower::variant::tiles::BLOCK_LIST_PARAMS`, in order).
pub(crate) fn list_args(ptr: u64, d: BlockDims, layout: BlockLayout) -> [(&'static str, ArgValue); 6] {
    let [lists, slots, m_tiles, n_tiles, bits, bits_per_row] = BLOCK_LIST_PARAMS;
    let bits_ptr = if d.bits_per_row > 0 { ptr + 4 * bits_offset_words(d, layout) as u64 } else { 0 };
    [
        (lists, ArgValue::Ptr(ptr)),
        (slots, ArgValue::I32(d.slots as i32)),
        (m_tiles, ArgValue::I32(d.m_tiles as i32)),
        (n_tiles, ArgValue::I32(d.n_tiles as i32)),
        (bits, ArgValue::Ptr(bits_ptr)),
        (bits_per_row, ArgValue::I32(d.bits_per_row as i32)),
    ]
}

/// How a mask's classification launches, for the forward's and the backward's builds.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ClassifierLaunch {
    /// The classifier's grid (one CTA per row of tiles) and dynamic shared memory.
    pub(crate) grid: [u32; 3],
    pub(crate) smem: u32,
    /// The bits kernel's grid ([`bits_grid`]; zero without bits).
    pub(crate) bits_grid: [u32; 3],
    /// The bit-work queue's count, zeroed before the classifier (layouts with bits).
    pub(crate) queue_count: Option<u64>,
}

impl ClassifierLaunch {
    /// The launch for a mask of extents `d` in `layout` at device address `ptr`.
    pub(crate) fn new(d: BlockDims, tiling: Tiling, layout: BlockLayout, ptr: u64, sm_count: u32) -> Self {
        ClassifierLaunch {
            grid: [d.m_tiles as u32, d.slots as u32, d.batch as u32],
            smem: attnc_lower::families::common::block_mask::smem_bytes(d.n_tiles as u32),
            bits_grid: bits_grid(d, tiling, layout, sm_count),
            queue_count: queue_arg(ptr, d, layout).map(|(_, at)| at),
        }
    }
}

/// With bits: the bit-work queue's argument (the classifier and the bits kernel take it)
/// and the address of its count, which must read 0 when the classifier starts.
pub(crate) fn queue_arg(ptr: u64, d: BlockDims, layout: BlockLayout) -> Option<((&'static str, ArgValue), u64)> {
    if !layout.has_bits() {
        return None;
    }
    let at = ptr + 4 * queue_offset_words(d, layout) as u64;
    Some(((attnc_lower::families::common::block_mask::QUEUE_PARAM, ArgValue::Ptr(at)), at))
}

/// CTAs per SM of the bits kernel's grid (4 warps each, a few dozen registers).
const BITS_CTAS_PER_SM: usize = 8;

/// The bits kernel's grid: as many CTAs as the work can use, at most `BITS_CTAS_PER_SM`
/// per SM (its warps stride over the queued work; `Grid::QueuedBitWork`). All zero when
/// no tile can get a slot.
pub(crate) fn bits_grid(d: BlockDims, tiling: Tiling, layout: BlockLayout, sm_count: u32) -> [u32; 3] {
    use attnc_lower::families::common::block_mask::{bit_steps, BITS_WARPS};
    let slots = d.batch * d.slots * d.m_tiles * d.bits_per_row;
    if !layout.has_bits() || slots == 0 {
        return [0, 0, 0];
    }
    let work = slots * bit_steps(tiling, layout).0 as usize;
    let ctas = work.div_ceil(BITS_WARPS as usize).min(sm_count.max(1) as usize * BITS_CTAS_PER_SM);
    [ctas as u32, 1, 1]
}

impl BuiltFor {
    /// u32 words of what the classifier writes.
    pub(crate) fn words(&self) -> usize {
        layout_words(self.dims, self.layout)
    }

    /// Whether a mask built for `self` serves a launch that needs `want`: the same module,
    /// tiling, shapes, aux tensors (by address) and param values; a typed error naming the
    /// first difference otherwise.
    pub(crate) fn check_serves(&self, want: &BuiltFor) -> Result<(), RuntimeError> {
        let mismatch = |what: &str, have: String, want: String| {
            Err(RuntimeError::BlockMask(format!("the block mask was built for {what} {have}, this launch has {want}")))
        };
        if self.module_key != want.module_key {
            return mismatch("the module", self.module_key.clone(), want.module_key.clone());
        }
        if self.tiling != want.tiling || self.layout != want.layout {
            return mismatch(
                "tiles",
                format!("{:?} {:?}", self.tiling, self.layout),
                format!("{:?} {:?}", want.tiling, want.layout),
            );
        }
        if self.dims != want.dims || self.seqlens != want.seqlens {
            return mismatch(
                "shapes",
                format!("{:?} {:?}", self.dims, self.seqlens),
                format!("{:?} {:?}", want.dims, want.seqlens),
            );
        }
        if self.aux != want.aux {
            return mismatch("aux tensors", format!("{:?}", self.aux), format!("{:?}", want.aux));
        }
        if self.params != want.params {
            return mismatch("params", format!("{:?}", self.params), format!("{:?}", want.params));
        }
        Ok(())
    }
}

impl BlockMask {
    pub fn layout(&self) -> BlockLayout {
        self.built_for.layout
    }

    pub fn tiling(&self) -> Tiling {
        self.built_for.tiling
    }
    pub fn dims(&self) -> BlockDims {
        self.built_for.dims
    }
    pub fn classify_ms(&self) -> Option<f64> {
        self.classify_ms
    }

    /// Non-empty key tiles over the key tiles inside the sequences, from the downloaded
    /// lists ([`crate::Kernel::block_mask_lists`]); `group` is the rows per position.
    pub fn live_fraction_of(&self, lists: &[u32], group: usize) -> f64 {
        let b = &self.built_for;
        let d = b.dims;
        let t = b.tiling;
        let (mut live, mut total) = (0u64, 0u64);
        for (batch, &(sq, sk)) in b.seqlens.iter().enumerate() {
            let mt = (sq * group).div_ceil(t.block_m as usize);
            let nt = sk.div_ceil(t.block_n as usize) as u64;
            for slot in 0..d.slots {
                for m in 0..mt {
                    let row = (batch * d.slots + slot) * d.m_tiles + m;
                    live += match b.layout {
                        BlockLayout::RowLists | BlockLayout::RowListsWithBits => {
                            u64::from(lists.get(row * d.row_words()).copied().unwrap_or(0))
                        }
                        BlockLayout::Dense | BlockLayout::DenseWithBits => (0..nt as usize)
                            .filter(|&n| lists.get(row * d.n_tiles + n).is_some_and(|&c| c & 0xff != 0))
                            .count() as u64,
                    };
                    total += nt;
                }
            }
        }
        if total == 0 {
            0.0
        } else {
            live as f64 / total as f64
        }
    }

    /// A mask over `lists` (written by the classifier launched next), built for `built_for`.
    pub(crate) fn new(built_for: BuiltFor, lists: Tensor) -> BlockMask {
        BlockMask {
            built_for,
            lists,
            classify_ms: None,
            backward: Mutex::default(),
            id: NEXT_MASK_ID.fetch_add(1, Ordering::Relaxed),
        }
    }

    pub(crate) fn args(&self) -> [(&'static str, ArgValue); 6] {
        list_args(self.lists.device_ptr(), self.built_for.dims, self.built_for.layout)
    }

    pub(crate) fn usage(&self, source: BlockMaskSource) -> BlockMaskUse {
        BlockMaskUse {
            source,
            block_m: self.built_for.tiling.block_m,
            block_n: self.built_for.tiling.block_n,
            live_fraction: None,
            classify_ms: self.classify_ms,
        }
    }
}

/// The per-batch lengths of a launch, from its plan's arguments (varlen: cu_seqlens).
pub(crate) fn launch_seqlens(
    plan: &LaunchPlan,
    cu_seqlens_q: Option<&IndexTensor>,
    cu_seqlens_k: Option<&IndexTensor>,
    seqused_k: Option<&IndexTensor>,
) -> Vec<(usize, usize)> {
    let diff = |cu: &[i32], i: usize| (cu[i + 1] - cu[i]).max(0) as usize;
    match (cu_seqlens_q, cu_seqlens_k, seqused_k) {
        (Some(cq), Some(ck), _) => (0..plan.batch).map(|i| (diff(cq.host(), i), diff(ck.host(), i))).collect(),
        (_, _, Some(su)) => (0..plan.batch).map(|i| (plan.max_seqlen_q, su.host()[i].max(0) as usize)).collect(),
        _ => vec![(plan.max_seqlen_q, plan.max_seqlen_k); plan.batch],
    }
}

/// Whether a list entry marks a full tile (for tests and tools reading the lists).
pub fn entry_is_full(entry: u32) -> bool {
    entry & FULL_TILE != 0
}

/// The u32 words of bitmask slot `slot` (1-based, as entries hold it) of list row `row`
/// in a downloaded mask (`Kernel::block_mask_lists`), or `None` past its end.
pub fn tile_bits(words: &[u32], d: BlockDims, layout: BlockLayout, row: usize, slot: usize) -> Option<&[u32]> {
    let start = bits_offset_words(d, layout) + (row * d.bits_per_row + slot.checked_sub(1)?) * d.tile_words;
    words.get(start..start + d.tile_words)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims(batch: usize, m_tiles: usize, n_tiles: usize, tile_words: usize) -> BlockDims {
        BlockDims { batch, slots: 1, m_tiles, n_tiles, bits_per_row: 0, tile_words }
    }

    /// Slots only for layouts with bits: one per key tile of a row while the budget
    /// holds, fewer past it, none when tile indices would not fit an entry.
    #[test]
    fn bit_slots_follow_the_layout_and_the_budget() {
        let d = dims(4, 64, 64, 512);
        assert_eq!(with_bit_slots(d, BlockLayout::RowLists).bits_per_row, 0);
        assert_eq!(with_bit_slots(d, BlockLayout::Dense).bits_per_row, 0);
        assert_eq!(with_bit_slots(d, BlockLayout::RowListsWithBits).bits_per_row, 64);
        assert_eq!(with_bit_slots(d, BlockLayout::DenseWithBits).bits_per_row, 64);
        // 32k × batch 16: 4096 rows of 512-word tiles, four slots fit 32 MB.
        let big = with_bit_slots(dims(16, 256, 256, 512), BlockLayout::RowListsWithBits);
        assert_eq!(big.bits_per_row, 4);
        assert!(big.bits_words() <= BITS_BUDGET_WORDS);
        let too_many_tiles = dims(1, 1, attnc_ir::block_mask::TILE_INDEX_MASK as usize + 2, 512);
        assert_eq!(with_bit_slots(too_many_tiles, BlockLayout::RowListsWithBits).bits_per_row, 0);
    }

    /// The bits start 16-byte aligned after the lists (or classes), the kernels get their
    /// address only where there are slots, a slot's words are where the kernels
    /// (`BlockListArgs::bits_addr`) look for them, and the bit-work queue follows, with
    /// an item per slot.
    #[test]
    fn bits_sit_after_the_lists_aligned() {
        let d = with_bit_slots(dims(2, 3, 5, 256), BlockLayout::RowListsWithBits);
        let lists = d.list_words();
        assert_eq!(lists, 2 * 3 * 6);
        let offset = bits_offset_words(d, BlockLayout::RowListsWithBits);
        assert!(offset >= lists && offset % 4 == 0 && offset - lists < 4);
        let queue = offset + 2 * 3 * 5 * 256;
        assert_eq!(layout_words(d, BlockLayout::RowListsWithBits), queue + 4 + 2 * (2 * 3 * 5));
        let (arg, count_at) = queue_arg(1 << 20, d, BlockLayout::RowListsWithBits).expect("a queue with bits");
        assert!(matches!(arg.1, ArgValue::Ptr(p) if p == count_at && p == (1 << 20) + 4 * queue as u64));
        assert!(queue_arg(1 << 20, d, BlockLayout::RowLists).is_none());
        let args = list_args(1 << 20, d, BlockLayout::RowListsWithBits);
        assert!(matches!(args[4].1, ArgValue::Ptr(p) if p == (1 << 20) + 4 * offset as u64));
        assert!(matches!(args[5].1, ArgValue::I32(5)));
        let plain = list_args(1 << 20, d.with_bits(0), BlockLayout::RowLists);
        assert!(matches!(plain[4].1, ArgValue::Ptr(0)));
        let dense = with_bit_slots(dims(2, 3, 5, 256), BlockLayout::DenseWithBits);
        assert_eq!(bits_offset_words(dense, BlockLayout::DenseWithBits), (2 * 3 * 5usize).div_ceil(4) * 4);
        // Row 4, slot 2 (1-based): the 4 · 5 + 1 = 21st tile of bits.
        let words: Vec<u32> = (0..layout_words(d, BlockLayout::RowListsWithBits) as u32).collect();
        let tile = tile_bits(&words, d, BlockLayout::RowListsWithBits, 4, 2).expect("inside");
        assert_eq!(tile[0] as usize, offset + 21 * 256);
        assert!(tile_bits(&words, d, BlockLayout::RowListsWithBits, 4, 0).is_none());
    }

    /// The bits kernel's grid covers the work up to its cap per SM, and is empty without
    /// slots.
    #[test]
    fn bits_grid_follows_the_work() {
        let t = Tiling { block_m: 128, block_n: 128, pack_gqa: false };
        let d = with_bit_slots(dims(4, 64, 64, 512), BlockLayout::RowListsWithBits);
        assert_eq!(bits_grid(d, t, BlockLayout::RowListsWithBits, 132), [132 * 8, 1, 1]);
        // One row of two slots: 2 tiles × 16 steps of 8 bit rows, 4 warps a CTA.
        let small = dims(1, 1, 2, 512).with_bits(2);
        assert_eq!(bits_grid(small, t, BlockLayout::RowListsWithBits, 132), [8, 1, 1]);
        assert_eq!(bits_grid(d.with_bits(0), t, BlockLayout::RowListsWithBits, 132), [0, 0, 0]);
        assert_eq!(bits_grid(d, t, BlockLayout::RowLists, 132), [0, 0, 0]);
    }
}
