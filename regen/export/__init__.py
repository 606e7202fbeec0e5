"""Exports that trainers read as they are: SpecForge, pre-tokenized, HF Arrow, messages.

Only committed ok rows, read through the manifests; the token formats' loss mask is
`regen.lossmask`'s, the audit's own. No Prefect here: `flows/export.py` wraps it. The exporter
itself is `regen.export.run.export_dataset`; this package's top level holds only the options,
so that `regen.config` can embed them without importing the exporter (polars, the dataset
reader, the loss mask).
"""

from regen.export.options import FORMATS, ExportConfig, ExportFormat, ExportOptions

__all__ = ["FORMATS", "ExportConfig", "ExportFormat", "ExportOptions"]
