"""The plan stream: the plan batches a loader's pipeline reads, epoch after epoch.

A loader's pipeline reads a *stream*: the plans of consecutive epochs, batch after batch, from
some (epoch, batch) on (:class:`PlanStream`). Pipeline iteration ``k`` is always the same plan
batch, computed from ``(spec, start, k)`` alone, so the process that feeds DALI, DALI's Python
workers and the loader reading the outputs agree on it without talking to each other.

Each epoch's plan (order, shards, last batch, skipped samples, resume on another world size; the
documented behaviour shared by the image and clip loaders) comes from
:mod:`gpufeed.pipelines._epoch_plan`, whose names are re-exported here: a loader takes its
sampling from this one module.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from gpufeed.pipelines._epoch_plan import (
    LAST_BATCH_POLICIES,
    EpochHistory,
    EpochPlan,
    Segment,
    consumed_in_share,
    epoch_order,
    plan_epoch,
    remaining_order,
)

__all__ = [
    "LAST_BATCH_POLICIES",
    "EpochHistory",
    "EpochPlan",
    "PlanSpec",
    "PlanStream",
    "Segment",
    "StreamBatch",
    "consumed_in_share",
    "epoch_order",
    "plan_epoch",
    "remaining_order",
]


@dataclass(frozen=True, eq=False)
class PlanSpec:
    """Everything :func:`plan_epoch` needs except the epoch: one shard's plans, epoch by epoch.

    Cheap to pickle (DALI's Python workers get a copy), and compared by value: two specs that
    differ (a file found bad since) mean a pipeline built for one cannot serve the other.
    """

    usable_ids: np.ndarray
    seed: int
    shuffle: bool
    shard_id: int
    num_shards: int
    batch_size: int
    last_batch: str
    excluded: np.ndarray | Sequence[int] = ()
    history: EpochHistory | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "usable_ids", np.asarray(self.usable_ids, dtype=np.int64))
        object.__setattr__(self, "excluded", np.unique(np.asarray(self.excluded, dtype=np.int64)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PlanSpec):
            return NotImplemented
        same = (self.seed, self.shuffle, self.shard_id, self.num_shards, self.batch_size, self.last_batch)
        theirs = (other.seed, other.shuffle, other.shard_id, other.num_shards, other.batch_size, other.last_batch)
        return (
            same == theirs
            and self.history == other.history
            and np.array_equal(self.usable_ids, other.usable_ids)
            and np.array_equal(self.excluded, other.excluded)
        )

    __hash__ = None  # type: ignore[assignment]  # mutable-looking arrays inside: compare, never hash

    def plan(self, epoch: int, start_batch: int = 0) -> EpochPlan:
        return plan_epoch(
            self.usable_ids,
            epoch=epoch,
            seed=self.seed,
            shuffle=self.shuffle,
            shard_id=self.shard_id,
            num_shards=self.num_shards,
            batch_size=self.batch_size,
            last_batch=self.last_batch,
            start_batch=start_batch,
            excluded=self.excluded,
            history=self.history.of(epoch) if self.history else (),
        )


@dataclass(frozen=True)
class StreamBatch:
    """One plan batch as a pipeline iteration reads it.

    Attributes:
        epoch, batch: Which batch of which epoch.
        sample_ids: (n,) ids of its rows, ``n <= batch_size`` (only a ``partial`` last batch is short).
        valid: (n,) False for padding rows (``last_batch: pad``).
        first_row: Position of its first row in the epoch's plan.
    """

    epoch: int
    batch: int
    sample_ids: np.ndarray
    valid: np.ndarray
    first_row: int

    def __len__(self) -> int:
        return len(self.sample_ids)


_PLANNER: tuple[int, ThreadPoolExecutor] | None = None


def _planner() -> ThreadPoolExecutor:
    """One background thread for planning epochs ahead (shared by every stream of the process).

    Keyed by process id: a forked worker inherits the executor object but not its thread, so work
    submitted there would never run.
    """
    global _PLANNER
    if _PLANNER is None or _PLANNER[0] != os.getpid():
        _PLANNER = (os.getpid(), ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpufeed-plan"))
    return _PLANNER[1]


# Epochs in a row whose plan is empty before giving up: nothing left of a resumed epoch, too few
# samples for a batch (both alike on every rank), or every sample of the epoch excluded on this
# rank (a shard emptied by its own exclusions reads the epoch's other samples; see plan_epoch).
_MAX_EMPTY_EPOCHS = 64


class PlanStream:
    """The plan batches a pipeline reads, epoch after epoch, from ``(epoch, batch)`` on.

    ``stream[k]`` is the k-th pipeline iteration's batch, a pure function of ``(spec, epoch,
    batch, k)``; plans are computed when first needed and the two most recent kept. Thread-safe:
    an image feed's thread reads it a few batches ahead of the loader.
    """

    def __init__(self, spec: PlanSpec, epoch: int, batch: int = 0, *, plan_ahead: bool = False) -> None:
        self.spec, self.epoch, self.batch = spec, int(epoch), int(batch)
        self.plan_ahead = plan_ahead
        # Only the process that made the stream plans ahead: a forked copy (DALI's "fork" workers)
        # plans what it reads itself rather than waiting on futures of its parent's thread.
        self._pid = os.getpid()
        # (first iteration, epoch, first batch) of each epoch reached so far, in order.
        self._starts: list[tuple[int, int, int]] = []
        self._ends: list[int] = []  # iteration after each of those epochs
        self._plans: dict[int, EpochPlan] = {}
        self._ahead: dict[int, Future] = {}
        self._lock = threading.RLock()

    def __getstate__(self) -> dict:
        return {"spec": self.spec, "epoch": self.epoch, "batch": self.batch}

    def __setstate__(self, state: dict) -> None:
        PlanStream.__init__(self, state["spec"], state["epoch"], state["batch"])

    def plan(self, epoch: int) -> EpochPlan:
        """The whole plan of ``epoch`` (kept: the two most recently planned epochs).

        With ``plan_ahead``, planning an epoch starts planning the next one on a background thread:
        shuffling a large dataset takes tens of milliseconds, which would otherwise land in one
        training step per epoch.
        """
        with self._lock:
            plan = self._plans.get(epoch)
            if plan is None:
                here = os.getpid() == self._pid
                future = self._ahead.pop(epoch, None) if here else None
                plan = future.result() if future is not None else self.spec.plan(epoch)
                self._plans[epoch] = plan
                for old in sorted(self._plans)[:-2]:
                    del self._plans[old]
                upcoming = epoch + 1
                if here and self.plan_ahead and upcoming not in self._plans and upcoming not in self._ahead:
                    self._ahead = {upcoming: _planner().submit(self.spec.plan, upcoming)}
            return plan

    def _extend(self) -> None:
        if self._starts:
            first, epoch = self._ends[-1], self._starts[-1][1] + 1
            start_batch = 0
        else:
            first, epoch, start_batch = 0, self.epoch, self.batch
        for _ in range(_MAX_EMPTY_EPOCHS):
            count = self.plan(epoch).num_batches - start_batch
            if count > 0:
                self._starts.append((first, epoch, start_batch))
                self._ends.append(first + count)
                return
            epoch, start_batch = epoch + 1, 0
        raise ValueError(f"shard {self.spec.shard_id} has no samples left in {_MAX_EMPTY_EPOCHS} epochs from {epoch}")

    def position(self, k: int) -> tuple[int, int]:
        """(epoch, batch) of iteration ``k``."""
        with self._lock:
            if k < 0:
                raise IndexError(f"iteration {k} is negative")
            while not self._ends or self._ends[-1] <= k:
                self._extend()
            pos = int(np.searchsorted(self._ends, k, side="right"))
            first, epoch, start_batch = self._starts[pos]
            return epoch, start_batch + (k - first)

    def __getitem__(self, k: int) -> StreamBatch:
        with self._lock:
            epoch, batch = self.position(k)
            plan = self.plan(epoch)
            size = self.spec.batch_size
            first = (batch - plan.start_batch) * size  # a resumed epoch's plan starts where it was left
            rows = slice(first, first + size)
            return StreamBatch(epoch, batch, plan.sample_ids[rows], plan.valid[rows], batch * size)

    def iterations_until(self, epoch: int) -> int:
        """Iterations before the first batch of ``epoch`` (which must not precede the start)."""
        with self._lock:
            k = 0
            while self.position(k)[0] < epoch:
                k = self._ends[int(np.searchsorted(self._ends, k, side="right"))]
            return k
