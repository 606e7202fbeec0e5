"""A run whose generation stopped for a cause no shard gets past, said in one line.

A fleet that is gone, a key the servers refuse, a full disk, the output's lease lost to another
run (`shard.stops_run`): every shard would fail alike, so the run stops at the first one. The
shards it had not started stay pending (no manifest: the next run generates them), those in
flight end not committed, and the run ends with one line instead of one failure per shard: the
cause in its own words, what the dataset holds, and how to resume (not after a lost lease: the
output is another run's then). Before, a dead fleet failed the remaining shards one by one (57
failure lines for one cause, and a final message that listed them all).
"""

from __future__ import annotations

from regen.dataset import take_census
from regen.errors import FleetUnauthorized, UserError
from regen.storage import Storage
from regen.storage.diskfull import DiskFull
from regen.storage.output_lease import LeaseLost


class GenerationStopped(UserError):
    """Generation stopped for `cause` (see the module docstring); `line` says it whole."""

    def __init__(
        self,
        cause: str,
        *,
        output: str,
        committed: int,
        shards: int,
        rows: int,
        fix: str = "",
        node: str | None = None,
        details: tuple[str, ...] = (),
        resumes: bool = True,
    ) -> None:
        self.cause = cause
        self.output = output
        self.committed = committed
        self.shards = shards
        self.rows = rows
        self.fix = fix
        """What to do before resuming (`fix the key`), or nothing: a rerun alone resumes."""
        self.node = node
        self.resumes = resumes
        """False when another run holds the output now: its work, not a rerun's."""
        self.details = details
        """The cause's lines after its first (a fleet that did not come up: each server and
        the end of its log): under the line, never in it."""
        super().__init__(self.line())

    def message(self, command: str | None = None) -> str:
        """The line, then the cause's details one a line: a Failed state's message."""
        return "\n".join([self.line(command), *self.details])

    def line(self, command: str | None = None) -> str:
        """The cause, what is committed, and how to resume: with `command` (the one the user
        typed) that command, else `run it again`. A node of a multi-node run is resumed by
        the other nodes, which take its unfinished shards."""
        rows = f" ({self.rows:,} rows)" if self.committed else ""
        kept = f"{self.committed:,} of {self.shards:,} shards committed{rows} in {self.output}"
        if self.node is not None:
            return (
                f"{self.cause}; node {self.node} stopped and left its unfinished shards to "
                f"the other nodes; {kept}"
            )
        if not self.resumes:
            return f"{self.cause}; {kept}"
        kept += ", kept" if self.committed else ""
        again = f"run `{command}` again" if command else "run it again"
        then = f"{self.fix}, then {again}" if self.fix else again
        return f"{self.cause}; {kept}; {then} to resume"


def generation_stopped(
    storage: Storage,
    fingerprint: str,
    num_shards: int,
    err: Exception,
    *,
    output: str,
    key_source: str,
    node: str | None = None,
) -> GenerationStopped:
    """The stop of a run (or node) on `err`, with the dataset's committed shards as they are
    now (one listing and a read of each manifest: once, at the stop). `key_source` says where
    the servers' API key came from, named when they refused it (the key itself never is)."""
    census = take_census(storage, fingerprint)
    cause, *details = (str(err).strip() or type(err).__name__).splitlines()
    fix = ""
    if isinstance(err, FleetUnauthorized):
        cause, fix = f"{cause} (the key is {key_source})", "fix the key"
    elif isinstance(err, DiskFull):
        fix = "free space or grow it"
    return GenerationStopped(
        cause.rstrip(":"),
        output=output,
        committed=len(census.committed),
        shards=num_shards,
        rows=sum(m.rows for m in census.committed.values()),
        fix=fix,
        node=node,
        details=tuple(details),
        resumes=not isinstance(err, LeaseLost),
    )
