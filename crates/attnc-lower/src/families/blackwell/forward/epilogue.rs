//! The correction warpgroup: O rescaled in TMEM off the critical path, the final
//! normalization and the store of O and LSE.

use super::*;

/// What a row store of O writes: the output's 16-bit type, or a split's f32 partial.
#[derive(Clone, Copy)]
enum RowOut {
    Half(attnc_ir::DType),
    F32,
}

impl RowOut {
    fn bytes(self) -> u32 {
        match self {
            RowOut::Half(_) => 2,
            RowOut::F32 => 4,
        }
    }
}

impl<'a, 'ctx> Fwd<'a, 'ctx> {
    // ------------------------------------------------------------ correction + epilogue

    pub(super) fn correction(&self, kb: &mut Kb<'ctx>) -> R<()> {
        kb.section("role: correction warpgroup (rescale O in TMEM, final normalization, store O and LSE)")?;
        let t = self.cfg.tmem();
        let row = kb.and(self.tid, kb.i32c(127), "row")?;
        let lane_addr = self.tmem_lane_addr(kb)?;
        let st_cnt = kb.slot_i32("corr_stats_count", kb.i32c(0))?;
        let o_cnt = kb.slot_i32("corr_o_count", kb.i32c(0))?;
        let f_cnt = kb.slot_i32("corr_final_count", kb.i32c(0))?;
        let dv = self.spec.head_dim_v;
        self.persistent(kb, |kb, wt| {
            let n = self.count_kv_tiles(kb, &wt)?;
            self.for_n(kb, n, |kb, idx| {
                let sc = kb.get_i(st_cnt, "")?;
                let par = self.parity(kb, sc)?;
                for i in 0..self.cfg.q_tiles as usize {
                    kb.mbar_wait(self.bar(kb, Bar::Stats(i as u32))?, par)?;
                    kb.tcgen05_fence_after()?;
                    let alpha = kb.ld_shared_f32(self.alpha_addr(kb, kb.i32c(i as i64), row)?, "alpha")?;
                    let not_first = kb.icmp(IntPredicate::SGT, idx, kb.i32c(0), "")?;
                    kb.if_then(not_first, "correct", |kb| {
                        let moved = kb.fcmp(FloatPredicate::UNE, alpha, kb.f32c(1.0), "")?;
                        let any = kb.vote_any(moved, "rescale_o")?;
                        kb.if_then(any, "rescale_o", |kb| {
                            kb.section("correction: O_i *= alpha (tcgen05.ld/st)")?;
                            for c in (0..dv).step_by(CORR_CHUNK as usize) {
                                let o = kb.tmem_load(lane_addr, t.o[i] + c, CORR_CHUNK, CORR_CHUNK, "o")?;
                                let scaled: Vec<IntValue<'ctx>> = o
                                    .iter()
                                    .map(|x| kb.f_bits(kb.fmul(kb.bits_f(*x, "")?, alpha, "")?, ""))
                                    .collect::<R<_>>()?;
                                kb.tmem_store(lane_addr, t.o[i] + c, &scaled)?;
                            }
                            kb.tmem_wait_st()
                        })
                    })?;
                    kb.tcgen05_fence_before()?;
                    kb.mbar_arrive(self.bar(kb, Bar::PFull(i as u32))?)?;
                }
                kb.set(st_cnt, kb.add(sc, kb.i32c(1), "")?)
            })?;
            self.epilogue(kb, &wt, n, row, lane_addr, o_cnt, f_cnt)
        })?;
        if self.cfg.tma_store_o {
            // The last O stores must have read the staging box before the CTA exits.
            let leader = kb.icmp(IntPredicate::EQ, kb.and(self.tid, kb.i32c(127), "")?, kb.i32c(0), "")?;
            kb.if_then(leader, "o_store_drain", |kb| kb.bulk_wait_group_read(0))?;
        }
        Ok(())
    }

    pub(super) fn epilogue(
        &self,
        kb: &mut Kb<'ctx>,
        wt: &WorkTile<'ctx>,
        n: IntValue<'ctx>,
        row: IntValue<'ctx>,
        lane_addr: IntValue<'ctx>,
        o_cnt: Slot<'ctx>,
        f_cnt: Slot<'ctx>,
    ) -> R<()> {
        let spec = self.spec;
        let layout = self.cfg.smem();
        kb.section("epilogue: O /= l, store O (and LSE)")?;
        let fc = kb.get_i(f_cnt, "")?;
        let fpar = self.parity(kb, fc)?;
        let oc = kb.get_i(o_cnt, "")?;
        let opar = self.parity(kb, oc)?;
        let any = kb.icmp(IntPredicate::SGT, n, kb.i32c(0), "any_tile")?;
        let row0 = kb.mul(wt.m, kb.i32c(self.tile_rows()), "")?;
        let o_base = self.arg("o")?;
        let (sb, sr, sh) = (self.arg("o_stride_batch")?, self.arg("o_stride_row")?, self.arg("o_stride_head")?);
        for i in 0..self.cfg.q_tiles {
            kb.mbar_wait(self.bar(kb, Bar::FinalFull(i))?, fpar)?;
            let addr = self.stats_addr(kb, layout.stats, kb.i32c(i as i64), row)?;
            let l = kb.ld_shared_f32(addr, "l")?;
            let m = kb.ld_shared_f32(kb.add(addr, kb.i32c(4), "")?, "m_final")?;
            kb.mbar_arrive(self.bar(kb, Bar::FinalEmpty(i))?)?;
            let pr = kb.add(kb.add(row0, kb.i32c((i * BLOCK_M) as i64), "")?, row, "")?;
            let valid = kb.icmp(IntPredicate::SLT, pr, wt.rows, "row_valid")?;
            let (q, h) = self.row_qh(kb, wt, pr)?;
            let is_split = match self.num_splits()? {
                Some(ns) => Some(kb.icmp(IntPredicate::SGT, ns, kb.i32c(1), "is_split")?),
                None => None,
            };
            let (o_scale, lse) = self.final_scale(kb, h, l, m, is_split)?;
            let write_o = |kb: &mut Kb<'ctx>| -> R<()> {
                if self.cfg.tma_store_o {
                    self.store_o_tma(kb, wt, i, any, opar, row, lane_addr, o_scale)?;
                } else {
                    // Varlen: packed rows (q_start + q, no batch stride); padded: b·sb + q·sr.
                    let (brow, row_in) = if self.spec.kv_layout == KvLayout::Varlen {
                        (kb.i64c(0), kb.add(wt.q_start, q, "")?)
                    } else {
                        (kb.mul(kb.sext64(wt.b, "")?, sb, "")?, q)
                    };
                    let off = kb.add(
                        kb.add(brow, kb.mul(kb.sext64(row_in, "")?, sr, "")?, "")?,
                        kb.mul(kb.sext64(h, "")?, sh, "")?,
                        "",
                    )?;
                    let row_addr = kb.add(o_base, kb.mul(off, kb.i64c(2), "")?, "o_row")?;
                    self.store_o_rows(kb, i, any, opar, valid, lane_addr, row_addr, o_scale, RowOut::Half(spec.dtype))?;
                }
                if spec.lse {
                    kb.if_then(valid, "store_lse", |kb| {
                        let lse_base = self.arg("lse")?;
                        let hoff = kb.mul(kb.sext64(h, "")?, self.arg("lse_stride_head")?, "")?;
                        let off = if self.spec.kv_layout == KvLayout::Varlen {
                            kb.add(hoff, kb.sext64(kb.add(wt.q_start, q, "")?, "")?, "lse_off")?
                        } else {
                            let boff = kb.mul(kb.sext64(wt.b, "")?, self.arg("lse_stride_batch")?, "")?;
                            kb.add(kb.add(boff, hoff, "")?, kb.sext64(q, "")?, "lse_off")?
                        };
                        kb.st_global_f32(kb.add(lse_base, kb.mul(off, kb.i64c(4), "")?, "")?, lse)
                    })?;
                }
                Ok(())
            };
            match is_split {
                Some(split) => kb.if_else(
                    split,
                    "store_partial",
                    |kb| self.store_partial(kb, wt, i, any, opar, valid, pr, lane_addr, o_scale, lse),
                    write_o,
                )?,
                None => write_o(kb)?,
            }
        }
        kb.set(f_cnt, kb.add(fc, kb.i32c(1), "")?)?;
        let oc_next = kb.add(oc, kb.zext32(any, "")?, "")?;
        kb.set(o_cnt, oc_next)?;
        kb.tcgen05_fence_before()
    }

    /// O tile `i` through shared memory and TMA stores, one 64-column box at a time: the
    /// warpgroup waits until the previous store has read the staging box, each thread
    /// writes its row (scaled, 16-bit, 128-byte swizzle: 16-byte chunk c of row r at
    /// `r·128 + (c ^ r%8)·16`, the layout a TMA box has), fences the async proxy, and
    /// thread 0 stores the box. TMA clips rows past the sequence and columns past d, so
    /// no row test is needed; a work tile without key tiles stores zeros.
    fn store_o_tma(
        &self,
        kb: &mut Kb<'ctx>,
        wt: &WorkTile<'ctx>,
        i: u32,
        any: IntValue<'ctx>,
        opar: IntValue<'ctx>,
        row: IntValue<'ctx>,
        lane_addr: IntValue<'ctx>,
        o_scale: FloatValue<'ctx>,
    ) -> R<()> {
        let spec = self.spec;
        let dv = spec.head_dim_v;
        let t = self.cfg.tmem();
        let stage =
            self.cfg.smem().o_stage.ok_or_else(|| LowerError::Llvm("tma_store_o without an O staging box".into()))?;
        kb.section("epilogue: O tile -> swizzled staging box -> TMA store")?;
        let leader = kb.icmp(IntPredicate::EQ, kb.and(self.tid, kb.i32c(127), "")?, kb.i32c(0), "o_store_leader")?;
        let stage_addr = kb.add(self.smem, kb.i32c(stage as i64), "o_stage")?;
        let tmap = kb.param_generic_addr(&self.param_symbol("tmap_o")?, "tmap_o")?;
        kb.if_then(any, "o_ready", |kb| {
            kb.mbar_wait(self.bar(kb, Bar::OFull(i))?, opar)?;
            kb.tcgen05_fence_after()
        })?;
        let row0 = kb.add(kb.mul(wt.m, kb.i32c(self.tile_rows()), "")?, kb.i32c((i * BLOCK_M) as i64), "o_row0")?;
        for cb in 0..Config::boxes(dv) {
            // The staging box is free once the previous store has read it.
            kb.if_then(leader, "o_stage_free", |kb| kb.bulk_wait_group_read(0))?;
            kb.named_bar_sync(BAR_EPILOGUE, 128)?;
            for c16 in 0..4u32 {
                let col = cb * TMA_BOX_COLS + 16 * c16;
                if col >= dv {
                    break;
                }
                let write = |kb: &mut Kb<'ctx>, packed: Vec<IntValue<'ctx>>| -> R<()> {
                    for (h, quad) in packed.chunks(4).enumerate() {
                        let chunk = kb.i32c((2 * c16 + h as u32) as i64);
                        let a = crate::families::common::sw128::emit_chunk_addr(kb, stage_addr, row, chunk)?;
                        kb.st_shared_v4_b32(a, [quad[0], quad[1], quad[2], quad[3]])?;
                    }
                    Ok(())
                };
                kb.if_else(
                    any,
                    "o_chunk",
                    |kb| {
                        let o = kb.tmem_load(lane_addr, t.o[i as usize] + col, CORR_CHUNK, CORR_CHUNK, "o")?;
                        let x: Vec<FloatValue<'ctx>> =
                            o.iter().map(|v| kb.fmul(kb.bits_f(*v, "")?, o_scale, "")).collect::<R<_>>()?;
                        let packed =
                            x.chunks(2).map(|p| kb.pack_half2(spec.dtype, p[0], p[1], "o2")).collect::<R<Vec<_>>>()?;
                        write(kb, packed)
                    },
                    |kb| write(kb, vec![kb.i32c(0); 8]),
                )?;
            }
            kb.fence_proxy_async_shared()?;
            kb.named_bar_sync(BAR_EPILOGUE, 128)?;
            kb.if_then(leader, "o_tma_store", |kb| {
                let c0 = kb.i32c((cb * TMA_BOX_COLS) as i64);
                if spec.pack_gqa {
                    let pos = kb.udiv(row0, kb.i32c(self.group()), "")?;
                    kb.tma_store_5d(tmap, [c0, kb.i32c(0), pos, wt.h, wt.tma_b], stage_addr)?;
                } else {
                    kb.tma_store_4d(tmap, [c0, row0, wt.h, wt.tma_b], stage_addr)?;
                }
                kb.bulk_commit_group()
            })?;
        }
        Ok(())
    }

    /// O tile `i`'s row of this thread, read from TMEM in 16-column chunks, scaled and
    /// written with 16-byte stores at `row_addr` (rows past the tile's end skip the
    /// stores; the TMEM loads are warp-collective and run regardless). A work tile
    /// without key tiles writes zeros.
    fn store_o_rows(
        &self,
        kb: &mut Kb<'ctx>,
        i: u32,
        any: IntValue<'ctx>,
        opar: IntValue<'ctx>,
        valid: IntValue<'ctx>,
        lane_addr: IntValue<'ctx>,
        row_addr: IntValue<'ctx>,
        o_scale: FloatValue<'ctx>,
        out: RowOut,
    ) -> R<()> {
        let dv = self.spec.head_dim_v;
        let t = self.cfg.tmem();
        let eb = out.bytes();
        kb.if_else(
            any,
            "o_rows",
            |kb| {
                kb.mbar_wait(self.bar(kb, Bar::OFull(i))?, opar)?;
                kb.tcgen05_fence_after()?;
                for c in (0..dv).step_by(CORR_CHUNK as usize) {
                    let o = kb.tmem_load(lane_addr, t.o[i as usize] + c, CORR_CHUNK, CORR_CHUNK, "o")?;
                    kb.if_then(valid, "store_o_row", |kb| {
                        let x: Vec<FloatValue<'ctx>> =
                            o.iter().map(|v| kb.fmul(kb.bits_f(*v, "")?, o_scale, "")).collect::<R<_>>()?;
                        let words: Vec<IntValue<'ctx>> = match out {
                            RowOut::Half(dtype) => {
                                x.chunks(2).map(|p| kb.pack_half2(dtype, p[0], p[1], "o2")).collect::<R<_>>()?
                            }
                            RowOut::F32 => x.iter().map(|v| kb.f_bits(*v, "")).collect::<R<_>>()?,
                        };
                        for (k, quad) in words.chunks(4).enumerate() {
                            let a = kb.add(row_addr, kb.i64c((c * eb) as i64 + 16 * k as i64), "")?;
                            kb.st_global_v4_b32(a, [quad[0], quad[1], quad[2], quad[3]])?;
                        }
                        Ok(())
                    })?;
                }
                Ok(())
            },
            |kb| {
                kb.if_then(valid, "store_zero_row", |kb| {
                    let z = kb.i32c(0);
                    for k in 0..dv * eb / 16 {
                        kb.st_global_v4_b32(kb.add(row_addr, kb.i64c(16 * k as i64), "")?, [z, z, z, z])?;
                    }
                    Ok(())
                })
            },
        )
    }

    /// Split-KV: this split's O (normalized by its own sum, f32) and LSE into the combine
    /// kernel's workspace (`variant::layout::partial_row`); a split without key tiles
    /// writes O = 0 and LSE = −∞.
    fn store_partial(
        &self,
        kb: &mut Kb<'ctx>,
        wt: &WorkTile<'ctx>,
        i: u32,
        any: IntValue<'ctx>,
        opar: IntValue<'ctx>,
        valid: IntValue<'ctx>,
        pr: IntValue<'ctx>,
        lane_addr: IntValue<'ctx>,
        o_scale: FloatValue<'ctx>,
        lse: FloatValue<'ctx>,
    ) -> R<()> {
        let dv = self.spec.head_dim_v;
        let (q, h) = self.row_qh(kb, wt, pr)?;
        let idx = crate::variant::layout::partial_row(
            kb,
            wt.split,
            self.arg("batch")?,
            wt.b,
            self.spec.q_heads,
            h,
            self.arg("seqlen_q")?,
            q,
        )?;
        let row_addr = kb.add(self.arg("o_partial")?, kb.mul(idx, kb.i64c(4 * dv as i64), "")?, "o_partial_row")?;
        self.store_o_rows(kb, i, any, opar, valid, lane_addr, row_addr, o_scale, RowOut::F32)?;
        kb.if_then(valid, "store_lse_partial", |kb| {
            let a = kb.add(self.arg("lse_partial")?, kb.mul(idx, kb.i64c(4), "")?, "")?;
            kb.st_global_f32(a, lse)
        })
    }

    /// (O scale, LSE) of row `h`'s final statistics, with its sink when the spec has
    /// sinks, except in a split's partial (`is_split` true at run time): the combine
    /// kernel adds the sink once.
    pub(super) fn final_scale(
        &self,
        kb: &mut Kb<'ctx>,
        h: IntValue<'ctx>,
        l: FloatValue<'ctx>,
        m: FloatValue<'ctx>,
        is_split: Option<IntValue<'ctx>>,
    ) -> R<(FloatValue<'ctx>, FloatValue<'ctx>)> {
        let sink_log2 = if self.spec.sinks {
            Some(crate::variant::softmax::sink_log2(kb, self.arg("sinks")?, h, is_split)?)
        } else {
            None
        };
        crate::variant::softmax::finalize_row(kb, l, m, sink_log2)
    }
}
