"""Which decoder each video gets: NVDEC only for what it decodes, PyAV for the rest (issue 25, item 1).

Real files are encoded here in the formats NVDEC refuses on an A100/H100 (h264 High 10, High 4:2:2,
High 4:4:4, AV1) beside ones it takes (h264 High 4:2:0, hevc Main 10, VP9 profile 0); the index
reads codec, profile and pixel format from each, and the choice is checked video by video. The
``gpu`` test trains through the fallback on a GPU and checks every clip's frames by their tags.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import DEVICES
from videohelp import encode_tagged_video, frame_tags

from gpufeed.config import LoaderConfig, VideoConfig
from gpufeed.device import DeviceChoice
from gpufeed.pipelines import ClipLoader, DatasetError, VideoDataset, check_path
from gpufeed.pipelines._nvdec import choose_decoder, gpu_capability, nvdec_problem, pix_fmt_facts
from gpufeed.pipelines._videos import probe_video

pytestmark = pytest.mark.timeout(300)

_X264 = {"g": "10", "keyint_min": "10", "sc_threshold": "0"}
# name: (encoder kwargs, FFmpeg profile the index should read, NVDEC on an H100?)
FORMATS = {
    "a_h264_high.mp4": ({"options": _X264}, "High", True),
    "b_h264_high10.mp4": ({"pix_fmt": "yuv420p10le", "options": _X264}, "High 10", False),
    "c_h264_422.mp4": ({"pix_fmt": "yuv422p", "options": _X264}, "High 4:2:2", False),
    "d_h264_444.mp4": ({"pix_fmt": "yuv444p", "options": _X264}, "High 4:4:4 Predictive", False),
    "e_hevc_main10.mp4": (
        {"codec": "libx265", "pix_fmt": "yuv420p10le", "options": {"x265-params": "log-level=error:keyint=10"}},
        "Main 10",
        True,
    ),
    "f_vp9.webm": ({"codec": "libvpx-vp9", "options": {"g": "10"}}, "Profile 0", True),
    "g_av1.mkv": ({"codec": "libsvtav1", "options": {"g": "10", "crf": "4"}}, "Main", False),
}


@pytest.fixture(scope="module")
def odd_formats(tmp_path_factory):
    folder = tmp_path_factory.mktemp("nvdec") / "videos"
    for video_id, (name, (kwargs, _, _)) in enumerate(FORMATS.items()):
        # 160x144: at least NVDEC's smallest hevc (144x144) and VP9 (128x128) frames.
        encode_tagged_video(folder / name, video_id, 30, width=160, height=144, **kwargs)
    return folder


def test_nvdec_refuses_videos_below_its_smallest_size():
    from types import SimpleNamespace

    def info(codec, width, height):
        return SimpleNamespace(codec=codec, pix_fmt="yuv420p", profile="High", width=width, height=height)

    assert nvdec_problem(info("hevc", 96, 64), (9, 0)) == "hevc 96x64: smaller than NVDEC's 144x144 for hevc"
    assert nvdec_problem(info("hevc", 144, 144), (9, 0)) is None
    assert nvdec_problem(info("vp9", 160, 120), (9, 0)) == "vp9 160x120: smaller than NVDEC's 128x128 for vp9"
    assert nvdec_problem(info("h264", 96, 64), (9, 0)) is None


@pytest.fixture(scope="module")
def unconvertible(tmp_path_factory):
    """Videos NVDEC decodes but DALI's GPU reader turns into RGB wrongly: hevc 4:4:4, an odd-size VP9."""
    folder = tmp_path_factory.mktemp("nv12") / "videos"
    x265 = {"x265-params": "log-level=error:keyint=10"}
    encode_tagged_video(
        folder / "a_hevc_444.mp4", 0, 30, width=160, height=144, codec="libx265", pix_fmt="yuv444p", options=x265
    )
    encode_tagged_video(
        folder / "b_vp9_odd.webm", 1, 30, width=161, height=145, codec="libvpx-vp9", options={"g": "10"}
    )
    return folder


def test_nvdec_refuses_what_dalis_reader_cannot_turn_into_rgb(unconvertible):
    """DALI 2.4's reader gives every decoder an NV12 surface and converts NV12 only, two rows at a time."""
    hevc, vp9 = (probe_video(unconvertible / name) for name in ("a_hevc_444.mp4", "b_vp9_odd.webm"))
    assert (hevc.pix_fmt, hevc.profile) == ("yuv444p", "Rext") and (vp9.width, vp9.height) == (161, 145)
    assert nvdec_problem(hevc, (9, 0)) == "hevc yuv444p: DALI's NVDEC reader decodes hevc with 4:2:0/4:0:0 chroma only"
    assert nvdec_problem(vp9, (9, 0)) == (
        "vp9 161x145: an odd frame size, which DALI's NVDEC reader turns into wrong RGB"
    )
    from types import SimpleNamespace

    for pix_fmt in ("yuvj420p", "yuvj422p", "yuv444p"):  # NVDEC decodes each; DALI 2.4's GPU reader none
        mjpeg = SimpleNamespace(codec="mjpeg", pix_fmt=pix_fmt, profile="", width=160, height=144)
        assert "GPU video reader does not decode mjpeg" in nvdec_problem(mjpeg, (9, 0)), pix_fmt
    for width, height in ((160, 145), (161, 144)):
        odd = SimpleNamespace(codec="h264", pix_fmt="yuv420p", profile="High", width=width, height=height)
        assert "odd frame size" in nvdec_problem(odd, (9, 0))
    choice = choose_decoder("auto", True, VideoDataset.from_folder(unconvertible).infos, (9, 0))
    assert choice.source == "pyav" and "NVDEC cannot decode 2 of 2 video(s)" in choice.reason


@pytest.mark.process  # PyAV's worker processes
@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_videos_dalis_reader_cannot_convert_read_exactly_through_pyav(unconvertible, device):
    loader = _loader(VideoDataset.from_folder(unconvertible), device)
    try:
        assert loader.source == "pyav", loader.decoder_reason
        assert {v for v, _ in _read_all(loader)} == {0, 1} and loader.skipped == {}
    finally:
        loader.close()


def test_pixel_format_facts():
    assert pix_fmt_facts("yuv420p") == ("420", 8) and pix_fmt_facts("yuvj420p") == ("420", 8)
    assert pix_fmt_facts("yuv420p10le") == ("420", 10) and pix_fmt_facts("yuv444p12le") == ("444", 12)
    assert pix_fmt_facts("yuv422p") == ("422", 8) and pix_fmt_facts("gray10le") == ("400", 10)
    assert pix_fmt_facts("nv12") == ("420", 8) and pix_fmt_facts("p010le") == ("420", 10)


def test_the_index_reads_profile_and_nvdec_takes_only_what_it_decodes(odd_formats):
    for name, (_, profile, on_h100) in FORMATS.items():
        info = probe_video(odd_formats / name)
        assert info.problem is None, (name, info.problem)
        assert info.profile == profile, name
        why = nvdec_problem(info, capability=(9, 0))
        assert (why is None) == on_h100, (name, why)
        if why:
            assert info.codec in why, why
    av1 = probe_video(odd_formats / "g_av1.mkv")
    assert "no AV1 decoder" in nvdec_problem(av1, (9, 0)) and "compute capability 9.0" in nvdec_problem(av1, (9, 0))
    assert nvdec_problem(av1, (8, 9)) is None, "an Ada GPU's NVDEC decodes AV1"
    assert "High 10" in nvdec_problem(probe_video(odd_formats / "b_h264_high10.mp4"), (8, 9))


def test_choice_on_a_gpu_falls_back_to_pyav_or_refuses_dali(odd_formats):
    dataset = VideoDataset.from_folder(odd_formats)
    good = [info for info in dataset.infos if FORMATS[info.path.rsplit("/", 1)[-1]][2]]
    assert tuple(choose_decoder("auto", True, good, (9, 0))) == (
        "dali",
        "video.decoder: auto; NVDEC decodes every video (h264, hevc, vp9)",
    )
    choice = choose_decoder("auto", True, dataset.infos, (9, 0))
    assert choice.source == "pyav" and "NVDEC cannot decode 4 of 7 video(s)" in choice.reason
    assert {p.rsplit("/", 1)[-1] for p in choice.refused} == {n for n, (_, _, ok) in FORMATS.items() if not ok}
    with pytest.raises(DatasetError, match=r"dali, but NVDEC cannot decode 4 video\(s\), e\.g\. .*b_h264_high10\.mp4"):
        choose_decoder("dali", True, dataset.infos, (9, 0))
    assert choose_decoder("pyav", True, dataset.infos, (9, 0)).source == "pyav"
    # On the CPU the rule is DALI's CPU decoder, as before: VP9 only here.
    vp9 = [info for info in dataset.infos if info.codec == "vp9"]
    assert choose_decoder("auto", False, vp9).source == "dali"
    assert choose_decoder("auto", False, dataset.infos).source == "pyav"
    with pytest.raises(DatasetError, match="dali cannot decode av1, h264, hevc without a GPU"):
        choose_decoder("dali", False, dataset.infos)
    with pytest.raises(ValueError, match="allowed: auto, dali, pyav"):
        choose_decoder("nvdec", True, dataset.infos)


def test_check_says_which_decoder_each_video_gets_and_why(odd_formats):
    report = check_path(odd_formats, progress=False)
    assert report.ok, report.table()
    notes = {f.path.rsplit("/", 1)[-1]: f.reason for f in report.findings if f.kind == "decoder"}
    refused = {n for n, (_, _, ok) in FORMATS.items() if not ok}
    capability = gpu_capability(DeviceChoice("gpu", 0, "test")) if torch.cuda.is_available() else None
    if nvdec_problem(probe_video(odd_formats / "g_av1.mkv"), capability) is None:
        refused.discard("g_av1.mkv")  # check asks this machine's GPU, and its NVDEC has AV1
    assert set(notes) == refused | {"videos"}
    assert "High 10" in notes["b_h264_high10.mp4"]
    assert "g_av1.mkv" not in refused or "no AV1 decoder" in notes["g_av1.mkv"]
    assert all(notes[n].startswith("on a GPU decodes with PyAV, not NVDEC") for n in refused)
    nvdec = len(FORMATS) - len(refused)
    assert notes["videos"].startswith(f"on a GPU {nvdec} of 7 video(s) decode on NVDEC (")
    table = report.table()
    assert "[decoder]" in table and table.endswith("no problems found")


def _read_all(loader, tag_of=None):
    """Every clip's (video, start), each checked frame by frame against its tags.

    Args:
        tag_of: The id written in each dataset video's tags (default: its dataset id); a folder
            holding some of the formats numbers its videos afresh, while their tags keep the
            index in ``FORMATS``.
    """
    seen = []
    for batch in loader:
        for k in range(len(batch)):
            video, start = int(batch.video_ids[k]), int(batch.start_frames[k])
            tag = video if tag_of is None else tag_of[video]
            frames = start + np.arange(5)
            assert frame_tags(batch.clips[k], "CTHW") == [(int(f), tag) for f in frames], "exactly the named frames"
            seen.append((video, start))
    return seen


def _loader(dataset, device):
    return ClipLoader(
        dataset,
        train=False,
        video_cfg=VideoConfig(clip_length_frames=5, stride_frames=1, size_px=48, decoder="auto"),
        loader_cfg=LoaderConfig(batch_size=4, num_threads=2, last_batch="partial"),
        device=device,
    )


@pytest.mark.process
def test_the_pyav_fallback_reads_every_format_exactly(odd_formats):
    """What a GPU falls back to, run here: every clip of every format, frames checked by their tags."""
    loader = _loader(VideoDataset.from_folder(odd_formats), DeviceChoice("cpu", None, "test"))
    assert loader.source == "pyav"
    try:
        seen = _read_all(loader)
    finally:
        loader.close()  # its PyAV worker processes go now, not whenever the loader is collected
    assert sorted({v for v, _ in seen}) == list(range(len(FORMATS))) and loader.skipped == {}


@pytest.mark.gpu
@pytest.mark.process  # the videos NVDEC cannot take go to PyAV's worker processes
def test_nvdec_fallback_reads_av1_and_high10_exactly_on_a_gpu(odd_formats):
    """On a GPU, a folder with AV1 and h264 High 10/4:4:4 trains through PyAV instead of failing in DALI."""
    loader = _loader(VideoDataset.from_folder(odd_formats), DeviceChoice("gpu", 0, "test"))
    # 4 of 7 on an A100/H100, 3 on GPUs whose NVDEC has AV1: h264 High 10/4:2:2/4:4:4 go to PyAV everywhere.
    assert loader.source == "pyav" and "NVDEC cannot decode" in loader.decoder_reason
    seen = _read_all(loader)
    assert sorted({v for v, _ in seen}) == list(range(len(FORMATS))), "every video, none skipped"
    assert loader.skipped == {} and torch.cuda.is_available()


def _nvdec_formats(odd_formats, folder):
    """The formats NVDEC takes, copied into ``folder``: their dataset, and the tag id of each video."""
    import shutil

    folder.mkdir()
    for name, (_, _, ok) in FORMATS.items():
        if ok:  # the video and its label file
            for path in odd_formats.glob(name.rsplit(".", 1)[0] + ".*"):
                shutil.copy(path, folder / path.name)
    dataset = VideoDataset.from_folder(folder)
    names = list(FORMATS)
    return dataset, [names.index(path.rsplit("/", 1)[-1]) for path in dataset.paths]


@pytest.mark.process  # the PyAV worker processes
def test_the_formats_nvdec_takes_read_exactly_through_pyav(odd_formats, tmp_path):
    """The CPU twin of the test below: the same folder and checks, so that they are known to hold here."""
    dataset, tag_of = _nvdec_formats(odd_formats, tmp_path / "videos")
    assert tag_of == [0, 4, 5], "a folder of three numbers them 0-2; their tags keep the FORMATS index"
    loader = _loader(dataset, DeviceChoice("cpu", None, "test"))
    try:
        assert {v for v, _ in _read_all(loader, tag_of)} == {0, 1, 2}
    finally:
        loader.close()


@pytest.mark.gpu
def test_nvdec_reads_what_it_takes_exactly_on_a_gpu(odd_formats, tmp_path):
    """The formats NVDEC takes (h264 High, hevc Main 10, VP9) go to DALI on a GPU and read exactly."""
    dataset, tag_of = _nvdec_formats(odd_formats, tmp_path / "videos")
    loader = _loader(dataset, DeviceChoice("gpu", 0, "test"))
    assert loader.source == "dali", loader.decoder_reason
    assert {v for v, _ in _read_all(loader, tag_of)} == {0, 1, 2}


# Camera MJPEG: full-range JPEG frames, 4:2:0 or 4:2:2 (most USB and lab cameras).
MJPEG = {"a_mjpeg_420.avi": "yuvj420p", "b_mjpeg_422.avi": "yuvj422p"}


@pytest.fixture(scope="module")
def mjpeg_videos(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mjpeg") / "videos"
    for video_id, (name, pix_fmt) in enumerate(MJPEG.items()):
        encode_tagged_video(folder / name, video_id, 30, width=160, height=144, codec="mjpeg", pix_fmt=pix_fmt)
    return folder


def test_camera_mjpeg_goes_to_pyav_on_a_gpu_and_dali_refuses_it(mjpeg_videos):
    """DALI 2.4's GPU reader drops MJPEG files (an H200 run: a reader left with no samples)."""
    infos = VideoDataset.from_folder(mjpeg_videos).infos
    assert [(info.codec, info.pix_fmt) for info in infos] == [("mjpeg", "yuvj420p"), ("mjpeg", "yuvj422p")]
    choice = choose_decoder("auto", True, infos, (9, 0))
    assert choice.source == "pyav" and "DALI's reader cannot take 2 of 2" in choice.reason, choice.reason
    assert "a_mjpeg_420.avi: mjpeg: DALI's GPU video reader does not decode mjpeg" in choice.reason
    with pytest.raises(DatasetError, match=r"video.decoder: dali, but DALI's reader cannot take 2 video\(s\)"):
        choose_decoder("dali", True, infos, (9, 0))
    assert choose_decoder("auto", False, infos).source == "dali", "DALI's CPU reader takes MJPEG"


def _clips_by_start(dataset, device, decoder: str) -> dict[tuple[int, int], torch.Tensor]:
    loader = ClipLoader(
        dataset,
        train=False,
        video_cfg=VideoConfig(clip_length_frames=5, stride_frames=1, size_px=48, decoder=decoder),
        loader_cfg=LoaderConfig(batch_size=4, num_threads=2, last_batch="partial"),
        device=device,
    )
    try:
        out = {}
        for batch in loader:
            for k in range(len(batch)):
                out[(int(batch.video_ids[k]), int(batch.start_frames[k]))] = batch.clips[k].float().cpu()
        return out
    finally:
        loader.close()


def _contrast_slope(got: torch.Tensor, want: torch.Tensor) -> float:
    """Least-squares slope of ``got`` on ``want``: 1 for the same range, about 1.16 (255/219) where
    full-range frames were read as limited-range."""
    x, y = want.flatten() - want.mean(), got.flatten() - got.mean()
    return float((x * y).sum() / (x * x).sum())


def _same_frames(got: dict, want: dict) -> None:
    """The same clips, frames (by their tags) and range, within a decoder's rounding."""
    assert got.keys() == want.keys() and {v for v, _ in got} == {0, 1}
    for key, clip in want.items():
        assert frame_tags(got[key], "CTHW") == frame_tags(clip, "CTHW"), key
        assert 0.96 < _contrast_slope(got[key], clip) < 1.04, key
        assert float((got[key] - clip).abs().mean()) < 6.0, key


@pytest.mark.process  # the PyAV worker processes
def test_camera_mjpeg_reads_the_same_through_dalis_cpu_reader_and_pyav(mjpeg_videos):
    """The CPU half of the test below, with DALI's CPU reader (FFmpeg inside DALI) for NVDEC:
    the checks hold between two decoders, and tell a limited-range reading apart."""
    dataset = VideoDataset.from_folder(mjpeg_videos)
    cpu = DeviceChoice("cpu", None, "test")
    dali, pyav = _clips_by_start(dataset, cpu, "dali"), _clips_by_start(dataset, cpu, "pyav")
    _same_frames(dali, pyav)
    for clip in pyav.values():
        misread = ((clip - 16.0) * 255.0 / 219.0).clamp(0, 255).round()  # full range taken for limited
        assert _contrast_slope(misread, clip) > 1.06


@pytest.mark.gpu
@pytest.mark.process  # the PyAV reference's worker processes
def test_a_gpu_loader_reads_camera_mjpeg_as_the_cpu_does(mjpeg_videos):
    """On a GPU ``auto`` gives camera MJPEG to PyAV (DALI's GPU reader drops it): the same frames
    and full range as on the CPU (a limited-range reading would stretch the contrast by 16%)."""
    dataset = VideoDataset.from_folder(mjpeg_videos)
    gpu, cpu = DeviceChoice("gpu", 0, "test"), DeviceChoice("cpu", None, "test")
    _same_frames(_clips_by_start(dataset, gpu, "auto"), _clips_by_start(dataset, cpu, "pyav"))
