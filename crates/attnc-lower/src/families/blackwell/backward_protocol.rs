//! A CPU model of the planned blackwell backward's synchronization (`backward_plan.rs`):
//! the load, MMA, compute and dQ-reduce roles as op lists over mbarriers, with the TMEM
//! overlays as regions whose contents every read checks. Random interleavings (TMA loads
//! landing and MMAs completing asynchronously, MMAs in issue order) must finish without a
//! deadlock, and every read must see the data it expects — a region overwritten before its
//! reader ran, or read before its writer finished, is reported.
//!
//! It pins the issue orders the plan's overlays rely on before the kernel exists: in the
//! 2-CTA map dQ lives in the upper half of S, so the next Sᵀ must wait until the reduce
//! warps drained dQ (the test shows what happens without that wait).

use super::backward_plan::CtaMode;
use std::collections::{BTreeMap, VecDeque};

/// A TMEM region of the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Region {
    /// Sᵀ's first half (Pᵀ overlays it).
    SLo,
    /// Sᵀ's second half (dQ overlays it in 2-CTA mode).
    SHi,
    /// dPᵀ (dSᵀ and, 1-CTA, dQ overlay it).
    Dp,
}

/// What a region holds: the buffer and the query-tile step that produced it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Data {
    Empty,
    S(u32),
    P(u32),
    Dp(u32),
    Ds(u32),
    Dq(u32),
}

#[derive(Clone, Debug)]
enum Op {
    /// Wait for the `n`-th completion (0-based) of barrier `b`.
    Wait(&'static str, u32),
    Arrive(&'static str),
    /// A TMA load whose completion arrives on the barrier later.
    Load(&'static str),
    /// An MMA: when it completes (in issue order) it reads then writes regions.
    Mma {
        reads: Vec<(Region, Data)>,
        writes: Vec<(Region, Data)>,
    },
    /// `tcgen05.commit`: arrives once every earlier MMA completed.
    Commit(&'static str),
    /// tcgen05.ld / st of the issuing role, at issue.
    Ld(Region, Data),
    St(Region, Data),
}

/// The roles' op lists for `steps` query tiles; `dq_wait_before_s` is the 2-CTA wait of
/// the next Sᵀ on the dQ drain.
fn roles(mode: CtaMode, steps: u32, dq_wait_before_s: bool) -> Vec<(&'static str, Vec<Op>)> {
    use Op::*;
    let mut load = Vec::new();
    for j in 0..steps {
        if j >= 2 {
            load.push(Wait("q_empty", j - 2));
        }
        load.push(Load("q_full"));
        if j >= 1 {
            load.push(Wait("do_empty", j - 1));
        }
        load.push(Load("do_full"));
    }
    let dq_region = match mode {
        CtaMode::One => Region::Dp,
        CtaMode::Two => Region::SHi,
    };
    let s = |j| Mma { reads: vec![], writes: vec![(Region::SLo, Data::S(j)), (Region::SHi, Data::S(j))] };
    let dp = |j| Mma { reads: vec![], writes: vec![(Region::Dp, Data::Dp(j))] };
    let dv = |j| Mma { reads: vec![(Region::SLo, Data::P(j))], writes: vec![] };
    let dk = |j| Mma { reads: vec![(Region::Dp, Data::Ds(j))], writes: vec![] };
    let dq = |j| Mma { reads: vec![], writes: vec![(dq_region, Data::Dq(j))] };
    let mut mma = Vec::new();
    for j in 0..steps {
        let previous = [Wait("ds_written", j.wrapping_sub(1)), dk(j.wrapping_sub(1)), Commit("q_empty")];
        match mode {
            // 1-CTA: Sᵀ, then the previous tile's dK and dQ (dQ over dPᵀ/dSᵀ, after dK read
            // dSᵀ), and the next dPᵀ only once the reduce warps drained dQ.
            CtaMode::One => {
                mma.extend([Wait("q_full", j), s(j), Commit("s_full")]);
                if j >= 1 {
                    mma.extend(previous);
                    mma.extend([dq(j - 1), Commit("dq_full"), Wait("dq_drained", j - 1)]);
                }
            }
            // 2-CTA: dQ lies over Sᵀ's upper half, so the previous tile's dK and dQ come
            // first and the next Sᵀ waits for the drain.
            CtaMode::Two => {
                if j >= 1 {
                    mma.extend(previous);
                    mma.extend([dq(j - 1), Commit("dq_full")]);
                    if dq_wait_before_s {
                        mma.push(Wait("dq_drained", j - 1));
                    }
                }
                mma.extend([Wait("q_full", j), s(j), Commit("s_full")]);
            }
        }
        mma.extend([Wait("do_full", j), dp(j), Commit("dp_full"), Wait("p_written", j), dv(j), Commit("do_empty")]);
    }
    if steps > 0 {
        let j = steps - 1;
        mma.extend([Wait("ds_written", j), dk(j), Commit("q_empty"), dq(j), Commit("dq_full")]);
    }
    let mut compute = Vec::new();
    for j in 0..steps {
        compute.extend([
            Wait("s_full", j),
            Ld(Region::SLo, Data::S(j)),
            Ld(Region::SHi, Data::S(j)),
            St(Region::SLo, Data::P(j)),
            Arrive("p_written"),
            Wait("dp_full", j),
            Ld(Region::Dp, Data::Dp(j)),
            St(Region::Dp, Data::Ds(j)),
            Arrive("ds_written"),
        ]);
    }
    let mut reduce = Vec::new();
    for j in 0..steps {
        reduce.extend([Wait("dq_full", j), Ld(dq_region, Data::Dq(j)), Arrive("dq_drained")]);
    }
    vec![("load", load), ("mma", mma), ("compute", compute), ("dq reduce", reduce)]
}

struct Rng(u64);
impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// One random interleaving; `Err` names a deadlock or a read that saw the wrong data.
fn simulate(procs: &[(&'static str, Vec<Op>)], seed: u64) -> Result<(), String> {
    let mut completions: BTreeMap<&'static str, u32> = BTreeMap::new();
    let mut tmem: BTreeMap<Region, Data> =
        [Region::SLo, Region::SHi, Region::Dp].into_iter().map(|r| (r, Data::Empty)).collect();
    let mut pc = vec![0usize; procs.len()];
    let mut loads: Vec<&'static str> = Vec::new();
    // The MMA thread's queue: MMAs and commits complete in issue order.
    let mut mma_queue: VecDeque<(&'static str, Op)> = VecDeque::new();
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let check = |tmem: &BTreeMap<Region, Data>, who: &str, r: Region, want: Data| -> Result<(), String> {
        let have = tmem[&r];
        if have == want {
            Ok(())
        } else {
            Err(format!("{who} read {r:?} expecting {want:?}, found {have:?}"))
        }
    };
    loop {
        let mut ready: Vec<(u8, usize)> = Vec::new();
        for (p, (_, ops)) in procs.iter().enumerate() {
            let Some(op) = ops.get(pc[p]) else { continue };
            let can = match op {
                Op::Wait(b, n) => completions.get(b).copied().unwrap_or(0) > *n,
                _ => true,
            };
            if can {
                ready.push((0, p));
            }
        }
        for i in 0..loads.len() {
            ready.push((1, i));
        }
        if !mma_queue.is_empty() {
            ready.push((2, 0));
        }
        if ready.is_empty() {
            let stuck: Vec<String> = procs
                .iter()
                .enumerate()
                .filter(|(p, (_, ops))| pc[*p] < ops.len())
                .map(|(p, (name, ops))| format!("{name} at {:?}", ops[pc[p]]))
                .collect();
            return if stuck.is_empty() { Ok(()) } else { Err(format!("deadlock: {}", stuck.join("; "))) };
        }
        match ready[rng.below(ready.len())] {
            (1, i) => *completions.entry(loads.swap_remove(i)).or_insert(0) += 1,
            (2, _) => match mma_queue.pop_front() {
                Some((_, Op::Mma { reads, writes })) => {
                    for (r, d) in reads {
                        check(&tmem, "an MMA", r, d)?;
                    }
                    for (r, d) in writes {
                        tmem.insert(r, d);
                    }
                }
                Some((_, Op::Commit(b))) => *completions.entry(b).or_insert(0) += 1,
                _ => {}
            },
            (_, p) => {
                let (name, ops) = &procs[p];
                match &ops[pc[p]] {
                    Op::Wait(..) => {}
                    Op::Arrive(b) => *completions.entry(b).or_insert(0) += 1,
                    Op::Load(b) => loads.push(b),
                    op @ (Op::Mma { .. } | Op::Commit(_)) => mma_queue.push_back((name, op.clone())),
                    Op::Ld(r, d) => check(&tmem, name, *r, *d)?,
                    Op::St(r, d) => {
                        tmem.insert(*r, *d);
                    }
                }
                pc[p] += 1;
            }
        }
    }
}

/// Runs `seeds` random interleavings of `steps` query tiles in `mode`.
pub fn check(mode: CtaMode, steps: u32, seeds: u64) -> Result<(), String> {
    let procs = roles(mode, steps, true);
    (0..seeds).try_for_each(|s| simulate(&procs, s).map_err(|e| format!("seed {s}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_planned_orders_never_deadlock_or_read_stale_tmem() {
        for mode in [CtaMode::One, CtaMode::Two] {
            for steps in [1, 2, 3, 7] {
                check(mode, steps, 300).unwrap_or_else(|e| panic!("{mode:?}, {steps} tiles: {e}"));
            }
        }
    }

    #[test]
    fn without_the_drain_wait_the_next_s_overwrites_dq_in_2cta_mode() {
        let procs = roles(CtaMode::Two, 4, false);
        let failures: Vec<String> = (0..300).filter_map(|s| simulate(&procs, s).err()).collect();
        assert!(!failures.is_empty(), "the race should show under some interleaving");
        assert!(failures.iter().any(|e| e.contains("SHi") && e.contains("Dq")), "{failures:?}");
    }

    #[test]
    fn a_missing_p_written_wait_is_caught() {
        let mut procs = roles(CtaMode::One, 3, true);
        let mma = &mut procs[1].1;
        let i = mma.iter().position(|op| matches!(op, Op::Wait("p_written", _))).expect("wait");
        mma.remove(i);
        assert!((0..300).any(|s| simulate(&procs, s).is_err()), "dV could read S instead of P");
    }
}
