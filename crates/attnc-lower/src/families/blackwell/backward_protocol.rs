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

/// A TMEM region of the model, or (the built kernel's model) a shared-memory buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Region {
    /// Sᵀ's first half (Pᵀ overlays it).
    SLo,
    /// Sᵀ's second half (dQ overlays it in 2-CTA mode).
    SHi,
    /// dPᵀ (dSᵀ and, 1-CTA, dQ overlay it).
    Dp,
    /// dV and dK accumulators (TMEM, live across a key tile's walk).
    Dv,
    Dk,
    /// Shared memory: K and V, the Q stages (with their lse/D rows), dO, dS.
    Kv,
    Q(u32),
    DO,
    DsSmem,
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
    /// A key tile's K and V, or its dK/dV accumulation.
    Kv(u32),
    Dkv(u32),
    /// The query tile at ring position `pos` (Q and its rows), its dO.
    Qt(u32),
    DOt(u32),
}

#[derive(Clone, Debug)]
enum Op {
    /// Wait for the `n`-th completion (0-based) of barrier `b`.
    Wait(&'static str, u32),
    /// `mbarrier.try_wait.parity`: passes once the barrier's current phase has the other
    /// parity, i.e. the last phase of this parity completed — as the hardware does, so a
    /// wait a whole phase early passes too (phase aliasing), and the region checks see it.
    WaitParity(&'static str, u32),
    Arrive(&'static str),
    /// A TMA load whose completion arrives on the barrier later and writes the regions
    /// then.
    Load(&'static str, Vec<(Region, Data)>),
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
        load.push(Load("q_full", vec![]));
        if j >= 1 {
            load.push(Wait("do_empty", j - 1));
        }
        load.push(Load("do_full", vec![]));
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

/// The built 1-CTA kernel's protocol (`backward.rs`) over a CTA's key tiles, `steps[t]`
/// query tiles each (0: a walk the mask left empty): K/V reloaded per key tile after its
/// last MMA, the dK/dV epilogue before the next tile's first dV, Q stages (with their lse
/// and D rows) released after dK, dO after dV, and dS in shared memory read by dQ. The
/// compute warpgroups are one process: each owns disjoint columns (Pᵀ and dSᵀ over its own
/// Sᵀ/dPᵀ columns) and every hand-off waits for both.
fn kernel_roles(steps: &[u32]) -> Vec<(&'static str, Vec<Op>)> {
    use Op::*;
    // Every wait is the kernel's parity wait: on completion `n` of its barrier, parity
    // `n & 1`; a slot's first "free" wait (before any release) parity 1, which a fresh
    // barrier passes.
    let wait = |b: &'static str, n: u32| WaitParity(b, n & 1);
    let q_full = |p: u32| if p % 2 == 0 { "q_full0" } else { "q_full1" };
    let q_empty = |p: u32| if p % 2 == 0 { "q_empty0" } else { "q_empty1" };
    let qr = |p: u32| Region::Q(p % 2);
    let (mut load, mut mma, mut compute, mut reduce) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut pos = 0u32;
    // Key tiles with query tiles so far: only those hand dK/dV over (`dkv_full`,
    // `dkv_empty`); an empty walk's epilogue stores zeros without a barrier.
    let mut walked = 0u32;
    for (t, &n) in steps.iter().enumerate() {
        let t = t as u32;
        // Load: K, V after the previous tile's MMAs; per step Q (+ rows), dO.
        if t > 0 {
            load.push(wait("kv_empty", t - 1));
        }
        load.push(Load("kv_full", vec![(Region::Kv, Data::Kv(t))]));
        for j in 0..n {
            let p = pos + j;
            load.push(WaitParity(q_empty(p), ((p / 2) & 1) ^ 1));
            load.push(Load(q_full(p), vec![(qr(p), Data::Qt(p))]));
            load.push(WaitParity("do_empty", (p & 1) ^ 1));
            load.push(Load("do_full", vec![(Region::DO, Data::DOt(p))]));
        }
        // MMA, in the kernel's issue order.
        let dk_dq = |p: u32, first: bool| -> Vec<Op> {
            let mut dk_reads = vec![(Region::Dp, Data::Ds(p)), (qr(p), Data::Qt(p))];
            if !first {
                dk_reads.push((Region::Dk, Data::Dkv(t)));
            }
            vec![
                wait("ds_written", p),
                Mma { reads: dk_reads, writes: vec![(Region::Dk, Data::Dkv(t))] },
                Commit(q_empty(p)),
                Mma {
                    reads: vec![(Region::DsSmem, Data::Ds(p)), (Region::Kv, Data::Kv(t))],
                    writes: vec![(Region::Dp, Data::Dq(p))],
                },
                Commit("dq_full"),
            ]
        };
        mma.push(wait("kv_full", t));
        for j in 0..n {
            let p = pos + j;
            mma.push(wait(q_full(p), p / 2));
            mma.push(Mma {
                reads: vec![(Region::Kv, Data::Kv(t)), (qr(p), Data::Qt(p))],
                writes: vec![(Region::SLo, Data::S(p)), (Region::SHi, Data::S(p))],
            });
            mma.push(Commit("s_full"));
            if j >= 1 {
                mma.extend(dk_dq(p - 1, j == 1));
            }
            if p >= 1 {
                mma.push(wait("dq_drained", p - 1));
            }
            mma.push(wait("do_full", p));
            mma.push(Mma {
                reads: vec![(Region::Kv, Data::Kv(t)), (Region::DO, Data::DOt(p))],
                writes: vec![(Region::Dp, Data::Dp(p))],
            });
            mma.push(Commit("dp_full"));
            mma.push(wait("p_written", p));
            if j == 0 && walked > 0 {
                mma.push(wait("dkv_empty", walked - 1));
            }
            let mut dv_reads = vec![(Region::SLo, Data::P(p)), (Region::SHi, Data::P(p)), (Region::DO, Data::DOt(p))];
            if j > 0 {
                dv_reads.push((Region::Dv, Data::Dkv(t)));
            }
            mma.push(Mma { reads: dv_reads, writes: vec![(Region::Dv, Data::Dkv(t))] });
            mma.push(Commit("do_empty"));
        }
        if n > 0 {
            mma.extend(dk_dq(pos + n - 1, n == 1));
            mma.push(Commit("dkv_full"));
        }
        mma.push(Commit("kv_empty"));
        // Compute: P (lse from the Q stage's rows), dS (D from them), the epilogue.
        for j in 0..n {
            let p = pos + j;
            compute.extend([
                wait("s_full", p),
                Ld(Region::SLo, Data::S(p)),
                Ld(Region::SHi, Data::S(p)),
                Ld(qr(p), Data::Qt(p)),
                St(Region::SLo, Data::P(p)),
                St(Region::SHi, Data::P(p)),
                Arrive("p_written"),
                wait("dp_full", p),
                Ld(Region::Dp, Data::Dp(p)),
                Ld(qr(p), Data::Qt(p)),
                St(Region::Dp, Data::Ds(p)),
                St(Region::DsSmem, Data::Ds(p)),
                Arrive("ds_written"),
            ]);
            reduce.extend([wait("dq_full", p), Ld(Region::Dp, Data::Dq(p)), Arrive("dq_drained")]);
        }
        if n > 0 {
            compute.extend([
                wait("dkv_full", walked),
                Ld(Region::Dv, Data::Dkv(t)),
                Ld(Region::Dk, Data::Dkv(t)),
                Arrive("dkv_empty"),
            ]);
            walked += 1;
        }
        pos += n;
    }
    vec![("load", load), ("mma", mma), ("compute", compute), ("dq reduce", reduce)]
}

/// Runs `seeds` random interleavings of the built kernel's protocol over key tiles of
/// `steps[t]` query tiles each.
pub fn check_kernel(steps: &[u32], seeds: u64) -> Result<(), String> {
    let procs = kernel_roles(steps);
    (0..seeds).try_for_each(|s| simulate(&procs, s).map_err(|e| format!("seed {s}: {e}")))
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
    let mut tmem: BTreeMap<Region, Data> = BTreeMap::new();
    let mut pc = vec![0usize; procs.len()];
    let mut loads: Vec<(&'static str, Vec<(Region, Data)>)> = Vec::new();
    // The MMA thread's queue: MMAs and commits complete in issue order.
    let mut mma_queue: VecDeque<(&'static str, Op)> = VecDeque::new();
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let check = |tmem: &BTreeMap<Region, Data>, who: &str, r: Region, want: Data| -> Result<(), String> {
        let have = tmem.get(&r).copied().unwrap_or(Data::Empty);
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
                Op::WaitParity(b, par) => completions.get(b).copied().unwrap_or(0) & 1 != *par,
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
            (1, i) => {
                let (b, writes) = loads.swap_remove(i);
                for (r, d) in writes {
                    tmem.insert(r, d);
                }
                *completions.entry(b).or_insert(0) += 1
            }
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
                    Op::Wait(..) | Op::WaitParity(..) => {}
                    Op::Arrive(b) => *completions.entry(b).or_insert(0) += 1,
                    Op::Load(b, writes) => loads.push((b, writes.clone())),
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
    fn the_built_kernels_protocol_holds_over_key_tiles() {
        for steps in [&[1][..], &[3], &[2, 0, 3], &[0, 1, 1], &[5, 4], &[1, 7, 0, 2]] {
            check_kernel(steps, 300).unwrap_or_else(|e| panic!("{steps:?}: {e}"));
        }
    }

    /// Each wait the kernel's overlays rely on is needed: without it some interleaving
    /// reads stale data or overwrites live data. (The MMA thread's `dkv_empty` wait is not
    /// among them: the compute warps store dK and dV before they write the next tile's Pᵀ,
    /// so `p_written` implies it while the same warps do both; the kernel keeps it as a
    /// guard for a split of those roles.)
    #[test]
    fn the_built_kernel_needs_each_of_its_waits() {
        for (bar, what) in [
            ("dq_drained", "dP^T over an undrained dQ"),
            ("kv_empty", "K, V reloaded under the last dQ"),
            ("p_written", "dV reading S instead of P"),
            ("ds_written", "dK reading dP instead of dS"),
        ] {
            let mut procs = kernel_roles(&[3, 2]);
            for (_, ops) in procs.iter_mut() {
                ops.retain(|op| !matches!(op, Op::Wait(b, _) | Op::WaitParity(b, _) if *b == bar));
            }
            let failures = (0..400).filter(|s| simulate(&procs, *s).is_err()).count();
            assert!(failures > 0, "without {bar}: {what} should show");
        }
    }

    /// A wait whose parity is flipped passes a phase early (then a read sees stale data)
    /// or never passes (a deadlock): either way the model reports it, for each role's
    /// waits.
    #[test]
    fn a_flipped_parity_is_caught() {
        for (role, bar) in [
            ("load", "q_empty1"),
            ("load", "do_empty"),
            ("mma", "q_full0"),
            ("mma", "p_written"),
            ("mma", "dq_drained"),
            ("compute", "s_full"),
            ("compute", "dp_full"),
            ("dq reduce", "dq_full"),
        ] {
            let mut procs = kernel_roles(&[4, 3]);
            let ops = &mut procs.iter_mut().find(|(n, _)| *n == role).expect("role").1;
            // Flip the last wait on `bar` (a late one: the early ones may alias harmlessly).
            let i = ops.iter().rposition(|op| matches!(op, Op::WaitParity(b, _) if *b == bar)).expect("a wait");
            if let Op::WaitParity(_, par) = &mut ops[i] {
                *par ^= 1;
            }
            let caught = (0..300).any(|s| simulate(&procs, s).is_err());
            assert!(caught, "{role}: a flipped parity on {bar} went unnoticed");
        }
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
