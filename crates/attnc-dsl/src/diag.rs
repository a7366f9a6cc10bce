//! Diagnostics: a message at a source location, rendered rustc-style.

use attnc_ir::Span;
use std::fmt;

/// One error at one place in a `.attn` file. `line` and `col` are 1-based, `col` counts
/// characters (not bytes). `line == 0` means the error has no position (e.g. an
/// unreadable file); then `source_line` is empty and `caret_len` is 0.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    pub file: String,
    pub line: usize,
    pub col: usize,
    pub message: String,
    /// The whole source line the error is on, without its line terminator.
    pub source_line: String,
    /// How many characters the caret underline spans (at least 1 when `line > 0`).
    pub caret_len: usize,
}

impl Diagnostic {
    /// A diagnostic for a byte span of `src`.
    pub(crate) fn at(file: &str, src: &str, span: Span, message: String) -> Diagnostic {
        let start = clamp_to_boundary(src, span.start);
        let end = clamp_to_boundary(src, span.end.max(start));
        let line_start = src[..start].rfind('\n').map_or(0, |i| i + 1);
        let line_end = src[start..].find('\n').map_or(src.len(), |i| start + i);
        let (line, col) = line_col(src, start);
        let source_line = src[line_start..line_end].trim_end_matches('\r').to_string();
        let caret_end = end.min(line_end).max(start);
        let caret_len = src[start..caret_end].chars().count().max(1);
        Diagnostic { file: file.to_string(), line, col, message, source_line, caret_len }
    }

    /// A diagnostic without a source position.
    pub(crate) fn whole_file(file: &str, message: String) -> Diagnostic {
        Diagnostic { file: file.to_string(), line: 0, col: 0, message, source_line: String::new(), caret_len: 0 }
    }
}

/// 1-based line and character column of a byte offset.
pub(crate) fn line_col(src: &str, offset: usize) -> (usize, usize) {
    let offset = clamp_to_boundary(src, offset);
    let line_start = src[..offset].rfind('\n').map_or(0, |i| i + 1);
    (src[..offset].matches('\n').count() + 1, src[line_start..offset].chars().count() + 1)
}

fn clamp_to_boundary(src: &str, mut i: usize) -> usize {
    i = i.min(src.len());
    while !src.is_char_boundary(i) {
        i -= 1;
    }
    i
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "error: {}", self.message)?;
        if self.line == 0 {
            return write!(f, "  --> {}", self.file);
        }
        let num = self.line.to_string();
        let pad = " ".repeat(num.len() + 1);
        writeln!(f, "{pad}--> {}:{}:{}", self.file, self.line, self.col)?;
        writeln!(f, "{pad} |")?;
        writeln!(f, " {num} | {}", self.source_line)?;
        // Keep tabs before the caret so it lines up under the source text.
        let prefix: String = self
            .source_line
            .chars()
            .chain(std::iter::repeat(' '))
            .take(self.col.saturating_sub(1))
            .map(|c| if c == '\t' { '\t' } else { ' ' })
            .collect();
        write!(f, "{pad} | {prefix}{}", "^".repeat(self.caret_len.max(1)))
    }
}

/// All the errors found in one file, in source order.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Diagnostics(pub Vec<Diagnostic>);

impl Diagnostics {
    pub fn iter(&self) -> std::slice::Iter<'_, Diagnostic> {
        self.0.iter()
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<'a> IntoIterator for &'a Diagnostics {
    type Item = &'a Diagnostic;
    type IntoIter = std::slice::Iter<'a, Diagnostic>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n\n")?;
            }
            write!(f, "{d}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Diagnostics {}

/// Formats a list of alternatives: `a`, `a or b`, `a, b or c`.
pub(crate) fn one_of(items: &[String]) -> String {
    match items {
        [] => "something else".to_string(),
        [a] => a.clone(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
    }
}

/// The closest of `candidates` to `word` by edit distance, when close enough to be a
/// plausible typo.
pub(crate) fn suggest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let n = word.chars().count();
    let limit = (n / 3).max(1);
    candidates
        .into_iter()
        .filter(|c| *c != word && c.chars().count().abs_diff(n) <= limit)
        .map(|c| (edit_distance(word, c), c))
        .filter(|(d, _)| *d <= limit)
        // Ties go to the candidate sharing the longest prefix (`f16` → `fp16`).
        .min_by_key(|(d, c)| (*d, usize::MAX - common_prefix(word, c)))
        .map(|(_, c)| c)
}

fn common_prefix(a: &str, b: &str) -> usize {
    a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count()
}

fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_like_rustc() {
        let src = "attention x {\n  dtype bf16\n  head_dim 100\n}\n";
        let start = src.find("100").unwrap();
        let d = Diagnostic::at(
            "dsl-examples/x.attn",
            src,
            Span::new(start, start + 3),
            "unsupported head_dim 100: expected one of 64, 96, 128, 192/128, 192, 256".into(),
        );
        assert_eq!((d.line, d.col, d.caret_len), (3, 12, 3));
        assert_eq!(
            d.to_string(),
            "error: unsupported head_dim 100: expected one of 64, 96, 128, 192/128, 192, 256\n  --> dsl-examples/x.attn:3:12\n   |\n 3 |   head_dim 100\n   |            ^^^"
        );
    }

    #[test]
    fn columns_count_characters_and_tabs_align() {
        let src = "// héllo\n\tmask é";
        let start = src.rfind('é').unwrap();
        let d = Diagnostic::at("f", src, Span::new(start, start + 2), "m".into());
        assert_eq!((d.line, d.col, d.caret_len), (2, 7, 1));
        assert!(d.to_string().ends_with(" | \t     ^"), "{d}");
    }

    #[test]
    fn spans_past_the_end_and_inside_chars_are_clamped() {
        let d = Diagnostic::at("f", "ab\né", Span::new(4, 99), "m".into());
        assert_eq!((d.line, d.col, d.caret_len), (2, 1, 1));
        let d = Diagnostic::at("f", "ab\n", Span::new(3, 3), "m".into());
        assert_eq!((d.line, d.col, d.source_line.as_str()), (2, 1, ""));
    }

    #[test]
    fn wide_line_numbers_widen_the_gutter() {
        let src = "\n".repeat(11) + "x";
        let d = Diagnostic::at("f", &src, Span::new(11, 12), "m".into());
        assert_eq!(d.to_string(), "error: m\n   --> f:12:1\n    |\n 12 | x\n    | ^");
    }

    #[test]
    fn suggestions() {
        assert_eq!(suggest("head_dims", ["heads", "head_dim"]), Some("head_dim"));
        assert_eq!(suggest("prefx", ["prefix", "q"]), Some("prefix"));
        assert_eq!(suggest("zzzzzz", ["prefix", "q"]), None);
        assert_eq!(suggest("f16", ["bf16", "fp16"]), Some("fp16"));
        assert_eq!(one_of(&["a".into(), "b".into(), "c".into()]), "a, b or c");
    }
}
