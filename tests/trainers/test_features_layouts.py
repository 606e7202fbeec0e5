"""regen's feature shards, written in each trainer's offline layout, read by the trainer's own
reader: SpecForge's OfflineManifestReader, LocalFeatureStore and EAGLE-3 normalizer, and
speculators' ArrowDataset over its FileTransfer, yield regen's ids, masks and tensors for every
sample (bf16 and FP8 shards; two-turn rows)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from pydantic import SecretStr
from safetensors.numpy import save_file

from regen.dataset.reader import read_committed
from regen.features.capture import CAPTURE_ENV
from regen.features.layouts import write_layout
from regen.features.manifest import FeatureRecord, claim_record
from regen.features.pool import CapturePool, CaptureServer
from regen.features.shard import capture_shard, shard_samples
from regen.sglang_api.endpoint import Endpoint
from regen.storage import LocalStorage
from support.emulator import in_process
from support.trainers import TRAINERS_PYTHON
from tests.support.export import make_export_dataset

REPO = Path(__file__).resolve().parents[2]
CAPTURE_FLAGS = ["--enable-return-aux-hidden-states", "--speculative-algorithm", "EAGLE3"]


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_the_trainers_readers_yield_regens_features(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dtype: str
) -> None:
    monkeypatch.setenv(CAPTURE_ENV, str(tmp_path / "capture"))
    dataset = make_export_dataset(tmp_path / "ds", rows=6, shard_size=3, turns=2)
    committed = read_committed(dataset)
    record = FeatureRecord(
        convention="eagle3", layer_ids=None, hidden_indices=[2, 4, 5], num_layers=8,
        hidden_size=64, dtype=dtype, turns="each", model="emu-model", dataset=dataset.uri,
    )  # fmt: skip
    storage = LocalStorage(tmp_path / "ds")
    claim_record(storage, record)
    with in_process([CAPTURE_FLAGS]) as (emu,):
        servers = [CaptureServer(Endpoint(0, emu.url), tmp_path / "capture")]
        with CapturePool(servers, SecretStr("k"), concurrency=4).running() as pool:
            for shard in committed.shards:
                todo = shard_samples(committed, shard, record)
                capture_shard(todo, pool, storage, record, committed.identity(shard))
    model = tmp_path / "model"
    model.mkdir()
    norm = np.random.default_rng(3).uniform(0.5, 2.0, 64).astype(np.float32)
    save_file({"model.norm.weight": norm}, str(model / "model.safetensors"))
    sf = write_layout(storage, tmp_path / "specforge", "specforge")
    spec = write_layout(storage, tmp_path / "speculators", "speculators", model)
    assert sf.samples == spec.samples == 12  # 6 rows x 2 turns
    done = subprocess.run(
        [
            str(TRAINERS_PYTHON), str(REPO / "support" / "features_trainers_check.py"),
            str(tmp_path / "ds"), sf.dest, spec.dest, str(model / "model.safetensors"),
        ],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"\n{dtype}: {got}")
    assert got == {
        "regen": 12,
        "specforge": {"samples": 12, "equal": 12},
        "speculators": {"samples": 12, "equal": 12, "fp8": dtype == "fp8"},
    }
