//! The blackwell backward main kernel: FlashAttention-4's sm_100 backward
//! (`backward_plan::kernel_plan`), tcgen05 MMAs with every accumulator in TMEM, one CTA
//! per key tile at head dims 64/96 and a CTA pair (`cta_group::2`) at 128. The kernels
//! around it (preprocess, dQ convert, sink gradient, block classifier) are
//! `common::backward`'s, as for the other families.
//!
//! A CTA owns 128 keys of one KV head (the TMEM lanes) and walks the non-empty 128-query
//! tiles of every query head of its group (`QueryTiles`, the same walk in every role, so
//! ring positions agree without communication). Per query tile, over mbarriers
//! (`BwdBar`):
//!
//! ```text
//! load (warp 13)     K, V once ─ Q + lse_log2, D rows (2 stages) ─ dO (1 stage)
//! MMA (warp 12)      Sᵀ=K·Qᵀ │ dK+=dSᵀ·Q, dQ=dS·K (previous tile) │ dPᵀ=V·dOᵀ │ dV+=Pᵀ·dO
//! compute (4-11)     ld Sᵀ → Pᵀ = 2^(s·log2e − lse) (mask, score mod) → st Pᵀ (over Sᵀ)
//!                    ld dPᵀ → dSᵀ = Pᵀ(dPᵀ − D)·m′ → st dSᵀ (over dPᵀ), dS → shared memory
//!                    end of the walk: ld dK, dV → ·scale → global
//! dQ reduce (0-3)    ld dQ (over dPᵀ) → red.global.add.v4.f32 into dq_accum
//! ```
//!
//! The MMA thread's issue order makes every TMEM overlay safe (the order
//! `backward_protocol.rs` models for both forms): Sᵀ of tile j after dV of tile j − 1
//! read Pᵀ; dK and dQ of tile j − 1 once the compute warps wrote its dSᵀ; dPᵀ of tile j
//! once the reduce warps drained dQ of tile j − 1 (dQ lies over dPᵀ). Each compute
//! warpgroup owns 64 query columns and writes its packed Pᵀ and dSᵀ into the first half of
//! those same columns (`BwdTmem::packed_col`), so no warp writes a column another reads.
//! The compute warps keep Pᵀ packed in registers from the P phase to dS: the next Sᵀ may
//! overwrite its TMEM copy as soon as dV has read it.
//!
//! The pair: two CTAs of a cluster (adjacent along y) walk the same 256 keys, each with its
//! own 128 on its TMEM lanes; the rank-0 MMA thread issues every MMA for both, each CTA
//! giving half of every B operand (Sᵀ and dPᵀ: its 64 Q / dO rows; dV and dK: its 64 dO /
//! Q columns; dQ: its 64 K columns of both CTAs' keys, M = 128 queries, 64 rows per CTA).
//! Operand loads land on rank 0's barriers, hand-overs arrive there (one per warp), every
//! commit is multicast to both CTAs, and each compute warpgroup writes its dS block into
//! the CTA that owns its 64 queries (`mapa` + `st.shared::cluster`).

use super::backward_plan::{
    dq_pair_place, kernel_plan, kernel_plan_in, smem_map, BwdBar, BwdSmemMap, BwdTmem, CtaMode, BLOCK_BYTES,
    BWD_BLOCK_M, BWD_BLOCK_N, KERNEL_REGS,
};
use super::desc::{DFormat, InstrDesc, SmemDesc};
use crate::error::LowerError;
use crate::families::common::abi::{self as cabi, Args};
use crate::families::common::backward::{
    dq_mode_is, dynamic_smem_base, learnable_aux, reversed_key_tiles, tma_boxes, tma_main_params, turn_flag, ws_row,
    DqSlice, KeyTileCta,
};
use crate::families::common::dq_order::{DqAccumulation, DqTurn};
use crate::families::common::sw128::{emit_chunk_addr, k_major_step_offset, mn_major_step_offset};
use crate::llvm::kb::{Kb, Slot, R};
use crate::llvm::operand::Major;
use crate::llvm::tcgen05::{Acc, CtaGroup, SmemOperand};
use crate::module::{Grid, KernelInfo, KernelRole};
use crate::variant::expr as vexpr;
use crate::variant::grad::ScoreGrad;
use crate::variant::layout::kv_row_offsets;
use crate::variant::tiles::{walk_key_tiles, QueryPair, QueryTiles};
use attnc_ir::Spec;
use inkwell::values::{FloatValue, IntValue};
use inkwell::{FloatPredicate, IntPredicate};

mod load;

const LOG2E: f64 = std::f64::consts::LOG2_E;
/// Threads of the CTA: 16 warps.
pub const BWD_THREADS: u32 = 512;
/// Query columns of Sᵀ / dPᵀ a compute thread reads per `tcgen05.ld` (its 64 in two).
const CHUNK: u32 = 32;
/// The named barrier of the dQ-reduce warps (ordered mode: the turn is taken and passed
/// by one thread for the warpgroup); 0 is the CTA barrier, no other is used.
const REDUCE_BAR: u32 = 1;
/// Columns of dK / dV per epilogue `tcgen05.ld` (48 at head dim 96: three).
const EPI_CHUNK: u32 = 16;
/// The commit's multicast mask in pair mode: both CTAs of the cluster.
const BOTH_CTAS: u16 = 0b11;

/// Why the built kernel cannot hold `spec`, or `None` (the arch is checked by the family).
pub fn unsupported_reason(spec: &Spec) -> Option<String> {
    if let Err(e) = kernel_plan(spec) {
        return Some(e);
    }
    if !learnable_aux(spec).is_empty() {
        return Some(
            "learnable aux gradients keep each element's f32 P until dS and add per element: 240-1060 bytes of spills \
             in the compute warps (alibi_learned, t5_bias; measured 2026-11-26); portable runs them"
                .into(),
        );
    }
    None
}

pub fn build<'ctx>(kb: &mut Kb<'ctx>, spec: &Spec, name: &str) -> R<KernelInfo> {
    let mode = super::backward_plan::cta_mode(spec).map_err(LowerError::Llvm)?;
    build_in(kb, spec, name, mode)
}

/// [`build`] in `mode` (one CTA per key tile at head dim 128: the step down when the
/// pair's kernel spills).
pub fn build_in<'ctx>(kb: &mut Kb<'ctx>, spec: &Spec, name: &str, mode: CtaMode) -> R<KernelInfo> {
    let plan = kernel_plan_in(spec, mode).map_err(LowerError::Llvm)?;
    let mode = plan.mode;
    let params = tma_main_params(spec);
    let args = Args::begin(kb, name, &params)?;
    for i in 0..4 {
        kb.mark_tensor_map_param(i)?;
    }
    kb.set_launch_bounds(BWD_THREADS)?;
    let pair = mode == CtaMode::Two;
    if pair {
        // The pair's two CTAs are adjacent along y (`KeyTiles { pair }`: two per KV head).
        kb.set_cluster_dims(1, 2, 1)?;
    }
    kb.section(&format!(
        "attnc blackwell backward: {} ({}, {} keys x {BWD_BLOCK_M} queries per tile, 16 warps, TMEM {} columns)",
        spec.name,
        if pair { "CTA pair, cta_group::2" } else { "1-CTA" },
        mode.walk_keys(),
        plan.tmem.alloc
    ))?;
    let k = Bwd {
        spec,
        args,
        name: name.to_string(),
        mode,
        smem: smem_map(spec.head_dim_qk, spec.head_dim_v, mode),
        tmem: plan.tmem.clone(),
        grad: ScoreGrad::new(spec),
    };
    k.body(kb)?;
    kb.ret()?;
    Ok(KernelInfo {
        name: name.to_string(),
        role: KernelRole::BackwardMain,
        note: Some(match mode {
            CtaMode::One => "tcgen05, accumulators in TMEM (load, MMA, 8 compute and 4 dQ-reduce warps)".into(),
            CtaMode::Two => "tcgen05 over CTA pairs (cta_group::2, clusters of 2 along y), accumulators in TMEM".into(),
        }),
        threads_per_block: BWD_THREADS,
        dynamic_smem_bytes: plan.smem.request,
        block_m: BWD_BLOCK_M,
        block_n: mode.walk_keys(),
        params: cabi::describe(&params),
        // Pair mode: a CTA loads 64-row halves of Q and dO (Sᵀ's and dPᵀ's B operands);
        // 128-row blocks as two boxes.
        tensor_maps: tma_boxes(BWD_BLOCK_M / mode.ctas(), BWD_BLOCK_N),
        grid: Grid::KeyTiles { parts: 1, ordered_dq: true, pair },
    })
}

struct Bwd<'a, 'ctx> {
    spec: &'a Spec,
    args: Args<'ctx>,
    name: String,
    mode: CtaMode,
    smem: BwdSmemMap,
    tmem: BwdTmem,
    grad: ScoreGrad,
}

/// What a role needs about its CTA, derived after its `setmaxnreg`: the shared view
/// (`cta.bv`, `cta.n_tiles`, … through `Deref`; in pair mode over the pair's 256 keys),
/// the shared-memory and TMEM bases, the thread's warp and lane, and its rank in the pair.
struct Cta<'ctx> {
    smem: IntValue<'ctx>,
    tmem: IntValue<'ctx>,
    view: KeyTileCta<'ctx>,
    warp: IntValue<'ctx>,
    lane: IntValue<'ctx>,
    /// 0 (the pair's first CTA, which issues the MMAs) or 1; 0 in 1-CTA mode.
    rank: IntValue<'ctx>,
}

impl<'ctx> std::ops::Deref for Cta<'ctx> {
    type Target = KeyTileCta<'ctx>;
    fn deref(&self) -> &KeyTileCta<'ctx> {
        &self.view
    }
}

/// A compute thread's place: its key row (TMEM lane) and its warpgroup's 64 query columns.
struct Place<'ctx> {
    /// Key row within the CTA's keys (0..128): 32·(warp % 4) + lane.
    row: IntValue<'ctx>,
    /// 0 or 1: query columns `64·half ..`.
    half: IntValue<'ctx>,
    /// TMEM address of the row at the warpgroup's first column (`+ 64·half`).
    taddr: IntValue<'ctx>,
}

impl<'a, 'ctx> Bwd<'a, 'ctx> {
    fn pair(&self) -> bool {
        self.mode == CtaMode::Two
    }

    fn group(&self) -> CtaGroup {
        match self.mode {
            CtaMode::One => CtaGroup::One,
            CtaMode::Two => CtaGroup::Two,
        }
    }

    fn cta(&self, kb: &mut Kb<'ctx>) -> R<Cta<'ctx>> {
        let raw = dynamic_smem_base(kb)?;
        let smem = kb.and(kb.add(raw, kb.i32c(1023), "")?, kb.i32c(!1023), "smem")?;
        let tmem = kb.ld_shared_b32(kb.add(smem, kb.i32c(self.smem.tmem_slot as i64), "")?, "tmem_base")?;
        let tid = kb.opaque_i32(kb.sreg("tid.x", "")?, "tid")?;
        let warp = kb.udiv(tid, kb.i32c(32), "warp")?;
        let lane = kb.and(tid, kb.i32c(31), "lane")?;
        let (view, rank) = if self.pair() {
            let y = kb.sreg("ctaid.y", "")?;
            let hkv = kb.lshr(y, kb.i32c(1), "hkv")?;
            let b = kb.opaque_i32(kb.sreg("ctaid.z", "")?, "b")?;
            let view = KeyTileCta::for_batch(kb, self.spec, &self.args, b, hkv, BWD_BLOCK_M, self.mode.walk_keys())?;
            (view, kb.sreg("cluster_ctarank", "pair_rank")?)
        } else {
            (KeyTileCta::new(kb, self.spec, &self.args, BWD_BLOCK_M, BWD_BLOCK_N)?, kb.i32c(0))
        };
        Ok(Cta { smem, tmem, view, warp, lane, rank })
    }

    fn bar(&self, kb: &Kb<'ctx>, cta: &Cta<'ctx>, b: BwdBar) -> R<IntValue<'ctx>> {
        kb.add(cta.smem, kb.i32c((self.smem.bars + 8 * b.index()) as i64), "mbar")
    }

    /// The copy of `b` that gathers both CTAs' arrivals: the pair's first CTA's (a
    /// shared::cluster address), or this CTA's own in 1-CTA mode.
    fn gather_bar(&self, kb: &Kb<'ctx>, cta: &Cta<'ctx>, b: BwdBar) -> R<IntValue<'ctx>> {
        let local = self.bar(kb, cta, b)?;
        if self.pair() {
            kb.mapa_shared(local, kb.i32c(0), "leader_mbar")
        } else {
            Ok(local)
        }
    }

    /// A per-stage barrier (`make(0)`, `make(1)` adjacent) for a run-time stage.
    fn bar_stage(
        &self,
        kb: &Kb<'ctx>,
        cta: &Cta<'ctx>,
        make: fn(u32) -> BwdBar,
        stage: IntValue<'ctx>,
    ) -> R<IntValue<'ctx>> {
        let b0 = self.smem.bars + 8 * make(0).index();
        kb.add(cta.smem, kb.add(kb.i32c(b0 as i64), kb.mul(stage, kb.i32c(8), "")?, "")?, "mbar")
    }

    /// Waits for a phase of a barrier of this CTA. In pair mode too at CTA scope, as
    /// cluster pipelines do: what the peer hands over is TMEM and shared memory read by
    /// the tensor core, ordered by the writer's fences and its cluster-scope release; an
    /// acquire at cluster scope would invalidate L1 at every wait (`CCTL.IVALL`). The
    /// ordered dQ hand-over, which orders global adds, acquires at cluster scope.
    fn wait(&self, kb: &Kb<'ctx>, mbar: IntValue<'ctx>, parity: IntValue<'ctx>) -> R<()> {
        kb.mbar_wait(mbar, parity)
    }

    /// Every thread of the CTA, or of the pair.
    fn sync_all(&self, kb: &Kb<'ctx>) -> R<()> {
        if self.pair() {
            kb.cluster_sync()
        } else {
            kb.cta_barrier()
        }
    }

    /// `tcgen05.commit` of the MMA thread: in pair mode multicast to both CTAs' copies.
    fn commit(&self, kb: &Kb<'ctx>, mbar: IntValue<'ctx>) -> R<()> {
        if self.pair() {
            kb.tcgen05_commit_multicast(mbar, BOTH_CTAS)
        } else {
            kb.tcgen05_commit(mbar)
        }
    }

    /// A role's hand-over to the MMA thread, after its TMEM stores and fences: every
    /// thread arrives (1-CTA), or (pair mode) one lane per converged warp on the first
    /// CTA's copy (the instruction's default semantics, as cluster pipelines release
    /// TMEM and shared buffers across CTAs).
    fn hand_over(&self, kb: &Kb<'ctx>, cta: &Cta<'ctx>, b: BwdBar) -> R<()> {
        if self.pair() {
            kb.warp_sync()?;
            kb.mbar_arrive_remote_lane0(self.gather_bar(kb, cta, b)?, cta.lane)
        } else {
            kb.mbar_arrive(self.bar(kb, cta, b)?)
        }
    }

    /// The query walk of key tile `n`, rotated as on hopper (key tile n starts at query
    /// tile n, so the dQ adds of a head's key tiles land on different rows at once).
    fn queries<'b>(&'b self, kb: &Kb<'ctx>, cta: &'b Cta<'ctx>, n: IntValue<'ctx>) -> R<QueryTiles<'b, 'ctx>> {
        // Four class loads in flight per step of a walk over a launch's block classes.
        Ok(cta.view.queries(kb, self.spec, &self.args, n, true)?.with_probes(1))
    }

    /// The first key of this CTA's keys in walk tile `n` (pair mode: the second CTA's
    /// are the upper 128 of the pair's 256).
    fn own_n0(&self, kb: &Kb<'ctx>, cta: &Cta<'ctx>, n: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        let n0 = kb.mul(n, kb.i32c(self.mode.walk_keys() as i64), "")?;
        kb.add(n0, kb.mul(cta.rank, kb.i32c(BWD_BLOCK_N as i64), "")?, "own_n0")
    }

    fn body(&self, kb: &mut Kb<'ctx>) -> R<()> {
        {
            let raw = dynamic_smem_base(kb)?;
            let smem = kb.and(kb.add(raw, kb.i32c(1023), "")?, kb.i32c(!1023), "smem")?;
            let tid = kb.sreg("tid.x", "tid")?;
            kb.section("setup: mbarriers (thread 0), TMEM allocation (warp 12)")?;
            let is_t0 = kb.icmp(IntPredicate::EQ, tid, kb.i32c(0), "")?;
            kb.if_then(is_t0, "init_barriers", |kb| {
                for b in BwdBar::all(self.mode) {
                    let at = kb.add(smem, kb.i32c((self.smem.bars + 8 * b.index()) as i64), "")?;
                    kb.mbar_init(at, b.count(self.mode))?;
                }
                kb.fence_mbarrier_init()
            })?;
            let warp = kb.udiv(tid, kb.i32c(32), "warp")?;
            let slot = kb.add(smem, kb.i32c(self.smem.tmem_slot as i64), "tmem_slot")?;
            let is_mma_warp = kb.icmp(IntPredicate::EQ, warp, kb.i32c(12), "")?;
            kb.if_then(is_mma_warp, "tmem_alloc", |kb| {
                kb.tmem_alloc_in(self.group(), slot, self.tmem.alloc)?;
                kb.tmem_relinquish_in(self.group())
            })?;
            kb.tcgen05_fence_before()?;
            // Pair mode: both CTAs' barriers exist before either arrives on its peer's.
            self.sync_all(kb)?;
            kb.tcgen05_fence_after()?;
            let wg = kb.udiv(warp, kb.i32c(4), "warpgroup")?;
            let is_reduce = kb.icmp(IntPredicate::EQ, wg, kb.i32c(0), "")?;
            let is_compute = kb.icmp(IntPredicate::ULT, wg, kb.i32c(3), "")?;
            kb.if_else(
                is_reduce,
                "role_dq_reduce",
                |kb| {
                    kb.setmaxnreg_dec(KERNEL_REGS.reduce)?;
                    self.reduce(kb)
                },
                |kb| {
                    kb.if_else(
                        is_compute,
                        "role_compute",
                        |kb| {
                            kb.setmaxnreg_inc(KERNEL_REGS.compute)?;
                            self.compute(kb)
                        },
                        |kb| {
                            kb.setmaxnreg_dec(KERNEL_REGS.other)?;
                            let tid = kb.opaque_i32(kb.sreg("tid.x", "")?, "tid")?;
                            let lane0 = kb.icmp(IntPredicate::EQ, kb.and(tid, kb.i32c(31), "")?, kb.i32c(0), "")?;
                            let warp = kb.udiv(tid, kb.i32c(32), "")?;
                            let mut mma = kb.and(kb.icmp(IntPredicate::EQ, warp, kb.i32c(12), "")?, lane0, "")?;
                            if self.pair() {
                                // One thread of the pair issues its MMAs: the first CTA's.
                                let first =
                                    kb.icmp(IntPredicate::EQ, kb.sreg("cluster_ctarank", "")?, kb.i32c(0), "")?;
                                mma = kb.and(mma, first, "pair_mma_thread")?;
                            }
                            kb.if_then(mma, "role_mma", |kb| self.mma(kb))?;
                            let load = kb.and(kb.icmp(IntPredicate::EQ, warp, kb.i32c(13), "")?, lane0, "")?;
                            kb.if_then(load, "role_load", |kb| self.load(kb))
                        },
                    )
                },
            )?;
        }
        kb.section("teardown: every role done, warp 12 frees TMEM")?;
        kb.tcgen05_fence_before()?;
        // Pair mode: neither CTA frees its TMEM or exits while the pair's MMAs or its
        // peer's arrivals and dS stores may still reach it.
        self.sync_all(kb)?;
        let cta = self.cta(kb)?;
        let is_mma_warp = kb.icmp(IntPredicate::EQ, cta.warp, kb.i32c(12), "")?;
        kb.if_then(is_mma_warp, "tmem_dealloc", |kb| {
            kb.warp_sync()?;
            kb.tcgen05_fence_after()?;
            kb.tmem_dealloc_in(self.group(), cta.tmem, self.tmem.alloc)
        })
    }

    // ------------------------------------------------------------------ MMA

    /// `(addr >> 4) | low constant bits` of an SW128 descriptor, and its constant high word.
    fn desc(&self, kb: &Kb<'ctx>, constant: u64, addr: IntValue<'ctx>) -> R<(IntValue<'ctx>, u32)> {
        let a = kb.lshr(addr, kb.i32c(4), "")?;
        Ok((kb.or(kb.i32c((constant & 0xFFFF_FFFF) as i64), a, "desc_lo")?, (constant >> 32) as u32))
    }

    /// The instruction descriptor of an MMA of `m` rows (pair mode: both CTAs' rows).
    fn idesc(&self, m: u32, n: u32, a_major: Major, b_major: Major) -> u32 {
        let t = self.spec.dtype.into();
        InstrDesc { m, n, a: t, b: t, d: DFormat::F32, a_major, b_major }.encode()
    }

    /// D[d_off] = A·Bᵀ over `d` with both operands K-major (Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ: M the
    /// keys, N = 128 queries). In pair mode M = 256 and each CTA gives 64 rows of B.
    fn issue_kmajor(
        &self,
        kb: &Kb<'ctx>,
        cta: &Cta<'ctx>,
        a: IntValue<'ctx>,
        b: IntValue<'ctx>,
        d: u32,
        d_off: u32,
    ) -> R<()> {
        let c = SmemDesc::k_major_sw128(0).encode_without_start();
        let (alo, hi) = self.desc(kb, c, a)?;
        let (blo, _) = self.desc(kb, c, b)?;
        let ctas = self.mode.ctas();
        let idesc = self.idesc(BWD_BLOCK_N * ctas, BWD_BLOCK_M, Major::K, Major::K);
        for kk in 0..d / 16 {
            let a = SmemOperand { lo: alo, hi, add: k_major_step_offset(BWD_BLOCK_N, kk) >> 4 };
            let b = SmemOperand { lo: blo, hi, add: k_major_step_offset(BWD_BLOCK_M / ctas, kk) >> 4 };
            let acc = if kk == 0 { Acc::Overwrite } else { Acc::Accumulate };
            kb.tcgen05_mma_ss_in(self.group(), cta.tmem, d_off, a, b, idesc, acc)?;
        }
        Ok(())
    }

    /// D[d_off] (+)= A·B with A the packed 16-bit operand in TMEM at `a_col` (Pᵀ or dSᵀ,
    /// keys on lanes, queries on K) and B a query-row tile read MN-major (dO or Q):
    /// dV += Pᵀ·dO, dK += dSᵀ·Q. `acc` says whether the first step accumulates. In pair
    /// mode M = 256 and each CTA's B is one 64-column block of all 128 query rows.
    #[allow(clippy::too_many_arguments)]
    fn issue_from_tmem(
        &self,
        kb: &Kb<'ctx>,
        cta: &Cta<'ctx>,
        a_col: u32,
        b: IntValue<'ctx>,
        n: u32,
        d_off: u32,
        acc: IntValue<'ctx>,
    ) -> R<()> {
        let c = SmemDesc::mn_major_sw128(0, BLOCK_BYTES).encode_without_start();
        let (blo, hi) = self.desc(kb, c, b)?;
        let idesc = self.idesc(BWD_BLOCK_N * self.mode.ctas(), n, Major::K, Major::Mn);
        for kk in 0..BWD_BLOCK_M / 16 {
            let b = SmemOperand { lo: blo, hi, add: mn_major_step_offset(kk) >> 4 };
            let a = a_col + BwdTmem::packed_col(kk);
            let acc = if kk == 0 { Acc::When(acc) } else { Acc::Accumulate };
            kb.tcgen05_mma_ts_in(self.group(), cta.tmem, d_off, a, b, idesc, acc)?;
        }
        Ok(())
    }

    /// dQ = dS·K: A the dS tile (MN-major: queries contiguous, key rows), B the K tile read
    /// MN-major (head-dim columns contiguous). 1-CTA: K = the tile's 128 keys, B the K
    /// tile. Pair mode: M = 128 queries (64 per CTA), K = the pair's 256 keys (dS and Kᵀ
    /// hold the first CTA's keys, then the second's), each CTA's B its 64 K columns.
    fn issue_dq(&self, kb: &Kb<'ctx>, cta: &Cta<'ctx>) -> R<()> {
        let c = SmemDesc::mn_major_sw128(0, BLOCK_BYTES).encode_without_start();
        let (alo, hi) = self.desc(kb, c, kb.add(cta.smem, kb.i32c(self.smem.ds as i64), "ds_smem")?)?;
        let b_base = self.smem.kt.unwrap_or(self.smem.k);
        let (blo, _) = self.desc(kb, c, kb.add(cta.smem, kb.i32c(b_base as i64), "dq_b_smem")?)?;
        let idesc = self.idesc(BWD_BLOCK_M, self.spec.head_dim_qk, Major::Mn, Major::Mn);
        for kk in 0..self.mode.walk_keys() / 16 {
            let off = mn_major_step_offset(kk) >> 4;
            let a = SmemOperand { lo: alo, hi, add: off };
            let b = SmemOperand { lo: blo, hi, add: off };
            let acc = if kk == 0 { Acc::Overwrite } else { Acc::Accumulate };
            kb.tcgen05_mma_ss_in(self.group(), cta.tmem, self.tmem.dq.0, a, b, idesc, acc)?;
        }
        Ok(())
    }

    fn q_smem(&self, kb: &Kb<'ctx>, cta: &Cta<'ctx>, stage: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        kb.add(
            cta.smem,
            kb.add(kb.i32c(self.smem.q as i64), kb.mul(stage, kb.i32c(self.smem.q_stage as i64), "")?, "")?,
            "q_smem",
        )
    }

    /// dK += dSᵀ·Q and dQ = dS·K of ring position `pos` (the `j`-th of its key tile),
    /// once the compute warps wrote its dSᵀ (pair mode: both CTAs', and dS in both CTAs'
    /// shared memory, and both CTAs' Q columns landed); releases its Q stage and hands
    /// dQ over.
    fn issue_dk_dq(&self, kb: &Kb<'ctx>, cta: &Cta<'ctx>, pos: IntValue<'ctx>, j: IntValue<'ctx>) -> R<()> {
        self.wait(kb, self.bar(kb, cta, BwdBar::DsWritten)?, kb.and(pos, kb.i32c(1), "")?)?;
        let stage = kb.and(pos, kb.i32c(1), "q_stage")?;
        if self.pair() {
            let qpar = kb.and(kb.lshr(pos, kb.i32c(1), "")?, kb.i32c(1), "q_parity")?;
            self.wait(kb, self.bar_stage(kb, cta, BwdBar::QFull, stage)?, qpar)?;
        }
        kb.tcgen05_fence_after()?;
        let acc = kb.zext32(kb.icmp(IntPredicate::SGT, j, kb.i32c(0), "")?, "dk_acc")?;
        kb.section("tcgen05.mma dK += dS^T.Q (A: dS^T in TMEM)")?;
        self.issue_from_tmem(
            kb,
            cta,
            self.tmem.dp.0,
            self.q_smem(kb, cta, stage)?,
            self.spec.head_dim_qk,
            self.tmem.dk.0,
            acc,
        )?;
        self.commit(kb, self.bar_stage(kb, cta, BwdBar::QEmpty, stage)?)?;
        kb.section("tcgen05.mma dQ = dS.K (over dP^T)")?;
        self.issue_dq(kb, cta)?;
        self.commit(kb, self.bar(kb, cta, BwdBar::DqFull)?)
    }

    /// The MMA thread (pair mode: the first CTA's, for both). Per query tile: Sᵀ, the
    /// previous tile's dK and dQ, dPᵀ once dQ drained, dV once Pᵀ is written.
    fn mma(&self, kb: &mut Kb<'ctx>) -> R<()> {
        let spec = self.spec;
        let t = &self.tmem;
        let l = self.smem;
        let pair = self.pair();
        kb.section("role: MMA issue (one thread): tcgen05.mma + tcgen05.commit")?;
        let cta = self.cta(kb)?;
        let pos = kb.slot_i32("mma_pos", kb.i32c(0))?;
        let at = |kb: &Kb<'ctx>, off: u32, name: &str| kb.add(cta.smem, kb.i32c(off as i64), name);
        let k_smem = at(kb, l.k, "k_smem")?;
        let v_smem = at(kb, l.v, "v_smem")?;
        let do_smem = at(kb, l.d_o, "do_smem")?;
        // Sᵀ's and dPᵀ's B operands: pair mode, each CTA's 64 rows of Q and dO.
        let q_row_smem = l.q_row.map(|o| at(kb, o, "q_row_smem")).transpose()?;
        let dp_b_smem = at(kb, l.do_row.unwrap_or(l.d_o), "dp_b_smem")?;
        // Key tiles whose walk had query tiles so far (each hands dK/dV over once).
        let walked = kb.slot_i32("mma_walked", kb.i32c(0))?;
        walk_key_tiles(kb, cta.n_tiles, reversed_key_tiles(kb, &self.args, true)?, |kb, n, it| {
            self.wait(kb, self.bar(kb, &cta, BwdBar::KvFull)?, kb.and(it, kb.i32c(1), "kv_parity")?)?;
            kb.tcgen05_fence_after()?;
            let j_slot = kb.slot_i32("tile_step", kb.i32c(0))?;
            let qt = self.queries(kb, &cta, n)?;
            qt.walk(kb, cta.m_tiles, pos, |kb, _p, pos| {
                let j = kb.get_i(j_slot, "j")?;
                let stage = kb.and(pos, kb.i32c(1), "q_stage")?;
                let qpar = kb.and(kb.lshr(pos, kb.i32c(1), "")?, kb.i32c(1), "q_parity")?;
                let par = kb.and(pos, kb.i32c(1), "step_parity")?;
                let s_b = match q_row_smem {
                    Some(q_row) => {
                        self.wait(kb, self.bar(kb, &cta, BwdBar::QRowFull)?, par)?;
                        q_row
                    }
                    None => {
                        self.wait(kb, self.bar_stage(kb, &cta, BwdBar::QFull, stage)?, qpar)?;
                        self.q_smem(kb, &cta, stage)?
                    }
                };
                kb.tcgen05_fence_after()?;
                kb.section("tcgen05.mma S^T = K.Q^T")?;
                self.issue_kmajor(kb, &cta, k_smem, s_b, spec.head_dim_qk, t.s.0)?;
                self.commit(kb, self.bar(kb, &cta, BwdBar::SFull)?)?;
                if pair {
                    self.commit(kb, self.bar(kb, &cta, BwdBar::QRowEmpty)?)?;
                }
                let later = kb.icmp(IntPredicate::SGT, j, kb.i32c(0), "")?;
                kb.if_then(later, "previous_dk_dq", |kb| {
                    self.issue_dk_dq(kb, &cta, kb.sub(pos, kb.i32c(1), "")?, kb.sub(j, kb.i32c(1), "")?)
                })?;
                // dQ of the previous position (this key tile's or the last one's) lies over
                // dPᵀ: the reduce warps must have drained it.
                let drained = kb.icmp(IntPredicate::SGT, pos, kb.i32c(0), "")?;
                kb.if_then(drained, "wait_dq_drained", |kb| {
                    let prev = kb.and(kb.sub(pos, kb.i32c(1), "")?, kb.i32c(1), "")?;
                    self.wait(kb, self.bar(kb, &cta, BwdBar::DqDrained)?, prev)
                })?;
                let dp_full = if pair { BwdBar::DoRowFull } else { BwdBar::DoFull };
                self.wait(kb, self.bar(kb, &cta, dp_full)?, par)?;
                kb.tcgen05_fence_after()?;
                kb.section("tcgen05.mma dP^T = V.dO^T")?;
                self.issue_kmajor(kb, &cta, v_smem, dp_b_smem, spec.head_dim_v, t.dp.0)?;
                self.commit(kb, self.bar(kb, &cta, BwdBar::DpFull)?)?;
                if pair {
                    self.commit(kb, self.bar(kb, &cta, BwdBar::DoRowEmpty)?)?;
                }
                self.wait(kb, self.bar(kb, &cta, BwdBar::PWritten)?, par)?;
                // The first dV of a key tile overwrites dK/dV: the epilogue of the last key
                // tile that had any must have read them.
                let w = kb.get_i(walked, "walked")?;
                let first_later = kb.and(
                    kb.icmp(IntPredicate::EQ, j, kb.i32c(0), "")?,
                    kb.icmp(IntPredicate::SGT, w, kb.i32c(0), "")?,
                    "",
                )?;
                kb.if_then(first_later, "wait_dkv_empty", |kb| {
                    let par = kb.and(kb.sub(w, kb.i32c(1), "")?, kb.i32c(1), "")?;
                    self.wait(kb, self.bar(kb, &cta, BwdBar::DkvEmpty)?, par)
                })?;
                if pair {
                    // dV's B operand: both CTAs' dO columns.
                    self.wait(kb, self.bar(kb, &cta, BwdBar::DoFull)?, par)?;
                }
                kb.tcgen05_fence_after()?;
                kb.section("tcgen05.mma dV += P^T.dO (A: P^T in TMEM)")?;
                let acc = kb.zext32(later, "dv_acc")?;
                self.issue_from_tmem(kb, &cta, t.s.0, do_smem, spec.head_dim_v, t.dv.0, acc)?;
                self.commit(kb, self.bar(kb, &cta, BwdBar::DoEmpty)?)?;
                kb.set(j_slot, kb.add(j, kb.i32c(1), "")?)
            })?;
            let steps = kb.get_i(j_slot, "steps")?;
            let any = kb.icmp(IntPredicate::SGT, steps, kb.i32c(0), "")?;
            kb.if_then(any, "last_dk_dq", |kb| {
                let last = kb.sub(kb.get_i(pos, "")?, kb.i32c(1), "last_pos")?;
                self.issue_dk_dq(kb, &cta, last, kb.sub(steps, kb.i32c(1), "")?)?;
                kb.section("dK, dV final (a walk with query tiles only: see `epilogue`)")?;
                self.commit(kb, self.bar(kb, &cta, BwdBar::DkvFull)?)?;
                kb.set(walked, kb.add(kb.get_i(walked, "")?, kb.i32c(1), "")?)
            })?;
            kb.section("K, V free")?;
            self.commit(kb, self.bar(kb, &cta, BwdBar::KvEmpty)?)
        })
    }

    // ------------------------------------------------------------------ compute

    fn place(&self, kb: &Kb<'ctx>, cta: &Cta<'ctx>) -> R<Place<'ctx>> {
        let quarter = kb.and(cta.warp, kb.i32c(3), "lane_quarter")?;
        let row = kb.add(kb.mul(quarter, kb.i32c(32), "")?, cta.lane, "key_row")?;
        let half = kb.sub(kb.udiv(cta.warp, kb.i32c(4), "")?, kb.i32c(1), "col_half")?;
        let lanes = kb.shl(kb.mul(quarter, kb.i32c(32), "")?, kb.i32c(16), "")?;
        let taddr = kb.add(kb.add(cta.tmem, lanes, "")?, kb.mul(half, kb.i32c(64), "")?, "taddr_row")?;
        Ok(Place { row, half, taddr })
    }

    fn compute(&self, kb: &mut Kb<'ctx>) -> R<()> {
        let cta = self.cta(kb)?;
        let pl = self.place(kb, &cta)?;
        let pos = kb.slot_i32("compute_pos", kb.i32c(0))?;
        // Key tiles whose walk had query tiles so far: the dK/dV hand-offs' count.
        let walked = kb.slot_i32("compute_walked", kb.i32c(0))?;
        walk_key_tiles(kb, cta.n_tiles, reversed_key_tiles(kb, &self.args, true)?, |kb, n, _it| {
            let n0 = self.own_n0(kb, &cta, n)?;
            let key = kb.add(n0, pl.row, "key")?;
            let k_inside = kb.icmp(
                IntPredicate::SLE,
                kb.add(n0, kb.i32c(BWD_BLOCK_N as i64), "")?,
                cta.bv.seqlen_k,
                "keys_inside",
            )?;
            let j_slot = kb.slot_i32("tile_step", kb.i32c(0))?;
            let qt = self.queries(kb, &cta, n)?;
            // Pair mode: the walk is the pair's (its 256 keys); whether a tile needs the
            // per-element mask is decided by intervals for this CTA's own 128, or by the
            // launch's block classes, which are the pair's (conservative: a tile full for
            // 256 keys is full for 128).
            let own = if self.pair() && qt.classes.is_none() {
                let k_hi = kb.sub(
                    kb.smin(kb.add(n0, kb.i32c(BWD_BLOCK_N as i64), "")?, cta.bv.seqlen_k, "")?,
                    kb.i32c(1),
                    "own_k_hi",
                )?;
                Some(QueryTiles { k: (n0, k_hi), ..qt.clone() })
            } else {
                None
            };
            qt.walk(kb, cta.m_tiles, pos, |kb, p, pos| {
                let h = qt.head(kb, p.g)?;
                let m = qt.tile_of(kb, p.m)?;
                let m0 = kb.mul(m, kb.i32c(BWD_BLOCK_M as i64), "m0")?;
                let full = own.as_ref().unwrap_or(&qt).full_inside(kb, m, h)?;
                let unmasked = kb.and(full, k_inside, "unmasked")?;
                self.tile(kb, &cta, &pl, pos, m0, h, key, unmasked)?;
                kb.set(j_slot, kb.add(kb.get_i(j_slot, "")?, kb.i32c(1), "")?)
            })?;
            let steps = kb.get_i(j_slot, "steps")?;
            let w = kb.get_i(walked, "walked")?;
            self.epilogue(kb, &cta, &pl, w, key, steps)?;
            let any = kb.zext32(kb.icmp(IntPredicate::SGT, steps, kb.i32c(0), "")?, "")?;
            kb.set(walked, kb.add(w, any, "")?)
        })
    }

    /// One query tile of a compute thread: Pᵀ, then dSᵀ, for its key row and 64 columns.
    #[allow(clippy::too_many_arguments)]
    fn tile(
        &self,
        kb: &mut Kb<'ctx>,
        cta: &Cta<'ctx>,
        pl: &Place<'ctx>,
        pos: IntValue<'ctx>,
        m0: IntValue<'ctx>,
        h: IntValue<'ctx>,
        key: IntValue<'ctx>,
        unmasked: IntValue<'ctx>,
    ) -> R<()> {
        let spec = self.spec;
        let t = &self.tmem;
        let par = kb.and(pos, kb.i32c(1), "step_parity")?;
        let stage = kb.and(pos, kb.i32c(1), "q_stage")?;
        // This warpgroup's 64 lse_log2 values, then (512 bytes on) D.
        let rows = kb.add(
            cta.smem,
            kb.add(
                kb.i32c(self.smem.rows as i64),
                kb.add(
                    kb.mul(stage, kb.i32c(self.smem.rows_stage as i64), "")?,
                    kb.mul(pl.half, kb.i32c(256), "")?,
                    "",
                )?,
                "",
            )?,
            "rows",
        )?;
        let q_first = kb.add(m0, kb.mul(pl.half, kb.i32c(64), "")?, "q_first")?;
        let partial = kb.not(unmasked, "partial_tile")?;
        let predicate = spec.mask.to_predicate();

        if self.pair() {
            // This CTA's own lse_log2 and D rows (the first CTA's commits say nothing of
            // them).
            let qpar = kb.and(kb.lshr(pos, kb.i32c(1), "")?, kb.i32c(1), "rows_parity")?;
            self.wait(kb, self.bar_stage(kb, cta, BwdBar::RowsFull, stage)?, qpar)?;
        }
        self.wait(kb, self.bar(kb, cta, BwdBar::SFull)?, par)?;
        kb.tcgen05_fence_after()?;
        kb.section("softmax recompute: P^T = 2^(s - lse_log2), packed over S^T")?;
        let mut p_packed = Vec::with_capacity(32);
        let mut slopes: Vec<Option<FloatValue<'ctx>>> = Vec::with_capacity(64);
        for c in 0..2 {
            let raw = kb.tmem_load(pl.taddr, t.s.0 + c * CHUNK, CHUNK, CHUNK, "s_raw")?;
            let mut p_slots: Vec<Slot<'ctx>> = Vec::with_capacity(CHUNK as usize);
            for (i, r) in raw.iter().enumerate() {
                let col = c * CHUNK + i as u32;
                let s = kb.bits_f(*r, "s")?;
                let lse2 = kb.ld_shared_f32(kb.add(rows, kb.i32c(4 * col as i64), "")?, "lse_log2")?;
                let s2 = if self.grad.has_score_mod() {
                    let q = kb.add(q_first, kb.i32c(col as i64), "q")?;
                    let el = self.grad.logit(kb, spec, s, cta.bv.elem_vars(cta.hkv, q, h, key), &cta.va)?;
                    slopes.push(el.slope);
                    el.s_log2
                } else {
                    slopes.push(None);
                    kb.fmul(s, kb.f32c(spec.scale_value() * LOG2E), "s_log2")?
                };
                p_slots.push(kb.slot_f32("p", kb.ex2(kb.fsub(s2, lse2, "")?, "p")?)?);
            }
            kb.if_then(partial, "mask_chunk", |kb| {
                kb.section("mask (partial tile): P = 0 outside the mask and the sequences")?;
                let k_in = kb.icmp(IntPredicate::SLT, key, cta.bv.seqlen_k, "k_in_bounds")?;
                for (i, slot) in p_slots.iter().enumerate() {
                    let q = kb.add(q_first, kb.i32c((c * CHUNK) as i64 + i as i64), "q")?;
                    let vars = cta.bv.elem_vars(cta.hkv, q, h, key);
                    let q_in = kb.icmp(IntPredicate::SLT, q, cta.bv.seqlen_q, "q_in_bounds")?;
                    let allowed = vexpr::allowed(kb, spec, predicate.as_ref(), &vars, &cta.va)?;
                    let ok = kb.and(kb.and(allowed, q_in, "")?, k_in, "")?;
                    let v = kb.get_f(*slot, "")?;
                    kb.set(*slot, kb.select_f(ok, v, kb.f32c(0.0), "p_masked")?)?;
                }
                Ok(())
            })?;
            let p: Vec<FloatValue<'ctx>> = p_slots.iter().map(|s| kb.get_f(*s, "p")).collect::<R<_>>()?;
            let packed = kb.pack_pairs(spec.dtype, &p, "packed")?;
            kb.tmem_store(pl.taddr, t.s.0 + c * CHUNK / 2, &packed)?;
            p_packed.extend(packed);
        }
        kb.tmem_wait_st()?;
        kb.tcgen05_fence_before()?;
        self.hand_over(kb, cta, BwdBar::PWritten)?;

        self.wait(kb, self.bar(kb, cta, BwdBar::DpFull)?, par)?;
        kb.tcgen05_fence_after()?;
        kb.section("dS^T = P^T (dP^T - D), packed over dP^T and into shared memory (MN-major for dQ)")?;
        // 1-CTA: this warpgroup's 64-query block of dS. Pair mode: dQ's A operand in CTA
        // `half` holds its 64 queries against the first CTA's keys, then the second's, so
        // this warpgroup writes its block into CTA `half`'s shared memory (its peer's for
        // one of the two warpgroups) at this CTA's key slot.
        let ds_block = if self.pair() {
            let slot =
                kb.add(kb.i32c(self.smem.ds as i64), kb.mul(cta.rank, kb.i32c(BLOCK_BYTES as i64), "")?, "ds_slot")?;
            kb.mapa_shared(kb.add(cta.smem, slot, "")?, pl.half, "ds_block")?
        } else {
            kb.add(
                kb.add(cta.smem, kb.i32c(self.smem.ds as i64), "")?,
                kb.mul(pl.half, kb.i32c(BLOCK_BYTES as i64), "")?,
                "ds_block",
            )?
        };
        for c in 0..2 {
            let raw = kb.tmem_load(pl.taddr, t.dp.0 + c * CHUNK, CHUNK, CHUNK, "dp_raw")?;
            let mut ds = Vec::with_capacity(CHUNK as usize);
            for (i, r) in raw.iter().enumerate() {
                let col = c * CHUNK + i as u32;
                let dp = kb.bits_f(*r, "dp")?;
                let d = kb.ld_shared_f32(kb.add(rows, kb.i32c((4 * col + 4 * BWD_BLOCK_M) as i64), "")?, "d_row")?;
                let (lo, hi) = kb.unpack_half2(spec.dtype, p_packed[(col / 2) as usize], "p")?;
                let p = if col % 2 == 0 { lo } else { hi };
                let mut v = kb.fmul(p, kb.fsub(dp, d, "")?, "ds")?;
                if let Some(sl) = slopes[col as usize] {
                    // Where P is 0 (masked, or a logit of −∞) the gradient is 0, whatever the
                    // slope is there.
                    let p_zero = kb.fcmp(FloatPredicate::OEQ, p, kb.f32c(0.0), "")?;
                    v = kb.select_f(p_zero, kb.f32c(0.0), kb.fmul(v, sl, "")?, "dscore")?;
                }
                ds.push(v);
            }
            let packed = kb.pack_pairs(spec.dtype, &ds, "packed")?;
            kb.tmem_store(pl.taddr, t.dp.0 + c * CHUNK / 2, &packed)?;
            // Row `row` of the warpgroup's 64-query block: 16-byte chunks 4c..4c+3.
            for k in 0..4u32 {
                let chunk = kb.i32c((4 * c + k) as i64);
                let addr = emit_chunk_addr(kb, ds_block, pl.row, chunk)?;
                let v = &packed[(4 * k) as usize..(4 * k + 4) as usize];
                if self.pair() {
                    kb.st_shared_cluster_v4_b32(addr, [v[0], v[1], v[2], v[3]])?;
                } else {
                    kb.st_shared_v4_b32(addr, [v[0], v[1], v[2], v[3]])?;
                }
            }
        }
        kb.tmem_wait_st()?;
        if self.pair() {
            kb.fence_proxy_async_shared_cluster()?;
        } else {
            kb.fence_proxy_async_shared()?;
        }
        kb.tcgen05_fence_before()?;
        self.hand_over(kb, cta, BwdBar::DsWritten)
    }

    /// dK (times the softmax scale) and dV of this thread's key, its warpgroup's half of
    /// the columns. A key tile whose walk had query tiles reads them from TMEM (its
    /// `walked`-th dK/dV hand-off); one whose walk was empty stores zeros and touches no
    /// barrier: were its hand-off committed too, the MMA thread could complete two phases
    /// of `dkv_full` before these warps saw the first, and their parity wait would then
    /// never pass (the protocol model found this).
    fn epilogue(
        &self,
        kb: &mut Kb<'ctx>,
        cta: &Cta<'ctx>,
        pl: &Place<'ctx>,
        walked: IntValue<'ctx>,
        key: IntValue<'ctx>,
        steps: IntValue<'ctx>,
    ) -> R<()> {
        kb.section("epilogue: dK *= scale, store dK, dV (each warpgroup half of the columns)")?;
        let any = kb.icmp(IntPredicate::SGT, steps, kb.i32c(0), "walk_had_tiles")?;
        kb.if_else(
            any,
            "epilogue_from_tmem",
            |kb| {
                self.wait(kb, self.bar(kb, cta, BwdBar::DkvFull)?, kb.and(walked, kb.i32c(1), "")?)?;
                kb.tcgen05_fence_after()?;
                self.store_dk_dv(kb, cta, pl, key, true)?;
                kb.tcgen05_fence_before()?;
                self.hand_over(kb, cta, BwdBar::DkvEmpty)
            },
            |kb| self.store_dk_dv(kb, cta, pl, key, false),
        )
    }

    /// Stores this thread's dK·scale and dV columns, from TMEM or (`from_tmem` false) zeros.
    fn store_dk_dv(
        &self,
        kb: &mut Kb<'ctx>,
        cta: &Cta<'ctx>,
        pl: &Place<'ctx>,
        key: IntValue<'ctx>,
        from_tmem: bool,
    ) -> R<()> {
        let spec = self.spec;
        let inside = kb.icmp(IntPredicate::SLT, key, cta.bv.seqlen_k, "key_inside")?;
        let (dk_st, dv_st) = (self.args.strides("dk")?, self.args.strides("dv")?);
        let (ko, vo) = kv_row_offsets(kb, spec, &cta.la, &cta.bv, &dk_st, &dv_st, key, cta.hkv)?;
        // The TMEM row address without the compute half's column offset.
        let row_taddr = kb.sub(pl.taddr, kb.mul(pl.half, kb.i32c(64), "")?, "")?;
        for (col0, off, base, d, scale) in [
            (self.tmem.dk.0, ko, self.args.int("dk")?, spec.head_dim_qk, Some(spec.scale_value())),
            (self.tmem.dv.0, vo, self.args.int("dv")?, spec.head_dim_v, None),
        ] {
            let cols = d / 2;
            let taddr = kb.add(row_taddr, kb.mul(pl.half, kb.i32c(cols as i64), "")?, "")?;
            let first_col = kb.mul(pl.half, kb.i32c(cols as i64), "first_col")?;
            let row = kb.add(base, kb.mul(off, kb.i64c(2), "")?, "")?;
            let row = kb.add(row, kb.mul(kb.zext64(first_col, "")?, kb.i64c(2), "")?, "grad_row")?;
            for c in 0..cols / EPI_CHUNK {
                let v: Vec<FloatValue<'ctx>> = if from_tmem {
                    let raw = kb.tmem_load(taddr, col0 + c * EPI_CHUNK, EPI_CHUNK, EPI_CHUNK, "grad_raw")?;
                    raw.into_iter()
                        .map(|r| {
                            let x = kb.bits_f(r, "grad")?;
                            match scale {
                                Some(s) => kb.fmul(x, kb.f32c(s), "grad"),
                                None => Ok(x),
                            }
                        })
                        .collect::<R<_>>()?
                } else {
                    vec![kb.f32c(0.0); EPI_CHUNK as usize]
                };
                let packed = kb.pack_pairs(spec.dtype, &v, "packed")?;
                kb.if_then(inside, "store_grad", |kb| {
                    for (i, w) in packed.iter().enumerate() {
                        let off = ((c * EPI_CHUNK) as i64 + 2 * i as i64) * 2;
                        kb.st_global_b32(kb.add(row, kb.i64c(off), "")?, *w)?;
                    }
                    Ok(())
                })?;
            }
        }
        Ok(())
    }

    // ------------------------------------------------------------------ dQ reduce

    fn reduce(&self, kb: &mut Kb<'ctx>) -> R<()> {
        let spec = self.spec;
        kb.section("role: dQ reduce (warps 0-3): dQ out of TMEM into dq_accum")?;
        let cta = self.cta(kb)?;
        let lane_row = kb.add(kb.mul(cta.warp, kb.i32c(32), "")?, cta.lane, "tmem_lane")?;
        let taddr = kb.add(cta.tmem, kb.shl(kb.mul(cta.warp, kb.i32c(32), "")?, kb.i32c(16), "")?, "taddr_row")?;
        let d = spec.head_dim_qk;
        // 1-CTA: lane r holds query row r, every column. Pair mode: this CTA's 64 rows
        // (from 64·rank), row r's first d/2 columns in lane r, its last in lane 64 + r.
        let (row, col0, cols) = if self.pair() {
            debug_assert_eq!(dq_pair_place(64, d), (0, d / 2));
            let r = kb.and(lane_row, kb.i32c(63), "")?;
            let row = kb.add(kb.mul(cta.rank, kb.i32c(64), "")?, r, "q_row")?;
            let col0 = kb.mul(kb.lshr(lane_row, kb.i32c(6), "")?, kb.i32c((d / 2) as i64), "dq_col0")?;
            (row, col0, d / 2)
        } else {
            (lane_row, kb.i32c(0), d)
        };
        let slices = dq_mode_is(kb, &self.args, DqAccumulation::Slices)?;
        let ordered = dq_mode_is(kb, &self.args, DqAccumulation::Ordered)?;
        let slice = kb.select_i(slices, kb.sreg("ctaid.x", "")?, kb.i32c(0), "dq_slice")?;
        let t0 = kb.icmp(IntPredicate::EQ, lane_row, kb.i32c(0), "reduce_t0")?;
        let waits = kb.and(ordered, t0, "turn_waiter")?;
        let turn_flag_slot = kb.slot(kb.ctx.i64_type().into(), "turn_flag", kb.i64c(0).into())?;
        let turn_mine = kb.slot_i32("turn_mine", kb.i32c(0))?;
        let dqs = DqSlice::new(kb, spec, &self.args, cta.seqlen_pad, cta.bv.b, slice)?;
        let pos = kb.slot_i32("reduce_pos", kb.i32c(0))?;
        walk_key_tiles(kb, cta.n_tiles, reversed_key_tiles(kb, &self.args, true)?, |kb, n, _it| {
            let qt = self.queries(kb, &cta, n)?;
            qt.walk(kb, cta.m_tiles, pos, |kb, p: QueryPair<'ctx>, pos| {
                let h = qt.head(kb, p.g)?;
                let m = qt.tile_of(kb, p.m)?;
                // Ordered mode (common::dq_order): one thread reads the visit's turn from
                // the plan and waits for it while dQ is computed; the warpgroup adds after
                // a barrier. (Pair mode: both CTAs wait for the same predecessor.)
                kb.if_then(waits, "dq_turn", |kb| {
                    let m0 = kb.mul(m, kb.i32c(BWD_BLOCK_M as i64), "")?;
                    let tile_row = ws_row(kb, spec.q_heads, cta.seqlen_pad, cta.bv.b, h, m0)?;
                    let (flag, mine) = (turn_flag(kb, &self.args, tile_row)?, cta.turn_key(kb, n, p.m)?);
                    let idx = cta.turn_plan_index(kb, spec, h, m, n)?;
                    let plan = self.args.int("turn_plan")?;
                    let wait_for =
                        kb.ld_global_b32(kb.add(plan, kb.mul(idx, kb.i64c(4), "")?, "")?, "turn_wait_for")?;
                    let turn = DqTurn { flag, wait_for, mine };
                    kb.set(turn_flag_slot, turn.flag)?;
                    kb.set(turn_mine, turn.mine)?;
                    turn.wait(kb)
                })?;
                kb.if_then(ordered, "dq_turn_bar", |kb| kb.named_bar_sync(REDUCE_BAR, 128))?;
                self.wait(kb, self.bar(kb, &cta, BwdBar::DqFull)?, kb.and(pos, kb.i32c(1), "")?)?;
                kb.tcgen05_fence_after()?;
                let m0 = kb.mul(m, kb.i32c(BWD_BLOCK_M as i64), "m0")?;
                let q = kb.add(m0, row, "q")?;
                let q_in = kb.icmp(IntPredicate::SLT, q, cta.bv.seqlen_q, "q_in")?;
                let dst = kb.add(
                    dqs.base,
                    kb.mul(ws_row(kb, spec.q_heads, cta.seqlen_pad, cta.bv.b, h, q)?, kb.i64c(d as i64 * 4), "")?,
                    "dq_row",
                )?;
                let dst = kb.add(dst, kb.mul(kb.zext64(col0, "")?, kb.i64c(4), "")?, "dq_at")?;
                for c in 0..cols / CHUNK {
                    let raw = kb.tmem_load(taddr, self.tmem.dq.0 + c * CHUNK, CHUNK, CHUNK, "dq_raw")?;
                    let v: Vec<FloatValue<'ctx>> = raw.iter().map(|r| kb.bits_f(*r, "dq")).collect::<R<_>>()?;
                    kb.if_then(q_in, "dq_red", |kb| {
                        for i in 0..(CHUNK / 4) as usize {
                            let off = ((c * CHUNK) as i64 + 4 * i as i64) * 4;
                            kb.red_global_add_v4_f32_at(
                                dst,
                                off,
                                [v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]],
                            )?;
                        }
                        Ok(())
                    })?;
                }
                kb.tcgen05_fence_before()?;
                self.hand_over(kb, &cta, BwdBar::DqDrained)?;
                kb.if_then(ordered, "dq_turn_pass", |kb| {
                    kb.section("dQ turn: every add of the warpgroup performed, pass the turn")?;
                    kb.fence_acq_rel_gpu()?;
                    kb.named_bar_sync(REDUCE_BAR, 128)?;
                    kb.if_then(t0, "turn_pass", |kb| self.pass_turn(kb, &cta, pos, turn_flag_slot, turn_mine))
                })
            })
        })
    }

    /// Passes the ordered mode's turn once this visit's adds are complete. Pair mode: the
    /// second CTA's reduce thread 0 reports its adds to the first CTA's (`DqHalfAdded`,
    /// released at cluster scope after its warps' `fence.acq_rel.gpu`), which passes the
    /// turn for both once it has seen them.
    fn pass_turn(
        &self,
        kb: &mut Kb<'ctx>,
        cta: &Cta<'ctx>,
        pos: IntValue<'ctx>,
        flag: Slot<'ctx>,
        mine: Slot<'ctx>,
    ) -> R<()> {
        let pass = |kb: &mut Kb<'ctx>| DqTurn::pass(kb, kb.get_i(flag, "turn_flag")?, kb.get_i(mine, "turn_mine")?);
        if !self.pair() {
            return pass(kb);
        }
        let first = kb.icmp(IntPredicate::EQ, cta.rank, kb.i32c(0), "")?;
        kb.if_else(
            first,
            "pair_turn_pass",
            |kb| {
                kb.mbar_wait_cluster(self.bar(kb, cta, BwdBar::DqHalfAdded)?, kb.and(pos, kb.i32c(1), "")?)?;
                pass(kb)
            },
            |kb| kb.mbar_arrive_cluster(self.gather_bar(kb, cta, BwdBar::DqHalfAdded)?),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::super::backward_plan::kernel_plan;
    use super::super::{verify, Blackwell};
    use crate::arch::Arch;
    use crate::families::Family;
    use crate::module::Direction;
    use attnc_ir::{Align, Spec};

    /// Head dims 64/96/128, masked and not, GQA, fp16, sinks, a score mod, varlen.
    fn variants() -> Vec<Spec> {
        let mut v = Vec::new();
        for d in [64, 96, 128] {
            v.push(Spec::new(&format!("mha_d{d}"), d, 4));
            let mut c = Spec::new(&format!("causal_gqa_d{d}"), d, 8);
            c.kv_heads = 2;
            c.mask.causal = Some(Align::BottomRight);
            v.push(c);
        }
        let mut f = Spec::new("fp16_sinks", 64, 4);
        f.dtype = attnc_ir::DType::Fp16;
        f.sinks = true;
        v.push(f);
        let mut w = Spec::new("window_varlen", 128, 8);
        w.mask.window = Some(attnc_ir::Window { left: Some(256), right: Some(0), align: Align::BottomRight });
        w.kv_layout = attnc_ir::KvLayout::Varlen;
        v.push(w);
        v
    }

    /// The examples and GPU specs whose backward this family builds (the others say why).
    fn backward_examples() -> Vec<Spec> {
        super::super::tests::accepted_examples()
            .into_iter()
            .chain(super::super::tests::specs_in("tests/gpu-specs"))
            .filter(|s| {
                crate::compile::pass_unsupported_reason(s, Direction::Backward).is_none()
                    && Blackwell.unsupported_reason(s, Arch::Sm100a, Direction::Backward).is_none()
            })
            .collect()
    }

    /// Every variant and accepted example assembles for sm_100a within the plan: zero
    /// spills, registers per setmaxnreg region, shared memory, the TMEM allocation, and the
    /// tcgen05/TMA/red SASS. Skips without ptxas; fails when CI is set and ptxas is missing.
    #[test]
    fn the_backward_assembles_within_its_plan() {
        let mut specs = variants();
        specs.extend(backward_examples());
        let mut failures = Vec::new();
        let mut table = String::new();
        for spec in &specs {
            let m = Blackwell
                .compile(spec, Arch::Sm100a, Direction::Backward)
                .unwrap_or_else(|e| panic!("{}: {e}", spec.name));
            assert_eq!(m.family, crate::module::FamilyKind::Blackwell);
            let v = match verify::verify_kernel(&m.ptx, "_blackwell_bwd") {
                Ok(Some(v)) => v,
                Ok(None) => {
                    assert!(std::env::var_os("CI").is_none(), "CI must have ptxas and nvdisasm");
                    eprintln!("skipping: ptxas or nvdisasm not installed");
                    return;
                }
                Err(e) => panic!("{}: {e}", spec.name),
            };
            table.push_str(&format!(
                "{:<26} regs {:>3} spill {:>3} regions {:?} UTCHMMA {:>3} (pair forms {:>3})\n",
                spec.name,
                v.registers,
                v.spill_bytes,
                v.regions.iter().map(|r| (r.budget, r.max_reg)).collect::<Vec<_>>(),
                v.opcodes.get("UTCHMMA").copied().unwrap_or(0),
                v.pair_forms.get("UTCHMMA.2CTA").copied().unwrap_or(0)
            ));
            let plan = kernel_plan(spec).expect("plans");
            for p in verify::backward_problems(&plan, &v) {
                failures.push(format!("{}: {p}", spec.name));
            }
        }
        eprintln!("{table}");
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    /// The step down of a pair kernel that spills: the module rebuilt with one CTA per
    /// key tile at head dim 128 (the full 1-CTA TMEM map) assembles within that plan.
    #[test]
    fn the_pair_steps_down_to_one_cta_per_key_tile() {
        use super::super::backward_plan::{kernel_plan_in, CtaMode};
        let mut s = Spec::new("causal_d128", 128, 8);
        s.kv_heads = 2;
        s.mask.causal = Some(Align::BottomRight);
        let (m, note) = Blackwell
            .step_down(&s, Arch::Sm100a, Direction::Backward, 1)
            .expect("a step down at head dim 128")
            .expect("compiles");
        assert!(note.contains("one CTA per key tile"), "{note}");
        let main = m.kernel(crate::module::KernelRole::BackwardMain).expect("main");
        assert_eq!(main.grid, crate::module::Grid::KeyTiles { parts: 1, ordered_dq: true, pair: false });
        assert_eq!(main.block_n, 128);
        assert!(!m.ptx.contains("cta_group::2") && !m.ptx.contains(".reqnctapercluster"));
        assert!(Blackwell.step_down(&Spec::new("d64", 64, 8), Arch::Sm100a, Direction::Backward, 1).is_none());
        let plan = kernel_plan_in(&s, CtaMode::One).expect("plans");
        assert!(plan.violations().is_empty(), "{:?}", plan.violations());
        match verify::verify_kernel(&m.ptx, "_blackwell_bwd") {
            Ok(Some(v)) => {
                let problems = verify::backward_problems(&plan, &v);
                assert!(problems.is_empty(), "{problems:?}");
            }
            Ok(None) => assert!(std::env::var_os("CI").is_none(), "CI must have ptxas and nvdisasm"),
            Err(e) => panic!("{e}"),
        }
    }

    /// The kernel builds the ordered deterministic mode (the dQ-reduce warps take the
    /// turns): its grid says so, the module has the turn-plan kernel at its tiling, and the
    /// turn's acquire spin and release pass are in the PTX.
    #[test]
    fn the_ordered_deterministic_mode_is_built() {
        for s in variants() {
            let m =
                Blackwell.compile(&s, Arch::Sm100a, Direction::Backward).unwrap_or_else(|e| panic!("{}: {e}", s.name));
            let main = m.kernel(crate::module::KernelRole::BackwardMain).expect("main");
            let pair = s.head_dim_qk == 128;
            assert_eq!(main.grid, crate::module::Grid::KeyTiles { parts: 1, ordered_dq: true, pair }, "{}", s.name);
            assert_eq!(main.block_n, if pair { 256 } else { 128 }, "{}: keys per walk", s.name);
            let plan = m.kernel(crate::module::KernelRole::TurnPlan).expect("turn plan kernel");
            assert_eq!((plan.block_m, plan.block_n), (main.block_m, main.block_n));
            for t in ["ld.acquire.gpu.global.u32", "st.release.gpu.global.u32", "fence.acq_rel.gpu"] {
                assert!(m.ptx.contains(t), "{}: no {t}", s.name);
            }
            // A pair passes the turn once both CTAs' adds are complete: the second CTA
            // reports them at cluster scope, the first acquires them.
            if pair {
                for t in ["mbarrier.arrive.release.cluster.shared::cluster", "try_wait.parity.acquire.cluster"] {
                    assert!(m.ptx.contains(t), "{}: no {t}", s.name);
                }
                // Every tcgen05 instruction of a kernel takes the same CTA group.
                assert!(!m.ptx.contains("cta_group::1"), "{}: a one-CTA tcgen05 form in a pair kernel", s.name);
                assert!(m.ptx.contains(".reqnctapercluster 1, 2, 1"), "{}: not launched as pairs", s.name);
            }
        }
    }

    /// The built plan per head dim (TMEM map, shared memory, warps, barriers, cycles) and
    /// what each example the family declines says: reviewed changes only.
    #[test]
    fn backward_plan_snapshots() {
        for d in [64, 96, 128] {
            let p = kernel_plan(&Spec::new("bwd", d, 8)).expect("plans");
            insta::assert_snapshot!(format!("backward_plan_d{d}"), p.to_string());
        }
        let refused: Vec<String> = super::super::tests::accepted_examples()
            .into_iter()
            .filter(|s| crate::compile::pass_unsupported_reason(s, Direction::Backward).is_none())
            .filter_map(|s| {
                Blackwell.unsupported_reason(&s, Arch::Sm100a, Direction::Backward).map(|r| format!("{}: {r}", s.name))
            })
            .collect();
        insta::assert_snapshot!("backward_refused", refused.join("\n"));
    }

    #[test]
    fn what_the_backward_does_not_build_is_refused_with_a_reason() {
        let mut wide = Spec::new("d256", 256, 4);
        wide.head_dim_v = 256;
        let e = Blackwell.compile(&wide, Arch::Sm100a, Direction::Backward).expect_err("not built").to_string();
        assert!(e.contains("TMEM columns"), "{e}");
        assert!(Blackwell.unsupported_reason(&Spec::new("x", 128, 4), Arch::Sm90a, Direction::Backward).is_some());
    }
}
