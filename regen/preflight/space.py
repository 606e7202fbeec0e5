"""How much a run will still write to a local output, judged against the disk's free space.

A full disk stops a run at once (regen.storage.diskfull), so preflight says beforehand whether the
rest of the run fits: bytes per row from the shards this config already committed there (what
the run really writes), else a conservative default per output token, times the rows the
input has beyond those committed. S3 reports no free space, so only local outputs are judged.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from regen.storage.diskfull import human_size

if TYPE_CHECKING:
    from regen.config import RegenConfig
    from regen.storage import Storage

BYTES_PER_TOKEN = 8
"""Stored bytes per output token when nothing is committed yet, as an upper bound: a token's
text and its id uncompressed. Measured on a rehearsal dataset (2 shards of 20 rows, 1,600
completion tokens a row, max_tokens 4096): content and reasoning take 4.7 bytes of text a
token and each token's id is stored as int32 (4 B), 8.7 B raw; committed, Parquet made it
0.93 B a token, every column included, but the emulator's 86-word vocabulary compresses far
better than a real model's text, so the default keeps the raw size. Times
`sampling.max_tokens`, which few rows reach, the estimate errs on the large side; once a shard
is committed its real bytes per row replace it."""

WARN_FACTOR = 1.5
"""Free space below the estimate x this warns: shards in flight, temp files, the audit report
and export land on the same disk."""


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
        size = human_size(self.size)
        return f"the run still writes about {size} ({self.rows:,} rows x {self.basis})"


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
        return OutputEstimate(
            left, size / done, f"{size / done:,.0f} B a row in {len(committed)} committed shards"
        )
    return bound_estimate(config, left)


def bound_estimate(config: RegenConfig, rows: int, answers: int | None = None) -> OutputEstimate:
    """`rows` rows before anything is committed: each answer at most `sampling.max_tokens` of
    `BYTES_PER_TOKEN`, one answer a row unless `answers` says how many the rows hold in all
    (`regeneration.turns: all` answers every user turn)."""
    max_tokens = config.sampling.max_tokens
    per_answer = max_tokens * BYTES_PER_TOKEN
    if answers is None or answers == rows or rows == 0:
        basis = f"{per_answer:,} B a row: max_tokens {max_tokens:,} x {BYTES_PER_TOKEN} B"
        return OutputEstimate(rows, per_answer, basis)
    per_row = per_answer * answers / rows
    basis = (
        f"{per_row:,.0f} B a row: {answers / rows:.3g} answers a row x max_tokens "
        f"{max_tokens:,} x {BYTES_PER_TOKEN} B"
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
