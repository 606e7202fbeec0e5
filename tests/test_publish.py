"""`regen publish` against a loopback Hub (support/hub.py) that answers what huggingface_hub 2.4
sends to create a repo, preupload, upload LFS objects and commit, errors included; the repo
is then read back by `datasets.load_dataset` (in a fresh process, as a user's), by
`hf_hub_download`, and by regen's own Hub-prompt code, row for row against the local dataset.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

from flows.cli import main
from regen.config import ExportOptions, PublishConfig
from regen.dataset import (
    commit_shard,
    manifest_key,
    read_committed,
    read_manifest,
    replace_shard,
)
from regen.dataset.keys import PROVENANCE_KEY
from regen.export.exporter import export_dataset
from regen.prompts import load_prompts
from regen.prompts.hub import download, resolve
from regen.publish import publish_dataset
from regen.publish.provenance import SCHEMA_VERSION, read_provenance
from regen.storage import LocalStorage, Storage
from support.hub import READ_TOKEN, TOKEN, LoopbackHub, loopback_hub
from support.s3 import MotoS3
from tests.support.export import FINGERPRINT, synthetic_shard
from tests.support.publish import (
    PROMPTS,
    PROMPTS_LICENSE,
    audit,
    finished_dataset,
    prompt_source,
    publishing_hub,
)

datasets = pytest.importorskip("datasets")

REPO_ID = "regen-org/qwen3-regen"
REPO = f"hf://datasets/{REPO_ID}"
WRITES = ("/preupload/", "/commit/", "/info/lfs/", "/lfs-upload/", "/repos/create", "/branch/")


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    with loopback_hub() as server:
        publishing_hub(monkeypatch, server, tmp_path / "hf")
        yield server


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One finished dataset, audited once (its plots take seconds); each test gets a copy.
    Its prompt source's commit is the one every test's Hub gives the same files."""
    root = tmp_path_factory.mktemp("built") / "dataset"
    finished_dataset(root, prompt_source(LoopbackHub()))
    return root


@pytest.fixture
def dataset(hub: LoopbackHub, built: Path, tmp_path: Path) -> Storage:
    assert prompt_source(hub) == json.loads((built / "run.json").read_text())["source"]
    shutil.copytree(built, tmp_path / "dataset")
    return LocalStorage(tmp_path / "dataset")


def _publish(
    capsys: pytest.CaptureFixture[str], dataset: Storage, tmp_path: Path, *flags: str
) -> tuple[int, str, str]:
    code = main(["publish", dataset.uri, REPO, "--staging", str(tmp_path / "staging"), *flags])
    out, err = capsys.readouterr()
    return code, out, err


def _writes(hub: LoopbackHub, since: int = 0) -> list[tuple[str, str]]:
    return [(m, p) for m, p in hub.requests[since:] if any(w in p for w in WRITES)]


def _expected_conversations(storage: Storage) -> list[dict[str, Any]]:
    """The test's oracle: each ok row's stored messages, then its answer as an assistant
    message (a `turns: last` dataset keeps the answer in `content` only)."""
    rows = read_committed(storage).collect().filter(pl.col("error").is_null())
    out = []
    for row in rows.iter_rows(named=True):
        answer = {
            "role": "assistant",
            "content": row["content"],
            "reasoning_content": row["reasoning_content"],
            "tool_calls": None,
            "tool_call_id": None,
        }
        out.append({"id": row["id"], "messages": [*row["messages"], answer]})
    return out


def _published(frame: pl.DataFrame) -> list[dict[str, Any]]:
    return frame.select("id", "messages").to_dicts()


def _tokenized_export(storage: Storage, dest: Path) -> pl.DataFrame:
    """What `regen export -f hf-dataset` writes, read as speculators reads it."""
    summary = export_dataset(storage, LocalStorage(dest), ExportOptions(format="hf-dataset"))
    files = [str(dest / f) for f in summary.record["files"]]
    table = datasets.concatenate_datasets([datasets.Dataset.from_file(f) for f in files])
    return pl.from_arrow(table.with_format(None).data.table)  # type: ignore[return-value]


_LOAD = """
import sys, datasets
datasets.disable_progress_bars()
repo, out = sys.argv[1], sys.argv[2]
for config in ("default", "tokenized"):
    datasets.load_dataset(repo, config, split="train").to_parquet(f"{out}/{config}.parquet")
"""


def _load_dataset(hub: LoopbackHub, tmp_path: Path) -> dict[str, pl.DataFrame]:
    """`datasets.load_dataset` of both configs in a fresh process, as a trainer's would run:
    its own cache, HF_ENDPOINT read at import."""
    out = tmp_path / "loaded"
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(hub.env(str(tmp_path / "hf-reader")))
    env.update(HF_TOKEN=TOKEN, HF_DATASETS_CACHE=str(tmp_path / "datasets-cache"))
    done = subprocess.run(
        [sys.executable, "-c", _LOAD, REPO_ID, str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return {c: pl.read_parquet(out / f"{c}.parquet") for c in ("default", "tokenized")}


def test_published_repo_loads_back_row_for_row_and_a_second_publish_sends_nothing(
    hub: LoopbackHub, dataset: Storage, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _publish(capsys, dataset, tmp_path, "--tokenized")
    assert code == 0, err
    print(f"\n$ regen publish {dataset.uri} {REPO} --tokenized\n{out}")
    files = hub.head(REPO_ID)
    assert hub.repos[REPO_ID].private, "private unless --public"
    assert {"README.md", PROVENANCE_KEY, "report/audit.json", "report/lengths.png"} <= set(files)

    expected = _expected_conversations(dataset)
    loaded = _load_dataset(hub, tmp_path)
    by_datasets = _published(loaded["default"])
    # regen's own Hub-prompt code: the card's configs choose the files, at one commit.
    selection = resolve(REPO)
    assert selection.chosen_by == "README.md configs: config default, split train"
    by_regen = _published(pl.concat(pl.read_parquet(p) for p in download(selection)))
    tokens = loaded["tokenized"].select("id", "input_ids", "loss_mask", "seq_len")
    exported = _tokenized_export(dataset, tmp_path / "export")
    from huggingface_hub import hf_hub_download

    provenance = Path(hf_hub_download(REPO_ID, PROVENANCE_KEY, repo_type="dataset"))
    assert provenance.read_bytes() == dataset.read_bytes(PROVENANCE_KEY)
    equal = sum(a == b for a, b in zip(by_datasets, expected, strict=True))
    equal_regen = sum(a == b for a, b in zip(by_regen, expected, strict=True))
    equal_tokens = sum(a == b for a, b in zip(tokens.to_dicts(), exported.to_dicts(), strict=True))
    print(
        f"load-back: datasets.load_dataset {equal} of {len(expected)} conversations equal, "
        f"regen's Hub-prompt code {equal_regen} of {len(expected)}, tokenized config "
        f"{equal_tokens} of {exported.height} samples equal to `regen export -f hf-dataset`, "
        "report/provenance.json byte-equal through hf_hub_download"
    )
    assert by_datasets == expected and by_regen == expected
    assert tokens.to_dicts() == exported.to_dicts()
    # A published set is itself a prompt source (its conversations end with the answer).
    as_prompts = load_prompts(REPO)
    assert as_prompts.valid["id"].to_list() == [r["id"] for r in expected]

    asked = len(hub.requests)
    code, out, err = _publish(capsys, dataset, tmp_path, "--tokenized")
    assert code == 0, err
    print(f"$ regen publish {dataset.uri} {REPO} --tokenized  # again\n{out}")
    assert "nothing new" in out and "nothing uploaded" in out
    assert _writes(hub, asked) == [], "a second publish sends nothing"
    assert hub.head(REPO_ID) == files


def test_a_changed_shard_sends_its_files_alone_and_a_dropped_config_is_deleted(
    hub: LoopbackHub, dataset: Storage, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _publish(capsys, dataset, tmp_path, "--tokenized")[0] == 0
    manifest = read_manifest(dataset, 1)
    assert manifest is not None
    rows = pl.read_parquet(dataset.read_bytes(manifest.data)).head(1)
    rows = rows.with_columns(content=pl.lit("\n\na regenerated answer, longer than before"))
    replace_shard(dataset, 1, rows, fingerprint=FINGERPRINT, timings={})
    audit(dataset)
    asked = len(hub.requests)
    uploads = hub.uploads

    published = publish_dataset(
        dataset,
        PublishConfig(repo=REPO),
        staging=tmp_path / "staging",
        command="regen publish",
    )
    sent = published.upload
    assert "data/train-000001.parquet" in sent.uploaded
    assert not {"data/train-000000.parquet", "data/train-000002.parquet"} & set(sent.uploaded)
    assert sent.deleted == [f"tokenized/train-{s:06d}.parquet" for s in range(3)]
    assert hub.count("POST", "/commit/") == 2 and _writes(hub, asked)
    assert hub.uploads - uploads == len(
        [p for p in sent.uploaded if p.endswith((".parquet", ".png"))]
    )
    files = hub.head(REPO_ID)
    assert not any(p.startswith("tokenized/") for p in files)
    assert "config_name: tokenized" not in files["README.md"].decode()


def test_card_metadata_validates_and_says_what_the_run_recorded(
    hub: LoopbackHub, dataset: Storage, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from huggingface_hub import DatasetCard

    assert _publish(capsys, dataset, tmp_path)[0] == 0
    card = DatasetCard(hub.head(REPO_ID)["README.md"].decode())
    card.validate()  # the Hub's own judgement, as push_to_hub asks it
    meta = card.data.to_dict()
    assert meta["license"] == PROMPTS_LICENSE, "the prompt source's card's license"
    assert meta["configs"] == [
        {
            "config_name": "default",
            "data_files": [{"split": "train", "path": "data/train-*.parquet"}],
            "default": True,
        }
    ]
    text = card.text
    provenance = read_provenance(dataset)
    assert provenance is not None and provenance.schema_version == SCHEMA_VERSION
    assert provenance.prompts.license == PROMPTS_LICENSE
    for said in (
        "`hf://Qwen/Qwen3-8B` (default branch), served as `qwen3-8b`",
        "temperature 0.6, top_p 0.95, top_k 20, min_p 0.0, max_tokens 4,096",
        "| 30.0 % | 1.0 |",  # the mix's second setting
        f"`hf://datasets/{PROMPTS}` at commit `{provenance.prompts.source['commit']}`",
        "## Audit: PASS",
        "![lengths](report/lengths.png)",
        "| completion_tokens |",
        f"regen publish {dataset.uri} {REPO}",
        "serving engine | not recorded by the run",
    ):
        assert said in text, said
    print("\n" + hub.head(REPO_ID)["README.md"].decode())


def test_refusals_are_one_line_with_the_readme_exit_codes(
    hub: LoopbackHub, dataset: Storage, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def refused(storage: Storage, *flags: str) -> tuple[int, str]:
        code, out, err = _publish(capsys, storage, tmp_path, *flags)
        assert out == "" and len(err.strip().splitlines()) == 1, err
        return code, err.strip()

    def copy(name: str) -> LocalStorage:
        assert isinstance(dataset, LocalStorage)
        shutil.copytree(dataset.root, tmp_path / name)
        return LocalStorage(tmp_path / name)

    incomplete = copy("incomplete")
    incomplete.delete(manifest_key(2))
    code, said = refused(incomplete)
    assert code == 1 and "incomplete: 1 of 3 planned shards are not committed (shards 2)" in said

    stale = copy("stale")
    rows = synthetic_shard(3, 60, 20, np.random.default_rng(1))
    commit_shard(stale, 3, rows, fingerprint=FINGERPRINT, timings={})
    code, said = refused(stale)
    assert code == 1 and "the audit is older than the data (60 rows audited, 80 committed)" in said

    failed = json.loads(dataset.read_bytes("report/audit.json"))
    failed["verdict"] = "fail"
    dataset.write_bytes("report/audit.json", json.dumps(failed).encode())
    code, said = refused(dataset)
    assert code == 1 and "its audit failed" in said and "--allow-failed" in said

    dataset.delete("report/audit.json")
    code, said = refused(dataset)
    assert code == 2 and "never audited" in said and f"regen audit {dataset.uri}" in said
    code, said = refused(LocalStorage(tmp_path / "nothing-here"))
    assert code == 2 and "not a regen dataset" in said
    assert _writes(hub) == [], "nothing was sent for a refused dataset"


def test_a_stopped_run_is_refused(
    hub: LoopbackHub, dataset: Storage, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from regen.audit.rolling import Finding
    from regen.canary.stop import StopRecord, write_stop_record

    assert isinstance(dataset, LocalStorage)
    storage = dataset
    finding = Finding(check="empty_answer", title="empty", figure=0.87, fail=0.05, rows=256)
    record = StopRecord(
        fingerprint=FINGERPRINT,
        stage="canary",
        rows_audited=256,
        prompts_sent=256,
        prompts_planned=60,
        checks=[finding],
    )
    write_stop_record(storage, record)
    code, _, err = _publish(capsys, storage, tmp_path)
    assert code == 1 and "stopped by the live gate (canary gate stopped the run" in err
    assert len(err.strip().splitlines()) == 1 and _writes(hub) == []


@pytest.mark.parametrize(
    ("token", "writable", "said"),
    [
        (None, None, "no Hugging Face token (HTTP 401: Invalid username or password.)"),
        (READ_TOKEN, None, "this token cannot write here (HTTP 403: Forbidden: you must use"),
        (TOKEN, {"someone-else"}, "this token cannot write here (HTTP 403: You don't have the"),
        ("hf_not_a_token", None, "the token was refused (HTTP 401: Invalid credentials"),
    ],
)
def test_the_hubs_refusals_are_one_line_exit_2(
    hub: LoopbackHub,
    dataset: Storage,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    token: str | None,
    writable: set[str] | None,
    said: str,
) -> None:
    if token is None:
        monkeypatch.delenv("HF_TOKEN")
    else:
        monkeypatch.setenv("HF_TOKEN", token)
    hub.writable = writable
    code, _, err = _publish(capsys, dataset, tmp_path)
    assert code == 2 and said in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert REPO_ID not in hub.repos, "no repo was created"


def test_a_name_of_another_kind_of_repo_is_refused(
    hub: LoopbackHub, dataset: Storage, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hub.commit(REPO_ID, {"config.json": b"{}"}, kind="model")
    code = main(["publish", dataset.uri, f"hf://{REPO_ID}", "--staging", str(tmp_path / "s")])
    err = capsys.readouterr().err
    assert code == 2 and f"hf://{REPO_ID} is a model repo on the Hub, not a dataset" in err
    assert REPO_ID not in hub.repos
    # Named as a dataset, the dataset repo of that name is made beside the model.
    code = main(["publish", dataset.uri, REPO, "--staging", str(tmp_path / "s")])
    assert code == 0 and REPO_ID in hub.repos
    for spec in ("hf://spaces/org/x", "hf://datasets/org/x@dev", "s3://b/x", "hf://org"):
        assert main(["publish", dataset.uri, spec]) == 2
        assert "publish to hf://datasets/ORG/NAME" in capsys.readouterr().err


def test_an_unknown_license_is_the_hubs_refusal_before_any_data_is_sent(
    hub: LoopbackHub, dataset: Storage, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _publish(capsys, dataset, tmp_path, "--license", "apache-2")
    assert code == 2 and "the Hub refused the card's metadata" in err and '"apache-2"' in err
    assert _writes(hub) == []


def test_an_interrupted_upload_resumes_with_what_is_missing(
    hub: LoopbackHub, dataset: Storage, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hub.refuse_uploads_after = 2  # an upload URL that expired mid-publish
    code, _, err = _publish(capsys, dataset, tmp_path, "--tokenized")
    assert code == 1 and "run it again: what was uploaded is not sent twice" in err
    assert len(err.strip().splitlines()) == 1 and hub.uploads == 2
    assert hub.count("POST", "/commit/") == 0, "no commit of a half upload"
    hub.refuse_uploads_after = None
    code, _, err = _publish(capsys, dataset, tmp_path, "--tokenized")
    assert code == 0, err
    lfs = [p for p in hub.head(REPO_ID) if p.endswith((".parquet", ".png"))]
    assert hub.uploads == len(lfs), "the two uploaded before were not sent again"


def test_a_branch_is_made_from_main_and_main_is_left_alone(
    hub: LoopbackHub, dataset: Storage, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _publish(capsys, dataset, tmp_path, "--revision", "v1", "--public")
    assert code == 0, err
    assert f"{REPO}@v1 (created public repo)" in out and "/tree/v1" in out
    assert set(hub.head(REPO_ID, "main")) == {".gitattributes"}
    readme = hub.head(REPO_ID, "v1")["README.md"].decode()
    assert 'load_dataset("regen-org/qwen3-regen", split="train", revision="v1")' in readme
    assert not hub.repos[REPO_ID].private


def test_a_dataset_on_s3_is_published_as_one_on_disk(
    hub: LoopbackHub,
    dataset: Storage,
    moto: MotoS3,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    bucket = moto.create_bucket()
    remote = moto.storage(bucket, "regen/qwen3")
    for key in dataset.list():
        remote.write_bytes(key, dataset.read_bytes(key))
    code, out, err = _publish(capsys, remote, tmp_path)
    assert code == 0, err
    assert "published to" in out and remote.exists(PROVENANCE_KEY), "written beside the report"
    files = hub.head(REPO_ID)
    published = pl.concat(
        pl.read_parquet(io.BytesIO(files[f"data/train-{s:06d}.parquet"])) for s in range(3)
    )
    assert _published(published) == _expected_conversations(remote)
