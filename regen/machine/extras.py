"""The command that installs one of regen's optional extras, for hints that must work.

regen is installed from its checkout, not from a package index, so `pip install 'regen[x]'`
names nothing a user can fetch; the hint names the extra's own pinned packages instead (read
from this installation's metadata, so pyproject.toml stays their one owner) for this
interpreter's pip.
"""

from __future__ import annotations

import re
import shlex
import sys
from importlib.metadata import PackageNotFoundError, requires

_EXTRA = re.compile(r"""extra\s*==\s*['"]([^'"]+)['"]""")


def extra_packages(extra: str) -> list[str]:
    """The pinned requirements of `extra` (e.g. `nvidia-ml-py==13.615.71` for nvidia)."""
    try:
        found = requires("regen") or []
    except PackageNotFoundError:
        return []
    pins = []
    for line in found:
        spec, _, marker = line.partition(";")
        match = _EXTRA.search(marker)
        if match and match.group(1) == extra:
            pins.append(spec.strip())
    return pins


def install_command(extra: str, fallback: str) -> str:
    """`<this python> -m pip install <the extra's pins>`; `fallback` names the package when
    the metadata is not there (a source tree run without installing)."""
    packages = extra_packages(extra) or [fallback]
    return " ".join(
        [shlex.quote(sys.executable), "-m", "pip", "install", *map(shlex.quote, packages)]
    )
