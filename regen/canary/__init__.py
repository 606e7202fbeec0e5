"""The canary and the stop policy: a run that has gone bad stops after a sample, not at the end.

- `sample`: which prompts go first (a deterministic stride over every pending shard);
- `store`: where their rows wait (one Parquet object per fingerprint) until their shards are
  generated, so each row is sent once and committed once, in its own shard;
- `stop`: the record a stopped run leaves and the refusal of an unchanged rerun.

The gate itself (which checks fail) belongs to `regen.audit`; this package only sends,
keeps and records.
"""

from regen.canary.sample import canary_sample
from regen.canary.stop import (
    RunStopped,
    StopRecord,
    check_not_stopped,
    stopped_run,
    write_stop_record,
)
from regen.canary.store import (
    CanaryFirst,
    CanaryStopped,
    HeldForCanary,
    PendingCanary,
    Verdict,
    merge_shard,
    read_canary,
    send_canary,
    split_shard,
)
from regen.dataset.keys import STOP_KEY, canary_key

__all__ = [
    "STOP_KEY",
    "CanaryFirst",
    "CanaryStopped",
    "HeldForCanary",
    "PendingCanary",
    "RunStopped",
    "StopRecord",
    "Verdict",
    "canary_key",
    "canary_sample",
    "check_not_stopped",
    "merge_shard",
    "read_canary",
    "send_canary",
    "split_shard",
    "stopped_run",
    "write_stop_record",
]
