"""One lease protocol, kept as generation files: the output's lease and the shard claims.

A lease is a sequence of records `<prefix>...<n>.json` (keys of `regen.dataset.keys`), the
highest `n` the live one, each made with `Storage.create_exclusive` (a hard link locally,
`If-None-Match: *` on S3). Every change (a take, a takeover, a renewal, a release) creates
generation `n + 1`, never rewrites one, so each is a single atomic create-if-absent: of any
number of racers that read generation `n`, exactly one creates `n + 1`. Overwriting one object
in place could not be made atomic against a racer on S3. Generations older than the one just
superseded are deleted after each change, so a listing holds at most three keys however often
the lease is renewed, and the newest two are never deleted: no racer can recreate one.

One expiry rule: a record's holder holds the lease until it released it, until its process is
known to be gone (it ran in this process table, same boot and PID namespace, and its pid and
start time are gone: a kill -9 needs no wait; `regen.machine.owned.ended_here`), or until the
record's `expires_at` (its heartbeat plus its writer's lease), whichever comes first. Leases
rest on clocks agreeing to well within a lease.

One race handling: every change reads the live record, judges it and creates the next
generation; one that loses the create reads again and judges again (a racer took it, renewed
it, or released it), up to `RACES` times.

One fencing: before a commit, the live record must be the committer's (`mine`) with a third of
its lease left, so no one can take it over while the commit runs; a holder's own process with
less left renews it first (an atomic create: then it is held for a whole lease). A process that
shares a lease it does not hold (a node of a multi-node run on its parent's output lease)
leaves its renewal to the holder.

Its users are thin layers that say whose a record is and what a refusal means:
`regen.storage.output_lease` (one run per output) and `regen.multinode.claims` (one node per
shard).
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import Any

import psutil

from regen.dataset.keys import key_url
from regen.errors import UserError
from regen.machine.owned import ended_here, this_machine
from regen.storage import Storage

RACES = 5
"""Changes lost to a racer before one gives up: each loss means the lease changed hands."""

FENCE_SHARE = 1 / 3
"""The share of a lease a commit needs left (and a renewal's interval): two renewals of slack
before a lease can run out, and a whole third for any commit to finish inside it."""


class LeaseContended(RuntimeError):
    """The lease changed hands `RACES` times while this process tried to change it."""


@dataclass(frozen=True)
class Holder:
    """Who holds a lease: enough to find the process, and the run in Prefect's UI."""

    run_id: str
    """The output's lease: the run holding it, by which a record is the run's own. A shard
    claim: the claimer's own id (a claim is its node's by name)."""
    host: str
    pid: int
    pid_started: float
    since: float
    flow_run_id: str | None = None
    machine: str | None = None
    """The process table `pid` is read in (`this_machine`); None in a record written before it
    was kept, whose holder is then judged by its record's expiry alone."""
    node: str | None = None
    """The node of a multi-node run that holds a shard's claim; None on the output's lease."""

    @classmethod
    def this_process(
        cls, run_id: str | None = None, flow_run_id: str | None = None, node: str | None = None
    ) -> Holder:
        me = psutil.Process()
        return cls(
            run_id=run_id or uuid.uuid4().hex,
            host=socket.gethostname(),
            pid=me.pid,
            pid_started=me.create_time(),
            since=time.time(),
            flow_run_id=flow_run_id,
            machine=this_machine(),
            node=node,
        )

    def describe(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.since))
        run = f", flow run {self.flow_run_id}" if self.flow_run_id else ""
        node = f"node {self.node}: " if self.node else ""
        return f"{node}pid {self.pid} on {self.host} since {since}{run}"

    def process_gone(self) -> bool:
        """Whether the holder's process (pid and start time) is known to have ended: only
        where it ran (same boot and PID namespace) can that be seen."""
        return ended_here(self.machine, self.pid, self.pid_started)

    def is_this_process(self) -> bool:
        return (
            self.pid == os.getpid()
            and self.machine == this_machine()
            and self.host == socket.gethostname()
        )

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Holder:
        """A holder as stored; fields this version does not know (a newer writer's) are
        dropped, fields an older writer did not write take their defaults."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in known})


@dataclass(frozen=True)
class LeaseRecord:
    """One generation of a lease; `holder` None is a release."""

    generation: int
    holder: Holder | None
    heartbeat_at: float
    expires_at: float

    @property
    def lease_s(self) -> float:
        """The lease its writer gave it."""
        return self.expires_at - self.heartbeat_at

    def why_dead(self, now: float) -> str | None:
        """Why the holder no longer holds the lease at `now`, or None while it does."""
        holder = self.holder
        if holder is None:
            return "released"
        if holder.process_gone():
            return f"its process (pid {holder.pid} on {holder.host}) is gone"
        if now >= self.expires_at:
            age = now - self.heartbeat_at
            return f"no heartbeat for {age:.0f} s (lease {self.lease_s:g} s)"
        return None

    def to_json(self) -> bytes:
        body = asdict(self)
        # Shard claims before this protocol read `node` at the top: a node of an older regen
        # in the same multi-node run still reads who holds a shard.
        body["node"] = self.holder.node if self.holder else None
        return json.dumps(body, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, lease_s: float) -> LeaseRecord:
        """A record as stored, by this version or an older one: an output lease without
        `expires_at` (its reader's `lease_s` after its heartbeat), a shard claim with its
        `node` and `expires_at` alone (no process: judged by its expiry)."""
        raw = json.loads(data)
        holder = raw.get("holder")
        if isinstance(holder, dict):
            who: Holder | None = Holder.from_dict(holder)
        elif raw.get("node") is not None:
            who = Holder(run_id="", host="?", pid=0, pid_started=0.0, since=0.0, node=raw["node"])
        else:
            who = None
        expires = raw.get("expires_at")
        beat = raw.get("heartbeat_at")
        if beat is None:
            beat = float(expires) - lease_s
        return cls(
            generation=int(raw["generation"]),
            holder=who,
            heartbeat_at=float(beat),
            expires_at=float(beat) + lease_s if expires is None else float(expires),
        )


Mine = Callable[[Holder], bool]
"""Whose records a user counts as its own: a run by its id, a node by its name."""


class GenerationLease:
    """One lease on `storage`: generation `n` at `key(n)`, every key under `prefix`."""

    def __init__(
        self,
        storage: Storage,
        prefix: str,
        key: Callable[[int], str],
        parse: Callable[[str], int | None],
        *,
        lease_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if lease_s <= 0:
            raise ValueError("lease_s must be positive")
        self.storage = storage
        self.prefix = prefix
        self.key = key
        self.parse = parse
        self.lease_s = lease_s
        self.clock = clock

    def latest(self) -> LeaseRecord | None:
        """The live (highest) generation, or None if the lease was never taken."""
        keys = [k for k in self.storage.list(self.prefix) if self.parse(k) is not None]
        if not keys:
            return None
        try:
            return LeaseRecord.from_json(self.storage.read_bytes(keys[-1]), self.lease_s)
        except FileNotFoundError:  # pruned by a racer between the listing and the read
            return self.latest()
        except (ValueError, TypeError, KeyError) as err:
            where = key_url(self.storage.uri, keys[-1])
            raise UserError(f"{where}: unreadable lease record ({err})") from None

    def _write(self, after: LeaseRecord | None, holder: Holder | None, lease_s: float) -> bool:
        """Create the generation after `after` (0 after none); False: a racer created it."""
        generation = 0 if after is None else after.generation + 1
        now = self.clock()
        expires = now + lease_s if holder is not None else now
        record = LeaseRecord(generation, holder, now, expires)
        created = self.storage.create_exclusive(self.key(generation), record.to_json())
        if created:
            for key in self.storage.list(self.prefix):
                old = self.parse(key)
                if old is not None and old < generation - 1:
                    self.storage.delete(key)
        return created

    def acquire(self, holder: Holder, mine: Mine) -> tuple[bool, LeaseRecord | None]:
        """Hold the lease for `holder` unless another holder's record is live: (True, the
        record it replaced, None if none) or (False, that live record)."""
        for _ in range(RACES):
            current = self.latest()
            ours = current is not None and current.holder is not None and mine(current.holder)
            if current is not None and not ours and current.why_dead(self.clock()) is None:
                return False, current
            if self._write(current, holder, self.lease_s):
                return True, current
        raise LeaseContended(f"{self.storage.uri}: the lease of {self.prefix} keeps changing hands")

    def renew(self, holder: Holder, mine: Mine) -> tuple[bool, LeaseRecord | None]:
        """A heartbeat: (True, None) once the next generation holds `holder` again, while the
        live record is `mine` (even run out: nobody took it); (False, the live record) when it
        is not."""
        for _ in range(RACES):
            current = self.latest()
            if current is None or current.holder is None or not mine(current.holder):
                return False, current
            if self._write(current, holder, self.lease_s):
                return True, None
        raise LeaseContended(f"{self.storage.uri}: the lease of {self.prefix} keeps changing hands")

    def release(self, mine: Mine) -> None:
        """Give the lease up early, so the next holder need not wait; a no-op if the live
        record is not `mine` (losing that race means another already took it over)."""
        current = self.latest()
        if current is not None and current.holder is not None and mine(current.holder):
            self._write(current, None, self.lease_s)

    def holds(self, mine: Mine, margin_s: float = 0.0) -> bool:
        """Whether the live record is `mine` with more than `margin_s` of its lease left."""
        current = self.latest()
        return (
            current is not None
            and current.holder is not None
            and mine(current.holder)
            and current.expires_at - margin_s > self.clock()
        )

    def fence(self, mine: Mine) -> tuple[bool, LeaseRecord | None]:
        """Before a commit, the one fence (see the module docstring): (True, the record held)
        while the live record is `mine` with `FENCE_SHARE` of its lease left, renewed first by
        its holder's own process when less is; else (False, the live record, None when there
        is none at all)."""
        for _ in range(RACES):
            current = self.latest()
            if current is None or current.holder is None or not mine(current.holder):
                return False, current
            holder, now = current.holder, self.clock()
            if current.expires_at - current.lease_s * FENCE_SHARE > now:
                return True, current
            if not holder.is_this_process():
                return True, current  # shared, not held here: its holder renews it
            if self._write(current, holder, current.lease_s):
                return True, current
        raise LeaseContended(f"{self.storage.uri}: the lease of {self.prefix} keeps changing hands")
