"""The kernel card: ``CARD.md`` filled in at publish time, uploaded as the Hub repo's README.md.

``fill_card(repo, repo_id)`` is a pure function of the files in the repo (CARD.md,
build.toml, build/<variant>/metadata.json, benchmarks/results/<date>-benchmark.md): it

* sets the front matter the Hub needs: ``library_name: kernels`` and ``license``
  (build.toml's license, lower-cased as the Hub spells identifiers);
* points every ``get_kernel("...", version=N)`` at ``repo_id`` and the built version;
* replaces the ``## Builds`` section with the variants, the torch builds that load each,
  and their CUDA archs from metadata.json, and a table of which rung has code for which archs (build.toml's ``[kernel.*]``
  sections: a rung is the ``csrc/<rung>.cu`` source of a section);
* replaces (or appends) a ``## Benchmark`` section with the newest
  ``benchmarks/results/YYYY-MM-DD-benchmark.md`` (the greatest such name: the date leads).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from .check import variant_cuda, variant_machine
from .config import load_config
from .variants import serves

FRONT_MATTER = re.compile(r"\A---\n(.*?)\n---\n", re.S)
BENCHMARK_TABLE = re.compile(r"\d{4}-\d{2}-\d{2}-benchmark\.md")  # benchmarks/results/README.md: the names
GET_KERNEL = re.compile(r"get_kernel\(\s*\"[^\"]*\"\s*,\s*version\s*=\s*\d+")


def read_variants(repo: Path) -> dict[str, dict]:
    """``{variant name: metadata.json}`` for every ``build/<variant>/``."""
    build = Path(repo) / "build"
    return {
        d.name: json.loads((d / "metadata.json").read_text())
        for d in sorted(build.iterdir())
        if d.is_dir() and (d / "metadata.json").is_file()
    } if build.is_dir() else {}


def latest_benchmark(repo: Path) -> Path | None:
    """The newest ``benchmarks/results/YYYY-MM-DD-benchmark.md`` (benchmark_table.py's
    table), or None; other kinds (``...-model-benchmark.md``) do not count."""
    found = (Path(repo) / "benchmarks" / "results").glob("*-benchmark.md")
    return max((p for p in found if BENCHMARK_TABLE.fullmatch(p.name)), key=lambda p: p.name, default=None)


def _replace_section(body: str, title: str, new: str) -> str:
    """Replace the ``## title`` section (up to the next ``## `` heading) or append ``new``."""
    pattern = re.compile(rf"^## {re.escape(title)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(body):
        return pattern.sub(lambda _: new.rstrip("\n") + "\n\n", body, count=1).rstrip("\n") + "\n"
    return body.rstrip("\n") + "\n\n" + new.rstrip("\n") + "\n"


def _served(config, name: str) -> str:
    """Which torch builds load a variant (kernelpress.variants.serves), or "?"."""
    cuda, machine, abi = variant_cuda(name), variant_machine(name), config.torch.stable_abi_version
    return serves(cuda, machine, abi) if cuda and machine and abi else "?"


def _builds_section(config, variants: dict[str, dict]) -> str:
    lines = ["## Builds", "", "| variant | loaded by | CUDA archs | op namespace |", "|---|---|---|---|"]
    for name, meta in variants.items():
        archs = ", ".join(meta.get("backend", {}).get("archs", []))
        lines.append(f"| `{name}` | {_served(config, name)} | {archs} | `{meta.get('id', '?')}` |")
    lines += ["", "Which rung has code for which archs (`+PTX`: PTX as well, for newer GPUs):", "",
              "| rung | kernel section | CUDA archs |", "|---|---|---|"]
    for section in config.kernels:
        for src in section.src:
            if src.endswith(".cu"):
                lines.append(f"| `{Path(src).stem}` | `{section.name}` | {', '.join(section.cuda_capabilities)} |")
    commits = {m.get("provenance", {}).get("kernel", {}).get("commit") for m in variants.values()} - {None}
    if commits:
        lines += ["", f"Built by kernelpress from commit `{', '.join(sorted(commits))}`."]
    return "\n".join(lines) + "\n"


CARD_PLOT = "benchmark.png"  # the latest benchmark plot, published beside README.md on main


def latest_benchmark_plot(repo: Path) -> Path | None:
    """The plot drawn for the newest benchmark table (same name, .png), or None."""
    table = latest_benchmark(repo)
    plot = table.with_suffix(".png") if table is not None else None
    return plot if plot is not None and plot.is_file() else None


def _benchmark_section(repo: Path) -> str | None:
    path = latest_benchmark(repo)
    if path is None:
        return None
    text = path.read_text().strip()
    text = re.sub(r"^#{1,2} ", "### ", text, flags=re.M)  # keep the file's headings below ours
    figure = f"![TFLOP/s per shape and rung]({CARD_PLOT})\n\n" if latest_benchmark_plot(repo) else ""
    return (f"## Benchmark\n\nThe latest recorded run (`benchmarks/results/{path.name}`; ratios are to "
            f"`torch.matmul` in the same run). Reproduce with `kernels benchmark`, which runs "
            f"`benchmarks/benchmark_matmul.py` from this repo.\n\n{figure}{text}\n")


def fill_card(repo: Path | str, repo_id: str) -> str:
    """The filled kernel card (README.md text) for ``repo`` published as ``repo_id``."""
    repo = Path(repo)
    config = load_config(repo)
    variants = read_variants(repo)
    versions = {m.get("version") for m in variants.values()} or {config.version}
    version = sorted(versions)[0]
    template = (repo / "CARD.md").read_text() if (repo / "CARD.md").is_file() else f"# {config.name}\n"

    m = FRONT_MATTER.match(template)
    meta = (yaml.safe_load(m.group(1)) or {}) if m else {}
    body = template[m.end():] if m else template
    meta["library_name"] = "kernels"
    meta["license"] = config.license.lower()
    front = yaml.safe_dump(meta, sort_keys=False, allow_unicode=True).strip()

    body = GET_KERNEL.sub(f'get_kernel("{repo_id}", version={version}', body)
    if "get_kernel(" not in body:
        body = _replace_section(body, "Use", "## Use\n\n```python\nfrom kernels import get_kernel\n\n"
                                f'kernel = get_kernel("{repo_id}", version={version})\n```\n')
    body = _replace_section(body, "Builds", _builds_section(config, variants))
    bench = _benchmark_section(repo)
    if bench:
        body = _replace_section(body, "Benchmark", bench)
    return f"---\n{front}\n---\n{body}"
