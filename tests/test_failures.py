"""How a failed or stopped run reads (issue 38): the state message leads with its short reason,
then one line per failing check with each example id said once; a failed gate or provisioning
check is a Failed state with that message, not a traceback; and a shard the run did not commit
ends Cancelled with its reason, not green.

The message tests build their figures by hand; the flow tests run `regenerate_completions` on
emulators in the Prefect harness and read back the task runs' states and the run's logs
(tests/test_deployment.py reads the same of a deployment's run).
"""

from __future__ import annotations

import json
import logging
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import yaml
from prefect.exceptions import FailedRun

from flows.failures import quiet_failures
from regen.audit.result import AuditResult, Check, Example
from regen.audit.rolling import Finding
from regen.canary import StopRecord
from regen.config import RegenConfig
from regen.errors import UserError
from regen.preflight.report import CheckRow, PreflightReport
from regen.rehearsal import rehearsal_config
from tasks.setup import provisioning_failed

# What Prefect 3.9.1's UI shows of a state message before `See More` (PTextTruncate).
UI_CHARS = 70


def _examples(*ids: str) -> list[Example]:
    return [Example(id=i, reason="filler") for i in ids]


def _canary_stop() -> StopRecord:
    """The incident's canary stop: the same rows fail four checks, so each names them."""
    rows = _examples("p00000", "p00024", "p00047", "p00071")
    checks = [
        ("empty_answer", 0.902, 0.05),
        ("answer_collapse", 0.902, 0.2),
        ("tiny_length", 0.902, 0.1),
        ("loss_mask", 0.902, 0.05),
    ]
    return StopRecord(
        fingerprint="f" * 64,
        stage="canary",
        rows_audited=256,
        prompts_sent=384,
        prompts_planned=6000,
        checks=[
            Finding(check=name, title=name, figure=figure, fail=fail, rows=256, examples=rows)
            for name, figure, fail in checks
        ],
    )


def test_a_stop_says_each_check_on_a_line_and_each_example_id_once() -> None:
    record = _canary_stop()
    assert record.headline() == (
        "canary gate stopped the run after 256 rows: empty_answer 90.2 % (+3 more)"
    )
    assert record.check_lines() == [
        "empty_answer 90.2 % (fail at 5.00 %), e.g. ids p00000, p00024, p00047",
        "answer_collapse 90.2 % (fail at 20.0 %)",
        "tiny_length 90.2 % (fail at 10.0 %)",
        "loss_mask 90.2 % (fail at 5.00 %)",
    ]
    # The one-line form (audit.md, progress, the live card) names the ids once too.
    line = record.gate_line()
    assert line.count("e.g.") == 1 and line.count("p00000") == 1, line


def test_a_stopped_runs_state_message_leads_with_its_short_reason() -> None:
    record = _canary_stop()
    result = AuditResult(
        dataset="/data/out",
        rows=256,
        planned=6000,
        verdict="fail",
        checks=[],
        stopped=record.gate_line(),
        gate="canary",
        uncommitted=256,
        stop_headline=record.headline(),
        stop_checks=record.check_lines(),
    )
    lines = result.failure_message().splitlines()
    assert lines[0] == f"FAIL: {record.headline()}"
    # What the UI shows before `See More` is the reason, with its first figure.
    assert "empty_answer 90.2 %" in lines[0][: UI_CHARS + 5]
    assert lines[1:5] == [f"- {line}" for line in record.check_lines()]
    assert lines[5] == (
        "The data was kept: 0 committed rows at /data/out, 256 canary rows under "
        "/data/out/canary/; report at /data/out/report/audit.md"
    )
    assert "\n".join(lines).count("p00024") == 1


def test_the_final_gates_message_has_a_line_per_failing_check() -> None:
    def check(name: str, figure: float, fail: float, ids: list[str]) -> Check:
        return Check(
            name=name, title=name, status="fail", figure=figure, warn=0.0, fail=fail,
            examples=_examples(*ids),
        )  # fmt: skip

    result = AuditResult(
        dataset="s3://bucket/out/",
        rows=6000,
        planned=6000,
        verdict="fail",
        checks=[
            check("error_rows", 0.06, 0.05, ["e1", "e2"]),
            check("empty_answer", 0.5, 0.05, ["a1", "a2", "a3", "a4"]),
            check("answer_collapse", 0.5, 0.2, ["a1", "a2", "a5"]),
        ],
    )
    assert result.failure_message().splitlines() == [
        "FAIL: final gate: error_rows 6.00 % (+2 more)",
        "- error_rows 6.00 % (fail at 5.00 %), e.g. ids e1, e2",
        "- empty_answer 50.0 % (fail at 5.00 %), e.g. ids a1, a2, a3",
        "- answer_collapse 50.0 % (fail at 20.0 %), e.g. ids a5",
        "The data was kept: 6,000 committed rows at s3://bucket/out; "
        "report at s3://bucket/out/report/audit.md",
    ]


def test_a_provisioning_failure_names_each_failed_check() -> None:
    ports = CheckRow(name="ports", status="fail", figure="in use: [31000]", hint="free them")
    ram = CheckRow(name="ram", status="fail", figure="1.0 GB available; 8 needed")
    ok = CheckRow(name="config", status="pass", figure="shard_size 500")
    assert provisioning_failed(PreflightReport(rows=[ok, ports])) == (
        "provisioning failed: ports: in use: [31000] (free them)"
    )
    assert provisioning_failed(PreflightReport(rows=[ports, ok, ram])).splitlines() == [
        "provisioning failed: ports: in use: [31000] (free them) (+1 more)",
        "- ports: in use: [31000] (free them)",
        "- ram: 1.0 GB available; 8 needed",
    ]


def _record(message: str, exc: BaseException | None, *, logger: str) -> logging.LogRecord:
    info = (type(exc), exc, None) if exc is not None else (None, None, None)
    return logging.getLogger(logger).makeRecord(
        logger, logging.ERROR, __file__, 1, message, (), info
    )


def test_prefects_tracebacks_of_a_returned_failure_are_left_out() -> None:
    """`quiet_failures` drops the engine's FailedRun traceback of a flow that returned Failed
    (what a deployment logged last) and the empty exc_info of a task that returned one; a
    UserError keeps its line without Prefect's frames; any other error keeps its traceback."""
    quiet_failures()
    quiet_failures()  # once only, however many flows start in the process
    flows = logging.getLogger("prefect.flow_runs")
    assert sum(type(f).__name__ == "_QuietFailures" for f in flows.filters) == 1

    engine = "Engine execution exited with unexpected exception"
    assert not flows.filter(_record(engine, FailedRun("FAIL: x"), logger="prefect.flow_runs"))
    returned = "Task run failed with state: Failed(message='FAIL: x', type=FAILED, result=None)"
    tasks = logging.getLogger("prefect.task_runs")
    assert not tasks.filter(_record(returned, None, logger="prefect.task_runs"))

    mistake = _record("Encountered exception", UserError("bad"), logger="prefect.flow_runs")
    assert flows.filter(mistake) and mistake.exc_info is None
    bug = _record("Encountered exception", KeyError("x"), logger="prefect.flow_runs")
    assert flows.filter(bug) and bug.exc_info is not None and bug.exc_info[1] is not None


def test_a_flow_ends_with_a_tasks_returned_failure_and_raises_what_it_raised() -> None:
    from prefect.exceptions import CrashedRun
    from prefect.states import Completed, Crashed, Failed

    from flows.failures import failed_with

    assert failed_with(Completed(data=1)) is None
    ended = failed_with(Failed(message="provisioning failed: ports: in use: [31000]"))
    assert ended is not None and ended.is_failed()
    assert ended.message == "provisioning failed: ports: in use: [31000]"
    with pytest.raises(KeyError):
        failed_with(Failed(data=KeyError("x"), message="Task run encountered an exception"))
    with pytest.raises(CrashedRun):
        failed_with(Crashed(message="Execution was aborted by an interrupt signal."))


# The flow, in the Prefect harness.


def _config(tmp_path: Path, prompts: int, **extra: Any) -> RegenConfig:
    bench = {"concurrency": 1, "max_tokens": 16, "budget_s": 0.5}
    engine = {"bench": bench, "emulator": extra.pop("emulator", {})}
    data = {"work_dir": str(tmp_path / "work"), "shard_size": 100, "engine": engine, **extra}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(data))
    with (tmp_path / "prompts.jsonl").open("w") as fh:
        for i in range(prompts):
            message = {"role": "user", "content": f"Question {i}: name a prime above {i}."}
            fh.write(json.dumps({"id": f"q-{i:05d}", "messages": [message]}) + "\n")
    return rehearsal_config(
        config_path=tmp_path / "config.yaml",
        prompts=str(tmp_path / "prompts.jsonl"),
        out=str(tmp_path / "out"),
        servers=4,
    )


def _task_runs(flow_run_id: UUID) -> dict[str, Any]:
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
        )
    return {r.name: r for r in runs}


def _logs(flow_run_id: UUID) -> list[str]:
    from prefect import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=5)
    with get_client(sync_client=True) as client:
        logs = client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]))
        )
    return [log.message for log in logs]


@pytest.mark.timeout(300)
def test_a_canary_stop_ends_failed_in_a_line_a_check_and_its_shards_cancelled(
    tmp_path: Path, prefect_harness: None
) -> None:
    from flows.regenerate import regenerate_completions

    config = _config(tmp_path, 1000, emulator={"faults": ["empty-answer=0.9"]})
    state = regenerate_completions(config, return_state=True)

    assert state.is_failed() and not state.is_crashed(), state
    lines = (state.message or "").splitlines()
    assert lines[0].startswith("FAIL: canary gate stopped the run after 256 rows: empty_answer ")
    assert lines[0].endswith(" more)") and len(lines[0]) < UI_CHARS + 15, lines[0]
    checks = [line for line in lines if line.startswith("- ")]
    assert checks[0].startswith("- empty_answer ") and "(fail at 5.00 %), e.g. ids q-" in checks[0]
    assert len(checks) == len(lines) - 2 >= 2, lines
    assert (state.message or "").count("e.g.") == 1, state.message
    assert lines[-1].startswith("The data was kept: 0 committed rows at ")

    assert state.state_details.flow_run_id is not None
    runs = _task_runs(state.state_details.flow_run_id)
    shards = {name: r.state for name, r in runs.items() if name.startswith("generate-shard-")}
    assert shards, runs.keys()
    for name, shard in shards.items():
        # Nothing committed: not one shard box is green.
        assert shard.type.value == "CANCELLED", (name, shard)
        assert (shard.message or "").startswith(
            f"shard {name[-6:]} not committed: the live gate stopped the run at the canary"
        ), shard.message
    audit = next(r.state for name, r in runs.items() if name.startswith("audit"))
    assert audit.type.value == "FAILED" and audit.message == state.message
    for name, run in runs.items():
        if not name.startswith(("generate-shard-", "audit")):
            assert run.state.is_completed(), (name, run.state)
    said = "\n".join(_logs(state.state_details.flow_run_id))
    assert "Traceback" not in said and "NoneType: None" not in said, said[-3000:]


@pytest.fixture
def held_port(tmp_path: Path) -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.mark.timeout(180)
def test_a_provisioning_failure_ends_failed_with_its_reason_not_a_traceback(
    tmp_path: Path, prefect_harness: None, held_port: int
) -> None:
    from flows.regenerate import regenerate_completions

    config = _config(tmp_path, 20)
    config = config.model_copy(
        update={"engine": config.engine.model_copy(update={"base_port": held_port})}
    )
    state = regenerate_completions(config, return_state=True)

    assert state.is_failed() and not state.is_crashed(), state
    message = state.message or ""
    assert message.startswith("provisioning failed: "), message
    # Its own port among those in use: another test's server on 2 cores can hold one of the
    # fleet's other ports at that moment (CI saw [40095, 40098]), which the check names too.
    in_use = re.search(r"ports: in use: \[([\d, ]+)\] \(stop what listens there", message)
    assert in_use and held_port in {int(p) for p in in_use[1].split(", ")}, message
    assert state.state_details.flow_run_id is not None
    runs = _task_runs(state.state_details.flow_run_id)
    provision = next(r.state for name, r in runs.items() if name.startswith("provision"))
    assert provision.type.value == "FAILED" and provision.message == message
    assert not any(name.startswith("launch-fleet") for name in runs), "nothing was launched"
    said = _logs(state.state_details.flow_run_id)
    text = "\n".join(said)
    assert "Traceback" not in text and "NoneType: None" not in text, text[-3000:]
    assert "ProvisioningFailed" not in text
    assert said[-1] == f"Finished in state Failed({message!r})", said[-3:]
