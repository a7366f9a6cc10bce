//! Every file in `dsl-examples/` parses, round-trips and says what it is.

use crate::{parse, parse_file, print};
use attnc_ir::{Align, AuxDecl, AuxDim, Expr, ExprKind, Func, KvLayout, Scale, Spec, SplitKv};
use std::path::PathBuf;
use std::sync::OnceLock;

pub(crate) fn examples_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../dsl-examples")
}

/// (file name, text) of every `.attn` example, sorted by name.
pub(crate) fn examples() -> &'static [(String, String)] {
    static FILES: OnceLock<Vec<(String, String)>> = OnceLock::new();
    FILES.get_or_init(|| {
        let mut files: Vec<(String, String)> = std::fs::read_dir(examples_dir())
            .map(|rd| rd.filter_map(Result::ok).map(|e| e.path()).collect::<Vec<_>>())
            .unwrap_or_default()
            .into_iter()
            .filter(|p| p.extension().is_some_and(|e| e == "attn"))
            .filter_map(|p| {
                let name = p.file_name()?.to_string_lossy().into_owned();
                Some((name, std::fs::read_to_string(&p).ok()?))
            })
            .collect();
        files.sort();
        files
    })
}

fn example(name: &str) -> Spec {
    let path = examples_dir().join(name);
    match parse_file(&path) {
        Ok(s) => s,
        Err(d) => panic!("{d}"),
    }
}

#[test]
fn every_example_parses_round_trips_and_has_a_header() {
    let files = examples();
    assert!(files.len() >= 12, "only {} examples in {}", files.len(), examples_dir().display());
    for (name, text) in files {
        let spec = example(name);
        assert_eq!(format!("{}.attn", spec.name), *name, "the variant is named after its file");
        let header: Vec<&str> = text.lines().take_while(|l| l.starts_with("//")).collect();
        assert!(
            header.len() >= 2 && header[0].starts_with(&format!("// {name} — ")),
            "{name}: needs a comment header `// {name} — what it is`"
        );
        assert!(header.iter().any(|l| l.contains("Used in")), "{name}: the header should say where it is used");
        let printed = print(&spec);
        assert_eq!(parse(&printed).ok().as_ref(), Some(&spec), "{name} does not round-trip:\n{printed}");
    }
}

#[test]
fn examples_mean_what_their_headers_say() {
    let s = example("gemma2.attn");
    assert_eq!((s.head_dim_qk, s.q_heads, s.kv_heads, s.pack_gqa), (256, 16, 8, true));
    assert_eq!(s.mask.causal, Some(Align::TopLeft));
    assert_eq!(s.mask.window.map(|w| (w.left, w.right)), Some((Some(4095), Some(0))));
    assert!(matches!(&s.score_mod, Some(e) if matches!(&e.kind, ExprKind::Call(Func::Softcap, _))));

    let s = example("sinks.attn");
    assert!(s.sinks);
    assert_eq!((s.head_dim_qk, s.q_heads, s.kv_heads), (64, 64, 8));
    assert_eq!(s.mask.window.and_then(|w| w.left), Some(127));

    let s = example("gqa_decode_paged.attn");
    assert_eq!((s.q_heads, s.kv_heads, s.pack_gqa, s.lse), (32, 8, true, true));
    assert_eq!((s.kv_layout, s.split_kv), (KvLayout::Paged { page_size: 16 }, SplitKv::Auto));

    let s = example("deepseek.attn");
    assert_eq!((s.head_dim_qk, s.head_dim_v), (192, 128));
    assert_eq!(example("causal_bottom_right.attn").mask.causal, Some(Align::BottomRight));
    assert_eq!(example("sliding_window.attn").mask.window.and_then(|w| w.left), Some(4096));
    assert_eq!(example("prefix_lm.attn").params.len(), 1);
    assert_eq!(example("document_mask.attn").aux.len(), 1);
    assert!(example("chunked_local.attn").mask.predicate.is_some());
    assert!(example("alibi.attn").score_mod.is_some());
    assert!(example("mha.attn").mask.is_none());
    assert!(example("fa4_numerics.attn").softmax.exp2_emulation > 0.0);

    let s = example("t5_bias.attn");
    assert_eq!(s.aux, vec![AuxDecl::float("bias", vec![AuxDim::QHeads, AuxDim::Fixed(32)], true)]);
    assert_eq!((s.scale, s.mask.causal), (Scale::Value(1.0), Some(Align::TopLeft)));
    let g = attnc_ir::score_mod_grad(&s).expect("a score mod");
    assert_eq!((g.d_score, g.aux.len()), (Expr::float(1.0), 1));
    let s = example("alibi_learned.attn");
    assert_eq!(s.aux, vec![AuxDecl::float("slopes", vec![AuxDim::QHeads], true)]);
    let g = attnc_ir::score_mod_grad(&s).expect("a score mod");
    assert_eq!(crate::print_expr(&g.aux[0].d), "-float(q - k)");
}
