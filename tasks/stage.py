"""Stage 2 as a Prefect task: the model copied to the RAM disk, verified, idempotent."""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task

from regen.config import RegenConfig
from regen.staging import stage_model as stage


@task(name="stage-model", retries=2, retry_delay_seconds=10, persist_result=False)
def stage_model(config: RegenConfig, hf_token: str | None = None) -> Path:
    """The directory the servers load from; a second staging of the same source is a no-op."""
    logger = get_run_logger()
    if not config.model.stage:
        logger.info("model.stage is false: servers load %s directly", config.model.source)
        return Path(config.model.source)
    result = stage(
        config.model.source,
        config.model.staged_path(),
        revision=config.model.revision,
        hf_token=hf_token,
    )
    if result.skipped:
        logger.info("model already staged at %s (%d files)", result.path, result.files)
    else:
        logger.info(
            "staged %d files, %.1f GB in %.1f s to %s",
            result.files,
            result.bytes / 1e9,
            result.seconds,
            result.path,
        )
    return Path(result.path)
