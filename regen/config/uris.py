"""The URIs a config names: an S3 bucket and prefix, or a Hub dataset.

The one parser of `hf://` dataset URIs: the config validates the syntax with it, and
`regen.prompts.hub` resolves what it names.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote

from regen.errors import ConfigError

PREFIX = "hf://datasets/"


def is_hub(spec: str) -> bool:
    return spec.startswith("hf://")


@dataclass(frozen=True)
class HubUri:
    repo_id: str
    revision: str | None
    path: str

    @classmethod
    def parse(cls, uri: str) -> HubUri:
        """`hf://datasets/ORG/NAME[@REVISION][/PATH]`; a revision with `/` (refs/pr/1) is
        written URL-encoded (`refs%2Fpr%2F1`), as the Hub's own hf:// paths write it."""
        if not uri.startswith(PREFIX):
            raise ConfigError(
                f"{uri}: prompts on the Hub are hf://datasets/ORG/NAME[@REVISION][/PATH]"
            )
        parts = uri[len(PREFIX) :].split("/", 2)
        if len(parts) < 2 or not parts[0] or not parts[1].partition("@")[0]:
            raise ConfigError(f"{uri}: expected hf://datasets/ORG/NAME[@REVISION][/PATH]")
        name, _, revision = parts[1].partition("@")
        path = parts[2] if len(parts) > 2 else ""
        return cls(f"{parts[0]}/{name}", unquote(revision) or None, path)

    @property
    def repo(self) -> str:
        """How messages name the repo: as the user wrote it, revision included."""
        at = f"@{self.revision}" if self.revision else ""
        return f"{PREFIX}{self.repo_id}{at}"


@dataclass(frozen=True)
class HubRepoTarget:
    """Where a dataset is published: `hf://datasets/ORG/NAME`, or `hf://ORG/NAME`, which
    huggingface_hub's own `hf://` paths read as a model repo and regen as the dataset repo
    of that name (`named_dataset` says which form was given)."""

    repo_id: str
    named_dataset: bool

    @classmethod
    def parse(cls, spec: str) -> HubRepoTarget:
        usage = f"{spec}: publish to hf://datasets/ORG/NAME (or hf://ORG/NAME)"
        if not spec.startswith("hf://"):
            raise ConfigError(usage)
        parts = spec.removeprefix("hf://").strip("/").split("/")
        named = parts[0] == "datasets"
        if parts[0] in ("models", "spaces", "kernels"):
            raise ConfigError(f"{spec}: not a dataset repo; {usage.partition(': ')[2]}")
        if named:
            parts = parts[1:]
        if len(parts) != 2 or not all(parts) or any("@" in p for p in parts):
            raise ConfigError(f"{usage}; the branch is its own option (revision)")
        return cls("/".join(parts), named)

    @property
    def uri(self) -> str:
        return f"{PREFIX}{self.repo_id}"
