"""Choosing where the work runs: ``device: auto | gpu | cpu``.

``auto`` picks the GPU only when both torch sees CUDA and a DALI pipeline with a GPU operator
actually builds and runs (a driver too old for DALI's CUDA 12 build, or a MIG slice without
NVDEC, shows up here rather than mid-training). The choice and its reason are logged, so a run
always says which it used and why.
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass
from typing import Literal

__all__ = ["DeviceChoice", "DeviceUnavailableError", "cuda_status", "resolve_device"]

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


def resolve_device(requested: str = "auto", local_rank: int | None = None) -> DeviceChoice:
    """Turn the config's ``device`` into a concrete choice and log it.

    Args:
        requested: ``"auto"``, ``"gpu"`` or ``"cpu"``.
        local_rank: This process's GPU under torchrun; default ``LOCAL_RANK`` or 0.

    Raises:
        DeviceUnavailableError: ``gpu`` was requested and is not usable (the reason is given).
        ValueError: ``requested`` is not one of the three names.
    """
    if requested not in ("auto", "gpu", "cpu"):
        raise ValueError(f"device {requested!r} is not allowed; allowed: auto, gpu, cpu")
    if local_rank is None:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if requested == "cpu":
        choice = DeviceChoice("cpu", None, "device: cpu was requested")
    else:
        ok, why = cuda_status(local_rank)
        if ok:
            choice = DeviceChoice("gpu", local_rank, f"device: {requested}; {why}")
        elif requested == "gpu":
            raise DeviceUnavailableError(f"device: gpu was requested but is not usable: {why}")
        else:
            choice = DeviceChoice("cpu", None, f"device: auto fell back to the CPU: {why}")
    log.info("using %s", choice.describe())
    return choice
