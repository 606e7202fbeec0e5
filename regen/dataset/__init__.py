"""The one owner of a dataset root's layout: keys, manifests, run.json, the plan, the commit
protocol, the prompt cache and the reader everyone uses (`read_committed`).

Nothing outside this package builds or parses a key of the layout or lists data files.
"""

from regen.dataset.commit import commit_shard, error_rows, replace_shard
from regen.dataset.keys import (
    CLAIMS_PREFIX,
    NODES_PREFIX,
    PLAN_KEY,
    REJECTS_KEY,
    RUN_KEY,
    SHARDS_PREFIX,
    SUPERSEDED_PREFIX,
    claim_key,
    claim_prefix,
    data_key,
    heartbeat_key,
    manifest_key,
    parse_claim_key,
    parse_data_key,
    parse_manifest_key,
    progress_key,
)
from regen.dataset.manifest import (
    Census,
    Manifest,
    committed_shards,
    manifested_shards,
    read_manifest,
    read_shard,
    take_census,
)
from regen.dataset.plan import ShardPlan, parse_shard_range, pending_shards, plan_shards, read_plan
from regen.dataset.prompt_cache import cache_prompts, prompts_for_shard
from regen.dataset.reader import Committed, read_committed, require_dataset, scan_data
from regen.dataset.runinfo import (
    RunInfo,
    new_run_info,
    open_run,
    read_run,
    run_fingerprint_of,
    supersede,
    thinking_mode,
)

__all__ = [
    "CLAIMS_PREFIX",
    "NODES_PREFIX",
    "PLAN_KEY",
    "REJECTS_KEY",
    "RUN_KEY",
    "SHARDS_PREFIX",
    "SUPERSEDED_PREFIX",
    "Census",
    "Committed",
    "Manifest",
    "RunInfo",
    "ShardPlan",
    "cache_prompts",
    "claim_key",
    "claim_prefix",
    "commit_shard",
    "committed_shards",
    "data_key",
    "error_rows",
    "heartbeat_key",
    "manifest_key",
    "manifested_shards",
    "new_run_info",
    "open_run",
    "parse_claim_key",
    "parse_data_key",
    "parse_manifest_key",
    "parse_shard_range",
    "pending_shards",
    "plan_shards",
    "progress_key",
    "prompts_for_shard",
    "read_committed",
    "read_manifest",
    "read_plan",
    "read_run",
    "read_shard",
    "replace_shard",
    "require_dataset",
    "run_fingerprint_of",
    "scan_data",
    "supersede",
    "take_census",
    "thinking_mode",
]
