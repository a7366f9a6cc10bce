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
//! Every input is checked first ([`ReferenceError`]); the executor never panics.

use crate::check::{type_of, ExprContext};
use crate::eval::{eval, AuxTensor, Env, Value};
use crate::expr::{Expr, Ty};
use crate::spec::{AuxDim, AuxElem, DType, Spec};

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
    let seqlens: Vec<(usize, usize)> = inputs.seqs.iter().map(|s| (s.seqlen_q, s.seqlen_k)).collect();
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

/// One (batch entry, q head)'s result: `o` as `[seqlen_q, d_v]` and `lse` as `[seqlen_q]`.
type HeadOut = (Vec<f64>, Vec<f64>);

fn head(ctx: &Ctx, b: usize, h: usize) -> HeadOut {
    let seq = &ctx.inputs.seqs[b];
    let (sq, sk, dqk, dv) = (seq.seqlen_q, seq.seqlen_k, ctx.dqk, ctx.dv);
    let hkv = h / ctx.group;
    let sink = ctx.inputs.sinks.as_ref().and_then(|s| s.get(h).copied());
    let mut env = Env {
        b: b as i32,
        h: h as i32,
        hkv: hkv as i32,
        q: 0,
        k: 0,
        score: 0.0,
        seqlen_q: sq as i32,
        seqlen_k: sk as i32,
        q_heads: ctx.qh as i32,
        kv_heads: ctx.kvh as i32,
        params: &ctx.inputs.params,
        aux: &ctx.inputs.aux,
    };
    let mut o = vec![0.0; sq * dv];
    let mut lse = vec![f64::NEG_INFINITY; sq];
    // (key index, logit) of the contributing keys of one row.
    let mut row: Vec<(usize, f64)> = Vec::with_capacity(sk);
    for i in 0..sq {
        row.clear();
        env.q = i as i32;
        let qrow = &seq.q[(i * ctx.qh + h) * dqk..][..dqk];
        for j in 0..sk {
            env.k = j as i32;
            if let Some(p) = &ctx.pred {
                if !eval(ctx.spec, p, &env).as_bool() {
                    continue;
                }
            }
            let krow = &seq.k[(j * ctx.kvh + hkv) * dqk..][..dqk];
            let dot: f64 = qrow.iter().zip(krow).map(|(a, b)| a * b).sum();
            let score = ctx.scale * dot;
            let s = match ctx.score_mod {
                Some(sm) => {
                    env.score = score;
                    eval(ctx.spec, sm, &env).as_float()
                }
                None => score,
            };
            if s != f64::NEG_INFINITY {
                row.push((j, s));
            }
        }
        let sink = sink.filter(|s| *s != f64::NEG_INFINITY);
        let logits = row.iter().map(|r| r.1).chain(sink);
        let out = &mut o[i * dv..][..dv];
        if logits.clone().any(|s| s.is_nan() || s == f64::INFINITY) {
            out.fill(f64::NAN);
            lse[i] = f64::NAN;
            continue;
        }
        let Some(m) = logits.reduce(f64::max) else {
            continue; // nothing contributes: o = 0, lse = -inf
        };
        let mut denom = sink.map_or(0.0, |s| (s - m).exp());
        for &(j, s) in &row {
            let p = (s - m).exp();
            denom += p;
            let vrow = &seq.v[(j * ctx.kvh + hkv) * dv..][..dv];
            for (acc, x) in out.iter_mut().zip(vrow) {
                *acc += p * x;
            }
        }
        out.iter_mut().for_each(|x| *x /= denom);
        lse[i] = m + denom.ln();
    }
    (o, lse)
}

/// Runs the forward pass of `spec` on `inputs`: one output per sequence.
///
/// Work is spread over threads by (sequence, head); the result does not depend on it.
pub fn reference_forward(spec: &Spec, inputs: &Inputs) -> Result<Vec<SeqOutput>, ReferenceError> {
    let ctx = prepare(spec, inputs)?;
    let items: Vec<(usize, usize)> = (0..inputs.seqs.len()).flat_map(|b| (0..ctx.qh).map(move |h| (b, h))).collect();
    let cost: f64 =
        inputs.seqs.iter().map(|s| s.seqlen_q as f64 * s.seqlen_k as f64 * (ctx.qh * (ctx.dqk + ctx.dv)) as f64).sum();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(items.len()).min(64);

    let mut results: Vec<Option<HeadOut>> = vec![None; items.len()];
    if threads <= 1 || cost < 4.0e6 {
        for (n, &(b, h)) in items.iter().enumerate() {
            results[n] = Some(head(&ctx, b, h));
        }
    } else {
        let ctx = &ctx;
        let items = &items;
        let chunks: Vec<Vec<(usize, HeadOut)>> = std::thread::scope(|scope| {
            let work = move |t: usize| -> Vec<(usize, HeadOut)> {
                (t..items.len()).step_by(threads).map(|n| (n, head(ctx, items[n].0, items[n].1))).collect()
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
    }

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
    Inputs { seqs, params, aux, sinks }
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
