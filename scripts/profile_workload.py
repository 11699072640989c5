"""A workload for Nsight Compute: a few launches of the named rungs (or rung
variants, as the benchmark names them: wgmma_persistent-cluster1, persistent-grouped)
at one shape; "torch.matmul" among them launches cuBLAS's kernel, to profile beside ours.
--k-major-b gives b nn.Linear's weight layout, which the skinny rungs (splitk, wgmma_streamk) need.

    ncu --clock-control none -k regex:"tiled_kernel|persistent_kernel" --launch-skip 2 \\
        python scripts/profile_workload.py --shape 4096x4096x4096 tiled persistent

With --kernel-times it prints instead where a call's GPU time goes: the time of
each kernel one call launches (operand copies, the matmul), from torch.profiler,
for torch.matmul and each named rung.
"""

from __future__ import annotations

import argparse
import sys

import torch

from harness.kernel import load_kernel, run_variant


def print_kernel_times(name: str, call, what: str, repeat: int, top: int = 0) -> None:
    """The GPU time per call of each CUDA kernel `call` launches, largest first
    (the `top` largest if top > 0)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    call()  # warm-up: tensor maps, occupancy queries, allocator
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeat):
            call()
        torch.cuda.synchronize()
    kernels = [e for e in prof.key_averages() if e.device_type == DeviceType.CUDA and e.device_time_total > 0]
    total = sum(e.device_time_total for e in kernels) / repeat
    print(f"{name} {what}: {total:.1f} us of GPU time per call")
    for e in sorted(kernels, key=lambda e: -e.device_time_total)[:top or None]:
        print(f"  {e.device_time_total / repeat:9.1f} us  {e.count / repeat:4.1f} x  {e.key[:110]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rungs", nargs="+")
    parser.add_argument("--shape", default="4096x4096x4096")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--kernel-times", action="store_true", help="print each kernel's GPU time per call")
    parser.add_argument("--row-length", type=int, default=0,
                        help="a, b and out as views into buffers with rows this many elements long "
                             "(the leading dimension; default: contiguous)")
    parser.add_argument("--k-major-b", action="store_true",
                        help="b as nn.Linear keeps its weight: the transpose of an N x K matrix (what "
                             "splitk and wgmma_streamk take)")
    args = parser.parse_args()
    m, n, k = (int(x) for x in args.shape.split("x"))
    if args.row_length and args.row_length < max(k, n):
        parser.error(f"--row-length {args.row_length} is shorter than the rows of a ({k}) or b and out ({n})")
    dtype = getattr(torch, args.dtype)
    pm, _ = load_kernel()

    def matrix(rows: int, cols: int, fill) -> torch.Tensor:
        if not args.row_length:
            return fill(torch.empty(rows, cols, device="cuda", dtype=dtype))
        return fill(torch.empty(rows, args.row_length, device="cuda", dtype=dtype))[:, :cols]

    a = matrix(m, k, lambda t: t.normal_())
    b = matrix(n, k, lambda t: t.normal_()).t() if args.k_major_b else matrix(k, n, lambda t: t.normal_())
    out = matrix(m, n, lambda t: t)
    def call(rung: str) -> None:  # "torch.matmul" names cuBLAS's kernel, to profile beside ours
        if rung == "torch.matmul":
            torch.matmul(a, b, out=out)
        else:
            run_variant(pm, rung, a, b, out)

    if args.kernel_times:
        for rung in ["torch.matmul", *args.rungs]:
            print_kernel_times(rung, lambda r=rung: call(r), f"{m}x{n}x{k} {args.dtype}", args.repeat)
        return 0
    for rung in args.rungs:
        for _ in range(args.repeat):
            call(rung)
    torch.cuda.synchronize()
    print(f"profiled {args.rungs} at {m}x{n}x{k} {args.dtype}, {args.repeat} launches each")
    return 0


if __name__ == "__main__":
    sys.exit(main())
