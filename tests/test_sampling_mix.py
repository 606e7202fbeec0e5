"""Sampling and thinking mixes: shares of rows per sampling setting (`sampling.mix`) and per
thinking mode (`regeneration.thinking_mix`), drawn from the row id, sent with each request,
recorded on the row, fingerprinted, and judged by the audit setting by setting."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from aiohttp import web
from aiohttp.typedefs import Handler
from pydantic import SecretStr

from regen.audit import run_audit
from regen.audit.rolling import judge
from regen.audit.settings import settings_for
from regen.audit.summary import audit_rows, merge
from regen.client import Dispatcher
from regen.client.setting import SettingDraw
from regen.config import (
    AuditConfig,
    GenerationConfig,
    RegenerationConfig,
    SamplingConfig,
    parse_config,
)
from regen.dataset import commit_shard
from regen.dataset.runinfo import config_fingerprint
from regen.errors import ConfigError
from regen.fingerprint import changed_components
from regen.schema import row_schema
from regen.sglang_api.endpoint import Endpoint
from regen.sglang_api.request import chat_request_body, turn_request_id
from regen.storage import LocalStorage
from support.emulator import in_process
from tests.test_dispatcher import prompts

MIX = [{"temperature": 0.6, "top_p": 0.95, "share": 0.7}, {"temperature": 1.0, "share": 0.3}]
BASE = {"model": {"source": "/m", "served_name": "m"}, "prompts": "p.jsonl", "output": "out"}


def config(**sections: Any) -> Any:
    return parse_config({**BASE, **sections})


# ---- config ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        ({"sampling": {"mix": [{"temperature": 1.0, "share": 0.5}, {"share": 0.4}]}},
         "config: sampling.mix: shares sum to 0.9, expected 1"),
        ({"sampling": {"mix": [{"temperature": 1.0, "share": 1.0}]}},
         "config: sampling.mix: one setting is no mix"),
        ({"sampling": {"mix": [{"temprature": 1.0, "share": 0.5}, {"share": 0.5}]}},
         "config: sampling.mix.0.temprature: unknown key"),
        ({"sampling": {"mix": [{"top_p": 1.5, "share": 0.5}, {"share": 0.5}]}},
         "config: sampling.mix.0.top_p: Input should be less than or equal to 1"),
        ({"regeneration": {"thinking_mix": {"on": 0.5, "off": 0.6}}},
         "config: regeneration.thinking_mix: shares sum to 1.1, expected 1"),
        ({"regeneration": {"thinking": "off", "thinking_mix": {"on": 0.5, "off": 0.5}}},
         "config: regeneration.thinking_mix: needs thinking save or drop"),
    ],
)  # fmt: skip
def test_a_bad_mix_is_one_line_naming_the_field(sections: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        config(**sections)
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)


def test_thinking_mix_takes_yaml_and_json_spellings() -> None:
    # YAML reads `on`/`off` as booleans; a flow parameter (JSON) has string keys.
    for keys in ({True: 0.7, False: 0.3}, {"on": 0.7, "off": 0.3}, {"true": 0.7, "false": 0.3}):
        assert RegenerationConfig(thinking_mix=keys).thinking_mix == {True: 0.7, False: 0.3}


# ---- the draw ---------------------------------------------------------------------------------


def test_each_row_draws_its_setting_stably_and_in_the_shares() -> None:
    sampling = SamplingConfig(top_k=30, mix=MIX)
    regen = RegenerationConfig(thinking_mix={True: 0.6, False: 0.4}, reasoning_effort={"low": 1})
    draw = SettingDraw(sampling, regen)
    again = SettingDraw(SamplingConfig(top_k=30, mix=MIX), regen)
    picks = [draw(f"id-{i}") for i in range(20_000)]
    assert picks[:500] == [again(f"id-{i}") for i in range(500)]
    temps = Counter(p.temperature for p in picks)
    assert temps[0.6] / 20_000 == pytest.approx(0.7, abs=0.015)
    assert temps[1.0] / 20_000 == pytest.approx(0.3, abs=0.015)
    assert sum(p.enable_thinking for p in picks) / 20_000 == pytest.approx(0.6, abs=0.015)
    # A setting's unset keys are the section's: top_p 0.95 (its default), top_k 30.
    hot = next(p for p in picks if p.temperature == 1.0)
    assert (hot.top_p, hot.top_k, hot.min_p) == (0.95, 30, 0.0)
    # The two draws are independent: every combination comes up near its product.
    both = Counter((p.temperature, p.enable_thinking) for p in picks)
    assert both[(1.0, False)] / 20_000 == pytest.approx(0.3 * 0.4, abs=0.015)


def test_without_a_mix_every_row_gets_the_section_and_thinking() -> None:
    draw = SettingDraw(SamplingConfig(temperature=0.3), RegenerationConfig(thinking="off"))
    assert {draw(f"i{i}") for i in range(100)} == {draw("i0")}
    assert draw("i0").record() == {
        "temperature": 0.3, "top_p": 0.95, "top_k": 20, "min_p": 0.0, "enable_thinking": False,
    }  # fmt: skip


def test_the_request_carries_the_rows_setting() -> None:
    sampling = SamplingConfig(mix=[{"temperature": 1.0, "min_p": 0.1, "share": 1.0}, {"share": 0}])
    setting = SettingDraw(sampling, RegenerationConfig(thinking_mix={False: 1.0}))("a")
    body = chat_request_body("m", [], SamplingConfig(), setting=setting)
    assert (body["temperature"], body["min_p"], body["top_p"], body["top_k"]) == (
        1.0,
        0.1,
        0.95,
        20,
    )
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    # Probes and benches pass no setting: the section's values, as before.
    plain = chat_request_body("m", [], SamplingConfig(temperature=0.2))
    assert plain["temperature"] == 0.2 and "min_p" not in plain
    assert plain["chat_template_kwargs"] == {"enable_thinking": True}


# ---- the fingerprint ------------------------------------------------------------------------


def test_a_config_without_a_mix_keeps_its_fingerprint() -> None:
    """Computed by the code before mixes existed (git 47bedbc): a dataset made then resumes."""
    plain = config(
        sampling={"temperature": 0.7, "top_p": 0.9},
        regeneration={"reasoning_effort": {"low": 0.5, "high": 0.5}},
    )
    digest, components = config_fingerprint(plain)
    assert digest == "7a09a83ef954dc150f21664e383b06028975c4951ec406d2b9ca0a2edafa0313"
    assert not {"sampling.mix", "regeneration.thinking_mix"} & set(components)


def test_a_mix_is_part_of_the_fingerprint_and_named_when_it_changes() -> None:
    plain = config_fingerprint(config())
    mixed = config_fingerprint(config(sampling={"mix": MIX}))
    other = [{**MIX[0], "share": 0.5}, {**MIX[1], "share": 0.5}]
    changed = config_fingerprint(config(sampling={"mix": other}))
    thinking = config_fingerprint(config(regeneration={"thinking_mix": {"on": 0.5, "off": 0.5}}))
    assert len({plain[0], mixed[0], changed[0], thinking[0]}) == 4
    assert [c.split("=")[0] for c in changed_components(mixed[1], changed[1])] == ["sampling.mix"]
    assert changed_components(plain[1], thinking[1]) == [
        "regeneration.thinking_mix=unset, this run has {'false': 0.5, 'true': 0.5}"
    ]
    # As run.json holds them (JSON, string keys), the same mix is no change.
    stored = json.loads(json.dumps(thinking[1]))
    assert changed_components(stored, thinking[1]) == []


# ---- generation against emulators -----------------------------------------------------------


class Bodies:
    """Records what each chat request sent, as the server received it."""

    def __init__(self) -> None:
        self.seen: dict[str, dict[str, Any]] = {}

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path == "/v1/chat/completions":
            body = await request.json()
            self.seen[body["rid"]] = body
        return await handler(request)


def test_rows_are_sent_and_stored_with_their_setting() -> None:
    """Each request carries its row's temperature and thinking; the emulator thinks only when
    asked (it takes temperature and samples nothing by it: its text is seeded per prompt), and
    each row records what it was sent."""
    flags = [
        "--reasoning-parser", "qwen3", "--emu-load-s", "0", "--emu-time-scale", "0.01",
        "--emu-reasoning-tokens", "5:20", "--emu-answer-tokens", "5:20",
    ]  # fmt: skip
    rows = prompts(40)
    sampling = SamplingConfig(max_tokens=256, mix=MIX)
    regen = RegenerationConfig(thinking_mix={True: 0.5, False: 0.5})
    bodies = Bodies()
    with (
        in_process([flags], served_name="emu", middlewares=[bodies.middleware]) as fleet,
        Dispatcher(
            [Endpoint(0, fleet[0].url)],
            api_key=SecretStr("unused"),
            model="emu",
            sampling=sampling,
            generation=GenerationConfig(),
            concurrency_per_server=4,
            regeneration=regen,
        ) as dispatcher,
    ):
        out = dispatcher.submit_shard(0, rows).result(timeout=60)
    assert out.schema == row_schema() and out["error"].null_count() == rows.height
    draw = SettingDraw(sampling, regen)
    stored = out.select("id", pl.col("sampling").struct.unnest(), "reasoning_tokens")
    for row in stored.iter_rows(named=True):
        setting = draw(row["id"]).record()
        assert {k: row[k] for k in setting} == setting
        sent = bodies.seen[turn_request_id(row["id"], 1, 1)]
        assert (sent["temperature"], sent["top_p"]) == (setting["temperature"], setting["top_p"])
        assert sent["chat_template_kwargs"]["enable_thinking"] is setting["enable_thinking"]
        assert (row["reasoning_tokens"] > 0) is setting["enable_thinking"]
    assert stored["enable_thinking"].n_unique() == 2 and stored["temperature"].n_unique() == 2


# ---- the audit, setting by setting ------------------------------------------------------------

HOT_OFF = {"temperature": 1.0, "top_p": 0.95, "top_k": 20, "min_p": 0.0, "enable_thinking": False}
COOL_ON = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0, "enable_thinking": True}


def _row(i: int, setting: dict[str, Any], *, empty: bool = False) -> dict[str, Any]:
    thinks = setting["enable_thinking"]
    answer = "" if empty else " ".join(f"word{i}x{j}" for j in range(30))
    reasoning = " ".join(f"thought{i}y{j}" for j in range(40)) if thinks else None
    return {
        "id": f"r{i:04d}", "shard": i // 100,
        "messages": [{"role": "user", "content": f"question {i}", "reasoning_content": None}],
        "content": answer, "reasoning_content": reasoning, "finish_reason": "stop",
        "prompt_tokens": 20, "completion_tokens": (40 if thinks else 0) + (0 if empty else 30),
        "reasoning_tokens": 40 if thinks else 0, "model": "m", "server": f"server-{i % 2}",
        "attempts": 1, "latency_s": 0.1, "error": None, "turns": None, "sampling": setting,
    }  # fmt: skip


def _mixed_dataset(root: Path, hot_empty: int) -> LocalStorage:
    """400 rows, 1 in 5 hot with thinking off; `hot_empty` of those 80 answer nothing."""
    rows, hot = [], 0
    for i in range(400):
        is_hot = i % 5 == 0
        rows.append(_row(i, HOT_OFF if is_hot else COOL_ON, empty=is_hot and hot < hot_empty))
        hot += is_hot
    storage = LocalStorage(root)
    frame = pl.DataFrame(rows, schema=row_schema())
    for shard in range(4):
        part = frame.filter(pl.col("shard") == shard)
        commit_shard(storage, shard, part, fingerprint="f", timings={})
    return storage


def test_a_setting_that_collapses_is_flagged_where_the_whole_only_warns(tmp_path: Path) -> None:
    storage = _mixed_dataset(tmp_path, hot_empty=16)  # 16 of 80 hot rows: 20 %; of 400: 4 %
    result = run_audit(storage, AuditConfig())
    assert result.check("empty_answer").status == "warn"
    check = result.check("per_setting")
    assert check.status == "fail" and check.figure == pytest.approx(16 / 80)
    assert "temperature=1.0" in check.detail and "thinking=off: empty_answer 20.0 %" in check.detail
    assert all("temperature=1.0" in e.reason for e in check.examples)
    figures = {f.setting.split()[0]: f for f in result.per_setting}
    assert figures["temperature=1.0"].rows == 80 and figures["temperature=0.6"].rows == 320
    assert figures["temperature=1.0"].rates["empty_answer"] == pytest.approx(0.2)
    assert figures["temperature=0.6"].rates["empty_answer"] == 0
    # The rows drawn to thinking off have no reasoning by design: no empty thinking, and no
    # empty-thinking figure of their own.
    assert result.check("empty_thinking").figure == 0
    assert "empty_thinking" not in figures["temperature=1.0"].rates
    assert "reasoning_tokens" not in figures["temperature=1.0"].mean_tokens
    markdown = result.to_markdown()
    assert "## Per sampling setting" in markdown
    assert "All settings: `top_p=0.95 top_k=20 min_p=0.0`." in markdown
    assert "| temperature=1.0 thinking=off |" in markdown
    saved = json.loads(result.to_json())
    assert {f["setting"] for f in saved["per_setting"]} == {f.setting for f in result.per_setting}


def test_a_healthy_mix_passes_and_no_mix_is_skipped(tmp_path: Path) -> None:
    healthy = run_audit(_mixed_dataset(tmp_path / "mix", hot_empty=0), AuditConfig())
    assert healthy.check("per_setting").status == "pass"
    # Rows drawn to thinking off have no reasoning: neither empty thinking nor a tiny mode.
    judged = [c for c in healthy.checks if c.name != "completeness"]  # no plan.parquet: warns
    assert all(c.status in ("pass", "skipped") for c in judged), healthy.to_markdown()
    storage = LocalStorage(tmp_path / "plain")
    frame = pl.DataFrame([_row(i, COOL_ON) for i in range(50)], schema=row_schema())
    commit_shard(storage, 0, frame, fingerprint="f", timings={})
    plain = run_audit(storage, AuditConfig())
    assert plain.check("per_setting").status == "skipped"
    assert "## Per sampling setting" not in plain.to_markdown()


def test_shard_summaries_merge_to_the_figures_over_all_rows(tmp_path: Path) -> None:
    storage = _mixed_dataset(tmp_path, hot_empty=16)
    from regen.audit.dataset import open_dataset

    view = open_dataset(storage)
    settings = settings_for(storage, view, AuditConfig())
    parts = [audit_rows(view.scan([s]).collect(), settings) for s in view.committed]
    whole = audit_rows(view.scan().collect(), settings)
    merged = merge(parts)
    assert merged.by_setting == whole.by_setting
    assert merged.thinking_completions == whole.thinking_completions == 320


def test_the_live_gate_asks_the_settings_own_rows_for_evidence(tmp_path: Path) -> None:
    """A canary's few rows of one setting prove little; the same rate over many rows stops."""
    from regen.audit.dataset import open_dataset

    storage = _mixed_dataset(tmp_path, hot_empty=16)
    view = open_dataset(storage)
    settings = settings_for(storage, view, AuditConfig())
    # Four hot rows, one empty: 25 % of that setting, but 1 in 4 is chance at 5 %.
    cool = view.scan([0]).collect().filter(pl.col("sampling").struct.field("temperature") == 0.6)
    hot = [_row(900 + i, HOT_OFF, empty=i == 0) for i in range(4)]
    few = pl.concat([cool, pl.DataFrame(hot, schema=row_schema())])
    calm = judge(audit_rows(few, settings), settings, min_rows=0)
    assert "per_setting" not in {f.check for f in calm.failing}
    many = judge(audit_rows(view.scan().collect(), settings), settings, min_rows=0)
    assert "per_setting" in {f.check for f in many.failing} and many.action == "stop"


# ---- the whole flow -------------------------------------------------------------------------


@pytest.mark.timeout(300)
@pytest.mark.usefixtures("prefect_harness")
def test_a_mixed_rehearsal_records_audits_and_resumes(tmp_path: Path) -> None:
    """The flow end to end on emulators: run.json holds the mixes, every row its draw, the
    audit a figure per setting; the same config again resumes with nothing to generate."""
    import yaml

    from flows.regenerate import regenerate_completions
    from regen.dataset import read_committed
    from regen.rehearsal import rehearsal_config
    from regen.storage import open_storage

    path = tmp_path / "mix.yaml"
    settings = {
        "work_dir": str(tmp_path / "work"),
        "shard_size": 120,
        "sampling": {"mix": MIX},
        "regeneration": {"thinking_mix": {"on": 0.5, "off": 0.5}},
    }
    path.write_text(yaml.safe_dump(settings))
    out = str(tmp_path / "out")
    config = rehearsal_config(config_path=path, out=out, servers=2)
    state = regenerate_completions(config, return_state=True)
    assert state.is_completed(), state.message
    storage = open_storage(out)
    run = json.loads(storage.read_bytes("run.json"))
    assert run["sampling"]["mix"][1]["temperature"] == 1.0
    assert run["regeneration"]["thinking_mix"] == {"true": 0.5, "false": 0.5}
    rows = read_committed(storage).collect()
    draw = SettingDraw(config.sampling, config.regeneration)
    recorded = rows.select("id", pl.col("sampling").struct.unnest())
    assert all(
        {k: r[k] for k in draw(r["id"]).record()} == draw(r["id"]).record()
        for r in recorded.iter_rows(named=True)
    )
    audit = json.loads(storage.read_bytes("report/audit.json"))
    assert len(audit["per_setting"]) == 4 and sum(f["rows"] for f in audit["per_setting"]) == 240
    check = next(c for c in audit["checks"] if c["name"] == "per_setting")
    assert check["status"] == "pass", check
    again = regenerate_completions(config, return_state=True)
    assert again.is_completed(), again.message
    assert read_committed(storage).collect()["id"].sort().equals(rows["id"].sort())
