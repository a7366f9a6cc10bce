//! Every construct of the language parses into the expected spec.

use super::{body, ok};
use crate::{parse, print};
use attnc_ir::{
    Align, AuxDecl, AuxDim, BinOp, DType, Expr, ExprKind, Func, KvLayout, ParamDecl, Scale, SoftmaxOptions, Spec,
    SplitKv, Ty, UnOp, Var, Window,
};

fn v(x: Var) -> Expr {
    Expr::var(x)
}
fn bin(op: BinOp, a: Expr, b: Expr) -> Expr {
    Expr::binary(op, a, b)
}
/// The score expression of `score EXPR` (with a float param `f` and int param `i`).
fn score(e: &str) -> Expr {
    let s = ok(&body(&format!("param i: int\nparam f: float\naux t: int[batch, 4]\nscore {e}")));
    s.score_mod.unwrap_or_else(|| panic!("no score in {e}"))
}
/// The mask predicate of `mask EXPR`.
fn pred(e: &str) -> Expr {
    let s = ok(&body(&format!("param i: int\naux t: int[batch, 4]\nmask {e}")));
    s.mask.predicate.unwrap_or_else(|| panic!("no predicate in {e}"))
}

#[test]
fn minimal_file_is_spec_new() {
    assert_eq!(ok("attention t {\n  head_dim 128\n  heads 8\n}"), Spec::new("t", 128, 8));
    // Same on one line with `;`, with comments, CRLF, blank lines, brace on its own line.
    for src in [
        "attention t { head_dim 128; heads 8 }",
        "attention t { head_dim 128; heads 8; }",
        "# header\n\n// more\nattention t // name\n{\r\n\r\n  head_dim 128 # qk = v\r\n\n  heads 8;;\n}\n\n// trailer\n",
        "\u{feff}attention t {\n head_dim 128\n heads 8\n}",
    ] {
        assert_eq!(ok(src), Spec::new("t", 128, 8), "{src:?}");
    }
}

#[test]
fn header_settings() {
    let s = ok("attention x {\n dtype fp16\n head_dim 192/128\n heads 32 kv 8 pack_gqa\n}");
    assert_eq!(
        (s.dtype, s.head_dim_qk, s.head_dim_v, s.q_heads, s.kv_heads, s.pack_gqa),
        (DType::Fp16, 192, 128, 32, 8, true)
    );
    let s = ok("attention x {\n dtype bf16\n head_dim 64/64\n heads 16 kv 4\n}");
    assert_eq!(
        (s.dtype, s.head_dim_qk, s.head_dim_v, s.q_heads, s.kv_heads, s.pack_gqa),
        (DType::Bf16, 64, 64, 16, 4, false)
    );
    let s = ok("attention x {\n head_dim 64\n heads 16 kv 1 pack_gqa\n}");
    assert_eq!((s.kv_heads, s.pack_gqa), (1, true));
}

#[test]
fn declarations() {
    let s = ok(&body("param prefix: int\nparam temp: float\naux doc: int[batch, seqlen_k]\naux blocks: int[batch, seqlen_q, q_heads, 7]\naux per_kv: int[kv_heads]"));
    assert_eq!(
        s.params,
        vec![ParamDecl { name: "prefix".into(), ty: Ty::Int }, ParamDecl { name: "temp".into(), ty: Ty::Float }]
    );
    assert_eq!(
        s.aux,
        vec![
            AuxDecl::int("doc", vec![AuxDim::Batch, AuxDim::MaxSeqlenK]),
            AuxDecl::int("blocks", vec![AuxDim::Batch, AuxDim::MaxSeqlenQ, AuxDim::QHeads, AuxDim::Fixed(7)]),
            AuxDecl::int("per_kv", vec![AuxDim::KvHeads]),
        ]
    );
}

#[test]
fn other_settings() {
    let s = ok(&body("scale 0.125\nsinks\nkv paged(page_size=16)\nsplit auto\nlse\nsoftmax exp2_emulation=0.15 rescale_threshold=8.0"));
    assert_eq!(s.scale, Scale::Value(0.125));
    assert!(s.sinks && s.lse);
    assert_eq!(s.kv_layout, KvLayout::Paged { page_size: 16 });
    assert_eq!(s.split_kv, SplitKv::Auto);
    assert_eq!(s.softmax, SoftmaxOptions { exp2_emulation: 0.15, rescale_threshold: 8.0 });

    let s = ok(&body("scale 1\nkv varlen\nsplit 4\nsoftmax rescale_threshold=8"));
    assert_eq!(s.scale, Scale::Value(1.0));
    assert_eq!(s.kv_layout, KvLayout::Varlen);
    assert_eq!(s.split_kv, SplitKv::Fixed(4));
    assert_eq!(s.softmax, SoftmaxOptions { exp2_emulation: 0.0, rescale_threshold: 8.0 });

    let s = ok(&body("kv contiguous\nsplit none\nsoftmax exp2_emulation=1e-1"));
    assert_eq!((s.kv_layout, s.split_kv), (KvLayout::Contiguous, SplitKv::None));
    assert_eq!(s.softmax.exp2_emulation, 0.1);
    // Options in any order, page sizes that are not powers of two.
    let s = ok(&body("kv paged(page_size=1)\nsoftmax rescale_threshold=4.0 exp2_emulation=0.5"));
    assert_eq!(s.kv_layout, KvLayout::Paged { page_size: 1 });
    assert_eq!(s.softmax, SoftmaxOptions { exp2_emulation: 0.5, rescale_threshold: 4.0 });
}

#[test]
fn mask_none_and_causal() {
    assert!(ok(&body("mask none")).mask.is_none());
    let m = ok(&body("mask causal")).mask;
    assert_eq!((m.causal, m.window, m.predicate), (Some(Align::TopLeft), None, None));
    assert_eq!(ok(&body("mask causal(top_left)")).mask.causal, Some(Align::TopLeft));
    assert_eq!(ok(&body("mask causal(bottom_right)")).mask.causal, Some(Align::BottomRight));
}

#[test]
fn windows_and_their_alignment() {
    let w = |m: &str| ok(&body(&format!("mask {m}"))).mask.window;
    assert_eq!(w("window(left=4096)"), Some(Window { left: Some(4096), right: None, align: Align::TopLeft }));
    assert_eq!(w("window(right=3)"), Some(Window { left: None, right: Some(3), align: Align::TopLeft }));
    assert_eq!(
        w("window(right=0, left=4095, align=bottom_right)"),
        Some(Window { left: Some(4095), right: Some(0), align: Align::BottomRight })
    );
    // The window inherits the causal alignment, wherever causal is among the conjuncts.
    let br = Some(Window { left: Some(8), right: None, align: Align::BottomRight });
    assert_eq!(w("causal(bottom_right) && window(left=8)"), br);
    assert_eq!(w("window(left=8) && causal(bottom_right)"), br);
    assert_eq!(w("window(left=8, align=bottom_right) && causal(bottom_right)"), br);
    assert_eq!(w("causal && window(left=8)").map(|w| w.align), Some(Align::TopLeft));
}

#[test]
fn mask_conjuncts_leave_the_predicate_shape_intact() {
    let dq = || Expr::aux("t", vec![v(Var::B), v(Var::Q)]);
    let dk = || Expr::aux("t", vec![v(Var::B), v(Var::K)]);
    let doc = || bin(BinOp::Eq, dq(), dk());
    let lt = || bin(BinOp::Lt, v(Var::K), Expr::param("i"));
    for src in [
        "causal && window(left=3) && t[b, q] == t[b, k]",
        "t[b, q] == t[b, k] && causal && window(left=3)",
        "causal && (window(left=3) && t[b, q] == t[b, k])",
        "window(left=3) && t[b, q] == t[b, k] && causal",
    ] {
        let m = ok(&body(&format!("aux t: int[batch, 4]\nmask {src}"))).mask;
        assert_eq!(m.causal, Some(Align::TopLeft), "{src}");
        assert!(m.window.is_some(), "{src}");
        assert_eq!(m.predicate, Some(doc()), "{src}");
    }
    // Left-assoc chains keep their shape, and so do explicitly right-nested ones.
    let m = ok(&body("param i: int\naux t: int[batch, 4]\nmask causal && t[b, q] == t[b, k] && k < i")).mask;
    assert_eq!(m.predicate, Some(bin(BinOp::And, doc(), lt())));
    let m = ok(&body("param i: int\naux t: int[batch, 4]\nmask causal && t[b, q] == t[b, k] && (k < i && k < i)")).mask;
    assert_eq!(m.predicate, Some(bin(BinOp::And, doc(), bin(BinOp::And, lt(), lt()))));
    // Without causal/window the expression is the predicate as written.
    assert_eq!(pred("k <= q || k < i"), bin(BinOp::Or, bin(BinOp::Le, v(Var::K), v(Var::Q)), lt()));
}

#[test]
fn literals_and_variables() {
    assert_eq!(score("1.5"), Expr::float(1.5));
    assert_eq!(score("1e3"), Expr::float(1000.0));
    assert_eq!(score("2.5E-2"), Expr::float(0.025));
    assert_eq!(pred("true"), Expr::bool(true));
    assert_eq!(pred("!false"), Expr::unary(UnOp::Not, Expr::bool(false)));
    for var in Var::ALL {
        if var != Var::Score {
            assert_eq!(pred(&format!("{} == 0", var.name())), bin(BinOp::Eq, v(var), Expr::int(0)));
        }
    }
    assert_eq!(score("score"), v(Var::Score));
    assert_eq!(score("f"), Expr::param("f"));
    assert_eq!(pred("t[b, 3] == i"), bin(BinOp::Eq, Expr::aux("t", vec![v(Var::B), Expr::int(3)]), Expr::param("i")));
}

#[test]
fn negative_literals_fold_and_negation_of_literals_does_not() {
    assert_eq!(pred("q == -5"), bin(BinOp::Eq, v(Var::Q), Expr::int(-5)));
    assert_eq!(pred("q == - 5"), bin(BinOp::Eq, v(Var::Q), Expr::int(-5)));
    assert_eq!(pred("q == -2147483648"), bin(BinOp::Eq, v(Var::Q), Expr::int(i32::MIN as i64)));
    assert_eq!(pred("q == -(5)"), bin(BinOp::Eq, v(Var::Q), Expr::unary(UnOp::Neg, Expr::int(5))));
    assert_eq!(pred("q == --5"), bin(BinOp::Eq, v(Var::Q), Expr::unary(UnOp::Neg, Expr::int(-5))));
    assert_eq!(pred("q - -5 > 0"), bin(BinOp::Gt, bin(BinOp::Sub, v(Var::Q), Expr::int(-5)), Expr::int(0)));
    assert_eq!(score("-1.5 * score"), bin(BinOp::Mul, Expr::float(-1.5), v(Var::Score)));
    assert_eq!(score("-score * 2.0"), bin(BinOp::Mul, Expr::unary(UnOp::Neg, v(Var::Score)), Expr::float(2.0)));
    assert_eq!(score("-0.0"), Expr::float(-0.0));
}

#[test]
fn precedence_and_associativity() {
    let (q, k, h) = (|| v(Var::Q), || v(Var::K), || v(Var::H));
    // * / % > + - > comparisons > == != > && > ||
    assert_eq!(pred("q + k * h == 1"), bin(BinOp::Eq, bin(BinOp::Add, q(), bin(BinOp::Mul, k(), h())), Expr::int(1)));
    assert_eq!(pred("q - k - h < 0"), bin(BinOp::Lt, bin(BinOp::Sub, bin(BinOp::Sub, q(), k()), h()), Expr::int(0)));
    assert_eq!(pred("q / k % h < 0"), bin(BinOp::Lt, bin(BinOp::Rem, bin(BinOp::Div, q(), k()), h()), Expr::int(0)));
    assert_eq!(pred("q - (k - h) < 0"), bin(BinOp::Lt, bin(BinOp::Sub, q(), bin(BinOp::Sub, k(), h())), Expr::int(0)));
    assert_eq!(pred("q < k == k > h"), bin(BinOp::Eq, bin(BinOp::Lt, q(), k()), bin(BinOp::Gt, k(), h())));
    let (a, b, c) = (|| bin(BinOp::Ge, q(), k()), || bin(BinOp::Ne, k(), h()), || bin(BinOp::Le, h(), q()));
    assert_eq!(pred("q >= k || k != h && h <= q"), bin(BinOp::Or, a(), bin(BinOp::And, b(), c())));
    assert_eq!(pred("q >= k && k != h || h <= q"), bin(BinOp::Or, bin(BinOp::And, a(), b()), c()));
    assert_eq!(
        pred("!(q >= k) || !!(k != h)"),
        bin(BinOp::Or, Expr::unary(UnOp::Not, a()), Expr::unary(UnOp::Not, Expr::unary(UnOp::Not, b())))
    );
    assert_eq!(pred("-q * k < 0"), bin(BinOp::Lt, bin(BinOp::Mul, Expr::unary(UnOp::Neg, q()), k()), Expr::int(0)));
}

#[test]
fn every_function() {
    let s = || v(Var::Score);
    for f in Func::ALL {
        let (src, want) = match f {
            Func::Min | Func::Max => (format!("{}(score, 1.0)", f.name()), Expr::call(f, vec![s(), Expr::float(1.0)])),
            Func::Softcap => (format!("{}(score, 1.0)", f.name()), Expr::call(f, vec![s(), Expr::float(1.0)])),
            Func::Select => (
                "select(q < k, score, 0.0)".to_string(),
                Expr::call(f, vec![bin(BinOp::Lt, v(Var::Q), v(Var::K)), s(), Expr::float(0.0)]),
            ),
            Func::ToFloat => ("float(q)".to_string(), Expr::call(f, vec![v(Var::Q)])),
            Func::ToInt => ("float(int(score))".to_string(), Expr::call(Func::ToFloat, vec![Expr::call(f, vec![s()])])),
            Func::Abs => ("abs(score)".to_string(), Expr::call(f, vec![s()])),
            _ => (format!("{}(score)", f.name()), Expr::call(f, vec![s()])),
        };
        assert_eq!(score(&src), want, "{src}");
    }
    assert_eq!(
        pred("min(q, k) == max(q, abs(k))"),
        bin(
            BinOp::Eq,
            Expr::call(Func::Min, vec![v(Var::Q), v(Var::K)]),
            Expr::call(Func::Max, vec![v(Var::Q), Expr::call(Func::Abs, vec![v(Var::K)])])
        )
    );
}

#[test]
fn newlines_inside_parentheses_and_brackets_continue_the_line() {
    let one = pred("(k <= q || k < i) && t[b, q] == t[b, k]");
    let many = pred("(k <= q\n      || k < i) && t[b,\n q] == t[b, k]");
    assert_eq!(one, many);
    let many = pred("(\n  (k <= q || k < i)\n  && t[b, q] == t[b, k]\n)");
    assert_eq!(one, many);
    let s = ok(&body("aux t: int[\n batch,\n 4\n]\nmask window(\n left=4,\n right=0\n)"));
    assert_eq!(s.mask.window.and_then(|w| w.left), Some(4));
}

#[test]
fn causal_and_window_are_not_reserved_names() {
    // A param named `causal` takes the bare word; `causal(top_left)` is still the mask.
    let s = ok(&body("param causal: int\nparam window: int\nmask causal(top_left) && k < causal + window"));
    assert_eq!(s.mask.causal, Some(Align::TopLeft));
    assert_eq!(
        s.mask.predicate,
        Some(bin(BinOp::Lt, v(Var::K), bin(BinOp::Add, Expr::param("causal"), Expr::param("window"))))
    );
    let text = print(&s);
    assert!(text.contains("mask causal(top_left) && k < causal + window"), "{text}");
    assert_eq!(parse(&text).ok(), Some(s));
    // Aux tensors called `causal` / `window` are indexed, so they never clash.
    let s = ok(&body("aux causal: int[4]\naux window: int[4]\nmask causal && window[q] == causal[k]"));
    assert_eq!(s.mask.causal, Some(Align::TopLeft));
    // Settings keywords are fine as names and as the variant name.
    let s = ok("attention mask {\n head_dim 64\n heads 2\n param heads: int\n param none: int\n mask none < heads\n}");
    assert_eq!(s.name, "mask");
    assert!(s.mask.predicate.is_some());
}

#[test]
fn spans_point_into_the_source() {
    let src = body("mask causal && q / 8192 == k / 8192");
    let s = ok(&src);
    let p = s.mask.predicate.unwrap_or_else(|| Expr::int(0));
    assert_eq!(&src[p.span.start..p.span.end], "q / 8192 == k / 8192");
    if let ExprKind::Binary(_, a, _) = &p.kind {
        assert_eq!(&src[a.span.start..a.span.end], "q / 8192");
    } else {
        panic!("{p:?}");
    }
}

#[test]
fn printer_output_is_canonical() {
    let s = ok("attention g {\nmask window(left=4095,right=0)&&causal\nhead_dim 256\nscore softcap(score,50.0)\nheads 16 kv 8 pack_gqa\n}");
    assert_eq!(
        print(&s),
        "attention g {\n  dtype bf16\n  head_dim 256\n  heads 16 kv 8 pack_gqa\n  mask causal && window(left=4095, right=0)\n  score softcap(score, 50.0)\n}\n"
    );
    let mut s = Spec::new("n", 128, 4);
    s.score_mod = Some(Expr::unary(UnOp::Neg, Expr::float(1.0)));
    s.mask.predicate = Some(bin(
        BinOp::Sub,
        bin(BinOp::Sub, v(Var::Q), bin(BinOp::Add, v(Var::K), Expr::int(-1))),
        Expr::unary(UnOp::Neg, Expr::int(-3)),
    ));
    s.mask.window = Some(Window { left: Some(1), right: None, align: Align::BottomRight });
    let text = print(&s);
    assert!(text.contains("  score -(1.0)\n"), "{text}");
    assert!(text.contains("  mask window(left=1, align=bottom_right) && q - (k + -1) - -(-3)\n"), "{text}");
}

#[test]
fn float_and_learnable_aux_tensors() {
    let s = ok(&body(
        "aux doc: int[batch, seqlen_k]\naux bias: float[q_heads, 32] learnable\naux gate: float[seqlen_q]\n\
         mask causal && doc[b, q] == doc[b, k] && gate[q] > 0.5\n\
         score score + bias[h, min(abs(q - k), 31)]",
    ));
    assert_eq!(
        s.aux,
        vec![
            AuxDecl::int("doc", vec![AuxDim::Batch, AuxDim::MaxSeqlenK]),
            AuxDecl::float("bias", vec![AuxDim::QHeads, AuxDim::Fixed(32)], true),
            AuxDecl::float("gate", vec![AuxDim::MaxSeqlenQ], false),
        ]
    );
    let idx =
        Expr::call(Func::Min, vec![Expr::call(Func::Abs, vec![bin(BinOp::Sub, v(Var::Q), v(Var::K))]), Expr::int(31)]);
    assert_eq!(s.score_mod, Some(bin(BinOp::Add, v(Var::Score), Expr::aux("bias", vec![v(Var::H), idx]))));
    let text = print(&s);
    assert!(text.contains("  aux bias: float[q_heads, 32] learnable\n  aux gate: float[seqlen_q]\n"), "{text}");
    assert_eq!(parse(&text).ok(), Some(s));
    // A float aux may be compared in a mask however its value was computed, and read
    // freely in a score; `learnable` may be spread over lines inside brackets only.
    ok(&body("aux g: float[4]\nmask select(q < k, g[q] * 2.0, -g[k]) >= min(g[0], 1.0) || k < q"));
    ok(&body("aux g: float[4] learnable\nscore score * exp(g[int(score)]) + float(int(g[q]))"));
    ok(&body("aux g: float[\n  4\n] learnable"));
    // The keyword is not reserved.
    let s = ok(&body("param learnable: int\naux learnable_x: float[4]\nmask k < learnable"));
    assert!(!s.aux[0].learnable);
}

#[test]
fn cache_key_sees_aux_element_type_and_learnability() {
    let int = ok(&body("aux t: int[4]"));
    let float = ok(&body("aux t: float[4]"));
    let learnable = ok(&body("aux t: float[4] learnable"));
    let keys = [int.cache_key(), float.cache_key(), learnable.cache_key()];
    assert!(keys[0] != keys[1] && keys[1] != keys[2] && keys[0] != keys[2], "{keys:?}");
}
