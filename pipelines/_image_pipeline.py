"""The DALI image graph: read, decode the crop window only, resize with the flip folded in.

One graph serves a loader for its whole life: a batch-mode ``external_source`` (:class:`ImageFeed`)
hands it, iteration after iteration, the next plan batch of a :class:`~gpufeed.pipelines._sampler.PlanStream`
(epoch after epoch), so nothing is rebuilt at an epoch boundary and DALI keeps prefetching across it.

==============  ==================================================  ===========================
stage           output                                              where
==============  ==================================================  ===========================
feed            per row: file path (uint8), crop window, resize     CPU (external_source)
                ROI, meta (iteration, row, sample id, label, valid)
file read       encoded bytes (``fn.io.file.read``)                 CPU, DALI's threads
decode          uint8 HWC, the window only (nvJPEG ROI decode)      GPU ("mixed") or CPU
resize          uint8 (H, W, 3), mirrored where flip=1              GPU or CPU
colour          uint8 (H, W, 3), one 3x4 colour matrix each         GPU or CPU (optional)
==============  ==================================================  ===========================

A pipeline iteration is exactly one plan batch: a ``partial`` last batch is a shorter DALI batch
(the feed returns fewer rows), so nothing is decoded twice or trimmed. The colour stage (training
only, when the loader is given augmentation) is one more feed output, per-row matrices from the
crop windows' hash on a stream of their own, applied by
:func:`gpufeed.pipelines._augment.apply_augment_nodes`; augmentation flips toggle the windows'.
The loader exposes the HWC batch to torch as (N, 3, H, W) in channels_last memory format,
which is both the NCHW shape models expect and the layout convolution kernels run fastest on, so
no transpose is spent. The ``mixed`` decoder's nvJPEG arguments are sized for the data in
:mod:`gpufeed.pipelines._decoder_options` (re-exported here).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from gpufeed.core import SizePx
from gpufeed.pipelines._ahead import Ahead
from gpufeed.pipelines._alternate import StreamSlice
from gpufeed.pipelines._augment import LoaderAugment, apply_augment_nodes
from gpufeed.pipelines._decoder_options import eval_decoder_options, gpu_decoder_options, percentile_pick
from gpufeed.pipelines._executor import executor_args
from gpufeed.pipelines._sampler import PlanStream
from gpufeed.pipelines._shards import ShardBytes
from gpufeed.pipelines._windows import Windows

__all__ = [
    "META_COLUMNS",
    "ImageFeed",
    "PathTable",
    "build_image_pipeline",
    "decode_window",
    "eval_decoder_options",
    "feed_windows",
    "gpu_decoder_options",
    "percentile_pick",
    "read_encoded",
]

# Columns of the per-row ``meta`` output (int64).
META_COLUMNS = ("iteration", "row", "sample_id", "label", "valid")


class PathTable:
    """Every file path of a dataset as bytes in one buffer, gathered a batch at a time.

    A batch's paths go to DALI as one zero-padded (N, longest) uint8 array plus their lengths
    (the graph slices each row back to its path): a handful of numpy operations per batch
    instead of a Python object per row, which at GPU rates (batches of 256, dozens a second)
    would cost the feeding thread more than the rest of the step.
    """

    def __init__(self, paths: list[str]) -> None:
        encoded = [os.fsencode(path) for path in paths]
        self.lengths = np.array([len(b) for b in encoded], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64)
        self.buffer = np.frombuffer(b"".join(encoded), dtype=np.uint8)

    def gather(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(paths (N, longest) uint8 zero-padded, lengths (N, 1) int32) of the sample ids."""
        lengths = self.lengths[ids]
        longest = int(lengths.max()) if len(ids) else 1
        cols = np.arange(longest)
        inside = cols[None, :] < lengths[:, None]
        index = np.where(inside, self.offsets[ids][:, None] + cols[None, :], 0)
        return np.where(inside, self.buffer[index], 0).astype(np.uint8), lengths[:, None].astype(np.int32)


def feed_windows(
    windows: Callable[[np.ndarray, int], Windows], augment: LoaderAugment | None, seed: int, ids: np.ndarray, epoch: int
) -> tuple[Windows, tuple]:
    """The crop windows of a plan batch with the augmentation's flips folded in, and its colour output.

    Returns:
        ``(windows, colour)``: ``colour`` is ``()`` or a one-element tuple, each row's (3, 4)
        float32 colour matrix, when ``augment`` has colour ops.
    """
    out = windows(ids, epoch)
    colour: tuple[np.ndarray, ...] = ()
    if augment is not None:
        rows = augment.rows(seed, epoch, ids)
        if rows.flip is not None:  # an independent coin on top of the window's own flip
            out = replace(out, flip=out.flip ^ rows.flip.astype(out.flip.dtype))
        if rows.colour is not None:
            colour = (rows.colour.astype(np.float32),)
    return out, colour


def read_encoded(paths, lengths):
    """Graph fragment: the encoded files of a batch of zero-padded paths (:meth:`PathTable.gather`)."""
    from nvidia.dali import fn

    return fn.io.file.read(fn.slice(paths, np.zeros(1, dtype=np.int32), lengths, axes=[0]))  # drop the padding


class ImageFeed:
    """Batch-mode ``external_source`` callback: the inputs of the stream's next plan batch.

    Called once per pipeline iteration, in order; iteration ``k`` returns plan batch ``stream[k]``.
    DALI calls it on the thread that schedules the iteration, the training thread: with
    ``ahead_batches`` the inputs are prepared on a thread of their own (:class:`~gpufeed.pipelines._ahead.Ahead`)
    and a call only takes them; :meth:`close` stops that thread.

    Args:
        stream: The plan batches, epoch after epoch (or every P-th of them: ``loader.pipelines``).
        paths: The dataset's file paths.
        labels: Label of every sample id.
        windows: ``windows(sample_ids, epoch) -> Windows``: the crop windows, a pure function.
        augment: Loader augmentation (training): its flips toggle the windows' flips and, when it
            has colour ops, each row's (3, 4) colour matrix is an eighth output.
        seed: Seeds the augmentation parameters (the crop windows' seed).
        reader: Reads the samples' encoded bytes itself (tar shards, :class:`~gpufeed.pipelines._shards.ShardBytes`):
            the first output is then each row's bytes, not its path, and the graph skips its file read.
        ahead_batches: Batches prepared ahead on the feed's thread (started by the first call);
            0 prepares each on the calling thread.
    """

    def __init__(
        self,
        stream: PlanStream | StreamSlice,
        paths: PathTable,
        labels: np.ndarray,
        windows: Callable[[np.ndarray, int], Windows],
        augment: LoaderAugment | None = None,
        seed: int = 0,
        reader: ShardBytes | None = None,
        ahead_batches: int = 0,
    ) -> None:
        self.stream, self.paths, self.labels, self.windows = stream, paths, np.asarray(labels), windows
        self.augment, self.seed, self.reader = (augment or None), seed, reader
        self.iteration = 0  # the next batch to prepare (ahead of DALI's calls with a feed thread)
        self.ahead_batches = ahead_batches
        self._ahead: Ahead | None = None
        self._closed = False

    @property
    def has_colour(self) -> bool:
        """Whether the feed has the colour-matrix output."""
        return self.augment is not None and self.augment.has_colour

    def __call__(self):
        if self.ahead_batches <= 0:
            return self._inputs()
        if self._ahead is None:
            if self._closed:  # its thread ran ahead of DALI: restarting would skip batches
                raise RuntimeError("the image feed was closed with its pipeline")
            self._ahead = Ahead(self._tensor_lists, self.ahead_batches, name="gpufeed-image-feed")
        return self._ahead.take()

    def _tensor_lists(self) -> tuple:
        """:meth:`_inputs` as DALI tensor lists, made on the feed's thread.

        DALI turns a callback's arrays into tensor lists on the thread that called it, the training
        thread: 0.17 ms a batch of 256 paths on the 2-core machine, 1 ms for 256 shard members
        (one tensor each). Handed over already made, they pass through unchanged (3 µs).
        """
        from nvidia.dali.backend import TensorListCPU

        return tuple(TensorListCPU(out) for out in self._inputs())

    def close(self) -> None:
        """Stop the feed's thread (the session's pipeline is being released)."""
        self._closed = True
        if self._ahead is not None:
            self._ahead.close()
            self._ahead = None

    def _inputs(self):
        k = self.iteration
        batch = self.stream[k]
        self.iteration = k + 1
        ids = batch.sample_ids
        windows, colour = feed_windows(self.windows, self.augment, self.seed, ids, batch.epoch)
        roi_start, roi_end = windows.roi()
        meta = np.stack(
            [np.full(len(ids), k), np.arange(len(ids)), ids, self.labels[ids], batch.valid.astype(np.int64)], axis=1
        ).astype(np.int64)
        # With a reader: the encoded bytes themselves, and no lengths output (see build_image_pipeline).
        head = (self.reader.read(ids),) if self.reader is not None else self.paths.gather(ids)
        return (
            *head,
            windows.anchor.astype(np.int32),
            windows.shape.astype(np.int32),
            roi_start.astype(np.float32),
            roi_end.astype(np.float32),
            meta,
            *colour,
        )


def decode_window(
    encoded,
    anchor,
    shape,
    roi_start,
    roi_end,
    *,
    size_px: SizePx,
    on_gpu: bool,
    gpu_options: dict | None = None,
    out_size=None,
):
    """The graph fragment every image consumer shares: decode the crop window, resize, flip.

    The training/evaluation loaders and the inference server call this, so serving crops and
    resamples exactly as evaluation did.

    Args:
        encoded: Encoded JPEG/PNG bytes (CPU).
        anchor, shape: int32 (x, y) and (w, h) of the window in source pixels (CPU).
        roi_start, roi_end: float (y, x) resize ROI over the window; a reversed x range mirrors
            (see :meth:`gpufeed.pipelines._windows.Windows.roi`).
        size_px: Output size, the config's ``size_px``.
        on_gpu: Decode with nvJPEG (``device="mixed"``) and resize on the GPU.
        gpu_options: Extra arguments of the ``mixed`` decoder (:func:`gpu_decoder_options`);
            ignored on the CPU, where DALI rejects them. ``affine`` is off unless they say otherwise.
        out_size: Per-sample float (height, width) output sizes instead of ``size_px`` (the server's
            band decode, where a sample is a horizontal band of an image); the resampling of each
            output pixel is the same, so a band's rows equal those rows of the whole image.

    Returns:
        uint8 (height_px, width_px, 3) HWC images, on the GPU when ``on_gpu``.
    """
    from nvidia.dali import fn, types

    out = size_px
    # Threads unpinned everywhere (the server's lanes too): DALI's default pins thread i to core i,
    # so every pipeline of a process, and every process, piles onto the same first cores.
    extra = {"affine": False, **(gpu_options or {})} if on_gpu else {}
    images = fn.decoders.image_slice(
        encoded, anchor, shape, axis_names="WH", device="mixed" if on_gpu else "cpu", output_type=types.RGB, **extra
    )
    # DALI names the sides: x is the width, y the height; ``size`` is (height, width) like the ROI.
    sides = {"size": out_size} if out_size is not None else {"resize_x": out.width_px, "resize_y": out.height_px}
    return fn.resize(
        images,
        **sides,
        roi_start=roi_start,
        roi_end=roi_end,
        roi_relative=False,
        interp_type=types.INTERP_LINEAR,
        antialias=True,
        dtype=types.UINT8,
        bytes_per_sample_hint=out.width_px * out.height_px * 3,
    )


def build_image_pipeline(
    feed: ImageFeed,
    *,
    size_px: SizePx,
    batch_size: int,
    device_id: int | None,
    num_threads: int,
    prefetch_queue_depth: int,
    seed: int,
    gpu_options: dict | None = None,
    executor: str = "auto",
    build: bool = True,
):
    """Build (not yet run) the loader's DALI pipeline over ``feed``'s stream of plan batches.

    Args:
        feed: The batch-mode source (one plan batch per iteration, at most ``batch_size`` rows).
        size_px: Output size, the config's ``size_px``.
        device_id: CUDA device for nvJPEG decoding and GPU resize; ``None`` runs on the CPU.
        gpu_options: Extra ``mixed`` decoder arguments (see :func:`gpu_decoder_options`).
        executor: ``loader.executor`` (:func:`~gpufeed.pipelines._executor.executor_args`).
        build: ``False`` returns the pipeline defined but not built: nothing is allocated and no
            device is needed, so its graph can be read on any machine (the tests read a GPU
            graph's operators on a CPU).

    Returns:
        A built ``nvidia.dali.Pipeline`` with outputs ``(images HWC uint8, meta int64 (5,))``, both on
        the pipeline's device.
    """
    from nvidia.dali import fn, pipeline_def, types

    on_gpu = device_id is not None

    @pipeline_def(enable_conditionals=False)
    def image_graph():
        colour = [types.FLOAT] if feed.has_colour else []
        # A feed with a reader hands the encoded bytes over themselves: no lengths output, no file read.
        lengths_out = [] if feed.reader is not None else [types.INT32]
        count = 6 + len(lengths_out)
        outs = fn.external_source(
            source=feed,
            num_outputs=count + len(colour),
            batch=True,
            dtype=[types.UINT8, *lengths_out, types.INT32, types.INT32, types.FLOAT, types.FLOAT, types.INT64, *colour],
            ndim=[1] * count + [2] * len(colour),
        )
        if feed.reader is not None:
            encoded, anchor, shape, roi_start, roi_end, meta, *matrix = outs
        else:
            paths, lengths, anchor, shape, roi_start, roi_end, meta, *matrix = outs
            encoded = read_encoded(paths, lengths)
        images = decode_window(
            encoded, anchor, shape, roi_start, roi_end, size_px=size_px, on_gpu=on_gpu, gpu_options=gpu_options
        )
        if matrix:  # per-row colour matrices on the resized images, on their device
            images = apply_augment_nodes(images, colour=matrix[0])
        # On a GPU the rows' tags go out on the device only: a pinned host output is handed over after
        # the host waits for its iteration's GPU work (pipelines/_row_checks.py).
        return images, meta.gpu() if on_gpu else meta

    pipe = image_graph(
        batch_size=batch_size,
        num_threads=num_threads,
        device_id=device_id,
        prefetch_queue_depth=prefetch_queue_depth,
        seed=seed,
        **executor_args(on_gpu, executor),
    )
    if build:
        pipe.build()
    return pipe
