"""Pictures of a run as PNG bytes: throughput over time, and the one way every plot is saved.

matplotlib's object-oriented API with no pyplot: no global figure state and no GUI back end,
so a plot can be drawn from a run's ticker thread. The audit draws its own plots
(`regen.audit.report`) and saves them through `png`; the Prefect layer embeds the bytes in its
artifacts, whose data Prefect keeps in its database: a chart redrawn every live interval is
kept small (`THROUGHPUT_POINTS` points, a narrow figure at a low dpi, a few tens of KB).
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from regen.progress.fleet_live import Interval, LiveReport

THROUGHPUT_POINTS = 120
"""Points per line of the throughput chart at most: a three-day run's 8,640 intervals are
drawn as the means of 120 spans (36 min each), so the chart's size does not grow with the
run and it can be redrawn at every scrape."""

THROUGHPUT_DPI = 72
"""A 6.4 x 2.6 inch chart at 72 dpi is 461 x 187 px: legible in a ~1000 px pane, small."""


def png(figure: Figure, dpi: int = 100) -> bytes:
    """The figure as PNG bytes."""
    buf = io.BytesIO()
    figure.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def plots_markdown(sources: Mapping[str, str]) -> str:
    """A report's plots section: each plot by name as a Markdown image of `sources[name]` (a
    file beside the report, or a data URI where there is no file to link)."""
    if not sources:
        return ""
    images = [f"![{name}]({src})" for name, src in sources.items()]
    return "\n".join(["## Plots", "", *images]) + "\n"


def downsample(values: np.ndarray, points: int) -> np.ndarray:
    """The means of at most `points` consecutive spans of `values` along its first axis (NaN,
    a server without `/metrics`, left out of a span's mean; a span of only NaN stays NaN)."""
    n = len(values)
    if n <= points:
        return values
    spans = np.array_split(np.arange(n), points)
    with warnings.catch_warnings():  # a span of only NaN warns, and its mean is NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.stack([np.nanmean(values[s], axis=0) for s in spans])


def throughput_png(
    history: Sequence[Interval], servers: Sequence[str], points: int = THROUGHPUT_POINTS
) -> bytes | None:
    """Output tok/s over the run, the total and each server's, or None before two scrapes
    (one point is no line). Each server's rate is its own `/metrics` counter's; the total is
    the dispatcher's, as in the headline."""
    if len(history) < 2:
        return None
    from matplotlib.dates import ConciseDateFormatter
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    at = downsample(np.array([i.at for i in history], dtype=float), points)
    total = downsample(np.array([i.tokens_per_s for i in history], dtype=float), points)
    rates = np.array(
        [
            [np.nan if (r := _at(i.servers, k)) is None else r for k in range(len(servers))]
            for i in history
        ],
        dtype=float,
    ).reshape(len(history), len(servers))
    per_server = downsample(rates, points)
    # datetime64 is read as UTC by matplotlib's date axis: the clock of every report.
    times = (at * 1000).astype("int64").astype("datetime64[ms]")

    fig = Figure(figsize=(6.4, 2.6), layout="constrained")
    ax = fig.subplots()
    ax.plot(times, total, color="black", linewidth=1.8, label="total")
    for k, name in enumerate(servers):
        ax.plot(times, per_server[:, k], linewidth=0.9, label=name)
    ax.set_ylabel("output tok/s")
    ax.set_ylim(bottom=0)
    ax.set_title("throughput (UTC)", fontsize="medium")
    ax.xaxis.set_major_formatter(ConciseDateFormatter(ax.xaxis.get_major_locator()))
    ax.yaxis.set_major_locator(MaxNLocator(nbins=5))
    ax.grid(alpha=0.3)
    ax.legend(fontsize="x-small", loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    return png(fig, dpi=THROUGHPUT_DPI)


def _at(values: Sequence[float | None], k: int) -> float | None:
    return values[k] if k < len(values) else None


def live_plots(report: LiveReport) -> dict[str, bytes]:
    """The fleet-live report's pictures by name: throughput over the run so far."""
    chart = throughput_png(report.history, [s.name for s in report.servers])
    return {} if chart is None else {"throughput": chart}
