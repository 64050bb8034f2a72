"""The clip loader's DALI pipeline for each source, built over one stream of plan batches.

Each builder takes the :class:`~gpufeed.pipelines._clip_loader.ClipLoader` (its table, geometry,
configs and device; not annotated, since that module imports this one), the stream and the arguments every clip pipeline shares, and returns a
built pipeline whose outputs are ``clips`` (uint8 ``(N, T, H, W, C)``, resized, augmented) and
``tags`` (each row's (video, start frame), which the loader checks against the plan):

- :func:`pyav_pipeline`: PyAV decodes in DALI's worker processes (codecs DALI's CPU reader lacks,
  and videos NVDEC cannot take);
- :func:`reader_pipeline`: DALI's video reader (NVDEC on a GPU) over a file list written per
  stream, its rows in reader order;
- :func:`frames_pipeline`: frame folders and HDF5 frame files, every frame of a batch through one
  image decoder, the files read in worker processes (DCT-scaled JPEG decodes in worker processes
  on a CPU).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from gpufeed.pipelines._clip_pipeline import (
    RoiFeed,
    StreamRows,
    build_clip_pipeline,
    centre_rois,
    check_reader_size,
    new_work_dir,
    write_stream_list,
)
from gpufeed.pipelines._epochs import worker_start_method
from gpufeed.pipelines._nvdec_reader import ReaderBuild, log_reader_budget, log_reader_build
from gpufeed.pipelines._object_media import reader_local_paths
from gpufeed.pipelines._pyav import ClipSource
from gpufeed.pipelines._sampler import PlanStream
from gpufeed.pipelines._store_feed import (
    ScaledJpegClips,
    StoreFrameFeed,
    StoreRef,
    channel_mode,
    jpeg_decode_sizes,
)
from gpufeed.pipelines._store_pipeline import build_store_pipeline, store_read_workers

__all__ = ["frames_pipeline", "pyav_pipeline", "reader_pipeline", "worker_pids"]

log = logging.getLogger("gpufeed")


def worker_pids(pipe) -> list[int]:
    """Process ids of a pipeline's Python workers (empty if this DALI does not tell, or it has none)."""
    pool = getattr(pipe, "_py_pool", None)
    try:
        return [int(pid) for pid in pool.pids()] if pool is not None else []
    except Exception:  # a private DALI detail: without it the check is skipped, nothing breaks
        return []


def pyav_pipeline(loader, stream: PlanStream, common: dict):
    """PyAV decoding the stream's clips in DALI's parallel external source workers."""
    method, why = worker_start_method(getattr(loader.cfg, "worker_start_method", "auto"))
    log.info("starting %d PyAV worker process(es) with %s (%s)", loader.num_threads, method, why)
    clips = ClipSource(
        stream,
        loader.table,
        loader._refs,
        train=loader.train,
        seed=loader.seed,
        batch_size=loader.batch_size,
        size_px=loader.video_cfg.output_size,
        fit=loader.video_cfg.fit,
    )
    return build_clip_pipeline(source="pyav", clip_input=clips, start_method=method, **common)


def reader_pipeline(loader, stream: PlanStream, common: dict, rows) -> tuple:
    """DALI's video reader over a file list of the stream's clips.

    Args:
        rows: ``rows(k)``: batch k's rows in reader order (see ``reader_rows``).

    Returns:
        ``(pipe, iterations, resources)``: the pipeline, how many batches its list holds, and the
        work folder holding the list (removed with the session).
    """
    work = new_work_dir()
    started = time.perf_counter()
    try:
        listed = write_stream_list(
            Path(work.name),
            reader_local_paths(loader.dataset.paths),  # s3://: cached copies (DALI's reader opens local files)
            stream,
            loader.table,
            train=loader.train,
            seed=loader.seed,
            batch_size=loader.batch_size,
        )
        written = time.perf_counter()
        fused = log_reader_budget(
            loader.dataset.infos, listed, loader.batch_size, loader.geometry, loader.device.is_gpu
        )
        roi = None
        if loader.video_cfg.fit == "centre_crop":
            sizes = np.array([(info.width, info.height) for info in loader.dataset.infos])
            out = loader.video_cfg.output_size
            roi = RoiFeed(lambda k: rows(k)[0], sizes, out.width_px / out.height_px)
        pipe = build_clip_pipeline(source="dali", clip_input=listed.path, roi_feed=roi, fused_resize=fused, **common)
        check_reader_size(pipe, listed.iterations * loader.batch_size)
    except Exception:
        work.cleanup()
        raise
    build = ReaderBuild(len(listed.videos), listed.capped, written - started, time.perf_counter() - written)
    loader.reader_builds.append(build)
    log_reader_build(build, len(loader.reader_builds), loader.device.is_gpu)
    return pipe, listed.iterations, [work]


def frames_pipeline(loader, stream: PlanStream, common: dict, *, build: bool = True):
    """The clip pipeline over frame stores: the stream's clips, one image decode per frame.

    On a CPU with JPEG stores, DCT-scaled decodes in worker processes (clips out); otherwise
    :func:`~gpufeed.pipelines._store_pipeline.build_store_pipeline`, every frame of a batch through
    one image decoder (``batch_size x T`` frames out, which the loader regroups), the files read in
    worker processes. ``build=False``: defined only (the tests read its graph).
    """
    rows = StreamRows(stream, loader.table, train=loader.train, seed=loader.seed, batch_size=loader.batch_size)
    infos = loader.dataset.infos
    stores = [StoreRef.from_info(info) if info.store else None for info in infos]
    shape = {"clip_length_frames": loader.geometry.clip_length_frames, "stride_frames": loader.geometry.stride_frames}
    out, fit = loader.video_cfg.output_size, loader.video_cfg.fit
    sizes = np.array([(info.width, info.height) for info in infos])
    scaled, t = loader._scaled_jpeg, loader.geometry.clip_length_frames
    roi, regions = None, sizes  # regions: (width, height) of the part of each frame the resize reads
    if fit == "centre_crop":  # store frames are samples of their own: a clip's region once per frame
        roi = RoiFeed(
            lambda k: rows(k)[0], sizes, out.width_px / out.height_px, relative=scaled, repeat=1 if scaled else t
        )
        starts, ends = centre_rois(sizes, out.width_px / out.height_px)
        regions = (ends - starts)[:, ::-1]
    method, why = worker_start_method(getattr(loader.cfg, "worker_start_method", "auto"))
    decode = {"max_pixels": loader.dataset.max_pixels, "fast_idct": loader.video_cfg.jpeg_idct == "fast"}
    if scaled:
        decoded = jpeg_decode_sizes(sizes, regions, out)
        clips = ScaledJpegClips(rows, stores, decoded, batch_size=loader.batch_size, **shape, **decode)
        log.info("starting %d JPEG decoding worker process(es) with %s (%s)", loader.num_threads, method, why)
        return build_clip_pipeline(source="frames", clip_input=clips, roi_feed=roi, start_method=method, **common)
    used = {infos[v].store for v in np.unique(loader.table.slot_video)}
    feed = StoreFrameFeed(rows, stores, batch_size=loader.batch_size, mode=channel_mode(used), **shape, **decode)
    if build:
        workers = store_read_workers(loader.num_threads)
        log.info("starting %d frame-reading worker process(es) with %s (%s)", workers, method, why)
    args = {k: v for k, v in common.items() if k not in ("clip_length_frames", "stride_frames")}
    return build_store_pipeline(feed, roi_feed=roi, start_method=method, build=build, **args)
