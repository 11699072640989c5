"""Figures, tables and summaries built from the plain data of gpu_work / recorded.

Nothing here touches the GPU: it runs in the app's process on any machine.
"""

from __future__ import annotations

import math

import matplotlib
from matplotlib.collections import LineCollection, PolyCollection
from matplotlib.figure import Figure

from timeline_data import CTA, END, K_BEGIN, K_END, SM, START, TILE_M, TILE_N, split_tiles

# Figures are built with matplotlib.figure.Figure, not pyplot: pyplot keeps every
# figure in a global registry, which would grow with each request of a long-running app.

BASELINE = "cuBLAS"  # gpu_work.CUBLAS: torch.matmul, drawn first and grey
BASELINE_COLOR = "#555555"
# (persistent rung, its one-CTA-per-tile twin): the summary gives their speed-up.
PERSISTENT_PAIRS = (("persistent", "tiled"), ("wgmma_persistent", "wgmma"))
TABLE_HEADERS = ["shape (MxNxK)", "dtype", "rung", "ms", "TFLOP/s", "ms in CUDA graph", "host µs/call", "x cuBLAS",
                 "rel. error", "note"]


def shape_label(row: dict) -> str:
    return f"{row['m']}x{row['n']}x{row['k']}"


def _geomean(values: list[float]) -> float | None:
    values = [v for v in values if v and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


# --------------------------------------------------------------------------- benchmark


def rung_order(rows: list[dict], rungs: tuple[str, ...] | list[str] = ()) -> list[str]:
    """The rungs of ``rows``: the baseline first, then those of ``rungs`` (the
    kernel's, in its order), then any others in the order the rows have them."""
    present = dict.fromkeys(r["rung"] for r in rows)
    return [n for n in dict.fromkeys([BASELINE, *rungs, *present]) if n in present]


def rung_colors(rungs: tuple[str, ...] | list[str]) -> dict[str, tuple]:
    """A colour per rung that stays the same whatever the selection: grey for the
    baseline, else tab10's by the rung's place in ``rungs`` (the kernel's order)."""
    cmap = matplotlib.colormaps["tab10"]
    return {BASELINE: BASELINE_COLOR} | {name: cmap(i % 10) for i, name in enumerate(rungs) if name != BASELINE}


def benchmark_figure(rows: list[dict], title: str, rungs: tuple[str, ...] | list[str] = ()):
    """Grouped bars of TFLOP/s per shape (categorical x) and rung, log y; ``rungs``
    (the kernel's rung list) fixes their order and colours."""
    shapes = list(dict.fromkeys(shape_label(r) for r in rows))
    shown = rung_order([r for r in rows if r["tflops"]], rungs)
    colors = rung_colors([*rungs, *(n for n in shown if n not in rungs)])
    fig = Figure(figsize=(10, 4.6), layout="constrained")
    ax = fig.subplots()
    if not shapes or not shown:
        ax.text(0.5, 0.5, "no timings to plot", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return fig
    width = 0.8 / len(shown)
    for j, rung in enumerate(shown):
        by_shape = {shape_label(r): r["tflops"] for r in rows if r["rung"] == rung and r["tflops"]}
        xs = [i + (j - (len(shown) - 1) / 2) * width for i, s in enumerate(shapes) if s in by_shape]
        ys = [by_shape[s] for s in shapes if s in by_shape]
        ax.bar(xs, ys, width=width, label=rung, color=colors[rung])
    ax.set_xticks(range(len(shapes)), shapes, rotation=20, ha="right")
    ax.set_yscale("log")
    ax.set_ylabel("TFLOP/s (log scale)")
    ax.set_xlabel("shape M x N x K")
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", which="both", alpha=0.3)
    ax.legend(ncols=len(shown), fontsize=8, loc="upper left")
    return fig


def _fmt(value, spec: str) -> str:
    return "" if value is None else format(value, spec)


def benchmark_table(rows: list[dict]) -> list[list[str]]:
    """Rows for the results table, numbers formatted as text."""
    return [[shape_label(r), r["dtype"], r["rung"], _fmt(r.get("ms"), ".4f"), _fmt(r.get("tflops"), ".1f"),
             _fmt(r.get("graph_ms"), ".4f"), _fmt(r.get("host_us"), ".1f"), _fmt(r.get("ratio_vs_cublas"), ".2f"),
             _fmt(r.get("rel_error"), ".2e"), r.get("note", "")]
            for r in rows]


def _speedups(rows: list[dict], persistent: str, twin: str) -> list[tuple[str, float]]:
    """(shape, persistent's TFLOP/s over twin's) for the shapes where both ran."""
    tflops = {(shape_label(r), r["rung"]): r["tflops"] for r in rows if r.get("tflops")}
    shapes = list(dict.fromkeys(shape_label(r) for r in rows))
    return [(s, tflops[(s, persistent)] / tflops[(s, twin)]) for s in shapes
            if (s, persistent) in tflops and (s, twin) in tflops]


def best_rung(rows: list[dict]) -> str | None:
    """The rung (not the baseline) with the highest geomean ratio to cuBLAS in ``rows``."""
    ratios: dict[str, list[float]] = {}
    for r in rows:
        if r["rung"] != BASELINE and r.get("ratio_vs_cublas"):
            ratios.setdefault(r["rung"], []).append(r["ratio_vs_cublas"])
    return max(ratios, key=lambda name: _geomean(ratios[name]), default=None)


def benchmark_headline(rows: list[dict]) -> str:
    """Markdown headline: for each persistent rung that ran with its twin (the best
    rung's pair first), the geomean speed-up over the twin and the geomean ratio to
    cuBLAS; then the best rung's ratio."""
    cells = []
    best = best_rung(rows)
    for persistent, twin in sorted(PERSISTENT_PAIRS, key=lambda pair: best not in pair):  # the best rung's first
        speedups = _speedups(rows, persistent, twin)
        ratios = [r["ratio_vs_cublas"] for r in rows if r["rung"] == persistent and r.get("ratio_vs_cublas")]
        if speedups:
            cells.append(f"**{persistent}** runs **{_geomean([v for _, v in speedups]):.2f}x** the speed of {twin}"
                         + (f" and **{_geomean(ratios):.2f}x** cuBLAS" if ratios else "")
                         + f" (geomean over {len(speedups)} shape(s))")
    if best:
        ratios = [r["ratio_vs_cublas"] for r in rows if r["rung"] == best and r.get("ratio_vs_cublas")]
        cells.append(f"best rung here: **{best}**, **{_geomean(ratios):.2f}x** cuBLAS")
    if not cells:
        return "### No rung besides cuBLAS ran for this selection."
    return "\n\n".join([f"### {cells[0]}", *cells[1:]])


def benchmark_summary(rows: list[dict], rungs: tuple[str, ...] | list[str] = ()) -> str:
    """Markdown: persistent over tiled per shape, and each rung's geomean ratio to cuBLAS
    (in the order of ``rungs``, the kernel's rung list)."""
    lines = []
    for persistent, twin in PERSISTENT_PAIRS:
        speedups = _speedups(rows, persistent, twin)
        if speedups:
            cells = ", ".join(f"{s}: **{v:.2f}x**" for s, v in speedups)
            lines.append(f"**{persistent} / {twin}** (speed-up): {cells}; "
                         f"geomean {_geomean([v for _, v in speedups]):.2f}x")
    for rung in rung_order(rows, rungs):
        if rung == BASELINE:
            continue
        ratios = [r["ratio_vs_cublas"] for r in rows if r["rung"] == rung and r.get("ratio_vs_cublas")]
        if ratios:
            lines.append(f"**{rung}** vs cuBLAS: geomean {_geomean(ratios):.2f}x over {len(ratios)} shape(s)")
    return "\n\n".join(lines) or "No rung besides cuBLAS ran for this selection."


# --------------------------------------------------------------------------- timeline
# Timelines are lists of parts (timeline_data.PART_COLUMNS): a whole tile is one
# part with the K-range [0, K); split tail and stream-K cut a tile into parts.


def _lanes(parts: list[list[int]]) -> tuple[dict[int, int], list[int]]:
    """Greedy interval packing per SM: parts that overlap in time on one SM (CTAs
    sharing it) get separate lanes. Returns (lanes per SM, lane of each part)."""
    order = sorted(range(len(parts)), key=lambda i: (parts[i][SM], parts[i][START]))
    lane_ends: dict[int, list[int]] = {}
    lane_of = [0] * len(parts)
    for i in order:
        sm, start, end = parts[i][SM], parts[i][START], parts[i][END]
        ends = lane_ends.setdefault(sm, [])
        for lane, last in enumerate(ends):
            if last <= start:
                ends[lane] = end
                lane_of[i] = lane
                break
        else:
            ends.append(end)
            lane_of[i] = len(ends) - 1
    return {sm: len(e) for sm, e in lane_ends.items()}, lane_of


def _iterations(parts: list[list[int]]) -> list[int]:
    """Each part's place in its CTA's sequence (by start); parts of an unknown CTA
    (-1) are counted per SM instead."""
    seen: dict[tuple[str, int], int] = {}
    iteration = [0] * len(parts)
    for i in sorted(range(len(parts)), key=lambda i: parts[i][START]):
        key = ("cta", parts[i][CTA]) if parts[i][CTA] >= 0 else ("sm", parts[i][SM])
        iteration[i] = seen.get(key, 0)
        seen[key] = iteration[i] + 1
    return iteration


def waves(parts: list[list[int]], resident_ctas: int) -> list[int]:
    """The wave of each part. Where every CTA ran one part (one CTA per tile: tiled,
    wgmma) it is the CTA's launch wave, cta // CTAs resident at once; where CTAs
    loop (the persistent rungs), the CTA's loop iteration."""
    ctas = [p[CTA] for p in parts]
    if ctas and min(ctas) >= 0 and len(set(ctas)) == len(ctas):
        return [c // max(1, resident_ctas) for c in ctas]
    return _iterations(parts)


def _busy_ns(parts: list[list[int]], until: float | None = None) -> tuple[float, dict[int, int]]:
    """SM-time with a part running (overlaps on one SM counted once), up to ``until``
    (ns since the first start; None: the whole run), and each SM's last end."""
    per_sm: dict[int, list[tuple[int, int]]] = {}
    for p in parts:
        per_sm.setdefault(p[SM], []).append((p[START], p[END]))
    busy = 0.0
    last_end = {}
    for sm, intervals in per_sm.items():
        intervals.sort()
        last_end[sm] = max(e for _, e in intervals)
        cur_s, cur_e = intervals[0]
        for s, e in [*intervals[1:], (math.inf, math.inf)]:
            if s > cur_e:
                hi = cur_e if until is None else min(cur_e, until)
                busy += max(0, hi - cur_s)
                cur_s, cur_e = s, e
            else:
                cur_e = max(cur_e, e)
    return busy, last_end


def timeline_stats(parts: list[list[int]], sm_count: int) -> dict:
    """Span, idle SM-time and tail of one kernel's timeline.

    idle fraction = 1 - (sum over SMs of the time the SM had a part running) / (SMs x span);
    tail = span - the time at which the first SM ran out of work (the stretch at the
    end where some SMs already sit idle)."""
    if not parts:
        return {"tiles": 0, "parts": 0, "split_tiles": 0, "span_us": 0.0, "idle_fraction": None, "tail_us": 0.0,
                "sms_used": 0}
    start = min(p[START] for p in parts)
    span = max(p[END] for p in parts) - start
    busy, last_end = _busy_ns(parts)
    sms = max(sm_count or 0, len(last_end))
    first_idle = start if len(last_end) < sms else min(last_end.values())
    return {
        "tiles": len({(p[TILE_M], p[TILE_N]) for p in parts}),
        "parts": len(parts),
        "split_tiles": split_tiles(parts),
        "span_us": span / 1e3,
        "idle_fraction": 1 - busy / (sms * span) if span > 0 else None,
        "tail_us": (start + span - first_idle) / 1e3,
        "sms_used": len(last_end),
    }


def idle_so_far(parts: list[list[int]], sm_count: int, t_us: float) -> tuple[float, float | None]:
    """Idle SM-time from the kernel's first start to ``t_us`` (stopping at its last
    end), in SM x µs, and as a share of SMs x that time."""
    if not parts:
        return 0.0, None
    t0 = min(p[START] for p in parts)
    until = min(t_us * 1e3, max(p[END] for p in parts) - t0)
    if until <= 0:
        return 0.0, None
    shifted = [[*p[:START], p[START] - t0, p[END] - t0] for p in parts]
    busy, last_end = _busy_ns(shifted, until)
    sms = max(sm_count or 0, len(last_end))
    idle = max(0.0, round(sms * until - busy, 3))  # ns; rounding drops float noise of a busy SM
    return idle / 1e3, idle / (sms * until)


def _pair_links(parts: list[list[int]], cluster_size: int, t0: int, y_of,
                limit: float = math.inf) -> list[list[tuple[float, float]]]:
    """Vertical segments joining the CTAs of each cluster at the start of each tile
    they ran together (the i-th part of every CTA of the cluster), for the parts
    that started before ``limit`` (ns since ``t0``)."""
    if cluster_size < 2:
        return []
    iteration = _iterations(parts)
    groups: dict[tuple[int, int], list[int]] = {}
    for i, p in enumerate(parts):
        if p[CTA] >= 0 and p[START] - t0 < limit:
            groups.setdefault((p[CTA] // cluster_size, iteration[i]), []).append(i)
    links = []
    for members in groups.values():
        if len(members) > 1:
            x = (min(parts[i][START] for i in members) - t0) / 1e3
            ys = [y_of(i) for i in members]
            links.append([(x, min(ys)), (x, max(ys))])
    return links


def _draw_kernel(ax, name: str, kern: dict, sm_count: int, until_us: float | None) -> dict:
    """One kernel's parts on ``ax``: SM on y, µs since its first start on x, coloured
    by wave, parts of split tiles hatched, CTA pairs joined. ``until_us`` draws the
    run as it stood at that time (later parts left out, running ones cut there).
    Returns the kernel's timeline_stats."""
    parts = kern.get("parts") or []
    stats = timeline_stats(parts, sm_count)
    if not parts:
        ax.text(0.5, 0.5, kern.get("note") or "no timeline", ha="center", va="center", transform=ax.transAxes,
                wrap=True, fontsize=9)
        ax.set_title(name, fontsize=10)
        return stats
    lanes, lane_of = _lanes(parts)
    cfg = kern.get("tile_config") or {}
    wave = waves(parts, cfg.get("persistent_ctas") or sm_count)
    t0 = min(p[START] for p in parts)
    split = {(p[TILE_M], p[TILE_N]) for p in parts if p[K_END] - p[K_BEGIN] < kern.get("k", math.inf)}
    cmap = matplotlib.colormaps["tab10"]
    limit = math.inf if until_us is None else until_us * 1e3

    def y_range(i):
        n_lanes = lanes[parts[i][SM]]
        y0 = parts[i][SM] - 0.45 + 0.9 * lane_of[i] / n_lanes
        return y0, y0 + 0.9 / n_lanes

    whole, whole_c, pieces, pieces_c = [], [], [], []
    for i, p in enumerate(parts):
        if p[START] - t0 >= limit:
            continue
        y0, y1 = y_range(i)
        x0, x1 = (p[START] - t0) / 1e3, (min(p[END] - t0, limit)) / 1e3
        is_piece = (p[TILE_M], p[TILE_N]) in split
        (pieces if is_piece else whole).append([(x0, y0), (x1, y0), (x1, y1), (x0, y1)])
        (pieces_c if is_piece else whole_c).append(cmap(wave[i] % 10))
    ax.add_collection(PolyCollection(whole, facecolors=whole_c, edgecolors="none"))
    if pieces:
        ax.add_collection(PolyCollection(pieces, facecolors=pieces_c, edgecolors="black", linewidths=0.3,
                                         hatch="////", label="part of a split tile (a K-range)"))
    cluster = int(kern.get("cluster_size") or 1)
    links = _pair_links(parts, cluster, t0, lambda i: sum(y_range(i)) / 2, limit)
    if links:
        ax.add_collection(LineCollection(links, colors="black", linewidths=0.6, alpha=0.5,
                                         label=f"the {cluster} CTAs of a cluster (they share B)"))
    done = until_us is None or until_us * 1e3 >= max(p[END] for p in parts) - t0
    if done and stats["tail_us"] > 0:
        ax.axvspan(stats["span_us"] - stats["tail_us"], stats["span_us"], color="red", alpha=0.08,
                   label="tail: some SMs idle")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="lower right", fontsize=7)
    ax.set_ylim(-1, max(sm_count, max(p[SM] for p in parts) + 1))
    ms = kern.get("ms")
    pieces_note = f", {stats['split_tiles']} split into {stats['parts'] - stats['tiles'] + stats['split_tiles']} " \
                  "parts" if stats["split_tiles"] else ""
    ax.set_title(f"{name}: {stats['tiles']} tiles{pieces_note}, grid {kern.get('grid')} CTAs"
                 + (f", {ms:.3f} ms" if ms else ""), fontsize=10)
    return stats


def timeline_figure(result: dict, title: str, kernels: tuple[str, ...] | list[str] | None = None,
                    until_us: float | None = None):
    """Side by side, one panel per kernel of ``kernels`` (default: every kernel of the
    result): SM on y, time on x, one bar per part, coloured by wave; parts of split
    tiles hatched; the CTAs of a cluster joined; the tail shaded. With ``until_us``,
    the run as it stood at that time, with each kernel's idle SM-time so far."""
    all_kernels = result.get("kernels", {})
    names = [n for n in (kernels or all_kernels) if n in all_kernels]
    fig = Figure(figsize=(12, 5.2), layout="constrained")
    axes = fig.subplots(1, max(1, len(names)), sharey=True, squeeze=False)
    sm_count = result.get("sm_count") or 0
    k = (result.get("shape") or [0, 0, 0])[2]
    spans = [timeline_stats(all_kernels[n].get("parts") or [], sm_count)["span_us"] for n in names]
    xmax = max(spans + [1e-3])
    for ax, name in zip(axes[0], names):
        kern = {**all_kernels[name], "k": k}
        _draw_kernel(ax, name, kern, sm_count, until_us)
        ax.set_xlim(0, xmax * 1.02)
        ax.set_xlabel("time since the kernel's first tile started (µs)")
        if until_us is not None:
            idle, share = idle_so_far(kern.get("parts") or [], sm_count, until_us)
            ax.axvline(until_us, color="black", linewidth=0.8)
            ax.set_title(f"{ax.get_title()}\nidle SM-time so far: {idle:,.0f} SM·µs"
                         + ("" if share is None else f" ({100 * share:.1f}% of SMs x time)"), fontsize=10)
    if not names:
        axes[0][0].text(0.5, 0.5, "no timeline to show", ha="center", va="center", transform=axes[0][0].transAxes)
        axes[0][0].set_axis_off()
        return fig
    axes[0][0].set_ylabel("SM (%smid)")
    when = "" if until_us is None else f" at t = {until_us:.1f} µs"
    fig.suptitle(f"{title}{when}\ncolour = wave (one CTA per tile: launch wave; persistent: loop iteration); "
                 "hatched: parts of split tiles; shaded: tail", fontsize=10)
    return fig


def timeline_summary(result: dict, kernels: tuple[str, ...] | list[str] | None = None) -> str:
    """Markdown numbers per kernel and a short plain-words explanation."""
    all_kernels = result.get("kernels", {})
    names = [n for n in (kernels or all_kernels) if n in all_kernels]
    sm_count = result.get("sm_count") or 0
    m, n, k = result.get("shape", [0, 0, 0])
    lines = [
        f"**{m}x{n}x{k} {result.get('dtype', '')}** on **{sm_count} SMs**.",
        "",
        "| kernel | tile | tiles | CTAs | cluster | kernel time (ms) | span of timeline (µs) | idle SM-time "
        "| tail (µs) | split tiles (parts) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in names:
        kern = all_kernels[name]
        cfg = kern.get("tile_config") or {}
        s = timeline_stats(kern.get("parts") or [], sm_count)
        idle = "" if s["idle_fraction"] is None else f"{100 * s['idle_fraction']:.1f}%"
        ms = "" if kern.get("ms") is None else f"{kern['ms']:.3f}"
        tile = f"{cfg.get('block_m')}x{cfg.get('block_n')}" if cfg else ""
        split = f"{s['split_tiles']} ({s['parts'] - s['tiles'] + s['split_tiles']})" if s["split_tiles"] else "0"
        if not kern.get("parts"):
            lines.append(f"| {name} | {tile} | {cfg.get('tiles', '')} | | | {ms} | | | | {kern.get('note', '')} |")
            continue
        lines.append(f"| {name} | {tile} | {s['tiles']} | {kern.get('grid')} | {kern.get('cluster_size') or 1} "
                     f"| {ms} | {s['span_us']:.1f} | {idle} | {s['tail_us']:.1f} | {split} |")
    lines += [
        "",
        "Each bar is one output tile (or one K-range of a split tile, hatched) on the SM that computed it, "
        "from its first to its last instruction (`%globaltimer`). The one-CTA-per-tile rungs (**tiled**, "
        "**wgmma**) launch a CTA per tile: the GPU runs them in waves, each new CTA pays its start-up again, "
        "and when the tile count is not a multiple of what fits at once, the last wave leaves SMs idle (the "
        "shaded tail). The persistent rungs (**persistent**, **wgmma_persistent**) launch just enough CTAs to "
        "fill the GPU once; each loops over tiles and loads the next tile while storing this one, so gaps "
        "between tiles shrink. **wgmma_persistent** runs CTA pairs (clusters) that share B's loads; lines "
        "join a pair's tiles. Split tail cuts the last, ragged round's tiles in K so the SMs it would leave "
        "idle share them; where there are fewer tiles than SMs, **wgmma_persistent** cuts every tile in K, "
        "a CTA per part, if the parts fill the SMs. **wgmma_streamk** (stream-K, for decode shapes) cuts all the work, every tile's "
        "k-blocks one after another, into one equal stretch per SM: a tile whose k-blocks fall into several "
        "stretches runs as parts on several SMs at once, and the CTA that finishes last adds them up; "
        "where a whole number of CTAs per tile fills the GPU, each tile's parts run as one cluster (lines join "
        "them) that adds them up together. "
        "*Idle SM-time* is the share of SMs x span with nothing running.",
    ]
    return "\n".join(lines)
