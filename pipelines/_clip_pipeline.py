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

(PyAV feeds fit the frames while converting them from YUV, one swscale pass per frame, and hand
over (T, H, W, 3): on a CPU that pass costs a fraction of a full-size conversion plus a separate
resize. Crop window and resize then apply to the inputs whose frames are not fitted.)

Decode, by the graph input a :class:`~gpufeed.pipelines._clip_source.ClipSource` hands over; every
pipeline iteration is one plan batch (:class:`~gpufeed.pipelines._clip_plan.ClipPlan`), always
``batch_size`` rows (a short plan batch is filled with rows the loader drops), and the tag of plan
row ``j`` of iteration ``k`` is ``k * batch_size + j``:

* :class:`ReaderInput`: ``fn.experimental.readers.video`` over a file list in ``frames`` format
  (``path tag start end``, one line per row, ``end = start + L * stride`` exclusive), written for
  the stream's first iterations (:func:`write_stream_list`), so the reader seeks exactly where
  gpufeed's sampler says, never shuffling; within each batch the rows are ordered by (video,
  start) (:func:`reader_order`), each file opened once per batch, and the loader restores plan
  order from the tags. DALI's reader takes its list when it is
  built, so a list covers whole epochs within :data:`LIST_LINES` lines, or that many lines of an
  epoch too long for them (a new pipeline continues after them; :mod:`._nvdec_reader` says what a
  build costs). On a GPU it decodes on NVDEC (h264, hevc, vp8, vp9, av1, mpeg4), resizing
  inside the reader where DALI can; on the CPU it uses FFmpeg (vp8, vp9, mjpeg only).
* :class:`FeedInput`: a per-sample Python callback in an ``external_source``, run by DALI's worker
  processes (``parallel``: one per thread, started once) or in this thread:
  :class:`gpufeed.pipelines._pyav_clips.PyAVClips` (PyAV, seeking to the keyframe at or before each
  clip), :class:`gpufeed.pipelines._pyav_sequential.SequentialFeed` (one video front to back, in
  this thread), both handing frames already fitted; or, on a CPU, stores of JPEG frames decoded
  DCT-scaled by a :class:`~gpufeed.pipelines._store_feed.ScaledJpegClips`, fitted in the worker
  too where every crop window falls on whole decoded pixels, else cropped (a region relative to
  the frame) and resized by the graph. Every other frame store has a graph of its own,
  every frame of a batch through one image decoder (:mod:`gpufeed.pipelines._store_pipeline`).

Why a file list and not ``fn.decoders.video`` on in-memory files: that decoder needs each clip's
whole file as its input and indexes it per sample; measured on a CPU (VP9, 256x256, 1,800
frames, 8.5 MB), a batch of 8 random clips took 1.48 s that way against 0.10-0.14 s with the
reader, whose set-up costs about 66 us per list line (files are indexed once per process).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from gpufeed.core import SizePx, forked_children_die_with_me, gc_frozen_for_fork
from gpufeed.pipelines._augment import StreamAugmentFeed
from gpufeed.pipelines._clip_plan import ClipPlan
from gpufeed.pipelines._crop_windows import RoiFeed, resize_args
from gpufeed.pipelines._executor import executor_args

__all__ = [
    "LIST_LINES",
    "READER_NAME",
    "FeedInput",
    "ReaderInput",
    "ReaderList",
    "build_clip_pipeline",
    "new_work_dir",
    "range_lines",
    "reader_order",
    "write_stream_list",
]

READER_NAME = "clip_reader"

# Most lines a reader's file list gets: DALI constructs a decoder per line while building (about
# 66 us a line on a shared 2-core CPU; on a GPU also an NVDEC parser and 8 full-size frame buffers).
LIST_LINES = 8192
# Most epochs one list covers, however small an epoch is.
LIST_EPOCHS = 32


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


def write_file_list(folder: Path, paths: list[str], video_ids, starts, span_frames, tags=None) -> Path:
    """A reader file list: one ``path tag start end`` line per row (``frames`` format).

    Args:
        span_frames: ``end - start`` of every line (``clip_length_frames * stride_frames``), or of each.
        tags: The label of each line (default: its line number).
    """
    safe = _safe_paths(paths, folder)
    starts = np.asarray(starts, dtype=np.int64)
    ends = starts + np.asarray(span_frames, dtype=np.int64)
    tags = np.arange(len(starts)) if tags is None else np.asarray(tags)
    rows = zip(video_ids, tags, starts, ends, strict=True)
    lines = [f"{safe[v]} {t} {s} {e}\n" for v, t, s, e in rows]
    list_path = folder / "clips.txt"
    list_path.write_text("".join(lines), encoding="utf-8")
    return list_path


def range_lines(starts, span_frames: int) -> tuple[np.ndarray, np.ndarray]:
    """(start, span) of the fewest list lines whose reader samples are the ranges at ``starts``, in order.

    A line holds every sample ``span_frames`` long that starts a multiple of ``span_frames`` after
    its start (the reader's default step is its ``sequence_length``), so ranges that follow one
    another end to end share a line; a range that overlaps the one before starts a new line.
    """
    firsts: list[int] = []
    spans: list[int] = []
    for start in (int(s) for s in starts):
        if firsts and start == firsts[-1] + spans[-1]:
            spans[-1] += span_frames
        else:
            firsts.append(start)
            spans.append(span_frames)
    return np.asarray(firsts, dtype=np.int64), np.asarray(spans, dtype=np.int64)


def reader_order(videos: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The order DALI's reader gets one batch's rows in: by (video, start), plan rows as positions.

    DALI's video reader decodes a batch's rows one after another and builds a new decoder (on a
    GPU, an NVDEC session) whenever the file changes from the previous row; in shuffled plan
    order nearly every row changes file. Sorted, each file is opened once per batch and its clips
    are read forward. Row ``r`` the reader outputs is plan row ``order[r]``; its tag says so, and
    the loader puts the rows back in plan order.
    """
    return np.lexsort((np.asarray(starts), np.asarray(videos)))


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


def write_stream_list(folder: Path, paths: list[str], plan: ClipPlan, max_lines: int | None = None) -> ReaderList:
    """The reader's file list for the plan stream's first iterations (:func:`list_iterations`)."""
    batch_size = plan.batch_size
    iterations, capped = list_iterations(plan.stream, batch_size, max_lines)
    videos, starts, tags, plan_videos = [], [], [], []
    for k in range(iterations):
        rows = plan[k]
        order = reader_order(rows.videos, rows.starts)
        videos.append(rows.videos[order])
        starts.append(rows.starts[order])
        tags.append(k * batch_size + order)  # the plan row each line is
        plan_videos.append(rows.videos)
    geometry = plan.draw.table.geometry
    span = geometry.clip_length_frames * geometry.stride_frames
    listed = (np.concatenate(videos), np.concatenate(starts))
    path = write_file_list(folder, paths, *listed, span, np.concatenate(tags))
    return ReaderList(path, iterations, capped, listed[0], np.concatenate(plan_videos))


class ReaderInput(NamedTuple):
    """A clip graph's input: DALI's video reader over a file list (NVDEC on a GPU, FFmpeg on the CPU).

    Attributes:
        file_list: The list (``path tag start end`` lines, :func:`write_file_list`).
        fused_resize: Resize inside the reader (``fn.experimental.readers.video_resize``, where
            this DALI has it, see :func:`gpufeed.pipelines._nvdec_reader.fused_reader_resize`):
            on a GPU only.
        frame_numbers: Each sample's tag is the number of its first frame (the reader's
            ``enable_frame_num``), not its line's tag: for lines that hold many samples.
    """

    file_list: Path
    fused_resize: bool = False
    frame_numbers: bool = False


class FeedInput(NamedTuple):
    """A clip graph's input: a per-sample callback in an ``external_source``, ``(frames (T, H, W, 3) uint8, tag)``.

    Attributes:
        callback: The callback (picklable when ``parallel``).
        parallel: Run by DALI's worker processes (one per thread, started once per pipeline; tags
            int64) instead of this thread (tags int32).
        fitted: Its frames are at the output size and fit already (PyAV's); otherwise the graph
            crops (``roi_feed``) and resizes them.
    """

    callback: Any
    parallel: bool
    fitted: bool


def _decode(clip_input: ReaderInput | FeedInput, reader_args: dict, resize: dict, on_gpu: bool, depth: int):
    """The graph's decode node: (frames, tag), from DALI's reader or from the callback."""
    from nvidia.dali import fn, types

    if isinstance(clip_input, ReaderInput):
        reader_args = {
            **reader_args,
            "file_list": str(clip_input.file_list),
            "file_list_format": "frames",
            "file_list_include_end": False,
            "random_shuffle": False,
            "pad_last_batch": True,
            "image_type": types.RGB,
            # One batch of full-size clips waits in the reader, whatever the pipeline's depth.
            "prefetch_queue_depth": 1,
            "name": READER_NAME,
            "enable_frame_num": clip_input.frame_numbers,
        }
        if clip_input.fused_resize:  # NVDEC's clips resized inside the reader, never handed on at full size
            resizing = fn.experimental.readers.video_resize  # type: ignore[attr-defined]  # newer DALIs; stubs lack it
            outputs = resizing(device="gpu", **reader_args, **resize)
        else:
            outputs = fn.experimental.readers.video(device="gpu" if on_gpu else "cpu", **reader_args)
        return (outputs[0], outputs[2]) if clip_input.frame_numbers else outputs  # (frames, line tag, first frame)
    parallel = clip_input.parallel
    source_args: dict[str, Any] = {
        "source": clip_input.callback,
        "num_outputs": 2,
        "batch": False,
        "layout": ["FHWC", None],  # the tag has no layout (DALI's stubs say every output has one)
        "dtype": [types.UINT8, types.INT64 if parallel else types.INT32],
    }
    if parallel:
        source_args.update(parallel=True, prefetch_queue_depth=max(2, depth))
    frames, tag = fn.external_source(**source_args)
    return (frames.gpu() if on_gpu else frames), tag


def _check_input(clip_input: ReaderInput | FeedInput, fit: str, roi_feed, on_gpu: bool) -> tuple[bool, bool]:
    """(whether the graph crops and resizes the frames, whether the reader does it itself); refuses what cannot run."""
    if fit not in ("stretch", "centre_crop"):
        raise ValueError(f"fit {fit!r} is not allowed; allowed: stretch, centre_crop")
    resized = not (isinstance(clip_input, FeedInput) and clip_input.fitted)  # PyAV's frames come fitted
    if resized and fit == "centre_crop" and roi_feed is None:
        raise ValueError(f"a {type(clip_input).__name__} whose frames are not fitted needs a roi_feed with centre_crop")
    fused = isinstance(clip_input, ReaderInput) and clip_input.fused_resize
    if fused and not on_gpu:
        raise ValueError("fused_resize is for the dali source on a GPU (NVDEC's reader) only")
    return resized, fused


def build_clip_pipeline(
    *,
    clip_input: ReaderInput | FeedInput,
    clip_length_frames: int,
    stride_frames: int,
    size_px: SizePx,
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
    executor: str = "auto",
    build: bool = True,
):
    """Build (not yet run) a clip pipeline.

    Args:
        clip_input: What decodes: DALI's reader over a file list (:class:`ReaderInput`) or a
            callback (:class:`FeedInput`; frame stores through an image decoder have a graph of
            their own, :func:`gpufeed.pipelines._store_pipeline.build_store_pipeline`).
        size_px: Output frame size, the config's ``size_px``.
        fit: ``"stretch"`` (whole frame) or ``"centre_crop"`` (central region of the output's
            aspect ratio; inputs whose frames are not fitted then need ``roi_feed``).
        device_id: CUDA device (NVDEC decoding, GPU resize); ``None`` runs on the CPU.
        start_method: ``"fork"`` or ``"spawn"`` for a parallel feed's worker processes.
        frames_first: Output (T, 3, H, W) "FCHW" (a chunk of frames) instead of (T, H, W, 3) "FHWC".
        augment: Loader augmentation fed iteration by iteration, one parameter row per clip (the
            same on every frame of it); ``None``: none.
        executor: ``loader.executor`` (:func:`~gpufeed.pipelines._executor.executor_args`).
        build: ``False`` returns the pipeline defined but not built (no worker started).

    Returns:
        A built pipeline with outputs ``(clips uint8 (T, H, W, 3), tag (1,))`` per sample (the
            loader permutes the batch to (N, 3, T, H, W), a channels_last_3d view).
    """
    from nvidia.dali import fn, pipeline_def

    out = size_px
    on_gpu = device_id is not None
    resized, fused = _check_input(clip_input, fit, roi_feed, on_gpu)
    workers = isinstance(clip_input, FeedInput) and clip_input.parallel

    @pipeline_def(enable_conditionals=False)
    def clip_graph():
        resize = resize_args(out, roi_feed if resized and fit == "centre_crop" else None)
        shape = {"sequence_length": clip_length_frames, "stride": stride_frames}
        frames, tag = _decode(clip_input, shape, resize, on_gpu, prefetch_queue_depth)
        if resized and not fused:
            frames = fn.resize(frames, **resize)
        # Augmentation seam: per-clip colour matrix and flip, on every frame of the clip.
        if augment is not None:
            frames = augment.apply(frames)
        if frames_first:
            return fn.transpose(frames, perm=[0, 3, 1, 2], output_layout="FCHW"), tag
        # No transpose: torch takes (T, H, W, 3) as a permuted view, (3, T, H, W) in channels_last_3d,
        # the layout 3-D convolutions run in (a CFHW transpose here cost a copy, and another back).
        return frames, tag

    pool = _pipeline_args(workers, on_gpu, start_method, num_threads, prefetch_queue_depth, executor)
    pipe = clip_graph(batch_size=batch_size, num_threads=num_threads, device_id=device_id, seed=seed, **pool)
    return _built(pipe, forks=workers and start_method == "fork") if build else pipe


def _pipeline_args(workers: bool, on_gpu: bool, start_method: str, num_threads: int, depth: int, executor: str) -> dict:
    """The graph's worker pool and queue depth (the rest of its arguments are the caller's)."""
    pool = {"py_num_workers": num_threads, "py_start_method": start_method} if workers else {}
    # On a CPU, worker-process sources already decode max(2, depth) batches ahead; a pipeline queue on
    # top made the first batch wait for that many more (prepared h264: first batch 0.40-0.45 s instead
    # of 0.47-0.61 s, steady clips/s the same within noise, load 4-6).
    return {"prefetch_queue_depth": 1 if workers and not on_gpu else depth, **executor_args(on_gpu, executor), **pool}


def _built(pipe, forks: bool = False):
    """``pipe`` built (its workers started, forked when ``forks``) and its outputs checked."""
    # build() starts the workers: forked ones die with this process (spawned ones arm themselves
    # when their callback is unpickled, see gpufeed.core._procs), never left blocked on a dead pipeline.
    # A forked worker inherits the parent's unreachable DALI pipelines and crashes if its garbage
    # collector finalises one: they are frozen out of its reach (gc_frozen_for_fork).
    with forked_children_die_with_me(), gc_frozen_for_fork() if forks else contextlib.nullcontext():
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
