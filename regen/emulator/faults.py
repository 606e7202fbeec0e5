"""Injected faults (`--emu-fault NAME[=VALUE]`): the failures a rehearsal must survive.

Each one reproduces something seen on real servers: the empty-answer incident, runaway
thinking, leaked think tags, repetition loops, transient 500s, answers cut short (`abort`:
SGLang's 200 with finish_reason abort, part-way through the decode), a crash, a scheduler that
hangs while `/health` still answers 200 (sglang#6624), a slow GPU, a failed or stuck load, and
a key rotated under a running server (`unauthorized-after`: every request refused with 401
after the first N chats, as when an operator restarts it, or the gateway in front of it, with
a new key).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Output faults, in the order they are tried for a prompt: the first one drawn wins.
OUTPUT_FAULTS = ("empty-answer", "truncate", "think-leak", "repeat-loop")
_FRACTIONS = (*OUTPUT_FAULTS, "http500", "abort")
_COUNTS = ("crash-after", "hang-after", "faults-after", "unauthorized-after")
_FLAGS = ("fail-startup", "no-ready")
NAMES = (*_FRACTIONS, *_COUNTS, "slow", *_FLAGS)


@dataclass(frozen=True)
class Faults:
    """The parsed `--emu-fault` specs; the defaults mean a healthy server."""

    fractions: dict[str, float] = field(default_factory=dict)
    crash_after: int | None = None
    hang_after: int | None = None
    faults_after: int | None = None
    """Output faults start after this many chat requests: a run that goes bad mid-way."""
    unauthorized_after: int | None = None
    """Every authenticated request is refused (401) after this many chat requests."""
    slow: float = 1.0
    fail_startup: bool = False
    no_ready: bool = False


def parse_faults(specs: list[str]) -> Faults:
    """Validate every spec; raise ValueError naming the bad one so the launch fails loudly."""
    fractions: dict[str, float] = {}
    counts: dict[str, int] = {}
    slow = 1.0
    flags: set[str] = set()
    for spec in specs:
        name, sep, value = spec.partition("=")
        name = name.strip()
        if name not in NAMES:
            raise ValueError(f"unknown --emu-fault {spec!r}; known: {', '.join(NAMES)}")
        if name in _FLAGS:
            if sep:
                raise ValueError(f"--emu-fault {name} takes no value, got {spec!r}")
            flags.add(name)
            continue
        if not sep or not value.strip():
            raise ValueError(f"--emu-fault {name} needs a value, e.g. {name}={_example(name)}")
        try:
            number = float(value) if name not in _COUNTS else int(value)
        except ValueError:
            raise ValueError(f"--emu-fault {spec!r}: {value!r} is not a number") from None
        if name in _FRACTIONS:
            if not 0.0 <= number <= 1.0:
                raise ValueError(f"--emu-fault {spec!r}: a fraction must be within [0, 1]")
            fractions[name] = number
        elif name in _COUNTS:
            if number < 0:
                raise ValueError(f"--emu-fault {spec!r}: a count must be >= 0")
            counts[name] = int(number)
        else:
            if number <= 0:
                raise ValueError(f"--emu-fault {spec!r}: the speed factor must be > 0")
            slow = number
    return Faults(
        fractions=fractions,
        crash_after=counts.get("crash-after"),
        hang_after=counts.get("hang-after"),
        faults_after=counts.get("faults-after"),
        unauthorized_after=counts.get("unauthorized-after"),
        slow=slow,
        fail_startup="fail-startup" in flags,
        no_ready="no-ready" in flags,
    )


def _example(name: str) -> str:
    counts = {"crash-after": "10", "hang-after": "10", "faults-after": "100"}
    return {**counts, "unauthorized-after": "100", "slow": "0.5"}.get(name, "0.1")
