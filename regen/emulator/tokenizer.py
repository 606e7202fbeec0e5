"""The emulated server's tokenizer and chat template: what its token ids are made of.

A real SGLang server renders the chat template from its tokenizer directory with
transformers' `apply_chat_template` and tokenizes the result; this one renders through
regen.lossmask.template, the one renderer regen has (transformers' environment and extras:
`strftime_now`, `{% generation %}`, the special tokens as variables, `tools`), so the audit's
template-parity check compares the model's template with what the server saw, not two
renderers of ours.

The bundled stand-in (regen/data/emulator-model) has one token per word, punctuation run or
newline (pair), words outside the emulator's own vocabulary being [UNK]. Generated text is
made only of single-token pieces, so response ids are looked up piece by piece, never
re-tokenized: cheap at thousands of requests per second.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from regen.errors import UserError
from regen.lossmask.template import ChatTemplate, load_template

log = logging.getLogger("regen.emulator")

BUNDLED = Path(__file__).resolve().parents[1] / "data" / "emulator-model"


class ChatTokenizer:
    """Prompt rendering and token ids of one tokenizer directory."""

    def __init__(self, template: ChatTemplate, source: Path) -> None:
        self._template = template
        self.source = source

    @classmethod
    def load(cls, path: str | Path | None) -> ChatTokenizer:
        """From a model or tokenizer directory; the bundled stand-in where it has no usable
        tokenizer.json or template (a Hub repo id, a directory of weights only)."""
        directory = Path(path).expanduser() if path else BUNDLED
        try:
            template, why = load_template(directory)
        except UserError as err:
            template, why = None, str(err)
        if template is None:
            if directory == BUNDLED:
                raise ValueError(f"the bundled emulator model is broken: {why}")
            log.warning("%s: no usable tokenizer (%s); using the bundled stand-in", directory, why)
            return cls.load(BUNDLED)
        return cls(template, directory)

    def render(
        self,
        messages: list[dict[str, Any]],
        kwargs: dict[str, Any],
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """The prompt text, generation prompt included; `kwargs` are what SGLang passes beside
        the messages (chat_template_kwargs, reasoning_effort). UserError when it fails."""
        return self._template.render(messages, add_generation_prompt=True, tools=tools, **kwargs)

    def encode(self, text: str) -> list[int]:
        return self._template.encode([text])[0]

    def tokenize(self, text: str) -> Any:
        """The tokenizers Encoding of `text` (ids and character offsets), none added."""
        return self._template.tokenizer.encode(text, add_special_tokens=False)

    def piece_ids(self, pieces: Iterable[str]) -> dict[str, int]:
        """Each piece's single token id; ValueError naming a piece that is not one token."""
        ids = {}
        for piece in pieces:
            found = self._template.tokenizer.encode(piece, add_special_tokens=False).ids
            if len(found) != 1:
                raise ValueError(f"{self.source}: {piece!r} is {len(found)} tokens, not one")
            ids[piece] = found[0]
        return ids
