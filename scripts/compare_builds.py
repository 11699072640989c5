"""Compare builds of the package in one process: same GPU, same clocks, interleaved.

    python scripts/compare_builds.py BASELINE_BUILD [--candidates build ...] [--rungs wgmma_persistent ...]
        [--shapes 4096x4096x4096 ...] [--rounds 7] [--baseline-rung tiled]

BASELINE_BUILD and --candidates are build folders (each holding a torch-* variant,
as `kernelpress build` writes them); they must come from different trees (a
clean and a dirty one, or different commits), so that their op namespaces differ
and all load side by side. Per shape and rung, every round times torch.matmul,
the baseline and each candidate back to back in a shuffled order
(harness.timing's batches of calls with CUDA events, inputs rotated past the L2
cache), and the table reports, per candidate, the median over rounds of
baseline time / candidate time (> 1: the candidate is faster), the spread of
that ratio across rounds, and the median ratios to torch.matmul. Across
separate benchmark runs the power-limited SM clock moves the ratios by a few per
cent; here both builds see the same clock within a round, so a change of 1-2%
shows. A last table gives, per rung and candidate, the geometric mean of the
median ratios over the shapes.

With --baseline-rung, the baseline runs that rung and the candidates run
--rungs, so two rungs of one build are compared the same way (the candidate
may then be the baseline's own folder):

    python scripts/compare_builds.py build --candidates build --baseline-rung tiled --rungs persistent
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

from harness.checks import rel_error
from harness.kernel import load_build, run_variant
from harness.provenance import environment, environment_lines
from harness.timing import (calls_per_batch, geomean, interleaved_times, parse_shape, rotated_inputs,
                            time_per_call, warm_up_gpu)

DEFAULT_SHAPES = ["4096x4096x4096", "8192x8192x8192", "4096x11008x4096", "4096x4096x11008", "8192x8192x1024",
                  "4097x4097x4097", "3000x3000x3000"]


def compare_shape(builds: dict, rung: str, shape: tuple[int, int, int], dtype: torch.dtype, rounds: int,
                  baseline_rung: str | None = None, b_kmajor: bool = False) -> dict:
    """Median seconds per call of torch.matmul and of `rung` in each build (the
    baseline's `baseline_rung` if given), per round. `b_kmajor`: B is the
    transpose of a contiguous N x K tensor (a linear layer's weight)."""
    m, n, k = shape
    inputs = rotated_inputs(m, n, k, dtype)
    if b_kmajor:
        inputs = [(a, b.t().contiguous().t()) for a, b in inputs]
    sets = len(inputs)
    out = torch.empty(m, n, device="cuda", dtype=dtype)
    reference = torch.matmul(inputs[0][0].float(), inputs[0][1].float())
    runners = {"torch.matmul": lambda i: torch.matmul(*inputs[i % sets], out=out)}
    for label, pm in builds.items():
        name = baseline_rung if label == "baseline" and baseline_rung else rung
        runners[label] = (lambda pm, name: lambda i: run_variant(pm, name, *inputs[i % sets], out))(pm, name)
    errors, calls = {}, {}
    for label, fn in runners.items():
        out.fill_(float("nan"))
        fn(0)
        torch.cuda.synchronize()
        errors[label] = rel_error(out, reference)
        calls[label] = calls_per_batch(time_per_call(fn, 1, 1))
    times = interleaved_times(runners, calls, dict.fromkeys(runners, 3), rounds)
    return {"errors": errors, "times": times}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("baseline", type=Path, help="build folder of the baseline")
    parser.add_argument("--candidates", type=Path, nargs="+", default=[Path("build")],
                        help="build folders to compare with the baseline (default: build)")
    parser.add_argument("--rungs", nargs="+", default=["wgmma_persistent"])
    parser.add_argument("--shapes", nargs="+", default=DEFAULT_SHAPES)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--baseline-rung", help="the rung the baseline runs (default: each of --rungs)")
    parser.add_argument("--b-kmajor", action="store_true",
                        help="B as a linear layer's weight (K contiguous) instead of row-major K x N")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    for folder in [args.baseline, *args.candidates]:
        if not any(folder.glob("torch-*")):
            parser.error(f"{folder} holds no build (no torch-* variant folder; `kernelpress build` writes one)")
    if not isinstance(getattr(torch, args.dtype, None), torch.dtype):
        parser.error(f"--dtype {args.dtype!r} is not a torch dtype (bfloat16, float16, ...)")
    if args.baseline_rung and args.baseline_rung in args.rungs:
        parser.error(f"--baseline-rung {args.baseline_rung} is also among --rungs: nothing to compare")
    loaded = {}  # one module per folder, loaded once
    builds = {}
    for label, folder in [("baseline", args.baseline), *((str(f), f) for f in args.candidates)]:
        if folder.resolve() not in loaded:
            loaded[folder.resolve()] = load_build(folder)
        builds[label] = loaded[folder.resolve()]
    names = [pm.__name__ for pm in builds.values()]
    if len(set(names)) != len(names) and not args.baseline_rung:
        parser.error(f"two folders hold the same build ({', '.join(names)}): nothing to compare "
                     "(--baseline-rung compares two rungs of one build)")
    dtype = getattr(torch, args.dtype)
    shapes = [parse_shape(s) for s in args.shapes]
    candidates = [str(folder) for folder in args.candidates]
    warm_up_gpu()  # first, so the header's SM clock and power are those under load
    print("\n".join(environment_lines(environment(builds[candidates[0]], "kernels.get_local_kernel"))))
    for label, pm in builds.items():
        print(f"- {'baseline: ' + str(args.baseline) if label == 'baseline' else 'candidate: ' + label} ({pm.__name__})")
    if args.baseline_rung:
        print(f"- the baseline runs {args.baseline_rung}; the candidates run the rung named in each row")
    layout = "K-major (a linear layer's weight)" if args.b_kmajor else "row-major K x N"
    print(f"- {args.rounds} rounds per shape, columns shuffled per round; dtype {args.dtype}; B {layout}\n")
    print("| rung | M x N x K | candidate | baseline / candidate time (median) | min - max over rounds | "
          "baseline / torch | candidate / torch | rel. error (baseline, candidate) |")
    print("|---|---|---|---:|---:|---:|---:|---|")
    medians = {}  # (rung, candidate) -> median ratio per shape
    for rung in args.rungs:
        for shape in shapes:
            result = compare_shape(builds, rung, shape, dtype, args.rounds, args.baseline_rung, args.b_kmajor)
            t, e = result["times"], result["errors"]
            torch_s = statistics.median(t["torch.matmul"])
            for label in candidates:
                ratios = [b / c for b, c in zip(t["baseline"], t[label])]  # > 1: the candidate is faster
                medians.setdefault((rung, label), []).append(statistics.median(ratios))
                print(f"| {rung} | {'x'.join(map(str, shape))} | {label} | {statistics.median(ratios):.3f} | "
                      f"{min(ratios):.3f} - {max(ratios):.3f} | {torch_s / statistics.median(t['baseline']):.3f} | "
                      f"{torch_s / statistics.median(t[label]):.3f} | {e['baseline']:.1e}, {e[label]:.1e} |",
                      flush=True)
    print(f"\n| rung | candidate | geometric mean of baseline / candidate over {len(shapes)} shapes |")
    print("|---|---|---:|")
    for (rung, label), values in medians.items():
        print(f"| {rung} | {label} | {geomean(values):.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
