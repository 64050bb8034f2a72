"""Request parsing off the event loop: parser threads, and a worker process for large JSON.

Everything that costs time in proportion to a request's size (inflating a compressed body,
parsing JSON and converting tensors, splitting multipart bodies, reading image headers) runs
in :class:`ParsePool`'s threads, never on the event loop (except a small uncompressed REST body,
:data:`INLINE_PARSE_BYTES`), so health probes and other requests
are answered while a large body is parsed or refused. The pool is small on purpose: it bounds
how many bodies are parsed at once, so a burst of large bodies cannot take every core.

Threads are not enough for one thing: Python's JSON parser, and numpy's conversion of the lists
it builds, hold the interpreter lock for the whole call, half a second for 16 MB of numbers,
during which no other thread, the event loop included, runs a line. JSON documents larger than
:data:`INLINE_JSON_BYTES` are therefore parsed in a worker process (:meth:`ParsePool.run_isolated`,
started on first use) that sends back the parsed request with its tensors as numpy arrays; the
server process spends only the time to copy the body over and the arrays back. If the worker
dies (out of memory, killed), the pool is replaced and that request is parsed on a thread. The
worker runs at a lower scheduling priority (nice 10), so on a busy machine a flood of large
bodies slows their own parsing, not the answers to everyone else. It exits when the server does,
however the server ended (``kill -9`` included: :func:`gpufeed.core._procs.die_with_parent`), and with
it multiprocessing's resource tracker, which ends when the last holder of its pipe is gone.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import threading
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from gpufeed.core import ParentWatch

__all__ = ["INLINE_JSON_BYTES", "INLINE_PARSE_BYTES", "PARSE_THREAD_PREFIX", "ParsePool"]

log = logging.getLogger("gpufeed.server")

PARSE_THREAD_PREFIX = "gpufeed-parse"
# Larger JSON documents are parsed in the worker process; smaller ones hold the lock for < ~25 ms.
INLINE_JSON_BYTES = 256 * 1024
# Uncompressed REST bodies up to this size are parsed on the event loop itself: splitting a 66 kB
# multipart body and walking its JPEG's markers took 0.07 ms on the development machine, the hop
# to a parser thread and back about 0.2 ms more, and that pure-Python work holds the interpreter
# lock on a thread too. The largest such body keeps the loop well under a millisecond.
INLINE_PARSE_BYTES = 256 * 1024
WORKER_NICENESS = 10


def _start_worker(watch: ParentWatch, niceness: int) -> None:
    """First thing in a worker process: exit when the server does (even killed), then lower its priority."""
    watch.arm()
    os.nice(niceness)


class ParsePool:
    """Threads (and one worker process, for large JSON) that parse request bodies for the event loop.

    Args:
        threads: Bodies parsed at once on threads; default: half the cores, 1 to 4.
        processes: Worker processes for large JSON documents; default: as many as ``threads``.
    """

    def __init__(self, threads: int | None = None, processes: int | None = None) -> None:
        self.threads = threads or max(1, min(4, (os.cpu_count() or 2) // 2))
        self.processes = processes or self.threads
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix=PARSE_THREAD_PREFIX)
        self._workers: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()
        self.isolated_runs = 0  # how many calls went to a worker process (for tests and logs)

    async def run(self, fn, *args):
        """``fn(*args)`` on a parser thread; its result, or its exception, for the awaiting handler."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def run_isolated(self, fn, *args):
        """``fn(*args)`` in a worker process (``fn`` and its arguments and result must be picklable)."""
        workers = self._worker_pool()
        try:
            result = await asyncio.wrap_future(workers.submit(fn, *args))
        except BrokenProcessPool:
            log.error("the JSON parsing worker process died; starting a new one, parsing this request on a thread")
            self._replace(workers)
            return await self.run(fn, *args)
        self.isolated_runs += 1
        return result

    def _worker_pool(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._workers is None:
                # spawn: a fresh interpreter, never a fork of this multi-threaded process
                context = multiprocessing.get_context("spawn")
                # Lower priority: on a busy machine, the event loop's process gets the CPU first.
                # The workers are started from this thread, by submit(): they die with this process.
                self._workers = ProcessPoolExecutor(
                    self.processes,
                    mp_context=context,
                    initializer=_start_worker,
                    initargs=(ParentWatch.here(), WORKER_NICENESS),
                )
            return self._workers

    def _replace(self, broken: ProcessPoolExecutor) -> None:
        with self._lock:
            if self._workers is broken:
                self._workers = None
        broken.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            workers, self._workers = self._workers, None
        if workers is not None:
            workers.shutdown(wait=True, cancel_futures=True)
