"""The Hub side of a publish: the repo, its branch, and what of the staged folder it lacks.

The remote tree is compared with the staged folder first (an LFS file by its sha256, a small
one by its git blob id): a file the branch already holds is not sent, a file of regen's
folders the dataset no longer has is deleted, and an unchanged dataset makes no request past
the listing. What differs goes through huggingface_hub's `upload_folder`: with `hf_xet` (a
dependency of huggingface_hub) a streamed, multi-commit, resumable upload whose chunks the
Hub deduplicates; without it, LFS uploads and one commit, where a rerun skips every object
the Hub already has. Either way an interrupted publish is resumed by running it again.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from regen.config.uris import HubRepoTarget
from regen.dataset.keys import REPORT_PREFIX
from regen.errors import UsageError, UserError
from regen.hub_errors import has_token
from regen.publish.stage import CARD, CONFIG_DIRS

if TYPE_CHECKING:
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

MAIN = "main"
_OURS = (*(f"{d}/" for d in CONFIG_DIRS.values()), REPORT_PREFIX)
"""Folders of the repo that regen writes whole: a file there that it did not stage goes."""
_WRITE_HINT = "set HF_TOKEN (or `hf auth login`) to a token with write access"


@dataclass(frozen=True)
class Upload:
    """What one publish did on the Hub."""

    url: str
    commit: str
    created: bool
    """The repo was created by this publish."""
    private: bool
    uploaded: list[str] = field(default_factory=list)
    uploaded_bytes: int = 0
    unchanged: int = 0
    deleted: list[str] = field(default_factory=list)

    @property
    def nothing_new(self) -> bool:
        return not self.uploaded and not self.deleted


def upload(
    target: HubRepoTarget,
    folder: Path,
    files: dict[str, tuple[str, int]],
    *,
    revision: str = MAIN,
    private: bool = True,
    token: str | None = None,
    message: str,
) -> Upload:
    """Bring `revision` of the dataset repo to the staged `folder` (`files`: path -> sha256,
    size); the repo (private unless `private` is false) and the branch are created if
    missing."""
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    with write_errors(target, revision, token):
        # The Hub's own judgement of the card, before any byte of data is sent.
        validate_card(target, (folder / CARD).read_text())
        _refuse_other_kinds(api, target)
        created, is_private = _ensure_repo(api, target, private)
        if revision != MAIN:
            api.create_branch(target.repo_id, branch=revision, repo_type="dataset", exist_ok=True)
        remote = _remote_files(api, target, revision)
        changed = [p for p, (sha, _) in files.items() if not _same(remote.get(p), folder / p, sha)]
        stale = sorted(p for p in remote if p not in files and p.startswith(_OURS))
        base = Upload(
            url=_url(api, target, revision),
            commit="",
            created=created,
            private=is_private,
            unchanged=len(files) - len(changed),
        )
        if not changed and not stale:
            info = api.repo_info(target.repo_id, repo_type="dataset", revision=revision)
            return _with(base, commit=info.sha or "")
        if changed:
            commit = api.upload_folder(
                repo_id=target.repo_id,
                folder_path=folder,
                repo_type="dataset",
                revision=revision,
                commit_message=message,
                # Only what differs is hashed and sent; all of it on a first publish.
                allow_patterns=changed if len(changed) < len(files) else None,
                delete_patterns=stale or None,
            )
        else:
            from huggingface_hub import CommitOperationDelete

            commit = api.create_commit(
                target.repo_id,
                repo_type="dataset",
                revision=revision,
                operations=[CommitOperationDelete(path_in_repo=p) for p in stale],
                commit_message=message,
            )
    return _with(
        base,
        commit=commit.oid,
        uploaded=changed,
        uploaded_bytes=sum(files[p][1] for p in changed),
        deleted=stale,
    )


def validate_card(target: HubRepoTarget, text: str) -> None:
    """The Hub's validation of the card's metadata (`DatasetCard.validate`); what it refuses
    (a license id it does not know) is the user's to change."""
    from huggingface_hub import DatasetCard

    try:
        DatasetCard(text).validate()
    except ValueError as err:
        # The Hub answers a JSON list of errors; say their messages, one after the other.
        try:
            errors = json.loads(str(err)).get("errors") or []
            said = "; ".join(str(e.get("message")) for e in errors) or str(err)
        except (ValueError, AttributeError):
            said = str(err)
        said = " ".join(said.split())
        raise UsageError(f"{target.uri}: the Hub refused the card's metadata: {said}") from None


def _with(base: Upload, **changes: object) -> Upload:
    from dataclasses import replace

    return replace(base, **changes)  # type: ignore[arg-type]


def _refuse_other_kinds(api: HfApi, target: HubRepoTarget) -> None:
    """`hf://ORG/NAME` is a model repo to huggingface_hub's own `hf://` paths: when a model or
    Space of that name exists and no dataset does, the user meant something else."""
    if target.named_dataset or api.repo_exists(target.repo_id, repo_type="dataset"):
        return
    for kind in ("model", "space"):
        if api.repo_exists(target.repo_id, repo_type=kind):
            raise UsageError(
                f"hf://{target.repo_id} is a {kind} repo on the Hub, not a dataset: regen "
                f"publishes dataset repos; name hf://datasets/{target.repo_id} to create the "
                "dataset repo of that name beside it"
            )


def _ensure_repo(api: HfApi, target: HubRepoTarget, private: bool) -> tuple[bool, bool]:
    """(created now, private): an existing repo is used as it is, its visibility untouched."""
    from huggingface_hub.errors import RepositoryNotFoundError

    try:
        info = api.repo_info(target.repo_id, repo_type="dataset")
    except RepositoryNotFoundError:
        api.create_repo(target.repo_id, repo_type="dataset", private=private, exist_ok=True)
        return True, private
    return False, bool(info.private)


def _remote_files(api: HfApi, target: HubRepoTarget, revision: str) -> dict[str, RepoFile]:
    from huggingface_hub.hf_api import RepoFile

    tree = api.list_repo_tree(
        target.repo_id, repo_type="dataset", revision=revision, recursive=True
    )
    return {entry.path: entry for entry in tree if isinstance(entry, RepoFile)}


def _same(remote: RepoFile | None, local: Path, sha256: str) -> bool:
    """Whether the branch holds these bytes: an LFS file by its sha256, a file in git by its
    blob id (small files only: the Hub keeps large and binary files in LFS)."""
    if remote is None:
        return False
    if remote.lfs is not None:
        return bool(remote.lfs.sha256 == sha256)
    from huggingface_hub.utils.sha import git_hash

    return bool(git_hash(local.read_bytes()) == remote.blob_id)


def _url(api: HfApi, target: HubRepoTarget, revision: str) -> str:
    url = f"{api.endpoint}/datasets/{target.repo_id}"
    return url if revision == MAIN else f"{url}/tree/{revision}"


@contextmanager
def write_errors(target: HubRepoTarget, revision: str, token: str | None) -> Iterator[None]:
    """huggingface_hub's exceptions as one line about the repo and what to do: exit 2 for a
    token or a name the user must change, 1 for a Hub or network that failed (a rerun resumes:
    what was uploaded is not uploaded again)."""
    import httpx2
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = f"{target.uri}@{revision}"
    try:
        yield
    except RuntimeError as err:  # an LFS upload's failure, wrapped by huggingface_hub
        cause = err.__cause__
        if isinstance(cause, HfHubHTTPError):
            # The storage's presigned URL answered, not the Hub: no token is at fault.
            status = cause.response.status_code
            said = f": {cause.server_message.strip()}" if cause.server_message else ""
            raise UserError(
                f"{where}: {str(err).rstrip('.')} (HTTP {status}{said}); run it again: what "
                "was uploaded is not sent twice"
            ) from None
        if isinstance(cause, httpx2.TransportError):
            raise _unreachable(where, constants.ENDPOINT) from None
        raise
    except RevisionNotFoundError:
        raise UsageError(f"{where}: branch {revision} not found and not created") from None
    except RepositoryNotFoundError as err:
        if not has_token(token):
            raise UsageError(f"{where}: no Hugging Face token: {_WRITE_HINT}") from None
        raise _http(where, target, err, token) from None
    except HfHubHTTPError as err:
        raise _http(where, target, err, token) from None
    except httpx2.TransportError:
        raise _unreachable(where, constants.ENDPOINT) from None


def _http(where: str, target: HubRepoTarget, err: Exception, token: str | None) -> UserError:
    response = getattr(err, "response", None)
    status = response.status_code if response is not None else None
    said = getattr(err, "server_message", None) or ""
    said = f": {said.strip().splitlines()[0]}" if said.strip() else ""
    org = target.repo_id.split("/")[0]
    if status == 401 or not has_token(token):
        what = "no Hugging Face token" if not has_token(token) else "the token was refused"
        return UsageError(f"{where}: {what} (HTTP {status}{said}): {_WRITE_HINT} to {org}")
    if status in (403, 404):
        return UsageError(
            f"{where}: this token cannot write here (HTTP {status}{said}): use a token with "
            f"write access to {org}"
        )
    return UserError(
        f"{where}: the Hub answered HTTP {status}{said}; run it again: what was uploaded is "
        "not sent twice"
    )


def _unreachable(where: str, endpoint: str) -> UserError:
    return UserError(
        f"{where}: cannot reach the Hub at {endpoint}: check the network (HF_ENDPOINT, proxy), "
        "then run it again: what was uploaded is not sent twice"
    )
