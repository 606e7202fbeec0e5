"""The run fingerprint: one digest over everything that makes two rows comparable.

Components are kept flat with dotted names (`sampling.max_tokens`), so when an output root
was made by another run the message can name exactly which setting differs. The input is not
one of them: a prompt set may grow or change between runs on one root, and the plan compares
it row by row (`regen.dataset.plan.revise_plan`) instead of refusing it whole.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

# Settings that do not change what a completion looks like, only what is stored beside it:
# a dataset made without token ids can be resumed with them (its older rows keep null ids,
# which every reader of turns handles) instead of being refused or started over.
NOT_FINGERPRINTED = frozenset({"regeneration.token_ids"})
# Settings added after datasets were made, left out while at their default (no mix, seed 0),
# so a config without them keeps the fingerprint those datasets were made with and resumes
# them (rows written before seeds record none); a mix or a seed is a component like any
# other, and a changed one is a different run: another seed draws other tokens.
OMITTED_AT_DEFAULT: dict[str, Any] = {
    "sampling.mix": [],
    "regeneration.thinking_mix": {},
    "sampling.seed": 0,
}


def run_fingerprint(
    *,
    model: dict[str, Any],
    sampling: dict[str, Any],
    regeneration: dict[str, Any],
    shard_size: int,
    chat_template: dict[str, Any],
) -> tuple[str, dict[str, Any]]:
    """(sha256 hex digest, flat components).

    `model` holds the served name, source and revision; `sampling` is
    `SamplingConfig.model_dump()` and `regeneration` is
    `RegenerationConfig.model_dump()`; `chat_template` holds what shapes the prompt and the parsed
    answer (enable_thinking, reasoning parser). `shard_size` is included because it decides
    which ids a shard file holds, and the new ids of a later revision are cut the same way.
    """
    components: dict[str, Any] = {"shard_size": shard_size}
    for section, values in (
        ("model", model),
        ("sampling", sampling),
        ("regeneration", regeneration),
        ("chat_template", chat_template),
    ):
        components.update({f"{section}.{key}": value for key, value in sorted(values.items())})
    for key in NOT_FINGERPRINTED:
        components.pop(key, None)
    for key, default in OMITTED_AT_DEFAULT.items():
        if components.get(key, default) == default:
            components.pop(key, None)
    canonical = json.dumps(components, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest(), components


def changed_components(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """`key=old, this run has new` for each differing component, in a stable order. Both are
    compared as run.json holds them (JSON: a thinking_mix's `True` key is `"true"` there)."""
    old, new = _as_stored(old), _as_stored(new)
    changes = []
    for key in sorted(old.keys() | new.keys()):
        if old.get(key) != new.get(key):
            changes.append(f"{key}={_show(old.get(key))}, this run has {_show(new.get(key))}")
    return changes


def _as_stored(components: dict[str, Any]) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(json.dumps(components, sort_keys=True, default=str))
    return loaded


def _show(value: Any) -> str:
    if isinstance(value, str) and len(value) == 64:
        return value[:12] + "…"
    return "unset" if value is None else str(value)
