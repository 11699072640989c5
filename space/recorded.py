"""Results recorded on a real GPU, shown when the Space has none.

``<dir>/benchmark.json``: ``{"environment": {...}, "rows": [...]}`` as
``gpu_work.run_benchmark`` returns them.
``<dir>/timeline.safetensors``: int64 tensors ``tiled`` and ``persistent``
([tiles, 6], columns tile_m, tile_n, sm, cta, start_ns, end_ns) with string
metadata (shape, dtype, date, gpu, sm_count, commit, per-kernel ms and grid,
tile_config as JSON).

The directory is env ``PM_RECORDED_DIR``, else ``recorded/`` next to this file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

BENCHMARK_FILE = "benchmark.json"
TIMELINE_FILE = "timeline.safetensors"
TIMELINE_KERNELS = ("tiled", "persistent")


def recorded_dir() -> Path:
    """Where recorded results live."""
    return Path(os.environ.get("PM_RECORDED_DIR") or Path(__file__).resolve().parent / "recorded")


def load_benchmark(directory: Path | None = None) -> dict | None:
    """The recorded benchmark, or None when there is none (or it cannot be read)."""
    path = (directory or recorded_dir()) / BENCHMARK_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        return None
    data.setdefault("environment", {})
    return data


def save_benchmark(result: dict, directory: Path | None = None) -> Path:
    """Write ``{"environment", "rows"}`` of a benchmark result."""
    directory = directory or recorded_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / BENCHMARK_FILE
    path.write_text(json.dumps({"environment": result["environment"], "rows": result["rows"]}, indent=1) + "\n")
    return path


def save_timeline(result: dict, directory: Path | None = None) -> Path:
    """Write a ``gpu_work.run_timeline`` result as safetensors (tensors + string metadata)."""
    import torch
    from safetensors.torch import save_file

    directory = directory or recorded_dir()
    directory.mkdir(parents=True, exist_ok=True)
    env = result.get("environment", {})
    tensors, metadata = {}, {
        "shape": "x".join(map(str, result["shape"])),
        "dtype": result["dtype"],
        "date": str(env.get("date")),
        "gpu": str(env.get("gpu")),
        "sm_count": str(result.get("sm_count")),
        "commit": str(env.get("commit")),
        "torch": str(env.get("torch")),
        "cuda": str(env.get("cuda")),
        "kernel": str(env.get("kernel")),
        "tile_config": json.dumps(result.get("tile_config", {})),
    }
    for name in TIMELINE_KERNELS:
        kernel = result["kernels"][name]
        tensors[name] = torch.tensor(kernel["rows"], dtype=torch.int64).reshape(-1, 6)
        metadata[f"{name}_ms"] = str(kernel["ms"])
        metadata[f"{name}_grid"] = str(kernel["grid"])
    path = directory / TIMELINE_FILE
    save_file(tensors, str(path), metadata=metadata)
    return path


def load_timeline(directory: Path | None = None) -> dict | None:
    """The recorded timeline in ``run_timeline``'s format, or None when there is none."""
    from safetensors import safe_open

    path = (directory or recorded_dir()) / TIMELINE_FILE
    if not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}
        shape = [int(x) for x in meta["shape"].split("x")]
        kernels = {}
        for name in TIMELINE_KERNELS:
            rows = tensors[name].astype("int64").tolist()
            ms = meta.get(f"{name}_ms")
            kernels[name] = {
                "rows": rows,
                "columns": ["tile_m", "tile_n", "sm", "cta", "start_ns", "end_ns"],
                "grid": int(meta.get(f"{name}_grid") or len({r[3] for r in rows})),
                "ms": float(ms) if ms not in (None, "None", "") else None,
                "note": "",
            }
        return {
            "shape": shape,
            "dtype": meta.get("dtype", "bfloat16"),
            "sm_count": int(meta["sm_count"]),
            "tile_config": json.loads(meta.get("tile_config") or "{}"),
            "kernels": kernels,
            "environment": {key: meta.get(key) for key in ("date", "gpu", "commit", "torch", "cuda", "kernel")}
            | {"sm_count": meta.get("sm_count")},
            "error": None,
        }
    except (OSError, KeyError, ValueError, TypeError) as exc:
        return {"error": f"could not read {path.name}: {type(exc).__name__}: {exc}"}


def describe(env: dict) -> str:
    """One line naming where and when a recorded result was measured."""
    parts = [f"{env.get('gpu') or 'unknown GPU'}"]
    if env.get("sm_count"):
        parts.append(f"{env['sm_count']} SMs")
    if env.get("sm_clock"):
        parts.append(f"SM clock {env['sm_clock']}")
    for key in ("torch", "cuda"):
        if env.get(key):
            parts.append(f"{key} {env[key]}")
    if env.get("commit"):
        parts.append(f"commit {str(env['commit'])[:12]}")
    return f"recorded on {parts[0]} on {env.get('date') or 'an unknown date'} (" + ", ".join(parts[1:]) + ")"
