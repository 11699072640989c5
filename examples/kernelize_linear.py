"""Map a model's nn.Linear layers to persistent_matmul's MatmulLinear with kernels.kernelize.

Shared by examples/transformers_llama.py, examples/diffusers_unet.py,
scripts/integration_timing.py and tests/test_integration_models.py (which put
this folder on sys.path).

kernelize only replaces the forward of modules whose *class* carries a
``kernel_layer_name``. In transformers and diffusers the projections are plain
``torch.nn.Linear`` instances, whose class has none: transformers decorates
some of its own classes (``LlamaRMSNorm`` as ``"RMSNorm"``, ...) but never
nn.Linear, and its ``apply_patches`` swaps classes by attribute name inside its
own modules only (``nn.Linear`` is reached through ``torch.nn``, so it cannot
be patched that way). Two ways are left with kernels 0.17.2:

* ``kernels.replace_kernel_forward_from_hub(torch.nn.Linear, name)``: marks
  every nn.Linear in the process, in every model and library;
* switching the class of the model's own nn.Linear instances to a subclass
  declared with ``@use_kernel_forward_from_hub(name)`` that adds nothing (same
  state, same forward until kernelize runs). This is what ``mark_linears``
  does: the change stays inside the model you pass.

The layer name is ``MatmulLinear``, never ``Linear``: transformers registers
``"Linear"`` in its own default mapping (another kernel).

Under tensor parallelism (transformers' ``tp_plan``, torch.distributed) each
sharded Linear's forward is an instance attribute: the plan's wrapper, which
hands the layer local shards and all-reduces the row-parallel outputs.
kernelize replaces that attribute, so ``kernelize_linears`` installs the plan's
forward again around the kernelized one (``tensor_parallel_styles``).
"""

from __future__ import annotations

import copy
import logging
import statistics
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch
from kernels import (
    KernelizeFallback,
    LocalLayerRepository,
    Mode,
    get_local_kernel,
    kernelize,
    use_kernel_forward_from_hub,
    use_kernel_mapping,
)
from torch import nn

LAYER_NAME = "MatmulLinear"
"""The name the marked modules carry and the mapping keys on (and the layer's class name in layers.py)."""

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_BUILD = REPO_ROOT / "build"


@use_kernel_forward_from_hub(LAYER_NAME)
class KernelizableLinear(nn.Linear):
    """nn.Linear that kernelize may give MatmulLinear's forward. Adds no state or behaviour."""


def mark_linears(model: nn.Module, include: Callable[[str, nn.Linear], bool] | None = None) -> list[str]:
    """Make ``model``'s plain ``nn.Linear`` modules kernelizable under ``LAYER_NAME``.

    Switches each one's class to ``KernelizableLinear`` (subclasses of nn.Linear,
    such as quantized or LoRA layers, are left alone), for the modules
    ``include(name, module)`` accepts (default: all). Parameters, buffers, hooks
    and outputs are unchanged. Returns the names of the marked modules, those
    marked before included.
    """
    marked = []
    for name, module in model.named_modules():
        if type(module) is nn.Linear and (include is None or include(name, module)):
            module.__class__ = KernelizableLinear
        if type(module) is KernelizableLinear:
            marked.append(name)
    return marked


def linear_repository(build_dir: Path | str = DEFAULT_BUILD) -> LocalLayerRepository:
    """The MatmulLinear layer of the local build in ``build_dir`` (the folder holding the variants)."""
    return LocalLayerRepository(repo_path=Path(build_dir), layer_name=LAYER_NAME)


class _OtherLayersQuiet(logging.Filter):
    """Drops kernelize's 'No kernel mapping found' warnings for layers other than ours
    (transformers marks RMSNorm, SiLU, rotary_pos_emb, ... which this mapping leaves alone)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return "No kernel mapping found for layer" not in message or f"`{LAYER_NAME}`" in message


def wrapped_forwards(model: nn.Module, names: list[str]) -> list[str]:
    """The modules among ``names`` whose forward is a per-instance wrapper: an instance
    attribute that is not a method bound to the module (transformers' tensor-parallel
    forward, accelerate's hooks). A forward a previous kernelize installed is a bound
    method, and kernelize may replace it."""
    wrapped = []
    for name in names:
        module = model.get_submodule(name)
        forward = vars(module).get("forward")
        if forward is not None and getattr(forward, "__self__", None) is not module:
            wrapped.append(name)
    return wrapped


def tensor_parallel_styles(model: nn.Module, names: list[str]) -> dict[str, tuple[object, object]]:
    """``{name: (style, mesh)}``: the tensor-parallel style that ``model.tp_plan`` gives
    each module in ``names`` (transformers' ``ALL_PARALLEL_STYLES`` entry) and the device
    mesh its weight is sharded over, to install the style's forward again after
    kernelize. Raises ValueError for a module the plan does not name, or whose weight
    is not a DTensor: its wrapper is not the plan's, and kernelize would drop it."""
    plan = (getattr(model, "tp_plan", None) or {}) if names else {}
    styles = _plan_styles(model, names, plan) if plan else {}
    unexplained = [name for name in names if name not in styles]
    if unexplained:
        raise ValueError(
            f"{len(unexplained)} Linear modules have a forward wrapper that is not their tensor-parallel plan's "
            f"(e.g. accelerate's hooks), which kernelize would drop: {unexplained[:5]}. Leave them out with "
            "`include`, or kernelize before wrapping them."
        )
    return styles


def _plan_styles(model: nn.Module, names: list[str], plan: dict[str, str]) -> dict[str, tuple[object, object]]:
    """tensor_parallel_styles' lookup, for the modules the plan names and whose weight is sharded."""
    from torch.distributed.tensor import DTensor
    from transformers.distributed.parallel_utils import ALL_PARALLEL_STYLES
    from transformers.distributed.tensor_parallel import replace_layer_number_by_wildcard

    styles = {}
    for name in names:
        # The plan's keys name layers by wildcard ("model.layers.*.mlp.up_proj"), as transformers looks them up.
        style_name = plan.get(replace_layer_number_by_wildcard(name))
        weight = getattr(model.get_submodule(name), "weight", None)
        if style_name in ALL_PARALLEL_STYLES and isinstance(weight, DTensor):
            styles[name] = (ALL_PARALLEL_STYLES[style_name], weight.device_mesh)
    return styles


def kernelize_linears(
    model: nn.Module,
    *,
    mode: Mode,
    device: str | None = None,
    repository=None,
    include: Callable[[str, nn.Linear], bool] | None = None,
) -> list[str]:
    """Mark ``model``'s nn.Linear modules and kernelize them with MatmulLinear.

    ``device`` is the kernels device type the mapping is for ("cuda" or "cpu";
    default: that of the model's first parameter). ``repository`` defaults to
    ``linear_repository()`` (the local build); a ``LayerRepository`` works too
    (with ``LOCAL_KERNELS`` offline, give it ``revision="v1"``: ``version=1``
    asks the Hub, or its cache, which versions exist first). Only our mapping is
    used (``inherit_mapping=False``); other kernelizable layers keep their
    forward. Raises if the layer cannot be used in ``mode``. Returns the names
    of the modules now running MatmulLinear's forward.

    A model under a tensor-parallel plan (``model.tp_plan``, sharded DTensor
    weights) keeps it: each sharded module's plan forward is installed again
    around MatmulLinear's, so in inference our kernels run on every rank's local
    shards, and with gradients on (DTensors) the layer computes with torch.
    Raises ValueError, before kernelizing, for Linear modules wrapped by
    anything else.
    """
    if device is None:
        device = next(model.parameters()).device.type
    repository = linear_repository() if repository is None else repository
    marked = mark_linears(model, include)
    styles = tensor_parallel_styles(model, wrapped_forwards(model, marked))
    layer_logger = logging.getLogger("kernels.layer.layer")
    quiet = _OtherLayersQuiet()
    layer_logger.addFilter(quiet)
    try:
        with use_kernel_mapping({LAYER_NAME: {device: repository}}, inherit_mapping=False):
            # NO_LAYER: layers without a mapping keep their forward; ours must load and fit `mode`.
            kernelize(model, mode=mode, device=device, use_fallback=KernelizeFallback.NO_LAYER)
    finally:
        layer_logger.removeFilter(quiet)
    layer = repository.load()
    replaced = [name for name in marked
                if getattr(model.get_submodule(name).forward, "__func__", None) is layer.forward]
    if replaced != marked:
        missing = sorted(set(marked) - set(replaced))
        raise RuntimeError(f"kernelize left {len(missing)} Linear modules unreplaced: {missing[:5]}")
    for name, (style, mesh) in styles.items():
        # The style wraps whatever module.forward is now: MatmulLinear's.
        style.install_forward(model.get_submodule(name), mesh)
    return replaced


def load_kernel(build_dir: Path | str = DEFAULT_BUILD):
    """The persistent_matmul module of the local build (the same module kernelize loads)."""
    return get_local_kernel(Path(build_dir))


def linear_op_name(pm) -> str:
    """The qualified name of the build's ``linear_fwd`` custom op, as the profiler reports it."""
    return pm._ops.add_op_namespace_prefix("linear_fwd")


class OpCalls:
    """How often an op ran inside ``count_op_calls``; ``calls`` is set when the block ends."""

    def __init__(self, op_name: str):
        self.op_name = op_name
        self.calls: int | None = None


@contextmanager
def count_op_calls(op_name: str) -> Iterator[OpCalls]:
    """Count the dispatcher calls of ``op_name`` in the block, from torch.profiler's CPU
    events: eager calls and those a torch.compile'd graph makes alike, backward's too."""
    counter = OpCalls(op_name)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        yield counter
    counter.calls = sum(1 for event in prof.events() if event.name == op_name)


@contextmanager
def count_module_calls(modules: list[nn.Module]) -> Iterator[list[int]]:
    """Count forward calls of ``modules`` (eager only) with forward hooks; yields a
    one-element list holding the running total."""
    total = [0]

    def hook(module, args, output):
        total[0] += 1

    handles = [m.register_forward_hook(hook) for m in modules]
    try:
        yield total
    finally:
        for handle in handles:
            handle.remove()


def normwise_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """``||got - ref||_F / ||ref||_F`` in fp64."""
    got, ref = got.double(), ref.double()
    return ((got - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def cuda_time_ms(fn: Callable[[], object], *, warmup: int = 3, iters: int = 10) -> float:
    """Median milliseconds of ``fn()`` over ``iters`` runs after ``warmup`` runs, by CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


@dataclass
class Comparison:
    """One model's forward before and after kernelizing its Linear layers."""

    rel_error: float  # ||out_kernelized - out_torch|| / ||out_torch||, same weights and dtype
    linear_modules: int  # nn.Linear modules in the model
    replaced: int  # of those, now running MatmulLinear's forward
    linear_calls: int  # their forward calls in one model forward
    op_calls: int  # calls of our linear_fwd op in that forward
    ms_kernelized: float | None = None
    ms_torch: float | None = None
    rel_error_fp32_kernelized: float | None = None  # against the same weights in fp32, run by torch
    rel_error_fp32_torch: float | None = None


def compare_kernelized(
    model: nn.Module,
    forward: Callable[[nn.Module], torch.Tensor],
    *,
    build_dir: Path | str = DEFAULT_BUILD,
    kernelize_model: Callable[[nn.Module], object] | None = None,
    fp32_reference: bool = False,
    time_iters: int = 0,
) -> Comparison:
    """Run ``forward(model)`` (under no_grad), kernelize ``model`` in place, run it again.

    ``kernelize_model(model)`` does the kernelizing (default: ``kernelize_linears``
    for ``Mode.INFERENCE`` with the build in ``build_dir``). The second forward
    runs under ``count_module_calls`` and ``count_op_calls``. ``fp32_reference``
    also runs an fp32 copy with torch; ``time_iters`` > 0 times both forwards
    on the GPU (median of that many after 3 warm-ups).
    """

    def run(m):
        with torch.no_grad():
            return forward(m)

    reference = run(model)
    fp32 = run(copy.deepcopy(model).float()) if fp32_reference else None
    ms_torch = cuda_time_ms(lambda: run(model), iters=time_iters) if time_iters else None

    if kernelize_model is None:
        kernelize_linears(model, mode=Mode.INFERENCE, repository=linear_repository(build_dir))
    else:
        kernelize_model(model)
    layer = linear_repository(build_dir).load()
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    replaced = sum(1 for m in linears if getattr(m.forward, "__func__", None) is layer.forward)

    with count_module_calls(linears) as calls, count_op_calls(linear_op_name(load_kernel(build_dir))) as ops:
        out = run(model)
    ms_kernelized = cuda_time_ms(lambda: run(model), iters=time_iters) if time_iters else None
    return Comparison(
        rel_error=normwise_error(out, reference),
        linear_modules=len(linears),
        replaced=replaced,
        linear_calls=calls[0],
        op_calls=ops.calls,
        ms_kernelized=ms_kernelized,
        ms_torch=ms_torch,
        rel_error_fp32_kernelized=None if fp32 is None else normwise_error(out, fp32),
        rel_error_fp32_torch=None if fp32 is None else normwise_error(reference, fp32),
    )


def summary(result: Comparison, *, tolerance: float, on_gpu: bool, iters: int = 0) -> tuple[list[str], bool]:
    """Printable lines for ``result`` and whether it passes: every Linear replaced, our op
    called once per Linear call (none without a GPU, where MatmulLinear falls back to
    F.linear), the error within ``tolerance`` (exactly 0 without a GPU)."""
    lines = [
        f"Linear modules: {result.linear_modules}, running MatmulLinear: {result.replaced}",
        f"Linear calls in one forward: {result.linear_calls}; linear_fwd op calls: {result.op_calls}",
        f"output, kernelized vs torch: normwise relative error {result.rel_error:.3e} "
        + (f"(tolerance {tolerance:.0e})" if on_gpu else "(no GPU: F.linear fallback, must be 0)"),
    ]
    if result.rel_error_fp32_kernelized is not None:
        lines.append(f"against the fp32 model: kernelized {result.rel_error_fp32_kernelized:.3e}, "
                     f"torch {result.rel_error_fp32_torch:.3e}")
    if result.ms_torch is not None:
        lines.append(f"forward: kernelized {result.ms_kernelized:.3f} ms, torch {result.ms_torch:.3f} ms "
                     f"(torch/kernelized {result.ms_torch / result.ms_kernelized:.2f}x), median of {iters}")
    ok = (result.replaced == result.linear_modules > 0
          and result.op_calls == (result.linear_calls if on_gpu else 0)
          and (result.rel_error <= tolerance if on_gpu else result.rel_error == 0.0))
    lines.append("OK" if ok else "FAILED")
    return lines, ok


__all__ = [
    "Comparison",
    "compare_kernelized",
    "DEFAULT_BUILD",
    "KernelizableLinear",
    "LAYER_NAME",
    "OpCalls",
    "count_module_calls",
    "count_op_calls",
    "cuda_time_ms",
    "kernelize_linears",
    "linear_op_name",
    "linear_repository",
    "load_kernel",
    "mark_linears",
    "normwise_error",
    "summary",
    "tensor_parallel_styles",
    "wrapped_forwards",
]
