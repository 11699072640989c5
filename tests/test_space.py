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
import re
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


PLACEHOLDER_SHAPES = ((3000, 3000, 3000), (4096, 4096, 4096))  # two of the Timeline tab's presets


def _one_cta_per_tile(tiles: list[tuple[int, int]], k: int, slots: int, sm_count: int, tile_ns: int,
                      startup_ns: int) -> list[list[int]]:
    """Whole tiles, one CTA each, launched in waves of ``slots`` CTAs."""
    parts = []
    for t, (i, j) in enumerate(tiles):
        wave, slot = divmod(t, slots)
        start = wave * (tile_ns + startup_ns)
        parts.append([i, j, 0, k, slot % sm_count, t, start, start + tile_ns + startup_ns])
    return parts


def _persistent(tiles: list[tuple[int, int]], k: int, ctas: int, sm_count: int, tile_ns: int, startup_ns: int,
                split_tail: bool) -> list[list[int]]:
    """``ctas`` CTAs looping over the tiles (start-up paid once); with ``split_tail`` the
    tiles of the last, ragged round are cut in K into parts that fill the idle CTAs."""
    rounds, ragged = divmod(len(tiles), ctas)
    parts = []
    for t, (i, j) in enumerate(tiles[:rounds * ctas]):
        r, cta = divmod(t, ctas)
        start = startup_ns + r * tile_ns if r else 0
        parts.append([i, j, 0, k, cta % sm_count, cta, start, start + tile_ns + (0 if r else startup_ns)])
    start = startup_ns + rounds * tile_ns
    pieces = max(1, ctas // ragged) if split_tail and ragged else 1
    for t, (i, j) in enumerate(tiles[rounds * ctas:]):
        bounds = [k * p // pieces for p in range(pieces + 1)]
        for p in range(pieces):
            cta = (t * pieces + p) % ctas
            length = max(1, tile_ns * (bounds[p + 1] - bounds[p]) // k)
            parts.append([i, j, bounds[p], bounds[p + 1], cta % sm_count, cta, start, start + length])
    return parts


def _stream_k(tiles: list[tuple[int, int]], k: int, block_k: int, ctas: int, sm_count: int,
              block_ns: int) -> list[list[int]]:
    """Stream-K: the tiles' k-blocks, tile after tile, cut into one equal stretch per CTA;
    a tile whose k-blocks fall into several stretches is a part on each of their CTAs
    (the end of one stretch, the start of the next)."""
    k_blocks = -(-k // block_k)
    total = len(tiles) * k_blocks
    parts = []
    for cta in range(ctas):
        w, end, start = total * cta // ctas, total * (cta + 1) // ctas, 0
        while w < end:
            tile, kb = divmod(w, k_blocks)
            kb_end = min(k_blocks, kb + end - w)
            length = (kb_end - kb) * block_ns
            parts.append([*tiles[tile], kb * block_k, min(kb_end * block_k, k), cta % sm_count, cta, start,
                          start + length])
            w, start = w + kb_end - kb, start + length
    return parts


def placeholder_timeline(shape=(640, 640, 256), sm_count: int = 8, block: int = 512) -> dict:
    """A synthetic run_timeline result: tiled and wgmma run one CTA per tile in waves
    (2 and 1 CTAs per SM), persistent and wgmma_persistent loop (wgmma_persistent in
    CTA pairs, its last ragged round split in K), wgmma_streamk cuts the tiles' k-blocks
    into one stretch per SM; tiles of ``block`` x ``block``."""
    m, n, k = shape
    grid_m, grid_n = -(-m // block), -(-n // block)
    tiles = [(i, j) for j in range(grid_n) for i in range(grid_m)]
    cfg = {"block_m": block, "block_n": block, "block_k": 64, "tiles": len(tiles)}
    kernels = {
        "tiled": _one_cta_per_tile(tiles, k, 2 * sm_count, sm_count, 1000, 300),
        "persistent": _persistent(tiles, k, 2 * sm_count, sm_count, 1000, 300, False),
        "wgmma": _one_cta_per_tile(tiles, k, sm_count, sm_count, 600, 200),
        "wgmma_persistent": _persistent(tiles, k, sm_count, sm_count, 600, 200, True),
        "wgmma_streamk": _stream_k(tiles, k, 128, sm_count, sm_count, 30),
    }
    ctas = {"tiled": len(tiles), "persistent": 2 * sm_count, "wgmma": len(tiles), "wgmma_persistent": sm_count,
            "wgmma_streamk": sm_count}
    env = {"date": "2000-01-01", "gpu": PLACEHOLDER_GPU, "sm_count": sm_count, "commit": "0" * 40,
           "torch": "placeholder", "cuda": "placeholder", "kernel": "placeholder"}
    return {
        "shape": list(shape), "dtype": "bfloat16", "sm_count": sm_count,
        "kernels": {name: {"parts": parts, "grid": ctas[name], "ms": 0.001 * (5 - i), "note": "",
                           "tile_config": {**cfg, "block_k": 128 if name == "wgmma_streamk" else 64,
                                           "persistent_ctas": ctas["persistent" if i < 2 else name]},
                           "cluster_size": 2 if name == "wgmma_persistent" else 1}
                    for i, (name, parts) in enumerate(kernels.items())},
        "environment": env, "error": None,
    }


def placeholder_benchmark() -> dict:
    """A synthetic run_benchmark result over two shapes (bfloat16) and one float32 row."""
    rows = []
    for m, n, k in [(512, 512, 512), (1024, 1024, 1024)]:
        for rung, tflops, graph_ms, host_us in [("cuBLAS", 100.0, 0.01, 5.0), ("tiled", 30.0, 0.02, 4.0),
                                                ("persistent", 40.0, 0.015, 6.0)]:
            rows.append({"m": m, "n": n, "k": k, "dtype": "bfloat16", "rung": rung, "ms": 2 * m * n * k / tflops / 1e9,
                         "tflops": tflops, "graph_ms": graph_ms, "host_us": host_us, "rel_error": 1e-3,
                         "ratio_vs_cublas": tflops / 100.0, "note": ""})
    rows.append({"m": 512, "n": 512, "k": 512, "dtype": "float32", "rung": "cuBLAS", "ms": 0.1, "tflops": 2.7,
                 "rel_error": 1e-7, "ratio_vs_cublas": 1.0, "note": ""})
    env = {"date": "2000-01-01", "gpu": PLACEHOLDER_GPU, "sm_count": 8, "sm_clock": "1 MHz",
           "torch": "placeholder", "cuda": "placeholder", "commit": "0" * 40}
    return {"environment": env, "rows": rows}


def write_placeholders(directory: Path) -> Path:
    """benchmark.json and a timeline of each of PLACEHOLDER_SHAPES with placeholder data in ``directory``."""
    import recorded

    recorded.save_benchmark(placeholder_benchmark(), directory)
    for shape in PLACEHOLDER_SHAPES:
        recorded.save_timeline(placeholder_timeline(shape), directory)
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
    assert {"/benchmark", "/timeline", "/select_timeline", "/replay_frame", "/replay_gif"} <= set(
        info["named_endpoints"])


def _table(table):
    return table["data"] if isinstance(table, dict) else table


def test_recorded_benchmark(client):
    status, headline, plot, table, summary, csv_file, json_file = client.predict(
        ["tiled", "persistent"], "bfloat16", "square sweep 512..8192", "", api_name="/benchmark")
    assert "Cannot run live" in status and "Recorded results" in status and PLACEHOLDER_GPU in status
    assert "The recording has 2 of these 5 shapes" in status
    assert plot, "no figure came back"
    data = _table(table)
    assert [row[2] for row in data] == ["cuBLAS", "tiled", "persistent"] * 2
    assert all(row[1] == "bfloat16" for row in data)
    # the CUDA-graph and host-cost columns, next to the eager time
    assert [(row[5], row[6]) for row in data[:3]] == [("0.0100", "5.0"), ("0.0200", "4.0"), ("0.0150", "6.0")]
    assert "persistent / tiled" in summary and "1.33x" in summary
    assert "**persistent** runs **1.33x** the speed of tiled and **0.40x** cuBLAS" in headline
    assert "best rung here: **persistent**" in headline
    with open(csv_file, newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 6 and float(rows[2]["tflops"]) == 40.0 and float(rows[2]["host_us"]) == 6.0
    saved = json.loads(Path(json_file).read_text())
    assert saved["environment"]["gpu"] == PLACEHOLDER_GPU and len(saved["rows"]) == 6


def test_recorded_benchmark_other_dtype(client):
    status, _, _, table, _, _, _ = client.predict(["naive"], "float32", "LLM shapes", "", api_name="/benchmark")
    data = _table(table)
    assert [row[2] for row in data] == ["cuBLAS"] and data[0][1] == "float32"
    assert "Recorded results" in status and "has none of these shapes" in status


def test_model_presets_run_and_over_cap_requests_are_refused(client):
    """A Llama preset within the caps runs (here: the recording, which lacks its shapes);
    a request over the GPU-time cap is rejected with the estimate and the cap."""
    status = client.predict(["tiled", "persistent"], "bfloat16", "Llama-3-8B decode (M 1..256)", "",
                            api_name="/benchmark")[0]
    assert not status.startswith("⚠️") and "has none of these shapes" in status, status
    import validation

    status = client.predict(["naive", "warptiled", "tiled", "persistent"], "float32", "custom",
                            "16384x16384x16384, 16384x16384x16384", api_name="/benchmark")[0]
    assert status.startswith("⚠️") and f"the cap per request is {validation.MAX_GPU_SECONDS} s" in status, status


def test_recorded_timeline(client):
    # the replay's data stays in the session (a gr.State), so the API returns the other five outputs
    status, plot, summary, slider, frame = client.predict("ragged waves: 3000x3000x3000", "tiled vs persistent", "",
                                                          "", "", api_name="/timeline")
    assert "Cannot run live" in status and "Recorded timeline" in status and PLACEHOLDER_GPU in status
    assert plot and Path(frame).is_file()
    assert "| tiled |" in summary and "| persistent |" in summary and "idle SM-time" in summary
    assert "on **8 SMs**" in summary and "| wgmma |" not in summary
    # the time slider spans the longer kernel's run (tiled: 3 waves of 1.3 µs) and starts at 0
    assert slider["value"] == 0 and slider["maximum"] == pytest.approx(3.9)
    summary = client.predict("ragged waves: 3000x3000x3000", "wgmma vs wgmma_persistent", "", "", "",
                             api_name="/select_timeline")[2]
    # the split tail: 4 tiles of the last round in 8 parts; CTA pairs
    assert "| wgmma_persistent | 512x512 | 36 | 8 | 2 |" in summary and "| 4 (8) |" in summary
    summary = client.predict("ragged waves: 3000x3000x3000", "wgmma_persistent vs wgmma_streamk", "", "", "",
                             api_name="/select_timeline")[2]
    # stream-K: 36 tiles of 24 k-blocks in 8 stretches of 108 (4.5 tiles), so 4 tiles are cut in 2
    row = next(line for line in summary.splitlines() if line.startswith("| wgmma_streamk |"))
    assert row.startswith("| wgmma_streamk | 512x512 | 36 | 8 | 1 |") and row.endswith("| 4 (8) |"), row
    status = client.predict("decode: 16x4096x4096", "tiled vs persistent", "", "", "", api_name="/select_timeline")[0]
    assert "No timeline to show" in status and "record one" in status


def _pixels(path) -> bytes:
    from PIL import Image

    with Image.open(path) as image:
        return image.convert("RGB").tobytes()


def test_replay_frames_follow_the_time_and_the_shape(space):
    """The replay through the API (one session, whose state holds the shown timeline):
    frames at different times differ, the same time gives the same frame, another
    shape gives another frame; a time outside the run is refused; the GIF has one
    frame per slider step."""
    from gradio_client import Client
    from PIL import Image

    import replay

    client = Client(space[0], verbose=False)
    client.predict("ragged waves: 3000x3000x3000", "tiled vs persistent", "", "", "", api_name="/select_timeline")
    early, late, again = (_pixels(client.predict(t, api_name="/replay_frame")) for t in (0.5, 3.0, 0.5))
    assert early != late and early == again
    client.predict("aligned: 4096x4096x4096", "tiled vs persistent", "", "", "", api_name="/select_timeline")
    assert _pixels(client.predict(0.5, api_name="/replay_frame")) != early
    with pytest.raises(Exception, match="greater than maximum value 5.2"):  # the slider's end, set per shape
        client.predict(1e6, api_name="/replay_frame")
    gif = client.predict(api_name="/replay_gif")
    with Image.open(gif) as image:
        assert image.n_frames == replay.FRAMES and image.info.get("loop") == 0


def test_burst_of_requests_is_answered(client):
    """20 requests at once (benchmarks, timelines, frames) wait in the queue, none is refused."""
    jobs = [client.submit(["tiled", "persistent"], "bfloat16", "LLM shapes", "", api_name="/benchmark")
            for _ in range(10)]
    jobs += [client.submit("many waves: 4608x4608x2048", "tiled vs persistent", "", "", "", api_name="/timeline")
             for _ in range(5)]
    jobs += [client.submit("custom (M, N, K below)", "tiled vs persistent", "abc", "1", "1",
                           api_name="/timeline") for _ in range(5)]
    statuses = [job.result(timeout=120)[0] for job in jobs]
    assert all("Recorded results" in s for s in statuses[:10])
    assert all("No timeline to show" in s for s in statuses[10:15])
    assert all(s.startswith("⚠️") and "is not a number" in s for s in statuses[15:])


@pytest.mark.parametrize(("custom", "expected"), [
    ("abc", "is not a shape"),
    ("4096xfooX16", "is not a number"),
    ("0x16x16", "must be at least 1"),
    ("-4x16x16", "must be at least 1"),
    ("70000x16x16", "over the cap"),
    ("1.5x16x16", "not a whole number"),
    ("", "No custom shapes"),
    (", ".join(["16x16x16"] * 9), "at most 8"),
    ("65536x65536x16", "elements; the cap is"),
    (", ".join(["16384x16384x16384"] * 3), "cap per request"),
])
def test_benchmark_rejects_bad_shapes(client, custom, expected):
    status = client.predict(["tiled"], "bfloat16", "custom", custom, api_name="/benchmark")[0]
    assert status.startswith("⚠️") and expected in status, status


@pytest.mark.parametrize(("inputs", "expected"), [
    (("custom (M, N, K below)", "tiled vs persistent", "abc", "16", "16"), "is not a number"),
    (("custom (M, N, K below)", "tiled vs persistent", "16", "0", "16"), "must be at least 1"),
    (("custom (M, N, K below)", "tiled vs persistent", "16", "16", "-3"), "must be at least 1"),
    (("custom (M, N, K below)", "tiled vs persistent", "99999", "16", "16"), "over the cap"),
    (("custom (M, N, K below)", "tiled vs persistent", "", "16", "16"), "is empty"),
    (("custom (M, N, K below)", "tiled vs persistent", "16384", "16384", "16384"), "cap per request"),
])
def test_timeline_rejects_bad_input(client, inputs, expected):
    status = client.predict(*inputs, api_name="/timeline")[0]
    assert status.startswith("⚠️") and expected in status, status


def test_timeline_choices_are_checked(client):
    """Gradio refuses a shape or pair the dropdowns do not offer; the app's own check
    says the same for callers that reach the handler directly."""
    import validation

    for inputs, value in ((("huge", "tiled vs persistent", "16", "16", "16"), "huge"),
                          (("aligned: 4096x4096x4096", "naive vs cuBLAS", "", "", ""), "naive vs cuBLAS")):
        with pytest.raises(Exception, match=f"Value: {value} is not in the list of choices"):
            client.predict(*inputs, api_name="/timeline")
    with pytest.raises(validation.InputError, match="Unknown timeline shape 'huge'; choose one of ragged waves"):
        validation.timeline_shape("huge", 16, 16, 16)
    with pytest.raises(validation.InputError, match="Unknown kernel pair 'naive vs cuBLAS'"):
        validation.timeline_pair("naive vs cuBLAS")


def test_custom_good_shapes_reach_the_recording(client):
    status = client.predict(["persistent"], "bfloat16", "custom", "64x64x64; 128 x 128 x 128",
                            api_name="/benchmark")[0]
    assert not status.startswith("⚠️") and "Recorded results" in status


# --------------------------------------------------------------------------- timeline data model


def _checked(parts, tiles_m=2, tiles_n=2, k=256, sm_count=4):
    import timeline_data

    return timeline_data.check_parts(parts, tiles_m=tiles_m, tiles_n=tiles_n, k=k, sm_count=sm_count)


def _whole_tiles(k=256):
    return [[i, j, 0, k, (2 * i + j) % 4, 2 * i + j, 10 * (2 * i + j), 10 * (2 * i + j) + 50]
            for i in range(2) for j in range(2)]


def test_sanity_check_passes_whole_tiles_and_parts():
    parts = _whole_tiles()
    assert _checked(parts) == []
    tile = parts.pop()  # tile (1, 1) as three parts in K, on three SMs at once
    parts += [[1, 1, 0, 64, 0, 7, 100, 130], [1, 1, 64, 192, 1, 8, 100, 150], [1, 1, 192, 256, 2, 9, 100, 120]]
    assert _checked(parts) == [] and tile[:2] == [1, 1]
    for shape in PLACEHOLDER_SHAPES:
        import timeline_data

        assert timeline_data.timeline_problems(placeholder_timeline(shape)) == []


@pytest.mark.parametrize(("change", "expected"), [
    (lambda p: p.pop(), "1 of 4 tile(s) missing, e.g. (1, 1)"),
    (lambda p: p.append(list(p[0])), "tile (0, 0): K-ranges [(0, 256), (0, 256)] overlap at k=0"),
    (lambda p: p.append([2, 0, 0, 256, 0, 9, 0, 5]), "1 tile(s) outside the 2x2 grid, e.g. (2, 0)"),
    (lambda p: p[1].__setitem__(6, p[1][7]), "1 part(s) with start >= end"),
    (lambda p: p[2].__setitem__(4, 4), "1 part(s) on an SM id outside 0..3"),
    (lambda p: p[2].__setitem__(4, -1), "1 part(s) on an SM id outside 0..3"),
    (lambda p: p[3].__setitem__(3, 200), "tile (1, 1): K-ranges [(0, 200)] end at k=200, not K=256"),
    (lambda p: p[3:] == p.__setitem__(3, [1, 1, 0, 100, 0, 3, 0, 9]) or p.append([1, 1, 120, 256, 1, 3, 0, 9]),
     "tile (1, 1): K-ranges [(0, 100), (120, 256)] leave a gap at k=100"),
    (lambda p: p[3:] == p.__setitem__(3, [1, 1, 0, 150, 0, 3, 0, 9]) or p.append([1, 1, 100, 256, 1, 3, 0, 9]),
     "tile (1, 1): K-ranges [(0, 150), (100, 256)] overlap at k=100"),
    (lambda p: p[0].__setitem__(3, 300), "K-range outside 0 <= k_begin < k_end <= 256"),
])
def test_sanity_check_names_what_is_wrong(change, expected):
    parts = _whole_tiles()
    change(parts)
    problems = _checked(parts)
    assert any(expected in problem for problem in problems), problems


def test_validate_raises_and_a_bad_timeline_is_not_saved(tmp_path):
    import recorded
    import timeline_data

    data = placeholder_timeline()
    data["kernels"]["persistent"]["parts"].pop()
    with pytest.raises(timeline_data.TimelineError, match="persistent: 1 of 4 tile"):
        timeline_data.validate(data)
    with pytest.raises(timeline_data.TimelineError):
        recorded.save_timeline(data, tmp_path)
    assert not list(tmp_path.rglob("*.safetensors"))
    assert timeline_data.timeline_problems({"kernels": {}}) == ["the timeline names no shape or SM count"]


def test_rows_of_either_layout_become_parts():
    import timeline_data

    whole = timeline_data.parts_from_rows([[1, 2, 5, 9, 100, 200]], timeline_data.TILE_COLUMNS, 512)
    assert whole == [[1, 2, 0, 512, 5, 9, 100, 200]]
    columns = ["tile_m", "tile_n", "k_begin", "k_end", "sm", "start_ns", "end_ns"]  # a build without the CTA
    assert timeline_data.parts_from_rows([[1, 2, 64, 128, 5, 100, 200]], columns, 512) == [
        [1, 2, 64, 128, 5, -1, 100, 200]]
    for bad, message in ((["tile_m", "tile_n", "sm", "start_ns"], "lack end_ns"),
                         ([*timeline_data.TILE_COLUMNS, "k_begin"], "only one end of the K-range"),
                         ([*timeline_data.TILE_COLUMNS, "warp"], "unknown timeline column(s) warp")):
        with pytest.raises(timeline_data.TimelineError, match=re.escape(message)):
            timeline_data.parts_from_rows([], bad, 64)
    with pytest.raises(timeline_data.TimelineError, match="record 0 has 5 values for 6 columns"):
        timeline_data.parts_from_rows([[1, 2, 3, 4, 5]], timeline_data.TILE_COLUMNS, 64)


def test_kernel_timeline_rows_are_parts(pm):
    """The kernel's instrumented builds record parts in the data model's columns, so
    its rows need no default filled in."""
    import timeline_data

    assert tuple(pm.TIMELINE_COLUMNS) == timeline_data.PART_COLUMNS
    row = [3, 1, 128, 256, 7, 9, 100, 200]
    assert timeline_data.parts_from_rows([row], pm.TIMELINE_COLUMNS, 4096) == [row]


def test_tile_config_with_k_where_the_kernel_takes_it(monkeypatch):
    """run_timeline asks tile_config with K (wgmma_streamk's grid depends on it), and
    without it from a kernel whose tile_config takes none."""
    monkeypatch.setenv("LOCAL_KERNELS", f"{REPO_ID}={REPO}")
    import gpu_work

    class WithK:
        def tile_config(self, m, n, *, kernel, k=None):
            return {"kernel": kernel, "k": k}

    class WithoutK:
        def tile_config(self, m, n, *, kernel):
            return {"kernel": kernel, "k": None}

    assert gpu_work._tile_config(WithK(), 16, 4096, 4096, "wgmma_streamk") == {"kernel": "wgmma_streamk", "k": 4096}
    assert gpu_work._tile_config(WithoutK(), 16, 4096, 4096, "tiled") == {"kernel": "tiled", "k": None}


# --------------------------------------------------------------------------- in-process


def import_app(monkeypatch, recorded_dir, *, recorded_only: bool):
    """A fresh import of space/app.py: recordings from ``recorded_dir``, the kernel from
    this repo's build, offline; ``recorded_only`` never measures (PM_RECORDED_ONLY)."""
    monkeypatch.setenv("PM_RECORDED_DIR", str(recorded_dir))
    if recorded_only:
        monkeypatch.setenv("PM_RECORDED_ONLY", "1")
    else:
        monkeypatch.delenv("PM_RECORDED_ONLY", raising=False)
    monkeypatch.setenv("LOCAL_KERNELS", f"{REPO_ID}={REPO}")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    sys.modules.pop("app", None)
    return importlib.import_module("app")


def test_app_without_recorded_results(tmp_path, monkeypatch, pm):
    """No recorded files: the app still builds and says so instead of failing. The rungs
    it offers are the kernel's, and each button's outputs are its view's fields in order."""
    app = import_app(monkeypatch, tmp_path, recorded_only=True)
    try:
        assert "no recorded results yet" in app.header_markdown()
        assert app.STATE["rungs"] == list(pm.KERNELS)
        demo = app.build()
        outputs = {fn.api_name: [block.elem_id for block in fn.outputs] for fn in demo.fns.values()}
        assert len(outputs["benchmark"]) == len(app.BenchmarkView._fields)
        assert outputs["benchmark"][:4] == ["benchmark-status", "benchmark-headline", "benchmark-plot",
                                            "benchmark-table"]
        assert outputs["timeline"] == outputs["select_timeline"] == [
            "timeline-status", "timeline-plot", "timeline-summary", None, "replay-slider", "replay-frame"]
        assert list(app.TimelineView._fields) == ["status", "figure", "summary", "replay", "slider", "frame"]
        # GPU work queues one job at a time; drawing frames does not wait behind it
        limits = {fn.api_name: (fn.concurrency_limit, fn.concurrency_id) for fn in demo.fns.values()}
        assert limits["benchmark"] == limits["timeline"] == (1, app.GPU_QUEUE)
        assert limits["replay_frame"][1] != app.GPU_QUEUE
        view = app.benchmark(["tiled"], "bfloat16", "LLM shapes", "", progress=None)
        assert "No recorded benchmark yet" in view.status and view.csv is None
        view = app.timeline("aligned: 4096x4096x4096", "tiled vs persistent", "", "", "")
        assert "No timeline to show" in view.status and view.replay is None
        monkeypatch.setattr(app, "_warn", lambda message: f"⚠️ {message}")  # gr.Warning needs a request
        unknown = app.benchmark(["fastest"], "bfloat16", "LLM shapes", "", progress=None).status
        assert "Unknown rung(s): fastest; choose from " + ", ".join(pm.KERNELS) in unknown
        assert app.replay_gif(None) is None
    finally:
        sys.modules.pop("app", None)


def test_replay_ticks_never_restart_the_timer(tmp_path, monkeypatch):
    """Only Play starts the replay's timer: a tick leaves it as it is (so one still running
    when Pause lands cannot switch it back on), and the tick that reaches the end stops it."""
    app = import_app(monkeypatch, tmp_path, recorded_only=True)
    try:
        import replay

        data = {"result": placeholder_timeline((3000, 3000, 3000)), "kernels": ["tiled", "persistent"], "label": "t"}
        end, t, timers = replay.span_us(data["result"], data["kernels"]), 0.0, []
        for _ in range(replay.FRAMES - 1):
            t, image, timer = app.replay_step(data, t)
            timers.append(timer)
            assert image.shape[2] == 3
        assert t == pytest.approx(end)
        assert all(timer == app.gr.skip() for timer in timers[:-1])
        assert isinstance(timers[-1], app.gr.Timer) and timers[-1].active is False
        assert app.replay_step(data, end)[0] == 0.0  # Play at the end starts over
        assert app.replay_step(None, 0.0)[2].active is False
    finally:
        sys.modules.pop("app", None)


@pytest.mark.parametrize(("gpu", "sm_count", "capability", "hopper_rungs", "expected"), [
    ("NVIDIA H200 (a 60-SM slice)", 60, "9.0", True, ["wgmma", "wgmma_persistent"]),
    ("NVIDIA RTX PRO 6000 Blackwell", 188, "12.0", False, ["tiled", "persistent"]),
])
def test_devices_other_than_a_whole_h100(tmp_path, monkeypatch, gpu, sm_count, capability, hopper_rungs, expected):
    """A 60-SM H200 slice and an sm_120 GPU: the header gives the device's own SM count
    and which rungs cannot run there and why; the page first selects the best pair
    that runs; a timeline's numbers use the SM count it was recorded with."""
    app = import_app(monkeypatch, write_placeholders(tmp_path), recorded_only=False)
    try:
        hopper_only = {"wgmma", "wgmma_persistent", "wgmma_streamk"}
        rungs = {name: {"available": name in app.STATE["rungs"] and (hopper_rungs or name not in hopper_only),
                        "reason": f"needs compute capability 9.0, this GPU has {capability}"
                        if name in hopper_only and not hopper_rungs else "", "dtypes": ["bfloat16"]}
                 for name in [*app.STATE["rungs"], "cuBLAS"]}
        monkeypatch.setitem(app.STATE, "info", {**app.STATE["info"], "gpu": gpu, "sm_count": sm_count,
                                                "capability": capability, "rungs": rungs})
        monkeypatch.setitem(app.STATE, "live", True)
        header = app.header_markdown()
        assert f"{gpu} ({sm_count} SMs, compute capability {capability})" in header
        assert ("| wgmma | no |" in header) == (not hopper_rungs)
        assert app.default_rungs() == expected
        result = placeholder_timeline((3000, 3000, 3000), sm_count=sm_count)
        monkeypatch.setattr(app.gpu_work, "run_timeline", lambda m, n, k, kernels: {
            **result, "kernels": {name: result["kernels"][name] for name in kernels}})
        view = app.timeline("ragged waves: 3000x3000x3000", "tiled vs persistent", "", "", "")
        assert view.status.startswith("**Live on") and f"on **{sm_count} SMs**" in view.summary
    finally:
        sys.modules.pop("app", None)


def test_default_selection_from_the_recording(tmp_path, monkeypatch):
    """Recorded-only: the first selection is the pair of the recording's best rung."""
    bench = placeholder_benchmark()
    for row in list(bench["rows"]):
        if row["rung"] == "persistent":
            bench["rows"].append({**row, "rung": "wgmma_persistent", "tflops": 90.0, "ratio_vs_cublas": 0.9})
    import recorded

    recorded.save_benchmark(bench, tmp_path)
    app = import_app(monkeypatch, tmp_path, recorded_only=True)
    try:
        assert app.default_rungs() == ["wgmma", "wgmma_persistent"]
        bench["rows"] = [r for r in bench["rows"] if r["rung"] != "wgmma_persistent"]
        monkeypatch.setitem(app.STATE, "bench", bench)
        assert app.default_rungs() == ["tiled", "persistent"]
    finally:
        sys.modules.pop("app", None)


def test_timeline_stats_on_placeholder():
    import plots

    data = placeholder_timeline((3000, 3000, 3000))
    stats = {name: plots.timeline_stats(k["parts"], 8) for name, k in data["kernels"].items()}
    assert stats["tiled"]["tiles"] == stats["persistent"]["tiles"] == stats["wgmma_persistent"]["tiles"] == 36
    # 36 tiles on 16 slots (8 SMs x 2): the third wave has 4 tiles, so SMs 4-7 sit idle (a tail)
    assert stats["tiled"]["tail_us"] > 0 and 0 < stats["tiled"]["idle_fraction"] < 1
    assert stats["persistent"]["span_us"] < stats["tiled"]["span_us"]
    # split tail: the last round's 4 tiles in 8 parts fill all 8 SMs, so no SM idles at the end
    assert stats["wgmma_persistent"]["split_tiles"] == 4 and stats["wgmma_persistent"]["parts"] == 40
    assert stats["wgmma"]["tail_us"] > 0 and stats["wgmma_persistent"]["tail_us"] == 0
    assert plots.waves(data["kernels"]["persistent"]["parts"], 16)[-1] == 2
    assert plots.waves(data["kernels"]["tiled"]["parts"], 16)[-1] == 2
    # stream-K: every SM streams the same share of the work, so none idles at the end;
    # a cut tile's parts run on the SMs whose stretches share it, the second at once
    streamk = data["kernels"]["wgmma_streamk"]["parts"]
    assert stats["wgmma_streamk"]["tiles"] == 36 and stats["wgmma_streamk"]["split_tiles"] == 4
    assert stats["wgmma_streamk"]["tail_us"] == 0 and stats["wgmma_streamk"]["idle_fraction"] == 0
    first, second = sorted((p for p in streamk if (p[0], p[1]) == tuple(streamk[4][:2])), key=lambda p: p[2])
    assert first[3] == second[2] and first[4] != second[4] and first[6] > second[6] == 0


def test_replay_idle_counter_grows_to_the_total():
    """The idle SM-time so far never shrinks as the replay advances, and at the end it
    is the whole run's idle share."""
    import plots
    import replay

    data = placeholder_timeline((3000, 3000, 3000))
    parts = data["kernels"]["tiled"]["parts"]
    times = replay.frame_times(data, ["tiled", "persistent"], 12)
    idle = [plots.idle_so_far(parts, 8, t)[0] for t in times]
    assert times[0] == 0 and idle[0] == 0 and all(a <= b for a, b in zip(idle, idle[1:])) and idle[-1] > 0
    stats = plots.timeline_stats(parts, 8)
    assert plots.idle_so_far(parts, 8, times[-1])[1] == pytest.approx(stats["idle_fraction"])
    with pytest.raises(ValueError, match="at least 2 frames"):
        replay.frame_times(data, ["tiled"], 1)
    with pytest.raises(ValueError, match="must be a number >= 0"):
        replay.frame(data, ["tiled"], -1.0, "")


def test_timeline_figure_draws_parts_and_pairs():
    """Parts of split tiles are drawn hatched, and the CTAs of a cluster are joined;
    a replay frame leaves out what had not started yet."""
    from matplotlib.collections import LineCollection, PolyCollection

    import plots

    data = placeholder_timeline((3000, 3000, 3000))
    fig = plots.timeline_figure(data, "t", ["wgmma", "wgmma_persistent"])
    one_cta, pairs = fig.axes[0], fig.axes[1]
    hatched = [c for c in pairs.collections if isinstance(c, PolyCollection) and c.get_hatch()]
    assert len(hatched) == 1 and len(hatched[0].get_paths()) == 8
    assert not [c for c in one_cta.collections if isinstance(c, PolyCollection) and c.get_hatch()]
    links = [c for c in pairs.collections if isinstance(c, LineCollection)]
    assert len(links) == 1 and len(links[0].get_segments()) == 4 * 4 + 4  # 4 pairs x 4 full rounds + split parts
    early = plots.timeline_figure(data, "t", ["wgmma", "wgmma_persistent"], until_us=0.5)
    drawn = sum(len(c.get_paths()) for c in early.axes[0].collections if isinstance(c, PolyCollection))
    assert drawn == 8  # the first wave, one CTA per SM


def test_recorded_roundtrip(tmp_path):
    import recorded

    write_placeholders(tmp_path)
    bench, timelines = recorded.load_benchmark(tmp_path), recorded.load_timelines(tmp_path)
    assert bench == json.loads(json.dumps(placeholder_benchmark()))
    assert sorted(timelines) == sorted(recorded.shape_key(s) for s in PLACEHOLDER_SHAPES)
    original = placeholder_timeline(PLACEHOLDER_SHAPES[0])
    timeline = timelines[recorded.shape_key(PLACEHOLDER_SHAPES[0])]
    for name, kern in original["kernels"].items():
        for key in ("parts", "grid", "ms", "note", "tile_config", "cluster_size"):
            assert timeline["kernels"][name][key] == kern[key], (name, key)
    assert timeline["shape"] == [3000, 3000, 3000] and timeline["sm_count"] == 8
    assert timeline["environment"]["gpu"] == PLACEHOLDER_GPU
    assert recorded.load_benchmark(tmp_path / "missing") is None and recorded.load_timelines(tmp_path / "x") == {}


def test_a_file_that_is_not_safetensors_reads_as_an_error(tmp_path):
    """A corrupt timeline file in the recorded folder is reported, not raised:
    the Space still starts and shows the others."""
    import recorded

    folder = tmp_path / recorded.TIMELINE_DIR
    folder.mkdir()
    (folder / "64x64x64.safetensors").write_text("not safetensors")
    timelines = recorded.load_timelines(tmp_path)
    assert timelines["64x64x64"]["error"].startswith("could not read 64x64x64.safetensors: SafetensorError")


def test_whole_tile_recordings_still_read(tmp_path):
    """A file of the whole-tile format (one tile_config, <kernel>_ms/_grid keys, six
    columns) reads as parts with the K-range [0, K); a broken one gives an error."""
    import torch
    from safetensors.torch import save_file

    import recorded

    data = placeholder_timeline()
    rows = [[p[0], p[1], p[4], p[5], p[6], p[7]] for p in data["kernels"]["tiled"]["parts"]]
    folder = tmp_path / recorded.TIMELINE_DIR
    folder.mkdir()
    meta = {"shape": "640x640x256", "dtype": "bfloat16", "sm_count": "8", "gpu": PLACEHOLDER_GPU,
            "tile_config": json.dumps(data["kernels"]["tiled"]["tile_config"]), "tiled_ms": "0.5",
            "tiled_grid": "4"}
    save_file({"tiled": torch.tensor(rows, dtype=torch.int64)}, str(folder / "640x640x256.safetensors"), metadata=meta)
    save_file({"tiled": torch.tensor(rows[1:], dtype=torch.int64)}, str(folder / "1x1x1.safetensors"),
              metadata={**meta, "shape": "640x640x256"})
    loaded = recorded.load_timelines(tmp_path)
    tiled = loaded["640x640x256"]["kernels"]["tiled"]
    assert tiled["parts"] == data["kernels"]["tiled"]["parts"] and tiled["ms"] == 0.5 and tiled["grid"] == 4
    assert "1 of 4 tile(s) missing" in loaded["1x1x1"]["error"]


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
    app = import_app(monkeypatch, tmp_path, recorded_only=False)
    try:
        monkeypatch.setitem(app.STATE, "live", True)
        bench = placeholder_benchmark()
        calls = []

        def fake_benchmark(rungs, dtype, shapes, weights_layout, progress=None):
            calls.append((rungs, dtype, shapes, weights_layout))
            return {**bench, "error": None}

        monkeypatch.setattr(app.gpu_work, "run_benchmark", fake_benchmark)
        monkeypatch.setattr(app.gpu_work, "run_timeline", lambda m, n, k, kernels: placeholder_timeline((m, n, k)))
        status, headline, fig, table, summary, csv_file, json_file = app.benchmark(
            ["tiled", "persistent"], "bfloat16", "custom", "64x64x64", progress=None)
        assert status.startswith("**Live on " + PLACEHOLDER_GPU) and calls == [(["tiled", "persistent"], "bfloat16",
                                                                                [(64, 64, 64)], False)]
        assert len(table) == len(bench["rows"]) and Path(csv_file).is_file() and fig is not None
        app.benchmark(["tiled"], "bfloat16", "Llama-3-8B decode (M 1..256)", "", progress=None)
        assert calls[-1][2][:4] == [(1, 6144, 4096), (1, 4096, 4096), (1, 28672, 4096), (1, 4096, 14336)]
        assert calls[-1][3] is True  # the model presets time the weights' layout
        view = app.timeline("custom (M, N, K below)", "tiled vs persistent", "640", "640", "256")
        assert view.status.startswith("**Live on") and "| tiled | 512x512 | 4 |" in view.summary
        assert view.replay["kernels"] == ["tiled", "persistent"] and view.frame.shape[2] == 3

        def broken(*args, **kwargs):
            raise RuntimeError("CUDA error: out of memory")

        monkeypatch.setattr(app.gpu_work, "run_benchmark", broken)
        monkeypatch.setattr(app, "_warn", lambda message: f"⚠️ {message}")  # gr.Warning needs a request
        view = app.benchmark(["tiled"], "bfloat16", "LLM shapes", "", progress=None)
        assert view.status.startswith("⚠️ The benchmark failed: RuntimeError: CUDA error: out of memory")
        assert view[1:] == (app.gr.skip(),) * 6  # the other outputs stay as they are
        monkeypatch.setattr(app.gpu_work, "run_timeline", lambda *a: {"error": "the timeline fails its sanity check"})
        view = app.timeline("aligned: 4096x4096x4096", "tiled vs persistent", "", "", "")
        assert view.status == "⚠️ The timeline did not run: the timeline fails its sanity check"
    finally:
        sys.modules.pop("app", None)


def test_zerogpu_duration_follows_the_work_asked():
    """The ZeroGPU durations grow with shapes, rungs and FLOP; a request over the cap
    is refused with its estimate, before any GPU is attached."""
    import gpu_work
    import validation

    small = gpu_work.benchmark_seconds(["tiled"], "bfloat16", [(512, 512, 512)])
    more_shapes = gpu_work.benchmark_seconds(["tiled"], "bfloat16", [(512, 512, 512)] * 8)
    more_rungs = gpu_work.benchmark_seconds(["tiled", "persistent", "wgmma"], "bfloat16", [(512, 512, 512)] * 8)
    larger = gpu_work.benchmark_seconds(["tiled"], "bfloat16", [(8192, 8192, 8192)])
    assert 0 < small < more_shapes < more_rungs and small < larger
    # naive is skipped above its FLOP limit, so it adds nothing there
    assert gpu_work.benchmark_seconds(["naive", "tiled"], "bfloat16", [(8192, 8192, 8192)]) == larger
    assert gpu_work.timeline_seconds(1024, 1024, 1024, ("tiled",)) < gpu_work.timeline_seconds(
        10000, 10000, 10000, ("tiled", "persistent"))
    for preset, shapes in validation.PRESETS.items():  # the page's default selection fits every preset
        assert gpu_work.benchmark_seconds(["tiled", "persistent"], "bfloat16", shapes,
                                          validation.weights_layout(preset)) <= validation.MAX_GPU_SECONDS, preset
    with pytest.raises(validation.InputError, match=r"about 121 s of GPU time; the cap per request is 120 s"):
        validation.check_seconds(121, "benchmark")


def test_model_shape_sets_are_the_scripts():
    """The Space keeps its own copy of the model shape sets (it is uploaded without
    scripts/); they must stay those of scripts/harness/checks.py."""
    sys.path.insert(0, str(REPO / "scripts"))
    from harness import checks

    import validation

    assert validation.MODEL_PROJECTIONS == checks.MODEL_PROJECTIONS
    assert validation.DECODE_M == checks.DECODE_M and validation.PREFILL_M == checks.PREFILL_M
    presets = [s for name, s in validation.PRESETS.items() if name.startswith("Llama")]
    assert {n for shapes in presets for _, n, _ in shapes} == {n for n, _ in checks.MODEL_PROJECTIONS.values()}


def test_graph_capture_is_model_benchmarks():
    """gpu_work's CUDA-graph capture is scripts/model_benchmark.py's, statement for statement."""
    import ast

    def function(path: Path, name: str) -> str:
        node = next(n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef)
                    and n.name == name)
        return ast.dump(ast.Module(body=node.body[1:], type_ignores=[])) + ast.dump(node.args)

    assert function(SPACE / "gpu_work.py", "_capture") == function(REPO / "scripts" / "model_benchmark.py", "capture")


def test_record_writes_every_preset_and_refuses_bad_timelines(tmp_path, monkeypatch, capsys):
    """record.py with the GPU work stubbed: one run writes the benchmark (every run of
    BENCHMARK_RUNS, the model presets in the weights' layout) and a timeline file per
    shape preset with every kernel of the pairs; a timeline that fails the sanity
    check is reported and not written."""
    import gpu_work
    import record
    import recorded
    import validation

    benchmarks, timelines = [], []

    def fake_benchmark(rungs, dtype, shapes, weights_layout=False, progress=None):
        benchmarks.append((dtype, len(shapes), weights_layout))
        return {**placeholder_benchmark(), "error": None}

    def fake_timeline(m, n, k, kernels):
        timelines.append(((m, n, k), tuple(kernels)))
        result = placeholder_timeline((m, n, k))
        if m == 16:  # a decode shape whose recording lost a tile
            result["kernels"]["tiled"]["parts"].pop()
        return result

    monkeypatch.setattr(gpu_work, "device_info", lambda: {"gpu": PLACEHOLDER_GPU, "sm_count": 8, "kernel_loaded": True,
                                                          "kernel": "placeholder", "message": ""})
    monkeypatch.setattr(gpu_work, "kernel_rungs", lambda: ["tiled", "persistent"])
    monkeypatch.setattr(gpu_work, "run_benchmark", fake_benchmark)
    monkeypatch.setattr(gpu_work, "run_timeline", fake_timeline)
    monkeypatch.setattr(sys, "argv", ["record.py", "--out", str(tmp_path)])
    assert record.main() == 1  # the decode shape failed its check
    # 16 x 4096 in 512 x 512 tiles: one row of 8 tiles, the last one lost
    assert "timeline decode: 16x4096x4096: sanity checks failed: tiled: 1 of 8 tile(s) missing, e.g. (0, 7)" in \
        capsys.readouterr().err
    assert [b[2] for b in benchmarks[1:]] == [validation.weights_layout(p) for _, p in record.BENCHMARK_RUNS]
    assert {t[0] for t in timelines} == set(validation.TIMELINE_PRESETS.values())
    assert all(t[1] == validation.TIMELINE_KERNELS for t in timelines)
    written = recorded.load_timelines(tmp_path)
    assert sorted(written) == sorted(recorded.shape_key(s) for s in validation.TIMELINE_PRESETS.values() if s[0] != 16)
    assert recorded.load_benchmark(tmp_path)["rows"]


def test_record_allows_cta_pairs_their_half_empty_tile_row():
    """record.py's CTA-count check: CTA pairs over an odd number of tile rows with fewer
    tiles than SMs run a CTA per tile row of the last pair, more than tile_config's
    single-CTA count, and that passes; a launch past one CTA per SM does not."""
    import record

    # 3 x 2 tiles of 512 on 8 SMs: single CTAs run 6, pairs 2 pairs x 2 columns = 8 CTAs.
    result = placeholder_timeline((1536, 1024, 256), sm_count=8)
    kern = result["kernels"]["wgmma_persistent"]
    kern["tile_config"]["persistent_ctas"], kern["grid"] = 6, 8
    assert record.most_ctas(kern, result["shape"], 8) == 8
    assert record.timeline_problems(result) == []
    kern["grid"] = 9
    assert record.timeline_problems(result) == ["wgmma_persistent: 9 CTAs ran, at most 8 may (tile_config)"]
    kern["cluster_size"] = 1  # single CTAs: tile_config's count is the bound
    kern["grid"] = 8
    assert record.timeline_problems(result) == ["wgmma_persistent: 8 CTAs ran, at most 6 may (tile_config)"]


def test_record_skip_flags_record_one_half(tmp_path, monkeypatch):
    """record.py --skip-timelines records the benchmark alone, --skip-benchmark the timelines alone."""
    import gpu_work
    import record

    calls = []
    monkeypatch.setattr(gpu_work, "device_info", lambda: {"gpu": PLACEHOLDER_GPU, "sm_count": 8, "kernel_loaded": True,
                                                          "kernel": "placeholder", "message": ""})
    monkeypatch.setattr(gpu_work, "kernel_rungs", lambda: ["tiled"])
    monkeypatch.setattr(gpu_work, "run_benchmark", lambda *a, **kw: calls.append("benchmark") or
                        {**placeholder_benchmark(), "error": None})
    monkeypatch.setattr(gpu_work, "run_timeline", lambda m, n, k, kernels: calls.append("timeline") or
                        placeholder_timeline((m, n, k)))
    for flag, expected in (("--skip-timelines", {"benchmark"}), ("--skip-benchmark", {"timeline"})):
        calls.clear()
        monkeypatch.setattr(sys, "argv", ["record.py", "--out", str(tmp_path / flag), flag])
        assert record.main() == 0
        assert set(calls) == expected


def test_timeline_cluster_size_comes_from_the_kernels_tile_config():
    """run_timeline labels CTA pairs as the kernel's tile_config says (a CUDA 12 build
    runs single CTAs where a CUDA 13 build pairs them); tile_configs of builds before
    it said fall back on wgmma_persistent's own rule."""
    import gpu_work

    assert gpu_work.cluster_size("wgmma_persistent", 4096, {"cluster_size": 1}) == 1
    assert gpu_work.cluster_size("wgmma_persistent", 4096, {"cluster_size": 2}) == 2
    assert gpu_work.cluster_size("wgmma_persistent", 4096, {}) == 2
    assert gpu_work.cluster_size("wgmma_persistent", 128, {}) == 1
    assert gpu_work.cluster_size("persistent", 4096, {}) == 1


def test_committed_recordings_pass_the_sanity_checks():
    """What the Space shows without a GPU (space/recorded/) holds a timeline for every
    shape preset with every kernel of the pairs, each passing record.py's checks (every
    tile or part once, K covered, SM ids in range, CTA counts the tile_config allows),
    and a benchmark with rows of every rung on a real GPU."""
    import record
    import recorded
    import validation

    directory = SPACE / "recorded"
    timelines = recorded.load_timelines(directory)
    assert sorted(timelines) == sorted(recorded.shape_key(s) for s in validation.TIMELINE_PRESETS.values())
    for key, result in timelines.items():
        assert set(result["kernels"]) == set(validation.TIMELINE_KERNELS), key
        assert all(kern["parts"] for kern in result["kernels"].values()), key
        assert record.timeline_problems(result) == [], key
        assert result["environment"]["gpu"] != PLACEHOLDER_GPU
    benchmark = recorded.load_benchmark(directory)
    assert {row["rung"] for row in benchmark["rows"]} >= {"cuBLAS", "tiled", "persistent", "wgmma_persistent"}
    assert benchmark["environment"]["gpu"] != PLACEHOLDER_GPU
