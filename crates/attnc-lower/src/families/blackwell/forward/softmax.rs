//! The softmax warpgroups: S from TMEM, mask/score mod, row max, exp2 (MUFU and the
//! FMA-pipe emulation), P back to TMEM, statistics for the correction warpgroup.

use super::*;
use crate::families::common::sw128::zero_row;

/// Columns per streamed chunk when the mask or score mod reads aux tensors.
pub(super) const AUX_CHUNK: u32 = 8;

impl<'a, 'ctx> Fwd<'a, 'ctx> {
    // ------------------------------------------------------------ softmax

    /// TMEM address of column `col` in this warp's lane quadrant.
    pub(super) fn tmem_lane_addr(&self, kb: &Kb<'ctx>) -> R<IntValue<'ctx>> {
        let quad = kb.and(self.warp, kb.i32c(3), "")?;
        kb.add(self.tmem, kb.shl(kb.mul(quad, kb.i32c(32), "")?, kb.i32c(16), "")?, "tmem_lane")
    }

    pub(super) fn elem_vars(&self, wt: &WorkTile<'ctx>, row: &SoftmaxRow<'ctx>, k: IntValue<'ctx>) -> ElemVars<'ctx> {
        ElemVars {
            b: wt.b,
            h: row.h,
            hkv: row.hkv,
            q: row.q,
            k,
            seqlen_q: wt.seqlen_q,
            seqlen_k: wt.seqlen_k,
            score: None,
            k_split: None,
        }
    }

    pub(super) fn softmax(&self, kb: &mut Kb<'ctx>, stage: IntValue<'ctx>) -> R<()> {
        kb.section("role: softmax warpgroup (one thread per row of Q tile `stage`)")?;
        let spec = self.spec;
        let t = self.cfg.tmem();
        let row = kb.and(self.tid, kb.i32c(127), "row")?;
        let lane_addr = self.tmem_lane_addr(kb)?;
        let s_col = kb.mul(stage, kb.i32c(t.s[1] as i64), "")?;
        let s_taddr = kb.add(lane_addr, s_col, "s_taddr")?;
        let p_off = t.p[0] - t.s[0];
        let is_second = kb.icmp(IntPredicate::EQ, stage, kb.i32c(1), "")?;
        // Warpgroup 1 hands the first exp turn to warpgroup 0 (with one Q tile there is
        // no ping-pong and no token).
        let pingpong = self.cfg.q_tiles == 2;
        if pingpong {
            kb.if_then(is_second, "exp_token", |kb| kb.named_bar_arrive(BAR_EXP[0], 256))?;
        }

        let s_cnt = kb.slot_i32("sm_s_count", kb.i32c(0))?;
        let f_cnt = kb.slot_i32("sm_final_count", kb.i32c(0))?;
        let row_max = kb.slot_f32("row_max", kb.f32c(f64::NEG_INFINITY))?;
        let row_sum = kb.slot_f32("row_sum", kb.f32c(0.0))?;
        let chunk_slots: Vec<Slot<'ctx>> =
            (0..32).map(|c| kb.slot_f32(&format!("s{c}"), kb.f32c(0.0))).collect::<R<_>>()?;
        let kv_pos = kb.slot_i32("sm_kv_pos", kb.i32c(0))?;
        let layout = self.cfg.smem();
        self.persistent(kb, |kb, wt| {
            kb.set(row_max, kb.f32c(f64::NEG_INFINITY))?;
            kb.set(row_sum, kb.f32c(0.0))?;
            let hkv = self.hkv(kb, &wt)?;
            let row0 = kb.mul(wt.m, kb.i32c(self.tile_rows()), "")?;
            let q_lo = kb.add(row0, kb.mul(stage, kb.i32c(BLOCK_M as i64), "")?, "stage_row0")?;
            let (q, h) = self.row_qh(kb, &wt, kb.add(q_lo, row, "")?)?;
            let q_hi = kb.sub(kb.smin(kb.add(q_lo, kb.i32c(BLOCK_M as i64), "")?, wt.rows, "")?, kb.i32c(1), "")?;
            let stage_live = kb.icmp(IntPredicate::SLT, q_lo, wt.rows, "")?;
            let row = SoftmaxRow { stage, row, q, h, hkv, s_taddr, p_off, row_max, row_sum };
            let kv_base = kb.get_i(kv_pos, "kv_base")?;
            let n = self.for_each_kv_tile(kb, &wt, |kb, j, idx| {
                let sc = kb.get_i(s_cnt, "")?;
                kb.mbar_wait(self.bar_stage(kb, Bar::SFull, stage)?, self.parity(kb, sc)?)?;
                kb.set(s_cnt, kb.add(sc, kb.i32c(1), "")?)?;
                kb.tcgen05_fence_after()?;
                let n0 = kb.mul(j, kb.i32c(BLOCK_N as i64), "n0")?;
                self.zero_v_tail(kb, &wt, &row, n0, kv_base, idx)?;
                // Tiles the analysis proves full for this Q tile, inside seqlen_k, skip
                // the per-element mask.
                let inside = kb.icmp(IntPredicate::SLE, kb.add(n0, kb.i32c(BLOCK_N as i64), "")?, wt.seqlen_k, "")?;
                let unmasked = if spec.mask.to_predicate().is_some() {
                    let cls = self.classify(kb, &wt, q_lo, q_hi, j)?;
                    kb.and(kb.and(cls.full, inside, "")?, stage_live, "unmasked")?
                } else {
                    inside
                };
                if spec.score_mod.is_none() {
                    kb.if_else(
                        unmasked,
                        "tile_fast",
                        |kb| self.softmax_tile_fast(kb, &row),
                        |kb| self.softmax_tile_streamed(kb, &wt, &row, n0, unmasked, &chunk_slots),
                    )
                } else {
                    self.softmax_tile_streamed(kb, &wt, &row, n0, unmasked, &chunk_slots)
                }
            })?;
            kb.set(kv_pos, kb.add(kv_base, kb.mul(n, kb.i32c(2), "")?, "")?)?;
            kb.section("softmax: hand the final row sum and max to the correction warpgroup")?;
            let fc = kb.get_i(f_cnt, "")?;
            let par = kb.xor(self.parity(kb, fc)?, kb.i32c(1), "")?;
            kb.mbar_wait(self.bar_stage(kb, Bar::FinalEmpty, stage)?, par)?;
            let addr = self.stats_addr(kb, layout.stats, stage, row.row)?;
            kb.st_shared_f32(addr, kb.get_f(row_sum, "")?)?;
            kb.st_shared_f32(kb.add(addr, kb.i32c(4), "")?, kb.get_f(row_max, "")?)?;
            kb.mbar_arrive(self.bar_stage(kb, Bar::FinalFull, stage)?)?;
            kb.set(f_cnt, kb.add(fc, kb.i32c(1), "")?)
        })?;
        // Warpgroup 0 takes back the token warpgroup 1 passed after its last tile.
        if !pingpong {
            return Ok(());
        }
        let is_first = kb.not(is_second, "")?;
        kb.if_then(is_first, "exp_token_back", |kb| kb.named_bar_sync(BAR_EXP[0], 256))
    }

    /// Zeroes the rows of the tile's V that lie past seqlen_k, before P·V reads them
    /// (warpgroup 0, one thread per row, only on the tile that ends past seqlen_k, and
    /// only where TMA can bring other data there: paged pages and varlen's next
    /// sequence; contiguous rows past the end are out of bounds and arrive as zeros).
    /// P is 0 in those columns, but 0 · NaN is NaN: a cache page's unused rows may hold
    /// anything. Ordered before the MMA by the proxy fence and the PFull arrival.
    fn zero_v_tail(
        &self,
        kb: &mut Kb<'ctx>,
        wt: &WorkTile<'ctx>,
        row: &SoftmaxRow<'ctx>,
        n0: IntValue<'ctx>,
        kv_base: IntValue<'ctx>,
        idx: IntValue<'ctx>,
    ) -> R<()> {
        // Contiguous: rows past the end are out of bounds and arrive as zeros; gathered
        // rows past the end are zero-filled by the gather warps.
        if self.spec.kv_layout == KvLayout::Contiguous || self.cfg.gather {
            return Ok(());
        }
        let past_end = kb.icmp(IntPredicate::SGT, kb.add(n0, kb.i32c(BLOCK_N as i64), "")?, wt.seqlen_k, "")?;
        let first_wg = kb.icmp(IntPredicate::EQ, row.stage, kb.i32c(0), "")?;
        let tail = kb.and(past_end, first_wg, "v_tail")?;
        kb.if_then(tail, "zero_v_tail", |kb| {
            kb.section("softmax: zero V rows past seqlen_k (paged / varlen tail tile)")?;
            let vpos = kb.add(kb.add(kv_base, kb.mul(idx, kb.i32c(2), "")?, "")?, kb.i32c(1), "vpos")?;
            let (slot, par) = self.ring(kb, vpos)?;
            kb.mbar_wait(self.bar_slot(kb, Bar::KvFull, slot)?, par)?;
            let dead = kb.icmp(IntPredicate::SGE, kb.add(n0, row.row, "")?, wt.seqlen_k, "")?;
            kb.if_then(dead, "zero_v_row", |kb| {
                let row_addr = kb.add(self.kv_addr(kb, slot)?, kb.mul(row.row, kb.i32c(128), "")?, "v_row")?;
                zero_row(kb, row_addr, self.spec.head_dim_v, TMA_BOX_BYTES)
            })?;
            kb.fence_proxy_async_shared()
        })
    }

    /// A tile without per-element work: all of S in registers (one pass over TMEM).
    pub(super) fn softmax_tile_fast(&self, kb: &mut Kb<'ctx>, row: &SoftmaxRow<'ctx>) -> R<()> {
        let spec = self.spec;
        kb.section("softmax (full tile): tcgen05.ld S row, row max")?;
        let raw = kb.tmem_load(row.s_taddr, 0, BLOCK_N, 32, "s_raw")?;
        let s: Vec<FloatValue<'ctx>> = raw
            .iter()
            .map(|x| kb.fmul(kb.bits_f(*x, "")?, kb.f32c(spec.scale_value() * LOG2E), "s_log2"))
            .collect::<R<_>>()?;
        let m_tile = tree(kb, &s, |kb, a, b| kb.fmax(a, b, ""))?;
        let (base, alpha) = self.row_base(kb, row, m_tile)?;
        kb.section("softmax (full tile): exp2, exclusive with the other warpgroup")?;
        self.exp_turn_begin(kb, row)?;
        let e = emulated_per_row(spec);
        let sum = if e == 0 {
            // MUFU exp2 alone: only the exp2s take the turn; sum, pack and store follow it.
            let mut p = Vec::with_capacity(s.len());
            for v in &s {
                let x = kb.fsub(*v, base, "")?;
                p.push(kb.ex2(x, "p")?);
            }
            self.exp_turn_end(kb, row)?;
            let sum = tree(kb, &p, |kb, a, b| kb.fadd(a, b, ""))?;
            self.store_p(kb, row, 0, &p)?;
            sum
        } else {
            // Emulated exp2 keeps polynomial temporaries per value: 32 columns at a time
            // (exp2, their sum, P packed and stored) so only 32 f32 of P are live next to
            // the rest of S; the whole row at once spilled (random-spec sweep). The sums
            // combine in the same pairwise tree as one over all columns.
            let mut sums = Vec::new();
            for (chunk, s_chunk) in s.chunks(32).enumerate() {
                let mut p = Vec::with_capacity(32);
                for (c, v) in s_chunk.iter().enumerate() {
                    let x = kb.fsub(*v, base, "")?;
                    let col = (32 * chunk + c) as u32;
                    p.push(if is_emulated(col, e) { exp2_emulated(kb, x)? } else { kb.ex2(x, "p")? });
                }
                sums.push(tree(kb, &p, |kb, a, b| kb.fadd(a, b, ""))?);
                self.store_p(kb, row, 32 * chunk as u32, &p)?;
            }
            self.exp_turn_end(kb, row)?;
            tree(kb, &sums, |kb, a, b| kb.fadd(a, b, ""))?
        };
        self.finish_tile(kb, row, alpha, sum)
    }

    /// P columns `first..first + p.len()` of this row, packed to 16 bits in pairs, into
    /// TMEM beside S (at most 32 words per `tcgen05.st`).
    fn store_p(&self, kb: &mut Kb<'ctx>, row: &SoftmaxRow<'ctx>, first: u32, p: &[FloatValue<'ctx>]) -> R<()> {
        let packed: Vec<IntValue<'ctx>> = kb.pack_pairs(self.spec.dtype, p, "p2")?;
        for (i, words) in packed.chunks(32).enumerate() {
            kb.tmem_store(row.s_taddr, row.p_off + first / 2 + 32 * i as u32, words)?;
        }
        Ok(())
    }

    /// A tile with a score modification or a per-element mask, streamed through TMEM in
    /// chunks of 32 columns (bounded register pressure): pass 1 writes the masked log2
    /// scores back in place and keeps the row max; pass 2 exponentiates each chunk and
    /// writes its 16 columns of P over the columns pass 2 has already read.
    pub(super) fn softmax_tile_streamed(
        &self,
        kb: &mut Kb<'ctx>,
        wt: &WorkTile<'ctx>,
        row: &SoftmaxRow<'ctx>,
        n0: IntValue<'ctx>,
        unmasked: IntValue<'ctx>,
        slots: &[Slot<'ctx>],
    ) -> R<()> {
        let spec = self.spec;
        let masked = kb.not(unmasked, "masked")?;
        let mut m_tile = kb.f32c(f64::NEG_INFINITY);
        // Masks and score mods that read aux tensors issue one global load per element:
        // narrower chunks keep those loads' addresses and results within the budget
        // (16 columns still spilled 312 bytes at document_mask's causal && doc[b,q] ==
        // doc[b,k]; 8 assemble without spills).
        let reads_aux = spec.mask.predicate.as_ref().is_some_and(|p| p.uses_aux())
            || spec.score_mod.as_ref().is_some_and(|p| p.uses_aux());
        let w: u32 = if reads_aux { AUX_CHUNK } else { 32 };
        let slots = &slots[..w as usize];
        for chunk in 0..BLOCK_N / w {
            kb.section("softmax (streamed): tcgen05.ld a chunk of S, score mod, mask")?;
            let raw = kb.tmem_load(row.s_taddr, w * chunk, w, w, "s_raw")?;
            for (c, slot) in slots.iter().enumerate() {
                let x = kb.bits_f(raw[c], "")?;
                let imm = (w * chunk) as i64 + c as i64;
                let k = kb.add(n0, kb.i32c(imm), "k")?;
                let v = match &spec.score_mod {
                    None => kb.fmul(x, kb.f32c(spec.scale_value() * LOG2E), "s_log2")?,
                    Some(m) => {
                        let score = kb.fmul(x, kb.f32c(spec.scale_value()), "score")?;
                        // k = n0 + imm: a key distance converts once per row (the hopper way).
                        let vars =
                            ElemVars { score: Some(score), k_split: Some((n0, imm)), ..self.elem_vars(wt, row, k) };
                        let modded = vexpr::gen(kb, spec, m, &vars, &self.va)?.float();
                        kb.fmul(modded, kb.f32c(LOG2E), "s_log2")?
                    }
                };
                kb.set(*slot, v)?;
            }
            kb.if_then(masked, "mask", |kb| {
                for (c, slot) in slots.iter().enumerate() {
                    let k = kb.add(n0, kb.i32c((w * chunk) as i64 + c as i64), "k")?;
                    let mut allowed = kb.icmp(IntPredicate::SLT, k, wt.seqlen_k, "k_in_bounds")?;
                    if let Some(p) = spec.mask.to_predicate() {
                        let m = vexpr::gen(kb, spec, &p, &self.elem_vars(wt, row, k), &self.va)?.int();
                        allowed = kb.and(allowed, m, "allowed")?;
                    }
                    let v = kb.get_f(*slot, "")?;
                    kb.set(*slot, kb.select_f(allowed, v, kb.f32c(f64::NEG_INFINITY), "s_masked")?)?;
                }
                Ok(())
            })?;
            let v: Vec<FloatValue<'ctx>> = slots.iter().map(|sl| kb.get_f(*sl, "s")).collect::<R<_>>()?;
            let m = tree(kb, &v, |kb, a, b| kb.fmax(a, b, ""))?;
            m_tile = kb.fmax(m_tile, m, "m_tile")?;
            let bits: Vec<IntValue<'ctx>> = v.iter().map(|x| kb.f_bits(*x, "")).collect::<R<_>>()?;
            kb.tmem_store(row.s_taddr, w * chunk, &bits)?;
            if reads_aux {
                // A memory-ordering point ptxas does not move loads across: without it
                // ptxas hoists every chunk's aux loads to the top of the row.
                kb.warp_sync()?;
            }
        }
        kb.tmem_wait_st()?;
        let (base, alpha) = self.row_base(kb, row, m_tile)?;
        kb.section("softmax (streamed): exp2 per chunk, P over the columns already read")?;
        self.exp_turn_begin(kb, row)?;
        let e = emulated_per_row(spec);
        let mut sums = Vec::new();
        for chunk in 0..BLOCK_N / 32 {
            let raw = kb.tmem_load(row.s_taddr, 32 * chunk, 32, 32, "s_log2")?;
            let mut p = Vec::with_capacity(32);
            for (c, x) in raw.iter().enumerate() {
                let x = kb.fsub(kb.bits_f(*x, "")?, base, "")?;
                let col = 32 * chunk + c as u32;
                p.push(if is_emulated(col, e) { exp2_emulated(kb, x)? } else { kb.ex2(x, "p")? });
            }
            sums.push(tree(kb, &p, |kb, a, b| kb.fadd(a, b, ""))?);
            let packed: Vec<IntValue<'ctx>> = kb.pack_pairs(spec.dtype, &p, "p2")?;
            kb.tmem_store(row.s_taddr, row.p_off + 16 * chunk, &packed)?;
        }
        self.exp_turn_end(kb, row)?;
        let sum = tree(kb, &sums, |kb, a, b| kb.fadd(a, b, ""))?;
        self.finish_tile(kb, row, alpha, sum)
    }

    /// The exponent base of this tile (conditional rescaling: the base moves only when
    /// some row of the warp grew by more than the threshold), the rescale factor alpha
    /// handed to the correction warpgroup through shared memory.
    pub(super) fn row_base(
        &self,
        kb: &mut Kb<'ctx>,
        row: &SoftmaxRow<'ctx>,
        m_tile: FloatValue<'ctx>,
    ) -> R<(FloatValue<'ctx>, FloatValue<'ctx>)> {
        let opts = self.spec.softmax;
        kb.section("softmax: exponent base (warp-uniform rescale decision), alpha to correction")?;
        let old = kb.get_f(row.row_max, "m_old")?;
        let m_new = kb.fmax(old, m_tile, "m_new")?;
        let chosen = if opts.rescale_threshold > 0.0 {
            let grew = kb.fcmp(FloatPredicate::OGT, m_new, kb.fadd(old, kb.f32c(opts.rescale_threshold), "")?, "")?;
            let was_empty = kb.fcmp(FloatPredicate::OEQ, old, kb.f32c(f64::NEG_INFINITY), "")?;
            let now_finite = kb.fcmp(FloatPredicate::ONE, m_new, kb.f32c(f64::NEG_INFINITY), "")?;
            let grew = kb.or(grew, kb.and(was_empty, now_finite, "")?, "")?;
            let any = kb.vote_any(grew, "rescale_warp")?;
            kb.select_f(any, m_new, old, "m_base")?
        } else {
            m_new
        };
        let is_inf = kb.fcmp(FloatPredicate::OEQ, chosen, kb.f32c(f64::NEG_INFINITY), "")?;
        let base = kb.select_f(is_inf, kb.f32c(0.0), chosen, "m_safe")?;
        let alpha = kb.ex2(kb.fsub(old, base, "")?, "alpha")?;
        kb.set(row.row_max, chosen)?;
        let a = self.alpha_addr(kb, row.stage, row.row)?;
        kb.st_shared_f32(a, alpha)?;
        kb.mbar_arrive(self.bar_stage(kb, Bar::Stats, row.stage)?)?;
        Ok((base, alpha))
    }

    pub(super) fn exp_turn_begin(&self, kb: &mut Kb<'ctx>, row: &SoftmaxRow<'ctx>) -> R<()> {
        if self.cfg.q_tiles == 1 {
            // No other warpgroup to alternate with. The turn's barrier is also a point
            // ptxas does not schedule across (the mask pass stays apart from the
            // exponentials); a warp sync keeps that fence.
            return kb.warp_sync();
        }
        let mine = kb.add(row.stage, kb.i32c(BAR_EXP[0] as i64), "exp_bar")?;
        kb.named_bar_sync_r(mine, 256)
    }

    pub(super) fn exp_turn_end(&self, kb: &mut Kb<'ctx>, row: &SoftmaxRow<'ctx>) -> R<()> {
        if self.cfg.q_tiles == 1 {
            return kb.warp_sync();
        }
        let other = kb.sub(kb.i32c(BAR_EXP[1] as i64), row.stage, "exp_bar_other")?;
        kb.named_bar_arrive_r(other, 256)
    }

    /// P is written: make it visible to the MMA warp, update the row sum.
    pub(super) fn finish_tile(
        &self,
        kb: &mut Kb<'ctx>,
        row: &SoftmaxRow<'ctx>,
        alpha: FloatValue<'ctx>,
        sum: FloatValue<'ctx>,
    ) -> R<()> {
        kb.tmem_wait_st()?;
        kb.tcgen05_fence_before()?;
        kb.mbar_arrive(self.bar_stage(kb, Bar::PFull, row.stage)?)?;
        let l = kb.get_f(row.row_sum, "")?;
        kb.set(row.row_sum, kb.fma(l, alpha, sum, "row_sum")?)
    }

    pub(super) fn alpha_addr(&self, kb: &Kb<'ctx>, stage: IntValue<'ctx>, row: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        let off = kb.add(kb.mul(stage, kb.i32c((BLOCK_M * 4) as i64), "")?, kb.mul(row, kb.i32c(4), "")?, "")?;
        kb.add(self.smem, kb.add(kb.i32c(self.cfg.smem().alpha as i64), off, "")?, "alpha_addr")
    }

    pub(super) fn stats_addr(
        &self,
        kb: &Kb<'ctx>,
        stats: u32,
        stage: IntValue<'ctx>,
        row: IntValue<'ctx>,
    ) -> R<IntValue<'ctx>> {
        let off = kb.add(kb.mul(stage, kb.i32c((BLOCK_M * 8) as i64), "")?, kb.mul(row, kb.i32c(8), "")?, "")?;
        kb.add(self.smem, kb.add(kb.i32c(stats as i64), off, "")?, "stats_addr")
    }
}

/// What the softmax needs about its row.
pub(super) struct SoftmaxRow<'ctx> {
    stage: IntValue<'ctx>,
    /// Row within the Q tile (= TMEM lane).
    row: IntValue<'ctx>,
    /// Query position and head of the row.
    q: IntValue<'ctx>,
    h: IntValue<'ctx>,
    hkv: IntValue<'ctx>,
    s_taddr: IntValue<'ctx>,
    p_off: u32,
    row_max: Slot<'ctx>,
    row_sum: Slot<'ctx>,
}

/// Pairwise reduction (short dependency chains).
pub(super) fn tree<'ctx>(
    kb: &Kb<'ctx>,
    v: &[FloatValue<'ctx>],
    f: impl Fn(&Kb<'ctx>, FloatValue<'ctx>, FloatValue<'ctx>) -> R<FloatValue<'ctx>>,
) -> R<FloatValue<'ctx>> {
    let mut level = v.to_vec();
    while level.len() > 1 {
        let mut next = Vec::with_capacity(level.len().div_ceil(2));
        for p in level.chunks(2) {
            next.push(if p.len() == 2 { f(kb, p[0], p[1])? } else { p[0] });
        }
        level = next;
    }
    Ok(level[0])
}
