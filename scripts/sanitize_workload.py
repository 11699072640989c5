"""A small workload for compute-sanitizer: every available rung, every dtype it
takes, shapes with tails in M, N and K, shapes of whole tiles (the tensor-core
rungs' unchecked copies, TMA stores) and transposed operands; the persistent
rungs also in their static tile orders and in the split-tail order on a shape
whose tiles it splits (partial sums handed between CTAs).

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck python scripts/sanitize_workload.py [RUNG ...]
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool racecheck python scripts/sanitize_workload.py --quick [RUNG ...]

--quick runs bf16 only (or the rung's first dtype) and the plain layout only:
racecheck tracks every shared-memory access and runs the whole workload far
slower than memcheck, while its hazards (shared memory) depend on the
kernel's code path, not on the operands' dtype or strides.

With torch's caching allocator off, each tensor is its own allocation, so
memcheck sees an access past any tensor's end. Exits non-zero if a result is
wrong (the sanitizer's own report says whether memory accesses were).
"""

from __future__ import annotations

import argparse
import sys

import torch

from harness.checks import TOLERANCE, matmul_error, poison, random_operands
from harness.kernel import load_kernel

# (8, 300, 4000): a skinny product whose splitk CTAs wrap around their ring of stages.
# Fewer tiles than SMs, split in K by wgmma_persistent: (8, 4096, 1024), 32 tiles in 4
# parts, (100, 4096, 1040), 64 tiles 64 wide in 2, and (300, 1000, 1100), 16 tile pairs
# in 4 parts over an odd number of tile rows; on 132 SMs the first two run wgmma_streamk's
# clustered cut over 64-row tiles in pairs (parts of 4 k-blocks, and of 4 or 5), and
# (16, 6144, 1024) and (16, 1536, 2048) its 128-row tiles in pairs and 64-row tiles in
# clusters of 5 (parts of 4, and of 3 or 4 k-blocks). (129, 65, 70), (256, 192, 128) and
# (200, 136, 192) run wgmma_persistent's 64-wide tiles in CTA pairs. On 132 SMs,
# (512, 6280, 200) and (1024, 6336, 64) run its 192-wide tiles: one round, the last
# tile column clipped, and two rounds of one k-block (two tiles stored back to back);
# (1100, 4096, 130) its 192 x 192 tiles (three consumer warpgroups): one round, the
# last tile row and column clipped.
SHAPES = [(1, 1, 1), (7, 9, 5), (129, 65, 70), (64, 200, 33), (8, 300, 4000), (256, 192, 128), (200, 136, 192),
          (512, 6280, 200), (1024, 6336, 64), (1100, 4096, 130), (8, 4096, 1024), (100, 4096, 1040),
          (300, 1000, 1100), (16, 6144, 1024), (16, 1536, 2048)]
LAYOUTS = [(False, False), (True, True), (False, True)]
# More 128x256 tiles than a 132-SM GPU holds, not whole waves, K with a tail:
# the split-tail order splits tiles here.
SPLIT_TAIL_SHAPE = (1700, 3000, 520)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rungs", nargs="*", help="rung names (default: every available rung)")
    parser.add_argument("--quick", action="store_true", help="one dtype and the plain layout (for racecheck)")
    args = parser.parse_args()
    pm, _ = load_kernel()
    only = set(args.rungs)
    layouts = LAYOUTS[:1] if args.quick else LAYOUTS
    failures = 0
    runs = 0
    for name, info in pm.available_kernels().items():
        if not info.available or (only and name not in only):
            continue
        dtypes = info.dtypes
        if args.quick:
            dtypes = [torch.bfloat16] if torch.bfloat16 in dtypes else dtypes[:1]
        for dtype in dtypes:
            for m, n, k in SHAPES:
                for a_t, b_t in layouts:
                    a, b = random_operands(m, n, k, dtype, "cuda", a_transposed=a_t, b_transposed=b_t)
                    out = poison(torch.empty(m, n, device="cuda", dtype=dtype))
                    pm.matmul(a, b, kernel=name, out=out)
                    err = matmul_error(out, a, b)
                    runs += 1
                    if not err < TOLERANCE[dtype]:
                        failures += 1
                        print(f"WRONG {name} {dtype} {m}x{n}x{k} aT={a_t} bT={b_t}: rel error {err:.3g}")
        if pm._rungs.RUNGS[name].takes_tile_order:  # the other orders (split tail is the default)
            runs_of_orders = [(shape, order) for shape in SHAPES[-2:] for order in ("grouped", "hilbert")]
            for (m, n, k), order in runs_of_orders + [(SPLIT_TAIL_SHAPE, "split_tail")]:
                a, b = random_operands(m, n, k, torch.bfloat16, "cuda")
                out = poison(torch.empty(m, n, device="cuda", dtype=torch.bfloat16))
                pm.matmul(a, b, kernel=name, out=out, tile_order=order)
                runs += 1
                if not matmul_error(out, a, b) < TOLERANCE[torch.bfloat16]:
                    failures += 1
                    print(f"WRONG {name} {order} order {m}x{n}x{k}")
        if pm._rungs.RUNGS[name].has_timeline:  # the instrumented build too (split tail: its parts' records)
            timeline_shapes = [(129, 65, 70)] + [SPLIT_TAIL_SHAPE] * pm._rungs.RUNGS[name].takes_tile_order
            for m, n, k in timeline_shapes:
                a, b = random_operands(m, n, k, torch.bfloat16, "cuda")
                out, _ = pm.matmul_timeline(a, b, kernel=name, tile_order="split_tail")
                runs += 1
                if not matmul_error(out, a, b) < TOLERANCE[torch.bfloat16]:
                    failures += 1
                    print(f"WRONG {name} instrumented {m}x{n}x{k}")
    torch.cuda.synchronize()
    print(f"sanitize workload: {runs} runs, {failures} wrong results")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
