"""Which CUDA stack a machine gets: torch, DALI and onnxruntime built for one CUDA major.

gpufeed runs torch, DALI and onnxruntime's CUDA provider in one process, so their CUDA builds must
share one major, and the driver must support it. gpufeed's runtime dependencies are the CUDA 12
builds (``nvidia-dali-cuda120``, ``onnxruntime-gpu`` 1.20-1.26): what ``pip install gpufeed``, the
CPU machine and CI get. Three stacks build on them, each with a torch build installed first:

* ``cpu``: no NVIDIA driver. The runtime dependencies alone (DALI's CPU operators, onnxruntime's
  CPU provider, no CUDA library wheels) and torch's CPU wheel.
* ``cuda12``: every GPU has kernels in the CUDA 12 builds (Pascal to Hopper), on any driver
  with CUDA 12.0 or later, 13 included. The runtime dependencies, the ``cuda12`` extra (the CUDA
  libraries onnxruntime's CUDA provider loads) and torch's cu126 build from PyTorch's index.
* ``cuda13``: a GPU newer than Hopper (Blackwell) on a CUDA 13 driver (580+). Not an extra: its
  ``nvidia-dali-cuda130`` installs the same files as ``nvidia-dali-cuda120``, so it must replace it.
  gpufeed goes in with ``--no-deps``, then :func:`stack_requirements` ``("cuda13")``; PyPI's torch.

The driver is read through NVML (``libnvidia-ml.so.1``, part of the driver): its CUDA version (what
``nvidia-smi`` prints in its header) and each GPU's compute capability.

This module imports nothing but the standard library (and ``tomli`` on Python 3.10, to read
pyproject.toml), so the Makefile runs it before gpufeed is installed: ``python3
gpufeed/stack/_choice.py`` prints the stack's name (``cpu``, ``cuda12`` or ``cuda13``); ``...
torch-args STACK`` the pip arguments that install its torch; ``... explain`` what was found and why;
``... requirements STACK [EXTRA ...] [--pyproject FILE]`` the stack's requirement set.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import re
import sys
from dataclasses import dataclass

__all__ = [
    "CUDA13_REPLACEMENTS",
    "STACKS",
    "TORCH_VERSION",
    "DriverInfo",
    "GpuInfo",
    "Stack",
    "StackChoiceError",
    "choose_stack",
    "read_driver",
    "read_installed_requirements",
    "read_pyproject_requirements",
    "stack_requirements",
]

# The torch release every stack installs: the CPU wheel that CI tests, and its CUDA builds.
TORCH_VERSION = "2.13.0"


@dataclass(frozen=True)
class Stack:
    """One coherent set of CUDA builds.

    Attributes:
        name: ``cpu``, ``cuda12`` or ``cuda13``.
        cuda_major: The CUDA major its GPU libraries are built for (``None`` for ``cpu``).
        torch_args: pip arguments installing its torch build (a requirement, then any index option).
        min_driver_cuda: The lowest driver CUDA version (major, minor) it runs on.
        compute_capabilities: The lowest and highest GPU compute capability major.minor with kernels
            in all three libraries (inclusive).
        about: One line for people.
        install: The shell line that installs it from a package index, without a checkout.
    """

    name: str
    cuda_major: int | None
    torch_args: tuple[str, ...]
    min_driver_cuda: tuple[int, int] = (0, 0)
    compute_capabilities: tuple[tuple[int, int], tuple[int, int]] = ((0, 0), (99, 9))
    about: str = ""
    install: str = ""


_CU126_INDEX = "https://download.pytorch.org/whl/cu126"
_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
STACKS: dict[str, Stack] = {
    "cpu": Stack(
        "cpu",
        None,
        # The CPU build by its local version: PyPI's torch 2.13.0 is the CUDA 13 build (GBs of CUDA
        # libraries beside DALI's and onnxruntime's CUDA 12 ones). An extra index, so a machine
        # holding the wheel locally (pip's find-links) needs no answer from PyTorch's; one retry, so
        # an index out of reach costs a moment per package rather than five tries with back-off.
        (f"torch=={TORCH_VERSION}+cpu", "--extra-index-url", _CPU_INDEX, "--retries", "1"),
        about="no NVIDIA driver: torch's CPU wheel, DALI's CPU operators, onnxruntime's CPU provider",
        install=f"pip install torch=={TORCH_VERSION} --index-url {_CPU_INDEX} && pip install gpufeed",
    ),
    "cuda12": Stack(
        "cuda12",
        12,
        (f"torch=={TORCH_VERSION}", "--index-url", _CU126_INDEX),
        min_driver_cuda=(12, 0),
        # torch's CUDA 12.6 build: sm_50 to sm_90 (Maxwell to Hopper), no Blackwell kernels; onnxruntime-gpu
        # 1.26's provider: sm_60 and later (no Maxwell code).
        compute_capabilities=((6, 0), (9, 9)),
        about="CUDA 12: torch 2.13 cu126 (PyTorch's index), nvidia-dali-cuda120, onnxruntime-gpu 1.21-1.26",
        install=f"pip install torch=={TORCH_VERSION} --index-url {_CU126_INDEX} && pip install 'gpufeed[cuda12]'",
    ),
    "cuda13": Stack(
        "cuda13",
        13,
        (f"torch=={TORCH_VERSION}",),
        min_driver_cuda=(13, 0),
        # CUDA 13 builds start at Turing (7.5): the toolkit dropped Maxwell, Pascal and Volta.
        compute_capabilities=((7, 5), (99, 9)),
        about="CUDA 13: torch 2.13 (PyPI, CUDA 13.0), nvidia-dali-cuda130, onnxruntime-gpu 1.27+",
        install=f"pip install torch=={TORCH_VERSION} && pip install --no-deps gpufeed && "
        "pip install -r <(python -m gpufeed.stack requirements cuda13)",
    ),
}
"""The three stacks by name: ``cpu``, ``cuda12``, ``cuda13``."""

CUDA13_REPLACEMENTS = {
    "nvidia-dali-cuda120": "nvidia-dali-cuda130>=2.4",
    # 1.27 is the first onnxruntime-gpu on PyPI built for CUDA 13 (its build info says 13.0); from 1.29
    # its CUDA provider holds no sm_100 code and no PTX (only 7.5-9.0 and 12.0): no kernels for a B200.
    "onnxruntime-gpu": "onnxruntime-gpu[cuda,cudnn]>=1.27,<1.29",
}
"""The CUDA 13 stack's requirement in place of each CUDA 12 runtime dependency, by its name."""


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


# NVML_ERROR_NO_PERMISSION: a GPU the node has and this process may not use (another job's, under
# cgroups: SLURM's ConstrainDevices, some Kubernetes set-ups). nvmlDeviceGetCount_v2 counts it too.
_NVML_NO_PERMISSION = 4


def read_driver(library: str = "libnvidia-ml.so.1", *, strict: bool = False) -> tuple[DriverInfo | None, str]:
    """The driver's CUDA version and the GPUs this process may use, through NVML, or ``None`` and why not.

    ``None`` when NVML cannot be loaded (no NVIDIA driver: a CPU machine, or a container started
    without the ``utility`` capability), fails to start (a driver/library mismatch after an update
    without a reboot) or to answer, or sees no GPU. GPUs NVML refuses with ``NO_PERMISSION`` are
    left out.

    Raises:
        StackChoiceError: ``strict`` and NVML loads but fails: a GPU machine whose driver cannot be
            read, which must not be taken for one without a GPU (the cpu stack).
    """
    try:
        lib = ctypes.CDLL(library)
    except OSError as err:
        return None, f"no NVIDIA driver: {library} cannot be loaded ({err})"
    try:
        _nvml_call(lib, "nvmlInit_v2")
    except OSError as err:
        if strict:
            raise StackChoiceError(
                f"the NVIDIA driver does not answer ({err}): reboot after a driver update, or set CUDA_STACK"
            ) from None
        return None, f"the NVIDIA driver does not answer: {err}"
    refused = 0
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
            if lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(handle)) == _NVML_NO_PERMISSION:
                refused += 1
                continue
            _nvml_call(lib, "nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(index), ctypes.byref(handle))
            name = ctypes.create_string_buffer(96)
            _nvml_call(lib, "nvmlDeviceGetName", handle, name, ctypes.c_uint(96))
            major, minor = ctypes.c_int(), ctypes.c_int()
            _nvml_call(lib, "nvmlDeviceGetCudaComputeCapability", handle, ctypes.byref(major), ctypes.byref(minor))
            gpus.append(GpuInfo(index, name.value.decode(errors="replace"), (major.value, minor.value)))
    except OSError as err:
        if strict:
            raise StackChoiceError(f"NVML answered but a query failed ({err}): set CUDA_STACK") from None
        return None, f"NVML answered but a query failed: {err}"
    finally:
        lib.nvmlShutdown()
    info = DriverInfo(
        version.value.decode(errors="replace"), (cuda.value // 1000, cuda.value % 1000 // 10), tuple(gpus)
    )
    others = f"; {refused} more this process may not use" if refused else ""
    if not gpus:
        return None, f"the NVIDIA driver sees no GPU this process may use ({info.describe()}{others})"
    return info, info.describe() + others


def _fits(stack: Stack, gpu: GpuInfo) -> bool:
    low, high = stack.compute_capabilities
    return low <= gpu.compute_capability <= high


def _cc(gpu: GpuInfo) -> str:
    return f"{gpu.name} (compute capability {gpu.compute_capability[0]}.{gpu.compute_capability[1]})"


def choose_stack(driver: DriverInfo | None) -> tuple[Stack, str]:
    """The stack for this driver and its GPUs, and why, in words.

    The CUDA 12 stack wherever the CUDA 12 builds have kernels for every GPU (Pascal to
    Hopper), whatever the driver's CUDA (12.x or 13: a driver runs the builds of older CUDA
    versions); the CUDA 13 stack only where a GPU is newer (Blackwell); ``cpu`` without a driver.
    CUDA 12 is the default because it is gpufeed's own dependency set, the one CI tests and
    ``pip install gpufeed`` gives; the CUDA 13 stack is installed around it (see the module).

    Raises:
        StackChoiceError: The driver's CUDA is older than 12.0, a GPU newer than Hopper sits on a
            CUDA 12 driver, or the GPUs need kernels no single stack has; the message says what to change.
    """
    if driver is None:
        return STACKS["cpu"], "no NVIDIA GPU"
    cuda = driver.cuda_version
    shown = f"CUDA {cuda[0]}.{cuda[1]}"
    cuda12, cuda13 = STACKS["cuda12"], STACKS["cuda13"]
    if cuda < cuda12.min_driver_cuda:
        raise StackChoiceError(
            f"the NVIDIA driver {driver.driver_version} supports {shown}; DALI and onnxruntime need CUDA 12.0 or "
            "later (driver 525+): update the driver, or set CUDA_STACK=cpu"
        )
    if all(_fits(cuda12, g) for g in driver.gpus):
        return cuda12, f"the CUDA 12 builds have kernels for every GPU (6.0 to 9.x) and the driver supports {shown}"
    new = next(g for g in driver.gpus if not _fits(cuda12, g))
    if new.compute_capability < cuda12.compute_capabilities[0]:
        raise StackChoiceError(f"{_cc(new)} is older than every stack's kernels (6.0 and up): use CUDA_STACK=cpu")
    if cuda < cuda13.min_driver_cuda:
        raise StackChoiceError(
            f"{_cc(new)} needs the CUDA 13 builds (torch {TORCH_VERSION}'s CUDA 12.6 build has no kernels for it), "
            f"but driver {driver.driver_version} supports {shown} only: update the driver to 580 or later"
        )
    old = next((g for g in driver.gpus if not _fits(cuda13, g)), None)
    if old is not None:
        raise StackChoiceError(
            f"{_cc(new)} needs the CUDA 13 builds, which have no kernels for {_cc(old)}: no one stack runs both; "
            "set CUDA_STACK to the stack of the GPUs you use (cuda13 for the first, cuda12 for the second)"
        )
    return cuda13, f"{_cc(new)} has no kernels in torch's CUDA 12.6 build; the driver supports {shown}"


# --- requirement sets ------------------------------------------------------------------------------

_EXTRA_MARKER = re.compile(r"""extra\s*==\s*(['"])([^'"]+)\1""")


def _name(requirement: str) -> str:
    """A requirement's distribution name, normalized (PEP 503)."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if match is None:
        raise ValueError(f"not a requirement: {requirement!r}")
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def read_pyproject_requirements(path: str) -> tuple[list[str], dict[str, list[str]]]:
    """(runtime dependencies, extras by name) from a ``pyproject.toml`` (``tomli`` on Python 3.10)."""
    # Deferred: tomllib is Python 3.11's; the Makefile's venv has tomli on 3.10.
    toml = __import__("tomllib" if sys.version_info >= (3, 11) else "tomli")
    with open(path, "rb") as f:
        project = toml.load(f)["project"]
    return list(project["dependencies"]), {k: list(v) for k, v in project.get("optional-dependencies", {}).items()}


def _top_or(marker: str) -> bool:
    """Whether ``marker`` has an ``or`` outside parentheses (so ``and`` would not bind to all of it)."""
    depth = 0
    for token in re.findall(r"\(|\)|\bor\b|'[^']*'|\"[^\"]*\"", marker):
        depth += {"(": 1, ")": -1}.get(token, 0)
        if token == "or" and depth == 0:
            return True
    return False


def read_installed_requirements(distribution: str = "gpufeed") -> tuple[list[str], dict[str, list[str]]]:
    """The same, from an installed distribution's metadata (its ``Requires-Dist`` lines).

    An extra's lines carry an ``extra == "name"`` clause, which is taken off; their other markers
    (``sys_platform == 'linux'``) stay, for pip to evaluate.

    Raises:
        importlib.metadata.PackageNotFoundError: The distribution is not installed.
        ValueError: A line ties its extra to the rest of its marker in a way this cannot undo (an ``or``).
    """
    runtime: list[str] = []
    extras: dict[str, list[str]] = {}
    for line in importlib.metadata.requires(distribution) or []:
        requirement, _, marker = (part.strip() for part in line.partition(";"))
        found = _EXTRA_MARKER.search(marker)
        if found is None:
            runtime.append(line.strip())
            continue
        # setuptools writes '<marker> and extra == "x"' (the marker parenthesized when it has an 'or').
        before, after = marker[: found.start()].strip(), marker[found.end() :].strip()
        joined = re.fullmatch(r"(.*)\s+and", before) if before else re.fullmatch(r"and\s+(.*)", after)
        joined = None if before and after else joined
        rest = joined.group(1).strip() if joined else ""
        if (before or after) and (not joined or _EXTRA_MARKER.search(rest) or _top_or(rest)):
            raise ValueError(f"{distribution}'s requirement {line!r} ties its extra to another marker")
        extras.setdefault(found.group(2), []).append(requirement + (f"; {rest}" if rest else ""))
    return runtime, extras


def stack_requirements(
    stack: str, extras: tuple[str, ...] | list[str] = (), declared: tuple[list[str], dict[str, list[str]]] | None = None
) -> list[str]:
    """What to install with gpufeed (after ``pip install --no-deps``) for one stack, one requirement a line.

    ``cpu``: the runtime dependencies; ``cuda12``: those and the ``cuda12`` extra; ``cuda13``: the
    runtime dependencies with :data:`CUDA13_REPLACEMENTS` in place of the CUDA 12 builds. Then the
    requirements of ``extras`` (gpufeed's own extras named inside an extra, ``gpufeed[bench]``, are
    expanded), replaced the same way; a line that repeats an earlier one is left out. torch is the
    runtime dependencies' ``torch``: install the stack's build first (:attr:`Stack.torch_args`).

    Args:
        stack: ``cpu``, ``cuda12`` or ``cuda13``.
        extras: gpufeed extras to add (``test``).
        declared: (runtime dependencies, extras by name), from :func:`read_pyproject_requirements`;
            by default :func:`read_installed_requirements` (the installed gpufeed's metadata).

    Raises:
        ValueError: An unknown stack or extra, or the ``cuda12`` extra with another stack.
    """
    if stack not in STACKS:
        raise ValueError(f"unknown CUDA stack {stack!r}; allowed: {', '.join(STACKS)}")
    runtime, optional = declared if declared is not None else read_installed_requirements()
    lines, done = list(runtime), set()
    wanted = [*extras, *(["cuda12"] if stack == "cuda12" else [])]
    while wanted:
        extra = wanted.pop(0)
        if extra in done:
            continue
        if extra not in optional:
            raise ValueError(f"gpufeed has no extra {extra!r}; it has: {', '.join(optional)}")
        if extra == "cuda12" and stack != "cuda12":
            raise ValueError(f"the cuda12 extra is the CUDA 12 stack's CUDA libraries; it does not go with {stack}")
        done.add(extra)
        for line in optional[extra]:
            if _name(line) == "gpufeed":  # gpufeed[bench,demo]: its own extras
                inner = re.search(r"\[([^\]]*)\]", line.split(";")[0])
                wanted += [e.strip() for e in inner.group(1).split(",")] if inner else []
            else:
                lines.append(line)
    if stack == "cuda13":
        lines = [CUDA13_REPLACEMENTS.get(_name(line), line) for line in lines]
    return list(dict.fromkeys(lines))


def _requirements_main(argv: list[str], prog: str = "_choice.py requirements") -> int:
    import argparse  # Deferred: only this command parses options

    parser = argparse.ArgumentParser(prog=prog, description=(stack_requirements.__doc__ or "").splitlines()[0])
    parser.add_argument("stack", choices=list(STACKS))
    parser.add_argument("extras", nargs="*", help="gpufeed extras to add (test, bench, ...)")
    parser.add_argument("--pyproject", help="read this pyproject.toml (default: the installed gpufeed's metadata)")
    args = parser.parse_args(argv)
    try:
        declared = read_pyproject_requirements(args.pyproject) if args.pyproject else read_installed_requirements()
        print("\n".join(stack_requirements(args.stack, args.extras, declared)))
    except (OSError, KeyError, ValueError, importlib.metadata.PackageNotFoundError) as err:
        print(f"error: {args.pyproject or 'the installed gpufeed'}: {err}", file=sys.stderr)
        return 2
    return 0


def _main(argv: list[str]) -> int:
    command = argv[0] if argv else "stack"
    if command == "requirements":
        return _requirements_main(argv[1:])
    if command == "torch-args" and len(argv) == 2 and argv[1] in STACKS:
        print(" ".join(STACKS[argv[1]].torch_args))
        return 0
    if command not in ("stack", "explain") or len(argv) > 1:
        print(
            f"usage: _choice.py [stack | explain | torch-args {{{','.join(STACKS)}}} | requirements STACK [EXTRA ...] "
            f"[--pyproject FILE]] (got {' '.join(argv)!r})",
            file=sys.stderr,
        )
        return 2
    try:
        driver, found = read_driver(strict=True)
        stack, why = choose_stack(driver)
    except StackChoiceError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{stack.name}: {why} ({found}); {stack.about}" if command == "explain" else stack.name)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
