"""A bench cleans up what it started whatever happens: a chaos trial that raises once its
rehearsal's emulators are up (they have sessions of their own, so killing the run is not
enough) leaves none of them, nor any other process of the run, running."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from benches import chaos
from regen.rehearsal import bundled
from support.chaos import (
    ChaosRun,
    ProcessMark,
    descendants,
    leftovers,
    server_records,
    surviving_servers,
    wait_until,
    write_prompt_subset,
)


class Midway(Exception):
    pass


@pytest.mark.timeout(240)
def test_a_chaos_trial_that_raises_midway_leaves_nothing_running(
    tmp_path: Path, regen_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}

    def fleet_up_then_raise(
        phase: str, rng: random.Random, proc: Any, run: ChaosRun, n: int
    ) -> str:
        assert wait_until(lambda: len(server_records(run.work_dir)) >= 2, proc, 180)
        seen["servers"] = server_records(run.work_dir)
        seen["processes"] = descendants(proc.pid)
        raise Midway

    monkeypatch.setattr(chaos, "_kill_moment", fleet_up_then_raise)
    prompts = write_prompt_subset(bundled("sample_prompts.jsonl"), tmp_path / "p.jsonl", 40)
    with pytest.raises(Midway):
        chaos.trial(0, "gen", random.Random(1), tmp_path, regen_env, prompts)
    servers: list[dict[str, Any]] = seen["servers"]
    processes: list[ProcessMark] = seen["processes"]
    assert servers and any(m.kind == "emulator" for m in processes)
    assert surviving_servers(servers, timeout_s=5.0) == []
    assert leftovers(processes, timeout_s=5.0) == []
