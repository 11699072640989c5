"""Figures, tables and summaries built from the plain data of gpu_work / recorded.

Nothing here touches the GPU: it runs in the app's process on any machine.
"""

from __future__ import annotations

import math

import matplotlib
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure

# Figures are built with matplotlib.figure.Figure, not pyplot: pyplot keeps every
# figure in a global registry, which would grow with each request of a long-running app.

BASELINE = "cuBLAS"  # gpu_work.CUBLAS: torch.matmul, drawn first and grey
BASELINE_COLOR = "#555555"
# (persistent rung, its one-CTA-per-tile twin): the summary gives their speed-up.
PERSISTENT_PAIRS = (("persistent", "tiled"), ("wgmma_persistent", "wgmma"))
TABLE_HEADERS = ["shape (MxNxK)", "dtype", "rung", "ms", "TFLOP/s", "x cuBLAS", "rel. error", "note"]


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
             _fmt(r.get("ratio_vs_cublas"), ".2f"), _fmt(r.get("rel_error"), ".2e"), r.get("note", "")]
            for r in rows]


def benchmark_summary(rows: list[dict], rungs: tuple[str, ...] | list[str] = ()) -> str:
    """Markdown: persistent over tiled per shape, and each rung's geomean ratio to cuBLAS
    (in the order of ``rungs``, the kernel's rung list)."""
    lines = []
    tflops = {(shape_label(r), r["rung"]): r["tflops"] for r in rows if r.get("tflops")}
    shapes = list(dict.fromkeys(shape_label(r) for r in rows))
    for persistent, twin in PERSISTENT_PAIRS:
        speedups = [(s, tflops[(s, persistent)] / tflops[(s, twin)]) for s in shapes
                    if (s, persistent) in tflops and (s, twin) in tflops]
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


def _lanes(rows: list[list[int]]) -> tuple[dict[int, int], list[int]]:
    """Greedy interval packing per SM: tiles that overlap in time on one SM get
    separate lanes. Returns (lanes per SM, lane of each row)."""
    order = sorted(range(len(rows)), key=lambda i: (rows[i][2], rows[i][4]))
    lane_ends: dict[int, list[int]] = {}
    lane_of = [0] * len(rows)
    for i in order:
        sm, start, end = rows[i][2], rows[i][4], rows[i][5]
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


def waves(name: str, rows: list[list[int]], persistent_ctas: int) -> list[int]:
    """The wave of each tile: for ``tiled`` (one CTA per tile) the CTA's launch wave,
    cta // CTAs resident at once; for ``persistent`` the CTA's loop iteration."""
    if name != "persistent":
        return [r[3] // max(1, persistent_ctas) for r in rows]
    seen: dict[int, list[int]] = {}
    for i in sorted(range(len(rows)), key=lambda i: rows[i][4]):
        seen.setdefault(rows[i][3], []).append(i)
    wave = [0] * len(rows)
    for indices in seen.values():
        for iteration, i in enumerate(indices):
            wave[i] = iteration
    return wave


def timeline_stats(rows: list[list[int]], sm_count: int) -> dict:
    """Span, busy/idle SM-time and tail of one kernel's timeline.

    idle fraction = 1 - (sum over SMs of the time the SM had a tile) / (SMs x span);
    tail = span - the time at which the first SM ran out of tiles (the stretch at the
    end where some SMs already sit idle)."""
    if not rows:
        return {"tiles": 0, "span_us": 0.0, "idle_fraction": None, "tail_us": 0.0, "sms_used": 0}
    start = min(r[4] for r in rows)
    span = max(r[5] for r in rows) - start
    per_sm: dict[int, list[tuple[int, int]]] = {}
    for r in rows:
        per_sm.setdefault(r[2], []).append((r[4], r[5]))
    busy = 0
    last_end = []
    for intervals in per_sm.values():
        intervals.sort()
        cur_s, cur_e = intervals[0]
        for s, e in intervals[1:]:
            if s > cur_e:
                busy += cur_e - cur_s
                cur_s, cur_e = s, e
            else:
                cur_e = max(cur_e, e)
        busy += cur_e - cur_s
        last_end.append(max(e for _, e in intervals))
    sms = max(sm_count or 0, len(per_sm))
    first_idle = start if len(per_sm) < sms else min(last_end)
    return {
        "tiles": len(rows),
        "span_us": span / 1e3,
        "idle_fraction": 1 - busy / (sms * span) if span > 0 else None,
        "tail_us": (start + span - first_idle) / 1e3,
        "sms_used": len(per_sm),
    }


def timeline_figure(result: dict, title: str):
    """Side by side, tiled vs persistent: SM on y, time on x, one bar per tile,
    coloured by wave; the tail (some SMs already idle) shaded."""
    kernels = result.get("kernels", {})
    names = [n for n in ("tiled", "persistent") if n in kernels]
    fig = Figure(figsize=(12, 5.2), layout="constrained")
    axes = fig.subplots(1, max(1, len(names)), sharey=True, squeeze=False)
    cmap = matplotlib.colormaps["tab10"]
    sm_count = result.get("sm_count") or 0
    ctas = (result.get("tile_config") or {}).get("persistent_ctas") or sm_count
    spans = [timeline_stats(kernels[n]["rows"], sm_count)["span_us"] for n in names]
    xmax = max(spans + [1e-3])
    for ax, name in zip(axes[0], names):
        rows = kernels[name]["rows"]
        if not rows:
            ax.text(0.5, 0.5, kernels[name].get("note") or "no timeline", ha="center", va="center",
                    transform=ax.transAxes, wrap=True)
            ax.set_title(name)
            continue
        lanes, lane_of = _lanes(rows)
        wave = waves(name, rows, ctas)
        t0 = min(r[4] for r in rows)
        polys, colors = [], []
        for r, lane, w in zip(rows, lane_of, wave):
            n_lanes = lanes[r[2]]
            y0 = r[2] - 0.45 + 0.9 * lane / n_lanes
            y1 = y0 + 0.9 / n_lanes
            x0, x1 = (r[4] - t0) / 1e3, (r[5] - t0) / 1e3
            polys.append([(x0, y0), (x1, y0), (x1, y1), (x0, y1)])
            colors.append(cmap(w % 10))
        ax.add_collection(PolyCollection(polys, facecolors=colors, edgecolors="none"))
        stats = timeline_stats(rows, sm_count)
        if stats["tail_us"] > 0:
            ax.axvspan(stats["span_us"] - stats["tail_us"], stats["span_us"], color="red", alpha=0.08,
                       label="tail: some SMs idle")
            ax.legend(loc="lower right", fontsize=8)
        ax.set_xlim(0, xmax * 1.02)
        ax.set_ylim(-1, max(sm_count, max(r[2] for r in rows) + 1))
        ms = kernels[name].get("ms")
        ax.set_title(f"{name}: {stats['tiles']} tiles, grid {kernels[name].get('grid')} CTAs"
                     + (f", {ms:.3f} ms" if ms else ""), fontsize=10)
        ax.set_xlabel("time since first tile started (µs)")
    axes[0][0].set_ylabel("SM (%smid)")
    fig.suptitle(f"{title}\ncolour = wave (tiled: launch wave; persistent: loop iteration); shaded: tail",
                 fontsize=10)
    return fig


def timeline_summary(result: dict) -> str:
    """Markdown numbers per kernel and a short plain-words explanation."""
    kernels = result.get("kernels", {})
    sm_count = result.get("sm_count") or 0
    cfg = result.get("tile_config") or {}
    m, n, k = result.get("shape", [0, 0, 0])
    lines = [
        f"**{m}x{n}x{k} {result.get('dtype', '')}** on {sm_count} SMs: output tiles of "
        f"{cfg.get('block_m')}x{cfg.get('block_n')} (K step {cfg.get('block_k')}) give "
        f"**{cfg.get('tiles')} tiles**; persistent launches **{cfg.get('persistent_ctas')} CTAs**.",
        "",
        "| kernel | kernel time (ms) | tiles | grid (CTAs) | span of timeline (µs) | idle SM-time | tail (µs) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in ("tiled", "persistent"):
        if name not in kernels:
            continue
        kern = kernels[name]
        s = timeline_stats(kern["rows"], sm_count)
        idle = "" if s["idle_fraction"] is None else f"{100 * s['idle_fraction']:.1f}%"
        ms = "" if kern.get("ms") is None else f"{kern['ms']:.3f}"
        lines.append(f"| {name} | {ms} | {s['tiles']} | {kern.get('grid')} | {s['span_us']:.1f} | {idle} "
                     f"| {s['tail_us']:.1f} |")
    lines += [
        "",
        "Each bar is one output tile on the SM that computed it, from its first to its last "
        "instruction (`%globaltimer`). **tiled** launches one CTA per tile: the GPU runs them in "
        "waves, each new CTA pays its start-up (prologue loads) again, and when the tile count is "
        "not a multiple of what fits at once, the last wave leaves SMs idle (the shaded tail). "
        "**persistent** launches just enough CTAs to fill the GPU once; each loops over tiles and "
        "issues the next tile's loads before this tile's epilogue, so gaps between tiles shrink. "
        "Its tail is at most one tile long. *Idle SM-time* is the share of SMs x span with no tile running.",
    ]
    return "\n".join(lines)
