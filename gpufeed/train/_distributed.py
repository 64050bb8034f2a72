"""Many processes, one job: torchrun's environment, the process group, and small collectives.

``torchrun --nproc-per-node N -m gpufeed train ...`` sets ``RANK``, ``WORLD_SIZE`` and
``LOCAL_RANK`` for each process. Each rank then drives one device (GPU ``LOCAL_RANK``, or the
CPU), reads its own shard of the data (``shard_id = rank``), and DDP averages gradients: NCCL
between GPUs, gloo on CPUs. A single process without those variables runs undistributed and
every helper here degrades to the obvious local answer.

Before the process group starts, every rank says which device it drives (:func:`agree_on_device`):
a rank that fell back to the CPU (a node without a visible GPU) while the others start NCCL would
otherwise leave the whole job waiting in ``init_process_group`` until its timeout, with no word
of why. Disagreeing ranks all stop with one error naming every rank, its host and its device.
Once the loaders are built, the ranks compare their view of the data the same way
(:mod:`gpufeed.train._agreement`): :func:`exchange_reports` is the mechanism both use.

The rank and world size that pick each rank's share of the data are the process group's
(:func:`group_dist_info`) whenever one is running, so a run inside a group the caller started
shards by that group, not by environment variables.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import socket
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from gpufeed.device import DeviceUnavailableError

__all__ = [
    "AGREE_TIMEOUT_S",
    "DistInfo",
    "agree_on_device",
    "all_gather_objects",
    "all_reduce_max_int",
    "all_reduce_sum",
    "broadcast_buffers",
    "broadcast_object",
    "env_dist_info",
    "exchange_reports",
    "group_dist_info",
    "init_distributed",
    "job_store",
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


def group_dist_info(env: DistInfo | None = None) -> DistInfo:
    """This process's rank and world size from the running process group, else from the environment.

    The local rank (which GPU, which metrics port) is always the launcher's ``LOCAL_RANK``.
    """
    env = env if env is not None else env_dist_info()
    if not (dist.is_available() and dist.is_initialized()):
        return env
    return DistInfo(dist.get_rank(), dist.get_world_size(), env.local_rank)


# How long a rank waits for the others to say which device they drive. Every rank reaches the
# check right after the rendezvous (which already waited for all of them), so this only has to
# cover the time between two ranks' rendezvous returning, not a slow start.
AGREE_TIMEOUT_S = 120.0


def _report_key(topic: str, rank: int) -> str:
    # A torchrun restart (--max-restarts) may reuse the store: keys carry the attempt.
    return f"gpufeed/{topic}/attempt{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/rank{rank}"


def _describe(report: dict) -> str:
    return f"rank {report['rank']} on {report['host']}: {report['device']}"


class ReportTimeout(RuntimeError):
    """Some ranks did not write their report to the store in time (``missing`` names them)."""

    def __init__(self, message: str, missing: list[int]) -> None:
        super().__init__(message)
        self.missing = missing


def exchange_reports(store, info: DistInfo, topic: str, report: dict, timeout_s: float = AGREE_TIMEOUT_S) -> list[dict]:
    """Every rank's ``report`` on ``topic``, in rank order, through the job's store.

    Each rank writes its report (JSON, with its ``rank`` and ``host`` added), waits for every
    other rank's and reads them all. The store answers even where the process group would hang
    (before it starts, or when a rank never reaches a collective), and a wait that times out
    names the ranks that did not report.

    Raises:
        ReportTimeout: Ranks did not report within ``timeout_s`` (naming them).
    """
    mine = {"rank": info.rank, "host": socket.gethostname(), **report}
    store.set(_report_key(topic, info.rank), json.dumps(mine))
    keys = [_report_key(topic, rank) for rank in range(info.world_size)]
    try:
        store.wait(keys, datetime.timedelta(seconds=timeout_s))
    except Exception as err:  # the store raises DistStoreError (a RuntimeError) on a timeout
        missing = [rank for rank in range(info.world_size) if not store.check([_report_key(topic, rank)])]
        raise ReportTimeout(
            f"rank {info.rank} waited {timeout_s:g} s for every rank's {topic.split('/')[0]}; rank(s) "
            f"{', '.join(map(str, missing)) or '?'} did not report it ({str(err).splitlines()[0]})",
            missing,
        ) from err
    return [json.loads(store.get(key)) for key in keys]


def linger_for_readers(store, info: DistInfo, topic: str, timeout_s: float) -> None:
    """Before every rank raises over a disagreement: rank 0 waits (briefly) until all have read the reports.

    Rank 0 usually hosts the store, so the others stop with the disagreement's message rather
    than a lost connection. A rank that died meanwhile ends the wait early.
    """
    store.set(_report_key(topic, info.rank) + "/read", "1")
    if info.rank == 0:
        with contextlib.suppress(Exception):
            keys = [_report_key(topic, rank) + "/read" for rank in range(info.world_size)]
            store.wait(keys, datetime.timedelta(seconds=min(timeout_s, 30.0)))


def job_store():
    """The running process group's store (``None`` without one): where ranks exchange reports."""
    if not dist.is_initialized():
        return None
    try:
        # A private torch helper, the only way to reach the store of a group someone else started.
        return dist.distributed_c10d._get_default_store()
    except (AttributeError, RuntimeError, ValueError):
        return None


def agree_on_device(store, info: DistInfo, device: str, on_gpu: bool, timeout_s: float = AGREE_TIMEOUT_S) -> None:
    """Check, through the rendezvous store, that every rank drives the same kind of device.

    Each rank writes its device to ``store``, waits for every other rank's, and compares. NCCL on
    some ranks and gloo on others never connect: ``init_process_group`` would wait until its
    timeout (or, for NCCL, forever) instead of failing.

    Args:
        store: The job's rendezvous store (a ``torch.distributed.Store``).
        info: This rank's place in the job.
        device: This rank's device in words (``"cuda:0 (NVIDIA H100 ...)"``, ``"cpu (...)"``).
        on_gpu: Whether this rank drives a GPU (NCCL) or the CPU (gloo).
        timeout_s: Longest wait for the other ranks' reports.

    Raises:
        DeviceUnavailableError: The ranks disagree (every rank raises, naming each rank, its host
            and device), or some ranks did not report within ``timeout_s`` (naming them).
    """
    report = {"kind": "gpu" if on_gpu else "cpu", "device": device}
    try:
        reports = exchange_reports(store, info, "device", report, timeout_s)
    except ReportTimeout as err:
        raise DeviceUnavailableError(str(err)) from err
    kinds = {r["kind"] for r in reports}
    if len(kinds) == 1:
        return
    linger_for_readers(store, info, "device", timeout_s)
    on_cpu = [str(r["rank"]) for r in reports if r["kind"] == "cpu"]
    raise DeviceUnavailableError(
        "the ranks disagree on the device, so NCCL would wait forever for the CPU rank(s): "
        + "; ".join(_describe(r) for r in reports)
        + f". Give rank(s) {', '.join(on_cpu)} a usable GPU (check CUDA_VISIBLE_DEVICES and the driver on "
        "their hosts), or set device: cpu for every rank"
    )


def init_distributed(
    info: DistInfo,
    on_gpu: bool,
    timeout_s: float = 600.0,
    device_index: int | None = None,
    *,
    device: str | None = None,
    agree_timeout_s: float = AGREE_TIMEOUT_S,
) -> Any:
    """Join the process group when there is more than one rank (NCCL on GPUs, gloo on CPUs).

    The rendezvous store (``MASTER_ADDR``/``MASTER_PORT``, or torchrun's agent store) is made
    first, every rank's device is checked with :func:`agree_on_device`, and only then does the
    process group start on that store (CUDA is not touched before the check).

    Args:
        device_index: This rank's CUDA device among the visible ones (from
            :func:`gpufeed.device.resolve_device`: ``LOCAL_RANK`` under torchrun, 0 when a launcher
            shows each task one GPU); default ``info.local_rank``.
        device: This rank's device in words for the check (default: ``cuda:<index>`` or ``cpu``);
            :meth:`gpufeed.device.DeviceChoice.describe` gives it with the reason.
        agree_timeout_s: Longest wait for the other ranks' devices.

    Returns:
        The job's store (``None`` for a single process; the running group's when one was started already).

    Raises:
        DeviceUnavailableError: As :func:`agree_on_device`.
    """
    if not info.enabled or dist.is_initialized():
        return job_store()
    index = info.local_rank if device_index is None else device_index
    store, _, _ = next(
        dist.rendezvous(
            "env://", rank=info.rank, world_size=info.world_size, timeout=datetime.timedelta(seconds=timeout_s)
        )
    )
    described = device or (f"cuda:{index}" if on_gpu else "cpu")
    agree_on_device(store, info, described, on_gpu, agree_timeout_s)
    if on_gpu:
        torch.cuda.set_device(index)
    dist.init_process_group(
        backend="nccl" if on_gpu else "gloo",
        store=store,
        rank=info.rank,
        world_size=info.world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
        device_id=torch.device("cuda", index) if on_gpu else None,
    )
    return store


# A gloo group beside an NCCL one, made by the first host-side agreement (every rank reaches it at
# the same step, as a new group needs): it reduces a CPU integer with no GPU copy and no device sync.
_CONTROL_GROUP: Any = None


def shutdown_distributed() -> None:
    global _CONTROL_GROUP
    if dist.is_initialized():
        dist.destroy_process_group()
    _CONTROL_GROUP = None


def all_reduce_max_int(value: int) -> int:
    """The largest of every rank's ``value`` (``value`` itself without a group), reduced on the host."""
    global _CONTROL_GROUP
    if not dist.is_initialized():
        return value
    if dist.get_backend() == "nccl" and _CONTROL_GROUP is None:
        _CONTROL_GROUP = dist.new_group(backend="gloo")
    tensor = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=_CONTROL_GROUP)
    return int(tensor.item())


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


def broadcast_buffers(model: torch.nn.Module, src: int = 0) -> None:
    """Rank ``src``'s buffers (BatchNorm's running statistics) on every rank (a no-op without a group).

    DDP hands rank 0's buffers to every rank before each training forward, which then updates
    them with its own batch: after the last step each rank holds other statistics, and each would
    evaluate another model than the checkpoint (rank 0's) holds. Called on every rank alike.
    """
    if not dist.is_initialized():
        return
    for buffer in getattr(model, "module", model).buffers():
        dist.broadcast(buffer.data, src=src)
