"""The DALI graph of frame-store clips: every frame of a plan batch through one image decoder.

==============  ============================================================  =====================
stage           output, per sample (one frame of a clip)                       where
==============  ============================================================  =====================
feed            encoded frame (uint8), its clip's tag, (channel matrix)        DALI's worker processes
                                                                               (or this thread)
decode          uint8 (H, W, 3) RGB, the whole frame                           GPU ("mixed") or CPU
resize          uint8 (h, w, 3): the crop window (centre_crop) and resize      GPU or CPU
(channels)      HDF5 frames' channels put back                                 GPU or CPU
augment         one colour matrix and flip per clip, on each of its frames     GPU or CPU (optional)
(layout)        as is, or (3, h, w) "CHW" for the sequential reader            GPU or CPU
==============  ============================================================  =====================

The pipeline's batch is ``batch_size x T`` frames, clip ``j``'s frame ``t`` at sample ``j T + t``
(:class:`~gpufeed.pipelines._store_feed.StoreFrameFeed`); the per-clip inputs (crop window,
augmentation) come from their feeds repeated ``T`` times, so every frame of a clip gets its clip's
parameters, as the clip graph gives them to a whole sequence. Every frame is resized alone with
the same arguments as in a (T, H, W, 3) sequence, where DALI resizes each frame the same way. The
outputs' first axis is ``batch_size x T``: the loader views every ``T`` consecutive frames as one
clip, and checks every frame's tag against its clip's.
"""

from __future__ import annotations

import contextlib
from typing import Any

from gpufeed.core import SizePx, gc_frozen_for_fork
from gpufeed.pipelines._crop_windows import resize_args
from gpufeed.pipelines._executor import executor_args

__all__ = ["STORE_READ_WORKERS", "build_store_pipeline", "store_read_workers"]

# Most worker processes reading frame-store files for one pipeline. Reading (and checking each
# frame's header) costs far less than decoding: on the shared 2-core development machine, under
# load 5-7, one worker handed DALI 2,700-5,400 frames/s of 77 KB 256x256 JPEG frames (the feed alone
# in a parallel external_source, no decoder), a rate the machine's load holds down; four cover the
# 12,000 frames/s target even at that rate, and a GPU host's free cores do better.
STORE_READ_WORKERS = 4


def store_read_workers(num_threads: int) -> int:
    """Worker processes reading a store pipeline's files: :data:`STORE_READ_WORKERS`, at most ``num_threads``."""
    return max(1, min(STORE_READ_WORKERS, num_threads))


def fitted_frames(outputs, feed, *, size_px: SizePx, roi_feed, on_gpu: bool, gpu_options: dict | None = None):
    """Graph fragment: the feed's frames decoded, fitted to ``size_px`` and in RGB order.

    Args:
        outputs: The feed's ``external_source`` outputs (encoded frame, tag, and the channel matrix
            of ``per_clip`` frames).
        feed: The :class:`~gpufeed.pipelines._store_feed.StoreFrameFeed` (its channel ``mode``, its IDCT).
        size_px: Output frame size.
        roi_feed: The crop windows' feed (``centre_crop``), or ``None`` to stretch the whole frame.
        on_gpu: Decode with nvJPEG and resize on the GPU.
        gpu_options: nvJPEG's arguments there (:func:`~gpufeed.pipelines._decoder_options.gpu_decoder_options`:
            threads unpinned, the hardware decoder's share, buffer sizes).

    Returns:
        uint8 (h, w, 3) RGB frames.
    """
    from nvidia.dali import fn, types

    # The CPU decoder's default IDCT is the exact one (bit-equal to Pillow's and OpenCV's decode);
    # the fast one (video.jpeg_idct: fast) decoded 1.5x faster but about a level off on average.
    fast: dict[str, Any] = {"use_fast_idct": True} if feed.fast_idct and not on_gpu else {}
    if on_gpu:
        fast.update(gpu_options or {})
    # Any: DALI's stubs type an operator's result as a node, a sequence of them or None.
    frames: Any = fn.decoders.image(outputs[0], device="mixed" if on_gpu else "cpu", output_type=types.RGB, **fast)
    frames = fn.resize(frames, **resize_args(size_px, roi_feed))
    # HDF5 channels put back after the resize, on far fewer pixels (decoding straight to BGR cost
    # the CPU decoder 20-50% of its throughput, measured).
    if feed.mode == "bgr":
        frames = frames[:, :, ::-1]
    elif feed.mode == "per_clip":
        frames = fn.coord_transform(frames, M=outputs[2], dtype=types.UINT8)
    return frames


def _read_workers(num_threads: int, start_method: str) -> dict:
    """The pipeline arguments of its file-reading worker processes."""
    return {"py_num_workers": store_read_workers(num_threads), "py_start_method": start_method}


def build_store_pipeline(
    feed,
    *,
    size_px: SizePx,
    fit: str,
    batch_size: int,
    device_id: int | None,
    num_threads: int,
    prefetch_queue_depth: int,
    seed: int,
    roi_feed=None,
    parallel: bool = True,
    start_method: str = "fork",
    frames_first: bool = False,
    augment=None,
    gpu_options: dict | None = None,
    executor: str = "auto",
    build: bool = True,
):
    """Build (not yet run) a frame-store clip pipeline over ``feed`` (see the module docs).

    Args:
        feed: A :class:`~gpufeed.pipelines._store_feed.StoreFrameFeed` of ``batch_size`` clips an iteration.
        size_px: Output frame size, the config's ``size_px``.
        fit: ``"stretch"`` or ``"centre_crop"`` (then ``roi_feed``, built with ``repeat=T``).
        batch_size: Clips per iteration; the pipeline's batch is ``batch_size x T`` frames.
        device_id: CUDA device (nvJPEG, GPU resize); ``None`` runs on the CPU.
        parallel: Read the files in DALI's worker processes (:func:`store_read_workers` of them)
            instead of the thread that runs the pipeline.
        start_method: ``"fork"`` or ``"spawn"`` for those workers.
        frames_first: Output (3, h, w) "CHW" frames instead of (h, w, 3).
        augment: A :class:`~gpufeed.pipelines._augment.StreamAugmentFeed` built with ``repeat=T``.
        gpu_options: nvJPEG's arguments on a GPU (see :func:`fitted_frames`).
        executor: ``loader.executor`` (:func:`~gpufeed.pipelines._executor.executor_args`).
        build: ``False`` returns the pipeline defined but not built (no worker, no device needed).

    Returns:
        A pipeline with outputs ``(frames uint8 (h, w, 3), tag int64 (1,))`` per frame.
    """
    from nvidia.dali import fn, pipeline_def, types

    if fit not in ("stretch", "centre_crop"):
        raise ValueError(f"fit {fit!r} is not allowed; allowed: stretch, centre_crop")
    if fit == "centre_crop" and roi_feed is None:
        raise ValueError("the frames source with fit centre_crop needs a roi_feed")
    on_gpu = device_id is not None
    frames_per_batch = batch_size * feed.clip_length_frames

    @pipeline_def(enable_conditionals=False)
    def store_graph():
        dtypes = [types.UINT8, types.INT64] + ([types.FLOAT] if feed.mode == "per_clip" else [])
        extra = {"parallel": True, "prefetch_queue_depth": max(2, prefetch_queue_depth)} if parallel else {}
        outputs = fn.external_source(source=feed, num_outputs=feed.num_outputs, batch=False, dtype=dtypes, **extra)
        roi = roi_feed if fit == "centre_crop" else None
        frames = fitted_frames(outputs, feed, size_px=size_px, roi_feed=roi, on_gpu=on_gpu, gpu_options=gpu_options)
        if augment is not None:
            frames = augment.apply(frames)
        if frames_first:
            frames = fn.transpose(frames, perm=[2, 0, 1], output_layout="CHW")
        return frames, outputs[1]

    workers = _read_workers(num_threads, start_method) if parallel else {}
    pipe = store_graph(
        batch_size=frames_per_batch,
        num_threads=num_threads,
        device_id=device_id,
        prefetch_queue_depth=prefetch_queue_depth,
        seed=seed,
        **executor_args(device_id is not None, executor),
        **workers,
    )
    if build:
        # A forked worker inherits the parent's unreachable DALI pipelines and crashes if its garbage
        # collector finalises one: they are frozen out of its reach (gc_frozen_for_fork).
        with gc_frozen_for_fork() if parallel and start_method == "fork" else contextlib.nullcontext():
            pipe.build()
    return pipe
