"""Stage 7 alone, `regen features`: the target's hidden states over a dataset regen wrote.

The same config as the run (the fleet, the model, the output), the `features:` section
saying which layers: check the dataset is there, hold its lease, stage the model, launch
the fleet with the capture flags and capture what is left. A run whose config has the
section ends with the same stage (flows/regenerate.py).
"""

from __future__ import annotations

from prefect import flow
from prefect.task_runners import ThreadPoolTaskRunner

from flows.failures import quiet_failures
from flows.hooks import reap_fleet_on_exit
from flows.params import open_run
from regen.config import RegenConfig
from regen.dataset.reader import read_committed, require_dataset
from regen.errors import ConfigError
from regen.fleet import generate_api_key
from tasks.features import FeaturesSummary, features
from tasks.lease import hold_output
from tasks.setup import reap_orphans, stage_model


@flow(
    name="features",
    task_runner=ThreadPoolTaskRunner(max_workers=16),  # type: ignore[arg-type]
    on_cancellation=[reap_fleet_on_exit],
    on_crashed=[reap_fleet_on_exit],
    persist_result=False,
)
def capture_features(
    config: RegenConfig,
    fleet_block: str | None = None,
    model_block: str | None = None,
    storage_block: str | None = None,
    api_key_secret: str | None = None,
) -> FeaturesSummary:
    """Capture the `features:` section's hidden states for every committed shard of the
    config's output that has none yet; rerun it to resume."""
    quiet_failures()
    run = open_run(
        config, fleet_block=fleet_block, model_block=model_block, storage_block=storage_block,
        api_key_secret=api_key_secret,
    )  # fmt: skip
    if run.config.features is None:
        raise ConfigError("regen features needs a features: section in the config")
    require_dataset(run.storage, read_committed(run.storage))
    reap_orphans(run)
    with hold_output(run):
        model = stage_model(run)
        return features(run, model, run.config.engine.api_key or generate_api_key())
