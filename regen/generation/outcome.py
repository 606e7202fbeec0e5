"""What generation did: one outcome per shard task, one summary per run (or node)."""

from __future__ import annotations

import time

from pydantic import BaseModel

from regen.errors import UserError


class ShardOutcome(BaseModel):
    """`committed` is False when the lease was lost (another node generates the shard) or
    the canary stopped the run while the shard waited for its verdict."""

    shard: int
    rows: int
    ok: int
    failed: int
    completion_tokens: int
    seconds: float
    committed: bool = True
    reason: str = ""
    """Why the shard was not committed here (`not committed: ...`); empty once committed."""

    @classmethod
    def lost(cls, shard: int, seconds: float, reason: str = "not committed") -> ShardOutcome:
        return cls(
            shard=shard,
            rows=0,
            ok=0,
            failed=0,
            completion_tokens=0,
            seconds=seconds,
            committed=False,
            reason=reason,
        )


class GenerationSummary(BaseModel):
    shards_generated: int
    rows: int
    ok: int
    failed: int
    completion_tokens: int
    seconds: float
    tokens_per_s: float
    stopped: str | None = None
    """How the live gate stopped the run (`StopRecord.gate_line`; `report/stopped.json` has
    the rest), if it did."""

    @classmethod
    def empty(cls) -> GenerationSummary:
        """A resumed run with every shard committed generated nothing."""
        return cls(
            shards_generated=0,
            rows=0,
            ok=0,
            failed=0,
            completion_tokens=0,
            seconds=0.0,
            tokens_per_s=0.0,
        )


def summarize(
    outcomes: list[ShardOutcome], failures: list[str], start: float, stopped: str | None = None
) -> GenerationSummary:
    """The run's figures since `start` (a `time.monotonic()`); raise if any shard failed for
    good, after the others committed, so a rerun resumes only the failed ones."""
    if failures:
        raise UserError(f"{len(failures)} shard(s) failed: " + "; ".join(failures[:5]))
    seconds = time.monotonic() - start
    tokens = sum(o.completion_tokens for o in outcomes)
    return GenerationSummary(
        shards_generated=len(outcomes),
        rows=sum(o.rows for o in outcomes),
        ok=sum(o.ok for o in outcomes),
        failed=sum(o.failed for o in outcomes),
        completion_tokens=tokens,
        seconds=seconds,
        tokens_per_s=tokens / seconds if seconds else 0.0,
        stopped=stopped,
    )
