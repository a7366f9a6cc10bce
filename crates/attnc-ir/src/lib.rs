//! attnc-ir: what an attention variant *is*, independent of any GPU.
//!
//! - [`spec`]: the variant description (head dims, heads, mask, score modification, KV
//!   layout, split-KV, outputs);
//! - [`expr`]: the typed expression language of masks and score modifications;
//! - [`check`]: the type checker and the validity rules of a spec;
//! - [`eval`]: concrete evaluation, the definition of an expression's meaning;
//! - [`flex`]: the spec as PyTorch FlexAttention `mask_mod` / `score_mod` source;
//! - [`deriv`]: symbolic derivatives of score modifications (for the backward pass);
//! - [`analysis`]: tile mask analysis (Full / Partial / Empty) by interval arithmetic;
//! - [`reference`](mod@reference): the f64 CPU reference executor, the definition of a variant's output,
//!   and its backward (gradients of Q, K, V, sinks and learnable aux tensors);
//! - [`gradcheck`]: finite-difference checks of the reference backward;
//! - [`generate`]: random valid specs, for properties every spec must have.

pub mod analysis;
pub mod block_mask;
pub mod check;
pub mod deriv;
pub mod eval;
pub mod expr;
pub mod flex;
pub mod generate;
pub mod gradcheck;
pub mod reference;
pub mod spec;

pub use analysis::{classify, int_range, mask_facts, truth, IntRange, MaskFacts, TileClass, TileQuery, Tri};
pub use check::{validate, ExprContext, Field, SpecError, MAX_SEQLEN, MAX_WINDOW};
pub use deriv::{score_mod_grad, simplify, AuxGradTerm, ScoreModGrad};
pub use eval::{AuxData, AuxTensor};
pub use expr::{BinOp, Expr, ExprKind, Func, Span, Ty, UnOp, Var};
pub use flex::{flex_source, FlexSource};
pub use reference::{
    merge_partials, random_inputs, reference_backward, reference_backward_with_output, reference_forward, rel_l2,
    Grads, Inputs, ReferenceError, SeqGrads, SeqOutput, Sequence, ShardPositions,
};
pub use spec::{
    Align, AuxDecl, AuxDim, AuxElem, DType, KvLayout, Mask, ParamDecl, QueryRows, Scale, SoftmaxOptions, Spec, SplitKv,
    Window, ONE_TILE_ROWS, SUPPORTED_HEAD_DIMS,
};
