"""Shard plan, run.json fingerprint checks, and the commit/replace protocol on a local root."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq  # type: ignore[import-untyped]
import pytest

from regen.config import parse_config
from regen.dataset import (
    PLAN_KEY,
    PLAN_SCHEMA,
    RUN_KEY,
    cache_prompts,
    commit_shard,
    committed_shards,
    data_key,
    error_rows,
    manifest_key,
    new_run_info,
    open_run,
    parse_shard_range,
    plan_shards,
    prompts_for_shard,
    read_shard,
    replace_shard,
)
from regen.errors import FingerprintMismatch, UserError
from regen.prompts import PromptSet, load_prompts
from regen.schema import row_schema
from regen.storage import LocalStorage

FP = "f" * 64


def _prompts(tmp_path: Path, n: int) -> PromptSet:
    path = tmp_path / "p.jsonl"
    rows = [{"id": f"r{i}", "messages": [{"role": "user", "content": f"q{i}"}]} for i in range(n)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return load_prompts(str(path))


def _rows(shard: int, ids: list[str], errors: list[str | None] | None = None) -> pl.DataFrame:
    n = len(ids)
    errors = errors or [None] * n
    return pl.DataFrame(
        {
            "id": ids,
            "shard": [shard] * n,
            "messages": [[{"role": "user", "content": "q"}]] * n,
            "content": [None if e else f"answer {i}" for i, e in zip(ids, errors, strict=True)],
            "reasoning_content": ["thinking"] * n,
            "finish_reason": ["stop"] * n,
            "prompt_tokens": [3] * n,
            "completion_tokens": [10] * n,
            "reasoning_tokens": [5] * n,
            "model": ["m"] * n,
            "server": ["server-0"] * n,
            "attempts": [1] * n,
            "latency_s": [0.5] * n,
            "error": errors,
            "turns": [[]] * n,
            "tools": [None] * n,
            "sampling": [None] * n,
        },
        schema=row_schema(),
    )


def _config(**sampling: object) -> dict[str, object]:
    return {
        "model": {"source": "/models/x", "served_name": "x"},
        "prompts": "p.jsonl",
        "output": "out",
        "shard_size": 4,
        "sampling": sampling,
    }


def test_plan_is_deterministic_and_contiguous(tmp_path: Path) -> None:
    ps = _prompts(tmp_path, 10)
    plan = plan_shards(ps, 4)
    assert (plan.num_rows, plan.num_shards) == (10, 3)
    assert plan.assignments.get_column("shard").to_list() == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2]
    assert plan.assignments.equals(plan_shards(ps, 4).assignments)
    assert plan.assignments.schema == PLAN_SCHEMA
    assert plan.assignments.get_column("content").n_unique() == 10, "one hash per content"
    assert plan.assignments.get_column("revision").to_list() == [1] * 10


def test_open_run_writes_resumes_and_names_the_changed_setting(tmp_path: Path) -> None:
    ps = _prompts(tmp_path, 10)
    plan = plan_shards(ps, 4)
    storage = LocalStorage(tmp_path / "out")
    info = new_run_info(parse_config(_config(max_tokens=4096)), ps, plan)
    assert open_run(storage, info, plan, new_output=False) == info
    saved = json.loads(storage.read_bytes(RUN_KEY))
    assert saved["components"]["sampling.max_tokens"] == 4096
    assert {"input_fingerprint", "model", "sampling", "num_shards", "created"} <= saved.keys()
    assert pl.read_parquet(storage.polars_path(PLAN_KEY)).equals(plan.assignments)

    again = new_run_info(parse_config(_config(max_tokens=4096)), ps, plan)
    assert open_run(storage, again, plan, new_output=False).created == info.created

    changed = new_run_info(parse_config(_config(max_tokens=2048)), ps, plan)
    # Refused once the first run has committed a shard (the manifest is the commit mark).
    storage.write_bytes(manifest_key(0), b"{}")
    with pytest.raises(FingerprintMismatch) as err:
        open_run(storage, changed, plan, new_output=False)
    assert "run.json was made with sampling.max_tokens=4096, this run has 2048" in str(err.value)
    assert "generation.new_output: true" in str(err.value)


def test_an_output_whose_run_committed_nothing_is_taken_over_by_another_config(
    tmp_path: Path,
) -> None:
    """A canary stop or a crash before the first shard: the output holds no run's data, so a
    fixed config reuses it; what the first run left (its canary rows) is moved aside."""
    ps = _prompts(tmp_path, 10)
    plan = plan_shards(ps, 4)
    storage = LocalStorage(tmp_path / "out")
    first = new_run_info(parse_config(_config(max_tokens=4096)), ps, plan)
    open_run(storage, first, plan, new_output=False)
    storage.write_bytes(f"canary/canary-{first.fingerprint}.parquet", b"rows")
    fixed = new_run_info(parse_config(_config(max_tokens=2048)), ps, plan)
    assert open_run(storage, fixed, plan, new_output=False) == fixed
    assert json.loads(storage.read_bytes(RUN_KEY))["fingerprint"] == fixed.fingerprint
    assert storage.list("canary/") == []
    assert storage.exists(
        f"superseded/{first.fingerprint}/canary/canary-{first.fingerprint}.parquet"
    )


def test_a_run_without_token_ids_resumes_with_them(tmp_path: Path) -> None:
    """token_ids only adds ids beside the same text: not a new run, and an older run.json
    (made before the setting existed) still matches."""
    ps = _prompts(tmp_path, 8)
    plan = plan_shards(ps, 4)
    storage = LocalStorage(tmp_path / "out")
    without = parse_config({**_config(), "regeneration": {"token_ids": False}})
    old = new_run_info(without, ps, plan)
    assert "regeneration.token_ids" not in old.components
    assert old.regeneration["token_ids"] is False  # run.json still says what it was
    open_run(storage, old, plan, new_output=False)
    resumed = open_run(
        storage, new_run_info(parse_config(_config()), ps, plan), plan, new_output=False
    )
    assert resumed.fingerprint == old.fingerprint
    other = parse_config({**_config(), "regeneration": {"thinking": "off"}})
    assert new_run_info(other, ps, plan).fingerprint != old.fingerprint


def test_run_json_counts_the_rows_of_each_format(tmp_path: Path) -> None:
    """A mixed prompt file's run.json says which formats its rows came in, and how many;
    a run.json written before the counts existed still resumes its run."""
    path = tmp_path / "mixed.jsonl"
    rows = [
        {"id": "m", "messages": [{"role": "user", "content": "q"}]},
        {"id": "p1", "prompt": "q1"},
        {"id": "p2", "prompt": "q2", "system": "s"},
        {"id": "s", "conversations": [{"from": "human", "value": "q3"}]},
        {"id": "bad", "prompt": "q4", "conversations": [{"from": "human", "value": "q4"}]},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    ps = load_prompts(str(path))
    plan = plan_shards(ps, 4)
    storage = LocalStorage(tmp_path / "out")
    info = new_run_info(parse_config(_config()), ps, plan)
    open_run(storage, info, plan, new_output=False)
    saved = json.loads(storage.read_bytes(RUN_KEY))
    assert saved["format"] == "mixed" and saved["num_rows"] == 4
    assert saved["formats"] == {"messages": 1, "prompt": 2, "sharegpt": 1}
    one = new_run_info(parse_config(_config()), _prompts(tmp_path, 3), plan)
    assert (one.format, one.formats) == ("messages", {"messages": 3})

    del saved["formats"]  # as run.json was written before per-format counts
    storage.write_bytes(RUN_KEY, json.dumps(saved).encode())
    resumed = open_run(storage, info, plan, new_output=False)
    assert (resumed.fingerprint, resumed.format, resumed.formats) == (
        info.fingerprint,
        "mixed",
        {},
    )


def test_new_output_moves_the_old_run_aside(tmp_path: Path) -> None:
    ps = _prompts(tmp_path, 8)
    plan = plan_shards(ps, 4)
    storage = LocalStorage(tmp_path / "out")
    old = new_run_info(parse_config(_config(temperature=0.6)), ps, plan)
    open_run(storage, old, plan, new_output=False)
    commit_shard(storage, 0, _rows(0, ["r0", "r1"]), fingerprint=old.fingerprint, timings={})
    new = new_run_info(parse_config(_config(temperature=1.0)), ps, plan)
    assert open_run(storage, new, plan, new_output=True) == new
    moved = f"superseded/{old.fingerprint}/"
    assert storage.exists(moved + data_key(0)) and storage.exists(moved + RUN_KEY)
    assert not storage.exists(data_key(0))
    assert committed_shards(storage, new.fingerprint) == {}
    assert json.loads(storage.read_bytes(RUN_KEY))["fingerprint"] == new.fingerprint


def test_commit_writes_schema_ordered_data_then_manifest(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    rows = _rows(3, ["a", "b", "c"], [None, "empty answer", None])
    shuffled = rows.select(reversed(rows.columns))
    manifest = commit_shard(storage, 3, shuffled, fingerprint=FP, timings={"generate_s": 1.5})
    assert (manifest.rows, manifest.ok, manifest.failed) == (3, 2, 1)
    assert manifest.data == "shards/shard-000003.parquet"
    stored = json.loads(storage.read_bytes(manifest_key(3)))
    assert stored["sha256"] == manifest.sha256 and stored["timings"] == {"generate_s": 1.5}
    assert read_shard(storage, manifest).equals(rows)
    assert committed_shards(storage, FP) == {3: manifest}
    assert committed_shards(storage, "other") == {}
    with pytest.raises(ValueError, match="already committed"):
        commit_shard(storage, 3, rows, fingerprint=FP, timings={})


def test_commit_refuses_rows_of_another_shard_or_twice_an_id(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    with pytest.raises(ValueError, match="another shard"):
        commit_shard(storage, 1, _rows(2, ["a"]), fingerprint=FP, timings={})
    with pytest.raises(ValueError, match="twice"):
        commit_shard(storage, 1, _rows(1, ["a", "a"]), fingerprint=FP, timings={})
    assert storage.list() == []


def test_data_without_manifest_or_with_bad_checksum_is_not_committed(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    storage.write_bytes(data_key(0), b"half written")
    commit_shard(storage, 1, _rows(1, ["x"]), fingerprint=FP, timings={})
    assert set(committed_shards(storage, FP)) == {1}
    storage.write_bytes(data_key(1), b"corrupted after the commit")
    assert set(committed_shards(storage, FP)) == {1}
    assert committed_shards(storage, FP, verify=True) == {}
    storage.delete(data_key(1))
    assert committed_shards(storage, FP) == {}


def test_replace_shard_keeps_every_id_exactly_once(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    ids = ["a", "b", "c", "d"]
    commit_shard(
        storage, 0, _rows(0, ids, [None, "timeout", None, "http 500"]), fingerprint=FP, timings={}
    )
    broken = error_rows(storage, 0)
    assert broken.get_column("id").to_list() == ["b", "d"]
    fixed = broken.with_columns(content=pl.lit("fixed"), error=pl.lit(None, dtype=pl.String))
    manifest = replace_shard(storage, 0, fixed, fingerprint=FP, timings={})
    assert (manifest.generation, manifest.data) == (2, "shards/shard-000000.g2.parquet")
    after = read_shard(storage, committed_shards(storage, FP, verify=True)[0])
    assert after.get_column("id").to_list() == ids
    assert after.get_column("error").null_count() == 4 and manifest.failed == 0
    assert storage.list("shards/") == [manifest.data, manifest_key(0)]
    assert error_rows(storage, 0).height == 0
    with pytest.raises(ValueError, match="not in the shard"):
        replace_shard(storage, 0, _rows(0, ["zz"]), fingerprint=FP, timings={})


def test_shard_ranges() -> None:
    assert parse_shard_range(None, 5) == range(5)
    assert parse_shard_range(":2", 5) == range(2)
    assert parse_shard_range("3:", 5) == range(3, 5)
    assert parse_shard_range("3:99", 5) == range(3, 5)


@pytest.mark.parametrize("spec", ["abc", "5:", "3:3", "4:2", "1-2"])
def test_bad_shard_range_names_the_setting(spec: str) -> None:
    with pytest.raises(UserError, match=r"^generation\.shards: "):
        parse_shard_range(spec, 5)


def test_prompt_cache_reads_one_shard(tmp_path: Path) -> None:
    ps = _prompts(tmp_path, 10)
    plan = plan_shards(ps, 4)
    path = cache_prompts(ps, plan, tmp_path / "work" / "prompts-x.parquet")
    rows = prompts_for_shard(path, 1)
    assert rows.columns == ["id", "shard", "messages", "tools", "revision"]
    assert rows.get_column("id").to_list() == ["r4", "r5", "r6", "r7"]
    assert prompts_for_shard(path, 7).height == 0


def test_prompt_cache_of_many_writes_has_a_row_group_per_shard(tmp_path: Path) -> None:
    """More shards than one write holds: every shard is still one row group, read whole and in
    plan order, and a cache limited to `work` holds only those rows."""
    ps = _prompts(tmp_path, 300)
    plan = plan_shards(ps, 2)  # 150 shards: three writes of 64
    path = cache_prompts(ps, plan, tmp_path / "work" / "all.parquet")
    assert pq.ParquetFile(path).metadata.num_row_groups == 150
    assert prompts_for_shard(path, 149).get_column("id").to_list() == ["r298", "r299"]
    whole = pl.read_parquet(path)
    assert whole.get_column("id").to_list() == [f"r{i}" for i in range(300)]
    work = plan.with_rows().filter(pl.col("shard").is_in([3, 70, 140]))
    some = cache_prompts(ps, plan, tmp_path / "work" / "some.parquet", work=work)
    assert pl.read_parquet(some).get_column("shard").to_list() == [3, 3, 70, 70, 140, 140]
