"""The one loss-mask function: what a trainer learns from, for the audit and every export.

A training sample is one assistant turn: `input_ids` is the prompt as the server's chat
template rendered it followed by the tokens the model generated; `loss_mask` is 0 over the
prompt and 1 over the response. With the server's own ids (`turns[*].prompt_token_ids` and
`response_token_ids`) nothing is approximated (regen.lossmask.ids); without them (an older
dataset, a server that returns none) the model's own chat template and tokenizer give them
(regen.lossmask.template, regen.lossmask.spans). `samples` picks per turn.
"""

from regen.lossmask.ids import Turns, samples_from_ids
from regen.lossmask.samples import ROW_COLUMNS, lacks_ids, samples
from regen.lossmask.template import ChatTemplate, load_template, load_tokenizer

__all__ = [
    "ROW_COLUMNS",
    "ChatTemplate",
    "Turns",
    "lacks_ids",
    "load_template",
    "load_tokenizer",
    "samples",
    "samples_from_ids",
]
