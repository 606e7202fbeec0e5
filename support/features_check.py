"""Run in .venv-sglang (transformers, torch): regen's stored features against a transformers
forward of the same model, token by token, layer by layer.

    .venv-sglang/bin/python support/features_check.py MODEL_DIR FEATURES_ROOT

prints one JSON object: rows, samples, tokens, and per captured layer (transformers'
`output_hidden_states` index, and `final`) the largest absolute difference and the largest
magnitude of the reference, over every token of every sample (FP8 values dequantized with
their stored per-token scales). The reference runs in float32, the model's own dtype.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load
from transformers import AutoModelForCausalLM


def main(model_dir: str, root: str) -> None:
    features = Path(root) / "features"
    record = json.loads((features / "features.json").read_text())
    indices = record["hidden_indices"]
    hidden = record["hidden_size"]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    names = [str(i) for i in indices] + ["final"]
    diff = dict.fromkeys(names, 0.0)
    scale = dict.fromkeys(names, 0.0)
    rows, samples, tokens = set(), 0, 0
    for path in sorted((features / "shards").glob("shard-*.json")):
        for entry in json.loads(path.read_text())["samples"]:
            tensors = load((features.parent / entry["key"]).read_bytes())
            ids = tensors["input_ids"].long()
            with torch.no_grad():
                states = model(ids[None], output_hidden_states=True).hidden_states
            stored = {}
            for key in ("aux_hidden_state", "hidden_state"):
                values = tensors[key].float()
                if f"{key}_scale" in tensors:
                    values = values * tensors[f"{key}_scale"][:, None]
                stored[key] = values
            for j, index in enumerate(indices):
                got = stored["aux_hidden_state"][:, j * hidden : (j + 1) * hidden]
                _fold(diff, scale, str(index), got, states[index][0])
            _fold(diff, scale, "final", stored["hidden_state"], states[-1][0])
            rows.add(entry["id"])
            samples += 1
            tokens += len(ids)
    print(json.dumps({
        "dtype": record["dtype"], "rows": len(rows), "samples": samples, "tokens": tokens,
        "max_abs_diff": diff, "max_abs_reference": scale,
    }))  # fmt: skip


def _fold(diff: dict, scale: dict, name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    diff[name] = max(diff[name], float((got - want).abs().max()))
    scale[name] = max(scale[name], float(want.abs().max()))


if __name__ == "__main__":
    main(*sys.argv[1:3])
