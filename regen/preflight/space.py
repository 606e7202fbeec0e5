"""How much a run will still write to a local output, judged against the disk's free space.

A full disk stops a run at once (regen.storage.diskfull), so preflight says beforehand whether the
rest of the run fits: bytes per row from the shards this config already committed there (what
the run really writes), else an estimate from the prompts and `sampling.max_tokens`, times the
rows the input has beyond those committed. S3 reports no free space, so only local outputs are
judged.

An estimate, said as one (`about`), never a bound: a true upper bound would take every token at
the most bytes any token of the vocabulary decodes to (dozens: a run of spaces or `=` is one
token), ten times and more the 3-4 bytes text takes, and a figure that large says nothing about
whether a disk fits.
What a row stores is counted part by part (`PromptFigures`): each answer at `max_tokens`, its
text and ids; the conversation's text; and each answer's prompt again as its token ids, which
with `regeneration.turns: all` hold the conversation up to that turn, earlier answers included.
The answers are the turns of regen.conversations, the shard job's own, tool loop steps counted.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from regen.conversations import Turns, conversation_for, turn_marks
from regen.display.figures import byte_size
from regen.errors import UserError

if TYPE_CHECKING:
    from regen.config import RegenConfig
    from regen.storage import Storage

BYTES_PER_TOKEN = 8
"""Stored bytes per output token when nothing is committed yet: a token's text and its id,
uncompressed. Measured on a rehearsal dataset (2 shards of 20 rows, 1,600 completion tokens a
row, max_tokens 4096): content and reasoning take 4.7 bytes of text a token and each token's id
is stored as int32 (4 B), 8.7 B raw; committed, Parquet made it 0.93 B a token, every column
included, but the emulator's 86-word vocabulary compresses far better than a real model's text,
so the default keeps the raw size. Times `sampling.max_tokens`, which few answers reach, the
estimate errs on the large side; once a shard is committed its real bytes per row replace it."""

PROMPT_BYTES_PER_TOKEN = 3
"""Bytes of prompt text one prompt token stands for, on the low side (English takes about 4,
code and CJK about 3): each answer's prompt is stored again as its token ids (int32, 4 B a
token), so a byte of prompt text costs about 4/3 B of ids for each answer it is sent with."""

ID_BYTES = 4
"""A stored token id (int32)."""

WARN_FACTOR = 1.5
"""Free space below the estimate x this warns: shards in flight, temp files, the audit report
and export land on the same disk."""

SAMPLE_ROWS = 1000
"""Rows of a local prompt file read for its figures per row (head, middle and tail, as the
prompts row reads them): the whole file is counted, never parsed, before the run."""


@dataclass(frozen=True)
class PromptFigures:
    """What the rows' conversations weigh in the stored rows, summed over `rows` rows."""

    rows: int
    answers: int
    """Answers the rows ask for: one a row with `turns: last`; with `all`, one a turn of
    regen.conversations (a user message, a tool loop step), the most a row can have."""
    text_bytes: int
    """The conversations' text as stored (messages, the calls in them, the tools)."""
    sent_bytes: int
    """The input text behind every answer's prompt, summed over the answers: with `turns: all`
    a turn's prompt holds the conversation up to its turn (`turn_marks`); the tools go with
    each."""
    earlier_answers: int
    """Answers already in the history of a later turn (`turns: all`), each sent again."""

    @classmethod
    def of(cls, valid: pl.DataFrame, turns: Turns) -> PromptFigures:
        """The figures of the valid rows (`messages`, `tools`) as the run will send them."""
        if not valid.height:
            return cls(0, 0, 0, 0, 0)
        message = pl.col("m").struct
        calls = message.field("tool_calls")
        size = message.field("content").str.len_bytes().fill_null(0) + pl.when(
            calls.is_not_null()
        ).then(pl.struct(calls).struct.json_encode().str.len_bytes()).otherwise(0)
        conversation = conversation_for(turns)
        # The end of each turn's history, as the shard job asks them (`turns: all` only).
        none = conversation.list.eval(pl.lit(False))
        marks = turn_marks(conversation) if turns == "all" else none
        long = (
            valid.select(
                pl.int_range(pl.len()).alias("row"),
                conversation.alias("m"),
                marks.alias("turn"),
                pl.col("tools").str.len_bytes().fill_null(0).alias("tools"),
            )
            .explode("m", "turn")
            .select("row", "tools", "turn", size.alias("size"))
        )
        per_row = long.group_by("row").agg(
            text=pl.col("size").sum() + pl.col("tools").first(),
            turns=pl.col("turn").sum(),
            # Each turn's prompt: the conversation up to and with the end of its history.
            upto_turns=pl.col("size").cum_sum().filter(pl.col("turn")).sum(),
            tools=pl.col("tools").first(),
        )
        if turns == "all":
            answers = pl.col("turns")
            sent = (pl.col("upto_turns") + answers * pl.col("tools")).sum()
            totals = (answers.sum(), sent, (answers * (answers - 1) // 2).sum())
        else:  # one answer a row, on the whole conversation as given up to its last input
            totals = (pl.len(), pl.col("text").sum(), pl.lit(0))
        text, a, s, e = per_row.select(
            pl.col("text").sum(), *(t.alias(f"t{i}") for i, t in enumerate(totals))
        ).row(0)
        return cls(valid.height, int(a), int(text), int(s), int(e))

    def sample_tokens(self, max_tokens: int) -> int:
        """The tokens of every answer's training sample, its prompt (the text sent, at
        PROMPT_BYTES_PER_TOKEN, and earlier answers at max_tokens) and its answer at
        max_tokens: what the features capture, before any is generated."""
        prompts = self.sent_bytes / PROMPT_BYTES_PER_TOKEN + self.earlier_answers * max_tokens
        return round(prompts + self.answers * max_tokens)

    def scaled(self, rows: int) -> PromptFigures:
        """A sample's figures for `rows` rows like it."""
        if not self.rows:
            return PromptFigures(rows, rows, 0, 0, 0)
        k = rows / self.rows
        return PromptFigures(
            rows,
            round(self.answers * k),
            round(self.text_bytes * k),
            round(self.sent_bytes * k),
            round(self.earlier_answers * k),
        )


@dataclass(frozen=True)
class OutputEstimate:
    """What the run still writes: `rows` rows at `bytes_per_row`, and where that figure came
    from (`basis`)."""

    rows: int
    bytes_per_row: float
    basis: str

    @property
    def size(self) -> int:
        return int(self.rows * self.bytes_per_row)

    def describe(self) -> str:
        size = byte_size(self.size)
        return f"the run still writes about {size} (estimated: {self.rows:,} rows x {self.basis})"


def estimate_output(config: RegenConfig, storage: Storage) -> OutputEstimate | None:
    """The estimate for `config` writing to `storage`; None when the input's rows cannot be
    counted here (prompts on S3, the Hub or in several files: the plan counts them later)."""
    from regen.dataset import config_fingerprint, read_run
    from regen.dataset.manifest import committed_shards

    rows = input_rows(config.prompts)
    if rows is None:
        return None
    digest, _ = config_fingerprint(config)
    # Shards of another config are not this run's (they are refused or moved aside).
    mine = read_run(storage).get("fingerprint") == digest
    committed = committed_shards(storage, digest) if mine else {}
    done = sum(m.rows for m in committed.values())
    left = max(rows - done, 0)
    if done:
        size = sum(m.size for m in committed.values())
        rows_left = OutputEstimate(
            left, size / done, f"{size / done:,.0f} B a row in {len(committed)} committed shards"
        )
    else:
        rows_left = first_estimate(config, _sampled_figures(config).scaled(left))
    return _with_features(config, storage if mine else None, rows_left, rows)


def _with_features(
    config: RegenConfig, storage: Storage | None, rows_left: OutputEstimate, rows: int
) -> OutputEstimate:
    """The rows still to write plus, with a `features:` section writing into the same root,
    every row's features (on the high side: rows whose features are captured count too)."""
    features = config.features
    if features is None or features.dest is not None or rows_left.rows == 0 or rows == 0:
        return rows_left
    from regen.features.sizes import planned_features

    planned = planned_features(config, _sampled_figures(config).scaled(rows), storage)
    if isinstance(planned, str):
        return OutputEstimate(rows_left.rows, rows_left.bytes_per_row, f"{rows_left.basis}; "
                              f"features {planned}")  # fmt: skip
    extra = planned.size.bytes / rows_left.rows
    basis = f"{rows_left.basis} + features {extra:,.0f} B a row ({planned.line()})"
    return OutputEstimate(rows_left.rows, rows_left.bytes_per_row + extra, basis)


def _sampled_figures(config: RegenConfig) -> PromptFigures:
    """The figures of a sample of the prompt file (none where it cannot be read: the prompts
    row says why)."""
    from regen.prompts import preview, read_options

    try:
        found = preview(config.prompts, SAMPLE_ROWS, options=read_options(config.input))
    except UserError:
        return PromptFigures(0, 0, 0, 0, 0)
    return PromptFigures.of(found.sample, config.regeneration.turns)


def first_estimate(config: RegenConfig, figures: PromptFigures) -> OutputEstimate:
    """`figures.rows` rows before anything is committed: each answer at `sampling.max_tokens`
    of `BYTES_PER_TOKEN`, the conversations' text, and every answer's prompt as its ids."""
    max_tokens, rows = config.sampling.max_tokens, figures.rows
    answers = figures.answers * max_tokens * BYTES_PER_TOKEN
    prompts = (
        figures.text_bytes
        + figures.sent_bytes * ID_BYTES / PROMPT_BYTES_PER_TOKEN
        + figures.earlier_answers * max_tokens * ID_BYTES
    )
    per_row = (answers + prompts) / rows if rows else 0.0
    a_row = figures.answers / rows if rows else 1.0
    shown = "1 answer" if a_row == 1 else f"{a_row:.3g} answers"
    basis = (
        f"{per_row:,.0f} B a row: {shown} at max_tokens {max_tokens:,} x {BYTES_PER_TOKEN} B, "
        f"and {prompts / rows if rows else 0:,.0f} B of prompt text and its token ids"
    )
    return OutputEstimate(rows, per_row, basis)


def input_rows(prompts: str) -> int | None:
    """Rows of a local prompt file: its line ends, plus an unterminated last line (an upper
    bound: blank lines count too), or a Parquet file's row count; None for anything else."""
    from regen.prompts.parquet import row_count

    path = Path(prompts)
    if "://" in prompts or not path.is_file():
        return None
    with path.open("rb") as fh:
        if fh.read(4) == b"PAR1":
            return row_count(path, prompts)
        fh.seek(0)
        lines, last = 0, b"\n"
        while chunk := fh.read(1 << 20):
            lines += chunk.count(b"\n")
            last = chunk[-1:]
    return lines + (last != b"\n")


def judge_space(free: int, estimate: OutputEstimate | None) -> str:
    """`pass`, `warn` (free < estimate x WARN_FACTOR) or `fail` (free < estimate)."""
    if estimate is None or free >= estimate.size * WARN_FACTOR:
        return "pass"
    return "warn" if free >= estimate.size else "fail"


def free_bytes(root: Path) -> int:
    return shutil.disk_usage(root).free
