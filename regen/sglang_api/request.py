"""One chat completion as SGLang 0.5.23 takes it: the JSON body, the headers, the request id."""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass
from typing import Any

from pydantic import SecretStr

from regen.config import RegenerationConfig, SamplingConfig


@dataclass(frozen=True)
class RowSetting:
    """What one row's requests are sampled with (its draw from the config's mixes,
    regen.client.setting); recorded on the row as the schema's `sampling` struct."""

    temperature: float
    top_p: float
    top_k: int
    min_p: float
    enable_thinking: bool

    def record(self) -> dict[str, float | int | bool]:
        return asdict(self)


def auth_headers(api_key: SecretStr) -> dict[str, str]:
    """What `--api-key` asks of every request but /health and /metrics."""
    return {"Authorization": f"Bearer {api_key.get_secret_value()}"}


def request_id(purpose: str) -> str:
    """A fresh rid for a request of regen's own (probe, bench): unique, and named in logs."""
    return f"regen-{purpose}-{uuid.uuid4().hex}"


def turn_request_id(sample_id: str, turn: int, attempt: int, *, hedge: bool = False) -> str:
    """A row's rid, e.g. `7:p-00042/t2/a1;`: the sample id after its length, the turn, the
    attempt (the first try may still run on some server, and sglang refuses a rid in flight),
    `/hedge` on a hedge's second copy (the first runs on another server), and `;`.

    No rid is a prefix of another, whatever the ids hold ("1" and "12", colons, digits): a
    hedge's POST /abort_request cuts every request whose rid *starts with* the one named
    (scheduler.py abort_request). Two rids that agree up to the first one's end agree on
    the length before the first `:` (digits hold none), so on the id, and then on the rest,
    which holds its one `;` at its end. The id is the row's, never prompt text."""
    hedged = "/hedge" if hedge else ""
    return f"{len(sample_id)}:{sample_id}/t{turn}/a{attempt}{hedged};"


def chat_request_body(
    model: str,
    messages: list[dict[str, Any]],
    sampling: SamplingConfig,
    rid: str | None = None,
    max_tokens: int | None = None,
    regeneration: RegenerationConfig | None = None,
    reasoning_effort: str | None = None,
    setting: RowSetting | None = None,
    tools: list[dict[str, Any]] | None = None,
    seed: int | None = None,
) -> dict[str, Any]:
    """`rid` is the sample id, so a request can be found in server logs and aborted by id.

    `seed` is the turn's sampling seed (regen.client.seed): the OpenAI route's `seed`, which
    0.5.23 passes on as `sampling_seed` and honours under `--enable-deterministic-inference`.

    `reasoning_effort` is sent only when set: a model that takes none is not asked for one.
    `setting` is the row's draw from the mixes; without it, the section's values and
    `regeneration.thinking` (probes, benches)."""
    if setting is None:
        setting = RowSetting(
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            min_p=sampling.min_p,
            enable_thinking=(regeneration or RegenerationConfig()).enable_thinking,
        )
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        # 0.5.23 deprecates max_tokens in favour of this; both set the same limit.
        "max_completion_tokens": max_tokens if max_tokens is not None else sampling.max_tokens,
        "temperature": setting.temperature,
        "top_p": setting.top_p,
        "top_k": setting.top_k,
        "chat_template_kwargs": {"enable_thinking": setting.enable_thinking},
        "separate_reasoning": True,
        "stream": False,
    }
    if regeneration is not None and regeneration.token_ids:
        # SGLang adds prompt_token_ids and response_token_ids to the choice (not on a stream).
        # Only rows store them: probes and fleet benches, which pass no regeneration, ask none.
        body["return_token_ids"] = True
    if setting.min_p:
        body["min_p"] = setting.min_p
    if rid is not None:
        body["rid"] = rid
    if reasoning_effort is not None:
        body["reasoning_effort"] = reasoning_effort
    if seed is not None:
        body["seed"] = seed
    if tools:
        # The row's tools (regen.tools), tool_choice left at SGLang's default "auto": the model
        # decides whether to call, as it does when served.
        body["tools"] = tools
    return body
