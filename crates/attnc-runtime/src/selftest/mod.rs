//! `attnc selftest`: every spec × a matrix of shapes on the GPU, against the f64 reference
//! executor (`attnc_ir::reference`).
//!
//! For each spec (heads reduced to at most `max_kv_heads` KV heads, same group size, as
//! the dev GPU check does — the code paths are the same and the reference stays cheap):
//! - variants: the spec itself; with GQA the spec with `pack_gqa` toggled; paged specs
//!   with page sizes 1, 16 and 128;
//! - shapes by layout: odd lengths (1, 17, 1000, 4097), seqlen_q ≠ seqlen_k both ways,
//!   batch > 1 (varlen with mixed and empty sequences; paged with mixed seqused_k);
//! - split specs: the first shape with 1..=8 splits and `auto`, the others with `auto`,
//!   and a shape of more than 4096 keys also with [`MANY_SPLITS`].
//!
//! Each case: random normal inputs (`random_inputs`), outputs poisoned with NaN, one
//! launch, then per sequence: relative L2 error of O ≤ `tol_rel_l2`, no NaN/Inf where the
//! reference is finite, LSE relative error (|Δ| / max(|lse|, 1)) ≤ `tol_lse` with the same
//! finiteness. Paged KV uses a shuffled page pool whose unused pages hold values ×100,
//! whose last page of a sequence holds NaN past its end, and a block table padded with
//! −1, so a wrong page or row read shows. The reference's cost
//! (q·k pairs × heads × (d_qk + d_v)) is capped by `max_ref_cost`: longer cases shrink
//! seqlen_q (keeping seqlen_k) and say so in the case name.

use crate::error::RuntimeError;
use crate::params::Params;
use crate::receipt::Receipt;
use crate::runtime::Runtime;
use crate::tensor::{ElemType, IndexTensor, Tensor};
use crate::validate::ParamValue;
use attnc_ir::eval::{AuxData, Value};
use attnc_ir::reference::{random_inputs, reference_forward, rel_l2, round_to_dtype, Inputs, Rng, SeqOutput};
use attnc_ir::{KvLayout, Spec, SplitKv};
use serde::Serialize;
use std::fmt;
use std::time::Instant;

mod grads;
use grads::grad_check;

/// A forced split count past one warp's lanes (the combine merges 32 splits a round),
/// run on a shape whose keys give most of those splits work.
pub const MANY_SPLITS: u32 = 40;

/// Knobs of the matrix.
#[derive(Clone, Debug, Serialize)]
pub struct SelftestOptions {
    pub seed: u64,
    /// Fewer shapes and splits (a smoke test).
    pub quick: bool,
    /// Reference cost cap per case (multiply-adds); see the module docs.
    pub max_ref_cost: f64,
    /// KV heads kept per spec (the group size is kept).
    pub max_kv_heads: u32,
    pub tol_rel_l2: f64,
    pub tol_lse: f64,
    /// Only specs whose name contains this.
    pub filter: Option<String>,
    /// [`run`]: print one line per case to stderr.
    pub progress: bool,
    /// The family to run (`auto`, `portable`, `hopper`, `blackwell`): a fallback
    /// family can be tested on a GPU where auto picks a faster one.
    pub family: String,
    /// Also check the backward (every case of a variant that has one).
    pub grads: bool,
    /// Bound on each gradient's relative L2 error.
    pub tol_grad_rel_l2: f64,
}

impl Default for SelftestOptions {
    fn default() -> Self {
        SelftestOptions {
            seed: 1,
            quick: false,
            max_ref_cost: 1.0e10,
            max_kv_heads: 2,
            tol_rel_l2: 1e-2,
            tol_lse: 1e-3,
            filter: None,
            progress: true,
            family: "auto".into(),
            grads: true,
            tol_grad_rel_l2: 2e-2,
        }
    }
}

/// One case's outcome.
#[derive(Clone, Debug, Serialize)]
pub struct CaseResult {
    pub spec: String,
    pub case: String,
    pub layout: String,
    pub dtype: String,
    pub q_heads: u32,
    pub kv_heads: u32,
    pub pack_gqa: bool,
    pub page_size: Option<u32>,
    /// (seqlen_q, seqlen_k) per batch entry.
    pub seqlens: Vec<(usize, usize)>,
    /// What was asked: "spec", "auto" or a number.
    pub splits_requested: String,
    pub num_splits: Option<u32>,
    /// Worst relative L2 error of O over the sequences.
    pub rel_l2: Option<f64>,
    pub lse_err: Option<f64>,
    /// Non-finite outputs where the reference is finite (or LSE finiteness mismatches).
    pub nonfinite: usize,
    pub ok: bool,
    pub error: Option<String>,
    pub receipt: Option<Receipt>,
    pub reference_ms: f64,
    pub gpu_ms: Option<f64>,
    /// The gradient check (variants with a backward).
    pub grad: Option<GradResult>,
    /// Specs whose mask takes a block mask: the lists against the brute-force reference,
    /// and the forward with the mask built once against the one built per call.
    pub block_mask: Option<BlockMaskCheck>,
}

/// One case's block-mask check.
#[derive(Clone, Debug, Serialize)]
pub struct BlockMaskCheck {
    pub block_m: u32,
    pub block_n: u32,
    /// Row lists (counts and entries) that differ from `attnc_ir::block_mask`'s brute force.
    pub rows_wrong: usize,
    pub rows: usize,
    pub live_fraction: f64,
    /// The forward with the mask passed in wrote bitwise the same O as with the mask built
    /// per call.
    pub passed_in_identical: bool,
    /// Passed to a launch with other aux tensors (same shapes, other buffers), the mask was
    /// refused with `RuntimeError::BlockMask` before any launch.
    pub refused_for_other_aux: bool,
}

/// One case's gradient check: each gradient's worst relative L2 error over the
/// sequences against `attnc_ir::reference_backward`.
#[derive(Clone, Debug, Serialize)]
pub struct GradResult {
    pub dq: f64,
    pub dk: f64,
    pub dv: f64,
    pub dsinks: Option<f64>,
    /// Per learnable aux tensor, against the reference fed the device's stored O (see
    /// `attnc_ir::reference::reference_backward_with_output`): the kernel's `D` comes from
    /// that rounded O, and a cancelling aux reduction (a learned position bias) amplifies
    /// its rounding far past any kernel error. Measured by `aux_grad_error`: relative to
    /// the gradient, or to a tenth of its terms' magnitudes where those cancel.
    pub daux: Vec<(String, f64)>,
    /// The same against the exact reference: what the O rounding costs (informational).
    pub daux_exact: Vec<(String, f64)>,
    /// The largest of the above.
    pub max: f64,
    /// Non-finite gradients where the reference is finite.
    pub nonfinite: usize,
    /// Deterministic mode run twice, and replayed by the backward launch memo (where it
    /// serves): whether every gradient was bitwise identical (and within the bound); `None`
    /// where not run.
    pub deterministic_identical: Option<bool>,
    pub deterministic_max: Option<f64>,
    /// How the deterministic runs accumulated dQ (ordered turns or slices).
    pub deterministic_accumulation: Option<attnc_lower::families::common::dq_order::DqAccumulation>,
    /// A mask over aux tensors: deterministic backwards with one block mask passed in
    /// (the first builds its backward classes, the second reuses them), both bitwise
    /// identical to the one that classified per call, with receipts that say so.
    pub block_mask_identical: Option<bool>,
    pub receipt: Option<Receipt>,
    pub reference_ms: f64,
    pub gpu_ms: Option<f64>,
}

/// The whole run.
#[derive(Clone, Debug, Serialize)]
pub struct SelftestReport {
    pub device: crate::cuda::DeviceInfo,
    pub attnc_version: String,
    pub llvm_version: String,
    pub options: SelftestOptions,
    pub passed: usize,
    pub failed: usize,
    /// Cases whose gradients were checked, and the largest gradient rel-L2 seen.
    pub grad_cases: usize,
    pub max_grad_rel_l2: Option<f64>,
    pub seconds: f64,
    pub cache: crate::cache::CacheStats,
    pub cases: Vec<CaseResult>,
}

impl SelftestReport {
    pub fn ok(&self) -> bool {
        self.failed == 0 && self.passed > 0
    }
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }
    /// A fixed-width table of the cases and a summary line.
    pub fn table(&self) -> String {
        let mut s = String::new();
        s.push_str(&format!(
            "{:<4} {:<28} {:<44} {:>6} {:>9} {:>9} {:>4} {:>9} {:>9} {:>3}\n",
            "", "spec", "case", "splits", "rel_l2", "lse_err", "nan", "gpu_ms", "grad_l2", "det"
        ));
        for c in &self.cases {
            let f = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.2e}"));
            let g = c.grad.as_ref();
            s.push_str(&format!(
                "{:<4} {:<28} {:<44} {:>6} {:>9} {:>9} {:>4} {:>9} {:>9} {:>3}\n",
                if c.ok { "PASS" } else { "FAIL" },
                trunc(&c.spec, 28),
                trunc(&c.case, 44),
                c.num_splits.map_or("-".into(), |n| n.to_string()),
                f(c.rel_l2),
                f(c.lse_err),
                c.nonfinite + g.map_or(0, |g| g.nonfinite),
                c.gpu_ms.map_or("-".into(), |v| format!("{v:.3}")),
                f(g.map(|g| g.max)),
                match (g.and_then(|g| g.deterministic_identical), g.and_then(|g| g.deterministic_accumulation)) {
                    (Some(true), Some(attnc_lower::families::common::dq_order::DqAccumulation::Ordered)) => "=o",
                    (Some(true), _) => "=",
                    (Some(false), _) => "DIF",
                    (None, _) => "-",
                },
            ));
            if let Some(e) = &c.error {
                s.push_str(&format!("     error: {}\n", e.lines().next().unwrap_or("")));
            }
            if g.and_then(|g| g.block_mask_identical) == Some(false) {
                s.push_str(
                    "     backward with a block mask passed in: other bits or receipt than classified per call\n",
                );
            }
        }
        let mask_checks: Vec<bool> =
            self.cases.iter().filter_map(|c| c.grad.as_ref().and_then(|g| g.block_mask_identical)).collect();
        if !mask_checks.is_empty() {
            s.push_str(&format!(
                "backward with one block mask passed in (built by the first, reused by the second): {} of {} cases bit-equal to per-call classification\n",
                mask_checks.iter().filter(|&&x| x).count(),
                mask_checks.len()
            ));
        }
        s.push_str(&format!(
            "{} passed, {} failed ({} on {}, {:.1} s); gradients checked in {} cases, max rel-L2 {}\n",
            self.passed,
            self.failed,
            self.device.arch,
            self.device.name,
            self.seconds,
            self.grad_cases,
            self.max_grad_rel_l2.map_or("-".into(), |v| format!("{v:.2e}"))
        ));
        s
    }
}

impl fmt::Display for SelftestReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.table())
    }
}

fn trunc(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(n.saturating_sub(1)).collect();
        t.push('~');
        t
    }
}

/// Splits to run a shape with.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SplitReq {
    /// What the spec says (no override).
    Spec,
    Auto,
    N(u32),
}

/// One planned case (before running).
#[derive(Clone, Debug)]
pub struct CasePlan {
    pub spec: Spec,
    pub variant: String,
    pub seqlens: Vec<(usize, usize)>,
    pub splits: SplitReq,
    pub shrunk: bool,
    /// The deterministic backward is checked here: the variant's first shape, and the
    /// base variant's last (the largest: many key and query tiles, so the ordered mode's
    /// turns decide the order).
    pub deterministic_check: bool,
    /// A shard of longer sequences (context parallelism); `seqlens` are the shard's.
    pub shard: Option<ShardCase>,
}

/// A shard case: queries `q` and keys `k` (cut to each sequence) of sequences `global`
/// long, one `(seqlen_q, seqlen_k)` per batch entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardCase {
    pub global: Vec<(usize, usize)>,
    pub q: std::ops::Range<usize>,
    pub k: std::ops::Range<usize>,
    /// Whether this key shard takes the spec's sink.
    pub sinks: bool,
}

/// Shards for a variant that reads positions: an interior pair, a pair a causal mask
/// rules out entirely (its shard leaves the sink to another), and a tall one.
fn shard_cases(spec: &Spec) -> Vec<ShardCase> {
    // Varlen batches: sequences of different lengths, one cut short by the ranges.
    let batch = |g: (usize, usize)| match spec.kv_layout {
        KvLayout::Varlen => vec![g, (g.0 / 2 + 3, g.1 + 41), (g.0, g.1 / 3)],
        _ => vec![g; 2],
    };
    vec![
        ShardCase { global: batch((300, 517)), q: 97..208, k: 150..353, sinks: true },
        ShardCase { global: batch((300, 300)), q: 0..100, k: 200..300, sinks: !spec.sinks },
        ShardCase { global: batch((257, 600)), q: 150..257, k: 0..333, sinks: true },
    ]
}

/// The spec with at most `max_kv` KV heads and the same group size.
pub fn reduce_heads(spec: &Spec, max_kv: u32) -> Spec {
    let mut s = spec.clone();
    let g = spec.group_size().max(1);
    s.kv_heads = spec.kv_heads.min(max_kv.max(1));
    s.q_heads = s.kv_heads * g;
    s
}

fn layout_name(l: KvLayout) -> String {
    match l {
        KvLayout::Contiguous => "contiguous".into(),
        KvLayout::Varlen => "varlen".into(),
        KvLayout::Paged { page_size } => format!("paged/{page_size}"),
    }
}

fn shapes(layout: KvLayout, quick: bool) -> Vec<Vec<(usize, usize)>> {
    let all: Vec<Vec<(usize, usize)>> = match layout {
        KvLayout::Contiguous => vec![
            vec![(17, 17), (17, 17)],
            vec![(1, 1)],
            vec![(1000, 1000)],
            vec![(17, 1000), (17, 1000)],
            vec![(1000, 17)],
            vec![(1, 4097), (1, 4097)],
            vec![(4097, 4097)],
        ],
        KvLayout::Varlen => vec![
            vec![(37, 37), (1, 120), (150, 150)],
            vec![(17, 1000), (1000, 17)],
            vec![(0, 5), (5, 0), (17, 17)],
            vec![(1, 4097), (4097, 4097)],
        ],
        KvLayout::Paged { .. } => vec![
            vec![(1, 300), (1, 17)],
            vec![(5, 1000), (5, 64)],
            vec![(1, 4097)],
            vec![(17, 17), (17, 1000), (17, 1)],
        ],
    };
    if quick {
        all.into_iter().take(2).collect()
    } else {
        all
    }
}

fn ref_cost(spec: &Spec, seqlens: &[(usize, usize)]) -> f64 {
    let per = f64::from(spec.q_heads) * f64::from(spec.head_dim_qk + spec.head_dim_v);
    seqlens.iter().map(|&(q, k)| q as f64 * k as f64 * per).sum()
}

/// Shrinks seqlen_q (all entries, same factor) until the reference cost fits.
fn fit_cost(spec: &Spec, seqlens: &[(usize, usize)], max: f64) -> (Vec<(usize, usize)>, bool) {
    let cost = ref_cost(spec, seqlens);
    if cost <= max {
        return (seqlens.to_vec(), false);
    }
    let f = max / cost;
    let padded = !matches!(spec.kv_layout, KvLayout::Varlen);
    let mut out: Vec<(usize, usize)> =
        seqlens.iter().map(|&(q, k)| (((q as f64 * f) as usize).max(1.min(q)), k)).collect();
    if padded {
        // Padded layouts need one seqlen_q for the batch.
        let q = out.iter().map(|s| s.0).max().unwrap_or(1);
        out.iter_mut().for_each(|s| s.0 = q);
    }
    (out, true)
}

/// The cases of one spec.
pub fn plan_cases(spec: &Spec, opts: &SelftestOptions) -> Vec<CasePlan> {
    let base = reduce_heads(spec, opts.max_kv_heads);
    let mut variants: Vec<(Spec, String)> = Vec::new();
    match base.kv_layout {
        KvLayout::Paged { page_size } => {
            let mut sizes = vec![page_size, 1, 16, 128];
            sizes.dedup();
            let mut seen = Vec::new();
            for ps in sizes {
                if seen.contains(&ps) {
                    continue;
                }
                seen.push(ps);
                let mut s = base.clone();
                s.kv_layout = KvLayout::Paged { page_size: ps };
                variants.push((s, format!("page {ps}")));
            }
        }
        _ => variants.push((base.clone(), String::new())),
    }
    if base.group_size() > 1 {
        let mut s = base.clone();
        s.pack_gqa = !s.pack_gqa;
        let tag = if s.pack_gqa { "pack_gqa on" } else { "pack_gqa off" };
        variants.push((s, tag.into()));
    }
    let split = base.split_kv != SplitKv::None;
    let mut cases = Vec::new();
    for (vi, (s, tag)) in variants.iter().enumerate() {
        let mut sh = shapes(s.kv_layout, opts.quick);
        if vi > 0 && !matches!(base.kv_layout, KvLayout::Paged { .. }) {
            sh.truncate(3); // toggled variants: fewer shapes
        } else if vi > 0 {
            sh.truncate(if opts.quick { 1 } else { 3 });
        }
        for (si, seqlens) in sh.iter().enumerate() {
            let (seqlens, shrunk) = fit_cost(s, seqlens, opts.max_ref_cost);
            let reqs: Vec<SplitReq> = if !split {
                vec![SplitReq::Spec]
            } else if si == 0 && vi == 0 {
                let mut r: Vec<SplitReq> = (1..=8).map(SplitReq::N).collect();
                if opts.quick {
                    r = vec![SplitReq::N(1), SplitReq::N(3)];
                }
                r.push(SplitReq::Auto);
                r
            } else if vi == 0 && !opts.quick && seqlens.iter().any(|&(_, k)| k > 4096) {
                // More splits than a warp has lanes, most of them with keys: the merge
                // takes its splits in rounds of 32.
                vec![SplitReq::N(MANY_SPLITS), SplitReq::Auto]
            } else {
                vec![SplitReq::Auto]
            };
            for r in reqs {
                cases.push(CasePlan {
                    spec: s.clone(),
                    variant: tag.clone(),
                    seqlens: seqlens.clone(),
                    splits: r,
                    shrunk,
                    deterministic_check: si == 0 || (vi == 0 && si + 1 == sh.len()),
                    shard: None,
                });
            }
        }
    }
    if base.reads_positions() && matches!(base.kv_layout, KvLayout::Contiguous | KvLayout::Varlen) {
        for sc in shard_cases(&base) {
            let cut = |r: &std::ops::Range<usize>, n: usize| r.end.min(n).saturating_sub(r.start.min(n));
            cases.push(CasePlan {
                spec: base.clone(),
                variant: String::new(),
                seqlens: sc.global.iter().map(|&(gq, gk)| (cut(&sc.q, gq), cut(&sc.k, gk))).collect(),
                splits: if split { SplitReq::Auto } else { SplitReq::Spec },
                shrunk: false,
                deterministic_check: false,
                shard: Some(sc),
            });
        }
    }
    cases
}

fn case_name(c: &CasePlan) -> String {
    let mut n = layout_name(c.spec.kv_layout);
    if !c.variant.is_empty() && !c.variant.starts_with("page") {
        n.push_str(&format!(" {}", c.variant));
    }
    let lens: Vec<String> = c.seqlens.iter().map(|(q, k)| format!("{q}x{k}")).collect();
    n.push_str(&format!(" [{}]", lens.join(",")));
    if let Some(sc) = &c.shard {
        let (gq, gk) = sc.global.first().copied().unwrap_or_default();
        n.push_str(&format!(
            " shard q{}..{}/{} k{}..{}/{}{}",
            sc.q.start,
            sc.q.end,
            gq,
            sc.k.start,
            sc.k.end,
            gk,
            if sc.sinks { "" } else { " no-sink" }
        ));
    }
    match c.splits {
        SplitReq::Spec => {}
        SplitReq::Auto => n.push_str(" split=auto"),
        SplitReq::N(k) => n.push_str(&format!(" split={k}")),
    }
    if c.shrunk {
        n.push_str(" (q shrunk)");
    }
    n
}

/// One finished case of a run, for progress displays.
pub struct CaseProgress<'a> {
    /// Cases finished, this one included.
    pub done: usize,
    pub total: usize,
    pub result: &'a CaseResult,
}

impl CaseProgress<'_> {
    /// `[done/total] PASS spec case: rel_l2 ... lse ... nonfinite ...` (the plain-text
    /// progress line).
    pub fn line(&self) -> String {
        let r = self.result;
        let f = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.2e}"));
        format!(
            "[{}/{}] {} {} {}: rel_l2 {} lse {} nonfinite {}{}{}",
            self.done,
            self.total,
            if r.ok { "PASS" } else { "FAIL" },
            r.spec,
            r.case,
            f(r.rel_l2),
            f(r.lse_err),
            r.nonfinite,
            r.num_splits.map_or(String::new(), |n| format!(" splits {n}")),
            r.error.as_ref().map_or(String::new(), |e| format!(" error: {e}")),
        )
    }
}

/// Runs the matrix over `specs` on `rt`; with `opts.progress`, one line per case on stderr.
pub fn run(rt: &Runtime, specs: &[Spec], opts: &SelftestOptions) -> SelftestReport {
    run_observed(rt, specs, opts, &mut |p| {
        if opts.progress {
            eprintln!("{}", p.line());
        }
    })
}

/// [`run`] that hands every finished case to `observe` (the CLI draws a progress bar).
pub fn run_observed(
    rt: &Runtime,
    specs: &[Spec],
    opts: &SelftestOptions,
    observe: &mut dyn FnMut(CaseProgress<'_>),
) -> SelftestReport {
    let t0 = Instant::now();
    let mut cases = Vec::new();
    let selected: Vec<&Spec> =
        specs.iter().filter(|s| opts.filter.as_ref().is_none_or(|f| s.name.contains(f.as_str()))).collect();
    let plans: Vec<CasePlan> = selected.into_iter().flat_map(|spec| plan_cases(spec, opts)).collect();
    let mut seed = opts.seed;
    for plan in &plans {
        seed = seed.wrapping_add(1);
        let r = run_case(rt, plan, seed, opts);
        observe(CaseProgress { done: cases.len() + 1, total: plans.len(), result: &r });
        cases.push(r);
    }
    let passed = cases.iter().filter(|c| c.ok).count();
    let grads: Vec<f64> = cases.iter().filter_map(|c| c.grad.as_ref().map(|g| g.max)).collect();
    SelftestReport {
        device: rt.device().clone(),
        attnc_version: crate::jit::ATTNC_VERSION.into(),
        llvm_version: crate::jit::llvm_version(),
        options: opts.clone(),
        passed,
        failed: cases.len() - passed,
        grad_cases: grads.len(),
        max_grad_rel_l2: grads.iter().copied().reduce(f64::max),
        seconds: t0.elapsed().as_secs_f64(),
        cache: rt.cache_stats(),
        cases,
    }
}

fn run_case(rt: &Runtime, plan: &CasePlan, seed: u64, opts: &SelftestOptions) -> CaseResult {
    let s = &plan.spec;
    let mut r = CaseResult {
        block_mask: None,
        spec: s.name.clone(),
        case: case_name(plan),
        layout: layout_name(s.kv_layout),
        dtype: s.dtype.name().into(),
        q_heads: s.q_heads,
        kv_heads: s.kv_heads,
        pack_gqa: s.pack_gqa,
        page_size: match s.kv_layout {
            KvLayout::Paged { page_size } => Some(page_size),
            _ => None,
        },
        seqlens: plan.seqlens.clone(),
        splits_requested: match plan.splits {
            SplitReq::Spec => "spec".into(),
            SplitReq::Auto => "auto".into(),
            SplitReq::N(n) => n.to_string(),
        },
        num_splits: None,
        rel_l2: None,
        lse_err: None,
        nonfinite: 0,
        ok: false,
        error: None,
        receipt: None,
        reference_ms: 0.0,
        gpu_ms: None,
        grad: None,
    };
    if let Err(e) = run_case_inner(rt, plan, seed, opts, &mut r) {
        r.error = Some(e.to_string());
        r.ok = false;
    }
    r
}

/// The physical tensors of one case.
pub struct CaseTensors {
    pub q: Tensor,
    pub k: Tensor,
    pub v: Tensor,
    pub o: Tensor,
    pub lse: Option<Tensor>,
    pub cu_q: Option<IndexTensor>,
    pub cu_k: Option<IndexTensor>,
    pub block_table: Option<IndexTensor>,
    pub seqused_k: Option<IndexTensor>,
    pub sinks: Option<Tensor>,
    pub aux: Vec<(String, Tensor)>,
    pub params: Vec<(String, ParamValue)>,
    /// The shard's place in its sequences: one frame (contiguous: every entry's is the
    /// same here) or one per sequence (varlen, `[batch, 4]`), and whether it takes the sink.
    pub positions: Option<attnc_ir::ShardPositions>,
    pub sequence_positions: Option<(IndexTensor, bool)>,
}

impl CaseTensors {
    /// The forward of these inputs into `o` (and this case's LSE tensor, when the spec
    /// has one).
    pub fn forward(&self, kernel: &crate::Kernel, o: &mut Tensor, params: &Params) -> Result<Receipt, RuntimeError> {
        match &self.lse {
            Some(l) => kernel.forward_lse(&self.q, &self.k, &self.v, o, &mut l.clone(), params),
            None => kernel.forward(&self.q, &self.k, &self.v, o, params),
        }
    }

    pub fn params(&self) -> Params<'_> {
        Params {
            values: self.params.clone(),
            cu_seqlens_q: self.cu_q.as_ref(),
            cu_seqlens_k: self.cu_k.as_ref(),
            block_table: self.block_table.as_ref(),
            seqused_k: self.seqused_k.as_ref(),
            sinks: self.sinks.as_ref(),
            aux: self.aux.iter().map(|(n, t)| (n.clone(), t)).collect(),
            num_splits: None,
            timing: false,
            positions: self.positions,
            sequence_positions: self.sequence_positions.as_ref().map(|(t, sink)| (t, *sink)),
            ..Params::default()
        }
    }
}

/// Builds the physical layout of `inputs` for `spec` on the device, outputs poisoned.
pub fn build_tensors(rt: &Runtime, spec: &Spec, inputs: &Inputs, seed: u64) -> Result<CaseTensors, RuntimeError> {
    let dt = ElemType::of(spec.dtype);
    let (qh, kvh) = (spec.q_heads as usize, spec.kv_heads as usize);
    let (dqk, dv) = (spec.head_dim_qk as usize, spec.head_dim_v as usize);
    let seqs = &inputs.seqs;
    let b = seqs.len();
    let max_sq = seqs.iter().map(|s| s.seqlen_q).max().unwrap_or(0);
    let cat = |f: &dyn Fn(&attnc_ir::reference::Sequence) -> &Vec<f64>| -> Vec<f64> {
        seqs.iter().flat_map(|s| f(s).iter().copied()).collect()
    };
    let (q, o, lse);
    let (mut cu_q, mut cu_k, mut block_table, mut seqused_k) = (None, None, None, None);
    let (k, v);
    match spec.kv_layout {
        KvLayout::Varlen => {
            let tq: usize = seqs.iter().map(|s| s.seqlen_q).sum();
            let tk: usize = seqs.iter().map(|s| s.seqlen_k).sum();
            q = rt.upload_f64(dt, &cat(&|s| &s.q), &[tq, qh, dqk])?;
            k = rt.upload_f64(dt, &cat(&|s| &s.k), &[tk, kvh, dqk])?;
            v = rt.upload_f64(dt, &cat(&|s| &s.v), &[tk, kvh, dv])?;
            o = rt.alloc(dt, &[tq, qh, dv])?;
            lse = if spec.lse { Some(rt.alloc(ElemType::F32, &[qh, tq])?) } else { None };
            let mut cq = vec![0i32];
            let mut ck = vec![0i32];
            for s in seqs {
                cq.push(cq[cq.len() - 1] + s.seqlen_q as i32);
                ck.push(ck[ck.len() - 1] + s.seqlen_k as i32);
            }
            cu_q = Some(rt.upload_index(&cq, &[b + 1])?);
            cu_k = Some(rt.upload_index(&ck, &[b + 1])?);
        }
        _ => {
            if seqs.iter().any(|s| s.seqlen_q != max_sq) {
                return Err(RuntimeError::Other("padded layouts need one seqlen_q per batch".into()));
            }
            q = rt.upload_f64(dt, &cat(&|s| &s.q), &[b, max_sq, qh, dqk])?;
            o = rt.alloc(dt, &[b, max_sq, qh, dv])?;
            lse = if spec.lse { Some(rt.alloc(ElemType::F32, &[b, qh, max_sq])?) } else { None };
            match spec.kv_layout {
                KvLayout::Paged { page_size } => {
                    let ps = page_size as usize;
                    let npages: Vec<usize> = seqs.iter().map(|s| s.seqlen_k.div_ceil(ps)).collect();
                    let total = npages.iter().sum::<usize>() + 3;
                    let max_pages = npages.iter().copied().max().unwrap_or(0).max(1);
                    // Shuffled pool; rows no sequence owns hold values x100.
                    let mut rng = Rng::new(seed ^ 0x5eed);
                    let mut perm: Vec<usize> = (0..total).collect();
                    for i in (1..total).rev() {
                        let j = rng.int_in(0, i as i64) as usize;
                        perm.swap(i, j);
                    }
                    let garbage = |n: usize, rng: &mut Rng| -> Vec<f64> {
                        (0..n).map(|_| round_to_dtype(100.0 * rng.normal(), spec.dtype)).collect()
                    };
                    let mut kp = garbage(total * ps * kvh * dqk, &mut rng);
                    let mut vp = garbage(total * ps * kvh * dv, &mut rng);
                    let mut bt = vec![-1i32; b * max_pages];
                    let mut next = 0;
                    for (bi, s) in seqs.iter().enumerate() {
                        for p in 0..npages[bi] {
                            let pg = perm[next];
                            next += 1;
                            bt[bi * max_pages + p] = pg as i32;
                            let r0 = p * ps;
                            let n = (s.seqlen_k - r0).min(ps);
                            let kr = kvh * dqk;
                            let vr = kvh * dv;
                            kp[pg * ps * kr..][..n * kr].copy_from_slice(&s.k[r0 * kr..][..n * kr]);
                            vp[pg * ps * vr..][..n * vr].copy_from_slice(&s.v[r0 * vr..][..n * vr]);
                            // The last page's rows past the sequence: NaN, which no
                            // kernel may let into O (P is 0 there, but 0 · NaN is NaN).
                            kp[pg * ps * kr..][n * kr..ps * kr].fill(f64::NAN);
                            vp[pg * ps * vr..][n * vr..ps * vr].fill(f64::NAN);
                        }
                    }
                    k = rt.upload_f64(dt, &kp, &[total, ps, kvh, dqk])?;
                    v = rt.upload_f64(dt, &vp, &[total, ps, kvh, dv])?;
                    block_table = Some(rt.upload_index(&bt, &[b, max_pages])?);
                    let su: Vec<i32> = seqs.iter().map(|s| s.seqlen_k as i32).collect();
                    seqused_k = Some(rt.upload_index(&su, &[b])?);
                }
                _ => {
                    let sk = seqs.first().map_or(0, |s| s.seqlen_k);
                    if seqs.iter().any(|s| s.seqlen_k != sk) {
                        return Err(RuntimeError::Other("contiguous KV needs one seqlen_k per batch".into()));
                    }
                    k = rt.upload_f64(dt, &cat(&|s| &s.k), &[b, sk, kvh, dqk])?;
                    v = rt.upload_f64(dt, &cat(&|s| &s.v), &[b, sk, kvh, dv])?;
                }
            }
        }
    }
    rt.fill_nan(&o)?;
    if let Some(l) = &lse {
        rt.fill_nan(l)?;
    }
    let sinks = match &inputs.sinks {
        Some(sk) => Some(rt.upload_f64(ElemType::F32, sk, &[qh])?),
        None => None,
    };
    let mut aux = Vec::new();
    for (decl, t) in spec.aux.iter().zip(&inputs.aux) {
        let tensor = match &t.data {
            AuxData::Int(d) => rt.upload(d, &t.dims)?,
            AuxData::Float(d) => rt.upload_f64(ElemType::F32, d, &t.dims)?,
        };
        aux.push((decl.name.clone(), tensor));
    }
    let params = spec
        .params
        .iter()
        .zip(&inputs.params)
        .map(|(p, v)| {
            let pv = match v {
                Value::Float(f) => ParamValue::Float(*f as f32),
                other => ParamValue::Int(other.as_int()),
            };
            (p.name.clone(), pv)
        })
        .collect();
    Ok(CaseTensors {
        q,
        k,
        v,
        o,
        lse,
        cu_q: cu_q.take(),
        cu_k: cu_k.take(),
        block_table: block_table.take(),
        seqused_k: seqused_k.take(),
        sinks,
        aux,
        params,
        positions: inputs.positions.first().copied().filter(|_| spec.kv_layout != KvLayout::Varlen),
        sequence_positions: match (spec.kv_layout, inputs.positions.first()) {
            (KvLayout::Varlen, Some(first)) => {
                let table: Vec<i32> = inputs
                    .positions
                    .iter()
                    .flat_map(|p| [p.q_offset, p.k_offset, p.seqlen_q, p.seqlen_k].map(|x| x as i32))
                    .collect();
                Some((rt.upload_index(&table, &[inputs.positions.len(), 4])?, first.sinks))
            }
            _ => None,
        },
    })
}

/// Per-sequence comparison of the device outputs with the reference.
pub fn compare(
    rt: &Runtime,
    spec: &Spec,
    inputs: &Inputs,
    expected: &[SeqOutput],
    t: &CaseTensors,
) -> Result<(f64, Option<f64>, usize), RuntimeError> {
    let (qh, dv) = (spec.q_heads as usize, spec.head_dim_v as usize);
    let o = rt.download_f64(&t.o)?;
    let lse = t.lse.as_ref().map(|l| rt.download_f64(l)).transpose()?;
    let varlen = spec.kv_layout == KvLayout::Varlen;
    let max_sq = inputs.seqs.iter().map(|s| s.seqlen_q).max().unwrap_or(0);
    let total_q: usize = inputs.seqs.iter().map(|s| s.seqlen_q).sum();
    let (mut worst, mut worst_lse, mut bad) = (0.0f64, 0.0f64, 0usize);
    let mut q0 = 0usize;
    for (bi, (s, e)) in inputs.seqs.iter().zip(expected).enumerate() {
        let sq = s.seqlen_q;
        let start = if varlen { q0 } else { bi * max_sq };
        let got = &o[start * qh * dv..][..sq * qh * dv];
        for (g, x) in got.iter().zip(&e.o) {
            if !g.is_finite() && x.is_finite() {
                bad += 1;
            }
        }
        worst = worst.max(rel_l2(got, &e.o));
        if let Some(l) = &lse {
            for h in 0..qh {
                for i in 0..sq {
                    let g = if varlen { l[h * total_q + q0 + i] } else { l[(bi * qh + h) * max_sq + i] };
                    let x = e.lse[h * sq + i];
                    if g.is_finite() != x.is_finite() || (x.is_nan() != g.is_nan()) {
                        bad += 1;
                    } else if x.is_finite() {
                        worst_lse = worst_lse.max((g - x).abs() / x.abs().max(1.0));
                    }
                }
            }
        }
        q0 += sq;
    }
    Ok((worst, lse.map(|_| worst_lse), bad))
}

fn run_case_inner(
    rt: &Runtime,
    plan: &CasePlan,
    seed: u64,
    opts: &SelftestOptions,
    r: &mut CaseResult,
) -> Result<(), RuntimeError> {
    let s = &plan.spec;
    let family: attnc_lower::FamilyChoice = opts.family.parse().map_err(RuntimeError::Other)?;
    let kernel = rt.kernel_with(s, family)?;
    let inputs = match &plan.shard {
        None => random_inputs(s, &plan.seqlens, seed),
        Some(sc) => random_inputs(s, &sc.global, seed).shard(s, sc.q.clone(), sc.k.clone(), sc.sinks),
    };
    let t = Instant::now();
    let expected = reference_forward(s, &inputs).map_err(|e| RuntimeError::Other(format!("reference: {e}")))?;
    r.reference_ms = t.elapsed().as_secs_f64() * 1e3;
    let tensors = build_tensors(rt, s, &inputs, seed)?;
    let mut params = tensors.params();
    params.timing = true;
    params.num_splits = match plan.splits {
        SplitReq::N(n) => Some(n),
        SplitReq::Auto | SplitReq::Spec => None,
    };
    // `auto` on a spec with a fixed count: the heuristic is not reachable by override;
    // run the spec's choice (the receipt says which).
    let mut o = tensors.o.clone();
    let receipt = tensors.forward(&kernel, &mut o, &params)?;
    rt.synchronize()?;
    r.num_splits = Some(receipt.num_splits);
    r.gpu_ms = receipt.timings.map(|t| t.total_ms);
    let (worst, lse_err, bad) = compare(rt, s, &inputs, &expected, &tensors)?;
    r.rel_l2 = Some(worst);
    r.lse_err = lse_err;
    r.nonfinite = bad;
    let takes_mask = receipt.block_mask.is_some();
    r.receipt = Some(receipt);
    r.ok = worst <= opts.tol_rel_l2 && bad == 0 && lse_err.is_none_or(|e| e <= opts.tol_lse);
    if takes_mask {
        let c = block_mask_check(rt, &kernel, plan, &inputs, &tensors, &params, &o)?;
        r.ok &= c.rows_wrong == 0 && c.passed_in_identical && c.refused_for_other_aux;
        r.block_mask = Some(c);
    }
    let bwd = attnc_lower::Direction::Backward;
    let trains = attnc_lower::compile::pass_unsupported_reason(s, bwd).is_none();
    // A family asked for by name that has no backward (yet) is a forward-only test.
    let family_trains = match family {
        attnc_lower::FamilyChoice::Auto => true,
        attnc_lower::FamilyChoice::Exactly(f) => {
            attnc_lower::compile::unsupported_reason(f, s, rt.arch(), bwd).is_none()
        }
    };
    if opts.grads && trains && family_trains && plan.splits == SplitReq::Spec {
        // Deterministic mode on the planned shapes: run twice, compare the bits.
        let deterministic = plan.deterministic_check;
        let g = grad_check(rt, &kernel, s, &inputs, &tensors, seed, deterministic, takes_mask)?;
        r.ok &= g.max <= opts.tol_grad_rel_l2
            && g.nonfinite == 0
            && g.deterministic_identical != Some(false)
            && g.block_mask_identical != Some(false)
            && g.deterministic_max.is_none_or(|m| m <= opts.tol_grad_rel_l2);
        r.grad = Some(g);
    }
    Ok(())
}

/// The block mask built once: its lists against the brute-force classification, and a
/// forward with it against the per-call one (`o_per_call`).
fn block_mask_check(
    rt: &Runtime,
    kernel: &crate::Kernel,
    plan: &CasePlan,
    inputs: &Inputs,
    t: &CaseTensors,
    params: &Params,
    o_per_call: &Tensor,
) -> Result<BlockMaskCheck, RuntimeError> {
    use attnc_ir::block_mask::{reference_classes, LaunchData};
    let s = &plan.spec;
    let mask = kernel.block_mask(&t.q, &t.k, &t.v, &t.o, params)?;
    let got = kernel.block_mask_lists(&mask)?;
    let data =
        LaunchData { seqlens: &plan.seqlens, params: &inputs.params, aux: &inputs.aux, positions: &inputs.positions };
    let classes = reference_classes(s, mask.tiling(), &data);
    let d = mask.dims();
    let rows = d.batch * d.slots * d.m_tiles;
    let rows_wrong = match mask.layout() {
        attnc_lower::BlockLayout::RowLists | attnc_lower::BlockLayout::RowListsWithBits => {
            // The entries (tile, full flag, bitmask slot), and each slotted tile's bits
            // against the mask evaluated on the host.
            let want = classes.row_lists(d.bits_per_row);
            (0..rows)
                .filter(|&r| {
                    let (g, w) =
                        (&got[r * d.row_words()..][..d.row_words()], &want[r * d.row_words()..][..d.row_words()]);
                    let n = (w[0] as usize).min(d.n_tiles);
                    if g[0] != w[0] || g[1..1 + n] != w[1..1 + n] {
                        return true;
                    }
                    let (b, slot, m) = (r / (d.slots * d.m_tiles), r / d.m_tiles % d.slots, r % d.m_tiles);
                    w[1..1 + n].iter().any(|&e| {
                        let bits_slot = ((e >> attnc_ir::block_mask::BITS_SLOT_SHIFT)
                            & attnc_ir::block_mask::BITS_SLOT_MASK) as usize;
                        if e & attnc_ir::block_mask::FULL_TILE != 0 || bits_slot == 0 {
                            return false;
                        }
                        let tile = (e & attnc_ir::block_mask::TILE_INDEX_MASK) as usize;
                        let want_bits =
                            attnc_ir::block_mask::reference_tile_bits(s, mask.tiling(), &data, b, slot, m, tile);
                        crate::block_mask::tile_bits(&got, d, mask.layout(), r, bits_slot) != Some(&want_bits[..])
                    })
                })
                .count()
        }
        // One class per tile; only tiles inside the sequences are written (and read).
        attnc_lower::BlockLayout::Dense | attnc_lower::BlockLayout::DenseWithBits => (0..rows)
            .filter(|&r| {
                let b = r / (d.slots * d.m_tiles);
                let m = r % d.m_tiles;
                let (sq, sk) = plan.seqlens[b];
                let mt = (sq * classes.group).div_ceil(mask.tiling().block_m as usize);
                let nt = sk.div_ceil(mask.tiling().block_n as usize);
                m < mt
                    && (0..nt).any(|n| {
                        let code = match classes.classes[r * d.n_tiles + n] {
                            attnc_ir::TileClass::Empty => 0,
                            attnc_ir::TileClass::Partial => 1,
                            attnc_ir::TileClass::Full => 2,
                        };
                        got[r * d.n_tiles + n] & 0xff != code
                    })
            })
            .count(),
    };
    let live_fraction = kernel.block_mask_live_fraction(&mask)?;
    let mut o2 = t.o.clone();
    rt.fill_nan(&o2)?;
    let with_mask = Params { block_mask: Some(&mask), timing: false, ..params.clone() };
    t.forward(kernel, &mut o2, &with_mask)?;
    rt.synchronize()?;
    // bf16/fp16 → f64 is exact, so equal bits here are equal bits on the device.
    let bits = |t: &Tensor| -> Result<Vec<u64>, RuntimeError> {
        Ok(rt.download_f64(t)?.into_iter().map(f64::to_bits).collect())
    };
    let (a, b) = (bits(o_per_call)?, bits(&o2)?);
    // The same launch with the aux tensors in other buffers: the mask must be refused.
    let others: Vec<(String, Tensor)> = params
        .aux
        .iter()
        .map(|(n, a)| Ok((n.clone(), rt.alloc(a.dtype(), a.shape())?)))
        .collect::<Result<_, RuntimeError>>()?;
    let mut moved = Params { aux: Vec::new(), ..with_mask.clone() };
    for (n, a) in &others {
        moved = moved.aux(n, a);
    }
    let mut o3 = t.o.clone();
    let refused = t.forward(kernel, &mut o3, &moved);
    let refused_for_other_aux = matches!(refused, Err(RuntimeError::BlockMask(_)));
    let tiling = mask.tiling();
    Ok(BlockMaskCheck {
        refused_for_other_aux,
        block_m: tiling.block_m,
        block_n: tiling.block_n,
        rows_wrong,
        rows,
        live_fraction,
        passed_in_identical: a == b,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use attnc_ir::Align;

    #[test]
    fn matrix_covers_what_the_issue_asks() {
        let mut paged = Spec::new("p", 128, 32);
        paged.kv_heads = 8;
        paged.pack_gqa = true;
        paged.kv_layout = KvLayout::Paged { page_size: 16 };
        paged.split_kv = SplitKv::Auto;
        paged.mask.causal = Some(Align::BottomRight);
        let opts = SelftestOptions::default();
        let cases = plan_cases(&paged, &opts);
        let sizes: std::collections::BTreeSet<u32> = cases
            .iter()
            .filter_map(|c| match c.spec.kv_layout {
                KvLayout::Paged { page_size } => Some(page_size),
                _ => None,
            })
            .collect();
        assert_eq!(sizes.into_iter().collect::<Vec<_>>(), vec![1, 16, 128]);
        for n in (1..=8).chain([MANY_SPLITS]) {
            assert!(cases.iter().any(|c| c.splits == SplitReq::N(n)), "split {n}");
        }
        assert!(cases.iter().any(|c| c.splits == SplitReq::Auto));
        assert!(cases.iter().any(|c| !c.spec.pack_gqa), "GQA without packing");
        assert!(cases.iter().all(|c| c.spec.kv_heads == 2 && c.spec.q_heads == 8));

        let mut v = Spec::new("v", 128, 28);
        v.kv_heads = 4;
        v.kv_layout = KvLayout::Varlen;
        let cases = plan_cases(&v, &opts);
        let lens: Vec<usize> = cases.iter().flat_map(|c| c.seqlens.iter().flat_map(|s| [s.0, s.1])).collect();
        for l in [0, 1, 17, 1000, 4097] {
            assert!(lens.contains(&l), "length {l}");
        }
        assert!(cases.iter().any(|c| c.seqlens.len() > 1));
        assert!(cases.iter().any(|c| c.seqlens.iter().any(|s| s.0 != s.1)));
        for c in &cases {
            assert!(ref_cost(&c.spec, &c.seqlens) <= opts.max_ref_cost, "{:?}", c.seqlens);
        }
    }

    #[test]
    fn cost_cap_shrinks_q_only() {
        let s = Spec::new("c", 128, 16);
        let (l, shrunk) = fit_cost(&s, &[(4097, 4097), (4097, 4097)], 1e9);
        assert!(shrunk);
        assert!(l.iter().all(|&(q, k)| k == 4097 && (1..4097).contains(&q) && q == l[0].0));
        assert!(ref_cost(&s, &l) <= 1e9);
        let (l, shrunk) = fit_cost(&s, &[(3, 5)], 1e9);
        assert_eq!((l, shrunk), (vec![(3, 5)], false));
    }
}
