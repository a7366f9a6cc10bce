//! Recursive-descent parser over the token stream. It produces [`Raw`]: every setting
//! with the source spans of its parts, and expressions as a raw AST ([`Node`]) in which
//! identifiers are still unresolved and `causal` / `window(...)` are ordinary nodes.
//! Name resolution, the mask-conjunct rule and the IR's validation happen in
//! [`crate::build`].
//!
//! Errors report the token where parsing stopped together with everything that would
//! have been accepted there (the parser is LL(1), so that token is the furthest point
//! reached). After an error the parser skips to the next statement and goes on, so one
//! run reports independent mistakes on different lines.

use crate::diag::{line_col, one_of, suggest};
use crate::lexer::{lex, Tok, Token, P};
use attnc_ir::{Align, AuxElem, BinOp, DType, KvLayout, SoftmaxOptions, Span, SplitKv, Ty, UnOp};

/// Deepest nesting of parentheses, calls, indexing and unary operators, and deepest
/// expression tree, the parser accepts. Deeper input is a diagnostic, never a stack
/// overflow.
pub const MAX_DEPTH: usize = 256;

/// The settings (statement keywords), in canonical order.
pub(crate) const SETTINGS: &[&str] = &[
    "dtype", "head_dim", "heads", "param", "aux", "mask", "score", "scale", "sinks", "kv", "split", "lse", "shards",
    "softmax",
];

/// Aux dimension names.
pub(crate) const AUX_DIMS: &[&str] = &["batch", "seqlen_q", "seqlen_k", "q_heads", "kv_heads"];

#[derive(Clone, Debug)]
pub(crate) struct PErr {
    pub span: Span,
    pub message: String,
}

/// A raw expression node.
#[derive(Clone, Debug)]
pub(crate) struct Node {
    pub kind: NodeKind,
    pub span: Span,
    /// Height of the tree below and including this node.
    pub depth: usize,
}

#[derive(Clone, Debug)]
pub(crate) enum NodeKind {
    Int(i64),
    Float(f64),
    Bool(bool),
    Ident(String),
    Index {
        name: String,
        name_span: Span,
        args: Vec<Node>,
    },
    Call {
        name: String,
        name_span: Span,
        args: Vec<Node>,
    },
    Unary(UnOp, Box<Node>),
    Binary(BinOp, Box<Node>, Box<Node>),
    /// `causal(align)`; a bare `causal` stays an `Ident` (it may name a param).
    Causal(Align),
    Window(WindowArgs),
}

#[derive(Clone, Debug, Default)]
pub(crate) struct WindowArgs {
    pub left: Option<(u64, Span)>,
    pub right: Option<(u64, Span)>,
    pub align: Option<(Align, Span)>,
}

#[derive(Clone, Debug)]
pub(crate) struct Heads {
    pub q: u32,
    pub kv: Option<u32>,
    /// From the q count to the kv count.
    pub span: Span,
    pub pack_gqa: Option<Span>,
}

#[derive(Clone, Debug)]
pub(crate) struct RawParam {
    pub name: String,
    pub name_span: Span,
    pub ty: Ty,
    pub span: Span,
}

#[derive(Clone, Debug)]
pub(crate) struct RawAux {
    pub name: String,
    pub name_span: Span,
    pub elem: AuxElem,
    /// `int` / `float`
    pub elem_span: Span,
    pub dims: Vec<(attnc_ir::AuxDim, Span)>,
    /// `[...]`
    pub dims_span: Span,
    /// The `learnable` keyword, when present.
    pub learnable: Option<Span>,
}

#[derive(Clone, Debug)]
pub(crate) struct RawSoftmax {
    pub opts: SoftmaxOptions,
    pub span: Span,
    pub exp2_emulation: Option<Span>,
    pub rescale_threshold: Option<Span>,
}

/// Everything a file says, with spans.
#[derive(Clone, Debug, Default)]
pub(crate) struct Raw {
    pub name: String,
    pub name_span: Span,
    /// `attention NAME`: where errors about missing settings point.
    pub header: Span,
    pub dtype: Option<(DType, Span)>,
    /// (qk, v, span of the value)
    pub head_dim: Option<(u32, u32, Span)>,
    pub heads: Option<Heads>,
    pub params: Vec<RawParam>,
    pub aux: Vec<RawAux>,
    /// The mask expression (`None` for `mask none`) and the span of the statement.
    pub mask: Option<(Option<Node>, Span)>,
    pub score: Option<Node>,
    pub scale: Option<(f64, Span)>,
    pub sinks: Option<Span>,
    /// Layout, span of its value, span of the page size.
    pub kv: Option<(KvLayout, Span, Option<Span>)>,
    pub split: Option<(SplitKv, Span)>,
    pub lse: Option<Span>,
    pub shards: Option<Span>,
    pub softmax: Option<RawSoftmax>,
}

pub(crate) struct Parser<'a> {
    src: &'a str,
    toks: Vec<Token<'a>>,
    pos: usize,
    /// Open `(` / `[`: newlines inside them are skipped (implicit line joining).
    parens: usize,
    /// Current recursion depth of the expression parser.
    nest: usize,
    expected: Vec<String>,
    expected_at: usize,
    errors: Vec<PErr>,
    seen: Vec<(&'static str, Span)>,
    raw: Raw,
}

type PResult<T> = Result<T, PErr>;

fn describe(t: &Tok) -> String {
    match t {
        Tok::Ident(s) | Tok::Int(s) | Tok::Float(s) => format!("`{s}`"),
        Tok::Punct(p) => format!("`{}`", p.text()),
        Tok::Newline => "end of line".into(),
        Tok::Eof => "end of file".into(),
        Tok::Error { text, .. } => format!("`{}`", text.escape_debug()),
    }
}

fn binop(t: &Tok) -> Option<BinOp> {
    Some(match t {
        Tok::Punct(P::Plus) => BinOp::Add,
        Tok::Punct(P::Minus) => BinOp::Sub,
        Tok::Punct(P::Star) => BinOp::Mul,
        Tok::Punct(P::Slash) => BinOp::Div,
        Tok::Punct(P::Percent) => BinOp::Rem,
        Tok::Punct(P::Lt) => BinOp::Lt,
        Tok::Punct(P::Le) => BinOp::Le,
        Tok::Punct(P::Gt) => BinOp::Gt,
        Tok::Punct(P::Ge) => BinOp::Ge,
        Tok::Punct(P::EqEq) => BinOp::Eq,
        Tok::Punct(P::Ne) => BinOp::Ne,
        Tok::Punct(P::AndAnd) => BinOp::And,
        Tok::Punct(P::OrOr) => BinOp::Or,
        _ => return None,
    })
}

/// Parses a whole file. Returns the settings when the block was read to its end (even
/// if some statements had errors) and every syntax error.
pub(crate) fn parse_raw(src: &str) -> (Raw, Vec<PErr>) {
    let mut p = Parser {
        src,
        toks: lex(src),
        pos: 0,
        parens: 0,
        nest: 0,
        expected: Vec::new(),
        expected_at: 0,
        errors: Vec::new(),
        seen: Vec::new(),
        raw: Raw::default(),
    };
    if let Err(e) = p.file() {
        p.errors.push(e);
    }
    (p.raw, p.errors)
}

impl<'a> Parser<'a> {
    // ---- token access -------------------------------------------------------------

    fn skip_nl(&mut self) {
        if self.parens > 0 {
            while matches!(self.toks[self.pos].tok, Tok::Newline) {
                self.pos += 1;
            }
        }
    }

    fn peek(&mut self) -> &Tok<'a> {
        self.skip_nl();
        &self.toks[self.pos].tok
    }

    /// The token after the next one (no newline skipping).
    fn peek2(&self) -> &Tok<'a> {
        let i = (self.pos + 1).min(self.toks.len() - 1);
        &self.toks[i].tok
    }

    fn span(&mut self) -> Span {
        self.skip_nl();
        self.toks[self.pos].span
    }

    fn bump(&mut self) -> Token<'a> {
        self.skip_nl();
        let t = self.toks[self.pos].clone();
        if !matches!(t.tok, Tok::Eof) {
            self.pos += 1;
        }
        match t.tok {
            Tok::Punct(P::LParen | P::LBracket) => self.parens += 1,
            Tok::Punct(P::RParen | P::RBracket) => self.parens = self.parens.saturating_sub(1),
            _ => {}
        }
        t
    }

    /// Records that `what` would have been accepted at the current token.
    fn note(&mut self, what: impl Into<String>) {
        self.skip_nl();
        if self.expected_at != self.pos {
            self.expected.clear();
            self.expected_at = self.pos;
        }
        let what = what.into();
        if !self.expected.contains(&what) {
            self.expected.push(what);
        }
    }

    /// The error at the current token: what was expected there and what was found.
    fn fail(&mut self) -> PErr {
        self.skip_nl();
        let expected = if self.expected_at == self.pos { std::mem::take(&mut self.expected) } else { Vec::new() };
        let t = &self.toks[self.pos];
        let list = one_of(&expected);
        let message = match &t.tok {
            Tok::Error { message, specific: true, .. } => message.clone(),
            Tok::Error { message, .. } => format!("{message}: expected {list}"),
            Tok::Punct(P::Assign) if expected.iter().any(|e| e == "an operator") => {
                format!("expected {list}, found `=` (compare with `==`)")
            }
            Tok::Newline if expected.iter().any(|e| e == "an expression") => {
                format!("expected {list}, found end of line (to continue an expression on the next line, wrap it in parentheses)")
            }
            other => format!("expected {list}, found {}", describe(other)),
        };
        PErr { span: t.span, message }
    }

    /// Like [`Self::fail`], adding "did you mean" when the found word is close to one
    /// of `options`.
    fn fail_suggesting(&mut self, options: &[&str]) -> PErr {
        let found = match self.peek() {
            Tok::Ident(w) => Some(*w),
            _ => None,
        };
        let mut e = self.fail();
        if let Some(s) = found.and_then(|w| suggest(w, options.iter().copied())) {
            e.message.push_str(&format!(" (did you mean `{s}`?)"));
        }
        e
    }

    fn at_punct(&mut self, p: P) -> bool {
        *self.peek() == Tok::Punct(p)
    }

    fn eat(&mut self, p: P) -> Option<Span> {
        if self.at_punct(p) {
            Some(self.bump().span)
        } else {
            self.note(format!("`{}`", p.text()));
            None
        }
    }

    fn expect(&mut self, p: P) -> PResult<Span> {
        match self.eat(p) {
            Some(s) => Ok(s),
            None => Err(self.fail()),
        }
    }

    fn eat_word(&mut self, w: &str) -> Option<Span> {
        if *self.peek() == Tok::Ident(w) {
            Some(self.bump().span)
        } else {
            self.note(format!("`{w}`"));
            None
        }
    }

    /// One of a fixed set of words.
    fn choice(&mut self, options: &[&'static str]) -> PResult<(&'static str, Span)> {
        if let Tok::Ident(w) = *self.peek() {
            if let Some(o) = options.iter().find(|o| **o == w) {
                return Ok((o, self.bump().span));
            }
        }
        for o in options {
            self.note(format!("`{o}`"));
        }
        Err(self.fail_suggesting(options))
    }

    fn ident(&mut self, what: &str) -> PResult<(&'a str, Span)> {
        if let Tok::Ident(w) = *self.peek() {
            let s = self.bump().span;
            return Ok((w, s));
        }
        self.note(what);
        Err(self.fail())
    }

    /// A non-negative integer literal of at most `max`.
    fn uint(&mut self, what: &str, max: u64) -> PResult<(u64, Span)> {
        if let Tok::Int(s) = *self.peek() {
            let span = self.bump().span;
            return match s.parse::<u64>() {
                Ok(v) if v <= max => Ok((v, span)),
                _ => Err(PErr { span, message: format!("`{s}` is too large: expected {what} of at most {max}") }),
            };
        }
        self.note(what);
        Err(self.fail())
    }

    /// A number (int or float literal, optionally negative) as an f64.
    fn real(&mut self, what: &str) -> PResult<(f64, Span)> {
        let start = self.span();
        let neg = self.at_punct(P::Minus);
        if neg {
            self.bump();
        }
        if let Tok::Int(s) | Tok::Float(s) = *self.peek() {
            let span = start.to(self.bump().span);
            return match s.parse::<f64>() {
                Ok(v) if v.is_finite() => Ok((if neg { -v } else { v }, span)),
                _ => Err(PErr { span, message: format!("`{s}` is out of range: expected a finite number") }),
            };
        }
        self.note(what);
        Err(self.fail())
    }

    /// Ends a statement: a newline or `;` (consumed), or `}` / end of file (left).
    fn end_stmt(&mut self) -> PResult<()> {
        match self.peek() {
            Tok::Newline | Tok::Punct(P::Semi) => {
                self.bump();
                Ok(())
            }
            Tok::Punct(P::RBrace) | Tok::Eof => Ok(()),
            _ => {
                self.note("end of line");
                Err(self.fail())
            }
        }
    }

    /// Skips to the start of the next statement after an error.
    fn recover(&mut self) {
        self.parens = 0;
        self.nest = 0;
        loop {
            match self.toks[self.pos].tok {
                Tok::Newline | Tok::Punct(P::Semi) => {
                    self.pos += 1;
                    return;
                }
                Tok::Punct(P::RBrace) | Tok::Eof => return,
                _ => self.pos += 1,
            }
        }
    }

    fn skip_separators(&mut self, semis: bool) {
        while matches!(self.peek(), Tok::Newline) || (semis && self.at_punct(P::Semi)) {
            self.bump();
        }
    }

    // ---- file and statements ------------------------------------------------------

    fn file(&mut self) -> PResult<()> {
        self.skip_separators(false);
        let Some(kw) = self.eat_word("attention") else {
            return Err(self.fail());
        };
        let (name, name_span) = self.ident("a variant name")?;
        self.raw.name = name.to_string();
        self.raw.name_span = name_span;
        self.raw.header = kw.to(name_span);
        self.skip_separators(false);
        let open = self.expect(P::LBrace)?;
        loop {
            self.skip_separators(true);
            if self.errors.len() >= crate::MAX_DIAGNOSTICS {
                return Ok(());
            }
            match *self.peek() {
                Tok::Punct(P::RBrace) => {
                    self.bump();
                    break;
                }
                Tok::Eof => {
                    let (l, c) = line_col(self.src, open.start);
                    self.note("a setting");
                    self.note(format!("`}}` to close the block opened at {l}:{c}"));
                    return Err(self.fail());
                }
                Tok::Ident(_) => {
                    if let Err(e) = self.statement() {
                        self.errors.push(e);
                        self.recover();
                    }
                }
                _ => {
                    self.note("a setting (dtype, head_dim, heads, param, aux, mask, score, ...)");
                    self.note("`}`");
                    let e = self.fail();
                    self.errors.push(e);
                    self.recover();
                }
            }
        }
        self.skip_separators(true);
        if !matches!(self.peek(), Tok::Eof) {
            self.note("end of file (a file holds exactly one `attention` block)");
            return Err(self.fail());
        }
        Ok(())
    }

    fn statement(&mut self) -> PResult<()> {
        let t = self.bump();
        let Tok::Ident(word) = t.tok else {
            return Err(PErr { span: t.span, message: "expected a setting".into() });
        };
        let kw_span = t.span;
        let Some(kw) = SETTINGS.iter().copied().find(|k| *k == word) else {
            let mut message = format!("unknown setting `{word}`: expected one of {}", SETTINGS.join(", "));
            if let Some(s) = suggest(word, SETTINGS.iter().copied()) {
                message.push_str(&format!(" (did you mean `{s}`?)"));
            }
            return Err(PErr { span: kw_span, message });
        };
        if kw != "param" && kw != "aux" {
            if let Some((_, first)) = self.seen.iter().find(|(k, _)| *k == kw) {
                let (l, c) = line_col(self.src, first.start);
                return Err(PErr {
                    span: kw_span,
                    message: format!("duplicate `{kw}`: already set at {l}:{c}; expected each setting at most once"),
                });
            }
            self.seen.push((kw, kw_span));
        }
        match kw {
            "dtype" => {
                let (w, s) = self.choice(&["bf16", "fp16"])?;
                self.raw.dtype = Some((if w == "bf16" { DType::Bf16 } else { DType::Fp16 }, s));
            }
            "head_dim" => {
                let (qk, s) = self.uint("a head dimension (64, 96, 128, 192/128, 192 or 256)", u32::MAX as u64)?;
                let (v, s) = if self.eat(P::Slash).is_some() {
                    let (v, s2) = self.uint("the v head dimension", u32::MAX as u64)?;
                    (v, s.to(s2))
                } else {
                    (qk, s)
                };
                self.raw.head_dim = Some((qk as u32, v as u32, s));
            }
            "heads" => {
                let (q, s) = self.uint("a number of query heads", u32::MAX as u64)?;
                let mut heads = Heads { q: q as u32, kv: None, span: s, pack_gqa: None };
                if self.eat_word("kv").is_some() {
                    let (kv, s2) = self.uint("a number of kv heads", u32::MAX as u64)?;
                    heads.kv = Some(kv as u32);
                    heads.span = s.to(s2);
                }
                heads.pack_gqa = self.eat_word("pack_gqa");
                self.raw.heads = Some(heads);
            }
            "param" => {
                let (name, name_span) = self.ident("a parameter name")?;
                self.expect(P::Colon)?;
                let (ty, ts) = self.choice(&["int", "float"])?;
                self.raw.params.push(RawParam {
                    name: name.to_string(),
                    name_span,
                    ty: if ty == "int" { Ty::Int } else { Ty::Float },
                    span: name_span.to(ts),
                });
            }
            "aux" => {
                let (name, name_span) = self.ident("an aux tensor name")?;
                self.expect(P::Colon)?;
                let (elem, elem_span) = self.choice(&["int", "float"])?;
                let elem = if elem == "int" { AuxElem::Int } else { AuxElem::Float };
                let open = self.expect(P::LBracket)?;
                let mut dims = Vec::new();
                let close = loop {
                    dims.push(self.aux_dim()?);
                    if self.eat(P::Comma).is_none() {
                        break self.expect(P::RBracket)?;
                    }
                };
                let learnable = self.eat_word("learnable");
                self.raw.aux.push(RawAux {
                    name: name.to_string(),
                    name_span,
                    elem,
                    elem_span,
                    dims,
                    dims_span: open.to(close),
                    learnable,
                });
            }
            "mask" => {
                let start = self.span();
                let is_none = *self.peek() == Tok::Ident("none")
                    && matches!(self.peek2(), Tok::Newline | Tok::Eof | Tok::Punct(P::Semi | P::RBrace));
                if is_none {
                    let s = self.bump().span;
                    self.raw.mask = Some((None, s));
                } else {
                    let e = self.expr()?;
                    self.raw.mask = Some((Some(e), start));
                }
            }
            "score" => {
                let e = self.expr()?;
                self.raw.score = Some(e);
            }
            "scale" => {
                let v = self.real("a number")?;
                self.raw.scale = Some(v);
            }
            "sinks" => self.raw.sinks = Some(kw_span),
            "lse" => self.raw.lse = Some(kw_span),
            "shards" => self.raw.shards = Some(kw_span),
            "kv" => {
                let (w, s) = self.choice(&["contiguous", "varlen", "paged"])?;
                self.raw.kv = Some(match w {
                    "contiguous" => (KvLayout::Contiguous, s, None),
                    "varlen" => (KvLayout::Varlen, s, None),
                    _ => {
                        self.expect(P::LParen)?;
                        if self.eat_word("page_size").is_none() {
                            return Err(self.fail());
                        }
                        self.expect(P::Assign)?;
                        let (n, ns) = self.uint("a page size", u32::MAX as u64)?;
                        let close = self.expect(P::RParen)?;
                        (KvLayout::Paged { page_size: n as u32 }, s.to(close), Some(ns))
                    }
                });
            }
            "split" => {
                let v = if let Tok::Int(_) = self.peek() {
                    let (n, s) = self.uint("a number of splits", u32::MAX as u64)?;
                    (SplitKv::Fixed(n as u32), s)
                } else {
                    self.note("a number of splits");
                    let (w, s) = self.choice(&["none", "auto"])?;
                    (if w == "none" { SplitKv::None } else { SplitKv::Auto }, s)
                };
                self.raw.split = Some(v);
            }
            _ => {
                // "softmax"
                const KEYS: [&str; 2] = ["exp2_emulation", "rescale_threshold"];
                let mut sm = RawSoftmax {
                    opts: SoftmaxOptions::default(),
                    span: kw_span,
                    exp2_emulation: None,
                    rescale_threshold: None,
                };
                loop {
                    let is_key = matches!(self.peek(), Tok::Ident(_));
                    if !is_key && (sm.exp2_emulation.is_some() || sm.rescale_threshold.is_some()) {
                        for k in KEYS {
                            self.note(format!("`{k}`"));
                        }
                        break;
                    }
                    let (k, ks) = self.choice(&KEYS)?;
                    self.expect(P::Assign)?;
                    let (v, vs) = self.real("a number")?;
                    let slot = if k == KEYS[0] {
                        sm.opts.exp2_emulation = v;
                        &mut sm.exp2_emulation
                    } else {
                        sm.opts.rescale_threshold = v;
                        &mut sm.rescale_threshold
                    };
                    if slot.is_some() {
                        return Err(PErr {
                            span: ks,
                            message: format!("`{k}` is given twice: expected each option at most once"),
                        });
                    }
                    *slot = Some(vs);
                    sm.span = sm.span.to(vs);
                }
                self.raw.softmax = Some(sm);
            }
        }
        self.end_stmt()
    }

    fn aux_dim(&mut self) -> PResult<(attnc_ir::AuxDim, Span)> {
        use attnc_ir::AuxDim;
        const WHAT: &str = "a dimension (batch, seqlen_q, seqlen_k, q_heads, kv_heads or a size)";
        match *self.peek() {
            Tok::Int(_) => {
                let (n, s) = self.uint("a dimension size", i32::MAX as u64)?;
                Ok((AuxDim::Fixed(n), s))
            }
            Tok::Ident(w) if AUX_DIMS.contains(&w) => {
                let s = self.bump().span;
                let d = match w {
                    "batch" => AuxDim::Batch,
                    "seqlen_q" => AuxDim::MaxSeqlenQ,
                    "seqlen_k" => AuxDim::MaxSeqlenK,
                    "q_heads" => AuxDim::QHeads,
                    _ => AuxDim::KvHeads,
                };
                Ok((d, s))
            }
            _ => {
                self.note(WHAT);
                Err(self.fail_suggesting(AUX_DIMS))
            }
        }
    }

    // ---- expressions --------------------------------------------------------------

    /// A node over `children`, unless the tree would get deeper than [`MAX_DEPTH`].
    fn node(&self, kind: NodeKind, span: Span, child_depth: usize, at: Span) -> PResult<Node> {
        let depth = 1 + child_depth;
        if depth > MAX_DEPTH {
            return Err(PErr {
                span: at,
                message: format!("expression is too deep: expected at most {MAX_DEPTH} nested operations"),
            });
        }
        Ok(Node { kind, span, depth })
    }

    pub(crate) fn expr(&mut self) -> PResult<Node> {
        self.binary(1)
    }

    /// Precedence climbing; all binary operators are left-associative.
    fn binary(&mut self, min_prec: u8) -> PResult<Node> {
        let mut lhs = self.unary()?;
        loop {
            let Some(op) = binop(self.peek()) else {
                self.note("an operator");
                return Ok(lhs);
            };
            let prec = op.precedence();
            if prec < min_prec {
                return Ok(lhs);
            }
            let op_span = self.bump().span;
            let rhs = self.binary(prec + 1)?;
            let span = lhs.span.to(rhs.span);
            let d = lhs.depth.max(rhs.depth);
            lhs = self.node(NodeKind::Binary(op, Box::new(lhs), Box::new(rhs)), span, d, op_span)?;
        }
    }

    fn unary(&mut self) -> PResult<Node> {
        self.nest += 1;
        let r = if self.nest > MAX_DEPTH {
            let span = self.span();
            Err(PErr { span, message: format!("expression is nested too deeply: expected at most {MAX_DEPTH} levels of parentheses, calls and unary operators") })
        } else {
            self.unary_inner()
        };
        self.nest -= 1;
        r
    }

    fn unary_inner(&mut self) -> PResult<Node> {
        let op = match self.peek() {
            Tok::Punct(P::Minus) => UnOp::Neg,
            Tok::Punct(P::Bang) => UnOp::Not,
            _ => return self.primary(),
        };
        let op_span = self.bump().span;
        if op == UnOp::Neg {
            // `-` directly before a number literal is part of the literal.
            if let Tok::Int(s) | Tok::Float(s) = *self.peek() {
                let span = op_span.to(self.bump().span);
                return self.literal(s, true, span);
            }
        }
        let a = self.unary()?;
        let span = op_span.to(a.span);
        let d = a.depth;
        self.node(NodeKind::Unary(op, Box::new(a)), span, d, op_span)
    }

    fn literal(&self, text: &str, neg: bool, span: Span) -> PResult<Node> {
        let is_float = text.contains(['.', 'e', 'E']);
        let kind = if is_float {
            match text.parse::<f64>() {
                Ok(v) if v.is_finite() => NodeKind::Float(if neg { -v } else { v }),
                _ => {
                    return Err(PErr {
                        span,
                        message: format!(
                        "float literal `{text}` is out of range: expected a finite number (magnitude below 1.8e308)"
                    ),
                    })
                }
            }
        } else {
            let v = text.parse::<u64>().ok().map(|v| if neg { -(v as i128) } else { v as i128 });
            match v {
                Some(v) if (i32::MIN as i128..=i32::MAX as i128).contains(&v) => NodeKind::Int(v as i64),
                _ => {
                    return Err(PErr {
                        span,
                        message: format!(
                            "integer literal `{}{text}` is out of range: expected a 32-bit int ({} to {})",
                            if neg { "-" } else { "" },
                            i32::MIN,
                            i32::MAX
                        ),
                    })
                }
            }
        };
        Ok(Node { kind, span, depth: 1 })
    }

    fn primary(&mut self) -> PResult<Node> {
        match *self.peek() {
            Tok::Int(s) | Tok::Float(s) => {
                let span = self.bump().span;
                self.literal(s, false, span)
            }
            Tok::Ident(w) => {
                let name_span = self.bump().span;
                let leaf = |kind| Ok(Node { kind, span: name_span, depth: 1 });
                match (w, self.toks[self.pos].tok.clone()) {
                    ("true", _) => leaf(NodeKind::Bool(true)),
                    ("false", _) => leaf(NodeKind::Bool(false)),
                    ("causal", Tok::Punct(P::LParen)) => {
                        self.bump();
                        let (a, _) = self.choice(&["top_left", "bottom_right"])?;
                        let close = self.expect(P::RParen)?;
                        let align = if a == "top_left" { Align::TopLeft } else { Align::BottomRight };
                        leaf(NodeKind::Causal(align)).map(|n| Node { span: name_span.to(close), ..n })
                    }
                    ("window", Tok::Punct(P::LParen)) => self.window(name_span),
                    (_, Tok::Punct(P::LParen)) => {
                        self.bump();
                        let mut args = Vec::new();
                        let close = if let Some(c) = self.eat(P::RParen) {
                            c
                        } else {
                            loop {
                                args.push(self.expr()?);
                                if self.eat(P::Comma).is_none() {
                                    break self.expect(P::RParen)?;
                                }
                            }
                        };
                        let d = args.iter().map(|a| a.depth).max().unwrap_or(0);
                        let kind = NodeKind::Call { name: w.to_string(), name_span, args };
                        self.node(kind, name_span.to(close), d, name_span)
                    }
                    (_, Tok::Punct(P::LBracket)) => {
                        self.bump();
                        let mut args = Vec::new();
                        let close = loop {
                            args.push(self.expr()?);
                            if self.eat(P::Comma).is_none() {
                                break self.expect(P::RBracket)?;
                            }
                        };
                        let d = args.iter().map(|a| a.depth).max().unwrap_or(0);
                        let kind = NodeKind::Index { name: w.to_string(), name_span, args };
                        self.node(kind, name_span.to(close), d, name_span)
                    }
                    _ => leaf(NodeKind::Ident(w.to_string())),
                }
            }
            Tok::Punct(P::LParen) => {
                self.bump();
                let e = self.expr()?;
                self.expect(P::RParen)?;
                Ok(e)
            }
            _ => {
                self.note("an expression");
                Err(self.fail())
            }
        }
    }

    /// `window(left=N, right=N, align=A)` after the name.
    fn window(&mut self, name_span: Span) -> PResult<Node> {
        self.bump(); // (
        let mut w = WindowArgs::default();
        let close = loop {
            let (key, ks) = self.choice(&["left", "right", "align"])?;
            self.expect(P::Assign)?;
            let dup = match key {
                "left" | "right" => {
                    let (v, vs) = self.uint("a window size", u64::MAX)?;
                    if v > i32::MAX as u64 {
                        return Err(PErr {
                            span: vs,
                            message: format!("window bound {v} is out of range: expected at most {}", i32::MAX),
                        });
                    }
                    let slot = if key == "left" { &mut w.left } else { &mut w.right };
                    slot.replace((v, vs)).is_some()
                }
                _ => {
                    let (a, s) = self.choice(&["top_left", "bottom_right"])?;
                    let a = if a == "top_left" { Align::TopLeft } else { Align::BottomRight };
                    w.align.replace((a, s)).is_some()
                }
            };
            if dup {
                return Err(PErr {
                    span: ks,
                    message: format!("`{key}` is given twice: expected each of left, right and align at most once"),
                });
            }
            if self.eat(P::Comma).is_none() {
                break self.expect(P::RParen)?;
            }
        };
        let span = name_span.to(close);
        if w.left.is_none() && w.right.is_none() {
            return Err(PErr { span, message: "a window needs a bound: expected `left=N`, `right=N` or both".into() });
        }
        Ok(Node { kind: NodeKind::Window(w), span, depth: 1 })
    }
}
