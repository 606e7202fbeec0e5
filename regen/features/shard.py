"""One dataset shard's features: its samples' stored ids, captured, encoded, committed.

The samples are regen.lossmask's, the one owner of `input_ids` and `loss_mask`: the server's
own `prompt_token_ids` + `response_token_ids` of each turn, nothing rendered again (a turn
without stored ids gives no sample and is counted, `no_token_ids`). Each sample's file is
written as its capture comes back; the manifest, last, commits the shard. A sample the
server refuses (400: longer than its context) is listed as failed in the manifest; a
transport failure (a dead server, every try spent) fails the shard, uncommitted, for a
retry: a fleet that died must not commit a shard of failures.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass

import numpy as np
import polars as pl

from regen.dataset.keys import feature_sample_key
from regen.dataset.reader import Committed
from regen.features.capture import Captured, CaptureError
from regen.features.encode import encode
from regen.features.manifest import (
    FailedSample,
    FeatureManifest,
    FeatureRecord,
    SampleEntry,
    write_manifest,
)
from regen.features.pool import CapturePool, SampleRefused
from regen.lossmask import samples
from regen.lossmask.ids import sample_sizes
from regen.storage import Storage

OnSample = Callable[[int, int], None]
"""Called with (tokens, bytes) of each sample written."""


@dataclass(frozen=True)
class ShardSamples:
    shard: int
    frame: pl.DataFrame
    """`id`, `turn`, `input_ids`, `loss_mask`, `seq_len`, `loss_tokens`, in row order."""
    no_token_ids: int


def shard_samples(committed: Committed, shard: int, record: FeatureRecord) -> ShardSamples:
    rows = committed.scan([shard]).select("id", "turns", "error").collect()
    frame = samples(rows, record.turns).collect()
    turns = sample_sizes(rows.lazy()).collect()
    if record.turns == "last":
        turns = turns.group_by("id", maintain_order=True).last()
    return ShardSamples(shard, frame, turns.height - frame.height)


def capture_shard(
    todo: ShardSamples,
    pool: CapturePool,
    storage: Storage,
    record: FeatureRecord,
    source: str,
    on_sample: OnSample = lambda tokens, size: None,
) -> FeatureManifest:
    """Capture every sample of the shard and commit it (manifest last)."""
    started = time.monotonic()
    width = len(record.hidden_indices) * record.hidden_size
    entries: dict[int, SampleEntry] = {}
    failed: list[FailedSample] = []
    rows = todo.frame.select("id", "turn", "input_ids", "loss_mask").rows()
    # A window of captures in flight, not the whole shard: a finished capture waits in memory
    # only until its file is written (at scale one 2,000-token sample of an 8B is 65 MB).
    window = max(2 * pool.slots, 1)
    pending: dict[futures.Future[Captured], int] = {}
    queued = iter(range(len(rows)))

    def fill() -> None:
        while len(pending) < window and (i := next(queued, None)) is not None:
            pending[pool.submit(list(rows[i][2]))] = i

    try:
        fill()
        while pending:
            done, _ = futures.wait(pending, return_when=futures.FIRST_COMPLETED)
            for future in done:
                i = pending.pop(future)
                sample_id, turn, input_ids, loss_mask = rows[i]
                try:
                    captured = future.result()
                except SampleRefused as err:
                    failed.append(FailedSample(id=sample_id, turn=turn, reason=str(err)))
                    continue
                aux, last = captured.aux, captured.last
                if last is None or aux.shape[1] != width or last.shape[1] != record.hidden_size:
                    raise CaptureError(
                        f"the server captured {aux.shape[1]} aux and "
                        f"{None if last is None else last.shape[1]} final values a token; "
                        f"{record.describe()} has {width} and {record.hidden_size}"
                    )
                data = encode(
                    sample_id, turn, np.asarray(input_ids), np.asarray(loss_mask), aux, last,
                    record.dtype,
                )  # fmt: skip
                key = feature_sample_key(todo.shard, i)
                storage.write_bytes(key, data)
                entries[i] = SampleEntry(
                    id=sample_id, turn=turn, key=key, tokens=len(input_ids),
                    loss_tokens=int(sum(loss_mask)), bytes=len(data),
                    sha256=hashlib.sha256(data).hexdigest(),
                )  # fmt: skip
                on_sample(len(input_ids), len(data))
            fill()
    except BaseException:
        for future in pending:
            future.cancel()
        raise
    manifest = FeatureManifest(
        shard=todo.shard, source=source, fingerprint=record.fingerprint,
        samples=[entries[i] for i in sorted(entries)], failed=failed,
        no_token_ids=todo.no_token_ids, seconds=round(time.monotonic() - started, 3),
    )  # fmt: skip
    write_manifest(storage, manifest)
    return manifest
