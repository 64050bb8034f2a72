"""Files with more than one video stream: gpufeed reads the one players and DALI pick, never a cover picture.

An MKV whose thumbnail is written before the video lists the still first; an audio file with album
art holds a one-frame "video" stream; an MP4's ``covr`` box and an MKV's attached image are cover
pictures beside the video. DALI's reader asks FFmpeg for the best stream before it has counted any
frames, so every such file goes to PyAV, on every device. The tagged video's frames prove which
stream was read.
"""

from __future__ import annotations

import io
from fractions import Fraction

import numpy as np
import pytest
import torch
from conftest import DEVICES
from videohelp import frame_tags

from gpufeed.config import SizePx
from gpufeed.device import DeviceChoice
from gpufeed.pipelines import PrepareOptions, VideoFrameReader, prepare_videos
from gpufeed.pipelines._nvdec import choose_decoder
from gpufeed.pipelines._streams import is_still_picture
from gpufeed.pipelines._video_probe import probe_video
from gpufeed.synth import behaviour_labels, render_frame
from gpufeed.synth._videos import write_label_csv

av = pytest.importorskip("av")
pytestmark = pytest.mark.timeout(300)

CPU = DeviceChoice("cpu", None, "test")
FRAMES = 20
COVERED = ("cover.mp4", "cover.mkv")  # a cover picture as an MP4 covr box, and as an MKV attachment


def _still(container, attached: bool) -> list:
    """Add a one-frame MJPEG stream (a thumbnail); its packets, to mux once every stream is added."""
    still = container.add_stream("mjpeg", rate=Fraction(1, 1))
    still.width, still.height, still.pix_fmt = 32, 32, "yuvj420p"
    if attached:
        still.disposition = av.stream.Disposition.attached_pic
    frame = av.VideoFrame.from_ndarray(np.full((32, 32, 3), 200, np.uint8), format="rgb24")
    frame.pts = 0
    return [*still.encode(frame), *still.encode()]


def _tagged_video(container, path, stills=()) -> None:
    """Add a tagged 64x48 h264 video of FRAMES frames, mux ``stills`` first, then the video; labels beside ``path``."""
    rows = behaviour_labels(FRAMES, seed=3)
    video = container.add_stream("libx264", rate=Fraction(30, 1))
    video.width, video.height, video.pix_fmt = 64, 48, "yuv420p"
    video.options = {"crf": "12", "g": "8"}
    for packet in stills:
        container.mux(packet)
    for index in range(FRAMES):
        frame = av.VideoFrame.from_ndarray(render_frame(index, 3, rows[index], 64, 48), format="rgb24")
        frame.pts = index
        for packet in video.encode(frame):
            container.mux(packet)
    for packet in video.encode():
        container.mux(packet)
    write_label_csv(path.with_suffix(".csv"), rows)


@pytest.fixture(scope="module")
def thumbnailed(tmp_path_factory):
    """An MKV: a one-frame thumbnail stream first, then a tagged 64x48 h264 video of FRAMES frames."""
    path = tmp_path_factory.mktemp("streams") / "thumb.mkv"
    with av.open(str(path), "w") as container:
        thumbnail = _still(container, attached=False)  # Matroska keeps no cover disposition: a plain video
        _tagged_video(container, path, thumbnail)
    return path


@pytest.fixture(scope="module")
def covered(tmp_path_factory):
    """The tagged video with a cover picture (``attached_pic``), in each of COVERED, one folder apiece."""
    from PIL import Image

    jpeg = io.BytesIO()
    Image.fromarray(np.full((32, 32, 3), 200, np.uint8)).save(jpeg, format="JPEG")
    folder = tmp_path_factory.mktemp("covers")
    for name in COVERED:
        path = folder / name.replace(".", "_") / name
        path.parent.mkdir()
        with av.open(str(path), "w") as container:
            if path.suffix == ".mkv":  # Matroska keeps a cover as an attached image file
                container.add_attachment("cover.jpg", "image/jpeg", jpeg.getvalue())
                _tagged_video(container, path)
            else:  # the MP4 muxer writes an attached_pic stream as the covr box
                _tagged_video(container, path, _still(container, attached=True))
    return folder


def test_the_video_is_read_not_the_thumbnail_listed_before_it(thumbnailed, tmp_path):
    with av.open(str(thumbnailed)) as container:
        assert container.streams.video[0].codec_context.name == "mjpeg", "the still is listed first"
    info = probe_video(thumbnailed)
    assert (info.codec, info.width, info.height, info.num_frames, info.video_streams) == ("h264", 64, 48, FRAMES, 2)
    assert info.problem is None and info.still_pictures == 0, "no cover disposition: a second video stream"

    frames = torch.cat([p.frames for p in VideoFrameReader(thumbnailed, size_px=SizePx(64, 48), device=CPU)])
    assert frame_tags(frames, "TCHW") == [(i, 3) for i in range(FRAMES)]

    choice = choose_decoder("auto", True, [info])
    assert choice.source == "pyav" and choice.refused[info.path].startswith("2 video streams: ")
    assert "DALI's reader cannot take 1 of 1" in choice.reason, "not a codec NVDEC lacks"

    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "thumb.mkv").write_bytes(thumbnailed.read_bytes())
    (folder / "thumb.csv").write_bytes(thumbnailed.with_suffix(".csv").read_bytes())
    report = prepare_videos(folder, tmp_path / "out", PrepareOptions(probe_clips=0), False)
    assert report.ok, report.table()
    prepared = probe_video(tmp_path / "out" / "thumb.mp4")
    assert (prepared.video_streams, prepared.num_frames) == (1, FRAMES)
    assert choose_decoder("auto", True, [prepared]).source == "dali", "one stream: NVDEC may take it"


@pytest.mark.parametrize("name", COVERED)
def test_a_cover_picture_keeps_the_file_from_dali(covered, name, tmp_path):
    """A video and its cover: one video stream counted, yet DALI might open the cover, so PyAV reads it."""
    path = covered / name.replace(".", "_") / name
    with av.open(str(path)) as container:
        kinds = sorted((s.codec_context.name, is_still_picture(s)) for s in container.streams.video)
        assert kinds == [("h264", False), ("mjpeg", True)], "the video, and a cover picture (attached_pic)"
    info = probe_video(path)
    assert info.problem is None
    assert (info.codec, info.num_frames, info.video_streams, info.still_pictures) == ("h264", FRAMES, 1, 1)

    for on_gpu in (True, False):
        choice = choose_decoder("auto", on_gpu, [info])
        assert choice.source == "pyav", on_gpu
        assert choice.refused[info.path] == (
            "a video stream and 1 cover picture(s): gpufeed reads FFmpeg's best (h264 64x48) with PyAV, "
            "where DALI's reader might take another stream or the cover picture"
        )
    assert "DALI's reader cannot take 1 of 1 video(s)" in choose_decoder("auto", True, [info]).reason

    report = prepare_videos(path.parent, tmp_path, PrepareOptions(probe_clips=0), False)
    assert report.ok, report.table()
    prepared = probe_video(tmp_path / path.with_suffix(".mp4").name)
    assert (prepared.video_streams, prepared.still_pictures, prepared.num_frames) == (1, 0, FRAMES)
    assert choose_decoder("auto", True, [prepared]).source == "dali", "the cover is not copied: NVDEC may take it"


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_the_moving_stream_is_read_in_order_on_each_device(thumbnailed, covered, device):
    """On a GPU too such files go to PyAV (the sequential reader), which reads the video's frames, in order."""
    for path in (thumbnailed, *(covered / name.replace(".", "_") / name for name in COVERED)):
        reader = VideoFrameReader(path, size_px=SizePx(64, 48), chunk_frames=7, device=device)
        assert reader.source == "pyav", reader.decoder_reason
        seen = []
        for part in reader:
            assert part.frames.device.type == ("cuda" if device.is_gpu else "cpu")
            assert frame_tags(part.frames, "TCHW") == [(i, 3) for i in part.frame_indices.tolist()], path
            seen += part.frame_indices.tolist()
        assert seen == list(range(FRAMES)), path


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
