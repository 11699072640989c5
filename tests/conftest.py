"""Shared fixtures: the repo's built variant, the kernel loaded from it, the `gpu` marker, and a
kernelpress cache for the whole test run."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
REPO_ID = "persistent-matmul/persistent-matmul"


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


_cache_before: str | None = None  # KERNELPRESS_CACHE as it was before pytest started


def pytest_configure(config):
    """kernelpress's content cache (check's sm_90a summaries) in a directory of
    this test run's own: shared by every test (and their child processes) that
    checks the same build, and never writing to the user's ~/.cache or a cache set
    before pytest. It starts with a copy of that cache's summaries: each is named by
    the bytes of the library it describes, so the one `make check` has just made of
    this build is read, not made again (disassembling a build takes ~30-60 s)."""
    import shutil
    import tempfile

    global _cache_before
    _cache_before = os.environ.get("KERNELPRESS_CACHE")
    ours = Path(tempfile.mkdtemp(prefix="kernelpress-cache-"))
    try:
        from kernelpress.check import cache_dir
        for entry in cache_dir().glob("sm90a-summary-*.json"):
            shutil.copy2(entry, ours)
    except (ImportError, OSError):
        pass  # an unreadable cache: the summaries are made again
    os.environ["KERNELPRESS_CACHE"] = str(ours)


def pytest_unconfigure(config):
    import shutil

    shutil.rmtree(os.environ.pop("KERNELPRESS_CACHE", ""), ignore_errors=True)
    if _cache_before is not None:
        os.environ["KERNELPRESS_CACHE"] = _cache_before


def pytest_collection_modifyitems(config, items):
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the device)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def variant_dir(repo_root) -> Path:
    """The variant directory this machine's torch loads, as the kernels loader
    chooses among build/'s (`make variants` puts four there), built by
    kernelpress first if there is none.

    `make test` builds before running pytest, so this normally finds the build.
    $PM_VARIANT names another variant of build/ to test (scripts/harness/kernel.py).
    """
    from kernels.variants import parse_variant, resolve_variant

    found = {p.name: p for p in (repo_root / "build").glob("torch-*")}
    if os.environ.get("PM_VARIANT"):
        assert os.environ["PM_VARIANT"] in found, f"$PM_VARIANT: no such variant in build/ ({sorted(found)})"
        return found[os.environ["PM_VARIANT"]]
    if not found:
        from kernelpress.build import build

        return build(repo_root, out=sys.stderr).variant_dir
    chosen, trace = resolve_variant([parse_variant(name) for name in found])
    assert chosen is not None, f"no variant in build/ for this torch: {trace}"
    return found[chosen.variant_str]


@pytest.fixture(scope="session")
def pm(variant_dir):
    """The persistent_matmul module, loaded from its variant directory with kernels.get_local_kernel."""
    from kernels import get_local_kernel

    return get_local_kernel(variant_dir)


@pytest.fixture
def subprocess_env(tmp_path) -> dict:
    """An environment for child processes that reaches no Hub and no user cache."""
    env = dict(os.environ)
    for key in ("LOCAL_KERNELS", "HF_HUB_OFFLINE", "HF_HOME", "HF_HUB_CACHE"):
        env.pop(key, None)
    env["HF_HOME"] = str(tmp_path / "hf_home")
    env["HF_HUB_DISABLE_TELEMETRY"] = "1"
    return env
