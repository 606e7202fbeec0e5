"""Which tests share one xdist worker, decided on the controller from their node ids.

A module whose tests share an expensive fixture (a rehearsal run once, a Prefect server, a
cluster, another venv's driver process) runs as one unit on one worker, so the set-up is paid
once; every other test is a unit of its own. `--dist loadgroup` was meant to do this from
`xdist_group` marks, but pytest 9.2 builds node ids from a field that xdist 3.8 does not write
its group suffix into (pytest-xdist#1386): the marks were silently ignored, and each of these
set-ups ran on both workers.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

# A directory whose tests share one driver process: every module in it is one unit.
_BY_DIR = {"contract": "sglang"}
# Modules whose tests share a module or session fixture that runs a rehearsal or starts a
# server, a cluster or a trainers' driver.
_BY_MODULE = frozenset(
    {
        "test_bad_inputs.py", "test_chaos.py", "test_deployment.py", "test_flow.py",
        "test_glance_flow.py", "test_multinode.py", "test_rehearsal.py",
        "test_rehearsal_guards.py", "test_security.py", "test_trainers.py",
    }
)  # fmt: skip


def group_of(nodeid: str) -> str | None:
    """The unit a test shares with others, or None when it is a unit of its own."""
    path = PurePosixPath(nodeid.split("::", 1)[0])
    if path.parent.name in _BY_DIR:
        return _BY_DIR[path.parent.name]
    return str(path) if path.name in _BY_MODULE else None


class SharedSetupScheduling(LoadScopeScheduling):
    """xdist's scope scheduling over `group_of`'s units: the largest units go out first (its
    default reordering), so the run does not end on one worker still working through one."""

    def _split_scope(self, nodeid: str) -> str:
        return group_of(nodeid) or nodeid
