"""What a trainer has: the bundled model directory's tokenizer.json and chat template, rendered
the way Hugging Face renders it. The emulator's token ids must agree with both."""

from __future__ import annotations

import json
from typing import Any

from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from support.emulator import MODEL_DIR

IM_END = 82
TOKENIZER = Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))
_ENV = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
# transformers' tojson (what the template's tools are written with): key order kept, no HTML
# escaping, unlike jinja's own.
_ENV.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
TEMPLATE = _ENV.from_string(
    json.loads((MODEL_DIR / "tokenizer_config.json").read_text())["chat_template"]
)


def ids(text: str) -> list[int]:
    return list(TOKENIZER.encode(text, add_special_tokens=False).ids)


def rendered(messages: Any, generation_prompt: bool, **kwargs: Any) -> list[int]:
    """The conversation's ids as the template renders it (chat_template_kwargs in kwargs)."""
    return ids(
        TEMPLATE.render(messages=messages, add_generation_prompt=generation_prompt, **kwargs)
    )


def response_ids(reasoning: str | None, content: str) -> list[int]:
    """What the model generated for a parsed answer: the tags back around the reasoning."""
    thought = f"<think>{reasoning}</think>" if reasoning is not None else ""
    return [*ids(thought + content), IM_END]
