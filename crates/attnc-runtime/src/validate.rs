//! Launch validation: from tensor descriptors and host metadata to a [`LaunchPlan`]
//! (grids, split count, workspace sizes, every kernel argument by name), or a
//! [`ValidationError`] naming the argument at fault.
//!
//! Works on [`TensorDesc`]s and host slices only — no device — so every rule is tested
//! on the CPU. What is checked, and why it rules out out-of-bounds accesses:
//! - dtypes: Q, K, V, O of the spec's dtype; LSE, sinks f32; int aux and index tensors
//!   i32, float aux tensors f32;
//! - shapes per layout (below), the spec's head dims and heads (GQA ratio);
//! - views: unit stride in the last dim; the farthest element a view can reach lies
//!   inside its allocation (`span ≤ capacity`), so every in-range index is in bounds;
//! - alignment: Q/K/V/O base addresses and the strides of every dimension of size > 1 are
//!   multiples of 16 bytes (the kernels move 16-byte chunks with cp.async); f32/i32
//!   tensors 4-byte aligned;
//! - varlen: `cu_seqlens_q/k` have `batch + 1` entries, start ≥ 0, never decrease, and end
//!   within the packed tensors' rows, so every sequence's rows exist;
//! - paged: `seqused_k[b]` in `0..=max_pages·page_size` and every block-table entry a
//!   sequence uses (`p < ceil(seqused_k[b] / page_size)`) in `0..num_pages` (entries past
//!   a sequence's length are never read, so padding there may hold anything, e.g. −1);
//! - aux tensors: exactly the declared dims (resolved for this launch: batch, max seqlens,
//!   heads), row-major contiguous, no dim 0 (the kernel clamps indices into each dim);
//! - params: each declared param exactly once, of its type, no unknown names;
//! - every integer the kernels take as i32 (lengths, rows · group, aux dims) < 2^31, and
//!   the grid within CUDA's limits (y, z ≤ 65535);
//! - outputs (O, LSE) overlap no other argument.
//!
//! Layouts (`G` = q_heads / kv_heads):
//! - contiguous: Q `[B, Sq, Hq, Dqk]`, K `[B, Sk, Hkv, Dqk]`, V `[B, Sk, Hkv, Dv]`,
//!   O `[B, Sq, Hq, Dv]`, LSE `[B, Hq, Sq]`;
//! - varlen: Q `[total_q, Hq, Dqk]`, K/V `[total_k, Hkv, D]`, O `[total_q, Hq, Dv]`,
//!   LSE `[Hq, total_q]`, `cu_seqlens_q/k [B + 1]`; seqlens passed to the kernel are the
//!   longest sequences;
//! - paged: Q/O/LSE as contiguous; K/V `[num_pages, page_size, Hkv, D]`,
//!   `block_table [B, max_pages]`, `seqused_k [B]`.

use crate::cuda::ArgValue;
use crate::error::ValidationError;
use crate::split::{auto_num_splits, SplitChoice, MAX_SPLITS};
use crate::tensor::{ElemType, HostIndex, TensorDesc};
use crate::tensor_map::TmaEncode;
use attnc_ir::{AuxDim, KvLayout, ShardPositions, Spec, SplitKv, Ty};
use serde::Serialize;

/// A scalar param value.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub enum ParamValue {
    Int(i32),
    Float(f32),
}

/// What the launch needs to know about the compiled forward kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelShape {
    pub block_m: u32,
    pub block_n: u32,
    /// How the module merges split-KV partials.
    pub combine: CombineKind,
    /// Forward CTAs resident per SM (occupancy; 1 when unknown). The split heuristic fills
    /// `SMs x ctas_per_sm` slots: decode is memory-bound and gains from every resident CTA.
    pub ctas_per_sm: u32,
    /// A persistent forward: grid `[min(work tiles, SMs x ctas_per_sm), 1, 1]`.
    pub persistent: bool,
}

/// How a module merges split-KV partials.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CombineKind {
    /// It cannot: launches run one split.
    None,
    /// A combine kernel after the forward, `block_m` rows per CTA.
    Kernel { block_m: u32 },
    /// The forward's last split CTA of each row block merges it; the forward takes one
    /// zeroed u32 counter per row block (`LaunchPlan::counters`).
    Fused,
}

/// Every argument of one launch, as descriptors.
#[derive(Clone, Debug)]
pub struct LaunchDescs<'a> {
    pub q: TensorDesc,
    pub k: TensorDesc,
    pub v: TensorDesc,
    pub o: TensorDesc,
    pub lse: Option<TensorDesc>,
    pub cu_seqlens_q: Option<HostIndex<'a>>,
    pub cu_seqlens_k: Option<HostIndex<'a>>,
    pub block_table: Option<HostIndex<'a>>,
    pub seqused_k: Option<HostIndex<'a>>,
    pub sinks: Option<TensorDesc>,
    pub aux: Vec<(String, TensorDesc)>,
    pub params: Vec<(String, ParamValue)>,
    /// Overrides the spec's split count (split specs only).
    pub num_splits: Option<u32>,
    /// A shard of a longer sequence (context parallelism): where its rows and keys sit,
    /// and the global lengths. Contiguous layouts only.
    pub positions: Option<ShardPositions>,
    /// Varlen shards: one frame per sequence, i32 `[batch, 4]` (`q_offset`, `k_offset`,
    /// global `seqlen_q`, global `seqlen_k`).
    pub sequence_positions: Option<HostIndex<'a>>,
}

/// A validated launch.
#[derive(Clone, Debug, PartialEq)]
pub struct LaunchPlan {
    pub batch: usize,
    pub max_seqlen_q: usize,
    pub max_seqlen_k: usize,
    /// Rows of Q (B·Sq padded, total_q varlen).
    pub total_q: usize,
    pub num_splits: u32,
    pub split_reason: String,
    pub fwd_grid: [u32; 3],
    /// Only when `num_splits > 1`.
    pub combine_grid: Option<[u32; 3]>,
    /// Zeroed u32 counters the launch needs from the runtime's pool: the fused combine's
    /// (one per row block), a persistent forward's two tile counters, or 0.
    pub counters: usize,
    /// f32 elements of the split workspace (0 without splits).
    pub o_partial_elems: usize,
    pub lse_partial_elems: usize,
    /// Kernel arguments by ABI name (the workspace pointers are filled in at launch).
    pub args: Vec<(String, ArgValue)>,
    /// The checked `cuTensorMapEncodeTiled` arguments of the forward kernel's tensor maps
    /// (filled by `Kernel::plan` from the module's boxes, see [`crate::tma`]; encoded by
    /// the driver at launch). Empty for kernels without TMA and for empty launches.
    pub tensor_maps: Vec<TmaEncode>,
    /// Nothing to compute (no batch entry or no query row): no launch.
    pub empty: bool,
}

impl LaunchPlan {
    pub fn arg(&self, name: &str) -> Option<ArgValue> {
        self.args.iter().find(|a| a.0 == name).map(|a| a.1)
    }
}

const I32_LIMIT: u64 = i32::MAX as u64;
const GRID_YZ_LIMIT: u64 = 65535;

type V<T> = Result<T, ValidationError>;

fn too_large(what: &str, value: u64, limit: u64) -> V<()> {
    if value > limit {
        return Err(ValidationError::TooLarge { what: what.into(), value, limit });
    }
    Ok(())
}

pub(crate) fn check_dtype(arg: &str, d: &TensorDesc, expected: ElemType) -> V<()> {
    if d.dtype != expected {
        return Err(ValidationError::DType { arg: arg.into(), expected, found: d.dtype });
    }
    Ok(())
}

/// Rank, view consistency, unit inner stride, bounds, device.
pub(crate) fn check_view(arg: &str, d: &TensorDesc, rank: usize, layout: &str, device: usize) -> V<()> {
    if d.shape.len() != d.strides.len() {
        return Err(ValidationError::BadView { arg: arg.into(), shape: d.shape.clone(), strides: d.strides.clone() });
    }
    if d.shape.len() != rank {
        return Err(ValidationError::Rank {
            arg: arg.into(),
            expected: rank,
            found: d.shape.len(),
            layout: layout.into(),
        });
    }
    if d.device != device {
        return Err(ValidationError::WrongDevice { arg: arg.into(), expected: device, found: d.device });
    }
    if let (Some(&s), Some(&n)) = (d.strides.last(), d.shape.last()) {
        if s != 1 && n > 1 {
            return Err(ValidationError::InnerStride { arg: arg.into(), stride: s });
        }
    }
    let span = d.span();
    if span > u128::from(d.capacity) {
        return Err(ValidationError::OutOfBounds { arg: arg.into(), needed: span, capacity: d.capacity });
    }
    Ok(())
}

pub(crate) fn check_dims(arg: &str, d: &TensorDesc, expected: &[(usize, &str)]) -> V<()> {
    for (i, (&found, &(want, name))) in d.shape.iter().zip(expected).enumerate() {
        if found != want {
            return Err(ValidationError::Dim { arg: arg.into(), dim: i, dim_name: name.into(), expected: want, found });
        }
    }
    Ok(())
}

/// Checks the last `expected.len()` dims.
fn check_tail(arg: &str, d: &TensorDesc, expected: &[(usize, &str)]) -> V<()> {
    let first = d.shape.len().saturating_sub(expected.len());
    for (j, &(want, name)) in expected.iter().enumerate() {
        let i = first + j;
        let found = d.shape.get(i).copied().unwrap_or(0);
        if found != want {
            return Err(ValidationError::Dim { arg: arg.into(), dim: i, dim_name: name.into(), expected: want, found });
        }
    }
    Ok(())
}

pub(crate) fn check_align(arg: &str, d: &TensorDesc, align: u64) -> V<()> {
    if d.span() == 0 {
        return Ok(());
    }
    if d.addr % align != 0 {
        return Err(ValidationError::Alignment {
            arg: arg.into(),
            what: "the base address".into(),
            value: d.addr,
            align,
        });
    }
    let eb = d.dtype.bytes() as u64;
    for (i, (&n, &s)) in d.shape.iter().zip(&d.strides).enumerate().take(d.shape.len().saturating_sub(1)) {
        let bytes = s as u64 * eb;
        if n > 1 && bytes % align != 0 {
            return Err(ValidationError::Alignment {
                arg: arg.into(),
                what: format!("the stride of dim {i} in bytes"),
                value: bytes,
                align,
            });
        }
    }
    Ok(())
}

/// A 16-byte-moved tensor (Q, K, V, O).
pub(crate) fn check_qkvo(
    arg: &str,
    d: &TensorDesc,
    dtype: ElemType,
    rank: usize,
    layout: &str,
    device: usize,
) -> V<()> {
    check_dtype(arg, d, dtype)?;
    check_view(arg, d, rank, layout, device)?;
    check_align(arg, d, 16)
}

fn check_index(arg: &str, h: &HostIndex, rank: usize, layout: &str, device: usize) -> V<()> {
    check_dtype(arg, &h.desc, ElemType::I32)?;
    check_view(arg, &h.desc, rank, layout, device)?;
    check_align(arg, &h.desc, 4)?;
    if !h.desc.is_contiguous() || h.desc.numel() != h.values.len() as u128 {
        return Err(ValidationError::CuSeqlens {
            arg: arg.into(),
            detail: format!(
                "host copy has {} values for shape {:?} (index tensors are contiguous)",
                h.values.len(),
                h.desc.shape
            ),
        });
    }
    Ok(())
}

fn absent<T>(arg: &str, x: &Option<T>, why: &str) -> V<()> {
    if x.is_some() {
        return Err(ValidationError::Unexpected { arg: arg.into(), why: why.into() });
    }
    Ok(())
}

fn present<'x, T>(arg: &str, x: &'x Option<T>, why: &str) -> V<&'x T> {
    x.as_ref().ok_or_else(|| ValidationError::Missing { arg: arg.into(), why: why.into() })
}

/// Checks `cu` (batch + 1 entries) against `rows`; returns the longest sequence.
fn check_cu(arg: &str, cu: &HostIndex, batch: usize, rows: usize) -> V<usize> {
    let v = cu.values;
    if v.len() != batch + 1 {
        return Err(ValidationError::CuSeqlens {
            arg: arg.into(),
            detail: format!("has {} entries, expected batch + 1 = {}", v.len(), batch + 1),
        });
    }
    if v[0] < 0 {
        return Err(ValidationError::CuSeqlens { arg: arg.into(), detail: format!("starts at {}", v[0]) });
    }
    let mut longest = 0usize;
    for i in 0..batch {
        if v[i + 1] < v[i] {
            return Err(ValidationError::CuSeqlens {
                arg: arg.into(),
                detail: format!("decreases at {}: {} then {}", i + 1, v[i], v[i + 1]),
            });
        }
        longest = longest.max((v[i + 1] - v[i]) as usize);
    }
    if v[batch] as usize > rows {
        return Err(ValidationError::CuSeqlens {
            arg: arg.into(),
            detail: format!("ends at {}, but the packed tensor has {rows} rows", v[batch]),
        });
    }
    Ok(longest)
}

pub(crate) fn overlaps(a: &TensorDesc, b: &TensorDesc) -> bool {
    let (a0, a1) = a.byte_range();
    let (b0, b1) = b.byte_range();
    a0 < a1 && b0 < b1 && a0 < b1 && b0 < a1
}

/// Validates a launch of `spec`'s kernels on a device with `sm_count` SMs and ordinal
/// `device`.
pub fn plan(spec: &Spec, ks: &KernelShape, sm_count: u32, device: usize, d: &LaunchDescs) -> V<LaunchPlan> {
    let dt = ElemType::of(spec.dtype);
    let (dqk, dv) = (spec.head_dim_qk as usize, spec.head_dim_v as usize);
    let (qh, kvh) = (spec.q_heads as usize, spec.kv_heads as usize);
    let group = spec.group_size() as usize;

    // ---- Q/K/V/O by layout: batch, lengths, per-layout metadata
    let (rank_q, rank_kv, lname) = match spec.kv_layout {
        KvLayout::Contiguous => (4, 4, "contiguous: [batch, seqlen, heads, head_dim]"),
        KvLayout::Varlen => (3, 3, "varlen: [total_tokens, heads, head_dim]"),
        KvLayout::Paged { .. } => {
            (4, 4, "paged: q/o [batch, seqlen_q, heads, head_dim], k/v [num_pages, page_size, kv_heads, head_dim]")
        }
    };
    check_qkvo("q", &d.q, dt, rank_q, lname, device)?;
    check_qkvo("k", &d.k, dt, rank_kv, lname, device)?;
    check_qkvo("v", &d.v, dt, rank_kv, lname, device)?;
    check_qkvo("o", &d.o, dt, rank_q, lname, device)?;
    let hq_found = d.q.shape[rank_q - 2];
    let hk_found = d.k.shape[rank_kv - 2];
    if hq_found != qh || hk_found != kvh {
        return Err(ValidationError::GqaRatio {
            q_heads: hq_found,
            kv_heads: hk_found,
            spec_q: spec.q_heads,
            spec_kv: spec.kv_heads,
            group: group as u32,
        });
    }
    check_tail("q", &d.q, &[(qh, "q_heads"), (dqk, "head_dim_qk")])?;
    check_tail("k", &d.k, &[(kvh, "kv_heads"), (dqk, "head_dim_qk")])?;

    let (batch, max_sq, max_sk, total_q, rows_q);
    match spec.kv_layout {
        KvLayout::Contiguous => {
            for a in ["cu_seqlens_q", "cu_seqlens_k"] {
                absent(
                    a,
                    if a.ends_with('q') { &d.cu_seqlens_q } else { &d.cu_seqlens_k },
                    "the spec's KV layout is contiguous",
                )?;
            }
            absent("block_table", &d.block_table, "the spec's KV layout is contiguous")?;
            absent("seqused_k", &d.seqused_k, "the spec's KV layout is contiguous")?;
            let (b, sq, sk) = (d.q.shape[0], d.q.shape[1], d.k.shape[1]);
            check_dims("k", &d.k, &[(b, "batch")])?;
            check_dims("v", &d.v, &[(b, "batch"), (sk, "seqlen_k"), (kvh, "kv_heads"), (dv, "head_dim_v")])?;
            check_dims("o", &d.o, &[(b, "batch"), (sq, "seqlen_q"), (qh, "q_heads"), (dv, "head_dim_v")])?;
            (batch, max_sq, max_sk, total_q, rows_q) = (b, sq, sk, b.saturating_mul(sq), sq);
            too_large("seqlen_k", sk as u64, I32_LIMIT)?;
        }
        KvLayout::Varlen => {
            absent("block_table", &d.block_table, "the spec's KV layout is varlen")?;
            absent("seqused_k", &d.seqused_k, "the spec's KV layout is varlen")?;
            let cq = present("cu_seqlens_q", &d.cu_seqlens_q, "varlen needs cu_seqlens_q [batch + 1]")?;
            let ck = present("cu_seqlens_k", &d.cu_seqlens_k, "varlen needs cu_seqlens_k [batch + 1]")?;
            check_index("cu_seqlens_q", cq, 1, "[batch + 1]", device)?;
            check_index("cu_seqlens_k", ck, 1, "[batch + 1]", device)?;
            let b = cq.values.len().saturating_sub(1);
            if cq.values.is_empty() {
                return Err(ValidationError::CuSeqlens {
                    arg: "cu_seqlens_q".into(),
                    detail: "is empty (needs batch + 1 entries)".into(),
                });
            }
            let (tq, tk) = (d.q.shape[0], d.k.shape[0]);
            too_large("total_q", tq as u64, I32_LIMIT)?;
            too_large("total_k", tk as u64, I32_LIMIT)?;
            check_dims("v", &d.v, &[(tk, "total_k"), (kvh, "kv_heads"), (dv, "head_dim_v")])?;
            check_dims("o", &d.o, &[(tq, "total_q"), (qh, "q_heads"), (dv, "head_dim_v")])?;
            let sq = check_cu("cu_seqlens_q", cq, b, tq)?;
            let sk = check_cu("cu_seqlens_k", ck, b, tk)?;
            (batch, max_sq, max_sk, total_q, rows_q) = (b, sq, sk, tq, sq);
        }
        KvLayout::Paged { page_size } => {
            absent("cu_seqlens_q", &d.cu_seqlens_q, "the spec's KV layout is paged")?;
            absent("cu_seqlens_k", &d.cu_seqlens_k, "the spec's KV layout is paged")?;
            let ps = page_size as usize;
            let (b, sq, num_pages) = (d.q.shape[0], d.q.shape[1], d.k.shape[0]);
            check_dims("k", &d.k, &[(num_pages, "num_pages"), (ps, "page_size (from the spec)")])?;
            check_dims(
                "v",
                &d.v,
                &[(num_pages, "num_pages"), (ps, "page_size (from the spec)"), (kvh, "kv_heads"), (dv, "head_dim_v")],
            )?;
            check_dims("o", &d.o, &[(b, "batch"), (sq, "seqlen_q"), (qh, "q_heads"), (dv, "head_dim_v")])?;
            too_large("num_pages", num_pages as u64, I32_LIMIT)?;
            let bt = present("block_table", &d.block_table, "paged KV needs block_table [batch, max_pages]")?;
            let su = present("seqused_k", &d.seqused_k, "paged KV needs seqused_k [batch]")?;
            check_index("block_table", bt, 2, "[batch, max_pages]", device)?;
            check_index("seqused_k", su, 1, "[batch]", device)?;
            check_dims("block_table", &bt.desc, &[(b, "batch")])?;
            check_dims("seqused_k", &su.desc, &[(b, "batch")])?;
            let max_pages = bt.desc.shape[1];
            let limit = (max_pages as u64).saturating_mul(ps as u64).min(I32_LIMIT);
            let mut sk_max = 0usize;
            for (bi, &s) in su.values.iter().enumerate() {
                if s < 0 || s as u64 > limit {
                    return Err(ValidationError::SequsedK {
                        batch: bi,
                        value: s,
                        detail: format!("must be in 0..={limit} (max_pages {max_pages} x page_size {ps})"),
                    });
                }
                let used = (s as usize).div_ceil(ps);
                for p in 0..used {
                    let e = bt.values[bi * max_pages + p];
                    if e < 0 || e as usize >= num_pages {
                        return Err(ValidationError::PageIndex { batch: bi, page: p, entry: e, num_pages });
                    }
                }
                sk_max = sk_max.max(s as usize);
            }
            (batch, max_sq, max_sk, total_q, rows_q) = (b, sq, sk_max, b.saturating_mul(sq), sq);
        }
    }
    too_large("batch", batch as u64, I32_LIMIT)?;
    // Positions and `diag ± window` must stay inside i32 (attnc_ir::MAX_SEQLEN).
    too_large("seqlen_q", max_sq as u64, attnc_ir::MAX_SEQLEN - 1)?;
    too_large("seqlen_k", max_sk as u64, attnc_ir::MAX_SEQLEN - 1)?;
    let _ = rows_q;

    // ---- LSE
    let (lse_sb, lse_sh) = if spec.lse {
        let lse = present("lse", &d.lse, "the spec writes the LSE")?;
        check_dtype("lse", lse, ElemType::F32)?;
        match spec.kv_layout {
            KvLayout::Varlen => {
                check_view("lse", lse, 2, "varlen: [q_heads, total_q]", device)?;
                check_dims("lse", lse, &[(qh, "q_heads"), (total_q, "total_q")])?;
                (0i64, lse.strides[0] as i64)
            }
            _ => {
                check_view("lse", lse, 3, "[batch, q_heads, seqlen_q]", device)?;
                check_dims("lse", lse, &[(batch, "batch"), (qh, "q_heads"), (max_sq, "seqlen_q")])?;
                (lse.strides[0] as i64, lse.strides[1] as i64)
            }
        }
    } else {
        absent("lse", &d.lse, "the spec does not write the LSE (add `lse` to it)")?;
        (0, 0)
    };
    if let Some(lse) = &d.lse {
        check_align("lse", lse, 4)?;
    }

    // ---- sinks
    if spec.sinks {
        let s = present("sinks", &d.sinks, "the spec has attention sinks: f32 [q_heads]")?;
        check_dtype("sinks", s, ElemType::F32)
            .map_err(|_| ValidationError::Sinks { detail: format!("dtype is {}, expected f32", s.dtype) })?;
        check_view("sinks", s, 1, "[q_heads]", device)?;
        check_dims("sinks", s, &[(qh, "q_heads")])?;
        check_align("sinks", s, 4)?;
    } else {
        absent("sinks", &d.sinks, "the spec has no sinks")?;
    }

    // ---- shard positions (context parallelism): masks, score mods and aux dims see the
    // global sequence
    let (aux_sq, aux_sk) = match (&d.positions, &d.sequence_positions) {
        (None, None) => (max_sq, max_sk),
        (Some(p), None) => {
            check_positions(spec, p, max_sq, max_sk)?;
            (p.seqlen_q, p.seqlen_k)
        }
        (None, Some(t)) => check_sequence_positions(spec, t, d, batch, device)?,
        (Some(_), Some(_)) => {
            return Err(ValidationError::Positions {
                detail: "one frame for the launch or one per sequence, not both".into(),
            })
        }
    };

    // ---- aux tensors
    for (name, _) in &d.aux {
        if spec.aux_decl(name).is_none() {
            return Err(ValidationError::Aux {
                name: name.clone(),
                detail: "the spec declares no such aux tensor".into(),
            });
        }
        if d.aux.iter().filter(|a| &a.0 == name).count() > 1 {
            return Err(ValidationError::Aux { name: name.clone(), detail: "given more than once".into() });
        }
    }
    let mut aux_args = Vec::new();
    for decl in &spec.aux {
        let Some((_, t)) = d.aux.iter().find(|a| a.0 == decl.name) else {
            return Err(ValidationError::Aux { name: decl.name.clone(), detail: "missing".into() });
        };
        let arg = format!("aux `{}`", decl.name);
        let elem = match decl.elem {
            attnc_ir::AuxElem::Int => ElemType::I32,
            attnc_ir::AuxElem::Float => ElemType::F32,
        };
        check_dtype(&arg, t, elem)?;
        check_view(&arg, t, decl.dims.len(), "the declared dims", device)?;
        check_align(&arg, t, 4)?;
        let mut dims = Vec::new();
        for (j, dim) in decl.dims.iter().enumerate() {
            let (n, dn) = match *dim {
                AuxDim::Batch => (batch as u64, "batch".to_string()),
                AuxDim::MaxSeqlenQ => (aux_sq as u64, "seqlen_q".into()),
                AuxDim::MaxSeqlenK => (aux_sk as u64, "seqlen_k".into()),
                AuxDim::QHeads => (qh as u64, "q_heads".into()),
                AuxDim::KvHeads => (kvh as u64, "kv_heads".into()),
                AuxDim::Fixed(n) => (n, n.to_string()),
            };
            if t.shape[j] as u64 != n {
                return Err(ValidationError::Aux {
                    name: decl.name.clone(),
                    detail: format!("dim {j} ({dn}) is {}, expected {n} (shape {:?})", t.shape[j], t.shape),
                });
            }
            dims.push(n);
        }
        if !t.is_contiguous() {
            return Err(ValidationError::Aux {
                name: decl.name.clone(),
                detail: "must be row-major contiguous".into(),
            });
        }
        let empty_launch = batch == 0 || max_sq == 0;
        if !empty_launch && dims.contains(&0) {
            return Err(ValidationError::Aux {
                name: decl.name.clone(),
                detail: format!("a dim is 0 ({dims:?}): nothing to index"),
            });
        }
        let total = dims.iter().fold(1u64, |a, &n| a.saturating_mul(n));
        if total > I32_LIMIT {
            return Err(ValidationError::Aux {
                name: decl.name.clone(),
                detail: format!("{total} elements, more than 2^31 - 1"),
            });
        }
        aux_args.push((format!("aux_{}", decl.name), ArgValue::Ptr(t.addr)));
        for (j, n) in dims.iter().enumerate() {
            aux_args.push((format!("aux_{}_dim{j}", decl.name), ArgValue::I32(*n as i32)));
        }
    }

    // ---- params
    for (name, _) in &d.params {
        if spec.param(name).is_none() {
            return Err(ValidationError::Param {
                name: name.clone(),
                detail: "the spec declares no such param".into(),
            });
        }
        if d.params.iter().filter(|p| &p.0 == name).count() > 1 {
            return Err(ValidationError::Param { name: name.clone(), detail: "given more than once".into() });
        }
    }
    let mut param_args = Vec::new();
    for p in &spec.params {
        let Some((_, v)) = d.params.iter().find(|x| x.0 == p.name) else {
            return Err(ValidationError::Param { name: p.name.clone(), detail: format!("missing ({} param)", p.ty) });
        };
        let a = match (p.ty, v) {
            (Ty::Float, ParamValue::Float(f)) => ArgValue::F32(*f),
            (Ty::Float, ParamValue::Int(_)) => {
                return Err(ValidationError::Param { name: p.name.clone(), detail: "is float, given an int".into() })
            }
            (_, ParamValue::Int(i)) => ArgValue::I32(*i),
            (_, ParamValue::Float(_)) => {
                return Err(ValidationError::Param {
                    name: p.name.clone(),
                    detail: format!("is {}, given a float", p.ty),
                })
            }
        };
        param_args.push((format!("param_{}", p.name), a));
    }

    // ---- splits
    let pack = spec.pack_gqa;
    let rows = (max_sq as u64).saturating_mul(if pack { group as u64 } else { 1 });
    too_large("seqlen_q x group (packed rows)", rows + u64::from(ks.block_m), I32_LIMIT)?;
    let grid_x = rows.div_ceil(u64::from(ks.block_m.max(1)));
    let grid_y = if pack { kvh } else { qh } as u64;
    too_large("heads (grid y)", grid_y, GRID_YZ_LIMIT)?;
    let kv_tiles = (max_sk as u64).div_ceil(u64::from(ks.block_n.max(1))).min(u64::from(u32::MAX)) as u32;
    let choice = match (spec.split_kv, d.num_splits) {
        (SplitKv::None, None | Some(1)) => {
            SplitChoice { num_splits: 1, reason: "none (the spec does not split KV)".into() }
        }
        (SplitKv::None, Some(n)) => {
            return Err(ValidationError::Splits {
                detail: format!("{n} requested, but the spec has no split-KV (add `split n` or `split auto`)"),
            })
        }
        (_, Some(n)) => SplitChoice { num_splits: n, reason: format!("{n} (requested at launch)") },
        (SplitKv::Fixed(n), None) => SplitChoice { num_splits: n, reason: format!("{n} (fixed by the spec)") },
        (SplitKv::Auto, None) => {
            auto_num_splits(grid_x * grid_y * batch as u64, sm_count.saturating_mul(ks.ctas_per_sm.max(1)), kv_tiles)
        }
    };
    let ns = choice.num_splits;
    if ns == 0 || ns > MAX_SPLITS {
        return Err(ValidationError::Splits { detail: format!("{ns} is outside 1..={MAX_SPLITS}") });
    }
    if ns > 1 && ks.combine == CombineKind::None {
        return Err(ValidationError::Splits { detail: "the module has no combine kernel".into() });
    }
    too_large("batch x num_splits (grid z)", batch as u64 * u64::from(ns), GRID_YZ_LIMIT)?;
    let empty = batch == 0 || max_sq == 0;
    let fwd_grid = if ks.persistent {
        // One CTA per resident slot at most; each walks tiles ctaid.x, +nctaid.x, ...
        let tiles = grid_x * grid_y * batch as u64 * u64::from(ns);
        let slots = u64::from(sm_count.max(1)) * u64::from(ks.ctas_per_sm.max(1));
        [tiles.min(slots).max(1) as u32, 1, 1]
    } else {
        [grid_x as u32, grid_y as u32, (batch as u64 * u64::from(ns)) as u32]
    };
    let combine_grid = match (ns > 1, ks.combine) {
        (true, CombineKind::Kernel { block_m: bm }) => {
            Some([(max_sq as u64).div_ceil(u64::from(bm.max(1))) as u32, qh as u32, batch as u32])
        }
        _ => None,
    };
    let part_rows = if ns > 1 { ns as usize * batch * qh * max_sq } else { 0 };

    // ---- outputs must not alias anything
    let mut inputs: Vec<(&str, &TensorDesc)> = vec![("q", &d.q), ("k", &d.k), ("v", &d.v)];
    if let Some(s) = &d.sinks {
        inputs.push(("sinks", s));
    }
    for (n, h) in [
        ("cu_seqlens_q", &d.cu_seqlens_q),
        ("cu_seqlens_k", &d.cu_seqlens_k),
        ("block_table", &d.block_table),
        ("seqused_k", &d.seqused_k),
    ] {
        if let Some(h) = h {
            inputs.push((n, &h.desc));
        }
    }
    for (n, t) in &d.aux {
        inputs.push((n.as_str(), t));
    }
    for (out_name, out) in [("o", Some(&d.o)), ("lse", d.lse.as_ref())] {
        let Some(out) = out else { continue };
        for (in_name, t) in &inputs {
            if overlaps(out, t) {
                return Err(ValidationError::Overlap { a: out_name.into(), b: (*in_name).into() });
            }
        }
    }
    if let Some(l) = &d.lse {
        if overlaps(&d.o, l) {
            return Err(ValidationError::Overlap { a: "o".into(), b: "lse".into() });
        }
    }

    // ---- the arguments
    let st = |t: &TensorDesc, i: usize| ArgValue::I64(t.strides[i] as i64);
    let mut args: Vec<(String, ArgValue)> = Vec::new();
    let mut put = |n: &str, v: ArgValue| args.push((n.to_string(), v));
    for (n, t) in [("q", &d.q), ("k", &d.k), ("v", &d.v), ("o", &d.o)] {
        put(n, ArgValue::Ptr(t.addr));
    }
    for (n, t, rank) in [("q", &d.q, rank_q), ("k", &d.k, rank_kv), ("v", &d.v, rank_kv), ("o", &d.o, rank_q)] {
        let batch_stride = if rank == 4 { st(t, 0) } else { ArgValue::I64(0) };
        put(&format!("{n}_stride_batch"), batch_stride);
        put(&format!("{n}_stride_row"), st(t, rank - 3));
        put(&format!("{n}_stride_head"), st(t, rank - 2));
    }
    put("batch", ArgValue::I32(batch as i32));
    put("seqlen_q", ArgValue::I32(max_sq as i32));
    put("seqlen_k", ArgValue::I32(max_sk as i32));
    put("num_splits", ArgValue::I32(ns as i32));
    put("lse", ArgValue::Ptr(d.lse.as_ref().map_or(0, |l| l.addr)));
    put("lse_stride_batch", ArgValue::I64(lse_sb));
    put("lse_stride_head", ArgValue::I64(lse_sh));
    if let (Some(cq), Some(ck)) = (&d.cu_seqlens_q, &d.cu_seqlens_k) {
        put("cu_seqlens_q", ArgValue::Ptr(cq.desc.addr));
        put("cu_seqlens_k", ArgValue::Ptr(ck.desc.addr));
    }
    if let (Some(bt), Some(su)) = (&d.block_table, &d.seqused_k) {
        put("block_table", ArgValue::Ptr(bt.desc.addr));
        put("block_table_stride", ArgValue::I64(bt.desc.strides[0] as i64));
        put("seqused_k", ArgValue::Ptr(su.desc.addr));
    }
    if let Some(s) = &d.sinks {
        put("sinks", ArgValue::Ptr(s.addr));
    }
    args.extend(aux_args);
    args.extend(param_args);
    // The kernels of variants that read positions take the shard's frame (zeros: the
    // whole sequence).
    let frame = d
        .positions
        .map_or([0; 4], |p| [p.q_offset, p.k_offset, p.seqlen_q - max_sq, p.seqlen_k - max_sk].map(|x| x as i32));
    for (n, v) in attnc_lower::families::common::abi::POSITION_PARAMS.iter().zip(frame) {
        args.push((n.to_string(), ArgValue::I32(v)));
    }
    args.push((
        attnc_lower::families::common::abi::SEQUENCE_POSITIONS_PARAM.to_string(),
        ArgValue::Ptr(d.sequence_positions.as_ref().map_or(0, |t| t.desc.addr)),
    ));

    Ok(LaunchPlan {
        batch,
        max_seqlen_q: max_sq,
        max_seqlen_k: max_sk,
        total_q,
        num_splits: ns,
        split_reason: choice.reason,
        fwd_grid,
        combine_grid,
        counters: if ns > 1 && ks.combine == CombineKind::Fused {
            (grid_x * grid_y * batch as u64) as usize
        } else if ks.persistent {
            // A persistent forward's tile counters (`TILE_COUNTERS_PARAM`).
            2
        } else {
            0
        },
        o_partial_elems: part_rows * dv,
        lse_partial_elems: part_rows,
        args,
        tensor_maps: Vec::new(),
        empty,
    })
}

/// A shard's positions: contiguous layout, inside the global lengths, every global
/// position an i32.
fn check_positions(spec: &Spec, p: &ShardPositions, max_sq: usize, max_sk: usize) -> V<()> {
    let bad = |detail: String| Err(ValidationError::Positions { detail });
    if spec.kv_layout != KvLayout::Contiguous {
        return bad(format!(
            "a shard of a longer sequence needs the contiguous layout (this spec's is {:?})",
            spec.kv_layout
        ));
    }
    for (what, offset, local, global) in
        [("query rows", p.q_offset, max_sq, p.seqlen_q), ("keys", p.k_offset, max_sk, p.seqlen_k)]
    {
        if offset + local > global {
            let len = if what == "keys" { "seqlen_k" } else { "seqlen_q" };
            return bad(format!("{what} {offset}..{} lie past the global {len} {global}", offset + local));
        }
    }
    too_large("global seqlen_q", p.seqlen_q as u64, I32_LIMIT)?;
    too_large("global seqlen_k", p.seqlen_k as u64, I32_LIMIT)?;
    Ok(())
}

/// A varlen shard's per-sequence frames: `[batch, 4]` i32, each sequence's rows and keys
/// inside its global lengths. Returns the largest global lengths (what aux dims resolve
/// against).
fn check_sequence_positions(
    spec: &Spec,
    t: &HostIndex,
    d: &LaunchDescs,
    batch: usize,
    device: usize,
) -> V<(usize, usize)> {
    let bad = |detail: String| Err(ValidationError::Positions { detail });
    if spec.kv_layout != KvLayout::Varlen {
        return bad("one frame per sequence is for varlen batches (a contiguous batch takes one frame)".into());
    }
    check_index("sequence_positions", t, 2, "[batch, 4]", device)?;
    check_dims("sequence_positions", &t.desc, &[(batch, "batch"), (4, "4")])?;
    if !t.desc.is_contiguous() || t.values.len() < 4 * batch {
        return bad("sequence_positions must be a row-major [batch, 4] tensor".into());
    }
    let (Some(cq), Some(ck)) = (&d.cu_seqlens_q, &d.cu_seqlens_k) else {
        return bad("varlen frames need cu_seqlens".into());
    };
    let (mut gq_max, mut gk_max) = (0usize, 0usize);
    for b in 0..batch {
        let row = &t.values[4 * b..4 * b + 4];
        if row.iter().any(|&x| x < 0) {
            return bad(format!("sequence {b}: negative entry {row:?}"));
        }
        let [qo, ko, gq, gk] = [row[0], row[1], row[2], row[3]].map(|x| x as usize);
        let lq = (cq.values[b + 1] - cq.values[b]).max(0) as usize;
        let lk = (ck.values[b + 1] - ck.values[b]).max(0) as usize;
        for (what, offset, local, global) in [("query rows", qo, lq, gq), ("keys", ko, lk, gk)] {
            if offset + local > global {
                return bad(format!(
                    "sequence {b}: {what} {offset}..{} lie past its global length {global}",
                    offset + local
                ));
            }
        }
        gq_max = gq_max.max(gq);
        gk_max = gk_max.max(gk);
    }
    Ok((gq_max, gk_max))
}

/// The argument list of one kernel, in ABI order, from its `"name:type"` parameter list.
/// `extra` supplies what the plan does not hold (the split workspace pointers, the
/// encoded tensor maps). Fails on a parameter the runtime does not know or a type
/// mismatch: never launches a guess.
pub fn marshal(params: &[String], plan: &LaunchPlan, extra: &[(&str, ArgValue)]) -> Result<Vec<ArgValue>, String> {
    params
        .iter()
        .map(|p| {
            let (name, ty) = p.split_once(':').ok_or_else(|| format!("malformed parameter `{p}`"))?;
            let v = extra
                .iter()
                .find(|e| e.0 == name)
                .map(|e| e.1)
                .or_else(|| plan.arg(name))
                .ok_or_else(|| format!("the kernel takes `{name}`, which the runtime does not provide"))?;
            let ok = matches!(
                (ty, v),
                ("ptr", ArgValue::Ptr(_))
                    | ("i64", ArgValue::I64(_))
                    | ("i32", ArgValue::I32(_))
                    | ("f32", ArgValue::F32(_))
                    | ("tensormap", ArgValue::TensorMap(_))
            );
            if !ok {
                return Err(format!("parameter `{name}` is {ty}, the runtime has {v:?}"));
            }
            Ok(v)
        })
        .collect()
}
