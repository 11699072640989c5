"""The correctness checks of the GPU tests: the protocol of harness.checks (operands,
fp64 references, error measures, tolerances; scripts/harness/checks.py says what
it checks and why) and what only the tests need: ``check_graph_replays``,
``timeline_parts`` and ``signed_permutation``.

The tests import everything from here; scripts/ is on their path through
pyproject.toml's pytest settings.
"""

from __future__ import annotations

import torch

# Re-exported for the tests.
from harness.checks import (DECODE_M, DTYPE_NAMES, EXACT_INT_LIMIT, EXACT_INT_MAX_ENTRY,  # noqa: F401
                            MODEL_PROJECTIONS, PREFILL_M, TOLERANCE, cancellation_floor, check_exact,
                            exact_int_bias, exact_int_nonzeros_per_row, exact_int_operands, matmul_error,
                            nan_count, poison, random_operands, reference, rel_error, underflow_floor)
from harness.kernel import CLUSTER_SIZES, CLUSTER_VARIANT, TILE_ORDER_VARIANTS, run_variant  # noqa: F401


def built_with_cuda12(variant_dir) -> bool:
    """Whether a variant folder (build/<variant>/) holds a CUDA 12 build: those run
    wgmma_persistent in single CTAs and split no 128-wide tile (csrc/wgmma_persistent.cu)."""
    return "-cu12" in variant_dir.name


NO_UNDERFILLED_SPLIT = "CUDA 12 builds do not split 128-wide tiles (csrc/wgmma_persistent.cu)"


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


def timeline_parts(pm, kernel: str, timeline: torch.Tensor, m: int, n: int, k: int,
                   sm_count: int, cluster_size: int | None = None) -> list[list[int]]:
    """The units of work an instrumented launch of ``kernel`` (with ``cluster_size``)
    recorded for an m x n x k product (``pm.matmul_timeline``), as lists in
    TIMELINE_COLUMNS order, after asserting what every timeline promises:

    - tile_config's timeline_rows rows; those no unit wrote are -1 throughout;
    - every tile of the grid has parts whose K-ranges [k_begin, k_end) cover [0, K)
      once, without gap or overlap, and no part lies outside the grid;
    - each part has start < end, an SM id below ``sm_count`` and a CTA below the grid
      (the tiles for one CTA per tile, else the rows past the tiles');
    - a row below the tiles' count holds that tile (tile_m * tiles_n + tile_n), whole or
      its first part; the rows past them hold parts of tiles cut in K;
    - a CTA's parts run one after another.
    """
    names = tuple(pm.TIMELINE_COLUMNS)
    col = {c: i for i, c in enumerate(names)}
    assert names == ("tile_m", "tile_n", "k_begin", "k_end", "sm", "cta", "start_ns", "end_ns")
    cfg = pm.tile_config(m, n, kernel=kernel, k=k, cluster_size=cluster_size)
    tiles, rows = cfg["tiles"], cfg["timeline_rows"]
    tiles_m, tiles_n = -(-m // cfg["block_m"]), -(-n // cfg["block_n"])
    assert tiles == tiles_m * tiles_n and rows > tiles, cfg
    t = timeline.cpu()
    assert tuple(t.shape) == (rows, len(names)) and t.dtype == torch.int64
    written = t[:, col["start_ns"]] >= 0
    assert bool((t[~written] == -1).all()), "a row no unit wrote is -1 throughout"
    ctas = max(tiles, rows - tiles)
    by_tile: dict[tuple[int, int], list[tuple[int, int]]] = {}
    parts = []
    for row in torch.nonzero(written).flatten().tolist():
        p = t[row].tolist()
        tile_m, tile_n, k_begin, k_end, sm, cta, start, end = p
        assert 0 <= tile_m < tiles_m and 0 <= tile_n < tiles_n, f"row {row}: tile outside the grid: {p}"
        assert 0 <= k_begin < k_end <= k, f"row {row}: K-range outside [0, {k}): {p}"
        assert start < end, f"row {row}: start >= end: {p}"
        assert 0 <= sm < sm_count and 0 <= cta < ctas, f"row {row}: SM or CTA out of range: {p}"
        if row < tiles:
            assert row == tile_m * tiles_n + tile_n and k_begin == 0, f"row {row} holds another tile: {p}"
        else:
            assert k_end - k_begin < k, f"row {row} past the tiles' holds a whole tile: {p}"
        by_tile.setdefault((tile_m, tile_n), []).append((k_begin, k_end))
        parts.append(p)
    assert len(by_tile) == tiles, f"{tiles - len(by_tile)} of {tiles} tiles have no part"
    for tile, ranges in by_tile.items():
        ranges.sort()
        assert ranges[0][0] == 0 and ranges[-1][1] == k and all(
            a[1] == b[0] for a, b in zip(ranges, ranges[1:])), f"tile {tile}: K-ranges {ranges} do not cover [0, {k}) once"
    for c in {p[col["cta"]] for p in parts}:
        mine = sorted((p[col["start_ns"]], p[col["end_ns"]]) for p in parts if p[col["cta"]] == c)
        assert all(e <= s for (_, e), (s, _) in zip(mine, mine[1:])), f"CTA {c} overlaps its own parts"
    return parts


def signed_permutation(n: int) -> torch.Tensor:
    """An n x n matrix with one entry +-1 per row and column (float32, CUDA):
    a product with it reorders and negates columns, exactly in any dtype."""
    w = torch.zeros(n, n, device="cuda")
    w[torch.randperm(n, device="cuda"), torch.arange(n, device="cuda")] = (
        torch.randint(0, 2, (n,), device="cuda") * 2 - 1).float()
    return w
