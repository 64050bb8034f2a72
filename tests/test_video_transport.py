"""MPEG transport streams (.ts, and AVCHD camcorders' .mts/.m2ts): read exactly, though seeks in them land late.

A transport stream has no index: FFmpeg seeks by guessing a byte position from timestamps, and a
seek to a keyframe's timestamp can land a GOP after it, or past the end of the file. gpufeed's
PyAV reads notice (the first frame decoded is after the clip, or there is none) and step back to
the keyframe before, then read from the top; DALI's readers, which trust the seek, leave such files
to PyAV. Every clip here is checked by the frame tags in its pixels.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import DEVICES
from videohelp import cpu_clip_loader, encode_tagged_video, frame_tags

from gpufeed.config import SizePx
from gpufeed.device import DeviceChoice
from gpufeed.pipelines import PrepareOptions, VideoDataset, VideoFrameReader, list_videos, prepare_videos
from gpufeed.pipelines._nvdec import choose_decoder
from gpufeed.pipelines._pyav import ClipDecoder, VideoRef
from gpufeed.pipelines._video_probe import probe_video

pytest.importorskip("av")
pytestmark = pytest.mark.timeout(300)

CPU = DeviceChoice("cpu", None, "test")
FRAMES, GOP = 150, 30


@pytest.fixture(scope="module")
def camcorder(tmp_path_factory):
    """Two tagged 64x48 h264 transport streams (.mts, .ts): GOP 30, B-frames, label files beside them."""
    folder = tmp_path_factory.mktemp("avchd")
    options = {"g": str(GOP), "keyint_min": str(GOP), "sc_threshold": "0", "bf": "3", "crf": "12"}
    for video_id, name in ((0, "00000.mts"), (1, "take.ts")):
        encode_tagged_video(folder / name, video_id, FRAMES, width=64, height=48, options=options)
    return folder


def test_the_index_takes_them_and_dali_leaves_them_to_pyav(camcorder):
    dataset = VideoDataset.from_folder(camcorder)
    assert len(dataset) == 2 and not dataset.problems
    info = dataset.infos[0]
    assert (info.container, info.num_frames, info.keyframes) == ("mpegts", FRAMES, (0, 30, 60, 90, 120))
    choice = choose_decoder("auto", True, dataset.infos)
    assert choice.source == "pyav" and "MPEG transport stream" in choice.refused[info.path]


def test_a_clip_in_every_gop_reads_exactly_with_a_fresh_decoder(camcorder):
    """Each read seeks (a new decoder every time): the seeks that land late, or past the end, step back."""
    ref = VideoRef.from_info(probe_video(camcorder / "00000.mts"))
    for start in (0, 29, 31, 64, 95, 121, FRAMES - 5):
        decoder = ClipDecoder()
        try:
            frames = np.arange(start, start + 5)
            clip = torch.from_numpy(decoder.read(ref, frames)).permute(0, 3, 1, 2)
        finally:
            decoder.close()
        assert frame_tags(clip, "TCHW") == [(int(f), 0) for f in frames], start


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_every_frame_reads_in_order_on_each_device(camcorder, device):
    """On a GPU too transport streams go to PyAV (the sequential reader), every frame in order."""
    for video_id, name in ((0, "00000.mts"), (1, "take.ts")):
        reader = VideoFrameReader(camcorder / name, size_px=SizePx(64, 48), chunk_frames=64, device=device)
        assert reader.source == "pyav", reader.decoder_reason
        frames = torch.cat([part.frames for part in reader])
        assert frames.device.type == ("cuda" if device.is_gpu else "cpu")
        assert frame_tags(frames, "TCHW") == [(i, video_id) for i in range(FRAMES)], name


@pytest.mark.process
def test_random_clips_read_exactly(camcorder):
    loader = cpu_clip_loader(camcorder, SizePx(64, 48), 5, train=True, batch_size=8, threads=2, seed=1)
    starts = set()
    for epoch in range(2):
        loader.set_epoch(epoch)
        for batch in loader:
            for clip, video, start in zip(
                batch.clips, batch.video_ids.tolist(), batch.start_frames.tolist(), strict=True
            ):
                assert frame_tags(clip, "CTHW") == [(start + t, video) for t in range(5)]
                starts.add(start)
    assert max(starts) >= 4 * GOP, "clips from the last GOP too"


def test_prepare_rewrites_them_as_mp4(camcorder, tmp_path):
    report = prepare_videos(camcorder, tmp_path, PrepareOptions(probe_clips=0), False)
    assert report.ok, report.table()
    prepared = probe_video(tmp_path / "00000.mp4")
    assert prepared.container.startswith("mov,mp4") and prepared.num_frames == FRAMES
    frames = torch.cat(
        [part.frames for part in VideoFrameReader(tmp_path / "00000.mp4", size_px=SizePx(64, 48), device=CPU)]
    )
    assert frame_tags(frames, "TCHW") == [(i, 0) for i in range(FRAMES)]


def test_a_typescript_file_is_not_taken_for_a_transport_stream(camcorder, tmp_path):
    folder = tmp_path / "mixed"
    shutil.copytree(camcorder, folder)
    (folder / "app.ts").write_text("export const frames: number = 150;\n")
    videos, others = list_videos(folder)
    assert sorted(Path(v).name for v in videos) == ["00000.mts", "take.ts"]
    assert str(folder / "app.ts") in others
