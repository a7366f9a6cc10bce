"""attnc: attention kernels compiled from `.attn` files.

    import torch, attnc
    attn = attnc.load("dsl-examples/document_mask.attn")    # or attnc.compile(text)
    o = attn(q, k, v, aux={"doc": doc_ids})                  # torch tensors, current stream
    o.sum().backward()                                       # attnc's backward
    attn.receipt()                                           # which kernel ran, and why

Calls with torch tensors go through the custom op ``torch.ops.attnc.forward`` (autograd,
``torch.compile`` without graph breaks); other CUDA arrays (CuPy, JAX via DLPack) run the
forward directly with :meth:`Attention.forward_into`.
"""

import hashlib
import json
import os

from . import _attnc, _registry
from ._tensors import describe, describe_index, is_torch
from .errors import AttncSyntaxError

__all__ = ["Attention", "AttncSyntaxError", "load", "compile", "cache_info", "driver_present"]
__version__ = _attnc.__version__


def load(path, family="auto", ready_first=False):
    """The variant of a `.attn` file. ``ready_first``: see :class:`Attention`."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    return Attention(_attnc.parse(text, os.fspath(path)), family, ready_first)


def compile(source, name="<string>", family="auto", ready_first=False):  # noqa: A001 (the verb users expect)
    """The variant of `.attn` source text; errors name ``name`` as the file. ``ready_first``:
    see :class:`Attention`."""
    return Attention(_attnc.parse(source, name), family, ready_first)


def cache_info(device=0):
    """The kernel cache of ``device``: hits, builds, the disk directory."""
    return _attnc.cache_info(device)


def driver_present():
    """Is a CUDA driver loadable on this machine?"""
    return _attnc.driver_present()


class Attention:
    """One attention variant: callable on tensors, compiled per device on first use.

    ``ready_first`` (with ``family="auto"``): when the kernel the dispatcher picks is in
    neither cache, the first calls run on a portable kernel, which compiles in a fraction
    of the time, while that kernel compiles on a thread; calls switch to it once it is
    loaded. Receipts name the interim kernel; ``kernel(device).wait_ready()`` blocks until
    the switch."""

    def __init__(self, variant, family="auto", ready_first=False):
        self._variant = variant
        self._family = family
        self._ready_first = bool(ready_first)
        self.spec = json.loads(variant.spec_json())
        self.name = variant.name
        self.layout = _attnc.kv_layout(variant)
        self.head_dim_v = self.spec["head_dim_v"]
        # Read on every call: kept as plain attributes.
        self._params = tuple((p["name"], p["ty"]) for p in self.spec["params"])
        self._aux = tuple((a["name"], a.get("elem", "Int"), a.get("learnable", False)) for a in self.spec["aux"])
        self.writes_lse = bool(self.spec["lse"])
        self._kernels = {}
        # Registered with the torch op layer under this key (attnc.torch imports lazily).
        self.key = f"{self.name}-{family}-{hashlib.sha1(variant.source().encode()).hexdigest()[:16]}"
        _registry.VARIANTS.setdefault(self.key, self)

    # ---- what the variant is -------------------------------------------------------------
    @property
    def source(self):
        """The canonical `.attn` text."""
        return self._variant.source()

    @property
    def params(self):
        """Declared params: ``((name, "Int" | "Float" | "Bool"), ...)``."""
        return self._params

    @property
    def aux(self):
        """Declared aux tensors, in order: ``((name, "Int" | "Float", learnable), ...)``."""
        return self._aux

    def ptx(self, arch="sm_90a", direction="forward", family=None):
        """PTX for ``arch`` (no GPU needed)."""
        return self._variant.ptx(arch, direction, family or self._family)

    def flex_source(self):
        """PyTorch FlexAttention source of the variant: a module whose
        ``make(seqlen_q, seqlen_k, params, aux)`` returns ``(mask_mod, score_mod)``."""
        return self._variant.flex_source()[0]

    def __repr__(self):
        return f"attnc.Attention({self.name!r}, layout={self.layout}, family={self._family})"

    # ---- running ---------------------------------------------------------------------------
    def kernel(self, device=0):
        """The compiled kernel for CUDA device ``device`` (cached)."""
        k = self._kernels.get(device)
        if k is None:
            k = _attnc.kernel(self._variant, device, self._family, self._ready_first)
            self._kernels[device] = k
        return k

    def __call__(self, q, k, v, *, aux=None, params=None, sinks=None, cu_seqlens_q=None, cu_seqlens_k=None,
                 block_table=None, seqused_k=None, splits=None, deterministic=False, return_lse=False,
                 block_mask=None, positions=None):
        """Attention forward on torch tensors (differentiable) or other CUDA arrays."""
        if type(q) in _TORCH_TYPES or _note_torch(q):
            return (_TORCH_LAYER or _torch_layer()).attention(self, q, k, v, aux, params, sinks, cu_seqlens_q,
                                                              cu_seqlens_k, block_table, seqused_k, splits,
                                                              deterministic, return_lse, block_mask, positions)
        raise TypeError("calling an Attention needs torch tensors; for other arrays use forward_into(q, k, v, out)")

    def block_mask(self, q, k, v, *, aux=None, params=None, sinks=None, cu_seqlens_q=None, cu_seqlens_k=None):
        """The tile classification of a mask over aux tensors, for these shapes, params and aux
        tensors: build it once and pass ``block_mask=`` to every forward that shares them
        (every layer of a model). Without it such a mask is classified on each call. It is
        checked against each launch; its aux tensors' contents must not change."""
        from . import torch as attnc_torch

        return attnc_torch.build_block_mask(self, q, k, v, aux=aux, params=params, sinks=sinks,
                                            cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)

    def forward_into(self, q, k, v, out, *, lse=None, stream=0, aux=None, params=None, sinks=None, splits=None):
        """The forward on any CUDA arrays, written into ``out`` (and ``lse``), on ``stream``."""
        extras = {}
        if params:
            extras["params"] = dict(params)
        if aux:
            extras["aux"] = {n: describe(f"aux `{n}`", t) for n, t in aux.items()}
        if sinks is not None:
            extras["sinks"] = describe("sinks", sinks)
        if splits is not None:
            extras["splits"] = int(splits)
        dev = describe("q", q)[2]
        kern = self.kernel(dev)
        kern.forward(describe("q", q), describe("k", k), describe("v", v), describe("o", out),
                     None if lse is None else describe("lse", lse), int(stream), extras)
        _registry.LAST_KERNEL[self.key] = kern

    def check(self, q, k, v, out, *, lse=None, aux=None, params=None, positions=None, cu_seqlens_q=None,
              cu_seqlens_k=None, device=0):
        """Validates a forward's arguments without a GPU (descriptors only); raises
        ``ValueError`` naming the argument at fault."""
        extras = {}

        def index(arg, t):
            return _desc_any(arg, t), [int(x) for x in t.flatten().tolist()]

        if cu_seqlens_q is not None or cu_seqlens_k is not None:
            extras["cu_seqlens"] = (index("cu_seqlens_q", cu_seqlens_q), index("cu_seqlens_k", cu_seqlens_k))
        if positions is not None:
            from .torch import SequencePositions, _positions

            if isinstance(positions, SequencePositions):
                extras["sequence_positions"] = (index("sequence_positions", positions.table), bool(positions.sinks))
            else:
                extras["positions"] = _positions(positions)
        if params:
            extras["params"] = dict(params)
        if aux:
            extras["aux"] = {n: _desc_any(f"aux `{n}`", t) for n, t in aux.items()}
        self._variant.check_forward(_desc_any("q", q), _desc_any("k", k), _desc_any("v", v), _desc_any("o", out),
                                    None if lse is None else _desc_any("lse", lse), extras, device)

    def receipt(self):
        """The last launch's receipt (dict: family, fallback reason, config, grid, splits)."""
        last = _registry.LAST_KERNEL.get(self.key)
        if last is None:
            return None
        text = last.receipt_json()
        return None if text is None else json.loads(text)

    def receipt_text(self):
        """The last launch's receipt as attnc prints it."""
        last = _registry.LAST_KERNEL.get(self.key)
        return None if last is None else last.receipt_text()


def _torch_layer():
    """attnc.torch, imported on the first torch call (attnc itself does not need torch)."""
    global _TORCH_LAYER
    if _TORCH_LAYER is None:
        from . import torch as attnc_torch

        _TORCH_LAYER = attnc_torch
    return _TORCH_LAYER


_TORCH_LAYER = None
# The torch tensor types seen so far: one set lookup per call instead of `is_torch`.
_TORCH_TYPES = set()


def _note_torch(t):
    if is_torch(t):
        _TORCH_TYPES.add(type(t))
        return True
    return False


_FAKE_SLOTS = {}


def _desc_any(arg, t):
    """A descriptor of a tensor on any device, for host-side validation: a CPU or meta
    tensor is described as if it were on the GPU at a 256-byte aligned address."""
    if isinstance(t, tuple):
        return t
    if is_torch(t) and not t.is_cuda:
        from ._tensors import _torch_dtypes

        dtype = _torch_dtypes().get(t.dtype)
        if dtype is None:
            raise ValueError(f"{arg}: dtype {t.dtype} is not supported (bfloat16, float16, float32 or int32)")
        # A 4 GiB range of its own per argument name (a hash could give two arguments the
        # same range, and then the check reports them overlapping).
        slot = _FAKE_SLOTS.setdefault(arg, len(_FAKE_SLOTS))
        base = 0x7F00_0000_0000 + (slot % 4096) * (1 << 32)
        return (base + t.storage_offset() * t.element_size(), dtype, 0, -1, *t.shape, *t.stride())
    return describe(arg, t)
