"""Exports that trainers read as they are: SpecForge, pre-tokenized, HF Arrow, messages.

Only committed ok rows, read through the manifests; the token formats' loss mask is
`regen.lossmask`'s, the audit's own. No Prefect here: `flows/export.py` wraps it. What an
export is asked for is the config's `export:` section (`regen.config.ExportOptions`).
"""

from regen.export.exporter import export_dataset

__all__ = ["export_dataset"]
