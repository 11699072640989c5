"""Input checks for the Space, done before any GPU work (no torch needed).

Every check raises ``InputError`` with a message meant for the page; the app
shows it as a warning and never a traceback.
"""

from __future__ import annotations

import re

MAX_DIM = 16384
MAX_SHAPES = 8
# Sum of 2*M*N*K over a request's shapes. At this cap the H200 finishes a whole
# benchmark request (every rung, each timed ~10 times, plus an fp64 reference)
# in seconds; 16384^3 is 8.8e12.
MAX_TOTAL_FLOP = 1.0e13
# The timeline runs each tensor-core rung a handful of times: one product of at most this.
MAX_TIMELINE_FLOP = 2.0e12

DTYPE_CHOICES = ("bfloat16", "float16", "float32")

PRESETS: dict[str, list[tuple[int, int, int]]] = {
    "square sweep 512..8192": [(s, s, s) for s in (512, 1024, 2048, 4096, 8192)],
    "LLM shapes": [(4096, 11008, 4096), (4096, 4096, 11008), (8192, 8192, 1024), (16, 4096, 4096)],
    "custom": [],
}
DEFAULT_PRESET = "square sweep 512..8192"
DEFAULT_TIMELINE_SHAPE = (4608, 4608, 2048)


class InputError(ValueError):
    """Bad user input; the message is shown on the page."""


def parse_dim(text, name: str) -> int:
    """A matrix dimension from a textbox/number: a whole number in 1..MAX_DIM."""
    raw = str(text).strip() if text is not None else ""
    if raw == "":
        raise InputError(f"{name} is empty: enter a whole number from 1 to {MAX_DIM}.")
    try:
        value = float(raw)
    except ValueError:
        raise InputError(f"{name} = {raw!r} is not a number: enter a whole number from 1 to {MAX_DIM}.") from None
    if value != value or value in (float("inf"), float("-inf")) or value != int(value):
        raise InputError(f"{name} = {raw!r} is not a whole number: enter one from 1 to {MAX_DIM}.")
    value = int(value)
    if value <= 0:
        raise InputError(f"{name} = {value} must be at least 1.")
    if value > MAX_DIM:
        raise InputError(f"{name} = {value} is over the cap of {MAX_DIM} per dimension.")
    return value


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """Shapes written ``MxNxK``, separated by commas, semicolons or new lines."""
    parts = [p for p in re.split(r"[,;\n]+", str(text or "")) if p.strip()]
    if not parts:
        raise InputError("No custom shapes given: write them as MxNxK, e.g. 4096x4096x4096, 16x4096x4096.")
    if len(parts) > MAX_SHAPES:
        raise InputError(f"{len(parts)} shapes given; at most {MAX_SHAPES} per run.")
    shapes = []
    for part in parts:
        dims = re.split(r"\s*[x×*]\s*", part.strip().lower())
        if len(dims) != 3:
            raise InputError(f"{part.strip()!r} is not a shape: write MxNxK, e.g. 4096x4096x1024.")
        shapes.append(tuple(parse_dim(d, f"{axis} in {part.strip()!r}") for d, axis in zip(dims, "MNK")))
    return shapes


def check_flop(shapes: list[tuple[int, int, int]], cap: float = MAX_TOTAL_FLOP) -> float:
    """Total 2*M*N*K of ``shapes``; raises if it is over ``cap``."""
    total = sum(2.0 * m * n * k for m, n, k in shapes)
    if total > cap:
        raise InputError(f"These shapes need {total:.2e} FLOP per rung; the cap per request is {cap:.0e}. "
                         "Use fewer or smaller shapes.")
    return total


def benchmark_request(rungs, dtype, preset, custom,
                      rung_choices) -> tuple[list[str], str, list[tuple[int, int, int]]]:
    """Checked (rungs, dtype, shapes) for a benchmark run; ``rung_choices`` are the
    rungs the page offers (the loaded kernel's)."""
    rungs = list(rungs or [])
    unknown = [r for r in rungs if r not in rung_choices]
    if unknown:
        raise InputError(f"Unknown rung(s): {', '.join(map(str, unknown))}; choose from {', '.join(rung_choices)}.")
    if dtype not in DTYPE_CHOICES:
        raise InputError(f"Unknown dtype {dtype!r}; choose one of {', '.join(DTYPE_CHOICES)}.")
    if preset not in PRESETS:
        raise InputError(f"Unknown shape preset {preset!r}; choose one of {', '.join(PRESETS)}.")
    shapes = parse_shapes(custom) if preset == "custom" else PRESETS[preset]
    check_flop(shapes)
    return rungs, dtype, shapes


def timeline_request(m, n, k) -> tuple[int, int, int]:
    """Checked (M, N, K) for a timeline run."""
    shape = (parse_dim(m, "M"), parse_dim(n, "N"), parse_dim(k, "K"))
    check_flop([shape], MAX_TIMELINE_FLOP)
    return shape
