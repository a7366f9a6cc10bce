//! CPU models of the blackwell backward's synchronization (`backward/`): the load, MMA,
//! compute and dQ-reduce roles as op lists over mbarriers, with the TMEM overlays and the
//! shared-memory buffers as regions whose contents every read checks. Random
//! interleavings (TMA loads landing and MMAs completing asynchronously, MMAs in issue
//! order) must finish without a deadlock, and every read must see the data it expects —
//! a region overwritten before its reader ran, or read before its writer finished, is
//! reported. One model per built form: one CTA per key tile, and the CTA pair (two CTAs'
//! roles and regions, the first CTA's MMA thread).

use std::collections::{BTreeMap, VecDeque};

/// A TMEM region of the model, or (the built kernel's model) a shared-memory buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Region {
    /// Sᵀ's first half (Pᵀ overlays it).
    SLo,
    /// Sᵀ's second half.
    SHi,
    /// dPᵀ (dSᵀ and, 1-CTA, dQ overlay it).
    Dp,
    /// dV and dK accumulators (TMEM, live across a key tile's walk).
    Dv,
    Dk,
    /// Shared memory: K and V (pair mode: and the Kᵀ columns), the Q stages (1-CTA with
    /// their lse/D rows; pair mode the Q columns of dK), dO (pair mode: its columns), dS.
    Kv,
    Q(u32),
    DO,
    DsSmem,
    /// Pair mode: the Q and dO rows of Sᵀ and dPᵀ, a stage's lse/D rows, and the dS half
    /// written by CTA `c` (dQ's A operand holds both).
    QRow,
    DoRow,
    Rows(u32),
    DsHalf(u32),
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

/// A region of a CTA of the model and what it holds (`(cta, region, data)`).
type Placed = (u8, Region, Data);
/// The roles' op lists, by name.
type Roles = Vec<(&'static str, Vec<Op>)>;

#[derive(Clone, Debug)]
enum Op {
    /// `mbarrier.try_wait.parity`: passes once the barrier's current phase has the other
    /// parity, i.e. the last phase of this parity completed — as the hardware does, so a
    /// wait a whole phase early passes too (phase aliasing), and the region checks see it.
    WaitParity(&'static str, u32),
    Arrive(&'static str),
    /// A TMA load whose completion arrives on the barrier later and writes the regions
    /// then (each region of a CTA: `(cta, region, data)`; 0 with one CTA).
    Load(&'static str, Vec<Placed>),
    /// An MMA: when it completes (in issue order) it reads then writes regions.
    Mma {
        reads: Vec<Placed>,
        writes: Vec<Placed>,
    },
    /// `tcgen05.commit`: arrives once every earlier MMA completed.
    Commit(&'static str),
    /// tcgen05.ld / st (or a shared-memory read / write) of the issuing role, at issue.
    Ld(u8, Region, Data),
    St(u8, Region, Data),
}

/// The built 1-CTA kernel's protocol (`backward.rs`) over a CTA's key tiles, `steps[t]`
/// query tiles each (0: a walk the mask left empty): K/V reloaded per key tile after its
/// last MMA, the dK/dV epilogue before the next tile's first dV, Q stages (with their lse
/// and D rows) released after dK, dO after dV, and dS in shared memory read by dQ. The
/// compute warpgroups are one process: each owns disjoint columns (Pᵀ and dSᵀ over its own
/// Sᵀ/dPᵀ columns) and every hand-off waits for both.
fn kernel_roles(steps: &[u32]) -> Roles {
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
        load.push(Load("kv_full", vec![(0, Region::Kv, Data::Kv(t))]));
        for j in 0..n {
            let p = pos + j;
            load.push(WaitParity(q_empty(p), ((p / 2) & 1) ^ 1));
            load.push(Load(q_full(p), vec![(0, qr(p), Data::Qt(p))]));
            load.push(WaitParity("do_empty", (p & 1) ^ 1));
            load.push(Load("do_full", vec![(0, Region::DO, Data::DOt(p))]));
        }
        // MMA, in the kernel's issue order.
        let dk_dq = |p: u32, first: bool| -> Vec<Op> {
            let mut dk_reads = vec![(0, Region::Dp, Data::Ds(p)), (0, qr(p), Data::Qt(p))];
            if !first {
                dk_reads.push((0, Region::Dk, Data::Dkv(t)));
            }
            vec![
                wait("ds_written", p),
                Mma { reads: dk_reads, writes: vec![(0, Region::Dk, Data::Dkv(t))] },
                Commit(q_empty(p)),
                Mma {
                    reads: vec![(0, Region::DsSmem, Data::Ds(p)), (0, Region::Kv, Data::Kv(t))],
                    writes: vec![(0, Region::Dp, Data::Dq(p))],
                },
                Commit("dq_full"),
            ]
        };
        mma.push(wait("kv_full", t));
        for j in 0..n {
            let p = pos + j;
            mma.push(wait(q_full(p), p / 2));
            mma.push(Mma {
                reads: vec![(0, Region::Kv, Data::Kv(t)), (0, qr(p), Data::Qt(p))],
                writes: vec![(0, Region::SLo, Data::S(p)), (0, Region::SHi, Data::S(p))],
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
                reads: vec![(0, Region::Kv, Data::Kv(t)), (0, Region::DO, Data::DOt(p))],
                writes: vec![(0, Region::Dp, Data::Dp(p))],
            });
            mma.push(Commit("dp_full"));
            mma.push(wait("p_written", p));
            if j == 0 && walked > 0 {
                mma.push(wait("dkv_empty", walked - 1));
            }
            let mut dv_reads =
                vec![(0, Region::SLo, Data::P(p)), (0, Region::SHi, Data::P(p)), (0, Region::DO, Data::DOt(p))];
            if j > 0 {
                dv_reads.push((0, Region::Dv, Data::Dkv(t)));
            }
            mma.push(Mma { reads: dv_reads, writes: vec![(0, Region::Dv, Data::Dkv(t))] });
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
                Ld(0, Region::SLo, Data::S(p)),
                Ld(0, Region::SHi, Data::S(p)),
                Ld(0, qr(p), Data::Qt(p)),
                St(0, Region::SLo, Data::P(p)),
                St(0, Region::SHi, Data::P(p)),
                Arrive("p_written"),
                wait("dp_full", p),
                Ld(0, Region::Dp, Data::Dp(p)),
                Ld(0, qr(p), Data::Qt(p)),
                St(0, Region::Dp, Data::Ds(p)),
                St(0, Region::DsSmem, Data::Ds(p)),
                Arrive("ds_written"),
            ]);
            reduce.extend([wait("dq_full", p), Ld(0, Region::Dp, Data::Dq(p)), Arrive("dq_drained")]);
        }
        if n > 0 {
            compute.extend([
                wait("dkv_full", walked),
                Ld(0, Region::Dv, Data::Dkv(t)),
                Ld(0, Region::Dk, Data::Dkv(t)),
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
    (0..seeds).try_for_each(|s| simulate(&procs, &BTreeMap::new(), s).map_err(|e| format!("seed {s}: {e}")))
}

/// The name of CTA `cta`'s copy of barrier `name` in the pair model (interned: the op
/// lists name barriers by `&'static str`).
fn at(name: &'static str, cta: u8) -> &'static str {
    static NAMES: std::sync::OnceLock<std::sync::Mutex<BTreeMap<(&'static str, u8), &'static str>>> =
        std::sync::OnceLock::new();
    let mut names = NAMES.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    names.entry((name, cta)).or_insert_with(|| Box::leak(format!("{name}@{cta}").into_boxed_str()))
}

/// The pair kernel's protocol (`backward.rs` in pair mode) over a pair's key tiles,
/// `steps[t]` query tiles each: both CTAs' load, compute and dQ-reduce roles, and the
/// first CTA's MMA thread, whose MMAs read and write both CTAs' regions. The operand
/// loads of both CTAs land on the first CTA's "full" barriers (two arrivals a phase),
/// the compute and reduce roles hand over to its barriers (one arrival per CTA), and
/// every commit reaches both CTAs' copies (a multicast; modelled as two commits in a row,
/// which allows more interleavings than the hardware). Each compute role writes its dS
/// into both CTAs' shared memory (`DsHalf(own rank)`); dQ reads both halves in both.
/// Returns the roles and the barriers that need more than one arrival per phase.
fn pair_kernel_roles(steps: &[u32]) -> (Roles, BTreeMap<&'static str, u32>) {
    use Op::*;
    let wait = |b: &'static str, n: u32| WaitParity(at(b, 0), n & 1);
    let wait_in = |b: &'static str, c: u8, n: u32| WaitParity(at(b, c), n & 1);
    let both = |b: &'static str| [Commit(at(b, 0)), Commit(at(b, 1))];
    let q_full = |p: u32| if p % 2 == 0 { "q_full0" } else { "q_full1" };
    let q_empty = |p: u32| if p % 2 == 0 { "q_empty0" } else { "q_empty1" };
    let rows_full = |p: u32| if p % 2 == 0 { "rows_full0" } else { "rows_full1" };
    let ctas = [0u8, 1];
    let each = |f: &dyn Fn(u8) -> Vec<Placed>| -> Vec<Placed> { ctas.iter().flat_map(|c| f(*c)).collect() };
    let mut counts = BTreeMap::new();
    for b in ["kv_full", "q_row_full", "q_full0", "q_full1", "do_row_full", "do_full"] {
        counts.insert(at(b, 0), 2);
    }
    for b in ["p_written", "ds_written", "dkv_empty", "dq_drained"] {
        counts.insert(at(b, 0), 2);
    }
    let mut load = [Vec::new(), Vec::new()];
    let mut compute = [Vec::new(), Vec::new()];
    let mut reduce = [Vec::new(), Vec::new()];
    let mut mma = Vec::new();
    let (mut pos, mut walked) = (0u32, 0u32);
    let tiles = steps.len() as u32;
    for (t, &n) in steps.iter().enumerate() {
        let t = t as u32;
        for c in ctas {
            let l = &mut load[c as usize];
            if t > 0 {
                l.push(wait_in("kv_empty", c, t - 1));
            }
            l.push(Load(at("kv_full", 0), vec![(c, Region::Kv, Data::Kv(t))]));
            for j in 0..n {
                let p = pos + j;
                let s = p % 2;
                l.push(WaitParity(at("q_row_empty", c), (p & 1) ^ 1));
                l.push(Load(at("q_row_full", 0), vec![(c, Region::QRow, Data::Qt(p))]));
                l.push(WaitParity(at(q_empty(p), c), ((p / 2) & 1) ^ 1));
                l.push(Load(at(q_full(p), 0), vec![(c, Region::Q(s), Data::Qt(p))]));
                l.push(Load(at(rows_full(p), c), vec![(c, Region::Rows(s), Data::Qt(p))]));
                l.push(WaitParity(at("do_row_empty", c), (p & 1) ^ 1));
                l.push(Load(at("do_row_full", 0), vec![(c, Region::DoRow, Data::DOt(p))]));
                l.push(WaitParity(at("do_empty", c), (p & 1) ^ 1));
                l.push(Load(at("do_full", 0), vec![(c, Region::DO, Data::DOt(p))]));
            }
        }
        // The first CTA's MMA thread, in the kernel's issue order.
        let dk_dq = |p: u32, first: bool| -> Vec<Op> {
            let s = p % 2;
            let dk_reads = each(&|c| {
                let mut r = vec![(c, Region::Dp, Data::Ds(p)), (c, Region::Q(s), Data::Qt(p))];
                if !first {
                    r.push((c, Region::Dk, Data::Dkv(t)));
                }
                r
            });
            let dq_reads = each(&|c| {
                vec![
                    (c, Region::DsHalf(0), Data::Ds(p)),
                    (c, Region::DsHalf(1), Data::Ds(p)),
                    (c, Region::Kv, Data::Kv(t)),
                ]
            });
            let mut v = vec![
                wait("ds_written", p),
                wait(q_full(p), p / 2),
                Mma { reads: dk_reads, writes: each(&|c| vec![(c, Region::Dk, Data::Dkv(t))]) },
            ];
            v.extend(both(q_empty(p)));
            v.push(Mma { reads: dq_reads, writes: each(&|c| vec![(c, Region::Dp, Data::Dq(p))]) });
            v.extend(both("dq_full"));
            v
        };
        mma.push(wait("kv_full", t));
        for j in 0..n {
            let p = pos + j;
            mma.push(wait("q_row_full", p));
            mma.push(Mma {
                reads: each(&|c| vec![(c, Region::Kv, Data::Kv(t)), (c, Region::QRow, Data::Qt(p))]),
                writes: each(&|c| vec![(c, Region::SLo, Data::S(p)), (c, Region::SHi, Data::S(p))]),
            });
            mma.extend(both("s_full"));
            mma.extend(both("q_row_empty"));
            if j >= 1 {
                mma.extend(dk_dq(p - 1, j == 1));
            }
            if p >= 1 {
                mma.push(wait("dq_drained", p - 1));
            }
            mma.push(wait("do_row_full", p));
            mma.push(Mma {
                reads: each(&|c| vec![(c, Region::Kv, Data::Kv(t)), (c, Region::DoRow, Data::DOt(p))]),
                writes: each(&|c| vec![(c, Region::Dp, Data::Dp(p))]),
            });
            mma.extend(both("dp_full"));
            mma.extend(both("do_row_empty"));
            mma.push(wait("p_written", p));
            if j == 0 && walked > 0 {
                mma.push(wait("dkv_empty", walked - 1));
            }
            mma.push(wait("do_full", p));
            let dv_reads = each(&|c| {
                let mut r =
                    vec![(c, Region::SLo, Data::P(p)), (c, Region::SHi, Data::P(p)), (c, Region::DO, Data::DOt(p))];
                if j > 0 {
                    r.push((c, Region::Dv, Data::Dkv(t)));
                }
                r
            });
            mma.push(Mma { reads: dv_reads, writes: each(&|c| vec![(c, Region::Dv, Data::Dkv(t))]) });
            mma.extend(both("do_empty"));
        }
        if n > 0 {
            mma.extend(dk_dq(pos + n - 1, n == 1));
            mma.extend(both("dkv_full"));
        }
        mma.extend(both("kv_empty"));
        for c in ctas {
            let (cm, rd) = (&mut compute[c as usize], &mut reduce[c as usize]);
            for j in 0..n {
                let p = pos + j;
                let s = p % 2;
                cm.extend([
                    wait_in(rows_full(p), c, p / 2),
                    wait_in("s_full", c, p),
                    Ld(c, Region::SLo, Data::S(p)),
                    Ld(c, Region::SHi, Data::S(p)),
                    Ld(c, Region::Rows(s), Data::Qt(p)),
                    St(c, Region::SLo, Data::P(p)),
                    St(c, Region::SHi, Data::P(p)),
                    Arrive(at("p_written", 0)),
                    wait_in("dp_full", c, p),
                    Ld(c, Region::Dp, Data::Dp(p)),
                    Ld(c, Region::Rows(s), Data::Qt(p)),
                    St(c, Region::Dp, Data::Ds(p)),
                    // Its two warpgroups' dS blocks: one into each CTA.
                    St(0, Region::DsHalf(c as u32), Data::Ds(p)),
                    St(1, Region::DsHalf(c as u32), Data::Ds(p)),
                    Arrive(at("ds_written", 0)),
                ]);
                rd.extend([wait_in("dq_full", c, p), Ld(c, Region::Dp, Data::Dq(p)), Arrive(at("dq_drained", 0))]);
            }
            if n > 0 {
                cm.extend([
                    wait_in("dkv_full", c, walked),
                    Ld(c, Region::Dv, Data::Dkv(t)),
                    Ld(c, Region::Dk, Data::Dkv(t)),
                    Arrive(at("dkv_empty", 0)),
                ]);
            }
        }
        if n > 0 {
            walked += 1;
        }
        pos += n;
    }
    // Each load thread sees the last key tile's commits before the teardown.
    if tiles > 0 {
        for c in ctas {
            load[c as usize].push(wait_in("kv_empty", c, tiles - 1));
        }
    }
    let [l0, l1] = load;
    let [c0, c1] = compute;
    let [r0, r1] = reduce;
    let procs = vec![
        ("load 0", l0),
        ("load 1", l1),
        ("mma", mma),
        ("compute 0", c0),
        ("compute 1", c1),
        ("dq reduce 0", r0),
        ("dq reduce 1", r1),
    ];
    (procs, counts)
}

/// Runs `seeds` random interleavings of the pair kernel's protocol over key tiles of
/// `steps[t]` query tiles each.
pub fn check_pair_kernel(steps: &[u32], seeds: u64) -> Result<(), String> {
    let (procs, counts) = pair_kernel_roles(steps);
    (0..seeds).try_for_each(|s| simulate(&procs, &counts, s).map_err(|e| format!("seed {s}: {e}")))
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
/// `counts` gives the barriers that need more than one arrival (or completed load or
/// commit) per phase.
fn simulate(procs: &[(&'static str, Vec<Op>)], counts: &BTreeMap<&'static str, u32>, seed: u64) -> Result<(), String> {
    let mut completions: BTreeMap<&'static str, u32> = BTreeMap::new();
    let mut arrivals: BTreeMap<&'static str, u32> = BTreeMap::new();
    let mut regions: BTreeMap<(u8, Region), Data> = BTreeMap::new();
    let mut pc = vec![0usize; procs.len()];
    let mut loads: Vec<(&'static str, Vec<Placed>)> = Vec::new();
    // The MMA thread's queue: MMAs and commits complete in issue order.
    let mut mma_queue: VecDeque<(&'static str, Op)> = VecDeque::new();
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let check = |regions: &BTreeMap<(u8, Region), Data>, who: &str, c: u8, r: Region, want: Data| {
        let have = regions.get(&(c, r)).copied().unwrap_or(Data::Empty);
        if have == want {
            Ok(())
        } else {
            Err(format!("{who} read {r:?} of CTA {c} expecting {want:?}, found {have:?}"))
        }
    };
    let mut arrive = |completions: &mut BTreeMap<&'static str, u32>, b: &'static str| {
        let n = arrivals.entry(b).or_insert(0);
        *n += 1;
        if *n >= counts.get(b).copied().unwrap_or(1) {
            *n = 0;
            *completions.entry(b).or_insert(0) += 1;
        }
    };
    loop {
        let mut ready: Vec<(u8, usize)> = Vec::new();
        for (p, (_, ops)) in procs.iter().enumerate() {
            let Some(op) = ops.get(pc[p]) else { continue };
            let can = match op {
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
                for (c, r, d) in writes {
                    regions.insert((c, r), d);
                }
                arrive(&mut completions, b)
            }
            (2, _) => match mma_queue.pop_front() {
                Some((_, Op::Mma { reads, writes })) => {
                    for (c, r, d) in reads {
                        check(&regions, "an MMA", c, r, d)?;
                    }
                    for (c, r, d) in writes {
                        regions.insert((c, r), d);
                    }
                }
                Some((_, Op::Commit(b))) => arrive(&mut completions, b),
                _ => {}
            },
            (_, p) => {
                let (name, ops) = &procs[p];
                match &ops[pc[p]] {
                    Op::WaitParity(..) => {}
                    Op::Arrive(b) => arrive(&mut completions, b),
                    Op::Load(b, writes) => loads.push((b, writes.clone())),
                    op @ (Op::Mma { .. } | Op::Commit(_)) => mma_queue.push_back((name, op.clone())),
                    Op::Ld(c, r, d) => check(&regions, name, *c, *r, *d)?,
                    Op::St(c, r, d) => {
                        regions.insert((*c, *r), *d);
                    }
                }
                pc[p] += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
                ops.retain(|op| !matches!(op, Op::WaitParity(b, _) if *b == bar));
            }
            let failures = (0..400).filter(|s| simulate(&procs, &BTreeMap::new(), *s).is_err()).count();
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
            let caught = (0..300).any(|s| simulate(&procs, &BTreeMap::new(), s).is_err());
            assert!(caught, "{role}: a flipped parity on {bar} went unnoticed");
        }
    }

    #[test]
    fn the_pair_kernels_protocol_holds_over_key_tiles() {
        for steps in [&[1][..], &[3], &[2, 0, 3], &[0, 1, 1], &[5, 4], &[1, 7, 0, 2]] {
            check_pair_kernel(steps, 300).unwrap_or_else(|e| panic!("{steps:?}: {e}"));
        }
    }

    /// The pair's waits, each needed (removed from every role that waits on any CTA's
    /// copy): the first CTA's gathers of both CTAs' operands and hand-overs, each CTA's
    /// own "empty" and row barriers. (`q_full`, dK's Q columns, is not among them: those
    /// loads are issued before the dO loads that dPᵀ waits on, and no random order the
    /// model draws keeps them pending until dK; the kernel keeps the wait.)
    #[test]
    fn the_pair_kernel_needs_each_of_its_waits() {
        for (bar, what) in [
            ("dq_drained", "dP^T over an undrained dQ"),
            ("p_written", "dV reading S instead of P"),
            ("ds_written", "dK/dQ reading dP or a dS half not yet written"),
            ("q_row_full", "S^T reading Q rows not yet landed"),
            ("q_row_empty", "Q rows reloaded under S^T"),
            ("do_row_empty", "dO rows reloaded under dP^T"),
            ("rows_full0", "the compute warps reading lse/D rows not yet landed"),
            ("kv_empty", "K, V reloaded under the last dQ"),
        ] {
            let (mut procs, counts) = pair_kernel_roles(&[3, 2]);
            let named = |b: &str| [at(bar, 0), at(bar, 1)].contains(&b);
            for (_, ops) in procs.iter_mut() {
                ops.retain(|op| !matches!(op, Op::WaitParity(b, _) if named(b)));
            }
            let failures = (0..400).filter(|s| simulate(&procs, &counts, *s).is_err()).count();
            assert!(failures > 0, "without {bar}: {what} should show");
        }
    }

    /// Arrival counts matter: were the first CTA's gathers complete on one CTA's arrival,
    /// its MMA thread would read the other CTA's operands before they land.
    #[test]
    fn the_pair_gathers_need_both_ctas() {
        let (procs, mut counts) = pair_kernel_roles(&[3, 2]);
        counts.insert(at("q_row_full", 0), 1);
        counts.insert(at("p_written", 0), 1);
        assert!((0..300).any(|s| simulate(&procs, &counts, s).is_err()), "a one-CTA gather should show a stale read");
    }

    #[test]
    fn a_flipped_parity_is_caught_in_the_pair() {
        for (role, bar) in [
            ("load 1", "q_empty1@1"),
            ("load 0", "do_empty@0"),
            ("load 1", "q_row_empty@1"),
            ("mma", "q_full0@0"),
            ("mma", "p_written@0"),
            ("mma", "dq_drained@0"),
            ("mma", "do_row_full@0"),
            ("compute 1", "s_full@1"),
            ("compute 0", "rows_full1@0"),
            ("dq reduce 1", "dq_full@1"),
        ] {
            let (mut procs, counts) = pair_kernel_roles(&[4, 3]);
            let ops = &mut procs.iter_mut().find(|(n, _)| *n == role).expect("role").1;
            let i = ops.iter().rposition(|op| matches!(op, Op::WaitParity(b, _) if *b == bar)).expect("a wait");
            if let Op::WaitParity(_, par) = &mut ops[i] {
                *par ^= 1;
            }
            let caught = (0..300).any(|s| simulate(&procs, &counts, s).is_err());
            assert!(caught, "{role}: a flipped parity on {bar} went unnoticed");
        }
    }
}
