"""Input checks for the Space, done before any GPU work (no torch needed).

Every check raises ``InputError`` with a message meant for the page; the app
shows it as a warning and never a traceback.
"""

from __future__ import annotations

import re

MAX_DIM = 65536  # Llama-3-70B's fused gate/up projection has N = 57344
MAX_ELEMENTS = 2**30  # per operand and output: 2 GiB in bf16, 8 GiB for the fp64 reference
MAX_SHAPES = 8  # custom shapes per request; the presets are fixed sets
# Sum of 2*M*N*K over a request's shapes. Each rung runs a shape ~20 times (eager
# and in a CUDA graph), which an H100 does in well under a second at this cap.
MAX_TOTAL_FLOP = 2.0e13
# The timeline runs each tensor-core rung a handful of times: one product of at most this.
MAX_TIMELINE_FLOP = 2.0e12
# ZeroGPU: the longest GPU time one request may ask for (gpu_work's estimates).
MAX_GPU_SECONDS = 120

DTYPE_CHOICES = ("bfloat16", "float16", "float32")

# Llama-3-8B and -70B: fused q/k/v, o, fused gate/up and down projections (N x K),
# and the tokens per call (M) while generating and while reading a prompt. The
# same sets as scripts/harness/checks.py (MODEL_PROJECTIONS, DECODE_M, PREFILL_M),
# which the Space cannot import on the Hub; tests/test_space.py keeps them equal.
MODEL_PROJECTIONS = {
    "8B qkv": (6144, 4096), "8B o": (4096, 4096), "8B gate_up": (28672, 4096), "8B down": (4096, 14336),
    "70B qkv": (10240, 8192), "70B o": (8192, 8192), "70B gate_up": (57344, 8192), "70B down": (8192, 28672),
}
DECODE_M = (1, 2, 4, 8, 16, 32, 64, 128, 256)
PREFILL_M = (512, 1024, 2048, 4096, 8192, 16384)


def model_shapes(model: str, ms) -> list[tuple[int, int, int]]:
    """(M, N, K) of each projection of ``model`` ("8B" or "70B") at each M of ``ms``."""
    return [(m, n, k) for m in ms for name, (n, k) in MODEL_PROJECTIONS.items() if name.startswith(model + " ")]


# Presets whose name starts with "Llama" time the model's layout: x (M x K) times
# the weights' transpose (the weights N x K, K-contiguous), as F.linear does.
PRESETS: dict[str, list[tuple[int, int, int]]] = {
    "square sweep 512..8192": [(s, s, s) for s in (512, 1024, 2048, 4096, 8192)],
    "LLM shapes": [(4096, 11008, 4096), (4096, 4096, 11008), (8192, 8192, 1024), (16, 4096, 4096)],
    "Llama-3-8B decode (M 1..256)": model_shapes("8B", DECODE_M),
    "Llama-3-8B prefill (M 512..16384)": model_shapes("8B", PREFILL_M),
    "Llama-3-70B decode (M 1..256)": model_shapes("70B", DECODE_M),
    # M up to 4096: the whole prefill set (5.5e13 FLOP) is over MAX_TOTAL_FLOP.
    "Llama-3-70B prefill (M 512..4096)": model_shapes("70B", PREFILL_M[:4]),
    "custom": [],
}
DEFAULT_PRESET = "square sweep 512..8192"


def weights_layout(preset: str) -> bool:
    """Whether ``preset`` times the model layout (B = weightsᵀ, K-contiguous)."""
    return preset.startswith("Llama")


# The timeline's shapes, each telling part of the story on a 132-SM Hopper GPU.
TIMELINE_PRESETS: dict[str, tuple[int, int, int]] = {
    "ragged waves: 3000x3000x3000": (3000, 3000, 3000),
    "aligned: 4096x4096x4096": (4096, 4096, 4096),
    "decode: 16x4096x4096": (16, 4096, 4096),
    "many waves: 4608x4608x2048": (4608, 4608, 2048),
}
TIMELINE_CUSTOM = "custom (M, N, K below)"
DEFAULT_TIMELINE_PRESET = "ragged waves: 3000x3000x3000"
DEFAULT_TIMELINE_SHAPE = TIMELINE_PRESETS[DEFAULT_TIMELINE_PRESET]
# The pairs the Timeline tab compares: one CTA per tile against its persistent
# twin, and split tail against stream-K for decode shapes.
TIMELINE_PAIRS: dict[str, tuple[str, str]] = {
    "tiled vs persistent": ("tiled", "persistent"),
    "wgmma vs wgmma_persistent": ("wgmma", "wgmma_persistent"),
    "wgmma_persistent vs wgmma_streamk": ("wgmma_persistent", "wgmma_streamk"),
}
DEFAULT_TIMELINE_PAIR = "tiled vs persistent"
TIMELINE_KERNELS = tuple(dict.fromkeys(k for pair in TIMELINE_PAIRS.values() for k in pair))


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


def check_elements(shapes: list[tuple[int, int, int]]) -> None:
    """Raises if an operand or the output of a shape has over MAX_ELEMENTS elements."""
    for m, n, k in shapes:
        for what, count in (("A (M x K)", m * k), ("B (K x N)", k * n), ("the output (M x N)", m * n)):
            if count > MAX_ELEMENTS:
                raise InputError(f"{m}x{n}x{k}: {what} has {count:.2e} elements; the cap is {MAX_ELEMENTS:.2e} "
                                 "(2^30) per matrix.")


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
    check_elements(shapes)
    check_flop(shapes)
    return rungs, dtype, shapes


def check_seconds(seconds: float, what: str) -> None:
    """Raises when a request's GPU time estimate is over MAX_GPU_SECONDS."""
    if seconds > MAX_GPU_SECONDS:
        raise InputError(f"This {what} would take about {seconds:.0f} s of GPU time; the cap per request is "
                         f"{MAX_GPU_SECONDS} s. Choose fewer rungs or shapes.")


def timeline_shape(preset, m, n, k) -> tuple[int, int, int]:
    """Checked (M, N, K) for a timeline: the preset's shape, or M, N, K for the custom one."""
    if preset in TIMELINE_PRESETS:
        return TIMELINE_PRESETS[preset]
    if preset not in (TIMELINE_CUSTOM, None, ""):
        raise InputError(f"Unknown timeline shape {preset!r}; choose one of {', '.join(TIMELINE_PRESETS)} "
                         f"or {TIMELINE_CUSTOM!r}.")
    return timeline_request(m, n, k)


def timeline_pair(pair) -> tuple[str, str]:
    """The two kernels of a timeline pair name."""
    if pair not in TIMELINE_PAIRS:
        raise InputError(f"Unknown kernel pair {pair!r}; choose one of {', '.join(TIMELINE_PAIRS)}.")
    return TIMELINE_PAIRS[pair]


def timeline_request(m, n, k) -> tuple[int, int, int]:
    """Checked (M, N, K) for a timeline run."""
    shape = (parse_dim(m, "M"), parse_dim(n, "N"), parse_dim(k, "K"))
    check_elements([shape])
    check_flop([shape], MAX_TIMELINE_FLOP)
    return shape
