# Two commands do everything on a fresh machine: `make demo` and `make test`.
# Both create .venv, install the torch build that suits the machine, then gpufeed (editable) with
# the extras the demo and the tests use and the CUDA stack's extra. The container images use
# `make deps` then `make install` instead: the runtime dependencies and the stack's extra alone (read
# from pyproject.toml, so that layer survives source changes), then gpufeed itself, not editable.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP = $(VENV)/.gpufeed-installed-$(CUDA_STACK)
# The CUDA stack: torch, DALI and onnxruntime built for one CUDA major (docs/gpu.md, "CUDA stacks").
# cpu without an NVIDIA driver, cuda13 where the driver supports CUDA 13 (580+) and every GPU is
# Turing or newer, cuda12 on a CUDA 12.x driver; read from the driver through NVML by
# gpufeed/stack/_choice.py (standard library only, so the system's Python runs it). Override with
# `make CUDA_STACK=cuda12` (a container build has no driver to read).
ifndef CUDA_STACK
CUDA_STACK := $(shell $(PYTHON) gpufeed/stack/_choice.py)
endif
# pip arguments that install the stack's torch: torch==2.13.0 for cpu and cuda13 (PyPI: the CPU
# machine's local wheel, and PyPI's Linux build, which is CUDA 13.0), and the cu126 build from
# PyTorch's index for cuda12. Override with `make TORCH_ARGS="torch==... --index-url ..."`.
ifndef TORCH_ARGS
TORCH_ARGS := $(shell $(PYTHON) gpufeed/stack/_choice.py torch-args $(CUDA_STACK))
endif
# The first setuptools that builds pyproject's license field; the wheel test builds with the
# venv's own setuptools (no build isolation), so the venv needs it too.
SETUPTOOLS_SPEC := setuptools>=77.0.1
PYTEST_ARGS ?=
SITE_DIR := .cache/site

.PHONY: setup deps install demo docs test test-unit typecheck lint format bench check-cuda-stack clean

# A venv with pip, setuptools and the stack's torch build (tomli reads pyproject.toml on Python
# 3.10, which has no tomllib). A venv holds one stack: DALI's cuda120 and cuda130 wheels install
# the same files, so switching stacks starts from `make clean`.
define make_venv
	@case "$(CUDA_STACK)" in cpu|cuda12|cuda13) ;; *) echo "make: CUDA_STACK is '$(CUDA_STACK)', not cpu, cuda12 or cuda13 (an error above says why none was chosen); set it" >&2; exit 2;; esac
	@for other in $(VENV)/.gpufeed-installed-*; do \
		if [ -e "$$other" ] && [ "$$other" != "$(STAMP)" ]; then \
			echo "make: $(VENV) holds the $${other##*-} stack, not $(CUDA_STACK); run 'make clean' first" >&2; exit 2; fi; done
	@echo "CUDA stack: $(CUDA_STACK) (torch: $(TORCH_ARGS))"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip "$(SETUPTOOLS_SPEC)" "tomli>=2; python_version < '3.11'"
	$(BIN)/python -m pip install --quiet $(TORCH_ARGS)
endef

# Prints pyproject.toml's [project] dependencies and those of the extra named by argv[1], one per line.
define PYPROJECT_DEPENDENCIES
import sys
toml = __import__("tomllib" if sys.version_info >= (3, 11) else "tomli")
with open("pyproject.toml", "rb") as f:
    project = toml.load(f)["project"]
print("\n".join(project["dependencies"] + project["optional-dependencies"][sys.argv[1]]))
endef
export PYPROJECT_DEPENDENCIES

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py Makefile
	$(make_venv)
	$(BIN)/python -m pip install --quiet -e ".[test,$(CUDA_STACK)]"
	touch $@

# Runtime dependencies and the CUDA stack's extra, from pyproject.toml alone (no source needed).
deps:
	$(make_venv)
	$(BIN)/python -c "$$PYPROJECT_DEPENDENCIES" $(CUDA_STACK) > $(VENV)/requirements.txt
	$(BIN)/python -m pip install --quiet -r $(VENV)/requirements.txt
	touch $(STAMP)

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

# Each GPU stack's install set for Linux x86-64, resolved and checked without a GPU: one CUDA major
# throughout, and every library onnxruntime's CUDA provider, DALI and nvImageCodec load is in the set
# (or is the driver's or the system's). Reads about 4 GB of wheels the first time, cached in .cache/.
check-cuda-stack: setup
	$(BIN)/python -m gpufeed.stack check --json .cache/cuda-stack/report.json

clean:
	rm -rf $(VENV) runs .cache build
