"""The template path: a turn's prompt and response tokens, found by rendering prefixes.

For assistant turn j the prompt is the conversation before it rendered with
`add_generation_prompt` (what the server was sent) and the response is what rendering
through turn j adds to that text. No model needs code of its own: the template itself says
where an answer starts, drops earlier reasoning (Qwen3) or adds an empty think block
(enable_thinking false). The response ends at the model's stop token, as a generation does:
what a template writes after it (Qwen's "\\n" after <|im_end|>) was never generated and is
not trained on; a turn cut off by max_tokens (finish_reason "length") has no stop token.
"""

from __future__ import annotations

from typing import Any

from regen.lossmask.conversation import TurnInput
from regen.lossmask.template import ChatTemplate


def template_kwargs(turn: TurnInput, enable_thinking: bool) -> dict[str, Any]:
    """What the client sent beside the messages: chat_template_kwargs and reasoning_effort.
    `enable_thinking` is the run's, for a turn whose row recorded none."""
    thinking = enable_thinking if turn.enable_thinking is None else turn.enable_thinking
    kwargs: dict[str, Any] = {"enable_thinking": thinking}
    if turn.reasoning_effort is not None:
        kwargs["reasoning_effort"] = turn.reasoning_effort
    return kwargs


def render_prompts(
    template: ChatTemplate, turns: list[TurnInput], enable_thinking: bool
) -> list[str]:
    """Each turn's prompt text, as the server rendered it."""
    return [
        template.render(
            t.prompt,
            add_generation_prompt=True,
            tools=t.tools,
            **template_kwargs(t, enable_thinking),
        )
        for t in turns
    ]


def token_ids_from_template(
    template: ChatTemplate, turns: list[TurnInput], enable_thinking: bool
) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids) of each turn, from the model's template and tokenizer."""
    prompts = render_prompts(template, turns, enable_thinking)
    heads: list[str] = []
    tails: list[str] = []
    for turn, prompt in zip(turns, prompts, strict=True):
        full = template.render(
            [*turn.prompt, turn.answer],
            add_generation_prompt=False,
            tools=turn.tools,
            **template_kwargs(turn, enable_thinking),
        )
        # A generation prompt that the full render does not extend (a think scaffold the
        # template drops once the answer is there): the answer starts where they part.
        cut = len(prompt) if full.startswith(prompt) else _common_prefix(prompt, full)
        heads.append(full[:cut] if cut < len(prompt) else prompt)
        tails.append(full[cut:])
    prompt_ids = template.encode(heads)
    response_ids = template.encode(tails)
    return [
        (p, _generated(r, template.stop_ids, t.finish_reason))
        for p, r, t in zip(prompt_ids, response_ids, turns, strict=True)
    ]


def _common_prefix(a: str, b: str) -> int:
    return next(
        (k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def _generated(ids: list[int], stops: frozenset[int], finish_reason: str | None) -> list[int]:
    """The response up to and including its last stop token (excluding it when cut off)."""
    last = next((k for k in range(len(ids) - 1, -1, -1) if ids[k] in stops), None)
    if last is None:
        return ids
    return ids[:last] if finish_reason == "length" else ids[: last + 1]
