"""Results recorded on a real GPU, shown when the Space has none.

``<dir>/benchmark.json``: ``{"environment": {...}, "rows": [...]}`` as
``gpu_work.run_benchmark`` returns them.
``<dir>/timelines/<M>x<N>x<K>.safetensors``: one file per shape, as
``gpu_work.run_timeline`` returns it: an int64 tensor per kernel that ran (one
row per part, the columns named in the metadata: ``timeline_data.PART_COLUMNS``,
or ``TILE_COLUMNS`` for builds that record whole tiles) and string metadata
(shape, dtype, date, gpu, sm_count, commit, versions, and per kernel its ms,
grid, tile_config, cluster size and note as JSON). Files written before the
metadata named the kernels (one ``tile_config`` for all, ``<kernel>_ms`` and
``<kernel>_grid`` keys, whole tiles) read as well.

The directory is env ``PM_RECORDED_DIR``, else ``recorded/`` next to this file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import timeline_data

BENCHMARK_FILE = "benchmark.json"
TIMELINE_DIR = "timelines"
ENVIRONMENT_KEYS = ("date", "gpu", "commit", "torch", "cuda", "kernel", "sm_clock")


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


def shape_key(shape) -> str:
    """``"MxNxK"``: the name of a shape's timeline file and its key in ``load_timelines``."""
    return "x".join(str(int(d)) for d in shape)


def save_timeline(result: dict, directory: Path | None = None) -> Path:
    """Write a ``gpu_work.run_timeline`` result to ``timelines/<MxNxK>.safetensors``,
    after ``timeline_data.validate`` (a timeline that fails it is not saved)."""
    import torch
    from safetensors.torch import save_file

    timeline_data.validate(result)
    directory = (directory or recorded_dir()) / TIMELINE_DIR
    directory.mkdir(parents=True, exist_ok=True)
    env = result.get("environment", {})
    tensors, kernels = {}, {}
    for name, kern in result["kernels"].items():
        kernels[name] = {key: kern.get(key) for key in ("grid", "ms", "note", "tile_config", "cluster_size")}
        if kern.get("parts"):
            kernels[name]["columns"] = list(timeline_data.PART_COLUMNS)
            tensors[name] = torch.tensor(kern["parts"], dtype=torch.int64).reshape(-1, len(timeline_data.PART_COLUMNS))
    metadata = {key: str(env.get(key)) for key in ENVIRONMENT_KEYS} | {
        "shape": shape_key(result["shape"]),
        "dtype": result["dtype"],
        "sm_count": str(result["sm_count"]),
        "kernels": json.dumps(kernels),
    }
    path = directory / f"{shape_key(result['shape'])}.safetensors"
    save_file(tensors, str(path), metadata=metadata)
    return path


def _kernels_of(meta: dict, tensors: dict) -> dict[str, dict]:
    """Per kernel: grid, ms, note, tile_config, cluster size and columns, from the
    metadata's ``kernels`` JSON or, in older files, from per-kernel keys."""
    if "kernels" in meta:
        return json.loads(meta["kernels"])
    shared = json.loads(meta.get("tile_config") or "{}")
    return {name: {"grid": meta.get(f"{name}_grid"), "ms": meta.get(f"{name}_ms"), "note": "",
                   "tile_config": shared, "cluster_size": 1, "columns": list(timeline_data.TILE_COLUMNS)}
            for name in tensors}


def _number(value, kind):
    return None if value in (None, "None", "") else kind(value)


def load_timeline_file(path: Path) -> dict:
    """One timeline file in ``run_timeline``'s format, checked by ``timeline_data.validate``;
    ``{"error": ...}`` when it cannot be read or fails the check."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata() or {}
            tensors = {name: f.get_tensor(name).astype("int64").tolist() for name in f.keys()}
        shape = [int(x) for x in meta["shape"].split("x")]
        kernels = {}
        for name, info in _kernels_of(meta, tensors).items():
            rows = tensors.get(name, [])
            columns = info.get("columns") or timeline_data.PART_COLUMNS
            kernels[name] = {
                "parts": timeline_data.parts_from_rows(rows, columns, shape[2]),
                "grid": _number(info.get("grid"), int) or len({r[columns.index("cta")] for r in rows}
                                                                if "cta" in columns else []),
                "ms": _number(info.get("ms"), float),
                "note": info.get("note") or "",
                "tile_config": info.get("tile_config") or {},
                "cluster_size": int(info.get("cluster_size") or 1),
            }
        result = {
            "shape": shape,
            "dtype": meta.get("dtype", "bfloat16"),
            "sm_count": int(meta["sm_count"]),
            "kernels": kernels,
            "environment": {key: meta.get(key) for key in ENVIRONMENT_KEYS if meta.get(key) not in (None, "None")}
            | {"sm_count": int(meta["sm_count"])},
            "error": None,
        }
        return timeline_data.validate(result)
    except (OSError, KeyError, ValueError, TypeError, SafetensorError) as exc:  # SafetensorError: not a safetensors file
        return {"error": f"could not read {path.name}: {type(exc).__name__}: {exc}"}


def load_timelines(directory: Path | None = None) -> dict[str, dict]:
    """Every recorded timeline, keyed by ``"MxNxK"`` (``shape_key``); empty when there are none."""
    folder = (directory or recorded_dir()) / TIMELINE_DIR
    found = {}
    for path in sorted(folder.glob("*.safetensors")) if folder.is_dir() else []:
        found[path.stem] = load_timeline_file(path)
    return found


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
