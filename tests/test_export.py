"""`regen export`: each format read back by its consumer's own reader (Hugging Face
`datasets`), filters and their counts, incremental reruns, S3 on a moto server, the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from flows.cli import main
from regen.cli import FORMATS_CHOICES
from regen.config import FORMATS, ExportOptions
from regen.dataset import (
    PLAN_KEY,
    PLAN_SCHEMA,
    RUN_KEY,
    commit_shard,
    read_committed,
    read_manifest,
    read_plan,
    replace_shard,
)
from regen.export.exporter import EXPORT_KEY, export_dataset
from regen.storage import LocalStorage, Storage
from support.s3 import MotoS3
from tests.support.export import FINGERPRINT, make_export_dataset, synthetic_shard, user_text

datasets = pytest.importorskip("datasets")
datasets.disable_progress_bars()

ROWS, SHARD = 60, 20
DEFECTS = {"error_every": 7, "truncated_every": 5, "no_ids_every": 11}


def _source_rows(storage: Storage) -> pl.DataFrame:
    """Every committed row, read here straight from the manifests (the test's own oracle)."""
    frames = []
    for shard in range(-(-ROWS // SHARD)):
        manifest = read_manifest(storage, shard)
        assert manifest is not None
        frames.append(pl.read_parquet(storage.read_bytes(manifest.data)))
    return pl.concat(frames)


def _turns(rows: pl.DataFrame) -> pl.DataFrame:
    """One row per stored turn of an ok row: id, turn, n (turns in its row), truncated, and
    the response token count (null without ids)."""
    return (
        rows.filter(pl.col("error").is_null())
        .with_columns(n=pl.col("turns").list.len())
        .explode("turns")
        .select(
            "id",
            "n",
            pl.col("turns").struct.field("turn"),
            (pl.col("turns").struct.field("finish_reason") == "length").alias("truncated"),
            pl.col("turns").struct.field("response_token_ids").list.len().alias("response"),
        )
    )


def _read_jsonl(dest: Path) -> Any:
    files = json.loads((dest / EXPORT_KEY).read_text())["files"]
    return datasets.load_dataset(
        "json",
        data_files=[str(dest / f) for f in files],
        split="train",
        cache_dir=str(dest.parent / "hf-cache"),
    )


def _read(dest: Path, fmt: str) -> Any:
    if fmt == "hf-dataset":
        # The export is in torch format (speculators' loader needs tensors), which
        # load_from_disk sets up only where torch is installed; regen's venv has none, so the
        # Arrow files state.json lists are opened as load_from_disk opens them, unformatted.
        state = json.loads((dest / "state.json").read_text())
        assert state["_format_type"] == "torch"
        files = [str(dest / f["filename"]) for f in state["_data_files"]]
        return datasets.concatenate_datasets([datasets.Dataset.from_file(f) for f in files])
    return _read_jsonl(dest)


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Storage]:
    """By turns per row: 1 as `regeneration.turns: last` stores rows (the answer in `content`
    only), 2 as `turns: all` does (every answer in `messages`)."""
    root = tmp_path_factory.mktemp("export-src")
    return {
        turns: make_export_dataset(
            root / f"turns-{turns}", rows=ROWS, shard_size=SHARD, turns=turns, **DEFECTS
        )
        for turns in (1, 2)
    }


@pytest.fixture
def source(sources: dict[int, Storage]) -> Storage:
    return sources[2]


@pytest.mark.parametrize("turns", [1, 2])
@pytest.mark.parametrize("fmt", FORMATS)
def test_each_format_reads_back_with_its_consumers_reader(
    sources: dict[int, Storage], tmp_path: Path, fmt: str, turns: int
) -> None:
    source = sources[turns]
    dest = tmp_path / fmt
    summary = export_dataset(source, LocalStorage(dest), ExportOptions(format=fmt))
    data = _read(dest, fmt)
    rows = _source_rows(source)
    ok = rows.filter(pl.col("error").is_null())
    record = json.loads((dest / EXPORT_KEY).read_text())
    assert record["counts"] == summary.counts
    assert record["source"]["fingerprint"] == FINGERPRINT
    assert [e["manifest"]["identity"] for e in record["shards"]] == [
        read_manifest(source, k).sha256  # type: ignore[union-attr]
        for k in range(3)
    ]
    assert summary.counts["error_rows"] == rows.height - ok.height > 0
    ids = list(data["id"])
    assert len(ids) == len(set(ids)), "every id once"
    if fmt in {"specforge", "messages"}:
        assert sorted(ids) == sorted(ok["id"].to_list())
        key = "conversations" if fmt == "specforge" else "messages"
        answers = dict(zip(ok["id"], ok["content"], strict=True))
        for sample_id, conversation in zip(ids, data[key], strict=True):
            roles = ["system"] + ["user", "assistant"] * turns
            assert [m["role"] for m in conversation] == roles
            last = conversation[-1]
            # As SGLang returned it: SpecForge's template strips, a JSON writer must not.
            assert last["content"] == answers[sample_id] and last["content"].startswith("\n\n")
            assert last["reasoning_content"].endswith("\n")
            assert all(m.get("reasoning_content") is None for m in conversation[:2])
            assert all(m["content"] for m in conversation)
            assert conversation[1]["content"] == user_text(sample_id, 0)
        return
    answered = _turns(rows).filter(pl.col("response").is_not_null())
    expected = answered.select(
        pl.when(pl.col("n") > 1).then(pl.format("{}#t{}", "id", "turn")).otherwise("id"),
        "response",
    )
    assert sorted(ids) == sorted(expected.to_series(0).to_list())
    response = dict(expected.iter_rows())
    for sample_id, input_ids, loss_mask in zip(
        ids, data["input_ids"], data["loss_mask"], strict=True
    ):
        assert len(input_ids) == len(loss_mask)
        assert sum(loss_mask) == response[sample_id]
        assert list(loss_mask) == sorted(loss_mask), "prompt 0s, then response 1s"
    if fmt == "hf-dataset":
        assert list(data["seq_len"]) == [len(x) for x in data["input_ids"]]
        # speculators' training loader needs tensors: tests/trainers/ judges that there.
    assert summary.counts["dropped"] == {"no_token_ids": _turns(rows)["response"].null_count()}


def test_the_cli_offers_every_format() -> None:
    assert tuple(FORMATS_CHOICES) == FORMATS


@pytest.mark.parametrize("fmt", ["tokenized", "specforge"])
def test_filters_drop_and_count_by_reason(source: Storage, tmp_path: Path, fmt: str) -> None:
    options = ExportOptions(format=fmt, turns="last", exclude_truncated=True, min_loss_tokens=30)
    summary = export_dataset(source, LocalStorage(tmp_path / fmt), options)
    data = _read(tmp_path / fmt, fmt)
    rows = _source_rows(source)
    if fmt == "tokenized":
        last = _turns(rows).filter(pl.col("turn") == pl.col("n"))
        with_ids = last.filter(pl.col("response").is_not_null())
        kept = with_ids.filter(~pl.col("truncated") & (pl.col("response") >= 30))
        dropped = {
            "no_token_ids": last.height - with_ids.height,
            "truncated": int(with_ids["truncated"].sum()),
            "min_loss_tokens": with_ids.filter(~pl.col("truncated")).height - kept.height,
        }
        # turns last: one sample per conversation, under the conversation's own id.
        assert sorted(data["id"]) == sorted(kept["id"].to_list())
        assert all(sum(m) >= 30 for m in data["loss_mask"])
    else:
        ok = rows.filter(pl.col("error").is_null())
        truncated = ok["finish_reason"] == "length"
        short = ok.filter(~truncated & (pl.col("completion_tokens") < 30)).height
        dropped = {"truncated": int(truncated.sum()), "min_loss_tokens": short}
        assert len(data) == ok.height - dropped["truncated"] - short
    assert all(dropped.values()), "each filter must have something to drop here"
    assert summary.counts["dropped"] == dropped
    assert summary.counts["samples"] == len(data)


def _mtimes(dest: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in dest.iterdir()}


@pytest.mark.parametrize("fmt", ["tokenized", "hf-dataset"])
def test_rerun_rewrites_only_what_changed(tmp_path: Path, fmt: str) -> None:
    src = make_export_dataset(tmp_path / "ds", rows=ROWS, shard_size=SHARD, turns=2, **DEFECTS)
    dest = tmp_path / "out"
    options = ExportOptions(format=fmt)
    first = export_dataset(src, LocalStorage(dest), options)
    assert first.written == [0, 1, 2]
    before = _mtimes(dest)
    again = export_dataset(src, LocalStorage(dest), options)
    assert (again.written, again.reused) == ([], [0, 1, 2])
    assert _mtimes(dest) == before, "an unchanged dataset rewrites nothing"

    # retry_errors replaces shard 1; a new shard 3 is committed: only those are written.
    import numpy as np

    rng = np.random.default_rng(9)
    fixed = synthetic_shard(1, SHARD, SHARD, rng, turns=2).filter(
        pl.col("id").is_in(_source_rows(src).filter(pl.col("error").is_not_null())["id"].to_list())
    )
    replace_shard(src, 1, fixed, fingerprint=FINGERPRINT, timings={})
    commit_shard(
        src, 3, synthetic_shard(3, ROWS, 5, rng, turns=2), fingerprint=FINGERPRINT, timings={}
    )
    third = export_dataset(src, LocalStorage(dest), options)
    assert (third.written, third.reused) == ([1, 3], [0, 2])
    after = _mtimes(dest)
    assert (
        after["shard-000000" + (".arrow" if fmt == "hf-dataset" else ".jsonl")]
        == before["shard-000000" + (".arrow" if fmt == "hf-dataset" else ".jsonl")]
    )
    data = _read(dest, fmt)
    assert third.counts["samples"] == len(data) > first.counts["samples"]
    assert third.counts["error_rows"] == first.counts["error_rows"] - fixed.height
    # Other options make other files: everything is written again.
    assert (
        export_dataset(src, LocalStorage(dest), options.model_copy(update={"turns": "last"})).reused
        == []
    )


def _drop_ids(storage: Storage, ids: list[str]) -> None:
    """What a rerun with `input.removed: drop` leaves: the ids flagged removed in the plan
    and run.json saying `drop`."""
    plan = read_plan(storage)
    assert plan is not None
    full = plan.with_columns(
        content=pl.lit("h"), revision=pl.lit(1), removed=pl.col("id").is_in(ids)
    ).cast(PLAN_SCHEMA)
    storage.write_bytes(PLAN_KEY, _parquet_bytes(full))
    run = json.loads(storage.read_bytes(RUN_KEY))
    storage.write_bytes(RUN_KEY, json.dumps(run | {"removed": "drop"}).encode())


def _parquet_bytes(frame: pl.DataFrame) -> bytes:
    import io

    buffer = io.BytesIO()
    frame.write_parquet(buffer)
    return buffer.getvalue()


def test_dropping_one_id_exports_its_shard_again_and_no_other(tmp_path: Path) -> None:
    src = make_export_dataset(tmp_path / "ds", rows=ROWS, shard_size=SHARD)
    dest = tmp_path / "out"
    options = ExportOptions(format="messages")
    assert export_dataset(src, LocalStorage(dest), options).written == [0, 1, 2]
    ok = _source_rows(src).filter(pl.col("error").is_null())
    gone = ok.filter(pl.col("shard") == 1)["id"][0]
    _drop_ids(src, [gone])

    again = export_dataset(src, LocalStorage(dest), options)
    assert (again.written, again.reused) == ([1], [0, 2]), "the view changed in shard 1 only"
    ids = list(_read(dest, "messages")["id"])
    assert gone not in ids and len(ids) == ok.height - 1
    # The audit reads the same view: its summary of shard 1 is remade, the others reused.
    from regen.audit import run_audit
    from regen.audit.dataset import open_dataset
    from regen.audit.settings import settings_for
    from regen.config import AuditConfig
    from tests.support.summaries import shard_summaries

    config = AuditConfig()
    settings = settings_for(src, open_dataset(src), config)
    _drop_ids(src, [])
    run_audit(src, config)
    _drop_ids(src, [gone])
    assert shard_summaries(src, open_dataset(src), settings).computed == [1]


def _etags(moto: MotoS3, bucket: str, prefix: str) -> dict[str, tuple[str, object]]:
    listed = moto.client().list_objects_v2(Bucket=bucket, Prefix=prefix)
    return {o["Key"]: (o["ETag"], o["LastModified"]) for o in listed.get("Contents", [])}


@pytest.mark.parametrize(
    ("fmt", "flags"),
    [("specforge", []), ("hf-dataset", []), ("tokenized", ["--single-file", "--token-freq"])],
)
def test_s3_dataset_to_s3_export(moto: MotoS3, tmp_path: Path, fmt: str, flags: list[str]) -> None:
    bucket = moto.create_bucket("regen-export")
    src = make_export_dataset(moto.storage(bucket, "ds"), rows=ROWS, shard_size=SHARD, turns=2)
    dest_prefix = f"exports/{fmt}"
    args = ["export", f"s3://{bucket}/ds", "-f", fmt, "-o", f"s3://{bucket}/{dest_prefix}", *flags]
    assert main(args) == 0
    tags = _etags(moto, bucket, dest_prefix)
    assert f"{dest_prefix}/{EXPORT_KEY}" in tags and not any(k.endswith(".tmp") for k in tags)
    if flags:
        names = {k.removeprefix(dest_prefix + "/") for k in tags}
        assert names == {EXPORT_KEY, "tokenized.jsonl", "token_freq.pt"}
    local = tmp_path / fmt
    for key in tags:
        target = local / key.removeprefix(dest_prefix + "/")
        target.parent.mkdir(parents=True, exist_ok=True)
        moto.client().download_file(bucket, key, str(target))
    data = _read(local, fmt)
    assert len(data) == json.loads((local / EXPORT_KEY).read_text())["counts"]["samples"] > 0
    assert len(set(data["id"])) == len(data)
    assert main(args) == 0
    assert _etags(moto, bucket, dest_prefix) == tags, "a rerun puts nothing"
    assert src.exists("run.json")


def test_cli_exports_and_refuses_bad_input(
    source: Storage, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dest = tmp_path / "tok"
    args = ["export", source.uri, "--format", "tokenized", "--out", str(dest)]
    assert main([*args, "--turns", "last", "--exclude-truncated"]) == 0
    out = capsys.readouterr().out
    assert "dropped: no_token_ids" in out and "truncated" in out and "3 written" in out
    assert (
        main(["export", str(tmp_path / "missing"), "--format", "specforge", "--out", str(dest)])
        == 2
    )
    err = capsys.readouterr().err
    assert "missing" in err and "not a regen dataset" in err and "Traceback" not in err
    assert main(["export", source.uri, "--format", "specforge", "--out", source.uri]) == 1
    assert "dataset root" in capsys.readouterr().err
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert main(["export", source.uri, "--format", "specforge", "--out", str(blocked / "x")]) == 1
    assert "cannot write the export" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "--min-loss-tokens", "-1"])
    assert exit_info.value.code == 2


@pytest.mark.usefixtures("prefect_harness")
def test_export_flow_writes_the_format_and_its_artifact(source: Storage, tmp_path: Path) -> None:
    from flows.export import export_dataset_flow

    counts = export_dataset_flow(source.uri, str(tmp_path / "m"), format="messages")
    data = _read(tmp_path / "m", "messages")
    assert counts["samples"] == len(data) > 0


def test_hf_shard_file_is_what_save_to_disk_writes(source: Storage) -> None:
    from regen.export.exporter import _arrow_bytes, _save_to_disk
    from regen.export.formats import shard_export

    part = shard_export(read_committed(source).scan([0]), ExportOptions(format="hf-dataset"))
    assert part.frame.height > 0
    assert _arrow_bytes(part.frame) == _save_to_disk(part.frame)["data-00000-of-00001.arrow"]


def test_export_section_is_checked_and_names_one_directory_per_format() -> None:
    from regen.config import parse_config
    from regen.errors import ConfigError

    base = {"model": {"source": "m", "served_name": "m"}, "prompts": "p.jsonl", "output": "o"}
    section = {"dest": "s3://b/train/", "formats": ["specforge", "hf-dataset", "specforge"]}
    config = parse_config({**base, "export": {**section, "turns": "last"}})
    assert config.export is not None
    targets = config.export.targets()
    assert [d for d, _ in targets] == ["s3://b/train/specforge", "s3://b/train/hf-dataset"]
    assert {o.turns for _, o in targets} == {"last"}
    assert parse_config(base).export is None
    with pytest.raises(ConfigError, match=r"export\.formats\.0: Input should be"):
        parse_config({**base, "export": {"dest": "d", "formats": ["csv"]}})
    with pytest.raises(ConfigError, match=r"export\.min_loss_tokens"):
        parse_config({**base, "export": {**section, "min_loss_tokens": -1}})


def test_another_format_in_the_same_place_is_refused(
    source: Storage, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A second format would mix its files into the first one's trainer input: refused (a
    usage error, exit 2) and nothing is touched; other options of one format rewrite it."""
    dest = tmp_path / "out"
    export_dataset(source, LocalStorage(dest), ExportOptions(format="hf-dataset"))
    (dest / "notes.txt").write_text("mine")
    before = sorted(p.name for p in dest.iterdir())
    assert main(["export", str(source.uri), "-f", "specforge", "-o", str(dest)]) == 2
    err = capsys.readouterr().err
    assert f"{dest}: holds a hf-dataset export; write specforge to its own directory" in err
    assert "Traceback" not in err
    assert sorted(p.name for p in dest.iterdir()) == before
    again = export_dataset(
        source, LocalStorage(dest), ExportOptions(format="hf-dataset", exclude_truncated=True)
    )
    assert again.written == [0, 1, 2] and "notes.txt" in {p.name for p in dest.iterdir()}


def test_an_export_by_older_regen_is_taken_over(source: Storage, tmp_path: Path) -> None:
    """VERSION 1 kept export.json among the files (speculators' --data DIR and
    load_dataset(DIR) read it as data): a rerun rewrites the export and deletes it."""
    dest = tmp_path / "out"
    summary = export_dataset(source, LocalStorage(dest), ExportOptions(format="specforge"))
    old = {**summary.record, "version": 1}
    (dest / EXPORT_KEY).rename(dest / "export.json")
    (dest / "export.json").write_text(json.dumps(old))
    again = export_dataset(source, LocalStorage(dest), ExportOptions(format="specforge"))
    assert again.written == [0, 1, 2] and "export.json" in again.deleted
    assert sorted(p.name for p in dest.iterdir()) == [
        EXPORT_KEY, *(f"shard-{k:06d}.jsonl" for k in range(3))
    ]  # fmt: skip


def test_turns_without_ids_come_from_the_models_template_when_given(tmp_path: Path) -> None:
    from regen.rehearsal import bundled

    src = make_export_dataset(tmp_path / "ds", rows=ROWS, shard_size=SHARD, turns=2, no_ids_every=3)
    options = ExportOptions(format="tokenized")
    without = export_dataset(src, LocalStorage(tmp_path / "a"), options)
    dropped = without.counts["dropped"]["no_token_ids"]
    assert dropped > 0
    model = bundled("emulator-model")
    summary = export_dataset(src, LocalStorage(tmp_path / "b"), options, tokenizer_path=model)
    assert summary.counts["dropped"] == {"no_token_ids": 0}
    assert summary.counts["samples"] == without.counts["samples"] + dropped
    assert summary.record["template"] is not None
    data = _read(tmp_path / "b", "tokenized")
    assert all(
        len(i) == len(m) and 0 < sum(m) < len(m)
        for i, m in zip(data["input_ids"], data["loss_mask"], strict=True)
    )
    # Another template (or none) is another export: a rerun with it writes every shard.
    assert export_dataset(src, LocalStorage(tmp_path / "b"), options).reused == []


def test_a_failed_audit_is_exported_only_when_allowed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = make_export_dataset(tmp_path / "ds", rows=ROWS, shard_size=SHARD)
    src.write_bytes("report/audit.json", json.dumps({"verdict": "fail"}).encode())
    args = ["export", src.uri, "-f", "specforge", "-o", str(tmp_path / "out")]
    assert main(args) == 1  # the code of a failed audit
    err = capsys.readouterr().err
    assert "its last audit failed (report/audit.json); export it anyway with --allow-failed" in err
    assert not (tmp_path / "out").exists()
    assert main([*args, "--allow-failed"]) == 0
    src.write_bytes("report/audit.json", json.dumps({"verdict": "pass"}).encode())
    assert main(args) == 0


@pytest.mark.parametrize("fmt", ["specforge", "tokenized", "messages"])
def test_export_directories_load_as_they_are(source: Storage, tmp_path: Path, fmt: str) -> None:
    """load_dataset(DIR) reads every data file of a directory: the record is not one of them,
    and one file (--single-file) holds exactly the shards' lines, in shard order."""
    shards, single = tmp_path / "shards", tmp_path / "single"
    export_dataset(source, LocalStorage(shards), ExportOptions(format=fmt))
    summary = export_dataset(
        source, LocalStorage(single), ExportOptions(format=fmt, single_file=True)
    )
    assert sorted(p.name for p in single.iterdir()) == [EXPORT_KEY, f"{fmt}.jsonl"]
    assert summary.record["files"] == [f"{fmt}.jsonl"] and summary.written == [0, 1, 2]
    joined = "".join(
        (shards / f).read_text()
        for f in sorted(json.loads((shards / EXPORT_KEY).read_text())["files"])
    )
    assert (single / f"{fmt}.jsonl").read_text() == joined
    for dest in (shards, single):
        data = datasets.load_dataset(str(dest), split="train", cache_dir=str(tmp_path / "c"))
        assert data.num_rows == summary.counts["samples"] and "id" in data.column_names
    before = (single / f"{fmt}.jsonl").stat().st_mtime_ns
    again = export_dataset(
        source, LocalStorage(single), ExportOptions(format=fmt, single_file=True)
    )
    assert again.written == [] and (single / f"{fmt}.jsonl").stat().st_mtime_ns == before


def test_options_that_do_not_fit_the_format_are_usage_errors(
    source: Storage, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["export", source.uri, "-o", str(tmp_path / "o")]
    assert main([*base, "-f", "hf-dataset", "--single-file"]) == 2
    assert main([*base, "-f", "specforge", "--token-freq"]) == 2
    err = capsys.readouterr().err
    assert "single_file: hf-dataset is an Arrow directory" in err
    assert "token_freq: only the token formats" in err and "Traceback" not in err


def test_token_freq_counts_the_trained_tokens(source: Storage, tmp_path: Path) -> None:
    """token_freq.pt is torch's serialization of {token id: count} (tests/trainers loads it
    with torch and compares it with speculators' own count); read back here with pickle."""
    import io
    import pickle

    dest = tmp_path / "tok"
    export_dataset(source, LocalStorage(dest), ExportOptions(format="tokenized", token_freq=True))
    stream = io.BytesIO((dest / "token_freq.pt").read_bytes())
    header = [pickle.load(stream) for _ in range(3)]
    counts, storages = pickle.load(stream), pickle.load(stream)
    assert header[1] == 1001 and storages == []
    rows = _read_jsonl(dest)
    expected: dict[int, int] = {}
    for ids, mask in zip(rows["input_ids"], rows["loss_mask"], strict=True):
        for i, m in zip(ids, mask, strict=True):
            if m:
                expected[i] = expected.get(i, 0) + 1
    assert counts == expected


@pytest.mark.parametrize(("turns", "default"), [("last", True), ("all", False)])
def test_generated_only_defaults_to_the_datasets_turns(
    tmp_path: Path, turns: str, default: bool
) -> None:
    src = make_export_dataset(tmp_path / "ds", rows=ROWS, shard_size=SHARD)
    run = json.loads(src.read_bytes("run.json"))
    src.write_bytes("run.json", json.dumps({**run, "regeneration": {"turns": turns}}).encode())
    summary = export_dataset(src, LocalStorage(tmp_path / "o"), ExportOptions(format="messages"))
    assert summary.record["generated_only"] is default
    tokens = export_dataset(src, LocalStorage(tmp_path / "t"), ExportOptions(format="tokenized"))
    assert tokens.record["generated_only"] is False  # regen's loss mask trains the answers only
