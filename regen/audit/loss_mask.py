"""Check 10: how many assistant tokens a trainer learns from, with the model's own tokenizer.

The assistant turn is rendered the way Qwen-style chat templates render it,

    <|im_start|>assistant\\n<think>\\n{reasoning}\\n</think>\\n\\n{content}<|im_end|>

and everything after the `<|im_start|>assistant\\n` header is the loss mask. The template in
tokenizer_config.json is not executed: that needs jinja and the whole conversation, and a
per-row template run is far too slow for a million rows. For the incident's answer,
`<think>\\n\\n</think>\\n\\nOK.<|im_end|>`, a Qwen tokenizer counts 6 tokens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from regen.audit.result import Check, Example, grade
from regen.audit.thresholds import AuditConfig
from regen.errors import UserError


def render_assistant_turn() -> pl.Expr:
    """The loss-masked text of each row, as the Qwen3 template joins reasoning and answer."""
    reasoning = pl.col("reasoning_content").fill_null("").str.strip_chars("\n")
    content = pl.col("content").fill_null("").str.strip_chars_start("\n")
    return pl.format("<think>\n{}\n</think>\n\n{}<|im_end|>", reasoning, content)


class LossMaskCounter:
    """Counts loss-mask tokens of a batch of rows with a `tokenizers` tokenizer.json."""

    def __init__(self, tokenizer: Any, chunk: int = 4096) -> None:
        self._tokenizer = tokenizer
        # Encodings carry offsets and masks too: encoding a whole batch at once holds GBs.
        self._chunk = chunk

    @classmethod
    def load(cls, path: Path) -> LossMaskCounter:
        """From a tokenizer.json or a model directory that has one."""
        from tokenizers import Tokenizer  # optional dependency: regen[tokenizer]

        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise UserError(f"{file}: tokenizer.json not found (set model.tokenizer_path)")
        try:
            return cls(Tokenizer.from_file(str(file)))
        except Exception as err:  # the library raises a bare Exception on a bad file
            raise UserError(f"{file}: not a valid tokenizer.json: {err}") from None

    def __call__(self, batch: pl.DataFrame) -> pl.Series:
        texts = batch.select(render_assistant_turn()).to_series().to_list()
        lengths: list[int] = []
        for start in range(0, len(texts), self._chunk):
            part = texts[start : start + self._chunk]
            encodings = self._tokenizer.encode_batch_fast(part, add_special_tokens=False)
            lengths.extend(len(e.ids) for e in encodings)
        counts = pl.Series("loss_tokens", lengths, dtype=pl.Int64)
        # Error rows are not training samples: their count is left null.
        return pl.select(pl.when(batch["is_error"].not_()).then(counts)).to_series()


def load_counter(path: Path | None) -> tuple[LossMaskCounter | None, str]:
    """The counter, or None and why the check is skipped."""
    if path is None:
        return None, "no tokenizer given (model.tokenizer_path): loss mask not measured"
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        return None, "the tokenizers library is not installed (pip install 'regen[tokenizer]')"
    return LossMaskCounter.load(path), ""


def loss_mask_check(ok: pl.DataFrame | None, config: AuditConfig, skipped: str) -> Check:
    """The share of samples whose loss mask is at most `min_loss_tokens` tokens."""
    name, title = "loss_mask", "10 loss-mask tokens"
    if ok is None:
        return Check(name=name, title=title, status="skipped", figure=None, detail=skipped)
    if ok.height == 0:
        return Check(name=name, title=title, status="skipped", figure=None, detail="no completions")
    limit = config.min_loss_tokens
    short = ok.filter(pl.col("loss_tokens") <= limit)
    rate = short.height / ok.height
    q = ok.select(pl.col("loss_tokens").quantile(p).alias(str(p)) for p in (0.01, 0.5, 0.99)).row(0)
    shown = short.head(config.max_examples).select("id", "loss_tokens")
    return Check(
        name=name,
        title=title,
        status=grade(rate, config.loss_mask_short),
        figure=rate,
        warn=config.loss_mask_short.warn,
        fail=config.loss_mask_short.fail,
        examples=[Example(id=i, reason=f"{n} loss tokens") for i, n in shown.iter_rows()],
        detail=f"{short.height} of {ok.height} samples learn from <= {limit} tokens; "
        f"p1 {q[0]:g}, p50 {q[1]:g}, p99 {q[2]:g}",
    )
