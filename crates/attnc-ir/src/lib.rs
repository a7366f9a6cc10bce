//! attnc-ir: what an attention variant *is*, independent of any GPU.
//!
//! - [`spec`]: the variant description (head dims, heads, mask, score modification, KV
//!   layout, split-KV, outputs);
//! - [`expr`]: the typed expression language of masks and score modifications;
//! - [`check`]: the type checker and the validity rules of a spec;
//! - [`eval`]: concrete evaluation, the definition of an expression's meaning;
//! - [`deriv`]: symbolic derivatives of score modifications (for the backward pass);
//! - [`analysis`]: tile mask analysis (Full / Partial / Empty) by interval arithmetic;
//! - [`reference`](mod@reference): the f64 CPU reference executor, the definition of a variant's output.

pub mod analysis;
pub mod check;
pub mod deriv;
pub mod eval;
pub mod expr;
pub mod reference;
pub mod spec;

pub use analysis::{classify, int_range, mask_facts, truth, IntRange, MaskFacts, TileClass, TileQuery, Tri};
pub use deriv::{score_mod_grad, simplify, AuxGradTerm, ScoreModGrad};
pub use check::{validate, ExprContext, Field, SpecError, MAX_SEQLEN, MAX_WINDOW};
pub use expr::{BinOp, Expr, ExprKind, Func, Span, Ty, UnOp, Var};
pub use eval::{AuxData, AuxTensor};
pub use reference::{random_inputs, reference_forward, rel_l2, Inputs, ReferenceError, SeqOutput, Sequence};
pub use spec::{
    Align, AuxDecl, AuxDim, AuxElem, DType, KvLayout, Mask, ParamDecl, Scale, SoftmaxOptions, Spec, SplitKv, Window,
    SUPPORTED_HEAD_DIMS,
};
