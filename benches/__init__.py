"""Benchmarks, each run as `python benches/NAME.py`; a package so mypy names them benches.*."""
