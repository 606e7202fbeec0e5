"""Every committed shard's audit summary at once, for tests that compare them or count which
were computed; the audit itself streams them (`regen.audit.final.iter_shard_summaries`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from regen.audit import AuditSettings, Summary
from regen.audit.dataset import DatasetView
from regen.audit.final import iter_shard_summaries
from regen.storage import Storage


@dataclass
class ShardSummaries:
    """Every committed shard's summary, in shard order, and which were computed now."""

    parts: list[Summary] = field(default_factory=list)
    computed: list[int] = field(default_factory=list)


def shard_summaries(storage: Storage, view: DatasetView, settings: AuditSettings) -> ShardSummaries:
    """Every committed shard's summary (see `iter_shard_summaries`), in a list."""
    out = ShardSummaries()
    out.parts = list(iter_shard_summaries(storage, view, settings, out.computed))
    return out
