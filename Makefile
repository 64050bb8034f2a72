# Two commands do everything on a fresh machine: `make demo` and `make test`.
# Both create .venv, install the torch build of the machine's CUDA stack, then gpufeed (editable)
# with the extras the demo and the tests use and the stack's packages. The container images use
# `make deps` then `make install` instead: the stack's runtime requirement set alone (read from
# pyproject.toml, so that layer survives source changes), then gpufeed itself, not editable.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP = $(VENV)/.gpufeed-installed-$(CUDA_STACK)
# The CUDA stack: torch, DALI and onnxruntime built for one CUDA major (docs/gpu.md, "CUDA stacks").
# cpu without an NVIDIA driver; cuda12 (the runtime dependencies' own CUDA 12 builds, on any driver
# with CUDA 12.0 or later) where torch's cu126 build has kernels for every GPU, Maxwell to Hopper;
# cuda13 for a newer GPU (Blackwell) on a CUDA 13 driver. Read from the driver through NVML by
# gpufeed/stack/_choice.py (standard library only, so the system's Python runs it). Override with
# `make CUDA_STACK=cuda13` (a container build has no driver to read).
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
comma := ,
PYTEST_ARGS ?=
# make test spreads the tests over this many pytest-xdist workers, whole test files to a worker
# (tests/_xdist.py): many tests wait on servers and child processes, so two workers keep both cores
# of a 2-core machine busy. PYTEST_WORKERS=0 (or PYTEST_ARGS=-n0) runs them in one process.
PYTEST_WORKERS ?= 2
SITE_DIR := .cache/site
JUNIT_REPORT := .cache/pytest-report.xml
INFLIGHT_DIR := .cache/pytest-inflight
# The whole pytest run of make test stops here (a whole run takes about 20 minutes on 2 cores), well
# inside CI's 90: pytest is interrupted (SIGINT, so it still writes its report) and .ci/failures names
# the tests that were running, instead of CI ending the job with no name at all. timeout runs in the
# foreground: in a process group of its own, a terminal's Ctrl-C would stop make and leave pytest running.
PYTEST_DEADLINE_S ?= 3600

.PHONY: setup deps install demo docs test test-unit typecheck lint format bench check-cuda-stack peers clean

# A venv with pip, setuptools and the stack's torch build, from a Python 3.11 or later (Kornia 0.9
# has no build for 3.10, Ubuntu 22.04's python3: there `make PYTHON=python3.11`). A venv holds one
# stack: DALI's cuda120 and cuda130 wheels install the same files, so switching starts from `make clean`.
define make_venv
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "make: $(PYTHON) is Python $$($(PYTHON) -c 'import platform; print(platform.python_version())'); gpufeed needs 3.11 or later (Kornia 0.9 has no build for older ones): install one and run make PYTHON=python3.11 (or python3.12)" >&2; exit 2; }
	@case "$(CUDA_STACK)" in cpu|cuda12|cuda13) ;; *) echo "make: CUDA_STACK is '$(CUDA_STACK)', not cpu, cuda12 or cuda13 (an error above says why none was chosen); set it" >&2; exit 2;; esac
	@for other in $(VENV)/.gpufeed-installed-*; do \
		if [ -e "$$other" ] && [ "$$other" != "$(STAMP)" ]; then \
			echo "make: $(VENV) holds the $${other##*-} stack, not $(CUDA_STACK); run 'make clean' first" >&2; exit 2; fi; done
	@echo "CUDA stack: $(CUDA_STACK) (torch: $(TORCH_ARGS))"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip "$(SETUPTOOLS_SPEC)"
	$(BIN)/python -m pip install --quiet $(TORCH_ARGS)
endef

# Writes the stack's requirement set to $(VENV)/requirements.txt and installs it: pyproject.toml's
# runtime dependencies (cuda12: and its cuda12 extra; cuda13: with the CUDA 13 builds of DALI and
# onnxruntime in place of the CUDA 12 ones) and those of the extras named by $(1).
define install_stack_requirements
	$(BIN)/python gpufeed/stack/_choice.py requirements $(CUDA_STACK) $(1) --pyproject pyproject.toml > $(VENV)/requirements.txt
	$(BIN)/python -m pip install --quiet -r $(VENV)/requirements.txt
endef

setup: $(STAMP)

# cpu and cuda12 are gpufeed's own dependencies (and the cuda12 extra); cuda13 replaces two of them,
# which no extra can do: its set is installed first, then gpufeed without dependencies (in that order,
# so pip does not warn that gpufeed's own CUDA 12 lines are unmet).
$(STAMP): pyproject.toml setup.py Makefile gpufeed/stack/_choice.py
	$(make_venv)
ifeq ($(CUDA_STACK),cuda13)
	$(call install_stack_requirements,test)
	$(BIN)/python -m pip install --quiet --no-deps -e .
else
	$(BIN)/python -m pip install --quiet -e ".[test$(if $(filter cuda12,$(CUDA_STACK)),$(comma)cuda12)]"
endif
	touch $@

# The stack's runtime requirement set, from pyproject.toml and gpufeed/stack/_choice.py alone (no
# other source needed): for cpu, exactly pyproject's runtime dependencies.
deps:
	$(make_venv)
	$(call install_stack_requirements,)
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
# A failing run ends with .ci/failures: the failed tests, a line each, and the slowest (a CI log is
# read from its end, where a worker's internal error can bury pytest's own summary).
test: setup docs
	.ci/ensure-prometheus
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	.ci/typecheck
	@rm -rf $(JUNIT_REPORT) $(INFLIGHT_DIR)
	GPUFEED_DOCS_SITE=$(SITE_DIR) GPUFEED_TEST_INFLIGHT_DIR=$(INFLIGHT_DIR) \
		timeout --foreground --signal=INT --kill-after=120 $(PYTEST_DEADLINE_S) $(BIN)/python -m pytest -n $(PYTEST_WORKERS) \
		--dist loadfile --junitxml=$(JUNIT_REPORT) $(PYTEST_ARGS) \
		|| { status=$$?; [ $$status -lt 124 ] || echo "make test: pytest ran past its $(PYTEST_DEADLINE_S) s deadline (PYTEST_DEADLINE_S) and was stopped"; \
		$(BIN)/python .ci/failures $(JUNIT_REPORT) $(INFLIGHT_DIR); exit $$status; }

# The unit tier alone (in-process tests: no child process, no server; tests/conftest.py holds it),
# over two pytest-xdist workers: in-process tests share no port or folder, so they split cleanly.
test-unit: setup
	$(BIN)/python -m pytest -m unit -n 2 $(PYTEST_ARGS)

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
