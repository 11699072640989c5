"""The files of benchmarks/results/: one name scheme, ``YYYY-MM-DD-<kind>.<ext>``.

A kind is what a script measures (``benchmark``, ``correctness``,
``model-benchmark``, ...; benchmarks/results/README.md lists them and their
scripts). The directory keeps each kind's current run of record; older runs
live in git history. Because the date leads the name, a kind's newest file is
simply the greatest name.
"""

from __future__ import annotations

import datetime
import re
from pathlib import Path

from .kernel import REPO_ROOT

RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"


def result_path(directory: Path, kind: str, ext: str, date: datetime.date | None = None) -> Path:
    """``directory/<date>-<kind>.<ext>``, today's date unless one is given."""
    return Path(directory) / f"{(date or datetime.date.today()).isoformat()}-{kind}.{ext}"


def latest_result(directory: Path, kind: str, ext: str = "md") -> Path | None:
    """The newest ``YYYY-MM-DD-<kind>.<ext>`` in ``directory`` (None if there is none).
    Only that exact kind counts: ``correctness`` does not match
    ``2026-01-01-correctness-splitk.md``."""
    name = re.compile(rf"\d{{4}}-\d{{2}}-\d{{2}}-{re.escape(kind)}\.{re.escape(ext)}")
    directory = Path(directory)
    found = [p for p in directory.glob(f"*-{kind}.{ext}") if name.fullmatch(p.name)] if directory.is_dir() else []
    return max(found, key=lambda p: p.name, default=None)
