"""`DispatchTuning`: the dispatcher's knobs that are not part of `RegenConfig`.

They have defaults that suit a GPU fleet; tests and benches shrink them instead of
patching module constants.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class DispatchTuning(BaseModel):
    """Retry, quarantine, probe and timeout policy of one `Dispatcher`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    quarantine_after: int = Field(
        default=3, ge=1, description="Consecutive transport failures that quarantine a server."
    )
    retry_backoff_s: float = Field(default=0.5, ge=0, description="First retry delay.")
    retry_backoff_max_s: float = Field(default=30.0, ge=0)
    probe_backoff_s: float = Field(default=1.0, gt=0, description="First re-probe delay.")
    probe_backoff_max_s: float = Field(default=30.0, gt=0)
    probe_timeout_s: float = Field(default=30.0, gt=0, description="Deadline of one re-probe.")
    min_request_timeout_s: float = Field(default=60.0, gt=0)
    timeout_speed_factor: float = Field(
        default=3.0, gt=0, description="Timeout = factor x max_tokens / measured tok/s."
    )
    initial_request_timeout_s: float = Field(
        default=1800.0, gt=0, description="Timeout before any completion has been measured."
    )
    speed_ewma_alpha: float = Field(default=0.05, gt=0, le=1)
    affinity: bool = Field(
        default=True,
        description="turns=all: a conversation's next turn goes to the server that answered "
        "the last one (its radix cache holds the history), within affinity_slack.",
    )
    affinity_slack: float = Field(
        default=0.25,
        ge=0,
        description="How much busier than the least loaded healthy server the home server may "
        "be, as a share of its slots, and still take the next turn (else the least loaded).",
    )
    hedge: bool = Field(
        # Off until a GPU fleet measures it: on the emulator it lifts a half-speed fleet's tail
        # from 0.894 to 0.924 of ideal (benches/affinity.py), and every copy is a request more.
        default=False,
        description="Once nothing is queued, copy a straggler on a slow server to a free slot "
        "of a faster one; the first answer is kept, the other aborted.",
    )
    hedge_slow_ratio: float = Field(
        default=0.8,
        gt=0,
        le=1,
        description="A server is slow for hedging when its measured per-request decode speed "
        "is at most this share of the free server's.",
    )
    hedge_after: float = Field(
        default=0.0,
        ge=0,
        description="How long a request on a slow server runs before it is copied to a faster "
        "server, as a multiple of that server's mean request time. 0, the default, copies it "
        "at once: whenever a faster server has a free slot and nothing is queued, so the copy "
        "costs only an idle slot.",
    )
    hedge_min_samples: int = Field(
        default=8, ge=1, description="Answers a server must have given before its speed is judged."
    )
