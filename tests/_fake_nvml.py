"""Stand-ins for NVML (``libnvidia-ml.so.1``) with a machine's answers, compiled from C for a test.

gpufeed reads NVML through ``ctypes`` (the stack choice, ``bench loader``'s engine figures): a real
shared library with the functions it calls, answering as a node would, tests that code without a
GPU. Tests using it are in the ``process`` tier (the compiler runs as a child process).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


def compile_nvml(folder: Path, source: str, name: str = "libnvidia-ml-fake.so") -> str:
    """Compile ``source`` (C) into a shared library in ``folder``; its path. Skips without a C compiler."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler to build a stand-in NVML")
    (folder / f"{name}.c").write_text(source)
    library = folder / name
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(library), str(folder / f"{name}.c")], check=True, timeout=60)
    return str(library)
