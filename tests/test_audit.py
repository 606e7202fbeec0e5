"""The audit finds planted defects at their planted rates, and stays quiet on clean data."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from pydantic import ValidationError
from rich.console import Console

from regen.audit import AuditResult, Example, run_audit, write_report
from regen.audit.table import audit_table
from regen.config import AuditConfig
from regen.errors import UserError
from regen.lossmask import load_template, samples
from regen.schema import row_schema
from regen.storage import LocalStorage
from tests.support.audit import PROMPT_MARK, Synthetic, make_dataset, tiny_tokenizer

MIXED = {
    "error": 0.03,
    "empty": 0.02,
    "filler": 0.02,
    "short": 0.01,
    "empty_thinking": 0.03,
    "think_leak": 0.01,
    "unbalanced": 0.01,
    "truncated": 0.04,
    "truncated_in_thinking": 0.02,
    "repetition": 0.03,
    "collapse": 0.06,
}
# Which planted defects each check must count: an answer cut off in the thinking is empty too.
EXPECTED = {
    "empty_answer": ("empty", "filler", "short", "truncated_in_thinking"),
    "empty_thinking": ("empty_thinking",),
    "think_leak": ("think_leak", "unbalanced"),
    "truncation": ("truncated", "truncated_in_thinking"),
    "truncated_in_thinking": ("truncated_in_thinking",),
    "repetition": ("repetition",),
    "answer_collapse": ("collapse",),
}
QUALITY = [*EXPECTED, "tiny_length"]


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Synthetic, AuditResult]:
    ds = make_dataset(tmp_path_factory.mktemp("mixed"), defects=MIXED)
    return ds, run_audit(ds.storage, AuditConfig())


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> tuple[Synthetic, AuditResult]:
    ds = make_dataset(tmp_path_factory.mktemp("clean"), seed=1)
    return ds, run_audit(ds.storage, AuditConfig())


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.mark.parametrize("name", list(EXPECTED))
def test_planted_defect_found_at_its_rate_with_its_ids(
    mixed: tuple[Synthetic, AuditResult], name: str
) -> None:
    ds, result = mixed
    check = result.check(name)
    planted = ds.ids_of(*EXPECTED[name])
    assert check.figure == pytest.approx(len(planted) / ds.completions, abs=0.01)
    assert check.figure == pytest.approx(len(planted) / ds.completions, rel=1e-9)
    assert len(check.examples) == 5
    assert {e.id for e in check.examples} <= planted
    assert check.status in {"warn", "fail"}


def test_error_rows_counted_over_all_rows_and_left_out_of_quality(
    mixed: tuple[Synthetic, AuditResult],
) -> None:
    ds, result = mixed
    check = result.check("error_rows")
    errors = ds.ids_of("error")
    assert check.figure == pytest.approx(len(errors) / len(ds.ids))
    assert result.failed_rows == len(errors), "the summaries' failed rows, from this figure"
    assert check.status == "warn"
    assert {e.id for e in check.examples} <= errors
    for name in QUALITY:
        assert not {e.id for e in result.check(name).examples} & errors, name


def test_filler_examples_show_the_answer_snippet(mixed: tuple[Synthetic, AuditResult]) -> None:
    ds, result = mixed
    reasons = {e.id: e.reason for e in result.check("empty_answer").examples}
    for ident in ds.ids_of("filler") & set(reasons):
        assert reasons[ident] == "filler: 'OK.'"
    collapse = result.check("answer_collapse")
    assert any("The final answer is 42" in e.reason for e in collapse.examples)
    assert "The final answer is 42" not in collapse.detail, "answer text must stay out of logs"


def test_clean_dataset_raises_nothing(clean: tuple[Synthetic, AuditResult]) -> None:
    _, result = clean
    assert result.verdict == "pass"
    for check in result.checks:
        # One sampling setting: no per-setting figures to judge; no tools: no calls.
        skipped = {"loss_mask", "template_parity", "per_setting", "tool_calls"}
        expected = "skipped" if check.name in skipped else "pass"
        assert check.status == expected, (check.name, check.detail)
    for name in [*QUALITY, "error_rows", "completeness"]:
        assert result.check(name).figure == (1 / 2000 if name == "answer_collapse" else 0.0)
        assert result.check(name).examples == []
    assert result.check("server_outlier").figure == 0.0


def test_loss_mask_without_tokenizer_is_skipped_not_passed(
    clean: tuple[Synthetic, AuditResult],
) -> None:
    check = clean[1].check("loss_mask")
    assert check.status == "skipped"
    assert check.figure is None
    assert "tokenizer" in check.detail


def test_tiny_length_mode(tmp_path: Path) -> None:
    ds = make_dataset(tmp_path, defects={"tiny_reasoning": 0.04})
    check = run_audit(ds.storage, AuditConfig()).check("tiny_length")
    assert check.figure == pytest.approx(0.04, abs=0.01)
    assert check.status == "warn"
    assert {e.id for e in check.examples} <= ds.ids_of("tiny_reasoning")
    assert all(e.reason == "reasoning_tokens = 2" for e in check.examples)


def test_incident_fails_on_empty_answers_thinking_and_collapse(tmp_path: Path) -> None:
    ds = make_dataset(tmp_path, defects={"incident": 0.87})
    result = run_audit(ds.storage, AuditConfig())
    assert result.verdict == "fail"
    failed = {c.name for c in result.checks if c.status == "fail"}
    assert {"empty_answer", "empty_thinking", "answer_collapse"} <= failed
    incident = ds.ids_of("incident")
    for name in ("empty_answer", "empty_thinking", "answer_collapse"):
        check = result.check(name)
        assert check.figure == pytest.approx(0.87, abs=0.01), name
        assert {e.id for e in check.examples} <= incident
    assert all(e.reason == "answer 'OK.'" for e in result.check("answer_collapse").examples)
    assert "| empty/trivial answers |" in result.to_markdown()


def test_not_judged_checks_are_measured_but_never_fail_a_gate(tmp_path: Path) -> None:
    """A dress rehearsal's random text fails every quality check by design: the checks it
    names are still measured and shown, with no threshold, so neither gate acts on them."""
    ds = make_dataset(tmp_path, defects={"incident": 0.87})
    config = AuditConfig(not_judged=["empty_answer", "empty_thinking", "answer_collapse"])
    result = run_audit(ds.storage, config)
    judged = run_audit(ds.storage, AuditConfig())
    failed = {c.name for c in judged.checks if c.status == "fail"}
    assert {"empty_answer", "empty_thinking", "answer_collapse"} <= failed
    assert {c.name for c in result.checks if c.status == "fail"} == failed - set(config.not_judged)
    for name in ("empty_answer", "empty_thinking", "answer_collapse"):
        check = result.check(name)
        assert check.status == "skipped" and check.fail is None, name
        assert check.figure == pytest.approx(0.87, abs=0.01), name
        assert check.detail.startswith("not judged (audit.not_judged)")
    with pytest.raises(ValidationError, match="completeness"):
        AuditConfig(not_judged=["completeness"])


def test_loss_mask_counts_tokens_with_the_tokenizer(tmp_path: Path, tokenizer: Path) -> None:
    ds = make_dataset(tmp_path, defects={"incident": 0.5, "error": 0.02})
    result = run_audit(ds.storage, AuditConfig(), tokenizer_path=tokenizer)
    check = result.check("loss_mask")
    assert check.status == "fail"
    assert check.figure == pytest.approx(1000 / ds.completions, rel=1e-9)
    # <think> \n\n </think> \n\n OK. <|im_end|>
    assert {e.reason for e in check.examples} == {"6 loss tokens"}
    assert {e.id for e in check.examples} <= ds.ids_of("incident")
    assert result.lengths["loss_tokens"].p1 == 6


def test_loss_mask_count_of_a_full_answer(tokenizer: Path) -> None:
    batch = pl.DataFrame(
        {
            "id": ["full", "incident"],
            "messages": [[{"role": "user", "content": "Q?", "reasoning_content": None}]] * 2,
            "reasoning_content": ["Let me think.\n\nYes.", ""],
            "content": ["The answer is 42.", "OK."],
            "finish_reason": ["stop", "stop"],
            "error": [None, None],
            "turns": [[], []],
        },
        schema={k: row_schema()[k] for k in ("id", "messages", "reasoning_content", "content",
                                             "finish_reason", "error", "turns")},
    )  # fmt: skip
    template, _ = load_template(tokenizer)
    counts = samples(batch, template=template).collect()["loss_tokens"].to_list()
    # <think> \n Let me think. \n\n Yes. \n </think> \n\n The answer is 42. <|im_end|>
    assert counts == [15, 6]


def test_one_bad_server_stands_out(tmp_path: Path) -> None:
    ds = make_dataset(tmp_path, bad_server=2)
    result = run_audit(ds.storage, AuditConfig())
    check = result.check("server_outlier")
    assert check.status == "fail"
    assert check.figure == pytest.approx(1.0)
    assert "server-2 empty_answer 100.0%" in check.detail
    assert {e.id for e in check.examples} <= ds.ids_of("bad_server")
    rates = {s.server: s.rates["empty_answer"] for s in result.servers}
    assert rates == {"server-0": 0.0, "server-1": 0.0, "server-2": 1.0, "server-3": 0.0}
    assert result.check("empty_answer").figure == pytest.approx(0.25)


def test_completeness_missing_duplicate_and_unplanned_ids_fail(tmp_path: Path) -> None:
    ds = make_dataset(tmp_path, drop=3, duplicate=2, unplanned=1)
    result = run_audit(ds.storage, AuditConfig())
    check = result.check("completeness")
    assert check.status == "fail"
    assert result.verdict == "fail"
    assert check.figure == pytest.approx((3 + 2 + 1) / 2000)
    assert result.rows == 2000 - 3 + 2 + 1
    shown = {e.id: e.reason for e in check.examples}
    assert {i for i, r in shown.items() if r == "appears 2 times"} == set(ds.duplicated)
    assert all(shown[i].startswith("missing (missing from its shard") for i in ds.dropped)
    assert shown["x000000"] == "not in plan.parquet"
    assert "3 of 2,000 planned ids missing; 2 duplicate rows" in check.detail


def test_completeness_uncommitted_shard_is_not_read_and_fails(tmp_path: Path) -> None:
    ds = make_dataset(tmp_path, uncommitted=[1])
    result = run_audit(ds.storage, AuditConfig())
    check = result.check("completeness")
    assert check.status == "fail"
    assert result.rows == 1500
    assert check.figure == pytest.approx(0.25)
    assert "uncommitted shards: 1" in check.detail
    assert check.examples[0] == Example(id="s000500", reason="missing (uncommitted shard 1)")


def test_manifest_of_another_run_is_not_part_of_the_dataset(tmp_path: Path) -> None:
    ds = make_dataset(tmp_path)
    key = "shards/shard-000002.json"
    manifest = json.loads(ds.storage.read_bytes(key))
    ds.storage.write_bytes(key, json.dumps({**manifest, "fingerprint": "other"}).encode())
    result = run_audit(ds.storage, AuditConfig())
    check = result.check("completeness")
    assert check.status == "fail"
    assert result.rows == 1500
    assert "other-run manifests: shards 2" in check.detail


def test_completeness_without_plan_warns(tmp_path: Path) -> None:
    ds = make_dataset(tmp_path, plan=False)
    check = run_audit(ds.storage, AuditConfig()).check("completeness")
    assert check.status == "warn"
    assert "no plan.parquet" in check.detail


@pytest.mark.parametrize("thinking", ["off", "drop"])
def test_thinking_not_stored_skips_empty_thinking(tmp_path: Path, thinking: str) -> None:
    ds = make_dataset(tmp_path, thinking=thinking, defects={"empty_thinking": 0.5})
    assert run_audit(ds.storage, AuditConfig()).check("empty_thinking").status == "skipped"
    forced = run_audit(ds.storage, AuditConfig(), thinking_requested=True)
    assert forced.check("empty_thinking").figure == pytest.approx(0.5)


def test_thinking_saved_flags_empty_thinking(tmp_path: Path) -> None:
    ds = make_dataset(tmp_path, thinking="save", defects={"empty_thinking": 0.5})
    assert run_audit(ds.storage, AuditConfig()).check("empty_thinking").status == "fail"


def test_report_files_never_carry_prompt_text(
    mixed: tuple[Synthetic, AuditResult], tmp_path: Path
) -> None:
    _, result = mixed
    storage = LocalStorage(tmp_path)
    keys = write_report(storage, result)
    assert {"report/audit.json", "report/audit.md", "report/lengths.png"} <= set(keys)
    assert {"report/finish_reasons.png", "report/servers.png"} <= set(keys)
    markdown = (tmp_path / "report/audit.md").read_text()
    assert markdown.startswith("# Audit: **FAIL**")
    raw = (tmp_path / "report/audit.json").read_text()
    assert PROMPT_MARK not in markdown
    assert PROMPT_MARK not in raw
    assert AuditResult.model_validate_json(raw) == result
    assert json.loads(raw)["verdict"] == "fail"
    for key in keys:
        if key.endswith(".png"):
            assert (tmp_path / key).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_audit_table_lists_every_check(mixed: tuple[Synthetic, AuditResult]) -> None:
    _, result = mixed
    console = Console(record=True, width=300)
    console.print(audit_table(result))
    text = console.export_text()
    for check in result.checks:
        assert check.title in text
    assert "FAIL" in text


def test_bad_inputs_are_user_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not a regen dataset"):
        run_audit(LocalStorage(tmp_path / "nothing"), AuditConfig())
    ds = make_dataset(tmp_path / "ds", rows=10, shard_size=5)
    with pytest.raises(UserError, match=r"tokenizer\.json not found"):
        run_audit(ds.storage, AuditConfig(), tokenizer_path=tmp_path / "no-tokenizer")


def test_config_rejects_typos_and_inverted_thresholds() -> None:
    with pytest.raises(ValidationError):
        AuditConfig.model_validate({"empty_answers": {"warn": 0.1, "fail": 0.2}})
    with pytest.raises(ValidationError, match="above fail"):
        AuditConfig.model_validate({"empty_answer": {"warn": 0.3, "fail": 0.2}})


def _fleet(servers: int, rows: int, defect: str, hits: dict[int, int]) -> dict[str, dict[str, int]]:
    """Per-server counts as `server_rates` gives them: `rows` rows a server, every one a
    completion, `hits[i]` of them with `defect` on server i."""
    from regen.audit.servers import server_flags

    zero = dict.fromkeys(["error", *server_flags(AuditConfig(), True)], 0)
    return {
        f"server-{i}": {"rows": rows, "completions": rows, **zero, defect: hits.get(i, 0)}
        for i in range(servers)
    }


def _outlier_check(counts: dict[str, dict[str, int]]) -> tuple[str, float | None, str]:
    from regen.audit.checks.server_outlier import server_check

    check = server_check(counts, {}, AuditConfig())
    return check.status, check.figure, check.detail


@pytest.mark.parametrize(
    ("servers", "rows", "hits"),
    [
        # A clean 700-prompt rehearsal on 7 emulators: 4 truncations of 100 on server-2,
        # 3 of 600 on the others (issue 38): 8 times the others' rate, and chance.
        (7, 100, {2: 4, 0: 1, 3: 1, 5: 1}),
        # The default rehearsal's: 2 truncations of 60 on one server, 1 of 180 elsewhere.
        (4, 60, {1: 2, 3: 1}),
        # Every hit of the fleet on one server: 3 of 3 is still chance at 1 in 7 each.
        (7, 100, {4: 3}),
    ],
)
def test_server_outlier_is_not_called_on_chance(
    servers: int, rows: int, hits: dict[int, int]
) -> None:
    status, figure, detail = _outlier_check(_fleet(servers, rows, "truncation", hits))
    assert (status, figure) == ("pass", 0.0), detail
    assert detail == f"{servers} servers, none worse than the others beyond chance"


@pytest.mark.parametrize("servers", [4, 7])
@pytest.mark.parametrize("rows", [25, 100, 1000, 20_000])
def test_a_healthy_fleet_of_any_size_rarely_shows_an_outlier(servers: int, rows: int) -> None:
    """Healthy fleets, every server alike at a 1 % or 5 % defect rate, drawn 200 times each:
    under 5 % of them may show an outlier (EVIDENCE spread over every server and defect)."""
    import numpy as np

    rng = np.random.default_rng(38 * servers + rows)
    for rate in (0.01, 0.05):
        flagged = 0
        for _ in range(200):
            drawn = rng.binomial(rows, rate, size=servers)
            counts = _fleet(servers, rows, "truncation", dict(enumerate(drawn.tolist())))
            flagged += _outlier_check(counts)[0] != "pass"
        assert flagged <= 10, f"{flagged} of 200 healthy fleets flagged at {rate:.0%}"


@pytest.mark.parametrize(
    ("servers", "rows", "hits", "status", "named"),
    [
        # The emulator's `truncate` fault on one server of 7 (20 % of its answers cut off).
        (7, 100, {2: 20, 0: 1, 3: 1, 5: 1}, "fail", "server-2 truncation 20.0% vs 0.5%"),
        # Half as sick: still far beyond chance, and over the warn threshold.
        (7, 100, {2: 10, 0: 1, 3: 1, 5: 1}, "warn", "server-2 truncation 10.0% vs 0.5%"),
        # The incident on one server of 4, seen by a 256-row canary: every answer empty.
        (4, 64, {0: 64}, "fail", "server-0 truncation 100.0% vs 0.0%"),
        # A long run: 4 % on one server against 1 % on six others, 10,000 rows each.
        (7, 10_000, {0: 400, **{i: 100 for i in range(1, 7)}}, "warn", "server-0 truncation 4.0%"),
    ],
)
def test_a_sick_server_is_still_flagged(
    servers: int, rows: int, hits: dict[int, int], status: str, named: str
) -> None:
    got, figure, detail = _outlier_check(_fleet(servers, rows, "truncation", hits))
    assert got == status and figure is not None and figure > 0, detail
    assert named in detail, detail
