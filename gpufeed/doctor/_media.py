"""Tiny media for the doctor's probes, made in memory: a JPEG and a short video per codec.

Smooth, low-saturation gradients: every decoder (libjpeg-turbo, nvJPEG, the hardware decoder,
NVDEC, FFmpeg) reproduces them within a few levels, so a decode is judged against the source
pixels by PSNR, and a decoder that returns zeros, garbage or the wrong frames fails clearly.
"""

from __future__ import annotations

import io
import os

import numpy as np

__all__ = ["VIDEO_CODECS", "jpeg_bytes", "psnr_db", "source_frame", "video_bytes"]

# codec -> (PyAV encoder, container, encoder options). 256 x 256: above every codec's NVDEC minimum
# (HEVC's is 144 x 144), 8-bit 4:2:0, the profile each decodes on every NVDEC that has the codec.
VIDEO_CODECS = {
    "h264": ("libx264", "mp4", {"crf": "12", "preset": "ultrafast"}),
    "hevc": ("libx265", "mp4", {"crf": "12", "preset": "ultrafast", "x265-params": "log-level=none"}),
    "av1": ("libsvtav1", "mp4", {"crf": "12", "preset": "11"}),
    "vp9": ("libvpx-vp9", "webm", {"crf": "12", "b": "0", "deadline": "realtime", "cpu-used": "8"}),
}
SIDE_PX = 256


def source_frame(index: int, height_px: int = SIDE_PX, width_px: int = SIDE_PX) -> np.ndarray:
    """Frame ``index`` of the probes' media: a gradient that moves 4 px per frame, uint8 (H, W, 3)."""
    yy, xx = np.mgrid[0:height_px, 0:width_px]
    red = 64 + (xx + 4 * index) % width_px * 128 // width_px
    green = 64 + yy * 128 // height_px
    blue = 96 + (xx + yy) * 64 // (width_px + height_px)
    return np.stack([red, green, blue], axis=-1).astype(np.uint8)


def jpeg_bytes(height_px: int = 240, width_px: int = 320) -> bytes:
    """A baseline 4:2:0 JPEG of :func:`source_frame` (what the hardware JPEG decoder takes), 320x240:
    well above the smallest image a decoder might leave to another."""
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(source_frame(0, height_px, width_px)).save(out, format="JPEG", quality=95, subsampling=2)
    return out.getvalue()


def video_bytes(codec: str, frames: int = 8) -> bytes:
    """A ``frames``-frame video of :func:`source_frame` in ``codec`` (see :data:`VIDEO_CODECS`).

    Raises:
        ValueError: ``codec`` is not one of :data:`VIDEO_CODECS`.
    """
    if codec not in VIDEO_CODECS:
        raise ValueError(f"codec {codec!r} is not allowed; allowed: {', '.join(VIDEO_CODECS)}")
    import av

    encoder, container, options = VIDEO_CODECS[codec]
    os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1 prints its whole configuration unless told not to
    out = io.BytesIO()
    with av.open(out, "w", format=container) as muxer:
        stream = muxer.add_stream(encoder, rate=25)
        if not isinstance(stream, av.VideoStream):
            raise ValueError(f"encoder {encoder!r} is not a video encoder")
        stream.width = stream.height = SIDE_PX
        stream.pix_fmt = "yuv420p"
        stream.options = dict(options)
        for index in range(frames):
            for packet in stream.encode(av.VideoFrame.from_ndarray(source_frame(index), format="rgb24")):
                muxer.mux(packet)
        for packet in stream.encode():
            muxer.mux(packet)
    return out.getvalue()


def psnr_db(decoded: np.ndarray, reference: np.ndarray) -> float:
    """Peak signal-to-noise ratio of ``decoded`` against ``reference`` (uint8, same shape), in dB.

    Raises:
        ValueError: The shapes differ (a decoder that returned the wrong size).
    """
    if decoded.shape != reference.shape:
        raise ValueError(f"decoded shape {decoded.shape} is not the source's {reference.shape}")
    mse = float(np.mean((decoded.astype(np.float64) - reference.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)
