"""GPU tests of the persistent rungs' split-tail order: the tiles of the last,
ragged round split in K into parts that run at once, partial sums handed from
part to part through a workspace kept per stream (csrc/tile_scheduler.cuh).

Bit-exact small-integer products catch a lost, doubled or stale partial sum:
each call gets fresh operands and a poisoned output. Run with
``python -m pytest -m gpu tests`` on a machine with a CUDA GPU.
"""

from __future__ import annotations

import pytest
import torch

from matmul_checks import (NO_UNDERFILLED_SPLIT, TOLERANCE, built_with_cuda12, check_exact, check_graph_replays,
                           exact_int_bias, exact_int_operands, matmul_error, poison, random_operands, timeline_parts)

pytestmark = pytest.mark.gpu

# (kernel, cluster_size): wgmma_persistent in CTA pairs (its default) and single.
SPLIT_RUNS = [("persistent", None), ("wgmma_persistent", None), ("wgmma_persistent", 1)]
RUN_IDS = ["persistent", "wgmma_persistent", "wgmma_persistent-cluster1"]

# Shapes whose tiles do not make whole waves on a 132-SM H200: the last round
# splits into 2 (1700 x 3000 x 520, also in pairs), 4 (2000 x 4200 x 1024), 5
# (1600 x 3000 x 3000, K tail) and 8 parts (2000 x 4200 x 4096, the most).
# (3000^3 runs 192 x 192 tiles in two whole rounds: nothing to split.)
SPLIT_SHAPES = [(1700, 3000, 520), (2000, 4200, 1024), (1600, 3000, 3000), (2000, 4200, 4096)]


def skip_unless_runs(pm, kernel):
    info = pm.available_kernels()[kernel]
    if not info.available:
        pytest.skip(f"{kernel}: {info.reason}")


def split_parts(tiles: int, ctas: int, k: int) -> int:
    """Parts per split tile, as tc::SplitTail computes them (64-deep k-blocks,
    at least 4 a part, at most 8 parts)."""
    rest = tiles % ctas  # the last round's tiles: all of them where tiles < ctas
    parts = 1 if rest == 0 else min(ctas // rest, -(-k // 64) // 4, 8)
    return parts if parts >= 2 else 1


def assert_tiles_are_split(pm, kernel, cluster_size, m, n, k):
    """The shape's last round is split (single CTAs; pairs split their own
    rounds of tile pairs): otherwise a test here would test nothing."""
    if cluster_size is None and kernel == "wgmma_persistent":
        return
    cfg = pm.tile_config(m, n, kernel=kernel)
    assert split_parts(cfg["tiles"], cfg["persistent_ctas"], k) > 1, cfg


def split_tail(pm, a, b, bias, out, kernel, cluster_size):
    return pm.matmul(a, b, kernel=kernel, out=out, bias=bias, tile_order="split_tail", cluster_size=cluster_size)


@pytest.mark.parametrize("kernel, cluster_size", SPLIT_RUNS, ids=RUN_IDS)
@pytest.mark.parametrize("m, n, k", SPLIT_SHAPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_split_tail_is_exact(pm, kernel, cluster_size, m, n, k, dtype):
    skip_unless_runs(pm, kernel)
    assert_tiles_are_split(pm, kernel, cluster_size, m, n, k)
    a, b = exact_int_operands(m, n, k, dtype, "cuda", headroom=1)
    bias = exact_int_bias(n, dtype, "cuda")
    out = poison(torch.empty(m, n, dtype=dtype, device="cuda"))
    split_tail(pm, a, b, bias, out, kernel, cluster_size)
    torch.cuda.synchronize()
    assert check_exact(out, a, b, bias) == 0


@pytest.mark.parametrize("kernel, cluster_size", SPLIT_RUNS, ids=RUN_IDS)
@pytest.mark.parametrize("b_transposed", [False, True], ids=["b-n-major", "b-k-major"])
def test_split_tail_random_inputs(pm, kernel, cluster_size, b_transposed):
    """Random normal inputs in both B layouts, against the fp64 reference."""
    skip_unless_runs(pm, kernel)
    m, n, k = 2000, 4200, 1000
    assert_tiles_are_split(pm, kernel, cluster_size, m, n, k)
    a, b = random_operands(m, n, k, torch.bfloat16, "cuda", b_transposed=b_transposed)
    out = poison(torch.empty(m, n, dtype=torch.bfloat16, device="cuda"))
    split_tail(pm, a, b, None, out, kernel, cluster_size)
    torch.cuda.synchronize()
    assert matmul_error(out, a, b) < TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize("kernel, cluster_size", SPLIT_RUNS, ids=RUN_IDS)
def test_split_tail_starts_afresh_every_call(pm, kernel, cluster_size):
    """The workspace's flags are zero again after each launch: back-to-back calls
    with new operands, on the default and on a side stream (a workspace each), all
    bit-exact: no partial sum of an earlier call is taken."""
    skip_unless_runs(pm, kernel)
    m, n, k = 2000, 4200, 1024
    assert_tiles_are_split(pm, kernel, cluster_size, m, n, k)
    operands = [exact_int_operands(m, n, k, torch.bfloat16, "cuda") for _ in range(6)]
    outs = [poison(torch.empty(m, n, dtype=torch.bfloat16, device="cuda")) for _ in operands]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())  # the operands and poison are written
    for i, ((a, b), out) in enumerate(zip(operands, outs)):
        with torch.cuda.stream(side if i % 3 == 2 else torch.cuda.current_stream()):
            split_tail(pm, a, b, None, out, kernel, cluster_size)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    for i, ((a, b), out) in enumerate(zip(operands, outs)):
        assert check_exact(out, a, b) == 0, f"call {i}: wrong or missing partial sums"


@pytest.mark.parametrize("kernel, cluster_size", SPLIT_RUNS, ids=RUN_IDS)
def test_split_tail_in_a_cuda_graph(pm, kernel, cluster_size):
    """Captured into a CUDA graph, the split-tail order gets a workspace of the
    graph's own: replays with new inputs, interleaved with eager calls on the same
    stream (the stream's workspace), all bit-exact."""
    skip_unless_runs(pm, kernel)
    m, n, k = 1700, 3000, 520
    assert_tiles_are_split(pm, kernel, cluster_size, m, n, k)
    check_graph_replays(lambda a, b, out: split_tail(pm, a, b, None, out, kernel, cluster_size), m, n, k,
                        "wrong or missing partial sums")


@pytest.mark.parametrize("kernel", ["persistent", "wgmma_persistent"])
@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (64, 64, 4096), (4097, 4097, 64), (2000, 4200, 200)])
def test_split_tail_where_nothing_splits(pm, kernel, m, n, k):
    """Grids that hold every tile (wgmma_persistent: too few to fill the SMs when split),
    and K too short to split: the order runs whole tiles, bit-exact."""
    skip_unless_runs(pm, kernel)
    a, b = exact_int_operands(m, n, k, torch.bfloat16, "cuda")
    out = poison(torch.empty(m, n, dtype=torch.bfloat16, device="cuda"))
    split_tail(pm, a, b, None, out, kernel, None)
    torch.cuda.synchronize()
    assert check_exact(out, a, b) == 0


# Fewer tiles than SMs, which wgmma_persistent's split-tail order splits in K, every
# one of them, where the parts fill the SMs (csrc/wgmma_persistent.cu, launch_grid):
# Llama-3 projections at 64-256 tokens (single CTAs for one row of tiles, 128 or
# 64 wide, pairs above), a narrow weight (8 tile pairs, 8 parts each), and K with
# a tail whose 17 k-blocks make 2 parts of 8 and 9 (64-wide tiles).
UNDERFILLED_SHAPES = [(64, 4096, 4096), (128, 4096, 4096), (256, 4096, 14336), (200, 1000, 4104), (100, 4096, 1040)]


def skip_unless_underfilled_split_built(variant_dir):
    """CUDA 12 builds have neither the single-CTA split kernel of 128-wide tiles, the
    tiles of every output with fewer tiles than SMs, nor CTA pairs: they split none."""
    if built_with_cuda12(variant_dir):
        pytest.skip(NO_UNDERFILLED_SPLIT)


@pytest.mark.parametrize("cluster_size", [None, 1], ids=["default", "single-ctas"])
@pytest.mark.parametrize("b_kmajor", [False, True], ids=["b-n-major", "b-k-major"])
@pytest.mark.parametrize("m, n, k", UNDERFILLED_SHAPES)
def test_split_tail_splits_fewer_tiles_than_sms(pm, variant_dir, m, n, k, b_kmajor, cluster_size):
    """wgmma_persistent launches a CTA per part where the tiles alone would leave SMs
    idle (tile_config's grid exceeds the tiles), in both B layouts (K-major:
    nn.Linear's weights), with a bias, fp16 and bf16: bit-exact."""
    skip_unless_runs(pm, "wgmma_persistent")
    skip_unless_underfilled_split_built(variant_dir)
    cfg = pm.tile_config(m, n, kernel="wgmma_persistent", k=k)
    assert cfg["tiles"] < cfg["persistent_ctas"] <= torch.cuda.get_device_properties(0).multi_processor_count, cfg
    for dtype in (torch.bfloat16, torch.float16):
        a, b = exact_int_operands(m, n, k, dtype, "cuda", b_transposed=b_kmajor, headroom=1)
        bias = exact_int_bias(n, dtype, "cuda")
        out = poison(torch.empty(m, n, dtype=dtype, device="cuda"))
        pm.matmul(a, b, kernel="wgmma_persistent", out=out, bias=bias, cluster_size=cluster_size)
        torch.cuda.synchronize()
        assert check_exact(out, a, b, bias) == 0, f"{m}x{n}x{k} {dtype}"


@pytest.mark.parametrize("m, n, k", [(128, 4096, 4096), (256, 4096, 14336)])
def test_split_tail_of_fewer_tiles_than_sms_in_a_cuda_graph(pm, variant_dir, m, n, k):
    """The split of every tile (single CTAs, then pairs) replays in a CUDA graph with
    the graph's own workspace, interleaved with eager calls: bit-exact."""
    skip_unless_runs(pm, "wgmma_persistent")
    skip_unless_underfilled_split_built(variant_dir)
    cfg = pm.tile_config(m, n, kernel="wgmma_persistent", k=k)
    assert cfg["tiles"] < cfg["persistent_ctas"], cfg
    check_graph_replays(lambda a, b, out: pm.matmul(a, b, kernel="wgmma_persistent", out=out), m, n, k,
                        "wrong or missing partial sums")


# Launches that read the workspace's counters and flags, as a decode step makes them:
# wgmma_persistent splitting every tile (single CTAs, then pairs), wgmma_streamk.
WORKSPACE_CALLS = [("wgmma_persistent", 128, 4096, 4096), ("wgmma_streamk", 16, 4096, 4096),
                   ("wgmma_persistent", 256, 4096, 14336), ("wgmma_persistent", 64, 2048, 4096)]


def test_graphs_sharing_a_memory_pool_replay_their_workspace_launches_exactly(pm, variant_dir):
    """Two CUDA graphs captured into one memory pool, each of several launches that
    use the workspace, with temporaries allocated between them: the launches of a
    capture share its workspace, each leaving its counters zero for the next, and a
    graph zeroes them again at every replay, after the other graph may have used the
    memory. Replayed alternately with fresh operands and poisoned outputs, every
    output is bit-exact, and so are eager calls after the captures."""
    skip_unless_runs(pm, "wgmma_persistent")
    skip_unless_runs(pm, "wgmma_streamk")
    skip_unless_underfilled_split_built(variant_dir)
    for kernel, m, n, k in WORKSPACE_CALLS:
        if kernel == "wgmma_persistent":
            cfg = pm.tile_config(m, n, kernel=kernel, k=k)
            assert cfg["tiles"] < cfg["persistent_ctas"], (m, n, k, cfg)  # every tile split: flags in use

    def operands():
        # B K-major (nn.Linear's weights), as wgmma_streamk reads them without a copy
        return [exact_int_operands(m, n, k, torch.bfloat16, "cuda", b_transposed=True) for _, m, n, k in WORKSPACE_CALLS]

    def forward(inputs):
        outs = []
        for (kernel, *_), (a, b) in zip(WORKSPACE_CALLS, inputs):
            scaled = a * 1  # a temporary from the pool between launches
            outs.append(pm.matmul(scaled, b, kernel=kernel))
        return outs

    pool = torch.cuda.graph_pool_handle()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graphs = []
    with torch.cuda.stream(stream):
        for _ in range(2):
            inputs = operands()
            forward(inputs)  # warm-up
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                outs = forward(inputs)
            graphs.append((graph, inputs, outs))
        for replay in range(3):
            for graph, inputs, outs in graphs:
                for (a, b), (a2, b2) in zip(inputs, operands()):
                    a.copy_(a2)
                    b.copy_(b2)
                for out in outs:
                    poison(out)
                graph.replay()
            stream.synchronize()
            for g, (_, inputs, outs) in enumerate(graphs):
                for (kernel, m, n, k), (a, b), out in zip(WORKSPACE_CALLS, inputs, outs):
                    assert check_exact(out, a, b) == 0, f"graph {g}, replay {replay}: {kernel} {m}x{n}x{k}"
        inputs = operands()
        eager = forward(inputs)
        stream.synchronize()
        for (kernel, m, n, k), (a, b), out in zip(WORKSPACE_CALLS, inputs, eager):
            assert check_exact(out, a, b) == 0, f"eager call after the captures: {kernel} {m}x{n}x{k}"


@pytest.mark.parametrize("kernel", ["persistent", "wgmma_persistent"])
def test_split_tail_timeline_records_each_part(pm, kernel):
    """The instrumented build runs the split-tail order too (single CTAs, whose cut
    split_parts computes): the tiles of the last round each in `parts` K-ranges of
    whole k-blocks, as tc::SplitTail cuts them, in the rows past the tiles' (one per
    workspace slot, in order); the other tiles whole, in their own rows; bit-exact."""
    skip_unless_runs(pm, kernel)
    m, n, k = 2000, 4200, 1024
    assert_tiles_are_split(pm, kernel, 1, m, n, k)
    cfg = pm.tile_config(m, n, kernel=kernel, k=k)
    tiles, ctas = cfg["tiles"], cfg["persistent_ctas"]
    parts_per_tile = split_parts(tiles, ctas, k)
    a, b = exact_int_operands(m, n, k, torch.bfloat16, "cuda")
    out = poison(torch.empty(m, n, dtype=torch.bfloat16, device="cuda"))
    timeline = torch.full((cfg["timeline_rows"], 8), -1, dtype=torch.int64, device="cuda")
    pm._matmul.ops.matmul_out(a, b, None, out, kernel, int(pm.TileOrder.SPLIT_TAIL),
                              1 if kernel == "wgmma_persistent" else 0, timeline)
    torch.cuda.synchronize()
    assert check_exact(out, a, b) == 0
    parts = timeline_parts(pm, kernel, timeline, m, n, k, torch.cuda.get_device_properties(0).multi_processor_count)
    per_tile: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for p in parts:
        per_tile.setdefault((p[0], p[1]), []).append((p[2], p[3]))
    split = {t: sorted(r) for t, r in per_tile.items() if len(r) > 1}
    k_blocks = -(-k // cfg["block_k"])
    cut = [(p * k_blocks // parts_per_tile * cfg["block_k"],
            min((p + 1) * k_blocks // parts_per_tile * cfg["block_k"], k)) for p in range(parts_per_tile)]
    assert len(split) == tiles % ctas and all(r == cut for r in split.values()), (split, cut)
    rows = torch.nonzero(timeline[:, 6].cpu() >= 0).flatten().tolist()
    assert rows[tiles - len(split):] == list(range(tiles, tiles + len(split) * parts_per_tile)), "a row per slot"
