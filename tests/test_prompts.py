"""Prompt reading: every reject reason, every unreadable-file case, Parquet, bounded memory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from regen.dataset import REJECTS_KEY
from regen.dataset.rejects import write_rejects
from regen.errors import UserError
from regen.prompts import load_prompts, preview
from regen.storage import LocalStorage

GOOD = {"id": "good", "messages": [{"role": "user", "content": "Hello"}]}
SAMPLE = Path(__file__).parents[1] / "regen" / "data" / "sample_prompts.jsonl"


def _jsonl(tmp_path: Path, *lines: object, name: str = "prompts.jsonl") -> Path:
    path = tmp_path / name
    text = "\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n"
    path.write_text(text, encoding="utf-8")
    return path


def _chat(value: Any) -> Any:
    """Messages as read, less the tool fields a message without tools holds as null."""
    if isinstance(value, dict):
        return {
            k: _chat(v)
            for k, v in value.items()
            if not (k in ("tool_calls", "tool_call_id") and v is None)
        }
    if isinstance(value, list | tuple):
        return type(value)(_chat(v) for v in value)
    return value


def _msgs(*pairs: tuple[str, object]) -> list[dict[str, object]]:
    return [{"role": role, "content": content} for role, content in pairs]


REJECTS = {
    "malformed JSON": ('{"messages": [', "not valid JSON"),
    "array line": ("[1, 2]", "a JSON array, not an object"),
    "scalar line": ('"just text"', "a JSON string, not an object"),
    "messages not a list": ({"messages": "hi"}, "messages must be a list"),
    "message not an object": ({"messages": ["hi"]}, "message 0: not a {role, content} object"),
    "content a number": ({"messages": _msgs(("user", 5))}, "content must be a string"),
    "content parts": (
        {"messages": _msgs(("user", [{"type": "text", "text": "x"}]))},
        "content parts are not supported",
    ),
    "null content": ({"messages": _msgs(("user", None))}, "message 0: content is missing or null"),
    "missing role": ({"messages": [{"content": "x"}]}, "message 0: role is missing"),
    "role a number": ({"messages": [{"role": 1, "content": "x"}]}, "role must be a string"),
    "empty messages": ({"messages": []}, "messages is empty"),
    "bad role": (
        {"messages": _msgs(("system", "s"), ("robot", "x"))},
        "message 1: role robot is not user/system/assistant/tool",
    ),
    "stray tool result": (
        {"messages": _msgs(("system", "s"), ("tool", "x"))},
        "message 1: a tool result must follow an assistant message with tool_calls",
    ),
    "no user message": (
        {"messages": _msgs(("system", "s"), ("assistant", "a"))},
        "no user message",
    ),
    "last user message empty": (
        {"messages": _msgs(("user", "q"), ("assistant", "a"), ("user", " "), ("assistant", "b"))},
        "empty prompt",
    ),
    "duplicate id": ({"id": "good", "messages": _msgs(("user", "other"))}, "duplicate id"),
    "empty prompt": ({"messages": _msgs(("user", "  \n"))}, "empty prompt"),
    "too big": ({"messages": _msgs(("user", "x" * 2000))}, "prompt is 2000 bytes, over the limit"),
    "id a float": ({"id": 1.5, "messages": _msgs(("user", "x"))}, "id must be a string or an"),
    "id a bool": ({"id": True, "messages": _msgs(("user", "x"))}, "id must be a string or an"),
    "id empty": ({"id": "", "messages": _msgs(("user", "x"))}, "id is empty"),
    "neither": ({"id": "n", "text": "x"}, "has neither messages nor prompt"),
    "both": ({"messages": _msgs(("user", "x")), "prompt": "y"}, "has both messages and prompt"),
    "system beside messages": (
        {"messages": _msgs(("user", "x")), "system": "s"},
        "system is for prompt and conversations rows",
    ),
}


@pytest.mark.parametrize("line, reason", REJECTS.values(), ids=REJECTS.keys())
def test_each_reject_reason_names_its_line(tmp_path: Path, line: str | dict, reason: str) -> None:
    extra = {"id": "also-good", "messages": _msgs(("user", "Bye"))}
    path = _jsonl(tmp_path, GOOD, line, extra)
    ps = load_prompts(str(path), max_prompt_bytes=1000)
    assert ps.valid.get_column("id").to_list() == ["good", "also-good"]
    assert ps.valid.get_column("line").to_list() == [1, 3]
    assert ps.rejects.get_column("line").to_list() == [2]
    assert reason in ps.rejects.get_column("reason")[0]


def test_prompt_rows_with_system_are_normalised_and_reject_non_strings(tmp_path: Path) -> None:
    path = _jsonl(
        tmp_path,
        {"id": 7, "prompt": "Hi", "system": "Be brief"},
        {"prompt": "Plain"},
        {"prompt": 12},
        {"prompt": ""},
        {"prompt": "x", "system": ["no"]},
    )
    ps = load_prompts(str(path))
    assert ps.format == "prompt"
    assert _chat(ps.valid.get_column("messages").to_list()) == [
        _msgs(("system", "Be brief"), ("user", "Hi")),
        _msgs(("user", "Plain")),
    ]
    assert ps.valid.get_column("id")[0] == "7"
    assert ps.rejects.get_column("reason").to_list() == [
        "prompt must be a string",
        "empty prompt",
        "system must be a string",
    ]


def _turns(*pairs: tuple[str, object]) -> list[dict[str, object]]:
    return [{"from": speaker, "value": value} for speaker, value in pairs]


def test_sharegpt_rows_are_normalised_to_chat_roles(tmp_path: Path) -> None:
    path = _jsonl(
        tmp_path,
        {"id": "s1", "conversations": _turns(("system", "S"), ("human", "Q"), ("gpt", "A"))},
        {"conversations": _turns(("human", "Hi")), "weight": 1},
    )
    ps = load_prompts(str(path))
    assert (ps.format, ps.num_rejected) == ("sharegpt", 0)
    assert _chat(ps.valid.get_column("messages").to_list()) == [
        _msgs(("system", "S"), ("user", "Q"), ("assistant", "A")),
        _msgs(("user", "Hi")),
    ]
    # The id hashes the normalised messages: the same chat as a messages row gets the same id.
    as_messages = _jsonl(tmp_path, {"messages": _msgs(("user", "Hi"))}, name="m.jsonl")
    assert ps.valid["id"][1] == load_prompts(str(as_messages)).valid["id"][0]


SHAREGPT_REJECTS = {
    "bad from": (
        {"conversations": _turns(("human", "q"), ("robot", "x"))},
        "message 1: from robot is not human, gpt or system (nor user, assistant, chatgpt, bing",
    ),
    "missing from": ({"conversations": [{"value": "x"}]}, "message 0: from is missing"),
    "from a number": ({"conversations": [{"from": 3, "value": "x"}]}, "from must be a string"),
    "value a number": ({"conversations": _turns(("human", 3))}, "value must be a string"),
    "null value": ({"conversations": _turns(("human", None))}, "message 0: value is missing"),
    "turn not an object": (
        {"conversations": ["hi"]},
        "message 0: not a {from, value} or {role, content} object",
    ),
    "not a list": ({"conversations": "hi"}, "conversations must be a list"),
    "empty": ({"conversations": []}, "conversations is empty"),
    "no human turn": ({"conversations": _turns(("system", "s"), ("gpt", "a"))}, "no user message"),
    "empty last human": ({"conversations": _turns(("human", ""), ("gpt", "a"))}, "empty prompt"),
    "both keys": (
        {"conversations": _turns(("human", "x")), "messages": _msgs(("user", "x"))},
        "has both conversations and messages",
    ),
    "system key and a system turn": (
        {"conversations": _turns(("system", "a"), ("human", "x")), "system": "s"},
        "system given twice: the system key and a system turn",
    ),
}


@pytest.mark.parametrize("line, reason", SHAREGPT_REJECTS.values(), ids=SHAREGPT_REJECTS.keys())
def test_sharegpt_reject_reasons_name_their_line(
    tmp_path: Path, line: str | dict, reason: str
) -> None:
    first = {"id": "a", "conversations": _turns(("human", "q"), ("gpt", "a"))}
    last = {"id": "b", "conversations": _turns(("human", "q2"))}
    ps = load_prompts(str(_jsonl(tmp_path, first, line, last)))
    assert ps.format == "sharegpt"
    assert ps.valid.get_column("id").to_list() == ["a", "b"]
    assert ps.rejects.get_column("line").to_list() == [2]
    assert reason in ps.rejects.get_column("reason")[0]


MIXED = {
    "sharegpt among messages": (
        [GOOD, {"conversations": _turns(("human", "x"))}],
        {"messages": 1, "sharegpt": 1},
        [(1, _msgs(("user", "Hello"))), (2, _msgs(("user", "x")))],
        [],
    ),
    # The prompt row on line 3 is line 2's chat again: one content hash, so one duplicate.
    "prompt among messages": (
        [GOOD, {"messages": _msgs(("user", "y"))}, {"prompt": "y"}, {"prompt": "z"}],
        {"messages": 2, "prompt": 1},
        [(1, _msgs(("user", "Hello"))), (2, _msgs(("user", "y"))), (4, _msgs(("user", "z")))],
        [(3, "duplicate id (first on line 2)")],
    ),
    "messages among sharegpt, after a bad line": (
        ["{not json", {"conversations": _turns(("human", "q"))}, GOOD],
        {"messages": 1, "sharegpt": 1},
        [(2, _msgs(("user", "q"))), (3, _msgs(("user", "Hello")))],
        [(1, "not valid JSON")],
    ),
    "prompt among sharegpt": (
        [{"conversations": _turns(("human", "q"))}, {"prompt": "x", "system": "s"}],
        {"prompt": 1, "sharegpt": 1},
        [(1, _msgs(("user", "q"))), (2, _msgs(("system", "s"), ("user", "x")))],
        [],
    ),
}


@pytest.mark.parametrize("lines, formats, valid, rejects", MIXED.values(), ids=MIXED.keys())
def test_a_file_mixing_formats_is_read_row_by_row(
    tmp_path: Path,
    lines: list[str | dict],
    formats: dict[str, int],
    valid: list[tuple[int, list[dict[str, object]]]],
    rejects: list[tuple[int, str]],
) -> None:
    """Each row describes itself: every row is read by its own format, none is refused for
    differing from the others (rows of another format were once a whole-file refusal)."""
    path = _jsonl(tmp_path, *lines)
    ps = load_prompts(str(path))
    assert (ps.formats, ps.format) == (formats, "mixed")
    assert _chat(ps.valid.select("line", "messages").rows()) == valid
    assert ps.rejects.select("line", "reason").rows() == rejects
    found = preview(str(path))
    assert (found.formats, found.format) == (formats, "mixed")
    assert (found.rows_checked, found.valid, found.rejected) == (
        len(lines),
        len(valid),
        len(rejects),
    )


def test_each_format_keeps_its_own_checks_in_a_mixed_file(tmp_path: Path) -> None:
    """A row is checked as its own format, whatever the rows around it are; only a row of no
    format (none of the keys, two formats' keys, an empty list) is rejected for its format."""
    lines: list[dict[str, Any]] = [
        {"id": "m", "messages": _msgs(("user", "a"))},
        {"id": "p", "prompt": "b", "system": "S"},
        {"id": "s", "conversations": _turns(("system", "S"), ("human", "c"), ("gpt", "d"))},
        {"id": "r", "conversations": _msgs(("user", "e")), "system": "S"},
        {"id": "u", "prompt": "f", "messages": _msgs(("user", "f"), ("assistant", "g"))},
        {"id": "x1", "messages": _msgs(("user", "h")), "system": "S"},
        {"id": "x2", "conversations": _turns(("human", "i"), ("robot", "j"))},
        {"id": "x3", "conversations": _turns(("human", None))},
        {"id": "x4", "messages": _msgs(("user", None))},
        {"id": "x5", "prompt": ""},
        {"id": "x6", "prompt": "k", "conversations": _turns(("human", "k"))},
        {"id": "x7", "prompt": "l", "messages": _msgs(("user", "other"))},
        {"id": "x8", "text": "m"},
        {"id": "x9", "conversations": []},
    ]
    for path in (_jsonl(tmp_path, *lines), tmp_path / "mixed.parquet"):
        if path.suffix == ".parquet":
            pl.DataFrame(lines).write_parquet(path)
        ps = load_prompts(str(path))
        assert ps.formats == {"messages": 3, "prompt": 1, "sharegpt": 1}, path
        assert _chat(ps.valid.select("id", "messages").rows()) == [
            ("m", _msgs(("user", "a"))),
            ("p", _msgs(("system", "S"), ("user", "b"))),
            ("s", _msgs(("system", "S"), ("user", "c"), ("assistant", "d"))),
            ("r", _msgs(("system", "S"), ("user", "e"))),
            ("u", _msgs(("user", "f"), ("assistant", "g"))),
        ]
        assert ps.rejects.rows() == [
            (6, "x1", "system is for prompt and conversations rows; put a system message first"),
            (
                7,
                "x2",
                "message 1: from robot is not human, gpt or system "
                "(nor user, assistant, chatgpt, bing, bard, function_call, observation, tool)",
            ),
            (8, "x3", "message 0: value is missing or null"),
            (9, "x4", "message 0: content is missing or null"),
            (10, "x5", "empty prompt"),
            (11, "x6", "has both conversations and prompt"),
            (12, "x7", "has both messages and prompt (and prompt is not its first user message)"),
            (13, "x8", "has neither messages nor prompt nor conversations"),
            (14, "x9", "conversations is empty"),
        ], path


def test_ids_without_id_are_content_hashes_unique_across_formats(tmp_path: Path) -> None:
    """An id-less row's id hashes its normalised chat: the same in a mixed file as in a file of
    its own format, different for different chats, and one chat in two formats is one id."""
    rows: list[dict[str, Any]] = [
        {"prompt": "A"},
        {"messages": _msgs(("user", "B"))},
        {"conversations": _turns(("human", "C"))},
        {"conversations": _msgs(("user", "D"))},
        {"prompt": "E", "system": "S"},
    ]
    mixed = load_prompts(str(_jsonl(tmp_path, *rows, name="mixed.jsonl")))
    alone = [
        load_prompts(str(_jsonl(tmp_path, row, name=f"alone{i}.jsonl"))).valid["id"][0]
        for i, row in enumerate(rows)
    ]
    ids = mixed.valid.get_column("id").to_list()
    assert ids == alone and len(set(ids)) == len(rows)
    assert all(i.startswith("h-") and len(i) == 18 for i in ids)
    again = load_prompts(str(_jsonl(tmp_path, *rows, name="again.jsonl")))
    assert again.valid.get_column("id").to_list() == ids
    # The chat of line 1 (a prompt row) as ShareGPT, then as messages: duplicates of line 1.
    same: list[dict[str, Any]] = [
        {"conversations": _turns(("human", "A"))},
        {"messages": _msgs(("user", "A"))},
    ]
    dup = load_prompts(str(_jsonl(tmp_path, *rows, *same, name="dup.jsonl")))
    assert dup.valid.get_column("id").to_list() == ids
    assert dup.rejects.rows() == [
        (6, ids[0], "duplicate id (first on line 1)"),
        (7, ids[0], "duplicate id (first on line 1)"),
    ]


ULTRACHAT_ROW = {"prompt": "q", "messages": _msgs(("user", "q"), ("assistant", "a"))}


@pytest.mark.parametrize(
    "first",
    [{"conversations": _turns(("human", "hi"))}, {"prompt": "hi"}],
    ids=["sharegpt", "prompt"],
)
def test_an_ultrachat_row_is_a_messages_row_in_any_file(tmp_path: Path, first: dict) -> None:
    """Its prompt repeats its first user message: it is a messages row wherever it is, read as
    its whole chat, never as an empty or shortened one."""
    path = _jsonl(tmp_path, first, ULTRACHAT_ROW)
    ps = load_prompts(str(path))
    other = "sharegpt" if "conversations" in first else "prompt"
    assert (ps.formats, ps.num_rejected) == ({"messages": 1, other: 1}, 0)
    assert _chat(ps.valid.get_column("messages").to_list()) == [
        _msgs(("user", "hi")),
        ULTRACHAT_ROW["messages"],
    ]


def test_an_empty_conversation_is_one_rejected_row(tmp_path: Path) -> None:
    """`conversations: []` has no turns to tell its layout by: one bad row, wherever it is."""
    empty = {"id": "e", "conversations": []}
    specforge = {"id": "a", "conversations": _msgs(("user", "hi"))}
    sharegpt = {"id": "s", "conversations": _turns(("human", "hi"))}
    for rows, fmt in (([specforge, empty], "messages"), ([empty, specforge], "messages"),
                      ([empty, sharegpt], "sharegpt")):  # fmt: skip
        ps = load_prompts(str(_jsonl(tmp_path, *rows)))
        assert ps.format == fmt
        assert ps.rejects.select("id", "reason").rows() == [("e", "conversations is empty")]
    parquet = tmp_path / "p.parquet"
    pl.DataFrame([specforge, empty]).write_parquet(parquet)
    assert load_prompts(str(parquet)).rejects.select("id", "reason").rows() == [
        ("e", "conversations is empty")
    ]


def test_a_parquet_file_mixing_formats_is_read_row_by_row(tmp_path: Path) -> None:
    path = tmp_path / "p.parquet"
    pl.DataFrame(
        {"messages": [_msgs(("user", "a")), None, _msgs(("user", "c"))],
         "prompt": [None, "b", "c"]},
        schema={"messages": pl.List(pl.Struct({"role": pl.String, "content": pl.String})),
                "prompt": pl.String},
    ).write_parquet(path)  # fmt: skip
    ps = load_prompts(str(path))
    assert ps.formats == {"messages": 2, "prompt": 1}
    assert _chat(ps.valid.select("line", "messages").rows()) == [
        (1, _msgs(("user", "a"))),
        (2, _msgs(("user", "b"))),
        (3, _msgs(("user", "c"))),  # UltraChat's layout: prompt is its first user message
    ]
    # ShareGPT and SpecForge turns in one conversations column: each row by its own keys.
    turns = [_turns(("human", "q"), ("gpt", "a")), _msgs(("user", "r")), _turns(("bot", "x"))]
    turn = pl.Struct({k: pl.String for k in ("from", "value", "role", "content")})
    schema: dict[str, pl.DataType] = {"id": pl.String(), "conversations": pl.List(turn)}
    pl.DataFrame({"id": ["s", "r", "bad"], "conversations": turns}, schema).write_parquet(path)
    ps = load_prompts(str(path))
    assert ps.formats == {"messages": 1, "sharegpt": 1}
    assert _chat(ps.valid.select("id", "messages").rows()) == [
        ("s", _msgs(("user", "q"), ("assistant", "a"))),
        ("r", _msgs(("user", "r"))),
    ]
    assert ps.rejects.rows() == [
        (
            3,
            "bad",
            "message 0: from bot is not human, gpt or system "
            "(nor user, assistant, chatgpt, bing, bard, function_call, observation, tool)",
        )
    ]
    # A messages and a {role, content} conversations column: a row with both is one bad row.
    pl.DataFrame(
        {"messages": [_msgs(("user", "m")), None, _msgs(("user", "b"))],
         "conversations": [None, _msgs(("user", "c")), _msgs(("user", "b"))]}
    ).write_parquet(path)  # fmt: skip
    ps = load_prompts(str(path))
    assert ps.format == "messages" and ps.formats == {"messages": 2}
    assert _chat(ps.valid.get_column("messages").to_list()) == [
        _msgs(("user", "m")),
        _msgs(("user", "c")),
    ]
    assert ps.rejects.select("line", "reason").rows() == [
        (3, "has both conversations and messages")
    ]


def test_a_row_with_two_formats_is_one_rejected_row(tmp_path: Path) -> None:
    both = {"messages": _msgs(("user", "x")), "conversations": _turns(("human", "x"))}
    ps = load_prompts(str(_jsonl(tmp_path, GOOD, both)))
    assert ps.rejects.get_column("reason").to_list() == ["has both conversations and messages"]


def test_sharegpt_speaker_aliases_and_system_key(tmp_path: Path) -> None:
    """ShareGPT dumps name the assistant chatgpt/bing/bard; LLaMA-Factory keeps `system` apart."""
    path = _jsonl(
        tmp_path,
        {"conversations": _turns(("human", "Q"), ("chatgpt", "A"), ("user", "Q2"), ("bing", "B"))},
        {"conversations": _turns(("human", "Q"), ("bard", "A"), ("human", "Q3"))},
        {"conversations": _turns(("human", "Q"), ("assistant", "A")), "system": "Be brief"},
    )
    ps = load_prompts(str(path))
    assert (ps.format, ps.num_rejected) == ("sharegpt", 0)
    assert _chat(ps.valid.get_column("messages").to_list()) == [
        _msgs(("user", "Q"), ("assistant", "A"), ("user", "Q2"), ("assistant", "B")),
        _msgs(("user", "Q"), ("assistant", "A"), ("user", "Q3")),
        _msgs(("system", "Be brief"), ("user", "Q"), ("assistant", "A")),
    ]


SPECFORGE_ROWS = [
    {"id": "s1", "conversations": _msgs(("system", "S"), ("user", "Q"), ("assistant", "A"))},
    {"id": "s2", "conversations": _msgs(("user", "Hi"))},
    {"id": "s3", "conversations": _msgs(("user", "Q"), ("robot", "x"))},
]


def test_system_key_beside_conversations(tmp_path: Path) -> None:
    """LLaMA-Factory keeps the system prompt apart, with either turn layout; a blank one is
    none (it would replace the template's default system prompt with nothing)."""
    rows = [
        {"id": "r", "conversations": _msgs(("user", "q")), "system": "S"},
        {"id": "b", "conversations": _msgs(("user", "q")), "system": "  "},
        {"id": "t", "conversations": _msgs(("system", "T"), ("user", "q")), "system": "S"},
    ]
    for path in (_jsonl(tmp_path, *rows), tmp_path / "p.parquet"):
        if path.suffix == ".parquet":
            pl.DataFrame(rows).write_parquet(path)
        ps = load_prompts(str(path))
        assert _chat(ps.valid.select("id", "messages").rows()) == [
            ("r", _msgs(("system", "S"), ("user", "q"))),
            ("b", _msgs(("user", "q"))),
        ]
        assert ps.rejects.get_column("reason").to_list() == [
            "system given twice: the system key and a system turn"
        ]
    blank = {"conversations": _turns(("human", "q")), "system": ""}
    ps = load_prompts(str(_jsonl(tmp_path, blank, name="blank.jsonl")))
    assert _chat(ps.valid.get_column("messages").to_list()) == [_msgs(("user", "q"))]


def test_role_content_conversations_read_as_messages(tmp_path: Path) -> None:
    """SpecForge's prepare_data writes OpenAI {role, content} turns under `conversations`."""
    for path in (_jsonl(tmp_path, *SPECFORGE_ROWS), tmp_path / "specforge.parquet"):
        if path.suffix == ".parquet":
            pl.DataFrame(SPECFORGE_ROWS).write_parquet(path)
        ps = load_prompts(str(path))
        assert ps.format == "messages"
        assert ps.valid.get_column("id").to_list() == ["s1", "s2"]
        assert _chat(ps.valid.get_column("messages").to_list()) == [
            SPECFORGE_ROWS[0]["conversations"],
            SPECFORGE_ROWS[1]["conversations"],
        ]
        assert ps.rejects.rows() == [
            (3, "s3", "message 1: role robot is not user/system/assistant/tool")
        ]
    # The same chat as a messages row hashes to the same id.
    plain = _jsonl(tmp_path, {"messages": _msgs(("user", "Hi"))}, name="m.jsonl")
    as_turns = _jsonl(tmp_path, {"conversations": _msgs(("user", "Hi"))}, name="c.jsonl")
    assert load_prompts(str(plain)).valid["id"][0] == load_prompts(str(as_turns)).valid["id"][0]


def test_ultrachat_prompt_beside_messages(tmp_path: Path) -> None:
    """UltraChat repeats the first user message as `prompt`: that row is its messages."""
    chat = _msgs(("user", "Q"), ("assistant", "A"), ("user", "Q2"))
    rows = {
        "prompt": ["Q", "Q", "other"],
        "prompt_id": ["p1", "p2", "p3"],
        "messages": [chat, _msgs(("user", "Q")), chat],
    }
    path = tmp_path / "ultrachat.parquet"
    pl.DataFrame(rows).write_parquet(path)
    ps = load_prompts(str(path))
    assert ps.format == "messages"
    assert _chat(ps.valid.get_column("messages").to_list()) == [chat, _msgs(("user", "Q"))]
    assert ps.rejects.rows() == [
        (3, None, "has both messages and prompt (and prompt is not its first user message)")
    ]


def test_conversation_may_end_with_the_assistant(tmp_path: Path) -> None:
    row = {"messages": _msgs(("user", "q"), ("assistant", "old answer"))}
    ps = load_prompts(str(_jsonl(tmp_path, row)))
    assert ps.num_rejected == 0
    assert _chat(ps.valid.get_column("messages").to_list()) == [row["messages"]]


def test_parquet_conversations_column(tmp_path: Path) -> None:
    path = tmp_path / "s.parquet"
    pl.DataFrame(
        {"conversations": [_turns(("human", "q"), ("gpt", "a")), _turns(("bot", "x"))]}
    ).write_parquet(path)
    ps = load_prompts(str(path))
    assert ps.format == "sharegpt"
    assert _chat(ps.valid.get_column("messages").to_list()) == [
        _msgs(("user", "q"), ("assistant", "a"))
    ]
    assert ps.rejects.select("line", "reason").rows() == [
        (
            2,
            "message 0: from bot is not human, gpt or system "
            "(nor user, assistant, chatgpt, bing, bard, function_call, observation, tool)",
        )
    ]
    pl.DataFrame({"conversations": [["a"]]}).write_parquet(path)
    with pytest.raises(
        UserError,
        match=r"column conversations has type .*, expected a list of \{from, value\} or \{role, ",
    ):
        load_prompts(str(path))


def test_missing_id_is_a_stable_content_hash(tmp_path: Path) -> None:
    row = {"messages": _msgs(("system", "s"), ("user", "q"))}
    first = load_prompts(str(_jsonl(tmp_path, row, name="a.jsonl"))).valid["id"][0]
    again = load_prompts(str(_jsonl(tmp_path, {"extra": 1, **row}, name="b.jsonl"))).valid["id"][0]
    other = {"messages": _msgs(("system", "s"), ("user", "Q"))}
    different = load_prompts(str(_jsonl(tmp_path, other, name="c.jsonl"))).valid["id"][0]
    assert first == again != different
    assert first.startswith("h-") and len(first) == 18


def test_same_content_without_ids_is_a_duplicate(tmp_path: Path) -> None:
    row = {"messages": _msgs(("user", "same"))}
    ps = load_prompts(str(_jsonl(tmp_path, row, GOOD, row)))
    assert ps.rejects.select("line", "reason").rows() == [(3, "duplicate id (first on line 1)")]
    assert ps.rejects["id"][0] == ps.valid["id"][0]


def test_bad_line_keeps_its_id_in_rejects(tmp_path: Path) -> None:
    bad = {"id": "keep-me", "messages": _msgs(("user", [{"type": "text"}]))}
    ps = load_prompts(str(_jsonl(tmp_path, GOOD, bad)))
    assert ps.rejects.get_column("id").to_list() == ["keep-me"]


def test_bom_crlf_and_blank_lines_keep_line_numbers(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    rows = [json.dumps(GOOD), "", "   ", "{bad", json.dumps({**GOOD, "id": "two"}), ""]
    path.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(rows).encode())
    ps = load_prompts(str(path))
    assert ps.valid.get_column("line").to_list() == [1, 5]
    assert _chat(ps.valid.get_column("messages")[0].to_list()) == GOOD["messages"]
    assert ps.rejects.select("line", "reason").rows() == [(4, "not valid JSON")]


def test_non_utf8_line_is_rejected_others_kept(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_bytes(json.dumps(GOOD).encode() + b'\n{"prompt": "caf\xe9"}\n')
    ps = load_prompts(str(path))
    assert ps.num_valid == 1
    assert ps.rejects.select("line", "reason").rows() == [(2, "not valid UTF-8")]


UNREADABLE = {
    "all rejected": (b'{"messages": []}\n{"messages": "x"}\n', "line 1: messages is empty"),
    "json array": (b'[{"prompt": "a"}, {"prompt": "b"}]\n', "line 1: a JSON array, not an object"),
    "pretty array": (b'[\n  {"prompt": "a"}\n]\n', "line 1: not valid JSON (a JSON array"),
    "pretty object": (b'{\n  "prompt": "a"\n}\n', "line 1: not valid JSON (a pretty-printed"),
    "binary": (bytes(range(256)) * 4, "binary data"),
    "empty": (b"", "file is empty"),
    "blank lines only": (b"\n \n\r\n", "no prompts"),
    "latin-1": ('{"prompt": "café"}\n'.encode("latin-1"), "line 1: not valid UTF-8"),
    "fake parquet": (b"not parquet at all", "not a Parquet file"),
}


@pytest.mark.parametrize("data, message", UNREADABLE.values(), ids=UNREADABLE.keys())
def test_unusable_file_is_one_line_user_error(tmp_path: Path, data: bytes, message: str) -> None:
    name = "prompts.parquet" if message == "not a Parquet file" else "prompts.jsonl"
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(UserError) as err:
        load_prompts(str(path))
    text = str(err.value)
    assert text.startswith(f"{path}: ") and message in text and "\n" not in text


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="prompt file not found"):
        load_prompts(str(tmp_path / "nope.jsonl"))
    with pytest.raises(UserError, match="is a directory"):
        load_prompts(str(tmp_path))


def test_parquet_messages_and_prompt_inputs(tmp_path: Path) -> None:
    path = tmp_path / "p.parquet"
    pl.DataFrame(
        {
            "id": [1, 2, 3],
            "messages": [_msgs(("user", "a")), _msgs(("user", None)), _msgs(("user", "a"))],
            "other": ["x", "y", "z"],
        }
    ).write_parquet(path)
    ps = load_prompts(str(path))
    assert (ps.format, ps.valid.get_column("id").to_list()) == ("messages", ["1", "3"])
    assert ps.rejects.rows() == [(2, "2", "message 0: content is missing or null")]

    path2 = tmp_path / "q.parquet"
    pl.DataFrame({"prompt": ["hi", "hi"], "system": [None, "sys"]}).write_parquet(path2)
    ps2 = load_prompts(str(path2))
    assert ps2.format == "prompt"
    assert _chat(ps2.valid.get_column("messages").to_list()) == [
        _msgs(("user", "hi")),
        _msgs(("system", "sys"), ("user", "hi")),
    ]


def test_parquet_wrong_column_type_names_the_column(tmp_path: Path) -> None:
    path = tmp_path / "p.parquet"
    pl.DataFrame({"messages": [["a"], ["b"]]}).write_parquet(path)
    with pytest.raises(UserError, match=r"p\.parquet: column messages has type"):
        load_prompts(str(path))
    pl.DataFrame({"messages": [[{"role": "user", "content": "x"}]]}).write_parquet(path)
    pl.DataFrame({"prompt": ["x"], "id": [1.5]}).write_parquet(path)
    with pytest.raises(UserError, match="column id has type"):
        load_prompts(str(path))


def test_all_rejected_parquet_names_the_row(tmp_path: Path) -> None:
    path = tmp_path / "p.parquet"
    pl.DataFrame({"prompt": ["", " "]}).write_parquet(path)
    with pytest.raises(UserError, match=r"row 1: empty prompt; no usable rows \(2 rejected\)"):
        load_prompts(str(path))


def test_fingerprint_covers_the_file_bytes(tmp_path: Path) -> None:
    a = load_prompts(str(_jsonl(tmp_path, GOOD, name="a.jsonl"))).fingerprint
    b = load_prompts(str(_jsonl(tmp_path, GOOD, name="b.jsonl"))).fingerprint
    c = load_prompts(str(_jsonl(tmp_path, GOOD, "", name="c.jsonl"))).fingerprint
    assert a == b != c and len(a) == 64


def test_write_rejects_through_storage(tmp_path: Path) -> None:
    ps = load_prompts(str(_jsonl(tmp_path, GOOD, "{oops")))
    storage = LocalStorage(tmp_path / "out")
    write_rejects(storage, ps.rejects)
    back = pl.read_parquet(storage.polars_path(REJECTS_KEY))
    assert back.schema == pl.Schema({"line": pl.Int64, "id": pl.String, "reason": pl.String})
    assert back.rows() == [(2, None, "not valid JSON")]


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_preview_samples_head_middle_and_tail(tmp_path: Path, kind: str) -> None:
    """Bad rows in the tail of a file are seen: the sample is a third each from the head,
    the middle and the tail (a head-only look said `1000 of first 1000 rows valid` of a file
    whose second half was broken), and the figure says which rows were read."""
    good = [{"id": f"r{i}", "messages": _msgs(("user", "q"))} for i in range(90)]
    bad = [{"id": f"b{i}", "messages": _msgs(("robot", "q"))} for i in range(10)]
    if kind == "jsonl":
        path = _jsonl(tmp_path, *good, *bad)
    else:
        path = tmp_path / "p.parquet"
        pl.DataFrame([*good, *bad]).write_parquet(path)
    result = preview(str(path), n=30)
    assert (result.rows_checked, result.valid, result.rejected) == (30, 20, 10)
    unit = "lines" if kind == "jsonl" else "rows"
    assert result.sampled == f"sampled {unit} 1-10, 46-55, 91-100 of 100"
    assert (result.first_reason or "").startswith(f"{unit[:-1]} 91: ")
    whole = preview(str(path), n=100)
    assert (whole.rows_checked, whole.rejected, whole.sampled) == (100, 10, "whole file")


def test_sample_prompt_set_is_valid_and_varied() -> None:
    ps = load_prompts(str(SAMPLE))
    assert ps.num_rejected == 0 and ps.num_valid >= 200 and ps.format == "messages"
    ids = ps.valid.get_column("id")
    assert ids.str.starts_with("sample-").all()
    with_system = ps.valid.select(
        pl.col("messages").list.first().struct.field("role").eq("system").sum()
    ).item()
    assert with_system >= 20


def test_small_batches_read_as_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Validation runs batch by batch: cut anywhere (a line longer than a batch, blank lines at
    a cut, a last line with no line end, a duplicate in a later batch), the result is the same."""
    import regen.prompts.load

    rows: list[str | dict[str, Any]] = [
        GOOD,
        {"prompt": "p" * 300, "system": "s"},
        "",
        "{broken",
        {"conversations": _turns(("human", "x"))},
        "",
        "",
        {"id": "good", "messages": _msgs(("user", "again"))},
        {"prompt": "Hello"},
        {"messages": _msgs(("user", "Hello"))},
    ]
    text = "\n".join(json.dumps(r) if isinstance(r, dict) else r for r in rows)
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text(text)  # no line end after the last line
    parquet = tmp_path / "p.parquet"
    pl.DataFrame([r for r in rows if isinstance(r, dict)]).write_parquet(parquet)
    whole = {path: load_prompts(str(path)) for path in (jsonl, parquet)}
    first = {path: preview(str(path), n=6) for path in (jsonl, parquet)}
    assert whole[jsonl].rejects.select("line", "reason").rows() == [
        (4, "not valid JSON"),
        (8, "duplicate id (first on line 1)"),
        (10, "duplicate id (first on line 9)"),
    ]
    # Lines 1-2, 5-6 and 9-10 of 10: the blank line 6 is not a row, line 10 repeats line 9.
    assert (first[jsonl].rows_checked, first[jsonl].valid) == (5, 4)
    for size in (1, 40, 200):
        monkeypatch.setattr(regen.prompts.load, "_BATCH_BYTES", size)
        for path in (jsonl, parquet):
            ps = load_prompts(str(path))
            assert ps.formats == whole[path].formats, (size, path)
            assert ps.valid.equals(whole[path].valid), (size, path)
            assert ps.rejects.equals(whole[path].rejects), (size, path)
            assert preview(str(path), n=6) == first[path], (size, path)


_LOAD_AND_MEASURE = """
import resource, sys, time
from regen.prompts import load_prompts
start = time.perf_counter()
ps = load_prompts(sys.argv[1])
elapsed = time.perf_counter() - start
print(ps.num_valid, ps.num_rejected, elapsed,
      resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
"""


def write_big_jsonl(path: Path, rows: int) -> int:
    """About 100 bytes a row; one malformed line every 50,000 rows; returns the bad count."""
    template = '{{"id": "r{0}", "messages": [{{"role": "user", "content": "question {0} {1}"}}]}}'
    filler = "lorem ipsum dolor sit amet"
    with path.open("w") as fh:
        for start in range(0, rows, 10_000):
            block = [template.format(i, filler) for i in range(start, min(rows, start + 10_000))]
            fh.write("\n".join(block) + "\n")
        fh.write("{broken\n" * (rows // 50_000))
    return rows // 50_000


def test_large_file_streams_in_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    bad = write_big_jsonl(path, 200_000)
    out = subprocess.run(
        [sys.executable, "-c", _LOAD_AND_MEASURE, str(path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout.split()
    valid, rejected, elapsed, rss_mb = int(out[0]), int(out[1]), float(out[2]), int(out[3])
    print(f"200K rows ({path.stat().st_size >> 20} MiB): {elapsed:.1f} s, peak RSS {rss_mb} MiB")
    assert (valid, rejected) == (200_000, bad)
    assert rss_mb < 1024
