"""Errors a user can fix: the CLI prints them as one line, never as a traceback."""

from __future__ import annotations


class UserError(Exception):
    """A mistake in the user's input or environment; `exit_code` is what the CLI returns."""

    exit_code: int = 1


class ConfigError(UserError):
    """The configuration file (or a flag that overrides it) is invalid."""

    exit_code = 2


class UsageError(UserError):
    """A command-line argument that names nothing usable (a missing path, not a dataset):
    exit 2, as argparse's own errors, so a script tells it from a failed audit's 1."""

    exit_code = 2


class FingerprintMismatch(UserError):
    """The output root belongs to a run with other inputs, model or sampling settings."""


class FleetError(Exception):
    """The fleet could not be brought up or died; the message names the server."""


class FleetUnauthorized(FleetError):
    """A server answered 401: the API key is wrong, so every request would fail."""


class FleetGone(FleetError):
    """No server is healthy and none can come back: the run stops generating. The message
    says what died, when, and what its log says."""
