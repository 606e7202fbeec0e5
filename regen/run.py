"""A run opened once: its resolved config and its opened storage, handed to every stage.

Each stage used to reopen the output by URI from the config it was given; a run now opens
its storage at the top and the stages share that one object (and its S3 client). Hooks and
the child runs of a multi-node run live in other processes and open their own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from regen.config import RegenConfig
from regen.storage import Storage, open_storage


@dataclass(frozen=True)
class OpenedRun:
    config: RegenConfig
    opened: Storage | None = None
    """Storage opened before the run (an S3Bucket block, with the block's credentials)."""
    hf_token: str | None = field(default=None, repr=False)
    """The ModelSource block's Hub token, for a Hub prompt set too (None: HF_TOKEN)."""

    @cached_property
    def storage(self) -> Storage:
        """Opened on first use: provisioning's storage check is the first, so a bad output
        URL is a failed check in its table rather than an error before it."""
        return self.opened or open_storage(self.config.output)

    @property
    def output(self) -> str:
        return self.config.output
