//! The expression language shared by masks and score modifications.
//!
//! Expressions are strictly typed (`int`, `float`, `bool`): there are no implicit
//! conversions, so `q - k` is an int and `float(q - k)` is needed before mixing it with
//! `score`. That keeps the semantics identical on the CPU reference, in the interval
//! analysis and in generated code, and turns a class of silent bugs into diagnostics.
//!
//! Integer semantics (the same everywhere): 32-bit two's-complement wrapping arithmetic,
//! in the reference and in kernels alike (params are i32 at launch, literals must fit);
//! `/` and `%` are *floor* division and modulo, and division by zero yields 0.
//! Aux-tensor indices are clamped into the tensor, so an index expression can never read
//! outside it.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A byte range in the source a node came from. Equality ignores spans so that a spec
/// parsed from text equals the same spec built in code.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct Span {
    pub start: usize,
    pub end: usize,
}

impl Span {
    pub fn new(start: usize, end: usize) -> Self {
        Span { start, end }
    }
    /// The smallest span covering both.
    pub fn to(self, other: Span) -> Span {
        Span { start: self.start.min(other.start), end: self.end.max(other.end) }
    }
}

impl PartialEq for Span {
    fn eq(&self, _: &Span) -> bool {
        true
    }
}
impl Eq for Span {}
impl std::hash::Hash for Span {
    fn hash<H: std::hash::Hasher>(&self, _: &mut H) {}
}

/// The three value types of the expression language.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Ty {
    Int,
    Float,
    Bool,
}

impl fmt::Display for Ty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Ty::Int => "int",
            Ty::Float => "float",
            Ty::Bool => "bool",
        })
    }
}

/// Built-in variables. Positions are within the sequence of the current batch entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Var {
    /// Batch index.
    B,
    /// Query head index (0..q_heads).
    H,
    /// KV head index (h / (q_heads / kv_heads)).
    Hkv,
    /// Query position (0..seqlen_q).
    Q,
    /// Key position (0..seqlen_k).
    K,
    /// The scaled score `scale · q·k`; score modifications only.
    Score,
    /// This batch entry's query length.
    SeqlenQ,
    /// This batch entry's key length.
    SeqlenK,
    /// Number of query heads (a compile-time constant).
    QHeads,
    /// Number of KV heads (a compile-time constant).
    KvHeads,
}

impl Var {
    pub const ALL: [Var; 10] =
        [Var::B, Var::H, Var::Hkv, Var::Q, Var::K, Var::Score, Var::SeqlenQ, Var::SeqlenK, Var::QHeads, Var::KvHeads];
    pub fn name(self) -> &'static str {
        match self {
            Var::B => "b",
            Var::H => "h",
            Var::Hkv => "hkv",
            Var::Q => "q",
            Var::K => "k",
            Var::Score => "score",
            Var::SeqlenQ => "seqlen_q",
            Var::SeqlenK => "seqlen_k",
            Var::QHeads => "q_heads",
            Var::KvHeads => "kv_heads",
        }
    }
    pub fn from_name(s: &str) -> Option<Var> {
        Var::ALL.into_iter().find(|v| v.name() == s)
    }
    pub fn ty(self) -> Ty {
        match self {
            Var::Score => Ty::Float,
            _ => Ty::Int,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum UnOp {
    /// Arithmetic negation (int or float).
    Neg,
    /// Logical not (bool).
    Not,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
    And,
    Or,
}

impl BinOp {
    pub fn symbol(self) -> &'static str {
        match self {
            BinOp::Add => "+",
            BinOp::Sub => "-",
            BinOp::Mul => "*",
            BinOp::Div => "/",
            BinOp::Rem => "%",
            BinOp::Lt => "<",
            BinOp::Le => "<=",
            BinOp::Gt => ">",
            BinOp::Ge => ">=",
            BinOp::Eq => "==",
            BinOp::Ne => "!=",
            BinOp::And => "&&",
            BinOp::Or => "||",
        }
    }
    /// Binding strength for printing and parsing (higher binds tighter).
    pub fn precedence(self) -> u8 {
        match self {
            BinOp::Or => 1,
            BinOp::And => 2,
            BinOp::Eq | BinOp::Ne => 3,
            BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge => 4,
            BinOp::Add | BinOp::Sub => 5,
            BinOp::Mul | BinOp::Div | BinOp::Rem => 6,
        }
    }
    pub fn is_comparison(self) -> bool {
        matches!(self, BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge | BinOp::Eq | BinOp::Ne)
    }
}

/// Built-in functions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Func {
    /// `min(a, b)`, int or float.
    Min,
    /// `max(a, b)`, int or float.
    Max,
    /// `abs(a)`, int or float.
    Abs,
    /// `select(cond, a, b)`: `a` where `cond`, else `b`.
    Select,
    /// `float(i)`: int to float.
    ToFloat,
    /// `int(x)`: float to int, rounding toward zero.
    ToInt,
    Exp,
    Exp2,
    Log,
    Log2,
    Sqrt,
    Tanh,
    Sigmoid,
    /// `softcap(x, c) = c · tanh(x / c)` (Gemma 2, Grok).
    Softcap,
}

impl Func {
    pub const ALL: [Func; 14] = [
        Func::Min,
        Func::Max,
        Func::Abs,
        Func::Select,
        Func::ToFloat,
        Func::ToInt,
        Func::Exp,
        Func::Exp2,
        Func::Log,
        Func::Log2,
        Func::Sqrt,
        Func::Tanh,
        Func::Sigmoid,
        Func::Softcap,
    ];
    pub fn name(self) -> &'static str {
        match self {
            Func::Min => "min",
            Func::Max => "max",
            Func::Abs => "abs",
            Func::Select => "select",
            Func::ToFloat => "float",
            Func::ToInt => "int",
            Func::Exp => "exp",
            Func::Exp2 => "exp2",
            Func::Log => "log",
            Func::Log2 => "log2",
            Func::Sqrt => "sqrt",
            Func::Tanh => "tanh",
            Func::Sigmoid => "sigmoid",
            Func::Softcap => "softcap",
        }
    }
    pub fn from_name(s: &str) -> Option<Func> {
        Func::ALL.into_iter().find(|f| f.name() == s)
    }
    pub fn arity(self) -> usize {
        match self {
            Func::Select => 3,
            Func::Min | Func::Max | Func::Softcap => 2,
            _ => 1,
        }
    }
}

/// An expression node with the source span it came from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Expr {
    pub kind: ExprKind,
    #[serde(skip)]
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ExprKind {
    Int(i64),
    Float(f64),
    Bool(bool),
    Var(Var),
    /// A scalar parameter declared with `param NAME: TYPE`, bound at launch.
    Param(String),
    /// An element of an integer aux tensor declared with `aux NAME: int[dims]`.
    Aux {
        name: String,
        index: Vec<Expr>,
    },
    Unary(UnOp, Box<Expr>),
    Binary(BinOp, Box<Expr>, Box<Expr>),
    Call(Func, Vec<Expr>),
}

impl Expr {
    /// Whether `self` and `other` are the same expression, spans aside (every node of the
    /// IR is pure, so the same expression has the same value at every element).
    pub fn same_as(&self, other: &Expr) -> bool {
        use ExprKind::*;
        match (&self.kind, &other.kind) {
            (Int(a), Int(b)) => a == b,
            (Float(a), Float(b)) => a.to_bits() == b.to_bits(),
            (Bool(a), Bool(b)) => a == b,
            (Var(a), Var(b)) => a == b,
            (Param(a), Param(b)) => a == b,
            (Aux { name: a, index: i }, Aux { name: b, index: j }) => {
                a == b && i.len() == j.len() && i.iter().zip(j).all(|(x, y)| x.same_as(y))
            }
            (Unary(o, a), Unary(p, b)) => o == p && a.same_as(b),
            (Binary(o, a, c), Binary(p, b, d)) => o == p && a.same_as(b) && c.same_as(d),
            (Call(f, a), Call(g, b)) => f == g && a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.same_as(y)),
            _ => false,
        }
    }

    pub fn new(kind: ExprKind) -> Expr {
        Expr { kind, span: Span::default() }
    }
    pub fn with_span(mut self, span: Span) -> Expr {
        self.span = span;
        self
    }
    pub fn int(v: i64) -> Expr {
        Expr::new(ExprKind::Int(v))
    }
    pub fn float(v: f64) -> Expr {
        Expr::new(ExprKind::Float(v))
    }
    pub fn bool(v: bool) -> Expr {
        Expr::new(ExprKind::Bool(v))
    }
    pub fn var(v: Var) -> Expr {
        Expr::new(ExprKind::Var(v))
    }
    pub fn param(name: &str) -> Expr {
        Expr::new(ExprKind::Param(name.to_string()))
    }
    pub fn aux(name: &str, index: Vec<Expr>) -> Expr {
        Expr::new(ExprKind::Aux { name: name.to_string(), index })
    }
    pub fn unary(op: UnOp, a: Expr) -> Expr {
        Expr::new(ExprKind::Unary(op, Box::new(a)))
    }
    pub fn binary(op: BinOp, a: Expr, b: Expr) -> Expr {
        Expr::new(ExprKind::Binary(op, Box::new(a), Box::new(b)))
    }
    pub fn call(f: Func, args: Vec<Expr>) -> Expr {
        Expr::new(ExprKind::Call(f, args))
    }
    pub fn and(self, other: Expr) -> Expr {
        Expr::binary(BinOp::And, self, other)
    }

    /// Visits every node, parents before children.
    pub fn walk<'a>(&'a self, f: &mut dyn FnMut(&'a Expr)) {
        f(self);
        match &self.kind {
            ExprKind::Aux { index, .. } => index.iter().for_each(|e| e.walk(f)),
            ExprKind::Unary(_, a) => a.walk(f),
            ExprKind::Binary(_, a, b) => {
                a.walk(f);
                b.walk(f);
            }
            ExprKind::Call(_, args) => args.iter().for_each(|e| e.walk(f)),
            _ => {}
        }
    }

    /// Whether any node satisfies `pred`.
    pub fn any(&self, pred: &dyn Fn(&Expr) -> bool) -> bool {
        let mut found = false;
        self.walk(&mut |e| found |= pred(e));
        found
    }

    pub fn uses_var(&self, v: Var) -> bool {
        self.any(&|e| matches!(e.kind, ExprKind::Var(x) if x == v))
    }
    pub fn uses_aux(&self) -> bool {
        self.any(&|e| matches!(e.kind, ExprKind::Aux { .. }))
    }
    pub fn uses_params(&self) -> bool {
        self.any(&|e| matches!(e.kind, ExprKind::Param(_)))
    }
}
