"""One capture request: a prefill over known token ids, and its answer read back.

The request is SGLang's native `/generate` with `input_ids`, `return_hidden_states: true` and
`max_new_tokens: 1`: 0 would be a prefill-only request, whose hidden states 0.5.23 cuts to
`hidden_states[:finished_len]`, none (scheduler_components/output_streamer.py:668-672); one
token costs one sampling step and no decode. Its `meta_info.hidden_states` is either

- `["regen:<key>"]` from a server running regen's capture module (regen.features.site): the
  tensors are in `<capture dir>/<key>.safetensors`, read here, checked and deleted; or
- stock 0.5.23's `[[row, ...]]`, one list of floats per token (the aux states only), which
  only the bench reads (`parse_json`): a Python float per value is the cost it measures.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

KEY_PREFIX = "regen:"
CAPTURE_ENV = "REGEN_CAPTURE_DIR"
"""The capture module's directory, in a server's environment (regen.features.site)."""
_KEY = re.compile(r"^[0-9a-f]{32}$")
GENERATE_PATH = "/generate"


class CaptureError(Exception):
    """A capture answer that cannot be used: retried elsewhere, then the sample fails."""


@dataclass(frozen=True)
class Captured:
    """A sample's states as the server computed them (its dtype, e.g. bf16)."""

    aux: np.ndarray
    """[tokens, aux layers x hidden]: the layers in capture order, concatenated."""
    last: np.ndarray | None
    """[tokens, hidden]: the final, normed state; None from stock SGLang's JSON."""

    @property
    def values(self) -> int:
        return int(self.aux.size + (0 if self.last is None else self.last.size))


def request_body(input_ids: list[int], rid: str) -> dict[str, Any]:
    return {
        "input_ids": input_ids,
        "rid": rid,
        "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
        "return_hidden_states": True,
    }


def states_of(answer: dict[str, Any]) -> list[Any]:
    states = (answer.get("meta_info") or {}).get("hidden_states")
    if not isinstance(states, list) or len(states) != 1:
        raise CaptureError(f"the answer carries no hidden states (got {type(states).__name__})")
    return states


def read_keyed(answer: dict[str, Any], input_ids: list[int], capture_dir: Path) -> Captured:
    """The states a capture-module server wrote for this answer; its file is deleted once
    read, whether or not it checks out (a bad file is retried, never read twice)."""
    key = states_of(answer)[0]
    if not isinstance(key, str) or not key.startswith(KEY_PREFIX):
        raise CaptureError(
            "the server answered with JSON hidden states, not a capture key: it runs without "
            "regen's capture module (regen.features.site)"
        )
    name = key[len(KEY_PREFIX) :]
    if not _KEY.match(name):
        raise CaptureError(f"malformed capture key {key!r}")
    path = capture_dir / f"{name}.safetensors"
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CaptureError(f"capture file {path} is missing") from None
    finally:
        path.unlink(missing_ok=True)
    # Here, not at import: ml_dtypes costs every emulator process ~0.3 CPU s at its start.
    from regen.features.encode import read_tensors

    tensors, _ = read_tensors(data)
    ids = tensors.get("input_ids")
    if ids is None or ids.shape != (len(input_ids),) or not np.array_equal(ids, input_ids):
        raise CaptureError(f"capture file {path.name} holds other token ids than were sent")
    return _checked(tensors["aux_hidden_state"], tensors.get("hidden_state"), len(input_ids))


def parse_json(answer: dict[str, Any], tokens: int) -> Captured:
    """Stock SGLang's answer: a list of floats per token, made an array."""
    rows = states_of(answer)[0]
    if not isinstance(rows, list):
        raise CaptureError("stock hidden states are not a list of rows")
    return _checked(np.asarray(rows, dtype=np.float32), None, tokens)


def _checked(aux: np.ndarray, last: np.ndarray | None, tokens: int) -> Captured:
    if aux.ndim != 2 or aux.shape[0] != tokens:
        raise CaptureError(f"aux hidden states of shape {aux.shape} for {tokens} tokens")
    if last is not None and (last.ndim != 2 or last.shape[0] != tokens):
        raise CaptureError(f"final hidden states of shape {last.shape} for {tokens} tokens")
    return Captured(aux, last)
