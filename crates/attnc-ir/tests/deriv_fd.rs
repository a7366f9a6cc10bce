//! Symbolic derivatives against central finite differences in f64.
//!
//! Random well-typed float expressions over `score` and two reads of a learnable float
//! aux tensor `w` (`w[1]` and `w[k]`, which hit the same element when `k == 1`), built
//! from every operator and function the language has (`+ - * /`, unary minus, `min`,
//! `max`, `abs`, `select`, `exp`, `exp2`, `log`, `log2`, `sqrt`, `tanh`, `sigmoid`,
//! `softcap`, `float(int)`, `float(int(x))`). At random points the derivative
//! `score_mod_grad` gives (evaluated with `eval`) must match the central difference,
//! for `score` and for every element of `w` (the sum of the terms whose clamped index is
//! that element).
//!
//! Points near kinks, jumps or poles, and where values are not finite, are skipped: a
//! point counts only if no discrete decision of the expression (an `int(...)` value, a
//! comparison, the operand `min`/`max` pick, the sign `abs` sees) changes within the
//! finite-difference window, the central differences with steps `h` and `h/10` agree,
//! and everything is finite. The test
//! asserts that most points did count, so the property cannot pass vacuously.

use attnc_ir::check::{type_of, ExprContext};
use attnc_ir::eval::{eval, AuxTensor, Env, Value};
use attnc_ir::{score_mod_grad, AuxDecl, AuxDim, BinOp, Expr, ExprKind, Func, Spec, Ty, UnOp, Var};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use std::cell::Cell;

fn score() -> Expr {
    Expr::var(Var::Score)
}

fn leaf() -> impl Strategy<Value = Expr> {
    prop_oneof![
        5 => Just(score()),
        2 => Just(Expr::aux("w", vec![Expr::int(1)])),
        1 => Just(Expr::aux("w", vec![Expr::var(Var::K)])),
        2 => (-3.0f64..3.0).prop_map(Expr::float),
        1 => Just(Expr::call(Func::ToFloat, vec![Expr::binary(BinOp::Sub, Expr::var(Var::Q), Expr::var(Var::K))])),
        // A non-learnable float aux: a constant.
        1 => Just(Expr::aux("c", vec![Expr::var(Var::H)])),
    ]
}

fn float_expr() -> BoxedStrategy<Expr> {
    leaf()
        .prop_recursive(5, 24, 3, |inner| {
            let unary = prop::sample::select(vec![
                Func::Exp,
                Func::Exp2,
                Func::Log,
                Func::Log2,
                Func::Sqrt,
                Func::Tanh,
                Func::Sigmoid,
                Func::Abs,
            ]);
            let cmp = prop::sample::select(vec![BinOp::Lt, BinOp::Le, BinOp::Gt, BinOp::Ge]);
            prop_oneof![
                4 => (prop::sample::select(vec![BinOp::Add, BinOp::Sub, BinOp::Mul, BinOp::Div]), inner.clone(), inner.clone())
                    .prop_map(|(op, a, b)| Expr::binary(op, a, b)),
                1 => inner.clone().prop_map(|a| Expr::unary(UnOp::Neg, a)),
                3 => (unary, inner.clone()).prop_map(|(f, a)| Expr::call(f, vec![a])),
                1 => (prop::sample::select(vec![Func::Min, Func::Max]), inner.clone(), inner.clone())
                    .prop_map(|(f, a, b)| Expr::call(f, vec![a, b])),
                1 => (cmp, inner.clone(), inner.clone(), inner.clone(), inner.clone())
                    .prop_map(|(op, a, b, x, y)| Expr::call(Func::Select, vec![Expr::binary(op, a, b), x, y])),
                1 => (inner.clone(), prop_oneof![(1.0f64..50.0).prop_map(Expr::float), (-20.0f64..-1.0).prop_map(Expr::float)])
                    .prop_map(|(a, c)| Expr::call(Func::Softcap, vec![a, c])),
                1 => (inner.clone(), inner.clone()).prop_map(|(a, c)| Expr::call(Func::Softcap, vec![a, c])),
                1 => inner.clone().prop_map(|a| Expr::call(Func::ToFloat, vec![Expr::call(Func::ToInt, vec![a])])),
            ]
        })
        .boxed()
}

fn spec(m: Expr) -> Spec {
    let mut s = Spec::new("fd", 64, 2);
    s.aux = vec![AuxDecl::float("w", vec![AuxDim::Fixed(3)], true), AuxDecl::float("c", vec![AuxDim::QHeads], false)];
    s.score_mod = Some(m);
    s
}

#[derive(Clone, Debug)]
struct Point {
    score: f64,
    w: [f64; 3],
    k: i32,
}

fn point() -> impl Strategy<Value = Point> {
    (-3.0f64..3.0, [-2.0f64..2.0, -2.0f64..2.0, -2.0f64..2.0], 0i32..3).prop_map(|(score, w, k)| Point { score, w, k })
}

fn value(spec: &Spec, e: &Expr, score: f64, w: &[f64; 3], k: i32) -> f64 {
    let aux = [AuxTensor::float(vec![3], w.to_vec()), AuxTensor::float(vec![2], vec![0.75, -1.25])];
    let env = Env {
        score,
        q: 4,
        k,
        h: 1,
        hkv: 1,
        q_heads: 2,
        kv_heads: 2,
        seqlen_q: 8,
        seqlen_k: 8,
        aux: &aux,
        ..Env::default()
    };
    eval(spec, e, &env).as_float()
}

/// Every discrete decision `m` takes: each `int(...)` result, comparison, which operand
/// `min`/`max` pick and the sign `abs` sees. Where none changes, `m` is a smooth
/// composition of smooth functions.
fn decisions(spec: &Spec, m: &Expr, score: f64, w: &[f64; 3], k: i32) -> Vec<Value> {
    let aux = [AuxTensor::float(vec![3], w.to_vec()), AuxTensor::float(vec![2], vec![0.75, -1.25])];
    let env = Env {
        score,
        q: 4,
        k,
        h: 1,
        hkv: 1,
        q_heads: 2,
        kv_heads: 2,
        seqlen_q: 8,
        seqlen_k: 8,
        aux: &aux,
        ..Env::default()
    };
    let mut out = Vec::new();
    m.walk(&mut |n| match &n.kind {
        ExprKind::Call(Func::ToInt, _) => out.push(eval(spec, n, &env)),
        ExprKind::Binary(op, _, _) if op.is_comparison() => out.push(eval(spec, n, &env)),
        ExprKind::Call(Func::Min | Func::Max, a) if a.len() == 2 => {
            out.push(eval(spec, &Expr::binary(BinOp::Lt, a[0].clone(), a[1].clone()), &env));
            out.push(eval(spec, &Expr::binary(BinOp::Gt, a[0].clone(), a[1].clone()), &env));
        }
        ExprKind::Call(Func::Abs, a) if a.len() == 1 => {
            out.push(eval(spec, &Expr::binary(BinOp::Lt, a[0].clone(), Expr::float(0.0)), &env));
            out.push(eval(spec, &Expr::binary(BinOp::Gt, a[0].clone(), Expr::float(0.0)), &env));
        }
        _ => {}
    });
    out
}

/// Central differences of `f` at `x` with steps `h` and `h/10`: the finer one, if no
/// decision changes within `x ± h`, both agree and every value is finite.
fn central(f: &dyn Fn(f64) -> f64, decide: &dyn Fn(f64) -> Vec<Value>, x: f64) -> Option<(f64, f64)> {
    let h = 1e-3 * (1.0 + x.abs());
    let here = decide(x);
    if [x + h, x - h, x + h / 10.0, x - h / 10.0].iter().any(|y| decide(*y) != here) {
        return None;
    }
    let (a, b) = (f(x + h), f(x - h));
    let (c, d) = (f(x + h / 10.0), f(x - h / 10.0));
    if ![a, b, c, d].iter().all(|v| v.is_finite()) {
        return None;
    }
    let coarse = (a - b) / (2.0 * h);
    let fine = (c - d) / (0.2 * h);
    let scale = [a, b, c, d].iter().fold(0.0f64, |m, v| m.max(v.abs()));
    // Round-off of the fine difference, plus a relative agreement bound.
    let noise = 8.0 * f64::EPSILON * scale / (0.2 * h);
    if (coarse - fine).abs() > 1e-4 * (1.0 + fine.abs()) + 100.0 * noise {
        return None;
    }
    Some((fine, noise))
}

#[test]
fn derivatives_match_central_differences() {
    let cases = std::env::var("ATTNC_FUZZ_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(1500u32);
    let mut runner = TestRunner::new(Config { cases, ..Config::default() });
    let (checked, skipped) = (Cell::new(0usize), Cell::new(0usize));
    let strategy = (float_expr(), prop::collection::vec(point(), 4));
    let result = runner.run(&strategy, |(m, points)| {
        let sp = spec(m.clone());
        prop_assert_eq!(type_of(&sp, &m, ExprContext::ScoreMod), Ok(Ty::Float));
        let g = score_mod_grad(&sp).ok_or_else(|| TestCaseError::fail("no gradient"))?;
        prop_assert_eq!(type_of(&sp, &g.d_score, ExprContext::ScoreMod), Ok(Ty::Float), "{:?}", g.d_score);
        for t in &g.aux {
            prop_assert_eq!(t.aux.as_str(), "w");
            prop_assert_eq!(type_of(&sp, &t.d, ExprContext::ScoreMod), Ok(Ty::Float), "{:?}", t.d);
        }
        for p in &points {
            let f_score = |s: f64| value(&sp, &m, s, &p.w, p.k);
            let mut ok = true;
            let mut compare = |what: &str, analytic: f64, fd: Option<(f64, f64)>| -> Result<(), TestCaseError> {
                match fd {
                    Some((fd, noise)) if analytic.is_finite() => {
                        let tol = 1e-5 * (1.0 + fd.abs().max(analytic.abs())) + 100.0 * noise;
                        prop_assert!(
                            (analytic - fd).abs() <= tol,
                            "{}: analytic {} vs finite difference {} at {:?}\nm = {:?}",
                            what,
                            analytic,
                            fd,
                            p,
                            m
                        );
                    }
                    _ => ok = false,
                }
                Ok(())
            };
            let decide_score = |s: f64| decisions(&sp, &m, s, &p.w, p.k);
            let fd = central(&f_score, &decide_score, p.score);
            compare("d/dscore", value(&sp, &g.d_score, p.score, &p.w, p.k), fd)?;
            for e in 0..3 {
                // Sum of the terms whose (clamped) index reads element e.
                let analytic: f64 = g
                    .aux
                    .iter()
                    .filter(|t| {
                        let i = value(&sp, &Expr::call(Func::ToFloat, t.index.clone()), p.score, &p.w, p.k);
                        (i as i64).clamp(0, 2) == e as i64
                    })
                    .map(|t| value(&sp, &t.d, p.score, &p.w, p.k))
                    .sum();
                let f_w = |x: f64| {
                    let mut w = p.w;
                    w[e] = x;
                    value(&sp, &m, p.score, &w, p.k)
                };
                let decide_w = |x: f64| {
                    let mut w = p.w;
                    w[e] = x;
                    decisions(&sp, &m, p.score, &w, p.k)
                };
                compare(&format!("d/dw[{e}]"), analytic, central(&f_w, &decide_w, p.w[e]))?;
            }
            if ok {
                checked.set(checked.get() + 1);
            } else {
                skipped.set(skipped.get() + 1);
            }
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let (c, s) = (checked.get(), skipped.get());
    assert!(c >= (c + s) / 2, "only {c} of {} points were smooth enough to check", c + s);
    eprintln!("derivatives_match_central_differences: {c} points checked, {s} skipped");
}
