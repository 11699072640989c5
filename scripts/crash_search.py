"""Which rung, tile order or cluster size of a build fails at a shape: each configuration in a
process of its own, since a kernel fault ("unspecified launch failure") ends its CUDA context.

    python scripts/crash_search.py [--shapes 4096x4096x4096 256x28672x4096:kmajor] [--memcheck]
    PM_VARIANT=<variant directory> python scripts/crash_search.py ...   (another variant of build/)

A shape with ``:kmajor`` gives b as nn.Linear's weight (the transpose of an N x K matrix), which
the skinny rungs (splitk, wgmma_streamk) need; they are left out of the other shapes. Each
configuration runs three times on fresh random bf16 operands under CUDA_LAUNCH_BLOCKING=1
and prints ``ok`` with its normwise relative error against an fp32 reference, ``refused by
this build`` where the op turns the configuration down (CUDA 12 builds have no CTA pairs), or
``FAIL`` with the error it died of. ``--memcheck`` then runs compute-sanitizer's memcheck on the first failure.
Exits 1 if any configuration failed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

RUNS = [  # (rung, matmul options)
    ("tiled", {}), ("persistent", {}), ("persistent", {"tile_order": "split_tail"}),
    ("wgmma", {}), ("wgmma_persistent", {}),
    *(("wgmma_persistent", {"cluster_size": 1, "tile_order": o}) for o in ("grouped", "dynamic", "split_tail")),
    *(("wgmma_persistent", {"cluster_size": 2, "tile_order": o}) for o in ("grouped", "split_tail")),
    ("auto", {}), ("splitk", {}), ("wgmma_streamk", {}),
]
SKINNY = {"splitk", "wgmma_streamk"}
# The op's refusal of CTA pairs in builds without them (CUDA 12): not a failure.
REFUSED = "has no CTA-pair kernels"
DEFAULT_SHAPES = ["4096x4096x4096", "256x28672x4096:kmajor"]


def parse_shape(text: str) -> tuple[tuple[int, int, int], bool]:
    """``MxNxK`` or ``MxNxK:kmajor`` -> ((m, n, k), b K-major)."""
    dims, _, layout = text.partition(":")
    if layout not in ("", "kmajor"):
        raise ValueError(f"{text!r}: the only layout suffix is ':kmajor'")
    try:
        m, n, k = (int(x) for x in dims.split("x"))
    except ValueError:
        raise ValueError(f"{text!r} is not MxNxK") from None
    if min(m, n, k) < 1:
        raise ValueError(f"{text!r}: every dimension must be at least 1")
    return (m, n, k), layout == "kmajor"


def configurations(shapes: list[str]) -> list[tuple[tuple[int, int, int], bool, str, dict]]:
    """Every (shape, b K-major, rung, options) to try, in order."""
    configs = []
    for text in shapes:
        shape, kmajor = parse_shape(text)
        configs += [(shape, kmajor, rung, opts) for rung, opts in RUNS if kmajor or rung not in SKINNY]
    return configs


def run_one(config) -> None:
    """One configuration, three times, in this process; prints its worst relative error as JSON."""
    import torch

    from harness.checks import matmul_error
    from harness.kernel import load_kernel

    pm, _ = load_kernel()
    (m, n, k), kmajor, rung, opts = config
    worst = 0.0
    for _ in range(3):
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = (torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t() if kmajor
             else torch.randn(k, n, device="cuda", dtype=torch.bfloat16))
        out = pm.matmul(a, b, kernel=rung, **opts)
        torch.cuda.synchronize()
        worst = max(worst, matmul_error(out, a, b))
    print(json.dumps({"rel_error": worst}))


def label(config) -> str:
    (m, n, k), kmajor, rung, opts = config
    options = " ".join(f"{key}={value}" for key, value in opts.items())
    return f"{m}x{n}x{k}{':kmajor' if kmajor else ''} {rung} {options}".strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=DEFAULT_SHAPES)
    parser.add_argument("--memcheck", action="store_true", help="compute-sanitizer memcheck on the first failure")
    parser.add_argument("--list", action="store_true", help="print the configurations and stop")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # the child process: run configuration ONE
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds a configuration may take")
    args = parser.parse_args(argv)
    try:
        configs = configurations(args.shapes)
    except ValueError as exc:
        parser.error(str(exc))
    if args.one is not None:
        run_one(configs[args.one])
        return 0
    if args.list:
        print("\n".join(f"[{i}] {label(c)}" for i, c in enumerate(configs)))
        return 0
    env = {**os.environ, "CUDA_LAUNCH_BLOCKING": "1"}
    failed = []
    for i, config in enumerate(configs):
        child = [sys.executable, os.path.abspath(__file__), "--one", str(i), "--shapes", *args.shapes]
        start = time.monotonic()
        try:
            done = subprocess.run(child, capture_output=True, text=True, timeout=args.timeout, env=env)
            lines = done.stdout.strip().splitlines()
            if done.returncode == 0 and lines:
                status = f"ok, rel. error {json.loads(lines[-1])['rel_error']:.1e}"
            elif REFUSED in done.stderr:  # a configuration this build does not have, refused by the op
                status = "refused by this build: " + next(line for line in done.stderr.splitlines() if REFUSED in line)
            else:
                errors = [line for line in done.stderr.splitlines() if "Error" in line or "error" in line]
                status = f"FAIL (exit {done.returncode}): {errors[-1] if errors else done.stderr.strip()[-200:]}"
        except subprocess.TimeoutExpired:
            status = f"FAIL: no answer in {args.timeout:g} s (a hang?)"
        if status.startswith("FAIL"):
            failed.append(i)
        print(f"[{i}] {label(config)}: {status} ({time.monotonic() - start:.1f} s)", flush=True)
    print(f"{len(failed)} of {len(configs)} configurations failed" + (f": {failed}" if failed else ""))
    if failed and args.memcheck:
        sanitizer = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
        print(f"compute-sanitizer memcheck on [{failed[0]}] {label(configs[failed[0]])}:", flush=True)
        subprocess.run([sanitizer, "--tool", "memcheck", "--print-limit", "3", sys.executable,
                        os.path.abspath(__file__), "--one", str(failed[0]), "--shapes", *args.shapes],
                       env={**env, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}, timeout=300)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
