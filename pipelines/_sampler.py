"""Epoch plans: which samples each shard reads, in which order, batch by batch.

Documented behaviour (shared by the image and clip loaders):

* **Order.** With ``shuffle``, epoch ``e`` uses a permutation drawn from ``(seed, e)``; every rank
  draws the same one, so shards never overlap. Without it, sample-id order.
* **Sharding.** Shard ``k`` of ``n`` takes every n-th sample of the epoch order starting at ``k``,
  so shard sizes differ by at most one and each sample belongs to exactly one shard per epoch.
* **Last batch.** ``drop``: every shard yields ``(N // n) // batch`` full batches (identical step
  counts on all ranks, as DDP needs; up to ``n * batch - 1`` samples sit out each epoch, different
  ones each epoch when shuffling). ``partial``: a shard yields all of its samples, its last batch
  smaller; across shards each sample appears exactly once. ``pad``: every shard is padded to
  ``ceil(N / n)`` samples and then to whole batches by repeating its own first samples (a shard
  with none of its own, the epoch's first ones); padding rows are marked invalid (``valid``
  false), so metrics can ignore them while every rank runs the same number of equal-shaped steps.
* **Skipped samples.** Files found bad while reading (``on_bad_sample: skip``) are removed from
  this rank's shard only after the permutation and the split, so the rest of the epoch keeps its
  order and no sample changes shard. Under ``drop`` a shard left short is topped up by repeating
  its own samples, so every rank still runs the same number of steps.
* **Resume.** A plan can start at any batch; the samples before it are skipped, not re-read.
* **Resume on another world size.** The epoch's global order depends on ``(seed, epoch, dataset)``
  alone. A checkpoint records, per rank, how many entries of its share it had consumed (a
  :class:`Segment`); the epoch's *remaining order* is the global order without them, in order,
  and the new ranks shard it exactly as above (every ``n``-th from ``k``), with the last-batch
  policy applied to what remains. Batches keep counting from where the epoch stood, so a plan of
  a resumed epoch starts at that batch. Chains of resumes (4 ranks, then 2, then 1) stack their
  segments. Under ``partial`` and ``pad`` every sample of the epoch is read exactly once across
  the segments (``pad`` rows are marked invalid); under ``drop`` at most once, the samples that
  sit out being the tail of the remaining order.

A loader's pipeline reads a *stream*: the plans of consecutive epochs, batch after batch, from
some (epoch, batch) on (:class:`PlanStream`). Pipeline iteration ``k`` is always the same plan
batch, computed from ``(spec, start, k)`` alone, so the process that feeds DALI, DALI's Python
workers and the loader reading the outputs agree on it without talking to each other.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

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

LAST_BATCH_POLICIES = ("drop", "partial", "pad")


@dataclass(frozen=True)
class EpochPlan:
    """One shard's samples for one epoch.

    Attributes:
        sample_ids: Sample ids in read order (padding rows repeat earlier ids).
        valid: False for padding rows.
        batch_size: Samples per batch; only the last batch may be smaller (``partial``).
        epoch: The epoch this plan is for.
        start_batch: Batches of this epoch already consumed before this plan (resume).
    """

    sample_ids: np.ndarray
    valid: np.ndarray
    batch_size: int
    epoch: int
    start_batch: int = 0

    @property
    def num_batches(self) -> int:
        """Batches in the whole epoch, including those before ``start_batch``."""
        return self.start_batch + -(-len(self.sample_ids) // self.batch_size)


@dataclass(frozen=True)
class Segment:
    """The part of an epoch that one world size read before a resume on another.

    Attributes:
        shards: Ranks (shards) of that world.
        consumed: Per shard, how many entries of its share it had consumed, counted before
            exclusions (a file skipped as bad counts where it stood).
        batch: The epoch's batch count when the segment ended: the next segment starts there.
    """

    shards: int
    consumed: tuple[int, ...]
    batch: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "consumed", tuple(int(p) for p in self.consumed))
        if self.shards < 1 or len(self.consumed) != self.shards or min(self.consumed) < 0:
            raise ValueError(f"segment of {self.shards} shard(s) with consumed counts {list(self.consumed)} is invalid")

    def to_dict(self) -> dict:
        return {"shards": self.shards, "consumed": list(self.consumed), "batch": self.batch}

    @classmethod
    def from_dict(cls, data: dict) -> Segment:
        return cls(int(data["shards"]), tuple(data["consumed"]), int(data["batch"]))


@dataclass(frozen=True)
class EpochHistory:
    """The segments an epoch was read in before the current world size took over (resumes)."""

    epoch: int
    segments: tuple[Segment, ...]

    def of(self, epoch: int) -> tuple[Segment, ...]:
        """The segments of ``epoch``: none unless it is the resumed one."""
        return self.segments if epoch == self.epoch else ()


def epoch_order(usable_ids: np.ndarray, *, epoch: int, seed: int, shuffle: bool) -> np.ndarray:
    """The epoch's global order: a function of ``(seed, epoch, usable ids)``, never of the world size."""
    ids = np.asarray(usable_ids, dtype=np.int64)
    if shuffle:
        ids = ids[np.random.default_rng([seed, epoch]).permutation(len(ids))]
    return ids


def remaining_order(order: np.ndarray, history: Sequence[Segment] = ()) -> np.ndarray:
    """``order`` without the entries the segments of ``history`` consumed, in order.

    Shard ``k`` of a segment of ``n`` owned entries ``k, k + n, ...`` of the order it read and
    consumed the first ``consumed[k]`` of them.
    """
    for segment in history:
        taken = np.zeros(len(order), dtype=bool)
        for shard, count in enumerate(segment.consumed):
            taken[shard :: segment.shards][:count] = True
        order = order[~taken]
    return order


def _base_batch(history: Sequence[Segment]) -> int:
    return history[-1].batch if history else 0


def consumed_in_share(
    usable_ids: np.ndarray,
    *,
    epoch: int,
    seed: int,
    shuffle: bool,
    shard_id: int,
    num_shards: int,
    batch_size: int,
    batch: int,
    history: Sequence[Segment] = (),
    excluded: np.ndarray | Sequence[int] = (),
) -> int:
    """Entries of shard ``shard_id``'s share consumed once the epoch stands at ``batch``.

    Counted before exclusions, so the count locates the position in the share (and the global
    order) that a :class:`Segment` records; ``batch`` counts from the epoch's start.
    """
    rows = max(0, batch - _base_batch(history)) * batch_size
    remaining = len(usable_ids) - sum(sum(s.consumed) for s in history)
    share_length = len(range(shard_id, max(0, remaining), num_shards))
    if len(excluded) == 0:  # the common case needs no permutation: rows map one to one
        return min(rows, share_length)
    order = remaining_order(epoch_order(usable_ids, epoch=epoch, seed=seed, shuffle=shuffle), history)
    share = order[shard_id::num_shards]
    kept = np.flatnonzero(~np.isin(share, np.asarray(excluded, dtype=np.int64)))
    return int(kept[rows]) if rows < len(kept) else len(share)


def plan_epoch(
    usable_ids: np.ndarray,
    *,
    epoch: int,
    seed: int,
    shuffle: bool,
    shard_id: int,
    num_shards: int,
    batch_size: int,
    last_batch: str,
    start_batch: int = 0,
    excluded: np.ndarray | Sequence[int] = (),
    history: Sequence[Segment] = (),
) -> EpochPlan:
    """The plan for shard ``shard_id`` of ``num_shards`` in ``epoch`` (see the module docs).

    Args:
        usable_ids: Sample ids every rank agrees on (the same list on all ranks).
        start_batch: The epoch's first batch to plan; in a resumed epoch (``history``) no earlier
            than where the earlier segments left it (batches before that were theirs).
        excluded: Ids this rank found bad while reading; removed after sharding.
        history: The segments other world sizes read of this epoch before (resume).
    """
    if last_batch not in LAST_BATCH_POLICIES:
        raise ValueError(f"last_batch {last_batch!r} is not allowed; allowed: {', '.join(LAST_BATCH_POLICIES)}")
    if not 0 <= shard_id < num_shards:
        raise ValueError(f"shard_id {shard_id} is out of range [0, {num_shards})")
    ids = remaining_order(epoch_order(usable_ids, epoch=epoch, seed=seed, shuffle=shuffle), history)
    base = _base_batch(history)
    start_batch = max(start_batch, base)
    shard = ids[shard_id::num_shards]
    if len(excluded):
        shard = shard[~np.isin(shard, np.asarray(excluded, dtype=np.int64))]
    valid = np.ones(len(shard), dtype=bool)
    if last_batch == "drop":
        keep = (len(ids) // num_shards) // batch_size * batch_size
        if len(shard) < keep and len(shard):
            shard = np.resize(shard, keep)
        shard = shard[:keep]
        valid = np.ones(len(shard), dtype=bool)
    elif last_batch == "pad" and len(ids):
        per_shard = -(-len(ids) // num_shards)
        total = -(-per_shard // batch_size) * batch_size
        extra = total - len(shard)
        # A shard left empty (fewer samples remain than ranks, or all of its own were bad) still runs
        # the others' steps, on the epoch's first usable samples as padding.
        filler = shard if len(shard) else ids[~np.isin(ids, np.asarray(excluded, dtype=np.int64))]
        if len(filler):
            shard = np.concatenate([shard, np.resize(filler, extra)])
            valid = np.concatenate([valid, np.zeros(extra, dtype=bool)])
    skip = min((start_batch - base) * batch_size, len(shard))
    return EpochPlan(shard[skip:], valid[skip:], batch_size, epoch, start_batch=start_batch)


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


# Epochs in a row whose plan is empty (every sample of the shard excluded) before giving up.
_MAX_EMPTY_EPOCHS = 64


class PlanStream:
    """The plan batches a pipeline reads, epoch after epoch, from ``(epoch, batch)`` on.

    ``stream[k]`` is the k-th pipeline iteration's batch, a pure function of ``(spec, epoch,
    batch, k)``; plans are computed when first needed and the two most recent kept.
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
        if k < 0:
            raise IndexError(f"iteration {k} is negative")
        while not self._ends or self._ends[-1] <= k:
            self._extend()
        pos = int(np.searchsorted(self._ends, k, side="right"))
        first, epoch, start_batch = self._starts[pos]
        return epoch, start_batch + (k - first)

    def __getitem__(self, k: int) -> StreamBatch:
        epoch, batch = self.position(k)
        plan = self.plan(epoch)
        size = self.spec.batch_size
        first = (batch - plan.start_batch) * size  # a resumed epoch's plan starts where it was left
        rows = slice(first, first + size)
        return StreamBatch(epoch, batch, plan.sample_ids[rows], plan.valid[rows], batch * size)

    def iterations_until(self, epoch: int) -> int:
        """Iterations before the first batch of ``epoch`` (which must not precede the start)."""
        k = 0
        while self.position(k)[0] < epoch:
            k = self._ends[int(np.searchsorted(self._ends, k, side="right"))]
        return k
