"""GPU tests of the tensor-core rungs' tiling: the instrumented timeline, the
persistent grid, and shapes that cross tile-size and layout boundaries.

Run with ``python -m pytest -m gpu tests`` on a machine with a CUDA GPU.
"""

from __future__ import annotations

import pytest
import torch

from matmul_checks import (NO_UNDERFILLED_SPLIT, TOLERANCE, built_with_cuda12, check_exact, check_graph_replays,
                           exact_int_bias, exact_int_operands, matmul_error, nan_count, poison, random_operands,
                           signed_permutation, timeline_parts)

pytestmark = pytest.mark.gpu

TENSOR_CORE_RUNGS = ["tiled", "persistent", "wgmma", "wgmma_persistent"]
PERSISTENT_RUNGS = ("persistent", "wgmma_persistent")
TIMELINE_SHAPES = [(1, 1, 1), (129, 65, 70), (1000, 1000, 1000), (4097, 4097, 256), (8192, 8192, 64)]


TIMELINE_RUNS = [("tiled", "grouped"), ("persistent", "grouped"), ("persistent", "hilbert"),
                 ("persistent", "dynamic"), ("persistent", "split_tail"), ("wgmma", "grouped"),
                 ("wgmma_persistent", "grouped"), ("wgmma_persistent", "hilbert"), ("wgmma_persistent", "dynamic"),
                 ("wgmma_persistent", "split_tail"), ("wgmma_streamk", None)]
# Products whose tiles are cut in K: split tail's last, ragged round (persistent
# splits the 2000 x 4200 x 1024 tiles' in 4 parts on a 132-SM GPU, wgmma_persistent's
# CTA pairs the 1600 x 3000 x 3000 ones in 3), wgmma_persistent's split tail where fewer tiles
# than SMs are all split (128 x 4096 x 4096: 64 tiles 64 wide in 2 parts;
# 256 x 4096 x 14336: 32 pairs of 128-wide tiles in 2; 64 x 4096 x 4096: 32 tiles in 4),
# and stream-K's decode shapes (32 tiles of 32 k-blocks on 132 SMs: every tile in 4 or 5 parts).
CUT_RUNS = [("persistent", "split_tail", (2000, 4200, 1024)), ("wgmma_persistent", "split_tail", (1600, 3000, 3000)),
            ("wgmma_persistent", "split_tail", (128, 4096, 4096)), ("wgmma_persistent", "split_tail", (256, 4096, 14336)),
            ("wgmma_persistent", "split_tail", (64, 4096, 4096)),
            ("wgmma_streamk", None, (16, 4096, 4096)), ("wgmma_streamk", None, (1, 4096, 4096))]


def more_tiles_than_ctas(pm, kernel, m, n):
    """Asserts that the persistent grid cannot hold every tile of m x n: otherwise
    the binding runs the dynamic order as grouped (identical assignment), and a
    test of the counter would test nothing."""
    cfg = pm.tile_config(m, n, kernel=kernel)
    assert cfg["tiles"] > cfg["persistent_ctas"], cfg


def dynamic_order(kernel: str) -> dict:
    """matmul's options for the dynamic order on a persistent rung: for
    wgmma_persistent with single CTAs, since CTA pairs walk a static order."""
    return {"tile_order": "dynamic", "cluster_size": 1 if kernel == "wgmma_persistent" else None}


def skip_unless_runs(pm, kernel):
    info = pm.available_kernels()[kernel]
    if not info.available:
        pytest.skip(f"{kernel}: {info.reason}")


def pairs_built(pm) -> bool:
    """Whether this build has wgmma_persistent's CTA-pair kernels (CUDA 12 builds run
    single CTAs only; test_cta_pairs_only_where_the_build_has_them checks which)."""
    return pm.tile_config(4096, 4096, kernel="wgmma_persistent")["cluster_size"] == 2


NO_PAIRS = "this build has no CTA-pair kernels (CUDA 12)"


def sm_count() -> int:
    return torch.cuda.get_device_properties(0).multi_processor_count


def run_ids(runs) -> list[str]:
    """Test ids of (kernel, order[, shape]) runs: "kernel-order-MxNxK"."""
    return ["-".join("x".join(map(str, x)) if isinstance(x, tuple) else str(x) for x in run if x is not None)
            for run in runs]


# Columns of the timeline's rows (pm.TIMELINE_COLUMNS).
TILE_M, TILE_N, K_BEGIN, K_END, SM, CTA, START, END = range(8)


@pytest.mark.parametrize("kernel, order", TIMELINE_RUNS, ids=run_ids(TIMELINE_RUNS))
@pytest.mark.parametrize("m, n, k", TIMELINE_SHAPES)
def test_timeline_covers_every_tile_once(pm, kernel, order, m, n, k):
    """Every tile's parts cover K once, and the CTAs that ran them are the grid
    tile_config reports (timeline_parts checks the rest)."""
    skip_unless_runs(pm, kernel)
    a, b = random_operands(m, n, k, torch.bfloat16, "cuda")
    out, timeline = pm.matmul_timeline(a, b, kernel=kernel, tile_order=order)
    torch.cuda.synchronize()
    assert matmul_error(out, a, b) < TOLERANCE[torch.bfloat16]
    parts = timeline_parts(pm, kernel, timeline, m, n, k, sm_count())
    cfg = pm.tile_config(m, n, kernel=kernel, k=k)
    ctas = {p[CTA] for p in parts}
    if kernel == "wgmma_streamk":  # every CTA has a stretch of the work
        assert ctas == set(range(cfg["persistent_ctas"])), "grid = the CTAs tile_config reports"
    elif kernel in PERSISTENT_RUNGS:
        # tile_config reports the default launch's grid: the split-tail order's, which
        # for wgmma_persistent may split fewer tiles than SMs in K, a CTA per part.
        if order == "grouped":  # a static order: one CTA per tile at most, none cut in K
            assert len(ctas) == min(cfg["persistent_ctas"], cfg["tiles"]), "grid = the CTAs tile_config reports"
            assert len(parts) == cfg["tiles"], "whole tiles only"
        else:  # Hilbert strides CTAs over a covering square, dynamic CTAs race: a CTA may get no tile
            assert len(ctas) <= cfg["persistent_ctas"]
            assert max(ctas) < cfg["persistent_ctas"], "no CTA beyond the grid tile_config reports"
    else:
        assert ctas == set(range(cfg["tiles"])), f"{kernel} launches one CTA per tile"
        assert len(parts) == cfg["tiles"], "whole tiles only"


@pytest.mark.parametrize("kernel, order, shape", CUT_RUNS, ids=run_ids(CUT_RUNS))
def test_timeline_records_the_parts_of_cut_tiles(pm, variant_dir, kernel, order, shape):
    """Where split tail or stream-K cuts tiles in K, the instrumented build runs that
    cut and records each part once: the tiles' K-ranges cover K once, parts of one
    tile run on several SMs, and the product is still right."""
    skip_unless_runs(pm, kernel)
    m, n, k = shape
    if kernel == "wgmma_persistent" and m <= 256 and built_with_cuda12(variant_dir):
        pytest.skip(NO_UNDERFILLED_SPLIT)
    b_kmajor = kernel == "wgmma_streamk"  # its weights' layout: B = W.t() for W of N x K
    a, b = random_operands(m, n, k, torch.bfloat16, "cuda", b_transposed=b_kmajor)
    out, timeline = pm.matmul_timeline(a, b, kernel=kernel, tile_order=order)
    torch.cuda.synchronize()
    assert matmul_error(out, a, b) < TOLERANCE[torch.bfloat16]
    parts = timeline_parts(pm, kernel, timeline, m, n, k, sm_count())
    per_tile: dict[tuple[int, int], list[list[int]]] = {}
    for p in parts:
        per_tile.setdefault((p[TILE_M], p[TILE_N]), []).append(p)
    cut = [t for t, ps in per_tile.items() if len(ps) > 1]
    assert cut, "no tile was cut in K"
    assert any(len({p[CTA] for p in per_tile[t]}) > 1 for t in cut), "no cut tile's parts ran on several CTAs"
    if m <= 256:
        # Fewer tiles than SMs: every tile is cut, its parts on CTAs (one an SM) of their own
        # (stream-K: those whose stretches share it), as many CTAs as tile_config reports.
        assert len(cut) == len(per_tile), "every tile is cut here"
        assert all(len({p[SM] for p in per_tile[t]}) == len(per_tile[t]) for t in cut), "two parts on one SM"
        cfg = pm.tile_config(m, n, kernel=kernel, k=k)
        assert len({p[CTA] for p in parts}) == cfg["persistent_ctas"] > cfg["tiles"], cfg


def grouped_tile(t: int, tiles_m: int, tiles_n: int) -> tuple[int, int]:
    """Tile t of the grouped order (tile_scheduler.cuh): groups of 8 rows of tiles, walked column by column."""
    per_group = 8 * tiles_n
    first_m = t // per_group * 8
    rows = min(8, tiles_m - first_m)
    return first_m + t % per_group % rows, t % per_group // rows


@pytest.mark.parametrize("kernel", PERSISTENT_RUNGS)
@pytest.mark.parametrize("m, n", [(4097, 4097), (16384, 512), (8192, 8192)])
def test_grouped_order_gives_each_cta_its_strided_tiles(pm, kernel, m, n):
    """In the static grouped order, CTA c computes tiles c, c + grid, c + 2 grid, ... of
    the grouped order, in that order (wgmma_persistent's CTA pairs: pair c // 2 + j grid / 2
    of the order over pairs of tile rows, the pair's row 2 i + c % 2). The kernels walk it
    without dividing per step; this pins the walk to the order's definition, including the
    last, shorter group of rows and strides longer than a group."""
    skip_unless_runs(pm, kernel)
    a, b = random_operands(m, n, 64, torch.bfloat16, "cuda")
    out, timeline = pm.matmul_timeline(a, b, kernel=kernel, tile_order="grouped")
    torch.cuda.synchronize()
    assert matmul_error(out, a, b) < TOLERANCE[torch.bfloat16]
    cfg = pm.tile_config(m, n, kernel=kernel)
    tiles_m, tiles_n = -(-m // cfg["block_m"]), -(-n // cfg["block_n"])
    grid = cfg["persistent_ctas"]
    assert cfg["tiles"] > grid, cfg  # several tiles a CTA, or the walk is not tested
    rows = torch.tensor(timeline_parts(pm, kernel, timeline, m, n, 64, sm_count()))
    pairs = kernel == "wgmma_persistent" and cfg["cluster_size"] == 2
    for c in range(grid):
        if pairs:
            pair_rows = -(-tiles_m // 2)
            stream = [grouped_tile(i, pair_rows, tiles_n) for i in range(c // 2, pair_rows * tiles_n, grid // 2)]
            expected = [(2 * i + c % 2, j) for i, j in stream if 2 * i + c % 2 < tiles_m]
        else:
            expected = [grouped_tile(i, tiles_m, tiles_n) for i in range(c, tiles_m * tiles_n, grid)]
        mine = rows[rows[:, CTA] == c]
        mine = mine[mine[:, START].argsort()]
        assert [tuple(t) for t in mine[:, :2].tolist()] == expected, f"CTA {c} of {grid}"


@pytest.mark.parametrize("kernel", PERSISTENT_RUNGS)
def test_dynamic_order_starts_afresh_every_call(pm, kernel):
    """The dynamic order's tile counter is new for each launch: back-to-back calls, on
    the default and on a side stream, all compute every tile (bit-exact, no poison left)."""
    skip_unless_runs(pm, kernel)
    m, n = 2000, 4200
    more_tiles_than_ctas(pm, kernel, m, n)
    a, b = exact_int_operands(m, n, 320, torch.bfloat16, "cuda")
    outs = [poison(torch.empty(m, n, dtype=torch.bfloat16, device="cuda")) for _ in range(4)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())  # the operands and poison are written
    for i, out in enumerate(outs):
        with torch.cuda.stream(side if i % 2 else torch.cuda.current_stream()):
            pm.matmul(a, b, kernel=kernel, out=out, **dynamic_order(kernel))
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    for i, out in enumerate(outs):
        assert check_exact(out, a, b) == 0, f"call {i}: wrong or missing tiles"


@pytest.mark.parametrize("kernel", PERSISTENT_RUNGS)
def test_dynamic_order_in_a_cuda_graph(pm, kernel):
    """Captured into a CUDA graph, the dynamic order gets a counter of the graph's own,
    zeroed on every replay: replays with new inputs, interleaved with eager calls on
    the same stream, all compute every tile."""
    skip_unless_runs(pm, kernel)
    m, n, k = 1800, 3000, 192
    more_tiles_than_ctas(pm, kernel, m, n)
    check_graph_replays(lambda a, b, out: pm.matmul(a, b, kernel=kernel, out=out, **dynamic_order(kernel)),
                        m, n, k, "wrong or missing tiles")


def test_dynamic_order_rejects_clusters(pm):
    skip_unless_runs(pm, "wgmma_persistent")
    a, b = random_operands(256, 256, 64, torch.bfloat16, "cuda")
    with pytest.raises(ValueError, match="dynamic tile order runs without clusters"):
        pm.matmul(a, b, kernel="wgmma_persistent", tile_order="dynamic", cluster_size=2)
    with pytest.raises(RuntimeError, match="dynamic tile order runs without clusters"):  # the op's own check
        pm._matmul.ops.matmul_out(a, b, None, torch.empty(256, 256, dtype=a.dtype, device="cuda"),
                                  "wgmma_persistent", int(pm.TileOrder.DYNAMIC), 2, None)


@pytest.mark.parametrize("kernel", ["wgmma", "wgmma_persistent"])
def test_hopper_output_that_tma_cannot_store(pm, kernel):
    """Outputs whose rows TMA cannot store whole (odd width, odd leading dimension,
    unaligned start) are stored from registers: every element exact, nothing outside
    out written, for problems small and large enough to fill the GPU."""
    skip_unless_runs(pm, kernel)
    for m, n in [(2049, 2049), (2048, 2052), (65, 129)]:
        a, b = exact_int_operands(m, n, 96, torch.bfloat16, "cuda")
        buffer = poison(torch.empty(m + 1, n + 3, dtype=torch.bfloat16, device="cuda"))
        out = buffer[1:, 1:n + 1]  # rows n + 3 apart, 2 bytes off alignment
        pm.matmul(a, b, kernel=kernel, out=out)
        torch.cuda.synchronize()
        assert check_exact(out, a, b) == 0, f"{kernel} {m}x{n}: wrong values"
        written = torch.zeros(buffer.shape, dtype=torch.bool, device="cuda")
        written[1:, 1:n + 1] = True
        assert torch.isnan(buffer[~written]).all(), f"{kernel} {m}x{n}: wrote outside out"


HOPPER_EDGE_SHAPES = [(2049, 2056), (2100, 2152), (2049, 2049), (2200, 2300), (65, 129), (100, 200)]


@pytest.mark.parametrize("kernel", ["wgmma", "wgmma_persistent"])
@pytest.mark.parametrize("b_layout", ["n-major", "k-major"])
def test_hopper_edge_tiles(pm, kernel, b_layout):
    """Edge tiles run narrower wgmmas (64 or 128 columns) or none (a consumer whose
    rows lie below the output): wide and narrow tiles, TMA-stored and register-stored
    outputs (N % 8), K with and without a tail; every element exact, none outside out."""
    skip_unless_runs(pm, kernel)
    for m, n in HOPPER_EDGE_SHAPES:
        for k in (64, 200):
            a, b = exact_int_operands(m, n, k, torch.bfloat16, "cuda")
            if b_layout == "k-major":
                b = b.t().contiguous().t()
            buffer = poison(torch.empty(m, n + 8, dtype=torch.bfloat16, device="cuda"))
            out = buffer[:, :n]
            pm.matmul(a, b, kernel=kernel, out=out)
            torch.cuda.synchronize()
            assert check_exact(out, a, b) == 0, f"{kernel} {m}x{n}x{k}: wrong values"
            assert torch.isnan(buffer[:, n:]).all(), f"{kernel} {m}x{n}x{k}: wrote outside out"


@pytest.mark.parametrize("kernel", ["wgmma", "wgmma_persistent"])
def test_hopper_staged_store_with_bias(pm, kernel):
    """Outputs TMA cannot store go out through shared memory a row at a time: with a
    bias, rows that start at odd and even element offsets, exact."""
    skip_unless_runs(pm, kernel)
    for m, n, k in [(300, 2049, 200), (4097, 1031, 72)]:
        a, b = exact_int_operands(m, n, k, torch.bfloat16, "cuda", headroom=1)
        bias = exact_int_bias(n, torch.bfloat16, "cuda")
        out = poison(torch.empty(m, n, dtype=torch.bfloat16, device="cuda"))
        pm.matmul(a, b, kernel=kernel, out=out, bias=bias)
        torch.cuda.synchronize()
        assert check_exact(out, a, b, bias) == 0, f"{kernel} {m}x{n}x{k}: wrong values"


# 128 x 256 tiles, more than CTAs (and more than two rounds of 192 x 192 ones).
# N: the last tile column 3 boxes of 64 wide (the third clipped), or 1 (only
# the box stored at a tile's end). K: 1 k-block
# (fewer than the boxes that wait: they go out at the next tile's start), 3
# (one box after each), 9.
DEFERRED_STORE_SHAPES = [(2176, 4232, 64), (2176, 4232, 192), (2048, 4160, 520), (4096, 4232, 520)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m, n, k", DEFERRED_STORE_SHAPES)
def test_wgmma_persistent_stores_a_tile_during_the_next(pm, m, n, k, dtype):
    """A consumer rounds a tile's results into registers and stores most of them
    while it computes its next tile (csrc/wgmma_tile.cuh, PendingStore): with and
    without bias, ragged last tile columns, few and many k-blocks; every element
    exact, nothing written outside out."""
    skip_unless_runs(pm, "wgmma_persistent")
    cfg = pm.tile_config(m, n, kernel="wgmma_persistent")
    assert cfg["block_n"] == 256 and cfg["tiles"] > cfg["persistent_ctas"], cfg
    for with_bias in (False, True):
        a, b = exact_int_operands(m, n, k, dtype, "cuda", headroom=1 if with_bias else 0)
        bias = exact_int_bias(n, dtype, "cuda") if with_bias else None
        buffer = poison(torch.empty(m, n + 8, dtype=dtype, device="cuda"))
        out = buffer[:, :n]
        pm.matmul(a, b, kernel="wgmma_persistent", out=out, bias=bias)
        torch.cuda.synchronize()
        assert check_exact(out, a, b, bias) == 0, f"{m}x{n}x{k} bias={with_bias}: wrong values"
        assert torch.isnan(buffer[:, n:]).all(), f"{m}x{n}x{k}: wrote outside out"


def assert_exact_in_both_dtypes(pm, kernel, m, n, k, b_kmajor, options):
    """m x n x k in bf16 and fp16 with a bias: every element exact, nothing written
    past out's columns (out is a view inside a wider poisoned buffer)."""
    for dtype in (torch.bfloat16, torch.float16):
        a, b = exact_int_operands(m, n, k, dtype, "cuda", b_transposed=b_kmajor, headroom=1)
        bias = exact_int_bias(n, dtype, "cuda")
        buffer = poison(torch.empty(m, n + 8, dtype=dtype, device="cuda"))
        out = buffer[:, :n]
        pm.matmul(a, b, kernel=kernel, out=out, bias=bias, **options)
        torch.cuda.synchronize()
        assert check_exact(out, a, b, bias) == 0, f"{kernel} {m}x{n}x{k} {dtype}: wrong values"
        assert torch.isnan(buffer[:, n:]).all(), f"{kernel} {m}x{n}x{k}: wrote outside out"


def medium_tile_shapes() -> list[tuple[int, int, int]]:
    """Products that run 128 x 192 tiles on this GPU (hopper::tile_shape: one or two
    whole rounds of them, which 128 x 256 tiles do not make): 4 rows of tiles by
    SMs // 4 columns, the last column 192, 136 (a 192-wide wgmma, clipped) or 64
    (a 64-wide one) of the output's columns wide; two such rounds of tiles at one
    k-block (every CTA stores two tiles back to back) and at a ragged K."""
    cols = sm_count() // 4
    return [(512, 192 * cols, 4096), (512, 192 * (cols - 1) + 136, 1000), (500, 192 * (cols - 1) + 64, 130),
            (1024, 192 * cols, 64), (1000, 192 * cols, 700)]


@pytest.mark.parametrize("kernel", ["wgmma", "wgmma_persistent"])
@pytest.mark.parametrize("cluster_size", [None, 1], ids=["default", "single-ctas"])
@pytest.mark.parametrize("b_kmajor", [False, True], ids=["b-n-major", "b-k-major"])
def test_medium_tiles_where_they_make_whole_rounds(pm, variant_dir, kernel, cluster_size, b_kmajor):
    """Where 128 x 192 tiles fill the SMs in one or two rounds and 128 x 256 ones do
    not, the Hopper rungs run them (CUDA 13 builds): bit-exact in both dtypes and B
    layouts, with a bias, nothing written outside out, edge columns included."""
    skip_unless_runs(pm, kernel)
    if kernel == "wgmma" and cluster_size == 1:
        pytest.skip("wgmma has no clusters")
    options = {"cluster_size": cluster_size} if kernel == "wgmma_persistent" else {}
    for m, n, k in medium_tile_shapes():
        cfg = pm.tile_config(m, n, kernel="wgmma_persistent", k=k)
        assert (cfg["block_n"] == 192) != built_with_cuda12(variant_dir), (m, n, k, cfg)  # CUDA 12: 256 or 128
        assert_exact_in_both_dtypes(pm, kernel, m, n, k, b_kmajor, options)


def square_tile_shapes() -> list[tuple[int, int, int]]:
    """Products that run 192 x 192 tiles on this GPU (hopper::tile_shape: one or two
    whole rounds of them in an even number of tile rows, four or more, where
    neither 128 x 256 nor 128 x 192 tiles make whole rounds): 4 rows of tiles by
    SMs // 4 columns at one k-block and a long K; 6 rows (the last 40 or 140 rows
    of the output, so two or one of its consumers compute nothing) by SMs // 6
    columns, the last 136 (one 128-wide wgmma, clipped) or 64 columns wide, at a
    ragged K; and 3000^3, two rounds with a K tail."""
    cols4, cols6 = sm_count() // 4, sm_count() // 6
    return [(768, 192 * cols4, 64), (768, 192 * cols4, 4096), (1000, 192 * (cols6 - 1) + 136, 1000),
            (1100, 192 * (cols6 - 1) + 64, 130), (3000, 3000, 3000)]


@pytest.mark.parametrize("kernel", ["wgmma", "wgmma_persistent"])
@pytest.mark.parametrize("cluster_size", [None, 1], ids=["default", "single-ctas"])
@pytest.mark.parametrize("b_kmajor", [False, True], ids=["b-n-major", "b-k-major"])
def test_square_tiles_where_they_make_whole_rounds(pm, variant_dir, kernel, cluster_size, b_kmajor):
    """Where 192 x 192 tiles fill the SMs in one or two rounds and the 128-row ones
    do not, the Hopper rungs run them (CUDA 13 builds): three consumer warpgroups a
    CTA, bit-exact in both dtypes and B layouts, with a bias, nothing written
    outside out, edge rows and columns included. In an odd number of tile rows
    they do not run (2048 x 4232: 11 rows, 253 tiles)."""
    skip_unless_runs(pm, kernel)
    if kernel == "wgmma" and cluster_size == 1:
        pytest.skip("wgmma has no clusters")
    options = {"cluster_size": cluster_size} if kernel == "wgmma_persistent" else {}
    assert pm.tile_config(2048, 4232, kernel="wgmma_persistent", k=4096)["block_m"] == 128
    for m, n, k in square_tile_shapes():
        cfg = pm.tile_config(m, n, kernel="wgmma_persistent", k=k)
        square = (cfg["block_m"], cfg["block_n"]) == (192, 192)
        assert square != built_with_cuda12(variant_dir), (m, n, k, cfg)  # CUDA 12: 128-row tiles
        assert_exact_in_both_dtypes(pm, kernel, m, n, k, b_kmajor, options)


def test_wide_tiles_from_seven_eighths_of_the_sms(pm, variant_dir):
    """128 x 256 tiles from 7/8 of the SMs on (one round of them in place of two of
    128 x 128), 128 x 128 below, and the product right at both."""
    skip_unless_runs(pm, "wgmma_persistent")
    sms = sm_count()
    rows = 8
    just_enough = -(-7 * sms // 8)  # the fewest 128 x 256 tiles that take 7/8 of the SMs
    for cols, width in ((-(-just_enough // rows), 256), ((just_enough - 1) // rows, 128)):
        m, n, k = 128 * rows, 256 * cols, 512
        cfg = pm.tile_config(m, n, kernel="wgmma_persistent", k=k)
        medium = rows * -(-n // 192)
        if not built_with_cuda12(variant_dir) and medium <= 2 * sms and 8 * (medium % sms) >= 7 * sms:
            continue  # 192-wide tiles take it (test_medium_tiles_where_they_make_whole_rounds)
        assert cfg["block_n"] == width, (m, n, k, cfg)
        a, b = exact_int_operands(m, n, k, torch.bfloat16, "cuda", b_transposed=True)
        out = poison(torch.empty(m, n, dtype=torch.bfloat16, device="cuda"))
        pm.matmul(a, b, kernel="wgmma_persistent", out=out)
        torch.cuda.synchronize()
        assert check_exact(out, a, b) == 0, f"{m}x{n}x{k}: wrong values"


@pytest.mark.parametrize("cluster_size", [None, 1], ids=["pairs", "single-ctas"])
@pytest.mark.parametrize("m, k", [(4096, 2048), (3000, 3000), (1600, 3000), (1000, 520)])
def test_wgmma_persistent_chained_calls_wait_for_each_other(pm, cluster_size, m, k):
    """A launch of wgmma_persistent may start while the kernel before it in the
    stream still runs (a programmatic dependent launch, csrc/wgmma_persistent.cu)
    and must touch global memory only once that kernel is done. A chain queued
    back to back on one stream, each product reading the previous one's output
    (read after write) and overwriting the buffer the previous one read (write
    after read), checked exactly at the end: x @ w1 @ w2 @ ... with signed
    permutations w (4096 x 2048 x 2048: 128 x 256 tiles, two a CTA; 3000^3:
    192 x 192 tiles, two a CTA; 1600 x 3000 x 3000: a split last round;
    1000 x 520 x 520: 128 x 128 tiles, one a CTA)."""
    skip_unless_runs(pm, "wgmma_persistent")
    x = torch.randint(-8, 9, (m, k), device="cuda").to(torch.bfloat16)
    buffers = [x.clone(), poison(torch.empty(m, k, dtype=torch.bfloat16, device="cuda"))]
    ws = [signed_permutation(k) for _ in range(6)]
    for i, w in enumerate(ws):
        pm.matmul(buffers[i % 2], w.to(torch.bfloat16), kernel="wgmma_persistent", out=buffers[(i + 1) % 2],
                  cluster_size=cluster_size)
    expected = x.double()
    for w in ws:
        expected = expected @ w.double()
    torch.cuda.synchronize()
    got = buffers[len(ws) % 2].double()
    assert int((got != expected).sum()) == 0, "a call read or overwrote memory before the call before it was done"


def test_persistent_grid_fills_the_device_once(pm):
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cfg = pm.tile_config(8192, 8192, kernel="persistent")
    assert cfg["tiles"] > sms
    assert sms <= cfg["persistent_ctas"] <= 4 * sms
    assert cfg["persistent_ctas"] % sms == 0


@pytest.mark.parametrize("order", ["grouped", "hilbert", "dynamic", "split_tail"])
@pytest.mark.parametrize("m, n, k", [(16, 4096, 512), (1000, 1000, 300)])
def test_persistent_grid_that_holds_every_tile_runs_one_tile_per_cta(pm, order, m, n, k):
    """Where the persistent grid would hold every tile, every order gives each CTA
    one tile, so the launch runs tiled's schedule (csrc/persistent.cu): as many
    CTAs as tiles, one tile each -- also in the Hilbert order, whose stride over a
    covering square would leave some CTAs without a tile."""
    cfg = pm.tile_config(m, n, kernel="persistent")
    assert cfg["tiles"] <= cfg["persistent_ctas"], cfg
    a, b = exact_int_operands(m, n, k, torch.bfloat16, "cuda")
    out, timeline = pm.matmul_timeline(a, b, kernel="persistent", tile_order=order)
    torch.cuda.synchronize()
    assert check_exact(out, a, b) == 0
    parts = timeline_parts(pm, "persistent", timeline, m, n, k, sm_count())
    assert sorted(p[CTA] for p in parts) == list(range(cfg["tiles"])), "one CTA per tile"


def test_wgmma_persistent_grid_is_one_cta_per_sm(pm):
    """Its shared memory fits one CTA on an SM: the grid is the SM count."""
    skip_unless_runs(pm, "wgmma_persistent")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cfg = pm.tile_config(8192, 8192, kernel="wgmma_persistent")
    assert cfg["tiles"] > sms
    assert cfg["persistent_ctas"] == sms


@pytest.mark.parametrize("m, n", [(129, 300), (1000, 4104), (4096, 4096)])
def test_wgmma_persistent_runs_pairs_by_default(pm, m, n):
    """With more than one row of tiles the default launch runs CTA pairs: the
    timeline shows tiles (2i, j) and (2i + 1, j) on CTAs 2c and 2c + 1 of one
    cluster, which single CTAs in the dynamic order would not keep to."""
    skip_unless_runs(pm, "wgmma_persistent")
    if not pairs_built(pm):
        pytest.skip(NO_PAIRS)
    a, b = random_operands(m, n, 256, torch.bfloat16, "cuda")
    out, timeline = pm.matmul_timeline(a, b, kernel="wgmma_persistent")
    torch.cuda.synchronize()
    assert matmul_error(out, a, b) < TOLERANCE[torch.bfloat16]
    parts = timeline_parts(pm, "wgmma_persistent", timeline, m, n, 256, sm_count())
    cta = {(p[TILE_M], p[TILE_N]): p[CTA] for p in parts}
    assert len(cta) == len(parts), "whole tiles only (K = 256 is too short to split)"
    for (tile_m, tile_n), c in cta.items():
        assert c % 2 == tile_m % 2, f"tile ({tile_m}, {tile_n}) on CTA {c}"
        partner = (tile_m ^ 1, tile_n)
        if partner in cta:
            assert cta[partner] == c ^ 1, f"tiles ({tile_m}, {tile_n}) and {partner} not in one cluster"


def test_wgmma_persistent_rejects_a_bad_cluster_size(pm):
    skip_unless_runs(pm, "wgmma_persistent")
    a, b = random_operands(256, 256, 64, torch.bfloat16, "cuda")
    with pytest.raises(ValueError, match=r"cluster_size must be None \(the kernel picks\), 1 or 2, got 3"):
        pm.matmul(a, b, kernel="wgmma_persistent", cluster_size=3)
    with pytest.raises(RuntimeError, match="cluster_size must be 0"):  # the op's own check
        pm._matmul.ops.matmul_out(a, b, None, torch.empty(256, 256, dtype=a.dtype, device="cuda"),
                                  "wgmma_persistent", -1, 3, None)


@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (129, 300, 70), (384, 512, 200), (1000, 4104, 333)])
def test_wgmma_persistent_in_clusters_of_two(pm, m, n, k):
    """CTA pairs (multicasting B) forced, where the build has them, and single CTAs
    forced, odd and even tile rows."""
    skip_unless_runs(pm, "wgmma_persistent")
    for b_kmajor in (False, True):
        a, b = random_operands(m, n, k, torch.bfloat16, "cuda", b_transposed=b_kmajor)
        for cluster_size in (2, 1) if pairs_built(pm) else (1,):
            out = poison(torch.empty(m, n, device="cuda", dtype=torch.bfloat16))
            pm.matmul(a, b, kernel="wgmma_persistent", out=out, cluster_size=cluster_size)
            torch.cuda.synchronize()
            assert nan_count(out) == 0
            assert matmul_error(out, a, b) < TOLERANCE[torch.bfloat16]


CHUNKED_RUNGS = [("tiled", torch.bfloat16), ("tiled", torch.float16), ("persistent", torch.bfloat16),
                 ("persistent", torch.float16), ("warptiled", torch.float32),
                 ("wgmma", torch.bfloat16), ("wgmma", torch.float16),
                 ("wgmma_persistent", torch.bfloat16), ("wgmma_persistent", torch.float16)]


@pytest.mark.parametrize("kernel, dtype", CHUNKED_RUNGS, ids=[f"{k}-{str(d)[6:]}" for k, d in CHUNKED_RUNGS])
@pytest.mark.parametrize("layout", ["row-major", "linear-weight", "transposed-a", "ld4097", "offset"])
def test_layouts_that_need_a_copy_or_not(pm, kernel, dtype, layout):
    """Every layout users pass to the rungs that load 16-byte chunks, with tails in M, N and K."""
    skip_unless_runs(pm, kernel)
    m, n, k = 300, 260, 4097
    gen_a = torch.randn(m + 1, k + 7, device="cuda", dtype=dtype)
    gen_b = torch.randn(k + 1, n + 7, device="cuda", dtype=dtype)
    if layout == "row-major":
        a, b = gen_a[:m, :k].contiguous(), gen_b[:k, :n].contiguous()
    elif layout == "linear-weight":
        a, b = gen_a[:m, :k].contiguous(), gen_b[:k, :n].t().contiguous().t()
    elif layout == "transposed-a":
        a, b = gen_a[:m, :k].t().contiguous().t(), gen_b[:k, :n].contiguous()
    elif layout == "ld4097":
        a, b = torch.randn(m, 4097, device="cuda", dtype=dtype), torch.randn(4097, n, device="cuda", dtype=dtype)
    else:
        a, b = gen_a[1:, 1:k + 1], gen_b[1:, 1:n + 1]
    out = poison(torch.empty(m, n, device="cuda", dtype=dtype))
    pm.matmul(a, b, kernel=kernel, out=out)
    torch.cuda.synchronize()
    assert nan_count(out) == 0
    assert matmul_error(out, a, b) < TOLERANCE[dtype]


@pytest.mark.parametrize("kernel, dtype", CHUNKED_RUNGS[::2], ids=[f"{k}-{str(d)[6:]}" for k, d in CHUNKED_RUNGS[::2]])
@pytest.mark.parametrize("m, n, k", [(16, 4096, 4096), (128, 4096, 512), (129, 8, 8200), (2048, 2048, 31),
                                     (1536, 2816, 72), (1408, 2816, 72)])
def test_tile_size_boundaries(pm, kernel, dtype, m, n, k):
    """Shapes around the large/small tile switch and with K tails inside a 16-byte chunk."""
    skip_unless_runs(pm, kernel)
    a, b = random_operands(m, n, k, dtype, "cuda")
    out = poison(torch.empty(m, n, device="cuda", dtype=dtype))
    pm.matmul(a, b, kernel=kernel, out=out)
    torch.cuda.synchronize()
    assert nan_count(out) == 0
    assert matmul_error(out, a, b) < TOLERANCE[dtype]


@pytest.mark.parametrize("kernel", TENSOR_CORE_RUNGS)
def test_overlapping_rows_are_copied(pm, kernel):
    """expand() gives a leading stride of 0: rows overlap, which TMA cannot describe."""
    skip_unless_runs(pm, kernel)
    row = torch.randn(1, 72, device="cuda", dtype=torch.bfloat16)
    a = row.expand(200, 72)
    b = torch.randn(72, 136, device="cuda", dtype=torch.bfloat16)
    out = pm.matmul(a, b, kernel=kernel)
    torch.cuda.synchronize()
    assert matmul_error(out, a, b) < TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize("kernel", ["tiled", "persistent", "wgmma", "wgmma_persistent", "wgmma_streamk"])
def test_op_checks_the_timeline_size(pm, kernel):
    """The op refuses a timeline of another shape, naming the one it takes: a row per
    tile and per CTA a launch may run, the 8 columns of TIMELINE_COLUMNS. The rows
    of the old whole-tile layout ([tiles, 6]) are refused too."""
    skip_unless_runs(pm, kernel)
    a = torch.randn(304, 64, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(304, 64, device="cuda", dtype=torch.bfloat16).t()
    out = torch.empty(304, 304, device="cuda", dtype=torch.bfloat16)
    cfg = pm.tile_config(304, 304, kernel=kernel, k=64)
    rows, tiles = cfg["timeline_rows"], cfg["tiles"]
    expected = (rf"timeline must be a contiguous int64 tensor of shape \[{rows}, 8\]: a row per tile \({tiles}\) "
                rf"and per CTA the launch may run \({rows - tiles}\)")
    for wrong in (torch.zeros(rows + 1, 8, device="cuda", dtype=torch.int64),
                  torch.zeros(tiles, 6, device="cuda", dtype=torch.int64),
                  torch.zeros(rows, 8, device="cuda", dtype=torch.int32),
                  torch.zeros(8, rows, device="cuda", dtype=torch.int64).t()):
        with pytest.raises(RuntimeError, match=expected):
            pm._matmul.ops.matmul_out(a, b, None, out, kernel, 0, 0, wrong)
    right = torch.full((rows, 8), -1, device="cuda", dtype=torch.int64)
    pm._matmul.ops.matmul_out(a, b, None, out, kernel, 0, 0, right)
    torch.cuda.synchronize()
    assert matmul_error(out, a, b) < TOLERANCE[torch.bfloat16]
    timeline_parts(pm, kernel, right, 304, 304, 64, sm_count())


def test_tensor_core_rung_rejects_float32(pm):
    a = torch.randn(8, 8, device="cuda")
    with pytest.raises(TypeError, match="does not take torch.float32"):
        pm.matmul(a, a, kernel="tiled")
    with pytest.raises(TypeError, match="does not take torch.bfloat16"):
        pm.matmul(a.bfloat16(), a.bfloat16(), kernel="warptiled")


def test_timeline_needs_a_tensor_core_rung(pm):
    a = torch.randn(8, 8, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="no instrumented build"):
        pm.matmul_timeline(a, a, kernel="naive")


def test_timeline_of_a_named_cluster_size(pm, variant_dir):
    """matmul_timeline runs the launch of the cluster size it is given, and tile_config
    reports that launch: wgmma_streamk's stream-K cut over 128-row tiles on every SM
    (cluster_size=1) where its default cut runs clusters, and wgmma_persistent in single
    CTAs where it picks pairs."""
    skip_unless_runs(pm, "wgmma_streamk")
    sms = sm_count()
    m, n, k = 64, 4096, 4096
    a, b = random_operands(m, n, k, torch.bfloat16, "cuda", b_transposed=True)
    plain = pm.tile_config(m, n, kernel="wgmma_streamk", k=k, cluster_size=1)
    assert (plain["block_n"], plain["cluster_size"], plain["tiles"]) == (128, 1, n // 128), plain
    assert plain["persistent_ctas"] == min(sms, plain["tiles"] * k // 128), plain
    if not built_with_cuda12(variant_dir):
        assert pm.tile_config(m, n, kernel="wgmma_streamk", k=k)["cluster_size"] > 1
    out, timeline = pm.matmul_timeline(a, b, kernel="wgmma_streamk", cluster_size=1)
    torch.cuda.synchronize()
    assert matmul_error(out, a, b) < TOLERANCE[torch.bfloat16]
    parts = timeline_parts(pm, "wgmma_streamk", timeline, m, n, k, sms, cluster_size=1)
    assert {p[CTA] for p in parts} == set(range(plain["persistent_ctas"])), "grid = the CTAs tile_config reports"

    m = n = 2048
    a, b = random_operands(m, n, 1024, torch.bfloat16, "cuda")
    single = pm.tile_config(m, n, kernel="wgmma_persistent", k=1024, cluster_size=1)
    assert single["cluster_size"] == 1, single
    out, timeline = pm.matmul_timeline(a, b, kernel="wgmma_persistent", tile_order="grouped", cluster_size=1)
    torch.cuda.synchronize()
    assert matmul_error(out, a, b) < TOLERANCE[torch.bfloat16]
    parts = timeline_parts(pm, "wgmma_persistent", timeline, m, n, 1024, sms, cluster_size=1)
    assert len(parts) == single["tiles"], "whole tiles only"
    assert len({p[CTA] for p in parts}) == min(single["persistent_ctas"], single["tiles"])


def test_cta_pairs_only_where_the_build_has_them(pm, variant_dir):
    """tile_config gives the cluster size wgmma_persistent picks: pairs over more than
    one row of tiles in CUDA 13 builds, single CTAs in CUDA 12 builds, whose pair
    kernels fault (csrc/wgmma_persistent.cu). There cluster_size=2 is refused by name;
    a shape where pairs would each run several tiles comes out right either way."""
    skip_unless_runs(pm, "wgmma_persistent")
    cuda12 = built_with_cuda12(variant_dir)
    assert pm.tile_config(4096, 4096, kernel="wgmma_persistent")["cluster_size"] == (1 if cuda12 else 2)
    assert pm.tile_config(128, 4096, kernel="wgmma_persistent")["cluster_size"] == 1
    assert pm.tile_config(4096, 4096, kernel="wgmma")["cluster_size"] == 1
    a, b = random_operands(4096, 4096, 1024, torch.bfloat16, "cuda")
    for options in ({}, {"cluster_size": 1}, {"cluster_size": 2}):
        if cuda12 and options.get("cluster_size") == 2:
            with pytest.raises(RuntimeError, match=r"cluster_size=2: this build \(CUDA 12\) has no CTA-pair kernels"):
                pm.matmul(a, b, kernel="wgmma_persistent", **options)
            continue
        out = poison(torch.empty(4096, 4096, dtype=torch.bfloat16, device="cuda"))
        pm.matmul(a, b, kernel="wgmma_persistent", out=out, **options)
        assert matmul_error(out, a, b) < TOLERANCE[torch.bfloat16] and nan_count(out) == 0, options
