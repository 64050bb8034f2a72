"""Where the host time of each ``next(loader)`` goes: DALI's outputs, its scheduling, the copies, the loader.

On an H100 and an H200 the training loop waited a median 2.7-3.9 ms for every batch even where the
loader alone ran well ahead of the model (``docs/gpu.md``, the third and fourth runs): time spent on
the training thread, not a wait for decoding. Which part of the call it is decides the fix, so every
pipeline-backed loader times the parts of each call into :data:`NEXT_PHASES`, a process-wide record
like a metrics registry (a few ``perf_counter`` calls a batch), and ``gpufeed bench train`` reports
them per step:

=================  ==================================================================================
phase              what it times
=================  ==================================================================================
``dali_outputs``   ``Pipeline.share_outputs``: waiting for DALI's next batch (on the static
                   executor also for its GPU work, on the host; with ``loader.executor: dynamic``
                   on a GPU only until the batch's work is launched)
``dali_schedule``  ``release_outputs`` and ``schedule_run``: the next iteration queued, the
                   batch-mode source's inputs taken and fed in
``iterator``       the whole iterator call (DALI's ``DALIGenericIterator``, with the side-stream
                   copies on a GPU, :class:`~gpufeed.pipelines._pipeline_session.HostOutputs`, or
                   :class:`~gpufeed.pipelines._stream_outputs.StreamOutputs`: no copies)
``loader``         the whole ``next(loader)``: the iterator, then the loader's row checks and views
=================  ==================================================================================

A phase's time on the clock is not all the training thread's work: it also waits, for DALI's batch
and, where another thread holds Python's lock (the feed thread preparing the next inputs), for that
lock. So ``loader`` and ``dali_outputs`` also record the calling thread's CPU time
(``time.thread_time``, ``*_cpu``), and :meth:`NextPhases.take` derives ``held_off``: the time the
call was off the CPU other than inside DALI's output wait. With cores to spare (a GPU host) that is
Python's lock held elsewhere, or the feed thread behind; the GIL hypothesis of ``docs/gpu.md`` reads
there.

A record closes with each ``next(loader)`` (:meth:`NextPhases.finish`); whatever was timed since the
previous one (a session's first scheduling, say) counts towards it.
"""

from __future__ import annotations

import collections
import time
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["NEXT_PHASES", "NextPhases", "timed_pipeline"]

# Phases whose calling thread's CPU time is recorded beside their clock time ("<phase>_cpu").
_CPU_TIMED = ("dali_outputs", "loader")

# Records kept (about 2 MB) for a reader that takes them every batch or so; older ones are dropped,
# so a training run that never reads them holds no more than this.
_KEEP = 4096


class NextPhases:
    """Seconds per phase of each ``next(loader)``, most recent :data:`_KEEP` calls.

    Only the thread that iterates a loader adds to it (DALI's methods are called there), so it
    takes no lock.
    """

    def __init__(self) -> None:
        self._current: dict[str, float] = {}
        self._records: collections.deque[dict[str, float]] = collections.deque(maxlen=_KEEP)

    def add(self, phase: str, seconds: float, cpu_s: float | None = None) -> None:
        """Count ``seconds`` (and the thread's ``cpu_s``, where given) towards ``phase`` of the call in progress."""
        self._current[phase] = self._current.get(phase, 0.0) + seconds
        if cpu_s is not None:
            self._current[f"{phase}_cpu"] = self._current.get(f"{phase}_cpu", 0.0) + cpu_s

    def finish(self, loader_s: float, loader_cpu_s: float | None = None) -> None:
        """Close the call in progress: ``loader_s`` is the whole ``next(loader)``, ``loader_cpu_s`` its thread's CPU time."""
        record, self._current = self._current, {}
        record["loader"] = loader_s
        if loader_cpu_s is not None:
            record["loader_cpu"] = loader_cpu_s
        self._records.append(record)

    def take(self) -> list[dict[str, float]]:
        """The records closed since the last ``take`` (oldest first), removed from here.

        Each has ``loader`` and, where the loader has them, ``iterator``, ``dali_outputs`` and
        ``dali_schedule``, plus two derived: ``copies`` (the iterator less DALI's two calls: the
        handover into torch) and ``loader_own`` (the loader less the iterator). Where the CPU
        times were recorded, ``held_off`` too: the call's time off the CPU less DALI's output
        wait's (see the module's docstring).
        """
        records = list(self._records)
        self._records.clear()
        for record in records:
            if "iterator" in record:
                dali = record.get("dali_outputs", 0.0) + record.get("dali_schedule", 0.0)
                record["copies"] = max(record["iterator"] - dali, 0.0)
                record["loader_own"] = max(record["loader"] - record["iterator"], 0.0)
            if "loader_cpu" in record:
                waiting = record.get("dali_outputs", 0.0) - record.get("dali_outputs_cpu", 0.0)
                record["held_off"] = max(record["loader"] - record["loader_cpu"] - max(waiting, 0.0), 0.0)
        return records


NEXT_PHASES = NextPhases()


def _timed(pipe, name: str, phase: str) -> Callable[..., Any]:
    # The class's function and a weak reference: a bound method kept on the instance would make a
    # cycle, and the pipeline (its GPU memory, its worker processes) would outlive its session
    # until the garbage collector ran.
    function, ref = getattr(type(pipe), name), weakref.ref(pipe)
    cpu = phase in _CPU_TIMED

    def timed(*args, **kwargs):
        started, started_cpu = time.perf_counter(), time.thread_time() if cpu else 0.0
        try:
            return function(ref(), *args, **kwargs)
        finally:
            NEXT_PHASES.add(phase, time.perf_counter() - started, time.thread_time() - started_cpu if cpu else None)

    return timed


def timed_pipeline(pipe) -> None:
    """Time ``pipe``'s output and scheduling calls into :data:`NEXT_PHASES` (replaced on the instance).

    For a pipeline read by ``DALIGenericIterator``, which calls them itself.
    """
    for name, phase in (
        ("share_outputs", "dali_outputs"),
        ("release_outputs", "dali_schedule"),
        ("schedule_run", "dali_schedule"),
    ):
        setattr(pipe, name, _timed(pipe, name, phase))
