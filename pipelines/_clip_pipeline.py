"""The DALI clip graph: decode exactly the planned clips, then one fused resize (no layout change).

Stages and what each outputs (dtype and rank checked when the pipeline is built):

==============  ===========================================================  =====================
stage           output                                                       where
==============  ===========================================================  =====================
decode          uint8 (T, H, W, 3) "FHWC" per clip + its tag (int)             see below
crop window     roi_start/roi_end (y, x) of the central region (centre_crop)  CPU (external_source)
resize          uint8 (T, H, W, 3): crop and resize fused, bilinear+antialias  GPU, or CPU
augment         uint8 (T, H, W, 3): one colour matrix and flip per clip        GPU, or CPU (optional)
(layout)        uint8 (T, H, W, 3) "FHWC" as is (frame chunks: (T, 3, H, W) "FCHW")  GPU, or CPU
==============  ===========================================================  =====================

(PyAV sources fit the frames while converting them from YUV, one swscale pass per frame, and
hand over (T, H, W, 3): on a CPU that pass costs a fraction of a full-size conversion plus a
separate resize. Crop window and resize then apply to the DALI reader only.)

Decode, by ``source``; every pipeline iteration is one plan batch of a
:class:`~gpufeed.pipelines._sampler.PlanStream`, always ``batch_size`` rows (a short plan batch is
filled with rows the loader drops), and the tag of plan row ``j`` of iteration ``k`` is
``k * batch_size + j``:

* ``"dali"``: ``fn.experimental.readers.video`` over a file list in ``frames`` format (``path tag
  start end``, one line per row, ``end = start + L * stride`` exclusive), written for the
  stream's first iterations (:func:`write_stream_list`), so the reader seeks exactly where
  gpufeed's sampler says, never shuffling; within each batch the rows are ordered by (video,
  start) (:func:`reader_order`), each file opened once per batch, and the loader restores plan
  order from the tags. DALI's reader takes its list when it is
  built, so a list covers whole epochs within :data:`LIST_LINES` lines, or that many lines of an
  epoch too long for them (a new pipeline continues after them; :mod:`._nvdec_reader` says what a
  build costs). ``device="gpu"`` decodes on NVDEC (h264, hevc, vp8, vp9, av1, mpeg4, mjpeg),
  resizing inside the reader where DALI can; ``device="cpu"`` uses FFmpeg (vp8, vp9, mjpeg only).
* ``"pyav"``: :class:`gpufeed.pipelines._pyav.ClipSource` in a parallel ``external_source``
  (one worker process per thread, started once), seeking with PyAV to the keyframe at or before
  each clip.
* ``"pyav_sequential"``: :class:`gpufeed.pipelines._pyav.SequentialFeed`, one video front to back.
* ``"frames"``: on a CPU, stores of JPEG frames decoded DCT-scaled by a
  :class:`~gpufeed.pipelines._store_feed.ScaledJpegClips` in a parallel ``external_source``
  (worker processes, as for PyAV), the crop window a region relative to the frame. Every other
  frame store has a graph of its own, every frame of a batch through one image decoder
  (:mod:`gpufeed.pipelines._store_pipeline`).

Why a file list and not ``fn.decoders.video`` on in-memory files: that decoder needs each clip's
whole file as its input and indexes it per sample; measured on a CPU (VP9, 256x256, 1,800
frames, 8.5 MB), a batch of 8 random clips took 1.48 s that way against 0.10-0.14 s with the
reader, whose set-up costs about 66 us per list line (files are indexed once per process).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np

from gpufeed._procs import forked_children_die_with_me
from gpufeed._size import SizePx, parse_size_px
from gpufeed.pipelines._augment import StreamAugmentFeed
from gpufeed.pipelines._store_feed import ScaledJpegClips

__all__ = [
    "LIST_LINES",
    "READER_NAME",
    "ReaderList",
    "RoiFeed",
    "StreamRows",
    "build_clip_pipeline",
    "centre_rois",
    "fill_rows",
    "new_work_dir",
    "reader_order",
    "reader_rows",
    "write_stream_list",
]

READER_NAME = "clip_reader"

# Most lines a reader's file list gets: DALI constructs a decoder per line while building (about
# 66 us a line on a shared 2-core CPU; on a GPU also an NVDEC parser and 8 full-size frame buffers).
LIST_LINES = 8192
# Most epochs one list covers, however small an epoch is.
LIST_EPOCHS = 32


def centre_rois(sizes: np.ndarray, output_aspect: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(roi_start, roi_end) in (y, x) order of the largest central region of ``output_aspect``.

    ``sizes`` are the frames' (width, height); ``output_aspect`` is the output's width / height
    (1: the central square), so the region resizes to the output without distortion.
    """
    width = sizes[:, 0].astype(np.float32)
    height = sizes[:, 1].astype(np.float32)
    region_w = np.minimum(width, height * np.float32(output_aspect))
    region_h = np.minimum(height, region_w / np.float32(output_aspect))
    y0, x0 = np.floor((height - region_h) / 2), np.floor((width - region_w) / 2)
    return np.stack([y0, x0], axis=1), np.stack([y0 + region_h, x0 + region_w], axis=1)


class RoiFeed:
    """Batch-mode ``external_source`` callback: the centre-crop ROIs of iteration after iteration.

    Args:
        rows: ``rows(k) -> video ids`` of iteration ``k``'s ``batch_size`` rows (filled, as the
            reader's list is).
        frame_sizes: (videos, 2) (width, height) per video id.
        output_aspect: The output's width / height (see :func:`centre_rois`).
        relative: Give the regions as fractions of the frame's height and width (for frames
            decoded at another size than the stored one, see ``ScaledJpegClips``).
        repeat: Samples per row: each row's region that many times (frame stores lay a clip out
            as ``T`` samples, see :mod:`gpufeed.pipelines._store_pipeline`).
    """

    def __init__(
        self,
        rows: Callable[[int], np.ndarray],
        frame_sizes: np.ndarray,
        output_aspect: float = 1.0,
        *,
        relative: bool = False,
        repeat: int = 1,
    ) -> None:
        self.rows, self.relative, self.repeat = rows, relative, repeat
        self.starts, self.ends = centre_rois(np.asarray(frame_sizes), output_aspect)
        if relative:
            hw = np.asarray(frame_sizes, dtype=np.float32)[:, ::-1]
            self.starts, self.ends = self.starts / hw, self.ends / hw
        self.iteration = 0

    def __call__(self):
        videos = np.repeat(self.rows(self.iteration), self.repeat)
        self.iteration += 1
        return list(self.starts[videos]), list(self.ends[videos])


def _safe_paths(paths: list[str], folder: Path) -> list[str]:
    """DALI's file list splits on whitespace: link paths that contain any under plain names."""
    safe = []
    for k, path in enumerate(paths):
        if any(ch.isspace() for ch in path):
            link = folder / f"video_{k:06d}{Path(path).suffix}"
            if not link.exists():
                os.symlink(os.path.abspath(path), link)
            path = str(link)
        safe.append(path)
    return safe


def write_file_list(folder: Path, paths: list[str], video_ids, starts, span_frames: int, tags=None) -> Path:
    """A reader file list: one ``path tag start end`` line per row (``frames`` format).

    Args:
        span_frames: ``end - start`` of every line (``clip_length_frames * stride_frames``).
        tags: The label of each line (default: its line number).
    """
    safe = _safe_paths(paths, folder)
    starts = np.asarray(starts, dtype=np.int64)
    tags = np.arange(len(starts)) if tags is None else np.asarray(tags)
    lines = [f"{safe[v]} {t} {s} {s + span_frames}\n" for v, t, s in zip(video_ids, tags, starts, strict=True)]
    list_path = folder / "clips.txt"
    list_path.write_text("".join(lines), encoding="utf-8")
    return list_path


def fill_rows(videos: np.ndarray, starts: np.ndarray, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """A plan batch's (video ids, starts) filled to ``batch_size`` rows by repeating the last."""
    fill = batch_size - len(videos)
    if fill:
        videos = np.concatenate([videos, np.full(fill, videos[-1])])
        starts = np.concatenate([starts, np.full(fill, starts[-1])])
    return videos, starts


def stream_rows(stream, table, *, train: bool, seed: int, batch_size: int, iteration: int):
    """(video ids, starts) of iteration ``iteration``'s rows in plan order, filled to ``batch_size``."""
    batch = stream[iteration]
    videos, starts = table.clips(batch.sample_ids, train=train, seed=seed, epoch=batch.epoch)
    return fill_rows(videos, starts, batch_size)


class StreamRows:
    """:func:`stream_rows` as a picklable ``rows(k)`` callable, for feeds run by worker processes."""

    def __init__(self, stream, table, *, train: bool, seed: int, batch_size: int) -> None:
        self.stream, self.table, self.train, self.seed, self.batch_size = stream, table, train, seed, batch_size

    def __call__(self, iteration: int) -> tuple[np.ndarray, np.ndarray]:
        return stream_rows(
            self.stream, self.table, train=self.train, seed=self.seed, batch_size=self.batch_size, iteration=iteration
        )


def reader_order(videos: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The order DALI's reader gets one batch's rows in: by (video, start), plan rows as positions.

    DALI's video reader decodes a batch's rows one after another and builds a new decoder (on a
    GPU, an NVDEC session) whenever the file changes from the previous row; in shuffled plan
    order nearly every row changes file. Sorted, each file is opened once per batch and its clips
    are read forward. Row ``r`` the reader outputs is plan row ``order[r]``; its tag says so, and
    the loader puts the rows back in plan order.
    """
    return np.lexsort((np.asarray(starts), np.asarray(videos)))


def reader_rows(stream, table, *, train: bool, seed: int, batch_size: int, iteration: int):
    """(video ids, starts, plan row of each) of iteration ``iteration`` in :func:`reader_order`."""
    videos, starts = stream_rows(stream, table, train=train, seed=seed, batch_size=batch_size, iteration=iteration)
    order = reader_order(videos, starts)
    return videos[order], starts[order], order


def list_iterations(stream, batch_size: int, max_lines: int | None = None) -> tuple[int, bool]:
    """(iterations a reader list for ``stream`` covers, whether it stops inside the starting epoch).

    Whole epochs within ``max_lines`` lines (default :data:`LIST_LINES`); when the rest of the
    starting epoch alone is longer, as many of its batches as fit (at least one): DALI constructs
    a decoder per line while building, so a list as long as a large epoch would stall every build.
    """
    max_lines = LIST_LINES if max_lines is None else max_lines
    most = max(1, max_lines // batch_size)
    first = stream.iterations_until(stream.epoch + 1)  # the rest of the starting epoch
    if first > most:
        return most, True
    iterations = first
    for epochs in range(1, LIST_EPOCHS):
        more = stream.iterations_until(stream.epoch + epochs + 1)
        if more > most:
            break
        iterations = more
    return iterations, False


class ReaderList(NamedTuple):
    """A reader's file list: where it is, what it covers, and its rows' videos (for the log's figures).

    Attributes:
        path: The list file.
        iterations: Pipeline iterations (batches) it covers.
        capped: Whether it stops inside the starting epoch (:func:`list_iterations`).
        videos: Video id of every line, in list (reader) order.
        plan_videos: The same rows' video ids in plan order.
    """

    path: Path
    iterations: int
    capped: bool
    videos: np.ndarray
    plan_videos: np.ndarray


def write_stream_list(folder: Path, paths: list[str], stream, table, *, train, seed, batch_size) -> ReaderList:
    """The reader's file list for the stream's first iterations (:func:`list_iterations`)."""
    iterations, capped = list_iterations(stream, batch_size)
    videos, starts, tags, plan_videos = [], [], [], []
    for k in range(iterations):
        v, s, order = reader_rows(stream, table, train=train, seed=seed, batch_size=batch_size, iteration=k)
        videos.append(v)
        starts.append(s)
        tags.append(k * batch_size + order)  # the plan row each line is
        plan_videos.append(v[np.argsort(order)])
    span = table.geometry.clip_length_frames * table.geometry.stride_frames
    rows = (np.concatenate(videos), np.concatenate(starts))
    path = write_file_list(folder, paths, *rows, span, np.concatenate(tags))
    return ReaderList(path, iterations, capped, rows[0], np.concatenate(plan_videos))


def build_clip_pipeline(
    *,
    source: str,
    clip_input,
    clip_length_frames: int,
    stride_frames: int,
    size_px: SizePx | int,
    fit: str,
    batch_size: int,
    device_id: int | None,
    num_threads: int,
    prefetch_queue_depth: int,
    seed: int,
    roi_feed: RoiFeed | None = None,
    start_method: str = "fork",
    frames_first: bool = False,
    augment: StreamAugmentFeed | None = None,
    fused_resize: bool = False,
):
    """Build (not yet run) a clip pipeline.

    Args:
        source: ``"dali"`` (DALI's video reader over the file list ``clip_input``), ``"pyav"``
            (``clip_input`` is a :class:`~gpufeed.pipelines._pyav.ClipSource`, run by one worker
            process per thread), ``"pyav_sequential"`` (a
            :class:`~gpufeed.pipelines._pyav.SequentialFeed`, in this process) or ``"frames"``
            (a :class:`~gpufeed.pipelines._store_feed.ScaledJpegClips`; other frame stores go
            through :func:`gpufeed.pipelines._store_pipeline.build_store_pipeline`).
        size_px: Output frame size, (width_px, height_px) or one number for a square.
        fit: ``"stretch"`` (whole frame) or ``"centre_crop"`` (central region of the output's
            aspect ratio; the ``"dali"`` and ``"frames"``
            sources then need ``roi_feed``, PyAV sources fit frames themselves).
        device_id: CUDA device (NVDEC decoding, GPU resize); ``None`` runs on the CPU.
        start_method: ``"fork"`` or ``"spawn"`` for the PyAV workers.
        frames_first: Output (T, 3, H, W) "FCHW" (a chunk of frames) instead of (T, H, W, 3) "FHWC".
        augment: Loader augmentation fed iteration by iteration, one parameter row per clip (the
            same on every frame of it); ``None``: none.
        fused_resize: The ``"dali"`` source on a GPU resizes inside the reader
            (``fn.experimental.readers.video_resize``, where this DALI has it: see
            :func:`gpufeed.pipelines._nvdec_reader.fused_reader_resize`) instead of in ``fn.resize``.

    Returns:
        A built pipeline with outputs ``(clips uint8 (T, H, W, 3), tag (1,))`` per sample (the
            loader permutes the batch to (N, 3, T, H, W), a channels_last_3d view).
    """
    from nvidia.dali import fn, pipeline_def, types

    out = parse_size_px(size_px)

    if source not in ("dali", "pyav", "pyav_sequential", "frames"):
        raise ValueError(f"source {source!r} is not allowed; allowed: dali, pyav, pyav_sequential, frames")
    if fit not in ("stretch", "centre_crop"):
        raise ValueError(f"fit {fit!r} is not allowed; allowed: stretch, centre_crop")
    if source in ("dali", "frames") and fit == "centre_crop" and roi_feed is None:
        raise ValueError(f"the {source} source with fit centre_crop needs a roi_feed")
    on_gpu = device_id is not None
    if fused_resize and not (source == "dali" and on_gpu):
        raise ValueError("fused_resize is for the dali source on a GPU (NVDEC's reader) only")
    # Frame stores whose feed decodes in DALI's worker processes (ScaledJpegClips, CPU only).
    parallel_frames = source == "frames"
    if parallel_frames and not isinstance(clip_input, ScaledJpegClips):
        raise ValueError("the frames source takes a ScaledJpegClips; other stores: build_store_pipeline")

    @pipeline_def(enable_conditionals=False)
    def clip_graph():
        resize_args = {
            "resize_x": out.width_px,  # DALI names the sides: x is the width, y the height
            "resize_y": out.height_px,
            "interp_type": types.INTERP_LINEAR,
            "antialias": True,
            "dtype": types.UINT8,
        }
        if source in ("dali", "frames") and fit == "centre_crop":
            roi_start, roi_end = fn.external_source(
                source=roi_feed, num_outputs=2, batch=True, dtype=[types.FLOAT, types.FLOAT]
            )
            resize_args.update(roi_start=roi_start, roi_end=roi_end, roi_relative=roi_feed.relative)
        if source == "dali":
            reader_args = {
                "file_list": str(clip_input),
                "file_list_format": "frames",
                "file_list_include_end": False,
                "sequence_length": clip_length_frames,
                "stride": stride_frames,
                "random_shuffle": False,
                "pad_last_batch": True,
                "image_type": types.RGB,
                # One batch of full-size clips waits in the reader, whatever the pipeline's depth.
                "prefetch_queue_depth": 1,
                "name": READER_NAME,
            }
            if fused_resize:  # NVDEC's clips resized inside the reader, never handed on at full size
                frames, tag = fn.experimental.readers.video_resize(device="gpu", **reader_args, **resize_args)
            else:
                frames, tag = fn.experimental.readers.video(device="gpu" if on_gpu else "cpu", **reader_args)
        else:
            parallel = source == "pyav" or parallel_frames
            extra = {"parallel": True, "prefetch_queue_depth": max(2, prefetch_queue_depth)} if parallel else {}
            frames, tag = fn.external_source(
                source=clip_input,
                num_outputs=2,
                batch=False,
                layout=["FHWC", None],
                dtype=[types.UINT8, types.INT64 if parallel else types.INT32],
                **extra,
            )
        if on_gpu and source != "dali":
            frames = frames.gpu()
        if source in ("dali", "frames") and not (source == "dali" and fused_resize):
            frames = fn.resize(frames, **resize_args)
        # Augmentation seam: per-clip colour matrix and flip, on every frame of the clip.
        if augment is not None:
            frames = augment.apply(frames)
        if frames_first:
            return fn.transpose(frames, perm=[0, 3, 1, 2], output_layout="FCHW"), tag
        # No transpose: torch takes (T, H, W, 3) as a permuted view, (3, T, H, W) in channels_last_3d,
        # the layout 3-D convolutions run in (a CFHW transpose here cost a copy, and another back).
        return frames, tag

    workers = {}
    if source == "pyav" or parallel_frames:
        # Started once per pipeline, so once per loader. A forked worker inherits the parent's
        # unreachable DALI pipelines and crashes if its garbage collector finalises one: collect
        # them in the parent first.
        if start_method == "fork":
            import gc

            gc.collect()
        workers = {"py_num_workers": num_threads, "py_start_method": start_method}
    # On a CPU, worker-process sources already decode max(2, depth) batches ahead; a pipeline queue on
    # top made the first batch wait for that many more (prepared h264: first batch 0.40-0.45 s instead
    # of 0.47-0.61 s, steady clips/s the same within noise, load 4-6).
    parallel_cpu = (source == "pyav" or parallel_frames) and not on_gpu
    pipe = clip_graph(
        batch_size=batch_size,
        num_threads=num_threads,
        device_id=device_id,
        prefetch_queue_depth=1 if parallel_cpu else prefetch_queue_depth,
        seed=seed,
        exec_dynamic=True,
        **workers,
    )
    # build() starts the workers: forked ones die with this process (spawned ones arm themselves
    # when their callback is unpickled, see gpufeed._procs), never left blocked on a dead pipeline.
    with forked_children_die_with_me():
        pipe.build()
    _check_outputs(pipe)
    return pipe


def _check_outputs(pipe) -> None:
    from nvidia.dali import types

    dtypes, ndims = pipe.output_dtype(), pipe.output_ndim()
    if dtypes[0] not in (types.UINT8, None) or ndims[0] not in (4, None):
        raise RuntimeError(f"clip pipeline outputs {dtypes[0]} with {ndims[0]} dims; expected uint8 (T, H, W, 3)")


def check_reader_size(pipe, lines: int) -> None:
    """DALI's reader silently drops list lines it cannot use: refuse a pipeline that did."""
    size = pipe.reader_meta(READER_NAME)["epoch_size"]
    if size != lines:
        raise RuntimeError(
            f"DALI's video reader accepted {size} of the {lines} planned clips; a clip range outside its video "
            "or an unreadable file was dropped. Run 'gpufeed check' on the videos."
        )


def new_work_dir() -> tempfile.TemporaryDirectory:
    """A temporary folder for one pipeline's file list and links (removed with the object)."""
    return tempfile.TemporaryDirectory(prefix="gpufeed-clips-")
