//! The portable backward main kernel: FlashAttention-2's backward on mma.sync.
//!
//! One CTA owns a tile of `block_n` keys of one KV head (each warp 16 keys) and walks the
//! non-empty query tiles of every query head of its KV group, recomputing P from the
//! forward's LSE in the exp2 domain. dK and dV stay in registers for the whole walk (the
//! group's heads summed there, so GQA needs no atomics for them); dQ goes to an f32
//! accumulator in global memory, by atomics or, in deterministic mode, by the one thread
//! that owns each element of the CTA column's slice.
//!
//! ```text
//! load K, V (this CTA's keys, cp.async)
//! for each (query head of the group, non-empty query tile), prefetching the next:
//!   Sᵀ  = K·Qᵀ                       ldmatrix + mma.sync (warp: 16 keys x block_m queries)
//!   P   = 2^(s·log2 e − lse_log2)    score mod and its derivative per element; mask on partial tiles
//!   dV += Pᵀ·dO                      P packed in registers as the A operand
//!   dPᵀ = V·dOᵀ
//!   dS  = P ∘ (dP − D) ∘ m′(score)   (+ learnable aux gradients: dS ∘ ∂m/∂aux)
//!   dK += dSᵀ·Q
//!   dSᵀ → shared memory; bar.sync
//!   dQ[warp's 16 queries] += dS·K     ldmatrix.trans of dSᵀ and K; red.add / owned RMW
//! dK ·= scale; store dK, dV
//! ```
//! A grid column (`ctaid.x`) walks key tiles `ctaid.x, + nctaid.x, ...`: one tile each
//! normally, several in deterministic mode, where the column is also the dQ slice.

use super::config::BwdConfig;
use crate::families::common::abi::{describe, Args};
use crate::families::common::backward::{
    aux_sink, dynamic_smem_base, emit_seqlen_pad, main_params, red_dq_fragment, ws_row, ws_row_align, DqSlice, FragLane,
};
use crate::llvm::kb::{Kb, Slot, R};
use crate::module::{Grid, KernelInfo, KernelRole};
use crate::variant::expr::{self as vexpr, VariantArgs};
use crate::variant::grad::ScoreGrad;
use crate::variant::layout::{batch_view, kv_row_offsets, q_row_offset, BatchView, LayoutArgs};
use crate::variant::tiles::{DenseClasses, QueryPair, QueryTiles};
use attnc_ir::Spec;
use inkwell::values::{FloatValue, IntValue};
use inkwell::{FloatPredicate, IntPredicate};

const LOG2E: f64 = std::f64::consts::LOG2_E;

pub fn build<'ctx>(kb: &mut Kb<'ctx>, spec: &Spec, cfg: &BwdConfig, name: &str) -> R<KernelInfo> {
    let params = main_params(spec);
    let args = Args::begin(kb, name, &params)?;
    if cfg.max_regs > 0 {
        kb.set_max_regs(cfg.max_regs)?;
    }
    kb.section(&format!(
        "attnc portable backward: {} ({} keys x {} queries per tile, {} warps, {} column part(s))",
        spec.name,
        cfg.block_n(),
        cfg.block_m,
        cfg.warps,
        cfg.col_split
    ))?;
    let bwd = Bwd::setup(kb, spec, cfg, args)?;
    bwd.run(kb)?;
    kb.ret()?;
    Ok(KernelInfo {
        name: name.to_string(),
        role: KernelRole::BackwardMain,
        note: (cfg.col_split > 1).then(|| format!("{} CTAs per key tile, each a part of the columns", cfg.col_split)),
        threads_per_block: cfg.threads(),
        dynamic_smem_bytes: cfg.smem_bytes(spec),
        block_m: cfg.block_m,
        block_n: cfg.block_n(),
        params: describe(&params),
        tensor_maps: Vec::new(),
        grid: Grid::KeyTiles { parts: cfg.col_split, ordered_dq: false, pair: false },
    })
}

/// Gives, for row `r` of a tile being loaded, whether it exists and its element offset.
type RowOffset<'a, 'ctx> = &'a dyn Fn(&Kb<'ctx>, IntValue<'ctx>) -> R<(IntValue<'ctx>, IntValue<'ctx>)>;

struct Bwd<'a, 'ctx> {
    spec: &'a Spec,
    cfg: &'a BwdConfig,
    args: Args<'ctx>,
    va: VariantArgs<'ctx>,
    la: LayoutArgs<'ctx>,
    bv: BatchView<'ctx>,
    grad: ScoreGrad,
    /// KV head and the CTA's column part.
    hkv: IntValue<'ctx>,
    part: IntValue<'ctx>,
    tid: IntValue<'ctx>,
    smem: IntValue<'ctx>,
    seqlen_pad: IntValue<'ctx>,
    deterministic: IntValue<'ctx>,
    /// dK, dV accumulators: per thread `(cols / 8) x 4` f32 each (this part's columns).
    dk: Vec<Slot<'ctx>>,
    dv: Vec<Slot<'ctx>>,
}

/// The next pair's load, issued inside a tile after its mid barrier.
struct Prefetch<'ctx> {
    next: QueryPair<'ctx>,
    stage: IntValue<'ctx>,
    has_next: IntValue<'ctx>,
}

/// Shared-memory addresses of a tile's stage, for its sub-tiles.
struct StageBases<'ctx> {
    q: IntValue<'ctx>,
    d_o: IntValue<'ctx>,
    rowvals: IntValue<'ctx>,
    /// The warp's first key row in the K/V tile (16 · warp).
    warp_key0: IntValue<'ctx>,
}

/// The four lane coordinates of the mma.sync fragment layouts.
#[derive(Clone, Copy)]
struct Lane<'ctx> {
    warp: IntValue<'ctx>,
    /// lane % 8, (lane / 8) % 2, lane / 16: ldmatrix row addressing.
    l8: IntValue<'ctx>,
    l8_bit: IntValue<'ctx>,
    l16: IntValue<'ctx>,
    /// lane / 4 and lane % 4: the accumulator fragment's row and column pair.
    quad_row: IntValue<'ctx>,
    quad_col: IntValue<'ctx>,
}

impl<'a, 'ctx> Bwd<'a, 'ctx> {
    fn setup(kb: &mut Kb<'ctx>, spec: &'a Spec, cfg: &'a BwdConfig, args: Args<'ctx>) -> R<Bwd<'a, 'ctx>> {
        let tid = kb.sreg("tid.x", "tid")?;
        let y = kb.sreg("ctaid.y", "head_part")?;
        let b = kb.sreg("ctaid.z", "b")?;
        let cs = kb.i32c(cfg.col_split as i64);
        let (hkv, part) =
            if cfg.col_split > 1 { (kb.udiv(y, cs, "hkv")?, kb.urem(y, cs, "part")?) } else { (y, kb.i32c(0)) };
        let la = args.layout()?;
        let bv = batch_view(kb, spec, &la, b)?;
        let smem = dynamic_smem_base(kb)?;
        let va = args.variant(spec)?;
        let seqlen_pad = emit_seqlen_pad(kb, la.seqlen_q, ws_row_align(cfg.block_m))?;
        let det = args.int("deterministic")?;
        let deterministic = kb.icmp(IntPredicate::NE, det, kb.i32c(0), "deterministic")?;
        let mut dk = Vec::new();
        let mut dv = Vec::new();
        for i in 0..cfg.acc_cols(spec.head_dim_qk) / 8 * 4 {
            dk.push(kb.slot_f32(&format!("dk{i}"), kb.f32c(0.0))?);
        }
        for i in 0..cfg.acc_cols(spec.head_dim_v) / 8 * 4 {
            dv.push(kb.slot_f32(&format!("dv{i}"), kb.f32c(0.0))?);
        }
        Ok(Bwd {
            spec,
            cfg,
            args,
            va,
            la,
            bv,
            grad: ScoreGrad::new(spec),
            hkv,
            part,
            tid,
            smem,
            seqlen_pad,
            deterministic,
            dk,
            dv,
        })
    }

    fn lane(&self, kb: &Kb<'ctx>) -> R<Lane<'ctx>> {
        let tid = kb.opaque_i32(self.tid, "tid_lane")?;
        let lane = kb.and(tid, kb.i32c(31), "lane")?;
        Ok(Lane {
            warp: kb.udiv(tid, kb.i32c(32), "warp")?,
            l8: kb.and(lane, kb.i32c(7), "")?,
            l8_bit: kb.and(kb.udiv(lane, kb.i32c(8), "")?, kb.i32c(1), "")?,
            l16: kb.udiv(lane, kb.i32c(16), "")?,
            quad_row: kb.udiv(lane, kb.i32c(4), "quad_row")?,
            quad_col: kb.and(lane, kb.i32c(3), "quad_col")?,
        })
    }

    fn group(&self) -> u32 {
        self.spec.group_size()
    }

    fn head(&self, kb: &Kb<'ctx>, g: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        kb.add(kb.mul(self.hkv, kb.i32c(self.group() as i64), "")?, g, "h")
    }

    /// The query-tile walk for the key tile at `n0`.
    fn queries(&self, kb: &Kb<'ctx>, n0: IntValue<'ctx>) -> R<QueryTiles<'_, 'ctx>> {
        let k_hi = kb.sub(
            kb.smin(kb.add(n0, kb.i32c(self.cfg.block_n() as i64), "")?, self.bv.seqlen_k, "")?,
            kb.i32c(1),
            "k_hi",
        )?;
        let n = kb.udiv(n0, kb.i32c(self.cfg.block_n() as i64), "key_tile")?;
        let classes = DenseClasses::for_key_tile(self.spec, self.args.block_lists().as_ref(), self.bv.b, n);
        Ok(QueryTiles {
            spec: self.spec,
            block_m: self.cfg.block_m,
            bv: self.bv,
            hkv: self.hkv,
            k: (n0, k_hi),
            va: &self.va,
            classes,
            rotation: None,
            probes: 1,
        })
    }

    fn run(&self, kb: &mut Kb<'ctx>) -> R<()> {
        let cfg = self.cfg;
        let bn = cfg.block_n() as i64;
        let bm = cfg.block_m as i64;
        let n_tiles = kb.ceil_div(self.bv.seqlen_k, kb.i32c(bn), "n_tiles")?;
        let m_tiles = kb.ceil_div(self.bv.seqlen_q, kb.i32c(bm), "m_tiles")?;
        let n_slot = kb.slot_i32("key_tile", kb.sreg("ctaid.x", "")?)?;
        kb.while_loop(
            "key_tiles",
            |kb| kb.icmp(IntPredicate::SLT, kb.get_i(n_slot, "")?, n_tiles, ""),
            |kb| {
                let n = kb.get_i(n_slot, "n")?;
                self.key_tile(kb, n, m_tiles)?;
                kb.set(n_slot, kb.add(n, kb.sreg("nctaid.x", "")?, "")?)
            },
        )
    }

    /// Everything for key tile `n`: its query walk and its dK, dV. The next pair's Q and
    /// dO load into the other stage after the current tile's mid barrier (every warp is
    /// then past the previous tile, the last reader of that stage) and overlap the tile's
    /// second phase.
    fn key_tile(&self, kb: &mut Kb<'ctx>, n: IntValue<'ctx>, m_tiles: IntValue<'ctx>) -> R<()> {
        let n0 = kb.mul(n, kb.i32c(self.cfg.block_n() as i64), "n0")?;
        for s in self.dk.iter().chain(&self.dv) {
            kb.set(*s, kb.f32c(0.0))?;
        }
        kb.section("load K, V tile (cp.async)")?;
        self.load_kv(kb, n0)?;
        let qt = self.queries(kb, n0)?;
        let first = qt.advance(kb, m_tiles, kb.i32c(0), kb.i32c(0))?;
        let has = kb.icmp(IntPredicate::SLT, first.m, m_tiles, "")?;
        kb.if_then(has, "prologue", |kb| self.load_q_tile(kb, first, kb.i32c(0)))?;
        kb.cp_async_commit()?;

        let g_slot = kb.slot_i32("g", first.g)?;
        let m_slot = kb.slot_i32("m", first.m)?;
        let stage = kb.slot_i32("stage", kb.i32c(0))?;
        kb.while_loop(
            "q_loop",
            |kb| kb.icmp(IntPredicate::SLT, kb.get_i(m_slot, "")?, m_tiles, ""),
            |kb| {
                let cur = QueryPair { g: kb.get_i(g_slot, "g")?, m: kb.get_i(m_slot, "m")? };
                let st = kb.get_i(stage, "st")?;
                let next = qt.advance(kb, m_tiles, cur.g, kb.add(cur.m, kb.i32c(1), "")?)?;
                let other = if self.cfg.stages == 2 { kb.xor(st, kb.i32c(1), "")? } else { st };
                let has_next = kb.icmp(IntPredicate::SLT, next.m, m_tiles, "has_next")?;
                kb.cp_async_wait(0)?;
                kb.bar_sync()?;
                let prefetch = Prefetch { next, stage: other, has_next };
                self.tile(kb, &qt, n0, cur, st, &prefetch)?;
                if self.cfg.stages == 1 {
                    // One buffer: the next tile loads after every warp is done with this one.
                    kb.bar_sync()?;
                    kb.if_then(has_next, "load_next", |kb| self.load_q_tile(kb, next, other))?;
                    kb.cp_async_commit()?;
                }
                kb.set(g_slot, next.g)?;
                kb.set(m_slot, next.m)?;
                kb.set(stage, other)
            },
        )?;
        kb.cp_async_wait(0)?;
        // Every warp done with K, V, Pᵀ and dSᵀ before the store and the next key tile.
        kb.bar_sync()?;
        self.store_dk_dv(kb, n0)
    }

    // ------------------------------------------------------------------ loads

    /// cp.async of `rows` rows of `d` halves from row addresses `row_addr(r)` (valid when
    /// `r` is inside, zero-filled otherwise) into `smem_off`, padded rows.
    fn cp_rows(
        &self,
        kb: &mut Kb<'ctx>,
        rows: u32,
        d: u32,
        smem_off: IntValue<'ctx>,
        base: IntValue<'ctx>,
        row_off: RowOffset<'_, 'ctx>,
    ) -> R<()> {
        let cfg = self.cfg;
        let chunks_per_row = d / 8;
        let total = rows * chunks_per_row;
        let rb = cfg.row_bytes(d) as i64;
        let tid = kb.opaque_i32(self.tid, "tid_load")?;
        for it in 0..total.div_ceil(cfg.threads()) {
            let c = kb.add(tid, kb.i32c((it * cfg.threads()) as i64), "chunk")?;
            let guard = ((it + 1) * cfg.threads() > total)
                .then(|| kb.icmp(IntPredicate::SLT, c, kb.i32c(total as i64), ""))
                .transpose()?;
            let body = |kb: &mut Kb<'ctx>| -> R<()> {
                let row = kb.udiv(c, kb.i32c(chunks_per_row as i64), "")?;
                let chunk = kb.urem(c, kb.i32c(chunks_per_row as i64), "")?;
                let (valid, off) = row_off(kb, row)?;
                let off = kb.add(off, kb.mul(kb.zext64(chunk, "")?, kb.i64c(8), "")?, "")?;
                let gaddr = kb.add(base, kb.mul(off, kb.i64c(2), "")?, "")?;
                let gaddr = kb.select_i(valid, gaddr, base, "")?;
                let bytes = kb.select_i(valid, kb.i32c(16), kb.i32c(0), "")?;
                let saddr = kb.add(
                    kb.add(kb.add(self.smem, smem_off, "")?, kb.mul(row, kb.i32c(rb), "")?, "")?,
                    kb.mul(chunk, kb.i32c(16), "")?,
                    "",
                )?;
                kb.cp_async_16(saddr, gaddr, bytes)
            };
            match guard {
                Some(g) => kb.if_then(g, "chunk_guard", body)?,
                None => body(kb)?,
            }
        }
        Ok(())
    }

    /// K and V rows of the key tile; keys past seqlen_k are zero-filled.
    fn load_kv(&self, kb: &mut Kb<'ctx>, n0: IntValue<'ctx>) -> R<()> {
        let spec = self.spec;
        let (k_st, v_st) = (self.args.strides("k")?, self.args.strides("v")?);
        for (which, d, off) in
            [("k", spec.head_dim_qk, self.cfg.k_offset()), ("v", spec.head_dim_v, self.cfg.v_offset(spec))]
        {
            let base = self.args.int(which)?;
            let row_off = |kb: &Kb<'ctx>, r: IntValue<'ctx>| -> R<(IntValue<'ctx>, IntValue<'ctx>)> {
                let key = kb.add(n0, r, "key")?;
                let valid = kb.icmp(IntPredicate::SLT, key, self.bv.seqlen_k, "")?;
                let key = kb.select_i(valid, key, kb.i32c(0), "")?;
                let (ko, vo) = kv_row_offsets(kb, spec, &self.la, &self.bv, &k_st, &v_st, key, self.hkv)?;
                Ok((valid, if which == "k" { ko } else { vo }))
            };
            self.cp_rows(kb, self.cfg.block_n(), d, kb.i32c(off as i64), base, &row_off)?;
        }
        Ok(())
    }

    /// Q, dO rows and their lse_log2 and D values of pair `p` into stage `stage`.
    fn load_q_tile(&self, kb: &mut Kb<'ctx>, p: QueryPair<'ctx>, stage: IntValue<'ctx>) -> R<()> {
        let spec = self.spec;
        let cfg = self.cfg;
        let h = self.head(kb, p.g)?;
        let m0 = kb.mul(p.m, kb.i32c(cfg.block_m as i64), "m0")?;
        for (which, d, off, stage_bytes) in [
            ("q", spec.head_dim_qk, cfg.q_offset(spec), cfg.q_stage_bytes(spec)),
            ("do", spec.head_dim_v, cfg.do_offset(spec), cfg.do_stage_bytes(spec)),
        ] {
            let st = self.args.strides(which)?;
            let base = self.args.int(which)?;
            let row_off = |kb: &Kb<'ctx>, r: IntValue<'ctx>| -> R<(IntValue<'ctx>, IntValue<'ctx>)> {
                let q = kb.add(m0, r, "query")?;
                let valid = kb.icmp(IntPredicate::SLT, q, self.bv.seqlen_q, "")?;
                let q = kb.select_i(valid, q, kb.i32c(0), "")?;
                Ok((valid, q_row_offset(kb, &self.bv, &st, q, h)?))
            };
            let soff = kb.add(kb.i32c(off as i64), kb.mul(stage, kb.i32c(stage_bytes as i64), "")?, "")?;
            self.cp_rows(kb, cfg.block_m, d, soff, base, &row_off)?;
        }
        // lse_log2 then D: block_m f32 each, 16-byte chunks of the padded workspace rows.
        let tid = kb.opaque_i32(self.tid, "tid_rowvals")?;
        let chunks = cfg.block_m / 4;
        let in_range = kb.icmp(IntPredicate::ULT, tid, kb.i32c(2 * chunks as i64), "")?;
        kb.if_then(in_range, "rowvals", |kb| {
            let which = kb.udiv(tid, kb.i32c(chunks as i64), "")?;
            let chunk = kb.urem(tid, kb.i32c(chunks as i64), "")?;
            let lse = kb.icmp(IntPredicate::EQ, which, kb.i32c(0), "")?;
            let base = kb.select_i(lse, self.args.int("lse_log2")?, self.args.int("dpsum")?, "")?;
            let row = ws_row(
                kb,
                spec.q_heads,
                self.seqlen_pad,
                self.bv.b,
                h,
                kb.add(m0, kb.mul(chunk, kb.i32c(4), "")?, "")?,
            )?;
            let gaddr = kb.add(base, kb.mul(row, kb.i64c(4), "")?, "")?;
            let saddr = kb.add(
                kb.add(self.smem, kb.i32c(cfg.rowvals_offset(spec) as i64), "")?,
                kb.add(
                    kb.mul(stage, kb.i32c(cfg.rowvals_stage_bytes() as i64), "")?,
                    kb.add(kb.mul(which, kb.i32c(cfg.block_m as i64 * 4), "")?, kb.mul(chunk, kb.i32c(16), "")?, "")?,
                    "",
                )?,
                "",
            )?;
            kb.cp_async_16(saddr, gaddr, kb.i32c(16))
        })
    }

    // ------------------------------------------------------------------ one tile

    /// The GEMM `acc[nt] += A·B` over `k_steps` steps of 16 for one warp: A rows from
    /// `a_lane` (ldmatrix, `a_trans`), B from `b_lane` (`b_trans`: B stored k-major as
    /// [k][n] rows, else as [n][k] rows), `n8` output tiles of 8 columns.
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        &self,
        kb: &Kb<'ctx>,
        acc: &mut [[FloatValue<'ctx>; 4]],
        a_lane: IntValue<'ctx>,
        a_step: i64,
        a_trans: bool,
        b_lane: IntValue<'ctx>,
        b_step: i64,
        b_tile: i64,
        b_trans: bool,
        k_steps: u32,
        name: &str,
    ) -> R<()> {
        let n8 = acc.len();
        for kk in 0..k_steps as i64 {
            let a = kb.ldmatrix_x4(a_lane, kk * a_step, a_trans, &format!("{name}_a"))?;
            for np in 0..n8 / 2 {
                let bf = kb.ldmatrix_x4(b_lane, kk * b_step + np as i64 * b_tile, b_trans, &format!("{name}_b"))?;
                // Both addressings put n tile 2·np in registers 0, 1 and 2·np + 1 in 2, 3.
                acc[2 * np] = kb.mma_m16n8k16(self.spec.dtype, a, [bf[0], bf[1]], acc[2 * np], name)?;
                acc[2 * np + 1] = kb.mma_m16n8k16(self.spec.dtype, a, [bf[2], bf[3]], acc[2 * np + 1], name)?;
            }
        }
        Ok(())
    }

    /// Lane address of an A operand (16 rows from `row0`, row-major `rb`-byte rows).
    fn a_lane(
        &self,
        kb: &Kb<'ctx>,
        l: &Lane<'ctx>,
        base: IntValue<'ctx>,
        row0: IntValue<'ctx>,
        rb: i64,
    ) -> R<IntValue<'ctx>> {
        let r = kb.add(row0, kb.add(l.l8, kb.mul(l.l8_bit, kb.i32c(8), "")?, "")?, "")?;
        kb.add(base, kb.add(kb.mul(r, kb.i32c(rb), "")?, kb.mul(l.l16, kb.i32c(16), "")?, "")?, "a_lane")
    }
    /// Lane address of a B operand stored [n][k] (non-transposed ldmatrix), and of an A
    /// operand stored [k][m] (ldmatrix.trans: the same addressing).
    fn b_lane(&self, kb: &Kb<'ctx>, l: &Lane<'ctx>, base: IntValue<'ctx>, rb: i64) -> R<IntValue<'ctx>> {
        let r = kb.add(l.l8, kb.mul(l.l16, kb.i32c(8), "")?, "")?;
        kb.add(base, kb.add(kb.mul(r, kb.i32c(rb), "")?, kb.mul(l.l8_bit, kb.i32c(16), "")?, "")?, "b_lane")
    }
    /// Lane address of a B operand stored [k][n] (ldmatrix.trans).
    fn t_lane(&self, kb: &Kb<'ctx>, l: &Lane<'ctx>, base: IntValue<'ctx>, rb: i64) -> R<IntValue<'ctx>> {
        let r = kb.add(l.l8, kb.mul(l.l8_bit, kb.i32c(8), "")?, "")?;
        kb.add(base, kb.add(kb.mul(r, kb.i32c(rb), "")?, kb.mul(l.l16, kb.i32c(16), "")?, "")?, "t_lane")
    }

    /// Query pair `cur` against the CTA's keys at `n0`, stage `st`.
    fn tile(
        &self,
        kb: &mut Kb<'ctx>,
        qt: &QueryTiles<'_, 'ctx>,
        n0: IntValue<'ctx>,
        cur: QueryPair<'ctx>,
        st: IntValue<'ctx>,
        prefetch: &Prefetch<'ctx>,
    ) -> R<()> {
        let spec = self.spec;
        let cfg = self.cfg;
        let bm = cfg.block_m as i64;
        let h = self.head(kb, cur.g)?;
        let m0 = kb.mul(cur.m, kb.i32c(bm), "m0")?;
        let l = self.lane(kb)?;
        let rbq = cfg.row_bytes(spec.head_dim_qk) as i64;
        let q_base = kb.add(
            self.smem,
            kb.add(kb.i32c(cfg.q_offset(spec) as i64), kb.mul(st, kb.i32c(cfg.q_stage_bytes(spec) as i64), "")?, "")?,
            "q_stage",
        )?;
        let do_base = kb.add(
            self.smem,
            kb.add(kb.i32c(cfg.do_offset(spec) as i64), kb.mul(st, kb.i32c(cfg.do_stage_bytes(spec) as i64), "")?, "")?,
            "do_stage",
        )?;
        let rowvals = kb.add(
            self.smem,
            kb.add(
                kb.i32c(cfg.rowvals_offset(spec) as i64),
                kb.mul(st, kb.i32c(cfg.rowvals_stage_bytes() as i64), "")?,
                "",
            )?,
            "rowvals",
        )?;
        // The warp's key group (16 keys) and half (its share of the queries in the first
        // phase, of the dK and dV columns in the second).
        let kgs = kb.i32c(cfg.key_groups() as i64);
        let key_group = kb.urem(l.warp, kgs, "key_group")?;
        let half = kb.udiv(l.warp, kgs, "half")?;
        let warp_key0 = kb.mul(key_group, kb.i32c(16), "warp_key0")?;
        let zero = kb.f32c(0.0);

        // Partial tiles: keys past seqlen_k, queries past seqlen_q and the mask to P = 0.
        let k_inside =
            kb.icmp(IntPredicate::SLE, kb.add(n0, kb.i32c(cfg.block_n() as i64), "")?, self.bv.seqlen_k, "")?;
        let unmasked = kb.and(qt.full_inside(kb, cur.m, h)?, k_inside, "unmasked")?;
        let bases = StageBases { q: q_base, d_o: do_base, rowvals, warp_key0 };
        // ---- phase 1: the warp's queries (1 / halves of the tile) in sub-tiles of q_sub
        // rows: S and dP of one sub-tile live at a time.
        let rows = cfg.block_m / cfg.halves;
        let q_warp = kb.mul(half, kb.i32c(rows as i64), "q_warp")?;
        let subs = rows / cfg.q_sub;
        if subs == 1 {
            self.sub_tile(kb, &l, n0, h, m0, q_warp, unmasked, &bases)?;
        } else {
            kb.for_range(kb.i32c(0), kb.i32c(subs as i64), "q_sub", |kb, sub| {
                let l = self.lane(kb)?;
                let q_off = kb.add(q_warp, kb.mul(sub, kb.i32c(cfg.q_sub as i64), "")?, "q_off")?;
                self.sub_tile(kb, &l, n0, h, m0, q_off, unmasked, &bases)
            })?;
        }
        let ds_base = kb.add(self.smem, kb.i32c(cfg.ds_offset(spec) as i64), "ds_smem")?;
        let p_base = kb.add(self.smem, kb.i32c(cfg.p_offset(spec) as i64), "p_smem")?;
        let rbs = cfg.ds_row_bytes() as i64;
        kb.bar_sync()?;
        if cfg.stages == 2 {
            // Every warp is past the previous tile (the other stage's last reader).
            kb.section("prefetch next Q, dO tile (cp.async)")?;
            kb.if_then(prefetch.has_next, "prefetch", |kb| self.load_q_tile(kb, prefetch.next, prefetch.stage))?;
            kb.cp_async_commit()?;
        }

        // ---- phase 2: dV += Pᵀ·dO, dK += dSᵀ·Q for the key group and the warp's columns,
        // over all the tile's queries (A operands from shared memory).
        let l = self.lane(kb)?;
        let half = kb.udiv(l.warp, kgs, "half")?;
        let key_group = kb.urem(l.warp, kgs, "key_group")?;
        let warp_key0 = kb.mul(key_group, kb.i32c(16), "warp_key0")?;
        let rbv = cfg.row_bytes(spec.head_dim_v) as i64;
        for (acc, a_base, b_base, rb, d) in
            [(&self.dv, p_base, do_base, rbv, spec.head_dim_v), (&self.dk, ds_base, q_base, rbq, spec.head_dim_qk)]
        {
            let cols = cfg.acc_cols(d);
            let col0 = kb.mul(
                kb.add(kb.mul(self.part, kb.i32c(cfg.halves as i64), "")?, half, "")?,
                kb.i32c(cols as i64 * 2),
                "acc_col0_bytes",
            )?;
            let a = self.a_lane(kb, &l, a_base, warp_key0, rbs)?;
            let b = self.t_lane(kb, &l, kb.add(b_base, col0, "")?, rb)?;
            kb.section(if d == spec.head_dim_v && acc.as_ptr() == self.dv.as_ptr() {
                "tcore dV += P^T*dO (mma.sync, P^T from shared memory)"
            } else {
                "tcore dK += dS^T*Q (mma.sync, dS^T from shared memory)"
            })?;
            self.accumulate(kb, acc, a, b, rb, cols)?;
        }

        // ---- dQ += dS·K: each warp 16 query rows x a share of the columns
        kb.section("tcore dQ += dS*K (mma.sync, ldmatrix.trans) -> dq_accum")?;
        let l = self.lane(kb)?;
        let rg = kb.i32c(cfg.dq_row_groups() as i64);
        let row_group = kb.urem(l.warp, rg, "dq_row_group")?;
        let col_group = kb.udiv(l.warp, rg, "dq_col_group")?;
        let ds_a = self.b_lane(kb, &l, kb.add(ds_base, kb.mul(row_group, kb.i32c(32), "")?, "")?, rbs)?;
        let dq_cols = spec.head_dim_qk / cfg.col_split / cfg.dq_col_groups();
        let q0 = kb.add(m0, kb.mul(row_group, kb.i32c(16), "")?, "dq_q0")?;
        for chunk in 0..dq_cols.div_ceil(64) {
            let cols = (dq_cols - chunk * 64).min(64);
            let col0 = kb.add(
                kb.mul(
                    kb.add(kb.mul(self.part, kb.i32c(cfg.dq_col_groups() as i64), "")?, col_group, "")?,
                    kb.i32c(dq_cols as i64),
                    "",
                )?,
                kb.i32c(chunk as i64 * 64),
                "dq_col0",
            )?;
            let k_t = self.t_lane(
                kb,
                &l,
                kb.add(kb.add(self.smem, kb.i32c(cfg.k_offset() as i64), "")?, kb.mul(col0, kb.i32c(2), "")?, "")?,
                rbq,
            )?;
            let mut acc = vec![[zero; 4]; (cols / 8) as usize];
            // A = dS (queries x keys): ldmatrix.trans of dSᵀ; k steps of 16 keys.
            self.gemm(kb, &mut acc, ds_a, 16 * rbs, true, k_t, 16 * rbq, 32, true, cfg.block_n() / 16, "dq")?;
            self.add_dq(kb, &l, h, q0, col0, &acc)?;
        }
        Ok(())
    }

    /// One sub-tile of `q_sub` query rows (from `q_off` in the tile at `m0`) against the
    /// CTA's keys: Sᵀ, P, dV, dPᵀ, dS (and aux gradients), dK, dSᵀ to shared memory.
    #[allow(clippy::too_many_arguments)]
    fn sub_tile(
        &self,
        kb: &mut Kb<'ctx>,
        l: &Lane<'ctx>,
        n0: IntValue<'ctx>,
        h: IntValue<'ctx>,
        m0: IntValue<'ctx>,
        q_off: IntValue<'ctx>,
        unmasked: IntValue<'ctx>,
        st: &StageBases<'ctx>,
    ) -> R<()> {
        let spec = self.spec;
        let cfg = self.cfg;
        let bm = cfg.block_m as i64;
        let n8 = (cfg.q_sub / 8) as usize;
        let (rbq, rbv) = (cfg.row_bytes(spec.head_dim_qk) as i64, cfg.row_bytes(spec.head_dim_v) as i64);
        // This sub-tile's query rows of the stage.
        let q_base = kb.add(st.q, kb.mul(q_off, kb.i32c(rbq), "")?, "q_sub_base")?;
        let do_base = kb.add(st.d_o, kb.mul(q_off, kb.i32c(rbv), "")?, "do_sub_base")?;
        let rowvals = st.rowvals;
        let warp_key0 = st.warp_key0;
        let zero = kb.f32c(0.0);

        // ---- Sᵀ = K·Qᵀ
        kb.section("tcore S^T = K*Q^T (mma.sync m16n8k16)")?;
        let k_a = self.a_lane(kb, l, kb.add(self.smem, kb.i32c(cfg.k_offset() as i64), "")?, warp_key0, rbq)?;
        let q_b = self.b_lane(kb, l, q_base, rbq)?;
        let mut s = vec![[zero; 4]; n8];
        self.gemm(kb, &mut s, k_a, 32, false, q_b, 32, 16 * rbq, false, spec.head_dim_qk / 16, "s")?;

        // ---- P, and what the score mod's derivative needs
        kb.section("softmax recompute: P = 2^(s - lse_log2) (exp2 domain)")?;
        let key_of = |kb: &Kb<'ctx>, e: usize| -> R<IntValue<'ctx>> {
            kb.add(kb.add(n0, warp_key0, "")?, kb.add(l.quad_row, kb.i32c(if e >= 2 { 8 } else { 0 }), "")?, "key")
        };
        // Column (query within the tile) of element e of 8-column tile nt of this sub-tile.
        let col_of = |kb: &Kb<'ctx>, nt: usize, e: usize| -> R<IntValue<'ctx>> {
            let c = kb.add(kb.mul(l.quad_col, kb.i32c(2), "")?, kb.i32c((nt * 8 + e % 2) as i64), "")?;
            kb.add(q_off, c, "q_col")
        };
        let mut slope: Vec<Option<FloatValue<'ctx>>> = vec![None; n8 * 4];
        let mut pre_d: Vec<Vec<Option<FloatValue<'ctx>>>> = vec![Vec::new(); n8 * 4];
        // lse_log2 and D of the thread's two query columns of 8-column tile `nt`
        // (8·nt + 2·quad_col + {0, 1}), read where they are used: 2 live values, not 16.
        let row_vals = |kb: &Kb<'ctx>, nt: usize, off: i64, name: &str| -> R<[FloatValue<'ctx>; 2]> {
            let mut v = [kb.f32c(0.0); 2];
            for (c, x) in v.iter_mut().enumerate() {
                let col = col_of(kb, nt, c)?;
                *x = kb.ld_shared_f32(
                    kb.add(rowvals, kb.add(kb.mul(col, kb.i32c(4), "")?, kb.i32c(off), "")?, "")?,
                    name,
                )?;
            }
            Ok(v)
        };
        for nt in 0..n8 {
            let lse2s = row_vals(kb, nt, 0, "lse_log2")?;
            for e in 0..4 {
                let col = col_of(kb, nt, e)?;
                let lse2 = lse2s[e % 2];
                let s2 = if self.grad.has_score_mod() {
                    let vars = self.bv.elem_vars(self.hkv, kb.add(m0, col, "q")?, h, key_of(kb, e)?);
                    let el = self.grad.logit(kb, spec, s[nt][e], vars, &self.va)?;
                    slope[nt * 4 + e] = el.slope;
                    pre_d[nt * 4 + e] = el.aux_d;
                    el.s_log2
                } else {
                    kb.fmul(s[nt][e], kb.f32c(spec.scale_value() * LOG2E), "s_log2")?
                };
                s[nt][e] = kb.ex2(kb.fsub(s2, lse2, "")?, "p")?;
            }
        }
        // Partial tiles: keys past seqlen_k, queries past seqlen_q and the mask to P = 0.
        let mut p_slots = Vec::new();
        for frag in &s {
            for v in frag {
                p_slots.push(kb.slot_f32("p", *v)?);
            }
        }
        let partial = kb.not(unmasked, "partial_tile")?;
        kb.if_then(partial, "mask_tile", |kb| {
            kb.section("mask (partial tile)")?;
            let predicate = spec.mask.to_predicate();
            for nt in 0..n8 {
                for e in 0..4 {
                    let q = kb.add(m0, col_of(kb, nt, e)?, "q")?;
                    let vars = self.bv.elem_vars(self.hkv, q, h, key_of(kb, e)?);
                    let q_in = kb.icmp(IntPredicate::SLT, q, self.bv.seqlen_q, "q_in_bounds")?;
                    let allowed = kb.and(vexpr::allowed(kb, spec, predicate.as_ref(), &vars, &self.va)?, q_in, "")?;
                    let slot = p_slots[nt * 4 + e];
                    let v = kb.get_f(slot, "")?;
                    kb.set(slot, kb.select_f(allowed, v, kb.f32c(0.0), "p_masked")?)?;
                }
            }
            Ok(())
        })?;
        for nt in 0..n8 {
            for e in 0..4 {
                s[nt][e] = kb.get_f(p_slots[nt * 4 + e], "p")?;
            }
        }

        // ---- P in the element type: the A operand of dV += Pᵀ·dO, and (unpacked) the P
        // of dS. Keeping only the packed copy frees 16 registers next to dK and dV; dS is
        // rounded to the element type for its GEMMs anyway. Learnable aux gradients are
        // the exception: they sum dS·∂m/∂aux in f32 over many keys, a sum that can cancel
        // (Σ_k dS = 0 for a position bias), so they keep the f32 P.
        let pack = |kb: &Kb<'ctx>, f: &[[FloatValue<'ctx>; 4]], j: usize| -> R<[IntValue<'ctx>; 4]> {
            let (t0, t1) = (f[2 * j], f[2 * j + 1]);
            Ok([
                kb.pack_half2(spec.dtype, t0[0], t0[1], "a01")?,
                kb.pack_half2(spec.dtype, t0[2], t0[3], "a23")?,
                kb.pack_half2(spec.dtype, t1[0], t1[1], "a45")?,
                kb.pack_half2(spec.dtype, t1[2], t1[3], "a67")?,
            ])
        };
        let p_ops = (0..n8 / 2).map(|j| pack(kb, &s, j)).collect::<R<Vec<_>>>()?;
        // Element (nt, e) of a packed fragment set: register (nt % 2)·2 + e / 2 of k step
        // nt / 2, low half for even e.
        let unpack_p = |kb: &Kb<'ctx>, nt: usize, e: usize| -> R<FloatValue<'ctx>> {
            let (lo, hi) = kb.unpack_half2(spec.dtype, p_ops[nt / 2][(nt % 2) * 2 + e / 2], "p")?;
            Ok(if e % 2 == 0 { lo } else { hi })
        };

        // ---- Pᵀ → shared memory (the A operand of dV += Pᵀ·dO in the second phase)
        kb.section("P^T -> shared memory")?;
        self.store_transposed(kb, l, cfg.p_offset(spec), warp_key0, &col_of, &p_ops)?;

        // ---- dPᵀ = V·dOᵀ
        kb.section("tcore dP^T = V*dO^T (mma.sync m16n8k16)")?;
        let v_a = self.a_lane(kb, l, kb.add(self.smem, kb.i32c(cfg.v_offset(spec) as i64), "")?, warp_key0, rbv)?;
        let do_b = self.b_lane(kb, l, do_base, rbv)?;
        let mut dp = vec![[zero; 4]; n8];
        self.gemm(kb, &mut dp, v_a, 32, false, do_b, 32, 16 * rbv, false, spec.head_dim_v / 16, "dp")?;

        // ---- dS = P ∘ (dP − D), the learnable aux gradients, then the score mod's slope
        kb.section("dS = P * (dP - D) (and learnable aux gradients)")?;
        let mut ds = vec![[zero; 4]; n8];
        for nt in 0..n8 {
            let dsums = row_vals(kb, nt, bm * 4, "d_row")?;
            for e in 0..4 {
                let dsum = dsums[e % 2];
                if !self.grad.has_aux_terms() {
                    s[nt][e] = unpack_p(kb, nt, e)?;
                }
                ds[nt][e] = kb.fmul(s[nt][e], kb.fsub(dp[nt][e], dsum, "")?, "ds")?;
            }
        }
        if self.grad.has_aux_terms() {
            let first_part = kb.icmp(IntPredicate::EQ, self.part, kb.i32c(0), "")?;
            kb.if_then(first_part, "aux_grads", |kb| {
                let sink = aux_sink(kb, spec, &self.args, self.deterministic, self.cfg.warps, self.tid)?;
                let mut elems = Vec::new();
                for nt in 0..n8 {
                    for e in 0..4 {
                        let q = kb.add(m0, col_of(kb, nt, e)?, "q")?;
                        let vars = self.bv.elem_vars(self.hkv, q, h, key_of(kb, e)?);
                        elems.push((vars, s[nt][e], ds[nt][e], pre_d[nt * 4 + e].clone()));
                    }
                }
                self.grad.accumulate_aux(kb, spec, &self.va, &elems, &sink)
            })?;
        }
        if self.grad.has_score_mod() {
            for nt in 0..n8 {
                for e in 0..4 {
                    if let Some(sl) = slope[nt * 4 + e] {
                        // Where P is 0 (masked, or a logit of −∞) the gradient is 0, whatever
                        // the slope is there.
                        let p_zero = kb.fcmp(FloatPredicate::OEQ, s[nt][e], kb.f32c(0.0), "")?;
                        let g = kb.fmul(ds[nt][e], sl, "")?;
                        ds[nt][e] = kb.select_f(p_zero, kb.f32c(0.0), g, "dscore")?;
                    }
                }
            }
        }

        // ---- dSᵀ → shared memory (A of dK += dSᵀ·Q and of dQ = dS·K)
        kb.section("dS^T -> shared memory")?;
        let ds_ops = (0..n8 / 2).map(|j| pack(kb, &ds, j)).collect::<R<Vec<_>>>()?;
        self.store_transposed(kb, l, cfg.ds_offset(spec), warp_key0, &col_of, &ds_ops)?;
        Ok(())
    }

    /// `acc += A·B` for one warp: A its key group's 16 rows of a `[keys][queries]` tile
    /// in shared memory (Pᵀ or dSᵀ, lane address `a`, ldmatrix), the tile's block_m
    /// queries as the K dimension; B the stage's `[queries][cols]` rows at `b`
    /// (ldmatrix.trans), `cols` output columns.
    fn accumulate(
        &self,
        kb: &Kb<'ctx>,
        acc: &[Slot<'ctx>],
        a: IntValue<'ctx>,
        b: IntValue<'ctx>,
        rb: i64,
        cols: u32,
    ) -> R<()> {
        let mut o: Vec<[FloatValue<'ctx>; 4]> = Vec::new();
        for dt in 0..(cols / 8) as usize {
            let mut f = [kb.f32c(0.0); 4];
            for (e, x) in f.iter_mut().enumerate() {
                *x = kb.get_f(acc[dt * 4 + e], "acc")?;
            }
            o.push(f);
        }
        for j in 0..(self.cfg.block_m / 16) as i64 {
            let a_op = kb.ldmatrix_x4(a, j * 32, false, "a_frag")?;
            for dp in 0..(cols / 16) as usize {
                let bv = kb.ldmatrix_x4(b, j * 16 * rb + dp as i64 * 32, true, "b_frag")?;
                o[2 * dp] = kb.mma_m16n8k16(self.spec.dtype, a_op, [bv[0], bv[1]], o[2 * dp], "acc")?;
                o[2 * dp + 1] = kb.mma_m16n8k16(self.spec.dtype, a_op, [bv[2], bv[3]], o[2 * dp + 1], "acc")?;
            }
        }
        for (dt, f) in o.iter().enumerate() {
            for (e, x) in f.iter().enumerate() {
                kb.set(acc[dt * 4 + e], *x)?;
            }
        }
        Ok(())
    }

    /// Stores a warp's packed fragment set (16 key rows from `warp_key0`, the sub-tile's
    /// query columns: operand `j` holds 8-column tiles `2j`, `2j + 1`) as rows of the
    /// `[keys][queries]` tile at `offset` (padded rows: conflict-free 4-byte stores).
    fn store_transposed(
        &self,
        kb: &Kb<'ctx>,
        l: &Lane<'ctx>,
        offset: u32,
        warp_key0: IntValue<'ctx>,
        col_of: &dyn Fn(&Kb<'ctx>, usize, usize) -> R<IntValue<'ctx>>,
        ops: &[[IntValue<'ctx>; 4]],
    ) -> R<()> {
        let base = kb.add(self.smem, kb.i32c(offset as i64), "")?;
        let rbs = self.cfg.ds_row_bytes() as i64;
        for nt in 0..2 * ops.len() {
            for half in 0..2usize {
                let key = kb.add(warp_key0, kb.add(l.quad_row, kb.i32c(8 * half as i64), "")?, "")?;
                let col = col_of(kb, nt, 0)?;
                let addr =
                    kb.add(base, kb.add(kb.mul(key, kb.i32c(rbs), "")?, kb.mul(col, kb.i32c(2), "")?, "")?, "")?;
                kb.st_shared_b32(addr, ops[nt / 2][(nt % 2) * 2 + half])?;
            }
        }
        Ok(())
    }

    /// Adds a warp's dQ fragment (16 query rows from `q0`, 8-column tiles from `col0`) to
    /// this CTA's `dq_accum` slice (see [`red_dq_fragment`]).
    fn add_dq(
        &self,
        kb: &mut Kb<'ctx>,
        l: &Lane<'ctx>,
        h: IntValue<'ctx>,
        q0: IntValue<'ctx>,
        col0: IntValue<'ctx>,
        acc: &[[FloatValue<'ctx>; 4]],
    ) -> R<()> {
        let slice = kb.select_i(self.deterministic, kb.sreg("ctaid.x", "")?, kb.i32c(0), "dq_slice")?;
        let dq = DqSlice::new(kb, self.spec, &self.args, self.seqlen_pad, self.bv.b, slice)?;
        let frag = FragLane { quad_row: l.quad_row, quad_col: l.quad_col };
        red_dq_fragment(kb, &dq, h, q0, col0, frag, acc, self.cfg.dq_vec == 4)
    }

    // ------------------------------------------------------------------ epilogue

    /// dK (times the softmax scale) and dV of this part's columns, keys inside seqlen_k.
    fn store_dk_dv(&self, kb: &mut Kb<'ctx>, n0: IntValue<'ctx>) -> R<()> {
        let spec = self.spec;
        let cfg = self.cfg;
        kb.section("epilogue: dK *= scale, store dK, dV")?;
        let l = self.lane(kb)?;
        let kgs = kb.i32c(cfg.key_groups() as i64);
        let key_group = kb.urem(l.warp, kgs, "key_group")?;
        let col_part = kb.add(kb.mul(self.part, kb.i32c(cfg.halves as i64), "")?, kb.udiv(l.warp, kgs, "")?, "")?;
        let (dk_st, dv_st) = (self.args.strides("dk")?, self.args.strides("dv")?);
        let scale = kb.f32c(spec.scale_value());
        for half in 0..2i64 {
            let key = kb.add(
                kb.add(n0, kb.mul(key_group, kb.i32c(16), "")?, "")?,
                kb.add(l.quad_row, kb.i32c(8 * half), "")?,
                "key",
            )?;
            let inside = kb.icmp(IntPredicate::SLT, key, self.bv.seqlen_k, "")?;
            kb.if_then(inside, "store_key", |kb| {
                let (ko, vo) = kv_row_offsets(kb, spec, &self.la, &self.bv, &dk_st, &dv_st, key, self.hkv)?;
                for (acc, off, base, cols, mul) in [
                    (&self.dk, ko, self.args.int("dk")?, cfg.acc_cols(spec.head_dim_qk), Some(scale)),
                    (&self.dv, vo, self.args.int("dv")?, cfg.acc_cols(spec.head_dim_v), None),
                ] {
                    let row = kb.add(base, kb.mul(off, kb.i64c(2), "")?, "")?;
                    let col0 = kb.mul(col_part, kb.i32c(cols as i64), "")?;
                    for dt in 0..cols / 8 {
                        let mut x0 = kb.get_f(acc[(dt * 4 + 2 * half as u32) as usize], "")?;
                        let mut x1 = kb.get_f(acc[(dt * 4 + 2 * half as u32 + 1) as usize], "")?;
                        if let Some(sc) = mul {
                            x0 = kb.fmul(x0, sc, "")?;
                            x1 = kb.fmul(x1, sc, "")?;
                        }
                        let packed = kb.pack_half2(spec.dtype, x0, x1, "grad_pair")?;
                        let col =
                            kb.add(col0, kb.add(kb.mul(l.quad_col, kb.i32c(2), "")?, kb.i32c(dt as i64 * 8), "")?, "")?;
                        kb.st_global_b32(kb.add(row, kb.mul(kb.zext64(col, "")?, kb.i64c(2), "")?, "")?, packed)?;
                    }
                }
                Ok(())
            })?;
        }
        Ok(())
    }
}
