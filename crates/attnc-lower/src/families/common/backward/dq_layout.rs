//! The order in which a backward main kernel adds its dQ tiles into `dq_accum` (the
//! convert kernel reads them back the same way): row-major, or the wgmma fragment order
//! of the consumer warpgroups' staging stores, so each store is contiguous.

use crate::llvm::kb::{Kb, R};
use inkwell::values::IntValue;

/// How a main kernel lays out the dQ it adds into `dq_accum` (the convert kernel reads
/// it back the same way).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DqAccumLayout {
    /// Row-major `[rows, d]` per (batch, head): per-element atomics and reductions.
    RowMajor,
    /// Tiles of [`FRAG_TILE_ROWS`] rows × `d` in the order two consumer warpgroups
    /// store their wgmma dQ fragments to a shared staging tile before one bulk
    /// reduce-add of it: store `k`, then thread, then the fragment's column pair
    /// ([`fragment_offset`]). Row-major staging put the 8 rows of a store on the same
    /// banks (8-way conflicts, a quarter of the hopper backward's time at d 128); in
    /// this order each store is 256 contiguous bytes.
    ConsumerFragments,
    /// Tiles of [`FRAG_TILE_ROWS`] rows × `d` each stored by one consumer warpgroup (all
    /// the columns: the hopper row split at d64), in its fragment order: store `k`, then
    /// thread (0..128), then the pair ([`wg_fragment_offset`]).
    WarpgroupFragments,
    /// Tiles of `rows` queries × `d` (128) stored by two consumer warpgroups that compute
    /// dQᵀ = Kᵀ·dSᵀ (the hopper transposed split: each warpgroup 64 of the columns as the
    /// wgmma M, the tile's queries as N — 80 is not a wgmma M): store `k`, then thread
    /// (0..256), then the pair of adjacent *queries* ([`transposed_fragment_offset`]).
    TransposedFragments { rows: u32 },
    /// Tiles of [`FRAG_TILE_ROWS`] rows × 128 stored by two consumer warpgroups that hold
    /// 64 columns each (the column split) and add their halves with a bulk reduce each:
    /// consumer 0's half, then consumer 1's, each in its warpgroup fragment order
    /// ([`consumer_half_offset`]).
    ConsumerHalves,
}

impl DqAccumLayout {
    /// Rows of one fragment tile (the query tile the main kernel stages); 1 for row-major.
    pub fn tile_rows(self) -> u32 {
        match self {
            DqAccumLayout::RowMajor => 1,
            DqAccumLayout::ConsumerFragments | DqAccumLayout::WarpgroupFragments | DqAccumLayout::ConsumerHalves => {
                FRAG_TILE_ROWS
            }
            DqAccumLayout::TransposedFragments { rows } => rows,
        }
    }

    /// The workspace row alignment of a module whose `dq_accum` is in this layout
    /// ([`super::ws_row_align`] of its tile).
    pub fn ws_row_align(self) -> u32 {
        super::ws_row_align(self.tile_rows())
    }

    /// Whether the two columns of a pair (`c`, `c + 1`) are adjacent floats (else the
    /// convert reads them one by one).
    pub fn column_pairs_adjacent(self) -> bool {
        !matches!(self, DqAccumLayout::TransposedFragments { .. })
    }
}

/// Rows of a [`DqAccumLayout::ConsumerFragments`] tile (the wgmma M of a query tile).
pub const FRAG_TILE_ROWS: u32 = 64;
/// Threads that store a [`DqAccumLayout::ConsumerFragments`] tile: two consumer
/// warpgroups, each with `d / 2` of the columns.
pub const FRAG_THREADS: u32 = 256;

/// Float offset, inside its tile, of the column pair a consumer thread stores at store
/// `k` (`k = 2 · i + half` for fragment chunk `i` and row half `half`): stores are the
/// slowest index, then the thread (`consumer · 128 + thread in warpgroup`), then the pair.
pub fn fragment_store_offset(k: u32, thread: u32) -> u32 {
    (k * FRAG_THREADS + thread) * 2
}

/// Float offset inside its tile of element (`r`, `c`) (`c` even or odd; `d` 64 or 128): the
/// inverse of the wgmma m64 accumulator layout — warp `r / 16` of the warpgroup that
/// owns column block `c / (d / 2)`, lane `4 · (r % 8) + (c % 8) / 2`, chunk `(c % (d / 2)) / 8`,
/// row half `(r % 16) / 8`.
pub fn fragment_offset(r: u32, c: u32, d: u32) -> u32 {
    let half_cols = d / 2;
    let (consumer, cc) = (c / half_cols, c % half_cols);
    let lane = 4 * (r % 8) + (cc % 8) / 2;
    let thread = consumer * 128 + 32 * (r / 16) + lane;
    let k = 2 * (cc / 8) + (r % 16) / 8;
    fragment_store_offset(k, thread) + c % 2
}

/// Float offset, inside its tile, of the column pair a warpgroup thread stores at store
/// `k` of a [`DqAccumLayout::WarpgroupFragments`] tile.
pub fn wg_fragment_store_offset(k: u32, thread: u32) -> u32 {
    (k * 128 + thread) * 2
}

/// Float offset inside a [`DqAccumLayout::WarpgroupFragments`] tile of element (`r`, `c`):
/// warp `r / 16`, lane `4 · (r % 8) + (c % 8) / 2`, chunk `c / 8`, row half `(r % 16) / 8`.
pub fn wg_fragment_offset(r: u32, c: u32) -> u32 {
    let thread = 32 * (r / 16) + 4 * (r % 8) + (c % 8) / 2;
    let k = 2 * (c / 8) + (r % 16) / 8;
    wg_fragment_store_offset(k, thread) + c % 2
}

/// Floats of one consumer's half of a [`DqAccumLayout::ConsumerHalves`] tile (64 rows ×
/// 64 columns).
pub const CONSUMER_HALF_FLOATS: u32 = FRAG_TILE_ROWS * 64;

/// Float offset inside a [`DqAccumLayout::ConsumerHalves`] tile (d 128) of element
/// (`r`, `c`): consumer `c / 64`'s half, then [`wg_fragment_offset`] of column `c % 64`.
pub fn consumer_half_offset(r: u32, c: u32) -> u32 {
    (c / 64) * CONSUMER_HALF_FLOATS + wg_fragment_offset(r, c % 64)
}

/// [`consumer_half_offset`] of an even column `c` in LLVM.
pub(super) fn emit_consumer_half_offset<'ctx>(
    kb: &Kb<'ctx>,
    r: IntValue<'ctx>,
    c: IntValue<'ctx>,
) -> R<IntValue<'ctx>> {
    let half = kb.mul(kb.udiv(c, kb.i32c(64), "")?, kb.i32c(CONSUMER_HALF_FLOATS as i64), "half_base")?;
    let within = emit_wg_fragment_offset(kb, r, kb.and(c, kb.i32c(63), "")?)?;
    kb.add(half, within, "half_offset")
}

/// Float offset inside a [`DqAccumLayout::TransposedFragments`] tile (d 128) of element
/// (query `r`, column `c`): the inverse of the m64 accumulator of dQᵀ — consumer `c / 64`,
/// warp `(c % 64) / 16`, lane `4 · (c % 8) + (r % 8) / 2`, chunk `r / 8`, row half
/// `(c % 16) / 8`, and `r % 2` inside the stored pair.
pub fn transposed_fragment_offset(r: u32, c: u32) -> u32 {
    let (consumer, m) = (c / 64, c % 64);
    let thread = consumer * 128 + 32 * (m / 16) + 4 * (m % 8) + (r % 8) / 2;
    let k = 2 * (r / 8) + (m % 16) / 8;
    fragment_store_offset(k, thread) + r % 2
}

/// [`transposed_fragment_offset`] in LLVM.
pub(super) fn emit_transposed_fragment_offset<'ctx>(
    kb: &Kb<'ctx>,
    r: IntValue<'ctx>,
    c: IntValue<'ctx>,
) -> R<IntValue<'ctx>> {
    let m = kb.and(c, kb.i32c(63), "frag_m")?;
    let thread = kb.add(
        kb.add(
            kb.mul(kb.udiv(c, kb.i32c(64), "")?, kb.i32c(128), "")?,
            kb.mul(kb.udiv(m, kb.i32c(16), "")?, kb.i32c(32), "")?,
            "",
        )?,
        kb.add(
            kb.mul(kb.urem(m, kb.i32c(8), "")?, kb.i32c(4), "")?,
            kb.udiv(kb.urem(r, kb.i32c(8), "")?, kb.i32c(2), "")?,
            "",
        )?,
        "frag_thread",
    )?;
    let k = kb.add(
        kb.mul(kb.udiv(r, kb.i32c(8), "")?, kb.i32c(2), "")?,
        kb.udiv(kb.urem(m, kb.i32c(16), "")?, kb.i32c(8), "")?,
        "frag_store",
    )?;
    let pair = kb.mul(kb.add(kb.mul(k, kb.i32c(FRAG_THREADS as i64), "")?, thread, "")?, kb.i32c(2), "")?;
    kb.add(pair, kb.urem(r, kb.i32c(2), "")?, "frag_offset")
}

/// [`wg_fragment_offset`] of an even column `c` in LLVM.
pub(super) fn emit_wg_fragment_offset<'ctx>(kb: &Kb<'ctx>, r: IntValue<'ctx>, c: IntValue<'ctx>) -> R<IntValue<'ctx>> {
    let lane = kb.add(
        kb.mul(kb.urem(r, kb.i32c(8), "")?, kb.i32c(4), "")?,
        kb.udiv(kb.urem(c, kb.i32c(8), "")?, kb.i32c(2), "")?,
        "frag_lane",
    )?;
    let thread = kb.add(kb.mul(kb.udiv(r, kb.i32c(16), "")?, kb.i32c(32), "")?, lane, "frag_thread")?;
    let k = kb.add(
        kb.mul(kb.udiv(c, kb.i32c(8), "")?, kb.i32c(2), "")?,
        kb.udiv(kb.urem(r, kb.i32c(16), "")?, kb.i32c(8), "")?,
        "frag_store",
    )?;
    kb.mul(kb.add(kb.mul(k, kb.i32c(128), "")?, thread, "")?, kb.i32c(2), "frag_offset")
}

/// [`fragment_offset`] of an even column `c` in LLVM (the pair `c`, `c + 1` follows it).
pub(super) fn emit_fragment_offset<'ctx>(
    kb: &Kb<'ctx>,
    r: IntValue<'ctx>,
    c: IntValue<'ctx>,
    d: u32,
) -> R<IntValue<'ctx>> {
    let half_cols = kb.i32c((d / 2) as i64);
    let consumer = kb.udiv(c, half_cols, "frag_consumer")?;
    let cc = kb.urem(c, half_cols, "")?;
    let lane = kb.add(
        kb.mul(kb.urem(r, kb.i32c(8), "")?, kb.i32c(4), "")?,
        kb.udiv(kb.urem(cc, kb.i32c(8), "")?, kb.i32c(2), "")?,
        "frag_lane",
    )?;
    let thread = kb.add(
        kb.add(kb.mul(consumer, kb.i32c(128), "")?, kb.mul(kb.udiv(r, kb.i32c(16), "")?, kb.i32c(32), "")?, "")?,
        lane,
        "frag_thread",
    )?;
    let k = kb.add(
        kb.mul(kb.udiv(cc, kb.i32c(8), "")?, kb.i32c(2), "")?,
        kb.udiv(kb.urem(r, kb.i32c(16), "")?, kb.i32c(8), "")?,
        "frag_store",
    )?;
    kb.mul(kb.add(kb.mul(k, kb.i32c(FRAG_THREADS as i64), "")?, thread, "")?, kb.i32c(2), "frag_offset")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `transposed_fragment_offset` places every element of an 80 × 128 tile once, where
    /// the consumer thread holding it in its dQᵀ fragment stores it: thread `t` of
    /// consumer `c`, chunk `i` (queries 8i..8i+7), row half `h` holds column
    /// `64 c + 16 (t / 32) + (t % 32) / 4 + 8 h` of queries `8 i + 2 (t % 4)` (+1).
    #[test]
    fn transposed_tiles_hold_each_element_once_where_its_thread_stores_it() {
        for rows in [80u32, 64] {
            let mut seen = vec![false; (rows * 128) as usize];
            for consumer in 0..2u32 {
                for t in 0..128u32 {
                    for i in 0..rows / 8 {
                        for half in 0..2u32 {
                            let c = 64 * consumer + 16 * (t / 32) + (t % 32) / 4 + 8 * half;
                            let r = 8 * i + 2 * (t % 4);
                            let at = fragment_store_offset(2 * i + half, 128 * consumer + t);
                            assert_eq!(transposed_fragment_offset(r, c), at, "r {r} c {c}");
                            assert_eq!(transposed_fragment_offset(r + 1, c), at + 1, "r {} c {c}", r + 1);
                            for x in [at, at + 1] {
                                assert!(!seen[x as usize], "offset {x} twice");
                                seen[x as usize] = true;
                            }
                        }
                    }
                }
            }
            assert!(seen.iter().all(|&s| s), "rows {rows}");
        }
        assert_eq!(DqAccumLayout::TransposedFragments { rows: 80 }.ws_row_align(), 160);
        // Consumer halves: each consumer's 64 columns contiguous, every element once.
        let mut seen = vec![false; (FRAG_TILE_ROWS * 128) as usize];
        for r in 0..FRAG_TILE_ROWS {
            for c in 0..128u32 {
                let at = consumer_half_offset(r, c);
                assert_eq!(at / CONSUMER_HALF_FLOATS, c / 64, "r {r} c {c}");
                assert!(!seen[at as usize], "offset {at} twice");
                seen[at as usize] = true;
                if c % 2 == 0 {
                    assert_eq!(consumer_half_offset(r, c + 1), at + 1);
                }
            }
        }
        assert_eq!(DqAccumLayout::ConsumerFragments.ws_row_align(), 128);
    }

    /// `fragment_offset` places every element of a 64 × 128 tile once, and exactly where
    /// the consumer thread that holds it in its wgmma fragment stores it: thread `t` of
    /// consumer `c`, chunk `i`, row half `h` holds rows `16 (t / 32) + (t % 32) / 4 + 8 h`
    /// and columns `64 c + 8 i + 2 (t % 4)` (+1).
    #[test]
    fn fragment_tiles_hold_each_element_once_where_its_thread_stores_it() {
        // d 128: each consumer 64 columns (8 fragment chunks); d 64: 32 columns (4).
        for d in [128u32, 64] {
            let mut seen = vec![false; (FRAG_TILE_ROWS * d) as usize];
            for consumer in 0..2u32 {
                for t in 0..128u32 {
                    for i in 0..d / 16 {
                        for half in 0..2u32 {
                            let r = 16 * (t / 32) + (t % 32) / 4 + 8 * half;
                            let c = d / 2 * consumer + 8 * i + 2 * (t % 4);
                            let at = fragment_store_offset(2 * i + half, 128 * consumer + t);
                            assert_eq!(fragment_offset(r, c, d), at, "d {d} r {r} c {c}");
                            assert_eq!(fragment_offset(r, c + 1, d), at + 1, "d {d} r {r} c {}", c + 1);
                            for x in [at, at + 1] {
                                assert!(!seen[x as usize], "d {d}: offset {x} twice");
                                seen[x as usize] = true;
                            }
                        }
                    }
                }
            }
            assert!(seen.iter().all(|&s| s), "d {d}");
        }
        // One warpgroup per 64-row tile, all d columns (d / 8 fragment chunks).
        for d in [64u32, 128] {
            let mut seen = vec![false; (FRAG_TILE_ROWS * d) as usize];
            for t in 0..128u32 {
                for i in 0..d / 8 {
                    for half in 0..2u32 {
                        let r = 16 * (t / 32) + (t % 32) / 4 + 8 * half;
                        let c = 8 * i + 2 * (t % 4);
                        let at = wg_fragment_store_offset(2 * i + half, t);
                        assert_eq!(wg_fragment_offset(r, c), at, "d {d} r {r} c {c}");
                        assert_eq!(wg_fragment_offset(r, c + 1), at + 1);
                        for x in [at, at + 1] {
                            assert!(!seen[x as usize], "d {d}: offset {x} twice");
                            seen[x as usize] = true;
                        }
                    }
                }
            }
            assert!(seen.iter().all(|&s| s), "d {d}");
        }
        // A warp's store k is 32 threads' consecutive pairs: 256 contiguous bytes.
        assert_eq!(fragment_store_offset(3, 33) - fragment_store_offset(3, 32), 2);
    }
}
