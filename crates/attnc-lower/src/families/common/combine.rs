//! The split-KV combine kernel: merges the per-split partial outputs into O.
//!
//! One warp per (batch, head, query row). Lane s reads split s's LSE, the warp reduces
//! them to the total LSE — adding the attention sink here, once, since splits run
//! without it — and the lanes share the d_v columns: `O = Σ_s exp(lse_s − lse) · O_s`,
//! summed in split order with several splits' loads in flight. A merge is a chain of
//! dependent L2 round trips (it runs after the last split's count), so the loads are
//! issued together wherever they can be.

use super::abi::{self, Args};
use crate::llvm::kb::{Kb, Slot, R};
use crate::module::{Grid, KernelInfo, KernelRole};
use crate::variant::layout::{batch_view, packed_row, q_row_offset, BatchView};
use attnc_ir::Spec;
use inkwell::values::{FloatValue, IntValue};
use inkwell::{FloatPredicate, IntPredicate};

const LOG2E: f64 = std::f64::consts::LOG2_E;
const LN2: f64 = std::f64::consts::LN_2;
/// Warps (rows) per CTA.
pub const ROWS_PER_CTA: u32 = 4;
/// Partial-row loads (two f32 each) one lane has in flight in the weighted sum: the
/// splits of a step are `LOADS_IN_FLIGHT / chunks of 64 columns` (16 at d_v 64 and 128,
/// 8 at 256), so that many L2 round trips overlap at 64 registers; 16 splits (batch 1 ×
/// 4k) then take one step.
const LOADS_IN_FLIGHT: u32 = 32;

pub fn build<'ctx>(kb: &mut Kb<'ctx>, spec: &Spec, name: &str) -> R<KernelInfo> {
    let params = abi::combine_params(spec);
    let args = Args::begin(kb, name, &params)?;
    kb.section(&format!("attnc split-KV combine: {}", spec.name))?;
    let tid = kb.sreg("tid.x", "tid")?;
    let lane = kb.and(tid, kb.i32c(31), "lane")?;
    let warp = kb.udiv(tid, kb.i32c(32), "warp")?;
    let q = kb.add(kb.mul(kb.sreg("ctaid.x", "")?, kb.i32c(ROWS_PER_CTA as i64), "")?, warp, "q")?;
    let h = kb.sreg("ctaid.y", "h")?;
    let b = kb.sreg("ctaid.z", "b")?;
    let batch = kb.sreg("nctaid.z", "batch")?;
    let la = crate::variant::layout::LayoutArgs {
        seqlen_q: args.int("seqlen_q")?,
        seqlen_k: args.int("seqlen_q")?,
        cu_seqlens_q: args.opt_int("cu_seqlens_q"),
        cu_seqlens_k: args.opt_int("cu_seqlens_q"),
        block_table: None,
        block_table_stride: None,
        seqused_k: None,
    };
    // Only the query side matters here; a paged spec has padded Q like contiguous.
    let mut q_spec = spec.clone();
    if !matches!(spec.kv_layout, attnc_ir::KvLayout::Varlen) {
        q_spec.kv_layout = attnc_ir::KvLayout::Contiguous;
    }
    let bv = batch_view(kb, &q_spec, &la, b)?;
    let outside = kb.icmp(IntPredicate::SGE, q, bv.seqlen_q, "")?;
    kb.return_if(outside, "row_out_of_range")?;

    let num_splits = args.int("num_splits")?;
    combine_row(kb, spec, &args, &bv, CombineRow { b, h, q, lane, batch, max_seqlen_q: la.seqlen_q, num_splits })?;
    kb.ret()?;
    Ok(KernelInfo {
        name: name.to_string(),
        role: KernelRole::Combine,
        note: None,
        threads_per_block: ROWS_PER_CTA * 32,
        dynamic_smem_bytes: 0,
        block_m: ROWS_PER_CTA,
        block_n: 0,
        params: abi::describe(&params),
        tensor_maps: Vec::new(),
        grid: Grid::Rows,
    })
}

/// One row the combine merges: batch entry `b`, head `h`, query `q` (within its
/// sequence), this thread's `lane` of the warp that merges it, and the launch's batch,
/// padded seqlen_q and split count (the partials' row strides).
#[derive(Clone, Copy)]
pub struct CombineRow<'ctx> {
    pub b: IntValue<'ctx>,
    pub h: IntValue<'ctx>,
    pub q: IntValue<'ctx>,
    pub lane: IntValue<'ctx>,
    pub batch: IntValue<'ctx>,
    pub max_seqlen_q: IntValue<'ctx>,
    pub num_splits: IntValue<'ctx>,
}

/// Merges one row's split partials into O (and its LSE), a warp per row: the combine
/// kernel's body, and the fused combine's (the forward's last split CTA, [`fused_tail`]).
pub fn combine_row<'ctx>(
    kb: &mut Kb<'ctx>,
    spec: &Spec,
    args: &Args<'ctx>,
    bv: &BatchView<'ctx>,
    row: CombineRow<'ctx>,
) -> R<()> {
    let CombineRow { b, h, q, lane, batch, num_splits, .. } = row;
    let max_sq = kb.sext64(row.max_seqlen_q, "")?;
    // Row index of split 0; split s adds s · batch · q_heads · max_sq.
    let row0 = kb.add(
        kb.mul(
            kb.add(kb.mul(kb.sext64(b, "")?, kb.i64c(spec.q_heads as i64), "")?, kb.sext64(h, "")?, "")?,
            max_sq,
            "",
        )?,
        kb.sext64(q, "")?,
        "row0",
    )?;
    let split_stride =
        kb.mul(kb.mul(kb.sext64(batch, "")?, kb.i64c(spec.q_heads as i64), "")?, max_sq, "split_stride")?;
    let lse_part = args.int("lse_partial")?;
    let o_part = args.int("o_partial")?;

    let split_row = |kb: &Kb<'ctx>, s: IntValue<'ctx>| -> R<IntValue<'ctx>> {
        kb.add(row0, kb.mul(kb.sext64(s, "")?, split_stride, "")?, "split_row")
    };
    // Split `s`'s LSE in log2 units; −∞ for a lane past the last split.
    let split_lse2 = |kb: &mut Kb<'ctx>, s: IntValue<'ctx>| -> R<FloatValue<'ctx>> {
        let l2 = kb.slot_f32("split_lse2", kb.f32c(f64::NEG_INFINITY))?;
        let valid = kb.icmp(IntPredicate::SLT, s, num_splits, "")?;
        kb.if_then(valid, "load_split_lse", |kb| {
            let r = split_row(kb, s)?;
            let l = kb.ld_global_f32(kb.add(lse_part, kb.mul(r, kb.i64c(4), "")?, "")?, "lse_s")?;
            kb.set(l2, kb.fmul(l, kb.f32c(LOG2E), "")?)
        })?;
        kb.get_f(l2, "lse_s_log2")
    };
    let dv = spec.head_dim_v;
    // Each lane holds two columns of every 64-column chunk; a lane past d_v reads the
    // row's first pair (its result is not stored).
    let chunks: Vec<(IntValue<'ctx>, IntValue<'ctx>)> = (0..dv.div_ceil(64))
        .map(|chunk| {
            let col = kb.add(kb.mul(lane, kb.i32c(2), "")?, kb.i32c(chunk as i64 * 64), "col")?;
            let in_row = kb.icmp(IntPredicate::SLT, col, kb.i32c(dv as i64), "")?;
            Ok((col, in_row))
        })
        .collect::<R<_>>()?;
    let acc: Vec<[Slot<'ctx>; 2]> = chunks
        .iter()
        .map(|_| Ok([kb.slot_f32("acc0", kb.f32c(0.0))?, kb.slot_f32("acc1", kb.f32c(0.0))?]))
        .collect::<R<_>>()?;
    // Splits in rounds of 32 (lane s of the round holds split s's weight), each round
    // in steps of `in_flight` splits whose partial rows are all loaded before the first
    // is used; past the round's last split, a step repeats that split at no weight.
    let in_flight = i64::from((LOADS_IN_FLIGHT / chunks.len() as u32).clamp(1, 16));
    let in_round_of = |kb: &Kb<'ctx>, base: IntValue<'ctx>| -> R<IntValue<'ctx>> {
        kb.smin(kb.sub(num_splits, base, "")?, kb.i32c(32), "round_splits")
    };
    // The partial rows of splits `base + j0 + u` (`u < in_flight`), with whether each is
    // one of the round's `in_round` splits and its lane in the round.
    type Step<'ctx> = Vec<(IntValue<'ctx>, IntValue<'ctx>, Vec<[FloatValue<'ctx>; 2]>)>;
    let load_step =
        |kb: &Kb<'ctx>, base: IntValue<'ctx>, j0: IntValue<'ctx>, in_round: IntValue<'ctx>| -> R<Step<'ctx>> {
            let last = kb.sub(in_round, kb.i32c(1), "")?;
            (0..in_flight)
                .map(|u| {
                    let j = kb.add(j0, kb.i32c(u), "")?;
                    let valid = kb.icmp(IntPredicate::SLT, j, in_round, "split_valid")?;
                    let j = kb.smin(j, last, "")?;
                    let r = split_row(kb, kb.add(base, j, "")?)?;
                    let xs = chunks
                        .iter()
                        .map(|&(col, in_row)| {
                            let col = kb.select_i(in_row, col, kb.i32c(0), "")?;
                            let at = kb.add(kb.mul(r, kb.i64c(dv as i64), "")?, kb.zext64(col, "")?, "")?;
                            kb.ld_global_v2_f32(kb.add(o_part, kb.mul(at, kb.i64c(4), "")?, "")?, "o_s")
                        })
                        .collect::<R<Vec<_>>>()?;
                    Ok((valid, j, xs))
                })
                .collect()
        };
    // Adds a loaded step, split by split in order, each at its lane's weight.
    let add_step = |kb: &Kb<'ctx>, step: Step<'ctx>, weight: FloatValue<'ctx>| -> R<()> {
        for (valid, j, xs) in step {
            let w = kb.shfl_idx_f32(weight, j, "w")?;
            for (a, x) in acc.iter().zip(xs) {
                for (slot, x) in a.iter().zip(x) {
                    let old = kb.get_f(*slot, "")?;
                    kb.set(*slot, kb.select_f(valid, kb.fma(w, x, old, "")?, old, "")?)?;
                }
            }
        }
        Ok(())
    };

    kb.section("combine: max and sum of split LSEs, a lane per split")?;
    let sink2 = if spec.sinks {
        let sinks = args.int("sinks")?;
        let addr = kb.add(sinks, kb.mul(kb.sext64(h, "")?, kb.i64c(4), "")?, "")?;
        let sink = kb.ld_global_f32(addr, "sink")?;
        kb.fmul(sink, kb.f32c(LOG2E), "sink_log2")?
    } else {
        kb.f32c(f64::NEG_INFINITY)
    };
    // Every LSE read at once (lane s holds split s; a launch of more than 32 splits
    // takes more rounds), then warp reductions: one round trip to L2 where a loop over
    // the splits waited on each load in turn. The first step's partial rows do not
    // depend on the weights: they are loaded now, so their round trip is the LSEs'.
    let own_lse2 = split_lse2(kb, lane)?;
    let in_round0 = in_round_of(kb, kb.i32c(0))?;
    let first_step = load_step(kb, kb.i32c(0), kb.i32c(0), in_round0)?;
    let max = kb.slot_f32("lse_max", kb.fmax(own_lse2, sink2, "")?)?;
    // Rounds of 32 splits (more than one only past 32 splits).
    let rounds = kb.udiv(kb.add(num_splits, kb.i32c(31), "")?, kb.i32c(32), "split_rounds")?;
    let more_splits = |kb: &mut Kb<'ctx>, name: &str, f: &mut dyn FnMut(&mut Kb<'ctx>, FloatValue<'ctx>) -> R<()>| {
        kb.for_range(kb.i32c(1), rounds, name, |kb, round| {
            let s = kb.add(kb.mul(round, kb.i32c(32), "")?, lane, "")?;
            let l2 = split_lse2(kb, s)?;
            f(kb, l2)
        })
    };
    more_splits(kb, "max_rounds", &mut |kb, l2| kb.set(max, kb.fmax(kb.get_f(max, "")?, l2, "")?))?;
    let m = kb.warp_max_f32(kb.get_f(max, "")?)?;
    let m_inf = kb.fcmp(FloatPredicate::OEQ, m, kb.f32c(f64::NEG_INFINITY), "")?;
    let m_safe = kb.select_f(m_inf, kb.f32c(0.0), m, "m_safe")?;
    let sum = kb.slot_f32("lse_sum", kb.ex2(kb.fsub(own_lse2, m_safe, "")?, "")?)?;
    more_splits(kb, "sum_rounds", &mut |kb, l2| {
        let w = kb.ex2(kb.fsub(l2, m_safe, "")?, "")?;
        kb.set(sum, kb.fadd(kb.get_f(sum, "")?, w, "")?)
    })?;
    let total = kb.warp_sum_f32(kb.get_f(sum, "")?)?;
    // The sink joins once, after the lanes' sums.
    let total = kb.fadd(total, kb.ex2(kb.fsub(sink2, m_safe, "")?, "")?, "sum")?;
    let empty = kb.fcmp(FloatPredicate::OEQ, total, kb.f32c(0.0), "")?;
    let safe = kb.select_f(empty, kb.f32c(1.0), total, "")?;
    // lse (log2 units) = m + log2(sum)
    let lse2 = kb.fadd(m_safe, kb.lg2(safe, "")?, "lse_log2")?;

    kb.section("combine: weighted sum of split outputs")?;
    let o_st = args.strides("o")?;
    let o_base = args.int("o")?;
    let off = q_row_offset(kb, bv, &o_st, q, h)?;
    let o_row = kb.add(o_base, kb.mul(off, kb.i64c(2), "")?, "o_row")?;
    // A round's steps from `first` on: each loads its splits' partial rows, then adds them.
    let add_steps = |kb: &mut Kb<'ctx>,
                     base: IntValue<'ctx>,
                     in_round: IntValue<'ctx>,
                     weight: FloatValue<'ctx>,
                     first: i64|
     -> R<()> {
        let steps = kb.udiv(kb.add(in_round, kb.i32c(in_flight - 1), "")?, kb.i32c(in_flight), "")?;
        kb.for_range(kb.i32c(first), steps, "acc_steps", |kb, step| {
            let j0 = kb.mul(step, kb.i32c(in_flight), "")?;
            let loaded = load_step(kb, base, j0, in_round)?;
            add_step(kb, loaded, weight)
        })
    };
    // Round 0: its first step (loaded above), then the rest of its steps.
    let weight0 = kb.ex2(kb.fsub(own_lse2, lse2, "")?, "lane_weight")?;
    add_step(kb, first_step, weight0)?;
    add_steps(kb, kb.i32c(0), in_round0, weight0, 1)?;
    // Rounds past the first 32 splits.
    kb.for_range(kb.i32c(1), rounds, "acc_rounds", |kb, round| {
        let base = kb.mul(round, kb.i32c(32), "round_split0")?;
        let l2 = split_lse2(kb, kb.add(base, lane, "")?)?;
        let weight = kb.ex2(kb.fsub(l2, lse2, "")?, "lane_weight")?;
        let in_round = in_round_of(kb, base)?;
        add_steps(kb, base, in_round, weight, 0)
    })?;
    for (&(col, in_row), a) in chunks.iter().zip(&acc) {
        kb.if_then(in_row, "col_guard", |kb| {
            let a0 = kb.select_f(empty, kb.f32c(0.0), kb.get_f(a[0], "")?, "")?;
            let a1 = kb.select_f(empty, kb.f32c(0.0), kb.get_f(a[1], "")?, "")?;
            let packed = kb.pack_half2(spec.dtype, a0, a1, "o_pair")?;
            let addr = kb.add(o_row, kb.mul(kb.zext64(col, "")?, kb.i64c(2), "")?, "")?;
            kb.st_global_b32(addr, packed)
        })?;
    }
    if spec.lse {
        let first = kb.icmp(IntPredicate::EQ, lane, kb.i32c(0), "")?;
        kb.if_then(first, "store_lse", |kb| {
            let lse = kb.fmul(lse2, kb.f32c(LN2), "")?;
            let lse = kb.select_f(empty, kb.f32c(f64::NEG_INFINITY), lse, "lse")?;
            let lse_base = args.int("lse")?;
            let sh = args.int("lse_stride_head")?;
            let hoff = kb.mul(kb.sext64(h, "")?, sh, "")?;
            let off = match bv.q_start {
                Some(start) => kb.add(hoff, kb.sext64(kb.add(start, q, "")?, "")?, "")?,
                None => {
                    let sb = args.int("lse_stride_batch")?;
                    kb.add(kb.add(kb.mul(kb.sext64(b, "")?, sb, "")?, hoff, "")?, kb.sext64(q, "")?, "")?
                }
            };
            kb.st_global_f32(kb.add(lse_base, kb.mul(off, kb.i64c(4), "")?, "")?, lse)
        })?;
    }
    Ok(())
}

/// Which threads of a split CTA fence its partials against the split count. The
/// counting thread's `atom.acq_rel.gpu` comes after the CTA's barrier, and a release is
/// cumulative over what the barrier ordered before it (the PTX memory model's causality
/// order; CUTLASS's semaphores release after `__syncthreads` the same way), so the
/// per-thread fences are a belt the model does not need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MergeFences {
    /// Every thread fences before the barrier, and in the combining CTA after it.
    EveryThread,
    /// The release side by the counting thread only; every thread of the combining CTA
    /// still fences before reading the others' partials.
    ReleaseByCounter,
    /// Both sides by the counting thread's `atom.acq_rel.gpu` (the combining CTA's
    /// threads read after the barrier that follows it).
    ByCounter,
}

/// Where a forward CTA of a split launch stands, for the fused combine: the split
/// counter of its row block and the rows it covers.
pub struct FusedCombine<'ctx> {
    pub fences: MergeFences,
    /// The `split_counters` buffer (u32 per row block, zero between launches).
    pub counters: IntValue<'ctx>,
    /// This CTA's row block (the same for every split of it).
    pub counter_index: IntValue<'ctx>,
    pub num_splits: IntValue<'ctx>,
    /// This thread among the `threads` that stored the partials (a whole number of warps
    /// that meet at named barrier `bar_id`).
    pub thread: IntValue<'ctx>,
    pub threads: u32,
    pub bar_id: u32,
    /// The row block's rows `[row0, rows_end)` (packed rows under pack_gqa).
    pub row0: IntValue<'ctx>,
    pub rows_end: IntValue<'ctx>,
    pub pack_gqa: bool,
    pub head_idx: IntValue<'ctx>,
    pub hkv: IntValue<'ctx>,
    pub b: IntValue<'ctx>,
    pub batch: IntValue<'ctx>,
    pub max_seqlen_q: IntValue<'ctx>,
}

/// The split-KV combine fused into the forward: after a split CTA has stored its
/// partials, it counts itself on its row block's counter; the CTA that completes the
/// count (the last split to finish, whichever it is) merges the block's rows, a warp per
/// row, and sets the counter back to zero for the next launch. This saves the combine
/// launch and its gap; the merge itself reads the partials in split order, so the
/// result does not depend on which CTA finishes last. Call only when the launch splits
/// (a uniform condition).
pub fn fused_tail<'ctx>(
    kb: &mut Kb<'ctx>,
    spec: &Spec,
    args: &Args<'ctx>,
    bv: &BatchView<'ctx>,
    f: &FusedCombine<'ctx>,
) -> R<()> {
    kb.section("split-KV: count this split; the last one to finish combines its row block")?;
    // Every thread's partial stores, before the count that publishes them.
    if f.fences == MergeFences::EveryThread {
        kb.fence_acq_rel_gpu()?;
    }
    let counter = kb.add(f.counters, kb.mul(kb.sext64(f.counter_index, "")?, kb.i64c(4), "")?, "split_counter")?;
    let is_first = kb.icmp(IntPredicate::EQ, f.thread, kb.i32c(0), "counts")?;
    let done_before = kb.slot_i32("splits_done_before", kb.i32c(0))?;
    // The barrier first: every thread's fence precedes the count.
    kb.named_bar_sync(f.bar_id, f.threads)?;
    kb.if_then(is_first, "count_split", |kb| {
        let old = kb.atom_add_acq_rel_gpu_u32(counter, kb.i32c(1), "done_before")?;
        kb.set(done_before, old)
    })?;
    let old = kb.get_i(done_before, "")?;
    let completes = kb.icmp(IntPredicate::EQ, old, kb.sub(f.num_splits, kb.i32c(1), "")?, "")?;
    let completes = kb.and(is_first, completes, "")?;
    let last = kb.bar_red_or(f.bar_id, f.threads, kb.zext32(completes, "")?, "last_split")?;
    let last = kb.icmp(IntPredicate::NE, last, kb.i32c(0), "is_last_split")?;
    kb.if_then(last, "fused_combine", |kb| {
        kb.if_then(is_first, "reset_counter", |kb| kb.st_relaxed_gpu_u32(counter, kb.i32c(0)))?;
        // The other splits' partials, after the count that saw them all.
        if f.fences != MergeFences::ByCounter {
            kb.fence_acq_rel_gpu()?;
        }
        kb.section("combine (fused): a warp per row of the block")?;
        let lane = kb.and(f.thread, kb.i32c(31), "lane")?;
        let warp = kb.udiv(f.thread, kb.i32c(32), "combine_warp")?;
        let group = spec.group_size() as i64;
        let r0 = kb.add(f.row0, warp, "")?;
        let row = kb.slot_i32("combine_row", r0)?;
        kb.while_loop(
            "combine_rows",
            |kb| {
                let r = kb.get_i(row, "")?;
                kb.icmp(IntPredicate::SLT, r, f.rows_end, "")
            },
            |kb| {
                let r = kb.get_i(row, "r")?;
                let (q, h) = packed_row(kb, f.pack_gqa, group, r, f.head_idx, f.hkv)?;
                let cr = CombineRow {
                    b: f.b,
                    h,
                    q,
                    lane,
                    batch: f.batch,
                    max_seqlen_q: f.max_seqlen_q,
                    num_splits: f.num_splits,
                };
                combine_row(kb, spec, args, bv, cr)?;
                kb.set(row, kb.add(r, kb.i32c(i64::from(f.threads / 32)), "")?)
            },
        )
    })
}
