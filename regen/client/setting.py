"""Which sampling setting and thinking mode a row is generated with, from the configured mixes.

Like `reasoning_effort` (regen.client.effort), a hash of the row id, not a random draw: a
retry, a resumed run or another node sends a row with the same setting, so the mix in the
dataset is the mix asked for. The draw is per row, not per turn: every turn of a conversation
is sampled alike. The setting is recorded on the row (`sampling`, regen.schema), where the
audit groups its figures by it and the loss mask renders a row's prompt with its own thinking.
"""

from __future__ import annotations

from regen.client.effort import pick_share
from regen.config import RegenerationConfig, SamplingConfig
from regen.sglang_api.request import RowSetting


class SettingDraw:
    """The setting of each row id, for one run's sampling and regeneration config."""

    __slots__ = ("_sampling", "_settings", "_thinking")

    def __init__(self, sampling: SamplingConfig, regeneration: RegenerationConfig) -> None:
        base = {
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,
            "min_p": sampling.min_p,
        }
        # Each entry's unset keys are the section's.
        self._settings = [
            ({**base, **s.model_dump(exclude={"share"}, exclude_none=True)}, s.share)
            for s in sampling.mix
        ] or [(base, 1.0)]
        self._sampling = {i: share for i, (_, share) in enumerate(self._settings)}
        self._thinking = (
            dict(regeneration.thinking_mix)
            if regeneration.thinking_mix
            else {regeneration.enable_thinking: 1.0}
        )

    def __call__(self, sample_id: str) -> RowSetting:
        index = pick_share(self._sampling, f"{sample_id}\x00sampling") or 0
        thinking = pick_share(self._thinking, f"{sample_id}\x00thinking")
        values = self._settings[index][0]
        return RowSetting(
            temperature=float(values["temperature"]),
            top_p=float(values["top_p"]),
            top_k=int(values["top_k"]),
            min_p=float(values["min_p"]),
            enable_thinking=bool(thinking),
        )
