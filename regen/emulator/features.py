"""The emulator's answer to a capture request: deterministic pseudo-features, so a rehearsal
and the fast tests run the features stage without SGLang.

A server launched with `--enable-return-aux-hidden-states` answers `/generate` with
`input_ids` and `return_hidden_states: true` as 0.5.23 does, with one difference of regen's
making: under regen's capture module (REGEN_CAPTURE_DIR in its environment) the states go to
a file and the answer carries its key, as regen.features.site's module does in SGLang;
without it they come back as JSON rows, as stock SGLang sends them (the aux states only).
The values are a smooth function of the token, its position and the layer (float16, as a
CPU server computes), so a test can recompute them (`pseudo_states`) and see a token moved.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save

from regen.config import FeaturesConfig
from regen.errors import ConfigError
from regen.features.capture import CAPTURE_ENV, KEY_PREFIX
from regen.features.layers import resolve

# The model's shape when its config.json does not say (the bundled emulator model's).
DEFAULT_LAYERS, DEFAULT_HIDDEN = 8, 64


def capture_indices(server_args: dict[str, Any], model_config: dict[str, Any]) -> tuple[int, ...]:
    """The hidden-state indices the server's flags capture, as SGLang resolves them."""
    algorithm = str(server_args.get("speculative_algorithm") or "").lower()
    ids = server_args.get("return_aux_hidden_state_layer_ids")
    layers = int(model_config.get("num_hidden_layers") or DEFAULT_LAYERS)
    try:
        features = FeaturesConfig(convention=algorithm, layer_ids=ids)
        return resolve(features, layers).hidden_indices
    except (ValueError, ConfigError) as err:
        raise SystemExit(f"--enable-return-aux-hidden-states: {err}") from None


def pseudo_states(
    input_ids: list[int], indices: tuple[int, ...], hidden: int
) -> tuple[np.ndarray, np.ndarray]:
    """(aux [tokens, len(indices) x hidden], last [tokens, hidden]) in float16."""
    ids = np.asarray(input_ids, dtype=np.float64)[:, None]
    pos = np.arange(len(input_ids), dtype=np.float64)[:, None]
    dim = np.arange(hidden, dtype=np.float64)[None, :]

    def layer(i: int) -> np.ndarray:
        return (1 + i / 4) * np.sin(0.7 * ids + 0.013 * (i + 1) * pos + 0.37 * dim + 1.1 * i)

    aux = np.concatenate([layer(i) for i in indices], axis=1).astype(np.float16)
    return aux, np.tanh(layer(99)).astype(np.float16)


def hidden_states_answer(
    input_ids: list[int], indices: tuple[int, ...], hidden: int, rid: str
) -> list[Any]:
    """`meta_info.hidden_states` for a capture request: a key, or stock JSON rows."""
    aux, last = pseudo_states(input_ids, indices, hidden)
    directory = os.environ.get(CAPTURE_ENV)
    if not directory:
        return [aux.astype(np.float32).tolist()]
    key = uuid.uuid4().hex
    final = Path(directory) / f"{key}.safetensors"
    final.parent.mkdir(parents=True, exist_ok=True)
    tensors = {
        "input_ids": np.asarray(input_ids, dtype=np.int32),
        "aux_hidden_state": aux,
        "hidden_state": last,
    }
    temp = final.with_suffix(".tmp")
    temp.write_bytes(save(tensors, metadata={"rid": rid}))
    temp.replace(final)
    return [KEY_PREFIX + key]
