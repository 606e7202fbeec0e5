"""Numbers as reports show them: three significant digits, thousands separated, `–` for none.

`54.974999999999994` in a UI pane says less than `55.0`; every report rounds through here so
the same figure reads the same in a log line, an artifact and report/audit.md.
"""

from __future__ import annotations

import math

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
