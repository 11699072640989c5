"""Argument checks shared by every rung: one place that turns bad input into a clear exception."""

from __future__ import annotations

import torch

from ._rungs import ALL_DTYPES

# Kernels index with 64-bit arithmetic, but grid dimensions and tile counts are
# 32-bit: reject sizes no GPU could hold rather than overflow silently.
MAX_DIM = 2**31 - 1
_ALL_DTYPE_SET = frozenset(ALL_DTYPES)


def _dtype_names(dtypes) -> str:
    return ", ".join(str(d).removeprefix("torch.") for d in dtypes)


def check_tensor(t, name: str, ndim: int | tuple[int, ...]) -> None:
    """t is a tensor with ndim dims (or one of the ndim tuple's), a supported dtype
    and sizes a kernel can index. matmul calls this for each operand on every
    call, so the passing path builds no strings."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    dims = (ndim,) if isinstance(ndim, int) else ndim
    if t.dim() not in dims:
        want = " or ".join(f"{d}-D" for d in dims)
        raise ValueError(f"{name} must be {want}, got a {t.dim()}-D tensor of shape {tuple(t.shape)}")
    if t.dtype not in _ALL_DTYPE_SET:
        raise TypeError(f"{name} has dtype {t.dtype}; supported dtypes are {_dtype_names(ALL_DTYPES)}")
    if max(t.shape, default=0) > MAX_DIM:
        d, size = next((d, size) for d, size in enumerate(t.shape) if size > MAX_DIM)
        raise ValueError(f"{name} has size {size} in dim {d}; at most {MAX_DIM} is supported")


def check_same_dtype(named: dict[str, torch.Tensor]) -> torch.dtype:
    dtypes = {name: t.dtype for name, t in named.items()}
    first = next(iter(dtypes.values()))
    if any(d != first for d in dtypes.values()):
        listing = ", ".join(f"{n} is {d}" for n, d in dtypes.items())
        raise TypeError(f"mixed dtypes are not supported: {listing}")
    return first


def _span(t: torch.Tensor) -> tuple[int, int]:
    """Byte range [start, end) that a tensor's elements occupy."""
    if t.numel() == 0:
        return (0, 0)
    start = t.data_ptr()
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()) if size > 0)
    lo = start + min(0, last) * t.element_size()
    hi = start + (max(0, last) + 1) * t.element_size()
    return (lo, hi)


def overlaps(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Whether two tensors may share memory (conservative: byte ranges intersect)."""
    if x.numel() == 0 or y.numel() == 0 or x.device != y.device:
        return False
    (a0, a1), (b0, b1) = _span(x), _span(y)
    return a0 < b1 and b0 < a1


def has_internal_overlap(t: torch.Tensor) -> bool:
    """Whether two elements of t may share an address (e.g. an expanded tensor).

    Conservative: a layout whose dims interleave without colliding (rare, only
    from as_strided) also counts as overlapping and is rejected as an ``out``.
    """
    if t.numel() == 0 or t.is_contiguous():
        return False
    dims = sorted((abs(st), sz) for sz, st in zip(t.shape, t.stride()) if sz > 1)
    reach = 0  # largest offset reachable with the dims seen so far
    for stride, size in dims:
        if stride <= reach:
            return True
        reach += stride * (size - 1)
    return False


def check_out(out, shape: tuple[int, int], dtype: torch.dtype, inputs: dict) -> None:
    """out's shape, dtype and memory; its device is checked with the inputs' by check_cuda."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
    if tuple(out.shape) != shape:
        raise ValueError(f"out has shape {tuple(out.shape)}, expected {shape}")
    if out.dtype != dtype:
        raise TypeError(f"out has dtype {out.dtype}, expected {dtype} (the dtype of the inputs)")
    if has_internal_overlap(out):
        raise ValueError(f"out has overlapping elements (strides {tuple(out.stride())}); it cannot be written")
    for name, t in inputs.items():
        if t is not None and overlaps(out, t):
            raise ValueError(f"out overlaps {name} in memory; pass an out that shares no memory with the inputs")


def check_cuda(named: dict[str, torch.Tensor]) -> torch.device:
    """All tensors on one CUDA device; the error says what is wrong and where.

    CUDA tensors prove a device is present, so the (slower) availability query
    runs only to explain a non-CUDA tensor.
    """
    for name, t in named.items():
        if t.device.type != "cuda":
            if not torch.cuda.is_available():
                where = ", ".join(f"{n} is on {x.device}" for n, x in named.items())
                raise RuntimeError(
                    "persistent_matmul needs a CUDA device, and no CUDA device is present "
                    f"(torch.cuda.is_available() is False; {where})"
                )
            raise ValueError(f"{name} is on {t.device}; persistent_matmul takes CUDA tensors only")
    devices = {t.device for t in named.values()}
    if len(devices) > 1:
        listing = ", ".join(f"{n} is on {t.device}" for n, t in named.items())
        raise ValueError(f"tensors are on different devices: {listing}")
    return next(iter(named.values())).device
