//! The f64 reference backward: against central finite differences of the forward (every
//! gradient it returns: dQ, dK, dV, sinks, learnable aux), on odd sizes, seqlen_q ≠
//! seqlen_k, GQA/MQA, several sequences, and score modifications through every smooth
//! function; then its special cases (masked and −∞ keys, empty and NaN rows), its input
//! validation and its determinism. Every `.attn` example is checked the same way in the
//! DSL crate's tests (`attnc-dsl/src/tests/backward.rs`).

use attnc_ir::gradcheck::{check_gradients, loss, GradCheckOptions};
use attnc_ir::reference::{
    random_inputs, reference_backward, reference_backward_with_output, reference_forward, rel_l2, round_bf16, Inputs,
    ReferenceError, Rng,
};
use attnc_ir::{Align, AuxDecl, AuxDim, BinOp, Expr, Func, ParamDecl, Scale, Spec, Ty, UnOp, Var, Window};

fn v(x: Var) -> Expr {
    Expr::var(x)
}
fn f(x: f64) -> Expr {
    Expr::float(x)
}
fn bin(op: BinOp, a: Expr, b: Expr) -> Expr {
    Expr::binary(op, a, b)
}
fn call(func: Func, args: Vec<Expr>) -> Expr {
    Expr::call(func, args)
}
fn qk() -> Expr {
    bin(BinOp::Sub, v(Var::Q), v(Var::K))
}

/// A small spec (head dims below the kernels' sizes are fine for the reference).
fn small(q_heads: u32, kv_heads: u32) -> Spec {
    let mut s = Spec::new("bwd", 64, q_heads);
    s.kv_heads = kv_heads;
    s.head_dim_qk = 5;
    s.head_dim_v = 3;
    s
}

fn d_out(spec: &Spec, inputs: &Inputs, seed: u64) -> Vec<Vec<f64>> {
    let mut rng = Rng::new(seed);
    let n = (spec.q_heads * spec.head_dim_v) as usize;
    inputs.seqs.iter().map(|s| (0..s.seqlen_q * n).map(|_| rng.normal()).collect()).collect()
}

#[track_caller]
fn gradcheck(spec: &Spec, seqlens: &[(usize, usize)], seed: u64) {
    let inputs = random_inputs(spec, seqlens, seed);
    let dout = d_out(spec, &inputs, seed + 1);
    let opts = GradCheckOptions { directions: 2, elements: 4, seed, ..GradCheckOptions::default() };
    let r = check_gradients(spec, &inputs, &dout, &opts).expect("valid inputs");
    assert!(r.comparisons > 0);
    assert!(
        r.failures.is_empty(),
        "{}: {} of {} comparisons failed:\n{}",
        spec.name,
        r.failures.len(),
        r.comparisons,
        r.failures.join("\n")
    );
}

const SEQLENS: &[(usize, usize)] = &[(5, 7), (3, 4), (6, 2)];

#[test]
fn plain_mha_gqa_and_mqa() {
    gradcheck(&small(3, 3), SEQLENS, 1);
    gradcheck(&small(6, 2), SEQLENS, 2);
    gradcheck(&small(4, 1), SEQLENS, 3);
    let mut s = small(2, 2);
    s.scale = Scale::Value(0.7);
    gradcheck(&s, &[(9, 9)], 4);
}

#[test]
fn masks_and_sinks() {
    let mut s = small(6, 2);
    s.sinks = true;
    s.mask.causal = Some(Align::BottomRight);
    gradcheck(&s, SEQLENS, 10);
    s.mask.causal = Some(Align::TopLeft);
    s.mask.window = Some(Window { left: Some(2), right: None, align: Align::TopLeft });
    gradcheck(&s, SEQLENS, 11);
    // A param and an int aux in the mask (no gradient, but they pick the keys).
    let mut s = small(4, 2);
    s.params = vec![ParamDecl { name: "prefix".into(), ty: Ty::Int }];
    s.aux = vec![AuxDecl::int("doc", vec![AuxDim::Batch, AuxDim::MaxSeqlenK])];
    s.mask.predicate = Some(bin(
        BinOp::Or,
        bin(BinOp::Lt, v(Var::K), Expr::param("prefix")),
        bin(BinOp::Eq, Expr::aux("doc", vec![v(Var::B), v(Var::Q)]), Expr::aux("doc", vec![v(Var::B), v(Var::K)])),
    ));
    gradcheck(&s, &[(7, 7), (4, 4)], 12);
}

#[test]
fn score_modifications_through_every_smooth_function() {
    let score = || v(Var::Score);
    let mods = [
        call(Func::Softcap, vec![score(), f(2.0)]),
        bin(BinOp::Mul, f(3.0), call(Func::Tanh, vec![bin(BinOp::Div, score(), f(3.0))])),
        bin(BinOp::Add, score(), call(Func::Sigmoid, vec![score()])),
        bin(BinOp::Mul, score(), call(Func::Exp, vec![bin(BinOp::Mul, f(-0.1), score())])),
        bin(BinOp::Sub, score(), call(Func::Exp2, vec![bin(BinOp::Mul, f(0.3), score())])),
        call(Func::Log, vec![bin(BinOp::Add, call(Func::Exp, vec![score()]), f(1.0))]),
        bin(BinOp::Mul, f(2.0), call(Func::Log2, vec![bin(BinOp::Add, bin(BinOp::Mul, score(), score()), f(1.0))])),
        call(Func::Sqrt, vec![bin(BinOp::Add, bin(BinOp::Mul, score(), score()), f(0.5))]),
        bin(BinOp::Div, score(), bin(BinOp::Add, f(1.5), call(Func::Sigmoid, vec![score()]))),
        Expr::unary(UnOp::Neg, call(Func::Softcap, vec![Expr::unary(UnOp::Neg, score()), f(5.0)])),
        // ALiBi-style: int distances only shift the logits.
        bin(BinOp::Sub, score(), bin(BinOp::Mul, f(0.25), call(Func::ToFloat, vec![call(Func::Abs, vec![qk()])]))),
    ];
    for (n, m) in mods.into_iter().enumerate() {
        let mut s = small(4, 2);
        s.sinks = n % 2 == 0;
        s.mask.causal = (n % 3 == 0).then_some(Align::TopLeft);
        s.score_mod = Some(m);
        s.name = format!("mod{n}");
        gradcheck(&s, SEQLENS, 100 + n as u64);
    }
}

#[test]
fn learnable_aux_tensors() {
    let score = || v(Var::Score);
    // T5-style bias table read at two sites (bias[h, 0] and bias[h, min(|q-k|, 3)] hit the
    // same element on the diagonal), learned ALiBi slopes, a non-learnable float aux and a
    // learnable one that scales the score through exp.
    let mut s = small(4, 2);
    s.aux = vec![
        AuxDecl::float("bias", vec![AuxDim::QHeads, AuxDim::Fixed(4)], true),
        AuxDecl::float("slopes", vec![AuxDim::QHeads], true),
        AuxDecl::float("fixed", vec![AuxDim::KvHeads], false),
        AuxDecl::float("temp", vec![AuxDim::Fixed(1)], true),
    ];
    let bias_d = Expr::aux("bias", vec![v(Var::H), call(Func::Min, vec![call(Func::Abs, vec![qk()]), Expr::int(3)])]);
    let bias_0 = Expr::aux("bias", vec![v(Var::H), Expr::int(0)]);
    let slope = bin(BinOp::Mul, Expr::aux("slopes", vec![v(Var::H)]), call(Func::ToFloat, vec![qk()]));
    let scaled = bin(BinOp::Mul, score(), call(Func::Exp, vec![Expr::aux("temp", vec![Expr::int(0)])]));
    let m = bin(
        BinOp::Add,
        bin(BinOp::Sub, bin(BinOp::Add, scaled, bin(BinOp::Mul, f(0.5), bias_0)), slope),
        bin(BinOp::Add, bias_d, Expr::aux("fixed", vec![v(Var::Hkv)])),
    );
    s.score_mod = Some(m);
    s.mask.causal = Some(Align::BottomRight);
    s.sinks = true;
    gradcheck(&s, SEQLENS, 200);
    let inputs = random_inputs(&s, SEQLENS, 200);
    let g = reference_backward(&s, &inputs, &d_out(&s, &inputs, 201)).expect("valid");
    assert_eq!(g.daux.iter().map(Option::is_some).collect::<Vec<_>>(), vec![true, true, false, true]);
    assert_eq!(g.daux[0].as_ref().map(Vec::len), Some(16));
    assert!(g.daux[0].as_ref().is_some_and(|d| d.iter().all(|x| x.is_finite() && *x != 0.0)));

    // A learnable cap: softcap(score, 2 + exp(cap[h])).
    let mut s = small(2, 1);
    s.aux = vec![AuxDecl::float("cap", vec![AuxDim::QHeads], true)];
    s.score_mod = Some(call(
        Func::Softcap,
        vec![score(), bin(BinOp::Add, f(2.0), call(Func::Exp, vec![Expr::aux("cap", vec![v(Var::H)])]))],
    ));
    gradcheck(&s, SEQLENS, 210);

    // Learnable but unused by the score (or no score at all): a zero gradient, present.
    let mut s = small(2, 2);
    s.aux = vec![AuxDecl::float("w", vec![AuxDim::Fixed(3)], true)];
    s.mask.predicate = Some(bin(BinOp::Gt, Expr::aux("w", vec![v(Var::K)]), f(-10.0)));
    let inputs = random_inputs(&s, SEQLENS, 220);
    let g = reference_backward(&s, &inputs, &d_out(&s, &inputs, 221)).expect("valid");
    assert_eq!(g.daux, vec![Some(vec![0.0; 3])]);
}

#[test]
fn masked_minus_infinity_empty_and_nan_rows() {
    let score = || v(Var::Score);
    // Key 1 gets a logit of −∞ (log 0), so it behaves like a masked key; query 2 sees no
    // key at all (and there is no sink); query 3 of sequence 0 gets a NaN logit.
    let mut s = small(2, 1);
    s.mask.predicate = Some(bin(BinOp::Ne, v(Var::Q), Expr::int(2)));
    let minus_inf = call(Func::Log, vec![f(0.0)]);
    let nan = call(Func::Sqrt, vec![f(-1.0)]);
    let is = |x: Var, n: i64| bin(BinOp::Eq, v(x), Expr::int(n));
    s.score_mod = Some(call(
        Func::Select,
        vec![
            is(Var::K, 1),
            minus_inf,
            call(Func::Select, vec![bin(BinOp::And, is(Var::Q, 3), is(Var::B, 0)), nan, score()]),
        ],
    ));
    let seqlens = [(5, 4), (5, 4), (3, 0)];
    let inputs = random_inputs(&s, &seqlens, 300);
    let dout = d_out(&s, &inputs, 301);
    let g = reference_backward(&s, &inputs, &dout).expect("valid");
    let (qh, dqk, dv) = (2, 5, 3);
    let row = |t: &[f64], i: usize, h: usize, d: usize| t[(i * qh + h) * d..][..d].to_vec();
    // (one KV head)
    let key = |t: &[f64], j: usize, d: usize| t[j * d..][..d].to_vec();
    // Sequence 1: finite everywhere; key 1 and query 2 have zero gradients.
    let g1 = &g.seqs[1];
    assert!(g1.dq.iter().chain(&g1.dk).chain(&g1.dv).all(|x| x.is_finite()));
    assert!(key(&g1.dk, 1, dqk).iter().chain(&key(&g1.dv, 1, dv)).all(|x| *x == 0.0));
    assert!((0..qh).all(|h| row(&g1.dq, 2, h, dqk).iter().all(|x| *x == 0.0)));
    assert!(row(&g1.dq, 0, 0, dqk).iter().any(|x| *x != 0.0));
    // Sequence 0: query 3's NaN reaches its dq and every contributing key (not key 1).
    let g0 = &g.seqs[0];
    for h in 0..qh {
        assert!(row(&g0.dq, 3, h, dqk).iter().all(|x| x.is_nan()));
        assert!(row(&g0.dq, 0, h, dqk).iter().all(|x| x.is_finite()));
    }
    for j in [0, 2, 3] {
        assert!(key(&g0.dk, j, dqk).iter().chain(&key(&g0.dv, j, dv)).all(|x| x.is_nan()), "key {j}");
    }
    assert!(key(&g0.dk, 1, dqk).iter().all(|x| *x == 0.0));
    // Sequence 2 has no keys: zero gradients of the right sizes.
    assert_eq!((g.seqs[2].dq.len(), g.seqs[2].dk.len()), (3 * qh * dqk, 0));
    assert!(g.seqs[2].dq.iter().all(|x| *x == 0.0));

    // With a sink, the NaN row makes its head's sink gradient NaN; an empty row with a
    // sink (P_sink = 1, so D = 0) contributes nothing.
    s.sinks = true;
    let inputs = random_inputs(&s, &seqlens, 302);
    let g = reference_backward(&s, &inputs, &d_out(&s, &inputs, 303)).expect("valid");
    assert!(g.dsinks.as_ref().is_some_and(|d| d.iter().all(|x| x.is_nan())));
    let mut s2 = s.clone();
    s2.score_mod = None;
    gradcheck(&s2, &[(5, 4), (3, 0)], 305);
}

#[test]
fn invalid_inputs_are_errors() {
    let s = small(2, 1);
    let inputs = random_inputs(&s, SEQLENS, 400);
    let good = d_out(&s, &inputs, 401);
    assert!(reference_backward(&s, &inputs, &good).is_ok());
    let r = reference_backward(&s, &inputs, &good[..2]);
    assert!(matches!(r, Err(ReferenceError::Length { expected: 3, found: 2, .. })), "{r:?}");
    let mut bad = good.clone();
    bad[1].pop();
    let r = reference_backward(&s, &inputs, &bad);
    assert!(matches!(&r, Err(ReferenceError::Length { what, .. }) if what.contains("sequence 1")), "{r:?}");
    let mut x = inputs.clone();
    x.seqs[0].k.pop();
    assert!(matches!(reference_backward(&s, &x, &good), Err(ReferenceError::Length { .. })));
    let mut s2 = s.clone();
    s2.aux = vec![AuxDecl::float("w", vec![AuxDim::Fixed(2)], true)];
    assert!(matches!(reference_backward(&s2, &inputs, &good), Err(ReferenceError::Aux(_))));
    let mut s3 = s.clone();
    s3.score_mod = Some(v(Var::Q));
    assert!(matches!(reference_backward(&s3, &inputs, &good), Err(ReferenceError::Spec(_))));
}

#[test]
fn results_are_deterministic_and_large_problems_use_threads() {
    // Big enough for the threaded path (cost above the sequential threshold).
    let mut s = Spec::new("big", 64, 8);
    s.kv_heads = 2;
    s.sinks = true;
    s.aux = vec![AuxDecl::float("bias", vec![AuxDim::QHeads, AuxDim::Fixed(8)], true)];
    s.score_mod = Some(bin(
        BinOp::Add,
        v(Var::Score),
        Expr::aux("bias", vec![v(Var::H), call(Func::Min, vec![call(Func::Abs, vec![qk()]), Expr::int(7)])]),
    ));
    s.mask.causal = Some(Align::TopLeft);
    let seqlens = [(40, 40), (33, 33), (17, 17)];
    let inputs = random_inputs(&s, &seqlens, 500);
    let dout = d_out(&s, &inputs, 501);
    let a = reference_backward(&s, &inputs, &dout).expect("valid");
    let b = reference_backward(&s, &inputs, &dout).expect("valid");
    assert_eq!(a, b);
    // A sanity check of the scale of things: the loss is linear in d_out.
    let l = loss(&s, &inputs, &dout).expect("valid");
    let twice: Vec<Vec<f64>> = dout.iter().map(|d| d.iter().map(|x| 2.0 * x).collect()).collect();
    assert!((loss(&s, &inputs, &twice).expect("valid") - 2.0 * l).abs() < 1e-9 * l.abs().max(1.0));
    // And the gradient checks out on a few probes there too.
    let opts = GradCheckOptions { directions: 1, elements: 1, ..GradCheckOptions::default() };
    let r = check_gradients(&s, &inputs, &dout, &opts).expect("valid");
    assert!(r.failures.is_empty(), "{:?}", r.failures);
}

/// `reference_backward_with_output` with the exact O is `reference_backward`; with O
/// rounded to bf16 (what a kernel stores) it moves dQ by about the rounding, but a learned
/// slope's gradient, `Σ dS·(k − q)` with `Σ_k dS = 0`, by orders of magnitude more: the
/// conditioning the device self-test accounts for by feeding the reference the device's O.
#[test]
fn stored_output_reference_and_the_conditioning_of_position_biases() {
    let mut s = small(2, 2);
    s.head_dim_qk = 16;
    s.head_dim_v = 16;
    s.mask.causal = Some(Align::TopLeft);
    s.aux = vec![AuxDecl::float("slopes", vec![AuxDim::QHeads], true)];
    s.score_mod = Some(bin(
        BinOp::Sub,
        v(Var::Score),
        bin(BinOp::Mul, Expr::aux("slopes", vec![v(Var::H)]), call(Func::ToFloat, vec![qk()])),
    ));
    let seqlens = [(300, 9)];
    let inputs = random_inputs(&s, &seqlens, 600);
    let dout = d_out(&s, &inputs, 601);
    let exact = reference_backward(&s, &inputs, &dout).expect("valid");
    let o: Vec<Vec<f64>> = reference_forward(&s, &inputs).expect("valid").into_iter().map(|x| x.o).collect();
    assert_eq!(reference_backward_with_output(&s, &inputs, &dout, &o).expect("valid"), exact);

    let rounded: Vec<Vec<f64>> = o.iter().map(|x| x.iter().map(|v| round_bf16(*v)).collect()).collect();
    let r = reference_backward_with_output(&s, &inputs, &dout, &rounded).expect("valid");
    let dq = rel_l2(&r.seqs[0].dq, &exact.seqs[0].dq);
    let slopes = rel_l2(r.daux[0].as_ref().expect("learnable"), exact.daux[0].as_ref().expect("learnable"));
    assert!(dq > 0.0 && dq < 1e-2, "dq moved by {dq}");
    assert!(slopes > 10.0 * dq, "slopes moved by {slopes}, dq by {dq}");

    // A stored O of the wrong size is an error, not a panic.
    let short = vec![rounded[0][1..].to_vec()];
    assert!(matches!(reference_backward_with_output(&s, &inputs, &dout, &short), Err(ReferenceError::Length { .. })));
}

/// Causal, with a learnable bias per (head, key) added to the score.
fn learned_key_bias() -> Spec {
    use attnc_ir::{AuxDecl, AuxDim, BinOp, Expr, Var};
    let mut spec = Spec::new("bias", 64, 2);
    spec.mask.causal = Some(attnc_ir::Align::TopLeft);
    spec.aux.push(AuxDecl::float("bias", vec![AuxDim::QHeads, AuxDim::MaxSeqlenK], true));
    spec.score_mod = Some(Expr::binary(
        BinOp::Add,
        Expr::var(Var::Score),
        Expr::aux("bias", vec![Expr::var(Var::H), Expr::var(Var::K)]),
    ));
    spec
}

/// The magnitude sums bound the aux gradients they come with, element by element.
#[test]
fn aux_gradient_scales_bound_the_gradients() {
    let spec = learned_key_bias();
    let inputs = attnc_ir::random_inputs(&spec, &[(23, 23)], 3);
    let mut rng = attnc_ir::reference::Rng::new(9);
    let d_out = vec![(0..23 * 2 * 64).map(|_| rng.normal()).collect::<Vec<f64>>()];
    let g = attnc_ir::reference_backward(&spec, &inputs, &d_out).expect("backward");
    let (d, s) = (g.daux[0].as_ref().expect("learnable"), g.daux_scale[0].as_ref().expect("learnable"));
    assert!(s.iter().any(|&x| x > 0.0));
    for (x, m) in d.iter().zip(s) {
        assert!(x.abs() <= m * (1.0 + 1e-12) + 1e-300, "{x} > {m}");
    }
}

/// A row with one key has dS = P (dP − D) = 0 exactly, so its aux gradient is 0 — but the
/// GPU's rounding of it is not, and the scale that rounding is judged against comes from
/// the terms before dS's cancellation (a `[1 × n]` causal case once failed on 0/0).
#[test]
fn aux_gradient_scale_survives_a_one_key_row() {
    let spec = learned_key_bias();
    // One query row against 40 keys: top-left causal leaves it key 0 alone.
    let inputs = attnc_ir::random_inputs(&spec, &[(1, 40)], 5);
    let mut rng = attnc_ir::reference::Rng::new(11);
    let d_out = vec![(0..2 * 64).map(|_| rng.normal()).collect::<Vec<f64>>()];
    let g = attnc_ir::reference_backward(&spec, &inputs, &d_out).expect("backward");
    let (d, s) = (g.daux[0].as_ref().expect("learnable"), g.daux_scale[0].as_ref().expect("learnable"));
    assert!(d.iter().all(|&x| x.abs() < 1e-12), "the gradient is zero: {d:?}");
    assert!(s.iter().filter(|&&x| x > 1e-3).count() == 2, "key 0 of both heads has a scale: {s:?}");
}
