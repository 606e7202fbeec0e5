"""The run, top to bottom: check, stage, launch, generate, audit."""

from __future__ import annotations

from prefect import flow
from prefect.task_runners import ThreadPoolTaskRunner
from pydantic import BaseModel

from flows.hooks import reap_fleet_on_exit
from regen.config import RegenConfig
from regen.fleet import generate_api_key
from tasks.audit import audit
from tasks.fleet import start_fleet
from tasks.generate import GenerationSummary, generate, plan_run
from tasks.provision import provision
from tasks.stage import stage_model


class RunSummary(BaseModel):
    """The flow's result: small enough to read in the UI."""

    output: str
    rows_ok: int
    rows_failed: int
    completion_tokens: int
    tokens_per_s: float
    verdict: str


# Threads only wait on the dispatcher: 32 shards in flight keep up to 32 x shard_size
# prompts queued, more than any node's slots, so the servers never drain between shards.
@flow(
    name="regenerate",
    task_runner=ThreadPoolTaskRunner(max_workers=32),
    on_cancellation=[reap_fleet_on_exit],
    on_crashed=[reap_fleet_on_exit],
    persist_result=False,
)
def regenerate_completions(config: RegenConfig) -> RunSummary:
    """Regenerate every prompt's completion with the target model and gate the dataset."""
    provision(config)
    model_path = stage_model(config)
    plan = plan_run(config)
    api_key = config.engine.api_key or generate_api_key()
    generation = GenerationSummary.empty()
    if plan.pending:
        with start_fleet(config, model_path, api_key) as fleet:
            generation = generate(config, plan, fleet, api_key)
    report = audit(
        config.output,
        config.audit,
        tokenizer_path=str(config.model.tokenizer_path or model_path),
    )
    return RunSummary(
        output=config.output,
        rows_ok=report.rows_ok,
        rows_failed=report.rows_failed,
        completion_tokens=generation.completion_tokens,
        tokens_per_s=generation.tokens_per_s,
        verdict=report.verdict,
    )
