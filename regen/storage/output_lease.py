"""One run per output: a lease on the dataset root, taken before anything is staged or launched.

Two runs on one output (a second tmux pane, a deployment run beside a CLI run) each generated
every shard, and the second then failed on commits the first had made: the GPU hours of a
whole run thrown away. The lease makes the second run stop at its plan, in one line naming the
holder, before it costs anything.

The lease is a sequence of generation files `lease/run.<n>.json` (keys of
`regen.dataset.keys`), the highest the live record, each made with `Storage.create_exclusive`
(a hard link locally, `If-None-Match: *` on S3), as the multi-node shard claims of
`regen.multinode.claims` are: of two runs racing for generation `n + 1`, exactly one creates
it. Taking, renewing and releasing each create the next generation; older ones are pruned.

A holder is dead, and its lease taken over with a log line, when it released it, when it ran
in this process table (same boot and PID namespace, `regen.machine.owned.this_machine`: a
hostname is not enough, containers share one) and its process (pid and start time) is gone (a
kill -9: no need to wait), or when its heartbeat is older than `lease_s` (another host, another
container, a reboot, or a record too old to say where it ran).
The nodes of a multi-node run share the parent's lease: they `join` it by its run id.

The lease fences every commit: a plan records the run that held the lease as it was made
(`RunPlan.lease_run`), and each shard reads the live record before it commits
(`check_held`); a run whose lease another took over stops there with `LeaseLost`, one line
naming the new holder. The renewal's `lost` alone would not do: it looks every `lease_s / 3`,
and a run that stalled past `lease_s` (a suspended VM, a SIGSTOP) wakes with shards ready to
commit before its next renewal; one listing and one small read per shard cost nothing beside it.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from typing import Any

import psutil

from regen.dataset.keys import LEASE_PREFIX, key_url, lease_key, parse_lease_key
from regen.errors import UserError
from regen.machine.owned import ended_here, this_machine
from regen.machine.ticker import Ticker
from regen.storage import Storage

log = logging.getLogger(__name__)

LEASE_S = 120.0
"""How long a holder on another host may go without a heartbeat before it counts as dead."""


class OutputHeld(UserError):
    """Another run, alive, holds the output."""


class LeaseLost(UserError):
    """This run's lease was taken over (it stalled past `lease_s`, another host took it): the
    run stops before its next commit. Never worth a retry: every commit would meet it."""


@dataclass(frozen=True)
class Holder:
    """Who holds the lease: enough to find the process, and the run in Prefect's UI."""

    run_id: str
    host: str
    pid: int
    pid_started: float
    since: float
    flow_run_id: str | None = None
    machine: str | None = None
    """The process table `pid` is read in (`this_machine`); None in a record written before it
    was kept, whose holder is then judged by its heartbeat alone."""

    @classmethod
    def this_process(cls, run_id: str | None = None, flow_run_id: str | None = None) -> Holder:
        me = psutil.Process()
        return cls(
            run_id=run_id or uuid.uuid4().hex,
            host=socket.gethostname(),
            pid=me.pid,
            pid_started=me.create_time(),
            since=time.time(),
            flow_run_id=flow_run_id,
            machine=this_machine(),
        )

    def describe(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.since))
        run = f", flow run {self.flow_run_id}" if self.flow_run_id else ""
        return f"pid {self.pid} on {self.host} since {since}{run}"

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
    """One generation of the lease; `holder` None is a release."""

    generation: int
    holder: Holder | None
    heartbeat_at: float

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> LeaseRecord:
        raw = json.loads(data)
        holder = raw.get("holder")
        return cls(
            generation=int(raw["generation"]),
            holder=Holder.from_dict(holder) if isinstance(holder, dict) else None,
            heartbeat_at=float(raw["heartbeat_at"]),
        )


def read_lease(storage: Storage) -> LeaseRecord | None:
    """The live (highest) generation, or None if no run ever held the output."""
    keys = [k for k in storage.list(LEASE_PREFIX) if parse_lease_key(k) is not None]
    if not keys:
        return None
    try:
        return LeaseRecord.from_json(storage.read_bytes(keys[-1]))
    except FileNotFoundError:  # pruned by a racer between the listing and the read
        return read_lease(storage)
    except (ValueError, TypeError, KeyError) as err:
        raise UserError(f"{key_url(storage.uri, keys[-1])}: unreadable lease ({err})") from None


def why_dead(record: LeaseRecord, now: float, lease_s: float = LEASE_S) -> str | None:
    """Why the record's holder no longer holds the output, or None while it does."""
    holder = record.holder
    if holder is None:
        return "released"
    if holder.process_gone():
        return f"its process (pid {holder.pid} on {holder.host}) is gone"
    age = now - record.heartbeat_at
    if age > lease_s:
        return f"no heartbeat for {age:.0f} s (lease {lease_s:g} s)"
    return None


def held_line(storage: Storage, holder: Holder, lease_s: float = LEASE_S) -> str:
    """The one line a refused run prints: who holds the output, and how to take it over."""
    return (
        f"{storage.uri}: output held by another run: {holder.describe()}; "
        f"wait for it to end or stop it: a dead holder's lease is taken over by the next run "
        f"(at once where it ran, on {holder.host} in its container; {lease_s:g} s after its "
        "last heartbeat from elsewhere)"
    )


def check_held(storage: Storage, run_id: str, what: str = "not committed") -> None:
    """The fence before a commit: raise `LeaseLost`, one line naming the new holder, unless
    run `run_id` still holds the output's lease (its live record names it). `what` says what
    the caller did not do (`shard 000042 not committed`)."""
    record = read_lease(storage)
    holder = record.holder if record is not None else None
    if holder is not None and holder.run_id == run_id:
        return
    if holder is not None:
        lost = f"output lease lost to {holder.describe()}"
    elif record is not None:
        lost = "output lease released by another run"
    else:
        lost = "output lease gone (its records were removed)"
    raise LeaseLost(f"{storage.uri}: {what}: {lost}; this run stops here, what it committed stays")


class OutputLease:
    """This run's hold on one output: `take` (or `join`), renewed from a thread, `release`."""

    def __init__(
        self,
        storage: Storage,
        holder: Holder,
        *,
        lease_s: float = LEASE_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.storage = storage
        self.holder = holder
        self.lease_s = lease_s
        self.clock = clock
        self.lost: str | None = None
        """Set by a renewal that found another run's record: this run must stop committing."""
        self._joined = False
        self._ticker = Ticker("output-lease", lease_s / 3, self.renew)

    def _create(self, generation: int, holder: Holder | None) -> bool:
        record = LeaseRecord(generation, holder, self.clock())
        created = self.storage.create_exclusive(lease_key(generation), record.to_json())
        if created:
            for key in self.storage.list(LEASE_PREFIX):
                old = parse_lease_key(key)
                if old is not None and old < generation - 1:
                    self.storage.delete(key)
        return created

    def _ours(self, record: LeaseRecord | None) -> bool:
        return (
            record is not None
            and record.holder is not None
            and (record.holder.run_id == self.holder.run_id)
        )

    def take(self) -> str | None:
        """Hold the output, or raise OutputHeld naming the live holder. Returns the line to
        log when a dead holder's lease was taken over, else None."""
        for _ in range(5):  # a racer's generation between our read and create: read again
            current = read_lease(self.storage)
            if self._ours(current):
                return None
            dead = None
            if current is not None:
                dead = why_dead(current, self.clock(), self.lease_s)
                if dead is None:
                    assert current.holder is not None
                    raise OutputHeld(held_line(self.storage, current.holder, self.lease_s))
            generation = 0 if current is None else current.generation + 1
            if self._create(generation, self.holder):
                if current is None or current.holder is None:
                    return None
                return f"took over the lease of {current.holder.describe()}: {dead}"
        raise OutputHeld(f"{self.storage.uri}: the output's lease keeps changing hands; try again")

    def join(self) -> None:
        """A node of a multi-node run: the parent (run id `holder.run_id`) holds the lease."""
        current = read_lease(self.storage)
        if not self._ours(current):
            holder = current.holder if current is not None else None
            if holder is not None:
                raise OutputHeld(held_line(self.storage, holder, self.lease_s))
            gone = "released or never taken"
            raise OutputHeld(f"{self.storage.uri}: the multi-node run's lease is {gone}")
        self._joined = True

    def renew(self) -> None:
        """A heartbeat: the next generation, if the lease is still this run's."""
        if self._joined or self.lost:
            return
        current = read_lease(self.storage)
        if current is None or not self._ours(current):
            holder = current.holder if current is not None else None
            self.lost = f"taken over by {holder.describe()}" if holder else "released by another"
            log.error("output lease lost: %s", self.lost)
            return
        if not self._create(current.generation + 1, self.holder):
            self.renew()  # a racer's generation: read it and judge again

    def release(self) -> None:
        """Give the output up, so the next run need not wait; a no-op if no longer ours."""
        if self._joined:
            return
        current = read_lease(self.storage)
        if current is not None and self._ours(current):
            self._create(current.generation + 1, None)

    @contextmanager
    def renewing(self) -> Iterator[OutputLease]:
        """Renew the taken lease from a thread for the body, release it at the end however
        the body ends (a Ctrl-C included; a kill -9 leaves it to be taken over)."""
        self._ticker.start()
        try:
            yield self
        finally:
            self._ticker.stop()
            try:
                self.release()
            except Exception as err:
                # A full disk fails the release too: it must not hide why the run ended, and a
                # lease left behind is taken over (at once on this host, its pid being gone).
                log.warning("output lease not released: %s", err)


def live_holder(storage: Storage, lease_s: float = LEASE_S) -> Holder | None:
    """The holder of the output if it is alive and not this process, for `regen check`."""
    record = read_lease(storage)
    if record is None or record.holder is None or why_dead(record, time.time(), lease_s):
        return None
    if record.holder.is_this_process():
        return None
    return record.holder
