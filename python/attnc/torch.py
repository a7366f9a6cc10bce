"""attnc as PyTorch custom ops: ``torch.ops.attnc.forward`` / ``torch.ops.attnc.backward``.

Both are registered with ``torch.library.custom_op`` and a fake (meta) implementation, so
``torch.compile(fullgraph=True)`` traces them without a graph break; autograd is
registered on the forward and runs attnc's backward (dq, dk, dv, dsinks and the
learnable aux tensors' gradients). A variant is named in the ops by its key (its name and
a hash of its canonical source); :func:`attention` registers it on first use.

Kernels run on ``torch.cuda.current_stream()``, on the caller's tensors, outputs from
PyTorch's caching allocator: nothing is copied and nothing waits on the host, except that
CUDA ``cu_seqlens`` / block tables are read back once per call (pass them as CPU int32
tensors to avoid that).
"""

from typing import Optional

import torch

from ._registry import BLOCK_MASKS, LAST_KERNEL, VARIANTS
from ._tensors import describe_index


def _variant(key):
    attn = VARIANTS.get(key)
    if attn is None:
        raise RuntimeError(f"attnc: variant {key} is not registered in this process (call it through attnc first)")
    return attn


def _params(attn, params):
    """Params in declaration order, split by type (the op schema needs fixed types)."""
    if not params and not attn.params:
        return [], []
    params = params or {}
    unknown = set(params) - {n for n, _ in attn.params}
    if unknown:
        raise ValueError(f"param `{sorted(unknown)[0]}`: the variant `{attn.name}` declares no such param")
    ints, floats = [], []
    for name, ty in attn.params:
        if name not in params:
            raise ValueError(f"param `{name}`: missing (the variant `{attn.name}` declares it)")
        if ty == "Int":
            ints.append(int(params[name]))
        else:
            floats.append(float(params[name]))
    return ints, floats


def _aux_list(attn, aux):
    if not aux and not attn.aux:
        return []
    aux = aux or {}
    names = [n for n, _, _ in attn.aux]
    unknown = set(aux) - set(names)
    if unknown:
        raise ValueError(f"aux tensor `{sorted(unknown)[0]}`: the variant `{attn.name}` declares no such aux tensor")
    missing = [n for n in names if n not in aux]
    if missing:
        raise ValueError(f"aux tensor `{missing[0]}`: missing (the variant `{attn.name}` reads it)")
    return [aux[n] for n in names]


def _extras(attn, q, aux, sinks, cu_q, cu_k, block_table, seqused_k, ints, floats, splits, keep, positions=None):
    """The Rust side's `extras` dict (None when there is nothing to pass); `keep` collects
    device copies that must outlive the launch (index tensors go to ``q``'s device)."""
    if not (aux or ints or floats or splits) and sinks is None and cu_q is None and cu_k is None \
            and block_table is None and seqused_k is None and positions is None:
        return None
    x = {}
    device = q.device
    if isinstance(positions, SequencePositions):
        table, t = describe_index("sequence_positions", positions.table, device)
        keep.append(t)
        x["sequence_positions"] = (table, bool(positions.sinks))
    elif positions is not None:
        x["positions"] = _positions(positions)
    values = {}
    it_i, it_f = iter(ints), iter(floats)
    for name, ty in attn.params:
        values[name] = next(it_i) if ty == "Int" else next(it_f)
    if values:
        x["params"] = values
    if aux:
        x["aux"] = {n: t for (n, _, _), t in zip(attn.aux, aux)}
    if sinks is not None:
        x["sinks"] = sinks
    if cu_q is not None or cu_k is not None:
        if cu_q is None or cu_k is None:
            raise ValueError("cu_seqlens_q and cu_seqlens_k go together")
        dq_, tq = describe_index("cu_seqlens_q", cu_q, device)
        dk_, tk = describe_index("cu_seqlens_k", cu_k, device)
        keep += [tq, tk]
        x["cu_seqlens"] = (dq_, dk_)
    if block_table is not None or seqused_k is not None:
        if block_table is None or seqused_k is None:
            raise ValueError("block_table and seqused_k go together")
        db, tb = describe_index("block_table", block_table, device)
        du, tu = describe_index("seqused_k", seqused_k, device)
        keep += [tb, tu]
        x["paged"] = (db, du)
    if splits > 0:
        x["splits"] = splits
    return x


class SequencePositions:
    """A varlen batch of shards: one frame per sequence, an int32 ``[batch, 4]`` tensor
    (``q_offset``, ``k_offset``, global ``seqlen_q``, global ``seqlen_k``; a CPU tensor
    avoids a host sync), and whether these key shards take the variant's sink. Pass it as
    ``positions=`` (eager calls)."""

    def __init__(self, table, sinks=True):
        self.table, self.sinks = table, sinks


def _positions(p):
    """``(q_offset, k_offset, seqlen_q, seqlen_k[, sinks])``: a shard's place in its global
    sequences (masks and score mods see global positions; aux tensors are the global ones)."""
    p = tuple(p)
    if len(p) == 4:
        p = (*p, True)
    if len(p) != 5:
        raise ValueError("positions: expected (q_offset, k_offset, seqlen_q, seqlen_k[, sinks])")
    return (int(p[0]), int(p[1]), int(p[2]), int(p[3]), bool(p[4]))


def _block_mask(key):
    mask = BLOCK_MASKS.get(key)
    if mask is None:
        raise ValueError(f"block_mask: {key} is gone (keep the object returned by block_mask() alive)")
    return mask


def _device(q):
    """The CUDA device of ``q`` (its kernel is that device's); other tensors are refused."""
    device = q.get_device()
    if device < 0:
        raise ValueError(f"q: must be a CUDA tensor, found device {q.device}")
    return device


def _stream(t):
    """The raw handle of the current CUDA stream of ``t``'s device."""
    if _RAW_STREAM is not None:
        return _RAW_STREAM(t.get_device())
    return torch.cuda.current_stream(t.device).cuda_stream


# torch's own C accessor (what its Triton kernels launch with): a tenth of the cost of
# torch.cuda.current_stream(); the public call where it is missing.
_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _out_shapes(attn, q, cu_q):
    # The traced twin of the eager path's allocation in Rust (`output_shapes` in
    # python/src/lib.rs): fake tensors' sizes may be symbolic. Keep the two in step.
    shape = q.shape
    o_shape = (*shape[:-1], attn.head_dim_v)
    if attn.layout == "varlen":
        lse_shape = (q.shape[1], q.shape[0])
    else:
        lse_shape = (q.shape[0], q.shape[2], q.shape[1])
    return o_shape, lse_shape


def _forward_impl(attn, q, k, v, aux, sinks, cu_seqlens_q, cu_seqlens_k, block_table, seqused_k, iparams, fparams,
                  splits, need_lse, block_mask="", positions=None):
    """O (and LSE when ``need_lse``, else None), allocated like ``q``, on the current stream.
    The torch tensors go to the Rust side as they are (it reads their attributes)."""
    keep = []
    extras = _extras(attn, q, aux, sinks, cu_seqlens_q, cu_seqlens_k, block_table, seqused_k, iparams,
                     fparams, splits, keep, positions)
    if block_mask:
        extras = extras or {}
        extras["block_mask"] = _block_mask(block_mask)
    kern = attn.kernel(_device(q))
    o, lse = kern.forward_torch(q, k, v, _stream(q), need_lse, extras)
    LAST_KERNEL[attn.key] = kern
    return o, lse


@torch.library.custom_op("attnc::forward", mutates_args=())
def _forward_op(key: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, aux: list[torch.Tensor],
                sinks: Optional[torch.Tensor], cu_seqlens_q: Optional[torch.Tensor],
                cu_seqlens_k: Optional[torch.Tensor], block_table: Optional[torch.Tensor],
                seqused_k: Optional[torch.Tensor], iparams: list[int], fparams: list[float], splits: int,
                need_lse: bool, deterministic: bool, block_mask: str,
                positions: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    # `deterministic` is the backward's (kept by autograd's context); `block_mask` names a
    # mask of attnc._registry.BLOCK_MASKS ("" for none); `positions` is empty or the 5
    # ints of a shard's place (sinks as 0/1).
    o, lse = _forward_impl(_variant(key), q, k, v, aux, sinks, cu_seqlens_q, cu_seqlens_k, block_table, seqused_k,
                           iparams, fparams, splits, need_lse, block_mask, positions or None)
    return o, (lse if lse is not None else q.new_empty((0,), dtype=torch.float32))


@_forward_op.register_fake
def _forward_fake(key, q, k, v, aux, sinks, cu_seqlens_q, cu_seqlens_k, block_table, seqused_k, iparams, fparams,
                  splits, need_lse, deterministic, block_mask, positions):
    attn = _variant(key)
    o_shape, lse_shape = _out_shapes(attn, q, cu_seqlens_q)
    return q.new_empty(o_shape), q.new_empty(lse_shape if need_lse else (0,), dtype=torch.float32)


def _backward_impl(key, q, k, v, o, lse, d_out, aux, sinks, cu_seqlens_q, cu_seqlens_k, iparams, fparams,
                   deterministic, block_mask="", positions=None):
    attn = _variant(key)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dsinks = q.new_empty((attn.spec["q_heads"],) if sinks is not None else (0,), dtype=torch.float32)
    learn = [a[2] for a in attn.aux]
    aux_grads = [torch.empty_like(t, dtype=torch.float32) if l else t.new_empty((0,), dtype=torch.float32)
                 for t, l in zip(aux, learn)]
    keep = []
    # `_extras` gives None when the forward would pass nothing; the backward always passes
    # at least the determinism flag.
    extras = _extras(attn, q, aux, sinks, cu_seqlens_q, cu_seqlens_k, None, None, iparams, fparams, 0,
                     keep, positions) or {}
    if sinks is not None:
        extras["dsinks"] = dsinks
    grads = {n: g for (n, _, l), g in zip(attn.aux, aux_grads) if l}
    if grads:
        extras["aux_grads"] = grads
    extras["deterministic"] = bool(deterministic)
    if block_mask:
        # The forward's mask: its backward classes are built by the first backward and kept.
        extras["block_mask"] = _block_mask(block_mask)
    kern = attn.kernel(_device(q))
    kern.backward(q, k, v, o, lse, d_out, dq, dk, dv, _stream(q), extras)
    LAST_KERNEL[attn.key] = kern
    return dq, dk, dv, dsinks, aux_grads


@torch.library.custom_op("attnc::backward", mutates_args=())
def _backward_op(key: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                 d_out: torch.Tensor, aux: list[torch.Tensor], sinks: Optional[torch.Tensor],
                 cu_seqlens_q: Optional[torch.Tensor], cu_seqlens_k: Optional[torch.Tensor], iparams: list[int],
                 fparams: list[float], deterministic: bool, block_mask: str, positions: list[int]) -> tuple[
                     torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    return _backward_impl(key, q, k, v, o, lse, d_out, aux, sinks, cu_seqlens_q, cu_seqlens_k, iparams, fparams,
                          deterministic, block_mask, positions or None)


@_backward_op.register_fake
def _backward_fake(key, q, k, v, o, lse, d_out, aux, sinks, cu_seqlens_q, cu_seqlens_k, iparams, fparams,
                   deterministic, block_mask, positions):
    attn = _variant(key)
    dsinks = q.new_empty((attn.spec["q_heads"],) if sinks is not None else (0,), dtype=torch.float32)
    learn = [a[2] for a in attn.aux]
    aux_grads = [torch.empty_like(t, dtype=torch.float32) if l else t.new_empty((0,), dtype=torch.float32)
                 for t, l in zip(aux, learn)]
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dsinks, aux_grads


def _setup_context(ctx, inputs, output):
    (key, q, k, v, aux, sinks, cu_q, cu_k, block_table, seqused_k, iparams, fparams, splits, need_lse,
     deterministic, block_mask, positions) = inputs
    o, lse = output
    if not need_lse:
        # Only reached when a caller asked for no LSE yet needs gradients: attention()
        # always asks for it when any input requires grad.
        raise RuntimeError("attnc: the forward ran without LSE; it cannot be differentiated")
    ctx.key = key
    ctx.iparams, ctx.fparams = list(iparams), list(fparams)
    ctx.n_aux = len(aux)
    ctx.has_sinks = sinks is not None
    ctx.deterministic = bool(deterministic)
    _keep_block_mask(ctx, block_mask)
    ctx.positions = list(positions)
    ctx.save_for_backward(q, k, v, o, lse, sinks, cu_q, cu_k, *aux)


def _keep_block_mask(ctx, key):
    """The forward's block mask for the backward: its key, and the object itself, so the
    registry's weak entry lives until the backward ran."""
    ctx.block_mask = key
    ctx.block_mask_obj = BLOCK_MASKS.get(key) if key else None


def _backward(ctx, d_out, d_lse):
    q, k, v, o, lse, sinks, cu_q, cu_k, *aux = ctx.saved_tensors
    attn = _variant(ctx.key)
    dq, dk, dv, dsinks, aux_grads = torch.ops.attnc.backward(
        ctx.key, q, k, v, o, lse, d_out.contiguous(), list(aux), sinks, cu_q, cu_k, ctx.iparams, ctx.fparams,
        ctx.deterministic, ctx.block_mask, ctx.positions)
    aux_out = [g if learn else None for g, (_, _, learn) in zip(aux_grads, attn.aux)]
    # One gradient per forward input, lists as lists: key, q, k, v, aux, sinks, cu_seqlens_q,
    # cu_seqlens_k, block_table, seqused_k, iparams, fparams, splits, need_lse, deterministic,
    # block_mask, positions.
    return (None, dq, dk, dv, aux_out, dsinks if ctx.has_sinks else None, None, None, None, None,
            _no_grads(ctx.iparams), _no_grads(ctx.fparams), None, None, None, None, _no_grads(ctx.positions))


def _no_grads(values):
    """The backward's entry for a list-of-numbers input: autograd takes a non-empty one as
    a single leaf (None) and an empty one as an empty list."""
    return None if values else []


torch.library.register_autograd("attnc::forward", _backward, setup_context=_setup_context)


class _EagerAttention(torch.autograd.Function):
    """Eager autograd without the custom-op dispatcher (whose Python wrapper costs tens of
    microseconds a call): the same forward and backward implementations as the ops."""

    @staticmethod
    def forward(ctx, key, q, k, v, sinks, cu_q, cu_k, iparams, fparams, deterministic, block_mask, positions, *aux):
        o, lse = _forward_impl(_variant(key), q, k, v, list(aux), sinks, cu_q, cu_k, None, None, iparams, fparams, 0,
                               True, block_mask, positions)
        ctx.key, ctx.iparams, ctx.fparams, ctx.deterministic = key, iparams, fparams, deterministic
        ctx.positions = positions
        ctx.has_sinks = sinks is not None
        _keep_block_mask(ctx, block_mask)
        ctx.save_for_backward(q, k, v, o, lse, sinks, cu_q, cu_k, *aux)
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, d_out, d_lse):
        q, k, v, o, lse, sinks, cu_q, cu_k, *aux = ctx.saved_tensors
        attn = _variant(ctx.key)
        dq, dk, dv, dsinks, aux_grads = _backward_impl(ctx.key, q, k, v, o, lse, d_out.contiguous(), list(aux), sinks,
                                                       cu_q, cu_k, ctx.iparams, ctx.fparams, ctx.deterministic,
                                                       ctx.block_mask, ctx.positions)
        aux_out = [g if learn else None for g, (_, _, learn) in zip(aux_grads, attn.aux)]
        return (None, dq, dk, dv, dsinks if ctx.has_sinks else None, None, None, None, None, None, None, None,
                *aux_out)


def attention(attn, q, k, v, aux=None, params=None, sinks=None, cu_seqlens_q=None, cu_seqlens_k=None,
              block_table=None, seqused_k=None, splits=None, deterministic=False, return_lse=False,
              block_mask=None, positions=None):
    """``attn``'s forward on torch tensors: through ``torch.ops.attnc.forward`` under
    ``torch.compile`` / export, directly (same implementation, less dispatch) in eager mode.
    ``positions``: these tensors are a shard of longer sequences (see attnc.cp).

    Every call pays this function's host time (a 1-token decode is nothing else): the
    common case — no params, aux tensors, sinks or positions — reads nothing it does not need."""
    ints, floats = _params(attn, params) if params or attn.params else _NO_PARAMS
    aux_list = _aux_list(attn, aux) if aux or attn.aux else _NO_AUX
    need_grad = _grad_enabled() and (
        q.requires_grad or k.requires_grad or v.requires_grad or (sinks is not None and sinks.requires_grad)
        or (aux_list and any(t.requires_grad for t in aux_list)))
    # A variant that declares `lse` always writes it.
    need_lse = need_grad or return_lse or attn.writes_lse
    mask_key = "" if block_mask is None else block_mask_key(block_mask)
    traced = _is_compiling() or (type(q) is not _Tensor and _tracing(q))
    if positions is not None:
        if isinstance(positions, SequencePositions):
            if traced:
                raise NotImplementedError("per-sequence positions are not traced yet: call it eagerly")
        else:
            positions = _positions(positions)
    if traced:
        o, lse = torch.ops.attnc.forward(attn.key, q, k, v, list(aux_list), sinks, cu_seqlens_q, cu_seqlens_k,
                                         block_table, seqused_k, list(ints), list(floats), int(splits or 0),
                                         bool(need_lse),
                                         bool(deterministic), mask_key,
                                         [int(x) for x in positions] if positions is not None else [])
    elif need_grad and block_table is None and not splits:
        o, lse = _EagerAttention.apply(attn.key, q, k, v, sinks, cu_seqlens_q, cu_seqlens_k, ints, floats,
                                       bool(deterministic), mask_key, positions, *aux_list)
    else:
        o, lse = _forward_impl(attn, q, k, v, aux_list, sinks, cu_seqlens_q, cu_seqlens_k, block_table, seqused_k,
                               ints, floats, int(splits or 0), bool(need_lse), mask_key, positions)
    return (o, lse) if return_lse else o


_NO_PARAMS = ((), ())
_NO_AUX = ()
_Tensor = torch.Tensor
_grad_enabled = torch.is_grad_enabled
_is_compiling = torch.compiler.is_compiling


def block_mask_key(mask):
    """The registry key of a block mask (registering it)."""
    key = f"bm{id(mask):x}"
    BLOCK_MASKS[key] = mask
    return key


def build_block_mask(attn, q, k, v, *, aux=None, params=None, sinks=None, cu_seqlens_q=None, cu_seqlens_k=None):
    """``attn``'s tile classification for these arguments (see Attention.block_mask)."""
    ints, floats = _params(attn, params)
    aux_list = _aux_list(attn, aux)
    keep = []
    extras = _extras(attn, q, aux_list, sinks, cu_seqlens_q, cu_seqlens_k, None, None, ints, floats, 0, keep)
    o_shape, _ = _out_shapes(attn, q, cu_seqlens_q)
    o = q.new_empty(o_shape)
    kern = attn.kernel(_device(q))
    return kern.block_mask(q, k, v, o, _stream(q), extras)


def _tracing(t):
    """A fake or functional tensor (make_fx, export, a fake mode): the op must be recorded."""
    return type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter)
