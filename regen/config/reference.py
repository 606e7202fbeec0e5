"""The configuration reference: every section and key of `RegenConfig` as a Markdown page.

The page is rendered from the pydantic models themselves (type, default, description), so it
cannot drift from what the loader accepts: tests/test_docs.py renders it again and fails
when the committed page differs. Regenerate it with

    .venv/bin/python -m regen.config.reference

which writes docs/reference/config.md (run from the repository root).
"""

from __future__ import annotations

import enum
import inspect
import json
import sys
import types
import typing
from pathlib import Path, PurePath
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from regen.config.audit import Threshold
from regen.config.publish import PublishConfig
from regen.config.settings import RegenConfig

PAGE = Path("docs/reference/config.md")
COMMAND = ".venv/bin/python -m regen.config.reference"

_INTRO = f"""\
# Configuration reference

<!-- Generated from regen/config/ by `{COMMAND}`: edit the models' descriptions, not this page. -->

A run's configuration is one YAML file, given as `--config node.yaml` to `regen check`,
`regen rehearse`, `regen run`, `regen estimate` and `regen features`, or as the `config`
parameter of a flow run. Every key is checked before anything starts: an unknown key, a wrong
type or a value out of range is an error naming its dotted key, exit code 2:

```
node.yaml: engine.base_port: Input should be less than or equal to 65535
node.yaml: engine.gpu: unknown key
```

Only `model`, `prompts` and `output` are required; every other key has the default shown.
A section left out takes its defaults; `export` and `features` are off unless given.
"""

_PUBLISH = """\
## The `publish` parameter

Not a key of the config file: the `publish` parameter of the `regenerate` flow (a deployment
run), which publishes the dataset as the run's last step. `regen publish` takes the same
options as flags.
"""


def render() -> str:
    """The whole page: the config's sections in the order the model declares them."""
    parts = [_INTRO]
    parts += _section(RegenConfig, "", level=2, title="Top level")
    parts.append(_PUBLISH)
    parts += _table(PublishConfig, "publish.")
    return "\n".join(parts)


def _section(model: type[BaseModel], prefix: str, *, level: int, title: str) -> list[str]:
    """A heading, the section's docstring, its table, then each subsection below it."""
    heading = f"`{prefix.rstrip('.')}`" if prefix else title
    parts = [f"{'#' * level} {heading}\n"]
    if prefix:
        parts += [_escape(paragraph) + "\n" for paragraph in _doc(model).split("\n\n")]
    parts += _table(model, prefix)
    # The top level's sections are headings beside it, not under it.
    below = level + 1 if prefix else level
    for name, field in model.model_fields.items():
        sub = _submodel(field.annotation)
        if sub is not None and sub is not Threshold:
            parts += _section(sub, f"{prefix}{name}.", level=below, title=name)
    return parts


def _table(model: type[BaseModel], prefix: str) -> list[str]:
    rows = ["| key | type | default | description |", "|---|---|---|---|"]
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        rows.append(
            f"| `{key}` | {_type(field.annotation, key)}{_constraints(field.metadata)} "
            f"| {_default(field)} "
            f"| {_escape(_describe(field))} |"
        )
    return ["\n".join(rows) + "\n"]


def _describe(field: FieldInfo) -> str:
    if field.description:
        return field.description
    sub = _submodel(field.annotation)
    return _doc(sub).split("\n\n")[0] if sub is not None else ""


def _doc(model: type[BaseModel]) -> str:
    return inspect.cleandoc(model.__doc__ or "")


def _submodel(annotation: Any) -> type[BaseModel] | None:
    """The section a field holds (`X`, `X | None`, or a list of `X`), if it holds one."""
    if typing.get_origin(annotation) is list:
        annotation = typing.get_args(annotation)[0]
    options = typing.get_args(annotation) if _is_union(annotation) else (annotation,)
    found = [a for a in options if isinstance(a, type) and issubclass(a, BaseModel)]
    return found[0] if found else None


def _anchor(key: str) -> str:
    """A section heading's anchor as both mkdocs and GitHub make it: `engine.relaunch` is
    #enginerelaunch (the dot goes), so the page links the same on the site and in the repo."""
    return key.replace(".", "").lower()


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType)


_NAMES: dict[Any, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    Path: "path",
    SecretStr: "secret string",
}


def _type(annotation: Any, key: str) -> str:
    """A type in words: `integer (≥ 1)`, `one of stop, warn, off`, `list of string`."""
    if typing.get_origin(annotation) is typing.Annotated:
        inner, *metadata = typing.get_args(annotation)
        return _type(inner, key) + _constraints(metadata)
    if _is_union(annotation):
        options = [a for a in typing.get_args(annotation) if a is not type(None)]
        shown = " or ".join(_type(a, key) for a in options)
        return f"{shown} or null" if len(options) < len(typing.get_args(annotation)) else shown
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return "one of " + ", ".join(f"`{v}`" for v in typing.get_args(annotation))
    if origin is list:
        (item,) = typing.get_args(annotation)
        if typing.get_origin(item) is Literal:
            return "list of " + _type(item, key).removeprefix("one of ")
        return f"list of {_type(item, key)}"
    if origin is dict:
        k, v = typing.get_args(annotation)
        return f"map of {_type(k, key)} to {_type(v, key)}"
    if annotation is Threshold:
        return "`{warn, fail}` shares"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"[section](#{_anchor(key)})"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "one of " + ", ".join(f"`{m.value}`" for m in annotation)
    return _NAMES.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _constraints(metadata: list[Any]) -> str:
    """Bounds and lengths of a value, as a field's or an item's metadata states them."""
    said = []
    for item in metadata:
        if isinstance(item, FieldInfo):
            said += [_bound(m) for m in item.metadata]
        else:
            said.append(_bound(item))
    said = [s for s in said if s]
    return f" ({', '.join(said)})" if said else ""


def _bound(item: Any) -> str:
    if isinstance(item, annotated_types.Ge):
        return f"≥ {_number(item.ge)}"
    if isinstance(item, annotated_types.Gt):
        return f"> {_number(item.gt)}"
    if isinstance(item, annotated_types.Le):
        return f"≤ {_number(item.le)}"
    if isinstance(item, annotated_types.Lt):
        return f"< {_number(item.lt)}"
    if isinstance(item, annotated_types.MinLen):
        return "not empty" if item.min_length == 1 else f"at least {item.min_length} long"
    if isinstance(item, annotated_types.MaxLen):
        return f"at most {item.max_length} long"
    pattern = getattr(item, "pattern", None)
    if isinstance(pattern, str):
        return f"matching `{pattern}`"
    return ""


def _number(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    factory = field.default_factory
    value = factory() if factory is not None else field.default  # type: ignore[call-arg]
    if value is PydanticUndefined:
        return "required"
    return _value(value)


def _value(value: Any) -> str:
    """A default as it would be written in YAML; a section's as a pointer to its own keys."""
    if value is None:
        return "`null`"
    if isinstance(value, Threshold):
        return f"warn {_number(value.warn)}, fail {_number(value.fail)}"
    if isinstance(value, BaseModel):
        return "its keys' defaults"
    if isinstance(value, str) and value == sys.executable:
        # Machine-dependent: the page would differ between checkouts.
        return "the Python running regen"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float | int):
        return f"`{_number(value)}`"
    if isinstance(value, PurePath | str):
        return f"`{value}`"
    if isinstance(value, enum.Enum):
        return f"`{value.value}`"
    return f"`{json.dumps(value, ensure_ascii=False)}`"


def _escape(text: str) -> str:
    """Markdown-safe outside code spans: `<name>` is no HTML tag, `*` no emphasis, and `|` does
    not end a table cell."""
    pieces = text.split("`")
    for i in range(0, len(pieces), 2):
        pieces[i] = (
            pieces[i]
            .replace("&", "&amp;")
            .replace("<", "&lt;")
            .replace(">", "&gt;")
            .replace("*", "\\*")
            .replace("|", "\\|")
        )
    return "`".join(pieces).replace("\n", " ")


def main(argv: list[str] | None = None) -> int:
    """Write the page (or the path given) and say where."""
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0]) if args else PAGE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(), encoding="utf-8")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
