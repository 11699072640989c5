"""matmul, and the checks behind every op call: the C++ op entry (torch_binding.cpp)
checks the arguments, picks the rung, copies operands a rung cannot read and launches;
when it raises, the functions here check the arguments again in Python, so the
exception names the argument and what is wrong with it."""

from __future__ import annotations

import torch

from ._ops import ops
from ._rungs import AUTO_ORDER, DEFAULT_TILE_ORDER, RUNGS, Rung, TileOrder, availability, tile_order_of
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


def explain_matmul(a, b, bias, out, kernel) -> None:
    """Raise the exception that names what is wrong with these arguments of a product
    a (M x K) @ b (K x N) (+ bias) into out, if anything is; return if they are fine.

    Checks run in a fixed order: the arguments themselves, then dtypes and
    ``out``, then devices, then whether the kernel runs there.
    """
    check_tensor(a, "a", 2)
    check_tensor(b, "b", 2)
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"inner dimensions differ: a is {a.shape[0]}x{a.shape[1]} and "
                         f"b is {b.shape[0]}x{b.shape[1]}")
    named = {"a": a, "b": b}
    if bias is not None:
        check_tensor(bias, "bias", 1)
        if bias.shape[0] != b.shape[1]:
            raise ValueError(f"bias has {bias.shape[0]} elements but the product has {b.shape[1]} columns "
                             f"(b is {b.shape[0]}x{b.shape[1]})")
        named["bias"] = bias
    _check_kernel_name(kernel)
    dtype = check_same_dtype(named)
    if out is not None:
        check_out(out, (a.shape[0], b.shape[1]), dtype, named)
    device = check_cuda(named if out is None else {**named, "out": out})
    _resolve_rung(kernel, dtype, device)


def _rungs_that(flag: str) -> str:
    """The names of the rungs whose Rung field ``flag`` is set, for error messages."""
    return ", ".join(n for n, r in RUNGS.items() if getattr(r, flag))


def _order_code(tile_order) -> int:
    """The op's tile_order int: the TileOrder's, or -1 (the op's default, split tail) for None."""
    return -1 if tile_order is None else int(tile_order_of(tile_order))


def _option_codes(kernel, tile_order, cluster_size) -> tuple[int, int]:
    """The matmul_out op's ``tile_order`` and ``cluster_size`` ints for matmul's
    options (-1 and 0 where None: the op's defaults); raises naming the option and
    what it may be. A named rung must take the options it is given; "auto" takes
    both, and the rung it picks uses those it takes."""
    _check_kernel_name(kernel)
    rung = RUNGS.get(kernel)
    order = _order_code(tile_order)
    if tile_order is not None and rung is not None and not rung.takes_tile_order:
        raise ValueError(f"kernel {kernel!r} takes no tile_order; the rungs that do: "
                         f"{_rungs_that('takes_tile_order')}")
    return order, _cluster_code(kernel, cluster_size, order)


def _cluster_code(kernel: str, cluster_size, order: int = -1) -> int:
    """The ops' ``cluster_size`` int (0 where None: the kernel picks) for a rung
    named by ``kernel`` (or "auto") launched in tile order ``order``; raises naming
    the option and what it may be."""
    rung = RUNGS.get(kernel)
    if cluster_size is None:
        return 0
    if isinstance(cluster_size, bool) or not isinstance(cluster_size, int):
        raise TypeError(f"cluster_size must be None, 1 or 2, got {type(cluster_size).__name__}")
    if cluster_size not in (1, 2):
        raise ValueError(f"cluster_size must be None (the kernel picks), 1 or 2, got {cluster_size}")
    if rung is not None and not rung.takes_cluster_size:
        raise ValueError(f"kernel {kernel!r} takes no cluster_size; the rungs that do: "
                         f"{_rungs_that('takes_cluster_size')}")
    if rung is not None and cluster_size not in rung.cluster_sizes:
        sizes = " or ".join(map(str, rung.cluster_sizes))
        raise ValueError(f"kernel {kernel!r} takes cluster_size {sizes} (or None: the kernel picks), got {cluster_size}")
    if cluster_size == 2 and order == TileOrder.DYNAMIC:
        raise ValueError("the dynamic tile order runs without clusters: pass cluster_size=1, "
                         "or None to let the kernel pick")
    return cluster_size


def _matmul_out(a, b, bias, out, kernel: str, order: int, clusters: int,
                timeline: torch.Tensor | None = None) -> torch.Tensor:
    """The matmul_out op into ``out`` (a new tensor if None); when the op raises,
    the exception that names the bad argument."""
    try:
        result = torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device) if out is None else out
        _matmul_out_op(a, b, bias, result, kernel, order, clusters, timeline)
        return result
    except Exception:
        explain_matmul(a, b, bias, out, kernel)
        raise


_matmul_op = ops.matmul.default
_matmul_out_op = ops.matmul_out.default


def matmul(a: torch.Tensor, b: torch.Tensor, *, kernel: str = "auto", out: torch.Tensor | None = None,
           bias: torch.Tensor | None = None, tile_order: TileOrder | str | None = None,
           cluster_size: int | None = None) -> torch.Tensor:
    """``a @ b`` (``+ bias``) for 2-D CUDA tensors of one dtype (float32, float16
    or bfloat16).

    Accumulates in fp32 and returns a tensor of the inputs' dtype (``out`` if
    given). Any strides are accepted. ``kernel`` names a rung (see
    ``available_kernels()``) or is ``"auto"``, the best rung for the device,
    the dtype and the shape (README, "What kernel="auto" runs").

    ``bias`` (N elements, the inputs' dtype) is added in fp32 before the
    result is rounded. The persistent rungs' options, where None lets the
    kernel choose:

    - ``tile_order``: a ``TileOrder`` or its name ("grouped", "hilbert",
      "dynamic", "split_tail"); None is split tail. Taken by ``persistent``
      and ``wgmma_persistent``.
    - ``cluster_size``: 1 (single CTAs) or 2 (CTA pairs that share B by TMA
      multicast); None picks pairs wherever the output has more than one row
      of tiles. Taken by ``wgmma_persistent``. Pairs walk a static order, so
      with pairs the dynamic order runs as grouped, and cluster_size=2 with
      the dynamic order is an error. ``wgmma_streamk`` takes 1: its stream-K
      cut over 128-row tiles without clusters, where None runs clusters of
      CTAs that split a tile's K wherever they fill most of the SMs (and
      sizes them itself, so with ``kernel="auto"`` a 2 applies to
      wgmma_persistent only).

    With ``kernel="auto"`` the options apply when the rung it picks takes
    them. Raises TypeError/ValueError/RuntimeError naming the bad argument
    for bad input, including an option the named rung does not take.
    """
    if bias is None and tile_order is None and cluster_size is None:
        try:
            if out is None:
                return _matmul_op(a, b, kernel)
            _matmul_out_op(a, b, None, out, kernel)
            return out
        except Exception:
            explain_matmul(a, b, None, out, kernel)
            raise
    order, clusters = _option_codes(kernel, tile_order, cluster_size)
    return _matmul_out(a, b, bias, out, kernel, order, clusters)


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
                kernel: str = "persistent", k: int | None = None,
                cluster_size: int | None = None) -> dict[str, int]:
    """How a rung with tiles cuts an m x n output on ``device``: block sizes,
    the number of output tiles (= CTAs of the one-CTA-per-tile rung), the
    CTAs its persistent twin launches (what fills the device once, at most a
    CTA per tile; wgmma_persistent's default launch may split fewer tiles than
    SMs in K, a CTA per part, which depends on ``k``, as its tile width does
    at a few hundred tokens) and the rows of its
    timeline (``matmul_timeline``: one per tile, then one per CTA
    a launch may run, for the parts of tiles cut in K), and the CTAs per
    cluster it launches when left to pick (``cluster_size``: 2 where
    wgmma_persistent pairs CTAs, which CUDA 12 builds never do; else 1).

    ``tiled`` and ``persistent`` share one configuration, ``wgmma`` and
    ``wgmma_persistent`` another (Hopper only). ``wgmma_streamk`` (Hopper
    only) has tiles of block_m tokens (output rows) by block_n = 128 weight
    rows (output columns), k-blocks of block_k = 128, and launches one CTA an
    SM but no more than there are (tile, k-block) work items, or, where a
    whole number of CTAs per tile fills most of the SMs, that many CTAs a
    tile in clusters of as many (``cluster_size``), over tiles of 64 weight
    rows (block_n = 64) where those fill more SMs: its grid depends on
    ``k``, the product's depth (None: deep enough for every SM), as
    wgmma_persistent's does.

    ``cluster_size`` is the launch's, as ``matmul`` takes it (None: the one the
    kernel picks): 1 or 2 for wgmma_persistent, 1 for wgmma_streamk (its
    stream-K cut over 128-row tiles, no clusters); the other rungs take none.
    """
    _check_kernel_name(kernel)
    if kernel == "auto" or not RUNGS[kernel].has_timeline:
        raise ValueError(f"kernel {kernel!r} has no tile configuration; choose one of: {_rungs_that('has_timeline')}")
    if k is not None and (isinstance(k, bool) or not isinstance(k, int)):
        raise TypeError(f"k must be None or an int, got {type(k).__name__}")
    if k is not None and k < 1:
        raise ValueError(f"k must be None or at least 1, got {k}")
    if device is None:
        index = torch.cuda.current_device()
    elif isinstance(device, int):
        index = device
    else:
        index = torch.device(device).index
        index = torch.cuda.current_device() if index is None else index
    clusters = _cluster_code(kernel, cluster_size)
    values = ops.tile_config(int(m), int(n), int(index), kernel, 0 if k is None else k, clusters)
    return dict(zip(("block_m", "block_n", "block_k", "tiles", "persistent_ctas", "timeline_rows", "cluster_size"),
                    values))


TIMELINE_COLUMNS = ("tile_m", "tile_n", "k_begin", "k_end", "sm", "cta", "start_ns", "end_ns")


def matmul_timeline(a: torch.Tensor, b: torch.Tensor, *, kernel: str = "persistent",
                    tile_order: TileOrder | str | None = DEFAULT_TILE_ORDER,
                    cluster_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``a @ b`` through the instrumented build of a rung with tiles.

    ``tile_order`` (a ``TileOrder`` or its name: "grouped", "hilbert", "dynamic"
    or "split_tail"; None is split tail) is the persistent rungs' tile order;
    the one-CTA-per-tile rungs always run in grouped order, and wgmma_streamk
    cuts its work by stream-K whatever the order. ``cluster_size`` is
    ``matmul``'s (None: the kernel picks; wgmma_persistent and wgmma_streamk
    take it, as ``tile_config`` does for the same launch). "dynamic" runs as
    grouped where it would assign the same tiles (a grid that holds every tile) and for
    wgmma_persistent's CTA pairs, which walk a static order; "split_tail"
    runs as "dynamic" (pairs: grouped) where it would split nothing, as
    ``matmul`` does.

    Returns (out, timeline): timeline is int64 [rows, 8] with the columns of
    TIMELINE_COLUMNS, one row per unit of work the kernel ran: a whole output
    tile (k_begin 0, k_end K) or a part of a tile that the split-tail order or
    stream-K cut in K (the elements [k_begin, k_end) of K it summed; a tile's
    parts cover [0, K) once), which SM (%smid) and CTA ran it, and when
    (%globaltimer, ns). tile_m and tile_n count tile_config's block_m rows and
    block_n columns of the output. There are tile_config's timeline_rows rows,
    a row per tile and per CTA a launch may run; rows no unit wrote stay -1
    (keep those with start_ns >= 0). The normal (uninstrumented) kernels pay
    nothing for this.
    """
    check_tensor(a, "a", 2)
    check_tensor(b, "b", 2)
    _check_kernel_name(kernel)
    if kernel not in RUNGS or not RUNGS[kernel].has_timeline:
        raise ValueError(f"kernel {kernel!r} has no instrumented build; choose one of: {_rungs_that('has_timeline')}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(
            f"inner dimensions differ: a is {a.shape[0]}x{a.shape[1]} and b is {b.shape[0]}x{b.shape[1]}"
        )
    order = _order_code(tile_order)
    clusters = _cluster_code(kernel, cluster_size, order)
    if min(a.shape[0], a.shape[1], b.shape[1]) == 0:
        raise ValueError(f"matmul_timeline needs M, N and K >= 1, got a {tuple(a.shape)} and b {tuple(b.shape)}")
    device = check_cuda({"a": a, "b": b})
    rung = _resolve_rung(kernel, a.dtype, device)  # before tile_config: names a device that lacks the rung
    rows = tile_config(a.shape[0], b.shape[1], device, kernel=rung.name, k=a.shape[1],
                       cluster_size=cluster_size)["timeline_rows"]
    timeline = torch.full((rows, len(TIMELINE_COLUMNS)), -1, dtype=torch.int64, device=device)
    return _matmul_out(a, b, None, None, kernel, order, clusters, timeline), timeline
