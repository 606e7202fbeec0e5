"""Stage 7 whole, free of Prefect: what to capture, the record, progress, and the loop.

Which shards: every committed dataset shard whose feature manifest is missing, of another
feature set, or made from another version of the shard (`Committed.identity`: a shard whose
rows were regenerated is captured again). So a rerun does exactly what is left, and a kill
at any moment loses at most the shards in flight, none of which has a manifest.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from regen.config import FeaturesConfig
from regen.dataset.keys import FEATURES_PROGRESS_KEY
from regen.dataset.reader import Committed
from regen.display.figures import byte_size
from regen.errors import ConfigError
from regen.features.layers import CaptureLayers, resolve
from regen.features.manifest import FeatureManifest, FeatureRecord, read_manifests
from regen.features.sizes import FeatureSize
from regen.lossmask.ids import sample_sizes
from regen.preflight.space import OutputEstimate
from regen.storage import Storage

StartShard = Callable[[int], futures.Future[FeatureManifest]]


def model_shape(model_dir: Path) -> tuple[int, int]:
    """(num_hidden_layers, hidden_size) of a model directory's config.json (its text config
    for a multimodal model)."""
    path = Path(model_dir) / "config.json"
    try:
        config: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"{path}: cannot read the model's shape for features: {err}") from None
    text = config.get("text_config") or config
    layers, hidden = text.get("num_hidden_layers"), text.get("hidden_size")
    if not isinstance(layers, int) or not isinstance(hidden, int):
        raise ConfigError(f"{path}: no num_hidden_layers / hidden_size for the features' shape")
    return layers, hidden


def feature_record(
    features: FeaturesConfig, model_dir: Path, model: str, dataset: str
) -> tuple[FeatureRecord, CaptureLayers]:
    layers_n, hidden = model_shape(model_dir)
    layers = resolve(features, layers_n)
    record = FeatureRecord(
        convention=layers.convention, layer_ids=features.layer_ids,
        hidden_indices=list(layers.hidden_indices), num_layers=layers_n, hidden_size=hidden,
        dtype=features.dtype, turns=features.turns, model=model, dataset=dataset,
    )  # fmt: skip
    return record, layers


@dataclass(frozen=True)
class FeaturePlan:
    record: FeatureRecord
    shards: list[int]
    done: dict[int, FeatureManifest]
    pending: list[int]
    sources: dict[int, str]
    pending_tokens: int
    pending_samples: int

    def headline(self) -> str:
        size = FeatureSize.of(self.record, self.pending_tokens)
        return (
            f"features: {len(self.shards):,} dataset shards, {len(self.done):,} captured, "
            f"{len(self.pending):,} to capture ({self.pending_samples:,} samples, "
            f"{self.pending_tokens:,} tokens, {size.describe()})"
        )


def plan_features(committed: Committed, storage: Storage, record: FeatureRecord) -> FeaturePlan:
    manifests = read_manifests(storage)
    sources = {shard: committed.identity(shard) for shard in committed.shards}
    done = {
        shard: m
        for shard, m in manifests.items()
        if sources.get(shard) == m.source and m.fingerprint == record.fingerprint
    }
    pending = [s for s in committed.shards if s not in done]
    sizes = sample_sizes(committed.scan(pending).select("id", "turns"))
    sizes = sizes.filter(pl.col("seq_len").is_not_null())
    if record.turns == "last":
        sizes = sizes.group_by("id", maintain_order=True).last()
    totals = sizes.select(
        pl.col("seq_len").sum().alias("tokens"), pl.len().alias("samples")
    ).collect()
    tokens, count = totals.row(0) if totals.height else (0, 0)
    return FeaturePlan(record, committed.shards, done, pending, sources, tokens or 0, count)


def check_space(storage: Storage, plan: FeaturePlan) -> str | None:
    """Refuse, before any GPU work, a local root whose disk cannot hold what is left to
    capture (as the storage check refuses a run, regen.preflight.space); None when it fits or
    the root is on S3 (no free space to read). The line says what is needed and what is free."""
    from regen.preflight.space import free_bytes, judge_space
    from regen.storage import LocalStorage

    if not isinstance(storage, LocalStorage) or not plan.pending_tokens:
        return None
    size = FeatureSize.of(plan.record, plan.pending_tokens)
    storage.root.mkdir(parents=True, exist_ok=True)
    free = free_bytes(storage.root)
    needed = OutputEstimate(1, size.bytes, "features")
    if judge_space(free, needed) != "fail":
        return None
    return (
        f"features: {storage.uri}: the features left to capture need {size.describe()}, "
        f"{byte_size(free)} is free there; free space or set features.dest elsewhere"
    )


class FeatureProgress:
    """Samples, tokens and bytes written so far, from any shard's thread; its snapshots are
    `features/progress.json` and the Prefect progress."""

    def __init__(self, plan: FeaturePlan) -> None:
        self._lock = threading.Lock()
        self.plan = plan
        self.started = time.monotonic()
        self.samples = self.tokens = self.bytes = self.shards = 0

    def sample(self, tokens: int, size: int) -> None:
        with self._lock:
            self.samples += 1
            self.tokens += tokens
            self.bytes += size

    def shard(self) -> None:
        with self._lock:
            self.shards += 1

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            elapsed = max(time.monotonic() - self.started, 1e-9)
            rate = self.tokens / elapsed
            left = max(self.plan.pending_tokens - self.tokens, 0)
            return {
                "shards_done": self.shards,
                "shards_pending": len(self.plan.pending),
                "samples_done": self.samples,
                "samples_total": self.plan.pending_samples,
                "tokens_done": self.tokens,
                "tokens_total": self.plan.pending_tokens,
                "bytes_written": self.bytes,
                "elapsed_s": round(elapsed, 2),
                "tokens_per_s": round(rate, 1),
                "eta_s": round(left / rate, 1) if rate > 0 else None,
            }

    @property
    def fraction(self) -> float:
        total = self.plan.pending_tokens
        return 1.0 if not total else min(self.tokens / total, 1.0)

    def write(self, storage: Storage) -> dict[str, Any]:
        snapshot = self.snapshot()
        storage.write_bytes(FEATURES_PROGRESS_KEY, json.dumps(snapshot, indent=2).encode())
        return snapshot


def run_shards(
    pending: list[int], start: StartShard, in_flight: int
) -> tuple[list[FeatureManifest], list[tuple[int, BaseException]]]:
    """Every pending shard through `start`, `in_flight` at a time; the committed manifests and
    the shards that failed (after their task's own retries), in shard order."""
    done: list[FeatureManifest] = []
    errors: list[tuple[int, BaseException]] = []
    running: dict[futures.Future[FeatureManifest], int] = {}
    queue = iter(pending)
    while True:
        while len(running) < in_flight and (shard := next(queue, None)) is not None:
            running[start(shard)] = shard
        if not running:
            break
        finished, _ = futures.wait(running, return_when=futures.FIRST_COMPLETED)
        for future in finished:
            shard = running.pop(future)
            try:
                done.append(future.result())
            except Exception as err:
                errors.append((shard, err))
    return sorted(done, key=lambda m: m.shard), sorted(errors, key=lambda e: e[0])
