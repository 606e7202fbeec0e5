# The two commands of the README: `make rehearse` (the main job) and `make test`.
# Both bootstrap .venv through `make install`, which reinstalls when pyproject.toml changes.
PYTHON ?= python3.11
VENV := .venv
STAMP := $(VENV)/.installed
ARGS ?=

.PHONY: install nvidia contract-env engine-env trainers-env rehearse test test-fast lint typecheck docs bench bench-smoke clean

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "make: $(PYTHON) not found (set PYTHON=...)"; exit 1; }
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	@$(VENV)/bin/python -m pip install --quiet --upgrade pip
	@$(VENV)/bin/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

# On a GPU node: NVML for `regen check`'s gpus row (the [nvidia] extra), into .venv.
nvidia: install
	@$(VENV)/bin/python -m pip install --quiet -e '.[nvidia]'

# The real sglang 0.5.23 (CPU torch, a stand-in for the CUDA-only sgl_kernel) in its own venv,
# .venv-sglang, cached by its pins: its parser and models judge regen in tests/contract/, its
# server runs on this CPU in tests/engine/ (engine-env is the same venv).
contract-env engine-env:
	@tests/contract/build_env.sh

# SpecForge 0.2.0 and speculators 0.9.0 (CPU torch) in their own venv, for tests/trainers/.
trainers-env:
	@tests/trainers/build_env.sh

rehearse: install
	@$(VENV)/bin/regen rehearse $(ARGS)

lint: install
	@$(VENV)/bin/ruff check --quiet .

# The files and settings are in pyproject.toml's [tool.mypy].
typecheck: install
	@$(VENV)/bin/mypy

# The docs site (docs/, mkdocs.yml), strictly: a broken link or anchor, or a page left out of the
# nav, fails. tests/test_docs.py builds it the same way in `make test`.
docs: install
	@$(VENV)/bin/mkdocs build --strict --quiet

# Bytecode caches on, whatever the shell says: with PYTHONDONTWRITEBYTECODE set, every worker
# and every emulator or `regen` subprocess compiled the project's sources again, and pytest
# rewrote every test module's asserts again, on every run (the caches are git-ignored).
PYTEST := PYTHONDONTWRITEBYTECODE= $(VENV)/bin/python -m pytest
# One xdist worker more than cores: the tests wait on emulators, subprocesses and simulated
# GPU time a fifth to a quarter of theirs (the e2e tests used 1.5 of 2 cores at 2 workers; the
# whole suite uses 1.8 at 3).
WORKERS ?= $(shell $(PYTHON) -c "import os; print(min(8, len(os.sched_getaffinity(0)) + 1))")

# The real-engine lane (tests/engine/: two SGLang servers on this CPU) runs after the rest, on
# its own, so its servers never share the two cores with a parallel suite; without
# .venv-sglang it collects nothing (exit 5, one line says so), in CI it fails. Each of its tests
# has its own limit (support/engine.py); after two hours no further test starts (the lane took
# 11 min here at a load of 5, 26 min at 12: a hung lane is bounded, a slow one still passes).
test: lint typecheck
	@$(PYTEST) -q -n $(WORKERS) --dist loadgroup -m "not engine" $(ARGS)
	@$(PYTEST) -q -m engine --session-timeout 7200 tests/engine $(ARGS) || [ $$? -eq 5 ]

# The fast loop: everything but the end-to-end Prefect runs, the bench smoke runs, the engine
# lane and the tests slow by nature (marker slow: tests/conftest.py).
test-fast: lint
	@$(PYTEST) -q -n $(WORKERS) --dist loadgroup -m "not e2e and not bench and not engine and not slow" $(ARGS)

# Full sizes take minutes to an hour each and write benches/results/*.json.
bench: install
	@for b in benches/[!_]*.py; do echo "== $$b"; $(VENV)/bin/python $$b || exit 1; done

# Every bench at its smoke size (seconds each; results in benches/results/smoke/), so a bench
# that no longer runs is seen; tests/test_benches.py runs the same in `make test`.
bench-smoke: install
	@for b in benches/[!_]*.py; do echo "== $$b --smoke"; $(VENV)/bin/python $$b --smoke || exit 1; done

clean:
	rm -rf $(VENV) .venv-sglang .venv-trainers out .regen site .pytest_cache .ruff_cache .mypy_cache
