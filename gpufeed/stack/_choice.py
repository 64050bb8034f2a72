"""Which CUDA stack a machine gets: torch, DALI and onnxruntime built for one CUDA major.

gpufeed runs torch, DALI and onnxruntime's CUDA provider in one process, so their CUDA builds must
share one major, and the driver must support it. Three stacks exist, each a gpufeed extra (the
packages) plus a torch build (installed first, from the index that has it):

* ``cpu``: no NVIDIA driver. DALI's CUDA 12 build (its CPU operators need no GPU) and onnxruntime-gpu
  without CUDA libraries (its CPU provider); the CPU wheel of torch.
* ``cuda12``: a driver whose CUDA version is 12.x, or a GPU older than Turing (compute capability
  below 7.5, which CUDA 13 dropped). ``nvidia-dali-cuda120``, ``onnxruntime-gpu`` 1.21-1.26 (CUDA
  12.x builds) with its ``cuda`` and ``cudnn`` extras, and torch's CUDA 12.6 build from PyTorch's
  own index (PyPI's torch is a CUDA 13 build since 2.11). torch 2.13's CUDA 12.6 build has kernels
  up to Hopper (9.0): a Blackwell GPU needs the CUDA 13 stack, hence a driver with CUDA 13.
* ``cuda13``: a driver whose CUDA version is 13.0 or later (driver 580+) and Turing or newer GPUs.
  ``nvidia-dali-cuda130``, ``onnxruntime-gpu`` 1.27+ (CUDA 13 builds) with ``cuda`` and ``cudnn``,
  and PyPI's torch (a CUDA 13.0 build).

The driver is read through NVML (``libnvidia-ml.so.1``, part of the driver): its CUDA version (what
``nvidia-smi`` prints in its header) and each GPU's compute capability.

This module imports nothing but the standard library, so the Makefile runs it with the system's
Python before any virtual environment exists: ``python3 gpufeed/stack/_choice.py`` prints the
stack's name (``cpu``, ``cuda12`` or ``cuda13``); ``... torch-args STACK`` prints the pip arguments
that install its torch; ``... explain`` says what was found and why.
"""

from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass

__all__ = [
    "STACKS",
    "TORCH_VERSION",
    "DriverInfo",
    "GpuInfo",
    "Stack",
    "StackChoiceError",
    "choose_stack",
    "read_driver",
]

# The torch release every stack installs: the CPU wheel that CI tests, and its CUDA builds.
TORCH_VERSION = "2.13.0"


@dataclass(frozen=True)
class Stack:
    """One coherent set of CUDA builds.

    Attributes:
        name: ``cpu``, ``cuda12`` or ``cuda13``: also the gpufeed extra holding its DALI and onnxruntime.
        cuda_major: The CUDA major its GPU libraries are built for (``None`` for ``cpu``).
        torch_args: pip arguments installing its torch build (a requirement, then any index option).
        min_driver_cuda: The lowest driver CUDA version (major, minor) it runs on.
        compute_capabilities: The lowest and highest GPU compute capability major.minor with kernels
            in all three libraries (inclusive).
        about: One line for people.
    """

    name: str
    cuda_major: int | None
    torch_args: tuple[str, ...]
    min_driver_cuda: tuple[int, int] = (0, 0)
    compute_capabilities: tuple[tuple[int, int], tuple[int, int]] = ((0, 0), (99, 9))
    about: str = ""


STACKS: dict[str, Stack] = {
    "cpu": Stack(
        "cpu",
        None,
        (f"torch=={TORCH_VERSION}",),
        about="no NVIDIA driver: torch's CPU wheel, DALI's CPU operators, onnxruntime's CPU provider",
    ),
    "cuda12": Stack(
        "cuda12",
        12,
        (f"torch=={TORCH_VERSION}", "--index-url", "https://download.pytorch.org/whl/cu126"),
        min_driver_cuda=(12, 0),
        # torch's CUDA 12.6 build: sm_50 to sm_90 (Maxwell to Hopper), no Blackwell kernels.
        compute_capabilities=((5, 0), (9, 9)),
        about="CUDA 12: torch 2.13 cu126 (PyTorch's index), nvidia-dali-cuda120, onnxruntime-gpu 1.21-1.26",
    ),
    "cuda13": Stack(
        "cuda13",
        13,
        (f"torch=={TORCH_VERSION}",),
        min_driver_cuda=(13, 0),
        # CUDA 13 builds start at Turing (7.5): the toolkit dropped Maxwell, Pascal and Volta.
        compute_capabilities=((7, 5), (99, 9)),
        about="CUDA 13: torch 2.13 (PyPI, CUDA 13.0), nvidia-dali-cuda130, onnxruntime-gpu 1.27+",
    ),
}
"""The three stacks by name: ``cpu``, ``cuda12``, ``cuda13`` (each also a gpufeed extra)."""


class StackChoiceError(RuntimeError):
    """No stack fits this machine (a driver too old, or GPUs no single stack has kernels for)."""


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as NVML reports it."""

    index: int
    name: str
    compute_capability: tuple[int, int]


@dataclass(frozen=True)
class DriverInfo:
    """The NVIDIA driver and its GPUs.

    Attributes:
        driver_version: The driver's version string (``"580.65.06"``).
        cuda_version: The newest CUDA version the driver supports, (major, minor): what
            ``nvidia-smi`` prints as "CUDA Version".
        gpus: The GPUs NVML sees (all of them, whatever ``CUDA_VISIBLE_DEVICES`` says).
    """

    driver_version: str
    cuda_version: tuple[int, int]
    gpus: tuple[GpuInfo, ...]

    def describe(self) -> str:
        gpus = ", ".join(f"{g.name} ({g.compute_capability[0]}.{g.compute_capability[1]})" for g in self.gpus)
        return (
            f"driver {self.driver_version} (CUDA {self.cuda_version[0]}.{self.cuda_version[1]}), "
            f"{len(self.gpus)} GPU(s): {gpus or 'none'}"
        )


def _nvml_call(lib, name: str, *args) -> None:
    code = getattr(lib, name)(*args)
    if code != 0:
        lib.nvmlErrorString.restype = ctypes.c_char_p
        text = lib.nvmlErrorString(code)
        raise OSError(f"{name} failed: {text.decode() if text else code}")


def read_driver(library: str = "libnvidia-ml.so.1") -> tuple[DriverInfo | None, str]:
    """The driver's CUDA version and GPUs through NVML, or ``None`` and why not.

    ``None`` when NVML cannot be loaded (no NVIDIA driver: a CPU machine, or a container started
    without the ``utility`` capability), fails to start (a driver/library mismatch after an update
    without a reboot), or sees no GPU.
    """
    try:
        lib = ctypes.CDLL(library)
    except OSError as err:
        return None, f"no NVIDIA driver: {library} cannot be loaded ({err})"
    try:
        _nvml_call(lib, "nvmlInit_v2")
    except OSError as err:
        return None, f"the NVIDIA driver does not answer: {err}"
    try:
        version = ctypes.create_string_buffer(96)
        _nvml_call(lib, "nvmlSystemGetDriverVersion", version, ctypes.c_uint(96))
        cuda = ctypes.c_int()
        _nvml_call(lib, "nvmlSystemGetCudaDriverVersion_v2", ctypes.byref(cuda))
        count = ctypes.c_uint()
        _nvml_call(lib, "nvmlDeviceGetCount_v2", ctypes.byref(count))
        gpus = []
        for index in range(count.value):
            handle = ctypes.c_void_p()
            _nvml_call(lib, "nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(index), ctypes.byref(handle))
            name = ctypes.create_string_buffer(96)
            _nvml_call(lib, "nvmlDeviceGetName", handle, name, ctypes.c_uint(96))
            major, minor = ctypes.c_int(), ctypes.c_int()
            _nvml_call(lib, "nvmlDeviceGetCudaComputeCapability", handle, ctypes.byref(major), ctypes.byref(minor))
            gpus.append(GpuInfo(index, name.value.decode(errors="replace"), (major.value, minor.value)))
    except OSError as err:
        return None, f"NVML answered but a query failed: {err}"
    finally:
        lib.nvmlShutdown()
    info = DriverInfo(
        version.value.decode(errors="replace"), (cuda.value // 1000, cuda.value % 1000 // 10), tuple(gpus)
    )
    if not gpus:
        return None, f"the NVIDIA driver sees no GPU ({info.describe()})"
    return info, info.describe()


def _fits(stack: Stack, gpu: GpuInfo) -> bool:
    low, high = stack.compute_capabilities
    return low <= gpu.compute_capability <= high


def choose_stack(driver: DriverInfo | None) -> tuple[Stack, str]:
    """The stack for this driver and its GPUs, and why, in words.

    The CUDA 13 stack where the driver supports CUDA 13 and every GPU is Turing or newer; the CUDA
    12 stack where the driver's CUDA is 12.x or a GPU predates Turing; ``cpu`` without a driver.

    Raises:
        StackChoiceError: The driver's CUDA is older than 12.0, or a GPU (a Blackwell on a CUDA 12
            driver) has kernels in no stack the driver can run; the message says what to change.
    """
    if driver is None:
        return STACKS["cpu"], "no NVIDIA GPU"
    cuda = driver.cuda_version
    shown = f"CUDA {cuda[0]}.{cuda[1]}"
    if cuda < STACKS["cuda12"].min_driver_cuda:
        raise StackChoiceError(
            f"the NVIDIA driver {driver.driver_version} supports {shown}; DALI and onnxruntime need CUDA 12.0 or "
            "later (driver 525+): update the driver, or set CUDA_STACK=cpu"
        )
    cuda13, cuda12 = STACKS["cuda13"], STACKS["cuda12"]
    if cuda >= cuda13.min_driver_cuda and all(_fits(cuda13, g) for g in driver.gpus):
        return cuda13, f"the driver supports {shown} and every GPU is Turing (7.5) or newer"
    if all(_fits(cuda12, g) for g in driver.gpus):
        if cuda >= cuda13.min_driver_cuda:
            old = next(g for g in driver.gpus if not _fits(cuda13, g))
            return cuda12, (
                f"{old.name} (compute capability {old.compute_capability[0]}.{old.compute_capability[1]}) predates "
                "Turing, which CUDA 13 builds need"
            )
        return cuda12, f"the driver supports {shown} (CUDA 13 needs driver 580 or later)"
    new = next(g for g in driver.gpus if not _fits(cuda12, g))
    raise StackChoiceError(
        f"{new.name} (compute capability {new.compute_capability[0]}.{new.compute_capability[1]}) needs the CUDA 13 "
        f"builds (torch {TORCH_VERSION}'s CUDA 12.6 build has no kernels for it), but driver {driver.driver_version} "
        f"supports {shown} only: update the driver to 580 or later"
    )


def _main(argv: list[str]) -> int:
    command = argv[0] if argv else "stack"
    if command == "torch-args" and len(argv) == 2 and argv[1] in STACKS:
        print(" ".join(STACKS[argv[1]].torch_args))
        return 0
    if command not in ("stack", "explain") or len(argv) > 1:
        print(
            f"usage: _choice.py [stack | explain | torch-args {{{','.join(STACKS)}}}] (got {' '.join(argv)!r})",
            file=sys.stderr,
        )
        return 2
    driver, found = read_driver()
    try:
        stack, why = choose_stack(driver)
    except StackChoiceError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{stack.name}: {why} ({found}); {stack.about}" if command == "explain" else stack.name)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
