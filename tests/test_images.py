"""The container images and the compose stack's jobs.

The images install in two layers with the Makefile's recipes: `make deps` (the CUDA stack's torch
and its requirement set, from pyproject.toml, the Makefile and the stack table alone, so source
edits never reinstall them), then the source and `make install` (gpufeed, not editable, no
dependencies, no extras). The compose trainer's real
command runs twice against one run folder, as two `docker compose up` would run it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
IMAGES = {"train": DOCKER / "train.Dockerfile", "server": DOCKER / "server.Dockerfile"}


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
    out = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), " ".join(rest.split())))
    return out


def _recipe(target: str) -> str:
    makefile = (ROOT / "Makefile").read_text()
    match = re.search(rf"^{re.escape(target)}:[^\n]*\n((?:\t[^\n]*\n)+)", makefile, re.M)
    assert match, f"the Makefile has no {target} recipe"
    return match.group(1)


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_dependencies_install_before_the_source_is_copied(image):
    steps = _instructions(IMAGES[image].read_text())
    copies = [i for i, (word, _) in enumerate(steps) if word in ("COPY", "ADD")]
    runs = [(i, args) for i, (word, args) in enumerate(steps) if word == "RUN"]
    deps = [i for i, args in runs if args.startswith("make deps ")]
    install = [i for i, args in runs if args.startswith("make -C src install ")]
    assert len(deps) == 1 and len(install) == 1, runs
    # Only pyproject.toml, the Makefile and the stack table (standard library only) are in the image
    # when the dependencies install.
    assert [steps[i][1] for i in copies if i < deps[0]] == [
        "pyproject.toml Makefile ./",
        "gpufeed/stack/_choice.py ./gpufeed/stack/",
    ]
    assert [steps[i][1] for i in copies if deps[0] < i] == [". /opt/gpufeed/src"]
    assert install[0] > max(copies)
    # Nothing else installs packages, and no extra ([test], [bench] ...) gets in.
    installers = [args for _, args in runs if re.search(r"\bpip install\b|^make ", args)]
    assert len(installers) == 2 and not any("[" in args for args in installers), installers
    # The install step removes the source and proves the installed CLI starts.
    assert "rm -rf src gpufeed" in steps[install[0]][1] and "gpufeed --help" in steps[install[0]][1]
    assert steps[deps[0]][1] == 'make deps CUDA_STACK="${CUDA_STACK}" PYTHON=python3'
    assert ("ARG", "CUDA_STACK=cuda12") in steps[: deps[0]], "the default stack runs on CUDA 12 and 13 drivers"


def test_the_makefile_recipes_the_images_use():
    deps, install, setup = _recipe("deps"), _recipe("install"), _recipe("$(STAMP)")
    makefile = (ROOT / "Makefile").read_text()
    requirements = makefile.split("define install_stack_requirements\n", 1)[1].split("endef", 1)[0]
    assert (
        "_choice.py requirements $(CUDA_STACK) $(1) --pyproject pyproject.toml > $(VENV)/requirements.txt"
        in requirements
    )
    assert "pip install --quiet -r $(VENV)/requirements.txt" in requirements
    assert deps.split("\n")[:2] == ["\t$(make_venv)", "\t$(call install_stack_requirements,)"], "deps: no extra"
    assert "-e " not in deps and "[" not in deps, "deps: no extra"
    assert re.search(r"pip install --quiet --no-deps --no-build-isolation \.$", install.strip()), install
    assert "$(make_venv)" in setup
    # cpu and cuda12 through pip's extras; cuda13 (no extra can replace a dependency) by its set, then --no-deps.
    stamp = makefile.split("\n$(STAMP):", 1)[1].split("\ttouch $@", 1)[0]
    cuda13, other = stamp.split("\nifeq ($(CUDA_STACK),cuda13)\n", 1)[1].split("\nelse\n", 1)
    assert cuda13.split("\n")[:2] == [
        "\t$(call install_stack_requirements,test)",
        "\t$(BIN)/python -m pip install --quiet --no-deps -e .",
    ]
    assert '-e ".[test$(if $(filter cuda12,$(CUDA_STACK)),$(comma)cuda12)]"' in other.split("endif", 1)[0]
    make_venv = makefile.split("define make_venv\n", 1)[1].split("endef", 1)[0]
    assert "pip install --quiet $(TORCH_ARGS)" in make_venv and '"$(SETUPTOOLS_SPEC)"' in make_venv


@pytest.mark.parametrize("stack", ["cpu", "cuda12", "cuda13"])
def test_make_deps_reads_exactly_the_stacks_set_from_pyproject(stack, tmp_path):
    """What `make deps` installs, printed as the image runs it: from pyproject.toml and the stack table alone."""
    import tomllib

    (tmp_path / "gpufeed" / "stack").mkdir(parents=True)
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    shutil.copy(ROOT / "gpufeed" / "stack" / "_choice.py", tmp_path / "gpufeed" / "stack")
    command = [sys.executable, "-I", "gpufeed/stack/_choice.py", "requirements", stack, "--pyproject", "pyproject.toml"]
    proc = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime, extras = project["dependencies"], project["optional-dependencies"]
    lines = proc.stdout.splitlines()
    if stack == "cpu":  # the CPU machine's set, as before the stacks: the runtime dependencies, exactly
        assert lines == runtime
    elif stack == "cuda12":
        assert lines == runtime + extras["cuda12"]
    else:
        replaced = {"nvidia-dali-cuda120>=2.4": "nvidia-dali-cuda130>=2.4",
                    "onnxruntime-gpu>=1.20,<1.27": "onnxruntime-gpu[cuda,cudnn]>=1.27,<1.29"}  # fmt: skip
        assert lines == [replaced.get(line, line) for line in runtime]


def test_the_setuptools_floor_is_the_same_for_the_build_and_the_venv():
    import tomllib

    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    floor = next(r for r in requires if r.startswith("setuptools"))
    assert re.search(rf"^SETUPTOOLS_SPEC := {re.escape(floor)}$", (ROOT / "Makefile").read_text(), re.M)
    import setuptools

    wanted = tuple(int(x) for x in floor.split(">=")[1].split("."))
    have = tuple(int(x) for x in re.findall(r"\d+", setuptools.__version__)[:3])
    assert have >= wanted, f"this venv's setuptools {setuptools.__version__} is older than {floor}: run make setup"


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_the_build_context_leaves_out_environments_tests_and_outputs(image):
    ignored = set((DOCKER / f"{IMAGES[image].name}.dockerignore").read_text().split())
    assert {".venv", "runs", ".git", "tests", "docker", "**/__pycache__", "*.egg-info", "build"} <= ignored
    # Everything setup.py builds from is in the context.
    assert not ignored & {"gpufeed", "pipelines", "models", "server", "setup.py", "pyproject.toml", "README.md"}


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_the_images_hold_one_cuda_stack_with_video_decoding_and_gpufeed_as_entrypoint(image):
    steps = _instructions(IMAGES[image].read_text())
    base = next(args for word, args in steps if word == "FROM")
    # No CUDA in the base: every CUDA library is a wheel of the stack, so there is one copy, of one major.
    assert re.fullmatch(r"ubuntu:\d\d\.\d\d", base), base
    env = " ".join(args for word, args in steps if word == "ENV")
    caps = re.search(r"NVIDIA_DRIVER_CAPABILITIES=(\S+)", env).group(1)
    assert set(caps.split(",")) == {"compute", "video", "utility"}, "NVDEC needs the video capability"
    assert json.loads(next(args for word, args in steps if word == "ENTRYPOINT")) == ["gpufeed"]
    assert "PATH=/opt/gpufeed/.venv/bin:$PATH" in env
    if image == "server":
        assert json.loads(next(args for word, args in steps if word == "CMD"))[0] == "serve"


def test_the_docs_document_the_training_image():
    page = (ROOT / "docs" / "container.md").read_text()
    assert page.startswith("# Training container")
    assert "docker build -f docker/train.Dockerfile -t gpufeed-train ." in page
    assert "docker run --gpus all -v $PWD/data:/data gpufeed-train train --config /data/train.yaml" in page


def _trainer_command(synth_dir: Path, work: Path) -> list[str]:
    """The compose trainer's command, its container paths mapped to this machine and sized for a CPU."""
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    config = (DOCKER / "stack" / "train.yaml").read_text().replace("/gpufeed/data/", f"{synth_dir}/")
    (work / "train.yaml").write_text(config)
    mapped = []
    for arg in compose["services"]["trainer"]["command"]:
        arg = arg.replace("/etc/gpufeed/train.yaml", str(work / "train.yaml")).replace("/gpufeed/", f"{work}/")
        arg = re.sub(r"\$\{GPUFEED_LINGER_SECONDS:-\d+\}", "0", arg)
        mapped.append(arg.replace("metrics_host=0.0.0.0", "metrics_host=127.0.0.1").replace("port=9400", "port=0"))
    cpu = ["device=cpu", "model.name=smallcnn", "train.epochs=1"]
    return [sys.executable, "-m", "gpufeed", *mapped, *(x for s in cpu for x in ("--set", s))]


@pytest.mark.timeout(300)
def test_the_compose_trainer_command_ends_cleanly_on_a_second_up(synth_dir, tmp_path):
    cmd = _trainer_command(synth_dir, tmp_path)
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert first.returncode == 0, first.stdout + first.stderr
    checkpoints = sorted((tmp_path / "runs" / "train" / "checkpoints").glob("ckpt-*.pt"))
    assert checkpoints
    before = {p.name: p.read_bytes() for p in checkpoints}
    # The second `up` runs the same command on the finished run: nothing to train, exit 0, so
    # the export and server services that wait for it start.
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "nothing left to train" in second.stderr, second.stderr
    # Both lines count epochs alike: it said "epoch 2" (the next, 1-based), then "epoch 1 of 1".
    (resumed,) = [line for line in second.stderr.splitlines() if "resumed from" in line]
    (nothing,) = [line for line in second.stderr.splitlines() if "nothing left to train" in line]
    assert resumed.endswith("1 epoch(s) done") and "1 of 1 epoch(s) done" in nothing, second.stderr
    after = sorted((tmp_path / "runs" / "train" / "checkpoints").glob("ckpt-*.pt"))
    assert {p.name: p.read_bytes() for p in after} == before, "the finished run's checkpoints changed"
