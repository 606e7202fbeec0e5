"""`regen estimate`: the plan's answers and max_tokens at a per-GPU rate, given or measured by
the fleet benchmark, as hours on N GPUs and the output's size (regen check's estimate)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl
import pytest
import yaml

from flows.cli import main
from regen.config import load_config
from regen.fleet.report import FleetRow, write_fleet_report
from regen.preflight.space import BYTES_PER_TOKEN, PromptFigures, first_estimate
from regen.prompts import load_prompts
from regen.rehearsal import bundled
from regen.storage import LocalStorage


def _config(tmp_path: Path, prompts: Path, **extra: object) -> Path:
    data = {
        "model": {"source": "/models/q", "served_name": "q", "stage_dir": str(tmp_path / "s")},
        "engine": {"gpus": [0, 1, 2, 3, 4, 5, 6, 7]},
        "prompts": str(prompts),
        "output": str(tmp_path / "out"),
        **extra,
    }
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, str], str]:
    code = main(["estimate", *args])
    out, err = capsys.readouterr()
    lines = dict((k, v.strip()) for k, v in (line.split(":", 1) for line in out.splitlines()))
    return code, lines, err


def test_hours_on_n_gpus_from_the_plan_and_a_given_rate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path, bundled("sample_prompts.jsonl"), sampling={"max_tokens": 3000})
    args = ["-c", str(config), "--tok-s-per-gpu", "2000", "--gpus", "1", "--gpus", "8"]
    code, lines, err = _run([*args, "--mean-tokens", "1000"], capsys)
    assert code == 0, err
    assert lines["plan"] == "240 prompts (0 rejected), 240 answers, max_tokens 3,000"
    # 240 x 3,000 = 720,000 tokens at most; 240,000 at 1,000 an answer.
    assert lines["tokens"] == (
        "about 240k at 1,000 tokens an answer; at most 720,000 output tokens (every answer at "
        "max_tokens)"
    )
    assert lines["rate"] == "2,000 output tok/s per GPU (given)"
    # 720,000 / 2,000 = 360 s on one GPU. The time at a rate, which is an estimate, is not a
    # bound: only the tokens are said `at most` (every answer, tool loop steps included).
    assert lines["1 GPU"] == "about 2.00 min; 6.00 min with every answer at max_tokens"
    assert lines["8 GPUs"] == "about 15.0 s; 45.0 s with every answer at max_tokens"
    assert [label for label, text in lines.items() if "at most" in text] == ["tokens"]
    # The size is regen check's estimate, one owner: max_tokens x 8 B a row, and the prompts'
    # text stored once as text and once as token ids (4 B per 3 B of text). An estimate.
    valid = load_prompts(str(bundled("sample_prompts.jsonl"))).valid
    figures = PromptFigures.of(valid, "last")
    size = first_estimate(load_config(config), figures)
    text = figures.text_bytes
    assert size.size == int(240 * 3000 * BYTES_PER_TOKEN + text * (1 + 4 / 3))
    assert lines["size"] == f"about 5.81 MB (estimated: {size.basis})"
    # Without --gpus: the config's servers (8 GPUs).
    code, lines, _ = _run(["-c", str(config), "--tok-s-per-gpu", "2000"], capsys)
    assert code == 0 and lines["8 GPUs"] == "45.0 s with every answer at max_tokens"


def test_turns_all_counts_an_answer_per_user_turn(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def turn(role: str, text: str) -> dict[str, str]:
        return {"role": role, "content": text}

    rows = [
        {"id": "a", "messages": [turn("user", "1"), turn("assistant", "x"), turn("user", "2")]},
        {"id": "b", "messages": [turn("user", "1")]},
        {"id": "c", "messages": [turn("user", "1"), turn("assistant", "y"), turn("user", "2"),
                                 turn("assistant", "z"), turn("user", "3")]},
    ]  # fmt: skip
    prompts = tmp_path / "chats.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    extra = {"sampling": {"max_tokens": 1000}, "regeneration": {"turns": "all"}}
    config = _config(tmp_path, prompts, **extra)
    code, lines, err = _run(["-c", str(config), "--tok-s-per-gpu", "100", "--gpus", "1"], capsys)
    assert code == 0, err
    assert (
        lines["plan"]
        == "3 prompts (0 rejected), 6 answers (regeneration.turns all), max_tokens 1,000"
    )
    assert lines["1 GPU"] == "60.0 s with every answer at max_tokens"  # 6 x 1,000 / 100
    # 6 answers x 1,000 x 8 B; each turn's prompt stored as ids: the given conversation up to
    # its user message (its answers are the model's now: a: 1 then 2 B of text, b: 1, c: 1, 2,
    # 3), and the earlier answers in it (a: 1, c: 1 + 2) at max_tokens x 4 B; the given text
    # itself once (1 B a user message).
    ids = (1 + 2 + 1 + 1 + 2 + 3) * 4 / 3 + 4 * 1000 * 4
    per_row = (6 * 1000 * 8 + ids + 6) / 3
    assert lines["size"] == (
        f"about 64.0 KB (estimated: {per_row:,.0f} B a row: 2 answers at max_tokens 1,000 x 8 B, "
        f"and {(ids + 6) / 3:,.0f} B of prompt text and its token ids)"
    )
    code, lines, _ = _run(
        ["-c", str(config), "--tok-s-per-gpu", "100", "--gpus", "1"],
        capsys,
    )
    with_last = _config(tmp_path, prompts, sampling={"max_tokens": 1000})
    code, lines, _ = _run(["-c", str(with_last), "--tok-s-per-gpu", "100", "--gpus", "1"], capsys)
    assert lines["plan"] == "3 prompts (0 rejected), 3 answers, max_tokens 1,000"


def test_the_rate_measured_by_the_fleet_benchmark(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    measured = LocalStorage(tmp_path / "measured")

    def row(i: int, **kw: object) -> FleetRow:
        return FleetRow.model_validate(
            {"server": f"server-{i}", "gpu": i, "port": 30000 + i, "url": "http://x", **kw}
        )

    # Three measured servers and one that never came up (no speed): the median of three.
    rows = [row(i, status="healthy", tok_s=s) for i, s in enumerate([900.0, 1000.0, 1100.0])]
    rows.append(row(3, status="exited"))
    write_fleet_report(measured, rows)
    config = _config(tmp_path, bundled("sample_prompts.jsonl"), sampling={"max_tokens": 1000})
    args = ["-c", str(config), "--rate-from", measured.uri, "--gpus", "2"]
    code, lines, err = _run(args, capsys)
    assert code == 0, err
    assert lines["rate"] == (
        f"1,000 output tok/s per GPU (the fleet benchmark's median of 3 servers, {measured.uri})"
    )
    assert lines["2 GPUs"] == "2.00 min with every answer at max_tokens"  # 240,000 / 2,000 = 120 s


def test_bad_rates_are_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _config(tmp_path, bundled("sample_prompts.jsonl"))
    code, _, err = _run(["-c", str(config), "--rate-from", str(tmp_path / "none")], capsys)
    assert code == 2 and re.fullmatch(r"regen: error: .*/none: no report/fleet\.json .*\n", err)
    code, _, err = _run(
        ["-c", str(config), "--tok-s-per-gpu", "9", "--mean-tokens", "5000"], capsys
    )
    assert code == 2 and "over sampling.max_tokens 4,096" in err and err.count("\n") == 1
    with pytest.raises(SystemExit) as exit_:
        main(["estimate", "-c", str(config)])  # no rate at all: argparse's usage error
    assert exit_.value.code == 2
    with pytest.raises(SystemExit):
        main(["estimate", "-c", str(config), "--tok-s-per-gpu", "0"])


def test_the_prompts_weigh_their_tools_and_calls_as_the_run_sends_them(tmp_path: Path) -> None:
    """A row's tools go with each of its prompts; a call the run sends is part of the prompt,
    the trailing unanswered one (the xLAM shape, regenerated: regen.conversations) is not."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    call = {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f"}}]}
    result = {"role": "tool", "content": "ok"}
    rows = [
        {"id": "xlam", "tools": tools, "messages": [{"role": "user", "content": "hi"}, call]},
        {"id": "loop", "tools": tools,
         "messages": [{"role": "user", "content": "hi"}, call, result]},
    ]  # fmt: skip
    path = tmp_path / "tools.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    valid = load_prompts(str(path)).valid
    tools_bytes = len(valid["tools"][0].encode())
    xlam, loop = (
        PromptFigures.of(valid.filter(pl.col("id") == i), "last") for i in ("xlam", "loop")
    )
    assert xlam.text_bytes == xlam.sent_bytes == 2 + tools_bytes  # "hi" and the tools
    assert loop.text_bytes > 2 + 2 + tools_bytes  # the call sent (its JSON), and "ok"
    assert xlam.answers == loop.answers == 1
