"""How the tiles of one product spread over the GPU, from the instrumented build.

    python scripts/timeline_stats.py [--shape 4096x4096x4096] [--k-major-b] [RUNG[-ORDER] ...]
    python scripts/timeline_stats.py --recorded space/recorded/timelines/3000x3000x3000.safetensors [RUNG ...]

With --recorded it runs nothing and needs no GPU: it reads the timelines that
space/record.py wrote (shape, SM count and clock from the file's metadata).

For each rung with a timeline (default: every available one), in its default
tile order or ORDER (a persistent rung's "hilbert" or "dynamic"): CTAs and SMs that
ran tiles, tiles (units of work: a tile, or a part of one that the split-tail order
or stream-K cut in K) per CTA, median tile time, the median gap between one CTA's
consecutive tiles (from one tile's stored results to the next tile's first
k-block) per CTA and per SM, the SMs' idle share of the makespan (what a better
schedule of the same tiles could save at most), the makespan, and how many
tiles ran at once at most and on average:
a grid that cannot be resident at once shows as a concurrency well under the
CTA count. Where tiles are split in K, also the median time of the whole
tiles, and when the parts end: the parts that hand their partial sums over,
and the owners (the last parts), which wait for them, add them and store the
tile; the gap between the two is the split's tail, which is also given per
split tile (the end of its part that ends at K, the owner where the last part
stores the tile, less the latest end of its other parts). Median tile times
at two depths K of one M x N give the per-tile cost that does not grow with K
(epilogue, pipeline fill) by extrapolation.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from harness.kernel import REPO_ROOT, load_kernel


def spread(times_ns: torch.Tensor) -> str:
    """min/median/max of times in ns, in us."""
    us = times_ns.double() / 1e3
    return f"{float(us.min()):.1f}/{float(us.median()):.1f}/{float(us.max()):.1f}" if len(us) else "-"


def recorded_timelines(path: Path, rungs: list[str]) -> tuple[tuple[int, int, int], int, str, dict]:
    """The shape, SM count, SM clock and {rung: (timeline rows, column names)} of
    a file space/record.py wrote, read and checked by the Space's own loader."""
    sys.path.insert(0, str(REPO_ROOT / "space"))
    import recorded
    import timeline_data

    result = recorded.load_timeline_file(path)
    if result["error"]:
        raise SystemExit(result["error"])
    kernels = {name: kern for name, kern in result["kernels"].items() if kern["parts"]}
    missing = [r for r in rungs if r not in kernels]
    if missing:
        raise SystemExit(f"{path} has no timeline of {', '.join(missing)}; it has {', '.join(kernels)}")
    timelines = {r: (torch.tensor(kernels[r]["parts"], dtype=torch.int64), list(timeline_data.PART_COLUMNS))
                 for r in rungs or kernels}
    m, n, k = result["shape"]
    return (m, n, k), result["sm_count"], result["environment"].get("sm_clock", "?"), timelines


def live_timelines(shape: str, rungs: list[str], k_major_b: bool) -> tuple[tuple[int, int, int], int, dict]:
    """Runs each rung's instrumented build at `shape`: the shape, the SM count and
    {rung: (timeline rows of the last of 3 runs, column names)}."""
    m, n, k = (int(x) for x in shape.split("x"))
    pm, _ = load_kernel()
    available = pm.available_kernels()
    rungs = rungs or [r for r in ("tiled", "persistent", "wgmma", "wgmma_persistent") if available[r].available]
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = (torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t() if k_major_b
         else torch.randn(k, n, device="cuda", dtype=torch.bfloat16))
    timelines = {}
    for name in rungs:
        rung, _, order = name.partition("-")
        for _ in range(3):  # warm: the last run is reported
            _, timeline = pm.matmul_timeline(a, b, kernel=rung, tile_order=order or None)  # None: the default order
        torch.cuda.synchronize()
        timelines[name] = (timeline.cpu(), list(pm.TIMELINE_COLUMNS))
    return (m, n, k), torch.cuda.get_device_properties(0).multi_processor_count, timelines


def split_tile_lags(t: torch.Tensor, column: dict, end: torch.Tensor, k: int) -> torch.Tensor:
    """Per tile split in K: the end of its part that ends at k less the latest end
    of its other parts, in ns."""
    by_tile: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for row, row_end in zip(t.tolist(), end.tolist()):
        by_tile.setdefault((row[column["tile_m"]], row[column["tile_n"]]), []).append((row[column["k_end"]], row_end))
    lags = []
    for parts in by_tile.values():
        if len(parts) > 1:
            owner_end = max(e for k_end, e in parts if k_end == k)
            lags.append(owner_end - max(e for k_end, e in parts if k_end < k))
    return torch.tensor(lags, dtype=torch.int64)


def report(name: str, shape: tuple[int, int, int], sm_count: int, t: torch.Tensor, columns: list[str]) -> None:
    """Prints one rung's statistics (the module's docstring) from its timeline rows."""
    m, n, k = shape
    column = {c: i for i, c in enumerate(columns)}
    sm_col, cta_col, start_col, end_col = (column[c] for c in ("sm", "cta", "start_ns", "end_ns"))
    k_begin_col, k_end_col = column["k_begin"], column["k_end"]
    t = t[t[:, start_col] >= 0]  # rows of units the launch did not have stay -1
    start, end = t[:, start_col] - t[:, start_col].min(), t[:, end_col] - t[:, start_col].min()
    makespan = int(end.max())
    events = sorted([(int(s), 1) for s in start] + [(int(e), -1) for e in end])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    busy = int((end - start).sum())
    per_cta = torch.bincount(t[:, cta_col]).float()
    per_cta = per_cta[per_cta > 0]
    gaps = []
    for cta in set(t[:, cta_col].tolist()):
        rows = t[t[:, cta_col] == cta]
        rows = rows[rows[:, start_col].argsort()]
        gaps += (rows[1:, start_col] - rows[:-1, end_col]).tolist()
    gap = f"{float(torch.tensor(gaps).float().median()) / 1e3:.2f} us" if gaps else "-"
    # The same per SM (one-CTA-per-tile rungs: from one CTA's end to the next
    # CTA's start there), and the SMs' idle share of the makespan: the most a
    # better schedule of the same tiles could save.
    sm_gaps, sms = [], sorted(set(t[:, sm_col].tolist()))
    for s in sms:
        rows = t[t[:, sm_col] == s]
        rows = rows[rows[:, start_col].argsort()]
        sm_gaps += (rows[1:, start_col] - rows[:-1, end_col]).tolist()
    sm_gap = f"{float(torch.tensor(sm_gaps).float().median()) / 1e3:.2f} us" if sm_gaps else "-"
    idle = 1 - busy / max(makespan * sm_count, 1)
    print(f"{name} {m}x{n}x{k}: {t.shape[0]} tiles on {len(set(t[:, cta_col].tolist()))} CTAs, "
          f"{len(set(t[:, sm_col].tolist()))} SMs; tiles per CTA {int(per_cta.min())}..{int(per_cta.max())}; "
          f"median tile {float((end - start).float().median()) / 1e3:.2f} us; median gap {gap} (per CTA), "
          f"{sm_gap} (per SM); SMs idle {100 * idle:.1f}% of the makespan; "
          f"makespan {makespan / 1e3:.1f} us; "
          f"tiles at once: peak {peak}, mean {busy / max(makespan, 1):.1f}", flush=True)
    parts = (t[:, k_begin_col] > 0) | (t[:, k_end_col] < k)
    if parts.any():
        owners = parts & (t[:, k_end_col] == k)
        handing = parts & ~owners
        whole = (end - start)[~parts].float()
        print(f"  whole tiles: {int((~parts).sum())}, median {float(whole.median()) / 1e3:.2f} us" if len(whole) else
              "  whole tiles: none", flush=True)
        print(f"  split tiles: {int(owners.sum())} in {int(parts.sum())} parts; parts that hand over end at "
              f"{spread(end[handing])} us, owners at {spread(end[owners])} us (min/median/max); "
              f"the part ending at K after its tile's others: {spread(split_tile_lags(t[parts], column, end[parts], k))} us",
              flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rungs", nargs="*")
    parser.add_argument("--shape", default="4096x4096x4096")
    parser.add_argument("--k-major-b", action="store_true", help="b as nn.Linear keeps its weight (N x K, transposed)")
    parser.add_argument("--recorded", type=Path, metavar="SAFETENSORS",
                        help="a timeline file of space/record.py to read instead of running (no GPU needed)")
    args = parser.parse_args()
    if args.recorded:
        shape, sm_count, clock, timelines = recorded_timelines(args.recorded, args.rungs)
        print(f"{args.recorded}: recorded on {sm_count} SMs at {clock}")
    else:
        shape, sm_count, timelines = live_timelines(args.shape, args.rungs, args.k_major_b)
    for name, (t, columns) in timelines.items():
        report(name, shape, sm_count, t, columns)
    return 0


if __name__ == "__main__":
    sys.exit(main())
