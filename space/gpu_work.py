"""The GPU work of the Space: load the kernel, describe the device, benchmark, record timelines.

Every function here returns plain data (dicts, lists, numbers, strings), never
tensors or figures: on ZeroGPU the two ``spaces.GPU`` entry points
(``run_benchmark`` and ``run_timeline``) run in a forked worker and their results
are pickled back. Outside ZeroGPU (or without the ``spaces`` package) the
decorator does nothing. Inputs are validated by the caller (``validation.py``);
these functions assume sane shapes.

Timing follows the project's protocol (scripts/benchmark_table.py): CUDA events
around batches of back-to-back calls (batches of >= ~2 ms), a warm-up first,
the median of several batches, input sets rotated so they exceed the L2 cache.
The error is the normwise relative error ``||out - ref||_F / ||ref||_F`` against
an fp64 product of the same (rounded) inputs.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import statistics
import subprocess
import time
from pathlib import Path

try:  # ZeroGPU: must be imported before torch initialises CUDA.
    import spaces  # type: ignore[import-not-found]

    def gpu(duration):
        """``spaces.GPU(duration=...)``: on ZeroGPU, attach a GPU for the call. ``duration``
        is seconds, or a function of the call's arguments that returns them."""
        return spaces.GPU(duration=duration)
except ImportError:  # a plain machine: nothing to attach
    spaces = None

    def gpu(duration):  # noqa: ARG001 - same signature as the ZeroGPU one
        """No ``spaces`` package: a decorator that changes nothing."""
        return lambda fn: fn

import torch

import timeline_data

DEFAULT_REPO_ID = "persistent-matmul/persistent-matmul"
SPACE_DIR = Path(__file__).resolve().parent
CUBLAS = "cuBLAS"  # torch.matmul, the baseline every rung is compared with
# The kernels the Timeline tab compares (validation.TIMELINE_KERNELS); not imported
# from there so that the GPU worker needs nothing of the page.
TIMELINE_RUNGS = ("tiled", "persistent", "wgmma", "wgmma_persistent", "wgmma_streamk")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
L2_ROTATION_BYTES = 3 * 60 * 2**20  # input sets together exceed a 60 MB L2 three times
NAIVE_MAX_FLOP = 4.0e11  # the naive rung runs ~5 TFLOP/s: larger products would take seconds
GRAPH_OUTPUT_BYTES = 2**30  # what a captured graph's calls may write (each call its own output)
# For the ZeroGPU duration estimates: what a request costs besides its products
# (loading the kernel, the warm-up, environment()), the fixed cost of timing one
# (shape, column) eager and in a CUDA graph, and rates the slowest timed tensor-core
# rung of each dtype (float32: warptiled and cuBLAS without TF32) and the fp64
# reference beat on an H100 or a 60-SM H200 slice.
FIXED_SECONDS = 15.0
PER_COLUMN_SECONDS = 0.15
SLOW_TFLOPS = {"bfloat16": 60.0, "float16": 60.0, "float32": 15.0}
FP64_TFLOPS = 20.0
TIMED_CALLS = 40  # calls of a column that take the product's time: warm-up, probe, batches, graph

_KERNEL: dict = {}  # cache of load_kernel's result


# --------------------------------------------------------------------------- loading


def kernel_repo() -> tuple[str, int]:
    """The kernel's Hub repo id and version: env ``PM_KERNEL_REPO`` / ``PM_KERNEL_VERSION``,
    else the repo id in ``../build.toml`` (when the Space sits in the kernel repo), else
    the published id, version 1."""
    repo = os.environ.get("PM_KERNEL_REPO")
    if not repo:
        repo = DEFAULT_REPO_ID
        build_toml = SPACE_DIR.parent / "build.toml"
        if build_toml.is_file():
            import tomllib

            try:
                repo = tomllib.loads(build_toml.read_text())["general"]["hub"]["repo-id"]
            except (KeyError, ValueError, OSError):
                pass
    try:
        version = int(os.environ.get("PM_KERNEL_VERSION", "1"))
    except ValueError:
        version = 1
    return repo, version


def load_kernel():
    """``kernels.get_kernel(repo, version=...)`` once; returns ``(module or None, message)``.

    ``LOCAL_KERNELS="<repo>=<path>"`` makes kernels load a local build instead of the Hub.
    """
    if "result" not in _KERNEL:
        repo, version = kernel_repo()
        os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
        try:
            import kernels

            # trust only this repo (the default trusts just a few organisations)
            module = kernels.get_kernel(repo, version=version, trust_remote_code=[repo])
        except Exception as exc:  # noqa: BLE001 - any failure is shown in the UI, not raised
            _KERNEL["result"] = (None, f"could not load {repo} v{version}: {type(exc).__name__}: {exc}")
        else:
            variant = Path(module.__file__).resolve().parent.name
            local = any(e.split("=", 1)[0] == repo for e in os.environ.get("LOCAL_KERNELS", "").split(":") if e)
            where = "a local build (LOCAL_KERNELS)" if local else "the Hub"
            _KERNEL["result"] = (module, f"{repo} v{version}, variant {variant}, from {where}")
    return _KERNEL["result"]


def kernel_rungs() -> list[str]:
    """The loaded kernel's rungs (its ``KERNELS``), in its order; empty when it did not load."""
    pm, _ = load_kernel()
    return list(pm.KERNELS) if pm is not None else []


# --------------------------------------------------------------------------- device


def device_info() -> dict:
    """The GPU (name, SMs, capability) and, per rung, whether it runs here and why not.

    Without CUDA: ``{"gpu": None, "message": "no CUDA device", ...}``.
    """
    pm, kernel_message = load_kernel()
    info: dict = {"kernel": kernel_message, "kernel_loaded": pm is not None, "rungs": {}}
    info.update(gpu=None, sm_count=None, capability=None, message="no CUDA device")
    try:  # on ZeroGPU's main process CUDA may claim to exist without a device to query
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(torch.cuda.current_device())
            info.update(gpu=props.name, sm_count=props.multi_processor_count,
                        capability=f"{props.major}.{props.minor}", message=f"{props.name}")
        if pm is not None:
            for name, avail in pm.available_kernels().items():
                info["rungs"][name] = {
                    "available": bool(avail.available),
                    "reason": str(avail.reason),
                    "dtypes": [str(d).removeprefix("torch.") for d in avail.dtypes],
                }
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        info.update(gpu=None, sm_count=None, capability=None,
                    message=f"CUDA not usable in this process: {type(exc).__name__}: {exc}")
    info["rungs"][CUBLAS] = {
        "available": info["gpu"] is not None,
        "reason": "torch.matmul" if info["gpu"] else "no CUDA device",
        "dtypes": list(DTYPES),
    }
    return info


def _git_commit() -> str | None:
    """The commit the results belong to: HEAD of the checkout around the Space,
    else the commit the loaded kernel was built from (its metadata.json
    provenance; "(dirty)" when built from modified sources), else env
    ``PM_COMMIT``, else None."""
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=SPACE_DIR, capture_output=True,
                              text=True, timeout=10, check=True)
        return done.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        pass
    module, _ = load_kernel()
    if module is not None:
        try:
            metadata = json.loads((Path(module.__file__).resolve().parent / "metadata.json").read_text())
            kernel = metadata.get("provenance", {}).get("kernel", {})
            if kernel.get("commit"):
                return kernel["commit"] + (" (dirty)" if kernel.get("dirty") else "")
        except (OSError, ValueError):
            pass
    return os.environ.get("PM_COMMIT")


def _sm_clock() -> str | None:
    """The current SM clock from nvidia-smi (None where nvidia-smi is missing)."""
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10, check=True)
        return done.stdout.strip().splitlines()[0] or None
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def environment() -> dict:
    """Where a result was measured: date, GPU, SMs, SM clock, torch, CUDA, commit, kernel."""
    info = device_info()
    return {
        "date": datetime.date.today().isoformat(),
        "gpu": info["gpu"],
        "sm_count": info["sm_count"],
        "capability": info["capability"],
        "sm_clock": _sm_clock(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "commit": _git_commit(),
        "kernel": info["kernel"],
    }


# --------------------------------------------------------------------------- timing


def _warm_up(seconds: float) -> None:
    """Large products for a while, so the SM clock has left idle before measuring."""
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    while True:
        for _ in range(10):
            torch.matmul(a, a)
        end.record()
        end.synchronize()
        if start.elapsed_time(end) >= seconds * 1e3:
            return


def _time_per_call(fn, calls: int, batches: int) -> float:
    """Median seconds per call over ``batches`` batches of ``calls`` back-to-back calls."""
    times = []
    for _ in range(batches):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for i in range(calls):
            fn(i)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / calls)
    return statistics.median(times)


def _measure(fn) -> tuple[float, int]:
    """Seconds per call of ``fn(i)`` and the calls per batch: one call to warm up, a
    probe, then batches of >= ~2 ms."""
    fn(0)
    torch.cuda.synchronize()
    probe = _time_per_call(fn, 1, 1)
    calls = max(1, min(200, int(2e-3 / max(probe, 1e-7))))
    return _time_per_call(fn, calls, 7 if probe < 0.05 else 3), calls


# scripts/model_benchmark.py's `capture`, statement for statement (tests/test_space.py
# keeps them equal): the Space is uploaded without scripts/.
def _capture(fn, calls: int) -> torch.cuda.CUDAGraph:
    """A CUDA graph of ``fn(i)`` for i in range(calls), captured on a side stream after
    one warm-up call per i there, and replayed once."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(calls):
            fn(i)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for i in range(calls):
                fn(i)
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    return graph


def _host_seconds(fn, calls: int) -> float:
    """What one call costs the host: the time the loop of ``calls`` back-to-back
    calls takes to enqueue them, per call (model_benchmark.py's "enqueue")."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for i in range(calls):
        fn(i)
    seconds = (time.perf_counter() - start) / calls
    torch.cuda.synchronize()
    return seconds


def _graph_seconds(fn, calls: int, sets: int, out_bytes: int) -> float:
    """Seconds per call of ``fn`` replayed from one CUDA graph of several calls: the
    kernel's time without the host's launch cost."""
    graph_calls = max(1, min(calls, 4 * sets, GRAPH_OUTPUT_BYTES // max(1, out_bytes)))
    graph = _capture(fn, graph_calls)
    replays = max(1, calls // graph_calls)
    return _time_per_call(lambda _: graph.replay(), replays, 5) / graph_calls


def _rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Normwise relative error of ``out`` against the fp64 ``ref``."""
    denom = ref.norm().item()
    return (out.double() - ref).norm().item() / max(denom, 1e-300)


# --------------------------------------------------------------------------- benchmark


def _bench_shape(pm, m: int, n: int, k: int, dtype_name: str, rungs: list[str], available: dict,
                 weights_layout: bool = False) -> list[dict]:
    """Rows for one shape: cuBLAS first, then each requested rung (or why it did not run).
    ``weights_layout``: B is the transpose of N x K weights (K-contiguous), as in F.linear.
    Each column is timed eager (back-to-back calls: ``ms``, and the host's enqueue cost
    per call: ``host_us``) and replayed from a CUDA graph (``graph_ms``)."""
    dtype = DTYPES[dtype_name]
    flop = 2.0 * m * n * k
    set_bytes = (m * k + k * n) * torch.finfo(dtype).bits // 8
    sets = max(1, min(16, math.ceil(L2_ROTATION_BYTES / set_bytes)))

    def operand_b():
        return torch.randn(n, k, device="cuda", dtype=dtype).t() if weights_layout else \
            torch.randn(k, n, device="cuda", dtype=dtype)

    inputs = [(torch.randn(m, k, device="cuda", dtype=dtype), operand_b()) for _ in range(sets)]
    out_bytes = m * n * torch.finfo(dtype).bits // 8
    out = torch.empty(m, n, device="cuda", dtype=dtype)
    reference = torch.matmul(inputs[0][0].double(), inputs[0][1].double())
    base = {"m": m, "n": n, "k": k, "dtype": dtype_name, "layout": "weights" if weights_layout else "row-major"}
    rows = []
    for name in [CUBLAS, *rungs]:
        row = {**base, "rung": name, "ms": None, "tflops": None, "rel_error": None, "ratio_vs_cublas": None,
               "graph_ms": None, "host_us": None, "note": ""}
        rows.append(row)
        if name != CUBLAS:
            avail = available.get(name)
            if avail is None:
                row["note"] = "not in this kernel build"
                continue
            if not avail.available:
                row["note"] = f"does not run here: {avail.reason}"
                continue
            if dtype not in avail.dtypes:
                row["note"] = "takes " + ", ".join(str(d).removeprefix("torch.") for d in avail.dtypes) + " only"
                continue
            if name == "naive" and flop > NAIVE_MAX_FLOP:
                row["note"] = f"skipped: naive is slow, over {NAIVE_MAX_FLOP:.0e} FLOP"
                continue
        if name == CUBLAS:
            def fn(i):
                torch.matmul(*inputs[i % sets], out=out)
        else:
            def fn(i, name=name):
                pm.matmul(*inputs[i % sets], kernel=name, out=out)
        fn(0)
        torch.cuda.synchronize()
        row["rel_error"] = _rel_error(out, reference)
        seconds, calls = _measure(fn)
        row["ms"] = seconds * 1e3
        row["tflops"] = flop / seconds / 1e12
        row["host_us"] = _host_seconds(fn, calls) * 1e6
        try:
            row["graph_ms"] = _graph_seconds(fn, calls, sets, out_bytes) * 1e3
        except RuntimeError as exc:  # a capture failure is a result to show, not a failed request
            row["note"] = f"CUDA graph capture failed: {exc}"[:200]
    cublas = rows[0]["tflops"]
    for row in rows:
        if row["tflops"] is not None and cublas:
            row["ratio_vs_cublas"] = row["tflops"] / cublas
    del inputs, out, reference
    torch.cuda.empty_cache()
    return rows


def benchmark_seconds(rungs: list[str], dtype: str, shapes: list[tuple[int, int, int]],
                      weights_layout: bool = False, progress=None) -> int:
    """The GPU time to ask ZeroGPU for, from the work asked: a fixed cost (kernel load,
    warm-up), then per shape and column (cuBLAS and each rung) a fixed cost plus
    TIMED_CALLS products at the dtype's SLOW_TFLOPS, and an fp64 reference per shape. Rounded up;
    the caller rejects requests over validation.MAX_GPU_SECONDS. On the H200 the page's
    default (2 rungs + cuBLAS, 5 shapes, eager only) took 1.2 s once the kernel was loaded."""
    seconds = FIXED_SECONDS
    for m, n, k in shapes:
        flop = 2.0 * m * n * k
        columns = 1 + len([r for r in rungs if r != CUBLAS and not (r == "naive" and flop > NAIVE_MAX_FLOP)])
        seconds += columns * (PER_COLUMN_SECONDS + TIMED_CALLS * flop / (SLOW_TFLOPS[dtype] * 1e12))
        seconds += flop / (FP64_TFLOPS * 1e12)
    return math.ceil(seconds)


@gpu(duration=benchmark_seconds)
def run_benchmark(rungs: list[str], dtype: str, shapes: list[tuple[int, int, int]], weights_layout: bool = False,
                  progress=None) -> dict:
    """Time ``rungs`` and cuBLAS (torch.matmul, TF32 off) on each (m, n, k) in ``shapes``.

    Returns ``{"rows": [...], "environment": {...}, "error": str | None}``; each row is
    ``{m, n, k, rung, dtype, layout, ms, tflops, graph_ms, host_us, rel_error,
    ratio_vs_cublas, note}`` (numbers None with a ``note`` where a rung did not run).
    ``weights_layout``: B is the transpose of N x K weights, as in a model's linear
    layers. ``progress(fraction, desc)`` is called per shape when given.
    """
    if not torch.cuda.is_available():
        return {"rows": [], "environment": {}, "error": "no CUDA device"}
    pm, message = load_kernel()
    available = pm.available_kernels() if pm is not None else {}
    rungs = [r for r in rungs if r != CUBLAS]
    torch.backends.cuda.matmul.allow_tf32 = False
    _warm_up(0.5)
    rows = []
    for i, (m, n, k) in enumerate(shapes):
        if progress is not None:
            progress(i / len(shapes), f"{m}x{n}x{k}")
        rows += _bench_shape(pm, m, n, k, dtype, rungs, available, weights_layout)
    env = environment()
    return {"rows": rows, "environment": env, "error": None if pm is not None else message}


# --------------------------------------------------------------------------- timeline


def timeline_seconds(m: int, n: int, k: int, kernels=TIMELINE_RUNGS, dtype: str = "bfloat16") -> int:
    """The GPU time to ask ZeroGPU for a timeline: the fixed cost, then per kernel a
    fixed cost plus its instrumented runs and timed calls at the dtype's SLOW_TFLOPS."""
    flop = 2.0 * m * n * k
    return math.ceil(FIXED_SECONDS + len(kernels) * (PER_COLUMN_SECONDS
                                                      + TIMED_CALLS * flop / (SLOW_TFLOPS[dtype] * 1e12)))


def cluster_size(name: str, m: int, tile_config: dict) -> int:
    """The CTAs per cluster a rung launched for M rows, left to pick: the kernel's
    tile_config says (CUDA 12 builds never pair CTAs); from builds before it did,
    wgmma_persistent's rule (pairs of vertically adjacent tiles unless the output
    has one row of tiles); the others run single CTAs."""
    if "cluster_size" in tile_config:
        return int(tile_config["cluster_size"])
    return 2 if name == "wgmma_persistent" and m > 128 else 1


def _tile_config(pm, m: int, n: int, k: int, name: str) -> dict:
    """``pm.tile_config`` of rung ``name`` for an m x n x k product: with K, which
    wgmma_streamk's grid depends on, where the kernel's tile_config takes it (builds
    before its timeline did not)."""
    try:
        return pm.tile_config(m, n, kernel=name, k=k)
    except TypeError:
        return pm.tile_config(m, n, kernel=name)


@gpu(duration=timeline_seconds)
def run_timeline(m: int, n: int, k: int, kernels=TIMELINE_RUNGS, dtype: str = "bfloat16") -> dict:
    """Per-part timelines of ``kernels`` on one m x n x k product.

    Returns ``{"shape": [m, n, k], "dtype", "sm_count", "environment", "kernels": {name:
    {"parts": [[tile_m, tile_n, k_begin, k_end, sm, cta, start_ns, end_ns], ...],
    "grid", "ms", "note", "tile_config", "cluster_size"}}, "error"}``; a kernel that
    cannot run here (or has no instrumented build) has no parts and a note saying
    why. ``start_ns``/``end_ns`` are %globaltimer readings made relative to the
    kernel's first start; builds that record whole tiles give each the K-range
    [0, k). ``ms`` is the median time of the normal (uninstrumented) kernel. The
    result has passed ``timeline_data.validate`` (else ``error`` says what failed).
    """
    result: dict = {"shape": [m, n, k], "dtype": dtype, "kernels": {}, "error": None}
    if not torch.cuda.is_available():
        return {**result, "error": "no CUDA device"}
    pm, message = load_kernel()
    if pm is None:
        return {**result, "error": message}
    available = pm.available_kernels()
    torch_dtype = DTYPES[dtype]
    a = torch.randn(m, k, device="cuda", dtype=torch_dtype)
    b = torch.randn(k, n, device="cuda", dtype=torch_dtype)
    # wgmma_streamk reads B K-major (the weights of a linear layer, N x K,
    # transposed): given so, neither its timeline nor its time includes a copy.
    b_kmajor = torch.randn(n, k, device="cuda", dtype=torch_dtype).t() if "wgmma_streamk" in kernels else None
    out = torch.empty(m, n, device="cuda", dtype=torch_dtype)
    result["sm_count"] = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    columns = list(getattr(pm, "TIMELINE_COLUMNS", timeline_data.TILE_COLUMNS))
    _warm_up(0.3)
    for name in kernels:
        avail = available.get(name)
        entry = {"parts": [], "grid": 0, "ms": None, "note": "", "tile_config": {}, "cluster_size": 1}
        result["kernels"][name] = entry
        if avail is None or not avail.available or torch_dtype not in avail.dtypes:
            reason = "not in this build" if avail is None else avail.reason
            entry["note"] = f"{name} does not run here: {reason}"
            continue
        try:
            entry["tile_config"] = {key: int(v) for key, v in _tile_config(pm, m, n, k, name).items()}
        except ValueError:  # a rung without an instrumented build
            entry["note"] = f"{name} has no instrumented build in this kernel, so no timeline"
            continue
        b_rung = b_kmajor if name == "wgmma_streamk" else b
        pm.matmul_timeline(a, b_rung, kernel=name)  # warm the instrumented build
        _, timeline = pm.matmul_timeline(a, b_rung, kernel=name)
        torch.cuda.synchronize()
        t = timeline.cpu()
        start, end = columns.index("start_ns"), columns.index("end_ns")
        t = t[t[:, start] >= 0]  # rows still -1: records the kernel did not write (should be none)
        if len(t):
            t[:, [start, end]] -= int(t[:, start].min())
        entry["parts"] = timeline_data.parts_from_rows(t.tolist(), columns, k)
        entry["grid"] = len({p[timeline_data.CTA] for p in entry["parts"]})
        entry["cluster_size"] = cluster_size(name, m, entry["tile_config"])
        seconds, _ = _measure(lambda i, name=name, b_rung=b_rung: pm.matmul(a, b_rung, kernel=name, out=out))
        entry["ms"] = seconds * 1e3
    result["environment"] = environment()
    problems = timeline_data.timeline_problems(result)
    if problems:
        result["error"] = "the timeline fails its sanity check: " + "; ".join(problems)
    return result
