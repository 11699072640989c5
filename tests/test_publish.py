"""``kernelpress publish`` against a local Hub stand-in (tests/hub_server.py), through HfApi.

Each test gets its own server; the token is a recognizable fake, and every test that
prints checks that it never appears in stdout/stderr. The round trip places what was
published on branch v1 in an HF cache and loads it with kernels.get_kernel offline.

Findings about huggingface_hub 2.4 pinned here: ``repo_type="kernel"`` is accepted by
create_repo/create_commit/list_repo_tree (``constants.REPO_TYPES_WITH_KERNEL``); a commit
is not retried on 5xx (``_send_commit(retry_on_error=False)``), preupload is; the text of
an ``HfHubHTTPError`` holds the URL, status and server message but not the request
headers (test_hub_error_text_has_no_token).
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from hub_server import HubServer
from kernelpress import cli
from kernelpress.card import fill_card, latest_benchmark, latest_benchmark_plot
from kernelpress.publish import chunk, run_publish

TOKEN = "hf_FAKEtoken0123456789SECRETabcdefXYZ"
REPO_ID = "org/pm"
SPACE_ID = "org/pm-space"


@pytest.fixture
def hub():
    with HubServer() as server:
        yield server


@pytest.fixture(autouse=True)
def hf_env(monkeypatch, tmp_path):
    """No stored login, no token unless a test sets one, no telemetry."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    for key in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_ENDPOINT", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr("huggingface_hub.constants.HF_TOKEN_PATH", str(tmp_path / "hf_home" / "token"))


@pytest.fixture
def token(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    return TOKEN


@pytest.fixture
def repo_copy(tmp_path, repo_root, variant_dir) -> Path:
    """A copy of the kernel repo (sources, this machine's variant, benchmarks, space) that a
    test may edit, and that publishes whether or not build/ was built from a dirty tree."""
    dst = tmp_path / "repo"
    dst.mkdir()
    for name in ("build.toml", "CARD.md"):
        shutil.copy(repo_root / name, dst / name)
    skip = shutil.ignore_patterns("__pycache__", "screenshots")
    for name in ("csrc", "torch-ext", "space"):
        shutil.copytree(repo_root / name, dst / name, ignore=skip)
    shutil.copytree(variant_dir, dst / "build" / variant_dir.name, ignore=skip)
    # The copy is of a clean tree whatever the working copy's build says (a developer's build
    # of uncommitted sources is marked dirty, which publish refuses); test_dirty_build_needs_force
    # marks it dirty itself.
    mark_dirty(dst / "build" / variant_dir.name, False)
    (dst / "benchmarks" / "results").mkdir(parents=True)
    shutil.copy(repo_root / "benchmarks" / "benchmark_matmul.py", dst / "benchmarks")
    for pattern in ("*-benchmark.md", "*-benchmark.png"):  # the card's table and plot
        for f in (repo_root / "benchmarks" / "results").glob(pattern):
            shutil.copy(f, dst / "benchmarks" / "results")
    return dst


def mark_dirty(variant: Path, dirty: bool) -> None:
    """Set whether a built variant's metadata says it was built from a dirty tree (the
    digest excludes metadata.json, so the variant still passes its check)."""
    meta_path = variant / "metadata.json"
    meta = json.loads(meta_path.read_text())
    meta["provenance"]["kernel"]["dirty"] = dirty
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")


def local_kernel_files(repo: Path) -> dict[str, bytes]:
    files = {f"build/{p.relative_to(repo / 'build').as_posix()}": p.read_bytes()
             for p in (repo / "build").rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    files.update({f"benchmarks/{p.name}": p.read_bytes() for p in (repo / "benchmarks").glob("benchmark*.py")})
    return files


def managed(files: dict[str, bytes]) -> dict[str, bytes]:
    return {p: c for p, c in files.items() if p.startswith(("build/", "benchmarks/"))}


# The tests publish the variant this machine builds (CI builds only that one in full), so
# they pass --partial; test_missing_variants_are_refused_unless_partial checks the refusal.
def publish_cli(capsys, *args) -> tuple[int, str, str]:
    rc = cli.main(["publish", "--partial", *map(str, args)])
    out, err = capsys.readouterr()
    assert TOKEN not in out + err
    return rc, out, err


def publish_direct(repo: Path, hub: HubServer, **kw) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = run_publish(repo, repo_id=REPO_ID, endpoint=hub.url, out=out, err=err, **{"partial": True, **kw})
    assert TOKEN not in out.getvalue() + err.getvalue()
    return rc, out.getvalue(), err.getvalue()


# --- the happy path -------------------------------------------------------------------


def test_publish_kernel_card_and_space(hub, token, capsys, repo_copy, monkeypatch):
    rc, out, err = publish_cli(capsys, repo_copy, "--repo-id", REPO_ID, "--space-id", SPACE_ID,
                               "--endpoint", hub.url)
    assert rc == 0, err
    kernel = hub.repo("kernel", REPO_ID)
    assert set(kernel.branches) == {"main", "v1"}
    assert managed(kernel.branches["v1"]) == local_kernel_files(repo_copy)
    assert "benchmarks/benchmark_matmul.py" in kernel.branches["v1"]
    assert not any("__pycache__" in p for p in kernel.branches["v1"])

    readme = kernel.branches["main"]["README.md"].decode()
    assert "![TFLOP/s per shape and rung](benchmark.png)" in readme
    assert kernel.branches["main"]["benchmark.png"] == latest_benchmark_plot(repo_copy).read_bytes()
    assert readme == fill_card(repo_copy, REPO_ID)
    front = yaml.safe_load(readme.split("---\n")[1])
    assert front["library_name"] == "kernels" and front["license"] == "apache-2.0"
    assert f'get_kernel("{REPO_ID}", version=1)' in readme
    assert "README.md" not in managed(kernel.branches["v1"])

    space = hub.repo("space", SPACE_ID)
    assert space.sdk == "gradio"
    space_files = space.branches["main"]
    for name in ("app.py", "gpu_work.py", "README.md", "requirements.txt", "recorded/benchmark.json"):
        assert space_files[name] == (repo_copy / "space" / name).read_bytes()
    assert not any(p.startswith("screenshots/") or "__pycache__" in p for p in space_files)
    assert space.variables == {"PM_KERNEL_REPO": REPO_ID, "PM_KERNEL_VERSION": "1"}

    # The Hub exports Space variables as environment variables; the app reads them.
    sys.path.insert(0, str(repo_copy / "space"))
    try:
        import gpu_work

        for key, value in space.variables.items():
            monkeypatch.setenv(key, value)
        assert gpu_work.kernel_repo() == (REPO_ID, 1)
    finally:
        sys.path.remove(str(repo_copy / "space"))

    # The token went to the server (and only there).
    assert {r.authorization for r in hub.requests} == {f"Bearer {TOKEN}"}
    assert "published:" in out


def test_republish_deletes_stale_files_in_commits_of_at_most_1000(hub, token, repo_copy):
    """1200 stale files + the build: more than 1000 operations, so two commits on v1."""
    pre = hub.add_repo("kernel", REPO_ID)
    pre.branches["v1"] = {"build/old-variant/" + f"f{i}.py": b"x" for i in range(1200)}
    pre.branches["v1"]["benchmarks/benchmark_old.py"] = b"old"
    pre.branches["v1"]["benchmarks/results/keep.md"] = b"not ours? under benchmarks/: stale"
    pre.branches["v1"]["other/keep.txt"] = b"keep"
    pre.heads["v1"] = "0" * 40

    rc, out, err = publish_direct(repo_copy, hub)
    assert rc == 0, err
    v1 = hub.files("kernel", REPO_ID, "v1")
    assert managed(v1) == local_kernel_files(repo_copy)
    assert v1["other/keep.txt"] == b"keep"
    commits = [c for c in pre.commits if c["branch"] == "v1"]
    assert len(commits) == 2
    assert [len(c["ops"]) for c in commits] == [1000, len(local_kernel_files(repo_copy)) + 1202 - 1000]
    assert "build files commit 2/2" in out


def test_max_ops_splits_commits(hub, token, repo_copy):
    n = len(local_kernel_files(repo_copy))
    rc, out, err = publish_direct(repo_copy, hub, max_ops=3)
    assert rc == 0, err
    commits = [c for c in hub.repo("kernel", REPO_ID).commits if c["branch"] == "v1"]
    assert [len(c["ops"]) for c in commits] == [len(x) for x in chunk(list(range(n)), 3)]
    assert managed(hub.files("kernel", REPO_ID, "v1")) == local_kernel_files(repo_copy)


def test_latest_benchmark_is_the_greatest_dated_name(tmp_path):
    """The card takes the newest YYYY-MM-DD-benchmark.md (the greatest name: the date
    leads), and its plot only if one was drawn; other kinds and names do not count."""
    results = tmp_path / "benchmarks" / "results"
    results.mkdir(parents=True)
    assert latest_benchmark(tmp_path) is None
    (results / "2026-01-01-benchmark.md").write_text("a table\n")
    assert latest_benchmark(tmp_path).name == "2026-01-01-benchmark.md"
    assert latest_benchmark_plot(tmp_path) is None
    (results / "2026-01-03-benchmark.md").write_text("a later table\n")
    (results / "2026-01-02-benchmark.md").write_text("an earlier one, written last\n")
    (results / "2026-01-03-benchmark.png").write_bytes(b"png")
    for other in ("2026-01-09-model-benchmark.md", "2026-01-09-experiment-benchmark.md", "latest-benchmark.md",
                  "2026-01-09-benchmark.json"):
        (results / other).write_text("not the benchmark table\n")
    assert latest_benchmark(tmp_path).name == "2026-01-03-benchmark.md"
    assert latest_benchmark_plot(tmp_path).name == "2026-01-03-benchmark.png"


def test_chunk():
    assert [len(c) for c in chunk(list(range(2500)))] == [1000, 1000, 500]
    assert chunk([]) == [[]]
    with pytest.raises(ValueError):
        chunk([1], 0)


def test_round_trip_get_kernel_offline(hub, token, repo_copy, tmp_path, subprocess_env, variant_dir):
    """What v1 holds, placed in an HF cache, is what kernels.get_kernel loads offline."""
    rc, _, err = publish_direct(repo_copy, hub)
    assert rc == 0, err
    kernel = hub.repo("kernel", REPO_ID)
    sha = kernel.heads["v1"]
    cache = tmp_path / "hub_cache"
    repo_dir = cache / ("kernels--" + REPO_ID.replace("/", "--"))
    (repo_dir / "refs").mkdir(parents=True)
    (repo_dir / "refs" / "v1").write_text(sha)
    for path, content in kernel.branches["v1"].items():
        dest = repo_dir / "snapshots" / sha / path
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(content)
    so = next((repo_dir / "snapshots" / sha / "build" / variant_dir.name).glob("*.so"))
    so.chmod(0o755)
    env = dict(subprocess_env, HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1")
    env.pop("KERNELS_CACHE", None)
    code = textwrap.dedent("""
        import json, sys, kernels
        pm = kernels.get_kernel(sys.argv[1], version=1, trust_remote_code=True)
        print("RESULT " + json.dumps({"file": pm.__file__, "name": pm.__name__,
                                      "has_matmul": hasattr(pm, "matmul")}))
    """)
    proc = subprocess.run([sys.executable, "-c", code, REPO_ID], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    res = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])
    metadata = json.loads((variant_dir / "metadata.json").read_text())
    assert res["name"] == metadata["id"]
    assert res["has_matmul"]
    assert Path(res["file"]).resolve().is_relative_to((repo_dir / "snapshots" / sha).resolve())


# --- failures -------------------------------------------------------------------------


def test_server_error_mid_upload_reports_what_was_published(hub, token, repo_copy):
    hub.fail_commit = {2: 500}  # commit 1: build files 1/2, commit 2: build files 2/2
    rc, out, err = publish_direct(repo_copy, hub, max_ops=5)
    assert rc == 1
    assert f"published: kernel repo {REPO_ID} created, branch v1 created, stale files listed, " \
           "build files commit 1/2 on v1 (5 operations)" in err
    assert "NOT published: build files commit 2/2 on v1" in err
    assert "failed: HTTP 500: Internal Error" in err
    assert "README.md (card) on main" in err.split("NOT published:")[1]
    assert "README.md" not in hub.files("kernel", REPO_ID, "main")


def test_forbidden_repo_gives_permission_message(hub, token, repo_copy):
    hub.forbidden = {REPO_ID}
    rc, out, err = publish_direct(repo_copy, hub)
    assert rc == 1
    assert f"the token lacks write access to kernel repo {REPO_ID}" in err
    assert "HTTP 403" in err
    assert "published: nothing" in err


def test_hub_error_text_has_no_token(hub, token):
    """huggingface_hub's own HTTP error text does not carry the Authorization header."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    hub.forbidden = {REPO_ID}
    with pytest.raises(HfHubHTTPError) as info:
        HfApi(endpoint=hub.url, token=TOKEN).create_repo(REPO_ID, repo_type="kernel")
    assert info.value.response.status_code == 403
    assert TOKEN not in str(info.value) and TOKEN not in repr(info.value)
    assert TOKEN not in "".join(map(str, info.value.args))


def test_missing_build(hub, token, repo_copy):
    shutil.rmtree(repo_copy / "build")
    rc, out, err = publish_direct(repo_copy, hub)
    assert rc == 1
    assert "no build variants in" in err and "run `kernelpress build" in err
    assert hub.requests == []


def test_missing_variants_are_refused_unless_partial(hub, token, repo_copy, variant_dir):
    from kernelpress.build import planned_variant_names
    from kernelpress.config import load_config

    absent = [n for n in planned_variant_names(load_config(repo_copy)) if n != variant_dir.name]
    assert len(absent) == 3
    rc, out, err = publish_direct(repo_copy, hub, partial=False)
    assert rc != 0 and "make variants" in err and "--partial" in err
    assert all(name in err for name in absent)
    assert hub.requests == []
    rc, out, err = publish_direct(repo_copy, hub, partial=True)
    assert rc == 0 and all(name in err for name in absent) and "WARNING" in err


def test_failed_check_is_refused(hub, token, repo_copy, variant_dir):
    ops = repo_copy / "build" / variant_dir.name / "_ops.py"
    ops.write_text(ops.read_text() + "\n# edited\n")
    rc, out, err = publish_direct(repo_copy, hub)
    assert rc == 1
    assert "fails kernelpress check" in err and "digest" in err
    assert hub.requests == []


def test_dirty_build_needs_force(hub, token, repo_copy, variant_dir, capsys):
    mark_dirty(repo_copy / "build" / variant_dir.name, True)

    rc, out, err = publish_cli(capsys, repo_copy, "--repo-id", REPO_ID, "--endpoint", hub.url)
    assert rc == 1
    assert "dirty" in err and "--force" in err
    assert hub.requests == []

    rc, out, err = publish_cli(capsys, repo_copy, "--repo-id", REPO_ID, "--endpoint", hub.url, "--force")
    assert rc == 0, err
    assert any(line.startswith("WARNING: publishing a build built from a dirty") for line in err.splitlines())
    assert managed(hub.files("kernel", REPO_ID, "v1")) == local_kernel_files(repo_copy)


def test_no_token_is_a_dry_run_that_sends_nothing(hub, capsys, repo_copy, variant_dir):
    rc, out, err = publish_cli(capsys, repo_copy, "--repo-id", REPO_ID, "--space-id", SPACE_ID,
                               "--endpoint", hub.url)
    assert rc == 0, err
    assert hub.requests == []
    assert "DRY RUN (no Hugging Face token found" in out
    so = next(variant_dir.glob("*.so"))
    assert f"build/{variant_dir.name}/{so.name}  ({so.stat().st_size} bytes)" in out
    assert "benchmarks/benchmark_matmul.py" in out
    assert f"space repo {SPACE_ID} (sdk gradio)" in out
    assert "space variable PM_KERNEL_VERSION=1" in out


def test_dry_run_with_token_lists_deletions_and_writes_nothing(hub, token, capsys, repo_copy):
    pre = hub.add_repo("kernel", REPO_ID)
    pre.branches["v1"] = {"build/old/x.py": b"x", "other.txt": b"y"}
    pre.heads["v1"] = "1" * 40
    before = {k: {b: dict(f) for b, f in r.branches.items()} for k, r in hub.repos.items()}
    rc, out, err = publish_cli(capsys, repo_copy, "--repo-id", REPO_ID, "--endpoint", hub.url, "--dry-run")
    assert rc == 0, err
    assert "DRY RUN (--dry-run)" in out
    assert "    delete build/old/x.py" in out and "other.txt" not in out
    assert {r.method for r in hub.requests} == {"GET"}
    assert {k: {b: dict(f) for b, f in r.branches.items()} for k, r in hub.repos.items()} == before


# --- card and benchmarks --------------------------------------------------------------


def test_card_uses_newest_benchmark_and_metadata_archs(repo_copy, variant_dir):
    (repo_copy / "benchmarks" / "results" / "2099-01-01-benchmark.md").write_text(
        "# Run\n\n| M x N x K | TFLOP/s |\n|---|---|\n| 1x1x1 | 42.0 |\n")
    card = fill_card(repo_copy, "someone/else")
    front = yaml.safe_load(card.split("---\n")[1])
    assert front["library_name"] == "kernels" and front["license"] == "apache-2.0"
    assert 'get_kernel("someone/else", version=1)' in card
    assert "persistent-matmul/persistent-matmul" not in card.split("## Benchmark")[0]
    archs = json.loads((variant_dir / "metadata.json").read_text())["backend"]["archs"]
    assert f"| `{variant_dir.name}` | torch >= 2.10 built with CUDA 13.0 or a newer 13.x, on x86-64 Linux | " \
           f"{', '.join(archs)} |" in card
    assert "| `persistent` | `portable` |" in card
    bench = card.split("## Benchmark")[1]
    assert "2099-01-01-benchmark.md" in bench and "| 1x1x1 | 42.0 |" in bench and "### Run" in bench
    assert card.count("## Builds") == 1 and card.count("## Benchmark\n") == 1


def test_benchmark_classes_are_discovered_and_run_on_cpu(repo_root):
    """kernels' own discovery finds one class per rung; a workload runs with a stand-in kernel."""
    import torch
    from kernels.benchmark import Benchmark
    from kernels.cli.benchmark import discover_benchmark_classes, discover_benchmark_scripts

    scripts = discover_benchmark_scripts("local", repo_root)
    assert [s.name for s in scripts] == ["benchmark_matmul.py"]
    classes = {c.__name__: c for c in discover_benchmark_classes(scripts[0], repo_root)}
    assert set(classes) == {"Naive", "Warptiled", "Tiled", "Persistent"}
    for cls in classes.values():
        assert issubclass(cls, Benchmark)
        workloads = [n[len("benchmark_"):] for n in dir(cls) if n.startswith("benchmark_")]
        assert workloads and all(hasattr(cls, f"setup_{w}") and hasattr(cls, f"verify_{w}") for w in workloads)

    class StandIn:  # what the kernel's matmul does, on the CPU
        calls = []

        def matmul(self, a, b, *, kernel, out):
            self.calls.append(kernel)
            return torch.matmul(a, b, out=out)

    bench = classes["Naive"]()
    bench.kernel, bench.device = StandIn(), "cpu"
    bench.setup_fp32_512()
    bench.benchmark_fp32_512()
    assert StandIn.calls == ["naive"]
    assert torch.allclose(bench.out, bench.verify_fp32_512(), atol=1e-2)
    assert 0.02 < bench.out.std().item() < 0.1  # scaled for kernels' absolute tolerance
