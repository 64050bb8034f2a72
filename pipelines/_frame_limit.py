"""The pixel limit of one encoded frame, from its header alone, where frames are read one by one.

A frame store is probed by its frame 0 (:func:`gpufeed.pipelines._frame_stores.probe_store`); any
other frame could declare 30000 x 30000 pixels and be handed to a decoder that allocates all of
them (2.7 GB of RGB) before failing. So the clip feeds read each frame's size from its first
bytes (a PNG's ``IHDR``, a JPEG's start-of-frame segment) before the frame goes to any decoder,
and refuse it past ``data.max_image_pixels``: microseconds per frame, no decoding.
"""

from __future__ import annotations

import struct

from gpufeed.pipelines._image_facts import ImageFacts

__all__ = ["MAX_PIXELS_KEY", "frame_refusal", "header_size", "refuse_big_frames"]

MAX_PIXELS_KEY = "data.max_image_pixels"
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# Start-of-frame markers (every SOFn but DHT C4, JPG C8 and DAC CC): the frame header with the size.
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# Markers without a length field.
_STANDALONE = frozenset(range(0xD0, 0xD9)) | {0x01}


def _jpeg_size(data: bytes | memoryview) -> tuple[int, int] | None:
    pos, end = 2, len(data)
    while pos + 4 <= end:
        if data[pos] != 0xFF:
            # libjpeg skips stray bytes to the next marker (with a warning) and decodes on: so does this.
            data = data if isinstance(data, bytes) else bytes(data)  # copied once, where find() is needed
            pos = data.find(b"\xff", pos)
            if pos < 0:
                return None
            continue
        code = data[pos + 1]
        if code == 0xFF:  # fill byte before a marker
            pos += 1
            continue
        if code in _STANDALONE:
            pos += 2
            continue
        if code in _SOF:
            if pos + 9 > end:
                return None
            height, width = struct.unpack(">HH", data[pos + 5 : pos + 9])
            return width, height
        if code in (0xDA, 0xD9):  # a scan or the end before any frame header: no size to read
            return None
        (length,) = struct.unpack(">H", data[pos + 2 : pos + 4])
        pos += 2 + length
    return None


def _bytes_view(data) -> bytes | memoryview:
    """A 1-D uint8 array's bytes without a copy where it is contiguous (indexing gives ints, as bytes does)."""
    try:
        return memoryview(data).cast("B")
    except (TypeError, ValueError):  # not contiguous, or not a buffer
        return bytes(data)


def header_size(data) -> tuple[int, int] | None:
    """``(width, height)`` a PNG or JPEG declares (stored, before EXIF orientation), or ``None``.

    Args:
        data: The encoded bytes (``bytes`` or a 1-D uint8 array); only the header is read.
    """
    head = bytes(data[:24])
    if head.startswith(_PNG_SIGNATURE) and head[12:16] == b"IHDR":
        width, height = struct.unpack(">II", head[16:24])
        return width, height
    if head.startswith(b"\xff\xd8"):
        # The markers are walked in place: copying a 51 kB frame to bytes cost more than the walk (4x).
        return _jpeg_size(data if isinstance(data, bytes) else _bytes_view(data))
    return None


def frame_refusal(data, max_pixels: int, key: str = MAX_PIXELS_KEY) -> str | None:
    """Why an encoded frame must not be decoded (its header declares more than ``max_pixels``), or ``None``.

    A frame whose size cannot be read is not refused here: the decoder's own error names it.
    """
    size = header_size(data)
    if size is None:
        return None
    return ImageFacts(stored_width=size[0], stored_height=size[1]).pixel_problem(max_pixels, key)


def refuse_big_frames(store, frames, data, max_pixels: int) -> None:
    """Raise naming the first of a clip's encoded frames that declares more than ``max_pixels``.

    Args:
        store: The clip's store (its ``path`` and ``frame_label(index)``: a
            :class:`~gpufeed.pipelines._store_feed.StoreRef`).
        frames: The frame indices of ``data``.
        data: The frames' encoded bytes, as read.

    Raises:
        RuntimeError: ``"<store>: <frame> is refused: too many pixels: ..."``; the loader re-checks
            the clip's frames (by their headers too) and names it as a bad sample.
    """
    for index, encoded in zip(frames, data, strict=True):
        refused = frame_refusal(encoded, max_pixels)
        if refused:
            raise RuntimeError(f"{store.path}: {store.frame_label(int(index))} is refused: {refused}")
