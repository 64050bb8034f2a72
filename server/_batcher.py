"""Dynamic batching, free of HTTP: take what is queued when it makes a batch size, else wait at most ``max_delay``.

A :class:`Batcher` owns its worker threads. ``submit(items)`` queues items (all or none: a request
never gets half its images queued) and returns one :class:`concurrent.futures.Future` per item.

When a worker is free it looks at the queue, much as Triton's dynamic batcher does with preferred
batch sizes and a queue delay:

* at least ``batch_size`` (the largest size N) waiting: it takes the oldest N at once;
* exactly one of ``batch_sizes`` waiting (a lone request, 1, is one when the model runs at 1):
  it takes them all at once, since that batch needs no padding and waiting would only add latency;
* any other count: it waits for more, until the count reaches one of the sizes or the oldest item
  has waited ``max_delay_s``, then takes everything (at most N).

Under load the queue grows while the workers are busy, so batches fill to N by themselves; a lone
request never waits for company that is not coming. The batch goes to ``run_batch(items)``, which
returns one result per item; a result that is an exception fails only its own item's future, so one
bad image never fails its neighbours. Running a batch of k at the smallest size that holds it, and
padding up to that size, is ``run_batch``'s business (it knows the tensors); the batcher only
guarantees at most N items per call.

The queue is bounded: :class:`QueueFullError` when ``capacity`` items are already waiting, so a
caller can answer 503 with Retry-After instead of letting latency grow without limit. A caller
that gives up (timeout, client gone) calls :meth:`Batcher.cancel`: its queued items leave the queue
and are never run; its items already in a running batch cannot be stopped, but are marked, and
``run_batch`` sees the marks through :meth:`Batch.abandoned` and skips them (no decode, no
inference when nothing is left). :meth:`Batcher.close` stops taking work and either drains what is
queued (graceful shutdown) or fails it.

Usage::

    batcher = Batcher(model_step, batch_size=8, batch_sizes=(1, 2, 4, 8), max_delay_s=0.005, capacity=256)
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
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass
from typing import Any

__all__ = ["Batch", "Batcher", "BatcherClosedError", "QueueFullError"]

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
    abandoned: bool = False  # its caller gave up after the batch was taken


class Batch(list):
    """The items of one batch, oldest first, as ``run_batch`` receives them (a plain list of items).

    :meth:`abandoned` tells, at the moment it is called, which items' callers have given up since
    the batch was taken (:meth:`Batcher.cancel`): their results are not wanted any more.
    """

    def __init__(self, slots: list[_Slot]) -> None:
        super().__init__(s.item for s in slots)
        self._slots = slots

    def abandoned(self) -> list[bool]:
        """One flag per item: True where the caller gave up."""
        return [s.abandoned for s in self._slots]


class Batcher:
    """Gathers items into batches of at most ``batch_size`` for ``run_batch``, on worker threads.

    Args:
        run_batch: ``items -> results``, one result per item, in order; ``items`` is a
            :class:`Batch`. A result that is a ``BaseException`` becomes that item's exception. If
            ``run_batch`` itself raises, every item of that batch gets the exception.
        batch_size: Most items per call (the model's largest batch size N).
        batch_sizes: Counts that are taken at once, without waiting for more (the model's batch
            sizes); default: ``(batch_size,)``, i.e. wait for a full batch or the delay. Counts of
            ``batch_size`` and more are always taken at once.
        max_delay_s: Longest time the oldest waiting item waits for the queue to reach one of
            ``batch_sizes``.
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
        batch_sizes: Sequence[int] = (),
        max_delay_s: float,
        capacity: int,
        on_batch: Callable[[list[float], int], None] | None = None,
        name: str = "gpufeed-batcher",
        workers: int = 1,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size {batch_size} must be >= 1")
        if any(n < 1 or n > batch_size for n in batch_sizes):
            raise ValueError(f"batch_sizes {list(batch_sizes)} must lie in 1..batch_size ({batch_size})")
        if capacity < 1:
            raise ValueError(f"capacity {capacity} must be >= 1")
        if max_delay_s < 0:
            raise ValueError(f"max_delay_s {max_delay_s} must be >= 0")
        if workers < 1:
            raise ValueError(f"workers {workers} must be >= 1")
        self._run_batch = run_batch
        self.batch_size = batch_size
        self.batch_sizes = tuple(sorted({*batch_sizes, batch_size}))
        self.max_delay_s = max_delay_s
        self.capacity = capacity
        self._on_batch = on_batch
        self._queue: deque[_Slot] = deque()
        self._running: dict[int, _Slot] = {}  # id(future) -> slot, for items inside a running batch
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
        """Give up on items: queued ones leave the queue, running ones are marked abandoned.

        Returns:
            How many were withdrawn from the queue (they will never run).
        """
        wanted = {id(f) for f in futures}
        with self._cond:
            keep = deque(s for s in self._queue if id(s.future) not in wanted or not s.future.cancel())
            withdrawn = len(self._queue) - len(keep)
            self._queue = keep
            for key in wanted:
                slot = self._running.get(key)
                if slot is not None:
                    slot.abandoned = True
            self._cond.notify_all()  # the queue's count changed: a waiting worker looks again
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
    def _due(self) -> bool:
        """Whether the queue makes a batch now (called with the lock held)."""
        depth = len(self._queue)
        return depth >= self.batch_size or depth in self.batch_sizes or self._closed

    def _take(self) -> list[_Slot] | None:
        """Block until a batch is due; return it (None when closed and empty)."""
        with self._cond:
            while not self._queue:
                if self._closed:
                    return None
                self._cond.wait()
            while not self._due():
                remaining = self._queue[0].enqueued + self.max_delay_s - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
                if not self._queue:  # everything waiting was cancelled
                    return []
            batch: list[_Slot] = []
            while self._queue and len(batch) < self.batch_size:
                slot = self._queue.popleft()
                if slot.future.set_running_or_notify_cancel():
                    batch.append(slot)
                    self._running[id(slot.future)] = slot
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
            results = list(self._run_batch(Batch(batch)))
            if len(results) != len(batch):
                raise RuntimeError(f"run_batch returned {len(results)} results for {len(batch)} items")
        except BaseException as err:  # every item of this batch learns why
            log.exception("batch of %d failed", len(batch))
            results = [err] * len(batch)
        with self._cond:
            for slot in batch:
                self._running.pop(id(slot.future), None)
        for slot, result in zip(batch, results, strict=True):
            if slot.abandoned:  # nobody waits for it; a thread that still does learns why
                slot.future.set_exception(CancelledError("its caller gave up while its batch ran"))
            elif isinstance(result, BaseException):
                slot.future.set_exception(result)
            else:
                slot.future.set_result(result)
