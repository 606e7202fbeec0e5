"""The emulated model: deterministic outputs, their token ids, and SGLang's Qwen3 parsing.

Outputs depend only on (message history, seed), and on a request's sampling seed where the
server honours one (`--enable-deterministic-inference`, as SGLang 0.5.23): the same prompt
always gets the same answer, and the answer names the history it saw. An output is generated
as single-token pieces of the server's tokenizer (see `regen.emulator.tokenizer`): pool
words, punctuation, newlines and the template's tags, so its text and its ids agree and
`completion_tokens` is the number of ids. The raw text is what the model wrote;
`parse_reasoning` splits it the way SGLang 0.5.23's Qwen3 reasoning parser does, which strips
nothing but the tags.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import dataclass
from typing import Any

from regen.emulator.faults import OUTPUT_FAULTS, Faults
from regen.emulator.tokenizer import ChatTokenizer

THINK_OPEN, THINK_CLOSE, EOS = "<think>", "</think>", "<|im_end|>"
# Pieces of "[history:xxxxxxxx]", each one token, so a cut answer still tokenises the same.
TAG_TOKENS = 5
EMPTY_ANSWER = "OK."
# <think> \n\n </think> \n\n OK. <|im_end|>: the incident's 6 loss tokens, as Qwen counts them.
EMPTY_ANSWER_PIECES = (THINK_OPEN, "\n\n", THINK_CLOSE, "\n\n", EMPTY_ANSWER, EOS)
LOOP_LINE = "Wait , let me check the answer again ."
RUNAWAY_CAP = 32768  # longest runaway output a fault makes when nothing else limits it
_POOL_SIZE = 4096
_PIECES = (THINK_OPEN, THINK_CLOSE, EOS, "\n", "\n\n", "[", "history", ":", "]", EMPTY_ANSWER)
_DIGEST_SAMPLE = "0123abcd"  # a history digest must be one token too

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


def parse_reasoning(text: str, force_reasoning: bool) -> tuple[str | None, str]:
    """(reasoning_content, content) as SGLang 0.5.23's Qwen3Detector.detect_and_parse gives them
    (sglang/srt/parser/reasoning_parser.py) and serving_chat reports them: nothing stripped but
    the tags, an empty reasoning is None, a reasoning never closed takes the whole text.

    `force_reasoning` is on when thinking is enabled (the parser's `enable_thinking` default).
    """
    if not force_reasoning and THINK_OPEN not in text:
        return None, text
    while text.startswith(THINK_OPEN):
        text = text[len(THINK_OPEN) :]
    reasoning, closed, content = text.partition(THINK_CLOSE)
    if not closed:
        return text or None, ""
    return reasoning or None, content


def unit(seed: int, salt: str, key: str) -> float:
    """A uniform draw in [0, 1) fixed by (seed, salt, key)."""
    digest = hashlib.sha256(f"{seed}:{salt}:{key}".encode()).digest()
    return int.from_bytes(digest[:7], "big") / float(1 << 56)


def log_uniform(u: float, low: int, high: int) -> int:
    """A long-tailed length in [low, high]: most outputs short, a few near the maximum."""
    lo, hi = math.log(low + 1), math.log(high + 1)
    return min(high, max(low, round(math.exp(lo + u * (hi - lo))) - 1))


@dataclass(frozen=True, slots=True)
class Generation:
    """One finished generation: the model's raw text and its token ids, end token included."""

    text: str
    token_ids: list[int]
    finish_reason: str  # stop | length (the server makes it abort when cut short)
    reasoning_tokens: int  # from the first token through </think>, as SGLang counts them

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True, slots=True)
class Plan:
    """What the model would generate for a history, before any budget cuts it."""

    digest: str
    fault: str | None
    reasoning_len: int
    answer_len: int
    reasoning_at: int
    answer_at: int
    call: str | None = None
    """A tool call's text, answered instead of words (regen.emulator.tool_calls)."""


class _Builder:
    """Text and ids of single-token pieces, cut at the token budget."""

    __slots__ = ("ids", "left", "parts")

    def __init__(self, budget: int) -> None:
        self.left = budget
        self.parts: list[str] = []
        self.ids: list[int] = []

    def piece(self, text: str, token: int) -> bool:
        if self.left <= 0:
            return False
        self.parts.append(text)
        self.ids.append(token)
        self.left -= 1
        return True

    def run(self, words: list[str], ids: list[int], space: bool) -> None:
        """Words joined by spaces (one before them with `space`), as many as the budget takes."""
        n = min(len(words), self.left)
        if n <= 0:
            return
        self.parts.append((" " if space else "") + " ".join(words[:n]))
        self.ids.extend(ids[:n])
        self.left -= n


class EmulatedModel:
    """Deterministic text for (history, seed) with lengths in the configured ranges."""

    def __init__(
        self,
        seed: int,
        reasoning_range: tuple[int, int],
        answer_range: tuple[int, int],
        faults: Faults,
        tokenizer: ChatTokenizer,
    ) -> None:
        """ValueError when the tokenizer does not make every piece of an output one token."""
        self.seed = seed
        self.reasoning_range = reasoning_range
        self.answer_range = answer_range
        self.faults = faults
        self.tokenizer = tokenizer
        rng = random.Random(seed)
        words = [rng.choice(_VOCAB) for _ in range(_POOL_SIZE)]
        for i in range(11, _POOL_SIZE, 12):  # a sentence end now and then, so it reads as text
            words[i] = "."
        loop = LOOP_LINE.split(" ")
        self._id = tokenizer.piece_ids({*_PIECES, *words, *loop, _DIGEST_SAMPLE})
        self._pool = words * 2  # doubled, so any slice of up to _POOL_SIZE never wraps
        self._pool_ids = [self._id[w] for w in self._pool]
        self._loop = loop
        self._loop_ids = [self._id[w] for w in loop]
        self.eos_id = self._id[EOS]  # matched_stop of a finished answer

    def plan(
        self,
        messages: list[dict[str, Any]],
        min_tokens: int = 0,
        *,
        faulty: bool = True,
        sampling_seed: int | None = None,
    ) -> Plan:
        """Lengths and fault of the answer to this history, all fixed by (history, seed) and,
        when the server honours one, the request's `sampling_seed`: another seed is another
        draw of the same history, the same seed the same draw on any server of the fleet;
        no output fault when not `faulty` (before faults-after=N)."""
        digest = history_digest(messages)
        key = digest if sampling_seed is None else f"{digest}:{sampling_seed}"
        fault = None
        for name in OUTPUT_FAULTS if faulty else ():
            fraction = self.faults.fractions.get(name, 0.0)
            if fraction and unit(self.seed, name, key) < fraction:
                fault = name
                break
        reasoning = log_uniform(unit(self.seed, "reasoning", key), *self.reasoning_range)
        answer = log_uniform(unit(self.seed, "answer", key), *self.answer_range)
        return Plan(
            digest=digest,
            fault=fault,
            reasoning_len=reasoning,
            answer_len=max(TAG_TOKENS, answer, min_tokens),
            reasoning_at=int(unit(self.seed, "r-at", key) * _POOL_SIZE),
            answer_at=int(unit(self.seed, "a-at", key) * _POOL_SIZE),
        )

    def _words(self, out: _Builder, at: int, n: int, space: bool) -> None:
        """n pool words from position `at` (the pool repeats beyond its size)."""
        while n > 0 and out.left > 0:
            k = min(n, _POOL_SIZE)
            out.run(self._pool[at : at + k], self._pool_ids[at : at + k], space)
            n -= k
            space = True

    def generate(
        self, plan: Plan, *, thinking: bool, budget: int, call: str | None = None
    ) -> Generation:
        """The output of `plan` within `budget` tokens (max_tokens, or what the context leaves).

        With thinking the model opens the block itself (Qwen3's template prompts with
        `<|im_start|>assistant\\n`): <think> \\n reasoning \\n </think> \\n\\n answer <|im_end|>.
        A budget spent inside the thinking leaves everything in the reasoning and no answer.
        `call` (regen.emulator.tool_calls): the answer is that tool call's text instead.
        """
        ids = self._id
        if plan.fault == "empty-answer":
            out = _Builder(budget)
            for piece in EMPTY_ANSWER_PIECES:
                out.piece(piece, ids[piece])
            done = len(out.ids) == len(EMPTY_ANSWER_PIECES)
            return Generation(
                "".join(out.parts[:-1] if done else out.parts), out.ids,
                "stop" if done else "length", min(3, len(out.ids)) if thinking else 0,
            )  # fmt: skip
        reasoning_len = plan.reasoning_len
        if plan.fault in ("truncate", "repeat-loop"):
            # Runaway generation: it only stops at the budget.
            budget = min(budget, RUNAWAY_CAP)
            if plan.fault == "truncate":
                thinking, reasoning_len = True, budget  # whatever was asked for
        out = _Builder(budget)
        reasoning_tokens = 0
        if thinking:
            out.piece(THINK_OPEN, ids[THINK_OPEN])
            if reasoning_len:
                out.piece("\n", ids["\n"])
                self._words(out, plan.reasoning_at, reasoning_len, space=False)
                out.piece("\n", ids["\n"])
            else:
                out.piece("\n\n", ids["\n\n"])
            out.piece(THINK_CLOSE, ids[THINK_CLOSE])
            reasoning_tokens = len(out.ids)
            out.piece("\n\n", ids["\n\n"])
        if plan.fault == "repeat-loop":
            self._repeat(out)
        elif (call or plan.call) is not None:
            self._call(out, call or plan.call or "")
        else:
            self._answer(out, plan, plan.answer_len)
        text = "".join(out.parts)
        finish = "stop" if out.piece(EOS, ids[EOS]) else "length"
        return Generation(text, out.ids, finish, reasoning_tokens)

    def _answer(self, out: _Builder, plan: Plan, n: int) -> None:
        """The history tag, then pool words: n tokens, or what the budget leaves."""
        tag = ("[", "history", ":", plan.digest, "]")
        for piece in tag[:n]:
            out.piece(piece, self._id.get(piece, self._id[_DIGEST_SAMPLE]))
        self._words(out, plan.answer_at, n - TAG_TOKENS, space=True)

    def _call(self, out: _Builder, text: str) -> None:
        """A tool call's text in its own tokens (a call names words outside the pool): each
        token's piece runs from the end of the one before, so text and ids agree when cut."""
        encoding = self.tokenizer.tokenize(text)
        start = 0
        for token, (_, end) in zip(encoding.ids, encoding.offsets, strict=True):
            if not out.piece(text[start:end], token):
                return
            start = end

    def _repeat(self, out: _Builder) -> None:
        """A decoding loop: the same line over and over until the budget runs out."""
        out.run(self._loop, self._loop_ids, space=False)
        while out.left > 0:
            out.piece("\n", self._id["\n"])
            out.run(self._loop, self._loop_ids, space=False)
