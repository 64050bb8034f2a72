"""The centre-crop windows a clip graph's resize reads (``video.fit: centre_crop``).

The resize crops and scales in one step (``roi_start``/``roi_end``); the window of each row comes
from its video's frame size, fed batch by batch in the order the graph outputs the rows.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from gpufeed.core import SizePx

__all__ = ["RoiFeed", "centre_rois", "resize_args"]


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


def resize_args(out: SizePx, roi_feed: RoiFeed | None) -> dict:
    """``fn.resize``'s arguments to the output size (bilinear, antialiased), the crop window fed by ``roi_feed``.

    Called while a graph is defined: the window's ``external_source`` joins that graph.
    """
    from nvidia.dali import fn, types

    args = {
        "resize_x": out.width_px,  # DALI names the sides: x is the width, y the height
        "resize_y": out.height_px,
        "interp_type": types.INTERP_LINEAR,
        "antialias": True,
        "dtype": types.UINT8,
    }
    if roi_feed is not None:
        roi_start, roi_end = fn.external_source(
            source=roi_feed, num_outputs=2, batch=True, dtype=[types.FLOAT, types.FLOAT]
        )
        args.update(roi_start=roi_start, roi_end=roi_end, roi_relative=roi_feed.relative)
    return args
