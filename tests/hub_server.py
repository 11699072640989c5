"""A tiny in-memory stand-in for the Hugging Face Hub HTTP API, for publish tests.

It answers exactly the requests that huggingface_hub 2.4's ``HfApi`` sends for
``create_repo``, ``create_branch``, ``create_commit`` (preupload + NDJSON commit),
``list_repo_tree``, ``list_repo_refs``, ``repo_info``, README YAML validation
and ``add_space_variable``. Paths and payloads follow ``huggingface_hub/hf_api.py``
and ``_commit_api.py``:

* ``POST /api/repos/create`` ``{"name", "organization", "type", "sdk"?}`` -> ``{"url"}``, 409 if it exists
* ``POST /api/{type}s/{id}/preupload/{rev}`` -> every file ``"uploadMode": "regular"``, so
  content comes inline (base64) in the commit and no LFS/Xet endpoint is needed
* ``POST /api/{type}s/{id}/commit/{rev}`` NDJSON lines ``header``/``file``/``deletedFile``/
  ``deletedFolder`` -> ``{"commitUrl", "commitOid"}``
* ``POST /api/{type}s/{id}/branch/{branch}`` ``{"startingPoint"?}``, 409 if it exists
* ``GET /api/{type}s/{id}/tree/{rev}[/{path}]?recursive=..`` -> list of file/directory entries
* ``GET /api/{type}s/{id}/refs`` -> ``{"branches", "converts", "tags"}``
* ``GET /api/{type}s/{id}[/revision/{rev}]`` -> repo info (``sha``, ``siblings``, ``sdk``)
* ``POST /api/validate-yaml`` -> ``{"errors": [], "warnings": []}``
* ``POST /api/spaces/{id}/variables`` ``{"key", "value", "description"?}``

State lives in ``HubServer.repos``: ``{(type, id): Repo}``, a ``Repo`` holding
``branches: {name: {path: bytes}}`` and the commit sha of each branch. Every request is
logged in ``HubServer.requests`` (method, path, Authorization header). Failure
injection: ``fail_commit = {n: status}`` fails the n-th commit request (1-based,
counted over the server's life) with that status; ``forbidden = {repo_id}`` answers
403 to every request that names that repo.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

TYPES = {"models": "model", "datasets": "dataset", "spaces": "space", "kernels": "kernel"}


@dataclass
class Repo:
    """One repo: files per branch, the head commit of each branch, Space settings."""

    repo_type: str
    repo_id: str
    sdk: str | None = None
    branches: dict[str, dict[str, bytes]] = field(default_factory=dict)
    heads: dict[str, str] = field(default_factory=dict)
    variables: dict[str, str] = field(default_factory=dict)
    commits: list[dict] = field(default_factory=list)  # {"branch", "summary", "oid", "ops"}


@dataclass
class Request:
    method: str
    path: str
    authorization: str | None


def _sha(*parts: object) -> str:
    return hashlib.sha1("\0".join(map(str, parts)).encode()).hexdigest()


def _git_blob_oid(content: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


class HubServer:
    """Run with ``with HubServer() as hub: HfApi(endpoint=hub.url, token=...)``."""

    def __init__(self) -> None:
        self.repos: dict[tuple[str, str], Repo] = {}
        self.requests: list[Request] = []
        self.fail_commit: dict[int, int] = {}
        self.forbidden: set[str] = set()
        self.commit_count = 0
        self.lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    # -- lifecycle
    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> "HubServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    # -- helpers for tests
    def repo(self, repo_type: str, repo_id: str) -> Repo:
        return self.repos[(repo_type, repo_id)]

    def files(self, repo_type: str, repo_id: str, branch: str = "main") -> dict[str, bytes]:
        return self.repos[(repo_type, repo_id)].branches[branch]

    def add_repo(self, repo_type: str, repo_id: str, sdk: str | None = None) -> Repo:
        repo = Repo(repo_type, repo_id, sdk)
        repo.branches["main"] = {".gitattributes": b"*.so filter=lfs diff=lfs merge=lfs -text\n"}
        repo.heads["main"] = _sha(repo_type, repo_id, "initial")
        self.repos[(repo_type, repo_id)] = repo
        return repo

    # -- request handling
    def _handler_class(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # keep test output quiet
                pass

            def _reply(self, status: int, body: object = None, headers: dict | None = None) -> None:
                data = json.dumps(body if body is not None else {}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    chunks = []
                    while True:
                        size = int(self.rfile.readline().strip(), 16)
                        if size == 0:
                            self.rfile.readline()
                            break
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                    return b"".join(chunks)
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _handle(self, method: str) -> None:
                split = urlsplit(self.path)
                path = unquote(split.path)
                query = {k: v[-1] for k, v in parse_qs(split.query).items()}
                body = self._body() if method == "POST" else b""
                with hub.lock:
                    hub.requests.append(Request(method, split.path, self.headers.get("Authorization")))
                    status, payload, headers = hub._dispatch(method, path, query, body)
                self._reply(status, payload, headers)

            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

            def do_HEAD(self) -> None:
                self._handle("HEAD")

        return Handler

    def _error(self, status: int, message: str, code: str | None = None):
        return status, {"error": message}, ({"X-Error-Code": code} if code else {})

    def _dispatch(self, method: str, path: str, query: dict, body: bytes):
        if method == "POST" and path == "/api/repos/create":
            return self._create_repo(json.loads(body))
        if method == "POST" and path == "/api/validate-yaml":
            return 200, {"errors": [], "warnings": []}, {}
        m = re.fullmatch(r"/api/(models|datasets|spaces|kernels)/([^/]+/[^/]+)(?:/(.*))?", path)
        if not m:
            return self._error(404, f"no route for {method} {path}")
        repo_type, repo_id, rest = TYPES[m.group(1)], m.group(2), m.group(3) or ""
        if repo_id in self.forbidden:
            return self._error(403, f"You don't have the rights to access {repo_id}")
        repo = self.repos.get((repo_type, repo_id))
        if repo is None:
            return self._error(404, f"Repository Not Found for {repo_type} {repo_id}", "RepoNotFound")
        verb, _, arg = rest.partition("/")
        if method == "GET" and verb in ("", "revision"):
            return self._repo_info(repo, arg or "main")
        if method == "GET" and verb == "refs":
            branches = [
                {"name": b, "ref": f"refs/heads/{b}", "targetCommit": repo.heads[b]} for b in repo.branches
            ]
            return 200, {"branches": branches, "converts": [], "tags": []}, {}
        if method == "GET" and verb == "tree":
            rev, _, sub = arg.partition("/")
            return self._tree(repo, rev, sub, query.get("recursive", "").lower() in ("true", "1"))
        if method == "POST" and verb == "branch":
            return self._create_branch(repo, arg, json.loads(body or b"{}"))
        if method == "POST" and verb == "preupload":
            files = json.loads(body)["files"]
            return 200, {"files": [
                {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": None} for f in files
            ]}, {}
        if method == "POST" and verb == "commit":
            return self._commit(repo, arg, body)
        if method == "POST" and verb == "variables" and repo_type == "space":
            item = json.loads(body)
            repo.variables[item["key"]] = item["value"]
            return 200, {k: {"value": v} for k, v in repo.variables.items()}, {}
        return self._error(404, f"no route for {method} {path}")

    def _create_repo(self, payload: dict):
        repo_type = payload.get("type") or "model"
        repo_id = f"{payload['organization']}/{payload['name']}" if payload.get("organization") else payload["name"]
        if repo_id in self.forbidden:
            return self._error(403, f"You don't have the rights to create {repo_type} {repo_id}")
        prefix = "" if repo_type == "model" else f"{repo_type}s/"
        if (repo_type, repo_id) in self.repos:
            # the Hub's 409 names the repo's url too; create_repo(exist_ok=True) reads it
            return 409, {"error": "You already created this repo", "url": f"{self.url}/{prefix}{repo_id}"}, {}
        if repo_type == "space" and not payload.get("sdk"):
            return self._error(400, "sdk is required for a Space")
        self.add_repo(repo_type, repo_id, payload.get("sdk"))
        return 200, {"url": f"{self.url}/{prefix}{repo_id}"}, {}

    def _repo_info(self, repo: Repo, rev: str):
        if rev not in repo.branches:
            return self._error(404, f"Revision Not Found: {rev}", "RevisionNotFound")
        info = {
            "id": repo.repo_id, "sha": repo.heads[rev], "private": False,
            "siblings": [{"rfilename": p} for p in sorted(repo.branches[rev])],
        }
        if repo.sdk:
            info["sdk"] = repo.sdk
        return 200, info, {}

    def _tree(self, repo: Repo, rev: str, sub: str, recursive: bool):
        if rev not in repo.branches:
            return self._error(404, f"Revision Not Found: {rev}", "RevisionNotFound")
        files = repo.branches[rev]
        prefix = sub.rstrip("/") + "/" if sub else ""
        if sub and not any(p.startswith(prefix) for p in files):
            return self._error(404, f"Entry Not Found: {sub}", "EntryNotFound")
        entries: dict[str, dict] = {}
        for p, content in sorted(files.items()):
            if not p.startswith(prefix):
                continue
            parts = p[len(prefix):].split("/")
            for depth in range(1, len(parts)):
                if not recursive and depth > 1:
                    break
                d = prefix + "/".join(parts[:depth])
                entries.setdefault(d, {"type": "directory", "path": d, "oid": _sha("tree", d)})
            if recursive or len(parts) == 1:
                entries[p] = {"type": "file", "path": p, "size": len(content), "oid": _git_blob_oid(content)}
        return 200, list(entries.values()), {}

    def _create_branch(self, repo: Repo, branch: str, payload: dict):
        if branch in repo.branches:
            return self._error(409, f"Reference already exists: {branch}")
        start = payload.get("startingPoint") or "main"
        repo.branches[branch] = dict(repo.branches[start])
        repo.heads[branch] = repo.heads[start]
        return 200, {}, {}

    def _commit(self, repo: Repo, rev: str, body: bytes):
        self.commit_count += 1
        if self.commit_count in self.fail_commit:
            return self._error(self.fail_commit[self.commit_count], "Internal Error - We're working hard to fix this")
        if rev not in repo.branches:
            return self._error(404, f"Revision Not Found: {rev}", "RevisionNotFound")
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        if not lines or lines[0]["key"] != "header":
            return self._error(400, "first line must be the header")
        files = dict(repo.branches[rev])
        ops = []
        for line in lines[1:]:
            key, value = line["key"], line["value"]
            if key == "file":
                files[value["path"]] = base64.b64decode(value["content"])
            elif key == "deletedFile":
                if value["path"] not in files:
                    return self._error(404, "A file with this name doesn't exist", "EntryNotFound")
                del files[value["path"]]
            elif key == "deletedFolder":
                folder = value["path"].rstrip("/") + "/"
                files = {p: c for p, c in files.items() if not p.startswith(folder)}
            else:
                return self._error(400, f"unsupported commit line {key!r} (this mock has no LFS)")
            ops.append((key, value["path"]))
        oid = _sha(repo.repo_id, rev, len(repo.commits), lines[0]["value"]["summary"])
        repo.branches[rev] = files
        repo.heads[rev] = oid
        repo.commits.append({"branch": rev, "summary": lines[0]["value"]["summary"], "oid": oid, "ops": ops})
        prefix = "" if repo.repo_type == "model" else f"{repo.repo_type}s/"
        return 200, {"commitUrl": f"{self.url}/{prefix}{repo.repo_id}/commit/{oid}", "commitOid": oid,
                     "success": True, "pullRequestUrl": None}, {}
