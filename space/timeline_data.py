"""The timeline's data model: one record per piece of work an SM ran, and the one sanity check.

A *part* is ``[tile_m, tile_n, k_begin, k_end, sm, cta, start_ns, end_ns]``
(``PART_COLUMNS``): the output tile it belongs to, the range of K it summed,
the SM (``%smid``) and CTA that ran it, and when (``%globaltimer``, relative to
the kernel's first start). A whole tile is the special case ``k_begin = 0,
k_end = K``; a tile that split tail or stream-K cut in K has one part per piece,
whose K-ranges together cover ``[0, K)``.

Kernels that record whole tiles only write ``TILE_COLUMNS`` (no K-range);
``parts_from_rows`` reads either layout, by column name, so a build that adds
the K-range (or drops the CTA) needs no change here. ``check_parts`` is the one
check every timeline passes before it is shown or saved: recorded, live, and
the synthetic data of the tests.

Pure Python (no torch, no numpy): it runs in the app's process on any machine.
"""

from __future__ import annotations

PART_COLUMNS = ("tile_m", "tile_n", "k_begin", "k_end", "sm", "cta", "start_ns", "end_ns")
TILE_COLUMNS = ("tile_m", "tile_n", "sm", "cta", "start_ns", "end_ns")  # what whole-tile builds record
TILE_M, TILE_N, K_BEGIN, K_END, SM, CTA, START, END = range(len(PART_COLUMNS))
REQUIRED_COLUMNS = ("tile_m", "tile_n", "sm", "start_ns", "end_ns")
MAX_PROBLEMS = 8  # problems listed in full; the rest are counted


class TimelineError(ValueError):
    """A timeline that breaks the data model; the message says how."""


def parts_from_rows(rows, columns, k: int) -> list[list[int]]:
    """``rows`` (lists of ints, one per record, laid out as ``columns`` names) as parts
    in ``PART_COLUMNS`` order. Without ``k_begin``/``k_end`` a record is a whole tile,
    ``[0, k)``; without ``cta`` the CTA is -1 (unknown)."""
    columns = [str(c) for c in columns]
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if missing:
        raise TimelineError(f"timeline columns {columns} lack {', '.join(missing)}")
    if ("k_begin" in columns) != ("k_end" in columns):
        raise TimelineError(f"timeline columns {columns} name only one end of the K-range")
    unknown = [c for c in columns if c not in PART_COLUMNS]
    if unknown:
        raise TimelineError(f"unknown timeline column(s) {', '.join(unknown)}; known: {', '.join(PART_COLUMNS)}")
    index = {c: i for i, c in enumerate(columns)}
    defaults = {"k_begin": 0, "k_end": int(k), "cta": -1}
    parts = []
    for n, row in enumerate(rows):
        if len(row) != len(columns):
            raise TimelineError(f"timeline record {n} has {len(row)} values for {len(columns)} columns")
        parts.append([int(row[index[c]]) if c in index else defaults[c] for c in PART_COLUMNS])
    return parts


def tile_grid(shape, tile_config: dict) -> tuple[int, int]:
    """(tile rows, tile columns) of an M x N x K product cut into tile_config's blocks."""
    m, n = int(shape[0]), int(shape[1])
    return -(-m // int(tile_config["block_m"])), -(-n // int(tile_config["block_n"]))


def check_parts(parts, *, tiles_m: int, tiles_n: int, k: int, sm_count: int) -> list[str]:
    """What is wrong with one kernel's parts, as sentences; empty when nothing is.

    The rules: every tile of the ``tiles_m x tiles_n`` grid is there, as one whole
    part or as parts whose K-ranges cover ``[0, k)`` exactly, without gap or overlap;
    no tile outside the grid; every part has ``k_begin < k_end``, ``start < end``
    and an SM id in ``0 .. sm_count - 1``."""
    problems: list[str] = []
    by_tile: dict[tuple[int, int], list[tuple[int, int]]] = {}
    bad_time = bad_sm = bad_range = 0
    for p in parts:
        by_tile.setdefault((p[TILE_M], p[TILE_N]), []).append((p[K_BEGIN], p[K_END]))
        bad_time += p[START] >= p[END]
        bad_sm += not 0 <= p[SM] < sm_count
        bad_range += not 0 <= p[K_BEGIN] < p[K_END] <= k
    if bad_time:
        problems.append(f"{bad_time} part(s) with start >= end")
    if bad_sm:
        problems.append(f"{bad_sm} part(s) on an SM id outside 0..{sm_count - 1}")
    if bad_range:
        problems.append(f"{bad_range} part(s) with a K-range outside 0 <= k_begin < k_end <= {k}")
    outside = sorted(t for t in by_tile if not (0 <= t[0] < tiles_m and 0 <= t[1] < tiles_n))
    missing = [(i, j) for i in range(tiles_m) for j in range(tiles_n) if (i, j) not in by_tile]
    if outside:
        problems.append(f"{len(outside)} tile(s) outside the {tiles_m}x{tiles_n} grid, e.g. {outside[0]}")
    if missing:
        problems.append(f"{len(missing)} of {tiles_m * tiles_n} tile(s) missing, e.g. {missing[0]}")
    coverage = []
    for tile, ranges in sorted(by_tile.items()):
        ranges.sort()
        reached = 0
        for begin, end in ranges:
            if begin != reached:
                what = "overlap" if begin < reached else "leave a gap"
                coverage.append(f"tile {tile}: K-ranges {ranges} {what} at k={min(begin, reached)}")
                break
            reached = end
        else:
            if reached != k:
                coverage.append(f"tile {tile}: K-ranges {ranges} end at k={reached}, not K={k}")
    problems += coverage[:MAX_PROBLEMS]
    if len(coverage) > MAX_PROBLEMS:
        problems.append(f"... and {len(coverage) - MAX_PROBLEMS} more tile(s) whose K-ranges do not cover K")
    return problems


def timeline_problems(result: dict) -> list[str]:
    """``check_parts`` on every kernel of a timeline result (see gpu_work.run_timeline),
    each problem prefixed with the kernel's name; kernels that did not run are skipped."""
    shape, sms = result.get("shape"), result.get("sm_count")
    if not shape or len(shape) != 3 or not sms:
        return ["the timeline names no shape or SM count"]
    problems = []
    for name, kern in (result.get("kernels") or {}).items():
        if not kern.get("parts"):
            continue
        cfg = kern.get("tile_config") or {}
        try:
            tiles_m, tiles_n = tile_grid(shape, cfg)
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            problems.append(f"{name}: no usable tile_config ({cfg})")
            continue
        problems += [f"{name}: {p}" for p in check_parts(kern["parts"], tiles_m=tiles_m, tiles_n=tiles_n,
                                                         k=int(shape[2]), sm_count=int(sms))]
    return problems


def validate(result: dict) -> dict:
    """``result`` unchanged when ``timeline_problems`` finds nothing; else raises
    TimelineError listing the problems."""
    problems = timeline_problems(result)
    if problems:
        raise TimelineError("the timeline fails its sanity check: " + "; ".join(problems))
    return result


def split_tiles(parts) -> int:
    """How many tiles ran as more than one part."""
    counts: dict[tuple[int, int], int] = {}
    for p in parts:
        counts[(p[TILE_M], p[TILE_N])] = counts.get((p[TILE_M], p[TILE_N]), 0) + 1
    return sum(1 for c in counts.values() if c > 1)
