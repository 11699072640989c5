"""Time per call, SM clock and power while each column runs back to back for seconds.

    python scripts/sustained_run.py [--shapes 4096x4096x4096 ...] [--seconds 3] [--rounds 2]
        [RUNG[-VARIANT] ...]   (default: wgmma_persistent wgmma_persistent-cluster1)

The benchmark (benchmark_table.py) times batches of ~2 ms, too short for the
power limit to settle; a model's layers run for seconds. Here each column
(torch.matmul first, then each rung or variant as run_variant names them)
runs back to back over 4 rotating operand sets for --seconds while
nvidia-smi samples the SM clock and power every 100 ms (the first 300 ms are
dropped); the rounds repeat the columns in the same order. bf16, row-major B.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time

import torch

from harness.kernel import load_kernel, run_variant
from harness.timing import parse_shape

SAMPLE_MS = 100


def sampled(fn, seconds: float) -> tuple[float, float, float, int]:
    """Runs fn(i) back to back for `seconds`: (seconds per call, mean SM clock in MHz,
    mean power in W, samples)."""
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                            "-lms", str(SAMPLE_MS)], stdout=subprocess.PIPE, text=True)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    began, calls = time.time(), 0
    start.record()
    while time.time() - began < seconds:
        for i in range(50):
            fn(i)
        calls += 50
        torch.cuda.synchronize()
    end.record()
    end.synchronize()
    smi.terminate()
    rows = [line.split(",") for line in smi.communicate()[0].strip().splitlines()[300 // SAMPLE_MS:]]
    values = [(float(clock), float(power)) for clock, power in rows if clock.strip() and power.strip()]
    clock = sum(v[0] for v in values) / max(len(values), 1)
    power = sum(v[1] for v in values) / max(len(values), 1)
    return start.elapsed_time(end) / 1e3 / calls, clock, power, len(values)


def sustained_columns(columns: dict, seconds: float):
    """Each column (name -> fn(i)), in order, warmed with 20 calls and then run back
    to back for `seconds` (sampled): yields (name, seconds per call, SM clock in MHz,
    power in W, ratio to torch.matmul), torch.matmul's column first."""
    torch_s = None
    for name, fn in columns.items():
        for i in range(20):  # warm: tensor maps, occupancy, clocks up
            fn(i)
        torch.cuda.synchronize()
        s, clock, power, _ = sampled(fn, seconds)
        torch_s = s if name == "torch.matmul" else torch_s
        yield name, s, clock, power, torch_s / s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rungs", nargs="*", default=["wgmma_persistent", "wgmma_persistent-cluster1"])
    parser.add_argument("--shapes", nargs="+", default=["4096x4096x4096", "8192x8192x1024"])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if args.seconds <= 0 or args.rounds < 1:
        parser.error("--seconds must be positive and --rounds at least 1")
    shapes = [parse_shape(s) for s in args.shapes]
    pm, _ = load_kernel()
    print("| shape | column | round | us per call | TFLOP/s | ratio to torch.matmul | SM clock (MHz) | power (W) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for m, n, k in shapes:
        sets = [(torch.randn(m, k, device="cuda", dtype=torch.bfloat16),
                 torch.randn(k, n, device="cuda", dtype=torch.bfloat16)) for _ in range(4)]
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        columns = {"torch.matmul": lambda i: torch.matmul(*sets[i % 4], out=out)}
        for name in args.rungs:
            columns[name] = (lambda name: lambda i: run_variant(pm, name, *sets[i % 4], out))(name)
        for r in range(args.rounds):
            for name, s, clock, power, ratio in sustained_columns(columns, args.seconds):
                print(f"| {m}x{n}x{k} | {name} | {r} | {s * 1e6:.1f} | {2 * m * n * k / s / 1e12:.0f} | "
                      f"{ratio:.3f} | {clock:.0f} | {power:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
