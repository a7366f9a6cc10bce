//! Precision of the tile mask analysis on the masks that matter: for causal (both
//! alignments), sliding windows, chunked local attention and prefix-LM, every tile is
//! classified *exactly* (what brute force says), including odd tile sizes and
//! seqlen_q ≠ seqlen_k; and the familiar pictures hold (diagonal Partial, below Full,
//! above Empty).

use attnc_ir::analysis::{classify, mask_facts, IntRange, TileClass, TileQuery};
use attnc_ir::eval::{eval, AuxTensor, Env, Value};
use attnc_ir::{Align, AuxDecl, AuxDim, BinOp, Expr, ParamDecl, Spec, Ty, Var, Window};

fn spec() -> Spec {
    Spec::new("p", 128, 2)
}

fn tile(spec: &Spec, qt: (i64, i64), kt: (i64, i64), sq: i64, sk: i64, params: &[i64]) -> TileQuery {
    let mut t = TileQuery::tile(spec, 0, 1, IntRange::span(qt.0, qt.1), IntRange::span(kt.0, kt.1), sq, sk);
    t.params = params.iter().map(|&p| Some(IntRange::point(p))).collect();
    t
}

/// What the tile really is, by evaluating every element.
fn exact(spec: &Spec, t: &TileQuery, params: &[Value], aux: &[AuxTensor]) -> TileClass {
    let Some(pred) = spec.mask.to_predicate() else { return TileClass::Full };
    let (mut any_true, mut any_false) = (false, false);
    for q in t.q.lo..=t.q.hi {
        for k in t.k.lo..=t.k.hi {
            let env = Env {
                b: t.b.lo as i32,
                h: t.h.lo as i32,
                hkv: t.hkv.lo as i32,
                q: q as i32,
                k: k as i32,
                score: 0.0,
                seqlen_q: t.seqlen_q.lo as i32,
                seqlen_k: t.seqlen_k.lo as i32,
                q_heads: t.q_heads,
                kv_heads: t.kv_heads,
                params,
                aux,
            };
            if eval(spec, &pred, &env).as_bool() {
                any_true = true;
            } else {
                any_false = true;
            }
        }
    }
    match (any_true, any_false) {
        (true, false) => TileClass::Full,
        (false, true) => TileClass::Empty,
        _ => TileClass::Partial,
    }
}

/// Every tile of a (sq × sk) problem with (bm × bn) tiles (the last ones clipped);
/// returns the grid of classes after asserting each is exact.
fn assert_exact_grid(spec: &Spec, sq: i64, sk: i64, bm: i64, bn: i64, params: &[i64]) -> Vec<Vec<TileClass>> {
    let values: Vec<Value> = params.iter().map(|&p| Value::Int(p as i32)).collect();
    let mut grid = Vec::new();
    for q0 in (0..sq).step_by(bm as usize) {
        let mut row = Vec::new();
        for k0 in (0..sk).step_by(bn as usize) {
            let t = tile(spec, (q0, bm.min(sq - q0)), (k0, bn.min(sk - k0)), sq, sk, params);
            let got = classify(spec, &t);
            let want = exact(spec, &t, &values, &[]);
            assert_eq!(got, want, "{:?}: tile q {:?} k {:?} (sq {sq}, sk {sk})", spec.mask, t.q, t.k);
            row.push(got);
        }
        grid.push(row);
    }
    grid
}

const SHAPES: [(i64, i64, i64, i64); 7] = [
    (256, 256, 64, 64),
    (256, 256, 128, 64),
    (200, 300, 48, 80),
    (300, 200, 64, 48),
    (7, 13, 4, 4),
    (100, 333, 64, 64),
    (1, 500, 16, 128),
];

#[test]
fn causal_top_left_is_exact_and_looks_right() {
    let mut s = spec();
    s.mask.causal = Some(Align::TopLeft);
    for (sq, sk, bm, bn) in SHAPES {
        assert_exact_grid(&s, sq, sk, bm, bn, &[]);
    }
    let g = assert_exact_grid(&s, 256, 256, 64, 64, &[]);
    for (i, row) in g.iter().enumerate() {
        for (j, c) in row.iter().enumerate() {
            let want = match j.cmp(&i) {
                std::cmp::Ordering::Less => TileClass::Full,
                std::cmp::Ordering::Equal => TileClass::Partial,
                std::cmp::Ordering::Greater => TileClass::Empty,
            };
            assert_eq!(*c, want, "tile ({i}, {j})");
        }
    }
}

#[test]
fn causal_bottom_right_is_exact_and_looks_right() {
    let mut s = spec();
    s.mask.causal = Some(Align::BottomRight);
    for (sq, sk, bm, bn) in SHAPES {
        assert_exact_grid(&s, sq, sk, bm, bn, &[]);
    }
    // seqlen_q 128, seqlen_k 320: query i sees keys ≤ i + 192.
    let g = assert_exact_grid(&s, 128, 320, 64, 64, &[]);
    for (i, row) in g.iter().enumerate() {
        for (j, c) in row.iter().enumerate() {
            let want = if j <= i + 2 {
                TileClass::Full
            } else if j == i + 3 {
                TileClass::Partial
            } else {
                TileClass::Empty
            };
            assert_eq!(*c, want, "tile ({i}, {j})");
        }
    }
    // Decoding: one query sees every key.
    let t = tile(&s, (0, 1), (0, 512), 1, 512, &[]);
    assert_eq!(classify(&s, &t), TileClass::Full);
    // More queries than keys: the first rows see nothing.
    let t = tile(&s, (0, 64), (0, 64), 300, 100, &[]);
    assert_eq!(classify(&s, &t), TileClass::Empty);
}

#[test]
fn sliding_windows_are_exact() {
    for (left, right, align) in [
        (Some(100), Some(0), Align::TopLeft),
        (Some(37), Some(5), Align::BottomRight),
        (Some(0), Some(0), Align::TopLeft),
        (None, Some(64), Align::TopLeft),
        (Some(255), None, Align::BottomRight),
    ] {
        let mut s = spec();
        s.mask.window = Some(Window { left, right, align });
        for (sq, sk, bm, bn) in SHAPES {
            assert_exact_grid(&s, sq, sk, bm, bn, &[]);
        }
        s.mask.causal = Some(align);
        for (sq, sk, bm, bn) in SHAPES {
            assert_exact_grid(&s, sq, sk, bm, bn, &[]);
        }
    }
    // Window (100, 0) top-left with 64-tiles: query q sees keys q − 100 ..= q. Tile (3, 2)
    // (q 192..255, k 128..191) is cut by k ≥ q − 100 → Partial; tile (3, 1) (k 64..127)
    // too (q 192 sees k ≥ 92); tile (3, 0) (k < 64 ≤ 92) → Empty.
    let mut s = spec();
    s.mask.window = Some(Window { left: Some(100), right: Some(0), align: Align::TopLeft });
    let g = assert_exact_grid(&s, 256, 256, 64, 64, &[]);
    assert_eq!(g[3][3], TileClass::Partial);
    assert_eq!(g[3][2], TileClass::Partial);
    assert_eq!(g[3][1], TileClass::Partial);
    assert_eq!(g[3][0], TileClass::Empty);
    assert_eq!(g[0][1], TileClass::Empty);
    // With a wider window a tile below the diagonal is Full.
    s.mask.window = Some(Window { left: Some(200), right: Some(0), align: Align::TopLeft });
    let g = assert_exact_grid(&s, 256, 256, 64, 64, &[]);
    assert_eq!(g[3][2], TileClass::Full);
    assert_eq!(g[3][0], TileClass::Partial);
}

#[test]
fn chunked_local_is_exact() {
    let mut s = spec();
    let chunk = |v: Var| Expr::binary(BinOp::Div, Expr::var(v), Expr::int(64));
    s.mask.predicate = Some(Expr::binary(BinOp::Eq, chunk(Var::Q), chunk(Var::K)));
    for (sq, sk, bm, bn) in SHAPES {
        assert_exact_grid(&s, sq, sk, bm, bn, &[]);
    }
    let g = assert_exact_grid(&s, 256, 256, 64, 64, &[]);
    for (i, row) in g.iter().enumerate() {
        for (j, c) in row.iter().enumerate() {
            assert_eq!(*c, if i == j { TileClass::Full } else { TileClass::Empty });
        }
    }
    // Chunked and causal (Llama 4 style): the diagonal is Partial again.
    s.mask.causal = Some(Align::TopLeft);
    let g = assert_exact_grid(&s, 256, 256, 64, 64, &[]);
    assert_eq!(g[2][2], TileClass::Partial);
    assert_eq!(g[2][1], TileClass::Empty);
    // With 128-row q tiles a chunk boundary falls inside the tile.
    s.mask.causal = None;
    let g = assert_exact_grid(&s, 256, 256, 128, 64, &[]);
    assert_eq!(g[0], vec![TileClass::Partial, TileClass::Partial, TileClass::Empty, TileClass::Empty]);
}

#[test]
fn prefix_lm_is_exact() {
    let mut s = spec();
    s.params.push(ParamDecl { name: "prefix".into(), ty: Ty::Int });
    s.mask.predicate = Some(Expr::binary(
        BinOp::Or,
        Expr::binary(BinOp::Le, Expr::var(Var::K), Expr::var(Var::Q)),
        Expr::binary(BinOp::Lt, Expr::var(Var::K), Expr::param("prefix")),
    ));
    for prefix in [0, 1, 64, 100, 128, 1000] {
        for (sq, sk, bm, bn) in SHAPES {
            assert_exact_grid(&s, sq, sk, bm, bn, &[prefix]);
        }
    }
    // prefix 128 with 64-tiles: the first two key tiles are Full for every query tile.
    let g = assert_exact_grid(&s, 256, 256, 64, 64, &[128]);
    assert_eq!(g[0], vec![TileClass::Full, TileClass::Full, TileClass::Empty, TileClass::Empty]);
    assert_eq!(g[2], vec![TileClass::Full, TileClass::Full, TileClass::Partial, TileClass::Empty]);
    assert_eq!(g[3], vec![TileClass::Full, TileClass::Full, TileClass::Full, TileClass::Partial]);
    // An unknown prefix: only what causality alone decides.
    let mut t = tile(&s, (192, 64), (0, 64), 256, 256, &[]);
    t.params = vec![None];
    assert_eq!(classify(&s, &t), TileClass::Full);
    let mut t = tile(&s, (0, 64), (192, 64), 256, 256, &[]);
    t.params = vec![None];
    assert_eq!(classify(&s, &t), TileClass::Partial);
}

#[test]
fn aux_masks_are_never_full_but_still_skip_what_causality_excludes() {
    let mut s = spec();
    s.aux.push(AuxDecl::int("doc", vec![AuxDim::Batch, AuxDim::MaxSeqlenK]));
    s.mask.causal = Some(Align::TopLeft);
    s.mask.predicate = Some(Expr::binary(
        BinOp::Eq,
        Expr::aux("doc", vec![Expr::var(Var::B), Expr::var(Var::Q)]),
        Expr::aux("doc", vec![Expr::var(Var::B), Expr::var(Var::K)]),
    ));
    let t = |q0, k0| tile(&s, (q0, 64), (k0, 64), 256, 256, &[]);
    assert_eq!(classify(&s, &t(128, 0)), TileClass::Partial);
    assert_eq!(classify(&s, &t(0, 128)), TileClass::Empty);
    let f = mask_facts(&s);
    assert!(f.reads_aux && f.needs_elementwise && f.uses_batch && !f.reads_params);
}

#[test]
fn gqa_packed_tiles_mixing_heads() {
    // A mask that depends on the head: a packed tile spanning heads 0..4 is Partial,
    // single-head tiles are decided.
    let mut s = Spec::new("g", 128, 8);
    s.kv_heads = 2;
    s.mask.predicate = Some(Expr::binary(BinOp::Lt, Expr::var(Var::H), Expr::int(2)));
    let mut t = TileQuery::tile(&s, 0, 0, IntRange::span(0, 64), IntRange::span(0, 64), 64, 64);
    assert_eq!(classify(&s, &t), TileClass::Full);
    t.h = IntRange::new(0, 3);
    assert_eq!(classify(&s, &t), TileClass::Partial);
    t.h = IntRange::new(4, 7);
    t.hkv = IntRange::point(1);
    assert_eq!(classify(&s, &t), TileClass::Empty);
}

#[test]
fn empty_tiles_and_extreme_ranges_do_not_panic() {
    let mut s = spec();
    s.mask.causal = Some(Align::BottomRight);
    let mut t = tile(&s, (0, 0), (0, 64), 64, 64, &[]);
    assert_eq!(classify(&s, &t), TileClass::Empty);
    t.q = IntRange::new(i64::MIN, i64::MAX);
    t.k = IntRange::new(i64::MAX, i64::MIN);
    t.seqlen_q = IntRange::new(i64::MAX, i64::MIN);
    let _ = classify(&s, &t);
    t.k = IntRange::TOP;
    assert_eq!(classify(&s, &t), TileClass::Partial);
}
