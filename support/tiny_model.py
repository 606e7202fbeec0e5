"""A tiny random-weight Qwen3 model for the real sglang server on a CPU (tests/engine/).

`build(target)` writes a Qwen3ForCausalLM directory (model_type qwen3: 2 layers, hidden 64,
4 query heads and 2 key/value heads of 16, vocabulary = the tokenizer's) that the real
`sglang.launch_server --device cpu` loads in seconds. The weights are random (seeded, so every
build is byte-identical) with one planted path: the embeddings of a few tokens are mutually
orthogonal, and each one's lm_head row points at the embedding of the token before it, so from
the generation prompt's last token ("\\n") the model walks, greedily or sampled, a fixed answer:

    <think> let me check the first step then sum </think> \\n\\n answer is ten . <|im_end|>

16 tokens: a real reasoning/content split for `--reasoning-parser qwen3`, a natural stop, and
`finish_reason: "length"` for any max_tokens under 16. With enable_thinking false the prompt
ends "\\n\\n", which lands inside the path, so the answer is the content alone. The transformer
layers' own weights are small (std 0.02) random values: every op of the forward pass runs, but
the residual stream stays dominated by the token's embedding.

Standard library only (the safetensors file is written by hand), so it runs from any Python:
`python support/tiny_model.py OUT_DIR [TOKENIZER_DIR]`.
"""

from __future__ import annotations

import array
import itertools
import json
import math
import random
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOKENIZER_DIR = REPO / "regen" / "data" / "emulator-model"
SEED = 20251206
HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 64, 128, 2, 4, 2, 16
MAX_POSITIONS = 4096
# The planted answer, as token strings; the first is the generation prompt's last token.
PATH = [
    "\n",
    "<think>",
    "let",
    "me",
    "check",
    "the",
    "first",
    "step",
    "then",
    "sum",
    "</think>",
    "\n\n",
    "answer",
    "is",
    "ten",
    ".",
    "<|im_end|>",
]
STEER = 3.0  # lm_head scale on the path; after the final RMSNorm the path logit is 8 * STEER


def _vocab(tokenizer_dir: Path) -> dict[str, int]:
    tok = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    vocab = dict(tok["model"]["vocab"])
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


def _weights(vocab_size: int, ids: list[int]) -> dict[str, tuple[list[int], array.array]]:
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
    for i in range(LAYERS):
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


def build(target: Path, tokenizer_dir: Path | None = None) -> Path:
    """Write the tiny model into `target` (created; files in it are overwritten) and return it."""
    tokenizer_dir = Path(tokenizer_dir or TOKENIZER_DIR)
    target = Path(target)
    target.mkdir(parents=True, exist_ok=True)
    vocab = _vocab(tokenizer_dir)
    vocab_size = max(vocab.values()) + 1
    missing = [t for t in PATH if t not in vocab]
    if missing:
        raise ValueError(f"tokenizer in {tokenizer_dir} lacks the planted path's tokens {missing}")
    ids = [vocab[t] for t in PATH]
    eos = vocab["<|im_end|>"]
    pad = vocab.get("<|endoftext|>", eos)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(tokenizer_dir / name, target / name)
    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": vocab_size,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITIONS,
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
        "comment": "Tiny random-weight Qwen3 (support/tiny_model.py) for tests/engine.",
    }
    (target / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {"bos_token_id": pad, "eos_token_id": [eos], "pad_token_id": pad}
    (target / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    _write_safetensors(target / "model.safetensors", _weights(vocab_size, ids))
    return target


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: python support/tiny_model.py OUT_DIR [TOKENIZER_DIR]")
    print(build(Path(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) == 3 else None))
