//! The reference executor against an independent naive implementation: the full score
//! matrix per head is materialized, masks and score modifications are written directly in
//! Rust (not through `eval`), and the softmax is the textbook formula. Odd sizes,
//! seqlen_q ≠ seqlen_k, GQA/MQA, sinks, fully masked rows and several sequences.

// The naive implementation is deliberately index-based; is_none_or / is_multiple_of are
// newer than the workspace's rust-version.
#![allow(unknown_lints, clippy::needless_range_loop, clippy::unnecessary_map_or, clippy::manual_is_multiple_of)]

use attnc_ir::eval::{AuxTensor, Value};
use attnc_ir::reference::{
    random_inputs, random_inputs_with_params, reference_forward, rel_l2, round_bf16, round_fp16, Inputs,
    ReferenceError, SeqOutput, Sequence,
};
use attnc_ir::{Align, AuxDecl, AuxDim, BinOp, DType, Expr, Func, ParamDecl, Scale, Spec, Ty, UnOp, Var, Window};

/// (b, h, i, j, seqlen_q, seqlen_k) → allowed
type MaskFn<'a> = &'a dyn Fn(usize, usize, i64, i64, i64, i64) -> bool;
/// (score, b, h, i, j) → modified score
type ModFn<'a> = &'a dyn Fn(f64, usize, usize, i64, i64) -> f64;

fn no_mask(_: usize, _: usize, _: i64, _: i64, _: i64, _: i64) -> bool {
    true
}
fn no_mod(s: f64, _: usize, _: usize, _: i64, _: i64) -> f64 {
    s
}

fn naive(spec: &Spec, inputs: &Inputs, mask: MaskFn, smod: ModFn) -> Vec<SeqOutput> {
    let (qh, kvh) = (spec.q_heads as usize, spec.kv_heads as usize);
    let (dqk, dv) = (spec.head_dim_qk as usize, spec.head_dim_v as usize);
    let scale = match spec.scale {
        Scale::Default => 1.0 / (dqk as f64).sqrt(),
        Scale::Value(v) => v,
    };
    let mut outs = Vec::new();
    for (b, seq) in inputs.seqs.iter().enumerate() {
        let (sq, sk) = (seq.seqlen_q, seq.seqlen_k);
        let mut o = vec![0.0; sq * qh * dv];
        let mut lse = vec![0.0; qh * sq];
        for h in 0..qh {
            let hk = h * kvh / qh; // the KV head of q head h
                                   // Full score matrix.
            let mut s = vec![vec![0.0f64; sk]; sq];
            for i in 0..sq {
                for j in 0..sk {
                    let mut dot = 0.0;
                    for d in 0..dqk {
                        dot += seq.q[i * qh * dqk + h * dqk + d] * seq.k[j * kvh * dqk + hk * dqk + d];
                    }
                    s[i][j] = if mask(b, h, i as i64, j as i64, sq as i64, sk as i64) {
                        smod(scale * dot, b, h, i as i64, j as i64)
                    } else {
                        f64::NEG_INFINITY
                    };
                }
            }
            let sink = inputs.sinks.as_ref().map(|v| v[h]);
            for i in 0..sq {
                let m = s[i].iter().copied().chain(sink).fold(f64::NEG_INFINITY, f64::max);
                if m == f64::NEG_INFINITY {
                    lse[h * sq + i] = f64::NEG_INFINITY;
                    continue; // o stays 0
                }
                let z: f64 = s[i].iter().map(|x| (x - m).exp()).sum::<f64>() + sink.map_or(0.0, |x| (x - m).exp());
                for j in 0..sk {
                    let p = (s[i][j] - m).exp() / z;
                    for d in 0..dv {
                        o[i * qh * dv + h * dv + d] += p * seq.v[j * kvh * dv + hk * dv + d];
                    }
                }
                lse[h * sq + i] = m + z.ln();
            }
        }
        outs.push(SeqOutput { o, lse });
    }
    outs
}

fn close(a: f64, b: f64) -> bool {
    a == b || (a.is_nan() && b.is_nan()) || (a - b).abs() <= 1e-12 * b.abs().max(1.0)
}

fn assert_agree(got: &[SeqOutput], want: &[SeqOutput], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: sequence count");
    for (b, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.o.len(), w.o.len(), "{what}: seq {b} o length");
        assert_eq!(g.lse.len(), w.lse.len(), "{what}: seq {b} lse length");
        for (n, (x, y)) in g.o.iter().zip(&w.o).enumerate() {
            assert!(close(*x, *y), "{what}: seq {b} o[{n}] = {x}, naive {y}");
        }
        for (n, (x, y)) in g.lse.iter().zip(&w.lse).enumerate() {
            assert!(close(*x, *y), "{what}: seq {b} lse[{n}] = {x}, naive {y}");
        }
        assert!(rel_l2(&g.o, &w.o) < 1e-12 && rel_l2(&g.lse, &w.lse) < 1e-12);
    }
}

const SEQLENS: &[(usize, usize)] = &[(7, 13), (13, 7), (1, 5), (5, 1), (0, 3), (4, 0), (9, 9)];

/// Specs with odd head dims (the reference does not care about kernel support) and
/// every head layout.
fn specs(name: &str) -> Vec<Spec> {
    let mut out = Vec::new();
    for (qh, kvh) in [(2, 2), (6, 2), (4, 1), (3, 3)] {
        for (dqk, dv, dtype) in [(16, 8, DType::Bf16), (5, 11, DType::Fp16)] {
            let mut s = Spec::new(name, dqk, qh);
            s.head_dim_v = dv;
            s.kv_heads = kvh;
            s.dtype = dtype;
            out.push(s);
        }
    }
    out
}

fn run(spec: &Spec, inputs: &Inputs, mask: MaskFn, smod: ModFn, what: &str) {
    let got = reference_forward(spec, inputs).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_agree(&got, &naive(spec, inputs, mask, smod), what);
}

#[test]
fn plain_attention() {
    for (n, spec) in specs("plain").into_iter().enumerate() {
        let inputs = random_inputs(&spec, SEQLENS, n as u64);
        run(&spec, &inputs, &no_mask, &no_mod, "plain");
        // An explicit scale.
        let mut s2 = spec.clone();
        s2.scale = Scale::Value(0.7);
        run(&s2, &inputs, &no_mask, &no_mod, "scaled");
    }
}

#[test]
fn causal_both_alignments() {
    for (n, mut spec) in specs("causal").into_iter().enumerate() {
        spec.mask.causal = Some(Align::TopLeft);
        let inputs = random_inputs(&spec, SEQLENS, 100 + n as u64);
        run(&spec, &inputs, &|_, _, i, j, _, _| j <= i, &no_mod, "causal top-left");
        spec.mask.causal = Some(Align::BottomRight);
        // seqlen_q > seqlen_k: the first rows see no key (o = 0, lse = −∞).
        run(&spec, &inputs, &|_, _, i, j, sq, sk| j <= i + sk - sq, &no_mod, "causal bottom-right");
    }
}

#[test]
fn fully_masked_rows_are_zero_with_minus_infinite_lse() {
    let mut spec = Spec::new("fm", 16, 2);
    spec.mask.causal = Some(Align::BottomRight);
    let inputs = random_inputs(&spec, &[(13, 7)], 5);
    let out = reference_forward(&spec, &inputs).unwrap();
    // Rows 0..6 see nothing.
    for h in 0..2 {
        for i in 0..13 {
            let row = &out[0].o[(i * 2 + h) * 16..][..16];
            let lse = out[0].lse[h * 13 + i];
            if i < 6 {
                assert!(row.iter().all(|x| *x == 0.0) && lse == f64::NEG_INFINITY);
            } else {
                assert!(lse.is_finite() && row.iter().any(|x| *x != 0.0));
            }
        }
    }
}

#[test]
fn sliding_windows() {
    for (n, mut spec) in specs("win").into_iter().enumerate() {
        for (left, right, align) in [
            (Some(3u64), Some(0u64), Align::TopLeft),
            (Some(2), Some(4), Align::BottomRight),
            (None, Some(1), Align::TopLeft),
            (Some(0), None, Align::BottomRight),
        ] {
            spec.mask.window = Some(Window { left, right, align });
            let inputs = random_inputs(&spec, SEQLENS, 200 + n as u64);
            let mask = move |_: usize, _: usize, i: i64, j: i64, sq: i64, sk: i64| {
                let diag = match align {
                    Align::TopLeft => i,
                    Align::BottomRight => i + sk - sq,
                };
                left.map_or(true, |l| j >= diag - l as i64) && right.map_or(true, |r| j <= diag + r as i64)
            };
            run(&spec, &inputs, &mask, &no_mod, "window");
        }
    }
}

#[test]
fn softcap_with_a_float_param() {
    for (n, mut spec) in specs("softcap").into_iter().enumerate() {
        spec.params.push(ParamDecl { name: "cap".into(), ty: Ty::Float });
        spec.score_mod = Some(Expr::call(Func::Softcap, vec![Expr::var(Var::Score), Expr::param("cap")]));
        spec.scale = Scale::Value(2.0); // large scores, so the cap matters
        for cap in [0.5, 1.5, 30.0] {
            let inputs =
                random_inputs_with_params(&spec, SEQLENS, 300 + n as u64, &[("cap", Value::Float(cap))]).unwrap();
            run(&spec, &inputs, &no_mask, &move |s, _, _, _, _| cap * (s / cap).tanh(), "softcap");
        }
    }
}

#[test]
fn alibi_with_causal() {
    for (n, mut spec) in specs("alibi").into_iter().enumerate() {
        // score − slope_h · |q − k|, slope_h = 2^(−8 (h + 1) / q_heads)
        let slope = Expr::call(
            Func::Exp2,
            vec![Expr::binary(
                BinOp::Div,
                Expr::binary(
                    BinOp::Mul,
                    Expr::float(-8.0),
                    Expr::call(Func::ToFloat, vec![Expr::binary(BinOp::Add, Expr::var(Var::H), Expr::int(1))]),
                ),
                Expr::call(Func::ToFloat, vec![Expr::var(Var::QHeads)]),
            )],
        );
        let dist = Expr::call(
            Func::ToFloat,
            vec![Expr::call(Func::Abs, vec![Expr::binary(BinOp::Sub, Expr::var(Var::Q), Expr::var(Var::K))])],
        );
        spec.score_mod = Some(Expr::binary(BinOp::Sub, Expr::var(Var::Score), Expr::binary(BinOp::Mul, slope, dist)));
        spec.mask.causal = Some(Align::BottomRight);
        let qh = spec.q_heads as f64;
        let inputs = random_inputs(&spec, SEQLENS, 400 + n as u64);
        let smod = move |s: f64, _: usize, h: usize, i: i64, j: i64| {
            s - (2f64).powf(-8.0 * (h as f64 + 1.0) / qh) * (i - j).abs() as f64
        };
        run(&spec, &inputs, &|_, _, i, j, sq, sk| j <= i + sk - sq, &smod, "alibi");
    }
}

#[test]
fn prefix_lm_with_an_int_param() {
    for (n, mut spec) in specs("prefix").into_iter().enumerate() {
        spec.params.push(ParamDecl { name: "prefix".into(), ty: Ty::Int });
        spec.mask.predicate = Some(Expr::binary(
            BinOp::Or,
            Expr::binary(BinOp::Le, Expr::var(Var::K), Expr::var(Var::Q)),
            Expr::binary(BinOp::Lt, Expr::var(Var::K), Expr::param("prefix")),
        ));
        for prefix in [0i32, 3, 100] {
            let inputs =
                random_inputs_with_params(&spec, SEQLENS, 500 + n as u64, &[("prefix", Value::Int(prefix))]).unwrap();
            run(&spec, &inputs, &move |_, _, i, j, _, _| j <= i || j < prefix as i64, &no_mod, "prefix-lm");
        }
    }
}

#[test]
fn document_masks_with_aux_tensors() {
    for (n, mut spec) in specs("doc").into_iter().enumerate() {
        spec.aux.push(AuxDecl::int("docq", vec![AuxDim::Batch, AuxDim::MaxSeqlenQ]));
        spec.aux.push(AuxDecl::int("dock", vec![AuxDim::Batch, AuxDim::MaxSeqlenK]));
        spec.mask.predicate = Some(Expr::binary(
            BinOp::Eq,
            Expr::aux("docq", vec![Expr::var(Var::B), Expr::var(Var::Q)]),
            Expr::aux("dock", vec![Expr::var(Var::B), Expr::var(Var::K)]),
        ));
        spec.mask.causal = if n % 2 == 0 { Some(Align::TopLeft) } else { None };
        let mut inputs = random_inputs(&spec, SEQLENS, 600 + n as u64);
        // Hand-made ids, so that some rows match no key at all.
        let maxq = inputs.aux[0].dims[1];
        let maxk = inputs.aux[1].dims[1];
        for (b, _) in SEQLENS.iter().enumerate() {
            let docq = inputs.aux[0].data.ints_mut().expect("int aux");
            for i in 0..maxq {
                docq[b * maxq + i] = ((i + b) / 3) as i32;
            }
            let dock = inputs.aux[1].data.ints_mut().expect("int aux");
            for j in 0..maxk {
                dock[b * maxk + j] = (j / 4) as i32 + (b % 2) as i32;
            }
        }
        let ids = |t: &AuxTensor| t.data.ints().expect("int aux").to_vec();
        let (dq, dk) = (ids(&inputs.aux[0]), ids(&inputs.aux[1]));
        let causal = spec.mask.causal.is_some();
        let mask = move |b: usize, _: usize, i: i64, j: i64, _: i64, _: i64| {
            dq[b * maxq + i as usize] == dk[b * maxk + j as usize] && (!causal || j <= i)
        };
        run(&spec, &inputs, &mask, &no_mod, "document mask");
        // The random ids of random_inputs too.
        let inputs = random_inputs(&spec, SEQLENS, 650 + n as u64);
        let (dq, dk) = (ids(&inputs.aux[0]), ids(&inputs.aux[1]));
        let mask = move |b: usize, _: usize, i: i64, j: i64, _: i64, _: i64| {
            dq[b * maxq + i as usize] == dk[b * maxk + j as usize] && (!causal || j <= i)
        };
        run(&spec, &inputs, &mask, &no_mod, "document mask (random ids)");
    }
}

#[test]
fn attention_sinks() {
    for (n, mut spec) in specs("sinks").into_iter().enumerate() {
        spec.sinks = true;
        let mut inputs = random_inputs(&spec, SEQLENS, 700 + n as u64);
        run(&spec, &inputs, &no_mask, &no_mod, "sinks");
        // With rows that see no key: only the sink, so o = 0 and lse = sink.
        spec.mask.causal = Some(Align::BottomRight);
        run(&spec, &inputs, &|_, _, i, j, sq, sk| j <= i + sk - sq, &no_mod, "sinks + causal");
        let out = reference_forward(&spec, &inputs).unwrap();
        let sinks = inputs.sinks.clone().unwrap();
        for h in 0..spec.q_heads as usize {
            assert_eq!(out[1].lse[h * 13], sinks[h]); // seq (13, 7), row 0
        }
        // A −∞ sink is no sink.
        inputs.sinks.as_mut().unwrap()[0] = f64::NEG_INFINITY;
        run(&spec, &inputs, &|_, _, i, j, sq, sk| j <= i + sk - sq, &no_mod, "-inf sink");
        // Big sinks dominate.
        inputs.sinks.as_mut().unwrap().iter_mut().for_each(|s| *s = 40.0);
        run(&spec, &inputs, &|_, _, i, j, sq, sk| j <= i + sk - sq, &no_mod, "big sinks");
    }
}

#[test]
fn batch_index_and_heads_in_masks() {
    for (n, mut spec) in specs("bh").into_iter().enumerate() {
        // (b == 1 || k <= q) && (hkv != 0 || k % 2 == 0) && h != q_heads - 1 (last head sees nothing)
        let b1 = Expr::binary(BinOp::Eq, Expr::var(Var::B), Expr::int(1));
        let causal = Expr::binary(BinOp::Le, Expr::var(Var::K), Expr::var(Var::Q));
        let even = Expr::binary(BinOp::Eq, Expr::binary(BinOp::Rem, Expr::var(Var::K), Expr::int(2)), Expr::int(0));
        let hkv0 = Expr::binary(BinOp::Ne, Expr::var(Var::Hkv), Expr::int(0));
        let last =
            Expr::binary(BinOp::Ne, Expr::var(Var::H), Expr::binary(BinOp::Sub, Expr::var(Var::QHeads), Expr::int(1)));
        spec.mask.predicate =
            Some(Expr::binary(BinOp::Or, b1, causal).and(Expr::binary(BinOp::Or, hkv0, even)).and(last));
        let (qh, kvh) = (spec.q_heads as usize, spec.kv_heads as usize);
        let inputs = random_inputs(&spec, SEQLENS, 800 + n as u64);
        let mask = move |b: usize, h: usize, i: i64, j: i64, _: i64, _: i64| {
            (b == 1 || j <= i) && (h * kvh / qh != 0 || j % 2 == 0) && h != qh - 1
        };
        run(&spec, &inputs, &mask, &no_mod, "b/h mask");
    }
}

#[test]
fn score_mod_minus_infinity_is_masked() {
    let mut spec = Spec::new("neg", 16, 2);
    spec.kv_heads = 1;
    spec.mask.causal = Some(Align::TopLeft);
    // score where k != 0, −∞ (log 0) at k == 0: row 0 then has nothing.
    spec.score_mod = Some(Expr::call(
        Func::Select,
        vec![
            Expr::binary(BinOp::Eq, Expr::var(Var::K), Expr::int(0)),
            Expr::call(Func::Log, vec![Expr::float(0.0)]),
            Expr::var(Var::Score),
        ],
    ));
    let inputs = random_inputs(&spec, &[(7, 13), (3, 3)], 9);
    let smod = |s: f64, _: usize, _: usize, _: i64, j: i64| if j == 0 { f64::NEG_INFINITY } else { s };
    run(&spec, &inputs, &|_, _, i, j, _, _| j <= i, &smod, "-inf score");
    let out = reference_forward(&spec, &inputs).unwrap();
    assert_eq!(out[0].lse[0], f64::NEG_INFINITY);
    assert!(out[0].o[..16].iter().all(|x| *x == 0.0));
}

#[test]
fn nan_and_plus_infinity_scores_poison_their_row() {
    let mut spec = Spec::new("nan", 16, 1);
    spec.sinks = true;
    let at = |q: i64, k: i64| {
        Expr::binary(BinOp::Eq, Expr::var(Var::Q), Expr::int(q)).and(Expr::binary(
            BinOp::Eq,
            Expr::var(Var::K),
            Expr::int(k),
        ))
    };
    // sqrt(−1) = NaN at (1, 3); exp(1000) = +∞ at (2, 0); everything else plain.
    spec.score_mod = Some(Expr::call(
        Func::Select,
        vec![
            at(1, 3),
            Expr::call(Func::Sqrt, vec![Expr::float(-1.0)]),
            Expr::call(
                Func::Select,
                vec![at(2, 0), Expr::call(Func::Exp, vec![Expr::float(1000.0)]), Expr::var(Var::Score)],
            ),
        ],
    ));
    let inputs = random_inputs(&spec, &[(4, 5)], 1);
    let out = reference_forward(&spec, &inputs).unwrap();
    for i in 0..4 {
        let row = &out[0].o[i * 16..][..16];
        if i == 1 || i == 2 {
            assert!(row.iter().all(|x| x.is_nan()) && out[0].lse[i].is_nan(), "row {i}");
        } else {
            assert!(row.iter().all(|x| x.is_finite()) && out[0].lse[i].is_finite(), "row {i}");
        }
    }
    // A NaN sink poisons every row of its head.
    let mut inputs = inputs;
    inputs.sinks = Some(vec![f64::NAN]);
    let out = reference_forward(&spec, &inputs).unwrap();
    assert!(out[0].lse.iter().all(|x| x.is_nan()));
}

#[test]
fn many_heads_use_the_threaded_path_and_agree() {
    let mut spec = Spec::new("big", 64, 8);
    spec.kv_heads = 2;
    spec.mask.causal = Some(Align::BottomRight);
    spec.sinks = true;
    let seqlens = [(96, 160), (131, 67)];
    let inputs = random_inputs(&spec, &seqlens, 42);
    run(&spec, &inputs, &|_, _, i, j, sq, sk| j <= i + sk - sq, &no_mod, "threaded");
}

#[test]
fn random_inputs_are_deterministic_and_rounded() {
    let mut spec = Spec::new("r", 16, 4);
    spec.kv_heads = 2;
    spec.sinks = true;
    spec.params = vec![ParamDecl { name: "n".into(), ty: Ty::Int }, ParamDecl { name: "x".into(), ty: Ty::Float }];
    spec.aux = vec![AuxDecl::int("t", vec![AuxDim::Batch, AuxDim::MaxSeqlenK, AuxDim::Fixed(2)])];
    for dtype in [DType::Bf16, DType::Fp16] {
        spec.dtype = dtype;
        let a = random_inputs(&spec, &[(7, 13), (2, 3)], 7);
        assert_eq!(a, random_inputs(&spec, &[(7, 13), (2, 3)], 7));
        assert_ne!(a, random_inputs(&spec, &[(7, 13), (2, 3)], 8));
        let round = if dtype == DType::Bf16 { round_bf16 } else { round_fp16 };
        for s in &a.seqs {
            for x in s.q.iter().chain(&s.k).chain(&s.v) {
                assert_eq!(round(*x), *x);
            }
        }
        assert_eq!(a.seqs[0].q.len(), 7 * 4 * 16);
        assert_eq!(a.seqs[1].v.len(), 3 * 2 * 16);
        let sinks = a.sinks.as_ref().unwrap();
        assert!(sinks.len() == 4 && sinks.iter().all(|s| (*s as f32) as f64 == *s));
        assert!(matches!(a.params[0], Value::Int(v) if (0..=13).contains(&v)));
        assert!(matches!(a.params[1], Value::Float(v) if (0.5..2.0).contains(&v)));
        assert_eq!(a.aux[0].dims, vec![2, 13, 2]);
        assert_eq!(a.aux[0].data.len(), 52);
        // Mean ~0 and variance ~1.
        let all: Vec<f64> = a.seqs.iter().flat_map(|s| s.q.iter().chain(&s.k).chain(&s.v).copied()).collect();
        let mean = all.iter().sum::<f64>() / all.len() as f64;
        let var = all.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / all.len() as f64;
        assert!(mean.abs() < 0.15 && (var - 1.0).abs() < 0.2, "mean {mean} var {var}");
        assert!(reference_forward(&spec, &a).is_ok());
    }
}

#[test]
fn mismatched_inputs_are_errors_not_panics() {
    let mut spec = Spec::new("e", 16, 4);
    spec.kv_heads = 2;
    spec.params = vec![ParamDecl { name: "n".into(), ty: Ty::Int }];
    spec.aux = vec![AuxDecl::int("t", vec![AuxDim::Batch])];
    let good = random_inputs(&spec, &[(3, 5), (2, 2)], 1);
    assert!(reference_forward(&spec, &good).is_ok());

    let mut x = good.clone();
    x.seqs[1].k.pop();
    assert!(matches!(reference_forward(&spec, &x), Err(ReferenceError::Length { .. })));
    let mut x = good.clone();
    x.seqs[0].seqlen_q = 4;
    assert!(reference_forward(&spec, &x).is_err());
    let mut x = good.clone();
    x.params.clear();
    assert!(matches!(reference_forward(&spec, &x), Err(ReferenceError::Param(_))));
    let mut x = good.clone();
    x.params[0] = Value::Float(1.0);
    assert!(matches!(reference_forward(&spec, &x), Err(ReferenceError::Param(_))));
    assert!(x.set_param(&spec, "n", Value::Float(2.0)).is_err());
    assert!(x.set_param(&spec, "zz", Value::Int(2)).is_err());
    assert!(x.set_param(&spec, "n", Value::Int(2)).is_ok());
    let mut x = good.clone();
    x.aux[0].dims = vec![3];
    x.aux[0].data.ints_mut().expect("int aux").push(0);
    assert!(matches!(reference_forward(&spec, &x), Err(ReferenceError::Aux(_))));
    let mut x = good.clone();
    x.aux[0].data.ints_mut().expect("int aux").pop();
    assert!(reference_forward(&spec, &x).is_err());
    let mut x = good.clone();
    x.aux[0] = AuxTensor::float(x.aux[0].dims.clone(), vec![0.0; x.aux[0].data.len()]);
    assert!(
        matches!(reference_forward(&spec, &x), Err(ReferenceError::Aux(m)) if m.contains("declared int but holds float"))
    );
    let mut x = good.clone();
    x.aux.clear();
    assert!(reference_forward(&spec, &x).is_err());
    let mut x = good.clone();
    x.sinks = Some(vec![0.0; 4]);
    assert!(matches!(reference_forward(&spec, &x), Err(ReferenceError::Sinks(_))));
    let mut s2 = spec.clone();
    s2.sinks = true;
    assert!(reference_forward(&s2, &good).is_err());
    let mut x = good.clone();
    x.sinks = Some(vec![0.0; 3]);
    assert!(reference_forward(&s2, &x).is_err());
    x.sinks = Some(vec![0.0; 4]);
    assert!(reference_forward(&s2, &x).is_ok());
    // Bad specs.
    let mut s3 = spec.clone();
    s3.kv_heads = 3;
    assert!(matches!(reference_forward(&s3, &good), Err(ReferenceError::Spec(_))));
    s3.kv_heads = 0;
    assert!(reference_forward(&s3, &good).is_err());
    let mut s4 = spec.clone();
    s4.mask.predicate = Some(Expr::var(Var::Q));
    assert!(matches!(reference_forward(&s4, &good), Err(ReferenceError::Spec(_))));
    s4.mask.predicate = Some(Expr::unary(UnOp::Not, Expr::param("nope")));
    assert!(reference_forward(&s4, &good).is_err());
    let mut s5 = spec.clone();
    s5.score_mod = Some(Expr::var(Var::Q));
    assert!(reference_forward(&s5, &good).is_err());
    let mut s6 = spec.clone();
    s6.mask.window = Some(Window { left: Some(u64::MAX), right: None, align: Align::TopLeft });
    assert!(reference_forward(&s6, &good).is_err());
    // Absurd sizes.
    let mut x = good.clone();
    x.seqs[0].seqlen_q = usize::MAX;
    assert!(reference_forward(&spec, &x).is_err());
    let mut s7 = spec.clone();
    s7.head_dim_qk = 0;
    assert!(reference_forward(&s7, &good).is_err());
    // Random garbage never panics.
    for seed in 0..200u64 {
        let mut x = random_inputs(&spec, &[(2, 3)], seed);
        let junk = |n: u64| (seed.wrapping_mul(0x9e37_79b9) >> n) as usize % 5;
        let n = x.seqs[0].q.len().saturating_sub(junk(1));
        x.seqs[0].q.truncate(n);
        x.seqs[0].seqlen_k = junk(3);
        x.aux.push(AuxTensor::default());
        if junk(5) == 0 {
            x.aux.clear();
        }
        let _ = reference_forward(&spec, &x);
    }
    // An empty batch is fine.
    let empty = Inputs {
        seqs: vec![],
        params: vec![Value::Int(0)],
        aux: vec![AuxTensor::int(vec![0], vec![])],
        sinks: None,
        positions: vec![],
    };
    assert_eq!(reference_forward(&spec, &empty).unwrap(), vec![]);
    let _ = Sequence::default();
}

/// bfloat16 / binary16 rounding against a brute-force nearest search over every value of
/// the format (decoded independently from bits), with ties to the even encoding.
#[test]
fn rounding_matches_brute_force_nearest() {
    fn decode(bits: u32, mant: u32, exp_bits: u32) -> f64 {
        let bias = (1i32 << (exp_bits - 1)) - 1;
        let e = ((bits >> mant) & ((1 << exp_bits) - 1)) as i32;
        let m = (bits & ((1 << mant) - 1)) as f64;
        let sign = if bits >> (mant + exp_bits) & 1 == 1 { -1.0 } else { 1.0 };
        if e == 0 {
            sign * m * 2f64.powi(1 - bias - mant as i32)
        } else {
            sign * (1.0 + m / 2f64.powi(mant as i32)) * 2f64.powi(e - bias)
        }
    }
    for (mant, exp_bits, round) in [(7u32, 8u32, round_bf16 as fn(f64) -> f64), (10, 5, round_fp16)] {
        let max_e = (1u32 << exp_bits) - 1;
        // Non-negative finite values with their encodings (ascending).
        let vals: Vec<(f64, u32)> = (0..(max_e << mant)).map(|b| (decode(b, mant, exp_bits), b)).collect();
        assert!(vals.windows(2).all(|w| w[0].0 < w[1].0));
        let top = vals.last().unwrap().0;
        let ulp_top = top - vals[vals.len() - 2].0;
        let nearest = |x: f64| -> f64 {
            let a = x.abs();
            if a >= top + ulp_top / 2.0 {
                return f64::INFINITY.copysign(x);
            }
            let i = vals.partition_point(|v| v.0 <= a);
            let lo = vals[i - 1];
            let r = match vals.get(i) {
                None => lo.0,
                Some(hi) => {
                    let (dl, dh) = (a - lo.0, hi.0 - a);
                    if dl < dh || (dl == dh && lo.1 % 2 == 0) {
                        lo.0
                    } else {
                        hi.0
                    }
                }
            };
            r.copysign(x)
        };
        let mut xs: Vec<f64> = Vec::new();
        for w in vals.windows(2).step_by(7) {
            let mid = (w[0].0 + w[1].0) / 2.0;
            xs.extend([w[0].0, mid, mid * (1.0 + 1e-15), mid * (1.0 - 1e-15), -mid]);
        }
        xs.extend([top, top + ulp_top / 2.0, top + ulp_top / 2.0 * (1.0 - 1e-12), 1e-300, -1e-300, 1e300]);
        let mut state = 12345u64;
        for _ in 0..20000 {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let u = (state >> 11) as f64 / (1u64 << 53) as f64;
            let e = ((state >> 3) % 60) as i32 - 30;
            xs.push((u - 0.5) * 2f64.powi(e));
        }
        for x in xs {
            let (got, want) = (round(x), nearest(x));
            assert!(got == want && got.is_sign_negative() == want.is_sign_negative(), "x = {x:e}: {got:e} vs {want:e}");
        }
    }
}
