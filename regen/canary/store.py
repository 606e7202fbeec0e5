"""The canary's rows: sent once, kept under `canary/`, committed later in their own shards.

Nothing is sent twice: a canary row already stored is never sent again, neither by a
resumed canary nor by its shard, whose commit takes it from the store instead. Nothing is
committed twice: the store lives outside `shards/`, which every reader goes through manifests
to read, so a canary row counts once, when its shard commits. When a run stops at the canary
its rows stay in the store, beside the stop record, for a person to read.
"""

from __future__ import annotations

import io
import threading
from concurrent import futures
from dataclasses import dataclass

import polars as pl

from regen.client import Dispatcher
from regen.dataset.keys import canary_key
from regen.schema import row_schema
from regen.storage import Storage

# The number the canary is submitted under: below every shard, so the dispatcher's queue
# (ordered by shard number) sends it before any shard that may already be waiting.
CANARY_JOB = -1


def read_canary(storage: Storage, fingerprint: str) -> pl.DataFrame:
    """The stored canary rows of this run (`row_schema()`), or none."""
    try:
        data = storage.read_bytes(canary_key(fingerprint))
    except FileNotFoundError:
        return pl.DataFrame(schema=row_schema())
    return pl.read_parquet(io.BytesIO(data))


def run_canary(
    dispatcher: Dispatcher, storage: Storage, fingerprint: str, sample: pl.DataFrame
) -> pl.DataFrame:
    """Generate the sample's rows not yet stored, store them, return every sample row.

    The rows come back in sample order, each with the shard it belongs to; the caller audits
    them and either stops the run or lets its shards commit them.
    """
    return send_canary(dispatcher, storage, fingerprint, sample).collect()


@dataclass
class PendingCanary:
    """A canary on its way: its rows not yet stored are queued at the dispatcher, ahead of
    every shard; `collect` waits for them, stores them and returns every sample row."""

    storage: Storage
    fingerprint: str
    sample: pl.DataFrame
    stored: pl.DataFrame
    todo: pl.DataFrame
    sent: futures.Future[pl.DataFrame] | None

    def collect(self) -> pl.DataFrame:
        stored = self.stored
        if self.sent is not None:
            # The dispatcher stamps the job's number; each row belongs to its own shard.
            sent = self.sent.result().with_columns(self.todo.get_column("shard").alias("shard"))
            stored = pl.concat([stored, sent])
            buf = io.BytesIO()
            stored.write_parquet(buf, compression="zstd")
            self.storage.write_bytes(canary_key(self.fingerprint), buf.getvalue())
        return stored.join(self.sample.select("id"), on="id", how="semi").pipe(
            _in_order, self.sample
        )


def send_canary(
    dispatcher: Dispatcher, storage: Storage, fingerprint: str, sample: pl.DataFrame
) -> PendingCanary:
    """Queue the sample's rows not yet stored (a resumed canary sends none twice)."""
    stored = read_canary(storage, fingerprint)
    todo = sample.join(stored.select("id"), on="id", how="anti", maintain_order="left")
    sent = dispatcher.submit_shard(CANARY_JOB, todo) if todo.height else None
    return PendingCanary(storage, fingerprint, sample, stored, todo, sent)


def split_shard(prompts: pl.DataFrame, canary: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(prompt rows to send, rows the canary already generated) of one shard's prompt rows."""
    done = canary.join(prompts.select("id"), on="id", how="semi")
    todo = prompts.join(done.select("id"), on="id", how="anti", maintain_order="left")
    return todo, done


def merge_shard(prompts: pl.DataFrame, sent: pl.DataFrame, done: pl.DataFrame) -> pl.DataFrame:
    """The shard's rows to commit: the sent and the canary's, each id once, in plan order.

    Raises ValueError when the two do not make up the shard exactly: committing a shard
    that lacks an id, or holds one twice, would break the dataset's one promise.
    """
    merged = pl.concat([sent, done.select(sent.columns)])
    if merged.height != prompts.height or merged.get_column("id").is_duplicated().any():
        raise ValueError(
            f"{merged.height} generated rows (sent {sent.height}, canary {done.height}) "
            f"do not make up the shard's {prompts.height} prompts once each"
        )
    return _in_order(merged, prompts)


class CanaryFirst:
    """The run's row source once the canary has run: a shard's canary rows come from the
    store, only the rest is sent (to the dispatcher, the shard tasks' `RowSource`)."""

    def __init__(self, dispatcher: Dispatcher, canary: pl.DataFrame) -> None:
        self.dispatcher = dispatcher
        self.canary = canary

    def submit_shard(self, shard: int, prompts: pl.DataFrame) -> futures.Future[pl.DataFrame]:
        todo, done = split_shard(prompts, self.canary)
        if not done.height:
            return self.dispatcher.submit_shard(shard, prompts)
        merged: futures.Future[pl.DataFrame] = futures.Future()
        if not todo.height:
            merged.set_result(merge_shard(prompts, pl.DataFrame(schema=row_schema()), done))
            return merged

        def settle(sent: futures.Future[pl.DataFrame]) -> None:
            try:
                merged.set_result(merge_shard(prompts, sent.result(), done))
            except Exception as err:
                merged.set_exception(err)

        self.dispatcher.submit_shard(shard, todo).add_done_callback(settle)
        return merged


class CanaryStopped(Exception):
    """The canary failed the live gate: a shard held for its verdict is not committed."""


@dataclass(frozen=True)
class Verdict:
    """A passing canary: its rows to commit in their shards (those of servers it quarantined
    left out) and the servers quarantined, whose answers no shard may keep."""

    rows: pl.DataFrame
    quarantined: frozenset[str]


class HeldForCanary:
    """The run's row source while its canary runs, so the fleet never waits on it: up to
    `ahead` rows of the shards (none of the canary's) are sent at once, queued behind the
    canary's own, to fill the slots through its tail and its audit; the rest wait for the
    verdict, and a shard's rows are handed back (and so committed) only once it says go.

    On go, the shard's canary rows join it, its waiting rows are sent, and any row a
    quarantined server answered is sent again; on a stop, the shard gets `CanaryStopped` and
    commits nothing, and no more than `ahead` rows were spent on it. After the verdict, a
    shard is sent as `CanaryFirst` sends it.
    """

    def __init__(
        self,
        dispatcher: Dispatcher,
        sample: pl.DataFrame,
        verdict: futures.Future[Verdict],
        ahead: int,
    ) -> None:
        self.dispatcher = dispatcher
        self.sample = sample.select("id")
        self.verdict = verdict
        self._ahead = ahead
        self._lock = threading.Lock()

    def submit_shard(self, shard: int, prompts: pl.DataFrame) -> futures.Future[pl.DataFrame]:
        if self.verdict.done():
            stopped = self.verdict.exception()
            if stopped is None:
                return CanaryFirst(self.dispatcher, self.verdict.result().rows).submit_shard(
                    shard, prompts
                )
            failed: futures.Future[pl.DataFrame] = futures.Future()
            failed.set_exception(stopped)  # nothing more is sent for a stopped run
            return failed
        rest = prompts.join(self.sample, on="id", how="anti", maintain_order="left")
        with self._lock:
            now = min(rest.height, self._ahead)
            self._ahead -= now
        sent = self.dispatcher.submit_shard(shard, rest.head(now))
        out: futures.Future[pl.DataFrame] = futures.Future()

        def judged(_: object) -> None:
            try:
                verdict = self.verdict.result()
                rows = sent.result()
            except Exception as err:  # the verdict's stop, or the fleet's failure
                out.set_exception(self.verdict.exception() or err)
                return
            self._settle(shard, prompts, rows, verdict, out)

        # The rows held back are sent by `_settle` once both are in: they are not covered yet.
        sent.add_done_callback(lambda _: self.verdict.add_done_callback(judged))
        return out

    def _settle(
        self,
        shard: int,
        prompts: pl.DataFrame,
        sent: pl.DataFrame,
        verdict: Verdict,
        out: futures.Future[pl.DataFrame],
    ) -> None:
        kept = sent.filter(~pl.col("server").is_in(list(verdict.quarantined)))
        done = verdict.rows.join(prompts.select("id"), on="id", how="semi")
        covered = pl.concat([kept.select("id"), done.select("id")])
        again = prompts.join(covered, on="id", how="anti", maintain_order="left")
        if not again.height:
            out.set_result(merge_shard(prompts, kept, done))
            return

        def resent(more: futures.Future[pl.DataFrame]) -> None:
            try:
                out.set_result(merge_shard(prompts, pl.concat([kept, more.result()]), done))
            except Exception as err:
                out.set_exception(err)

        self.dispatcher.submit_shard(shard, again).add_done_callback(resent)


def _in_order(rows: pl.DataFrame, order: pl.DataFrame) -> pl.DataFrame:
    """`rows` in the order of `order`'s ids (rows lacking from `order` are an error upstream)."""
    position = order.select("id").with_row_index("_pos")
    return rows.join(position, on="id").sort("_pos").drop("_pos")
