//! The type checker for expressions and the validity rules of a whole spec.
//!
//! Errors name the spec field they concern and, for expressions, the span of the
//! offending node, so the DSL can point a caret at it and a Rust caller gets a precise
//! message too.

use crate::expr::{BinOp, Expr, ExprKind, Func, Span, Ty, UnOp, Var};
use crate::spec::{AuxElem, KvLayout, Spec, SplitKv, SUPPORTED_HEAD_DIMS};
use std::collections::HashSet;
use std::fmt;

/// The part of a spec an error is about; the DSL maps it back to a source location.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Field {
    Name,
    DType,
    HeadDim,
    Heads,
    PackGqa,
    Param(usize),
    Aux(usize),
    Causal,
    Window,
    Mask,
    ScoreMod,
    Scale,
    Sinks,
    KvLayout,
    SplitKv,
    Lse,
    Shards,
    Softmax,
}

#[derive(Clone, Debug, PartialEq)]
pub struct SpecError {
    pub field: Field,
    /// Set for errors inside an expression: the node at fault.
    pub span: Option<Span>,
    pub message: String,
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for SpecError {}

/// Where an expression appears decides which variables it may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExprContext {
    Mask,
    ScoreMod,
}

struct TypeChecker<'a> {
    spec: &'a Spec,
    ctx: ExprContext,
    field: Field,
}

impl TypeChecker<'_> {
    fn err(&self, e: &Expr, message: String) -> SpecError {
        SpecError { field: self.field, span: Some(e.span), message }
    }

    fn expect(&self, e: &Expr, want: Ty, what: &str) -> Result<(), SpecError> {
        let got = self.ty(e)?;
        self.expect_ty(e, got, want, what)
    }

    /// Like `expect` for a child whose type is already known (each node is typed once,
    /// so checking is linear in the expression's size).
    fn expect_ty(&self, e: &Expr, got: Ty, want: Ty, what: &str) -> Result<(), SpecError> {
        if got == want {
            Ok(())
        } else {
            let hint = match (got, want) {
                (Ty::Int, Ty::Float) => " (convert with float(...))",
                (Ty::Float, Ty::Int) => " (convert with int(...))",
                (Ty::Bool, _) => " (use select(cond, a, b) to turn a bool into a number)",
                _ => "",
            };
            Err(self.err(e, format!("type error: expected {want} for {what}, found {got}{hint}")))
        }
    }

    fn ty(&self, e: &Expr) -> Result<Ty, SpecError> {
        match &e.kind {
            ExprKind::Int(v) => {
                if i32::try_from(*v).is_ok() {
                    Ok(Ty::Int)
                } else {
                    Err(self.err(e, format!("integer literal {v} is out of range (ints are 32-bit)")))
                }
            }
            ExprKind::Float(v) => {
                // Kernels compute in f32: a literal beyond its range would be infinite
                // there but finite in the f64 reference.
                if v.is_finite() && v.abs() <= f32::MAX as f64 {
                    Ok(Ty::Float)
                } else {
                    Err(self.err(
                        e,
                        format!(
                            "float literal {v} is out of range (floats are f32 in kernels, at most {:e})",
                            f32::MAX
                        ),
                    ))
                }
            }
            ExprKind::Bool(_) => Ok(Ty::Bool),
            ExprKind::Var(v) => {
                if *v == Var::Score && self.ctx == ExprContext::Mask {
                    return Err(self.err(e, "`score` is only available in score modifications, not in masks".into()));
                }
                Ok(v.ty())
            }
            ExprKind::Param(name) => match self.spec.param(name) {
                Some(p) => Ok(p.ty),
                None => Err(self.err(e, format!("unknown parameter `{name}` (declare it with `param {name}: int`)"))),
            },
            ExprKind::Aux { name, index } => {
                let Some(decl) = self.spec.aux_decl(name) else {
                    return Err(
                        self.err(e, format!("unknown aux tensor `{name}` (declare it with `aux {name}: int[...]`)"))
                    );
                };
                if index.len() != decl.dims.len() {
                    return Err(self.err(
                        e,
                        format!(
                            "aux tensor `{name}` has {} dimension(s), indexed with {}",
                            decl.dims.len(),
                            index.len()
                        ),
                    ));
                }
                for i in index {
                    self.expect(i, Ty::Int, "an aux index")?;
                }
                Ok(decl.elem.ty())
            }
            ExprKind::Unary(op, a) => {
                let t = self.ty(a)?;
                match op {
                    UnOp::Neg if t != Ty::Bool => Ok(t),
                    UnOp::Neg => Err(self.err(e, "type error: cannot negate a bool (use `!`)".into())),
                    UnOp::Not => {
                        self.expect_ty(a, t, Ty::Bool, "`!`")?;
                        Ok(Ty::Bool)
                    }
                }
            }
            ExprKind::Binary(op, a, b) => {
                let (ta, tb) = (self.ty(a)?, self.ty(b)?);
                match op {
                    BinOp::And | BinOp::Or => {
                        self.expect_ty(a, ta, Ty::Bool, &format!("`{}`", op.symbol()))?;
                        self.expect_ty(b, tb, Ty::Bool, &format!("`{}`", op.symbol()))?;
                        Ok(Ty::Bool)
                    }
                    _ => {
                        if ta == Ty::Bool && !matches!(op, BinOp::Eq | BinOp::Ne) {
                            return Err(self.err(
                                a,
                                format!("type error: `{}` needs int or float operands, found bool", op.symbol()),
                            ));
                        }
                        if ta != tb {
                            return Err(self.err(
                                e,
                                format!(
                                    "type error: `{}` mixes {ta} and {tb}; convert one side with {}(...)",
                                    op.symbol(),
                                    if ta == Ty::Float || tb == Ty::Float { "float" } else { "int" }
                                ),
                            ));
                        }
                        if *op == BinOp::Rem && ta != Ty::Int {
                            return Err(self.err(e, format!("type error: `%` needs int operands, found {ta}")));
                        }
                        if op.is_comparison() {
                            Ok(Ty::Bool)
                        } else {
                            Ok(ta)
                        }
                    }
                }
            }
            ExprKind::Call(f, args) => {
                if args.len() != f.arity() {
                    return Err(
                        self.err(e, format!("`{}` takes {} argument(s), found {}", f.name(), f.arity(), args.len()))
                    );
                }
                match f {
                    Func::Min | Func::Max => {
                        let t = self.ty(&args[0])?;
                        if t == Ty::Bool {
                            return Err(self
                                .err(&args[0], format!("type error: `{}` needs int or float, found bool", f.name())));
                        }
                        self.expect(&args[1], t, &format!("the second argument of `{}`", f.name()))?;
                        Ok(t)
                    }
                    Func::Abs => {
                        let t = self.ty(&args[0])?;
                        if t == Ty::Bool {
                            return Err(self.err(&args[0], "type error: `abs` needs int or float, found bool".into()));
                        }
                        Ok(t)
                    }
                    Func::Select => {
                        self.expect(&args[0], Ty::Bool, "the condition of `select`")?;
                        let t = self.ty(&args[1])?;
                        self.expect(&args[2], t, "the else-branch of `select` (both branches must have one type)")?;
                        Ok(t)
                    }
                    Func::ToFloat => {
                        self.expect(&args[0], Ty::Int, "`float(...)`")?;
                        Ok(Ty::Float)
                    }
                    Func::ToInt => {
                        self.expect(&args[0], Ty::Float, "`int(...)`")?;
                        Ok(Ty::Int)
                    }
                    Func::Softcap => {
                        self.expect(&args[0], Ty::Float, "the value of `softcap`")?;
                        self.expect(&args[1], Ty::Float, "the cap of `softcap`")?;
                        Ok(Ty::Float)
                    }
                    _ => {
                        self.expect(&args[0], Ty::Float, &format!("`{}`", f.name()))?;
                        Ok(Ty::Float)
                    }
                }
            }
        }
    }
}

/// The type of an expression in a context, or the first type error.
///
/// In a mask, a value read from a float aux tensor may only reach the mask's result
/// through a comparison (`bias[h, 0] > 0.5`): converting it with `int(...)` (to index,
/// to do int arithmetic) is an error pointing at the read. Masks are where tiles are
/// skipped and the backward treats the mask as constant; keeping float data to
/// thresholds makes that explicit and leaves the int side of masks (what the interval
/// analysis bounds) free of float data.
pub fn type_of(spec: &Spec, e: &Expr, ctx: ExprContext) -> Result<Ty, SpecError> {
    let field = match ctx {
        ExprContext::Mask => Field::Mask,
        ExprContext::ScoreMod => Field::ScoreMod,
    };
    let t = TypeChecker { spec, ctx, field }.ty(e)?;
    if ctx == ExprContext::Mask {
        uncompared_float_aux(spec, e)?;
    }
    Ok(t)
}

/// The first read of a float aux tensor in `e` whose value is not yet compared (it may
/// still flow into an `int(...)`), or an error for a read that does flow into one.
/// Linear: each node is visited once.
fn uncompared_float_aux<'e>(spec: &Spec, e: &'e Expr) -> Result<Option<&'e Expr>, SpecError> {
    Ok(match &e.kind {
        ExprKind::Aux { name, index } => {
            for i in index {
                uncompared_float_aux(spec, i)?;
            }
            let float = spec.aux_decl(name).is_some_and(|d| d.elem == AuxElem::Float);
            float.then_some(e)
        }
        ExprKind::Unary(_, a) => uncompared_float_aux(spec, a)?,
        ExprKind::Binary(op, a, b) => {
            let (x, y) = (uncompared_float_aux(spec, a)?, uncompared_float_aux(spec, b)?);
            if op.is_comparison() {
                None
            } else {
                x.or(y)
            }
        }
        ExprKind::Call(f, args) => {
            let mut first = None;
            for a in args {
                first = first.or(uncompared_float_aux(spec, a)?);
            }
            if let (Func::ToInt, Some(read)) = (f, first) {
                let name = match &read.kind {
                    ExprKind::Aux { name, .. } => name.as_str(),
                    _ => "",
                };
                return Err(SpecError {
                    field: Field::Mask,
                    span: Some(read.span),
                    message: format!(
                        "float aux tensor `{name}` flows into `int(...)` in a mask: expected it only in a comparison (as in `{name}[...] > 0.5`)"
                    ),
                });
            }
            first
        }
        _ => None,
    })
}

fn is_ident(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Words that cannot name a param or aux tensor because expressions already use them.
pub fn is_reserved(name: &str) -> bool {
    Var::from_name(name).is_some() || Func::from_name(name).is_some() || matches!(name, "true" | "false")
}

/// The largest window bound; see `validate`.
pub const MAX_WINDOW: u64 = 1 << 30;

/// The longest sequence a launch may use (positions and `diag ± window` stay in i32).
pub const MAX_SEQLEN: u64 = 1 << 30;

/// Checks every rule of a spec; returns all errors found (in field order).
pub fn validate(spec: &Spec) -> Result<(), Vec<SpecError>> {
    let mut errors = Vec::new();
    let mut err = |field: Field, message: String| errors.push(SpecError { field, span: None, message });

    if !is_ident(&spec.name) {
        err(Field::Name, format!("expected an identifier as the variant name, found `{}`", spec.name));
    }
    if !SUPPORTED_HEAD_DIMS.contains(&(spec.head_dim_qk, spec.head_dim_v)) {
        let list: Vec<String> =
            SUPPORTED_HEAD_DIMS.iter().map(|(a, b)| if a == b { a.to_string() } else { format!("{a}/{b}") }).collect();
        err(
            Field::HeadDim,
            format!(
                "unsupported head_dim {}: expected one of {}",
                if spec.head_dim_qk == spec.head_dim_v {
                    spec.head_dim_qk.to_string()
                } else {
                    format!("{}/{}", spec.head_dim_qk, spec.head_dim_v)
                },
                list.join(", ")
            ),
        );
    }
    if spec.q_heads == 0 || spec.kv_heads == 0 || spec.q_heads > 1024 || spec.kv_heads > 1024 {
        err(Field::Heads, format!("head counts must be in 1..=1024, found q={} kv={}", spec.q_heads, spec.kv_heads));
    } else if spec.q_heads % spec.kv_heads != 0 {
        err(Field::Heads, format!("q heads ({}) must be a multiple of kv heads ({})", spec.q_heads, spec.kv_heads));
    }
    if spec.pack_gqa && spec.kv_heads != 0 && spec.q_heads == spec.kv_heads {
        err(Field::PackGqa, "pack_gqa needs more q heads than kv heads (this is MHA)".into());
    }

    let mut seen = HashSet::new();
    for (i, p) in spec.params.iter().enumerate() {
        if !is_ident(&p.name) || is_reserved(&p.name) {
            err(Field::Param(i), format!("`{}` cannot name a parameter (reserved or not an identifier)", p.name));
        } else if !seen.insert(p.name.clone()) {
            err(Field::Param(i), format!("`{}` is declared twice", p.name));
        }
        if p.ty == crate::expr::Ty::Bool {
            err(Field::Param(i), format!("parameter `{}` must be int or float", p.name));
        }
    }
    for (i, a) in spec.aux.iter().enumerate() {
        if !is_ident(&a.name) || is_reserved(&a.name) {
            err(Field::Aux(i), format!("`{}` cannot name an aux tensor (reserved or not an identifier)", a.name));
        } else if !seen.insert(a.name.clone()) {
            err(Field::Aux(i), format!("`{}` is declared twice", a.name));
        }
        if a.dims.is_empty() || a.dims.len() > 4 {
            err(Field::Aux(i), format!("aux tensor `{}` needs 1 to 4 dimensions", a.name));
        }
        if a.learnable && a.elem != AuxElem::Float {
            err(
                Field::Aux(i),
                format!(
                    "aux tensor `{}` is {} and cannot be learnable: expected a float tensor (`aux {}: float[...] learnable`)",
                    a.name,
                    a.elem.name(),
                    a.name
                ),
            );
        }
        for d in &a.dims {
            if let crate::spec::AuxDim::Fixed(n) = d {
                if *n == 0 || *n > i32::MAX as u64 {
                    err(
                        Field::Aux(i),
                        format!("aux tensor `{}` has a dimension of size {n} (expected 1..={})", a.name, i32::MAX),
                    );
                }
            }
        }
    }

    if let (Some(c), Some(w)) = (spec.mask.causal, spec.mask.window) {
        if c != w.align {
            err(
                Field::Window,
                format!("contradictory alignment: causal is {} but the window is {}", c.name(), w.align.name()),
            );
        }
    }
    if let Some(w) = spec.mask.window {
        if w.left.is_none() && w.right.is_none() {
            err(Field::Window, "a window needs at least one bound (left or right)".into());
        }
        // Bounds up to 2^30 and sequence lengths below 2^30 (checked at launch) keep
        // `diag ± bound` inside i32, so the mask never wraps.
        for v in [w.left, w.right].into_iter().flatten() {
            if v > MAX_WINDOW {
                err(Field::Window, format!("window bound {v} is out of range (at most {MAX_WINDOW})"));
            }
        }
    }

    if let Some(p) = &spec.mask.predicate {
        match type_of(spec, p, ExprContext::Mask) {
            Ok(Ty::Bool) => {}
            Ok(t) => errors.push(SpecError {
                field: Field::Mask,
                span: Some(p.span),
                message: format!("type error: a mask must be bool, found {t}"),
            }),
            Err(e) => errors.push(e),
        }
    }
    if let Some(s) = &spec.score_mod {
        match type_of(spec, s, ExprContext::ScoreMod) {
            Ok(Ty::Float) => {}
            Ok(t) => errors.push(SpecError {
                field: Field::ScoreMod,
                span: Some(s.span),
                message: format!("type error: a score modification must be float, found {t}"),
            }),
            Err(e) => errors.push(e),
        }
    }
    let mut err = |field: Field, message: String| errors.push(SpecError { field, span: None, message });
    if let crate::spec::Scale::Value(v) = spec.scale {
        if !(v.is_finite() && v > 0.0) {
            err(Field::Scale, format!("softmax scale must be a positive finite number, found {v}"));
        }
    }
    if spec.shards && matches!(spec.kv_layout, KvLayout::Paged { .. }) {
        err(
            Field::Shards,
            "`shards` runs on shards of contiguous or varlen sequences: a paged KV cache is not sharded".into(),
        );
    }
    if let KvLayout::Paged { page_size } = spec.kv_layout {
        if page_size == 0 || page_size > 65536 {
            err(Field::KvLayout, format!("page_size must be in 1..=65536, found {page_size}"));
        }
    }
    if let SplitKv::Fixed(n) = spec.split_kv {
        if n == 0 || n > 256 {
            err(Field::SplitKv, format!("split count must be in 1..=256, found {n}"));
        }
    }
    let o = spec.softmax;
    if !(0.0..=1.0).contains(&o.exp2_emulation) {
        err(Field::Softmax, format!("exp2_emulation is a fraction in [0, 1], found {}", o.exp2_emulation));
    }
    if !(o.rescale_threshold.is_finite() && (0.0..=64.0).contains(&o.rescale_threshold)) {
        err(
            Field::Softmax,
            format!("rescale_threshold must be in [0, 64] (log2 units), found {}", o.rescale_threshold),
        );
    }
    // Conditional rescaling lets P grow up to 2^threshold before it is rounded to the
    // element type for P·V; fp16 overflows past 2^15.
    if spec.dtype == crate::spec::DType::Fp16 && o.rescale_threshold > 15.0 {
        err(
            Field::Softmax,
            format!(
                "rescale_threshold {} would overflow fp16 probabilities (at most 15 for fp16)",
                o.rescale_threshold
            ),
        );
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{Align, ParamDecl, Window};

    fn spec() -> Spec {
        Spec::new("t", 128, 8)
    }

    #[test]
    fn plain_spec_is_valid() {
        assert!(validate(&spec()).is_ok());
    }

    #[test]
    fn bad_head_dim_is_reported() {
        let mut s = spec();
        s.head_dim_qk = 100;
        s.head_dim_v = 100;
        let e = validate(&s).unwrap_err();
        assert_eq!(e[0].field, Field::HeadDim);
        assert!(e[0].message.contains("unsupported head_dim 100"), "{}", e[0].message);
    }

    #[test]
    fn int_float_mix_is_a_type_error() {
        let mut s = spec();
        s.score_mod = Some(Expr::binary(BinOp::Sub, Expr::var(Var::Score), Expr::var(Var::Q)));
        let e = validate(&s).unwrap_err();
        assert_eq!(e[0].field, Field::ScoreMod);
        assert!(e[0].message.contains("mixes float and int"), "{}", e[0].message);
    }

    #[test]
    fn score_in_mask_is_rejected() {
        let mut s = spec();
        s.mask.predicate = Some(Expr::binary(BinOp::Gt, Expr::var(Var::Score), Expr::float(0.0)));
        let e = validate(&s).unwrap_err();
        assert!(e[0].message.contains("only available in score"));
    }

    #[test]
    fn mask_must_be_bool() {
        let mut s = spec();
        s.mask.predicate = Some(Expr::var(Var::Q));
        assert!(validate(&s).unwrap_err()[0].message.contains("mask must be bool"));
    }

    #[test]
    fn contradictory_alignment() {
        let mut s = spec();
        s.mask.causal = Some(Align::TopLeft);
        s.mask.window = Some(Window { left: Some(4), right: Some(0), align: Align::BottomRight });
        assert_eq!(validate(&s).unwrap_err()[0].field, Field::Window);
    }

    #[test]
    fn params_resolve_and_unknown_ones_fail() {
        let mut s = spec();
        s.params.push(ParamDecl { name: "prefix".into(), ty: Ty::Int });
        s.mask.predicate = Some(Expr::binary(BinOp::Lt, Expr::var(Var::K), Expr::param("prefix")));
        assert!(validate(&s).is_ok());
        s.mask.predicate = Some(Expr::binary(BinOp::Lt, Expr::var(Var::K), Expr::param("nope")));
        assert!(validate(&s).unwrap_err()[0].message.contains("unknown parameter `nope`"));
    }

    #[test]
    fn deep_boolean_chains_check_in_linear_time() {
        let mut s = spec();
        let leaf = || Expr::binary(BinOp::Le, Expr::var(Var::K), Expr::var(Var::Q));
        let mut p = leaf();
        for _ in 0..200 {
            p = Expr::unary(UnOp::Not, Expr::binary(BinOp::And, p, leaf()));
        }
        s.mask.predicate = Some(p);
        let t = std::time::Instant::now();
        assert!(validate(&s).is_ok());
        assert!(t.elapsed().as_secs_f64() < 1.0, "took {:?}", t.elapsed());
    }

    #[test]
    fn float_literals_must_fit_f32() {
        let mut s = spec();
        s.score_mod = Some(Expr::binary(BinOp::Mul, Expr::var(Var::Score), Expr::float(1e300)));
        assert!(validate(&s).unwrap_err()[0].message.contains("out of range"));
    }

    #[test]
    fn gqa_ratio_must_divide() {
        let mut s = spec();
        s.kv_heads = 3;
        assert_eq!(validate(&s).unwrap_err()[0].field, Field::Heads);
    }
}
