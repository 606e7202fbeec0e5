"""Numbers as reports show them: three significant digits, thousands separated, `–` for none.

`54.974999999999994` in a UI pane says less than `55.0`; every report rounds through here so
the same figure reads the same in a log line, an artifact and report/audit.md.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence

NONE = "–"


def sig(value: float | None, digits: int = 3) -> str:
    """`value` to `digits` significant digits, never in exponent form (12,345 -> 12,300)."""
    if value is None or math.isnan(value):
        return NONE
    if value == 0:
        return "0"
    decimals = digits - 1 - math.floor(math.log10(abs(value)))
    rounded = round(value, decimals)
    return f"{rounded:,.{max(decimals, 0)}f}"


def pct(fraction: float | None, digits: int = 3) -> str:
    """A rate in [0, 1] as a percentage to `digits` significant digits: 0.858 -> `85.8 %`."""
    return NONE if fraction is None else f"{sig(100 * fraction, digits)} %"


def duration(seconds: float | None) -> str:
    """An ETA or an elapsed time in the unit a person reads it in."""
    if seconds is None:
        return NONE
    if seconds < 90:
        return f"{sig(seconds)} s"
    if seconds < 5400:
        return f"{sig(seconds / 60)} min"
    return f"{sig(seconds / 3600)} h"


def gb(nbytes: float) -> str:
    """Bytes in decimal gigabytes, one decimal: how disks and GPU memory are quoted."""
    return f"{nbytes / 1e9:.1f} GB"


def markdown_table(
    columns: Sequence[str], rows: Iterable[Sequence[object]], *, numeric: Collection[str] = ()
) -> list[str]:
    """A Markdown table's lines, every report's through here: the header, its rule (the
    `numeric` columns right-aligned, so figures line up), then a line a row. A cell is its
    `str()`, a `|` in it escaped and a newline made a space, so text from a server or a
    config cannot break the table."""
    rule = ("--:" if c in numeric else "---" for c in columns)
    return [
        _row(columns),
        _row(rule),
        *(_row(str(cell).replace("|", "\\|").replace("\n", " ") for cell in row) for row in rows),
    ]


def _row(cells: Iterable[str]) -> str:
    return "| " + " | ".join(cells) + " |"
