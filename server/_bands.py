"""Horizontal bands of one image, decoded side by side on the CPU (see :mod:`gpufeed.server._preprocess`).

**Bands** (:meth:`gpufeed.server._preprocess.ImageDecoder.decode_into` with ``bands`` > 1, CPU only): DALI decodes and resizes
one sample on one thread, so a lone image leaves the other cores idle while a client waits. Cut
into horizontal bands, an image becomes several samples that decode and resize side by side:
band ``b`` of ``n`` is output rows ``[H*b/n, H*(b+1)/n)``, the resize ROI over source rows
``[h*b/n, h*(b+1)/n)`` of the window, and its decode slice takes a few rows more on each side so the
antialiasing filter reads the same source pixels it reads for the whole image. Every output pixel
reads the same source pixels as in the whole-image resize, and where the image is downscaled by a binary
fraction (:meth:`~gpufeed.server._preprocess.ImageDecoder.exact_in_bands`; a shorter side divisible by 8 at 224 px and crop
0.875, as camera sizes are) DALI's float32 arithmetic gives it the same value, so the bands put
together equal the evaluation loader's image bit for bit (tests/test_server_bands.py); other
images decode whole. Measured on the development machine (2-core CPU, 640x480
JPEG to 224x224): 2.7-2.8 ms whole on one thread, 2.1-2.2 ms in two bands on two threads.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["MAX_BANDS", "MIN_BAND_ROWS", "band_samples", "binary_fraction"]

# Most bands an image is cut into. Every band entropy-decodes the JPEG rows above it again, so
# more bands gain less; 2 is what a 2-core machine measured (more cores: unmeasured).
MAX_BANDS = 2
MIN_BAND_ROWS = 16


def binary_fraction(source: int, output: int) -> bool:
    """Whether ``source / output`` is a binary fraction (``output / gcd`` a power of two)."""
    q = output // math.gcd(int(source), output)
    return q & (q - 1) == 0


def band_samples(encoded: list, windows, roi_start: np.ndarray, roi_end: np.ndarray, out_h: int, bands: int):
    """The DALI inputs of ``bands`` horizontal bands per image: (encoded, anchor, shape, roi_start, roi_end).

    Band ``b`` resamples source rows ``[h*b/n, h*(b+1)/n)`` of the window (exact in float32: ``n``
    is a power of two) into ``out_h / n`` output rows, and decodes the window rows it covers plus a
    margin wider than the antialiasing filter's reach (``h / out_h`` source rows, plus the
    interpolation's one), so every output pixel reads the same source pixels as in the whole image.
    """
    columns: tuple[list, list, list, list, list] = ([], [], [], [], [])
    for i, blob in enumerate(encoded):
        (x, y), (w, h) = windows.anchor[i], windows.shape[i]
        margin = math.ceil(h / out_h) + 2
        for b in range(bands):
            first, last = h * b / bands, h * (b + 1) / bands  # source rows of this band, in the window
            top = max(0, math.floor(first) - margin)
            bottom = min(int(h), math.ceil(last) + margin)
            columns[0].append(blob)
            columns[1].append(np.array([x, y + top], dtype=np.int32))
            columns[2].append(np.array([w, bottom - top], dtype=np.int32))
            columns[3].append(np.array([first - top, roi_start[i][1]], dtype=np.float32))
            columns[4].append(np.array([last - top, roi_end[i][1]], dtype=np.float32))
    return columns
