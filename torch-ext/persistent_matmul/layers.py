"""Layers for ``kernels.kernelize``: drop-in forwards for ``nn.Linear`` modules.

Following kernelize's rules, a layer has no ``__init__`` and no members but
``has_backward``/``can_torch_compile``; its annotations name the host
module's state that ``forward`` reads.
"""

from __future__ import annotations

import torch
from torch import nn

from ._compile import DTensor, is_dtensor, kernels_take, linear


class MatmulLinear(nn.Module):
    """``nn.Linear.forward`` computed by persistent_matmul's best kernel, bias fused.

    Goes through the ``linear_fwd`` op, which has a fake kernel and an autograd
    formula: usable for training and under torch.compile(fullgraph=True). Calls
    our kernels don't take (CPU or meta tensors, float64, DTensors) run
    torch.nn.functional.linear instead.

    Under a tensor-parallel plan (transformers' ``tp_plan``) the plan's forward
    wraps this one: in inference it hands over the local shards as plain
    tensors, which our kernels take (any shape: shards need not be multiples of
    a tile); with gradients on it hands over DTensors, which torch computes.
    A DTensor weight with a plain input (or the reverse) means that wrapper was
    lost, and raises TypeError rather than computing one shard's product.
    """

    weight: torch.Tensor
    bias: torch.Tensor | None

    has_backward = True
    can_torch_compile = True

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        # The common case first, unchecked: the op checks everything, and what it
        # rejects is either a real error or a call for torch. A DTensor input (a
        # tensor-parallel forward with gradients) skips it: the op has no
        # sharding rule, and failing there first would cost every call.
        if input.is_cuda and type(input) is not _DTENSOR and not torch.compiler.is_compiling():
            try:
                return linear(input, self.weight, self.bias)
            except Exception:
                if kernels_take(input, self.weight, self.bias):
                    raise
        if not kernels_take(input, self.weight, self.bias):
            _check_same_kind(input, self.weight, self.bias)
            return nn.functional.linear(input, self.weight, self.bias)
        return linear(input, self.weight, self.bias)


_DTENSOR = object() if DTensor is None else DTensor


def _check_same_kind(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    """Raise TypeError if some of the tensors are DTensors and some are not."""
    named = {"input": input, "weight": weight, "bias": bias}
    kinds = {name: is_dtensor(t) for name, t in named.items() if t is not None}
    if len(set(kinds.values())) > 1:
        dtensors = [name for name, kind in kinds.items() if kind]
        plain = [name for name, kind in kinds.items() if not kind]
        raise TypeError(
            f"MatmulLinear got DTensor {' and '.join(dtensors)} but plain {' and '.join(plain)}: a tensor-parallel "
            "module's forward must be the plan's wrapper around this layer (it passes local shards, or DTensors "
            "throughout). kernelize replaces a module's forward, wrapper included: install the plan's forward again "
            "around the kernelized one (examples/kernelize_linear.py's kernelize_linears does)."
        )


__all__ = ["MatmulLinear"]
