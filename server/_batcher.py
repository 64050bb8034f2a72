"""Dynamic batching, free of HTTP: gather up to N items or wait at most ``max_delay``, then run them.

A :class:`Batcher` owns one worker thread. ``submit(items)`` queues items (all or none: a request
never gets half its images queued) and returns one :class:`concurrent.futures.Future` per item.
The worker takes the oldest items as soon as ``batch_size`` are waiting, or when the oldest has
waited ``max_delay_s``, and calls ``run_batch(items)``, which returns one result per item; a result
that is an exception fails only its own item's future, so one bad image never fails its
neighbours. Padding the batch to exactly N is ``run_batch``'s business (it knows the tensor
shapes); the batcher only guarantees at most N items per call.

The queue is bounded: :class:`QueueFullError` when ``capacity`` items are already waiting, so a
caller can answer 503 with Retry-After instead of letting latency grow without limit. A caller
that gives up (timeout, client gone) calls :meth:`Batcher.cancel`; cancelled items leave the
queue and are never run. :meth:`Batcher.close` stops taking work and either drains what is queued
(graceful shutdown) or fails it.

Usage::

    batcher = Batcher(model_step, batch_size=8, max_delay_s=0.005, capacity=256)
    batcher.start()
    futures = batcher.submit([image_a, image_b])
    results = [f.result(timeout=30) for f in futures]
    batcher.close()
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

__all__ = ["Batcher", "BatcherClosedError", "QueueFullError"]

log = logging.getLogger("gpufeed.server")


class QueueFullError(RuntimeError):
    """The batcher's queue cannot take the items now (``depth + len(items) > capacity``)."""

    def __init__(self, depth: int, wanted: int, capacity: int) -> None:
        super().__init__(f"the queue holds {depth} of {capacity} items and cannot take {wanted} more")
        self.depth, self.wanted, self.capacity = depth, wanted, capacity


class BatcherClosedError(RuntimeError):
    """The batcher is shutting down and takes no new work (or dropped queued work)."""


@dataclass
class _Slot:
    item: Any
    future: Future
    enqueued: float


class Batcher:
    """Gathers items into batches of at most ``batch_size`` for ``run_batch``, on one worker thread.

    Args:
        run_batch: ``items -> results``, one result per item, in order. A result that is a
            ``BaseException`` becomes that item's exception. If ``run_batch`` itself raises, every
            item of that batch gets the exception.
        batch_size: Most items per call (the model's fixed N).
        max_delay_s: Longest time the oldest waiting item waits for the batch to fill.
        capacity: Most items waiting (not yet running); more raise :class:`QueueFullError`.
        on_batch: Called after each batch is taken with ``(queue_wait_seconds_per_item, rows)``,
            for metrics.
        name: Thread name, for logs and debuggers.
        workers: Worker threads taking batches from the one queue; with 2, one batch can decode
            while the previous one runs through the model. ``run_batch`` must then be thread-safe.
    """

    def __init__(
        self,
        run_batch: Callable[[list[Any]], Sequence[Any]],
        *,
        batch_size: int,
        max_delay_s: float,
        capacity: int,
        on_batch: Callable[[list[float], int], None] | None = None,
        name: str = "gpufeed-batcher",
        workers: int = 1,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size {batch_size} must be >= 1")
        if capacity < 1:
            raise ValueError(f"capacity {capacity} must be >= 1")
        if max_delay_s < 0:
            raise ValueError(f"max_delay_s {max_delay_s} must be >= 0")
        if workers < 1:
            raise ValueError(f"workers {workers} must be >= 1")
        self._run_batch = run_batch
        self.batch_size = batch_size
        self.max_delay_s = max_delay_s
        self.capacity = capacity
        self._on_batch = on_batch
        self._queue: deque[_Slot] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._drain = True
        self._threads = [threading.Thread(target=self._worker, name=f"{name}-{k}", daemon=True) for k in range(workers)]
        self._count_lock = threading.Lock()
        self.batches_run = 0

    # -- producer side --------------------------------------------------------------------------
    def start(self) -> Batcher:
        for thread in self._threads:
            thread.start()
        return self

    @property
    def depth(self) -> int:
        """Items waiting (queued, not yet taken into a batch)."""
        return len(self._queue)

    def submit(self, items: Sequence[Any]) -> list[Future]:
        """Queue ``items`` together; one future per item.

        Raises:
            QueueFullError: Not all of them fit; none was queued.
            BatcherClosedError: The batcher is closing.
        """
        now = time.monotonic()
        slots = [_Slot(item, Future(), now) for item in items]
        with self._cond:
            if self._closed:
                raise BatcherClosedError("the server is shutting down and takes no new requests")
            if len(self._queue) + len(slots) > self.capacity:
                raise QueueFullError(len(self._queue), len(slots), self.capacity)
            self._queue.extend(slots)
            self._cond.notify()
        return [s.future for s in slots]

    def cancel(self, futures: Sequence[Future]) -> int:
        """Withdraw items that have not started; returns how many were withdrawn."""
        wanted = {id(f) for f in futures}
        with self._cond:
            keep = deque(s for s in self._queue if id(s.future) not in wanted or not s.future.cancel())
            withdrawn = len(self._queue) - len(keep)
            self._queue = keep
        return withdrawn

    def expedite(self) -> None:
        """Stop waiting for batches to fill: run whatever is queued now (a draining server's last work)."""
        with self._cond:
            self.max_delay_s = 0.0
            self._cond.notify_all()

    def close(self, drain: bool = True, timeout: float | None = None) -> None:
        """Stop taking work; run what is queued (``drain``) or fail it; wait for the worker."""
        with self._cond:
            self._closed = True
            self._drain = drain
            if not drain:
                while self._queue:
                    slot = self._queue.popleft()
                    if slot.future.set_running_or_notify_cancel():
                        slot.future.set_exception(BatcherClosedError("the server shut down before this ran"))
            self._cond.notify_all()
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in self._threads:
            if thread.is_alive():
                thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    # -- worker side ----------------------------------------------------------------------------
    def _take(self) -> list[_Slot] | None:
        """Block until a batch is due; return it (None when closed and empty)."""
        with self._cond:
            while not self._queue:
                if self._closed:
                    return None
                self._cond.wait()
            while len(self._queue) < self.batch_size and not self._closed:
                remaining = self._queue[0].enqueued + self.max_delay_s - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
                if not self._queue:  # everything waiting was cancelled
                    return []
            batch = []
            while self._queue and len(batch) < self.batch_size:
                slot = self._queue.popleft()
                if slot.future.set_running_or_notify_cancel():
                    batch.append(slot)
            if self._queue:
                self._cond.notify()  # another worker may start on what is left
            return batch

    def _worker(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
            if not batch:
                continue
            started = time.monotonic()
            if self._on_batch is not None:
                try:
                    self._on_batch([started - s.enqueued for s in batch], len(batch))
                except Exception:  # metrics must never stop serving
                    log.exception("batch observer failed")
            self._run(batch)
            with self._count_lock:
                self.batches_run += 1

    def _run(self, batch: list[_Slot]) -> None:
        try:
            results = list(self._run_batch([s.item for s in batch]))
            if len(results) != len(batch):
                raise RuntimeError(f"run_batch returned {len(results)} results for {len(batch)} items")
        except BaseException as err:  # every item of this batch learns why
            log.exception("batch of %d failed", len(batch))
            results = [err] * len(batch)
        for slot, result in zip(batch, results, strict=True):
            if isinstance(result, BaseException):
                slot.future.set_exception(result)
            else:
                slot.future.set_result(result)
