"""Photo-like test images: what the benchmarks, the reliability runs and their tests feed a decoder.

Real photos cost a decoder more than flat synthetic frames (noise defeats the entropy coder), so
these are smooth shapes or gradients plus sensor-like noise, encoded as a camera would:

* :func:`make_bench_images`: a cached folder of photo-like JPEGs (``bench loader``, ``bench server``,
  ``bench train``, the reliability runs).
* :func:`photo_pixels` and :func:`encode_image`: one such picture in memory, in any format Pillow writes.
* :func:`format_samples`: one small image in every format a server meets (JPEG, progressive JPEG,
  PNG, and the unsupported GIF, BMP, TIFF and WebP), for the malformed-request corpus to damage.

The damaged versions (truncated, bit-flipped, bomb headers) are :mod:`gpufeed.synth._damaged`.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from gpufeed.core import progress_bar

__all__ = ["encode_image", "format_samples", "make_bench_images", "photo_pixels"]


def _bench_photo(index: int, width: int, height: int, seed: int) -> np.ndarray:
    """Photo ``index`` of a bench set: six soft blobs plus sensor-like noise, seeded by (seed, index)."""
    rng = np.random.default_rng((seed, index))
    y = np.arange(height, dtype=np.float32)[:, None]
    x = np.arange(width, dtype=np.float32)[None, :]
    base = np.zeros((height, width, 3), np.float32)
    for _ in range(6):
        cx, cy, r = rng.uniform(0, width), rng.uniform(0, height), rng.uniform(0.1, 0.5) * width
        # exp(-(dx^2 + dy^2) / 2r^2) as the outer product of its two axes: one pass over the image.
        blob = np.exp(-((y - cy) ** 2) / (2 * r * r)) * np.exp(-((x - cx) ** 2) / (2 * r * r))
        base += blob[..., None] * rng.uniform(0, 255, 3).astype(np.float32)
    base = base / max(float(base.max()), 1.0) * 220 + rng.normal(0, 6, base.shape).astype(np.float32)
    return np.clip(base, 0, 255).astype(np.uint8)


def _write_bench_photos(photos: Path, indices: range, width: int, height: int, seed: int) -> int:
    from PIL import Image

    for i in indices:
        Image.fromarray(_bench_photo(i, width, height, seed)).save(photos / f"{i:06d}.jpg", quality=90)
    return len(indices)


def make_bench_images(folder: Path, count: int, width: int, height: int, seed: int = 0) -> Path:
    """Photo-like JPEGs (smooth shapes plus sensor-like noise, quality 90) in ``<returned>/photos/``.

    Written under ``folder`` once per (size, count, seed) and reused when already complete. Each
    photo is seeded by its index, so processes on every core write them (a GPU machine's first
    ``bench train`` wrote its 4,096 640x480 photos at 18 a second on one core of sixteen).

    Returns:
        The folder holding ``photos/``.
    """
    import os
    from concurrent.futures import ProcessPoolExecutor

    target = Path(folder) / f"bench-{width}x{height}-{count}-{seed}-v2"
    photos = target / "photos"
    done = target / ".complete"
    if done.exists():
        return target
    photos.mkdir(parents=True, exist_ok=True)
    chunk = 64
    chunks = [range(start, min(start + chunk, count)) for start in range(0, count, chunk)]
    workers = max(1, min(len(chunks), len(os.sched_getaffinity(0))))
    with progress_bar(total=count, desc="bench images", unit="img", leave=False) as bar:
        if workers == 1:
            for indices in chunks:
                bar.update(_write_bench_photos(photos, indices, width, height, seed))
        else:
            with ProcessPoolExecutor(workers) as pool:
                jobs = [pool.submit(_write_bench_photos, photos, indices, width, height, seed) for indices in chunks]
                for job in jobs:
                    bar.update(job.result())
    done.touch()
    return target


def photo_pixels(width: int, height: int, seed: int = 0) -> np.ndarray:
    """A ``(height, width, 3)`` uint8 picture: gradients and a texture plus +-25 noise."""
    rng = np.random.default_rng(seed)
    # A row and a column broadcast into the picture: full int64 grids cost 4x the CPU at 4000x3000.
    x, y = np.arange(width), np.arange(height)[:, None]
    picture = np.empty((height, width, 3), np.int16)
    picture[..., 0] = x * 255 // width
    picture[..., 1] = y * 255 // height
    picture[..., 2] = (x // 7 + y // 5) % 256
    picture += rng.integers(-25, 25, picture.shape, dtype=np.int16)
    return np.clip(picture, 0, 255, out=picture).astype(np.uint8)


def encode_image(pixels: np.ndarray, fmt: str = "JPEG", **options) -> bytes:
    """``pixels`` encoded by Pillow as ``fmt`` (``JPEG`` at quality 90 unless ``options`` say otherwise)."""
    from PIL import Image

    if fmt == "JPEG":
        options.setdefault("quality", 90)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=fmt, **options)
    return buffer.getvalue()


def format_samples(rng: np.random.Generator) -> dict[str, bytes]:
    """One small noisy picture in every format: keys ``jpeg``, ``jpeg_progressive``, ``png``,
    ``png_small`` (50x40), and ``gif``, ``bmp``, ``tiff``, ``webp`` (16x16); the rest are 96x72."""
    yy, xx = np.mgrid[0:72, 0:96]
    base = np.stack([xx * 2, yy * 3, (xx + yy) * 2], -1) % 256
    pixels = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
    out = {
        "jpeg": encode_image(pixels, "JPEG", quality=90),
        "jpeg_progressive": encode_image(pixels, "JPEG", quality=85, progressive=True),
        "png": encode_image(pixels, "PNG"),
        "png_small": encode_image(pixels[:40, :50], "PNG", optimize=True),
    }
    for fmt in ("GIF", "BMP", "TIFF", "WEBP"):
        out[fmt.lower()] = encode_image(pixels[:16, :16], fmt)
    return out
