"""`sglang serve` 0.5.23's option list, vendored: for the preflight's flag check where the node
has no sglang to ask, and for the emulator, which parses its command line with it.

Written by `regen/fleet/argcheck.py flags` in an env with sglang; tests/contract checks it
still equals sglang's own parser.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

FLAGS_FILE = Path(__file__).with_name("sglang_flags.json")


@cache
def sglang_flags() -> list[dict[str, Any]]:
    """Each option: its strings, nargs, type name, choices (the shapes; no defaults)."""
    flags: list[dict[str, Any]] = json.loads(FLAGS_FILE.read_text())
    return flags
