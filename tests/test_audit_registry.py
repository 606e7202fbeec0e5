"""The check registry is the one list of row checks, and a new check is found through it: the
language switch (an answer in CJK to a Latin-script prompt) is one module, one threshold."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import polars as pl
import pytest

from regen.audit import CHECKS, run_audit
from regen.audit.checks.base import FlagCheck
from regen.audit.checks.language_switch import CHECK as LANGUAGE_SWITCH
from regen.audit.features import collect_features
from regen.config import AuditConfig, Threshold
from regen.config.audit import RowCheck
from regen.schema import row_schema
from tests.support.audit import SWITCHED, make_dataset


def test_registry_names_every_row_check_once() -> None:
    names = [c.name for c in CHECKS]
    assert len(names) == len(set(names))
    # A check missing from either list fails here: `audit.not_judged` could not name it, or
    # would name one no gate runs.
    assert set(names) == set(get_args(RowCheck))


def test_every_check_names_a_threshold_field() -> None:
    config = AuditConfig()
    for check in CHECKS:
        if check.threshold is not None:
            assert isinstance(getattr(config, check.threshold), Threshold), check.name
            assert check.threshold in AuditConfig.model_fields, check.name


def _switched(prompt: str, answer: str) -> bool:
    row = {
        "id": "a", "shard": 0, "messages": [{"role": "user", "content": prompt}],
        "content": answer, "reasoning_content": "thinking", "finish_reason": "stop",
        "error": None,
    }  # fmt: skip
    rows = pl.DataFrame([row], schema=row_schema()).lazy()
    facts = collect_features(rows, [LANGUAGE_SWITCH], AuditConfig())
    return bool(facts["language_switch"][0])


@pytest.mark.parametrize(
    ("prompt", "answer", "switched"),
    [
        ("What is six times seven?", SWITCHED, True),
        ("What is six times seven?", "The answer is 42 (四十二).", False),
        ("What is six times seven?", "四十二 (forty-two), as the reasoning shows.", False),
        ("Что такое шесть на семь?", SWITCHED, False),  # not a Latin prompt
        ("Quelle est la réponse ?", "La réponse est 42.", False),
        ("六乘以七是多少？", SWITCHED, False),  # asked in Chinese: answered in it
        ("What is six times seven?", "", False),
    ],
)
def test_a_switch_is_a_latin_prompt_answered_in_cjk(
    prompt: str, answer: str, switched: bool
) -> None:
    assert _switched(prompt, answer) is switched


@pytest.mark.parametrize(("rate", "status"), [(0.0, "pass"), (0.05, "warn"), (0.15, "fail")])
def test_language_switch_is_graded_found_and_shown(
    tmp_path: Path, rate: float, status: str
) -> None:
    ds = make_dataset(tmp_path, rows=400, shard_size=200, defects={"language_switch": rate})
    result = run_audit(ds.storage, AuditConfig())
    check = result.check("language_switch")
    assert check.status == status
    assert check.figure == pytest.approx(rate)
    assert {e.id for e in check.examples} <= ds.ids_of("language_switch")
    assert all("CJK" in e.reason for e in check.examples)
    # Found through the registry: the report, its per-setting figures and the live gate's
    # figures name it with no line of its own.
    assert "| language switch |" in result.to_markdown()
    assert isinstance(LANGUAGE_SWITCH, FlagCheck) and LANGUAGE_SWITCH in CHECKS


def test_not_judged_may_name_the_new_check(tmp_path: Path) -> None:
    ds = make_dataset(tmp_path, rows=200, shard_size=200, defects={"language_switch": 0.5})
    result = run_audit(ds.storage, AuditConfig(not_judged=["language_switch"]))
    check = result.check("language_switch")
    assert check.status == "skipped" and check.figure == pytest.approx(0.5)
    assert check.fail is None
