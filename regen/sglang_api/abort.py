"""The answers SGLang 0.5.23 gives a chat request it cut short, and how regen tells them apart.

A request is cut by `/abort_request` (regen's own hedging, an operator), by `abort_all` (a
paused or updated engine), by a session's end, or by the scheduler itself (a timeout, memory
pressure, a full queue, an internal error). On the non-streaming chat route the cut takes one
of three shapes (tokenizer_manager.py `_handle_abort_finish_reason`, `_handle_abort_req`;
serving_chat.py `_build_chat_response`; serving_base.py `handle_request`):

- HTTP 200, `choices[0].finish_reason` "abort", `matched_stop` null: an abort that carries no
  status code (FINISH_ABORT()'s default, "Aborted"; a request still waiting in the queue,
  "Abort in waiting queue"). The body looks like a completion: what was decoded before the
  cut (possibly nothing) as content, its tokens in `usage`. The message is not in the body
  unless `return_meta_info` was asked (`choices[0].meta_info.finish_reason.message`).
- HTTP 400 `{"object": "error", "message": "Aborted by AbortReq.", ...}`: an abort of a request
  still in the grammar queue (`set_finish_with_abort`'s default status is 400).
- HTTP 5xx with the scheduler's message (its `type` the status code): "Request waiting
  timeout reached." or "Request running timeout reached." (503), "The request queue is
  full." (503), "Retracted under decode memory pressure without a KV backup. Retry later."
  (503), "Out of memory even after retracting all other requests ..." (500), a grammar or
  sampling failure (500), "External KV cache load failed" (503). These are 5xx like any
  other, retried as such.

The first two are an answer the server did not finish, never a row: retried within the row's
attempts like a transport error, and an error row with the reason when none is left.
"""

from __future__ import annotations

import orjson

from regen.sglang_api.response import Completion

ABORT = "abort"
"""`finish_reason` of an answer the server cut short."""
QUEUED_ABORT = "Aborted by AbortReq."
"""The message of a 400 that is an abort, not a refusal: a request aborted in the grammar queue
(constrained/grammar_manager.py `abort_requests`)."""


def cut_reason(completion: Completion) -> str | None:
    """Why a 200 answer is not a completion, or None when it is one."""
    if completion.finish_reason != ABORT:
        return None
    tokens = completion.completion_tokens
    after = f" after {tokens} tokens" if tokens is not None else ""
    return f"the server aborted the answer{after} (finish_reason abort)"


def is_abort_refusal(status: int, raw: bytes) -> bool:
    """Whether an error answer is SGLang's abort of a queued request rather than a refusal of
    the request itself: retried, where a refusal gives the same answer again."""
    if status != 400:
        return False
    try:
        data = orjson.loads(raw)
    except ValueError:
        return False
    return isinstance(data, dict) and data.get("message") == QUEUED_ABORT
