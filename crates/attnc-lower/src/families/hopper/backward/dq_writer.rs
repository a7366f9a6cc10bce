//! The backward's dQ writer warps in the producer warpgroup: the ordered deterministic
//! mode's (each staged tile added in its turn) and `dq_writer`'s (each consumer's staged
//! half added as it comes), with what the consumers hand them.

use super::*;

/// What the dQ issuer hands the dQ writer with each staged tile (ordered mode), in
/// shared memory (`BwdSmem::dq_handoff`): the tile's workspace row (`ws_row`), key tile,
/// order key, query head and query tile; a negative head ends the walk.
pub(super) struct DqHandoff<'ctx> {
    base: IntValue<'ctx>,
}

#[derive(Clone, Copy)]
pub(super) struct HandoffVals<'ctx> {
    pub(super) row: IntValue<'ctx>,
    pub(super) n: IntValue<'ctx>,
    pub(super) mine: IntValue<'ctx>,
    pub(super) h: IntValue<'ctx>,
    pub(super) m: IntValue<'ctx>,
}

impl<'ctx> DqHandoff<'ctx> {
    pub(super) fn at(bwd: &Bwd<'_, 'ctx>, cta: &Cta<'ctx>, kb: &Kb<'ctx>) -> R<Self> {
        Ok(DqHandoff { base: kb.add(cta.smem, kb.i32c(bwd.layout.dq_handoff as i64), "dq_handoff")? })
    }

    fn word(&self, kb: &Kb<'ctx>, i: i64) -> R<IntValue<'ctx>> {
        kb.add(self.base, kb.i32c(4 * i), "")
    }

    pub(super) fn write(&self, kb: &Kb<'ctx>, v: HandoffVals<'ctx>) -> R<()> {
        let (lo, hi) = split_u64(kb, v.row)?;
        for (i, x) in [lo, hi, v.n, v.mine, v.h, v.m].into_iter().enumerate() {
            kb.st_shared_b32(self.word(kb, i as i64)?, x)?;
        }
        Ok(())
    }

    fn read(&self, kb: &Kb<'ctx>) -> R<HandoffVals<'ctx>> {
        let w = |i: i64, name: &str| kb.ld_shared_b32(self.word(kb, i)?, name);
        let row = join_u64(kb, w(0, "row_lo")?, w(1, "row_hi")?, "row")?;
        Ok(HandoffVals { row, n: w(2, "n")?, mine: w(3, "mine")?, h: w(4, "h")?, m: w(5, "m")? })
    }
}

/// A 64-bit value as the two 32-bit words a hand-over in shared memory holds (low first).
fn split_u64<'ctx>(kb: &Kb<'ctx>, v: IntValue<'ctx>) -> R<(IntValue<'ctx>, IntValue<'ctx>)> {
    let lo = kb.trunc32(v, "")?;
    let hi = kb.trunc32(kb.b.build_right_shift(v, kb.i64c(32), false, "")?, "")?;
    Ok((lo, hi))
}

/// [`split_u64`]'s words back as the 64-bit value.
fn join_u64<'ctx>(kb: &Kb<'ctx>, lo: IntValue<'ctx>, hi: IntValue<'ctx>, name: &str) -> R<IntValue<'ctx>> {
    let (lo, hi) = (kb.zext64(lo, "")?, kb.zext64(hi, "")?);
    kb.or(lo, kb.b.build_left_shift(hi, kb.i64c(32), "")?, name)
}

impl<'ctx> Bwd<'_, 'ctx> {
    /// Ordered mode, warp 1's first thread (the producer warpgroup's otherwise idle warps):
    /// per staged dQ tile, reads what the issuer handed over (`DqHandoff`), waits for its
    /// turn (`common::dq_order`: the predecessor's key from the turn plan), adds the tile
    /// with one bulk reduce, frees the staging once it is read and passes the turn once
    /// the adds are complete. The consumers never wait for a turn or a reduce's
    /// completion, only for the staging. It does not walk the pairs itself (the walk's
    /// classification does not fit this warpgroup's 24 registers next to the rest): the
    /// issuer's last hand-over says the walk ended.
    pub(super) fn dq_writer(&self, kb: &mut Kb<'ctx>) -> R<()> {
        let spec = self.spec;
        let cfg = self.cfg;
        let d = spec.head_dim_qk;
        kb.section("dQ writer (ordered mode): each staged dQ tile added in its turn")?;
        // Opaque copies: values the TMA thread computes too would otherwise be computed
        // once before both branches and held across the TMA thread's walk.
        let raw = kb.opaque_i32(dynamic_smem_base(kb)?, "smem_raw")?;
        let smem = kb.and(kb.add(raw, kb.i32c(1023), "")?, kb.i32c(!1023), "smem")?;
        let bar = |kb: &Kb<'ctx>, which: Bar| self.bar_at(kb, smem, which, kb.i32c(0));
        let hand = DqHandoff { base: kb.add(smem, kb.i32c(self.layout.dq_handoff as i64), "dq_handoff")? };
        let count = kb.slot_i32("w_count", kb.i32c(0))?;
        let more = kb.slot_i32("w_more", kb.i32c(1))?;
        kb.while_loop(
            "dq_writer",
            |kb| kb.icmp(IntPredicate::NE, kb.get_i(more, "")?, kb.i32c(0), ""),
            |kb| {
                let c = kb.get_i(count, "w_count")?;
                kb.mbar_wait(bar(kb, Bar::DqStaged)?, kb.and(c, kb.i32c(1), "")?)?;
                let v = hand.read(kb)?;
                let end = kb.icmp(IntPredicate::SLT, v.h, kb.i32c(0), "walk_ended")?;
                kb.set(more, kb.zext32(kb.not(end, "")?, "")?)?;
                kb.if_then(kb.not(end, "")?, "dq_tile", |kb| {
                    let dst =
                        kb.add(self.args.int("dq_accum")?, kb.mul(v.row, kb.i64c(d as i64 * 4), "")?, "dq_tile_addr")?;
                    let stage = kb.add(smem, kb.i32c(self.layout.dq_stage as i64), "dq_stage")?;
                    // Without turns (`writer_turns=0`, measurement only) the tile is added
                    // as it comes.
                    let turn = match cfg.writer_turns {
                        true => {
                            // From the launch arguments and the hand-over alone (a batch view
                            // does not fit this warpgroup's 24 registers for every mask).
                            let flag = turn_flag(kb, &self.args, v.row)?;
                            let la = self.args.layout()?;
                            let b = kb.opaque_i32(kb.sreg("ctaid.z", "")?, "b")?;
                            let pad = emit_seqlen_pad(kb, la.seqlen_q, ws_row_align(cfg.block_m))?;
                            let tiles = (cfg.block_m, cfg.block_n());
                            let idx = turn_plan_index(kb, spec, &la, pad, b, tiles, (v.h, v.m, v.n))?;
                            let plan = self.args.int("turn_plan")?;
                            let wait_for =
                                kb.ld_global_b32(kb.add(plan, kb.mul(idx, kb.i64c(4), "")?, "")?, "turn_wait_for")?;
                            DqTurn { flag, wait_for, mine: v.mine }.wait(kb)?;
                            kb.fence_proxy_async_global()?;
                            Some(flag)
                        }
                        false => None,
                    };
                    kb.bulk_reduce_add_f32(dst, stage, cfg.block_m * d * 4)?;
                    kb.bulk_commit_group()?;
                    kb.bulk_wait_group_read(0)?;
                    kb.mbar_arrive(bar(kb, Bar::DqFree)?)?;
                    let Some(flag) = turn else { return Ok(()) };
                    kb.bulk_wait_group(0)?;
                    kb.fence_proxy_async_global()?;
                    DqTurn::pass(kb, flag, v.mine)
                })?;
                kb.set(count, kb.add(c, kb.i32c(1), "")?)
            },
        )?;
        match cfg.writer_turns {
            true => Ok(()),
            false => kb.bulk_wait_group(0),
        }
    }

    /// `dq_writer`: the producer warpgroup's warp 1 adds each consumer's staged half of
    /// the dQ tile (`DqAccumLayout::ConsumerHalves`) with one bulk reduce. Per consumer
    /// `c` two named barriers of 160 threads (the consumer's 128 and this warp): the
    /// writer arrives at `DQ_FREE_BAR + c` when the staging half is free (once at the
    /// start, then after each reduce has read it), the consumer at `DQ_FULL_BAR + c` when
    /// it has staged the half and written its destination (or, after its walk, the end
    /// flag) into `dq_handoff`; each waits at the other's.
    pub(super) fn dq_half_writer(&self, kb: &mut Kb<'ctx>) -> R<()> {
        let cfg = self.cfg;
        kb.section("dQ writer warp: each consumer's staged half, one bulk reduce-add")?;
        let raw = kb.opaque_i32(dynamic_smem_base(kb)?, "smem_raw")?;
        let smem = kb.and(kb.add(raw, kb.i32c(1023), "")?, kb.i32c(!1023), "smem")?;
        let tid = kb.opaque_i32(kb.sreg("tid.x", "")?, "tid")?;
        let lane0 = kb.icmp(IntPredicate::EQ, kb.and(tid, kb.i32c(31), "")?, kb.i32c(0), "lane0")?;
        let half_bytes = CONSUMER_HALF_FLOATS * 4;
        let threads = 128 + 32;
        for c in 0..cfg.consumers {
            kb.named_bar_arrive(DQ_FREE_BAR + c, threads)?;
        }
        let more = kb.slot_i32("w_more", kb.i32c(1))?;
        kb.while_loop(
            "dq_half_writer",
            |kb| kb.icmp(IntPredicate::NE, kb.get_i(more, "")?, kb.i32c(0), ""),
            |kb| {
                for c in 0..cfg.consumers {
                    kb.named_bar_sync(DQ_FULL_BAR + c, threads)?;
                    let slot = kb.add(smem, kb.i32c((self.layout.dq_handoff + 16 * c) as i64), "")?;
                    let flag = kb.ld_shared_b32(kb.add(slot, kb.i32c(8), "")?, "half_staged")?;
                    let staged = kb.icmp(IntPredicate::NE, flag, kb.i32c(0), "")?;
                    if c == 0 {
                        kb.set(more, kb.zext32(staged, "")?)?;
                    }
                    kb.if_then(staged, "dq_half", |kb| {
                        let lo = kb.ld_shared_b32(slot, "dst_lo")?;
                        let hi = kb.ld_shared_b32(kb.add(slot, kb.i32c(4), "")?, "dst_hi")?;
                        let dst = join_u64(kb, lo, hi, "dq_half_addr")?;
                        let src =
                            kb.add(smem, kb.i32c((self.layout.dq_stage + c * half_bytes) as i64), "dq_half_stage")?;
                        kb.if_then(lane0, "dq_half_reduce", |kb| {
                            kb.bulk_reduce_add_f32(dst, src, half_bytes)?;
                            kb.bulk_commit_group()?;
                            kb.bulk_wait_group_read(0)
                        })?;
                        kb.named_bar_arrive(DQ_FREE_BAR + c, threads)
                    })?;
                }
                Ok(())
            },
        )?;
        kb.if_then(lane0, "dq_writer_done", |kb| kb.bulk_wait_group(0))
    }

    /// `dq_writer`, a consumer after its walk: the end flag for the writer.
    pub(super) fn dq_writer_end(&self, kb: &mut Kb<'ctx>, env: &Env<'_, 'ctx>) -> R<()> {
        let free = kb.add(env.consumer, kb.i32c(DQ_FREE_BAR as i64), "dq_free_bar")?;
        kb.named_bar_sync_r(free, 128 + 32)?;
        let first = kb.icmp(IntPredicate::EQ, env.ltid, kb.i32c(0), "")?;
        kb.if_then(first, "dq_writer_end", |kb| {
            let slot = self.writer_slot(kb, env)?;
            kb.st_shared_b32(kb.add(slot, kb.i32c(8), "")?, kb.i32c(0))
        })?;
        kb.named_bar_arrive_r(kb.add(env.consumer, kb.i32c(DQ_FULL_BAR as i64), "dq_full_bar")?, 128 + 32)
    }

    fn writer_slot(&self, kb: &Kb<'ctx>, env: &Env<'_, 'ctx>) -> R<IntValue<'ctx>> {
        kb.add(
            kb.add(env.cta.smem, kb.i32c(self.layout.dq_handoff as i64), "")?,
            kb.mul(env.consumer, kb.i32c(16), "")?,
            "dq_writer_slot",
        )
    }

    /// `dq_writer`, a consumer's tile: wait until the writer has read its last half,
    /// stage its own half (its 64 columns, warpgroup fragment order), hand it over.
    pub(super) fn dq_half_to_writer(
        &self,
        kb: &mut Kb<'ctx>,
        env: &Env<'_, 'ctx>,
        dst_tile: IntValue<'ctx>,
        frag: &[[FloatValue<'ctx>; 4]],
    ) -> R<()> {
        kb.section("dQ -> this warpgroup's half of the staging tile, handed to the dQ writer warp")?;
        let half_bytes = CONSUMER_HALF_FLOATS * 4;
        let free = kb.add(env.consumer, kb.i32c(DQ_FREE_BAR as i64), "dq_free_bar")?;
        kb.named_bar_sync_r(free, 128 + 32)?;
        let stage = kb.add(
            kb.add(env.cta.smem, kb.i32c(self.layout.dq_stage as i64), "")?,
            kb.mul(env.consumer, kb.i32c(half_bytes as i64), "")?,
            "dq_half_stage",
        )?;
        let base = kb.add(stage, kb.mul(env.ltid, kb.i32c(8), "")?, "")?;
        for (i, f) in frag.iter().enumerate() {
            for half in 0..2usize {
                let off = wg_fragment_store_offset((2 * i + half) as u32, 0) * 4;
                kb.st_shared_v2_f32(kb.add(base, kb.i32c(off as i64), "")?, f[2 * half], f[2 * half + 1])?;
            }
        }
        kb.fence_proxy_async_shared()?;
        let first = kb.icmp(IntPredicate::EQ, env.ltid, kb.i32c(0), "")?;
        kb.if_then(first, "dq_half_handoff", |kb| {
            let slot = self.writer_slot(kb, env)?;
            let dst = kb.add(dst_tile, kb.zext64(kb.mul(env.consumer, kb.i32c(half_bytes as i64), "")?, "")?, "")?;
            let (lo, hi) = split_u64(kb, dst)?;
            kb.st_shared_b32(slot, lo)?;
            kb.st_shared_b32(kb.add(slot, kb.i32c(4), "")?, hi)?;
            kb.st_shared_b32(kb.add(slot, kb.i32c(8), "")?, kb.i32c(1))
        })?;
        kb.named_bar_arrive_r(kb.add(env.consumer, kb.i32c(DQ_FULL_BAR as i64), "dq_full_bar")?, 128 + 32)
    }
}
