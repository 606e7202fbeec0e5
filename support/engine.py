"""The real SGLang server on this CPU, as tests/engine/ and benches drive it: the venv that
serves it (`make engine-env`: .venv-sglang with the server's imports and the sgl_kernel
stand-in), the tiny model it serves (support/tiny_model.py) and a config that points regen's
own flow at both."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from support.driver import REPO, required
from support.tiny_model import build as build_tiny_model

__all__ = [
    "HANG_GUARD_S",
    "MISSING",
    "SERVER_ARGS",
    "SGLANG_PYTHON",
    "TEST_TIMEOUT_S",
    "build_tiny_model",
    "engine_config",
    "env_ready",
    "required",
]

SGLANG_PYTHON = REPO / ".venv-sglang" / "bin" / "python"
MISSING = "engine tests skipped: no .venv-sglang that serves on a CPU; build it: make engine-env"
# The lane's one budget per test: its pytest-timeout, its module's fixture included (signal
# method, so finalizers and support/reaper.py stop what it started). Sized from the lane's own
# steps on the 2-core CI machine, loaded by other test runs: the slowest, a run killed -9,
# `regen check` and the rerun (test_real_server.py's `resumed`), took 281 s before its
# start-up costs were cut; a machine three times slower still fits, with room to spare.
TEST_TIMEOUT_S = 1200
# Waits inside a test (a subprocess, a state) are hang guards, never budgets: as long as the
# test's own limit, so pytest-timeout fires first with its stack dump; they matter only with
# pytest-timeout off (`--timeout 0` while debugging).
HANG_GUARD_S = TEST_TIMEOUT_S
# An idle SGLang scheduler polls its sockets in a loop: 40 % of a core per server, measured on
# the 2-core machine at a load of 8, taken from whatever else the lane runs meanwhile (a server
# waiting for its peer to load, a killed run's servers during `regen check`, a server between
# requests). --sleep-on-idle blocks on the same sockets instead (1.3 %); a request wakes it.
SERVER_ARGS = ["--sleep-on-idle"]
# Checks the real server cannot pass on a random-weight model's one planted answer: the text is
# the same 16 tokens for every prompt. Measured and shown, never graded (audit.not_judged).
RANDOM_TEXT_CHECKS = ["answer_collapse", "tiny_length", "loss_mask"]


def env_ready() -> bool:
    """The venv exists and holds the server's stand-in for sgl_kernel (the contract env alone,
    from before the engine lane, has the parser but cannot serve)."""
    return SGLANG_PYTHON.exists() and any(
        (REPO / ".venv-sglang" / "lib").glob("python3*/site-packages/sgl_kernel/__init__.py")
    )


def engine_config(
    tmp: Path, model: Path, prompts: Path, base_port: int, **sections: dict[str, Any]
) -> dict[str, Any]:
    """A config for `regen run` on two real CPU servers over `model`; `sections` are merged
    into its sections (`engine={...}` updates the engine's keys)."""
    config: dict[str, Any] = {
        "model": {"source": str(model), "served_name": "tiny", "stage": False},
        "prompts": str(prompts),
        "output": str(tmp / "out"),
        "work_dir": str(tmp / "work"),
        "shard_size": 20,
        "engine": {
            "kind": "sglang",
            "device": "cpu",
            "servers": 2,
            "python": str(SGLANG_PYTHON),
            "base_port": base_port,
            "context_length": 2048,
            "max_running_requests": 8,
            "speculative": {"enabled": False},  # the tiny model has no MTP head
            "extra_args": list(SERVER_ARGS),
            # A hang guard: two servers start in about a minute on this loaded machine.
            "startup_timeout_s": 900,
            "bench": {"concurrency": 4, "max_tokens": 16, "budget_s": 3},
        },
        "sampling": {"max_tokens": 48},
        "regeneration": {"turns": "all"},
        "generation": {"canary_prompts": 24, "progress_interval_s": 0.5},
        "audit": {"not_judged": RANDOM_TEXT_CHECKS},
    }
    for name, values in sections.items():
        config[name] = {**config.get(name, {}), **values}
    return config


def write_prompts(path: Path, single: int, multi: int, too_long: int) -> list[str]:
    """`single` one-turn prompts, `multi` three-message conversations and `too_long` prompts
    longer than the engine's context; the ids in file order."""
    words = ["let", "me", "check", "the", "first", "step", "then", "sum"]
    words += ["answer", "is", "ten", "value", "number", "result"]
    rows: list[dict[str, Any]] = []
    for i in range(single):
        text = " ".join(words[(i * 7 + k * 3) % len(words)] for k in range(8))
        rows.append({"id": f"p{i:04d}", "messages": [{"role": "user", "content": text}]})
    for i in range(multi):
        turns = [
            {"role": "user", "content": f"first step {words[i % len(words)]}"},
            {"role": "assistant", "content": "the answer"},
            {"role": "user", "content": "then sum"},
        ]
        rows.append({"id": f"m{i:02d}", "messages": turns})
    for i in range(too_long):
        rows.append({"id": f"long{i}", "messages": [{"role": "user", "content": "the " * 3000}]})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return [r["id"] for r in rows]
