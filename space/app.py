"""persistent-matmul Space: benchmark the kernel's rungs against cuBLAS and show
per-SM tile timelines of each one-CTA-per-tile rung against its persistent twin,
as a picture and as an animated replay.

With a GPU (or on ZeroGPU) the Run buttons measure live. Without one, both tabs
show results recorded on a real GPU (``recorded/``, or env ``PM_RECORDED_DIR``),
labelled as recorded. ``python app.py`` serves on ``GRADIO_SERVER_PORT``
(default 7860).
"""

from __future__ import annotations

import csv
import json
import os
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

import gpu_work  # first: imports `spaces` (ZeroGPU) before torch touches CUDA

import gradio as gr  # noqa: E402

import plots  # noqa: E402
import recorded  # noqa: E402
import replay  # noqa: E402
import validation  # noqa: E402
from validation import InputError  # noqa: E402

ZERO_GPU = bool(os.environ.get("SPACES_ZERO_GPU")) and gpu_work.spaces is not None
# PM_RECORDED_ONLY=1: never measure, always show the recording (tests use it on any machine).
RECORDED_ONLY = os.environ.get("PM_RECORDED_ONLY", "") not in ("", "0")
DOWNLOAD_DIR = Path(tempfile.mkdtemp(prefix="pm-space-"))
# The page's first selection: the best pair this GPU runs, the persistent rung first
# in the order of preference (plots.PERSISTENT_PAIRS, reversed: wgmma's before mma.sync's).
PREFERRED_PAIRS = tuple(reversed(plots.PERSISTENT_PAIRS))
GPU_QUEUE = "gpu"  # the events that run GPU work share one queue of one job at a time
REPLAY_TICK_S = 0.4  # seconds between replay frames while playing


# --------------------------------------------------------------------------- state at start


def _startup() -> dict:
    """Kernel, device and recorded results, read once when the app starts. ``rungs``,
    the rungs the page offers, are the kernel's (``KERNELS``, in its order); without
    a kernel, those of the recorded benchmark. Rungs the device cannot run (wgmma
    and wgmma_persistent off Hopper) stay on offer: their rows say why they did not
    run."""
    info = gpu_work.device_info()
    live = info["kernel_loaded"] and (info["gpu"] is not None or ZERO_GPU) and not RECORDED_ONLY
    bench = recorded.load_benchmark()
    rungs = gpu_work.kernel_rungs()
    if not rungs and bench:
        rungs = list(dict.fromkeys(r["rung"] for r in bench["rows"] if r["rung"] != gpu_work.CUBLAS))
    return {"info": info, "live": live, "bench": bench, "timelines": recorded.load_timelines(), "rungs": rungs}


STATE = _startup()


def default_rungs() -> list[str]:
    """The rungs selected when the page opens: the pair of the best rung of this GPU.
    Live, the first pair of PREFERRED_PAIRS whose persistent rung runs here; from a
    recording, the pair of the rung with the best ratio to cuBLAS there."""
    offered = STATE["rungs"]
    pairs = [pair for pair in PREFERRED_PAIRS if all(r in offered for r in pair)]
    chosen = None
    if STATE["live"]:
        rungs = STATE["info"]["rungs"]
        chosen = next((pair for pair in pairs if rungs.get(pair[0], {}).get("available")), None)
    elif STATE["bench"]:
        best = plots.best_rung([r for r in STATE["bench"]["rows"] if r["dtype"] == "bfloat16"])
        chosen = next((pair for pair in pairs if best in pair), None)
    chosen = chosen or ("persistent", "tiled")
    return [r for r in reversed(chosen) if r in offered]


def no_gpu_reason() -> str:
    """Why the Run buttons cannot measure here."""
    info = STATE["info"]
    if RECORDED_ONLY:
        return "recorded-only mode (PM_RECORDED_ONLY is set)"
    if not info["kernel_loaded"]:
        return f"the kernel did not load ({info['kernel']})"
    return "this machine has no CUDA GPU"


def header_markdown() -> str:
    """Which kernel build is loaded, what runs here and why not the rest; the no-GPU banner."""
    info = STATE["info"]
    lines = ["# persistent-matmul: from a naive CUDA kernel to a persistent tensor-core matmul", ""]
    if not STATE["live"]:
        bench = STATE["bench"]
        if bench:
            env = bench["environment"]
            lines.append(f"> **{'No GPU here' if not RECORDED_ONLY else 'Recorded-only mode'}: showing results recorded on {env.get('gpu') or 'a GPU'} "
                         f"on {env.get('date') or 'an unknown date'}** ({no_gpu_reason()}).")
        else:
            lines.append(f"> **No GPU here and no recorded results yet** ({no_gpu_reason()}). "
                         "Record them on a GPU with `python space/record.py`.")
        lines.append("")
    lines.append(f"**Kernel build:** {info['kernel']}  ")
    if ZERO_GPU:
        lines.append("**Device:** ZeroGPU: a GPU is attached for each run; the results name it.")
    else:
        device = info["gpu"] or "no CUDA device"
        if info["gpu"]:
            device += f" ({info['sm_count']} SMs, compute capability {info['capability']})"
        lines += [f"**Device:** {device}", "", "| rung | runs here | dtypes | why / why not |", "|---|---|---|---|"]
        for name, rung in info["rungs"].items():
            lines.append(f"| {name} | {'yes' if rung['available'] else 'no'} | {', '.join(rung['dtypes'])} "
                         f"| {rung['reason']} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- outputs


class BenchmarkView(NamedTuple):
    """What the Benchmark tab shows, one field per output component, in their order."""

    status: str
    headline: str
    figure: Any
    table: Any
    summary: str
    csv: Any
    json: Any


class TimelineView(NamedTuple):
    """What the Timeline tab shows, one field per output component, in their order:
    the picture and numbers, then the replay's data (a gr.State), its time slider and
    its first frame."""

    status: str
    figure: Any
    summary: str
    replay: Any
    slider: Any
    frame: Any


def status_only(view: type[BenchmarkView] | type[TimelineView], status: str) -> BenchmarkView | TimelineView:
    """A tab's outputs with a new status line, every other output left as it is."""
    return view(status, *[gr.skip()] * (len(view._fields) - 1))


def _downloads(rows: list[dict], environment: dict) -> tuple[str, str]:
    """CSV and JSON files of ``rows`` for the download buttons."""
    directory = Path(tempfile.mkdtemp(dir=DOWNLOAD_DIR))
    csv_path, json_path = directory / "benchmark.csv", directory / "benchmark.json"
    fields = ["m", "n", "k", "dtype", "layout", "rung", "ms", "tflops", "graph_ms", "host_us", "ratio_vs_cublas",
              "rel_error", "note"]
    with csv_path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    json_path.write_text(json.dumps({"environment": environment, "rows": rows}, indent=1) + "\n")
    return str(csv_path), str(json_path)


def benchmark_outputs(rows: list[dict], environment: dict, status: str, label: str) -> BenchmarkView:
    """The Benchmark tab's outputs for a set of rows."""
    csv_path, json_path = _downloads(rows, environment)
    title = f"{label}: TFLOP/s per shape and rung (cuBLAS = torch.matmul)"
    return BenchmarkView(status=status, headline=plots.benchmark_headline(rows),
                         figure=plots.benchmark_figure(rows, title, STATE["rungs"]),
                         table=plots.benchmark_table(rows), summary=plots.benchmark_summary(rows, STATE["rungs"]),
                         csv=csv_path, json=json_path)


def recorded_benchmark(rungs: list[str] | None = None, dtype: str | None = None,
                       shapes: list[tuple[int, int, int]] | None = None) -> BenchmarkView:
    """The recorded benchmark: the rows of ``rungs`` in ``dtype`` on ``shapes`` where
    the recording has them, else (saying so) those of the rungs and dtype on any
    shape, else every recorded row."""
    bench = STATE["bench"]
    if not bench:
        return BenchmarkView(status="**No recorded benchmark yet.** Run `python space/record.py` on a GPU to "
                             "record one.", headline="", figure=plots.benchmark_figure([], ""), table=[],
                             summary="", csv=None, json=None)
    env, rows = bench["environment"], bench["rows"]
    label = recorded.describe(env)
    status = f"**Recorded results**, {label}."
    if rungs is not None and dtype is not None:
        chosen = [r for r in rows if r["dtype"] == dtype and (r["rung"] == gpu_work.CUBLAS or r["rung"] in rungs)]
        wanted = set(map(tuple, shapes or []))
        on_shapes = [r for r in chosen if (r["m"], r["n"], r["k"]) in wanted]
        if on_shapes:
            rows = on_shapes
            have = {(r["m"], r["n"], r["k"]) for r in on_shapes}
            if len(have) < len(wanted):
                status += f" The recording has {len(have)} of these {len(wanted)} shapes."
        elif chosen:
            rows = chosen
            if wanted:
                status += " The recording has none of these shapes, so its other shapes are shown."
        else:
            status += f" The recording has no {dtype} rows for this selection, so all recorded rows are shown."
    short = f"Recorded on {env.get('gpu') or 'a GPU'}, {env.get('date') or 'unknown date'}"
    return benchmark_outputs(rows, env, status, short)


def _short(env: dict) -> str:
    return f"Recorded on {env.get('gpu') or 'a GPU'}, {env.get('date') or 'unknown date'}"


def timeline_outputs(result: dict | None, kernels: tuple[str, str], status: str, label: str) -> TimelineView:
    """The Timeline tab's outputs for a timeline result and one pair of its kernels."""
    if not result or result.get("error"):
        why = (result or {}).get("error") or "no recorded timeline for this shape yet; record one with " \
                                             "`python space/record.py` on a GPU"
        return TimelineView(status=f"{status} **No timeline to show:** {why}.",
                            figure=plots.timeline_figure({}, ""), summary="", replay=None,
                            slider=gr.Slider(value=0, maximum=1), frame=None)
    data = {"result": result, "kernels": list(kernels), "label": label}
    end = replay.span_us(result, kernels)
    step = end / (replay.FRAMES - 1) if end > 0 else 1
    return TimelineView(status=status, figure=plots.timeline_figure(result, label, kernels),
                        summary=plots.timeline_summary(result, kernels), replay=data,
                        slider=gr.Slider(value=0, minimum=0, maximum=end or 1, step=step),
                        frame=replay.frame(result, kernels, 0.0, label))


def recorded_timeline(shape: tuple[int, int, int], kernels: tuple[str, str]) -> TimelineView:
    """The recorded timeline of ``shape``, labelled as recorded."""
    result = STATE["timelines"].get(recorded.shape_key(shape))
    if not result or result.get("error"):
        return timeline_outputs(result, kernels, f"{recorded.shape_key(shape)}:", "")
    env = result["environment"]
    return timeline_outputs(result, kernels, f"**Recorded timeline**, {recorded.describe(env)}.", _short(env))


def default_timeline_preset() -> str:
    """The first timeline preset with a recording (the default one when none has)."""
    keys = STATE["timelines"]
    return next((name for name, shape in validation.TIMELINE_PRESETS.items()
                 if not (keys.get(recorded.shape_key(shape)) or {"error": 1}).get("error")),
                validation.DEFAULT_TIMELINE_PRESET)


def _warn(message: str) -> str:
    gr.Warning(message)
    return f"⚠️ {message}"


# --------------------------------------------------------------------------- handlers


def benchmark(rungs, dtype, preset, custom, progress=gr.Progress()) -> BenchmarkView:
    """Benchmark button: validate, then measure (GPU) or show the recording (no GPU)."""
    try:
        rungs, dtype, shapes = validation.benchmark_request(rungs, dtype, preset, custom, STATE["rungs"])
        layout = validation.weights_layout(preset)
        validation.check_seconds(gpu_work.benchmark_seconds(rungs, dtype, shapes, layout), "benchmark")
    except InputError as exc:
        return status_only(BenchmarkView, _warn(str(exc)))
    try:
        if not STATE["live"]:
            out = recorded_benchmark(rungs, dtype, shapes)
            return out._replace(status=f"Cannot run live: {no_gpu_reason()}. {out.status}")
        result = gpu_work.run_benchmark(rungs, dtype, shapes, layout, progress=None if ZERO_GPU else progress)
        if result.get("error") and not result["rows"]:
            return status_only(BenchmarkView, _warn(f"The benchmark did not run: {result['error']}"))
        env = result["environment"]
        label = f"Live on {env.get('gpu')} ({env.get('date')})"
        return benchmark_outputs(result["rows"], env, f"**{label}**, {len(shapes)} shape(s), {dtype}.", label)
    except Exception as exc:  # noqa: BLE001 - a message on the page, never a traceback
        return status_only(BenchmarkView, _warn(f"The benchmark failed: {type(exc).__name__}: {exc}"))


def select_timeline(preset, pair, m, n, k) -> TimelineView:
    """Shape or pair picked: the recorded timeline of that shape and pair (no GPU work)."""
    try:
        shape = validation.timeline_shape(preset, m, n, k)
        kernels = validation.timeline_pair(pair)
    except InputError as exc:
        return status_only(TimelineView, _warn(str(exc)))
    return recorded_timeline(shape, kernels)


def timeline(preset, pair, m, n, k) -> TimelineView:
    """Timeline button: validate, then record timelines (GPU) or show the recording (no GPU)."""
    try:
        shape = validation.timeline_shape(preset, m, n, k)
        kernels = validation.timeline_pair(pair)
        validation.check_seconds(gpu_work.timeline_seconds(*shape, kernels), "timeline")
    except InputError as exc:
        return status_only(TimelineView, _warn(str(exc)))
    try:
        if not STATE["live"]:
            out = recorded_timeline(shape, kernels)
            return out._replace(status=f"Cannot run live: {no_gpu_reason()}. {out.status}")
        result = gpu_work.run_timeline(*shape, kernels)
        if result.get("error"):
            return status_only(TimelineView, _warn(f"The timeline did not run: {result['error']}"))
        env = result["environment"]
        label = f"Live on {env.get('gpu')} ({env.get('date')})"
        return timeline_outputs(result, kernels, f"**{label}**.", label)
    except Exception as exc:  # noqa: BLE001 - a message on the page, never a traceback
        return status_only(TimelineView, _warn(f"The timeline failed: {type(exc).__name__}: {exc}"))


def _replay_time(data, t) -> float:
    """The slider's time, checked against the replay it belongs to."""
    if not data:
        raise InputError("No timeline to replay: pick a shape with a recording, or run one.")
    try:
        t = float(t)
    except (TypeError, ValueError):
        raise InputError(f"Replay time {t!r} is not a number.") from None
    end = replay.span_us(data["result"], data["kernels"])
    if not 0 <= t <= end * 1.0001 + 1e-9:
        raise InputError(f"Replay time {t:g} µs is outside this run (0 to {end:.1f} µs).")
    return t


def replay_frame(data, t):
    """Slider moved: the run at that time."""
    try:
        t = _replay_time(data, t)
    except InputError as exc:
        _warn(str(exc))
        return gr.skip()
    return replay.frame(data["result"], data["kernels"], t, data["label"])


def replay_step(data, t):
    """A tick while playing: the next moment (slider and frame); at the end, stop the timer.

    Only Play starts the timer: a tick still running when Pause lands leaves it alone
    (gr.skip()), so it cannot switch the timer back on after Pause."""
    if not data:
        return gr.skip(), gr.skip(), gr.Timer(active=False)
    end = replay.span_us(data["result"], data["kernels"])
    step = end / (replay.FRAMES - 1) if end > 0 else 1
    try:
        current = float(t)
    except (TypeError, ValueError):
        current = 0.0
    nxt = 0.0 if current >= end - step / 2 else min(end, current + step)  # at the end, play starts over
    last = nxt >= end - step / 2
    return nxt, replay.frame(data["result"], data["kernels"], nxt, data["label"]), (
        gr.Timer(active=False) if last else gr.skip())


def replay_gif(data):
    """Download button: the whole replay as an animated GIF."""
    if not data:
        _warn("No timeline to replay: pick a shape with a recording, or run one.")
        return None
    m, n, k = data["result"]["shape"]
    path = Path(tempfile.mkdtemp(dir=DOWNLOAD_DIR)) / f"replay-{m}x{n}x{k}-{'-vs-'.join(data['kernels'])}.gif"
    return str(replay.gif(data["result"], data["kernels"], data["label"], path))


# --------------------------------------------------------------------------- layout


def build() -> gr.Blocks:
    """The Blocks app; initial outputs are the recorded results."""
    b_init = recorded_benchmark(default_rungs(), "bfloat16", validation.PRESETS[validation.DEFAULT_PRESET])
    t_preset, t_pair = default_timeline_preset(), validation.DEFAULT_TIMELINE_PAIR
    t_init = recorded_timeline(validation.TIMELINE_PRESETS[t_preset], validation.TIMELINE_PAIRS[t_pair])
    live_note = "" if STATE["live"] else " (no GPU here: Run shows the recorded results instead)"
    gpu_queue = {"concurrency_limit": 1, "concurrency_id": GPU_QUEUE}
    with gr.Blocks(title="persistent-matmul") as demo:
        gr.Markdown(header_markdown(), elem_id="header")
        with gr.Tab("Benchmark", id="benchmark"):
            with gr.Row():
                rungs = gr.CheckboxGroup(STATE["rungs"], value=default_rungs(),
                                         label="Rungs (cuBLAS via torch.matmul always runs)", elem_id="rungs")
                dtype = gr.Radio(list(validation.DTYPE_CHOICES), value="bfloat16", label="dtype")
            with gr.Row():
                preset = gr.Dropdown(list(validation.PRESETS), value=validation.DEFAULT_PRESET,
                                     label="Shapes", elem_id="preset")
                custom = gr.Textbox(label=f"Custom shapes MxNxK (preset 'custom'; up to {validation.MAX_SHAPES}, "
                                          f"each dim <= {validation.MAX_DIM})",
                                    placeholder="4096x4096x4096, 16x4096x4096", elem_id="custom-shapes")
            run_b = gr.Button("Run benchmark" + live_note, variant="primary", elem_id="run-benchmark")
            b_status = gr.Markdown(b_init.status, elem_id="benchmark-status")
            b_headline = gr.Markdown(b_init.headline, elem_id="benchmark-headline")
            b_plot = gr.Plot(b_init.figure, label="TFLOP/s", show_label=False, elem_id="benchmark-plot")
            b_summary = gr.Markdown(b_init.summary)
            b_table = gr.Dataframe(b_init.table, headers=plots.TABLE_HEADERS, label="Results (ms: eager, "
                                   "back-to-back calls; ms in CUDA graph: the kernel alone; host µs/call: "
                                   "what enqueuing one call costs the CPU)", interactive=False,
                                   elem_id="benchmark-table")
            with gr.Row():
                b_csv = gr.File(b_init.csv, label="CSV")
                b_json = gr.File(b_init.json, label="JSON")
        with gr.Tab("Timeline", id="timeline"):
            gr.Markdown("Which SM ran each output tile (or each K-range of a split tile), and when: a rung that "
                        "launches one CTA per tile against its persistent twin, bfloat16. Below, the same run "
                        "replayed in time.")
            with gr.Row():
                t_shape = gr.Dropdown([*validation.TIMELINE_PRESETS, validation.TIMELINE_CUSTOM], value=t_preset,
                                      label="Shape", elem_id="timeline-preset")
                t_pair_box = gr.Dropdown(list(validation.TIMELINE_PAIRS), value=t_pair, label="Kernels",
                                         elem_id="timeline-pair")
                tm, tn, tk = (gr.Textbox(str(v), label=f"{name} (custom shape)", elem_id=f"timeline-{name.lower()}")
                              for v, name in zip(validation.DEFAULT_TIMELINE_SHAPE, "MNK"))
            run_t = gr.Button("Run timeline" + live_note, variant="primary", elem_id="run-timeline")
            t_status = gr.Markdown(t_init.status, elem_id="timeline-status")
            t_plot = gr.Plot(t_init.figure, label="Tile timeline", show_label=False, elem_id="timeline-plot")
            t_summary = gr.Markdown(t_init.summary, elem_id="timeline-summary")
            gr.Markdown("### Replay\nTime advances; tiles appear on their SMs as they ran, and each kernel's "
                        "idle SM-time grows. Play, pause, or drag the time.")
            t_replay = gr.State(t_init.replay)
            with gr.Row():
                play = gr.Button("▶ Play", elem_id="replay-play", scale=0)
                pause = gr.Button("Pause", elem_id="replay-pause", scale=0)
                slider = gr.Slider(minimum=0, maximum=t_init.slider.maximum, step=t_init.slider.step, value=0,
                                   label="time (µs since each kernel's first tile started)",
                                   elem_id="replay-slider")
            frame = gr.Image(t_init.frame, label="Replay", show_label=False, type="numpy", format="png",
                             interactive=False, elem_id="replay-frame")
            with gr.Row():
                make_gif = gr.Button("Make GIF of the replay", elem_id="replay-gif-button", scale=0)
                gif_file = gr.File(label="Replay (GIF)", elem_id="replay-gif")
            timer = gr.Timer(REPLAY_TICK_S, active=False)
        # In BenchmarkView's and TimelineView's field order.
        b_outputs = [b_status, b_headline, b_plot, b_table, b_summary, b_csv, b_json]
        t_outputs = [t_status, t_plot, t_summary, t_replay, slider, frame]
        t_inputs = [t_shape, t_pair_box, tm, tn, tk]
        run_b.click(benchmark, [rungs, dtype, preset, custom], b_outputs, api_name="benchmark", **gpu_queue)
        run_t.click(timeline, t_inputs, t_outputs, api_name="timeline", **gpu_queue)
        gr.on([t_shape.input, t_pair_box.input], select_timeline, t_inputs, t_outputs, api_name="select_timeline")
        slider.release(replay_frame, [t_replay, slider], frame, api_name="replay_frame", trigger_mode="always_last")
        play.click(lambda: gr.Timer(active=True), None, timer, api_name=False)
        pause.click(lambda: gr.Timer(active=False), None, timer, api_name=False)
        timer.tick(replay_step, [t_replay, slider], [slider, frame, timer], api_name=False, trigger_mode="once")
        make_gif.click(replay_gif, t_replay, gif_file, api_name="replay_gif")
    demo.queue(default_concurrency_limit=2, max_size=64)
    return demo


if __name__ == "__main__":
    build().launch(server_name=os.environ.get("GRADIO_SERVER_NAME", "0.0.0.0"),
                   server_port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")),
                   theme=gr.themes.Soft(), allowed_paths=[str(DOWNLOAD_DIR)])
