"""Where a result was measured: the GPU, its clocks, the versions and the commit.

``environment(pm, how)`` collects it as a dict (stored in every results JSON),
``environment_lines`` writes it as the ``- Label: value`` header of every results
Markdown file (demo.py and kernelpress's card read the ``GPU`` and ``Date``
lines back out).
"""

from __future__ import annotations

import datetime
import json
import shlex
import subprocess
import sys
from pathlib import Path

import torch

from .kernel import REPO_ROOT


def variant_metadata(pm) -> tuple[str, dict]:
    """The loaded module's variant directory name and its parsed metadata.json."""
    variant_dir = Path(pm.__file__).resolve().parent
    try:
        metadata = json.loads((variant_dir / "metadata.json").read_text())
    except (OSError, ValueError):
        metadata = {}
    return variant_dir.name, metadata


def _run_text(args: list[str], cwd: Path | None = None) -> str | None:
    """stdout of a command, stripped, or None if it cannot run or fails."""
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=20, cwd=cwd, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def git_commit(metadata: dict, repo_root: Path = REPO_ROOT) -> tuple[str | None, str]:
    """The source commit of what was measured: the commit the loaded build was
    made from (its metadata.json provenance), else ``git rev-parse HEAD`` of the
    checkout. A build copied onto the GPU machine runs beside a checkout whose git
    history may be older than the build, so the build's own record comes first,
    and a checkout at another commit is named beside it. Returns
    ``(commit or None, where it came from)``."""
    head = _run_text(["git", "rev-parse", "HEAD"], cwd=repo_root)
    kernel = metadata.get("provenance", {}).get("kernel", {})
    if kernel.get("commit"):
        source = "metadata.json provenance" + (" (dirty build)" if kernel.get("dirty") else "")
        if head and head != kernel["commit"]:
            source += f"; checkout at {head[:12]}"
        return kernel["commit"], source
    if head:
        dirty = _run_text(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo_root)
        return head, "git rev-parse HEAD" + (" (tracked files modified)" if dirty else "")
    return None, "unknown: no git checkout and no commit in metadata.json provenance"


def gpu_clocks() -> dict:
    """Current SM clock, max SM clock and power draw from nvidia-smi (empty if unavailable)."""
    text = _run_text(["nvidia-smi", "--query-gpu=clocks.sm,clocks.max.sm,power.draw",
                      "--format=csv,noheader"])
    if not text:
        return {}
    fields = [f.strip() for f in text.splitlines()[0].split(",")]
    return dict(zip(("sm_clock", "max_sm_clock", "power_draw"), fields))


def environment(pm=None, how_loaded: str | None = None) -> dict:
    """Everything a recorded result must carry about where it was measured."""
    env: dict = {
        "timestamp": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
    }
    if torch.cuda.is_available():
        device = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(device)
        env.update(
            gpu=props.name,
            sm_count=props.multi_processor_count,
            compute_capability=f"{props.major}.{props.minor}",
            l2_cache_mb=round(getattr(props, "L2_cache_size", 0) / 1e6, 1),
            memory_gib=round(props.total_memory / 2**30, 1),
        )
        env["driver"] = _run_text(["nvidia-smi", "--query-gpu=driver_version",
                                   "--format=csv,noheader"])
        if env["driver"]:
            env["driver"] = env["driver"].splitlines()[0]
        env.update(gpu_clocks())
    if pm is not None:
        variant, metadata = variant_metadata(pm)
        env["variant"] = variant
        env["kernel_id"] = metadata.get("id")
        env["loaded_with"] = how_loaded
        env["git_commit"], env["commit_source"] = git_commit(metadata)
    return env


def command_line(argv: list[str] | None = None) -> str:
    """The running command (``sys.argv``) as typed from the repo root: ``python
    scripts/<name>.py ...``, so a results file says how to measure it again."""
    argv = list(sys.argv if argv is None else argv)
    script = Path(argv[0]).resolve()
    if script.is_relative_to(REPO_ROOT):
        script = script.relative_to(REPO_ROOT)
    return shlex.join(["python", str(script), *argv[1:]])


ENV_LABELS = (
    ("timestamp", "Date"),
    ("gpu", "GPU"),
    ("sm_count", "SMs"),
    ("compute_capability", "Compute capability"),
    ("l2_cache_mb", "L2 (MB)"),
    ("sm_clock", "SM clock"),
    ("max_sm_clock", "Max SM clock"),
    ("power_draw", "Power draw"),
    ("driver", "Driver"),
    ("torch", "torch"),
    ("torch_cuda", "torch CUDA"),
    ("variant", "Variant"),
    ("kernel_id", "Kernel id"),
    ("loaded_with", "Loaded with"),
    ("git_commit", "Commit"),
    ("commit_source", "Commit from"),
    ("command", "Command"),
)


def environment_lines(env: dict) -> list[str]:
    """The environment as Markdown list items, ``- Label: value`` (demo.py parses
    the ``GPU`` line back out of recorded files)."""
    return [f"- {label}: {env[key]}" for key, label in ENV_LABELS if env.get(key) is not None]
