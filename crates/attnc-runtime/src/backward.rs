//! The backward launch: [`Kernel::backward`] validates its arguments ([`plan_backward`],
//! descriptor-level and CPU-tested), sizes the workspace and runs the backward module's
//! kernels in order on the runtime's stream:
//!
//! ```text
//! memset   the aux gradients, or their deterministic partials, to 0
//! preprocess  D = rowsum(dO ∘ O), lse_log2; dq_accum = 0 [seqlen_pad / 32, q_heads, batch]
//! main        dK, dV; dQ and aux gradients accumulated [key tiles | columns, kv_heads × parts, batch]
//! dq convert  dQ = scale · Σ slices                   [seqlen_pad / 32, q_heads, batch]
//! sink grad   dsinks (specs with sinks)               [q_heads]
//! aux reduce  aux gradients from the partials (deterministic, learnable aux)
//! ```
//! The workspace layout is `attnc_lower::families::common::backward`'s.

use crate::block_mask::{BackwardPart, BlockMask, BuiltFor};
use crate::cache::CacheSource;
use crate::cuda::{ArgSlots, ArgValue, Queue};
use crate::error::{RuntimeError, ValidationError};
use crate::jit::{KernelMeta, LoadedKernel};
use crate::launch_memo::{BackwardMemo, LaunchSignature, QueuedLaunch};
use crate::params::Params;
use crate::receipt::{BlockMaskSource, KernelConfig, Receipt, Timings};
use crate::runtime::Kernel;
use crate::tensor::{ElemType, Tensor, TensorDesc};
use crate::validate::{
    check_align, check_dims, check_dtype, check_qkvo, check_view, marshal, overlaps, plan, KernelShape, LaunchDescs,
    LaunchPlan,
};
use attnc_ir::block_mask::{BlockDims, Tiling};
use attnc_ir::{KvLayout, Spec};
use attnc_lower::families::common::backward::{
    learnable_aux, padded_seqlen, ws_row_align, REDUCE_THREADS, ROWS_PER_CTA,
};
use attnc_lower::families::common::dq_order::{turn_flags, turn_plan_words, DqAccumulation, MAX_TURN_TILES};
use attnc_lower::{BlockLayout, Direction, Grid, KernelRole, LowerError};
use std::sync::Arc;

/// The largest workspace a deterministic backward sizes its dQ slices for: past it, fewer
/// grid columns (each walking more key tiles) share the slices.
pub const DETERMINISTIC_WORKSPACE_LIMIT: u64 = 2 << 30;

/// The gradient outputs of [`Kernel::backward`].
pub struct Gradients<'a> {
    /// Q's layout and dtype.
    pub dq: &'a mut Tensor,
    /// K's layout and dtype (summed over each KV head's query heads).
    pub dk: &'a mut Tensor,
    /// V's layout and dtype.
    pub dv: &'a mut Tensor,
}

/// A validated, sized backward call.
struct BackwardSetup<'p> {
    module: Arc<LoadedKernel>,
    source: CacheSource,
    descs: BackwardDescs<'p>,
    plan: BackwardPlan,
    /// The classification of an aux mask: tiling, dims, layout, workspace bytes of its
    /// classes when classified per call (after the plan's regions; 0 with a mask passed in).
    classify: Option<(Tiling, BlockDims, BlockLayout, usize)>,
}

impl BackwardSetup<'_> {
    fn ws_bytes(&self) -> usize {
        self.plan.ws_bytes + self.classify.map_or(0, |c| c.3)
    }
}

/// Every argument of one backward launch, as descriptors.
#[derive(Clone, Debug)]
pub struct BackwardDescs<'a> {
    /// Q, K, V, the forward's O and LSE, and the variant's inputs (params, aux, sinks,
    /// varlen metadata).
    pub fwd: LaunchDescs<'a>,
    pub d_out: TensorDesc,
    pub dq: TensorDesc,
    pub dk: TensorDesc,
    pub dv: TensorDesc,
    pub dsinks: Option<TensorDesc>,
    pub aux_grads: Vec<(String, TensorDesc)>,
    pub deterministic: bool,
}

/// What the backward module's kernels look like (from its metadata).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackwardShape {
    /// Queries per tile of the main kernel's walk, and keys per CTA.
    pub block_m: u32,
    pub block_n: u32,
    /// CTAs per key tile (column parts).
    pub parts: u32,
    /// Warps per CTA (each has its own deterministic aux-gradient slice).
    pub warps: u32,
    /// Resident main-kernel CTAs per SM.
    pub ctas_per_sm: u32,
    /// The kernel implements `DqAccumulation::Ordered`.
    pub ordered_dq: bool,
    /// CTA pairs (clusters of two along y) share each key tile of `block_n` keys.
    pub pair: bool,
}

impl BackwardShape {
    /// The shape of a backward main kernel (its grid must be `Grid::KeyTiles`).
    pub fn of(main: &KernelMeta, ctas_per_sm: u32) -> Result<BackwardShape, RuntimeError> {
        let Grid::KeyTiles { parts, ordered_dq, pair } = main.grid else {
            return Err(RuntimeError::Abi(format!("the backward main kernel's grid is {:?}", main.grid)));
        };
        Ok(BackwardShape {
            block_m: main.block_m,
            block_n: main.block_n,
            parts,
            warps: main.threads_per_block / 32,
            ctas_per_sm,
            ordered_dq,
            pair,
        })
    }
}

/// A validated backward launch.
#[derive(Clone, Debug, PartialEq)]
pub struct BackwardPlan {
    /// The forward-shaped part (Q, K, V, O, LSE, variant arguments).
    pub fwd: LaunchPlan,
    /// Arguments the backward kernels add (dO, dQ, dK, dV and their strides, outputs of
    /// the optional gradients); the workspace pointers are added at launch.
    pub args: Vec<(String, ArgValue)>,
    pub seqlen_pad: usize,
    pub dq_slices: u32,
    /// How dQ is accumulated, and why a deterministic launch takes the slice mode.
    pub dq_accumulation: DqAccumulation,
    pub dq_accumulation_reason: Option<String>,
    /// f32 elements of all learnable aux tensors together, and the deterministic
    /// partials' slice count (0 without learnable aux or when not deterministic).
    pub aux_total: usize,
    pub aux_slices: u32,
    pub main_grid: [u32; 3],
    pub row_grid: [u32; 3],
    pub heads_grid: [u32; 3],
    pub aux_grid: [u32; 3],
    pub deterministic: bool,
    /// Byte offsets in the workspace: dpsum, lse_log2, dq_accum, aux partials; total.
    pub ws_offsets: [usize; 4],
    /// The ordered mode's turn flags (`u32`, zeroed before the launch) and turn plan
    /// (`u32`, written by the turn-plan kernel): byte offset and count of each.
    pub turn_flags: (usize, usize),
    pub turn_plan: (usize, usize),
    /// The turn-plan kernel's grid (zeros when not ordered).
    pub turn_grid: [u32; 3],
    pub ws_bytes: usize,
}

type V<T> = Result<T, ValidationError>;

fn same_shape(arg: &str, d: &TensorDesc, like: &TensorDesc, like_name: &str) -> V<()> {
    if d.shape.len() != like.shape.len() {
        return Err(ValidationError::Rank {
            arg: arg.into(),
            expected: like.shape.len(),
            found: d.shape.len(),
            layout: format!("the shape of {like_name}"),
        });
    }
    let dims: Vec<(usize, &str)> = like.shape.iter().map(|&n| (n, like_name)).collect();
    check_dims(arg, d, &dims)
}

fn strides_args(args: &mut Vec<(String, ArgValue)>, name: &str, t: &TensorDesc) {
    let rank = t.shape.len();
    let st = |i: usize| ArgValue::I64(t.strides[i] as i64);
    args.push((name.to_string(), ArgValue::Ptr(t.addr)));
    args.push((format!("{name}_stride_batch"), if rank == 4 { st(0) } else { ArgValue::I64(0) }));
    args.push((format!("{name}_stride_row"), st(rank - 3)));
    args.push((format!("{name}_stride_head"), st(rank - 2)));
}

fn round256(n: usize) -> usize {
    n.div_ceil(256) * 256
}

/// Validates a backward launch of `spec` on a device with `sm_count` SMs and ordinal
/// `device`: everything the forward checks for Q, K, V, O (here the forward's output) and
/// the LSE (always required), then dO like O, dQ like Q, dK like K, dV like V, dsinks
/// exactly with sinks, an f32 gradient of each learnable aux tensor's shape, and no
/// output overlapping an input or another output.
pub fn plan_backward(
    spec: &Spec,
    shape: &BackwardShape,
    sm_count: u32,
    device: usize,
    d: &BackwardDescs,
) -> V<BackwardPlan> {
    // The forward's checks, with the LSE required (a backward reads it whatever the spec
    // writes by default).
    let mut fwd_spec = spec.clone();
    fwd_spec.lse = true;
    if d.fwd.lse.is_none() {
        return Err(ValidationError::Missing {
            arg: "lse".into(),
            why: "the backward reads the forward's LSE (Kernel::forward_lse writes it)".into(),
        });
    }
    let ks = KernelShape {
        block_m: 64,
        block_n: 64,
        combine: crate::validate::CombineKind::None,
        ctas_per_sm: 1,
        persistent: false,
    };
    let fwd = plan(&fwd_spec, &ks, sm_count, device, &d.fwd)?;
    let dt = ElemType::of(spec.dtype);
    let rank = d.fwd.q.shape.len();
    let lname = match spec.kv_layout {
        KvLayout::Varlen => "varlen: [total_tokens, heads, head_dim]",
        _ => "contiguous: [batch, seqlen, heads, head_dim]",
    };
    for (arg, t, like, like_name) in [
        ("do", &d.d_out, &d.fwd.o, "o"),
        ("dq", &d.dq, &d.fwd.q, "q"),
        ("dk", &d.dk, &d.fwd.k, "k"),
        ("dv", &d.dv, &d.fwd.v, "v"),
    ] {
        check_qkvo(arg, t, dt, rank, lname, device)?;
        same_shape(arg, t, like, like_name)?;
    }
    let qh = spec.q_heads as usize;

    // ---- sink gradient
    match (spec.sinks, &d.dsinks) {
        (true, Some(s)) => {
            check_dtype("dsinks", s, ElemType::F32)?;
            check_view("dsinks", s, 1, "[q_heads]", device)?;
            check_dims("dsinks", s, &[(qh, "q_heads")])?;
            check_align("dsinks", s, 4)?;
        }
        (true, None) => {
            return Err(ValidationError::Missing {
                arg: "dsinks".into(),
                why: "the spec has sinks: their gradient, f32 [q_heads]".into(),
            })
        }
        (false, Some(_)) => {
            return Err(ValidationError::Unexpected { arg: "dsinks".into(), why: "the spec has no sinks".into() })
        }
        (false, None) => {}
    }

    // ---- learnable aux gradients
    let learnable = learnable_aux(spec);
    for (name, _) in &d.aux_grads {
        if !learnable.iter().any(|a| &a.name == name) {
            let why = if spec.aux_decl(name).is_some() {
                "is not learnable (declare it `learnable` to get its gradient)"
            } else {
                "the spec declares no such aux tensor"
            };
            return Err(ValidationError::Aux { name: name.clone(), detail: format!("gradient given, but {why}") });
        }
        if d.aux_grads.iter().filter(|a| &a.0 == name).count() > 1 {
            return Err(ValidationError::Aux { name: name.clone(), detail: "gradient given more than once".into() });
        }
    }
    let mut args: Vec<(String, ArgValue)> = Vec::new();
    let mut aux_total = 0usize;
    let mut outputs: Vec<(String, &TensorDesc)> =
        vec![("dq".into(), &d.dq), ("dk".into(), &d.dk), ("dv".into(), &d.dv)];
    if let Some(s) = &d.dsinks {
        outputs.push(("dsinks".into(), s));
    }
    for a in &learnable {
        let Some((_, g)) = d.aux_grads.iter().find(|x| x.0 == a.name) else {
            return Err(ValidationError::Aux {
                name: a.name.clone(),
                detail: "learnable: its gradient (f32, the tensor's shape) is missing".into(),
            });
        };
        let Some((_, t)) = d.fwd.aux.iter().find(|x| x.0 == a.name) else {
            return Err(ValidationError::Aux { name: a.name.clone(), detail: "missing".into() });
        };
        let arg = format!("aux gradient `{}`", a.name);
        check_dtype(&arg, g, ElemType::F32)?;
        check_view(&arg, g, t.shape.len(), "the aux tensor's dims", device)?;
        let dims: Vec<(usize, &str)> = t.shape.iter().map(|&n| (n, "the aux tensor's dim")).collect();
        check_dims(&arg, g, &dims)?;
        check_align(&arg, g, 4)?;
        if !g.is_contiguous() {
            return Err(ValidationError::Aux {
                name: a.name.clone(),
                detail: "its gradient must be contiguous".into(),
            });
        }
        aux_total += t.shape.iter().product::<usize>();
        args.push((format!("aux_grad_{}", a.name), ArgValue::Ptr(g.addr)));
        outputs.push((format!("aux gradient `{}`", a.name), g));
    }

    // ---- outputs alias nothing
    let mut inputs: Vec<(String, &TensorDesc)> = vec![
        ("q".into(), &d.fwd.q),
        ("k".into(), &d.fwd.k),
        ("v".into(), &d.fwd.v),
        ("o".into(), &d.fwd.o),
        ("do".into(), &d.d_out),
    ];
    if let Some(l) = &d.fwd.lse {
        inputs.push(("lse".into(), l));
    }
    if let Some(s) = &d.fwd.sinks {
        inputs.push(("sinks".into(), s));
    }
    for (n, t) in &d.fwd.aux {
        inputs.push((format!("aux `{n}`"), t));
    }
    for (n, h) in [("cu_seqlens_q", &d.fwd.cu_seqlens_q), ("cu_seqlens_k", &d.fwd.cu_seqlens_k)] {
        if let Some(h) = h {
            inputs.push((n.into(), &h.desc));
        }
    }
    for (i, (on, o)) in outputs.iter().enumerate() {
        for (inn, t) in &inputs {
            if overlaps(o, t) {
                return Err(ValidationError::Overlap { a: on.clone(), b: inn.clone() });
            }
        }
        for (on2, o2) in &outputs[i + 1..] {
            if overlaps(o, o2) {
                return Err(ValidationError::Overlap { a: on.clone(), b: on2.clone() });
            }
        }
    }

    // ---- grids and the workspace
    let (batch, max_sq, max_sk) = (fwd.batch, fwd.max_seqlen_q, fwd.max_seqlen_k);
    let pad = padded_seqlen(max_sq, ws_row_align(shape.block_m));
    let kvh = spec.kv_heads as usize;
    // A pair's two CTAs are adjacent along y (the kernel's cluster).
    let ctas_per_tile = if shape.pair { 2 } else { 1 };
    let y = kvh * shape.parts as usize * ctas_per_tile;
    let key_tiles = max_sk.div_ceil(shape.block_n.max(1) as usize).max(1);
    let row_bytes = batch * qh * pad * spec.head_dim_qk as usize * 4;
    // Deterministic: ordered turns over the default grid where the kernel has them and a
    // KV head's key tiles (the CTAs that wait for each other) fit the resident slots at
    // once — else they could wait for CTAs that cannot start; otherwise slices.
    let slots = (sm_count.max(1) * shape.ctas_per_sm.max(1)) as usize;
    let (dq_accumulation, dq_accumulation_reason) = match (d.deterministic, shape.ordered_dq, shape.parts) {
        (false, ..) => (DqAccumulation::Atomic, None),
        (true, false, _) => (DqAccumulation::Slices, Some("the family's kernel has no ordered mode".to_string())),
        (true, true, parts) if parts != 1 => (DqAccumulation::Slices, Some(format!("{parts} CTAs per key tile"))),
        (true, true, _) if key_tiles * ctas_per_tile > slots || key_tiles > MAX_TURN_TILES as usize => (
            DqAccumulation::Slices,
            Some(format!(
                "{key_tiles} key tiles per KV head ({} CTAs) exceed the {slots} resident CTAs ({} usable SMs x {}) the ordered turns need at once",
                key_tiles * ctas_per_tile,
                sm_count.max(1),
                shape.ctas_per_sm.max(1)
            )),
        ),
        (true, true, _) => (DqAccumulation::Ordered, None),
    };
    let columns = if dq_accumulation == DqAccumulation::Slices {
        // About four waves of CTAs over the resident slots (few CTAs of long serial walks
        // would leave SMs idle in the last wave), never more slices than the workspace
        // limit holds; each column walks its key tiles in order.
        let want = (4 * slots).div_ceil((y * batch).max(1)).clamp(1, key_tiles);
        let fit = (DETERMINISTIC_WORKSPACE_LIMIT as usize / row_bytes.max(1)).max(1);
        want.min(fit)
    } else {
        key_tiles
    };
    let dq_slices = if dq_accumulation == DqAccumulation::Slices { columns } else { 1 };
    let main_grid = [columns as u32, y as u32, batch as u32];
    let aux_slices = if d.deterministic && aux_total > 0 { columns * y * batch * shape.warps as usize } else { 0 };
    let per_row = batch * qh * pad * 4;
    let o_dpsum = 0;
    let o_lse = round256(per_row);
    let o_dq = o_lse + round256(per_row);
    let o_aux = o_dq + round256(dq_slices * row_bytes);
    let ordered = dq_accumulation == DqAccumulation::Ordered;
    let o_turns = o_aux + round256(aux_slices * aux_total * 4);
    let n_turns = if ordered { turn_flags(batch, qh, pad) } else { 0 };
    let o_plan = o_turns + round256(n_turns * 4);
    let n_plan = if ordered { turn_plan_words(batch, qh, pad, max_sk, shape.block_m, shape.block_n) } else { 0 };
    let ws_bytes = o_plan + n_plan * 4;
    let turn_grid = if ordered {
        [max_sq.div_ceil(shape.block_m.max(1) as usize) as u32, qh as u32, batch as u32]
    } else {
        [0, 0, 0]
    };

    for (n, t) in [("do", &d.d_out), ("dq", &d.dq), ("dk", &d.dk), ("dv", &d.dv)] {
        strides_args(&mut args, n, t);
    }
    if let Some(s) = &d.dsinks {
        args.push(("dsinks".into(), ArgValue::Ptr(s.addr)));
    }
    args.push(("deterministic".into(), ArgValue::I32(dq_accumulation.arg())));
    args.push(("dq_slices".into(), ArgValue::I32(dq_slices as i32)));
    args.push(("aux_grad_slices".into(), ArgValue::I32(aux_slices as i32)));
    Ok(BackwardPlan {
        fwd,
        args,
        seqlen_pad: pad,
        dq_slices: dq_slices as u32,
        dq_accumulation,
        dq_accumulation_reason,
        aux_total,
        aux_slices: aux_slices as u32,
        main_grid,
        row_grid: [(pad as u32) / ROWS_PER_CTA, qh as u32, batch as u32],
        heads_grid: [qh as u32, 1, 1],
        aux_grid: [aux_total.div_ceil(REDUCE_THREADS as usize) as u32, 1, 1],
        deterministic: d.deterministic,
        ws_offsets: [o_dpsum, o_lse, o_dq, o_aux],
        turn_flags: (o_turns, n_turns),
        turn_plan: (o_plan, n_plan),
        turn_grid,
        ws_bytes: ws_bytes.max(256),
    })
}

impl Kernel {
    /// The backward of attention: dQ, dK and dV (and, through `params`, the sinks' and the
    /// learnable aux tensors' gradients) from Q, K, V, the forward's output `o` and LSE
    /// (see [`Kernel::forward_lse`]) and the output gradient `d_out`. Every argument is
    /// validated before anything launches; paged KV and split-KV specs have no backward
    /// (an error). With `params.deterministic`, dQ and the aux gradients are accumulated
    /// in a fixed order: bitwise-identical results on every run.
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        o: &Tensor,
        lse: &Tensor,
        d_out: &Tensor,
        grads: Gradients<'_>,
        params: &Params,
    ) -> Result<Receipt, RuntimeError> {
        let this = self.for_launch(params)?;
        let signature = this.backward_memo_serves(params)?.then(|| {
            LaunchSignature::of_backward(q, k, v, o, lse, d_out, [&*grads.dq, &*grads.dk, &*grads.dv], params)
        });
        if let Some(sig) = &signature {
            if let Some(receipt) = this.replay_backward(sig, params)? {
                return Ok(receipt);
            }
        }
        let setup = this.backward_setup(q, k, v, o, lse, d_out, &grads, params)?;
        this.run_backward(setup, params, signature)
    }

    /// Whether the backward memo may serve this call: not a timed one, and not one whose
    /// mask classifies its tiles per call (its lists live in the call's workspace).
    pub(crate) fn backward_memo_serves(&self, params: &Params) -> Result<bool, RuntimeError> {
        let (module, _) = self.backward_module()?;
        Ok(!params.timing && module.meta.kernel(KernelRole::BlockClassify).is_none())
    }

    /// Queues the remembered backward when `sig` is its signature and the workspace it
    /// used is still this call's; `None` otherwise.
    pub(crate) fn replay_backward(
        &self,
        sig: &LaunchSignature,
        params: &Params,
    ) -> Result<Option<Receipt>, RuntimeError> {
        let memo = self.backward_memo.lock().unwrap_or_else(|e| e.into_inner());
        let Some(m) = memo.as_ref().filter(|m| m.signature == *sig) else { return Ok(None) };
        let (module, _) = self.backward_module()?;
        let queue = self.rt.inner.gpu.queue(params.stream);
        let ws_guard = self.rt.workspace(m.ws_bytes, &queue, params.workspace)?;
        if ws_guard.ptr() != m.ws_ptr {
            return Ok(None);
        }
        for &(at, words) in &m.memsets {
            queue.memset_d32(at, 0, words)?;
        }
        for l in &m.launches {
            launch_queued(&queue, &module, l)?;
        }
        drop(ws_guard);
        Ok(Some(m.receipt.clone()))
    }

    /// The workspace bytes a backward with these arguments needs; pass a buffer of at
    /// least that in [`Params::workspace`] to keep the call off the pool.
    #[allow(clippy::too_many_arguments)]
    pub fn backward_workspace_bytes(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        o: &Tensor,
        lse: &Tensor,
        d_out: &Tensor,
        grads: Gradients<'_>,
        params: &Params,
    ) -> Result<usize, RuntimeError> {
        let this = self.for_launch(params)?;
        Ok(this.backward_setup(q, k, v, o, lse, d_out, &grads, params)?.ws_bytes())
    }

    /// Validates a backward call and sizes it (module, plan, workspace).
    #[allow(clippy::too_many_arguments)]
    fn backward_setup<'p>(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        o: &Tensor,
        lse: &Tensor,
        d_out: &Tensor,
        grads: &Gradients<'_>,
        params: &'p Params,
    ) -> Result<BackwardSetup<'p>, RuntimeError> {
        if let Some(reason) = attnc_lower::compile::pass_unsupported_reason(&self.spec, Direction::Backward) {
            return Err(RuntimeError::Lower(LowerError::NoSuchPass { direction: Direction::Backward, reason }));
        }
        let (module, source) = self.backward_module()?;
        let meta = &module.meta;
        let main = meta.main().ok_or_else(|| RuntimeError::Abi("the backward module has no main kernel".into()))?;
        let shape = BackwardShape::of(main, module.main_ctas_per_sm)?;
        let descs = BackwardDescs {
            fwd: LaunchDescs {
                q: q.desc(),
                k: k.desc(),
                v: v.desc(),
                o: o.desc(),
                lse: Some(lse.desc()),
                cu_seqlens_q: params.cu_seqlens_q.map(|t| t.host_index()),
                cu_seqlens_k: params.cu_seqlens_k.map(|t| t.host_index()),
                block_table: params.block_table.map(|t| t.host_index()),
                seqused_k: params.seqused_k.map(|t| t.host_index()),
                sinks: params.sinks.map(|t| t.desc()),
                aux: params.aux.iter().map(|(n, t)| (n.clone(), t.desc())).collect(),
                params: params.values.clone(),
                num_splits: None,
                positions: params.positions,
                sequence_positions: params.sequence_positions.map(|(t, _)| t.host_index()),
            },
            d_out: d_out.desc(),
            dq: grads.dq.desc(),
            dk: grads.dk.desc(),
            dv: grads.dv.desc(),
            dsinks: params.dsinks.map(|t| t.desc()),
            aux_grads: params.aux_grads.iter().map(|(n, t)| (n.clone(), t.desc())).collect(),
            deterministic: params.deterministic,
        };
        let gpu = &self.rt.inner.gpu;
        let mut plan = plan_backward(&self.spec, &shape, gpu.info.usable_sm_count, gpu.info.ordinal, &descs)?;
        self.shard_sinks(&mut plan.fwd.args, params)?;
        // A mask over aux tensors: its classes at the backward's tiling, classified per
        // call into the workspace after the plan's regions, or kept in a passed-in mask.
        let classify = module.meta.kernel(KernelRole::BlockClassify).map(|c| {
            let tiling = Tiling { block_m: c.block_m, block_n: c.block_n, pack_gqa: false };
            let layout = match c.grid {
                attnc_lower::Grid::BlockRows { layout } => layout,
                _ => attnc_lower::BlockLayout::Dense,
            };
            let d = crate::block_mask::with_bit_slots(
                BlockDims::new(&self.spec, tiling, plan.fwd.batch, plan.fwd.max_seqlen_q, plan.fwd.max_seqlen_k),
                layout,
            );
            let words = crate::block_mask::layout_words(d, layout);
            let ws = if params.block_mask.is_some() { 0 } else { round256(words.max(1) * 4) };
            (tiling, d, layout, ws)
        });
        Ok(BackwardSetup { module, source, descs, plan, classify })
    }

    fn run_backward(
        &self,
        setup: BackwardSetup<'_>,
        params: &Params,
        signature: Option<LaunchSignature>,
    ) -> Result<Receipt, RuntimeError> {
        let ws_bytes = setup.ws_bytes();
        let BackwardSetup { module, source, descs, plan, classify } = setup;
        let meta = &module.meta;
        let main = meta.main().ok_or_else(|| RuntimeError::Abi("the backward module has no main kernel".into()))?;
        let gpu = &self.rt.inner.gpu;
        let (requested, fallback_reason) = self.receipt_choice(meta);
        let mut receipt = Receipt {
            block_mask: None,
            spec: self.spec.name.clone(),
            direction: Direction::Backward,
            requested,
            executed: meta.family.clone(),
            arch: meta.arch.clone(),
            device: gpu.info.name.clone(),
            config: KernelConfig {
                kernel: main.name.clone(),
                block_m: main.block_m,
                block_n: main.block_n,
                threads: main.threads_per_block,
                smem_bytes: main.dynamic_smem_bytes,
                registers: module.main_regs,
                ctas_per_sm: module.main_ctas_per_sm,
            },
            image: match module.image {
                crate::cuda::Image::Cubin => format!("cubin ({})", meta.compiler),
                crate::cuda::Image::Ptx => "ptx (driver JIT at load)".into(),
            },
            kernel_source: source,
            batch: plan.fwd.batch,
            max_seqlen_q: plan.fwd.max_seqlen_q,
            max_seqlen_k: plan.fwd.max_seqlen_k,
            grid: plan.main_grid,
            num_splits: 1,
            split_reason: "none (the backward does not split)".into(),
            combine_grid: None,
            fallback_reason,
            skipped: None,
            deterministic: Some(plan.deterministic),
            dq_accumulation: Some(plan.dq_accumulation),
            dq_accumulation_reason: plan.dq_accumulation_reason.clone(),
            timings: None,
        };
        if plan.fwd.batch == 0 {
            receipt.skipped = Some("no batch entry: nothing to compute".into());
            return Ok(receipt);
        }

        let queue = gpu.queue(params.stream);
        let ws_guard = self.rt.workspace(ws_bytes, &queue, params.workspace)?;
        let ws = ws_guard.ptr();
        let [o_dpsum, o_lse, o_dq, o_aux] = plan.ws_offsets;
        let mut extra: Vec<(&str, ArgValue)> = vec![
            ("dpsum", ArgValue::Ptr(ws + o_dpsum as u64)),
            ("lse_log2", ArgValue::Ptr(ws + o_lse as u64)),
            ("dq_accum", ArgValue::Ptr(ws + o_dq as u64)),
            ("aux_grad_ws", ArgValue::Ptr(ws + o_aux as u64)),
            ("dq_order", ArgValue::Ptr(ws + plan.turn_flags.0 as u64)),
            ("turn_plan", ArgValue::Ptr(ws + plan.turn_plan.0 as u64)),
        ];
        extra.extend(plan.args.iter().map(|(n, a)| (n.as_str(), *a)));
        // The main kernel's tensor maps (the hopper family's TMA loads of Q, K, V, dO):
        // every precondition of cuTensorMapEncodeTiled was checked by the plan's validation
        // of the same tensors, and is checked again here before the driver sees it.
        let maps = crate::tma::plan_tensor_maps_over(&main.tensor_maps, |t| match t {
            "q" => Some(&descs.fwd.q),
            "k" => Some(&descs.fwd.k),
            "v" => Some(&descs.fwd.v),
            "do" => Some(&descs.d_out),
            _ => None,
        })?;
        for e in &maps {
            extra.push((e.param.as_str(), ArgValue::TensorMap(crate::tma::encode(gpu, e)?)));
        }
        // A mask over aux tensors: its classes at the backward's tiling (one class per
        // (query tile, key tile); the main kernel probes them) — the passed-in mask's, or
        // classified now. The lock on a mask's backward part is held until the classifier
        // is queued, so a concurrent caller never reads unqueued classes.
        let mut classify_launch = None;
        let mut _backward_part = None;
        if let Some((tiling, d, layout, _)) = classify {
            let (ptr, source) = match params.block_mask {
                None => (ws + plan.ws_bytes as u64, BlockMaskSource::BuiltPerCall),
                Some(mask) => {
                    let (guard, built_now) = self.backward_block_mask(mask, &plan.fwd, params, tiling, d, layout)?;
                    let ptr = guard.as_ref().map(|b| b.lists.device_ptr()).unwrap_or(0);
                    _backward_part = Some(guard);
                    (ptr, if built_now { BlockMaskSource::PassedInBackwardBuiltNow } else { BlockMaskSource::PassedIn })
                }
            };
            extra.extend(crate::block_mask::list_args(ptr, d, layout));
            // (Every kernel of the module is marshalled, launched or not.)
            let bit_queue = crate::block_mask::queue_arg(ptr, d, layout);
            extra.extend(bit_queue.map(|(arg, _)| arg));
            if source != BlockMaskSource::PassedIn {
                let sms = gpu.info.usable_sm_count;
                classify_launch = Some(crate::block_mask::ClassifierLaunch::new(d, tiling, layout, ptr, sms));
            }
            receipt.block_mask = Some(crate::receipt::BlockMaskUse {
                source,
                block_m: tiling.block_m,
                block_n: tiling.block_n,
                live_fraction: None,
                classify_ms: None,
            });
        }
        let launches: Vec<(&KernelMeta, [u32; 3])> = meta
            .kernels
            .iter()
            .map(|k| {
                let grid = match k.role {
                    KernelRole::BackwardPreprocess | KernelRole::DqConvert => plan.row_grid,
                    KernelRole::BackwardMain => plan.main_grid,
                    KernelRole::SinkGrad => plan.heads_grid,
                    KernelRole::AuxGradReduce if plan.deterministic => plan.aux_grid,
                    // Atomic accumulation writes the gradients directly.
                    KernelRole::AuxGradReduce => [0, 0, 0],
                    KernelRole::BlockClassify => classify_launch.map_or([0, 0, 0], |l| l.grid),
                    KernelRole::BlockBits => classify_launch.map_or([0, 0, 0], |l| l.bits_grid),
                    KernelRole::TurnPlan => plan.turn_grid,
                    other => return Err(RuntimeError::Abi(format!("a {other} kernel in a backward module"))),
                };
                Ok((k, grid))
            })
            .collect::<Result<_, RuntimeError>>()?;
        let order = [
            KernelRole::BlockClassify,
            KernelRole::BlockBits,
            KernelRole::BackwardPreprocess,
            KernelRole::TurnPlan,
            KernelRole::BackwardMain,
            KernelRole::DqConvert,
            KernelRole::SinkGrad,
            KernelRole::AuxGradReduce,
        ];
        let mut queued = Vec::new();
        for role in order {
            for (k, grid) in launches.iter().filter(|(k, _)| k.role == role) {
                let a = marshal(&k.params, &plan.fwd, &extra).map_err(RuntimeError::Abi)?;
                if grid.contains(&0) {
                    continue;
                }
                let smem = match (role, classify_launch) {
                    (KernelRole::BlockClassify, Some(l)) => l.smem,
                    _ => k.dynamic_smem_bytes,
                };
                queued.push(QueuedLaunch {
                    role,
                    grid: *grid,
                    threads: k.threads_per_block,
                    smem,
                    args: ArgSlots::pack(&a),
                });
            }
        }
        // The aux accumulators start at 0 (dq_accum is zeroed by the preprocess kernel).
        // The classifier's bit-work queue starts empty.
        let mut memsets: Vec<(u64, usize)> = Vec::new();
        if let Some(count_at) = classify_launch.and_then(|l| l.queue_count) {
            memsets.push((count_at, 1));
        }
        if plan.turn_flags.1 > 0 {
            memsets.push((ws + plan.turn_flags.0 as u64, plan.turn_flags.1));
        }
        if plan.aux_total > 0 {
            if plan.deterministic {
                memsets.push((ws + o_aux as u64, plan.aux_slices as usize * plan.aux_total));
            } else {
                memsets.extend(params.aux_grads.iter().map(|(_, t)| (t.device_ptr(), t.numel())));
            }
        }

        let events = if params.timing { Some((gpu.event()?, gpu.event()?, gpu.event()?, gpu.event()?)) } else { None };
        if let Some((a, ..)) = &events {
            queue.record(a)?;
        }
        for &(at, words) in &memsets {
            queue.memset_d32(at, 0, words)?;
        }
        for l in &queued {
            let main = l.role == KernelRole::BackwardMain;
            if let (true, Some((_, b, ..))) = (main, &events) {
                queue.record(b)?;
            }
            launch_queued(&queue, &module, l)?;
            if let (true, Some((_, _, c, _))) = (main, &events) {
                queue.record(c)?;
            }
        }
        if let Some((a, b, c, e)) = &events {
            queue.record(e)?;
            let main_ms = f64::from(gpu.elapsed_ms(b, c)?);
            let total = f64::from(gpu.elapsed_ms(a, e)?);
            receipt.timings = Some(Timings { main_ms, combine_ms: None, total_ms: total });
        }
        // Remembered only where nothing in it was made for this call alone: no per-call
        // classification (its tile lists sit in this call's workspace).
        if let (Some(signature), None) = (signature, classify_launch) {
            let memo =
                BackwardMemo { signature, ws_bytes, ws_ptr: ws, memsets, launches: queued, receipt: receipt.clone() };
            *self.backward_memo.lock().unwrap_or_else(|e| e.into_inner()) = Some(memo);
        }
        drop(ws_guard);
        Ok(receipt)
    }

    /// The backward part of a passed-in block mask: checks that the mask serves this launch
    /// (built by this kernel for the same shapes, aux tensors and params), then returns its
    /// locked backward classes — allocated now when this is the first backward to receive
    /// it (`true`: the caller queues the classifier into them before releasing the lock).
    fn backward_block_mask<'m>(
        &self,
        mask: &'m BlockMask,
        plan: &LaunchPlan,
        params: &Params,
        tiling: Tiling,
        dims: BlockDims,
        layout: BlockLayout,
    ) -> Result<(BackwardPart<'m>, bool), RuntimeError> {
        let forward = self.block_mask_built_for(plan, params)?;
        mask.built_for.check_serves(&forward)?;
        let want = BuiltFor { module_key: format!("{} backward", forward.module_key), tiling, layout, dims, ..forward };
        let mut slot =
            mask.backward.lock().map_err(|_| RuntimeError::Other("a block mask's lock was poisoned".into()))?;
        if let Some(part) = slot.as_ref() {
            part.built_for.check_serves(&want)?;
            return Ok((slot, false));
        }
        let lists = self.rt.alloc(ElemType::I32, &[want.words().max(1)])?;
        *slot = Some(Box::new(BlockMask::new(want, lists)));
        Ok((slot, true))
    }

    /// The backward module (compiled or loaded on first use, then kept).
    pub(crate) fn backward_module(&self) -> Result<(Arc<LoadedKernel>, CacheSource), RuntimeError> {
        if let Some(m) = self.backward.get() {
            return Ok(m.clone());
        }
        let (loaded, source, _) = self.rt.module(&self.spec, self.family, Direction::Backward)?;
        let _ = self.backward.set((loaded, source));
        self.backward.get().cloned().ok_or_else(|| RuntimeError::Other("the backward module did not load".into()))
    }
}

/// Launches one queued kernel of a backward module on `queue`.
fn launch_queued(queue: &Queue, module: &LoadedKernel, l: &QueuedLaunch) -> Result<(), RuntimeError> {
    let f = module.function(l.role).ok_or_else(|| RuntimeError::Abi(format!("{} kernel not loaded", l.role)))?;
    queue.launch_packed(f, l.grid, l.threads, l.smem, &l.args)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::HostIndex;
    use attnc_ir::{Align, AuxDecl, AuxDim};
    use attnc_lower::families::common::backward::WS_ROW_ALIGN;

    const SMS: u32 = 132;
    const SHAPE: BackwardShape = BackwardShape {
        block_m: 64,
        block_n: 128,
        parts: 1,
        warps: 16,
        ctas_per_sm: 1,
        ordered_dq: false,
        pair: false,
    };

    /// Non-overlapping, 256-byte aligned fake device addresses.
    struct Alloc(u64);
    impl Alloc {
        fn t(&mut self, dtype: ElemType, shape: &[usize]) -> TensorDesc {
            let d = TensorDesc::contiguous(dtype, shape, self.0, 0);
            self.0 += (d.capacity * dtype.bytes() as u64).div_ceil(256) * 256 + 256;
            d
        }
    }

    /// GQA 8/2, d 64, causal, a learnable bias table and sinks.
    fn spec() -> Spec {
        let mut s = Spec::new("bwd", 64, 8);
        s.kv_heads = 2;
        s.mask.causal = Some(Align::TopLeft);
        s.sinks = true;
        s.aux.push(AuxDecl::float("bias", vec![AuxDim::QHeads, AuxDim::Fixed(32)], true));
        s
    }

    /// A valid launch: B = 2, Sq = 70, Sk = 300.
    fn descs(a: &mut Alloc) -> BackwardDescs<'static> {
        let bf = ElemType::Bf16;
        let q = a.t(bf, &[2, 70, 8, 64]);
        let k = a.t(bf, &[2, 300, 2, 64]);
        let v = a.t(bf, &[2, 300, 2, 64]);
        let o = a.t(bf, &[2, 70, 8, 64]);
        BackwardDescs {
            fwd: LaunchDescs {
                lse: Some(a.t(ElemType::F32, &[2, 8, 70])),
                cu_seqlens_q: None,
                cu_seqlens_k: None,
                block_table: None,
                seqused_k: None,
                sinks: Some(a.t(ElemType::F32, &[8])),
                aux: vec![("bias".into(), a.t(ElemType::F32, &[8, 32]))],
                params: Vec::new(),
                num_splits: None,
                positions: None,
                sequence_positions: None,
                q: q.clone(),
                k: k.clone(),
                v: v.clone(),
                o: o.clone(),
            },
            d_out: a.t(bf, &[2, 70, 8, 64]),
            dq: a.t(bf, &[2, 70, 8, 64]),
            dk: a.t(bf, &[2, 300, 2, 64]),
            dv: a.t(bf, &[2, 300, 2, 64]),
            dsinks: Some(a.t(ElemType::F32, &[8])),
            aux_grads: vec![("bias".into(), a.t(ElemType::F32, &[8, 32]))],
            deterministic: false,
        }
    }

    fn err(s: &Spec, d: &BackwardDescs) -> ValidationError {
        match plan_backward(s, &SHAPE, SMS, 0, d) {
            Ok(p) => panic!("accepted: {p:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn a_valid_launch_plans_grids_and_the_workspace() {
        let s = spec();
        let d = descs(&mut Alloc(1 << 32));
        let p = plan_backward(&s, &SHAPE, SMS, 0, &d).expect("valid");
        assert_eq!(p.seqlen_pad, 128, "70 rows padded to {WS_ROW_ALIGN}");
        // 300 keys in tiles of 128: 3 columns, 2 KV heads, batch 2.
        assert_eq!(p.main_grid, [3, 2, 2]);
        assert_eq!(p.row_grid, [128 / ROWS_PER_CTA, 8, 2]);
        assert_eq!(p.heads_grid, [8, 1, 1]);
        assert_eq!((p.dq_slices, p.aux_total, p.aux_slices), (1, 8 * 32, 0));
        let rows = 2 * 8 * 128 * 4;
        assert_eq!(p.ws_offsets, [0, rows, 2 * rows, 2 * rows + 2 * 8 * 128 * 64 * 4]);
        for name in ["do", "do_stride_row", "dk_stride_head", "dsinks", "aux_grad_bias", "deterministic"] {
            assert!(p.args.iter().any(|a| a.0 == name), "no argument {name}");
        }
        // The forward-shaped part: the LSE is read whatever the spec writes.
        assert!(p.fwd.arg("lse").is_some_and(|a| a != ArgValue::Ptr(0)));
    }

    #[test]
    fn deterministic_mode_sizes_slices_per_column_and_warp() {
        let s = spec();
        let mut d = descs(&mut Alloc(1 << 32));
        d.deterministic = true;
        let p = plan_backward(&s, &SHAPE, SMS, 0, &d).expect("valid");
        // About 4 waves of 132 slots over 2 x 2 (y x batch) CTAs, capped by the key tiles.
        assert_eq!(p.main_grid[0], 3);
        assert_eq!(p.dq_slices, 3);
        assert_eq!(p.aux_slices, 3 * 2 * 2 * 16, "one slice per (CTA, warp)");
        assert_eq!(p.ws_bytes, p.ws_offsets[3] + p.aux_slices as usize * p.aux_total * 4);
    }

    /// A CTA-pair kernel (blackwell at head dim 128): two CTAs per KV head along y, key
    /// tiles of the pair's keys, and ordered turns only where both CTAs of every key tile
    /// fit the resident slots.
    #[test]
    fn a_pair_kernel_doubles_the_grid_rows_and_counts_both_ctas_for_ordered_turns() {
        let mut s = spec();
        s.aux.clear();
        let mut d = descs(&mut Alloc(1 << 32));
        d.fwd.aux.clear();
        d.aux_grads.clear();
        let pair = BackwardShape { block_m: 128, block_n: 256, ordered_dq: true, pair: true, ..SHAPE };
        let p = plan_backward(&s, &pair, SMS, 0, &d).expect("valid");
        let single =
            plan_backward(&s, &BackwardShape { block_n: 128, pair: false, ..pair }, SMS, 0, &d).expect("valid");
        assert_eq!(single.main_grid[1] * 2, p.main_grid[1], "two CTAs per KV head");
        assert_eq!(p.main_grid[0], single.main_grid[0].div_ceil(2), "key tiles of 256 keys");
        d.deterministic = true;
        let p = plan_backward(&s, &pair, SMS, 0, &d).expect("valid");
        assert_eq!(p.dq_accumulation, DqAccumulation::Ordered);
        // 2 key tiles = 4 CTAs per KV head do not fit 3 resident slots.
        let p = plan_backward(&s, &pair, 3, 0, &d).expect("valid");
        assert_eq!(p.dq_accumulation, DqAccumulation::Slices);
        let reason = p.dq_accumulation_reason.as_deref().unwrap_or_default();
        assert!(reason.contains("2 key tiles per KV head (4 CTAs)"), "{reason}");
    }

    #[test]
    fn deterministic_mode_takes_ordered_turns_where_the_kernel_has_them_and_they_fit() {
        let mut s = spec();
        s.aux.clear();
        let mut d = descs(&mut Alloc(1 << 32));
        d.fwd.aux.clear();
        d.aux_grads.clear();
        d.deterministic = true;
        let ordered = BackwardShape { ordered_dq: true, ..SHAPE };
        let p = plan_backward(&s, &ordered, SMS, 0, &d).expect("valid");
        assert_eq!(p.dq_accumulation, DqAccumulation::Ordered);
        assert_eq!(p.dq_accumulation_reason, None);
        // The default grid, one dq_accum, a zeroed u32 flag per (batch, head, 64 rows).
        assert_eq!((p.main_grid, p.dq_slices), ([3, 2, 2], 1));
        assert_eq!(p.turn_flags.1, 2 * 8 * (128 / 64));
        assert!(p.turn_flags.0 >= p.ws_offsets[3] && p.turn_flags.0 % 256 == 0);
        // The plan: a row of 3 key tiles (padded to 4 words) per (batch, head, 64 rows).
        assert_eq!(p.turn_plan.1, 2 * 8 * (128 / 64) * 4);
        assert_eq!(p.turn_plan.0, p.turn_flags.0 + 256);
        assert_eq!(p.ws_bytes, p.turn_plan.0 + 4 * p.turn_plan.1);
        assert_eq!(p.turn_grid, [2, 8, 2], "70 query rows in 64-row tiles, q heads, batch");
        assert_eq!(p.fwd.arg("deterministic"), None, "a backward argument");
        assert!(p.args.iter().any(|(n, a)| n == "deterministic" && *a == ArgValue::I32(DqAccumulation::Ordered.arg())));

        // Three key tiles that do not fit two resident CTAs (two usable SMs, as an MPS
        // client limited to a share of the GPU sees them): slices, with the reason.
        let p = plan_backward(&s, &ordered, 2, 0, &d).expect("valid");
        assert_eq!(p.dq_accumulation, DqAccumulation::Slices);
        let reason = p.dq_accumulation_reason.as_deref().unwrap_or_default();
        assert!(reason.contains("3 key tiles") && reason.contains("2 usable SMs"), "{reason}");
        assert_eq!((p.turn_flags.1, p.turn_plan.1, p.turn_grid), (0, 0, [0, 0, 0]));
        // A kernel without the ordered mode: slices.
        let p = plan_backward(&s, &SHAPE, SMS, 0, &d).expect("valid");
        assert_eq!(p.dq_accumulation, DqAccumulation::Slices);
        // Not deterministic: atomics, no flags.
        d.deterministic = false;
        let p = plan_backward(&s, &ordered, SMS, 0, &d).expect("valid");
        assert_eq!((p.dq_accumulation, p.turn_flags.1), (DqAccumulation::Atomic, 0));
    }

    #[test]
    fn every_gradient_argument_is_checked() {
        let s = spec();
        let mut a = Alloc(1 << 32);
        let mut d = descs(&mut a);
        d.fwd.lse = None;
        assert!(matches!(err(&s, &d), ValidationError::Missing { ref arg, .. } if arg == "lse"));

        let mut d = descs(&mut a);
        d.dq = a.t(ElemType::Bf16, &[2, 71, 8, 64]);
        assert!(matches!(err(&s, &d), ValidationError::Dim { ref arg, .. } if arg == "dq"));

        let mut d = descs(&mut a);
        d.dk = a.t(ElemType::F16, &[2, 300, 2, 64]);
        assert!(matches!(err(&s, &d), ValidationError::DType { ref arg, .. } if arg == "dk"));

        let mut d = descs(&mut a);
        d.d_out = a.t(ElemType::Bf16, &[2, 70, 8]);
        assert!(matches!(err(&s, &d), ValidationError::Rank { ref arg, .. } if arg == "do"));

        let mut d = descs(&mut a);
        d.dsinks = None;
        assert!(matches!(err(&s, &d), ValidationError::Missing { ref arg, .. } if arg == "dsinks"));

        let mut d = descs(&mut a);
        d.aux_grads.clear();
        assert!(matches!(err(&s, &d), ValidationError::Aux { ref name, .. } if name == "bias"));

        let mut d = descs(&mut a);
        d.aux_grads[0].1 = a.t(ElemType::F32, &[8, 31]);
        assert!(matches!(err(&s, &d), ValidationError::Dim { .. }));

        let mut d = descs(&mut a);
        d.aux_grads.push(("nope".into(), a.t(ElemType::F32, &[8, 32])));
        assert!(matches!(err(&s, &d), ValidationError::Aux { ref name, .. } if name == "nope"));

        // Outputs alias neither inputs nor each other.
        let mut d = descs(&mut a);
        d.dq = d.fwd.q.clone();
        assert!(matches!(err(&s, &d), ValidationError::Overlap { .. }));
        let mut d = descs(&mut a);
        d.dv = d.dk.clone();
        assert!(matches!(err(&s, &d), ValidationError::Overlap { .. }));
    }

    #[test]
    fn a_spec_without_learnable_aux_refuses_gradients_for_its_aux() {
        let mut s = spec();
        s.aux[0].learnable = false;
        let d = descs(&mut Alloc(1 << 32));
        match err(&s, &d) {
            ValidationError::Aux { detail, .. } => assert!(detail.contains("not learnable"), "{detail}"),
            e => panic!("{e}"),
        }
    }

    #[test]
    fn varlen_rows_come_from_cu_seqlens() {
        let mut s = spec();
        s.kv_layout = KvLayout::Varlen;
        let mut a = Alloc(1 << 32);
        let idx = |a: &mut Alloc, v: &'static [i32]| HostIndex { desc: a.t(ElemType::I32, &[v.len()]), values: v };
        let bf = ElemType::Bf16;
        let mut d = descs(&mut a);
        d.fwd.q = a.t(bf, &[45, 8, 64]);
        d.fwd.o = a.t(bf, &[45, 8, 64]);
        d.d_out = a.t(bf, &[45, 8, 64]);
        d.dq = a.t(bf, &[45, 8, 64]);
        for t in [&mut d.fwd.k, &mut d.fwd.v, &mut d.dk, &mut d.dv] {
            *t = a.t(bf, &[130, 2, 64]);
        }
        d.fwd.lse = Some(a.t(ElemType::F32, &[8, 45]));
        d.fwd.aux = vec![("bias".into(), a.t(ElemType::F32, &[8, 32]))];
        d.fwd.cu_seqlens_q = Some(idx(&mut a, &[0, 5, 45]));
        d.fwd.cu_seqlens_k = Some(idx(&mut a, &[0, 100, 130]));
        let p = plan_backward(&s, &SHAPE, SMS, 0, &d).expect("valid varlen");
        assert_eq!((p.fwd.batch, p.fwd.max_seqlen_q, p.fwd.max_seqlen_k), (2, 40, 100));
        assert_eq!(p.main_grid, [1, 2, 2]);
        assert!(p.args.contains(&("dq_stride_batch".into(), ArgValue::I64(0))));
    }

    /// The TMA backwards — hopper on sm_90a and blackwell on sm_100a (a spec without
    /// learnable aux tensors): the main kernel's four tensor maps plan over the launch's Q,
    /// K, V and dO, and every kernel marshals with them (a B200 run launches blackwell's
    /// through this same path).
    #[test]
    fn the_tma_backwards_plan_their_tensor_maps_and_marshal() {
        use attnc_lower::{Arch, FamilyChoice, FamilyKind};
        // Hopper trains learnable aux tensors at d64 (this spec's head dim); blackwell
        // refuses them.
        for (arch, family, aux) in
            [(Arch::Sm90a, FamilyKind::Hopper, true), (Arch::Sm100a, FamilyKind::Blackwell, false)]
        {
            let mut s = spec();
            if !aux {
                s.aux.clear();
            }
            let opts = attnc_lower::CompileOptions::new(arch)
                .direction(Direction::Backward)
                .family(FamilyChoice::Exactly(family));
            let m = attnc_lower::compile(&s, &opts).unwrap_or_else(|e| panic!("{family}: {e}"));
            assert_eq!(m.family, family);
            let main = m.kernel(KernelRole::BackwardMain).expect("main");
            let tensors: Vec<&str> = main.tensor_maps.iter().map(|b| b.tensor.as_str()).collect();
            assert_eq!(tensors, ["q", "k", "v", "do"]);
            let shape = BackwardShape::of(&KernelMeta::from(main), 1).expect("a key-tile grid");
            let mut d = descs(&mut Alloc(1 << 32));
            if !aux {
                d.fwd.aux.clear();
                d.aux_grads.clear();
            }
            let p = plan_backward(&s, &shape, SMS, 0, &d).expect("valid");
            let maps = crate::tma::plan_tensor_maps_over(&main.tensor_maps, |t| match t {
                "q" => Some(&d.fwd.q),
                "k" => Some(&d.fwd.k),
                "v" => Some(&d.fwd.v),
                "do" => Some(&d.d_out),
                _ => None,
            })
            .expect("encodable");
            assert_eq!(maps[3].global_address, d.d_out.addr);
            let mut extra: Vec<(&str, ArgValue)> =
                ["dpsum", "lse_log2", "dq_accum", "aux_grad_ws", "dq_order", "turn_plan"]
                    .into_iter()
                    .map(|n| (n, ArgValue::Ptr(1 << 40)))
                    .collect();
            extra.extend(p.args.iter().map(|(n, a)| (n.as_str(), *a)));
            for e in &maps {
                extra.push((e.param.as_str(), ArgValue::TensorMap(crate::tma::TensorMapArg([0; 16]))));
            }
            for k in &m.kernels {
                let args = marshal(&k.params, &p.fwd, &extra).unwrap_or_else(|e| panic!("{}: {e}", k.name));
                assert_eq!(args.len(), k.params.len());
            }
            // A map over a tensor the launch does not have is an ABI error, not a panic.
            let bad = [attnc_lower::TmaBox { tensor: "dk".into(), ..main.tensor_maps[0].clone() }];
            assert!(matches!(crate::tma::plan_tensor_maps_over(&bad, |_| None), Err(RuntimeError::Abi(_))));
        }
    }

    /// The real backward module of the portable family marshals completely from a plan:
    /// every kernel's parameter list is filled (the ABI and the runtime agree).
    #[test]
    fn every_backward_kernel_marshals() {
        let s = spec();
        let opts = attnc_lower::CompileOptions::new(attnc_lower::Arch::Sm90a)
            .direction(Direction::Backward)
            .family(attnc_lower::FamilyChoice::Exactly(attnc_lower::FamilyKind::Portable));
        let m = attnc_lower::compile(&s, &opts).expect("compiles");
        assert_eq!(m.family, attnc_lower::FamilyKind::Portable);
        let roles: Vec<KernelRole> = m.kernels.iter().map(|k| k.role).collect();
        for r in [
            KernelRole::BackwardPreprocess,
            KernelRole::BackwardMain,
            KernelRole::DqConvert,
            KernelRole::SinkGrad,
            KernelRole::AuxGradReduce,
        ] {
            assert!(roles.contains(&r), "no {r} kernel in {roles:?}");
        }
        let main = m.kernel(KernelRole::BackwardMain).expect("main");
        let shape = BackwardShape::of(&KernelMeta::from(main), 1).expect("a key-tile grid");
        let d = descs(&mut Alloc(1 << 32));
        let p = plan_backward(&s, &shape, SMS, 0, &d).expect("valid");
        let mut extra: Vec<(&str, ArgValue)> =
            ["dpsum", "lse_log2", "dq_accum", "aux_grad_ws", "dq_order", "turn_plan"]
                .into_iter()
                .map(|n| (n, ArgValue::Ptr(1 << 40)))
                .collect();
        extra.extend(p.args.iter().map(|(n, a)| (n.as_str(), *a)));
        for k in &m.kernels {
            let args = marshal(&k.params, &p.fwd, &extra).unwrap_or_else(|e| panic!("{}: {e}", k.name));
            assert_eq!(args.len(), k.params.len());
        }
    }
}
