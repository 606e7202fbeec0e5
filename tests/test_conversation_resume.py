"""kill -9 in the middle of multi-turn conversations, then a rerun: each conversation comes
back whole (every turn, from one run) and once."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import polars as pl
import pytest
import yaml

from regen.dataset import read_committed
from regen.emulator import history_digest
from regen.storage import LocalStorage
from support.chaos import (
    ChaosRun,
    kill_servers,
    local_marks,
    rewritten,
    server_records,
    start_rehearsal,
    wait_until,
    write_chaos_config,
)
from support.dataset import dataset_ids, manifest_keys
from support.prefect import prefect_server

pytestmark = pytest.mark.timeout(600)

CONVERSATIONS = 80
SHARD_SIZE = 10


def _sharegpt(path: Path) -> list[str]:
    ids = [f"conv-{i:03d}" for i in range(CONVERSATIONS)]
    with path.open("w") as out:
        for i, cid in enumerate(ids):
            turns = []
            for t in (1, 2, 3):
                turns += [
                    {"from": "human", "value": f"question {t} of conversation {i}"},
                    {"from": "gpt", "value": "OK."},
                ]
            out.write(json.dumps({"id": cid, "conversations": turns}) + "\n")
    return ids


def test_kill9_mid_conversation_then_rerun_regenerates_each_once(
    tmp_path: Path, prefect_server_home: Path
) -> None:
    ids = _sharegpt(tmp_path / "chats.jsonl")
    work = tmp_path / "work"
    config = write_chaos_config(tmp_path / "regen.yaml", work, shard_size=SHARD_SIZE)
    data = yaml.safe_load(config.read_text())
    config.write_text(yaml.safe_dump({**data, "regeneration": {"turns": "all"}}))
    out = tmp_path / "out"
    run = ChaosRun(config=config, out=str(out), work_dir=work, prompts=tmp_path / "chats.jsonl")
    storage = LocalStorage(out)
    with prefect_server(prefect_server_home, startup_timeout=240) as prefect:
        env = {**prefect.env, "PYTHONUNBUFFERED": "1"}
        first = start_rehearsal(run, env, tmp_path, tmp_path / "attempt-1.log")
        try:
            reached = wait_until(
                lambda: len(manifest_keys(storage)) >= 2, first, timeout_s=300, poll_s=0.05
            )
            log = (tmp_path / "attempt-1.log").read_text(errors="replace")
            assert reached and first.poll() is None, log[-3000:]
            os.kill(first.pid, signal.SIGKILL)
            first.wait(timeout=10)
            before = local_marks(out)
            assert 2 <= len(before) < CONVERSATIONS // SHARD_SIZE, "no conversation was cut"
            second = start_rehearsal(run, env, tmp_path, tmp_path / "attempt-2.log")
            rc = second.wait(timeout=400)
            log = (tmp_path / "attempt-2.log").read_text(errors="replace")
            assert rc == 0, log[-3000:]
        finally:
            kill_servers(server_records(work))
    found = dataset_ids(storage)
    assert sorted(found.ids) == ids, (found.lost(ids), found.doubled())
    assert rewritten(before, local_marks(out)) == [], "a committed shard was generated again"
    rows = read_committed(storage).collect()
    assert rows["error"].null_count() == CONVERSATIONS
    turns = rows["turns"].list.eval(pl.element().struct.field("turn")).to_list()
    assert all(t == [1, 2, 3] for t in turns)
    roles = rows["messages"].list.eval(pl.element().struct.field("role")).to_list()
    assert all(r == ["user", "assistant"] * 3 for r in roles)
    # The original "OK." answers are gone: every answer is the model's own.
    answers = rows["messages"].list.eval(
        pl.element()
        .filter(pl.element().struct.field("role") == "assistant")
        .struct.field("content")
    )
    assert answers.explode().is_in(["OK."]).sum() == 0
    # Each answer was generated on the regenerated history before it (the emulator tags an
    # answer with the digest of the messages it was sent).
    for messages in rows["messages"].to_list():
        for at in (1, 3, 5):
            seen = [{"role": m["role"], "content": m["content"]} for m in messages[:at]]
            # Unstripped, as SGLang's Qwen3 parser returns it after </think>.
            assert messages[at]["content"].startswith(f"\n\n[history:{history_digest(seen)}]")
