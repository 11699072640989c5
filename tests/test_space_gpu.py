"""The Space's GPU functions (space/gpu_work.py) on a real GPU, without gradio:
a small benchmark and timeline, and their round trip through the recorded files.

Run on the device: ``python -m pytest -m gpu tests/test_space_gpu.py``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
REPO_ID = "persistent-matmul/persistent-matmul"
sys.path.insert(0, str(REPO / "space"))
pytest.importorskip("safetensors")


@pytest.mark.gpu
def test_gpu_work_on_gpu(monkeypatch, tmp_path):
    """On a GPU: a small benchmark and timeline, and both round-trip through the recorded files."""
    monkeypatch.setenv("LOCAL_KERNELS", f"{REPO_ID}={REPO}")
    import gpu_work
    import recorded

    result = gpu_work.run_benchmark(["naive", "warptiled", "tiled", "persistent"], "bfloat16",
                                    [(256, 384, 512), (16, 4096, 4096)])
    assert result["error"] is None
    rows = {(r["m"], r["rung"]): r for r in result["rows"]}
    assert rows[(256, "cuBLAS")]["ratio_vs_cublas"] == pytest.approx(1.0)
    for rung in ("naive", "tiled", "persistent"):
        r = rows[(256, rung)]
        assert r["tflops"] > 0 and r["rel_error"] < 1e-2, r
    assert rows[(256, "warptiled")]["tflops"] is None and "float32" in rows[(256, "warptiled")]["note"]
    timeline = gpu_work.run_timeline(1024, 1024, 256)
    assert timeline["error"] is None
    tiles = timeline["tile_config"]["tiles"]
    for name in ("tiled", "persistent"):
        kern = timeline["kernels"][name]
        assert len(kern["rows"]) == tiles and kern["ms"] > 0
        assert sorted((r[0], r[1]) for r in kern["rows"]) == sorted({(r[0], r[1]) for r in kern["rows"]})
    assert timeline["kernels"]["persistent"]["grid"] <= timeline["tile_config"]["persistent_ctas"]
    recorded.save_benchmark(result, tmp_path)
    recorded.save_timeline(timeline, tmp_path)
    assert recorded.load_benchmark(tmp_path)["rows"] == json.loads(json.dumps(result["rows"]))
    assert recorded.load_timeline(tmp_path)["kernels"]["tiled"]["rows"] == timeline["kernels"]["tiled"]["rows"]