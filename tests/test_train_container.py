"""The training image installs gpufeed with the Makefile's own set-up, so the two cannot drift."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "docker" / "train.Dockerfile"


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
    out = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), " ".join(rest.split())))
    return out


def test_the_image_installs_with_make_setup_and_nothing_else():
    steps = _instructions(DOCKERFILE.read_text())
    runs = [args for word, args in steps if word == "RUN"]
    installs = [r for r in runs if re.search(r"\bpip\b", r) or r.startswith("make ")]
    assert installs == ['make setup TORCH_SPEC="${TORCH_SPEC}"'], "gpufeed is installed by the Makefile's recipe only"
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^setup: \$\(STAMP\)$", makefile, re.M), "the Makefile still has the setup target"
    recipe = makefile.split("$(STAMP): pyproject.toml Makefile\n", 1)[1].split("\n\n", 1)[0]
    assert '"$(TORCH_SPEC)"' in recipe and '-e ".[test]"' in recipe, "TORCH_SPEC still picks the torch build"
    assert ("COPY", ". /opt/gpufeed") in steps


def test_the_image_is_a_cuda_12_runtime_with_video_decoding_and_gpufeed_as_entrypoint():
    steps = _instructions(DOCKERFILE.read_text())
    base = next(args for word, args in steps if word == "FROM")
    assert re.fullmatch(r"nvidia/cuda:12\.\d+\.\d+-runtime-ubuntu\d\d\.\d\d", base), base
    assert "nvidia-dali-cuda120" in (ROOT / "pyproject.toml").read_text(), "DALI's CUDA 12 build matches the base"
    env = " ".join(args for word, args in steps if word == "ENV")
    caps = re.search(r"NVIDIA_DRIVER_CAPABILITIES=(\S+)", env).group(1)
    assert set(caps.split(",")) == {"compute", "video", "utility"}, "NVDEC needs the video capability"
    entrypoint = next(args for word, args in steps if word == "ENTRYPOINT")
    assert json.loads(entrypoint) == ["gpufeed"]
    assert "PATH=/opt/gpufeed/.venv/bin:$PATH" in env


def test_the_build_context_leaves_out_local_environments_and_the_readme_documents_the_image():
    ignored = (ROOT / "docker" / "train.Dockerfile.dockerignore").read_text().split()
    assert {".venv", "runs", ".git"} <= set(ignored)
    readme = (ROOT / "README.md").read_text()
    assert "## Training container" in readme
    assert "docker build -f docker/train.Dockerfile -t gpufeed-train ." in readme
    assert "docker run --gpus all -v $PWD/data:/data gpufeed-train train --config /data/train.yaml" in readme
