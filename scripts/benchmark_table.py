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
    python scripts/benchmark_table.py --from-json benchmarks/results/<date>-benchmark.json

Writes <date>-benchmark.md, .json and .png to --out (default benchmarks/results/),
and the results table (the first dtype's shapes, the others' geomeans, the plot)
into --readme (default the repo's README.md) between the lines
``<!-- results-table:start -->`` and ``<!-- results-table:end -->``. With
--from-json it measures nothing and only writes that table from a recorded run
(the GPU machine's copy of the repo is discarded: record there, write here).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch

from harness.kernel import CLUSTER_VARIANT, REPO_ROOT, TILE_ORDER_VARIANTS, load_kernel, run_variant
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


# --------------------------------------------------------------------------- the README's table

README_START = "<!-- results-table:start -->"
README_END = "<!-- results-table:end -->"


def recorded_command(result: dict) -> str:
    """The command that measured ``result``: as recorded, or, for a run recorded
    before commands were, the options that its rows imply (rounds, tile-order and
    cluster columns, shapes and dtypes other than the defaults)."""
    env, rows = result["environment"], result["rows"]
    if env.get("command"):
        return env["command"]
    words = ["python", "scripts/benchmark_table.py"]
    if not any("-" in name for r in rows for name in r["results"]):
        words.append("--no-variants")
    rounds = {r.get("rounds", 3) for r in rows}
    if rounds != {3}:
        words += ["--rounds", str(max(rounds))]
    shapes = list(dict.fromkeys((r["m"], r["n"], r["k"]) for r in rows))
    if shapes != SHAPES:
        words += ["--shapes", *("x".join(map(str, s)) for s in shapes)]
    dtypes = list(dict.fromkeys(r["dtype"] for r in rows))
    if dtypes != DEFAULT_DTYPES:
        words += ["--dtypes", *dtypes]
    return " ".join(words)


def _link(path: Path, readme: Path) -> str:
    """``path`` as a link target relative to the README's folder."""
    return Path(os.path.relpath(Path(path).resolve(), Path(readme).resolve().parent)).as_posix()


def readme_table(result: dict, json_path: Path, readme: Path) -> str:
    """The README's results block for a recorded run: where, when, at which commit
    and by which command it was measured; one table of the first dtype's shapes
    (TFLOP/s and ratio to torch.matmul per rung, in its default configuration) with
    a geomean row; a geomean line per other dtype; the plot, if drawn."""
    env, rows = result["environment"], result["rows"]
    dtypes = list(dict.fromkeys(r["dtype"] for r in rows))
    table_md, plot = Path(json_path).with_suffix(".md"), Path(json_path).with_suffix(".png")
    commit = (env.get("git_commit") or "unknown")[:12]
    gpu = env.get("gpu", "an unnamed GPU") + (f" ({env['sm_count']} SMs)" if env.get("sm_count") else "")
    versions = ", ".join(f"{label} {env[key]}" for key, label in (("torch", "torch"), ("driver", "driver"))
                         if env.get(key))
    lines = [f"Measured on {gpu} on {str(env.get('timestamp', ''))[:10] or 'an unrecorded date'}"
             f"{f' ({versions})' if versions else ''} at commit `{commit}` with `{recorded_command(result)}`. "
             f"TFLOP/s, and the ratio to torch.matmul (cuBLAS) measured in the same run; all tables: "
             f"[{table_md.name}]({_link(table_md, readme)}).", ""]

    def rungs_of(sub):  # the rungs in their default configuration, as they first appear
        return [n for n in dict.fromkeys(n for r in sub for n in r["results"])
                if n != "torch.matmul" and "-" not in n and any("tflops" in r["results"][n] for r in sub
                                                                 if n in r["results"])]

    def geomeans(sub, rungs):
        out = {}
        for name in rungs:
            ratios = [r["results"][name]["ratio"] for r in sub if "ratio" in r["results"].get(name, {})]
            if ratios:
                out[name] = (geomean(ratios), len(ratios))
        return out

    first = [r for r in rows if r["dtype"] == dtypes[0]]
    rungs = rungs_of(first)
    lines += [f"| {dtypes[0]} M x N x K | torch.matmul | " + " | ".join(rungs) + " |",
              "|---|---:|" + "---:|" * len(rungs)]
    for r in first:
        cells = [f"{r['m']}x{r['n']}x{r['k']}", f"{r['results']['torch.matmul']['tflops']:.1f}"]
        for name in rungs:
            x = r["results"].get(name, {})
            cells.append(f"{x['tflops']:.1f} ({x['ratio']:.2f}x)" if "tflops" in x else "skipped" if x else "n/a")
        lines.append("| " + " | ".join(cells) + " |")
    means = geomeans(first, rungs)
    lines.append("| geomean ratio | | " + " | ".join(f"{means[n][0]:.2f}x" if n in means else "n/a"
                                                    for n in rungs) + " |")
    for dtype in dtypes[1:]:
        sub = [r for r in rows if r["dtype"] == dtype]
        means = geomeans(sub, rungs_of(sub))
        lines += ["", f"{dtype}{' (TF32 off)' if dtype == 'float32' else ''}, geomean ratio to torch.matmul over "
                  f"{len(sub)} shapes: " + ", ".join(f"{n} {g:.2f}x" for n, (g, _) in means.items()) + "."]
    if plot.is_file():
        lines += ["", f"![TFLOP/s per shape and rung]({_link(plot, readme)})"]
    return "\n".join(lines)


def write_readme_table(readme: Path, block: str) -> bool:
    """Put ``block`` between the README's results-table markers, leaving everything
    else as it is. Without both markers (in order) the README is left alone and
    the reason printed; returns whether it was written."""
    try:
        text = Path(readme).read_text()
    except OSError as exc:
        print(f"README table not written: cannot read {readme} ({exc.strerror})", file=sys.stderr)
        return False
    start, end = text.find(README_START), text.find(README_END)
    if start < 0 or end < start:
        print(f"README table not written: {readme} lacks the lines {README_START} and {README_END} "
              "(in that order) that mark where it goes", file=sys.stderr)
        return False
    head = text[:start + len(README_START)]
    Path(readme).write_text(f"{head}\n{block.strip()}\n{text[end:]}")
    print(f"README table written to {readme}")
    return True


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
    parser.add_argument("--readme", type=Path, default=REPO_ROOT / "README.md",
                        help="README to write the results table into, between its results-table markers "
                             "(default: the repo's README.md)")
    parser.add_argument("--no-readme", dest="readme", action="store_const", const=None,
                        help="leave every README alone")
    parser.add_argument("--from-json", type=Path, metavar="RESULT_JSON",
                        help="measure nothing: write the README table of this recorded run")
    args = parser.parse_args(argv)
    if args.from_json:
        if args.readme is None:
            parser.error("--from-json writes only the README table: --no-readme leaves it nothing to do")
        try:
            result = json.loads(args.from_json.read_text())
        except (OSError, ValueError) as exc:
            parser.error(f"cannot read {args.from_json}: {exc}")
        return 0 if write_readme_table(args.readme, readme_table(result, args.from_json, args.readme)) else 1
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
    if args.readme is not None:
        write_readme_table(args.readme, readme_table(result, json_path, args.readme))
    return 0


if __name__ == "__main__":
    sys.exit(main())
