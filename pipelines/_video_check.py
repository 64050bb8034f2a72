"""``gpufeed check`` for video folders: every video that would stop or poison clip training.

Per video it reports, with the path and the reason, as bad files: unreadable, zero-byte, non-video
and audio-only files, truncated ones (by the mp4 box structure, a missing ``moov`` index, the
container's declared frame count, and a full decode), unsupported codecs, and label files that are
missing, malformed, or whose row count does not match the frame count, and videos shorter than one
clip (training refuses them; the span is the default ``video`` section's, or the config's under
``gpufeed check --config``). Frame folders and HDF5
frame files (:mod:`gpufeed.pipelines._frame_stores`) are videos too: a missing frame number, a
zero-byte frame and a frame that is not an image are named with the frame. As warnings (usable: the
loaders read them, exactly): a variable frame rate (frames are numbered in presentation order,
which may not be how the labels were made). As ``decoder`` notes: which decoder each video gets
on a GPU and why (NVDEC, or PyAV for a codec, profile, pixel format or size NVDEC does not take;
see :mod:`gpufeed.pipelines._nvdec`). Label CSVs without a
video and other files are listed as ignored. Registered in :data:`gpufeed.pipelines._check.CHECKERS`,
so ``gpufeed check DIR`` on a ``gpufeed synth`` folder checks ``videos/`` too.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import numpy as np

from gpufeed.config import VideoConfig
from gpufeed.core import DataPath, ObjectPath, data_path, progress_bar
from gpufeed.device import DeviceChoice
from gpufeed.pipelines._check import CHECKERS, CheckReport, Finding
from gpufeed.pipelines._clips import ClipGeometry
from gpufeed.pipelines._deepethogram import is_project, project_dataset
from gpufeed.pipelines._epochs import default_num_threads
from gpufeed.pipelines._errors import DatasetError
from gpufeed.pipelines._frame_stores import decode_store_frames, label_path
from gpufeed.pipelines._nvdec import choose_decoder, gpu_capability
from gpufeed.pipelines._pyav_sequential import decode_all_frames
from gpufeed.pipelines._store_kinds import is_frame_folder, store_extensions
from gpufeed.pipelines._videos import (
    RAW_STREAM_SUFFIXES,
    VIDEO_EXTENSIONS,
    VideoDataset,
    VideoInfo,
    list_videos,
    raw_stream_hint,
)

__all__ = ["check_videos", "holds_videos"]


def holds_videos(path: Path) -> bool:
    """True for a folder with a video file, an HDF5 frame file or a frame folder directly inside it.

    A raw H.264/H.265 stream counts too, so that the check names it and says how to wrap it.

    A frame folder counts here only with its label CSV beside it: a class folder of an image
    dataset (``amber/000000.jpg`` ...) looks just like one.
    """
    if not path.is_dir() or is_frame_folder(path):
        return False
    for p in path.iterdir():
        if p.is_file() and p.suffix.lower() in VIDEO_EXTENSIONS + store_extensions() + RAW_STREAM_SUFFIXES:
            return True
        if p.is_dir() and not p.name.startswith(".") and label_path(p).is_file() and is_frame_folder(p):
            return True
    return False


def _frame_rate_warning(info: VideoInfo) -> str | None:
    if info.cfr or len(info.pts) < 2:
        return None
    ms = np.diff(np.asarray(info.pts)) * 1000.0 * info.time_base[0] / info.time_base[1]
    return (
        f"variable frame rate: frame durations range from {ms.min():.1f} to {ms.max():.1f} ms; frame i is the i-th "
        "frame shown, so labels must count frames the same way; 'gpufeed prepare' re-encodes it at a constant rate"
    )


def _decoder_findings(folder: str, infos: list[VideoInfo]) -> list[Finding]:
    """Which decoder each video gets on a GPU and why: one line per video NVDEC cannot take, one in all for the rest.

    The GPU is taken to be an A100/H100 (no AV1 in NVDEC) unless this machine has another one.
    """
    if not infos:
        return []
    capability = gpu_capability(DeviceChoice("gpu", 0, "check")) if _cuda_visible() else None
    choice = choose_decoder("auto", True, infos, capability)
    findings, nvdec = [], []
    for info in infos:
        why = choice.refused.get(info.path)
        if why:
            findings.append(
                Finding(
                    info.path,
                    f"on a GPU decodes with PyAV, not NVDEC: {why}; 'gpufeed prepare' re-encodes it",
                    "decoder",
                )
            )
        else:
            nvdec.append(info)
    kinds = sorted({f"{info.codec} {info.profile or '?'} {info.pix_fmt or '?'}".strip() for info in nvdec})
    summary = f"on a GPU {len(nvdec)} of {len(infos)} video(s) decode on NVDEC"
    summary += f" ({'; '.join(kinds)})" if kinds else ""
    summary += f"; {choice.reason}" if choice.refused else ""
    findings.append(Finding(str(folder), summary, "decoder"))
    return findings


def _cuda_visible() -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return False
    return torch.cuda.is_available()


def check_videos(
    folder: str | Path | ObjectPath, progress: bool = True, clip_span_frames: int | None = None
) -> CheckReport:
    """Check every video under ``folder`` and its label CSV (see the module docs; ``clip_span_frames``: as
    :func:`check_dataset`).

    Raises:
        DatasetError: The folder does not exist or holds no videos.
    """
    folder = data_path(folder)
    dataset = VideoDataset.from_folder(folder, progress=progress)
    report = check_dataset(dataset, f"videos in {folder}", progress, clip_span_frames)
    _, others = list_videos(folder)
    labels = {str(label_path(p)) for p in dataset.paths}
    for other in others:
        if other in labels:
            continue
        what = "a label file without a video" if other.endswith(".csv") else "not a video; the loader ignores it"
        what = raw_stream_hint(other) or what
        report.findings.append(Finding(other, what, "ignored"))
    return report


def check_dataset(
    dataset: VideoDataset, source: str, progress: bool = True, clip_span_frames: int | None = None
) -> CheckReport:
    """Check every video of an indexed dataset: index problems, label problems, length, a full decode.

    ``clip_span_frames``: a video with fewer frames is bad, as training refuses it (``None``: the
    span of the default ``video.clip_length_frames`` and ``stride_frames``; ``gpufeed check
    --config`` passes its run's).
    """
    span = clip_span_frames or _default_clip_span()

    report = CheckReport(sources=[source], checked=len(dataset))
    infos = dataset.infos
    for vid, info in enumerate(infos):
        if info.problem:
            report.findings.append(Finding(info.path, info.problem, "video"))
            continue
        warning = _frame_rate_warning(info)
        if warning:
            report.findings.append(Finding(info.path, warning, "warning"))
        why = dataset.problems.get(vid)
        if why:
            report.findings.append(Finding(info.path, why, "label"))
        if info.num_frames < span:  # the clip loader's own words, so both name it alike
            report.findings.append(
                Finding(info.path, f"too short: {info.num_frames} frames, a clip spans {span}", "video")
            )
    readable = [info for info in infos if not info.problem]
    # Frame stores decode as images (nvJPEG or DALI's CPU decoder): no video decoder to choose.
    report.findings += _decoder_findings(dataset.source, [info for info in readable if not info.store])
    with ThreadPoolExecutor(max_workers=default_num_threads()) as pool:
        decoded = pool.map(partial(_decode_all, max_pixels=dataset.max_pixels), readable)
        bar = progress_bar(
            decoded, total=len(readable), desc="decoding videos", unit="video", disable=not progress, leave=False
        )
        for info, (count, problem) in zip(readable, bar, strict=True):
            if problem:  # a store's problem names its frame and says what is wrong with it
                report.findings.append(Finding(info.path, problem if info.store else f"damaged: {problem}", "video"))
            elif count != info.num_frames:
                report.findings.append(
                    Finding(info.path, f"damaged: {count} frames decode, the file holds {info.num_frames}", "video")
                )
    return report


def _decode_all(info: VideoInfo, max_pixels: int) -> tuple[int, str | None]:
    """Decode every frame of a video file, or every image of a frame store (naming the bad frame)."""
    if not info.store:
        return decode_all_frames(info.path)
    count, problem, _ = decode_store_frames(info.path, info.store, info.frame_name, max_pixels=max_pixels)
    return count, problem


def _default_clip_span() -> int:
    """Frames one clip spans under the default ``video`` section."""
    video = VideoConfig()
    return ClipGeometry(video.clip_length_frames, video.stride_frames).span_frames


def _check_project(path: Path, progress: bool, clip_span_frames: int | None = None) -> CheckReport:
    try:
        dataset = project_dataset(path, split="all", val_fraction=0.0, seed=0, progress=progress)
    except DatasetError as err:
        return CheckReport(sources=[str(path)], findings=[Finding(str(path), str(err), "video")])
    return check_dataset(dataset, f"DeepEthogram project {path}", progress, clip_span_frames)


def is_single_store(path: DataPath) -> bool:
    """True for one frame store named directly: a store file (HDF5 ...), or a folder of numbered images."""
    return (path.is_file() and path.suffix.lower() in store_extensions()) or (path.is_dir() and is_frame_folder(path))


def _check_folder(path: Path, progress: bool, clip_span_frames: int | None = None) -> CheckReport:
    try:
        return check_videos(path, progress, clip_span_frames)
    except DatasetError as err:
        return CheckReport(sources=[str(path)], findings=[Finding(str(path), str(err), "video")])


CHECKERS.append((is_project, _check_project))
CHECKERS.append((holds_videos, _check_folder))
