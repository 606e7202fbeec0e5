"""The loopback Hub's write side: what huggingface_hub 2.4 sends to publish, answered as the
Hub answers it (support/hub.py is the read side and the server).

- `POST /api/repos/create` (`create_repo`): a new repo with the Hub's initial commit (its
  default `.gitattributes`), private when asked; 409 when it exists, which `exist_ok` takes.
- `POST /api/datasets/ORG/NAME/branch/BRANCH` (`create_branch`), 409 when it exists.
- `POST /api/validate-yaml` (`DatasetCard.validate`, and `create_commit` for a README.md): the
  card's YAML header judged as the Hub does the keys regen writes (license id, configs, size
  and task categories); 400 with the errors.
- `POST /api/datasets/ORG/NAME/preupload/REV`: each file's upload mode (LFS by the default
  .gitattributes or by size) and the oid the branch holds at its path (the client drops an
  unchanged file from the commit).
- `POST /datasets/ORG/NAME.git/info/lfs/objects/batch` (the LFS batch API): an upload and a
  verify action per object the Hub lacks, none for one it has; the upload URL is on another
  host name, signed, unauthenticated, as S3's is (`PUT /lfs-upload/OID`), and checks the
  sha256; `LoopbackHub.refuse_uploads_after` makes later uploads fail as an expired URL does.
- `POST /api/datasets/ORG/NAME/commit/REV` (ndjson: header, file, lfsFile, deletedFile,
  deletedFolder): an LFS file must have been uploaded, a parent commit must be the head.

A write needs `TOKEN` in a namespace of `LoopbackHub.writable`: no token is 401 ("Invalid
username or password."), another token 401 ("Invalid credentials in Authorization header"),
`READ_TOKEN` or another namespace 403; a repo the token cannot see is 404 `RepoNotFound`.
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

from support.hub import READ_TOKEN, TOKEN, HubRepo, _blob_id, is_lfs

if TYPE_CHECKING:
    from support.hub import _Handler

USER = "regen-tester"
"""The namespace of `TOKEN`'s own user: a repo created without an organization goes there."""
GITATTRIBUTES = b"".join(
    f"*{suffix} filter=lfs diff=lfs merge=lfs -text\n".encode()
    for suffix in (".arrow", ".parquet", ".png", ".jpg", ".bin", ".safetensors", ".zst")
)
LICENSES = frozenset(
    [
        "apache-2.0", "mit", "openrail", "bigscience-openrail-m", "creativeml-openrail-m",
        "bigcode-openrail-m", "afl-3.0", "artistic-2.0", "bsl-1.0", "bsd", "bsd-2-clause",
        "bsd-3-clause", "bsd-3-clause-clear", "c-uda", "cc", "cc0-1.0", "cc-by-2.0", "cc-by-2.5",
        "cc-by-3.0", "cc-by-4.0", "cc-by-sa-3.0", "cc-by-sa-4.0", "cc-by-nc-2.0", "cc-by-nc-3.0",
        "cc-by-nc-4.0", "cc-by-nd-4.0", "cc-by-nc-nd-3.0", "cc-by-nc-nd-4.0", "cc-by-nc-sa-2.0",
        "cc-by-nc-sa-3.0", "cc-by-nc-sa-4.0", "cdla-sharing-1.0", "cdla-permissive-1.0",
        "cdla-permissive-2.0", "wtfpl", "ecl-2.0", "epl-1.0", "epl-2.0", "etalab-2.0", "eupl-1.1",
        "eupl-1.2", "agpl-3.0", "gfdl", "gpl", "gpl-2.0", "gpl-3.0", "lgpl", "lgpl-2.1", "lgpl-3.0",
        "isc", "mpl-2.0", "odc-by", "odbl", "openrail++", "osl-3.0", "postgresql", "ofl-1.1",
        "ncsa", "unlicense", "zlib", "pddl", "llama2", "llama3", "llama3.1", "llama3.2", "llama3.3",
        "llama4", "gemma", "unknown", "other",
    ]
)  # fmt: skip
"""License ids the Hub accepts in a card (a subset of its list: enough to refuse a typo)."""
SIZE_CATEGORIES = frozenset(
    ["n<1K", "1K<n<10K", "10K<n<100K", "100K<n<1M", "1M<n<10M", "10M<n<100M", "100M<n<1B",
     "1B<n<10B", "10B<n<100B", "100B<n<1T", "n>1T"]
)  # fmt: skip
TASKS = frozenset(["text-generation", "text-classification", "question-answering", "translation"])


def post(h: _Handler) -> None:
    url = urlsplit(h.path)
    parts = [unquote(p) for p in url.path.strip("/").split("/")]
    body = _body(h)
    if parts == ["api", "repos", "create"]:
        return _create(h, _json(body))
    if parts == ["api", "validate-yaml"]:
        return _validate(h, _json(body))
    if parts[:2] == ["api", "datasets"] and len(parts) == 6:
        repo_id, action, revision = f"{parts[2]}/{parts[3]}", parts[4], parts[5]
        if action == "branch":
            return _branch(h, repo_id, revision, _json(body))
        if action == "preupload":
            return _preupload(h, repo_id, revision, _json(body))
        if action == "commit":
            return _commit(h, repo_id, revision, body, parse_qs(url.query))
    if parts[:1] == ["datasets"] and len(parts) == 7 and parts[2].endswith(".git"):
        repo_id = f"{parts[1]}/{parts[2].removesuffix('.git')}"
        if parts[3:6] == ["info", "lfs", "objects"] and parts[6] == "batch":
            return _batch(h, repo_id, _json(body))
        if parts[3:6] == ["info", "lfs", "objects"] and parts[6] == "verify":
            return _verify(h, _json(body))
    h._error(404, "EntryNotFound", "no such route")


def put(h: _Handler) -> None:
    parts = urlsplit(h.path).path.strip("/").split("/")
    if parts[:1] != ["lfs-upload"] or len(parts) != 2:
        h._error(404, None, "no such route")
        return
    oid, data = parts[1], _body(h)
    if hashlib.sha256(data).hexdigest() != oid:
        h._error(400, None, "the content does not match its sha256")
        return
    hub = h.hub
    # Judged and counted at once: huggingface_hub uploads in parallel, and two uploads that
    # both passed a check made apart from the count were both taken (3 past a limit of 2).
    with hub._lock:
        refused = hub.refuse_uploads_after is not None and hub.uploads >= hub.refuse_uploads_after
        if not refused:
            hub.lfs[oid] = data
            hub.uploads += 1
    if refused:
        h._error(403, None, "Request has expired")
        return
    h._json({}, content_type="text/plain")


# -- reading a request -----------------------------------------------------------------------


def _body(h: _Handler) -> bytes:
    """The request body, sent whole or chunked (a streamed file upload)."""
    if h.headers.get("Transfer-Encoding", "").lower() == "chunked":
        out = bytearray()
        while True:
            size = int(h.rfile.readline().split(b";")[0].strip(), 16)
            if size == 0:
                h.rfile.readline()
                return bytes(out)
            out += h.rfile.read(size)
            h.rfile.readline()
    return h.rfile.read(int(h.headers.get("Content-Length") or 0))


def _json(body: bytes) -> dict[str, Any]:
    found = json.loads(body or b"{}")
    return found if isinstance(found, dict) else {}


# -- who may write ---------------------------------------------------------------------------


def _may_write(h: _Handler, namespace: str, refused: str) -> bool:
    """Whether the request's token may write in `namespace`; the error is sent when not."""
    auth = h.headers.get("Authorization")
    if auth is None:
        h._error(401, None, "Invalid username or password.")
        return False
    if auth not in (f"Bearer {TOKEN}", f"Bearer {READ_TOKEN}"):
        h._error(401, None, "Invalid credentials in Authorization header")
        return False
    writable = h.hub.writable
    if auth == f"Bearer {READ_TOKEN}":
        h._error(403, None, "Forbidden: you must use a write token to write to a repository")
        return False
    if writable is not None and namespace not in writable:
        h._error(403, None, refused)
        return False
    return True


def _writable_repo(h: _Handler, repo_id: str) -> HubRepo | None:
    """The dataset repo a write names, if the token may write it; else the error is sent (a
    private repo the request cannot see is not found, as the Hub says)."""
    repo = h._repo(repo_id)
    if repo is None or (repo.private and not h._authorised()):
        h._error(404, "RepoNotFound", "Repository not found")
        return None
    namespace = repo_id.split("/")[0]
    if not _may_write(h, namespace, f"You don't have the rights to write to {repo_id}"):
        return None
    return repo


# -- answers ---------------------------------------------------------------------------------


def _create(h: _Handler, body: dict[str, Any]) -> None:
    kind = body.get("type") or "model"
    namespace = body.get("organization") or USER
    repo_id = f"{namespace}/{body.get('name')}"
    refused = f'You don\'t have the rights to create a {kind} under the namespace "{namespace}"'
    if not _may_write(h, namespace, refused):
        return
    private = bool(body.get("private")) or body.get("visibility") == "private"
    prefix = "" if kind == "model" else f"{kind}s/"
    url = f"{h.hub.endpoint}/{prefix}{repo_id}"
    hub = h.hub
    with hub._lock:
        repos: dict[Any, HubRepo] = hub.repos if kind == "dataset" else hub.others
        key: Any = repo_id if kind == "dataset" else (kind, repo_id)
        exists = key in repos
        if not exists:
            repo = repos[key] = HubRepo(private=private)
            hub.apply(repo, repo_id, "main", {".gitattributes": GITATTRIBUTES})
    if exists:
        h._json({"error": f"You already created this {kind} repo", "url": url}, status=409)
        return
    h._json({"url": url, "name": repo_id, "id": repo_id})


def _branch(h: _Handler, repo_id: str, branch: str, body: dict[str, Any]) -> None:
    repo = _writable_repo(h, repo_id)
    if repo is None:
        return
    with h.hub._lock:
        exists = branch in repo.refs
        start = body.get("startingPoint") or repo.refs["main"]
        start = repo.refs.get(start, start)
        known = start in repo.commits
        if not exists and known:
            repo.refs[branch] = start
    if exists:
        h._json({"error": "Reference already exists"}, status=409)
    elif not known:
        h._error(404, "RevisionNotFound", f"Invalid rev id: {body.get('startingPoint')}")
    else:
        h._json({})


def _validate(h: _Handler, body: dict[str, Any]) -> None:
    errors = card_errors(str(body.get("content", "")), str(body.get("repoType", "model")))
    if errors:
        h._json({"errors": [{"message": e} for e in errors], "warnings": []}, status=400)
    else:
        h._json({"errors": [], "warnings": []})


def card_errors(content: str, repo_type: str) -> list[str]:
    """What the Hub refuses of a card's YAML header (the keys regen writes)."""
    if not content.startswith("---\n"):
        return []
    header = content[4:].split("\n---", 1)[0]
    try:
        meta = yaml.safe_load(header) or {}
    except yaml.YAMLError as err:
        return [f"Invalid YAML: {str(err).splitlines()[0]}"]
    if not isinstance(meta, dict):
        return ["The metadata must be a YAML mapping"]
    errors = []
    licenses = meta.get("license")
    for license in licenses if isinstance(licenses, list) else [licenses]:
        if license is not None and license not in LICENSES:
            errors.append(f'"license" must be one of the Hub\'s license ids, got "{license}"')
    for size in meta.get("size_categories") or []:
        if size not in SIZE_CATEGORIES:
            errors.append(f'"size_categories" must be one of {sorted(SIZE_CATEGORIES)}')
    for task in meta.get("task_categories") or []:
        if task not in TASKS:
            errors.append(f'"task_categories": unknown task "{task}"')
    if repo_type == "dataset":
        errors += _config_errors(meta.get("configs"))
    return errors


def _config_errors(configs: Any) -> list[str]:
    if configs is None:
        return []
    if not isinstance(configs, list):
        return ['"configs" must be a list']
    errors = []
    for config in configs:
        if not isinstance(config, dict) or not isinstance(config.get("config_name"), str):
            errors.append('"configs": each config needs a "config_name"')
            continue
        files = config.get("data_files")
        entries = files if isinstance(files, list) else [files]
        for entry in entries:
            ok = isinstance(entry, str) or (
                isinstance(entry, dict)
                and isinstance(entry.get("split"), str)
                and isinstance(entry.get("path"), (str, list))
            )
            if files is not None and not ok:
                errors.append(f'"configs": {config["config_name"]}: malformed "data_files"')
    return errors


def _preupload(h: _Handler, repo_id: str, revision: str, body: dict[str, Any]) -> None:
    repo = _writable_repo(h, repo_id)
    if repo is None:
        return
    found = h._commit(repo_id, revision, files=False)
    if found is None:
        return
    sha, tree = found
    answers = []
    for f in body.get("files", []):
        path, size = f["path"], int(f["size"])
        lfs = is_lfs(path, b"") or size >= 10 * 1024 * 1024
        held = tree.get(path)
        oid = None
        if held is not None:
            oid = hashlib.sha256(held).hexdigest() if is_lfs(path, held) else _blob_id(held)
        mode = "lfs" if lfs else "regular"
        answers.append({"path": path, "uploadMode": mode, "shouldIgnore": False, "oid": oid})
    h._json({"files": answers, "commitOid": sha})


def _batch(h: _Handler, repo_id: str, body: dict[str, Any]) -> None:
    if _writable_repo(h, repo_id) is None:
        return
    hub = h.hub
    objects = []
    for obj in body.get("objects", []):
        oid, size = obj["oid"], int(obj["size"])
        entry: dict[str, Any] = {"oid": oid, "size": size, "authenticated": True}
        with hub._lock:
            held = oid in hub.lfs
        if not held:
            entry["actions"] = {
                # Another host name, as S3's presigned URLs are: no token goes there.
                "upload": {
                    "href": f"http://localhost:{hub.port}/lfs-upload/{oid}?X-Amz-Signature=lb",
                    "header": {},
                },
                "verify": {
                    "href": f"{hub.endpoint}/datasets/{repo_id}.git/info/lfs/objects/verify",
                    "header": {},
                },
            }
        objects.append(entry)
    value = {"transfer": "basic", "objects": objects, "hash_algo": "sha256"}
    h._json(value, content_type="application/vnd.git-lfs+json")


def _verify(h: _Handler, body: dict[str, Any]) -> None:
    with h.hub._lock:
        data = h.hub.lfs.get(str(body.get("oid")))
    if data is None or len(data) != body.get("size"):
        h._error(404, None, "Object not found")
        return
    h._json({})


def _commit(
    h: _Handler, repo_id: str, revision: str, body: bytes, query: dict[str, list[str]]
) -> None:
    repo = _writable_repo(h, repo_id)
    if repo is None:
        return
    if query.get("create_pr"):
        h._error(400, None, "pull requests are not served by the loopback Hub")
        return
    hub = h.hub
    files: dict[str, bytes] = {}
    deleted: list[str] = []
    parent = None
    for line in body.splitlines():
        item = json.loads(line)
        key, value = item["key"], item["value"]
        if key == "header":
            parent = value.get("parentCommit")
        elif key == "file":
            files[value["path"]] = base64.b64decode(value["content"])
        elif key == "lfsFile":
            with hub._lock:
                data = hub.lfs.get(value["oid"])
            if data is None:
                h._error(
                    400,
                    None,
                    "Your push was rejected because an LFS pointer pointed to a file that "
                    "does not exist. For instance, this can happen if you used git push "
                    "--no-verify to push your changes.",
                )
                return
            files[value["path"]] = data
        elif key in ("deletedFile", "deletedFolder"):
            deleted.append(value["path"] + ("/" if key == "deletedFolder" else ""))
    with hub._lock:
        head = repo.refs.get(revision)
        tree = repo.commits[head] if head is not None else {}
        missing = [p for p in deleted if not p.endswith("/") and p not in tree]
        conflict = parent is not None and parent != head
        ok = head is not None and not conflict and not missing
        sha = hub.apply(repo, repo_id, revision, files, deleted=tuple(deleted)) if ok else ""
    if head is None:
        h._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
    elif conflict:
        h._error(412, None, "A commit has happened since. Please refresh and try again.")
    elif missing:
        h._error(404, "EntryNotFound", f"A file with this name doesn't exist: {missing[0]}")
    else:
        url = f"{hub.endpoint}/datasets/{repo_id}/commit/{sha}"
        h._json(
            {"success": True, "commitOid": sha, "commitUrl": url, "hookOutput": "",
             "pullRequestUrl": None}
        )  # fmt: skip
