"""Workloads for ``kernels benchmark``: each rung of persistent-matmul against torch.matmul.

``kernels benchmark <repo_id>@v1`` (or ``kernels benchmark ./`` on a local checkout with
``build/``) imports this file, finds the ``kernels.benchmark.Benchmark`` subclasses defined
here and, for every ``benchmark_<w>`` method, creates a fresh instance, sets ``.kernel``
(the loaded kernel) and ``.device``, calls ``setup_<w>``, runs ``benchmark_<w>`` once,
compares ``self.out`` with what ``verify_<w>`` returns (``torch.allclose(..., atol=1e-2)``,
default rtol), then times ``benchmark_<w>``.

Because that check is absolute (atol 1e-2), inputs are scaled so every product entry has a
standard deviation of about 0.05: a bf16 result then rounds in steps of at most 2^-9 and
two correct fp32-accumulating kernels agree within the tolerance at any K.

One class per rung, a few shapes each: ``naive`` on small shapes (it runs ~5 TFLOP/s),
``warptiled`` in fp32, ``tiled`` and ``persistent`` in bf16. The file imports on a machine
without a GPU; tensors are made only in the setup methods.
"""

from __future__ import annotations

import torch

from kernels.benchmark import Benchmark

OUT_STD = 0.05  # standard deviation of each product entry (see the module docstring)


def _workloads(cls):
    """Add ``setup_<w>``, ``benchmark_<w>`` and ``verify_<w>`` for each of ``cls.shapes``."""
    for name, (m, n, k) in cls.shapes.items():
        def setup(self, m=m, n=n, k=k):
            scale = (OUT_STD / k**0.5) ** 0.5
            self.a = torch.randn(m, k, device=self.device, dtype=self.dtype) * scale
            self.b = torch.randn(k, n, device=self.device, dtype=self.dtype) * scale
            self.out = torch.empty(m, n, device=self.device, dtype=self.dtype)

        def benchmark(self):
            self.kernel.matmul(self.a, self.b, kernel=self.rung, out=self.out)

        def verify(self):
            return torch.matmul(self.a, self.b)

        setup.__doc__ = f"{m}x{n}x{k} operands, {cls.dtype}."
        benchmark.__doc__ = f"{cls.rung} rung, {m}x{n}x{k}."
        verify.__doc__ = "torch.matmul (cuBLAS) on the same operands."
        for prefix, fn in (("setup_", setup), ("benchmark_", benchmark), ("verify_", verify)):
            fn.__name__ = prefix + name
            setattr(cls, prefix + name, fn)
    return cls


@_workloads
class Naive(Benchmark):
    """One thread per output element (small shapes: the rung is slow)."""

    seed = 0
    rung = "naive"
    dtype = torch.float32
    shapes = {"fp32_512": (512, 512, 512), "fp32_1024x256x2048": (1024, 256, 2048)}


@_workloads
class Warptiled(Benchmark):
    """fp32 on CUDA cores (torch.matmul with TF32 off, the default, is the reference)."""

    seed = 0
    rung = "warptiled"
    dtype = torch.float32
    shapes = {"fp32_2048": (2048, 2048, 2048), "fp32_4096": (4096, 4096, 4096)}


@_workloads
class Tiled(Benchmark):
    """bf16 tensor cores, one CTA per output tile."""

    seed = 0
    rung = "tiled"
    dtype = torch.bfloat16
    shapes = {"bf16_4096": (4096, 4096, 4096), "bf16_4096x11008x4096": (4096, 11008, 4096),
              "bf16_4097": (4097, 4097, 4097)}


@_workloads
class Persistent(Benchmark):
    """bf16 tensor cores, one wave of CTAs looping over the tiles."""

    seed = 0
    rung = "persistent"
    dtype = torch.bfloat16
    shapes = {"bf16_4096": (4096, 4096, 4096), "bf16_8192": (8192, 8192, 8192),
              "bf16_128x4096x4096": (128, 4096, 4096)}
