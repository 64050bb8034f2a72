"""The clip sources of encoded videos, and the one factory that picks a dataset's source.

* :class:`ReaderSource` (``dali``): DALI's video reader (NVDEC on a GPU, FFmpeg on the CPU) over a
  file list written per plan stream, a batch's rows in reader order (by video, then start);
* :class:`PyAVSource` (``pyav``): PyAV decodes in DALI's worker processes (codecs DALI's CPU
  reader lacks, videos NVDEC cannot take, and folders mixing videos and frame stores), a batch's
  rows by video, then start, so each worker reads a video forward;
* the frame stores' sources, in :mod:`gpufeed.pipelines._store_sources`.

:func:`choose_clip_source` picks one from the videos' facts (what they are, what NVDEC and DALI's
CPU reader decode, whether there is a GPU, ``video.decoder``) and says why; the loader, the
sequential reader and the rest ask the source they get (:class:`~gpufeed.pipelines._clip_source.ClipSource`),
never its name.
"""

from __future__ import annotations

import ctypes
import functools
import time
from pathlib import Path

import numpy as np

from gpufeed.pipelines._clip_pipeline import (
    FeedInput,
    ReaderInput,
    build_clip_pipeline,
    check_reader_size,
    new_work_dir,
    range_lines,
    reader_order,
    write_file_list,
    write_stream_list,
)
from gpufeed.pipelines._clip_plan import PlanRows
from gpufeed.pipelines._clip_source import ClipJob, ClipSource, RangeJob, SourcePipeline, start_method
from gpufeed.pipelines._crop_windows import RoiFeed
from gpufeed.pipelines._errors import DatasetError
from gpufeed.pipelines._nvdec import choose_decoder
from gpufeed.pipelines._nvdec_reader import ReaderBuild, fused_reader_resize, log_reader_budget, log_reader_build
from gpufeed.pipelines._object_media import object_storage_reason, reader_local_paths
from gpufeed.pipelines._pyav import VideoRef, plan_read_order
from gpufeed.pipelines._pyav_clips import PyAVClips
from gpufeed.pipelines._pyav_sequential import SequentialFeed
from gpufeed.pipelines._store_kinds import frame_store
from gpufeed.pipelines._store_sources import ScaledJpegSource, StoreSource

__all__ = ["PyAVSource", "ReaderSource", "choose_clip_source", "nvdec_library_problem"]


class ReaderSource(ClipSource):
    """DALI's video reader over a file list of the plan's clips (see the module docs).

    Attributes:
        list_lines: Most lines of a list (``None``: :data:`~gpufeed.pipelines._clip_pipeline.LIST_LINES`);
            a reader read for a few batches (a benchmark's round) is built for those, not whole epochs.
    """

    name = "dali"
    in_plan_order = False
    ranges_tagged_by_frame = True
    list_lines: int | None = None

    def read_order(self, rows: PlanRows) -> np.ndarray:
        return reader_order(rows.videos, rows.starts)

    def open(self, job: ClipJob, *, build: bool = True) -> SourcePipeline:
        """The reader over a list of the stream's first iterations; its ``limit`` is how many the list holds."""
        work = new_work_dir()
        pins: list = []
        started = time.perf_counter()
        try:
            # s3://: pinned cached copies (DALI's reader opens local files only)
            local = reader_local_paths(job.paths, pins)
            listed = write_stream_list(Path(work.name), local, job.plan, self.list_lines)
            written = time.perf_counter()
            fused = log_reader_budget(job.infos, listed, job.batch_size, job.geometry, job.on_gpu)
            roi = None
            if job.fit == "centre_crop":
                plan, aspect = job.plan, job.size_px.width_px / job.size_px.height_px
                roi = RoiFeed(lambda k: (rows := plan[k]).videos[self.read_order(rows)], job.frame_sizes(), aspect)
            graph = ReaderInput(listed.path, fused_resize=fused)
            pipe = build_clip_pipeline(clip_input=graph, roi_feed=roi, build=build, **job.graph_args())
            if build:
                check_reader_size(pipe, listed.iterations * job.batch_size)
        except Exception:
            for folder in (work, *pins):
                folder.cleanup()
            raise
        self._resources += [work, *pins]
        made = ReaderBuild(len(listed.videos), listed.capped, written - started, time.perf_counter() - written)
        job.reader_builds.append(made)
        log_reader_build(made, len(job.reader_builds), job.on_gpu)
        return SourcePipeline(pipe, listed.iterations)

    def open_ranges(self, job: RangeJob, *, build: bool = True):
        """Consecutive ranges read with the reader: at most two list lines, each range tagged by its first frame.

        DALI builds a frame decoder (on a GPU an NVDEC session, about 8 ms on an H100) for every
        list line while the pipeline builds, holding Python's lock: a line per range froze a
        server's every thread for most of a second per long video, even on the CPU. One line over
        the whole ranges gives the same samples, since the reader steps ``sequence_length`` frames
        from sample to sample; the end-aligned last range, when it overlaps, is a second line.
        """
        firsts, spans = range_lines(job.starts, job.chunk_frames)
        zeros = np.zeros(len(firsts), dtype=np.int64)
        listed = write_file_list(job.work, reader_local_paths([job.info.path]), zeros, firsts, spans)
        graph = ReaderInput(listed, fused_resize=fused_reader_resize(job.on_gpu)[0], frame_numbers=True)
        return build_clip_pipeline(clip_input=graph, roi_feed=job.roi_feed(), build=build, **job.graph_args())


class PyAVSource(ClipSource):
    """PyAV decoding the plan's clips in DALI's worker processes (see the module docs)."""

    name = "pyav"
    in_plan_order = False
    full_ranges = False

    def __init__(self, reason: str, *, fell_back: bool = False) -> None:
        super().__init__(reason, fell_back=fell_back)
        self._refs: tuple = (None, [])  # (the infos, their VideoRefs): made once, not per pipeline

    def read_order(self, rows: PlanRows) -> np.ndarray:
        return plan_read_order(rows)

    def _video_refs(self, infos) -> list[VideoRef]:
        if self._refs[0] is not infos:
            self._refs = (infos, [VideoRef.from_info(info) for info in infos])
        return self._refs[1]

    def open(self, job: ClipJob, *, build: bool = True) -> SourcePipeline:
        method = start_method(job, job.num_threads, "PyAV")
        geometry = job.geometry
        clips = PyAVClips(
            job.plan,
            self._video_refs(job.infos),
            clip_length_frames=geometry.clip_length_frames,
            stride_frames=geometry.stride_frames,
            size_px=job.size_px,
            fit=job.fit,
        )
        graph = FeedInput(clips, parallel=True, fitted=True)
        return SourcePipeline(
            build_clip_pipeline(clip_input=graph, start_method=method, build=build, **job.graph_args())
        )

    def open_ranges(self, job: RangeJob, *, build: bool = True):
        """The video decoded once, front to back, in this thread (no seeks at all)."""
        feed = SequentialFeed(VideoRef.from_info(job.info), job.chunk_frames, size_px=job.size_px, fit=job.fit)
        graph = FeedInput(feed, parallel=False, fitted=True)
        return build_clip_pipeline(clip_input=graph, build=build, **job.graph_args())


# The video decoders by the name ``choose_decoder`` (and ``video.decoder``) gives them.
_VIDEO_SOURCES = {source.name: source for source in (ReaderSource, PyAVSource)}


def choose_clip_source(
    requested: str,
    on_gpu: bool,
    infos,
    where: str,
    capability: tuple[int, int] | None = None,
    *,
    whole_clips: bool = True,
) -> ClipSource:
    """The clip source for these videos, with why: frame stores' sources, else the video decoder :func:`choose_decoder` picks.

    Frame folders and HDF5 files hold images, which DALI's image decoder reads on any device
    (``video.decoder`` chooses between video decoders and does not apply to them); on a CPU,
    stores of JPEG frames only decode DCT-scaled in worker processes (:class:`ScaledJpegSource`),
    unless ``whole_clips`` is False (the sequential reader, reading one video in its own thread).
    A set mixing videos and stores goes to the PyAV workers, which decode the stores' frames with
    Pillow.

    Args:
        requested: ``video.decoder``: ``auto``, ``dali`` or ``pyav``.
        on_gpu: Whether the pipeline runs on a GPU.
        infos: The :class:`~gpufeed.pipelines._videos.VideoInfo` of every video read.
        where: The dataset, for messages.
        capability: The GPU's compute capability, for :func:`gpufeed.pipelines._nvdec.choose_decoder`.
        whole_clips: Random clips of a plan (the loader); False: one video's ranges in order.

    Raises:
        DatasetError: ``dali`` was asked for a mixed set, or as :func:`choose_decoder` says.
    """
    infos = list(infos)
    kinds = {info.store for info in infos}
    if kinds and "" not in kinds:
        decoder = "nvJPEG / the hardware JPEG decoder" if on_gpu else "DALI's CPU image decoder"
        named = " and ".join(sorted({frame_store(kind).described for kind in kinds}))
        if whole_clips and ScaledJpegSource.takes(on_gpu, infos):
            return ScaledJpegSource(
                f"{named}: one image decode per frame, DCT-scaled by libjpeg-turbo in DALI's worker processes"
            )
        return StoreSource(f"{named}: one image decode per frame with {decoder}")
    if len(kinds) > 1:
        # One graph reads one kind: PyAV's workers take both (Pillow decodes the stores' frames).
        if requested == "dali":
            raise DatasetError(
                f"video.decoder: dali cannot read {where}: it mixes encoded videos and frame stores; use decoder "
                "auto or pyav, or keep them in separate folders"
            )
        why = (
            f"video.decoder: {requested}; {where} mixes encoded videos and frame stores: PyAV worker processes "
            "decode the videos and Pillow the stores' frames"
        )
        return PyAVSource(why, fell_back=on_gpu and requested == "auto")
    remote = object_storage_reason(requested, infos, where)
    if remote is not None:  # s3:// videos without a local cache: PyAV's ranged reads
        return PyAVSource(remote, fell_back=on_gpu)
    missing = nvdec_library_problem() if on_gpu and requested != "pyav" else None
    if missing is not None:
        if requested == "dali":
            raise DatasetError(f"video.decoder: dali cannot read {where}: {missing}")
        return PyAVSource(f"video.decoder: auto; {missing}, so PyAV decodes every video", fell_back=True)
    choice = choose_decoder(requested, on_gpu, infos, capability)
    source = _VIDEO_SOURCES[choice.source]
    # Falling back to PyAV on a GPU costs throughput: the loader says so louder than a routine choice.
    return source(choice.reason, fell_back=on_gpu and requested == "auto" and source is PyAVSource)


@functools.cache
def nvdec_library_problem() -> str | None:
    """Why NVDEC cannot be used on this machine at all (its driver library does not load), or ``None``.

    The driver's NVDEC library is mounted into a container only with the ``video`` driver
    capability (``NVIDIA_DRIVER_CAPABILITIES``), which many images leave out: DALI's reader would
    then fail at its first batch, mid-run, where PyAV decodes the same videos.
    """
    for name in ("libnvcuvid.so.1", "libnvcuvid.so"):  # the names DALI's NVDEC loader tries
        try:
            ctypes.CDLL(name)
        except OSError:
            continue
        return None
    return (
        "NVDEC's driver library (libnvcuvid.so.1) does not load here; in a container, give it the driver's "
        "video capability (NVIDIA_DRIVER_CAPABILITIES=compute,video,utility)"
    )
