"""Loading persistent_matmul for a script, and running a rung or a variant of one.

``load_kernel`` loads the package the way users do (``kernels.get_kernel`` with
``LOCAL_KERNELS`` pointing at this repo); ``load_build`` loads one build folder
directly, for scripts that compare builds side by side. ``run_variant`` runs a
column of the benchmark tables by its name: a rung (``"persistent"``) or a rung
in another tile order or cluster size (``"persistent-grouped"``,
``"wgmma_persistent-cluster1"``).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
REPO_ID = "persistent-matmul/persistent-matmul"

# The benchmark's extra "<persistent rung>-<order>" columns: the tile orders
# other than the package's default (split tail).
TILE_ORDER_VARIANTS = ("grouped", "hilbert", "dynamic")
# "wgmma_persistent-cluster1": single CTAs (the default runs CTA pairs sharing B
# by multicast wherever the output has more than one row of tiles).
CLUSTER_VARIANT = "cluster1"
CLUSTER_SIZES = {"cluster1": 1, "cluster2": 2}


# A variant directory of build/ to load instead of the one the kernels loader
# picks for this torch: measures another variant on the same machine, e.g. the
# CUDA 12 one under a CUDA 13 torch (with libcudart.so.12 on LD_LIBRARY_PATH).
VARIANT_ENV = "PM_VARIANT"


def load_kernel(repo_root: Path = REPO_ROOT):
    """Load persistent_matmul as users do, from this repo's build.

    ``kernels.get_kernel(REPO_ID, version=1)`` with ``LOCAL_KERNELS`` pointing
    at ``repo_root`` (added to the variable if it does not name this repo
    already), falling back to ``kernels.get_local_kernel(repo_root/"build")``;
    with ``$PM_VARIANT`` set, that variant directory of build/, by path.
    Returns ``(module, how)`` where ``how`` says which loaded it.
    """
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    if os.environ.get(VARIANT_ENV):
        import kernels

        path = repo_root / "build" / os.environ[VARIANT_ENV]
        if not (path / "metadata.json").is_file():
            raise FileNotFoundError(f"${VARIANT_ENV}={os.environ[VARIANT_ENV]}: no variant {path}")
        return kernels.get_local_kernel(path), f"kernels.get_local_kernel({path.name}, ${VARIANT_ENV})"
    overrides = os.environ.get("LOCAL_KERNELS", "")
    if not any(entry.split("=", 1)[0] == REPO_ID for entry in overrides.split(":") if entry):
        entry = f"{REPO_ID}={repo_root}"
        os.environ["LOCAL_KERNELS"] = f"{overrides}:{entry}" if overrides else entry
    import kernels

    try:
        return kernels.get_kernel(REPO_ID, version=1), "kernels.get_kernel (LOCAL_KERNELS)"
    except Exception as exc:  # noqa: BLE001 - any failure: try the direct local load
        first_error = f"{type(exc).__name__}: {exc}"
    module = kernels.get_local_kernel(repo_root / "build")
    return module, f"kernels.get_local_kernel (get_kernel failed: {first_error})"


def load_build(folder: Path):
    """The package from one build folder (``kernels.get_local_kernel``): builds of
    different trees have different op namespaces, so several load side by side."""
    import kernels

    return kernels.get_local_kernel(folder)


def run_variant(pm, name: str, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """a @ b into out through a rung ("persistent") or a variant of one, as the
    benchmark and profile scripts name them: "<rung>-<tile order>" (any of the
    package's TileOrder names, for a persistent rung) or "wgmma_persistent-cluster1" /
    "wgmma_persistent-cluster2" (single CTAs / CTA pairs, whatever the kernel would pick)."""
    rung, _, variant = name.partition("-")
    if not variant:
        return pm.matmul(a, b, kernel=rung, out=out)
    if variant in CLUSTER_SIZES:
        return pm.matmul(a, b, kernel=rung, out=out, cluster_size=CLUSTER_SIZES[variant])
    if variant in {str(order) for order in pm.TileOrder}:
        return pm.matmul(a, b, kernel=rung, out=out, tile_order=variant)
    raise ValueError(f"unknown variant {variant!r} in {name!r}")
