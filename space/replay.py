"""The animated replay of a measured timeline: the run drawn as it stood at a time t.

``frame`` renders one moment of two (or more) kernels side by side, each from its
own first start: parts that had started are drawn, those still running cut at t,
and each panel counts the idle SM-time so far. ``gif`` renders ``FRAMES`` moments
from 0 to the longer kernel's end into an animated GIF (Pillow, which matplotlib
depends on). Everything here is CPU work on the plain timeline data.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from PIL import Image

import plots

FRAMES = 40  # moments in a GIF, and steps of the page's time slider
GIF_SECONDS = 6.0  # one pass of the GIF
FRAME_DPI = 72  # the replay is watched, not printed: small frames render fast


def span_us(result: dict, kernels) -> float:
    """The longest of ``kernels``' spans (µs from each one's first start to its last end)."""
    spans = [plots.timeline_stats(result["kernels"][name].get("parts") or [], result.get("sm_count") or 0)["span_us"]
             for name in kernels if name in result.get("kernels", {})]
    return max(spans, default=0.0)


def frame_times(result: dict, kernels, frames: int = FRAMES) -> list[float]:
    """``frames`` moments, µs, evenly from the first start to the longer kernel's end."""
    if frames < 2:
        raise ValueError(f"a replay needs at least 2 frames, got {frames}")
    end = span_us(result, kernels)
    return [end * i / (frames - 1) for i in range(frames)]


def _render(fig) -> np.ndarray:
    """An RGB array of a matplotlib Figure (drawn with Agg, no pyplot)."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


def frame(result: dict, kernels, t_us: float, title: str) -> np.ndarray:
    """The run at ``t_us`` µs as an RGB image (height x width x 3, uint8)."""
    if not math.isfinite(t_us) or t_us < 0:
        raise ValueError(f"replay time must be a number >= 0, got {t_us}")
    fig = plots.timeline_figure(result, title, kernels, until_us=t_us)
    fig.set_dpi(FRAME_DPI)
    return _render(fig)


def gif(result: dict, kernels, title: str, path: Path, frames: int = FRAMES) -> Path:
    """The replay as an animated GIF at ``path``: ``frames`` moments over GIF_SECONDS,
    the last one held a second longer, looping."""
    images = [Image.fromarray(frame(result, kernels, t, title)) for t in frame_times(result, kernels, frames)]
    step_ms = int(GIF_SECONDS * 1e3 / frames)
    durations = [step_ms] * (frames - 1) + [step_ms + 1000]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    images[0].save(path, save_all=True, append_images=images[1:], duration=durations, loop=0, optimize=False)
    return path
