"""The Space's GPU functions (space/gpu_work.py) on a real GPU, without gradio:
a small benchmark and timeline, and their round trip through the recorded files.

Run on the device: ``python -m pytest -m gpu tests/test_space_gpu.py``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from matmul_checks import built_with_cuda12

REPO = Path(__file__).resolve().parent.parent
REPO_ID = "persistent-matmul/persistent-matmul"
sys.path.insert(0, str(REPO / "space"))
pytest.importorskip("safetensors")


@pytest.mark.gpu
def test_gpu_work_on_gpu(monkeypatch, tmp_path):
    """On a GPU: a small benchmark and timeline, and both round-trip through the recorded files."""
    monkeypatch.setenv("LOCAL_KERNELS", f"{REPO_ID}={REPO}")
    import torch

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
    assert all(rows[(256, r)]["graph_ms"] > 0 and rows[(256, r)]["host_us"] > 0 for r in ("cuBLAS", "tiled"))
    weights = gpu_work.run_benchmark(["tiled", "splitk"], "bfloat16", [(16, 4096, 4096)], weights_layout=True)
    assert all(r["layout"] == "weights" and r["rel_error"] < 1e-2 for r in weights["rows"]), weights["rows"]
    timeline = gpu_work.run_timeline(1024, 1024, 256)
    assert timeline["error"] is None  # run_timeline has run timeline_data's sanity check
    assert timeline["sm_count"] == torch.cuda.get_device_properties(0).multi_processor_count
    hopper = torch.cuda.get_device_capability() == (9, 0)
    for name in ("tiled", "persistent") + (("wgmma", "wgmma_persistent", "wgmma_streamk") if hopper else ()):
        kern = timeline["kernels"][name]
        assert len({(p[0], p[1]) for p in kern["parts"]}) == kern["tile_config"]["tiles"] and kern["ms"] > 0, name
        assert kern["grid"] <= max(kern["tile_config"]["persistent_ctas"], kern["tile_config"]["tiles"])
    if hopper:
        # M = 1024: pairs of tile rows, where the build has them (not CUDA 12 builds)
        pm, _ = gpu_work.load_kernel()
        expected = 1 if built_with_cuda12(Path(pm.__file__).parent) else 2
        assert timeline["kernels"]["wgmma_persistent"]["cluster_size"] == expected
        # A decode shape: the cut splits every tile (32 of 128 weight rows, or 64 of 64 rows
        # where those fill more SMs: pairs on 132 SMs) into parts on several SMs.
        import timeline_data

        decode = gpu_work.run_timeline(16, 4096, 4096, ("wgmma_streamk",))
        assert decode["error"] is None, decode["error"]
        streamk = decode["kernels"]["wgmma_streamk"]
        cfg = streamk["tile_config"]
        assert cfg["block_m"] == 16 and cfg["block_n"] in (64, 128) and cfg["tiles"] == 4096 // cfg["block_n"]
        if timeline["sm_count"] == 132:
            assert (cfg["block_n"], cfg["cluster_size"]) == (64, 2), cfg
        assert timeline_data.split_tiles(streamk["parts"]) == cfg["tiles"] and streamk["ms"] > 0
        assert streamk["grid"] == streamk["tile_config"]["persistent_ctas"]
    else:
        assert "does not run here" in timeline["kernels"]["wgmma"]["note"]
    recorded.save_benchmark(result, tmp_path)
    recorded.save_timeline(timeline, tmp_path)
    assert recorded.load_benchmark(tmp_path)["rows"] == json.loads(json.dumps(result["rows"]))
    loaded = recorded.load_timelines(tmp_path)["1024x1024x256"]
    assert loaded["kernels"]["tiled"]["parts"] == timeline["kernels"]["tiled"]["parts"]
