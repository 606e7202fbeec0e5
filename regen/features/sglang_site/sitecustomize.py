"""Loaded by every Python process of a capture server (this directory is put first on its
PYTHONPATH by regen.features.fleet), SGLang's spawned scheduler included: the only hook that
reaches a `multiprocessing` spawn child without installing anything into the user's venv.

It does nothing unless REGEN_CAPTURE_DIR is set, and then only arms regen_sglang_capture's
import hook. A sitecustomize that this one shadows (the venv's or the system's) is still run.
"""

import importlib.util
import os
import sys


def _chain() -> None:
    """Run the sitecustomize this file shadows, if the interpreter has one further on."""
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if os.path.abspath(entry or ".") == here:
            continue
        path = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(path):
            spec = importlib.util.spec_from_file_location("_regen_shadowed_sitecustomize", path)
            if spec and spec.loader:
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


if os.environ.get("REGEN_CAPTURE_DIR"):
    import regen_sglang_capture  # type: ignore[import-not-found]

    regen_sglang_capture.arm()
_chain()
