"""The audit on conversations regenerated with `turns: all`: every answer is checked."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from regen.audit import run_audit
from regen.config import AuditConfig
from regen.dataset import commit_shard
from regen.schema import row_schema
from regen.storage import LocalStorage

ANSWER = "the capital of {} is a city with a long history and a busy river port"


def _conversation(i: int, empty_turn: int | None) -> dict[str, object]:
    messages: list[dict[str, str | None]] = []
    turns = []
    for t in (1, 2, 3):
        answer = "" if t == empty_turn else ANSWER.format(f"land {i} {t}") + f" ({i}, {t})"
        messages += [
            {"role": "user", "content": f"question {t} of {i}", "reasoning_content": None},
            {"role": "assistant", "content": answer, "reasoning_content": f"think {i} {t} " * 40},
        ]
        turns.append(
            {"turn": t, "finish_reason": "stop", "prompt_tokens": 20 * t,
             "completion_tokens": 80, "reasoning_tokens": 60, "reasoning_effort": None,
             "server": f"server-{i % 2}", "attempts": 1, "latency_s": 0.5}
        )  # fmt: skip
    last = messages[-1]
    return {
        "id": f"c{i:03d}", "shard": 0, "messages": messages, "content": last["content"],
        "reasoning_content": last["reasoning_content"], "finish_reason": "stop",
        "prompt_tokens": 120, "completion_tokens": 240, "reasoning_tokens": 180,
        "model": "m", "server": f"server-{i % 2}", "attempts": 3, "latency_s": 1.5,
        "error": None, "turns": turns,
    }  # fmt: skip


def test_an_empty_earlier_turn_is_found(tmp_path: Path) -> None:
    """Half the conversations answer turn 2 with nothing; their final answers are fine."""
    storage = LocalStorage(tmp_path)
    rows = [_conversation(i, empty_turn=2 if i % 2 else None) for i in range(40)]
    commit_shard(storage, 0, pl.DataFrame(rows, schema=row_schema()), fingerprint="f", timings={})
    result = run_audit(storage, AuditConfig())
    check = result.check("empty_answer")
    assert check.status == "fail"
    assert check.figure is not None and abs(check.figure - 20 / 120) < 1e-9
    assert {e.id for e in check.examples} <= {f"c{i:03d}#t2" for i in range(1, 40, 2)}
    assert result.rows == 40  # completeness counts conversations, not turns
    assert result.check("error_rows").figure == 0.0
