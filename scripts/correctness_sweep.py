#!/usr/bin/env python3
"""The acceptance correctness sweep of persistent_matmul, run on a CUDA GPU in one call.

For each rung that runs on the GPU (or those named by --kernels), each dtype (bf16,
fp16, fp32) and each shape M, N in SIZES x K in K_SIZES:

* random normal operands, output poisoned with NaN, result compared with an fp64
  product of the same rounded inputs by normwise relative error against the
  dtype's bound (harness.checks.TOLERANCE: bf16 1e-2, fp16 2e-3, fp32 1e-4), the
  denominator kept from cancelling to near zero by chance (cancellation_floor);
* all four operand layouts (a and/or b transposed, i.e. strided) where
  M*N*K <= 2**31, only plain and both-transposed above that, to bound the run time;
* bit-exact small-integer cases on a subset of shapes (every output must equal the
  exact product);
* with --fuzz N: N random shapes per rung and dtype (half of them skinny, M up to
  256) and the decode set (every projection of MODEL_PROJECTIONS at every M of
  DECODE_M, weights K-major as linear passes them).

Prints progress, then a summary table at the END of stdout, and writes the
summary to --out as Markdown and JSON, both with the GPU, clocks, versions,
commit, kernel id and the random seed (--seed reproduces a run): per rung and
dtype the cases of each kind (random, fuzz, exact) and their failures, the worst
error and its case, and every failed case. The files are
``<date>-correctness.md/.json`` for a sweep of every rung that runs here and
``<date>-correctness-<rungs>.md/.json`` for the rungs of --kernels (``-quick``
before the rungs with --quick). One line per case, for a failure to dig into,
goes only where --cases names (a JSON file; leave it out of benchmarks/results,
it runs to megabytes).

Exit status: 0 all cases pass, 1 a case failed (or the time limit cut the sweep
short), 2 the sweep could not run (no CUDA GPU, unknown or unavailable kernel).

    python scripts/correctness_sweep.py                 # all available rungs
    python scripts/correctness_sweep.py --kernels naive --quick
    python scripts/correctness_sweep.py --seed S --cases /tmp/cases.json   # a run again, per case
"""

from __future__ import annotations

import argparse
import json
import math
import random
import secrets
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from harness.checks import (DECODE_M, DTYPE_NAMES, MODEL_PROJECTIONS, TOLERANCE, check_exact, exact_int_operands,
                            matmul_error, nan_count, poison, random_operands)
from harness.kernel import REPO_ROOT as REPO, load_kernel
from harness.provenance import environment, environment_lines, gpu_clocks
from harness.results import RESULTS_DIR, result_path

DEVICE = "cuda"
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
SIZES = [1, 7, 63, 64, 65, 127, 129, 1000, 4097]
K_SIZES = [1, 8, 63, 65, 1000, 4104]
EXACT_MN = [1, 65, 129, 1000]
EXACT_K = [1, 65, 4104]
# --quick: a smoke test of every code path in a few seconds.
QUICK_SIZES = [1, 65, 129]
QUICK_K_SIZES = [1, 65, 4104]
QUICK_EXACT_MN = [1, 129]
QUICK_EXACT_K = [1, 4104]

ALL_LAYOUTS = [(False, False), (True, False), (False, True), (True, True)]  # (a transposed, b transposed)
LARGE_LAYOUTS = [(False, False), (True, True)]
FULL_LAYOUT_LIMIT = 2**31  # M*N*K up to which all four layouts run

# For the run-time estimate: the naive rung, the slowest, runs about 5 TFLOP/s on
# bf16 on the H200; each case also pays launches, the fp64 reference and syncs.
ASSUMED_TFLOPS = 5.0
ASSUMED_CASE_OVERHEAD_S = 0.003
DEFAULT_BUDGET_S = 240.0


@dataclass
class Case:
    """One checked product and its outcome."""

    rung: str
    dtype: str
    kind: str  # "random" (normwise error) or "exact" (small integers, bit-exact)
    m: int
    n: int
    k: int
    a_transposed: bool
    b_transposed: bool
    bound: float | None = None  # the error bound (random cases)
    rel_error: float | None = None
    mismatches: int | None = None  # elements differing from the exact product (exact cases)
    nan_count: int | None = None
    passed: bool = False
    status: str = "not run"  # "pass", "fail", "error: ...", "not run"
    seconds: float | None = None
    fuzz: bool = False  # a random shape drawn by --fuzz, not one of the fixed sizes

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    def label(self) -> str:
        layout = f"{'aT' if self.a_transposed else 'a'}.{'bT' if self.b_transposed else 'b'}"
        kind = "fuzz" if self.fuzz else self.kind
        return f"{self.rung} {self.dtype} {kind} {self.m}x{self.n}x{self.k} {layout}"


def layouts_for(m: int, n: int, k: int, full_limit: float) -> list[tuple[bool, bool]]:
    return ALL_LAYOUTS if m * n * k <= full_limit else LARGE_LAYOUTS


def plan(rungs: dict[str, tuple], quick: bool, full_limit: float) -> list[Case]:
    """Every case of the sweep, in the order it runs (the order fixes the random inputs).

    ``rungs`` maps each rung to the dtypes it takes; other dtypes are not run for it.
    """
    sizes, k_sizes = (QUICK_SIZES, QUICK_K_SIZES) if quick else (SIZES, K_SIZES)
    exact_mn, exact_k = (QUICK_EXACT_MN, QUICK_EXACT_K) if quick else (EXACT_MN, EXACT_K)
    cases = []
    for rung, rung_dtypes in rungs.items():
        for dtype in [d for d in DTYPES if d in rung_dtypes]:
            name = DTYPE_NAMES[dtype]
            for m in sizes:
                for n in sizes:
                    for k in k_sizes:
                        for a_t, b_t in layouts_for(m, n, k, full_limit):
                            cases.append(Case(rung, name, "random", m, n, k, a_t, b_t, bound=TOLERANCE[dtype]))
            for m in exact_mn:
                for n in exact_mn:
                    for k in exact_k:
                        for a_t, b_t in layouts_for(m, n, k, full_limit):
                            cases.append(Case(rung, name, "exact", m, n, k, a_t, b_t))
    return cases


FUZZ_MAX_DIM = 5000
FUZZ_MAX_TOKENS = 256  # half the fuzz shapes are skinny: M (tokens) in 1..256, as while generating


def plan_fuzz(rungs: dict[str, tuple], count: int, seed: int) -> list[Case]:
    """`count` random shapes per rung and dtype: N, K uniform in 1..5000, M uniform in
    1..5000 for half of them and in 1..256 for the other half, random transposes,
    random normal inputs; reproducible from the seed."""
    rng = random.Random(seed)
    cases = []
    for rung, rung_dtypes in rungs.items():
        for dtype in [d for d in DTYPES if d in rung_dtypes]:
            for i in range(count):
                m = rng.randint(1, FUZZ_MAX_DIM if i % 2 == 0 else FUZZ_MAX_TOKENS)
                n, k = (rng.randint(1, FUZZ_MAX_DIM) for _ in range(2))
                a_t, b_t = rng.random() < 0.5, rng.random() < 0.5
                cases.append(Case(rung, DTYPE_NAMES[dtype], "random", m, n, k, a_t, b_t,
                                  bound=TOLERANCE[dtype], fuzz=True))
    return cases


# The decode set: (N, K) of real models' projections x M in DECODE_M, weights K-major
# as linear passes them; for every rung but naive (~5 TFLOP/s: a 70B projection
# at M = 256 alone would take seconds), bf16 and fp16.
def plan_decode_set(rungs: dict[str, tuple]) -> list[Case]:
    cases = []
    for rung, rung_dtypes in rungs.items():
        if rung == "naive":
            continue
        for dtype in [d for d in DTYPES if d in rung_dtypes and d != torch.float32]:
            for n, k in MODEL_PROJECTIONS.values():
                for m in DECODE_M:
                    cases.append(Case(rung, DTYPE_NAMES[dtype], "random", m, n, k, False, True,
                                      bound=TOLERANCE[dtype], fuzz=True))
    return cases


def estimate_seconds(cases: list[Case]) -> float:
    return sum(c.flops for c in cases) / (ASSUMED_TFLOPS * 1e12) + len(cases) * ASSUMED_CASE_OVERHEAD_S


def plan_within_budget(rungs: dict[str, tuple], quick: bool, budget_s: float) -> tuple[list[Case], float]:
    """The plan, with the four-layout limit lowered (by 8x a step) until the estimate fits."""
    full_limit = float(FULL_LAYOUT_LIMIT)
    cases = plan(rungs, quick, full_limit)
    while estimate_seconds(cases) > budget_s and full_limit >= 1:
        full_limit /= 8
        cases = plan(rungs, quick, full_limit)
    return cases, full_limit


DTYPE_BY_NAME = {name: dtype for dtype, name in DTYPE_NAMES.items()}


def run_case(pm, case: Case, gen: torch.Generator) -> None:
    """Run one case on the GPU and fill in its outcome."""
    dtype = DTYPE_BY_NAME[case.dtype]
    make = random_operands if case.kind == "random" else exact_int_operands
    a, b = make(case.m, case.n, case.k, dtype, DEVICE, case.a_transposed, case.b_transposed, generator=gen)
    out = poison(torch.empty(case.m, case.n, dtype=dtype, device=DEVICE))
    result = pm.matmul(a, b, kernel=case.rung, out=out)
    if result.data_ptr() != out.data_ptr():
        raise RuntimeError("matmul(..., out=out) did not return out")
    case.nan_count = nan_count(out)
    if case.kind == "random":
        case.rel_error = matmul_error(out, a, b)
        case.passed = case.nan_count == 0 and case.rel_error < case.bound
    else:
        case.mismatches = check_exact(out, a, b)
        case.passed = case.nan_count == 0 and case.mismatches == 0
    case.status = "pass" if case.passed else "fail"


def context_alive() -> bool:
    """False once a CUDA error (e.g. an illegal address) has broken the context for good."""
    try:
        torch.cuda.synchronize()
        torch.zeros(1, device=DEVICE).item()
        return True
    except Exception:  # noqa: BLE001
        return False


def run_sweep(pm, cases: list[Case], gen: torch.Generator, time_limit_s: float | None) -> str | None:
    """Run the cases in order, printing progress; returns why the sweep stopped early, if it did."""
    start = time.monotonic()
    failures_shown = 0
    group, group_start = None, start
    for index, case in enumerate(cases):
        if group_of(case) != group:
            if group is not None:
                print_group(cases, group, time.monotonic() - group_start)
            group, group_start = group_of(case), time.monotonic()
        if time_limit_s is not None and time.monotonic() - start > time_limit_s:
            return f"time limit of {time_limit_s:g} s reached after {index} of {len(cases)} cases"
        t0 = time.monotonic()
        try:
            run_case(pm, case, gen)
        except Exception as exc:  # noqa: BLE001 - record it and go on, unless CUDA is broken
            case.passed, case.status = False, f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            if not context_alive():
                print(f"  {case.label()}: {case.status}", flush=True)
                return f"CUDA context broken by {case.label()}: {case.status}"
        case.seconds = time.monotonic() - t0
        if not case.passed and failures_shown < 20:
            failures_shown += 1
            print(f"  FAIL {case.label()}: {describe_outcome(case)}", flush=True)
    print_group(cases, group, time.monotonic() - group_start)
    return None


def describe_outcome(case: Case) -> str:
    if case.status.startswith("error"):
        return case.status
    if case.kind == "random":
        return f"rel error {case.rel_error:.3g} (bound {case.bound:g}), {case.nan_count} NaN"
    return f"{case.mismatches} of {case.m * case.n} elements differ, {case.nan_count} NaN"


def group_of(case: Case) -> tuple[str, str, str]:
    """Progress lines group cases by rung, dtype and kind (fuzz apart from the fixed sizes)."""
    return case.rung, case.dtype, "fuzz" if case.fuzz else case.kind


def print_group(cases: list[Case], group: tuple, seconds: float) -> None:
    rung, dtype, kind = group
    done = [c for c in cases if group_of(c) == group and c.status != "not run"]
    failed = sum(not c.passed for c in done)
    extra = ""
    if kind in ("random", "fuzz") and done:
        extra = f", max rel error {max_error(done):.3g}"
    print(f"{rung:>10} {dtype} {kind:6}: {len(done)} cases, {failed} failed{extra} ({seconds:.1f} s)", flush=True)


def max_error(cases: list[Case]) -> float:
    errors = [c.rel_error if c.rel_error is not None else math.inf for c in cases]
    return max(errors, default=0.0)


# --------------------------------------------------------------------------- reporting


def summarize(cases: list[Case]) -> list[dict]:
    """One row per (rung, dtype)."""
    rows = []
    keys = sorted({(c.rung, c.dtype) for c in cases}, key=lambda rd: (rd[0], list(DTYPE_BY_NAME).index(rd[1])))
    for rung, dtype in keys:
        mine = [c for c in cases if (c.rung, c.dtype) == (rung, dtype)]
        rand = [c for c in mine if c.kind == "random" and c.status != "not run"]
        exact = [c for c in mine if c.kind == "exact" and c.status != "not run"]
        bound = TOLERANCE[DTYPE_BY_NAME[dtype]]
        worst = max(rand, key=lambda c: c.rel_error if c.rel_error is not None else math.inf, default=None)
        fuzz = [c for c in rand if c.fuzz]
        rows.append({
            "rung": rung,
            "dtype": dtype,
            "fuzz_cases": len(fuzz),
            "fuzz_failures": sum(not c.passed for c in fuzz),
            "random_cases": len(rand),
            "random_failures": sum(not c.passed for c in rand),
            "max_rel_error": max_error(rand) if rand else None,
            "bound": bound,
            "max_error_over_bound": max_error(rand) / bound if rand else None,
            "worst_case": worst.label() if worst else None,
            "exact_cases": len(exact),
            "exact_failures": sum(not c.passed for c in exact),
            "exact_mismatched_elements": sum(c.mismatches or 0 for c in exact),
            "outputs_with_nan": sum(1 for c in rand + exact if c.nan_count),
            "not_run": sum(c.status == "not run" for c in mine),
        })
    return rows


def fmt(value, spec: str = ".3g") -> str:
    return "-" if value is None else format(value, spec)


SUMMARY_HEADER = ("| rung | dtype | random cases | failed | of which fuzz (failed) | max rel error | bound "
                  "| max err/bound | exact cases | exact failed | mismatched elements | outputs with NaN | not run |")


def summary_table(rows: list[dict]) -> list[str]:
    lines = [SUMMARY_HEADER, "|" + "---|" * SUMMARY_HEADER.count(" | ") + "---|"]
    for r in rows:
        lines.append(
            f"| {r['rung']} | {r['dtype']} | {r['random_cases']} | {r['random_failures']} | "
            f"{r['fuzz_cases']} ({r['fuzz_failures']}) | "
            f"{fmt(r['max_rel_error'])} | {r['bound']:g} | {fmt(r['max_error_over_bound'], '.3f')} | "
            f"{r['exact_cases']} | {r['exact_failures']} | {r['exact_mismatched_elements']} | "
            f"{r['outputs_with_nan']} | {r['not_run']} |"
        )
    return lines


def json_safe(value):
    """inf / NaN as strings: JSON has no such numbers."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    return value


MAX_LISTED_FAILURES = 1000  # failed cases the summary JSON lists (it counts them all)


def failed_cases(cases: list[Case]) -> list[Case]:
    return [c for c in cases if not c.passed and c.status != "not run"]


def summary_json(report: dict, cases: list[Case]) -> str:
    """The report (its ``summary`` rows: cases and failures per rung, dtype and kind,
    the worst error and its case) with the failed cases, the first
    MAX_LISTED_FAILURES of them, as ``{field: value}``: kilobytes, whatever the
    sweep's size."""
    failed = failed_cases(cases)
    listed = [{f.name: getattr(c, f.name) for f in fields(Case)} | {"case": c.label()}
              for c in failed[:MAX_LISTED_FAILURES]]
    return json.dumps(json_safe(report | {"failures": len(failed), "failed_cases": listed}), indent=1) + "\n"


def cases_json(report: dict, cases: list[Case]) -> str:
    """Every case, for a failure to dig into: the report, then the cases as a
    table (``result_columns`` names the fields, ``results`` holds one row, a
    list, per case and line)."""
    columns = [f.name for f in fields(Case)]
    head = json.dumps(json_safe(report), indent=1)

    def short(value):  # 4 significant digits are plenty for errors and seconds
        return float(f"{value:.4g}") if isinstance(value, float) and math.isfinite(value) else value

    rows = ",\n  ".join(json.dumps(json_safe([short(getattr(c, name)) for name in columns])) for c in cases)
    return (head[:-2] + f',\n "result_columns": {json.dumps(columns)},\n "results": [\n  {rows}\n ]\n}}\n')


def write_reports(out_dir: Path, kind: str, report: dict, rows: list[dict], cases: list[Case],
                  cases_path: Path | None = None) -> list[Path]:
    """The summary as ``<date>-<kind>.md`` and ``.json`` in ``out_dir``, and every
    case to ``cases_path`` if given; returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    md_path = result_path(out_dir, kind, "md")
    json_path = md_path.with_suffix(".json")
    json_path.write_text(summary_json(report, cases))
    written = [md_path, json_path]
    if cases_path is not None:
        cases_path.parent.mkdir(parents=True, exist_ok=True)
        cases_path.write_text(cases_json(report, cases))
        written.append(cases_path)

    env = report["environment"]
    failed = failed_cases(cases)
    lines = [
        f"# Correctness sweep: {', '.join(report['rungs'])}{' (quick)' if report['quick'] else ''}",
        "",
        *environment_lines(env),
        f"- Clocks at the end: {report['clocks_end'] or 'unavailable'}",
        f"- Seed: {report['seed']} (reproduce: `{report['reproduce']}`)",
        f"- Cases: {report['cases']} in {report['wall_seconds']:.1f} s "
        f"(estimated {report['estimated_seconds']:.0f} s); all four layouts where M*N*K <= "
        f"{report['full_layout_limit']:.4g}, plain and both-transposed above",
        f"- Result: **{report['verdict']}**" + (f" ({report['stopped_early']})" if report["stopped_early"] else ""),
        "",
        "Random normal inputs vs an fp64 product of the same rounded inputs, normwise relative "
        "error `||out - ref||_F / max(||ref||_F, || |a| |b| ||_F / sqrt(K))` (the floor only matters "
        "when a few outputs cancel to near zero by chance); exact cases use small integers whose product is "
        "exactly representable and must match bit for bit. Outputs are poisoned with NaN first.",
        "",
        "## Summary",
        "",
        *summary_table(rows),
        "",
        "## Worst random case per rung and dtype",
        "",
        *[f"- {r['rung']} {r['dtype']}: {r['worst_case']}, rel error {fmt(r['max_rel_error'])}" for r in rows],
        "",
    ]
    if failed:
        lines += [f"## Failed cases ({len(failed)}; first 50)", ""]
        lines += [f"- {c.label()}: {describe_outcome(c)}" for c in failed[:50]]
        lines.append("")
    md_path.write_text("\n".join(lines))
    return written


# --------------------------------------------------------------------------- main


def result_kind(named_rungs: list[str], quick: bool) -> str:
    """The results' kind: ``correctness`` for every rung that runs here (the run of
    record), else ``correctness-<rungs>``; ``-quick`` for --quick. Rung names' underscores
    become hyphens, as a kind is [a-z0-9-] (benchmarks/results/README.md)."""
    parts = ["correctness", *(["quick"] if quick else []), *named_rungs]
    return "-".join(parts).replace("_", "-")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kernels", nargs="+", default=None,
                   help="rungs to check (space or comma separated); default: every rung available here")
    p.add_argument("--out", type=Path, default=RESULTS_DIR,
                   help="directory for the summary, Markdown and JSON (default: benchmarks/results/)")
    p.add_argument("--cases", type=Path, default=None, metavar="PATH",
                   help="also write every case (one line each) to this JSON file; megabytes for a full "
                        "sweep, so not into benchmarks/results/")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: a fresh one, printed)")
    p.add_argument("--quick", action="store_true", help="a small subset of shapes (smoke test)")
    p.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S,
                   help="target run time in seconds; fewer transposed layouts run if the estimate exceeds it")
    p.add_argument("--fuzz", type=int, default=0, metavar="N",
                   help="also N random shapes per rung and dtype (N, K in 1..5000, M in 1..5000 for half "
                        "and 1..256 for the other half, random transposes) and the decode set (real models' "
                        "projections at M = 1 ... 256, every rung but naive)")
    p.add_argument("--time-limit", type=float, default=None,
                   help="stop starting new cases after this many seconds (the rest count as not run)")
    return p.parse_args(argv)


def choose_rungs(pm, requested: list[str] | None) -> dict[str, tuple]:
    """The rungs to check, each with the dtypes it takes; raises SystemExit with a
    message for a bad request."""
    available = pm.available_kernels()
    if requested is None:
        names = [name for name, info in available.items() if info.available]
        if not names:
            reasons = "; ".join(f"{n}: {i.reason}" for n, i in available.items())
            raise SystemExit(f"error: no kernel rung runs on this GPU ({reasons})")
    else:
        names = [name for item in requested for name in item.split(",") if name]
        for name in names:
            if name not in available:
                raise SystemExit(f"error: unknown kernel {name!r}; this build has: {', '.join(available)}")
            if not available[name].available:
                raise SystemExit(f"error: kernel {name!r} does not run here: {available[name].reason}")
    return {name: tuple(available[name].dtypes) for name in names}


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("correctness_sweep.py needs a CUDA GPU, and torch sees none here "
              f"(torch {torch.__version__}, torch.cuda.is_available() is False). "
              "Run it on the device machine (scripts/device_run.sh).", file=sys.stderr)
        return 2
    try:
        pm, how = load_kernel(REPO)
        rungs = choose_rungs(pm, args.kernels)
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - a load failure is a setup problem: say it plainly
        print(f"error: could not load the kernel build from {REPO / 'build'}: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return 2

    seed = args.seed if args.seed is not None else secrets.randbits(63)
    torch.set_float32_matmul_precision("highest")  # no TF32 anywhere near the references
    env = environment(pm, how)
    print("\n".join(environment_lines(env)))
    print(f"- Seed: {seed}")

    fuzz_cases = plan_fuzz(rungs, args.fuzz, seed)
    cases, full_limit = plan_within_budget(rungs, args.quick, args.budget - estimate_seconds(fuzz_cases))
    # The decode set runs on the fast rungs only, whose time the naive rung's rate would overestimate 50x.
    cases += fuzz_cases + (plan_decode_set(rungs) if args.fuzz else [])
    estimate = estimate_seconds(cases)
    total_tflop = sum(c.flops for c in cases) / 1e12
    print(f"Plan: {len(cases)} cases, {total_tflop:.2f} TFLOP of matmul work; estimated {estimate:.0f} s "
          f"at {ASSUMED_TFLOPS:g} TFLOP/s + {ASSUMED_CASE_OVERHEAD_S * 1e3:.0f} ms a case "
          f"(budget {args.budget:.0f} s); four layouts where M*N*K <= {full_limit:.4g}", flush=True)

    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    start = time.monotonic()
    stopped = run_sweep(pm, cases, gen, args.time_limit)
    wall = time.monotonic() - start

    rows = summarize(cases)
    any_failed = any(c.status not in ("pass", "not run") for c in cases)
    result = "FAIL" if any_failed or stopped else "PASS"
    kind = result_kind(rungs if args.kernels else [], args.quick)
    reproduce = (f"python scripts/correctness_sweep.py --seed {seed} --kernels {' '.join(rungs)}"
                 f"{' --quick' if args.quick else ''}{f' --fuzz {args.fuzz}' if args.fuzz else ''}"
                 f"{f' --budget {args.budget:g}' if args.budget != DEFAULT_BUDGET_S else ''}")
    report = {
        "verdict": result,
        "stopped_early": stopped,
        "rungs": list(rungs),
        "quick": args.quick,
        "seed": seed,
        "reproduce": reproduce,
        "environment": env,
        "clocks_end": gpu_clocks(),
        "cases": len(cases),
        "total_tflop": total_tflop,
        "estimated_seconds": estimate,
        "wall_seconds": wall,
        "full_layout_limit": full_limit,
        "tolerance": {DTYPE_NAMES[d]: t for d, t in TOLERANCE.items()},
        "summary": rows,
    }
    written = write_reports(args.out, kind, report, rows, cases, args.cases)

    print()
    print(f"Wrote {', '.join(map(str, written))}")
    print(f"Sweep of {len(cases)} cases in {wall:.1f} s (estimated {estimate:.0f} s), seed {seed}"
          + (f"; STOPPED EARLY: {stopped}" if stopped else ""))
    print("\n".join(summary_table(rows)))
    print(f"RESULT: {result}")
    return 0 if result == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
