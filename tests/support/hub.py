"""huggingface_hub pointed at a loopback Hub inside the test's own process."""

from __future__ import annotations

from pathlib import Path

import pytest


def hub_settings(monkeypatch: pytest.MonkeyPatch, endpoint: str, home: Path) -> None:
    """huggingface_hub reads HF_ENDPOINT, HF_HUB_CACHE and HF_HUB_OFFLINE once, at import:
    the in-process tests set its constants as a fresh process would from the environment
    (no interpreter to start per call, and each test's own cache and token files)."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(
        constants,
        "HUGGINGFACE_CO_URL_TEMPLATE",
        endpoint + "/{repo_id}/resolve/{revision}/{filename}",
    )
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(home / "stored_tokens"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_PROGRESS_BARS", True)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
