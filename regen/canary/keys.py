"""Where the canary's rows and a stopped run's record live under the dataset root.

Kept in one place so the dataset's layout owner can take them over as they are.
"""

from __future__ import annotations

CANARY_PREFIX = "canary/"
# Beside report/audit.json: the first file a person opens after a run stopped.
STOP_KEY = "report/stopped.json"


def canary_key(fingerprint: str) -> str:
    """The canary rows of one run; the fingerprint keeps another config's rows out."""
    return f"{CANARY_PREFIX}canary-{fingerprint}.parquet"


def set_aside_prefix(fingerprint: str, stamp: str) -> str:
    """Where a stop record and its canary go when a rerun overrides them: kept, not deleted."""
    return f"superseded/stopped-{fingerprint[:12]}-{stamp}/"
