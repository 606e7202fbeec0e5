"""A Qwen3-style model directory for the template path: its real chat template, verbatim in
structure (system, last-query index, earlier reasoning dropped, enable_thinking scaffold,
tools), a tiny tokenizer, and the stop tokens a Qwen model directory declares."""

# ruff: noqa: E501 (the template is kept as Qwen3 ships it, one statement per line)
from __future__ import annotations

import json
from pathlib import Path

QWEN3_TEMPLATE = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {{- '<|im_start|>user\\n<tool_response>\\n' + content + '\\n</tool_response><|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}
"""

SPECIALS = ["[UNK]", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]


def word_tokenizer(model_dir: Path, words: list[str] | None = None) -> Path:
    """A WordLevel tokenizer.json: one token per word, per newline run and per special token,
    so `<think>\\n\\n</think>\\n\\nOK.<|im_end|>` is exactly 6 tokens."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"\n+|[^\s]+"), behavior="removed", invert=True)
    trainer = trainers.WordLevelTrainer(special_tokens=SPECIALS)
    corpus = ["OK.", "The answer is 42.", "Let me think.\n\nYes.", "user\nassistant\nsystem"]
    tok.train_from_iterator(corpus + (words or []), trainer)
    model_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(model_dir / "tokenizer.json"))
    return model_dir


def write_chat_template(model_dir: Path, template: str = QWEN3_TEMPLATE) -> Path:
    """tokenizer_config.json as a Qwen3 model ships it: the template, eos <|im_end|>, and
    generation_config.json's stop ids (<|im_end|> and <|endoftext|>)."""
    config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": {"content": "<|endoftext|>", "special": True, "__type": "AddedToken"},
        "chat_template": template,
    }
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config))
    ids = {t: i for i, t in enumerate(SPECIALS)}
    stops = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    (model_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": stops}))
    return model_dir


def qwen3_model_dir(model_dir: Path, words: list[str] | None = None) -> Path:
    """A model directory the template path reads: tokenizer and Qwen3 chat template."""
    return write_chat_template(word_tokenizer(model_dir, words))
