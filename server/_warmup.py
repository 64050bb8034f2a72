"""The warm-up image every served model decodes first, and the bit-for-bit check decoders make with it."""

from __future__ import annotations

import functools
import io

import numpy as np

__all__ = ["same_pixels", "warmup_image"]


@functools.cache
def warmup_image(width_px: int, height_px: int) -> tuple[bytes, tuple[int, int]]:
    """A JPEG of twice the model's input size, a smooth pattern, and its (width, height): what warm-up batches decode.

    Made once per size: decoders decode it again to prime and to check themselves (:class:`~gpufeed.server._preprocess.ImageDecoder`).
    """
    from PIL import Image

    size = (width_px * 2, height_px * 2)
    yy, xx = np.mgrid[0 : size[1], 0 : size[0]]
    pixels = np.stack([xx % 256, yy % 256, (xx + yy) % 256], -1).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue(), size


def same_pixels(got, want) -> bool:
    """Whether two decoded batches (numpy arrays, or CUDA tensors on a GPU) are equal bit for bit."""
    if isinstance(got, np.ndarray):
        return np.array_equal(got, want)
    import torch

    return bool(torch.equal(got, want))  # a host read: this runs only after a failed decode
