"""The DALI image graph: read, decode the crop window only, resize with the flip folded in.

Stages and what each outputs (checked when the pipeline is built):

==============  ==================================================  ===========================
stage           output                                              where
==============  ==================================================  ===========================
file reader     encoded bytes + position in the epoch plan (int32)  CPU
crop windows    anchor (x, y), shape (w, h), ROI for resize         CPU (external_source)
decode          uint8 HWC, the window only (nvJPEG ROI decode)      GPU ("mixed") or CPU
resize          uint8 (size, size, 3), mirrored where flip=1        GPU or CPU
colour          uint8 (size, size, 3), one 3x4 colour matrix each   GPU or CPU (optional)
==============  ==================================================  ===========================

The colour stage (training only, when the loader is given augmentation) is
:func:`gpufeed.pipelines._augment.augment_graph`: per-row matrices from the crop windows' hash.

The loader exposes the HWC batch to torch as (N, 3, size, size) in channels_last memory format,
which is both the NCHW shape models expect and the layout convolution kernels run fastest on,
so no transpose pass is spent.
"""

from __future__ import annotations

import numpy as np

from gpufeed.pipelines._augment import AugmentRows, augment_graph
from gpufeed.pipelines._windows import Windows

__all__ = ["READER_NAME", "WindowFeed", "build_image_pipeline"]

READER_NAME = "reader"


class WindowFeed:
    """Batch-mode ``external_source`` callback: the crop windows, batch by batch, in plan order.

    The reader returns the plan's files in order and pads its last batch by repeating the final
    file (``pad_last_batch``); this feed pads the same way so windows and bytes stay aligned.
    """

    def __init__(self, windows: Windows, batch_size: int) -> None:
        roi_start, roi_end = windows.roi()
        self._columns = (windows.anchor, windows.shape, roi_start, roi_end)
        self._batch_size = batch_size
        self._count = len(windows)
        self._next = 0

    def __call__(self):
        start = self._next
        index = np.minimum(np.arange(start, start + self._batch_size), self._count - 1)
        self._next = start + self._batch_size
        if start >= self._count:
            # DALI can ask one batch beyond the epoch while prefetching; the reader is padded too.
            index = np.full(self._batch_size, self._count - 1)
        return [list(column[index]) for column in self._columns]


def decode_window(encoded, anchor, shape, roi_start, roi_end, *, size_px: int, on_gpu: bool):
    """The graph fragment every image consumer shares: decode the crop window, resize, flip.

    The training/evaluation loaders and the inference server call this, so serving crops and
    resamples exactly as evaluation did.

    Args:
        encoded: Encoded JPEG/PNG bytes (CPU).
        anchor, shape: int32 (x, y) and (w, h) of the window in source pixels (CPU).
        roi_start, roi_end: float (y, x) resize ROI over the window; a reversed x range mirrors
            (see :meth:`gpufeed.pipelines.Windows.roi`).
        size_px: Output height and width.
        on_gpu: Decode with nvJPEG (``device="mixed"``) and resize on the GPU.

    Returns:
        uint8 (size_px, size_px, 3) HWC images, on the GPU when ``on_gpu``.
    """
    from nvidia.dali import fn, types

    images = fn.decoders.image_slice(
        encoded, anchor, shape, axis_names="WH", device="mixed" if on_gpu else "cpu", output_type=types.RGB
    )
    return fn.resize(
        images,
        size=(size_px, size_px),
        roi_start=roi_start,
        roi_end=roi_end,
        roi_relative=False,
        interp_type=types.INTERP_LINEAR,
        antialias=True,
        dtype=types.UINT8,
    )


def build_image_pipeline(
    files: list[str],
    windows: Windows,
    *,
    size_px: int,
    batch_size: int,
    device_id: int | None,
    num_threads: int,
    prefetch_queue_depth: int,
    seed: int,
    augment: AugmentRows | None = None,
):
    """Build (not yet run) the DALI pipeline for one epoch plan.

    Args:
        files: The plan's files, in read order (one entry per row, padding included).
        windows: One crop window per entry of ``files``.
        size_px: Output height and width.
        device_id: CUDA device for nvJPEG decoding and GPU resize; ``None`` runs on the CPU.
        augment: Loader augmentation, one row per entry of ``files``, applied after the resize
            (its ``flip`` must already be folded into ``windows``); ``None``: none.

    Returns:
        A built ``nvidia.dali.Pipeline`` with outputs ``(images HWC uint8, positions int32)``.
    """
    from nvidia.dali import fn, pipeline_def, types

    if len(files) != len(windows):
        raise ValueError(f"{len(files)} files but {len(windows)} crop windows: they must match one to one")
    if augment is not None and (augment.flip is not None or len(augment) not in (0, len(files))):
        raise ValueError(
            f"augmentation rows must be {len(files)} colour rows without flips (fold flips into the windows), "
            f"got {len(augment)} rows, flip {'set' if augment.flip is not None else 'unset'}"
        )
    on_gpu = device_id is not None

    @pipeline_def(enable_conditionals=False)
    def image_graph():
        encoded, position = fn.readers.file(
            files=files,
            labels=list(range(len(files))),
            random_shuffle=False,
            pad_last_batch=True,
            name=READER_NAME,
        )
        anchor, shape, roi_start, roi_end = fn.external_source(
            source=WindowFeed(windows, batch_size),
            num_outputs=4,
            batch=True,
            dtype=[types.INT32, types.INT32, types.FLOAT, types.FLOAT],
        )
        images = decode_window(encoded, anchor, shape, roi_start, roi_end, size_px=size_px, on_gpu=on_gpu)
        # Augmentation seam: per-row colour matrices applied to the resized images.
        images = augment_graph(images, augment, batch_size)
        return images, position

    pipe = image_graph(
        batch_size=batch_size,
        num_threads=num_threads,
        device_id=device_id,
        prefetch_queue_depth=prefetch_queue_depth,
        seed=seed,
        exec_dynamic=True,
    )
    pipe.build()
    return pipe
