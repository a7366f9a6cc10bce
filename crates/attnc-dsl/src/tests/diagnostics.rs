//! Every class of diagnostic: where it points and what it says.
//! `body(...)` puts its text on line 4 (lines 1-3 are the header and required settings).

use super::{body, err_at, errs, ok};
use crate::{parse, parse_bytes, parse_file, parse_named, MAX_DEPTH};

#[test]
fn display_is_rustc_like() {
    let src = "attention x {\n  dtype bf16\n  head_dim 100\n  heads 8\n}\n";
    let e = parse_named("dsl-examples/x.attn", src).unwrap_err();
    assert_eq!(e.len(), 1);
    assert_eq!(
        e.to_string(),
        "error: unsupported head_dim 100: expected one of 64, 96, 128, 192/128, 192, 256\n  --> dsl-examples/x.attn:3:12\n   |\n 3 |   head_dim 100\n   |            ^^^"
    );
    let d = &e.0[0];
    assert_eq!((d.file.as_str(), d.line, d.col, d.caret_len), ("dsl-examples/x.attn", 3, 12, 3));
    assert_eq!(d.source_line, "  head_dim 100");
    assert_eq!(parse(src).unwrap_err().0[0].file, "<input>");
}

// ---- range errors from attnc_ir::validate, mapped to the right place ---------------

#[test]
fn head_dims() {
    let d = err_at(
        "attention t {\n  head_dim 192/100\n  heads 8\n}",
        2,
        12,
        "unsupported head_dim 192/100: expected one of",
    );
    assert_eq!(d.caret_len, 7);
}

#[test]
fn page_size_and_split() {
    err_at(&body("kv paged(page_size=0)"), 4, 20, "page_size must be in 1..=65536, found 0");
    err_at(&body("kv paged(page_size=70000)"), 4, 20, "page_size must be in 1..=65536, found 70000");
    err_at(&body("split 0"), 4, 7, "split count must be in 1..=256, found 0");
    err_at(&body("split 300"), 4, 7, "split count must be in 1..=256, found 300");
}

#[test]
fn heads() {
    err_at("attention t {\n  head_dim 128\n  heads 8 pack_gqa\n}", 3, 11, "pack_gqa needs more q heads than kv heads");
    let d = err_at(
        "attention t {\n  head_dim 128\n  heads 8 kv 3\n}",
        3,
        9,
        "q heads (8) must be a multiple of kv heads (3)",
    );
    assert_eq!(d.caret_len, 6);
    err_at("attention t {\n  head_dim 128\n  heads 0\n}", 3, 9, "head counts must be in 1..=1024");
    err_at("attention t {\n  head_dim 128\n  heads 4096 kv 1\n}", 3, 9, "head counts must be in 1..=1024");
}

#[test]
fn alignment_and_windows() {
    err_at(
        &body("mask causal && window(left=4, align=bottom_right)"),
        4,
        37,
        "contradictory alignment: causal is top_left but the window is bottom_right: expected the same alignment",
    );
    err_at(&body("mask window(left=2, align=bottom_right) && causal(top_left)"), 4, 27, "contradictory alignment");
    err_at(&body("mask window(align=top_left)"), 4, 6, "a window needs a bound: expected `left=N`, `right=N` or both");
    err_at(
        &body("mask window(left=3000000000)"),
        4,
        18,
        "window bound 3000000000 is out of range: expected at most 2147483647",
    );
    err_at(
        &body("mask window(left=1, left=2)"),
        4,
        21,
        "`left` is given twice: expected each of left, right and align at most once",
    );
    err_at(
        &body("mask window(left=1) && window(right=2)"),
        4,
        24,
        "a second `window` in the mask (the first is at 4:6): expected at most one",
    );
    err_at(
        &body("mask causal && causal(bottom_right)"),
        4,
        16,
        "a second `causal` in the mask (the first is at 4:6): expected at most one",
    );
}

#[test]
fn numeric_settings() {
    err_at(&body("scale -0.5"), 4, 7, "softmax scale must be a positive finite number, found -0.5");
    err_at(&body("scale 0"), 4, 7, "softmax scale must be a positive finite number, found 0");
    err_at(&body("scale 1e999"), 4, 7, "`1e999` is out of range: expected a finite number");
    err_at(&body("softmax exp2_emulation=1.5"), 4, 24, "exp2_emulation is a fraction in [0, 1], found 1.5");
    err_at(&body("softmax exp2_emulation=0.5 rescale_threshold=-1.0"), 4, 46, "rescale_threshold must be in [0, 64]");
    err_at(
        "attention t {\n  dtype fp16\n  head_dim 64\n  heads 8\n  softmax rescale_threshold=16.0\n}",
        5,
        29,
        "rescale_threshold 16 would overflow fp16 probabilities (at most 15 for fp16)",
    );
    err_at(
        &body("softmax exp2_emulation=0.5 exp2_emulation=0.5"),
        4,
        28,
        "`exp2_emulation` is given twice: expected each option at most once",
    );
    err_at(
        &body("split 99999999999"),
        4,
        7,
        "`99999999999` is too large: expected a number of splits of at most 4294967295",
    );
    err_at(
        "attention t {\n  head_dim 128\n  heads 99999999999\n}",
        3,
        9,
        "is too large: expected a number of query heads",
    );
}

#[test]
fn aux_and_param_declarations() {
    err_at(&body("aux t: int[batch, 0]"), 4, 11, "aux tensor `t` has a dimension of size 0");
    err_at(&body("aux t: int[1, 2, 3, 4, 5]"), 4, 11, "aux tensor `t` needs 1 to 4 dimensions");
    err_at(
        &body("aux t: int[]"),
        4,
        12,
        "expected a dimension (batch, seqlen_q, seqlen_k, q_heads, kv_heads or a size), found `]`",
    );
    err_at(&body("aux t: int[batchh]"), 4, 12, "found `batchh` (did you mean `batch`?)");
    err_at(&body("aux t: bool[4]"), 4, 8, "expected `int` or `float`, found `bool`");
    err_at(&body("aux t: float[4] learned"), 4, 17, "expected `learnable` or end of line, found `learned`");
    err_at(&body("param p: bool"), 4, 10, "expected `int` or `float`, found `bool`");
    err_at(&body("param p int"), 4, 9, "expected `:`, found `int`");
    err_at(
        &body("param q: int"),
        4,
        7,
        "`q` is a built-in variable and cannot name a parameter: expected another name",
    );
    err_at(&body("param exp: float"), 4, 7, "`exp` is a built-in function and cannot name a parameter");
    err_at(&body("aux true: int[4]"), 4, 5, "`true` is a literal and cannot name an aux tensor");
    err_at(
        &body("param p: int\naux p: int[4]"),
        5,
        5,
        "`p` is already declared at 4:7: expected a new name for this aux tensor",
    );
}

// ---- float aux tensors: each misuse, rendered with its source line and caret ----------

/// Asserts the whole rendered diagnostic list (message, location, source line, caret).
#[track_caller]
fn renders(lines: &str, expected: &str) {
    let src = body(lines);
    let e = parse_named("t.attn", &src).unwrap_err();
    assert_eq!(e.to_string(), expected, "\n{e}");
}

#[test]
fn float_aux_misuse() {
    renders(
        "aux doc: int[batch, seqlen_k] learnable",
        "error: aux tensor `doc` is int and cannot be learnable: expected a float tensor (`aux doc: float[...] learnable`)
  --> t.attn:4:31
   |
 4 | aux doc: int[batch, seqlen_k] learnable
   |                               ^^^^^^^^^",
    );
    // In a mask a float value may only be compared.
    renders(
        "aux bias: float[q_heads, 32]\nmask k <= q + int(bias[h, 0] * 8.0)",
        "error: float aux tensor `bias` flows into `int(...)` in a mask: expected it only in a comparison (as in `bias[...] > 0.5`)
  --> t.attn:5:19
   |
 5 | mask k <= q + int(bias[h, 0] * 8.0)
   |                   ^^^^^^^^^^",
    );
    renders(
        "aux doc: int[batch, seqlen_k]\naux w: float[4]\nmask doc[b, int(select(q < k, w[0], w[1]))] == 0",
        "error: float aux tensor `w` flows into `int(...)` in a mask: expected it only in a comparison (as in `w[...] > 0.5`)
  --> t.attn:6:31
   |
 6 | mask doc[b, int(select(q < k, w[0], w[1]))] == 0
   |                               ^^^^",
    );
    // Reads are floats: strict typing applies.
    renders(
        "aux bias: float[q_heads]\nscore score + bias[h] * q",
        "error: type error: `*` mixes float and int; convert one side with float(...)
  --> t.attn:5:15
   |
 5 | score score + bias[h] * q
   |               ^^^^^^^^^^^",
    );
    renders(
        "aux bias: float[q_heads]\naux doc: int[4]\nmask doc[bias[h]] == 0",
        "error: type error: expected int for an aux index, found float (convert with int(...))
  --> t.attn:6:10
   |
 6 | mask doc[bias[h]] == 0
   |          ^^^^^^^",
    );
    renders(
        "aux bias: float[q_heads]\nmask bias[h]",
        "error: type error: a mask must be bool, found float
  --> t.attn:5:6
   |
 5 | mask bias[h]
   |      ^^^^^^^",
    );
    renders(
        "aux bias: float[q_heads]\nmask bias[h] == 1",
        "error: type error: `==` mixes float and int; convert one side with float(...)
  --> t.attn:5:6
   |
 5 | mask bias[h] == 1
   |      ^^^^^^^^^^^^",
    );
    renders(
        "aux bias: float[q_heads] learnable learnable",
        "error: expected end of line, found `learnable`
  --> t.attn:4:36
   |
 4 | aux bias: float[q_heads] learnable learnable
   |                                    ^^^^^^^^^",
    );
}

// ---- types: validate's errors carry the span of the node at fault ------------------

#[test]
fn type_errors_point_at_the_node() {
    let d = err_at(&body("mask q + 1"), 4, 6, "type error: a mask must be bool, found int");
    assert_eq!(d.caret_len, 5);
    err_at(&body("mask causal && q"), 4, 16, "type error: a mask must be bool, found int");
    let d = err_at(
        &body("score score - float(q) * 2"),
        4,
        15,
        "type error: `*` mixes float and int; convert one side with float(...)",
    );
    assert_eq!(d.caret_len, 12);
    err_at(&body("mask score > 0.0"), 4, 6, "`score` is only available in score modifications, not in masks");
    err_at(&body("score q"), 4, 7, "type error: a score modification must be float, found int");
    err_at(&body("score exp(score, score)"), 4, 7, "`exp` takes 1 argument(s), found 2");
    err_at(&body("score float(score)"), 4, 13, "type error: expected int for `float(...)`, found float");
    err_at(&body("mask q % 2.0 == 0"), 4, 6, "mixes int and float");
    err_at(&body("mask !q"), 4, 7, "type error: expected bool for `!`, found int");
}

// ---- names --------------------------------------------------------------------------

#[test]
fn unknown_names_with_suggestions() {
    err_at(
        &body("mask qq < k"),
        4,
        6,
        "unknown identifier `qq`: expected a variable (b, h, hkv, q, k, score, seqlen_q, seqlen_k, q_heads, kv_heads), a declared param or aux tensor (did you mean `q`?)",
    );
    err_at(&body("param prefix: int\nmask k < prefx"), 5, 10, "unknown identifier `prefx`: expected a variable (b, h, hkv, q, k, score, seqlen_q, seqlen_k, q_heads, kv_heads), a declared param or aux tensor (did you mean `prefix`?)");
    let d = err_at(&body("mask zzz < k"), 4, 6, "unknown identifier `zzz`");
    assert!(!d.message.contains("did you mean"), "{}", d.message);
    err_at(&body("score sofcap(score, 1.0)"), 4, 7, "unknown function `sofcap`: expected one of min, max, abs, select, float, int, exp, exp2, log, log2, sqrt, tanh, sigmoid, softcap (did you mean `softcap`?)");
    err_at(
        &body("aux doc: int[batch, seqlen_k]\nmask dc[b, q] == 0"),
        5,
        6,
        "unknown aux tensor `dc`: expected one declared with `aux dc: int[...]` (did you mean `doc`?)",
    );
    err_at(
        &body("aux doc: int[batch]\nmask doc == 0"),
        5,
        6,
        "aux tensor `doc` must be indexed: expected `doc[...]` with 1 index(es)",
    );
    err_at(
        &body("param p: int\nmask p[q] == 0"),
        5,
        6,
        "`p` is a parameter, not an aux tensor: expected `p` without an index",
    );
    err_at(&body("mask q[0] == 0"), 4, 6, "`q` is a variable, not an aux tensor");
    err_at(&body("score exp"), 4, 7, "`exp` is a function: expected a call like `exp(...)`");
}

#[test]
fn every_unknown_name_is_reported() {
    let e = errs(&body("mask aa < bb || foo(cc) == 0"));
    let cols: Vec<usize> = e.iter().map(|d| d.col).collect();
    assert_eq!(cols, vec![6, 11, 17, 21], "{}", crate::Diagnostics(e.clone()));
}

#[test]
fn causal_and_window_only_as_top_level_conjuncts() {
    let m = "`causal` may only appear as a top-level `&&` conjunct of `mask` (as in `mask causal && ...`): expected an int, float or bool expression here";
    err_at(&body("mask causal || q < k"), 4, 6, m);
    err_at(&body("mask !causal"), 4, 7, m);
    err_at(&body("mask q < k && (q < 2 || causal(bottom_right))"), 4, 25, m);
    err_at(&body("score select(causal, score, 0.0)"), 4, 14, m);
    err_at(
        &body("mask q < k && !(window(left=3))"),
        4,
        17,
        "`window` may only appear as a top-level `&&` conjunct of `mask` (as in `mask window(left=...) && ...`)",
    );
    err_at(&body("score window(left=1)"), 4, 7, "`window` may only appear");
}

// ---- syntax ---------------------------------------------------------------------------

#[test]
fn syntax_errors_say_what_was_expected() {
    err_at(
        "attention t {\n  head_dim 128\n  heads 8\n",
        3,
        10,
        "expected a setting or `}` to close the block opened at 1:13, found end of file",
    );
    err_at(&body("mask q <"), 4, 9, "expected an expression, found end of line (to continue an expression on the next line, wrap it in parentheses)");
    err_at(
        &body("mask causal\n  && q < k"),
        5,
        3,
        "expected a setting (dtype, head_dim, heads, param, aux, mask, score, ...) or `}`, found `&&`",
    );
    err_at(&body("mask (q < k"), 5, 1, "expected an operator or `)`, found `}`");
    err_at(&body("score min(score 1.0)"), 4, 17, "expected an operator, `,` or `)`, found `1.0`");
    err_at(&body("score exp(,)"), 4, 11, "expected `)` or an expression, found `,`");
    err_at(&body("head_dims 64"), 4, 1, "unknown setting `head_dims`: expected one of dtype, head_dim, heads, param, aux, mask, score, scale, sinks, kv, split, lse, shards, softmax (did you mean `head_dim`?)");
    err_at(&body("dtype f16"), 4, 7, "expected `bf16` or `fp16`, found `f16` (did you mean `fp16`?)");
    err_at(
        "attention t { head_dim 128; heads 8 }\nattention u { }",
        2,
        1,
        "expected end of file (a file holds exactly one `attention` block), found `attention`",
    );
    err_at("atention t {}", 1, 1, "expected `attention`, found `atention`");
    err_at("attention {}", 1, 11, "expected a variant name, found `{`");
    err_at("attention t\n  head_dim 128", 2, 3, "expected `{`, found `head_dim`");
    err_at(&body("mask q < k & k > 0"), 4, 12, "expected `&&` (logical and), found `&`");
    err_at(&body("mask q < k | k > 0"), 4, 12, "expected `||` (logical or), found `|`");
    err_at(&body("mask q = k"), 4, 8, "expected an operator or end of line, found `=` (compare with `==`)");
    err_at("attention t {\n  head_dim 128x\n  heads 8\n}", 2, 12, "invalid number `128x`: expected digits");
    err_at(&body("score score * 1."), 4, 15, "invalid number `1.`");
    err_at(&body("mask q < k @"), 4, 12, "unexpected character `@`: expected an operator or end of line");
    err_at(
        &body("mask q < \"k\""),
        4,
        10,
        "unexpected quote `\"`: the language has no strings: expected an expression",
    );
    err_at("attention t {\n  head_dim 128 256\n  heads 8\n}", 2, 16, "expected `/` or end of line, found `256`");
    err_at("attention t {\n  head_dim 128\n  heads 8 kv\n}", 3, 13, "expected a number of kv heads, found end of line");
    err_at(
        "attention t {\n  head_dim 128\n  heads 8 x\n}",
        3,
        11,
        "expected `kv`, `pack_gqa` or end of line, found `x`",
    );
    err_at(&body("kv paged"), 4, 9, "expected `(`, found end of line");
    err_at(&body("kv paged(size=16)"), 4, 10, "expected `page_size`, found `size`");
    err_at(&body("kv pagd"), 4, 4, "expected `contiguous`, `varlen` or `paged`, found `pagd` (did you mean `paged`?)");
    err_at(&body("split -1"), 4, 7, "expected a number of splits, `none` or `auto`, found `-`");
    err_at(&body("softmax"), 4, 8, "expected `exp2_emulation` or `rescale_threshold`, found end of line");
    err_at(
        &body("softmax exp2_emulation=0.1 x=1"),
        4,
        28,
        "expected `exp2_emulation` or `rescale_threshold`, found `x`",
    );
    err_at(&body("mask causal(left)"), 4, 13, "expected `top_left` or `bottom_right`, found `left`");
    err_at(
        &body("mask window(lft=3)"),
        4,
        13,
        "expected `left`, `right` or `align`, found `lft` (did you mean `left`?)",
    );
    err_at(&body("mask window(left=-3)"), 4, 18, "expected a window size, found `-`");
    err_at(&body("sinks 1"), 4, 7, "expected end of line, found `1`");
    err_at(
        &body(")"),
        4,
        1,
        "expected a setting (dtype, head_dim, heads, param, aux, mask, score, ...) or `}`, found `)`",
    );
}

#[test]
fn literal_ranges() {
    err_at(
        &body("mask q < 2147483648"),
        4,
        10,
        "integer literal `2147483648` is out of range: expected a 32-bit int (-2147483648 to 2147483647)",
    );
    err_at(&body("mask q < -2147483649"), 4, 10, "integer literal `-2147483649` is out of range");
    err_at(&body("mask q < 99999999999999999999999999"), 4, 10, "is out of range: expected a 32-bit int");
    err_at(&body("score score * 1e999"), 4, 15, "float literal `1e999` is out of range: expected a finite number");
    ok(&body("mask q < 2147483647 && q > -2147483648"));
}

#[test]
fn duplicates_and_missing_settings() {
    err_at(&body("heads 4"), 4, 1, "duplicate `heads`: already set at 3:3; expected each setting at most once");
    err_at(&body("mask causal\nscore score\nmask none"), 6, 1, "duplicate `mask`: already set at 4:1");
    err_at("attention t {\n  heads 8\n}", 1, 1, "missing `head_dim`: expected a setting like `head_dim 128`");
    let e = errs("attention t {\n}");
    assert_eq!(e.len(), 2);
    assert!(e[1].message.contains("missing `heads`: expected a setting like `heads 32`"), "{}", e[1].message);
    assert_eq!(e[0].caret_len, "attention t".len());
}

#[test]
fn recovery_reports_independent_errors_in_order() {
    let e = errs(&body("dtype f16\nmask q <\nsplit -1\nscale 2.0"));
    let at: Vec<(usize, usize)> = e.iter().map(|d| (d.line, d.col)).collect();
    assert_eq!(at, vec![(4, 7), (5, 9), (6, 7)], "{}", crate::Diagnostics(e.clone()));
    // Garbage everywhere: bounded number of diagnostics, no panic.
    let src = body(&"@ # x\n) ( ]\n".repeat(100));
    let e = errs(&src);
    assert!(e.len() <= crate::MAX_DIAGNOSTICS, "{}", e.len());
}

#[test]
fn depth_limits_are_diagnostics_not_stack_overflows() {
    let nested = |n: usize| body(&format!("mask {}q < k{}", "(".repeat(n), ")".repeat(n)));
    ok(&nested(MAX_DEPTH - 2));
    let d = err_at(&nested(100_000), 4, 6 + MAX_DEPTH, "expression is nested too deeply: expected at most 256 levels");
    assert_eq!(d.line, 4);
    ok(&body(&format!("mask {}true", "!".repeat(MAX_DEPTH - 2))));
    err_at(&body(&format!("score {}score", "-".repeat(1_000_000))), 4, 7 + MAX_DEPTH, "nested too deeply");
    err_at(
        &body(&format!("score {}score{}", "exp(".repeat(100_000), ")".repeat(100_000))),
        4,
        7 + 4 * MAX_DEPTH,
        "nested too deeply",
    );
    // Long flat chains build deep trees: also bounded.
    ok(&body(&format!("mask q{} < 0", " + q".repeat(MAX_DEPTH - 2))));
    let e = errs(&body(&format!("mask q{} < 0", " + q".repeat(100_000))));
    assert!(
        e[0].message.contains("expression is too deep: expected at most 256 nested operations"),
        "{}",
        e[0].message
    );
    assert_eq!((e[0].line, e[0].col), (4, 6 + 1 + 4 * (MAX_DEPTH - 1) + 1));
}

#[test]
fn files() {
    let e = parse_file(std::path::Path::new("/nonexistent/x.attn")).unwrap_err();
    assert_eq!((e.0[0].line, e.0[0].col), (0, 0));
    assert!(e.0[0].message.starts_with("cannot read `/nonexistent/x.attn`: "), "{}", e.0[0].message);
    assert!(e.to_string().starts_with("error: cannot read"), "{e}");
    assert!(e.to_string().ends_with("  --> /nonexistent/x.attn"), "{e}");
    let e = parse_bytes("f.attn", b"attention t {\n  \xff\n}").unwrap_err();
    assert_eq!((e.0[0].line, e.0[0].col), (2, 3));
    assert_eq!(e.0[0].message, "invalid UTF-8 at byte 16: expected UTF-8 text");
}
