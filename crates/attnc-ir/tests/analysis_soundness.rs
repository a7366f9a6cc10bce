//! Soundness of the tile mask analysis against brute-force concrete evaluation:
//! for random masks (causal / window with random alignment, random typed predicates using
//! every operator) and random small tiles, `Full` ⇒ every element allowed, `Empty` ⇒ none,
//! and for *every* sub-expression the interval contains each concrete value and a definite
//! truth equals each concrete truth (masks also compare elements of a float aux tensor,
//! which the analysis leaves Unknown). A second property does the same for arbitrary
//! (ill-typed) expression trees.

use attnc_ir::analysis::{classify, int_range, truth, IntRange, TileClass, TileQuery, Tri};
use attnc_ir::check::{type_of, ExprContext};
use attnc_ir::eval::{eval, AuxTensor, Env, Value};
use attnc_ir::{Align, AuxDecl, AuxDim, BinOp, Expr, Func, ParamDecl, Spec, Ty, UnOp, Var, Window};
use proptest::prelude::*;

const INT_VARS: [Var; 9] =
    [Var::Q, Var::K, Var::B, Var::H, Var::Hkv, Var::SeqlenQ, Var::SeqlenK, Var::QHeads, Var::KvHeads];

fn base_spec(q_heads: u32, kv_heads: u32) -> Spec {
    let mut s = Spec::new("prop", 64, q_heads);
    s.kv_heads = kv_heads;
    s.params = vec![
        ParamDecl { name: "p0".into(), ty: Ty::Int },
        ParamDecl { name: "fp".into(), ty: Ty::Float },
        ParamDecl { name: "p1".into(), ty: Ty::Int },
    ];
    s.aux = vec![
        AuxDecl::int("doc", vec![AuxDim::Batch, AuxDim::MaxSeqlenK]),
        AuxDecl::int("tbl", vec![AuxDim::Fixed(5)]),
        AuxDecl::float("bias", vec![AuxDim::QHeads, AuxDim::Fixed(3)], true),
    ];
    s
}

fn int_leaf() -> impl Strategy<Value = Expr> {
    prop_oneof![
        4 => (-70i64..70).prop_map(Expr::int),
        1 => prop::sample::select(vec![
            i32::MAX as i64, i32::MIN as i64, i32::MAX as i64 - 3, i32::MIN as i64 + 1,
            1 << 20, -(1 << 20), 1 << 16, 46341, 0, 1, -1, 64,
        ])
        .prop_map(Expr::int),
        6 => prop::sample::select(INT_VARS.to_vec()).prop_map(Expr::var),
        2 => prop::sample::select(vec!["p0", "p1"]).prop_map(Expr::param),
    ]
}

fn arith_op() -> impl Strategy<Value = BinOp> {
    prop::sample::select(vec![BinOp::Add, BinOp::Sub, BinOp::Mul, BinOp::Div, BinOp::Rem])
}
fn cmp_op() -> impl Strategy<Value = BinOp> {
    prop::sample::select(vec![BinOp::Lt, BinOp::Le, BinOp::Gt, BinOp::Ge, BinOp::Eq, BinOp::Ne])
}

fn float_of(e: Expr) -> Expr {
    Expr::call(Func::ToFloat, vec![e])
}

/// Float expressions built on int ones (never analyzed, but must not break soundness).
/// With `aux`, they may read the float aux tensor `bias` (a mask may only compare those
/// values, so only comparisons get them).
fn float_expr(int: BoxedStrategy<Expr>, aux: bool) -> BoxedStrategy<Expr> {
    let plain = prop_oneof![
        int.clone().prop_map(float_of),
        Just(Expr::param("fp")),
        (-4.0f64..4.0).prop_map(Expr::float),
        int.clone().prop_map(|i| Expr::binary(BinOp::Mul, float_of(i), Expr::param("fp"))),
        int.clone().prop_map(|i| Expr::call(Func::Tanh, vec![float_of(i)])),
    ];
    if !aux {
        return plain.boxed();
    }
    let read = (int.clone(), int.clone()).prop_map(|(i, j)| Expr::aux("bias", vec![i, j]));
    prop_oneof![
        3 => plain,
        2 => read.clone(),
        1 => (read, int).prop_map(|(r, i)| Expr::binary(BinOp::Mul, r, float_of(i))),
    ]
    .boxed()
}

fn int_expr() -> BoxedStrategy<Expr> {
    int_leaf()
        .prop_recursive(4, 40, 3, |inner| {
            let cond = (cmp_op(), inner.clone(), inner.clone()).prop_map(|(op, a, b)| Expr::binary(op, a, b));
            prop_oneof![
                6 => (arith_op(), inner.clone(), inner.clone()).prop_map(|(op, a, b)| Expr::binary(op, a, b)),
                1 => inner.clone().prop_map(|a| Expr::unary(UnOp::Neg, a)),
                2 => (prop::sample::select(vec![Func::Min, Func::Max]), inner.clone(), inner.clone())
                    .prop_map(|(f, a, b)| Expr::call(f, vec![a, b])),
                1 => inner.clone().prop_map(|a| Expr::call(Func::Abs, vec![a])),
                2 => (cond, inner.clone(), inner.clone()).prop_map(|(c, a, b)| Expr::call(Func::Select, vec![c, a, b])),
                1 => (inner.clone(), inner.clone()).prop_map(|(i, j)| Expr::aux("doc", vec![i, j])),
                1 => inner.clone().prop_map(|i| Expr::aux("tbl", vec![i])),
                1 => float_expr(inner.clone(), false).prop_map(|f| Expr::call(Func::ToInt, vec![f])),
            ]
        })
        .boxed()
}

fn bool_expr() -> BoxedStrategy<Expr> {
    let leaf = prop_oneof![
        8 => (cmp_op(), int_expr(), int_expr()).prop_map(|(op, a, b)| Expr::binary(op, a, b)),
        1 => any::<bool>().prop_map(Expr::bool),
        2 => (cmp_op(), float_expr(int_expr(), true), float_expr(int_expr(), true))
            .prop_map(|(op, a, b)| Expr::binary(op, a, b)),
    ];
    leaf.prop_recursive(3, 12, 3, |inner| {
        prop_oneof![
            (inner.clone(), inner.clone()).prop_map(|(a, b)| Expr::binary(BinOp::And, a, b)),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| Expr::binary(BinOp::Or, a, b)),
            inner.clone().prop_map(|a| Expr::unary(UnOp::Not, a)),
            (prop::sample::select(vec![BinOp::Eq, BinOp::Ne]), inner.clone(), inner.clone())
                .prop_map(|(op, a, b)| Expr::binary(op, a, b)),
            (inner.clone(), inner.clone(), inner.clone()).prop_map(|(c, a, b)| Expr::call(Func::Select, vec![c, a, b])),
        ]
    })
    .boxed()
}

fn align() -> impl Strategy<Value = Align> {
    prop_oneof![Just(Align::TopLeft), Just(Align::BottomRight)]
}

#[derive(Clone, Debug)]
struct Case {
    spec: Spec,
    /// (b0, nb): b in b0..b0+nb
    b: (i64, i64),
    h: (i64, i64),
    q: (i64, i64),
    k: (i64, i64),
    seqlen_q: (i64, i64),
    seqlen_k: (i64, i64),
    p0: i32,
    p1: i32,
    fp: f64,
    aux_data: Vec<i32>,
}

fn case(pred: BoxedStrategy<Option<Expr>>) -> impl Strategy<Value = Case> {
    let heads = prop::sample::select(vec![(1u32, 1u32), (4, 2), (6, 3), (4, 1), (8, 8), (6, 2)]);
    let window = (prop::option::of(0u64..24), prop::option::of(0u64..24), align())
        .prop_map(|(left, right, align)| Window { left, right, align });
    let mask = (prop::option::of(align()), prop::option::of(window), pred);
    let geometry = (
        (0i64..3, 1i64..3),
        (0i64..8, 1i64..4),
        (0i64..48, 1i64..9),
        (0i64..48, 1i64..9),
        (1i64..40, 1i64..3),
        (1i64..40, 1i64..3),
    );
    let values = (-40i32..40, -40i32..40, -3.0f64..3.0, prop::collection::vec(-4i32..6, 256));
    (heads, mask, geometry, values).prop_map(
        |((qh, kvh), (causal, window, predicate), (b, h, q, k, sq, sk), (p0, p1, fp, aux_data))| {
            let mut spec = base_spec(qh, kvh);
            spec.mask.causal = causal;
            spec.mask.window = window;
            spec.mask.predicate = predicate;
            let h = (h.0.min(qh as i64 - 1), h.1.min(qh as i64 - h.0.min(qh as i64 - 1)));
            Case { spec, b, h, q, k, seqlen_q: sq, seqlen_k: sk, p0, p1, fp, aux_data }
        },
    )
}

fn range(r: (i64, i64)) -> IntRange {
    IntRange::span(r.0, r.1)
}

fn query(c: &Case) -> TileQuery {
    let g = (c.spec.q_heads / c.spec.kv_heads) as i64;
    let h = range(c.h);
    TileQuery {
        b: range(c.b),
        h,
        hkv: IntRange::new(h.lo / g, h.hi / g),
        q: range(c.q),
        k: range(c.k),
        seqlen_q: range(c.seqlen_q),
        seqlen_k: range(c.seqlen_k),
        q_heads: c.spec.q_heads as i32,
        kv_heads: c.spec.kv_heads as i32,
        params: vec![Some(IntRange::point(c.p0 as i64)), None, Some(IntRange::point(c.p1 as i64))],
    }
}

fn aux(c: &Case) -> Vec<AuxTensor> {
    let nb = (c.b.0 + c.b.1) as usize;
    let maxk = (c.seqlen_k.0 + c.seqlen_k.1 - 1) as usize;
    let n = nb * maxk;
    let data = (0..n).map(|i| c.aux_data[i % c.aux_data.len()]).collect();
    let qh = c.spec.q_heads as usize;
    let bias = (0..qh * 3).map(|i| c.aux_data[i % c.aux_data.len()] as f64 * 0.25 - 0.3).collect();
    vec![
        AuxTensor::int(vec![nb, maxk], data),
        AuxTensor::int(vec![5], c.aux_data[..5].to_vec()),
        AuxTensor::float(vec![qh, 3], bias),
    ]
}

/// Calls `f` with the environment of every element (and every seqlen) of the case.
fn for_each_env(c: &Case, params: &[Value], aux: &[AuxTensor], mut f: impl FnMut(&Env)) {
    let g = (c.spec.q_heads / c.spec.kv_heads) as i32;
    let span = |r: (i64, i64)| (r.0 as i32)..(r.0 + r.1) as i32;
    for b in span(c.b) {
        for h in span(c.h) {
            for sq in span(c.seqlen_q) {
                for sk in span(c.seqlen_k) {
                    for q in span(c.q) {
                        for k in span(c.k) {
                            let env = Env {
                                b,
                                h,
                                hkv: h / g,
                                q,
                                k,
                                score: 0.0,
                                seqlen_q: sq,
                                seqlen_k: sk,
                                q_heads: c.spec.q_heads as i32,
                                kv_heads: c.spec.kv_heads as i32,
                                params,
                                aux,
                            };
                            f(&env);
                        }
                    }
                }
            }
        }
    }
}

fn subexprs(e: &Expr) -> Vec<&Expr> {
    let mut v = Vec::new();
    e.walk(&mut |n| v.push(n));
    v
}

/// Checks the tile class and every node of the predicate against every element.
/// With `typed`, nodes are checked according to their static type; otherwise according
/// to what the analysis claims (a non-TOP interval claims an int, a definite truth a bool).
fn check_case(c: &Case, typed: bool) -> Result<(), TestCaseError> {
    let spec = &c.spec;
    let q = query(c);
    let class = classify(spec, &q);
    let Some(pred) = spec.mask.to_predicate() else {
        prop_assert_eq!(class, TileClass::Full);
        return Ok(());
    };
    if typed {
        prop_assert_eq!(type_of(spec, &pred, ExprContext::Mask), Ok(Ty::Bool));
    }
    let params = [Value::Int(c.p0), Value::Float(c.fp), Value::Int(c.p1)];
    let aux = aux(c);
    let nodes: Vec<(&Expr, IntRange, Tri, Option<Ty>)> = subexprs(&pred)
        .into_iter()
        .map(|n| {
            let ty = if typed { type_of(spec, n, ExprContext::Mask).ok() } else { None };
            (n, int_range(spec, n, &q), truth(spec, n, &q), ty)
        })
        .collect();
    let mut err: Option<String> = None;
    for_each_env(c, &params, &aux, |env| {
        if err.is_some() {
            return;
        }
        let allowed = eval(spec, &pred, env).as_bool();
        if (class == TileClass::Full && !allowed) || (class == TileClass::Empty && allowed) {
            err = Some(format!("tile classified {class:?} but element {env:?} is {allowed}"));
            return;
        }
        for (n, r, t, ty) in &nodes {
            let v = eval(spec, n, env);
            let claims_int = if typed { *ty == Some(Ty::Int) } else { *r != IntRange::TOP };
            if claims_int {
                match v {
                    Value::Int(x) if r.contains(x as i64) => {}
                    _ => err = Some(format!("{n:?}: {v:?} not in {r:?} at {env:?}")),
                }
            }
            if *t != Tri::Unknown {
                match v {
                    Value::Bool(x) if Tri::from_bool(x) == *t => {}
                    _ => err = Some(format!("{n:?}: {v:?} but analysis says {t:?} at {env:?}")),
                }
            }
            if err.is_some() {
                return;
            }
        }
    });
    match err {
        Some(e) => Err(TestCaseError::fail(e)),
        None => Ok(()),
    }
}

/// Any expression tree, with no regard for types.
fn untyped_expr() -> BoxedStrategy<Expr> {
    let leaf = prop_oneof![
        (-10i64..10).prop_map(Expr::int),
        Just(Expr::int(i32::MIN as i64)),
        Just(Expr::int(1i64 << 40)),
        (-2.0f64..2.0).prop_map(Expr::float),
        any::<bool>().prop_map(Expr::bool),
        prop::sample::select(Var::ALL.to_vec()).prop_map(Expr::var),
        prop::sample::select(vec!["p0", "p1", "fp", "nope"]).prop_map(Expr::param),
    ];
    leaf.prop_recursive(4, 32, 3, |inner| {
        let any_op = prop::sample::select(vec![
            BinOp::Add,
            BinOp::Sub,
            BinOp::Mul,
            BinOp::Div,
            BinOp::Rem,
            BinOp::Lt,
            BinOp::Le,
            BinOp::Gt,
            BinOp::Ge,
            BinOp::Eq,
            BinOp::Ne,
            BinOp::And,
            BinOp::Or,
        ]);
        prop_oneof![
            (any_op, inner.clone(), inner.clone()).prop_map(|(op, a, b)| Expr::binary(op, a, b)),
            (prop::sample::select(vec![UnOp::Neg, UnOp::Not]), inner.clone()).prop_map(|(op, a)| Expr::unary(op, a)),
            (prop::sample::select(Func::ALL.to_vec()), prop::collection::vec(inner.clone(), 0..4))
                .prop_map(|(f, args)| Expr::call(f, args)),
            (prop::sample::select(vec!["doc", "tbl", "bias", "zzz"]), prop::collection::vec(inner.clone(), 0..3))
                .prop_map(|(name, idx)| Expr::aux(name, idx)),
        ]
    })
    .boxed()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 600, ..ProptestConfig::default() })]

    #[test]
    fn typed_masks_are_classified_soundly(c in case(prop::option::of(bool_expr()).boxed())) {
        check_case(&c, true)?;
    }

    #[test]
    fn causal_and_window_alone_are_sound(c in case(Just(None).boxed())) {
        check_case(&c, true)?;
    }

    #[test]
    fn arbitrary_trees_never_panic_and_stay_sound(c in case(untyped_expr().prop_map(Some).boxed())) {
        check_case(&c, false)?;
    }
}
