# Two commands do everything on a fresh machine: `make demo` and `make test`.
# Both create .venv, install the torch build that suits the machine, then gpufeed (editable) with
# the extras the demo and the tests use. The container images use `make deps` then `make install`
# instead: the runtime dependencies alone (read from pyproject.toml, so that layer survives source
# changes), then gpufeed itself, not editable.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.gpufeed-installed
# A CPU-only machine gets the CPU build of torch; one with an NVIDIA driver gets the CUDA build.
TORCH_SPEC ?= $(shell if nvidia-smi -L >/dev/null 2>&1; then echo torch; else echo torch==2.13.0; fi)
# The first setuptools that builds pyproject's license field; the wheel test builds with the
# venv's own setuptools (no build isolation), so the venv needs it too.
SETUPTOOLS_SPEC := setuptools>=77.0.1
PYTEST_ARGS ?=
SITE_DIR := .cache/site

.PHONY: setup deps install demo docs test test-unit typecheck lint format bench peers clean

# A venv with pip, setuptools and the torch build for this machine (tomli reads pyproject.toml
# on Python 3.10, which has no tomllib).
define make_venv
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip "$(SETUPTOOLS_SPEC)" "tomli>=2; python_version < '3.11'"
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
endef

# Prints pyproject.toml's [project] dependencies, one per line.
define PYPROJECT_DEPENDENCIES
import sys
toml = __import__("tomllib" if sys.version_info >= (3, 11) else "tomli")
with open("pyproject.toml", "rb") as f:
    print("\n".join(toml.load(f)["project"]["dependencies"]))
endef
export PYPROJECT_DEPENDENCIES

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py Makefile
	$(make_venv)
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $@

# Runtime dependencies only, from pyproject.toml alone (no source needed, no extras).
deps:
	$(make_venv)
	$(BIN)/python -c "$$PYPROJECT_DEPENDENCIES" > $(VENV)/requirements.txt
	$(BIN)/python -m pip install --quiet -r $(VENV)/requirements.txt

# gpufeed itself into an existing venv (after `make deps`): not editable, no dependencies.
install:
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation .

demo: setup
	$(BIN)/gpufeed demo --out runs/demo

# The documentation site, strictly: a broken link or anchor, a page missing from the navigation or
# an API page that cannot be generated fails the build (mkdocs.yml; output in .cache/site).
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict --quiet --site-dir $(SITE_DIR)

# The docs first (seconds), so the tests can read the site just built instead of building it again.
test: setup docs
	.ci/ensure-prometheus
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	.ci/typecheck
	GPUFEED_DOCS_SITE=$(SITE_DIR) $(BIN)/python -m pytest $(PYTEST_ARGS)

# The unit tier alone (in-process tests: no child process, no server; tests/conftest.py holds it).
test-unit: setup
	$(BIN)/python -m pytest -m unit $(PYTEST_ARGS)

typecheck: setup
	.ci/typecheck

lint: setup
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: setup
	$(BIN)/gpufeed bench loader --json runs/bench/loader.json

# The peers' venv: `gpufeed bench clips` there also runs torchcodec (exact and approximate seeks,
# and its own clip sampler). torchcodec's registry wheel links the CUDA build of torch, which runs
# on a CPU too, and loads the system's FFmpeg libraries (Debian's ffmpeg package when missing).
# Kept apart from .venv (the CUDA build of torch is about 5 GB) and never needed by `make test`.
PEERS_VENV ?= .venv-peers
PEERS_TORCH_SPEC ?= torch==2.14.1
TORCHCODEC_SPEC ?= torchcodec==0.17.0
peers: $(PEERS_VENV)/.gpufeed-peers

$(PEERS_VENV)/.gpufeed-peers: pyproject.toml setup.py Makefile
	@ldconfig -p | grep -q 'libavcodec\.so\.' || { \
		echo "installing FFmpeg's libraries (Debian's ffmpeg package) for torchcodec"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ffmpeg; }
	$(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install --quiet --upgrade pip "$(SETUPTOOLS_SPEC)"
	$(PEERS_VENV)/bin/python -m pip install --quiet "$(PEERS_TORCH_SPEC)" "$(TORCHCODEC_SPEC)"
	$(PEERS_VENV)/bin/python -m pip install --quiet -e ".[bench]" "pytest>=8" "pytest-timeout>=2.3" "vidio>=0.0.4"
	$(PEERS_VENV)/bin/python -c "import torchcodec.decoders"
	touch $@

clean:
	rm -rf $(VENV) $(PEERS_VENV) runs .cache build
