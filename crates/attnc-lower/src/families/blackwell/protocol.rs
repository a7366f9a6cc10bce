//! A CPU model of the kernel's synchronization protocol, to check what no B200 can:
//! that the roles never deadlock and never read a buffer before it is filled or refill
//! it before it is drained, under any timing.
//!
//! Each role is an op list built with the same wait parities and arrival counts as the
//! emitted code (`forward.rs`, `forward/softmax.rs`, `forward/epilogue.rs`): mbarrier
//! waits on a phase parity, arrivals, TMA loads completing asynchronously with
//! transaction bytes, `tcgen05.commit` arrivals firing in issue order once earlier MMAs
//! finish, cp.async arrivals of the gather warps, and the softmax ping-pong's named
//! barriers. A scheduler runs random interleavings (async completions included) and
//! checks, at every wait that passes, that the data it guards is the data the waiter
//! expects (no phase aliasing), and at every refill that the slot was released.
//!
//! The model follows the code by hand, so it checks the protocol's arithmetic (parity
//! formulas, counts, ring positions, split of work between roles), not the PTX itself.

use super::config::{Bar, Config, PvOrder};
use std::collections::{BTreeMap, VecDeque};

/// What a buffer holds when a barrier phase completes: the key the waiter checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tag {
    /// Ring position `pos` loaded (K at even, V at odd positions).
    Kv(u32),
    /// Ring position `pos` released by the MMA thread (its MMAs completed).
    KvFree(u32),
    /// S of global key-tile step `step` for Q tile `i`.
    S(u32, u32),
    /// P (and corrected O) of step `step` for Q tile `i`.
    P(u32, u32),
    /// Anything else (counted, not checked).
    None,
}

#[derive(Clone, Debug)]
enum Op {
    /// Wait until barrier `b`'s phase of parity `parity` completed; then `expect` must
    /// be among what that phase published.
    Wait { b: Bar, parity: u32, expect: Tag },
    /// Plain arrival (one modeled participant), publishing `tag`.
    Arrive { b: Bar, tag: Tag },
    /// `mbarrier.arrive.expect_tx` + `loads` TMA loads completing later.
    ArriveTx { b: Bar, loads: u32, tag: Tag },
    /// `tcgen05.commit`: an arrival once every earlier MMA of the thread completed.
    Commit { b: Bar, tag: Tag },
    /// A cp.async batch whose `noinc` arrival fires when it lands.
    CpAsyncArrive { b: Bar, tag: Tag },
    /// Named barrier: arrive (and with `sync`, wait for the generation to complete).
    Named { id: u32, sync: bool },
    /// Asserts (at issue) that ring position `pos - slots` was released: refill safety.
    Refill { pos: u32 },
}

struct Mbar {
    count: u32,
    pending: u32,
    tx: u32,
    phase: u32,
    /// Tags published in the current phase, and in each completed phase by parity
    /// (the last completed phase of each parity).
    current: Vec<Tag>,
    done: [Vec<Tag>; 2],
}

impl Mbar {
    fn new(count: u32) -> Mbar {
        Mbar { count, pending: count, tx: 0, phase: 0, current: Vec::new(), done: [Vec::new(), Vec::new()] }
    }
    fn complete_if_ready(&mut self) {
        if self.pending == 0 && self.tx == 0 {
            let p = (self.phase & 1) as usize;
            self.done[p] = std::mem::take(&mut self.current);
            self.phase += 1;
            self.pending = self.count;
        }
    }
    /// The phase of parity `parity` has completed (`mbarrier.try_wait.parity`).
    fn passed(&self, parity: u32) -> bool {
        (self.phase & 1) != parity
    }
}

/// One scenario: the key tiles each work tile of this CTA walks (0 = a work tile with no
/// live key tile), and which work tiles end past seqlen_k on a paged/varlen layout (the
/// softmax then waits for that tile's V to zero its tail rows).
#[derive(Clone, Debug)]
pub struct Scenario {
    pub tiles: Vec<u32>,
    pub v_tail: bool,
}

/// The op list of every role for `sc` under `cfg`.
fn roles(cfg: &Config, sc: &Scenario) -> Vec<(String, Vec<Op>)> {
    let slots = cfg.kv_slots;
    let ring = |pos: u32| (pos % slots, (pos / slots) & 1);
    let qt = cfg.q_tiles;
    let mut out = Vec::new();

    // TMA load thread (Q always; K/V unless gathered).
    let mut load = Vec::new();
    let (mut kv_pos, mut q_cnt) = (0u32, 0u32);
    for &n in &sc.tiles {
        for idx in 0..n {
            if idx == 0 {
                load.push(Op::Wait { b: Bar::QEmpty, parity: (q_cnt & 1) ^ 1, expect: Tag::None });
                for i in 0..qt {
                    load.push(Op::ArriveTx { b: Bar::QFull(i), loads: 2, tag: Tag::None });
                }
                q_cnt += 1;
            }
            if !cfg.gather {
                for pos in [kv_pos + 2 * idx, kv_pos + 2 * idx + 1] {
                    let (slot, par) = ring(pos);
                    load.push(Op::Wait { b: Bar::KvEmpty(slot), parity: par ^ 1, expect: free_tag(pos, slots) });
                    load.push(Op::Refill { pos });
                    load.push(Op::ArriveTx { b: Bar::KvFull(slot), loads: 2, tag: Tag::Kv(pos) });
                }
            }
        }
        kv_pos += 2 * n;
    }
    out.push(("load".to_string(), load));

    // Gather warps (K at even, V at odd ring positions).
    if cfg.gather {
        for is_v in [0u32, 1] {
            let mut g = Vec::new();
            let mut base = 0;
            for &n in &sc.tiles {
                for idx in 0..n {
                    let pos = base + 2 * idx + is_v;
                    let (slot, par) = ring(pos);
                    g.push(Op::Wait { b: Bar::KvEmpty(slot), parity: par ^ 1, expect: free_tag(pos, slots) });
                    g.push(Op::Refill { pos });
                    g.push(Op::CpAsyncArrive { b: Bar::KvFull(slot), tag: Tag::Kv(pos) });
                }
                base += 2 * n;
            }
            out.push((format!("gather{is_v}"), g));
        }
    }

    // MMA thread.
    let mut mma = Vec::new();
    let (mut kv_pos, mut q_cnt, mut step0) = (0u32, 0u32, 0u32);
    let fenced = cfg.pv_order == PvOrder::Fenced;
    for &n in &sc.tiles {
        let tiles_before = kv_pos >> 1;
        for idx in 0..n {
            let kpos = kv_pos + 2 * idx;
            let (kslot, kpar) = ring(kpos);
            mma.push(Op::Wait { b: Bar::KvFull(kslot), parity: kpar, expect: Tag::Kv(kpos) });
            if idx == 0 {
                for i in 0..qt {
                    mma.push(Op::Wait { b: Bar::QFull(i), parity: q_cnt & 1, expect: Tag::None });
                }
                for i in 0..qt {
                    mma.push(Op::Commit { b: Bar::SFull(i), tag: Tag::S(step0, i) });
                }
            } else {
                let vpos = kpos - 1;
                let (vslot, vpar) = ring(vpos);
                mma.push(Op::Wait { b: Bar::KvFull(vslot), parity: vpar, expect: Tag::Kv(vpos) });
                let waits = tiles_before + idx - 1;
                for i in 0..qt {
                    mma.push(Op::Wait { b: Bar::PFull(i), parity: waits & 1, expect: Tag::P(step0 + idx - 1, i) });
                    if fenced {
                        let pv_waits = waits - q_cnt;
                        mma.push(Op::Commit { b: Bar::PvDone(i), tag: Tag::None });
                        mma.push(Op::Wait { b: Bar::PvDone(i), parity: pv_waits & 1, expect: Tag::None });
                    }
                    mma.push(Op::Commit { b: Bar::SFull(i), tag: Tag::S(step0 + idx, i) });
                }
                mma.push(Op::Commit { b: Bar::KvEmpty(vslot), tag: Tag::KvFree(vpos) });
            }
            mma.push(Op::Commit { b: Bar::KvEmpty(kslot), tag: Tag::KvFree(kpos) });
        }
        if n > 0 {
            q_cnt += 1;
            mma.push(Op::Commit { b: Bar::QEmpty, tag: Tag::None });
            let vpos = kv_pos + 2 * n - 1;
            let (vslot, vpar) = ring(vpos);
            mma.push(Op::Wait { b: Bar::KvFull(vslot), parity: vpar, expect: Tag::Kv(vpos) });
            let waits = tiles_before + n - 1;
            for i in 0..qt {
                mma.push(Op::Wait { b: Bar::PFull(i), parity: waits & 1, expect: Tag::P(step0 + n - 1, i) });
                mma.push(Op::Commit { b: Bar::OFull(i), tag: Tag::None });
            }
            mma.push(Op::Commit { b: Bar::KvEmpty(vslot), tag: Tag::KvFree(vpos) });
        }
        kv_pos += 2 * n;
        step0 += n;
    }
    out.push(("mma".to_string(), mma));

    // Softmax warpgroups.
    for stage in 0..qt {
        let mut sm = Vec::new();
        if qt == 2 && stage == 1 {
            sm.push(Op::Named { id: 1, sync: false });
        }
        let (mut s_cnt, mut f_cnt, mut base, mut step0) = (0u32, 0u32, 0u32, 0u32);
        for &n in &sc.tiles {
            for idx in 0..n {
                sm.push(Op::Wait { b: Bar::SFull(stage), parity: s_cnt & 1, expect: Tag::S(step0 + idx, stage) });
                s_cnt += 1;
                if sc.v_tail && stage == 0 && idx == 0 && !cfg.gather {
                    let vpos = base + 2 * idx + 1;
                    let (slot, par) = ring(vpos);
                    sm.push(Op::Wait { b: Bar::KvFull(slot), parity: par, expect: Tag::Kv(vpos) });
                }
                sm.push(Op::Arrive { b: Bar::Stats(stage), tag: Tag::None });
                if qt == 2 {
                    sm.push(Op::Named { id: 1 + stage, sync: true });
                    sm.push(Op::Named { id: 2 - stage, sync: false });
                }
                sm.push(Op::Arrive { b: Bar::PFull(stage), tag: Tag::P(step0 + idx, stage) });
            }
            sm.push(Op::Wait { b: Bar::FinalEmpty(stage), parity: (f_cnt & 1) ^ 1, expect: Tag::None });
            sm.push(Op::Arrive { b: Bar::FinalFull(stage), tag: Tag::None });
            f_cnt += 1;
            base += 2 * n;
            step0 += n;
        }
        if qt == 2 && stage == 0 {
            sm.push(Op::Named { id: 1, sync: true });
        }
        out.push((format!("softmax{stage}"), sm));
    }

    // Correction warpgroup (and epilogue).
    let mut corr = Vec::new();
    let (mut st_cnt, mut o_cnt, mut f_cnt, mut step0) = (0u32, 0u32, 0u32, 0u32);
    for &n in &sc.tiles {
        for idx in 0..n {
            for i in 0..qt {
                corr.push(Op::Wait { b: Bar::Stats(i), parity: st_cnt & 1, expect: Tag::None });
                // Its arrival completes PFull with the softmax's: the P it releases.
                corr.push(Op::Arrive { b: Bar::PFull(i), tag: Tag::P(step0 + idx, i) });
            }
            st_cnt += 1;
        }
        for i in 0..qt {
            corr.push(Op::Wait { b: Bar::FinalFull(i), parity: f_cnt & 1, expect: Tag::None });
            corr.push(Op::Arrive { b: Bar::FinalEmpty(i), tag: Tag::None });
            if n > 0 {
                corr.push(Op::Wait { b: Bar::OFull(i), parity: o_cnt & 1, expect: Tag::None });
            }
        }
        f_cnt += 1;
        o_cnt += u32::from(n > 0);
        step0 += n;
    }
    out.push(("correction".to_string(), corr));
    out
}

/// What the producer's wait for a free slot must see: the release of the position the
/// slot held before (none for a slot's first fill).
fn free_tag(pos: u32, slots: u32) -> Tag {
    if pos >= slots {
        Tag::KvFree(pos - slots)
    } else {
        Tag::None
    }
}

/// A deterministic xorshift generator (the tests need reproducible schedules only).
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// Runs one random interleaving of `sc` under `cfg`; `Err` describes a deadlock or a
/// protocol violation.
pub fn run(cfg: &Config, sc: &Scenario, seed: u64) -> Result<(), String> {
    simulate(cfg, &roles(cfg, sc), seed)
}

/// Runs the roles' op lists under one random schedule.
fn simulate(cfg: &Config, procs: &[(String, Vec<Op>)], seed: u64) -> Result<(), String> {
    let mut bars: BTreeMap<Bar, Mbar> =
        cfg.mbarriers().into_iter().map(|b| (b, Mbar::new(model_count(cfg, b)))).collect();
    let mut pc = vec![0usize; procs.len()];
    // Async completions: TMA loads (any order), per-thread FIFO commits and cp.async.
    let mut tma: Vec<Bar> = Vec::new();
    let mut fifo: Vec<VecDeque<(Bar, Tag)>> = vec![VecDeque::new(); procs.len()];
    let mut named: BTreeMap<u32, (u32, u32)> = BTreeMap::new(); // id -> (arrivals, generation)
    let mut named_wait: Vec<Option<(u32, u32)>> = vec![None; procs.len()];
    let mut released: std::collections::BTreeSet<u32> = Default::default();
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let arrive = |bars: &mut BTreeMap<Bar, Mbar>, b: Bar, tag: Tag, released: &mut std::collections::BTreeSet<u32>| {
        if let Tag::KvFree(p) = tag {
            released.insert(p);
        }
        let m = bars.get_mut(&b).expect("barrier");
        m.current.push(tag);
        m.pending -= 1;
        m.complete_if_ready();
    };
    loop {
        // Every step that can run now: (kind, index).
        let mut ready: Vec<(u8, usize)> = Vec::new();
        for (p, (_, ops)) in procs.iter().enumerate() {
            if let Some((id, gen)) = named_wait[p] {
                if named[&id].1 > gen {
                    ready.push((0, p));
                }
                continue;
            }
            let Some(op) = ops.get(pc[p]) else { continue };
            let can = match op {
                Op::Wait { b, parity, .. } => bars[b].passed(*parity),
                _ => true,
            };
            if can {
                ready.push((0, p));
            }
        }
        for i in 0..tma.len() {
            ready.push((1, i));
        }
        for (p, q) in fifo.iter().enumerate() {
            if !q.is_empty() {
                ready.push((2, p));
            }
        }
        if ready.is_empty() {
            let stuck: Vec<String> = procs
                .iter()
                .enumerate()
                .filter(|(p, (_, ops))| pc[*p] < ops.len())
                .map(|(p, (name, ops))| format!("{name} at op {} {:?}", pc[p], ops[pc[p]]))
                .collect();
            return if stuck.is_empty() { Ok(()) } else { Err(format!("deadlock: {}", stuck.join("; "))) };
        }
        let (kind, i) = ready[rng.below(ready.len())];
        match kind {
            1 => {
                let b = tma.swap_remove(i);
                let m = bars.get_mut(&b).expect("barrier");
                m.tx -= 1;
                m.complete_if_ready();
            }
            2 => {
                let (b, tag) = fifo[i].pop_front().expect("queued");
                arrive(&mut bars, b, tag, &mut released);
            }
            _ => {
                let p = i;
                if named_wait[p].take().is_some() {
                    pc[p] += 1;
                    continue;
                }
                let name = &procs[p].0;
                match procs[p].1[pc[p]].clone() {
                    Op::Wait { b, parity, expect } => {
                        let seen = &bars[&b].done[parity as usize];
                        if expect != Tag::None && !seen.contains(&expect) {
                            return Err(format!(
                                "{name}: wait on {b:?} (parity {parity}) passed on {seen:?}, expected {expect:?}"
                            ));
                        }
                    }
                    Op::Arrive { b, tag } => arrive(&mut bars, b, tag, &mut released),
                    Op::ArriveTx { b, loads, tag } => {
                        let m = bars.get_mut(&b).expect("barrier");
                        m.tx += loads;
                        tma.extend(std::iter::repeat_n(b, loads as usize));
                        arrive(&mut bars, b, tag, &mut released);
                    }
                    Op::Commit { b, tag } | Op::CpAsyncArrive { b, tag } => fifo[p].push_back((b, tag)),
                    Op::Named { id, sync } => {
                        let e = named.entry(id).or_insert((0, 0));
                        let gen = e.1;
                        e.0 += 1;
                        if e.0 == 2 {
                            *e = (0, gen + 1);
                        }
                        if sync {
                            named_wait[p] = Some((id, gen));
                            continue;
                        }
                    }
                    Op::Refill { pos } => {
                        if pos >= cfg.kv_slots && !released.contains(&(pos - cfg.kv_slots)) {
                            return Err(format!(
                                "{name}: refills ring position {pos} before {} was released",
                                pos - cfg.kv_slots
                            ));
                        }
                    }
                }
                pc[p] += 1;
            }
        }
    }
}

/// Arrival counts in model participants: warpgroups and gather warps count once.
fn model_count(cfg: &Config, b: Bar) -> u32 {
    match b {
        Bar::PFull(_) => 2,
        Bar::Stats(_) | Bar::FinalFull(_) | Bar::FinalEmpty(_) => 1,
        Bar::KvFull(_) => {
            // TMA: one arrival (+ bytes); gather: one warp (32 lanes in the kernel).
            debug_assert!(!cfg.gather || cfg.bar_count(b) == 32);
            1
        }
        _ => cfg.bar_count(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use attnc_ir::{KvLayout, Spec};

    fn configs() -> Vec<(String, Config)> {
        let mut out = Vec::new();
        let mut gather = Spec::new("gather", 64, 8);
        gather.kv_layout = KvLayout::Paged { page_size: 1 };
        let mut wide = Spec::new("192/128", 192, 8);
        wide.head_dim_v = 128;
        for spec in [Spec::new("d64", 64, 8), Spec::new("d128", 128, 8), wide, Spec::new("d256", 256, 8), gather] {
            let cfg = Config::for_spec(&spec).expect("cfg");
            for order in [PvOrder::Fenced, PvOrder::InOrderPipe] {
                let mut c = cfg.clone();
                c.pv_order = order;
                out.push((format!("{} slots {} tiles {} {order:?}", spec.name, c.kv_slots, c.q_tiles), c));
            }
        }
        out
    }

    /// Every configuration (ring depths 2, 4 and 8; one and two Q tiles; TMA and gather
    /// loads; both PV orders) over work-tile sequences with empty work tiles, single
    /// tiles and more tiles than slots, many random interleavings each: no deadlock, no
    /// wait passing on another phase's data, no slot refilled before its release.
    #[test]
    fn no_deadlock_or_aliasing_under_random_timing() {
        let scenarios =
            [vec![1], vec![3], vec![0, 2, 0, 1], vec![5, 1, 4], vec![9, 0, 0, 7, 2], vec![1, 1, 1, 1, 1, 1]];
        for (name, cfg) in configs() {
            for tiles in &scenarios {
                for v_tail in [false, true] {
                    let sc = Scenario { tiles: tiles.clone(), v_tail };
                    for seed in 0..60 {
                        if let Err(e) = run(&cfg, &sc, seed) {
                            panic!("{name}, tiles {tiles:?}, v_tail {v_tail}, seed {seed}: {e}");
                        }
                    }
                }
            }
        }
    }

    /// The model catches the bugs it is for: a wrong parity deadlocks or aliases.
    #[test]
    fn a_wrong_parity_is_caught() {
        let cfg = Config::for_spec(&Spec::new("d128", 128, 8)).expect("cfg");
        let sc = Scenario { tiles: vec![6, 3], v_tail: false };
        let mut procs = roles(&cfg, &sc);
        // Flip the MMA thread's first KvFull wait parity after the ring wrapped.
        let mma = &mut procs.iter_mut().find(|(n, _)| n == "mma").expect("mma").1;
        let mut flipped = 0;
        for op in mma.iter_mut() {
            if let Op::Wait { b: Bar::KvFull(_), parity, expect: Tag::Kv(pos) } = op {
                if *pos >= cfg.kv_slots {
                    *parity ^= 1;
                    flipped += 1;
                    break;
                }
            }
        }
        assert_eq!(flipped, 1);
        let failures = (0..40).filter(|&seed| simulate(&cfg, &procs, seed).is_err()).count();
        assert!(failures > 0, "a flipped parity went unnoticed");
    }
}
