"""The one timing protocol of the scripts: batches of back-to-back calls between CUDA events.

A column (torch.matmul, a rung, a variant) is a function ``fn(i)`` of the call
index, which rotates through input sets that together exceed the L2 cache
(``rotated_inputs``), so every call reads its operands from memory as a model's
layers would. ``batch_time`` times batches of ``calls`` back-to-back calls
(about 2 ms a batch, ``calls_per_batch``, so small shapes measure launch cost
as such) and keeps the median batch; ``interleaved_times`` times every column
once per round, in a shuffled order, so a clock that drifts under the power
limit moves every column alike. benchmark_table.py, compare_builds.py,
speed_of_light.py, model_benchmark.py and demo.py all time through here.
"""

from __future__ import annotations

import math
import random
import statistics

import torch

L2_ROTATION_BYTES = 3 * 60 * 2**20  # input sets together exceed the H200's 60 MB L2 three times


def parse_shape(text: str) -> tuple[int, int, int]:
    """``"MxNxK"`` as ``(m, n, k)``."""
    m, n, k = (int(x) for x in text.lower().split("x"))
    return m, n, k


def warm_up_gpu(seconds: float = 2.0) -> None:
    """Run large products for a while first, so the SM clock has left idle (345 MHz
    on the H200) before the first shape is measured."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    elapsed = 0.0
    while elapsed < seconds * 1e3:
        for _ in range(20):
            torch.matmul(a, a)
        end.record()
        end.synchronize()
        elapsed = start.elapsed_time(end)


# The Space (space/gpu_work.py, `_time_per_call`) keeps a copy of this loop: it is
# uploaded to the Hub on its own, without scripts/. tests/test_benchmark_scripts.py
# keeps the two identical, so the page and the tables measure the same way.
def batch_time(fn, calls: int, batches: int) -> float:
    """Median seconds per call over ``batches`` batches of ``calls`` back-to-back calls."""
    times = []
    for _ in range(batches):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for i in range(calls):
            fn(i)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / calls)
    return statistics.median(times)


def time_per_call(fn, calls_per_batch: int, batches: int) -> float:
    """One warm-up call of ``fn(0)``, then ``batch_time``: median seconds per call."""
    fn(0)
    torch.cuda.synchronize()
    return batch_time(fn, calls_per_batch, batches)


def calls_per_batch(seconds_per_call: float) -> int:
    """Calls in a batch of about 2 ms (1 to 200), so CUDA events time a batch, not one launch."""
    return max(1, min(200, int(2e-3 / max(seconds_per_call, 1e-7))))


def interleaved_times(runners: dict, calls: dict, batches: dict, rounds: int) -> dict[str, list[float]]:
    """Seconds per call of each runner (name -> fn(i)) in each of `rounds` rounds:
    every round times each runner once (time_per_call with its calls per batch and
    batches), in an order shuffled per round with the round as seed, the same for
    every run. In a fixed order each column always runs after the same one, and
    two tile orders of one rung traded a 4-5% lead when their columns traded
    places (benchmarks/NOTES.md)."""
    times = {name: [] for name in runners}
    for r in range(rounds):
        order = list(runners)
        random.Random(r).shuffle(order)
        for name in order:
            times[name].append(time_per_call(runners[name], calls[name], batches[name]))
    return times


def rotated_inputs(m: int, n: int, k: int, dtype: torch.dtype) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Random normal (a, b) pairs, as many as it takes (up to 16) for all of them
    together to exceed the L2 cache three times: calls that rotate through them
    read their operands from memory, as a model's layers would."""
    set_bytes = (m * k + k * n) * torch.finfo(dtype).bits // 8
    sets = max(1, min(16, math.ceil(L2_ROTATION_BYTES / set_bytes)))
    return [(torch.randn(m, k, device="cuda", dtype=dtype), torch.randn(k, n, device="cuda", dtype=dtype))
            for _ in range(sets)]


def geomean(values: list[float]) -> float:
    """The geometric mean of positive numbers."""
    return math.exp(sum(math.log(v) for v in values) / len(values))
