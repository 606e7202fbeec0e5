"""`regen features` as a user runs it, on emulators: a kill -9 in the middle of the capture,
then the same command again, which captures exactly what was left, each sample once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from regen.dataset.keys import FEATURE_MANIFESTS_PREFIX
from regen.dataset.reader import read_committed
from regen.features.encode import decode
from regen.features.manifest import FeatureManifest, read_manifests
from regen.features.site import capture_root
from regen.lossmask import samples
from regen.machine.ports import port_is_free
from regen.storage import LocalStorage
from support import REPO
from tests.support.bad_input import free_base_port
from tests.support.cli import run_regen
from tests.support.export import make_export_dataset

MODEL = REPO / "regen" / "data" / "emulator-model"


def _config(tmp_path: Path, base_port: int) -> Path:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": "x", "prompt": "unused: the dataset is made already"}\n')
    config = {
        "model": {"source": str(MODEL), "served_name": "emu-model", "stage": False},
        "prompts": str(prompts),
        "output": str(tmp_path / "ds"),
        "work_dir": str(tmp_path / "work"),
        "engine": {
            "kind": "emulator",
            "device": "cpu",
            "servers": 2,
            "base_port": base_port,
            "python": sys.executable,
            # A slow prefill (100 tokens/s, one request a server): the kill lands mid-capture.
            "extra_args": ["--emu-prefill-tokens-per-s", "100"],
            "emulator": {"time_scale": 1.0},
        },
        "features": {"concurrency_per_server": 1},
    }
    path = tmp_path / "features.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_a_capture_killed_with_sigkill_resumes_each_sample_exactly_once(
    tmp_path: Path, regen_env: dict[str, str]
) -> None:
    dataset = make_export_dataset(tmp_path / "ds", rows=40, shard_size=4, prompt_tokens=30,
                                  response_tokens=20)  # fmt: skip
    base_port = free_base_port()
    config = _config(tmp_path, base_port)
    features = LocalStorage(tmp_path / "ds")
    victim = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "features", "--config", str(config)],
        cwd=tmp_path, env=regen_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while len(features.list(FEATURE_MANIFESTS_PREFIX)) < 2:
            assert victim.poll() is None, victim.stdout.read().decode() if victim.stdout else ""
            assert time.monotonic() < deadline, "no feature shard committed in 180 s"
            time.sleep(0.2)
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(timeout=30)
    finally:
        if victim.poll() is None:
            os.killpg(victim.pid, signal.SIGKILL)
    before = {s: m for s, m in read_manifests(features).items()}
    assert 2 <= len(before) < 10, "the kill landed after the capture was over"

    done = run_regen(["features", "--config", str(config)], regen_env, tmp_path, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"{10 - len(before)} captured by this run" in done.stdout

    after = read_manifests(features)
    assert list(after) == list(range(10))
    # The shards committed before the kill were not captured again: same manifest, same time.
    for shard, manifest in before.items():
        assert after[shard] == manifest
    committed = read_committed(dataset)
    expected = samples(committed.collect(), "each").collect()
    seen = [(e.id, e.turn) for m in after.values() for e in m.samples]
    assert sorted(seen) == sorted(zip(expected["id"], expected["turn"], strict=True))
    assert len(set(seen)) == len(seen) == expected.height
    for manifest in after.values():
        _check_files(features, manifest)
    # The killed run's servers were reaped by the rerun, whose own are stopped, and the
    # capture files the killed run's servers left on the RAM disk are gone with them.
    assert all(port_is_free("127.0.0.1", base_port + i) for i in range(2))
    work = tmp_path / "work"
    assert not [d for d in capture_root(work, "x").parent.glob("*") if _of(d, work)]


def _check_files(storage: LocalStorage, manifest: FeatureManifest) -> None:
    """Every file a manifest names decodes to its sample, and no other file is in its folder."""
    keys = {e.key for e in manifest.samples}
    folder = next(iter(keys)).rsplit("/", 1)[0] + "/"
    assert set(storage.list(folder)) == keys
    for entry in manifest.samples:
        sample = decode(storage.read_bytes(entry.key))
        assert (sample.id, sample.turn, len(sample.input_ids)) == (
            entry.id,
            entry.turn,
            entry.tokens,
        )


def _of(directory: Path, work_dir: Path) -> bool:
    """A capture dir of a run whose work dir is `work_dir`."""
    try:
        return json.loads((directory / "owner.json").read_text())["work_dir"] == str(work_dir)
    except (OSError, ValueError, KeyError):
        return False
