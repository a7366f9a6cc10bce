//! The backward's dQ path in the consumers: dSᵀ into shared memory, dQ = dS·K (or dQᵀ),
//! and dQ into `dq_accum` (per-thread reds, or the bulk staging tile in the consumers'
//! fragment order); the hand-over to a dQ writer warp is `dq_writer`'s.

use super::*;

impl<'ctx> Bwd<'_, 'ctx> {
    /// This tile's dQ (`dq_n` columns from the warpgroup's first) into `dq_accum`: the
    /// bulk staging tile, or per-thread reds.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn add_dq(
        &self,
        kb: &mut Kb<'ctx>,
        env: &Env<'_, 'ctx>,
        n0: IntValue<'ctx>,
        p: QueryPair<'ctx>,
        h: IntValue<'ctx>,
        m: IntValue<'ctx>,
        m0: IntValue<'ctx>,
        dq_n: u32,
        dq: &[FloatValue<'ctx>],
    ) -> R<()> {
        let spec = self.spec;
        let cfg = self.cfg;
        let cta = env.cta;
        let lane = kb.and(env.ltid, kb.i32c(31), "lane")?;
        kb.section("dQ -> dq_accum (red.global.add.v4.f32)")?;
        let col0 = match cfg.dq_split {
            DqSplit::Columns => kb.mul(env.consumer, kb.i32c(dq_n as i64), "dq_col0")?,
            DqSplit::Keys | DqSplit::Rows | DqSplit::Transposed => kb.i32c(0),
        };
        let slices = dq_mode_is(kb, &self.args, DqAccumulation::Slices)?;
        let slice = kb.select_i(slices, kb.sreg("ctaid.x", "")?, kb.i32c(0), "dq_slice")?;
        let frag: Vec<[FloatValue<'ctx>; 4]> = dq.chunks(4).map(|c| [c[0], c[1], c[2], c[3]]).collect();
        let warp = kb.udiv(env.ltid, kb.i32c(32), "warp_in_wg")?;
        let q0 = kb.add(m0, kb.mul(warp, kb.i32c(16), "")?, "dq_q0")?;
        let fl = FragLane { quad_row: kb.udiv(lane, kb.i32c(4), "")?, quad_col: kb.and(lane, kb.i32c(3), "")? };
        let add = |kb: &mut Kb<'ctx>| -> R<()> {
            let dqs = DqSlice::new(kb, spec, &self.args, cta.seqlen_pad, cta.bv.b, slice)?;
            red_dq_fragment(kb, &dqs, h, q0, col0, fl, &frag, true)
        };
        if dq.is_empty() || cfg.diag.no_dq_red {
            return Ok(());
        }
        if cfg.dq_bulk {
            return self.bulk_dq(kb, env, n0, p, h, m, col0, slice, &frag);
        }
        match cfg.dq_split {
            DqSplit::Columns => add(kb),
            // `BwdConfig::check` refuses it (the reds address 64 rows from the tile's first).
            DqSplit::Rows | DqSplit::Transposed => Err(crate::error::LowerError::InvalidSpec(
                "the row and transposed splits of dQ have no per-thread adds (they need the bulk reduce)".into(),
            )),
            DqSplit::Keys => {
                // Both warpgroups add to the same elements: in deterministic mode,
                // consumer 0 first, then consumer 1, each tile.
                let first = kb.icmp(IntPredicate::EQ, env.consumer, kb.i32c(0), "")?;
                kb.if_then(first, "dq_first", |kb| add(kb))?;
                kb.if_then(env.deterministic, "dq_order", |kb| kb.named_bar_sync(ORDER_BAR, 128 * cfg.consumers))?;
                let second = kb.not(first, "")?;
                kb.if_then(second, "dq_second", |kb| add(kb))?;
                kb.if_then(env.deterministic, "dq_order_end", |kb| {
                    kb.named_bar_sync(ORDER_BAR + 1, 128 * cfg.consumers)
                })
            }
        }
    }

    /// dSᵀ into shared memory (dQ's A operand, MN-major: key rows of 64 queries), the
    /// barrier that makes it visible, and the issue of dQ = dS·K (`dq_n` columns);
    /// committed, not waited on.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn gemm_dq(
        &self,
        kb: &mut Kb<'ctx>,
        env: &Env<'_, 'ctx>,
        ring_pos: IntValue<'ctx>,
        wg_rows: IntValue<'ctx>,
        k_wg: IntValue<'ctx>,
        dq_n: u32,
        ds_ops: &[IntValue<'ctx>],
    ) -> R<Vec<FloatValue<'ctx>>> {
        kb.section("dS^T -> shared memory (128B-swizzled key rows)")?;
        let ds_smem = self.ds_smem(kb, env, ring_pos)?;
        self.stage_ds(kb, env, ring_pos, ds_smem, ds_ops)?;
        self.issue_dq(kb, env, ds_smem, wg_rows, k_wg, dq_n)
    }

    /// The shared-memory buffer of dSᵀ for the tile at ring position `ring_pos`.
    fn ds_smem(&self, kb: &Kb<'ctx>, env: &Env<'_, 'ctx>, ring_pos: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        let l = self.layout;
        let ds_buf = match self.cfg.dq_split {
            DqSplit::Columns | DqSplit::Rows | DqSplit::Transposed => {
                let buf = kb.and(ring_pos, kb.i32c(1), "ds_buffer")?;
                kb.add(kb.i32c(l.ds as i64), kb.mul(buf, kb.i32c(l.ds_per_buffer as i64), "")?, "")?
            }
            DqSplit::Keys => kb.i32c(l.ds as i64),
        };
        kb.add(env.cta.smem, ds_buf, "ds_smem")
    }

    /// dSᵀ into its buffer `ds_smem` and the barrier that makes it visible to dQ's GEMM
    /// (after the last staged dQ tile's reduce has read the staging, with the bulk reduce).
    fn stage_ds(
        &self,
        kb: &mut Kb<'ctx>,
        env: &Env<'_, 'ctx>,
        ring_pos: IntValue<'ctx>,
        ds_smem: IntValue<'ctx>,
        ds_ops: &[IntValue<'ctx>],
    ) -> R<()> {
        let cfg = self.cfg;
        let cta = env.cta;
        if !cfg.diag.ds_no_store {
            self.store_ds(kb, env, ds_smem, ds_ops)?;
        }
        kb.fence_proxy_async_shared()?;
        if cfg.dq_bulk && !cfg.dq_writer {
            // The last tile's bulk reduce has read its staging (deterministic: is done)
            // before anyone passes this barrier and refills the staging at this tile's end.
            // Only its issuing thread has a bulk group; the others pass at once.
            if !cfg.diag.dq_no_wait {
                kb.if_else(
                    env.deterministic,
                    "dq_bulk_wait",
                    |kb| kb.bulk_wait_group(0),
                    |kb| kb.bulk_wait_group_read(0),
                )?;
            }
            // Ordered mode: the dQ writer's reduce of the last tile has read the staging.
            kb.if_then(self.ordered_issuer(kb)?, "dq_staging_free", |kb| {
                let parity = kb.xor(kb.and(ring_pos, kb.i32c(1), "")?, kb.i32c(1), "")?;
                kb.mbar_wait(self.bar(kb, cta, Bar::DqFree, kb.i32c(0))?, parity)
            })?;
        }
        match cfg.dq_split {
            DqSplit::Columns | DqSplit::Rows | DqSplit::Transposed => kb.named_bar_sync(DS_BAR, 128 * cfg.consumers),
            DqSplit::Keys => kb.named_bar_sync_r(kb.add(env.consumer, kb.i32c(DS_BAR as i64), "")?, 128),
        }
    }

    /// Issues dQ = dS·K from the dSᵀ at `ds_smem` (`dq_n` columns); committed, not
    /// waited on.
    fn issue_dq(
        &self,
        kb: &mut Kb<'ctx>,
        env: &Env<'_, 'ctx>,
        ds_smem: IntValue<'ctx>,
        wg_rows: IntValue<'ctx>,
        k_wg: IntValue<'ctx>,
        dq_n: u32,
    ) -> R<Vec<FloatValue<'ctx>>> {
        let spec = self.spec;
        let cfg = self.cfg;
        let l = self.layout;
        let cta = env.cta;
        let ty = WgmmaType::from(spec.dtype);
        let bn = cfg.block_n();
        let undef = kb.ctx.f32_type().get_undef();

        if cfg.dq_split == DqSplit::Transposed {
            // ---- dQᵀ = Kᵀ·dSᵀ: A this warpgroup's 64-column block of K read MN-major
            // (its columns on M), B dS as query rows of keys (K-major, two 64-key blocks).
            let bm = cfg.block_m;
            kb.section(&format!("wgmma dQ^T = K^T*dS^T (ss, K MN-major, dS K-major, N = {bm} queries)"))?;
            let k_block = kb.add(
                kb.add(cta.smem, kb.i32c(l.k as i64), "")?,
                kb.mul(env.consumer, kb.i32c((bn * ROW_BYTES) as i64), "")?,
                "k_col_block",
            )?;
            let a0 =
                kb.wgmma_desc(k_block, SmemDesc::mn_major_sw128(0, bn * ROW_BYTES).encode_without_start(), "kt_desc")?;
            let b0 = kb.wgmma_desc(ds_smem, SmemDesc::k_major_sw128(0).encode_without_start(), "ds_kmaj_desc")?;
            let mut dq = vec![undef; (bm / 2) as usize];
            for j in 0..bn / 16 {
                let a = kb.add(a0, kb.i64c((mn_major_step_offset(j) >> 4) as i64), "")?;
                let b = kb.add(b0, kb.i64c((k_major_step_offset(bm, j) >> 4) as i64), "")?;
                let scale = if j == 0 { Acc::Overwrite } else { Acc::Accumulate };
                dq = kb.wgmma_ss(ty, bm, &dq, a, b, scale, Major::Mn, Major::K, "dqt")?;
            }
            kb.wgmma_commit_group()?;
            return Ok(dq);
        }

        // ---- dQ = dS·K
        kb.section("wgmma dQ = dS*K (ss, dS^T MN-major from shared memory)")?;
        let (k_steps, a_start, b_start) = match cfg.dq_split {
            // Half the columns, all the CTA's keys: d128, a 64-column block of K; d64, 32
            // columns into K's one block (an MN-major start inside the 128-byte swizzle
            // row, which the swizzle of the absolute address keeps right, as the K-major
            // k-steps' 32-byte starts do).
            DqSplit::Columns => {
                let (block, within) = (dq_n / BOX_COLS, (dq_n % BOX_COLS) * 2);
                let col_block_bytes = block * bn * ROW_BYTES + within;
                let b = kb.add(
                    kb.add(cta.smem, kb.i32c(l.k as i64), "")?,
                    kb.mul(env.consumer, kb.i32c(col_block_bytes as i64), "")?,
                    "k_col_block",
                )?;
                (bn / 16, ds_smem, b)
            }
            // All the columns, this warpgroup's 64 queries (its block of dSᵀ's key rows),
            // all the CTA's keys.
            DqSplit::Rows => {
                let rows = kb.mul(env.consumer, kb.i32c((bn * ROW_BYTES) as i64), "")?;
                (bn / 16, kb.add(ds_smem, rows, "ds_wg_rows")?, kb.add(cta.smem, kb.i32c(l.k as i64), "k_all")?)
            }
            // All the columns, this warpgroup's keys.
            DqSplit::Keys => (ROWS_PER_CONSUMER / 16, kb.add(ds_smem, wg_rows, "")?, k_wg),
            DqSplit::Transposed => unreachable!("issued above"),
        };
        let q_blocks = cfg.dq_query_blocks();
        let mn = |lbo: u32| SmemDesc::mn_major_sw128(0, lbo).encode_without_start();
        // One m64 GEMM per 64 queries of the tile (dSᵀ holds each 64 in its own block of
        // key rows); their results follow each other.
        let a_descs = (0..q_blocks)
            .map(|rows| {
                let a_rows = kb.add(a_start, kb.i32c((rows * bn * ROW_BYTES) as i64), "ds_rows")?;
                kb.wgmma_desc(a_rows, mn(bn * ROW_BYTES), "ds_desc")
            })
            .collect::<R<Vec<_>>>()?;
        let b0 = kb.wgmma_desc(b_start, mn(bn * ROW_BYTES), "k_mn_desc")?;
        let mut out = Vec::new();
        for a0 in a_descs {
            let mut dq = vec![undef; (dq_n / 2) as usize];
            for j in 0..k_steps {
                let off = kb.i64c((mn_major_step_offset(j) >> 4) as i64);
                let scale = if j == 0 { Acc::Overwrite } else { Acc::Accumulate };
                dq = kb.wgmma_ss(
                    ty,
                    dq_n,
                    &dq,
                    kb.add(a0, off, "")?,
                    kb.add(b0, off, "")?,
                    scale,
                    Major::Mn,
                    Major::Mn,
                    "dq",
                )?;
            }
            out.extend(dq);
        }
        kb.wgmma_commit_group()?;
        Ok(out)
    }

    /// dQ of the tile through shared memory: each thread writes its fragment (query
    /// rows, columns from `col0`) into the f32 staging tile, then one thread adds the
    /// whole `block_m × d_qk` tile (column and row split: both warpgroups' parts; key
    /// split: its own warpgroup's) into `dq_accum` with one bulk reduce. Deterministic
    /// mode with the key split orders the two warpgroups' reduces (each issuer waits for
    /// its reduce to land).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn bulk_dq(
        &self,
        kb: &mut Kb<'ctx>,
        env: &Env<'_, 'ctx>,
        n0: IntValue<'ctx>,
        p: QueryPair<'ctx>,
        h: IntValue<'ctx>,
        m: IntValue<'ctx>,
        col0: IntValue<'ctx>,
        slice: IntValue<'ctx>,
        frag: &[[FloatValue<'ctx>; 4]],
    ) -> R<()> {
        let m0 = kb.mul(m, kb.i32c(self.cfg.block_m as i64), "m0")?;
        let spec = self.spec;
        let cfg = self.cfg;
        let l = self.layout;
        let cta = env.cta;
        let d = spec.head_dim_qk;
        if cfg.dq_writer {
            let (_, dst) = self.dq_tile_at(kb, env, h, m0, slice)?;
            return self.dq_half_to_writer(kb, env, dst, frag);
        }
        kb.section("dQ -> shared staging tile (f32), then one bulk reduce-add into dq_accum")?;
        let stage = kb.add(
            kb.add(cta.smem, kb.i32c(l.dq_stage as i64), "")?,
            kb.mul(env.consumer, kb.i32c(l.dq_stage_per_wg as i64), "")?,
            "dq_stage",
        )?;
        let lane = kb.and(env.ltid, kb.i32c(31), "lane")?;
        let warp = kb.udiv(env.ltid, kb.i32c(32), "warp_in_wg")?;
        let row0 = kb.add(kb.mul(warp, kb.i32c(16), "")?, kb.udiv(lane, kb.i32c(4), "")?, "dq_row0")?;
        let c0 = kb.add(col0, kb.mul(kb.and(lane, kb.i32c(3), "")?, kb.i32c(2), "")?, "dq_c0")?;
        // Column split: the tile in the consumers' fragment order (`dq_accum` holds it so,
        // `DqAccumLayout::ConsumerFragments`): store k of every thread is 256 contiguous
        // bytes. Key split: row-major.
        let layout = cfg.dq_accum_layout();
        let base = match layout {
            // Transposed: the same order over dQᵀ's fragments (pairs of adjacent queries).
            DqAccumLayout::ConsumerFragments | DqAccumLayout::TransposedFragments { .. } => {
                let thread = kb.add(kb.mul(env.consumer, kb.i32c(128), "")?, env.ltid, "frag_thread")?;
                kb.add(stage, kb.mul(thread, kb.i32c(8), "")?, "")?
            }
            // Row split: each warpgroup's own 64-row tile, in its fragment order.
            DqAccumLayout::WarpgroupFragments => {
                let tile = kb.mul(env.consumer, kb.i32c((64 * d * 4) as i64), "wg_tile")?;
                kb.add(kb.add(stage, tile, "")?, kb.mul(env.ltid, kb.i32c(8), "")?, "")?
            }
            DqAccumLayout::RowMajor | DqAccumLayout::ConsumerHalves => {
                kb.add(stage, kb.mul(kb.add(kb.mul(row0, kb.i32c(d as i64), "")?, c0, "")?, kb.i32c(4), "")?, "")?
            }
        };
        // A 128-query tile: two 64-row tiles, one after the other (as in `dq_accum`); a
        // warpgroup's fragment covers both (column split) or its own (row split).
        let chunks_per_rows = frag.len() / cfg.dq_query_blocks() as usize;
        for (c, f) in frag.iter().enumerate() {
            let (rows, i) = ((c / chunks_per_rows) as u32, c % chunks_per_rows);
            for half in 0..2usize {
                if cfg.diag.dq_no_stage {
                    continue;
                }
                let off = rows * 64 * d * 4
                    + match layout {
                        DqAccumLayout::ConsumerFragments | DqAccumLayout::TransposedFragments { .. } => {
                            fragment_store_offset((2 * i + half) as u32, 0) * 4
                        }
                        DqAccumLayout::WarpgroupFragments => wg_fragment_store_offset((2 * i + half) as u32, 0) * 4,
                        DqAccumLayout::RowMajor | DqAccumLayout::ConsumerHalves => {
                            (8 * half as u32 * d + 8 * i as u32) * 4
                        }
                    };
                kb.st_shared_v2_f32(kb.add(base, kb.i32c(off as i64), "")?, f[2 * half], f[2 * half + 1])?;
            }
        }
        if !cfg.diag.dq_no_fence {
            kb.fence_proxy_async_shared()?;
        }
        let issuer = kb.icmp(IntPredicate::EQ, env.ltid, kb.i32c(0), "")?;
        let (row, dst) = self.dq_tile_at(kb, env, h, m0, slice)?;
        let bytes = cfg.block_m * d * 4;
        let issue = |kb: &mut Kb<'ctx>| -> R<()> {
            kb.bulk_reduce_add_f32(dst, stage, bytes)?;
            kb.bulk_commit_group()
        };
        match cfg.dq_split {
            DqSplit::Columns | DqSplit::Rows | DqSplit::Transposed => {
                kb.named_bar_sync(DS_BAR, 128 * cfg.consumers)?;
                let first = kb.icmp(IntPredicate::EQ, env.consumer, kb.i32c(0), "")?;
                let one = kb.and(first, issuer, "dq_issuer")?;
                // Ordered mode: the dQ writer adds the tile in its turn.
                let ordered = self.ordered_issuer(kb)?;
                kb.if_then(ordered, "dq_staged", |kb| {
                    let n = kb.udiv(n0, kb.i32c(cfg.block_n() as i64), "key_tile")?;
                    let mine = cta.turn_key(kb, n, p.m)?;
                    DqHandoff::at(self, cta, kb)?.write(kb, HandoffVals { row, n, mine, h, m })?;
                    kb.mbar_arrive(self.bar(kb, cta, Bar::DqStaged, kb.i32c(0))?)
                })?;
                let mut go = kb.and(one, kb.not(ordered, "")?, "")?;
                if cfg.diag.dq_half {
                    let n = kb.udiv(n0, kb.i32c(cfg.block_n() as i64), "")?;
                    let odd = kb.and(kb.add(n, m, "")?, kb.i32c(1), "")?;
                    go = kb.and(go, kb.icmp(IntPredicate::EQ, odd, kb.i32c(0), "")?, "")?;
                }
                kb.if_then(go, "dq_bulk", issue)
            }
            DqSplit::Keys => {
                kb.named_bar_sync_r(kb.add(env.consumer, kb.i32c(DS_BAR as i64), "")?, 128)?;
                let first = kb.icmp(IntPredicate::EQ, env.consumer, kb.i32c(0), "")?;
                let issue_ordered = |kb: &mut Kb<'ctx>| -> R<()> {
                    issue(kb)?;
                    kb.if_then(env.deterministic, "dq_landed", |kb| kb.bulk_wait_group(0))
                };
                kb.if_then(kb.and(first, issuer, "")?, "dq_bulk_first", issue_ordered)?;
                kb.if_then(env.deterministic, "dq_order", |kb| kb.named_bar_sync(ORDER_BAR, 128 * cfg.consumers))?;
                kb.if_then(kb.and(kb.not(first, "")?, issuer, "")?, "dq_bulk_second", issue_ordered)?;
                kb.if_then(env.deterministic, "dq_order_end", |kb| {
                    kb.named_bar_sync(ORDER_BAR + 1, 128 * cfg.consumers)
                })
            }
        }
    }

    /// The workspace row of query tile `m0` of head `h` and its byte address in `slice` of
    /// `dq_accum` (where a staged tile is added).
    fn dq_tile_at(
        &self,
        kb: &Kb<'ctx>,
        env: &Env<'_, 'ctx>,
        h: IntValue<'ctx>,
        m0: IntValue<'ctx>,
        slice: IntValue<'ctx>,
    ) -> R<(IntValue<'ctx>, IntValue<'ctx>)> {
        let (spec, cta) = (self.spec, env.cta);
        let dqs = DqSlice::new(kb, spec, &self.args, cta.seqlen_pad, cta.bv.b, slice)?;
        let row = ws_row(kb, spec.q_heads, cta.seqlen_pad, cta.bv.b, h, m0)?;
        let dst = kb.add(dqs.base, kb.mul(row, kb.i64c(spec.head_dim_qk as i64 * 4), "")?, "dq_tile_addr")?;
        Ok((row, dst))
    }

    /// Writes this thread's packed dSᵀ (rows: its keys; pairs of adjacent queries) into
    /// the 128B-swizzled key rows at `ds_smem` (64 queries per row; a 128-query tile's
    /// second 64 in a second block of key rows after the first): row `r`'s 16-byte chunk
    /// `c` (queries 8c..8c+7) sits at chunk `c ^ (r % 8)`. A warp's stores of one
    /// 8-column tile and row half hit 8 rows × 4 words on 32 different banks.
    pub(super) fn store_ds(
        &self,
        kb: &Kb<'ctx>,
        env: &Env<'_, 'ctx>,
        ds_smem: IntValue<'ctx>,
        ops: &[IntValue<'ctx>],
    ) -> R<()> {
        let lane = kb.and(env.ltid, kb.i32c(31), "lane")?;
        let warp = kb.udiv(env.ltid, kb.i32c(32), "warp_in_wg")?;
        let block_bytes = (self.cfg.block_n() * ROW_BYTES) as i64;
        if self.cfg.dq_split == DqSplit::Transposed {
            return self.store_ds_transposed(kb, env, ds_smem, ops);
        }
        if ops.len() % 4 == 0 {
            // `stmatrix` x4: packed registers 4g..4g+3 are the 8-column tiles 2g and 2g+1,
            // each in two row halves (matrix j: tile 2g + j / 2, half j % 2). Lane l gives
            // row r = l % 8 of matrix j = l / 8: key row 16·warp + 8·(j % 2) + r, chunk
            // (tile % 8) ^ r = (2g % 8) ^ (j / 2) ^ r of block g / 4.
            let r = kb.and(lane, kb.i32c(7), "stm_row")?;
            let j = kb.udiv(lane, kb.i32c(8), "stm_matrix")?;
            let half = kb.and(j, kb.i32c(1), "")?;
            let jhi = kb.udiv(j, kb.i32c(2), "")?;
            let row = kb.add(
                kb.add(
                    kb.mul(env.consumer, kb.i32c(ROWS_PER_CONSUMER as i64), "")?,
                    kb.mul(warp, kb.i32c(16), "")?,
                    "",
                )?,
                kb.add(kb.mul(half, kb.i32c(8), "")?, r, "")?,
                "stm_key_row",
            )?;
            let row_addr = kb.add(ds_smem, kb.mul(row, kb.i32c(ROW_BYTES as i64), "")?, "stm_row_addr")?;
            let lane_chunk = kb.xor(jhi, r, "stm_chunk")?;
            // One address per chunk pattern (g % 4); the block (g / 4) is the immediate.
            let addrs: Vec<IntValue<'ctx>> = (0..4.min(ops.len() / 4))
                .map(|g| {
                    let chunk = kb.xor(lane_chunk, kb.i32c(2 * g as i64), "")?;
                    kb.add(row_addr, kb.mul(chunk, kb.i32c(16), "")?, "stm_addr")
                })
                .collect::<R<_>>()?;
            for (g, regs) in ops.chunks(4).enumerate() {
                kb.stmatrix_x4(addrs[g % 4], (g / 4) as i64 * block_bytes, [regs[0], regs[1], regs[2], regs[3]])?;
            }
            return Ok(());
        }
        let quad_row = kb.udiv(lane, kb.i32c(4), "quad_row")?;
        let quad_col = kb.and(lane, kb.i32c(3), "quad_col")?;
        let row0 = kb.add(
            kb.mul(env.consumer, kb.i32c(ROWS_PER_CONSUMER as i64), "")?,
            kb.add(kb.mul(warp, kb.i32c(16), "")?, quad_row, "")?,
            "ds_row0",
        )?;
        let row_addr = kb.add(ds_smem, kb.mul(row0, kb.i32c(ROW_BYTES as i64), "")?, "ds_row_addr")?;
        let in_chunk = kb.mul(quad_col, kb.i32c(4), "")?;
        for (k, op) in ops.iter().enumerate() {
            // Packed register k: 8-column tile k / 2, row half k % 2; 8 tiles per block.
            let (tile, half) = ((k / 2) as i64, (k % 2) as i64);
            let (block, tile) = (tile / 8, tile % 8);
            let chunk = kb.xor(kb.i32c(tile), quad_row, "")?;
            let addr = kb.add(
                kb.add(row_addr, kb.i32c(block * block_bytes + half * 8 * ROW_BYTES as i64), "")?,
                kb.add(kb.mul(chunk, kb.i32c(16), "")?, in_chunk, "")?,
                "ds_addr",
            )?;
            kb.st_shared_b32(addr, *op)?;
        }
        Ok(())
    }

    /// The transposed split's dS store: this warpgroup's dSᵀ fragment (its 64 keys ×
    /// the tile's queries) as dS, query rows of keys (K-major B of dQᵀ = Kᵀ·dSᵀ), its keys
    /// in block `consumer` (`block_m` rows of 128 bytes), by `stmatrix.trans`. Group `g`
    /// (packed registers 4g..4g+3: matrix `j` = 8-query tile 2g + j / 2, key half j % 2)
    /// writes query rows 16g + 8 (j / 2) + r, each the 16-byte chunk of keys
    /// 16·warp + 8 (j % 2) .. + 8: chunk (2·warp + j % 2) ^ r of the swizzled row.
    fn store_ds_transposed(
        &self,
        kb: &Kb<'ctx>,
        env: &Env<'_, 'ctx>,
        ds_smem: IntValue<'ctx>,
        ops: &[IntValue<'ctx>],
    ) -> R<()> {
        let bm = self.cfg.block_m;
        if ops.len() % 4 != 0 {
            return Err(crate::error::LowerError::InvalidSpec(format!(
                "transposed dS store: {} packed registers (block_m {bm} is not a multiple of 16)",
                ops.len()
            )));
        }
        let lane = kb.and(env.ltid, kb.i32c(31), "lane")?;
        let warp = kb.udiv(env.ltid, kb.i32c(32), "warp_in_wg")?;
        let r = kb.and(lane, kb.i32c(7), "stm_row")?;
        let j = kb.udiv(lane, kb.i32c(8), "stm_matrix")?;
        let q_row = kb.add(kb.mul(kb.udiv(j, kb.i32c(2), "")?, kb.i32c(8), "")?, r, "stm_q_row")?;
        let chunk = kb.xor(kb.add(kb.mul(warp, kb.i32c(2), "")?, kb.and(j, kb.i32c(1), "")?, "")?, r, "stm_chunk")?;
        let addr = kb.add(
            kb.add(ds_smem, kb.mul(env.consumer, kb.i32c((bm * ROW_BYTES) as i64), "")?, "ds_key_block")?,
            kb.add(kb.mul(q_row, kb.i32c(ROW_BYTES as i64), "")?, kb.mul(chunk, kb.i32c(16), "")?, "")?,
            "stm_addr",
        )?;
        for (g, regs) in ops.chunks(4).enumerate() {
            let off = (16 * g) as i64 * ROW_BYTES as i64;
            kb.stmatrix_x4_trans(addr, off, [regs[0], regs[1], regs[2], regs[3]])?;
        }
        Ok(())
    }
}
