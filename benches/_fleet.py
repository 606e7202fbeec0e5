"""The chaos bench's fleet kinds (support/fleet_chaos.py): their plans, runs, table and totals.

Per kind: ids lost and doubled, aborted answers stored, processes and files left, and the
figures of healing: seconds from the fault until the server was back in the dispatcher
(`heal_s`, from report/fleet.json), rows generated meanwhile, the run's generation seconds
against a clean run of the same size in the same invocation (`slowdown`), and for a kind that
must stop, the seconds from its cause to the run's exit and whether it said so in one line.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from support.chaos import input_ids, reaping
from support.fleet_chaos import KINDS, PROCESS_KINDS, STOPS, Leg, Target, run_trial

ENGINE_KINDS = ("clean", "server kill")
"""What the real-engine mode runs: a CPU SGLang server takes a minute to come back."""
SMOKE = [Leg("server kill", {0: ["abort=0.2"]})]
"""The smoke's one run: one server killed while the other cuts a share of its answers (a
run each kind would double the smoke's time)."""


def plans(kinds: list[str], trials: int, smoke: bool) -> list[list[Leg]]:
    """Each trial's legs: `trials` rounds of every kind, a clean run first in each round (the
    load of the machine drifts: each round has its own baseline beside it)."""
    if smoke:
        return [SMOKE]
    order = sorted(kinds, key=lambda k: k != "clean")
    return [[Leg(kind)] for _ in range(trials) for kind in order]


def run(
    legs_of: list[list[Leg]], target: Target, root: Path, env: dict[str, str], console: Console
) -> list[dict[str, Any]]:
    expected = input_ids(target.prompts)
    rows: list[dict[str, Any]] = []
    for index, legs in enumerate(legs_of):
        base = root / f"fleet-{index:02d}"
        for row in run_trial(legs, target, base, env, reaping, expected):
            row = {"trial": index, **row}
            rows.append(row)
            console.print(row)
    clean = [r["gen_s"] for r in rows if r["kind"] == "clean" and r["ok"] and r["gen_s"]]
    baseline = statistics.mean(clean) if clean else None
    for row in rows:
        healed = row["kind"] != "clean" and row["kind"] not in STOPS and row["exit_code"] == 0
        row["slowdown"] = (
            round(row["gen_s"] / baseline, 2) if healed and baseline and row["gen_s"] else None
        )
    return rows


COLUMNS = [
    "trial", "kind", "at_rows", "exit", "stop", "heal_s", "rows_while_out", "gen_s",
    "slowdown", "relaunches", "cut_answers", "lost/doubled/aborted", "left", "ok",
]  # fmt: skip
SUMMARY = [
    "kind", "trials", "ok", "lost/doubled/aborted", "left", "heal_s", "rows_while_out",
    "slowdown", "stop_s",
]  # fmt: skip
HEADERS = {
    "at_rows": "fault at (rows)",
    "exit": "exit (rerun)",
    "stop": "stop s (one line)",
    "rows_while_out": "rows while out",
    "cut_answers": "cut",
    "lost/doubled/aborted": "ids lost/ doubled/ aborted stored",
    "left": "left: emu/pf/other procs, pid/key files",
}


def table(title: str, rows: list[dict[str, Any]]) -> Table:
    cells = []
    for r in rows:
        stop = None
        if r["kind"] in STOPS:
            said = "one line" if r["one_line"] else "NOT one line"
            stop = f"{_cell(r['stop_s'])} ({said})"
        rerun = f" ({r['rerun_rc']})" if "rerun_rc" in r else ""
        cells.append(
            {**r, "exit": f"{r['exit_code']}{rerun}", "stop": stop, "left": _left(r),
             "lost/doubled/aborted": f"{r['ids_lost']}/{r['ids_doubled']}/{r['aborted_stored']}"}
        )  # fmt: skip
    return _table(title, COLUMNS, cells)


def summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per kind: trials, ok, the totals that must be 0, and each figure's range or mean."""
    kinds = {}
    for kind in dict.fromkeys(r["kind"] for r in rows):
        mine = [r for r in rows if r["kind"] == kind]
        kinds[kind] = {
            "trials": len(mine),
            "ok": sum(r["ok"] for r in mine),
            **{k: sum(r[k] for r in mine) for k in ("ids_lost", "ids_doubled", "aborted_stored")},
            "processes_left": {k: sum(r["processes_left"][k] for r in mine) for k in PROCESS_KINDS},
            **{k: sum(r[k] for r in mine) for k in ("pid_files_left", "key_files_left")},
            "heal_s": _range([r["heal_s"] for r in mine]),
            "rows_while_out": _range([r["rows_while_out"] for r in mine], "{:.0f}"),
            "slowdown": _mean([r["slowdown"] for r in mine]),
            "stop_s": _range([r.get("stop_s") for r in mine]),
        }
    return kinds


def summary_table(title: str, kinds: dict[str, dict[str, Any]]) -> Table:
    rows = [
        {"kind": k, **v, "left": _left(v),
         "lost/doubled/aborted": f"{v['ids_lost']}/{v['ids_doubled']}/{v['aborted_stored']}"}
        for k, v in kinds.items()
    ]  # fmt: skip
    return _table(title, SUMMARY, rows)


def _table(title: str, columns: list[str], rows: list[dict[str, Any]]) -> Table:
    out = Table(title=title)
    for name in columns:
        out.add_column(HEADERS.get(name, name.replace("_", " ")))
    for row in rows:
        out.add_row(*(_cell(row.get(name)) for name in columns))
    return out


def _cell(value: object) -> str:
    if value is None:
        return "–"
    if isinstance(value, dict):
        return "/".join(str(v) for v in value.values())
    if isinstance(value, bool):
        return "yes" if value else "NO"
    return str(value)


def _left(row: dict[str, Any]) -> str:
    """`0/0/0, 0/0`: processes by kind, then PID and key files."""
    procs = "/".join(str(row["processes_left"][k]) for k in PROCESS_KINDS)
    return f"{procs}, {row['pid_files_left']}/{row['key_files_left']}"


def _range(values: list[float | None], form: str = "{:.1f}") -> str | None:
    known = [v for v in values if v is not None]
    if not known:
        return None
    low, high = min(known), max(known)
    return form.format(low) if low == high else f"{form.format(low)}-{form.format(high)}"


def _mean(values: list[float | None]) -> str | None:
    known = [v for v in values if v is not None]
    return f"{statistics.mean(known):.2f}x" if known else None


__all__ = ["ENGINE_KINDS", "KINDS", "plans", "run", "summary", "summary_table", "table"]
