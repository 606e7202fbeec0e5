"""The shard plan: shard k holds valid rows [k*S, (k+1)*S) in input order, so the same
prompts and shard size always give the same shards, and a resumed run finds its own.

A prompt set that changes between runs on one root is planned incrementally (`revise_plan`):
every id keeps the shard it was planned in, new ids fill new shards after the existing ones,
and each id carries a hash of its content and the input revision that content came in, so a
shard committed before that revision knows which of its rows it owes (`owed`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import polars as pl

from regen.dataset.keys import PLAN_KEY
from regen.errors import UserError
from regen.storage import Storage

if TYPE_CHECKING:  # only read: regen.prompts may use this package's keys
    from regen.prompts import PromptSet

_RANGE = re.compile(r"^(\d*):(\d*)$")

PLAN_SCHEMA = pl.Schema(
    {
        "id": pl.String,
        "shard": pl.Int64,
        # A hash of the row's normalised messages: what a rerun compares to find edits.
        "content": pl.String,
        # The input revision this content came in; a shard committed before it owes the row.
        "revision": pl.Int64,
        # Gone from the input: its committed row stays, shown or not by `input.removed`.
        "removed": pl.Boolean,
    }
)


@dataclass(frozen=True)
class InputChanges:
    """How one input revision differs from what the dataset planned before it."""

    new: int = 0
    changed: int = 0
    removed: int = 0
    restored: int = 0
    """Ids removed by an earlier revision that came back with the same content."""

    def any(self) -> bool:
        return bool(self.new or self.changed or self.removed or self.restored)

    def line(self) -> str:
        return f"{self.new} new, {self.changed} changed, {self.removed} removed" + (
            f", {self.restored} restored" if self.restored else ""
        )


@dataclass(frozen=True)
class ShardPlan:
    """`assignments` (`PLAN_SCHEMA`) has one row per id ever planned on the root, removed ids
    flagged; `num_rows` counts the ids of the current input."""

    num_rows: int
    shard_size: int
    num_shards: int
    assignments: pl.DataFrame
    rows: pl.Series
    """Each assignment's row in the prompt set it was planned from (null for a removed id):
    the prompt cache gathers rows by it instead of joining a million ids. Never stored."""
    revision: int = 1
    changes: InputChanges = field(default_factory=InputChanges)

    @property
    def removed_ids(self) -> pl.Series:
        return self.assignments.filter("removed").get_column("id")

    def with_rows(self) -> pl.DataFrame:
        """`assignments` with each id's prompt-set row as `_row`."""
        return self.assignments.with_columns(self.rows.alias("_row"))


_HASH_ROWS = 65_536
"""Rows hashed at a time: their JSON text is a few MB, never a million prompts' worth."""


def content_hash(rows: pl.DataFrame, messages: str = "messages") -> pl.Series:
    """A stable digest of each row's messages (their JSON text), the same on every machine
    and polars version, unlike `Expr.hash` (so hashed in Python, `_HASH_ROWS` at a time)."""

    def digest(part: pl.DataFrame) -> list[str]:
        # A message's tool fields are left out where null (a quoted key cannot occur inside
        # encoded text, whose quotes are escaped), so a row without tools hashes as it did
        # before messages had them; a row's tools are part of its content.
        text = pl.struct(messages).struct.json_encode()
        for key in ("tool_calls", "tool_call_id"):
            text = text.str.replace_all(f',"{key}":null', "", literal=True)
        if "tools" in part.columns:
            text = text + pl.when(pl.col("tools").is_not_null()).then(
                "\ttools:" + pl.col("tools")
            ).otherwise(pl.lit(""))
        texts = part.select(text).to_series()
        return [hashlib.blake2b(t.encode(), digest_size=16).hexdigest() for t in texts]

    digests = [d for part in rows.iter_slices(_HASH_ROWS) for d in digest(part)]
    return pl.Series("content", digests, dtype=pl.String)


def plan_shards(prompt_set: PromptSet, shard_size: int) -> ShardPlan:
    """Deterministic: the valid rows in input order, cut every `shard_size` rows."""
    if shard_size <= 0:
        raise ValueError(f"shard_size must be positive, got {shard_size}")
    assignments = prompt_set.valid.select(
        "id",
        (pl.int_range(pl.len(), dtype=pl.Int64) // shard_size).alias("shard"),
        content_hash(prompt_set.valid),
        revision=pl.lit(1, pl.Int64),
        removed=pl.lit(False),
    )
    num_rows = assignments.height
    changes = InputChanges(new=num_rows)
    rows = pl.int_range(num_rows, dtype=pl.Int64, eager=True)
    return ShardPlan(
        num_rows, shard_size, -(-num_rows // shard_size), assignments, rows, 1, changes
    )


def revise_plan(
    old: pl.DataFrame,
    prompt_set: PromptSet,
    shard_size: int,
    revision: int,
    committed: Collection[int] = (),
) -> ShardPlan:
    """The plan of a root that already has one (`old`, `PLAN_SCHEMA`), for this input.

    An id keeps its shard; an id with other content takes `revision` (its shard regenerates
    it); a new id goes to the shards after the last planned one, `shard_size` a shard, in
    input order; an id missing from the input is flagged removed while its shard is in
    `committed` (its row is there to keep or drop), and leaves the plan otherwise (it was never
    generated). The revision number only advances when something changed (`revision` is the
    next one).
    """
    current = prompt_set.valid.select(
        "id", content_hash(prompt_set.valid), pl.int_range(pl.len(), dtype=pl.Int64).alias("_row")
    )
    both = old.join(current, on="id", how="full", coalesce=True, maintain_order="left_right")
    here = pl.col("content_right").is_not_null()
    edited = here & pl.col("content").is_not_null() & (pl.col("content") != pl.col("content_right"))
    is_new = pl.col("shard").is_null()
    first_new = _shards_spanned(old.get_column("shard"))
    marked = both.with_columns(
        _new=is_new,
        _changed=edited,
        _removed=~here & ~pl.col("removed"),
        _restored=(here & pl.col("removed") & ~edited).fill_null(False),
    )
    changes = InputChanges(
        new=int(marked.get_column("_new").sum()),
        changed=int(marked.get_column("_changed").sum()),
        removed=int(marked.get_column("_removed").sum()),
        restored=int(marked.get_column("_restored").sum()),
    )
    if not changes.any():
        revision -= 1
    new_shard = first_new + (pl.col("_new").cum_sum() - 1) // shard_size
    never_made = ~here & ~pl.col("shard").is_in(list(committed))
    planned = marked.filter(~never_made).select(
        "id",
        pl.when(pl.col("_new")).then(new_shard).otherwise(pl.col("shard")).alias("shard"),
        pl.coalesce("content_right", "content").alias("content"),
        pl.when(pl.col("_new") | pl.col("_changed"))
        .then(pl.lit(revision, pl.Int64))
        .otherwise(pl.col("revision"))
        .alias("revision"),
        (~here).alias("removed"),
        "_row",
    )
    assignments = planned.select(list(PLAN_SCHEMA)).cast(PLAN_SCHEMA)
    num_shards = _shards_spanned(assignments.get_column("shard"))
    return ShardPlan(
        current.height, shard_size, num_shards, assignments, planned.get_column("_row"),
        revision, changes,
    )  # fmt: skip


def _shards_spanned(shards: pl.Series) -> int:
    """Shards 0..max planned, so the next new one is this number; 0 for an empty plan.

    Compared with None, never `max() or -1`: shard 0 is falsy, and a one-shard dataset then
    planned its new ids into committed shard 0 and generated nothing."""
    top = shards.max()
    return 0 if top is None else int(top) + 1  # type: ignore[arg-type]


def owed(committed_revision: int) -> pl.Expr:
    """Rows a shard committed at `committed_revision` must generate again: their content
    came in a later revision."""
    return pl.col("revision") > committed_revision


def read_plan(storage: Storage, *, full: bool = False) -> pl.DataFrame | None:
    """plan.parquet's id and shard columns (`full`: every column of `PLAN_SCHEMA`), or None
    when the root has none."""
    if not storage.exists(PLAN_KEY):
        return None
    columns = list(PLAN_SCHEMA) if full else ["id", "shard"]
    try:
        plan = pl.read_parquet(
            storage.polars_path(PLAN_KEY),
            columns=columns,
            storage_options=storage.polars_options(),
        )
    except (pl.exceptions.PolarsError, OSError) as err:
        raise UserError(f"{storage.uri}/{PLAN_KEY}: unreadable: {err}") from None
    return plan.cast({name: PLAN_SCHEMA[name] for name in columns})


def parse_shard_range(spec: str | None, num_shards: int) -> range:
    """`100:200`, `100:` or `:200` (half-open, like Python); an end past the plan is clamped."""
    if spec is None or spec == "":
        return range(num_shards)
    match = _RANGE.match(spec.strip())
    if not match:
        raise UserError(f"generation.shards: {spec!r} is not START:END, e.g. 100:200")
    start = int(match.group(1) or 0)
    end = min(int(match.group(2)) if match.group(2) else num_shards, num_shards)
    if start >= num_shards:
        raise UserError(
            f"generation.shards: {spec!r} is past the plan's {num_shards} shards (0:{num_shards})"
        )
    if start >= end:
        raise UserError(f"generation.shards: {spec!r} selects no shard (start must be < end)")
    return range(start, end)
