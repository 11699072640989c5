"""Draw a benchmark_table.py result as a PNG: TFLOP/s per shape and rung, one panel per dtype.

    python scripts/plot_benchmark.py benchmarks/results/<date>-benchmark.json

writes benchmarks/results/<date>-benchmark.png next to it; the kernel card
(kernelpress/card.py) and the README show the newest one. benchmark_table.py
calls plot() itself.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def plot(result: dict, path: Path) -> Path:
    """Bar chart of every rung's TFLOP/s (log scale) per shape, torch.matmul included."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    dtypes = list(dict.fromkeys(r["dtype"] for r in rows))
    fig, axes = plt.subplots(len(dtypes), 1, figsize=(12, 4.2 * len(dtypes)), squeeze=False)
    env = result.get("environment", {})
    for ax, dtype in zip(axes[:, 0], dtypes):
        sub = [r for r in rows if r["dtype"] == dtype]
        names = [n for n in dict.fromkeys(k for r in sub for k in r["results"])
                 if any("tflops" in r["results"].get(n, {}) for r in sub)]
        width = 0.8 / max(1, len(names))
        for i, name in enumerate(names):
            xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(sub))]
            ys = [r["results"].get(name, {}).get("tflops", 0) or 0 for r in sub]
            ax.bar(xs, ys, width, label="cuBLAS (torch.matmul)" if name == "torch.matmul" else name)
        ax.set_xticks(range(len(sub)))
        ax.set_xticklabels([f"{r['m']}x{r['n']}x{r['k']}" for r in sub], rotation=20, ha="right")
        ax.set_yscale("log")
        ax.set_ylabel("TFLOP/s")
        ax.set_title(f"{dtype} on {env.get('gpu', 'GPU')} ({env.get('timestamp', '')[:10]})")
        ax.grid(axis="y", which="both", alpha=0.3)
        ax.legend(fontsize=8, ncol=len(names))
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    source = Path(sys.argv[1])
    print(plot(json.loads(source.read_text()), source.with_suffix(".png")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
