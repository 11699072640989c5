"""Layers for ``kernels.kernelize``: drop-in forwards for ``nn.Linear`` modules.

Following kernelize's rules, a layer has no ``__init__`` and no members but
``has_backward``/``can_torch_compile``; its annotations name the host
module's state that ``forward`` reads.
"""

from __future__ import annotations

import torch
from torch import nn

from ._matmul import linear


class MatmulLinear(nn.Module):
    """``nn.Linear.forward`` computed by persistent_matmul's best kernel, bias fused."""

    weight: torch.Tensor
    bias: torch.Tensor | None

    # No autograd or fake registrations yet: inference in eager mode only.
    has_backward = False
    can_torch_compile = False

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return linear(input, self.weight, self.bias)


__all__ = ["MatmulLinear"]
