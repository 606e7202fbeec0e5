"""The emulated server's tokenizer and chat template: what its token ids are made of.

A real SGLang server renders the chat template from its tokenizer directory and tokenizes the
result; so does this one, with the `tokenizers` library on that directory's `tokenizer.json`
and the template rendered the way Hugging Face renders it. A trainer that renders a stored
conversation with the same files therefore gets the same ids the server returned.

The bundled stand-in (regen/data/emulator-model) has one token per word, punctuation run or
newline (pair), words outside the emulator's own vocabulary being [UNK]. Generated text is
made only of single-token pieces, so response ids are looked up piece by piece, never
re-tokenized: cheap at thousands of requests per second.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
from jinja2 import Template
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

log = logging.getLogger("regen.emulator")

BUNDLED = Path(__file__).resolve().parents[1] / "data" / "emulator-model"


class ChatTokenizer:
    """Prompt rendering and token ids of one tokenizer directory."""

    def __init__(self, tokenizer: Tokenizer, template: Template, source: Path) -> None:
        self._tokenizer = tokenizer
        self._template = template
        self.source = source

    @classmethod
    def load(cls, path: str | Path | None) -> ChatTokenizer:
        """From a model or tokenizer directory; the bundled stand-in where it has no usable
        tokenizer.json or template (a Hub repo id, a directory of weights only)."""
        directory = Path(path).expanduser() if path else BUNDLED
        try:
            tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
            template = _compile(chat_template(directory))
        except Exception as err:  # tokenizers raises bare Exceptions on a bad file
            if directory == BUNDLED:
                raise
            log.warning("%s: no usable tokenizer (%s); using the bundled stand-in", directory, err)
            return cls.load(BUNDLED)
        return cls(tokenizer, template, directory)

    def render(self, messages: list[dict[str, Any]], kwargs: dict[str, Any]) -> str:
        """The prompt text, generation prompt included; `kwargs` are the request's
        chat_template_kwargs (enable_thinking), passed to the template as SGLang does."""
        return self._template.render(**kwargs, messages=messages, add_generation_prompt=True)

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def piece_ids(self, pieces: Iterable[str]) -> dict[str, int]:
        """Each piece's single token id; ValueError naming a piece that is not one token."""
        ids = {}
        for piece in pieces:
            found = self._tokenizer.encode(piece, add_special_tokens=False).ids
            if len(found) != 1:
                raise ValueError(f"{self.source}: {piece!r} is {len(found)} tokens, not one")
            ids[piece] = found[0]
        return ids


def chat_template(directory: Path) -> str:
    """`chat_template.jinja` if present, else tokenizer_config.json's `chat_template`, as
    transformers looks them up."""
    jinja = directory / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    config = json.loads((directory / "tokenizer_config.json").read_text())
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    if not isinstance(template, str):
        raise ValueError("tokenizer_config.json has no chat_template")
    return template


@lru_cache(maxsize=8)
def _compile(source: str) -> Template:
    # transformers' _compile_jinja_template: the same environment, so whitespace matches.
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
    env.globals["raise_exception"] = _raise
    return env.from_string(source)


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)
