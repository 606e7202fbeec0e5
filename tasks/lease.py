"""The output's lease in a flow: taken (or, on a node of a multi-node run, joined) before the
plan writes anything, renewed while the run lasts, released at its end; its log lines."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from prefect import get_run_logger
from prefect.context import get_run_context

from regen.run import OpenedRun
from regen.storage.lease import Holder
from regen.storage.output_lease import OutputLease


@contextmanager
def hold_output(run: OpenedRun, parent_run: str | None = None) -> Iterator[OutputLease]:
    """Hold `run`'s output for the body: this flow run's lease, or with `parent_run` (a node
    of a multi-node run) the parent's, which must be live. A held output raises OutputHeld,
    one line naming the holder, before anything is written there."""
    logger = get_run_logger()
    flow_run = get_run_context().flow_run  # type: ignore[union-attr]
    flow_run_id = str(flow_run.id) if flow_run is not None else None
    holder = Holder.this_process(run_id=parent_run or flow_run_id, flow_run_id=flow_run_id)
    lease = OutputLease(run.storage, holder)
    if parent_run is not None:
        lease.join()
        yield lease
        return
    taken = lease.take()
    if taken:
        logger.warning("output %s: %s", run.output, taken)
    with lease.renewing():
        yield lease
