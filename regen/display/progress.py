"""A run's progress in words: the card, the headline, the Markdown of its end.

Every report of a run's progress says it through here (a Prefect card, the log, a terminal
bar, `regen status`), from the one value `regen.progress.snapshot.ProgressSnapshot`.
"""

from __future__ import annotations

from regen.display.figures import NONE, compact, duration, eta, markdown_table, pct, sig
from regen.progress.snapshot import ProgressSnapshot


def rows_line(snap: ProgressSnapshot) -> str:
    """`496 / 6,000 rows generated (8.27 %), 0 committed`: both counts, each named."""
    return (
        f"{snap.done:,} / {snap.total:,} rows generated ({pct(snap.fraction)}), "
        f"{snap.rows_committed:,} committed"
    )


def rate_line(snap: ProgressSnapshot) -> str:
    """The one throughput figure: the last minute's, or the run's average once over."""
    return f"{sig(snap.tokens_per_s)} output tok/s" + (" (run average)" if snap.ended else "")


def progress_headline(snap: ProgressSnapshot) -> str:
    """Rows generated and committed, speed and ETA in one line: the log's and every report's
    first words."""
    return f"{rows_line(snap)}, {snap.failed:,} failed this run; {rate_line(snap)}; " + (
        snap.ended or eta(snap.updated_at, snap.eta_s)
    )


def quality(snap: ProgressSnapshot) -> str:
    """The rolling audit in a word: `quality ok`, `quality warn`, `quality FAIL`, or `–`
    before its first shard."""
    checks = (snap.audit or {}).get("checks", {})
    if not snap.audit:
        return f"quality {NONE}"
    statuses = {v.get("status") for v in checks.values()}
    if snap.audit.get("quarantined") and "fail" not in statuses:
        return "quality warn"
    worst = "FAIL" if "fail" in statuses else "warn" if "warn" in statuses else "ok"
    return f"quality {worst}"


def progress_card(snap: ProgressSnapshot) -> str:
    """The figure a Prefect card shows before it cuts (~50 characters), most telling first:
    `82 % · ETA 00:55 UTC (24 s) · 64.3k tok/s · quality ok`; the rest follows it."""
    rate = f"{compact(snap.tokens_per_s)} tok/s"
    if snap.stopped:
        assert snap.ended is not None
        return (
            f"stopped · {snap.rows_committed:,} / {snap.total:,} committed "
            f"({snap.done:,} generated) · {snap.ended.removeprefix('stopped: ')}"
        )
    if snap.ended:
        return (
            f"{pct(snap.fraction)} · {snap.ended} in {duration(snap.elapsed_s)} · "
            f"{rate} · {quality(snap)}"
        )
    ahead = eta(snap.updated_at, snap.eta_s)
    return f"{pct(snap.fraction)} · {ahead} · {rate} · {quality(snap)}"


def audit_line(snap: ProgressSnapshot) -> str:
    """The rolling audit in one line: rows behind it, each failing or warning check."""
    if not snap.audit:
        return snap.ended or "rolling audit: no shard committed yet"
    checks = snap.audit.get("checks", {})
    loud = [f"{k} {pct(v['figure'])} {v['status']}" for k, v in checks.items()
            if v.get("status") in ("fail", "warn")]  # fmt: skip
    quarantined = snap.audit.get("quarantined") or []
    return (
        f"rolling audit over {snap.audit.get('rows', 0):,} rows: "
        + (", ".join(loud) or "every check within thresholds")
        + (f"; quarantined {', '.join(quarantined)}" if quarantined else "")
    )


def progress_markdown(snap: ProgressSnapshot) -> str:
    """The end of generation: the headline (a run that is over shows its run averages, the
    one throughput every report quotes), the audit, then each server."""
    rates = "run average" if snap.ended else "last minute"
    lines = [
        f"**{progress_headline(snap)}**",
        "",
        f"This run: {snap.output_tokens:,} output tokens in {duration(snap.elapsed_s)}; "
        f"{snap.retries:,} retries.",
        "",
        audit_line(snap),
        "",
        *markdown_table(
            ["server", "state", "in flight", f"tok/s ({rates})"],
            (
                (s.name, s.state, f"{s.in_flight}/{s.slots}", sig(s.tokens_per_s))
                for s in snap.servers
            ),
            numeric={"in flight", f"tok/s ({rates})"},
        ),
    ]
    return "\n".join(lines)
