"""Language switch: the prompt is mostly Latin script, the answer mostly CJK.

Qwen models drift into Chinese, above all at a high temperature or deep in a long thinking;
a draft trained on those answers learns the drift. Scripts are counted in letters (a Han
character is one, as a Latin letter is), so "mostly" is more than half of a text's letters.
A prompt that is itself mostly CJK, or an answer in another Latin language, is no switch.
"""

from __future__ import annotations

import polars as pl

from regen.audit.checks.base import FlagCheck
from regen.audit.features import answered
from regen.config import AuditConfig

LATIN = r"\p{Latin}"
CJK = r"[\p{Han}\p{Hiragana}\p{Katakana}\p{Hangul}]"
MOSTLY = 0.5


def script_share(text: pl.Expr, script: str) -> pl.Expr:
    """The share of a text's letters in `script` (0 for a text without letters)."""
    letters = text.str.count_matches(r"\p{L}")
    return pl.when(letters > 0).then(text.str.count_matches(script) / letters).otherwise(0.0)


def prompt_text() -> pl.Expr:
    """The conversation's user messages, joined: what the model was asked, in its language."""
    user = pl.element().struct.field("role") == "user"
    said = pl.col("messages").list.eval(pl.element().filter(user).struct.field("content"))
    return said.list.join("\n").fill_null("")


class LanguageSwitch(FlagCheck):
    name = "language_switch"
    title = "language switch"
    threshold = "language_switch"
    detail = "answer mostly in CJK script to a prompt mostly in Latin script"
    # A model's drift, not a server's: every server runs the same weights.
    per_server = False

    def facts(self, config: AuditConfig) -> list[pl.Expr]:
        answer = pl.col("content").fill_null("")
        switched = (script_share(prompt_text(), LATIN) > MOSTLY) & (
            script_share(answer, CJK) > MOSTLY
        )
        return [
            (answered() & switched).alias(self.name),
            pl.when(answered()).then(script_share(answer, CJK)).alias("_cjk_share"),
        ]

    def reason(self, config: AuditConfig) -> pl.Expr:
        return pl.format(
            "{}% of the answer's letters CJK, prompt Latin",
            (100 * pl.col("_cjk_share")).round(0).cast(pl.Int64),
        )


CHECK = LanguageSwitch()
