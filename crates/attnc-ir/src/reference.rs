//! The f64 CPU reference executor: the definition of what a variant computes.
//!
//! The layout is *logical*: one [`Sequence`] per batch entry, whatever the physical KV
//! layout (contiguous, varlen, paged) and work split (split-KV) of a kernel; those change
//! where data lives and how work is divided, never the math.
//!
//! For batch entry `b`, query head `h` (KV head `hkv = h / (q_heads / kv_heads)`) and query
//! position `i`:
//! 1. key `j` is *allowed* when the mask predicate ([`crate::spec::Mask::to_predicate`]) is
//!    true for `b, h, hkv, q = i, k = j, seqlen_q, seqlen_k` of this sequence, `q_heads`,
//!    `kv_heads`, the params and aux tensors (evaluated by [`crate::eval::eval`]);
//! 2. for an allowed key, `score = scale · (q_i · k_j)` (f64) and
//!    `s_j = score_mod(score)` (or `score` without a score modification);
//! 3. with sinks, the sink logit `sinks[h]` joins the softmax as one more logit that has no
//!    value row; `m = max(max_j s_j, sink)`, `denominator = Σ_j exp(s_j − m) + exp(sink − m)`;
//! 4. `o_i = Σ_j exp(s_j − m) · v_j / denominator`, `lse_i = m + ln(denominator)` (natural
//!    log, includes the sink).
//!
//! Special cases:
//! - A logit equal to −∞ (a score that `score_mod` sends to −∞, or a sink of −∞) is treated
//!   exactly like a masked key: it contributes nothing.
//! - A row with no contributing logit (no allowed key and no sink): `o = 0`, `lse = −∞`.
//! - A row with a NaN or +∞ logit (score after `score_mod`, or sink): `o = NaN` for every
//!   element and `lse = NaN` (what the softmax formula propagates to).
//! - Non-finite values in V propagate by IEEE arithmetic.
//!
//! **Backward.** [`reference_backward`] differentiates the loss `Σ d_out ∘ O`: dQ, dK, dV,
//! the sinks' and every learnable aux tensor's gradient (its docs give the formulas and
//! the special cases; the score modification's derivatives come from [`crate::deriv`]).
//! Forward and backward share the code that computes a row's logits and softmax, so they
//! cannot disagree about which keys contribute. [`crate::gradcheck`] checks it against
//! finite differences of the forward.
//!
//! Every input is checked first ([`ReferenceError`]); the executor never panics.

use crate::check::{type_of, ExprContext};
use crate::deriv::{score_mod_grad, AuxGradTerm};
use crate::eval::{eval, AuxTensor, Env, Value};
use crate::expr::{Expr, Ty};
use crate::spec::{AuxDim, AuxElem, DType, Spec};
use std::collections::HashMap;

/// One batch entry, in logical layout.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sequence {
    pub seqlen_q: usize,
    pub seqlen_k: usize,
    /// `[seqlen_q, q_heads, d_qk]`, row-major.
    pub q: Vec<f64>,
    /// `[seqlen_k, kv_heads, d_qk]`.
    pub k: Vec<f64>,
    /// `[seqlen_k, kv_heads, d_v]`.
    pub v: Vec<f64>,
}

/// Everything a forward pass reads.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Inputs {
    /// One per batch entry; `b` is the index in this list.
    pub seqs: Vec<Sequence>,
    /// Param values in declaration order (`Value::Int` for int params, `Value::Float` for
    /// float params).
    pub params: Vec<Value>,
    /// Aux tensors in declaration order, dims resolved (see [`resolve_aux_dims`]).
    pub aux: Vec<AuxTensor>,
    /// `[q_heads]` sink logits, present exactly when `spec.sinks`.
    pub sinks: Option<Vec<f64>>,
    /// Where each sequence sits in a longer one (context parallelism: a shard of queries
    /// against a shard of keys), one per sequence; empty when every sequence is whole.
    pub positions: Vec<ShardPositions>,
}

/// A shard's place in its global sequence. Masks and score modifications see global
/// positions (`q = q_offset + local row`, `k = k_offset + local key`) and the global
/// lengths, and aux tensors are the global ones (their dims resolve against the global
/// lengths), so a variant computes on a shard exactly what it computes there on the whole.
/// Partial results over key shards combine with [`merge_partials`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShardPositions {
    pub q_offset: usize,
    pub k_offset: usize,
    /// The global lengths.
    pub seqlen_q: usize,
    pub seqlen_k: usize,
    /// Whether this shard's softmax takes the sink logit: exactly one key shard of each
    /// query row should, or the merge counts the sink more than once.
    pub sinks: bool,
}

/// The softmax of a row over the union of key shards, from each shard's `(o, lse)`:
/// `lse = log Σ exp(lse_i)`, `o = Σ exp(lse_i − lse) · o_i` (f64). Shards whose row had no
/// contributing key (`lse = −∞`) weigh nothing; a row with none anywhere stays `o = 0`,
/// `lse = −∞`. All parts must have the same shape.
pub fn merge_partials(parts: &[SeqOutput], q_heads: usize, d_v: usize) -> SeqOutput {
    let Some(first) = parts.first() else { return SeqOutput::default() };
    let rows = first.lse.len() / q_heads.max(1);
    let mut out = SeqOutput { o: vec![0.0; first.o.len()], lse: vec![f64::NEG_INFINITY; first.lse.len()] };
    for h in 0..q_heads {
        for i in 0..rows {
            let l = h * rows + i;
            let m = parts.iter().map(|p| p.lse[l]).fold(f64::NEG_INFINITY, f64::max);
            if m == f64::NEG_INFINITY || m.is_nan() {
                out.lse[l] = m;
                continue;
            }
            let total: f64 = parts.iter().map(|p| (p.lse[l] - m).exp()).sum();
            let lse = m + total.ln();
            out.lse[l] = lse;
            let dst = &mut out.o[(i * q_heads + h) * d_v..][..d_v];
            for p in parts {
                let w = (p.lse[l] - lse).exp();
                if w > 0.0 {
                    for (acc, x) in dst.iter_mut().zip(&p.o[(i * q_heads + h) * d_v..][..d_v]) {
                        *acc += w * x;
                    }
                }
            }
        }
    }
    out
}

impl Inputs {
    /// Sets a param by name (e.g. to override the value [`random_inputs`] chose).
    pub fn set_param(&mut self, spec: &Spec, name: &str, value: Value) -> Result<(), ReferenceError> {
        let i = spec.param_index(name).ok_or_else(|| ReferenceError::Param(format!("unknown parameter `{name}`")))?;
        check_param_type(spec, i, value)?;
        if self.params.len() != spec.params.len() {
            return Err(ReferenceError::Param(format!(
                "expected {} param value(s), found {}",
                spec.params.len(),
                self.params.len()
            )));
        }
        self.params[i] = value;
        Ok(())
    }

    /// The shard of these (whole) sequences with queries `q` and keys `k`: their rows of
    /// Q, K and V, the same params, aux tensors and sinks, and their positions (`sinks`:
    /// whether this key shard takes the sink). Ranges past a sequence's end are cut to it.
    pub fn shard(&self, spec: &Spec, q: std::ops::Range<usize>, k: std::ops::Range<usize>, sinks: bool) -> Inputs {
        let (qh, kvh) = (spec.q_heads as usize, spec.kv_heads as usize);
        let (dqk, dv) = (spec.head_dim_qk as usize, spec.head_dim_v as usize);
        let cut = |r: &std::ops::Range<usize>, n: usize| r.start.min(n)..r.end.min(n);
        let seqs: Vec<Sequence> = self
            .seqs
            .iter()
            .map(|s| {
                let (q, k) = (cut(&q, s.seqlen_q), cut(&k, s.seqlen_k));
                Sequence {
                    seqlen_q: q.len(),
                    seqlen_k: k.len(),
                    q: s.q[q.start * qh * dqk..q.end * qh * dqk].to_vec(),
                    k: s.k[k.start * kvh * dqk..k.end * kvh * dqk].to_vec(),
                    v: s.v[k.start * kvh * dv..k.end * kvh * dv].to_vec(),
                }
            })
            .collect();
        let positions = self
            .seqs
            .iter()
            .map(|s| ShardPositions {
                q_offset: q.start.min(s.seqlen_q),
                k_offset: k.start.min(s.seqlen_k),
                seqlen_q: s.seqlen_q,
                seqlen_k: s.seqlen_k,
                sinks,
            })
            .collect();
        Inputs { seqs, positions, ..self.clone() }
    }
}

/// The result for one batch entry.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SeqOutput {
    /// `[seqlen_q, q_heads, d_v]`.
    pub o: Vec<f64>,
    /// `[q_heads, seqlen_q]`, natural log.
    pub lse: Vec<f64>,
}

/// Why a forward pass could not run.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ReferenceError {
    #[error("invalid spec: {0}")]
    Spec(String),
    #[error("{what}: expected {expected} elements, found {found}")]
    Length { what: String, expected: usize, found: usize },
    #[error("params: {0}")]
    Param(String),
    #[error("aux: {0}")]
    Aux(String),
    #[error("sinks: {0}")]
    Sinks(String),
    #[error("too large: {0}")]
    TooLarge(String),
    #[error("internal error: {0}")]
    Internal(String),
}

fn check_param_type(spec: &Spec, i: usize, value: Value) -> Result<(), ReferenceError> {
    let Some(decl) = spec.params.get(i) else {
        return Err(ReferenceError::Param(format!("no parameter #{i}")));
    };
    let ok = matches!((decl.ty, value), (Ty::Int, Value::Int(_)) | (Ty::Float, Value::Float(_)));
    if ok {
        Ok(())
    } else {
        Err(ReferenceError::Param(format!("parameter `{}` is {}, given {value:?}", decl.name, decl.ty)))
    }
}

/// The dims an aux tensor must have for this batch (`AuxDim` resolved).
pub fn resolve_aux_dims(spec: &Spec, dims: &[AuxDim], seqlens: &[(usize, usize)]) -> Vec<usize> {
    let max_q = seqlens.iter().map(|s| s.0).max().unwrap_or(0);
    let max_k = seqlens.iter().map(|s| s.1).max().unwrap_or(0);
    dims.iter()
        .map(|d| match *d {
            AuxDim::Batch => seqlens.len(),
            AuxDim::MaxSeqlenQ => max_q,
            AuxDim::MaxSeqlenK => max_k,
            AuxDim::QHeads => spec.q_heads as usize,
            AuxDim::KvHeads => spec.kv_heads as usize,
            AuxDim::Fixed(n) => usize::try_from(n).unwrap_or(usize::MAX),
        })
        .collect()
}

fn to_i32(v: usize, what: &str) -> Result<i32, ReferenceError> {
    i32::try_from(v).map_err(|_| ReferenceError::TooLarge(format!("{what} = {v} does not fit in i32")))
}

fn product(dims: &[usize], what: &str) -> Result<usize, ReferenceError> {
    dims.iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| ReferenceError::TooLarge(format!("{what}: element count overflows")))
}

/// Validated, per-call constants.
struct Ctx<'a> {
    spec: &'a Spec,
    inputs: &'a Inputs,
    pred: Option<Expr>,
    score_mod: Option<&'a Expr>,
    scale: f64,
    dqk: usize,
    dv: usize,
    qh: usize,
    kvh: usize,
    group: usize,
}

fn prepare<'a>(spec: &'a Spec, inputs: &'a Inputs) -> Result<Ctx<'a>, ReferenceError> {
    #[allow(clippy::manual_is_multiple_of)] // rust-version 1.80
    if spec.q_heads == 0 || spec.kv_heads == 0 || spec.q_heads % spec.kv_heads != 0 {
        return Err(ReferenceError::Spec(format!(
            "q heads ({}) must be a positive multiple of kv heads ({})",
            spec.q_heads, spec.kv_heads
        )));
    }
    to_i32(spec.q_heads as usize, "q_heads")?;
    if spec.head_dim_qk == 0 || spec.head_dim_v == 0 {
        return Err(ReferenceError::Spec("head dims must be at least 1".into()));
    }
    if let Some(w) = spec.mask.window {
        if [w.left, w.right].into_iter().flatten().any(|v| v > i32::MAX as u64) {
            return Err(ReferenceError::Spec(format!("window bounds must be at most {}", i32::MAX)));
        }
    }
    let pred = spec.mask.to_predicate();
    if let Some(p) = &pred {
        match type_of(spec, p, ExprContext::Mask) {
            Ok(Ty::Bool) => {}
            Ok(t) => return Err(ReferenceError::Spec(format!("a mask must be bool, found {t}"))),
            Err(e) => return Err(ReferenceError::Spec(format!("mask: {e}"))),
        }
    }
    if let Some(s) = &spec.score_mod {
        match type_of(spec, s, ExprContext::ScoreMod) {
            Ok(Ty::Float) => {}
            Ok(t) => return Err(ReferenceError::Spec(format!("a score modification must be float, found {t}"))),
            Err(e) => return Err(ReferenceError::Spec(format!("score_mod: {e}"))),
        }
    }

    if inputs.params.len() != spec.params.len() {
        return Err(ReferenceError::Param(format!(
            "expected {} param value(s), found {}",
            spec.params.len(),
            inputs.params.len()
        )));
    }
    for (i, v) in inputs.params.iter().enumerate() {
        check_param_type(spec, i, *v)?;
    }

    to_i32(inputs.seqs.len(), "batch size")?;
    if !inputs.positions.is_empty() {
        if inputs.positions.len() != inputs.seqs.len() {
            return Err(ReferenceError::Length {
                what: "shard positions".into(),
                expected: inputs.seqs.len(),
                found: inputs.positions.len(),
            });
        }
        for (b, (s, p)) in inputs.seqs.iter().zip(&inputs.positions).enumerate() {
            if p.q_offset + s.seqlen_q > p.seqlen_q || p.k_offset + s.seqlen_k > p.seqlen_k {
                return Err(ReferenceError::Spec(format!(
                    "sequence {b}: rows {}..{} and keys {}..{} do not lie in the global {} x {}",
                    p.q_offset,
                    p.q_offset + s.seqlen_q,
                    p.k_offset,
                    p.k_offset + s.seqlen_k,
                    p.seqlen_q,
                    p.seqlen_k
                )));
            }
            to_i32(p.seqlen_q.max(p.seqlen_k), "global sequence length")?;
        }
    }
    // Aux tensors are the global ones: their dims resolve against the global lengths.
    let seqlens: Vec<(usize, usize)> = if inputs.positions.is_empty() {
        inputs.seqs.iter().map(|s| (s.seqlen_q, s.seqlen_k)).collect()
    } else {
        inputs.positions.iter().map(|p| (p.seqlen_q, p.seqlen_k)).collect()
    };
    if inputs.aux.len() != spec.aux.len() {
        return Err(ReferenceError::Aux(format!(
            "expected {} aux tensor(s), found {}",
            spec.aux.len(),
            inputs.aux.len()
        )));
    }
    for (decl, t) in spec.aux.iter().zip(&inputs.aux) {
        let want = resolve_aux_dims(spec, &decl.dims, &seqlens);
        if t.dims != want {
            return Err(ReferenceError::Aux(format!(
                "aux tensor `{}` must have dims {want:?}, found {:?}",
                decl.name, t.dims
            )));
        }
        if t.data.elem() != decl.elem {
            return Err(ReferenceError::Aux(format!(
                "aux tensor `{}` is declared {} but holds {} data",
                decl.name,
                decl.elem.name(),
                t.data.elem().name()
            )));
        }
        let n = product(&t.dims, &decl.name)?;
        if t.data.len() != n {
            return Err(ReferenceError::Length {
                what: format!("aux tensor `{}`", decl.name),
                expected: n,
                found: t.data.len(),
            });
        }
    }

    let (qh, kvh) = (spec.q_heads as usize, spec.kv_heads as usize);
    match (&inputs.sinks, spec.sinks) {
        (Some(s), true) if s.len() == qh => {}
        (Some(s), true) => return Err(ReferenceError::Length { what: "sinks".into(), expected: qh, found: s.len() }),
        (None, true) => return Err(ReferenceError::Sinks("the spec has sinks but none were given".into())),
        (Some(_), false) => return Err(ReferenceError::Sinks("sinks given but the spec has none".into())),
        (None, false) => {}
    }

    let (dqk, dv) = (spec.head_dim_qk as usize, spec.head_dim_v as usize);
    for (b, s) in inputs.seqs.iter().enumerate() {
        to_i32(s.seqlen_q, "seqlen_q")?;
        to_i32(s.seqlen_k, "seqlen_k")?;
        for (what, data, dims) in [
            ("q", &s.q, [s.seqlen_q, qh, dqk]),
            ("k", &s.k, [s.seqlen_k, kvh, dqk]),
            ("v", &s.v, [s.seqlen_k, kvh, dv]),
        ] {
            let what = format!("sequence {b}: {what}");
            let n = product(&dims, &what)?;
            if data.len() != n {
                return Err(ReferenceError::Length { what, expected: n, found: data.len() });
            }
        }
    }
    Ok(Ctx {
        spec,
        inputs,
        pred,
        score_mod: spec.score_mod.as_ref(),
        scale: spec.scale_value(),
        dqk,
        dv,
        qh,
        kvh,
        group: qh / kvh,
    })
}

/// The environment of one (batch entry, q head); `q`, `k` and `score` are set per element.
fn head_env<'a>(ctx: &Ctx<'a>, b: usize, h: usize) -> Env<'a> {
    let seq = &ctx.inputs.seqs[b];
    let (seqlen_q, seqlen_k) =
        ctx.inputs.positions.get(b).map_or((seq.seqlen_q, seq.seqlen_k), |p| (p.seqlen_q, p.seqlen_k));
    Env {
        b: b as i32,
        h: h as i32,
        hkv: (h / ctx.group) as i32,
        q: 0,
        k: 0,
        score: 0.0,
        seqlen_q: seqlen_q as i32,
        seqlen_k: seqlen_k as i32,
        q_heads: ctx.qh as i32,
        kv_heads: ctx.kvh as i32,
        params: &ctx.inputs.params,
        aux: &ctx.inputs.aux,
    }
}

/// One contributing key of a row: its index, the scaled score and the logit after the
/// score modification (never −∞).
#[derive(Clone, Copy, Debug)]
struct Logit {
    j: usize,
    score: f64,
    s: f64,
}

/// The contributing keys of query row `i` of head `h` (steps 1 and 2 of the module docs):
/// allowed by the mask, logit not −∞. `env` must be [`head_env`]'s for this head.
fn row_logits(ctx: &Ctx, env: &mut Env, b: usize, h: usize, i: usize, row: &mut Vec<Logit>) {
    let seq = &ctx.inputs.seqs[b];
    let (dqk, hkv) = (ctx.dqk, h / ctx.group);
    row.clear();
    let (q_off, k_off) = ctx.inputs.positions.get(b).map_or((0, 0), |p| (p.q_offset, p.k_offset));
    env.q = (q_off + i) as i32;
    let qrow = &seq.q[(i * ctx.qh + h) * dqk..][..dqk];
    for j in 0..seq.seqlen_k {
        env.k = (k_off + j) as i32;
        if let Some(p) = &ctx.pred {
            if !eval(ctx.spec, p, env).as_bool() {
                continue;
            }
        }
        let krow = &seq.k[(j * ctx.kvh + hkv) * dqk..][..dqk];
        let dot: f64 = qrow.iter().zip(krow).map(|(a, b)| a * b).sum();
        let score = ctx.scale * dot;
        let s = match ctx.score_mod {
            Some(sm) => {
                env.score = score;
                eval(ctx.spec, sm, env).as_float()
            }
            None => score,
        };
        if s != f64::NEG_INFINITY {
            row.push(Logit { j, score, s });
        }
    }
}

/// What the softmax of one row is (steps 3 and 4).
enum RowSoftmax {
    /// No contributing logit: `o = 0`, `lse = −∞`.
    Empty,
    /// A NaN or +∞ logit: everything the row produces is NaN.
    Nan,
    /// `m` the max logit, `denom` the denominator (sink included), `sink` the sink logit
    /// if it contributes.
    Finite { m: f64, denom: f64, sink: Option<f64> },
}

fn row_softmax(row: &[Logit], sink: Option<f64>) -> RowSoftmax {
    let sink = sink.filter(|s| *s != f64::NEG_INFINITY);
    let logits = row.iter().map(|r| r.s).chain(sink);
    if logits.clone().any(|s| s.is_nan() || s == f64::INFINITY) {
        return RowSoftmax::Nan;
    }
    let Some(m) = logits.reduce(f64::max) else {
        return RowSoftmax::Empty;
    };
    let mut denom = sink.map_or(0.0, |s| (s - m).exp());
    for r in row {
        denom += (r.s - m).exp();
    }
    RowSoftmax::Finite { m, denom, sink }
}

/// `o = Σ_j exp(s_j − m) · v_j / denom` for a finite row, into `out` (`[d_v]`, zeroed).
fn row_output(ctx: &Ctx, b: usize, hkv: usize, row: &[Logit], m: f64, denom: f64, out: &mut [f64]) {
    let seq = &ctx.inputs.seqs[b];
    let dv = ctx.dv;
    for r in row {
        let p = (r.s - m).exp();
        let vrow = &seq.v[(r.j * ctx.kvh + hkv) * dv..][..dv];
        for (acc, x) in out.iter_mut().zip(vrow) {
            *acc += p * x;
        }
    }
    out.iter_mut().for_each(|x| *x /= denom);
}

/// One (batch entry, q head)'s result: `o` as `[seqlen_q, d_v]` and `lse` as `[seqlen_q]`.
type HeadOut = (Vec<f64>, Vec<f64>);

fn head(ctx: &Ctx, b: usize, h: usize) -> HeadOut {
    let seq = &ctx.inputs.seqs[b];
    let (sq, dv) = (seq.seqlen_q, ctx.dv);
    let sink = ctx.inputs.sinks.as_ref().and_then(|s| s.get(h).copied());
    let sink = sink.filter(|_| ctx.inputs.positions.get(b).is_none_or(|p| p.sinks));
    let mut env = head_env(ctx, b, h);
    let mut o = vec![0.0; sq * dv];
    let mut lse = vec![f64::NEG_INFINITY; sq];
    let mut row: Vec<Logit> = Vec::with_capacity(seq.seqlen_k);
    for i in 0..sq {
        row_logits(ctx, &mut env, b, h, i, &mut row);
        let out = &mut o[i * dv..][..dv];
        match row_softmax(&row, sink) {
            RowSoftmax::Empty => {}
            RowSoftmax::Nan => {
                out.fill(f64::NAN);
                lse[i] = f64::NAN;
            }
            RowSoftmax::Finite { m, denom, .. } => {
                row_output(ctx, b, h / ctx.group, &row, m, denom, out);
                lse[i] = m + denom.ln();
            }
        }
    }
    (o, lse)
}

/// Worker threads for `items` work items of total `cost` (multiply-adds): 1 for small work.
fn worker_count(items: usize, cost: f64) -> usize {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(items).min(64);
    if cost < 4.0e6 {
        1
    } else {
        threads.max(1)
    }
}

/// `f` applied to every item, on `threads` scoped threads (strided), results in item
/// order; `None` where a worker failed (it panicked: a bug, reported as
/// [`ReferenceError::Internal`] by the callers).
fn parallel_map<T: Sync, R: Send>(items: &[T], threads: usize, f: &(dyn Fn(&T) -> R + Sync)) -> Vec<Option<R>> {
    let mut results: Vec<Option<R>> = (0..items.len()).map(|_| None).collect();
    if threads <= 1 {
        for (n, it) in items.iter().enumerate() {
            results[n] = Some(f(it));
        }
        return results;
    }
    let chunks: Vec<Vec<(usize, R)>> = std::thread::scope(|scope| {
        let work = move |t: usize| -> Vec<(usize, R)> {
            (t..items.len()).step_by(threads).map(|n| (n, f(&items[n]))).collect()
        };
        let handles: Vec<_> = (0..threads)
            .map(|t| std::thread::Builder::new().spawn_scoped(scope, move || work(t)).map_err(|_| t))
            .collect();
        handles
            .into_iter()
            .map(|h| match h {
                Ok(handle) => handle.join().unwrap_or_default(),
                Err(t) => work(t), // could not spawn: do it here
            })
            .collect()
    });
    for (n, r) in chunks.into_iter().flatten() {
        results[n] = Some(r);
    }
    results
}

/// Runs the forward pass of `spec` on `inputs`: one output per sequence.
///
/// Work is spread over threads by (sequence, head); the result does not depend on it.
pub fn reference_forward(spec: &Spec, inputs: &Inputs) -> Result<Vec<SeqOutput>, ReferenceError> {
    let ctx = prepare(spec, inputs)?;
    let items: Vec<(usize, usize)> = (0..inputs.seqs.len()).flat_map(|b| (0..ctx.qh).map(move |h| (b, h))).collect();
    let cost: f64 =
        inputs.seqs.iter().map(|s| s.seqlen_q as f64 * s.seqlen_k as f64 * (ctx.qh * (ctx.dqk + ctx.dv)) as f64).sum();
    let ctx = &ctx;
    let mut results = parallel_map(&items, worker_count(items.len(), cost), &|&(b, h)| head(ctx, b, h));

    let mut out: Vec<SeqOutput> = inputs
        .seqs
        .iter()
        .map(|s| SeqOutput { o: vec![0.0; s.seqlen_q * ctx.qh * ctx.dv], lse: vec![0.0; ctx.qh * s.seqlen_q] })
        .collect();
    for (n, &(b, h)) in items.iter().enumerate() {
        let Some((o, lse)) = results[n].take() else {
            return Err(ReferenceError::Internal(format!("worker for sequence {b}, head {h} failed")));
        };
        let (sq, dv, qh) = (inputs.seqs[b].seqlen_q, ctx.dv, ctx.qh);
        let dst = &mut out[b];
        for i in 0..sq {
            dst.o[(i * qh + h) * dv..][..dv].copy_from_slice(&o[i * dv..][..dv]);
        }
        dst.lse[h * sq..][..sq].copy_from_slice(&lse);
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// Backward.

/// Gradients for one batch entry, in the layouts of its [`Sequence`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SeqGrads {
    /// `[seqlen_q, q_heads, d_qk]`.
    pub dq: Vec<f64>,
    /// `[seqlen_k, kv_heads, d_qk]`.
    pub dk: Vec<f64>,
    /// `[seqlen_k, kv_heads, d_v]`.
    pub dv: Vec<f64>,
}

/// Everything [`reference_backward`] computes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Grads {
    /// One per batch entry.
    pub seqs: Vec<SeqGrads>,
    /// `[q_heads]`, present exactly when `spec.sinks`.
    pub dsinks: Option<Vec<f64>>,
    /// One per aux declaration (declaration order): `Some` (same length as the tensor's
    /// data) for a learnable tensor, `None` otherwise.
    pub daux: Vec<Option<Vec<f64>>>,
    /// Per element of `daux`, the sum of the magnitudes of its terms, each taken before
    /// any cancellation (`P (|dP| + |D|)` for dS): the scale rounding errors are relative
    /// to when the terms cancel (a learned position bias whose rows' contributions sum to
    /// nearly 0 leaves `daux` far below its terms; a row with one key has dS = 0 exactly).
    pub daux_scale: Vec<Option<Vec<f64>>>,
}

/// The gradient of one (batch entry, KV head): the rows of its query heads, its keys and
/// values, its heads' sink gradients and its aux gradient contributions.
struct GroupGrads {
    /// `[group, seqlen_q, d_qk]`.
    dq: Vec<f64>,
    /// `[seqlen_k, d_qk]`, `[seqlen_k, d_v]`.
    dk: Vec<f64>,
    dv: Vec<f64>,
    /// `[group]`.
    dsink: Vec<f64>,
    /// Per aux declaration, this group's contributions by element (each summed in the
    /// group's fixed order), and the sum of their magnitudes.
    daux: Vec<HashMap<usize, (f64, f64)>>,
}

/// The spec's derivatives, with each aux term's declaration slot resolved.
struct Derivs {
    d_score: Option<Expr>,
    terms: Vec<(usize, AuxGradTerm)>,
}

fn group_backward(
    ctx: &Ctx,
    derivs: &Derivs,
    d_out: &[Vec<f64>],
    stored_out: Option<&[Vec<f64>]>,
    b: usize,
    hkv: usize,
) -> GroupGrads {
    let seq = &ctx.inputs.seqs[b];
    let (sq, sk, dqk, dv, group) = (seq.seqlen_q, seq.seqlen_k, ctx.dqk, ctx.dv, ctx.group);
    let mut g = GroupGrads {
        dq: vec![0.0; group * sq * dqk],
        dk: vec![0.0; sk * dqk],
        dv: vec![0.0; sk * dv],
        dsink: vec![0.0; group],
        daux: vec![HashMap::new(); ctx.spec.aux.len()],
    };
    let mut row: Vec<Logit> = Vec::with_capacity(sk);
    let mut o = vec![0.0; dv];
    let mut idx: Vec<i32> = Vec::new();
    for gi in 0..group {
        let h = hkv * group + gi;
        let sink = ctx.inputs.sinks.as_ref().and_then(|s| s.get(h).copied());
        let sink = sink.filter(|_| ctx.inputs.positions.get(b).is_none_or(|p| p.sinks));
        let mut env = head_env(ctx, b, h);
        // Keys are global positions, as in the forward (`row_logits`).
        let k_off = ctx.inputs.positions.get(b).map_or(0, |p| p.k_offset);
        for i in 0..sq {
            row_logits(ctx, &mut env, b, h, i, &mut row);
            let softmax = row_softmax(&row, sink);
            let dq = &mut g.dq[(gi * sq + i) * dqk..][..dqk];
            let qrow = &seq.q[(i * ctx.qh + h) * dqk..][..dqk];
            let dorow = &d_out[b][(i * ctx.qh + h) * dv..][..dv];
            let stored_o = stored_out.map(|o| &o[b][(i * ctx.qh + h) * dv..][..dv]);
            // The aux elements this row's keys read, with what to add to each: the term
            // `ds · d`, and its size before dS's own cancellation, `ds_size · |d|` (dS =
            // P (dP − D) is exactly 0 on a row with one key, while its rounding is not).
            let mut add_aux = |env: &mut Env,
                               score: f64,
                               j: usize,
                               ds: f64,
                               ds_size: f64,
                               daux: &mut [HashMap<usize, (f64, f64)>]| {
                env.k = (k_off + j) as i32;
                env.score = score;
                for (slot, t) in &derivs.terms {
                    idx.clear();
                    idx.extend(t.index.iter().map(|e| eval(ctx.spec, e, env).as_int()));
                    let Some(flat) = ctx.inputs.aux[*slot].flat_index(&idx) else { continue };
                    let deriv = if ds.is_nan() { f64::NAN } else { eval(ctx.spec, &t.d, env).as_float() };
                    let acc = daux[*slot].entry(flat).or_insert((0.0, 0.0));
                    acc.0 += ds * deriv;
                    acc.1 += ds_size * deriv.abs();
                }
            };
            let (m, denom) = match softmax {
                RowSoftmax::Empty => continue,
                RowSoftmax::Nan => {
                    // NaN for everything the row touches: its dq, the keys and values it
                    // saw, the sink, the aux elements its score modification read.
                    dq.fill(f64::NAN);
                    for r in &row {
                        g.dk[r.j * dqk..][..dqk].fill(f64::NAN);
                        g.dv[r.j * dv..][..dv].fill(f64::NAN);
                        add_aux(&mut env, r.score, r.j, f64::NAN, f64::NAN, &mut g.daux);
                    }
                    if sink.is_some_and(|s| s != f64::NEG_INFINITY) {
                        g.dsink[gi] = f64::NAN;
                    }
                    continue;
                }
                RowSoftmax::Finite { m, denom, sink } => {
                    match stored_o {
                        Some(given) => o.copy_from_slice(given),
                        None => {
                            o.fill(0.0);
                            row_output(ctx, b, hkv, &row, m, denom, &mut o);
                        }
                    }
                    if let Some(s) = sink {
                        // dL/dsink = −P_sink · D.
                        let d: f64 = dorow.iter().zip(&o).map(|(a, b)| a * b).sum();
                        g.dsink[gi] -= (s - m).exp() / denom * d;
                    }
                    (m, denom)
                }
            };
            // D = dO · O; for each key dP = dO · v, dS = P (dP − D).
            let d_row: f64 = dorow.iter().zip(&o).map(|(a, b)| a * b).sum();
            for r in &row {
                let p = (r.s - m).exp() / denom;
                let vrow = &seq.v[(r.j * ctx.kvh + hkv) * dv..][..dv];
                let dp: f64 = dorow.iter().zip(vrow).map(|(a, b)| a * b).sum();
                let ds = p * (dp - d_row);
                for (acc, x) in g.dv[r.j * dv..][..dv].iter_mut().zip(dorow) {
                    *acc += p * x;
                }
                let dscore = match &derivs.d_score {
                    Some(e) => {
                        env.k = (k_off + r.j) as i32;
                        env.score = r.score;
                        ds * eval(ctx.spec, e, &env).as_float()
                    }
                    None => ds,
                };
                let c = ctx.scale * dscore;
                let krow = &seq.k[(r.j * ctx.kvh + hkv) * dqk..][..dqk];
                for (acc, x) in dq.iter_mut().zip(krow) {
                    *acc += c * x;
                }
                for (acc, x) in g.dk[r.j * dqk..][..dqk].iter_mut().zip(qrow) {
                    *acc += c * x;
                }
                if !derivs.terms.is_empty() {
                    add_aux(&mut env, r.score, r.j, ds, p * (dp.abs() + d_row.abs()), &mut g.daux);
                }
            }
        }
    }
    g
}

/// The gradients of the loss `L = Σ_b Σ d_out[b] ∘ O[b]` (O from [`reference_forward`])
/// with respect to Q, K, V, the sinks and every learnable aux tensor. `d_out[b]` is
/// `[seqlen_q, q_heads, d_v]`, like O.
///
/// With `P` the softmax of a row (sink in the denominator), `s` its logits after the
/// score modification `m`, `score = scale · q·k`:
/// - `dV = Pᵀ · dO`, `dP = dO · Vᵀ`, `D = rowsum(dO ∘ O)`, `dS = P ∘ (dP − D)` (the
///   gradient with respect to the modded logit `s`);
/// - `dScore = dS · ∂m/∂score` ([`crate::deriv::score_mod_grad`]; `dS` itself without a
///   score modification), `dQ = scale · dScore · K`, `dK = scale · dScoreᵀ · Q`; with GQA,
///   dK and dV sum over the query heads sharing the KV head;
/// - `dsink_h = −Σ_{b, i} P_sink(b, h, i) · D(b, h, i)`;
/// - a learnable aux tensor gets, for every contributing (b, h, q, k) and every read site
///   of it in `m`, `dS · ∂m/∂(site)` added at the element the site reads (clamped index).
///
/// Special cases, consistent with the forward: masked keys and keys whose logit is −∞
/// get no gradient (nor does a sink of −∞); a row with no contributing logit contributes
/// nothing; a row with a NaN or +∞ logit (its O is NaN) makes NaN everything it touches:
/// its dQ row, the dK/dV rows of its contributing keys, its head's sink gradient (when the
/// sink contributes) and the aux elements its keys read. Masks contribute no gradient
/// (they are piecewise constant). The KV layout and split-KV do not matter (the math is
/// logical; paged and split layouts are inference layouts, and the reference computes
/// their math like a contiguous one).
///
/// Work is spread over threads by (sequence, KV head), so each dK/dV row has one owner;
/// sink and aux gradients add the groups' contributions in a fixed order, so the result
/// does not depend on the thread count.
pub fn reference_backward(spec: &Spec, inputs: &Inputs, d_out: &[Vec<f64>]) -> Result<Grads, ReferenceError> {
    backward_impl(spec, inputs, d_out, None)
}

/// [`reference_backward`] with `D = rowsum(dO ∘ O)` taken from a given forward output
/// `out` (`[seqlen_q, q_heads, d_v]` per sequence, like `d_out`) instead of the exact one.
///
/// A kernel's backward reads the O its forward stored, rounded to the element type, so
/// its `D` carries that rounding. Most gradients barely notice, but a reduction whose
/// exact value cancels — a learnable position bias gets `Σ_k dS·(k − q)`, and
/// `Σ_k dS = 0` exactly, so an error `δD` in a row enters multiplied by that row's mean
/// distance — amplifies it (by up to the sequence length). Comparing such gradients with
/// this reference, fed the kernel's own O, checks the kernel and not the conditioning.
pub fn reference_backward_with_output(
    spec: &Spec,
    inputs: &Inputs,
    d_out: &[Vec<f64>],
    out: &[Vec<f64>],
) -> Result<Grads, ReferenceError> {
    backward_impl(spec, inputs, d_out, Some(out))
}

fn check_rows(ctx: &Ctx, inputs: &Inputs, what: &str, t: &[Vec<f64>]) -> Result<(), ReferenceError> {
    if t.len() != inputs.seqs.len() {
        return Err(ReferenceError::Length {
            what: format!("{what} (one per sequence)"),
            expected: inputs.seqs.len(),
            found: t.len(),
        });
    }
    for (b, (s, d)) in inputs.seqs.iter().zip(t).enumerate() {
        let what = format!("sequence {b}: {what}");
        let n = product(&[s.seqlen_q, ctx.qh, ctx.dv], &what)?;
        if d.len() != n {
            return Err(ReferenceError::Length { what, expected: n, found: d.len() });
        }
    }
    Ok(())
}

fn backward_impl(
    spec: &Spec,
    inputs: &Inputs,
    d_out: &[Vec<f64>],
    stored_out: Option<&[Vec<f64>]>,
) -> Result<Grads, ReferenceError> {
    let ctx = prepare(spec, inputs)?;
    check_rows(&ctx, inputs, "d_out", d_out)?;
    if let Some(o) = stored_out {
        check_rows(&ctx, inputs, "out", o)?;
    }
    let grad = score_mod_grad(spec);
    let mut terms = Vec::new();
    for t in grad.as_ref().map_or(&[][..], |g| &g.aux) {
        let slot = spec
            .aux_index(&t.aux)
            .ok_or_else(|| ReferenceError::Internal(format!("derivative reads undeclared aux `{}`", t.aux)))?;
        terms.push((slot, t.clone()));
    }
    let derivs = Derivs { d_score: grad.map(|g| g.d_score), terms };
    for e in derivs.d_score.iter().chain(derivs.terms.iter().map(|t| &t.1.d)) {
        if !matches!(type_of(spec, e, ExprContext::ScoreMod), Ok(Ty::Float)) {
            return Err(ReferenceError::Internal(format!("a derivative does not type-check: {e:?}")));
        }
    }

    let items: Vec<(usize, usize)> = (0..inputs.seqs.len()).flat_map(|b| (0..ctx.kvh).map(move |h| (b, h))).collect();
    let cost: f64 = inputs
        .seqs
        .iter()
        .map(|s| s.seqlen_q as f64 * s.seqlen_k as f64 * (ctx.qh * 2 * (ctx.dqk + ctx.dv)) as f64)
        .sum();
    let (ctx, derivs) = (&ctx, &derivs);
    let mut results = parallel_map(&items, worker_count(items.len(), cost), &|&(b, hkv)| {
        group_backward(ctx, derivs, d_out, stored_out, b, hkv)
    });

    let (qh, kvh, dqk, dv, group) = (ctx.qh, ctx.kvh, ctx.dqk, ctx.dv, ctx.group);
    let mut seqs: Vec<SeqGrads> = inputs
        .seqs
        .iter()
        .map(|s| SeqGrads {
            dq: vec![0.0; s.seqlen_q * qh * dqk],
            dk: vec![0.0; s.seqlen_k * kvh * dqk],
            dv: vec![0.0; s.seqlen_k * kvh * dv],
        })
        .collect();
    let mut dsinks = spec.sinks.then(|| vec![0.0; qh]);
    let mut daux: Vec<Option<Vec<f64>>> =
        spec.aux.iter().zip(&inputs.aux).map(|(d, t)| d.learnable.then(|| vec![0.0; t.data.len()])).collect();
    let mut daux_scale = daux.clone();
    for (n, &(b, hkv)) in items.iter().enumerate() {
        let Some(g) = results[n].take() else {
            return Err(ReferenceError::Internal(format!("worker for sequence {b}, kv head {hkv} failed")));
        };
        let (sq, sk) = (inputs.seqs[b].seqlen_q, inputs.seqs[b].seqlen_k);
        let dst = &mut seqs[b];
        for gi in 0..group {
            let h = hkv * group + gi;
            for i in 0..sq {
                dst.dq[(i * qh + h) * dqk..][..dqk].copy_from_slice(&g.dq[(gi * sq + i) * dqk..][..dqk]);
            }
            if let Some(ds) = &mut dsinks {
                ds[h] += g.dsink[gi];
            }
        }
        for j in 0..sk {
            dst.dk[(j * kvh + hkv) * dqk..][..dqk].copy_from_slice(&g.dk[j * dqk..][..dqk]);
            dst.dv[(j * kvh + hkv) * dv..][..dv].copy_from_slice(&g.dv[j * dv..][..dv]);
        }
        for (slot, contrib) in g.daux.into_iter().enumerate() {
            if let (Some(Some(acc)), Some(Some(scale))) = (daux.get_mut(slot), daux_scale.get_mut(slot)) {
                for (flat, (v, a)) in contrib {
                    if let (Some(x), Some(s)) = (acc.get_mut(flat), scale.get_mut(flat)) {
                        *x += v;
                        *s += a;
                    }
                }
            }
        }
    }
    Ok(Grads { seqs, dsinks, daux, daux_scale })
}

/// Relative L2 error `‖a − b‖₂ / ‖b‖₂` (`b` is the reference). Pairs that are identical
/// (including equal infinities, or both NaN) count as exact and are left out of both
/// norms; any other pair with a non-finite value, or different lengths, gives +∞. When
/// `‖b‖₂ = 0` the absolute error `‖a − b‖₂` is returned.
pub fn rel_l2(a: &[f64], b: &[f64]) -> f64 {
    if a.len() != b.len() {
        return f64::INFINITY;
    }
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        if x == y && !x.is_finite() || x.is_nan() && y.is_nan() {
            continue;
        }
        if !x.is_finite() || !y.is_finite() {
            return f64::INFINITY;
        }
        num += (x - y) * (x - y);
        den += y * y;
    }
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}

// ---------------------------------------------------------------------------------------
// Rounding to the storage formats.

fn pow2(n: i32) -> f64 {
    f64::from_bits(((n + 1023) as u64) << 52)
}

/// Round-to-nearest-even of `x` to a binary format with `mant` explicit significand bits,
/// minimum normal exponent `emin` and largest finite value `max` (overflow → ±∞,
/// subnormals kept, NaN stays NaN).
fn round_format(x: f64, mant: i32, emin: i32, max: f64) -> f64 {
    if !x.is_finite() || x == 0.0 {
        return x;
    }
    let e = ((((x.to_bits() >> 52) & 0x7ff) as i32) - 1023).max(emin);
    let quantum = pow2(e - mant);
    let r = (x / quantum).round_ties_even() * quantum;
    if r.abs() > max {
        f64::INFINITY.copysign(x)
    } else {
        r
    }
}

/// `x` rounded to the nearest bfloat16 (ties to even), as an f64.
pub fn round_bf16(x: f64) -> f64 {
    round_format(x, 7, -126, f64::from(f32::from_bits(0x7f7f_0000)))
}

/// `x` rounded to the nearest IEEE binary16 (ties to even), as an f64.
pub fn round_fp16(x: f64) -> f64 {
    round_format(x, 10, -14, 65504.0)
}

/// `x` rounded to the storage format of `dtype`.
pub fn round_to_dtype(x: f64, dtype: DType) -> f64 {
    match dtype {
        DType::Bf16 => round_bf16(x),
        DType::Fp16 => round_fp16(x),
    }
}

// ---------------------------------------------------------------------------------------
// Random inputs.

/// A small deterministic generator (SplitMix64 + Box–Muller), so that the same seed gives
/// the same inputs on every machine and version.
#[derive(Clone, Debug)]
pub struct Rng {
    state: u64,
    spare: Option<f64>,
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng { state: seed, spare: None }
    }
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
    /// Uniform in `lo..=hi` (`lo` when `hi < lo`).
    pub fn int_in(&mut self, lo: i64, hi: i64) -> i64 {
        if hi <= lo {
            return lo;
        }
        let span = (hi - lo) as u64 + 1;
        lo + (self.next_u64() % span) as i64
    }
    /// Standard normal.
    pub fn normal(&mut self) -> f64 {
        if let Some(z) = self.spare.take() {
            return z;
        }
        let u1 = 1.0 - self.uniform(); // (0, 1]
        let u2 = self.uniform();
        let r = (-2.0 * u1.ln()).sqrt();
        let t = 2.0 * std::f64::consts::PI * u2;
        self.spare = Some(r * t.sin());
        r * t.cos()
    }
}

/// Random inputs for `spec` with one sequence per `(seqlen_q, seqlen_k)`:
/// - Q, K, V: standard normal, rounded to `spec.dtype` (round-to-nearest-even);
/// - sinks (when `spec.sinks`): standard normal, rounded to f32;
/// - int params: uniform in `0..=max seqlen_k` (a prefix length, a window, ...);
///   float params: uniform in [0.5, 2); override with [`Inputs::set_param`] or
///   [`random_inputs_with_params`];
/// - int aux tensors (dims resolved for this batch): document-id-like small ints,
///   non-decreasing along the last dimension (starting at 0 or 1, growing by 1 with
///   probability 1/8);
/// - float aux tensors: normal · 0.5 rounded to f32 (what a kernel reads), so a bias moves
///   logits by about the spread of the scores themselves and its effect shows in tests.
///
/// Deterministic in `seed`. Sizes are not checked beyond what fits in memory.
pub fn random_inputs(spec: &Spec, seqlens: &[(usize, usize)], seed: u64) -> Inputs {
    let mut rng = Rng::new(seed);
    let (qh, kvh) = (spec.q_heads as usize, spec.kv_heads as usize);
    let (dqk, dv) = (spec.head_dim_qk as usize, spec.head_dim_v as usize);
    let gen =
        |n: usize, rng: &mut Rng| -> Vec<f64> { (0..n).map(|_| round_to_dtype(rng.normal(), spec.dtype)).collect() };
    let seqs = seqlens
        .iter()
        .map(|&(sq, sk)| Sequence {
            seqlen_q: sq,
            seqlen_k: sk,
            q: gen(sq.saturating_mul(qh).saturating_mul(dqk), &mut rng),
            k: gen(sk.saturating_mul(kvh).saturating_mul(dqk), &mut rng),
            v: gen(sk.saturating_mul(kvh).saturating_mul(dv), &mut rng),
        })
        .collect();
    let max_k = seqlens.iter().map(|s| s.1).max().unwrap_or(0) as i64;
    let params = spec
        .params
        .iter()
        .map(|p| match p.ty {
            Ty::Float => Value::Float(0.5 + 1.5 * rng.uniform()),
            _ => Value::Int(rng.int_in(0, max_k.min(i32::MAX as i64)) as i32),
        })
        .collect();
    let aux = spec
        .aux
        .iter()
        .map(|decl| {
            let dims = resolve_aux_dims(spec, &decl.dims, seqlens);
            let n = dims.iter().fold(1usize, |a, &d| a.saturating_mul(d));
            if decl.elem == AuxElem::Float {
                let data = (0..n).map(|_| (0.5 * rng.normal()) as f32 as f64).collect();
                return AuxTensor::float(dims, data);
            }
            let last = dims.last().copied().unwrap_or(1).max(1);
            let mut id = 0i32;
            let data = (0..n)
                .map(|x| {
                    if x % last == 0 {
                        id = rng.int_in(0, 1) as i32;
                    } else if rng.next_u64() >> 61 == 0 {
                        id += 1;
                    }
                    id
                })
                .collect();
            AuxTensor::int(dims, data)
        })
        .collect();
    let sinks = spec.sinks.then(|| (0..qh).map(|_| rng.normal() as f32 as f64).collect());
    Inputs { seqs, params, aux, sinks, positions: Vec::new() }
}

/// [`random_inputs`] with some params set by name.
pub fn random_inputs_with_params(
    spec: &Spec,
    seqlens: &[(usize, usize)],
    seed: u64,
    params: &[(&str, Value)],
) -> Result<Inputs, ReferenceError> {
    let mut inputs = random_inputs(spec, seqlens, seed);
    for (name, v) in params {
        inputs.set_param(spec, name, *v)?;
    }
    Ok(inputs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_known_values() {
        assert_eq!(round_bf16(1.0), 1.0);
        assert_eq!(round_bf16(1.0 + 1.0 / 256.0), 1.0); // tie → even
        assert_eq!(round_bf16(1.0 + 3.0 / 256.0), 1.0 + 4.0 / 256.0); // tie → even (up)
        assert_eq!(round_bf16(1.0 + 1.0 / 256.0 + 1e-12), 1.0 + 2.0 / 256.0);
        assert_eq!(round_fp16(65504.0), 65504.0);
        assert_eq!(round_fp16(65519.99), 65504.0);
        assert_eq!(round_fp16(65520.0), f64::INFINITY);
        assert_eq!(round_fp16(-1e6), f64::NEG_INFINITY);
        assert_eq!(round_fp16(2f64.powi(-24)), 2f64.powi(-24)); // smallest subnormal
        assert_eq!(round_fp16(2f64.powi(-25)), 0.0); // tie → even (0)
        assert_eq!(round_fp16(1.5 * 2f64.powi(-25)), 2f64.powi(-24));
        assert_eq!(round_bf16(1e300), f64::INFINITY);
        assert!(round_bf16(f64::NAN).is_nan());
        assert_eq!(round_bf16(-0.0).to_bits(), (-0.0f64).to_bits());
    }

    #[test]
    fn rel_l2_handles_special_values() {
        assert_eq!(rel_l2(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        assert_eq!(rel_l2(&[f64::NEG_INFINITY, 1.0], &[f64::NEG_INFINITY, 1.0]), 0.0);
        assert_eq!(rel_l2(&[f64::NAN], &[f64::NAN]), 0.0);
        assert_eq!(rel_l2(&[f64::NAN], &[1.0]), f64::INFINITY);
        assert_eq!(rel_l2(&[1.0], &[1.0, 2.0]), f64::INFINITY);
        assert!((rel_l2(&[3.0, 4.0], &[0.0, 4.0]) - 0.75).abs() < 1e-15);
        assert_eq!(rel_l2(&[3.0, 4.0], &[0.0, 0.0]), 5.0);
    }
}
