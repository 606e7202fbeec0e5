"""The concurrency tuner on the real SGLang 0.5.23 server (this CPU, the tiny random-weight
Qwen3): the server's own limits read from its /server_info where regen reads them, and the
tuner, fed by the server's own /metrics, moving the dispatcher's slots for it from its start
and settling within the server's running cap.

One server launched by regen's fleet code, a few dozen short requests (the tiny model's
planted 16-token answer). Nothing here is timed: the test waits for the tuner to settle (a
hang guard only) and checks where it went, not how fast the CPU served.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest

from regen.concurrency import Phase, TunerSettings
from regen.concurrency.tuner import ConcurrencyTuner
from regen.config import GenerationConfig, SamplingConfig
from regen.machine.ports import quiet_port_range
from regen.schema import row_schema
from regen.sglang_api.endpoint import Endpoint
from regen.sglang_api.server_info import ServerLimits, server_limits
from support.engine import engine_config

CAP = 8  # engine.max_running_requests of support.engine's config: the server's own cap


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[tuple[str, str]]:
    from regen.config import parse_config
    from regen.fleet import build_server_commands, generate_api_key, launch_fleet

    tmp = tmp_path_factory.mktemp("tuner-engine")
    data = engine_config(tmp, tiny_model, tmp / "none.jsonl", quiet_port_range(1),
                         engine={"servers": 1, "max_running_requests": CAP})  # fmt: skip
    config = parse_config(data, "server")
    key = generate_api_key()
    commands = build_server_commands(config, tiny_model, key, tmp / "server-work")
    with launch_fleet(config, commands, key) as fleet:
        yield fleet.endpoints[0].url, key.get_secret_value()


def _limits(url: str, key: str) -> ServerLimits:
    request = urllib.request.Request(
        f"{url}/server_info", headers={"Authorization": f"Bearer {key}"}
    )
    with urllib.request.urlopen(request, timeout=60) as resp:
        return server_limits(json.loads(resp.read()))


def _prompts(n: int) -> pl.DataFrame:
    ids = [f"t-{i:03d}" for i in range(n)]
    return pl.DataFrame(
        {"id": ids, "messages": [[{"role": "user", "content": f"count to {i}"}] for i in ids]},
        schema={"id": pl.String, "messages": row_schema()["messages"]},
    )


def test_the_tuner_moves_a_real_server_from_its_start_and_settles_within_its_cap(
    server: tuple[str, str],
) -> None:
    from pydantic import SecretStr

    from regen.client import Dispatcher

    url, key = server
    limits = _limits(url, key)
    # 0.5.23 reports the cap it resolved (the flag, under half the KV pool) and the pool.
    assert limits.max_running_requests == CAP, limits
    assert limits.max_total_num_tokens and limits.max_total_num_tokens > CAP, limits
    endpoint = Endpoint(0, url)
    dispatcher = Dispatcher(
        [endpoint],
        api_key=SecretStr(key),
        model="tiny",
        sampling=SamplingConfig(max_tokens=24),
        generation=GenerationConfig(),
        concurrency_per_server=2,
        slot_cap=CAP,
    )
    settings = TunerSettings(interval_s=1.0, reprobe_every=10_000)
    with dispatcher:
        shards = [dispatcher.submit_shard(k, _prompts(40)) for k in range(4)]
        caps = {endpoint.name: limits.max_running_requests}
        with ConcurrencyTuner(dispatcher, [endpoint], caps, start=2, settings=settings) as tuner:
            controller = tuner.controllers[endpoint.name]
            deadline = time.monotonic() + 600  # a hang guard, not a budget
            while controller.phase is not Phase.SETTLED:
                assert time.monotonic() < deadline, tuner.changes
                # Rows queued all along, however fast this machine answers: a server with
                # nothing queued has nothing for the tuner to measure.
                if dispatcher.stats().queued < 40:
                    shards.append(dispatcher.submit_shard(len(shards), _prompts(40)))
                time.sleep(0.2)
            level = controller.limit
            slots = dispatcher.stats().servers[0].slots
        dispatcher.abort(RuntimeError("test over"))
        for shard in shards:
            shard.exception()
    moves = [f"{d.previous} -> {d.limit} ({d.reason})" for _, d in tuner.changes]
    print(f"\ntuner on the real server: {moves}")
    assert tuner.changes, "the tuner never moved from its start"
    assert tuner.changes[0][1].previous == 2 and tuner.changes[0][1].limit > 2
    assert 1 <= level <= CAP and slots == level
