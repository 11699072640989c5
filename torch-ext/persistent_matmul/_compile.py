"""linear and its op, ``linear_fwd``, for eager calls, torch.compile and autograd.

``linear_fwd(x, weight, bias, kernel) -> Tensor`` is defined and implemented in
C++ (torch_binding.cpp: checks, rung choice, allocation and launch). Here it gets
a fake kernel, which gives the output's shape and dtype, so torch.compile(
fullgraph=True) traces it as one opaque node, and an autograd formula, which
computes the gradients with the same op where our kernels take the tensors,
else with torch.

``linear`` calls the op directly where no gradient is needed: below the
autograd dispatch key, where the op's autograd kernel (Python) would only pass
the call on, so a call costs the host one dispatch into C++.
"""

from __future__ import annotations

import torch

from ._matmul import check_linear_args, explain_linear
from ._ops import add_op_namespace_prefix
from ._rungs import ALL_DTYPES

LINEAR_OP_NAME = add_op_namespace_prefix("linear_fwd")
_namespace, _name = LINEAR_OP_NAME.split("::")
linear_op = getattr(getattr(torch.ops, _namespace), _name).default
"""The registered op (an OpOverload): ``linear_op(x, weight, bias, kernel)``."""


def _linear_fwd_fake(x, weight, bias, kernel):
    torch._check(x.dim() >= 1, lambda: f"x must be at least 1-D, got {x.dim()}-D")
    torch._check(weight.dim() == 2, lambda: f"weight must be 2-D, got {weight.dim()}-D")
    torch._check(x.shape[-1] == weight.shape[1], lambda: "x's last dim must equal weight's in_features")
    if bias is not None:
        torch._check(bias.dim() == 1 and bias.shape[0] == weight.shape[0],
                     lambda: "bias must be 1-D with out_features elements")
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


try:
    from torch.distributed.tensor import DTensor
except ImportError:  # torch built without torch.distributed: no DTensor can reach us
    DTensor = None


def is_dtensor(t: torch.Tensor | None) -> bool:
    """Whether ``t`` is a DTensor (a tensor-parallel shard with its placement)."""
    return DTensor is not None and isinstance(t, DTensor)


def kernels_take(*tensors: torch.Tensor | None) -> bool:
    """Whether our kernels take these tensors: CUDA tensors of one supported dtype on one
    device (None entries, an absent bias, are ignored). Anything else (CPU tensors,
    float64, mixed dtypes, DTensors) is left to torch.

    A DTensor reports its local shard's device and dtype, so it is named here: the
    op has no sharding rule, and torch's linear knows how to combine the shards
    (a tensor-parallel forward gives our kernels the local shards instead)."""
    tensors = tuple(t for t in tensors if t is not None)
    first = tensors[0]
    return (first.device.type == "cuda" and first.dtype in ALL_DTYPES
            and all(t.device == first.device and t.dtype == first.dtype and not is_dtensor(t) for t in tensors))


def _setup_context(ctx, inputs, output):
    x, weight, bias, kernel = inputs
    ctx.save_for_backward(x, weight)
    ctx.has_bias = bias is not None
    ctx.kernel = kernel


def _mm(a: torch.Tensor, b: torch.Tensor, kernel: str) -> torch.Tensor:
    """a @ b for 2-D a, b: through linear_fwd (a @ (b.T).T) where our kernels take them, else torch."""
    if kernels_take(a, b):
        return linear_op(a, b.t(), None, kernel)
    return a @ b


def _backward(ctx, grad):
    x, weight = ctx.saved_tensors
    n, k = weight.shape
    rows = 1
    for size in x.shape[:-1]:
        rows *= size
    grad2d = grad.reshape(rows, n)
    grad_x = grad_weight = grad_bias = None
    if ctx.needs_input_grad[0]:
        grad_x = _mm(grad2d, weight, ctx.kernel).reshape(x.shape)
    if ctx.needs_input_grad[1]:
        grad_weight = _mm(grad2d.t(), x.reshape(rows, k), ctx.kernel)
    if ctx.has_bias and ctx.needs_input_grad[2]:
        grad_bias = grad2d.sum(0)
    return grad_x, grad_weight, grad_bias, None


# A second import of this build (kernels may load it under another module name)
# finds the op registered already.
if not torch._C._dispatch_has_kernel_for_dispatch_key(LINEAR_OP_NAME, "Meta"):
    torch.library.register_fake(LINEAR_OP_NAME)(_linear_fwd_fake)
if not torch._C._dispatch_has_kernel_for_dispatch_key(LINEAR_OP_NAME, "Autograd"):
    torch.library.register_autograd(LINEAR_OP_NAME, _backward, setup_context=_setup_context)

_below_autograd = torch._C._AutoDispatchBelowAutograd
_is_compiling = torch.compiler.is_compiling


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
           kernel: str = "auto") -> torch.Tensor:
    """``x @ weight.T + bias``, as ``torch.nn.functional.linear``.

    ``x`` is (..., in_features), ``weight`` (out_features, in_features),
    ``bias`` (out_features) or None; the bias is added in fp32 before the
    result is rounded. Returns (..., out_features). Differentiable, and traced
    by torch.compile as one op. Raises TypeError/ValueError/RuntimeError
    naming the bad argument for bad input.
    """
    if _is_compiling():
        check_linear_args(x, weight, bias, kernel)
        return linear_op(x, weight, bias, kernel)
    try:
        if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                        or (bias is not None and bias.requires_grad)):
            return linear_op(x, weight, bias, kernel)
        with _below_autograd():
            return linear_op(x, weight, bias, kernel)
    except Exception:
        explain_linear(x, weight, bias, kernel)
        raise


__all__ = ["LINEAR_OP_NAME", "linear", "linear_op"]
