"""``kernelpress publish``: put a checked build on the Hub, with its card and its Space.

What it does (the layout the Hub expects of a kernel repo; the same steps as
``kernel-builder upload``):

1. kernel repo ``create_repo(repo_id, repo_type="kernel", exist_ok=True)``;
2. branch ``v<version>`` (version from the variants' metadata.json, which must agree);
3. upload ``build/<variant>/**`` and ``benchmarks/benchmark*.py`` to that branch, deleting
   files under ``build/`` and ``benchmarks/`` there that this build does not have, in
   commits of at most ``max_ops`` (1000) operations;
4. the filled card (``kernelpress.card.fill_card``) as README.md on ``main``;
5. with a Space id: ``create_repo(space_id, repo_type="space", space_sdk="gradio")``,
   upload ``space/`` (no ``__pycache__``, no ``screenshots/``) to its ``main`` and set the
   Space variables ``PM_KERNEL_REPO`` / ``PM_KERNEL_VERSION``, which the Hub exports as
   environment variables and ``space/gpu_work.py: kernel_repo()`` reads.

Before anything is sent, the build must hold every variant kernelpress builds
(``make variants``; ``--partial`` publishes the variants there are, with a WARNING), pass
``kernelpress check``, and its metadata must not say it was built from a dirty tree
(``--force`` publishes a dirty build, with a WARNING). Without a token (``HF_TOKEN`` or a stored login) publish is a dry run: it prints
the plan and sends nothing. The token is never printed: every message that leaves this
module goes through ``_redact``.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from .card import CARD_PLOT, fill_card, latest_benchmark_plot, read_variants

MAX_OPS_PER_COMMIT = 1000
MANAGED_PREFIXES = ("build/", "benchmarks/")  # what publish owns on the version branch
SPACE_SKIP_DIRS = ("__pycache__", "screenshots")


class PublishError(RuntimeError):
    """Publishing was refused or failed; the message says what was and wasn't published."""


@dataclass(frozen=True)
class LocalFile:
    path_in_repo: str
    local: Path

    @property
    def size(self) -> int:
        return self.local.stat().st_size


@dataclass
class Plan:
    """Everything publish will create and upload, computed from local files only."""

    repo: Path
    repo_id: str
    version: int
    variants: list[str]
    kernel_files: list[LocalFile]
    card: str
    space_id: str | None = None
    space_files: list[LocalFile] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def branch(self) -> str:
        return f"v{self.version}"

    @property
    def space_variables(self) -> dict[str, str]:
        return {"PM_KERNEL_REPO": self.repo_id, "PM_KERNEL_VERSION": str(self.version)}


def _files_under(root: Path, prefix: str, skip_dirs: tuple[str, ...] = ("__pycache__",)) -> list[LocalFile]:
    out = []
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if p.is_file() and not any(part in skip_dirs for part in rel.parts) and p.suffix != ".pyc":
            out.append(LocalFile(prefix + rel.as_posix(), p))
    return out


def plan_publish(repo: Path | str, repo_id: str | None = None, space_id: str | None = None,
                 force: bool = False, partial: bool = False) -> Plan:
    """Check the build and collect what would be published; raises PublishError if refused."""
    from .build import planned_variant_names
    from .check import check_path
    from .config import load_config

    repo = Path(repo).resolve()
    config = load_config(repo)
    repo_id = repo_id or config.hub_repo_id
    if not repo_id or repo_id.count("/") != 1:
        raise PublishError(f"no valid Hub repo id (got {repo_id!r}): pass --repo-id ORG/NAME "
                           "or set [general.hub] repo-id in build.toml")
    variants = read_variants(repo)
    if not variants:
        raise PublishError(f"no build variants in {repo / 'build'} (no build/<variant>/metadata.json): "
                           f"run `kernelpress build {repo}` first")

    warnings = []
    if config.torch.stable_abi_version is not None:
        absent = [name for name in planned_variant_names(config) if name not in variants]
        if absent:
            what = f"the build lacks variant{'s' if len(absent) > 1 else ''} {', '.join(absent)}"
            if not partial:
                raise PublishError(f"{what}: run `make variants` (every variant; `kernelpress toolchains` "
                                   "lists what they need), or pass --partial to publish the ones built")
            warnings.append(f"WARNING: {what}; publishing the others (--partial)")

    failed = [r for r in check_path(repo) if not r.ok]
    if failed:
        listing = "; ".join(f"{r.variant}: {r.name}: {r.detail}" for r in failed)
        raise PublishError(f"the build fails kernelpress check, not publishing: {listing}")

    versions = {name: meta.get("version") for name, meta in variants.items()}
    if len(set(versions.values())) != 1:
        raise PublishError(f"variants disagree on the version: {versions}")
    version = next(iter(versions.values()))

    dirty = [n for n, m in variants.items() if m.get("provenance", {}).get("kernel", {}).get("dirty") is not False]
    if dirty:
        what = f"built from a dirty (or unknown) source tree: {', '.join(dirty)}"
        if not force:
            raise PublishError(f"{what}; commit the changes and rebuild, or pass --force")
        warnings.append(f"WARNING: publishing a build {what} (--force)")

    files = [f for v in variants for f in _files_under(repo / "build" / v, f"build/{v}/")]
    files += [LocalFile(f"benchmarks/{p.name}", p) for p in sorted((repo / "benchmarks").glob("benchmark*.py"))]
    space_files = []
    if space_id:
        if not (repo / "space" / "app.py").is_file():
            raise PublishError(f"--space-id given but {repo / 'space'} has no app.py")
        space_files = _files_under(repo / "space", "", SPACE_SKIP_DIRS)
    return Plan(repo, repo_id, version, list(variants), files, fill_card(repo, repo_id),
                space_id, space_files, warnings)


def describe_plan(plan: Plan, deletions: list[str] | None) -> str:
    """Human-readable list of every repo, branch, file (with size) and deletion."""
    lines = [f"kernel repo {plan.repo_id} (type kernel): create if missing",
             f"  branch {plan.branch}: create if missing; upload {len(plan.kernel_files)} files:"]
    lines += [f"    {f.path_in_repo}  ({f.size} bytes)" for f in plan.kernel_files]
    if deletions is None:
        lines.append(f"    delete: stale files under build/ and benchmarks/ on {plan.branch} "
                     "(not listed: the remote was not read)")
    else:
        lines += [f"    delete {p}" for p in deletions] or ["    delete: nothing"]
    lines.append(f"  branch main: upload README.md  ({len(plan.card.encode())} bytes, the filled CARD.md)")
    plot = latest_benchmark_plot(plan.repo)
    if plot is not None:
        lines.append(f"  branch main: upload {CARD_PLOT}  ({plot.stat().st_size} bytes, {plot.name})")
    if plan.space_id:
        lines.append(f"space repo {plan.space_id} (sdk gradio): create if missing; branch main: "
                     f"upload {len(plan.space_files)} files:")
        lines += [f"    {f.path_in_repo}  ({f.size} bytes)" for f in plan.space_files]
        lines += [f"  space variable {k}={v}" for k, v in plan.space_variables.items()]
    return "\n".join(lines)


def chunk(ops: list, size: int = MAX_OPS_PER_COMMIT) -> list[list]:
    """Split operations into commits of at most ``size`` operations (at least one commit)."""
    if size < 1:
        raise ValueError("size must be >= 1")
    return [ops[i:i + size] for i in range(0, len(ops), size)] or [[]]


def stale_files(api, plan: Plan) -> list[str]:
    """Files under build/ and benchmarks/ on the version branch that this build does not have."""
    from huggingface_hub.errors import RevisionNotFoundError

    try:
        remote = api.list_repo_files(plan.repo_id, repo_type="kernel", revision=plan.branch)
    except RevisionNotFoundError:
        return []
    keep = {f.path_in_repo for f in plan.kernel_files}
    return sorted(p for p in remote if p.startswith(MANAGED_PREFIXES) and p not in keep)


def _redact(text: str, token: str | None) -> str:
    return text.replace(token, "<redacted>") if token else text


def _describe_http_error(exc: Exception, target: str, token: str | None) -> str:
    """A short reason for a failed request (status and server message; never headers)."""
    from huggingface_hub.errors import HfHubHTTPError

    if isinstance(exc, HfHubHTTPError) and exc.response is not None:
        status = exc.response.status_code
        server = exc.server_message or ""
        if status in (401, 403):
            reason = (f"HTTP {status}: the token lacks write access to {target} "
                      "(use a token with the write role, or a fine-grained token allowed to write "
                      "to that repo's namespace)")
        else:
            reason = f"HTTP {status}" + (f": {server.strip()}" if server.strip() else "")
    else:
        reason = f"{type(exc).__name__}: {exc}"
    return _redact(reason, token)


class _Steps:
    """Runs publish steps in order, remembering which succeeded, to report a partial publish."""

    def __init__(self, names: list[str], out: TextIO, token: str | None):
        self.pending, self.done, self.out, self.token = list(names), [], out, token

    def run(self, name: str, target: str, fn):
        try:
            result = fn()
        except Exception as exc:  # noqa: BLE001 - turned into a report of what was published
            self.pending.remove(name)
            reason = _describe_http_error(exc, target, self.token)
            not_done = [f"{name} failed: {reason}"] + self.pending
            raise PublishError(
                f"published: {', '.join(self.done) or 'nothing'}; NOT published: {'; '.join(not_done)}"
            ) from None
        self.pending.remove(name)
        self.done.append(name)
        print(f"  done: {name}", file=self.out)
        return result


def publish(plan: Plan, api, out: TextIO | None = None, max_ops: int = MAX_OPS_PER_COMMIT) -> list[str]:
    """Publish ``plan`` through ``api`` (an HfApi with a token); returns the steps done.

    Raises PublishError naming what was and wasn't published when a request fails.
    """
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete

    out = out or sys.stdout
    token = api.token if isinstance(api.token, str) else None
    kernel = f"kernel repo {plan.repo_id}"
    steps = _Steps([f"{kernel} created", f"branch {plan.branch} created", "stale files listed"], out, token)
    steps.run(f"{kernel} created", kernel,
              lambda: api.create_repo(plan.repo_id, repo_type="kernel", exist_ok=True))
    steps.run(f"branch {plan.branch} created", kernel,
              lambda: api.create_branch(plan.repo_id, branch=plan.branch, repo_type="kernel", exist_ok=True))
    deletions = steps.run("stale files listed", kernel, lambda: stale_files(api, plan))
    ops = [CommitOperationAdd(f.path_in_repo, str(f.local)) for f in plan.kernel_files]
    ops += [CommitOperationDelete(p) for p in deletions]
    commits = chunk(ops, max_ops)
    names = [f"build files commit {i}/{len(commits)} on {plan.branch} ({len(c)} operations)"
             for i, c in enumerate(commits, 1)]
    names.append("README.md (card) on main")
    if plan.space_id:
        names += [f"space repo {plan.space_id} created", "space files commit", "space variables set"]
    steps.pending += names

    for name, ops_chunk in zip(names, commits):
        steps.run(name, kernel, lambda c=ops_chunk, n=name: api.create_commit(
            plan.repo_id, repo_type="kernel", revision=plan.branch, operations=c,
            commit_message=f"Upload {plan.repo_id} {plan.branch}: {n.split(' on ')[0]}"))
    card_ops = [CommitOperationAdd("README.md", plan.card.encode())]
    plot = latest_benchmark_plot(plan.repo)
    if plot is not None:
        card_ops.append(CommitOperationAdd(CARD_PLOT, str(plot)))
    steps.run("README.md (card) on main", kernel, lambda: api.create_commit(
        plan.repo_id, repo_type="kernel", revision="main", operations=card_ops,
        commit_message=f"Kernel card for {plan.branch}"))

    if plan.space_id:
        space = f"space repo {plan.space_id}"
        steps.run(f"{space} created", space, lambda: api.create_repo(
            plan.space_id, repo_type="space", space_sdk="gradio", exist_ok=True))
        steps.run("space files commit", space, lambda: api.create_commit(
            plan.space_id, repo_type="space", revision="main",
            operations=[CommitOperationAdd(f.path_in_repo, str(f.local)) for f in plan.space_files],
            commit_message=f"Space for {plan.repo_id} {plan.branch}"))

        def set_variables():
            for key, value in plan.space_variables.items():
                api.add_space_variable(plan.space_id, key, value,
                                       description="kernel loaded by the app (set by kernelpress publish)")
        steps.run("space variables set", space, set_variables)
    return steps.done


def run_publish(repo: Path | str = ".", repo_id: str | None = None, space_id: str | None = None,
                dry_run: bool = False, force: bool = False, partial: bool = False, endpoint: str | None = None,
                max_ops: int = MAX_OPS_PER_COMMIT, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """The CLI's body: plan, then print (dry run) or publish. Returns the exit status."""
    from huggingface_hub import HfApi, get_token

    out, err = out or sys.stdout, err or sys.stderr
    token = get_token()
    try:
        plan = plan_publish(repo, repo_id, space_id, force, partial)
        for w in plan.warnings:
            print(w, file=err)
            print(w, file=out)
        endpoint = endpoint or os.environ.get("HF_ENDPOINT") or None
        api = HfApi(endpoint=endpoint, token=token or False)
        if dry_run or not token:
            why = "--dry-run" if token else "no Hugging Face token found (HF_TOKEN or `hf auth login`)"
            deletions = None
            if token:  # read-only: list the branch to show the deletions
                from huggingface_hub.errors import RepositoryNotFoundError

                try:
                    deletions = stale_files(api, plan)
                except RepositoryNotFoundError:
                    deletions = []
            print(f"DRY RUN ({why}): nothing is created or uploaded. Would publish to {api.endpoint}:", file=out)
            print(describe_plan(plan, deletions), file=out)
            return 0
        print(f"publishing {plan.repo_id} {plan.branch} to {api.endpoint}", file=out)
        done = publish(plan, api, out=out, max_ops=max_ops)
        print(f"published: {', '.join(done)}", file=out)
        return 0
    except PublishError as e:
        print(f"kernelpress: error: {_redact(str(e), token)}", file=err)
        return 1
    except Exception as e:  # noqa: BLE001 - never let a token reach a traceback
        print(f"kernelpress: error: {type(e).__name__}: {_redact(str(e), token)}", file=err)
        return 1
