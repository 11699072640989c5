"""persistent-matmul Space: benchmark the kernel's rungs against cuBLAS and show
per-SM tile timelines of the tiled and persistent kernels.

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
import validation  # noqa: E402
from validation import InputError  # noqa: E402

ZERO_GPU = bool(os.environ.get("SPACES_ZERO_GPU")) and gpu_work.spaces is not None
# PM_RECORDED_ONLY=1: never measure, always show the recording (tests use it on any machine).
RECORDED_ONLY = os.environ.get("PM_RECORDED_ONLY", "") not in ("", "0")
DOWNLOAD_DIR = Path(tempfile.mkdtemp(prefix="pm-space-"))
DEFAULT_RUNGS = ("tiled", "persistent")  # the page's first selection: the pair the Space is about


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
    return {"info": info, "live": live, "bench": bench, "timeline": recorded.load_timeline(), "rungs": rungs}


STATE = _startup()


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
    figure: Any
    table: Any
    summary: str
    csv: Any
    json: Any


class TimelineView(NamedTuple):
    """What the Timeline tab shows, one field per output component, in their order."""

    status: str
    figure: Any
    summary: str


def status_only(view: type[BenchmarkView] | type[TimelineView], status: str) -> BenchmarkView | TimelineView:
    """A tab's outputs with a new status line, every other output left as it is."""
    return view(status, *[gr.skip()] * (len(view._fields) - 1))


def _downloads(rows: list[dict], environment: dict) -> tuple[str, str]:
    """CSV and JSON files of ``rows`` for the download buttons."""
    directory = Path(tempfile.mkdtemp(dir=DOWNLOAD_DIR))
    csv_path, json_path = directory / "benchmark.csv", directory / "benchmark.json"
    fields = ["m", "n", "k", "dtype", "rung", "ms", "tflops", "ratio_vs_cublas", "rel_error", "note"]
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
    return BenchmarkView(status=status, figure=plots.benchmark_figure(rows, title, STATE["rungs"]),
                         table=plots.benchmark_table(rows), summary=plots.benchmark_summary(rows, STATE["rungs"]),
                         csv=csv_path, json=json_path)


def recorded_benchmark(rungs: list[str] | None = None, dtype: str | None = None) -> BenchmarkView:
    """The recorded benchmark (the rows matching ``rungs``/``dtype`` where there are any)."""
    bench = STATE["bench"]
    if not bench:
        return BenchmarkView(status="**No recorded benchmark yet.** Run `python space/record.py` on a GPU to "
                             "record one.", figure=plots.benchmark_figure([], ""), table=[], summary="",
                             csv=None, json=None)
    env, rows = bench["environment"], bench["rows"]
    label = recorded.describe(env)
    status = f"**Recorded results**, {label}."
    if rungs is not None and dtype is not None:
        chosen = [r for r in rows if r["dtype"] == dtype and (r["rung"] == gpu_work.CUBLAS or r["rung"] in rungs)]
        if chosen:
            rows = chosen
        else:
            status += f" The recording has no {dtype} rows for this selection, so all recorded rows are shown."
    short = f"Recorded on {env.get('gpu') or 'a GPU'}, {env.get('date') or 'unknown date'}"
    return benchmark_outputs(rows, env, status, short)


def timeline_outputs(result: dict | None, status: str, label: str) -> TimelineView:
    """The Timeline tab's outputs for a timeline result."""
    if not result or result.get("error"):
        why = (result or {}).get("error") or "no recorded timeline yet; run `python space/record.py` on a GPU"
        return TimelineView(status=f"{status} **No timeline to show:** {why}.", figure=plots.timeline_figure({}, ""),
                            summary="")
    return TimelineView(status=status, figure=plots.timeline_figure(result, label),
                        summary=plots.timeline_summary(result))


def recorded_timeline() -> TimelineView:
    """The recorded timeline, labelled as recorded."""
    result = STATE["timeline"]
    if not result or result.get("error"):
        return timeline_outputs(result, "", "")
    label = recorded.describe(result["environment"])
    env = result["environment"]
    short = f"Recorded on {env.get('gpu') or 'a GPU'}, {env.get('date') or 'unknown date'}"
    return timeline_outputs(result, f"**Recorded timeline**, {label}.", short)


def _warn(message: str) -> str:
    gr.Warning(message)
    return f"⚠️ {message}"


# --------------------------------------------------------------------------- handlers


def benchmark(rungs, dtype, preset, custom, progress=gr.Progress()) -> BenchmarkView:
    """Benchmark button: validate, then measure (GPU) or show the recording (no GPU)."""
    try:
        rungs, dtype, shapes = validation.benchmark_request(rungs, dtype, preset, custom, STATE["rungs"])
    except InputError as exc:
        return status_only(BenchmarkView, _warn(str(exc)))
    try:
        if not STATE["live"]:
            out = recorded_benchmark(rungs, dtype)
            return out._replace(status=f"Cannot run live: {no_gpu_reason()}. {out.status}")
        result = gpu_work.run_benchmark(rungs, dtype, shapes, progress=None if ZERO_GPU else progress)
        if result.get("error") and not result["rows"]:
            return status_only(BenchmarkView, _warn(f"The benchmark did not run: {result['error']}"))
        env = result["environment"]
        label = f"Live on {env.get('gpu')} ({env.get('date')})"
        return benchmark_outputs(result["rows"], env, f"**{label}**, {len(shapes)} shape(s), {dtype}.", label)
    except Exception as exc:  # noqa: BLE001 - a message on the page, never a traceback
        return status_only(BenchmarkView, _warn(f"The benchmark failed: {type(exc).__name__}: {exc}"))


def timeline(m, n, k) -> TimelineView:
    """Timeline button: validate, then record timelines (GPU) or show the recording (no GPU)."""
    try:
        m, n, k = validation.timeline_request(m, n, k)
    except InputError as exc:
        return status_only(TimelineView, _warn(str(exc)))
    try:
        if not STATE["live"]:
            out = recorded_timeline()
            return out._replace(status=f"Cannot run live: {no_gpu_reason()}. {out.status}")
        result = gpu_work.run_timeline(m, n, k)
        if result.get("error"):
            return status_only(TimelineView, _warn(f"The timeline did not run: {result['error']}"))
        env = result["environment"]
        label = f"Live on {env.get('gpu')} ({env.get('date')})"
        return timeline_outputs(result, f"**{label}**.", label)
    except Exception as exc:  # noqa: BLE001 - a message on the page, never a traceback
        return status_only(TimelineView, _warn(f"The timeline failed: {type(exc).__name__}: {exc}"))


# --------------------------------------------------------------------------- layout


def build() -> gr.Blocks:
    """The Blocks app; initial outputs are the recorded results."""
    b_init, t_init = recorded_benchmark(), recorded_timeline()
    live_note = "" if STATE["live"] else " (no GPU here: Run shows the recorded results instead)"
    with gr.Blocks(title="persistent-matmul") as demo:
        gr.Markdown(header_markdown(), elem_id="header")
        with gr.Tab("Benchmark", id="benchmark"):
            with gr.Row():
                rungs = gr.CheckboxGroup(STATE["rungs"], value=[r for r in DEFAULT_RUNGS if r in STATE["rungs"]],
                                         label="Rungs (cuBLAS via torch.matmul always runs)")
                dtype = gr.Radio(list(validation.DTYPE_CHOICES), value="bfloat16", label="dtype")
            with gr.Row():
                preset = gr.Dropdown(list(validation.PRESETS), value=validation.DEFAULT_PRESET,
                                     label="Shapes", elem_id="preset")
                custom = gr.Textbox(label=f"Custom shapes MxNxK (preset 'custom'; up to {validation.MAX_SHAPES}, "
                                          f"each dim <= {validation.MAX_DIM})",
                                    placeholder="4096x4096x4096, 16x4096x4096", elem_id="custom-shapes")
            run_b = gr.Button("Run benchmark" + live_note, variant="primary", elem_id="run-benchmark")
            b_status = gr.Markdown(b_init.status, elem_id="benchmark-status")
            b_plot = gr.Plot(b_init.figure, label="TFLOP/s", show_label=False, elem_id="benchmark-plot")
            b_summary = gr.Markdown(b_init.summary)
            b_table = gr.Dataframe(b_init.table, headers=plots.TABLE_HEADERS, label="Results", interactive=False,
                                   elem_id="benchmark-table")
            with gr.Row():
                b_csv = gr.File(b_init.csv, label="CSV")
                b_json = gr.File(b_init.json, label="JSON")
        with gr.Tab("Timeline", id="timeline"):
            gr.Markdown("Which SM ran each output tile, and when: `tiled` (one CTA per tile) against "
                        "`persistent` (one wave of CTAs looping over tiles), bfloat16.")
            with gr.Row():
                tm, tn, tk = (gr.Textbox(str(v), label=name, elem_id=f"timeline-{name.lower()}")
                              for v, name in zip(validation.DEFAULT_TIMELINE_SHAPE, "MNK"))
            run_t = gr.Button("Run timeline" + live_note, variant="primary", elem_id="run-timeline")
            t_status = gr.Markdown(t_init.status, elem_id="timeline-status")
            t_plot = gr.Plot(t_init.figure, label="Tile timeline", show_label=False, elem_id="timeline-plot")
            t_summary = gr.Markdown(t_init.summary, elem_id="timeline-summary")
        # In BenchmarkView's and TimelineView's field order.
        run_b.click(benchmark, [rungs, dtype, preset, custom], [b_status, b_plot, b_table, b_summary, b_csv, b_json],
                    api_name="benchmark")
        run_t.click(timeline, [tm, tn, tk], [t_status, t_plot, t_summary], api_name="timeline")
    demo.queue(default_concurrency_limit=1, max_size=16)
    return demo


if __name__ == "__main__":
    build().launch(server_name=os.environ.get("GRADIO_SERVER_NAME", "0.0.0.0"),
                   server_port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")),
                   theme=gr.themes.Soft(), allowed_paths=[str(DOWNLOAD_DIR)])
