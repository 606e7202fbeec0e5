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
