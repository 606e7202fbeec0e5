"""Model staging: the weights copied once to a RAM disk, verified, so servers load in seconds.

`sources` says where the weights come from (a directory, S3, the Hugging Face Hub), `layout`
what a staged model looks like (its files, the marker, the files SGLang needs), `protocol` how
a copy proceeds (verify, rename, marker last; a second staging is a no-op) and `space` whether
it fits.
"""

from regen.staging.layout import MARKER_NAME, SourceFile, StageMarker, missing_model_files
from regen.staging.protocol import StageResult, stage_model
from regen.staging.sources import ModelSource, open_source
from regen.staging.space import check_space

__all__ = [
    "MARKER_NAME",
    "ModelSource",
    "SourceFile",
    "StageMarker",
    "StageResult",
    "check_space",
    "missing_model_files",
    "open_source",
    "stage_model",
]
