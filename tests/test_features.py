"""The features stage's library on in-process emulators: the layers a convention takes, bf16
and FP8 within their documented error, the capture protocol (a file and a key, or stock JSON
rows), one shard captured and committed manifest last, what a rerun captures again, and a
root that holds another feature set refused."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import polars as pl
import pytest
from pydantic import SecretStr

from regen.config import FeaturesConfig
from regen.dataset.keys import FEATURES_PREFIX, feature_manifest_key
from regen.dataset.reader import read_committed
from regen.emulator.features import pseudo_states
from regen.errors import ConfigError, UsageError
from regen.features.capture import CAPTURE_ENV, CaptureError, parse_json, read_keyed
from regen.features.encode import BF16, FP8_FLOOR, FP8_RELATIVE, decode, encode
from regen.features.layers import resolve
from regen.features.manifest import FeatureRecord, claim_record, read_manifests
from regen.features.pool import CapturePool, CaptureServer
from regen.features.shard import capture_shard, shard_samples
from regen.features.stage import plan_features
from regen.lossmask import samples
from regen.sglang_api.endpoint import Endpoint
from regen.storage import LocalStorage, Storage
from support.emulator import in_process
from tests.support.export import make_export_dataset

CAPTURE_FLAGS = ["--enable-return-aux-hidden-states", "--speculative-algorithm", "EAGLE3"]
EIGHT = (2, 4, 5)  # the emulator model's 8 layers: EAGLE-3's default 2, n/2, n-3
REPO_MODEL = Path(__file__).resolve().parents[1] / "regen" / "data" / "emulator-model"


def test_eagle3_default_layers_and_explicit_ids() -> None:
    eagle = resolve(FeaturesConfig(), 36)
    assert eagle.hidden_indices == (2, 18, 33)
    assert eagle.flags() == [
        "--enable-return-aux-hidden-states",
        "--speculative-algorithm",
        "EAGLE3",
    ]
    dflash = resolve(FeaturesConfig(convention="dflash", layer_ids=[20, 1, 10]), 36)
    # SGLang captures the output of layer k as the input of layer k+1, in layer order.
    assert dflash.hidden_indices == (2, 11, 21)
    assert dflash.flags()[-4:] == ["--return-aux-hidden-state-layer-ids", "20", "1", "10"]


@pytest.mark.parametrize(
    ("features", "layers", "says"),
    [
        (FeaturesConfig(), 4, "not three distinct layers"),
        (FeaturesConfig(layer_ids=[1, 7]), 8, "its last layer's output is the stored"),
    ],
)
def test_layers_a_model_cannot_give_are_refused(
    features: FeaturesConfig, layers: int, says: str
) -> None:
    with pytest.raises(ConfigError, match=says):
        resolve(features, layers)


def test_dflash_needs_layer_ids() -> None:
    with pytest.raises(ValueError, match=r"needs features\.layer_ids"):
        FeaturesConfig(convention="dflash")


def test_bf16_and_fp8_round_trip_within_their_documented_error() -> None:
    rng = np.random.default_rng(7)
    # Residual-stream-like rows: most values small, a few large outliers per token.
    aux = rng.normal(size=(50, 96)).astype(np.float32) * rng.uniform(0.1, 30, size=(50, 1))
    aux[:, 3] *= 40
    last = rng.normal(size=(50, 32)).astype(np.float32)
    ids, mask = np.arange(50), np.r_[np.zeros(20), np.ones(30)]
    bf = decode(encode("a#t1", 1, ids, mask, aux, last, "bf16"))
    assert bf.aux_hidden_state.dtype == BF16 and not bf.scales
    assert np.array_equal(bf.input_ids, ids) and np.array_equal(bf.loss_mask, mask)
    assert (bf.id, bf.turn) == ("a#t1", 1)
    assert np.all(np.abs(bf.dequantized("aux_hidden_state") - aux) <= 2.0**-8 * np.abs(aux))
    f8 = decode(encode("a#t1", 1, ids, mask, aux, last, "fp8"))
    for name, values in (("aux_hidden_state", aux), ("hidden_state", last)):
        scale = f8.scales[name][:, None]
        bound = np.maximum(FP8_RELATIVE * np.abs(values), FP8_FLOOR * scale)
        assert np.all(np.abs(f8.dequantized(name) - values) <= bound)
        assert np.allclose(np.abs(f8.dequantized(name)).max(axis=1), np.abs(values).max(axis=1))


def test_a_capture_module_server_answers_with_a_key_and_a_stock_one_with_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = [5, 9, 9, 17, 3]
    aux, last = pseudo_states(ids, EIGHT, 64)
    with in_process([CAPTURE_FLAGS]) as (emu,):
        body: dict[str, object] = {"input_ids": ids, "sampling_params": {"max_new_tokens": 1}}
        body["return_hidden_states"] = True

        stock = httpx.post(f"{emu.url}/generate", json=body).json()
        assert np.array_equal(parse_json(stock, len(ids)).aux, aux.astype(np.float32))
        monkeypatch.setenv(CAPTURE_ENV, str(tmp_path))
        keyed = httpx.post(f"{emu.url}/generate", json=body).json()
        got = read_keyed(keyed, ids, tmp_path)
        assert np.array_equal(got.aux, aux) and got.last is not None
        assert np.array_equal(got.last, last)
        assert not list(tmp_path.iterdir()), "the capture file is deleted once read"
        again = httpx.post(f"{emu.url}/generate", json=body).json()
        with pytest.raises(CaptureError, match="other token ids"):
            read_keyed(again, [*ids[:-1], 4], tmp_path)
        plain = httpx.post(f"{emu.url}/generate", json={**body, "return_hidden_states": False})
        assert plain.status_code == 400  # the route wants text without hidden states
    with in_process([[]]) as (emu,):
        refused = httpx.post(f"{emu.url}/generate", json=body)
        assert refused.status_code == 400 and "aux-hidden-states" in refused.text


class _Recording(LocalStorage):
    """Local storage that remembers the order of its writes."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.writes: list[str] = []

    def write_bytes(self, key: str, data: bytes) -> None:
        self.writes.append(key)
        super().write_bytes(key, data)


def _record(dataset: Storage, dtype: str = "bf16") -> FeatureRecord:
    return FeatureRecord(
        convention="eagle3", layer_ids=None, hidden_indices=list(EIGHT), num_layers=8,
        hidden_size=64, dtype=dtype, turns="each", model="emu-model", dataset=dataset.uri,
    )  # fmt: skip


@pytest.fixture
def capture_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    capture = tmp_path / "capture"
    monkeypatch.setenv(CAPTURE_ENV, str(capture))
    return capture


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_a_shard_is_captured_sample_by_sample_and_committed_manifest_last(
    tmp_path: Path, capture_env: Path, dtype: str
) -> None:
    dataset = make_export_dataset(tmp_path / "ds", rows=12, shard_size=6, turns=2)
    committed = read_committed(dataset)
    storage = _Recording(tmp_path / "features")
    record = _record(dataset, dtype)
    with in_process([CAPTURE_FLAGS, CAPTURE_FLAGS]) as emus:
        servers = [CaptureServer(Endpoint(i, e.url), capture_env) for i, e in enumerate(emus)]
        with CapturePool(servers, SecretStr("k"), concurrency=3).running() as pool:
            todo = shard_samples(committed, 1, record)
            manifest = capture_shard(todo, pool, storage, record, committed.identity(1))
    assert storage.writes[-1] == feature_manifest_key(1)
    assert len(storage.writes) == len(manifest.samples) + 1 == 13  # 6 rows x 2 turns + 1
    expected = samples(committed.scan([1]).collect(), "each").collect()
    for entry, want in zip(manifest.samples, expected.iter_rows(named=True), strict=True):
        got = decode(storage.read_bytes(entry.key))
        assert (got.id, got.turn) == (want["id"], want["turn"]) == (entry.id, entry.turn)
        assert got.input_ids.tolist() == want["input_ids"]
        assert got.loss_mask.tolist() == want["loss_mask"]
        aux, last = pseudo_states(want["input_ids"], EIGHT, 64)
        tolerance = FP8_RELATIVE if dtype == "fp8" else 2.0**-8
        scale = np.abs(aux.astype(np.float32)).max() if dtype == "fp8" else 0.0
        err = np.abs(got.dequantized("aux_hidden_state") - aux.astype(np.float32))
        assert np.all(err <= np.maximum(tolerance * np.abs(aux), FP8_FLOOR * scale + 1e-6))
        assert got.dequantized("hidden_state").shape == last.shape
    assert not list(capture_env.iterdir())


def test_a_rerun_plans_only_shards_without_a_manifest_of_this_feature_set(
    tmp_path: Path, capture_env: Path
) -> None:
    dataset = make_export_dataset(tmp_path / "ds", rows=12, shard_size=4)
    committed = read_committed(dataset)
    storage = LocalStorage(tmp_path / "features")
    record = _record(dataset)
    claim_record(storage, record)
    with in_process([CAPTURE_FLAGS]) as (emu,):
        servers = [CaptureServer(Endpoint(0, emu.url), capture_env)]
        with CapturePool(servers, SecretStr("k"), concurrency=2).running() as pool:
            first = plan_features(committed, storage, record)
            assert first.pending == [0, 1, 2] and first.pending_samples == 12
            todo = shard_samples(committed, 1, record)
            capture_shard(todo, pool, storage, record, committed.identity(1))
    again = plan_features(committed, storage, record)
    assert again.pending == [0, 2] and list(again.done) == [1]
    assert again.pending_tokens == sum(
        s["seq_len"]
        for s in samples(committed.scan([0, 2]).collect()).collect().iter_rows(named=True)
    )
    # Another feature set never counts as done, and the root refuses it.
    other = record.model_copy(update={"dtype": "fp8"})
    assert plan_features(committed, storage, other).pending == [0, 1, 2]
    with pytest.raises(UsageError, match="holds eagle3"):
        claim_record(storage, other)
    assert list(read_manifests(storage)) == [1]
    assert storage.list(FEATURES_PREFIX)


def test_a_sample_the_server_refuses_is_listed_not_retried(
    tmp_path: Path, capture_env: Path
) -> None:
    dataset = make_export_dataset(tmp_path / "ds", rows=4, shard_size=4, prompt_tokens=80)
    committed = read_committed(dataset)
    record = _record(dataset)
    todo = shard_samples(committed, 0, record)
    lengths = todo.frame["seq_len"].to_list()
    longest, shortest = max(lengths), min(lengths)
    assert shortest < longest
    flags = [*CAPTURE_FLAGS, "--context-length", str(longest)]
    storage = LocalStorage(tmp_path / "features")
    with in_process([flags]) as (emu,):
        servers = [CaptureServer(Endpoint(0, emu.url), capture_env)]
        with CapturePool(servers, SecretStr("k"), concurrency=2).running() as pool:
            manifest = capture_shard(todo, pool, storage, record, committed.identity(0))
    too_long = todo.frame.filter(pl.col("seq_len") >= longest)
    assert [f.id for f in manifest.failed] == too_long["id"].to_list()
    assert "context length" in manifest.failed[0].reason
    assert len(manifest.samples) + len(manifest.failed) == todo.frame.height


def test_sizes_are_tokens_x_layers_x_hidden_x_bytes() -> None:
    from regen.features.sizes import FeatureSize, bytes_per_token

    assert bytes_per_token(3, 4096, "bf16") == 4 * 4096 * 2 + 5
    assert bytes_per_token(3, 4096, "fp8") == 4 * 4096 + 2 * 4 + 5
    size = FeatureSize(2000 * 1000, 3, 4096, "bf16")
    assert size.bytes == 2_000_000 * (4 * 4096 * 2 + 5)
    assert "2,000,000 tokens x 4 layers x 4096 hidden x 2 B" in size.describe()
    assert size.seconds(20_000, 8) == 2_000_000 / 160_000


def test_estimate_gives_the_features_size_and_time(tmp_path: Path) -> None:
    from regen.config import parse_config
    from regen.estimate import Rate, estimate

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(f'{{"id": "{i}", "prompt": "hello there"}}\n' for i in range(10)))
    config = parse_config(
        {
            "model": {"source": str(REPO_MODEL), "served_name": "m", "stage": False},
            "prompts": str(prompts),
            "output": str(tmp_path / "out"),
            "sampling": {"max_tokens": 100},
            "features": {"dtype": "fp8"},
        }
    )
    lines = estimate(config, Rate(1000, "given"), gpus=[2], prefill_tok_s=500).lines()
    features = next(line for line in lines if line.startswith("features:"))
    # 10 answers of at most 100 + a prompt's bytes / 3 tokens, 4 layers x 64 x 1 B + scales.
    assert "x 4 layers x 64 hidden x 1 B + scales" in features
    assert any(line.startswith("features on 2:") for line in lines)


def test_a_disk_that_cannot_hold_the_features_is_refused_before_any_capture(
    tmp_path: Path,
) -> None:
    from regen.features.stage import FeaturePlan, check_space

    storage = LocalStorage(tmp_path / "features")
    record = _record(storage)
    small = FeaturePlan(record, [0], {}, [0], {0: "x"}, pending_tokens=10, pending_samples=1)
    assert check_space(storage, small) is None
    huge = FeaturePlan(record, [0], {}, [0], {0: "x"}, pending_tokens=10**13, pending_samples=1)
    refused = check_space(storage, huge)
    assert refused is not None and "free space or set features.dest" in refused
