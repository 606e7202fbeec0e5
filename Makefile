# The two commands of the README: `make rehearse` (the main job) and `make test`.
# Both bootstrap .venv through `make install`, which reinstalls when pyproject.toml changes.
PYTHON ?= python3.11
VENV := .venv
STAMP := $(VENV)/.installed
ARGS ?=

.PHONY: install contract-env rehearse test lint bench clean

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "make: $(PYTHON) not found (set PYTHON=...)"; exit 1; }
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	@$(VENV)/bin/python -m pip install --quiet --upgrade pip
	@$(VENV)/bin/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

# The real sglang 0.5.23 (CPU torch) in its own venv, for tests/contract/; cached by its pins.
contract-env:
	@tests/contract/build_env.sh

rehearse: install
	@$(VENV)/bin/regen rehearse $(ARGS)

lint: install
	@$(VENV)/bin/ruff check --quiet .

test: lint
	@$(VENV)/bin/python -m pytest -q -n 2 --dist loadgroup $(ARGS)

bench: install
	@for b in benches/*.py; do echo "== $$b"; $(VENV)/bin/python $$b || exit 1; done

clean:
	rm -rf $(VENV) .venv-sglang out .regen .pytest_cache .ruff_cache
