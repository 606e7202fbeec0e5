"""One card per report per run: a report written twice in a run (the dataset card, by the plan
and again by the audit) rewrites its card instead of adding a second one of the same title."""

from __future__ import annotations

from uuid import UUID

from prefect import get_client
from prefect.artifacts import create_markdown_artifact
from prefect.client.schemas.actions import ArtifactUpdate
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    ArtifactFilterKey,
)
from prefect.runtime import flow_run

from regen.display.naming import artifact


def publish_markdown(kind: str, output: str, markdown: str, description: str) -> None:
    """The `kind` card of `output` in this flow run: created, or rewritten where this run
    made one already (the card keeps its place on the run page)."""
    named = artifact(kind, output, description)
    run_id = flow_run.id
    if run_id is not None:
        with get_client(sync_client=True) as client:
            found = client.read_artifacts(
                artifact_filter=ArtifactFilter(
                    key=ArtifactFilterKey(any_=[named["key"]]),
                    flow_run_id=ArtifactFilterFlowRunId(any_=[UUID(run_id)]),
                )
            )
            if found:
                update = ArtifactUpdate(data=markdown, description=named["description"])
                client.update_artifact(found[-1].id, update)
                return
    create_markdown_artifact(markdown=markdown, **named)
