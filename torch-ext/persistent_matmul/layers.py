"""Layers for ``kernels.kernelize``: drop-in forwards for ``nn.Linear`` modules.

Following kernelize's rules, a layer has no ``__init__`` and no members but
``has_backward``/``can_torch_compile``; its annotations name the host
module's state that ``forward`` reads.
"""

from __future__ import annotations

import torch
from torch import nn

from ._compile import kernels_take, linear


class MatmulLinear(nn.Module):
    """``nn.Linear.forward`` computed by persistent_matmul's best kernel, bias fused.

    Goes through the ``linear_fwd`` op, which has a fake kernel and an autograd
    formula: usable for training and under torch.compile(fullgraph=True). Calls
    our kernels don't take (CPU or meta tensors, float64, tensor subclasses the
    op does not handle) run torch.nn.functional.linear instead.
    """

    weight: torch.Tensor
    bias: torch.Tensor | None

    has_backward = True
    can_torch_compile = True

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if input.is_cuda and not torch.compiler.is_compiling():
            # The common case first, unchecked: the op checks everything, and
            # what it rejects is either a real error or a call for torch.
            try:
                return linear(input, self.weight, self.bias)
            except Exception:
                if kernels_take(input, self.weight, self.bias):
                    raise
        if not kernels_take(input, self.weight, self.bias):
            return nn.functional.linear(input, self.weight, self.bias)
        return linear(input, self.weight, self.bias)


__all__ = ["MatmulLinear"]
