"""The emulator as real processes on loopback, driven by the official openai client."""

from __future__ import annotations

import asyncio
import functools
import json
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import openai
import pytest

from regen.emulator import history_digest, main
from regen.emulator.cli import READY_LINE as READY
from support.emulator import MODEL_DIR, Emulator
from tests.support.ids import IM_END, ids, rendered

KEY = "emu-test-key"
MODEL = "emu-model"
THINK = {"chat_template_kwargs": {"enable_thinking": True}}
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}
IDS = {"return_token_ids": True}


@dataclass
class Emu(Emulator):
    """An emulator with the calls these tests make: openai's client and raw HTTP."""

    @functools.cached_property
    def default_client(self) -> openai.OpenAI:
        return self.client()

    def client(self, key: str = KEY, timeout: float = 30) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=key, timeout=timeout, max_retries=0)

    def get(self, path: str, key: str | None = KEY, timeout: float = 10) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.get(self.url + path, headers=headers, timeout=timeout)

    def post(
        self, path: str, body: object, key: str | None = KEY, timeout: float = 10
    ) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        return httpx.post(self.url + path, content=content, headers=headers, timeout=timeout)


def _launch(tmp: Path, *flags: str, key: str | None = KEY) -> Emu:
    return Emu.launch(
        tmp, "--emu-time-scale", "0.01", "--emu-load-s", "0.2", "--context-length", "4096",
        *flags, served_name=MODEL, api_key=key,
    )  # fmt: skip


Starter = Callable[..., Emu]


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Starter]:
    """Start emulators (ready unless wait=False); every one is killed afterwards."""
    started: list[Emu] = []

    def _start(*flags: str, wait: bool = True, key: str | None = KEY) -> Emu:
        emu = _launch(tmp_path, *flags, key=key)
        started.append(emu)
        if wait:
            emu.wait_ready()
        return emu

    yield _start
    for emu in started:
        emu.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emu]:
    """One shared thinking server with metrics, for the tests that do not change flags."""
    emu = _launch(
        tmp_path_factory.mktemp("emu"),
        "--reasoning-parser", "qwen3", "--enable-metrics",
        "--emu-reasoning-tokens", "20:200", "--emu-answer-tokens", "20:100",
        "--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3",
        "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
        "--mem-fraction-static", "0.88", "--tp-size", "1", "--cuda-graph-max-bs-decode", "64",
        "--trust-remote-code", "--watchdog-timeout", "300", "--max-total-tokens", "25.6k",
    )  # fmt: skip
    try:
        emu.wait_ready()
        yield emu
    finally:
        emu.stop()


def ask(emu: Emu, text: str, **extra: Any) -> openai.types.chat.ChatCompletion:
    messages: Any = [{"role": "user", "content": text}]
    return emu.default_client.chat.completions.create(model=MODEL, messages=messages, **extra)


def reasoning(resp: openai.types.chat.ChatCompletion) -> str | None:
    extra = resp.choices[0].message.model_extra or {}
    return extra.get("reasoning_content")


# -- the contract shapes -------------------------------------------------------------------


def test_chat_with_thinking_via_openai_client(server: Emu) -> None:
    messages: Any = [{"role": "user", "content": "What is 2 + 2?"}]
    resp = server.client().chat.completions.create(
        model=MODEL, messages=messages, max_tokens=1000, extra_body={**THINK, **IDS}
    )
    choice = resp.choices[0]
    extra = choice.model_extra or {}
    assert choice.finish_reason == "stop"
    assert extra["matched_stop"] == IM_END
    # SGLang 0.5.23's Qwen3 parser strips only the tags: the model opened <think> itself.
    thought = reasoning(resp) or ""
    assert re.fullmatch(r"\n[^\n]+\n", thought) and len(ids(thought)) >= 20 + 2
    content = choice.message.content or ""
    assert content.startswith(f"\n\n[history:{history_digest(messages)}] ")
    assert "<think>" not in content
    usage = resp.usage
    assert usage is not None
    prompt = "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n"
    assert (
        extra["prompt_token_ids"]
        == ids(prompt)
        == rendered(messages, True, **THINK["chat_template_kwargs"])
    )
    assert usage.prompt_tokens == len(extra["prompt_token_ids"]) == 14
    # <think> reasoning </think> answer <|im_end|>, the end token included
    response = extra["response_token_ids"]
    assert response == [*ids(f"<think>{thought}</think>{content}"), IM_END]
    assert usage.completion_tokens == len(response)
    # Counted through </think>, and also in OpenAI's place because there are some.
    thinking = len(ids(f"<think>{thought}</think>"))
    assert (usage.model_extra or {})["reasoning_tokens"] == thinking
    assert usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.reasoning_tokens == thinking
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert resp.model == MODEL


@pytest.mark.parametrize("kwargs", [THINK, NO_THINK])
def test_the_template_reproduces_the_served_ids(server: Emu, kwargs: dict[str, Any]) -> None:
    """A trainer rendering the stored conversation with the model's template gets the server's
    prompt ids, then exactly its response ids as the assistant span; later turns too."""
    history: Any = [{"role": "system", "content": "Be brief ."}, {"role": "user", "content": "a"}]
    for question in ("and then ?", "why ?"):
        resp = server.default_client.chat.completions.create(
            model=MODEL, messages=history, extra_body={**kwargs, **IDS}
        )
        extra = resp.choices[0].model_extra or {}
        prompt, response = extra["prompt_token_ids"], extra["response_token_ids"]
        assert prompt == rendered(history, True, **kwargs["chat_template_kwargs"])
        answer = {
            "role": "assistant",
            "content": resp.choices[0].message.content,
            "reasoning_content": reasoning(resp),
        }
        full = rendered([*history, answer], False, **kwargs["chat_template_kwargs"])
        assert full == [*prompt, *response, *ids("\n")]
        assert response[-1] == IM_END and resp.usage is not None
        assert (resp.usage.prompt_tokens, resp.usage.completion_tokens) == (
            len(prompt),
            len(response),
        )
        # The next turn sends the answer back without its reasoning, as the dispatcher does.
        history = [*history, {"role": "assistant", "content": answer["content"]}]
        history.append({"role": "user", "content": question})
    # Earlier answers are in the last prompt as the template renders them (no reasoning).
    earlier = ids(f"<|im_start|>assistant\n{history[2]['content']}<|im_end|>")
    assert any(prompt[i : i + len(earlier)] == earlier for i in range(len(prompt)))


def test_token_ids_only_when_asked_and_never_on_a_stream(server: Emu) -> None:
    plain = ask(server, "no ids").choices[0].model_extra or {}
    assert "prompt_token_ids" not in plain and "response_token_ids" not in plain
    only_prompt = ask(server, "no ids", extra_body={"return_prompt_token_ids": True})
    extra = only_prompt.choices[0].model_extra or {}
    assert "response_token_ids" not in extra and extra["prompt_token_ids"]
    for flag in ("return_token_ids", "return_prompt_token_ids"):
        body = {"messages": [{"role": "user", "content": "x"}], "stream": True, flag: True}
        resp = server.post("/v1/chat/completions", body)
        assert resp.status_code == 400
        assert resp.json()["type"] == "BadRequest" and flag in resp.json()["message"]


def test_same_history_same_answer_and_turns_see_their_history(server: Emu) -> None:
    first, again = ask(server, "same prompt", extra_body=THINK), ask(server, "same prompt")
    assert first.choices[0].message.content == again.choices[0].message.content
    assert reasoning(first) == reasoning(again)
    turns: Any = [
        {"role": "user", "content": "same prompt"},
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "and then?"},
    ]
    second = server.client().chat.completions.create(model=MODEL, messages=turns)
    assert f"[history:{history_digest(turns)}]" in (second.choices[0].message.content or "")
    assert history_digest(turns) != history_digest(turns[:1])


def test_auth(server: Emu) -> None:
    with pytest.raises(openai.AuthenticationError):
        server.client(key="wrong").chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}]
        )
    missing = server.post("/v1/chat/completions", {"messages": []}, key=None)
    assert (missing.status_code, missing.json()) == (401, {"error": "Unauthorized"})
    for path in ("/v1/models", "/server_info", "/model_info", "/ping"):
        assert server.get(path, key=None).status_code == 401, path
    # SGLang leaves probes and metrics open (prefix match on /health, /ready, /metrics).
    for path in ("/health", "/health_generate", "/ready", "/metrics"):
        assert server.get(path, key=None).status_code == 200, path


def test_context_length_errors(server: Emu) -> None:
    with pytest.raises(openai.BadRequestError, match=r"input \(\d+ tokens\).*\(4096 tokens\)"):
        ask(server, "word " * 5000)
    prompt = len(ids("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"))
    assert prompt == 9
    with pytest.raises(openai.BadRequestError) as err:
        ask(server, "hello", max_tokens=4096)
    assert f"total of {prompt + 4096} tokens: {prompt} tokens" in str(err.value)
    body = server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                                "max_tokens": 5000}).json()  # fmt: skip
    # A ValueError while serving, in 0.5.23's words for it.
    assert body["object"] == "error" and body["type"] == "BadRequest"
    assert body["code"] == 400 and body["param"] is None


def test_bad_requests(server: Emu) -> None:
    for raw in (b"{not json", json.dumps({"model": MODEL}).encode(), b'{"messages": []}'):
        resp = server.post("/v1/chat/completions", raw)
        assert resp.status_code == 400, raw
        assert resp.json()["object"] == "error"


def test_truncation_inside_thinking(server: Emu) -> None:
    resp = ask(server, "think long", max_tokens=8, extra_body=THINK)
    assert resp.choices[0].finish_reason == "length"
    assert resp.choices[0].message.content == ""
    thought = reasoning(resp) or ""
    assert thought.startswith("\n") and len(ids(thought)) == 7  # the 8th token is <think>
    assert resp.usage is not None and resp.usage.completion_tokens == 8
    assert (resp.choices[0].model_extra or {})["matched_stop"] is None


def test_thinking_off_and_inline(server: Emu) -> None:
    off = ask(server, "no thinking", extra_body=NO_THINK)
    assert reasoning(off) is None
    assert off.usage is not None and (off.usage.model_extra or {})["reasoning_tokens"] == 0
    assert off.usage.completion_tokens_details is None
    assert (off.choices[0].message.content or "").startswith("[history:")
    inline = ask(server, "inline", extra_body={"separate_reasoning": False})
    content = inline.choices[0].message.content or ""
    assert reasoning(inline) is None
    assert re.match(r"<think>\n.+\n</think>\n\n\[history:[0-9a-f]{8}\]", content, re.S)


def test_info_endpoints(server: Emu) -> None:
    models = server.get("/v1/models").json()
    assert models["object"] == "list"
    card = models["data"][0]
    assert (card["id"], card["object"], card["owned_by"]) == (MODEL, "model", "sglang")
    assert card["max_model_len"] == 4096
    for path in ("/model_info", "/get_model_info"):
        info = server.get(path).json()
        assert info["model_path"] == str(MODEL_DIR) and info["is_generation"] is True
        assert info["architectures"] == ["Qwen3NextForCausalLM"]
    for path in ("/server_info", "/get_server_info"):
        info = server.get(path).json()
        assert info["served_model_name"] == MODEL and info["tp_size"] == 1
        assert info["max_running_requests"] == 48  # forced by speculative decoding, no flag
        assert info["speculative_algorithm"] == "NEXTN" and info["version"] == "0.5.23"
        state = info["internal_states"][0]
        assert state["avg_spec_accept_length"] == pytest.approx(3.6)
        assert "last_gen_throughput" in state
    assert server.get("/ping").status_code == 200
    assert server.post("/flush_cache", {}).status_code == 200
    # Every resolved argument at info level, api_key in clear, as 0.5.23 logs them: server
    # logs are secret (the fleet keeps them 0600 under work_dir/logs; tests/test_security.py).
    logged = re.search(r"server_args=(\{.*\})$", server.text(), re.M)
    assert logged and f"'api_key': '{KEY}'" in logged.group(1)
    assert "'max_total_tokens': 25600" in logged.group(1)  # sglang's own 25.6k


def test_metrics_count_what_was_served(server: Emu) -> None:
    before_gen = server.metric("sglang:generation_tokens_total")
    before_prompt = server.metric("sglang:prompt_tokens_total")
    before_count = server.metric("sglang:e2e_request_latency_seconds_count")
    resp = ask(server, "count me", extra_body=THINK)
    assert resp.usage is not None
    gen = server.metric("sglang:generation_tokens_total") - before_gen
    assert gen == resp.usage.completion_tokens
    assert server.metric("sglang:prompt_tokens_total") - before_prompt == resp.usage.prompt_tokens
    assert server.metric("sglang:e2e_request_latency_seconds_count") == before_count + 1
    assert server.metric("sglang:gen_throughput") > 0
    text = server.get("/metrics").text
    for name in ("num_running_reqs", "num_queue_reqs", "token_usage", "spec_accept_length"):
        assert re.search(rf'^sglang:{name}{{model_name="{MODEL}"', text, re.M), name


def test_native_generate_and_stream(server: Emu) -> None:
    body = {"text": "Once upon", "sampling_params": {"max_new_tokens": 10, "temperature": 0}}
    out = server.post("/generate", body).json()
    meta = out["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 10}
    assert meta["completion_tokens"] == len(out["output_ids"]) == 10
    assert meta["prompt_tokens"] == len(ids("Once upon")) == 2 and "e2e_latency" in meta
    assert meta["spec_accept_length"] == pytest.approx(3.6)
    chunks = list(
        server.client().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "stream"}], stream=True
        )
    )
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == ask(server, "stream").choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_abort_by_rid(start: Starter) -> None:
    emu = start("--enable-metrics", "--emu-time-scale", "1", "--emu-answer-tokens", "1000:1000")

    async def run() -> dict[str, object]:
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {KEY}"}) as s:
            body = {"messages": [{"role": "user", "content": "abort me"}], "rid": "r-1"}
            pending = asyncio.ensure_future(s.post(f"{emu.url}/v1/chat/completions", json=body))
            # Abort once the server runs it (a wait on its state, not a guessed sleep).
            while not await asyncio.to_thread(emu.metric, "sglang:num_running_reqs"):
                await asyncio.sleep(0.01)
            async with s.post(f"{emu.url}/abort_request", json={"rid": "r-1"}) as resp:
                assert resp.status == 200
            async with await pending as resp:
                return dict(await resp.json())

    out = asyncio.run(run())
    choice = out["choices"][0]  # type: ignore[index]
    assert choice["finish_reason"] == "abort"
    # Fewer tokens than asked: the answer was cut short, not run to its end (the abort may land
    # before its first token, as it waits only for the request to be running).
    assert out["usage"]["completion_tokens"] < 1000  # type: ignore[index]


def test_config_file_carries_the_key(start: Starter, tmp_path: Path) -> None:
    config = tmp_path / "server.yaml"
    config.write_text("api-key: from-file\nenable_metrics: true\nmax_running_requests: 3\n")
    emu = start("--config", str(config), key=None)
    assert emu.get("/v1/models", key="from-file").status_code == 200
    assert emu.get("/v1/models", key=KEY).status_code == 401
    assert emu.get("/server_info", key="from-file").json()["max_running_requests"] == 3
    # Not on the command line, yet in the log: 0.5.23 logs the merged arguments, key included.
    assert "from-file" not in " ".join(emu.proc.args)  # type: ignore[arg-type]
    assert "'api_key': 'from-file'" in emu.text()


# -- flags ---------------------------------------------------------------------------------


def _run(*flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "regen.emulator", "--model-path", str(MODEL_DIR), *flags],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip


def test_removed_and_bad_flags_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    removed = _run("--cuda-graph-max-bs", "32")
    assert removed.returncode == 2
    assert "ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode" in (
        removed.stderr
    )
    # The rest in this process: the same `main` the process runs, without its start-up.
    for flag in ("--stream-output", "--some-new-gpu-flag", "--tp-size=two"):
        # Unknown to 0.5.23, or the wrong type: the real one exits 2.
        assert main(["--model-path", str(MODEL_DIR), flag]) == 2, flag
        err = capsys.readouterr().err
        assert flag.split("=")[0] in err, err
    for fault in ("nosuch=1", "empty-answer=2", "crash-after", "no-ready=1"):
        assert main(["--model-path", str(MODEL_DIR), "--emu-fault", fault]) == 2
        assert "--emu-fault" in capsys.readouterr().err, fault


# -- faults --------------------------------------------------------------------------------


def test_output_faults(start: Starter) -> None:
    flags = ("--reasoning-parser", "qwen3", "--emu-reasoning-tokens", "20:50")
    names = ("empty-answer", "truncate", "think-leak", "repeat-loop", "http500")
    emus = {n: start(*flags, "--emu-fault", f"{n}=1.0", wait=False) for n in names}
    for emu in emus.values():
        emu.wait_ready()

    empty = ask(emus["empty-answer"], "anything", extra_body={**THINK, **IDS})
    # The incident: <think>\n\n</think>\n\nOK.<|im_end|>, 6 tokens, 3 of them thinking.
    assert empty.choices[0].message.content == "\n\nOK."
    assert reasoning(empty) == "\n\n" and empty.choices[0].finish_reason == "stop"
    assert empty.usage is not None and empty.usage.completion_tokens == 6
    assert (empty.usage.model_extra or {})["reasoning_tokens"] == 3
    response = (empty.choices[0].model_extra or {})["response_token_ids"]
    assert response == ids("<think>\n\n</think>\n\nOK.<|im_end|>") and len(response) == 6

    cut = ask(emus["truncate"], "anything", max_tokens=300)
    assert cut.choices[0].finish_reason == "length" and cut.choices[0].message.content == ""
    assert len(ids(reasoning(cut) or "")) == 299
    assert cut.usage is not None and (cut.usage.model_extra or {})["reasoning_tokens"] == 300

    leak = ask(emus["think-leak"], "anything").choices[0].message.content or ""
    assert "<think>" in leak and "</think>" in leak

    loop = ask(emus["repeat-loop"], "anything", max_tokens=500, extra_body=NO_THINK)
    lines = (loop.choices[0].message.content or "").splitlines()
    line = "Wait , let me check the answer again ."
    assert len(lines) > 20 and set(lines[:-1]) == {line} and line.startswith(lines[-1])
    assert loop.choices[0].finish_reason == "length"
    assert loop.usage is not None and loop.usage.completion_tokens == 500
    assert len(ids(loop.choices[0].message.content or "")) == 500

    with pytest.raises(openai.InternalServerError):
        ask(emus["http500"], "anything")


def test_empty_answer_fraction_is_per_prompt(start: Starter) -> None:
    # Short answers: 45 of the default lengths took seconds, and the draw of which prompts
    # get the fault depends on (seed, history) only, not on the lengths.
    emu = start(
        "--reasoning-parser", "qwen3", "--emu-fault", "empty-answer=0.5",
        "--emu-reasoning-tokens", "5:20", "--emu-answer-tokens", "5:20",
    )  # fmt: skip
    answers = [ask(emu, f"prompt {i}").choices[0].message.content for i in range(40)]
    empty = sum(a == "\n\nOK." for a in answers)
    assert 8 <= empty <= 32
    assert [ask(emu, f"prompt {i}").choices[0].message.content for i in range(5)] == answers[:5]


def test_crash_after(start: Starter) -> None:
    emu = start("--emu-fault", "crash-after=2")
    for i in range(2):
        assert ask(emu, f"q{i}").choices[0].finish_reason == "stop"
    assert emu.proc.wait(timeout=10) == 1
    with pytest.raises(openai.APIConnectionError):
        ask(emu, "q3")


def test_hang_after_turns_health_503_after_20_simulated_s(start: Starter) -> None:
    """0.5.23's /health is a 1-token generation: a stuck scheduler never answers it, and
    after HEALTH_CHECK_TIMEOUT (20 s; 0.2 s wall at this time scale) it is a 503."""
    emu = start("--emu-fault", "hang-after=0")
    assert emu.get("/health", key=None).status_code == 200  # no request has hung it yet
    with pytest.raises(openai.APITimeoutError):
        emu.client(timeout=1.0).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hello"}]
        )
    started = time.monotonic()
    assert emu.get("/health", key=None).status_code == 503
    assert time.monotonic() - started >= 20 * 0.01
    assert "Health check failed" in emu.text()
    assert emu.proc.poll() is None


def test_unauthorized_after_refuses_the_key_it_started_with(start: Starter) -> None:
    """A key rotated under a running server: its first N chats are served, then every request
    that needs the key is refused with 401, as after a restart with another one; /health
    needs none and still answers."""
    emu = start("--emu-fault", "unauthorized-after=2")
    for i in range(2):
        assert ask(emu, f"q{i}").choices[0].finish_reason == "stop"
    with pytest.raises(openai.AuthenticationError):
        ask(emu, "q2")
    assert emu.get("/v1/models").status_code == 401
    assert emu.get("/health", key=None).status_code == 200
    assert "API key changed (emulated fault unauthorized-after)" in emu.text()
    assert emu.proc.poll() is None


def test_startup_faults(start: Starter) -> None:
    failing = start("--emu-fault", "fail-startup", wait=False)
    stuck = start("--emu-fault", "no-ready", wait=False)
    assert failing.proc.wait(timeout=20) == 1
    assert "fail-startup" in failing.text() and READY not in failing.text()
    deadline = time.monotonic() + 20
    while "Loading is taking longer" not in stuck.text():  # it got as far as loading
        assert stuck.proc.poll() is None and time.monotonic() < deadline, stuck.text()
        time.sleep(0.02)
    assert stuck.proc.poll() is None
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", stuck.port), 0.5):
        pass
    assert READY not in stuck.text()


# -- capacity and scale --------------------------------------------------------------------


async def _concurrent(emu: Emu, count: int, **body: object) -> list[float]:
    """Send `count` chats at once; return each one's latency in seconds."""
    connector = aiohttp.TCPConnector(limit=0)
    headers = {"Authorization": f"Bearer {KEY}"}
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:

        async def one(i: int) -> float:
            started = time.monotonic()
            payload = {"messages": [{"role": "user", "content": f"load {i}"}], **body}
            async with session.post(f"{emu.url}/v1/chat/completions", json=payload) as resp:
                assert resp.status == 200, await resp.text()
                await resp.read()
            return time.monotonic() - started

        return list(await asyncio.gather(*(one(i) for i in range(count))))


def test_requests_beyond_max_running_wait_in_queue(start: Starter) -> None:
    # Each answer is 100 tokens + <|im_end|> = 101 tokens at 250 tok/s, time scale 1.2: ~0.5 s.
    emu = start(
        "--max-running-requests", "4", "--enable-metrics", "--emu-time-scale", "1.2",
        "--emu-answer-tokens", "100:100",
    )  # fmt: skip
    one = 101 / 250 * 1.2

    async def run() -> tuple[list[float], float]:
        load = asyncio.ensure_future(_concurrent(emu, 8))
        queued = 0.0
        while not load.done():
            queued = max(queued, await asyncio.to_thread(emu.metric, "sglang:num_queue_reqs"))
            await asyncio.sleep(0.05)
        return await load, queued

    latencies, queued = asyncio.run(run())
    assert 1 <= queued <= 4
    # Lower bounds only: a loaded machine makes requests slower, never faster. The second
    # four waited a whole request for a slot.
    latencies.sort()
    assert latencies[0] >= one * 0.95 and latencies[4] >= 2 * one * 0.95, latencies


def test_256_concurrent_requests_are_not_serialised(start: Starter) -> None:
    # 249 answer tokens + <|im_end|> = 250 tokens at 250 tok/s: one simulated second each.
    emu = start(
        "--max-running-requests", "256", "--enable-metrics", "--emu-time-scale", "1",
        "--emu-answer-tokens", "249:249",
    )  # fmt: skip

    async def run() -> tuple[list[float], float]:
        load = asyncio.ensure_future(_concurrent(emu, 256))
        running = 0.0
        while not load.done():
            running = max(running, await asyncio.to_thread(emu.metric, "sglang:num_running_reqs"))
            await asyncio.sleep(0.02)
        return await load, running

    latencies, running = asyncio.run(run())
    assert min(latencies) >= 0.95
    # The server's own count, not a wall-clock bound: each request holds its slot >= 0.95 s,
    # so a sample lands while (nearly) all run at once; a serialising server shows 1.
    assert running >= 64, running


def test_the_template_and_tokenizer_come_from_the_model_directory(tmp_path: Path) -> None:
    """As SGLang: the served template is the model directory's own (a planted mismatch must be
    served as planted); a directory without a usable tokenizer gets the bundled stand-in."""
    from regen.emulator.tokenizer import BUNDLED, ChatTokenizer

    assert ChatTokenizer.load(tmp_path).source == BUNDLED
    own = tmp_path / "own"
    shutil.copytree(MODEL_DIR, own)
    config = json.loads((own / "tokenizer_config.json").read_text())
    config["chat_template"] = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    )
    (own / "tokenizer_config.json").write_text(json.dumps(config))
    served = ChatTokenizer.load(own)
    assert served.source == own
    assert served.render([{"role": "user", "content": "a"}], {}) == "user: a\n"
    (own / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    assert ChatTokenizer.load(own).render([{"role": "user", "content": "b"}], {}) == "b"
