"""`run_audit`: read the committed dataset once, run every check, return the verdict."""

from __future__ import annotations

from pathlib import Path

from regen.audit.completeness import completeness_check, error_rows_check
from regen.audit.dataset import (
    answer_snippets,
    open_dataset,
    per_turn,
    scan_rows,
    thinking_enabled,
)
from regen.audit.dataset import thinking_requested as run_thinking
from regen.audit.features import collect_features
from regen.audit.lengths import histograms, length_columns, quantiles, tiny_length_check
from regen.audit.loss_mask import (
    load_model_template,
    loss_mask_check,
    measure_loss_mask,
    stored_ids,
)
from regen.audit.quality import (
    answer_collapse_check,
    completions,
    empty_answer_check,
    empty_thinking_check,
    repetition_check,
    think_leak_check,
    truncation_checks,
)
from regen.audit.result import AuditResult, verdict_of
from regen.audit.servers import server_breakdown, server_check, server_rates
from regen.audit.template_parity import template_parity_check
from regen.audit.thresholds import AuditConfig
from regen.storage import Storage


def run_audit(
    storage: Storage,
    config: AuditConfig,
    *,
    thinking_requested: bool | None = None,
    tokenizer_path: Path | str | None = None,
) -> AuditResult:
    """Audit the committed shards under `storage`; nothing is written (see `write_report`).

    `thinking_requested` defaults to run.json's `regeneration.thinking` being `save`.
    `tokenizer_path` is the model directory (or its tokenizer.json) whose chat template
    rebuilds the loss mask of turns stored without token ids and is checked against the
    stored prompts; without it and without ids, those checks are `skipped`, never passed.
    """
    view = open_dataset(storage)
    thinking = run_thinking(storage) if thinking_requested is None else thinking_requested
    path = Path(tokenizer_path) if tokenizer_path else None
    model = load_model_template(path, enable_thinking=thinking_enabled(storage))
    conversations = scan_rows(storage, view)
    stored = stored_ids(conversations)
    features = collect_features(conversations, config)
    # Completeness and errors count conversations; the answer checks count every turn. The
    # text features are the audit's costly part: computed again only where turns were split.
    if stored.multi_turn:
        rows = per_turn(conversations)
        ok = completions(collect_features(rows, config))
    else:
        rows, ok = conversations, completions(features)
    loss = measure_loss_mask(conversations, stored, model, ok.height, config.batch_rows)

    def snippets(ids: list[str]) -> dict[str, str]:
        return answer_snippets(rows, ids)

    columns = length_columns(thinking)
    lengths = quantiles(ok, columns)
    plots = histograms(ok, columns)
    if loss.tokens.height:
        # Per sample, not per row: measured apart from the other lengths, shown with them.
        columns.append("loss_tokens")
        lengths |= quantiles(loss.tokens, ["loss_tokens"])
        plots |= histograms(loss.tokens, ["loss_tokens"])
    counts = server_rates(features, config, thinking)
    checks = [
        completeness_check(features, view, config),
        error_rows_check(features, config),
        empty_answer_check(ok, config, snippets),
        empty_thinking_check(ok, config, thinking),
        think_leak_check(ok, config),
        *truncation_checks(ok, config),
        repetition_check(ok, config),
        answer_collapse_check(ok, config, snippets),
        tiny_length_check(ok, config, columns, lengths),
        server_check(features, counts, config, thinking),
        loss_mask_check(loss, config, model.missing),
        template_parity_check(storage, view, model, config),
    ]
    finish = features.group_by("finish_reason").len().sort("finish_reason")
    return AuditResult(
        dataset=storage.uri,
        rows=features.height,
        planned=view.plan.height if view.plan is not None else None,
        verdict=verdict_of(checks),
        checks=checks,
        lengths=lengths,
        histograms=plots,
        finish_reasons={r: int(n) for r, n in finish.iter_rows()},
        servers=server_breakdown(counts),
    )
