"""Read the prompt set (JSONL or Parquet) into validated chat rows, with every unusable row
set aside with its line number and reason, so one bad line never stops a million-row run.

Three row formats, and each row describes itself: OpenAI `messages`, `prompt` (+ `system`), and
ShareGPT `conversations` ({from: human/gpt/system, value}, + `system`), which is normalised to
messages. One file may hold rows of all three; each row is read by its own format, and only a
row whose own format is missing or ambiguous (the keys of two formats) is rejected. The layouts
training sets come in are read as they are: `conversations` of {role, content} turns
(SpecForge's prepare_data) are messages rows, and UltraChat's `prompt` beside `messages` is its
first user message again.

The modules, in the order a file meets them: `facts` (what the file is: fingerprint, Parquet or
text, UTF-8, NUL bytes), `jsonl` and `parquet` (rows read batch by batch into one column
layout), `rules` (each row's format, reject reason, normalised messages and id; `formats` holds
the words they share), and `load` (the batches validated into a `PromptSet`). `sources` lists
the files of a glob or prefix, `hub` those of a Hugging Face dataset at one commit.
"""

from regen.prompts.formats import FORMAT_KEYS, MIXED, format_counts, format_name
from regen.prompts.load import (
    REJECTS_SCHEMA,
    PromptPreview,
    PromptSet,
    ReadOptions,
    load_prompts,
    load_prompts_file,
    preview,
    read_options,
)

__all__ = [
    "FORMAT_KEYS",
    "MIXED",
    "REJECTS_SCHEMA",
    "PromptPreview",
    "PromptSet",
    "ReadOptions",
    "format_counts",
    "format_name",
    "load_prompts",
    "load_prompts_file",
    "preview",
    "read_options",
]
