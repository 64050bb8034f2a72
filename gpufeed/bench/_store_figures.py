"""What a frame store costs per frame, beside ``gpufeed bench clips``' clips/s: bytes read, decode time.

Measured untimed in this process on a sample of frames, each decoded as the CPU loader decodes it
(JPEG: libjpeg-turbo at the DCT scale the loader picks for the output size, with the exact IDCT
by default; PNG: Pillow), and for JPEG stores also with the fast IDCT (``video.jpeg_idct: fast``)
to print what that option saves and how far its pixels are from the exact decode.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from gpufeed.core import SizePx
from gpufeed.pipelines import FrameBytesReader, decode_frame, jpeg_decode_sizes, stored_colorspace

__all__ = ["store_figures"]

_SAMPLE_FRAMES = 200


def _sample(dataset, count: int, seed: int = 0) -> list[tuple[Any, np.ndarray]]:
    """(info, encoded bytes) of ``count`` frames drawn across the set's stores."""
    rng = np.random.default_rng(seed)
    reader = FrameBytesReader()
    out = []
    try:
        for video in rng.integers(0, len(dataset.infos), count):
            info = dataset.infos[int(video)]
            frame = int(rng.integers(0, info.num_frames))
            out.append((info, reader.read(info.path, info.store, info.frame_name, np.array([frame]))[0]))
    finally:
        reader.close()
    return out


def _decode_all(frames, sizes: dict, fast: bool) -> tuple[list[np.ndarray], float]:
    import simplejpeg

    decoded, start = [], time.perf_counter()
    for info, data in frames:
        if info.codec == "jpeg":
            width, height = sizes[info.path]
            colorspace = stored_colorspace(info.store)
            decoded.append(
                simplejpeg.decode_jpeg(
                    data, colorspace=colorspace, fastdct=fast, fastupsample=False, min_width=width, min_height=height
                )
            )
        else:
            decoded.append(decode_frame(data.tobytes(), info.store))
    return decoded, time.perf_counter() - start


def store_figures(dataset, output: SizePx, sample_frames: int = _SAMPLE_FRAMES) -> dict:
    """Bytes read and decode time per frame (exact and fast IDCT) and the fast IDCT's error, for one set."""
    frames = _sample(dataset, sample_frames)
    frame_sizes = np.array([(info.width, info.height) for info in dataset.infos])
    decoded_sizes = jpeg_decode_sizes(frame_sizes, frame_sizes, output)
    sizes = {info.path: tuple(int(v) for v in wh) for info, wh in zip(dataset.infos, decoded_sizes, strict=True)}
    _decode_all(frames[:10], sizes, fast=False)  # warm the library and the caches
    exact, exact_s = _decode_all(frames, sizes, fast=False)
    fast, fast_s = _decode_all(frames, sizes, fast=True)
    diffs = [np.abs(a.astype(np.int16) - b.astype(np.int16)) for a, b in zip(exact, fast, strict=True)]
    jpeg = all(info.codec == "jpeg" for info, _ in frames)
    width, height = exact[0].shape[1], exact[0].shape[0]
    return {
        "bytes_read_per_frame": float(np.mean([len(data) for _, data in frames])),
        "decode_ms_per_frame": 1000 * exact_s / len(frames),
        "decode": f"libjpeg-turbo to {width}x{height}, exact IDCT" if jpeg else "Pillow, full size",
        "fast_idct_ms_per_frame": 1000 * fast_s / len(frames),
        "fast_idct_mean_levels": float(np.mean([d.mean() for d in diffs])),
        "fast_idct_max_levels": int(max(int(d.max()) for d in diffs)),
        "sample_frames": len(frames),
    }
