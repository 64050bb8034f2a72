"""Interlaced (field-coded) videos are read with PyAV, whose frames are whole, and never by DALI's readers.

DALI 2.4's GPU reader converts the decoded surface once per decoded picture, in its decode callback,
and an h264 field pair (PAFF) is two pictures: a frame may be handed over with one field decoded.
So the index records whether a video is interlaced (the first decoded frame's flag, the stream's
field order where none was decoded), DALI's readers leave such a video to PyAV with the reason
``gpufeed check`` prints, ``video.decoder: dali`` refuses it, and ``gpufeed prepare`` writes it
progressive (the woven frames as PyAV reads them), which DALI's reader then takes.

The media: tagged h264 coded interlaced by x264 (``interlaced=1``, top field first: MBAFF, the only
interlaced coding x264 has) and its progressive twin; an HEVC field stream from x265
(``interlace=tff``: every picture one field, flagged interlaced, the stream's field order unknown).
No encoder here writes PAFF, the case the suspicion is about; the ``gpu`` test records what DALI's
NVDEC reader makes of the MBAFF file.
"""

from __future__ import annotations

import json
import shutil
import warnings
from dataclasses import replace

import numpy as np
import pytest
import torch
from conftest import DEVICES
from videohelp import encode_tagged_video, frame_tags

from gpufeed.config import SizePx
from gpufeed.device import DeviceChoice
from gpufeed.pipelines import (
    DatasetError,
    PrepareOptions,
    VideoDataset,
    VideoFrameReader,
    _video_probe,
    check_path,
    prepare_videos,
)
from gpufeed.pipelines._frame_fit import FrameFitter
from gpufeed.pipelines._nvdec import _reader_problem, choose_decoder
from gpufeed.pipelines._pyav import ClipDecoder, VideoRef
from gpufeed.pipelines._video_probe import probe_video
from gpufeed.synth import TagError, read_tag

av = pytest.importorskip("av")
pytestmark = pytest.mark.timeout(300)

CPU = DeviceChoice("cpu", None, "test")
GPU = DeviceChoice("gpu", 0, "test")
H100 = (9, 0)  # the compute capability the decoder choice is made for (NVDEC takes h264 and hevc there)
FRAMES, WIDTH, HEIGHT = 24, 96, 64
SIZE = SizePx(WIDTH, HEIGHT)
X264 = {"crf": "16", "g": "8", "keyint_min": "8", "sc_threshold": "0"}  # GOP 8: clip reads seek
INTERLACED = {**X264, "x264-params": "interlaced=1:tff=1"}
WHY = "it is interlaced (field-coded): DALI's GPU reader converts each field picture as it decodes it"


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    """``inter.mp4`` (video 3) coded interlaced, ``plain.mp4`` (video 4) its progressive twin."""
    folder = tmp_path_factory.mktemp("interlaced") / "videos"
    encode_tagged_video(folder / "inter.mp4", 3, FRAMES, options=INTERLACED)
    encode_tagged_video(folder / "plain.mp4", 4, FRAMES, options=X264)
    return folder


@pytest.fixture(scope="module")
def hevc_fields(tmp_path_factory):
    """An HEVC field stream, 192x160 (NVDEC takes 144x144 and up): x265 codes each picture as one field."""
    if "libx265" not in av.codecs_available:
        pytest.skip("this PyAV has no libx265 encoder")
    path = tmp_path_factory.mktemp("hevc") / "fields.mp4"
    options = {"x265-params": "interlace=tff:log-level=error"}
    encode_tagged_video(path, 6, FRAMES, codec="libx265", width=192, height=160, options=options, labels=False)
    return path


def _flags(path) -> tuple[set[bool], int, int]:
    """(every frame's interlaced flag, frames decoded, the stream's field order), decoded with PyAV."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        flags = [frame.interlaced_frame for frame in container.decode(stream)]
        return set(flags), len(flags), stream.codec_context.field_order


def _read(reader) -> torch.Tensor:
    """Every frame of a sequential reader, (T, 3, H, W) on the CPU."""
    return torch.cat([part.frames.cpu() for part in reader])


def test_the_probe_records_interlacing(videos, hevc_fields, tmp_path, monkeypatch):
    # The encodes are what they claim: every frame decodes flagged, h264's stream says top field first.
    assert _flags(videos / "inter.mp4") == ({True}, FRAMES, 2)  # AV_FIELD_TT
    assert _flags(videos / "plain.mp4") == ({False}, FRAMES, 1)  # AV_FIELD_PROGRESSIVE
    assert _flags(hevc_fields) == ({True}, FRAMES, 0), "x265's field stream: flagged frames, no field order"
    # FFmpeg's own flags for interlaced coding make x264 code MBAFF too.
    encode_tagged_video(tmp_path / "ildct.mp4", 5, 8, options={**X264, "flags": "+ildct+ilme"}, labels=False)
    assert _flags(tmp_path / "ildct.mp4") == ({True}, 8, 2)

    probed = [probe_video(p) for p in (videos / "inter.mp4", videos / "plain.mp4", hevc_fields, tmp_path / "ildct.mp4")]
    assert [info.interlaced for info in probed] == [True, False, True, True]
    assert all(info.problem is None for info in probed)
    assert [info.num_frames for info in probed[:3]] == [FRAMES] * 3, "a packet a frame, as PyAV decodes them"
    # No frame decoded (over the probe's pixel limit): the stream's field order, which h264 states and
    # x265's HEVC does not, so an HEVC field stream that large reads as progressive.
    monkeypatch.setattr(_video_probe._FirstFrameOrientation, "MAX_PIXELS", WIDTH * HEIGHT - 1)
    assert probe_video(videos / "inter.mp4").interlaced and not probe_video(videos / "plain.mp4").interlaced
    assert not probe_video(hevc_fields).interlaced


def test_an_index_cached_before_interlacing_was_recorded_is_probed_again(videos, tmp_path):
    folder = tmp_path / "videos"  # a copy: the other tests keep the shared folder's cache as it is
    shutil.copytree(videos, folder, ignore=shutil.ignore_patterns(".gpufeed"))
    VideoDataset.from_folder(folder)
    cache = folder / ".gpufeed" / "videos-index.json"
    document = json.loads(cache.read_text())
    for entry in document["entries"].values():  # as the index written before interlacing was recorded
        del entry[2]["interlaced"]
    document["version"] = 8  # that index's version: colour matrix and range, the last fact before
    cache.write_text(json.dumps(document))
    assert [info.interlaced for info in VideoDataset.from_folder(folder).infos] == [True, False]


def test_dali_leaves_an_interlaced_video_to_pyav_and_keeps_its_progressive_twin(videos, hevc_fields):
    inter, plain = str(videos / "inter.mp4"), str(videos / "plain.mp4")
    infos = VideoDataset.from_folder(videos).infos
    choice = choose_decoder("auto", GPU.is_gpu, infos, H100)
    assert choice.source == "pyav" and set(choice.refused) == {inter}, choice.reason
    assert choice.refused[inter].startswith(WHY) and choice.refused[inter].endswith("PyAV returns whole frames")
    assert "DALI's reader cannot take 1 of 2 video(s)" in choice.reason, "not NVDEC's: it decodes fields"
    assert choose_decoder("auto", GPU.is_gpu, [i for i in infos if i.path == plain], H100).source == "dali"
    fields = probe_video(hevc_fields)
    assert choose_decoder("auto", GPU.is_gpu, [fields], H100).refused[str(hevc_fields)].startswith(WHY)
    assert _reader_problem(replace(fields, interlaced=False)) is None, "else NVDEC would take it"
    # Without a GPU too (the reason is DALI's readers', whatever the device), and when DALI is asked for.
    assert choose_decoder("auto", False, infos).refused[inter].startswith(WHY)
    with pytest.raises(DatasetError) as refused:
        choose_decoder("dali", GPU.is_gpu, [i for i in infos if i.path == inter], H100)
    message = str(refused.value)
    assert "\n" not in message and f"e.g. {inter}: {WHY}" in message, message
    assert "'gpufeed prepare' (h264 yuv420p BT.601, upright, progressive)" in message
    with pytest.raises(DatasetError, match="dali cannot decode h264 without a GPU"):  # before any video's facts
        choose_decoder("dali", False, [i for i in infos if i.path == inter])


def test_check_names_the_interlaced_video_and_why(videos):
    report = check_path(videos, progress=False)
    notes = {f.path.rsplit("/", 1)[-1]: f.reason for f in report.findings if f.kind == "decoder"}
    assert set(notes) == {"inter.mp4", "videos"}, notes
    assert notes["inter.mp4"].startswith(f"on a GPU decodes with PyAV, not NVDEC: {WHY}")
    assert notes["inter.mp4"].endswith("'gpufeed prepare' re-encodes it")
    assert notes["videos"].startswith("on a GPU 1 of 2 video(s) decode on NVDEC")
    assert not [f for f in report.findings if f.kind == "video"], "every frame decodes: not damaged"


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_pyav_reads_whole_frames_in_order(videos, device):
    reader = VideoFrameReader(videos / "inter.mp4", size_px=SIZE, chunk_frames=10, device=device)
    assert reader.source == "pyav", reader.decoder_reason
    frames = _read(reader)
    assert frames.shape == (FRAMES, 3, HEIGHT, WIDTH), "whole frames, not fields of half the height"
    assert frame_tags(frames, "TCHW") == [(i, 3) for i in range(FRAMES)]


def test_pyav_clip_reads_seek_to_whole_frames(videos):
    """The keyframe-seek clip reader (PyAV's clip source) lands on the right frames from any start."""
    ref = VideoRef.from_info(probe_video(videos / "inter.mp4"))
    decoder = ClipDecoder(fitter=FrameFitter(SIZE))
    try:
        for start in (13, 2, 19, 8, 0, 16):  # backwards too: every one seeks or decodes on
            clip = decoder.read(ref, np.arange(start, start + 5))
            assert clip.shape == (5, HEIGHT, WIDTH, 3)
            assert [read_tag(frame).ident for frame in clip] == list(range(start, start + 5)), start
    finally:
        decoder.close()


def test_prepare_writes_progressive_video_that_dali_takes(videos, tmp_path, monkeypatch):
    report = prepare_videos(videos, tmp_path, PrepareOptions(probe_clips=0), False)
    assert report.ok, report.table()
    copy = tmp_path / "inter.mp4"
    assert _flags(copy) == ({False}, FRAMES, 1), "x264 codes progressive frames unless told otherwise"
    info = probe_video(copy)
    assert not info.interlaced and _reader_problem(info) is None
    assert choose_decoder("auto", GPU.is_gpu, VideoDataset.from_folder(tmp_path).infos, H100).source == "dali"
    prepared = _read(VideoFrameReader(copy, size_px=SIZE, chunk_frames=FRAMES, device=CPU, decoder="pyav"))
    assert frame_tags(prepared, "TCHW") == [(i, 3) for i in range(FRAMES)], "the frames PyAV read, one for one"
    monkeypatch.setattr(_video_probe._FirstFrameOrientation, "MAX_PIXELS", WIDTH * HEIGHT - 1)
    assert not probe_video(copy).interlaced, "the stream says progressive too"


def _tags_or_none(frames: torch.Tensor) -> list[int | None]:
    """Each (3, H, W) frame's frame index, ``None`` where its tag does not read (a frame half decoded)."""
    found: list[int | None] = []
    for frame in frames:
        try:
            found.append(read_tag(frame, "CHW").ident)
        except TagError:
            found.append(None)
    return found


@pytest.mark.gpu
def test_on_a_gpu_the_loader_reads_pyavs_frames_and_dalis_own_read_is_recorded(videos, record_property):
    """``auto`` must read PyAV's frames; what DALI's NVDEC reader makes of the same file is recorded.

    DALI's reader is told the file is progressive (the index's fact hidden) and its read is reported
    as the ``dali_on_interlaced`` property (``--junitxml``) and a warning, not asserted: it is the
    suspicion the refusal rests on, for MBAFF; a frame whose tag does not read is one half decoded.
    """
    info = probe_video(videos / "inter.mp4")
    auto = VideoFrameReader(info, size_px=SIZE, chunk_frames=10, device=GPU)
    assert auto.source == "pyav", auto.decoder_reason
    frames = _read(auto)
    reference = _read(VideoFrameReader(info, size_px=SIZE, chunk_frames=10, device=CPU, decoder="pyav"))
    assert frame_tags(frames, "TCHW") == [(i, 3) for i in range(FRAMES)]
    assert int((frames.int() - reference.int()).abs().max()) <= 2, "the GPU's copy of PyAV's frames"
    try:
        dali = _read(VideoFrameReader(replace(info, interlaced=False), size_px=SIZE, device=GPU, decoder="dali"))
    except Exception as err:  # DALI and its pipelines raise several types; a failure is the finding
        outcome = f"failed: {type(err).__name__}: {err}"
    else:
        tags = _tags_or_none(dali)
        same = dali.shape == reference.shape and tags == list(range(FRAMES))
        levels = int((dali.int() - reference.int()).abs().max()) if dali.shape == reference.shape else -1
        outcome = (
            f"{'as PyAV' if same else 'NOT as PyAV'}: {len(dali)} frames of {FRAMES}, shape {tuple(dali.shape[1:])}, "
            f"tags {tags}, most {levels} levels from PyAV's"
        )
    record_property("dali_on_interlaced", outcome)
    warnings.warn(f"DALI's NVDEC reader on interlaced (MBAFF) h264 {info.path}: {outcome}", stacklevel=1)
