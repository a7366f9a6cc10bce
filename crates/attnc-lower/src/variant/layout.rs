//! Addressing of Q, K, V, O rows for every layout (contiguous, varlen, paged), and the
//! per-batch sequence lengths. All offsets are in elements, i64; strides come from the
//! launch so any row-major view with unit stride in the head dimension works.

use super::expr::ElemVars;
use crate::llvm::kb::{Kb, R};
use attnc_ir::{KvLayout, Spec};
use inkwell::values::IntValue;
use inkwell::IntPredicate;

/// Strides of a `[batch|page, row, head, dim]` tensor, in elements.
#[derive(Clone, Copy, Debug)]
pub struct Strides<'ctx> {
    pub batch: IntValue<'ctx>,
    pub row: IntValue<'ctx>,
    pub head: IntValue<'ctx>,
}

/// The layout-related launch arguments.
#[derive(Clone, Copy, Debug)]
pub struct LayoutArgs<'ctx> {
    /// Max (padded) seqlen_q, and seqlen_k for the contiguous layout.
    pub seqlen_q: IntValue<'ctx>,
    pub seqlen_k: IntValue<'ctx>,
    /// Varlen: `cu_seqlens_q`, `cu_seqlens_k` (i32 arrays of batch + 1).
    pub cu_seqlens_q: Option<IntValue<'ctx>>,
    pub cu_seqlens_k: Option<IntValue<'ctx>>,
    /// Paged: block table (i32 `[batch, max_pages]`) with its row stride, and
    /// `seqused_k` (i32 `[batch]`).
    pub block_table: Option<IntValue<'ctx>>,
    pub block_table_stride: Option<IntValue<'ctx>>,
    pub seqused_k: Option<IntValue<'ctx>>,
}

/// One batch entry's lengths and the row offsets of its first q and k rows.
#[derive(Clone, Copy, Debug)]
pub struct BatchView<'ctx> {
    pub b: IntValue<'ctx>,
    pub seqlen_q: IntValue<'ctx>,
    pub seqlen_k: IntValue<'ctx>,
    /// Varlen: the packed row index of this sequence's first query / key.
    pub q_start: Option<IntValue<'ctx>>,
    pub k_start: Option<IntValue<'ctx>>,
}

fn load_i32_at<'ctx>(kb: &Kb<'ctx>, base: IntValue<'ctx>, idx: IntValue<'ctx>, name: &str) -> R<IntValue<'ctx>> {
    let off = kb.mul(kb.sext64(idx, "")?, kb.i64c(4), "")?;
    kb.ld_global_i32(kb.add(base, off, "")?, name)
}

impl<'ctx> BatchView<'ctx> {
    /// The per-element variables of query `q` (head `h`, KV head `hkv`) against key `k`
    /// of this batch entry, without a score.
    pub fn elem_vars(
        &self,
        hkv: IntValue<'ctx>,
        q: IntValue<'ctx>,
        h: IntValue<'ctx>,
        k: IntValue<'ctx>,
    ) -> ElemVars<'ctx> {
        ElemVars {
            b: self.b,
            h,
            hkv,
            q,
            k,
            seqlen_q: self.seqlen_q,
            seqlen_k: self.seqlen_k,
            score: None,
            k_split: None,
        }
    }
}

/// Reads the lengths of batch entry `b`.
pub fn batch_view<'ctx>(kb: &Kb<'ctx>, spec: &Spec, la: &LayoutArgs<'ctx>, b: IntValue<'ctx>) -> R<BatchView<'ctx>> {
    match spec.kv_layout {
        KvLayout::Contiguous => {
            Ok(BatchView { b, seqlen_q: la.seqlen_q, seqlen_k: la.seqlen_k, q_start: None, k_start: None })
        }
        KvLayout::Varlen => {
            let (Some(cq), Some(ck)) = (la.cu_seqlens_q, la.cu_seqlens_k) else {
                return Err(crate::error::LowerError::Llvm("varlen without cu_seqlens".into()));
            };
            let b1 = kb.add(b, kb.i32c(1), "")?;
            let q0 = load_i32_at(kb, cq, b, "q_start")?;
            let q1 = load_i32_at(kb, cq, b1, "q_end")?;
            let k0 = load_i32_at(kb, ck, b, "k_start")?;
            let k1 = load_i32_at(kb, ck, b1, "k_end")?;
            Ok(BatchView {
                b,
                seqlen_q: kb.sub(q1, q0, "seqlen_q.b")?,
                seqlen_k: kb.sub(k1, k0, "seqlen_k.b")?,
                q_start: Some(q0),
                k_start: Some(k0),
            })
        }
        KvLayout::Paged { .. } => {
            let Some(su) = la.seqused_k else {
                return Err(crate::error::LowerError::Llvm("paged without seqused_k".into()));
            };
            let sk = load_i32_at(kb, su, b, "seqlen_k.b")?;
            Ok(BatchView { b, seqlen_q: la.seqlen_q, seqlen_k: sk, q_start: None, k_start: None })
        }
    }
}

/// Packed row `r` of a Q tile → (query position, head). With pack_gqa the heads of a
/// KV group share a tile: row r is position r / G of head hkv·G + r % G; otherwise the
/// row is the position and the head is the CTA's.
pub fn packed_row<'ctx>(
    kb: &Kb<'ctx>,
    pack: bool,
    group: i64,
    r: IntValue<'ctx>,
    head_idx: IntValue<'ctx>,
    hkv: IntValue<'ctx>,
) -> R<(IntValue<'ctx>, IntValue<'ctx>)> {
    if pack {
        let g = kb.i32c(group);
        let q = kb.udiv(r, g, "q_pos")?;
        let h = kb.add(kb.mul(hkv, g, "")?, kb.urem(r, g, "")?, "head")?;
        Ok((q, h))
    } else {
        Ok((r, head_idx))
    }
}

/// An inclusive run-time range of i32 values.
pub type Inclusive<'ctx> = (IntValue<'ctx>, IntValue<'ctx>);

/// The query positions and heads (inclusive ranges) of a row tile's rows `[row0,
/// last_row]`: with pack_gqa the rows are positions `row0 / G ..= last_row / G` of the KV
/// group's heads; otherwise they are positions of head `head_idx`. What a tile's
/// interval classification is given.
pub fn row_tile_ranges<'ctx>(
    kb: &Kb<'ctx>,
    pack: bool,
    group: i64,
    row0: IntValue<'ctx>,
    last_row: IntValue<'ctx>,
    head_idx: IntValue<'ctx>,
    hkv: IntValue<'ctx>,
) -> R<(Inclusive<'ctx>, Inclusive<'ctx>)> {
    if pack {
        let g = kb.i32c(group);
        let h_lo = kb.mul(hkv, g, "")?;
        Ok(((kb.udiv(row0, g, "")?, kb.udiv(last_row, g, "")?), (h_lo, kb.add(h_lo, kb.i32c(group - 1), "")?)))
    } else {
        Ok(((row0, last_row), (head_idx, head_idx)))
    }
}

/// Element offset of query row `q` (position within the sequence) of head `h` for a
/// Q or O tensor (Q and O share the batch layout: padded or varlen).
pub fn q_row_offset<'ctx>(
    kb: &Kb<'ctx>,
    bv: &BatchView<'ctx>,
    st: &Strides<'ctx>,
    q: IntValue<'ctx>,
    h: IntValue<'ctx>,
) -> R<IntValue<'ctx>> {
    let row = match bv.q_start {
        Some(s) => kb.mul(kb.sext64(kb.add(s, q, "")?, "")?, st.row, "")?,
        None => kb.add(kb.mul(kb.sext64(bv.b, "")?, st.batch, "")?, kb.mul(kb.sext64(q, "")?, st.row, "")?, "")?,
    };
    kb.add(row, kb.mul(kb.sext64(h, "")?, st.head, "")?, "q_row")
}

/// Element offsets of key row `key` (< seqlen_k) of KV head `hkv` in K and in V. For
/// paged KV the block-table entry is read once for both.
pub fn kv_row_offsets<'ctx>(
    kb: &Kb<'ctx>,
    spec: &Spec,
    la: &LayoutArgs<'ctx>,
    bv: &BatchView<'ctx>,
    k_st: &Strides<'ctx>,
    v_st: &Strides<'ctx>,
    key: IntValue<'ctx>,
    hkv: IntValue<'ctx>,
) -> R<(IntValue<'ctx>, IntValue<'ctx>)> {
    match spec.kv_layout {
        KvLayout::Contiguous => {
            let hkv64 = kb.sext64(hkv, "")?;
            let (b, r) = (kb.sext64(bv.b, "")?, kb.sext64(key, "")?);
            kv_offsets_at(kb, k_st, v_st, b, r, hkv64)
        }
        KvLayout::Varlen => {
            let hkv64 = kb.sext64(hkv, "")?;
            let start = bv.k_start.unwrap_or_else(|| kb.i32c(0));
            let r = kb.sext64(kb.add(start, key, "")?, "")?;
            kv_offsets_at(kb, k_st, v_st, kb.i64c(0), r, hkv64)
        }
        KvLayout::Paged { .. } => {
            let page = kv_page_of(kb, spec, la, bv, key)?;
            kv_row_offsets_in_page(kb, spec, k_st, v_st, key, page, hkv)
        }
    }
}

/// The block-table entry (page number) of the page holding key row `key` of paged KV.
/// Separate from [`kv_row_offsets_in_page`] so a producer can issue the reads of
/// several tiles together, ahead of their use, and hide their latency.
pub fn kv_page_of<'ctx>(
    kb: &Kb<'ctx>,
    spec: &Spec,
    la: &LayoutArgs<'ctx>,
    bv: &BatchView<'ctx>,
    key: IntValue<'ctx>,
) -> R<IntValue<'ctx>> {
    let (KvLayout::Paged { page_size }, Some(bt), Some(bts)) = (spec.kv_layout, la.block_table, la.block_table_stride)
    else {
        return Err(crate::error::LowerError::Llvm("a page read without paged KV and its block table".into()));
    };
    let page_idx = kb.udiv(key, kb.i32c(page_size as i64), "page_idx")?;
    let entry = kb.add(kb.mul(kb.sext64(bv.b, "")?, bts, "")?, kb.sext64(page_idx, "")?, "")?;
    kb.ld_global_i32(kb.add(bt, kb.mul(entry, kb.i64c(4), "")?, "")?, "page")
}

/// Element offsets of key row `key` of KV head `hkv` in paged K and V, given the page
/// that holds it ([`kv_page_of`]): the page takes the batch dimension's place.
pub fn kv_row_offsets_in_page<'ctx>(
    kb: &Kb<'ctx>,
    spec: &Spec,
    k_st: &Strides<'ctx>,
    v_st: &Strides<'ctx>,
    key: IntValue<'ctx>,
    page: IntValue<'ctx>,
    hkv: IntValue<'ctx>,
) -> R<(IntValue<'ctx>, IntValue<'ctx>)> {
    let KvLayout::Paged { page_size } = spec.kv_layout else {
        return Err(crate::error::LowerError::Llvm("page offsets without paged KV".into()));
    };
    let hkv64 = kb.sext64(hkv, "")?;
    let in_page = kb.sext64(kb.urem(key, kb.i32c(page_size as i64), "in_page")?, "")?;
    kv_offsets_at(kb, k_st, v_st, kb.sext64(page, "")?, in_page, hkv64)
}

/// `batch_like · batch stride + row · row stride + hkv · head stride` in K and in V
/// (all three i64).
fn kv_offsets_at<'ctx>(
    kb: &Kb<'ctx>,
    k_st: &Strides<'ctx>,
    v_st: &Strides<'ctx>,
    batch_like: IntValue<'ctx>,
    row: IntValue<'ctx>,
    hkv64: IntValue<'ctx>,
) -> R<(IntValue<'ctx>, IntValue<'ctx>)> {
    let at = |st: &Strides<'ctx>| -> R<IntValue<'ctx>> {
        let base = kb.add(kb.mul(batch_like, st.batch, "")?, kb.mul(row, st.row, "")?, "")?;
        kb.add(base, kb.mul(hkv64, st.head, "")?, "")
    };
    Ok((at(k_st)?, at(v_st)?))
}

/// `i < n` as i1.
pub fn in_bounds<'ctx>(kb: &Kb<'ctx>, i: IntValue<'ctx>, n: IntValue<'ctx>) -> R<IntValue<'ctx>> {
    kb.icmp(IntPredicate::SLT, i, n, "in_bounds")
}

/// Element offset of the LSE of query `q`, head `h` in an LSE tensor `[batch, heads,
/// seqlen_q]` (strides `sb`, `sh`, unit row stride), or `[heads, total_q]` with varlen.
pub fn lse_offset<'ctx>(
    kb: &Kb<'ctx>,
    bv: &BatchView<'ctx>,
    sb: IntValue<'ctx>,
    sh: IntValue<'ctx>,
    h: IntValue<'ctx>,
    q: IntValue<'ctx>,
) -> R<IntValue<'ctx>> {
    let h = kb.mul(kb.sext64(h, "")?, sh, "")?;
    match bv.q_start {
        Some(start) => kb.add(h, kb.sext64(kb.add(start, q, "")?, "")?, "lse_off"),
        None => {
            let b = kb.mul(kb.sext64(bv.b, "")?, sb, "")?;
            kb.add(kb.add(b, h, "")?, kb.sext64(q, "")?, "lse_off")
        }
    }
}

/// Row index of (split, batch entry, head, query) in the split-KV workspace
/// `[split, batch, q_heads, max_seqlen_q]` (O partials add a d_v axis): what the
/// combine kernel reads, so every family writing partials must agree on it.
pub fn partial_row<'ctx>(
    kb: &Kb<'ctx>,
    split: IntValue<'ctx>,
    batch: IntValue<'ctx>,
    b: IntValue<'ctx>,
    q_heads: u32,
    h: IntValue<'ctx>,
    max_seqlen_q: IntValue<'ctx>,
    q: IntValue<'ctx>,
) -> R<IntValue<'ctx>> {
    let idx = kb.add(kb.mul(kb.sext64(split, "")?, kb.sext64(batch, "")?, "")?, kb.sext64(b, "")?, "")?;
    let idx = kb.add(kb.mul(idx, kb.i64c(q_heads as i64), "")?, kb.sext64(h, "")?, "")?;
    kb.add(kb.mul(idx, kb.sext64(max_seqlen_q, "")?, "")?, kb.sext64(q, "")?, "partial_row")
}

/// A gather lane's copy of one K/V row into a 128-byte-swizzled tile: the lane's 16-byte
/// chunk (`chunk`, 0..8, already swizzled into `s_row`) of every 64-column box, boxes
/// `box_stride` bytes apart. `bytes` is 16 for a row inside the sequence and 0 past it;
/// columns past `d` also copy 0 bytes (zero fill), from the tensor's `base` so a
/// zero-byte copy still has a valid address. Shared by the warp-specialized families'
/// cp.async gathers (paged K/V whose pages TMA cannot follow).
pub fn cp_async_row_chunks<'ctx>(
    kb: &Kb<'ctx>,
    s_row: IntValue<'ctx>,
    box_stride: u32,
    row_gaddr: IntValue<'ctx>,
    base: IntValue<'ctx>,
    chunk: IntValue<'ctx>,
    d: u32,
    bytes: IntValue<'ctx>,
) -> R<()> {
    const BOX_COLS: u32 = 64;
    for cb in 0..d.div_ceil(BOX_COLS) {
        let col = kb.add(kb.i32c((cb * BOX_COLS) as i64), kb.mul(chunk, kb.i32c(8), "")?, "")?;
        let in_d = kb.icmp(IntPredicate::ULT, col, kb.i32c(d as i64), "")?;
        let n = kb.select_i(in_d, bytes, kb.i32c(0), "")?;
        let g = kb.add(row_gaddr, kb.mul(kb.zext64(col, "")?, kb.i64c(2), "")?, "")?;
        let g = kb.select_i(kb.icmp(IntPredicate::NE, n, kb.i32c(0), "")?, g, base, "")?;
        let s = kb.add(s_row, kb.i32c((cb * box_stride) as i64), "")?;
        kb.cp_async_16(s, g, n)?;
    }
    Ok(())
}
