"""What the bad-input and security tests share: configs on disk, a dataset's bytes, a verdict.

A `Verdict` is what a user sees after a mistake (exit status, message, everything printed);
`Tally` counts the cases and how many gave one line naming what is wrong, for the report.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from regen.machine.ports import quiet_port_range
from regen.rehearsal import bundled

# Long enough that the audit's tiny-prompt check passes on a rehearsal of a handful of rows.
GOOD_ROW = (
    '{"id": "%s", "messages": [{"role": "user", "content": '
    '"Explain step by step how to add one to the number called %s, then check the result."}]}'
)


def rows(*ids: str) -> str:
    """Valid JSONL rows, one per id."""
    return "".join(GOOD_ROW % (i, i) + "\n" for i in ids)


def free_base_port() -> int:
    """A free port below the ephemeral range, where no client socket can take it meanwhile."""
    return quiet_port_range(1)


def base_config(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    """A valid emulator config as a mapping, its files inside tmp_path."""
    prompts = tmp_path / "prompts.jsonl"
    if not prompts.exists():
        prompts.write_text(rows("a", "b"))
    data: dict[str, Any] = {
        "model": {"source": str(bundled("emulator-model")), "served_name": "m", "stage": False},
        "prompts": str(prompts),
        "output": str(tmp_path / "out"),
        "engine": {"kind": "emulator", "gpus": [0], "base_port": free_base_port()},
    }
    data.update(overrides)
    return data


def write_yaml(path: Path, data: Any) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def tree_digest(root: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under `root`: equal digests, untouched data."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@dataclass(frozen=True)
class Verdict:
    """What the user saw: `code` is the exit status (1 for a failed provisioning row)."""

    code: int
    message: str
    printed: str


@dataclass
class Tally:
    cases: list[tuple[str, bool]] = field(default_factory=list)

    def judge(self, case: str, verdict: Verdict, *names: str) -> None:
        """Record the case, then assert: non-zero, one line, names each of `names`, no traceback."""
        one_line = (
            verdict.code != 0
            and "\n" not in verdict.message.strip()
            and bool(verdict.message.strip())
            and all(n in verdict.message for n in names)
            and "Traceback" not in verdict.printed
        )
        self.cases.append((case, one_line))
        assert verdict.code != 0, (case, verdict)
        assert "Traceback" not in verdict.printed, verdict.printed
        lines = verdict.message.strip().splitlines()
        assert len(lines) == 1, (case, lines)
        for name in names:
            assert name in lines[0], (case, name, lines[0])

    def accept(self, case: str, ok: bool) -> None:
        """A case where the right answer is "no error" (a BOM, CRLF) or a rejected row."""
        self.cases.append((case, ok))
        assert ok, case

    def summary(self) -> str:
        good = sum(ok for _, ok in self.cases)
        return f"bad inputs: {len(self.cases)} cases, {good} answered in one line or accepted"
