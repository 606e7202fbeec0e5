"""The running flow run's name and tags, from its config.

`regenerate_name` names the run from its parameters as it starts (so its logs carry the name);
`label_flow_run` then sets the name again from the resolved config, since the model may come
from a block only the run loads, and adds the tags. Tags already on the run (a deployment's)
are kept.
"""

from __future__ import annotations

from typing import Any

from prefect import get_client
from prefect.context import get_run_context
from prefect.runtime import flow_run as runtime_flow_run

from flows.params import config_parameter
from regen.display.naming import run_name


def regenerate_name() -> str:
    """`flow_run_name=` of `regenerate`: `rehearsal-<model>-<prompts>` or `<node>-...`."""
    params: dict[str, Any] = runtime_flow_run.parameters
    config = config_parameter(params)
    assert config is not None, "regenerate takes a config"
    node = params.get("node")
    name = node.get("name") if isinstance(node, dict) else getattr(node, "name", None)
    return run_name(config, name)


def label_flow_run(name: str, tags: list[str]) -> None:
    """Rename the current flow run and add `tags` to the ones it has.

    A `kind:value` tag replaces the run's tags of the same kind: a deployment's
    `dataset:rehearsal-nightly` is only a default when a run is given another output.
    """
    flow_run = get_run_context().flow_run  # type: ignore[union-attr]
    if flow_run is None:
        return
    kinds = {t.partition(":")[0] for t in tags if ":" in t}
    kept = [t for t in flow_run.tags if t.partition(":")[0] not in kinds or ":" not in t]
    merged = [*kept, *(t for t in tags if t not in kept)]
    with get_client(sync_client=True) as client:
        client.update_flow_run(flow_run.id, name=name, tags=merged)
    flow_run.name, flow_run.tags = name, merged
