"""The sampling seed of each turn of a row: a hash of the run's seed, the row id and the turn.

Like the row's setting (regen.client.setting), a hash, not a draw: a retry, a hedged copy, a
resumed run or another node sends a turn the same seed, so where the servers honour it (SGLang
with `--enable-deterministic-inference`) the same row, seed and server give the same tokens.

- Every attempt of a turn carries the same seed. A retry follows a failure of the server (a
  5xx, a timeout, a cut answer), never a judgement of the answer; with a fresh seed the draws
  that fail more often (the long ones, which run into timeouts and aborts) would be replaced
  by others, and a row would depend on which server failed it. With the same seed the retry
  is the draw the failed attempt was making.
- A hedged copy carries it too: the first copy to finish is the same draw as the other, not
  the shorter of two (the bias of copying independent samples of the rows that run longest).
- Each turn of a conversation gets its own: SGLang's seeded sampler hashes (seed, position),
  and a later turn's positions overlap an earlier one's (earlier reasoning is not sent back),
  so one seed for every turn would correlate their draws.
"""

from __future__ import annotations

import hashlib

SEED_BITS = 63
"""SGLang takes a signed 64-bit seed (sampling_params.py); a non-negative one fits any reader."""


def turn_seed(run_seed: int, sample_id: str, turn: int) -> int:
    """The seed of `turn` (from 1) of row `sample_id` in a run seeded `run_seed`."""
    digest = hashlib.sha256(f"{run_seed}\x00{sample_id}\x00{turn}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> (64 - SEED_BITS)
