"""A PNG object's chunks after the part held in memory, walked by ranged reads without holding them.

PNG allows ancillary chunks after the image data (text and XMP in ``tEXt``/``zTXt``/``iTXt``,
``eXIf``) and APNG keeps every frame after the first there (``fcTL``/``fdAT``): megabytes that the
``9 bytes a pixel`` bound on image data (:mod:`gpufeed.pipelines._image_facts`) does not cover. Such
chunks are walked here by their length fields, each one's CRC computed piece by piece as it is read,
up to ``IEND``. Every check and message is :func:`~gpufeed.pipelines._image_walk.walk_png`'s, so an
object and the same bytes on disk get the same answer; only what no sane file holds is refused
unread: more than :data:`MAX_TAIL_BYTES` or :data:`MAX_TAIL_CHUNKS` after the held part.
"""

from __future__ import annotations

import struct
import zlib

from gpufeed.pipelines._image_walk import DAMAGED, Walk, exif_orientation, png_chunk_problem

__all__ = ["MAX_TAIL_BYTES", "MAX_TAIL_CHUNKS", "png_resume_point", "walk_png_tail"]

# An APNG of a few hundred frames, or XMP with an embedded preview, is tens of megabytes; a quarter
# of a gigabyte after the image data is not a picture anyone trains on, and would take seconds to read.
MAX_TAIL_BYTES = 256 * 1024 * 1024
# Two chunks a frame (fcTL, fdAT): 50,000 frames. Each chunk costs a Python loop turn and a read.
MAX_TAIL_CHUNKS = 100_000
# What is held at once while a chunk's CRC is computed (besides the ranged file's own blocks).
_PIECE_BYTES = 1024 * 1024
# The part of an eXIf chunk read for its orientation: IFD0 comes first in every writer's layout.
_EXIF_BYTES = 16 * 1024 * 1024


def png_resume_point(data) -> tuple[int, bool] | None:
    """Where a walk of a PNG prefix that ran off its end goes on: ``(offset, an IDAT came before)``.

    ``data`` is a prefix that :func:`~gpufeed.pipelines._image_walk.walk_png` walked without a
    problem up to a chunk that does not fit in it, so every chunk before that one is valid; the
    offset is that chunk's. ``None`` when an ``IEND`` lies in the prefix (that walk's answer stands).
    """
    pos, idat, size = 8, False, len(data)
    while pos + 8 <= size:
        length, kind = struct.unpack_from(">I4s", data, pos)
        if kind == b"IEND":
            return None
        if pos + 12 + length > size:
            break
        idat = idat or kind == b"IDAT"
        pos += 12 + length
    return pos, idat


def walk_png_tail(fh, pos: int, idat: bool, shape: tuple[int, int, int], image_budget: int) -> Walk | None:
    """Walk the chunks of the ranged-read file ``fh`` from byte ``pos`` to ``IEND``, as ``walk_png`` would.

    Args:
        fh: The object's ranged-read file (``size``, ``seek``, ``readinto``).
        pos: The offset of the first chunk not yet walked (:func:`png_resume_point`).
        idat: Whether an ``IDAT`` chunk came before ``pos``.
        shape: ``(stored width, stored height, orientation)`` read so far.
        image_budget: Bytes more of ``IDAT`` chunks the caller's image-data bound allows.

    Returns:
        The walk's answer; ``None`` when ``IDAT`` chunks run past ``image_budget`` (the caller's
        refusal names its bound).
    """
    size, start = fh.size, pos
    width, height, orientation = shape
    piece = bytearray(min(_PIECE_BYTES, size))

    def answer(problem: str | None = None, end: int = 0, truncated: bool = False) -> Walk:
        word = "truncated PNG" if truncated else "damaged PNG"
        why = f"{word}: {problem}" if problem else None
        return "PNG", width, height, orientation, why, DAMAGED if problem else None, end

    for _ in range(MAX_TAIL_CHUNKS):
        if pos + 8 > size:
            return answer(f"the file ends after {size:,} bytes, before the IEND chunk", truncated=True)
        length, kind = struct.unpack(">I4s", _read(fh, pos, 8))
        if (problem := png_chunk_problem(pos, size, length, kind)) is not None:
            return answer(problem[0], truncated=problem[1])
        name, end = kind.decode("latin-1"), pos + 12 + length
        if kind == b"IDAT":
            image_budget -= end - pos
            if image_budget < 0:
                return None
        if end - start > MAX_TAIL_BYTES:
            why = f"more than {MAX_TAIL_BYTES >> 20} MiB of chunks after byte {start:,}"
            return _refused(why, size, (width, height, orientation))
        exif = kind == b"eXIf" and orientation == 1
        good, head = _check_crc(fh, pos, length, piece, _EXIF_BYTES if exif else 0)
        if not good:
            return answer(f"chunk {name} at byte {pos:,} fails its CRC check")
        if kind == b"IDAT":
            idat = True
        elif exif:
            try:
                orientation = exif_orientation(head)
            except struct.error:  # a crafted Exif block pointing past its end
                return answer("a chunk's contents cannot be parsed")
        elif kind == b"IEND":
            if not idat:
                return answer("no image data: IEND comes before any IDAT chunk", truncated=True)
            return answer(end=end)
        pos = end
    return _refused(f"more than {MAX_TAIL_CHUNKS:,} chunks after byte {start:,}", size, (width, height, orientation))


def _refused(why: str, size: int, shape: tuple[int, int, int]) -> Walk:
    return "PNG", *shape, f"damaged PNG: {why} of the {size:,}-byte object; refused unread", DAMAGED, 0


def _read(fh, pos: int, count: int) -> bytes:
    """``count`` bytes at ``pos`` (the caller checked they lie inside the object)."""
    fh.seek(pos)
    out = bytearray(count)
    got = fh.readinto(out)
    if got != count:  # the object's length was checked when it was opened
        raise OSError(f"{fh.name}: {got:,} of {count:,} bytes at byte {pos:,}: the object ended early")
    return bytes(out)


def _check_crc(fh, pos: int, length: int, piece: bytearray, keep: int) -> tuple[bool, bytes]:
    """Whether the chunk at ``pos`` matches its CRC, read in pieces; and the first ``keep`` bytes of its body.

    The CRC covers the type and the body; both stream through ``piece``, so a chunk of any length
    costs one piece of memory.
    """
    fh.seek(pos + 4)
    crc, left, head = 0, 4 + length, bytearray()
    with memoryview(piece) as view:
        while left:
            got = fh.readinto(view[: min(left, len(piece))])
            if not got:
                raise OSError(f"{fh.name}: the object ended inside the chunk at byte {pos:,}")
            crc = zlib.crc32(view[:got], crc)
            if len(head) < keep + 4:  # the first 4 bytes are the chunk type
                head += view[: min(got, keep + 4 - len(head))]
            left -= got
    (stored,) = struct.unpack(">I", _read(fh, pos + 8 + length, 4))
    return crc == stored, bytes(head[4:])
