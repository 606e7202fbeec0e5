"""Loopback helpers that tests and benches share: emulator servers launched one way, free ports,
a Prefect env and server, waiting for a flow run, moto S3, a Hugging Face Hub (`hub`), chaos
and multi-node set-ups, and reading a dataset back.

Not part of the wheel (pyproject ships regen, tasks, flows, blocks only): it is importable from
the repository root, where pytest (`pythonpath`) and every bench (`sys.path`) put it.
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
