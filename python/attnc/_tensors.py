"""Tensor descriptors for the Rust side, one flat tuple of ints:
``(data_ptr, dtype_code, device, capacity, *shape, *strides)`` (strides in elements;
capacity -1 for a framework tensor, whose view lies inside its storage).

No data is copied. Torch tensors take a fast path; anything else with
``__cuda_array_interface__`` (CuPy, Numba) or ``__dlpack__`` (JAX, through torch's DLPack
import) works too.
"""

_TORCH_DTYPES = None


def _torch_dtypes():
    global _TORCH_DTYPES
    if _TORCH_DTYPES is None:
        import torch

        _TORCH_DTYPES = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2, torch.int32: 3}
    return _TORCH_DTYPES


_CAI_DTYPES = {"<f2": 1, "<f4": 2, "<i4": 3, "<V2": 0}


def is_torch(t):
    return type(t).__module__.startswith("torch")


def describe(arg, t):
    """The descriptor of tensor ``t`` passed as argument ``arg`` (named in errors)."""
    if is_torch(t):
        return describe_torch(arg, t)
    cai = getattr(t, "__cuda_array_interface__", None)
    if cai is not None:
        return _describe_cai(arg, t, cai)
    if hasattr(t, "__dlpack__"):
        import torch.utils.dlpack

        return describe_torch(arg, torch.utils.dlpack.from_dlpack(t))
    raise ValueError(f"{arg}: expected a CUDA tensor (torch, or any __cuda_array_interface__ / DLPack array), found {type(t).__name__}")


def describe_torch(arg, t):
    device = t.get_device()  # -1 on the CPU; cheaper than t.device.index
    if device < 0 or not t.is_cuda:
        raise ValueError(f"{arg}: must be a CUDA tensor, found device {t.device}")
    dtype = (_TORCH_DTYPES or _torch_dtypes()).get(t.dtype)
    if dtype is None:
        raise ValueError(f"{arg}: dtype {t.dtype} is not supported (bfloat16, float16, float32 or int32)")
    return (t.data_ptr(), dtype, device, -1, *t.shape, *t.stride())


def _describe_cai(arg, t, cai):
    typestr = cai["typestr"]
    dtype = _CAI_DTYPES.get(typestr)
    if dtype is None:
        raise ValueError(f"{arg}: array type {typestr} is not supported")
    shape = tuple(cai["shape"])
    item = int(typestr[2:])
    strides = cai.get("strides")
    if strides is None:
        strides, acc = [], 1
        for n in reversed(shape):
            strides.append(acc)
            acc *= n
        strides = tuple(reversed(strides))
    else:
        if any(s < 0 or s % item for s in strides):
            raise ValueError(f"{arg}: strides {strides} (bytes) must be non-negative multiples of {item}")
        strides = tuple(s // item for s in strides)
    ptr = cai["data"][0]
    device = getattr(getattr(t, "device", None), "id", 0)
    return (ptr, dtype, int(device), -1, *shape, *strides)


def describe_index(arg, t, device):
    """An i32 index tensor (cu_seqlens, block tables): its descriptor and host values.

    A CPU tensor (or list) is copied to ``device`` (no host sync); a CUDA tensor is read
    back once (one device-to-host copy that waits for the stream).
    """
    import torch

    if not isinstance(t, torch.Tensor):
        t = torch.as_tensor(t, dtype=torch.int32)
    if t.dtype != torch.int32:
        raise ValueError(f"{arg}: dtype {t.dtype}, expected torch.int32")
    t = t.contiguous()
    if t.is_cuda:
        host = t.flatten().tolist()
        dev = t
    else:
        host = t.flatten().tolist()
        dev = t.to(device, non_blocking=True)
    return (describe_torch(arg, dev), host), dev
