"""The emulated model: token counting, the history digest, and deterministic outputs.

A "token" is a word or a run of punctuation (`\\w+|[^\\w\\s]+`), the rule of the bundled
stand-in tokenizer (a `Whitespace` pre-tokenizer), so counts made here and counts made
with that tokenizer agree. Outputs depend only on (message history, seed): the same
prompt always gets the same answer, and the answer names the history it saw.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
from dataclasses import dataclass
from typing import Any

from regen.emulator.faults import OUTPUT_FAULTS, Faults

TOKEN = re.compile(r"\w+|[^\w\s]+")
EOS_TOKEN_ID = 248046  # Qwen3.6's <|im_end|>, what real servers report as matched_stop
# <|im_start|>, the role and <|im_end|> around each message; <|im_start|>assistant at the end.
MESSAGE_OVERHEAD = 3
GENERATION_PROMPT = 2
# Pieces of "[history:xxxxxxxx]", each one token, so a cut answer still tokenises the same.
TAG_TOKENS = 5
EMPTY_ANSWER = "OK."
EMPTY_ANSWER_TOKENS = 6  # <think> \n\n </think> \n\n OK. <|im_end|>, the incident's loss mask
LOOP_LINE = "Wait , let me check the answer again ."
RUNAWAY_CAP = 32768  # longest runaway output a fault makes when nothing else limits it
_POOL_SIZE = 4096
_VOCAB = (
    "the",
    "a",
    "of",
    "to",
    "and",
    "is",
    "in",
    "that",
    "we",
    "so",
    "this",
    "it",
    "for",
    "value",
    "step",
    "check",
    "case",
    "first",
    "then",
    "next",
    "answer",
    "number",
    "result",
    "sum",
    "count",
    "list",
    "each",
    "term",
    "order",
    "left",
    "right",
    "part",
    "total",
    "since",
    "because",
    "means",
    "gives",
    "need",
    "known",
    "given",
    "also",
    "now",
    "try",
    "again",
    "small",
    "large",
    "even",
    "odd",
    "equal",
    "less",
    "more",
    "both",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "model",
    "test",
)


def count_tokens(text: str) -> int:
    """The emulator's token count of a text (one per word or punctuation run)."""
    return len(TOKEN.findall(text))


def message_text(content: Any) -> str:
    """The text of an OpenAI message content: a string, or the text parts of a list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def history_digest(messages: list[dict[str, Any]]) -> str:
    """First 8 hex of sha256 over the canonical JSON of the messages as sent, every key kept.

    Canonical JSON: `json.dumps(..., sort_keys=True, ensure_ascii=False,
    separators=(",", ":"))`, so a test can recompute which history a turn was answered from,
    and a history that carried more than {role, content} (an earlier turn's
    `reasoning_content`, say) does not match one that did not.
    """
    canonical = json.dumps(messages, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:8]


def prompt_tokens(messages: list[dict[str, Any]]) -> int:
    """Tokens of the chat-templated prompt (template framing included, like a real server)."""
    body = sum(MESSAGE_OVERHEAD + count_tokens(message_text(m.get("content"))) for m in messages)
    return body + GENERATION_PROMPT


def unit(seed: int, salt: str, key: str) -> float:
    """A uniform draw in [0, 1) fixed by (seed, salt, key)."""
    digest = hashlib.sha256(f"{seed}:{salt}:{key}".encode()).digest()
    return int.from_bytes(digest[:7], "big") / float(1 << 56)


def log_uniform(u: float, low: int, high: int) -> int:
    """A long-tailed length in [low, high]: most outputs short, a few near the maximum."""
    lo, hi = math.log(low + 1), math.log(high + 1)
    return min(high, max(low, round(math.exp(lo + u * (hi - lo))) - 1))


@dataclass(frozen=True, slots=True)
class Output:
    """One finished generation, as the chat and native endpoints report it."""

    reasoning: str | None  # None: no separate reasoning (off, inline, or leaked)
    content: str
    finish_reason: str  # stop | length | abort
    completion_tokens: int
    reasoning_tokens: int


@dataclass(frozen=True, slots=True)
class Plan:
    """What the model would generate for a history, before any budget cuts it."""

    digest: str
    fault: str | None
    reasoning_len: int
    answer_len: int
    reasoning_at: int
    answer_at: int


class EmulatedModel:
    """Deterministic text for (history, seed) with lengths in the configured ranges."""

    def __init__(
        self,
        seed: int,
        reasoning_range: tuple[int, int],
        answer_range: tuple[int, int],
        faults: Faults,
    ) -> None:
        self.seed = seed
        self.reasoning_range = reasoning_range
        self.answer_range = answer_range
        self.faults = faults
        rng = random.Random(seed)
        words = [rng.choice(_VOCAB) for _ in range(_POOL_SIZE)]
        for i in range(11, _POOL_SIZE, 12):  # a sentence end now and then, so it reads as text
            words[i] = "."
        self._pool = words * 2  # doubled, so any slice of up to _POOL_SIZE never wraps

    def plan(self, messages: list[dict[str, Any]], min_tokens: int = 0) -> Plan:
        """Lengths and fault of the answer to this history, all fixed by (history, seed)."""
        digest = history_digest(messages)
        fault = None
        for name in OUTPUT_FAULTS:
            fraction = self.faults.fractions.get(name, 0.0)
            if fraction and unit(self.seed, name, digest) < fraction:
                fault = name
                break
        reasoning = log_uniform(unit(self.seed, "reasoning", digest), *self.reasoning_range)
        answer = log_uniform(unit(self.seed, "answer", digest), *self.answer_range)
        return Plan(
            digest=digest,
            fault=fault,
            reasoning_len=reasoning,
            answer_len=max(TAG_TOKENS, answer, min_tokens),
            reasoning_at=int(unit(self.seed, "r-at", digest) * _POOL_SIZE),
            answer_at=int(unit(self.seed, "a-at", digest) * _POOL_SIZE),
        )

    def words(self, at: int, n: int) -> str:
        """n pool tokens from position `at`, joined by spaces: exactly n tokens."""
        if n <= _POOL_SIZE:
            return " ".join(self._pool[at : at + n])
        whole, rest = divmod(n, _POOL_SIZE)
        chunks = [" ".join(self._pool[at : at + _POOL_SIZE])] * whole
        if rest:
            chunks.append(" ".join(self._pool[at : at + rest]))
        return " ".join(chunks)

    def answer_text(self, plan: Plan, n: int) -> str:
        """The first n tokens of the answer: the history tag, then words."""
        tag = ("[", "history", ":", plan.digest, "]")
        if n <= TAG_TOKENS:
            return "".join(tag[:n])
        return "".join(tag) + " " + self.words(plan.answer_at, n - TAG_TOKENS)

    def generate(self, plan: Plan, *, thinking: bool, separate: bool, budget: int) -> Output:
        """The output of `plan` within `budget` tokens (max_tokens, or what the context leaves).

        Layout of a thinking generation: <think> reasoning </think> answer <|im_end|>; a
        budget spent inside the thinking leaves everything in the reasoning and no answer.
        """
        if plan.fault == "empty-answer":
            if thinking and separate:
                return Output("", EMPTY_ANSWER, "stop", EMPTY_ANSWER_TOKENS, 0)
            return Output(None, f"<think>\n\n</think>\n\n{EMPTY_ANSWER}", "stop", 6, 0)
        reasoning_len = plan.reasoning_len if thinking else 0
        answer_len = plan.answer_len
        if plan.fault in ("truncate", "repeat-loop"):
            # Runaway generation: it only stops at the budget.
            budget = min(budget, RUNAWAY_CAP)
            if plan.fault == "truncate":
                thinking, reasoning_len = True, budget  # whatever was asked for
            else:
                answer_len = budget
        overhead = 3 if thinking else 1
        if reasoning_len + answer_len + overhead <= budget:
            finish, used = "stop", reasoning_len + answer_len + overhead
        else:
            finish, used = "length", budget
        if thinking and used < reasoning_len + 2:
            reasoning_kept, answer_kept = max(0, used - 1), 0
        else:
            reasoning_kept = reasoning_len
            answer_kept = min(answer_len, used - (reasoning_len + 2 if thinking else 0))
        if plan.fault == "repeat-loop":
            per_line = count_tokens(LOOP_LINE)
            lines = max(1, answer_kept // per_line)
            answer = "\n".join([LOOP_LINE] * lines)
        else:
            answer = self.answer_text(plan, answer_kept) if answer_kept else ""
        if not thinking:
            return Output(None, answer, finish, used, 0)
        reasoning = self.words(plan.reasoning_at, reasoning_kept)
        if plan.fault == "think-leak" or not separate:
            closed = answer_kept > 0 or finish == "stop"
            inline = f"<think>\n{reasoning}" + (f"\n</think>\n\n{answer}" if closed else "")
            return Output(None, inline, finish, used, reasoning_kept)
        return Output(reasoning, answer, finish, used, reasoning_kept)
