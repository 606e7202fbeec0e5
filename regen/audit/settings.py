"""What makes an audit summary: the thresholds and knobs, what thinking stores, the model's
template and the rows per shard that template parity renders again.

Apart from the measuring (`regen.audit.summary`) so that the checks, which grade a summary
under these settings, import it without importing what measures with them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import polars as pl

from regen.audit.dataset import DatasetView, thinking_enabled
from regen.audit.dataset import thinking_requested as run_thinking
from regen.audit.loss_mask import ModelTemplate, load_model_template
from regen.config import AuditConfig
from regen.storage import Storage

SUMMARY_FORMAT = 4
"""Raised when what a summary holds or how it is computed changes: old ones are recomputed."""

# Settings that change no figure of a summary: changing them must not recompute any.
_NOT_KEYED = {"live", "live_min_rows", "batch_rows", "rejects"}


@dataclass(frozen=True)
class AuditSettings:
    """What makes a summary: thresholds and knobs, what thinking stores, the model template,
    and the rows per shard that template parity renders again."""

    config: AuditConfig
    thinking: bool
    """Rows should carry reasoning (regeneration.thinking is save)."""
    model: ModelTemplate
    parity_rows: int
    """Per shard; 0 renders every row."""

    @cached_property
    def key(self) -> str:
        """A hash of everything that changes a summary's figures (and of polars' version: the
        answer hashes are polars')."""
        config = self.config.model_dump(mode="json", exclude=_NOT_KEYED)
        template = self.model.template
        identity = (
            hashlib.sha256(
                template.path.read_bytes() + template.tokenizer.to_str().encode()
            ).hexdigest()
            if template is not None
            else None
        )
        blob = json.dumps(
            [
                SUMMARY_FORMAT,
                pl.__version__,
                config,
                self.thinking,
                self.model.enable_thinking,
                identity,
                self.parity_rows,
            ],
            sort_keys=True,
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def settings_for(
    storage: Storage,
    view: DatasetView,
    config: AuditConfig,
    *,
    thinking_requested: bool | None = None,
    tokenizer_path: Path | str | None = None,
) -> AuditSettings:
    """The settings of a dataset's audit: run.json's thinking, the model directory's template,
    and template parity's budget of `template_parity_rows` spread evenly over the planned
    shards."""
    thinking = run_thinking(storage) if thinking_requested is None else thinking_requested
    path = Path(tokenizer_path) if tokenizer_path else None
    model = load_model_template(path, enable_thinking=thinking_enabled(storage))
    limit = config.template_parity_rows
    shards = view.plan["shard"].n_unique() if view.plan is not None else len(view.committed)
    per_shard = -(-limit // max(shards, 1)) if limit else 0
    return AuditSettings(config, thinking, model, per_shard)
