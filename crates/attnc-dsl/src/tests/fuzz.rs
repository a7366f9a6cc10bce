//! No input makes the parser panic, overflow its stack or loop: arbitrary strings and
//! bytes, token soups, and mutations of the example files. Whatever parses must also
//! round-trip; whatever fails must produce well-formed diagnostics.
//! `ATTNC_FUZZ_CASES` sets the number of cases per property (default 2000).

use super::cases;
use super::examples::examples;
use crate::{parse, parse_bytes, print, Diagnostics};
use proptest::prelude::*;

/// Parses `bytes` and checks the result is well formed.
fn check(bytes: &[u8]) -> Result<(), TestCaseError> {
    match parse_bytes("fuzz.attn", bytes) {
        Ok(spec) => {
            let text = print(&spec);
            let back = parse(&text);
            prop_assert_eq!(back.as_ref().ok(), Some(&spec), "{}", text);
        }
        Err(Diagnostics(ds)) => {
            prop_assert!(!ds.is_empty() && ds.len() <= crate::MAX_DIAGNOSTICS);
            let lines = bytes.iter().filter(|b| **b == b'\n').count() + 1;
            for d in &ds {
                prop_assert!(d.line >= 1 && d.line <= lines && d.col >= 1 && d.caret_len >= 1, "{:?}", d);
                prop_assert!(!d.message.is_empty());
                prop_assert!(!d.source_line.contains('\n'));
                let shown = d.to_string();
                prop_assert!(shown.starts_with("error: "));
            }
        }
    }
    Ok(())
}

const VOCAB: &[&str] = &[
    "attention",
    "x",
    "{",
    "}",
    "\n",
    "\n",
    "\n",
    ";",
    "dtype",
    "bf16",
    "fp16",
    "head_dim",
    "128",
    "192/128",
    "heads",
    "8",
    "kv",
    "2",
    "pack_gqa",
    "param",
    "aux",
    "p",
    "doc",
    ":",
    "int",
    "float",
    "learnable",
    "bias",
    "[",
    "]",
    "batch",
    "seqlen_k",
    "mask",
    "none",
    "causal",
    "causal(bottom_right)",
    "window",
    "(",
    ")",
    "left",
    "right",
    "align",
    "=",
    ",",
    "top_left",
    "bottom_right",
    "score",
    "scale",
    "0.5",
    "sinks",
    "paged",
    "page_size",
    "varlen",
    "split",
    "auto",
    "lse",
    "softmax",
    "exp2_emulation",
    "rescale_threshold",
    "q",
    "k",
    "b",
    "h",
    "hkv",
    "seqlen_q",
    "q_heads",
    "+",
    "-",
    "*",
    "/",
    "%",
    "<",
    "<=",
    ">",
    ">=",
    "==",
    "!=",
    "&&",
    "||",
    "!",
    "min",
    "max",
    "abs",
    "select",
    "exp2",
    "softcap",
    "tanh",
    "true",
    "false",
    "-1",
    "1e9",
    "2147483648",
    "99999999999999999999",
    "1e999",
    "//c",
    "#c",
    "@",
    "&",
    "|",
    "\"",
    "é",
    "\r",
    "\t",
    "((((((((",
    "))))))))",
];

fn token_soup() -> impl Strategy<Value = String> {
    (any::<bool>(), prop::collection::vec(prop::sample::select(VOCAB), 0..80)).prop_map(|(wrap, toks)| {
        let body = toks.join(" ");
        if wrap {
            format!("attention x {{\n head_dim 128\n heads 8\n{body}\n}}")
        } else {
            body
        }
    })
}

#[derive(Clone, Debug)]
enum Mutation {
    Flip(usize, u8),
    Delete(usize, usize),
    Insert(usize, Vec<u8>),
    Token(usize, &'static str),
    Splice(usize, usize, usize, usize),
    Duplicate(usize, usize, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let pos = any::<usize>();
    prop_oneof![
        (pos, any::<u8>()).prop_map(|(p, b)| Mutation::Flip(p, b)),
        (pos, 1usize..40).prop_map(|(p, n)| Mutation::Delete(p, n)),
        (pos, prop::collection::vec(any::<u8>(), 1..8)).prop_map(|(p, b)| Mutation::Insert(p, b)),
        (pos, prop::sample::select(VOCAB)).prop_map(|(p, t)| Mutation::Token(p, t)),
        (pos, any::<usize>(), any::<usize>(), 1usize..200).prop_map(|(p, f, s, n)| Mutation::Splice(p, f, s, n)),
        (pos, any::<usize>(), 1usize..80).prop_map(|(p, s, n)| Mutation::Duplicate(p, s, n)),
    ]
}

fn mutate(mut text: Vec<u8>, muts: &[Mutation]) -> Vec<u8> {
    let files = examples();
    for m in muts {
        let at = |p: usize, len: usize| if len == 0 { 0 } else { p % (len + 1) };
        match m {
            Mutation::Flip(p, b) if !text.is_empty() => {
                let i = p % text.len();
                text[i] ^= b | 1;
            }
            Mutation::Flip(..) => {}
            Mutation::Delete(p, n) => {
                let i = at(*p, text.len());
                let j = (i + n).min(text.len());
                text.drain(i..j);
            }
            Mutation::Insert(p, b) => {
                let i = at(*p, text.len());
                text.splice(i..i, b.iter().copied());
            }
            Mutation::Token(p, t) => {
                let i = at(*p, text.len());
                text.splice(i..i, t.bytes());
            }
            Mutation::Splice(p, f, s, n) if !files.is_empty() => {
                let other = files[f % files.len()].1.as_bytes();
                let start = at(*s, other.len());
                let end = (start + n).min(other.len());
                let i = at(*p, text.len());
                text.splice(i..i, other[start..end].iter().copied());
            }
            Mutation::Splice(..) => {}
            Mutation::Duplicate(p, s, n) => {
                let start = at(*s, text.len());
                let end = (start + n).min(text.len());
                let chunk = text[start..end].to_vec();
                let i = at(*p, text.len());
                text.splice(i..i, chunk);
            }
        }
    }
    text
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_strings(s in any::<String>()) {
        check(s.as_bytes())?;
    }

    #[test]
    fn arbitrary_bytes(b in prop::collection::vec(any::<u8>(), 0..512)) {
        check(&b)?;
    }

    #[test]
    fn token_soups(s in token_soup()) {
        check(s.as_bytes())?;
    }

    #[test]
    fn mutated_examples(i in any::<usize>(), muts in prop::collection::vec(mutation(), 1..6)) {
        let files = examples();
        prop_assume!(!files.is_empty());
        let base = files[i % files.len()].1.as_bytes().to_vec();
        check(&mutate(base, &muts))?;
    }
}
