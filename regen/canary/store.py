"""The canary's rows: sent once, kept under `canary/`, committed later in their own shards.

Nothing is sent twice: a canary row already stored is never sent again, neither by a
resumed canary nor by its shard, whose commit takes it from the store instead. Nothing is
committed twice: the store lives outside `shards/`, which every reader goes through manifests
to read, so a canary row counts once, when its shard commits. When a run stops at the canary
its rows stay in the store, beside the stop record, for a person to read.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import polars as pl

from regen.dataset.keys import canary_key
from regen.schema import row_schema
from regen.storage import Storage

if TYPE_CHECKING:  # `regen status` reads a stop record through this package: no dispatcher
    from regen.client import Dispatcher

# The number the canary is submitted under: below every shard, so the dispatcher's queue
# (ordered by shard number) sends it before any shard that may already be waiting.
CANARY_JOB = -1

CANARY_PARTS = 8
"""The canary is queued in this many parts (of 16 rows at least), each judged as it comes
back: once its last row is in, the verdict waits on the audit of the last part, not of the
whole sample."""
_PART_ROWS = 16


def read_canary(storage: Storage, fingerprint: str) -> pl.DataFrame:
    """The stored canary rows of this run (`row_schema()`), or none."""
    try:
        data = storage.read_bytes(canary_key(fingerprint))
    except FileNotFoundError:
        return pl.DataFrame(schema=row_schema())
    return pl.read_parquet(io.BytesIO(data))


@dataclass
class PendingCanary:
    """A canary on its way: its rows not yet stored are queued at the dispatcher in parts,
    ahead of every shard; `arrived` gives each part as it comes back, `collect` waits for them
    all, stores them and returns every sample row."""

    storage: Storage
    fingerprint: str
    sample: pl.DataFrame
    stored: pl.DataFrame
    """The canary rows an earlier, cut-short run stored (some may be of shards committed
    since, which this sample no longer holds)."""
    parts: list[tuple[pl.DataFrame, futures.Future[pl.DataFrame]]]
    """The rows not stored yet, in parts queued in sample order, each with its future."""
    _rows: dict[int, pl.DataFrame] = field(default_factory=dict, init=False, repr=False)

    @property
    def sent(self) -> int:
        """Rows this canary sends (the sample less what was stored)."""
        return sum(todo.height for todo, _ in self.parts)

    def arrived(self) -> Iterator[tuple[int, pl.DataFrame]]:
        """(part number, rows) as the parts come back, so each can be judged while the others
        run: part 0 holds the sample's stored rows, parts 1.. the sent ones; the parts back
        together come as one, under the first's number (a judge that fell behind catches up
        in one audit, not one per part). Raises what failed a part (a dead fleet)."""
        reused = self.stored.join(self.sample.select("id"), on="id", how="semi")
        if reused.height:
            yield 0, reused
        waiting = {future: k for k, (_, future) in enumerate(self.parts, start=1)}
        while waiting:
            done, _ = futures.wait(waiting, return_when=futures.FIRST_COMPLETED)
            back = sorted(waiting.pop(future) for future in done)
            yield back[0], pl.concat([self._part(k) for k in back])

    def collect(self) -> pl.DataFrame:
        """`store`, then `rows`."""
        self.store()
        return self.rows()

    def rows(self) -> pl.DataFrame:
        """Every sample row, in sample order, each with its shard (waits for every part)."""
        return (
            self._all()
            .join(self.sample.select("id"), on="id", how="semi")
            .pipe(_in_order, self.sample)
        )

    def store(self) -> None:
        """Store the rows sent beside those stored before (waits for every part), so a
        resumed run sends none of them again."""
        if not self.parts:
            return
        buf = io.BytesIO()
        self._all().write_parquet(buf, compression="zstd")
        self.storage.write_bytes(canary_key(self.fingerprint), buf.getvalue())

    def _all(self) -> pl.DataFrame:
        sent = [self._part(k) for k in range(1, len(self.parts) + 1)]
        return pl.concat([self.stored, *sent]) if sent else self.stored

    def _part(self, k: int) -> pl.DataFrame:
        if k not in self._rows:
            todo, future = self.parts[k - 1]
            # The dispatcher stamps the job's number; each row belongs to its own shard.
            rows = future.result().with_columns(todo.get_column("shard").alias("shard"))
            self._rows[k] = rows
        return self._rows[k]


def send_canary(
    dispatcher: Dispatcher,
    storage: Storage,
    fingerprint: str,
    sample: pl.DataFrame,
    parts: int = CANARY_PARTS,
) -> PendingCanary:
    """Queue the sample's rows not yet stored (a resumed canary sends none twice), in up to
    `parts` parts of consecutive rows, one after the other ahead of every shard."""
    stored = read_canary(storage, fingerprint)
    todo = sample.join(stored.select("id"), on="id", how="anti", maintain_order="left")
    count = max(1, min(parts, todo.height // _PART_ROWS))
    size = -(-todo.height // count)
    queued = [todo.slice(at, size) for at in range(0, todo.height, size)] if todo.height else []
    sent = [(part, dispatcher.submit_shard(CANARY_JOB, part)) for part in queued]
    return PendingCanary(storage, fingerprint, sample, stored, sent)


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
    """The run's row source while its canary runs, so the fleet never waits on it: the
    shards' rows (none of the canary's) are queued behind the canary's own at once, and take
    every slot it frees through its tail and its audit; a shard's rows are handed back (and
    so committed) only once the verdict says go.

    Nothing bounds them but the shards in flight (`regen.generation.loop.shards_in_flight`):
    a slot the canary frees stays busy until the verdict. What a stop throws away is what the
    fleet generated until the verdict, GPU time it would otherwise have idled (the verdict
    waits on the canary's rows, which go first, not on these); rows still queued are never
    sent. Capped at two waves of the fleet's slots, as they were, the slots idled behind the
    gate from the cap to the verdict (the canary's longest answer and its audit): several
    per cent of a clean run's generation on 4 x 16 slots.

    On go, any row a quarantined server answered is sent again and the shard's canary rows
    join it; on a stop, the shard gets `CanaryStopped` and commits nothing. After the
    verdict, a shard is sent as `CanaryFirst` sends it.
    """

    def __init__(
        self,
        dispatcher: Dispatcher,
        sample: pl.DataFrame,
        verdict: futures.Future[Verdict],
    ) -> None:
        self.dispatcher = dispatcher
        self.sample = sample.select("id")
        self.verdict = verdict

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
        sent = self.dispatcher.submit_shard(shard, rest)
        out: futures.Future[pl.DataFrame] = futures.Future()

        def judged(_: object) -> None:
            stopped = self.verdict.exception()
            if stopped is not None:  # the stop (what was sent is cancelled), or its failure
                out.set_exception(stopped)
                return
            verdict = self.verdict.result()
            sent.add_done_callback(lambda _: self._settle(shard, prompts, sent, verdict, out))

        self.verdict.add_done_callback(judged)
        return out

    def _settle(
        self,
        shard: int,
        prompts: pl.DataFrame,
        answered: futures.Future[pl.DataFrame],
        verdict: Verdict,
        out: futures.Future[pl.DataFrame],
    ) -> None:
        """The shard's rows are in: any row a quarantined server answered is sent again, then
        the shard's rows (sent and the canary's) are handed back, each id once."""
        try:
            sent = answered.result()
        except Exception as err:  # the fleet's failure
            out.set_exception(err)
            return
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
