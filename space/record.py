"""Record the Space's results on a real GPU: the default benchmark and the default timeline.

    LOCAL_KERNELS="persistent-matmul/persistent-matmul=$PWD" python space/record.py [--out DIR]

Runs ``gpu_work.run_benchmark`` (every rung, the square sweep and the LLM shapes,
bfloat16, plus the fp32 rungs in float32 on the square sweep) and
``gpu_work.run_timeline`` (the default timeline shape), and writes
``benchmark.json`` and ``timeline.safetensors`` to ``--out`` (default
``space/recorded/``), which the app shows when it has no GPU.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

# Run as `python space/record.py`, so space/ leads sys.path, as it does for app.py on the Hub.
import gpu_work
import recorded
import validation


def timeline_problems(result: dict) -> list[str]:
    """What is wrong with a recorded timeline, if anything."""
    cfg, sms = result["tile_config"], result["sm_count"]
    tiles_m = -(-result["shape"][0] // cfg["block_m"])
    tiles_n = -(-result["shape"][1] // cfg["block_n"])
    expected = sorted((i, j) for i in range(tiles_m) for j in range(tiles_n))
    problems = []
    for name, kern in result["kernels"].items():
        rows = kern["rows"]
        if sorted((r[0], r[1]) for r in rows) != expected:
            problems.append(f"{name}: tiles not each exactly once")
        if any(r[4] >= r[5] for r in rows):
            problems.append(f"{name}: a tile with start >= end")
        if any(not 0 <= r[2] < sms for r in rows):
            problems.append(f"{name}: an SM id outside 0..{sms - 1}")
    persistent = result["kernels"].get("persistent")
    if persistent and persistent["grid"] != cfg["persistent_ctas"]:
        problems.append(f"persistent: {persistent['grid']} CTAs ran, tile_config says {cfg['persistent_ctas']}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=recorded.recorded_dir())
    args = parser.parse_args()
    info = gpu_work.device_info()
    if info["gpu"] is None or not info["kernel_loaded"]:
        print(f"record.py needs a CUDA GPU and the kernel: {info['message']}; {info['kernel']}", file=sys.stderr)
        return 2
    print(f"{info['gpu']} ({info['sm_count']} SMs); kernel: {info['kernel']}", flush=True)
    # The page's default selection first, timed: the Space promises it finishes in seconds.
    start = time.monotonic()
    default = gpu_work.run_benchmark(["tiled", "persistent"], "bfloat16", validation.PRESETS[validation.DEFAULT_PRESET])
    print(f"default benchmark (tiled + persistent + cuBLAS, bf16, {validation.DEFAULT_PRESET}): "
          f"{time.monotonic() - start:.1f} s{' error: ' + default['error'] if default['error'] else ''}", flush=True)
    rungs = gpu_work.kernel_rungs()
    rows, env = [], None
    for dtype, preset in (("bfloat16", "square sweep 512..8192"), ("bfloat16", "LLM shapes"),
                          ("float16", "square sweep 512..8192"), ("float32", "square sweep 512..8192")):
        result = gpu_work.run_benchmark(rungs, dtype, validation.PRESETS[preset])
        if result["error"]:
            print(f"benchmark {dtype} {preset}: {result['error']}", file=sys.stderr)
            return 1
        rows += result["rows"]
        env = result["environment"]
        for r in result["rows"]:
            print(f"{r['m']}x{r['n']}x{r['k']} {dtype:8} {r['rung']:10} "
                  + (f"{r['tflops']:7.1f} TFLOP/s  x{r['ratio_vs_cublas']:.2f}  err {r['rel_error']:.1e}"
                     if r["tflops"] else r["note"]), flush=True)
    path = recorded.save_benchmark({"environment": env, "rows": rows}, args.out)
    print(f"wrote {path}")
    m, n, k = validation.DEFAULT_TIMELINE_SHAPE
    result = gpu_work.run_timeline(m, n, k)
    if result["error"]:
        print(f"timeline: {result['error']}", file=sys.stderr)
        return 1
    problems = timeline_problems(result)
    for name, kern in result["kernels"].items():
        print(f"timeline {name}: {len(kern['rows'])} tiles, grid {kern['grid']}, {kern['ms']} ms {kern['note']}")
    print("timeline sanity checks: " + ("; ".join(problems) if problems else "every tile exactly once, start < end, "
          "SM ids < SM count, persistent grid = tile_config's persistent_ctas"))
    if problems:
        return 1
    path = recorded.save_timeline(result, args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
