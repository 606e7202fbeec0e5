"""The one line `regen rehearse`/`run` prints when a run ends badly, from real Prefect states."""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING, cast

import pytest
from prefect.client.schemas.objects import State
from prefect.states import Cancelled, Crashed, Failed

from flows.runner import failure_reason
from regen.errors import UserError

if TYPE_CHECKING:
    from regen.config import RegenConfig

RAISED = "Flow run encountered an exception: "


def test_a_raised_user_error_is_told_in_its_own_words_on_one_line() -> None:
    err = UserError("provisioning failed: prompts: nope.jsonl does not exist\nsecond line")
    state: State[None] = Failed(data=err, message=f"{RAISED}ProvisioningFailed: {err}")
    assert failure_reason(state) == "provisioning failed: prompts: nope.jsonl does not exist"


def test_any_other_raised_error_is_its_message_or_its_type() -> None:
    assert failure_reason(Failed(data=KeyError("x"), message=f"{RAISED}KeyError: 'x'")) == "'x'"
    assert failure_reason(Failed(data=RuntimeError(), message=f"{RAISED}RuntimeError: ")) == (
        "RuntimeError"
    )


def test_a_failed_gate_and_a_crash_keep_the_state_message() -> None:
    gate: State[None] = Failed(message="FAIL: audit failed on empty_answer 12 %\nmore")
    assert failure_reason(gate) == "FAIL: audit failed on empty_answer 12 %"
    aborted = "Execution was aborted by an interrupt signal."
    assert failure_reason(Crashed(message=aborted, data=KeyboardInterrupt())) == aborted
    assert failure_reason(Cancelled(message="cancelled by the user")) == "cancelled by the user"


def test_a_failed_gate_is_told_on_its_first_line_then_a_line_per_check(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The terminal shows the state's message whole: `regen: run failed: <short reason>`, then
    one indented line per failing check; what a run raised stays one line."""
    from flows.runner import _outcome, failure_lines

    message = (
        "FAIL: canary gate stopped the run after 256 rows: empty_answer 88.3 % (+1 more)\n"
        "- empty_answer 88.3 % (fail at 5.00 %), e.g. ids q-1, q-2, q-3\n"
        "- loss_mask 88.3 % (fail at 5.00 %)\n"
        "The data was kept: 0 committed rows at /out; report at /out/report/audit.md"
    )
    assert failure_lines(Failed(message=message)) == message.splitlines()
    err = UserError("provisioning failed: a\nsecond line")
    assert failure_lines(Failed(data=err, message=f"{RAISED}{err}")) == ["provisioning failed: a"]

    config = cast("RegenConfig", SimpleNamespace(output="/out"))
    assert _outcome(Failed(message=message), config) == 1
    said = capsys.readouterr().err.splitlines()
    assert said[0] == f"regen: run failed: {message.splitlines()[0]}"
    assert said[1:4] == [f"  {line}" for line in message.splitlines()[1:]]
    assert said[4] == "dataset: /out (committed shards are kept)"


def test_a_stopped_generation_is_one_line_with_the_command_that_resumes(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fleet gone, a key refused, a full disk: the cause, what is kept, and the command the
    user typed to run it again; no `dataset:` line after it (the line said it)."""
    from flows.runner import _outcome
    from regen.generation.stopped import GenerationStopped

    stop = GenerationStopped(
        "server-0 exited at 03:27:27 (SIGKILL); no server can come back",
        output="/out", committed=2, shards=60, rows=100,
    )  # fmt: skip
    assert stop.line() == (
        "server-0 exited at 03:27:27 (SIGKILL); no server can come back; 2 of 60 shards "
        "committed (100 rows) in /out, kept; run it again to resume"
    )
    monkeypatch.setattr("sys.argv", ["regen", "rehearse", "--out", "/my out"])
    config = cast("RegenConfig", SimpleNamespace(output="/out"))
    assert _outcome(Failed(message=stop.message(), data=stop), config) == 1
    said = capsys.readouterr().err.splitlines()
    assert said == [
        "regen: run failed: server-0 exited at 03:27:27 (SIGKILL); no server can come back; "
        "2 of 60 shards committed (100 rows) in /out, kept; run `regen rehearse --out '/my out'` "
        "again to resume"
    ]
    refused = GenerationStopped(
        "server-0 answered 401 on /v1/models: the API key is wrong (the key is engine.api_key "
        "in the run's config)", output="/out", committed=0, shards=3, rows=0, fix="fix the key",
    )  # fmt: skip
    assert refused.line("regen run -c n.yaml").endswith(
        "; 0 of 3 shards committed in /out; fix the key, then run `regen run -c n.yaml` again "
        "to resume"
    )
    lost = GenerationStopped(
        "/out: shard 000001 not committed: output lease lost to pid 5120 on gpu-3; this run "
        "stops here, what it committed stays", output="/out", committed=1, shards=6, rows=20,
        resumes=False,
    )  # fmt: skip
    assert lost.line("regen run").endswith("stays; 1 of 6 shards committed (20 rows) in /out")
    node = GenerationStopped(
        "gone", output="s3://b/run", committed=7, shards=40, rows=35, node="n2"
    )
    assert node.line() == (
        "gone; node n2 stopped and left its unfinished shards to the other nodes; 7 of 40 "
        "shards committed (35 rows) in s3://b/run"
    )


def test_a_refused_key_is_named_by_where_it_came_from_never_by_its_value() -> None:
    from pydantic import SecretStr

    from regen.config import parse_config
    from regen.run import OpenedRun

    base = {"model": {"source": "/m", "served_name": "m"}, "prompts": "/p.jsonl", "output": "/o"}
    launched = parse_config(base)
    assert OpenedRun(launched).key_source == (
        "the key regen generated for its servers, as engine.api_key is not set"
    )
    external = parse_config({**base, "engine": {"kind": "external", "urls": ["http://h:1"]}})
    assert "the key regen generated sent to engine.urls" in OpenedRun(external).key_source
    keyed = launched.model_copy(
        update={"engine": launched.engine.model_copy(update={"api_key": SecretStr("s3cr3t")})}
    )
    assert OpenedRun(keyed).key_source == "engine.api_key in the run's config"
    secret = "the Secret block 'regen-key' that api_key_secret names"
    assert OpenedRun(keyed, key_from=secret).key_source == secret
    assert "s3cr3t" not in OpenedRun(keyed).key_source
