//! Ordered dQ accumulation: the deterministic backward without per-column slices.
//!
//! In the default grid every key tile's CTA adds its dQ contribution of each query tile
//! it visits into one `dq_accum` with atomics, so the order of the adds (and the f32
//! rounding) changes from run to run. The slice mode ([`DqAccumulation::Slices`]) makes it
//! deterministic by giving each grid column its own slice, but needs few columns (the
//! slices must fit the workspace), and each column's walk over every n-th key tile
//! re-reads Q and dO from memory: measured 0.58–0.68× the default on the H100.
//!
//! Here the grid stays the default one and the CTAs that visit a query tile take turns:
//! a `u32` flag per (batch, query head, query tile) in the workspace holds the order key
//! of the last visit that added, and a visit waits until it holds its predecessor's key.
//!
//! **The order** is the walks' own: key tile `n` visits query tile `m` at walk position
//! `(m − n) mod m_tiles` (the rotated walk of `QueryTiles`), so visits are ordered by
//! (walk position, `n`) — the order in which they arrive when CTAs run at the same pace,
//! so a visit waits only for a predecessor one step ahead of it. Packed as
//! `position · n_tiles + n + 1` ([`order_key`]; 0 means "no visit yet").
//!
//! **No deadlock.** Every wait is on a visit of smaller (position, `n`), and a CTA's own
//! visits have increasing positions, so the waits form no cycle; and the CTAs of one
//! (batch, KV head) — the only ones that wait for each other — are consecutive in the
//! grid and must all be resident at once, which the runtime guarantees by choosing this
//! mode only when a head's key tiles fit on the GPU's resident CTA slots (CTAs start in
//! grid order). `order_model_never_deadlocks` simulates it.
//!
//! **The predecessor** of a visit is the nearest visit before it in that order
//! ([`predecessor_key`]). A small kernel before the main one, the *turn plan*
//! ([`build_turn_plan`]), classifies every (query tile, key tile) pair with the same tile
//! classification the walks skip empty tiles with and writes each visit's predecessor
//! key to `turn_plan[batch][q_head][query tile][key tile]`; the main kernel reads one word
//! per visit. (Computed in the main kernel it cost registers its roles do not have: a
//! serial scan back from the visit spilled in hopper's consumers, a warp-parallel one in
//! its 24-register producer warpgroup; and with a block mask every serial step is a
//! dependent load.)

use super::abi::{describe, Args};
use super::backward::{dynamic_smem_base, main_params, KeyTileCta};
use crate::llvm::kb::{Kb, R};
use crate::module::{Grid, KernelInfo, KernelRole};
use attnc_ir::Spec;
use inkwell::values::IntValue;
use inkwell::IntPredicate;
use serde::{Deserialize, Serialize};

/// How a backward main kernel accumulates dQ: the value of its `deterministic` argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DqAccumulation {
    /// One `dq_accum`, added into with atomics in whatever order the CTAs run.
    Atomic = 0,
    /// Deterministic: one `dq_accum` slice per grid column (one adding thread per
    /// element), summed in slice order by the dQ convert kernel.
    Slices = 1,
    /// Deterministic: one `dq_accum`; the CTAs visiting a query tile add in a fixed order
    /// (this module).
    Ordered = 2,
}

impl DqAccumulation {
    pub fn deterministic(self) -> bool {
        self != DqAccumulation::Atomic
    }

    /// The kernel argument.
    pub fn arg(self) -> i32 {
        self as i32
    }
}

/// Query rows per turn flag: the smallest query tile of any family's backward main kernel,
/// so the flags `[batch, q_heads, seqlen_pad / TURN_ROWS]` cover every family's tiles.
pub const TURN_ROWS: u32 = 64;

/// `u32` turn flags of a launch (zeroed before it).
pub fn turn_flags(batch: usize, q_heads: usize, seqlen_pad: usize) -> usize {
    batch * q_heads * seqlen_pad.div_ceil(TURN_ROWS as usize)
}

/// The walk period: with the rotated walk, key tile `n` visits query tile `m` at position
/// `(m − n) mod m_tiles`; without it at position `m` for every key tile (one class).
fn period(m_tiles: u32, rotate: bool) -> u32 {
    if rotate {
        m_tiles
    } else {
        1
    }
}

/// The order key of key tile `n`'s visit of query tile `m`: `position · n_tiles + n + 1`
/// (position within the period, see [`period`]).
pub fn order_key(n: u32, m: u32, n_tiles: u32, m_tiles: u32, rotate: bool) -> u32 {
    let p = period(m_tiles, rotate);
    let position = (m + p - n % p) % p;
    position * n_tiles + n + 1
}

/// The order key of the visit of query tile `m` just before key tile `n`'s, among the key
/// tiles `visits` says visit it, or 0 when `n` is the first: the largest key below
/// `n`'s. What [`build_turn_plan`] writes.
pub fn predecessor_key(n: u32, m: u32, n_tiles: u32, m_tiles: u32, rotate: bool, visits: impl Fn(u32) -> bool) -> u32 {
    let mine = order_key(n, m, n_tiles, m_tiles, rotate);
    (0..n_tiles)
        .filter(|&c| visits(c))
        .map(|c| order_key(c, m, n_tiles, m_tiles, rotate))
        .filter(|&k| k < mine)
        .max()
        .unwrap_or(0)
}

/// The most key tiles per KV head the turn plan handles (its shared-memory row of keys);
/// the ordered mode needs far fewer (a head's key tiles must fit the resident CTAs).
pub const MAX_TURN_TILES: u32 = 1024;
const PLAN_THREADS: u32 = 128;

/// Key tiles per turn-plan row: `ceil(max seqlen_k / block_n)` rounded up to 4 words (a
/// 16-byte chunk holds a visit's word and its neighbours: the hopper producer copies it
/// with the visit's other rows).
pub fn turn_plan_stride(max_seqlen_k: usize, block_n: u32) -> usize {
    max_seqlen_k.div_ceil(block_n.max(1) as usize).div_ceil(4) * 4
}

/// `u32` words of a launch's turn plan: `[batch][q_heads][seqlen_pad / block_m][stride]`.
pub fn turn_plan_words(
    batch: usize,
    q_heads: usize,
    seqlen_pad: usize,
    max_seqlen_k: usize,
    block_m: u32,
    block_n: u32,
) -> usize {
    batch * q_heads * (seqlen_pad / block_m.max(1) as usize) * turn_plan_stride(max_seqlen_k, block_n)
}

/// [`order_key`] in the kernel (the rotated walk's order).
fn emit_order_key<'ctx>(
    kb: &Kb<'ctx>,
    cta: &KeyTileCta<'ctx>,
    n: IntValue<'ctx>,
    m: IntValue<'ctx>,
    name: &str,
) -> R<IntValue<'ctx>> {
    let p = cta.m_tiles;
    let position = kb.urem(kb.sub(kb.add(m, p, "")?, kb.urem(n, p, "")?, "")?, p, "turn_position")?;
    kb.add(kb.add(kb.mul(position, cta.n_tiles, "")?, n, "")?, kb.i32c(1), name)
}

/// Element index of key tile `n`'s word in the turn plan row of (`b`, `h`, query tile `m`).
pub fn turn_plan_index<'ctx>(
    kb: &Kb<'ctx>,
    spec: &Spec,
    cta: &KeyTileCta<'ctx>,
    h: IntValue<'ctx>,
    m: IntValue<'ctx>,
    n: IntValue<'ctx>,
) -> R<IntValue<'ctx>> {
    let bn = cta.block_n as i64;
    let key_tiles = kb.udiv(kb.add(cta.la.seqlen_k, kb.i32c(bn - 1), "")?, kb.i32c(bn), "")?;
    let stride = kb.and(kb.add(key_tiles, kb.i32c(3), "")?, kb.i32c(!3), "turn_plan_stride")?;
    let m_rows = kb.udiv(cta.seqlen_pad, kb.i32c(cta.block_m as i64), "")?;
    let bh = kb.add(kb.mul(cta.bv.b, kb.i32c(spec.q_heads as i64), "")?, h, "")?;
    let row = kb.add(kb.mul(kb.sext64(bh, "")?, kb.sext64(m_rows, "")?, "")?, kb.sext64(m, "")?, "")?;
    kb.add(kb.mul(row, kb.sext64(stride, "")?, "")?, kb.sext64(n, "")?, "turn_plan_index")
}

/// The turn plan kernel: grid `(ceil(max seqlen_q / block_m), q_heads, batch)`, one CTA
/// per (batch, query head, query tile at `block_m`): every key tile that visits it gets its
/// predecessor's order key (0: the first) — [`predecessor_key`] over the main kernel's
/// classification (intervals or the block mask), for the rotated walk.
pub fn build_turn_plan<'ctx>(kb: &mut Kb<'ctx>, spec: &Spec, name: &str, block_m: u32, block_n: u32) -> R<KernelInfo> {
    let params = main_params(spec);
    let args = Args::begin(kb, name, &params)?;
    kb.section(&format!(
        "attnc backward turn plan: {} (each visit's predecessor in the ordered dQ accumulation)",
        spec.name
    ))?;
    let m = kb.sreg("ctaid.x", "m")?;
    let h = kb.sreg("ctaid.y", "h")?;
    let b = kb.opaque_i32(kb.sreg("ctaid.z", "")?, "b")?;
    let hkv = kb.udiv(h, kb.i32c(spec.group_size() as i64), "hkv")?;
    let cta = KeyTileCta::for_batch(kb, spec, &args, b, hkv, block_m, block_n)?;
    let outside = kb.icmp(IntPredicate::SGE, m, cta.m_tiles, "")?;
    kb.return_if(outside, "query_tile_outside")?;
    let tid = kb.sreg("tid.x", "tid")?;
    let keys = dynamic_smem_base(kb)?;
    let nt = kb.smin(cta.n_tiles, kb.i32c(MAX_TURN_TILES as i64), "n_tiles")?;
    let threads = kb.i32c(PLAN_THREADS as i64);
    let key_at = |kb: &Kb<'ctx>, n: IntValue<'ctx>| kb.add(keys, kb.mul(n, kb.i32c(4), "")?, "key_addr");
    let strided = |kb: &mut Kb<'ctx>, name: &str, body: &dyn Fn(&mut Kb<'ctx>, IntValue<'ctx>) -> R<()>| {
        let n = kb.slot_i32(name, tid)?;
        kb.while_loop(
            name,
            |kb| kb.icmp(IntPredicate::SLT, kb.get_i(n, "")?, nt, ""),
            |kb| {
                let cur = kb.get_i(n, "n")?;
                body(kb, cur)?;
                kb.set(n, kb.add(cur, threads, "")?)
            },
        )
    };
    kb.section("each key tile's order key if it visits the query tile, else 0")?;
    let bm = block_m as i64;
    strided(kb, "visit_keys", &|kb, n| {
        let key = emit_order_key(kb, &cta, n, m, "key")?;
        let visits = if spec.mask.is_none() {
            kb.boolc(true)
        } else {
            let qt = cta.queries(kb, spec, &args, n, false)?;
            let cls = qt.classify(kb, kb.mul(m, kb.i32c(bm), "")?, h)?;
            kb.not(cls.empty, "visits")?
        };
        kb.st_shared_b32(key_at(kb, n)?, kb.select_i(visits, key, kb.i32c(0), "")?)
    })?;
    kb.cta_barrier()?;
    kb.section("each visit's predecessor: the largest key below its own")?;
    let plan = args.int("turn_plan")?;
    strided(kb, "predecessors", &|kb, n| {
        let mine = kb.ld_shared_b32(key_at(kb, n)?, "mine")?;
        let best = kb.slot_i32("best", kb.i32c(0))?;
        kb.for_range(kb.i32c(0), nt, "candidates", |kb, c| {
            let key = kb.ld_shared_b32(key_at(kb, c)?, "cand")?;
            let cur = kb.get_i(best, "")?;
            let better =
                kb.and(kb.icmp(IntPredicate::ULT, key, mine, "")?, kb.icmp(IntPredicate::UGT, key, cur, "")?, "")?;
            kb.set(best, kb.select_i(better, key, cur, "")?)
        })?;
        let idx = turn_plan_index(kb, spec, &cta, h, m, n)?;
        let addr = kb.add(plan, kb.mul(idx, kb.i64c(4), "")?, "")?;
        kb.st_global_b32(addr, kb.get_i(best, "pred")?)
    })?;
    kb.ret()?;
    Ok(KernelInfo {
        name: name.to_string(),
        role: KernelRole::TurnPlan,
        note: None,
        threads_per_block: PLAN_THREADS,
        dynamic_smem_bytes: 4 * MAX_TURN_TILES,
        block_m,
        block_n,
        params: describe(&params),
        tensor_maps: Vec::new(),
        grid: Grid::Rows,
    })
}

/// Whether the key tiles are walked from the last (`variant::tiles::walk_key_tiles`): in
/// the ordered mode, so that CTAs start in the order their turns come. A visit's
/// predecessors are higher key tiles (the query tile's order is descending from it), and
/// under a causal mask those are the short walks: counted from the first, the long walks
/// started first and waited on CTAs not yet started (H100, d128 causal 16k: 0.60× the
/// default; see `docs/hopper.md`).
pub fn reversed_key_tiles<'ctx>(kb: &Kb<'ctx>, args: &Args<'ctx>, kernel_has_it: bool) -> R<IntValue<'ctx>> {
    if !kernel_has_it {
        return Ok(kb.boolc(false));
    }
    let mode = kb.opaque_i32(args.int("deterministic")?, "dq_accumulation")?;
    kb.icmp(IntPredicate::EQ, mode, kb.i32c(DqAccumulation::Ordered.arg() as i64), "reversed_key_tiles")
}

/// One visit's turn: the flag of its (batch, query head, query tile), the key it waits
/// for (from the turn plan) and the key it publishes after its adds.
#[derive(Clone, Copy)]
pub struct DqTurn<'ctx> {
    /// Global address of the flag.
    pub flag: IntValue<'ctx>,
    pub wait_for: IntValue<'ctx>,
    pub mine: IntValue<'ctx>,
}

impl<'ctx> DqTurn<'ctx> {
    /// The visit's flag address and order key, from what the adding code has at hand:
    /// the visit's walk position (`QueryPair::m`, the rotated walk's position of the
    /// query tile) and `ws_row`, the workspace row index of the tile's first query
    /// (`backward::ws_row`, a multiple of [`TURN_ROWS`]). Two multiply-adds: computed
    /// where registers are scarce (more spilled in hopper's consumers).
    pub fn place(
        kb: &Kb<'ctx>,
        args: &Args<'ctx>,
        cta: &KeyTileCta<'ctx>,
        n: IntValue<'ctx>,
        position: IntValue<'ctx>,
        ws_row: IntValue<'ctx>,
    ) -> R<(IntValue<'ctx>, IntValue<'ctx>)> {
        let mine = kb.add(kb.add(kb.mul(position, cta.n_tiles, "")?, n, "")?, kb.i32c(1), "turn_mine")?;
        // Flag (b, h, rows / TURN_ROWS) of `[batch, q_heads, seqlen_pad / TURN_ROWS]`.
        let offset = kb.mul(kb.udiv(ws_row, kb.i64c(TURN_ROWS as i64), "")?, kb.i64c(4), "")?;
        let flag = kb.add(args.int("dq_order")?, offset, "turn_flag")?;
        Ok((flag, mine))
    }

    /// Spins until the predecessor has published (acquire: its adds are visible).
    pub fn wait(&self, kb: &mut Kb<'ctx>) -> R<()> {
        kb.section("dQ turn: wait for the predecessor's adds")?;
        kb.while_loop(
            "turn_wait",
            |kb| {
                let seen = kb.ld_acquire_gpu_u32(self.flag, "turn_seen")?;
                kb.icmp(IntPredicate::NE, seen, self.wait_for, "")
            },
            |_| Ok(()),
        )
    }

    /// Publishes this visit's key (release), after its adds are complete and ordered
    /// before it.
    pub fn pass(kb: &Kb<'ctx>, flag: IntValue<'ctx>, mine: IntValue<'ctx>) -> R<()> {
        kb.st_release_gpu_u32(flag, mine)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator for the random visit sets and schedules.
    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            self.0 >> 33
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n.max(1)
        }
    }

    /// Visit sets of the kinds masks produce: every tile, a causal band, documents
    /// (blocks on the diagonal), and random.
    fn visit_sets(rng: &mut Lcg, nt: u32, mt: u32) -> Vec<Vec<Vec<bool>>> {
        let all = vec![vec![true; mt as usize]; nt as usize];
        let causal = (0..nt).map(|n| (0..mt).map(|m| 2 * n <= m + 1).collect()).collect();
        let docs = (0..nt).map(|n| (0..mt).map(|m| (n * 3 / nt.max(1)) == (m * 3 / mt.max(1))).collect()).collect();
        let random = (0..nt).map(|_| (0..mt).map(|_| rng.below(3) != 0).collect()).collect();
        vec![all, causal, docs, random]
    }

    #[test]
    fn order_keys_are_distinct_and_follow_the_walk() {
        for (nt, mt) in [(4, 9), (9, 4), (6, 6)] {
            for m in 0..mt {
                let mut keys: Vec<u32> = (0..nt).map(|n| order_key(n, m, nt, mt, true)).collect();
                keys.sort();
                keys.dedup();
                assert_eq!(keys.len(), nt as usize);
            }
            // A key tile's visits come in increasing walk position.
            for n in 0..nt {
                let positions: Vec<u32> =
                    (0..mt).map(|i| (n + i) % mt).map(|m| (order_key(n, m, nt, mt, true) - 1) / nt).collect();
                assert!(positions.windows(2).all(|w| w[0] < w[1]), "{positions:?}");
            }
        }
    }

    /// CTAs walking their visits in walk order (rotated), each add waiting for its
    /// predecessor's flag, under random schedules with every CTA of the group resident:
    /// everything completes, and every query tile sees its adds in key order.
    #[test]
    fn order_model_never_deadlocks() {
        let mut rng = Lcg(11);
        for (nt, mt) in [(1, 4), (4, 1), (5, 7), (7, 5), (8, 16), (16, 8), (12, 12)] {
            for v in visit_sets(&mut rng, nt, mt) {
                for _ in 0..20 {
                    let walks: Vec<Vec<u32>> = (0..nt)
                        .map(|n| (0..mt).map(|i| (n + i) % mt).filter(|&m| v[n as usize][m as usize]).collect())
                        .collect();
                    let mut at = vec![0usize; nt as usize];
                    let mut flag = vec![0u32; mt as usize];
                    let mut seen: Vec<Vec<u32>> = vec![Vec::new(); mt as usize];
                    loop {
                        let ready: Vec<usize> = (0..nt as usize)
                            .filter(|&n| {
                                at[n] < walks[n].len() && {
                                    let m = walks[n][at[n]];
                                    flag[m as usize]
                                        == predecessor_key(n as u32, m, nt, mt, true, |c| v[c as usize][m as usize])
                                }
                            })
                            .collect();
                        if ready.is_empty() {
                            break;
                        }
                        let n = ready[rng.below(ready.len() as u64) as usize];
                        let m = walks[n][at[n]];
                        flag[m as usize] = order_key(n as u32, m, nt, mt, true);
                        seen[m as usize].push(flag[m as usize]);
                        at[n] += 1;
                    }
                    for n in 0..nt as usize {
                        assert_eq!(at[n], walks[n].len(), "deadlock: key tile {n} of {nt}x{mt}");
                    }
                    for s in &seen {
                        assert!(s.windows(2).all(|w| w[0] < w[1]));
                    }
                }
            }
        }
    }
}
