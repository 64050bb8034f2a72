"""One built pipeline of a loader and how far its stream has been read (:class:`Session`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from gpufeed.pipelines._sampler import PlanStream, StreamBatch

__all__ = ["Session"]


def _process_state(pid: int) -> str | None:
    """Linux process state letter of ``pid`` ("Z": exited, not yet reaped), ``None`` if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None if os.path.isdir("/proc") else "?"  # no /proc (not Linux): cannot tell, assume alive


@dataclass
class Session:
    """One built pipeline and how far its stream has been read.

    Attributes:
        iterator: The ``DALIGenericIterator`` over the pipeline (one output per plan batch).
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
        out = next(self.iterator)[0]
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
