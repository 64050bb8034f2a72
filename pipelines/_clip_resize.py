"""A decoded clip fitted to the output in the worker that decoded it (CPU stores of JPEG frames).

On a CPU the clip graph's resize (DALI's, bilinear with antialiasing) ran in the loader's own
process, about 2 ms of an 11-frame clip of 128 px frames to 112 px (one core), beside 4.5-5 ms of
decoding in the workers. :class:`ClipResizer` applies the same filter, torch's uint8 antialiased
bilinear (the triangle filter Pillow's ``BILINEAR`` uses, vectorised), to the whole (T, h, w, 3)
clip in one call where it was decoded: 0.28 ms for that clip. Its pixels differ from DALI's by at
most one level inside the frame; the outermost row and column of each side may differ more, since
torch renormalises the filter's weights over the pixels inside the frame (or the crop window) where
DALI repeats the edge pixels (or reads past the window): measured in ``tests/test_clip_resize.py``.

Imported by DALI's worker processes (through :mod:`gpufeed.pipelines._store_feed`): numpy, torch
and ``gpufeed.core`` only.
"""

from __future__ import annotations

import os

import numpy as np

from gpufeed.core import SizePx
from gpufeed.pipelines._crop_windows import centre_rois

__all__ = ["ClipResizer", "crop_boxes"]


def crop_boxes(frame_sizes, decoded_sizes, size_px: SizePx, fit: str) -> np.ndarray | None:
    """(videos, 4) (x0, y0, x1, y1) each video's crop window covers in its decoded frames, or ``None``.

    ``stretch`` reads the whole frame; ``centre_crop`` the central region of the output's aspect
    ratio (:func:`~gpufeed.pipelines._crop_windows.centre_rois`) scaled to the decoded size. ``None``
    when some window does not fall on whole decoded pixels: a window that starts inside a pixel is
    DALI's resize's to take (``roi_start``/``roi_end``), as before.

    Args:
        frame_sizes: (videos, 2) stored (width, height) of each video's frames.
        decoded_sizes: (videos, 2) (width, height) they are decoded to.
        size_px: The output size.
        fit: ``"stretch"`` or ``"centre_crop"``.
    """
    stored = np.asarray(frame_sizes, dtype=np.float64).reshape(-1, 2)
    decoded = np.asarray(decoded_sizes, dtype=np.int64).reshape(-1, 2)
    if fit == "stretch":
        return np.concatenate([np.zeros_like(decoded), decoded], axis=1)
    starts, ends = centre_rois(stored.astype(np.int64), size_px.width_px / size_px.height_px)
    scale = decoded / np.maximum(stored, 1.0)  # (x, y) decoded pixels per stored pixel
    box = np.concatenate([starts[:, ::-1] * scale, ends[:, ::-1] * scale], axis=1)
    whole = np.rint(box)
    if not np.allclose(box, whole, rtol=0.0, atol=1e-3):
        return None
    return whole.astype(np.int64)


class ClipResizer:
    """Crop window and resize of a (T, h, w, 3) uint8 clip, in one call for all its frames (see the module docs).

    Picklable; in a process other than the one that built it (a DALI worker) torch runs on one
    thread, as a DataLoader worker's does: the workers are one per core already, and OpenMP's
    thread pool does not survive a fork.

    Args:
        size_px: The output size.
        boxes: (videos, 4) (x0, y0, x1, y1) crop window of each video's decoded frames (:func:`crop_boxes`).
    """

    def __init__(self, size_px: SizePx, boxes: np.ndarray) -> None:
        self.size_px = size_px
        self.boxes = np.asarray(boxes, dtype=np.int64).reshape(-1, 4)
        self._built_in = os.getpid()
        self._threads_in: int | None = None  # the process whose torch threads are set

    def __call__(self, clip: np.ndarray, video: int) -> np.ndarray:
        """``clip`` (T, h, w, 3) uint8, decoded frames of ``video``, cropped and resized to (T, H, W, 3)."""
        import torch

        pid = os.getpid()
        if self._threads_in != pid:
            if pid != self._built_in:
                torch.set_num_threads(1)
            self._threads_in = pid
        x0, y0, x1, y1 = (int(v) for v in self.boxes[video])
        height, width = self.size_px.hw
        window = clip[:, y0:y1, x0:x1]
        if window.shape[1:3] == (height, width):
            return np.ascontiguousarray(window)
        # (T, h, w, 3) seen as (T, 3, h, w) channels-last: no copy in, and the output's channels-last
        # layout is (T, H, W, 3) contiguous again.
        frames = torch.from_numpy(window).permute(0, 3, 1, 2)
        out = torch.nn.functional.interpolate(frames, size=(height, width), mode="bilinear", antialias=True)
        return out.permute(0, 2, 3, 1).contiguous().numpy()
