//! Persistent tile scheduling (blackwell's forward; hopper's with `Config::persistent`).
//! The grid has `min(SMs, tiles)` CTAs; CTA c processes work tiles c, c + gridDim.x, ...
//! Each work tile is (m block of the family's query rows, head, batch entry). Every role
//! of the CTA evaluates the same mapping, so they agree on the tile without communicating.
//!
//! - Split-KV multiplies the work tiles by the number of splits; the split is the
//!   fastest coordinate (`t % num_splits`), so one m block's splits run side by side.
//! - Plain order (no causal mask): m fastest, then head, then batch — CTAs running at the
//!   same time share a head's K/V in L2.
//! - LPT order (causal): longest-processing-time first. Heads are cut into sections
//!   whose K and V fit in [`L2_SECTION_BYTES`]; within a section the m blocks run from
//!   the last (most keys under a causal mask) to the first, each m block for all heads of
//!   the section before the next. Static striding over that order approximates LPT
//!   list scheduling.

use crate::llvm::kb::{Kb, R};
use inkwell::values::IntValue;

/// K+V bytes of a section of heads that should stay in L2 together (FlashAttention's
/// scheduler uses the same 32 MiB; B200 has 126 MB of L2).
pub const L2_SECTION_BYTES: i64 = 32 << 20;

/// Heads per LPT section for a launch (`max(1, min(heads, L2 / (seqlen_k·(d_qk+d_v)·2)))`).
pub fn section_heads(seqlen_k: i64, d_qk: u32, d_v: u32, heads: u32) -> u32 {
    let per_head = (seqlen_k.max(1)) * (d_qk + d_v) as i64 * 2;
    (L2_SECTION_BYTES / per_head).clamp(1, heads.max(1) as i64) as u32
}

/// CPU model of the mapping: work tile `t` → (m block, head, batch).
pub fn tile_coords(t: u32, num_m: u32, heads: u32, lpt: bool, section: u32) -> (u32, u32, u32) {
    let per_b = num_m * heads;
    let (b, r) = (t / per_b, t % per_b);
    if lpt {
        let sec_size = section * num_m;
        let (sec, within) = (r / sec_size, r % sec_size);
        let h0 = sec * section;
        let nh = section.min(heads - h0);
        let (m_rev, h) = (within / nh, h0 + within % nh);
        (num_m - 1 - m_rev, h, b)
    } else {
        (r % num_m, r / num_m, b)
    }
}

/// The work tile of one persistent iteration.
#[derive(Clone, Copy)]
pub struct WorkTile<'ctx> {
    pub m: IntValue<'ctx>,
    pub h: IntValue<'ctx>,
    pub b: IntValue<'ctx>,
    /// Query rows of the tile's sequence: seqlen_q, or seqlen_q · G with pack_gqa (row r
    /// is query r / G of head hkv·G + r % G; `h` is then the KV head).
    pub rows: IntValue<'ctx>,
    /// The tile's sequence lengths (this batch entry's with varlen).
    pub seqlen_q: IntValue<'ctx>,
    pub seqlen_k: IntValue<'ctx>,
    /// Varlen: packed row of the sequence's first query / key (0 otherwise).
    pub q_start: IntValue<'ctx>,
    pub k_start: IntValue<'ctx>,
    /// The batch coordinate of the tensor maps (`b`, or 0 with varlen's packed rows).
    pub tma_b: IntValue<'ctx>,
    /// Split-KV: which share of the key tiles this work tile owns (0 without splits).
    pub split: IntValue<'ctx>,
}

/// Emits [`tile_coords`]; `section` is the runtime section size in heads (LPT only).
pub fn emit_tile_coords<'ctx>(
    kb: &Kb<'ctx>,
    t: IntValue<'ctx>,
    num_m: IntValue<'ctx>,
    heads: u32,
    lpt: bool,
    section: IntValue<'ctx>,
    seqlen_q: IntValue<'ctx>,
    seqlen_k: IntValue<'ctx>,
) -> R<WorkTile<'ctx>> {
    let (m, h, b) = if lpt {
        // The last m block has the most keys under a causal mask: it goes first.
        let (rank, h, b) = emit_lpt_place(kb, t, num_m, heads, section)?;
        (kb.sub(kb.sub(num_m, kb.i32c(1), "")?, rank, "tile_m")?, h, b)
    } else {
        let per_b = kb.mul(num_m, kb.i32c(heads as i64), "tiles_per_batch")?;
        let b = kb.udiv(t, per_b, "tile_b")?;
        let r = kb.urem(t, per_b, "")?;
        (kb.urem(r, num_m, "tile_m")?, kb.udiv(r, num_m, "tile_h")?, b)
    };
    Ok(WorkTile {
        m,
        h,
        b,
        rows: seqlen_q,
        seqlen_q,
        seqlen_k,
        q_start: kb.i32c(0),
        k_start: kb.i32c(0),
        tma_b: b,
        split: kb.i32c(0),
    })
}

/// The LPT place of work item `t` of a grid of `cols` tiles × `heads` × batch entries:
/// `(rank, head, batch entry)`, where heads go in sections of `section`, and within a
/// section rank 0 of every head comes first, then rank 1, … The caller maps the rank to
/// its tile (the forward's longest m block is the last; the backward's longest key tile
/// the first). A bijection for any section size ≥ 1.
pub fn emit_lpt_place<'ctx>(
    kb: &Kb<'ctx>,
    t: IntValue<'ctx>,
    cols: IntValue<'ctx>,
    heads: u32,
    section: IntValue<'ctx>,
) -> R<(IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>)> {
    let hc = kb.i32c(heads as i64);
    let per_b = kb.mul(cols, hc, "tiles_per_batch")?;
    let b = kb.udiv(t, per_b, "tile_b")?;
    let r = kb.urem(t, per_b, "")?;
    let sec_size = kb.mul(section, cols, "")?;
    let sec = kb.udiv(r, sec_size, "")?;
    let within = kb.urem(r, sec_size, "")?;
    let h0 = kb.mul(sec, section, "")?;
    let nh = kb.smin(section, kb.sub(hc, h0, "")?, "")?;
    let rank = kb.udiv(within, nh, "lpt_rank")?;
    let h = kb.add(h0, kb.urem(within, nh, "")?, "tile_h")?;
    Ok((rank, h, b))
}

/// Emits the heads per section: how many heads' `rows` rows of `bytes_per_row` fit
/// `section_bytes` (normally [`L2_SECTION_BYTES`]), clamped to `1..=heads`. The forward's
/// [`section_heads`] is this with K and V's rows: `seqlen_k` rows of `(d_qk + d_v) · 2`.
pub fn emit_section_heads<'ctx>(
    kb: &Kb<'ctx>,
    rows: IntValue<'ctx>,
    bytes_per_row: i64,
    heads: u32,
    section_bytes: i64,
) -> R<IntValue<'ctx>> {
    let rows = kb.smax(kb.sext64(rows, "")?, kb.i64c(1), "")?;
    let per_head = kb.mul(rows, kb.i64c(bytes_per_row), "")?;
    let n = kb.b.build_int_unsigned_div(kb.i64c(section_bytes), per_head, "")?;
    let n = kb.smin(kb.smax(n, kb.i64c(1), "")?, kb.i64c(heads.max(1) as i64), "")?;
    kb.trunc32(n, "section_heads")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every tile exactly once, for both orders.
    #[test]
    fn mappings_are_bijections() {
        for (num_m, heads, batch) in [(1, 1, 1), (3, 5, 2), (8, 32, 1), (7, 12, 3)] {
            for lpt in [false, true] {
                for section in [1, 2, 4, 32] {
                    let mut seen = std::collections::HashSet::new();
                    for t in 0..num_m * heads * batch {
                        let c = tile_coords(t, num_m, heads, lpt, section.min(heads));
                        assert!(c.0 < num_m && c.1 < heads && c.2 < batch, "{c:?}");
                        assert!(seen.insert(c), "{c:?} twice");
                    }
                }
            }
        }
    }

    #[test]
    fn lpt_runs_the_longest_m_blocks_first_within_a_section() {
        // 4 m blocks, 4 heads, sections of 2 heads.
        let order: Vec<_> = (0..16).map(|t| tile_coords(t, 4, 4, true, 2)).collect();
        assert_eq!(&order[..4], &[(3, 0, 0), (3, 1, 0), (2, 0, 0), (2, 1, 0)]);
        assert_eq!(order[8], (3, 2, 0));
    }

    #[test]
    fn section_size_follows_l2() {
        // 8k keys, d 128: 8192·256·2 = 4 MiB per head → 8 heads per 32 MiB.
        assert_eq!(section_heads(8192, 128, 128, 32), 8);
        assert_eq!(section_heads(1 << 20, 128, 128, 32), 1);
        assert_eq!(section_heads(16, 64, 64, 4), 4);
    }
}
