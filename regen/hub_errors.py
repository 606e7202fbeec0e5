"""The Hugging Face Hub, where model staging and prompt sets meet it: its errors in a user's
terms, one line each, naming the repo and what to do.

The token is never handled here: a caller passes the one it was given (the `ModelSource`
block's) or None, and huggingface_hub then reads `HF_TOKEN` or its saved login itself, so
a token has one owner and never reaches a log line.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from regen.errors import UserError

_TOKEN_HINT = "set HF_TOKEN (or the ModelSource block's hf_token) to a token that can read it"


def has_token(token: str | None) -> bool:
    """Whether a request would carry a token: the caller's, or huggingface_hub's own."""
    from huggingface_hub import get_token

    return bool(token or get_token())


def offline() -> bool:
    """`HF_HUB_OFFLINE=1`: no request is made, everything comes from the cache."""
    from huggingface_hub import constants

    return constants.is_offline_mode()


def cache_dir() -> str:
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def gated(what: str) -> UserError:
    return UserError(f"{what}: gated: accept its conditions on the Hub page, then {_TOKEN_HINT}")


@contextmanager
def hub_errors(what: str, revision: str | None, token: str | None) -> Iterator[None]:
    """Turn huggingface_hub's exceptions into one-line `UserError`s about `what` (the repo as
    the user named it). Gated before not-found: `GatedRepoError` is a `RepositoryNotFoundError`."""
    import httpx2
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        yield
    except RevisionNotFoundError:
        raise UserError(
            f"{what}: revision {revision or 'main'} not found on the Hub: "
            "name an existing branch, tag or commit after @"
        ) from None
    except GatedRepoError:
        raise gated(what) from None
    except RepositoryNotFoundError:
        if has_token(token):
            raise UserError(
                f"{what}: repository not found (or the token given cannot read it): "
                "check ORG/NAME, or use a token with access"
            ) from None
        raise UserError(
            f"{what}: repository not found, or private: check ORG/NAME, or {_TOKEN_HINT}"
        ) from None
    except HfHubHTTPError as err:
        raise _http_error(what, err) from None
    except (LocalEntryNotFoundError, OfflineModeIsEnabled, httpx2.TransportError) as err:
        if isinstance(err.__cause__, HfHubHTTPError):  # reached, but a file was refused
            raise _http_error(what, err.__cause__) from None
        where = f"the cache {cache_dir()} has no copy of it at {revision or 'main'}"
        if offline():
            raise UserError(
                f"{what}: HF_HUB_OFFLINE=1 and {where}: fill the cache on a connected node "
                "(same HF_HOME or HF_HUB_CACHE, with `regen check` or `hf download`), "
                "or unset HF_HUB_OFFLINE"
            ) from None
        raise UserError(
            f"{what}: cannot reach the Hub at {constants.ENDPOINT} and {where}: check the "
            "network (HF_ENDPOINT, proxy), or fill the cache elsewhere and set HF_HUB_OFFLINE=1"
        ) from None


def _http_error(what: str, err: Exception) -> UserError:
    """An HTTP answer huggingface_hub has no exception of its own for."""
    response = getattr(err, "response", None)
    status = response.status_code if response is not None else None
    url = str(response.url) if response is not None else "?"
    if status in (401, 403):
        return UserError(f"{what}: access denied (HTTP {status}): {_TOKEN_HINT}")
    if status == 404:
        return UserError(f"{what}: not found on the Hub (HTTP 404 for {url}): check the name")
    return UserError(f"{what}: the Hub answered HTTP {status} for {url}; try again later")
