"""Exports that trainers read as they are: SpecForge, pre-tokenized, HF Arrow, messages.

Only committed ok rows, read through the manifests; the token formats' loss mask is
`regen.lossmask`'s, the audit's own. No Prefect here: `flows/export.py` wraps it.
"""

from regen.export.options import FORMATS, ExportConfig, ExportFormat, ExportOptions
from regen.export.run import EXPORT_KEY, ExportSummary, export_dataset

__all__ = [
    "EXPORT_KEY",
    "FORMATS",
    "ExportConfig",
    "ExportFormat",
    "ExportOptions",
    "ExportSummary",
    "export_dataset",
]
