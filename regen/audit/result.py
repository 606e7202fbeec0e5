"""What the audit found: one model the CLI, the Prefect task and the report files all read."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from regen.audit.thresholds import Threshold

Status = Literal["pass", "warn", "fail", "skipped"]
Verdict = Literal["pass", "warn", "fail"]
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

    def check(self, name: str) -> Check:
        """The check called `name`; KeyError names it when there is none."""
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(name)

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)

    def to_markdown(self) -> str:
        """Verdict first, then the table, then examples by id (model output only in snippets)."""
        lines = [
            f"# Audit: **{self.verdict.upper()}**",
            "",
            f"Dataset `{self.dataset}`: {self.rows} rows"
            + (f", {self.planned} planned" if self.planned is not None else "")
            + ".",
            "",
            "| check | status | figure | warn | fail | detail |",
            "|---|---|---|---|---|---|",
        ]
        for c in self.checks:
            lines.append(
                f"| {c.title} | {c.status} | {_pct(c.figure)} | {_pct(c.warn)} | "
                f"{_pct(c.fail)} | {_cell(c.detail)} |"
            )
        if self.lengths:
            lines += [
                "",
                "## Lengths (tokens)",
                "",
                "| column | p1 | p50 | p99 |",
                "|---|---|---|---|",
            ]
            for col, q in self.lengths.items():
                lines.append(f"| {col} | {_num(q.p1)} | {_num(q.p50)} | {_num(q.p99)} |")
        if self.servers:
            keys = sorted({k for s in self.servers for k in s.rates})
            lines += ["", "## Per server", "", "| server | rows | " + " | ".join(keys) + " |"]
            lines.append("|---|---|" + "---|" * len(keys))
            for s in self.servers:
                cells = " | ".join(_pct(s.rates.get(k)) for k in keys)
                lines.append(f"| {s.server} | {s.rows} | {cells} |")
        with_examples = [c for c in self.checks if c.examples]
        if with_examples:
            lines += ["", "## Examples"]
            for c in with_examples:
                lines += ["", f"**{c.title}** ({c.status})", ""]
                lines += [f"- `{e.id}`: {_cell(e.reason)}" for e in c.examples]
        return "\n".join(lines) + "\n"


def verdict_of(checks: list[Check]) -> Verdict:
    worst = max((_SEVERITY[c.status] for c in checks), default=0)
    return ("pass", "warn", "fail")[worst]  # type: ignore[return-value]


def grade(figure: float, threshold: Threshold) -> Status:
    """The status of a rate against a threshold (at or above is over)."""
    if figure > 0 and figure >= threshold.fail:
        return "fail"
    if figure > 0 and figure >= threshold.warn:
        return "warn"
    return "pass"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.2f} %"


def _num(value: float | None) -> str:
    return "–" if value is None else f"{value:g}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
