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
from regen.machine.ports import quiet_port_range
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
    # One listing, the card (its configs, if any), then only the two selected files (each a
    # HEAD and its LFS redirect's GET).
    assert hub.count("GET", "/api/datasets/") == 2  # dataset_info, snapshot_download's tree
    assert hub.count("GET", "/resolve/") == 1 and hub.count("GET", "/README.md") == 1
    assert hub.count("HEAD", ".parquet") == 2 and hub.count("GET", "/cdn/") == 2
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
    assert hub.count("HEAD", ".parquet") == 1


# -- a dataset card's configs (README.md `configs:`), honoured before the conventions ------

CARD = b"""---
license: mit
configs:
- config_name: default
  default: true
  data_files:
  - split: train_sft
    path: data/train_sft-*
  - split: test_sft
    path: data/test_sft-*
- config_name: en
  data_files:
  - split: train
    path: ["english/part-*.parquet", "english/more/*.parquet"]
- config_name: fr
  data_dir: french
---
# A card
"""


def card_repo(hub: LoopbackHub, repo: str = "org/carded") -> str:
    """Files the conventions alone would choose differently: `english/` names no split (all
    four files would be one split), and `english/more/deeper/` is under none of en's patterns
    (`*` stays within one directory)."""
    return hub.commit(
        repo,
        {
            "README.md": CARD,
            "data/train_sft-00000-of-00002-aa.parquet": parquet(ultrachat_rows(0, 30)),
            "data/train_sft-00001-of-00002-bb.parquet": parquet(ultrachat_rows(30, 50)),
            "data/test_sft-00000-of-00001-cc.parquet": parquet(ultrachat_rows(900, 910)),
            "english/part-0.parquet": parquet(ultrachat_rows(100, 105)),
            "english/part-1.parquet": parquet(ultrachat_rows(105, 110)),
            "english/more/b.parquet": parquet(ultrachat_rows(110, 112)),
            "english/more/deeper/c.parquet": parquet(ultrachat_rows(112, 120)),
            "french/train.jsonl": sharegpt_jsonl(0, 4),
            "french/test.jsonl": sharegpt_jsonl(4, 6),
        },
    )


def test_a_card_config_with_a_list_of_patterns_chosen_by_subset(hub: LoopbackHub) -> None:
    sha = card_repo(hub)
    found = load_prompts(
        "hf://datasets/org/carded", options=ReadOptions(columns=ULTRACHAT, subset="en")
    )
    assert found.source == {
        "repo": "org/carded",
        "revision": "main",
        "commit": sha,
        "selected_by": "README.md configs: config en, split train",
        # Pattern by pattern, each one's files in name order; not english/more/deeper/.
        "files": ["english/part-0.parquet", "english/part-1.parquet", "english/more/b.parquet"],
    }
    assert found.valid["id"].to_list() == [f"uc-{i:05d}" for i in range(100, 112)]
    assert hub.count("HEAD", "deeper") == 0 and hub.count("HEAD", "data/") == 0


def test_the_default_config_and_its_named_split(hub: LoopbackHub) -> None:
    card_repo(hub)
    found = load_prompts(
        "hf://datasets/org/carded", options=ReadOptions(columns=ULTRACHAT, split="test_sft")
    )
    assert found.source is not None
    assert found.source["selected_by"] == "README.md configs: config default, split test_sft"
    assert found.source["files"] == ["data/test_sft-00000-of-00001-cc.parquet"]
    # A config with only a data_dir: the naming conventions pick under it.
    found = load_prompts("hf://datasets/org/carded", options=ReadOptions(subset="fr"))
    assert found.source is not None and found.source["files"] == ["french/train.jsonl"]
    assert found.source["selected_by"] == "README.md configs: split train of config fr"
    # A path in the spec names the files itself: the card is not read.
    asked = hub.count("GET", "/README.md")
    found = load_prompts("hf://datasets/org/carded/english/more/deeper/c.parquet")
    assert found.num_valid == 8 and hub.count("GET", "/README.md") == asked


@pytest.mark.parametrize(
    ("split", "subset", "message"),
    [
        (
            None,
            None,
            "hf://datasets/org/carded: no split train in config default of README.md's "
            "configs (splits: train_sft, test_sft): set input.split",
        ),
        (
            "validation",
            "en",
            "hf://datasets/org/carded: no split validation in config en of README.md's "
            "configs (splits: train): set input.split",
        ),
        (
            "train",
            "de",
            "hf://datasets/org/carded: no config de in README.md's configs "
            "(configs: default, en, fr): set input.subset",
        ),
    ],
)
def test_an_unknown_config_or_split_names_the_ones_the_card_declares(
    split: str | None, subset: str | None, message: str, hub: LoopbackHub
) -> None:
    card_repo(hub)
    with pytest.raises(UserError) as err:
        load_prompts("hf://datasets/org/carded", options=ReadOptions(split=split, subset=subset))
    assert str(err.value) == message


def test_a_card_config_offline_from_the_cache(
    hub: LoopbackHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    card_repo(hub)
    options = ReadOptions(columns=ULTRACHAT, subset="en")
    online = load_prompts("hf://datasets/org/carded", options=options)
    hub.stop()
    asked = len(hub.requests)
    _offline(monkeypatch)
    offline = load_prompts("hf://datasets/org/carded", options=options)
    assert offline.valid.equals(online.valid) and offline.source == online.source
    assert len(hub.requests) == asked
    # The card came with the files: offline, an unknown config still names the card's.
    with pytest.raises(UserError, match=r"no config de in README.md's configs \(configs: default"):
        load_prompts("hf://datasets/org/carded", options=ReadOptions(subset="de"))


def test_offline_without_the_card_in_the_cache_says_the_names_chose(
    hub: LoopbackHub, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    card_repo(hub)
    options = ReadOptions(columns=ULTRACHAT, split="train_sft")
    # A path spec reads no card: the cache gets the files only.
    load_prompts("hf://datasets/org/carded/data/train_sft-*", options=options)
    _offline(monkeypatch)
    with caplog.at_level("WARNING", logger="regen.prompts.hub"):
        found = load_prompts("hf://datasets/org/carded", options=options)
    assert found.source is not None and found.source["selected_by"] == "split train_sft"
    assert "README.md is not in the cache" in caplog.text


@pytest.mark.parametrize(
    "pattern",
    [
        "data/*",
        "data/**",
        "**",
        "**/*.parquet",
        "*/train-*.parquet",
        "data/train-0000?.parquet",
        "data/[ab]*.jsonl",
        "data/train-00000.parquet",
        "data",
        "README.md",
        "*.md",
        ".hidden/*",
        "*/*",
        "__pycache__/*",
        "**/x.json",
        "data/**/*.jsonl",
    ],
)
def test_patterns_match_as_datasets_resolves_them(pattern: str, tmp_path: Path) -> None:
    """`datasets`' own resolve_pattern, on the same files on disk, is the reference."""
    from datasets.data_files import resolve_pattern  # type: ignore[import-untyped]

    from regen.prompts.hub import _matching

    paths = [
        "README.md",
        "config.json",
        "data/train-00000.parquet",
        "data/train-00001.parquet",
        "data/a.jsonl",
        "data/b.jsonl",
        "data/c.jsonl",
        "data/deep/x.json",
        "data/deep/deeper/y.jsonl",
        "data/.hidden.jsonl",
        ".hidden/z.jsonl",
        "__pycache__/w.jsonl",
        "top.parquet",
    ]
    for path in paths:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("x")
    try:
        expected = resolve_pattern(pattern, base_path=tmp_path.as_posix())
    except FileNotFoundError:
        expected = []
    listing = [HubFile(p, 1) for p in sorted(paths)]
    ours = [f.path for f in _matching(HubUri.parse("hf://datasets/o/n"), listing, pattern)]
    assert ours == [Path(p).relative_to(tmp_path).as_posix() for p in expected]


@pytest.mark.parametrize(
    ("data_files", "data_dir", "chosen"),
    [
        ("sub/a.jsonl", None, ["sub/a.jsonl"]),  # one path: the split train
        (["sub/b.jsonl", "sub/a.jsonl"], None, ["sub/b.jsonl", "sub/a.jsonl"]),  # in their order
        (["sub/*.jsonl", "sub/a.jsonl"], None, ["sub/a.jsonl", "sub/b.jsonl"]),  # each file once
        ([{"split": "train", "path": "*.jsonl"}], "sub", ["sub/a.jsonl", "sub/b.jsonl"]),
    ],
)
def test_data_files_forms_and_data_dir(
    data_files: Any, data_dir: str | None, chosen: list[str]
) -> None:
    from regen.prompts.hub import _configs

    listing = [HubFile(f, 1) for f in ["sub/a.jsonl", "sub/b.jsonl", "top.jsonl", "README.md"]]
    uri = HubUri.parse("hf://datasets/o/n")
    card = {"configs": [{"config_name": "c", "data_files": data_files, "data_dir": data_dir}]}
    found, how = _select(uri, listing, None, None, _configs(uri, card))
    assert [f.path for f in found] == chosen and how == "README.md configs: config c, split train"


def test_several_configs_and_none_the_default_asks_for_input_subset() -> None:
    from regen.prompts.hub import _configs

    uri = HubUri.parse("hf://datasets/o/n")
    card = {"configs": [{"config_name": "a"}, {"config_name": "b"}]}
    listing = [HubFile("a/train.jsonl", 1), HubFile("b/train.jsonl", 1)]
    with pytest.raises(UserError) as err:
        _select(uri, listing, None, None, _configs(uri, card))
    assert str(err.value) == (
        "hf://datasets/o/n: README.md declares configs a, b and none is the default: "
        "set input.subset"
    )
    found, _ = _select(uri, listing, None, "b", _configs(uri, card))
    assert [f.path for f in found] == ["a/train.jsonl", "b/train.jsonl"], "no data_dir: all"


def test_a_split_with_files_regen_cannot_read_is_refused() -> None:
    from regen.prompts.hub import _configs

    uri = HubUri.parse("hf://datasets/o/n")
    card = {"configs": [{"config_name": "c", "data_files": "data/*"}]}
    listing = [HubFile("data/a.parquet", 1), HubFile("data/b.csv", 1)]
    with pytest.raises(UserError, match=r"has files regen cannot read \(data/b.csv\)"):
        _select(uri, listing, None, None, _configs(uri, card))


def test_a_malformed_card_is_one_line_naming_the_card(hub: LoopbackHub) -> None:
    for header, problem in [
        (b"configs: [{data_files: x.jsonl}]", "each config needs a config_name"),
        (b"configs:\n- config_name: a\n  data_files: {train: x}", "config a: data_files must"),
        (
            b"configs:\n- config_name: a\n  default: true\n- config_name: b\n  default: true",
            "several configs are the default",
        ),
        (b"configs: [", "README.md's YAML header does not parse"),
    ]:
        hub.commit("org/bad", {"README.md": b"---\n" + header + b"\n---\n"}, replace=True)
        hub.commit("org/bad", {"train.jsonl": sharegpt_jsonl(0, 2)})
        with pytest.raises(UserError) as err:
            load_prompts("hf://datasets/org/bad")
        assert str(err.value).startswith("hf://datasets/org/bad: "), err.value
        assert problem in str(err.value) and "\n" not in str(err.value), err.value


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


def test_check_says_the_card_chose_the_files(
    hub: LoopbackHub,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    sha = card_repo(hub)
    code, out = _check(
        tmp_path,
        capsys,
        "hf://datasets/org/carded",
        input={"subset": "en", "id_column": "prompt_id"},
    )
    assert (
        f"hf://datasets/org/carded at commit {sha}: README.md configs: config en, split train, "
        "3 files" in out
    ), out
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
        (
            "no such config split",
            "org/carded: no split dev in config default of README.md's configs (splits: "
            "train_sft, test_sft): set input.split",
        ),
        (
            "no such config",
            "org/carded: no config de in README.md's configs (configs: default, en, fr)",
        ),
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
    elif case.startswith("no such config"):
        card_repo(hub)
        prompts = "hf://datasets/org/carded"
        extra = {"input": {"split": "dev"} if case.endswith("split") else {"subset": "de"}}
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
    """The README's air-gapped recipe: `hf download` on a connected machine, then offline;
    the card comes along, so its configs choose offline as they do online."""
    sha = card_repo(hub, "HuggingFaceH4/ultrachat")
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
            "--include",
            "README.md",
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
    assert found.source["selected_by"] == "README.md configs: config default, split train_sft"


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
