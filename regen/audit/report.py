"""The audit's files under report/: the JSON and markdown the gate read, and its plots."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from regen.audit.result import AuditResult
from regen.dataset.keys import AUDIT_MARKDOWN_KEY, AUDIT_REPORT_KEY, report_figure_key
from regen.display.plots import plots_markdown, png
from regen.storage import Storage

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def write_report(
    storage: Storage, result: AuditResult, plots: Mapping[str, bytes] | None = None
) -> list[str]:
    """Write report/audit.json, report/audit.md and report/*.png; the keys written. audit.md
    shows each plot by its file beside it (`lengths.png`); `plots` are `plot_pngs(result)`
    when the caller has drawn them already (the Prefect task embeds the same bytes)."""
    plots = plot_pngs(result) if plots is None else plots
    # report/audit.md sits beside the plots: a relative link renders wherever the folder does.
    linked = plots_markdown({name: report_figure_key(name).rpartition("/")[2] for name in plots})
    files = {
        AUDIT_REPORT_KEY: result.to_json().encode(),
        AUDIT_MARKDOWN_KEY: "\n".join(filter(None, [result.to_markdown(), linked])).encode(),
    }
    for name, data in plots.items():
        files[report_figure_key(name)] = data
    for key, data in files.items():
        storage.write_bytes(key, data)
    return sorted(files)


def plot_pngs(result: AuditResult) -> dict[str, bytes]:
    """The audit's plots as PNG bytes by name (`lengths`, `finish_reasons`, `servers`), each
    only when there is something to draw."""
    return {name: png(figure) for name, figure in _figures(result).items()}


def _figures(result: AuditResult) -> dict[str, Figure]:
    # The object-oriented API with no pyplot: no global figure state, no GUI back end.
    from matplotlib.figure import Figure

    figures: dict[str, Figure] = {}
    if result.histograms:
        fig = Figure(figsize=(4 * len(result.histograms), 3.2), layout="constrained")
        axes = fig.subplots(1, len(result.histograms), squeeze=False)[0]
        for ax, (col, hist) in zip(axes, result.histograms.items(), strict=True):
            ax.stairs(hist.counts, [e + 1 for e in hist.edges], fill=True)
            ax.set_xscale("log")
            ax.set_title(col)
            ax.set_xlabel("tokens + 1")
            ax.set_ylabel("rows")
        figures["lengths"] = fig
    if result.finish_reasons:
        fig = Figure(figsize=(5, 3), layout="constrained")
        ax = fig.subplots()
        ax.bar(list(result.finish_reasons), list(result.finish_reasons.values()))
        ax.set_title("finish_reason")
        ax.set_ylabel("rows")
        figures["finish_reasons"] = fig
    if result.servers:
        keys = sorted({k for s in result.servers for k in s.rates})
        fig = Figure(figsize=(max(6, len(keys) * 1.2), 3.5), layout="constrained")
        ax = fig.subplots()
        width = 0.8 / len(result.servers)
        for i, server in enumerate(result.servers):
            xs = [j + i * width for j in range(len(keys))]
            ax.bar(xs, [server.rates.get(k, 0.0) for k in keys], width, label=server.server)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(keys))], keys, rotation=30)
        ax.set_ylabel("rate")
        ax.set_title("defect rates per server")
        ax.legend(fontsize="small")
        figures["servers"] = fig
    return figures
