"""How the prompt set is read; a changed input is a new revision, not a new run."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
)

from regen.config.section import Section


class InputConfig(Section):
    """How the prompt set is read, and how a rerun treats one that changed since the dataset
    was made. Not fingerprinted: a different input is a new input revision of the same run,
    never a different run."""

    split: str | None = Field(
        default=None,
        min_length=1,
        description="hf:// prompts without a path: the split whose files are read (a "
        "data_files split of the README.md's configs, else by the file names: "
        "data/<split>-*.parquet, <split>/, <split>.jsonl ...); default train, or the only one.",
    )
    subset: str | None = Field(
        default=None,
        min_length=1,
        description="hf:// prompts without a path: the config_name of the README.md's configs "
        "(default: the card's default config), or without configs the config directory to read.",
    )
    id_column: str | None = Field(
        default=None,
        min_length=1,
        description="The column holding each row's id, e.g. UltraChat's prompt_id; default id.",
    )
    messages_column: str | None = Field(
        default=None,
        min_length=1,
        description="A conversation column under another name ({role, content} or "
        "{from, value} turns); it is then the row's only format column.",
    )

    removed: Literal["keep", "drop"] = Field(
        default="keep",
        description="Rows of ids no longer in the input: keep them in the dataset (audit, "
        "export, read_committed) or drop them from its view (their data stays on disk).",
    )
