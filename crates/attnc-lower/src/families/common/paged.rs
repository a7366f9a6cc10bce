//! Paged K/V by TMA: which page sizes TMA boxes can follow, and how a key tile maps onto
//! boxes of the paged cache `[num_pages, page_size, kv_heads, d]` (tensor-map
//! coordinates `{col, row in page, head, page}`). The hopper and blackwell producers
//! share these rules; pages they cannot follow go to a row gather (cp.async).

/// The smallest page TMA loads as its own box: 8 rows of 128 bytes, one 128-byte swizzle
/// atom (a box must land on an atom boundary for the swizzle to match the descriptors).
pub const MIN_PAGE_ROWS: u32 = 8;

/// How a `block_n`-key tile of a paged cache is loaded by TMA.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PagedBoxes {
    /// A page holds whole tiles: one `block_n`-row box inside the tile's page, at row
    /// `key0 % page_size`.
    InsidePage,
    /// A tile holds whole pages: `block_n / page_size` boxes of `page_size` rows, one per
    /// page, stacked in shared memory in page order.
    PerPage { boxes: u32 },
}

impl PagedBoxes {
    /// The boxes for `page_size`-key pages and `block_n`-key tiles, or `None` when TMA
    /// boxes cannot follow the pages (a page that neither holds whole tiles nor divides
    /// a tile into atoms of at least [`MIN_PAGE_ROWS`] rows).
    pub fn of(page_size: u32, block_n: u32) -> Option<PagedBoxes> {
        if page_size == 0 || block_n == 0 {
            return None;
        }
        if page_size >= block_n {
            (page_size % block_n == 0).then_some(PagedBoxes::InsidePage)
        } else {
            (block_n % page_size == 0 && page_size >= MIN_PAGE_ROWS)
                .then_some(PagedBoxes::PerPage { boxes: block_n / page_size })
        }
    }

    /// Boxes per tile (per column block of 64 elements).
    pub fn count(self) -> u32 {
        match self {
            PagedBoxes::InsidePage => 1,
            PagedBoxes::PerPage { boxes } => boxes,
        }
    }

    /// Rows of one box (the tensor map's box height).
    pub fn box_rows(self, block_n: u32) -> u32 {
        block_n / self.count()
    }
}

/// Whether TMA can load paged K/V with `page_size`-key pages in `block_n`-key tiles.
pub fn tma_pageable(page_size: u32, block_n: u32) -> bool {
    PagedBoxes::of(page_size, block_n).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boxes_follow_whole_pages_or_whole_tiles() {
        assert_eq!(PagedBoxes::of(128, 128), Some(PagedBoxes::InsidePage));
        assert_eq!(PagedBoxes::of(256, 64), Some(PagedBoxes::InsidePage));
        assert_eq!(PagedBoxes::of(16, 128), Some(PagedBoxes::PerPage { boxes: 8 }));
        assert_eq!(PagedBoxes::of(16, 64).map(|b| (b.count(), b.box_rows(64))), Some((4, 16)));
        assert_eq!(PagedBoxes::of(8, 64).map(|b| b.box_rows(64)), Some(8));
        // Smaller than a swizzle atom, not dividing a tile, not a multiple of one.
        for (ps, bn) in [(1, 128), (4, 64), (48, 128), (192, 128), (0, 64)] {
            assert_eq!(PagedBoxes::of(ps, bn), None, "page {ps}, tile {bn}");
            assert!(!tma_pageable(ps, bn));
        }
    }
}
