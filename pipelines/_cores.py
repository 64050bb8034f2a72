"""How many DALI threads a loader takes, and how its Python workers start (fork or spawn).

Kept apart from :mod:`gpufeed.pipelines._epochs`, which re-exports them, so that the checks and
sources that need them do not import the epoch loop.
"""

from __future__ import annotations

import os

__all__ = ["cuda_initialised", "default_num_threads", "loader_num_threads", "worker_start_method"]


def default_num_threads() -> int:
    """One DALI thread per core this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def loader_num_threads(train: bool, cores: int | None = None, local_world_size: int | None = None) -> int:
    """DALI threads for one loader when ``loader.num_threads`` is 0: this rank's cores, split train/val.

    Under torchrun every rank on a machine sees every core, so the cores are divided by the local
    world size (``LOCAL_WORLD_SIZE``), unless a launcher already gave this process fewer cores
    than the machine has (SLURM's per-task binding). The training loader gets three quarters of
    the rank's share, evaluation the rest (with fewer than 4 cores each gets them all).

    Args:
        train: The training loader (True) or evaluation's.
        cores: Cores this process may use (default: its affinity mask).
        local_world_size: Processes on this machine (default: ``LOCAL_WORLD_SIZE``, else 1).
    """
    if cores is None:
        cores = default_num_threads()
        if cores < (os.cpu_count() or cores):
            local_world_size = 1  # already bound to its own cores by the launcher
    if local_world_size is None:
        local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    share = max(1, cores // max(1, local_world_size))
    if share < 4:  # too few to split; the two pipelines rarely run at once (evaluation pauses training)
        return share
    val = share // 4
    return share - val if train else val


def cuda_initialised() -> bool:
    """Whether CUDA's driver is initialised in this process (then forking is unsafe).

    DALI's own test (the one behind its "Cannot fork a process when the CUDA has been initialized"
    error), which sees any library's CUDA use, and torch's, for the case DALI cannot see.
    """
    import sys

    from nvidia.dali import backend

    if backend.IsDriverInitialized():  # type: ignore[attr-defined]  # made by DALI's C extension, not in its stubs
        return True
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_initialized())


def worker_start_method(requested: str) -> tuple[str, str]:
    """``fork`` or ``spawn`` for DALI's Python workers, and why (``loader.worker_start_method``)."""
    if requested in ("fork", "spawn"):
        return requested, f"loader.worker_start_method: {requested}"
    if requested != "auto":
        raise ValueError(f"worker start method {requested!r} is not allowed; allowed: auto, fork, spawn")
    if cuda_initialised():
        return "spawn", "CUDA is initialised in this process, so forking is unsafe"
    return "fork", "CUDA is not initialised in this process"
