"""The op namespace id of a build: ``_<python_name>_<backend>_<uid>``.

As in kernel-builder, uid is the first 7 hex digits of the git tree id of
HEAD, with ``_dirty`` appended when tracked files differ from HEAD. The same
string names the extension file, metadata.json's ``id`` and the torch op
namespace, so two builds of different sources never share an op namespace in
one process.
"""

from __future__ import annotations

import hashlib
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SourceState:
    """Where the sources came from: the HEAD commit and tree, and whether tracked files changed."""

    commit: str | None
    tree: str | None
    dirty: bool

    @property
    def uid(self) -> str:
        return self.tree[:7] + ("_dirty" if self.dirty else "")


def _git(repo: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip()


def source_state(repo: Path, hashed_files: list[Path]) -> SourceState:
    """Read the git state of ``repo``.

    Outside a git checkout (a source tarball), the tree id is replaced by a
    SHA-1 over ``hashed_files`` (paths and contents), so the id still changes
    with the sources.
    """
    top = _git(repo, "rev-parse", "--show-toplevel")
    commit = _git(repo, "rev-parse", "--verify", "-q", "HEAD") if top else None
    if top and commit:
        tree = _git(repo, "rev-parse", "HEAD^{tree}")
        status = _git(repo, "status", "--porcelain", "--untracked-files=no")
        return SourceState(commit=commit, tree=tree, dirty=bool(status))
    digest = hashlib.sha1()
    for path in sorted(hashed_files):
        digest.update(str(path.relative_to(repo)).encode() + b"\0" + path.read_bytes() + b"\0")
    return SourceState(commit=None, tree=digest.hexdigest(), dirty=False)


def op_namespace_id(python_name: str, backend: str, state: SourceState) -> str:
    return f"_{python_name}_{backend}_{state.uid}"
