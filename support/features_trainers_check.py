"""Run in .venv-trainers (SpecForge 0.2.0, speculators 0.9.0, torch): regen's feature shards
read by each trainer's own offline reader, against the shards themselves.

    .venv-trainers/bin/python support/features_trainers_check.py ROOT SPECFORGE SPECULATORS NORM

ROOT holds regen's `features/`; the two directories are `regen features-export`'s layouts;
NORM is the safetensors file of the final norm's weight the speculators layout was written
with. Prints one JSON object: per trainer, the samples its reader yields and how many of them
equal regen's (ids, loss mask, every tensor value; speculators' last state through its own
final norm against the stored normed state).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from hs_connectors.transfer import FP8Transfer
from safetensors.torch import load, load_file
from specforge.algorithms.eagle3.data import normalize_offline_sample
from specforge.runtime.data_plane.feature_store import LocalFeatureStore
from specforge.runtime.data_plane.offline_reader import OfflineManifestReader
from speculators.train.data import ArrowDataset


def regen_samples(root: Path) -> list[dict[str, torch.Tensor]]:
    features = root / "features"
    out = []
    for path in sorted((features / "shards").glob("shard-*.json")):
        for entry in json.loads(path.read_text())["samples"]:
            t = load((root / entry["key"]).read_bytes())
            for key in ("aux_hidden_state", "hidden_state"):
                if f"{key}_scale" in t:
                    t[key] = (t[key].float() * t[f"{key}_scale"][:, None]).to(torch.bfloat16)
            out.append(t)
    return out


def specforge(expected: list[dict[str, torch.Tensor]], directory: str) -> dict[str, int]:
    refs = OfflineManifestReader(directory, validate_files=True).read()
    store = LocalFeatureStore()
    # The reader lists files sorted by path; regen's names order them by sample index.
    by_index = sorted(
        refs, key=lambda r: int(r.feature_store_uri.rsplit("data_", 1)[1].split(".")[0])
    )
    equal = 0
    for ref, want in zip(by_index, expected, strict=True):
        raw, _ = store.get(ref)
        sample = normalize_offline_sample(raw, max_len=1 << 20)
        ok = torch.equal(raw["input_ids"], want["input_ids"].long())
        ok &= torch.equal(raw["loss_mask"], want["loss_mask"].long())
        ok &= torch.equal(sample["hidden_state"][0], want["aux_hidden_state"])
        ok &= torch.equal(sample["target"][0], want["hidden_state"])
        equal += bool(ok)
    return {"samples": len(refs), "equal": equal}


def speculators(
    expected: list[dict[str, torch.Tensor]], directory: str, norm: torch.Tensor
) -> dict[str, int]:
    # FP8 files are read by speculators' own fp8 backend, which dequantizes them.
    fp8 = "hidden_states_scales" in load_file(
        Path(directory) / "hidden_states" / "hs_0.safetensors"
    )
    transfer = FP8Transfer(Path(directory) / "hidden_states") if fp8 else None
    data = ArrowDataset(max_len=1 << 20, datapath=directory, transfer=transfer, on_missing="raise")
    equal = 0
    for i, want in enumerate(expected):
        item = data[i]
        ok = torch.equal(item["input_ids"], want["input_ids"].long())
        ok &= torch.equal(item["loss_mask"], want["loss_mask"].long())
        aux = item["hidden_states"].float()
        # FP8 requantized over every layer of a token: within its relative 2**-4 of the largest.
        tol = 2**-4 if fp8 else 2**-7
        scale = want["aux_hidden_state"].float().abs().amax(-1, keepdim=True)
        ok &= bool(((aux - want["aux_hidden_state"].float()).abs() <= tol * scale + 1e-6).all())
        # The verifier's last state is regen's normed state over the norm's weight, so that
        # speculators' verifier_norm gives the normed state back (regen.features.layouts).
        last = item["verifier_last_hidden_states"].float()
        want = want["hidden_state"].float()
        bound = (2**-4 if fp8 else 2**-6) * want.abs().amax(-1, keepdim=True) + 2**-8
        ok &= bool(((last * norm - want).abs() <= bound).all())
        equal += bool(ok)
    return {"samples": len(data), "equal": equal, "fp8": fp8}


def main(root: str, specforge_dir: str, speculators_dir: str, norm_file: str) -> None:
    expected = regen_samples(Path(root))
    norm = load_file(norm_file)["model.norm.weight"].float()
    print(json.dumps({
        "regen": len(expected),
        "specforge": specforge(expected, specforge_dir),
        "speculators": speculators(expected, speculators_dir, norm),
    }))  # fmt: skip


if __name__ == "__main__":
    main(*sys.argv[1:5])
