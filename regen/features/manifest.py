"""What a features root holds: its record (`features/features.json`) and one manifest per
dataset shard, the commit mark, written after every sample file it names (as
regen/dataset/commit.py commits rows: data first, manifest last; a shard without a manifest
is captured again whole, its files overwritten under the same keys)."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict, Field

from regen.config import FeatureDtype, Turns
from regen.dataset.keys import (
    FEATURE_MANIFESTS_PREFIX,
    FEATURES_PREFIX,
    FEATURES_RECORD_KEY,
    feature_manifest_key,
    parse_feature_manifest_key,
)
from regen.errors import UsageError
from regen.storage import Storage


class FeatureRecord(BaseModel):
    """The feature set of a root: a rerun with other settings is refused, not mixed in."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    convention: str = Field(description="eagle3, dflash or dspark.")
    layer_ids: list[int] | None = Field(description="As configured; None: EAGLE-3's default.")
    hidden_indices: list[int] = Field(
        description="Each aux state's index in transformers' output_hidden_states."
    )
    num_layers: int
    hidden_size: int
    dtype: FeatureDtype
    turns: Turns
    model: str = Field(description="The served model the states are of.")
    dataset: str = Field(description="The dataset root whose token ids were captured.")

    @property
    def fingerprint(self) -> str:
        """What a shard's states depend on (not where the dataset lives)."""
        fields = self.model_dump(exclude={"dataset"})
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()

    def describe(self) -> str:
        layers = ", ".join(map(str, self.hidden_indices))
        return (
            f"{self.convention} aux states {layers} + the final state of {self.model} "
            f"({self.num_layers} layers, hidden {self.hidden_size}), {self.dtype}"
        )


class SampleEntry(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    turn: int
    key: str
    tokens: int
    loss_tokens: int
    bytes: int
    sha256: str


class FailedSample(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    turn: int
    reason: str


class FeatureManifest(BaseModel):
    """One feature shard's commit mark."""

    model_config = ConfigDict(frozen=True)

    shard: int
    source: str = Field(description="The dataset shard's identity (manifest sha256) captured.")
    fingerprint: str
    samples: list[SampleEntry]
    failed: list[FailedSample] = []
    no_token_ids: int = Field(default=0, description="Turns without stored ids: no sample.")
    seconds: float = 0.0
    written_at: str = Field(default_factory=lambda: datetime.now(UTC).isoformat())

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.samples)

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.samples)


def read_record(storage: Storage) -> FeatureRecord | None:
    try:
        return FeatureRecord.model_validate_json(storage.read_bytes(FEATURES_RECORD_KEY))
    except FileNotFoundError:
        return None


def claim_record(storage: Storage, record: FeatureRecord) -> None:
    """Write the root's record, or refuse a root that holds another feature set."""
    held = read_record(storage)
    if held is None:
        storage.write_bytes(FEATURES_RECORD_KEY, record.model_dump_json(indent=2).encode())
    elif held.fingerprint != record.fingerprint:
        raise UsageError(
            f"{storage.uri}: {FEATURES_RECORD_KEY} holds {held.describe()}; this run asks "
            f"{record.describe()}: set features.dest to another root, or delete "
            f"{FEATURES_PREFIX} there"
        )


def read_manifests(storage: Storage) -> dict[int, FeatureManifest]:
    """Every readable feature manifest of the root, by shard."""
    found: dict[int, FeatureManifest] = {}
    for key in storage.list(FEATURE_MANIFESTS_PREFIX):
        shard = parse_feature_manifest_key(key)
        if shard is None:
            continue
        try:
            found[shard] = FeatureManifest.model_validate_json(storage.read_bytes(key))
        except (FileNotFoundError, ValueError):
            continue
    return dict(sorted(found.items()))


def write_manifest(storage: Storage, manifest: FeatureManifest) -> None:
    storage.write_bytes(
        feature_manifest_key(manifest.shard), manifest.model_dump_json(indent=2).encode()
    )
