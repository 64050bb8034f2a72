"""The CUDA stack check: does each stack's install set load, as a GPU process would, without a GPU?

For each GPU stack (``cuda12``, ``cuda13``; see :mod:`gpufeed.stack._choice`) the check

1. resolves the install set pip would choose on Linux x86-64 (``pip install --dry-run --report``
   for a manylinux platform, binary wheels only, this machine's pip configuration ignored): torch
   as the Makefile installs it and the stack's requirement set as ``make deps`` installs it
   (:func:`gpufeed.stack._choice.stack_requirements` over ``pyproject.toml``: the runtime
   dependencies and the ``cuda12`` extra, or the runtime dependencies with the CUDA 13 builds);
2. checks that every CUDA build in the set has the stack's CUDA major (DALI's package name,
   onnxruntime's ``build_and_package_info.py``, torch's ``version.py``, the ``nvidia-*`` packages'
   names and folders), and that no two packages install the same shared library;
3. replays the loads of onnxruntime's CUDA provider, DALI and nvImageCodec over the set's files
   (:class:`gpufeed.stack._loader.LoadReplay`), reading each wheel's file list and each shared
   library it meets through HTTP range requests, cached under ``.cache/cuda-stack``.

``python -m gpufeed.stack check`` runs it (``make check-cuda-stack``); the same replay over an
installed environment is :func:`check_installed` (``gpufeed doctor`` uses it).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gpufeed.stack._choice import STACKS, TORCH_VERSION, _name, read_pyproject_requirements, stack_requirements
from gpufeed.stack._loader import Found, LoadReplay, onnxruntime_preload_paths
from gpufeed.stack._sets import FileSet, InstalledSet, RemoteSet

__all__ = ["TORCH_CU126_PINS", "StackReport", "check_installed", "check_stack", "cuda_builds_of", "resolve"]

PYPI = "https://pypi.org/simple"
# What torch 2.13.0+cu126 pins of the libraries onnxruntime shares with it, for when PyTorch's index
# cannot be reached: PyTorch's .github/scripts/generate_binary_build_matrix.py (CUDA 12.6), and its
# RELEASE.md (cuDNN 9.10.2.21 for 2.13's CUDA 12.6 build).
TORCH_CU126_PINS = (
    "nvidia-cuda-nvrtc-cu12==12.6.77",
    "nvidia-cuda-runtime-cu12==12.6.77",
    "nvidia-cudnn-cu12==9.10.2.21",
    "nvidia-cublas-cu12==12.6.4.1",
    "nvidia-cufft-cu12==11.3.0.4",
    "nvidia-curand-cu12==10.3.7.77",
    "nvidia-nvjitlink-cu12==12.6.85",
)
# manylinux tags a Linux x86-64 machine with glibc 2.28 or newer accepts (pip does not widen --platform).
_PLATFORMS = (
    *(f"manylinux_2_{minor}_x86_64" for minor in range(28, 4, -1)),
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
)


@dataclass
class StackReport:
    """One stack's check.

    Attributes:
        stack: ``cuda12`` or ``cuda13``.
        packages: Distribution name -> version, of the resolved set.
        cuda_builds: Which CUDA version each GPU package is built for.
        found: Every library asked for, and how it was found.
        problems: What fails (the check fails when there is any).
        notes: What was assumed or left out (an unreachable index, say).
        seconds: How long the check of this stack took.
        downloaded_bytes: Compressed bytes read from the index (0 when all came from the cache).
    """

    stack: str
    packages: dict[str, str] = field(default_factory=dict)
    cuda_builds: dict[str, str] = field(default_factory=dict)
    found: list[Found] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    downloaded_bytes: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict:
        data = asdict(self)
        data["ok"] = self.ok
        return data


def _stack_requirements(root: Path, stack: str) -> list[str]:
    """The stack's runtime requirement set, from the checkout's ``pyproject.toml`` (as ``make deps`` installs it)."""
    return stack_requirements(stack, declared=read_pyproject_requirements(str(root / "pyproject.toml")))


def _reachable(url: str) -> bool:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=15):
            return True
    except OSError:
        return False


def resolve(
    requirements: list[str],
    *,
    python_version: str = "3.11",
    extra_index_urls: tuple[str, ...] = (),
    constraints: tuple[str, ...] = (),
) -> list[tuple[str, str, str]]:
    """(name, version, wheel URL) of what ``pip install`` would install on Linux x86-64.

    pip runs with this machine's pip configuration and ``PIP_*`` variables ignored (a local wheel
    folder or constraint file would change the answer), against PyPI plus ``extra_index_urls``.

    Raises:
        RuntimeError: pip found no consistent set (its own message is included).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"]
        command += ["--report", str(report), "--only-binary=:all:", "--implementation", "cp"]
        command += ["--python-version", python_version, "--index-url", PYPI, "--disable-pip-version-check"]
        for platform in _PLATFORMS:
            command += ["--platform", platform]
        for url in extra_index_urls:
            command += ["--extra-index-url", url]
        if constraints:
            (Path(tmp) / "constraints.txt").write_text("\n".join(constraints) + "\n")
            command += ["--constraint", str(Path(tmp) / "constraints.txt")]
        proc = subprocess.run([*command, *requirements], env=env, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise RuntimeError(f"pip could not resolve the set: {proc.stderr.strip()[-2000:]}")
        installs = json.loads(report.read_text())["install"]
    return [(i["metadata"]["name"], i["metadata"]["version"], i["download_info"]["url"]) for i in installs]


def cuda_builds_of(files: FileSet) -> dict[str, str]:
    """The CUDA version each GPU package of a set is built for (``{"torch": "13.0", ...}``).

    DALI's is its package name's major (``nvidia-dali-cuda130``: 13), onnxruntime's and torch's
    their build-info files (``None`` builds, the CPU ones, are left out), an ``nvidia-*`` library
    package's its ``-cuNN`` suffix or its ``nvidia/cuNN`` folder.
    """
    builds: dict[str, str] = {}
    for name in files.versions:
        match = re.fullmatch(r"nvidia-dali-cuda(\d+)0", name)
        if match:
            builds[name] = match.group(1)
        elif re.fullmatch(r"nvidia-.*-cu\d+", name):
            builds[name] = name.rsplit("-cu", 1)[1]
    for path, name in files.files.items():
        folder = re.match(r"nvidia/cu(\d+)/", path)
        if folder and name not in builds:
            builds[name] = folder.group(1)
    for label, path, pattern in (
        ("DALI", "nvidia/dali/__init__.py", r"^__cuda_version__\s*=\s*int\('([\d.]+)'"),
        ("onnxruntime", "onnxruntime/capi/build_and_package_info.py", r"^cuda_version\s*=\s*['\"]([\d.]+)['\"]"),
        ("torch", "torch/version.py", r"^cuda\s*(?::[^=]*)?=\s*['\"]([\d.]+)['\"]"),
    ):
        if path in files.files:
            match = re.search(pattern, files.text(path), re.MULTILINE)
            if match:
                builds[label] = match.group(1)
    return builds


def _replay(files: FileSet, cuda_major: int, python_tag: str) -> LoadReplay:
    replay = LoadReplay(files.files, files.elf, cuda_major)
    replay.load_path("DALI", f"nvidia/dali/backend_impl.{python_tag}-x86_64-linux-gnu.so", "import nvidia.dali")
    replay.run_dlopens()
    codec = replay.load_name("nvImageCodec", "libnvimgcodec.so.0", "nvidia/dali/libdali_operators.so", required=True)
    if codec:  # nvImageCodec loads every extension in its extensions folder, by path
        folder = codec.rsplit("/", 1)[0] + "/extensions/"
        for path in sorted(p for p in files.files if p.startswith(folder) and ".so" in p[len(folder) :]):
            replay.load_path("nvImageCodec", path, codec)
    replay.run_dlopens()
    info = "onnxruntime/capi/build_and_package_info.py"
    ort_cuda = re.search(r"cuda_version\s*=\s*['\"]([\d.]*)['\"]", files.text(info)) if info in files.files else None
    if not ort_cuda or not ort_cuda.group(1):
        replay.problems.append(
            "onnxruntime: the set's onnxruntime is not a CUDA build (no cuda_version in its build info)"
        )
        return replay
    for path in onnxruntime_preload_paths(files.text("onnxruntime/__init__.py"), ort_cuda.group(1)):
        if path in files.files:
            replay.load_path("onnxruntime", path, "onnxruntime.preload_dlls()")
        else:  # preload_dlls() then tries the bare name, which only the system's folders can answer
            replay.load_name(
                "onnxruntime", path.rsplit("/", 1)[1], "onnxruntime.preload_dlls()", required=False,
                note=f"not at {path}, where preload_dlls() looks first",
            )  # fmt: skip
    capi = "onnxruntime/capi/"
    replay.load_path("onnxruntime", capi + "libonnxruntime_providers_shared.so", "onnxruntime (by path)")
    replay.load_path("onnxruntime", capi + "libonnxruntime_providers_cuda.so", "onnxruntime (by path)")
    replay.run_dlopens()
    return replay


def _check_set(report: StackReport, files: FileSet, cuda_major: int, python_tag: str) -> None:
    report.packages = dict(sorted(files.versions.items(), key=lambda kv: kv[0].lower()))
    report.cuda_builds = cuda_builds_of(files)
    majors = {version.split(".")[0] for version in report.cuda_builds.values()}
    if majors - {str(cuda_major)}:
        shown = ", ".join(f"{k} {v}" for k, v in sorted(report.cuda_builds.items()))
        report.problems.append(f"CUDA majors {', '.join(sorted(majors))} in one set (want {cuda_major} only): {shown}")
    report.problems.extend(files.collisions)
    replay = _replay(files, cuda_major, python_tag)
    report.found = replay.found
    report.problems.extend(replay.problems)


def check_stack(
    stack: str, *, root: Path, cache: Path, python_version: str = "3.11", torch_index_probe: bool = True
) -> StackReport:
    """Resolve one GPU stack's install set and check it (see the module's docstring).

    Args:
        stack: ``cuda12`` or ``cuda13``.
        root: The checkout (its ``pyproject.toml`` names the packages).
        cache: Where wheel file lists and ELF facts are cached.
        python_version: The target Python (``3.11``): picks wheels and DALI's extension module.
        torch_index_probe: Check first that a stack's torch index answers; when it does not, resolve
            without torch, with :data:`TORCH_CU126_PINS` standing in for its pins (a note says so).

    Raises:
        ValueError: ``stack`` is not a GPU stack.
    """
    if stack not in STACKS or STACKS[stack].cuda_major is None:
        raise ValueError(f"stack {stack!r} is not a GPU stack; allowed: cuda12, cuda13")
    started = time.monotonic()
    spec = STACKS[stack]
    cuda_major = int(spec.cuda_major or 0)
    report = StackReport(stack)
    requirements = _stack_requirements(root, stack)
    args = list(spec.torch_args)
    index = args[args.index("--index-url") + 1] if "--index-url" in args else None
    extra_index: tuple[str, ...] = ()
    constraints: tuple[str, ...] = ()
    if index is None:
        requirements.append(args[0])
    elif not torch_index_probe or _reachable(index + "/torch/"):
        requirements.append(f"{args[0]}+{index.rstrip('/').rsplit('/', 1)[1]}")
        extra_index = (index,)
    else:
        # Without torch's index, torch cannot be in the set; and gpufeed's other dependencies would pull
        # PyPI's torch (a CUDA 13 build) in its place. So the set is the stack's DALI and onnxruntime
        # lines alone, with the pins torch would impose on the libraries it shares with onnxruntime.
        requirements = [r for r in requirements if _name(r).startswith(("nvidia-dali-", "onnxruntime"))]
        constraints = TORCH_CU126_PINS
        report.notes.append(
            f"{index} did not answer: the set is the stack's DALI and onnxruntime lines alone ({'; '.join(requirements)}), "
            f"with torch {TORCH_VERSION}+cu126's pins of the libraries it shares with onnxruntime standing in "
            f"for torch ({', '.join(TORCH_CU126_PINS)})"
        )
    try:
        wheels = resolve(
            requirements, python_version=python_version, extra_index_urls=extra_index, constraints=constraints
        )
    except RuntimeError as err:
        report.problems.append(str(err))
        report.seconds = time.monotonic() - started
        return report
    files = RemoteSet(wheels, cache)
    _check_set(report, files, cuda_major, "cpython-" + python_version.replace(".", ""))
    report.downloaded_bytes = files.downloaded_bytes
    report.seconds = time.monotonic() - started
    return report


def check_installed(site_packages: Path | FileSet, cuda_major: int, python_tag: str | None = None) -> StackReport:
    """The same checks over an installed environment (no network): what ``gpufeed doctor`` reports.

    Args:
        site_packages: The environment's site-packages folder (or its files, already read).
        cuda_major: The CUDA major its GPU packages should share.
        python_tag: DALI's extension tag (``cpython-311``); default this interpreter's.
    """
    started = time.monotonic()
    tag = python_tag or f"cpython-{sys.version_info.major}{sys.version_info.minor}"
    report = StackReport(f"installed (CUDA {cuda_major})")
    files = site_packages if isinstance(site_packages, FileSet) else InstalledSet(site_packages)
    _check_set(report, files, cuda_major, tag)
    report.seconds = time.monotonic() - started
    return report
