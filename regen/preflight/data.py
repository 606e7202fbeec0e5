"""The data's checks: the output storage writable and readable, the prompts' first rows usable."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from regen.config import RegenConfig
from regen.display.figures import byte_size
from regen.errors import UserError
from regen.preflight.report import CheckRow

if TYPE_CHECKING:
    from regen.storage import Storage


def check_storage(
    config: RegenConfig,
    open_output: Callable[[], Storage] | None = None,
    lease_run: str | None = None,
) -> CheckRow:
    """`open_output`: the run's own opening of its output, so the run opens it once;
    `lease_run`: the run whose lease on the output this one shares (a node of a multi-node
    run), not another run."""
    from regen.storage import honours_exclusive, open_storage, probe
    from regen.storage.output_lease import held_line, live_holder

    storage = open_output() if open_output else open_storage(config.output)
    probe(storage)
    if not honours_exclusive(storage):
        return CheckRow(
            name="storage",
            status="fail",
            figure=f"{storage.uri}: {IGNORES_IF_NONE_MATCH}",
            hint="use a store that honours If-None-Match: * on PUT (AWS S3 does), or a local disk",
        )
    holder = live_holder(storage)
    if holder is not None and holder.run_id != lease_run:
        # Another run is writing there now: this one would be refused at its plan.
        return CheckRow(
            name="storage",
            status="fail",
            figure=held_line(storage, holder),
            hint="one run per output",
        )
    made_by = _other_run(config, storage)
    if made_by is not None and not config.generation.new_output:
        return CheckRow(
            name="storage",
            status="fail",
            figure=made_by,
            hint="use a new output, or generation.new_output: true to start over there",
        )
    space, status = _space(config, storage)
    figure = f"{storage.uri} writable and readable{space}"
    if status == "fail":
        return CheckRow(name="storage", status="fail", figure=figure, hint=_SPACE_HINT)
    if made_by is not None:
        return CheckRow(
            name="storage",
            status="warn",
            figure=f"{made_by}; generation.new_output moves it under superseded/{space}",
            hint="a fresh dataset starts here",
        )
    if status == "warn":
        return CheckRow(name="storage", status="warn", figure=figure, hint=_SPACE_HINT)
    return CheckRow(name="storage", status="pass", figure=figure)


IGNORES_IF_NONE_MATCH = (
    "the store ignores conditional writes (a second PUT of one key with If-None-Match: * "
    "overwrote the first), so two runs could both take the output's lease and two nodes one shard"
)

TOOL_PARSER_HINT = (
    "set engine.tool_call_parser, SGLang's --tool-call-parser (qwen25 for Qwen3, hermes, "
    "qwen3_coder, ...; with engine.kind external, the one its servers were started with)"
)

_SPACE_HINT = "free space under the output, or write it to a bigger disk: a full disk stops the run"


def _space(config: RegenConfig, storage: Storage) -> tuple[str, str]:
    """(`, 12.3 GB free, the run still writes about ...`, status) for a local output: a full
    disk stops a run, so the row says what is left and what the rest of the run needs. S3
    has no free space to read: the row says so and judges nothing."""
    from regen.preflight.space import estimate_output, free_bytes, judge_space
    from regen.storage import LocalStorage

    if not isinstance(storage, LocalStorage):
        return ", free space not checked (object storage has none to read)", "pass"
    free = free_bytes(storage.root)
    estimate = estimate_output(config, storage)
    needs = estimate.describe() if estimate else "output size not estimated: prompts not local"
    return f", {byte_size(free)} free; {needs}", judge_space(free, estimate)


def _other_run(config: RegenConfig, storage: Storage) -> str | None:
    """What the output's run.json says that this run would be refused for, after staging,
    by the plan's `open_run`; None when there is no run.json or it is this run's."""
    from regen.dataset import config_fingerprint, read_run
    from regen.dataset.runinfo import has_committed
    from regen.fingerprint import changed_components
    from regen.rehearsal import is_rehearsal_model

    run = read_run(storage)
    if not run.get("fingerprint"):
        return None
    digest, components = config_fingerprint(config)
    if run["fingerprint"] == digest or not has_committed(storage):
        return None  # this run's, or a run's that committed nothing: the plan takes it over
    old = run.get("components")
    changes = changed_components(old if isinstance(old, dict) else {}, components)
    made_with = f"run.json was made with {'; '.join(changes[:3]) or 'another run'}"
    model = run.get("model")
    source = model.get("source") if isinstance(model, dict) else None
    if (
        isinstance(source, str)
        and is_rehearsal_model(source)
        and not is_rehearsal_model(config.model.source)
    ):
        # First, before the long paths a table cuts: the one fact the user must see.
        return f"{storage.uri}: holds a rehearsal's dataset, made on emulators ({made_with})"
    return f"{storage.uri}: {made_with}"


def check_prompt_source(config: RegenConfig, hf_token: str | None = None) -> CheckRow:
    """A Hub prompt set: its revision resolved to a commit and the files its split selects,
    with their sizes; only the dataset card is downloaded (the prompts row then reads the
    first file)."""
    from regen.prompts.hub import resolve

    try:
        found = resolve(
            config.prompts, split=config.input.split, subset=config.input.subset, token=hf_token
        )
    except UserError as err:
        return CheckRow(
            name="prompt source", status="fail", figure=str(err), hint="fix prompts or input.*"
        )
    shown = ", ".join(f"{f.path} ({_size(f.size)})" for f in found.files[:3])
    more = f" and {len(found.files) - 3} more" if len(found.files) > 3 else ""
    figure = (
        f"{found.uri.repo} at commit {found.commit}: {found.chosen_by}, {len(found.files)} "
        f"files, {_size(found.total_bytes)}: {shown}{more}"
    )
    return CheckRow(name="prompt source", status="pass", figure=figure)


def _size(size: int | None) -> str:
    return "size unknown" if size is None else byte_size(size)


def check_prompts(
    config: RegenConfig, sample_rows: int = 1000, hf_token: str | None = None
) -> CheckRow:
    """A sample's figure (head, middle and tail of the file), with the valid rows per format:
    rows describe themselves, so a file may mix formats, and the count says whether that was
    meant. A sample rejected over `audit.rejects.fail` says the run would stop on it."""
    from regen.prompts import format_counts, preview, read_options

    try:
        found = preview(config.prompts, sample_rows, options=read_options(config.input, hf_token))
    except UserError as err:
        return CheckRow(name="prompts", status="fail", figure=str(err), hint="fix the prompts file")
    counts = format_counts(found.formats)
    figure = f"{found.valid} of {found.rows_checked} rows valid ({counts}; {found.sampled})"
    if found.valid == 0:
        reason = f"{config.prompts}: {found.first_reason}"
        return CheckRow(name="prompts", status="fail", figure=reason, hint="fix the prompts file")
    if found.with_tools and not config.engine.tool_call_parser:
        # Without a parser SGLang leaves every call as text in the answer: no tool_calls, no
        # finish_reason tool_calls, and a tool conversation's later turns never run.
        return CheckRow(
            name="prompts",
            status="fail",
            figure=f"{figure}; {found.with_tools} have tools and engine.tool_call_parser is "
            "not set: the servers would leave every call as text in the answer",
            hint=TOOL_PARSER_HINT,
        )
    if found.rejected:
        figure = f"{figure}; first: {found.first_reason}"
        share, limit = found.rejected / found.rows_checked, config.audit.rejects.fail
        hint = "rejected rows go to rejects/"
        if share >= limit:
            hint += f"; over audit.rejects.fail ({limit:.1%}) the run stops before generating"
        return CheckRow(name="prompts", status="warn", figure=figure, hint=hint)
    return CheckRow(name="prompts", status="pass", figure=figure)
