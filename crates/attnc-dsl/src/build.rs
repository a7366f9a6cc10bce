//! From the parser's [`Raw`] settings to an [`attnc_ir::Spec`]: required settings,
//! declarations, name resolution, the mask-conjunct rule, and finally
//! [`attnc_ir::validate`] with each of its errors mapped back to a source span.

use crate::diag::{line_col, suggest};
use crate::parser::{Node, NodeKind, PErr, Raw, WindowArgs};
use attnc_ir::check::is_reserved;
use attnc_ir::{
    Align, AuxDecl, BinOp, DType, Expr, ExprKind, Field, Func, KvLayout, Mask, ParamDecl, Scale, SoftmaxOptions, Span,
    Spec, SpecError, SplitKv, Var, Window,
};

/// Where the parts of one aux declaration are.
#[derive(Clone, Copy)]
struct AuxLocs {
    name: Span,
    elem: Span,
    dims: Span,
    learnable: Option<Span>,
}

/// Where each part of the spec came from, for validation errors.
#[derive(Default)]
struct Locs {
    header: Span,
    name: Span,
    dtype: Option<Span>,
    head_dim: Option<Span>,
    heads: Option<Span>,
    pack_gqa: Option<Span>,
    /// (name, whole declaration)
    params: Vec<(Span, Span)>,
    aux: Vec<AuxLocs>,
    causal: Option<Span>,
    window: Option<Span>,
    window_align: Option<Span>,
    mask: Option<Span>,
    score: Option<Span>,
    scale: Option<Span>,
    sinks: Option<Span>,
    kv: Option<Span>,
    page_size: Option<Span>,
    split: Option<Span>,
    lse: Option<Span>,
    shards: Option<Span>,
    softmax: Option<Span>,
    exp2_emulation: Option<Span>,
    rescale_threshold: Option<Span>,
}

impl Locs {
    fn locate(&self, e: &SpecError) -> Span {
        if let Some(s) = e.span {
            return s;
        }
        let h = self.header;
        let m = e.message.as_str();
        match e.field {
            Field::Name => self.name,
            Field::DType => self.dtype.unwrap_or(h),
            Field::HeadDim => self.head_dim.unwrap_or(h),
            Field::Heads => self.heads.unwrap_or(h),
            Field::PackGqa => self.pack_gqa.or(self.heads).unwrap_or(h),
            Field::Param(i) => {
                self.params.get(i).map_or(
                    h,
                    |(name, decl)| {
                        if m.contains("must be int or float") {
                            *decl
                        } else {
                            *name
                        }
                    },
                )
            }
            Field::Aux(i) => self.aux.get(i).map_or(h, |a| {
                if m.contains("cannot name") || m.contains("declared twice") {
                    a.name
                } else if m.contains("cannot be learnable") {
                    a.learnable.unwrap_or(a.elem)
                } else {
                    a.dims
                }
            }),
            Field::Causal => self.causal.or(self.mask).unwrap_or(h),
            Field::Window => {
                let w = self.window.or(self.mask).unwrap_or(h);
                if m.contains("alignment") {
                    self.window_align.unwrap_or(w)
                } else {
                    w
                }
            }
            Field::Mask => self.mask.unwrap_or(h),
            Field::ScoreMod => self.score.unwrap_or(h),
            Field::Scale => self.scale.unwrap_or(h),
            Field::Sinks => self.sinks.unwrap_or(h),
            Field::KvLayout => self.page_size.or(self.kv).unwrap_or(h),
            Field::SplitKv => self.split.unwrap_or(h),
            Field::Lse => self.lse.unwrap_or(h),
            Field::Shards => self.shards.unwrap_or(h),
            Field::Softmax => {
                let s = self.softmax.unwrap_or(h);
                if m.contains("exp2_emulation") {
                    self.exp2_emulation.unwrap_or(s)
                } else if m.contains("rescale_threshold") {
                    self.rescale_threshold.unwrap_or(s)
                } else {
                    s
                }
            }
        }
    }
}

struct Builder<'s> {
    src: &'s str,
    errors: Vec<PErr>,
    params: Vec<ParamDecl>,
    aux: Vec<AuxDecl>,
    /// A param named `causal` turns a bare `causal` into that param.
    causal_is_param: bool,
}

/// The mask's `causal` and `window` conjuncts, taken out of the expression.
#[derive(Default)]
struct MaskParts {
    causal: Option<(Align, Span)>,
    window: Option<(WindowArgs, Span)>,
}

pub(crate) fn build(raw: Raw, src: &str) -> Result<Spec, Vec<PErr>> {
    let mut b = Builder { src, errors: Vec::new(), params: Vec::new(), aux: Vec::new(), causal_is_param: false };
    let mut locs = Locs { header: raw.header, name: raw.name_span, ..Locs::default() };

    if raw.head_dim.is_none() {
        b.err(
            raw.header,
            "missing `head_dim`: expected a setting like `head_dim 128` (64, 96, 128, 192/128, 192 or 256)".into(),
        );
    }
    if raw.heads.is_none() {
        b.err(raw.header, "missing `heads`: expected a setting like `heads 32` or `heads 32 kv 8`".into());
    }

    // Declarations share one namespace.
    let mut declared: Vec<(String, Span)> = Vec::new();
    for p in &raw.params {
        b.check_name(&p.name, p.name_span, ("a parameter", "parameter"), &declared);
        declared.push((p.name.clone(), p.name_span));
        b.params.push(ParamDecl { name: p.name.clone(), ty: p.ty });
        locs.params.push((p.name_span, p.span));
    }
    for a in &raw.aux {
        b.check_name(&a.name, a.name_span, ("an aux tensor", "aux tensor"), &declared);
        declared.push((a.name.clone(), a.name_span));
        b.aux.push(AuxDecl {
            name: a.name.clone(),
            dims: a.dims.iter().map(|(d, _)| *d).collect(),
            elem: a.elem,
            learnable: a.learnable.is_some(),
        });
        locs.aux.push(AuxLocs { name: a.name_span, elem: a.elem_span, dims: a.dims_span, learnable: a.learnable });
    }
    b.causal_is_param = b.params.iter().any(|p| p.name == "causal");

    let mut mask = Mask::default();
    if let Some((node, span)) = raw.mask {
        locs.mask = Some(span);
        if let Some(node) = node {
            let mut parts = MaskParts::default();
            let rest = b.strip(node, &mut parts);
            if let Some((align, s)) = parts.causal {
                mask.causal = Some(align);
                locs.causal = Some(s);
            }
            if let Some((w, s)) = parts.window {
                locs.window = Some(s);
                let default_align = mask.causal.unwrap_or_default();
                let align = match w.align {
                    Some((a, as_)) => {
                        locs.window_align = Some(as_);
                        if let Some(c) = mask.causal.filter(|c| *c != a) {
                            b.err(
                                as_,
                                format!(
                                    "contradictory alignment: causal is {} but the window is {}: expected the same alignment for both (or drop `align=`)",
                                    c.name(),
                                    a.name()
                                ),
                            );
                        }
                        a
                    }
                    None => default_align,
                };
                mask.window = Some(Window { left: w.left.map(|v| v.0), right: w.right.map(|v| v.0), align });
            }
            if let Some(rest) = rest {
                locs.mask = Some(rest.span);
                mask.predicate = b.resolve(rest);
            }
        }
    }
    let score_mod = raw.score.and_then(|n| {
        locs.score = Some(n.span);
        b.resolve(n)
    });

    let (head_dim_qk, head_dim_v) = raw.head_dim.map_or((128, 128), |(qk, v, s)| {
        locs.head_dim = Some(s);
        (qk, v)
    });
    let (q_heads, kv_heads, pack_gqa) = raw.heads.map_or((1, 1, false), |h| {
        locs.heads = Some(h.span);
        locs.pack_gqa = h.pack_gqa;
        (h.q, h.kv.unwrap_or(h.q), h.pack_gqa.is_some())
    });
    locs.dtype = raw.dtype.map(|d| d.1);
    locs.scale = raw.scale.map(|d| d.1);
    locs.sinks = raw.sinks;
    locs.lse = raw.lse;
    locs.shards = raw.shards;
    locs.split = raw.split.map(|s| s.1);
    if let Some((_, s, ps)) = raw.kv {
        locs.kv = Some(s);
        locs.page_size = ps;
    }
    if let Some(sm) = &raw.softmax {
        locs.softmax = Some(sm.span);
        locs.exp2_emulation = sm.exp2_emulation;
        locs.rescale_threshold = sm.rescale_threshold;
    }

    if !b.errors.is_empty() {
        return Err(b.errors);
    }
    let spec = Spec {
        name: raw.name,
        dtype: raw.dtype.map_or(DType::Bf16, |d| d.0),
        head_dim_qk,
        head_dim_v,
        q_heads,
        kv_heads,
        pack_gqa,
        params: b.params,
        aux: b.aux,
        mask,
        score_mod,
        scale: raw.scale.map_or(Scale::Default, |s| Scale::Value(s.0)),
        sinks: raw.sinks.is_some(),
        kv_layout: raw.kv.map_or(KvLayout::Contiguous, |k| k.0),
        split_kv: raw.split.map_or(SplitKv::None, |s| s.0),
        lse: raw.lse.is_some(),
        shards: raw.shards.is_some(),
        query_rows: attnc_ir::QueryRows::Any,
        softmax: raw.softmax.map_or(SoftmaxOptions::default(), |s| s.opts),
    };
    match attnc_ir::validate(&spec) {
        Ok(()) => Ok(spec),
        Err(errors) => Err(errors.iter().map(|e| PErr { span: locs.locate(e), message: e.message.clone() }).collect()),
    }
}

impl Builder<'_> {
    fn err(&mut self, span: Span, message: String) {
        self.errors.push(PErr { span, message });
    }

    fn at(&self, span: Span) -> String {
        let (l, c) = line_col(self.src, span.start);
        format!("{l}:{c}")
    }

    fn check_name(&mut self, name: &str, span: Span, (a_what, what): (&str, &str), declared: &[(String, Span)]) {
        let kind = if Var::from_name(name).is_some() {
            Some("a built-in variable")
        } else if Func::from_name(name).is_some() {
            Some("a built-in function")
        } else if is_reserved(name) {
            Some("a literal")
        } else {
            None
        };
        if let Some(kind) = kind {
            self.err(span, format!("`{name}` is {kind} and cannot name {a_what}: expected another name"));
        } else if let Some((_, first)) = declared.iter().find(|(n, _)| n == name) {
            let at = self.at(*first);
            self.err(span, format!("`{name}` is already declared at {at}: expected a new name for this {what}"));
        }
    }

    /// Takes the top-level `&&` conjuncts `causal` / `window(...)` out of a mask,
    /// keeping the shape of what remains.
    fn strip(&mut self, n: Node, parts: &mut MaskParts) -> Option<Node> {
        let Node { kind, span, depth } = n;
        match kind {
            NodeKind::Binary(BinOp::And, l, r) => {
                let l = self.strip(*l, parts);
                let r = self.strip(*r, parts);
                match (l, r) {
                    (Some(l), Some(r)) => {
                        let (span, depth) = (l.span.to(r.span), 1 + l.depth.max(r.depth));
                        Some(Node { kind: NodeKind::Binary(BinOp::And, Box::new(l), Box::new(r)), span, depth })
                    }
                    (l, None) => l,
                    (None, r) => r,
                }
            }
            NodeKind::Causal(align) => {
                self.take_causal(align, span, parts);
                None
            }
            NodeKind::Ident(name) if name == "causal" && !self.causal_is_param => {
                self.take_causal(Align::TopLeft, span, parts);
                None
            }
            NodeKind::Window(w) => {
                if let Some((_, first)) = &parts.window {
                    let at = self.at(*first);
                    self.err(span, format!("a second `window` in the mask (the first is at {at}): expected at most one; merge the bounds"));
                } else {
                    parts.window = Some((w, span));
                }
                None
            }
            kind => Some(Node { kind, span, depth }),
        }
    }

    fn take_causal(&mut self, align: Align, span: Span, parts: &mut MaskParts) {
        if let Some((_, first)) = parts.causal {
            let at = self.at(first);
            self.err(span, format!("a second `causal` in the mask (the first is at {at}): expected at most one"));
        } else {
            parts.causal = Some((align, span));
        }
    }

    fn misplaced(&mut self, what: &str, span: Span) {
        self.err(
            span,
            format!(
                "`{what}` may only appear as a top-level `&&` conjunct of `mask` (as in `mask {what}{} && ...`): expected an int, float or bool expression here",
                if what == "window" { "(left=...)" } else { "" }
            ),
        );
    }

    /// Resolves identifiers and builds the IR expression; reports every unresolved
    /// name (returns `None` if there was any).
    fn resolve(&mut self, n: Node) -> Option<Expr> {
        let span = n.span;
        let kind = match n.kind {
            NodeKind::Int(v) => ExprKind::Int(v),
            NodeKind::Float(v) => ExprKind::Float(v),
            NodeKind::Bool(v) => ExprKind::Bool(v),
            NodeKind::Ident(name) => {
                if let Some(v) = Var::from_name(&name) {
                    ExprKind::Var(v)
                } else if self.params.iter().any(|p| p.name == name) {
                    ExprKind::Param(name)
                } else if name == "causal" {
                    self.misplaced("causal", span);
                    return None;
                } else if let Some(a) = self.aux.iter().find(|a| a.name == name) {
                    let n = a.dims.len();
                    self.err(
                        span,
                        format!("aux tensor `{name}` must be indexed: expected `{name}[...]` with {n} index(es)"),
                    );
                    return None;
                } else if Func::from_name(&name).is_some() {
                    self.err(span, format!("`{name}` is a function: expected a call like `{name}(...)`"));
                    return None;
                } else {
                    let mut m = format!(
                        "unknown identifier `{name}`: expected a variable ({}), a declared param or aux tensor",
                        Var::ALL.map(|v| v.name()).join(", ")
                    );
                    let names = Var::ALL
                        .iter()
                        .map(|v| v.name())
                        .chain(self.params.iter().map(|p| p.name.as_str()))
                        .chain(self.aux.iter().map(|a| a.name.as_str()));
                    if let Some(s) = suggest(&name, names) {
                        m.push_str(&format!(" (did you mean `{s}`?)"));
                    }
                    self.err(span, m);
                    return None;
                }
            }
            NodeKind::Index { name, name_span, args } => {
                if !self.aux.iter().any(|a| a.name == name) {
                    let m = if self.params.iter().any(|p| p.name == name) {
                        format!("`{name}` is a parameter, not an aux tensor: expected `{name}` without an index")
                    } else if Var::from_name(&name).is_some() {
                        format!("`{name}` is a variable, not an aux tensor: expected an aux tensor declared with `aux NAME: int[...]`")
                    } else {
                        let mut m =
                            format!("unknown aux tensor `{name}`: expected one declared with `aux {name}: int[...]`");
                        if let Some(s) = suggest(&name, self.aux.iter().map(|a| a.name.as_str())) {
                            m.push_str(&format!(" (did you mean `{s}`?)"));
                        }
                        m
                    };
                    self.err(name_span, m);
                    // Still look inside for more errors.
                    args.into_iter().for_each(|a| drop(self.resolve(a)));
                    return None;
                }
                let index = self.resolve_all(args)?;
                ExprKind::Aux { name, index }
            }
            NodeKind::Call { name, name_span, args } => {
                let Some(f) = Func::from_name(&name) else {
                    let mut m = format!(
                        "unknown function `{name}`: expected one of {}",
                        Func::ALL.map(|f| f.name()).join(", ")
                    );
                    if let Some(s) = suggest(&name, Func::ALL.map(|f| f.name())) {
                        m.push_str(&format!(" (did you mean `{s}`?)"));
                    }
                    self.err(name_span, m);
                    args.into_iter().for_each(|a| drop(self.resolve(a)));
                    return None;
                };
                ExprKind::Call(f, self.resolve_all(args)?)
            }
            NodeKind::Unary(op, a) => ExprKind::Unary(op, Box::new(self.resolve(*a)?)),
            NodeKind::Binary(op, a, b) => {
                let a = self.resolve(*a);
                let b = self.resolve(*b);
                ExprKind::Binary(op, Box::new(a?), Box::new(b?))
            }
            NodeKind::Causal(_) => {
                self.misplaced("causal", span);
                return None;
            }
            NodeKind::Window(_) => {
                self.misplaced("window", span);
                return None;
            }
        };
        Some(Expr { kind, span })
    }

    fn resolve_all(&mut self, args: Vec<Node>) -> Option<Vec<Expr>> {
        let out: Vec<Option<Expr>> = args.into_iter().map(|a| self.resolve(a)).collect();
        out.into_iter().collect()
    }
}
