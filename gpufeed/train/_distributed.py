"""Many processes, one job: torchrun's environment, the process group, and small collectives.

``torchrun --nproc-per-node N -m gpufeed train ...`` sets ``RANK``, ``WORLD_SIZE`` and
``LOCAL_RANK`` for each process. Each rank then drives one device (GPU ``LOCAL_RANK``, or the
CPU), reads its own shard of the data (``shard_id = rank``), and DDP averages gradients: NCCL
between GPUs, gloo on CPUs. A single process without those variables runs undistributed and
every helper here degrades to the obvious local answer.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "DistInfo",
    "all_gather_objects",
    "all_reduce_sum",
    "broadcast_object",
    "env_dist_info",
    "init_distributed",
    "shutdown_distributed",
]


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job.

    Attributes:
        rank: Global rank, 0 for a single process; also this rank's data shard.
        world_size: Number of processes; also the number of shards.
        local_rank: Rank on this machine; picks the GPU and the metrics port offset.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def env_dist_info() -> DistInfo:
    """The rank layout torchrun (or any launcher setting the same variables) gave this process."""

    def read(name: str, default: str) -> int:
        raw = os.environ.get(name, default)
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None

    info = DistInfo(read("RANK", "0"), read("WORLD_SIZE", "1"), read("LOCAL_RANK", "0"))
    if not 0 <= info.rank < info.world_size:
        raise ValueError(f"RANK={info.rank} is out of range for WORLD_SIZE={info.world_size}")
    return info


def init_distributed(info: DistInfo, on_gpu: bool, timeout_s: float = 600.0, device_index: int | None = None) -> None:
    """Join the process group when there is more than one rank (NCCL on GPUs, gloo on CPUs).

    Args:
        device_index: This rank's CUDA device among the visible ones (from
            :func:`gpufeed.device.resolve_device`: ``LOCAL_RANK`` under torchrun, 0 when a launcher
            shows each task one GPU); default ``info.local_rank``.
    """
    if not info.enabled or dist.is_initialized():
        return
    index = info.local_rank if device_index is None else device_index
    if on_gpu:
        torch.cuda.set_device(index)
    dist.init_process_group(
        backend="nccl" if on_gpu else "gloo",
        timeout=datetime.timedelta(seconds=timeout_s),
        device_id=torch.device("cuda", index) if on_gpu else None,
    )


def shutdown_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def broadcast_object(value: Any, src: int = 0) -> Any:
    """Rank ``src``'s ``value`` on every rank (picklable objects; a no-op without a group)."""
    if not dist.is_initialized():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_objects(value: Any) -> list[Any]:
    """Every rank's ``value``, in rank order (``[value]`` without a group)."""
    if not dist.is_initialized():
        return [value]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum a tensor over ranks in place (unchanged without a group); returns it.

    NCCL only reduces CUDA tensors, so a CPU tensor makes a round trip through the current GPU.
    """
    if not dist.is_initialized():
        return tensor
    if dist.get_backend() == "nccl" and tensor.device.type != "cuda":
        on_gpu = tensor.cuda()
        dist.all_reduce(on_gpu, op=dist.ReduceOp.SUM)
        tensor.copy_(on_gpu.cpu())
        return tensor
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor
