"""The per-run server API key."""

from __future__ import annotations

import secrets

from pydantic import SecretStr


def generate_api_key() -> SecretStr:
    """A fresh key per run, so a key leaked from one run's logs opens nothing later.

    The prefix keeps it from starting with "-", which argparse would read as a flag when
    SGLang turns the key file back into `--api-key KEY`.
    """
    return SecretStr("regen-" + secrets.token_urlsafe(32))
