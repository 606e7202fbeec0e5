"""What the features cost before they are paid for: bytes (tokens x layers x hidden x bytes a
value) and time at a prefill rate. One formula, for the plan's headline, `regen estimate`
and `regen check`'s storage row.

A token's file bytes: its `input_ids` (int32) and `loss_mask` (uint8), then aux + final
states: bf16 2 bytes a value; fp8 1 byte a value and a float32 scale per token and tensor.
The safetensors header (a few hundred bytes a sample) is left out: under 0.1 % of a sample.
"""

from __future__ import annotations

from dataclasses import dataclass

from regen.config import FeatureDtype
from regen.display.figures import sig
from regen.features.manifest import FeatureRecord

_IDS_AND_MASK = 4 + 1


def bytes_per_token(aux_layers: int, hidden: int, dtype: FeatureDtype) -> int:
    values = (aux_layers + 1) * hidden
    if dtype == "fp8":
        return values + 2 * 4 + _IDS_AND_MASK
    return 2 * values + _IDS_AND_MASK


@dataclass(frozen=True)
class FeatureSize:
    tokens: int
    aux_layers: int
    hidden: int
    dtype: FeatureDtype

    @classmethod
    def of(cls, record: FeatureRecord, tokens: int) -> FeatureSize:
        return cls(tokens, len(record.hidden_indices), record.hidden_size, record.dtype)

    @property
    def bytes(self) -> int:
        return self.tokens * bytes_per_token(self.aux_layers, self.hidden, self.dtype)

    @property
    def values(self) -> int:
        return self.tokens * (self.aux_layers + 1) * self.hidden

    def describe(self) -> str:
        per = bytes_per_token(self.aux_layers, self.hidden, self.dtype)
        return (
            f"{human_bytes(self.bytes)} ({self.tokens:,} tokens x {self.aux_layers + 1} layers "
            f"x {self.hidden} hidden x {'1 B + scales' if self.dtype == 'fp8' else '2 B'}, "
            f"{per:,} B a token)"
        )

    def seconds(self, prefill_tok_s_per_gpu: float, gpus: int) -> float:
        return self.tokens / (prefill_tok_s_per_gpu * gpus)


def human_bytes(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if size < 1000 or unit == "PB":
            return f"{sig(size)} {unit}"
        size /= 1000
    raise AssertionError("unreachable")
