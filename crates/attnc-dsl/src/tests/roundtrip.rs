//! `parse(print(spec)) == spec` for arbitrary valid specs.
//!
//! Specs come from ordinary proptest strategies; expressions from `attnc_ir::generate`'s
//! choice-driven builder, fed proptest's vectors, so they are well typed by construction
//! and shrink towards small trees when the vector shrinks.

use super::cases;
use crate::{parse, print};
use attnc_ir::check::is_reserved;
use attnc_ir::generate::ExprGen;
use attnc_ir::spec::SUPPORTED_HEAD_DIMS;
use attnc_ir::{
    Align, AuxDecl, AuxDim, DType, ExprContext, KvLayout, Mask, ParamDecl, Scale, SoftmaxOptions, Spec, SplitKv, Ty,
    Window,
};
use proptest::prelude::*;

fn decl_name() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => "[a-zA-Z_][a-zA-Z0-9_]{0,7}",
        1 => prop::sample::select(vec!["causal", "window", "none", "heads", "kv", "mask", "batch", "top_left", "bool"])
            .prop_map(String::from),
    ]
}

fn aux_dim() -> impl Strategy<Value = AuxDim> {
    prop_oneof![
        Just(AuxDim::Batch),
        Just(AuxDim::MaxSeqlenQ),
        Just(AuxDim::MaxSeqlenK),
        Just(AuxDim::QHeads),
        Just(AuxDim::KvHeads),
        (1u64..=i32::MAX as u64).prop_map(AuxDim::Fixed),
    ]
}

fn positive_float() -> impl Strategy<Value = f64> {
    prop_oneof![
        (1e-4f64..100.0),
        (prop::num::f64::POSITIVE | prop::num::f64::NORMAL | prop::num::f64::SUBNORMAL)
            .prop_filter("positive finite", |v| v.is_finite() && *v > 0.0),
    ]
}

/// Arbitrary valid specs.
pub(crate) fn spec_strategy() -> impl Strategy<Value = Spec> {
    let shape = (
        "[a-zA-Z_][a-zA-Z0-9_]{0,10}",
        0..SUPPORTED_HEAD_DIMS.len(),
        prop_oneof![1u32..=16, Just(1u32), 1u32..=128],
        prop_oneof![Just(1u32), 1u32..=8],
        any::<bool>(),
        any::<bool>(),
    );
    let decls = (
        prop::collection::vec((decl_name(), any::<bool>()), 0..5),
        prop::collection::vec((decl_name(), prop::collection::vec(aux_dim(), 1..=4), 0u8..4), 0..3),
    );
    let window_bound =
        prop_oneof![Just(None), (0u64..=64).prop_map(Some), (0u64..=attnc_ir::MAX_WINDOW).prop_map(Some)];
    let mask = (
        prop::option::of(prop_oneof![Just(Align::TopLeft), Just(Align::BottomRight)]),
        prop::option::of((window_bound.clone(), window_bound, any::<bool>(), any::<bool>())),
        prop::option::of(prop::collection::vec(any::<u32>(), 0..48)),
        prop::option::of(prop::collection::vec(any::<u32>(), 0..48)),
    );
    let rest = (
        prop::option::of(positive_float()),
        any::<bool>(),
        prop_oneof![
            Just(KvLayout::Contiguous),
            Just(KvLayout::Varlen),
            (1u32..=65536).prop_map(|page_size| KvLayout::Paged { page_size })
        ],
        prop_oneof![Just(SplitKv::None), Just(SplitKv::Auto), (1u32..=256).prop_map(SplitKv::Fixed)],
        any::<bool>(),
        (prop_oneof![Just(0.0), 0.0f64..=1.0, Just(1.0)], prop_oneof![Just(0.0), 0.0f64..=64.0, Just(64.0)]),
    );
    (shape, decls, mask, rest).prop_map(|(shape, decls, mask, rest)| {
        let (name, hd, kv, group, pack, fp16) = shape;
        let (hd_qk, hd_v) = SUPPORTED_HEAD_DIMS[hd];
        let q = (kv * group).min(1024);
        let kv = if q % kv == 0 { kv } else { q };
        let mut spec = Spec::new(&name, hd_qk, q);
        spec.head_dim_v = hd_v;
        spec.kv_heads = kv;
        spec.pack_gqa = pack && q > kv;
        spec.dtype = if fp16 { DType::Fp16 } else { DType::Bf16 };

        // Declarations share a namespace and avoid reserved words.
        let mut used: Vec<String> = Vec::new();
        let mut fresh = |n: String| {
            let mut n = if is_reserved(&n) { format!("{n}_") } else { n };
            while used.contains(&n) {
                n.push('_');
            }
            used.push(n.clone());
            n
        };
        let (params, aux) = decls;
        spec.params = params
            .into_iter()
            .map(|(n, int)| ParamDecl { name: fresh(n), ty: if int { Ty::Int } else { Ty::Float } })
            .collect();
        // kind: 0, 1 int; 2 float; 3 learnable float.
        spec.aux = aux
            .into_iter()
            .map(|(n, dims, kind)| match kind {
                0 | 1 => AuxDecl::int(&fresh(n), dims),
                k => AuxDecl::float(&fresh(n), dims, k == 3),
            })
            .collect();

        let (causal, window, pred, score) = mask;
        spec.mask = Mask {
            causal,
            window: window.map(|(l, r, use_right, br)| {
                let (left, right) = if l.is_none() && r.is_none() { (Some(0), None) } else { (l, r) };
                let right = if use_right { right } else { right.filter(|_| left.is_none()) };
                let own = if br { Align::BottomRight } else { Align::TopLeft };
                Window { left, right, align: causal.unwrap_or(own) }
            }),
            predicate: pred.map(|c| ExprGen::new(&c, &spec.params, &spec.aux, ExprContext::Mask).expr(Ty::Bool, 5)),
        };
        spec.score_mod =
            score.map(|c| ExprGen::new(&c, &spec.params, &spec.aux, ExprContext::ScoreMod).expr(Ty::Float, 5));

        let (scale, sinks, kv_layout, split_kv, lse, (exp2_emulation, rescale_threshold)) = rest;
        spec.scale = scale.map_or(Scale::Default, Scale::Value);
        spec.sinks = sinks;
        spec.kv_layout = kv_layout;
        spec.split_kv = split_kv;
        spec.lse = lse;
        // `shards` needs the contiguous layout; the lse flag's bits pick it elsewhere too.
        spec.shards = lse && spec.kv_layout == KvLayout::Contiguous && spec.q_heads % 2 == 0;
        // Conditional rescaling may let P grow to 2^threshold; fp16 overflows past 2^15.
        let rescale_threshold = if fp16 { rescale_threshold.min(15.0) } else { rescale_threshold };
        spec.softmax = SoftmaxOptions { exp2_emulation, rescale_threshold };
        spec
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn print_then_parse_is_the_identity(spec in spec_strategy()) {
        prop_assert!(attnc_ir::validate(&spec).is_ok(), "generator made an invalid spec: {:?}\n{:?}", attnc_ir::validate(&spec), spec);
        let text = print(&spec);
        let back = parse(&text);
        prop_assert!(back.is_ok(), "{}\n{}", text, back.as_ref().err().map(|e| e.to_string()).unwrap_or_default());
        let back = back.unwrap_or_else(|_| spec.clone());
        prop_assert_eq!(&back, &spec, "{}", text);
        // The printed form is canonical: printing again gives the same text.
        prop_assert_eq!(print(&back), text);
    }
}

#[test]
fn huge_boolean_expressions_check_in_linear_time() {
    use super::{body, err_at, ok};
    // 200 nested connectives must check instantly (each node is typed once).
    let t = std::time::Instant::now();
    ok(&body(&format!("mask q < k{}", " && q < k".repeat(200))));
    ok(&body(&format!("mask {}true", "!".repeat(200))));
    err_at(
        &body(&format!("mask q < k{} && q", " && q < k".repeat(200))),
        4,
        10 + 9 * 200 + 5,
        "type error: expected bool for `&&`, found int",
    );
    err_at(
        &body(&format!("mask (q < k{}) + 1 == 0", " && q < k".repeat(200))),
        4,
        7,
        "type error: `+` needs int or float operands, found bool",
    );
    err_at(&body(&format!("mask k{} + 1", " + k".repeat(30) + &" && q < k".repeat(30))), 4, 6, "`&&`");
    assert!(t.elapsed().as_secs() < 10, "{:?}", t.elapsed());
}
