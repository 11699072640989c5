#!/usr/bin/env python3
"""persistent_matmul demo: what the kernels compute and how fast, on this machine's GPU.

With a CUDA GPU: loads the kernel as users do (kernels.get_kernel with LOCAL_KERNELS
pointing at this repo), checks every available rung against an fp64 reference on a
few shapes and all dtypes, and times each rung against torch.matmul (cuBLAS) on bf16
1024^3, 2048^3, 4096^3 and fp32 2048^3 (harness.timing: batches of back-to-back
calls, inputs rotated past the L2 cache). ``--record`` also writes the tables to
``<results dir>/<date>-demo.md``.

Without a GPU: says so, prints the most recent results recorded on a GPU (the
newest ``<date>-correctness.md`` of correctness_sweep.py and ``<date>-demo.md`` of
``demo.py --record`` in the results directory), and loads the kernel build to show
``available_kernels()``, which says why nothing runs here.

    python scripts/demo.py
    python scripts/demo.py --record [--results-dir DIR]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import torch

from harness.checks import (DTYPE_NAMES, TOLERANCE, check_exact, exact_int_operands, matmul_error, nan_count,
                            poison, random_operands)
from harness.kernel import REPO_ROOT as REPO, load_kernel
from harness.provenance import environment, environment_lines, gpu_clocks
from harness.results import RESULTS_DIR as DEFAULT_RESULTS, latest_result, result_path
from harness.timing import calls_per_batch, rotated_inputs, time_per_call

DEVICE = "cuda"
DTYPES = [torch.bfloat16, torch.float16, torch.float32]

# Correctness: (m, n, k, a transposed, b transposed): tails, K = 1, strided operands.
CHECK_SHAPES = [(1, 1, 1, False, False), (7, 65, 8, True, False), (127, 129, 1000, False, True),
                (1000, 1000, 4104, True, True), (4097, 63, 65, False, False)]
EXACT_SHAPE = (129, 129, 4104)

# Timing: (dtype, m, n, k).
TIMED = [(torch.bfloat16, 1024, 1024, 1024), (torch.bfloat16, 2048, 2048, 2048),
         (torch.bfloat16, 4096, 4096, 4096), (torch.float32, 2048, 2048, 2048)]
BATCHES = 5  # median of this many batches of ~2 ms
# The kinds shown without a GPU: the all-rung correctness summary, the demo's own tables.
RECORDED_KINDS = ("correctness", "demo")


# --------------------------------------------------------------------------- no GPU


def recorded_files(results_dir: Path) -> list[Path]:
    """The newest ``<date>-correctness.md`` (a sweep of every rung) and the newest
    ``<date>-demo.md`` in ``results_dir``, those that exist."""
    found = [latest_result(results_dir, kind) for kind in RECORDED_KINDS]
    return [p for p in found if p is not None]


def recorded_where(path: Path) -> str:
    """'<GPU> on <date>' read from a recorded Markdown file."""
    match = re.search(r"^- GPU: (.+)$", path.read_text(), flags=re.MULTILINE)
    gpu = match.group(1).strip() if match else "an unnamed GPU"
    date = path.name[:10] if re.match(r"\d{4}-\d{2}-\d{2}", path.name) else "an unknown date"
    return f"{gpu} on {date}"


def show_recorded(results_dir: Path) -> None:
    files = recorded_files(results_dir) if results_dir.is_dir() else []
    if not files:
        print(f"No CUDA GPU here, and no results recorded on a GPU were found in {results_dir}/.")
        print("To record some, run on a machine with a CUDA GPU: python scripts/correctness_sweep.py "
              "and python scripts/demo.py --record (scripts/device_run.sh runs both).")
        return
    where = list(dict.fromkeys(recorded_where(p) for p in files))
    print(f"No CUDA GPU here: showing results recorded on {' and '.join(where)}.")
    for path in files:
        print()
        print(f"----- {path.relative_to(REPO) if path.is_relative_to(REPO) else path} -----")
        print(path.read_text().rstrip())
    print()


def show_kernel_without_gpu() -> int:
    """Load the build and print available_kernels(); 1 if the build cannot be loaded."""
    try:
        pm, how = load_kernel(REPO)
    except Exception as exc:  # noqa: BLE001 - report it plainly, no traceback
        print(f"The kernel build could not be loaded from {REPO / 'build'}: {type(exc).__name__}: {exc}")
        print("Build it first: kernelpress build (or make build).")
        return 1
    print(f"Kernel build here: {pm.__name__}, loaded with {how}")
    print("available_kernels():")
    for name, info in pm.available_kernels().items():
        state = "runs here" if info.available else f"does not run here: {info.reason}"
        print(f"  {name:>10}: {state}")
    return 0


# --------------------------------------------------------------------------- with a GPU


def correctness(pm, rungs: dict[str, tuple]) -> tuple[list[str], bool]:
    """A short check of every rung and dtype vs the fp64 reference; Markdown table and pass/fail."""
    lines = ["| rung | dtype | random shapes | max rel error | bound | exact 129x129x4104 | result |",
             "|---|---|---|---|---|---|---|"]
    all_ok = True
    for rung, dtypes in rungs.items():
        for dtype in [d for d in DTYPES if d in dtypes]:
            try:
                worst, ok = 0.0, True
                for m, n, k, a_t, b_t in CHECK_SHAPES:
                    a, b = random_operands(m, n, k, dtype, DEVICE, a_t, b_t)
                    out = poison(torch.empty(m, n, dtype=dtype, device=DEVICE))
                    pm.matmul(a, b, kernel=rung, out=out)
                    err = matmul_error(out, a, b)
                    worst = max(worst, err)
                    ok = ok and err < TOLERANCE[dtype] and nan_count(out) == 0
                a, b = exact_int_operands(*EXACT_SHAPE, dtype, DEVICE)
                out = poison(torch.empty(EXACT_SHAPE[0], EXACT_SHAPE[1], dtype=dtype, device=DEVICE))
                pm.matmul(a, b, kernel=rung, out=out)
                mismatches = check_exact(out, a, b)
                ok = ok and mismatches == 0
                exact = "bit-exact" if mismatches == 0 else f"{mismatches} elements differ"
                row = (f"| {rung} | {DTYPE_NAMES[dtype]} | {len(CHECK_SHAPES)} | {worst:.3g} | "
                       f"{TOLERANCE[dtype]:g} | {exact} | {'ok' if ok else '**FAIL**'} |")
            except Exception as exc:  # noqa: BLE001 - show it in the table and go on
                ok = False
                row = (f"| {rung} | {DTYPE_NAMES[dtype]} | - | - | {TOLERANCE[dtype]:g} | - | "
                       f"**error**: {type(exc).__name__}: {str(exc).splitlines()[0][:120]} |")
            all_ok = all_ok and ok
            lines.append(row)
    return lines, all_ok


def median_ms(fn, sets: list[tuple], out: torch.Tensor) -> float:
    """Median ms per call of ``fn(a, b, out)``, rotating through ``sets``: batches of
    ~2 ms of back-to-back calls between CUDA events (harness.timing)."""
    def call(i):
        fn(*sets[i % len(sets)], out)

    probe = time_per_call(call, 1, 1)
    return time_per_call(call, calls_per_batch(probe), BATCHES) * 1e3


def timing(pm, rungs: dict[str, tuple]) -> list[str]:
    """Each rung vs torch.matmul on the TIMED shapes; Markdown table."""
    lines = ["| dtype | M x N x K | kernel | median ms | TFLOP/s | vs torch.matmul | rel error | input sets |",
             "|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    for dtype, m, n, k in TIMED:
        sets = rotated_inputs(m, n, k, dtype)
        out = torch.empty(m, n, dtype=dtype, device=DEVICE)
        kernels = {"torch.matmul": lambda a, b, out: torch.matmul(a, b, out=out)}
        for rung, dtypes in rungs.items():
            if dtype in dtypes:
                kernels[rung] = lambda a, b, out, rung=rung: pm.matmul(a, b, kernel=rung, out=out)
        torch_tflops = None
        for name, fn in kernels.items():
            shape = f"| {DTYPE_NAMES[dtype]} | {m}x{n}x{k} | {name} |"
            try:
                ms = median_ms(fn, sets, out)
                tflops = 2 * m * n * k / (ms * 1e-3) / 1e12
                torch_tflops = torch_tflops or tflops
                a, b = sets[0]
                poison(out)
                fn(a, b, out)
                err = matmul_error(out, a, b)
                flag = "" if err < TOLERANCE[dtype] else " **FAIL**"
                lines.append(f"{shape} {ms:.3f} | {tflops:.1f} | {tflops / torch_tflops:.3f}x | "
                             f"{err:.2g}{flag} | {len(sets)} |")
            except Exception as exc:  # noqa: BLE001 - show it in the table and go on
                lines.append(f"{shape} **error**: {type(exc).__name__}: {str(exc).splitlines()[0][:120]} "
                             f"| - | - | - | {len(sets)} |")
            print(lines[-1], flush=True)
        del sets, out
        torch.cuda.empty_cache()
    return lines


def run_on_gpu(args) -> int:
    try:
        pm, how = load_kernel(REPO)
    except Exception as exc:  # noqa: BLE001 - a setup problem: say it plainly
        print(f"The kernel build could not be loaded from {REPO / 'build'}: {type(exc).__name__}: {exc}")
        return 1
    torch.set_float32_matmul_precision("highest")  # fp32 torch.matmul without TF32, as our fp32 rungs
    env = environment(pm, how)
    available = pm.available_kernels()
    rungs = {name: tuple(info.dtypes) for name, info in available.items() if info.available}
    header = [*environment_lines(env)]
    print("\n".join(header))
    print("available_kernels():")
    for name, info in available.items():
        print(f"  {name:>10}: {'runs here' if info.available else info.reason}")
    if not rungs:
        print("No rung of this build runs on this GPU: nothing to check or time.")
        return 1

    check_lines, ok = correctness(pm, rungs)
    print("\nCorrectness vs an fp64 reference of the same inputs (outputs poisoned with NaN first):")
    print("\n".join(check_lines))

    method = (f"CUDA events around batches of ~2 ms of back-to-back calls, median of {BATCHES} batches after "
              f"a warm-up call; inputs random normal, rotated among enough sets to exceed a 60 MB L2 three "
              f"times; fp32 without TF32. "
              f"'vs torch.matmul' is the TFLOP/s ratio measured in this same run.")
    print(f"\nTiming ({method})")
    time_lines = timing(pm, rungs)
    clocks_after = gpu_clocks()
    print(f"SM clock after timing: {clocks_after.get('sm_clock', 'unavailable')} "
          f"(max {clocks_after.get('max_sm_clock', '?')}), power {clocks_after.get('power_draw', '?')}")

    if args.record:
        args.results_dir.mkdir(parents=True, exist_ok=True)
        path = result_path(args.results_dir, "demo", "md")
        text = "\n".join([
            f"# persistent_matmul demo on {env.get('gpu')}",
            "",
            *header,
            f"- SM clock after timing: {clocks_after.get('sm_clock', 'unavailable')}",
            "",
            "## Correctness",
            "",
            "Random normal inputs vs an fp64 reference of the same rounded inputs (normwise relative "
            "error), plus a small-integer case that must be bit-exact; outputs poisoned with NaN first.",
            "",
            *check_lines,
            "",
            "## Timing",
            "",
            method,
            "",
            *time_lines,
            "",
        ])
        path.write_text(text)
        print(f"Recorded to {path}")
    print("Correctness: " + ("all checks pass" if ok else "SOME CHECKS FAILED"))
    return 0 if ok else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--record", action="store_true",
                   help="write the tables to <results dir>/<date>-demo.md (GPU only)")
    p.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS,
                   help="where recorded results are read (no GPU) and written (--record); "
                        "default: benchmarks/results/")
    args = p.parse_args(argv)
    if torch.cuda.is_available():
        return run_on_gpu(args)
    show_recorded(args.results_dir)
    if args.record:
        print("(--record: nothing recorded, since no GPU ran anything here.)")
    return show_kernel_without_gpu()


if __name__ == "__main__":
    sys.exit(main())
