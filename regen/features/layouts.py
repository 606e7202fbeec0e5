"""regen's feature shards in the layouts the trainers' own offline readers read.

- `specforge`: one `.ckpt` per sample (torch's format, regen.features.torch_zip), under
  `rows_<start>-<end>/data_<i>.ckpt` as SpecForge's scripts/prepare_hidden_states.py names
  them (a6b6b02, `_get_file_path`), with its keys (`OfflineManifestReader`'s
  `_OFFLINE_EAGLE3_KEYS`, specforge/runtime/data_plane/offline_reader.py:46):
  `input_ids` and `loss_mask` (int64 [tokens]), `hidden_state` ([1, tokens, hidden], the
  final normed state: its TargetHead applies lm_head alone, specforge/modeling/target/
  target_head.py:100) and `aux_hidden_state` ([1, tokens, layers x hidden]), bf16. SpecForge
  has no FP8 path: FP8 features are written dequantized to bf16.
- `speculators`: the directory `--data` names: an Arrow dataset of `input_ids`, `loss_mask`,
  `seq_len` (torch format) and `hidden_states/hs_<i>.safetensors`, sample i of the dataset
  (speculators/train/data.py `ArrowDataset`, hs_connectors/transfer.py `FileTransfer`):
  `token_ids` (int64) and `hidden_states` [tokens, layers + 1, hidden], the aux layers then
  the verifier's last state, bf16; FP8 as e4m3 with `hidden_states_scales` [tokens, 1, 1]
  (hs_connectors/fp8_utils.py, read by its `fp8` backend). speculators applies the verifier's
  final norm to that last state (speculators/models/eagle3/core.py:251-253) where SpecForge
  and SGLang store it normed; RMSNorm is blind to a token's scale, so the normed state divided
  by the norm's weight, which this writes, gives speculators exactly the normed state back
  (up to the norm's epsilon): `--model` names the directory the weight is read from.

Samples are numbered over the feature shards in shard order, each shard's in its own order.
"""

from __future__ import annotations

import importlib
import json
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from safetensors.numpy import save

from regen.errors import UsageError
from regen.features.encode import BF16, DTYPES, Sample, decode, quantize_fp8
from regen.features.manifest import FeatureRecord, read_manifests, read_record
from regen.features.torch_zip import dumps
from regen.storage import Storage

Layout = Literal["specforge", "speculators"]
LAYOUTS: tuple[Layout, ...] = ("specforge", "speculators")
GROUP = 2000  # SpecForge's default --file-group-size
_NORM_KEYS = ("model.norm.weight", "model.language_model.norm.weight", "norm.weight")


@dataclass(frozen=True)
class LayoutCounts:
    layout: Layout
    samples: int
    shards: int
    dest: str


def samples_of(storage: Storage) -> Iterator[Sample]:
    """Every committed sample of a features root, in shard order."""
    for manifest in read_manifests(storage).values():
        for entry in manifest.samples:
            yield decode(storage.read_bytes(entry.key))


def write_layout(
    storage: Storage, dest: Path, layout: Layout, model_dir: Path | None = None
) -> LayoutCounts:
    """Write the features of `storage` (a root with `features/`) into the local `dest`."""
    record = read_record(storage)
    if record is None:
        raise UsageError(f"{storage.uri}: no features/features.json: run regen features first")
    dest.mkdir(parents=True, exist_ok=True)
    shards = len(read_manifests(storage))
    if layout == "specforge":
        count = _specforge(storage, dest)
    else:
        if model_dir is None:
            raise UsageError("--layout speculators needs --model: the final norm's weight")
        count = _speculators(storage, dest, record, final_norm_weight(model_dir))
    return LayoutCounts(layout, count, shards, str(dest))


def _specforge(storage: Storage, dest: Path) -> int:
    count = 0
    for i, sample in enumerate(samples_of(storage)):
        group = i // GROUP * GROUP
        path = dest / f"rows_{group}-{group + GROUP}" / f"data_{i}.ckpt"
        path.parent.mkdir(parents=True, exist_ok=True)
        tensors = {
            "input_ids": sample.input_ids.astype(np.int64),
            "loss_mask": sample.loss_mask.astype(np.int64),
            "hidden_state": sample.dequantized("hidden_state").astype(BF16)[None],
            "aux_hidden_state": sample.dequantized("aux_hidden_state").astype(BF16)[None],
        }
        path.write_bytes(dumps(tensors, archive=f"data_{i}"))
        count += 1
    return count


def _speculators(storage: Storage, dest: Path, record: FeatureRecord, norm: np.ndarray) -> int:
    datasets = importlib.import_module("datasets")  # the [export] extra, as hf-dataset's

    hidden = record.hidden_size
    safe = np.where(norm == 0, 1.0, norm).astype(np.float32)
    (dest / "hidden_states").mkdir(parents=True, exist_ok=True)
    ids, masks = [], []
    for i, sample in enumerate(samples_of(storage)):
        tokens = len(sample.input_ids)
        aux = sample.dequantized("aux_hidden_state").reshape(tokens, -1, hidden)
        last = np.where(norm == 0, 0.0, sample.dequantized("hidden_state") / safe)
        states = np.concatenate([aux, last[:, None, :]], axis=1)
        tensors = {"token_ids": sample.input_ids.astype(np.int64)}
        if record.dtype == "fp8":
            flat, scale = quantize_fp8(states.reshape(tokens, -1))
            tensors["hidden_states"] = flat.reshape(states.shape)
            tensors["hidden_states_scales"] = scale.reshape(tokens, 1, 1)
        else:
            tensors["hidden_states"] = states.astype(BF16)
        (dest / "hidden_states" / f"hs_{i}.safetensors").write_bytes(save(tensors))
        ids.append(sample.input_ids.astype(np.int64))
        masks.append(sample.loss_mask.astype(np.int64))
    frame = datasets.Dataset.from_dict(
        {"input_ids": ids, "loss_mask": masks, "seq_len": [len(x) for x in ids]}
    )
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        frame.save_to_disk(tmp)
        # torch's format, as speculators' prepare_data saves it (its loader compares ids with
        # torch.equal), set in state.json: regen's venv has no torch (regen/export does same).
        state = Path(tmp) / "state.json"
        state.write_text(json.dumps({**json.loads(state.read_text()), "_format_type": "torch"}))
        for path in Path(tmp).iterdir():
            shutil.move(str(path), dest / path.name)
    return len(ids)


def final_norm_weight(model_dir: Path) -> np.ndarray:
    """The model's final RMSNorm weight, as float32, read from its safetensors files."""
    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    files = (
        {k: model_dir / v for k, v in json.loads(index.read_text())["weight_map"].items()}
        if index.is_file()
        else {}
    )
    candidates = [files[k] for k in _NORM_KEYS if k in files] or sorted(
        model_dir.glob("*.safetensors")
    )
    for path in candidates:
        found = _read_tensor(path, _NORM_KEYS)
        if found is not None:
            return found
    raise UsageError(f"{model_dir}: no final norm weight ({', '.join(_NORM_KEYS)})")


def _read_tensor(path: Path, names: tuple[str, ...]) -> np.ndarray | None:
    """One tensor of a safetensors file, read without loading the file."""
    with path.open("rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
        for name in names:
            if name in header:
                start, end = header[name]["data_offsets"]
                f.seek(8 + size + start)
                raw = f.read(end - start)
                dtype = DTYPES[header[name]["dtype"]]
                return np.frombuffer(raw, dtype=dtype).astype(np.float32)
    return None
