"""Template parity: does the model directory's template render what the server was sent?

A trainer that re-renders text with another template than the server used trains on
token sequences the target never saw (SpecForge #296). Where a turn stores the server's
`prompt_token_ids`, rendering its prompt here and comparing tokens finds that at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from regen.lossmask.conversation import TurnInput
from regen.lossmask.spans import render_prompts
from regen.lossmask.template import ChatTemplate


@dataclass(frozen=True)
class PromptDifference:
    """The first token where a stored prompt and the template's rendering part."""

    id: str
    turn: int
    position: int
    stored: int | None
    """Token id the server had there; None when its prompt ended first."""
    rendered: int | None
    stored_len: int
    rendered_len: int


def prompt_differences(
    template: ChatTemplate, turns: list[TurnInput], enable_thinking: bool
) -> list[PromptDifference]:
    """One entry per turn (with stored prompt ids) whose rendered prompt differs."""
    compared = [t for t in turns if t.prompt_token_ids is not None]
    rendered = template.encode(render_prompts(template, compared, enable_thinking))
    out = []
    for turn, mine in zip(compared, rendered, strict=True):
        stored = list(turn.prompt_token_ids or [])
        if stored == mine:
            continue
        k = next((i for i, (a, b) in enumerate(zip(stored, mine, strict=False)) if a != b), None)
        k = min(len(stored), len(mine)) if k is None else k
        out.append(
            PromptDifference(
                id=turn.id,
                turn=turn.turn,
                position=k,
                stored=stored[k] if k < len(stored) else None,
                rendered=mine[k] if k < len(mine) else None,
                stored_len=len(stored),
                rendered_len=len(mine),
            )
        )
    return out
