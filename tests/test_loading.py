"""Every way the built kernel loads (LOCAL_KERNELS, offline from the HF cache,
get_local_kernel, ``kernels info``) and its op schema, each in a fresh interpreter.

Each child process gets its environment before it imports huggingface_hub
(which reads HF_HUB_OFFLINE, HF_HOME and HF_HUB_CACHE at import time), prints
one `RESULT <json>` line, and the test asserts on that. The expected kernel id
comes from the variant's metadata.json, which the build wrote.

Findings about kernels 0.17.2 that these tests pin down:

* LOCAL_KERNELS needs no trust_remote_code: its resolver (RepoPathsResolver)
  comes before the Hub resolvers and never runs the publisher trust check.
  It needs no HF_HUB_OFFLINE either; nothing touches the Hub.
* Offline (HF_HUB_OFFLINE=1), the trust check cannot ask the Hub, so kernels
  skips it with a logged warning: get_kernel loads an untrusted org's cached
  kernel even without trust_remote_code. It does not fail.
* `kernels info <repo root>` prints name, version, license, ... and the
  backends ("cuda"), but not the variant names. It only takes a repo root
  (it looks in `<dir>/build`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO_ID = "persistent-matmul/persistent-matmul"
FAKE_SHA = "0123456789abcdef0123456789abcdef01234567"
# matmul_out, the op every checked product goes through.
SCHEMA_ARGS = ("Tensor a, Tensor b, Tensor? bias, Tensor(a!) out, str kernel, int tile_order=-1, "
               "int cluster_size=0, Tensor(b!)? timeline=None")
TIMEOUT = 180

# Shared by the children that load the kernel: what it is and where it came from.
DESCRIBE = """
import json, sys
import torch
import kernels

def describe(pm):
    loaded = [k for k in kernels.get_loaded_kernels() if k.module is pm]
    ns = getattr(torch.ops, pm.__name__)
    try:
        pm.matmul(torch.randn(2, 3), torch.randn(3, 4))
        error = None
    except Exception as e:
        error = [type(e).__name__, str(e)]
    return {
        "name": pm.__name__,
        "file": pm.__file__,
        "metadata_id": loaded[0].metadata.id if loaded else None,
        "metadata_name": str(loaded[0].metadata.name) if loaded else None,
        "metadata_version": loaded[0].metadata.version if loaded else None,
        "has_matmul_out": hasattr(ns, "matmul_out"),
        "schema": str(ns.matmul_out.default._schema) if hasattr(ns, "matmul_out") else None,
        "prefix": pm._ops.add_op_namespace_prefix("matmul_out"),
        "all": list(pm.__all__),
        "available": {k: [v.available, v.reason] for k, v in pm.available_kernels().items()},
        "matmul_error": error,
    }

def report(result):
    print("RESULT " + json.dumps(result), flush=True)
"""


@pytest.fixture(scope="module")
def metadata(variant_dir) -> dict:
    return json.loads((variant_dir / "metadata.json").read_text())


@pytest.fixture
def env(subprocess_env) -> dict:
    env = dict(subprocess_env)
    env.pop("KERNELS_CACHE", None)  # would override the HF cache dir for kernels
    return env


def run_child(code: str, env: dict, cwd: Path, *args) -> subprocess.CompletedProcess:
    # cwd is a scratch dir, so `python -c` cannot import anything from the repo by accident.
    return subprocess.run(
        [sys.executable, "-c", DESCRIBE + textwrap.dedent(code), *map(str, args)],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def result_of(proc: subprocess.CompletedProcess) -> dict:
    where = f"\n--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
    assert proc.returncode == 0, f"child exited with {proc.returncode}{where}"
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, f"expected one RESULT line{where}"
    return json.loads(lines[0][len("RESULT "):])


def assert_loaded_build(res: dict, metadata: dict, variant_path: Path) -> None:
    """The child loaded our build from variant_path, with its ops registered."""
    kid = metadata["id"]
    assert res["name"] == kid
    assert res["metadata_id"] == kid
    assert res["metadata_name"] == metadata["name"]
    assert res["metadata_version"] == metadata["version"]
    assert Path(res["file"]).resolve() == (variant_path / "__init__.py").resolve()
    assert res["has_matmul_out"], f"torch.ops.{kid}.matmul_out is not registered"
    assert SCHEMA_ARGS in res["schema"]
    assert res["prefix"] == f"{kid}::matmul_out"
    assert {"matmul", "linear", "available_kernels", "KERNELS", "layers"} <= set(res["all"])
    assert "naive" in res["available"]
    assert all(not ok and "no CUDA device" in why for ok, why in res["available"].values())
    assert res["matmul_error"] is not None
    etype, msg = res["matmul_error"]
    assert etype == "RuntimeError" and "no CUDA device" in msg, res["matmul_error"]


# --- a. LOCAL_KERNELS -----------------------------------------------------------


def test_local_kernels_override(env, tmp_path, repo_root, variant_dir, metadata):
    # No trust_remote_code and no HF_HUB_OFFLINE: the LOCAL_KERNELS resolver runs
    # first and does no publisher trust check (kernels 0.17.2, load.py/resolver.py).
    env["LOCAL_KERNELS"] = f"{REPO_ID}={repo_root}"
    code = """
    pm = kernels.get_kernel(sys.argv[1], version=1)
    report(describe(pm))
    """
    res = result_of(run_child(code, env, tmp_path, REPO_ID))
    assert_loaded_build(res, metadata, variant_dir)
    # Nothing was downloaded into the (empty) HF home.
    hub = Path(env["HF_HOME"]) / "hub"
    assert not hub.exists() or not any(hub.rglob("*.py"))


def test_local_kernels_without_build_fails_cleanly(env, tmp_path):
    empty = tmp_path / "not-built"
    (empty / "torch-ext").mkdir(parents=True)
    env["LOCAL_KERNELS"] = f"{REPO_ID}={empty}"
    env["HF_HUB_OFFLINE"] = "1"  # belt and braces: never reach for the Hub
    code = """
    pm = kernels.get_kernel(sys.argv[1], version=1)
    report({"loaded": pm.__file__})
    """
    proc = run_child(code, env, tmp_path, REPO_ID)
    assert proc.returncode > 0, (proc.returncode, proc.stderr)  # an exception, not a signal
    assert "RESULT" not in proc.stdout
    assert "FileNotFoundError: Cannot find a build variant for this system in" in proc.stderr
    assert str(empty) in proc.stderr


# --- b. Offline, from the HF cache ----------------------------------------------


def make_hub_cache(cache: Path, variant_dir: Path) -> Path:
    """The layout huggingface_hub's snapshot_download(repo_type="kernel") reads offline:
    <cache>/kernels--org--name/refs/v1 (a commit sha) and snapshots/<sha>/build/<variant>/."""
    repo_dir = cache / ("kernels--" + REPO_ID.replace("/", "--"))
    (repo_dir / "refs").mkdir(parents=True)
    (repo_dir / "refs" / "v1").write_text(FAKE_SHA)  # no newline, as huggingface_hub writes it
    snapshot_variant = repo_dir / "snapshots" / FAKE_SHA / "build" / variant_dir.name
    shutil.copytree(variant_dir, snapshot_variant, ignore=shutil.ignore_patterns("__pycache__"))
    return snapshot_variant


@pytest.mark.parametrize("cache_var", ["HF_HUB_CACHE", "HF_HOME"])
def test_offline_hub_cache(env, tmp_path, variant_dir, metadata, cache_var):
    if cache_var == "HF_HUB_CACHE":
        cache = tmp_path / "hub_cache"
        env["HF_HUB_CACHE"] = str(cache)
    else:  # the default cache dir, $HF_HOME/hub
        cache = Path(env["HF_HOME"]) / "hub"
    snapshot_variant = make_hub_cache(cache, variant_dir)
    env["HF_HUB_OFFLINE"] = "1"
    code = """
    repo_id, sha = sys.argv[1], sys.argv[2]
    pm = kernels.get_kernel(repo_id, version=1, trust_remote_code=True)
    res = describe(pm)
    # Offline, kernels cannot check the publisher, so it warns and loads anyway.
    untrusted = kernels.get_kernel(repo_id, version=1)
    res["untrusted_same"] = untrusted is pm
    res["by_revision_same"] = kernels.get_kernel(repo_id, revision=sha, trust_remote_code=True) is pm
    try:
        kernels.get_kernel(repo_id, version=2, trust_remote_code=True)
        res["v2_error"] = None
    except Exception as e:
        res["v2_error"] = [type(e).__name__, str(e)]
    report(res)
    """
    proc = run_child(code, env, tmp_path, REPO_ID, FAKE_SHA)
    res = result_of(proc)
    assert_loaded_build(res, metadata, snapshot_variant)
    assert Path(res["file"]).resolve().is_relative_to(cache.resolve())
    assert res["untrusted_same"] is True
    assert f"Skipping publisher trust check for '{REPO_ID}' because Hugging Face Hub is in offline mode" in proc.stderr
    assert res["by_revision_same"] is True
    assert res["v2_error"] is not None
    assert res["v2_error"][0] == "ValueError"
    assert "Version 2 not found, available versions: 1" in res["v2_error"][1]


# --- c. get_local_kernel ----------------------------------------------------------


@pytest.mark.parametrize("which", ["build", "variant", "repo_root"])
def test_get_local_kernel(env, tmp_path, repo_root, variant_dir, metadata, which):
    path = {"build": repo_root / "build", "variant": variant_dir, "repo_root": repo_root}[which]
    code = """
    from pathlib import Path
    pm = kernels.get_local_kernel(Path(sys.argv[1]))
    report(describe(pm))
    """
    res = result_of(run_child(code, env, tmp_path, path))
    assert_loaded_build(res, metadata, variant_dir)


# --- d. kernels info --------------------------------------------------------------


def _kernels_cli() -> str:
    cli = Path(sys.executable).with_name("kernels")
    if not cli.exists():
        found = shutil.which("kernels")
        if found is None:
            pytest.skip("no `kernels` console script next to the interpreter or on PATH")
        return found
    return str(cli)


def test_kernels_info(env, tmp_path, repo_root, metadata):
    cli = _kernels_cli()
    proc = subprocess.run(
        [cli, "info", "--json", str(repo_root)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["path"] == str(repo_root)
    assert info["name"] == metadata["name"]
    assert info["version"] == metadata["version"]
    assert info["license"] == metadata["license"]
    assert info["python_depends"] == metadata["python-depends"]
    assert info["backends"] == [metadata["backend"]["type"]]

    human = subprocess.run(
        [cli, "info", str(repo_root)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert human.returncode == 0, human.stderr
    lines = human.stdout.splitlines()
    assert f"Name: {metadata['name']}" in lines
    assert f"Version: {metadata['version']}" in lines
    assert f"Backends: {metadata['backend']['type']}" in lines
    # kernels 0.17.2 prints no variant names (only backends), so there is no variant to check here.


# --- e. op schema, in this process ------------------------------------------------


def test_op_schema(pm, metadata):
    import torch

    assert pm.__name__ == metadata["id"]
    op = getattr(torch.ops, metadata["id"]).matmul_out.default
    schema = str(op._schema)
    assert schema == f"{metadata['id']}::matmul_out({SCHEMA_ARGS}) -> ()"
    args = op._schema.arguments
    assert [a.name for a in args] == ["a", "b", "bias", "out", "kernel", "tile_order", "cluster_size", "timeline"]
    writes = [a.alias_info is not None and a.alias_info.is_write for a in args]
    assert writes == [False, False, False, True, False, False, False, True]
