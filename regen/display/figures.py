"""Numbers as reports show them: three significant digits, thousands separated, `–` for none.

`54.974999999999994` in a UI pane says less than `55.0`; every report rounds through here so
the same figure reads the same in a log line, an artifact and report/audit.md.
"""

from __future__ import annotations

import math
import time
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


def pct_within(fraction: float | None, bound: float | None) -> str:
    """`pct`, with digits added where rounding would carry a share onto a threshold it is
    under: 0.049996 beside `fail at 5.00 %` reads `5.00 %` and looks failed; it is `4.9996 %`."""
    if fraction is None or bound is None or fraction >= bound or fraction <= 0:
        return pct(fraction)
    for digits in range(3, 9):
        shown = round(100 * fraction, digits - 1 - math.floor(math.log10(100 * fraction)))
        if shown < 100 * bound:
            return pct(fraction, digits)
    return pct(fraction, 9)


def count(value: float | None) -> str:
    """A count as it is, thousands separated (`4,096`, never `4,100`): token counts and row
    counts are exact, and a length shown rounded up past its bound (p99 `4,100` beside a
    max_tokens of 4096) reads as a bug."""
    return NONE if value is None else f"{round(value):,}"


def compact(value: float | None) -> str:
    """A rate short enough for a card: three significant digits with a k or M suffix
    (64,321 -> `64.3k`, 1,234,567 -> `1.23M`), as `sig` below 1,000."""
    if value is None or math.isnan(value):
        return NONE
    for scale, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{sig(value / scale)}{suffix}"
    return sig(value)


def clock(at: float, now: float | None = None) -> str:
    """A moment in UTC as a person plans by it: `00:55 UTC` today, `Dec 08 00:55 UTC` on
    another day (of `now`, default the present)."""
    moment, today = time.gmtime(at), time.gmtime(time.time() if now is None else now)
    same_day = moment[:3] == today[:3]
    return time.strftime("%H:%M UTC" if same_day else "%b %d %H:%M UTC", moment)


def eta(at: float, seconds: float | None) -> str:
    """`ETA 00:55 UTC (24 s)`: when the rest is done as a clock time, and how long from `at`
    (the moment the rate was measured)."""
    if seconds is None:
        return f"ETA {NONE}"
    # Whole seconds and minutes: an ETA is no more precise, and a card has no room for it.
    if seconds < 90:
        ahead = f"{seconds:.0f} s"
    elif seconds < 5400:
        ahead = f"{seconds / 60:.0f} min"
    else:
        ahead = duration(seconds)
    return f"ETA {clock(at + seconds, now=at)} ({ahead})"


def byte_size(nbytes: float) -> str:
    """Bytes as disks, GPU memory and files are quoted: decimal units to three significant
    digits (`512 B`, `5.80 MB`, `161 GB`), the one byte formatter of every report and message."""
    if math.isnan(nbytes):
        return NONE
    size = float(nbytes)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        # The unit by the figure shown: 999,600 B is `1.00 MB`, never `1,000 KB`.
        shown = round(size) if unit == "B" else float(f"{size:.3g}")
        if abs(shown) < 1000:
            return f"{shown} B" if unit == "B" else f"{sig(shown)} {unit}"
        size /= 1000
    return f"{sig(size)} PB"


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
