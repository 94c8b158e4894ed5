# The two commands a newcomer needs: `make demo` (a local swarm trains a real model) and `make test`.
# Both create .venv on first use. TORCH_SPEC pins the CPU build that is available offline here; on a machine with
# CUDA or Apple silicon, `make TORCH_SPEC=torch demo` lets pip choose your build (pyproject keeps an open range).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint format typecheck bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/arceusd demo

test: $(STAMP)
	-@.ci/chromium
	$(BIN)/python -m pytest -q --durations=40

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow and not netns"

lint: $(STAMP)
	$(BIN)/ruff check arceus arceusd protocol partitioner tests bench
	$(BIN)/ruff format --check arceus arceusd protocol partitioner tests bench
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff format arceus arceusd protocol partitioner tests bench

bench: $(STAMP)
	for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b --quick || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
