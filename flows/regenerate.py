"""The run, top to bottom: check, stage, launch, generate, audit, export."""

from __future__ import annotations

from prefect import flow, runtime
from prefect.states import State
from prefect.task_runners import ThreadPoolTaskRunner
from pydantic import BaseModel

from flows import CODE_PACKAGES
from flows.failures import failed_with, generation_failure, quiet_failures, stop_failure
from flows.hooks import reap_fleet_on_exit
from flows.labels import label_flow_run, regenerate_name
from flows.params import open_run
from flows.publish import finish_run
from regen.audit import AuditResult
from regen.config import PublishConfig, RegenConfig
from regen.display.naming import run_name, run_tags
from regen.fleet import Fleet, generate_api_key
from regen.generation.outcome import GenerationSummary
from regen.generation.shard import stops_run
from regen.multinode.loop import shard_source
from regen.multinode.nodes import NodeAssignment
from regen.run import StagedModel
from tasks.audit import audit
from tasks.export import export
from tasks.features import FeaturesSummary, features
from tasks.generate import generate, plan_run
from tasks.lease import hold_output
from tasks.setup import provision, reap_orphans, stage_model, start_fleet


class RunSummary(BaseModel):
    """The flow's result: small enough to read in the UI."""

    output: str
    rows_ok: int
    rows_failed: int
    completion_tokens: int
    tokens_per_s: float
    """The run's average output rate: the figure every artifact of the run quotes."""
    verdict: str
    rows_generated: int = 0
    """Rows this run generated; 0 when an earlier run had committed every one."""
    exports: list[str] = []
    """Where the `export:` section's formats were written (after a passing audit)."""
    features: FeaturesSummary | None = None
    """The `features:` section's hidden states (stage 7, after a passing audit)."""


# Threads only wait on the dispatcher: 32 shards in flight keep up to 32 x shard_size
# prompts queued, more than any node's slots, so the servers never drain between shards.
@flow(
    name="regenerate",
    flow_run_name=regenerate_name,
    # Prefect's typing: TaskRunner's future type parameter is invariant.
    task_runner=ThreadPoolTaskRunner(max_workers=32),  # type: ignore[arg-type]
    on_cancellation=[reap_fleet_on_exit],
    on_crashed=[reap_fleet_on_exit],
    persist_result=False,
)
def regenerate_completions(
    config: RegenConfig,
    fleet_block: str | None = None,
    model_block: str | None = None,
    storage_block: str | None = None,
    api_key_secret: str | None = None,
    node: NodeAssignment | None = None,
    publish: PublishConfig | None = None,
) -> RunSummary | State[None]:
    """Regenerate every prompt's completion with the target model and gate the dataset.

    The `*_block` / `*_secret` parameters name saved Prefect blocks that replace a section of
    `config` (engine, model, output, engine.api_key), so secrets stay out of the parameters.
    With `node` this run is one node of `regenerate_multinode`: it claims shards shared with
    the other nodes and leaves the audit to the parent, which sees the whole dataset.
    With `publish` a run whose audit passes (or warns) publishes its dataset to that Hub repo.
    A failed gate or provisioning check ends the run Failed with the reason as its message,
    one line per failing check, and no traceback (`flows.failures`); the data is kept. So does
    a generation that stopped for a cause no shard gets past (a fleet gone or refusing the key,
    a full disk): one line with the cause, what is committed and how to resume.
    """
    quiet_failures()
    # Every stage below shares this run: its config with the named blocks folded in, and its
    # storage (a storage block's, with its own credentials).
    run = open_run(
        config,
        fleet_block=fleet_block,
        model_block=model_block,
        storage_block=storage_block,
        api_key_secret=api_key_secret,
    )
    config = run.config
    # Which shards this run generates, chosen once: every pending one, or a node's claims.
    source = shard_source(node, flow_run_id=runtime.flow_run.id)
    label_flow_run(run_name(config, source.node), run_tags(config, *filter(None, [source.node])))
    # Servers of a run killed with SIGKILL hold the ports and GPUs that provisioning checks,
    # and a rerun with nothing left to generate launches no fleet: reap them before either.
    reap_orphans(run)
    checked = provision(run, CODE_PACKAGES, source.lease_run, return_state=True)
    if ended := failed_with(checked):
        return ended
    # One run per output: a second run stops here, before the plan writes anything or a model
    # is staged; a node of a multi-node run shares its parent's lease.
    with hold_output(run, source.lease_run):
        # The plan before the model: an output another run made, an input the live gate stops on
        # its rejects and a rerun with nothing left to generate cost no staging (minutes of a
        # rented node for a large model), and launch no fleet.
        plan = plan_run(run)
        api_key = config.engine.api_key or generate_api_key()
        generation = GenerationSummary.empty()
        model: StagedModel | None = None
        if plan.pending and not plan.stopped:
            model = stage_model(run)
            try:
                # A fleet that did not come up: the error its task returned, raised here.
                fleet = start_fleet(run, model, api_key, return_state=True).result()
                assert isinstance(fleet, Fleet), "a launch that failed raised its error"
                with fleet:
                    generation = generate(run, plan, fleet, api_key, model.tokenizer, source)
            except Exception as err:
                # A fleet gone or refusing the key, a full disk: one line, the unstarted shards
                # left pending; a node stops alone and the others take its shards.
                if not stops_run(err):
                    raise
                return generation_failure(run, plan, err, source.node)
        # A node of a multi-node run leaves the audit to its parent, which sees every shard.
        if not source.whole_run:
            return (
                stop_failure(run.storage, generation.stopped)
                if generation.stopped
                else RunSummary(
                    output=config.output,
                    rows_ok=generation.ok,
                    rows_failed=generation.failed,
                    completion_tokens=generation.completion_tokens,
                    tokens_per_s=generation.tokens_per_s,
                    verdict=f"not audited here: node {source.node} of a multi-node run",
                    rows_generated=generation.rows,
                )
            )
        # The staged model's tokenizer; with nothing staged here, a remote model's files.
        tokenizer = model.tokenizer if model else run.tokenizer()
        # A run the live gate stopped is audited too, on every row it generated, and fails
        # naming the gate that stopped it.
        judged = audit(run.dataset, config.audit, tokenizer, return_state=True)
        if ended := failed_with(judged):
            return ended
        report = judged.result()
        assert isinstance(report, AuditResult), "a passed or warned audit returns its result"
        # A failed audit returned above: an unfit dataset is never exported.
        targets = config.export.targets() if config.export else []
        for dest, options in targets:
            export(run.dataset, dest, options, tokenizer)
        # Stage 7 on the same node, the fleet launched again with the capture flags (they
        # turn speculative decoding off, so generation never ran under them).
        captured = None
        if config.features is not None:
            captured = features(run, model or stage_model(run), api_key)
        summary = RunSummary(
            output=config.output,
            rows_ok=report.rows - report.failed_rows,
            rows_failed=report.failed_rows,
            completion_tokens=generation.completion_tokens,
            tokens_per_s=generation.tokens_per_s,
            verdict=report.verdict,
            rows_generated=generation.rows,
            exports=[dest for dest, _ in targets],
            features=captured,
        )
        # Its provenance recorded, published when asked, and the run's one line as the
        # Completed state's message (what a notification sends).
        return finish_run(run, summary, report, tokenizer, publish, summary.exports)
