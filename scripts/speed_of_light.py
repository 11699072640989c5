"""How fast any wgmma_persistent-shaped kernel could be here: its k-loop alone, against torch.matmul.

    python scripts/speed_of_light.py [--shapes 4096x4096x4096 ...] [--ctas 132 128 120]
        [--rounds 9] [--seconds 2] [--rungs RUNG ...] [--builds BUILD ... | --no-kernel] [--out DIR]

benchmarks/speed_of_light.cu (compiled here with nvcc for sm_90a) runs the
consumers' k-loop of a 128 x 256 x 64 tile on shared memory filled once with
random bf16 data: the product's wgmmas and nothing else. Whatever else a real
kernel does (loads, barriers, stores) takes time or power from that, so under
the power limit its time bounds the real kernel's from below. Columns per shape:

- torch.matmul (cuBLAS), on rotated random operands as benchmark_table.py times it;
- wgmma_persistent, the package's kernel as users load it (unless --no-kernel),
  or that of each build folder in --builds (`kernelpress build` output, e.g.
  diagnostic builds beside the real one); with --rungs, those rungs of it
  (`--rungs tiled persistent wgmma wgmma_persistent` times the k-loop among the
  benchmark table's own columns: the clock of its short, interleaved batches
  follows the power of the whole mix, so a bound read beside other columns
  holds for that mix only);
- k-loop tiles@C: the k-blocks of the product's 128 x 256 tiles, whole tiles
  per CTA over C CTAs (wgmma_persistent's balance: at 4096^3, 512 tiles on
  132 CTAs make 4 rounds, the last 116 CTAs busy);
- k-loop even@C: the same k-blocks spread evenly (no CTA more than one
  k-block over another), for each C of --ctas: fewer SMs at the power limit
  run at a higher clock, so this asks what the SM count costs.

Two tables: the benchmark's timing (batches of ~2 ms in interleaved rounds,
median; ratio to torch.matmul in the same round order), then each column run
back to back for --seconds with nvidia-smi's SM clock and power
(scripts/sustained_run.py). Row-major B (the k-loop reads B N-major, as the
kernel does for it).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from harness.kernel import REPO_ROOT as ROOT, load_build, load_kernel, run_variant
from harness.provenance import command_line, environment, environment_lines, gpu_clocks
from harness.results import result_path
from harness.timing import (calls_per_batch, interleaved_times, parse_shape, rotated_inputs, time_per_call,
                            warm_up_gpu)
from sustained_run import sustained_columns

BM, BN, BK = 128, 256, 64  # hopper::WideTile
STAGE_BYTES, STAGES = (BM + BN) * BK * 2, 4
SMEM_BYTES = 1024 + STAGES * STAGE_BYTES
THREADS = 256
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8


def check(result: int, what: str) -> None:
    """Raise on a CUDA driver error code."""
    if result != 0:
        raise RuntimeError(f"{what} failed: CUDA driver error {result}")


class KLoop:
    """benchmarks/speed_of_light.cu's kernel, loaded through the driver API into torch's context."""

    def __init__(self, cubin: Path):
        self.driver = ctypes.CDLL("libcuda.so.1")
        torch.cuda.init()
        torch.empty(1, device="cuda")  # the runtime makes its primary context current here
        self.module, self.function = ctypes.c_void_p(), ctypes.c_void_p()
        check(self.driver.cuModuleLoad(ctypes.byref(self.module), str(cubin).encode()), "cuModuleLoad")
        check(self.driver.cuModuleGetFunction(ctypes.byref(self.function), self.module, b"wgmma_k_loop_b_nmajor"),
              "cuModuleGetFunction")
        check(self.driver.cuFuncSetAttribute(self.function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                             SMEM_BYTES), "cuFuncSetAttribute")
        self.random = torch.randn(STAGES * STAGE_BYTES // 2, device="cuda", dtype=torch.bfloat16)
        self.sink = torch.empty(1024 * THREADS, device="cuda", dtype=torch.float32)

    def launch(self, ctas: int, base: int, extra: int, extra_ctas: int, tile_kblocks: int) -> None:
        """CTA c runs `base` k-blocks, `extra` more if c < extra_ctas; tiles restart every tile_kblocks."""
        values = [ctypes.c_void_p(self.random.data_ptr()), ctypes.c_void_p(self.sink.data_ptr()),
                  ctypes.c_int(base), ctypes.c_int(extra), ctypes.c_int(extra_ctas), ctypes.c_int(tile_kblocks)]
        params = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        check(self.driver.cuLaunchKernel(self.function, ctas, 1, 1, THREADS, 1, 1, SMEM_BYTES, stream, params, None),
              "cuLaunchKernel")


def compile_cubin(out_dir: Path) -> Path:
    """nvcc benchmarks/speed_of_light.cu -> a sm_90a cubin in out_dir."""
    cubin = out_dir / "speed_of_light.cubin"
    subprocess.run(["nvcc", "-std=c++17", "-O3", "-cubin", "-arch=sm_90a", f"-I{ROOT / 'csrc'}",
                    str(ROOT / "benchmarks" / "speed_of_light.cu"), "-o", str(cubin)], check=True)
    return cubin


def k_loop_columns(kloop: KLoop, m: int, n: int, k: int, ctas: list[int], sms: int) -> dict:
    """The k-loop columns of one shape: name -> fn(i)."""
    tiles = -(-m // BM) * -(-n // BN)
    tile_kb = -(-k // BK)
    total = tiles * tile_kb
    whole = {"ctas": sms, "base": tiles // sms * tile_kb, "extra": tile_kb, "extra_ctas": tiles % sms}
    columns = {f"k-loop tiles@{sms}": whole}
    for c in ctas:
        columns[f"k-loop even@{c}"] = {"ctas": c, "base": total // c, "extra": 1, "extra_ctas": total % c}
    return {name: (lambda s: lambda i: kloop.launch(s["ctas"], s["base"], s["extra"], s["extra_ctas"], tile_kb))(s)
            for name, s in columns.items()}


def benchmark_rows(columns: dict, shape: tuple[int, int, int], rounds: int) -> list[dict]:
    """Each column timed as benchmark_table.py times it (batches of ~2 ms, `rounds`
    interleaved rounds in a seeded shuffled order, median): one row per column."""
    calls = {}
    for name, fn in columns.items():
        fn(0)
        torch.cuda.synchronize()
        calls[name] = calls_per_batch(time_per_call(fn, 1, 1))
    times = interleaved_times(columns, calls, dict.fromkeys(columns, 2), rounds)
    base = statistics.median(times["torch.matmul"])
    rows = []
    for name, ts in times.items():
        s = statistics.median(ts)
        rows.append({"shape": "x".join(map(str, shape)), "column": name, "timing": "benchmark", "us": s * 1e6,
                     "tflops": 2.0 * math.prod(shape) / s / 1e12, "ratio": base / s,
                     "spread": (max(ts) - min(ts)) / s})
    return rows


def sustained_rows(columns: dict, shape: tuple[int, int, int], seconds: float) -> list[dict]:
    """Each column back to back for `seconds`, with nvidia-smi's SM clock and power
    (sustained_run.py): one row per column, torch.matmul's first."""
    return [{"shape": "x".join(map(str, shape)), "column": name, "timing": "sustained", "us": s * 1e6,
             "tflops": 2.0 * math.prod(shape) / s / 1e12, "ratio": ratio, "sm_clock_mhz": clock, "power_w": power}
            for name, s, clock, power, ratio in sustained_columns(columns, seconds)]


def markdown(rows: list[dict]) -> str:
    """The rows as one Markdown table (clock and power only for sustained rows)."""
    lines = ["| shape | column | timing | us per call | TFLOP/s | ratio to torch.matmul | spread | SM clock (MHz) "
             "| power (W) |", "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        spread = f"{r['spread'] * 100:.1f}%" if "spread" in r else ""
        clock = f"{r['sm_clock_mhz']:.0f}" if "sm_clock_mhz" in r else ""
        power = f"{r['power_w']:.0f}" if "power_w" in r else ""
        lines.append(f"| {r['shape']} | {r['column']} | {r['timing']} | {r['us']:.1f} | {r['tflops']:.0f} | "
                     f"{r['ratio']:.3f} | {spread} | {clock} | {power} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=["4096x4096x4096", "8192x8192x8192"])
    parser.add_argument("--ctas", nargs="+", type=int, default=[132, 128, 120, 112])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--seconds", type=float, default=2.0, help="each column's sustained run (0: none)")
    parser.add_argument("--builds", type=Path, nargs="+", default=[],
                        help="build folders whose wgmma_persistent to time (default: this repo's, as users load it)")
    parser.add_argument("--rungs", nargs="+", default=["wgmma_persistent"],
                        help="rungs (or variants, as the benchmark names them) of each kernel to time")
    parser.add_argument("--no-kernel", action="store_true", help="time the k-loop and torch.matmul only")
    parser.add_argument("--out", type=Path,
                        help="write <date>-speed-of-light.md and .json (environment and rows) to this directory")
    args = parser.parse_args()
    if args.rounds < 1 or any(c < 1 for c in args.ctas):
        parser.error("--rounds and every --ctas must be at least 1")
    if args.builds and args.no_kernel:
        parser.error("--builds and --no-kernel exclude each other")
    for folder in args.builds:
        if not any(folder.glob("torch-*")):
            parser.error(f"{folder} holds no build (no torch-* variant folder; `kernelpress build` writes one)")
    if len({folder.name for folder in args.builds}) != len(args.builds):
        parser.error("--builds folders need distinct names (the table's columns are named after them)")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability(0) != (9, 0):
        parser.error("the k-loop is sm_90a code: this needs a compute capability 9.0 GPU (H100, H200)")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if max(args.ctas) > sms:
        parser.error(f"--ctas {max(args.ctas)}: this GPU has {sms} SMs, one CTA each")
    with tempfile.TemporaryDirectory() as tmp:
        kloop = KLoop(compile_cubin(Path(tmp)))
    kernels, how = {}, None  # column label (after the rung's name) -> loaded package; how the first loaded
    if args.builds:
        kernels, how = {f" ({folder.name})": load_build(folder) for folder in args.builds}, "kernels.get_local_kernel"
    elif not args.no_kernel:
        pm, how = load_kernel()
        kernels = {"": pm}
    env = environment(next(iter(kernels.values()), None), how)
    env["command"] = command_line()
    warm_up_gpu()  # first, so the header's SM clock and power are those under load
    env.update(gpu_clocks())
    rows = []
    for m, n, k in (parse_shape(s) for s in args.shapes):
        inputs = rotated_inputs(m, n, k, torch.bfloat16)
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        columns = {"torch.matmul": lambda i: torch.matmul(*inputs[i % len(inputs)], out=out)}
        for label, pm in kernels.items():
            for rung in args.rungs:
                columns[rung + label] = (lambda pm, rung: lambda i: run_variant(pm, rung, *inputs[i % len(inputs)],
                                                                                out))(pm, rung)
        columns.update(k_loop_columns(kloop, m, n, k, args.ctas, sms))
        rows += benchmark_rows(columns, (m, n, k), args.rounds)
        if args.seconds > 0:
            rows += sustained_rows(columns, (m, n, k), args.seconds)
        del inputs
        torch.cuda.empty_cache()
    text = "\n".join([*environment_lines(env), f"- k-loop: benchmarks/speed_of_light.cu, {sms} SMs; bf16, "
                      "B row-major K x N", "", markdown(rows), ""])
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        md_path = result_path(args.out, "speed-of-light", "md")
        md_path.write_text(text)
        md_path.with_suffix(".json").write_text(json.dumps({"environment": env, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
