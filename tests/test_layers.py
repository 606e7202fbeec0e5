"""Imports point down: regen/ never imports the Prefect layers above it, client and fleet share
the SGLang wire format through regen.sglang_api rather than each other, and importing the
config or the fleet loads nothing it does not use."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REGEN = Path(__file__).resolve().parents[1] / "regen"


def _imports(package: Path) -> dict[str, set[str]]:
    """Every module a package's files import, by file (relative to regen/)."""
    found: dict[str, set[str]] = {}
    for path in package.rglob("*.py"):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module)
        found[str(path.relative_to(REGEN))] = names
    return found


def _loaded(module: str) -> set[str]:
    code = f"import sys, {module}; print('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_regen_imports_no_layer_above_it() -> None:
    above = ("flows", "tasks", "blocks", "tests", "benches", "prefect")
    upward = {
        f"{path}: {name}"
        for path, names in _imports(REGEN).items()
        for name in names
        if name.split(".")[0] in above
    }
    assert not upward


@pytest.mark.parametrize(("package", "other"), [("client", "fleet"), ("fleet", "client")])
def test_client_and_fleet_do_not_import_each_other(package: str, other: str) -> None:
    crossing = {
        f"{path}: {name}"
        for path, names in _imports(REGEN / package).items()
        for name in names
        if name == f"regen.{other}" or name.startswith(f"regen.{other}.")
    }
    assert not crossing


def test_import_regen_fleet_loads_no_dispatcher() -> None:
    assert not {m for m in _loaded("regen.fleet") if m.startswith("regen.client")}


def test_import_regen_config_loads_no_audit_machinery() -> None:
    loaded = _loaded("regen.config")
    assert "regen.audit.thresholds" in loaded  # what the config embeds, and only that
    assert not {m for m in loaded if m.startswith("regen.audit.") and m != "regen.audit.thresholds"}
