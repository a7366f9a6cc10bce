//! The variant description: everything that distinguishes one attention kernel from
//! another. A `Spec` is what the DSL parses into, what the pretty printer prints, what
//! the lowering compiles and what the runtime caches by (after normalization).
//!
//! Runtime quantities (batch, sequence lengths, param values, tensors) are *not* part of
//! a spec: one compiled kernel serves all of them.

use crate::expr::{BinOp, Expr, ExprKind, Ty, Var};
use serde::{Deserialize, Serialize};
use std::fmt;

/// Element type of Q, K, V and O. Accumulation is always f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DType {
    Bf16,
    Fp16,
}

impl DType {
    pub fn name(self) -> &'static str {
        match self {
            DType::Bf16 => "bf16",
            DType::Fp16 => "fp16",
        }
    }
    pub fn bytes(self) -> usize {
        2
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which diagonal a causal or window mask is aligned to when seqlen_q ≠ seqlen_k.
/// Top-left: query i sees keys ≤ i. Bottom-right: the last query sees the last key
/// (query i sees keys ≤ i + seqlen_k − seqlen_q), the convention of KV-cache decoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum Align {
    #[default]
    TopLeft,
    BottomRight,
}

impl Align {
    pub fn name(self) -> &'static str {
        match self {
            Align::TopLeft => "top_left",
            Align::BottomRight => "bottom_right",
        }
    }
}

/// A sliding window around the aligned diagonal: key k is visible from query q when
/// `diag − left ≤ k ≤ diag + right`, where `diag` is q (top-left) or
/// q + seqlen_k − seqlen_q (bottom-right). `None` leaves that side unbounded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Window {
    pub left: Option<u64>,
    pub right: Option<u64>,
    pub align: Align,
}

/// The mask is the conjunction of its parts; an absent part allows everything.
#[derive(Clone, Debug, PartialEq, Default, Serialize, Deserialize)]
pub struct Mask {
    pub causal: Option<Align>,
    pub window: Option<Window>,
    /// An arbitrary boolean expression over b, h, hkv, q, k, seqlens, params and aux.
    pub predicate: Option<Expr>,
}

impl Mask {
    pub fn is_none(&self) -> bool {
        self.causal.is_none() && self.window.is_none() && self.predicate.is_none()
    }

    /// The whole mask as one boolean expression (the definition of its meaning), or
    /// `None` when it allows everything.
    pub fn to_predicate(&self) -> Option<Expr> {
        let diag = |align: Align| -> Expr {
            let q = Expr::var(Var::Q);
            match align {
                Align::TopLeft => q,
                Align::BottomRight => Expr::binary(
                    BinOp::Add,
                    q,
                    Expr::binary(BinOp::Sub, Expr::var(Var::SeqlenK), Expr::var(Var::SeqlenQ)),
                ),
            }
        };
        let k = || Expr::var(Var::K);
        let mut parts: Vec<Expr> = Vec::new();
        if let Some(align) = self.causal {
            parts.push(Expr::binary(BinOp::Le, k(), diag(align)));
        }
        if let Some(w) = self.window {
            if let Some(left) = w.left {
                let lo = Expr::binary(BinOp::Sub, diag(w.align), Expr::int(left as i64));
                parts.push(Expr::binary(BinOp::Ge, k(), lo));
            }
            if let Some(right) = w.right {
                let hi = Expr::binary(BinOp::Add, diag(w.align), Expr::int(right as i64));
                parts.push(Expr::binary(BinOp::Le, k(), hi));
            }
        }
        if let Some(p) = &self.predicate {
            parts.push(p.clone());
        }
        parts.into_iter().reduce(Expr::and)
    }
}

/// How K and V are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum KvLayout {
    /// `[batch, seqlen_k, kv_heads, d]`, every batch entry the same length.
    #[default]
    Contiguous,
    /// Packed `[total_k, kv_heads, d]` with `cu_seqlens_k` (and Q with `cu_seqlens_q`).
    Varlen,
    /// `[num_pages, page_size, kv_heads, d]` with a block table `[batch, max_pages]` and
    /// `seqused_k [batch]`.
    Paged { page_size: u32 },
}

/// Split the KV sequence over several CTAs and combine their partial results.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum SplitKv {
    #[default]
    None,
    Fixed(u32),
    /// Chosen at launch from SM count, batch × heads and KV length.
    Auto,
}

/// Softmax scale applied to q·k before the score modification.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize, Default)]
pub enum Scale {
    /// 1 / sqrt(d_qk).
    #[default]
    Default,
    Value(f64),
}

/// A scalar parameter, bound at launch.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ParamDecl {
    pub name: String,
    pub ty: Ty,
}

/// A dimension of an aux tensor, resolved at launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AuxDim {
    Batch,
    /// The longest query sequence of the launch (seqlen_q for padded layouts).
    MaxSeqlenQ,
    /// The longest key sequence of the launch.
    MaxSeqlenK,
    QHeads,
    KvHeads,
    Fixed(u64),
}

impl AuxDim {
    pub fn name(self) -> String {
        match self {
            AuxDim::Batch => "batch".into(),
            AuxDim::MaxSeqlenQ => "seqlen_q".into(),
            AuxDim::MaxSeqlenK => "seqlen_k".into(),
            AuxDim::QHeads => "q_heads".into(),
            AuxDim::KvHeads => "kv_heads".into(),
            AuxDim::Fixed(n) => n.to_string(),
        }
    }
}

/// The element type of an aux tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum AuxElem {
    /// i32 at launch (document ids, buckets, ...); reads are `int` expressions.
    #[default]
    Int,
    /// f32 at launch (bias tables, slopes, ...); reads are `float` expressions. In a mask
    /// a float aux value may only be compared (see [`crate::check`]).
    Float,
}

impl AuxElem {
    /// The DSL spelling (`int` / `float`).
    pub fn name(self) -> &'static str {
        match self {
            AuxElem::Int => "int",
            AuxElem::Float => "float",
        }
    }
    /// The expression type a read of such a tensor has.
    pub fn ty(self) -> Ty {
        match self {
            AuxElem::Int => Ty::Int,
            AuxElem::Float => Ty::Float,
        }
    }
}

/// A tensor read by masks or score modifications: i32 (document ids) or f32 (a bias
/// table). A `learnable` tensor (float only) gets a gradient from the backward pass: the
/// derivative of the loss with respect to each of its elements, through the score
/// modification (masks only compare values, so they contribute no gradient).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AuxDecl {
    pub name: String,
    pub dims: Vec<AuxDim>,
    /// Absent in specs serialized before float aux tensors existed: `Int`.
    #[serde(default)]
    pub elem: AuxElem,
    #[serde(default)]
    pub learnable: bool,
}

impl AuxDecl {
    /// An i32 tensor (not learnable).
    pub fn int(name: &str, dims: Vec<AuxDim>) -> AuxDecl {
        AuxDecl { name: name.to_string(), dims, elem: AuxElem::Int, learnable: false }
    }
    /// An f32 tensor, learnable or not.
    pub fn float(name: &str, dims: Vec<AuxDim>, learnable: bool) -> AuxDecl {
        AuxDecl { name: name.to_string(), dims, elem: AuxElem::Float, learnable }
    }
}

/// Numerical options of the softmax (FA4's ideas); defaults are exact.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SoftmaxOptions {
    /// Fraction of each row's exponentials computed by the polynomial exp2 emulation on
    /// the FMA pipe instead of MUFU.EX2 (0 = none).
    pub exp2_emulation: f64,
    /// Rescale O only when the running max (log2 units) grows by more than this
    /// (0 = rescale whenever it grows).
    pub rescale_threshold: f64,
}

impl Default for SoftmaxOptions {
    fn default() -> Self {
        SoftmaxOptions { exp2_emulation: 0.0, rescale_threshold: 0.0 }
    }
}

/// How many query rows the launches of a module have, as far as its kernels may rely on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum QueryRows {
    /// Any number.
    #[default]
    Any,
    /// At most one 64-row query tile per batch entry and head (packed rows under
    /// `pack_gqa`): decode. A family may then run one consumer and smaller key tiles.
    /// The runtime compiles this twin of a variant for such launches; `.attn` files do
    /// not write it.
    OneTile,
}

/// Packed query rows per tile that [`QueryRows::OneTile`] promises at most.
pub const ONE_TILE_ROWS: usize = 64;

/// One attention variant.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Spec {
    pub name: String,
    pub dtype: DType,
    pub head_dim_qk: u32,
    pub head_dim_v: u32,
    pub q_heads: u32,
    pub kv_heads: u32,
    /// Put the q heads that share a KV head into one tile, so each KV tile is read once.
    pub pack_gqa: bool,
    pub params: Vec<ParamDecl>,
    pub aux: Vec<AuxDecl>,
    pub mask: Mask,
    /// Applied to the scaled score; an expression over `score` and the mask's variables.
    pub score_mod: Option<Expr>,
    pub scale: Scale,
    /// A per-head logit (f32 tensor `[q_heads]`) that joins the softmax denominator.
    pub sinks: bool,
    pub kv_layout: KvLayout,
    pub split_kv: SplitKv,
    /// Also write the log-sum-exp (natural log) per query row, f32 `[batch, q_heads, seqlen_q]`.
    pub lse: bool,
    /// The kernels run on a shard of longer sequences (context parallelism): they take
    /// the shard's place (`q_offset`, `k_offset` and the global lengths, see
    /// [`crate::ShardPositions`]) as launch values, so positions in masks and score mods
    /// are global. The runtime compiles this twin of a variant for sharded launches; the
    /// variant itself pays nothing for it. Contiguous layout only.
    pub shards: bool,
    /// The launches this module serves (the runtime's decode twin sets `OneTile`).
    #[serde(default)]
    pub query_rows: QueryRows,
    pub softmax: SoftmaxOptions,
}

impl Spec {
    /// A plain MHA spec to build on in code.
    pub fn new(name: &str, head_dim: u32, heads: u32) -> Spec {
        Spec {
            name: name.to_string(),
            dtype: DType::Bf16,
            head_dim_qk: head_dim,
            head_dim_v: head_dim,
            q_heads: heads,
            kv_heads: heads,
            pack_gqa: false,
            params: Vec::new(),
            aux: Vec::new(),
            mask: Mask::default(),
            score_mod: None,
            scale: Scale::Default,
            sinks: false,
            kv_layout: KvLayout::Contiguous,
            split_kv: SplitKv::None,
            lse: false,
            shards: false,
            query_rows: QueryRows::Any,
            softmax: SoftmaxOptions::default(),
        }
    }

    /// Whether the mask or the score modification reads a position or a length (`q`, `k`,
    /// `seqlen_q`, `seqlen_k`, causal and window masks included): the variants whose
    /// kernels take a shard's place in its global sequence (`ShardPositions`). For the
    /// others every shard computes the same thing wherever it sits.
    pub fn reads_positions(&self) -> bool {
        // (Whether the kernels take a shard's frame is `shards && reads_positions()`.)
        let reads = |e: &Expr| [Var::Q, Var::K, Var::SeqlenQ, Var::SeqlenK].into_iter().any(|v| e.uses_var(v));
        self.mask.to_predicate().is_some_and(|p| reads(&p)) || self.score_mod.as_ref().is_some_and(reads)
    }

    /// q heads per KV head (at least 1, also for an invalid spec, so it is always a
    /// safe divisor).
    pub fn group_size(&self) -> u32 {
        self.q_heads.checked_div(self.kv_heads).unwrap_or(1).max(1)
    }

    /// The softmax scale as a number.
    pub fn scale_value(&self) -> f64 {
        match self.scale {
            Scale::Default => 1.0 / (self.head_dim_qk as f64).sqrt(),
            Scale::Value(v) => v,
        }
    }

    pub fn param(&self, name: &str) -> Option<&ParamDecl> {
        self.params.iter().find(|p| p.name == name)
    }
    pub fn aux_decl(&self, name: &str) -> Option<&AuxDecl> {
        self.aux.iter().find(|a| a.name == name)
    }
    /// Index of a param in declaration order (its launch-argument slot).
    pub fn param_index(&self, name: &str) -> Option<usize> {
        self.params.iter().position(|p| p.name == name)
    }
    pub fn aux_index(&self, name: &str) -> Option<usize> {
        self.aux.iter().position(|a| a.name == name)
    }
    /// Whether some aux tensor is float.
    pub fn has_float_aux(&self) -> bool {
        self.aux.iter().any(|a| a.elem == AuxElem::Float)
    }
    /// Whether some aux tensor is learnable (the backward has aux gradients to write).
    pub fn has_learnable_aux(&self) -> bool {
        self.aux.iter().any(|a| a.learnable)
    }

    /// A stable text key for caching: the Debug rendering of the spec with its name and
    /// source spans cleared (Debug is deterministic and covers every field).
    pub fn cache_key(&self) -> String {
        let mut s = self.clone();
        s.name.clear();
        clear_spans(&mut s);
        format!("{s:?}")
    }
}

fn clear_spans(s: &mut Spec) {
    fn clear(e: &mut Expr) {
        e.span = Default::default();
        match &mut e.kind {
            ExprKind::Aux { index, .. } => index.iter_mut().for_each(clear),
            ExprKind::Unary(_, a) => clear(a),
            ExprKind::Binary(_, a, b) => {
                clear(a);
                clear(b);
            }
            ExprKind::Call(_, args) => args.iter_mut().for_each(clear),
            _ => {}
        }
    }
    if let Some(p) = &mut s.mask.predicate {
        clear(p);
    }
    if let Some(p) = &mut s.score_mod {
        clear(p);
    }
}

/// Head dimensions (d_qk, d_v) the kernel families support.
pub const SUPPORTED_HEAD_DIMS: &[(u32, u32)] = &[(64, 64), (96, 96), (128, 128), (192, 128), (192, 192), (256, 256)];
