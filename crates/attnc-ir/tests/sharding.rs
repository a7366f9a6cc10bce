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
