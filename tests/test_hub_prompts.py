"""Prompt sets straight from the Hugging Face Hub (issue 32), against a loopback Hub
(support/hub.py) that answers the requests huggingface_hub really makes: dataset info,
tree listing, resolve with ETags and an LFS redirect to a CDN host. Each test has its own
cache (HF_HUB_CACHE) and huggingface_hub's import-time settings pointed at the loopback Hub.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import yaml

from flows.cli import main
from regen.errors import ConfigError, UserError
from regen.ports import quiet_port_range
from regen.prompts import ReadOptions, load_prompts, preview
from regen.prompts.formats import Columns
from regen.prompts.hub import HubFile, HubUri, _select
from support.hub import TOKEN, LoopbackHub, loopback_hub
from tests.support.hub import hub_settings

ULTRACHAT = Columns(id="prompt_id")


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[LoopbackHub]:
    with loopback_hub() as server:
        hub_settings(monkeypatch, server.endpoint, tmp_path / "hf")
        yield server


def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


def ultrachat_rows(start: int, stop: int) -> list[dict[str, Any]]:
    """UltraChat_200k's layout: prompt, prompt_id, and messages that end with the answer."""
    return [
        {
            "prompt": f"Question {i}: name a prime above {i}.",
            "prompt_id": f"uc-{i:05d}",
            "messages": [
                {"role": "user", "content": f"Question {i}: name a prime above {i}."},
                {"role": "assistant", "content": f"An old answer {i}."},
            ],
        }
        for i in range(start, stop)
    ]


def parquet(rows: list[dict[str, Any]]) -> bytes:
    buf = io.BytesIO()
    pl.DataFrame(rows).write_parquet(buf)
    return buf.getvalue()


def sharegpt_jsonl(start: int, stop: int) -> bytes:
    lines = [
        json.dumps(
            {
                "id": f"sg-{i}",
                "conversations": [
                    {"from": "human", "value": f"Tell me about {i}."},
                    {"from": "gpt", "value": "It is a number."},
                ],
            }
        )
        for i in range(start, stop)
    ]
    return ("\n".join(lines) + "\n").encode()


def ultrachat_repo(hub: LoopbackHub, repo: str = "HuggingFaceH4/ultrachat", **kw: Any) -> str:
    """Two shards of train_sft and one of test_sft, as push_to_hub names them."""
    return hub.commit(
        repo,
        {
            "README.md": b"---\nlicense: mit\n---\n",
            "data/train_sft-00000-of-00002-aa.parquet": parquet(ultrachat_rows(0, 30)),
            "data/train_sft-00001-of-00002-bb.parquet": parquet(ultrachat_rows(30, 50)),
            "data/test_sft-00000-of-00001-cc.parquet": parquet(ultrachat_rows(900, 910)),
        },
        **kw,
    )


def test_ultrachat_split_reads_both_shards_of_one_commit_by_prompt_id(hub: LoopbackHub) -> None:
    sha = ultrachat_repo(hub)
    options = ReadOptions(columns=ULTRACHAT, split="train_sft")
    found = load_prompts("hf://datasets/HuggingFaceH4/ultrachat", options=options)
    assert found.valid["id"].to_list() == [f"uc-{i:05d}" for i in range(50)], "every id once"
    assert found.num_rejected == 0 and found.formats == {"messages": 50}
    assert found.path == f"hf://datasets/HuggingFaceH4/ultrachat@{sha}"
    assert found.source == {
        "repo": "HuggingFaceH4/ultrachat",
        "revision": "main",
        "commit": sha,
        "selected_by": "split train_sft",
        "files": [
            "data/train_sft-00000-of-00002-aa.parquet",
            "data/train_sft-00001-of-00002-bb.parquet",
        ],
    }
    # The conversation is kept as given; `turns: last` regenerates its final answer.
    assert [m["role"] for m in found.valid["messages"][0]] == ["user", "assistant"]
    # One listing, then only the two selected files (each a HEAD and its LFS redirect's GET).
    assert hub.count("GET", "/api/datasets/") == 2  # dataset_info, snapshot_download's tree
    assert hub.count("HEAD", "/resolve/") == 2 and hub.count("GET", "/cdn/") == 2
    assert hub.count("HEAD", "test_sft") == 0, "the other split is not downloaded"


def test_default_split_is_train_or_the_only_one(hub: LoopbackHub) -> None:
    ultrachat_repo(hub)
    with pytest.raises(UserError) as err:
        load_prompts(
            "hf://datasets/HuggingFaceH4/ultrachat", options=ReadOptions(columns=ULTRACHAT)
        )
    assert str(err.value) == (
        "hf://datasets/HuggingFaceH4/ultrachat: no files of split train (splits present: "
        "test_sft, train_sft): set input.split"
    )
    hub.commit("org/sharegpt", {"sharegpt_clean.jsonl": sharegpt_jsonl(0, 5)})
    found = load_prompts("hf://datasets/org/sharegpt")
    assert found.valid["id"].to_list() == [f"sg-{i}" for i in range(5)]
    assert found.formats == {"sharegpt": 5}
    assert found.source is not None and found.source["selected_by"].startswith("all 1 files")


@pytest.mark.parametrize(
    ("files", "split", "subset", "chosen"),
    [
        (
            [
                "data/train-00000-of-00002.parquet",
                "data/train-00001-of-00002.parquet",
                "data/test-00000-of-00001.parquet",
            ],
            None,
            None,
            ["data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet"],
        ),
        (["train.jsonl", "test.jsonl", "README.md"], None, None, ["train.jsonl"]),
        (
            ["train/part-1.jsonl", "train/part-2.jsonl", "validation/a.jsonl"],
            "validation",
            None,
            ["validation/a.jsonl"],
        ),
        (["en/train.parquet", "de/train.parquet"], None, "de", ["de/train.parquet"]),
        (
            ["data/train_sft-00000-of-00001.parquet", "data/train_gen-00000-of-00001.parquet"],
            "train_gen",
            None,
            ["data/train_gen-00000-of-00001.parquet"],
        ),
        (["training_1.jsonl", "eval.jsonl"], None, None, ["training_1.jsonl"]),
        (["magpie.parquet"], None, None, ["magpie.parquet"]),
    ],
)
def test_split_conventions(
    files: list[str], split: str | None, subset: str | None, chosen: list[str]
) -> None:
    uri = HubUri.parse("hf://datasets/o/n")
    found, _ = _select(uri, [HubFile(f, 1) for f in files], split, subset)
    assert [f.path for f in found] == chosen


def test_uri_forms() -> None:
    assert HubUri.parse("hf://datasets/o/n") == HubUri("o/n", None, "")
    assert HubUri.parse("hf://datasets/o/n@v1.0/data/*.parquet") == HubUri(
        "o/n", "v1.0", "data/*.parquet"
    )
    assert HubUri.parse("hf://datasets/o/n@refs%2Fpr%2F3") == HubUri("o/n", "refs/pr/3", "")
    for bad in ("hf://datasets/HuggingFaceH4", "hf://o/n", "hf://datasets//n"):
        with pytest.raises(ConfigError):
            HubUri.parse(bad)


def test_sharegpt_jsonl_by_glob_and_a_renamed_conversation_column(hub: LoopbackHub) -> None:
    chat = [
        {"uid": "c-1", "dialog": [{"role": "user", "content": "Hi"}], "prompt": "ignored"},
        {"uid": "c-2", "dialog": [{"from": "human", "value": "Yo"}, {"from": "gpt", "value": "A"}]},
    ]
    hub.commit(
        "org/mixed",
        {
            "sharegpt/part-1.jsonl": sharegpt_jsonl(0, 3),
            "sharegpt/part-2.jsonl": sharegpt_jsonl(3, 6),
            "other/chat.jsonl": "".join(json.dumps(r) + "\n" for r in chat).encode(),
        },
    )
    found = load_prompts("hf://datasets/org/mixed/sharegpt/*.jsonl")
    assert found.valid["id"].to_list() == [f"sg-{i}" for i in range(6)]
    renamed = ReadOptions(columns=Columns(id="uid", messages="dialog"))
    found = load_prompts("hf://datasets/org/mixed/other/chat.jsonl", options=renamed)
    assert found.valid["id"].to_list() == ["c-1", "c-2"] and found.num_rejected == 0
    assert [m["content"] for m in found.valid["messages"][1]] == ["Yo", "A"]


def test_a_pinned_revision_reads_its_rows_after_main_moves_on(hub: LoopbackHub) -> None:
    first = ultrachat_repo(hub)
    hub.commit(
        "HuggingFaceH4/ultrachat",
        {"data/train_sft-00002-of-00002-dd.parquet": parquet(ultrachat_rows(50, 60))},
    )
    options = ReadOptions(columns=ULTRACHAT, split="train_sft")
    latest = load_prompts("hf://datasets/HuggingFaceH4/ultrachat", options=options)
    pinned = load_prompts(f"hf://datasets/HuggingFaceH4/ultrachat@{first}", options=options)
    assert latest.num_valid == 60 and pinned.num_valid == 50
    assert pinned.source is not None and pinned.source["commit"] == first


def test_offline_reads_the_filled_cache_and_makes_no_request(
    hub: LoopbackHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    sha = ultrachat_repo(hub)
    options = ReadOptions(columns=ULTRACHAT, split="train_sft")
    online = load_prompts("hf://datasets/HuggingFaceH4/ultrachat", options=options)
    hub.stop()
    asked = len(hub.requests)
    # The Hub gone without HF_HUB_OFFLINE: huggingface_hub's fallback, the cached commit.
    unreachable = load_prompts("hf://datasets/HuggingFaceH4/ultrachat", options=options)
    assert unreachable.valid.equals(online.valid) and unreachable.source == online.source
    _offline(monkeypatch)
    offline = load_prompts("hf://datasets/HuggingFaceH4/ultrachat", options=options)
    assert offline.valid.equals(online.valid) and offline.source == online.source
    assert offline.path.endswith(f"@{sha}") and len(hub.requests) == asked
    # The other split was never fetched: offline, it is not there to read.
    with pytest.raises(UserError, match="no prompt file matches split test_sft"):
        load_prompts(
            "hf://datasets/HuggingFaceH4/ultrachat",
            options=ReadOptions(columns=ULTRACHAT, split="test_sft"),
        )


def test_preview_downloads_only_the_first_file(hub: LoopbackHub) -> None:
    ultrachat_repo(hub)
    options = ReadOptions(columns=ULTRACHAT, split="train_sft")
    found = preview("hf://datasets/HuggingFaceH4/ultrachat", 10, options=options)
    assert (found.valid, found.rejected) == (10, 0)
    assert hub.count("HEAD", "/resolve/") == 1


# -- the errors, through `regen check` ---------------------------------------------------


def _check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], prompts: str, **extra: Any
) -> tuple[int, str]:
    """`regen check` on a rehearsal-like config (emulator engine: no GPU checks)."""
    from regen.rehearsal import bundled

    config = {
        "model": {"source": str(bundled("emulator-model")), "served_name": "emu", "stage": False},
        "engine": {"kind": "emulator", "gpus": [0], "base_port": quiet_port_range(1)},
        "prompts": prompts,
        "output": str(tmp_path / "out"),
        "work_dir": str(tmp_path / "work"),
        **extra,
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    capsys.readouterr()
    code = main(["check", "--config", str(path)])
    captured = capsys.readouterr()
    return code, " ".join((captured.out + captured.err).replace("│", " ").split())


def test_check_resolves_and_lists_without_downloading(
    hub: LoopbackHub,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    sha = ultrachat_repo(hub)
    code, out = _check(
        tmp_path,
        capsys,
        "hf://datasets/HuggingFaceH4/ultrachat",
        input={"split": "train_sft", "id_column": "prompt_id"},
    )
    assert f"hf://datasets/HuggingFaceH4/ultrachat at commit {sha}: split train_sft, 2 files" in out
    assert "data/train_sft-00000-of-00002-aa.parquet" in out
    assert hub.count("HEAD", "train_sft-00001") == 0, "only the first file is read"
    assert "prompts pass" in out, out
    assert code == 0, out


_NOT_FOUND = "repository not found, or private: check ORG/NAME, or set HF_TOKEN"


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("unknown repo", f"org/nope: {_NOT_FOUND}"),
        ("unknown revision", "org/public@v9: revision v9 not found on the Hub"),
        ("private, no token", f"org/private: {_NOT_FOUND}"),
        ("private, wrong token", "org/private: repository not found (or the token given cannot"),
        ("gated, no token", "org/gated: gated: accept its conditions on the Hub page, then set"),
        ("no such split", "org/public: no prompt file matches split dev (splits present: train)"),
        ("hub down, no cache", "org/public: cannot reach the Hub at http://127.0.0.1:"),
        ("offline, no cache", "org/public: HF_HUB_OFFLINE=1 and the cache"),
    ],
)
def test_hub_errors_are_one_line_naming_the_repo_and_the_fix(
    case: str,
    message: str,
    hub: LoopbackHub,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "1000")
    hub.commit("org/public", {"train.jsonl": sharegpt_jsonl(0, 3)})
    hub.commit("org/private", {"train.jsonl": sharegpt_jsonl(0, 3)}, private=True)
    hub.commit("org/gated", {"train.jsonl": sharegpt_jsonl(0, 3)}, gated=True)
    prompts, extra = "hf://datasets/org/public", {}
    if case == "unknown repo":
        prompts = "hf://datasets/org/nope"
    elif case == "unknown revision":
        prompts = "hf://datasets/org/public@v9"
    elif case.startswith("private"):
        prompts = "hf://datasets/org/private"
        if case.endswith("wrong token"):
            monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    elif case == "gated, no token":
        prompts = "hf://datasets/org/gated"
    elif case == "no such split":
        extra = {"input": {"split": "dev"}}
    elif case == "hub down, no cache":
        hub.stop()
    elif case == "offline, no cache":
        _offline(monkeypatch)
    code, out = _check(tmp_path, capsys, prompts, **extra)
    assert code == 1
    assert "Traceback" not in out
    assert f"prompt source fail hf://datasets/{message}" in out, out


def test_the_token_reads_private_and_gated_repos(
    hub: LoopbackHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub.commit("org/private", {"train.jsonl": sharegpt_jsonl(0, 3)}, private=True)
    hub.commit("org/gated", {"train.jsonl": sharegpt_jsonl(0, 3)}, gated=True)
    assert (
        load_prompts("hf://datasets/org/private", options=ReadOptions(hf_token=TOKEN)).num_valid
        == 3
    )
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert load_prompts("hf://datasets/org/gated").num_valid == 3


def test_a_malformed_uri_is_a_config_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = _check(tmp_path, capsys, "hf://datasets/HuggingFaceH4")
    assert code == 2
    assert (
        "prompts: hf://datasets/HuggingFaceH4: expected hf://datasets/ORG/NAME[@REVISION][/PATH]"
        in out
    )


def test_a_cache_filled_by_hf_download_serves_an_offline_run(
    hub: LoopbackHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's air-gapped recipe: `hf download` on a connected machine, then offline."""
    sha = ultrachat_repo(hub)
    env = {**os.environ, **hub.env(str(tmp_path / "hf"))}
    done = subprocess.run(
        [
            str(Path(sys.executable).with_name("hf")),
            "download",
            "HuggingFaceH4/ultrachat",
            "--repo-type",
            "dataset",
            "--include",
            "data/train_sft-*",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    hub.stop()
    _offline(monkeypatch)
    found = load_prompts(
        "hf://datasets/HuggingFaceH4/ultrachat",
        options=ReadOptions(columns=ULTRACHAT, split="train_sft"),
    )
    assert found.num_valid == 50 and found.source is not None and found.source["commit"] == sha


def test_the_plan_carries_the_commit_every_node_reads(hub: LoopbackHub, tmp_path: Path) -> None:
    """A multi-node parent hands its nodes `plan.input_path`: the commit it planned from, so
    a node starting after `main` moved on reads the same rows."""
    from regen.generation.run_plan import plan_run
    from regen.rehearsal import rehearsal_config
    from regen.storage import LocalStorage

    first = ultrachat_repo(hub)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"input": {"split": "train_sft", "id_column": "prompt_id"}}))
    config = rehearsal_config(
        config_path=path, prompts="hf://datasets/HuggingFaceH4/ultrachat", out=str(tmp_path / "o")
    )
    config = config.model_copy(update={"work_dir": tmp_path / "work"})
    plan = plan_run(config, LocalStorage(tmp_path / "o"))
    assert plan.input_path == f"hf://datasets/HuggingFaceH4/ultrachat@{first}"
    assert plan.num_rows == 50
    hub.commit(
        "HuggingFaceH4/ultrachat",
        {"data/train_sft-00009-of-00009-x.parquet": parquet(ultrachat_rows(50, 55))},
    )
    node = plan_run(
        config.model_copy(update={"prompts": plan.input_path}), LocalStorage(tmp_path / "o")
    )
    assert (node.num_rows, node.changes, node.input_path) == (50, "", plan.input_path)
