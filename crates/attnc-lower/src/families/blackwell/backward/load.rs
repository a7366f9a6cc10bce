//! The backward's TMA role (warp 13, one thread): one CTA's loads, or one CTA's half of
//! the pair's (its halves of the B operands on the first CTA's barriers).

use super::super::backward_plan::{BwdBar, BLOCK_BYTES, BWD_BLOCK_M, BWD_BLOCK_N};
use super::{Bwd, Cta};
use crate::error::LowerError;
use crate::families::common::backward::{reversed_key_tiles, ws_row, TMA_BOX_COLS};
use crate::llvm::kb::{Kb, Slot, R};
use crate::variant::tiles::walk_key_tiles;
use inkwell::values::IntValue;
use inkwell::IntPredicate;

impl<'a, 'ctx> Bwd<'a, 'ctx> {
    pub(super) fn load(&self, kb: &mut Kb<'ctx>) -> R<()> {
        let cta = self.cta(kb)?;
        let loaded = kb.slot_i32("kv_loaded", kb.i32c(0))?;
        if self.pair() {
            self.load_pair(kb, &cta, loaded)?;
        } else {
            self.load_one(kb, &cta, loaded)?;
        }
        // The last key tile's commits reach this CTA's barriers (the pair's peer's too)
        // before the teardown: none lands on a CTA that has exited.
        let n = kb.get_i(loaded, "kv_loaded")?;
        kb.if_then(kb.icmp(IntPredicate::SGT, n, kb.i32c(0), "")?, "wait_last_kv_empty", |kb| {
            let par = kb.and(kb.sub(n, kb.i32c(1), "")?, kb.i32c(1), "")?;
            self.wait(kb, self.bar(kb, &cta, BwdBar::KvEmpty)?, par)
        })
    }

    /// The 1-CTA loads: K and V per key tile; per query tile Q with its rows (2 stages)
    /// and dO (1 stage). `loaded` counts the key tiles.
    fn load_one(&self, kb: &mut Kb<'ctx>, cta: &Cta<'ctx>, loaded: Slot<'ctx>) -> R<()> {
        let spec = self.spec;
        let l = self.smem;
        kb.section("role: TMA loads (one thread): K, V per key tile; Q + rows, dO per query tile")?;
        let src = cta.tma_sources(kb, spec, &self.name)?;
        let (tmap_q, tmap_k, tmap_v, tmap_do) = (src.q, src.k, src.v, src.d_o);
        let (q_row_base, k_row_base, batch_coord) = (src.q_row, src.k_row, src.batch);
        let (cq, cv) = (spec.head_dim_qk.div_ceil(TMA_BOX_COLS), spec.head_dim_v.div_ceil(TMA_BOX_COLS));
        let pos = kb.slot_i32("load_pos", kb.i32c(0))?;
        walk_key_tiles(kb, cta.n_tiles, reversed_key_tiles(kb, &self.args, true)?, |kb, n, it| {
            kb.section("TMA K, V (once per key tile, after the previous tile's MMAs)")?;
            let later = kb.icmp(IntPredicate::SGT, it, kb.i32c(0), "")?;
            kb.if_then(later, "wait_kv_empty", |kb| {
                let par = kb.and(kb.sub(it, kb.i32c(1), "")?, kb.i32c(1), "")?;
                kb.mbar_wait(self.bar(kb, cta, BwdBar::KvEmpty)?, par)
            })?;
            kb.set(loaded, kb.add(it, kb.i32c(1), "")?)?;
            let full = self.bar(kb, cta, BwdBar::KvFull)?;
            kb.mbar_arrive_expect_tx(full, (cq + cv) * BLOCK_BYTES)?;
            let row = kb.add(k_row_base, kb.mul(n, kb.i32c(BWD_BLOCK_N as i64), "")?, "key_row")?;
            for (tm, base, blocks) in [(tmap_k, l.k, cq), (tmap_v, l.v, cv)] {
                for cb in 0..blocks {
                    let dst = kb.add(cta.smem, kb.i32c((base + cb * BLOCK_BYTES) as i64), "tma_dst")?;
                    kb.tma_load_4d(dst, tm, [kb.i32c((cb * TMA_BOX_COLS) as i64), row, cta.hkv, batch_coord], full)?;
                }
            }
            let qt = self.queries(kb, cta, n)?;
            qt.walk(kb, cta.m_tiles, pos, |kb, p, pos| {
                kb.section("TMA Q + bulk lse_log2, D rows -> stage; TMA dO")?;
                let stage = kb.and(pos, kb.i32c(1), "q_stage")?;
                let free =
                    kb.xor(kb.and(kb.lshr(pos, kb.i32c(1), "")?, kb.i32c(1), "")?, kb.i32c(1), "q_free_parity")?;
                kb.mbar_wait(self.bar_stage(kb, cta, BwdBar::QEmpty, stage)?, free)?;
                let qfull = self.bar_stage(kb, cta, BwdBar::QFull, stage)?;
                kb.mbar_arrive_expect_tx(qfull, cq * BLOCK_BYTES + l.rows_stage)?;
                let h = qt.head(kb, p.g)?;
                let m0 = kb.mul(qt.tile_of(kb, p.m)?, kb.i32c(BWD_BLOCK_M as i64), "m0")?;
                let row = kb.add(q_row_base, m0, "q_row")?;
                let q_dst = kb.add(
                    cta.smem,
                    kb.add(kb.i32c(l.q as i64), kb.mul(stage, kb.i32c(l.q_stage as i64), "")?, "")?,
                    "q_dst",
                )?;
                for cb in 0..cq {
                    let dst = kb.add(q_dst, kb.i32c((cb * BLOCK_BYTES) as i64), "tma_dst")?;
                    kb.tma_load_4d(dst, tmap_q, [kb.i32c((cb * TMA_BOX_COLS) as i64), row, h, batch_coord], qfull)?;
                }
                self.load_rows(kb, cta, h, m0, stage, qfull)?;
                // dO: one stage, free once dV of the previous tile read it.
                let do_free = kb.xor(kb.and(pos, kb.i32c(1), "")?, kb.i32c(1), "do_free_parity")?;
                kb.mbar_wait(self.bar(kb, cta, BwdBar::DoEmpty)?, do_free)?;
                let dofull = self.bar(kb, cta, BwdBar::DoFull)?;
                kb.mbar_arrive_expect_tx(dofull, cv * BLOCK_BYTES)?;
                for cb in 0..cv {
                    let dst = kb.add(cta.smem, kb.i32c((l.d_o + cb * BLOCK_BYTES) as i64), "tma_dst")?;
                    kb.tma_load_4d(dst, tmap_do, [kb.i32c((cb * TMA_BOX_COLS) as i64), row, h, batch_coord], dofull)?;
                }
                Ok(())
            })
        })
    }

    /// One CTA's loads in pair mode, every MMA operand's transactions on the first CTA's
    /// barrier (`cp.async.bulk.tensor ... .cta_group::2`): K and V of its own keys and its
    /// 64 K columns of both CTAs' keys (dQ's B) per key tile; per query tile its 64 Q rows
    /// (Sᵀ's B, one buffer), its 64 Q columns of all rows (dK's B, 2 stages) with this
    /// CTA's lse_log2 and D rows (on its own barrier), its 64 dO rows (dPᵀ's B) and its 64
    /// dO columns (dV's B). Each buffer is refilled once the MMA that reads it completed
    /// (the first CTA's commits reach both CTAs' copies of the "empty" barriers).
    fn load_pair(&self, kb: &mut Kb<'ctx>, cta: &Cta<'ctx>, loaded: Slot<'ctx>) -> R<()> {
        let spec = self.spec;
        let l = self.smem;
        let missing = || LowerError::Llvm("the pair kernel's shared-memory map has no pair buffers".into());
        let (q_row_at, kt_at, do_row_at) =
            (l.q_row.ok_or_else(missing)?, l.kt.ok_or_else(missing)?, l.do_row.ok_or_else(missing)?);
        kb.section("role: TMA loads of one CTA of the pair (its halves of the B operands)")?;
        let src = cta.tma_sources(kb, spec, &self.name)?;
        let (q_row_base, k_row_base, batch) = (src.q_row, src.k_row, src.batch);
        let (cq, cv) = (spec.head_dim_qk.div_ceil(TMA_BOX_COLS), spec.head_dim_v.div_ceil(TMA_BOX_COLS));
        // A 64-row box (8 KiB); this CTA's rows of a query tile and its column block.
        let half_rows = BWD_BLOCK_M / 2;
        let box_bytes = BLOCK_BYTES / 2;
        let my_rows = kb.mul(cta.rank, kb.i32c(half_rows as i64), "my_q_rows")?;
        let my_cols = kb.mul(cta.rank, kb.i32c(TMA_BOX_COLS as i64), "my_cols")?;
        let at = |kb: &Kb<'ctx>, off: u32| kb.add(cta.smem, kb.i32c(off as i64), "tma_dst");
        let pos = kb.slot_i32("load_pos", kb.i32c(0))?;
        walk_key_tiles(kb, cta.n_tiles, reversed_key_tiles(kb, &self.args, true)?, |kb, n, it| {
            kb.section("TMA K, V, K^T columns (once per key tile pair, after its previous MMAs)")?;
            let later = kb.icmp(IntPredicate::SGT, it, kb.i32c(0), "")?;
            kb.if_then(later, "wait_kv_empty", |kb| {
                let par = kb.and(kb.sub(it, kb.i32c(1), "")?, kb.i32c(1), "")?;
                self.wait(kb, self.bar(kb, cta, BwdBar::KvEmpty)?, par)
            })?;
            kb.set(loaded, kb.add(it, kb.i32c(1), "")?)?;
            let full = self.gather_bar(kb, cta, BwdBar::KvFull)?;
            kb.mbar_arrive_expect_tx_remote(full, (cq + cv + 2) * BLOCK_BYTES)?;
            let own = kb.add(k_row_base, self.own_n0(kb, cta, n)?, "own_key_row")?;
            for (tm, base, blocks) in [(src.k, l.k, cq), (src.v, l.v, cv)] {
                for cb in 0..blocks {
                    let c = [kb.i32c((cb * TMA_BOX_COLS) as i64), own, cta.hkv, batch];
                    kb.tma_load_4d_pair(at(kb, base + cb * BLOCK_BYTES)?, tm, c, full)?;
                }
            }
            let pair_row = kb.add(k_row_base, kb.mul(n, kb.i32c(self.mode.walk_keys() as i64), "")?, "")?;
            for half in 0..2u32 {
                let row = kb.add(pair_row, kb.i32c((half * BWD_BLOCK_N) as i64), "kt_row")?;
                kb.tma_load_4d_pair(at(kb, kt_at + half * BLOCK_BYTES)?, src.k, [my_cols, row, cta.hkv, batch], full)?;
            }
            let qt = self.queries(kb, cta, n)?;
            qt.walk(kb, cta.m_tiles, pos, |kb, p, pos| {
                let h = qt.head(kb, p.g)?;
                let m0 = kb.mul(qt.tile_of(kb, p.m)?, kb.i32c(BWD_BLOCK_M as i64), "m0")?;
                let row = kb.add(q_row_base, m0, "q_row")?;
                let mine = kb.add(row, my_rows, "my_row")?;
                let stage = kb.and(pos, kb.i32c(1), "q_stage")?;
                let one_free = kb.xor(kb.and(pos, kb.i32c(1), "")?, kb.i32c(1), "free_parity")?;
                let stage_free =
                    kb.xor(kb.and(kb.lshr(pos, kb.i32c(1), "")?, kb.i32c(1), "")?, kb.i32c(1), "q_free_parity")?;
                // Rows of every column (K-major B: Sᵀ, dPᵀ), or all rows of this CTA's
                // column block (MN-major B: dK, dV), two 64-row boxes each.
                let rows_of = |kb: &mut Kb<'ctx>, tm, dst: IntValue<'ctx>, blocks: u32, bar| -> R<()> {
                    for cb in 0..blocks {
                        let d = kb.add(dst, kb.i32c((cb * box_bytes) as i64), "")?;
                        kb.tma_load_4d_pair(d, tm, [kb.i32c((cb * TMA_BOX_COLS) as i64), mine, h, batch], bar)?;
                    }
                    Ok(())
                };
                let cols_of = |kb: &mut Kb<'ctx>, tm, dst: IntValue<'ctx>, bar| -> R<()> {
                    for hr in 0..2u32 {
                        let d = kb.add(dst, kb.i32c((hr * box_bytes) as i64), "")?;
                        let r = kb.add(row, kb.i32c((hr * half_rows) as i64), "")?;
                        kb.tma_load_4d_pair(d, tm, [my_cols, r, h, batch], bar)?;
                    }
                    Ok(())
                };
                kb.section("TMA Q rows (S^T's B), after the previous S^T")?;
                self.wait(kb, self.bar(kb, cta, BwdBar::QRowEmpty)?, one_free)?;
                let bar = self.gather_bar(kb, cta, BwdBar::QRowFull)?;
                kb.mbar_arrive_expect_tx_remote(bar, cq * box_bytes)?;
                rows_of(kb, src.q, at(kb, q_row_at)?, cq, bar)?;
                kb.section("TMA Q columns (dK's B) -> stage, bulk lse_log2, D rows (this CTA's barrier)")?;
                self.wait(kb, self.bar_stage(kb, cta, BwdBar::QEmpty, stage)?, stage_free)?;
                let bar = self.bar_stage(kb, cta, BwdBar::QFull, stage)?;
                let bar = kb.mapa_shared(bar, kb.i32c(0), "leader_mbar")?;
                kb.mbar_arrive_expect_tx_remote(bar, BLOCK_BYTES)?;
                cols_of(kb, src.q, self.q_smem(kb, cta, stage)?, bar)?;
                let rows_bar = self.bar_stage(kb, cta, BwdBar::RowsFull, stage)?;
                kb.mbar_arrive_expect_tx(rows_bar, l.rows_stage)?;
                self.load_rows(kb, cta, h, m0, stage, rows_bar)?;
                kb.section("TMA dO rows (dP^T's B), after the previous dP^T")?;
                self.wait(kb, self.bar(kb, cta, BwdBar::DoRowEmpty)?, one_free)?;
                let bar = self.gather_bar(kb, cta, BwdBar::DoRowFull)?;
                kb.mbar_arrive_expect_tx_remote(bar, cv * box_bytes)?;
                rows_of(kb, src.d_o, at(kb, do_row_at)?, cv, bar)?;
                kb.section("TMA dO columns (dV's B), after the previous dV")?;
                self.wait(kb, self.bar(kb, cta, BwdBar::DoEmpty)?, one_free)?;
                let bar = self.gather_bar(kb, cta, BwdBar::DoFull)?;
                kb.mbar_arrive_expect_tx_remote(bar, BLOCK_BYTES)?;
                cols_of(kb, src.d_o, at(kb, l.d_o)?, bar)
            })
        })
    }

    /// Query tile `m0`'s lse_log2 and D rows of head `h` into Q stage `stage`'s row
    /// buffer (bulk copies completing on `bar`).
    #[allow(clippy::too_many_arguments)]
    fn load_rows(
        &self,
        kb: &mut Kb<'ctx>,
        cta: &Cta<'ctx>,
        h: IntValue<'ctx>,
        m0: IntValue<'ctx>,
        stage: IntValue<'ctx>,
        bar: IntValue<'ctx>,
    ) -> R<()> {
        let l = self.smem;
        let (lse_log2, dpsum) = (self.args.int("lse_log2")?, self.args.int("dpsum")?);
        let ws = kb.mul(ws_row(kb, self.spec.q_heads, cta.seqlen_pad, cta.bv.b, h, m0)?, kb.i64c(4), "ws_off")?;
        let rows = kb.add(
            cta.smem,
            kb.add(kb.i32c(l.rows as i64), kb.mul(stage, kb.i32c(l.rows_stage as i64), "")?, "")?,
            "rows_dst",
        )?;
        let row_bytes = BWD_BLOCK_M * 4;
        kb.bulk_load(rows, kb.add(lse_log2, ws, "")?, row_bytes, bar)?;
        kb.bulk_load(kb.add(rows, kb.i32c(row_bytes as i64), "")?, kb.add(dpsum, ws, "")?, row_bytes, bar)
    }
}
