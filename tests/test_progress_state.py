"""The state a cancelled or crashed run's hook adds to its progress (flows/hooks.py calls
`regen.progress.snapshot.mark_state`): kept beside the last snapshot, at the node's own key."""

from __future__ import annotations

import json
from pathlib import Path

from regen.dataset import progress_key
from regen.progress.snapshot import mark_state
from regen.storage import LocalStorage


def test_the_end_state_joins_the_last_snapshot_at_the_nodes_key(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    storage.write_bytes(progress_key("node-1"), json.dumps({"done": 7}).encode())
    assert mark_state(storage, "Cancelled", "node-1") == progress_key("node-1")
    assert json.loads(storage.read_bytes(progress_key("node-1"))) == {
        "done": 7,
        "state": "Cancelled",
    }
    # A run that crashed before its first snapshot still says so.
    mark_state(storage, "Crashed")
    assert json.loads(storage.read_bytes(progress_key())) == {"state": "Crashed"}
