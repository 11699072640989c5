"""persistent_matmul: CUDA matrix multiplication, from a naive kernel up.

>>> from kernels import get_kernel
>>> pm = get_kernel("persistent-matmul/persistent-matmul", version=1)
>>> c = pm.matmul(a, b)                      # best kernel for this GPU
>>> c = pm.matmul(a, b, kernel="naive")      # a named rung
>>> y = pm.linear(x, weight, bias)           # x @ weight.T + bias
>>> pm.available_kernels()                   # what runs here, and why not the rest
>>> c = pm.matmul(a, b, kernel="wgmma_persistent",  # a persistent rung's options
...               tile_order=pm.TileOrder.HILBERT, cluster_size=1)
"""

from __future__ import annotations

import torch

from . import layers
from ._compile import linear
from ._matmul import TIMELINE_COLUMNS, matmul, matmul_timeline, tile_config
from ._rungs import RUNGS, KernelAvailability, TileOrder, availability

KERNELS = tuple(RUNGS)


def available_kernels(device: torch.device | int | None = None) -> dict[str, KernelAvailability]:
    """Every rung of this build with whether it runs on ``device`` (default: the current
    CUDA device) and, when it does not, why."""
    if isinstance(device, int):
        device = torch.device("cuda", device)
    return {name: availability(name, device) for name in RUNGS}


__all__ = [
    "KERNELS",
    "KernelAvailability",
    "TIMELINE_COLUMNS",
    "TileOrder",
    "available_kernels",
    "layers",
    "linear",
    "matmul",
    "matmul_timeline",
    "tile_config",
]
