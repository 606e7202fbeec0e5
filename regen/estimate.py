"""`regen estimate`: how long a prompt set takes on N GPUs, and how big its dataset gets,
before the GPUs are rented.

The plan's own figures (the prompts as the run reads and validates them, the answers
`regeneration.turns` asks for, `sampling.max_tokens`) times a per-GPU decode rate: one given
(`--tok-s-per-gpu`, from a vendor's figure or an earlier run) or measured on the node by the
fleet's micro-benchmark (`engine.bench`, each server's `probe tok/s` in a dataset's
`report/fleet.json`). The answers are regen.conversations' turns, tool loop steps included,
the most a row can have, so every answer at `max_tokens` bounds the output tokens; the time is
not bounded by it (the rate is an estimate, and a run's batch goes faster or slower than the
benchmark's), so it is said as the time at that rate. Few answers reach `max_tokens`, so
`--mean-tokens` (a typical answer's length, e.g. an earlier audit's completion p50) gives the
likely figure beside it. The size is the provisioning check's estimate
(`regen.preflight.space`), one owner for both, here over every prompt: an estimate, not a bound
(a bound on the bytes of text is too loose to plan a disk by; that module says why).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from regen.config import RegenConfig
from regen.display.figures import byte_size, compact, count, duration, sig
from regen.errors import UserError
from regen.features.sizes import PlannedFeatures, planned_features
from regen.preflight.space import OutputEstimate, PromptFigures, first_estimate
from regen.storage import Storage


@dataclass(frozen=True)
class Rate:
    """Output tokens a second one GPU decodes, and where the figure came from."""

    tok_s_per_gpu: float
    basis: str


@dataclass(frozen=True)
class Estimate:
    """The plan's work at a rate on some GPUs."""

    prompts: int
    rejected: int
    answers: int
    turns: str
    max_tokens: int
    mean_tokens: float | None
    rate: Rate
    gpus: list[int]
    size: OutputEstimate
    features: PlannedFeatures | str | None = None
    """The `features:` section's size (or why there is none); None without the section."""
    prefill_tok_s: float | None = None

    @property
    def max_output_tokens(self) -> int:
        return self.answers * self.max_tokens

    def hours(self, gpus: int, tokens_per_answer: float) -> float:
        return self.answers * tokens_per_answer / (self.rate.tok_s_per_gpu * gpus) / 3600

    def lines(self) -> list[str]:
        """The estimate as `label: text` lines."""
        answers = (
            f"{self.answers:,} answers (regeneration.turns {self.turns})"
            if self.answers != self.prompts
            else f"{self.answers:,} answers"
        )
        rows: list[tuple[str, str]] = [
            ("plan", f"{self.prompts:,} prompts ({self.rejected:,} rejected), {answers}, "
                     f"max_tokens {self.max_tokens:,}"),
            ("tokens", self._tokens()),
            ("rate", f"{sig(self.rate.tok_s_per_gpu)} output tok/s per GPU ({self.rate.basis})"),
        ]  # fmt: skip
        for n in self.gpus:
            rows.append((f"{n} GPU{'s' if n > 1 else ''}", self._time(n)))
        rows.append(("size", f"about {byte_size(self.size.size)} (estimated: {self.size.basis})"))
        rows += self._features()
        width = max(len(label) for label, _ in rows) + 1
        return [f"{label + ':':<{width}} {text}" for label, text in rows]

    def _features(self) -> list[tuple[str, str]]:
        """The features' size, and their time at the prefill rate on each GPU count."""
        if self.features is None:
            return []
        if isinstance(self.features, str):
            return [("features", self.features)]
        rows = [("features", self.features.line())]
        if self.prefill_tok_s is None:
            rows.append(("prefill", "give --prefill-tok-s-per-gpu for the features' time"))
            return rows
        for n in self.gpus:
            seconds = self.features.size.seconds(self.prefill_tok_s, n)
            rows.append((f"features on {n}", f"about {duration(seconds)} at "
                         f"{sig(self.prefill_tok_s)} prefill tok/s per GPU"))  # fmt: skip
        return rows

    def _tokens(self) -> str:
        # Exact: a bound shown rounded (4,100M for 4,096,000,000) reads as another figure.
        bound = (
            f"at most {count(self.max_output_tokens)} output tokens (every answer at max_tokens)"
        )
        if self.mean_tokens is None:
            return bound
        likely = compact(self.answers * self.mean_tokens)
        return f"about {likely} at {sig(self.mean_tokens)} tokens an answer; {bound}"

    def _time(self, gpus: int) -> str:
        # Not a bound: the rate is an estimate too, so the longest answers' time is said as
        # the time at that rate, never as `at most`.
        seconds = self.hours(gpus, self.max_tokens) * 3600
        longest = f"{duration(seconds)} with every answer at max_tokens"
        if self.mean_tokens is None:
            return longest
        return f"about {duration(self.hours(gpus, self.mean_tokens) * 3600)}; {longest}"


def measured_rate(storage: Storage) -> Rate:
    """The fleet benchmark's per-GPU rate on the node that made a dataset: the median of its
    healthy servers' `probe tok/s` in `report/fleet.json`."""
    from regen.fleet.report import read_fleet_report

    rows = read_fleet_report(storage)
    if rows is None:
        raise UserError(f"{storage.uri}: no report/fleet.json (no fleet was benchmarked there)")
    speeds = [r.tok_s for r in rows if r.status == "healthy" and r.tok_s]
    if not speeds:
        raise UserError(f"{storage.uri}/report/fleet.json: no server's speed was measured")
    median = statistics.median(speeds)
    return Rate(median, f"the fleet benchmark's median of {len(speeds)} servers, {storage.uri}")


def estimate(
    config: RegenConfig,
    rate: Rate,
    gpus: list[int] | None = None,
    mean_tokens: float | None = None,
    prefill_tok_s: float | None = None,
) -> Estimate:
    """The plan's figures for `config`, read as the run reads its prompts, at `rate` on each
    of `gpus` (default the config's servers)."""
    from regen.prompts import load_prompts, read_options

    prompts = load_prompts(config.prompts, options=read_options(config.input))
    turns = config.regeneration.turns
    figures = PromptFigures.of(prompts.valid, turns)
    return Estimate(
        prompts=prompts.num_valid,
        rejected=prompts.num_rejected,
        answers=figures.answers,
        turns=turns,
        max_tokens=config.sampling.max_tokens,
        mean_tokens=mean_tokens,
        rate=rate,
        gpus=gpus or [config.engine.num_servers],
        size=first_estimate(config, figures),
        features=planned_features(config, figures) if config.features else None,
        prefill_tok_s=prefill_tok_s,
    )
