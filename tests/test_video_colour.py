"""Videos whose colour matrix is not BT.601 (BT.709: phones, HD cameras) read the same colours on every path.

DALI 2.4's video readers (NVDEC's conversion kernel and the CPU reader alike) turn YUV into RGB
with BT.601 whatever the file says; PyAV converts with the frame's own matrix. So the index records
each video's matrix and range, DALI's readers leave other matrices than BT.601 (or none said) to
PyAV, with the reason ``gpufeed check`` prints, and ``gpufeed prepare`` converts to BT.601 and tags
its output so, after which DALI's reader returns the colours PyAV reads from the original.

The media are lossless VP9 colour bars (DALI's CPU reader reads VP9), one tagged BT.709 and an
untagged twin, and the bars as a full-range MJPEG (a lab camera's). Read as BT.601, the BT.709 bars are up to 22 levels off (measured); after prepare,
DALI's reader is within 2 levels of PyAV's read of the original (measured on VP9 at prepare's crf).
"""

from __future__ import annotations

import json
import shutil
from fractions import Fraction

import numpy as np
import pytest
import torch

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
from gpufeed.pipelines._nvdec import _reader_problem, choose_decoder
from gpufeed.pipelines._video_probe import probe_video
from gpufeed.synth import behaviour_labels
from gpufeed.synth._videos import write_label_csv

av = pytest.importorskip("av")
pytestmark = pytest.mark.timeout(300)

CPU = DeviceChoice("cpu", None, "test")
GPU = DeviceChoice("gpu", 0, "test")
SIZE = 128  # NVDEC's smallest VP9 frame
FRAMES = 12
# Saturated primaries and secondaries, where BT.601 and BT.709 differ most, and a grey, where they agree.
BARS = ((255, 0, 0), (0, 255, 0), (0, 0, 255), (200, 150, 50), (128, 128, 128), (30, 200, 220), (250, 250, 20))
BAR_PX = 16
# The middle of each bar: its edges blur with 4:2:0 chroma, differently in each decoder's upsampling.
FLAT = np.concatenate([np.arange(i * BAR_PX + 4, (i + 1) * BAR_PX - 4) for i in range(len(BARS))])
# Most a flat bar may differ between DALI's reader and PyAV: measured 2 after prepare (VP9 at crf 23,
# h264 at crf 12; x264's crf 23 alone costs up to 4), 22 before.
BOUND = 4
BT709 = 1  # FFmpeg's AVCOL_SPC_BT709 (and AVCOL_PRI_BT709, AVCOL_TRC_BT709)
MPEG = 1  # FFmpeg's AVCOL_RANGE_MPEG: limited ("tv") range


def _write_bars(path, bt709: bool, codec: str = "libvpx-vp9", pix_fmt: str = "yuv420p") -> None:
    """A file of colour bars, lossless VP9 by default: BT.709 limited range and tagged so, or BT.601 and untagged."""
    rgb = np.full((SIZE, SIZE, 3), 64, dtype=np.uint8)
    for i, colour in enumerate(BARS):
        rgb[:, i * BAR_PX : (i + 1) * BAR_PX] = colour
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=Fraction(10, 1))
        stream.width, stream.height, stream.pix_fmt = SIZE, SIZE, pix_fmt
        stream.options = {"lossless": "1"} if codec == "libvpx-vp9" else {}
        if bt709:
            context = stream.codec_context
            context.colorspace, context.color_primaries, context.color_trc = BT709, BT709, BT709
            context.color_range = MPEG
        for index in range(FRAMES):
            frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
            frame = frame.reformat(format=pix_fmt, dst_colorspace="ITU709" if bt709 else "ITU601")
            frame.pts = index
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    write_label_csv(path.with_suffix(".csv"), behaviour_labels(FRAMES, seed=0))


@pytest.fixture(scope="module")
def bars(tmp_path_factory):
    folder = tmp_path_factory.mktemp("colour") / "videos"
    folder.mkdir()
    _write_bars(folder / "bt709.webm", bt709=True)
    _write_bars(folder / "plain.webm", bt709=False)
    return folder


def _frames(path, device, decoder) -> np.ndarray:
    """Every frame of ``path`` as (T, H, W, 3) int RGB, read by gpufeed's sequential reader with ``decoder``."""
    reader = VideoFrameReader(path, size_px=SizePx(SIZE, SIZE), chunk_frames=FRAMES, device=device, decoder=decoder)
    assert reader.source == decoder, reader.decoder_reason
    frames = torch.cat([part.frames.cpu() for part in reader])
    return frames.permute(0, 2, 3, 1).numpy().astype(int)


def _flat_difference(a: np.ndarray, b: np.ndarray) -> int:
    """Largest difference, in levels, over the flat middles of the bars."""
    return int(np.abs(a[..., FLAT, :] - b[..., FLAT, :]).max())


def test_the_probe_records_the_colour_matrix_and_range(bars, tmp_path, monkeypatch):
    tagged, plain = probe_video(bars / "bt709.webm"), probe_video(bars / "plain.webm")
    assert (tagged.colour_matrix, tagged.colour_range) == ("bt709", "tv")
    assert (plain.colour_matrix, plain.colour_range) == ("unspecified", "tv"), "VP9 always says its range"
    # No frame decoded (over the probe's pixel limit): the stream's own tags, which FFmpeg fills alike.
    monkeypatch.setattr(_video_probe._FirstFrameOrientation, "MAX_PIXELS", SIZE * SIZE - 1)
    assert probe_video(bars / "bt709.webm").colour_matrix == "bt709"
    assert probe_video(bars / "plain.webm").colour_matrix == "unspecified"
    # MJPEG: BT.601 full range (yuvj), which DALI's readers take.
    _write_bars(tmp_path / "cam.avi", bt709=False, codec="mjpeg", pix_fmt="yuvj420p")
    mjpeg = probe_video(tmp_path / "cam.avi")
    assert (mjpeg.colour_matrix, mjpeg.colour_range) == ("bt470bg", "pc")
    assert _reader_problem(mjpeg) is None


def test_an_index_cached_before_colours_were_recorded_is_probed_again(bars, tmp_path):
    folder = tmp_path / "videos"  # a copy: the other tests keep the shared folder's cache as it is
    shutil.copytree(bars, folder, ignore=shutil.ignore_patterns(".gpufeed"))
    dataset = VideoDataset.from_folder(folder)
    cache = folder / ".gpufeed" / "videos-index.json"
    document = json.loads(cache.read_text())
    for entry in document["entries"].values():  # as the index written before the colour facts
        del entry[2]["colour_matrix"], entry[2]["colour_range"]
    document["version"] = 7  # that index's version: cover pictures, the last fact before colours
    cache.write_text(json.dumps(document))
    again = VideoDataset.from_folder(folder)
    assert [info.colour_matrix for info in again.infos] == [info.colour_matrix for info in dataset.infos]
    assert [info.colour_matrix for info in again.infos] == ["bt709", "unspecified"]


def test_dali_leaves_a_bt709_video_to_pyav_and_keeps_its_untagged_twin(bars):
    tagged, plain = str(bars / "bt709.webm"), str(bars / "plain.webm")
    infos = VideoDataset.from_folder(bars).infos
    why = "its colour matrix is BT.709: DALI's video readers convert with BT.601"
    for on_gpu in (True, False):
        choice = choose_decoder("auto", on_gpu, infos)
        assert choice.source == "pyav" and set(choice.refused) == {tagged}, choice.reason
        assert choice.refused[tagged].startswith(why)
    assert choose_decoder("auto", False, [info for info in infos if info.path == plain]).source == "dali"
    with pytest.raises(DatasetError, match=r"dali, but DALI's reader cannot take 1 video\(s\), e\.g\. .*bt709\.webm"):
        choose_decoder("dali", False, infos)
    assert VideoFrameReader(bars / "bt709.webm", device=CPU).source == "pyav"
    assert VideoFrameReader(bars / "plain.webm", device=CPU).source == "dali"

    report = check_path(bars, progress=False)
    notes = {f.path.rsplit("/", 1)[-1]: f.reason for f in report.findings if f.kind == "decoder"}
    assert set(notes) == {"bt709.webm", "videos"}, notes
    assert notes["bt709.webm"].startswith(f"on a GPU decodes with PyAV, not NVDEC: {why}")
    assert notes["bt709.webm"].endswith("'gpufeed prepare' re-encodes it")


def test_prepare_converts_to_bt601_so_dalis_reader_reads_pyavs_colours(bars, tmp_path):
    original = _frames(bars / "bt709.webm", CPU, "pyav")
    # The bars tell the matrices apart: the same YUV read as BT.601 is far outside the bound.
    with av.open(str(bars / "bt709.webm")) as container:
        frame = next(container.decode(video=0))
        as_bt601 = frame.reformat(format="rgb24", src_colorspace="ITU601").to_ndarray().astype(int)
    assert _flat_difference(as_bt601, original[0]) > 3 * BOUND

    report = prepare_videos(bars, tmp_path / "vp9", PrepareOptions(codec="vp9", probe_clips=0), False)
    assert report.ok, report.table()
    for name in ("bt709", "plain"):
        copy = tmp_path / "vp9" / f"{name}.webm"
        source = original if name == "bt709" else _frames(bars / f"{name}.webm", CPU, "pyav")
        dali = _frames(copy, CPU, "dali")  # DALI's CPU reader: NVDEC's conversion, on the CPU
        assert _flat_difference(dali, source) <= BOUND, copy
        assert _flat_difference(_frames(copy, CPU, "pyav"), source) <= BOUND, copy
        info = probe_video(copy)
        assert (info.colour_matrix, info.colour_range) == ("smpte170m", "tv"), copy
        assert _reader_problem(info) is None, copy


@pytest.mark.gpu
def test_nvdec_reads_the_prepared_h264_as_pyav_reads_the_original(bars, tmp_path):
    assert VideoFrameReader(bars / "bt709.webm", device=GPU).source == "pyav", "NVDEC would read BT.601"
    # crf 12: x264's default 23 alone moves the bars up to the bound (measured 4 with PyAV).
    report = prepare_videos(bars, tmp_path, PrepareOptions(crf=12, probe_clips=0), False)
    assert report.ok, report.table()
    for name in ("bt709", "plain"):
        nvdec = _frames(tmp_path / f"{name}.mp4", GPU, "dali")
        assert _flat_difference(nvdec, _frames(bars / f"{name}.webm", CPU, "pyav")) <= BOUND, name


def test_prepare_writes_a_full_range_mjpeg_video_in_limited_range(tmp_path):
    """A lab camera's MJPEG (BT.601 full range, yuvj) was written untagged in full range: 16 levels off."""
    source = tmp_path / "cam" / "cam.avi"
    source.parent.mkdir()
    _write_bars(source, bt709=False, codec="mjpeg", pix_fmt="yuvj420p")
    assert (probe_video(source).colour_matrix, probe_video(source).colour_range) == ("bt470bg", "pc")
    report = prepare_videos(source.parent, tmp_path / "vp9", PrepareOptions(codec="vp9", probe_clips=0), False)
    assert report.ok, report.table()
    copy = tmp_path / "vp9" / "cam.webm"
    assert probe_video(copy).colour_range == "tv"
    assert _flat_difference(_frames(copy, CPU, "dali"), _frames(source, CPU, "pyav")) <= BOUND
