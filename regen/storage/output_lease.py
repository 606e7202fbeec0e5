"""One run per output: a lease on the dataset root, taken before anything is staged or launched.

Two runs on one output (a second tmux pane, a deployment run beside a CLI run) each generated
every shard, and the second then failed on commits the first had made: the GPU hours of a
whole run thrown away. The lease makes the second run stop at its plan, in one line naming the
holder, before it costs anything.

The lease is `regen.storage.lease`'s protocol on the records `lease/run.<n>.json` (keys of
`regen.dataset.keys`), the one the multi-node shard claims use too: taking, renewing and
releasing each create the next generation, of two runs racing exactly one wins, and a holder is
dead when it released it, when its process is gone where it ran (a kill -9: no need to wait;
a hostname is not enough, containers share one), or once its heartbeat is older than its lease
(another host, another container, a reboot, or a record too old to say where it ran). A record
is the run's by its run id; the nodes of a multi-node run share the parent's: they `join` it.

The lease fences every commit: a plan records the run that held the lease as it was made
(`RunPlan.lease_run`), and each shard passes the protocol's fence before it commits
(`check_held`); a run whose lease another took over stops there with `LeaseLost`, one line
naming the new holder. The renewal's `lost` alone would not do: it looks every `lease_s / 3`,
and a run that stalled past `lease_s` (a suspended VM, a SIGSTOP) wakes with shards ready to
commit before its next renewal; one listing and one small read per shard cost nothing beside it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from regen.dataset.keys import LEASE_PREFIX, lease_key, parse_lease_key
from regen.errors import UserError
from regen.machine.ticker import Ticker
from regen.storage import Storage
from regen.storage.lease import (
    FENCE_SHARE,
    GenerationLease,
    Holder,
    LeaseContended,
    LeaseRecord,
    Mine,
)

log = logging.getLogger(__name__)

LEASE_S = 120.0
"""How long a holder on another host may go without a heartbeat before it counts as dead."""


class OutputHeld(UserError):
    """Another run, alive, holds the output."""


class LeaseLost(UserError):
    """This run's lease was taken over (it stalled past `lease_s`, another host took it): the
    run stops before its next commit. Never worth a retry: every commit would meet it."""


def _lease(
    storage: Storage, lease_s: float = LEASE_S, clock: Callable[[], float] = time.time
) -> GenerationLease:
    return GenerationLease(
        storage, LEASE_PREFIX, lease_key, parse_lease_key, lease_s=lease_s, clock=clock
    )


def _run(run_id: str) -> Mine:
    """A record is a run's by its run id (a node of a multi-node run shares its parent's)."""
    return lambda holder: holder.run_id == run_id


def read_lease(storage: Storage) -> LeaseRecord | None:
    """The live (highest) generation, or None if no run ever held the output."""
    return _lease(storage).latest()


def held_line(storage: Storage, holder: Holder, lease_s: float = LEASE_S) -> str:
    """The one line a refused run prints: who holds the output, and how to take it over."""
    return (
        f"{storage.uri}: output held by another run: {holder.describe()}; "
        f"wait for it to end or stop it: a dead holder's lease is taken over by the next run "
        f"(at once where it ran, on {holder.host} in its container; {lease_s:g} s after its "
        "last heartbeat from elsewhere)"
    )


def check_held(storage: Storage, run_id: str, what: str = "not committed") -> None:
    """The fence before a commit (`GenerationLease.fence`): raise `LeaseLost`, one line naming
    the new holder, unless run `run_id` still holds the output's lease. `what` says what the
    caller did not do (`shard 000042 not committed`)."""
    try:
        held, record = _lease(storage).fence(_run(run_id))
    except LeaseContended:  # changed hands while renewing: whose it is now says
        record = read_lease(storage)
        held = record is not None and record.holder is not None and record.holder.run_id == run_id
    if held:
        return
    holder = record.holder if record is not None else None
    if holder is not None and holder.run_id != run_id:
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
        self._lease = _lease(storage, lease_s, clock)
        self._mine = _run(holder.run_id)
        self._joined = False
        self._ticker = Ticker("output-lease", lease_s * FENCE_SHARE, self.renew)

    def take(self) -> str | None:
        """Hold the output, or raise OutputHeld naming the live holder. Returns the line to
        log when a dead holder's lease was taken over, else None."""
        try:
            held, before = self._lease.acquire(self.holder, self._mine)
        except LeaseContended:
            raise OutputHeld(
                f"{self.storage.uri}: the output's lease keeps changing hands; try again"
            ) from None
        holder = before.holder if before is not None else None
        if not held:
            assert holder is not None
            raise OutputHeld(held_line(self.storage, holder, self.lease_s))
        if before is None or holder is None or self._mine(holder):
            return None
        return f"took over the lease of {holder.describe()}: {before.why_dead(self.clock())}"

    def join(self) -> None:
        """A node of a multi-node run: the parent (run id `holder.run_id`) holds the lease."""
        current = self._lease.latest()
        holder = current.holder if current is not None else None
        if holder is None:
            raise OutputHeld(
                f"{self.storage.uri}: the multi-node run's lease is released or never taken"
            )
        if not self._mine(holder):
            raise OutputHeld(held_line(self.storage, holder, self.lease_s))
        self._joined = True

    def renew(self) -> None:
        """A heartbeat: the next generation, if the lease is still this run's."""
        if self._joined or self.lost:
            return
        renewed, current = self._lease.renew(self.holder, self._mine)
        if renewed:
            return
        holder = current.holder if current is not None else None
        self.lost = f"taken over by {holder.describe()}" if holder else "released by another"
        log.error("output lease lost: %s", self.lost)

    def release(self) -> None:
        """Give the output up, so the next run need not wait; a no-op if no longer ours."""
        if not self._joined:
            self._lease.release(self._mine)

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
    record = _lease(storage, lease_s).latest()
    if record is None or record.holder is None or record.why_dead(time.time()):
        return None
    if record.holder.is_this_process():
        return None
    return record.holder
