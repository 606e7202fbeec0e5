"""A finished run in one line: what happened, the rows committed, and what to do next.

It is the Completed state's message of a whole run (a node of a multi-node run ends with
none), so the Prefect UI shows it beside the state, and a notification automation that
matches on its first word (`DONE`) sends it as it is: the people waiting on a run read the
same line wherever they read it.
"""

from __future__ import annotations

from regen.display.naming import dataset_name

DONE = "done:"
"""The first word of a whole run's Completed message, and nothing else's."""


def done_line(
    output: str,
    *,
    rows_ok: int,
    rows_failed: int,
    verdict: str,
    published: str | None = None,
    exports: tuple[str, ...] = (),
) -> str:
    """`done: 240 rows committed at out/x (240 ok, 0 failed), audit PASS; next: …`."""
    root = output.rstrip("/")
    rows = rows_ok + rows_failed
    head = (
        f"{DONE} {rows:,} rows committed at {root} ({rows_ok:,} ok, {rows_failed:,} failed), "
        f"audit {verdict.upper()}"
    )
    if published:
        return f"{head}; published to {published}"
    if exports:
        return f"{head}; trainer files at {', '.join(exports)}"
    repo = f"hf://datasets/ORG/{dataset_name(root)}"
    return (
        f"{head}; next: `regen export {root} -f tokenized --single-file -o {root}-export/tokenized`"
        f" for a trainer, or `regen publish {root} {repo}` for the Hub"
    )
