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
  ``ceil(N / n)`` samples and then to whole batches by repeating its own first samples; padding
  rows are marked invalid (``valid`` false), so metrics can ignore them while every rank runs the
  same number of equal-shaped steps.
* **Skipped samples.** Files found bad while reading (``on_bad_sample: skip``) are removed from
  this rank's shard only after the permutation and the split, so the rest of the epoch keeps its
  order and no sample changes shard. Under ``drop`` a shard left short is topped up by repeating
  its own samples, so every rank still runs the same number of steps.
* **Resume.** A plan can start at any batch; the samples before it are skipped, not re-read.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["LAST_BATCH_POLICIES", "EpochPlan", "plan_epoch"]

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
    excluded: np.ndarray | list[int] = (),
) -> EpochPlan:
    """The plan for shard ``shard_id`` of ``num_shards`` in ``epoch`` (see the module docs).

    Args:
        usable_ids: Sample ids every rank agrees on (the same list on all ranks).
        excluded: Ids this rank found bad while reading; removed after sharding.
    """
    if last_batch not in LAST_BATCH_POLICIES:
        raise ValueError(f"last_batch {last_batch!r} is not allowed; allowed: {', '.join(LAST_BATCH_POLICIES)}")
    if not 0 <= shard_id < num_shards:
        raise ValueError(f"shard_id {shard_id} is out of range [0, {num_shards})")
    ids = np.asarray(usable_ids, dtype=np.int64)
    if shuffle:
        ids = ids[np.random.default_rng([seed, epoch]).permutation(len(ids))]
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
    elif last_batch == "pad" and len(shard):
        per_shard = -(-len(ids) // num_shards)
        total = -(-per_shard // batch_size) * batch_size
        extra = total - len(shard)
        shard = np.concatenate([shard, np.resize(shard, extra)])
        valid = np.concatenate([valid, np.zeros(extra, dtype=bool)])
    skip = min(start_batch * batch_size, len(shard))
    return EpochPlan(shard[skip:], valid[skip:], batch_size, epoch, start_batch=start_batch)
