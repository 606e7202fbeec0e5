"""The model's own chat template and tokenizer, rendered the way Hugging Face transformers does.

Trainers (SpecForge, speculators, TRL) and SGLang all call `tokenizer.apply_chat_template`,
which renders the template in a jinja2 sandbox with a few extras (`tojson`, `raise_exception`,
`strftime_now`, the `{% generation %}` tag, the tokenizer's special tokens as variables) and
tokenizes the text without adding special tokens. Doing the same here, with only jinja2 and
`tokenizers`, gives the tokens a trainer would see without transformers or model code.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from regen.errors import UserError

_SPECIAL = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
            "mask_token")  # fmt: skip


class _Generation(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` renders its body: templates written for
    transformers' assistant masks must still compile (the spans come from prefixes here)."""

    tags = {"generation"}  # noqa: RUF012 (jinja's own declaration of the attribute)

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_body")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return str(caller())


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # jinja's own tojson escapes HTML characters, which no chat template expects.
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=8)
def compile_template(source: str) -> jinja2.Template:
    """The template compiled as transformers compiles it (same environment and extras)."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


@dataclass(frozen=True)
class ChatTemplate:
    """A model directory's chat template, special tokens and tokenizer."""

    path: Path
    """Where the template came from (chat_template.jinja or tokenizer_config.json)."""
    template: jinja2.Template
    special_tokens: dict[str, str]
    tokenizer: Any  # tokenizers.Tokenizer: imported lazily, like every heavy dependency
    stop_ids: frozenset[int]
    """Tokens that end a generated turn (eos_token, generation_config's eos_token_id)."""

    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool,
        tools: list[dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> str:
        """The conversation as text; `kwargs` are chat_template_kwargs (enable_thinking...),
        `tools` the request's tool definitions (the emulator's; stored rows hold none)."""
        try:
            return self.template.render(
                messages=messages,
                tools=tools,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **self.special_tokens,
                **kwargs,
            )
        except jinja2.exceptions.TemplateError as err:
            raise UserError(f"{self.path}: the chat template failed: {err}") from None

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, special tokens as they appear (none added), as
        `apply_chat_template(tokenize=True)` and SGLang tokenize a rendered prompt."""
        encodings = self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)
        return [e.ids for e in encodings]

    def is_special(self, token_id: int) -> bool:
        """An added token such as <|im_start|>: template scaffolding, never user text."""
        decoder = self.tokenizer.get_added_tokens_decoder()
        return token_id in decoder and bool(decoder[token_id].special)

    def token_text(self, token_id: int) -> str:
        return str(self.tokenizer.id_to_token(token_id))


def load_tokenizer(path: Path) -> Any:
    """A `tokenizers` Tokenizer from a tokenizer.json or a directory that has one."""
    from tokenizers import Tokenizer

    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise UserError(f"{file}: tokenizer.json not found (set model.tokenizer_path)")
    try:
        return Tokenizer.from_file(str(file))
    except Exception as err:  # the library raises a bare Exception on a bad file
        raise UserError(f"{file}: not a valid tokenizer.json: {err}") from None


def template_source(model_dir: Path) -> tuple[Path, str] | None:
    """The chat template text and its file; chat_template.jinja wins, as in transformers."""
    jinja_file = model_dir / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file, jinja_file.read_text()
    config = _read_json(model_dir / "tokenizer_config.json")
    value = config.get("chat_template")
    if isinstance(value, list):  # named templates: [{"name": "default", "template": ...}]
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("default")
    if isinstance(value, str) and value:
        return model_dir / "tokenizer_config.json", value
    return None


def load_template(path: Path) -> tuple[ChatTemplate | None, str]:
    """The model's template and tokenizer, or None and why (no template in the directory).

    `path` is a model directory or its tokenizer.json; a missing or broken tokenizer is a
    UserError, a directory without a chat template is not (the ids path needs none)."""
    tokenizer = load_tokenizer(path)
    model_dir = path if path.is_dir() else path.parent
    found = template_source(model_dir)
    if found is None:
        return None, f"{model_dir}: no chat template (tokenizer_config.json or chat_template.jinja)"
    file, source = found
    try:
        template = compile_template(source)
    except jinja2.exceptions.TemplateSyntaxError as err:
        raise UserError(f"{file}: the chat template does not compile: {err}") from None
    config = _read_json(model_dir / "tokenizer_config.json")
    special = {k: t for k in _SPECIAL if (t := _token_text(config.get(k))) is not None}
    stops = {tokenizer.token_to_id(special["eos_token"])} if "eos_token" in special else set()
    eos = _read_json(model_dir / "generation_config.json").get("eos_token_id")
    stops.update(eos if isinstance(eos, list) else [eos])
    stop_ids = frozenset(i for i in stops if isinstance(i, int))
    return ChatTemplate(file, template, special, tokenizer, stop_ids), ""


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_json(file: Path) -> dict[str, Any]:
    if not file.is_file():
        return {}
    try:
        data = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"{file}: not valid JSON: {err}") from None
    return data if isinstance(data, dict) else {}
