"""The features regen stores, captured by the real SGLang 0.5.23 on this CPU through regen's
capture module, equal a transformers forward of the same model on every token: multi-turn
and tool-call rows whose token ids are the bundled template's, an 8-layer tiny Qwen3 (EAGLE-3's
default layers 2, 4, 5 and the final state), bf16 and FP8. The figures are printed for the
closing note (pytest -s)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
import yaml

from regen.dataset import commit_shard
from regen.features.encode import FP8_RELATIVE
from regen.machine.ports import quiet_port_range
from regen.schema import row_schema
from regen.storage import LocalStorage
from regen.tools import normalize_call, template_tools
from support.engine import HANG_GUARD_S, SGLANG_PYTHON, build_tiny_model, engine_config
from tests.support.cli import run_regen
from tests.support.export import synthetic_shard
from tests.support.ids import rendered, response_ids

REPO = Path(__file__).resolve().parents[2]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
CALL = normalize_call(
    {"id": "call_1", "function": {"name": "get_weather", "arguments": {"city": "ten"}}}
)
# bf16 keeps 8 bits of mantissa (2**-9 relative once rounded); the server computes in float16
# on this CPU and the reference in float32, over 8 layers: 2**-6 of the layer's magnitude.
BF16_OF_MAGNITUDE = 2.0**-6


def _multi_turn(i: int) -> list[dict[str, Any]]:
    """Two regenerated turns: the second's prompt holds the first answer, reasoning dropped."""
    first = [{"role": "user", "content": f"first step {i} then sum"}]
    answer = {"role": "assistant", "content": "answer is ten."}
    second = [*first, answer, {"role": "user", "content": "check the value"}]
    return [
        {
            "prompt": rendered(first, True),
            "response": response_ids("let me check", "answer is ten."),
        },
        {"prompt": rendered(second, True), "response": response_ids("the sum", "ten.")},
    ]


def _tool_call(i: int) -> list[dict[str, Any]]:
    """One turn after a tool call and its result, the tools in the system prompt."""
    history = [
        {"role": "user", "content": f"the weather in ten {i}?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "content": '{"temp": 20}', "tool_call_id": "call_1"},
    ]
    tools = template_tools([WEATHER])
    prompt = rendered(history, True, tools=tools)
    return [{"prompt": prompt, "response": response_ids("let me check", "answer is ten.")}]


def _dataset(root: Path) -> LocalStorage:
    """A committed shard of rows whose stored ids are the bundled template's rendering."""
    conversations = [_multi_turn(i) for i in range(3)] + [_tool_call(i) for i in range(3)]
    storage = LocalStorage(root)
    storage.write_bytes("run.json", json.dumps({"fingerprint": "features-engine"}).encode())
    rows = []
    frame = synthetic_shard(0, 0, len(conversations), np.random.default_rng(0), turns=2)
    for row, turns in zip(frame.to_dicts(), conversations, strict=True):
        records = row["turns"][: len(turns)]
        for record, ids in zip(records, turns, strict=True):
            record["prompt_token_ids"], record["response_token_ids"] = (
                ids["prompt"],
                ids["response"],
            )
        rows.append({**row, "turns": records})
    commit_shard(
        storage, 0, pl.DataFrame(rows, schema=row_schema()), fingerprint="features-engine",
        timings={},
    )  # fmt: skip
    return storage


def _capture(tmp_path: Path, model: Path, dtype: str, env: dict[str, str]) -> dict[str, Any]:
    out = tmp_path / dtype
    _dataset(out)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": "x", "prompt": "unused"}\n')
    config = engine_config(
        tmp_path, model, prompts, quiet_port_range(1), engine={"servers": 1},
        features={"dtype": dtype},
    )  # fmt: skip
    config["output"] = str(out)
    config["work_dir"] = str(tmp_path / f"work-{dtype}")
    path = tmp_path / f"{dtype}.yaml"
    path.write_text(yaml.safe_dump(config))
    done = run_regen(["features", "--config", str(path)], env, tmp_path, HANG_GUARD_S)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    check = subprocess.run(
        [str(SGLANG_PYTHON), str(REPO / "support" / "features_check.py"), str(model), str(out)],
        capture_output=True, text=True, timeout=HANG_GUARD_S, check=True,
    )  # fmt: skip
    return json.loads(check.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def deep_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny8"), layers=8)


# One test per dtype, each within the lane's limit: each `regen features` starts its own
# capture server (the dtype is the run's), about two minutes of the lane under load.
@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_stored_features_equal_a_transformers_forward(
    tmp_path: Path, deep_model: Path, regen_env: dict[str, str], dtype: str
) -> None:
    got = _capture(tmp_path, deep_model, dtype, regen_env)
    assert (got["rows"], got["samples"]) == (6, 9)  # 3 two-turn rows, 3 tool-call rows
    diffs = ", ".join(
        f"{k}: {v:.2e} (of |x| <= {got['max_abs_reference'][k]:.2f})"
        for k, v in got["max_abs_diff"].items()
    )
    print(f"\nfeatures against transformers (tiny Qwen3, 8 layers, hidden 64), {dtype}: "
          f"{got['rows']} rows, {got['samples']} samples, {got['tokens']} tokens; "
          f"max abs diff per layer {diffs}")  # fmt: skip
    assert list(got["max_abs_diff"]) == ["2", "4", "5", "final"]
    for layer, diff in got["max_abs_diff"].items():
        magnitude = got["max_abs_reference"][layer]
        if dtype == "bf16":
            assert diff <= BF16_OF_MAGNITUDE * magnitude, (layer, diff, magnitude)
        else:
            # FP8's documented bound (2**-4 of a value, the floor far below it), plus the
            # server's own float16 compute as for bf16.
            bound = (FP8_RELATIVE + BF16_OF_MAGNITUDE) * magnitude
            assert diff <= bound, (layer, diff, magnitude)
