"""``gpufeed prepare --store folder|hdf5``: a video's frames as separate images, in a frame store kind's layout.

Every frame is decoded once (PyAV) and encoded as one JPEG (``quality``, libjpeg-turbo through
Pillow) or PNG (lossless, larger, slower to decode), then written as DeepEthogram's ``vidio``
writes it (each kind's :meth:`~gpufeed.pipelines._frame_stores.FrameStore.write`): a folder
``<name>/000000000.jpg`` ... or an HDF5 file ``<name>.h5`` whose ``frame`` dataset holds one encoded
image per element, channels reversed as OpenCV writes vidio's frames, so vidio's readers and
gpufeed return the same pixels.
The output appears whole or not at all (written beside it under a temporary name, then renamed).

The seek cost of a store is what a random clip costs its reader: reading and decoding its frames
(Pillow on the CPU here, JPEGs DCT-scaled as the CPU clip loader decodes them), resized as the
video probe's frames are.
"""

from __future__ import annotations

import io
import os
import shutil
import time
from pathlib import Path

import numpy as np

from gpufeed.pipelines._clips import ClipGeometry
from gpufeed.pipelines._frame_stores import FrameBytesReader, probe_store
from gpufeed.pipelines._orientation import frame_orientation
from gpufeed.pipelines._store_kinds import frame_store, store_kinds
from gpufeed.pipelines._streams import main_video_stream

__all__ = ["IMAGE_FORMATS", "VIDEO", "measure_store_seek_cost", "store_choices", "write_store"]

# ``store: video``: re-encode the video (no frame store).
VIDEO = "video"
IMAGE_FORMATS = ("jpeg", "png")


def store_choices() -> tuple[str, ...]:
    """What ``prepare --store`` takes: ``video`` and every registered frame-store kind that holds a video."""
    return (VIDEO, *(kind for kind in store_kinds() if frame_store(kind).per_video))


def _encoder(image_format: str, quality: int):
    from PIL import Image

    def encode(rgb: np.ndarray) -> bytes:
        out = io.BytesIO()
        if image_format == "jpeg":
            Image.fromarray(rgb).save(out, format="JPEG", quality=quality)
        else:
            Image.fromarray(rgb).save(out, format="PNG", compress_level=1)  # decode speed matters, not size
        return out.getvalue()

    return encode


def write_store(src: str, dst: Path, store: str, image_format: str, quality: int, bar) -> int:
    """Decode ``src`` and write it as a frame store of kind ``store`` at ``dst``; return the frame count.

    Raises:
        ValueError: ``store`` is no registered kind, or ``image_format`` is not allowed.
        av.FFmpegError, OSError: Decoding or writing failed (no partial output is left).
    """
    import av

    kind = frame_store(store)
    if image_format not in IMAGE_FORMATS:
        raise ValueError(f"image format {image_format!r} is not allowed; allowed: {', '.join(IMAGE_FORMATS)}")
    encode = _encoder(image_format, quality)
    ext = ".jpg" if image_format == "jpeg" else ".png"
    tmp = dst.with_name(f".{dst.name}.partial-{os.getpid()}")
    try:
        with av.open(src) as source:
            stream = main_video_stream(source)
            stream.thread_type = "AUTO"

            def encoded():
                for frame in source.decode(stream):
                    rgb = frame.to_ndarray(format="rgb24")
                    orientation = frame_orientation(frame)  # stored as shown, as every reader hands the video over
                    rgb = np.ascontiguousarray(orientation.apply(rgb)) if orientation else rgb
                    yield encode(np.ascontiguousarray(rgb[..., ::-1]) if kind.channels_reversed else rgb)
                    bar.update(1)

            count = kind.write(tmp, encoded(), ext)
        if dst.is_dir():
            shutil.rmtree(dst)
        os.replace(tmp, dst)
    finally:
        if tmp.is_dir():
            shutil.rmtree(tmp)
        elif tmp.exists():
            tmp.unlink()
    return count


def measure_store_seek_cost(path: str, clips: int, geometry: ClipGeometry, seed: int = 0, size_px: int = 112) -> float:
    """Milliseconds per random clip from a frame store: read and decode its frames, resize to ``size_px``."""
    from PIL import Image

    facts = probe_store(path)
    if facts.problem or geometry.max_start(facts.num_frames) < 0 or clips == 0:
        return float("nan")
    starts = np.random.default_rng(seed).integers(0, geometry.max_start(facts.num_frames) + 1, clips)
    reader = FrameBytesReader()
    reader.read(path, facts.kind, facts.frame_name, [0])  # open the file outside the timing
    begin = time.perf_counter()
    for start in starts:
        for data in reader.read(path, facts.kind, facts.frame_name, geometry.frames(int(start))):
            with Image.open(io.BytesIO(data.tobytes())) as image:
                # A JPEG decodes DCT-scaled to at least the output, as the clip loader decodes it on a CPU.
                image.draft("RGB", (size_px, size_px))
                image.convert("RGB").resize((size_px, size_px), Image.Resampling.BILINEAR)
    reader.close()
    return (time.perf_counter() - begin) * 1000.0 / clips
