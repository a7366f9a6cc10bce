//! Tests of the whole language: constructs, diagnostics, round trips, fuzzing, examples,
//! and the reference backward of every shipped spec file.

mod backward;
mod constructs;
mod diagnostics;
mod examples;
mod fuzz;
mod roundtrip;

use crate::{parse, Diagnostic};
use attnc_ir::Spec;

/// A file with the required settings (on lines 2 and 3) and `lines` from line 4 on.
pub(crate) fn body(lines: &str) -> String {
    format!("attention t {{\n  head_dim 128\n  heads 8\n{lines}\n}}\n")
}

pub(crate) fn ok(src: &str) -> Spec {
    match parse(src) {
        Ok(s) => s,
        Err(d) => panic!("expected {src:?} to parse, got:\n{d}"),
    }
}

pub(crate) fn errs(src: &str) -> Vec<Diagnostic> {
    match parse(src) {
        Ok(s) => panic!("expected an error for {src:?}, got {s:?}"),
        Err(d) => d.0,
    }
}

/// Asserts that the first diagnostic is at `line:col` and contains `msg`.
#[track_caller]
pub(crate) fn err_at(src: &str, line: usize, col: usize, msg: &str) -> Diagnostic {
    let e = errs(src);
    let d = e[0].clone();
    assert!(
        d.line == line && d.col == col && d.message.contains(msg),
        "expected {line}:{col} `{msg}`, got:\n{}",
        crate::Diagnostics(e)
    );
    d
}

/// Cases for the property tests: `ATTNC_FUZZ_CASES` or 2000.
pub(crate) fn cases() -> u32 {
    std::env::var("ATTNC_FUZZ_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(2000)
}
