"""A model's tiny twin: its own tokenizer files and chat template over a small random-weight
Qwen3 body that the real SGLang server runs on a CPU (`regen rehearse --engine sglang`, and the
engine tests' model).

What a dress rehearsal proves is what the emulator cannot: the model's real template, tokenizer
and reasoning parser in the real server, with the config's launch flags. So the twin keeps the
model's tokenizer and template files as they are and replaces only the weights: 2 layers, hidden
64, 4 query and 2 key/value heads of 16, vocabulary = the tokenizer's highest id + 1, float32,
seeded (every build is byte-identical).

The weights are random with one planted path: the embeddings of the path's tokens are mutually
orthogonal and each one's lm_head row points at the embedding of the token before it, so from the
generation prompt's last token the model walks, greedily or sampled, a fixed answer,
`<think>let me check the first step then sum</think>\n\nanswer is ten.` and the end of turn, in
whatever tokens the tokenizer makes of it: a real reasoning/content split for the reasoning
parser, and a natural stop. A tokenizer that cannot make the path (no think tags, a token twice
in it) gets none, and the text is random to max_tokens. Either way the text says nothing of the
model: the quality checks cannot judge it.

Standard library only for the weights (the safetensors file is written by hand); `tokenizers`
(regen's own dependency) finds the path's ids.
"""

from __future__ import annotations

import array
import itertools
import json
import math
import random
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from regen.errors import UserError

SEED = 20251206
HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 64, 128, 2, 4, 2, 16
# The planted answer, after the generation prompt's last token.
PLANTED = "<think>let me check the first step then sum</think>\n\nanswer is ten."
STEER = 3.0  # lm_head scale on the path; after the final RMSNorm the path logit is 8 * STEER
# The files of a model directory that make its tokenizer and chat template, as transformers
# and SGLang read them; weights and the model's own config.json are not among them.
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
    "chat_template.json", "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model",
)  # fmt: skip


@dataclass(frozen=True)
class Twin:
    """A built twin: where, its vocabulary, and the planted path's ids (empty: none)."""

    path: Path
    vocab_size: int
    planted: tuple[int, ...]


def _planted_ids(tokenizer_dir: Path, eos: int | None) -> tuple[int, ...]:
    """The generation prompt's last token, the planted answer's tokens and the end of turn;
    () when the template cannot render, the answer has no think tags, or a token repeats (each
    step of the path must point at one next token)."""
    from regen.lossmask.template import load_template

    try:
        template, _ = load_template(tokenizer_dir)
    except UserError:
        return ()
    if template is None or eos is None:
        return ()
    try:
        prompt = template.render([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    except UserError:
        return ()
    tokenizer = template.tokenizer
    last = tokenizer.encode(prompt, add_special_tokens=False).ids[-1:]
    answer = tokenizer.encode(PLANTED, add_special_tokens=False).ids
    think = {tokenizer.token_to_id(t) for t in ("<think>", "</think>")}
    ids = (*last, *answer, eos)
    if None in think or not think <= set(answer) or len(set(ids)) != len(ids):
        return ()
    return ids


def _eos(tokenizer_dir: Path, vocab: dict[str, int]) -> int | None:
    """The end of turn: tokenizer_config.json's eos_token (a string or {content: ...})."""
    try:
        config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return None
    eos = config.get("eos_token")
    if isinstance(eos, dict):
        eos = eos.get("content")
    return vocab.get(eos) if isinstance(eos, str) else None


def build_twin(
    tokenizer_dir: Path, target: Path, *, context_length: int = 4096, layers: int = LAYERS
) -> Twin:
    """Write the twin of the model whose tokenizer files are in `tokenizer_dir` into `target`
    (created; its files are overwritten). UserError when there is no tokenizer.json. `layers`:
    8 for the features' tests, deep enough for EAGLE-3's default layers (2, n/2, n-3)."""
    tokenizer_dir, target = Path(tokenizer_dir), Path(target)
    if not (tokenizer_dir / "tokenizer.json").is_file():
        raise UserError(f"{tokenizer_dir}: no tokenizer.json to build a twin of the model with")
    target.mkdir(parents=True, exist_ok=True)
    vocab = _vocab(tokenizer_dir)
    vocab_size = max(vocab.values()) + 1
    eos = _eos(tokenizer_dir, vocab)
    planted = _planted_ids(tokenizer_dir, eos)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copyfile(tokenizer_dir / name, target / name)
    pad = vocab.get("<|endoftext|>", eos)
    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": vocab_size,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": layers,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": context_length,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "use_cache": True,
        "bos_token_id": pad,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "torch_dtype": "float32",
        "comment": (
            f"A tiny random-weight twin (regen.rehearsal.twin) of the tokenizer in {tokenizer_dir}."
        ),
    }
    (target / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {"bos_token_id": pad, "eos_token_id": [eos] if eos is not None else [],
                  "pad_token_id": pad}  # fmt: skip
    (target / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    _write_safetensors(target / "model.safetensors", _weights(vocab_size, list(planted), layers))
    return Twin(target, vocab_size, planted)


def _vocab(tokenizer_dir: Path) -> dict[str, int]:
    tok = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    pieces = tok["model"]["vocab"]
    # BPE and WordLevel map piece -> id; Unigram lists [piece, score] in id order.
    vocab = dict(pieces) if isinstance(pieces, dict) else {p[0]: i for i, p in enumerate(pieces)}
    vocab.update({t["content"]: t["id"] for t in tok.get("added_tokens", [])})
    return vocab


def _unit(rng: random.Random, others: list[list[float]]) -> list[float]:
    """A random unit vector orthogonal to `others` (themselves orthonormal)."""
    v = [rng.gauss(0.0, 1.0) for _ in range(HIDDEN)]
    for o in others:
        d = sum(a * b for a, b in zip(v, o, strict=True))
        v = [a - d * b for a, b in zip(v, o, strict=True)]
    n = math.sqrt(sum(a * a for a in v))
    return [a / n for a in v]


def _weights(
    vocab_size: int, ids: list[int], layers: int = LAYERS
) -> dict[str, tuple[list[int], array.array]]:
    rng = random.Random(SEED)

    def rand(*shape: int, std: float = 0.02) -> tuple[list[int], array.array]:
        return list(shape), array.array("f", (rng.gauss(0.0, std) for _ in range(math.prod(shape))))

    def ones(n: int) -> tuple[list[int], array.array]:
        return [n], array.array("f", [1.0] * n)

    # Embeddings: unit-length directions times sqrt(HIDDEN) (entries about 1, as after RMSNorm);
    # the path's tokens are mutually orthogonal so no step of the path can pull toward another.
    path_dirs: dict[int, list[float]] = {}
    for t in dict.fromkeys(ids):
        path_dirs[t] = _unit(rng, list(path_dirs.values()))
    embed = array.array("f")
    for t in range(vocab_size):
        u = path_dirs.get(t) or _unit(rng, [])
        embed.extend(a * math.sqrt(HIDDEN) for a in u)
    _, lm_head = rand(vocab_size, HIDDEN)
    for prev, nxt in itertools.pairwise(ids):
        row = array.array("f", (STEER * a for a in path_dirs[prev]))
        lm_head[nxt * HIDDEN : (nxt + 1) * HIDDEN] = row

    w: dict[str, tuple[list[int], array.array]] = {
        "model.embed_tokens.weight": ([vocab_size, HIDDEN], embed),
        "model.norm.weight": ones(HIDDEN),
        "lm_head.weight": ([vocab_size, HIDDEN], lm_head),
    }
    for i in range(layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = ones(HIDDEN)
        w[p + "post_attention_layernorm.weight"] = ones(HIDDEN)
        w[p + "self_attn.q_proj.weight"] = rand(HEADS * HEAD_DIM, HIDDEN)
        w[p + "self_attn.k_proj.weight"] = rand(KV_HEADS * HEAD_DIM, HIDDEN)
        w[p + "self_attn.v_proj.weight"] = rand(KV_HEADS * HEAD_DIM, HIDDEN)
        w[p + "self_attn.o_proj.weight"] = rand(HIDDEN, HEADS * HEAD_DIM)
        w[p + "self_attn.q_norm.weight"] = ones(HEAD_DIM)
        w[p + "self_attn.k_norm.weight"] = ones(HEAD_DIM)
        w[p + "mlp.gate_proj.weight"] = rand(INTERMEDIATE, HIDDEN)
        w[p + "mlp.up_proj.weight"] = rand(INTERMEDIATE, HIDDEN)
        w[p + "mlp.down_proj.weight"] = rand(HIDDEN, INTERMEDIATE)
    return w


def _write_safetensors(path: Path, tensors: dict[str, tuple[list[int], array.array]]) -> None:
    """The safetensors layout: u64 header length, JSON header, then the raw little-endian data."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    blobs, offset = [], 0
    for name in sorted(tensors):
        shape, data = tensors[name]
        if sys.byteorder != "little":
            data = array.array("f", data)
            data.byteswap()
        blob = data.tobytes()
        end = offset + len(blob)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, end]}
        blobs.append(blob)
        offset += len(blob)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with path.open("wb") as f:
        f.write(len(head).to_bytes(8, "little"))
        f.write(head)
        for blob in blobs:
            f.write(blob)


