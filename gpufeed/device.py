"""Choosing where the work runs: ``device: auto | gpu | cpu``.

``auto`` picks the GPU only when both torch sees CUDA and a DALI pipeline with a GPU operator
actually builds and runs (a driver too old for DALI's CUDA 12 build shows up here rather than
mid-training). NVDEC is not tried here: the video loaders check that its library loads before
they choose it (a container without the driver's ``video`` capability has none), and ``gpufeed
doctor`` decodes with it. The choice and its reason are logged, so a run always says which it used
and why.
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "DeviceChoice",
    "DeviceUnavailableError",
    "cuda_builds",
    "cuda_builds_line",
    "cuda_status",
    "local_device_index",
    "resolve_device",
]

log = logging.getLogger("gpufeed")


class DeviceUnavailableError(RuntimeError):
    """``device: gpu`` was asked for, but CUDA or DALI's GPU operators are not usable."""


@dataclass(frozen=True)
class DeviceChoice:
    """Where pipelines and models run.

    Attributes:
        kind: ``"gpu"`` or ``"cpu"``.
        device_id: CUDA device index for DALI and torch on a GPU; ``None`` on the CPU (DALI's
            CPU-only mode).
        reason: Why this was chosen, for logs and run summaries.
    """

    kind: Literal["gpu", "cpu"]
    device_id: int | None
    reason: str

    @property
    def is_gpu(self) -> bool:
        return self.kind == "gpu"

    @property
    def torch_device(self):  # -> torch.device; torch is imported lazily to keep the CLI fast
        import torch

        return torch.device("cuda", self.device_id) if self.is_gpu else torch.device("cpu")

    def describe(self) -> str:
        where = f"cuda:{self.device_id}" if self.is_gpu else "cpu"
        return f"{where} ({self.reason})"


@functools.cache
def cuda_status(device_id: int = 0) -> tuple[bool, str]:
    """Whether CUDA and DALI's GPU operators work on ``device_id``, and why (not).

    Runs a one-batch DALI pipeline with a GPU operator; cached per process.
    """
    try:
        import torch
    except ImportError as err:  # pragma: no cover - torch is a dependency
        return False, f"torch is not importable: {err}"
    if not torch.cuda.is_available():
        return False, "torch.cuda.is_available() is False"
    if device_id >= torch.cuda.device_count():
        return False, f"CUDA device {device_id} does not exist ({torch.cuda.device_count()} visible)"
    name = torch.cuda.get_device_name(device_id)
    try:
        import numpy as np
        from nvidia.dali import fn, pipeline_def

        @pipeline_def(batch_size=1, num_threads=1, device_id=device_id)
        def probe():
            data = fn.external_source(source=lambda: [np.zeros((2, 2, 3), np.uint8)], batch=True)
            return fn.flip(data.gpu(), horizontal=1)

        pipe = probe()
        pipe.build()
        pipe.run()
        del pipe
    except Exception as err:  # any failure means "not usable"; the reason is reported
        return False, f"CUDA works ({name}) but a DALI GPU pipeline failed: {err}".splitlines()[0]
    return True, f"{name}, CUDA and DALI GPU operators usable"


def _dali_cuda() -> str | None:
    try:
        import nvidia.dali as dali
    except ImportError:
        return None
    code = str(getattr(dali, "__cuda_version__", "") or "")  # CUDA 12.9.86 reads 12986: major, minor, patch
    return f"{code[:2]}.{code[2]}" if len(code) >= 3 and code.isdigit() else None


def _onnxruntime_cuda() -> str | None:
    try:
        from onnxruntime.capi import build_and_package_info as info
    except ImportError:
        return None
    return getattr(info, "cuda_version", None) or None


@functools.cache
def cuda_builds() -> dict[str, str | None]:
    """The CUDA version each GPU library was built for: ``{"torch": "12.8", "DALI": "12.9", ...}``.

    ``None`` for a CPU build (or a library that is not installed). Read from the packages, not the
    driver, so it works without a GPU; cached per process.
    """
    try:
        import torch

        torch_cuda = torch.version.cuda
    except ImportError:  # pragma: no cover - torch is a dependency
        torch_cuda = None
    return {"torch": torch_cuda, "DALI": _dali_cuda(), "onnxruntime": _onnxruntime_cuda()}


def cuda_builds_line(builds: dict[str, str | None] | None = None) -> tuple[str, bool]:
    """(one line naming each library's CUDA build, whether their CUDA majors disagree).

    Mixed majors (DALI for CUDA 12 beside an onnxruntime-gpu built for CUDA 13, say) load two
    CUDA runtimes; onnxruntime's CUDA provider then fails to load and the server falls back or refuses.
    """
    builds = cuda_builds() if builds is None else builds
    shown = ", ".join(f"{name} {version or 'CPU build'}" for name, version in builds.items())
    majors = {version.split(".")[0] for version in builds.values() if version}
    if len(majors) <= 1:
        return f"CUDA builds: {shown}", False
    return (
        f"CUDA builds: {shown}: CUDA majors {', '.join(sorted(majors))} are mixed; install one CUDA stack "
        "(make clean && make in a checkout, or the pip lines of docs/gpu.md 'CUDA stacks'); 'gpufeed doctor' checks it",
        True,
    )


def local_device_index(local_rank: int, visible_count: int, visible_devices: str | None) -> int:
    """The CUDA device index of this rank's GPU among those it can see.

    torchrun shows every GPU of the machine to every rank: GPU ``LOCAL_RANK``. SLURM (and other
    launchers binding one GPU per task) set ``CUDA_VISIBLE_DEVICES`` per task, so each rank sees
    one GPU, index 0, whatever its local rank.

    Raises:
        DeviceUnavailableError: Neither holds (naming the rank, the visible count and the variable):
            the rank has no GPU of its own, and quietly falling back to the CPU would leave the
            other ranks waiting for it in NCCL.
    """
    if 0 <= local_rank < visible_count:
        return local_rank
    if visible_count == 1 and visible_devices:
        return 0
    raise DeviceUnavailableError(
        f"LOCAL_RANK={local_rank} has no GPU of its own: {visible_count} CUDA device(s) visible "
        f"(CUDA_VISIBLE_DEVICES={visible_devices!r}); run one rank per GPU (torchrun --nproc-per-node <= "
        f"{visible_count}), or give each task its own GPU through CUDA_VISIBLE_DEVICES"
    )


def _visible_cuda_devices() -> int:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve_device(
    requested: str = "auto", local_rank: int | None = None, world_size: int | None = None
) -> DeviceChoice:
    """Turn the config's ``device`` into a concrete choice and log it.

    Args:
        requested: ``"auto"``, ``"gpu"`` (or torch's ``"cuda"``) or ``"cpu"``.
        local_rank: This process's rank on the machine; default ``LOCAL_RANK`` or 0. Its GPU is
            :func:`local_device_index`.
        world_size: Processes in the job; default ``WORLD_SIZE`` or 1.

    Raises:
        DeviceUnavailableError: ``gpu`` was requested and is not usable (the reason is given); or,
            in a job of several processes, this rank cannot use a GPU while the machine has some
            (``auto`` would fall back to the CPU alone, and NCCL on the other ranks would hang).
        ValueError: ``requested`` is not one of the three names.
    """
    requested = "gpu" if requested == "cuda" else requested  # torch's name for it (ImageLoader(device="cuda"))
    if requested not in ("auto", "gpu", "cpu"):
        raise ValueError(f"device {requested!r} is not allowed; allowed: auto, gpu (or cuda), cpu")
    if local_rank is None:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if world_size is None:
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if requested == "cpu":
        choice = DeviceChoice("cpu", None, "device: cpu was requested")
    else:
        visible = _visible_cuda_devices()
        index = local_device_index(local_rank, visible, os.environ.get("CUDA_VISIBLE_DEVICES")) if visible else 0
        ok, why = cuda_status(index)
        if ok:
            choice = DeviceChoice("gpu", index, f"device: {requested}; {why}")
        elif requested == "gpu":
            raise DeviceUnavailableError(f"device: gpu was requested but is not usable: {why}")
        elif world_size > 1 and visible:
            raise DeviceUnavailableError(
                f"device: auto; rank with LOCAL_RANK={local_rank} cannot use cuda:{index} ({why}) although "
                f"{visible} GPU(s) are visible: falling back to the CPU alone would leave the other ranks waiting "
                "in NCCL; fix the GPU or set device: cpu for every rank"
            )
        else:
            choice = DeviceChoice("cpu", None, f"device: auto fell back to the CPU: {why}")
    log.info("using %s", choice.describe())
    line, mixed = cuda_builds_line()
    log.log(logging.WARNING if mixed and choice.is_gpu else logging.INFO, "%s", line)
    return choice
