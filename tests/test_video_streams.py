"""Files with more than one video stream: gpufeed reads the one players and DALI pick, never a cover picture.

An MKV whose thumbnail is written before the video lists the still first; an audio file with album
art holds a one-frame "video" stream. The tagged video's frames prove which stream was read.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch
from videohelp import frame_tags

from gpufeed.config import SizePx
from gpufeed.device import DeviceChoice
from gpufeed.pipelines import PrepareOptions, VideoFrameReader, prepare_videos
from gpufeed.pipelines._nvdec import choose_decoder
from gpufeed.pipelines._video_probe import probe_video
from gpufeed.synth import behaviour_labels, render_frame
from gpufeed.synth._videos import write_label_csv

av = pytest.importorskip("av")
pytestmark = pytest.mark.timeout(300)

CPU = DeviceChoice("cpu", None, "test")
FRAMES = 20


def _still(container, attached: bool) -> list:
    """Add a one-frame MJPEG stream (a thumbnail); its packets, to mux once every stream is added."""
    still = container.add_stream("mjpeg", rate=Fraction(1, 1))
    still.width, still.height, still.pix_fmt = 32, 32, "yuvj420p"
    if attached:
        still.disposition = av.stream.Disposition.attached_pic
    frame = av.VideoFrame.from_ndarray(np.full((32, 32, 3), 200, np.uint8), format="rgb24")
    frame.pts = 0
    return [*still.encode(frame), *still.encode()]


@pytest.fixture(scope="module")
def thumbnailed(tmp_path_factory):
    """An MKV: a one-frame thumbnail stream first, then a tagged 64x48 h264 video of FRAMES frames."""
    path = tmp_path_factory.mktemp("streams") / "thumb.mkv"
    rows = behaviour_labels(FRAMES, seed=3)
    with av.open(str(path), "w") as container:
        thumbnail = _still(container, attached=False)  # Matroska keeps no cover disposition: a plain video
        video = container.add_stream("libx264", rate=Fraction(30, 1))
        video.width, video.height, video.pix_fmt = 64, 48, "yuv420p"
        video.options = {"crf": "12", "g": "8"}
        for packet in thumbnail:
            container.mux(packet)
        for index in range(FRAMES):
            frame = av.VideoFrame.from_ndarray(render_frame(index, 3, rows[index], 64, 48), format="rgb24")
            frame.pts = index
            for packet in video.encode(frame):
                container.mux(packet)
        for packet in video.encode():
            container.mux(packet)
    write_label_csv(path.with_suffix(".csv"), rows)
    return path


def test_the_video_is_read_not_the_thumbnail_listed_before_it(thumbnailed, tmp_path):
    with av.open(str(thumbnailed)) as container:
        assert container.streams.video[0].codec_context.name == "mjpeg", "the still is listed first"
    info = probe_video(thumbnailed)
    assert (info.codec, info.width, info.height, info.num_frames, info.video_streams) == ("h264", 64, 48, FRAMES, 2)
    assert info.problem is None

    frames = torch.cat([p.frames for p in VideoFrameReader(thumbnailed, size_px=SizePx(64, 48), device=CPU)])
    assert frame_tags(frames, "TCHW") == [(i, 3) for i in range(FRAMES)]

    choice = choose_decoder("auto", True, [info])
    assert choice.source == "pyav" and "2 video streams" in choice.refused[info.path]

    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "thumb.mkv").write_bytes(thumbnailed.read_bytes())
    (folder / "thumb.csv").write_bytes(thumbnailed.with_suffix(".csv").read_bytes())
    report = prepare_videos(folder, tmp_path / "out", PrepareOptions(probe_clips=0), False)
    assert report.ok, report.table()
    prepared = probe_video(tmp_path / "out" / "thumb.mp4")
    assert (prepared.video_streams, prepared.num_frames) == (1, FRAMES)
    assert choose_decoder("auto", True, [prepared]).source == "dali", "one stream: NVDEC may take it"


def test_a_file_holding_only_a_cover_picture_is_no_video(tmp_path):
    path = tmp_path / "song.mp4"
    with av.open(str(path), "w") as container:
        sound = container.add_stream("aac", rate=16000)
        cover = _still(container, attached=True)
        chunk = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
        chunk.sample_rate, chunk.pts = 16000, 0
        for packet in [*cover, *sound.encode(chunk), *sound.encode()]:
            container.mux(packet)
    assert probe_video(path).problem == "no video stream in the file (a cover picture only)"
