"""The CUDA stack: which builds of torch, DALI and onnxruntime go together, and proof that they load.

* :func:`choose_stack` picks ``cpu``, ``cuda12`` or ``cuda13`` from the driver (NVML); the
  Makefile runs the same code before any environment exists (``gpufeed/stack/_choice.py``).
* :func:`stack_requirements` is a stack's requirement set (``python -m gpufeed.stack requirements
  cuda13``): the CUDA 13 stack replaces two runtime dependencies, which no extra can do.
* :func:`check_stack` resolves a stack's install set for Linux x86-64 and replays, without a GPU,
  what onnxruntime's CUDA provider, DALI and nvImageCodec load (ELF ``DT_NEEDED``, RUNPATH, the
  libraries they open by name, versioned symbols); :func:`check_installed` does the same over an
  installed environment.
* :func:`read_elf` is the small ELF reader under both.
"""

from gpufeed.stack._choice import (
    CUDA13_REPLACEMENTS,
    STACKS,
    DriverInfo,
    GpuInfo,
    Stack,
    StackChoiceError,
    choose_stack,
    read_driver,
    read_installed_requirements,
    read_pyproject_requirements,
    stack_requirements,
)
from gpufeed.stack._elf import ElfError, ElfInfo, Symbol, read_elf
from gpufeed.stack._loader import Found, LoadReplay

# For gpufeed's own packages: the names they use from this package's private modules, re-exported
# here (``as`` marks a re-export) so no package reaches into another's ``_*`` modules. Not in the
# API reference; they may change with the code that uses them.
from gpufeed.stack._sets import InstalledSet as InstalledSet
from gpufeed.stack._sets import import_path_folders as import_path_folders
from gpufeed.stack.check import StackReport, check_installed, check_stack, cuda_builds_of

__all__ = [
    "CUDA13_REPLACEMENTS",
    "STACKS",
    "DriverInfo",
    "ElfError",
    "ElfInfo",
    "Found",
    "GpuInfo",
    "LoadReplay",
    "Stack",
    "StackChoiceError",
    "StackReport",
    "Symbol",
    "check_installed",
    "check_stack",
    "choose_stack",
    "cuda_builds_of",
    "read_driver",
    "read_elf",
    "read_installed_requirements",
    "read_pyproject_requirements",
    "stack_requirements",
]
