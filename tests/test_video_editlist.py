"""A video trimmed without re-encoding: an edit list hides the frames before the cut, as every player does.

Cutting a recording with ``ffmpeg -ss ... -c copy`` (or a phone's trim) keeps the GOP the cut falls
in and writes an MP4 edit list saying where showing starts; FFmpeg's demuxer marks the packets
before it as discarded and its decoders drop their frames. Before, the index counted those packets
as frames, so the sequential reader stopped with "decoded 47 frames but the index lists 62" and
every frame index after the cut pointed at the wrong frame. Here a tagged video's timestamps are
shifted back by ``HIDDEN`` frames on remuxing, which makes the MP4 muxer write such an edit list.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import DEVICES
from videohelp import cpu_clip_loader, encode_tagged_video, frame_tags

from gpufeed.config import SizePx
from gpufeed.device import DeviceChoice
from gpufeed.pipelines import VideoFrameReader
from gpufeed.pipelines._nvdec import choose_decoder
from gpufeed.pipelines._orientation import Orientation
from gpufeed.pipelines._video_probe import probe_video
from gpufeed.synth import behaviour_labels
from gpufeed.synth._videos import write_label_csv

av = pytest.importorskip("av")
pytestmark = pytest.mark.timeout(300)

CPU = DeviceChoice("cpu", None, "test")
FRAMES, HIDDEN = 40, 6


def _cut(whole, path) -> None:
    """Remux ``whole`` to ``path`` with every timestamp HIDDEN frames earlier: the muxer writes an edit list."""
    with av.open(str(whole)) as source, av.open(str(path), "w") as out:
        stream_in = source.streams.video[0]
        stream = out.add_stream_from_template(stream_in)  # the display matrix comes along
        shift = HIDDEN * round(1 / (stream_in.average_rate * stream_in.time_base))
        for packet in source.demux(stream_in):
            if packet.dts is None:
                continue
            packet.pts, packet.dts, packet.stream = packet.pts - shift, packet.dts - shift, stream
            out.mux(packet)


@pytest.fixture(scope="module")
def trimmed(tmp_path_factory):
    """A tagged 64x48 h264 video (GOP 16, B-frames) whose first HIDDEN frames an edit list hides."""
    folder = tmp_path_factory.mktemp("trimmed")
    whole = folder / "whole.mp4"
    encode_tagged_video(
        whole, 2, FRAMES, width=64, height=48, options={"g": "16", "bf": "2", "crf": "12"}, labels=False
    )
    path = folder / "videos" / "cut.mp4"
    path.parent.mkdir()
    _cut(whole, path)
    write_label_csv(path.with_suffix(".csv"), behaviour_labels(FRAMES - HIDDEN, seed=2))
    return path


def test_the_index_counts_the_frames_shown(trimmed):
    info = probe_video(trimmed)
    assert info.problem is None
    assert (info.num_frames, info.hidden_frames, info.keyframes[0]) == (FRAMES - HIDDEN, HIDDEN, 0)
    choice = choose_decoder("auto", True, [info])
    assert choice.source == "pyav" and f"hides its first {HIDDEN} decoded frame(s)" in choice.refused[info.path]


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_every_frame_shown_is_read_in_order(trimmed, device):
    """On a GPU too the file goes to PyAV: DALI's reader would count the hidden frames."""
    reader = VideoFrameReader(trimmed, size_px=SizePx(64, 48), chunk_frames=7, device=device)
    assert reader.source == "pyav", reader.decoder_reason
    frames = torch.cat([part.frames for part in reader])
    assert frames.device.type == ("cuda" if device.is_gpu else "cpu")
    assert frame_tags(frames, "TCHW") == [(HIDDEN + i, 2) for i in range(FRAMES - HIDDEN)]


@pytest.mark.process
def test_clips_anywhere_read_the_frames_shown(trimmed):
    loader = cpu_clip_loader(trimmed.parent, SizePx(64, 48), 4, train=True, seed=5)
    starts = []
    for epoch in range(3):
        loader.set_epoch(epoch)
        for batch in loader:
            for clip, start in zip(batch.clips, batch.start_frames.tolist(), strict=True):
                assert frame_tags(clip, "CTHW") == [(HIDDEN + start + t, 2) for t in range(4)]
                starts.append(start)
    assert min(starts) < 8 and len(set(starts)) > 10, "clips from the first GOP on, seeks included"
    assert np.all(np.asarray(starts) <= FRAMES - HIDDEN - 4)


def test_a_trimmed_phone_video_is_still_turned(tmp_path):
    """Its first keyframe is hidden, so its decoder drops it: the probe reads the matrix from it again."""
    whole, path = tmp_path / "whole.mp4", tmp_path / "cut.mp4"
    encode_tagged_video(
        whole, 4, 24, width=48, height=64, options={"g": "12"}, labels=False, shown=Orientation(1, False)
    )
    _cut(whole, path)
    info = probe_video(path)
    assert (info.hidden_frames, info.orientation, info.display_size) == (HIDDEN, Orientation(1, False), (48, 64))
    frames = torch.cat([part.frames for part in VideoFrameReader(path, size_px=SizePx(48, 64), device=CPU)])
    assert frame_tags(frames, "TCHW") == [(HIDDEN + i, 4) for i in range(24 - HIDDEN)]
