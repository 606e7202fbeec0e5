"""A prompt set named by a glob (`data/*.jsonl`) or a prefix (`s3://bucket/prompts/`): the files
it names, in sorted order, read as one set. Sorted, so the rows of the files already there keep
their places and a file dropped in later is picked up by the next run after them (or where its
name sorts); a scheduled rerun then generates its rows alone.
"""

from __future__ import annotations

import fnmatch
import re

from regen.errors import UserError
from regen.storage import open_storage

# What a file of a prefix must end with to be read as prompts (rejects, markers and the like
# that share a prefix are left alone).
PROMPT_SUFFIXES = (".jsonl", ".json", ".parquet")
_GLOB = re.compile(r"[*?\[]")


def is_many(spec: str) -> bool:
    """A prefix (ends with `/`) or a glob, rather than one file."""
    return spec.endswith("/") or _GLOB.search(spec) is not None


def prompt_files(spec: str) -> list[str]:
    """The files `spec` names, local paths or URLs, sorted by name. Raises UserError when it
    names none."""
    glob = _GLOB.search(spec)
    head = spec[: glob.start()] if glob else spec
    root, _, _ = head.rpartition("/")
    pattern = spec[len(root) + 1 :] if root else spec
    try:
        keys = open_storage(root or ".").list()
    except OSError as err:
        raise UserError(f"{spec}: cannot list the prompt files: {err}") from None
    if glob:
        found = [k for k in keys if fnmatch.fnmatchcase(k, pattern)]
    else:  # a prefix: every prompt file under it
        found = [k for k in keys if k.endswith(PROMPT_SUFFIXES)]
    if not found:
        raise UserError(f"{spec}: no prompt files match (looked for {PROMPT_SUFFIXES})")
    return [f"{root}/{key}" if root else key for key in sorted(found)]
