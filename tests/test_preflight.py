"""Provisioning checks: each check's ok row and its fail row, fed by real files, ports and
interpreters; GPU rows through a test-side `GpuProbe`, since this machine has no GPU."""

from __future__ import annotations

import shutil
import socket
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from regen.config import RegenConfig, parse_config
from regen.display.figures import sig
from regen.machine.gpus import GpuInfo
from regen.machine.ports import quiet_port_range
from regen.preflight import (
    check_code,
    check_config,
    check_engine,
    check_flags,
    check_gpus,
    check_memory,
    check_model,
    check_ports,
    check_prompts,
    check_stage_space,
    check_storage,
    run_checks,
)
from regen.preflight import engine as preflight_engine
from regen.preflight.report import CheckRow, PreflightReport, print_report
from regen.rehearsal import bundled
from tests.support.cli import run_regen

GB = 10**9
PROMPT = '{"id": "a", "messages": [{"role": "user", "content": "hi"}]}\n'


@dataclass
class StaticGpuProbe:
    """A node's GPUs as a test states them; `error` plays a driver that cannot be reached."""

    devices: list[GpuInfo] = field(default_factory=list)
    error: Exception | None = None

    def gpus(self) -> list[GpuInfo]:
        if self.error is not None:
            raise self.error
        return self.devices


def b200(index: int, free_gb: float = 180, driver: str = "580.82.07") -> GpuInfo:
    return GpuInfo(index, "NVIDIA B200", 183 * GB, int(free_gb * GB), driver)


def make_config(tmp_path: Path, **overrides: Any) -> RegenConfig:
    """A valid emulator config inside tmp_path; `overrides` replace whole top-level sections."""
    prompts = tmp_path / "prompts.jsonl"
    if not prompts.exists():
        prompts.write_text(PROMPT)
    data: dict[str, Any] = {
        "model": {"source": str(bundled("emulator-model")), "served_name": "m", "stage": False},
        "prompts": str(prompts),
        "output": str(tmp_path / "out"),
        "engine": {"kind": "emulator", "gpus": [0, 1], "base_port": _free_port()},
    }
    data.update(overrides)
    return parse_config(data, "test")


def _free_port() -> int:
    """The first of two consecutive free ports (others' servers come and go on this machine)."""
    return quiet_port_range(2)


@pytest.fixture
def listening() -> Iterator[int]:
    """A port something really listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


# --- config and flags -------------------------------------------------------------------------


def test_config_ok_and_concurrency_over_server_slots_fails(tmp_path: Path) -> None:
    assert check_config(make_config(tmp_path)).status == "pass"
    row = check_config(make_config(tmp_path, concurrency_per_server=100))
    assert row.status == "fail"
    assert "concurrency_per_server 100 > engine.max_running_requests 64" in row.figure


def test_max_tokens_filling_the_context_fails(tmp_path: Path) -> None:
    engine = {"kind": "emulator", "context_length": 4096}
    row = check_config(make_config(tmp_path, engine=engine, sampling={"max_tokens": 4096}))
    assert row.status == "fail" and "sampling.max_tokens 4096" in row.figure


@pytest.mark.parametrize(
    ("extra", "status", "words"),
    [
        ([], "pass", "2 server commands, 0 extra flags"),
        (["--watchdog-timeout", "600"], "pass", "1 extra flags"),
        (["--cuda-graph-max-bs", "64"], "fail", "--cuda-graph-max-bs was removed in sglang 0.5.23"),
        (["--cuda-graph-max-bs=64"], "fail", "use --cuda-graph-max-bs-decode"),
        (["--api-key", "k"], "fail", "--api-key is set by regen from the config"),
        (["--port", "1"], "fail", "--port is set by regen"),
        (["--disable-cuda-graph"], "warn", "deprecated in sglang 0.5.23: --disable-cuda-graph"),
    ],
)
def test_extra_args(tmp_path: Path, extra: list[str], status: str, words: str) -> None:
    engine = {"kind": "emulator", "gpus": [0, 1], "extra_args": extra}
    row = check_flags(make_config(tmp_path, engine=engine))
    assert row.status == status, row
    assert words in row.figure


def test_api_key_that_reads_as_a_flag_fails(tmp_path: Path) -> None:
    engine = {"kind": "emulator", "api_key": "--log-level"}
    row = check_flags(make_config(tmp_path, engine=engine))
    assert row.status == "fail" and "engine.api_key: must not start with '-'" in row.figure


# --- code -------------------------------------------------------------------------------------


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path]]:
    """A fresh importable package (unique name: sys.modules outlives the test) with a subpackage."""
    name = f"pf_{uuid.uuid4().hex[:10]}"
    root = tmp_path / "src" / name
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text('"""A package."""\n')
    (root / "sub" / "__init__.py").write_text("")
    (root / "sub" / "good.py").write_text("VALUE = 1\n")
    (root / "__main__.py").write_text("raise SystemExit('never imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    yield name, root
    for mod in [m for m in sys.modules if m == name or m.startswith(f"{name}.")]:
        del sys.modules[mod]


def test_code_ok_counts_modules(package: tuple[str, Path]) -> None:
    name, _ = package
    row = check_code([name])
    assert row.status == "pass", row
    assert row.figure == "2 modules compile and import"  # sub, sub.good; __main__ not imported


def test_syntax_error_fails_naming_the_module_and_line(package: tuple[str, Path]) -> None:
    name, root = package
    (root / "sub" / "broken.py").write_text("def f():\n    return (\n")
    row = check_code([name])
    assert row.status == "fail"
    assert f"{name}.sub.broken (broken.py line 2): SyntaxError" in row.figure
    assert row.hint


def test_syntax_error_in_main_is_found_though_never_imported(package: tuple[str, Path]) -> None:
    name, root = package
    (root / "__main__.py").write_text("print('x'\n")
    row = check_code([name])
    assert row.status == "fail" and f"{name}.__main__ (__main__.py line 1)" in row.figure


def test_import_error_and_broken_subpackage_are_named(package: tuple[str, Path]) -> None:
    name, root = package
    (root / "uses_missing.py").write_text("from regen.config import NoSuchThing\n")
    (root / "other").mkdir()
    (root / "other" / "__init__.py").write_text("raise RuntimeError('boom at import')\n")
    row = check_code([name])
    assert row.status == "fail"
    assert f"{name}.uses_missing: ImportError" in row.figure
    assert f"{name}.other: RuntimeError: boom at import" in row.figure


def test_missing_package_fails(tmp_path: Path) -> None:
    row = check_code(["pf_no_such_package_here"])
    assert row.status == "fail" and "pf_no_such_package_here: ModuleNotFoundError" in row.figure


# --- model, prompts, storage ------------------------------------------------------------------


def test_model_ok_missing_files_and_missing_dir(tmp_path: Path) -> None:
    assert check_model(make_config(tmp_path)).status == "pass"
    model = tmp_path / "model"
    shutil.copytree(bundled("emulator-model"), model)
    (model / "config.json").unlink()
    cfg = make_config(tmp_path, model={"source": str(model), "served_name": "m"})
    row = check_model(cfg)
    assert row.status == "fail" and f"{model}: missing config.json" in row.figure
    cfg = make_config(tmp_path, model={"source": str(tmp_path / "nope"), "served_name": "m"})
    assert "model directory does not exist" in check_model(cfg).figure


def test_remote_model_is_left_to_staging(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, model={"source": "s3://b/models/m", "served_name": "m"})
    assert check_model(cfg).status == "skipped"


def test_prompts_ok_warn_and_fail(tmp_path: Path) -> None:
    assert (
        check_prompts(make_config(tmp_path)).figure == "1 of 1 rows valid (messages 1; whole file)"
    )
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(PROMPT + '{"id": "b", "messages": "hello"}\n')
    row = check_prompts(make_config(tmp_path, prompts=str(mixed)))
    assert row.status == "warn" and "1 of 2 rows valid (messages 1; whole file)" in row.figure
    formats = tmp_path / "formats.jsonl"
    formats.write_text(
        PROMPT
        + '{"id": "b", "prompt": "hi"}\n{"id": "c", "prompt": "yo"}\n'
        + '{"id": "d", "conversations": [{"from": "human", "value": "hey"}]}\n'
    )
    row = check_prompts(make_config(tmp_path, prompts=str(formats)))
    assert (row.status, row.figure) == (
        "pass",
        "4 of 4 rows valid (messages 1, prompt 2, sharegpt 1; whole file)",
    )
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "b", "messages": "hello"}\n')
    row = check_prompts(make_config(tmp_path, prompts=str(bad)))
    assert row.status == "fail" and str(bad) in row.figure and "line" not in row.hint
    row = check_prompts(make_config(tmp_path, prompts=str(tmp_path / "gone.jsonl")))
    assert row.status == "fail" and "gone.jsonl: prompt file not found" in row.figure


def test_storage_ok_and_unwritable(tmp_path: Path) -> None:
    row = check_storage(make_config(tmp_path))
    assert row.status == "pass" and "writable" in row.figure
    assert not list((tmp_path / "out").iterdir()), "the probe object was left behind"
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    # Root ignores permission bits; a path under a regular file is unwritable for anyone.
    cfg = make_config(tmp_path, output=str(blocker / "out"))
    with pytest.raises(Exception, match="not writable"):
        check_storage(cfg)
    row = next(r for r in run_checks(cfg, packages=[]).rows if r.name == "storage")
    assert row.status == "fail" and f"{blocker / 'out'}: not writable" in row.figure


def test_storage_row_probes_the_output_the_run_opened(tmp_path: Path) -> None:
    """A run hands its own opened storage in, so the output is opened once, not per stage."""
    from regen.storage import open_storage

    opened = open_storage(str(tmp_path / "opened"))
    cfg = make_config(tmp_path)
    rows = run_checks(cfg, packages=[], open_output=lambda: opened).rows
    row = next(r for r in rows if r.name == "storage")
    assert row.status == "pass" and row.figure.startswith(f"{opened.uri} writable and readable")
    assert " free; the run still writes about " in row.figure  # a full disk stops a run


def _prompts(tmp_path: Path, rows: int) -> str:
    path = tmp_path / f"prompts-{rows}.jsonl"
    lines = [
        f'{{"id": "p{i}", "messages": [{{"role": "user", "content": "q{i}"}}]}}'
        for i in range(rows)
    ]
    path.write_text("\n".join(lines))  # no final line end: the last line counts all the same
    return str(path)


def _estimate_config(tmp_path: Path, rows: int, max_tokens: int) -> RegenConfig:
    return make_config(
        tmp_path, prompts=_prompts(tmp_path, rows), sampling={"max_tokens": max_tokens}
    )


def test_storage_row_estimates_the_output_from_max_tokens_when_nothing_is_committed(
    tmp_path: Path,
) -> None:
    """Before, the row said only the free space: whether the run fits was left to the disk-full
    stop, GPU hours later. 3 prompts x 4,096 max_tokens x 8 B a token is 98.3 KB, and each
    prompt's 2 B of text is stored once as text and once as token ids (4 B per 3 B of text)."""
    from regen.preflight.space import BYTES_PER_TOKEN

    row = check_storage(_estimate_config(tmp_path, rows=3, max_tokens=4096))
    assert row.status == "pass", row
    per_row = 4096 * BYTES_PER_TOKEN + 2 + 2 * 4 / 3
    assert f"the run still writes about {sig(3 * per_row / 1000)} KB" in row.figure, row.figure
    assert (
        f"(estimated: 3 rows x {per_row:,.0f} B a row: 1 answer at max_tokens 4,096 x "
        f"{BYTES_PER_TOKEN} B, and 5 B of prompt text and its token ids)"
    ) in row.figure


@pytest.mark.parametrize(("share", "status"), [(0.8, "warn"), (2.0, "fail")])
def test_storage_row_warns_below_one_and_a_half_estimates_and_fails_below_one(
    tmp_path: Path, share: float, status: str
) -> None:
    """The estimate set against this disk's real free space: 0.8 of it leaves less than the
    1.5x headroom (warn); twice it cannot fit (fail), before a GPU is rented."""
    from regen.preflight.space import BYTES_PER_TOKEN

    free = shutil.disk_usage(tmp_path).free
    cfg = _estimate_config(tmp_path, rows=1, max_tokens=int(free * share / BYTES_PER_TOKEN))
    row = check_storage(cfg)
    assert row.status == status, row
    assert " free; the run still writes about " in row.figure and "full disk" in row.hint


def test_storage_row_takes_bytes_per_row_from_the_committed_shards(tmp_path: Path) -> None:
    """A resumed output: what its shards really take a row, times the rows not yet committed,
    not the max_tokens default (here a thousand times larger)."""
    import polars as pl

    from regen.dataset import commit_shard, config_fingerprint
    from regen.dataset.keys import RUN_KEY
    from regen.schema import row_schema
    from regen.storage import LocalStorage

    cfg = _estimate_config(tmp_path, rows=10, max_tokens=1_000_000)
    storage = LocalStorage(tmp_path / "out")
    digest, _ = config_fingerprint(cfg)
    storage.write_bytes(RUN_KEY, f'{{"fingerprint": "{digest}"}}'.encode())
    n, answer = 2, uuid.uuid4().hex * 20
    rows = pl.DataFrame(
        {
            "id": ["p0", "p1"],
            "shard": [0] * n,
            "messages": [[{"role": "user", "content": "q"}]] * n,
            "content": [answer] * n,
            "reasoning_content": [answer] * n,
            "finish_reason": ["stop"] * n,
            "prompt_tokens": [3] * n,
            "completion_tokens": [100] * n,
            "reasoning_tokens": [50] * n,
            "model": ["m"] * n,
            "server": ["server-0"] * n,
            "attempts": [1] * n,
            "latency_s": [0.1] * n,
            "error": [None] * n,
            "turns": [[]] * n,
            "sampling": [None] * n,
            "tools": [None] * n,
        },
        schema=row_schema(),
    )
    commit_shard(storage, 0, rows, fingerprint=digest, timings={})
    size = sum(p.stat().st_size for p in (tmp_path / "out" / "shards").glob("*.parquet"))
    row = check_storage(cfg)
    assert row.status == "pass", row
    assert f"(estimated: 8 rows x {size / 2:,.0f} B a row in 1 committed shards)" in row.figure, (
        row.figure
    )


def test_storage_row_on_s3_says_free_space_is_not_checked(tmp_path: Path) -> None:
    """S3 has no free space to read: the row says so rather than judging a local disk."""
    from support.s3 import moto_server

    with moto_server() as moto:
        bucket = moto.create_bucket("regen-space")
        storage = moto.storage(bucket, "out")
        row = check_storage(make_config(tmp_path), open_output=lambda: storage)
    assert row.status == "pass", row
    assert "free space not checked (object storage has none to read)" in row.figure, row.figure


# --- engine: real interpreters, one with a fake sglang ----------------------------------------


def fake_interpreter(tmp_path: Path, body: str | None, version: str | None = None) -> Path:
    """`venv/bin/python`: this interpreter, with an `sglang` package of `version` on its path.

    `body` replaces the script entirely (a hanging or broken interpreter).
    """
    site = tmp_path / "site"
    if version is not None:
        (site / "sglang").mkdir(parents=True)
        (site / "sglang" / "__init__.py").write_text(f'__version__ = "{version}"\n')
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(body or f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    return python


def sglang_config(tmp_path: Path, python: Path | str) -> RegenConfig:
    return make_config(tmp_path, engine={"kind": "sglang", "python": str(python)})


def test_emulator_engine_ok(tmp_path: Path) -> None:
    row = check_engine(make_config(tmp_path))
    assert row.status == "pass" and row.figure.startswith("regen.emulator ok in")


def test_known_sglang_version_ok(tmp_path: Path) -> None:
    row = check_engine(sglang_config(tmp_path, fake_interpreter(tmp_path, None, "0.5.23")))
    assert row.status == "pass", row
    assert row.figure.startswith("sglang 0.5.23 in")


def test_unknown_sglang_version_fails(tmp_path: Path) -> None:
    row = check_engine(sglang_config(tmp_path, fake_interpreter(tmp_path, None, "0.4.6")))
    assert row.status == "fail"
    assert "sglang 0.4.6" in row.figure and "0.5.23" in row.hint


def test_interpreter_without_sglang_fails(tmp_path: Path) -> None:
    row = check_engine(sglang_config(tmp_path, fake_interpreter(tmp_path, None)))
    assert row.status == "fail"
    assert "import sglang failed: ModuleNotFoundError" in row.figure


def test_missing_interpreter_fails(tmp_path: Path) -> None:
    row = check_engine(sglang_config(tmp_path, tmp_path / "no-venv" / "bin" / "python"))
    assert row.status == "fail" and "not found" in row.figure and "engine.python" in row.hint


def test_slow_import_fails_with_the_network_fs_hint(tmp_path: Path) -> None:
    # exec: the shell becomes the sleep, so the timeout's kill reaches it and no pipe stays open.
    python = fake_interpreter(tmp_path, "#!/bin/sh\nexec sleep 30\n")
    row = check_engine(sglang_config(tmp_path, python), import_timeout_s=0.5)
    assert row.status == "fail" and "took over" in row.figure and "network" in row.hint


def test_a_slow_import_warns_and_the_run_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slow CPU or disk is no reason to refuse a run: only no answer at all fails."""
    monkeypatch.setattr(preflight_engine, "SLOW_IMPORT_S", 0.0)
    row = check_engine(sglang_config(tmp_path, fake_interpreter(tmp_path, None, "0.5.23")))
    assert row.status == "warn" and row.figure.endswith(": slow") and "network" in row.hint


def test_one_start_of_engine_python_answers_the_flags_and_engine_rows(tmp_path: Path) -> None:
    """Each start imports sglang (10-25 s on a small CPU): a preflight pays it once."""
    fake_interpreter(tmp_path, None, "0.5.23")
    starts = tmp_path / "starts"
    python = tmp_path / "venv" / "bin" / "python"
    python.write_text(f"#!/bin/sh\necho >> {starts}\n" + python.read_text().split("\n", 1)[1])
    rows = {r.name: r for r in run_checks(sglang_config(tmp_path, python), packages=[]).rows}
    assert rows["engine"].status == "pass" and rows["engine"].figure.startswith("sglang 0.5.23")
    # This sglang has no server parser: the vendored flags judge, from the same start.
    assert rows["flags"].status == "pass" and "vendored 0.5.23 flags" in rows["flags"].figure
    assert starts.read_text().count("\n") == 1


def test_external_engine_skips(tmp_path: Path) -> None:
    engine = {"kind": "external", "urls": ["http://127.0.0.1:1"]}
    assert check_engine(make_config(tmp_path, engine=engine)).status == "skipped"


# --- GPUs, through a probe the test states ----------------------------------------------------


def gpu_config(tmp_path: Path, gpus: list[int]) -> RegenConfig:
    return make_config(tmp_path, engine={"kind": "sglang", "gpus": gpus})


def test_gpus_ok_reports_count_and_driver(tmp_path: Path) -> None:
    probe = StaticGpuProbe([b200(0), b200(1), b200(2)])
    row = check_gpus(gpu_config(tmp_path, [0, 2]), probe, model_bytes=52 * GB)
    assert row.status == "pass"
    assert row.figure == "2 of 3 GPUs, driver 580.82.07"


def test_too_few_gpus_fails_naming_the_missing_index(tmp_path: Path) -> None:
    probe = StaticGpuProbe([b200(0), b200(1)])
    row = check_gpus(gpu_config(tmp_path, [0, 1, 6]), probe, model_bytes=None)
    assert row.status == "fail" and row.figure == "GPU [6] not present (2 found)"


def test_no_gpus_at_all_fails(tmp_path: Path) -> None:
    row = check_gpus(gpu_config(tmp_path, [0]), StaticGpuProbe([]), model_bytes=None)
    assert row.status == "fail" and "(0 found)" in row.figure


def test_too_little_free_memory_fails_naming_the_gpu(tmp_path: Path) -> None:
    # 0.88 x 183 GB = 161 GB must be free for the server's static pool.
    probe = StaticGpuProbe([b200(0), b200(1, free_gb=40)])
    row = check_gpus(gpu_config(tmp_path, [0, 1]), probe, model_bytes=52 * GB)
    assert row.status == "fail"
    assert "GPU 1: 40.0 GB free < 161 GB needed" in row.figure
    assert "GPU 0" not in row.figure.split(";", 1)[1]
    assert "nvidia-smi" in row.hint


def test_model_larger_than_gpu_memory_fails(tmp_path: Path) -> None:
    probe = StaticGpuProbe([b200(0)])
    row = check_gpus(gpu_config(tmp_path, [0]), probe, model_bytes=170 * GB)
    assert row.status == "fail" and "GPU 0: model 170 GB >= static pool 161 GB" in row.figure


def test_unreachable_driver_fails(tmp_path: Path) -> None:
    probe = StaticGpuProbe(error=RuntimeError("NVML: Driver Not Loaded"))
    row = check_gpus(gpu_config(tmp_path, [0]), probe, model_bytes=None)
    assert row.status == "fail" and row.figure == "NVML: Driver Not Loaded"
    assert "driver" in row.hint


def test_emulator_needs_no_gpu(tmp_path: Path) -> None:
    probe = StaticGpuProbe(error=AssertionError("an emulator run must not probe GPUs"))
    row = check_gpus(make_config(tmp_path), probe, model_bytes=None)
    assert row.status == "skipped" and row.figure == "not needed (emulator)"


# --- ports, stage dir, ram --------------------------------------------------------------------


def test_ports_free_and_taken(tmp_path: Path, listening: int) -> None:
    assert check_ports(make_config(tmp_path)).status == "pass"
    engine = {"kind": "emulator", "gpus": [0, 1], "base_port": listening}
    row = check_ports(make_config(tmp_path, engine=engine))
    assert row.status == "fail" and row.figure.startswith(f"in use: [{listening}")


def test_stage_space_ok_fail_and_skip(tmp_path: Path) -> None:
    model = {"source": "s3://b/m", "served_name": "m", "stage_dir": str(tmp_path / "stage" / "m")}
    cfg = make_config(tmp_path, model=model)
    row = check_stage_space(cfg, model_bytes=10**6)
    assert row.status == "pass" and str(tmp_path / "stage" / "m") in row.figure
    row = check_stage_space(cfg, model_bytes=10**18)
    assert row.status == "fail" and "needs 1,000 PB" in row.figure and "free" in row.figure
    assert check_stage_space(cfg, model_bytes=None).status == "skipped"
    assert check_stage_space(make_config(tmp_path), model_bytes=10**6).status == "skipped"


def test_ram_row(tmp_path: Path) -> None:
    row = check_memory(make_config(tmp_path))
    assert row.status in ("pass", "warn") and "GB available of" in row.figure


# --- the whole table --------------------------------------------------------------------------

ALL_ROWS = [
    "config", "flags", "code", "model", "prompts", "storage",
    "engine", "gpus", "ports", "stage dir", "ram",
]  # fmt: skip


def test_every_check_runs_when_several_fail(tmp_path: Path, listening: int) -> None:
    cfg = make_config(
        tmp_path,
        prompts=str(tmp_path / "missing.jsonl"),
        concurrency_per_server=500,
        engine={
            "kind": "sglang",
            "gpus": [0, 1],
            "base_port": listening - 1,
            "python": str(tmp_path / "nope" / "python"),
            "extra_args": ["--cuda-graph-max-bs", "8"],
        },
    )
    probe = StaticGpuProbe(error=ValueError("a probe bug, not a driver error"))
    report = run_checks(cfg, probe, packages=["pf_no_such_package_either"])
    assert [r.name for r in report.rows] == ALL_ROWS
    failed = {r.name for r in report.failures()}
    assert failed == {"config", "flags", "code", "prompts", "engine", "gpus", "ports"}
    assert not report.ok
    gpus = next(r for r in report.rows if r.name == "gpus")
    assert gpus.figure == "a probe bug, not a driver error"  # a check that raised is a row
    summary = report.summary()
    for name in failed:
        assert f"{name}: " in summary


def test_clean_report_is_ok(tmp_path: Path, package: tuple[str, Path]) -> None:
    report = run_checks(make_config(tmp_path), packages=[package[0]])
    assert report.ok, report.summary()
    assert {r.status for r in report.rows} <= {"pass", "skipped", "warn"}


def _write_yaml(path: Path, cfg: RegenConfig) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude={"work_dir"})))
    return path


def test_regen_check_prints_the_table_and_exits_1(
    tmp_path: Path, regen_env: dict[str, str], listening: int
) -> None:
    engine = {"kind": "emulator", "gpus": [0, 1], "base_port": listening}
    cfg = _write_yaml(tmp_path / "c.yaml", make_config(tmp_path, engine=engine))
    proc = run_regen(["check", "--config", str(cfg)], regen_env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "regen provisioning checks" in proc.stdout
    for name in ALL_ROWS:
        assert f"│ {name} " in proc.stdout, name
    assert f"in use: [{listening}" in proc.stdout
    assert proc.stdout.rstrip().endswith("provisioning: FAILED")


def test_regen_check_passes_a_good_config(tmp_path: Path, regen_env: dict[str, str]) -> None:
    """The repo's own code must pass its own code check (regen, tasks, flows, blocks)."""
    cfg = _write_yaml(tmp_path / "c.yaml", make_config(tmp_path))
    proc = run_regen(["check", "--config", str(cfg)], regen_env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.rstrip().endswith("provisioning: ok")


def test_regen_check_refuses_a_mistyped_flag_naming_it(
    tmp_path: Path, regen_env: dict[str, str]
) -> None:
    """A typo in engine.extra_args fails `regen check` before any server starts, as the
    rehearsal's emulator and the real server would at launch (exit 2)."""
    engine = {"kind": "emulator", "gpus": [0], "extra_args": ["--max-runing-requests", "8"]}
    cfg = _write_yaml(tmp_path / "c.yaml", make_config(tmp_path, engine=engine))
    proc = run_regen(["check", "--config", str(cfg)], regen_env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "engine.extra_args[0]: --max-runing-requests" in proc.stdout
    assert "unrecognized arguments" in proc.stdout
    assert not (tmp_path / ".regen" / "logs").exists()  # nothing was launched


def test_the_table_shows_failures_then_warnings_first_in_capitals() -> None:
    """The order is the report's (tasks/setup.py only publishes it): the rows a reader came
    for on top, each group in check order."""
    rows = [
        CheckRow(name="config", status="pass"),
        CheckRow(name="gpus", status="warn", figure="1 of 2 busy"),
        CheckRow(name="model", status="fail", figure="no config.json"),
        CheckRow(name="ports", status="skipped"),
        CheckRow(name="storage", status="fail", figure="denied"),
    ]
    table = PreflightReport(rows=rows).table()
    assert [(r["name"], r["status"]) for r in table] == [
        ("model", "FAIL"),
        ("storage", "FAIL"),
        ("gpus", "WARN"),
        ("config", "pass"),
        ("ports", "skipped"),
    ]


def test_the_verdict_line_names_the_rows_that_warn(capsys: pytest.CaptureFixture[str]) -> None:
    # A warning can foretell a stop (prompts over audit.rejects.fail): "ok" alone hid it.
    rows = [CheckRow(name="config", status="pass"), CheckRow(name="prompts", status="warn")]
    print_report(PreflightReport(rows=rows))
    assert capsys.readouterr().out.splitlines()[-1] == (
        "provisioning: ok, with warnings: prompts (read their fix)"
    )
    print_report(PreflightReport(rows=rows[:1]))
    assert capsys.readouterr().out.splitlines()[-1] == "provisioning: ok"
    print_report(PreflightReport(rows=[CheckRow(name="ports", status="fail"), *rows]))
    assert capsys.readouterr().out.splitlines()[-1] == "provisioning: FAILED"
