"""An SGLang 0.5.23 compatible server that emulates the model, for rehearsals on a CPU.

The client, fleet and probes talk to it exactly as to a real GPU server; see
/work/shared/SGLANG_API.md for the contract and `python -m regen.emulator --help`.
"""

from regen.emulator.cli import main
from regen.emulator.model import history_digest, parse_reasoning

__all__ = ["history_digest", "main", "parse_reasoning"]
