"""The code check: compile and import every module a run will execute, before GPUs are rented.

The caller names the packages: the library cannot know which layers sit above it (the
Prefect tasks, flows and blocks that a run also imports), and must not name them.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Sequence
from pathlib import Path

from regen.preflight.report import CheckRow


def _module_name(package: str, location: Path, path: Path) -> str:
    parts = list(path.relative_to(location).with_suffix("").parts)
    if parts and parts[-1] == "__init__":
        parts.pop()
    return ".".join([package, *parts])


def _syntax_errors(package: str, location: Path) -> dict[str, str]:
    """Module name -> message for every source file under `location` that does not compile.

    Compiled in memory, not with compileall: an installed tree may be read-only, and
    compileall reports only that *something* under a directory failed, not what.
    """
    bad = {}
    for path in sorted(location.rglob("*.py")):
        try:
            compile(path.read_bytes(), str(path), "exec", dont_inherit=True)
        except (SyntaxError, ValueError) as err:
            name = _module_name(package, location, path)
            line = getattr(err, "lineno", None)
            where = f"{path.name} line {line}" if line else path.name
            msg = getattr(err, "msg", None) or str(err)
            bad[name] = f"{name} ({where}): {type(err).__name__}: {msg}"
    return bad


def check_code(packages: Sequence[str]) -> CheckRow:
    """Compile and import every module of `packages`: the incident's SyntaxError, caught here."""
    bad: list[str] = []
    count = 0
    for package in packages:
        try:
            mod = importlib.import_module(package)
        except Exception as err:  # the package's own __init__ is code that will run too
            bad.append(f"{package}: {type(err).__name__}: {str(err).splitlines()[0]}")
            continue
        broken: dict[str, str] = {}
        for location in getattr(mod, "__path__", []):
            broken.update(_syntax_errors(package, Path(location)))
        bad.extend(broken.values())
        # onerror: a broken subpackage is reported by the import below, not raised mid-walk.
        for info in pkgutil.walk_packages(mod.__path__, f"{package}.", onerror=lambda _: None):
            if info.name.endswith("__main__") or info.name in broken:
                continue
            count += 1
            try:
                importlib.import_module(info.name)
            except Exception as err:  # any import failure is exactly what this check is for
                bad.append(f"{info.name}: {type(err).__name__}: {str(err).splitlines()[0]}")
    if bad:
        more = f" (+{len(bad) - 3} more)" if len(bad) > 3 else ""
        return CheckRow(
            name="code",
            status="fail",
            figure="; ".join(bad[:3]) + more,
            hint="fix the module before renting GPUs",
        )
    return CheckRow(name="code", status="pass", figure=f"{count} modules compile and import")
