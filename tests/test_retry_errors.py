"""`generation.retry_errors` through the whole flow on emulators: a rerun on the same output
regenerates only the error rows of committed shards and swaps them in (`replace_shard`).

Three runs on one output, each a real flow on real emulator processes:

1. healthy, `generation.shards: 0:2`: two shards committed without an error row;
2. every server answers half its requests with HTTP 500 and `max_attempts: 1`, so the
   remaining shards commit with error rows (the audit gate may fail this run);
3. healthy again with `retry_errors: true`: the error rows are regenerated, the ok rows and the
   clean shards are left as they were.

Emulator faults and `generation.*` are not part of the run's fingerprint, so runs 2 and 3
resume the dataset of run 1 instead of being refused.
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import yaml

from regen.dataset import Manifest, manifest_key, progress_key, read_manifest
from regen.rehearsal import bundled, rehearsal_config
from regen.storage import Storage, open_storage

pytestmark = [pytest.mark.timeout(420), pytest.mark.usefixtures("prefect_harness")]

SHARD_SIZE = 60  # the 240 sample prompts in 4 shards
CLEAN = {0, 1}  # committed by the healthy first run


def _run(tmp_path: Path, name: str, out: str, **changes: Any) -> Any:
    from flows.regenerate import regenerate_completions

    data: dict[str, Any] = {
        "work_dir": str(tmp_path / "work"),
        "shard_size": SHARD_SIZE,
        # A small micro-benchmark: the fleet is up sooner.
        "engine": {"bench": {"concurrency": 4, "max_tokens": 32, "budget_s": 10}},
    }
    for section, values in changes.items():
        data.setdefault(section, {}).update(values)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    config = rehearsal_config(config_path=path, out=out, servers=2)
    return regenerate_completions(config, return_state=True)


def _manifests(storage: Storage) -> dict[int, tuple[bytes, Manifest]]:
    found = {}
    for shard in range(240 // SHARD_SIZE):
        manifest = read_manifest(storage, shard)
        assert manifest is not None, f"shard {shard} has no manifest"
        found[shard] = (storage.read_bytes(manifest_key(shard)), manifest)
    return found


def _rows(storage: Storage, manifests: dict[int, tuple[bytes, Manifest]]) -> pl.DataFrame:
    """Every row, read through the manifests (a glob could see two generations of a shard)."""
    return pl.concat(
        [pl.read_parquet(io.BytesIO(storage.read_bytes(m.data))) for _, m in manifests.values()]
    )


def _by_id(rows: pl.DataFrame) -> dict[str, str]:
    """Each row as canonical JSON, by id: equal strings mean every column is the same."""
    return {row["id"]: json.dumps(row, sort_keys=True, default=str) for row in rows.to_dicts()}


def test_retry_errors_regenerates_only_the_error_rows(tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    storage = open_storage(out)
    lines = bundled("sample_prompts.jsonl").read_text().splitlines()
    ids = {json.loads(line)["id"] for line in lines if line.strip()}
    assert len(ids) == 240

    state = _run(tmp_path, "clean", out, generation={"shards": "0:2"})
    # Half the dataset fails the audit's completeness check: the shards are committed all the same.
    assert state.is_completed() or str(state.message).startswith("FAIL: final gate"), state.message

    state = _run(
        tmp_path,
        "faulty",
        out,
        generation={"max_attempts": 1},
        engine={"emulator": {"faults": ["http500=0.5"]}},
        # The error rows must be committed for run 3 to retry: the live gate would stop this
        # run at its canary (tests/test_live_gate.py is where it does).
        audit={"live": "off"},
    )
    assert state.is_completed() or str(state.message).startswith("FAIL: final gate"), state.message
    before = _manifests(storage)
    failed = {k for k, (_, m) in before.items() if m.failed}
    assert failed == set(before) - CLEAN, {k: m.failed for k, (_, m) in before.items()}
    assert all(before[k][1].generation == 1 for k in before)
    rows_before = _rows(storage, before)
    ok_before = _by_id(rows_before.filter(pl.col("error").is_null()))
    order = {k: rows_before.filter(pl.col("shard") == k)["id"].to_list() for k in before}
    assert rows_before["error"].null_count() < rows_before.height  # there is something to retry
    assert len(ok_before) > 0

    state = _run(tmp_path, "retry", out, generation={"retry_errors": True})
    assert state.is_completed(), state.message
    summary = state.result()
    assert summary.rows_failed == 0 and summary.rows_ok == 240

    after = _manifests(storage)
    rows_after = _rows(storage, after)
    assert rows_after.height == 240
    assert rows_after["id"].n_unique() == 240 and set(rows_after["id"]) == ids
    assert rows_after["error"].null_count() == 240, "error rows remain after retry_errors"
    listed = set(storage.list("shards/"))
    for shard, (raw, manifest) in after.items():
        old_raw, old = before[shard]
        if shard in failed:
            assert manifest.generation == old.generation + 1
            assert manifest.data != old.data and manifest.data in listed
            assert old.data not in listed, f"shard {shard}: the old generation was not deleted"
            assert (manifest.rows, manifest.ok, manifest.failed) == (SHARD_SIZE, SHARD_SIZE, 0)
        else:
            assert raw == old_raw, f"shard {shard} had no error row but was rewritten"
        data = storage.read_bytes(manifest.data)
        assert hashlib.sha256(data).hexdigest() == manifest.sha256
        # Each id stays in its place within the shard.
        assert pl.read_parquet(io.BytesIO(data))["id"].to_list() == order[shard]
    # Only the error rows were regenerated: every row that was ok after the faulty run is as it was.
    ok_after = _by_id(rows_after)
    assert {i: ok_after[i] for i in ok_before} == ok_before
    # Each parquet under shards/ is the one its manifest names: no orphan generations left.
    assert {k for k in listed if k.endswith(".parquet")} == {m.data for _, m in after.values()}
    # Progress counts a retried shard's error rows once, when regenerated: it ends at the total.
    progress = json.loads(storage.read_bytes(progress_key()))
    retried = sum(m.failed for _, m in before.values())
    assert progress["already_done"] == 240 - retried
    assert progress["done"] == progress["rows_committed"] == progress["total"] == 240
