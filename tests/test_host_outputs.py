"""A CPU clip pipeline hands a batch over as soon as its worker processes have decoded it.

``DALIGenericIterator`` schedules the pipeline's next run before it returns a batch, and on a
pipeline fed by worker processes (a parallel ``external_source``, the PyAV and JPEG clip paths on a
CPU) scheduling waits for the workers' next batch: every batch came one worker batch late, the
first one included. :class:`~gpufeed.pipelines._pipeline_session.HostOutputs`, which the clip
loader reads CPU pipelines through, schedules a run when its batch is asked for. Here the workers
decode batch 1 only once a gate file exists, which the test makes after it has batch 0.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from gpufeed.core import SizePx, WorkerCallback
from gpufeed.pipelines._clip_pipeline import FeedInput, build_clip_pipeline
from gpufeed.pipelines._pipeline_session import HostOutputs

pytestmark = [pytest.mark.process, pytest.mark.timeout(120)]

BATCH, LENGTH, SIZE = 2, 3, 8


class _Gated(WorkerCallback):
    """Clip ``(iteration, row)`` filled with the iteration; batches after the first wait for the gate file (at most ``wait_s``)."""

    def __init__(self, gate: str, wait_s: float) -> None:
        self.gate, self.wait_s = gate, wait_s

    def __call__(self, sample_info):
        k, j = int(sample_info.iteration), int(sample_info.idx_in_batch)
        if k >= 1:
            deadline = time.monotonic() + self.wait_s
            while not os.path.exists(self.gate) and time.monotonic() < deadline:
                time.sleep(0.01)
        frames = np.full((LENGTH, SIZE, SIZE, 3), k % 256, dtype=np.uint8)
        return frames, np.array([k * BATCH + j], dtype=np.int64)


def _pipeline(gate, wait_s: float):
    return build_clip_pipeline(
        clip_input=FeedInput(_Gated(str(gate), wait_s), parallel=True, fitted=True),
        clip_length_frames=LENGTH,
        stride_frames=1,
        size_px=SizePx(SIZE, SIZE),
        fit="stretch",
        batch_size=BATCH,
        device_id=None,
        num_threads=2,
        prefetch_queue_depth=2,
        seed=0,
        start_method="fork",
    )


def _first_batch_s(outputs) -> tuple[float, dict]:
    started = time.monotonic()
    batch = next(outputs)[0]
    return time.monotonic() - started, batch


def test_a_batch_comes_before_the_workers_have_decoded_the_next(tmp_path):
    gate = tmp_path / "gate"
    outputs = HostOutputs(_pipeline(gate, wait_s=25), ["clips", "tags"])
    waited_s, first = _first_batch_s(outputs)
    assert waited_s < 12, f"batch 0 took {waited_s:.1f} s: it waited for batch 1, which waits for the gate"
    assert first["tags"].view(-1).tolist() == [0, 1]
    assert tuple(first["clips"].shape) == (BATCH, LENGTH, SIZE, SIZE, 3) and int(first["clips"].max()) == 0
    gate.touch()
    later = [next(outputs)[0] for _ in range(6)]
    assert [b["tags"].view(-1).tolist() for b in later] == [[2 * k, 2 * k + 1] for k in range(1, 7)]
    assert [int(b["clips"].min()) for b in later] == list(range(1, 7))
    assert int(first["clips"].max()) == 0, "a batch the loader holds is not overwritten by later ones"


def test_dalis_iterator_returns_a_batch_only_once_the_next_one_is_decoded(tmp_path):
    """The delay is real: DALI's iterator holds batch 0 until the workers' batch 1 is in."""
    from nvidia.dali.plugin.pytorch import DALIGenericIterator

    pipe = _pipeline(tmp_path / "never", wait_s=3.0)
    outputs = DALIGenericIterator(pipe, ["clips", "tags"], auto_reset=False, prepare_first_batch=False)
    waited_s, first = _first_batch_s(outputs)
    assert waited_s >= 2.9
    assert first["tags"].view(-1).tolist() == [0, 1]
