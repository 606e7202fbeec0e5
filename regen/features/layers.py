"""Which hidden states a capture convention takes, in both numberings, and SGLang's flags.

SGLang 0.5.23 captures "before layer i": Qwen3's `set_eagle3_layers_to_capture`
(srt/models/qwen3.py:778-791) takes `[2, n // 2, n - 3]` of an n-layer target by default, and
for explicit ids `k + 1` (the output of layer k, as `--return-aux-hidden-state-layer-ids`
names them); `set_dflash_layers_to_capture` (:793-805) the same `k + 1` with ids required.
The input of layer i is the residual stream after i layers: transformers'
`output_hidden_states[i]` (index 0 is the embeddings). The final hidden state, after the
model's last norm, is `output_hidden_states[n]`, which SGLang keeps as `last_hidden_states`
(srt/layers/logits_processor.py:905-915) and SpecForge stores as `hidden_state`.

SpecForge (`set_capture_layers`, specforge/offline_capture/sglang_backend/capture.py:86-110) and
speculators (`resolve_target_layer_ids`, speculators/models/utils.py:111: `[2, n // 2, n - 3]`)
take the same EAGLE-3 default, so one capture serves both trainers.
"""

from __future__ import annotations

from dataclasses import dataclass

from regen.config import FeaturesConfig
from regen.errors import ConfigError


@dataclass(frozen=True)
class CaptureLayers:
    """The captured states of one target: `hidden_indices` in transformers' numbering."""

    convention: str
    layer_ids: tuple[int, ...] | None
    """As configured (SGLang's --return-aux-hidden-state-layer-ids), None for the default."""
    hidden_indices: tuple[int, ...]
    """Each aux state's index into transformers' output_hidden_states, in capture order."""
    num_layers: int

    @property
    def aux(self) -> int:
        return len(self.hidden_indices)

    def flags(self) -> list[str]:
        """The launch flags that make a server capture these layers (and no draft run)."""
        flags = ["--enable-return-aux-hidden-states", "--speculative-algorithm"]
        flags.append(self.convention.upper())
        if self.layer_ids is not None:
            flags += ["--return-aux-hidden-state-layer-ids", *map(str, self.layer_ids)]
        return flags


def resolve(features: FeaturesConfig, num_layers: int) -> CaptureLayers:
    """The layers of `features` on an n-layer target; ConfigError when one does not exist or
    the default EAGLE-3 layers collapse (a target too shallow to have three)."""
    ids = features.layer_ids
    indices: tuple[int, ...]
    if ids is None:
        indices = (2, num_layers // 2, num_layers - 3)
        if len(set(indices)) != 3 or min(indices) < 1:
            raise ConfigError(
                f"features: the EAGLE-3 default layers {list(indices)} of a {num_layers}-layer "
                "model are not three distinct layers; set features.layer_ids"
            )
    else:
        # The last layer's output is the final hidden state, stored on its own (hidden_state):
        # SGLang cannot capture it as an aux state (nothing runs after it).
        too_deep = [k for k in ids if k >= num_layers - 1]
        if too_deep:
            raise ConfigError(
                f"features.layer_ids {too_deep}: a {num_layers}-layer model's aux states are "
                f"layers 0-{num_layers - 2} (its last layer's output is the stored hidden_state)"
            )
        # SGLang captures in layer order, whatever order the ids are given in.
        indices = tuple(sorted(k + 1 for k in ids))
    return CaptureLayers(
        features.convention, None if ids is None else tuple(ids), tuple(indices), num_layers
    )
