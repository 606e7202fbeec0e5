"""A prompt set on the Hugging Face Hub: `hf://datasets/ORG/NAME[@REVISION][/PATH-OR-GLOB]`.

The revision is resolved to its commit first, so every file of one run comes from one commit
and run.json can say which (`HubSelection.record`); a rerun pinned to `@<commit>` reads the
same bytes. Without a path, the split (`input.split`, default `train`, or the only split
present) picks the files by the Hub's naming conventions: `data/<split>-00000-of-00002.parquet`,
a `<split>/` directory, a `<split>.jsonl` or `<split>_part1.jsonl` file; `input.subset` first
narrows to a config's directory. A repo whose files name no split at all is one split.

A dataset card (README.md at the commit) that declares `configs:` is honoured first, as
Hugging Face `datasets` does: `input.subset` names a `config_name` (default: the one marked
`default: true`, or `default`, or the only one), `input.split` one of its `data_files` splits,
and the files are those its patterns match (`fsspec` glob rules, as `datasets` resolves them).

Listing needs the Hub (one API call; of the files, only the card is downloaded); with
`HF_HUB_OFFLINE=1` the listing is the cache's snapshot of the commit the revision last resolved
to, and the card the cached one (a cache without it falls back to the naming conventions).
Files arrive through huggingface_hub's `snapshot_download` into its cache (its progress bars,
retries, resume).
"""

from __future__ import annotations

import fnmatch
import glob
import logging
import posixpath
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from regen.config.uris import PREFIX, HubUri
from regen.errors import UserError
from regen.hub_errors import cache_dir, gated, has_token, hub_errors, offline

log = logging.getLogger(__name__)

DATA_SUFFIXES = (".jsonl", ".json", ".parquet")
_COMMIT = re.compile(r"[0-9a-f]{40}")
_GLOB = re.compile(r"[*?\[]")
# `data/train_sft-00000-of-00003-6f2c....parquet`: what the Hub's converter and
# `push_to_hub` write; the split is everything before the shard number.
_SHARDED = re.compile(r"(?P<split>.+?)-\d{5}-of-\d{5}")
# The split words the Hub's dataset viewer recognises in file and directory names.
_SPLIT_WORDS = {
    "train": "train",
    "training": "train",
    "validation": "validation",
    "valid": "validation",
    "val": "validation",
    "dev": "validation",
    "test": "test",
    "testing": "test",
    "eval": "test",
    "evaluation": "test",
}
_WORD = re.compile(r"([A-Za-z]+)(?:[-._ 0-9]|$)")
CARD = "README.md"
# What `datasets` never takes for data unless a pattern names the file itself
# (datasets.data_files.FILES_TO_IGNORE).
_NOT_DATA = frozenset(
    {
        "README.md",
        "config.json",
        "dataset_info.json",
        "dataset_infos.json",
        "dummy_data.zip",
        "dataset_dict.json",
    }
)


@dataclass(frozen=True)
class HubFile:
    path: str
    size: int | None


@dataclass(frozen=True)
class HubSelection:
    """The files of one commit a `hf://` spec names, and how they were chosen."""

    uri: HubUri
    commit: str
    files: list[HubFile]
    chosen_by: str

    def name(self, path: str) -> str:
        """How a file is named in messages and reject reasons."""
        return f"{PREFIX}{self.uri.repo_id}/{path}"

    @property
    def pinned(self) -> str:
        """The spec at its commit: the same rows again, whatever the branch does since."""
        tail = f"/{self.uri.path}" if self.uri.path else ""
        return f"{PREFIX}{self.uri.repo_id}@{self.commit}{tail}"

    @property
    def total_bytes(self) -> int:
        return sum(f.size or 0 for f in self.files)

    def record(self) -> dict[str, Any]:
        """What run.json keeps of the source: enough to read the same files again."""
        return {
            "repo": self.uri.repo_id,
            "revision": self.uri.revision or "main",
            "commit": self.commit,
            "selected_by": self.chosen_by,
            "files": [f.path for f in self.files],
        }


def resolve(
    spec: str, *, split: str | None = None, subset: str | None = None, token: str | None = None
) -> HubSelection:
    """The commit `spec`'s revision is at and the prompt files it names there; of the files
    only the card (README.md, for its configs) is downloaded. Raises UserError naming the repo
    and what to do."""
    uri = HubUri.parse(spec)
    with hub_errors(uri.repo, uri.revision, token):
        commit, listing, cached = _cached_listing(uri) if offline() else _listing(uri, token)
        # A path in the spec names the files itself, as `data_files=` does to `datasets`.
        card = None if uri.path else _card(uri, commit, listing, cached, token)
    configs = _configs(uri, card)
    files, chosen_by = _select(uri, listing, split, subset, configs)
    return HubSelection(uri, commit, files, chosen_by)


@dataclass(frozen=True)
class HubConfig:
    """One entry of a dataset card's `configs:`. `splits` maps each split to its `data_files`
    patterns, None when the config gives none (the naming conventions then pick, under
    `data_dir` when it has one)."""

    name: str
    default: bool
    data_dir: str | None
    splits: dict[str, list[str]] | None


def _card(
    uri: HubUri, commit: str, listing: list[HubFile], cached: bool, token: str | None
) -> dict[str, Any] | None:
    """The YAML header of the dataset card at `commit`, None without a card. The card is one
    small file, fetched at the commit (so a rerun pinned to it reads the same configs) into
    huggingface_hub's cache, where an offline run finds it."""
    import yaml
    from huggingface_hub import hf_hub_download
    from huggingface_hub.repocard import metadata_load

    if not any(f.path == CARD for f in listing):
        if cached:  # the cache's snapshot holds what was downloaded, maybe not the card
            log.warning(
                "%s: %s is not in the cache at commit %s: files are chosen by the Hub's "
                "naming conventions, not by any configs the card declares",
                uri.repo,
                CARD,
                commit,
            )
        return None
    path = hf_hub_download(uri.repo_id, CARD, repo_type="dataset", revision=commit, token=token)
    try:
        return metadata_load(path)
    except (ValueError, yaml.YAMLError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise UserError(f"{uri.repo}: {CARD}'s YAML header does not parse: {first}") from None


def _configs(uri: HubUri, card: dict[str, Any] | None) -> list[HubConfig]:
    """The card's `configs:`, checked as `datasets` checks them (its MetadataConfigs)."""
    raw = (card or {}).get("configs")
    if not raw:
        return []

    def bad(problem: str) -> UserError:
        return UserError(
            f"{uri.repo}: {CARD}'s configs: {problem}: fix the card, or name the files "
            "in the spec (hf://datasets/ORG/NAME/PATH-OR-GLOB)"
        )

    if not isinstance(raw, list):
        raise bad("expected a list of configs")
    configs: list[HubConfig] = []
    for entry in raw:
        if not isinstance(entry, dict) or not isinstance(entry.get("config_name"), str):
            raise bad(f"each config needs a config_name, got {entry!r}")
        name = entry["config_name"]
        data_dir = entry.get("data_dir")
        if data_dir is not None and not isinstance(data_dir, str):
            raise bad(f"config {name}: data_dir must be a string")
        try:
            splits = _data_files(entry.get("data_files"))
        except ValueError as err:
            raise bad(f"config {name}: {err}") from None
        if any(c.name == name for c in configs):
            raise bad(f"config {name} is declared twice")
        configs.append(HubConfig(name, bool(entry.get("default")), data_dir, splits or None))
    if len([c for c in configs if _is_default(c, configs)]) > 1:
        raise bad("several configs are the default")
    return configs


def _data_files(value: Any) -> dict[str, list[str]] | None:
    """`data_files` as `datasets.data_files.sanitize_patterns` reads it: one pattern or a list
    is the split `train`; a list of `{split, path}` names each split. None when absent."""
    if value is None:
        return None
    if isinstance(value, str):
        return {"train": [value]}
    malformed = ValueError("data_files must be a path, a list of paths, or a list of {split, path}")
    if not isinstance(value, list):
        raise malformed
    if all(isinstance(v, str) for v in value):
        return {"train": list(value)}
    splits: dict[str, list[str]] = {}
    for item in value:
        if not (isinstance(item, dict) and set(item) == {"split", "path"}):
            raise malformed
        split, path = item["split"], item["path"]
        paths = [path] if isinstance(path, str) else path
        if not isinstance(split, str) or not isinstance(paths, list):
            raise malformed
        if not all(isinstance(p, str) for p in paths):
            raise malformed
        if split in splits:
            raise ValueError(f"split {split} is named twice")
        splits[split] = paths
    return splits


def _is_default(config: HubConfig, configs: list[HubConfig]) -> bool:
    """`datasets`' MetadataConfigs.get_default_config_name: marked, named `default`, or alone."""
    return len(configs) == 1 or config.default or config.name == "default"


def download(selection: HubSelection, token: str | None = None) -> list[Path]:
    """The selected files, local paths in huggingface_hub's cache, in the selection's order."""
    from huggingface_hub import snapshot_download

    uri = selection.uri
    with hub_errors(uri.repo, uri.revision, token):
        folder = snapshot_download(
            uri.repo_id,
            repo_type="dataset",
            revision=selection.commit,
            # fnmatch globs: escaped, so a `[` in a file name is itself.
            allow_patterns=[glob.escape(f.path) for f in selection.files],
            token=token,
        )
    _remember_revision(selection)
    return [Path(folder) / f.path for f in selection.files]


def _storage(uri: HubUri) -> Path:
    """The repo's folder in huggingface_hub's cache (its documented layout)."""
    return Path(cache_dir()) / f"datasets--{uri.repo_id.replace('/', '--')}"


def _remember_revision(selection: HubSelection) -> None:
    """Write the cache's `refs/<revision>`: the download asked for the commit, so that every
    file is of the commit listed, and huggingface_hub records a branch's commit only when
    asked for the branch; an offline run finds `main` (or a tag) through this file."""
    revision = selection.uri.revision or "main"
    if _COMMIT.fullmatch(revision) or offline():
        return
    ref = _storage(selection.uri) / "refs" / revision
    if ref.is_file() and ref.read_text() == selection.commit:
        return
    ref.parent.mkdir(parents=True, exist_ok=True)
    temp = ref.with_name(f".{ref.name}.tmp")
    temp.write_text(selection.commit)
    temp.replace(ref)  # atomic: a concurrent reader never sees a half-written ref


def _listing(uri: HubUri, token: str | None) -> tuple[str, list[HubFile], bool]:
    """The Hub's listing, or the cache's when the Hub cannot be reached (as huggingface_hub's
    own downloads fall back): a network blip does not stop a run whose files are cached.
    The flag says the listing is the cache's."""
    import httpx2

    try:
        return (*_hub_listing(uri, token), False)
    except httpx2.TransportError as err:
        try:
            commit, files, _ = _cached_listing(uri)
        except FileNotFoundError:
            raise err from None
        log.warning(
            "%s: the Hub cannot be reached (%s): reading the cached commit %s",
            uri.repo,
            type(err).__name__,
            commit,
        )
        return commit, files, True


def _hub_listing(uri: HubUri, token: str | None) -> tuple[str, list[HubFile]]:
    from huggingface_hub import HfApi

    info = HfApi(token=token).dataset_info(uri.repo_id, revision=uri.revision, files_metadata=True)
    assert info.sha is not None  # the Hub always answers with the commit
    if info.gated and not has_token(token):  # its listing is public, its files are not
        raise gated(uri.repo)
    return info.sha, [HubFile(s.rfilename, s.size) for s in info.siblings or []]


def _cached_listing(uri: HubUri) -> tuple[str, list[HubFile], bool]:
    """Offline: the commit the revision last resolved to in the cache, and that snapshot's
    files (those some earlier download brought)."""
    from huggingface_hub.errors import LocalEntryNotFoundError

    storage = _storage(uri)
    revision = uri.revision or "main"
    commit: str | None = revision if _COMMIT.fullmatch(revision) else None
    ref = storage / "refs" / revision
    if commit is None and ref.is_file():
        commit = ref.read_text().strip()
    snapshot = storage / "snapshots" / (commit or "")
    if commit is None or not snapshot.is_dir():
        raise LocalEntryNotFoundError(f"{uri.repo}: not in the cache")
    files = [
        HubFile(p.relative_to(snapshot).as_posix(), p.stat().st_size)
        for p in sorted(snapshot.rglob("*"))
        if p.is_file()
    ]
    return commit, files, True


def _select(
    uri: HubUri,
    listing: list[HubFile],
    split: str | None,
    subset: str | None,
    configs: list[HubConfig] | None = None,
) -> tuple[list[HubFile], str]:
    data = sorted((f for f in listing if f.path.endswith(DATA_SUFFIXES)), key=lambda f: f.path)
    if uri.path:
        found = _by_path(data, uri.path)
        if not found:
            raise UserError(f"{uri.repo}: no prompt file matches {uri.path} ({_some(data)})")
        return found, f"path {uri.path}"
    if configs:
        return _by_config(uri, listing, split, _config(uri, configs, subset))
    if subset:
        data = _under(data, subset)
        if not data:
            raise UserError(
                f"{uri.repo}: no prompt files under subset directory {subset}/: check input.subset"
            )
    return _by_convention(uri, data, split, f" of subset {subset}" if subset else "")


def _under(data: list[HubFile], directory: str) -> list[HubFile]:
    return [f for f in data if f.path.startswith(f"{directory.strip('/')}/")]


def _by_convention(
    uri: HubUri, data: list[HubFile], split: str | None, named: str
) -> tuple[list[HubFile], str]:
    """The files of `split` by the Hub's naming conventions; `named` says in messages which
    part of the repo `data` is."""
    present = sorted({s for f in data if (s := _split_of(f.path)) is not None})
    if split is None:
        if any(_in_split(f.path, "train") for f in data):
            split = "train"
        elif len(present) == 1:
            split = present[0]
        elif not present and data:  # no file names a split: the repo is one split
            return data, f"all {len(data)} files{named} (no split in their names)"
        else:
            raise UserError(
                f"{uri.repo}: no files of split train{named} (splits present: "
                f"{', '.join(present) or 'none'}): set input.split"
            )
    found = [f for f in data if _in_split(f.path, split)]
    if not found:
        raise UserError(
            f"{uri.repo}: no prompt file matches split {split}{named} (splits present: "
            f"{', '.join(present) or 'none'}): set input.split, or name the files after the repo"
        )
    return found, f"split {split}{named}"


def _config(uri: HubUri, configs: list[HubConfig], subset: str | None) -> HubConfig:
    """The card's config `input.subset` names, or its default."""
    names = ", ".join(c.name for c in configs)
    if subset is None:
        default = [c for c in configs if _is_default(c, configs)]
        if not default:
            raise UserError(
                f"{uri.repo}: {CARD} declares configs {names} and none is the default: "
                "set input.subset"
            )
        return default[0]
    for config in configs:
        if config.name == subset:
            return config
    raise UserError(
        f"{uri.repo}: no config {subset} in {CARD}'s configs (configs: {names}): set input.subset"
    )


def _by_config(
    uri: HubUri, listing: list[HubFile], split: str | None, config: HubConfig
) -> tuple[list[HubFile], str]:
    """The files of one split of a card's config: its `data_files` patterns resolved as
    `datasets` resolves them, pattern by pattern, each pattern's files in name order."""
    by = f"{CARD} configs: config {config.name}"
    if config.splits is None:  # no data_files: the conventions, under data_dir when given
        data = sorted((f for f in listing if f.path.endswith(DATA_SUFFIXES)), key=lambda f: f.path)
        if config.data_dir:
            data = _under(data, config.data_dir)
        found, how = _by_convention(uri, data, split, f" of config {config.name}")
        return found, f"{CARD} configs: {how}"
    splits = list(config.splits)
    if split is None:
        # `train`, or the only split; with several and no train, the error below names them.
        split = "train" if "train" in splits or len(splits) > 1 else splits[0]
    if split not in config.splits:
        raise UserError(
            f"{uri.repo}: no split {split} in config {config.name} of {CARD}'s configs "
            f"(splits: {', '.join(splits)}): set input.split"
        )
    ordered = sorted(listing, key=lambda f: f.path)
    chosen: dict[str, HubFile] = {}  # a file two patterns match is read once
    for pattern in config.splits[split]:
        # Relative to data_dir when the config has one, as `datasets` joins them.
        full = posixpath.join(config.data_dir, pattern) if config.data_dir else pattern
        for f in _matching(uri, ordered, full):
            chosen.setdefault(f.path, f)
    where = f"split {split} of config {config.name} in {CARD}'s configs"
    if not chosen:
        patterns = ", ".join(config.splits[split])
        raise UserError(f"{uri.repo}: no file matches {where} ({patterns})")
    unreadable = [p for p in chosen if not p.endswith(DATA_SUFFIXES)]
    if unreadable:
        raise UserError(
            f"{uri.repo}: {where} has files regen cannot read ({', '.join(unreadable[:3])}): "
            "prompts are .jsonl, .json or .parquet; name the files in the spec instead"
        )
    return list(chosen.values()), f"{by}, split {split}"


def _matching(uri: HubUri, listing: list[HubFile], pattern: str) -> list[HubFile]:
    """The files `pattern` names, as `datasets.data_files.resolve_pattern` finds them: fsspec's
    glob (`*` within one directory, `**` across them, `?`, `[...]`), a plain path only
    itself; card and metadata files, hidden files and `__special__` directories only when
    the pattern names them."""
    # huggingface_hub's own dependency (HfFileSystem); the function fsspec's glob matches with.
    from fsspec.utils import glob_translate  # type: ignore[import-untyped]

    if "://" in pattern:
        raise UserError(
            f"{uri.repo}: {CARD}'s configs name {pattern}, outside the repo: name the files "
            "in the spec instead"
        )
    if _GLOB.search(pattern):
        try:
            regex = re.compile(glob_translate(pattern))
        except ValueError as err:  # `**` inside a name
            raise UserError(f"{uri.repo}: {CARD}'s configs: {pattern}: {err}") from None
        hits = [f for f in listing if regex.match(f.path)]
    else:
        hits = [f for f in listing if f.path == pattern]
    name = posixpath.basename(pattern)
    return [
        f
        for f in hits
        if (posixpath.basename(f.path) not in _NOT_DATA or posixpath.basename(f.path) == name)
        and _count(f.path, _hidden) == _count(pattern, _hidden)
        and _count(posixpath.dirname(f.path), _special)
        == _count(posixpath.dirname(pattern), _special)
    ]


def _hidden(part: str) -> bool:
    return part.startswith(".") and set(part) != {"."}


def _special(part: str) -> bool:
    return part.startswith("__")


def _count(path: str, kind: Callable[[str], bool]) -> int:
    """How many of `path`'s parts are of `kind`: a matched file is taken only when its pattern
    has as many (`datasets`' rule: hidden and `__special__` parts must be asked for)."""
    return sum(1 for part in path.split("/") if part and kind(part))


def _by_path(data: list[HubFile], path: str) -> list[HubFile]:
    if _GLOB.search(path):
        return [f for f in data if fnmatch.fnmatchcase(f.path, path)]
    exact = [f for f in data if f.path == path]
    return exact or [f for f in data if f.path.startswith(path.rstrip("/") + "/")]


def _split_of(path: str) -> str | None:
    """The split a file's name or directory puts it in, None when it names none."""
    *dirs, filename = path.split("/")
    if sharded := _SHARDED.match(filename):
        return sharded["split"]
    for part in dirs:
        if part.lower() in _SPLIT_WORDS:
            return part
    word = _WORD.match(filename)
    return word[1] if word and word[1].lower() in _SPLIT_WORDS else None


def _in_split(path: str, split: str) -> bool:
    """Whether `path` belongs to `split`: a sharded file by its exact split name, any other by a
    directory of that name or a file name that starts with it (`train.jsonl`, `train_1.json`)."""
    *dirs, filename = path.split("/")
    if sharded := _SHARDED.match(filename):
        return sharded["split"] == split
    if split in dirs:
        return True
    stem = filename.rsplit(".", 1)[0]
    if stem == split or re.match(rf"{re.escape(split)}[-._ 0-9]", stem):
        return True
    found = _split_of(path)
    return found is not None and _SPLIT_WORDS.get(found.lower()) == split


def _some(data: list[HubFile]) -> str:
    if not data:
        return "the repo has no .jsonl, .json or .parquet files"
    shown = ", ".join(f.path for f in data[:3])
    return f"files: {shown}" + (f" and {len(data) - 3} more" if len(data) > 3 else "")
