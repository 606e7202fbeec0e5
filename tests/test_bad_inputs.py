"""The bad-input catalogue: every mistake a user makes gets one line naming the file, row or
key, a non-zero exit and no traceback; nothing already written is damaged.

Three layers answer, and each case goes through the cheapest one that is the real path:
config mistakes through `flows.cli.main` in this process (the very code the console script
runs; two cases also as real subprocesses, exit 2), provisioning mistakes through `run_checks` (the
table `regen check` prints, exit 1 when a row fails), row mistakes through `load_prompts`
(the row is rejected with its line and reason, the run goes on). Two real rehearsals prove
the end-to-end cases: rejected rows do not stop a run, and an output made by another run is
refused with its bytes untouched.
"""

from __future__ import annotations

import json
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from flows.cli import main
from regen.config import parse_config
from regen.dataset import read_committed
from regen.machine.gpus import GpuInfo
from regen.preflight import CheckRow, check_prompts, run_checks
from regen.prompts import load_prompts
from regen.rehearsal import bundled
from regen.storage import LocalStorage
from tests.support.bad_input import (
    Tally,
    Verdict,
    base_config,
    free_base_port,
    rows,
    tree_digest,
    write_yaml,
)
from tests.support.cli import regen_env as cli_env
from tests.support.cli import run_regen

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def tally(request: pytest.FixtureRequest) -> Iterator[Tally]:
    found = Tally()
    yield found
    # The figure for the report; teardown output is captured unless capture is lifted.
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if capture is not None:
        with capture.global_and_fixture_disabled():
            print(f"\n{found.summary()}")


def cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> Verdict:
    """`regen ARGS` in this process: an uncaught exception would fail the test as a traceback."""
    try:
        code = main(args)
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code if isinstance(exc.code, int) else 1
    out = capsys.readouterr()
    return Verdict(code, out.err.strip(), out.out + out.err)


def failed_row(report_rows: list[CheckRow], name: str) -> Verdict:
    """The provisioning row `name` as the verdict; every other row must have passed."""
    failed = [r for r in report_rows if r.status == "fail"]
    assert [r.name for r in failed] == [name], failed
    return Verdict(1, failed[0].figure, failed[0].figure + failed[0].hint)


def preflight(tmp_path: Path, data: dict[str, Any], **kwargs: Any) -> list[CheckRow]:
    # packages=[]: the code check has its own tests; here it would only add seconds.
    return run_checks(parse_config(data, "test"), packages=[], **kwargs).rows


def prompts_row(tmp_path: Path, prompts: Path) -> CheckRow:
    """The provisioning row for the prompts alone: the engine check's interpreter start-up
    (2 s on a busy machine) would multiply by every prompt case and add nothing to it."""
    return check_prompts(parse_config(base_config(tmp_path, prompts=str(prompts)), "test"))


def row_verdict(row: CheckRow) -> Verdict:
    return Verdict(1 if row.status == "fail" else 0, row.figure, row.figure + row.hint)


# --- the config file: `regen check` exits 2 with one line naming file and dotted key ---------

CONFIG_CASES = [
    ("unknown key", {"engine": {"kind": "emulator", "bogus": 1}}, "engine.bogus: unknown key"),
    ("unknown top key", {"shard_sise": 100}, "shard_sise: unknown key"),
    ("wrong type", {"engine": {"base_port": "lots"}}, "engine.base_port: Input should be"),
    ("wrong type list", {"engine": {"gpus": "0,1"}}, "engine.gpus: Input should be a valid list"),
    ("zero shard_size", {"shard_size": 0}, "shard_size: Input should be greater than 0"),
    ("negative shard_size", {"shard_size": -5}, "shard_size: Input should be greater than 0"),
    ("zero max_tokens", {"sampling": {"max_tokens": 0}}, "sampling.max_tokens: Input should be"),
    ("zero concurrency", {"concurrency_per_server": 0}, "concurrency_per_server: Input should"),
    (
        "negative max_running_requests",
        {"engine": {"max_running_requests": -1}},
        "engine.max_running_requests: Input should be greater than or equal to 1",
    ),
    ("port out of range", {"engine": {"base_port": 70000}}, "engine.base_port: Input should be"),
    ("port zero", {"engine": {"base_port": 0}}, "engine.base_port: Input should be"),
    ("GPU index out of range", {"engine": {"gpus": [99]}}, "engine.gpus.0: Input should be"),
    ("GPU listed twice", {"engine": {"gpus": [1, 1]}}, "engine: engine.gpus lists a GPU twice"),
    ("s3 prompts without bucket", {"prompts": "s3:///p.jsonl"}, "prompts: 's3:///p.jsonl' has no"),
    ("s3 output without bucket", {"output": "s3://"}, "output: 's3://' has no bucket name"),
    (
        "0.0.0.0 without api_key",
        {"engine": {"host": "0.0.0.0"}},
        "engine: engine.host 0.0.0.0 is not loopback: set engine.api_key",
    ),
]


@pytest.mark.parametrize(
    ("case", "change", "words"), CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES]
)
def test_config_mistake(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    tally: Tally,
    case: str,
    change: dict[str, Any],
    words: str,
) -> None:
    cfg = write_yaml(tmp_path / "bad.yaml", base_config(tmp_path, **change))
    verdict = cli(["check", "--config", str(cfg)], capsys)
    tally.judge(case, verdict, str(cfg), words)
    assert verdict.code == 2
    assert not (tmp_path / "out").exists(), "a config error must come before any write"


def test_missing_required_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tally: Tally
) -> None:
    data = base_config(tmp_path)
    del data["model"]
    cfg = write_yaml(tmp_path / "bad.yaml", data)
    tally.judge(
        "missing model section", cli(["check", "-c", str(cfg)], capsys), "model: Field required"
    )


@pytest.mark.parametrize(
    ("case", "text", "words"),
    [
        ("invalid YAML", "model: {source: x\nprompts: [\n", "line 2: invalid YAML"),
        ("config is a list", "- model\n- prompts\n", "expected a mapping of settings, got list"),
        ("empty config", "# nothing here\n", "config file is empty"),
        ("config not UTF-8", "model: caf\xe9\n", "cannot read config"),
    ],
)
def test_config_file_mistake(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    tally: Tally,
    case: str,
    text: str,
    words: str,
) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_bytes(text.encode("latin-1"))
    verdict = cli(["check", "--config", str(cfg)], capsys)
    tally.judge(case, verdict, str(cfg), words)
    assert verdict.code == 2


def test_missing_config_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tally: Tally
) -> None:
    verdict = cli(["check", "--config", str(tmp_path / "nope.yaml")], capsys)
    tally.judge("missing config file", verdict, "nope.yaml: config file not found")


def test_as_real_subprocesses(tmp_path: Path, tally: Tally) -> None:
    """Two config cases as a user's shell runs them: the same line and exit 2, from a fresh
    interpreter. Not e2e: a config error stops before Prefect starts (its home stays empty)."""
    regen_env = cli_env(tmp_path / "prefect-home")
    listed = tmp_path / "list.yaml"
    listed.write_text("- a\n- b\n")
    proc = run_regen(["check", "--config", str(listed)], regen_env, cwd=tmp_path, timeout=60)
    tally.judge(
        "config is a list (subprocess)",
        Verdict(proc.returncode, proc.stderr, proc.stdout + proc.stderr),
        "list.yaml: expected a mapping",
    )
    assert proc.returncode == 2
    open_host = write_yaml(tmp_path / "open.yaml", {"engine": {"host": "0.0.0.0"}})
    proc = run_regen(
        ["rehearse", "--config", str(open_host), "--out", "out"],
        regen_env,
        cwd=tmp_path,
        timeout=60,
    )
    tally.judge(
        "rehearse with 0.0.0.0 and no key (subprocess)",
        Verdict(proc.returncode, proc.stderr, proc.stdout + proc.stderr),
        "open.yaml: engine: engine.host 0.0.0.0 is not loopback",
    )
    assert proc.returncode == 2
    assert not (tmp_path / "out").exists() and not (tmp_path / ".regen").exists()
    assert not (tmp_path / "prefect-home").exists(), "Prefect started for a config error"


# --- the prompts file as a whole: the provisioning row fails naming the file ------------------


@pytest.mark.parametrize(
    ("case", "content", "words"),
    [
        ("empty prompts file", b"", "file is empty"),
        ("binary prompts file", b"PK\x03\x04\x00\x00binary", "line 1: binary data (a NUL byte)"),
        (
            "JSON array instead of JSONL",
            b'[{"messages": [{"role": "user", "content": "hi"}]}]\n',
            "line 1: a JSON array, not an object",
        ),
        (
            "pretty-printed JSON array",
            b'[\n  {"messages": [{"role": "user", "content": "hi"}]}\n]\n',
            "line 1: not valid JSON (a JSON array? use one object per line)",
        ),
        (
            "whole file not UTF-8",
            rows("a").replace("Explain", "Expl\xe9in").encode("latin-1"),
            "UTF-8",
        ),
        ("no usable row at all", b'{"id": "a", "messages": "hello"}\n', "no usable rows"),
    ],
)
def test_prompts_file_mistake(
    tmp_path: Path, tally: Tally, case: str, content: bytes, words: str
) -> None:
    prompts = tmp_path / "bad-prompts.jsonl"
    prompts.write_bytes(content)
    tally.judge(case, row_verdict(prompts_row(tmp_path, prompts)), str(prompts), words)


def test_rows_of_another_format_appended_are_read_as_theirs(tmp_path: Path, tally: Tally) -> None:
    """Rows describe themselves: ShareGPT and prompt rows appended to an OpenAI file are read
    by their own format (once a whole-file refusal), and the row counts them per format."""
    prompts = tmp_path / "appended.jsonl"
    prompts.write_text(
        rows("a", "b")
        + '{"id": "c", "conversations": [{"from": "human", "value": "hi"}]}\n'
        + '{"id": "d", "prompt": "hello", "system": "Be brief."}\n'
        + '{"id": "e", "prompt": "x", "conversations": [{"from": "human", "value": "x"}]}\n'
    )
    loaded = load_prompts(str(prompts))
    tally.accept(
        "rows of several formats in one file",
        loaded.valid["id"].to_list() == ["a", "b", "c", "d"] and loaded.num_rejected == 1,
    )
    row = prompts_row(tmp_path, prompts)
    assert (row.status, row.figure) == (
        "warn",
        "4 of 5 rows valid (messages 2, prompt 1, sharegpt 1; whole file); "
        "first: line 5: has both conversations and prompt",
    )
    assert loaded.rejects.rows() == [(5, "e", "has both conversations and prompt")]


def test_missing_prompts_file(tmp_path: Path, tally: Tally) -> None:
    gone = tmp_path / "gone.jsonl"
    verdict = failed_row(preflight(tmp_path, base_config(tmp_path, prompts=str(gone))), "prompts")
    tally.judge("missing prompts file", verdict, f"{gone}: prompt file not found")


def test_prompts_path_is_a_directory(tmp_path: Path, tally: Tally) -> None:
    verdict = row_verdict(prompts_row(tmp_path, tmp_path))
    tally.judge("prompts path is a directory", verdict, f"{tmp_path}: is a directory")


# --- rows: rejected with line and reason, the rest of the file goes on ------------------------

ROW_CASES = [
    ("messages not a list", '{"id": "x", "messages": "hello"}', "messages must be a list"),
    (
        "role not user/system/assistant",
        '{"id": "x", "messages": [{"role": "robot", "content": "hi"}]}',
        "message 0: role robot is not user/system/assistant",
    ),
    (
        "null content",
        '{"id": "x", "messages": [{"role": "user", "content": null}]}',
        "message 0: content is missing or null",
    ),
    ("duplicate id", rows("a").strip(), "duplicate id (first on line 1)"),
    ("truncated JSON line", '{"id": "x", "messages": [{"role": "us', "not valid JSON"),
    ("prompt not a string", '{"id": "x", "prompt": 42}', "must be a string"),
    (
        "10 MB single prompt",
        '{"id": "x", "messages": [{"role": "user", "content": "%s"}]}' % ("y" * 10_000_000),
        "prompt is 10000000 bytes, over the limit of 1000000 bytes",
    ),
]


@pytest.mark.parametrize(("case", "line", "reason"), ROW_CASES, ids=[c[0] for c in ROW_CASES])
def test_bad_row_is_rejected_and_the_run_goes_on(
    tmp_path: Path, tally: Tally, case: str, line: str, reason: str
) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(rows("a") + line + "\n" + rows("c"))
    loaded = load_prompts(str(prompts))
    rejects = loaded.rejects.to_dicts()
    ok = (
        loaded.valid["id"].to_list() == ["a", "c"]
        and len(rejects) == 1
        and rejects[0]["line"] == 2
        and reason in rejects[0]["reason"]
        and "\n" not in rejects[0]["reason"]
        and len(rejects[0]["reason"]) < 200  # a reason, not the prompt echoed back
    )
    tally.accept(case, ok)
    # The provisioning table warns (naming the first reason) but does not stop the run.
    row = prompts_row(tmp_path, prompts)
    assert row.status == "warn" and reason in row.figure


def test_non_utf8_line_is_rejected(tmp_path: Path, tally: Tally) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_bytes(
        rows("a").encode() + rows("b").replace("Explain", "Expl\xe9in").encode("latin-1")
    )
    loaded = load_prompts(str(prompts))
    tally.accept(
        "non-UTF-8 line",
        loaded.valid["id"].to_list() == ["a"]
        and loaded.rejects.select("line", "reason").rows() == [(2, "not valid UTF-8")],
    )


def test_bom_and_crlf_are_accepted(tmp_path: Path, tally: Tally) -> None:
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + rows("a", "b").encode())
    crlf = tmp_path / "crlf.jsonl"
    crlf.write_bytes(rows("a", "b").replace("\n", "\r\n").encode())
    for case, path in (("UTF-8 BOM accepted", bom), ("CRLF accepted", crlf)):
        loaded = load_prompts(str(path))
        first = loaded.valid.row(0, named=True)["messages"][0]["content"]
        tally.accept(
            case,
            loaded.valid["id"].to_list() == ["a", "b"]
            and loaded.num_rejected == 0
            and first.startswith("Explain")
            and first.endswith("result."),  # no "\r", no BOM left in the text
        )
        row = prompts_row(tmp_path, path)
        assert (
            row.status == "pass" and row.figure == "2 of 2 rows valid (messages 2; whole file)"
        ), row


# --- the environment: model, output, flags, GPUs ----------------------------------------------


def test_model_dir_without_config_json(tmp_path: Path, tally: Tally) -> None:
    model = tmp_path / "my-model"
    shutil.copytree(bundled("emulator-model"), model)
    (model / "config.json").unlink()
    data = base_config(tmp_path, model={"source": str(model), "served_name": "m", "stage": False})
    verdict = failed_row(preflight(tmp_path, data), "model")
    tally.judge("model dir without config.json", verdict, str(model), "missing config.json")


def test_unwritable_output_dir(tmp_path: Path, tally: Tally) -> None:
    # The tests may run as root, who ignores permission bits: a path below a regular file
    # cannot be created by anyone.
    blocker = tmp_path / "results.txt"
    blocker.write_bytes(b"precious")
    out = blocker / "dataset"
    verdict = failed_row(preflight(tmp_path, base_config(tmp_path, output=str(out))), "storage")
    tally.judge("unwritable output dir", verdict, f"{out}: not writable")
    assert blocker.read_bytes() == b"precious"


def test_removed_sglang_flag(tmp_path: Path, tally: Tally) -> None:
    engine = {
        "kind": "emulator",
        "gpus": [0],
        "extra_args": ["--cuda-graph-max-bs", "160"],
        "base_port": free_base_port(),
    }
    verdict = failed_row(preflight(tmp_path, base_config(tmp_path, engine=engine)), "flags")
    tally.judge(
        "removed sglang flag in extra_args",
        verdict,
        "engine.extra_args[0]: --cuda-graph-max-bs was removed in sglang 0.5.23",
        "use --cuda-graph-max-bs-decode",
    )


def test_api_key_in_extra_args(tmp_path: Path, tally: Tally) -> None:
    engine = {
        "kind": "emulator",
        "gpus": [0],
        "extra_args": ["--api-key", "s3cr3t-in-ps"],
        "base_port": free_base_port(),
    }
    verdict = failed_row(preflight(tmp_path, base_config(tmp_path, engine=engine)), "flags")
    tally.judge("api key in extra_args", verdict, "engine.extra_args[0]: --api-key is set by regen")
    assert "s3cr3t-in-ps" not in verdict.printed


class _TwoGpus:
    def gpus(self) -> list[GpuInfo]:
        return [GpuInfo(i, "NVIDIA B200", 183 * 10**9, 180 * 10**9, "580.82.07") for i in (0, 1)]


def test_gpu_index_beyond_the_node(tmp_path: Path, tally: Tally) -> None:
    engine = {
        "kind": "sglang",
        "gpus": [0, 5],
        "python": "/nonexistent/python",
        "base_port": free_base_port(),
    }
    checks = preflight(tmp_path, base_config(tmp_path, engine=engine), gpu_probe=_TwoGpus())
    row = next(r for r in checks if r.name == "gpus")
    verdict = Verdict(1 if row.status == "fail" else 0, row.figure, row.figure)
    tally.judge("GPU index beyond the node", verdict, "GPU [5] not present (2 found)")


def test_port_taken(tmp_path: Path, tally: Tally) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        engine = {"kind": "emulator", "gpus": [0], "base_port": port}
        verdict = failed_row(preflight(tmp_path, base_config(tmp_path, engine=engine)), "ports")
    tally.judge("port already taken", verdict, f"in use: [{port}]")


# --- end to end: two rehearsals ---------------------------------------------------------------


@pytest.fixture(scope="module")
def mixed_run(tmp_path_factory: pytest.TempPathFactory, prefect_home: Path) -> dict[str, Any]:
    """One rehearsal over a file with a BOM, CRLF line ends and rejected rows among good ones."""
    import os

    work = tmp_path_factory.mktemp("bad-inputs-run")
    good = [f"g{i:02d}" for i in range(12)]
    text = (
        rows(*good[:6])
        + '{"id": "r1", "messages": [{"role": "robot", "content": "hi"}]}\n'
        + rows("g00")  # a duplicate of line 1
        + '{"id": "r3", "messages": [{"role": "user", "content": null}]}\n'
        + rows(*good[6:])
    )
    (work / "mixed.jsonl").write_bytes(b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode())
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(
        PREFECT_HOME=str(prefect_home),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="90",
    )
    # 3 of 15 rows rejected: over the default 1 % the gate would stop the run (judged in
    # test_half_the_rows_rejected_stops_before_generating); here the run must go on.
    config = write_yaml(
        work / "c.yaml",
        {
            "shard_size": 5,
            "engine": {"gpus": [0, 1]},
            "audit": {"rejects": {"warn": 0, "fail": 0.5}},
        },
    )
    args = ["rehearse", "--config", str(config), "--prompts", "mixed.jsonl", "--out", "out"]
    start = time.monotonic()
    proc = run_regen(args, env, cwd=work)
    return {"work": work, "proc": proc, "good": good, "env": env, "s": time.monotonic() - start}


def test_rejected_rows_do_not_stop_a_run(mixed_run: dict[str, Any], tally: Tally) -> None:
    work, proc = mixed_run["work"], mixed_run["proc"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = work / "out"
    data = read_committed(LocalStorage(out)).collect()
    rejects = pl.read_parquet(out / "rejects" / "rejects.parquet").sort("line")
    ok = (
        sorted(data["id"].to_list()) == mixed_run["good"]
        and rejects["line"].to_list() == [7, 8, 9]
        and "duplicate id (first on line 1)" in rejects["reason"].to_list()
    )
    tally.accept("BOM + CRLF + rejected rows, end to end", ok)


@pytest.fixture(scope="module")
def refused_run(mixed_run: dict[str, Any]) -> dict[str, Any]:
    """The same output root, rerun with another temperature: a different run's fingerprint."""
    work = mixed_run["work"]
    assert mixed_run["proc"].returncode == 0, mixed_run["proc"].stderr
    before = tree_digest(work / "out")
    config = write_yaml(
        work / "other.yaml",
        {"shard_size": 5, "engine": {"gpus": [0, 1]}, "sampling": {"temperature": 1.0}},
    )
    args = ["rehearse", "--config", str(config), "--prompts", "mixed.jsonl", "--out", "out"]
    proc = run_regen(args, mixed_run["env"], cwd=work)
    return {"work": work, "proc": proc, "before": before}


def test_output_of_another_run_is_refused_untouched(
    refused_run: dict[str, Any], tally: Tally
) -> None:
    work, proc, before = refused_run["work"], refused_run["proc"], refused_run["before"]
    assert any(k.startswith("shards/") and k.endswith(".json") for k in before)
    said = [line for line in proc.stderr.splitlines() if line.startswith("regen: ")]
    tally.judge(
        "output made by another run",
        # The verdict is regen's own line; Prefect's log lines are judged in the next test.
        Verdict(proc.returncode, "\n".join(said), "\n".join(said)),
        f"{work / 'out'}: run.json was made with",
        "sampling.temperature=0.6, this run has 1.0",
    )
    assert tree_digest(work / "out") == before, "the other run's dataset was modified"


def test_refused_run_prints_no_traceback(refused_run: dict[str, Any]) -> None:
    assert "Traceback" not in refused_run["proc"].stderr


def test_half_the_rows_rejected_stops_before_generating(
    tmp_path: Path, regen_env: dict[str, str]
) -> None:
    """1,000 of 2,000 rows not valid JSON (the tail of the file): the live gate stops the run
    before a fleet is launched, and the audit fails naming `rejects` with the count."""
    good = [f"ok{i:04d}" for i in range(1000)]
    bad = "".join(f'{{"id": "bad{i}", "prompt": "cut off\n' for i in range(1000))
    (tmp_path / "half.jsonl").write_text(rows(*good) + bad)
    args = ["rehearse", "--prompts", "half.jsonl", "--out", "out"]
    proc = run_regen(args, regen_env, cwd=tmp_path)

    assert proc.returncode == 1, proc.stdout + proc.stderr
    said = [line for line in proc.stderr.splitlines() if line.startswith("regen: ")]
    # The short reason, then the check on a line of its own (issue 38).
    assert said and said[0] == (
        "regen: run failed: FAIL: canary gate stopped the run before generating: rejects 50.0 %"
    ), said
    assert (
        "\n  - rejects 50.0 % (1,000 of 2,000 input rows) (fail at 1.00 %), e.g. line 1001, "
        "line 1002, line 1003\n" in proc.stderr
    ), proc.stderr
    assert "Traceback" not in proc.stderr
    out = tmp_path / "out"
    assert not list((out / "shards").glob("*.json")) if (out / "shards").exists() else True
    assert not list((tmp_path / ".regen").glob("runs/*/logs/server-*.log")), "no fleet launched"
    audit = json.loads((out / "report" / "audit.json").read_text())
    assert audit["verdict"] == "fail" and audit["gate"] == "canary"
    rejects = next(c for c in audit["checks"] if c["name"] == "rejects")
    assert rejects["status"] == "fail" and rejects["figure"] == 0.5
    assert rejects["detail"] == (
        "1,000 of 2,000 input rows rejected: not valid JSON: 1,000 rows, lines 1001, 1002, 1003, …"
    )
    assert rejects["examples"][0] == {"id": "line 1001", "reason": "not valid JSON"}
    assert (
        "| **FAIL** | rejected input rows | 50.0 % |" in (out / "report" / "audit.md").read_text()
    )
