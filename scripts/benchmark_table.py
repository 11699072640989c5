"""Benchmark every kernel rung against torch.matmul on this GPU, in one run.

The timing is harness.timing's: CUDA events around batches of back-to-back
launches (so small shapes measure launch overhead as such), a warm-up first, the
median of several batches, in 3 rounds that interleave the columns (the median
round kept; the table notes the largest round-to-round spread), input sets
rotated so they exceed the L2 cache, random normal inputs. Every figure is
reported as TFLOP/s and as a ratio to torch.matmul measured in the same run,
with the GPU, clocks, power, torch/CUDA versions, commit and command in the
header. Each rung's output is also compared with torch.matmul's once (relative
error), so a fast wrong kernel cannot pass unnoticed.

    python scripts/benchmark_table.py [--out DIR] [--shapes 4096x4096x4096 ...] [--rungs persistent tiled]

Writes <date>-benchmark.md, .json and .png to --out (default benchmarks/results/).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

from harness.kernel import CLUSTER_VARIANT, TILE_ORDER_VARIANTS, load_kernel, run_variant
from harness.provenance import command_line, environment, environment_lines, gpu_clocks
from harness.results import RESULTS_DIR, result_path
from harness.timing import (calls_per_batch, geomean, interleaved_times, parse_shape, rotated_inputs,
                            time_per_call, warm_up_gpu)

SHAPES = [
    (1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192),
    (4096, 11008, 4096), (4096, 4096, 11008), (8192, 8192, 1024), (3000, 3000, 3000),
    (4097, 4097, 4097), (128, 4096, 4096), (16, 4096, 4096),
]
NAIVE_MAX_FLOP = 4.0e11  # the naive rung runs ~5 TFLOP/s: skip shapes that would take seconds
# (persistent rung, its one-CTA-per-tile twin): the table adds their ratio and
# columns for the persistent rung in its other tile orders.
PERSISTENT_PAIRS = [("persistent", "tiled"), ("wgmma_persistent", "wgmma")]
DEFAULT_DTYPES = ["bfloat16", "float32"]


def with_variant_columns(rungs: list[str], variants: bool = True) -> list[str]:
    """rungs, plus "<persistent rung>-<order>" for each tile order other than the
    default (TILE_ORDER_VARIANTS) after each persistent rung among them, and wgmma_persistent
    as single CTAs ("wgmma_persistent-cluster1": its default runs CTA pairs);
    just rungs if not `variants`."""
    out = []
    for name in rungs:
        out.append(name)
        if not variants:
            continue
        if any(name == p for p, _ in PERSISTENT_PAIRS):
            out.extend(f"{name}-{order}" for order in TILE_ORDER_VARIANTS)
        if name == "wgmma_persistent":
            out.append(f"{name}-{CLUSTER_VARIANT}")
    return out


def bench_shape(pm, m: int, n: int, k: int, dtype: torch.dtype, rungs: list[str], tf32: bool,
                rounds: int = 3) -> dict:
    """One shape: every column timed in each of `rounds` interleaved rounds
    (torch.matmul, rung 1, rung 2, ..., then again), the median round kept, so a
    clock that drifts under the power limit shifts every column alike; each
    round in its own seeded shuffled order (interleaved_times)."""
    flop = 2.0 * m * n * k
    inputs = rotated_inputs(m, n, k, dtype)
    sets = len(inputs)
    out = torch.empty(m, n, device="cuda", dtype=dtype)
    torch.backends.cuda.matmul.allow_tf32 = tf32
    reference = torch.matmul(inputs[0][0].float(), inputs[0][1].float())

    def runner(name):
        if name == "torch.matmul":
            return lambda i: torch.matmul(*inputs[i % sets], out=out)
        return lambda i: run_variant(pm, name, *inputs[i % sets], out)

    row = {"m": m, "n": n, "k": k, "dtype": str(dtype).removeprefix("torch."), "input_sets": sets,
           "rounds": rounds, "results": {}}
    names = [name for name in ["torch.matmul", *rungs] if not (name == "naive" and flop > NAIVE_MAX_FLOP)]
    if "naive" in rungs and "naive" not in names:
        row["results"]["naive"] = {"skipped": f"over {NAIVE_MAX_FLOP:.0e} FLOP"}
    calls, batches = {}, {}
    for name in names:  # each column once: its error, and the batch size for >= ~2 ms batches
        fn = runner(name)
        fn(0)
        torch.cuda.synchronize()
        err = (out.float() - reference).norm().item() / max(reference.norm().item(), 1e-30)
        row["results"][name] = {"rel_error": err}
        probe = time_per_call(fn, 1, 1)
        calls[name] = calls_per_batch(probe)
        batches[name] = 5 if probe < 0.05 else 2
    times = interleaved_times({name: runner(name) for name in names}, calls, batches, rounds)
    for name in names:
        seconds = statistics.median(times[name])
        row["results"][name].update(ms=seconds * 1e3, tflops=flop / seconds / 1e12,
                                    spread=(max(times[name]) - min(times[name])) / seconds)
    base = row["results"]["torch.matmul"]["tflops"]
    for res in row["results"].values():
        if "tflops" in res:
            res["ratio"] = res["tflops"] / base
    del inputs
    torch.cuda.empty_cache()
    return row


def per_call_floor(pm, dtype: torch.dtype, rungs: list[str], size: int = 16) -> dict[str, float]:
    """Microseconds per back-to-back call at size^3, where the GPU work is a few
    microseconds: the host-side cost of a call (argument checks, dispatch,
    launch), which bounds every small shape's speed."""
    a = torch.randn(size, size, device="cuda", dtype=dtype)
    b = torch.randn(size, size, device="cuda", dtype=dtype)
    out = torch.empty(size, size, device="cuda", dtype=dtype)
    floors = {"torch.matmul": time_per_call(lambda i: torch.matmul(a, b, out=out), 200, 7) * 1e6}
    for name in rungs:
        floors[name] = time_per_call(lambda i, name=name: run_variant(pm, name, a, b, out), 200, 7) * 1e6
    return floors


def markdown(env: dict, rows: list[dict], columns: list[str], floors: dict[str, dict[str, float]]) -> str:
    lines = [*environment_lines(env), ""]
    for dtype, floor in floors.items():
        lines += [f"Per-call floor, {dtype} 16x16x16, us per back-to-back call (host cost of a call): "
                  + ", ".join(f"{name} {us:.1f}" for name, us in floor.items()), ""]
    for dtype in dict.fromkeys(r["dtype"] for r in rows):
        sub = [r for r in rows if r["dtype"] == dtype]
        lines += [f"### {dtype}" + (" (torch.matmul with TF32 off)" if dtype == "float32" else ""), ""]
        header = "| M x N x K | torch.matmul TFLOP/s | " + " | ".join(f"{c} TFLOP/s (ratio)" for c in columns)
        pairs = [(p, t) for p, t in PERSISTENT_PAIRS if p in columns and t in columns]
        for p, t in pairs:
            header += f" | {p} / {t}"
        lines += [header + " |", "|" + "---|" * (header.count("|") - 0)]
        for r in sub:
            res = r["results"]
            cells = [f"{r['m']}x{r['n']}x{r['k']}", f"{res['torch.matmul']['tflops']:.1f}"]
            for c in columns:
                x = res.get(c)
                if x is None:
                    cells.append("n/a")
                elif "skipped" in x:
                    cells.append("skipped")
                else:
                    flag = "" if x["rel_error"] < 2e-2 else " **WRONG**"
                    cells.append(f"{x['tflops']:.1f} ({x['ratio']:.2f}x){flag}")
            for p_name, t_name in pairs:
                p, t = res.get(p_name, {}), res.get(t_name, {})
                cells.append(f"{p['tflops'] / t['tflops']:.2f}x" if "tflops" in p and "tflops" in t else "n/a")
            lines.append("| " + " | ".join(cells) + " |")
        for c in columns:
            ratios = [r["results"][c]["ratio"] for r in sub if "ratio" in r["results"].get(c, {})]
            if ratios:
                lines.append(f"\ngeomean ratio to torch.matmul, {c}: {geomean(ratios):.3f}"
                             f" over {len(ratios)} shapes")
        spreads = [(x["spread"], c, f"{r['m']}x{r['n']}x{r['k']}") for r in sub
                   for c, x in r["results"].items() if "spread" in x]
        if spreads:
            worst = max(spreads)
            lines.append(f"\nlargest round-to-round spread: {worst[0]:.1%} ({worst[1]}, {worst[2]}); "
                         f"median {statistics.median(s_[0] for s_ in spreads):.1%}")
        for p_name, t_name in pairs:
            speedups = [r["results"][p_name]["tflops"] / r["results"][t_name]["tflops"] for r in sub
                        if "tflops" in r["results"].get(p_name, {}) and "tflops" in r["results"].get(t_name, {})]
            if speedups:
                lines.append(f"geomean {p_name} / {t_name}: {geomean(speedups):.3f}")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--shapes", nargs="*", type=parse_shape, default=SHAPES)
    parser.add_argument("--rungs", nargs="*", default=None, help="default: every available rung")
    parser.add_argument("--dtypes", nargs="*", default=DEFAULT_DTYPES)
    parser.add_argument("--tag", default="benchmark", help="the files' kind: <date>-<tag>.md (default: benchmark)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per shape (median kept)")
    parser.add_argument("--no-variants", dest="variants", action="store_false",
                        help="only the rungs' default configurations: no tile-order or cluster columns, "
                             "so a run takes less device time")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmark_table.py needs a CUDA GPU; none is present here.", file=sys.stderr)
        return 2
    pm, how = load_kernel()
    warm_up_gpu()
    available = {n: a for n, a in pm.available_kernels().items() if a.available}
    env = environment(pm, how)
    env["command"] = command_line()
    rows = []
    floors = {}
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        rungs = with_variant_columns([n for n in (args.rungs or available)
                                      if n in available and dtype in available[n].dtypes], args.variants)
        floors[dtype_name] = per_call_floor(pm, dtype, [r for r in rungs if r != "naive"])
        print(f"per-call floor {dtype_name}:", {k_: round(v, 1) for k_, v in floors[dtype_name].items()}, flush=True)
        for m, n, k in args.shapes:
            row = bench_shape(pm, m, n, k, dtype, rungs, tf32=False, rounds=args.rounds)
            rows.append(row)
            print(json.dumps({k_: v for k_, v in row.items() if k_ != "results"}),
                  {name: round(r.get("tflops", 0), 1) for name, r in row["results"].items()}, flush=True)
    env["clocks_at_end"] = gpu_clocks()
    columns = with_variant_columns([n for n in (args.rungs or available) if n in available], args.variants)
    text = markdown(env, rows, columns, floors)
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"environment": env, "rows": rows, "per_call_floor_us": floors}
    json_path = result_path(args.out, args.tag, "json")
    json_path.with_suffix(".md").write_text(text + "\n")
    json_path.write_text(json.dumps(result, indent=1) + "\n")
    try:
        from plot_benchmark import plot

        plot(result, json_path.with_suffix(".png"))
    except ImportError:  # no matplotlib: the table is the result, the plot a convenience
        print("matplotlib missing: no plot written", file=sys.stderr)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
