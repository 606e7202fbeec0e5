"""A finished dataset leaves: the last step of a run (its provenance, the Hub when asked, its
one-line outcome), and the same publication as a flow of its own for any dataset."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow
from prefect.states import Completed, Failed, State
from pydantic import BaseModel

from regen.audit import AuditResult
from regen.config import PublishConfig
from regen.display.outcome import done_line
from regen.publish import Published
from regen.run import OpenedDataset, OpenedRun
from tasks.publish import publish, record_provenance


def finish_run(
    run: OpenedRun,
    summary: BaseModel,
    audit: AuditResult,
    tokenizer: str | None,
    target: PublishConfig | None,
    exports: list[str],
) -> State[Any]:
    """A run whose audit passed (or warned): its provenance is recorded, its dataset published
    when `target` says where, and the run ends Completed with its one line as the message (a
    notification sends it as it is). A publish that fails ends the run Failed saying so: the
    dataset is kept whole, and `regen publish` finishes the upload."""
    output = run.config.output
    provenance = record_provenance(run, audit, tokenizer)
    published = None
    if target is not None:
        # No run name: the same dataset makes the same card, and a rerun sends nothing.
        command = f"the regenerate flow's publish parameter (repo {target.repo})"
        sent = publish(
            run.dataset,
            target,
            work_dir=run.work_dir,
            command=command,
            tokenizer=tokenizer,
            facts=provenance.run_facts(),
            return_state=True,
        )
        if not sent.is_completed():
            reason = str(sent.result(raise_on_failure=False)) or sent.message or "failed"
            return Failed(
                message=f"publish failed: {reason}\nThe dataset passed its audit and is kept "
                f"at {output}; publish it with `regen publish {output} {target.repo}`"
            )
        done = sent.result()
        assert isinstance(done, Published)
        published = f"{done.upload.url} (commit {done.upload.commit[:12]})"
    committed = audit.rows - audit.uncommitted
    line = done_line(
        output,
        rows_ok=committed - audit.failed_rows,
        rows_failed=audit.failed_rows,
        verdict=audit.verdict,
        published=published,
        exports=tuple(exports),
    )
    return Completed(message=line, data=summary)


@flow(name="publish", persist_result=False)
def publish_dataset_flow(
    dataset: str,
    target: PublishConfig,
    tokenizer_path: str | None = None,
    allow_failed: bool = False,
    work_dir: str = ".regen",
) -> dict[str, Any]:
    """Publish a finished dataset (a directory or s3:// prefix) to `target`'s Hub repo; its
    files are staged under `work_dir`/publish/."""
    command = f"the publish flow (target {target.repo})"
    done = publish(
        OpenedDataset.open(dataset),
        target,
        work_dir=Path(work_dir),
        command=command,
        tokenizer=tokenizer_path,
        allow_failed=allow_failed,
    )
    return {"url": done.upload.url, "commit": done.upload.commit, "lines": done.lines()}
