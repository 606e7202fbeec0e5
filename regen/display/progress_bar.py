"""A run's progress on a terminal: a `rich` bar with the card's figures beside it."""

from __future__ import annotations

from rich.progress import Progress, TaskID

from regen.display.figures import compact, eta
from regen.progress.snapshot import ProgressSnapshot


class ProgressBar:
    """Started when made; `show` each snapshot, `stop` once (the terminal is given back)."""

    def __init__(self) -> None:
        self._progress = Progress()
        self._progress.start()
        self._task: TaskID | None = None

    def show(self, snap: ProgressSnapshot) -> None:
        # The card's figures, as the UI shows them (the bar draws the share itself).
        ahead = snap.ended or eta(snap.updated_at, snap.eta_s)
        text = f"{compact(snap.tokens_per_s)} tok/s · {ahead} · {snap.failed:,} failed"
        if self._task is None:
            self._task = self._progress.add_task(text, total=snap.total)
        self._progress.update(self._task, completed=snap.done, total=snap.total, description=text)

    def stop(self) -> None:
        self._progress.stop()
