//! Symbolic derivatives of score modifications, for the backward pass.
//!
//! The backward needs, at every (b, h, q, k) that a row's softmax saw, the derivative of
//! the score modification `m` with respect to the scaled score (`∂m/∂score`: it turns the
//! gradient of the modded logit, dS, into the gradient of `scale · q·k`), and, for every
//! read of a *learnable* float aux tensor in `m`, the derivative with respect to the
//! element read (the backward adds `dS · ∂m/∂element` to that element's gradient). The
//! user never writes these: [`score_mod_grad`] derives them from the expression tree by
//! the chain rule, so a variant trains as soon as it runs forward.
//!
//! **Results are expressions** over the same variables as `m` (`score`, `b`, `h`, `q`,
//! `k`, params, aux reads, ...), well typed as floats in the score-modification context,
//! so the kernels' expression codegen and [`crate::eval::eval`] handle them unchanged.
//!
//! **Reuse of the forward.** Where a derivative needs a value the forward already
//! computes, it contains that forward subexpression *unchanged* (a structurally identical
//! copy, never simplified), so a code generator that memoizes structurally equal
//! subexpressions computes it once for both:
//! - `exp(u)′ = exp(u) · u′`, `exp2(u)′ = exp2(u) · ln 2 · u′`;
//! - `tanh(u)′ = (1 − tanh(u) · tanh(u)) · u′`, `sigmoid(u)′ = sigmoid(u) · (1 − sigmoid(u)) · u′`;
//! - `sqrt(u)′ = u′ / (2 · sqrt(u))`, `log(u)′ = u′ / u`, `log2(u)′ = u′ / u · log2 e`;
//! - `softcap(u, c)′`: with `t = softcap(u, c) · (1/c)` (for a literal cap, its reciprocal
//!   folded; `softcap(u, c) / c` otherwise) and `g = 1 − t · t`:
//!   `g · u′ + (t − u / c · g) · c′` (the second term only when the cap itself depends on
//!   what is differentiated);
//! - `(a / b)′ = (a′ − (a / b) · b′) / b`, `(a · b)′ = a′ · b + a · b′`.
//!
//! **Conventions where the derivative does not exist** (the kernels and the f64
//! reference backward use the same expressions, so they agree everywhere):
//! - `abs′(0) = 0` (as PyTorch: the subgradient `sign(0) = 0`);
//! - `min(a, b)` and `max(a, b)` at a tie `a == b` pass the whole derivative to the
//!   *first* argument `a`: `select(a <= b || b != b, a′, b′)` (`>=` for max; PyTorch's
//!   `minimum`/`maximum` split it in halves instead: a tie between float scores has
//!   measure zero, the select is cheaper). Like the forward, which returns the non-NaN
//!   operand of `min`/`max`, the derivative follows the non-NaN operand;
//! - `select(c, a, b)` differentiates the branch it takes; the condition contributes
//!   nothing (comparisons are piecewise constant);
//! - every int subexpression is a constant: `int(x)′ = 0`, so `float(int(x))` and an aux
//!   index computed from the score have zero derivative (the function is piecewise
//!   constant); comparisons, `&&`, `||`, `!` and `%` likewise;
//! - poles are not special-cased: `log(0)′`, `sqrt(0)′` and `x / 0` give IEEE infinities
//!   or NaN, like the forward;
//!
//! **Aux read sites.** Each distinct read `t[i, j, ...]` of a learnable float tensor in
//! `m` is one [`AuxGradTerm`]; reads with structurally equal index expressions always
//! read the same element, so they are one site (their derivatives add up). Two sites with
//! different index expressions may still hit the same element at run time: the backward
//! accumulates both there, which is the chain rule for that element. Sites whose
//! derivative is identically zero (a read that only feeds an `int(...)`) are left out.
//! Masks may read float aux tensors only inside comparisons (see [`crate::check`]), so
//! masks never contribute aux gradients.
//!
//! **Simplification** ([`simplify`], and the same rules as the derivatives are built):
//! constant folding by [`crate::eval::eval`] (ints wrap, floats fold in f64 and only to
//! finite values within f32 range, so results still type-check), `x + 0`, `x - 0`,
//! `0 - x`, `x · 1`, `x · (−1)`, `x · 0`, `0 · x`, `x / 1`, `0 / x`, `−(−x)`, `a + (−b)`,
//! `a − (−b)` (also for a negative float literal `b`), `(−a) · (−b)`, selects on a literal condition or with equal branches, and
//! `&&`/`||`/`!` with literals. The float rules `x · 0 = 0`, `0 / x = 0` and `x + 0 = x`
//! **assume finite values** and ignore the sign of zero (`0 · ∞` is NaN and `−0 + 0` is
//! `+0` in IEEE): kernels compute the derivatives at finite scores, and where a score or
//! aux value is not finite the row's gradient is NaN regardless. Int rules are exact.

use crate::check::{type_of, ExprContext};
use crate::eval::{eval, Env, Value};
use crate::expr::{BinOp, Expr, ExprKind, Func, UnOp, Var};
use crate::spec::{AuxElem, Spec};

/// The derivatives the backward pass needs from a spec's score modification.
#[derive(Clone, Debug, PartialEq)]
pub struct ScoreModGrad {
    /// `∂score_mod / ∂score`, a float expression over the score modification's variables.
    pub d_score: Expr,
    /// One term per read site of a learnable float aux tensor (first-read order).
    pub aux: Vec<AuxGradTerm>,
}

/// One read site `aux[index...]` of a LEARNABLE float aux tensor in the score
/// modification: the backward adds `dS · d` to the gradient of the element `index`
/// reads (each index clamped into its dimension, as the read itself does).
#[derive(Clone, Debug, PartialEq)]
pub struct AuxGradTerm {
    /// The tensor's name (as declared; [`Spec::aux_index`] gives its slot).
    pub aux: String,
    /// The index expressions, copies of the read's own (ints).
    pub index: Vec<Expr>,
    /// `∂score_mod / ∂(that element)`, a float expression.
    pub d: Expr,
}

/// What a derivative is taken with respect to.
#[derive(Clone, Debug, PartialEq)]
pub enum Wrt {
    /// The scaled score `score`.
    Score,
    /// The element of aux tensor `name` read with these (structurally equal) indices.
    Aux { name: String, index: Vec<Expr> },
}

/// The derivatives of `spec.score_mod` (`None` when the spec has none).
pub fn score_mod_grad(spec: &Spec) -> Option<ScoreModGrad> {
    let m = spec.score_mod.as_ref()?;
    let d_score = derivative(m, &Wrt::Score);
    let aux = learnable_reads(spec, m)
        .into_iter()
        .filter_map(|(name, index)| {
            let wrt = Wrt::Aux { name, index };
            let d = d(m, &wrt)?;
            let Wrt::Aux { name, index } = wrt else { return None };
            Some(AuxGradTerm { aux: name, index, d })
        })
        .collect();
    Some(ScoreModGrad { d_score, aux })
}

/// `∂e / ∂wrt` as a float expression (the literal `0.0` when it is identically zero).
/// Reads of the same aux element (structurally equal index) count as one variable;
/// every other aux read, param and variable is a constant.
pub fn derivative(e: &Expr, wrt: &Wrt) -> Expr {
    d(e, wrt).unwrap_or_else(|| Expr::float(0.0))
}

/// The distinct (name, index) reads of learnable float aux tensors in `e`, in pre-order.
pub fn learnable_reads(spec: &Spec, e: &Expr) -> Vec<(String, Vec<Expr>)> {
    let mut sites: Vec<(String, Vec<Expr>)> = Vec::new();
    e.walk(&mut |n| {
        if let ExprKind::Aux { name, index } = &n.kind {
            let learnable = spec.aux_decl(name).is_some_and(|d| d.learnable && d.elem == AuxElem::Float);
            if learnable && !sites.iter().any(|(a, i)| a == name && i == index) {
                sites.push((name.clone(), index.clone()));
            }
        }
    });
    sites
}

const LN2: f64 = std::f64::consts::LN_2;
const LOG2E: f64 = std::f64::consts::LOG2_E;

/// The derivative, `None` when it is identically zero. Int and bool subexpressions (and
/// everything not depending on `wrt`) give `None`, so no type information is needed: a
/// non-zero derivative only ever arises from float nodes.
fn d(e: &Expr, wrt: &Wrt) -> Option<Expr> {
    match &e.kind {
        ExprKind::Var(Var::Score) => (*wrt == Wrt::Score).then(|| Expr::float(1.0)),
        ExprKind::Aux { name, index } => match wrt {
            Wrt::Aux { name: n, index: i } if n == name && i == index => Some(Expr::float(1.0)),
            _ => None,
        },
        ExprKind::Int(_)
        | ExprKind::Float(_)
        | ExprKind::Bool(_)
        | ExprKind::Var(_)
        | ExprKind::Param(_)
        | ExprKind::Unary(UnOp::Not, _) => None,
        ExprKind::Unary(UnOp::Neg, a) => d(a, wrt).map(neg),
        ExprKind::Binary(op, a, b) => {
            let (da, db) = match op {
                BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div => (d(a, wrt), d(b, wrt)),
                _ => return None, // comparisons, logic, int %
            };
            if da.is_none() && db.is_none() {
                return None;
            }
            let (a, b) = (&**a, &**b);
            nonzero(match op {
                BinOp::Add => add(zero_or(da), zero_or(db)),
                BinOp::Sub => sub(zero_or(da), zero_or(db)),
                BinOp::Mul => add(
                    da.map_or_else(|| Expr::float(0.0), |da| mul(da, b.clone())),
                    db.map_or_else(|| Expr::float(0.0), |db| mul(a.clone(), db)),
                ),
                _ => {
                    // (a / b)′ = (a′ − (a / b) · b′) / b, reusing the quotient.
                    let num = match db {
                        None => zero_or(da),
                        Some(db) => sub(zero_or(da), mul(e.clone(), db)),
                    };
                    div(num, b.clone())
                }
            })
        }
        ExprKind::Call(f, args) => call(e, *f, args, wrt),
    }
}

fn call(e: &Expr, f: Func, args: &[Expr], wrt: &Wrt) -> Option<Expr> {
    if args.len() != f.arity() {
        return None;
    }
    let u = &args[0];
    // d(f(u)) = f′ · u′ for the one-argument functions.
    let chain = |fp: Expr| -> Option<Expr> { d(u, wrt).and_then(|du| nonzero(mul(fp, du))) };
    match f {
        Func::Min | Func::Max => {
            let (da, db) = (d(&args[0], wrt), d(&args[1], wrt));
            if da.is_none() && db.is_none() {
                return None;
            }
            // Ties go to the first argument. `min`/`max` return the non-NaN operand, so
            // the derivative follows `a` also when `b` is NaN: `a <= b || b != b`.
            let op = if f == Func::Min { BinOp::Le } else { BinOp::Ge };
            let b_nan = Expr::binary(BinOp::Ne, args[1].clone(), args[1].clone());
            let cond = Expr::binary(BinOp::Or, Expr::binary(op, args[0].clone(), args[1].clone()), b_nan);
            nonzero(select(cond, zero_or(da), zero_or(db)))
        }
        Func::Abs => {
            let du = d(u, wrt)?;
            // sign(u), with sign(0) = 0.
            let sign = select(
                Expr::binary(BinOp::Gt, u.clone(), Expr::float(0.0)),
                Expr::float(1.0),
                select(Expr::binary(BinOp::Lt, u.clone(), Expr::float(0.0)), Expr::float(-1.0), Expr::float(0.0)),
            );
            nonzero(mul(du, sign))
        }
        Func::Select => {
            let (da, db) = (d(&args[1], wrt), d(&args[2], wrt));
            if da.is_none() && db.is_none() {
                return None;
            }
            nonzero(select(args[0].clone(), zero_or(da), zero_or(db)))
        }
        Func::ToFloat | Func::ToInt => None,
        Func::Exp => chain(e.clone()),
        Func::Exp2 => chain(mul(e.clone(), Expr::float(LN2))),
        Func::Log => d(u, wrt).and_then(|du| nonzero(div(du, u.clone()))),
        Func::Log2 => d(u, wrt).and_then(|du| nonzero(mul(div(du, u.clone()), Expr::float(LOG2E)))),
        Func::Sqrt => d(u, wrt).and_then(|du| nonzero(div(du, mul(Expr::float(2.0), e.clone())))),
        Func::Tanh => chain(sub(Expr::float(1.0), mul(e.clone(), e.clone()))),
        Func::Sigmoid => chain(mul(e.clone(), sub(Expr::float(1.0), e.clone()))),
        Func::Softcap => {
            let c = &args[1];
            let (du, dc) = (d(u, wrt), d(c, wrt));
            if du.is_none() && dc.is_none() {
                return None;
            }
            // t = softcap(u, c) / c = tanh(u / c), from the forward's value.
            let t = match c.kind {
                ExprKind::Float(cv) if cv != 0.0 && (1.0 / cv).is_finite() => mul(e.clone(), Expr::float(1.0 / cv)),
                _ => div(e.clone(), c.clone()),
            };
            let g = sub(Expr::float(1.0), mul(t.clone(), t.clone()));
            let du_term = du.map_or_else(|| Expr::float(0.0), |du| mul(g.clone(), du));
            let dc_term = dc.map_or_else(|| Expr::float(0.0), |dc| mul(sub(t, mul(div(u.clone(), c.clone()), g)), dc));
            nonzero(add(du_term, dc_term))
        }
    }
}

fn zero_or(e: Option<Expr>) -> Expr {
    e.unwrap_or_else(|| Expr::float(0.0))
}

/// `None` for a literal zero.
fn nonzero(e: Expr) -> Option<Expr> {
    (!is_lit(&e, 0.0)).then_some(e)
}

/// Whether `e` is the literal `v` (float, or int when `v` is integral).
fn is_lit(e: &Expr, v: f64) -> bool {
    match e.kind {
        ExprKind::Float(x) => x == v,
        ExprKind::Int(x) => x as f64 == v,
        _ => false,
    }
}

fn is_literal(e: &Expr) -> bool {
    matches!(e.kind, ExprKind::Int(_) | ExprKind::Float(_) | ExprKind::Bool(_))
}

/// Evaluates a node whose children are all literals, if it is well typed and the value is
/// representable as a literal that type-checks (floats finite and within f32 range).
fn fold(e: Expr) -> Expr {
    let children_literal = match &e.kind {
        ExprKind::Unary(_, a) => is_literal(a),
        ExprKind::Binary(_, a, b) => is_literal(a) && is_literal(b),
        ExprKind::Call(_, args) => args.iter().all(is_literal),
        _ => false,
    };
    if !children_literal {
        return e;
    }
    let spec = Spec::new("fold", 64, 1);
    if type_of(&spec, &e, ExprContext::ScoreMod).is_err() {
        return e;
    }
    match eval(&spec, &e, &Env::default()) {
        Value::Int(v) => Expr::int(v as i64),
        Value::Bool(v) => Expr::bool(v),
        Value::Float(v) if v.is_finite() && v.abs() <= f32::MAX as f64 => Expr::float(v),
        Value::Float(_) => e,
    }
}

/// Zero of the same literal kind as `like` (int 0 for ints, 0.0 otherwise).
fn zero_like(like: &Expr) -> Expr {
    match like.kind {
        ExprKind::Int(_) => Expr::int(0),
        _ => Expr::float(0.0),
    }
}

fn neg(a: Expr) -> Expr {
    match a.kind {
        ExprKind::Unary(UnOp::Neg, x) => *x,
        _ => fold(Expr::unary(UnOp::Neg, a)),
    }
}

fn add(a: Expr, b: Expr) -> Expr {
    if is_lit(&a, 0.0) {
        return b;
    }
    if is_lit(&b, 0.0) {
        return a;
    }
    match (a.kind, b.kind) {
        (ak, ExprKind::Float(v)) if v < 0.0 && !matches!(ak, ExprKind::Float(_)) => {
            fold(Expr::binary(BinOp::Sub, Expr::new(ak), Expr::float(-v)))
        }
        (ak, ExprKind::Unary(UnOp::Neg, x)) => sub(Expr::new(ak), *x),
        (ExprKind::Unary(UnOp::Neg, x), bk) => sub(Expr::new(bk), *x),
        (ak, bk) => fold(Expr::binary(BinOp::Add, Expr::new(ak), Expr::new(bk))),
    }
}

fn sub(a: Expr, b: Expr) -> Expr {
    if is_lit(&b, 0.0) {
        return a;
    }
    if is_lit(&a, 0.0) && !is_literal(&b) {
        return neg(b);
    }
    match b.kind {
        ExprKind::Float(v) if v < 0.0 && !is_literal(&a) => Expr::binary(BinOp::Add, a, Expr::float(-v)),
        ExprKind::Unary(UnOp::Neg, x) => add(a, *x),
        bk => fold(Expr::binary(BinOp::Sub, a, Expr::new(bk))),
    }
}

fn mul(a: Expr, b: Expr) -> Expr {
    if is_lit(&a, 0.0) {
        return a;
    }
    if is_lit(&b, 0.0) {
        return b;
    }
    if is_lit(&a, 1.0) {
        return b;
    }
    if is_lit(&b, 1.0) {
        return a;
    }
    if is_lit(&a, -1.0) && !is_literal(&b) {
        return neg(b);
    }
    if is_lit(&b, -1.0) && !is_literal(&a) {
        return neg(a);
    }
    match (a.kind, b.kind) {
        (ExprKind::Unary(UnOp::Neg, x), ExprKind::Unary(UnOp::Neg, y)) => mul(*x, *y),
        (ak, bk) => fold(Expr::binary(BinOp::Mul, Expr::new(ak), Expr::new(bk))),
    }
}

fn div(a: Expr, b: Expr) -> Expr {
    if is_lit(&b, 1.0) {
        return a;
    }
    if is_lit(&b, -1.0) && !is_literal(&a) {
        return neg(a);
    }
    if is_lit(&a, 0.0) && !is_literal(&b) {
        return zero_like(&a);
    }
    fold(Expr::binary(BinOp::Div, a, b))
}

fn select(c: Expr, a: Expr, b: Expr) -> Expr {
    match c.kind {
        ExprKind::Bool(true) => a,
        ExprKind::Bool(false) => b,
        _ if a == b => a,
        _ => fold(Expr::call(Func::Select, vec![c, a, b])),
    }
}

fn and_or(op: BinOp, a: Expr, b: Expr) -> Expr {
    // (absorbing, neutral) literal of the operator.
    let absorbing = op == BinOp::Or;
    let lit = |e: &Expr| match e.kind {
        ExprKind::Bool(x) => Some(x),
        _ => None,
    };
    match (lit(&a), lit(&b)) {
        (Some(x), _) if x == absorbing => a,
        (_, Some(y)) if y == absorbing => b,
        (Some(_), _) => b,
        (_, Some(_)) => a,
        _ => Expr::binary(op, a, b),
    }
}

/// Simplifies an expression bottom-up with the rules of the module docs (the meaning is
/// unchanged for finite values; int and bool rules are exact). Spans of rebuilt nodes
/// are kept where a node survives.
pub fn simplify(e: &Expr) -> Expr {
    let span = e.span;
    let out = match &e.kind {
        ExprKind::Aux { name, index } => Expr::aux(name, index.iter().map(simplify).collect()),
        ExprKind::Unary(UnOp::Neg, a) => neg(simplify(a)),
        ExprKind::Unary(UnOp::Not, a) => match simplify(a) {
            Expr { kind: ExprKind::Unary(UnOp::Not, x), .. } => *x,
            a => fold(Expr::unary(UnOp::Not, a)),
        },
        ExprKind::Binary(op, a, b) => {
            let (a, b) = (simplify(a), simplify(b));
            match op {
                BinOp::Add => add(a, b),
                BinOp::Sub => sub(a, b),
                BinOp::Mul => mul(a, b),
                BinOp::Div => div(a, b),
                BinOp::And | BinOp::Or => and_or(*op, a, b),
                _ => fold(Expr::binary(*op, a, b)),
            }
        }
        ExprKind::Call(Func::Select, args) if args.len() == 3 => {
            select(simplify(&args[0]), simplify(&args[1]), simplify(&args[2]))
        }
        ExprKind::Call(f, args) => fold(Expr::call(*f, args.iter().map(simplify).collect())),
        _ => e.clone(),
    };
    if out.span.start == 0 && out.span.end == 0 {
        out.with_span(span)
    } else {
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::AuxTensor;
    use crate::spec::{AuxDecl, AuxDim};

    fn score() -> Expr {
        Expr::var(Var::Score)
    }
    fn f(v: f64) -> Expr {
        Expr::float(v)
    }
    fn call1(func: Func, a: Expr) -> Expr {
        Expr::call(func, vec![a])
    }
    fn bin(op: BinOp, a: Expr, b: Expr) -> Expr {
        Expr::binary(op, a, b)
    }

    /// A spec with a learnable `w: float[4]` and a plain float aux `c: float[4]`.
    fn spec(m: Expr) -> Spec {
        let mut s = Spec::new("d", 64, 2);
        s.aux =
            vec![AuxDecl::float("w", vec![AuxDim::Fixed(4)], true), AuxDecl::float("c", vec![AuxDim::Fixed(4)], false)];
        s.score_mod = Some(m);
        s
    }

    fn at(spec: &Spec, e: &Expr, score: f64, w: &[f64]) -> f64 {
        let aux = [AuxTensor::float(vec![4], w.to_vec()), AuxTensor::float(vec![4], vec![0.5, -1.0, 2.0, 3.0])];
        let env = Env { score, q: 3, k: 1, h: 1, q_heads: 2, kv_heads: 2, aux: &aux, ..Env::default() };
        eval(spec, e, &env).as_float()
    }

    const W: [f64; 4] = [0.3, -0.7, 1.1, 0.25];

    /// `∂m/∂score` at `s` from `score_mod_grad`, checked to type-check.
    fn d_score(m: Expr, s: f64) -> f64 {
        let sp = spec(m);
        let g = score_mod_grad(&sp).expect("score mod");
        assert_eq!(type_of(&sp, &g.d_score, ExprContext::ScoreMod), Ok(crate::Ty::Float), "{:?}", g.d_score);
        at(&sp, &g.d_score, s, &W)
    }

    #[track_caller]
    fn close(a: f64, b: f64) {
        assert!((a - b).abs() <= 1e-12 * (1.0 + b.abs()), "{a} vs {b}");
    }

    #[test]
    fn known_derivatives_of_every_function() {
        let s = 0.7f64;
        close(d_score(call1(Func::Exp, score()), s), s.exp());
        close(d_score(call1(Func::Exp2, score()), s), s.exp2() * LN2);
        close(d_score(call1(Func::Log, score()), s), 1.0 / s);
        close(d_score(call1(Func::Log2, score()), s), 1.0 / (s * LN2));
        close(d_score(call1(Func::Sqrt, score()), s), 0.5 / s.sqrt());
        close(d_score(call1(Func::Tanh, score()), s), 1.0 - s.tanh().powi(2));
        let sig = 1.0 / (1.0 + (-s).exp());
        close(d_score(call1(Func::Sigmoid, score()), s), sig * (1.0 - sig));
        close(d_score(Expr::call(Func::Softcap, vec![score(), f(2.0)]), s), 1.0 - (s / 2.0).tanh().powi(2));
        close(d_score(Expr::unary(UnOp::Neg, score()), s), -1.0);
        close(d_score(bin(BinOp::Mul, score(), score()), s), 2.0 * s);
        close(d_score(bin(BinOp::Div, f(1.0), score()), s), -1.0 / (s * s));
        close(d_score(bin(BinOp::Sub, f(3.0), bin(BinOp::Mul, f(2.5), score())), s), -2.5);
        close(d_score(call1(Func::Abs, score()), -s), -1.0);
        close(d_score(call1(Func::Abs, score()), s), 1.0);
        // Chain rule through several levels: d/ds exp(tanh(s) * s) = exp(..) (tanh′ s + tanh).
        let m = call1(Func::Exp, bin(BinOp::Mul, call1(Func::Tanh, score()), score()));
        let t = s.tanh();
        close(d_score(m, s), (t * s).exp() * ((1.0 - t * t) * s + t));
        // softcap's cap depending on the score: d/ds s·tanh(s/s)... use c = 2 + s.
        let m = Expr::call(Func::Softcap, vec![score(), bin(BinOp::Add, f(2.0), score())]);
        let c = 2.0 + s;
        let th = (s / c).tanh();
        let exact = th + c * (1.0 - th * th) * (1.0 / c - s / (c * c));
        close(d_score(m, s), exact);
    }

    #[test]
    fn conventions_at_kinks() {
        // abs′(0) = 0.
        assert_eq!(d_score(call1(Func::Abs, score()), 0.0), 0.0);
        // min / max ties go to the first argument.
        let tie = |func| Expr::call(func, vec![score(), bin(BinOp::Mul, f(2.0), score())]);
        assert_eq!(d_score(tie(Func::Min), 0.0), 1.0);
        assert_eq!(d_score(tie(Func::Max), 0.0), 1.0);
        assert_eq!(d_score(tie(Func::Min), 1.0), 1.0);
        assert_eq!(d_score(tie(Func::Min), -1.0), 2.0);
        assert_eq!(d_score(tie(Func::Max), 1.0), 2.0);
        // select differentiates the branch taken.
        let sel =
            Expr::call(Func::Select, vec![bin(BinOp::Gt, score(), f(0.0)), bin(BinOp::Mul, f(3.0), score()), f(5.0)]);
        assert_eq!(d_score(sel.clone(), 1.0), 3.0);
        assert_eq!(d_score(sel, -1.0), 0.0);
        // int() is piecewise constant: zero, also through float() and aux indices.
        let m = bin(BinOp::Add, call1(Func::ToFloat, call1(Func::ToInt, score())), f(1.0));
        assert_eq!(score_mod_grad(&spec(m)).map(|g| g.d_score), Some(f(0.0)));
        let m = Expr::aux("c", vec![call1(Func::ToInt, score())]);
        assert_eq!(score_mod_grad(&spec(m)).map(|g| g.d_score), Some(f(0.0)));
    }

    #[test]
    fn aux_terms_one_per_distinct_learnable_read() {
        // score + w[h] * 2 + w[h] - c[0] * w[k] + float(int(w[0])): w[h] twice (one site),
        // w[k] once, w[0] only through int() (dropped), c is not learnable.
        let wh = || Expr::aux("w", vec![Expr::var(Var::H)]);
        let m = bin(
            BinOp::Add,
            bin(
                BinOp::Sub,
                bin(BinOp::Add, bin(BinOp::Add, score(), bin(BinOp::Mul, wh(), f(2.0))), wh()),
                bin(BinOp::Mul, Expr::aux("c", vec![Expr::int(0)]), Expr::aux("w", vec![Expr::var(Var::K)])),
            ),
            call1(Func::ToFloat, call1(Func::ToInt, Expr::aux("w", vec![Expr::int(0)]))),
        );
        let sp = spec(m);
        let g = score_mod_grad(&sp).expect("score mod");
        assert_eq!(g.d_score, f(1.0));
        let sites: Vec<(&str, &[Expr])> = g.aux.iter().map(|t| (t.aux.as_str(), t.index.as_slice())).collect();
        assert_eq!(sites, vec![("w", &[Expr::var(Var::H)][..]), ("w", &[Expr::var(Var::K)][..])]);
        close(at(&sp, &g.aux[0].d, 0.0, &W), 3.0);
        close(at(&sp, &g.aux[1].d, 0.0, &W), -0.5); // -c[0]
        for t in &g.aux {
            assert_eq!(type_of(&sp, &t.d, ExprContext::ScoreMod), Ok(crate::Ty::Float));
        }
        // Learned slopes: score - w[h] * float(q - k) gives d = -float(q - k).
        let qk = || call1(Func::ToFloat, bin(BinOp::Sub, Expr::var(Var::Q), Expr::var(Var::K)));
        let g = score_mod_grad(&spec(bin(BinOp::Sub, score(), bin(BinOp::Mul, wh(), qk())))).expect("score mod");
        assert_eq!(g.d_score, f(1.0));
        assert_eq!(g.aux[0].d, Expr::unary(UnOp::Neg, qk()));
        // No score mod, no gradient.
        let mut s = Spec::new("n", 64, 1);
        assert_eq!(score_mod_grad(&s), None);
        s.score_mod = Some(f(1.0));
        assert_eq!(score_mod_grad(&s), Some(ScoreModGrad { d_score: f(0.0), aux: vec![] }));
    }

    fn contains(hay: &Expr, needle: &Expr) -> bool {
        hay.any(&|n| n == needle)
    }

    #[test]
    fn derivatives_reuse_the_forward_subexpressions() {
        // The forward's node appears unchanged (even when it is not simplified itself).
        let u = bin(BinOp::Mul, score(), f(1.0)); // deliberately unsimplified
        for func in [Func::Exp, Func::Exp2, Func::Tanh, Func::Sigmoid, Func::Sqrt] {
            let m = call1(func, u.clone());
            let ds = derivative(&m, &Wrt::Score);
            assert!(contains(&ds, &m), "{func:?}: {ds:?}");
        }
        let m = Expr::call(Func::Softcap, vec![u.clone(), f(30.0)]);
        let ds = derivative(&m, &Wrt::Score);
        assert!(contains(&ds, &m), "{ds:?}");
        // 1 - t * t with t = softcap(u, 30) * (1/30).
        let t = bin(BinOp::Mul, m.clone(), f(1.0 / 30.0));
        assert_eq!(ds, bin(BinOp::Sub, f(1.0), bin(BinOp::Mul, t.clone(), t)));
        // Gemma-style softcap after a sum keeps the quotient of a division.
        let q = bin(BinOp::Div, score(), Expr::aux("w", vec![Expr::int(0)]));
        let ds =
            derivative(&bin(BinOp::Add, q.clone(), f(1.0)), &Wrt::Aux { name: "w".into(), index: vec![Expr::int(0)] });
        assert!(contains(&ds, &q), "{ds:?}");
    }

    #[test]
    fn simplification_rules() {
        let x = || score();
        let y = || Expr::var(Var::Q);
        assert_eq!(simplify(&bin(BinOp::Add, x(), f(0.0))), x());
        assert_eq!(simplify(&bin(BinOp::Sub, f(0.0), x())), Expr::unary(UnOp::Neg, x()));
        assert_eq!(simplify(&bin(BinOp::Mul, f(1.0), x())), x());
        assert_eq!(simplify(&bin(BinOp::Mul, x(), f(0.0))), f(0.0));
        assert_eq!(simplify(&bin(BinOp::Mul, x(), f(-1.0))), Expr::unary(UnOp::Neg, x()));
        assert_eq!(simplify(&bin(BinOp::Div, x(), f(1.0))), x());
        assert_eq!(simplify(&bin(BinOp::Div, f(0.0), x())), f(0.0));
        assert_eq!(simplify(&Expr::unary(UnOp::Neg, Expr::unary(UnOp::Neg, x()))), x());
        assert_eq!(simplify(&bin(BinOp::Add, x(), Expr::unary(UnOp::Neg, x()))), bin(BinOp::Sub, x(), x()));
        assert_eq!(simplify(&bin(BinOp::Sub, x(), Expr::unary(UnOp::Neg, f(2.0)))), bin(BinOp::Add, x(), f(2.0)));
        assert_eq!(simplify(&bin(BinOp::Add, x(), f(-2.0))), bin(BinOp::Sub, x(), f(2.0)));
        let q2 = || call1(Func::ToFloat, y());
        assert_eq!(simplify(&bin(BinOp::Sub, x(), Expr::unary(UnOp::Neg, q2()))), bin(BinOp::Add, x(), q2()));
        // Constant folding, floats in f64, ints with the language's semantics.
        assert_eq!(simplify(&bin(BinOp::Mul, f(2.0), bin(BinOp::Add, f(1.5), f(0.25)))), f(3.5));
        assert_eq!(simplify(&call1(Func::Exp, f(0.0))), f(1.0));
        assert_eq!(simplify(&bin(BinOp::Div, Expr::int(-7), Expr::int(2))), Expr::int(-4));
        assert_eq!(simplify(&bin(BinOp::Div, Expr::int(7), Expr::int(0))), Expr::int(0));
        assert_eq!(simplify(&bin(BinOp::Add, Expr::int(i32::MAX as i64), Expr::int(1))), Expr::int(i32::MIN as i64));
        assert_eq!(simplify(&bin(BinOp::Mul, y(), Expr::int(0))), Expr::int(0));
        assert_eq!(simplify(&bin(BinOp::Add, Expr::int(0), y())), y());
        assert_eq!(simplify(&bin(BinOp::Lt, Expr::int(1), Expr::int(2))), Expr::bool(true));
        // Folding never makes a literal that would not type-check.
        let big = bin(BinOp::Mul, f(1e30), f(1e30));
        assert_eq!(simplify(&big), big);
        let inf = bin(BinOp::Div, f(1.0), f(0.0));
        assert_eq!(simplify(&inf), inf);
        // Selects and logic.
        let sel = |c| Expr::call(Func::Select, vec![c, x(), f(2.0)]);
        assert_eq!(simplify(&sel(Expr::bool(true))), x());
        assert_eq!(simplify(&sel(bin(BinOp::Lt, Expr::int(3), Expr::int(2)))), f(2.0));
        assert_eq!(simplify(&Expr::call(Func::Select, vec![bin(BinOp::Lt, y(), y()), x(), x()])), x());
        let p = || bin(BinOp::Lt, y(), Expr::int(3));
        assert_eq!(simplify(&p().and(Expr::bool(true))), p());
        assert_eq!(simplify(&bin(BinOp::Or, p(), Expr::bool(true))), Expr::bool(true));
        assert_eq!(simplify(&Expr::unary(UnOp::Not, Expr::unary(UnOp::Not, p()))), p());
        // Children are simplified too.
        let nested = Expr::aux("w", vec![bin(BinOp::Add, y(), Expr::int(0))]);
        assert_eq!(simplify(&nested), Expr::aux("w", vec![y()]));
    }

    #[test]
    fn derivatives_of_deep_expressions_stay_small() {
        // 200 nested abs / min / select would double at each level if a branch derivative
        // were copied twice; they must stay linear-ish.
        let mut m = score();
        for i in 0..200 {
            m = match i % 3 {
                0 => call1(Func::Abs, m),
                1 => Expr::call(Func::Min, vec![m, f(4.0)]),
                _ => Expr::call(Func::Select, vec![bin(BinOp::Gt, score(), f(0.0)), m, f(1.0)]),
            };
        }
        let ds = derivative(&m, &Wrt::Score);
        let mut n = 0usize;
        ds.walk(&mut |_| n += 1);
        assert!(n < 200_000, "{n} nodes");
        let sp = spec(m);
        assert!(at(&sp, &ds, 0.5, &W).is_finite());
    }
}
