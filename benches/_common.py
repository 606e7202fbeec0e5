"""Where a bench writes its JSON: the real results, or a smoke run's, which must not replace them.

A smoke run (`--smoke`, what `make bench-smoke` and the test suite run) writes to
`benches/results/smoke/` (ignored by git) or to `$REGEN_BENCH_RESULTS` when set, so a test
can read what it wrote from its own temporary directory.
"""

from __future__ import annotations

import os
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def results_path(name: str, *, smoke: bool) -> Path:
    """The JSON file of bench `name`; its folder exists."""
    override = os.environ.get("REGEN_BENCH_RESULTS")
    folder = Path(override) if override else RESULTS / "smoke" if smoke else RESULTS
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{name}.json"
