//! The tokenizer, written with nom combinators. It never fails: a character that starts
//! no token becomes an [`Tok::Error`] token, which the parser reports when (and only
//! when) it reaches it, so errors come out in source order.

use attnc_ir::Span;
use nom::branch::alt;
use nom::bytes::complete::{tag, take_till, take_while, take_while1};
use nom::character::complete::{char, digit1, one_of, satisfy};
use nom::combinator::{opt, recognize, value};
use nom::{IResult, Parser};

type PResult<'a, T> = IResult<&'a str, T, nom::error::Error<&'a str>>;

/// Punctuation and operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum P {
    LBrace,
    RBrace,
    LParen,
    RParen,
    LBracket,
    RBracket,
    Comma,
    Colon,
    Semi,
    Assign,
    Plus,
    Minus,
    Star,
    Slash,
    Percent,
    Bang,
    AndAnd,
    OrOr,
    EqEq,
    Ne,
    Le,
    Lt,
    Ge,
    Gt,
}

impl P {
    pub(crate) fn text(self) -> &'static str {
        match self {
            P::LBrace => "{",
            P::RBrace => "}",
            P::LParen => "(",
            P::RParen => ")",
            P::LBracket => "[",
            P::RBracket => "]",
            P::Comma => ",",
            P::Colon => ":",
            P::Semi => ";",
            P::Assign => "=",
            P::Plus => "+",
            P::Minus => "-",
            P::Star => "*",
            P::Slash => "/",
            P::Percent => "%",
            P::Bang => "!",
            P::AndAnd => "&&",
            P::OrOr => "||",
            P::EqEq => "==",
            P::Ne => "!=",
            P::Le => "<=",
            P::Lt => "<",
            P::Ge => ">=",
            P::Gt => ">",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Tok<'a> {
    Ident(&'a str),
    /// Decimal digits only; the value is checked where it is used.
    Int(&'a str),
    /// Digits with a fraction and/or an exponent.
    Float(&'a str),
    Punct(P),
    Newline,
    Eof,
    /// Something that is not a token. `specific` messages stand alone; generic ones
    /// ("unexpected character") are completed with what the parser expected there.
    Error {
        text: String,
        message: String,
        specific: bool,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Token<'a> {
    pub tok: Tok<'a>,
    pub span: Span,
}

fn is_ident_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_'
}
fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Spaces, tabs, carriage returns and comments (`//` or `#` to the end of the line).
fn trivia(i: &str) -> PResult<'_, &str> {
    alt((
        take_while1(|c| c == ' ' || c == '\t' || c == '\r'),
        recognize((alt((tag("//"), tag("#"))), take_till(|c| c == '\n'))),
    ))
    .parse(i)
}

fn ident(i: &str) -> PResult<'_, &str> {
    recognize((satisfy(is_ident_start), take_while(is_ident_char))).parse(i)
}

/// `digits [. digits] [(e|E) [+|-] digits]`; returns the text and whether it is a float.
fn number(i: &str) -> PResult<'_, (&str, bool)> {
    let (rest, (_, frac, exp)) =
        (digit1, opt(recognize((char('.'), digit1))), opt(recognize((one_of("eE"), opt(one_of("+-")), digit1))))
            .parse(i)?;
    let len = i.len() - rest.len();
    Ok((rest, (&i[..len], frac.is_some() || exp.is_some())))
}

fn punct(i: &str) -> PResult<'_, P> {
    alt((
        alt((
            value(P::AndAnd, tag("&&")),
            value(P::OrOr, tag("||")),
            value(P::EqEq, tag("==")),
            value(P::Ne, tag("!=")),
            value(P::Le, tag("<=")),
            value(P::Ge, tag(">=")),
        )),
        alt((
            value(P::LBrace, char('{')),
            value(P::RBrace, char('}')),
            value(P::LParen, char('(')),
            value(P::RParen, char(')')),
            value(P::LBracket, char('[')),
            value(P::RBracket, char(']')),
            value(P::Comma, char(',')),
            value(P::Colon, char(':')),
            value(P::Semi, char(';')),
            value(P::Assign, char('=')),
            value(P::Plus, char('+')),
            value(P::Minus, char('-')),
            value(P::Star, char('*')),
            value(P::Slash, char('/')),
            value(P::Percent, char('%')),
            value(P::Bang, char('!')),
            value(P::Lt, char('<')),
            value(P::Gt, char('>')),
        )),
    ))
    .parse(i)
}

/// Splits `src` into tokens; the last one is always `Eof`, placed right after the last
/// real token (so "found end of file" points at where something is missing).
pub(crate) fn lex(src: &str) -> Vec<Token<'_>> {
    let mut toks = Vec::new();
    let mut rest = src.strip_prefix('\u{feff}').unwrap_or(src);
    let mut last_end = src.len() - rest.len();
    loop {
        let start = src.len() - rest.len();
        if let Ok((r, _)) = trivia(rest) {
            rest = r;
            continue;
        }
        let Some(c) = rest.chars().next() else { break };
        let (tok, r) = if c == '\n' {
            (Tok::Newline, &rest[1..])
        } else if let Ok((r, s)) = ident(rest) {
            (Tok::Ident(s), r)
        } else if let Ok((r, (s, is_float))) = number(rest) {
            // A number glued to letters, digits or a dot (`128x`, `1e`, `1.`, `0x10`) is
            // one malformed literal, not two tokens.
            let glued = r.chars().next().is_some_and(|c| is_ident_char(c) || c == '.');
            if glued {
                let tail = r.find(|c: char| !(is_ident_char(c) || c == '.')).unwrap_or(r.len());
                let text = &rest[..s.len() + tail];
                let message = format!(
                    "invalid number `{text}`: expected digits, optionally a fraction `.5` and an exponent `e-3`"
                );
                (Tok::Error { text: text.to_string(), message, specific: true }, &r[tail..])
            } else if is_float {
                (Tok::Float(s), r)
            } else {
                (Tok::Int(s), r)
            }
        } else if let Ok((r, p)) = punct(rest) {
            (Tok::Punct(p), r)
        } else {
            let len = c.len_utf8();
            let (message, specific) = match c {
                '&' => ("expected `&&` (logical and), found `&`".to_string(), true),
                '|' => ("expected `||` (logical or), found `|`".to_string(), true),
                '"' | '\'' => (format!("unexpected quote `{c}`: the language has no strings"), false),
                _ => (format!("unexpected character `{}`", c.escape_debug()), false),
            };
            (Tok::Error { text: c.to_string(), message, specific }, &rest[len..])
        };
        let end = src.len() - r.len();
        toks.push(Token { tok, span: Span::new(start, end) });
        if !matches!(toks.last().map(|t| &t.tok), Some(Tok::Newline)) {
            last_end = end;
        }
        rest = r;
    }
    toks.push(Token { tok: Tok::Eof, span: Span::new(last_end, last_end) });
    toks
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(src: &str) -> Vec<Tok<'_>> {
        lex(src).into_iter().map(|t| t.tok).collect()
    }

    #[test]
    fn tokens() {
        assert_eq!(
            kinds("mask k <= q && doc[b, q] != 3 // c\n# c2\nscale 1.5e-3;"),
            vec![
                Tok::Ident("mask"),
                Tok::Ident("k"),
                Tok::Punct(P::Le),
                Tok::Ident("q"),
                Tok::Punct(P::AndAnd),
                Tok::Ident("doc"),
                Tok::Punct(P::LBracket),
                Tok::Ident("b"),
                Tok::Punct(P::Comma),
                Tok::Ident("q"),
                Tok::Punct(P::RBracket),
                Tok::Punct(P::Ne),
                Tok::Int("3"),
                Tok::Newline,
                Tok::Newline,
                Tok::Ident("scale"),
                Tok::Float("1.5e-3"),
                Tok::Punct(P::Semi),
                Tok::Eof,
            ]
        );
    }

    #[test]
    fn numbers() {
        assert_eq!(
            kinds("1 1.0 1e5 2E+3 0.5e-1"),
            vec![
                Tok::Int("1"),
                Tok::Float("1.0"),
                Tok::Float("1e5"),
                Tok::Float("2E+3"),
                Tok::Float("0.5e-1"),
                Tok::Eof
            ]
        );
        for bad in ["128x", "1.", "1e", "1.5.2", "0x10"] {
            match &kinds(bad)[0] {
                Tok::Error { text, specific: true, .. } => assert_eq!(text, bad),
                t => panic!("{bad}: {t:?}"),
            }
        }
    }

    #[test]
    fn eof_sits_after_the_last_token() {
        let t = lex("a b  // x\n\n");
        // (Span equality ignores positions, so compare the offsets.)
        assert_eq!(t.last().map(|t| t.span.start), Some(3));
    }

    #[test]
    fn bad_characters_become_error_tokens() {
        let t = kinds("a & b @ é");
        assert!(matches!(&t[1], Tok::Error { specific: true, .. }));
        assert!(matches!(&t[3], Tok::Error { specific: false, .. }));
        assert!(matches!(&t[4], Tok::Error { text, .. } if text == "é"));
    }
}
