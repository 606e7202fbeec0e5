"""How the dispatcher retries, gives up and reports; not fingerprinted."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
)

from regen.config.section import Section


class GenerationConfig(Section):
    """How the dispatcher retries, gives up and reports."""

    max_attempts: int = Field(
        default=4,
        ge=1,
        description="Tries per request on a 5xx, a timeout, a dead server or an answer the "
        "server cut short; then the row is stored as an error row.",
    )
    request_timeout_s: float | None = Field(
        default=None, gt=0, description="Default: derived from max_tokens and measured speed."
    )
    fleet_dead_s: float = Field(
        default=120.0,
        gt=0,
        description="An external fleet with no healthy server for this long is gone: the "
        "run stops. A launched fleet stops as soon as no server can come back.",
    )
    retry_errors: bool = Field(
        default=False,
        description="Regenerate the error rows of committed shards (single-node runs only).",
    )
    shards: str | None = Field(
        default=None,
        pattern=r"^\d*:\d*$",
        description="A range of shards to run, e.g. 100:200, to split a run by hand; default all.",
    )
    shard_retries: int = Field(
        default=2, ge=0, description="Retries of a shard's task after a failure."
    )
    progress_interval_s: float = Field(
        default=2.0, gt=0, description="Seconds between rewrites of progress.json."
    )
    live_interval_s: float = Field(
        default=30.0,
        gt=0,
        description="Seconds between the fleet's live figures (each server's /metrics): one "
        "`live:` log line and the fleet-live artifact.",
    )
    hedge: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="Once nothing is queued, copy a straggler on a slow server to a free "
        "slot of a faster one, under the row's seed; the first answer is kept. auto: where "
        "the copy is the same draw (emulators; SGLang with engine.deterministic); on: "
        "everywhere (servers that ignore the seed keep the first of two draws, the shorter "
        "more often); off: never.",
    )
    concurrency_interval_s: float = Field(
        default=10.0,
        gt=0,
        description="Seconds between two measurements of each server's best concurrency "
        "(without a fixed concurrency_per_server): a raise is judged one interval after the "
        "one it took to settle.",
    )
    new_output: bool = Field(
        default=False,
        description="Allow a changed fingerprint (the old shards are kept aside), or rerun a "
        "run the live gate stopped.",
    )
    # Not fingerprinted (no generation.* setting is): a canary only changes the order rows
    # are sent in, never what a row holds, so datasets made with and without one compare.
    canary_prompts: int = Field(
        default=256,
        ge=0,
        description="Prompts sampled over every pending shard, generated and audited before "
        "the rest is sent; 0 turns the canary off.",
    )
