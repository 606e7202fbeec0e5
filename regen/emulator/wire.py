"""SGLang 0.5.23's wire shapes: what a request must look like, and every answer body.

Pure functions of their inputs (no server state), so the exact bytes a client parses are
in one place, next to the words SGLang refuses a request with.
"""

from __future__ import annotations

import json
import time
from typing import Any

from aiohttp import web

from regen import tools as tool_format
from regen.emulator.model import Generation

VERSION = "0.5.23"
WEIGHT_VERSION = "default"  # --weight-version's default
# 0.5.23's error `type` strings: a request the pydantic model refuses (FastAPI's validation
# handler: HTTPStatus.BAD_REQUEST.phrase), a ValueError while serving it (context length,
# duplicate rid), and a check of the serving layer itself (empty messages).
INVALID = "Bad Request"
VALUE_ERROR = "BadRequest"
REFUSED = "BadRequestError"
EFFORT_TIERS = ("none", "minimal", "low", "medium", "high", "xhigh", "ultra", "max")
# The reasoning and the answer, as the reasoning parser split them (no parser: no reasoning).
Parsed = tuple[str | None, str]
# finish_reason of a request cut while running: FINISH_ABORT().to_json() (schedule_batch.py),
# what /abort_request, abort_all and the abort fault give; and of one cut while still queued
# (tokenizer_manager.py _handle_abort_req). Neither has a status code: the answer is a 200.
RUNNING_ABORT = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
QUEUED_ABORT = {"type": "abort", "message": "Abort in waiting queue"}


class RequestError(Exception):
    """A request SGLang would refuse; becomes an error body with `status`."""

    def __init__(self, message: str, status: int = 400, kind: str = REFUSED) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


def error_response(status: int, message: str, kind: str = REFUSED) -> web.Response:
    """The OpenAI-style error body SGLang's OpenAI endpoints answer with."""
    body = {"object": "error", "message": message, "type": kind, "param": None, "code": status}
    return web.json_response(body, status=status)


# -- requests ------------------------------------------------------------------------------


def json_object(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except ValueError as err:
        raise RequestError(f"JSON decode error: {err}", kind=INVALID) from None
    if not isinstance(body, dict):
        raise RequestError("The request body must be a JSON object.", kind=INVALID)
    return body


def messages_of(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The messages, refused as ChatCompletionRequest's validation refuses them."""
    if "messages" not in body:
        raise ValidationFailed([_error("missing", ("messages",), "Field required", _seen(body))])
    messages = body["messages"]
    if not isinstance(messages, list):
        msg = "Input should be a valid list"
        raise ValidationFailed([_error("list_type", ("messages",), msg, messages)])
    errors = [e for i, m in enumerate(messages) for e in _message_errors(i, m)]
    if errors:
        raise ValidationFailed(errors)
    if not messages:
        raise RequestError("Messages cannot be empty.")  # serving_chat's own check
    return messages


# -- validation errors, as sglang's http_server renders a RequestValidationError ------------

# A message is one of these two models (protocol.py); pydantic reports each member's error.
_MEMBERS = tuple(
    f"function-after[validate_thinking_parts_role(), {name}]"
    for name in ("ChatCompletionMessageGenericParam", "ChatCompletionMessageUserParam")
)
_GENERIC_ROLES = ("system", "assistant", "tool", "function", "developer", "latest_reminder", "root")
# FastAPI names the endpoint: the route's decorator line in 0.5.23's http_server.py.
_ENDPOINT = (
    '  File "sglang/srt/entrypoints/http_server.py", line 1870, in openai_v1_chat_completions\n'
    "    POST /v1/chat/completions"
)


class ValidationFailed(RequestError):
    """A body ChatCompletionRequest refuses: 400 "Bad Request" with FastAPI's own text."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        n = len(errors)
        lines = "".join(f"  {e}\n" for e in errors)
        # http_server's handler: str(exc) (FastAPI's), a space, then repr of exc.errors().
        text = f"{n} validation error{'s' if n != 1 else ''}:\n{lines}\n{_ENDPOINT}"
        super().__init__(f"{text} {errors}", kind=INVALID)


def _error(kind: str, loc: tuple[Any, ...], msg: str, value: Any, **ctx: Any) -> dict[str, Any]:
    """One error as pydantic's `errors()` lists it (FastAPI prefixes the loc with body)."""
    error = {"type": kind, "loc": ("body", *loc), "msg": msg, "input": value}
    if ctx:
        error["ctx"] = ctx
    return error


def _message_errors(i: int, message: Any) -> list[dict[str, Any]]:
    if not isinstance(message, dict):
        msg = "Input should be a valid dictionary or object to extract fields from"
        return [_error("model_attributes_type", ("messages", i, m), msg, message) for m in _MEMBERS]
    if "role" not in message:
        return [
            _error("missing", ("messages", i, m, "role"), "Field required", message)
            for m in _MEMBERS
        ]
    role = message["role"]
    if role == "user" or (isinstance(role, str) and role.lower() in _GENERIC_ROLES):
        return []
    if isinstance(role, str):
        allowed = ", ".join(repr(r) for r in _GENERIC_ROLES)
        why = ValueError(f"'role' must be one of {allowed} (case-insensitive).")
    else:
        why = ValueError("'role' must be a string")
    generic, user = (("messages", i, m, "role") for m in _MEMBERS)
    return [
        _error("value_error", generic, f"Value error, {why}", role, error=why),
        _error("literal_error", user, "Input should be 'user'", role, expected="'user'"),
    ]


def _seen(body: dict[str, Any]) -> dict[str, Any]:
    """The body as the model's before-validators leave it, which pydantic reports as the
    input: reasoning_effort mirrored into chat_template_kwargs, then tool_choice defaulted."""
    seen = dict(body)
    effort = seen.get("reasoning_effort")
    if effort is not None:
        kwargs = seen.get("chat_template_kwargs")
        kwargs = dict(kwargs) if isinstance(kwargs, dict) else {}
        kwargs.setdefault("thinking", effort != "none")
        kwargs.setdefault("enable_thinking", effort != "none")
        seen["chat_template_kwargs"] = kwargs
    if seen.get("tool_choice") is None:
        seen["tool_choice"] = "none" if seen.get("tools") is None else "auto"
    return seen


def template_tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The tools the chat template is given: serving_chat passes each request tool's
    `Tool.model_dump()` (regen.tools.template_tools) unless tool_choice is "none"."""
    tools = body.get("tools")
    if not isinstance(tools, list) or not tools or body.get("tool_choice") == "none":
        return None
    return tool_format.template_tools([t for t in tools if isinstance(t, dict)])


def check_effort(effort: Any) -> None:
    """0.5.23's ReasoningEffortType: a named tier, or a float in [0, 0.99]; never a bool."""
    if effort is None or effort in EFFORT_TIERS:
        return
    number = isinstance(effort, (int, float)) and not isinstance(effort, bool)
    if number and 0.0 <= effort <= 0.99:
        return
    raise RequestError(
        f"reasoning_effort: Input should be {', '.join(map(repr, EFFORT_TIERS))} "
        f"or a number in [0, 0.99], got {effort!r}",
        kind=INVALID,
    )


def sampling_seed(body: dict[str, Any]) -> int | None:
    """The request's `seed` as 0.5.23 takes it: an integer (the model's validation) within a
    signed 64-bit range (sampling_params.py's verify, a ValueError there)."""
    seed = body.get("seed")
    if seed is None:
        return None
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise RequestError(f"seed: Input should be a valid integer, got {seed!r}", kind=INVALID)
    if not -(2**63) <= seed <= 2**63 - 1:
        raise RequestError(
            f"sampling_seed must be in [-2**63, 2**63 - 1], got {seed}.", kind=VALUE_ERROR
        )
    return seed


def no_ids_when_streaming(body: dict[str, Any]) -> None:
    """serving_chat refuses token ids on a stream (a ValueError there: 400 "BadRequest")."""
    if body.get("return_prompt_token_ids"):
        raise RequestError(
            "return_prompt_token_ids is not supported with streaming. "
            "Please set stream=false when using return_prompt_token_ids=true.",
            kind=VALUE_ERROR,
        )
    if body.get("return_token_ids"):
        raise RequestError(
            "return_token_ids is not supported with streaming on /v1/chat/completions. "
            "Please set stream=false when using return_token_ids=true.",
            kind=VALUE_ERROR,
        )


def token_budget(prompt: int, max_tokens: Any, context_length: int) -> int:
    """SGLang's context checks (tokenizer_manager._validate_one_request), same words."""
    ctx = context_length
    if prompt >= ctx:
        raise RequestError(
            f"The input ({prompt} tokens) is longer than the model's context length "
            f"({ctx} tokens).",
            kind=VALUE_ERROR,
        )
    if max_tokens is None:
        return ctx - prompt
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0:
        raise RequestError(
            f"max_tokens must be a non-negative integer, got {max_tokens!r}", kind=INVALID
        )
    if prompt + max_tokens > ctx:
        raise RequestError(
            f"Requested token count exceeds the model's maximum context length of {ctx} "
            f"tokens. You requested a total of {prompt + max_tokens} tokens: {prompt} "
            f"tokens from the input messages and {max_tokens} tokens for the completion. "
            "Please reduce the number of tokens in the input messages or the completion "
            "to fit within the limit.",
            kind=VALUE_ERROR,
        )
    return max_tokens


# -- answers -------------------------------------------------------------------------------


def usage(prompt: int, out: Generation, cached: int | None = None) -> dict[str, Any]:
    """SGLang's UsageInfo: reasoning tokens also in OpenAI's place, only when there are some;
    `prompt_tokens_details` is `{"cached_tokens": N}` with --enable-cache-report (`cached` not
    None), null otherwise (usage_processor.py)."""
    reasoning = out.reasoning_tokens
    details = None if cached is None else {"cached_tokens": cached}
    return {
        "prompt_tokens_details": details,
        "prompt_tokens": prompt,
        "completion_tokens": out.completion_tokens,
        "total_tokens": prompt + out.completion_tokens,
        "reasoning_tokens": reasoning,
        "completion_tokens_details": {"reasoning_tokens": reasoning} if reasoning else None,
    }


def meta_info(
    rid: str,
    out: Generation,
    prompt: int,
    latency: float,
    eos_id: int,
    accept_length: float,
    cached: int = 0,
) -> dict[str, Any]:
    """tokenizer_manager's meta_info; `cached_tokens_details` only when some were cached,
    all from the GPU's cache here (output_streamer.get_cached_tokens_details)."""
    finish: dict[str, Any] = {"type": out.finish_reason}
    if out.finish_reason == "stop":
        finish["matched"] = eos_id
    elif out.finish_reason == "length":
        finish["length"] = out.completion_tokens
    elif out.finish_reason == "abort":
        finish = dict(RUNNING_ABORT)
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": finish,
        "prompt_tokens": prompt,
        "weight_version": WEIGHT_VERSION,
        "reasoning_tokens": out.reasoning_tokens,
        "completion_tokens": out.completion_tokens,
        "cached_tokens": cached,
        "weight_versions": weight_versions(out.completion_tokens),
        "spec_accept_length": accept_length,
        "e2e_latency": latency,
    }
    if cached:
        meta["cached_tokens_details"] = {"device": cached, "host": 0}
    return meta


def queued_meta_info(rid: str, latency: float) -> dict[str, Any]:
    """The meta_info of a request aborted before it ran: no prompt or cached tokens counted,
    so its usage says 0 prompt tokens (usage_processor.py reads them from here)."""
    return {
        "id": rid,
        "finish_reason": dict(QUEUED_ABORT),
        "weight_version": WEIGHT_VERSION,
        "e2e_latency": latency,
        "weight_versions": weight_versions(0),
        "completion_tokens": 0,
    }


def weight_versions(completion_tokens: int) -> list[dict[str, Any]]:
    """Which weights made which output tokens (utils/weight_versions.py): never updated
    here, so one span over the whole output."""
    return [{"version": WEIGHT_VERSION, "start": 0, "end": completion_tokens}]


def completion(
    rid: str,
    out: Generation,
    parsed: Parsed,
    prompt_ids: list[int],
    meta: dict[str, Any],
    model: str,
    eos_id: int,
    body: dict[str, Any],
    cache_report: bool = False,
    tool_calls: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A chat.completion; `meta` goes in only when the request asked for it; `tool_calls`
    those the tool-call parser found (regen.emulator.tool_calls)."""
    reasoning, content = parsed
    cached = meta.get("cached_tokens", 0) if cache_report else None
    message: dict[str, Any] = {
        "role": "assistant",
        "content": content,
        "reasoning_content": reasoning,
    }
    if tool_calls:  # 0.5.23 drops a null tool_calls from the message
        message["tool_calls"] = tool_calls
    choice: dict[str, Any] = {
        "index": 0,
        "message": message,
        "logprobs": None,
        "finish_reason": out.finish_reason,
        "matched_stop": eos_id if out.finish_reason == "stop" else None,
    }
    # serving_chat drops both keys when not asked for (return_token_ids implies the prompt).
    if body.get("return_token_ids") or body.get("return_prompt_token_ids"):
        choice["prompt_token_ids"] = prompt_ids
    if body.get("return_token_ids"):
        choice["response_token_ids"] = out.token_ids
    if body.get("return_meta_info"):
        choice["meta_info"] = meta
    return {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        # usage_processor.py: the counts meta_info has (a queued abort's has no prompt tokens).
        "usage": usage(meta.get("prompt_tokens", 0), out, cached),
        # build_endpoint_weight_version_metadata: the version and its spans.
        "metadata": {
            "weight_version": WEIGHT_VERSION,
            "weight_versions": weight_versions(out.completion_tokens),
        },
    }


def stream_events(
    rid: str,
    out: Generation,
    parsed: Parsed,
    prompt: int,
    model: str,
    eos_id: int,
    body: dict[str, Any],
    cached: int | None = None,
) -> list[bytes]:
    """SSE in OpenAI's chunk format: the whole output in a few chunks, then [DONE]."""
    base = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
    }
    reasoning, content = parsed
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    if reasoning:
        deltas.append({"reasoning_content": reasoning})
    if content:
        deltas.append({"content": content})
    events = []
    for i, delta in enumerate(deltas):
        finish = out.finish_reason if i == len(deltas) - 1 else None
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        if finish == "stop":
            choice["matched_stop"] = eos_id
        events.append(_sse({**base, "choices": [choice]}))
    options = body.get("stream_options") or {}
    if isinstance(options, dict) and options.get("include_usage"):
        events.append(_sse({**base, "choices": [], "usage": usage(prompt, out, cached)}))
    events.append(b"data: [DONE]\n\n")
    return events


def _sse(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n"
