"""``gpufeed bench clips``' harness, without torchcodec: fair rounds, exactness checks, ratios, targets.

The harness logic runs here in-process on readers made for the test; ``tests/test_bench_clips.py``
runs the real readers (worker processes) and, where torchcodec imports, torchcodec.
"""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from gpufeed.bench._clip_exact import sampler_tag_share, tag_share
from gpufeed.bench._clip_report import summarise
from gpufeed.bench._clip_rounds import RoundTime, interleaved, paired_ratio, timed_round, wait_for_exit
from gpufeed.synth._tags import tag_blocks


class _Reader:
    """A reader whose batches take ``batch_s`` each on a fake clock, and which records being stopped."""

    def __init__(self, batches: int, batch: int = 4) -> None:
        self.batches, self.batch = batches, batch
        self.stopped = False
        self.yielded = 0

    @contextmanager
    def open(self):
        def batches():
            for _ in range(self.batches):
                self.yielded += 1
                yield torch.zeros(self.batch, 3, 2, 8, 8, dtype=torch.uint8)

        try:
            yield batches()
        finally:
            self.stopped = True


def test_a_round_stops_its_reader_at_the_clips_asked_and_waits_for_its_processes():
    reader, calls = _Reader(batches=100), []

    def children():  # the reader's two workers are still there at the first look, gone at the next
        calls.append(1)
        return {1, 2, 3} if len(calls) == 2 else {1}

    times, kept = timed_round(reader.open, 10, children=children)
    assert reader.stopped and reader.yielded == 3, "three batches of 4 reach 10 clips; the reader is closed"
    assert times.clips == 12 and times.warm_clips == 4 and kept == []
    assert len(calls) == 3, "before the round, then until the reader's processes are gone"
    assert 0 < times.first_batch_s <= times.seconds


def test_a_rounds_cpu_runs_from_before_the_reader_opens_to_its_last_clip():
    """Counted at the last clip, not after the reader stops: its workers' decoding past the round is left out."""
    readings = iter([10.0, 12.5, 99.0])
    times, _ = timed_round(_Reader(batches=100).open, 10, children=set, cpu=lambda: next(readings))
    assert times.cpu_s == 2.5 and times.cpu_ms_per_clip == pytest.approx(2500 / 12)
    assert next(readings) == 99.0, "no reading after the last clip"


def test_a_reader_that_keeps_processes_alive_fails_the_round():
    with pytest.raises(RuntimeError, match=r"processes \[7\] a reader started still run 0 s after it was closed"):
        wait_for_exit({1}, timeout_s=0.0, children=lambda: {1, 7})


def test_a_reader_that_runs_dry_is_named():
    with pytest.raises(RuntimeError, match="the reader stopped after 8 of 20 clips"):
        timed_round(_Reader(batches=2).open, 20, children=set)


def test_kept_batches_are_copies():
    reader = _Reader(batches=2)
    _, kept = timed_round(reader.open, 8, keep=True, children=set)
    assert len(kept) == 2 and kept[0].data_ptr() != kept[1].data_ptr()


def test_round_figures_count_start_up_in_the_round_and_leave_the_first_wave_out_of_steady():
    t = RoundTime(clips=100, seconds=5.0, first_batch_s=0.9, warm_s=1.0, warm_clips=8)
    assert t.clips_per_second == 20.0 and t.steady_clips_per_second == 23.0
    assert np.isnan(RoundTime(12, 2.0, 1.0, 2.0, 12).steady_clips_per_second), "nothing after the first wave"


def test_the_first_wave_is_one_batch_per_worker():
    times, _ = timed_round(_Reader(batches=10).open, 40, warm_batches=2, children=set)
    assert (times.clips, times.warm_clips) == (40, 8) and times.first_batch_s <= times.warm_s


def test_rounds_alternate_their_order_and_ratios_pair_rounds():
    jobs = ["a", "b", "c"]
    assert interleaved(jobs, 0) == jobs and interleaved(jobs, 1) == ["c", "b", "a"]
    assert paired_ratio([10, 30, 20], [5, 10, 20]) == 2.0


def _tagged_clip(start: int, video: int, length: int, stride: int) -> np.ndarray:
    """(3, T, 16, 16) frames painted with the tag blocks of frames start, start + stride, ..."""
    clip = np.zeros((3, length, 16, 16), np.uint8)
    for t in range(length):
        blocks = tag_blocks(start + t * stride, video)
        for r in range(2):
            for c in range(2):
                clip[:, t, r * 8 : r * 8 + 8, c * 8 : c * 8 + 8] = np.asarray(blocks[r, c])[:, None, None]
    return clip


def test_exactness_reads_every_frame_tag():
    good, late = _tagged_clip(40, 1, 3, 2), _tagged_clip(41, 1, 3, 2)
    assert tag_share([[good, late]], [(1, 40), (1, 40)], 3, 2) == 0.5
    assert tag_share([[good]], [(0, 40)], 3, 2) == 0.0, "the right frames of another video"
    # The sampler picks its own starts: consecutive by the stride, in the call's video.
    assert sampler_tag_share([[good, late, _tagged_clip(9, 0, 3, 2)]], lambda c: 1, 3, 2) == 2 / 3


def _set(name: str) -> SimpleNamespace:
    """What the report reads of a bench set."""
    info = SimpleNamespace(num_frames=300, gop_frames=250.0)
    return SimpleNamespace(
        name=name,
        dataset=SimpleNamespace(infos=[info], paths=["x"]),
        loader=SimpleNamespace(source="pyav", decoder_reason="test"),
        disk_bytes_per_frame=lambda: 700.0,
    )


def _times(rate: float, cpu_s: float = float("nan")) -> list[RoundTime]:
    return [RoundTime(100, 100 / rate, 0.4, 0.5, 8, cpu_s) for _ in range(3)]


def test_targets_name_torchcodecs_best_seek_mode_and_say_whether_they_are_met():
    times = {
        "long_gop": {
            "gpufeed": _times(60),
            "torchcodec_exact": _times(40),
            "torchcodec_approximate": _times(45),
            "torchcodec_sampler": _times(70),
        },
        "frame_folder": {"gpufeed": _times(130)},
    }
    exact = {"long_gop": {"gpufeed": 1.0}, "frame_folder": {"gpufeed": 1.0}}
    settings = {"clip_length_frames": 11}
    result = summarise(settings, [_set("long_gop"), _set("frame_folder")], times, exact, {})
    assert result["ratios"]["gpufeed / torchcodec_approximate (long_gop)"] == pytest.approx(60 / 45)
    assert not any("CPU" in name for name in result["ratios"]), "no CPU ratio where it was not measured"
    assert result["targets"] == [
        "long_gop: gpufeed / torchcodec's best seek mode (torchcodec_approximate): round 1.33x, steady 1.48x, "
        "target >= 1.2x: met; exact clips 100% / n/a",
        "long_gop: gpufeed / torchcodec's sampler per clip: round 0.86x, steady 0.80x, target >= 1x: NOT met",
        "frame_folder: 2.17x the long-GOP clips/s, target >= 2.0x: met",
        "frame_folder: 1,430 frames/s, target >= 1,200: met",
    ]


def test_cpu_per_clip_is_reported_beside_clips_per_second_and_paired_like_them():
    times = {"prepared": {"gpufeed": _times(200, cpu_s=0.5), "torchcodec_exact": _times(150, cpu_s=0.65)}}
    result = summarise({"clip_length_frames": 11}, [_set("prepared")], times, {"prepared": {}}, {})
    assert result["sets"]["prepared"]["cpu_ms_per_clip"] == {"gpufeed": 5.0, "torchcodec_exact": 6.5}
    assert result["ratios"]["torchcodec_exact / gpufeed, CPU per clip (prepared)"] == pytest.approx(1.3)
