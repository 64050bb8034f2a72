"""Reading frame stores of any kind: encoded frames by index, and the check's decode.

The kinds themselves (frame folders, HDF5 files: how each is found, probed, read and written) are
:class:`~gpufeed.pipelines._store_kinds.FrameStore` classes in :mod:`gpufeed.pipelines._store_kinds`;
everything here asks the kind named in the index (``VideoInfo.store``) for its answers. The label
CSV of a store is ``<name>.csv`` beside it (``mouse1/`` -> ``mouse1.csv``, ``mouse1.h5`` ->
``mouse1.csv``). This module stays light (numpy, h5py, the image-facts walker): it reads bytes;
DALI's image decoder decodes them (see :mod:`gpufeed.pipelines._store_pipeline`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gpufeed.core import DataPath, ObjectPath, data_path
from gpufeed.pipelines._frame_sizes import frame_size_problem
from gpufeed.pipelines._image_facts import DEFAULT_MAX_IMAGE_PIXELS, read_image_facts
from gpufeed.pipelines._image_verify import decode_problem
from gpufeed.pipelines._store_kinds import StoreFacts, StoreReader, frame_store, store_kind, store_kinds

__all__ = [
    "FrameBytesReader",
    "decode_frame",
    "decode_store_frames",
    "describe_bad_frame",
    "label_path",
    "probe_store",
    "stored_colorspace",
]


def label_path(video: str | Path | ObjectPath) -> DataPath:
    """The label CSV of a video file or frame store: ``<name>.csv`` beside it (in the same bucket for ``s3://``)."""
    video = data_path(video)
    kind = store_kind(video)
    return frame_store(kind).label_path(video) if kind else video.with_suffix(".csv")


def probe_store(path: str | Path | ObjectPath) -> StoreFacts:
    """Learn a frame store's format, size and frame count (frame 0's header only; no decoding).

    Problems are described, not raised: a missing frame number, a zero-byte frame, frame names of
    different widths, an HDF5 file without a ``frame`` dataset, a frame 0 that is not PNG/JPEG.
    """
    path = data_path(path)
    kind = store_kind(path)
    if not kind:
        return StoreFacts(
            "", problem=f"not a frame store ({', '.join(frame_store(k).described for k in store_kinds())})"
        )
    return frame_store(kind).probe(path)


class FrameBytesReader:
    """Read the encoded bytes of frames by index from stores of any kind (each kind's reader opened once).

    Args:
        max_open: Files each kind's reader keeps open (least recently used closed first).
    """

    def __init__(self, max_open: int = 8) -> None:
        self.max_open = max_open
        self._readers: dict[str, StoreReader] = {}

    def read(self, path: str, kind: str, frame_name: str, frames) -> list[np.ndarray]:
        """The encoded bytes of ``frames`` of the ``kind`` store at ``path``, each a 1-D uint8 array.

        Raises:
            OSError, ValueError, IndexError: The store or a frame cannot be read (the message names it).
        """
        reader = self._readers.get(kind)
        if reader is None:
            reader = self._readers[kind] = frame_store(kind).open_reader(self.max_open)
        return reader.read(path, frame_name, frames)

    def close(self) -> None:
        while self._readers:
            self._readers.popitem()[1].close()


def decode_frame(data: bytes, kind: str) -> np.ndarray:
    """One encoded frame of a ``kind`` store as (H, W, 3) uint8 RGB, with Pillow (reversed channels put back)."""
    import io

    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        rgb = np.asarray(image.convert("RGB"))
    return np.ascontiguousarray(rgb[..., ::-1]) if frame_store(kind).channels_reversed else rgb


def stored_colorspace(kind: str) -> str:
    """``"BGR"`` for a kind whose images hold reversed channels (HDF5), else ``"RGB"``: what to ask libjpeg for to get RGB back."""
    return "BGR" if frame_store(kind).channels_reversed else "RGB"


def describe_bad_frame(data: bytes, where: str, problem: str) -> str:
    """``"<where> is not an image: <problem>"`` (or ``is damaged``, for a PNG/JPEG that fails to decode, or
    ``is refused``, for one whose header declares too many pixels)."""
    what = "is not an image" if read_image_facts(data).format == "" else "is damaged"
    what = "is refused" if problem.startswith("too many pixels") else what
    return f"{where} {what}: {problem}"


def decode_store_frames(
    path: str,
    kind: str,
    frame_name: str,
    frames=None,
    *,
    pixels: bool = False,
    size: tuple[int, int] | None = None,
    max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
) -> tuple[int, str | None, list[np.ndarray]]:
    """Decode frames of a store outside DALI (``gpufeed check``, and naming a bad file after a failure).

    Args:
        frames: Frame indices (default: every frame).
        pixels: Also return the decoded RGB frames (as vidio's readers give them).
        size: (width, height) every frame must have (default: frame 0's): a frame of another size,
            judged from its header, is a problem (:func:`~gpufeed.pipelines._frame_sizes.frame_size_problem`).
        max_pixels: A frame whose header declares more is a problem, never decoded.

    Returns:
        (frames decoded, the first problem naming its frame or ``None``, the RGB frames if asked).
    """
    reader = FrameBytesReader(max_open=1)
    store = frame_store(kind)
    out: list[np.ndarray] = []
    try:
        if frames is None or size is None:
            probed = probe_store(path)
            frames = range(probed.num_frames) if frames is None else frames
            size = size or (probed.width, probed.height)
        count = 0
        for index in frames:
            where = store.frame_label(frame_name, int(index))
            try:
                (data,) = reader.read(path, kind, frame_name, [index])
            except (OSError, ValueError, IndexError) as err:
                return count, f"{where} cannot be read: {err}", out
            # The pixel limit first (from the header, nothing decoded): a bomb is named as one, not
            # as a frame of another size.
            problem = decode_problem(data.tobytes(), max_pixels=max_pixels)
            if problem:
                return count, describe_bad_frame(data.tobytes(), where, problem), out
            problem = frame_size_problem(data.tobytes(), where, *size)
            if problem:
                return count, problem, out
            if pixels:
                out.append(decode_frame(data.tobytes(), kind))
            count += 1
        return count, None, out
    finally:
        reader.close()
