"""What the audit found: one model the CLI, the Prefect task and the report files all read."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from regen.config import Threshold
from regen.dataset.keys import AUDIT_MARKDOWN_KEY, CANARY_PREFIX, key_url
from regen.display.figures import count, markdown_table, pct, pct_within, sig
from regen.display.words import Status

Verdict = Literal["pass", "warn", "fail"]
Gate = Literal["canary", "rolling", "final"]
_SEVERITY: dict[Status, int] = {"skipped": 0, "pass": 0, "warn": 1, "fail": 2}


class Example(BaseModel):
    """A row that shows a defect: its id and why, never its prompt."""

    id: str
    reason: str


class Check(BaseModel):
    """One check: `figure` is the rate compared with the thresholds."""

    name: str
    title: str
    status: Status
    figure: float | None
    warn: float | None = None
    fail: float | None = None
    examples: list[Example] = Field(default_factory=list)
    detail: str = ""


class Quantiles(BaseModel):
    """p1 / p50 / p99 of one length column over the completions."""

    p1: float | None
    p50: float | None
    p99: float | None


class Histogram(BaseModel):
    """Counts between consecutive `edges`, kept so the report can plot without the data."""

    edges: list[float]
    counts: list[int]


class ServerRates(BaseModel):
    """One server's row count and the rate of every per-row defect."""

    server: str
    rows: int
    rates: dict[str, float]


class SettingFigures(BaseModel):
    """One sampling setting's rows and the rate of every graded defect (the per_setting
    check's), and its mean tokens per answer (reasoning: per answer that thought)."""

    setting: str
    rows: int
    completions: int
    rates: dict[str, float]
    mean_tokens: dict[str, float] = Field(default_factory=dict)


class AuditResult(BaseModel):
    """The verdict is the worst check; a skipped check neither passes nor fails."""

    dataset: str
    rows: int
    planned: int | None
    verdict: Verdict
    checks: list[Check]
    lengths: dict[str, Quantiles] = Field(default_factory=dict)
    histograms: dict[str, Histogram] = Field(default_factory=dict)
    finish_reasons: dict[str, int] = Field(default_factory=dict)
    servers: list[ServerRates] = Field(default_factory=list)
    per_setting: list[SettingFigures] = Field(default_factory=list)
    """Figures per sampling setting and thinking mode (one entry without a mix)."""
    stopped: str | None = None
    """Why the live gate stopped the run this audit closes (the rows and checks it named)."""
    gate: Gate = "final"
    """The gate that gave the verdict: the canary's or the rolling audit's stop, or this one."""
    uncommitted: int = 0
    """Rows judged that no committed shard holds: a stopped run's canary rows (`canary/`)."""
    stop_headline: str | None = None
    """The stop in short: the gate, its rows and its first failing figure (`stopped` is it in
    full); the first line of the failed state's message."""
    stop_checks: list[str] = Field(default_factory=list)
    """The stop's failing checks, one line each with its figure and threshold, each example id
    said once (`figure_lines`)."""

    def check(self, name: str) -> Check:
        """The check called `name`; KeyError names it when there is none."""
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(name)

    @property
    def failed_rows(self) -> int:
        """Rows that ended in an error, from the error-rate check's figure: what a run's
        summary reports as failed."""
        return round((self.check("error_rows").figure or 0.0) * self.rows)

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)

    def ordered_checks(self) -> list[Check]:
        """Failing checks first, then warnings, then the rest, each group in check order."""
        return sorted(self.checks, key=lambda c: -_SEVERITY[c.status])

    def headline(self) -> str:
        """`PASS 240 rows`, `FAIL empty/trivial answers 85.8 %`: the verdict and why; a
        stopped run names its gate, and the checks over its rows before its completeness."""
        if self.verdict == "pass":
            return f"PASS {self.rows:,} rows"
        worst = [c for c in self.ordered_checks() if c.status == self.verdict]
        if self.gate != "final":
            worst = [c for c in worst if c.name != "completeness"] or worst
        figures = ", ".join(f"{c.title} {pct(c.figure)}" for c in worst[:2])
        more = f" (+{len(worst) - 2} more)" if len(worst) > 2 else ""
        stop = f" (stopped by the {self.gate} gate)" if self.gate != "final" else ""
        return f"{self.verdict.upper()}{stop} {figures}{more}"

    def dataset_card(self) -> str:
        """The dataset card's figure: rows committed (of those planned), then the verdict:
        `240 / 240 rows committed · audit PASS`."""
        committed = f"{self.rows - self.uncommitted:,}"
        planned = f" / {self.planned:,}" if self.planned is not None else ""
        return f"{committed}{planned} rows committed · audit {self.verdict.upper()}"

    def failure_message(self) -> str:
        """A failed gate's state message, one wording for every gate: `FAIL:`, the gate and its
        first failing figure on the first line (what a UI card or `regen run`'s last line
        shows), then one line per failing check against its threshold, each example id said
        once, then where the data was kept (nothing is deleted; the next run can retry the
        errors)."""
        if self.stopped:
            head = self.stop_headline or self.stopped
            lines = self.stop_checks
        else:
            failing = [c for c in self.ordered_checks() if c.status == "fail"]
            figures = [(c.name, c.figure, c.fail, "", c.examples) for c in failing]
            head, lines = "final gate: " + short_figures(figures), figure_lines(figures)
        root = self.dataset.rstrip("/")
        kept = f"{self.rows - self.uncommitted:,} committed rows at {root}"
        if self.uncommitted:
            kept += f", {self.uncommitted:,} canary rows under {key_url(root, CANARY_PREFIX)}"
        report = key_url(root, AUDIT_MARKDOWN_KEY)
        said = [f"FAIL: {head}", *(f"- {line}" for line in lines)]
        return "\n".join([*said, f"The data was kept: {kept}; report at {report}"])

    def to_markdown(self) -> str:
        """Verdict first, then a narrow table with failures on top, then the details and
        examples by id below it (model output only in snippets)."""
        lines = [
            f"# Audit: **{self.verdict.upper()}**",
            "",
            f"**{self.headline()}**. Dataset `{self.dataset}`: {self.rows:,} rows"
            + (
                f" ({self.uncommitted:,} of them canary rows, under `canary/`)"
                if self.uncommitted
                else ""
            )
            + (f", {self.planned:,} planned" if self.planned is not None else "")
            + ".",
            "",
            *([f"**FAIL: {self.stopped}** (`report/stopped.json`).", ""] if self.stopped else []),
        ]
        ordered = self.ordered_checks()
        lines += markdown_table(
            ["status", "check", "figure", "warn at", "fail at"],
            ((_MARK[c.status], c.title, _figure(c), pct(c.warn), pct(c.fail)) for c in ordered),
            numeric={"figure", "warn at", "fail at"},
        )
        details = [c for c in ordered if c.detail]
        if details:
            lines += ["", "## Details", ""]
            lines += [f"- **{c.title}** ({c.status}): {_cell(c.detail)}" for c in details]
        if self.lengths:
            lines += ["", "## Lengths (tokens)", ""]
            lines += markdown_table(
                ["column", "p1", "p50", "p99"],
                # Exact: a rounded p99 could pass its bound (4,100 for a max_tokens of 4096).
                ((col, count(q.p1), count(q.p50), count(q.p99)) for col, q in self.lengths.items()),
                numeric={"p1", "p50", "p99"},
            )
        if self.servers:
            keys = sorted({k for s in self.servers for k in s.rates})
            lines += ["", "## Per server", ""]
            lines += markdown_table(
                ["server", "rows", *keys],
                (
                    (s.server, f"{s.rows:,}", *(pct(s.rates.get(k)) for k in keys))
                    for s in self.servers
                ),
                numeric={"rows", *keys},
            )
        if len(self.per_setting) > 1:
            lines += ["", "## Per sampling setting", ""]
            lines += setting_table(self.per_setting)
        with_examples = [c for c in ordered if c.examples]
        if with_examples:
            lines += ["", "## Examples"]
            for c in with_examples:
                lines += ["", f"**{c.title}** ({c.status})", ""]
                lines += [f"- `{e.id}`: {_cell(e.reason)}" for e in c.examples]
        return "\n".join(lines) + "\n"


def setting_table(figures: list[SettingFigures]) -> list[str]:
    """The per-setting markdown table; each setting named by what sets it apart (the keys
    every setting shares are said once, above the table)."""
    labels = [f.setting.split() for f in figures]
    common = set.intersection(*(set(words) for words in labels)) if labels else set()
    keys = sorted({k for f in figures for k in f.rates})
    shared = " ".join(w for w in labels[0] if w in common) if labels else ""
    lines = [f"All settings: `{shared}`.", ""] if shared else []
    return lines + markdown_table(
        ["setting", "rows", *keys, "mean answer tokens", "mean reasoning tokens"],
        (
            (
                " ".join(w for w in words if w not in common) or f.setting,
                f"{f.rows:,}",
                *(pct(f.rates.get(k)) for k in keys),
                sig(f.mean_tokens.get("completion_tokens")),
                sig(f.mean_tokens.get("reasoning_tokens")),
            )
            for f, words in zip(figures, labels, strict=True)
        ),
        numeric={"rows", *keys, "mean answer tokens", "mean reasoning tokens"},
    )


FailingFigure = tuple[str, float | None, float | None, str, list[Example]]
"""A failing check as a message names it: name, figure, fail threshold, a note after the figure
(`(1,000 of 2,000 input rows)`) and its examples."""
_SHOWN_IDS = 3


def figure_lines(figures: list[FailingFigure]) -> list[str]:
    """One line per failing check: `empty_answer 87.1 % (fail at 5.00 %), e.g. ids a, b, c`.
    An example already named on an earlier line is not named again: the rows of a collapse
    are empty, tiny and short-masked at once, and their ids would repeat on every line."""
    shown: set[str] = set()
    out = []
    for name, figure, fail, note, examples in figures:
        line = f"{name} {pct(figure)}{note}"
        if fail is not None:
            line += f" (fail at {pct(fail)})"
        ids = [e.id for e in examples[:_SHOWN_IDS] if e.id not in shown]
        shown.update(ids)
        out.append(line + (f", e.g. {example_ids(ids)}" if ids else ""))
    return out


def short_figures(figures: list[FailingFigure]) -> str:
    """The first failing figure and how many more: `empty_answer 87.1 % (+4 more)`."""
    if not figures:
        return "no check over its fail threshold"
    name, figure, *_ = figures[0]
    more = f" (+{len(figures) - 1} more)" if len(figures) > 1 else ""
    return f"{name} {pct(figure)}{more}"


def example_ids(ids: list[str]) -> str:
    """`ids a, b`; a rejected input row's example is its line (`line 1001, line 1002`)."""
    joined = ", ".join(ids)
    return joined if all(i.startswith("line ") for i in ids) else f"ids {joined}"


def verdict_of(checks: list[Check]) -> Verdict:
    worst = max((_SEVERITY[c.status] for c in checks), default=0)
    return ("pass", "warn", "fail")[worst]


def grade(figure: float, threshold: Threshold) -> Status:
    """The status of a rate against a threshold (at or above is over)."""
    if figure > 0 and figure >= threshold.fail:
        return "fail"
    if figure > 0 and figure >= threshold.warn:
        return "warn"
    return "pass"


def graded(
    name: str,
    title: str,
    rate: float,
    threshold: Threshold,
    *,
    detail: str,
    examples: list[Example] | None = None,
    status: Status | None = None,
) -> Check:
    """A check whose `rate` is graded against `threshold`, the limits shown beside it; `status`
    overrides the grade where a check knows better (a "most common" answer seen once)."""
    return Check(
        name=name,
        title=title,
        status=grade(rate, threshold) if status is None else status,
        figure=rate,
        warn=threshold.warn,
        fail=threshold.fail,
        examples=examples or [],
        detail=detail,
    )


def skipped(name: str, title: str, detail: str) -> Check:
    """A check with nothing to measure: neither passes nor fails, and says why."""
    return Check(name=name, title=title, status="skipped", figure=None, detail=detail)


# Bold capitals, not emoji: a UI or terminal without an emoji font shows them all the same.
_MARK: dict[Status, str] = {
    "fail": "**FAIL**",
    "warn": "**WARN**",
    "pass": "pass",
    "skipped": "skipped",
}


def _figure(check: Check) -> str:
    """A check's figure as the table shows it, on its side of the threshold above it (a pass
    at 4.9996 % is never `5.00 %` beside `fail at 5.00 %`)."""
    figure = check.figure
    if figure is None:
        return pct(None)
    above = [t for t in (check.warn, check.fail) if t is not None and figure < t]
    return pct_within(figure, above[0] if above else None)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
