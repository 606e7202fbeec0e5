"""What the real SGLang 0.5.23 does with a row's seed on this CPU (issue 48).

A chat request's `seed` reaches the sampler as `sampling_seed` only under
`--enable-deterministic-inference` (sampling_batch_info.py), and 0.5.23 refuses that flag with
the CPU's torch_native attention backend (only ascend, fa3, fa4, flashinfer, intel_xpu and
triton are deterministic): so here the server takes regen's seeded body and samples without
the seed. This lane pins that fact: the same row and seed on the same server give other tokens
twice, which is why regen claims a seed reproduces a row only with `engine.deterministic` (a
GPU), refuses that setting on a CPU, and hedges by default only where a copy is the same draw.
If a later SGLang samples by the seed without the flag, this test fails and says so.

One server, launched by regen's own fleet code (the tiny twin); the requests ignore the end
token and sample at temperature 1 over the whole vocabulary, so past the planted path their
tokens are the random weights' draws.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from regen.client.seed import turn_seed
from regen.config import SamplingConfig
from regen.machine.ports import quiet_port_range
from regen.sglang_api.request import chat_request_body
from support.engine import engine_config

# Past the 16 planted tokens, 48 draws from random weights over the tiny vocabulary.
MAX_TOKENS = 64


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[tuple[str, str]]:
    from regen.config import parse_config
    from regen.fleet import build_server_commands, generate_api_key, launch_fleet

    tmp = tmp_path_factory.mktemp("seed-engine")
    config = parse_config(
        engine_config(tmp, tiny_model, tmp / "none.jsonl", quiet_port_range(1),
                      engine={"servers": 1}),
        "server",
    )  # fmt: skip
    key = generate_api_key()
    commands = build_server_commands(config, tiny_model, key, tmp / "server-work")
    with launch_fleet(config, commands, key) as fleet:
        yield fleet.endpoints[0].url, key.get_secret_value()


def _tokens(url: str, key: str, seed: int) -> list[int]:
    sampling = SamplingConfig(max_tokens=MAX_TOKENS, temperature=1.0, top_p=1.0, top_k=-1)
    body = chat_request_body(
        "tiny", [{"role": "user", "content": "count to ten"}], sampling, rid=None, seed=seed
    )
    body |= {"ignore_eos": True, "return_token_ids": True}
    resp = httpx.post(
        f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"},
        timeout=300,
    )  # fmt: skip
    assert resp.status_code == 200, resp.text
    ids: list[int] = resp.json()["choices"][0]["response_token_ids"]
    assert len(ids) == MAX_TOKENS
    return ids


def test_without_deterministic_inference_a_seed_does_not_repeat_a_row(
    server: tuple[str, str],
) -> None:
    url, key = server
    seed = turn_seed(0, "p0001", 1)
    first, second, third = (_tokens(url, key, seed) for _ in range(3))
    assert len({tuple(first), tuple(second), tuple(third)}) > 1, (
        "SGLang sampled by the seed without --enable-deterministic-inference: a seed now "
        "reproduces a row on this server, so engine.deterministic and generation.hedge: auto "
        "can say so (regen/config/engine.py, regen/client/tuning.py)"
    )
