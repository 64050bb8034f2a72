"""Epoch plans: which samples each shard reads in one epoch, in which order, batch by batch.

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
  its own samples (a shard left with none, the epoch's other usable ones, as rows that count), so
  every rank still runs the same number of steps.
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

The plans of consecutive epochs, as a pipeline reads them iteration after iteration, are a
:class:`~gpufeed.pipelines._sampler.PlanStream`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "LAST_BATCH_POLICIES",
    "EpochHistory",
    "EpochPlan",
    "Segment",
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
    # A shard left empty (fewer samples remain than ranks, or all of its own were bad) still runs the
    # others' steps, on the epoch's usable samples: a rank that planned none would leave the others'
    # collectives unmatched (a hang).
    filler = shard if len(shard) else ids[~np.isin(ids, np.asarray(excluded, dtype=np.int64))]
    if last_batch == "drop":
        keep = (len(ids) // num_shards) // batch_size * batch_size
        # As rows that count, like a short shard's repeats of its own: under drop every row is
        # real, so no rank's loss needs weighting by its real rows (a few samples train twice).
        if len(shard) < keep and len(filler):
            shard = np.resize(filler, keep)
        shard = shard[:keep]
        valid = np.ones(len(shard), dtype=bool)
    elif last_batch == "pad" and len(ids):
        per_shard = -(-len(ids) // num_shards)
        total = -(-per_shard // batch_size) * batch_size
        extra = total - len(shard)
        if len(filler):
            shard = np.concatenate([shard, np.resize(filler, extra)])
            valid = np.concatenate([valid, np.zeros(extra, dtype=bool)])
    skip = min((start_batch - base) * batch_size, len(shard))
    return EpochPlan(shard[skip:], valid[skip:], batch_size, epoch, start_batch=start_batch)
