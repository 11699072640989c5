"""The CUDA 12.4 variant beside the CUDA 13.0 one, from the runs of scripts/device_run.sh's cu124 step.

    python scripts/compare_variants.py RUN_DIR [--out DIR] [--tolerance 0.03]

RUN_DIR holds, for cu124 and cu130, ``<date>-variant-<cuda>-benchmark.json`` (scripts/
benchmark_table.py) and ``<date>-variant-<cuda>-decode.json`` (scripts/model_benchmark.py
--parts shapes). Each variant ran in a process of its own, with torch.matmul timed in that same
process, so the variants are compared by their ratio to torch.matmul (above 1: faster than
cuBLAS), not by raw times taken minutes apart. Writes ``<date>-variants.md`` and ``.json`` to
--out (default benchmarks/results): per shape both ratios and cu124's over cu130's, and
which shapes differ by more than --tolerance. Exits 1 if a file is missing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness.provenance import environment_lines
from harness.results import RESULTS_DIR, latest_result, result_path
from harness.timing import geomean

CUDAS = ("cu124", "cu130")


def benchmark_ratios(run: dict) -> dict[str, float]:
    """``MxNxK dtype rung`` -> ratio to torch.matmul, from a benchmark_table.py JSON."""
    ratios = {}
    for row in run["rows"]:
        for rung, result in row["results"].items():
            if rung != "torch.matmul" and result.get("ratio"):
                ratios[f"{row['m']}x{row['n']}x{row['k']} {row['dtype']} {rung}"] = result["ratio"]
    return ratios


def decode_ratios(run: dict) -> dict[str, float]:
    """``projection MxNxK graph|eager`` -> ratio to F.linear, from a model_benchmark.py JSON."""
    ratios = {}
    for row in run["shapes"]:
        for mode in ("graph", "eager"):
            ratio = row["results"]["auto"].get(f"{mode}_ratio")
            if ratio:
                ratios[f"{row['projection']} {row['m']}x{row['n']}x{row['k']} {mode}"] = ratio
    return ratios


def compare(ratios: dict[str, dict[str, float]], tolerance: float) -> list[dict]:
    """One row per case both variants measured: both ratios and cu124 / cu130."""
    rows = []
    for case in ratios["cu130"]:
        if case in ratios["cu124"]:
            old, new = ratios["cu124"][case], ratios["cu130"][case]
            rows.append({"case": case, "cu124": old, "cu130": new, "cu124_over_cu130": old / new,
                         "outside": abs(old / new - 1) > tolerance})
    return rows


def markdown(env: dict, tables: dict[str, list[dict]], tolerance: float) -> str:
    lines = ["# The CUDA 12.4 variant beside the CUDA 13.0 variant", "", *environment_lines(env), "",
             "Each variant in a process of its own on the same GPU, loaded by path (PM_VARIANT), CUDA 12.4's "
             "libcudart from the nvidia-cuda-runtime-cu12 wheel; ratio: torch.matmul's (F.linear's) time over "
             "the variant's, torch timed in the same process; cu124 / cu130: the ratios' ratio (1.00: the same "
             f"speed relative to cuBLAS). Marked: more than {tolerance:.0%} apart.", ""]
    for title, rows in tables.items():
        lines += [f"## {title}", "", "| case | cu124 ratio | cu130 ratio | cu124 / cu130 |", "|---|---:|---:|---:|"]
        for r in rows:
            mark = " **outside**" if r["outside"] else ""
            lines.append(f"| {r['case']} | {r['cu124']:.3f} | {r['cu130']:.3f} | {r['cu124_over_cu130']:.3f}{mark} |")
        if rows:
            spread = [r["cu124_over_cu130"] for r in rows]
            lines += ["", f"- geomean cu124 / cu130 {geomean(spread):.3f} over {len(rows)} cases; range "
                          f"{min(spread):.3f}-{max(spread):.3f}; {sum(r['outside'] for r in rows)} outside "
                          f"{tolerance:.0%}"]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--tolerance", type=float, default=0.03)
    args = parser.parse_args(argv)
    runs = {}
    for cuda in CUDAS:
        for part in ("benchmark", "decode"):
            path = latest_result(args.run_dir, f"variant-{cuda}-{part}", "json")
            if path is None:
                print(f"no {args.run_dir}/<date>-variant-{cuda}-{part}.json (scripts/device_run.sh cu124 writes it)",
                      file=sys.stderr)
                return 1
            runs[cuda, part] = json.loads(path.read_text())
    tables = {
        "4096^3 and 8192^3 (benchmark_table.py)": compare(
            {cuda: benchmark_ratios(runs[cuda, "benchmark"]) for cuda in CUDAS}, args.tolerance),
        "Decode shapes of the real-model benchmark, kernel='auto' (model_benchmark.py)": compare(
            {cuda: decode_ratios(runs[cuda, "decode"]) for cuda in CUDAS}, args.tolerance),
    }
    env = {**runs["cu124", "benchmark"]["environment"], "variant": "cu124 and cu130 (x86_64)"}
    args.out.mkdir(parents=True, exist_ok=True)
    md = markdown(env, tables, args.tolerance)
    result_path(args.out, "variants", "md").write_text(md)
    result_path(args.out, "variants", "json").write_text(json.dumps(
        {"environment": env, "tolerance": args.tolerance, "tables": tables,
         "runs": {f"{cuda}-{part}": run for (cuda, part), run in runs.items()}}, indent=1))
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
