"""The flow in this process under a Prefect test server: its states, S3 output, the audit gate."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest
import yaml

from regen.config import RegenConfig
from regen.rehearsal import bundled, rehearsal_config
from regen.storage import open_storage
from tests._s3_helpers import MotoS3, moto_server

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("prefect_harness")]


def _config(tmp_path: Path, output: str, **extra: object) -> RegenConfig:
    data = {"work_dir": str(tmp_path / "work"), "shard_size": 100, **extra}
    path = tmp_path / "rehearsal.yaml"
    path.write_text(yaml.safe_dump(data))
    return rehearsal_config(config_path=path, out=output, servers=2)


def _ids(storage_uri: str) -> list[str]:
    storage = open_storage(storage_uri)
    frames = [
        pl.read_parquet(storage.read_bytes(k))
        for k in storage.list("shards/")
        if k.endswith(".parquet")
    ]
    return pl.concat(frames)["id"].to_list()


def _sample_ids() -> list[str]:
    return pl.read_ndjson(bundled("sample_prompts.jsonl"))["id"].to_list()


async def _task_run_names(flow_run_id: object) -> list[str]:
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    async with get_client() as client:
        runs = await client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
        )
        return [r.name for r in runs]


async def test_every_stage_and_shard_is_a_prefect_task_run(tmp_path: Path) -> None:
    from prefect import get_client

    from flows.regenerate import regenerate_completions

    exports = tmp_path / "exports"
    config = _config(
        tmp_path,
        str(tmp_path / "out"),
        export={"dest": str(exports), "formats": ["specforge", "tokenized"]},
    )
    state = regenerate_completions(config, return_state=True)
    assert state.is_completed(), state.message
    summary = await state.result()
    assert summary.rows_ok == 240 and summary.verdict in {"pass", "warn"}
    # Stage 6 after the passing audit: each format in its own directory, every row in it.
    assert summary.exports == [str(exports / "specforge"), str(exports / "tokenized")]
    specforge = json.loads((exports / "specforge" / "export.json").read_text())["counts"]
    assert specforge["rows_exported"] == specforge["samples"] == 240
    tokens = json.loads((exports / "tokenized" / "export.json").read_text())["counts"]
    assert tokens["samples"] + tokens["dropped"]["no_token_ids"] == 240
    async with get_client() as client:
        flow_run = await client.read_flow_run(state.state_details.flow_run_id)
    assert flow_run.state.is_completed()
    names = await _task_run_names(flow_run.id)
    stages = ("provision", "stage-model", "plan-shards", "launch-fleet", "audit")
    for stage in (*stages, "export-specforge", "export-tokenized"):
        assert any(n.startswith(stage) for n in names), (stage, names)
    shards = sorted(n for n in names if n.startswith("generate-shard-"))
    assert shards == [f"generate-shard-{k:06d}" for k in range(3)]
    assert sorted(_ids(config.output)) == sorted(_sample_ids())


@pytest.fixture
def moto(monkeypatch: pytest.MonkeyPatch) -> Iterator[MotoS3]:
    with moto_server() as server:
        for key, value in server.env.items():
            monkeypatch.setenv(key, value)
        yield server


def test_rehearsal_reads_and_writes_s3(tmp_path: Path, moto: MotoS3) -> None:
    from flows.regenerate import regenerate_completions

    bucket = moto.create_bucket("regen-flow")
    moto.client().upload_file(str(bundled("sample_prompts.jsonl")), bucket, "in/prompts.jsonl")
    output = f"s3://{bucket}/datasets/run1"
    config = _config(tmp_path, output, prompts=f"s3://{bucket}/in/prompts.jsonl")
    state = regenerate_completions(config, return_state=True)
    assert state.is_completed(), state.message
    ids = _ids(output)
    assert len(ids) == len(set(ids)) and sorted(ids) == sorted(_sample_ids())
    keys = open_storage(output).list("")
    for key in ("run.json", "plan.parquet", "progress.json", "report/audit.md"):
        assert key in keys, key


def test_missing_bucket_fails_provisioning_before_launch(tmp_path: Path, moto: MotoS3) -> None:
    from flows.regenerate import regenerate_completions

    config = _config(tmp_path, "s3://no-such-bucket/out")
    state = regenerate_completions(config, return_state=True)
    assert state.is_failed()
    assert "no-such-bucket" in (state.message or "")
    assert not (tmp_path / "work" / "logs").exists(), "a server was launched"


def test_incident_dataset_fails_the_gate_and_keeps_data(tmp_path: Path) -> None:
    from flows.regenerate import regenerate_completions

    out = tmp_path / "out"
    exports = tmp_path / "exports"
    config = _config(
        tmp_path,
        str(out),
        engine={"emulator": {"faults": ["empty-answer=0.87"]}},
        export={"dest": str(exports), "formats": ["specforge"]},
    )
    state = regenerate_completions(config, return_state=True)
    assert state.is_failed()
    assert "audit failed" in (state.message or "")
    assert not exports.exists(), "a dataset that fails the audit is never exported"
    assert (out / "report" / "audit.md").read_text().startswith("# Audit: **FAIL**")
    checks = {
        c["name"]: c for c in json.loads((out / "report" / "audit.json").read_text())["checks"]
    }
    for name in ("empty_answer", "empty_thinking", "answer_collapse"):
        assert checks[name]["status"] == "fail"
        assert checks[name]["figure"] == pytest.approx(0.87, abs=0.06), name
    assert sorted(_ids(str(out))) == sorted(_sample_ids()), "the data must stay"
