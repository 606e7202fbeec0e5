"""The flow in this process under a Prefect test server: its states, S3 output, the audit gate."""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from uuid import UUID

import polars as pl
import pytest
import yaml

from regen.config import RegenConfig
from regen.dataset import read_committed
from regen.display.naming import dataset_slug, node_name
from regen.export.exporter import EXPORT_KEY
from regen.rehearsal import bundled, rehearsal_config
from regen.storage import LocalStorage, open_storage
from support.s3 import MotoS3

if TYPE_CHECKING:
    from prefect.client.schemas.objects import Artifact, FlowRun
    from prefect.states import State

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("prefect_harness")]


def _config(tmp_path: Path, output: str, **extra: object) -> RegenConfig:
    data = {"work_dir": str(tmp_path / "work"), "shard_size": 100, **extra}
    path = tmp_path / "rehearsal.yaml"
    path.write_text(yaml.safe_dump(data))
    return rehearsal_config(config_path=path, out=output, servers=2)


def _ids(storage_uri: str) -> list[str]:
    return read_committed(open_storage(storage_uri)).collect()["id"].to_list()


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


@dataclass(frozen=True)
class Run:
    config: RegenConfig
    state: State[Any]


@pytest.fixture(scope="module")
def good_run(prefect_harness: None, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """One passing rehearsal, shared by the tests that read its run and compare against it."""
    from flows.regenerate import regenerate_completions

    tmp_path = tmp_path_factory.mktemp("good")
    exports = {"dest": str(tmp_path / "exports"), "formats": ["specforge", "tokenized"]}
    config = _config(tmp_path, str(tmp_path / "out"), export=exports)
    return Run(config, regenerate_completions(config, return_state=True))


def _flow_run(state: State[Any]) -> FlowRun:
    from prefect import get_client

    assert state.state_details.flow_run_id is not None
    with get_client(sync_client=True) as client:
        return client.read_flow_run(state.state_details.flow_run_id)


def _artifacts(flow_run_id: UUID) -> dict[str, Artifact]:
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    return {a.key: a for a in found if a.key}


def _log_text(flow_run_id: UUID) -> str:
    from prefect import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=5)
    with get_client(sync_client=True) as client:
        logs = client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]))
        )
    return "\n".join(log.message for log in logs)


ARTIFACT_KINDS = (
    "dataset",
    "provisioning-checks",
    "fleet-report",
    "generation-progress",
    "fleet-live",
    "throughput",
    "generation-summary",
    "audit-report",
    "export-specforge",
    "export-tokenized",
)


async def test_every_stage_and_shard_is_a_prefect_task_run(good_run: Run) -> None:
    from prefect import get_client

    config, state = good_run.config, good_run.state
    assert state.is_completed(), state.message
    summary = await state.result()
    assert summary.rows_ok == 240 and summary.verdict in {"pass", "warn"}
    async with get_client() as client:
        assert state.state_details.flow_run_id is not None
        flow_run = await client.read_flow_run(state.state_details.flow_run_id)
    assert flow_run.state is not None and flow_run.state.is_completed()
    names = await _task_run_names(flow_run.id)
    stages = ("provision", "stage-model", "plan-shards", "launch-fleet", "audit")
    for stage in (*stages, "export-specforge", "export-tokenized"):
        assert any(n.startswith(stage) for n in names), (stage, names)
    shards = sorted(n for n in names if n.startswith("generate-shard-"))
    assert shards == [f"generate-shard-{k:06d}" for k in range(3)]
    assert sorted(_ids(config.output)) == sorted(_sample_ids())
    # Stage 6 after the passing audit: each format in its own directory, every row in it, the
    # tokens the emulator's own ids (mask sum = the turn's completion tokens).
    assert config.export is not None
    exports = Path(config.export.dest)
    assert summary.exports == [str(exports / "specforge"), str(exports / "tokenized")]
    specforge = json.loads((exports / "specforge" / EXPORT_KEY).read_text())["counts"]
    assert specforge["rows_exported"] == specforge["samples"] == 240
    tokens = json.loads((exports / "tokenized" / EXPORT_KEY).read_text())["counts"]
    assert (tokens["samples"], tokens["dropped"]) == (240, {"no_token_ids": 0})
    samples = pl.read_ndjson(sorted((exports / "tokenized").glob("shard-*.jsonl")))
    stored = (
        read_committed(open_storage(config.output)).scan().select("id", "completion_tokens")
    ).collect()
    joined = samples.join(stored, on="id", validate="1:1")
    assert joined.height == 240
    assert (joined["input_ids"].list.len() == joined["loss_mask"].list.len()).all()
    assert (joined["loss_mask"].list.sum() == joined["completion_tokens"]).all()


def test_a_run_is_named_and_tagged_for_what_it_does(good_run: Run) -> None:
    flow_run = _flow_run(good_run.state)
    assert flow_run.name == "rehearsal-qwen3-emu-sample-prompts"
    assert {"rehearsal", "model:qwen3-emu", "dataset:out", f"node:{node_name()}"} <= set(
        flow_run.tags
    )
    artifacts = _artifacts(flow_run.id)
    slug = dataset_slug(good_run.config.output)
    assert set(artifacts) == {f"{kind}-{slug}" for kind in ARTIFACT_KINDS}
    audit = artifacts[f"audit-report-{slug}"].description or ""
    # The figure first (a card shows ~50 characters), the dataset's name last.
    assert audit == "audit PASS 240 rows · out" or audit.startswith("audit WARN "), audit


def test_the_audit_artifact_carries_its_plots(good_run: Run) -> None:
    """report/*.png are out of the UI's reach: the audit artifact carries them as data URIs
    (Prefect 3.9.1 renders them), and report/audit.md shows them by relative link."""
    artifacts = _artifacts(_flow_run(good_run.state).id)
    data = str(artifacts[f"audit-report-{dataset_slug(good_run.config.output)}"].data)
    shown = dict(re.findall(r"!\[(\w+)\]\(data:image/png;base64,([^)]+)\)", data))
    assert {"lengths", "finish_reasons"} <= set(shown), data[-500:]
    report = Path(good_run.config.output) / "report"
    for name, uri in shown.items():
        assert base64.b64decode(uri) == (report / f"{name}.png").read_bytes(), name
        assert f"![{name}]({name}.png)" in (report / "audit.md").read_text()
    print(f"\naudit artifact: {len(data):,} characters with {len(shown)} plots")


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
    assert not list((tmp_path / "work").glob("runs/*/logs")), "a server was launched"


def test_incident_dataset_fails_the_gate_and_keeps_data(tmp_path: Path, good_run: Run) -> None:
    from flows.regenerate import regenerate_completions

    out = tmp_path / "out"
    exports = tmp_path / "exports"
    config = _config(
        tmp_path,
        str(out),
        engine={"emulator": {"faults": ["empty-answer=0.87"]}},
        export={"dest": str(exports), "formats": ["specforge"]},
        # The final gate's own verdict; the live gate stops this run at its canary
        # (tests/test_live_gate.py).
        audit={"live": "off"},
    )
    state = regenerate_completions(config, return_state=True)
    assert state.is_failed()
    assert (state.message or "").startswith("FAIL: final gate: ")
    assert not exports.exists(), "a dataset that fails the audit is never exported"
    # The verdict leads, then the failing figures against their thresholds, then where the data is.
    message = state.message or ""
    assert message.startswith("FAIL: "), message
    assert re.search(r"empty_answer \d+(\.\d+)? % \(fail at [\d.]+ %\)", message), message
    assert f"The data was kept: 240 committed rows at {out}" in message
    assert (out / "report" / "audit.md").read_text().startswith("# Audit: **FAIL**")
    checks = {
        c["name"]: c for c in json.loads((out / "report" / "audit.json").read_text())["checks"]
    }
    for name in ("empty_answer", "empty_thinking", "answer_collapse"):
        assert checks[name]["status"] == "fail"
        assert checks[name]["figure"] == pytest.approx(0.87, abs=0.06), name
    # The loss-mask check from the server's own ids: the incident's answer is 6 tokens to learn
    # from.
    loss = checks["loss_mask"]
    assert loss["status"] == "fail"
    assert loss["figure"] == pytest.approx(0.87, abs=0.06)
    assert {e["reason"] for e in loss["examples"]} == {"6 loss tokens"}
    rows = len(_sample_ids())
    assert f"from stored token ids: {rows}, from the chat template: 0" in loss["detail"]
    assert checks["template_parity"]["status"] == "pass"  # served and staged templates agree
    assert sorted(_ids(str(out))) == sorted(_sample_ids()), "the data must stay"
    # An expected outcome, not a crash: no traceback anywhere in the run's logs.
    flow_run_id = _flow_run(state).id
    logs = _log_text(flow_run_id)
    assert "final gate: empty_answer" in logs and "Traceback" not in logs
    # This dataset's reports have keys of their own: the good dataset's are left as they were.
    mine, good = _artifacts(flow_run_id), _artifacts(_flow_run(good_run.state).id)
    assert set(mine) and not set(mine) & set(good), (set(mine), set(good))
    assert all(key.endswith(dataset_slug(str(out))) for key in mine)
    assert (mine[f"audit-report-{dataset_slug(str(out))}"].description or "").startswith(
        f"audit FAIL empty/trivial answers {100 * checks['empty_answer']['figure']:.3g} %"
    )


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
    # 2 of 10 rows rejected on purpose: over the default 1 % the gate would stop the run.
    loose = {"rejects": {"warn": 0, "fail": 0.5}}
    config = _config(tmp_path, str(out), prompts=str(prompts), shard_size=3, audit=loose)
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
    data = read_committed(LocalStorage(out)).collect()
    assert data["error"].null_count() == data.height
    # Each row went out as its own format reads: the prompt row's system key leads its chat.
    sent = {
        row_id: [(m["role"], m["content"]) for m in messages]
        for row_id, messages in data.select("id", "messages").iter_rows()
    }
    assert sent["p1"] == [("system", "Answer in one word."), ("user", "Name a colour.")]
    assert sent["s1"] == [("user", "Name a river.")]
    assert sent["c1"] == [("user", "Name a sea.")]
