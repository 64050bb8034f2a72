"""The DALI clip graph: decode exactly the planned clips, then one fused resize and a layout change.

Stages and what each outputs (dtype and rank checked when the pipeline is built):

==============  ===========================================================  =====================
stage           output                                                       where
==============  ===========================================================  =====================
decode          uint8 (T, H, W, 3) "FHWC" per clip + its plan row (int32)     see below
crop window     roi_start/roi_end (y, x) of the central square (centre_crop)  CPU (external_source)
resize          uint8 (T, S, S, 3): crop and resize fused, bilinear+antialias  GPU, or CPU
augment         uint8 (T, S, S, 3): one colour matrix and flip per clip        GPU, or CPU (optional)
transpose       uint8 (3, T, S, S) "CFHW" (frame chunks: (T, 3, S, S) "FCHW")  GPU, or CPU
==============  ===========================================================  =====================

(PyAV sources fit the frames while converting them from YUV, one swscale pass per frame, and
hand over (T, S, S, 3): on a CPU that pass costs a fraction of a full-size conversion plus a
separate resize. Crop window and resize then apply to the DALI reader only.)

Decode, by ``source``:

* ``"dali"``: ``fn.experimental.readers.video`` over a file list of the epoch plan in
  ``frames`` format (``path row start end``, one line per clip, ``end = start + L * stride``
  exclusive), so the reader seeks exactly where gpufeed's sampler says, in plan order, never
  shuffling. ``device="gpu"`` decodes on NVDEC (h264, hevc, vp8, vp9, av1, mpeg4, mjpeg);
  ``device="cpu"`` uses FFmpeg inside DALI (vp8, vp9, mjpeg only).
* ``"pyav"``: :class:`gpufeed.pipelines._pyav.ClipSource` in a parallel ``external_source``
  (one worker process per thread), seeking with PyAV to the keyframe at or before each clip.

Both give the same frames, fitted the same way (stretch or central square, area-weighted when
shrinking), so the outputs follow one contract; pixel values differ by the filters' rounding.
"""

from __future__ import annotations

import gc
import os
import tempfile
from pathlib import Path

import numpy as np

from gpufeed.pipelines._augment import AugmentRows, augment_graph

__all__ = ["READER_NAME", "RowFeed", "build_clip_pipeline", "centre_square_rois", "dali_iterator", "new_work_dir"]

READER_NAME = "clip_reader"


class RowFeed:
    """Batch-mode ``external_source`` callback: per-row columns, batch by batch, in plan order.

    Past the last row it repeats the last row, as the reader pads its last batch.
    """

    def __init__(self, columns: list[np.ndarray], batch_size: int) -> None:
        self._columns = columns
        self._batch_size = batch_size
        self._count = len(columns[0])
        self._next = 0

    def __call__(self):
        index = np.minimum(np.arange(self._next, self._next + self._batch_size), self._count - 1)
        self._next += self._batch_size
        return [list(column[index]) for column in self._columns]


def centre_square_rois(sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(roi_start, roi_end) in (y, x) order for the central square of frames of (width, height)."""
    width = sizes[:, 0].astype(np.float32)
    height = sizes[:, 1].astype(np.float32)
    side = np.minimum(width, height)
    y0, x0 = np.floor((height - side) / 2), np.floor((width - side) / 2)
    return np.stack([y0, x0], axis=1), np.stack([y0 + side, x0 + side], axis=1)


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


def write_file_list(folder: Path, paths: list[str], video_ids, starts, clip_length_frames, stride_frames) -> Path:
    """The reader's file list: one ``path row start end`` line per plan row (``frames`` format)."""
    safe = _safe_paths(paths, folder)
    end = np.asarray(starts) + clip_length_frames * stride_frames
    lines = [f"{safe[v]} {row} {s} {e}\n" for row, (v, s, e) in enumerate(zip(video_ids, starts, end, strict=True))]
    list_path = folder / "clips.txt"
    list_path.write_text("".join(lines), encoding="utf-8")
    return list_path


def build_clip_pipeline(
    *,
    source: str,
    paths: list[str],
    video_ids: np.ndarray,
    starts: np.ndarray,
    frame_sizes: np.ndarray,
    clip_length_frames: int,
    stride_frames: int,
    size_px: int,
    fit: str,
    batch_size: int,
    device_id: int | None,
    num_threads: int,
    prefetch_queue_depth: int,
    seed: int,
    work_dir: Path,
    video_refs: list | None = None,
    frames_first: bool = False,
    augment: AugmentRows | None = None,
):
    """Build (not yet run) the DALI pipeline for one epoch plan.

    Args:
        source: ``"dali"`` (DALI's video reader), ``"pyav"`` (PyAV keyframe seeks, one worker
            process per thread) or ``"pyav_sequential"`` (one PyAV pass through video
            ``video_ids[0]`` in chunks of ``clip_length_frames``, for the sequential reader).
        paths: Video files by video id.
        video_ids, starts: The plan rows: which video, which first frame.
        frame_sizes: (rows, 2) (width, height) of each row's video, for ``centre_crop``.
        fit: ``"stretch"`` (whole frame) or ``"centre_crop"`` (central square).
        device_id: CUDA device (NVDEC decoding, GPU resize); ``None`` runs on the CPU.
        work_dir: Folder for the reader's file list (kept while the pipeline lives).
        video_refs: :class:`~gpufeed.pipelines._pyav.VideoRef` per video id (PyAV sources only).
        frames_first: Output (T, 3, S, S) "FCHW" (a chunk of frames) instead of (3, T, S, S).
        augment: Loader augmentation, one row per plan row (the same on every frame of a clip);
            ``None``: none.

    Returns:
        A built pipeline with outputs ``(clips uint8 (3, T, S, S), rows int32 (1,))`` per sample.
    """
    from nvidia.dali import fn, pipeline_def, types

    if source not in ("dali", "pyav", "pyav_sequential"):
        raise ValueError(f"source {source!r} is not allowed; allowed: dali, pyav, pyav_sequential")
    if fit not in ("stretch", "centre_crop"):
        raise ValueError(f"fit {fit!r} is not allowed; allowed: stretch, centre_crop")
    rows = len(starts)
    if not (len(video_ids) == rows == len(frame_sizes)) or rows == 0:
        raise ValueError(f"plan rows disagree or are empty: {len(video_ids)} videos, {rows} starts")
    if augment is not None and len(augment) not in (0, rows):
        raise ValueError(f"{len(augment)} augmentation rows for {rows} plan rows: they must match one to one")
    on_gpu = device_id is not None
    list_file = None
    if source == "dali":
        list_file = write_file_list(work_dir, paths, video_ids, starts, clip_length_frames, stride_frames)

    @pipeline_def(enable_conditionals=False)
    def clip_graph():
        if source == "dali":
            frames, row = fn.experimental.readers.video(
                device="gpu" if on_gpu else "cpu",
                file_list=str(list_file),
                file_list_format="frames",
                file_list_include_end=False,
                sequence_length=clip_length_frames,
                stride=stride_frames,
                random_shuffle=False,
                pad_last_batch=True,
                image_type=types.RGB,
                name=READER_NAME,
            )
        elif source == "pyav":
            from gpufeed.pipelines._pyav import ClipSource

            clip_source = ClipSource(
                video_refs, video_ids, starts, clip_length_frames, stride_frames, size_px=size_px, fit=fit
            )
            frames, row = fn.external_source(
                source=clip_source,
                num_outputs=2,
                batch=False,
                parallel=True,
                prefetch_queue_depth=max(2, prefetch_queue_depth),
                layout=["FHWC", None],
                dtype=[types.UINT8, types.INT32],
            )
        else:
            from gpufeed.pipelines._pyav import SequentialFeed

            frames, row = fn.external_source(
                source=SequentialFeed(video_refs[int(video_ids[0])], clip_length_frames, size_px=size_px, fit=fit),
                num_outputs=2,
                batch=False,
                layout=["FHWC", None],
                dtype=[types.UINT8, types.INT32],
            )
        if on_gpu and source != "dali":
            frames = frames.gpu()
        if source == "dali":
            resize_args = {}
            if fit == "centre_crop":
                roi_start, roi_end = fn.external_source(
                    source=RowFeed(list(centre_square_rois(frame_sizes)), batch_size),
                    num_outputs=2,
                    batch=True,
                    dtype=[types.FLOAT, types.FLOAT],
                )
                resize_args = {"roi_start": roi_start, "roi_end": roi_end, "roi_relative": False}
            frames = fn.resize(
                frames,
                size=(size_px, size_px),
                interp_type=types.INTERP_LINEAR,
                antialias=True,
                dtype=types.UINT8,
                **resize_args,
            )
        # Augmentation seam: per-clip colour matrix and flip, on every frame of the clip.
        frames = augment_graph(frames, augment, batch_size)
        if frames_first:
            clips = fn.transpose(frames, perm=[0, 3, 1, 2], output_layout="FCHW")
        else:
            clips = fn.transpose(frames, perm=[3, 0, 1, 2], output_layout="CFHW")
        return clips, row

    workers = {}
    if source == "pyav":
        # Fork is unsafe once CUDA is initialised, so GPU processes spawn (their scripts need the
        # usual `if __name__ == "__main__":` guard, as with torch's DataLoader). A forked worker also
        # inherits the parent's unreachable DALI pipelines and crashes if its garbage collector
        # finalises one: collect them in the parent first.
        gc.collect()
        workers = {"py_num_workers": num_threads, "py_start_method": "spawn" if on_gpu else "fork"}
    pipe = clip_graph(
        batch_size=batch_size,
        num_threads=num_threads,
        device_id=device_id,
        prefetch_queue_depth=prefetch_queue_depth,
        seed=seed,
        exec_dynamic=True,
        **workers,
    )
    pipe.build()
    _check_outputs(pipe, source, rows)
    return pipe


def _check_outputs(pipe, source: str, rows: int) -> None:
    from nvidia.dali import types

    dtypes, ndims = pipe.output_dtype(), pipe.output_ndim()
    if dtypes[0] not in (types.UINT8, None) or ndims[0] not in (4, None):
        raise RuntimeError(f"clip pipeline outputs {dtypes[0]} with {ndims[0]} dims; expected uint8 (3, T, S, S)")
    if source == "dali":
        size = pipe.reader_meta(READER_NAME)["epoch_size"]
        if size != rows:
            raise RuntimeError(
                f"DALI's video reader accepted {size} of the {rows} planned clips; a clip range outside its video "
                "or an unreadable file was dropped. Run 'gpufeed check' on the videos."
            )


def dali_iterator(pipe, names: list[str], *, source: str, size: int):
    """A ``DALIGenericIterator`` that stops at the plan's end and keeps a partial last batch.

    The reader path counts through the reader (``reader_name``); external sources have no reader,
    so the iterator gets the exact row count and the feeds pad past it, as DALI expects.
    """
    import warnings

    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    policy = {"last_batch_policy": LastBatchPolicy.PARTIAL, "auto_reset": False, "dynamic_shape": True}
    if source == "dali":
        return DALIGenericIterator(pipe, names, reader_name=READER_NAME, **policy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DALI's advice to prefer reader_name; there is no reader here
        return DALIGenericIterator(pipe, names, size=size, last_batch_padded=True, **policy)


def new_work_dir() -> tempfile.TemporaryDirectory:
    """A temporary folder for one pipeline's file list and links (removed with the object)."""
    return tempfile.TemporaryDirectory(prefix="gpufeed-clips-")
