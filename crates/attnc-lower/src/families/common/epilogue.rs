//! The end of a forward row held in mma.sync / wgmma accumulator fragments, shared by
//! the families whose consumers own rows that way (portable, hopper): a row is spread
//! over the 4 lanes of a quad, lane `quad_col` holding columns `8·i + 2·quad_col` and
//! `+ 1` of each 8-column group `i`. [`finish_row`] closes the online softmax (row sum
//! over the quad, the sink, the normalization and the LSE); [`RowStore`] writes the
//! row: O in the element type and the LSE, or a split's f32 partials and LSE in the
//! combine kernel's workspace (`variant::layout::partial_row`).

use super::abi::Args;
use crate::llvm::kb::{Kb, R};
use crate::variant::layout::{lse_offset, partial_row, q_row_offset, BatchView};
use crate::variant::softmax::{finalize_row, sink_log2};
use attnc_ir::Spec;
use inkwell::values::{FloatValue, IntValue};
use inkwell::IntPredicate;

/// Gives a lane's two normalized values of 8-column group `i` of its row.
pub type ColVals<'a, 'ctx> = &'a dyn Fn(&Kb<'ctx>, u32) -> R<(FloatValue<'ctx>, FloatValue<'ctx>)>;
/// Gives (split index, batch size) for the split partials' row index.
pub type SplitOf<'a, 'ctx> = &'a dyn Fn(&Kb<'ctx>) -> R<(IntValue<'ctx>, IntValue<'ctx>)>;

/// One accumulator row of a thread: its query position, head and whether it exists
/// (rows past the end of the sequence are computed but never stored).
#[derive(Clone, Copy, Debug)]
pub struct FragRow<'ctx> {
    /// Query position within the sequence.
    pub q: IntValue<'ctx>,
    pub h: IntValue<'ctx>,
    pub valid: IntValue<'ctx>,
}

/// The factor that normalizes a finished row of O and its natural-log LSE, from the
/// thread's partial row sum `l` (reduced here over the quad), the row max `m` (log2
/// units) and, with sinks, head `h`'s sink logit — left out of a split's partial
/// (`is_split`), whose combine adds it once.
pub fn finish_row<'ctx>(
    kb: &Kb<'ctx>,
    spec: &Spec,
    args: &Args<'ctx>,
    l: FloatValue<'ctx>,
    m: FloatValue<'ctx>,
    h: IntValue<'ctx>,
    is_split: IntValue<'ctx>,
) -> R<(FloatValue<'ctx>, FloatValue<'ctx>)> {
    let l = kb.fadd(l, kb.shfl_xor_f32(l, 1, "")?, "")?;
    let l = kb.fadd(l, kb.shfl_xor_f32(l, 2, "")?, "l_total")?;
    let sink_log2 = if spec.sinks { Some(sink_log2(kb, args.int("sinks")?, h, Some(is_split))?) } else { None };
    finalize_row(kb, l, m, sink_log2)
}

/// Where a CTA's finished rows go.
pub struct RowStore<'a, 'ctx> {
    pub spec: &'a Spec,
    pub args: &'a Args<'ctx>,
    pub bv: &'a BatchView<'ctx>,
    /// The launch's (padded) seqlen_q, the row stride of the split workspace.
    pub max_seqlen_q: IntValue<'ctx>,
    /// Whether this launch writes split partials (num_splits > 1) instead of O.
    pub is_split: IntValue<'ctx>,
}

impl<'ctx> RowStore<'_, 'ctx> {
    /// Stores `row` of the calling lane (`quad_col` = lane % 4) when it is valid.
    /// `cols(kb, i)` gives the lane's two normalized values of 8-column group `i`; it is
    /// called where the value is stored (once per branch), so a family can emit the
    /// normalization there or hand out values computed before. `split(kb)` gives
    /// (split index, batch size) for the partials' row index.
    pub fn store(
        &self,
        kb: &mut Kb<'ctx>,
        row: FragRow<'ctx>,
        quad_col: IntValue<'ctx>,
        lse: FloatValue<'ctx>,
        cols: ColVals<'_, 'ctx>,
        split: SplitOf<'_, 'ctx>,
    ) -> R<()> {
        kb.if_then(row.valid, "row_store", |kb| {
            kb.if_else(
                self.is_split,
                "store_partial",
                |kb| self.store_partial(kb, row, quad_col, lse, cols, split),
                |kb| self.store_final(kb, row, quad_col, lse, cols),
            )
        })
    }

    /// Final O in the element type, and the LSE when the spec asks for it.
    fn store_final(
        &self,
        kb: &mut Kb<'ctx>,
        row: FragRow<'ctx>,
        quad_col: IntValue<'ctx>,
        lse: FloatValue<'ctx>,
        cols: ColVals<'_, 'ctx>,
    ) -> R<()> {
        let spec = self.spec;
        let o_st = self.args.strides("o")?;
        let off = q_row_offset(kb, self.bv, &o_st, row.q, row.h)?;
        let row_addr = kb.add(self.args.int("o")?, kb.mul(off, kb.i64c(2), "")?, "o_row")?;
        for i in 0..spec.head_dim_v / 8 {
            let (x0, x1) = cols(kb, i)?;
            let packed = kb.pack_half2(spec.dtype, x0, x1, "o_pair")?;
            let col = kb.add(kb.mul(quad_col, kb.i32c(2), "")?, kb.i32c(i as i64 * 8), "")?;
            let addr = kb.add(row_addr, kb.mul(kb.zext64(col, "")?, kb.i64c(2), "")?, "")?;
            kb.st_global_b32(addr, packed)?;
        }
        if spec.lse {
            let first_lane = kb.icmp(IntPredicate::EQ, quad_col, kb.i32c(0), "")?;
            kb.if_then(first_lane, "store_lse", |kb| {
                let (sb, sh) = (self.args.int("lse_stride_batch")?, self.args.int("lse_stride_head")?);
                let off = lse_offset(kb, self.bv, sb, sh, row.h, row.q)?;
                let addr = kb.add(self.args.int("lse")?, kb.mul(off, kb.i64c(4), "")?, "")?;
                kb.st_global_f32(addr, lse)
            })?;
        }
        Ok(())
    }

    /// Split-KV partials: O normalized by this split's sum (f32) and its LSE, in the
    /// workspace `[split, batch, q_heads, max_seqlen_q, d_v]` / `[split, batch, q_heads,
    /// max_seqlen_q]`.
    fn store_partial(
        &self,
        kb: &mut Kb<'ctx>,
        row: FragRow<'ctx>,
        quad_col: IntValue<'ctx>,
        lse: FloatValue<'ctx>,
        cols: ColVals<'_, 'ctx>,
        split: SplitOf<'_, 'ctx>,
    ) -> R<()> {
        let spec = self.spec;
        let (split, batch) = split(kb)?;
        let idx = partial_row(kb, split, batch, self.bv.b, spec.q_heads, row.h, self.max_seqlen_q, row.q)?;
        let o_part = self.args.int("o_partial")?;
        let row_addr = kb.add(o_part, kb.mul(idx, kb.i64c(4 * spec.head_dim_v as i64), "")?, "")?;
        for i in 0..spec.head_dim_v / 8 {
            let (x0, x1) = cols(kb, i)?;
            let col = kb.add(kb.mul(quad_col, kb.i32c(2), "")?, kb.i32c(i as i64 * 8), "")?;
            let addr = kb.add(row_addr, kb.mul(kb.zext64(col, "")?, kb.i64c(4), "")?, "")?;
            kb.st_global_v2_f32(addr, x0, x1)?;
        }
        let first_lane = kb.icmp(IntPredicate::EQ, quad_col, kb.i32c(0), "")?;
        let lse_part = self.args.int("lse_partial")?;
        kb.if_then(first_lane, "store_lse_partial", |kb| {
            let addr = kb.add(lse_part, kb.mul(idx, kb.i64c(4), "")?, "")?;
            kb.st_global_f32(addr, lse)
        })
    }
}
