"""Each server at its best concurrency, against real emulators on 127.0.0.1 and the real
dispatcher: the emulator's GPU (a knee, a KV pool that queues and retracts, SGLang's own
limits in /server_info) and the tuner thread that measures every server and sets its slots.

No figure is asserted: what is checked is where the tuner goes (up from its start, within the
server's own cap, further on the server whose knee is later) and that a starved KV pool
changes how long answers take, never what they are.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Sequence
from typing import Any

import polars as pl
import pytest
from pydantic import SecretStr

from regen.client import Dispatcher
from regen.concurrency import Phase, TunerSettings
from regen.concurrency.tuner import ConcurrencyTuner
from regen.config import GenerationConfig, SamplingConfig
from regen.schema import row_schema
from regen.sglang_api.endpoint import Endpoint
from regen.sglang_api.server_info import server_limits
from support.emulator import InProcessEmulator, in_process

MODEL = "emu-model"
KEY = "tuner-key"


def flags(*extra: Sequence[str]) -> list[list[str]]:
    return [
        [
            "--context-length", "4096", "--enable-metrics", "--emu-load-s", "0",
            "--emu-tokens-per-s", "250", "--emu-seed", str(i), "--emu-reasoning-tokens", "0:10",
            *more,
        ]
        for i, more in enumerate(extra)
    ]  # fmt: skip


def get(emu: InProcessEmulator, path: str) -> Any:
    request = urllib.request.Request(emu.url + path, headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(request, timeout=30) as resp:
        return json.loads(resp.read())


def abort_all(emu: InProcessEmulator) -> None:
    request = urllib.request.Request(
        f"{emu.url}/abort_request",
        data=json.dumps({"abort_all": True}).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"},
    )
    urllib.request.urlopen(request, timeout=30).read()


def chat(emu: InProcessEmulator, content: str, max_tokens: int) -> dict[str, Any]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens}  # fmt: skip
    request = urllib.request.Request(
        f"{emu.url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"},
    )
    with urllib.request.urlopen(request, timeout=120) as resp:
        answer: dict[str, Any] = json.loads(resp.read())
    return answer


def prompts(n: int, prefix: str) -> pl.DataFrame:
    ids = [f"{prefix}-{i:05d}" for i in range(n)]
    return pl.DataFrame(
        {"id": ids, "messages": [[{"role": "user", "content": f"question {i}?"}] for i in ids]},
        schema={"id": pl.String, "messages": row_schema()["messages"]},
    )


def test_server_info_reports_the_limits_sglang_resolves() -> None:
    """The running cap as the scheduler resolves it (the flag, capped at half the KV pool; or
    SGLang's own sizing from the pool) and the pool itself, where 0.5.23 puts them."""
    fleet = flags(
        ["--max-running-requests", "48", "--emu-kv-tokens", "50k"],
        ["--emu-kv-tokens", "100000", "--max-total-tokens", "60000"],
        ["--max-running-requests", "900", "--emu-kv-tokens", "1000"],
    )
    with in_process(fleet, served_name=MODEL, api_key=KEY) as (capped, sized, starved):
        info = get(capped, "/server_info")
        assert info["max_running_requests"] == 48 and info["max_total_num_tokens"] == 50_000
        state = info["internal_states"][0]
        assert state["effective_max_running_requests_per_dp"] == 48
        assert state["memory_usage"]["token_capacity"] == 50_000
        # --max-total-tokens lowers the pool; SGLang sizes the cap: 512 per context's worth of
        # KV, clamped to [2048, 4096], at most half the pool.
        info = get(sized, "/server_info")
        assert info["max_running_requests"] is None  # resolved by the scheduler, not the flag
        assert server_limits(info).max_total_num_tokens == 60_000
        assert server_limits(info).max_running_requests == 4096
        assert server_limits(get(starved, "/server_info")).max_running_requests == 500


def test_a_starved_kv_pool_queues_and_retracts_but_answers_the_same() -> None:
    """Twelve long answers at once on a pool that holds a few: the server queues them and
    retracts the youngest when the running ones outgrow it, then recomputes them; every answer
    is the one a roomy server gives, token for token."""
    # Answers of 800-1000 tokens on a pool of 2,500: three fit as admission first reserves
    # (70 % of max_tokens), more once its ratio decays over 600 steps, and those outgrow it.
    answers = ["--emu-answer-tokens", "800:1000", "--emu-seed", "0"]  # one model, two servers
    fleet = flags([*answers, "--emu-kv-tokens", "2500", "--emu-time-scale", "0.1"],
                  [*answers, "--emu-time-scale", "0.01"])  # fmt: skip
    with in_process(fleet, served_name=MODEL, api_key=KEY) as (starved, roomy):
        from concurrent.futures import ThreadPoolExecutor

        texts = [f"long answer {i}" for i in range(12)]
        with ThreadPoolExecutor(12) as pool:
            tight = list(pool.map(lambda t: chat(starved, t, 1000), texts))
        loose = [chat(roomy, t, 1000) for t in texts]
        batch = starved.server.scheduler.batch
        assert batch.retracted_total > 0, "nothing was retracted"
        metrics = urllib.request.urlopen(f"{starved.url}/metrics", timeout=10).read().decode()
        assert "sglang:num_retracted_requests_total" in metrics
        assert 'sglang:realtime_tokens_total{model_name="emu-model",engine_type="unified",' \
               'mode="decode"}' in metrics  # fmt: skip
    for a, b in zip(tight, loose, strict=True):
        assert a["choices"][0]["finish_reason"] == "stop"
        assert a["choices"][0]["message"] == b["choices"][0]["message"]
        assert a["usage"]["completion_tokens"] == b["usage"]["completion_tokens"]


@pytest.mark.slow  # the tuner's own pace: a step per second, a dozen steps to two knees
@pytest.mark.timeout(240)
def test_the_tuner_raises_each_server_to_its_own_knee_within_its_cap() -> None:
    """Two servers, knees at 8 and 32 running requests, both capped at 48 by their own
    --max-running-requests: from 4 in flight each, the tuner climbs both, the later knee
    further, and never past a server's cap."""
    common = ["--max-running-requests", "48", "--emu-answer-tokens", "60:120",
              "--emu-time-scale", "2"]  # fmt: skip
    fleet = flags([*common, "--emu-batch-knee", "8"], [*common, "--emu-batch-knee", "32"])
    with in_process(fleet, served_name=MODEL, api_key=KEY) as emus:
        endpoints = [Endpoint(i, e.url) for i, e in enumerate(emus)]
        caps = {
            e.name: server_limits(get(emu, "/server_info")).max_running_requests or 1
            for e, emu in zip(endpoints, emus, strict=True)
        }
        assert caps == {"server-0": 48, "server-1": 48}
        dispatcher = Dispatcher(
            endpoints,
            api_key=SecretStr(KEY),
            model=MODEL,
            sampling=SamplingConfig(max_tokens=256),
            generation=GenerationConfig(),
            concurrency_per_server=4,
            slot_cap=48,
        )
        settings = TunerSettings(interval_s=1.0, reprobe_every=1000)
        with dispatcher:
            futures = [dispatcher.submit_shard(k, prompts(1500, f"s{k}")) for k in range(4)]
            with ConcurrencyTuner(dispatcher, endpoints, caps, start=4, settings=settings) as tuner:
                deadline = time.monotonic() + 180
                while any(c.phase is not Phase.SETTLED for c in tuner.controllers.values()):
                    assert time.monotonic() < deadline, tuner.last
                    assert dispatcher.stats().queued > 0, "the rows ran out before it settled"
                    time.sleep(0.2)
                levels = tuner.levels()
                slots = {s.name: s.slots for s in dispatcher.stats().servers}
            dispatcher.abort(RuntimeError("test over"))
            for future in futures:
                future.exception()
        for emu in emus:  # a closed connection does not end an emulator's request
            abort_all(emu)
    assert slots == levels  # the dispatcher keeps what the tuner chose
    assert 4 < levels["server-0"] < levels["server-1"] <= 48, (levels, tuner.last)


def test_set_slots_is_bounded_by_the_slot_cap() -> None:
    dispatcher = Dispatcher(
        [Endpoint(0, "http://127.0.0.1:9")],
        api_key=SecretStr(KEY),
        model=MODEL,
        sampling=SamplingConfig(max_tokens=16),
        generation=GenerationConfig(),
        concurrency_per_server=4,
        slot_cap=8,
    )
    dispatcher.set_slots("server-0", 8)
    assert dispatcher.stats().servers[0].slots == 8
    for bad in (0, 9):
        with pytest.raises(ValueError, match=r"slots must be in \[1, 8\]"):
            dispatcher.set_slots(0, bad)
    with pytest.raises(ValueError, match="no server"):
        dispatcher.set_slots("server-7", 2)


def test_the_batch_curve_is_flat_then_rises_and_the_linear_model_stays_reachable() -> None:
    from regen.emulator.args import parse_args
    from regen.emulator.gpu import BatchCurve
    from support.emulator import MODEL_DIR

    curve = BatchCurve(250, 128)
    assert curve.step_s(64) < 1.02 * curve.step_s(1)  # memory-bound: the batch is free
    assert curve.step_s(512) > 3.9 * curve.step_s(1)  # compute-bound: it grows with the batch
    assert curve.throughput(1024) < 1.01 * curve.throughput(512)  # the plateau: knee x speed
    linear = parse_args(["--model-path", str(MODEL_DIR), "--emu-batch-knee", "0"])
    assert linear.batch_knee is None
    flat = BatchCurve(250, linear.batch_knee)
    assert flat.step_s(4096) == flat.step_s(1)  # every request at --emu-tokens-per-s
