"""The tiny model of tests/engine/: the twin (regen.rehearsal.twin) of the bundled emulator model, a
2-layer random-weight Qwen3 over its tokenizer that the real `sglang.launch_server --device cpu`
loads in seconds, whose planted path answers every prompt

    <think> let me check the first step then sum </think> \\n\\n answer is ten . <|im_end|>

16 tokens: a real reasoning/content split for `--reasoning-parser qwen3`, a natural stop, and
`finish_reason: "length"` for any max_tokens under 16. With enable_thinking false the prompt
ends "\\n\\n", which lands inside the path, so the answer is the content alone.

`python support/tiny_model.py OUT_DIR [TOKENIZER_DIR]`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from regen.rehearsal.twin import build_twin

REPO = Path(__file__).resolve().parents[1]
TOKENIZER_DIR = REPO / "regen" / "data" / "emulator-model"


def build(target: Path, tokenizer_dir: Path | None = None, *, layers: int = 2) -> Path:
    """Write the tiny model into `target` (created; files in it are overwritten) and return it;
    `layers` 8 for the features (EAGLE-3's default layers 2, 4, 5 of 8)."""
    twin = build_twin(Path(tokenizer_dir or TOKENIZER_DIR), Path(target), layers=layers)
    if not twin.planted:
        raise ValueError(f"{tokenizer_dir or TOKENIZER_DIR}: the tokenizer makes no planted path")
    return twin.path


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: python support/tiny_model.py OUT_DIR [TOKENIZER_DIR]")
    print(build(Path(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) == 3 else None))
