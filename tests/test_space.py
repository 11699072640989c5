"""The Gradio Space (space/), on CPU: start it, call its API, check recorded data and input checks.

The app runs in a subprocess on a free port with ``LOCAL_KERNELS`` pointing at
this repo, ``PM_RECORDED_DIR`` at a temporary directory holding PLACEHOLDER
results this module writes (clearly fake: GPU "PLACEHOLDER GPU"), and
``PM_RECORDED_ONLY=1`` so it shows the recording even on a GPU machine.
"""

from __future__ import annotations

import csv
import importlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SPACE = REPO / "space"
REPO_ID = "persistent-matmul/persistent-matmul"
PLACEHOLDER_GPU = "PLACEHOLDER GPU (test data)"
READY_TIMEOUT_S = 60

sys.path.insert(0, str(SPACE))
pytest.importorskip("gradio")
pytest.importorskip("safetensors")


# --------------------------------------------------------------------------- placeholder data


def placeholder_timeline(sm_count: int = 8, tiles: int = 36, ctas_per_sm: int = 2) -> dict:
    """A synthetic run_timeline result: tiled runs one CTA per tile in waves of
    sm_count*ctas_per_sm; persistent runs that many CTAs, each looping over tiles."""
    slots = sm_count * ctas_per_sm
    tile_ns, startup_ns = 1000, 300

    def rows(persistent: bool) -> list[list[int]]:
        out = []
        for t in range(tiles):
            slot, wave = t % slots, t // slots
            sm = slot % sm_count
            cost = tile_ns + (0 if persistent and wave else startup_ns)
            start = wave * (tile_ns + (0 if persistent else startup_ns)) + (startup_ns if persistent and wave else 0)
            out.append([t // 6, t % 6, sm, slot if persistent else t, start, start + cost])
        return out

    env = {"date": "2000-01-01", "gpu": PLACEHOLDER_GPU, "sm_count": sm_count, "commit": "0" * 40,
           "torch": "placeholder", "cuda": "placeholder", "kernel": "placeholder"}
    return {
        "shape": [640, 640, 256], "dtype": "bfloat16", "sm_count": sm_count,
        "tile_config": {"block_m": 128, "block_n": 128, "block_k": 32, "tiles": tiles, "persistent_ctas": slots},
        "kernels": {"tiled": {"rows": rows(False), "grid": tiles, "ms": 0.004, "note": ""},
                    "persistent": {"rows": rows(True), "grid": slots, "ms": 0.003, "note": ""}},
        "environment": env, "error": None,
    }


def placeholder_benchmark() -> dict:
    """A synthetic run_benchmark result over two shapes (bfloat16) and one float32 row."""
    rows = []
    for m, n, k in [(512, 512, 512), (1024, 1024, 1024)]:
        for rung, tflops in [("cuBLAS", 100.0), ("tiled", 30.0), ("persistent", 40.0)]:
            rows.append({"m": m, "n": n, "k": k, "dtype": "bfloat16", "rung": rung, "ms": 2 * m * n * k / tflops / 1e9,
                         "tflops": tflops, "rel_error": 1e-3, "ratio_vs_cublas": tflops / 100.0, "note": ""})
    rows.append({"m": 512, "n": 512, "k": 512, "dtype": "float32", "rung": "cuBLAS", "ms": 0.1, "tflops": 2.7,
                 "rel_error": 1e-7, "ratio_vs_cublas": 1.0, "note": ""})
    env = {"date": "2000-01-01", "gpu": PLACEHOLDER_GPU, "sm_count": 8, "sm_clock": "1 MHz",
           "torch": "placeholder", "cuda": "placeholder", "commit": "0" * 40}
    return {"environment": env, "rows": rows}


def write_placeholders(directory: Path) -> Path:
    """benchmark.json and timeline.safetensors with placeholder data in ``directory``."""
    import recorded

    recorded.save_benchmark(placeholder_benchmark(), directory)
    recorded.save_timeline(placeholder_timeline(), directory)
    return directory


# --------------------------------------------------------------------------- the server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def app_env(recorded_dir: Path, port: int) -> dict:
    env = dict(os.environ)
    env.update(GRADIO_SERVER_PORT=str(port), GRADIO_SERVER_NAME="127.0.0.1", GRADIO_ANALYTICS_ENABLED="False",
               LOCAL_KERNELS=f"{REPO_ID}={REPO}", PM_RECORDED_DIR=str(recorded_dir), PM_RECORDED_ONLY="1",
               HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1", MPLBACKEND="Agg")
    return env


def start_app(recorded_dir: Path, log: Path):
    """Start ``python space/app.py``; returns (process, url, seconds until /gradio_api/info answered)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    start = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, str(SPACE / "app.py")], cwd=REPO, env=app_env(recorded_dir, port),
                                stdout=out, stderr=subprocess.STDOUT)
    while time.monotonic() - start < READY_TIMEOUT_S:
        if proc.poll() is not None:
            raise AssertionError(f"the app exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(url + "gradio_api/info", timeout=2) as r:
                if r.status == 200:
                    return proc, url, time.monotonic() - start
        except OSError:
            time.sleep(0.25)
    proc.terminate()
    raise AssertionError(f"the app did not answer within {READY_TIMEOUT_S} s:\n{log.read_text()[-4000:]}")


def stop_app(proc) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="module")
def space(tmp_path_factory):
    """The running app: (url, seconds to ready), with placeholder recorded results."""
    directory = write_placeholders(tmp_path_factory.mktemp("recorded"))
    proc, url, ready_s = start_app(directory, tmp_path_factory.mktemp("log") / "app.log")
    print(f"\nSpace API ready after {ready_s:.1f} s at {url}")
    yield url, ready_s
    stop_app(proc)


@pytest.fixture(scope="module")
def client(space):
    from gradio_client import Client

    return Client(space[0], verbose=False)


# --------------------------------------------------------------------------- API tests


def test_page_and_api_answer(space):
    url, ready_s = space
    start = time.monotonic()
    with urllib.request.urlopen(url, timeout=10) as r:
        html = r.read().decode()
    print(f"page HTML served in {time.monotonic() - start:.2f} s (API ready after {ready_s:.1f} s)")
    assert "<html" in html.lower()
    with urllib.request.urlopen(url + "gradio_api/info", timeout=10) as r:
        info = json.load(r)
    assert {"/benchmark", "/timeline"} <= set(info["named_endpoints"])


def test_recorded_benchmark(client):
    status, plot, table, summary, csv_file, json_file = client.predict(
        ["tiled", "persistent"], "bfloat16", "square sweep 512..8192", "", api_name="/benchmark")
    assert "Cannot run live" in status and "Recorded results" in status and PLACEHOLDER_GPU in status
    assert plot, "no figure came back"
    data = table["data"] if isinstance(table, dict) else table
    assert [row[2] for row in data] == ["cuBLAS", "tiled", "persistent"] * 2
    assert all(row[1] == "bfloat16" for row in data)
    assert "persistent / tiled" in summary and "1.33x" in summary
    with open(csv_file, newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 6 and float(rows[2]["tflops"]) == 40.0
    saved = json.loads(Path(json_file).read_text())
    assert saved["environment"]["gpu"] == PLACEHOLDER_GPU and len(saved["rows"]) == 6


def test_recorded_benchmark_other_dtype(client):
    status, _, table, _, _, _ = client.predict(["naive"], "float32", "LLM shapes", "", api_name="/benchmark")
    data = table["data"] if isinstance(table, dict) else table
    assert [row[2] for row in data] == ["cuBLAS"] and data[0][1] == "float32"
    assert "Recorded results" in status


def test_recorded_timeline(client):
    status, plot, summary = client.predict("4608", "4608", "2048", api_name="/timeline")
    assert "Recorded timeline" in status and PLACEHOLDER_GPU in status
    assert plot
    assert "| tiled |" in summary and "| persistent |" in summary and "idle SM-time" in summary
    assert "**36 tiles**" in summary


@pytest.mark.parametrize(("custom", "expected"), [
    ("abc", "is not a shape"),
    ("4096xfooX16", "is not a number"),
    ("0x16x16", "must be at least 1"),
    ("-4x16x16", "must be at least 1"),
    ("16385x16x16", "over the cap"),
    ("1.5x16x16", "not a whole number"),
    ("", "No custom shapes"),
    (", ".join(["16x16x16"] * 9), "at most 8"),
    ("16384x16384x16384, 16384x16384x16384", "cap per request"),
])
def test_benchmark_rejects_bad_shapes(client, custom, expected):
    status = client.predict(["tiled"], "bfloat16", "custom", custom, api_name="/benchmark")[0]
    assert status.startswith("⚠️") and expected in status, status


@pytest.mark.parametrize(("mnk", "expected"), [
    (("abc", "16", "16"), "is not a number"),
    (("16", "0", "16"), "must be at least 1"),
    (("16", "16", "-3"), "must be at least 1"),
    (("99999", "16", "16"), "over the cap"),
    (("", "16", "16"), "is empty"),
    (("16384", "16384", "16384"), "cap per request"),
])
def test_timeline_rejects_bad_input(client, mnk, expected):
    status = client.predict(*mnk, api_name="/timeline")[0]
    assert status.startswith("⚠️") and expected in status, status


def test_custom_good_shapes_reach_the_recording(client):
    status = client.predict(["persistent"], "bfloat16", "custom", "64x64x64; 128 x 128 x 128",
                            api_name="/benchmark")[0]
    assert not status.startswith("⚠️") and "Recorded results" in status


# --------------------------------------------------------------------------- in-process


def test_app_without_recorded_results(tmp_path, monkeypatch, pm):
    """No recorded files: the app still builds and says so instead of failing. The rungs
    it offers are the kernel's, and each button's outputs are its view's fields in order."""
    monkeypatch.setenv("PM_RECORDED_DIR", str(tmp_path))
    monkeypatch.setenv("PM_RECORDED_ONLY", "1")
    monkeypatch.setenv("LOCAL_KERNELS", f"{REPO_ID}={REPO}")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    sys.modules.pop("app", None)
    app = importlib.import_module("app")
    try:
        assert "no recorded results yet" in app.header_markdown()
        assert app.STATE["rungs"] == list(pm.KERNELS)
        demo = app.build()
        outputs = {fn.api_name: [block.elem_id for block in fn.outputs] for fn in demo.fns.values()}
        assert len(outputs["benchmark"]) == len(app.BenchmarkView._fields)
        assert outputs["benchmark"][:3] == ["benchmark-status", "benchmark-plot", "benchmark-table"]
        assert outputs["timeline"] == ["timeline-status", "timeline-plot", "timeline-summary"]
        assert list(app.TimelineView._fields) == ["status", "figure", "summary"]
        view = app.benchmark(["tiled"], "bfloat16", "LLM shapes", "", progress=None)
        assert "No recorded benchmark yet" in view.status and view.csv is None
        assert "No timeline to show" in app.timeline("64", "64", "64").status
        monkeypatch.setattr(app, "_warn", lambda message: f"⚠️ {message}")  # gr.Warning needs a request
        unknown = app.benchmark(["fastest"], "bfloat16", "LLM shapes", "", progress=None).status
        assert "Unknown rung(s): fastest; choose from " + ", ".join(pm.KERNELS) in unknown
    finally:
        sys.modules.pop("app", None)


def test_timeline_stats_on_placeholder():
    import plots

    data = placeholder_timeline()
    tiled = plots.timeline_stats(data["kernels"]["tiled"]["rows"], 8)
    persistent = plots.timeline_stats(data["kernels"]["persistent"]["rows"], 8)
    assert tiled["tiles"] == persistent["tiles"] == 36
    # 36 tiles on 16 slots (8 SMs x 2): the third wave has 4 tiles, so SMs 4-7 sit idle (a tail)
    assert tiled["tail_us"] > 0 and 0 < tiled["idle_fraction"] < 1
    assert persistent["span_us"] < tiled["span_us"]
    assert plots.waves("persistent", data["kernels"]["persistent"]["rows"], 16)[-1] == 2


def test_recorded_roundtrip(tmp_path):
    import recorded

    write_placeholders(tmp_path)
    bench, timeline = recorded.load_benchmark(tmp_path), recorded.load_timeline(tmp_path)
    assert bench == json.loads(json.dumps(placeholder_benchmark()))
    original = placeholder_timeline()
    for name in ("tiled", "persistent"):
        assert timeline["kernels"][name]["rows"] == original["kernels"][name]["rows"]
        assert timeline["kernels"][name]["grid"] == original["kernels"][name]["grid"]
    assert timeline["shape"] == [640, 640, 256] and timeline["sm_count"] == 8
    assert timeline["environment"]["gpu"] == PLACEHOLDER_GPU
    assert recorded.load_benchmark(tmp_path / "missing") is None and recorded.load_timeline(tmp_path / "x") is None


# --------------------------------------------------------------------------- gpu_work, card


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def test_gpu_work_without_gpu(monkeypatch):
    """No CUDA: device_info says so per rung, the entry points return an error, not raise."""
    if _cuda():
        pytest.skip("this machine has a GPU; the GPU test below covers it")
    monkeypatch.setenv("LOCAL_KERNELS", f"{REPO_ID}={REPO}")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import gpu_work

    info = gpu_work.device_info()
    assert info["kernel_loaded"], info["kernel"]
    assert info["gpu"] is None and info["message"] == "no CUDA device"
    assert list(info["rungs"]) == [*gpu_work.kernel_rungs(), "cuBLAS"] and "naive" in info["rungs"]
    assert all(not r["available"] and "CUDA" in r["reason"] for r in info["rungs"].values())
    assert gpu_work.run_benchmark(["tiled"], "bfloat16", [(64, 64, 64)])["error"] == "no CUDA device"
    assert gpu_work.run_timeline(64, 64, 64)["error"] == "no CUDA device"


def test_space_card_and_requirements():
    card = (SPACE / "README.md").read_text()
    assert card.startswith("---\n")
    front = dict(line.split(": ", 1) for line in card.split("---\n")[1].splitlines() if ": " in line)
    assert front["sdk"] == "gradio" and front["app_file"] == "app.py" and front["license"] == "apache-2.0"
    assert len(front["short_description"]) < 60
    pins = dict(line.split("==") for line in (SPACE / "requirements.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    assert front["sdk_version"].strip('"') == pins["gradio"]
    assert {"torch", "kernels", "gradio", "spaces", "safetensors", "matplotlib"} <= set(pins)


def test_live_handlers_with_stubbed_gpu(tmp_path, monkeypatch):
    """The live branch of both handlers (GPU work stubbed with placeholder results), and a
    failing GPU call giving a message instead of a traceback."""
    monkeypatch.setenv("PM_RECORDED_DIR", str(tmp_path))
    monkeypatch.setenv("LOCAL_KERNELS", f"{REPO_ID}={REPO}")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("PM_RECORDED_ONLY", raising=False)
    sys.modules.pop("app", None)
    app = importlib.import_module("app")
    try:
        monkeypatch.setitem(app.STATE, "live", True)
        bench = placeholder_benchmark()
        calls = []

        def fake_benchmark(rungs, dtype, shapes, progress=None):
            calls.append((rungs, dtype, shapes))
            return {**bench, "error": None}

        monkeypatch.setattr(app.gpu_work, "run_benchmark", fake_benchmark)
        monkeypatch.setattr(app.gpu_work, "run_timeline", lambda m, n, k: placeholder_timeline())
        status, fig, table, summary, csv_file, json_file = app.benchmark(
            ["tiled", "persistent"], "bfloat16", "custom", "64x64x64", progress=None)
        assert status.startswith("**Live on " + PLACEHOLDER_GPU) and calls == [(["tiled", "persistent"], "bfloat16",
                                                                                [(64, 64, 64)])]
        assert len(table) == len(bench["rows"]) and Path(csv_file).is_file() and fig is not None
        view = app.timeline("640", "640", "256")
        assert view.status.startswith("**Live on") and "**36 tiles**" in view.summary

        def broken(*args, **kwargs):
            raise RuntimeError("CUDA error: out of memory")

        monkeypatch.setattr(app.gpu_work, "run_benchmark", broken)
        monkeypatch.setattr(app, "_warn", lambda message: f"⚠️ {message}")  # gr.Warning needs a request
        view = app.benchmark(["tiled"], "bfloat16", "LLM shapes", "", progress=None)
        assert view.status.startswith("⚠️ The benchmark failed: RuntimeError: CUDA error: out of memory")
        assert view[1:] == (app.gr.skip(),) * 5  # the other outputs stay as they are
    finally:
        sys.modules.pop("app", None)


def test_zerogpu_duration_grows_with_the_request_and_is_capped():
    import gpu_work

    small = gpu_work.benchmark_seconds(["tiled"], "bfloat16", [(512, 512, 512)])
    larger = gpu_work.benchmark_seconds(["naive", "tiled", "persistent"], "bfloat16", [(512, 512, 512)] * 8)
    assert 0 < small < larger <= 120
    assert gpu_work.benchmark_seconds(["naive"] * 50, "bfloat16", [(1, 1, 1)] * 50) == 120
