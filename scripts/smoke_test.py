"""A quick check of one rung on this GPU: a few products, small and large, both B layouts.

    python scripts/smoke_test.py RUNG   (or a variant: persistent-grouped, wgmma_persistent-cluster1)

Meant to run under `timeout` before the long steps (scripts/device_run.sh), so a
kernel that hangs or returns garbage is found in seconds. Exits 1 if any product's
normwise relative error is over the dtype's tolerance.
"""

from __future__ import annotations

import sys

import torch

from harness.checks import TOLERANCE, matmul_error
from harness.kernel import load_kernel, run_variant

SHAPES = [(1, 1, 1), (200, 300, 70), (4096, 4096, 4096)]


def main() -> int:
    rung = sys.argv[1]
    pm, _ = load_kernel()
    dtype = pm.available_kernels()[rung.partition("-")[0]].dtypes[-1]  # bfloat16 for the tensor-core rungs
    worst = 0.0
    for m, n, k in SHAPES:
        for b_kmajor in (False, True):
            a = torch.randn(m, k, device="cuda", dtype=dtype)
            b = (torch.randn(n, k, device="cuda", dtype=dtype).t() if b_kmajor
                 else torch.randn(k, n, device="cuda", dtype=dtype))
            out = run_variant(pm, rung, a, b, torch.empty(m, n, device="cuda", dtype=dtype))
            torch.cuda.synchronize()
            err = matmul_error(out, a, b)
            worst = max(worst, err)
            print(f"smoke {rung} {str(dtype)[6:]} {m}x{n}x{k} {'K' if b_kmajor else 'N'}-major B: rel error {err:.2e}",
                  flush=True)
    return 0 if worst < TOLERANCE[dtype] else 1


if __name__ == "__main__":
    sys.exit(main())
