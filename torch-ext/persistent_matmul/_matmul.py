"""matmul, and the checks behind every op call: the C++ op entry (torch_binding.cpp)
checks the arguments, picks the rung, copies operands a rung cannot read and launches;
when it raises, the functions here check the arguments again in Python, so the
exception names the argument and what is wrong with it."""

from __future__ import annotations

import torch

from ._ops import ops
from ._rungs import AUTO_ORDER, RUNGS, Rung, availability
from ._validate import check_cuda, check_out, check_same_dtype, check_tensor


def _resolve_rung(kernel: str, dtype: torch.dtype, device: torch.device) -> Rung:
    """The rung ``kernel`` names, or for "auto" the first of AUTO_ORDER that runs ``dtype``
    on ``device``; raises RuntimeError/TypeError saying why none runs."""
    if kernel == "auto":
        for name in AUTO_ORDER:
            if dtype in RUNGS[name].dtypes and availability(name, device).available:
                return RUNGS[name]
        reasons = "; ".join(f"{n}: {availability(n, device).reason}" for n in AUTO_ORDER)
        raise RuntimeError(f"no kernel runs {dtype} on {device}: {reasons}")
    rung = RUNGS[kernel]
    info = availability(kernel, device)
    if not info.available:
        raise RuntimeError(f"kernel {kernel!r} does not run on this device: {info.reason}")
    if dtype not in rung.dtypes:
        names = ", ".join(str(d).removeprefix("torch.") for d in rung.dtypes)
        raise TypeError(f"kernel {kernel!r} does not take {dtype}; it takes {names}")
    return rung


_KERNEL_NAMES = frozenset(("auto", *RUNGS))


def _check_kernel_name(kernel) -> None:
    if isinstance(kernel, str) and kernel in _KERNEL_NAMES:
        return
    choices = ", ".join(["auto", *RUNGS])
    if not isinstance(kernel, str):
        raise TypeError(f"kernel must be a str (one of: {choices}), got {type(kernel).__name__}")
    raise ValueError(f"unknown kernel {kernel!r}; choose one of: {choices}")


# Tile orders of the persistent rungs' scheduler (csrc/tile_scheduler.cuh):
# static grouped or Hilbert, the grouped order claimed at run time from a
# counter ("dynamic"), or "split_tail": the dynamic order (grouped for CTA
# pairs) with the tiles of the last, ragged round split in K into parts that
# run at once on the SMs that round would leave idle, the parts passing partial
# sums to each tile's last part through a workspace kept per stream. Where it
# would split nothing (whole waves, a grid that holds every tile, K under 8
# k-blocks, the 64x64 tiles, the instrumented build) it runs as the dynamic
# order (pairs: grouped), which the binding runs as grouped where a grid holds
# every tile. split_tail is the default (benchmarks/NOTES.md, "Why split
# tail"): on the H200 it ran 3000^3 1.18x / 1.16x and 4097^3 1.09x / 1.03x
# faster than the dynamic / grouped orders (persistent / wgmma_persistent) and
# every other benchmark shape within their noise.
TILE_ORDERS = {"grouped": 0, "hilbert": 1, "dynamic": 2, "split_tail": 3}
DEFAULT_TILE_ORDER = "split_tail"


def explain_matmul(a, b, bias, out, kernel, names: tuple[str, str] = ("a", "b")) -> None:
    """Raise the exception that names what is wrong with these arguments of a product
    a (M x K) @ b (K x N) (+ bias) into out, if anything is; return if they are fine.

    ``names`` are the caller's names for a and b. Checks run in a fixed order: the
    arguments themselves, then dtypes and ``out``, then devices, then whether the
    kernel runs there.
    """
    check_tensor(a, names[0], 2)
    check_tensor(b, names[1], 2)
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"inner dimensions differ: {names[0]} is {a.shape[0]}x{a.shape[1]} and "
                         f"{names[1]} is {b.shape[0]}x{b.shape[1]}")
    _check_kernel_name(kernel)
    named = {names[0]: a, names[1]: b}
    if bias is not None:
        named["bias"] = bias
    dtype = check_same_dtype(named)
    if out is not None:
        check_out(out, (a.shape[0], b.shape[1]), dtype, named)
    device = check_cuda(named if out is None else {**named, "out": out})
    _resolve_rung(kernel, dtype, device)


def _run(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None,
         kernel: str, names: tuple[str, str] = ("a", "b"), timeline: torch.Tensor | None = None,
         tile_order: str | None = None, cluster_size: int | None = None) -> torch.Tensor:
    """a (M x K) @ b (K x N) (+ bias) into out (a new tensor if None), with the
    persistent rungs' options: the checked path benchmarks and tests use.

    ``names`` are the caller's names for a and b, used in error messages.
    ``cluster_size`` is wgmma_persistent's: None (the kernel picks: CTA pairs
    wherever the output has more than one row of tiles), 1 (no clusters) or 2
    (CTA pairs share B by TMA multicast); other rungs ignore it. ``tile_order``
    None is DEFAULT_TILE_ORDER; pairs of CTAs walk a static order, so where the
    kernel picks pairs, the dynamic order runs as grouped and the split-tail
    order splits a static one (forcing cluster_size 2 with the dynamic order is
    an error). ``timeline``: see matmul_timeline.
    """
    explain_matmul(a, b, bias, out, kernel, names)
    if tile_order is not None and tile_order not in TILE_ORDERS:
        raise ValueError(f"unknown tile_order {tile_order!r}; choose one of: {', '.join(TILE_ORDERS)}")
    if out is None:
        out = torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)
    ops.matmul_out(a, b, bias, out, kernel, TILE_ORDERS[tile_order or DEFAULT_TILE_ORDER], cluster_size or 0,
                   timeline)
    return out


_matmul_op = ops.matmul.default
_matmul_out_op = ops.matmul_out.default


def matmul(a: torch.Tensor, b: torch.Tensor, *, kernel: str = "auto",
           out: torch.Tensor | None = None) -> torch.Tensor:
    """``a @ b`` for 2-D CUDA tensors of one dtype (float32, float16 or bfloat16).

    Accumulates in fp32 and returns a tensor of the inputs' dtype (``out`` if
    given). Any strides are accepted. ``kernel`` names a rung (see
    ``available_kernels()``) or is ``"auto"``, the best rung for the device,
    the dtype and the shape (README, "What kernel="auto" runs"). Raises
    TypeError/ValueError/RuntimeError naming the bad argument for bad input.
    """
    try:
        if out is None:
            return _matmul_op(a, b, kernel)
        _matmul_out_op(a, b, None, out, kernel)
        return out
    except Exception:
        explain_matmul(a, b, None, out, kernel)
        raise


def check_linear_args(x, weight, bias, kernel) -> None:
    """linear's per-argument checks that need no device, in the order linear has always made them.

    Runs in the caller's frame (also while torch.compile traces), before the
    ``linear_fwd`` op, so bad Python arguments never reach the op's schema.
    """
    check_tensor(x, "x", tuple(range(1, 9)))
    check_tensor(weight, "weight", 2)
    if bias is not None:
        check_tensor(bias, "bias", 1)
        if bias.shape[0] != weight.shape[0]:
            raise ValueError(f"bias has {bias.shape[0]} elements but weight has {weight.shape[0]} rows")
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"x has {x.shape[-1]} features in its last dim but weight is {weight.shape[0]}x{weight.shape[1]} "
            "(out_features x in_features)"
        )
    _check_kernel_name(kernel)


def explain_linear(x, weight, bias, kernel) -> None:
    """Raise the exception that names what is wrong with linear's arguments, if anything is."""
    check_linear_args(x, weight, bias, kernel)
    named = {"x": x, "weight": weight} if bias is None else {"x": x, "weight": weight, "bias": bias}
    _resolve_rung(kernel, check_same_dtype(named), check_cuda(named))


def tile_config(m: int, n: int, device: torch.device | int | None = None, *,
                kernel: str = "persistent") -> dict[str, int]:
    """How a tensor-core rung tiles an m x n output on ``device``: block
    sizes, the number of output tiles (= CTAs of the one-CTA-per-tile rung)
    and the CTAs its persistent twin launches (what fills the device once).

    ``tiled`` and ``persistent`` share one configuration, ``wgmma`` and
    ``wgmma_persistent`` another (Hopper only).
    """
    _check_kernel_name(kernel)
    if kernel == "auto" or not RUNGS[kernel].has_timeline:
        names = ", ".join(n for n, r in RUNGS.items() if r.has_timeline)
        raise ValueError(f"kernel {kernel!r} has no tile configuration; choose one of: {names}")
    if device is None:
        index = torch.cuda.current_device()
    elif isinstance(device, int):
        index = device
    else:
        index = torch.device(device).index
        index = torch.cuda.current_device() if index is None else index
    block_m, block_n, block_k, tiles, ctas = ops.tile_config(int(m), int(n), int(index), RUNGS[kernel].hopper_tiles)
    return {"block_m": block_m, "block_n": block_n, "block_k": block_k, "tiles": tiles, "persistent_ctas": ctas}


TIMELINE_COLUMNS = ("tile_m", "tile_n", "sm", "cta", "start_ns", "end_ns")


def matmul_timeline(a: torch.Tensor, b: torch.Tensor, *, kernel: str = "persistent",
                    tile_order: str = DEFAULT_TILE_ORDER) -> tuple[torch.Tensor, torch.Tensor]:
    """``a @ b`` through the instrumented build of a tensor-core rung.

    ``tile_order`` ("grouped", "hilbert", "dynamic" or "split_tail") is the
    persistent rungs' tile order; the one-CTA-per-tile rungs always run in
    grouped order. "dynamic" runs as grouped where it would assign the same
    tiles (a grid that holds every tile) and for wgmma_persistent's CTA pairs,
    which walk a static order; "split_tail" runs as "dynamic" here (the
    instrumented build records whole tiles).

    Returns (out, timeline): timeline is int64 [tiles, 6], one row per output
    tile with the columns of TIMELINE_COLUMNS, read from %smid and
    %globaltimer on the GPU. The normal (uninstrumented) kernels pay nothing
    for this.
    """
    check_tensor(a, "a", 2)
    check_tensor(b, "b", 2)
    _check_kernel_name(kernel)
    if kernel not in RUNGS or not RUNGS[kernel].has_timeline:
        names = ", ".join(n for n, r in RUNGS.items() if r.has_timeline)
        raise ValueError(f"kernel {kernel!r} has no instrumented build; choose one of: {names}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(
            f"inner dimensions differ: a is {a.shape[0]}x{a.shape[1]} and b is {b.shape[0]}x{b.shape[1]}"
        )
    if tile_order not in TILE_ORDERS:
        raise ValueError(f"unknown tile_order {tile_order!r}; choose one of: {', '.join(TILE_ORDERS)}")
    if min(a.shape[0], a.shape[1], b.shape[1]) == 0:
        raise ValueError(f"matmul_timeline needs M, N and K >= 1, got a {tuple(a.shape)} and b {tuple(b.shape)}")
    device = check_cuda({"a": a, "b": b})
    rung = _resolve_rung(kernel, a.dtype, device)  # before tile_config: names a device that lacks the rung
    tiles = tile_config(a.shape[0], b.shape[1], device, kernel=rung.name)["tiles"]
    timeline = torch.full((tiles, len(TIMELINE_COLUMNS)), -1, dtype=torch.int64, device=device)
    out = _run(a, b, None, None, kernel, timeline=timeline, tile_order=tile_order)
    return out, timeline
