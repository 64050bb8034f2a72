"""Clip reads that decode forward: a decoder already before a clip continues instead of seeking back.

``ClipDecoder`` keeps each open file's decoder where the last read left it; the next clip of the
same video in the same GOP is decoded on from there. These tests hold that such a read returns
exactly the frames a cold read (a fresh decoder, keyframe seek) returns, on a long-GOP video
without B-frames and on one with B-frames (frames leave the decoder out of decode order), that it
costs only the frames between the clips, and that the cases where continuing would be wrong or
dearer (a clip before the decoder, one past the next keyframe, the end of the file) seek instead.
"""

from __future__ import annotations

import numpy as np
import pytest
from videohelp import decode_all, encode_tagged_video

from gpufeed.pipelines import VideoDataset
from gpufeed.pipelines._pyav import ClipDecoder, VideoRef, clip_read_order
from gpufeed.synth import read_tag

FRAMES, GOP, LENGTH = 150, 60, 11


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    """Two tagged videos, keyframes every 60 frames: without and with B-frames (x264 bf=3)."""
    root = tmp_path_factory.mktemp("forward")
    gop = {"g": str(GOP), "keyint_min": str(GOP), "sc_threshold": "0"}
    encode_tagged_video(root / "plain.mp4", 0, FRAMES, options={**gop, "bf": "0"})
    encode_tagged_video(root / "bframes.mp4", 1, FRAMES, options={**gop, "bf": "3", "b_pyramid": "normal"})
    dataset = VideoDataset.from_folder(root)
    return {
        name: (VideoRef.from_info(info), decode_all(info.path))
        for name, info in zip(("bframes", "plain"), dataset.infos, strict=True)
    }


def _frames(start: int, stride: int = 1) -> np.ndarray:
    return start + np.arange(LENGTH) * stride


def _cold(ref: VideoRef, frames: np.ndarray) -> np.ndarray:
    decoder = ClipDecoder()
    try:
        return decoder.read(ref, frames)
    finally:
        decoder.close()


@pytest.mark.parametrize("name", ["plain", "bframes"])
@pytest.mark.parametrize(("first", "second", "stride"), [(2, 20, 1), (5, 16, 1), (0, 40, 2), (61, 100, 1), (30, 45, 1)])
def test_a_clip_after_an_earlier_one_in_the_same_gop_equals_the_clip_read_cold(videos, name, first, second, stride):
    ref, reference = videos[name]
    decoder = ClipDecoder()
    decoder.read(ref, _frames(first, stride))
    before = decoder.frames_decoded
    clip = decoder.read(ref, _frames(second, stride))
    assert (decoder.seek_reads, decoder.forward_reads) == (1, 1), "the second clip continues from the first"
    assert np.array_equal(clip, _cold(ref, _frames(second, stride)))
    assert all(np.array_equal(clip[t], reference[f]) for t, f in enumerate(_frames(second, stride)))
    assert [read_tag(frame, "HWC").ident for frame in clip] == _frames(second, stride).tolist()
    if name == "plain":  # no reordering: exactly the frames from the first clip's end to the second's
        assert decoder.frames_decoded - before == _frames(second, stride)[-1] - _frames(first, stride)[-1]
    decoder.close()


@pytest.mark.parametrize("name", ["plain", "bframes"])
@pytest.mark.parametrize(
    ("first", "second", "why"),
    [
        (40, 35, "the decoder is past the clip's first frame"),
        (40, 45, "the clips overlap"),
        (5, 70, "a keyframe (60) lies between: seeking there decodes less"),
        (FRAMES - LENGTH, 10, "the first clip drained the decoder at the end of the file"),
    ],
)
def test_a_clip_the_decoder_cannot_or_should_not_continue_to_seeks(videos, name, first, second, why):
    ref, reference = videos[name]
    decoder = ClipDecoder()
    decoder.read(ref, _frames(first))
    clip = decoder.read(ref, _frames(second))
    assert (decoder.seek_reads, decoder.forward_reads) == (2, 0), why
    assert all(np.array_equal(clip[t], reference[f]) for t, f in enumerate(_frames(second)))
    decoder.close()


@pytest.mark.parametrize("name", ["plain", "bframes"])
def test_random_clips_read_in_batch_order_are_exact_and_cost_less(videos, name):
    """Batches of random clips read as ClipSource reads them (sorted by start): exact, and cheaper than cold."""
    ref, reference = videos[name]
    rng = np.random.default_rng(7)
    decoder, cold_cost = ClipDecoder(), 0
    for _ in range(12):
        starts = rng.integers(0, FRAMES - LENGTH + 1, 8)
        for start in starts[clip_read_order(np.zeros(8, dtype=np.int64), starts, 8)]:
            frames = _frames(int(start))
            clip = decoder.read(ref, frames)
            assert all(np.array_equal(clip[t], reference[f]) for t, f in enumerate(frames)), f"clip at {start}"
            alone = ClipDecoder()
            alone.read(ref, frames)
            cold_cost += alone.frames_decoded
            alone.close()
    assert decoder.forward_reads > 0
    assert decoder.frames_decoded < cold_cost
    decoder.close()


def test_the_read_order_sorts_by_video_then_start_and_keeps_the_padding_rows():
    order = clip_read_order(np.array([2, 0, 2, 0, 1]), np.array([50, 90, 10, 5, 7]), 7)
    assert order.tolist() == [3, 1, 4, 2, 0, 5, 6]
