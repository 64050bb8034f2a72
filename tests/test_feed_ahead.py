"""The image feed's own thread: same inputs in the same order, off the training thread, and gone when closed."""

from __future__ import annotations

import gc
import threading
import time

import numpy as np
import pytest
from conftest import DEVICES

from gpufeed.config import ImagePipelineConfig, LoaderConfig
from gpufeed.pipelines import ImageDataset, ImageLoader
from gpufeed.pipelines._ahead import Ahead

pytestmark = pytest.mark.timeout(300)


class _Counter:
    def __init__(self, fail_at: int | None = None) -> None:
        self.calls, self.fail_at = 0, fail_at

    def produce(self) -> int:
        k = self.calls
        self.calls += 1
        if k == self.fail_at:
            raise ValueError(f"batch {k} is bad")
        return k


def _feed_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("gpufeed-") and "feed" in t.name]


def _loader(synth_dir, device=None) -> ImageLoader:
    """A training loader over the synthetic images, batches of 8 at 32 px."""
    return ImageLoader(
        ImageDataset.from_folder(synth_dir / "images" / "train"),
        train=True,
        image_cfg=ImagePipelineConfig(size_px=32),
        loader_cfg=LoaderConfig(batch_size=8, num_threads=2),
        device=device,
        seed=3,
    )


def _ended(thread: threading.Thread, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    return not thread.is_alive()


def test_results_come_in_order_and_an_error_in_its_turn():
    counter = _Counter(fail_at=5)
    ahead = Ahead(counter.produce, depth=2, name="gpufeed-test-feed")
    assert [ahead.take() for _ in range(5)] == [0, 1, 2, 3, 4]
    for _ in range(2):  # raised where the direct call would have raised, and again after
        with pytest.raises(ValueError, match="batch 5 is bad"):
            ahead.take()
    assert _ended(ahead._thread) and counter.calls == 6  # it stopped at the error
    ahead.close()


def test_it_prepares_at_most_its_depth_ahead():
    counter = _Counter()
    ahead = Ahead(counter.produce, depth=3, name="gpufeed-test-feed")
    assert ahead.take() == 0
    time.sleep(0.5)  # ample time to run further ahead than it may
    # 1 taken, 3 queued, and one more made that waits for a free slot.
    assert counter.calls == 1 + 3 + 1
    ahead.close()
    assert not ahead._thread.is_alive()
    with pytest.raises(RuntimeError, match="closed"):
        ahead.take()


def test_a_feed_dropped_without_close_ends_its_thread():
    counter = _Counter()
    ahead = Ahead(counter.produce, depth=1, name="gpufeed-test-feed")
    thread = ahead._thread
    del counter, ahead
    gc.collect()
    assert _ended(thread)


def test_a_take_waiting_when_the_feed_is_closed_raises_instead_of_waiting_for_ever():
    release = threading.Event()

    def slow() -> int:
        release.wait(30)
        return 1

    ahead = Ahead(slow, depth=1, name="gpufeed-test-feed")
    raised: list[BaseException] = []

    def take() -> None:
        try:
            ahead.take()
        except RuntimeError as err:
            raised.append(err)

    taker = threading.Thread(target=take, daemon=True)
    taker.start()
    time.sleep(0.3)  # the taker is waiting on an empty queue
    ahead.close(timeout_s=0.1)
    assert _ended(taker, within_s=5.0), "take() still waits after close()"
    assert "closed" in str(raised[0])
    release.set()
    assert _ended(ahead._thread)


def test_a_take_after_the_thread_ended_without_a_result_raises():
    ahead = Ahead(_Counter().produce, depth=1, name="gpufeed-test-feed")
    assert ahead.take() == 0
    ahead._closed.set()  # the thread stops as if its owner were gone; nothing more is handed over
    assert _ended(ahead._thread)
    ahead._closed.clear()
    while not ahead._queue.empty():
        ahead._queue.get_nowait()
    with pytest.raises(RuntimeError, match="ended without a result"):
        ahead.take()


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_the_loader_prepares_batches_on_the_feed_thread_and_stops_it(synth_dir, device):
    before = set(_feed_threads())
    loader = _loader(synth_dir, device)
    crops, threads = loader.crops, []

    def recorded(ids, epoch):
        threads.append(threading.current_thread().name)
        return crops(ids, epoch)

    loader.crops = recorded
    seen = [batch.sample_ids.tolist() for batch in loader]
    flat = np.concatenate(seen).tolist()
    assert len(seen) == len(loader) and len(set(flat)) == len(flat)
    # Every batch's windows were made off the training thread; a few more were made ahead.
    assert set(threads) == {"gpufeed-image-feed"} and len(threads) >= len(seen)
    feed_threads = [t for t in _feed_threads() if t.name == "gpufeed-image-feed" and t not in before]
    assert len(feed_threads) == 1
    loader.close()
    assert all(_ended(t) for t in feed_threads)


def test_the_feed_thread_hands_over_tensor_lists_equal_to_the_arrays(synth_dir):
    # DALI's own conversion of arrays would otherwise run on the training thread, batch by batch.
    from nvidia.dali.backend import TensorListCPU

    from gpufeed.pipelines._epochs import PlanStream
    from gpufeed.pipelines._image_pipeline import ImageFeed

    loader = _loader(synth_dir)

    def feed(ahead_batches: int) -> ImageFeed:
        stream = PlanStream(loader._spec(), 0, 0)
        return ImageFeed(stream, loader._path_table, loader._labels, loader.crops, seed=3, ahead_batches=ahead_batches)

    ahead, inline = feed(2), feed(0)
    try:
        for _ in range(3):
            handed, arrays = ahead(), inline()
            assert all(isinstance(out, TensorListCPU) for out in handed)
            assert not any(isinstance(out, TensorListCPU) for out in arrays)
            assert len(handed) == len(arrays) == 7
            for out, array in zip(handed, arrays, strict=True):
                assert np.array_equal(out.as_array(), array)
    finally:
        ahead.close()
        loader.close()


def test_without_a_feed_thread_the_loader_hands_over_the_same_batches_from_its_own_thread(synth_dir):
    """``loader.feed_thread: false``: the inputs are made inside ``next()``, and the batches are the same."""

    def epochs(feed_thread: bool) -> tuple[list, set[str]]:
        loader = ImageLoader(
            ImageDataset.from_folder(synth_dir / "images" / "train"),
            train=True,
            image_cfg=ImagePipelineConfig(size_px=32),
            loader_cfg=LoaderConfig(batch_size=8, num_threads=2, feed_thread=feed_thread),
            seed=3,
        )
        crops, threads = loader.crops, set()

        def recorded(ids, epoch):
            threads.add(threading.current_thread().name)
            return crops(ids, epoch)

        loader.crops = recorded
        try:
            got = [(b.sample_ids.tolist(), b.images.clone()) for _ in range(2) for b in loader]
        finally:
            loader.close()
        return got, threads

    before = set(_feed_threads())
    inline, inline_threads = epochs(False)
    assert inline_threads == {threading.current_thread().name}
    assert not [t for t in _feed_threads() if t not in before], "no feed thread without one configured"
    ahead, ahead_threads = epochs(True)
    assert ahead_threads == {"gpufeed-image-feed"}
    assert len(inline) == len(ahead) > 0
    for (ids_a, pixels_a), (ids_b, pixels_b) in zip(inline, ahead, strict=True):
        assert ids_a == ids_b and pixels_a.equal(pixels_b)
