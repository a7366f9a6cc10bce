//! A partial tile's mask as bit words, computed or loaded while `S = Q·Kᵀ` is in flight:
//! evaluated per element, or the classifier's bits (`BlockLayout::RowListsWithBits`).

use super::{Cta, Kernel, Masking, ROWS_PER_CONSUMER};
use crate::llvm::kb::{Kb, Slot, R};
use crate::variant::expr as vexpr;
use crate::variant::row_keys::{range_word, RowKeys};
use crate::variant::tiles::RowList;
use inkwell::values::IntValue;
use inkwell::IntPredicate;

impl<'ctx> Kernel<'_, 'ctx> {
    /// The mask of a partial tile as bit words (the bit [`Kernel::mask_bit_of`] gives S
    /// fragment element `idx` set where it is allowed), emitted while `S = Q·Kᵀ` is in
    /// flight (`Config::mask_bits`): loaded from the classifier's bits where the tile has a
    /// slot (`bits_slot` ≠ 0), evaluated otherwise; all ones on a tile `masked` says is
    /// full, where nothing reads them. `None` when the configuration applies the mask
    /// after S instead.
    pub(super) fn mask_bits(
        &self,
        kb: &mut Kb<'ctx>,
        cta: &Cta<'ctx>,
        masked: Masking<'ctx>,
        t: IntValue<'ctx>,
        bits_slot: IntValue<'ctx>,
        ltid: IntValue<'ctx>,
        consumer: IntValue<'ctx>,
    ) -> R<Option<Vec<IntValue<'ctx>>>> {
        if !self.cfg.mask_bits || self.cfg.diag_no_softmax || matches!(masked, Masking::None) {
            return Ok(None);
        }
        // Two rows (the fragment's halves) of block_n / 32 words, relative to the lane's
        // first column: [`Kernel::mask_bit_of`].
        let words = (2 * self.cfg.block_n.div_ceil(32)) as usize;
        let spec = self.spec;
        let cfg = self.cfg;
        let compute = |kb: &mut Kb<'ctx>| -> R<Vec<IntValue<'ctx>>> {
            kb.section("mask (partial tile): one bit per element, under S = Q.K^T")?;
            let ltid = kb.opaque_i32(ltid, "ltid_mask")?;
            let rows = self.thread_rows(kb, cta, ltid, consumer)?;
            let n0 = kb.mul(t, kb.i32c(cfg.block_n as i64), "n0")?;
            let quad_col = kb.and(ltid, kb.i32c(3), "")?;
            let col_base = kb.add(n0, kb.mul(quad_col, kb.i32c(2), "")?, "")?;
            // A causal bound and/or a window: each row's keys are one interval, each word
            // one bit range (`variant::row_keys`).
            if let Some(keys) = RowKeys::of(spec) {
                let words_per_row = cfg.block_n.div_ceil(32);
                let mut acc = Vec::with_capacity(words);
                for row in rows {
                    let (lo, hi) = keys.emit(kb, row.q, cta.bv.seqlen_q, cta.bv.seqlen_k)?;
                    for w in 0..words_per_row {
                        let base = kb.add(col_base, kb.i32c(32 * w as i64), "word_col")?;
                        acc.push(range_word(kb, base, lo, hi)?);
                    }
                }
                return Ok(acc);
            }
            let predicate = spec.mask.to_predicate();
            let mut acc = vec![kb.i32c(0); words];
            for idx in 0..(cfg.block_n / 2) as usize {
                let (i, e) = (idx / 4, idx % 4);
                let row = rows[e / 2];
                let col = kb.add(col_base, kb.i32c((8 * i + e % 2) as i64), "k_pos")?;
                let vars = cta.bv.elem_vars(cta.hkv, row.q, row.h, col);
                let allowed = vexpr::allowed(kb, spec, predicate.as_ref(), &vars, &cta.va)?;
                let (word, bit) = self.mask_bit_of(idx);
                let bit = kb.shl(kb.zext32(allowed, "")?, kb.i32c(bit as i64), "")?;
                acc[word] = kb.or(acc[word], bit, "mask_word")?;
            }
            Ok(acc)
        };
        match masked {
            Masking::None => Ok(None),
            Masking::Always => compute(kb).map(Some),
            Masking::Unless(unmasked) => {
                let slots: Vec<Slot<'ctx>> =
                    (0..words).map(|w| kb.slot_i32(&format!("mask_word{w}"), kb.i32c(-1))).collect::<R<_>>()?;
                let partial = kb.not(unmasked, "partial_tile")?;
                let evaluate = |kb: &mut Kb<'ctx>| -> R<()> {
                    for (slot, w) in slots.iter().zip(compute(kb)?) {
                        kb.set(*slot, w)?;
                    }
                    Ok(())
                };
                match &cta.list {
                    // The classifier wrote this tile's bits: two rows of block_n / 32
                    // words per thread, gathered into the fragment's order.
                    Some(list) if self.cfg.mask_bits => {
                        let has_bits = kb.icmp(IntPredicate::NE, bits_slot, kb.i32c(0), "has_bits")?;
                        kb.if_then(partial, "mask_bits", |kb| {
                            kb.if_else(
                                has_bits,
                                "tile_bits",
                                |kb| {
                                    for (slot, w) in
                                        slots.iter().zip(self.load_tile_bits(kb, list, bits_slot, ltid, consumer)?)
                                    {
                                        kb.set(*slot, w)?;
                                    }
                                    Ok(())
                                },
                                |kb| evaluate(kb),
                            )
                        })?;
                    }
                    _ => kb.if_then(partial, "mask_bits", evaluate)?,
                }
                slots.iter().map(|sl| kb.get_i(*sl, "mask_word")).collect::<R<_>>().map(Some)
            }
        }
    }

    /// A partial tile's mask bits as the classifier wrote them (`BlockLayout::
    /// RowListsWithBits`), in the layout [`Kernel::mask_bits`] returns
    /// ([`Kernel::mask_bit_of`]): the thread's two rows as `block_n / 32` words each
    /// (vector loads), shifted down by the lane's first column, so each element's bit is
    /// a constant position.
    fn load_tile_bits(
        &self,
        kb: &mut Kb<'ctx>,
        list: &RowList<'ctx>,
        bits_slot: IntValue<'ctx>,
        ltid: IntValue<'ctx>,
        consumer: IntValue<'ctx>,
    ) -> R<Vec<IntValue<'ctx>>> {
        let cfg = self.cfg;
        kb.section("mask (partial tile): the classifier's bits")?;
        let words_per_row = cfg.block_n.div_ceil(32);
        let tile_words = cfg.block_m() * words_per_row;
        let base = list.bits_addr(kb, bits_slot, tile_words)?;
        let lane = kb.and(ltid, kb.i32c(31), "")?;
        let warp = kb.udiv(ltid, kb.i32c(32), "")?;
        let local_row = kb.add(
            kb.add(kb.mul(consumer, kb.i32c(ROWS_PER_CONSUMER as i64), "")?, kb.mul(warp, kb.i32c(16), "")?, "")?,
            kb.udiv(lane, kb.i32c(4), "")?,
            "bits_row",
        )?;
        let shift = kb.mul(kb.and(lane, kb.i32c(3), "")?, kb.i32c(2), "bits_shift")?;
        let mut rows = Vec::new();
        for half in 0..2 {
            let r = kb.add(local_row, kb.i32c(8 * half), "")?;
            let addr =
                kb.add(base, kb.mul(kb.zext64(r, "")?, kb.i64c(4 * words_per_row as i64), "")?, "bits_row_addr")?;
            let words = kb.ld_global_nc_v_b32(addr, words_per_row, "bits")?;
            let words: Vec<IntValue<'ctx>> =
                words.into_iter().map(|w| kb.lshr(w, shift, "bits_lane")).collect::<R<_>>()?;
            rows.push(words);
        }
        Ok(rows.concat())
    }

    /// Where S fragment element `idx` (8-column group `idx / 4`, row half `idx % 4 / 2`,
    /// column `c = 8 (idx / 4) + idx % 2` past the lane's first, `2 (lane % 4)`) has its bit
    /// in the mask words: word `half · block_n / 32 + c / 32`, bit `c % 32` — the tile's
    /// row words shifted down by the lane's first column, so the loaded bits need one
    /// shift per word and the evaluated ones are built the same way.
    pub(super) fn mask_bit_of(&self, idx: usize) -> (usize, u32) {
        let (i, e) = (idx / 4, idx % 4);
        let col = 8 * i + e % 2;
        ((e / 2) * self.cfg.block_n.div_ceil(32) as usize + col / 32, (col % 32) as u32)
    }
}
