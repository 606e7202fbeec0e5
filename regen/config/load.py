"""Reading a config: YAML from a file, dotted overrides from the command line, one line per
problem naming its dotted key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    ValidationError,
)

from regen.config.settings import RegenConfig
from regen.errors import ConfigError


def _dotted(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc) or "<root>"


def format_validation_error(err: ValidationError, source: str) -> str:
    """One line per problem, each naming the dotted key, e.g. `engine.base_port: ...`."""
    lines = []
    for e in err.errors():
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        lines.append(f"{source}: {_dotted(e['loc'])}: {msg}")
    return "\n".join(lines)


def parse_config(data: Any, source: str = "config") -> RegenConfig:
    """Validate a mapping (from YAML, a flow parameter or a test) into a `RegenConfig`."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of settings, got {type(data).__name__}")
    try:
        return RegenConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source)) from None


def read_config_data(path: Path) -> dict[str, Any]:
    """The raw mapping of a YAML config file, with YAML errors named by file and line."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot read config: {err}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"{path}:{where}: invalid YAML: {problem}") from None
    if data is None:
        raise ConfigError(f"{path}: config file is empty")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of settings, got {type(data).__name__}")
    return data


def load_config(path: Path, overrides: dict[str, Any] | None = None) -> RegenConfig:
    """Load a YAML file, apply dotted-key overrides from the CLI, and validate."""
    data = read_config_data(path)
    for key, value in (overrides or {}).items():
        set_dotted(data, key, value)
    return parse_config(data, str(path))


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    """Set `a.b.c` in a nested mapping, creating sections as needed."""
    *parents, last = key.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
