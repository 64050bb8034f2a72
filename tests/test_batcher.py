"""The batcher on its own, without HTTP: batch sizes, delays, isolation, bounds, cancel, shutdown."""

from __future__ import annotations

import threading
import time
from concurrent.futures import CancelledError, ThreadPoolExecutor

import pytest

from gpufeed.server import Batcher, BatcherClosedError, QueueFullError

pytestmark = pytest.mark.timeout(60)


class Recorder:
    """A real batch step: squares each number, records every batch it was given."""

    def __init__(self, hold: threading.Event | None = None) -> None:
        self.batches: list[list] = []
        self.hold = hold

    def __call__(self, items):
        if self.hold is not None:
            self.hold.wait(10)
        self.batches.append(list(items))
        return [ValueError(f"bad item {x}") if x < 0 else x * x for x in items]


def test_full_batches_run_without_waiting_for_the_delay():
    step = Recorder()
    batcher = Batcher(step, batch_size=4, max_delay_s=5.0, capacity=64).start()
    started = time.monotonic()
    futures = batcher.submit(list(range(8)))
    assert [f.result(timeout=2) for f in futures] == [x * x for x in range(8)]
    assert time.monotonic() - started < 2.0, "8 items = 2 full batches; nobody waits for the 5 s delay"
    assert step.batches == [[0, 1, 2, 3], [4, 5, 6, 7]]
    batcher.close()


def test_a_partial_batch_runs_after_max_delay():
    step = Recorder()
    batcher = Batcher(step, batch_size=4, max_delay_s=0.2, capacity=64).start()
    started = time.monotonic()
    (future,) = batcher.submit([3])
    assert future.result(timeout=5) == 9
    waited = time.monotonic() - started
    assert 0.15 <= waited < 3.0, waited
    assert step.batches == [[3]]
    batcher.close()


def _wait_until_taken(batcher, deadline_s: float = 5.0) -> None:
    deadline = time.monotonic() + deadline_s
    while batcher.depth and time.monotonic() < deadline:
        time.sleep(0.005)


def test_a_count_that_is_a_batch_size_runs_at_once():
    step = Recorder()
    batcher = Batcher(step, batch_size=8, batch_sizes=(1, 2, 4, 8), max_delay_s=5.0, capacity=64).start()
    started = time.monotonic()
    (lone,) = batcher.submit([3])
    assert lone.result(timeout=2) == 9
    pair = batcher.submit([4, 5])
    assert [f.result(timeout=2) for f in pair] == [16, 25]
    assert time.monotonic() - started < 2.0, "a lone item and a pair need no company: nobody waits the 5 s"
    assert step.batches == [[3], [4, 5]]
    batcher.close()


def test_other_counts_wait_for_the_next_batch_size_or_the_delay():
    step = Recorder()
    batcher = Batcher(step, batch_size=8, batch_sizes=(1, 2, 4, 8), max_delay_s=1.0, capacity=64).start()
    started = time.monotonic()
    three = batcher.submit([1, 2, 3])
    time.sleep(0.05)
    assert not any(f.done() for f in three), "3 is not a batch size: it waits for a fourth"
    fourth = batcher.submit([4])
    assert [f.result(timeout=2) for f in three + fourth] == [1, 4, 9, 16]
    assert time.monotonic() - started < 0.8, "the fourth item made a batch of 4 before the delay ran out"

    started = time.monotonic()
    five = batcher.submit([1, 2, 3, 4, 5])
    assert [f.result(timeout=5) for f in five] == [1, 4, 9, 16, 25]
    assert 0.9 <= time.monotonic() - started < 4.0, "5 waited for 8 up to the delay, then ran as it was"
    assert step.batches == [[1, 2, 3, 4], [1, 2, 3, 4, 5]]
    batcher.close()


def test_under_load_batches_fill_to_n():
    hold = threading.Event()
    step = Recorder(hold)
    batcher = Batcher(step, batch_size=8, batch_sizes=(1, 2, 4, 8), max_delay_s=0.0, capacity=64).start()
    first = batcher.submit([0])  # runs at once and holds the worker, as a slow batch would
    _wait_until_taken(batcher)
    queued = [batcher.submit([k]) for k in range(1, 21)]  # 20 requests arrive while it runs
    hold.set()
    assert [f.result(timeout=5) for f in first + [f for fs in queued for f in fs]] == [k * k for k in range(21)]
    assert [len(b) for b in step.batches] == [1, 8, 8, 4], "what queued up meanwhile ran in full batches"
    batcher.close()


def test_concurrent_submitters_each_get_their_own_results_in_batches_of_at_most_n():
    step = Recorder()
    waits: list[float] = []
    batcher = Batcher(
        step,
        batch_size=5,
        batch_sizes=(1, 2, 5),
        max_delay_s=0.01,
        capacity=1000,
        on_batch=lambda w, rows: waits.extend(w),
    ).start()

    def client(k):
        items = [k * 100 + j for j in range(k % 4 + 1)]
        futures = batcher.submit(items)
        return items, [f.result(timeout=10) for f in futures]

    with ThreadPoolExecutor(16) as pool:
        for items, results in pool.map(client, range(64)):
            assert results == [x * x for x in items]
    assert all(len(b) <= 5 for b in step.batches)
    assert sorted(x for b in step.batches for x in b) == sorted(
        k * 100 + j for k in range(64) for j in range(k % 4 + 1)
    )
    assert len(waits) == sum(len(b) for b in step.batches) and min(waits) >= 0
    batcher.close()


def test_two_workers_run_batches_side_by_side():
    inside, peak, lock = [0], [0], threading.Lock()

    def slow_step(items):
        with lock:
            inside[0] += 1
            peak[0] = max(peak[0], inside[0])
        time.sleep(0.1)
        with lock:
            inside[0] -= 1
        return [x + 1 for x in items]

    batcher = Batcher(slow_step, batch_size=2, max_delay_s=0.0, capacity=64, workers=2).start()
    futures = batcher.submit(list(range(8)))
    assert [f.result(timeout=10) for f in futures] == [x + 1 for x in range(8)]
    assert peak[0] == 2, "two batches were in flight at once"
    batcher.close()


def test_a_failing_item_fails_alone_and_a_failing_step_fails_its_batch_only():
    step = Recorder()
    batcher = Batcher(step, batch_size=3, max_delay_s=0.05, capacity=16).start()
    futures = batcher.submit([2, -1, 4])
    assert futures[0].result(timeout=5) == 4 and futures[2].result(timeout=5) == 16
    with pytest.raises(ValueError, match="bad item -1"):
        futures[1].result(timeout=5)
    batcher.close()

    calls = []

    def explode(items):
        calls.append(items)
        if len(calls) == 1:
            raise RuntimeError("device lost")
        return items

    batcher = Batcher(explode, batch_size=2, max_delay_s=0.01, capacity=16).start()
    first = batcher.submit([1, 2])
    with pytest.raises(RuntimeError, match="device lost"):
        first[0].result(timeout=5)
    assert batcher.submit([5])[0].result(timeout=5) == 5, "the worker survives a failing batch"
    batcher.close()


def test_queue_is_bounded_and_all_or_nothing():
    hold = threading.Event()
    step = Recorder(hold)
    batcher = Batcher(step, batch_size=2, max_delay_s=0.0, capacity=4).start()
    running = batcher.submit([1, 2])  # taken by the worker, which then blocks in the step
    deadline = time.monotonic() + 5
    while batcher.depth and time.monotonic() < deadline:
        time.sleep(0.005)
    queued = batcher.submit([3, 4, 5])
    with pytest.raises(QueueFullError, match="holds 3 of 4 items and cannot take 2 more"):
        batcher.submit([6, 7])
    assert batcher.depth == 3, "a refused request queues nothing"
    batcher.submit([8])
    hold.set()
    assert [f.result(timeout=5) for f in running + queued] == [1, 4, 9, 16, 25]
    batcher.close()


def test_cancelled_items_leave_the_queue_and_never_run():
    hold = threading.Event()
    step = Recorder(hold)
    batcher = Batcher(step, batch_size=1, max_delay_s=0.0, capacity=8).start()
    busy = batcher.submit([1])
    deadline = time.monotonic() + 5
    while batcher.depth and time.monotonic() < deadline:
        time.sleep(0.005)
    doomed = batcher.submit([2, 3])
    kept = batcher.submit([4])
    assert batcher.cancel(doomed) == 2 and batcher.depth == 1
    hold.set()
    assert busy[0].result(timeout=5) == 1 and kept[0].result(timeout=5) == 16
    with pytest.raises(CancelledError):
        doomed[0].result(timeout=1)
    batcher.close()
    assert [x for b in step.batches for x in b] == [1, 4]


def test_items_of_a_running_batch_that_are_given_up_are_marked_for_the_step():
    hold, seen = threading.Event(), []

    def step(items):
        hold.wait(10)  # the batch has been taken; its callers give up meanwhile
        seen.append(items.abandoned())
        return [x * 10 for x in items]

    batcher = Batcher(step, batch_size=4, batch_sizes=(1, 2, 4), max_delay_s=0.0, capacity=8).start()
    kept, doomed = batcher.submit([1, 2]), batcher.submit([3, 4])
    _wait_until_taken(batcher)
    assert batcher.cancel(doomed) == 0, "nothing was queued any more: nothing withdrawn"
    hold.set()
    assert [f.result(timeout=5) for f in kept] == [10, 20]
    assert seen == [[False, False, True, True]], "the step learns which items nobody waits for"
    for future in doomed:
        with pytest.raises(CancelledError, match="gave up"):
            future.result(timeout=5)
    batcher.close()


def test_cancel_lets_a_waiting_batch_go_when_the_rest_is_a_batch_size():
    step = Recorder()
    batcher = Batcher(step, batch_size=8, batch_sizes=(1, 2, 4, 8), max_delay_s=5.0, capacity=16).start()
    kept, doomed = batcher.submit([1, 2]), batcher.submit([3])  # 3 items: waits for a fourth
    time.sleep(0.05)
    started = time.monotonic()
    assert batcher.cancel(doomed) == 1
    assert [f.result(timeout=2) for f in kept] == [1, 4]
    assert time.monotonic() - started < 2.0, "2 left, a batch size: it runs without waiting the delay"
    assert step.batches == [[1, 2]]
    batcher.close()


def test_close_drains_or_fails_and_then_refuses():
    step = Recorder()
    batcher = Batcher(step, batch_size=4, max_delay_s=10.0, capacity=8).start()
    pending = batcher.submit([1, 2])
    batcher.close(drain=True, timeout=5)
    assert [f.result(timeout=1) for f in pending] == [1, 4], "drain runs what was queued without the delay"
    with pytest.raises(BatcherClosedError):
        batcher.submit([3])

    hold = threading.Event()
    batcher = Batcher(Recorder(hold), batch_size=1, max_delay_s=0.0, capacity=8).start()
    busy = batcher.submit([1])
    deadline = time.monotonic() + 5
    while batcher.depth and time.monotonic() < deadline:
        time.sleep(0.005)
    dropped = batcher.submit([2])
    closer = threading.Thread(target=batcher.close, kwargs={"drain": False, "timeout": 5})
    closer.start()
    with pytest.raises(BatcherClosedError):
        dropped[0].result(timeout=5)
    hold.set()
    closer.join(5)
    assert busy[0].result(timeout=1) == 1, "the running batch still finishes"


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="batch_size 0"):
        Batcher(Recorder(), batch_size=0, max_delay_s=0.0, capacity=1)
    with pytest.raises(ValueError, match="capacity 0"):
        Batcher(Recorder(), batch_size=1, max_delay_s=0.0, capacity=0)
    with pytest.raises(ValueError, match=r"batch_sizes \[1, 16\] must lie in 1..batch_size \(8\)"):
        Batcher(Recorder(), batch_size=8, batch_sizes=(1, 16), max_delay_s=0.0, capacity=1)
