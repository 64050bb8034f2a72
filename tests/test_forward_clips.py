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


@pytest.mark.parametrize("name", ["plain", "bframes"])
@pytest.mark.parametrize(("later", "earlier", "stride"), [(40, 10, 1), (100, 64, 1), (45, 36, 1), (50, 0, 2)])
def test_frames_a_later_clip_reads_are_kept_on_the_way_and_serve_it_exactly(videos, name, later, earlier, stride):
    """A read told of a later clip keeps its frames when it decodes them all; that clip is then read without decoding."""
    ref, reference = videos[name]
    decoder = ClipDecoder()
    first = decoder.read(ref, _frames(later, stride), np.array([earlier]))
    assert np.array_equal(first, _cold(ref, _frames(later, stride))), "keeping frames does not change the read"
    decoded = decoder.frames_decoded
    clip = decoder.read(ref, _frames(earlier, stride))
    assert decoder.kept_reads == 1 and decoder.frames_decoded == decoded, "served from the kept frames"
    assert np.array_equal(clip, _cold(ref, _frames(earlier, stride)))
    assert all(np.array_equal(clip[t], reference[f]) for t, f in enumerate(_frames(earlier, stride)))
    assert [read_tag(frame, "HWC").ident for frame in clip] == _frames(earlier, stride).tolist()
    decoder.close()


def test_a_clip_only_partly_kept_is_decoded_and_retain_drops_what_no_later_clip_reads(videos):
    ref, reference = videos["plain"]
    decoder = ClipDecoder()
    decoder.read(ref, _frames(20), np.array([15]))  # frames 0..30 pass by; the clip 15..25 is kept
    clip = decoder.read(ref, _frames(10))  # 10..14 were never decoded: a seek, not the kept frames
    assert decoder.kept_reads == 0 and decoder.seek_reads == 2
    assert all(np.array_equal(clip[t], reference[f]) for t, f in enumerate(_frames(10)))
    decoder.retain({ref.path: frozenset(range(0, 15))})  # no later clip reads 15..25 any more
    before = decoder.seek_reads
    clip = decoder.read(ref, _frames(15))
    assert decoder.kept_reads == 0 and decoder.seek_reads == before + 1, "dropped frames are decoded again"
    assert all(np.array_equal(clip[t], reference[f]) for t, f in enumerate(_frames(15)))
    decoder.close()


@pytest.mark.parametrize("name", ["plain", "bframes"])
def test_a_later_clip_the_read_decodes_only_in_part_is_not_kept(videos, name):
    ref, reference = videos[name]
    decoder = ClipDecoder()
    decoder.read(ref, _frames(70), np.array([55, 62]))  # from keyframe 60: 55..65 in part, 62..72 whole
    decoder.read(ref, _frames(62))
    assert decoder.kept_reads == 1, "the whole clip is kept"
    clip = decoder.read(ref, _frames(55))
    assert decoder.kept_reads == 1, "the clip from before the keyframe is decoded"
    assert all(np.array_equal(clip[t], reference[f]) for t, f in enumerate(_frames(55)))
    decoder.close()


def test_starts_ahead_names_the_clips_of_the_next_batches_and_the_look_ahead_fits_its_memory():
    from gpufeed.core import SizePx
    from gpufeed.pipelines._clip_plan import PlanRows
    from gpufeed.pipelines._clip_read_plan import ahead_batches, starts_ahead

    class Plan:  # the one member starts_ahead reads of a ClipPlan
        def __getitem__(self, k):
            return PlanRows(k, 0, np.array([k % 2, 1, 1]), np.array([10 * k, 0, 5]), 2)  # the third row fills

    found = starts_ahead(Plan(), 2, 2)
    assert {v: s.tolist() for v, s in found.items()} == {0: [20], 1: [0, 30]}
    assert starts_ahead(Plan(), 2, 0) == {}
    assert ahead_batches(8, 11, SizePx(112, 112)) == 16
    assert ahead_batches(64, 11, SizePx(224, 224)) == 0  # one batch of frames is over the budget: none kept


@pytest.mark.parametrize("name", ["plain", "bframes"])
def test_a_decoder_a_later_clip_continues_from_stays_there_while_another_clip_of_the_file_seeks(videos, name):
    """A clip elsewhere in the file opens a second decoder instead of moving the one a later clip awaits."""
    ref, reference = videos[name]
    decoder = ClipDecoder()
    decoder.read(ref, _frames(5), awaited=np.array([30, 100]))  # 30 is in the same GOP, after the decoder
    decoder.read(ref, _frames(70), awaited=np.array([30]))  # another GOP: seeks with a second decoder
    assert (decoder.seek_reads, decoder.decoders_opened) == (2, 2)
    before = decoder.frames_decoded
    clip = decoder.read(ref, _frames(30))
    assert (decoder.seek_reads, decoder.forward_reads) == (2, 1), "decoded on from the first decoder"
    if name == "plain":  # no reordering: only the frames after the first clip's end
        assert decoder.frames_decoded - before == _frames(30)[-1] - _frames(5)[-1]
    assert np.array_equal(clip, _cold(ref, _frames(30)))
    assert all(np.array_equal(clip[t], reference[f]) for t, f in enumerate(_frames(30)))
    assert [read_tag(frame, "HWC").ident for frame in clip] == _frames(30).tolist()
    decoder.close()


def test_a_decoder_no_later_clip_awaits_is_the_one_that_seeks_and_the_decoders_fit_their_memory(videos):
    ref, reference = videos["plain"]
    decoder = ClipDecoder()
    decoder.read(ref, _frames(5), awaited=np.array([100]))  # nothing later in this GOP awaits the decoder
    decoder.read(ref, _frames(70))
    assert (decoder.seek_reads, decoder.decoders_opened) == (2, 1), "the one decoder moved"
    decoder.close()
    tight = ClipDecoder(max_open=1, max_bytes=0)  # room for one decoder only: the awaited one moves
    tight.read(ref, _frames(5), awaited=np.array([30]))
    clip = tight.read(ref, _frames(70), awaited=np.array([30]))
    assert (tight.seek_reads, tight.decoders_opened) == (2, 1)
    assert all(np.array_equal(clip[t], reference[f]) for t, f in enumerate(_frames(70)))
    tight.read(ref, _frames(30))
    assert (tight.seek_reads, tight.forward_reads) == (3, 0)
    tight.close()
