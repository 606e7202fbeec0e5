"""One HTTP answer to a chat request, read once: a completion to store, or why it is not one.

The dispatcher acts on `kind` alone: OK is stored, REJECTED is an error row at once,
UNAUTHORIZED stops the run, RETRY costs an attempt and is tried again, preferably elsewhere.
An answer the server cut short (regen.sglang_api.abort) is a RETRY, whatever its status.
"""

from __future__ import annotations

from dataclasses import dataclass

from regen.sglang_api.abort import cut_reason, is_abort_refusal
from regen.sglang_api.response import (
    Completion,
    ResponseKind,
    error_message,
    parse_completion,
    response_kind,
)


@dataclass(frozen=True, slots=True)
class Answer:
    """What the server answered, as the dispatcher acts on it."""

    kind: ResponseKind
    completion: Completion | None = None
    """Set for OK only."""
    reason: str = ""
    """Why it is not OK, in the words stored in an error row: the server's message."""
    cut: bool = False
    """The server cut it short (regen.sglang_api.abort): a RETRY the server is counted for."""


def read_answer(status: int, raw: bytes) -> Answer:
    """The body is parsed here once: a completion carries thousands of token ids."""
    kind = response_kind(status)
    if kind is ResponseKind.OK:
        try:
            completion = parse_completion(raw)
        except ValueError as err:
            return Answer(ResponseKind.RETRY, reason=str(err))
        cut = cut_reason(completion)
        if cut is not None:
            return Answer(ResponseKind.RETRY, reason=cut, cut=True)
        return Answer(ResponseKind.OK, completion)
    if kind is ResponseKind.REJECTED and is_abort_refusal(status, raw):
        return Answer(ResponseKind.RETRY, reason=error_message(status, raw), cut=True)
    return Answer(kind, reason=error_message(status, raw))
