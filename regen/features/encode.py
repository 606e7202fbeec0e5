"""One sample's feature file: its tensors rounded to bf16 or fp8, written with safetensors.

A sample file holds `input_ids` (int32) and `loss_mask` (uint8) from the dataset's stored
ids (regen.lossmask), `aux_hidden_state` [tokens, layers x hidden] and `hidden_state`
[tokens, hidden] (the final, normed state), and in its metadata the sample's id and turn.
safetensors is what speculators' own files are (hs_connectors/transfer.py `load_file`), so
any reader with safetensors opens it, torch or numpy; numpy's bf16 and fp8 are ml_dtypes'.

FP8 is e4m3 with one float32 scale per token and tensor (`<name>_scale`), the scale the
token's largest magnitude over 448 (e4m3's largest finite), as speculators' FP8 files
(hs_connectors/fp8_utils.py `quantize_tensor_to_fp8`). Its error, documented and tested: e4m3
keeps 3 mantissa bits, so a value that lands in e4m3's normal range (at least 2**-6 times the
scale) comes back within 2**-4 of itself (round to nearest: half of 2**-3), and a smaller one
within half the subnormal step, 2**-10 times the scale; `FP8_RELATIVE` and `FP8_FLOOR`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np
from safetensors import deserialize
from safetensors.numpy import save

from regen.config import FeatureDtype

FORMAT = "regen-features/1"
BF16 = np.dtype(ml_dtypes.bfloat16)
FP8 = np.dtype(ml_dtypes.float8_e4m3fn)
FP8_MAX = float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max)  # 448
FP8_RELATIVE = 2.0**-4
FP8_FLOOR = 2.0**-10
"""|x - fp8(x)| <= max(FP8_RELATIVE * |x|, FP8_FLOOR * scale), scale = the token's amax / 448."""
DTYPES = {
    "BF16": BF16, "F8_E4M3": FP8, "F16": np.dtype(np.float16), "F32": np.dtype(np.float32),
    "I32": np.dtype(np.int32), "I64": np.dtype(np.int64), "U8": np.dtype(np.uint8),
}  # fmt: skip
FEATURES = ("aux_hidden_state", "hidden_state")


@dataclass(frozen=True)
class Sample:
    """One training sample's features, as a trainer reads them."""

    id: str
    turn: int
    input_ids: np.ndarray
    loss_mask: np.ndarray
    aux_hidden_state: np.ndarray
    hidden_state: np.ndarray
    scales: dict[str, np.ndarray] = field(default_factory=dict)
    """FP8 only: `aux_hidden_state` / `hidden_state` -> float32 [tokens] scales."""

    def dequantized(self, name: str) -> np.ndarray:
        """A feature as float32, its scale applied when it is FP8."""
        values = getattr(self, name).astype(np.float32)
        scale = self.scales.get(name)
        return values if scale is None else values * scale[:, None]


def quantize_fp8(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """e4m3 values and float32 per-token scales of a [tokens, width] array."""
    wide = values.astype(np.float32)
    amax = np.abs(wide).max(axis=1) if wide.shape[1] else np.zeros(len(wide), np.float32)
    scale = np.maximum(amax / FP8_MAX, 1e-12).astype(np.float32)
    return (wide / scale[:, None]).astype(FP8), scale


def encode(
    sample_id: str,
    turn: int,
    input_ids: np.ndarray,
    loss_mask: np.ndarray,
    aux: np.ndarray,
    last: np.ndarray,
    dtype: FeatureDtype,
    metadata: dict[str, str] | None = None,
) -> bytes:
    """The sample file's bytes."""
    tensors: dict[str, np.ndarray] = {
        "input_ids": np.ascontiguousarray(input_ids, dtype=np.int32),
        "loss_mask": np.ascontiguousarray(loss_mask, dtype=np.uint8),
    }
    for name, values in zip(FEATURES, (aux, last), strict=True):
        if dtype == "fp8":
            tensors[name], tensors[f"{name}_scale"] = quantize_fp8(values)
        else:
            tensors[name] = np.ascontiguousarray(values.astype(BF16))
    meta = {"format": FORMAT, "id": sample_id, "turn": str(turn), "dtype": dtype}
    return save(tensors, metadata={**meta, **(metadata or {})})


def decode(data: bytes) -> Sample:
    """A sample file back (ValueError on anything else)."""
    tensors, meta = read_tensors(data)
    if meta.get("format") != FORMAT:
        raise ValueError(f"not a regen features file (format {meta.get('format')!r})")
    scales = {n: tensors[f"{n}_scale"] for n in FEATURES if f"{n}_scale" in tensors}
    return Sample(
        meta["id"], int(meta["turn"]), tensors["input_ids"], tensors["loss_mask"],
        tensors["aux_hidden_state"], tensors["hidden_state"], scales,
    )  # fmt: skip


def read_tensors(data: bytes) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Every tensor of a safetensors file's bytes as numpy (bf16 and fp8 through ml_dtypes,
    which safetensors' own numpy loader lacks) and its metadata."""
    tensors = {
        name: np.frombuffer(view["data"], dtype=DTYPES[view["dtype"]]).reshape(view["shape"])
        for name, view in deserialize(data)
    }
    return tensors, metadata_of(data)


def metadata_of(data: bytes) -> dict[str, str]:
    """The `__metadata__` of a safetensors file's header."""
    size = int.from_bytes(data[:8], "little")
    header: dict[str, Any] = json.loads(data[8 : 8 + size])
    return dict(header.get("__metadata__") or {})
