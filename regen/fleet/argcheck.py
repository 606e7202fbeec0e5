"""Run by path inside the engine's interpreter: SGLang's own parser on each launch argv.

`python argcheck.py probe` reads a JSON list of argvs on stdin, imports sglang (its version
and how long that took: preflight's engine row) and prints, for each argv, either the parsed
values or the parser's own error, exactly as `sglang serve` would have exited at launch
(preflight's flags row): one start of the interpreter, one import of sglang (10-25 s on a
small CPU), for both rows. Nothing is launched (0.5.23's `prepare_server_args` parses and
merges `--config`; resolution against the model and the GPUs happens later, in
`resolve_once`). `verdicts` is null where sglang has no server parser to ask.
`python argcheck.py flags` prints every flag of the parser: regen/sglang_api/sglang_flags.json.

Standard library only, no `regen` import: the engine's interpreter has sglang, not regen.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
from typing import Any

SECRET_DESTS = ("api_key", "admin_api_key")
_KINDS = {
    argparse._StoreTrueAction: "store_true",
    argparse._StoreFalseAction: "store_false",
    argparse._StoreConstAction: "store_const",
    argparse.BooleanOptionalAction: "boolean_optional",
    argparse._AppendAction: "append",
    argparse._StoreAction: "store",
}
_TYPES = {int: "int", float: "float", str: "str", json.loads: "json"}


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return repr(value)


def _kind(action: argparse.Action) -> str:
    for cls in type(action).__mro__:
        if cls in _KINDS:
            return _KINDS[cls]
    return type(action).__name__


def _type_name(kind: Any) -> str | None:
    if kind is None:
        return None
    return _TYPES.get(kind) or getattr(kind, "__name__", "str")


def flags() -> list[dict[str, Any]]:
    """Every option of `sglang serve`: names, dest, kind, type, nargs, choices, required.

    Defaults are left out: some follow the machine, and the emulator needs only the shape."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        out.append(
            {
                "options": list(action.option_strings),
                "dest": action.dest,
                "kind": _kind(action),
                "type": _type_name(action.type),
                "nargs": action.nargs,
                "const": _jsonable(action.const),
                # Sorted: sglang builds some choice lists from sets, in no fixed order.
                "choices": sorted(_jsonable(list(action.choices)), key=str)
                if action.choices
                else None,
                "required": bool(action.required),
            }
        )
    return out


def check(argv: list[str]) -> dict[str, Any]:
    """One argv through `prepare_server_args`: {"ok", "values"} or {"ok": False, "error"}."""
    from sglang.srt.server_args import prepare_server_args

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parsed = prepare_server_args(argv)
    except SystemExit as exit_:
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        return {"ok": False, "code": exit_.code, "error": lines[-1] if lines else str(exit_)}
    except Exception as exc:  # the parser's own checks raise, e.g. a bad --config file
        return {"ok": False, "code": 1, "error": f"{type(exc).__name__}: {exc}"}
    # ServerArgs is a msgspec Struct in 0.5.23: its fields, not its __dict__, are the values.
    names = getattr(parsed, "__struct_fields__", None) or [k for k in vars(parsed) if k[0] != "_"]
    values = {}
    for name in names:
        value = getattr(parsed, name, None)
        values[name] = "<set>" if name in SECRET_DESTS and value else _jsonable(value)
    return {"ok": True, "values": values}


def probe(argvs: list[list[str]]) -> dict[str, Any]:
    """sglang's version, its import time and its parser's verdict on each of `argvs`."""
    start = time.monotonic()
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries the answer alone
        import sglang

        took = time.monotonic() - start
        try:
            verdicts: list[dict[str, Any]] | None = [check(argv) for argv in argvs]
        except ImportError:  # an sglang without its server (srt) has no parser to ask
            verdicts = None
    return {
        "version": str(getattr(sglang, "__version__", "ok")),
        "import_s": took,
        "verdicts": verdicts,
    }


def main() -> int:
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command == "flags":
        # One flag a line: a new sglang's diff reads as the flags it added or changed.
        print("[\n" + ",\n".join(json.dumps(f) for f in flags()) + "\n]")
    elif command == "probe":
        json.dump(probe(json.load(sys.stdin)), sys.stdout)
    else:
        print("usage: argcheck.py probe|flags", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
