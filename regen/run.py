"""A run opened once: its resolved config and its opened dataset, handed to every stage.

Each stage used to reopen the output by URI from the config it was given; a run now opens
its storage at the top and the stages share that one object (and its S3 client). Hooks and
the child runs of a multi-node run live in other processes and open their own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from regen.config import ModelConfig, RegenConfig
from regen.storage import Storage, open_storage

TOKENIZER_DIR = "tokenizer"
"""Under the work dir: the tokenizer files of a model no server staged on this machine."""


@dataclass(frozen=True)
class OpenedDataset:
    """A dataset root as its URI names it (the artifacts' keys) and as it is opened (what is
    read and written): the audit and the exports take both, from a run or on their own."""

    output: str
    storage: Storage

    @classmethod
    def open(cls, output: str) -> OpenedDataset:
        return cls(output, open_storage(output))


@dataclass(frozen=True)
class OpenedRun:
    config: RegenConfig
    opened: Storage | None = None
    """Storage opened before the run (an S3Bucket block, with the block's credentials)."""
    hf_token: str | None = field(default=None, repr=False)
    """The ModelSource block's Hub token, for a Hub prompt set too (None: HF_TOKEN)."""
    key_from: str | None = None
    """The block `engine.api_key` was loaded from (a Secret, a FleetConfig); None: the config."""

    @property
    def key_source(self) -> str:
        """Where the servers' API key comes from, as a 401 names it (the key never is)."""
        engine = self.config.engine
        if engine.api_key is None:
            for_whom = "sent to engine.urls" if engine.kind == "external" else "for its servers"
            return f"the key regen generated {for_whom}, as engine.api_key is not set"
        return self.key_from or "engine.api_key in the run's config"

    @cached_property
    def storage(self) -> Storage:
        """Opened on first use: provisioning's storage check is the first, so a bad output
        URL is a failed check in its table rather than an error before it."""
        return self.opened or open_storage(self.config.output)

    @property
    def output(self) -> str:
        return self.config.output

    @property
    def dataset(self) -> OpenedDataset:
        return OpenedDataset(self.output, self.storage)

    @property
    def work_dir(self) -> Path:
        return self.config.work_dir

    def tokenizer(self) -> str | None:
        """This run's tokenizer as `resolve_tokenizer` answers, fetched into the work dir
        when the model is remote and this machine staged none (a multi-node run's parent)."""
        path = resolve_tokenizer(
            self.config.model, self.work_dir / TOKENIZER_DIR, hf_token=self.hf_token
        )
        return str(path) if path is not None else None


@dataclass(frozen=True)
class StagedModel:
    """What staging leaves: the directory the servers load, and the tokenizer whose chat
    template the audit's template checks and the token exports render with, said together so
    no stage reads one before the other exists."""

    path: Path
    tokenizer: str | None


def resolve_tokenizer(
    model: ModelConfig, fetch_into: Path | None, *, hf_token: str | None = None
) -> Path | None:
    """The one answer to "which tokenizer": `model.tokenizer_path`; else the model directory
    the servers load when it is on this machine (staged here, or a local source); else, for an
    `s3://` or `hf://` source, its tokenizer files fetched into `fetch_into`; else None (the
    checks that need it say they were skipped). A source that cannot be read is a UserError."""
    if model.tokenizer_path is not None:
        return model.tokenizer_path
    for local in (model.staged_path(), Path(model.source)):
        if local.is_dir():
            return local
    if fetch_into is None or not model.source.startswith(("s3://", "hf://")):
        return None
    from regen.staging import stage_model

    staged = stage_model(
        model.source, fetch_into, revision=model.revision, hf_token=hf_token, tokenizer_only=True
    )
    return staged.path
