# Two commands do everything on a fresh machine: `make demo` and `make test`.
# Both create .venv, install the torch build that suits the machine, then gpufeed with its test extras.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.gpufeed-installed
# A CPU-only machine gets the CPU build of torch; one with an NVIDIA driver gets the CUDA build.
TORCH_SPEC ?= $(shell if nvidia-smi -L >/dev/null 2>&1; then echo torch; else echo torch==2.13.0; fi)
PYTEST_ARGS ?=

.PHONY: setup demo test lint format bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $@

demo: setup
	$(BIN)/gpufeed demo --out runs/demo

test: setup
	.ci/ensure-prometheus
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: setup
	$(BIN)/gpufeed bench loader --json runs/bench/loader.json

clean:
	rm -rf $(VENV) runs .cache
