"""A batch-mode source's next inputs, prepared on a thread of their own (:class:`Ahead`).

DALI calls a (non-parallel) ``external_source`` callback on the thread that schedules the
pipeline's next iteration, and the iterator schedules it from inside ``next(loader)``: the
training thread. On an H100 (ResNet-18, batches of 256 JPEGs) the training loop waited about
2-4 ms for every batch, however deep DALI's prefetch queue: work done on that thread, not a wait.
Under ``cProfile`` the image feed (crop windows, colour matrices, paths) was 1.6 ms of it; on the
2-core development machine, without a profiler, it is 0.5 ms per batch of 256. Here the same
calls run one after another on a daemon thread, a few batches ahead, and the callback only takes
the next result; the feed thread runs while the training thread waits for the GPU (torch releases
Python's lock there).

The results, and their order, are those of calling the source directly: one producer thread calls
it in sequence. An exception is handed over in its turn and raised where the call would have
raised it; the thread stops there. The thread holds its source (a bound method) weakly, so a
loader dropped without ``close()`` does not leave it running: it ends once the source is gone.
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["Ahead"]

# How long the producer (consumer) blocks on a full (empty) queue before checking whether it was closed.
_PUT_POLL_S = 0.1


class Ahead:
    """Call ``produce`` on a daemon thread, up to ``depth`` results ahead of :meth:`take`.

    Args:
        produce: Called with no arguments, in sequence, for each result.
        depth: Results kept ready (at least 1).
        name: The thread's name (it shows in ``py-spy`` dumps and faulthandler tracebacks).
    """

    def __init__(self, produce: Callable[[], Any], depth: int, name: str = "gpufeed-feed") -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, int(depth)))
        self._closed = threading.Event()
        self._failed: BaseException | None = None
        source = weakref.WeakMethod(produce) if hasattr(produce, "__self__") else (lambda: produce)
        self._thread = threading.Thread(target=self._run, args=(source,), name=name, daemon=True)
        self._thread.start()

    def _run(self, source: Callable[[], Callable[[], Any] | None]) -> None:
        while not self._closed.is_set():
            produce = source()
            if produce is None:  # its owner was dropped without close()
                return
            try:
                item: tuple[Any, BaseException | None] = (produce(), None)
            except BaseException as err:  # handed to the consumer, raised there in its turn
                item = (None, err)
            del produce
            while not self._closed.is_set() and source() is not None:
                try:
                    self._queue.put(item, timeout=_PUT_POLL_S)
                    break
                except queue.Full:
                    continue
            if item[1] is not None:
                return

    def take(self) -> Any:
        """The next result, waiting for it if needed; raises what ``produce`` raised in its turn."""
        if self._failed is not None:
            raise self._failed
        value, err = self._next()
        if err is not None:
            self._failed = err
            raise err
        return value

    def _next(self) -> tuple[Any, BaseException | None]:
        # Polled rather than one blocking get: a close() from another thread, or a thread that
        # ended without handing anything over, would otherwise leave the training thread waiting
        # for ever with no trace of why.
        while True:
            if self._closed.is_set():
                raise RuntimeError("the feed's thread was closed")
            try:
                return self._queue.get(timeout=_PUT_POLL_S)
            except queue.Empty:
                if self._thread.is_alive():
                    continue
            try:  # it may have handed over its last result just before it ended
                return self._queue.get_nowait()
            except queue.Empty:
                raise RuntimeError(f"the feed's thread {self._thread.name!r} ended without a result") from None

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the thread (once its current call returns) and drop what it prepared."""
        self._closed.set()
        while True:  # free its slot at once if it is blocked on a full queue
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        if self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
