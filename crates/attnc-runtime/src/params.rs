//! Launch-time inputs beside Q, K, V and O: params, varlen and paged metadata, aux
//! tensors, sinks, the backward's optional outputs, a block mask, the caller's stream
//! and workspace. One builder shared by the forward, the backward and the launch memo.

use crate::block_mask::BlockMask;
use crate::cuda::Stream;
use crate::tensor::{IndexTensor, Tensor};
use crate::validate::ParamValue;
use attnc_ir::ShardPositions;

/// Launch-time inputs beside Q, K, V and O.
#[derive(Clone, Debug, Default)]
pub struct Params<'a> {
    /// Scalar params by name (every param the spec declares).
    pub values: Vec<(String, ParamValue)>,
    /// Varlen: `[batch + 1]` each.
    pub cu_seqlens_q: Option<&'a IndexTensor>,
    pub cu_seqlens_k: Option<&'a IndexTensor>,
    /// Paged: `[batch, max_pages]` and `[batch]`.
    pub block_table: Option<&'a IndexTensor>,
    pub seqused_k: Option<&'a IndexTensor>,
    /// f32 `[q_heads]` (specs with sinks).
    pub sinks: Option<&'a Tensor>,
    /// i32 aux tensors by name.
    pub aux: Vec<(String, &'a Tensor)>,
    /// Override the spec's split count (split specs only).
    pub num_splits: Option<u32>,
    /// Time the launch with CUDA events (waits for it); the receipt carries the times.
    pub timing: bool,
    /// Backward, specs with sinks: f32 `[q_heads]`, the sinks' gradient (written).
    pub dsinks: Option<&'a Tensor>,
    /// Backward: f32 gradient tensors of the learnable aux tensors, by name, each of its
    /// aux tensor's shape (written).
    pub aux_grads: Vec<(String, &'a Tensor)>,
    /// Backward: bitwise-identical dQ and aux gradients on every run (fixed accumulation
    /// order; docs/backward.md gives the cost).
    pub deterministic: bool,
    /// Forward of a spec whose mask reads aux tensors: the block mask built once with
    /// [`crate::Kernel::block_mask`] for these shapes, params and aux tensors (checked). Without
    /// it the forward classifies per call.
    pub block_mask: Option<&'a BlockMask>,
    /// A shard of a longer sequence (context parallelism): masks and score mods see
    /// global positions and lengths, aux tensors are the global ones, and with
    /// `sinks: false` a spec's sink logit is left to another key shard. Contiguous
    /// layouts; docs/context-parallel.md.
    pub positions: Option<ShardPositions>,
    /// A varlen batch of shards: one frame per sequence, i32 `[batch, 4]` (`q_offset`,
    /// `k_offset`, global `seqlen_q`, global `seqlen_k`), and whether these key shards take
    /// the spec's sink.
    pub sequence_positions: Option<(&'a IndexTensor, bool)>,
    /// Queue the call's work on the caller's stream instead of the runtime's.
    pub stream: Option<Stream>,
    /// The caller's workspace buffer (256-byte aligned, at least
    /// [`crate::Kernel::forward_workspace_bytes`] / [`crate::Kernel::backward_workspace_bytes`]); without
    /// it the call takes the stream's pooled workspace.
    pub workspace: Option<&'a Tensor>,
}

impl<'a> Params<'a> {
    pub fn int(mut self, name: &str, v: i32) -> Self {
        self.values.push((name.into(), ParamValue::Int(v)));
        self
    }
    pub fn float(mut self, name: &str, v: f32) -> Self {
        self.values.push((name.into(), ParamValue::Float(v)));
        self
    }
    pub fn varlen(mut self, cu_seqlens_q: &'a IndexTensor, cu_seqlens_k: &'a IndexTensor) -> Self {
        self.cu_seqlens_q = Some(cu_seqlens_q);
        self.cu_seqlens_k = Some(cu_seqlens_k);
        self
    }
    pub fn paged(mut self, block_table: &'a IndexTensor, seqused_k: &'a IndexTensor) -> Self {
        self.block_table = Some(block_table);
        self.seqused_k = Some(seqused_k);
        self
    }
    pub fn sinks(mut self, sinks: &'a Tensor) -> Self {
        self.sinks = Some(sinks);
        self
    }
    pub fn aux(mut self, name: &str, t: &'a Tensor) -> Self {
        self.aux.push((name.into(), t));
        self
    }
    pub fn splits(mut self, n: u32) -> Self {
        self.num_splits = Some(n);
        self
    }
    pub fn timed(mut self) -> Self {
        self.timing = true;
        self
    }
    pub fn dsinks(mut self, t: &'a Tensor) -> Self {
        self.dsinks = Some(t);
        self
    }
    pub fn aux_grad(mut self, name: &str, t: &'a Tensor) -> Self {
        self.aux_grads.push((name.into(), t));
        self
    }
    pub fn deterministic(mut self, on: bool) -> Self {
        self.deterministic = on;
        self
    }
    pub fn block_mask(mut self, m: &'a BlockMask) -> Self {
        self.block_mask = Some(m);
        self
    }
    pub fn positions(mut self, p: ShardPositions) -> Self {
        self.positions = Some(p);
        self
    }
    pub fn sequence_positions(mut self, table: &'a IndexTensor, takes_sink: bool) -> Self {
        self.sequence_positions = Some((table, takes_sink));
        self
    }
    /// Whether this launch is a shard of longer sequences.
    pub fn is_shard(&self) -> bool {
        self.positions.is_some() || self.sequence_positions.is_some()
    }
    /// Whether this launch's key shard takes the spec's sink (true when not a shard).
    pub fn takes_sink(&self) -> bool {
        self.positions.is_none_or(|p| p.sinks) && self.sequence_positions.is_none_or(|s| s.1)
    }
    pub fn on_stream(mut self, s: Stream) -> Self {
        self.stream = Some(s);
        self
    }
    pub fn workspace(mut self, t: &'a Tensor) -> Self {
        self.workspace = Some(t);
        self
    }
}
