"""What the features cost before they are paid for: bytes (tokens x layers x hidden x bytes a
value) and time at a prefill rate. One formula, for the plan's headline, `regen estimate`
and `regen check`'s storage row.

A token's file bytes: its `input_ids` (int32) and `loss_mask` (uint8), then aux + final
states: bf16 2 bytes a value; fp8 1 byte a value and a float32 scale per token and tensor.
The safetensors header (a few hundred bytes a sample) is left out: under 0.1 % of a sample.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from regen.config import FeatureDtype, RegenConfig
from regen.display.figures import byte_size
from regen.errors import ConfigError
from regen.features.layers import resolve
from regen.features.manifest import FeatureRecord
from regen.preflight.space import PROMPT_BYTES_PER_TOKEN, PromptFigures
from regen.storage import Storage

_IDS_AND_MASK = 4 + 1


def bytes_per_token(aux_layers: int, hidden: int, dtype: FeatureDtype) -> int:
    values = (aux_layers + 1) * hidden
    if dtype == "fp8":
        return values + 2 * 4 + _IDS_AND_MASK
    return 2 * values + _IDS_AND_MASK


@dataclass(frozen=True)
class FeatureSize:
    tokens: int
    aux_layers: int
    hidden: int
    dtype: FeatureDtype

    @classmethod
    def of(cls, record: FeatureRecord, tokens: int) -> FeatureSize:
        return cls(tokens, len(record.hidden_indices), record.hidden_size, record.dtype)

    @property
    def bytes(self) -> int:
        return self.tokens * bytes_per_token(self.aux_layers, self.hidden, self.dtype)

    @property
    def values(self) -> int:
        return self.tokens * (self.aux_layers + 1) * self.hidden

    def describe(self) -> str:
        per = bytes_per_token(self.aux_layers, self.hidden, self.dtype)
        return (
            f"{byte_size(self.bytes)} ({self.tokens:,} tokens x {self.aux_layers + 1} layers "
            f"x {self.hidden} hidden x {'1 B + scales' if self.dtype == 'fp8' else '2 B'}, "
            f"{per:,} B a token)"
        )

    def seconds(self, prefill_tok_s_per_gpu: float, gpus: int) -> float:
        return self.tokens / (prefill_tok_s_per_gpu * gpus)


@dataclass(frozen=True)
class PlannedFeatures:
    """What a config's `features:` section will write, before or after generation."""

    size: FeatureSize
    basis: str

    def line(self) -> str:
        return f"{self.size.describe()}; {self.basis}"


def model_shape_here(config: RegenConfig) -> tuple[int, int] | None:
    """(layers, hidden) from the model's config.json when this machine has it (a local
    source or the staged copy), else None: a laptop estimating a Hub model has no weights."""
    from regen.features.stage import model_shape

    for directory in (config.model.staged_path(), Path(config.model.source)):
        if (directory / "config.json").is_file():
            try:
                return model_shape(directory)
            except ConfigError:
                return None
    return None


def planned_features(
    config: RegenConfig, figures: PromptFigures, storage: Storage | None = None
) -> PlannedFeatures | str:
    """The features' size for the rows `figures` describe: at the tokens a sample the
    committed shards of `storage` hold when there are some, else each sample's prompt and its
    answer at `max_tokens` (PromptFigures.sample_tokens, the same figures as the rows'
    estimate). A string says why there is no figure."""
    features = config.features
    assert features is not None
    shape = model_shape_here(config)
    if shape is None:
        return "not sized: the model's config.json is not on this machine (its layers, hidden)"
    layers, hidden = shape
    try:
        aux = resolve(features, layers).aux
    except ConfigError as err:
        return f"not sized: {err}"
    tokens, basis = _tokens(config, figures, storage)
    return PlannedFeatures(FeatureSize(tokens, aux, hidden, features.dtype), basis)


def _tokens(
    config: RegenConfig, figures: PromptFigures, storage: Storage | None
) -> tuple[int, str]:
    if storage is not None:
        from regen.dataset.reader import read_committed
        from regen.lossmask.ids import sample_sizes

        try:
            committed = read_committed(storage)
            sizes = sample_sizes(committed.scan().select("id", "turns")).collect()
        except Exception:  # no dataset there yet, or not one regen can read
            sizes = None
        lengths = [] if sizes is None else sizes["seq_len"].drop_nulls().to_list()
        if lengths:
            mean = sum(lengths) / len(lengths)
            basis = f"{mean:,.0f} tokens a sample in the committed shards"
            return round(mean * figures.answers), basis
    max_tokens = config.sampling.max_tokens
    tokens = figures.sample_tokens(max_tokens)
    return tokens, (
        f"{figures.answers:,} samples, each its prompt (text / {PROMPT_BYTES_PER_TOKEN} B a token) "
        f"and its answer at max_tokens {max_tokens:,}"
    )
