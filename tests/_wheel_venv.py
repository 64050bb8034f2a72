"""The wheel as users install it, built once a session for the tests that run the installed package.

The checkout's files are copied, an sdist is built from the copy with setuptools' own build hooks
and a wheel from that sdist (what ``python -m build`` does), using the test venv's setuptools
(no build isolation: no network). The wheel goes into a new venv whose only other packages are
the test venv's *runtime* dependencies, seen through a folder of links that leaves out gpufeed's
editable install and every package of the ``bench``, ``demo`` and ``test`` extras. Commands run
from a folder outside the checkout, so nothing in it can stand in for the installed package.

``conftest.py`` imports :func:`installed`; the test files that use it (``test_package_install.py``,
``test_dense_wheel.py``) take it from there and import only the helpers.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Not source: local environments, outputs and caches of a working checkout.
_NOT_SOURCE = shutil.ignore_patterns(".*", "runs", "build", "dist", "*.egg-info", "__pycache__")


def run_cmd(cmd: list[str], cwd: Path, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, f"{' '.join(proc.args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def _copy_source(dest: Path) -> Path:
    """The files a clone would have: git's tracked and unignored files, or the tree minus non-source."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True
    )
    if listed.returncode != 0:
        return Path(shutil.copytree(ROOT, dest, ignore=_NOT_SOURCE))
    for name in filter(None, listed.stdout.decode().split("\0")):
        if (ROOT / name).is_file():  # listed but deleted in the working tree: not there
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    return dest


def _extras_only_distributions() -> set[str]:
    """Distributions named by gpufeed's extras and not by its runtime dependencies."""

    def name(requirement: str) -> str:
        return re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement).group(1)

    requires = importlib.metadata.requires("gpufeed") or []
    runtime = {name(r).lower() for r in requires if "extra ==" not in r}
    extras = {name(r).lower() for r in requires if re.search(r"extra\s*==", r)}
    return extras - runtime - {"gpufeed"}


def runtime_view(view: Path, also_without: tuple[str, ...] = ()) -> set[str]:
    """Links to the test venv's packages, minus gpufeed itself, the extras' packages and the top-level
    entries of the ``also_without`` distributions; returns those left out."""
    left_out = {p for p in os.listdir(sysconfig.get_paths()["purelib"]) if p.startswith(("gpufeed", "__editable__"))}
    for dist_name in also_without:
        dist = importlib.metadata.distribution(dist_name)
        left_out |= {Path(str(f)).parts[0] for f in dist.files or () if not str(f).startswith("..")}
    for dist_name in _extras_only_distributions():
        dist = importlib.metadata.distribution(dist_name)
        left_out |= {Path(str(f)).parts[0] for f in dist.files or () if not str(f).startswith("..")}
    site = Path(sysconfig.get_paths()["purelib"])
    view.mkdir()
    for entry in site.iterdir():
        if entry.name not in left_out and not entry.name.endswith(".pth"):
            (view / entry.name).symlink_to(entry)
    return left_out


@pytest.fixture(scope="session")
def installed(tmp_path_factory) -> dict:
    """Build sdist and wheel from a copy of the checkout; install the wheel into a fresh venv.

    Session-wide and defined once, in ``conftest.py``'s namespace: a module that imported it itself
    would get its own copy, built again (pytest keys a fixture by the module it is found in).
    """
    work = tmp_path_factory.mktemp("package")
    src = _copy_source(work / "src")
    dist = work / "dist"
    hook = "import sys, setuptools.build_meta as b; print(b.build_sdist(sys.argv[1]))"
    sdist = dist / ok(run_cmd([sys.executable, "-c", hook, dist], cwd=src)).stdout.strip().splitlines()[-1]
    shutil.rmtree(src)  # from here on, only the sdist and what is built from it
    ok(run_cmd([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
              "-w", dist, sdist], cwd=work, timeout=300))  # fmt: skip
    (wheel,) = dist.glob("gpufeed-*.whl")

    venv = work / "venv"
    ok(run_cmd([sys.executable, "-m", "venv", "--without-pip", venv], cwd=work))
    python = venv / "bin" / "python"
    purelib = ok(run_cmd([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=work))
    left_out = runtime_view(work / "runtime-deps")
    (Path(purelib.stdout.strip()) / "gpufeed-test-runtime-deps.pth").write_text(f"{work / 'runtime-deps'}\n")
    ok(run_cmd([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "-q", wheel],
             cwd=work, timeout=300))  # fmt: skip

    outside = work / "elsewhere"  # the working directory of every command: not the checkout
    outside.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GPUFEED_STACK_DIR", "VIRTUAL_ENV")}
    return {
        "sdist": sdist,
        "wheel": wheel,
        "venv": venv,
        "site": Path(purelib.stdout.strip()),
        "gpufeed": venv / "bin" / "gpufeed",
        "python": python,
        "cwd": outside,
        "env": env,
        "left_out": left_out,
    }
