"""matmul and linear: validate once, pick a rung, run its op."""

from __future__ import annotations

import torch

from ._ops import ops
from ._rungs import AUTO_ORDER, RUNGS, Rung, availability
from ._validate import check_cuda, check_out, check_same_dtype, check_tensor


def _choose_rung(kernel: str, dtype: torch.dtype, device: torch.device) -> Rung:
    if kernel == "auto":
        for name in AUTO_ORDER:
            if dtype in RUNGS[name].dtypes and availability(name, device).available:
                return RUNGS[name]
        reasons = "; ".join(f"{n}: {availability(n, device).reason}" for n in AUTO_ORDER)
        raise RuntimeError(f"no kernel runs {dtype} on {device}: {reasons}")
    rung = RUNGS[kernel]
    info = availability(kernel, device)
    if not info.available:
        raise RuntimeError(f"kernel {kernel!r} does not run on this device: {info.reason}")
    if dtype not in rung.dtypes:
        names = ", ".join(str(d).removeprefix("torch.") for d in rung.dtypes)
        raise TypeError(f"kernel {kernel!r} does not take {dtype}; it takes {names}")
    return rung


def _check_kernel_name(kernel) -> None:
    choices = ", ".join(["auto", *RUNGS])
    if not isinstance(kernel, str):
        raise TypeError(f"kernel must be a str (one of: {choices}), got {type(kernel).__name__}")
    if kernel != "auto" and kernel not in RUNGS:
        raise ValueError(f"unknown kernel {kernel!r}; choose one of: {choices}")


def _run(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None,
         kernel: str, names: tuple[str, str] = ("a", "b")) -> torch.Tensor:
    """a (M x K) @ b (K x N) (+ bias) into out, after the per-argument checks.

    ``names`` are the caller's names for a and b, used in error messages.
    """
    _check_kernel_name(kernel)
    named = {names[0]: a, names[1]: b}
    if bias is not None:
        named["bias"] = bias
    dtype = check_same_dtype(named)
    m, n = a.shape[0], b.shape[1]
    if out is not None:
        check_out(out, (m, n), dtype, a.device, named)
        named["out"] = out
    device = check_cuda(named)
    rung = _choose_rung(kernel, dtype, device)
    if out is None:
        out = torch.empty((m, n), dtype=dtype, device=device)
    if m == 0 or n == 0:
        return out
    if a.shape[1] == 0:  # empty sum: zeros (plus bias)
        out.zero_()
        if bias is not None:
            out.add_(bias)
        return out
    getattr(ops, rung.op_name)(a, b, bias, out)
    return out


def matmul(a: torch.Tensor, b: torch.Tensor, *, kernel: str = "auto",
           out: torch.Tensor | None = None) -> torch.Tensor:
    """``a @ b`` for 2-D CUDA tensors of one dtype (float32, float16 or bfloat16).

    Accumulates in fp32 and returns a tensor of the inputs' dtype (``out`` if
    given). Any strides are accepted. ``kernel`` names a rung (see
    ``available_kernels()``) or is ``"auto"``, the best rung for the device
    and dtype. Raises TypeError/ValueError/RuntimeError naming the bad
    argument for bad input.
    """
    check_tensor(a, "a", 2)
    check_tensor(b, "b", 2)
    if a.shape[1] != b.shape[0]:
        raise ValueError(
            f"inner dimensions differ: a is {a.shape[0]}x{a.shape[1]} and b is {b.shape[0]}x{b.shape[1]}"
        )
    return _run(a, b, None, out, kernel)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
           kernel: str = "auto") -> torch.Tensor:
    """``x @ weight.T + bias``, as ``torch.nn.functional.linear``.

    ``x`` is (..., in_features), ``weight`` (out_features, in_features),
    ``bias`` (out_features) or None; the bias is added in fp32 before the
    result is rounded. Returns (..., out_features).
    """
    check_tensor(x, "x", tuple(range(1, 9)))
    check_tensor(weight, "weight", 2)
    if bias is not None:
        check_tensor(bias, "bias", 1)
        if bias.shape[0] != weight.shape[0]:
            raise ValueError(f"bias has {bias.shape[0]} elements but weight has {weight.shape[0]} rows")
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"x has {x.shape[-1]} features in its last dim but weight is {weight.shape[0]}x{weight.shape[1]} "
            "(out_features x in_features)"
        )
    if bias is not None and bias.numel() > 1 and bias.stride(0) != 1:
        bias = bias.contiguous()
    x2d = x.reshape(-1, x.shape[-1])
    out = _run(x2d, weight.t(), bias, None, kernel, names=("x", "weight"))
    return out.reshape(*x.shape[:-1], weight.shape[0])
