"""The dataset card: README.md with the YAML header the Hub validates, made from the provenance.

Its metadata is huggingface_hub's own `DatasetCardData` (license, size category, task, tags
and the `configs:` that tell `datasets.load_dataset` and the Hub's viewer which Parquet files
are which config and split); its body is `card.md.j2`, filled with tables made here, so the
card says nothing the provenance file does not hold. No clock time in it: the same dataset
gives the same card, and a second publish uploads nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from regen.config.uris import HubRepoTarget
from regen.dataset import AUDIT_MARKDOWN_KEY
from regen.dataset.keys import PROVENANCE_KEY
from regen.display.figures import count, markdown_table, pct
from regen.publish.provenance import Provenance
from regen.publish.stage import SPLIT, ConfigCounts, data_pattern

TEMPLATE = Path(__file__).with_name("card.md.j2")
UNKNOWN_LICENSE = "unknown"
_SIZES = [
    (1_000, "n<1K"),
    (10_000, "1K<n<10K"),
    (100_000, "10K<n<100K"),
    (1_000_000, "100K<n<1M"),
    (10_000_000, "1M<n<10M"),
    (100_000_000, "10M<n<100M"),
    (1_000_000_000, "100M<n<1B"),
]
_STATUS = {"fail": "**FAIL**", "warn": "**WARN**", "pass": "pass", "skipped": "skipped"}
_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p")


def size_category(rows: int) -> str:
    """The Hub's size category of a dataset of `rows` rows."""
    return next((label for bound, label in _SIZES if rows < bound), "n>1B")


def make_card(
    target: HubRepoTarget,
    provenance: Provenance,
    counts: dict[str, ConfigCounts],
    *,
    revision: str,
    command: str,
    license: str | None,
    plots: list[str],
) -> str:
    """README.md's text; `plots` are the report's PNG paths in the repo, `command` the
    publish command as typed (no secret is ever an argument)."""
    from huggingface_hub import DatasetCard, DatasetCardData

    tokenized = "tokenized" in counts
    configs: list[dict[str, Any]] = [
        {
            "config_name": name,
            "data_files": [{"split": SPLIT, "path": data_pattern(name)}],
            **({"default": True} if name == "default" else {}),
        }
        for name in counts
    ]
    rows = counts["default"].rows
    data = DatasetCardData(
        license=license or UNKNOWN_LICENSE,
        pretty_name=target.repo_id.split("/")[1],
        size_categories=[size_category(rows)],
        task_categories=["text-generation"],
        tags=["regen", "synthetic", "speculative-decoding", "distillation"],
        configs=configs,
    )
    model = provenance.model.source or provenance.model.served_name or "the target model"
    fields: dict[str, Any] = {
        "title": target.repo_id.split("/")[1],
        "summary": (
            f"{rows:,} conversations whose answers were generated again by `{model}` with "
            "regen, so that a speculative-decoding draft model (EAGLE, DFlash, MTP heads) "
            "trains on its target's own distribution."
        ),
        "verdict": provenance.audit.verdict.upper(),
        "provenance_file": PROVENANCE_KEY,
        "audit_file": AUDIT_MARKDOWN_KEY,
        "repo_id": target.repo_id,
        "split": SPLIT,
        "revision_arg": f', revision="{revision}"' if revision != "main" else "",
        "tokenized": tokenized,
        "configs_table": _configs_table(counts),
        "made_table": _made_table(provenance),
        "mix_table": _mix_table(provenance.sampling),
        "command": command,
        "audit_table": _audit_table(provenance),
        "plots": {Path(p).stem: p for p in plots},
        "rows_table": _rows_table(provenance, counts),
        "lengths_table": _lengths_table(provenance),
        "license_text": _license_text(provenance, license),
    }
    card = DatasetCard.from_template(data, template_path=str(TEMPLATE), **fields)
    return str(card)


def _lines(lines: list[str]) -> str:
    return "\n".join(lines)


def _configs_table(counts: dict[str, ConfigCounts]) -> str:
    described = {
        "default": "`id`, `messages` (the conversation as the server was sent it, ending with "
        "the regenerated answer; `reasoning_content` where the model thought), `tools`, "
        "`finish_reason`, token counts, `sampling`",
        "tokenized": "`id`, `input_ids`, `loss_mask` (0 prompt, 1 answer), `seq_len`: the "
        "server's own token ids, one sample per assistant turn (speculators' prepared form)",
    }
    return _lines(
        markdown_table(
            ["config", "split", "rows", "columns"],
            ((f"`{c}`", SPLIT, f"{n.rows:,}", described[c]) for c, n in counts.items()),
            numeric={"rows"},
        )
    )


def _code(value: object) -> str:
    return f"`{value}`" if value is not None else "not recorded"


def _made_table(p: Provenance) -> str:
    model = p.model
    revision = f" at revision `{model.revision}`" if model.revision else " (default branch)"
    rows: list[tuple[str, str]] = [
        (
            "target model",
            f"{_code(model.source)}{revision}, served as {_code(model.served_name)}"
            if model.source
            else "not recorded",
        ),
        (
            "chat template",
            f"sha256 `{model.chat_template_sha256}` (`{model.chat_template_file}`)"
            if model.chat_template_sha256
            else "not recorded",
        ),
    ]
    if p.engine is not None:
        engine = p.engine
        what = [f"reasoning parser `{engine.reasoning_parser}`"] if engine.reasoning_parser else []
        if engine.tool_call_parser:
            what.append(f"tool-call parser `{engine.tool_call_parser}`")
        if engine.speculative:
            what.append(f"speculative decoding {engine.speculative} (same distribution)")
        extra = f" ({', '.join(what)})" if what else ""
        rows.append(
            ("serving engine", f"{engine.kind} {engine.version or '(version unknown)'}{extra}")
        )
    else:
        rows.append(("serving engine", "not recorded by the run"))
    rows += [
        ("sampling", _sampling(p.sampling)),
        ("regeneration", _regeneration(p.regeneration)),
        ("prompts", _prompts(p)),
    ]
    if p.regen_version:
        rows.append(("made with", f"regen {p.regen_version}"))
    created = f", run.json written {p.created}" if p.created else ""
    rows.append(("run fingerprint", f"{_code(p.fingerprint)}{created}"))
    return _lines(markdown_table(["", ""], rows))


def _sampling(sampling: dict[str, Any]) -> str:
    said = [f"{k} {sampling[k]}" for k in _SAMPLING_KEYS if sampling.get(k) is not None]
    if sampling.get("max_tokens") is not None:
        said.append(f"max_tokens {sampling['max_tokens']:,}")
    if sampling.get("mix"):
        said.append(f"a mix of {len(sampling['mix'])} settings (below)")
    return ", ".join(said) or "not recorded"


def _mix_table(sampling: dict[str, Any]) -> str | None:
    mix = sampling.get("mix") or []
    if not mix:
        return None

    def value(setting: dict[str, Any], key: str) -> object:
        # A setting's unset keys are the section's.
        own = setting.get(key)
        return own if own is not None else sampling.get(key)

    return _lines(
        markdown_table(
            ["share", *_SAMPLING_KEYS],
            ((pct(s.get("share")), *(value(s, k) for k in _SAMPLING_KEYS)) for s in mix),
            numeric={"share", *_SAMPLING_KEYS},
        )
    )


def _regeneration(regeneration: dict[str, Any]) -> str:
    said = [f"turns: {regeneration.get('turns', 'last')}"]
    said.append(f"thinking: {regeneration.get('thinking', 'save')}")
    if regeneration.get("thinking_mix"):
        mix = ", ".join(f"{k} {pct(v)}" for k, v in regeneration["thinking_mix"].items())
        said.append(f"thinking mix {mix}")
    if regeneration.get("reasoning_effort"):
        mix = ", ".join(f"{k} {pct(v)}" for k, v in regeneration["reasoning_effort"].items())
        said.append(f"reasoning effort {mix}")
    return "; ".join(said)


def _prompts(p: Provenance) -> str:
    source = p.prompts.source
    where = _code(p.prompts.input_path)
    if source.get("repo"):
        where = (
            f"`hf://datasets/{source['repo']}` at commit `{source.get('commit')}` "
            f"(revision {source.get('revision')}, {_files(source)})"
        )
    rows = f"{p.rows.planned:,} valid rows" if p.rows.planned is not None else "rows not planned"
    rejected = f", {p.rows.rejected:,} rejected" if p.rows.rejected is not None else ""
    revisions = f", {p.prompts.revisions} input revisions" if p.prompts.revisions > 1 else ""
    return f"{where}: {rows}{rejected}{revisions}"


def _audit_table(p: Provenance) -> str:
    checks = sorted(
        p.audit.checks, key=lambda c: {"fail": 0, "warn": 1}.get(c.status, 2)
    )  # failures first, as audit.md
    return _lines(
        markdown_table(
            ["status", "check", "figure", "warn at", "fail at"],
            (
                (_STATUS.get(c.status, c.status), c.title, pct(c.figure), pct(c.warn), pct(c.fail))
                for c in checks
            ),
            numeric={"figure", "warn at", "fail at"},
        )
    )


def _rows_table(p: Provenance, counts: dict[str, ConfigCounts]) -> str:
    rows = p.rows
    lines: list[tuple[str, str]] = []
    if rows.planned is not None:
        lines.append(("planned (valid input rows)", f"{rows.planned:,}"))
    if rows.rejected is not None:
        lines.append(("rejected input rows (never sent)", f"{rows.rejected:,}"))
    lines += [
        ("committed", f"{rows.committed:,}"),
        ("error rows (not published)", f"{rows.error_rows:,}"),
        ("published conversations (`default`)", f"{counts['default'].rows:,}"),
    ]
    if "tokenized" in counts:
        tokens = counts["tokenized"]
        lines.append(("published samples (`tokenized`)", f"{tokens.rows:,}"))
        lines += [(f"samples left out: {k}", f"{v:,}") for k, v in sorted(tokens.dropped.items())]
    return _lines(markdown_table(["rows", "count"], lines, numeric={"count"}))


def _lengths_table(p: Provenance) -> str | None:
    if not p.audit.lengths:
        return None
    return _lines(
        markdown_table(
            ["column", "p1", "p50", "p99"],
            ((c, count(q.p1), count(q.p50), count(q.p99)) for c, q in p.audit.lengths.items()),
            numeric={"p1", "p50", "p99"},
        )
    )


def _license_text(p: Provenance, license: str | None) -> str:
    source = p.prompts.source.get("repo")
    if license and license == p.prompts.license and source:
        origin = f"`{license}`, as the prompt source's card (`hf://datasets/{source}`) declares."
    elif license:
        origin = f"`{license}`, as given when it was published."
    else:
        origin = "Not known: the prompt source declares none; set one with `--license`."
    return (
        f"{origin} The answers are the output of {_code(p.model.source or p.model.served_name)}"
        ": check that model's license for what it allows of its outputs."
    )


def _files(source: dict[str, Any]) -> str:
    n = len(source.get("files") or [])
    return f"{n} file" if n == 1 else f"{n} files"
