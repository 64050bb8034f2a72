"""Videos whose display matrix turns or mirrors their frames (a phone held upright) are read as shown.

Players, OpenCV (DeepEthogram's labelling GUI) and FFmpeg's command line show such frames turned;
gpufeed's readers hand them over the same way, DALI's video decoders (which return the stored
frames) leave them to PyAV, and ``gpufeed prepare`` writes them upright. The display matrices
are written by PyAV's ``set_display_rotation`` (a counterclockwise turn, then a left-right mirror),
and each test's expectation is built from that rule with numpy alone, or from tags that only read
in the right orientation.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch
from conftest import DEVICES
from videohelp import clip_loader_on, encode_tagged_video, frame_tags

from gpufeed.config import SizePx
from gpufeed.device import DeviceChoice
from gpufeed.pipelines import (
    DatasetError,
    PrepareOptions,
    VideoDataset,
    VideoFrameReader,
    prepare_videos,
)
from gpufeed.pipelines._frame_fit import FrameFitter
from gpufeed.pipelines._nvdec import choose_decoder
from gpufeed.pipelines._orientation import UPRIGHT, Orientation
from gpufeed.pipelines._video_probe import VideoInfo, probe_video

av = pytest.importorskip("av")
pytestmark = pytest.mark.timeout(300)

CPU = DeviceChoice("cpu", None, "test")
EIGHT = [Orientation(turns, mirrored) for turns in range(4) for mirrored in (False, True)]
FRAMES = 24


def _one_frame_video(path, stored: np.ndarray, degrees: int, hflip: bool) -> None:
    """A lossless 4:4:4 h264 file of one frame, ``stored``, with a display matrix."""
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=Fraction(30, 1))
        stream.height, stream.width = stored.shape[:2]
        stream.pix_fmt, stream.options = "yuv444p", {"qp": "0"}
        stream.set_display_rotation(degrees, hflip=hflip)
        frame = av.VideoFrame.from_ndarray(stored, format="rgb24")
        frame.pts = 0
        for packet in stream.encode(frame):
            container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


@pytest.mark.parametrize("degrees", [0, 90, 180, 270, -90])
@pytest.mark.parametrize("hflip", [False, True])
def test_each_display_matrix_gives_the_frame_as_shown(tmp_path, degrees, hflip):
    rng = np.random.default_rng(degrees % 360 + hflip)
    stored = rng.integers(0, 256, (6, 10, 3), dtype=np.uint8)  # no symmetry: every move shows
    stored = np.repeat(np.repeat(stored, 8, axis=0), 8, axis=1)  # 48x80, flat 8x8 blocks
    path, plain = tmp_path / "one.mp4", tmp_path / "plain.mp4"
    _one_frame_video(path, stored, degrees, hflip)
    _one_frame_video(plain, stored, 0, False)  # the same stored frame, no display matrix
    with av.open(str(plain)) as container:
        as_stored = FrameFitter()(next(container.decode(video=0)))
    expected = np.rot90(as_stored, degrees // 90)  # counterclockwise, then the mirror
    expected = expected[:, ::-1] if hflip else expected

    with av.open(str(path)) as container:
        shown = FrameFitter()(next(container.decode(video=0)))
    assert np.array_equal(shown, expected)

    info = probe_video(path)
    assert (info.width, info.height) == (80, 48), "the stored size"
    assert info.display_size == expected.shape[1::-1]
    assert (info.rotation_degrees, info.mirrored) == (degrees % 360, hflip)


@pytest.fixture(scope="module")
def phone(tmp_path_factory):
    """Two tagged portrait videos as a phone stores them: turned 90 degrees, and 270 mirrored."""
    folder = tmp_path_factory.mktemp("phone")
    options = {"crf": "12", "g": "8", "bf": "2"}
    for video_id, shown in ((0, Orientation(1, False)), (1, Orientation(3, True))):
        encode_tagged_video(
            folder / f"v{video_id}.mp4", video_id, FRAMES, width=64, height=96, options=options, shown=shown
        )
    return folder


def test_the_index_knows_the_turn_and_dali_leaves_them_to_pyav(phone):
    dataset = VideoDataset.from_folder(phone)
    turned = dataset.infos[0]
    assert (turned.width, turned.height, turned.display_size) == (96, 64, (64, 96))
    assert turned.orientation == Orientation(1, False) and dataset.infos[1].orientation == Orientation(3, True)

    choice = choose_decoder("auto", True, dataset.infos)
    assert choice.source == "pyav"
    assert "turned 90 degrees counterclockwise" in choice.refused[turned.path]
    assert "mirrored left-right" in choice.refused[dataset.infos[1].path]
    vp9 = VideoInfo("turned.webm", codec="vp9", width=96, height=64, num_frames=10, rotation_degrees=270)
    with pytest.raises(
        DatasetError, match=r"dali, but DALI's reader cannot take 1 video\(s\), e\.g\. turned\.webm: .*turned 270"
    ):
        choose_decoder("dali", False, [vp9])
    assert choose_decoder("dali", False, [VideoInfo("plain.webm", codec="vp9")]).source == "dali"


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_every_frame_reads_as_shown_in_order(phone, device):
    for video_id in (0, 1):
        reader = VideoFrameReader(phone / f"v{video_id}.mp4", size_px=SizePx(64, 96), chunk_frames=10, device=device)
        assert reader.source == "pyav", "NVDEC and DALI's CPU decoder return the stored frames"
        seen = []
        for part in reader:
            assert part.frames.shape[1:] == (3, 96, 64)
            assert frame_tags(part.frames, "TCHW") == [(i, video_id) for i in part.frame_indices.tolist()]
            seen += part.frame_indices.tolist()
        assert seen == list(range(FRAMES))


@pytest.mark.process  # the PyAV worker processes
@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_clips_read_as_shown(phone, device):
    """On a GPU too the clip loader reads them with PyAV's workers, and hands the clips over on the device."""
    loader = clip_loader_on(device, phone, SizePx(64, 96), 5, train=False)
    try:
        assert loader.source == "pyav", loader.decoder_reason
        assert not device.is_gpu or "display matrix" in loader.decoder_reason, loader.decoder_reason
        clips = 0
        for batch in loader:
            assert batch.clips.shape[1:] == (3, 5, 96, 64)
            assert batch.clips.device.type == ("cuda" if device.is_gpu else "cpu")
            for clip, video, start in zip(
                batch.clips, batch.video_ids.tolist(), batch.start_frames.tolist(), strict=True
            ):
                assert frame_tags(clip, "CTHW") == [(start + t, video) for t in range(5)]
                clips += 1
    finally:
        loader.close()  # its PyAV worker processes go now, not whenever the loader is collected
    assert clips > 0


def test_prepare_writes_them_upright(phone, tmp_path):
    report = prepare_videos(phone, tmp_path / "h264", PrepareOptions(probe_clips=0), False)
    assert report.ok, report.table()
    stores = prepare_videos(phone, tmp_path / "folders", PrepareOptions(store="folder", probe_clips=0), False)
    assert stores.ok, stores.table()
    for video_id in (0, 1):
        original = torch.cat(
            [p.frames for p in VideoFrameReader(phone / f"v{video_id}.mp4", size_px=SizePx(64, 96), device=CPU)]
        )
        for copy in (tmp_path / "h264" / f"v{video_id}.mp4", tmp_path / "folders" / f"v{video_id}"):
            info = probe_video(copy)
            assert info.orientation == UPRIGHT and (info.width, info.height) == (64, 96), copy
            frames = torch.cat([p.frames for p in VideoFrameReader(copy, size_px=SizePx(64, 96), device=CPU)])
            assert frame_tags(frames, "TCHW") == [(i, video_id) for i in range(FRAMES)], copy
            assert (frames.int() - original.int()).abs().float().mean() < 3, "a lossy copy of the frames as shown"


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_the_upright_copy_reads_in_order_on_each_device(phone, tmp_path, device):
    """``prepare``'s copy declares no matrix: on a GPU NVDEC reads it (on the CPU PyAV, for h264), tags in order."""
    report = prepare_videos(phone, tmp_path, PrepareOptions(probe_clips=0), False)
    assert report.ok, report.table()
    for video_id in (0, 1):
        copy = tmp_path / f"v{video_id}.mp4"
        reader = VideoFrameReader(copy, size_px=SizePx(64, 96), chunk_frames=10, device=device)
        assert reader.source == ("dali" if device.is_gpu else "pyav"), reader.decoder_reason
        seen = []
        for part in reader:
            assert part.frames.shape[1:] == (3, 96, 64)
            assert part.frames.device.type == ("cuda" if device.is_gpu else "cpu")
            assert frame_tags(part.frames, "TCHW") == [(i, video_id) for i in part.frame_indices.tolist()], copy
            seen += part.frame_indices.tolist()
        assert seen == list(range(FRAMES)), copy


def test_the_probe_decodes_no_frame_over_the_pixel_limit(phone, monkeypatch):
    """A header declaring a huge frame must not make the index (or the server, probing an upload) allocate it."""
    from gpufeed.pipelines import _video_probe

    monkeypatch.setattr(_video_probe._FirstFrameOrientation, "MAX_PIXELS", 96 * 64 - 1)
    assert probe_video(phone / "v0.mp4").orientation == UPRIGHT, "not decoded: shown as stored"
    monkeypatch.setattr(_video_probe._FirstFrameOrientation, "MAX_PIXELS", 96 * 64)
    assert probe_video(phone / "v0.mp4").orientation == Orientation(1, False)
