"""A prompt set named by a glob or a prefix: its files read as one set, in name order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from regen.errors import UserError
from regen.prompts import load_prompts, preview


def _file(path: Path, ids: list[str], extra: str = "") -> None:
    lines = [json.dumps({"id": i, "prompt": f"question {i}"}) for i in ids]
    path.write_text("\n".join(lines) + "\n" + extra)


def test_a_glob_reads_its_files_in_name_order_as_one_set(tmp_path: Path) -> None:
    _file(tmp_path / "b.jsonl", ["b1", "a2"], extra="{not json\n")
    _file(tmp_path / "a.jsonl", ["a1", "a2", "a3"])
    (tmp_path / "notes.txt").write_text("not prompts")
    spec = f"{tmp_path}/*.jsonl"
    found = load_prompts(spec)
    assert found.path == spec and found.valid["id"].to_list() == ["a1", "a2", "a3", "b1"]
    reasons = dict(found.rejects.select("id", "reason").iter_rows())
    assert reasons["a2"] == f"{tmp_path}/b.jsonl: duplicate id (first in {tmp_path}/a.jsonl line 2)"
    assert any(r.startswith(f"{tmp_path}/b.jsonl: ") for i, r in reasons.items() if i != "a2")
    assert found.formats == {"prompt": 5}  # counted per file, before ids are compared

    # A prefix takes every prompt file under it; a file added later sorts after the others.
    _file(tmp_path / "c.jsonl", ["c1"])
    grown = load_prompts(f"{tmp_path}/")
    assert grown.valid["id"].to_list() == ["a1", "a2", "a3", "b1", "c1"]
    assert grown.fingerprint != found.fingerprint
    assert load_prompts(f"{tmp_path}/").fingerprint == grown.fingerprint
    assert preview(spec).valid == 3  # the first file only: cheap before the GPUs


def test_a_glob_that_matches_nothing_names_itself(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"\*\.parquet: no prompt files match"):
        load_prompts(f"{tmp_path}/*.parquet")
