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

    config = _config(tmp_path, str(tmp_path / "out"))
    state = regenerate_completions(config, return_state=True)
    assert state.is_completed(), state.message
    summary = await state.result()
    assert summary.rows_ok == 240 and summary.verdict in {"pass", "warn"}
    async with get_client() as client:
        flow_run = await client.read_flow_run(state.state_details.flow_run_id)
    assert flow_run.state.is_completed()
    names = await _task_run_names(flow_run.id)
    for stage in ("provision", "stage-model", "plan-shards", "launch-fleet", "audit"):
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
    config = _config(tmp_path, str(out), engine={"emulator": {"faults": ["empty-answer=0.87"]}})
    state = regenerate_completions(config, return_state=True)
    assert state.is_failed()
    assert "audit failed" in (state.message or "")
    assert (out / "report" / "audit.md").read_text().startswith("# Audit: **FAIL**")
    checks = {
        c["name"]: c for c in json.loads((out / "report" / "audit.json").read_text())["checks"]
    }
    for name in ("empty_answer", "empty_thinking", "answer_collapse"):
        assert checks[name]["status"] == "fail"
        assert checks[name]["figure"] == pytest.approx(0.87, abs=0.06), name
    assert sorted(_ids(str(out))) == sorted(_sample_ids()), "the data must stay"


MIXED_ROWS = [
    {"id": "m1", "messages": [{"role": "user", "content": "Name a prime."}]},
    {"id": "p1", "prompt": "Name a colour.", "system": "Answer in one word."},
    {"id": "s1", "conversations": [{"from": "human", "value": "Name a river."}]},
    {"messages": [{"role": "user", "content": "Name a planet."}]},
    {"prompt": "Name a metal."},
    {"conversations": [{"from": "human", "value": "Name a tree."}], "system": "Be brief."},
    {"id": "c1", "conversations": [{"role": "user", "content": "Name a sea."}]},
    {
        "id": "u1",
        "prompt": "Name a bird.",
        "messages": [{"role": "user", "content": "Name a bird."}],
    },
    {"id": "x1", "prompt": "Two formats.", "conversations": [{"from": "human", "value": "?"}]},
    {"id": "x2", "text": "No format."},
]


def test_a_mixed_format_prompt_file_is_generated_in_full(tmp_path: Path) -> None:
    """Rows describe themselves: a file of messages, prompt, ShareGPT and SpecForge rows is
    generated in full through the real flow; only the rows of no or two formats are set aside."""
    from flows.regenerate import regenerate_completions

    prompts = tmp_path / "mixed.jsonl"
    prompts.write_text("".join(json.dumps(row) + "\n" for row in MIXED_ROWS))
    out = tmp_path / "out"
    config = _config(tmp_path, str(out), prompts=str(prompts), shard_size=3)
    state = regenerate_completions(config, return_state=True)
    assert state.is_completed(), state.message
    run = json.loads((out / "run.json").read_text())
    assert (run["format"], run["num_rows"], run["num_shards"]) == ("mixed", 8, 3)
    assert run["formats"] == {"messages": 4, "prompt": 2, "sharegpt": 2}
    ids = _ids(str(out))
    given = ["m1", "p1", "s1", "c1", "u1"]
    hashed = sorted(set(ids) - set(given))
    assert len(ids) == len(set(ids)) == 8 and set(given) <= set(ids)
    assert len(hashed) == 3 and all(i.startswith("h-") for i in hashed)
    rejects = pl.read_parquet(out / "rejects" / "rejects.parquet")
    assert rejects.rows() == [
        (9, "x1", "has both conversations and prompt"),
        (10, "x2", "has neither messages nor prompt nor conversations"),
    ]
    data = pl.concat(pl.read_parquet(p) for p in sorted((out / "shards").glob("shard-*.parquet")))
    assert data["error"].null_count() == data.height
    # Each row went out as its own format reads: the prompt row's system key leads its chat.
    sent = {
        row_id: [(m["role"], m["content"]) for m in messages]
        for row_id, messages in data.select("id", "messages").iter_rows()
    }
    assert sent["p1"] == [("system", "Answer in one word."), ("user", "Name a colour.")]
    assert sent["s1"] == [("user", "Name a river.")]
    assert sent["c1"] == [("user", "Name a sea.")]
