"""A Hugging Face Hub on loopback for tests: the endpoints huggingface_hub 2.4 calls to list
and download a dataset snapshot, and to create a repo and commit to it (support/hub_write.py),
answered the way the Hub answers them, so regen's Hub code runs unchanged against it
(`HF_ENDPOINT`).

- `GET /api/datasets/ORG/NAME[/revision/REV]` (`dataset_info`, `repo_info`): the commit a
  branch, tag or commit resolves to, and its files with sizes (`?blobs=true`); the same under
  `/api/models/` and `/api/spaces/` for repos of those kinds (`repo_exists`).
- `GET /api/datasets/ORG/NAME/tree/REV[/PATH]` (`list_repo_tree`, what `snapshot_download`
  lists a commit with, `?recursive=true`; without it the direct children, folders included,
  which `HfFileSystem`'s glob walks for `datasets.load_dataset`).
- `HEAD`/`GET /datasets/ORG/NAME/resolve/REV/PATH` (`hf_hub_download`): a small file answered
  directly with its git blob id as ETag; an LFS file (by the Hub's default .gitattributes:
  Parquet, Arrow, images, archives; or 10 MB and more) by a 302 to a CDN on another host
  name (`localhost`: huggingface_hub reads the metadata off the redirect, as it must not send
  the token off the Hub) with `X-Linked-Etag` (its sha256) and `X-Linked-Size`. Every answer
  carries `X-Repo-Commit`.

Errors as the Hub sends them, with the `X-Error-Code` huggingface_hub maps to its exceptions:
an unknown repo 401 (no token) or 404 `RepoNotFound`, an unknown revision 404
`RevisionNotFound`, a private repo without the token 401 `RepoNotFound`, a gated repo's files
without the token 401 `GatedRepo` (its listing stays public, as on the Hub). Every request is
recorded (method, path), so a test can say what was (not) asked for.

Tokens: `TOKEN` reads every repo and writes in the namespaces of `LoopbackHub.writable` (all
when None); `READ_TOKEN` reads every repo and writes none, as a read-only token.
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

TOKEN = "hf_loopback_test_token"
READ_TOKEN = "hf_loopback_read_token"
LFS_SUFFIXES = (
    ".7z", ".arrow", ".bin", ".bz2", ".ckpt", ".gz", ".h5", ".npy", ".npz", ".onnx", ".parquet",
    ".pickle", ".pkl", ".pt", ".pth", ".safetensors", ".tar", ".tgz", ".xz", ".zip", ".zst",
    ".png", ".jpg", ".jpeg", ".gif", ".webp", ".bmp", ".tiff",
)  # fmt: skip
"""The Hub's default .gitattributes: files stored in LFS whatever their size."""
LFS_MIN_SIZE = 10 * 1024 * 1024
"""A file this large goes to LFS whatever its name (the Hub's preupload rule)."""


def is_lfs(path: str, data: bytes) -> bool:
    return path.endswith(LFS_SUFFIXES) or len(data) >= LFS_MIN_SIZE


@dataclass
class HubRepo:
    private: bool = False
    gated: bool = False
    refs: dict[str, str] = field(default_factory=dict)
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)


def _blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class LoopbackHub:
    """Repos in memory (datasets in `repos`, models and Spaces in `others`); `commit` adds a
    commit on a branch, as a push would, and so does an HTTP commit."""

    def __init__(self) -> None:
        self.repos: dict[str, HubRepo] = {}
        self.others: dict[tuple[str, str], HubRepo] = {}
        """Repos of another kind, by (kind, repo id): `model`, `space`."""
        self.lfs: dict[str, bytes] = {}
        """LFS objects uploaded, by sha256: what a commit's LFS files may point to."""
        self.writable: set[str] | None = None
        """Namespaces `TOKEN` may write in; None: every one."""
        self.refuse_uploads_after: int | None = None
        """A fault: LFS uploads past this many are refused (403, as an expired URL is)."""
        self.uploads = 0
        self.requests: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self.port = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self, hf_home: str) -> dict[str, str]:
        """Environment pointing huggingface_hub here, with its own cache and no saved login."""
        return {
            "HF_ENDPOINT": self.endpoint,
            "HF_HOME": hf_home,
            "HF_HUB_CACHE": f"{hf_home}/hub",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_HUB_DISABLE_PROGRESS_BARS": "1",
            "HF_HUB_ETAG_TIMEOUT": "5",
            "HF_HUB_DOWNLOAD_TIMEOUT": "5",
        }

    def commit(
        self,
        repo_id: str,
        files: dict[str, bytes],
        *,
        branch: str = "main",
        private: bool = False,
        gated: bool = False,
        replace: bool = False,
        kind: str = "dataset",
    ) -> str:
        """A new commit on `branch`: the files of its head with `files` added (or only
        `files`, with `replace`). Returns its sha."""
        with self._lock:
            repos = self.repos if kind == "dataset" else None
            if repos is None:
                repo = self.others.setdefault((kind, repo_id), HubRepo(private=private))
            else:
                repo = repos.setdefault(repo_id, HubRepo(private=private, gated=gated))
            repo.private, repo.gated = private, gated
            return self.apply(repo, repo_id, branch, files, replace=replace)

    def apply(
        self,
        repo: HubRepo,
        repo_id: str,
        branch: str,
        files: dict[str, bytes],
        *,
        deleted: tuple[str, ...] = (),
        replace: bool = False,
    ) -> str:
        """The commit of `files` (and `deleted` paths, a folder's when it ends in /) on
        `branch`, made under the hub's lock; its sha."""
        parent = repo.refs.get(branch)
        tree = {} if replace or parent is None else dict(repo.commits[parent])
        tree.update(files)
        for gone in deleted:
            for path in [p for p in tree if p == gone or p.startswith(gone.rstrip("/") + "/")]:
                del tree[path]
        digest = hashlib.sha1(f"{repo_id}\n{parent}\n".encode())
        for path in sorted(tree):
            digest.update(f"{path}\0{_blob_id(tree[path])}\n".encode())
        sha = digest.hexdigest()
        repo.commits[sha] = tree
        repo.refs[branch] = sha
        return sha

    def head(self, repo_id: str, branch: str = "main") -> dict[str, bytes]:
        """The files of a dataset repo's branch, as a test reads what was published."""
        with self._lock:
            repo = self.repos[repo_id]
            return dict(repo.commits[repo.refs[branch]])

    def count(self, method: str, fragment: str) -> int:
        """Requests of `method` whose path contains `fragment`."""
        with self._lock:
            return sum(m == method and fragment in p for m, p in self.requests)

    def start(self) -> None:
        hub = self

        class Handler(_Handler):
            pass

        Handler.hub = hub
        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        self.port = server.server_address[1]
        # stop() waits for the serving loop's next poll: 0.5 s by default, per test.
        threading.Thread(
            target=server.serve_forever, args=(0.02,), name="loopback-hub", daemon=True
        ).start()
        self._server = server

    def stop(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            server.shutdown()
            server.server_close()


class _Handler(BaseHTTPRequestHandler):
    hub: LoopbackHub
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # a test's output shows failures
        pass

    def do_HEAD(self) -> None:
        self._route(head=True)

    def do_GET(self) -> None:
        self._route(head=False)

    def do_POST(self) -> None:
        if self._record():
            from support.hub_write import post

            post(self)

    def do_PUT(self) -> None:
        if self._record():
            from support.hub_write import put

            put(self)

    def _record(self) -> bool:
        """Record the request; False (the connection shut) once the hub is stopped: a
        kept-alive connection outlives the listening socket, and a Hub that is gone must not
        answer on it either."""
        if self.hub._server is None:
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return False
        with self.hub._lock:
            self.hub.requests.append((self.command, urlsplit(self.path).path))
        return True

    def _route(self, head: bool) -> None:
        if not self._record():
            return
        url = urlsplit(self.path)
        parts = [unquote(p) for p in url.path.strip("/").split("/")]
        query = parse_qs(url.query)
        kinds = {"datasets": "dataset", "models": "model", "spaces": "space"}
        if parts[:1] == ["api"] and len(parts) >= 4 and parts[1] in kinds:
            kind, repo_id, rest = kinds[parts[1]], f"{parts[2]}/{parts[3]}", parts[4:]
            if not rest or rest[0] == "revision":
                return self._info(repo_id, rest[1] if len(rest) > 1 else "main", query, kind)
            if rest[0] == "tree" and len(rest) >= 2 and kind == "dataset":
                recursive = query.get("recursive", ["false"])[0].lower() == "true"
                return self._tree(repo_id, rest[1], "/".join(rest[2:]), recursive)
        if parts[:1] == ["datasets"] and len(parts) >= 6 and parts[3] == "resolve":
            return self._resolve(f"{parts[1]}/{parts[2]}", parts[4], "/".join(parts[5:]), head)
        if parts[:1] == ["cdn"] and len(parts) == 2:
            return self._cdn(parts[1], head)
        self._error(404, "EntryNotFound", "no such route")

    # -- answers -------------------------------------------------------------------------

    def _authorised(self) -> bool:
        return self.headers.get("Authorization") in (f"Bearer {TOKEN}", f"Bearer {READ_TOKEN}")

    def _repo(self, repo_id: str, kind: str = "dataset") -> HubRepo | None:
        with self.hub._lock:
            if kind == "dataset":
                return self.hub.repos.get(repo_id)
            return self.hub.others.get((kind, repo_id))

    def _commit(
        self, repo_id: str, revision: str, files: bool, kind: str = "dataset"
    ) -> tuple[str, dict[str, bytes]] | None:
        """The repo's commit at `revision`, or None once the error is sent. `files`: the
        request reads file contents, which a gated repo keeps behind its conditions."""
        repo = self._repo(repo_id, kind)
        authorised = self._authorised()
        if repo is None or (repo.private and not authorised):
            status = 404 if authorised else 401
            self._error(status, "RepoNotFound", "Repository not found")
            return None
        if files and repo.gated and not authorised:
            status = 403 if "Authorization" in self.headers else 401
            self._error(status, "GatedRepo", "Access to this dataset is restricted")
            return None
        with self.hub._lock:
            sha = repo.refs.get(revision, revision if revision in repo.commits else None)
            tree = repo.commits.get(sha or "")
        if sha is None or tree is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return None
        return sha, tree

    def _info(
        self, repo_id: str, revision: str, query: dict[str, list[str]], kind: str = "dataset"
    ) -> None:
        found = self._commit(repo_id, revision, files=False, kind=kind)
        if found is None:
            return
        sha, tree = found
        repo = self._repo(repo_id, kind)
        assert repo is not None
        blobs = query.get("blobs") == ["True"] or query.get("blobs") == ["true"]
        siblings = [
            {"rfilename": p, **({"size": len(d), "blobId": _blob_id(d)} if blobs else {})}
            for p, d in sorted(tree.items())
        ]
        self._json(
            {
                "_id": repo_id,
                "id": repo_id,
                "sha": sha,
                "private": repo.private,
                "gated": "auto" if repo.gated else False,
                "disabled": False,
                "siblings": siblings,
            },
            sha,
        )

    def _tree(self, repo_id: str, revision: str, prefix: str, recursive: bool = True) -> None:
        """The files under `prefix`, every level down (`?recursive=true`), or its direct
        children, its folders included as `directory` entries (what `HfFileSystem`'s glob
        walks)."""
        found = self._commit(repo_id, revision, files=False)
        if found is None:
            return
        sha, tree = found
        base = prefix.strip("/") + "/" if prefix.strip("/") else ""
        entries = []
        folders: set[str] = set()
        for path, data in sorted(tree.items()):
            if not path.startswith(base):
                continue
            child, _, below = path[len(base) :].partition("/")
            if below and not recursive:
                folders.add(base + child)
                continue
            entry: dict[str, Any] = {
                "type": "file",
                "oid": _blob_id(data),
                "size": len(data),
                "path": path,
            }
            if is_lfs(path, data):
                digest = hashlib.sha256(data).hexdigest()
                entry["lfs"] = {"oid": digest, "size": len(data), "pointerSize": 134}
            entries.append(entry)
        for folder in sorted(folders):
            oid = hashlib.sha1(f"tree {folder}".encode()).hexdigest()
            entries.append({"type": "directory", "oid": oid, "size": 0, "path": folder})
        self._json(entries, sha)

    def _resolve(self, repo_id: str, revision: str, path: str, head: bool) -> None:
        found = self._commit(repo_id, revision, files=True)
        if found is None:
            return
        sha, tree = found
        data = tree.get(path)
        if data is None:
            self._error(404, "EntryNotFound", f"{path} does not exist at {revision}")
            return
        if is_lfs(path, data):  # an LFS file: to the CDN, metadata on the redirect
            digest = hashlib.sha256(data).hexdigest()
            self.send_response(302)
            self.send_header("Location", f"http://localhost:{self.hub.port}/cdn/{digest}")
            self.send_header("X-Repo-Commit", sha)
            self.send_header("X-Linked-Etag", f'"{digest}"')
            self.send_header("X-Linked-Size", str(len(data)))
            self.send_header("ETag", f'"{_blob_id(data)}"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self._body(data, head, {"ETag": f'"{_blob_id(data)}"', "X-Repo-Commit": sha})

    def _cdn(self, digest: str, head: bool) -> None:
        with self.hub._lock:
            blobs = {
                hashlib.sha256(d).hexdigest(): d
                for repo in self.hub.repos.values()
                for tree in repo.commits.values()
                for d in tree.values()
            }
            blobs.update(self.hub.lfs)
        if digest not in blobs:
            self._error(404, "EntryNotFound", "no such blob")
            return
        self._body(blobs[digest], head, {"ETag": f'"{digest}"'})

    # -- wire ----------------------------------------------------------------------------

    def _body(self, data: bytes, head: bool, headers: dict[str, str]) -> None:
        self.send_response(200)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if not head:
            self.wfile.write(data)

    def _json(
        self,
        value: Any,
        sha: str | None = None,
        status: int = 200,
        content_type: str = "application/json",
    ) -> None:
        body = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        if sha is not None:
            self.send_header("X-Repo-Commit", sha)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: int, code: str | None, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        self.send_response(status)
        if code is not None:
            self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


@contextmanager
def loopback_hub() -> Iterator[LoopbackHub]:
    """A started loopback Hub on a free port, stopped on exit."""
    hub = LoopbackHub()
    hub.start()
    try:
        yield hub
    finally:
        hub.stop()
