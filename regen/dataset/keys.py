"""Every key of a dataset root, built and parsed here and nowhere else.

A root holds `run.json` and `plan.parquet` (what the run is), `rejects/`, `progress.json`,
`shards/shard-NNNNNN.json` (a shard's manifest, its commit mark) and its data
`shards/shard-NNNNNN[.gG].parquet` (generation G >= 2 after a replace), `claims/` and
`nodes/` (a multi-node run's leases and heartbeats), `lease/` (the one run that holds the
root, `regen.storage.output_lease`), `superseded/<fingerprint>/` (an older
run moved aside), `audit/` (each shard's audit summary), `canary/` (the canary's rows) and
`report/` (the audit report; `report/stopped.json` when the live gate stopped the run;
`report/provenance.json`, how the dataset was made) and
`features/` (the target's hidden states: `features.json` what they are, a manifest
`shards/shard-NNNNNN.json` per dataset shard, written last, and its samples' files under
`samples/shard-NNNNNN/`, apart so that finding the manifests lists no sample).
Shard numbers are zero-padded to six digits and grow past them, so every pattern takes six
or more; one regex per kind of key keeps writers and readers agreeing.
"""

from __future__ import annotations

import re

RUN_KEY = "run.json"
PLAN_KEY = "plan.parquet"
REJECTS_KEY = "rejects/rejects.parquet"
SHARDS_PREFIX = "shards/"
SUPERSEDED_PREFIX = "superseded/"
CLAIMS_PREFIX = "claims/"
NODES_PREFIX = "nodes/"
LEASE_PREFIX = "lease/"
"""The output's lease: which run holds the root. Never moved aside with a superseded run."""
CANARY_PREFIX = "canary/"
AUDIT_PREFIX = "audit/"
REPORT_PREFIX = "report/"
AUDIT_REPORT_KEY = f"{REPORT_PREFIX}audit.json"
"""The last audit's result: what the gate read and the export checks before it writes."""
AUDIT_MARKDOWN_KEY = f"{REPORT_PREFIX}audit.md"
FLEET_KEY = f"{REPORT_PREFIX}fleet.json"
"""The fleet that made the dataset, beside the audit's report."""
# Beside report/audit.json: the first file a person opens after a run stopped.
STOP_KEY = f"{REPORT_PREFIX}stopped.json"
PROVENANCE_KEY = f"{REPORT_PREFIX}provenance.json"
"""How the dataset was made, in one machine-readable file (`regen.publish.provenance`): what a
published card shows, for a trainer's pipeline to check."""
_PROGRESS = "progress.json"
FEATURES_PREFIX = "features/"
FEATURES_RECORD_KEY = f"{FEATURES_PREFIX}features.json"
"""What the feature shards under the same root hold: layers, dtype, samples, model."""
FEATURES_PROGRESS_KEY = f"{FEATURES_PREFIX}progress.json"
FEATURE_MANIFESTS_PREFIX = f"{FEATURES_PREFIX}shards/"

_MANIFEST = re.compile(r"^shards/shard-(\d{6,})\.json$")
_DATA = re.compile(r"^shards/shard-(\d{6,})(?:\.g(\d+))?\.parquet$")
_CLAIM = re.compile(r"^claims/shard-(\d{6,})\.(\d{9,})\.json$")
_LEASE = re.compile(r"^lease/run\.(\d{9,})\.json$")
_NODE_PROGRESS = re.compile(r"^nodes/(.+)\.progress\.json$")
_FEATURE_MANIFEST = re.compile(r"^features/shards/shard-(\d{6,})\.json$")


def key_url(root: str, key: str) -> str:
    """Where a key of the root at `root` (a path or URL) is, for a person to open."""
    return f"{root.rstrip('/')}/{key}"


def manifest_key(shard: int) -> str:
    return f"{SHARDS_PREFIX}shard-{shard:06d}.json"


def data_key(shard: int, generation: int = 1) -> str:
    suffix = "" if generation == 1 else f".g{generation}"
    return f"{SHARDS_PREFIX}shard-{shard:06d}{suffix}.parquet"


def shard_prefix(shard: int) -> str:
    """Lists one shard's manifest and every generation of its data (the dot ends the number)."""
    return f"{SHARDS_PREFIX}shard-{shard:06d}."


def parse_manifest_key(key: str) -> int | None:
    """The shard of a manifest key, or None for any other key."""
    match = _MANIFEST.match(key)
    return int(match.group(1)) if match else None


def parse_data_key(key: str) -> tuple[int, int] | None:
    """(shard, generation) of a data key, or None for any other key."""
    match = _DATA.match(key)
    return (int(match.group(1)), int(match.group(2) or 1)) if match else None


def claim_prefix(shard: int) -> str:
    return f"{CLAIMS_PREFIX}shard-{shard:06d}."


def claim_key(shard: int, generation: int) -> str:
    # Zero-padded so the sorted listing is in generation order too.
    return f"{claim_prefix(shard)}{generation:09d}.json"


def parse_claim_key(key: str) -> tuple[int, int] | None:
    """(shard, generation) of a claim key, or None for any other key."""
    match = _CLAIM.match(key)
    return (int(match.group(1)), int(match.group(2))) if match else None


def lease_key(generation: int) -> str:
    # Zero-padded, as a claim's: the sorted listing is in generation order.
    return f"{LEASE_PREFIX}run.{generation:09d}.json"


def parse_lease_key(key: str) -> int | None:
    """The generation of an output lease key, or None for any other key."""
    match = _LEASE.match(key)
    return int(match.group(1)) if match else None


def heartbeat_key(node: str) -> str:
    return f"{NODES_PREFIX}{node}.json"


def progress_key(node: str | None = None) -> str:
    """Where a run's progress is written; each node of a multi-node run has its own."""
    return f"{NODES_PREFIX}{node}.{_PROGRESS}" if node else _PROGRESS


def parse_progress_key(key: str) -> str | None:
    """The node of a multi-node run's progress key, or None for any other key."""
    match = _NODE_PROGRESS.match(key)
    return match.group(1) if match else None


def superseded_prefix(fingerprint: str) -> str:
    return f"{SUPERSEDED_PREFIX}{fingerprint}/"


def summary_key(shard: int, settings: str) -> str:
    """`audit/shard-000042.<settings>.json`: a shard's audit summary, keyed by the settings
    that made it; outside `shards/`, where every `.json` is a manifest."""
    return f"{AUDIT_PREFIX}shard-{shard:06d}.{settings}.json"


def report_figure_key(name: str) -> str:
    """One of the audit's plots: `report/lengths.png`."""
    return f"{REPORT_PREFIX}{name}.png"


def canary_key(fingerprint: str) -> str:
    """The canary rows of one run; the fingerprint keeps another config's rows out."""
    return f"{CANARY_PREFIX}canary-{fingerprint}.parquet"


def set_aside_prefix(fingerprint: str, stamp: str) -> str:
    """Where a stop record and its canary go when a rerun overrides them: kept, not deleted."""
    return f"{SUPERSEDED_PREFIX}stopped-{fingerprint[:12]}-{stamp}/"


def feature_manifest_key(shard: int) -> str:
    """A feature shard's commit mark, written after every sample file it names."""
    return f"{FEATURE_MANIFESTS_PREFIX}shard-{shard:06d}.json"


def feature_sample_key(shard: int, index: int) -> str:
    """The file of the shard's `index`-th sample (in the dataset shard's sample order)."""
    return f"{FEATURES_PREFIX}samples/shard-{shard:06d}/{index:06d}.safetensors"


def parse_feature_manifest_key(key: str) -> int | None:
    """The shard of a feature manifest key, or None for any other key."""
    match = _FEATURE_MANIFEST.match(key)
    return int(match.group(1)) if match else None
