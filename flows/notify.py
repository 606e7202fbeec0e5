"""Telling the people who wait on a run, the Prefect way: automations on the server that
send a run's one line to a notification block the user names (Slack, a webhook, email...).

Every notice is a trigger on the flow run's own state event, so it needs nothing of the run
but its end, and a crash (the process killed, the node gone) is told too:

- done: `Completed` with the message a whole run ends with (`regen.display.outcome.DONE`:
  rows committed, verdict, where it went); a node of a multi-node run, which ends with none,
  is its parent's to tell;
- stopped: `Failed` by the live gate (`FAIL: canary gate stopped the run …`), with the rows
  kept and what to do;
- failed: any other `Failed` (a final audit, provisioning, a dead fleet, a failed publish);
- crashed: `Crashed`, with where the committed shards are and how to resume.

Prefect renders each body on the server from the state event (Jinja, its sandbox): the first
line of the state's message and its last (`The data was kept: N committed rows at …`). A
deployment's own `triggers:` in prefect.yaml can only run deployments, so the automations are
made here, by `regen notify setup`, scoped to regen's flows (or to named deployments) and
named for the block, so a second setup replaces them rather than adding more.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING
from uuid import UUID

from regen.display.outcome import DONE
from regen.errors import UsageError

if TYPE_CHECKING:
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.events.schemas.automations import AutomationCore

FLOWS = ("regenerate", "regenerate-multinode")
"""The flows whose runs are told by default: a run, whole or on several nodes."""
STOPPED = "FAIL: * gate stopped the run*"
"""How a live gate's stop begins its Failed message (`regen.canary.stop.StopRecord.headline`
after `AuditResult.failure_message`'s `FAIL: `), as the Hub's state-message label is matched:
a glob."""

_LINES = "{%- set said = (flow_run.state.message or '').strip().splitlines() -%}"
_KEPT = "{% if said|length > 1 %} {{ said[-1] }}.{% endif %}"
_OUTPUT = "{%- set out = (flow_run.parameters.get('config') or {}).get('output') -%}"


@dataclass(frozen=True)
class Notice:
    """One automation: the state event it fires on, the state messages it takes, and what
    it sends."""

    key: str
    state: str
    message: str | None
    subject: str
    body: str


_STOPPED_BODY = (
    _LINES
    + "{{ flow_run.name }}: {{ said[0] | replace('FAIL: ', '', 1) }}."
    + _KEPT
    + " Fix the cause (the report names the rows), then rerun with generation.new_output:"
    " true; rerun unchanged, it is refused."
)
_FAILED_BODY = (
    _LINES
    + "{{ flow_run.name }} failed: {{ said[0] }}"
    + _KEPT
    + " Fix the cause and run it again: committed shards are kept and never generated twice."
)
_CRASHED_BODY = (
    _OUTPUT
    + "{{ flow_run.name }} crashed: {{ flow_run.state.message }}"
    + "{% if out %} The shards committed before it are kept in {{ out }} (`regen status"
    " {{ out }}` counts them); run it again to resume.{% else %} Its committed shards are"
    " kept; run it again to resume.{% endif %}"
)

NOTICES = (
    Notice(
        key="done",
        state="Completed",
        message=f"{DONE}*",
        subject="regen: {{ flow_run.name }} done",
        body="{{ flow_run.name }}: {{ flow_run.state.message }}",
    ),
    Notice(
        key="stopped",
        state="Failed",
        message=STOPPED,
        subject="regen: {{ flow_run.name }} stopped by the live gate",
        body=_STOPPED_BODY,
    ),
    Notice(
        key="failed",
        state="Failed",
        message=f"!{STOPPED}",
        subject="regen: {{ flow_run.name }} failed",
        body=_FAILED_BODY,
    ),
    Notice(
        key="crashed",
        state="Crashed",
        message=None,
        subject="regen: {{ flow_run.name }} crashed",
        body=_CRASHED_BODY,
    ),
)


def automation_name(notice: Notice, block: str) -> str:
    return f"regen: run {notice.key} -> {block}"


def automations(
    block_id: UUID, block: str, scope: dict[str, str | list[str]]
) -> list[AutomationCore]:
    """The automations of every notice, sending to the block `block_id` (named `block`),
    for the flow runs related to `scope` (a related-resource specification)."""
    from prefect.events.actions import SendNotification
    from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture

    made = []
    for notice in NOTICES:
        match: dict[str, str | list[str]] = {"prefect.resource.id": "prefect.flow-run.*"}
        if notice.message is not None:
            match["prefect.state-message"] = notice.message
        trigger = EventTrigger(
            expect={f"prefect.flow-run.{notice.state}"},
            match=match,
            match_related=scope,
            posture=Posture.Reactive,
            threshold=1,
        )
        action = SendNotification(
            block_document_id=block_id, subject=notice.subject, body=notice.body
        )
        made.append(
            AutomationCore(
                name=automation_name(notice, block),
                description=f"regen: a run {notice.key} ({notice.state}), told through {block}",
                enabled=True,
                trigger=trigger,
                actions=[action],
            )
        )
    return made


def notification_block(client: SyncPrefectClient, name: str) -> tuple[UUID, str]:
    """The id and `slug/name` of the notification block `name` names (`NAME`, or `SLUG/NAME`
    when several block types have one of that name)."""
    slug, _, bare = name.rpartition("/")
    found = [
        doc
        for doc in client.read_block_documents(include_secrets=False)
        if doc.name == bare and (not slug or (doc.block_type and doc.block_type.slug == slug))
    ]
    if not found:
        raise UsageError(
            f"no block named {name}: create the notification block first (Slack webhook, "
            "custom webhook, email... in the UI's Blocks page, or its class's .save(NAME))"
        )
    if len(found) > 1:
        kinds = ", ".join(f"{d.block_type.slug}/{bare}" for d in found if d.block_type)
        raise UsageError(f"several blocks are named {bare}: name one as {kinds}")
    doc = found[0]
    capabilities = doc.block_schema.capabilities if doc.block_schema else []
    kind = doc.block_type.slug if doc.block_type else "?"
    if "notify" not in capabilities:
        raise UsageError(f"block {kind}/{bare} cannot send notifications (it is not one)")
    return doc.id, f"{kind}/{bare}"


def scope_of(client: SyncPrefectClient, deployments: list[str]) -> dict[str, str | list[str]]:
    """The flow runs told: of regen's flows, or of the named deployments (`FLOW/NAME`)."""
    if not deployments:
        return {"prefect.resource.role": "flow", "prefect.resource.name": list(FLOWS)}
    from prefect.exceptions import ObjectNotFound

    ids = []
    for name in deployments:
        try:
            ids.append(f"prefect.deployment.{client.read_deployment_by_name(name).id}")
        except ObjectNotFound:
            raise UsageError(
                f"no deployment {name} (FLOW/NAME, as `prefect deploy` made it)"
            ) from None
    return {"prefect.resource.role": "deployment", "prefect.resource.id": ids}


def setup_notifications(block: str, deployments: list[str]) -> list[tuple[str, UUID]]:
    """Create (or replace) the automations that tell `block` how regen's runs end; their
    names and ids."""
    from prefect.client.orchestration import get_client

    made = []
    with get_client(sync_client=True) as client:
        block_id, named = notification_block(client, block)
        for automation in automations(block_id, named, scope_of(client, deployments)):
            for old in client.read_automations_by_name(automation.name):
                client.delete_automation(old.id)
            made.append((automation.name, client.create_automation(automation)))
    return made
