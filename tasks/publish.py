"""The dataset's provenance and its publication as Prefect tasks: their log lines and card.

Both wrap `regen.publish`; the token of a publish comes from a Prefect Secret block the
config names (never a parameter, never a log line), else huggingface_hub's own (HF_TOKEN).
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NONE

from regen.audit import AuditResult
from regen.config import PublishConfig
from regen.dataset.keys import PROVENANCE_KEY, key_url
from regen.display.naming import artifact
from regen.publish import Published, default_staging, publish_dataset
from regen.publish.provenance import Provenance, RunFacts, refresh_provenance, run_facts
from regen.run import OpenedDataset, OpenedRun


@task(name="record-provenance", persist_result=False, cache_policy=NONE)
def record_provenance(run: OpenedRun, audit: AuditResult, tokenizer: str | None) -> Provenance:
    """report/provenance.json: the run's engine and chat template beside the dataset's own
    record and its audit, for a trainer's pipeline to check."""
    facts = run_facts(run.config, tokenizer)
    found = refresh_provenance(run.storage, audit, facts=facts, token=run.hf_token)
    engine = found.engine
    get_run_logger().info(
        "provenance: %s (engine %s %s, chat template sha256 %s)",
        key_url(run.storage.uri, PROVENANCE_KEY),
        engine.kind if engine else "?",
        (engine.version if engine else None) or "?",
        found.model.chat_template_sha256 or "not found",
    )
    return found


@task(name="publish", persist_result=False, cache_policy=NONE)
def publish(
    dataset: OpenedDataset,
    options: PublishConfig,
    *,
    work_dir: Path,
    command: str,
    tokenizer: str | None = None,
    facts: RunFacts | None = None,
    allow_failed: bool = False,
) -> Published:
    """Publish the finished dataset to its Hub repo; a rerun sends only what the repo lacks."""
    token = None
    if options.hf_token_secret:
        from prefect.blocks.system import Secret

        # From sync code `load` returns the block (its type also admits a coroutine).
        token = str(cast(Secret, Secret.load(options.hf_token_secret)).get())
    published = publish_dataset(
        dataset.storage,
        options,
        staging=default_staging(work_dir, options.target),
        command=command,
        token=token,
        allow_failed=allow_failed,
        tokenizer=tokenizer,
        facts=facts,
    )
    lines = published.lines()
    for line in lines:
        get_run_logger().info("publish %s", line)
    up = published.upload
    figure = "nothing new" if up.nothing_new else f"{len(up.uploaded)} files sent"
    create_markdown_artifact(
        markdown="\n".join(
            [
                f"**Published** to [{published.target.uri}@{published.revision}]({up.url})",
                "",
                *(f"- {line}" for line in lines),
            ]
        ),
        **artifact("publish", dataset.output, f"{figure} · {published.target.repo_id}"),
    )
    return published
