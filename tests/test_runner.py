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
