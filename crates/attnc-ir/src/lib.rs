//! attnc-ir: what an attention variant *is*, independent of any GPU.
//!
//! - [`spec`]: the variant description (head dims, heads, mask, score modification, KV
//!   layout, split-KV, outputs);
//! - [`expr`]: the typed expression language of masks and score modifications;
//! - [`check`]: the type checker and the validity rules of a spec;
//! - [`eval`]: concrete evaluation, the definition of an expression's meaning.

pub mod check;
pub mod eval;
pub mod expr;
pub mod spec;

pub use check::{validate, ExprContext, Field, SpecError};
pub use expr::{BinOp, Expr, ExprKind, Func, Span, Ty, UnOp, Var};
pub use spec::{
    Align, AuxDecl, AuxDim, DType, KvLayout, Mask, ParamDecl, Scale, SoftmaxOptions, Spec, SplitKv,
    Window,
};
