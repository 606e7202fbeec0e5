"""A finished dataset leaves: its provenance, its card and its rows, on a Hugging Face Hub repo.

`publish_dataset` refuses a dataset that is not fit to leave (`ready`), brings
`report/provenance.json` up to the audit (`provenance`), stages the repo's files on local disk
(`stage`: Parquet per shard, made again only for shards that changed), writes the card from
the provenance (`card`), then sends the branch what it lacks (`upload`). Run twice on the same
dataset, the second sends nothing. No Prefect here: `tasks/publish.py` and `flows/publish.py`
wrap it, and `regen publish` calls it directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from regen.config import PublishConfig
from regen.config.uris import HubRepoTarget
from regen.dataset import read_run, thinking_mode
from regen.dataset.keys import PROVENANCE_KEY
from regen.display.figures import byte_size
from regen.errors import UserError
from regen.publish.card import make_card
from regen.publish.provenance import Provenance, RunFacts, refresh_provenance
from regen.publish.ready import require_finished
from regen.publish.stage import CARD, Staged, finish_folder, report_keys, stage_rows
from regen.publish.upload import Upload, upload
from regen.storage import Storage

__all__ = ["Published", "default_staging", "publish_dataset"]


@dataclass(frozen=True)
class Published:
    """What a publish did: where, what it sent, and the card it wrote."""

    target: HubRepoTarget
    revision: str
    upload: Upload
    staged: Staged
    provenance: Provenance
    card: str

    def lines(self) -> list[str]:
        """What `regen publish` prints and a flow logs."""
        up, where = self.upload, f"{self.target.uri}@{self.revision}"
        kind = "private" if up.private else "public"
        created = f"created {kind} repo" if up.created else f"{kind} repo"
        rows = ", ".join(f"{c} {n.rows:,} rows" for c, n in self.staged.counts.items())
        head = [f"dataset: {rows}; audit {self.provenance.audit.verdict.upper()}"]
        if up.nothing_new:
            return [
                *head,
                f"nothing new: {where} already holds this dataset at commit {up.commit[:12]} "
                f"({up.unchanged} files unchanged); nothing uploaded",
                f"url: {up.url}",
            ]
        return [
            *head,
            f"published to {where} ({created}): commit {up.commit[:12]}",
            f"uploaded: {len(up.uploaded)} files ({byte_size(up.uploaded_bytes)}), "
            f"{up.unchanged} unchanged, {len(up.deleted)} deleted",
            f"url: {up.url}",
        ]


def default_staging(work_dir: Path, target: HubRepoTarget) -> Path:
    """Where a repo's files are staged unless told: one folder per repo, so a rerun finds
    the files it made."""
    return work_dir / "publish" / target.repo_id.replace("/", "--")


def publish_dataset(
    storage: Storage,
    options: PublishConfig,
    *,
    staging: Path,
    command: str,
    token: str | None = None,
    allow_failed: bool = False,
    tokenizer: str | Path | None = None,
    facts: RunFacts | None = None,
) -> Published:
    """Publish the finished dataset at `storage` as `options` say; `command` is how the card
    says it was published, `token` a Hub token with write access (None: huggingface_hub's
    own, HF_TOKEN or a saved login), `tokenizer` the model directory whose chat template
    renders the tokenized config's turns stored without ids, `facts` the run's own (a run that
    publishes as it ends)."""
    finished = require_finished(storage, allow_failed=allow_failed)
    target = options.target
    provenance = refresh_provenance(
        storage, finished.audit, facts=facts, tokenizer=tokenizer, token=token
    )
    template = None
    if options.tokenized and tokenizer is not None:
        from regen.lossmask import load_template

        template, why = load_template(Path(tokenizer))
        if template is None:
            raise UserError(why)
    staged = stage_rows(
        storage,
        finished.committed,
        staging,
        tokenized=options.tokenized,
        template=template,
        enable_thinking=thinking_mode(read_run(storage)) != "off",
    )
    plots = []
    for key in report_keys(storage):
        staged.add(key, storage.read_bytes(key))
        if key.endswith(".png"):
            plots.append(key)
    staged.add(PROVENANCE_KEY, provenance.to_json())
    license = options.license or provenance.prompts.license
    card = make_card(
        target,
        provenance,
        staged.counts,
        revision=options.revision,
        command=command,
        license=license,
        plots=plots,
    )
    staged.add(CARD, card.encode())
    finish_folder(staged)
    verdict = provenance.audit.verdict.upper()
    sent = upload(
        target,
        staged.folder,
        staged.files,
        revision=options.revision,
        private=options.private,
        token=token,
        message=f"regen publish: {staged.counts['default'].rows:,} rows, audit {verdict}",
    )
    return Published(target, options.revision, sent, staged, provenance, card)
