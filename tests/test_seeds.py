"""Reproducible rows (issue 48): each turn of a row is sent a sampling seed drawn from the run's
seed, the row id and the turn; every attempt and every hedged copy of the turn carries it, the
turn stores it, the emulator answers by it where SGLang would (`--enable-deterministic-
inference`), and a run's seed is part of its fingerprint unless it is the default."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import polars as pl
import pytest
from aiohttp import web
from aiohttp.typedefs import Handler
from pydantic import SecretStr

from regen.client import Dispatcher, DispatchTuning
from regen.client.seed import turn_seed
from regen.client.tuning import for_run
from regen.config import GenerationConfig, RegenerationConfig, SamplingConfig, parse_config
from regen.dataset.runinfo import config_fingerprint
from regen.errors import ConfigError
from regen.fingerprint import changed_components
from regen.fleet import build_server_commands
from regen.schema import row_schema
from regen.sglang_api.endpoint import Endpoint
from support.emulator import InProcessEmulator, in_process
from tests.support.fleet import MODEL_DIR, fleet_config

MODEL = "emu-model"
KEY = "test-key"
BASE = {"model": {"source": "/m", "served_name": "m"}, "prompts": "p.jsonl", "output": "out"}
_RID = re.compile(r"^(\d+):(.*)/t(\d+)/a(\d+)(/hedge)?;$")


def config(**sections: Any) -> Any:
    return parse_config({**BASE, **sections})


def emulator_flags(
    count: int, *, deterministic: bool = True, extra: dict[int, list[str]] | None = None
) -> list[list[str]]:
    """Servers of one model (one --emu-seed): with `deterministic`, each answers a request by
    its seed, as SGLang 0.5.23 does under --enable-deterministic-inference."""
    return [
        [
            "--max-running-requests", "2", "--context-length", "8192", "--emu-load-s", "0",
            "--emu-tokens-per-s", "250", "--emu-time-scale", "0.02", "--emu-seed", "5",
            "--emu-reasoning-tokens", "0:10", "--emu-answer-tokens", "20:60",
            *(["--enable-deterministic-inference"] if deterministic else []),
            *(extra or {}).get(i, []),
        ]
        for i in range(count)
    ]  # fmt: skip


def rows(count: int, turns: int = 1, prefix: str = "s") -> pl.DataFrame:
    return pl.DataFrame(
        {
            "id": [f"{prefix}-{i:03d}" for i in range(count)],
            "messages": [
                [{"role": "user", "content": f"question {i}.{t}?"} for t in range(turns)]
                for i in range(count)
            ],
        },
        schema={"id": pl.String, "messages": row_schema()["messages"]},
    )


def dispatcher(
    fleet: list[InProcessEmulator],
    *,
    seed: int = 0,
    turns: str = "last",
    tuning: DispatchTuning | None = None,
) -> Dispatcher:
    return Dispatcher(
        [Endpoint(i, e.url) for i, e in enumerate(fleet)],
        api_key=SecretStr(KEY),
        model=MODEL,
        sampling=SamplingConfig(max_tokens=256, seed=seed),
        generation=GenerationConfig(max_attempts=12),
        concurrency_per_server=2,
        regeneration=RegenerationConfig.model_validate({"turns": turns}),
        tuning=tuning or DispatchTuning(retry_backoff_s=0.01),
    )


class Sent:
    """A middleware that keeps (rid, seed) of every chat request a server received."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, int | None]] = []

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path == "/v1/chat/completions":
            body = json.loads(await request.read())
            self.requests.append((body["rid"], body.get("seed")))
        return await handler(request)


# -- the seed -------------------------------------------------------------------------------


def test_a_turns_seed_is_fixed_by_the_run_seed_the_row_and_the_turn() -> None:
    seed = turn_seed(0, "p-1", 1)
    assert seed == turn_seed(0, "p-1", 1) and 0 <= seed < 2**63
    others = {turn_seed(1, "p-1", 1), turn_seed(0, "p-2", 1), turn_seed(0, "p-1", 2)}
    assert seed not in others and len(others) == 3
    # No id, however it is spelled, shares another's seed by concatenation.
    assert turn_seed(0, "p-1", 11) != turn_seed(0, "p-11", 1)


def test_every_attempt_of_a_turn_carries_its_seed_and_the_turn_stores_it() -> None:
    """Conversations of two turns on a server that cuts a fifth of its answers part-way
    (finish_reason abort, retried): each retry is sent the seed of its turn, never another."""
    sent = Sent()
    flags = emulator_flags(1, extra={0: ["--emu-fault", "abort=0.2"]})
    with (
        in_process(flags, served_name=MODEL, api_key=KEY, middlewares=[sent.middleware]) as fleet,
        dispatcher(fleet, seed=7, turns="all") as d,
    ):
        out = d.submit_shard(0, rows(24, turns=2)).result(timeout=120)
    assert out["error"].null_count() == out.height, out["error"].drop_nulls().to_list()
    attempts: dict[tuple[str, int], int] = {}
    for rid, seed in sent.requests:
        found = _RID.match(rid)
        assert found, rid
        row, turn, attempt = found.group(2), int(found.group(3)), int(found.group(4))
        assert seed == turn_seed(7, row, turn), rid
        attempts[row, turn] = max(attempts.get((row, turn), 0), attempt)
    assert max(attempts.values()) > 1, "no turn was retried: the fault did not bite"
    for row, turns in zip(out["id"].to_list(), out["turns"].to_list(), strict=True):
        assert [t["seed"] for t in turns] == [turn_seed(7, row, 1), turn_seed(7, row, 2)]


# -- the emulator answers by the seed where SGLang would ------------------------------------


def _answers(emu: InProcessEmulator, seeds: list[int | None]) -> list[list[int]]:
    import urllib.request

    out = []
    for seed in seeds:
        body: dict[str, Any] = {
            "model": MODEL, "messages": [{"role": "user", "content": "count to ten"}],
            "max_completion_tokens": 128, "return_token_ids": True,
        }  # fmt: skip
        if seed is not None:
            body["seed"] = seed
        request = urllib.request.Request(
            f"{emu.url}/v1/chat/completions", data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=30) as resp:
            out.append(json.loads(resp.read())["choices"][0]["response_token_ids"])
    return out


def test_deterministic_servers_give_the_same_seed_the_same_tokens() -> None:
    with in_process(emulator_flags(2), served_name=MODEL, api_key=KEY) as (one, two):
        a = _answers(one, [11, 11, 12, 13, None])
        b = _answers(two, [11])
    assert a[0] == a[1] == b[0], "the same row, seed and model: the same tokens on any server"
    assert a[2] != a[0] and a[3] != a[0] and a[3] != a[2], "another seed, another draw"
    assert a[4] not in (a[0], a[2], a[3])


def test_without_deterministic_inference_the_seed_is_ignored() -> None:
    """As SGLang 0.5.23 (sampling_batch_info.py passes no seed to the sampler without it)."""
    with in_process(emulator_flags(1, deterministic=False), served_name=MODEL, api_key=KEY) as (
        emu,
    ):
        a = _answers(emu, [11, 12, None])
    assert a[0] == a[1] == a[2]


@pytest.mark.parametrize(
    ("seed", "status"), [("7", 400), (1.5, 400), (True, 400), (2**63, 400), (-(2**63), 200)]
)
def test_the_emulator_refuses_a_seed_sglang_refuses(seed: Any, status: int) -> None:
    import urllib.error
    import urllib.request

    with in_process(emulator_flags(1), served_name=MODEL, api_key=KEY) as (emu,):
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "seed": seed}
        request = urllib.request.Request(
            f"{emu.url}/v1/chat/completions", data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=30) as resp:
                got = resp.status
        except urllib.error.HTTPError as err:
            got = err.code
    assert got == status


# -- a hedged copy is the same draw ---------------------------------------------------------


def _run(fleet: list[InProcessEmulator], frame: pl.DataFrame, tuning: DispatchTuning,
         on_stats: Callable[[Any], None] | None = None) -> pl.DataFrame:  # fmt: skip
    with dispatcher(fleet, seed=3, tuning=tuning) as d:
        out = d.submit_shard(0, frame).result(timeout=120)
        if on_stats is not None:
            on_stats(d.stats())
    return out


def test_a_hedged_row_keeps_the_draw_it_would_have_had_unhedged() -> None:
    """server-0 decodes 50 times slower; once the queue is empty the fast server takes copies
    of its stragglers. Whichever copy answers first, each row holds the tokens a run without
    hedging gives it: the same seed on servers that sample by it is the same draw."""
    frame = rows(24, prefix="h")
    extra = {0: ["--emu-fault", "slow=0.02"]}
    stats: list[Any] = []
    with in_process(emulator_flags(2, extra=extra), served_name=MODEL, api_key=KEY) as fleet:
        hedged = _run(
            fleet,
            frame,
            DispatchTuning(hedge=True, hedge_after=0.0, hedge_min_samples=1),
            stats.append,
        )
        plain = _run(fleet[1:], frame, DispatchTuning(hedge=False))
    assert stats[0].hedged >= 1 and stats[0].hedge_wins >= 1
    tokens = pl.col("turns").list.first().struct.field("response_token_ids")
    columns = ["id", "content", "reasoning_content", "completion_tokens", tokens]
    assert hedged.select(columns).equals(plain.select(columns))
    assert set(hedged["server"]) == {"server-0", "server-1"}


# -- config, argv and fingerprint -----------------------------------------------------------


def test_the_default_seed_keeps_the_fingerprint_and_another_is_another_run() -> None:
    plain = config_fingerprint(config())
    assert "sampling.seed" not in plain[1], "datasets made before seeds resume"
    seeded = config_fingerprint(config(sampling={"seed": 42}))
    assert seeded[0] != plain[0]
    assert changed_components(plain[1], seeded[1]) == ["sampling.seed=unset, this run has 42"]


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        ({"engine": {"deterministic": True, "device": "cpu", "servers": 2}},
         "engine.deterministic needs a GPU"),
        ({"engine": {"deterministic": True}, "sampling": {"min_p": 0.05}},
         "SGLang's seeded sampler takes no min_p"),
        ({"engine": {"deterministic": True},
          "sampling": {"mix": [{"min_p": 0.1, "share": 0.5}, {"share": 0.5}]}},
         "SGLang's seeded sampler takes no min_p"),
        ({"sampling": {"seed": -1}}, "sampling.seed"),
        ({"sampling": {"seed": 2**63}}, "sampling.seed"),
    ],
)  # fmt: skip
def test_seed_settings_sglang_would_refuse_are_refused(
    sections: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        config(**sections)


def test_deterministic_servers_are_launched_with_the_flag(tmp_path: Any) -> None:
    on = fleet_config(tmp_path, 2, kind="sglang", engine={"deterministic": True})
    off = fleet_config(tmp_path, 2, kind="sglang")
    key = SecretStr("k" * 16)
    flag = "--enable-deterministic-inference"
    assert all(flag in c.argv for c in build_server_commands(on, MODEL_DIR, key, tmp_path))
    assert not any(flag in c.argv for c in build_server_commands(off, MODEL_DIR, key, tmp_path))
    own = fleet_config(tmp_path, 1, kind="sglang", engine={"extra_args": [flag]})
    with pytest.raises(ConfigError, match=r"engine\.deterministic: true"):
        build_server_commands(own, MODEL_DIR, key, tmp_path)


@pytest.mark.parametrize(
    ("engine", "hedge", "expected"),
    [
        ({"kind": "emulator"}, "auto", True),
        ({"kind": "sglang"}, "auto", False),
        ({"kind": "sglang", "deterministic": True}, "auto", True),
        ({"kind": "external", "urls": ["http://127.0.0.1:1"]}, "auto", False),
        ({"kind": "sglang"}, "on", True),
        ({"kind": "emulator"}, "off", False),
    ],
)
def test_hedging_is_on_where_a_copy_is_the_same_draw(
    engine: dict[str, Any], hedge: str, expected: bool
) -> None:
    tuning = for_run(config(engine=engine, generation={"hedge": hedge}))
    assert tuning.hedge is expected
