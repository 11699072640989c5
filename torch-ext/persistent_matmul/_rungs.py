"""The kernel rungs this build provides, which of them run on the current device, and the
tile orders of the persistent rungs."""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Rung:
    """One kernel rung: the dtypes it takes and the GPUs it has code for."""

    name: str
    dtypes: tuple[torch.dtype, ...]
    # Lowest compute capability the build has machine code or PTX for.
    min_capability: tuple[int, int]
    # Set for arch-specific code (sm_90a): runs on exactly this capability.
    exact_capability: tuple[int, int] | None
    summary: str
    # Operand elements per 16 bytes when the rung reads operands in a
    # restricted layout (K- or N-contiguous, aligned rows; the caller copies
    # others first); 0 when any strides are taken.
    chunk_elements: int = 0
    # Whether an instrumented build records a timeline (one row per unit of
    # work: an output tile, or a part of one cut in K) and the rung has a
    # tile configuration (tile_config).
    has_timeline: bool = False
    # Whether the op takes a tile order (the persistent rungs' scheduler).
    takes_tile_order: bool = False
    # The cluster sizes a caller may name (None lets the rung pick): 1 and 2
    # (CTA pairs sharing B by TMA multicast) for wgmma_persistent, 1 (no
    # clusters) for wgmma_streamk, which otherwise sizes its own.
    cluster_sizes: tuple[int, ...] = ()

    @property
    def takes_cluster_size(self) -> bool:
        return bool(self.cluster_sizes)


ALL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
HALF_DTYPES = (torch.float16, torch.bfloat16)

RUNGS: dict[str, Rung] = {
    rung.name: rung
    for rung in (
        Rung(
            name="naive",
            dtypes=ALL_DTYPES,
            min_capability=(8, 0),
            exact_capability=None,
            summary="one thread per output element, fp32 accumulate",
        ),
        Rung(
            name="warptiled",
            dtypes=(torch.float32,),
            min_capability=(8, 0),
            exact_capability=None,
            summary="fp32 on CUDA cores: 128x128 block tile, 32x64 warp tiles, 8x8 thread tiles, double buffered",
            chunk_elements=4,
        ),
        Rung(
            name="tiled",
            dtypes=HALF_DTYPES,
            min_capability=(8, 0),
            exact_capability=None,
            summary="tensor cores (mma.sync, ldmatrix, cp.async pipeline), one CTA per output tile",
            chunk_elements=8,
            has_timeline=True,
        ),
        Rung(
            name="persistent",
            dtypes=HALF_DTYPES,
            min_capability=(8, 0),
            exact_capability=None,
            summary="the tiled tile code, one wave of CTAs looping over tiles; next tile's loads overlap the epilogue",
            chunk_elements=8,
            has_timeline=True,
            takes_tile_order=True,
        ),
        Rung(
            name="wgmma",
            dtypes=HALF_DTYPES,
            min_capability=(9, 0),
            exact_capability=(9, 0),
            summary="Hopper: TMA loads, wgmma, producer/consumer warpgroups with mbarriers; one CTA per 128x256 tile",
            chunk_elements=8,
            has_timeline=True,
        ),
        Rung(
            name="wgmma_persistent",
            dtypes=HALF_DTYPES,
            min_capability=(9, 0),
            exact_capability=(9, 0),
            summary="the wgmma CTA, one wave looping over tiles in 2-CTA clusters that share B by TMA multicast; "
                    "the producer loads the next tile during the epilogue",
            chunk_elements=8,
            has_timeline=True,
            takes_tile_order=True,
            cluster_sizes=(1, 2),
        ),
        Rung(
            name="splitk",
            dtypes=HALF_DTYPES,
            min_capability=(8, 0),
            exact_capability=None,
            summary="skinny products (decode shapes): the weights as mma.sync's A operand, 16 weight rows per "
                    "CTA, K split over its 8 warps, weights streamed into registers",
            chunk_elements=8,
        ),
        Rung(
            name="wgmma_streamk",
            dtypes=HALF_DTYPES,
            min_capability=(9, 0),
            exact_capability=(9, 0),
            summary="Hopper skinny products: the weights as wgmma's A operand, TMA-streamed through a ring of "
                    "stages, the (tile, k-block) work cut into one equal stretch per SM (stream-K)",
            chunk_elements=8,
            has_timeline=True,
            cluster_sizes=(1,),
        ),
    )
}

# The rungs `kernel="auto"` may fall back on for a dtype, best first: when none
# of them runs, the error lists why for each. The choice itself is made per
# call in the op entry (torch-ext/rungs.h, choose_auto), by device, dtype and
# shape: wgmma_streamk or splitk for skinny products, else the first of these that runs.
AUTO_ORDER = ("wgmma_persistent", "wgmma", "persistent", "tiled", "warptiled", "naive")


class TileOrder(enum.IntEnum):
    """The order in which the persistent rungs' CTAs walk the output tiles
    (csrc/tile_scheduler.cuh). The values are the ints the ``matmul_out`` op
    takes; ``str()`` of a member is its name in lower case, and
    ``TileOrder("hilbert")`` looks a member up by that name.

    - ``GROUPED``: static; groups of 8 tile rows walked column by column, so
      tiles that run at the same time share rows of A and columns of B in L2.
    - ``HILBERT``: static; along a Hilbert curve over the smallest power-of-two
      square that covers the tile grid, skipping cells outside it.
    - ``DYNAMIC``: the grouped order handed out at run time: after its first
      tile, a CTA claims the next unclaimed tile from a counter, so CTAs that
      run ahead take more tiles.
    - ``SPLIT_TAIL`` (the default): the dynamic order (grouped for CTA pairs),
      with the tiles of the last, ragged round split in K into parts that run
      at once on the SMs that round would leave idle; the parts pass partial
      sums to each tile's last part through a workspace kept per stream.

    Where split tail would split nothing (whole waves, a grid that holds every
    tile, K under 8 k-blocks, the 64x64 tiles) it runs as the dynamic order,
    and the dynamic order runs as grouped where a grid holds every tile or CTA
    pairs walk the tiles (pairs walk a static order).
    Split tail is the default because on the H200 it ran 3000^3 1.18x / 1.16x
    and 4097^3 1.09x / 1.03x faster than the dynamic / grouped orders
    (persistent / wgmma_persistent) and every other benchmark shape within
    their noise (benchmarks/NOTES.md, "Why split tail").
    """

    GROUPED = 0
    HILBERT = 1
    DYNAMIC = 2
    SPLIT_TAIL = 3

    def __str__(self) -> str:
        return self.name.lower()

    @classmethod
    def _missing_(cls, value):
        # TileOrder("split_tail"): the lower-case names the functions take.
        if isinstance(value, str) and value.islower():
            return cls.__members__.get(value.upper())
        return None


DEFAULT_TILE_ORDER = TileOrder.SPLIT_TAIL
_TILE_ORDER_NAMES = ", ".join(map(str, TileOrder))


def tile_order_of(value) -> TileOrder:
    """The TileOrder ``value`` is or names; raises ValueError naming the orders for an
    unknown name and TypeError for anything but a TileOrder or a str."""
    if isinstance(value, TileOrder):
        return value
    if not isinstance(value, str):
        raise TypeError(f"tile_order must be a TileOrder or one of its names ({_TILE_ORDER_NAMES}), "
                        f"got {type(value).__name__}")
    try:
        return TileOrder(value)
    except ValueError:
        raise ValueError(f"unknown tile_order {value!r}; choose one of: {_TILE_ORDER_NAMES}") from None


@dataclass(frozen=True)
class KernelAvailability:
    """Whether a rung runs on a device, and if not, why."""

    name: str
    available: bool
    reason: str
    dtypes: tuple[torch.dtype, ...]


def _capability_problem(rung: Rung, device: torch.device) -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA device is present (torch.cuda.is_available() is False)"
    if device.type != "cuda":
        return f"{device} is not a CUDA device"
    capability = torch.cuda.get_device_capability(device)
    if rung.exact_capability is not None and capability != rung.exact_capability:
        want = "%d.%d" % rung.exact_capability
        return (f"needs compute capability exactly {want} (arch-specific code); "
                f"{torch.cuda.get_device_name(device)} is {capability[0]}.{capability[1]}")
    if capability < rung.min_capability:
        want = "%d.%d" % rung.min_capability
        return (f"needs compute capability >= {want}; "
                f"{torch.cuda.get_device_name(device)} is {capability[0]}.{capability[1]}")
    return None


@functools.lru_cache(maxsize=None)
def _availability_on_cuda(name: str, index: int) -> KernelAvailability:
    """Availability on cuda:index, asked once per process: a device's capability
    does not change, and matmul consults this on every call."""
    rung = RUNGS[name]
    problem = _capability_problem(rung, torch.device("cuda", index))
    if problem is None:
        return KernelAvailability(name, True, "runs on this device", rung.dtypes)
    return KernelAvailability(name, False, problem, rung.dtypes)


def availability(name: str, device: torch.device | None = None) -> KernelAvailability:
    rung = RUNGS[name]
    if device is not None and device.type == "cuda" and device.index is not None:
        return _availability_on_cuda(name, device.index)
    if device is None or device.type == "cuda":
        if torch.cuda.is_available():
            return _availability_on_cuda(name, torch.cuda.current_device())
        device = torch.device("cuda")
    return KernelAvailability(name, False, _capability_problem(rung, device), rung.dtypes)
