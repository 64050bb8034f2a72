"""One built pipeline of a loader and how far its stream has been read (:class:`Session`), and its readers.

How a pipeline's outputs become torch tensors depends on its device and executor
(``loader.executor``, :mod:`gpufeed.pipelines._executor`). On a CPU: :class:`HostOutputs` (the clip
loader, :func:`pipeline_outputs`) or ``DALIGenericIterator`` (the image and dense loaders). On a
GPU, :func:`gpu_outputs`: :class:`SideStreamCopies` for the static executor,
:class:`~gpufeed.pipelines._stream_outputs.StreamOutputs` for the dynamic one.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

from gpufeed.pipelines._next_phases import NEXT_PHASES, timed_pipeline
from gpufeed.pipelines._sampler import PlanStream, StreamBatch
from gpufeed.pipelines._stream_outputs import StreamOutputs

__all__ = ["HostOutputs", "Session", "SideStreamCopies", "gpu_outputs", "pipeline_outputs", "start_prefetch"]


def _process_state(pid: int) -> str | None:
    """Linux process state letter of ``pid`` ("Z": exited, not yet reaped), ``None`` if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None if os.path.isdir("/proc") else "?"  # no /proc (not Linux): cannot tell, assume alive


class HostOutputs:
    """A CPU pipeline's outputs as torch tensors, each pipeline run scheduled when its batch is asked for.

    ``DALIGenericIterator`` schedules the next run before it returns a batch, and on a pipeline fed
    by worker processes (a parallel ``external_source``) scheduling waits for the workers' next
    batch: every batch reached the loader one worker batch late, the first one included (prepared
    h264, batches of 8 clips of 112 px, 8 starts of a loader: median first batch 0.30 s, 0.23 s
    with this; again 0.24 s and 0.20 s; load 2.4-3.2). Here a run is scheduled when the next
    batch is asked for, after the loader has copied the previous one out; the workers do not
    wait, since the external source keeps its own batches scheduled ahead of the pipeline's runs.

    Yields ``[{name: tensor}]`` as ``DALIGenericIterator`` does. With the dynamic executor
    (``exec_dynamic``, the CPU loaders' default) the tensors share DALI's buffers, which that
    executor keeps for as long as they are referenced; the static one (``loader.executor: static``)
    reuses a buffer once it is released, so its outputs are copied out first.

    Args:
        pipe: A built CPU pipeline (no ``device_id``).
        names: A name for each of its outputs.
    """

    def __init__(self, pipe, names: list[str]) -> None:
        if pipe.device_id is not None:
            raise ValueError("HostOutputs reads CPU pipelines only")
        timed_pipeline(pipe)  # its calls below are timed into NEXT_PHASES, as DALI's iterator's are
        self.pipe, self.names = pipe, list(names)
        self.copy = not pipe.exec_dynamic

    def __iter__(self):
        return self

    def __next__(self) -> list[dict]:
        import torch

        self.pipe.schedule_run()  # the pipeline's first run also fills its prefetch queue
        outputs = self.pipe.share_outputs()
        batch = {name: torch.from_dlpack(out.as_tensor()) for name, out in zip(self.names, outputs, strict=True)}
        if self.copy:
            batch = {name: tensor.clone() for name, tensor in batch.items()}
        self.pipe.release_outputs()  # the dynamic executor keeps the buffers the tensors hold
        return [batch]


class SideStreamCopies:
    """A GPU pipeline's outputs through ``DALIGenericIterator``, its copies made on a CUDA stream of their own.

    The iterator copies each GPU output into a new torch tensor on torch's current stream, and DALI
    then makes the output's own stream wait for that copy (``copy_to_external`` with a stream,
    ``CopyToExternalImplGPU`` in DALI's ``backend_impl.cc``). On the training stream the copy sits
    behind the step the loop has queued ahead, so DALI's decode and resize streams, and every batch
    DALI starts after it, waited for that step to end: the loader could run no more than a step
    ahead of the model, and a slow batch was never made up. Here the copies go to an idle stream;
    the caller's stream waits for them (an event, on the GPU, not the host), and each tensor is
    marked as used on it, so that the caching allocator keeps the tensor's block until that use ends.

    Args:
        pipe: A built GPU pipeline.
        names: A name for each of its outputs.
        device: Its torch device.
    """

    def __init__(self, pipe, names: list[str], device) -> None:
        import torch
        from nvidia.dali.plugin.pytorch import DALIGenericIterator

        # No reader and no size: the iterator runs as long as the feed does, epoch after epoch.
        timed_pipeline(pipe)  # before the iterator calls it (NEXT_PHASES)
        self.iterator = DALIGenericIterator(pipe, list(names), auto_reset=False, prepare_first_batch=False)
        # From torch's high-priority pool: a default Stream() is the next of 32 shared ones, which
        # NCCL's and the server lanes' streams also come from; a loader's copies landing on NCCL's
        # stream would wait behind each all-reduce, the coupling these copies exist to remove.
        self.stream = torch.cuda.Stream(device=device, priority=-1)

    def __iter__(self):
        return self

    def __next__(self) -> list[dict]:
        import torch

        with torch.cuda.stream(self.stream):
            out = next(self.iterator)
        consumer = torch.cuda.current_stream(self.stream.device)
        consumer.wait_stream(self.stream)
        for batch in out:
            for tensor in batch.values():
                if tensor.is_cuda:
                    tensor.record_stream(consumer)
        return out


def gpu_outputs(pipe, names: list[str], device) -> SideStreamCopies | StreamOutputs:
    """The reader of a GPU pipeline's outputs: :class:`StreamOutputs` for the dynamic executor
    (``loader.executor: dynamic``), :class:`SideStreamCopies` for the static one.

    Args:
        pipe: A built GPU pipeline.
        names: A name for each of its outputs.
        device: Its torch device.
    """
    if pipe.exec_dynamic:
        return StreamOutputs(pipe, names, device)
    return SideStreamCopies(pipe, names, device)


def pipeline_outputs(pipe, names: list[str], device) -> HostOutputs | SideStreamCopies | StreamOutputs:
    """The reader of a pipeline's outputs: :class:`HostOutputs` on a CPU (each batch as soon as it is
    in, not one worker batch later), :func:`gpu_outputs`' on a GPU.

    Args:
        pipe: A built pipeline.
        names: A name for each of its outputs.
        device: Its torch device.
    """
    if pipe.device_id is None:
        return HostOutputs(pipe, names)
    return gpu_outputs(pipe, names, device)


def start_prefetch(iterator) -> None:
    """Schedule a ``DALIGenericIterator``'s first runs now rather than at its first ``next()``.

    With several pipelines taking turns (``loader.pipelines``), pipeline ``j`` would start filling
    its prefetch queue only at its first turn, after pipeline 0 had decoded and handed over batch
    0: every session began with one decoder at work. This is what the iterator's first ``next()``
    does itself (``_schedule_runs(False)``, DALI's ``base_iterator.py``); an iterator without it
    (another DALI) starts at its first turn, as before.
    """
    if isinstance(iterator, StreamOutputs):
        iterator.start()
        return
    inner = iterator.iterator if isinstance(iterator, SideStreamCopies) else iterator
    if getattr(inner, "_ever_scheduled", True) is False and hasattr(inner, "_schedule_runs"):
        inner._schedule_runs(False)


@dataclass
class Session:
    """One built pipeline and how far its stream has been read.

    Attributes:
        iterator: The pipeline's outputs, ``[{name: tensor}]`` per plan batch (``DALIGenericIterator``,
            :class:`HostOutputs` on a CPU, or :func:`gpu_outputs`' reader on a GPU).
        stream: The plan batches the pipeline produces, in order.
        limit: Iterations the pipeline can produce (``None``: unbounded).
        consumed: Iterations read so far.
        resources: Objects to keep alive with the pipeline and close after it (``close()``: the clip source, its file list).
        feed: The pipeline's batch-mode source, when it has one (how far DALI has been fed).
        worker_pids: Process ids of the pipeline's Python workers (PyAV), checked before each read.
    """

    iterator: Any
    stream: PlanStream
    limit: int | None = None
    consumed: int = 0
    resources: list = field(default_factory=list)
    feed: Any = None
    worker_pids: list[int] = field(default_factory=list)

    @property
    def exhausted(self) -> bool:
        return self.limit is not None and self.consumed >= self.limit

    def position(self) -> tuple[int, int]:
        """(epoch, batch) of the next output."""
        return self.stream.position(self.consumed)

    def next(self) -> tuple[dict, StreamBatch, int]:
        """The next output, the plan batch it holds and its iteration number."""
        self._check_workers()
        started = time.perf_counter()
        out = next(self.iterator)[0]
        NEXT_PHASES.add("iterator", time.perf_counter() - started)
        k = self.consumed
        self.consumed = k + 1
        return out, self.stream[k], k

    def _check_workers(self) -> None:
        """Fail at once when a worker process has died since the last read.

        DALI would notice too, but its pool can deadlock notifying a worker that died while
        waiting for work (a multiprocessing condition counts on every sleeper to wake), so a
        worker killed between batches (the out-of-memory killer, a stray ``kill``) would hang
        training instead of stopping it.
        """
        for pid in self.worker_pids:
            state = _process_state(pid)
            if state in (None, "Z", "X"):
                raise RuntimeError(
                    f"Python worker process {pid} of the parallel external source exited unexpectedly "
                    f"({'gone' if state is None else 'dead'})"
                )

    def close(self) -> None:
        self.iterator = None  # the pipeline (and its worker processes) go with the iterator
        self.feed = None
        self.worker_pids = []
        for resource in self.resources:
            resource.close()
        self.resources = []
