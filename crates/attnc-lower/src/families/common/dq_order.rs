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
//! (`backward::build_turn_plan`), classifies every (query tile, key tile) pair with the
//! same tile classification the walks skip empty tiles with and writes each visit's predecessor
//! key to `turn_plan[batch][q_head][query tile][key tile]`; the main kernel reads one word
//! per visit. (Computed in the main kernel it cost registers its roles do not have: a
//! serial scan back from the visit spilled in hopper's consumers, a warp-parallel one in
//! its 24-register producer warpgroup; and with a block mask every serial step is a
//! dependent load.)
//!
//! **Who waits.** Hopper: a dQ-writer thread in the producer warpgroup takes each staged
//! dQ tile from the consumers, waits for the turn, adds it with one bulk reduce and
//! passes the turn once the adds are complete, so the consumers never wait on a turn
//! (H100/H200: 0.96–1.00× the default at d128). Blackwell: the dQ-reduce warps. Key tiles
//! are walked from the last in this mode (`backward::reversed_key_tiles`).

use crate::llvm::kb::{Kb, R};
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

/// The order key of key tile `n`'s visit of query tile `m`: `position · n_tiles + n + 1`,
/// where `position = (m − n) mod m_tiles` is where the rotated walk (`QueryTiles::rotation`;
/// the ordered mode needs it) reaches the tile.
pub fn order_key(n: u32, m: u32, n_tiles: u32, m_tiles: u32) -> u32 {
    let position = (m + m_tiles - n % m_tiles) % m_tiles;
    position * n_tiles + n + 1
}

/// The order key of the visit of query tile `m` just before key tile `n`'s, among the key
/// tiles `visits` says visit it, or 0 when `n` is the first: the largest key below
/// `n`'s. What `backward::build_turn_plan` writes.
pub fn predecessor_key(n: u32, m: u32, n_tiles: u32, m_tiles: u32, visits: impl Fn(u32) -> bool) -> u32 {
    let mine = order_key(n, m, n_tiles, m_tiles);
    (0..n_tiles)
        .filter(|&c| visits(c))
        .map(|c| order_key(c, m, n_tiles, m_tiles))
        .filter(|&k| k < mine)
        .max()
        .unwrap_or(0)
}

/// The most key tiles per KV head the turn plan handles (its shared-memory row of keys);
/// the ordered mode needs far fewer (a head's key tiles must fit the resident CTAs).
pub const MAX_TURN_TILES: u32 = 1024;
/// Threads of the turn plan kernel.
pub const PLAN_THREADS: u32 = 128;

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

/// One visit's turn: the flag of its (batch, query head, query tile), the key it waits
/// for (from the turn plan) and the key it publishes after its adds
/// (`backward::KeyTileCta::turn_place`).
#[derive(Clone, Copy)]
pub struct DqTurn<'ctx> {
    /// Global address of the flag.
    pub flag: IntValue<'ctx>,
    pub wait_for: IntValue<'ctx>,
    pub mine: IntValue<'ctx>,
}

impl<'ctx> DqTurn<'ctx> {
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
                let mut keys: Vec<u32> = (0..nt).map(|n| order_key(n, m, nt, mt)).collect();
                keys.sort();
                keys.dedup();
                assert_eq!(keys.len(), nt as usize);
            }
            // A key tile's visits come in increasing walk position.
            for n in 0..nt {
                let positions: Vec<u32> =
                    (0..mt).map(|i| (n + i) % mt).map(|m| (order_key(n, m, nt, mt) - 1) / nt).collect();
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
                                        == predecessor_key(n as u32, m, nt, mt, |c| v[c as usize][m as usize])
                                }
                            })
                            .collect();
                        if ready.is_empty() {
                            break;
                        }
                        let n = ready[rng.below(ready.len() as u64) as usize];
                        let m = walks[n][at[n]];
                        flag[m as usize] = order_key(n as u32, m, nt, mt);
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
