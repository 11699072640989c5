"""A workload for Nsight Compute: a few launches of the named rungs (or rung
variants, as the benchmark names them: wgmma_persistent-cluster2, persistent-dynamic)
at one shape.

    ncu --clock-control none -k regex:"tiled_kernel|persistent_kernel" --launch-skip 2 \\
        python scripts/profile_workload.py --shape 4096x4096x4096 tiled persistent
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from matmul_checks import load_kernel, run_variant  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rungs", nargs="+")
    parser.add_argument("--shape", default="4096x4096x4096")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    m, n, k = (int(x) for x in args.shape.split("x"))
    dtype = getattr(torch, args.dtype)
    pm, _ = load_kernel()
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    b = torch.randn(k, n, device="cuda", dtype=dtype)
    out = torch.empty(m, n, device="cuda", dtype=dtype)
    for rung in args.rungs:
        for _ in range(args.repeat):
            run_variant(pm, rung, a, b, out)
    torch.cuda.synchronize()
    print(f"profiled {args.rungs} at {m}x{n}x{k} {args.dtype}, {args.repeat} launches each")
    return 0


if __name__ == "__main__":
    sys.exit(main())
