"""matmul and linear: validate once, pick a rung, run its op."""

from __future__ import annotations

import torch

from ._ops import ops
from ._rungs import AUTO_ORDER, RUNGS, Rung, availability
from ._validate import check_cuda, check_out, check_same_dtype, check_tensor, same_cuda_device_and_dtype


# The rung each (kernel, dtype, device) resolved to: matmul resolves it on every
# call, and a device's rungs do not change within a process. Failures are not
# kept (they raise, and raise again the next time).
_CHOSEN: dict[tuple[str, torch.dtype, torch.device], Rung] = {}


def _choose_rung(kernel: str, dtype: torch.dtype, device: torch.device) -> Rung:
    key = (kernel, dtype, device)
    rung = _CHOSEN.get(key)
    if rung is None:
        rung = _CHOSEN[key] = _resolve_rung(kernel, dtype, device)
    return rung


def _resolve_rung(kernel: str, dtype: torch.dtype, device: torch.device) -> Rung:
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
    if kernel != "auto" and kernel not in RUNGS:
        raise ValueError(f"unknown kernel {kernel!r}; choose one of: {choices}")


def _aligned(t: torch.Tensor) -> bool:
    return t.data_ptr() % 16 == 0


def _padded_copy(t: torch.Tensor, contiguous_dim: int, chunk: int) -> torch.Tensor:
    """A copy of 2-D t, contiguous along contiguous_dim, with the other stride
    rounded up to a multiple of 8 * `chunk` elements (128 bytes).

    16 bytes would do for correctness; 128-byte rows start on cache lines, so
    a kernel's 128-byte row segments each touch one line, not two (measured on
    the H200 at 4097^3: rows 8208 bytes apart ran the wgmma rung at 270 TFLOP/s).
    """
    rows, cols = (t.shape[0], t.shape[1]) if contiguous_dim == 1 else (t.shape[1], t.shape[0])
    padded = -(-cols // (8 * chunk)) * 8 * chunk
    buffer = torch.empty((rows, max(padded, chunk)), dtype=t.dtype, device=t.device)[:, :cols]
    buffer.copy_(t if contiguous_dim == 1 else t.t())
    return buffer if contiguous_dim == 1 else buffer.t()


def kernel_operands(a: torch.Tensor, b: torch.Tensor, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """a and b as the rungs that load 16-byte chunks read them, copying only what they can't.

    A must be K-contiguous, B K- or N-contiguous, with leading dims that are
    multiples of `chunk` elements (16 bytes) and 16-byte aligned data (the
    same conditions as tensor_core_operands_ok / cuda_core_operands_ok in
    csrc/). A transposed A, a leading dimension like 4097, or an odd offset
    gets a padded copy, so every shape takes the fast path.
    """
    m, k = a.shape
    n = b.shape[1]
    a_stride_m, a_stride_k = a.stride()
    b_stride_k, b_stride_n = b.stride()
    # Rows must not overlap (a leading stride below the row length, e.g. 0 from
    # expand(), is copied too): the Hopper rungs' tensor maps need that.
    if not (_aligned(a) and (a_stride_k == 1 or k == 1) and (m == 1 or (a_stride_m % chunk == 0
                                                                         and a_stride_m >= k))):
        a = _padded_copy(a, contiguous_dim=1, chunk=chunk)
    k_major = (b_stride_k == 1 or k == 1) and (n == 1 or (b_stride_n % chunk == 0 and b_stride_n >= k))
    n_major = (b_stride_n == 1 or n == 1) and (k == 1 or (b_stride_k % chunk == 0 and b_stride_k >= n))
    if not (_aligned(b) and (k_major or n_major)):
        b = _padded_copy(b, contiguous_dim=0 if b_stride_k == 1 else 1, chunk=chunk)
    return a, b


# Tile orders of the persistent rungs' scheduler (csrc/tile_scheduler.cuh):
# static grouped or Hilbert, the grouped order claimed at run time from a
# counter ("dynamic"), or "split_tail": the dynamic order (grouped for CTA
# pairs) with the tiles of the last, ragged round split in K into parts that
# run at once on the SMs that round would leave idle, the parts passing partial
# sums to each tile's last part through a workspace kept per stream. Where it
# would split nothing (whole waves, a grid that holds every tile, K under 8
# k-blocks, the 64x64 tiles, the instrumented build) it runs as the dynamic
# order (pairs: grouped), which the binding runs as grouped where a grid holds
# every tile. split_tail is the default: on the H200 (benchmarks/NOTES.md,
# eighth session) it ran 3000^3 1.18x / 1.16x and 4097^3 1.09x / 1.03x faster
# than the dynamic / grouped orders (persistent / wgmma_persistent) and every
# other benchmark shape within their noise. Dynamic was faster than grouped
# where the last wave is ragged (fourth session).
TILE_ORDERS = {"grouped": 0, "hilbert": 1, "dynamic": 2, "split_tail": 3}
DEFAULT_TILE_ORDER = "split_tail"


def _run(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None,
         kernel: str, names: tuple[str, str] = ("a", "b"), timeline: torch.Tensor | None = None,
         tile_order: str | None = None, cluster_size: int | None = None) -> torch.Tensor:
    """a (M x K) @ b (K x N) (+ bias) into out, after the per-argument checks.

    ``names`` are the caller's names for a and b, used in error messages.
    ``cluster_size`` is wgmma_persistent's, for benchmarks and tests: None
    (the kernel picks: CTA pairs wherever the output has more than one row of
    tiles), 1 (no clusters) or 2 (CTA pairs share B by TMA multicast); other
    rungs ignore it. ``tile_order`` None is DEFAULT_TILE_ORDER; pairs of CTAs
    walk a static order, so where the kernel picks pairs, the dynamic order
    runs as grouped and the split-tail order splits a static one (forcing
    cluster_size 2 with the dynamic order is an error).
    """
    _check_kernel_name(kernel)
    m, n = a.shape[0], b.shape[1]
    named = {names[0]: a, names[1]: b}
    if bias is not None:
        named["bias"] = bias
    # The common case (CUDA tensors of one device and dtype) skips the checks
    # that build the error messages; the others run them, and they raise.
    common = same_cuda_device_and_dtype(a, b, bias, out)
    dtype = a.dtype if common else check_same_dtype(named)
    if out is not None:
        check_out(out, (m, n), dtype, named)
    device = a.device if common else check_cuda(named if out is None else {**named, "out": out})
    rung = _choose_rung(kernel, dtype, device)
    if out is None:
        out = torch.empty((m, n), dtype=dtype, device=device)
    if m == 0 or n == 0:
        return out
    if a.shape[1] == 0:  # empty sum: zeros (plus bias)
        out.zero_()
        if bias is not None:
            out.add_(bias)
        return out
    if rung.chunk_elements:
        a, b = kernel_operands(a, b, rung.chunk_elements)
    if tile_order is None:
        tile_order = DEFAULT_TILE_ORDER
    if rung.name == "wgmma_persistent":
        ops.wgmma_persistent(a, b, bias, out, timeline, TILE_ORDERS[tile_order], cluster_size or 0)
    elif rung.takes_tile_order:
        getattr(ops, rung.op_name)(a, b, bias, out, timeline, TILE_ORDERS[tile_order])
    elif rung.has_timeline:
        getattr(ops, rung.op_name)(a, b, bias, out, timeline)
    else:
        getattr(ops, rung.op_name)(a, b, bias, out)
    return out


def matmul(a: torch.Tensor, b: torch.Tensor, *, kernel: str = "auto",
           out: torch.Tensor | None = None) -> torch.Tensor:
    """``a @ b`` for 2-D CUDA tensors of one dtype (float32, float16 or bfloat16).

    Accumulates in fp32 and returns a tensor of the inputs' dtype (``out`` if
    given). Any strides are accepted. ``kernel`` names a rung (see
    ``available_kernels()``) or is ``"auto"``, the best rung for the device
    and dtype. Raises TypeError/ValueError/RuntimeError naming the bad
    argument for bad input.
    """
    check_tensor(a, "a", 2)
    check_tensor(b, "b", 2)
    if a.shape[1] != b.shape[0]:
        raise ValueError(
            f"inner dimensions differ: a is {a.shape[0]}x{a.shape[1]} and b is {b.shape[0]}x{b.shape[1]}"
        )
    return _run(a, b, None, out, kernel)


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


def linear_impl(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                kernel: str) -> torch.Tensor:
    """The body of linear after check_linear_args: device checks, rung choice and the launch.

    The ``linear_fwd`` custom op (_compile.py) runs this as its real kernel.
    """
    if bias is not None and bias.numel() > 1 and bias.stride(0) != 1:
        bias = bias.contiguous()
    rows = 1
    for size in x.shape[:-1]:
        rows *= size
    x2d = x.reshape(rows, x.shape[-1])  # not reshape(-1, k): that fails for k == 0
    out = _run(x2d, weight.t(), bias, None, kernel, names=("x", "weight"))
    return out.reshape(*x.shape[:-1], weight.shape[0])


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
    rung = _choose_rung(kernel, a.dtype, device)  # before tile_config: names a device that lacks the rung
    tiles = tile_config(a.shape[0], b.shape[1], device, kernel=rung.name)["tiles"]
    timeline = torch.full((tiles, len(TIMELINE_COLUMNS)), -1, dtype=torch.int64, device=device)
    out = _run(a, b, None, None, kernel, timeline=timeline, tile_order=tile_order)
    return out, timeline
