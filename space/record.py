"""Record the Space's results on a real GPU: the benchmark, and a timeline of every pair at every shape preset.

    LOCAL_KERNELS="persistent-matmul/persistent-matmul=$PWD" python space/record.py [--out DIR] [--skip-benchmark | --skip-timelines]

Runs ``gpu_work.run_benchmark`` (every rung: the square sweep and the LLM shapes in
bfloat16, float16 and float32 on the square sweep, and the Llama-3-8B and -70B
projection presets in the model layout, bfloat16) and ``gpu_work.run_timeline``
(every kernel of the Timeline tab's pairs at each of its shape presets; the replay
is drawn from the same data), and writes ``benchmark.json`` and
``timelines/<MxNxK>.safetensors`` to ``--out`` (default ``space/recorded/``), which
the app shows when it has no GPU. A timeline that fails ``timeline_data``'s sanity
check is reported and not written.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

# Run as `python space/record.py`, so space/ leads sys.path, as it does for app.py on the Hub.
import gpu_work
import recorded
import timeline_data
import validation

BENCHMARK_RUNS = (  # (dtype, preset)
    ("bfloat16", "square sweep 512..8192"), ("bfloat16", "LLM shapes"),
    ("float16", "square sweep 512..8192"), ("float32", "square sweep 512..8192"),
    *(("bfloat16", name) for name in validation.PRESETS if validation.weights_layout(name)),
)


def most_ctas(kern: dict, shape, sm_count: int) -> int:
    """The most CTAs a persistent or stream-K rung's launch may run: tile_config's
    persistent_ctas (one CTA's count), and for CTA pairs also a pair per two tile rows
    of each column, at most one CTA per SM; an odd number of tile rows with fewer
    tiles than SMs makes pairs run more CTAs than single CTAs would."""
    ctas = int(kern["tile_config"]["persistent_ctas"])
    cluster = int(kern.get("cluster_size") or 1)
    if cluster > 1:
        tiles_m, tiles_n = timeline_data.tile_grid(shape, kern["tile_config"])
        ctas = max(ctas, min(cluster * -(-tiles_m // cluster) * tiles_n, sm_count))
    return ctas


def timeline_problems(result: dict) -> list[str]:
    """What is wrong with a recorded timeline, if anything: timeline_data's check, and
    the persistent and stream-K rungs' CTA count against what their tile_config allows."""
    problems = timeline_data.timeline_problems(result)
    for name in ("persistent", "wgmma_persistent", "wgmma_streamk"):
        kern = result["kernels"].get(name)
        if not (kern and kern["parts"]):
            continue
        ctas = most_ctas(kern, result["shape"], int(result["sm_count"]))
        if kern["grid"] > ctas:
            problems.append(f"{name}: {kern['grid']} CTAs ran, at most {ctas} may (tile_config)")
    return problems


def record_benchmark(out: Path) -> int:
    # The page's default selection first, timed: the Space promises it finishes in seconds.
    start = time.monotonic()
    default = gpu_work.run_benchmark(["tiled", "persistent"], "bfloat16", validation.PRESETS[validation.DEFAULT_PRESET])
    print(f"default benchmark (tiled + persistent + cuBLAS, bf16, {validation.DEFAULT_PRESET}): "
          f"{time.monotonic() - start:.1f} s{' error: ' + default['error'] if default['error'] else ''}", flush=True)
    rungs = gpu_work.kernel_rungs()
    rows, env = [], None
    for dtype, preset in BENCHMARK_RUNS:
        shapes = validation.PRESETS[preset]
        layout = validation.weights_layout(preset)
        start = time.monotonic()
        result = gpu_work.run_benchmark(rungs, dtype, shapes, layout)
        print(f"benchmark {dtype} {preset}: {time.monotonic() - start:.1f} s (estimate for ZeroGPU: "
              f"{gpu_work.benchmark_seconds(rungs, dtype, shapes, layout)} s)", flush=True)
        if result["error"]:
            print(f"benchmark {dtype} {preset}: {result['error']}", file=sys.stderr)
            return 1
        rows += result["rows"]
        env = result["environment"]
        for r in result["rows"]:
            figures = r["note"]  # a rung that did not run: why
            if r["tflops"]:
                figures = (f"{r['tflops']:7.1f} TFLOP/s  x{r['ratio_vs_cublas']:.2f}  "
                           f"graph {_figure(r.get('graph_ms'), '.4f')} ms  host {_figure(r.get('host_us'), '.1f')} us  "
                           f"err {r['rel_error']:.1e} {r['note']}")
            print(f"{r['m']}x{r['n']}x{r['k']} {dtype:8} {r['rung']:16} {figures}", flush=True)
    print(f"wrote {recorded.save_benchmark({'environment': env, 'rows': rows}, out)}")
    return 0


def _figure(value, spec: str) -> str:
    """A measured figure for the log, or "n/a" where the run has none."""
    return "n/a" if value is None else format(value, spec)


def record_timelines(out: Path) -> int:
    failed = 0
    for preset, (m, n, k) in validation.TIMELINE_PRESETS.items():
        start = time.monotonic()
        result = gpu_work.run_timeline(m, n, k, validation.TIMELINE_KERNELS)
        print(f"timeline {preset}: {time.monotonic() - start:.1f} s (estimate for ZeroGPU: "
              f"{gpu_work.timeline_seconds(m, n, k, validation.TIMELINE_KERNELS)} s)", flush=True)
        if result["error"]:
            print(f"timeline {preset}: {result['error']}", file=sys.stderr)
            failed += 1
            continue
        for name, kern in result["kernels"].items():
            stats = (f"{len(kern['parts'])} parts, grid {kern['grid']}, cluster {kern['cluster_size']}, "
                     f"{_figure(kern['ms'], '.4f')} ms")
            print(f"  {name}: {stats if kern['parts'] else kern['note']}")
        problems = timeline_problems(result)
        if problems:
            print(f"timeline {preset}: sanity checks failed: {'; '.join(problems)}", file=sys.stderr)
            failed += 1
            continue
        print(f"  sanity checks passed; wrote {recorded.save_timeline(result, out)}", flush=True)
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=recorded.recorded_dir())
    parser.add_argument("--skip-benchmark", action="store_true", help="record the timelines only")
    parser.add_argument("--skip-timelines", action="store_true", help="record the benchmark only")
    args = parser.parse_args()
    info = gpu_work.device_info()
    if info["gpu"] is None or not info["kernel_loaded"]:
        print(f"record.py needs a CUDA GPU and the kernel: {info['message']}; {info['kernel']}", file=sys.stderr)
        return 2
    print(f"{info['gpu']} ({info['sm_count']} SMs); kernel: {info['kernel']}", flush=True)
    status = 0 if args.skip_benchmark else record_benchmark(args.out)
    return status or (0 if args.skip_timelines else record_timelines(args.out))


if __name__ == "__main__":
    sys.exit(main())
