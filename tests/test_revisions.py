"""Input revisions without the flow: the revised plan, what a rerun caches and samples, and a
shard that swaps in only its edited rows (real emulators and dispatcher, local storage)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl

from regen.canary import CanaryFirst, canary_sample, read_canary, send_canary
from regen.config import parse_config
from regen.dataset import (
    InputChanges,
    plan_shards,
    prompts_for_shard,
    read_committed,
    read_manifest,
    revise_plan,
)
from regen.generation.run_plan import RunPlan, plan_run
from regen.generation.shard import generate_shard
from regen.prompts import PromptSet, load_prompts
from regen.rehearsal import bundled
from regen.storage import LocalStorage
from support.emulator import Emulator
from tests.test_dispatcher import dispatcher, emulators


def _write(path: Path, prompts: dict[str, str]) -> Path:
    lines = [
        json.dumps({"id": i, "messages": [{"role": "user", "content": t}]})
        for i, t in prompts.items()
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def _load(tmp_path: Path, prompts: dict[str, str]) -> PromptSet:
    return load_prompts(str(_write(tmp_path / "prompts.jsonl", prompts)))


BASE = {f"r{i}": f"q{i}" for i in range(10)}


def test_a_revised_plan_keeps_shards_appends_new_ids_and_owes_edits(tmp_path: Path) -> None:
    first = plan_shards(_load(tmp_path, BASE), 4)
    assert (first.revision, first.changes) == (1, InputChanges(new=10))
    second = {**{k: v for k, v in BASE.items() if k != "r5"}, "r2": "edited", "n1": "a", "n2": "b"}
    plan = revise_plan(first.assignments, _load(tmp_path, second), 4, 2, committed={0, 1, 2})
    assert (plan.revision, plan.changes) == (2, InputChanges(new=2, changed=1, removed=1))
    assert (plan.num_rows, plan.num_shards) == (11, 4)
    shards = dict(plan.assignments.select("id", "shard").iter_rows())
    assert all(shards[k] == i // 4 for i, k in enumerate(BASE)), "every id keeps its shard"
    assert (shards["n1"], shards["n2"]) == (3, 3), "new ids go after the last shard"
    revised = dict(plan.assignments.select("id", "revision").iter_rows())
    assert [k for k, r in revised.items() if r == 2] == ["r2", "n1", "n2"]
    assert plan.removed_ids.to_list() == ["r5"]
    # Removed before its shard was committed: never generated, nothing to keep.
    unmade = revise_plan(first.assignments, _load(tmp_path, second), 4, 2, committed={0})
    assert unmade.changes.removed == 1 and "r5" not in unmade.assignments["id"].to_list()
    old = first.assignments.filter(pl.col("id") == "r2")["content"].item()
    assert plan.assignments.filter(pl.col("id") == "r2")["content"].item() != old

    # The same input again: no new revision, the plan unchanged.
    again = revise_plan(plan.assignments, _load(tmp_path, second), 4, 3, {0, 1, 2, 3})
    assert (again.revision, again.changes.any()) == (2, False)
    assert again.assignments.equals(plan.assignments)
    # A removed id that comes back unchanged is restored, in its old shard.
    back = revise_plan(plan.assignments, _load(tmp_path, {**second, "r5": "q5"}), 4, 3, {1})
    assert (back.revision, back.changes) == (3, InputChanges(restored=1))
    assert back.removed_ids.len() == 0


def _config(tmp_path: Path, fleet: list[Emulator]) -> Any:
    return parse_config(
        {
            "model": {"source": str(bundled("emulator-model")), "served_name": "m", "stage": False},
            "prompts": str(tmp_path / "prompts.jsonl"),
            "output": str(tmp_path / "out"),
            "work_dir": str(tmp_path / "work"),
            "shard_size": 4,
            "engine": {"kind": "external", "urls": [e.url for e in fleet]},
        },
        "test",
    )


def _generate(plan: RunPlan, fleet: list[Emulator], storage: LocalStorage) -> float:
    """The canary over every pending shard, then each pending shard; requests served."""
    before = _requests(fleet)
    with dispatcher(fleet) as d:
        sample = canary_sample(plan.prompt_cache, plan.pending, 100)
        send_canary(d, storage, plan.fingerprint, sample).collect()
        source = CanaryFirst(d, read_canary(storage, plan.fingerprint))
        for shard in plan.pending:
            generate_shard(shard, plan, source, storage)
    return _requests(fleet) - before


def _requests(fleet: list[Emulator]) -> float:
    return sum(e.metric("sglang:e2e_request_latency_seconds_count") for e in fleet)


def test_a_rerun_sends_only_new_and_edited_rows_and_swaps_the_edits_in(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "out")
    with emulators(tmp_path, 2) as fleet:
        _write(tmp_path / "prompts.jsonl", BASE)
        config = _config(tmp_path, fleet)
        first = plan_run(config, storage)
        assert first.pending == [0, 1, 2]
        # The canary takes every row, the edited one's old answer among them.
        assert _generate(first, fleet, storage) == 10
        before = read_committed(storage).collect()

        second = {**BASE, "r2": "edited", "n1": "a", "n2": "b"}
        _write(tmp_path / "prompts.jsonl", second)
        plan = plan_run(config, storage)
        assert (plan.revision, plan.changes, plan.pending) == (
            2,
            "2 new, 1 changed, 0 removed",
            [0, 3],
        )
        cached = pl.read_parquet(plan.prompt_cache)["id"].to_list()
        assert cached == ["r2", "n1", "n2"], "the cache holds what may be sent, nothing else"
        assert canary_sample(plan.prompt_cache, plan.pending, 100)["id"].to_list() == cached
        assert _generate(plan, fleet, storage) == 3, "each new or edited row once"

    rows = read_committed(storage).collect()
    assert rows.height == 12 and rows["id"].n_unique() == 12
    asked = dict(
        rows.select("id", pl.col("messages").list.first().struct.field("content")).iter_rows()
    )
    assert asked["r2"] == "edited", "the edited prompt's new answer, not the canary's old one"
    same = pl.col("id") != "r2"
    assert rows.filter(same & pl.col("shard").is_in([0, 1, 2])).equals(before.filter(same))
    manifest = read_manifest(storage, 0)
    assert manifest is not None and (manifest.generation, manifest.revision) == (2, 2)
    assert prompts_for_shard(plan.prompt_cache, 1).height == 0


def test_a_revision_cut_short_is_finished_by_the_next_run(tmp_path: Path) -> None:
    """A run of revision 2 that stopped after its new shard (a kill, a lost node): the next
    run, on the same input, records no revision and still owes the edited row."""
    storage = LocalStorage(tmp_path / "out")
    with emulators(tmp_path, 1) as fleet:
        _write(tmp_path / "prompts.jsonl", BASE)
        config = _config(tmp_path, fleet)
        _generate(plan_run(config, storage), fleet, storage)
        _write(tmp_path / "prompts.jsonl", {**BASE, "r6": "edited", "n1": "a"})
        cut = plan_run(config, storage)
        assert cut.pending == [1, 3]
        _generate(cut.model_copy(update={"pending": [3]}), fleet, storage)

        resumed = plan_run(config, storage)
        assert (resumed.revision, resumed.changes, resumed.pending) == (2, "", [1])
        assert _generate(resumed, fleet, storage) == 1
        assert plan_run(config, storage).pending == []

    rows = read_committed(storage).collect()
    assert rows.height == 11 and rows["id"].n_unique() == 11
    first = pl.col("messages").list.first().struct.field("content")
    assert rows.filter(pl.col("id") == "r6").select(first).item() == "edited"
    run = json.loads(storage.read_bytes("run.json"))
    assert [r["revision"] for r in run["revisions"]] == [1, 2]
