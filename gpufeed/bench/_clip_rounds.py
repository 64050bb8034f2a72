"""Fair timed rounds for ``gpufeed bench clips``: every reader started, timed and stopped the same way.

A round of one reader (contender) on one video set:

1. the clock starts, then the reader is opened: its worker processes, pipelines, decoders and
   index scans start inside the round, for every reader alike (start-up counts the same way);
2. the reader yields batches until the round's clips are in; the clock stops at the last one
   (the time to the first batch is kept too: the start-up, reported on its own), and so does the
   count of CPU time its processes used (this one, and the worker processes it started);
3. the reader is closed and the round waits, untimed, until every process it started has
   exited, so no reader keeps decoding ahead into the next reader's round (a DALI pipeline's
   workers would otherwise go on filling its prefetch queue while another reader is timed).

Rounds interleave the (set, reader) jobs, alternating their order from round to round, and a
ratio is the median of per-round ratios: rounds run back to back share the machine's load.
"""

from __future__ import annotations

import copy
import gc
import os
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from gpufeed.bench._common import handed_over, median

__all__ = ["RoundTime", "child_pids", "cpu_seconds", "interleaved", "paired_ratio", "timed_round", "wait_for_exit"]


@dataclass(frozen=True)
class RoundTime:
    """What one timed round measured.

    Attributes:
        clips: Clips read.
        seconds: From before the reader was opened to its last clip.
        first_batch_s: From before the reader was opened to its first batch (its start-up).
        warm_s, warm_clips: When the first wave of batches was in (one batch per worker process:
            a DataLoader's workers each deliver their first batch at about the same time), and the
            clips it held; ``steady`` figures start there.
        cpu_s: CPU seconds (user and system) used from before the reader was opened to its last
            clip by this process and every process it started (:func:`cpu_seconds`): what the
            round cost, which the machine's load moves far less than its seconds (NaN: not measured).
    """

    clips: int
    seconds: float
    first_batch_s: float
    warm_s: float
    warm_clips: int
    cpu_s: float = float("nan")

    @property
    def clips_per_second(self) -> float:
        """Clips per second over the whole round, start-up included."""
        return self.clips / self.seconds if self.seconds > 0 else 0.0

    @property
    def steady_clips_per_second(self) -> float:
        """Clips per second after the first wave of batches (start-up left out); NaN if none came after it."""
        after = self.seconds - self.warm_s
        return (self.clips - self.warm_clips) / after if after > 0 and self.clips > self.warm_clips else float("nan")

    @property
    def cpu_ms_per_clip(self) -> float:
        """CPU milliseconds per clip over the whole round, start-up included (NaN: not measured)."""
        return 1000 * self.cpu_s / self.clips if self.clips > 0 else float("nan")


# Started by the standard library the first time this process spawns a worker (any reader on a GPU,
# where forking after CUDA is unsafe), then kept for the rest of this process's life: not a reader's.
_LASTING_HELPERS = (b"multiprocessing.resource_tracker", b"multiprocessing.forkserver")


def _lasting_helper(pid: str) -> bool:
    """Whether process ``pid`` is one of multiprocessing's per-process helpers (:data:`_LASTING_HELPERS`)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            command = cmdline.read()
    except OSError:
        return False
    return any(helper in command for helper in _LASTING_HELPERS)


def child_pids(pid: int | None = None) -> set[int]:
    """Live (not zombie) child processes of ``pid`` (default: this process), from ``/proc``.

    Multiprocessing's resource tracker and fork server are left out: a reader whose workers are
    spawned starts the tracker, which stays until this process exits, so waiting for it to go
    would wait forever.
    """
    parent = os.getpid() if pid is None else pid
    found: set[int] = set()
    try:
        entries = os.listdir("/proc")
    except OSError:  # not Linux: nothing to wait for
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == parent and fields[0] not in ("Z", "X") and not _lasting_helper(entry):
            found.add(int(entry))
    return found


def cpu_seconds(pids: Iterable[int] | None = None) -> float:
    """CPU seconds (user and system) this process, its children already waited for, and the live processes ``pids`` have used.

    Args:
        pids: Live processes to count (default: this process's live children, :func:`child_pids`);
            from ``/proc``, so on another system only this process and its waited-for children count.
    """
    times = os.times()
    total = times.user + times.system + times.children_user + times.children_system
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    for pid in child_pids() if pids is None else pids:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick  # utime and stime, fields 14 and 15
        except (OSError, IndexError, ValueError):  # gone meanwhile, or no /proc
            continue
    return total


def wait_for_exit(before: set[int], timeout_s: float = 60.0, children: Callable[[], set[int]] = child_pids) -> set[int]:
    """Wait until no child process outside ``before`` is alive; the ones still alive at the timeout.

    Raises:
        RuntimeError: Processes a reader started were still running after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        left = children() - before
        if not left:
            return left
        if time.monotonic() >= deadline:
            raise RuntimeError(
                f"processes {sorted(left)} a reader started still run {timeout_s:.0f} s after it was closed"
            )
        gc.collect()  # a pipeline or iterator whose last reference sits in a cycle stops only when collected
        time.sleep(0.05)


def timed_round(
    open_reader: Callable[[], AbstractContextManager[Iterable[Any]]],
    want: int,
    *,
    size_of: Callable[[Any], int] = len,
    keep: bool = False,
    warm_batches: int = 1,
    children: Callable[[], set[int]] = child_pids,
    cpu: Callable[[], float] = cpu_seconds,
) -> tuple[RoundTime, list]:
    """One round of one reader (see the module docs): its times, and its batches when ``keep``.

    Args:
        open_reader: Returns a context manager that starts the reader and yields its batches;
            leaving it stops the reader.
        want: Clips to read; the round ends at the batch that reaches them.
        size_of: Clips in a batch.
        keep: Keep the batches (the untimed exactness pass); timed rounds drop them.
        warm_batches: Batches in the first wave (see :class:`RoundTime`): the reader's worker processes.
        children, cpu: The live child processes, and the CPU seconds used so far (:func:`cpu_seconds`).
    """
    before = children()
    batches: list = []
    got, count, first_s, warm_s, warm_clips = 0, 0, 0.0, 0.0, 0
    cpu_start = cpu()
    start = time.perf_counter()
    end, cpu_end = start, cpu_start
    with open_reader() as reader:
        for batch in reader:
            got += size_of(batch)
            count += 1
            if count == 1:
                first_s = time.perf_counter() - start
            if count == warm_batches:
                warm_s, warm_clips = time.perf_counter() - start, got
            if keep:  # a copy: a pipeline may reuse its output buffers for later batches
                batches.append(batch.clone() if hasattr(batch, "clone") else copy.deepcopy(batch))
            if got >= want:
                handed_over(batch)  # a GPU batch's resize and copy may still be queued; the CPU readers' are done
                break
        end = time.perf_counter()
        cpu_end = cpu()  # before the reader stops: its workers' decoding past the round is not counted
    del reader
    wait_for_exit(before, children=children)
    if got < want:
        raise RuntimeError(f"the reader stopped after {got} of {want} clips")
    if count < warm_batches:
        warm_s, warm_clips = end - start, got
    return RoundTime(got, end - start, first_s, warm_s, warm_clips, cpu_end - cpu_start), batches


def interleaved(jobs: Sequence, round_index: int) -> list:
    """The jobs in the order round ``round_index`` runs them: as given in even rounds, reversed in odd ones."""
    return list(jobs) if round_index % 2 == 0 else list(reversed(jobs))


def paired_ratio(a: Sequence[float], b: Sequence[float]) -> float:
    """Median over rounds of ``a[r] / b[r]`` (rounds without both figures left out; NaN if none has)."""
    return median([x / y for x, y in zip(a, b, strict=True) if y > 0 and x == x and y == y])
