"""A run opened once: its resolved config, its opened storage and its model's tokenizer,
handed to every stage.

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
class OpenedRun:
    config: RegenConfig
    opened: Storage | None = None
    """Storage opened before the run (an S3Bucket block, with the block's credentials)."""
    hf_token: str | None = field(default=None, repr=False)
    """The ModelSource block's Hub token, for a Hub prompt set too (None: HF_TOKEN)."""

    @cached_property
    def storage(self) -> Storage:
        """Opened on first use: provisioning's storage check is the first, so a bad output
        URL is a failed check in its table rather than an error before it."""
        return self.opened or open_storage(self.config.output)

    @property
    def output(self) -> str:
        return self.config.output

    @property
    def model_dir(self) -> Path:
        """The directory the servers load the model from (staged, or the source itself)."""
        return self.config.model.staged_path()

    @cached_property
    def tokenizer(self) -> str | None:
        """The tokenizer (a model directory or tokenizer.json) whose chat template the audit's
        checks 10-11 and the token exports render with: see `resolve_tokenizer`. Read after
        staging, it is the staged model; on a machine that staged none (a multi-node run's
        parent) a remote model's tokenizer files are fetched into the work dir."""
        path = resolve_tokenizer(
            self.config.model, self.config.work_dir / TOKENIZER_DIR, hf_token=self.hf_token
        )
        return str(path) if path is not None else None


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
