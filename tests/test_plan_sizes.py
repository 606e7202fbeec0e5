"""The plan at every size: 0, 1, 2 and many committed shards, each with rows grown, edited and
removed, planned through `plan_run` on real storage (issue 30: a one-shard dataset planned its
new ids into committed shard 0, because `max() or -1` took shard 0 for "no shard").

No fleet: a shard is committed with placeholder rows, which is all the planner reads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pytest

from regen.config import parse_config
from regen.dataset import commit_shard, prompts_for_shard, read_plan
from regen.generation.run_plan import RunPlan, plan_run
from regen.rehearsal import bundled
from regen.schema import row_schema
from regen.storage import LocalStorage

SIZE = 4


@dataclass(frozen=True)
class Case:
    first: int
    """Rows of the first input (`SIZE` a shard)."""
    committed: int
    """Its shards committed before the rerun (the first ones)."""
    grown: int = 0
    edited: int = 0
    removed: int = 0


def _cases() -> list[Case]:
    # Committed shards: 0 (planned, nothing committed), 1, 2 and many; the first input fills
    # its last shard exactly or not; then every kind of change alone and all of them at once.
    shapes = [(4, 0), (3, 1), (4, 1), (8, 2), (7, 2), (40, 10)]
    changes = [(5, 0, 0), (0, 2, 0), (0, 0, 1), (6, 2, 1), (1, 1, 1), (0, 0, 0)]
    return [Case(n, k, *change) for n, k in shapes for change in changes]


def _write(path: Path, case: Case, *, rerun: bool) -> None:
    total = case.first + (case.grown if rerun else 0)
    lines = []
    for i in range(total):
        if rerun and i < case.removed:
            continue  # the first ids leave the input
        edited = rerun and case.removed <= i < case.removed + case.edited
        text = f"question {i}" + (" (edited)" if edited else "")
        message = {"role": "user", "content": text}
        lines.append(json.dumps({"id": f"r{i:03d}", "messages": [message]}))
    path.write_text("\n".join(lines) + "\n")


def _placeholder_rows(ids: list[str], shard: int) -> pl.DataFrame:
    frame = pl.DataFrame({"id": ids, "shard": [shard] * len(ids)})
    schema = row_schema()
    nulls = [pl.lit(None, dtype).alias(name) for name, dtype in schema.items() if name not in frame]
    return frame.with_columns(nulls).select(list(schema)).cast(schema)


def _plan(tmp_path: Path) -> tuple[RunPlan, LocalStorage]:
    config = parse_config(
        {
            "model": {"source": str(bundled("emulator-model")), "served_name": "m", "stage": False},
            "prompts": str(tmp_path / "prompts.jsonl"),
            "output": str(tmp_path / "out"),
            "work_dir": str(tmp_path / "work"),
            "shard_size": SIZE,
            "engine": {"kind": "external", "urls": ["http://127.0.0.1:9"]},
        },
        "test",
    )
    storage = LocalStorage(tmp_path / "out")
    return plan_run(config, storage), storage


@pytest.mark.parametrize("case", _cases(), ids=str)
def test_a_rerun_plans_exactly_the_new_and_edited_rows_at_every_size(
    tmp_path: Path, case: Case
) -> None:
    _write(tmp_path / "prompts.jsonl", case, rerun=False)
    first, storage = _plan(tmp_path)
    first_shards = -(-case.first // SIZE)
    assert (first.num_shards, first.pending) == (first_shards, list(range(first_shards)))
    assert f"in {first_shards} shards of {SIZE}" in first.headline()
    for shard in range(case.committed):
        ids = prompts_for_shard(first.prompt_cache, shard)["id"].to_list()
        commit_shard(
            storage, shard, _placeholder_rows(ids, shard), fingerprint=first.fingerprint, timings={}
        )
    before = read_plan(storage)
    assert before is not None
    old_shard = dict(before.iter_rows())

    _write(tmp_path / "prompts.jsonl", case, rerun=True)
    plan, _ = _plan(tmp_path)

    new_shards = -(-case.grown // SIZE)
    assert plan.num_shards == first_shards + new_shards
    assert plan.committed_shards == case.committed
    assert f"in {plan.num_shards} shards of {SIZE}; {case.committed} committed" in plan.headline()
    after = read_plan(storage, full=True)
    assert after is not None
    shard_of = dict(after.select("id", "shard").iter_rows())
    assert all(shard_of[i] == s for i, s in old_shard.items() if i in shard_of), "ids keep shards"
    new_ids = [f"r{i:03d}" for i in range(case.first, case.first + case.grown)]
    assert [shard_of[i] for i in new_ids] == [first_shards + k // SIZE for k in range(case.grown)]
    # The rows this rerun sends: every row of an uncommitted shard, the edited ones of a
    # committed shard, and nothing of an id that left the input.
    removed = {f"r{i:03d}" for i in range(case.removed)}
    edited = {f"r{i:03d}" for i in range(case.removed, case.removed + case.edited)}
    uncommitted = {i for i, s in shard_of.items() if s >= case.committed and i not in removed}
    expected = uncommitted | {i for i in edited if shard_of[i] < case.committed}
    cached = pl.read_parquet(plan.prompt_cache)
    assert sorted(cached["id"].to_list()) == sorted(expected)
    assert plan.pending == sorted({shard_of[i] for i in expected})
    assert plan.committed_rows == plan.num_rows - len(expected)
    if case.grown or case.edited or case.removed:
        assert plan.changes.startswith(f"{case.grown} new, {case.edited} changed")
    else:
        assert plan.changes == "" and plan.revision == 1
    flagged = set(after.filter("removed")["id"].to_list())
    assert flagged == {i for i in removed if old_shard[i] < case.committed}
