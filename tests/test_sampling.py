"""Epoch plans and crop windows: pure functions, checked without DALI."""

from __future__ import annotations

import os
import pickle
import select
import signal

import numpy as np
import pytest

from gpufeed.pipelines._sampler import PlanSpec, PlanStream, plan_epoch
from gpufeed.pipelines._windows import eval_windows, hash_uniforms, train_windows


def _plan(n, shard, shards, policy, batch=4, epoch=0, seed=1, shuffle=True, **kw):
    return plan_epoch(
        np.arange(n),
        epoch=epoch,
        seed=seed,
        shuffle=shuffle,
        shard_id=shard,
        num_shards=shards,
        batch_size=batch,
        last_batch=policy,
        **kw,
    )


@pytest.mark.parametrize("n", [17, 20, 3])
def test_partial_covers_every_sample_exactly_once_across_shards(n):
    ids = np.concatenate([_plan(n, k, 2, "partial").sample_ids for k in range(2)])
    assert sorted(ids.tolist()) == list(range(n))


def test_drop_gives_every_shard_the_same_number_of_full_batches():
    plans = [_plan(23, k, 3, "drop") for k in range(3)]
    assert {p.num_batches for p in plans} == {(23 // 3) // 4}
    ids = np.concatenate([p.sample_ids for p in plans])
    assert len(set(ids.tolist())) == len(ids), "no sample twice"


def test_pad_equalises_shards_and_marks_padding():
    plans = [_plan(10, k, 3, "pad") for k in range(3)]
    assert {len(p.sample_ids) for p in plans} == {4}
    real = np.concatenate([p.sample_ids[p.valid] for p in plans])
    assert sorted(real.tolist()) == list(range(10))


def test_order_depends_on_seed_and_epoch_only():
    a, b = _plan(50, 0, 1, "partial"), _plan(50, 0, 1, "partial")
    assert np.array_equal(a.sample_ids, b.sample_ids)
    assert not np.array_equal(a.sample_ids, _plan(50, 0, 1, "partial", epoch=1).sample_ids)
    assert not np.array_equal(a.sample_ids, _plan(50, 0, 1, "partial", seed=2).sample_ids)
    assert np.array_equal(_plan(50, 0, 1, "partial", shuffle=False).sample_ids, np.arange(50))


def test_resume_skips_consumed_batches():
    full = _plan(30, 1, 2, "partial")
    resumed = _plan(30, 1, 2, "partial", start_batch=2)
    assert np.array_equal(resumed.sample_ids, full.sample_ids[8:])
    assert resumed.num_batches == full.num_batches


def test_excluding_a_sample_keeps_order_and_shards():
    full = _plan(40, 0, 2, "partial")
    bad = full.sample_ids[5]
    fewer = _plan(40, 0, 2, "partial", excluded=[bad])
    assert np.array_equal(fewer.sample_ids, np.delete(full.sample_ids, 5))
    other = _plan(40, 1, 2, "partial", excluded=[bad])
    assert np.array_equal(other.sample_ids, _plan(40, 1, 2, "partial").sample_ids)
    assert len(_plan(40, 0, 2, "drop", excluded=[bad]).sample_ids) == len(_plan(40, 0, 2, "drop").sample_ids)


@pytest.mark.parametrize("policy", ["drop", "partial", "pad"])
def test_the_stream_is_the_epoch_plans_batch_after_batch(policy):
    spec = PlanSpec(np.arange(23), seed=4, shuffle=True, shard_id=1, num_shards=2, batch_size=4, last_batch=policy)
    stream = PlanStream(spec, epoch=3, batch=1)
    expected = []
    for epoch in (3, 4, 5, 6):
        plan = _plan(23, 1, 2, policy, epoch=epoch, seed=4)
        first = 1 if epoch == 3 else 0
        for b in range(first, plan.num_batches):
            expected.append((epoch, b, plan.sample_ids[b * 4 : (b + 1) * 4], plan.valid[b * 4 : (b + 1) * 4]))
    got = [stream[k] for k in range(len(expected))]
    for batch, (epoch, b, ids, valid) in zip(got, expected, strict=True):
        assert (batch.epoch, batch.batch, batch.first_row) == (epoch, b, b * 4)
        assert np.array_equal(batch.sample_ids, ids) and np.array_equal(batch.valid, valid)
    per_epoch = _plan(23, 1, 2, policy).num_batches
    assert stream.iterations_until(4) == per_epoch - 1 and stream.iterations_until(6) == 3 * per_epoch - 1
    # A worker process gets a copy that computes the same batches on its own, in any order.
    copy = pickle.loads(pickle.dumps(stream))
    assert all(np.array_equal(copy[k].sample_ids, got[k].sample_ids) for k in reversed(range(len(got))))


def test_planning_ahead_gives_the_same_plans_and_a_forked_copy_plans_alone():
    spec = PlanSpec(np.arange(50), seed=2, shuffle=True, shard_id=0, num_shards=1, batch_size=8, last_batch="pad")
    stream = PlanStream(spec, epoch=0, plan_ahead=True)
    assert np.array_equal(stream.plan(0).sample_ids, spec.plan(0).sample_ids)
    assert set(stream._ahead) == {1}  # epoch 1 is being planned on the background thread
    assert np.array_equal(stream.plan(1).sample_ids, spec.plan(1).sample_ids)
    # A forked child inherits the stream and the executor but not its thread: it must plan itself
    # (this hung DALI's fork-started PyAV workers before planning was keyed by process).
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        # Epoch 4 would wait on a future submitted while planning epoch 3, in a thread-less executor.
        ok = all(np.array_equal(stream.plan(e).sample_ids, spec.plan(e).sample_ids) for e in (3, 4))
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.close(write)
    answered, _, _ = select.select([read], [], [], 30)
    if not answered:
        os.kill(child, signal.SIGKILL)
    os.waitpid(child, 0)
    assert answered, "the forked copy hung planning an epoch"
    assert os.read(read, 1) == b"1"


def test_a_spec_with_other_exclusions_is_another_plan():
    a = PlanSpec(np.arange(10), seed=0, shuffle=True, shard_id=0, num_shards=1, batch_size=4, last_batch="drop")
    same = PlanSpec(np.arange(10), seed=0, shuffle=True, shard_id=0, num_shards=1, batch_size=4, last_batch="drop")
    fewer = PlanSpec(np.arange(10), 0, True, 0, 1, 4, "drop", excluded=[3])
    assert a == same and a != fewer
    assert np.array_equal(fewer.plan(2).sample_ids, _plan(10, 0, 1, "drop", epoch=2, seed=0, excluded=[3]).sample_ids)


def test_bad_policy_and_shard_are_named():
    with pytest.raises(ValueError, match="allowed: drop, partial, pad"):
        _plan(5, 0, 1, "keep")
    with pytest.raises(ValueError, match="shard_id 2 is out of range"):
        _plan(5, 2, 2, "drop")


def test_hash_uniforms_are_per_sample_and_in_range():
    u = hash_uniforms(3, 1, np.array([5, 9, 5]), 7)
    assert u.shape == (3, 7) and (u >= 0).all() and (u < 1).all()
    assert np.array_equal(u[0], u[2]) and not np.array_equal(u[0], u[1])
    assert not np.array_equal(u, hash_uniforms(3, 2, np.array([5, 9, 5]), 7))
    big = hash_uniforms(0, 0, np.arange(20000), 1).ravel()
    assert abs(big.mean() - 0.5) < 0.01 and abs(np.median(big) - 0.5) < 0.01


def test_train_windows_follow_random_resized_crop():
    rng = np.random.default_rng(0)
    width = rng.integers(40, 800, 5000)
    # Moderate shapes: extreme ones take the centred fallback, tested separately below.
    sizes = np.stack([width, np.clip(width * rng.uniform(0.5, 2.0, 5000), 20, None).astype(int)], axis=1)
    ids = np.arange(5000)
    w = train_windows(sizes, ids, seed=0, epoch=0)
    x, y = w.anchor.T
    cw, ch = w.shape.T
    assert (x >= 0).all() and (y >= 0).all() and (cw >= 1).all() and (ch >= 1).all()
    assert (x + cw <= sizes[:, 0]).all() and (y + ch <= sizes[:, 1]).all()
    image_area = sizes[:, 0] * sizes[:, 1]
    # Width and height are rounded to whole pixels, as in torchvision: allow half a pixel each.
    assert ((cw + 0.5) * (ch + 0.5) >= 0.08 * image_area).all()
    assert (cw * ch <= image_area).all()
    aspect = (cw + 0.5) / np.maximum(ch - 0.5, 0.5)
    assert (aspect >= 3 / 4).all()
    assert 0.4 < w.flip.mean() < 0.6
    # Batch-independence: a sample's window does not depend on its neighbours.
    sub = train_windows(sizes[10:20], ids[10:20], seed=0, epoch=0)
    assert np.array_equal(sub.anchor, w.anchor[10:20]) and np.array_equal(sub.shape, w.shape[10:20])
    assert not np.array_equal(train_windows(sizes, ids, seed=0, epoch=1).anchor, w.anchor)


def test_train_windows_fall_back_to_a_centred_crop_for_extreme_shapes():
    sizes = np.array([[1000, 10], [10, 1000]])
    w = train_windows(sizes, np.arange(2), seed=0, epoch=0, area=(0.9, 1.0))
    assert w.shape.tolist() == [[13, 10], [10, 13]]
    assert w.anchor.tolist() == [[(1000 - 13) // 2, 0], [0, (1000 - 13) // 2]]


def test_eval_windows_are_centre_squares():
    w = eval_windows(np.array([[100, 80], [80, 100]]), 0.875)
    assert w.shape.tolist() == [[70, 70], [70, 70]]
    assert w.anchor.tolist() == [[15, 5], [5, 15]]
    assert not w.flip.any()


def test_roi_folds_the_flip_into_the_resize():
    w = train_windows(np.array([[100, 100]] * 64), np.arange(64), 0, 0)
    start, end = w.roi()
    flipped = w.flip == 1
    assert np.array_equal(start[flipped, 1], w.shape[flipped, 0]) and (end[flipped, 1] == 0).all()
    assert (start[~flipped, 1] == 0).all() and np.array_equal(end[~flipped, 1], w.shape[~flipped, 0])
