"""Where each ``next(loader)`` spends its host time (``pipelines/_next_phases.py``): one record per
batch, its parts inside its whole, on every loader kind's iterator, without keeping a pipeline alive."""

from __future__ import annotations

import gc
import sys
import threading
import time
import weakref

import numpy as np
import pytest
from conftest import DEVICES

from gpufeed.config import ImagePipelineConfig, LoaderConfig
from gpufeed.pipelines import NEXT_PHASES, ImageDataset, ImageLoader
from gpufeed.pipelines._next_phases import NextPhases, timed_pipeline

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("device", DEVICES, indirect=True)
@pytest.mark.parametrize("pipelines", [1, 2])
def test_each_batch_closes_one_record_whose_parts_lie_inside_it(synth_dir, device, pipelines):
    dataset = ImageDataset.from_folder(synth_dir / "images" / "train")
    loader = ImageLoader(
        dataset,
        train=True,
        image_cfg=ImagePipelineConfig(size_px=32),
        loader_cfg=LoaderConfig(batch_size=8, num_threads=2, pipelines=pipelines),
        device=device,
    )
    try:
        NEXT_PHASES.take()  # what earlier tests in this process left
        batches = 0
        for _ in loader:
            batches += 1
            records = NEXT_PHASES.take()
            assert len(records) == 1, records  # taken right after its batch, as bench train does
            r = records[0]
            assert set(r) == {
                "dali_outputs", "dali_outputs_cpu", "dali_schedule", "iterator", "loader", "loader_cpu", "copies",
                "loader_own", "held_off",
            }, r  # fmt: skip
            assert all(v >= 0 for v in r.values()), r
            assert r["dali_outputs"] + r["dali_schedule"] <= r["iterator"] <= r["loader"], r
            assert r["dali_outputs"] > 0, r
            # CPU time is the thread's own: never more than the clock's (within the clocks' granularity).
            assert r["dali_outputs_cpu"] <= r["dali_outputs"] + 1e-3 and r["loader_cpu"] <= r["loader"] + 1e-3, r
            assert r["held_off"] <= r["loader"], r
        assert batches == len(loader)
    finally:
        loader.close()


def test_copies_and_loader_own_are_what_is_left_of_the_whole():
    phases = NextPhases()
    phases.add("dali_outputs", 0.002)
    phases.add("dali_schedule", 0.0005)
    phases.add("dali_schedule", 0.0005)
    phases.add("iterator", 0.004)
    phases.finish(0.005)
    phases.finish(0.001)  # a loader without iterator timing: its whole only
    first, second = phases.take()
    assert first["copies"] == pytest.approx(0.001) and first["loader_own"] == pytest.approx(0.001)
    assert second == {"loader": 0.001}
    assert phases.take() == []


def test_held_off_is_the_time_off_the_cpu_outside_dalis_output_wait():
    phases = NextPhases()
    phases.add("dali_outputs", 0.004, cpu_s=0.001)  # 3 ms waiting for the batch: not held off
    phases.add("dali_schedule", 0.001)
    phases.add("iterator", 0.006)
    phases.finish(0.010, loader_cpu_s=0.002)  # 8 ms off the CPU in all
    phases.finish(0.001)  # no CPU time recorded: nothing derived from it
    first, second = phases.take()
    assert first["held_off"] == pytest.approx(0.005)
    assert "held_off" not in second


def test_a_thread_holding_pythons_lock_shows_as_held_off_not_as_cpu(synth_dir):
    """What ``held_off`` is for: the training thread waiting for Python's lock inside ``next()``.

    A thread spinning in pure Python keeps the lock until the interpreter's switch interval makes it
    yield, so each time ``next()`` lets the lock go (DALI's calls do) it waits up to that interval
    to get it back: off the CPU, outside DALI's output wait.
    """
    dataset = ImageDataset.from_folder(synth_dir / "images" / "train")
    loader = ImageLoader(
        dataset, train=True, image_cfg=ImagePipelineConfig(size_px=32), loader_cfg=LoaderConfig(batch_size=8)
    )
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    interval = sys.getswitchinterval()
    try:
        list(loader)  # the pipeline built and its feed running: the epochs below read a warm loader
        NEXT_PHASES.take()
        for _ in range(3):
            list(loader)
        alone = NEXT_PHASES.take()
        sys.setswitchinterval(0.02)  # 20 ms a hand-over: far above anything else next() waits for here
        spinner = threading.Thread(target=spin, daemon=True)
        spinner.start()
        time.sleep(0.05)  # the spinner holds the lock from here on: the loader takes it back only by force
        for _ in range(3):
            list(loader)
        stop.set()
        spinner.join()
        contended = NEXT_PHASES.take()
    finally:
        sys.setswitchinterval(interval)
        stop.set()
        loader.close()
    held_alone = sum(r["held_off"] for r in alone)
    held = sum(r["held_off"] for r in contended)
    # Five forced hand-overs or more in 36 batches; alone, only the cores' sharing keeps it off the CPU.
    assert held >= max(0.1, 2 * held_alone), (held, held_alone)
    assert sum(r["loader_cpu"] for r in contended) < held


def test_a_timed_pipeline_hands_over_the_same_batches_and_dies_with_its_iterator():
    """``DALIGenericIterator`` calls the timed methods itself; the pipeline is freed by reference
    counting alone (no cycle through the timers), as the loaders' sessions rely on."""
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator

    @pipeline_def(batch_size=4, num_threads=1, device_id=None)
    def counting():
        return fn.cast(
            fn.external_source(source=lambda info: np.full(3, info.iteration, np.int32), batch=False), dtype=types.INT64
        )

    def batches(timed: bool) -> tuple[list, weakref.ref]:
        pipe = counting()
        pipe.build()
        if timed:
            timed_pipeline(pipe)
        iterator = DALIGenericIterator(pipe, ["x"], auto_reset=False, prepare_first_batch=False, size=-1)
        got = [next(iterator)[0]["x"].clone() for _ in range(3)]
        return got, weakref.ref(pipe)

    NEXT_PHASES.take()
    plain, _ = batches(False)
    gc.disable()
    try:
        timed, alive = batches(True)
        assert alive() is None, "the timed pipeline outlived its iterator"
    finally:
        gc.enable()
    assert all(a.equal(b) for a, b in zip(plain, timed, strict=True))
    NEXT_PHASES.finish(0.0)
    (record,) = NEXT_PHASES.take()
    assert record["dali_outputs"] > 0 and record["dali_schedule"] > 0, record


def test_host_outputs_time_their_dali_calls():
    """The CPU clip loaders' iterator calls DALI itself: its calls land in the same phases."""
    from nvidia.dali import fn, pipeline_def, types

    from gpufeed.pipelines._pipeline_session import HostOutputs

    @pipeline_def(batch_size=4, num_threads=1, device_id=None, exec_dynamic=True)
    def counting():
        return fn.cast(
            fn.external_source(source=lambda info: np.full(3, info.iteration, np.int32), batch=False), dtype=types.INT64
        )

    pipe = counting()
    pipe.build()
    NEXT_PHASES.take()
    outputs = HostOutputs(pipe, ["x"])
    assert [int(next(outputs)[0]["x"][0, 0]) for _ in range(2)] == [0, 1]
    NEXT_PHASES.finish(0.0)
    (record,) = NEXT_PHASES.take()
    assert record["dali_outputs"] > 0 and record["dali_schedule"] > 0, record
