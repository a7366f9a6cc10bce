//! attnc-dsl: the `.attn` language — parser, pretty printer and diagnostics.
//!
//! ```text
//! attention gemma2 {
//!   dtype bf16
//!   head_dim 256
//!   heads 16 kv 8 pack_gqa
//!   mask causal && window(left=4095)
//!   score softcap(score, 50.0)
//! }
//! ```
//!
//! [`parse`] turns such a file into an [`attnc_ir::Spec`] (checked with
//! [`attnc_ir::validate`]); [`print`] writes a spec back in canonical form, and
//! `parse(&print(&spec)) == Ok(spec)` for every valid spec. Errors are [`Diagnostics`]
//! with file, line, column and a caret, rendered like rustc's. The language reference
//! is `docs/dsl.md`.
//!
//! Layers: [`lexer`](crate::lexer) (nom combinators) → `parser` (recursive descent with
//! "expected ..." tracking and statement-level recovery) → `build` (names, the mask
//! conjunct rule, validation mapped back to source spans).

mod build;
mod diag;
mod lexer;
mod parser;
mod printer;

#[cfg(test)]
mod tests;

pub use diag::{Diagnostic, Diagnostics};
pub use parser::MAX_DEPTH;
/// One expression in canonical form (as `print` writes it inside a spec).
pub use printer::expr as print_expr;
pub use printer::print;

use attnc_ir::Spec;
use std::path::Path;

/// At most this many diagnostics are reported for one file.
pub const MAX_DIAGNOSTICS: usize = 20;

/// Parses and validates one `.attn` file given as text; diagnostics name the file
/// `<input>`.
pub fn parse(src: &str) -> Result<Spec, Diagnostics> {
    parse_named("<input>", src)
}

/// Parses and validates one `.attn` file; `file_name` is what diagnostics call it.
pub fn parse_named(file_name: &str, src: &str) -> Result<Spec, Diagnostics> {
    let (raw, mut errors) = parser::parse_raw(src);
    if errors.is_empty() {
        match build::build(raw, src) {
            Ok(spec) => return Ok(spec),
            Err(e) => errors = e,
        }
    }
    errors.sort_by_key(|e| e.span.start);
    errors.truncate(MAX_DIAGNOSTICS);
    Err(Diagnostics(errors.into_iter().map(|e| Diagnostic::at(file_name, src, e.span, e.message)).collect()))
}

/// Reads, parses and validates a `.attn` file. An unreadable file, or one that is not
/// UTF-8, is a diagnostic too.
pub fn parse_file(path: &Path) -> Result<Spec, Diagnostics> {
    let name = path.display().to_string();
    match std::fs::read(path) {
        Ok(bytes) => parse_bytes(&name, &bytes),
        Err(e) => Err(Diagnostics(vec![Diagnostic::whole_file(
            &name,
            format!("cannot read `{name}`: {e}; expected a readable .attn file"),
        )])),
    }
}

/// Parses raw bytes: invalid UTF-8 is reported at its position.
pub(crate) fn parse_bytes(file_name: &str, bytes: &[u8]) -> Result<Spec, Diagnostics> {
    match std::str::from_utf8(bytes) {
        Ok(src) => parse_named(file_name, src),
        Err(e) => {
            let good = e.valid_up_to();
            // Show the line up to the bad byte, lossily decoded.
            let text = String::from_utf8_lossy(bytes);
            let prefix = String::from_utf8_lossy(&bytes[..good]);
            let at = prefix.len();
            Err(Diagnostics(vec![Diagnostic::at(
                file_name,
                &text,
                attnc_ir::Span::new(at, at + 1),
                format!("invalid UTF-8 at byte {good}: expected UTF-8 text"),
            )]))
        }
    }
}
