"""The one loss-mask function: what a trainer learns from, for the audit and every export.

A training sample is one assistant turn: `input_ids` is the prompt as the server's chat
template rendered it followed by the tokens the model generated; `loss_mask` is 0 over the
prompt and 1 over the response. With the server's own ids (`turns[*].prompt_token_ids` and
`response_token_ids`) nothing is approximated (regen.lossmask.ids); without them (an older
dataset, a server that returns none) the model's own chat template and tokenizer give them
(regen.lossmask.template, regen.lossmask.spans). `samples` picks per turn.

The names below load on first use: the emulator renders through regen.lossmask.template and
must not pay for polars (half a second at every server start) that only samples need.
(`samples` lives in per_turn.py: a submodule named like a name exported here would shadow it.)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from regen.lossmask.ids import samples_from_ids
    from regen.lossmask.per_turn import ROW_COLUMNS, lacks_ids, samples
    from regen.lossmask.template import ChatTemplate, load_template, load_tokenizer

_WHERE = {
    "samples_from_ids": "ids",
    "ROW_COLUMNS": "per_turn", "lacks_ids": "per_turn", "samples": "per_turn",
    "ChatTemplate": "template", "load_template": "template", "load_tokenizer": "template",
}  # fmt: skip

__all__ = [
    "ROW_COLUMNS",
    "ChatTemplate",
    "lacks_ids",
    "load_template",
    "load_tokenizer",
    "samples",
    "samples_from_ids",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
