//! Context parallelism's semantics against the f64 reference: a variant computed on shards
//! of queries × shards of keys, with global positions (`ShardPositions`) and the partial
//! results merged by their LSE, equals the variant on the whole sequence — for random
//! specs (masks and score modifications over positions, lengths, params and aux tensors,
//! sinks) and a few written out.

use attnc_ir::generate::random_spec;
use attnc_ir::reference::Rng;
use attnc_ir::{merge_partials, random_inputs, reference_forward, Align, Inputs, Spec, Window};

/// `global` cut into `q_cuts` × `k_cuts`, each shard computed with its positions and the
/// key shards merged; the largest difference to the whole computation (o relative to its
/// scale, lse absolute), rows the whole computation makes NaN left out.
fn sharded_error(spec: &Spec, global: &Inputs, q_cuts: &[usize], k_cuts: &[usize]) -> f64 {
    let full = reference_forward(spec, global).expect("the whole sequence computes");
    let (qh, dv) = (spec.q_heads as usize, spec.head_dim_v as usize);
    let sq = global.seqs[0].seqlen_q;
    let scale = full.iter().flat_map(|o| o.o.iter()).filter(|x| x.is_finite()).fold(1e-300f64, |a, x| a.max(x.abs()));
    let mut worst = 0.0f64;
    for qw in q_cuts.windows(2) {
        let (qa, qb) = (qw[0], qw[1]);
        let mut parts: Vec<Vec<attnc_ir::SeqOutput>> = vec![Vec::new(); global.seqs.len()];
        for kw in k_cuts.windows(2) {
            let (ka, kb) = (kw[0], kw[1]);
            let shard = global.shard(spec, qa..qb, ka..kb, ka == 0);
            let out = reference_forward(spec, &shard).expect("a shard computes");
            for (b, o) in out.into_iter().enumerate() {
                parts[b].push(o);
            }
        }
        for (b, p) in parts.iter().enumerate() {
            let merged = merge_partials(p, qh, dv);
            let whole = &full[b];
            for i in 0..(qb - qa) {
                for h in 0..qh {
                    let want_lse = whole.lse[h * sq + qa + i];
                    let got_lse = merged.lse[h * (qb - qa) + i];
                    if want_lse.is_nan() {
                        continue;
                    }
                    if want_lse == f64::NEG_INFINITY || got_lse == f64::NEG_INFINITY {
                        assert_eq!(
                            want_lse,
                            got_lse,
                            "{}: row {} head {h}: an empty row on one side only",
                            spec.name,
                            qa + i
                        );
                    } else {
                        worst = worst.max((want_lse - got_lse).abs());
                    }
                    let w = &whole.o[((qa + i) * qh + h) * dv..][..dv];
                    let g = &merged.o[(i * qh + h) * dv..][..dv];
                    for (x, y) in w.iter().zip(g) {
                        worst = worst.max((x - y).abs() / scale);
                    }
                }
            }
        }
    }
    worst
}

#[test]
fn shards_with_global_positions_merge_to_the_whole_for_random_specs() {
    let mut rng = Rng::new(0xC0FFEE);
    let mut checked = 0;
    for n in 0..150 {
        let spec = random_spec(&mut rng, &format!("cp{n}"));
        let seqlens = [(37, 53), (37, 53)];
        // Random specs may declare large fixed aux dims: keep the inputs small.
        let aux_elems = spec.aux.iter().map(|a| {
            attnc_ir::reference::resolve_aux_dims(&spec, &a.dims, &seqlens)
                .iter()
                .fold(1usize, |n, &d| n.saturating_mul(d))
        });
        if aux_elems.max().unwrap_or(0) > 1 << 16 || spec.q_heads > 16 {
            continue;
        }
        let global = random_inputs(&spec, &seqlens, n);
        if reference_forward(&spec, &global).is_err() {
            continue;
        }
        let err = sharded_error(&spec, &global, &[0, 13, 37], &[0, 1, 17, 40, 53]);
        assert!(err < 1e-9, "{}: sharded differs by {err:e}\n{spec:?}", spec.name);
        checked += 1;
    }
    assert!(checked >= 40, "only {checked} random specs ran");
}

#[test]
fn causal_windows_documents_and_sinks_shard_exactly() {
    let mut causal_br = Spec::new("causal_br", 64, 4);
    causal_br.mask.causal = Some(Align::BottomRight);
    let mut window = Spec::new("window", 64, 4);
    window.kv_heads = 2;
    window.mask.window = Some(Window { left: Some(9), right: Some(3), align: Align::TopLeft });
    let mut sinks = Spec::new("sinks", 64, 4);
    sinks.mask.causal = Some(Align::TopLeft);
    sinks.sinks = true;
    let doc = attnc_dsl_free_document_mask();
    for spec in [causal_br, window, sinks, doc] {
        let global = random_inputs(&spec, &[(41, 41), (41, 41)], 7);
        // Uneven cuts, a one-row shard, key shards that a causal row never reaches.
        let err = sharded_error(&spec, &global, &[0, 1, 20, 41], &[0, 8, 9, 30, 41]);
        assert!(err < 1e-9, "{}: sharded differs by {err:e}", spec.name);
    }
}

/// `causal && doc[b, q] == doc[b, k]` built from the IR (the DSL's document mask).
fn attnc_dsl_free_document_mask() -> Spec {
    use attnc_ir::{AuxDecl, AuxDim, BinOp, Expr, Var};
    let mut s = Spec::new("document", 64, 4);
    s.aux.push(AuxDecl::int("doc", vec![AuxDim::Batch, AuxDim::MaxSeqlenK]));
    s.mask.causal = Some(Align::TopLeft);
    let doc = |i: Expr| Expr::aux("doc", vec![Expr::var(Var::B), i]);
    s.mask.predicate = Some(Expr::binary(BinOp::Eq, doc(Expr::var(Var::Q)), doc(Expr::var(Var::K))));
    s
}

/// The backward of query shards, each against the key shard that holds every key its rows
/// may see (a local window), equals the whole backward: dQ by rows, dK, dV and the
/// learnable aux gradient summed over shards. The score mod reads a learnable bias by the
/// key's global position and scales by its distance, so a key offset dropped in the
/// backward (as the reference once did) shows.
#[test]
fn backward_of_query_shards_over_their_key_windows_equals_the_whole() {
    use attnc_ir::{reference_backward, AuxDecl, AuxDim, BinOp, Expr, Var};
    let mut spec = Spec::new("window_bias", 64, 4);
    spec.kv_heads = 2;
    let (left, right) = (9usize, 3usize);
    spec.mask.window = Some(Window { left: Some(left as u64), right: Some(right as u64), align: Align::TopLeft });
    spec.aux.push(AuxDecl::float("bias", vec![AuxDim::QHeads, AuxDim::MaxSeqlenK], true));
    let bias = Expr::aux("bias", vec![Expr::var(Var::H), Expr::var(Var::K)]);
    let dist = Expr::binary(BinOp::Sub, Expr::var(Var::Q), Expr::var(Var::K));
    spec.score_mod = Some(Expr::binary(
        BinOp::Add,
        Expr::var(Var::Score),
        Expr::binary(BinOp::Mul, bias, Expr::call(attnc_ir::Func::ToFloat, vec![dist])),
    ));
    let n = 47;
    let global = random_inputs(&spec, &[(n, n)], 11);
    let (qh, kvh, d) = (4usize, 2usize, 64usize);
    let mut rng = Rng::new(5);
    let d_out: Vec<f64> = (0..n * qh * d).map(|_| rng.normal()).collect();
    let whole = reference_backward(&spec, &global, std::slice::from_ref(&d_out)).expect("whole backward");

    let (mut dq, mut dk, mut dv) = (vec![0.0; n * qh * d], vec![0.0; n * kvh * d], vec![0.0; n * kvh * d]);
    let mut daux = vec![0.0; whole.daux[0].as_ref().expect("learnable").len()];
    for w in [0usize, 1, 13, 30, 47].windows(2) {
        let (qa, qb) = (w[0], w[1]);
        let (ka, kb) = (qa.saturating_sub(left), (qb + right).min(n));
        let shard = global.shard(&spec, qa..qb, ka..kb, true);
        let g = reference_backward(&spec, &shard, &[d_out[qa * qh * d..qb * qh * d].to_vec()]).expect("a shard");
        dq[qa * qh * d..qb * qh * d].copy_from_slice(&g.seqs[0].dq);
        for (acc, x) in dk[ka * kvh * d..kb * kvh * d].iter_mut().zip(&g.seqs[0].dk) {
            *acc += x;
        }
        for (acc, x) in dv[ka * kvh * d..kb * kvh * d].iter_mut().zip(&g.seqs[0].dv) {
            *acc += x;
        }
        for (acc, x) in daux.iter_mut().zip(g.daux[0].as_ref().expect("learnable")) {
            *acc += x;
        }
    }
    let close = |a: &[f64], b: &[f64], what: &str| {
        let err = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
        let scale = b.iter().map(|x| x.abs()).fold(1e-300, f64::max);
        assert!(err / scale < 1e-9, "{what}: sharded differs by {:e} of its scale", err / scale);
    };
    close(&dq, &whole.seqs[0].dq, "dq");
    close(&dk, &whole.seqs[0].dk, "dk");
    close(&dv, &whole.seqs[0].dv, "dv");
    close(&daux, whole.daux[0].as_ref().expect("learnable"), "d bias");
}
