"""Plots in Prefect artifacts: a Markdown artifact shows a PNG carried in it as a data URI
(Prefect 3.9.1's UI renders `![name](data:image/png;base64,...)`; it has no file to link).

The bytes are drawn by `regen.display.plots` and `regen.audit.report`; this only carries them.
Prefect keeps an artifact's data in its database, so only small plots come here (a few tens of KB).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping

from regen.display.plots import plots_markdown


def data_uri(data: bytes) -> str:
    """A PNG as a `data:` URI."""
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def embedded(plots: Mapping[str, bytes]) -> str:
    """The plots section of a Markdown artifact, each plot carried in it."""
    return plots_markdown({name: data_uri(data) for name, data in plots.items()})
