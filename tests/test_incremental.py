"""Scheduled reruns over a prompt set that changes (issue 24), through the real flow on
emulators: only new and edited prompts reach the servers, committed rows stay as they are,
an edited prompt's old row is superseded, a removed one is reported and kept or dropped.

Requests are counted from the emulators' own logs (`Served N requests` at shutdown); the
launch's own requests (probes, a one-request bench per server) are the first run's count less
its prompts, the same at every launch.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import yaml

from regen.config import RegenConfig
from regen.dataset import RUN_KEY, read_committed, read_plan
from regen.export.exporter import EXPORT_KEY
from regen.rehearsal import rehearsal_config
from regen.storage import LocalStorage
from support.s3 import MotoS3

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("prefect_harness")]

_SERVED = re.compile(r"Shutting down\. Served (\d+) requests\.")
# One bench request per server: the launch's own requests are the same at every launch.
_BENCH = {"concurrency": 1, "max_tokens": 16, "budget_s": 5.0}


def _write_prompts(path: Path, prompts: dict[str, str]) -> Path:
    lines = [
        json.dumps({"id": i, "messages": [{"role": "user", "content": text}]})
        for i, text in prompts.items()
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def _questions(start: int, stop: int) -> dict[str, str]:
    return {f"q-{i:05d}": f"Question {i}: name a prime above {i}." for i in range(start, stop)}


def _config(tmp_path: Path, **extra: Any) -> RegenConfig:
    data = {
        "work_dir": str(tmp_path / "work"),
        "shard_size": 100,
        "engine": {"bench": _BENCH},
        # These tests count requests a row: a hedged copy of a straggler is a second one.
        "generation": {"hedge": "off"},
        **extra,
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return rehearsal_config(
        config_path=path,
        prompts=str(tmp_path / "prompts.jsonl"),
        out=str(tmp_path / "out"),
        servers=2,
    )


def _served(config: RegenConfig) -> int:
    """Requests the last launch's emulators answered, from their logs."""
    last = max(config.work_dir.glob("runs/*"), key=lambda run: run.stat().st_mtime)
    logs = sorted(last.glob("logs/server-*.log"))
    counts = [_SERVED.findall(p.read_text()) for p in logs]
    assert logs and all(counts), "every server logs its count when it shuts down"
    return sum(int(c[-1]) for c in counts)


def _log_stamps(config: RegenConfig) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in (config.work_dir / "logs").glob("server-*")}


def _run(config: RegenConfig) -> Any:
    from flows.regenerate import regenerate_completions

    state = regenerate_completions(config, return_state=True)
    assert state.is_completed(), state.message
    return state


def _task_names(state: Any) -> list[str]:
    """The run's task runs by name, without their numbering suffix."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(
                id=FlowRunFilterId(any_=[state.state_details.flow_run_id])
            )
        )
    return sorted(r.name.rsplit("-", 1)[0] for r in runs)


def _data_files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((out / "shards").iterdir())}


def test_appended_prompts_are_the_only_ones_generated(tmp_path: Path) -> None:
    _write_prompts(tmp_path / "prompts.jsonl", _questions(0, 300))
    config = _config(tmp_path)
    out = Path(config.output)
    _run(config)
    launch = _served(config) - 300  # probes and bench
    assert 0 <= launch < 20, launch
    before = read_committed(LocalStorage(out)).collect()
    files = _data_files(out)

    _write_prompts(tmp_path / "prompts.jsonl", _questions(0, 400))
    _run(config)

    assert _served(config) - launch == 100, "only the appended prompts reach the servers"
    rows = read_committed(LocalStorage(out)).collect()
    assert rows.height == 400 and rows["id"].n_unique() == 400
    assert rows.head(300).equals(before), "the first 300 rows are untouched"
    after = _data_files(out)
    assert {k: after[k] for k in files} == files, "their shard files are byte-identical"
    assert sorted(rows.filter(pl.col("shard") == 3)["id"]) == sorted(_questions(300, 400))
    run = json.loads((out / RUN_KEY).read_text())
    revisions = [(r["revision"], r["new"], r["changed"], r["removed"]) for r in run["revisions"]]
    assert revisions == [(1, 300, 0, 0), (2, 100, 0, 0)]
    assert (run["num_rows"], run["num_shards"]) == (400, 4)

    # Nothing new: nothing generated, no model staged, no fleet launched, no revision recorded.
    stamps = _log_stamps(config)
    tasks = _task_names(_run(config))
    assert _log_stamps(config) == stamps, "a rerun with nothing new launches no fleet"
    assert "provision" in tasks and "plan-shards" in tasks, tasks
    assert not {"stage-model", "launch-fleet"} & set(tasks), tasks
    assert len(json.loads((out / RUN_KEY).read_text())["revisions"]) == 2

    # What makes rows comparable still has to match: refused, naming the setting.
    from flows.regenerate import regenerate_completions

    hotter = _config(tmp_path, sampling={"temperature": 1.0})
    state = regenerate_completions(hotter, return_state=True)
    assert state.is_failed()
    assert "sampling.temperature=0.6, this run has 1.0" in (state.message or ""), state.message


def test_edited_prompts_are_regenerated_and_removed_ones_reported(tmp_path: Path) -> None:
    prompts = _questions(0, 300)
    _write_prompts(tmp_path / "prompts.jsonl", prompts)
    exports = {"dest": str(tmp_path / "exports"), "formats": ["specforge"]}
    config = _config(tmp_path, export=exports)
    out = Path(config.output)
    _run(config)
    launch = _served(config) - 300
    before = read_committed(LocalStorage(out)).collect()

    edited = [f"q-{i:05d}" for i in range(5, 300, 30)]  # 10 ids over all three shards
    removed = [f"q-{i:05d}" for i in range(7, 300, 60)]  # 5 ids
    changed = {i: (f"{t} Answer in French." if i in edited else t) for i, t in prompts.items()}
    _write_prompts(tmp_path / "prompts.jsonl", {i: changed[i] for i in changed if i not in removed})
    state = _run(config)

    assert _served(config) - launch == 10, "only the edited prompts reach the servers"
    rows = read_committed(LocalStorage(out)).collect()
    assert rows.height == 300 and rows["id"].n_unique() == 300, "removed rows kept, once each"
    asked = rows.select("id", pl.col("messages").list.first().struct.field("content"))
    now = dict(asked.iter_rows())
    assert all(now[i].endswith("Answer in French.") for i in edited), "the new rows answer edits"
    untouched = [i for i in prompts if i not in edited]
    assert rows.filter(pl.col("id").is_in(untouched)).equals(
        before.filter(pl.col("id").is_in(untouched))
    ), "every other row is untouched"
    run = json.loads((out / RUN_KEY).read_text())
    last = run["revisions"][-1]
    assert (last["revision"], last["new"], last["changed"], last["removed"]) == (2, 0, 10, 5)
    plan = read_plan(LocalStorage(out), full=True)
    assert plan is not None
    assert sorted(plan.filter("removed")["id"]) == removed
    assert "0 new, 10 changed, 5 removed" in _plan_message(state)
    audit = json.loads((out / "report" / "audit.json").read_text())
    assert (audit["rows"], audit["planned"], audit["verdict"]) == (300, 300, "pass")
    assert _exported(tmp_path) == 300

    # The same input with `input.removed: drop`: nothing sent, the five leave the view.
    stamps = _log_stamps(config)
    _run(_config(tmp_path, input={"removed": "drop"}, export=exports))
    assert _log_stamps(config) == stamps
    view = read_committed(LocalStorage(out)).collect()
    assert view.height == 295 and not set(view["id"]) & set(removed)
    assert set(view["id"]) == set(prompts) - set(removed)
    audit = json.loads((out / "report" / "audit.json").read_text())
    assert (audit["rows"], audit["planned"]) == (295, 295), "the audit covers the view"
    assert audit["verdict"] in ("pass", "warn")
    assert (out / "shards" / "shard-000000.g2.parquet").exists(), "the edits swapped in"
    assert _exported(tmp_path) == 295, "the export follows the view"


def test_a_grown_one_shard_set_generates_its_new_and_edited_rows(tmp_path: Path) -> None:
    # The size people try first: one shard of the default 500. Its highest shard is 0, which
    # a `max() or -1` once read as "no shard", planning the new ids into committed shard 0.
    prompts = _questions(0, 500)
    _write_prompts(tmp_path / "prompts.jsonl", prompts)
    config = _config(tmp_path, shard_size=500)
    out = Path(config.output)
    _run(config)
    launch = _served(config) - 500

    edited = [f"q-{i:05d}" for i in range(0, 500, 100)]
    grown = {i: (f"{t} Answer briefly." if i in edited else t) for i, t in prompts.items()}
    _write_prompts(tmp_path / "prompts.jsonl", grown | _questions(500, 550))
    state = _run(config)

    assert _served(config) - launch == 55, "the 50 new and 5 edited prompts, each once"
    assert "50 new, 5 changed, 0 removed; 550 prompts (0 rejected) in 2 shards" in _plan_message(
        state
    )
    rows = read_committed(LocalStorage(out)).collect()
    assert rows.height == 550 and rows["id"].n_unique() == 550
    assert set(rows["id"]) == set(_questions(0, 550))
    assert rows.filter(pl.col("shard") == 1)["id"].sort().to_list() == sorted(_questions(500, 550))
    audit = json.loads((out / "report" / "audit.json").read_text())
    assert (audit["rows"], audit["planned"], audit["verdict"]) == (550, 550, "pass")

    # Resumed with nothing new: the headline counts both shards, nothing is sent.
    stamps = _log_stamps(config)
    state = _run(config)
    assert _log_stamps(config) == stamps
    assert "550 prompts (0 rejected) in 2 shards of 500; 2 committed, 0 to generate" in (
        _plan_message(state)
    )


def test_top_ups_smaller_than_the_canary_complete_and_pass(tmp_path: Path) -> None:
    # A weekly rerun with a handful of new rows: the canary would be all of them, judged on
    # 1 to 4 rows (1 most common answer of 4 was once 25 %, over answer_collapse's 20 %).
    _write_prompts(tmp_path / "prompts.jsonl", _questions(0, 200))
    config = _config(tmp_path)
    out = Path(config.output)
    _run(config)
    launch = _served(config) - 200
    total = 200
    for top_up in (1, 3, 4):
        _write_prompts(tmp_path / "prompts.jsonl", _questions(0, total + top_up))
        state = _run(config)
        assert _served(config) - launch == top_up, "the new rows, each once"
        total += top_up
        assert f"{top_up} new, 0 changed, 0 removed; {total} prompts" in _plan_message(state)
        assert not (out / "report" / "stopped.json").exists()
        audit = json.loads((out / "report" / "audit.json").read_text())
        assert (audit["rows"], audit["planned"], audit["verdict"]) == (total, total, "pass")
    rows = read_committed(LocalStorage(out)).collect()
    assert rows["id"].sort().to_list() == sorted(_questions(0, 208))


def _exported(tmp_path: Path) -> int:
    record = json.loads((tmp_path / "exports" / "specforge" / EXPORT_KEY).read_text())
    return int(record["counts"]["rows_exported"])


def _plan_message(state: Any) -> str:
    """The flow's log lines, where the plan's headline names the revision."""
    from prefect import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=5)
    flow_run_id = state.state_details.flow_run_id
    with get_client(sync_client=True) as client:
        logs = client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]))
        )
    return "\n".join(log.message for log in logs)


def test_a_file_dropped_into_an_s3_prefix_is_all_the_next_run_generates(
    tmp_path: Path, moto: MotoS3
) -> None:
    bucket = moto.create_bucket("regen-incr")
    client = moto.client()

    def upload(name: str, prompts: dict[str, str]) -> None:
        source = _write_prompts(tmp_path / name, prompts)
        client.upload_file(str(source), bucket, f"in/{name}")

    upload("week-01.jsonl", _questions(0, 150))
    upload("week-02.jsonl", _questions(150, 200))
    config = _config(tmp_path).model_copy(update={"prompts": f"s3://{bucket}/in/"})
    _run(config)
    launch = _served(config) - 200

    upload("week-03.jsonl", _questions(200, 260))
    _run(config)

    assert _served(config) - launch == 60, "only the new file's rows reach the servers"
    rows = read_committed(LocalStorage(Path(config.output))).collect()
    assert rows.height == 260 and set(rows["id"]) == set(_questions(0, 260))
    run = json.loads((Path(config.output) / RUN_KEY).read_text())
    assert [r["new"] for r in run["revisions"]] == [200, 60]
    assert run["input_path"] == f"s3://{bucket}/in/"
