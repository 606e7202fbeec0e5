"""Language switch: the prompt is mostly Latin script, the answer mostly CJK.

Qwen models drift into Chinese, above all at a high temperature or deep in a long thinking;
a draft trained on those answers learns the drift. "Mostly" is more than half of a text's
characters. A prompt that is itself mostly CJK (or Cyrillic, Greek, ...) is no switch, nor
is an answer that quotes a few CJK words.

Measured without a pass per letter, which would cost more than every other row check
together: an answer's CJK characters are counted by one regex (a text with none is scanned,
not matched), and a prompt is mostly Latin when its UTF-8 bytes outnumber its characters by
less than half: ASCII letters, digits and punctuation take one byte, accented Latin letters
two (a French prompt passes), CJK three and Cyrillic two on every letter.
"""

from __future__ import annotations

import polars as pl

from regen.audit.checks.base import FlagCheck
from regen.audit.features import answered
from regen.config import AuditConfig

CJK = r"[\p{Han}\p{Hiragana}\p{Katakana}\p{Hangul}]"
MOSTLY = 0.5


def cjk_share(text: pl.Expr) -> pl.Expr:
    """The share of a text's characters that are CJK (0 for an empty text)."""
    chars = text.str.len_chars()
    return pl.when(chars > 0).then(text.str.count_matches(CJK) / chars).otherwise(0.0)


def mostly_latin(text: pl.Expr) -> pl.Expr:
    """Whether a text is mostly single-byte characters (false for an empty text)."""
    chars = text.str.len_chars()
    return (chars > 0) & ((text.str.len_bytes() - chars) < MOSTLY * chars)


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
        share = pl.when(answered()).then(cjk_share(pl.col("content").fill_null("")))
        return [
            share.alias("_cjk_share"),
            (mostly_latin(prompt_text()) & (share > MOSTLY)).fill_null(False).alias(self.name),
        ]

    def reason(self, config: AuditConfig) -> pl.Expr:
        return pl.format(
            "{}% of the answer's characters CJK, prompt Latin",
            (100 * pl.col("_cjk_share")).round(0).cast(pl.Int64),
        )


CHECK = LanguageSwitch()
