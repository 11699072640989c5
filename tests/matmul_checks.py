"""The correctness checks of the GPU tests: the protocol of harness.checks (operands,
fp64 references, error measures, tolerances; scripts/harness/checks.py says what
it checks and why) and what only the tests need: ``check_graph_replays``.

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
