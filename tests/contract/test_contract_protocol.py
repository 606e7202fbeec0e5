"""Request and response bodies, judged by sglang 0.5.23's own pydantic models and parser.

Every body regen sends validates as a ChatCompletionRequest with no field sglang does not
declare; every answer the emulator gives (success, stream, each error, each fault) validates
as the response model it stands for; the emulator splits reasoning from answer exactly as
sglang's qwen3 reasoning parser splits the raw text it would have generated.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from regen.client.seed import turn_seed
from regen.config import RegenerationConfig, SamplingConfig
from regen.fleet.bench import BENCH_MESSAGES
from regen.sglang_api.probe import PROBE_MESSAGES, ProbeSettings
from regen.sglang_api.request import chat_request_body
from support.emulator import Emulator
from tests.contract._sglang import Sglang
from tests.support.fleet import SERVED

KEY = "contract-emu-key"
USER = [{"role": "user", "content": "Explain how a queue works, step by step."}]
MULTI_TURN = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Name a prime."},
    {"role": "assistant", "content": "Seven."},
    {"role": "user", "content": "And another?"},
]


# --- what we send ---------------------------------------------------------------------------


def _bodies() -> dict[str, dict[str, Any]]:
    sampling = SamplingConfig()
    bodies = {
        f"thinking {mode}": chat_request_body(
            SERVED, MULTI_TURN, sampling, rid=f"r-{mode}",
            regeneration=RegenerationConfig(thinking=mode),
        )
        for mode in ("save", "drop", "off")
    }  # fmt: skip
    for effort in ("low", "medium", "high", "none", "max"):
        bodies[f"effort {effort}"] = chat_request_body(
            SERVED, USER, sampling, rid="r-e", reasoning_effort=effort
        )
    bodies["min_p"] = chat_request_body(SERVED, USER, SamplingConfig(min_p=0.05), rid="r-p")
    bodies["probe"] = chat_request_body(
        SERVED, PROBE_MESSAGES, sampling, rid="regen-probe-x", max_tokens=ProbeSettings().max_tokens
    )
    bodies["bench"] = chat_request_body(
        SERVED, BENCH_MESSAGES, sampling, rid="regen-bench-x", max_tokens=256
    )
    no_ids = RegenerationConfig(token_ids=False)
    bodies["no token ids"] = chat_request_body(SERVED, USER, sampling, regeneration=no_ids)
    bodies["no token ids"]["rid"] = "r-n"
    bodies["seeded"] = chat_request_body(
        SERVED, USER, sampling, rid="r-s", seed=turn_seed(0, "row-7", 1)
    )
    assert bodies["thinking save"]["return_token_ids"] is True  # the default asks for them
    return bodies


BODIES = _bodies()


@pytest.mark.parametrize("name", list(BODIES))
def test_request_body_is_a_chat_completion_request(sglang: Sglang, name: str) -> None:
    body = BODIES[name]
    verdict = sglang.ask("request", body=body)
    assert verdict["ok"], verdict["errors"]
    assert verdict["unknown"] == [], f"fields sglang does not declare: {verdict['unknown']}"
    parsed = verdict["parsed"]
    assert "max_tokens" not in body  # deprecated in 0.5.23
    assert parsed["max_completion_tokens"] == body["max_completion_tokens"]
    # sglang mirrors enable_thinking into `thinking`; ours must survive as sent.
    assert parsed["chat_template_kwargs"].items() >= body["chat_template_kwargs"].items()
    assert parsed["separate_reasoning"] is True and parsed["rid"] == body["rid"]
    if "reasoning_effort" in body:
        assert parsed["reasoning_effort"] == body["reasoning_effort"]


@pytest.mark.parametrize("turn", [1, 2, 5])
def test_a_turns_seed_reaches_the_sampler_as_sampling_seed(sglang: Sglang, turn: int) -> None:
    """The OpenAI route's `seed` is what 0.5.23 samples with (`sampling_seed`, under
    --enable-deterministic-inference): regen's seeds are in its signed 64-bit range."""
    seed = turn_seed(2**63 - 1, "row-with-the-largest-run-seed", turn)
    body = chat_request_body(SERVED, USER, SamplingConfig(seed=2**63 - 1), rid="r", seed=seed)
    params = sglang.ask("sampling_params", body=body, vocab_size=151936)
    assert params["sampling_seed"] == seed and 0 <= seed < 2**63
    assert (params["temperature"], params["top_p"], params["top_k"]) == (0.6, 0.95, 20)


# --- what the emulator answers --------------------------------------------------------------


COMMON = [
    "--reasoning-parser", "qwen3", "--context-length", "4096", "--emu-load-s", "0",
    "--emu-reasoning-tokens", "20:60", "--emu-answer-tokens", "5:20",
]  # fmt: skip


class Emu(Emulator):
    def post(self, body: Any, timeout: float = 30) -> httpx.Response:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        return httpx.post(
            f"{self.url}/v1/chat/completions",
            content=content,
            headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
            timeout=timeout,
        )


SERVERS = {
    "plain": ["--emu-time-scale", "0.01"],
    "slow": ["--emu-time-scale", "1", "--emu-reasoning-tokens", "400:500"],
    "empty-answer": ["--emu-time-scale", "0.01", "--emu-fault", "empty-answer=1"],
    "truncate": ["--emu-time-scale", "0.01", "--emu-fault", "truncate=1"],
    "think-leak": ["--emu-time-scale", "0.01", "--emu-fault", "think-leak=1"],
    "repeat-loop": ["--emu-time-scale", "0.01", "--emu-fault", "repeat-loop=1"],
    "http500": ["--emu-time-scale", "0.01", "--emu-fault", "http500=1"],
    "cache-report": ["--emu-time-scale", "0.01", "--enable-cache-report"],
}


@pytest.fixture(scope="module")
def emus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Emu]]:
    logs = tmp_path_factory.mktemp("contract-emu")
    started: dict[str, Emu] = {}
    try:
        for name, flags in SERVERS.items():
            started[name] = Emu.launch(logs, *COMMON, *flags, served_name=SERVED, api_key=KEY)
        deadline = time.monotonic() + 60
        for emu in started.values():
            emu.wait_ready(deadline=deadline)
        yield started
    finally:
        for emu in started.values():
            emu.stop()


def _body(ids: bool = True, **extra: Any) -> dict[str, Any]:
    regeneration = RegenerationConfig(token_ids=ids)
    return (
        chat_request_body(SERVED, USER, SamplingConfig(max_tokens=400), regeneration=regeneration)
        | extra
    )


def _check(sglang: Sglang, kind: str, body: Any) -> dict[str, Any]:
    verdict = sglang.ask("response", kind=kind, body=body)
    assert verdict["ok"], (verdict["errors"], body)
    assert verdict["unknown"] == [], f"fields sglang does not declare: {verdict['unknown']}"
    parsed: dict[str, Any] = verdict["parsed"]
    return parsed


@pytest.mark.parametrize(
    ("server", "extra"),
    [
        ("plain", {}),
        ("plain", {"chat_template_kwargs": {"enable_thinking": False}}),
        ("plain", {"separate_reasoning": False}),
        ("plain", {"return_meta_info": True}),
        ("plain", {"max_completion_tokens": 8}),  # cut inside the thinking: finish "length"
        ("empty-answer", {}),
        ("truncate", {}),
        ("think-leak", {}),
        ("repeat-loop", {}),
    ],
)
def test_chat_answer_is_a_chat_completion_response(
    sglang: Sglang, emus: dict[str, Emu], server: str, extra: dict[str, Any]
) -> None:
    resp = emus[server].post(_body(**extra))
    assert resp.status_code == 200, resp.text
    parsed = _check(sglang, "chat", resp.json())
    assert parsed["model"] == SERVED and parsed["choices"][0]["finish_reason"] in ("stop", "length")


def test_stream_chunks_are_stream_responses(sglang: Sglang, emus: dict[str, Emu]) -> None:
    body = _body(ids=False, stream=True, stream_options={"include_usage": True})
    resp = emus["plain"].post(body)
    assert resp.status_code == 200 and resp.text.endswith("data: [DONE]\n\n"), resp.text
    events = [line.removeprefix("data: ") for line in resp.text.split("\n\n") if line]
    chunks = [json.loads(e) for e in events[:-1]]
    assert len(chunks) >= 3
    for chunk in chunks:
        _check(sglang, "stream", chunk)
    assert chunks[-1]["usage"]["completion_tokens"] > 0


@pytest.mark.parametrize(
    ("server", "body", "status", "kind"),
    [
        ("plain", b"{not json", 400, "Bad Request"),
        ("plain", {"model": SERVED, "messages": []}, 400, "BadRequestError"),
        ("plain", _body(reasoning_effort="extreme"), 400, "Bad Request"),
        ("plain", _body(reasoning_effort=1.5), 400, "Bad Request"),
        ("plain", _body(max_completion_tokens=100_000), 400, "BadRequest"),
        ("plain", _body(stream=True), 400, "BadRequest"),  # token ids on a stream
        ("http500", _body(), 500, "InternalServerError"),
    ],
    ids=[
        "bad json",
        "no messages",
        "effort word",
        "effort number",
        "over context",
        "ids on a stream",
        "http500",
    ],
)
def test_errors_are_error_responses(
    sglang: Sglang, emus: dict[str, Emu], server: str, body: Any, status: int, kind: str
) -> None:
    resp = emus[server].post(body)
    assert resp.status_code == status, resp.text
    parsed = _check(sglang, "error", resp.json())
    assert parsed["type"] == kind and parsed["code"] == status


def _refusals() -> dict[str, Any]:
    base = _body(reasoning_effort="high")
    no_messages = {k: v for k, v in base.items() if k != "messages"}
    return {
        "unknown role": base | {"messages": [{"role": "wizard", "content": "hi"}]},
        "role of another case": base | {"messages": [{"role": "User", "content": "hi"}]},
        "role not a string": base | {"messages": [{"role": 5, "content": "hi"}]},
        "role missing": base | {"messages": [*USER, {"content": "hi"}]},
        "message not an object": base | {"messages": ["hi"]},
        "messages not a list": base | {"messages": "hi"},
        "no messages key": no_messages,
        "no messages key, no effort": {"model": SERVED, "tools": None, "max_tokens": 8},
    }


REFUSALS = _refusals()


def _server_path_dropped(message: str) -> str:
    """FastAPI names the route's file; the server's install path is not the emulator's."""
    return re.sub(r'File "[^"]*(sglang/srt/entrypoints/http_server\.py)"', r'File "\1"', message)


@pytest.mark.parametrize("name", list(REFUSALS))
def test_invalid_body_is_refused_in_sglangs_words(
    sglang: Sglang, emus: dict[str, Emu], name: str
) -> None:
    """sglang's own route, request model and validation handler answer the same bytes: the
    emulator gives the same status and body, pydantic's text included."""
    raw = json.dumps(REFUSALS[name])
    real = sglang.ask("http", body=raw)
    resp = emus["plain"].post(raw.encode())
    assert (resp.status_code, real["status"]) == (400, 400), (resp.text, real)
    mine = resp.json()
    theirs = real["body"] | {"message": _server_path_dropped(real["body"]["message"])}
    assert mine == theirs
    _check(sglang, "error", mine)


def test_any_case_of_a_known_role_is_accepted(emus: dict[str, Emu]) -> None:
    messages = [{"role": "SYSTEM", "content": "Be brief."}, *USER]
    assert emus["plain"].post(_body(messages=messages)).status_code == 200


def test_weight_versions_are_sglangs(sglang: Sglang, emus: dict[str, Emu]) -> None:
    """metadata carries weight_versions beside weight_version, as serving_chat builds it."""
    answer = emus["plain"].post(_body(return_meta_info=True)).json()
    n = answer["usage"]["completion_tokens"]
    real = sglang.ask("weight_metadata", completion_tokens=n)
    assert answer["metadata"] == real["metadata"]
    meta = answer["choices"][0]["meta_info"]
    assert {k: meta[k] for k in real["meta_info"]} == real["meta_info"]
    _check(sglang, "chat", answer)


@pytest.mark.parametrize("server", ["plain", "cache-report"])
def test_cached_tokens_are_reported_as_sglang_reports_them(
    sglang: Sglang, emus: dict[str, Emu], server: str
) -> None:
    """The same prompt twice: the second finds all but its last token in the prefix cache.
    meta_info's cached_tokens (and its device/host split), and usage as serving_chat builds it
    from them: prompt_tokens_details only with --enable-cache-report."""
    body = _body(return_meta_info=True, messages=MULTI_TURN)
    answers = [emus[server].post(body).json() for _ in range(2)]
    for answer in answers:
        meta = answer["choices"][0]["meta_info"]
        real = sglang.ask("usage", meta_info=meta, cache_report=server == "cache-report")
        assert answer["usage"] == real, (answer["usage"], real)
        _check(sglang, "chat", answer)
    cached = answers[1]["choices"][0]["meta_info"]["cached_tokens"]
    assert cached == answers[1]["usage"]["prompt_tokens"] - 1
    assert answers[1]["choices"][0]["meta_info"]["cached_tokens_details"] == {
        "device": cached,
        "host": 0,
    }


def test_every_0523_effort_is_accepted(emus: dict[str, Emu]) -> None:
    for effort in ("none", "minimal", "low", "medium", "high", "xhigh", "ultra", "max", 0, 0.99):
        resp = emus["plain"].post(_body(reasoning_effort=effort))
        assert resp.status_code == 200, (effort, resp.text)


def test_duplicate_in_flight_rid_is_refused(sglang: Sglang, emus: dict[str, Emu]) -> None:
    slow = emus["slow"]
    first: list[httpx.Response] = []
    worker = threading.Thread(target=lambda: first.append(slow.post(_body(rid="same-rid"))))
    worker.start()
    time.sleep(0.5)  # the first is decoding (about 2 s)
    second = slow.post(_body(rid="same-rid"))
    worker.join()
    assert first[0].status_code == 200
    assert second.status_code == 400
    parsed = _check(sglang, "error", second.json())
    assert parsed["message"] == "Duplicate request ID detected: same-rid"
    assert parsed["type"] == "BadRequest"
    assert slow.post(_body(rid="same-rid")).status_code == 200  # once done, the rid is free


# --- the reasoning split --------------------------------------------------------------------


@pytest.mark.parametrize("prompt", range(4))
def test_reasoning_split_equals_sglangs_qwen3_parser(
    sglang: Sglang, emus: dict[str, Emu], prompt: int
) -> None:
    """The raw text (separate_reasoning off) through sglang's parser gives the emulator's split,
    whitespace included."""
    messages = [{"role": "user", "content": f"Question number {prompt}: why is the sky blue?"}]
    body = chat_request_body(SERVED, messages, SamplingConfig(max_tokens=400))
    split = emus["plain"].post(body).json()["choices"][0]["message"]
    raw = emus["plain"].post(body | {"separate_reasoning": False}).json()
    text = raw["choices"][0]["message"]["content"]
    parsed = sglang.ask("reasoning", text=text, force=False)
    assert (split["reasoning_content"], split["content"]) == (
        parsed["reasoning"],
        parsed["content"],
    )
