"""The one line `regen rehearse`/`run` prints when a run ends badly, from real Prefect states."""

from __future__ import annotations

from prefect.client.schemas.objects import State
from prefect.states import Cancelled, Crashed, Failed

from flows.runner import failure_reason
from regen.errors import UserError

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
