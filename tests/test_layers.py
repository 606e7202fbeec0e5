"""Imports point down: regen/ never imports the Prefect layers above it, client and fleet share
the SGLang wire format through regen.sglang_api rather than each other, and importing the
config or the fleet loads nothing it does not use."""

from __future__ import annotations

import ast
import functools
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
    above = ("flows", "tasks", "blocks", "tests", "benches", "support", "prefect")
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


def test_generation_knows_nothing_of_the_multinode_protocol() -> None:
    """A node of a multi-node run drives stage 4 through a `ShardSource` and a shard's fence,
    both declared in regen/generation/: the protocol sits above the stage, not inside it."""
    crossing = {
        f"{path}: {name}"
        for path, names in _imports(REGEN / "generation").items()
        for name in names
        if name == "regen.multinode" or name.startswith("regen.multinode.")
    }
    assert not crossing


def test_import_regen_fleet_loads_no_dispatcher() -> None:
    assert not {m for m in _loaded("regen.fleet") if m.startswith("regen.client")}


def test_regen_status_loads_neither_the_progress_writer_nor_a_terminal_library() -> None:
    """`regen status` reads one JSON file: it loaded the writer's thread, the dispatcher's
    counters and rich with it while all of progress sat in one `__init__`. The snapshot is a
    value, its words are regen.display.progress, and neither needs the parts that write it."""
    for module in ("regen.progress.status", "regen.progress.snapshot", "regen.display.progress"):
        loaded = _loaded(module)
        writing = {"regen.progress.writer", "regen.progress.meter", "regen.client.stats"}
        assert not loaded & writing, (module, loaded & writing)
        assert not {m for m in loaded if m == "rich" or m.startswith("rich.")}, module


STATUS = """
import sys
from flows.cli import main
code = main(["status", sys.argv[1]])
print("\\n".join(sys.modules), file=sys.stderr)
sys.exit(code)
"""


def test_the_regen_status_command_loads_no_writer_no_dispatcher_and_no_rich(
    tmp_path: Path,
) -> None:
    """The whole command on a run's root, not its modules alone: reading the stop record
    imported the canary package, which loaded the dispatcher, and the audit package, which
    loaded rich for its terminal table."""
    from regen.dataset.keys import progress_key
    from regen.progress.snapshot import ProgressSnapshot
    from regen.storage import LocalStorage

    snap = ProgressSnapshot(
        updated_at=0.0, elapsed_s=1.0, total=10, done=4, already_done=0, ok=4, failed=0,
        in_flight=0, queued=6, retries=0, shards_committed=0, rows_committed=0,
        output_tokens=400, tokens_per_s=400.0, rows_per_s=4.0, eta_s=1.5, servers=(),
    )  # fmt: skip
    LocalStorage(tmp_path).write_bytes(progress_key(), snap.to_json())
    done = subprocess.run(
        [sys.executable, "-c", STATUS, str(tmp_path)], capture_output=True, text=True
    )
    assert done.returncode == 0 and "live gate:" in done.stdout, done
    loaded = set(done.stderr.split())
    heavy = {"regen.progress.writer", "regen.client", "regen.audit.table", "prefect", "aiohttp"}
    assert not loaded & heavy, loaded & heavy
    assert not {m for m in loaded if m == "rich" or m.startswith("rich.")}


def test_one_lease_protocol_under_its_users() -> None:
    """The output's lease and the shard claims were two leases on the same generation files,
    each with its own expiry, races and fence. Now regen.storage.lease is the one protocol:
    it knows none of its users, and no module but it creates a record (`create_exclusive`)
    or judges one's expiry; the users say whose a record is."""
    users = ("regen.storage.output_lease", "regen.multinode")
    assert not {
        name for name in _imports(REGEN / "storage")["storage/lease.py"] if name.startswith(users)
    }
    writers = {
        str(path.relative_to(REGEN))
        for path in REGEN.rglob("*.py")
        if "create_exclusive(" in path.read_text() or "expires_at >" in path.read_text()
    }
    # The stores' own (a directory, S3) and the probe of the conditional create in __init__.
    assert writers == {"storage/__init__.py", "storage/s3.py", "storage/lease.py"}, writers


def test_config_is_the_bottom_layer() -> None:
    """Every layer reads the config, so the config reads no other room of regen: its sections
    (the audit's thresholds and the export's options included) live in regen/config/, and
    importing it loads nothing else of regen (no polars, no audit)."""
    upward = {
        f"{path}: {name}"
        for path, names in _imports(REGEN / "config").items()
        for name in names
        if name.startswith("regen.") and name.split(".")[1] not in ("config", "errors")
    }
    assert not upward
    loaded = {m for m in _loaded("regen.config") if m.startswith("regen.")}
    assert loaded <= {"regen.errors"} | {m for m in loaded if m.startswith("regen.config")}
    assert "polars" not in _loaded("regen.config")


# The modules at regen's top level: each is one idea every room uses (an error, the row
# schema, the fingerprint, the opened run...) or a command's own; anything else has a room.
TOP_LEVEL = {
    "__init__", "cli", "conversations", "errors", "estimate", "fingerprint", "hub_errors", "run",
    "schema", "tools",
}  # fmt: skip


def test_regen_top_level_holds_rooms_not_loose_modules() -> None:
    """A new module goes into the room of its idea (storage, machine, display, progress...),
    not beside 15 packages at the top, where 26 loose modules had gathered."""
    assert {p.stem for p in REGEN.glob("*.py")} <= TOP_LEVEL


def _module_name(path: Path) -> str:
    parts = ["regen", *path.relative_to(REGEN).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _top_level_imports(path: Path, known: set[str], *, type_checking: bool = False) -> set[str]:
    """The regen modules a file imports when it is imported: module-level statements only
    (a function's import runs later, a TYPE_CHECKING block never); with `type_checking`, the
    imports of its module-level `if TYPE_CHECKING:` blocks too."""
    body = list(ast.parse(path.read_text(), str(path)).body)
    if type_checking:
        # A package's own submodules named under TYPE_CHECKING in its __init__ are a lazy
        # facade (a module `__getattr__` loads each on first use), not a dependency of it.
        own = _module_name(path) + "." if path.name == "__init__.py" else None
        body += [
            stmt
            for node in body
            if isinstance(node, ast.If) and _is_type_checking(node.test)
            for stmt in node.body
            if own is None
            or not (isinstance(stmt, ast.ImportFrom) and (stmt.module or "").startswith(own))
        ]
    found: set[str] = set()
    for node in body:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return {name for name in found if name in known}


def _import_cycles(*, type_checking: bool) -> list[list[str]]:
    paths = {_module_name(p): p for p in REGEN.rglob("*.py")}
    graph = {
        name: _top_level_imports(path, set(paths), type_checking=type_checking) - {name}
        for name, path in paths.items()
    }
    # A module importing regen.x.y also runs regen.x's __init__: that edge is part of a cycle.
    for name in list(graph):
        for dep in list(graph[name]):
            parts = dep.split(".")
            graph[name].update(
                ".".join(parts[:i]) for i in range(2, len(parts)) if ".".join(parts[:i]) in paths
            )
            graph[name].discard(name)
    cycles: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1 and not node.startswith(dep + "."):
                cycles.append([*stack[stack.index(dep) :], dep])
            elif dep not in state:
                visit(dep, [*stack, dep])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    return cycles


def test_regen_has_no_import_cycle() -> None:
    cycles = _import_cycles(type_checking=False)
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles[:10])


def test_regen_has_no_import_cycle_hidden_under_type_checking() -> None:
    """A cycle that only an `if TYPE_CHECKING:` import closes still ties the modules together
    (each needs the other to be read, and a runtime import of that name brings the cycle
    back): the figures belong in a module both sides import."""
    cycles = _import_cycles(type_checking=True)
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles[:10])


ROOT = REGEN.parent
# The shipped packages: every key of a dataset root they use comes from regen/dataset/keys.py.
SHIPPED = ("regen", "flows", "tasks", "blocks")


# Cached: keys.py is the same for every file the rule reads, and this ran once per file read.
@functools.cache
def _layout_names() -> tuple[frozenset[str], tuple[str, ...]]:
    """The top of the layout as keys.py spells it: the root's files (run.json...) and its
    directories (shards/...), from every string that module holds (f-strings' leading text
    too), so a key added there is guarded here without a word changed."""
    tree = ast.parse((REGEN / "dataset" / "keys.py").read_text())
    texts = [
        part.value
        for node in ast.walk(tree)
        for part in (node.values if isinstance(node, ast.JoinedStr) else [node])
        if isinstance(part, ast.Constant) and isinstance(part.value, str)
    ]
    keys = [t for t in texts if t and not any(c.isspace() for c in t) and "(" not in t]
    whole_strings = _whole_strings(tree)  # once: it walks the whole tree
    whole = [t for t in keys if t in whole_strings]
    files = frozenset(t for t in whole if "/" not in t and t.endswith((".json", ".parquet")))
    dirs = {t.split("/")[0] + "/" for t in keys if "/" in t and t[0].isalpha()}
    return files, tuple(sorted(dirs))


def _whole_strings(tree: ast.AST) -> set[str]:
    """Strings that are whole constants, not the text between an f-string's fields."""
    parts = {
        id(part)
        for node in ast.walk(tree)
        if isinstance(node, ast.JoinedStr)
        for part in node.values
    }
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in parts
    }


def layout_keys_built(source: str, filename: str) -> list[str]:
    """`line: text` of each string in `source` that spells a key of the layout: a root file
    (`"run.json"`) or a path under a root directory (`"report/x.json"`, `f"{uri}/shards/"`).
    Docstrings and other prose (a string with spaces) are words about keys, not keys."""
    files, dirs = _layout_names()
    tree = ast.parse(source, filename)
    prose = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or not isinstance(node.value, str):
            continue
        text = node.value
        if id(node) in prose or not text or any(c.isspace() for c in text):
            continue
        # A key quoted in a message: `{root}/run.json` in backticks, (report: .../audit.md).
        path = text.lstrip("/").rstrip("`)'\",.;:")
        if path in files or path.startswith(dirs):
            found.append(f"{node.lineno}: {text!r}")
    return found


def test_no_module_outside_regen_dataset_builds_a_dataset_key() -> None:
    built = [
        f"{path.relative_to(ROOT)}:{hit}"
        for package in SHIPPED
        for path in sorted((ROOT / package).rglob("*.py"))
        if not path.is_relative_to(REGEN / "dataset")
        for hit in layout_keys_built(path.read_text(), str(path))
    ]
    assert not built, "build these keys in regen/dataset/keys.py:\n" + "\n".join(built)


def test_the_key_rule_catches_keys_and_passes_prose() -> None:
    keys = """
AUDIT = "report/audit.json"
def where(uri, node):
    return f"{uri}/shards/shard-{node:06d}.json", "progress.json", f"{uri}/run.json"
"""
    assert len(layout_keys_built(keys, "keys.py")) == 4
    prose = '''
"""Writes report/audit.json and progress.json."""
HELP = "the report/ directory holds report/audit.md and run.json"
def f():
    """shards/ is read through manifests."""
    return {"shards": 3, "report": "audit"}
'''
    assert layout_keys_built(prose, "prose.py") == []
