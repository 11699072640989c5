"""Shared correctness helpers for persistent_matmul: operands, references, error measures.

Used by the GPU tests (tests/test_gpu_*.py) and by the scripts
(scripts/correctness_sweep.py, scripts/demo.py), which put this directory on
sys.path. Every correctness check follows one protocol:

* random normal operands, compared with an fp64 product of the *same rounded*
  inputs by the normwise relative error ``||out - ref||_F / ||ref||_F``, which
  must stay under ``TOLERANCE[dtype]`` (bf16 1e-2, fp16 2e-3, fp32 1e-4; the
  denominator is kept from falling below the inputs' magnitude by
  ``cancellation_floor``, so an output of a few elements that cancels to near
  zero by chance does not make a correct kernel fail);
* small-integer operands for which every partial sum and every output is
  exactly representable, so the kernel's result must equal the rounded
  reference bit for bit (this exposes tile, tail and scheduling bugs exactly);
* outputs poisoned with NaN before the kernel runs, so an element the kernel
  forgets to write cannot pass.

The second half of the module holds what the scripts share: loading the kernel
the way users do, and describing the machine a result was measured on.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import subprocess
from pathlib import Path

import torch

# Normwise relative error bounds for a product of random normal operands, against the
# fp64 product of the same rounded inputs.
TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-4}

# Largest magnitude up to which every integer is exactly representable: 2**p,
# p the precision in bits, implicit bit included (bf16 8, fp16 11, fp32 24).
EXACT_INT_LIMIT = {torch.bfloat16: 2**8, torch.float16: 2**11, torch.float32: 2**24}

# Largest |entry| exact_int_operands uses per dtype: {-1, 0, 1} for the
# 16-bit types, [-4, 4] for fp32 (whose limit leaves room for K up to 2**20).
EXACT_INT_MAX_ENTRY = {torch.bfloat16: 1, torch.float16: 1, torch.float32: 4}

DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


# --------------------------------------------------------------------------- operands


def _with_layout(t: torch.Tensor, transposed: bool) -> torch.Tensor:
    """``t`` (logical shape kept) stored row-major, or, if ``transposed``, stored as
    the contiguous transpose and viewed back with ``.t()`` (strides ``(1, rows)``)."""
    if not transposed:
        return t.contiguous()
    # Copy into fresh storage: `.t().contiguous()` would keep a size-1 dim's stride.
    storage = torch.empty((t.shape[1], t.shape[0]), dtype=t.dtype, device=t.device)
    return storage.copy_(t.t()).t()


def random_operands(m: int, n: int, k: int, dtype: torch.dtype, device,
                    a_transposed: bool = False, b_transposed: bool = False,
                    generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Random normal ``a`` (m x k) and ``b`` (k x n) of ``dtype`` on ``device``.

    With ``a_transposed`` / ``b_transposed`` the tensor is created as the
    contiguous storage of its transpose and returned as ``.t()`` of it, so the
    kernel sees non-trivial strides (column-major operands). ``generator``
    must live on ``device``; without one torch's global RNG is used.
    """
    a_storage = torch.randn((k, m) if a_transposed else (m, k), generator=generator,
                            device=device, dtype=torch.float32).to(dtype)
    b_storage = torch.randn((n, k) if b_transposed else (k, n), generator=generator,
                            device=device, dtype=torch.float32).to(dtype)
    a = a_storage.t() if a_transposed else a_storage
    b = b_storage.t() if b_transposed else b_storage
    return a, b


def exact_int_nonzeros_per_row(dtype: torch.dtype, headroom: int = 0) -> int:
    """How many nonzero products one output may sum so that it stays exact.

    With entries bounded by ``EXACT_INT_MAX_ENTRY[dtype]`` every product is an
    integer of magnitude <= max_entry**2, so L nonzeros keep every partial sum
    and the output within ``L * max_entry**2``; that must not exceed the exact
    range of the output dtype, less ``headroom`` (room for a bias).
    """
    per_product = EXACT_INT_MAX_ENTRY[dtype] ** 2
    return (EXACT_INT_LIMIT[dtype] - headroom) // per_product


def exact_int_operands(m: int, n: int, k: int, dtype: torch.dtype, device,
                       a_transposed: bool = False, b_transposed: bool = False,
                       generator: torch.Generator | None = None,
                       headroom: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Small-integer ``a`` (m x k) and ``b`` (k x n) whose product is computed exactly.

    Entries are integers in [-e, e] with e = ``EXACT_INT_MAX_ENTRY[dtype]``
    (``{-1, 0, 1}`` for bf16/fp16, [-4, 4] for fp32). Each row of ``a`` keeps
    at most L nonzeros (``exact_int_nonzeros_per_row``: 256 for bf16, 2048
    for fp16), at random positions spread over the whole K range and always
    including its first and last position, so tails in K are still exercised. Then |every partial sum| <= L * e**2 <= the
    dtype's exact-integer limit minus ``headroom``: fp32 accumulation is
    exact in any order, and the output rounds to itself in ``dtype``. Pass
    ``headroom=h`` to leave room for adding a bias of magnitude <= h.
    """
    limit = exact_int_nonzeros_per_row(dtype, headroom)
    if limit < 1:
        raise ValueError(f"headroom {headroom} leaves no exact range for {dtype}")
    e = EXACT_INT_MAX_ENTRY[dtype]
    a = torch.randint(-e, e + 1, (m, k), generator=generator, device=device, dtype=torch.int32)
    b = torch.randint(-e, e + 1, (k, n), generator=generator, device=device, dtype=torch.int32)
    if k > limit and m > 0:
        # Keep `limit` random positions per row (the top-`limit` of random
        # scores), always including the first and the last position of K.
        scores = torch.rand((m, k), generator=generator, device=device)
        scores[:, 0] = scores[:, -1] = 2.0
        keep = torch.zeros((m, k), dtype=torch.bool, device=device)
        keep.scatter_(1, scores.topk(limit, dim=1).indices, True)
        a = a * keep
    a = _with_layout(a.to(dtype), a_transposed)
    b = _with_layout(b.to(dtype), b_transposed)
    return a, b


def exact_int_bias(n: int, dtype: torch.dtype, device, generator: torch.Generator | None = None,
                   magnitude: int = 1) -> torch.Tensor:
    """A bias of integers in [-magnitude, magnitude], to go with
    ``exact_int_operands(..., headroom=magnitude)``."""
    values = torch.randint(-magnitude, magnitude + 1, (n,), generator=generator, device=device)
    return values.to(dtype)


# --------------------------------------------------------------------------- shapes of real models

# (N, K) of the projections of two real models: out_features x in_features.
MODEL_PROJECTIONS = {
    "8B qkv": (6144, 4096), "8B o": (4096, 4096), "8B gate_up": (28672, 4096), "8B down": (4096, 14336),
    "70B qkv": (10240, 8192), "70B o": (8192, 8192), "70B gate_up": (57344, 8192), "70B down": (8192, 28672),
}
"""Llama-3-8B and Llama-3-70B: fused q/k/v, o, fused gate/up and down projections."""
DECODE_M = (1, 2, 4, 8, 16, 32, 64, 128, 256)
"""Tokens per call while generating (batch x 1 new token)."""
PREFILL_M = (512, 1024, 2048, 4096, 8192, 16384)
"""Tokens per call while reading a prompt."""


# --------------------------------------------------------------------------- checks


def reference(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``a @ b (+ bias)`` in float64, from the same (already rounded) inputs, on their device."""
    ref = a.to(torch.float64) @ b.to(torch.float64)
    if bias is not None:
        ref = ref + bias.to(torch.float64)
    return ref


def rel_error(out: torch.Tensor, ref: torch.Tensor, floor: float = 0.0) -> float:
    """Normwise relative error ``||out - ref||_F / max(||ref||_F, floor)``, in float64.

    With the default ``floor=0`` this is the plain normwise measure. When the
    denominator is 0 (``ref`` all zeros, no floor) the absolute error
    ``||out - ref||_F`` is returned instead. Any NaN or infinity in ``out``
    gives ``inf``, so it never passes a bound. See ``cancellation_floor`` for
    the floor the checks pass.
    """
    diff = out.to(torch.float64) - ref.to(torch.float64)
    err = torch.linalg.vector_norm(diff).item()
    denominator = max(torch.linalg.vector_norm(ref.to(torch.float64)).item(), floor)
    value = err if denominator == 0 else err / denominator
    return value if math.isfinite(value) else math.inf


def cancellation_floor(a: torch.Tensor, b: torch.Tensor) -> float:
    """``|| |a| @ |b| ||_F / sqrt(K)``: a floor for the denominator of ``rel_error``.

    An output of few elements can be near zero by chance (a random dot product
    that cancels), and then even a correct fp32 accumulation has a large error
    *relative to it*: a 1x1x4104 fp32 product exceeds 1e-4 about once in 250
    draws. The accumulation error scales with ``|a| @ |b|``, not with the
    result, so the checks divide by at least that magnitude over sqrt(K)
    (about 0.64 ||ref|| for random normal inputs of any shape, so the floor
    only takes over under such cancellation). For K = 1 it equals ||ref||.
    """
    k = a.shape[1]
    if k == 0:
        return 0.0
    magnitude = a.to(torch.float64).abs() @ b.to(torch.float64).abs()
    return torch.linalg.vector_norm(magnitude).item() / math.sqrt(k)


def underflow_floor(out: torch.Tensor) -> float:
    """The smallest denominator for which rounding in ``out``'s subnormal range
    always passes ``TOLERANCE``: ``sqrt(numel) * spacing / 2 / tolerance``.

    Below the smallest normal number a dtype's spacing is fixed (fp16: 2^-24,
    about 6e-8), so rounding there has an absolute, not relative, error: a
    correctly rounded fp16 output of magnitude 1e-5 is off by up to 0.3%. Only
    outputs that tiny are affected (fp16 below ~1.5e-5 per element; bf16 and
    fp32 share fp32's exponent range, where it is negligible).
    """
    info = torch.finfo(out.dtype)
    spacing = info.smallest_normal * info.eps
    tolerance = TOLERANCE.get(out.dtype, 1e-4)
    return math.sqrt(out.numel()) * spacing / 2 / tolerance


def matmul_error(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                 bias: torch.Tensor | None = None) -> float:
    """The check's error measure for ``out`` = ``a @ b (+ bias)``: ``rel_error``
    against the fp64 reference, with the larger of ``cancellation_floor(a, b)``
    and ``underflow_floor(out)``."""
    floor = max(cancellation_floor(a, b), underflow_floor(out))
    return rel_error(out.reshape(a.shape[0], b.shape[1]), reference(a, b, bias), floor)


def poison(out: torch.Tensor) -> torch.Tensor:
    """Fill ``out`` with NaN (in place) and return it: any element a kernel does
    not write stays NaN and fails every check."""
    return out.fill_(float("nan"))


def nan_count(t: torch.Tensor) -> int:
    """Number of NaN elements of ``t``."""
    return int(torch.isnan(t).sum().item())


def check_exact(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                bias: torch.Tensor | None = None) -> int:
    """Number of elements of ``out`` that differ from the fp64 reference rounded to
    ``out.dtype`` (0 when bit-exact; a NaN always counts as a mismatch).

    Meant for ``exact_int_operands`` inputs, for which that rounding is exact.
    """
    expected = reference(a, b, bias).to(out.dtype).reshape(out.shape)
    if torch.equal(out, expected):
        return 0
    return int((out != expected).sum().item())


# --------------------------------------------------------------------------- for the scripts

REPO_ROOT = Path(__file__).resolve().parent.parent
REPO_ID = "persistent-matmul/persistent-matmul"


# The benchmark's extra "<persistent rung>-<order>" columns: the tile orders
# other than the package's default (split tail).
TILE_ORDER_VARIANTS = ("grouped", "hilbert", "dynamic")
# "wgmma_persistent-cluster1": single CTAs (the default runs CTA pairs sharing B
# by multicast wherever the output has more than one row of tiles).
CLUSTER_VARIANT = "cluster1"
CLUSTER_SIZES = {"cluster1": 1, "cluster2": 2}


def check_graph_replays(run, m: int, n: int, k: int, what: str, replays: int = 3) -> None:
    """Captures ``run(a, b, out)`` (bf16 small-integer operands) into a CUDA graph on a
    side stream after one eager warm-up call, then per replay: fresh operands copied in,
    a poisoned output, the replay, an eager call into another poisoned output on the
    same stream; asserts both bit-exact (``what`` names what a mismatch means)."""
    a, b = exact_int_operands(m, n, k, torch.bfloat16, "cuda")
    out = poison(torch.empty(m, n, dtype=torch.bfloat16, device="cuda"))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run(a, b, out)  # warm-up: tensor maps, occupancy, scratch memory
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            run(a, b, out)
        for replay in range(replays):
            a2, b2 = exact_int_operands(m, n, k, torch.bfloat16, "cuda")
            a.copy_(a2)
            b.copy_(b2)
            out.copy_(poison(torch.empty_like(out)))
            graph.replay()
            eager = poison(torch.empty_like(out))
            run(a, b, eager)
            stream.synchronize()
            assert check_exact(out, a, b) == 0, f"replay {replay}: {what}"
            assert check_exact(eager, a, b) == 0, f"eager call after replay {replay}: {what}"


def run_variant(pm, name: str, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """a @ b into out through a rung ("persistent") or a variant of one, as the
    benchmark and profile scripts name them: "<rung>-<tile order>" (any of the
    package's TileOrder names, for a persistent rung) or "wgmma_persistent-cluster1" /
    "wgmma_persistent-cluster2" (single CTAs / CTA pairs, whatever the kernel would pick)."""
    rung, _, variant = name.partition("-")
    if not variant:
        return pm.matmul(a, b, kernel=rung, out=out)
    if variant in CLUSTER_SIZES:
        return pm.matmul(a, b, kernel=rung, out=out, cluster_size=CLUSTER_SIZES[variant])
    if variant in {str(order) for order in pm.TileOrder}:
        return pm.matmul(a, b, kernel=rung, out=out, tile_order=variant)
    raise ValueError(f"unknown variant {variant!r} in {name!r}")


def load_kernel(repo_root: Path = REPO_ROOT):
    """Load persistent_matmul as users do, from this repo's build.

    ``kernels.get_kernel(REPO_ID, version=1)`` with ``LOCAL_KERNELS`` pointing
    at ``repo_root`` (added to the variable if it does not name this repo
    already), falling back to ``kernels.get_local_kernel(repo_root/"build")``.
    Returns ``(module, how)`` where ``how`` says which of the two loaded it.
    """
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    overrides = os.environ.get("LOCAL_KERNELS", "")
    if not any(entry.split("=", 1)[0] == REPO_ID for entry in overrides.split(":") if entry):
        entry = f"{REPO_ID}={repo_root}"
        os.environ["LOCAL_KERNELS"] = f"{overrides}:{entry}" if overrides else entry
    import kernels

    try:
        return kernels.get_kernel(REPO_ID, version=1), "kernels.get_kernel (LOCAL_KERNELS)"
    except Exception as exc:  # noqa: BLE001 - any failure: try the direct local load
        first_error = f"{type(exc).__name__}: {exc}"
    module = kernels.get_local_kernel(repo_root / "build")
    return module, f"kernels.get_local_kernel (get_kernel failed: {first_error})"


def variant_metadata(pm) -> tuple[str, dict]:
    """The loaded module's variant directory name and its parsed metadata.json."""
    variant_dir = Path(pm.__file__).resolve().parent
    try:
        metadata = json.loads((variant_dir / "metadata.json").read_text())
    except (OSError, ValueError):
        metadata = {}
    return variant_dir.name, metadata


def _run_text(args: list[str], cwd: Path | None = None) -> str | None:
    """stdout of a command, stripped, or None if it cannot run or fails."""
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=20, cwd=cwd, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def git_commit(metadata: dict, repo_root: Path = REPO_ROOT) -> tuple[str | None, str]:
    """The source commit of what was measured: the commit the loaded build was
    made from (its metadata.json provenance), else ``git rev-parse HEAD`` of the
    checkout. A build copied onto the GPU machine may run beside a checkout whose
    git history is older than the build (its HEAD would name a commit the build
    does not come from), so the build's own record comes first, and a checkout at
    another commit is named beside it. Returns ``(commit or None, where it came from)``."""
    head = _run_text(["git", "rev-parse", "HEAD"], cwd=repo_root)
    kernel = metadata.get("provenance", {}).get("kernel", {})
    if kernel.get("commit"):
        source = "metadata.json provenance" + (" (dirty build)" if kernel.get("dirty") else "")
        if head and head != kernel["commit"]:
            source += f"; checkout at {head[:12]}"
        return kernel["commit"], source
    if head:
        dirty = _run_text(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo_root)
        return head, "git rev-parse HEAD" + (" (tracked files modified)" if dirty else "")
    return None, "unknown: no git checkout and no commit in metadata.json provenance"


def gpu_clocks() -> dict:
    """Current SM clock, max SM clock and power draw from nvidia-smi (empty if unavailable)."""
    text = _run_text(["nvidia-smi", "--query-gpu=clocks.sm,clocks.max.sm,power.draw",
                      "--format=csv,noheader"])
    if not text:
        return {}
    fields = [f.strip() for f in text.splitlines()[0].split(",")]
    return dict(zip(("sm_clock", "max_sm_clock", "power_draw"), fields))


def environment(pm=None, how_loaded: str | None = None) -> dict:
    """Everything a recorded result must carry about where it was measured."""
    env: dict = {
        "timestamp": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
    }
    if torch.cuda.is_available():
        device = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(device)
        env.update(
            gpu=props.name,
            sm_count=props.multi_processor_count,
            compute_capability=f"{props.major}.{props.minor}",
            l2_cache_mb=round(getattr(props, "L2_cache_size", 0) / 1e6, 1),
            memory_gib=round(props.total_memory / 2**30, 1),
        )
        env["driver"] = _run_text(["nvidia-smi", "--query-gpu=driver_version",
                                   "--format=csv,noheader"])
        if env["driver"]:
            env["driver"] = env["driver"].splitlines()[0]
        env.update(gpu_clocks())
    if pm is not None:
        variant, metadata = variant_metadata(pm)
        env["variant"] = variant
        env["kernel_id"] = metadata.get("id")
        env["loaded_with"] = how_loaded
        env["git_commit"], env["commit_source"] = git_commit(metadata)
    return env


ENV_LABELS = (
    ("timestamp", "Date"),
    ("gpu", "GPU"),
    ("sm_count", "SMs"),
    ("compute_capability", "Compute capability"),
    ("l2_cache_mb", "L2 (MB)"),
    ("sm_clock", "SM clock"),
    ("max_sm_clock", "Max SM clock"),
    ("power_draw", "Power draw"),
    ("driver", "Driver"),
    ("torch", "torch"),
    ("torch_cuda", "torch CUDA"),
    ("variant", "Variant"),
    ("kernel_id", "Kernel id"),
    ("loaded_with", "Loaded with"),
    ("git_commit", "Commit"),
    ("commit_source", "Commit from"),
)


def environment_lines(env: dict) -> list[str]:
    """The environment as Markdown list items, ``- Label: value`` (demo.py parses
    the ``GPU`` line back out of recorded files)."""
    return [f"- {label}: {env[key]}" for key, label in ENV_LABELS if env.get(key) is not None]
